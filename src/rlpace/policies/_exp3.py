"""ODM: EXP3 over domains with a decaying exploration rate.

Albalak, Pan, Raffel, Wang, "Efficient Online Data Mixing For Language Model
Pre-Training", arXiv 2312.02406, from `alon-albalak/online-data-mixing` `megatron/data/data_sampling_utils.py`
(`Exp3WeightUpdater.update`). At update t = 1, 2, ... (ε_0 = 1/K):

    R̂_i += (r_i / scale) / π_i                 for arms i present in the batch
    ε_t  = min(1/K, sqrt(ln K / (K·t)))
    w_i  = exp(ε_{t−1}·R̂_i)·(1 − K·ε_t) / Σ_j exp(ε_{t−1}·R̂_j) + ε_t
    π    = w / Σ w

RLVR adaptation (ours; docs/methods/exp3.md): ODM's reward is a domain's training loss; ours is the
domain's learnability in this batch, r_i = mean over its groups of the group's mean |A|
(the same signal as SEC and DUMP). π_i in the importance weight is the distribution the
batch was proposed from (the current state's π, which only `update` changes).

Notes: ε_t = 1/K — and so π uniform — for the first t ≤ K·ln K updates, as in the code.
The exponent is max-subtracted (a softmax), which leaves w unchanged but cannot
overflow; R̂ is capped at 1e300 and |A| at 1e100 (`_checks.py`), so any finite
advantages and any scale > 0 keep the state finite. t counts our updates; ODM uses the
trainer iteration (equal when it updates every step without warm-up).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np

from ._base import MIXTURE, DataPolicy, softmax_of_floats
from ._checks import check_choice, check_real
from ._sec import arm_batch_reads, arm_mean_abs_advantage, arm_sums

__all__ = ["exp3"]

_REWARD_CAP = 1e300


@functools.lru_cache(maxsize=64)
def _log(k: int) -> float:
    """numpy's log of the arm count (the exploration rate's ln K), computed once per K."""
    return float(np.log(k))


class Exp3State(NamedTuple):
    reward: np.ndarray  # float64[K] importance-weighted cumulative reward R̂
    prob: np.ndarray    # float64[K] current distribution π
    eps: np.ndarray     # float64[] current exploration rate ε_t (ε_0 = 1/K)
    t: np.ndarray       # int64[] updates so far
    #: value rules `Scheduler.load_state_dict` checks for each field (policies/_state_checks.py)
    STATE_RULES = {"prob": "prob", "eps": "unit", "t": "nonneg"}


def exp3(scale: float = 10.0, arms: str = "domain") -> DataPolicy:
    """ODM's EXP3 mixture over arms (arXiv 2312.02406), rewarded by each arm's mean |A| over `scale`.

    See the module docstring for the rule and docs/methods/exp3.md.

    Args:
        scale: rewards are divided by this before importance weighting (the code's
            `reward / 10`).
        arms: "domain" or "cluster".

    Example (hand-computed, K = 2, scale = 10): update 1 with r = [1, –] (arm 1 absent)
    gives R̂ = [0.2, 0], ε_1 = min(1/2, sqrt(ln 2 / 2)) = 1/2, so π = [1/2, 1/2]; update 2
    with r = [1, 0.5] gives R̂ = [0.4, 0.1], ε_2 = sqrt(ln 2 / 4) = 0.416277, and with
    ε_1 = 1/2: w = softmax([0.2, 0.05])·(1 − 2·0.416277) + 0.416277 = [0.506267, 0.493733].
    """
    check_real("exp3", "scale", scale, low=0, low_open=True, hint=" (ODM: 10)")
    check_choice("exp3", "arms", arms, ("domain", "cluster"))

    def init(pool):
        k = pool.n_arms(arms)
        return Exp3State(np.zeros(k), np.full(k, 1.0 / k), np.array(1.0 / k), np.array(0, np.int64))

    def update(state, pool, batch):
        if batch.prompt_ids.size == 0:
            return state
        k = state.prob.shape[0]
        count, total = arm_sums(batch, arms, k)
        # R̂_i += ((total_i / count_i) / scale) / π_i where present (absent arms are skipped: no
        # 0 / 0 for an absent arm of a restored π_i = 0). r ≤ 1e100 (clipped), but a tiny
        # `scale` or π could still push R̂ past the float range: cap it where exp(ε·R̂) has long
        # saturated anyway (module docstring). The K-sized arithmetic in Python floats, which
        # round as numpy's arrays do (`arm_mean_abs_advantage` is the array form of r).
        prob = state.prob.tolist()
        if any(c and not p for c, p in zip(count, prob)):
            # a present arm of a restored π_i = 0: numpy's x / 0 (inf, or NaN for 0 / 0), as
            # the array rule gives it, where Python would raise
            r, present = arm_mean_abs_advantage(pool, batch, arms, k)
            gain = r / scale
            np.divide(gain, state.prob, out=gain, where=present)
            np.add(state.reward, gain, out=state.reward, where=present)
            np.minimum(state.reward, _REWARD_CAP, out=state.reward)
            reward = state.reward.tolist()
        else:
            reward = [min(x + t / c / scale / p if c else x, _REWARD_CAP)
                      for x, c, t, p in zip(state.reward.tolist(), count, total, prob)]
            state.reward[:] = reward
        t = int(state.t) + 1
        state.t[()] = t                                  # item write: ~10× cheaper than += on 0-d
        eps_prev = float(state.eps)
        eps = min(1.0 / k, math.sqrt(_log(k) / (k * t)))
        w = softmax_of_floats([x * eps_prev for x in reward], 1.0)
        w *= 1.0 - k * eps
        w += eps
        np.divide(w, w.sum(), out=state.prob)
        state.eps[...] = eps
        return state

    def apply(state, pool, *_):
        return state.prob.copy()

    def metrics(state, pool):
        return {"exp3/eps": float(state.eps)}

    return DataPolicy(MIXTURE, init, update, apply, arms=arms, name="exp3", metrics=metrics,
                      batch_reads=arm_batch_reads(arms))
