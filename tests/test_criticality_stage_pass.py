"""The criticality stage pass and the predictor's logits, written in cache-sized pieces with
fewer temporaries: the same bits as the whole-array formulas they replace (every entry goes
through the same floating-point operations in the same order), so every stage draws the same
prompts."""

from __future__ import annotations

import numpy as np
import pytest

from rlpace import Pool
from rlpace.policies._criticality import _CHUNK, _criticality, _stage_proposal
from rlpace.predict._logistic import _difficulty_columns, _feature_stats, _use_clusters, dim, logits


def _pool(n, seed, features=False, difficulty=True, clusters=True):
    rng = np.random.default_rng(seed)
    dom = rng.integers(0, 5, size=n)
    return Pool(dom, clusters=dom * 3 + rng.integers(0, 3, size=n) if clusters else None,
                difficulty=rng.normal(size=n) if difficulty else None,
                features=rng.normal(size=(n, 2)) if features else None)


def _plain_logits(theta, pool, ids):
    """θ·x_i term by term, in the order the predictor adds them: offset, features, difficulty
    columns, domain, cluster."""
    f = 0 if pool.features is None else pool.features.shape[1]
    dcols = _difficulty_columns(pool)
    e = 1 + f + len(dcols)
    z = np.full(ids.shape[0], theta[0])
    if f:
        mean, inv = _feature_stats(pool)
        u = theta[1:1 + f] * inv
        z = np.full(ids.shape[0], theta[0] - float(mean @ u))
        z += np.asarray(pool.features[ids], dtype=np.float32) @ u.astype(np.float32)
    for j, c in enumerate(dcols):
        z += theta[1 + f + j] * c[ids]
    z += theta[e:e + pool.n_domains][pool.domains[ids]]
    if _use_clusters(pool):
        z += theta[e + pool.n_domains:][pool.clusters[ids]]
    return z


@pytest.mark.parametrize("features,difficulty,clusters", [(False, True, True), (True, True, True),
                                                          (False, False, True), (False, True, False)])
def test_logits_equal_the_term_by_term_sum(features, difficulty, clusters):
    pool = _pool(5000, 1, features, difficulty, clusters)
    theta = np.random.default_rng(2).normal(0.0, 1.5, size=dim(pool))
    ids = np.random.default_rng(3).integers(0, 5000, size=700)
    np.testing.assert_array_equal(logits(theta, pool, ids), _plain_logits(theta, pool, ids))
    np.testing.assert_array_equal(logits(theta, pool), _plain_logits(theta, pool, np.arange(5000)))


def _plain_stage(theta, pool, target, alpha, epsilon, threshold):
    """The stage's (max c, Z, cdf) with the whole-array affine map: c of every prompt, the
    cumulative exp in 2¹⁶-prompt pieces (as the pass accumulates it), then
    cdf ·= (1 − ε)/E_N, += ε·(i + 1)/N, /= its last entry."""
    n = len(pool)
    c = _criticality(_plain_logits(theta, pool, np.arange(n)), target)
    cmax = float(c.max())
    if not cmax > threshold:
        return cmax, float(n), np.arange(1, n + 1, dtype=np.float64) / n
    cdf = np.empty(n)
    z, run = 0.0, 0.0
    for s in range(0, n, _CHUNK):
        e = np.exp(alpha * (c[s:s + _CHUNK] - cmax))
        z += float(e.sum())
        cdf[s:s + _CHUNK] = np.cumsum(e) + run
        run = float(cdf[min(s + _CHUNK, n) - 1])
    cdf *= (1.0 - epsilon) / run
    if epsilon:
        cdf += np.arange(1, n + 1, dtype=np.float64) * (epsilon / n)
    cdf /= cdf[-1]
    return cmax, z, cdf


@pytest.mark.parametrize("target,epsilon,threshold", [("learnability", 0.1, 0.0), ("failure", 0.0, 0.0),
                                                      ("learnability", 0.3, 0.2), ("failure", 0.1, 1.0)])
def test_stage_pass_is_the_whole_array_formula_bit_for_bit(target, epsilon, threshold):
    n = 2 * _CHUNK + 12_345                        # three pieces, the last one short
    pool = _pool(n, 4)
    theta = np.random.default_rng(5).normal(0.0, 1.0, size=dim(pool))
    norm, cdf = _stage_proposal(theta, pool, target, 3.0, epsilon, threshold, 0.01)
    cmax, z, ref = _plain_stage(theta, pool, target, 3.0, epsilon, threshold)
    assert norm[1] == cmax and norm[2] == z
    np.testing.assert_array_equal(cdf, ref)
    assert cdf[-1] == 1.0


@pytest.mark.parametrize("features,difficulty,clusters", [(False, True, True), (True, True, True),
                                                          (False, False, True), (False, True, False)])
def test_logits_into_reused_buffers_equal_the_term_by_term_sum(features, difficulty, clusters):
    """The stage pass scores each piece into buffers it reuses (`out`, `scratch`): the sum lands
    in `out`, bit for bit the term-by-term sum, whatever the buffers held before."""
    pool = _pool(5000, 6, features, difficulty, clusters)
    theta = np.random.default_rng(7).normal(0.0, 1.5, size=dim(pool))
    out, scratch = np.full(1200, np.nan), np.full(1200, 1e300)
    got = logits(theta, pool, slice(1000, 2200), out=out, scratch=scratch)
    assert got is out
    np.testing.assert_array_equal(out, _plain_logits(theta, pool, np.arange(1000, 2200)))


@pytest.mark.parametrize("target", ["learnability", "failure"])
def test_criticality_written_in_place_equals_the_formula(target):
    z = np.random.default_rng(8).normal(0.0, 3.0, size=4000)
    pi = 0.5 * (1.0 + np.tanh(0.5 * z))
    out = np.empty(4000)
    got = _criticality(z, target, out=out)
    assert got is out
    np.testing.assert_allclose(out, 4.0 * pi * (1.0 - pi) if target == "learnability" else 1.0 - pi,
                               rtol=0, atol=1e-15)
    np.testing.assert_array_equal(out, _criticality(z, target))


def test_the_uniform_part_of_the_cdf_is_built_once_per_pool():
    """ε·(i + 1)/N depends on (N, ε) only: the second stage switch reads the array the first
    built (the same object), and its entries are the piecewise products the pass used to form."""
    from rlpace.policies._criticality import _epsilon_ramp
    n = _CHUNK + 10
    pool = _pool(n, 9)
    theta = np.random.default_rng(10).normal(size=dim(pool))
    _stage_proposal(theta, pool, "learnability", 3.0, 0.1, 0.0, 0.01)
    first = _epsilon_ramp(pool, n, 0.1)
    _stage_proposal(-theta, pool, "learnability", 3.0, 0.1, 0.0, 0.01)
    assert _epsilon_ramp(pool, n, 0.1) is first
    np.testing.assert_array_equal(first[_CHUNK:], np.arange(_CHUNK + 1, n + 1, dtype=np.float64) * (0.1 / n))
    assert _epsilon_ramp(pool, n, 0.2)[-1] == 0.2 and _epsilon_ramp(pool, n, 0.2) is not first


def test_refit_hessian_mirror_equals_the_triangle_indices():
    """The refit's Xᵀ·diag(w)·X fills its lower triangle with one masked copy of its transpose:
    the same bits as mirroring through np.triu_indices, and equal to the dense product."""
    from rlpace.predict._logistic import _rows, _xt_w_x, design
    pool = _pool(3000, 11, features=True)
    ids = np.random.default_rng(12).integers(0, 3000, size=800)
    w = np.random.default_rng(13).random(800)
    h = _xt_w_x(_rows(pool, ids), w)
    ref = h.copy()
    ref[np.tril_indices(ref.shape[0], -1)] = 0.0
    iu = np.triu_indices(ref.shape[0], 1)
    ref[iu[1], iu[0]] = ref[iu]
    assert h.tobytes() == ref.tobytes()
    x = design(pool, ids)
    np.testing.assert_allclose(h, x.T @ (x * w[:, None]), rtol=1e-12, atol=1e-12)
    from rlpace.predict._logistic import _strict_lower
    assert _strict_lower(h.shape[0]).sum() == h.shape[0] * (h.shape[0] - 1) // 2
