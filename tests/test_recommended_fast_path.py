"""`recommended`'s step with fewer numpy calls: each shortcut against the plain rule it
replaces, bit for bit (the stream digests in test_scheduler_stream.py check the whole step)."""

from __future__ import annotations

import numpy as np
import pytest

from rlpace import Pool
from rlpace._checks import shifted
from rlpace.policies import make_policy
from rlpace.policies._base import softmax


@pytest.mark.parametrize("counting", ["cumulative", "windowed"])
def test_dump_pool_base_scores_in_python_floats_equal_the_array_formula(counting):
    """DUMP's apply with base="pool" (recommended's mixture) against its rule written with numpy
    arrays, score + T·log(share) then the softmax, bit for bit: windows of every fill, counts up
    to 10**12, |A| up to 1e100, arms of 1 to ~200 prompts."""
    from rlpace.policies._dump import DumpState
    from rlpace.stats._window import Window, window_mean
    rng = np.random.default_rng(12)
    for trial in range(300):
        k, w = int(rng.integers(1, 70)), int(rng.integers(1, 40))
        c, temp = float(rng.choice([0.0, 1.0, rng.random() * 3])), float(rng.choice([0.15, 1.0, rng.random() + 0.01]))
        policy = make_policy("dump", c=c, temperature=temp, window=w, counting=counting, base="pool")
        filled = rng.integers(0, w + 1, size=k)
        values = rng.random((k, w)) * 10.0 ** rng.integers(-3, 101, size=(k, 1))
        values[np.arange(w)[None, :] >= filled[:, None]] = 0.0
        count = np.maximum(filled, rng.integers(0, 10 ** int(rng.integers(1, 13)), size=k))
        state = DumpState(Window(values, rng.integers(0, w, size=k), filled), count)
        labels = np.concatenate([np.arange(k), rng.integers(0, k, size=int(rng.integers(0, 200)))])
        pool = Pool(labels)
        share = np.bincount(pool.arm_codes("domain"), minlength=k) / len(pool)
        n = count if counting == "cumulative" else filled
        score = window_mean(state.window) + c * np.sqrt(2.0 * np.log(max(1, int(n.sum())) + 1) / (n + 1))
        with np.errstate(divide="ignore"):
            score = score + temp * np.log(share)
        want = softmax(shifted(score), temp)
        got = policy.apply(state, pool)
        assert got.dtype == np.float64 and got.tobytes() == want.tobytes(), trial
        assert policy.apply(state, pool).tobytes() == want.tobytes()      # the cached log shares


def test_dump_pool_base_tilts_by_the_pool_shares():
    """Equal (empty) windows: p ∝ share, hand-computed 1/4, 3/4; the second call reads the cached
    log shares and gives the same bits."""
    pool = Pool(["a", "b", "b", "b"])
    policy = make_policy("dump", temperature=0.5, window=4, base="pool")
    st = policy.init(pool)
    p = policy.apply(st, pool)
    np.testing.assert_allclose(p, [0.25, 0.75], rtol=0, atol=1e-15)
    assert pool._cache[("dump/log_share", "domain")] == np.log([0.25, 0.75]).tolist()   # taken once
    assert policy.apply(st, pool).tobytes() == p.tobytes()
