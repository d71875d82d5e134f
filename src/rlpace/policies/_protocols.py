"""The call shape of every function a `DataPolicy` holds, one `typing.Protocol` each.

`apply` differs by kind (the table in `_base`); `init`, `update` and the optional hooks have
one shape for every kind. The Scheduler calls them all positionally, so each protocol's
parameters are positional-only: a function matches whatever it names them
(`def apply(s, p, b)` is an `AdmissionApply`). `DataPolicy(...)` checks each function it is
given against these with `check_signatures`, so a wrong arity fails at construction with the
expected signature, not at the first step with an obscure TypeError.

Shapes: N prompts in the pool, K arms (`pool.n_arms(arms)`: domains or clusters), B prompts
in the batch, G rollouts per prompt, T tokens per rollout.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Callable, Protocol

import numpy as np

from ..errors import InputError
from ..types import Batch, LossFeedback, Pool

if TYPE_CHECKING:
    from ._base import Admission, Targets

__all__ = [
    "PolicyInit", "PolicyUpdate", "MixtureApply", "SelectionApply", "AdmissionApply", "ReweightingApply",
    "TargetApply", "RewardApply", "AdvantageApply", "AllocationApply", "PolicyMetrics", "PolicyCheckState",
    "PolicyUpdateLosses", "PolicyDecisions", "APPLY_PROTOCOLS", "check_signatures",
]


class PolicyInit(Protocol):
    """`init(pool) -> state`: fresh state for `pool` (`Pool`, N prompts), a NamedTuple of
    arrays (`EmptyState()` for a stateless policy). Every kind."""

    def __call__(self, pool: Pool, /) -> Any: ...


class PolicyUpdate(Protocol):
    """`update(state, pool, batch) -> state`: learn from one step's feedback (`Batch`: int64[B]
    `prompt_ids`, float64[B, G] `rewards`, ...); returns the new state, possibly the given
    arrays written in place. Every kind."""

    def __call__(self, state: Any, pool: Pool, batch: Batch, /) -> Any: ...


class MixtureApply(Protocol):
    """`apply(state, pool) -> float64[K]`: the probability of each arm (`DataPolicy.arms`:
    domains or clusters), non-negative, summing to 1."""

    def __call__(self, state: Any, pool: Pool, /) -> np.ndarray: ...


class SelectionApply(Protocol):
    """`apply(state, pool, n, probs, arms, rng) -> int64[n]`: pool positions in [0, N) of the
    next `n` (int ≥ 0) prompts to roll out. `probs` is the mixture's float64[K] and `arms`
    its `"domain"` / `"cluster"`, both None without a mixture; `rng` is a
    `numpy.random.Generator` derived from (seed, step), the policy's only randomness."""

    def __call__(self, state: Any, pool: Pool, n: int, probs: np.ndarray | None, arms: str | None,
                 rng: np.random.Generator, /) -> np.ndarray: ...


class AdmissionApply(Protocol):
    """`apply(state, pool, batch) -> Admission`: `keep` bool[B, G] (rollouts that enter the
    loss), `refill` int ≥ 0 (replacement prompts to generate), `full_group_advantages` bool."""

    def __call__(self, state: Any, pool: Pool, batch: Batch, /) -> Admission: ...


class ReweightingApply(Protocol):
    """`apply(state, pool, batch) -> float64[B, G]`: finite loss weights ≥ 0 per rollout; a
    token-level policy returns float64[B, G, T] when `batch.token_probs` (float64[B, G, T]) is
    set (`Scheduler.token_weights`)."""

    def __call__(self, state: Any, pool: Pool, batch: Batch, /) -> np.ndarray: ...


class TargetApply(Protocol):
    """`apply(state, pool, batch) -> Targets`: `labels`, B entries of str | None (the target
    each prompt is verified against; None = its dataset label), and `decisions`, a list of
    dicts `{"row", "rule", "evidence", "decision"}`. Reads `batch.answers` (object[B, G])."""

    def __call__(self, state: Any, pool: Pool, batch: Batch, /) -> Targets: ...


class RewardApply(Protocol):
    """`apply(state, pool, batch) -> float64[B, G]`: the transformed rewards, finite, from the
    verified `batch.rewards` (float64[B, G])."""

    def __call__(self, state: Any, pool: Pool, batch: Batch, /) -> np.ndarray: ...


class AdvantageApply(Protocol):
    """`apply(state, pool, batch) -> float64[B, G]`: advantage weights w in [0, 1]
    (Ã = w·Â; 0 filters a rollout)."""

    def __call__(self, state: Any, pool: Pool, batch: Batch, /) -> np.ndarray: ...


class AllocationApply(Protocol):
    """`apply(state, pool, ids, budget) -> int64[B]`: rollouts N_i for each proposed prompt
    `ids` (int64[B] pool positions), summing to `budget` (int) exactly, each within
    `DataPolicy.bounds`."""

    def __call__(self, state: Any, pool: Pool, ids: np.ndarray, budget: int, /) -> np.ndarray: ...


class PolicyMetrics(Protocol):
    """`metrics(state, pool) -> dict[str, float]`: scalars for a logger (optional hook)."""

    def __call__(self, state: Any, pool: Pool, /) -> dict: ...


class PolicyCheckState(Protocol):
    """`check_state(state, pool) -> None`: raise a ValueError naming the field when a restored
    state breaks a rule only this policy knows (optional hook)."""

    def __call__(self, state: Any, pool: Pool, /) -> None: ...


class PolicyUpdateLosses(Protocol):
    """`update_losses(state, pool, losses) -> state`: learn from held-out loss points
    (`LossFeedback`: int64[M] `domains`, float64[M] `tokens`, float64[M] `losses`) (optional hook)."""

    def __call__(self, state: Any, pool: Pool, losses: LossFeedback, /) -> Any: ...


class PolicyDecisions(Protocol):
    """`decisions(state, pool, batch) -> list[dict]`: the per-prompt supervision decisions the
    last `update` made, each `{"row", "rule", "evidence", "decision"}` (optional hook)."""

    def __call__(self, state: Any, pool: Pool, batch: Batch, /) -> list: ...


#: kind -> the protocol its `apply` follows.
APPLY_PROTOCOLS: dict[str, type] = {
    "mixture": MixtureApply, "selection": SelectionApply, "admission": AdmissionApply,
    "reweighting": ReweightingApply, "target": TargetApply, "reward": RewardApply,
    "advantage": AdvantageApply, "allocation": AllocationApply,
}
_HOOKS = (("init", PolicyInit), ("update", PolicyUpdate), ("metrics", PolicyMetrics),
          ("check_state", PolicyCheckState), ("update_losses", PolicyUpdateLosses),
          ("decisions", PolicyDecisions))


# protocol -> (its positional parameters, the signature its docstring opens with), computed once
_EXPECTED = {p: (list(inspect.signature(p.__call__).parameters)[1:], str(p.__doc__).split("`")[1])
             for p in (*APPLY_PROTOCOLS.values(), *(h for _, h in _HOOKS))}


def check_signatures(policy) -> None:
    """Raise `InputError` unless `policy.kind` is a known kind and each of its functions can be
    called with the positional arguments of its protocol (extra parameters must be
    keyword-only with a default). A callable without an introspectable signature passes."""
    protocol = APPLY_PROTOCOLS.get(policy.kind)
    if protocol is None:
        raise InputError(f"DataPolicy {policy.name!r}: kind must be one of {tuple(APPLY_PROTOCOLS)}; "
                         f"got {policy.kind!r}.")
    for field, proto in (*_HOOKS, ("apply", protocol)):
        fn: Callable | None = getattr(policy, field)
        if fn is None and field not in ("init", "update", "apply"):
            continue
        params, signature = _EXPECTED[proto]
        expected = f"{signature} (rlpace.policies.{proto.__name__})"
        if not callable(fn):
            raise InputError(f"{policy.kind} policy {policy.name!r}: {field} must be a function "
                             f"{expected}; got {type(fn).__name__}.")
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):          # some builtins: nothing to check
            continue
        try:
            sig.bind(*params)
        except TypeError:
            name = getattr(fn, "__qualname__", type(fn).__name__)
            raise InputError(f"{policy.kind} policy {policy.name!r}: {field} = {name}{sig} cannot be "
                             f"called as {expected}: a {policy.kind} policy's {field} takes "
                             f"{len(params)} positional arguments; any other parameter must be "
                             f"keyword-only with a default.") from None
