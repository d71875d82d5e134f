"""Knapsack RL's rollout allocation (Li et al. 2025, arXiv 2509.25849; public code
`liziniu/KnapsackRL`, `verl/trainer/ppo/exploration_utils.py`), and the same solver fed the
true pass rates as a headroom reference (`oracle_allocation`). Method page:
docs/methods/knapsack.md.

The step's rollout budget W is a knapsack: prompt i with estimated pass rate p̂_i and N_i
rollouts is worth Value(N, p) = (1 − p^N − (1 − p)^N)·p(1 − p)² (the chance the group is not
constant, times the expected one-step gain p(1 − p)²); an exact dynamic programme picks the
N_i that maximise Σ Value under Σ N_i = W. Around it, the reference's rules, kept:

* p̂: the pass rate of the prompt's latest visit, or, when that visit had fewer than
  `buffer` (16) rollouts, of its `buffer` most recent rollouts across visits; a prompt is
  valid once `min_count` (8) of its rollouts have been seen.
* base: an unseen (invalid) prompt gets n = W // B (the uniform share); 0 < p̂ < 1 gets
  `min_n` and enters the DP; p̂ = 0 gets `negative_n`, p̂ = 1 `positive_n`.
* fallback: when the DP items' estimated need Σ int(min(max_n, cost_i)) with
  cost_i = log(1 − alpha)/log(max(p̂, 1 − p̂)) is below the remaining budget R, the surplus
  goes to the p̂ = 0 prompts (else to every prompt outside the DP) and the DP gets only the
  estimate.
* DP: item i's choice is k ∈ {0, 1, …, max_n − min_n} extra rollouts, worth
  Value(min_n + k, p̂_i) for k ≥ 1 and 0 for k = 0 (as the reference; so the DP gives most
  items at least one extra). Ties: the smallest k, item by item in batch order, and the
  backtrack starts from the largest budget the DP can fill — the reference's strict `>`
  comparisons.

The reference's bugs, fixed here (each named on the method page and tested):
1. `max_n=None` (its signature default) crashes at `min(max_n, cost)`: max_n is required
   (default 128, the reference's 7B script).
2. The fallback with every prompt in the DP divides by zero (no candidates for the
   surplus): the DP then gets the whole remaining budget.
3. Spreading a remainder or a surplus can push a prompt past max_n: spreads here respect
   max_n and move on to the next group of prompts (p̂ = 0, then the rest).
4. Unseen prompts count as p̂ = 0 when the surplus is spread (their success rate is left at
   its initial 0): only prompts measured at p̂ = 0 are "zero-success" here.
5. With no DP item and no p̂ = 0 prompt, every prompt is reset to n, which sums to W only
   when B divides W: the remainder goes +1 to the first prompts.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..errors import InputError
from ..types import Pool
from ._base import ALLOCATION, DataPolicy
from ._checks import check_choice, check_int, check_real

__all__ = ["KnapsackState", "knapsack", "oracle_allocation", "knapsack_allocation",
           "knapsack_value", "pass_rate_estimate"]


class KnapsackState(NamedTuple):
    count: np.ndarray    # int64[N] rollouts observed per prompt (valid once ≥ min_count)
    last_n: np.ndarray   # int64[N] rollouts of the prompt's latest visit
    last_k: np.ndarray   # int64[N] successes of the latest visit
    recent: np.ndarray   # int64[N] success bits of the latest `buffer` rollouts, newest in bit 0
    STATE_RULES = {"count": "nonneg", "last_n": "nonneg", "last_k": "nonneg", "recent": "nonneg"}


def knapsack_value(n, p):
    """Value(N, p) = (1 − p^N − (1 − p)^N)·p(1 − p)²: Knapsack RL's worth of N rollouts of a
    prompt with pass rate p (float64, broadcasting)."""
    n = np.asarray(n, dtype=np.float64)
    p = np.asarray(p, dtype=np.float64)
    return (1.0 - p ** n - (1.0 - p) ** n) * p * (1.0 - p) ** 2


def pass_rate_estimate(state: KnapsackState, ids: np.ndarray, buffer: int, min_count: int
                       ) -> tuple[np.ndarray, np.ndarray]:
    """(valid bool[B], p̂ float64[B]) for `ids`: the reference's epoch estimate (see module)."""
    count, last_n, last_k = state.count[ids], state.last_n[ids], state.last_k[ids]
    m = np.minimum(count, buffer)
    bits = state.recent[ids] & ((np.int64(1) << m) - 1)
    wins = np.bitwise_count(bits.astype(np.uint64)).astype(np.float64)
    p = np.where(last_n >= buffer, last_k / np.maximum(last_n, 1), wins / np.maximum(m, 1))
    valid = count >= min_count
    return valid, np.where(valid, p, 0.0)


def _spread(alloc: np.ndarray, extra: int, groups: list, cap: int | None) -> int:
    """Give `extra` units to `alloc` in place: to each index array of `groups` in turn, evenly
    (the first ones +1, as the reference), never past `cap`; returns what is left."""
    for idx in groups:
        idx = np.asarray(idx, dtype=np.int64)
        while extra > 0 and idx.size:
            room = np.full(idx.size, extra, np.int64) if cap is None else cap - alloc[idx]
            open_ = idx[room > 0]
            if open_.size == 0:
                break
            q, r = divmod(extra, open_.size)
            add = np.full(open_.size, q, np.int64)
            add[:r] += 1
            if cap is not None:
                add = np.minimum(add, cap - alloc[open_])
            alloc[open_] += add
            extra -= int(add.sum())
            idx = open_
    return extra


def _dp_extras(p: np.ndarray, k_max: int, budget: int, min_n: int) -> np.ndarray:
    """int64[m] extra rollouts per DP item maximising Σ gain, gain(0) = 0 and
    gain(k) = Value(min_n + k, p) — the reference's exact DP and tie rules (see module)."""
    m = p.shape[0]
    if budget <= 0 or m == 0 or k_max <= 0:
        return np.zeros(m, np.int64)
    gains = knapsack_value(min_n + np.arange(k_max + 1)[None, :], p[:, None])     # [m, K+1]
    gains[:, 0] = 0.0
    return _dp_choose(gains, budget)


def _dp_full(gains: np.ndarray, budget: int) -> np.ndarray:
    """int64[m] choices k_i ∈ [0, K] maximising Σ gains[i, k_i] under Σ k_i ≤ budget, filled
    as far as the items can: the DP over every budget row (gains float64[m, K+1]).

    Row w of item i: dp[w − k] + gains[i, k], the first maximum over k (the smallest k wins
    ties, the reference's strict `>`); the choices are walked back from the largest budget the
    DP can fill. Row w of item i is computed only up to what the first i + 1 items can fill,
    (i + 1)·K: every budget above it is unreachable (dp = −inf, choice 0 — what the full row
    gives).
    """
    m, k_max = gains.shape[0], gains.shape[1] - 1
    out = np.zeros(m, np.int64)
    if budget <= 0 or m == 0 or k_max <= 0:
        return out
    choice = np.zeros((m, budget + 1), np.int64)
    pad = np.full(k_max + budget + 1, -np.inf)                          # k_max of −inf, then dp
    pad[k_max] = 0.0
    dp = pad[k_max:]                                                    # [W+1] a view: updated in place
    # cand[w, k] = dp[w − k] + gain_k: a window over the padded row, reversed in k
    win = np.lib.stride_tricks.sliding_window_view(pad, k_max + 1)[:, ::-1]   # [W+1, K+1]
    cand = np.empty((budget + 1, k_max + 1))
    flat = cand.reshape(-1)
    row0 = np.arange(budget + 1) * (k_max + 1)                          # flat index of cand[w, 0]
    for i in range(m):
        h = min(budget, (i + 1) * k_max) + 1                            # rows the first i + 1 items reach
        c = cand[:h]
        np.add(win[:h], gains[i], out=c)                                # read dp before it is overwritten
        best = c.argmax(axis=1)                         # first maximum: the smallest k wins ties
        choice[i, :h] = best
        dp[:h] = flat[row0[:h] + best]
    fin = np.flatnonzero(np.isfinite(dp))
    if fin.size == 0:
        return out
    w = int(fin.max())                                  # the largest budget the DP can fill
    for i in range(m - 1, -1, -1):
        out[i] = choice[i, w]
        w -= int(out[i])
    return out


def _dp_bands(gains: np.ndarray, top: int) -> np.ndarray:
    """int64[m, 2]: for each item the rows [lo_i, hi_i] that the DP's optimal path through
    `top` can cross (gains finite float64[m, K+1], top ≤ m·K, the whole budget filled).

    A row w of item i lies on an optimal path only if the best prefix of items ≤ i at w plus
    the best suffix of items > i at top − w reaches the value of a feasible allocation, LB.
    Both are bounded by Lagrangian duality, for every λ: Σ_{j ≤ i} max_k (g_j[k] − λk) + λw
    (any allocation of w units to those items scores at most this), and the same for the
    suffix. The bound, a minimum of lines in w, is concave, so the rows above LB form one
    interval, found by bisection from the feasible allocation's own prefix sums (inside it).
    LB: each item's units among the `top` largest increments g_j[k] − g_j[k−1] — for concave
    gains the optimum, so the interval is a few rows; any table is still exact, only wider.
    The margin (1e-9 of the values' scale) covers the float sums' rounding (the DP's sums
    differ from the exact ones by ~m·2⁻⁵³ of it).
    """
    m, k1 = gains.shape
    k_max = k1 - 1
    inc = np.diff(gains, axis=1).ravel()                                # [m·K] increments
    order = np.argsort(-inc, kind="stable")
    units = np.bincount(order[:top] // k_max, minlength=m)              # a feasible allocation
    lb = gains[np.arange(m), units].sum()
    srt = inc[order]
    n = inc.size
    # λ on a grid of increments: 8 quantiles, and ranks at ±2^j around the top-th (the bound is
    # tight where λ is near the marginal gain of the rows near the optimum)
    geo = 2 ** np.arange(int(np.log2(max(n, 2))) + 1)
    ranks = np.r_[np.linspace(0, n - 1, 8).astype(np.int64), top - 1 - geo, top - 1, top - 1 + geo]
    lam = np.unique(srt[np.clip(ranks, 0, n - 1)])
    lam = np.r_[lam[0] - 1.0 - abs(lam[0]), lam, lam[-1] + 1.0 + abs(lam[-1])]      # [L]
    each = (gains[:, None, :] - lam[None, :, None] * np.arange(k1)).max(axis=2)      # [m, L] max_k g_j[k] − λk
    pre = np.cumsum(each, axis=0)                                       # items ≤ i
    suf = np.zeros_like(each)
    suf[:-1] = np.cumsum(each[::-1], axis=0)[::-1][1:]                  # items > i
    scale = np.abs(gains).max(axis=1).sum() + np.abs(lam).max() * (top + k1)
    floor = lb - 1e-9 * (1.0 + scale)

    def above(w):                                                       # bool[m]: row w[i] of item i may be optimal
        return ((pre + lam * w[:, None]).min(axis=1) + (suf + lam * (top - w)[:, None]).min(axis=1)) >= floor

    i = np.arange(m)
    lo = np.maximum(0, top - (m - 1 - i) * k_max) - 1                   # first row out of reach, below
    hi = np.minimum(top, (i + 1) * k_max) + 1                           # and above
    x = np.cumsum(units)                                                # inside: the feasible allocation's rows
    inner = []
    for out_, in_ in ((lo, x.copy()), (hi, x.copy())):
        out_ = out_.copy()
        while (act := np.abs(in_ - out_) > 1).any():
            mid = np.where(act, (in_ + out_) // 2, x)
            ok = above(mid)
            in_ = np.where(act & ok, mid, in_)
            out_ = np.where(act & ~ok, mid, out_)
        inner.append(in_)
    return np.stack(inner, axis=1)


def _dp_choose(gains: np.ndarray, budget: int) -> np.ndarray:
    """`_dp_full`'s choices (the same extras and ties), computed on the rows an optimal path
    can cross (`_dp_bands`) — a few per item for concave gains instead of every budget row.

    Every row the DP computes here takes its maximum over the candidates from the previous
    item's band only, so its value is at most the full DP's; on the full DP's own path it is
    equal, and each row's first maximum is the same k (a candidate outside the bands is a
    path no better than the optimum by more than the margin). The walk back checks that it
    stays inside the bands and ends at row 0; a table that is not finite, or a walk that
    leaves the bands (not seen; a guard), runs `_dp_full`.
    """
    m, k_max = gains.shape[0], gains.shape[1] - 1
    out = np.zeros(m, np.int64)
    if budget <= 0 or m == 0 or k_max <= 0:
        return out
    if not np.isfinite(gains).all():
        return _dp_full(gains, budget)
    top = min(budget, m * k_max)                        # the largest budget the DP can fill
    band = _dp_bands(gains, top)
    choice = np.zeros((m, top + 1), np.int64)
    pad = np.full(k_max + top + 1, -np.inf)
    pad[k_max] = 0.0
    dp = pad[k_max:]
    win = np.lib.stride_tricks.sliding_window_view(pad, k_max + 1)[:, ::-1]   # [W+1, K+1]
    was = (0, 0)                                        # the previous item's band (row 0 before the first)
    for i in range(m):
        lo, hi = int(band[i, 0]), int(band[i, 1])
        c = win[lo:hi + 1] + gains[i]                   # [rows, K+1] reads the previous band only
        best = c.argmax(axis=1)                         # first maximum: the smallest k wins ties
        dp[was[0]:was[1] + 1] = -np.inf
        dp[lo:hi + 1] = c[np.arange(hi + 1 - lo), best]
        choice[i, lo:hi + 1] = best
        was = (lo, hi)
    w = top
    if not np.isfinite(dp[w]):
        return _dp_full(gains, budget)
    for i in range(m - 1, -1, -1):
        if not band[i, 0] <= w <= band[i, 1]:
            return _dp_full(gains, budget)
        out[i] = choice[i, w]
        w -= int(out[i])
    return out if w == 0 else _dp_full(gains, budget)


def knapsack_allocation(p: np.ndarray, valid: np.ndarray, budget: int, *, min_n: int = 2,
                        max_n: int = 128, negative_n: int | None = None, positive_n: int | None = None,
                        alpha: float = 0.9, cost_estimation: str = "probability",
                        allow_fallback: bool = True) -> np.ndarray:
    """int64[B] rollouts per prompt from pass-rate estimates `p` (float[B]) and which are
    `valid` (bool[B]); Σ = budget, each in [min_n, max_n] (see the module for the rules and
    the reference's bugs fixed). Pure numpy; the DP (`_dp_choose`) costs O(B_dp·max_n) for
    each of the few rows per item an optimal path can cross.

    >>> knapsack_allocation(np.array([0.5, 0.25, 0.0, 1.0]), np.ones(4, bool), 32, max_n=16).tolist()
    [6, 9, 15, 2]
    """
    negative_n = min_n if negative_n is None else negative_n
    positive_n = min_n if positive_n is None else positive_n
    b = p.shape[0]
    n = budget // b
    # p̂ as the reference holds it (a float32 array); gains and costs computed from it in float64
    p = np.asarray(p, dtype=np.float32).astype(np.float64)
    valid = np.asarray(valid, dtype=bool)
    eff = valid & (p > 0) & (p < 1)
    zero = valid & (p == 0)
    alloc = np.where(~valid, n, np.where(eff, min_n, np.where(zero, negative_n, positive_n))).astype(np.int64)
    # negative_n / positive_n above the uniform share would overdraw the budget: capped at it
    alloc = np.minimum(alloc, max(n, min_n))
    rest = int(budget - alloc.sum())
    others = np.flatnonzero(~eff)
    if rest > 0 and not eff.any():
        if zero.any():
            rest = _spread(alloc, rest, [np.flatnonzero(zero), np.arange(b)], max_n)
        else:
            alloc[:] = n                                   # bug 5: + the remainder, first prompts
            rest = _spread(alloc, budget - int(alloc.sum()), [np.arange(b)], max_n)
        return alloc
    idx = np.flatnonzero(eff)
    pe = p[idx]
    with np.errstate(divide="ignore"):
        if cost_estimation == "probability":
            cost = np.log(1.0 - alpha) / np.log(np.maximum(pe, 1.0 - pe))
        else:
            cost = 1.0 / (pe * (1.0 - pe)) - 1.0
    cost = cost.astype(np.float32)                        # the reference stores costs in float32
    est = int(sum(int(min(max_n, c)) for c in cost.tolist()))
    dp_budget = rest
    if est < rest and allow_fallback and others.size:      # bug 2: no candidates → no fallback
        surplus = rest - est
        first = np.flatnonzero(zero) if zero.any() else others       # bug 4: measured p̂ = 0 only
        left = _spread(alloc, surplus, [first, others], max_n)
        dp_budget = est + left
    extras = _dp_extras(pe, max_n - min_n, dp_budget, min_n)
    alloc[idx] += extras
    left = dp_budget - int(extras.sum())
    # bug 3: what the DP cannot use (every item at max_n) goes on within max_n
    _spread(alloc, left, [idx, np.flatnonzero(zero), others, np.arange(b)], max_n)
    return alloc


def _check_bounds(min_n, max_n, negative_n, positive_n, owner="knapsack") -> None:
    if max_n is None:
        raise InputError(f"{owner} max_n must be an int (the most rollouts one prompt gets; Knapsack RL's "
                         f"script: 128); None is not allowed (the reference crashes on it).")
    check_int(owner, "min_n", min_n, low=1)
    check_int(owner, "max_n", max_n, low=1)
    if min_n > max_n:
        raise InputError(f"min_n = {min_n} is above max_n = {max_n} (bounds inverted); give "
                         f"1 ≤ min_n ≤ max_n (Knapsack RL: min_n=2, max_n=128).")
    for name, v in (("negative_n", negative_n), ("positive_n", positive_n)):
        if v is not None:
            check_int(owner, name, v, low=min_n, high=max_n, hint=" (or None = min_n)")


def knapsack(min_n: int = 2, max_n: int = 128, negative_n: int | None = None,
             positive_n: int | None = None, alpha: float = 0.9, cost_estimation: str = "probability",
             allow_fallback: bool = True, buffer: int = 16, min_count: int = 8) -> DataPolicy:
    """Knapsack RL (arXiv 2509.25849; docs/methods/knapsack.md): rollouts per prompt by an exact knapsack.

    The DP maximises Σ Value(N_i, p̂_i), Value(N, p̂) = (1 − p̂^N − (1 − p̂)^N)·p̂(1 − p̂)².

    An allocation policy (`Scheduler.allocate(ids, budget)`): unseen prompts get the uniform
    share W // B, prompts at 0 < p̂ < 1 at least `min_n` and what the DP gives them, prompts
    at p̂ ∈ {0, 1} `negative_n` / `positive_n` (default min_n) plus the fallback surplus
    (p̂ = 0 first). p̂ is the latest visit's pass rate, or that of the latest `buffer`
    rollouts when the visit had fewer; valid after `min_count` rollouts. Defaults are the
    reference's 7B script (min_n = negative_n = positive_n = 2, max_n = 128, alpha = 0.9).

    >>> import numpy as np; from rlpace import Pool, Feedback, Scheduler
    >>> s = Scheduler(Pool(["a"] * 4), "knapsack", max_n=16)
    >>> s.observe(Feedback([0, 1, 2, 3], [[1, 0] * 4, [1, 0, 0, 0] * 2, [0] * 8, [1] * 8], step=0))
    >>> s.allocate(np.array([0, 1, 2, 3]), 32).tolist()   # DP 11 = Σ int(cost); surplus 13 to p̂ = 0
    [6, 9, 15, 2]
    """
    _check_bounds(min_n, max_n, negative_n, positive_n)
    check_real("knapsack", "alpha", alpha, low=0, high=1, low_open=True, high_open=True, hint=" (reference 0.9)")
    check_choice("knapsack", "cost_estimation", cost_estimation, ("probability", "expectation"))
    if not isinstance(allow_fallback, (bool, np.bool_)):
        raise InputError(f"knapsack allow_fallback must be True or False; got {allow_fallback!r}.")
    check_int("knapsack", "buffer", buffer, low=1, high=62, hint=" (rollouts in the p̂ estimate; reference 16)")
    check_int("knapsack", "min_count", min_count, low=0, hint=" (rollouts before p̂ is used; reference 8)")
    mask = (1 << buffer) - 1

    def init(pool):
        n = len(pool)
        return KnapsackState(*(np.zeros(n, np.int64) for _ in range(4)))

    def update(state, pool, batch):
        ids = batch.prompt_ids
        b, g = batch.rewards.shape if batch.rewards.ndim == 2 else (0, 0)
        if b == 0:
            return state
        s = batch.success
        tail = s[:, -min(g, buffer):]                                  # the newest ≤ buffer rollouts
        weights = np.int64(1) << np.arange(tail.shape[1] - 1, -1, -1, dtype=np.int64)
        bits = tail.astype(np.int64) @ weights                         # newest rollout in bit 0
        wins = s.sum(axis=1).astype(np.int64)
        shift = min(g, buffer)
        # a prompt twice in one batch: its visits in batch order (rare; a loop over duplicates)
        order = np.argsort(ids, kind="stable")
        dup = np.zeros(b, bool)
        dup[order[1:]] = ids[order[1:]] == ids[order[:-1]]
        for rows in ([np.flatnonzero(~dup)] + [np.array([r]) for r in np.flatnonzero(dup)]):
            j = ids[rows]
            state.recent[j] = ((state.recent[j] << shift) | bits[rows]) & mask
            state.count[j] += g
            state.last_n[j] = g
            state.last_k[j] = wins[rows]
        return state

    def apply(state, pool, ids, budget):
        valid, p = pass_rate_estimate(state, ids, buffer, min_count)
        return knapsack_allocation(p, valid, budget, min_n=min_n, max_n=max_n, negative_n=negative_n,
                                   positive_n=positive_n, alpha=alpha, cost_estimation=cost_estimation,
                                   allow_fallback=allow_fallback)

    def metrics(state, pool):
        seen = state.count >= min_count
        return {"knapsack/valid_fraction": float(seen.mean())}

    def check_state(state, pool):
        if (state.last_k > state.last_n).any() or (state.last_n > state.count).any():
            raise InputError("knapsack state: last_k ≤ last_n ≤ count must hold for every prompt; the "
                             "state is corrupt or was edited.")
        if (state.recent > mask).any():
            raise InputError(f"knapsack state: recent holds more than buffer = {buffer} bits; the state "
                             f"was saved with another buffer or edited.")

    return DataPolicy(ALLOCATION, init, update, apply, name="knapsack", metrics=metrics,
                      check_state=check_state, bounds=(int(min_n), int(max_n)))


class OracleAllocationState(NamedTuple):
    pass_rate: np.ndarray   # float64[N] latest measured pass rate; NaN = never measured


def oracle_allocation(min_n: int = 2, max_n: int = 128) -> DataPolicy:
    """Headroom reference allocation, not for production: Knapsack RL's DP on the true pass rates.

    The DP of `knapsack` fed each prompt's measured current pass rate (docs/methods/knapsack.md,
    "Oracle"; page docs/methods/oracle_allocation.md). Like `oracle_boundary` it reads
    "measurement": the simulator or the trainer feeds every prompt's measured pass rate
    through `observe`; the latest group of a prompt overwrites its p. No fallback (the true
    p needs none); unmeasured prompts get the uniform share, p ∈ {0, 1} gets min_n.

    >>> import numpy as np; from rlpace import Pool, Feedback, Scheduler
    >>> s = Scheduler(Pool(["a"] * 3), "oracle_allocation", max_n=8)
    >>> s.observe(Feedback([0, 1, 2], [[1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0]], step=0))
    >>> s.allocate(np.array([0, 1, 2]), 12).tolist()
    [6, 2, 4]
    """
    _check_bounds(min_n, max_n, None, None, owner="oracle_allocation")

    def init(pool):
        return OracleAllocationState(np.full(len(pool), np.nan))

    def update(state, pool, batch):
        ids = batch.prompt_ids
        if ids.size:
            rev = ids[::-1]                            # latest wins within a batch
            uniq, first = np.unique(rev, return_index=True)
            state.pass_rate[uniq] = batch.pass_rate[::-1][first]
        return state

    def apply(state, pool, ids, budget):
        p = state.pass_rate[ids]
        valid = ~np.isnan(p)
        return knapsack_allocation(np.where(valid, p, 0.0), valid, budget, min_n=min_n, max_n=max_n,
                                   allow_fallback=False)

    return DataPolicy(ALLOCATION, init, update, apply, name="oracle_allocation",
                      reads=frozenset({"measurement"}), bounds=(int(min_n), int(max_n)))
