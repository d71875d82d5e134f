"""The policy algebra: seven kinds of data policy as pure (init, update, apply) triples,
and the combinators that make methods out of them.

A `DataPolicy` is the optax `GradientTransformation` of data scheduling
(`optax/_src/base.py`: init + update over explicit state): hyperparameters are closed over by a factory, state is a
NamedTuple of arrays, and three functions are pure in the sense that matters here —
everything they read is in their arguments:

    state  = init(pool)                         # fresh state for this pool
    state  = update(state, pool, batch)         # learn from one step's feedback
    result = apply(state, pool, ...)            # act; never changes state

`update` may reuse (write into) the arrays of the state it is given and return them:
per-prompt arrays hold 10⁶–10⁷ entries, and copying them every step would cost more than
the whole step. The Scheduler owns the only reference and validates all input before
calling `update`, so a rejected batch leaves the state untouched.

The kinds and what `apply` computes (the last three are the supervision places of DE-Venus,
arXiv 2609.03324, Eq. 3–5: rollout → target → admission → reward → advantages → weights):

| kind          | where it acts                   | apply(...)                                   | returns          |
|---------------|---------------------------------|----------------------------------------------|------------------|
| `mixture`     | before rollout: which arms      | apply(state, pool)                           | float64[K] probs |
| `selection`   | before rollout: which prompts   | apply(state, pool, n, probs, arms, rng)      | int64[n] ids     |
| `admission`   | after rollout: which rollouts   | apply(state, pool, batch)                    | `Admission`      |
| `reweighting` | in the loss: how much each      | apply(state, pool, batch)                    | float64[B, G]    |
| `target`      | after rollout: verify against   | apply(state, pool, batch)                    | `Targets`        |
| `reward`      | after verification: transform   | apply(state, pool, batch)                    | float64[B, G]    |
| `advantage`   | after GRPO: Ã = w·Â, w ∈ [0, 1] | apply(state, pool, batch)                    | float64[B, G]    |
| `allocation`  | before rollout: how many each   | apply(state, pool, ids, budget)              | int64[B] N_i     |

Each row is a `typing.Protocol` with every argument's dtype and shape (`MixtureApply`, ...,
`AllocationApply`, in `_protocols`); `DataPolicy(...)` refuses functions of the wrong arity.

The allocation place decides how many rollouts each proposed prompt gets (Knapsack RL, arXiv
2509.25849; GVM-RAFT, arXiv 2505.02391): N_i ≥ 0 with Σ N_i = budget exactly, each within the
policy's declared `bounds` (`Scheduler.allocate` checks both and names the policy when they
fail). Its feedback arrives as ragged groups (`Feedback.group_sizes`), which the Scheduler
hands to every other policy as rectangular groups of one size each (docs/methods/knapsack.md,
"Variable group sizes").

A `Method` holds one policy per place; `compose` (in `_compose`) builds one from any set of policies
(filling the empty places with neutral defaults: every prompt keeps its dataset label,
rewards unchanged, advantage weights 1), `chain` stacks several admission, reweighting,
reward (applied in order) or advantage (weights multiply) policies, and `with_floor` bounds
a mixture away from zero.
"""

from __future__ import annotations

from ..errors import InputError
from ..types import BATCH_DERIVED
import math
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

import numpy as np

from ._checks import shifted
from ._protocols import (PolicyCheckState, PolicyDecisions, PolicyInit, PolicyMetrics, PolicyUpdate,
                         PolicyUpdateLosses, check_signatures)

__all__ = [
    "MIXTURE", "SELECTION", "ADMISSION", "REWEIGHTING", "TARGET", "REWARD", "ADVANTAGE", "ALLOCATION", "KINDS",
    "DataPolicy", "Method", "Admission", "Targets", "chain", "with_floor",
    "softmax", "EmptyState", "dataset_labels", "identity_reward", "unit_advantage", "active_supervision_places", "supervising_places", "is_neutral",
]

MIXTURE, SELECTION, ADMISSION, REWEIGHTING = "mixture", "selection", "admission", "reweighting"
TARGET, REWARD, ADVANTAGE = "target", "reward", "advantage"
ALLOCATION = "allocation"
KINDS = (MIXTURE, SELECTION, ADMISSION, REWEIGHTING, TARGET, REWARD, ADVANTAGE, ALLOCATION)


class EmptyState(NamedTuple):
    """State of a stateless policy."""


class Admission(NamedTuple):
    """Result of an admission policy for one batch."""

    keep: np.ndarray  # bool[B, G] rollouts that enter the loss
    refill: int       # replacement prompts the trainer should generate (DAPO-style)
    # How a trainer computes the advantages of a partly kept group: False (the default, PODS and
    # GFPO) recomputes them on the kept rollouts (`rlpace.kept_group_advantages`); True keeps the
    # full group's advantages and only masks the dropped rollouts (DataFlex-RL's `topk`).
    full_group_advantages: bool = False


class Targets(NamedTuple):
    """Result of a target policy for one batch (`Scheduler.targets` returns `labels`)."""

    labels: list       # [B] str | None: the target each prompt's rollouts are verified against this
                       # step; None = the dataset label (labelled prompt) or no target (unlabelled)
    decisions: list    # [dict] one per relabel / pseudo-label / promotion: {"row": i, "rule": str,
                       # "evidence": {name: number}, "decision": str}; the Scheduler adds step and id


class _DataPolicyFields(NamedTuple):
    kind: str
    init: PolicyInit
    update: PolicyUpdate
    apply: Callable[..., Any]       # the kind's protocol, `_protocols.APPLY_PROTOCOLS[kind]`
    arms: str | None = None
    name: str = ""
    metrics: PolicyMetrics | None = None
    check_state: PolicyCheckState | None = None
    update_losses: PolicyUpdateLosses | None = None
    follows_mixture: bool = False
    reads: frozenset = frozenset()
    decisions: PolicyDecisions | None = None
    neutral: bool = False
    bounds: tuple | None = None
    batch_reads: frozenset | None = None


class DataPolicy(_DataPolicyFields):
    """One data policy: pure functions over an explicit state (see module docstring).

    Construction checks that every function given can be called with its protocol's
    positional arguments (`rlpace.policies.SelectionApply`, ...; extra parameters must be
    keyword-only with a default) and raises `InputError` naming the kind, the function and the
    expected signature — before any state exists.

    Attributes:
        kind: one of `mixture`, `selection`, `admission`, `reweighting`, `target`,
            `reward`, `advantage`, `allocation`.
        init: (pool) -> state (`PolicyInit`).
        update: (state, pool, batch) -> state (`PolicyUpdate`).
        apply: kind-specific: `MixtureApply`, `SelectionApply`, `AdmissionApply`,
            `ReweightingApply`, `TargetApply`, `RewardApply`, `AdvantageApply` or
            `AllocationApply` (the table in the module docstring).
        arms: for mixtures, what the distribution is over: "domain" or "cluster".
        name: registry name or a description, for logs and errors.
        metrics: optional (state, pool) -> dict[str, float] for logging.
        check_state: optional (state, pool) -> None that raises a ValueError naming the
            field when a restored state breaks a constraint only this policy knows (e.g.
            "ids in the buffer are distinct"). `Scheduler.load_state_dict` calls it before
            replacing anything, after its generic checks (every float finite, and the
            rules of rlpace's own state records: see `policies/_state_checks.py`).
        update_losses: optional (state, pool, losses) -> state for policies that learn from
            held-out loss curves: `Scheduler.observe_losses` validates a `LossFeedback`
            (rlpace.types) and passes it here; policies without it never see losses.
        follows_mixture: for selections, True when `apply` honours the mixture it is
            composed with: given `probs` over `arms`, the mixture decides how many slots
            each arm gets and the selection's own rule which of the arm's prompts fill
            them (mopps and the learnability selections: n_k ~ Multinomial(n, probs) over
            the non-empty arms; uniform_within_arm: an arm per slot ~ probs; ADS's window:
            clusters drawn ∝ probs). False (the default) for a selection that ignores
            `probs`: `compose` refuses to pair it with a mixture, which would otherwise
            do nothing at all.
        reads: the signals beyond rollout feedback this policy needs a trainer to produce:
            "grads" (per-rollout gradient features `Feedback.grads`: diem, dvc's influence
            value), "ref_grad" (a held-out reference direction `Feedback.ref_grad`: diem with
            importance="reference", dvc's influence value — trainers compute it only then),
            "measurement" (every training prompt's current pass rate, fed as one Feedback
            over the whole pool: the oracle_* measurement tools), "answers"
            (`Feedback.answers`: the target places), "token_entropy", "self_certainty",
            "mean_logprob" (per-rollout token statistics: the reward places). Trainers decide
            what to compute from this field, never from policy names; `chain` takes the union.
        decisions: optional (state, pool, batch) -> [dict] for policies whose `update` makes
            per-prompt supervision decisions (TraPO keeping or dropping an unlabelled
            prompt): called by `Scheduler.observe` right after `update`, with the updated
            state; each dict is `{"row": i, "rule": str, "evidence": {name: number},
            "decision": str}` and lands in `Scheduler.supervision_log()`. Target places
            report theirs through `Targets.decisions` instead.
        neutral: True only on the policies rlpace's own neutral factories build
            (`keep_all`, `unit_weights`, `uniform_pool`, `dataset_labels`, `identity_reward`,
            `unit_advantage`): the ones `compose` fills empty places with and drops when it
            merges methods. Decided by this flag, never by name, so a policy of your own
            named `keep_all` is kept. Test it with `is_neutral`.
        bounds: for allocations, (min_n, max_n): the fewest and most rollouts the policy gives
            one prompt (max_n may be None: no upper bound). `Scheduler.allocate` refuses a
            budget outside [B·min_n, B·max_n] before calling `apply`, and raises a
            RuntimeError naming the policy when `apply` leaves them.
        batch_reads: the fields of the `Batch` that only policies read (`types.BATCH_DERIVED`:
            "clusters", "advantages", "mean_abs_advantage", "abs_advantages") which `update`
            reads; None (the default: every policy not written for it) is the clusters and
            the advantages (`types.BATCH_FULL`; the other two are shortcuts that
            `group_mean_abs_advantage` and `rollout_abs_advantages` compute from the
            advantages when they are None). `Scheduler.observe` builds only the union over
            its updating policies, e.g. SEC's {"mean_abs_advantage"} skips the [B, G]
            advantages and the clusters' gather; the fields left out are None. Admission,
            weights and the target place always get the full batch (`step`: with the
            shortcuts the updates declared).

    State holds finite floats: a state with NaN or inf is rejected on load.
    """

    __slots__ = ()

    if not TYPE_CHECKING:       # type checkers keep checking the fields' own constructor
        def __new__(cls, *args, **kwargs):
            policy = super().__new__(cls, *args, **kwargs)
            check_signatures(policy)
            _check_batch_reads(policy)
            return policy

        @classmethod
        def _make(cls, iterable):       # what `_replace` builds with: checked as well
            return cls(*iterable)


def _check_batch_reads(policy: "DataPolicy") -> None:
    """InputError unless `batch_reads` is None or a set of `types.BATCH_DERIVED` names: a
    misspelt field would leave it None in every batch `observe` builds."""
    reads = policy.batch_reads
    if reads is None:
        return
    if not isinstance(reads, (set, frozenset)) or not reads <= BATCH_DERIVED:
        raise InputError(f"DataPolicy {policy.name!r}: batch_reads must be None or a frozenset of "
                         f"{sorted(BATCH_DERIVED)} (the Batch fields its update reads); got {reads!r}.")


class Method(NamedTuple):
    """A full scheduling method: one policy at each place. `target`, `reward` and
    `advantage` may be None in a hand-built Method: the Scheduler then behaves as their
    neutral defaults (`dataset_labels`, `identity_reward`, `unit_advantage`). `allocation`
    None (the default) gives every prompt the same number of rollouts
    (`Scheduler.allocate`)."""

    mixture: DataPolicy | None
    selection: DataPolicy
    admission: DataPolicy
    reweighting: DataPolicy
    name: str = ""
    target: DataPolicy | None = None
    reward: DataPolicy | None = None
    advantage: DataPolicy | None = None
    allocation: DataPolicy | None = None

    def policies(self) -> dict[str, DataPolicy]:
        out = {SELECTION: self.selection, ADMISSION: self.admission, REWEIGHTING: self.reweighting}
        if self.mixture is not None:
            out[MIXTURE] = self.mixture
        for kind, p in ((TARGET, self.target), (REWARD, self.reward), (ADVANTAGE, self.advantage),
                        (ALLOCATION, self.allocation)):
            if p is not None:
                out[kind] = p
        return out


def _no_update(state, pool, batch):
    return state


def _empty_init(pool):
    return EmptyState()


def keep_all() -> DataPolicy:
    """Admission that keeps every rollout and requests no refills (plain GRPO)."""
    def apply(state, pool, batch):
        return Admission(np.ones(batch.rewards.shape, dtype=bool), 0)
    return DataPolicy(ADMISSION, _empty_init, _no_update, apply, name="keep_all", neutral=True)


def unit_weights() -> DataPolicy:
    """Reweighting that gives every rollout weight 1 (plain GRPO)."""
    def apply(state, pool, batch):
        return np.ones(batch.rewards.shape, dtype=np.float64)
    return DataPolicy(REWEIGHTING, _empty_init, _no_update, apply, name="unit_weights", neutral=True)


def dataset_labels() -> DataPolicy:
    """Target that keeps every prompt's dataset label (neutral: `Targets([None] * B, [])`)."""
    def apply(state, pool, batch):
        return Targets([None] * int(batch.prompt_ids.shape[0]), [])
    return DataPolicy(TARGET, _empty_init, _no_update, apply, name="dataset_labels", neutral=True)


def identity_reward() -> DataPolicy:
    """Reward transform that returns the verified rewards unchanged (neutral)."""
    def apply(state, pool, batch):
        return np.asarray(batch.rewards, dtype=np.float64)
    return DataPolicy(REWARD, _empty_init, _no_update, apply, name="identity_reward", neutral=True)


def unit_advantage() -> DataPolicy:
    """Advantage weights w = 1 for every rollout (neutral: Ã = Â)."""
    def apply(state, pool, batch):
        return np.ones(batch.rewards.shape, dtype=np.float64)
    return DataPolicy(ADVANTAGE, _empty_init, _no_update, apply, name="unit_advantage", neutral=True)


def is_neutral(policy: DataPolicy | None) -> bool:
    """True when `policy` is one of the neutral policies `compose` fills empty places with
    (built by `keep_all`, `unit_weights`, `uniform_pool`, `dataset_labels`,
    `identity_reward` or `unit_advantage`; see `DataPolicy.neutral`). Decided by the flag
    those factories set, not by name: a policy of your own called "keep_all" is not neutral.

    >>> from rlpace.policies import keep_all, make_policy
    >>> is_neutral(keep_all()), is_neutral(make_policy("dapo_dynamic_sampling"))
    (True, False)
    """
    return policy is not None and bool(getattr(policy, "neutral", False))


def active_supervision_places(method: Method) -> frozenset:
    """The supervision places (`target`, `reward`, `advantage`) where `method` holds a policy
    other than the neutral one `compose` fills in — empty for every method without
    supervision. Trainers and adapters run the supervision transforms only for these.

    >>> from rlpace.policies import make_method
    >>> sorted(active_supervision_places(make_method("ttrl+dump"))), active_supervision_places(make_method("dump"))
    (['target'], frozenset())
    """
    return frozenset(k for k in (TARGET, REWARD, ADVANTAGE)
                     if getattr(method, k, None) is not None and not is_neutral(getattr(method, k)))


#: Deprecated name of `active_supervision_places`, kept so that existing imports keep working.
supervising_places = active_supervision_places


def chain(*policies: DataPolicy) -> DataPolicy:
    """Stack admission policies (a rollout is kept if every policy keeps it; refills add
    up), reweighting or advantage policies (weights multiply; a rollout weight [B, G]
    multiplies each token of a token-level weight [B, G, T]), or reward policies (each
    transforms the rewards the previous one returned). The chained state is the tuple of
    the members' states; `update_losses` reaches each member that has one, `reads` is the
    union, and `follows_mixture` (a selection's flag: selections are never chained) is refused.

    >>> from rlpace.policies import make_policy
    >>> p = chain(make_policy("dapo_dynamic_sampling"), make_policy("pods_max_variance"))
    >>> p.kind, p.name
    ('admission', 'dapo_dynamic_sampling>pods_max_variance')
    """
    if not policies:
        raise InputError("chain needs at least one policy.")
    if len(policies) == 1:
        return policies[0]
    kinds = {p.kind for p in policies}
    if len(kinds) != 1 or kinds.pop() not in (ADMISSION, REWEIGHTING, REWARD, ADVANTAGE):
        raise InputError("chain stacks policies of one kind, admission, reweighting, reward or "
                         "advantage; got "
                         f"{[(p.name, p.kind) for p in policies]}. Use compose() for a whole method.")
    kind = policies[0].kind
    if any(p.follows_mixture for p in policies):
        # only a selection honours a mixture, and a selection is never chained: the flag on
        # any other kind is a mistake that `compose` would otherwise carry nowhere
        raise InputError(f"chain members {[p.name for p in policies if p.follows_mixture]} set "
                         f"follows_mixture, which only a selection policy can honour; a {kind} "
                         f"policy leaves it False.")

    def init(pool):
        return tuple(p.init(pool) for p in policies)

    def update_losses(state, pool, losses):       # each member that learns from loss curves
        return tuple(s if p.update_losses is None else p.update_losses(s, pool, losses)
                     for p, s in zip(policies, state))

    def update(state, pool, batch):
        return tuple(p.update(s, pool, batch) for p, s in zip(policies, state))

    def apply(state, pool, batch):
        if kind == REWARD:      # in order: each member sees the rewards the previous returned
            for p, s in zip(policies, state):
                batch = batch._replace(rewards=np.asarray(p.apply(s, pool, batch), dtype=np.float64))
            return batch.rewards
        outs = [p.apply(s, pool, batch) for p, s in zip(policies, state)]
        if kind == ADMISSION:
            keep = np.logical_and.reduce([o.keep for o in outs])
            return Admission(keep, int(sum(o.refill for o in outs)),
                             any(o.full_group_advantages for o in outs))
        w = np.asarray(outs[0], dtype=np.float64)
        for o in outs[1:]:
            # A token-level reweighter (`ar`: float64[B, G, T]) times a rollout-level one
            # ([B, G]): the rollout's weight multiplies each of its tokens'.
            o = np.asarray(o, dtype=np.float64)
            w, o = (w, o[..., None]) if o.ndim < w.ndim else (w[..., None] if w.ndim < o.ndim else w, o)
            w = w * o
        return w

    def metrics(state, pool):
        out = {}
        for p, s in zip(policies, state):
            if p.metrics is not None:
                out.update(p.metrics(s, pool))
        return out

    def check_state(state, pool):
        for p, s in zip(policies, state):
            if p.check_state is not None:
                p.check_state(s, pool)

    def decisions(state, pool, batch):
        return [d for p, s in zip(policies, state) if p.decisions is not None
                for d in p.decisions(s, pool, batch)]

    return DataPolicy(kind, init, update, apply, name=">".join(p.name for p in policies),
                      metrics=metrics, check_state=check_state,
                      update_losses=update_losses if any(p.update_losses is not None for p in policies) else None,
                      reads=frozenset().union(*(p.reads for p in policies)),
                      decisions=decisions if any(p.decisions is not None for p in policies) else None)


def with_floor(mixture: DataPolicy, floor: float) -> DataPolicy:
    """Bound every arm's probability below by `floor`: p' = (1 − K·floor)·p + floor.

    This mixes with the uniform distribution, so p' sums to 1 and keeps the order of p.
    Requires K·floor ≤ 1.

    >>> from rlpace.policies import make_policy
    >>> with_floor(make_policy("fixed_mixture", weights=[1.0, 0.0]), 0.1).name
    'fixed_mixture|floor=0.1'
    """
    if mixture.kind != MIXTURE:
        raise InputError(f"with_floor wraps a mixture policy; {mixture.name!r} is {mixture.kind}.")
    if not 0.0 <= floor < 1.0:
        raise InputError(f"floor must be in [0, 1); got {floor}.")

    def init(pool):
        # Checked here too, so an infeasible floor fails when the Scheduler is built,
        # not at its first propose().
        k = pool.n_arms(mixture.arms)
        if k * floor > 1.0 + 1e-12:
            raise InputError(f"floor={floor} is infeasible for {k} arms (needs floor ≤ 1/{k}).")
        return mixture.init(pool)

    def apply(state, pool):
        p = mixture.apply(state, pool)
        k = p.shape[0]
        if k * floor > 1.0 + 1e-12:
            raise InputError(f"floor={floor} is infeasible for {k} arms (needs floor ≤ 1/{k}).")
        return (1.0 - k * floor) * p + floor

    return mixture._replace(init=init, apply=apply, name=f"{mixture.name}|floor={floor:g}")


def softmax(scores: np.ndarray, temperature: float) -> np.ndarray:
    """Max-subtracted softmax(scores / temperature), float64."""
    z = np.asarray(np.asarray(scores, dtype=np.float64) / temperature)   # new: the rest works in place
    z -= z.max()
    np.exp(z, out=z)
    z /= z.sum()
    return z


def softmax_of_floats(scores: list, temperature: float) -> np.ndarray:
    """`shifted_softmax(np.array(scores), temperature)` bit for bit, for K scores held as Python
    floats (a mixture's K-sized arithmetic done in floats: + − × ÷ round as numpy's do): the
    max and the shift in Python, the exp and the normalisation numpy's own calls. Scores with
    an inf or a NaN (or a sum that overflows) take the array function itself."""
    if not math.isfinite(sum(scores)):
        return shifted_softmax(np.array(scores, dtype=np.float64), temperature)
    top = max(scores)
    z = np.array([(x - top) / temperature for x in scores])
    np.exp(z, out=z)
    z /= z.sum()
    return z


def shifted_softmax(scores: np.ndarray, temperature: float) -> np.ndarray:
    """`softmax(shifted(scores), temperature)` bit for bit, in six numpy calls instead of
    eleven: once the maximum is subtracted the largest entry is exactly 0 (top − top), so is its
    quotient by the temperature, and softmax's own `z -= z.max()` subtracts 0.0, which
    changes no float (−0.0 included). Taken only when the maximum is finite (an inf or NaN
    maximum goes through the two functions, with their results)."""
    s = np.asarray(scores, dtype=np.float64)
    top = s.max()
    if not math.isfinite(top):
        return softmax(shifted(s), temperature)
    z = s - top                                  # = shifted(s): a new array
    z /= temperature
    np.exp(z, out=z)
    z /= z.sum()
    return z
