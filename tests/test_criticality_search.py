"""The criticality selection's two-level CDF search: the same answers as a plain
`bisect_right` walk over the CDF, for any non-decreasing CDF (plateaus, keys equal to
entries, keys past the last entry, pools shorter than one block or not a whole number of
blocks), so every stage draws the same prompts as numpy's own `searchsorted`."""

from __future__ import annotations

import bisect

import numpy as np
import pytest

from rlpace import Feedback, Pool, Scheduler
from rlpace.policies._criticality import _BLOCK, _block_ends, search_cdf
from rlpace.scheduler import _STREAM_PROPOSE


def _plain(cdf: np.ndarray, keys: np.ndarray) -> list[int]:
    """For each key, the number of CDF entries ≤ key, by Python's bisect over the list."""
    entries = cdf.tolist()
    return [bisect.bisect_right(entries, k) for k in keys.tolist()]


def _cdf(rng, n: int, scale: float = 1.0) -> np.ndarray:
    step = rng.random(n) * (rng.random(n) < 0.6)            # ~40 % zero steps: plateaus
    step[0] = 0.0 if n > 1 else 1.0
    c = np.cumsum(step)
    return c / c[-1] * scale if c[-1] > 0 else np.full(n, scale)


@pytest.mark.parametrize("n", [1, 2, _BLOCK - 1, _BLOCK, _BLOCK + 1, 3 * _BLOCK, 1000, 4099])
def test_search_cdf_equals_a_bisect_walk(n):
    rng = np.random.default_rng(n)
    for trial in range(40):
        # a last entry below the largest key too (a restored CDF may end at 1 − 1e-9)
        cdf = _cdf(rng, n, scale=1.0 if trial % 4 else 1.0 - 1e-10)
        keys = np.sort(np.concatenate([rng.random(60), rng.choice(cdf, 30), cdf[:1], cdf[-1:],
                                       [0.0, np.nextafter(1.0, 0.0)]]))
        ends = _block_ends(Pool(["a"] * n), cdf)
        assert ends.shape == (-(-n // _BLOCK),)
        got = search_cdf(cdf, keys, ends)
        assert got.dtype == np.int64
        assert got.tolist() == _plain(cdf, keys)


def test_the_selection_draws_what_the_plain_search_draws():
    """50 steps of criticality_is over 3 stages: every proposal equals the inverse-CDF draw with
    a bisect walk over the state's CDF and the same uniforms (no prompt falls back here)."""
    rng = np.random.default_rng(0)
    n = 5000
    dom = rng.integers(0, 4, size=n)
    pool = Pool(dom, clusters=dom * 3 + rng.integers(0, 3, size=n), difficulty=rng.normal(size=n))
    rate = rng.random(n)
    s = Scheduler(pool, "criticality_is", seed=3)
    for t in range(50):
        state = s.states["selection"]
        # the proposal's generator (`Scheduler.propose`); its first draw is the uniforms
        u = np.random.default_rng([3, t, _STREAM_PROPOSE]).random(64)
        ids = s.propose(64)
        assert float(state.norm[3]) == 0.0          # no fallback mass: ids are the CDF draws
        assert ids.tolist() == np.minimum(_plain(state.cdf, u), n - 1).tolist()
        r = (np.random.default_rng([9, t]).random((64, 8)) < rate[ids][:, None]).astype(float)
        s.observe(Feedback(ids, r, step=t))
    assert int(s.states["selection"].predictor.stage) == 2
