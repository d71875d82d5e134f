"""DataFlex-RL `reward_gap`: tilt the domain mixture towards domains with lower reward.

Liang, Chen, Feng, Qiang, Zhang, "DataFlex-RL: An Evaluation Platform for RLVR Data
Policies", arXiv 2609.06107, configuration 11 (docs/methods/reward_gap.md), read from
`haolpku/DataFlex-RL` (`mixers.py::RewardGapMixer`, `DomainStatsTracker`, and
`trainer.py::DataFlexMixSyncTrainer._compute_advantage`). After every step:

    r̄_d = mean reward of the last `window` rollouts of domain d   (0 while d has none)
    p   = softmax((max_d r̄ − r̄_d) / T)
    p'  = (1 − K·floor)·p + floor

and each prompt slot draws its domain from p' (`uniform_within_arm`). Defaults are
DataFlex's: T = 1, floor = 0.05, window = 50.

What "window 50" counts. DataFlex's tracker is a `deque(maxlen=50)` per domain, and the
trainer appends one value per *rollout* (each sequence's summed `rm_scores`, i.e. its
reward), so the window is the last 50 rollouts of each domain — not 50 steps. It is
refreshed every step from step 1 on (warm-up 1, update_step 1), so our lazy `apply`
after each `update` matches. A domain with no rollout yet has r̄ = 0 (the tracker's
`mean(default=0.0)`): with rewards ≥ 0 it counts as the least solved domain and gets
the largest share until it is seen. Before any feedback every r̄ is 0 and p is uniform,
DataFlex's starting proportions.

Deviations:
  * Floor. DataFlex clips and renormalises, p' = max(p, floor) / Σ max(p, floor), which
    can leave a domain below `floor` (p = [0.98, 0.01, 0.01] gives 0.046 for the small
    ones). Our default mixes with the uniform distribution as `dump` and `with_floor`
    do, so every domain keeps at least `floor` (the contract suite checks it);
    `floor_rule="clip"` reproduces DataFlex's rule exactly.
  * DataFlex applies the proportions through `DataFlexMixReplayBuffer`, which picks
    prompts from those already buffered and tops up oldest-first, so its achievable
    shift is bounded by the buffer. We draw each slot's domain i.i.d. from p'.
  * DataFlex takes T as max(T, 1e-6); we require T > 0.
  * Rewards are clipped to ±1e100 before they enter the window (`_checks.py`), so the
    window means of any finite rewards stay finite; real rewards are never near it.
"""

from __future__ import annotations

from ..errors import InputError
from typing import NamedTuple

import numpy as np

from ..stats._window import Window, window_init, window_mean, window_push
from ._base import MIXTURE, DataPolicy, softmax
from ._checks import check_choice, check_int, check_real, clip_signal, shifted

__all__ = ["reward_gap", "apply_floor"]

FLOOR_RULES = ("mix", "clip")


class RewardGapState(NamedTuple):
    window: Window  # float64[K, W] ring buffer of each arm's last W rollout rewards


def check_mixer_args(method: str, temperature: float, floor: float, window: int,
                     floor_rule: str, arms: str) -> None:
    """ValueError naming the argument and the fix, for the DataFlex mixers' shared arguments."""
    check_real(method, "temperature", temperature, low=0, low_open=True, hint=" (DataFlex: 1.0)")
    check_real(method, "floor", floor, low=0, high=1, high_open=True, hint=" (DataFlex: 0.05)")
    check_int(method, "window", window, hint=" (DataFlex: 50)")
    check_choice(method, "floor_rule", floor_rule, FLOOR_RULES)
    check_choice(method, "arms", arms, ("domain", "cluster"))


def check_floor_feasible(method: str, floor: float, k: int) -> None:
    if floor * k > 1.0 + 1e-12:
        raise InputError(f"{method} floor={floor} is infeasible for {k} arms (needs floor ≤ 1/{k}); "
                         f"lower the floor.")


def apply_floor(p: np.ndarray, floor: float, rule: str) -> np.ndarray:
    """Bound a distribution away from 0.

    "mix":  p' = (1 − K·floor)·p + floor — every arm ≥ floor, order of p kept.
    "clip": p' = max(p, floor) / Σ max(p, floor) — DataFlex-RL's mixers; an arm may end
            slightly below floor after renormalising.

    >>> apply_floor(np.array([0.98, 0.01, 0.01]), 0.05, "mix").round(4).tolist()
    [0.883, 0.0585, 0.0585]
    >>> apply_floor(np.array([0.98, 0.01, 0.01]), 0.05, "clip").round(4).tolist()
    [0.9074, 0.0463, 0.0463]
    """
    if rule == "clip":
        q = np.maximum(p, floor)
        return q / q.sum()
    return (1.0 - p.shape[0] * floor) * p + floor


def reward_gap(temperature: float = 1.0, floor: float = 0.05, window: int = 50,
               floor_rule: str = "mix", arms: str = "domain") -> DataPolicy:
    """DataFlex-RL's reward-gap mixture: softmax over arms of (best windowed mean reward − own) / `temperature`.

    DataFlex-RL (arXiv 2609.06107) configuration 11; rule in the module docstring and
    docs/methods/reward_gap.md.

    Args:
        temperature: softmax temperature T (DataFlex: 1.0). With rewards in [0, 1] the
            largest probability ratio between two domains is e^(1/T) ≈ 2.7 at T = 1: a
            gentle tilt.
        floor: minimum share per arm (DataFlex: 0.05); needs K·floor ≤ 1.
        window: rollouts kept per arm (DataFlex: 50).
        floor_rule: "mix" (default, every arm ≥ floor) or "clip" (DataFlex's code).
        arms: "domain" (DataFlex's domains) or "cluster".

    Example (hand-computed): domain 0's rollouts scored [1, 1, 1, 0] and domain 1's
    [0, 0, 1, 0]: r̄ = [0.75, 0.25], gaps [0, 0.5], p = softmax([0, 0.5]) =
    [0.377541, 0.622459], and with floor 0.05: p' = 0.9·p + 0.05 = [0.389787, 0.610213].

    >>> from rlpace import Pool, Feedback; from rlpace.types import Batch
    >>> pool = Pool(["a", "b"]); m = reward_gap()
    >>> b = Batch.from_feedback(Feedback([0, 1], [[1, 1, 1, 0], [0, 0, 1, 0]], step=0), pool, 0.5)
    >>> m.apply(m.update(m.init(pool), pool, b), pool).round(6).tolist()
    [0.389787, 0.610213]
    """
    check_mixer_args("reward_gap", temperature, floor, window, floor_rule, arms)

    def init(pool):
        k = pool.n_arms(arms)
        check_floor_feasible("reward_gap", floor, k)
        return RewardGapState(window_init(k, int(window)))

    def update(state, pool, batch):
        if batch.prompt_ids.size == 0:
            return state
        arm = pool.arm_codes(arms)[batch.prompt_ids]              # [B]
        # [B, G] rows with one arm each: pushed row by row, rollouts in column order —
        # DataFlex's `for d, r in zip(domains_per_row, per_seq)` over a prompt-major batch.
        window_push(state.window, arm, clip_signal(batch.rewards))  # ±1e100: means stay finite
        return state

    def apply(state, pool, *_):
        mean = window_mean(state.window, empty=0.0)                # [K] r̄, 0 for unseen arms
        p = softmax(shifted(mean.max() - mean), temperature)
        return apply_floor(p, floor, floor_rule)

    def metrics(state, pool):
        mean = window_mean(state.window, empty=0.0)
        return {"reward_gap/max_gap": float(mean.max() - mean.min())}

    return DataPolicy(MIXTURE, init, update, apply, arms=arms, name="reward_gap", metrics=metrics)
