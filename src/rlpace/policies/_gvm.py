"""GVM-RAFT's rollout allocation (Yao et al. 2025, arXiv 2505.02391; public code `RLHFlow/GVM`,
`em/stage_2_calc_sample_size.py::calc_sample_ratio` and `float_to_int_preserve_sum`).
Method page: docs/methods/gvm.md.

The reference minimises the variance of the gradient estimate for a fixed sample budget and
gets, per prompt, s_i = ‖g_i‖ / sqrt(p_i + α / p_i^(β − 1)) (0 when ‖g_i‖ = 0 or p_i = 0),
normalised to sum 1, n_i = round(s_i · budget) with the rounding error fixed on the largest
residuals. There, p_i is the acceptance rate of 8 stage-1 samples and ‖g_i‖ a per-prompt
gradient norm.

Here, as a step-to-step rule in the allocation place:
* p_i is the pass rate of the prompt's latest visit and ‖g_i‖ the norm of its summed
  gradient feature `Σ_j Feedback.grads[i, j]` on that visit, where the trainer provides
  gradient features (`reads = {"grads"}`); without them ‖g_i‖ is replaced by
  sqrt(p_i(1 − p_i)), the reward std that scales a binary GRPO group's gradient — our
  choice, not the reference's (which always has gradient norms).
* Bounds: every prompt gets `min_n`, the rest of the budget ∝ s_i within `max_n` (largest
  remainders, ties by batch order); unseen prompts count as s = the mean s of the seen ones
  in the batch (1 when none is seen), so the first step is uniform.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..errors import InputError
from ._base import ALLOCATION, DataPolicy
from ._checks import check_real
from ._knapsack import _check_bounds, _spread

__all__ = ["GVMState", "gvm", "gvm_scores", "proportional_allocation"]


class GVMState(NamedTuple):
    pass_rate: np.ndarray   # float64[N] latest visit's pass rate; NaN = never seen
    grad_norm: np.ndarray   # float64[N] latest ‖Σ_j grads[i, j]‖; NaN = never measured


def gvm_scores(p: np.ndarray, g: np.ndarray, alpha: float = 1e-3, beta: float = 2.0) -> np.ndarray:
    """s = g / sqrt(p + α / p^(β − 1)), 0 where p = 0 or g = 0 (GVM-RAFT's `calc_sample_ratio`)."""
    p = np.asarray(p, dtype=np.float64)
    g = np.asarray(g, dtype=np.float64)
    safe = np.where(p > 0, p, 1.0)
    s = g / np.sqrt(safe + alpha / safe ** (beta - 1.0))
    return np.where((p > 0) & (g > 0), s, 0.0)


def proportional_allocation(scores: np.ndarray, budget: int, min_n: int, max_n: int) -> np.ndarray:
    """int64[B]: min_n each, the rest ∝ scores (largest remainders, ties by position), within
    max_n; an all-zero score vector spreads the rest evenly. Σ = budget."""
    b = scores.shape[0]
    alloc = np.full(b, min_n, np.int64)
    rest = budget - b * min_n
    total = float(scores.sum())
    if rest > 0 and total > 0:
        share = scores / total * rest
        base = np.minimum(np.floor(share).astype(np.int64), max_n - min_n)
        alloc += base
        left = rest - int(base.sum())
        frac = np.where(alloc < max_n, share - np.floor(share), -1.0)
        order = np.argsort(-frac, kind="stable")
        rest = _spread(alloc, left, [order[:left], order], max_n) if left else 0
    if rest > 0:
        _spread(alloc, rest, [np.arange(b)], max_n)
    return alloc


def gvm(min_n: int = 2, max_n: int = 128, alpha: float = 1e-3, beta: float = 2.0) -> DataPolicy:
    """GVM-RAFT (arXiv 2505.02391; docs/methods/gvm.md): n_i ∝ ‖g_i‖ / sqrt(p_i + α/p_i^(β−1)).

    An allocation policy: min_n rollouts each, the rest of the budget in proportion to s_i
    (within max_n). p_i and ‖g_i‖ come from the prompt's latest visit (‖g_i‖ from
    `Feedback.grads` where the trainer computes gradient features, else sqrt(p(1 − p))).
    Reference defaults α = 1e-3, β = 2.

    >>> import numpy as np; from rlpace import Pool, Feedback, Scheduler
    >>> s = Scheduler(Pool(["a"] * 3), "gvm", max_n=16)
    >>> s.observe(Feedback([0, 1, 2], [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]], step=0))
    >>> s.allocate(np.array([0, 1, 2]), 24).tolist()   # s = .433/√.254, .5/√.502, 0 → 9.88, 8.12 of 18
    [12, 10, 2]
    """
    _check_bounds(min_n, max_n, None, None, owner="gvm")
    alpha = check_real("gvm", "alpha", alpha, low=0, hint=" (reference 1e-3)")
    beta = check_real("gvm", "beta", beta, hint=" (reference 2.0)")

    def init(pool):
        n = len(pool)
        return GVMState(np.full(n, np.nan), np.full(n, np.nan))

    def update(state, pool, batch):
        ids = batch.prompt_ids
        if ids.size == 0:
            return state
        rev = ids[::-1]                                 # latest group wins within a batch
        uniq, first = np.unique(rev, return_index=True)
        rows = ids.shape[0] - 1 - first
        state.pass_rate[uniq] = batch.pass_rate[rows]
        if batch.grads is not None:
            # float64 sums of the float32 features without a float64 copy of [B, G, d] first
            g = np.linalg.norm(batch.grads.sum(axis=1, dtype=np.float64), axis=1)   # [B]
            state.grad_norm[uniq] = g[rows]
        return state

    def apply(state, pool, ids, budget):
        p = state.pass_rate[ids]
        g = state.grad_norm[ids]
        seen = ~np.isnan(p)
        g = np.where(np.isnan(g), np.sqrt(np.where(seen, p * (1 - p), 0.0)), g)
        s = gvm_scores(np.where(seen, p, 0.0), g, alpha, beta)
        fill = float(s[seen].mean()) if seen.any() and s[seen].sum() > 0 else 1.0
        s = np.where(seen, s, fill)
        return proportional_allocation(s, budget, min_n, max_n)

    return DataPolicy(ALLOCATION, init, update, apply, name="gvm", reads=frozenset({"grads"}),
                      bounds=(int(min_n), int(max_n)))
