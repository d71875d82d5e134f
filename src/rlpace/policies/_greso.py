"""GRESO: skip, before rollout, prompts whose recent groups were all correct or all wrong.

Zheng, Zhou, Bartoldson, Kailkhura, Lai, Zhao, Chen, "Act Only When It Pays: Efficient
Reinforcement Learning for LLM Reasoning via Selective Rollouts", arXiv 2506.02177 —
docs/methods/greso.md; checked against `Infini-AI-Lab/GRESO`
(`verl/trainer/ttis/presampling_selector.py`, `filter_examples_all_probabilistic`).

State per prompt: the easy streak z_e (consecutive most recent groups with pass rate ≥
`easy_threshold`, 0.98: all correct) and the hard streak z_h (consecutive most recent groups
with pass rate ≤ `hard_threshold`, 0.11: all wrong). A candidate drawn from p is kept
("explored") with probability

    π_i = max(p_easy^{z_e}, min_explore)   if z_e > 0
          max(p_hard^{z_h}, min_explore)   elif z_h > 0
          1                                otherwise              (min_explore = 0.01)

After every observed batch, with target zero-variance rate t (0.25), targets t/3 (easy) and
2t/3 (hard) — more exploration on hard prompts:

    p_hard ← max(p_hard − step, p_min) if the batch's all-wrong share ≥ 2t/3 else min(p_hard + step, p_max)
    p_easy ← the same with the all-correct share and t/3          (step 0.01, p in [0.05, 0.95])

Skipped prompts. `apply` is pure, so the skips of one proposal are not state; `update`
estimates them without bias from the kept prompts' own π (for draws kept with probability
π_i, E[1/π_i over kept draws] = 1/(1 − skip rate), so Σ_i (1/π_i − 1) estimates the
candidates skipped for this batch) and logs the running total (`greso/skipped`).

Deviations: (1) streaks are two counters per prompt, not the reference's rescanned list of
(epoch, mean reward); the same streaks. (2) The reference tunes p only after epoch 0 and
fills the batch DAPO-style with an adaptive sampling batch; here p adapts from the first
batch, and filling is `dapo_dynamic_sampling`'s job (compose `greso+dapo_dynamic_sampling`).
(3) Success is reward ≥ the Scheduler's threshold (the reference: the group's mean reward).
(4) If after 126·n candidates fewer than n were kept, the rest are filled with skipped
candidates in draw order (the reference keeps fewer prompts).
"""

from __future__ import annotations

from ..errors import InputError
from typing import NamedTuple

import numpy as np

from ._base import SELECTION, DataPolicy
from ._checks import check_real
from ._uniform import uniform_within_arm

__all__ = ["greso", "greso_keep_prob"]

_STREAK_MAX = 2**30
_ROUNDS = 6                  # candidate rounds of 2n, 4n, ..., 64n


class GresoState(NamedTuple):
    easy_streak: np.ndarray  # int32[N] consecutive most recent all-correct groups
    hard_streak: np.ndarray  # int32[N] consecutive most recent all-wrong groups
    p_explore: np.ndarray    # float64[2] [p_easy, p_hard] bases of the keep probability
    last_ratio: np.ndarray   # float64[2] all-correct, all-wrong share of the last batch
    skipped: np.ndarray      # float64[2] [estimated candidates skipped in total, in the last batch]
    #: value rules `Scheduler.load_state_dict` checks for each field (policies/_state_checks.py)
    STATE_RULES = {"easy_streak": "nonneg", "hard_streak": "nonneg", "p_explore": "unit",
                   "last_ratio": "unit", "skipped": "nonneg"}


def greso_keep_prob(easy: np.ndarray, hard: np.ndarray, p_easy: float, p_hard: float,
                    min_explore: float = 0.01) -> np.ndarray:
    """float64[m] probability π of keeping each candidate (module docstring).

    >>> greso_keep_prob(np.array([0, 2, 0]), np.array([0, 0, 3]), 0.5, 0.5).tolist()
    [1.0, 0.25, 0.125]
    """
    e = np.asarray(easy, dtype=np.float64)
    h = np.asarray(hard, dtype=np.float64)
    pe = np.maximum(np.power(p_easy, e), min_explore)
    ph = np.maximum(np.power(p_hard, h), min_explore)
    return np.where(e > 0, pe, np.where(h > 0, ph, 1.0))


def greso(target_zero_variance: float = 0.25, p_init: float = 0.5, p_min: float = 0.05,
          p_max: float = 0.95, step_size: float = 0.01, easy_threshold: float = 0.98,
          hard_threshold: float = 0.11, min_explore: float = 0.01) -> DataPolicy:
    """GRESO (arXiv 2506.02177): skip prompts on a zero-variance streak with a probability tuned toward `target_zero_variance`.

    See the module docstring and docs/methods/greso.md.

    Args:
        target_zero_variance: t, the zero-variance share to aim for (`data.target_zero_variance`
            0.25); split t/3 all-correct, 2t/3 all-wrong.
        p_init: starting p_easy = p_hard (0.5).
        p_min, p_max: bounds of p (0.05, 0.95).
        step_size: change of p per batch (0.01).
        easy_threshold, hard_threshold: a group is all-correct when its pass rate is ≥ 0.98,
            all-wrong when ≤ 0.11.
        min_explore: the floor of the keep probability (0.01).

    Candidates come from p: uniform over the pool, or arm by arm from a composed mixture.
    Cost O(n) per proposal (rounds of 2n, 4n, ... candidates), O(B) per update; memory two
    int32 per prompt.

    Example (hand-computed): a prompt all-correct in its last 2 groups with p_easy = 0.5 is
    kept with probability max(0.5², 0.01) = 0.25; after a batch whose all-wrong share 0.25
    is ≥ 2·0.25/3, p_hard drops from 0.5 to 0.49.
    """
    o = "greso"
    check_real(o, "target_zero_variance", target_zero_variance, low=0, high=1,
               hint=" (GRESO: 0.25)")
    check_real(o, "p_init", p_init, low=0, high=1, hint=" (GRESO: 0.5)")
    check_real(o, "p_min", p_min, low=0, high=1, hint=" (GRESO: 0.05)")
    check_real(o, "p_max", p_max, low=0, high=1, hint=" (GRESO: 0.95)")
    if not p_min <= p_init <= p_max:
        raise InputError(f"greso needs p_min ≤ p_init ≤ p_max; got {p_min}, {p_init}, {p_max}.")
    check_real(o, "step_size", step_size, low=0, high=1, hint=" (GRESO: 0.01)")
    check_real(o, "easy_threshold", easy_threshold, low=0, high=1, hint=" (GRESO: 0.98)")
    check_real(o, "hard_threshold", hard_threshold, low=0, high=1, hint=" (GRESO: 0.11)")
    check_real(o, "min_explore", min_explore, low=0, high=1, low_open=True, hint=" (GRESO: 0.01)")
    targets = np.array([target_zero_variance / 3.0, 2.0 * target_zero_variance / 3.0])
    within = uniform_within_arm()

    def init(pool):
        n = len(pool)
        return GresoState(np.zeros(n, np.int32), np.zeros(n, np.int32), np.full(2, float(p_init)),
                          np.zeros(2), np.zeros(2))

    def keep_prob(state, ids):
        return greso_keep_prob(state.easy_streak[ids], state.hard_streak[ids], state.p_explore[0],
                               state.p_explore[1], min_explore)

    def update(state, pool, batch):
        ids = batch.prompt_ids
        b = ids.shape[0]
        if b == 0:
            return state
        # estimated skips behind this batch, from π at proposal time (before the streaks move)
        est = float((1.0 / keep_prob(state, ids) - 1.0).sum())
        easy = batch.pass_rate >= easy_threshold
        hard = (batch.pass_rate <= hard_threshold) & ~easy
        # Streaks, group by group in batch order; a prompt listed twice moves twice.
        order = np.argsort(ids, kind="stable")
        sid = ids[order]
        repeats = sid[1:] == sid[:-1]
        if not repeats.any():
            # Every prompt once (the usual batch): the loop below runs one round over every
            # group, and with distinct ids the order of the writes does not matter — the same
            # writes without the occurrence bookkeeping.
            for streak, hit in ((state.easy_streak, easy), (state.hard_streak, hard)):
                streak[ids] = np.where(hit, np.minimum(streak[ids] + 1, _STREAK_MAX), 0)
        else:
            first = np.concatenate(([True], ~repeats))
            occ = np.arange(b) - np.maximum.accumulate(np.where(first, np.arange(b), 0))
            for r in range(int(occ.max()) + 1):
                sel = order[occ == r]
                i = ids[sel]
                e, h = easy[sel], hard[sel]
                state.easy_streak[i] = np.where(e, np.minimum(state.easy_streak[i] + 1, _STREAK_MAX), 0)
                state.hard_streak[i] = np.where(h, np.minimum(state.hard_streak[i] + 1, _STREAK_MAX), 0)
        # the shares as bool means compute them: the float64 count over b (count_nonzero is
        # that exact integer; one IEEE division either way)
        ratio = np.array([np.count_nonzero(easy) / b, np.count_nonzero(hard) / b])
        step = np.where(ratio >= targets, -step_size, step_size)      # at/above target: skip more
        p = np.clip(state.p_explore + step, p_min, p_max)
        return state._replace(p_explore=p, last_ratio=ratio,
                              skipped=np.array([state.skipped[0] + est, est]))

    def apply(state, pool, n, probs, arms, rng):
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        size = len(pool)
        kept: list[np.ndarray] = []
        skipped: list[np.ndarray] = []
        have = 0
        for r in range(_ROUNDS):
            m = n << (r + 1)
            cand = (rng.integers(0, size, size=m, dtype=np.int64) if probs is None
                    else within.apply(None, pool, m, probs, arms, rng))
            keep = rng.random(m) < keep_prob(state, cand)
            kept.append(cand[keep])
            skipped.append(cand[~keep])
            have += int(keep.sum())
            if have >= n:
                break
        out = np.concatenate(kept)[:n]
        if out.shape[0] < n:
            out = np.concatenate([out, np.concatenate(skipped)[:n - out.shape[0]]])
        return out.astype(np.int64)

    def metrics(state, pool):
        out = {"greso/p_easy": float(state.p_explore[0]), "greso/p_hard": float(state.p_explore[1]),
               "greso/all_correct_share": float(state.last_ratio[0]),
               "greso/all_wrong_share": float(state.last_ratio[1]),
               "greso/skipped": float(state.skipped[0]), "greso/skipped_last": float(state.skipped[1])}
        if len(pool) <= 10**6:                  # O(N): skipped for very large pools
            all_ids = np.arange(len(pool))
            out["greso/skip_prob"] = float(1.0 - keep_prob(state, all_ids).mean())
        return out

    return DataPolicy(SELECTION, init, update, apply, name="greso", metrics=metrics,
                      follows_mixture=True)   # candidates drawn arm by arm ∝ the mixture
