"""A state saved before a record gained a field loads, with the field derived as the saving
code behaved: MoPPS's `moved` mask (prompts off the Beta prior) for mopps and recommended."""

import numpy as np
import pytest

from rlpace import Feedback, Pool, Scheduler
from rlpace.errors import InputError

KEY = "policy/selection/moved"


def _pool():
    return Pool([f"d{i % 3}" for i in range(60)])


def _run(s, steps, rng):
    for t in range(steps):
        ids = s.propose(8)
        s.observe(Feedback(ids, (rng.random((8, 4)) < 0.4).astype(np.float64), step=t))


@pytest.mark.parametrize("method", ["mopps", "recommended"])
def test_a_state_saved_without_the_moved_mask_resumes_the_same_stream(method):
    rng = np.random.default_rng(3)
    a = Scheduler(_pool(), method, seed=5)
    _run(a, 6, rng)
    sd = a.state_dict()
    old = {k: v for k, v in sd.items() if k != KEY}            # as saved before the field existed
    # the mask is derivable: every prompt observed so far left the prior in this run
    want = (sd["policy/selection/alpha"] != 1.0) | (sd["policy/selection/beta"] != 1.0)
    assert np.array_equal(sd[KEY], want) and want.sum() > 0
    b = Scheduler(_pool(), method, seed=5)
    b.load_state_dict(old)
    assert np.array_equal(b.state_dict()[KEY], want)
    rng_a, rng_b = np.random.default_rng(9), np.random.default_rng(9)
    for t in range(6, 11):                                      # the same proposals from here on
        ia, ib = a.propose(8), b.propose(8)
        assert np.array_equal(ia, ib)
        r = (rng_a.random((8, 4)) < 0.5).astype(np.float64)
        assert np.array_equal(r, (rng_b.random((8, 4)) < 0.5).astype(np.float64))
        a.observe(Feedback(ia, r, step=t))
        b.observe(Feedback(ib, r, step=t))


def test_a_missing_field_is_not_derived_from_inputs_of_the_wrong_shape():
    a = Scheduler(_pool(), "mopps", seed=0)
    sd = {k: v for k, v in a.state_dict().items() if k != KEY}
    sd["policy/selection/alpha"] = np.ones(7)
    b = Scheduler(_pool(), "mopps", seed=0)
    before = b.state_dict()
    with pytest.raises(InputError, match="policy/selection/moved"):
        b.load_state_dict(sd)
    after = b.state_dict()
    assert all(np.array_equal(before[k], after[k]) for k in before)
