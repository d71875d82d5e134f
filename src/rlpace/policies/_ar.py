"""`ar` — token-level Advantage Reweighting (Yang et al., "Do Not Let Low-Probability Tokens
Over-Dominate in RL for LLMs", arXiv 2505.12929; DataFlex-RL's `ar` configuration,
docs/methods/ar.md).

Low-probability tokens get large policy-gradient norms and crowd out the update; AR scales
each token's term by an affine function of its probability under the sampling policy:

    w_t = α · π_old(o_t | q, o_<t) + (1 − α),        then   w_t ← w_t · n / Σ_valid w

so that the weights have mean exactly 1 over the batch's n real completion tokens (DataFlex
`advantage_reweight`: `w * (mask.sum() / (w * mask).sum())`, the step size stays the
unweighted one and only the emphasis between tokens changes).

The policy is a reweighting policy that acts on tokens: it reads `Batch.token_probs` /
`Batch.token_mask`, which exist only inside `Scheduler.token_weights(feedback, token_probs,
token_mask)`. Through `Scheduler.loss_weights` (no token statistics: the simulator, engine
paths that report none) it returns weights 1 — AR then leaves the loss unchanged.
"""

from __future__ import annotations

import numpy as np

from ._base import REWEIGHTING, DataPolicy, _empty_init, _no_update
from ._checks import check_real

__all__ = ["advantage_reweight"]


def advantage_reweight(alpha: float = 0.5) -> DataPolicy:
    """Per-token loss weights w_t = α·π_old(o_t) + (1 − α) with mean 1 over real tokens (AR, DataFlex-RL `ar`).

    Yang et al., arXiv 2505.12929; DataFlex-RL (arXiv 2609.06107) configuration `ar`,
    α = 0.5; docs/methods/ar.md. π_old is the sampling policy's probability of the token.

    Args:
        alpha: α ∈ [0, 1]; 0 gives weights 1, 1 weighs each token by its probability.

    Returns float64[B, G, T] (0 on padding) when the batch carries token probabilities,
    else float64[B, G] ones. A batch with no real token, or whose weights all vanish
    (α = 1 and every π = 0), gets weight 1 on its real tokens.

    >>> import numpy as np; from rlpace import Pool, Feedback
    >>> from rlpace.types import Batch
    >>> pool = Pool([0]); p = advantage_reweight(alpha=0.5)
    >>> b = Batch.from_feedback(Feedback([0], [[1.0, 0.0]], step=0), pool, 0.5)
    >>> probs = np.array([[[0.2, 1.0], [0.6, 0.0]]]); mask = np.array([[[1, 1], [1, 0]]], bool)
    >>> p.apply((), pool, b._replace(token_probs=probs, token_mask=mask)).round(6).tolist()  # [.6, 1, .8]·3/2.4
    [[[0.75, 1.25], [1.0, 0.0]]]
    """
    a = check_real("ar", "alpha", alpha, low=0.0, high=1.0, hint=" (DataFlex: 0.5)")

    def apply(state, pool, batch):
        if batch.token_probs is None:
            return np.ones(batch.rewards.shape)            # no token statistics: leave the loss as is
        m = batch.token_mask
        w = a * batch.token_probs + (1.0 - a)                           # [B, G, T]
        n, total = float(m.sum()), float(np.where(m, w, 0.0).sum())
        if n == 0 or total <= 0:
            return np.where(m, 1.0, 0.0)
        return np.where(m, w * (n / total), 0.0)

    return DataPolicy(REWEIGHTING, _empty_init, _no_update, apply, name="ar")
