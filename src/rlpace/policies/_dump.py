"""DUMP: distribution-level UCB on the expected absolute advantage.

Wang, Cui, Li, Wan, Zhao. "DUMP: Automated Distribution-Level Curriculum Learning for
RL-based LLM Post-training", arXiv 2504.09710, checked against `ZhentingWang/DUMP`
`verl/utils/curriculum_learning.py`; docs/methods/dump.md.

For each distribution (arm) d, keep the |A| of its last `window` rollouts and the count
n_d of rollouts ever seen (cumulative, never windowed). After every update:

    N       = max(1, Σ_d n_d)
    score_d = mean_window(|A|)_d + c · sqrt(2 ln(N + 1) / (n_d + 1))
    p       = softmax(score / T)                        # T = 0.1, max-subtracted

and each prompt slot draws its source from p (`uniform_within_arm`). Defaults follow the
code: window 300 rollouts, c = 1, T = 0.1, no floor.

Deviations and options:
  * Validation data never enters the window: DUMP's code pushes one validation entry per
    source (with rewards standing in for advantages); we only see training `Feedback`.
  * `window_unit` may be "rollouts" (the code), "prompts" (one entry per group: the
    group's mean |A|) or "steps" (one entry per arm per update: the batch mean).
  * `counting` may be "cumulative" (the code) or "windowed" (n_d = entries in the window,
    a sliding-window UCB for non-stationary arms).
  * `floor` mixes in the uniform distribution: p' = (1 − K·floor)·p + floor.
  * |A| is clipped to 1e100 before it enters the window, so a window mean of finite
    advantages cannot overflow (no real advantage comes near; `_checks.py`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..stats._window import Window, window_init, window_mean, window_push
from ._base import MIXTURE, DataPolicy, shifted_softmax, softmax_of_floats, with_floor
from ..types import rollout_abs_advantages
from ._checks import check_choice, check_int, check_real
from ._sec import arm_batch_reads


class DumpState(NamedTuple):
    window: Window     # |A| entries per arm, float64[K, W] ring buffer
    count: np.ndarray  # int64[K] entries ever pushed per arm (cumulative)
    #: value rules `Scheduler.load_state_dict` checks for each field (policies/_state_checks.py)
    STATE_RULES = {"count": "nonneg"}


def dump_ucb(temperature: float = 0.1, c: float = 1.0, window: int = 300,
             window_unit: str = "rollouts", counting: str = "cumulative",
             floor: float = 0.0, arms: str = "domain", base: str = "arms") -> DataPolicy:
    """DUMP (arXiv 2504.09710): softmax over arms of windowed mean |A| plus a UCB bonus, at `temperature`.

    See the module docstring for the rule and docs/methods/dump.md.

    Args:
        temperature: softmax temperature T (DUMP: 0.1).
        c: exploration weight (DUMP: 1.0).
        window: entries kept per arm (DUMP: 300).
        window_unit: "rollouts" | "prompts" | "steps" — what one window entry is.
        counting: "cumulative" | "windowed" — n_d in the bonus.
        floor: minimum probability per arm (0 = none, as in DUMP).
        arms: "domain" (DUMP's data_source) or "cluster".
        base: the softmax's base measure — "arms" (DUMP: p ∝ exp(score/T)) or "pool"
            (p ∝ s_d·exp(score/T), s_d = the arm's share of the pool's prompts, so equal
            scores give uniform-over-prompts shares and a small arm must score T·ln(s_e/s_d)
            higher than a large arm e to be drawn as often).

    Example (hand-computed): two arms, arm 0 saw 4 rollouts with |A| = 1, arm 1 none:
    N = 4, score = [1 + sqrt(2 ln 5 / 5), 0 + sqrt(2 ln 5 / 1)] = [1.802, 1.794],
    p = softmax(score / 0.1) = [0.520, 0.480].
    """
    check_real("dump", "temperature", temperature, low=0, low_open=True, hint=" (DUMP: 0.1)")
    check_real("dump", "c", c, low=0, hint=" (DUMP: 1.0)")
    check_int("dump", "window", window, hint=" (DUMP: 300)")
    check_choice("dump", "window_unit", window_unit, ("rollouts", "prompts", "steps"))
    check_choice("dump", "counting", counting, ("cumulative", "windowed"))
    check_real("dump", "floor", floor, low=0, high=1, high_open=True)
    check_choice("dump", "arms", arms, ("domain", "cluster"))
    check_choice("dump", "base", base, ("arms", "pool"))

    def init(pool):
        k = pool.n_arms(arms)
        return DumpState(window_init(k, window), np.zeros(k, dtype=np.int64))

    def update(state, pool, batch):
        if batch.prompt_ids.size == 0:
            return state
        abs_adv = rollout_abs_advantages(batch)                   # [B, G], ≤ 1e100 (_checks.py)
        arm = batch.domains if arms == "domain" else batch.clusters   # [B] (gathered once per step)
        if window_unit == "rollouts":
            # [B, G] with one arm per row: window_push keeps row order then column order,
            # i.e. rollouts in arrival order, sorting B rows instead of B·G values.
            rows = np.bincount(arm, minlength=state.count.shape[0])   # groups per arm, counted once
            window_push(state.window, arm, abs_adv, rows=rows)
            state.count[:] += rows * abs_adv.shape[1]
            return state
        elif window_unit == "prompts":
            a, v = arm, abs_adv.mean(axis=1)
        else:                                                     # one entry per arm per step
            k = state.count.shape[0]
            tot = np.bincount(arm, weights=abs_adv.mean(axis=1), minlength=k)
            cnt = np.bincount(arm, minlength=k)
            a = np.flatnonzero(cnt)
            v = tot[a] / cnt[a]
        window_push(state.window, a, v)
        state.count[:] += np.bincount(a, minlength=state.count.shape[0])
        return state

    def apply(state, pool, *_):
        z = _ucb_softmax(state, None if base == "arms" else _log_share(pool))
        if z is not None:
            return z
        mu = window_mean(state.window)                            # the rule as array lines
        n = state.count if counting == "cumulative" else state.window.filled
        total = max(1, int(n.sum()))
        score = mu + c * np.sqrt(2.0 * np.log(total + 1) / (n + 1))
        if base == "pool":        # tilt the pool's shares: p ∝ s·exp(score/T); an empty arm gets 0
            with np.errstate(divide="ignore"):
                score = score + temperature * np.log(pool.arm_share(arms))
        return shifted_softmax(score, temperature)

    def _log_share(pool):
        """log of the pool's arm shares (−inf for an empty arm) as Python floats: numpy's own
        log, taken once per pool instead of at every proposal."""
        key = ("dump/log_share", arms)
        if key not in pool._cache:
            with np.errstate(divide="ignore"):
                pool._cache[key] = np.log(pool.arm_share(arms)).tolist()
        return pool._cache[key]

    def _ucb_softmax(state, log_share=None):
        """`apply`: the lines below for K scores, the K-sized arithmetic in Python floats (+, −,
        ×, ÷ and sqrt round as numpy's do, bit for bit); the row sums, the log and the exp stay
        numpy's own calls on the same values (their results may differ from the math module's
        in the last bit). `log_share` (base="pool") adds T·log s_k to each score, as the array
        lines do. None when the largest score is not finite (the array lines handle it)."""
        win = state.window
        sums = win.values.sum(axis=1).tolist()                    # window_mean's row sums
        filled = win.filled.tolist()
        n = state.count.tolist() if counting == "cumulative" else filled
        lg = float(2.0 * np.log(max(1, sum(n)) + 1))
        score = [(s / f if f > 0 else 0.0) + c * math.sqrt(lg / (m + 1)) for s, f, m in zip(sums, filled, n)]
        if log_share is not None:
            score = [x + temperature * ls for x, ls in zip(score, log_share)]
        if not math.isfinite(max(score)):                         # finite: |A| ≤ 1e100, counts < 2**53
            return None
        return softmax_of_floats(score, temperature)              # shifted_softmax, from here on

    def metrics(state, pool):
        return {"dump/total_count": float(state.count.sum())}

    # update reads only |A| per rollout (and the clusters when they are the arms): `observe`
    # builds only these (`DataPolicy.batch_reads`), |A| without the signed advantages
    p = DataPolicy(MIXTURE, init, update, apply, arms=arms, name="dump", metrics=metrics,
                   batch_reads=arm_batch_reads(arms, "abs_advantages"))
    # the floor is `with_floor`'s (one rule, checked for feasibility when the Scheduler is built);
    # the name stays "dump": the floor is one of dump's recorded hyperparameters
    return with_floor(p, floor)._replace(name="dump") if floor else p
