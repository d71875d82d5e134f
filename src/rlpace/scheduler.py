"""The `Scheduler`: the stateful object that trainers and engine adapters drive.

It owns a `Pool`, a `Method` (one policy per place, see `rlpace.policies`), every
policy's state, and a shared per-prompt history. Each training step:

    ids  = sched.propose(n)            # before rollout: which prompts
    ...generate G rollouts for each id, score them...
    sched.observe(fb)                  # learn from the outcome (all groups)
    keep = sched.admit(fb)             # bool[B, G]: which rollouts enter the loss
    w    = sched.loss_weights(fb)      # float64[B, G]: per-rollout loss weights
    log(sched.metrics())

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

from typing import Any, NamedTuple

import numpy as np

from .policies._base import MIXTURE, Admission, Method
from .policies._registry import make_method
from .stats._window import window_init, window_mean, window_push
from .types import Batch, Feedback, Pool, _batch_and_counts

__all__ = ["Scheduler", "STATE_VERSION"]

STATE_VERSION = 1
_STREAM_PROPOSE = 0x5EED


class History(NamedTuple):
    """Per-prompt pass-rate history shared by all policies (and logged)."""

    attempts: np.ndarray   # int64[N] rollouts ever observed per prompt
    successes: np.ndarray  # int64[N] successful rollouts per prompt
    last_step: np.ndarray  # int64[N] latest Feedback.step observed; -1 = never


class Counters(NamedTuple):
    proposals: np.ndarray        # int64[] propose() calls so far (the RNG step)
    observations: np.ndarray     # int64[] non-empty observe() calls so far
    rollouts: np.ndarray         # int64[] rollouts observed
    groups: np.ndarray           # int64[] groups observed
    informative: np.ndarray      # int64[] groups with non-zero advantage
    last_informative: np.ndarray  # float64[] informative fraction of the last batch
    last_proposed: np.ndarray    # int64[K] domain counts of the last proposal


class Scheduler:
    """Adaptive data scheduler over a prompt pool.

    Args:
        pool: the prompts (`rlpace.Pool`).
        policy: a registry name (`rlpace.policies.names()`), several joined with '+'
            ("dump+dapo_dynamic_sampling"), a dotted path to a user factory, a
            `DataPolicy`, or a `Method` from `rlpace.policies.compose`.
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
            raise ValueError(f"success_threshold must be a number; got {success_threshold!r}.") from None
        if not np.isfinite(success_threshold):
            raise ValueError(f"success_threshold must be finite; got {success_threshold}.")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= int(seed) < 2**63:
            # numpy's PCG64 rejects negatives only at the first propose(), with a message that
            # does not name the argument; ≥ 2**63 would not round-trip through an npz.
            raise ValueError(f"seed must be an int in [0, 2**63); got {seed!r}.")
        self.pool = pool
        self.method: Method = make_method(policy, **policy_kwargs)
        self.seed = int(seed)
        self.success_threshold = float(success_threshold)
        n, k = len(pool), pool.n_domains
        self.history = History(np.zeros(n, np.int64), np.zeros(n, np.int64), np.full(n, -1, np.int64))
        self.domain_window = window_init(k, metrics_window)
        self.counters = Counters(*(np.array(0, np.int64) for _ in range(5)),
                                 np.array(0.0), np.zeros(k, np.int64))
        self.states: dict[str, Any] = {kind: p.init(pool) for kind, p in self.method.policies().items()}

    # ---- the step ----------------------------------------------------------------------
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
            raise ValueError(f"propose(n) needs a non-negative int; got {n!r}.")
        n = int(n)
        probs, arms = None, None
        if self.method.mixture is not None:
            probs = self.method.mixture.apply(self.states[MIXTURE], self.pool)
            arms = self.method.mixture.arms
        # = np.random.default_rng([seed, step, stream]), without its argument checks.
        step = int(self.counters.proposals)
        rng = np.random.Generator(np.random.PCG64([self.seed, step, _STREAM_PROPOSE]))
        ids = np.asarray(self.method.selection.apply(self.states["selection"], self.pool, n, probs,
                                                     arms, rng), dtype=np.int64)
        if ids.shape != (n,) or (n and (ids.min() < 0 or ids.max() >= len(self.pool))):
            raise RuntimeError(f"selection policy {self.method.selection.name!r} returned ids of shape "
                               f"{ids.shape} outside [0, {len(self.pool)}): a bug in that policy.")
        self.counters.proposals[...] += 1
        self.counters.last_proposed[:] = np.bincount(self.pool.domains[ids], minlength=self.pool.n_domains)
        return ids

    def _batch(self, feedback: Feedback) -> Batch:
        return self._batch_and_counts(feedback)[0]

    def _batch_and_counts(self, feedback: Feedback) -> tuple[Batch, np.ndarray, np.ndarray]:
        if not isinstance(feedback, Feedback):
            raise TypeError(f"expected an rlpace.Feedback; got {type(feedback).__name__}. Build one "
                            f"with Feedback(prompt_ids, rewards, advantages=None, step=...).")
        ids = feedback.prompt_ids
        if ids.size and ids.max() >= len(self.pool):
            raise ValueError(f"Feedback.prompt_ids has ids ≥ pool size {len(self.pool)} (max "
                             f"{int(ids.max())}); ids are pool positions 0..{len(self.pool) - 1}.")
        return _batch_and_counts(feedback, self.pool, self.success_threshold)

    def observe(self, feedback: Feedback) -> None:
        """Update history and every policy's state from one step's feedback (all groups,
        including those admission will drop: ADS's window needs the all-wrong ones).

        All input is validated before anything changes, so a rejected batch leaves the state
        exactly as it was. Built-in policies never raise on validated input; a user policy
        whose `update` raises leaves the history and the policies before it updated (no
        snapshot is taken: copying 10⁷-entry arrays every step would cost more than the step).
        """
        batch, wins, informative = self._batch_and_counts(feedback)  # validates; nothing changed
        b = batch.prompt_ids.shape[0]
        if b == 0:
            return
        g = batch.rewards.shape[1]
        h = self.history
        np.add.at(h.attempts, batch.prompt_ids, g)
        np.add.at(h.successes, batch.prompt_ids, wins)
        # max, not assignment: feedback that arrives late must not move recency backwards.
        np.maximum.at(h.last_step, batch.prompt_ids, batch.step)
        window_push(self.domain_window, batch.domains, batch.success)   # [B] arms, [B, G] values
        for kind, policy in self.method.policies().items():
            self.states[kind] = policy.update(self.states[kind], self.pool, batch)
        n_informative = int(np.count_nonzero(informative))
        c = self.counters
        c.observations[...] += 1
        c.rollouts[...] += b * g
        c.groups[...] += b
        c.informative[...] += n_informative
        c.last_informative[...] = n_informative / b

    def admission(self, feedback: Feedback) -> Admission:
        """`Admission(keep bool[B, G], refill int)`: rollouts that enter the loss, and how
        many replacement prompts to request (DAPO dynamic sampling)."""
        batch = self._batch(feedback)
        out = self.method.admission.apply(self.states["admission"], self.pool, batch)
        keep = np.asarray(out.keep, dtype=bool)
        if keep.shape != batch.rewards.shape:
            raise RuntimeError(f"admission policy {self.method.admission.name!r} returned a mask of "
                               f"shape {keep.shape}, expected {batch.rewards.shape}.")
        return Admission(keep, int(out.refill))

    def admit(self, feedback: Feedback) -> np.ndarray:
        """bool[B, G]: which rollouts enter the loss."""
        return self.admission(feedback).keep

    def loss_weights(self, feedback: Feedback) -> np.ndarray:
        """float64[B, G] per-rollout loss weights (1 = unchanged)."""
        batch = self._batch(feedback)
        w = np.asarray(self.method.reweighting.apply(self.states["reweighting"], self.pool, batch),
                       dtype=np.float64)
        if w.shape != batch.rewards.shape or not np.isfinite(w).all() or (w < 0).any():
            raise RuntimeError(f"reweighting policy {self.method.reweighting.name!r} returned invalid "
                               f"weights (shape {w.shape}, expected {batch.rewards.shape}, finite ≥ 0).")
        return w

    # ---- logging -----------------------------------------------------------------------
    def metrics(self) -> dict[str, float]:
        """Scalars for a logger: `domain_prob/<d>` (where the method has a mixture),
        `domain_share/<d>` (share of the last proposal), `domain_success/<d>` (windowed
        success rate of rollouts), `informative_fraction` (last batch's groups with
        non-zero advantage), cumulative counts, and the policies' own metrics."""
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
        out["prompts_seen"] = float(np.count_nonzero(self.history.attempts)) if len(self.pool) <= 10**6 \
            else float("nan")  # O(N): skipped for very large pools
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
              "meta/method": np.array(self.method.name), "meta/seed": np.array(self.seed)}
        _flatten(self._tree(), "", sd)
        return sd

    def load_state_dict(self, state: dict) -> None:
        """Restore from `state_dict()` output (or an `np.load`ed npz). Validates everything
        first: a state from another pool, method or version is rejected and the current
        state is left unchanged."""
        state = dict(state)
        for key in ("meta/version", "meta/pool", "meta/method"):
            if key not in state:
                raise ValueError(f"not a Scheduler state: key {key!r} is missing.")
        if int(np.asarray(state["meta/version"])) != STATE_VERSION:
            raise ValueError(f"state version {int(np.asarray(state['meta/version']))} is not "
                             f"{STATE_VERSION}; it was written by another rlpace release.")
        fp = str(np.asarray(state["meta/pool"]))
        if fp != self.pool.fingerprint():
            raise ValueError(f"the state belongs to a different pool (fingerprint {fp}, this pool "
                             f"{self.pool.fingerprint()}); restore it with the pool it was saved with.")
        method = str(np.asarray(state["meta/method"]))
        if method != self.method.name:
            raise ValueError(f"the state belongs to method {method!r}, this Scheduler runs "
                             f"{self.method.name!r}; build the Scheduler with the same policy.")
        template = self._tree()
        expected: dict[str, np.ndarray] = {}
        _flatten(template, "", expected)
        missing = sorted(set(expected) - set(state))
        extra = sorted(k for k in set(state) - set(expected) if not k.startswith("meta/"))
        if missing or extra:
            raise ValueError(f"state keys do not match this Scheduler (missing {missing[:5]}, "
                             f"unexpected {extra[:5]}); was it saved with other hyperparameters?")
        for key, ref in expected.items():
            got = np.asarray(state[key])
            if got.shape != ref.shape or got.dtype.kind != ref.dtype.kind:
                raise ValueError(f"state[{key!r}] has shape {got.shape} dtype {got.dtype}, expected "
                                 f"{ref.shape} {ref.dtype}; was it saved with other hyperparameters?")
        tree = _unflatten(template, "", state)
        self.seed = int(np.asarray(state.get("meta/seed", self.seed)))
        self.history, self.domain_window = tree["history"], tree["domain_window"]
        self.counters, self.states = tree["counters"], tree["policy"]


# ---- helpers ---------------------------------------------------------------------------
def _cluster_to_domain(pool: Pool) -> np.ndarray:
    """float64[K, C]: column k is the domain make-up of cluster k (sums to 1)."""
    key = "cluster_to_domain"
    if key not in pool._cache:
        m = pool.domain_cluster_counts()
        pool._cache[key] = m / np.maximum(m.sum(axis=0, keepdims=True), 1.0)
    return pool._cache[key]


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
        return val.astype(template.dtype, copy=False)
    if isinstance(template, (bool, np.bool_)):
        return bool(val)
    if isinstance(template, (int, np.integer)):
        return int(val)
    if isinstance(template, (float, np.floating)):
        return float(val)
    return val.item() if val.ndim == 0 else val
