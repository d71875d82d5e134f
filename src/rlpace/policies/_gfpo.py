"""`gfpo` — Group Filtered Policy Optimization (Shrivastava et al., "Sample More to Think
Less", arXiv 2508.09726; DataFlex-RL's `gfpo` configuration, docs/methods/gfpo.md).

GFPO samples a group and trains only on the k responses that score best on a filter metric,
computing the GRPO advantage over those k (the trainer does: advantages after admission are
recomputed on the kept rollouts, `rlpace.kept_group_advantages`). The metric is token
efficiency, reward / response length (DataFlex `metric=efficiency`, k = 3), or shortness.
Response lengths come from `Feedback.lengths`.
"""

from __future__ import annotations

import warnings

import numpy as np

from ._base import ADMISSION, Admission, DataPolicy, _empty_init, _no_update
from ._checks import check_choice, check_int

__all__ = ["gfpo"]


def gfpo(k: int = 3, metric: str = "efficiency") -> DataPolicy:
    """Keep the `k` rollouts of each group with the most reward per token, or the shortest (GFPO).

    Shrivastava et al., arXiv 2508.09726; DataFlex-RL (arXiv 2609.06107) configuration `gfpo`
    (k = 3, metric "efficiency"); docs/methods/gfpo.md. Refill 0.

        score_ij = r_ij / max(L_ij, 1)     metric="efficiency" (reward per token)
        score_ij = −L_ij                   metric="short"      (the k shortest)

    L = `Feedback.lengths` (tokens; DataFlex reads `response_mask.sum(-1).clamp(min=1)`).
    A group of G ≤ k keeps all. Ties keep the earlier rollouts (a stable sort; DataFlex's
    `torch.topk` leaves their order unspecified).

    Without lengths (`Feedback.lengths` is None: the simulator, an engine path that does
    not report them) every response counts as one token, so "efficiency" keeps the top k
    by reward and "short" the first k; a RuntimeWarning says so.

    Args:
        k: rollouts kept per group (DataFlex: 3 of rollout.n = 5).
        metric: "efficiency" or "short".

    >>> import numpy as np; from rlpace import Pool, Feedback
    >>> from rlpace.types import Batch
    >>> pool = Pool([0]); p = gfpo(k=2)
    >>> fb = Feedback([0], [[1.0, 1.0, 0.0, 1.0]], lengths=[[8, 2, 1, 4]], step=0)   # r/L = .125 .5 0 .25
    >>> p.apply(p.init(pool), pool, Batch.from_feedback(fb, pool, 0.5)).keep.tolist()
    [[False, True, False, True]]
    """
    k = check_int("gfpo", "k", k, low=1, hint=" (rollouts kept per group; DataFlex: 3)")
    check_choice("gfpo", "metric", metric, ("efficiency", "short"))

    def apply(state, pool, batch):
        r = batch.rewards
        shape = r.shape
        if shape[0] == 0 or shape[1] <= k:
            return Admission(np.full(shape, shape[0] > 0), 0)
        if batch.lengths is None:
            warnings.warn("gfpo: Feedback.lengths is None, so every response counts as 1 token and GFPO "
                          "keeps the top k by reward alone; pass Feedback(..., lengths=tokens per response).",
                          RuntimeWarning, stacklevel=2)
            lengths = np.ones(shape)
        else:
            lengths = np.maximum(batch.lengths, 1).astype(np.float64)
        score = r / lengths if metric == "efficiency" else -lengths          # [B, G]
        return Admission(_best_k_per_row(score, k), 0)

    return DataPolicy(ADMISSION, _empty_init, _no_update, apply, name="gfpo")


def _best_k_per_row(score: np.ndarray, k: int) -> np.ndarray:
    """bool[B, G]: per row, the k largest of the finite float64[B, G] `score`, ties by position
    (earlier kept) — the first k of a stable sort of −score. For small k, k rounds of a row
    argmax (the first maximum: ties by position), each winner then set to −inf; else the sort.

    >>> _best_k_per_row(np.array([[1.0, 3.0, 1.0, 2.0], [5.0, 5.0, 5.0, 0.0]]), 2).tolist()
    [[False, True, False, True], [True, True, False, False]]
    """
    b, g = score.shape
    keep = np.zeros(b * g, dtype=bool)
    base = np.arange(b) * g
    if k <= 4:
        s = np.array(score, dtype=np.float64).ravel()
        for _ in range(k):
            best = s.reshape(b, g).argmax(axis=1) + base
            keep[best] = True
            s[best] = -np.inf
    else:
        top = np.argsort(-score, axis=1, kind="stable")[:, :k]              # [B, k] best first
        keep[(top + base[:, None]).ravel()] = True
    return keep.reshape(b, g)
