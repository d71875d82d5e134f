"""`kept_group_advantages`: PODS's advantages over the kept subset, against hand-computed
values and an independent per-row loop."""

import numpy as np
import pytest

from rlpace import group_advantages, kept_group_advantages


def test_hand_computed_subset():
    # kept rewards of row 0: {1, 0, 0} -> mean 1/3, population std sqrt(2)/3
    r = np.array([[1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 1.0, 0.0]])
    keep = np.array([[True, False, True, True], [True, True, False, False]])
    a = kept_group_advantages(r, keep)
    s = np.sqrt(2.0) / 3.0
    assert a[0].tolist() == pytest.approx([(2 / 3) / (s + 1e-6), 0.0, (-1 / 3) / (s + 1e-6), (-1 / 3) / (s + 1e-6)])
    assert a[1].tolist() == pytest.approx([1.0 / (0.5 + 1e-6) * 0.5, -0.5 / (0.5 + 1e-6), 0.0, 0.0])


def test_degenerate_rows_are_zero():
    r = np.array([[1.0, 0.0, 1.0], [1.0, 0.0, 0.0], [0.3, 0.3, 0.9]])
    keep = np.array([[True, False, True], [False, True, False], [False, False, False]])
    assert (kept_group_advantages(r, keep) == 0).all()


def test_all_kept_is_group_advantages_bit_for_bit():
    rng = np.random.default_rng(0)
    r = rng.random((7, 5))
    assert np.array_equal(kept_group_advantages(r, np.ones_like(r, bool)), group_advantages(r))


def test_against_independent_loop():
    rng = np.random.default_rng(1)
    r = rng.integers(0, 3, size=(50, 6)).astype(float)
    keep = rng.random((50, 6)) < 0.6
    got = kept_group_advantages(r, keep)
    for i in range(50):
        vals = [r[i, j] for j in range(6) if keep[i, j]]
        for j in range(6):
            if not keep[i, j] or len(vals) == 0:
                assert got[i, j] == 0.0
                continue
            m = sum(vals) / len(vals)
            sd = (sum((v - m) ** 2 for v in vals) / len(vals)) ** 0.5
            want = 0.0 if sd == 0 else (r[i, j] - m) / (sd + 1e-6)
            assert got[i, j] == pytest.approx(want, abs=1e-12)


def test_shape_mismatch_names_keep():
    with pytest.raises(ValueError, match="keep has shape"):
        kept_group_advantages(np.zeros((2, 3)), np.ones((2, 2), bool))


def test_huge_rewards_stay_finite_and_scale_free():
    # r and r·1e300 have the same advantages in exact arithmetic (eps scales with r).
    r = np.array([[3.0, 1.0, 2.0, 2.0], [1.0, 0.0, 0.0, 0.0]])
    big = r * 1e300
    a_small = group_advantages(r / 3.0, eps=1e-6 / 1e300 / 1.0)   # the same normalised problem
    a_big = group_advantages(big)
    assert np.isfinite(a_big).all()
    # row 0: mean 2, std sqrt(0.5) -> A = [1.414.., -1.414.., 0, 0]
    assert a_big[0].tolist() == pytest.approx([2 ** 0.5, -(2 ** 0.5), 0.0, 0.0], rel=1e-9)
    assert a_big[1].tolist() == pytest.approx(a_small[1].tolist(), rel=1e-9)
    keep = np.array([[True, True, False, False], [True, True, True, False]])
    k_big = kept_group_advantages(np.array([[1e308, -1e308, 5.0, 5.0], [1e308, 0.0, 0.0, 7.0]]), keep)
    assert k_big[0].tolist() == pytest.approx([1.0, -1.0, 0.0, 0.0], rel=1e-9)
    assert k_big[1].tolist() == pytest.approx([2 ** 0.5, -(2 ** 0.5) / 2, -(2 ** 0.5) / 2, 0.0], rel=1e-9)


def test_admission_says_which_advantages_a_partly_kept_group_trains_on():
    from rlpace import Feedback, Pool, Scheduler
    pool = Pool(["a"] * 4)
    fb = Feedback([0, 1], [[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 0.0, 0.0]], step=0)
    topk = Scheduler(pool, "uniform+topk", seed=0).admission(fb)
    pods = Scheduler(pool, "uniform+pods_max_variance", seed=0).admission(fb)
    both = Scheduler(pool, "uniform+dapo_dynamic_sampling+topk", seed=0).admission(fb)
    assert topk.full_group_advantages is True
    assert pods.full_group_advantages is False
    assert both.full_group_advantages is True
