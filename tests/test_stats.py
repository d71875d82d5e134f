"""Vectorised statistics against their reference loops: per-arm rolling windows (DUMP's
list append + truncate) and the sum tree (prefix sums + searchsorted)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlpace.stats import (sumtree_build, sumtree_sample, sumtree_set, sumtree_total, window_init,
                          window_mean, window_push)


# ---- windows -------------------------------------------------------------------------------
def reference_windows(k, width, pushes):
    """DUMP's LearnabilityEstimator: per item, `buf.append(v); buf = buf[-W:]`."""
    bufs = [[] for _ in range(k)]
    for arms, values in pushes:
        for a, v in zip(arms, values):
            bufs[a].append(float(v))
            bufs[a] = bufs[a][-width:]
    return bufs


def window_contents(win):
    """The ring buffer unrolled oldest → newest, per arm."""
    k, w = win.values.shape
    out = []
    for a in range(k):
        f, c = int(win.filled[a]), int(win.cursor[a])
        out.append([float(win.values[a, (c - f + j) % w]) for j in range(f)])
    return out


def _check_against_reference(k, width, pushes):
    win = window_init(k, width)
    for arms, values in pushes:
        window_push(win, np.asarray(arms, dtype=np.int64), np.asarray(values, dtype=np.float64))
    ref = reference_windows(k, width, pushes)
    assert window_contents(win) == ref
    assert win.filled.tolist() == [len(b) for b in ref]
    means = window_mean(win, empty=-1.0)
    for a in range(k):
        expected = np.mean(ref[a]) if ref[a] else -1.0
        assert means[a] == pytest.approx(expected, rel=1e-12, abs=1e-12)


@st.composite
def window_streams(draw):
    k = draw(st.integers(1, 5))
    width = draw(st.integers(1, 7))
    pushes = []
    for _ in range(draw(st.integers(0, 6))):
        m = draw(st.integers(0, 25))
        arms = draw(st.lists(st.integers(0, k - 1), min_size=m, max_size=m))
        values = draw(st.lists(st.floats(-100, 100, allow_nan=False), min_size=m, max_size=m))
        pushes.append((arms, values))
    return k, width, pushes


@settings(max_examples=200, deadline=None)
@given(window_streams())
def test_window_push_equals_reference_loop(stream):
    _check_against_reference(*stream)


def test_window_push_more_than_width_in_one_push():
    # arm 1 gets 11 values in one push with W = 4: only the last 4 survive, in order
    arms = [1] * 6 + [0, 1, 1, 0] + [1] * 3
    values = list(range(len(arms)))
    _check_against_reference(3, 4, [([1, 1], [-1.0, -2.0]), (arms, values), ([1], [99.0])])
    win = window_init(3, 4)
    window_push(win, [1] * 11, np.arange(11.0))
    assert window_contents(win)[1] == [7.0, 8.0, 9.0, 10.0]
    assert win.filled.tolist() == [0, 4, 0]
    assert window_mean(win, empty=np.nan)[1] == pytest.approx(8.5)
    assert np.isnan(window_mean(win, empty=np.nan)[0])


def test_window_random_long_stream_matches_reference():
    rng = np.random.default_rng(0)
    pushes = [(rng.integers(0, 12, size=rng.integers(0, 600)).tolist(), rng.random(600).tolist())
              for _ in range(40)]
    pushes = [(a, v[:len(a)]) for a, v in pushes]
    _check_against_reference(12, 300, pushes)


@pytest.mark.parametrize("path", ["_push_slots", "_push_rows"])
@pytest.mark.parametrize("width,g", [(256, 16), (300, 16), (7, 3), (5, 1), (16, 20)])
def test_window_push_both_paths_equal_reference_loop(path, width, g):
    # A step's rollouts into per-arm windows, pushed through one write path whatever the
    # sizes: the slot path (normally for pushes of ≥ K·W values) and the row path (smaller
    # pushes) each keep the per-item loop's windows, for rows cut by the window's edge,
    # rows wrapping the ring, absent arms and pushes longer than the window.
    import rlpace.stats._window as wmod
    rng = np.random.default_rng(width * 100 + g)
    k = 6
    win = window_init(k, width)
    pushes = []
    for b in (0, 1, 3, 40, 512, 7, 200):
        arms = rng.integers(0, k - 1, size=b)            # arm k − 1 never appears
        values = rng.standard_normal((b, g))
        key = arms.astype(np.uint8)
        getattr(wmod, path)(win, arms, values.reshape(b, g) if g > 1 else values.reshape(-1), g,
                            np.argsort(key, kind="stable")) if b else None
        pushes.append((np.repeat(arms, g).tolist(), values.ravel().tolist()))
    ref = reference_windows(k, width, pushes)
    assert window_contents(win) == ref
    assert win.filled.tolist() == [len(r) for r in ref]


def test_window_init_rejects_zero_width():
    with pytest.raises(ValueError, match="width"):
        window_init(3, 0)


# ---- sum tree ------------------------------------------------------------------------------
def _check_tree_consistent(st_, weights):
    tree = st_.tree
    cap = tree.shape[0] // 2
    leaves = np.zeros(cap)
    leaves[:len(weights)] = weights
    np.testing.assert_array_equal(tree[cap:], leaves)
    for j in range(1, cap):                                   # every node = sum of its children
        assert tree[j] == tree[2 * j] + tree[2 * j + 1]
    assert sumtree_total(st_) == pytest.approx(np.sum(weights))
    assert int(st_.size) == len(weights)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 20), min_size=1, max_size=70), st.integers(0, 2**31 - 1))
def test_sumtree_sampling_equals_searchsorted(int_weights, seed):
    w = np.asarray(int_weights, dtype=np.float64)
    if w.sum() == 0:
        w[0] = 1.0
    st_ = sumtree_build(w)
    _check_tree_consistent(st_, w)
    u = np.random.default_rng(seed).random(500)
    # Integer weights: every partial sum is exact, so the two agree draw for draw.
    expected = np.searchsorted(np.cumsum(w), u * w.sum(), side="right")
    np.testing.assert_array_equal(sumtree_sample(st_, u), expected)
    assert (w[sumtree_sample(st_, u)] > 0).all()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 20), min_size=1, max_size=40),
       st.lists(st.tuples(st.integers(0, 39), st.integers(0, 20)), max_size=30))
def test_sumtree_set_equals_rebuild(int_weights, updates):
    w = np.asarray(int_weights, dtype=np.float64)
    updates = [(i % len(w), v) for i, v in updates]
    st_ = sumtree_build(w)
    if updates:
        idx, val = zip(*updates)
        sumtree_set(st_, np.array(idx), np.array(val, dtype=np.float64))
        for i, v in updates:                                   # sequential loop: last write wins
            w[i] = v
    _check_tree_consistent(st_, w)
    if w.sum() > 0:
        u = np.linspace(0, 1, 97, endpoint=False)
        expected = np.searchsorted(np.cumsum(w), u * w.sum(), side="right")
        np.testing.assert_array_equal(sumtree_sample(st_, u), expected)


def test_sumtree_sample_equals_the_walk_written_as_a_loop():
    """Float weights with zero-weight leaves (round-off at the partial sums): each draw is
    the walk down the tree one node at a time — right when the mass is at least the left
    child's sum and the right subtree is not empty, or when the left one is empty."""
    rng = np.random.default_rng(4)
    for trial in range(40):
        n = int(rng.integers(1, 3000))
        w = rng.random(n) * (rng.random(n) < [0.1, 0.7, 1.0][trial % 3])
        if w.sum() == 0:
            w[-1] = 0.3
        st_ = sumtree_build(w)
        tree, cap = st_.tree, st_.tree.shape[0] // 2
        u = rng.random(300)
        u[:2] = [0.0, np.nextafter(1.0, 0.0)]
        want = []
        for x in u:
            mass, j = x * tree[1], 1
            while j < cap:
                left, right = tree[2 * j], tree[2 * j + 1]
                if (mass >= left and right > 0) or left <= 0:
                    mass, j = mass - left, 2 * j + 1
                else:
                    j = 2 * j
            want.append(j - cap)
        np.testing.assert_array_equal(sumtree_sample(st_, u), want)


def test_sumtree_float_weights_agree_except_at_boundaries():
    rng = np.random.default_rng(1)
    w = rng.random(1000) * (rng.random(1000) < 0.7)            # 30% zero-weight leaves
    st_ = sumtree_build(w)
    u = rng.random(20000)
    got = sumtree_sample(st_, u)
    assert (w[got] > 0).all()                                   # zero-weight leaves never drawn
    c = np.cumsum(w)
    expected = np.searchsorted(c, u * w.sum(), side="right")
    bad = np.flatnonzero(got != expected)
    # Disagreement only from float round-off, i.e. a draw within 1e-9 of a cut point.
    for j in bad:
        assert np.min(np.abs(c - u[j] * w.sum())) < 1e-9


def test_sumtree_frequencies_chi_square():
    w = np.array([5.0, 0.0, 1.0, 3.0, 0.0, 0.5, 2.5, 8.0])
    st_ = sumtree_build(w)
    n = 200_000
    draws = sumtree_sample(st_, np.random.default_rng(12345).random(n))
    counts = np.bincount(draws, minlength=w.size)
    assert counts[w == 0].sum() == 0
    p = w / w.sum()
    nz = p > 0
    chi2 = (((counts[nz] - n * p[nz]) ** 2) / (n * p[nz])).sum()
    assert chi2 < 20.52                                          # χ²(df=5) 99.9% quantile


def test_sumtree_bad_input():
    with pytest.raises(ValueError):
        sumtree_build(np.array([]))
    with pytest.raises(ValueError):
        sumtree_build(np.array([1.0, -1.0]))
    with pytest.raises(ValueError):
        sumtree_build(np.array([1.0, np.nan]))
    st_ = sumtree_build(np.array([1.0, 2.0]))
    with pytest.raises(ValueError):
        sumtree_set(st_, [0], [np.inf])
    sumtree_set(st_, [0, 1], [0.0, 0.0])
    with pytest.raises(ValueError, match="all zero"):
        sumtree_sample(st_, np.array([0.5]))


def test_sumtree_single_leaf_and_power_of_two_edges():
    for n in (1, 2, 3, 4, 5, 8, 9):
        w = np.arange(1, n + 1, dtype=np.float64)
        st_ = sumtree_build(w)
        _check_tree_consistent(st_, w)
        u = np.linspace(0, 1, 50, endpoint=False)
        np.testing.assert_array_equal(sumtree_sample(st_, u),
                                      np.searchsorted(np.cumsum(w), u * w.sum(), side="right"))


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 5), st.integers(1, 7), st.integers(1, 5),
       st.lists(st.integers(0, 12), min_size=0, max_size=6), st.integers(0, 2**31 - 1))
def test_window_push_rows_equal_flat_push(k, width, g, sizes, seed):
    # the 2-D form (arms [B], values [B, G]) is the flat push of repeat(arms, G), values.ravel()
    rng = np.random.default_rng(seed)
    flat, rows = window_init(k, width), window_init(k, width)
    pushes = []
    for b in sizes:
        arms = rng.integers(0, k, size=b)
        values = rng.standard_normal((b, g))
        window_push(rows, arms, values)
        window_push(flat, np.repeat(arms, g), values.ravel())
        pushes.append((np.repeat(arms, g).tolist(), values.ravel().tolist()))
    for a, b in zip(rows, flat):
        np.testing.assert_array_equal(a, b)
    assert window_contents(rows) == reference_windows(k, width, pushes)


def _plain_walk(tree, u):
    """The sum-tree draw as a per-draw loop: at each node go right when the right child is
    not empty and the mass is at least the left child (or the left child is empty)."""
    cap = tree.size // 2
    out = []
    for x in u:
        mass, j = float(x) * tree[1], 1
        while j < cap:
            left, right = tree[2 * j], tree[2 * j + 1]
            if (right > 0 and mass >= left) or left <= 0:
                mass, j = mass - left, 2 * j + 1
            else:
                j = 2 * j
        out.append(j - cap)
    return out


def test_sumtree_set_and_draw_on_deep_trees_equal_a_rebuild_and_the_plain_walk():
    """Trees deeper than the levels `sumtree_set` recomputes whole (sparse repair below, dense
    above), with empty leaves: the tree equals a rebuild bit for bit after each set, and every
    draw is the plain walk's."""
    rng = np.random.default_rng(9)
    for trial in range(6):
        n = int(rng.integers(3000, 40_000))
        w = rng.random(n) * (rng.random(n) < 0.7)
        st_ = sumtree_build(w)
        for _ in range(4):
            idx = rng.integers(0, n, int(rng.integers(1, 3000)))
            val = rng.random(idx.size) * (rng.random(idx.size) < 0.8)
            sumtree_set(st_, idx, val)
            for i, v in zip(idx, val):                 # the last weight wins
                w[i] = v
            np.testing.assert_array_equal(st_.tree, sumtree_build(w).tree)
            u = rng.random(300)
            u[:2] = [0.0, np.nextafter(1.0, 0.0)]
            assert sumtree_sample(st_, u).tolist() == _plain_walk(st_.tree, u)
