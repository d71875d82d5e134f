"""Counters in a restored state are bounded (rlpace.scheduler.COUNT_MAX = 2**62) and keep
their dtype through later updates, for every registered policy: a state whose integers
reach int64's edge is refused on load naming the key, and a state just under the bound
keeps training without wrapping, without turning an int64 into uint64 or float, and saves
a state the Scheduler loads again."""

from __future__ import annotations

import numpy as np
import pytest

from rlpace import Scheduler, policies
from rlpace.scheduler import COUNT_MAX, count_limit
from test_contract import POOL, STREAM, drive

NAMES = policies.names()
# Four steps of the contract stream, then the edited state replays the next four.
AT, UPTO = 4, 8


def _int_keys(sd):
    return [k for k, v in sd.items() if not k.startswith("meta/") and np.asarray(v).dtype.kind in "iu"
            and np.asarray(v).size]


def _with(sd, key, value):
    out = {k: np.array(v, copy=True) for k, v in sd.items()}
    out[key].reshape(-1)[0] = value
    return out


def test_the_bound_is_far_from_int64_edge():
    assert COUNT_MAX == 2**62 and COUNT_MAX + 2**61 < np.iinfo(np.int64).max
    assert count_limit(np.int64) == 2**62 and count_limit(np.int32) == 2**30 and count_limit(np.uint8) == 128


def _trains_on(dst, sd, key):
    """Replay the next steps from the loaded state: dtypes kept, no wrap, and the state it
    saves loads into a fresh Scheduler."""
    drive(dst, STREAM, AT, UPTO)
    after = dst.state_dict()
    for k, v in sd.items():
        assert np.asarray(after[k]).dtype == np.asarray(v).dtype, (key, k, np.asarray(after[k]).dtype)
    Scheduler(POOL, dst.method.name, seed=2).load_state_dict(after)


@pytest.mark.parametrize("name", NAMES)
def test_int64_edge_refused_and_large_counts_keep_dtype(name):
    src = Scheduler(POOL, name, seed=2)
    drive(src, STREAM, 0, AT)
    sd = src.state_dict()
    keys = _int_keys(sd)
    assert keys, "every Scheduler state has integer counters (history/attempts at least)"
    refused = loaded = 0
    for key in keys:
        dst = Scheduler(POOL, name, seed=2)
        before = dst.state_dict()
        edge = _with(sd, key, np.iinfo(sd[key].dtype).max)
        try:                                        # at the dtype's edge: refused, naming the key ...
            dst.load_state_dict(edge)
        except ValueError as e:
            assert key in str(e), (key, str(e))
            for k in before:                        # ... and nothing changed
                np.testing.assert_array_equal(np.asarray(dst.state_dict()[k]), np.asarray(before[k]), err_msg=k)
            refused += 1
        else:                                       # ... or not a count (a hash, a label): it trains on
            _trains_on(dst, sd, key)
        dst = Scheduler(POOL, name, seed=2)
        big = count_limit(sd[key].dtype) - 1000     # just under the bound: loads where other rules allow
        try:
            dst.load_state_dict(_with(sd, key, big))
        except ValueError:
            continue                                # an id, cursor or step has a tighter rule
        loaded += 1
        _trains_on(dst, sd, key)
        got = np.asarray(dst.state_dict()[key]).reshape(-1)[0]
        assert got >= -1, (key, got)                # no wrap to a large negative number
    assert refused >= 3 and loaded >= 1             # history/attempts, successes, counters at least
