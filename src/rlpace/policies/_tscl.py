"""DataFlex-RL `tscl`: sample domains by learning progress, |slope| of their reward curve.

Liang, Chen, Feng, Qiang, Zhang, "DataFlex-RL: An Evaluation Platform for RLVR Data
Policies", arXiv 2609.06107, configuration 13 (docs/methods/tscl.md; `TSCLMixer` in
`haolpku/DataFlex-RL` `mixers.py`), after Matiisen, Oliver, Cohen, Schulman,
"Teacher-Student Curriculum Learning", arXiv 1707.00183 (the "Window" teacher: the
slope of a linear regression of each task's recent scores on the time they were
obtained). After every non-empty update, for each arm d present in the batch:

    y_d(t) = mean reward of d's rollouts in the step-t batch      (one entry per step)

and the last `window` entries (y, t) of each arm give

    slope_d = Σ (t − t̄)(y − ȳ) / Σ (t − t̄)²      (least squares; 0 with < 2 distinct t)
    p       = softmax(|slope| / T)
    p'      = (1 − K·floor)·p + floor

Defaults are DataFlex's: T = 1, floor = 0.05, window = 50 (here: 50 steps in which the
arm appeared). t is `Feedback.step`, so late or repeated feedback sits at its own step;
a trainer that leaves every step at 0 gets slope 0 and a uniform mixture, and tscl
warns once (UserWarning) when an arm's last min(window, 8) entries share one step.

This is the *intended* rule (the `TSCLMixer` docstring). The July 2026 code snapshot
(commit `f4d305be`) never computes slopes: its trainer hands every mixer the windowed
mean reward, so `tscl` ran as softmax(|mean reward| / T) — identical to its `dump_ucb` whenever all means are ≥ 0.
We do not reproduce that degenerate rule. The snapshot's unused
`DomainStatsTracker.slope` regresses on the rollout index inside the 50-rollout buffer;
with ≥ 50 rollouts of a domain per step that spans less than one step and measures
within-batch order, not progress, so we regress per-step means on the step instead, as
TSCL does.

Scale. The slope is in reward per step: a domain climbing from 0.2 to 0.8 over 300 steps
has |slope| = 0.002, so at T = 1 its probability is e^0.002 ≈ 1.002 times that of a
flat domain: the mixture stays practically uniform. T = 1 is DataFlex's value, kept as
the default; a real curriculum needs T of the slopes' order (~1e-3).

Deviations shared with `reward_gap` (see `_reward_gap.py`): the floor mixes with the
uniform distribution by default (`floor_rule="clip"` is DataFlex's clip-and-renormalise),
and domains are drawn i.i.d. per slot rather than through DataFlex's replay buffer.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import numpy as np

from ._base import MIXTURE, DataPolicy, softmax
from ._checks import check_int, clip_signal, shifted
from ._reward_gap import apply_floor, check_floor_feasible, check_mixer_args
from ._state_checks import check_ring

__all__ = ["tscl", "windowed_slopes"]

_SAME_STEP_ENTRIES = 8   # entries of one arm at a single step before tscl warns


class TsclState(NamedTuple):
    reward: np.ndarray  # float64[K, W] ring buffer: mean reward of the arm's rollouts at one step
    step: np.ndarray    # int64[K, W]   Feedback.step of the same slot
    cursor: np.ndarray  # int64[K] next slot to write per arm
    filled: np.ndarray  # int64[K] valid slots per arm (≤ W); slots [0, filled) are valid
    #: value rules `Scheduler.load_state_dict` checks for each field (policies/_state_checks.py)
    STATE_RULES = {"step": "nonneg"}

    def check_values(self, key: str, pool) -> None:
        """The ring's cursor and fill inside the window (restored state)."""
        check_ring(key, self)


def windowed_slopes(reward: np.ndarray, step: np.ndarray, filled: np.ndarray) -> np.ndarray:
    """float64[K] least-squares slope of reward on step over each row's first `filled`
    slots (ring order does not matter to a regression); 0 where a row has fewer than two
    entries or all its entries share one step.

    >>> windowed_slopes(np.array([[0.2, 0.4, 0.9]]), np.array([[1, 2, 3]]), np.array([3])).round(6).tolist()
    [0.35]
    """
    k, w = reward.shape
    valid = np.arange(w) < filled[:, None]                        # [K, W]
    n = np.maximum(filled, 1)
    x = step.astype(np.float64)
    # Centre on the row means before the products: steps reach 10⁵–10⁶, and the
    # uncentred Σx² − n·x̄² form would lose the slope to cancellation.
    dx = np.where(valid, x - (np.where(valid, x, 0.0).sum(axis=1) / n)[:, None], 0.0)
    dy = np.where(valid, reward - (np.where(valid, reward, 0.0).sum(axis=1) / n)[:, None], 0.0)
    sxx = (dx * dx).sum(axis=1)
    sxy = (dx * dy).sum(axis=1)
    ok = (filled >= 2) & (sxx > 0)
    return np.where(ok, sxy / np.where(ok, sxx, 1.0), 0.0)


def tscl(temperature: float = 1.0, floor: float = 0.05, window: int = 50,
         floor_rule: str = "mix", arms: str = "domain") -> DataPolicy:
    """DataFlex-RL's TSCL mixture: softmax over arms of the |slope| of each arm's per-step mean reward.

    TSCL (arXiv 1707.00183) as DataFlex-RL (arXiv 2609.06107, configuration 13) intended
    it; docs/methods/tscl.md.

    Args:
        temperature: softmax temperature T on |slope| (DataFlex: 1.0; see "Scale" in the
            module docstring: at T = 1 the mixture is nearly uniform).
        floor: minimum share per arm (DataFlex: 0.05); needs K·floor ≤ 1.
        window: per-step entries kept per arm, ≥ 2 (DataFlex: 50).
        floor_rule: "mix" (default, every arm ≥ floor) or "clip" (DataFlex's code).
        arms: "domain" (DataFlex's domains) or "cluster".

    Example (hand-computed): domain 0's step means are 0.2, 0.4, 0.9 at steps 1, 2, 3
    (slope 0.35), domain 1's are 0.5 at every step (slope 0). With T = 0.1:
    p = softmax([3.5, 0]) = [0.970688, 0.029312] and with floor 0.05,
    p' = 0.9·p + 0.05 = [0.923619, 0.076381].
    """
    check_mixer_args("tscl", temperature, floor, window, floor_rule, arms)
    check_int("tscl", "window", window, low=2, hint=" (a slope needs two steps; DataFlex: 50)")
    same_step_entries = max(2, min(int(window), _SAME_STEP_ENTRIES))
    warned = [False]                                               # once per policy instance

    def warn_if_one_step(state, a):
        # Slopes are regressions on Feedback.step: a trainer that never sets it (default 0)
        # gets slope 0 everywhere and a uniform mixture. Say so once, with the fix.
        full = a[state.filled[a] >= same_step_entries]
        if full.size == 0:
            return
        steps = state.step[full]
        valid = np.arange(steps.shape[1]) < state.filled[full][:, None]
        hi = np.where(valid, steps, np.iinfo(np.int64).min).max(axis=1)
        lo = np.where(valid, steps, np.iinfo(np.int64).max).min(axis=1)
        one = np.flatnonzero(hi == lo)
        if one.size:
            warned[0] = True
            warnings.warn(
                f"tscl: the last {int(state.filled[full[one[0]]])} feedback batches of arm "
                f"{int(full[one[0]])} all carry step={int(hi[one[0]])}, so its reward slope is 0 and "
                f"tscl falls back to a uniform mixture. Pass the trainer step with each batch: "
                f"Feedback(..., step=<trainer step>).", UserWarning, stacklevel=4)

    def init(pool):
        k = pool.n_arms(arms)
        check_floor_feasible("tscl", floor, k)
        w = int(window)
        return TsclState(np.zeros((k, w)), np.zeros((k, w), dtype=np.int64),
                         np.zeros(k, dtype=np.int64), np.zeros(k, dtype=np.int64))

    def update(state, pool, batch):
        if batch.prompt_ids.size == 0:
            return state
        k, w = state.reward.shape
        arm = pool.arm_codes(arms)[batch.prompt_ids]               # [B]
        total = np.bincount(arm, weights=clip_signal(batch.rewards).sum(axis=1), minlength=k)
        count = np.bincount(arm, minlength=k) * batch.rewards.shape[1]
        a = np.flatnonzero(count)                                 # arms present, each once
        slot = state.cursor[a]
        state.reward[a, slot] = total[a] / count[a]                # y_d(t): all d's rollouts this step
        state.step[a, slot] = batch.step
        state.cursor[a] = (slot + 1) % w
        state.filled[a] = np.minimum(state.filled[a] + 1, w)
        if not warned[0]:
            warn_if_one_step(state, a)
        return state

    def apply(state, pool, *_):
        slope = windowed_slopes(state.reward, state.step, state.filled)
        p = softmax(shifted(np.abs(slope)), temperature)
        return apply_floor(p, floor, floor_rule)

    def metrics(state, pool):
        slope = windowed_slopes(state.reward, state.step, state.filled)
        return {"tscl/max_abs_slope": float(np.abs(slope).max())}

    return DataPolicy(MIXTURE, init, update, apply, arms=arms, name="tscl", metrics=metrics)
