"""MoPPS: Beta posterior of each prompt's success rate, Thompson sampling over a
candidate pool, keep the candidates predicted closest to a target success rate.

Qu, Wang, Mao, Hu, Ommer, Ji, "Can Prompt Difficulty be Online Predicted for
Accelerating RL Finetuning of Reasoning Models?", arXiv 2507.04632 —
docs/methods/mopps.md; checked against `thu-rllab/MoPPS` `recipe/ours/mopps.py`
(`PosteriorSampler.train` / `sample_batch`, strategy 'topk').

Update, for each observed group of prompt i with n = G rollouts and pass rate s:

    α_i ← λ·α_i + (1 − λ)·α0 + n·s
    β_i ← λ·β_i + (1 − λ)·β0 + n·(1 − s)

Selection: draw ratio·n candidates uniformly, draw γ̂_i ~ Beta(α_i, β_i) for each,
keep the n with the smallest (γ̂_i − target)². Composed with a mixture over arms, the
n slots are first split as n_k ~ Multinomial(n, probs) and the rule runs inside each
arm (rlpace's extension; the paper has no mixture).

Deviations: (1) the reference writes `… + s*n if n > 1 else 8`, which Python parses as
`(… + s*n) if n > 1 else 8`, overwriting α with 8 when G = 1; here G = 1 updates by the
same rule. (2) Success is reward ≥ the Scheduler's threshold (the code: `acc ≥ 1`).
(3) A prompt listed twice in one batch is updated once per group, in batch order —
exactly the sequential loop, computed in closed form: with m groups x_0..x_{m−1},
α ← λ^m·α + Σ_j λ^{m−1−j}·((1 − λ)·α0 + x_j).
"""

from __future__ import annotations

import weakref
from typing import NamedTuple

import numpy as np

from ..types import group_wins
from ._base import SELECTION, DataPolicy
from .._checks import bad
from ._checks import check_int, check_real
from ._uniform import split_by_arm
from ..predict._logistic import PredictorState, check_predictor_state, predictor

__all__ = ["mopps", "beta_posterior_update"]


class MoppsState(NamedTuple):
    alpha: np.ndarray  # float64[N] Beta α per prompt (prior α0)
    beta: np.ndarray   # float64[N] Beta β per prompt (prior β0)
    #: bool[N] True for every prompt whose (α, β) may have left the prior (α0, β0): set by
    #: `update` in the same call that writes α and β, saved and restored with them, and
    #: checked on load (`check_state`: no prompt off the prior may be unmarked). None (a state
    #: built by hand from α and β alone) means "derive it from the values".
    moved: np.ndarray | None = None
    #: value rules `Scheduler.load_state_dict` checks for each field (policies/_state_checks.py)
    STATE_RULES = {"alpha": "pos", "beta": "pos"}
    #: a state saved before `moved` existed loads with the mask its values imply (what that
    #: code derived at every step): see `rlpace.scheduler._fill_added_fields`
    ADDED_FIELDS = {"moved": lambda saved, fresh: moved_from_values(saved["alpha"], saved["beta"],
                                                                     fresh.alpha, fresh.beta)}


class MoppsPriorState(NamedTuple):
    """MoPPS state with the predictor prior on (`prior_strength` > 0)."""

    alpha: np.ndarray         # float64[N] Beta α per prompt (prior α0)
    beta: np.ndarray          # float64[N] Beta β per prompt (prior β0)
    predictor: PredictorState  # the pass-rate model over prompt features (rlpace.predict)
    moved: np.ndarray | None = None  # bool[N] as `MoppsState.moved`
    #: value rules `Scheduler.load_state_dict` checks for each field (policies/_state_checks.py)
    STATE_RULES = {"alpha": "pos", "beta": "pos"}
    ADDED_FIELDS = MoppsState.ADDED_FIELDS   # as `MoppsState`'s


def moved_from_values(alpha: np.ndarray, beta: np.ndarray, prior_alpha,
                      prior_beta) -> np.ndarray:
    """bool[N] the prompts whose (α, β) is not the prior (α0, β0: floats, or a fresh state's
    float64[N] arrays): the exact `moved` mask of a state built from its values (what
    `MoppsState.moved` must cover)."""
    return (alpha != prior_alpha) | (beta != prior_beta)


class _MemberOrderViews:
    """Copies of a state's `moved` mask in the order of `Pool.members(arms)`, so the per-arm
    selection looks its candidates up by their member positions (increasing addresses) and
    skips the member → prompt lookup for all but the candidates it reads or keeps.

    Why the mask at all: in a large pool almost every candidate is still at the prior, yet
    reading its α and β costs two random reads of N-long arrays per candidate (≈ 16k per step
    for 512 slots at ratio 16, most of a step at N = 10⁶). The mask is 8× smaller than the two
    arrays, and only the candidates it marks are read from them; the others are at the prior
    by construction.

    A view is a cache of one state's `moved` array (held by weak reference), built from it
    when first asked and marked by `mark`, which `update` calls in the same place it marks
    `moved` itself; a restored or copied state has another `moved` array and gets its own
    views. The mask is a superset — a marked prompt back at the prior (possible with
    decay < 1) is read and found at the prior — so the values drawn from are always exactly
    α[ids], β[ids].
    """

    def __init__(self):
        self._entries: dict = {}     # id(moved) -> [weakref moved, {id(order): (order, rank, view)}]

    def view(self, moved: np.ndarray, order: np.ndarray) -> np.ndarray:
        """bool[N]: view[r] = moved[order[r]]."""
        e = self._entries.get(id(moved))
        if e is None or e[0]() is not moved:
            for k in [k for k, v in self._entries.items() if v[0]() is None]:
                del self._entries[k]     # states that no longer exist
            e = self._entries[id(moved)] = [weakref.ref(moved), {}]
        by = e[1].get(id(order))
        if by is None or by[0] is not order:
            rank = np.empty(order.shape[0], np.int32 if order.shape[0] < 2**31 else np.int64)
            rank[order] = np.arange(order.shape[0])
            by = e[1][id(order)] = (order, rank, moved[order])
        return by[2]

    def mark(self, moved: np.ndarray, ids: np.ndarray) -> None:
        """Mark the prompts `ids` in the views of `moved` (already marked in `moved`)."""
        e = self._entries.get(id(moved))
        if e is not None and e[0]() is moved:
            for _, rank, by in e[1].values():
                by[rank[ids]] = True


def _read_flagged(alpha: np.ndarray, beta: np.ndarray, prior: tuple[float, float], flagged: np.ndarray,
                  ids_of) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(α[ids], β[ids], moved) of m candidates, `flagged` bool[m] their `moved` flags and
    `ids_of(sel)` the prompt ids of the candidates `sel` (an index array or slice): the
    arrays are read only where the flag is set, `moved` (int64, increasing) — every other
    candidate is at the prior; moved is None when most are flagged and all were read."""
    moved = np.flatnonzero(flagged)
    if 2 * moved.size > flagged.size:    # mostly moved (a small or well-explored pool)
        ids = ids_of(slice(None))
        return alpha[ids], beta[ids], None
    a, b = np.full(flagged.shape[0], prior[0]), np.full(flagged.shape[0], prior[1])
    at = ids_of(moved)
    a[moved] = alpha[at]
    b[moved] = beta[at]
    return a, b, moved


def _draw_at_uniform_prior(rng, alpha: np.ndarray, beta: np.ndarray, flagged: np.ndarray,
                           ids_of) -> np.ndarray:
    """float64[m] Thompson draws γ ~ Beta(α[ids], β[ids]) of m candidates when the prior is
    Beta(1, 1): `_read_flagged` then `_beta_draw` with its flat hint, fused — the same calls
    on the generator, so the same draws. α and β are read only for the flagged candidates
    (their prompts may have left the prior), and only those still off Beta(1, 1) get gamma
    draws; every other candidate gets one uniform, in candidate order, without building the
    m-long α, β and flat arrays the two steps pass between them."""
    moved = flagged.nonzero()[0]         # np.flatnonzero of the 1-D mask, without its wrappers
    if 2 * moved.size > flagged.size:    # mostly moved: every candidate read, as _read_flagged
        ids = ids_of(slice(None))
        return _beta_draw(rng, alpha[ids], beta[ids])
    at = ids_of(moved)
    a, b = alpha[at], beta[at]
    off = a != 1.0                       # flagged and still off the prior
    off |= b != 1.0
    n_off = int(np.count_nonzero(off))
    if n_off == 0:
        return rng.random(flagged.size)  # every candidate at Beta(1, 1) = Uniform(0, 1)
    if n_off == moved.size:              # the usual case (with decay 1 a visit always moves a prompt)
        rest, flat = moved, ~flagged
    else:
        rest, a, b = moved[off], a[off], b[off]
        flat = np.ones(flagged.size, dtype=bool)
        flat[rest] = False
    out = np.empty(flagged.size)
    out[flat] = rng.random(flagged.size - rest.size)   # ≥ m / 2 of them: never empty
    out[rest] = _gamma_ratio(rng, a, b)
    return out


def beta_posterior_update(alpha: np.ndarray, beta: np.ndarray, ids: np.ndarray,
                          successes: np.ndarray, failures: np.ndarray, decay: float,
                          prior_alpha: float, prior_beta: float) -> None:
    """In place: apply the MoPPS update for groups (ids[j], successes[j], failures[j]) in
    order j = 0..B−1, equal to the per-group loop, in O(B log B) numpy."""
    if ids.size == 0:
        return
    ordered = np.sort(ids)
    if not np.count_nonzero(ordered[1:] == ordered[:-1]):
        # Every prompt once (the usual batch): with distinct ids the order of the writes does
        # not matter, so the one-term update below runs in batch order — one sort to check,
        # no argsort and no gathers of x. With λ = 1 (the default) 1·α + (0·α0 + x) is the
        # float α + x: an add in place.
        if decay == 1.0:
            alpha[ids] += successes
            beta[ids] += failures
            return
        for param, prior, x in ((alpha, prior_alpha, successes), (beta, prior_beta, failures)):
            param[ids] = decay * param[ids] + ((1.0 - decay) * prior + x)
        return
    order = np.argsort(ids, kind="stable")            # group by prompt, keep batch order
    sid = ids[order]
    first = np.empty(sid.size, dtype=bool)           # first group of each prompt
    first[0] = True
    np.not_equal(sid[1:], sid[:-1], out=first[1:])
    if first.all():
        # Every prompt once (the usual batch): m = 1, so λ^m = λ and the sum has the one
        # term (1 − λ)·prior + x — the same floating-point operations as below.
        for param, prior, x in ((alpha, prior_alpha, successes), (beta, prior_beta, failures)):
            param[sid] = decay * param[sid] + ((1.0 - decay) * prior + x[order])
        return
    start = np.flatnonzero(first)
    uniq = sid[start]
    count = np.diff(np.append(start, sid.size))
    group = np.cumsum(first) - 1
    j = np.arange(sid.size) - start[group]           # occurrence index within the prompt
    w = decay ** (count[group] - 1 - j)              # λ^{m−1−j}
    for param, prior, x in ((alpha, prior_alpha, successes), (beta, prior_beta, failures)):
        inc = np.bincount(group, weights=w * ((1.0 - decay) * prior + x[order]), minlength=uniq.size)
        param[uniq] = decay ** count * param[uniq] + inc


def _beta_draw(rng, a: np.ndarray, b: np.ndarray, flat: np.ndarray | None = None) -> np.ndarray:
    """Beta(a, b) draws as X / (X + Y), X ~ Gamma(a), Y ~ Gamma(b): the same law as
    `rng.beta`, 4× faster at the prior (1, 1) where numpy uses Jöhnk's rejection method.
    In a large pool almost every candidate is still at the uniform prior Beta(1, 1), which is
    Uniform(0, 1): those get one uniform draw each, not two gamma draws (8× cheaper).
    `flat`, when the caller knows it, must equal (a == 1) & (b == 1)."""
    if flat is None:
        flat = (a == 1.0) & (b == 1.0)
    n_flat = int(np.count_nonzero(flat))
    if n_flat:
        out = np.empty(a.shape[0])
        out[flat] = rng.random(n_flat)
        if n_flat < a.shape[0]:
            rest = np.flatnonzero(~flat)
            out[rest] = _gamma_ratio(rng, a[rest], b[rest])   # none of these is flat
        return out
    return _gamma_ratio(rng, a, b)


def _gamma_ratio(rng, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Beta(a, b) draws as X / (X + Y), X ~ Gamma(a), Y ~ Gamma(b) (`_beta_draw` without its
    flat case)."""
    x, y = rng.standard_gamma(a), rng.standard_gamma(b)
    total = np.add(x, y, out=y)
    if total.all():                                # total ≥ 0: all positive, the usual case
        return np.divide(x, total, out=x)
    out = np.divide(x, total, out=np.zeros_like(x), where=total > 0)
    tiny = total <= 0                              # both underflowed: only for shapes ≪ 1
    out[tiny] = rng.beta(a[tiny], b[tiny])
    return out


def _closest(dist: np.ndarray, n: int) -> np.ndarray:
    """Positions of the n smallest of float64[m] `dist` (≥ 0), ordered by distance: an O(m)
    partition, then a stable sort of the n kept (a deterministic output order).

    The partition keeps the values at most a threshold τ ≈ the 2n-th smallest (from a
    partition of every 8th value) or, when fewer than n pass, buckets the values
    (⌊dist · m / max⌋, monotone in dist) and keeps the buckets up to the one that holds
    the n-th smallest, so only about n values go to the sort, and there is no
    `np.argpartition` of all m (half the time for m = 8192, n = 512).
    Exactly the result of `np.argpartition(dist, n − 1)[:n]` sorted stably by distance
    whenever the n + 1 smallest distances are distinct (ties have probability 0 for
    continuous draws); with a tie, which tied value argpartition keeps is its own
    choice, so that case goes through argpartition itself.
    """
    m = dist.size
    if n < m:
        kept = None
        if 16 * n <= m:
            # One threshold first: τ ≈ the 2n-th smallest, read off every 8th value (cheap);
            # when at least n values are ≤ τ they hold the n smallest and every value left
            # out is larger than every one kept (else the buckets below).
            sample = dist[::8]
            tau = np.partition(sample, n // 4)[n // 4]
            kept = np.flatnonzero(dist <= tau)
            if kept.size < n:
                kept = None
        top = float(dist.max()) if kept is None else 0.0
        if kept is None and top > m * 1e-300:                 # m / top is finite
            scale = m / top
            bucket = (dist * scale).astype(np.int64)          # floor, monotone in dist
            last = np.searchsorted(np.cumsum(np.bincount(bucket)), n)  # holds the n-th smallest
            kept = np.flatnonzero(bucket <= last)             # ⊇ the n smallest
        if kept is not None:
            kept = kept[np.argsort(dist[kept], kind="stable")][:n + 1]
            d = dist[kept]
            if (d[1:] != d[:-1]).all():
                return kept[:n]
        keep = np.argpartition(dist, n - 1)[:n]
    else:
        keep = np.arange(m)
    return keep[np.argsort(dist[keep], kind="stable")]


def _by_arm_then_distance(arm: np.ndarray, dist: np.ndarray) -> np.ndarray:
    """`np.lexsort((dist, arm))` (by arm, then distance, then position), 4× faster: an
    introsort of the distances, then a stable radix sort of the arms in that order. The
    first sort is not stable, so with a tie among the distances (probability 0 for
    continuous draws) the order comes from the stable sort instead, as lexsort's does."""
    by_dist = np.argsort(dist)
    d = dist[by_dist]
    if (d[1:] == d[:-1]).any():
        by_dist = np.argsort(dist, kind="stable")
    key = arm.astype(np.int16 if arm.size and arm[-1] < 2**15 else np.int64)[by_dist]
    return by_dist[np.argsort(key, kind="stable")]


def _nearest_in_each_arm(arm: np.ndarray, dist: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """Positions of the keep[a] smallest `dist` of each arm a, arm-major, nearest first, ties
    by position: exactly the first keep[a] of each arm in `np.lexsort((dist, arm))`.

    `arm` int64[m] is non-decreasing (the candidates come arm by arm) and every arm
    0..A−1 has at least keep[a] ≥ 0 candidates. Sorting all m candidates costs ~0.3 ms for
    m = 8192 while only about m / ratio of them are kept, so a threshold (or a histogram)
    first finds a superset of each arm's keep[a] nearest and only those are sorted.

    The superset is sorted once, by the float key arm + dist: for dist in [0, 1] (a squared
    distance between two success rates) the rounded sum is non-decreasing in (arm, dist)
    and never puts a later arm first (arm + dist ≤ arm + 1 ≤ the next arm's key), so when
    no two keys are equal their order is exactly (arm, dist) order; equal keys (a tie in
    dist, or two distances closer than the sum's rounding: probability ~1e-7 per step) or a
    distance above 1 take the exact two-sort order of `_by_arm_then_distance` instead.
    """
    m, n_arms = dist.size, keep.size
    if m == 0:
        return np.zeros(0, np.int64)
    near = _near_enough(arm, dist, keep)
    if near is None:
        kept = _by_histogram(arm, dist, keep)
        sub_arm = arm[kept]
        lens = np.bincount(sub_arm, minlength=n_arms)
    else:
        kept, sub_arm, lens = near
    d = dist[kept]
    key = d + sub_arm
    by = np.argsort(key)
    k = key[by]
    if np.count_nonzero(k[1:] == k[:-1]) or not k.size or d.max() > 1.0:
        by = _by_arm_then_distance(sub_arm, d)
    # by is (arm, distance) order, so arm a's kept candidates are by[s_a : s_a + lens[a]]
    # (s_a = lens[0] + ... + lens[a − 1]): its first keep[a] are its nearest
    if n_arms <= 64:             # a slice per arm beats four [L]-long passes for a few arms
        s, pieces = 0, []
        for n_a, k_a in zip(lens.tolist(), keep.tolist()):
            pieces.append(by[s:s + k_a])
            s += n_a
        return kept[np.concatenate(pieces)]
    limit = (np.cumsum(lens) - lens + keep)[sub_arm]
    return kept[by[np.arange(by.size) < limit]]


def _near_enough(arm: np.ndarray, dist: np.ndarray, keep: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(kept, arm[kept], count of kept per arm): increasing positions `kept` that hold every
    arm's keep[a] nearest (a superset), found with one threshold for all arms: τ ≈ the
    (2·Σ keep)-th smallest distance (read off every 8th candidate: cheap, and only the size
    of the superset depends on it), and every candidate at most τ; an arm with fewer than
    keep[a] of those contributes all its candidates (`arm` is non-decreasing, so an arm's
    candidates are one block). None when that leaves more than a quarter of the candidates
    (arms whose candidates all lie far from the target: a small or well-explored pool), for
    `_by_histogram`. Every candidate left out of an arm that passed is farther than τ ≥ each
    of its keep[a] nearest, ties at τ included, so the first keep[a] of each arm in (arm,
    distance, position) order are the same."""
    m, total = dist.size, int(keep.sum())
    kth = 2 * total
    if kth >= m // 4:
        return None
    sample = dist[::8]
    k8 = min(kth // 8, sample.size - 1)
    tau = np.partition(sample, k8)[k8]
    near = dist <= tau
    kept = near.nonzero()[0]
    sub_arm = arm[kept]
    have = np.bincount(sub_arm, minlength=keep.size)
    short = have < keep
    if np.count_nonzero(short):
        ends = np.searchsorted(arm, np.flatnonzero(short), side="right")
        starts = np.searchsorted(arm, np.flatnonzero(short), side="left")
        if int((ends - starts).sum()) + kth > m // 4:
            return None
        for lo, hi in zip(starts.tolist(), ends.tolist()):
            near[lo:hi] = True
        kept = np.flatnonzero(near)
        sub_arm = arm[kept]
        have = np.bincount(sub_arm, minlength=keep.size)
    return kept, sub_arm, have


def _by_histogram(arm: np.ndarray, dist: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """Increasing positions that hold every arm's keep[a] nearest (a superset): per arm, the
    candidates up to the histogram bucket of |γ − target| = sqrt(dist) that holds its
    keep[a]-th nearest (the bucket is monotone in dist, so every candidate left out is farther
    than every one kept)."""
    m, n_arms = dist.size, keep.size
    root = np.sqrt(dist)
    top = float(root.max())
    if not 0.0 < top < np.inf:                          # every distance 0 (or not finite)
        kept = np.arange(m)
    else:
        nb = max(1, min(256, m // (8 * n_arms)))        # buckets per arm: ~8 candidates each
        # floor, monotone in dist; ≤ nb − 1, as root ≤ top (x·(c/x) rounds to at most c + 1 ulp)
        bucket = (root * ((nb - 1) / top)).astype(np.int64)
        cum = np.bincount(arm * nb + bucket, minlength=n_arms * nb).reshape(n_arms, nb).cumsum(axis=1)
        last = np.count_nonzero(cum < keep[:, None], axis=1)     # bucket of each arm's keep-th
        kept = np.flatnonzero(bucket <= last[arm])
    return kept


def _candidates(rng: np.random.Generator, size: int, n: int, ratio: int) -> np.ndarray:
    """MoPPS's ratio·n candidates among positions 0..size−1: without replacement
    (`Generator.choice`, O(ratio·n) for large pools); every position when ratio·n > size
    ≥ n; with replacement when n > size (nothing else can fill n slots)."""
    m = ratio * n
    if m <= size:
        return rng.choice(size, size=m, replace=False)
    if n <= size:
        return rng.permutation(size)                                # size < ratio·n: O(ratio·n)
    return rng.integers(0, size, size=m)


def _candidates_by_arm(rng: np.random.Generator, offsets: np.ndarray, counts: np.ndarray,
                       ratio: int) -> tuple[np.ndarray, np.ndarray]:
    """MoPPS's candidates inside each arm: (pos int64[m], arm int64[m]) for the arms with
    counts[k] > 0 in arm order — pos indexes the pool's `order` (`Pool.members`, so arm k's
    prompts are order[offsets[k]:offsets[k+1]]), arm numbers those arms 0, 1, ... (the
    index in `np.flatnonzero(counts)`), non-decreasing. Arm k gets what `_candidates` gives
    over its size_k prompts: ratio·counts[k] distinct ones in the usual case.

    The usual case (4·ratio·counts[k] ≤ size_k) is drawn for all such arms at once: i.i.d.
    uniform positions, then the later copy of a position drawn twice is drawn again until all
    are distinct. Each arm's set is then uniform over its subsets of that size — the law of
    `Generator.choice(size_k, m_k, replace=False)`, as the procedure treats every position of
    an arm alike; the candidates come in increasing position (`_distinct_draw`), where
    `Generator.choice` gives a random order, and get their Thompson draws in that order — and
    one draw for all arms replaces one `Generator.choice` call per arm (~25 μs each). Arms
    where that would be a long rejection loop (more than a quarter of the arm wanted) get
    `_candidates` itself, arm by arm, after the common draw.
    """
    if counts.size <= 64 and int(offsets[-1]) <= 1 << 32:
        # A few arms (domains): their ranges in Python numbers, and when every active arm is
        # drawn in common (the usual case), each candidate's uint32 start and float64 width
        # gathered from the arms' (the types `_distinct_draw` computes in) — a few numpy
        # calls instead of a dozen on K-long arrays.
        c, off = counts.tolist(), offsets.tolist()
        act = [k for k, x in enumerate(c) if x]
        m_l = [ratio * c[k] for k in act]
        size_l = [off[k + 1] - off[k] for k in act]
        if all(4 * m_k <= s_k for m_k, s_k in zip(m_l, size_l)):
            reps = np.array(m_l, dtype=np.intp)
            arm = np.arange(len(act)).repeat(reps)
            # each arm's start and width repeated over its block (a block copy per arm, where a
            # gather through `arm` reads an index per candidate)
            lo = np.array([off[k] for k in act], dtype=np.uint32).repeat(reps)
            return _distinct_draw(rng, lo, np.array(size_l, dtype=np.float64).repeat(reps)), arm
    active = np.flatnonzero(counts)
    start, size = offsets[active], offsets[active + 1] - offsets[active]
    m = ratio * counts[active]
    common = 4 * m <= size
    parts = {}
    arm = np.repeat(np.flatnonzero(common), m[common])
    if arm.size:
        if int(offsets[-1]) <= 1 << 32:
            # each candidate's range as uint32 start and float64 width, gathered from the few
            # arms' (the types `_distinct_draw` computes in: no m-long conversions there)
            pos = _distinct_draw(rng, start.astype(np.uint32).take(arm), size.astype(np.float64).take(arm))
        else:
            pos = _distinct_draw(rng, start[arm], size[arm])
        if common.all():
            return pos, arm
        ends = np.cumsum(m[common])
        for j, end, n_j in zip(np.flatnonzero(common).tolist(), ends.tolist(), m[common].tolist()):
            parts[j] = pos[end - n_j:end]
    for j in np.flatnonzero(~common).tolist():
        parts[j] = start[j] + _candidates(rng, int(size[j]), int(counts[active[j]]), ratio)
    pos = np.concatenate([parts[j] for j in range(active.size)])
    arm = np.repeat(np.arange(active.size), [parts[j].size for j in range(active.size)])
    return pos, arm


def _distinct_draw(rng: np.random.Generator, lo: np.ndarray, width: np.ndarray) -> np.ndarray:
    """int64[m] distinct values, in increasing order: entry i uniform in [lo[i], lo[i] +
    width[i]), drawn i.i.d., then every repeated value drawn again (in its own range) until
    none repeats.

    The ranges must be disjoint and increasing blocks of equal entries (each arm's range
    once per candidate of that arm, arm after arm): then entry i of the sorted values lies
    in range i, so a repeat is redrawn in its own range. `lo` and `width` may be any integer
    or float dtype holding integers (the caller may pass uint32 and float64 to spare the
    conversions). The few redraws are checked against the sorted first draws (a search: a
    later copy of a value is equal to its first, so the copies change no answer) and the
    redraws kept before; the kept redraws then take the places of the copies and the values
    are sorted once more (one sort of m nearly sorted values, where removing the copies and
    inserting the redraws in place took two passes of numpy's Python-level delete/insert).
    The sorted order also makes the callers' gathers from N-long arrays run forward through
    memory."""
    u = rng.random(lo.size)
    if lo.size and int(lo[-1]) + int(width[-1]) <= 1 << 32:
        # the values fit in 32 bits (the last range ends highest): numpy sorts those twice as
        # fast, and ⌊u·width⌋ + lo computed in uint32 is the same number
        value = np.multiply(u, width, out=u).astype(np.uint32)
        value += lo if lo.dtype == np.uint32 else lo.astype(np.uint32)
    else:
        value = lo + np.multiply(u, width, out=u).astype(np.int64)
    value.sort()
    again = (value[1:] == value[:-1]).nonzero()[0]
    if again.size:
        again += 1                                                    # every copy after the first
        # The few redraws (tens for m = 8192) in Python, in `again` order: a redraw is kept
        # when no value kept so far (first draws or earlier redraws) has it; the others are
        # drawn again in the next round. ⌊u·width⌋ + lo in Python floats and ints is the
        # number numpy computes (the same double product, truncated).
        low, wide = lo[again].tolist(), width[again].tolist()
        todo = list(range(again.size))
        extra: set = set()
        while todo:
            new = [low[j] + int(u * wide[j]) for j, u in zip(todo, rng.random(len(todo)).tolist())]
            probe = np.array(new, dtype=value.dtype)
            hit = (value.take(value.searchsorted(probe), mode="clip") == probe).tolist()
            left = []
            for j, v, h in zip(todo, new, hit):
                if h or v in extra:
                    left.append(j)
                else:
                    extra.add(v)
            todo = left
        value[again] = list(extra)
        value.sort()
    return value.astype(np.int64, copy=False)


def mopps(ratio: int = 16, target: float = 0.5, decay: float = 1.0, prior_alpha: float = 1.0,
          prior_beta: float = 1.0, prior_strength: float = 0.0, prior_stage_steps: int = 20) -> DataPolicy:
    """MoPPS (arXiv 2507.04632): Thompson-sample Beta posteriors of `ratio`·n candidates, keep the n nearest `target`.

    See the module docstring for the rule and docs/methods/mopps.md.

    Args:
        ratio: candidates per selected prompt (`ts_ratio`; 16 in the math scripts, 8 for
            countdown / geo3k).
        target: γ*, the predicted success rate to aim for (`bandit_target_mean` 0.5).
        decay: λ in [0, 1] (`bandit_decay_ratio`; 1 = plain conjugate counting, the
            default; 0.5 in the countdown / geo3k scripts).
        prior_alpha, prior_beta: Beta prior α0, β0 (1, 1).
        prior_strength: κ ≥ 0 (rlpace's extension, default 0 = off: the paper's rule). With
            κ > 0 a candidate never observed (α, β still at α0, β0) is drawn from
            Beta(α0 + κ·π̂, β0 + κ·(1 − π̂)), π̂ the pass rate a predictor over the prompt's
            features, domain and cluster gives (`rlpace.predict`, refit every
            `prior_stage_steps` updates on all observed groups). Observed prompts keep
            their own posterior.

    Candidates are drawn without replacement (`Generator.choice`, O(ratio·n) for large
    pools); when ratio·n exceeds the pool every prompt is a candidate, and when n itself
    exceeds the pool candidates are drawn with replacement. Cost per step O(ratio·n·log)
    for the draw and sort, O(B log B) for the update; memory 2 floats per prompt.

    Composed with a mixture (`"dump+mopps"`, `compose(dump_ucb(), mopps())`) the mixture
    decides how many prompts each arm gets and MoPPS which ones: n_k ~ Multinomial(n,
    probs) (`split_by_arm`), then the rule above inside each arm — ratio·n_k candidates
    from arm k's prompts (the same three cases with |arm k| for the pool), one Thompson
    draw, the n_k closest to `target` kept; the ids come arm by arm. The candidates of
    the arms where ratio·n_k is at most a quarter of the arm are drawn for all those arms
    at once (`_candidates_by_arm`: the same law, one draw instead of one per arm). Extra
    cost per step: O(K), and a histogram of the distances per arm so that only about n of
    the m ≈ ratio·n candidates are sorted by (arm, distance) (`_nearest_in_each_arm`).
    Without a mixture the pool-wide rule runs exactly as before (the paper's).

    Example (hand-computed, λ = 1): a fresh prompt (α, β) = (1, 1) with 3 of 4 rollouts
    correct becomes (4, 2); with λ = 0.5 it becomes (0.5 + 0.5 + 3, 0.5 + 0.5 + 1) = (4, 2)
    as well, and a second such group gives (0.5·4 + 0.5 + 3, 0.5·2 + 0.5 + 1) = (5.5, 2.5).
    """
    check_int("mopps", "ratio", ratio, hint=" (candidates per selected prompt; MoPPS: 16)")
    check_real("mopps", "target", target, low=0, high=1, hint=" (target success rate; MoPPS: 0.5)")
    check_real("mopps", "decay", decay, low=0, high=1, hint=" (λ; 1 = never forget)")
    check_real("mopps", "prior_alpha", prior_alpha, low=0, low_open=True, hint=" (Beta prior α0)")
    check_real("mopps", "prior_beta", prior_beta, low=0, low_open=True, hint=" (Beta prior β0)")
    check_real("mopps", "prior_strength", prior_strength, low=0,
               hint=" (weight of the predictor prior for unseen prompts; 0 = off)")
    check_int("mopps", "prior_stage_steps", prior_stage_steps, hint=" (updates per predictor stage)")
    pr = predictor(stage_steps=prior_stage_steps, owner="mopps") if prior_strength > 0 else None
    prior = (float(prior_alpha), float(prior_beta))
    views = _MemberOrderViews()

    def init(pool):
        n = len(pool)
        a, b, moved = np.full(n, prior[0]), np.full(n, prior[1]), np.zeros(n, dtype=bool)
        return MoppsState(a, b, moved) if pr is None else MoppsPriorState(a, b, pr.init(pool), moved)

    def update(state, pool, batch):
        if batch.prompt_ids.size == 0:
            return state
        wins = group_wins(batch)                                   # n·s
        losses = batch.rewards.shape[1] - wins                     # n·(1 − s)
        beta_posterior_update(state.alpha, state.beta, batch.prompt_ids, wins, losses,
                              decay, prior_alpha, prior_beta)
        if state.moved is not None:      # the same writes mark the prompts (and their views)
            state.moved[batch.prompt_ids] = True
            views.mark(state.moved, batch.prompt_ids)
        if pr is not None:
            g = float(batch.rewards.shape[1])
            b = batch.prompt_ids.shape[0]
            state = state._replace(predictor=pr.update(state.predictor, pool, batch.prompt_ids, wins,
                                                       np.full(b, g), np.ones(b)))
        return state

    def apply(state, pool, n, probs, arms, rng):
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        moved = state.moved
        if moved is None:                                           # a state built by hand
            moved = moved_from_values(state.alpha, state.beta, *prior)
        if probs is None:                                           # the paper's rule, pool-wide
            cand, counts = _candidates(rng, len(pool), n, ratio), None
            flagged = moved[cand]

            def ids_of(sel):
                return cand[sel]
        else:                                                       # per arm: n_k, then the rule
            counts, order, offsets = split_by_arm(pool, n, probs, arms, rng, "mopps")
            pos, arm = _candidates_by_arm(rng, offsets, counts, ratio)
            # candidates stay member positions (`pos`, increasing); prompt ids only where needed
            flagged = (views.view(moved, order) if state.moved is not None else moved[order])[pos]

            def ids_of(sel):
                return order[pos[sel]]
        if pr is None and prior == (1.0, 1.0):                     # the paper's prior Beta(1, 1)
            gamma = _draw_at_uniform_prior(rng, state.alpha, state.beta, flagged, ids_of)
        else:
            a, b, _ = _read_flagged(state.alpha, state.beta, prior, flagged, ids_of)
            if pr is not None:
                unseen = (a == prior_alpha) & (b == prior_beta)
                if unseen.any():
                    pi = pr.predict(state.predictor, pool, ids_of(unseen))
                    a, b = a.copy(), b.copy()
                    a[unseen] += prior_strength * pi
                    b[unseen] += prior_strength * (1.0 - pi)
            gamma = _beta_draw(rng, a, b)                              # Thompson draw
        dist = np.square(np.subtract(gamma, target, out=gamma), out=gamma)   # (γ − target)²
        if counts is None:
            return ids_of(_closest(dist, n)).astype(np.int64)
        # Each arm keeps its counts[k] candidates closest to the target among its own
        # (`cand` holds the arms' candidates one arm after another): the first counts[k] of
        # each arm in the order (arm, distance) — `_closest` per arm, without a Python loop
        # over hundreds of clusters.
        return ids_of(_nearest_in_each_arm(arm, dist, counts[counts > 0])).astype(np.int64, copy=False)

    def check_state(state, pool):
        if state.moved is not None:
            # a restored mask must mark every prompt off the prior, or those prompts would be
            # drawn from the prior: a stale mask is refused, not repaired
            stale = moved_from_values(state.alpha, state.beta, *prior) & ~state.moved
            if stale.any():
                raise bad("policy/selection/moved", "leaves prompts whose (alpha, beta) left the prior "
                          "unmarked", state.alpha, stale)
        if pr is not None:
            check_predictor_state(state.predictor, "predictor")

    return DataPolicy(SELECTION, init, update, apply, name="mopps", check_state=check_state,
                      follows_mixture=True)
