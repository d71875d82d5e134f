"""Fast hot-path helpers against the plain numpy formulas they replace, bit for bit
(suggested for tests/; written by the perf helper, who does not own tests/)."""

import numpy as np
import pytest

from rlpace import Feedback, Pool
from rlpace.policies._mopps import _closest
from rlpace.policies._uniform import _choice
from rlpace.types import _batch_and_counts, _success_counts, group_advantages


def _bits(x):
    x = np.asarray(x)
    return x.view(np.uint8) if x.dtype.kind == "f" else x


@pytest.mark.parametrize("g", [1, 2, 3, 4, 5, 8, 12, 16, 32, 64])
@pytest.mark.parametrize("kind", ["binary", "signed_zero", "shaped", "constant_rows"])
def test_batch_fast_path_equals_plain_formulas(g, kind):
    rng = np.random.default_rng(g)
    b = 64
    if kind == "binary":
        r = (rng.random((b, g)) < rng.random((b, 1))).astype(np.float64)
    elif kind == "signed_zero":
        r = rng.choice([0.0, -0.0, 1.0], size=(b, g))
    elif kind == "shaped":
        r = rng.random((b, g)) * (rng.random((b, g)) < 0.5)
    else:
        r = np.repeat((rng.random((b, 1)) < 0.5).astype(np.float64), g, axis=1)
    pool = Pool(rng.integers(0, 3, 100))
    fb = Feedback(rng.integers(0, 100, b), r, step=2)
    batch, wins, informative = _batch_and_counts(fb, pool, 0.5)
    success = r >= 0.5
    np.testing.assert_array_equal(_bits(batch.advantages), _bits(group_advantages(r)))
    np.testing.assert_array_equal(_bits(batch.pass_rate), _bits(success.mean(axis=1)))
    np.testing.assert_array_equal(wins, success.sum(axis=1))
    np.testing.assert_array_equal(informative, np.abs(group_advantages(r)).max(axis=1) > 1e-12)
    np.testing.assert_array_equal(_success_counts(success), success.sum(axis=1))


def test_closest_equals_argpartition_then_stable_sort():
    rng = np.random.default_rng(0)
    for m, n, dist in [(8192, 512, (rng.random(8192) - 0.5) ** 2), (100, 99, rng.random(100)),
                       (50, 10, rng.integers(0, 4, 50) / 4.0), (20, 5, np.zeros(20)), (5, 5, rng.random(5))]:
        keep = np.argpartition(dist, n - 1)[:n] if n < m else np.arange(m)
        np.testing.assert_array_equal(_closest(dist, n), keep[np.argsort(dist[keep], kind="stable")])


def test_choice_draws_equal_generator_choice():
    p = np.array([0.1, 0.0, 0.6, 0.3])
    a = _choice(np.random.default_rng(7), p, 1000)
    b = np.random.default_rng(7).choice(4, size=1000, p=p)
    np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError):
        _choice(np.random.default_rng(7), np.array([0.5, -0.1, 0.6]), 3)
