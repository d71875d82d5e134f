"""`Scheduler.allocate(ids, budget, unit=G)`: rollouts in multiples of an engine's group size
(TRL generates num_generations per copy of a prompt), the policy's allocation rounded by
largest remainder with the sum kept — against hand-computed values and a plain loop."""

import numpy as np
import pytest

from _isolated import assert_state_equal
from rlpace import Feedback, Pool, Scheduler


def knapsack_scheduler():
    s = Scheduler(Pool(["a"] * 4), "knapsack", max_n=16)
    s.observe(Feedback([0, 1, 2, 3], [[1, 0] * 4, [1, 0, 0, 0] * 2, [0] * 8, [1] * 8], step=0))
    return s


def round_loop(n, unit):
    """Largest remainder (equal remainders: the larger n, then the first), the obvious loop."""
    units = [x // unit for x in n]
    rem = [x % unit for x in n]
    left = sum(n) // unit - sum(units)
    order = sorted(range(len(n)), key=lambda i: (-rem[i], -n[i], i))
    for i in order[:left]:
        units[i] += 1
    return [u * unit for u in units]


def test_hand_computed_rounding_of_the_knapsack_allocation():
    s = knapsack_scheduler()
    ids = np.array([0, 1, 2, 3])
    assert s.allocate(ids, 32).tolist() == [6, 9, 15, 2]
    # 6, 9, 15, 2 = 4·(1, 2, 3, 0) + (2, 1, 3, 2): 2 units left → remainder 3 (prompt 2), then
    # remainder 2: prompts 0 (N = 6) and 3 (N = 2) tie, the larger N wins
    assert s.allocate(ids, 32, unit=4).tolist() == [8, 8, 16, 0]
    # = 2·(3, 4, 7, 1) + (0, 1, 1, 0): 1 unit left, prompts 1 (N = 9) and 2 (N = 15) tie → prompt 2
    assert s.allocate(ids, 32, unit=2).tolist() == [6, 8, 16, 2]
    assert s.allocate(ids, 32, unit=1).tolist() == [6, 9, 15, 2]


@pytest.mark.parametrize("seed", range(8))
def test_rounding_equals_the_loop_and_keeps_the_budget(seed):
    rng = np.random.default_rng(seed)
    s = Scheduler(Pool(["a", "b"] * 10), "knapsack", max_n=24, min_count=2)
    for t in range(3):
        ids = s.propose(6)
        n = s.allocate(ids, 48)
        r = np.zeros((6, int(n.max())))
        for j, k in enumerate(n):
            r[j, :k] = rng.random(k) < rng.random()
        s.observe(Feedback(ids, r, step=t, group_sizes=n))
        n = s.allocate(ids, 48)                     # after the feedback: what the rounding starts from
        for unit in (2, 3, 4, 8):
            got = s.allocate(ids, 48, unit=unit)
            assert got.tolist() == round_loop(n.tolist(), unit)
            assert got.sum() == 48 and (got % unit == 0).all() and got.max() <= -(-24 // unit) * unit


def test_uniform_without_a_policy_splits_the_units_evenly():
    s = Scheduler(Pool(["a"] * 8), "uniform")
    assert s.allocate(np.arange(4), 16, unit=4).tolist() == [4, 4, 4, 4]
    assert s.allocate(np.arange(3), 12, unit=2).tolist() == [4, 4, 4]
    assert s.allocate(np.arange(3), 10, unit=2).tolist() == [4, 4, 2]


@pytest.mark.parametrize("budget, unit, match", [(30, 4, "not a multiple of unit 4"), (32, 0, "unit must be"),
                                                 (32, 2.0, "unit must be"), (32, True, "unit must be")])
def test_bad_unit_one_error_state_unchanged(budget, unit, match):
    s = knapsack_scheduler()
    before = s.state_dict()
    with pytest.raises(ValueError, match=match):
        s.allocate(np.arange(4), budget, unit=unit)
    assert_state_equal(s.state_dict(), before)
