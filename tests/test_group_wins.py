"""MoPPS's and the learnability policies' updates read each group's count of successes
through `group_wins`: for G a power of two it is read back from the batch's pass rate (one
multiply instead of a cast and a matrix product over [B, G]). It must be the count a plain
loop over each group's rollouts gives, bit for bit, for every G and every kind of reward."""

from __future__ import annotations

import numpy as np
import pytest

from rlpace import Feedback, Pool
from rlpace.types import _batch_and_counts, group_wins


def _plain_counts(success):
    """Successes per group, one rollout at a time."""
    out = []
    for row in success.tolist():
        k = 0
        for s in row:
            k += 1 if s else 0
        out.append(float(k))
    return out


@pytest.mark.parametrize("g", [1, 2, 3, 4, 7, 8, 12, 16, 32, 48, 64, 128])
@pytest.mark.parametrize("kind", ["binary", "graded", "given_advantages"])
def test_group_wins_is_the_count_of_successes(g, kind):
    rng = np.random.default_rng([g, len(kind)])
    pool = Pool(rng.integers(0, 3, size=200))
    for trial in range(20):
        b = int(rng.integers(1, 64))
        ids = rng.choice(len(pool), size=b, replace=False)
        p = rng.random((b, 1)) ** rng.choice([0.2, 1.0, 5.0])
        rewards = (rng.random((b, g)) < p).astype(np.float64)
        extras = {}
        if kind == "graded":
            rewards = np.round(rewards * rng.random((b, g)), 3)
        if kind == "given_advantages":
            extras["advantages"] = rng.standard_normal((b, g))
        fb = Feedback(ids, rewards, step=trial, **extras)
        batch, wins, _ = _batch_and_counts(fb, pool, 0.5)
        got = group_wins(batch)
        assert got.dtype == np.float64
        assert got.tolist() == _plain_counts(batch.success)
        assert got.tolist() == wins.astype(np.float64).tolist()


def test_group_wins_reads_the_pass_rate_only_for_a_power_of_two():
    """Which path is taken: a pass rate that disagrees with the mask (a hand-built batch)
    shows through for G = 16 (the product) and not for G = 12 (the count), and a batch
    without a pass rate is counted from its mask."""
    pool = Pool([0, 0, 1, 1])
    for g, from_rate in ((16, True), (12, False)):
        rewards = np.zeros((2, g))
        rewards[0, :3] = 1.0
        batch, _, _ = _batch_and_counts(Feedback(np.array([0, 2]), rewards, step=0), pool, 0.5)
        assert group_wins(batch).tolist() == [3.0, 0.0]
        odd = batch._replace(pass_rate=np.array([0.5, 0.25]))
        assert group_wins(odd).tolist() == ([g / 2, g / 4] if from_rate else [3.0, 0.0])
        assert group_wins(batch._replace(pass_rate=None)).tolist() == [3.0, 0.0]
