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


def test_predictor_ring_buffer_equals_a_slot_by_slot_loop():
    """The stage buffer written as a slice when a batch does not wrap the ring, by index when it
    does, and only the newest `buffer` groups of an oversized batch: the same slots as writing
    group j of every batch to slot (groups written before + j) mod buffer, one by one."""
    from rlpace.predict import predictor

    pool = Pool(["a", "b", "c"] * 20)
    buffer = 50
    pr = predictor(lr=0.0, stage_steps=1000, buffer=buffer)
    state = pr.init(pool)
    ref = {k: np.zeros(buffer) for k in ("wins", "n", "weight")}
    ref_ids = np.full(buffer, -1, np.int64)
    written = 0
    rng = np.random.default_rng(5)
    for b in (7, 13, 30, 0, 50, 9, 120, 1, 49, 2):     # slices, wraps, empty, oversized batches
        ids = rng.integers(0, 60, size=b)
        wins = rng.integers(0, 5, size=b).astype(float)
        n = np.full(b, 4.0)
        wt = rng.random(b)
        state = pr.update(state, pool, ids, wins, n, wt)
        for j in range(b):
            slot = written % buffer
            ref_ids[slot], ref["wins"][slot], ref["n"][slot], ref["weight"][slot] = ids[j], wins[j], n[j], wt[j]
            written += 1
        assert int(state.buf_len) == written
        assert state.buf_ids.tolist() == ref_ids.tolist()
        for k in ref:
            assert getattr(state, "buf_" + k).tolist() == ref[k].tolist()


def test_shape_weights_equal_the_plain_formula():
    """max(w, floor), divided by the batch mean (`np.mean`), min(w, clamp) — bit for bit."""
    from rlpace.policies._criticality import shape_weights

    rng = np.random.default_rng(1)
    for trial in range(200):
        w = np.exp(rng.normal(0.0, 2.0, size=int(rng.integers(1, 600))))
        floor, clamp = 0.1, float(rng.choice([10.0, 2.0, 1.5]))
        plain = np.maximum(w, floor)
        plain = np.minimum(plain / np.mean(plain), clamp)
        before = w.copy()
        got = shape_weights(w, floor, True, clamp)
        assert got.tobytes() == plain.tobytes()
        assert shape_weights(w, floor, False, clamp).tobytes() == np.minimum(np.maximum(w, floor), clamp).tobytes()
        assert w.tobytes() == before.tobytes()                   # the input is not written
    assert shape_weights(np.zeros(0), 0.1, True, 10.0).shape == (0,)


@pytest.mark.parametrize("n", [_BLOCK * 2048 * 2 + 5, _BLOCK * 4096, 100, 7])
def test_stage_pass_leaves_the_block_ends_of_its_cdf(n):
    """The stage pass takes the block ends from each piece of the CDF it writes: the same
    values as `cdf[_BLOCK - 1::_BLOCK]` (and the last entry for a short last block), kept for
    that very CDF object."""
    from rlpace.policies._criticality import _stage_proposal
    from rlpace.predict._logistic import dim

    rng = np.random.default_rng(n)
    dom = rng.integers(0, 3, size=n)
    pool = Pool(dom, clusters=dom * 2 + rng.integers(0, 2, size=n), difficulty=rng.normal(size=n))
    theta = rng.normal(0.0, 1.0, size=dim(pool))
    _, cdf = _stage_proposal(theta, pool, "learnability", 3.0, 0.1, 0.0, 0.01)
    kept, ends = pool._cache["criticality/cdf_block_ends"]
    assert kept is cdf
    plain = cdf[_BLOCK - 1::_BLOCK].tolist() + ([float(cdf[-1])] if n % _BLOCK else [])
    assert ends.tolist() == plain
    assert _block_ends(pool, cdf) is ends
