"""The `Scheduler`: the stateful object that trainers and engine adapters drive.

It owns a `Pool`, a `Method` (one policy per place, see `rlpace.policies`), every
policy's state, and a shared per-prompt history. Each training step:

    ids  = sched.propose(n)            # before rollout: which prompts
    n_i  = sched.allocate(ids, B * G)  # how many rollouts each (uniform G without an allocation
                                       #   policy; ragged feedback: Feedback(group_sizes=n_i))
    ...generate G rollouts for each id, score them...
    r    = sched.step(fb)              # observe → admission → loss / advantage weights, one
                                       #   validation (`step`; features=fn adds gradient features)
    r.keep, r.refill, r.weights, r.advantage_weights
    w_t  = sched.token_weights(fb, token_probs, token_mask)   # float64[B, G, T] per token
    log(sched.metrics())

`step` is the documented order. Its parts are public too, each a view over the same code for a
trainer that needs one alone: `observe(fb)` (learn from all groups), `admission(fb)` (or
`admit(fb)`, its `keep`), `loss_weights(fb)`, `advantage_weights(fb)`; called in that order
they give what `step` gives.

Methods with supervision places (DE-Venus, arXiv 2609.03324; `ttrl`, `olr`, `trapo`,
`self_certainty`, `entropy_min`) add three calls around the reward (each validates its input
first and never changes state; docs/methods/README.md, "Supervision as state"):

    t    = sched.targets(fb)           # list[str | None]: verify prompt i's rollouts against t[i]
                                       #   (None: its dataset label, or no target if unlabelled)
    r    = sched.rewards(fb)           # float64[B, G]: the reward place's transform of fb.rewards
    ...the trainer uses r from here on (group advantages, observe, admit)...
    w_a  = sched.advantage_weights(fb) # float64[B, G] in [0, 1]: Ã = w_a · Â before the loss
    sched.supervision_log()            # the last relabel / pseudo-label / promotion decisions

Policies that learn from held-out loss curves (`epiplexity`) are fed, every k steps, with

    sched.observe_losses({domain: (tokens_seen, loss)})   # probe-set NLL per domain

Randomness comes from `np.random.default_rng([seed, proposal_index, stream])`, so the
same seed gives the same batches, and `state_dict()` → `load_state_dict()` on a fresh
Scheduler replays the next proposals exactly without pickling an RNG.

Defined behaviour for awkward input (documented, not errors):
  * empty batch (B = 0): `observe` is a no-op; `admit`/`loss_weights` return [0, G].
  * the same prompt twice in one batch: both groups count, in order.
  * feedback for prompts never proposed, or arriving several steps late: used as it
    arrives (the history keeps the latest `Feedback.step` seen for each prompt, so late
    feedback never makes a prompt look staler).
  * proposals that never get feedback: nothing happens; no state waits for them.
  * G = 1: groups have zero GRPO advantage (no signal); pass rates still count.
  * non-binary rewards: success = reward ≥ `success_threshold`; advantages (if not
    given) are group-normalised raw rewards.
"""

from __future__ import annotations

from .errors import InputError
import collections
import json
from typing import Any, NamedTuple

import numpy as np

from .policies._base import (ADVANTAGE, ALLOCATION, MIXTURE, REWARD, TARGET, Admission, Method,
                             _no_update, active_supervision_places, is_neutral)
from .policies._registry import hyperparameters, make_method
from .policies._state_checks import COUNT_MAX, bad, check_tree, count_limit
from ._seeding import pcg64_states
from .stats._window import window_init, window_mean, window_push
from .types import BATCH_FULL, Batch, Feedback, LossFeedback, Pool, _batch_and_counts

__all__ = ["Scheduler", "StepResult", "STATE_VERSION", "COUNT_MAX", "count_limit"]

# 2: the pool fingerprint covers ranks and difficulty; meta/pool_parts, meta/success_threshold
# and meta/hyperparameters are recorded and checked; values are validated on load.
STATE_VERSION = 2
_STREAM_PROPOSE = 0x5EED


def _uint32_words(n: int) -> list:
    """The 32-bit words, least significant first, that numpy's `SeedSequence` splits a
    non-negative int entropy value into (one word for 0)."""
    words = [n & 0xFFFFFFFF]
    n >>= 32
    while n:
        words.append(n & 0xFFFFFFFF)
        n >>= 32
    return words


def _propose_rng(seed: int, step: int) -> np.random.Generator:
    """`np.random.default_rng([seed, step, _STREAM_PROPOSE])`: the same generator, seeded from
    the same entropy given as one uint32 array (the words `SeedSequence` would split the list
    into, in order), which skips default_rng's argument checks and SeedSequence's Python loop
    over the list's ints (~8 μs of a ~12 μs construction). `seed` and `step` are non-negative
    (checked in `Scheduler.__init__` and counted by `propose`)."""
    entropy = np.array(_uint32_words(seed) + _uint32_words(step) + _STREAM_WORDS, dtype=np.uint32)
    return np.random.Generator(np.random.PCG64(entropy))


_STREAM_WORDS = _uint32_words(_STREAM_PROPOSE)
#: Proposals whose generators' states are hashed at once (`_ProposeStreams`): ~0.6 ms per block,
#: ~2 μs a proposal.
RNG_BLOCK = 256


class _ProposeStreams:
    """The generator of each proposal, `np.random.default_rng([seed, step, _STREAM_PROPOSE])`,
    without building one per proposal: the PCG64 states of RNG_BLOCK consecutive steps are
    computed at once (`rlpace._seeding.pcg64_states`, numpy's own hash in uint32 array
    arithmetic) and each proposal sets them into one reused bit generator. So the Generator
    handed to a selection is valid during its call only (the next proposal resets it); the
    draws are the documented generator's, bit for bit. Not state: rebuilt from (seed, step)."""

    def __init__(self, seed: int):
        self.seed = seed
        self.start, self.states = 0, []
        self.bit_generator = np.random.PCG64(0)
        self.generator = np.random.Generator(self.bit_generator)

    def __call__(self, step: int) -> np.random.Generator:
        i = step - self.start
        if not 0 <= i < len(self.states):
            # steps of one block have equally many 32-bit words (SeedSequence's entropy layout)
            end = min(step + RNG_BLOCK, 2**32) if step < 2**32 else step + RNG_BLOCK
            steps = np.arange(step, end, dtype=np.uint64)
            cols = [np.full(steps.shape, w, np.uint64) for w in _uint32_words(self.seed)]
            cols += [steps & 0xFFFFFFFF] + ([steps >> np.uint64(32)] if step >= 2**32 else [])
            cols += [np.full(steps.shape, w, np.uint64) for w in _STREAM_WORDS]
            self.start, self.states = step, pcg64_states(np.stack(cols, axis=1).astype(np.uint32))
            i = 0
        state, inc = self.states[i]
        self.bit_generator.state = {"bit_generator": "PCG64", "state": {"state": state, "inc": inc},
                                    "has_uint32": 0, "uinteger": 0}
        return self.generator
#: Hyperparameters added to a registered policy after states were first saved, with the value
#: that reproduces the behaviour from before: a state that does not record one was saved with
#: that value (and loads only into a Scheduler built with it).
ADDED_HYPERPARAMETERS = {("dump", "base"): "arms", ("recommended", "base"): "arms",
                         ("recommended", "prior_strength"): 0.0}
#: Steps whose `domain_success/*` window pushes are queued and written at once (`domain_window`):
#: one push of 16 steps' rollouts costs about what one step's did, and no read sees the queue.
WINDOW_QUEUE = 16
# Decisions kept by `Scheduler.supervision_log` (a bounded log of this process, not checkpointed;
# the counters in `metrics()` are state and resume exactly).
SUPERVISION_LOG_SIZE = 1000


class History(NamedTuple):
    """Per-prompt pass-rate history shared by all policies (and logged)."""

    attempts: np.ndarray   # int64[N] rollouts ever observed per prompt
    successes: np.ndarray  # int64[N] successful rollouts per prompt
    last_step: np.ndarray  # int64[N] latest Feedback.step observed; -1 = never
    #: value rules `Scheduler.load_state_dict` checks for each field (policies/_state_checks.py)
    STATE_RULES = {"attempts": "nonneg", "successes": "nonneg", "last_step": "step"}


class Counters(NamedTuple):
    proposals: np.ndarray        # int64[] propose() calls so far (the RNG step)
    observations: np.ndarray     # int64[] non-empty observe() calls so far
    rollouts: np.ndarray         # int64[] rollouts observed
    groups: np.ndarray           # int64[] groups observed
    informative: np.ndarray      # int64[] groups with non-zero advantage
    last_informative: np.ndarray  # float64[] informative fraction of the last batch
    last_proposed: np.ndarray    # int64[K] domain counts of the last proposal
    #: value rules `Scheduler.load_state_dict` checks for each field (policies/_state_checks.py)
    STATE_RULES = {"proposals": "nonneg", "observations": "nonneg", "rollouts": "nonneg", "groups": "nonneg",
                   "informative": "nonneg", "last_informative": "unit", "last_proposed": "nonneg"}


class StepResult(NamedTuple):
    """What `Scheduler.step` decided for one step's feedback (B groups of G rollouts)."""

    keep: np.ndarray               # bool[B, G]     rollouts that enter the loss (`admission`)
    refill: int                    # replacement prompts to generate (DAPO dynamic sampling)
    full_group_advantages: bool    # a partly kept group keeps its full-group advantages (`Admission`)
    weights: np.ndarray            # float64[B, G]  per-rollout loss weights (`loss_weights`)
    advantage_weights: np.ndarray  # float64[B, G]  in [0, 1]: Ã = w·Â (`advantage_weights`)
    feedback: Feedback             # the feedback as observed: with the features attached, if any


#: The per-rollout signals a trainer computes after admission (gradient features of the loss as
#: admitted): policies that read them are updated once they exist (`Scheduler.step(features=)`).
FEATURE_SIGNALS = frozenset({"grads", "ref_grad"})


class _Places(NamedTuple):
    """A Method's places as the step reads them (`Scheduler._places`)."""

    method: Method
    policies: dict             # {kind: DataPolicy}, `Method.policies()` (read-only by convention)
    kinds: frozenset           # its keys
    feature_readers: frozenset  # kinds whose policy reads FEATURE_SIGNALS
    supervision: frozenset     # `active_supervision_places(method)`
    #: (kind, policy) whose `update` can change something: the rest are the neutral places'
    #: `_no_update` with no `decisions`, whose call would return the state unchanged
    updating: tuple
    #: what `observe` builds of the fields only policies read (`types.BATCH_DERIVED`): the
    #: union of the updating policies' `DataPolicy.batch_reads`, None (all) when one of them
    #: does not declare it or there is a target place (it reads the batch before the update);
    #: empty when `observe` hands its batch to no policy (`uniform`, `fixed_mixture`)
    batch_fields: frozenset | None
    #: what `step` builds: the full batch (admission and weights read it) and the shortcuts
    #: the updating policies declared (`types.BATCH_FULL` | `batch_fields`)
    step_fields: frozenset | None
    #: the fields every build of this method's batch holds (`Scheduler._batch_and_counts`):
    #: `step_fields` (as a set) when a place acts after rollout (admission, reweighting or a
    #: supervision place), so the batch `observe` builds also serves `admit`, `loss_weights`,
    #: `targets`, ... on the same Feedback; None (what each call asks for) otherwise
    build_fields: frozenset | None


class Scheduler:
    """Adaptive data scheduler over a prompt pool.

    Args:
        pool: the prompts (`rlpace.Pool`).
        policy: a registry name (`rlpace.policies.names()`), several joined with '+'
            ("dump+dapo_dynamic_sampling"), a dotted path to a user factory marked with
            `@rlpace.policy_factory` ("my_pkg.policies:my_factory"), or, from Python, a
            factory callable, a `DataPolicy`, or a `Method` from `rlpace.policies.compose`.
            A string never reaches anything but a registered or marked factory: see
            `rlpace.policies._registry` on the trust boundary.
        seed: base of all randomness.
        success_threshold: a rollout succeeds when reward ≥ this (default 0.5 for
            binary rewards).
        metrics_window: rollouts per domain in the `domain_success/*` window.
        **policy_kwargs: hyperparameters of the named policy; unknown names are an error
            that lists the valid ones.

    Example:
        >>> import numpy as np
        >>> from rlpace import Pool, Feedback, Scheduler
        >>> pool = Pool(["easy"] * 50 + ["hard"] * 50)
        >>> s = Scheduler(pool, "dump", seed=0)
        >>> ids = s.propose(8)
        >>> s.observe(Feedback(ids, np.ones((8, 4)), step=0))
        >>> sorted(k for k in s.metrics() if k.startswith("domain_prob"))
        ['domain_prob/easy', 'domain_prob/hard']
    """

    def __init__(self, pool: Pool, policy: Any, *, seed: int = 0, success_threshold: float = 0.5,
                 metrics_window: int = 256, **policy_kwargs):
        if not isinstance(pool, Pool):
            raise TypeError(f"pool must be an rlpace.Pool; got {type(pool).__name__}. "
                            f"Build one with Pool(domains, ...) or Pool.from_parquet(path).")
        try:
            success_threshold = float(success_threshold)
        except (TypeError, ValueError):
            raise InputError(f"success_threshold must be a number; got {success_threshold!r}.") from None
        if not np.isfinite(success_threshold):
            raise InputError(f"success_threshold must be finite; got {success_threshold}.")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= int(seed) < 2**63:
            # numpy's PCG64 rejects negatives only at the first propose(), with a message that
            # does not name the argument; ≥ 2**63 would not round-trip through an npz.
            raise InputError(f"seed must be an int in [0, 2**63); got {seed!r}.")
        if isinstance(metrics_window, bool) or not isinstance(metrics_window, (int, np.integer)) \
                or metrics_window < 1:
            raise InputError(f"metrics_window must be an int ≥ 1 (rollouts per domain in the "
                             f"domain_success/* window; default 256); got {metrics_window!r}.")
        self.pool = pool
        self.method: Method = make_method(policy, **policy_kwargs)
        # Recorded in state_dict and compared on load (None for a prebuilt policy object).
        self.hyperparameters = hyperparameters(policy, **policy_kwargs)
        self.seed = int(seed)
        self.success_threshold = float(success_threshold)
        n, k = len(pool), pool.n_domains
        self.history = History(np.zeros(n, np.int64), np.zeros(n, np.int64), np.full(n, -1, np.int64))
        self._prompts_seen = 0      # distinct prompts observed: kept in step with history.attempts
        self.domain_window = window_init(k, metrics_window)   # (the property: empty queue)
        self.counters = Counters(*(np.array(0, np.int64) for _ in range(5)),
                                 np.array(0.0), np.zeros(k, np.int64))
        self.states: dict[str, Any] = {kind: p.init(pool) for kind, p in self.method.policies().items()}
        self._supervision_log: collections.deque = collections.deque(maxlen=SUPERVISION_LOG_SIZE)

    # ---- the metrics' bookkeeping, written every WINDOW_QUEUE steps ------------------------------
    @property
    def domain_window(self):
        """The `domain_success/*` window (`rlpace.stats.Window`): per domain, the success of its
        last `metrics_window` rollouts. `observe` queues each step's push and writes up to
        WINDOW_QUEUE of them at once (one push of their concatenation is the pushes in
        order, `window_push`); every read goes through here and writes the queue first."""
        if self._window_queue:
            self._flush_queue()
        return self._window

    @domain_window.setter
    def domain_window(self, win) -> None:
        self._window = win
        self._window_queue: list = []

    @property
    def _prompts_seen(self) -> int:
        """Distinct prompts observed (`prompts_seen`), kept in step with history.attempts: the
        queued steps' prompts are counted when the queue is written (`_flush_queue`)."""
        if self._window_queue:
            self._flush_queue()
        return self._seen

    @_prompts_seen.setter
    def _prompts_seen(self, n: int) -> None:
        self._seen = n

    def _flush_queue(self) -> None:
        """Write the queued steps: their window pushes in order, and their prompts that the
        history had never seen before the first of them (attempts now = the rollouts the
        queued steps added: every queued group has G ≥ 1 rollouts)."""
        queue, self._window_queue = self._window_queue, []
        i = 0
        while i < len(queue):                 # runs of one group size (ragged steps mix them)
            j = i + 1
            while j < len(queue) and queue[j][1].shape[1] == queue[i][1].shape[1]:
                j += 1
            arms, values, _ = zip(*queue[i:j])
            window_push(self._window, np.concatenate(arms), np.concatenate(values))
            i = j
        ids = np.concatenate([q[2] for q in queue])
        sizes = [q[1].shape[1] for q in queue]
        if len(set(sizes)) == 1:
            ids = np.sort(ids)
            added = None
        else:                                   # rollouts per occurrence differ (ragged parts)
            added = np.repeat(np.array(sizes, dtype=np.int64), [q[2].shape[0] for q in queue])
            order = np.argsort(ids, kind="stable")
            ids, added = ids[order], added[order]
        starts = np.flatnonzero(np.concatenate(([True], ids[1:] != ids[:-1])))
        if added is None:
            added = np.diff(np.append(starts, ids.shape[0])) * sizes[0]
        else:
            added = np.add.reduceat(added, starts)
        self._seen += int(np.count_nonzero(self.history.attempts[ids[starts]] == added))

    # ---- the step ----------------------------------------------------------------------
    def _places(self) -> "_Places":
        """What every step reads of `self.method`, built once per Method (an immutable
        NamedTuple; rebuilt if `method` is replaced): building the dict of policies and the
        active supervision places costs ~20 μs of Python per call, ~10 % of a plain step."""
        cached = getattr(self, "_places_cache", None)
        if cached is None or cached.method is not self.method:
            policies = self.method.policies()
            supervision = active_supervision_places(self.method)
            updating = tuple((k, p) for k, p in policies.items()
                             if p.update is not _no_update or p.decisions is not None)
            reads = [p.batch_reads for _, p in updating]
            fields = (None if TARGET in supervision or any(r is None for r in reads)
                      else frozenset().union(*reads))
            step_fields = None if fields is None else BATCH_FULL | fields
            after = bool(supervision) or not (is_neutral(self.method.admission)
                                              and is_neutral(self.method.reweighting))
            cached = self._places_cache = _Places(
                self.method, policies, frozenset(policies),
                frozenset(k for k, p in policies.items() if p.reads & FEATURE_SIGNALS),
                supervision, updating, fields, step_fields,
                (BATCH_FULL if step_fields is None else step_fields) if after else None)
        return cached

    @property
    def name(self) -> str:
        return self.method.name

    def domain_probs(self) -> np.ndarray | None:
        """float64[K] current probability of each domain, or None without a mixture."""
        mix = self.method.mixture
        if mix is None:
            return None
        p = mix.apply(self.states[MIXTURE], self.pool)
        if mix.arms == "cluster":
            return _cluster_to_domain(self.pool) @ p
        return p

    def propose(self, n: int) -> np.ndarray:
        """int64[n] pool positions of the next n prompts to roll out."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise InputError(f"propose(n) needs a non-negative int; got {n!r}.")
        n = int(n)
        probs, arms = None, None
        if self.method.mixture is not None:
            probs = self.method.mixture.apply(self.states[MIXTURE], self.pool)
            arms = self.method.mixture.arms
        step = int(self.counters.proposals)
        streams = self.__dict__.get("_streams")
        if streams is None or streams.seed != self.seed:       # a load_state_dict may change the seed
            streams = self._streams = _ProposeStreams(self.seed)
        rng = streams(step)                     # = np.random.default_rng([seed, step, stream])
        ids = np.asarray(self.method.selection.apply(self.states["selection"], self.pool, n, probs,
                                                     arms, rng), dtype=np.int64)
        # one reduction: a negative id read as uint64 is ≥ 2**63, so the max catches both ends
        if ids.shape != (n,) or (n and int(ids.view(np.uint64).max()) >= len(self.pool)):
            raise RuntimeError(f"selection policy {self.method.selection.name!r} returned ids of shape "
                               f"{ids.shape} outside [0, {len(self.pool)}): a bug in that policy.")
        self.counters.proposals[()] = step + 1
        self.counters.last_proposed[:] = np.bincount(self.pool.domains[ids], minlength=self.pool.n_domains)
        return ids

    def _batch(self, feedback: Feedback) -> Batch:
        return self._batch_and_counts(feedback)[0]

    def _batch_and_counts(self, feedback: Feedback, fields: frozenset | None = None
                          ) -> tuple[Batch, np.ndarray, np.ndarray]:
        """(`Batch`, wins, informative) of `feedback` with at least `fields` (None: BATCH_FULL),
        built once per Feedback: a trainer's step calls `observe`, `admit` and `loss_weights`
        (and `targets`, `rewards`, `advantage_weights`) on the same Feedback, and each would
        otherwise rebuild the batch, a pass over [B, G] and the pool's gathers. The last build
        of a method with an after-rollout place (`_Places.build_fields`; the others' calls ask
        for different fields) is kept on this Scheduler (never in `state_dict`) with what it
        depends on: the Feedback object, the pool object and the success threshold (no policy
        state). An identity check on the Feedback is safe: its arrays are read-only (`Feedback`)
        and the kept reference keeps its id from being reused; the pool's arrays are read-only
        too. The arrays built here are made read-only as well, so no policy can change what a
        later call reads."""
        want = BATCH_FULL if fields is None else fields
        last = self.__dict__.get("_last_batch")
        if (last is not None and last[0] is feedback and last[1] is self.pool
                and last[2] == self.success_threshold and want <= last[3]):
            return last[4]
        if not isinstance(feedback, Feedback):
            raise TypeError(f"expected an rlpace.Feedback; got {type(feedback).__name__}. Build one "
                            f"with Feedback(prompt_ids, rewards, advantages=None, step=...).")
        ids = feedback.prompt_ids
        if ids.size and ids.max() >= len(self.pool):
            raise InputError(f"Feedback.prompt_ids has ids ≥ pool size {len(self.pool)} (max "
                             f"{int(ids.max())}); ids are pool positions 0..{len(self.pool) - 1}.")
        build = self._places().build_fields
        if build is None:       # no after-rollout place: no later call shares this batch
            return _batch_and_counts(feedback, self.pool, self.success_threshold, fields=want)
        want = want | build
        out = _batch_and_counts(feedback, self.pool, self.success_threshold, fields=want)
        batch, wins, informative = out
        for a in (batch.pass_rate, batch.advantages, wins, informative):
            if a is not None and a.flags.writeable:
                a.setflags(write=False)
        self._last_batch = (feedback, self.pool, self.success_threshold, want, out)
        return out

    def observe(self, feedback: Feedback) -> None:
        """Update history and every policy's state from one step's feedback (all groups,
        including those admission will drop: ADS's window needs the all-wrong ones).

        All input is validated before anything changes, so a rejected batch leaves the state
        exactly as it was. Built-in policies never raise on validated input; a user policy
        whose `update` raises leaves the history and the policies before it updated (no
        snapshot is taken: copying 10⁷-entry arrays every step would cost more than the step).
        """
        if isinstance(feedback, Feedback) and feedback.group_sizes is not None:
            parts = self._parts(feedback)                 # validates every part; nothing changed
            for _, batch, wins, informative in parts:
                self._observe(batch, wins, informative, tally=False)
            self._tally(parts)
            return
        # validates; nothing changed before. Only the fields its policies read (`_Places.batch_fields`)
        handed = self.__dict__.pop("_handed_targets", None)    # `targets` of this Feedback, this state
        self._observe(*self._batch_and_counts(feedback, self._places().batch_fields),
                      targets=handed[1] if handed is not None and handed[0] is feedback else None)

    # ---- ragged feedback (an allocation gave prompts different numbers of rollouts) --------
    def _parts(self, feedback: Feedback) -> list:
        """[(rows, batch, wins, informative)] for each group size of a ragged `feedback`
        (`Feedback.by_size`), every part validated before anything changes. Each policy reads
        full groups of one size, exactly as in a step whose groups all have that size."""
        self._batch_and_counts(feedback)          # type and id range, over every row
        return [(rows,) + self._batch_and_counts(sub) for rows, sub in feedback.by_size()]

    def _check_ids(self, feedback: Feedback) -> None:
        """The checks a view of ragged feedback needs before its parts (each part is checked
        when its view runs): the record's type and its ids inside the pool."""
        if not isinstance(feedback, Feedback):
            raise TypeError(f"expected an rlpace.Feedback; got {type(feedback).__name__}.")
        ids = feedback.prompt_ids
        if ids.size and ids.max() >= len(self.pool):
            raise InputError(f"Feedback.prompt_ids has ids ≥ pool size {len(self.pool)} (max "
                             f"{int(ids.max())}); ids are pool positions 0..{len(self.pool) - 1}.")

    def _tally(self, parts: list) -> None:
        """The counters of one observed step made of several parts (one observation)."""
        b = sum(int(batch.prompt_ids.shape[0]) for _, batch, _, _ in parts)
        if b == 0:
            return
        n_inf = sum(int(np.count_nonzero(inf)) for _, _, _, inf in parts)
        self._count(sum(int(batch.rewards.size) for _, batch, _, _ in parts), b, n_inf)

    def _scatter(self, feedback: Feedback, view, fill, dtype) -> np.ndarray:
        """[B, G] array of `view(sub_feedback)` over the parts of a ragged `feedback`, `fill`
        on padding and on rows without rollouts."""
        out = np.full(feedback.rewards.shape, fill, dtype=dtype)
        for rows, sub in feedback.by_size():
            out[rows, :sub.rewards.shape[1]] = view(sub)
        return out

    def allocate(self, ids, budget, unit: int = 1) -> np.ndarray:
        """int64[B] rollouts N_i for each proposed prompt: N_i ≥ 0, Σ N_i = `budget` exactly,
        each within the allocation policy's `bounds`. Pure: state unchanged.

        Without an allocation policy every prompt gets budget // B, and the first
        budget mod B prompts one more (plain GRPO: budget = B·G gives G each). With one
        (`knapsack`, `gvm`, `oracle_allocation`: docs/methods/knapsack.md) its `apply`
        decides. The trainer generates N_i rollouts of prompt i and reports them as ragged
        groups: `Feedback(ids, rewards[B, max N], group_sizes=N, step=t)`.

        `unit` (default 1): every N_i a multiple of `unit`, for an engine that generates a
        prompt's rollouts in fixed groups (TRL's `num_generations`: N_i = k_i·G is k_i copies
        of the prompt); `budget` must be a multiple of it. The policy allocates rollouts as
        with unit 1, then each N_i is rounded to a multiple of `unit` by largest remainder
        (floor(N_i / unit) units each, then one more unit to the largest remainders N_i mod
        unit; among equal remainders the larger N_i first, then the first prompt), which keeps
        Σ N_i = budget. The rounded N_i lie in
        [unit·⌊min_n / unit⌋, unit·⌈max_n / unit⌉]: a prompt the policy gives fewer than
        `unit` rollouts may get none. Without a policy the budget's units are split evenly.

        >>> import numpy as np
        >>> from rlpace import Pool, Scheduler
        >>> Scheduler(Pool(["a"] * 4), "uniform").allocate(np.array([0, 1, 2]), 10, unit=2).tolist()
        [4, 4, 2]

        Bad input (one InputError, nothing changes): ids that are not pool positions, a budget
        that is not an integer, a budget below B·min_n or above B·max_n (the policy's bounds).
        A policy that returns a wrong sum, shape or a value outside its bounds is a bug in that
        policy: a RuntimeError naming it.

        >>> import numpy as np
        >>> from rlpace import Pool, Scheduler
        >>> Scheduler(Pool(["a"] * 4), "uniform").allocate(np.array([0, 1, 2]), 10).tolist()
        [4, 3, 3]
        """
        ids = np.asarray(ids)
        if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
            raise InputError(f"allocate: ids must be int[B] pool positions (what propose returned); got "
                             f"{ids.dtype} of shape {ids.shape}.")
        ids = ids.astype(np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= len(self.pool)):
            raise InputError(f"allocate: ids must be pool positions in [0, {len(self.pool)}); got "
                             f"{int(ids.min())}..{int(ids.max())}.")
        if isinstance(budget, (bool, np.bool_)) or not isinstance(budget, (int, np.integer)):
            raise InputError(f"allocate: budget must be an int (rollouts this step, e.g. B·G); got "
                             f"{budget!r} ({type(budget).__name__}).")
        if isinstance(unit, (bool, np.bool_)) or not isinstance(unit, (int, np.integer)) or unit < 1:
            raise InputError(f"allocate: unit must be an int ≥ 1 (rollouts per generated group, e.g. TRL's "
                             f"num_generations); got {unit!r}.")
        if int(budget) % int(unit):
            raise InputError(f"allocate: budget {int(budget)} is not a multiple of unit {int(unit)} (every prompt "
                             f"gets a multiple of unit rollouts); pass a budget k·{int(unit)}, e.g. B·G.")
        budget, b, unit = int(budget), int(ids.shape[0]), int(unit)
        policy = self.method.allocation
        lo, hi = (0, None) if policy is None else (policy.bounds or (0, None))
        if budget < b * lo or budget < 0:
            raise InputError(f"allocate: budget {budget} is below B·min_n = {b}·{lo} = {b * lo} (policy "
                             f"{policy.name if policy else 'uniform'!r} gives each prompt at least "
                             f"min_n = {lo}); raise the budget or lower min_n.")
        if hi is not None and budget > b * hi:
            raise InputError(f"allocate: budget {budget} is above B·max_n = {b}·{hi} = {b * hi} (policy "
                             f"{policy.name!r} gives a prompt at most max_n = {hi}); lower the budget "
                             f"or raise max_n.")
        if b == 0:
            if budget:
                raise InputError(f"allocate: budget {budget} for 0 prompts; an empty batch has budget 0.")
            return np.zeros(0, np.int64)
        if policy is None:
            units = budget // unit
            out = np.full(b, units // b, dtype=np.int64)
            out[:units % b] += 1
            return out * unit
        out = np.asarray(policy.apply(self.states[ALLOCATION], self.pool, ids, budget))
        ok = (out.shape == (b,) and out.dtype.kind in "iu" and int(out.sum()) == budget
              and int(out.min()) >= lo and (hi is None or int(out.max()) <= hi))
        if not ok:
            got = (f"sum {int(out.sum())}" if out.shape == (b,) and out.dtype.kind in "iuf"
                   else f"shape {out.shape} dtype {out.dtype}")
            raise RuntimeError(f"allocation policy {policy.name!r} returned {got} for {b} prompts and "
                               f"budget {budget} (expected int[{b}] summing to {budget}, each in "
                               f"[{lo}, {hi}]): a bug in that policy.")
        out = out.astype(np.int64)
        return out if unit == 1 else _round_to_unit(out, unit)

    def _observe(self, batch: Batch, wins: np.ndarray, informative: np.ndarray,
                 defer: frozenset = frozenset(), tally: bool = True, targets=None) -> None:
        """`observe` of a validated batch; the policies of the kinds in `defer` are left for
        `_update_deferred` (`step` with `features`: the policies that read the features).
        `targets`: what `targets` returned for this batch's Feedback on the current state (None:
        the target place is asked here); the updates read its labels (`Batch.targets`)."""
        b = batch.prompt_ids.shape[0]
        if b == 0:
            return
        places = self._places()
        target = self.method.target
        decisions = []
        if TARGET in places.supervision and (
                batch.answers is not None or "answers" not in target.reads):
            # The decisions this visit was verified under, from the state before this update
            # (what `targets` returned for this feedback), with their evidence. Taken before
            # anything changes: a target policy's ValueError (e.g. ttrl's vote_rollouts > G)
            # then leaves the state as it was.
            if targets is None:
                targets = target.apply(self.states[TARGET], self.pool, batch)
            decisions = targets.decisions
            batch = batch._replace(targets=list(targets.labels))
        g = batch.rewards.shape[1]
        h = self.history
        np.add.at(h.attempts, batch.prompt_ids, g)
        np.add.at(h.successes, batch.prompt_ids, wins)
        # max, not assignment: feedback that arrives late must not move recency backwards.
        np.maximum.at(h.last_step, batch.prompt_ids, batch.step)
        # [B] arms, [B, G] values for the window, [B] ids for prompts_seen (`_flush_queue`)
        self._window_queue.append((batch.domains, batch.success, batch.prompt_ids))
        if len(self._window_queue) >= WINDOW_QUEUE:
            self._flush_queue()
        if decisions:
            self._log_decisions(batch, decisions)
        self._update_deferred(batch, places.kinds - defer if defer else None)
        if not tally:           # one part of a ragged step: `_tally` counts the step once
            return
        self._count(b * g, b, int(np.count_nonzero(informative)))

    def _count(self, rollouts: int, groups: int, informative: int) -> None:
        """One observation of `groups` > 0 groups in the counters. Item assignment of Python
        numbers: an in-place ufunc on a 0-d array (`c.x[...] += 1`) costs ~10× more."""
        c = self.counters
        c.observations[()] = int(c.observations) + 1
        c.rollouts[()] = int(c.rollouts) + rollouts
        c.groups[()] = int(c.groups) + groups
        c.informative[()] = int(c.informative) + informative
        c.last_informative[()] = informative / groups

    def step(self, feedback: Feedback, features=None) -> StepResult:
        """One training step's feedback, in one call: validated once, then, in this order,

        1. observe: history, counters and every policy's `update` (as `observe`);
        2. admission: which rollouts enter the loss, on the state after step 1 (so an
           admission that reads state — TraPO's selection of unlabelled prompts — sees this
           visit, as `admission` after `observe` does);
        3. features (only with `features`, and only when a policy reads "grads" or
           "ref_grad"): `features(admission)` (the step's `Admission`) returns the per-rollout
           gradient features of the loss as admitted, float32[B, G, d] (or a pair (grads,
           ref_grad float32[d])); they are
           validated as `Feedback.with_grads` does and the policies that read them get their
           `update` now — the others were updated in step 1 and never read them;
        4. loss weights and advantage weights, on the final state and the feedback with its
           features.

        Without `features` this equals `observe(fb)`, then `admission(fb)`, `loss_weights(fb)`
        and `advantage_weights(fb)` — those calls are views over the same code, for trainers
        that need one of them alone. The supervision places that act before the reward exists
        (`targets`, `rewards`) are called before `step`, on the rewards' way in.

        Args:
            feedback: the step's groups (`Feedback`); with supervision, the rewards `rewards`
                returned.
            features: optional callable `Admission` -> grads (or (grads, ref_grad)). A
                method whose admission reads the features is refused: admission decides
                which rollouts the features are computed for.

        Returns:
            `StepResult(keep, refill, full_group_advantages, weights, advantage_weights,
            feedback)`.

        Bad feedback raises before anything changes; bad features raise after step 1 (the
        features depend on its admission), with the feature readers not updated.

        >>> import numpy as np
        >>> from rlpace import Pool, Feedback, Scheduler
        >>> s = Scheduler(Pool(["a"] * 4), "dapo_dynamic_sampling")
        >>> r = s.step(Feedback([0, 1], [[1.0, 0.0], [1.0, 1.0]], step=0))
        >>> r.keep.tolist(), r.refill, r.weights.tolist()
        ([[True, True], [False, False]], 1, [[1.0, 1.0], [1.0, 1.0]])
        """
        if isinstance(feedback, Feedback) and feedback.group_sizes is not None:
            return self._step_ragged(feedback, features)
        # validates; nothing changed. The full batch and the shortcuts the updates read
        batch, wins, informative = self._batch_and_counts(feedback, self._places().step_fields)
        readers = self._places().feature_readers
        defer = readers if features is not None and batch.prompt_ids.shape[0] else frozenset()
        if defer and "admission" in defer:
            raise InputError(f"admission policy {self.method.admission.name!r} reads gradient features, "
                             f"which step(features=) computes after admission; pass the features in the "
                             f"Feedback (Feedback.with_grads) and call step without features.")
        self._observe(batch, wins, informative, defer)
        adm = self._admission(batch)
        if defer:
            out = features(adm)
            grads, ref = out if isinstance(out, tuple) else (out, None)
            feedback = feedback.with_grads(grads, ref)               # validates the features
            batch = batch._replace(grads=feedback.grads, ref_grad=feedback.ref_grad, grad_sums=feedback.grad_sums)
            self._update_deferred(batch, defer)
        return StepResult(adm.keep, adm.refill, adm.full_group_advantages, self._loss_weights(batch),
                          self._advantage_weights(batch), feedback)

    def _step_ragged(self, feedback: Feedback, features) -> StepResult:
        """`step` of ragged feedback: each part (one group size) is observed as a full batch,
        the step counted once; keep / weights scattered back to [B, G], padding False / 0."""
        parts = self._parts(feedback)                                # validates; nothing changed
        readers = self._places().feature_readers
        defer = readers if features is not None and parts else frozenset()
        if defer and "admission" in defer:
            raise InputError(f"admission policy {self.method.admission.name!r} reads gradient features, "
                             f"which step(features=) computes after admission; pass the features in the "
                             f"Feedback (Feedback.with_grads) and call step without features.")
        for _, batch, wins, informative in parts:
            self._observe(batch, wins, informative, defer, tally=False)
        self._tally(parts)
        adm = self.admission(feedback)
        if defer:
            out = features(adm)
            grads, ref = out if isinstance(out, tuple) else (out, None)
            feedback = feedback.with_grads(grads, ref)               # validates the features
            for (_, batch, _, _), (_, sub) in zip(parts, feedback.by_size()):
                self._update_deferred(batch._replace(grads=sub.grads, ref_grad=sub.ref_grad, grad_sums=sub.grad_sums),
                                      defer)
        return StepResult(adm.keep, adm.refill, adm.full_group_advantages, self.loss_weights(feedback),
                          self.advantage_weights(feedback), feedback)

    def _update_deferred(self, batch: Batch, kinds) -> None:
        """Each updating policy of a kind in `kinds` (None: every kind) learns from `batch`."""
        self.__dict__.pop("_handed_targets", None)     # decided on the state this call changes
        for kind, policy in self._places().updating:
            if kinds is not None and kind not in kinds:
                continue
            self.states[kind] = policy.update(self.states[kind], self.pool, batch)
            if policy.decisions is not None:        # decisions the update made (TraPO's keep / drop)
                self._log_decisions(batch, policy.decisions(self.states[kind], self.pool, batch))

    def observe_losses(self, losses: dict | LossFeedback, step: int = 0) -> None:
        """Feed held-out loss points to the policies that learn from loss curves.

        Args:
            losses: `{domain label: (tokens_seen, loss)}` — for each domain measured, the tokens
                (or rollouts: one unit, used consistently) of that domain trained on so far, and
                the mean teacher-forced NLL per token of reference answers on its fixed probe
                set. Domains not measured this time are simply left out. A prebuilt
                `rlpace.types.LossFeedback` is accepted as is.
            step: trainer step of the measurement.

        Each policy with a `DataPolicy.update_losses` (`epiplexity`, docs/methods/epiplexity.md)
        gets the validated `LossFeedback`; for the others this is a no-op, so a trainer can call
        it whatever the method. The points are Scheduler state (`state_dict`, exact resume).
        Bad input (unknown domain, a value that is not a (tokens_seen, loss) pair of finite
        numbers in [0, 2**62) × [0, 1e4]) raises a ValueError naming the domain and the field,
        before anything changes.

        >>> from rlpace import Pool, Scheduler
        >>> s = Scheduler(Pool(["a", "b"]), "epiplexity")
        >>> for t in (100, 200, 400, 800, 1600):
        ...     s.observe_losses({"a": (t, 1 + 40 / t), "b": (t, 1 + 4 / t)}, step=t)
        >>> round(s.metrics()["epiplexity/a/alpha"], 3), s.domain_probs().round(3).tolist()   # v ∝ A: 10 : 1
        (1.0, [0.94, 0.06])
        """
        if not isinstance(losses, LossFeedback):
            losses = LossFeedback.from_mapping(self.pool, losses, step)   # validates; nothing changed
        elif losses.domains.size and losses.domains.max() >= self.pool.n_domains:
            raise InputError(f"LossFeedback.domains has codes ≥ {self.pool.n_domains} (the pool's "
                             f"domain count); codes are positions in Pool.domain_names.")
        for kind, policy in self.method.policies().items():
            if policy.update_losses is not None:
                self.__dict__.pop("_handed_targets", None)
                self.states[kind] = policy.update_losses(self.states[kind], self.pool, losses)

    # ---- supervision places (target, reward, advantage) ------------------------------------
    def targets(self, feedback: Feedback) -> list:
        """list[str | None] of length B: the target each prompt's rollouts are verified
        against this step. None means the dataset label for a labelled prompt, and "no
        target" for an unlabelled one (every rollout then gets reward 0). Decided as though
        this visit were already observed (OLR's history includes the current majority);
        changes nothing — `observe` records the visit.

        The target place reads `feedback.answers` (the rewards may be a placeholder of zeros at
        this point: no target policy reads them). Without a target policy every entry is None.

        >>> import numpy as np
        >>> from rlpace import Pool, Feedback, Scheduler
        >>> s = Scheduler(Pool(["a"] * 3, labeled=[True, False, False]), "ttrl")
        >>> fb = Feedback([0, 1, 2], np.zeros((3, 4)), answers=[["1", "2", "2", None],
        ...              ["7", "7", "8", None], ["3", "4", None, None]], step=0)
        >>> s.targets(fb)       # labelled: dataset label; unlabelled: unique majority; tie: first seen
        [None, '7', '3']
        """
        if isinstance(feedback, Feedback) and feedback.group_sizes is not None:
            self._check_ids(feedback)
            labels = [None] * feedback.batch_size
            for rows, sub in feedback.by_size():
                for r, t in zip(rows.tolist(), self.targets(sub)):
                    labels[r] = t
            return labels
        batch = self._batch(feedback)
        target = self.method.target
        if target is None:
            return [None] * batch.prompt_ids.shape[0]
        out = target.apply(self.states[TARGET], self.pool, batch)
        labels = list(out.labels)
        if len(labels) != batch.prompt_ids.shape[0] or not all(t is None or isinstance(t, str) for t in labels):
            raise RuntimeError(f"target policy {target.name!r} returned {len(labels)} targets (expected "
                               f"{batch.prompt_ids.shape[0]}, each str or None): a bug in that policy.")
        # handed to `observe` of this Feedback (its decision log and updates), so the target place
        # decides once per visit; any change of the policies' state drops it first
        self._handed_targets = (feedback, out)
        return labels

    def rewards(self, feedback: Feedback) -> np.ndarray:
        """float64[B, G]: the reward place's transform of `feedback.rewards` (the rewards the
        trainer's verifier gave against `targets`). Identity without a reward policy; the
        trainer uses the returned rewards from then on (group advantages, `observe`, `admit`).
        Changes nothing."""
        if isinstance(feedback, Feedback) and feedback.group_sizes is not None:
            self._check_ids(feedback)
            return self._scatter(feedback, self.rewards, 0.0, np.float64)
        batch = self._batch(feedback)
        reward = self.method.reward
        if reward is None:
            return np.array(batch.rewards, dtype=np.float64)
        r = np.array(reward.apply(self.states[REWARD], self.pool, batch), dtype=np.float64)
        if r.shape != batch.rewards.shape or not np.isfinite(r).all():
            raise RuntimeError(f"reward policy {reward.name!r} returned rewards of shape {r.shape} "
                               f"(expected {batch.rewards.shape}, finite): a bug in that policy.")
        return r

    def advantage_weights(self, feedback: Feedback) -> np.ndarray:
        """float64[B, G] in [0, 1]: the advantage place's weights w (DE-Venus Eq. 5,
        Ã = w·Â; 0 filters a rollout, (0, 1) softly reweights it). The trainer multiplies the
        advantages by them before the loss. Ones without an advantage policy. Changes nothing."""
        if isinstance(feedback, Feedback) and feedback.group_sizes is not None:
            self._check_ids(feedback)
            return self._scatter(feedback, self.advantage_weights, 0.0, np.float64)
        return self._advantage_weights(self._batch(feedback))

    def _advantage_weights(self, batch: Batch) -> np.ndarray:
        adv = self.method.advantage
        if adv is None:
            return np.ones(batch.rewards.shape, dtype=np.float64)
        w = np.array(adv.apply(self.states[ADVANTAGE], self.pool, batch), dtype=np.float64)
        if w.shape != batch.rewards.shape or not np.isfinite(w).all() or (w < 0).any() or (w > 1).any():
            raise RuntimeError(f"advantage policy {adv.name!r} returned invalid weights (shape {w.shape}, "
                               f"expected {batch.rewards.shape}, each in [0, 1]).")
        return w

    def supervision_log(self, last: int | None = None) -> list[dict]:
        """The last `last` (default all kept, at most `SUPERVISION_LOG_SIZE` = 1000) supervision
        decisions, oldest first, each `{"step", "prompt_id" (the pool's stable id), "rule",
        "evidence": {name: number}, "decision", "target" (the label set)}` — one per relabel,
        pseudo-label or promotion the target place made on an observed visit, and one per
        decision a policy's `update` reports through `DataPolicy.decisions` (TraPO keeping or
        dropping an unlabelled prompt). The log belongs
        to this process: it is not part of `state_dict()` and starts empty after
        `load_state_dict`; the counters in `metrics()` (`supervision/...`) are state and
        resume exactly."""
        items = list(self._supervision_log)
        if last is not None:
            if isinstance(last, bool) or not isinstance(last, (int, np.integer)) or last < 0:
                raise InputError(f"supervision_log(last) needs a non-negative int; got {last!r}.")
            items = items[-int(last):] if last else []
        return [dict(d, evidence=dict(d["evidence"])) for d in items]

    def _log_decisions(self, batch: Batch, decisions: list) -> None:
        for d in decisions:
            pid = self.pool.ids[batch.prompt_ids[int(d["row"])]]
            self._supervision_log.append({
                "step": int(batch.step), "prompt_id": pid.item() if hasattr(pid, "item") else pid,
                "rule": str(d["rule"]), "evidence": dict(d["evidence"]), "decision": d["decision"],
                "target": d.get("target")})

    def admission(self, feedback: Feedback) -> Admission:
        """`Admission(keep bool[B, G], refill int, full_group_advantages bool)`: rollouts that
        enter the loss, how many replacement prompts to request (DAPO dynamic sampling), and
        whether a partly kept group trains on its full-group advantages (True: `topk`) or on
        advantages recomputed over its kept rollouts (False: PODS, GFPO; see
        `rlpace.kept_group_advantages`). `admit(fb)` is `admission(fb).keep`."""
        if isinstance(feedback, Feedback) and feedback.group_sizes is not None:
            self._check_ids(feedback)
            outs = []
            keep = self._scatter(feedback, lambda sub: outs.append(self.admission(sub)) or outs[-1].keep,
                                 False, bool)
            return Admission(keep, int(sum(o.refill for o in outs)),
                             any(o.full_group_advantages for o in outs))
        return self._admission(self._batch(feedback))

    def _admission(self, batch: Batch) -> Admission:
        out = self.method.admission.apply(self.states["admission"], self.pool, batch)
        keep = np.asarray(out.keep, dtype=bool)
        if keep.shape != batch.rewards.shape:
            raise RuntimeError(f"admission policy {self.method.admission.name!r} returned a mask of "
                               f"shape {keep.shape}, expected {batch.rewards.shape}.")
        return Admission(keep, int(out.refill), bool(out.full_group_advantages))

    def admit(self, feedback: Feedback) -> np.ndarray:
        """bool[B, G]: which rollouts enter the loss — `admission(feedback).keep`, for trainers
        that need neither refills nor the advantage rule."""
        return self.admission(feedback).keep

    def loss_weights(self, feedback: Feedback) -> np.ndarray:
        """float64[B, G] per-rollout loss weights (1 = unchanged; 0 on the padding of ragged
        feedback)."""
        if isinstance(feedback, Feedback) and feedback.group_sizes is not None:
            self._check_ids(feedback)
            return self._scatter(feedback, self.loss_weights, 0.0, np.float64)
        return self._loss_weights(self._batch(feedback))

    def _loss_weights(self, batch: Batch) -> np.ndarray:
        w = np.asarray(self.method.reweighting.apply(self.states["reweighting"], self.pool, batch),
                       dtype=np.float64)
        if w.shape != batch.rewards.shape or not np.isfinite(w).all() or (w < 0).any():
            raise RuntimeError(f"reweighting policy {self.method.reweighting.name!r} returned invalid "
                               f"weights (shape {w.shape}, expected {batch.rewards.shape}, finite ≥ 0).")
        return w

    def token_weights(self, feedback: Feedback, token_probs, token_mask) -> np.ndarray:
        """float64[B, G, T] per-token loss weights, 0 on padding.

        Args:
            feedback: the groups of the training batch (as for `loss_weights`).
            token_probs: float[B, G, T] π_old(o_t | q, o_<t), the sampling policy's
                probability of each generated token (exp of the old log-probs), in [0, 1].
            token_mask: bool (or 0/1)[B, G, T], True on real completion tokens.

        The reweighting policy sees a `Batch` whose `token_probs` / `token_mask` are set. A
        token-level policy (`ar`, docs/methods/ar.md) returns float64[B, G, T]; a rollout-level
        one returns float64[B, G], broadcast here over each rollout's tokens — so for a method
        without a token-level reweighter this equals `loss_weights(feedback)` on every real
        token, and a trainer can always call this one entry. Without token statistics
        (`loss_weights`), a token-level policy returns weights 1. In a `chain` of a token-level
        and a rollout-level reweighter, the rollout weight multiplies each of its tokens'.

        Validation: ValueError naming `token_probs` / `token_mask` for a wrong shape, values
        outside [0, 1] or NaN, or a mask that is not boolean; nothing changes (this call never
        changes state).

        >>> import numpy as np
        >>> from rlpace import Pool, Feedback, Scheduler
        >>> s = Scheduler(Pool(["a"] * 4), "ar")
        >>> fb = Feedback([0], [[1.0, 0.0]], step=0)
        >>> probs = np.array([[[0.2, 1.0], [0.6, 0.0]]]); mask = np.array([[[1, 1], [1, 0]]], bool)
        >>> s.token_weights(fb, probs, mask).round(6).tolist()   # 0.5π + 0.5 = .6, 1, .8; mean 1 over 3 tokens
        [[[0.75, 1.25], [1.0, 0.0]]]
        """
        if isinstance(feedback, Feedback) and feedback.group_sizes is not None:
            self._check_ids(feedback)
            probs, mask = np.asarray(token_probs), np.asarray(token_mask)
            if probs.ndim != 3 or probs.shape[:2] != feedback.rewards.shape or mask.shape != probs.shape:
                raise InputError(f"token_probs and token_mask must be [B, G, T] with [B, G] = "
                                 f"{feedback.rewards.shape} (the rewards' shape); got {probs.shape}, "
                                 f"{mask.shape}.")
            out = np.zeros(probs.shape, dtype=np.float64)
            for rows, sub in feedback.by_size():
                n = sub.rewards.shape[1]
                out[rows, :n] = self.token_weights(sub, probs[rows, :n], mask[rows, :n])
            return out
        batch = self._batch(feedback)
        shape = batch.rewards.shape
        probs = np.asarray(token_probs, dtype=np.float64)
        if probs.ndim != 3 or probs.shape[:2] != shape:
            raise InputError(f"token_probs must be float[B, G, T] with [B, G] = {shape} (the rewards' "
                             f"shape); got shape {probs.shape}.")
        if not (np.isfinite(probs).all() and (probs >= 0).all() and (probs <= 1).all()):
            raise InputError("token_probs must be probabilities in [0, 1] (exp of the old log-probs), "
                             "with no NaN; pass exp(old_logp), not the log-probs.")
        mask_in = np.asarray(token_mask)
        if mask_in.shape != probs.shape:
            raise InputError(f"token_mask must have token_probs' shape {probs.shape}; got {mask_in.shape}.")
        if mask_in.dtype != bool and not np.isin(mask_in, (0, 1)).all():
            raise InputError("token_mask must be boolean (or 0/1): True on real completion tokens.")
        mask = mask_in.astype(bool)
        tb = batch._replace(token_probs=probs, token_mask=mask)
        policy = self.method.reweighting
        w = np.asarray(policy.apply(self.states["reweighting"], self.pool, tb), dtype=np.float64)
        if w.shape == shape:
            w = np.broadcast_to(w[:, :, None], probs.shape)
        if w.shape != probs.shape or not np.isfinite(w).all() or (w < 0).any():
            raise RuntimeError(f"reweighting policy {policy.name!r} returned invalid token weights "
                               f"(shape {w.shape}, expected {shape} or {probs.shape}, finite ≥ 0).")
        return np.where(mask, w, 0.0)

    # ---- logging -----------------------------------------------------------------------
    def metrics(self) -> dict[str, float]:
        """Scalars for a logger: `domain_prob/<d>` (where the method has a mixture),
        `domain_share/<d>` (share of the last proposal), `domain_success/<d>` (windowed
        success rate of rollouts), `informative_fraction` (last batch's groups with
        non-zero advantage), cumulative counts, and the policies' own metrics (the
        supervision places' counters under `supervision/`: relabels, pseudo-labels, kept and
        dropped unlabelled prompts, promotions)."""
        names = [str(d) for d in self.pool.domain_names]
        out: dict[str, float] = {}
        probs = self.domain_probs()
        if probs is not None:
            out.update({f"domain_prob/{d}": float(p) for d, p in zip(names, probs)})
        last = self.counters.last_proposed
        if last.sum() > 0:
            out.update({f"domain_share/{d}": float(x) for d, x in zip(names, last / last.sum())})
        rate = window_mean(self.domain_window, empty=np.nan)
        out.update({f"domain_success/{d}": float(r) for d, r in zip(names, rate) if np.isfinite(r)})
        c = self.counters
        out["informative_fraction"] = float(c.last_informative)
        out["informative_fraction_total"] = float(c.informative / max(1, int(c.groups)))
        out["rollouts_observed"] = float(c.rollouts)
        out["groups_observed"] = float(c.groups)
        out["prompts_seen"] = float(self._prompts_seen)
        for kind, policy in self.method.policies().items():
            if policy.metrics is not None:
                out.update(policy.metrics(self.states[kind], self.pool))
        return out

    # ---- state -------------------------------------------------------------------------
    def _tree(self) -> dict:
        return {"history": self.history, "domain_window": self.domain_window,
                "counters": self.counters, "policy": dict(self.states)}

    def state_dict(self) -> dict[str, np.ndarray]:
        """A flat `{key: np.ndarray}` copy of all state: `np.savez(path, **sd)` and pickle
        both work. Includes the pool fingerprint and method name, checked on load."""
        sd = {"meta/version": np.array(STATE_VERSION), "meta/pool": np.array(self.pool.fingerprint()),
              "meta/pool_parts": np.array(json.dumps(self.pool.fingerprint_parts(), sort_keys=True)),
              "meta/method": np.array(self.method.name), "meta/seed": np.array(self.seed, np.int64),
              "meta/success_threshold": np.array(self.success_threshold, np.float64),
              "meta/hyperparameters": np.array(json.dumps(self.hyperparameters, sort_keys=True))}
        _flatten(self._tree(), "", sd)
        return sd

    def load_state_dict(self, state: dict) -> None:
        """Restore from `state_dict()` output (or an `np.load`ed npz). Validates everything
        first, and leaves the current state unchanged when anything is wrong:

        * identity: the state's version, pool (size, labels, clusters, ranks, difficulty,
          ids — the message names what differs), method name, success threshold and every
          hyperparameter of the policy (defaults included: a `dump` state saved with `c=5`
          does not load into a default `dump`) must match this Scheduler;
        * structure: the same keys, shapes and dtype kinds as this Scheduler's own state;
        * values: `meta/seed` an integer in [0, 2**63); every float finite; counts ≥ 0,
          prompt ids inside the pool, distributions summing to 1, Beta parameters > 0,
          ring cursors inside their ring (`rlpace.policies._state_checks`); then each
          policy's own `DataPolicy.check_state`.
        """
        seed, tree = self._validated(state)
        self._supervision_log.clear()
        self.seed = seed
        self.history, self.domain_window = tree["history"], tree["domain_window"]
        self._prompts_seen = int(np.count_nonzero(self.history.attempts))   # once per load
        self.counters, self.states = tree["counters"], tree["policy"]
        self.__dict__.pop("_handed_targets", None)

    def check_state_dict(self, state: dict) -> None:
        """Run every check of `load_state_dict` without changing anything: a ValueError
        when `state` would be rejected. What a checkpoint loader calls before it restores
        anything else (model weights, optimizer), so a bad file changes nothing."""
        self._validated(state)

    def _validated(self, state: dict) -> tuple[int, dict]:
        """(seed, state tree) from a state dict, after every check; nothing changes here."""
        if not (hasattr(state, "keys") and hasattr(state, "__getitem__")) or isinstance(state, (str, bytes)):
            hint = (f" Load the file first: load_state_dict(np.load({state!r}))."
                    if isinstance(state, (str, bytes)) else "")
            raise InputError(f"state must be the mapping Scheduler.state_dict() returned (or np.load of the .npz "
                             f"it was saved to); got {type(state).__name__} {str(state)[:60]!r}.{hint}")
        state = dict(state)
        for key in ("meta/version", "meta/pool", "meta/method"):
            if key not in state:
                raise InputError(f"not a Scheduler state: key {key!r} is missing.")
        version = _meta_int(state, "meta/version")
        if version != STATE_VERSION:
            raise InputError(f"state version {version} is not {STATE_VERSION}; it was written by "
                             f"another rlpace release.")
        for key in ("meta/pool_parts", "meta/success_threshold", "meta/hyperparameters", "meta/seed"):
            if key not in state:
                raise InputError(f"not a Scheduler state of version {STATE_VERSION}: key {key!r} is missing.")
        fp = str(np.asarray(state["meta/pool"]))
        try:
            saved = json.loads(str(np.asarray(state["meta/pool_parts"])))
        except ValueError:
            saved = {}
        now = self.pool.fingerprint_parts()
        if fp == self.pool.fingerprint() and saved != now:
            # meta/pool is a hash of meta/pool_parts: parts that do not hash to it were edited
            raise InputError("state['meta/pool_parts'] does not match state['meta/pool'] (this pool's "
                             "fingerprint): the state is corrupt or was edited; restore one written by "
                             "Scheduler.state_dict().")
        if fp != self.pool.fingerprint():
            differ = [k for k in now if saved.get(k) != now[k]] or ["fingerprint"]
            raise InputError(f"the state belongs to a different pool (its {', '.join(differ)} differ; "
                             f"fingerprint {fp}, this pool {self.pool.fingerprint()}); restore it with "
                             f"the pool it was saved with.")
        method = str(np.asarray(state["meta/method"]))
        if method != self.method.name:
            raise InputError(f"the state belongs to method {method!r}, this Scheduler runs "
                             f"{self.method.name!r}; build the Scheduler with the same policy.")
        threshold = np.asarray(state["meta/success_threshold"])
        if threshold.shape != () or threshold.dtype.kind != "f":
            raise InputError(f"state['meta/success_threshold'] is {threshold!r}; it must be one float. The "
                             f"state is corrupt or was edited: restore one written by Scheduler.state_dict().")
        if float(threshold) != self.success_threshold:
            raise InputError(f"the state was saved with success_threshold={float(threshold)}, this "
                             f"Scheduler has {self.success_threshold}; build it with the saved threshold.")
        self._check_hyperparameters(state["meta/hyperparameters"])
        seed = _meta_int(state, "meta/seed")
        if not 0 <= seed < 2**63:
            raise InputError(f"state['meta/seed'] is {seed}; a seed is an int in [0, 2**63). The state "
                             f"is corrupt or was edited: restore one written by Scheduler.state_dict().")
        template = self._tree()
        expected: dict[str, np.ndarray] = {}
        _flatten(template, "", expected)
        fresh_tree = {"policy": {kind: p.init(self.pool) for kind, p in self.method.policies().items()}}
        _fill_added_fields(fresh_tree, "", state)          # fields a state saved before them lacks
        missing = sorted(set(expected) - set(state))
        extra = sorted(k for k in set(state) - set(expected) if not k.startswith("meta/"))
        if missing or extra:
            raise InputError(f"state keys do not match this Scheduler (missing {missing[:5]}, "
                             f"unexpected {extra[:5]}); was it saved with other hyperparameters?")
        for key, ref in expected.items():
            got = np.asarray(state[key])
            if got.shape != ref.shape or got.dtype.kind != ref.dtype.kind:
                raise InputError(f"state[{key!r}] has shape {got.shape} dtype {got.dtype}, expected "
                                 f"{ref.shape} {ref.dtype}; was it saved with other hyperparameters?")
        tree = _unflatten(template, "", state)
        # NaN is a policy's own "unknown" marker where its fresh state holds NaN; elsewhere corrupt.
        fresh: dict[str, np.ndarray] = {}
        _flatten(fresh_tree, "", fresh)
        nan_ok = frozenset(k for k, v in fresh.items() if v.dtype.kind == "f" and np.isnan(v).any())
        check_tree(tree, "", self.pool, nan_ok)            # ValueError naming the key
        h = tree["history"]
        if (h.successes > h.attempts).any():
            raise bad("history/successes", "exceeds history/attempts", h.successes, h.successes > h.attempts)
        for kind, policy in self.method.policies().items():
            if policy.check_state is not None:
                policy.check_state(tree["policy"][kind], self.pool)
        return seed, tree

    def _check_hyperparameters(self, recorded) -> None:
        try:
            saved = json.loads(str(np.asarray(recorded)))
        except ValueError:
            raise InputError("state['meta/hyperparameters'] is not the JSON a Scheduler writes; the "
                             "state is corrupt or was edited.") from None
        now = json.loads(json.dumps(self.hyperparameters, sort_keys=True))
        if saved is None or now is None or saved == now:
            return      # a prebuilt policy object records none: the key/shape checks still apply
        diff = []
        try:
            if len(saved) != len(now):
                raise ValueError
            for (part, old), (part_now, new) in zip(saved, now):
                if part != part_now:
                    diff.append(f"policy: saved {part!r}, now {part_now!r}")
                    continue
                old, new = dict(old), dict(new)
                for k in sorted(set(old) | set(new)):
                    if k not in old and (part, k) in ADDED_HYPERPARAMETERS:
                        old[k] = ADDED_HYPERPARAMETERS[part, k]      # saved before it existed
                    if old.get(k, "<absent>") != new.get(k, "<absent>"):
                        diff.append(f"{part}.{k}: saved {old.get(k, '<absent>')!r}, now "
                                    f"{new.get(k, '<absent>')!r}")
        except (TypeError, ValueError):
            diff = [f"saved {saved!r}, now {now!r}"]
        else:
            if not diff:
                return  # equal once the parameters added since the save take their old value
        raise InputError(f"the state was saved with other hyperparameters ({'; '.join(diff)}); build "
                         f"the Scheduler with the saved values.")


# ---- helpers ---------------------------------------------------------------------------
def _round_to_unit(n: np.ndarray, unit: int) -> np.ndarray:
    """int64[B] multiples of `unit` with the sum of `n` (a multiple of unit): floor(n / unit)
    units each, then one more unit to the largest remainders n mod unit; equal remainders go
    to the larger n first (the prompt the policy wanted more of), then to the first prompt.

    >>> _round_to_unit(np.array([6, 9, 15, 2]), 4).tolist()
    [8, 8, 16, 0]
    >>> _round_to_unit(np.array([1, 1, 3, 3]), 2).tolist()
    [0, 0, 4, 4]
    """
    base, rem = np.divmod(n, unit)
    extra = int(rem.sum()) // unit                       # Σ n ≡ 0 (mod unit): exact
    base[np.lexsort((np.arange(n.shape[0]), -n, -rem))[:extra]] += 1
    return base * unit


def _cluster_to_domain(pool: Pool) -> np.ndarray:
    """float64[K, C]: column c is the domain make-up of cluster c (sums to 1)."""
    return pool.cluster_domain_shares()


def _meta_int(state: dict, key: str) -> int:
    """state[key] as an int: a 0-d integer array (a float such as 1.9 is refused, not cut)."""
    val = np.asarray(state[key])
    if val.shape != () or val.dtype.kind not in "iu":
        raise InputError(f"state[{key!r}] is {val!r}; it must be one integer. The state is corrupt or "
                         f"was edited: restore one written by Scheduler.state_dict().")
    return int(val)


def _fill_added_fields(fresh: Any, prefix: str, state: dict) -> None:
    """Derive, in `state` (a flat state dict, changed in place), the fields a state record
    gained after states were first saved, when `state` lacks them. A record declares them as
    a class attribute `ADDED_FIELDS = {field: derive}`, `derive(saved, fresh)` computing the
    field from the saved record's other fields (`saved`: field -> array) and a fresh record of
    this Scheduler (`fresh`, for the policy's constants): the value the code that saved the
    state behaved as if it held. A field whose inputs do not match the fresh record's shapes is
    left missing, and the key check names it."""
    if isinstance(fresh, dict):
        for k, v in fresh.items():
            _fill_added_fields(v, f"{prefix}{k}/", state)
    elif isinstance(fresh, tuple):
        named = hasattr(fresh, "_fields")
        added = getattr(type(fresh), "ADDED_FIELDS", {}) if named else {}
        names = fresh._fields if named else [str(i) for i in range(len(fresh))]
        for k, v in zip(names, fresh):
            key = f"{prefix}{k}"
            if k not in added or key in state:
                _fill_added_fields(v, f"{key}/", state)
                continue
            saved = {f: np.asarray(state[f"{prefix}{f}"]) for f in names if f"{prefix}{f}" in state}
            if all(f in saved and saved[f].shape == np.shape(getattr(fresh, f)) for f in names
                   if f not in added and isinstance(getattr(fresh, f), np.ndarray)):
                state[key] = added[k](saved, fresh)


def _flatten(node: Any, prefix: str, out: dict) -> None:
    if isinstance(node, dict):
        for k, v in node.items():
            _flatten(v, f"{prefix}{k}/", out)
    elif isinstance(node, tuple) and hasattr(node, "_fields"):
        for k, v in zip(node._fields, node):
            _flatten(v, f"{prefix}{k}/", out)
    elif isinstance(node, tuple):
        for i, v in enumerate(node):
            _flatten(v, f"{prefix}{i}/", out)
    elif node is None:
        return
    else:
        out[prefix.rstrip("/")] = np.array(node, copy=True)


def _unflatten(template: Any, prefix: str, flat: dict) -> Any:
    if isinstance(template, dict):
        return {k: _unflatten(v, f"{prefix}{k}/", flat) for k, v in template.items()}
    if isinstance(template, tuple) and hasattr(template, "_fields"):
        return type(template)(*(_unflatten(v, f"{prefix}{k}/", flat)
                                for k, v in zip(template._fields, template)))
    if isinstance(template, tuple):
        return tuple(_unflatten(v, f"{prefix}{i}/", flat) for i, v in enumerate(template))
    if template is None:
        return None
    val = np.array(flat[prefix.rstrip("/")], copy=True)
    if isinstance(template, np.ndarray):
        if template.dtype.kind == "U" and val.dtype.kind == "U":
            return val      # label strings: the width grows with the longest label stored
        return val.astype(template.dtype, copy=False)
    if isinstance(template, (bool, np.bool_)):
        return bool(val)
    if isinstance(template, (int, np.integer)):
        return int(val)
    if isinstance(template, (float, np.floating)):
        return float(val)
    return val.item() if val.ndim == 0 else val
