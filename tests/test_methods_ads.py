"""ADS online part (arXiv 2606.22305; docs/methods/ads.md): window moves, cluster EMA, epoch reset,
selection of windows, admission, and the registered "ads" method end to end."""

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlpace import Feedback, Pool, Scheduler
from rlpace.policies import (ads, ads_boundary_window, ads_cluster_ema, compose, fixed_mixture,
                             move_window)
from rlpace.types import Batch


def batch(pool, ids, rewards, advantages=None):
    return Batch.from_feedback(Feedback(ids, rewards, advantages, step=0), pool, 0.5)


def rows(pass_rates, g=4):
    """Binary reward rows with the given pass rates (each a multiple of 1/g)."""
    out = np.zeros((len(pass_rates), g))
    for i, r in enumerate(pass_rates):
        out[i, :int(round(r * g))] = 1.0
    return out


# ---- move_window: the card's collision rules ---------------------------------------------
@pytest.mark.parametrize("window, dirs, size, expected", [
    # easier-movers ascending (3 → 2, then 4 → 3), harder-mover 5 → 6
    ([3, 4, 5], {3: -1, 4: -1, 5: +1}, 10, [2, 3, 6]),
    # clamped at the easy end: 0 → −1 → 0; 1 → 0 taken → nearest free 1; 2 → 1 taken → 2
    ([0, 1, 2], {0: -1, 1: -1, 2: -1}, 10, [0, 1, 2]),
    # clamped at the hard end (size 5), harder-movers descending: 4 → 5 → 4; 3 → 4 taken,
    # 5 out of range → 3; 2 → 3 taken, 4 taken → 2
    ([2, 3, 4], {2: +1, 3: +1, 4: +1}, 5, [2, 3, 4]),
    # stayers 2 and 4 hold their slots; 3 → 2 taken → prefers easier: 1
    ([2, 3, 4], {3: -1}, 10, [1, 2, 4]),
    # a swap: easier 5 → 4 (free, the 4 moves away), then harder 4 → 5
    ([4, 5], {4: +1, 5: -1}, 10, [4, 5]),
    # stayer 4; harder 5 → 6 clamped to 5 (size 6); harder 3 → 4 taken, 5 taken → 3
    ([3, 4, 5], {3: +1, 4: 0, 5: +1}, 6, [3, 4, 5]),
    # gap closes at the easy end: 0 → 0, 2 → 1, 3 → 2
    ([0, 2, 3], {0: -1, 2: -1, 3: -1}, 10, [0, 1, 2]),
    # a harder-mover jumps over a stayer: 1 → 2 taken → 3 (requested direction first)
    ([1, 2], {1: +1, 2: 0}, 10, [2, 3]),
    # the window covers the whole cluster: nothing can move
    ([0, 1, 2], {0: +1, 1: +1, 2: +1}, 3, [0, 1, 2]),
    # positions without feedback stay
    ([5, 6, 7], {}, 10, [5, 6, 7]),
])
def test_move_window_hand_cases(window, dirs, size, expected):
    assert move_window(window, dirs, size) == expected


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_move_window_invariants(data):
    size = data.draw(st.integers(1, 30))
    b = data.draw(st.integers(1, size))
    window = sorted(data.draw(st.sets(st.integers(0, size - 1), min_size=b, max_size=b)))
    dirs = {p: data.draw(st.sampled_from([-1, 0, 1])) for p in window}
    out = move_window(window, dirs, size)
    assert len(out) == b == len(set(out))                 # exactly B distinct positions
    assert all(0 <= p < size for p in out)
    if size > b:                                          # stayers keep their slot
        assert {p for p in window if dirs[p] == 0} <= set(out)


# ---- the window as a policy over a Pool ---------------------------------------------------
def test_window_moves_through_ranks_not_ids():
    # One cluster of 10; difficulty descending, so the easiest prompt is id 9: rank
    # position r is prompt id 9 − r.
    pool = Pool(["a"] * 10, difficulty=np.arange(10)[::-1].astype(float))
    win = ads_boundary_window(active_clusters=1, mini_cluster_size=3, eps=0.17, epoch_reset_steps=0)
    st_ = win.init(pool)
    assert st_.positions.tolist() == [[0, 1, 2]]
    ids = win.apply(st_, pool, 3, None, None, np.random.default_rng(0))
    assert ids.tolist() == [9, 8, 7]
    # ρ: id 9 (pos 0) = 1 → +1; id 8 (pos 1) = 0.5 → keep; id 7 (pos 2) = 1 → +1;
    # id 0 (pos 9) is outside the window: ignored. Harder-movers descending: 2 → 3,
    # then 0 → 1 taken (stayer) → 2 (free, towards harder first).
    st_ = win.update(st_, pool, batch(pool, [9, 8, 7, 0], rows([1.0, 0.5, 1.0, 0.0])))
    assert st_.positions.tolist() == [[1, 2, 3]]
    assert st_.last_moves.tolist() == [0, 1, 2]           # too hard, keep, too easy
    assert win.apply(st_, pool, 3, None, None, np.random.default_rng(0)).tolist() == [8, 7, 6]


def test_window_band_edges_and_duplicates():
    pool = Pool(["a"] * 10)                               # ranks = position
    win = ads_boundary_window(active_clusters=1, mini_cluster_size=3, eps=0.17, epoch_reset_steps=0)
    st_ = win.init(pool)
    # G = 4: ρ = 0.25 < 0.33 → −1 (clamped at 0); ρ = 0.5 keep; ρ = 0.75 > 0.67 → +1.
    st_ = win.update(st_, pool, batch(pool, [0, 1, 2], rows([0.25, 0.5, 0.75])))
    assert st_.positions.tolist() == [[0, 1, 3]]
    # The same prompt twice: the last group decides. Prompt 3: ρ = 0 then 1 → +1 → 4.
    st_ = win.update(st_, pool, batch(pool, [3, 3], rows([0.0, 1.0])))
    assert st_.positions.tolist() == [[0, 1, 4]]
    # ρ = 1 then 0 → −1: 4 → 3.
    st_ = win.update(st_, pool, batch(pool, [4, 4], rows([1.0, 0.0])))
    assert st_.positions.tolist() == [[0, 1, 3]]
    # G = 3, ρ = 1/3 > 0.5 − 0.17 = 0.33: keep.
    st_ = win.update(st_, pool, batch(pool, [3], [[1.0, 0.0, 0.0]]))
    assert st_.positions.tolist() == [[0, 1, 3]]


def test_window_epoch_reset_and_default_length():
    pool = Pool(["a"] * 20 + ["b"] * 20)
    win = ads_boundary_window(active_clusters=2, mini_cluster_size=4, epoch_reset_steps=2)
    st_ = win.init(pool)
    assert st_.positions.tolist() == [[0, 1, 2, 3], [0, 1, 2, 3]]
    st_ = win.update(st_, pool, batch(pool, [0, 1, 2, 3], rows([1, 1, 1, 1])))
    assert st_.positions[0].tolist() == [1, 2, 3, 4]      # all four moved harder
    assert int(st_.steps) == 1
    st_ = win.update(st_, pool, batch(pool, [20], rows([1.0])))
    assert st_.positions.tolist() == [[0, 1, 2, 3], [0, 1, 2, 3]]   # 2nd update → reset
    assert int(st_.steps) == 0
    # Default: len(pool) // (active_clusters · B) = 40 // 8 = 5 updates.
    win = ads_boundary_window(active_clusters=2, mini_cluster_size=4)
    st_ = win.init(pool)
    for i in range(4):                                    # feed cluster a's window, all too easy
        ids = st_.positions[0].copy()                     # ranks = position in cluster a
        st_ = win.update(st_, pool, batch(pool, ids, rows([1, 1, 1, 1])))
    assert st_.positions[0].tolist() == [4, 5, 6, 7] and int(st_.steps) == 4
    st_ = win.update(st_, pool, batch(pool, [4], rows([1.0])))
    assert st_.positions[0].tolist() == [0, 1, 2, 3]


def test_window_small_cluster_and_empty_batch():
    pool = Pool(["a"] * 3 + ["b"] * 10)
    win = ads_boundary_window(active_clusters=1, mini_cluster_size=4)
    st_ = win.init(pool)
    assert st_.width.tolist() == [3, 4]
    assert st_.positions.tolist() == [[0, 1, 2, -1], [0, 1, 2, 3]]
    before = [a.copy() for a in st_]
    st_ = win.update(st_, pool, batch(pool, np.zeros(0, np.int64), np.zeros((0, 4))))
    assert all((a == b).all() for a, b in zip(st_, before))   # B = 0: no-op
    st_ = win.update(st_, pool, batch(pool, [0, 1, 2], rows([1, 1, 1])))
    assert st_.positions[0].tolist() == [0, 1, 2, -1]          # covers its cluster: no move


def test_window_fills_n_by_truncating_and_cycling():
    pool = Pool(np.repeat(["a", "b", "c"], 10))
    win = ads_boundary_window(active_clusters=3, mini_cluster_size=4)
    st_ = win.init(pool)
    # n = 10, B = 4: ceil(10/4) = 3 clusters, the last one truncated to its 2 easiest.
    ids = win.apply(st_, pool, 10, None, None, np.random.default_rng(1))
    per_cluster = np.bincount(pool.clusters[ids], minlength=3)
    assert sorted(per_cluster.tolist()) == [2, 4, 4]
    assert len(set(ids.tolist())) == 10
    last = pool.clusters[ids[-1]]
    assert sorted(pool.rank_position()[ids[pool.clusters[ids] == last]].tolist()) == [0, 1]
    # Two clusters of 3 and 2 prompts (windows 3 and 2), n = 12: windows cycle.
    small = Pool(["a"] * 3 + ["b"] * 2)
    win = ads_boundary_window(mini_cluster_size=4)
    ids = win.apply(win.init(small), small, 12, None, None, np.random.default_rng(0))
    counts = np.bincount(ids, minlength=5)
    assert ids.size == 12 and set(counts.tolist()) <= {2, 3}


def test_window_draws_clusters_in_proportion_without_replacement():
    # Gumbel-top-k: first cluster ∝ p, second ∝ p among the rest.
    pool = Pool(np.repeat([0, 1, 2], 4))
    win = ads_boundary_window(mini_cluster_size=4)
    st_ = win.init(pool)
    p = np.array([0.7, 0.2, 0.1])
    rng = np.random.default_rng(0)
    firsts, pairs = np.zeros(3), 0
    trials = 20000
    for _ in range(trials):
        ids = win.apply(st_, pool, 8, p, "cluster", rng)
        c = pool.clusters[ids]
        firsts[c[0]] += 1
        pairs += (c[0] == 0) and (c[4] == 1)
        assert c[0] != c[4]                                # without replacement
    np.testing.assert_allclose(firsts / trials, p, atol=0.012)
    assert abs(pairs / trials - 0.7 * 0.2 / 0.3) < 0.012  # P(0 then 1) = 0.4667


def test_window_uses_domain_mixture_via_cluster_shares():
    # Domains a, a, b, b; clusters 0, 1, 1, 2: domain a = {cluster 0, half of cluster 1}.
    # Domain probs [1, 0] become cluster weights [1/2, 1/2, 0]; each window is the easiest
    # prompt of its cluster: cluster 0 → prompt 0, cluster 1 → prompt 1 (rank by position),
    # cluster 2 → prompt 3. propose(2) draws both clusters of weight > 0 without
    # replacement, so every batch is exactly {0, 1}; the order is 0 first with prob 1/2.
    pool = Pool(["a", "a", "b", "b"], clusters=[0, 1, 1, 2])
    method = compose(fixed_mixture([1.0, 0.0]), ads_boundary_window(mini_cluster_size=1))
    s = Scheduler(pool, method, seed=0)
    draws = np.stack([s.propose(2) for _ in range(2000)])
    assert np.bincount(draws.ravel(), minlength=4).tolist() == [2000, 2000, 0, 0]
    assert (np.sort(draws, axis=1) == [0, 1]).all()
    first_is_0 = float((draws[:, 0] == 0).mean())
    assert abs(first_is_0 - 0.5) < 0.035                   # 3.1 binomial sd of 0.011
    # n = 3 > the two width-1 windows: the draw order repeats, so one of 0, 1 appears twice.
    ids = s.propose(3)
    assert sorted(ids.tolist()) in ([0, 0, 1], [0, 1, 1]) and ids[2] == ids[0]


def test_window_degenerate_probs_fall_back_to_uniform():
    pool = Pool(np.repeat([0, 1], 4))
    win = ads_boundary_window(mini_cluster_size=4)
    ids = win.apply(win.init(pool), pool, 8, np.array([0.0, 0.0]), "cluster", np.random.default_rng(0))
    assert sorted(ids.tolist()) == list(range(8))


# ---- the cluster EMA -----------------------------------------------------------------------
def test_cluster_ema_two_updates_hand_computed():
    pool = Pool(np.repeat(["a", "b", "c"], 5))
    mix = ads_cluster_ema(alpha=0.3, r_init=0.5, epoch_reset_steps=0)
    st_ = mix.init(pool)
    np.testing.assert_allclose(mix.apply(st_, pool), [1 / 3] * 3)
    # Update 1: cluster a groups ρ = 1, 0.5 → r_a = 0.75; b ρ = 0 → r_b = 0; c stale 0.5.
    # p̂ = [0.75, 0, 0.5] / 1.25 = [0.6, 0, 0.4]; p = 0.7/3 + 0.3·p̂.
    st_ = mix.update(st_, pool, batch(pool, [0, 1, 5], rows([1.0, 0.5, 0.0])))
    np.testing.assert_allclose(st_.rate, [0.75, 0.0, 0.5])
    np.testing.assert_allclose(mix.apply(st_, pool), [0.413333333, 0.233333333, 0.353333333])
    # Update 2: b ρ = 0.25; a and c stale. r = [0.75, 0.25, 0.5], p̂ = [1/2, 1/6, 1/3];
    # p = 0.7·[0.41333, 0.23333, 0.35333] + 0.3·p̂.
    st_ = mix.update(st_, pool, batch(pool, [6], rows([0.25])))
    np.testing.assert_allclose(mix.apply(st_, pool), [0.439333333, 0.213333333, 0.347333333])


def test_cluster_ema_zero_rates_and_reset():
    pool = Pool(np.repeat(["a", "b", "c"], 5))
    mix = ads_cluster_ema(alpha=0.3, r_init=0.0, epoch_reset_steps=3)
    st_ = mix.init(pool)
    st_ = mix.update(st_, pool, batch(pool, [0], rows([1.0])))     # r = [1, 0, 0]
    np.testing.assert_allclose(st_.prob, [0.7 / 3 + 0.3, 0.7 / 3, 0.7 / 3])
    st_ = mix.update(st_, pool, batch(pool, [0], rows([0.0])))     # Σr = 0 → p̂ uniform
    np.testing.assert_allclose(st_.prob, 0.7 * np.array([0.7 / 3 + 0.3, 0.7 / 3, 0.7 / 3]) + 0.1)
    st_ = mix.update(st_, pool, batch(pool, [5], rows([1.0])))     # 3rd update → reset
    np.testing.assert_allclose(st_.prob, [1 / 3] * 3)
    np.testing.assert_allclose(st_.rate, [0.0] * 3)
    assert int(st_.steps) == 0


# ---- the method ----------------------------------------------------------------------------
def test_ads_default_batch_is_four_easiest_windows():
    rng = np.random.default_rng(0)
    clusters = np.repeat(np.arange(64), 40)
    pool = Pool(np.zeros(clusters.size, int), clusters=clusters, difficulty=rng.random(clusters.size))
    s = Scheduler(pool, "ads", seed=0)
    ids = s.propose(128)
    c = pool.clusters[ids]
    assert len(np.unique(c)) == 4 and np.all(np.bincount(c)[np.unique(c)] == 32)
    assert np.all(pool.rank_position()[ids] < 32)          # the easiest 32 of each
    assert s.method.mixture.name == "ads_cluster_ema"
    assert s.method.admission.name == "drop_all_wrong"


def test_ads_admission_drops_only_all_wrong():
    pool = Pool(["a"] * 8)
    s = Scheduler(pool, "ads", mini_cluster_size=4, active_clusters=1)
    fb = Feedback([0, 1, 2], [[0, 0], [1, 1], [0, 1]], step=0)
    adm = s.admission(fb)
    assert adm.keep[:, 0].tolist() == [False, True, True] and adm.refill == 0


def test_ads_rejects_bad_hyperparameters():
    for kw in ({"alpha": 1.5}, {"eps": 0.6}, {"mini_cluster_size": 0}, {"active_clusters": 2.5},
               {"epoch_reset_steps": -1}, {"r_init": -0.1}):
        with pytest.raises(ValueError):
            ads(**kw)


def test_ads_end_to_end_resume():
    rng = np.random.default_rng(1)
    pool = Pool(rng.integers(0, 3, 300), clusters=rng.integers(0, 10, 300), difficulty=rng.random(300))
    kw = dict(active_clusters=3, mini_cluster_size=4, epoch_reset_steps=4)
    s = Scheduler(pool, "ads", seed=5, **kw)
    for t in range(7):
        ids = s.propose(12)
        assert ids.shape == (12,) and ids.dtype == np.int64
        fb = Feedback(ids, (rng.random((12, 4)) < 0.5).astype(float), step=t)
        s.observe(fb)
        assert s.admit(fb).shape == (12, 4)
        np.testing.assert_array_equal(s.loss_weights(fb), np.ones((12, 4)))
    fresh = Scheduler(pool, "ads", seed=5, **kw)
    fresh.load_state_dict(pickle.loads(pickle.dumps(s.state_dict())))
    for t in range(7, 12):
        a, b = s.propose(12), fresh.propose(12)
        np.testing.assert_array_equal(a, b)
        fb = Feedback(a, (rng.random((12, 4)) < 0.5).astype(float), step=t)
        s.observe(fb), fresh.observe(fb)
    assert s.metrics() == fresh.metrics()


def _reference_move(window: set, dirs: dict, size: int) -> set:
    """The ADS window move written from the paper's description (arXiv 2606.22305, Eq. 5–7
    as the reference sampler applies them), independently of `move_window`: stayers keep
    their slot; easier-movers in ascending order, then harder-movers in descending order,
    each take pos ∓ 1 clamped to the cluster, or else the nearest free slot, looking in
    the requested direction first at each distance."""
    if size <= len(window):
        return set(window)
    taken = {p for p in window if dirs.get(p, 0) == 0}
    movers = [(p, -1) for p in sorted(p for p in window if dirs.get(p, 0) < 0)]
    movers += [(p, +1) for p in sorted((p for p in window if dirs.get(p, 0) > 0), reverse=True)]
    for p, d in movers:
        want = min(max(p + d, 0), size - 1)
        slot = None
        for radius in range(size):
            for cand in ((want,) if radius == 0 else (want + d * radius, want - d * radius)):
                if 0 <= cand < size and cand not in taken:
                    slot = cand
                    break
            if slot is not None:
                break
        taken.add(slot)
    return taken


def test_reference_move_hand_cases():
    # the reference itself, on cases worked by hand
    assert _reference_move({3, 4, 5}, {3: -1, 4: -1, 5: +1}, 10) == {2, 3, 6}
    assert _reference_move({0, 1, 2}, {0: -1, 1: -1, 2: -1}, 10) == {0, 1, 2}
    # 4 wants 5, taken by the stayer 5: nearest free in its direction is 6.
    assert _reference_move({4, 5}, {4: +1}, 10) == {5, 6}
    # 9 wants 9 (clamped) → taken by nobody; 8 then wants 9, taken → 10 is outside, so 8.
    assert _reference_move({8, 9}, {8: +1, 9: +1}, 10) == {8, 9}


def test_ads_update_equals_reference_loop():
    """The vectorised update against a per-group loop in the style of the reference
    sampler (sets of positions, a per-position dict, lists of ρ per cluster), with the
    window move re-implemented in the test (`_reference_move`)."""
    rng = np.random.default_rng(7)
    n_clusters, alpha, eps, b = 5, 0.3, 0.17, 4
    clusters = rng.integers(0, n_clusters, 120)
    pool = Pool(np.zeros(120, int), clusters=clusters, difficulty=rng.random(120))
    order, offsets = pool.by_rank()
    mix = ads_cluster_ema(alpha=alpha, epoch_reset_steps=0)
    win = ads_boundary_window(mini_cluster_size=b, eps=eps, epoch_reset_steps=0)
    ms, ws = mix.init(pool), win.init(pool)
    sizes = np.diff(offsets)
    ref_windows = {k: set(range(min(b, sizes[k]))) for k in range(n_clusters)}
    ref_rate, ref_prob = np.full(n_clusters, 0.5), np.full(n_clusters, 1 / n_clusters)
    for step in range(40):
        # Mostly window prompts (so windows move), some random ones, some duplicates.
        ids = win.apply(ws, pool, 8, mix.apply(ms, pool), "cluster", rng)
        ids = np.concatenate([ids, rng.integers(0, 120, 3), ids[:2]])
        g = int(rng.integers(1, 6))
        rewards = rng.random((ids.size, g)) * 1.2                  # non-binary; success ≥ 0.5
        bt = batch(pool, ids, rewards)
        ms, ws = mix.update(ms, pool, bt), win.update(ws, pool, bt)
        rhos, dirs = {}, {}
        for i, pid in enumerate(ids.tolist()):
            k = int(pool.clusters[pid])
            pos = int(pool.rank_position()[pid])
            rho = float(np.mean(rewards[i] >= 0.5))
            rhos.setdefault(k, []).append(rho)
            if pos in ref_windows[k]:
                dirs.setdefault(k, {})[pos] = -1 if rho < 0.5 - eps else (1 if rho > 0.5 + eps else 0)
        for k, r in rhos.items():
            ref_rate[k] = np.mean(r)
        for k, d in dirs.items():
            ref_windows[k] = _reference_move(ref_windows[k], d, int(sizes[k]))
        target = ref_rate / ref_rate.sum() if ref_rate.sum() > 0 else np.full(n_clusters, 1 / n_clusters)
        ref_prob = (1 - alpha) * ref_prob + alpha * target
        ref_prob /= ref_prob.sum()
        np.testing.assert_allclose(ms.rate, ref_rate)
        np.testing.assert_allclose(ms.prob, ref_prob)
        for k in range(n_clusters):
            assert ws.positions[k, :ws.width[k]].tolist() == sorted(ref_windows[k])


def test_window_at_the_hard_end_moves_as_the_reference():
    """Windows at the hard end of their clusters with too-easy feedback (pos + 1 past the last
    slot must clamp to it) and at the easy end with too-hard feedback (pos − 1 below 0): the
    vectorised update moves them as `_reference_move`."""
    rng = np.random.default_rng(3)
    n_clusters, b = 4, 5
    clusters = rng.integers(0, n_clusters, 80)
    pool = Pool(np.zeros(80, int), clusters=clusters, difficulty=rng.random(80))
    order, offsets = pool.by_rank()
    sizes = np.diff(offsets)
    win = ads_boundary_window(mini_cluster_size=b, eps=0.17, epoch_reset_steps=0)
    for trial in range(20):
        ws = win.init(pool)
        ref, ids, rows = {}, [], []
        for k in range(n_clusters):
            w = int(ws.width[k])
            hard = trial % 2 == 0
            slots = list(range(int(sizes[k]) - w, int(sizes[k]))) if hard else list(range(w))
            ws.positions[k, :w] = slots
            ref[k] = set(slots)
            dirs = {}
            for pos in slots:
                if rng.random() < 0.8:
                    up = rng.random() < (0.8 if hard else 0.2)
                    ids.append(int(order[offsets[k] + pos]))
                    rows.append([1.0, 1.0, 1.0, 1.0] if up else [0.0, 0.0, 0.0, 0.0])
                    dirs[pos] = 1 if up else -1
            ref[k] = _reference_move(ref[k], dirs, int(sizes[k]))
        ws = win.update(ws, pool, batch(pool, np.array(ids), np.array(rows)))
        for k in range(n_clusters):
            assert ws.positions[k, :ws.width[k]].tolist() == sorted(ref[k]), (trial, k)
