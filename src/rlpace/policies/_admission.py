"""Rollout admission: after rollout, which groups (or rollouts) enter the loss, and how
many replacement prompts to request.

All four policies are stateless and act on one batch in O(B·G log G) numpy, with no
Python loop over groups:

* `dapo_dynamic_sampling` — DAPO's `filter_groups` (arXiv 2503.14476): drop groups
  whose metric has zero spread, request one refill per dropped group.
* `success_band` — online difficulty filtering (arXiv 2504.03380; DataFlex-RL
  `difffilter`, arXiv 2609.06107): keep groups whose pass rate lies in a band.
* `pods_max_variance` — PODS (arXiv 2504.13818; DataFlex-RL `maxvar`): keep, per group,
  the m rollouts whose rewards have the largest variance.
* `drop_all_wrong` — ADS's trainer hook (arXiv 2606.22305): drop groups whose rollouts
  all fail.
* `topk_advantage` — DataFlex-RL `topk`: keep the batch's top rollouts by |A|.

Each has its page in docs/methods/ (`<registered name>.md`).

Dropping happens after rollout, so none of these saves generation compute; the refill
count tells a DAPO-style trainer how many extra prompts to generate.
"""

from __future__ import annotations

import functools

from ..errors import InputError
import numpy as np

from ._base import ADMISSION, Admission, DataPolicy, _empty_init, _no_update
from ._checks import check_choice, check_int, check_real

__all__ = ["dapo_dynamic_sampling", "success_band", "pods_max_variance", "drop_all_wrong"]


def _group_mask(keep_group: np.ndarray, shape: tuple) -> np.ndarray:
    """bool[B] → bool[B, G]: a group is kept or dropped as a whole."""
    return np.repeat(keep_group[:, None], shape[1], axis=1).reshape(shape)


def dapo_dynamic_sampling(metric: str = "reward") -> DataPolicy:
    """DAPO dynamic sampling: keep a group iff its metric varies (std > 0) or G = 1.

    Yu et al., "DAPO", arXiv 2503.14476 (`filter_groups` in verl's DAPO recipe);
    docs/methods/dapo_dynamic_sampling.md. A group whose values are all equal has zero GRPO advantage
    and only dilutes the batch. `refill` = number of dropped groups (verl V1 async mode:
    evict k, refill k; the sync mode's 2k credits are a dispatch detail of that engine).

    Args:
        metric: "reward" (raw rewards; verl ≥ 0.9 default `metric=reward`) or "success"
            (reward ≥ the Scheduler's success threshold; verl's `acc`). Under shaped
            rewards an all-failed group can still have reward std > 0 and leak a
            "phantom gradient" (verl-recipe PR #125): use "success" there.

    Spread is tested exactly as max ≠ min, so float round-off in a std cannot keep a
    constant group.

    >>> import numpy as np; from rlpace import Pool, Feedback
    >>> from rlpace.types import Batch
    >>> pool = Pool([0, 0, 0]); p = dapo_dynamic_sampling()
    >>> b = Batch.from_feedback(Feedback([0, 1, 2], [[1, 0], [1, 1], [0, 0]], step=0), pool, 0.5)
    >>> out = p.apply(p.init(pool), pool, b); out.keep[:, 0].tolist(), out.refill
    ([True, False, False], 2)
    """
    check_choice("dapo_dynamic_sampling", "metric", metric, ("reward", "success"))

    def apply(state, pool, batch):
        values = batch.rewards if metric == "reward" else batch.success.astype(np.float64)
        shape = values.shape
        if shape[0] == 0:
            return Admission(np.zeros(shape, dtype=bool), 0)
        # max ≠ min ⟺ some value differs from the row's first (one comparison, no two
        # row reductions; -0.0 and 0.0 are equal either way)
        varies = (values != values[:, :1]).any(axis=1)
        keep = varies | (shape[1] == 1)
        return Admission(_group_mask(keep, shape), int((~keep).sum()))

    return DataPolicy(ADMISSION, _empty_init, _no_update, apply, name="dapo_dynamic_sampling")


def success_band(low: float = 0.2, high: float = 0.8, inclusive: bool = False) -> DataPolicy:
    """Keep groups whose pass rate lies strictly inside (low, high); refill one prompt per dropped group.

    Bae et al., "Online Difficulty Filtering for Reasoning Oriented RL", arXiv 2504.03380
    (the paper's exact band is unverified); the defaults are DataFlex-RL's `difffilter`
    (arXiv 2609.06107, `threshold_band` with low 0.2, high 0.8, keeping strictly inside)
    and the band verl users asked for (verl #2791). See docs/methods/success_band.md.

    Args:
        low, high: band on the group pass rate, 0 ≤ low ≤ high ≤ 1.
        inclusive: False (default, DataFlex's `threshold_band`) keeps the open band
            (low, high); True keeps the closed band [low, high]. With G = 5, pass rates
            0.2 and 0.8 are kept only when inclusive.

    Deviation: success is reward ≥ the Scheduler's `success_threshold` (default 0.5);
    DataFlex's `group_solve_rate` uses reward > 0.5. Identical for binary rewards.

    >>> import numpy as np; from rlpace import Pool, Feedback
    >>> from rlpace.types import Batch
    >>> pool = Pool([0, 0, 0]); p = success_band()
    >>> b = Batch.from_feedback(Feedback([0, 1, 2], [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0],
    ...                                             [1, 1, 1, 1, 1]], step=0), pool, 0.5)
    >>> out = p.apply(p.init(pool), pool, b); out.keep[:, 0].tolist(), out.refill
    ([False, True, False], 2)
    """
    check_real("success_band", "low", low, low=0, high=1)
    check_real("success_band", "high", high, low=0, high=1)
    if low > high:
        raise InputError(f"success_band needs 0 ≤ low ≤ high ≤ 1; got low={low}, high={high}.")
    if not isinstance(inclusive, (bool, np.bool_)):
        raise InputError(f"success_band inclusive must be True or False; got {inclusive!r}.")
    tol = 1e-12  # pass rates are k/G; guard the closed band against round-off

    def apply(state, pool, batch):
        shape = batch.rewards.shape
        if shape[0] == 0:
            return Admission(np.zeros(shape, dtype=bool), 0)
        rate = batch.pass_rate
        if inclusive:
            keep = (rate >= low - tol) & (rate <= high + tol)
        else:
            keep = (rate > low + tol) & (rate < high - tol)
        return Admission(_group_mask(keep, shape), int((~keep).sum()))

    return DataPolicy(ADMISSION, _empty_init, _no_update, apply, name="success_band")


def max_variance_subset(rewards: np.ndarray, m: int) -> np.ndarray:
    """bool[B, G]: per row, the m entries whose values have the largest (population)
    variance, found as the k lowest ∪ (m − k) highest for the best k (PODS, arXiv 2504.13818).

    For each row, sort ascending and, with prefix sums P of r and Q of r², the subset
    S_k = lowest k ∪ highest m−k has sum = P[k] + P[G] − P[G−m+k] (likewise Q), so
    Var(S_k) = Q_S/m − (P_S/m)² for all k = 0..m at once: O(G log G + m) per row,
    vectorised over rows. Ties between k go to the smallest k; ties between equal
    rewards keep the earlier rollouts among the lowest and the later among the highest.
    """
    r = np.asarray(rewards, dtype=np.float64)
    b, g = r.shape
    if m >= g:
        return np.ones((b, g), dtype=bool)
    ones = r == 1.0
    if b and (ones | (r == 0.0)).all():
        if g <= _TABLE_G:
            # each row's 0/1 pattern as a number (exact in float64), then its mask from a table
            code = (r @ _bit_values(g)).astype(np.intp)
            return _binary_table(g, m).take(code, axis=0)
        return _binary_by_count(ones, m)
    return _max_variance_subset(r, m)


#: G up to which `max_variance_subset` of 0/1 rewards reads each row's mask from a table of all
#: 2^G rows (bool[2^G, G]: 1 MB at G = 16, built once per (G, m) in ~10 ms)
_TABLE_G = 16


def _binary_by_count(ones: np.ndarray, m: int) -> np.ndarray:
    """`max_variance_subset` of 0/1 rewards (bool[B, G] `ones`, m < G), without a sort.

    A row's stable ascending order is its zeros in rollout order, then its ones in rollout
    order, so everything the general rule computes from the sorted row — and so the kept
    sorted positions — depends only on the row's count of ones c: the kept pattern of c is
    the general rule's on the row (0,…,0, 1,…,1) with c ones (`_binary_patterns`, computed
    once per (G, m)). A rollout's sorted position is its rank among the zeros (i − ones
    before it) or G − c + its rank among the ones, and it is kept when the pattern of its
    row keeps that position: the general rule's mask, bit for bit."""
    b, g = ones.shape
    before = np.cumsum(ones, axis=1)                   # [B, G] ones up to and including i
    c = before[:, -1:]                                 # [B, 1] ones per row
    # flat index into patterns [G + 1, G]: row c, column = the sorted position
    at = np.where(ones, before + (c + 1) * (g - 1), (np.arange(g) + c * g) - before)
    return _binary_patterns(g, m).take(at)


@functools.lru_cache(maxsize=32)
def _binary_patterns(g: int, m: int) -> np.ndarray:
    """bool[G + 1, G] read-only: row c is `max_variance_subset` of the sorted 0/1 row with c
    ones (G − c zeros, then c ones): the kept sorted positions of any row with c ones."""
    rows = (np.arange(g)[None, :] >= g - np.arange(g + 1)[:, None]).astype(np.float64)
    out = _max_variance_subset(rows, m)
    out.setflags(write=False)
    return out


@functools.lru_cache(maxsize=8)
def _binary_table(g: int, m: int) -> np.ndarray:
    """bool[2^G, G] read-only: row x is `max_variance_subset` of the 0/1 row whose rollout j
    is bit j of x (`_binary_by_count` over every such row)."""
    ones = (np.arange(1 << g)[:, None] >> np.arange(g)) & 1 == 1
    out = _binary_by_count(ones, m)
    out.setflags(write=False)
    return out


@functools.lru_cache(maxsize=32)
def _bit_values(g: int) -> np.ndarray:
    """float64[G] read-only 2^j: a 0/1 row times this is the number whose bit j is rollout j."""
    out = 2.0 ** np.arange(g)
    out.setflags(write=False)
    return out


def _max_variance_subset(r: np.ndarray, m: int) -> np.ndarray:
    """`max_variance_subset` of float64[B, G] `r` with m < G: the general rule."""
    b, g = r.shape
    big = np.abs(r).max(axis=1, keepdims=True)                       # [B, 1]
    if (big > 1e150).any():      # squares would overflow; the variance ranking is scale-free
        r = r / np.where(big > 1e150, big, 1.0)
    order = np.argsort(r, axis=1, kind="stable")                     # [B, G]
    flat = order + (np.arange(b) * g)[:, None]                       # flat positions, row-major
    s = r.ravel()[flat]
    # Centre each row first: variance is shift-invariant and the prefix-sum formula
    # loses precision when |mean| ≫ spread.
    s = s - s.mean(axis=1, keepdims=True)
    p = np.zeros((b, g + 1)); np.cumsum(s, axis=1, out=p[:, 1:])     # [B, G+1]
    q = np.zeros((b, g + 1)); np.cumsum(s * s, axis=1, out=q[:, 1:])
    k = np.arange(m + 1)                                             # [m+1]
    hi = g - m + k                                                   # first kept index on top
    sum_s = p[:, k] + p[:, [g]] - p[:, hi]                           # [B, m+1]
    sum_q = q[:, k] + q[:, [g]] - q[:, hi]
    var = sum_q / m - (sum_s / m) ** 2
    best = np.argmax(var, axis=1)                                    # [B] first max = smallest k
    j = np.arange(g)
    keep_sorted = (j < best[:, None]) | (j >= (g - m + best)[:, None])
    keep = np.empty(b * g, dtype=bool)
    keep[flat] = keep_sorted
    return keep.reshape(b, g)


def pods_max_variance(m: int | None = None) -> DataPolicy:
    """PODS down-sampling: keep, per group, the m of G rollouts with maximum reward variance.

    Xu, Savani, Fang, Kolter, "Not All Rollouts are Useful", arXiv 2504.13818; DataFlex-RL
    (arXiv 2609.06107) configuration `maxvar`; docs/methods/pods_max_variance.md. Some max-variance m-subset is the k lowest plus the m − k highest rewards;
    the best k comes from prefix sums (`max_variance_subset`). With binary rewards this
    keeps as balanced a success/failure split as the group allows.

    Args:
        m: rollouts kept per group. None → round(0.5·G) (DataFlex's keep fraction 0.5;
            Python rounds half to even, so G = 5 keeps 2), at least 1. m ≥ G keeps all.

    The trainer should re-normalise GRPO advantages on the kept subset (the paper trains
    GRPO on the subset); this policy only returns the mask. `refill` is 0.

    >>> import numpy as np; from rlpace import Pool, Feedback
    >>> from rlpace.types import Batch
    >>> pool = Pool([0]); p = pods_max_variance(m=2)
    >>> b = Batch.from_feedback(Feedback([0], [[0.1, 0.9, 0.5, 0.2]], step=0), pool, 0.5)
    >>> p.apply(p.init(pool), pool, b).keep.tolist()
    [[True, True, False, False]]
    """
    if m is not None:
        check_int("pods_max_variance", "m", m,
                  hint=" (rollouts kept per group), or None for round(0.5·G)")

    def apply(state, pool, batch):
        shape = batch.rewards.shape
        if shape[0] == 0:
            return Admission(np.zeros(shape, dtype=bool), 0)
        g = shape[1]
        keep_m = max(1, round(0.5 * g)) if m is None else int(m)
        return Admission(max_variance_subset(batch.rewards, keep_m), 0)

    return DataPolicy(ADMISSION, _empty_init, _no_update, apply, name="pods_max_variance")


def drop_all_wrong() -> DataPolicy:
    """ADS admission: drop every group whose rollouts all fail; keep all-correct groups.

    ADS (arXiv 2606.22305; `Richard-zrx/ADS`), docs/methods/drop_all_wrong.md: after
    `update_main` sees the full batch (the all-wrong groups move ADS's window easier),
    the ADS trainer removes groups with acc = 0 everywhere from the gradient batch and requests no replacements (`refill`
    = 0). Success is reward ≥ the Scheduler's threshold.

    >>> import numpy as np; from rlpace import Pool, Feedback
    >>> from rlpace.types import Batch
    >>> pool = Pool([0, 0]); p = drop_all_wrong()
    >>> b = Batch.from_feedback(Feedback([0, 1], [[0, 0], [1, 1]], step=0), pool, 0.5)
    >>> p.apply(p.init(pool), pool, b).keep[:, 0].tolist()
    [False, True]
    """
    def apply(state, pool, batch):
        shape = batch.rewards.shape
        if shape[0] == 0:
            return Admission(np.zeros(shape, dtype=bool), 0)
        return Admission(_group_mask(batch.success.any(axis=1), shape), 0)

    return DataPolicy(ADMISSION, _empty_init, _no_update, apply, name="drop_all_wrong")


# ---- DataFlex-RL `topk` (appended; listed in __all__ here to keep the edit append-only) ----
__all__ += ["topk_advantage"]


def topk_advantage(fraction: float = 0.5) -> DataPolicy:
    """Keep the top `fraction` of the batch's rollouts by |A|; refill 0 (DataFlex-RL `topk`).

    Liang et al., "DataFlex-RL", arXiv 2609.06107, configuration 9 (docs/methods/topk.md):
    scorer `advantage_magnitude` (a sequence's mean |A| over its tokens, which for GRPO
    is the rollout's |A|), selector `topk_fraction` with fraction 0.5, over all M = B·G
    rollouts of the batch (not per group):

        k    = max(1, round(fraction · M))          # Python round: half to even, as DataFlex
        keep = the k rollouts with the largest |A|

    Ties. DataFlex uses `torch.topk`, whose order among equal scores is unspecified. We
    break ties by position: among equal |A| the rollout earlier in the batch (row-major:
    lower prompt row, then lower rollout column) is kept — a stable sort of −|A|. With
    binary rewards many |A| are equal (every success of a group shares one value), so
    this rule decides which of them fill the last places; `Scheduler.propose` draws the
    batch's rows i.i.d., so position carries no systematic preference.

    Rollouts with A = 0 are kept when fewer than k have A ≠ 0 (DataFlex keeps exactly k).
    DataFlex masks the dropped rollouts with weight 0 after the advantages are computed
    on the full group; this mask is meant the same way (advantages are not recomputed:
    the result says `full_group_advantages=True`).

    >>> import numpy as np; from rlpace import Pool, Feedback
    >>> from rlpace.types import Batch
    >>> pool = Pool([0, 0]); p = topk_advantage()
    >>> fb = Feedback([0, 1], [[1, 0], [1, 1]], advantages=[[0.5, -2.0], [1.0, 0.5]], step=0)
    >>> b = Batch.from_feedback(fb, pool, 0.5)
    >>> p.apply(p.init(pool), pool, b).keep.tolist()     # M = 4, k = 2: |A| 2.0 and 1.0
    [[False, True], [True, False]]
    """
    check_real("topk", "fraction", fraction, low=0, high=1, low_open=True, hint=" (DataFlex: 0.5)")

    def apply(state, pool, batch):
        a = np.abs(batch.advantages)
        shape = a.shape
        if a.size == 0:
            return Admission(np.zeros(shape, dtype=bool), 0, full_group_advantages=True)
        k = max(1, int(round(fraction * a.size)))
        return Admission(_top_k_first(a.ravel(), k).reshape(shape), 0, full_group_advantages=True)

    return DataPolicy(ADMISSION, _empty_init, _no_update, apply, name="topk")


def _top_k_first(a: np.ndarray, k: int) -> np.ndarray:
    """bool[n]: the k largest of float64[n] `a`, ties by position (earlier kept) — the first k
    of a stable sort of −a, from one O(n) partition: every value above the k-th largest v,
    then the earliest entries equal to v until k are kept.

    >>> _top_k_first(np.array([1.0, 3.0, 1.0, 2.0, 1.0]), 3).tolist()
    [True, True, False, True, False]
    """
    n = a.shape[0]
    v = np.partition(a, n - k)[n - k]                               # the k-th largest
    keep = a > v
    ties = np.flatnonzero(a == v)[:k - int(np.count_nonzero(keep))]
    keep[ties] = True
    return keep
