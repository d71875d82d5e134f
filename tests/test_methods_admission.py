"""Admission policies: DAPO dynamic sampling (arXiv 2503.14476), success band (arXiv
2504.03380 / DataFlex difffilter), PODS max-variance subsets (arXiv 2504.13818) against brute
force, ADS drop-all-wrong."""

import itertools
import pickle

import numpy as np
import pytest

from rlpace import Feedback, Pool, Scheduler
from rlpace.policies import (dapo_dynamic_sampling, drop_all_wrong, max_variance_subset,
                             pods_max_variance, success_band)
from rlpace.types import Batch

POOL = Pool([0] * 8)


def apply(policy, rewards, threshold=0.5):
    r = np.asarray(rewards, dtype=float)
    b = Batch.from_feedback(Feedback(np.arange(r.shape[0]) % len(POOL), r, step=0), POOL, threshold)
    return policy.apply(policy.init(POOL), POOL, b)


# ---- DAPO ----------------------------------------------------------------------------------
def test_dapo_masks_and_refill():
    rewards = [[1, 0, 1], [1, 1, 1], [0, 0, 0], [0.7, 0.9, 0.6]]
    out = apply(dapo_dynamic_sampling(), rewards)              # metric = reward
    assert out.keep.tolist() == [[True] * 3, [False] * 3, [False] * 3, [True] * 3]
    assert out.refill == 2
    out = apply(dapo_dynamic_sampling(metric="success"), rewards)
    assert out.keep[:, 0].tolist() == [True, False, False, False]   # 0.6–0.9 all succeed
    assert out.refill == 3


def test_dapo_single_rollout_groups_kept():
    out = apply(dapo_dynamic_sampling(), [[1.0], [0.0]])
    assert out.keep.all() and out.refill == 0


def test_dapo_float_constant_group_is_dropped():
    out = apply(dapo_dynamic_sampling(), [[0.1] * 3, [0.1, 0.1, 0.1 + 1e-12]])
    assert out.keep[:, 0].tolist() == [False, True] and out.refill == 1


# ---- success band --------------------------------------------------------------------------
def test_success_band_inclusive_and_strict():
    # G = 5: pass rates 0, 0.2, 0.4, 0.8, 1.
    rewards = [[0] * 5, [1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0], [1] * 5]
    out = apply(success_band(inclusive=True), rewards)
    assert out.keep[:, 0].tolist() == [False, True, True, True, False] and out.refill == 2
    out = apply(success_band(inclusive=False), rewards)        # DataFlex threshold_band
    assert out.keep[:, 0].tolist() == [False, False, True, False, False] and out.refill == 4
    out = apply(success_band(low=0.0, high=0.4, inclusive=True), rewards)
    assert out.keep[:, 0].tolist() == [True, True, True, False, False] and out.refill == 2
    out = apply(success_band(low=0.0, high=0.4), rewards)      # open band (0, 0.4)
    assert out.keep[:, 0].tolist() == [False, True, False, False, False] and out.refill == 4


def test_success_band_default_is_dataflex_strict_band():
    # DataFlex-RL difffilter keeps 0.2 < rate < 0.8: with G = 5 only 0.4 and 0.6 survive.
    rewards = [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0]]
    out = apply(success_band(), rewards)
    assert out.keep[:, 0].tolist() == [False, True, True, False] and out.refill == 2


def test_success_band_uses_threshold():
    out = apply(success_band(low=0.5, high=0.5, inclusive=True), [[0.7, 0.3], [0.7, 0.9]],
                threshold=0.6)
    assert out.keep[:, 0].tolist() == [True, False]


# ---- PODS ----------------------------------------------------------------------------------
def test_pods_hand_cases():
    # m = 2 of [0.1, 0.9, 0.5, 0.2]: k=0 {0.9, 0.5} var .04; k=1 {0.1, 0.9} var .16;
    # k=2 {0.1, 0.2} var .0025 → keep rollouts 0 and 1.
    assert max_variance_subset(np.array([[0.1, 0.9, 0.5, 0.2]]), 2).tolist() == [[True, True, False, False]]
    # Binary, 3 ones of 8, m = 4 (round(0.5·8)): best k = 2 → 2 zeros + 2 ones (var .25).
    # Stable sort: zeros at 3..7 then ones 0, 1, 2; keep lowest 2 (3, 4) and top 2 (1, 2).
    keep = max_variance_subset(np.array([[1, 1, 1, 0, 0, 0, 0, 0]], float), 4)
    assert keep.tolist() == [[False, True, True, True, True, False, False, False]]
    # m = 3 of x = [5, 1, 3, 3]: sorted 1 (x[1]), 3 (x[2]), 3 (x[3]), 5 (x[0]). k=1 {1} + top 2 {3 (x[3]), 5}
    # and k=2 {1, 3 (x[2])} + {5} tie at var 8/3 (k=0, k=3: 8/9); the smaller k wins.
    assert max_variance_subset(np.array([[5.0, 1.0, 3.0, 3.0]]), 3).tolist() == [[True, True, False, True]]


def test_pods_default_m_and_policy():
    out = apply(pods_max_variance(), [[1, 0, 1, 0, 1, 1]])     # G = 6 → m = 3
    assert out.keep.sum() == 3 and out.refill == 0
    out = apply(pods_max_variance(), [[1, 0, 1, 0, 1]])        # G = 5 → round(2.5) = 2
    assert out.keep.sum() == 2
    assert sorted(np.array([1, 0, 1, 0, 1])[out.keep[0]].tolist()) == [0, 1]
    assert apply(pods_max_variance(), [[1.0]]).keep.all()      # G = 1 → m = 1
    assert apply(pods_max_variance(m=10), [[1, 0, 1]]).keep.all()


def test_pods_equals_brute_force_on_random_groups():
    rng = np.random.default_rng(0)
    for trial in range(300):
        g = int(rng.integers(2, 8))
        m = int(rng.integers(1, g + 1))
        b = 5
        if trial % 3 == 0:
            r = rng.integers(0, 3, (b, g)).astype(float)       # many ties
        else:
            r = rng.normal(size=(b, g)) * 10.0 ** rng.integers(-3, 4)
        keep = max_variance_subset(r, m)
        assert (keep.sum(axis=1) == m).all()
        for i in range(b):
            best = max(np.var(r[i, list(c)]) for c in itertools.combinations(range(g), m))
            got = np.var(r[i, keep[i]])
            assert got >= best - 1e-9 * max(1.0, abs(best)), (r[i], m)


def test_pods_large_offset_is_stable():
    r = 1e8 + np.array([[0.0, 1.0, 0.5, 0.25]])
    assert max_variance_subset(r, 2).tolist() == [[True, True, False, False]]


# ---- drop_all_wrong ------------------------------------------------------------------------
def test_drop_all_wrong():
    out = apply(drop_all_wrong(), [[0, 0], [1, 0], [1, 1], [0.4, 0.49]])
    assert out.keep[:, 0].tolist() == [False, True, True, False] and out.refill == 0


# ---- empty batch, chaining, Scheduler ------------------------------------------------------
@pytest.mark.parametrize("factory", [dapo_dynamic_sampling, success_band, pods_max_variance,
                                     drop_all_wrong])
def test_empty_batch(factory):
    out = apply(factory(), np.zeros((0, 4)))
    assert out.keep.shape == (0, 4) and out.refill == 0


def test_chain_dapo_then_pods():
    s = Scheduler(POOL, "dapo_dynamic_sampling+pods_max_variance")
    adm = s.admission(Feedback([0, 1], [[1, 1, 1, 1], [1, 0, 0, 0]], step=0))
    # group 0 dropped by DAPO (refill 1); group 1 keeps m = 2: one 1 and one 0. Sorted:
    # 0 (x[1]), 0 (x[2]), 0 (x[3]), 1 (x[0]); k=0 (top two: x[3], x[0]) and k=1 (x[1], x[0]) tie at var
    # 1/4, the smaller k wins → rollouts 0 and 3.
    assert adm.keep.tolist() == [[False] * 4, [True, False, False, True]] and adm.refill == 1


@pytest.mark.parametrize("name", ["dapo_dynamic_sampling", "success_band", "pods_max_variance",
                                  "drop_all_wrong"])
def test_end_to_end(name):
    rng = np.random.default_rng(0)
    pool = Pool(rng.choice(["a", "b"], 50))
    s = Scheduler(pool, name, seed=2)
    for t in range(4):
        ids = s.propose(10)
        fb = Feedback(ids, (rng.random((10, 6)) < 0.5).astype(float), step=t)
        s.observe(fb)
        adm = s.admission(fb)
        assert adm.keep.shape == (10, 6) and adm.keep.dtype == bool and adm.refill >= 0
        if name != "pods_max_variance":                        # whole groups kept or dropped
            assert (adm.keep.all(axis=1) | ~adm.keep.any(axis=1)).all()
            assert adm.refill == (0 if name == "drop_all_wrong" else int((~adm.keep[:, 0]).sum()))
    fresh = Scheduler(pool, name, seed=2)
    fresh.load_state_dict(pickle.loads(pickle.dumps(s.state_dict())))
    np.testing.assert_array_equal(s.propose(10), fresh.propose(10))


def test_bad_hyperparameters():
    for make in (lambda: dapo_dynamic_sampling(metric="acc"), lambda: success_band(0.8, 0.2),
                 lambda: success_band(-0.1, 0.5), lambda: pods_max_variance(m=0),
                 lambda: pods_max_variance(m=1.5)):
        with pytest.raises(ValueError):
            make()


def test_pods_binary_rewards_without_a_sort_equal_the_sorting_rule():
    """0/1 rewards take a table of every row's mask (G ≤ 16) or the kept pattern of the row's
    count of ones (larger G): the mask of the general rule (stable sort, prefix sums) bit for
    bit, for every G and m, and each kept subset has the largest variance of any m-subset."""
    from fractions import Fraction
    from rlpace.policies._admission import _binary_by_count, _max_variance_subset
    rng = np.random.default_rng(5)
    for trial in range(300):
        g = int(rng.integers(2, 21))
        m = int(rng.integers(1, g))
        r = (rng.random((7, g)) < rng.random((7, 1))).astype(float)
        r[0] = 0.0                                      # all wrong and all right rows
        r[1] = 1.0
        want = _max_variance_subset(r, m)
        np.testing.assert_array_equal(max_variance_subset(r, m), want)
        np.testing.assert_array_equal(_binary_by_count(r == 1.0, m), want)
        for row, keep in zip(r, want):
            c = int(row.sum())
            best = max(Fraction(q, m) - Fraction(q, m) ** 2 for q in range(max(0, m - (g - c)), min(m, c) + 1))
            q = int(row[keep].sum())
            assert Fraction(q, m) - Fraction(q, m) ** 2 == best
