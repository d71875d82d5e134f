"""Loss reweighting: per-rollout weights that multiply each rollout's policy-gradient
term, as in DataFlex-RL's reweighters (Liang et al., arXiv 2609.06107; configurations
`per`, `softmax`, `diffband`; docs/methods/per_advantage.md, softmax_advantage.md,
difficulty_band.md).

All three are stateless functions of one batch, mean-normalised to 1 over its B·G
rollouts so that the effective step size matches unweighted GRPO and only the relative
emphasis changes (DataFlex `_normalize_mean_one`). DataFlex writes the weights into
verl's per-token `rollout_is_weights`; a rollout's weight is the same for all its tokens.

Every weight is finite for any finite input: |A| and rewards are clipped to ±1e100
(`_checks.py`), |A|^α is computed on |A| / max|A| (the mean normalisation cancels the
scale) and the softmax is max-subtracted before the temperature divides it.
"""

from __future__ import annotations

import math

from ..errors import InputError
import numpy as np

from ._base import REWEIGHTING, DataPolicy, _empty_init, _no_update, softmax
from ._checks import check_real, clip_signal, shifted

__all__ = ["per_advantage", "difficulty_band", "softmax_advantage"]


def _mean_one(w: np.ndarray) -> np.ndarray:
    """w / mean(w); all ones when the mean is 0 (no rollout would get any weight)."""
    mean = w.mean() if w.size else 0.0
    return w / mean if mean > 0 else np.ones_like(w)


def _quantiles(x: np.ndarray, qs: tuple) -> np.ndarray:
    """`np.quantile(x, qs)` (method "linear") of a finite float64[n], n ≥ 1, bit for bit, from
    one partition at the needed order statistics (np.quantile also partitions at the first and
    last index and goes through more per-call machinery). numpy's rule: virtual index
    v = (n − 1)·q, a = x₍⌊v⌋₎, b = x₍⌊v⌋+1₎ (both the largest when v ≥ n − 1),
    γ = v − ⌊v⌋, then a + (b − a)·γ, or b − (b − a)·(1 − γ) when γ ≥ 0.5.

    >>> _quantiles(np.array([0.0, 1.0, 1.0, 0.0, 1.0]), (0.25, 0.75)).tolist()
    [0.0, 1.0]
    """
    n = x.shape[0]
    # in Python floats: the same IEEE double operations numpy applies elementwise
    v = [(n - 1) * float(q) for q in qs]
    prev = [n - 1 if vi >= n - 1 else math.floor(vi) for vi in v]
    nxt = [min(p + 1, n - 1) for p in prev]
    part = np.partition(x, sorted(set(prev + nxt)))
    out = []
    for vi, p, q in zip(v, prev, nxt):
        a, b = float(part[p]), float(part[q])
        gamma = vi - (-1 if vi >= n - 1 else p)    # numpy subtracts the index −1 it uses there
        diff = b - a
        out.append(b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma)
    return np.array(out)


def per_advantage(alpha: float = 0.5) -> DataPolicy:
    """Weight each rollout by |A|^`alpha`, mean-normalised to 1 over the batch (DataFlex-RL per).

    DataFlex-RL (arXiv 2609.06107) configuration `per`; docs/methods/per_advantage.md: scorer `advantage_magnitude` (the rollout's |A|;
    with GRPO the per-token advantage is constant over a sequence, so its mean is |A|),
    actuator `per_advantage` with α = 0.5. A batch whose |A| are all 0 gets weights 1.
    α = 0 gives weights 1 (0⁰ = 1).

    >>> import numpy as np; from rlpace import Pool, Feedback
    >>> from rlpace.types import Batch
    >>> pool = Pool([0]); p = per_advantage(alpha=1.0)
    >>> b = Batch.from_feedback(Feedback([0], [[1, 0]], advantages=[[1.0, -3.0]], step=0), pool, 0.5)
    >>> p.apply(p.init(pool), pool, b).tolist()     # |A| = [1, 3], mean 2
    [[0.5, 1.5]]
    """
    check_real("per_advantage", "alpha", alpha, low=0, hint=" (DataFlex: 0.5)")

    def apply(state, pool, batch):
        a = np.abs(clip_signal(batch.advantages))
        top = a.max() if a.size else 0.0
        # (|A| / max)^α, in [0, 1]: the same weights after mean normalisation, and no overflow.
        return _mean_one((a / top if top > 0 else a) ** alpha)

    return DataPolicy(REWEIGHTING, _empty_init, _no_update, apply, name="per_advantage")


def difficulty_band(low_q: float = 0.25, high_q: float = 0.75, inside: float = 2.0,
                    outside: float = 1.0) -> DataPolicy:
    """Weight `inside` for rollouts whose reward lies between the batch's `low_q` and `high_q` quantiles, else `outside`.

    Mean-normalised to 1 over the batch. DataFlex-RL (arXiv 2609.06107) configuration
    `diffband`; docs/methods/difficulty_band.md: scorer `reward_difficulty` (per-sequence reward),
    actuator `difficulty_band` with quantiles 0.25 / 0.75 (linear interpolation, as
    `torch.quantile`) and focus weight 2 (others 1), over all B·G rollouts of the batch.
    A batch of one rollout gets weight 1 (DataFlex). With binary rewards the band often
    covers every rollout (all weights 1 after normalisation) or only the majority value.

    >>> import numpy as np; from rlpace import Pool, Feedback
    >>> from rlpace.types import Batch
    >>> pool = Pool([0]); p = difficulty_band()
    >>> b = Batch.from_feedback(Feedback([0], [[0.0, 0.4, 0.6, 1.0]], step=0), pool, 0.5)
    >>> p.apply(p.init(pool), pool, b).round(4).tolist()   # band [0.3, 0.7]: w = [1,2,2,1]/1.5
    [[0.6667, 1.3333, 1.3333, 0.6667]]
    """
    check_real("difficulty_band", "low_q", low_q, low=0, high=1)
    check_real("difficulty_band", "high_q", high_q, low=0, high=1)
    if low_q > high_q:
        raise InputError(f"difficulty_band needs 0 ≤ low_q ≤ high_q ≤ 1; got {low_q}, {high_q}.")
    check_real("difficulty_band", "inside", inside, low=0, hint=" (DataFlex: 2)")
    check_real("difficulty_band", "outside", outside, low=0, hint=" (DataFlex: 1)")

    def apply(state, pool, batch):
        r = clip_signal(batch.rewards)
        if r.size <= 1:
            return np.ones(r.shape)
        lo, hi = _quantiles(r.ravel(), (low_q, high_q))
        w = np.where((r >= lo) & (r <= hi), float(inside), float(outside))
        return _mean_one(w)

    return DataPolicy(REWEIGHTING, _empty_init, _no_update, apply, name="difficulty_band")


def softmax_advantage(temperature: float = 1.0) -> DataPolicy:
    """Weight rollouts by softmax(|A| / `temperature`) · M over the batch's M = B·G rollouts (mean 1).

    DataFlex-RL (arXiv 2609.06107) configuration `softmax` with T = 1;
    docs/methods/softmax_advantage.md.

    >>> import numpy as np; from rlpace import Pool, Feedback
    >>> from rlpace.types import Batch
    >>> pool = Pool([0]); p = softmax_advantage()
    >>> b = Batch.from_feedback(Feedback([0], [[1, 0]], advantages=[[0.0, np.log(3)]], step=0), pool, 0.5)
    >>> p.apply(p.init(pool), pool, b).round(6).tolist()   # 2·[1, 3]/4
    [[0.5, 1.5]]
    """
    check_real("softmax_advantage", "temperature", temperature, low=0, low_open=True,
               hint=" (DataFlex: 1.0)")

    def apply(state, pool, batch):
        a = np.abs(clip_signal(batch.advantages))
        if a.size == 0:
            return np.ones(a.shape)
        return (softmax(shifted(a.ravel()), temperature) * a.size).reshape(a.shape)

    return DataPolicy(REWEIGHTING, _empty_init, _no_update, apply, name="softmax_advantage")
