"""ADS online part: a cluster-level EMA mixer and a per-cluster boundary window.

Xu, Zhang, et al., "Learning at the Right Pace: Adaptive Data Scheduling Improves LLM
Reinforcement Learning", arXiv 2606.22305, from `Richard-zrx/ADS`
`verl/verl/experimental/dataset/ads_sampler.py`; docs/methods/ads.md.
The offline part (embed → cluster, NLL → rank) fills `Pool(clusters=..., ranks=...)`;
without clusters the Pool's clusters are its domains, and without ranks prompts are
ranked by `difficulty`, else by position.

Per step, with ρ the pass rate of one prompt's group:

  * mixer (`ads_cluster_ema`): r_k := mean ρ over this batch's groups of cluster k (only
    clusters present; others keep a stale r_k, initially r_init = 0.5); p̂ = r / Σr
    (uniform if Σr = 0); p ← (1 − α)·p + α·p̂, renormalised. Note this tilts towards
    clusters with *higher* success ("solidify progress"); the 50 % targeting lives in
    the window.
  * window (`ads_boundary_window`): each cluster k keeps a set M_k of B distinct
    positions in its easy → hard order, initially the easiest B. A group whose prompt
    sits at a position of M_k asks to move it −1 (ρ < 0.5 − ε, too hard), +1
    (ρ > 0.5 + ε, too easy) or not at all; stayers keep their slot, then easier-movers
    in ascending and harder-movers in descending order each take the nearest free slot
    (preferring the requested direction, clamped to [0, size − 1]).
  * admission (`drop_all_wrong`): groups whose rollouts all fail leave the loss.
  * epoch reset: after `epoch_reset_steps` updates, p, r and every M_k start over
    (default len(pool) // (active_clusters · B), at least 1; 0 disables the reset).

Cost: the mixer is O(C) per step for C clusters; the window is O(batch · log batch + U · B)
numpy for the U clusters the batch touches, plus a Python loop over the windows of those
clusters and their movers (≤ U · B), never over the pool.

Deviations from the reference code, all forced by `propose(n)` returning exactly n ids
or by our records:
  * ρ uses success = reward ≥ the Scheduler's threshold (the code: `acc` clipped to
    [0, 1], else reward > 0).
  * Clusters are drawn without replacement ∝ p by Gumbel-top-k (the same law as the
    code's `rng.choice(replace=False, p=p)`, Kool et al. 2019), and windows are emitted
    cluster after cluster until n prompts are filled: ceil(n / B) clusters when every
    cluster has ≥ B prompts, the last one truncated (its hardest positions dropped);
    smaller clusters make room for further clusters; when every cluster with p > 0 has
    been used, the same draw order repeats. The code always emits exactly
    `active_clusters` whole windows, so faithful use is propose(active_clusters · B).
  * A prompt listed twice in one batch: both groups count towards r_k; the window uses
    the direction of the last group (the code's per-position dict, last write wins).
  * An empty batch is a no-op (the code would still smooth p and count the step).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ._admission import drop_all_wrong
from ._base import MIXTURE, SELECTION, DataPolicy, Method
from ._compose import compose
from ._checks import check_int, check_real
from ._state_checks import bad, check_range

__all__ = ["ads", "ads_cluster_ema", "ads_boundary_window", "move_window"]


def _check_reset(epoch_reset_steps) -> None:
    if epoch_reset_steps is not None:
        check_int("ads", "epoch_reset_steps", epoch_reset_steps, low=0,
                  hint=" (0 = never reset), or None for one pass over the pool")


def _reset_every(epoch_reset_steps, pool, prompts_per_step: int) -> int:
    if epoch_reset_steps is None:
        return max(1, len(pool) // max(1, prompts_per_step))
    return int(epoch_reset_steps)


# ---- the inter-cluster mixer --------------------------------------------------------------
class ClusterEmaState(NamedTuple):
    rate: np.ndarray   # float64[C] running success rate r_k (stale when not sampled)
    prob: np.ndarray   # float64[C] sampling distribution p over clusters
    steps: np.ndarray  # int64[] updates since the last epoch reset
    #: value rules `Scheduler.load_state_dict` checks for each field (policies/_state_checks.py)
    STATE_RULES = {"rate": "unit", "prob": "prob", "steps": "nonneg"}


def ads_cluster_ema(alpha: float = 0.3, r_init: float = 0.5, epoch_reset_steps: int | None = None,
                    epoch_prompts: int = 128) -> DataPolicy:
    """ADS inter-cluster mixer: p ← (1 − α)·p + α·r/Σr over clusters (arXiv 2606.22305, Eq. 4).

    Args:
        alpha: EMA step α (ADS: 0.3).
        r_init: initial and reset success rate of every cluster (ADS: 0.5).
        epoch_reset_steps: updates between full resets of p and r; None →
            len(pool) // epoch_prompts (at least 1); 0 → never.
        epoch_prompts: prompts per step assumed by the default epoch length (ADS:
            4 clusters × 32 = 128; `ads()` passes active_clusters · mini_cluster_size).

    Example (hand-computed): 2 clusters, α = 0.5, a batch where cluster 0 has ρ = 1 and
    cluster 1 is absent: r = [1, 0.5], p̂ = [2/3, 1/3], p = 0.5·[0.5, 0.5] + 0.5·p̂ =
    [0.5833, 0.4167].
    """
    check_real("ads", "alpha", alpha, low=0, high=1, hint=" (EMA step; ADS: 0.3)")
    check_real("ads", "r_init", r_init, low=0, high=1, hint=" (initial success rate; ADS: 0.5)")
    _check_reset(epoch_reset_steps)
    check_int("ads", "epoch_prompts", epoch_prompts)

    def init(pool):
        c = pool.n_clusters
        return ClusterEmaState(np.full(c, float(r_init)), np.full(c, 1.0 / c), np.array(0, np.int64))

    def update(state, pool, batch):
        if batch.prompt_ids.size == 0:
            return state
        c = state.rate.shape[0]
        count = np.bincount(batch.clusters, minlength=c)
        total = np.bincount(batch.clusters, weights=batch.pass_rate, minlength=c)
        seen = count > 0
        state.rate[seen] = total[seen] / count[seen]
        rate_sum = state.rate.sum()
        target = state.rate / rate_sum if rate_sum > 0 else np.full(c, 1.0 / c)
        state.prob[:] = (1.0 - alpha) * state.prob + alpha * target
        state.prob[:] /= state.prob.sum()
        state.steps[...] += 1
        every = _reset_every(epoch_reset_steps, pool, epoch_prompts)
        if every > 0 and state.steps >= every:
            state.rate[:] = r_init
            state.prob[:] = 1.0 / c
            state.steps[...] = 0
        return state

    def apply(state, pool, *_):
        return state.prob.copy()

    def metrics(state, pool):
        p = state.prob
        return {"ads/prob_max": float(p.max()), "ads/prob_min": float(p.min()),
                "ads/prob_entropy": float(-(p * np.log(np.maximum(p, 1e-300))).sum()),
                "ads/success_rate_mean": float(state.rate.mean()),
                "ads/steps_in_epoch": float(state.steps)}

    return DataPolicy(MIXTURE, init, update, apply, arms="cluster", name="ads_cluster_ema",
                      metrics=metrics)


# ---- the per-cluster boundary window -------------------------------------------------------
class BoundaryWindowState(NamedTuple):
    positions: np.ndarray  # int64[C, Bmax] M_k sorted ascending in [:width_k], −1 after
    width: np.ndarray      # int64[C] B_k = min(B, cluster size)
    steps: np.ndarray      # int64[] updates since the last epoch reset
    last_moves: np.ndarray  # int64[3] last batch's in-window groups: too hard, keep, too easy
    #: value rules `Scheduler.load_state_dict` checks for each field (policies/_state_checks.py)
    STATE_RULES = {"width": "nonneg", "steps": "nonneg", "last_moves": "nonneg"}

    def check_values(self, key: str, pool) -> None:
        """Each cluster's window inside the cluster: width ≤ size, positions in [0, size)."""
        if pool is None:
            return
        pos, width = np.asarray(self.positions), np.asarray(self.width)
        sizes = np.bincount(pool.clusters, minlength=pool.n_clusters)
        if width.shape != sizes.shape:
            return                                         # caught by the shape check
        check_range(f"{key}width", width - sizes, None, 0, high_open=False)   # width ≤ cluster size
        cols = np.arange(pos.shape[1])[None, :]
        too_big = (cols < width[:, None]) & ((pos < 0) | (pos >= sizes[:, None]))
        if too_big.any():
            raise bad(f"{key}positions", "has window positions outside their cluster [0, size)",
                      pos, too_big)


def _nearest_free(desired: int, direction: int, taken: set, size: int) -> int:
    """Nearest slot to `desired` (clamped to [0, size)) that is not taken, searching
    outwards and trying the requested direction first at each distance."""
    d = min(max(desired, 0), size - 1)
    if d not in taken:
        return d
    for radius in range(1, size):
        for cand in (d + direction * radius, d - direction * radius):
            if 0 <= cand < size and cand not in taken:
                return cand
    raise RuntimeError("no free slot: the window covers the whole cluster")  # guarded by caller


def move_window(window, directions: dict, size: int) -> list[int]:
    """One ADS window move (arXiv 2606.22305, Eq. 5–7; docs/methods/ads.md).

    Args:
        window: the B current positions of M_k (any order).
        directions: position → −1 (move easier), 0 (stay), +1 (move harder); positions
            not listed stay.
        size: cluster size; positions live in [0, size).

    Returns the new sorted positions: stayers keep their slot, then easier-movers in
    ascending order and harder-movers in descending order each take the nearest free
    slot to pos ∓ 1, preferring the requested direction. A window that covers its whole
    cluster cannot move. Always B distinct positions.

    >>> move_window([3, 4, 5], {3: -1, 4: -1, 5: +1}, 10)
    [2, 3, 6]
    >>> move_window([0, 1, 2], {0: -1, 1: -1, 2: -1}, 10)   # clamped at the easy end
    [0, 1, 2]
    """
    window = [int(p) for p in window]
    if size <= len(window):
        return sorted(window)
    get = directions.get
    stay, easier, harder = [], [], []
    for p in window:
        d = get(p, 0)
        if d == 0:
            stay.append(p)
        elif d < 0:
            easier.append(p)
        elif d > 0:
            harder.append(p)
    last = size - 1
    to_easier = [min(max(p - 1, 0), last) for p in sorted(easier)]
    to_harder = [min(max(p + 1, 0), last) for p in sorted(harder, reverse=True)]
    return _place(set(stay), to_easier, to_harder, size)


def _place(taken: set, to_easier: list, to_harder: list, size: int) -> list[int]:
    """The greedy of `move_window`, given the stayers `taken` (a set, filled in place) and
    the slots the movers ask for: `to_easier` (pos − 1 of the easier-movers, ascending)
    then `to_harder` (pos + 1 of the harder-movers, descending), each clamped to
    [0, size). Each mover takes its slot if free, else the nearest free one, trying its
    own direction first at each distance.

    A phase whose requested slots are distinct and all free is placed at once: each mover
    then finds its slot free at its turn, exactly as in the loop.
    """
    for wanted, direction in ((to_easier, -1), (to_harder, +1)):
        targets = set(wanted)
        if len(targets) == len(wanted) and taken.isdisjoint(targets):
            taken |= targets
            continue
        for d in wanted:
            if d in taken:
                d = _nearest_free(d, direction, taken, size)
            taken.add(d)
    return sorted(taken)


def _cluster_weights(pool, probs, arms) -> np.ndarray:
    """float64[C] unnormalised weight of each cluster from the mixture the Scheduler
    passes: cluster probs as they are; domain probs spread over each domain's clusters
    in proportion to their share of the domain; None → equal weights."""
    c = pool.n_clusters
    if probs is None:
        return np.ones(c)
    p = np.asarray(probs, dtype=np.float64)
    if arms == "cluster":
        return p
    key = "ads/domain_to_cluster"                      # float64[K, C], rows sum to 1
    if key not in pool._cache:
        m = pool.domain_cluster_counts()
        pool._cache[key] = m / m.sum(axis=1, keepdims=True)
    return p @ pool._cache[key]


def _in_window_groups(state: BoundaryWindowState, pool, k: np.ndarray, pos: np.ndarray,
                      direction: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(cluster, position, direction) of the batch's groups whose prompt sits in its
    cluster's window M_k, sorted by (cluster, position), batch order kept among repeats.

    One sort of the batch and a binary search in the windows of the clusters it touches:
    O(B log B + U·Bmax) for U touched clusters, instead of comparing every group with every
    slot of its cluster's window (O(B·Bmax), the bulk of an ADS step).
    """
    span = len(pool) + 1                                       # key = cluster·span + position
    key = k * span + pos
    order = np.argsort(key, kind="stable")
    key, k, pos, direction = key[order], k[order], pos[order], direction[order]
    touched = k[np.flatnonzero(np.concatenate(([True], k[1:] != k[:-1])))]
    rows = state.positions[touched]                            # [U, Bmax] sorted, −1 padding
    # Padding becomes position N (> any real position): each row stays sorted, and so does
    # the whole key table, cluster after cluster.
    table = (np.where(rows >= 0, rows, span - 1) + (touched * span)[:, None]).ravel()
    at = np.minimum(np.searchsorted(table, key), table.size - 1)
    hit = table[at] == key
    return k[hit], pos[hit], direction[hit]


def _move_windows(state: BoundaryWindowState, pool, k: np.ndarray, pos: np.ndarray,
                  direction: np.ndarray) -> None:
    """`move_window` for every cluster with in-window feedback (in place), from the batch's
    in-window groups (cluster k, rank position pos, direction) sorted by (cluster,
    position), batch order kept among repeats (`_in_window_groups`).

    The same moves as building `{pos: direction}` per cluster (last group wins) and
    calling `move_window` on each, with the grouping done in numpy instead of a dict
    insert per group and three dict lookups per window slot. Python is left with the
    greedy over the movers of the touched clusters.
    """
    last = np.ones(k.size, dtype=bool)
    last[:-1] = (k[1:] != k[:-1]) | (pos[1:] != pos[:-1])     # the last group of each prompt wins
    k, pos, direction = k[last], pos[last], direction[last]
    starts = np.flatnonzero(np.concatenate(([True], k[1:] != k[:-1])))
    touched = k[starts]
    _, offsets = pool.by_rank()
    sizes = offsets[touched + 1] - offsets[touched]
    # Slots the movers ask for, pos ∓ 1 clamped to the cluster, for all touched clusters
    # at once: grouped by cluster, easier-movers ascending, harder-movers ascending (each
    # cluster's slice is reversed below: harder-movers go in descending order).
    is_easier, is_harder = direction < 0, direction > 0
    k_e, k_h, pos_e, pos_h = k[is_easier], k[is_harder], pos[is_easier], pos[is_harder]
    # clamped to [0, size_k − 1] (np.clip's values, without its wrapper); pos ± 1 stays
    # within [−1, size_k], so one bound each suffices
    want_easier = np.maximum(pos_e - 1, 0)
    want_harder = np.minimum(pos_h + 1, (offsets[k_h + 1] - offsets[k_h]) - 1)
    e_end = np.searchsorted(k_e, touched, side="right").tolist()
    h_end = np.searchsorted(k_h, touched, side="right").tolist()
    easier, harder = pos_e.tolist(), pos_h.tolist()
    want_easier, want_harder = want_easier.tolist(), want_harder.tolist()
    e_lo = h_lo = 0
    widths = state.width[touched].tolist()
    for kk, size, w, e_hi, h_hi in zip(touched.tolist(), sizes.tolist(), widths, e_end, h_end):
        window = state.positions[kk, :w].tolist()
        if size <= w:                                          # covers its cluster: cannot move
            state.positions[kk, :w] = sorted(window)
        else:
            stay = set(window)
            stay.difference_update(easier[e_lo:e_hi])
            stay.difference_update(harder[h_lo:h_hi])
            to_harder = want_harder[h_lo:h_hi]
            to_harder.reverse()                                # harder-movers descending
            state.positions[kk, :w] = _place(stay, want_easier[e_lo:e_hi], to_harder, size)
        e_lo, h_lo = e_hi, h_hi


def ads_boundary_window(active_clusters: int = 4, mini_cluster_size: int = 32, eps: float = 0.17,
                        epoch_reset_steps: int | None = None) -> DataPolicy:
    """ADS intra-cluster selection: emit the boundary windows M_k of clusters drawn ∝ p.

    ADS (arXiv 2606.22305); see the module docstring for the rule and for how n ≠ active_clusters · B is handled.

    Args:
        active_clusters: clusters per step in ADS (4); sets the default epoch
            length len(pool) // (active_clusters · mini_cluster_size).
        mini_cluster_size: B, positions per window (32); B_k = min(B, cluster size).
        eps: keep band ρ ∈ [0.5 − ε, 0.5 + ε] (0.17).
        epoch_reset_steps: updates between resets of every window to its easiest B_k;
            None → the default above (at least 1); 0 → never.

    Example: window {3, 4, 5} of a 10-prompt cluster with ρ = (0, 0, 1) at those
    positions moves to {2, 3, 6} (see `move_window`).
    """
    check_int("ads", "active_clusters", active_clusters, hint=" (ADS: 4)")
    check_int("ads", "mini_cluster_size", mini_cluster_size, hint=" (ADS: 32)")
    check_real("ads", "eps", eps, low=0, high=0.5, hint=" (keep band 0.5 ± eps; ADS: 0.17)")
    _check_reset(epoch_reset_steps)
    per_step = int(active_clusters) * int(mini_cluster_size)

    def _reset(state):
        cols = np.arange(state.positions.shape[1])
        state.positions[:] = np.where(cols < state.width[:, None], cols, -1)

    def init(pool):
        _, offsets = pool.by_rank()
        width = np.minimum(np.diff(offsets), mini_cluster_size).astype(np.int64)
        state = BoundaryWindowState(np.empty((width.shape[0], int(width.max())), np.int64), width,
                                    np.array(0, np.int64), np.zeros(3, np.int64))
        _reset(state)
        return state

    def update(state, pool, batch):
        if batch.prompt_ids.size == 0:
            return state
        rho = batch.pass_rate
        direction = (rho > 0.5 + eps).astype(np.int64) - (rho < 0.5 - eps)   # +1, −1 or 0
        k, pos, d_in = _in_window_groups(state, pool, batch.clusters,
                                         pool.rank_position()[batch.prompt_ids], direction)
        state.last_moves[:] = np.bincount(d_in + 1, minlength=3)   # (−1, 0, +1) counts
        if d_in.size:
            _move_windows(state, pool, k, pos, d_in)
        state.steps[...] += 1
        every = _reset_every(epoch_reset_steps, pool, per_step)
        if every > 0 and state.steps >= every:
            _reset(state)
            state.steps[...] = 0
        return state

    def apply(state, pool, n, probs, arms, rng):
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        order, offsets = pool.by_rank()
        p = _cluster_weights(pool, probs, arms)
        p = np.where(np.isfinite(p) & (p > 0), p, 0.0)
        if not p.sum() > 0:
            p = np.ones_like(p)                                     # the code's uniform fallback
        cand = np.flatnonzero(p)
        keys = np.log(p[cand]) + rng.gumbel(size=cand.size)         # Gumbel-top-k = draws ∝ p
        seq = cand[np.argsort(-keys, kind="stable")]                # without replacement
        per_pass = int(state.width[seq].sum())
        passes = -(-n // per_pass)
        if passes > 1:
            seq = np.tile(seq, passes)                              # cycle when clusters run out
        used = int(np.searchsorted(np.cumsum(state.width[seq]), n)) + 1
        seq = seq[:used]
        rows = offsets[seq][:, None] + state.positions[seq]         # [used, Bmax]
        valid = np.arange(rows.shape[1]) < state.width[seq][:, None]
        return order[rows[valid][:n]]

    def metrics(state, pool):
        _, offsets = pool.by_rank()
        size = np.diff(offsets)
        valid = state.positions >= 0
        mean_pos = np.where(valid, state.positions, 0).sum(axis=1) / state.width
        frac = mean_pos / np.maximum(size - 1, 1)
        too_hard, keep, too_easy = state.last_moves.tolist()
        return {"ads/window_position_frac": float(frac.mean()), "ads/batch_too_hard": float(too_hard),
                "ads/batch_keep": float(keep), "ads/batch_too_easy": float(too_easy)}

    return DataPolicy(SELECTION, init, update, apply, name="ads_boundary_window", metrics=metrics,
                      follows_mixture=True)   # clusters drawn ∝ the mixture (_cluster_weights)


def ads(alpha: float = 0.3, r_init: float = 0.5, active_clusters: int = 4, mini_cluster_size: int = 32,
        eps: float = 0.17, epoch_reset_steps: int | None = None) -> Method:
    """ADS (arXiv 2606.22305): cluster EMA mixer, boundary-window selection, all-wrong groups dropped.

    docs/methods/ads.md.

    Defaults are `train_ads.sh`'s: α = 0.3, r_init = 0.5, 4 active clusters, B = 32,
    ε = 0.17, an epoch reset every len(pool) // 128 updates. Needs `Pool(clusters=...,
    ranks=...)` (or `difficulty=`) from the offline pipeline to mean what ADS means.
    Faithful batches: `propose(active_clusters * mini_cluster_size)` (= 128).

    >>> import numpy as np; from rlpace import Pool, Scheduler
    >>> pool = Pool(["a"] * 40 + ["b"] * 40)      # clusters = domains, ranks = position
    >>> s = Scheduler(pool, "ads", active_clusters=2, mini_cluster_size=4)
    >>> sorted(s.propose(8).tolist())             # the easiest 4 of both clusters
    [0, 1, 2, 3, 40, 41, 42, 43]
    """
    window = ads_boundary_window(active_clusters, mini_cluster_size, eps, epoch_reset_steps)  # validates
    mixer = ads_cluster_ema(alpha, r_init, epoch_reset_steps,
                            epoch_prompts=int(active_clusters) * int(mini_cluster_size))
    return compose(mixer, window, drop_all_wrong(), name="ads")
