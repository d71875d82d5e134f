"""MoPPS's selection reads α and β only for the candidates whose posterior left the prior
(the state's `moved` mask): the proposals must be those of the plain rule — every candidate's (α, β)
read, a Beta draw for each, the nearest to the target kept — on the same random stream,
and stay so across checkpoints, shared method objects and forgetting (decay < 1)."""

from __future__ import annotations

import numpy as np
import pytest

from rlpace import Feedback, Pool, Scheduler
from rlpace.policies import make_method
from rlpace.policies._mopps import (_beta_draw, _candidates, _candidates_by_arm, _distinct_draw,
                                    _nearest_in_each_arm)
from rlpace.policies._uniform import split_by_arm


def _plain_mopps_apply(alpha, beta, pool, n, probs, rng, ratio=16, target=0.5):
    """The rule written out: candidates (the shared draw helpers), every candidate's (α, β)
    read, one uniform per candidate at Beta(1, 1) in candidate order and Gamma draws for the
    rest (`_beta_draw`'s law and stream, as a loop), then the nearest per arm by a full sort."""
    if probs is None:
        cand = _candidates(rng, len(pool), n, ratio)
        arm = np.zeros(cand.size, np.int64)
        keep = np.array([n])
    else:
        counts, order, offsets = split_by_arm(pool, n, probs, "domain", rng, "mopps")
        pos, arm = _candidates_by_arm(rng, offsets, counts, ratio)
        cand = order[pos]
        keep = counts[counts > 0]
    a, b = alpha[cand], beta[cand]
    flat = [j for j in range(cand.size) if a[j] == 1.0 and b[j] == 1.0]
    rest = [j for j in range(cand.size) if not (a[j] == 1.0 and b[j] == 1.0)]
    gamma = np.empty(cand.size)
    for j in flat:
        gamma[j] = rng.random()
    x = [rng.standard_gamma(a[j]) for j in rest]
    y = [rng.standard_gamma(b[j]) for j in rest]
    for j, xj, yj in zip(rest, x, y):
        gamma[j] = xj / (xj + yj)
    dist = (gamma - target) ** 2
    out = []
    for k in range(keep.size):
        mine = np.flatnonzero(arm == k)
        by = sorted(mine.tolist(), key=lambda j: (dist[j], j))
        out += by[:keep[k]]
    return cand[np.array(out, dtype=np.int64)]


@pytest.mark.parametrize("with_mixture", [False, True])
@pytest.mark.parametrize("seen_share", [0.0, 0.01, 0.3, 0.9])
def test_selection_equals_the_plain_rule(with_mixture, seen_share):
    rng = np.random.default_rng(int(seen_share * 100) + with_mixture)
    n_pool = 20_000
    pool = Pool(rng.integers(0, 5, size=n_pool))
    policy = make_method("recommended" if with_mixture else "mopps").selection
    state = policy.init(pool)
    seen = rng.random(n_pool) < seen_share
    state.alpha[seen] = rng.integers(1, 9, size=int(seen.sum())).astype(float)
    state.beta[seen] = rng.integers(1, 9, size=int(seen.sum())).astype(float)
    state.moved[seen] = True                 # written here by hand: the mask marks them too
    probs = np.array([0.1, 0.4, 0.05, 0.25, 0.2]) if with_mixture else None
    arms = "domain" if with_mixture else None
    for step in range(6):
        n = [512, 1, 37, 200, 64, 3][step]
        got = policy.apply(state, pool, n, probs, arms, np.random.default_rng([4, step]))
        want = _plain_mopps_apply(state.alpha, state.beta, pool, n, probs, np.random.default_rng([4, step]))
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name,kw", [("mopps", {"decay": 0.5}), ("recommended", {}),
                                     ("recommended", {"decay": 0.5, "ratio": 4})])
def test_moved_mask_follows_the_update_path(name, kw):
    """α and β written through the public path (`Scheduler.observe`), λ = 0.5 included (a
    prompt can come back to the prior): after every step the state's mask marks exactly the
    prompts observed so far, so it covers every prompt off the prior computed from scratch, and
    the next proposal (member-order views of the mask in the per-arm rule) is the plain rule's
    on the state's α and β read in full."""
    rng = np.random.default_rng(5)
    pool = Pool(rng.integers(0, 4, size=6_000))
    rates = rng.random(6_000)
    sched = Scheduler(pool, name, seed=1, **kw)
    policy = sched.method.selection
    mixture = sched.method.mixture
    seen = np.zeros(6_000, dtype=bool)
    for t in range(8):
        state = sched.states["selection"]
        probs = None if mixture is None else mixture.apply(sched.states["mixture"], pool)
        ratio = kw.get("ratio", 16)
        got = policy.apply(state, pool, 200, probs, "domain" if probs is not None else None,
                           np.random.default_rng([6, t]))
        want = _plain_mopps_apply(state.alpha, state.beta, pool, 200, probs, np.random.default_rng([6, t]),
                                  ratio=ratio)
        np.testing.assert_array_equal(got, want)
        ids = sched.propose(200)
        r = (np.random.default_rng([9, t]).random((200, 4)) < rates[ids][:, None]).astype(float)
        sched.observe(Feedback(ids, r, step=t))
        seen[ids] = True
        state = sched.states["selection"]
        np.testing.assert_array_equal(state.moved, seen)
        off = (state.alpha != 1.0) | (state.beta != 1.0)
        assert not (off & ~state.moved).any()


def test_a_stale_moved_mask_is_refused_on_load():
    """A saved state whose α left the prior at a prompt its mask does not mark (an α/β write
    that bypassed the update) would draw that prompt from the prior: the load refuses it, and
    the Scheduler keeps its state."""
    pool = Pool(np.arange(40) % 2)
    sched = Scheduler(pool, "recommended", seed=0)
    ids = sched.propose(8)
    sched.observe(Feedback(ids, np.ones((8, 4)), step=0))
    saved = sched.state_dict()
    assert saved["policy/selection/moved"].sum() == np.unique(ids).size
    unmarked = int(np.flatnonzero(~saved["policy/selection/moved"])[0])
    edited = dict(saved)
    edited["policy/selection/alpha"] = saved["policy/selection/alpha"].copy()
    edited["policy/selection/alpha"][unmarked] = 3.0
    fresh = Scheduler(pool, "recommended", seed=0)
    with pytest.raises(ValueError, match="policy/selection/moved"):
        fresh.load_state_dict(edited)
    assert not fresh.states["selection"].moved.any()
    fresh.load_state_dict(saved)                                    # the saved one loads, exactly
    np.testing.assert_array_equal(fresh.states["selection"].moved, saved["policy/selection/moved"])


def test_a_state_built_from_values_alone_derives_its_mask():
    """MoppsState(α, β) without a mask: the mask is the exact one of the values, and the
    proposals are the plain rule's."""
    from rlpace.policies._mopps import MoppsState, moved_from_values
    rng = np.random.default_rng(2)
    pool = Pool(rng.integers(0, 3, size=3_000))
    alpha, beta = np.ones(3_000), np.ones(3_000)
    alpha[rng.random(3_000) < 0.05] = 4.0
    assert moved_from_values(alpha, beta, 1.0, 1.0).sum() == (alpha != 1.0).sum()
    policy = make_method("recommended").selection
    probs = np.array([0.2, 0.5, 0.3])
    got = policy.apply(MoppsState(alpha, beta), pool, 64, probs, "domain", np.random.default_rng(1))
    want = _plain_mopps_apply(alpha, beta, pool, 64, probs, np.random.default_rng(1))
    np.testing.assert_array_equal(got, want)


def _run(sched, pool_rates, steps, start=0, b=128, g=8):
    out = []
    for t in range(start, start + steps):
        ids = sched.propose(b)
        r = (np.random.default_rng([9, t]).random((b, g)) < pool_rates[ids][:, None]).astype(float)
        sched.observe(Feedback(ids, r, step=t))
        out.append(ids)
    return out


@pytest.mark.parametrize("name,kw", [("recommended", {}), ("mopps", {}), ("mopps", {"decay": 0.5}),
                                     ("recommended", {"decay": 0.5, "ratio": 4})])
def test_resume_and_shared_method_give_the_same_stream(name, kw):
    rng = np.random.default_rng(1)
    pool = Pool(rng.integers(0, 4, size=30_000))
    rates = rng.random(30_000)
    whole = _run(Scheduler(pool, name, seed=2, **kw), rates, 12)
    first = Scheduler(pool, name, seed=2, **kw)
    _run(first, rates, 5)
    saved = first.state_dict()
    resumed = Scheduler(pool, name, seed=2, **kw)
    resumed.load_state_dict(saved)
    for a, b in zip(whole[5:], _run(resumed, rates, 7, start=5)):
        np.testing.assert_array_equal(a, b)
    # one Method object driving two Schedulers: each keeps its own mask, the streams are each
    # the stream of a Scheduler of its own
    method = make_method(name, **kw)
    s1, s2 = Scheduler(pool, method, seed=2), Scheduler(pool, method, seed=3)
    other = _run(Scheduler(pool, name, seed=3, **kw), rates, 12)
    for t in range(12):
        for s, ref in ((s1, whole), (s2, other)):
            ids = s.propose(128)
            np.testing.assert_array_equal(ids, ref[t])
            r = (np.random.default_rng([9, t]).random((128, 8)) < rates[ids][:, None]).astype(float)
            s.observe(Feedback(ids, r, step=t))


def test_beta_draw_flat_hint_is_the_same_draw():
    rng = np.random.default_rng(0)
    a = np.where(rng.random(300) < 0.2, rng.random(300) * 5 + 0.1, 1.0)
    b = np.where(a == 1.0, 1.0, rng.random(300) * 5 + 0.1)
    flat = (a == 1.0) & (b == 1.0)
    np.testing.assert_array_equal(_beta_draw(np.random.default_rng(3), a, b, flat),
                                  _beta_draw(np.random.default_rng(3), a, b))


def test_distinct_draw_32_bit_sort_equals_the_64_bit_one():
    """Ranges that end below 2³² are sorted as uint32; the values are those of np.sort."""
    lo = np.repeat(np.array([0, 1000, 2**32 - 50]), [20, 30, 10])
    width = np.repeat(np.array([1000, 5000, 50]), [20, 30, 10])
    got = _distinct_draw(np.random.default_rng(5), lo, width)
    u = np.random.default_rng(5).random(60)
    first = np.sort(lo + (u * width).astype(np.int64))
    if (first[1:] != first[:-1]).all():          # no repeat to redraw: exactly the plain draw
        np.testing.assert_array_equal(got, first)
    assert (np.diff(got) > 0).all() and got.max() < 2**32
    big = _distinct_draw(np.random.default_rng(5), lo + 2**33, width)   # the int64 sort
    np.testing.assert_array_equal(big - 2**33, got)


def test_nearest_in_each_arm_short_arms_and_far_candidates():
    """Arms whose candidates all lie far from the target (the one-threshold superset misses
    them) still get their nearest, as in the full sort."""
    rng = np.random.default_rng(2)
    for trial in range(100):
        lens = rng.integers(1, 900, size=int(rng.integers(1, 12)))
        arm = np.repeat(np.arange(lens.size), lens)
        dist = (rng.random(arm.size) - 0.5) ** 2
        far = rng.random(lens.size) < 0.3
        dist = np.where(far[arm], 0.2 + 0.05 * rng.random(arm.size), dist)
        keep = np.minimum(lens, np.maximum(lens // 16, rng.integers(0, 3, size=lens.size)))
        by = np.lexsort((dist, arm))
        rank = np.arange(by.size) - (np.cumsum(lens) - lens)[arm[by]]
        np.testing.assert_array_equal(_nearest_in_each_arm(arm, dist, keep), by[rank < keep[arm[by]]])


def test_closest_with_the_one_threshold_superset_equals_argpartition():
    """m ≥ 16·n takes the threshold path: the same positions, in the same order, as
    argpartition then a stable sort, with ties at the threshold and everywhere."""
    from rlpace.policies._mopps import _closest
    rng = np.random.default_rng(8)
    for trial in range(400):
        n = int(rng.integers(1, 200))
        m = 16 * n + int(rng.integers(0, 3000))
        dist = [(rng.random(m) - 0.5) ** 2, np.round(rng.random(m), 3), rng.integers(0, 40, m) / 40.0,
                np.zeros(m)][trial % 4]
        keep = np.argpartition(dist, n - 1)[:n]
        want = keep[np.argsort(dist[keep], kind="stable")]
        got = _closest(dist, n)
        if np.unique(np.sort(dist)[:n + 1]).size == n + 1:       # distinct: the very positions
            np.testing.assert_array_equal(got, want)
        else:                                                    # tied: the same distances
            np.testing.assert_array_equal(np.sort(dist[got]), np.sort(dist[want]))


def _plain_distinct_draw(rng, lo, width):
    """`_distinct_draw` written as the loop it stands for: i.i.d. draws, sorted; every copy of
    a value after its first is drawn again in its own range, round after round, in position
    order, and kept when no value kept so far has it."""
    u = rng.random(len(lo))
    value = sorted(int(lo[i]) + int(u[i] * width[i]) for i in range(len(lo)))
    taken, again = set(), []
    for i, v in enumerate(value):
        if i and v == value[i - 1]:
            again.append(i)
        else:
            taken.add(v)
    while again:
        u = rng.random(len(again))
        left = []
        for i, ui in zip(again, u):
            v = int(lo[i]) + int(ui * width[i])
            if v in taken:
                left.append(i)
            else:
                taken.add(v)
        again = left
    return sorted(taken)


def test_distinct_draw_equals_the_plain_loop():
    """Crowded small ranges (many redraws, several rounds), large ones, and ranges past 2³²
    (the 64-bit path): the same values and the same generator state after."""
    for trial in range(300):
        r = np.random.default_rng(trial)
        k = int(r.integers(1, 8))
        sizes = r.integers(1, 60, k) if trial % 2 else r.integers(50, 5000, k)
        m = np.minimum(r.integers(0, 200, k), np.maximum(sizes // 2, 1))
        start = np.concatenate(([0], np.cumsum(sizes)[:-1])) + int(r.integers(0, 5))
        if trial % 5 == 0:
            start = start + (1 << 32) - 100
        arm = np.repeat(np.arange(k), m)
        lo, width = start[arm], sizes[arm]
        g1, g2 = np.random.default_rng([trial, 2]), np.random.default_rng([trial, 2])
        got = _distinct_draw(g1, lo, width)
        assert got.dtype == np.int64
        assert got.tolist() == _plain_distinct_draw(g2, lo, width), trial
        assert g1.random() == g2.random()


def _lexsort_nearest(arm, dist, keep):
    """The first keep[a] of each arm in (arm, distance, position) order, by a full lexsort."""
    by = np.lexsort((dist, arm))
    lens = np.bincount(arm, minlength=keep.size)
    rank = np.arange(by.size) - (np.cumsum(lens) - lens)[arm[by]]
    return by[rank < keep[arm[by]]]


def test_nearest_in_each_arm_one_key_sort_many_arms_and_rounding_ties():
    """The superset is sorted by the float key arm + dist: with more than 64 arms (the
    vectorised cut), with distances one ulp apart in arms ≥ 1 (equal keys after rounding:
    the exact two-sort order must take over) and with exact ties, the result is the lexsort's."""
    rng = np.random.default_rng(11)
    for trial in range(60):
        n_arms = int(rng.integers(65, 140)) if trial % 2 else int(rng.integers(2, 12))
        lens = rng.integers(16, 200, size=n_arms)
        arm = np.repeat(np.arange(n_arms), lens)
        dist = (rng.random(arm.size) - 0.5) ** 2
        if trial % 3 == 1:                     # neighbours one ulp apart: arm + d rounds them together
            j = rng.choice(arm.size - 1, size=arm.size // 10, replace=False)
            dist[j + 1] = np.nextafter(dist[j], 1.0)
            dist[j] = dist[j] / 64.0           # near the target, so they are in the superset
            dist[j + 1] = np.nextafter(dist[j], 1.0)
        if trial % 3 == 2:
            dist = np.round(dist, 4)           # exact ties
        keep = np.minimum(lens, lens // 16 + rng.integers(0, 3, size=n_arms))
        np.testing.assert_array_equal(_nearest_in_each_arm(arm, dist, keep), _lexsort_nearest(arm, dist, keep))


def test_candidates_by_arm_few_and_many_arms_equal_the_plain_draw():
    """Few arms take a Python setup (their ranges as uint32 starts and float64 widths), many
    arms the array setup: both are the plain distinct draw over each candidate's int64 range."""
    for trial in range(40):
        r = np.random.default_rng([trial, 7])
        k = int(r.integers(1, 12)) if trial % 2 else int(r.integers(65, 90))
        sizes = r.integers(2000, 90_000, size=k)
        offsets = np.concatenate(([0], np.cumsum(sizes)))
        counts = r.multinomial(512, np.full(k, 1.0 / k))
        counts[r.random(k) < 0.2] = 0          # arms without slots
        pos, arm = _candidates_by_arm(np.random.default_rng([trial, 8]), offsets, counts, 4)
        active = np.flatnonzero(counts)
        want_arm = np.repeat(np.arange(active.size), 4 * counts[active])
        g = np.random.default_rng([trial, 8])
        want = _plain_distinct_draw(g, offsets[active][want_arm], sizes[active][want_arm])
        np.testing.assert_array_equal(arm, want_arm)
        assert pos.dtype == np.int64 and pos.tolist() == want


def test_beta_update_with_distinct_ids_is_the_loop_bit_for_bit():
    """Every prompt once updates in batch order without grouping (λ = 1: the counts added in
    place): the very floats of the sequential loop α ← λ·α + ((1 − λ)·α0 + k) (non-integer α
    and β, so a wrong sum shows)."""
    from rlpace.policies._mopps import beta_posterior_update
    rng = np.random.default_rng(3)
    for trial in range(60):
        n = 3000
        decay = (1.0, 0.5, 0.9, 0.0)[trial % 4]
        a, b = rng.random(n) * 7 + 0.3, rng.random(n) * 7 + 0.3
        ra, rb = a.copy(), b.copy()
        ids = rng.choice(n, size=int(rng.integers(1, 600)), replace=False)
        g = 16
        k = rng.integers(0, g + 1, ids.size).astype(float)
        beta_posterior_update(a, b, ids, k, g - k, decay, 1.5, 2.0)
        for i, x in zip(ids.tolist(), k.tolist()):
            ra[i] = decay * ra[i] + ((1.0 - decay) * 1.5 + x)
            rb[i] = decay * rb[i] + ((1.0 - decay) * 2.0 + (g - x))
        np.testing.assert_array_equal(a, ra)
        np.testing.assert_array_equal(b, rb)


def test_split_by_arm_every_arm_live_is_the_multinomial_of_the_shares():
    """Every arm with mass: counts ~ Multinomial(n, p / Σ p) from the same generator; a NaN,
    an infinite or a negative share is still refused."""
    from rlpace.errors import InputError
    pool = Pool(np.repeat(np.arange(4), [5, 7, 3, 9]))
    for s in range(20):
        p = np.random.default_rng(s).random(4) + 0.01
        counts, _, _ = split_by_arm(pool, 37, p, "domain", np.random.default_rng([s, 1]), "t")
        q = p / p.sum()
        np.testing.assert_array_equal(counts, np.random.default_rng([s, 1]).multinomial(37, q / q.sum()))
    for bad in ([np.nan, 1, 1, 1], [np.inf, 1, 1, 1], [-0.1, 1, 1, 1]):
        with pytest.raises(InputError, match="finite non-negative"):
            split_by_arm(pool, 5, bad, "domain", np.random.default_rng(0), "t")


def test_split_by_arm_reads_the_pools_cached_sizes_and_keeps_the_plain_rule():
    """split_by_arm takes the arm sizes and "every arm has prompts" from the pool's cache:
    counts must be the plain rule's — probs restricted to non-empty arms and renormalised
    (all-zero mass: the arms' sizes), a multinomial over the arms with mass, in one draw —
    for probs with zeros, all zeros, and every arm live, over domains and clusters."""
    rng = np.random.default_rng(21)
    for trial in range(60):
        k = int(rng.integers(1, 9))
        labels = np.repeat(np.arange(k), rng.integers(1, 30, size=k))
        pool = Pool(labels, clusters=rng.integers(0, 5, size=labels.size))
        arms = "domain" if trial % 2 else "cluster"
        sizes = np.diff(pool.members(arms)[1])
        probs = rng.random(sizes.size)
        probs[rng.random(sizes.size) < 0.3] = 0.0
        if trial % 7 == 0:
            probs[:] = 0.0
        n = int(rng.integers(0, 80))
        got, _, _ = split_by_arm(pool, n, probs, arms, np.random.default_rng([trial, 5]), "t")
        p = np.where(sizes > 0, probs, 0.0)
        p = p / p.sum() if p.sum() > 0 else sizes / sizes.sum()
        live = np.flatnonzero(p > 0)
        want = np.zeros(sizes.size, np.int64)
        want[live] = np.random.default_rng([trial, 5]).multinomial(n, p[live] / p[live].sum())
        np.testing.assert_array_equal(got, want)
