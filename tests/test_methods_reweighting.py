"""Reweighting policies (DataFlex-RL, arXiv 2609.06107, configs 3–5): hand-computed
weights, mean-one normalisation, degenerate batches, and the Scheduler path."""

import math
import pickle

import numpy as np
import pytest

from rlpace import Feedback, Pool, Scheduler
from rlpace.policies import difficulty_band, per_advantage, softmax_advantage
from rlpace.types import Batch

POOL = Pool([0] * 4)


def weights(policy, rewards, advantages=None):
    r = np.asarray(rewards, dtype=float)
    b = Batch.from_feedback(Feedback(np.arange(r.shape[0]), r, advantages, step=0), POOL, 0.5)
    return policy.apply(policy.init(POOL), POOL, b)


def test_per_advantage_hand_computed():
    # |A| = [1, 4, 0, 9] → sqrt = [1, 2, 0, 3], mean 1.5 → [2/3, 4/3, 0, 2].
    w = weights(per_advantage(), [[1, 0], [1, 0]], [[1.0, -4.0], [0.0, 9.0]])
    np.testing.assert_allclose(w, [[2 / 3, 4 / 3], [0.0, 2.0]])
    # α = 1: |A| = [1, 3] → [0.5, 1.5].
    np.testing.assert_allclose(weights(per_advantage(alpha=1.0), [[1, 0]], [[1.0, -3.0]]), [[0.5, 1.5]])


def test_per_advantage_degenerate():
    np.testing.assert_array_equal(weights(per_advantage(), [[1, 1], [0, 0]]), np.ones((2, 2)))
    np.testing.assert_array_equal(weights(per_advantage(alpha=0.0), [[1, 0]], [[0.0, 5.0]]),
                                  np.ones((1, 2)))


def test_difficulty_band_hand_computed():
    # 8 rewards sorted: 0, .2, .4, .5, .5, .6, .8, 1. Linear quantiles: q25 at 1.75 →
    # 0.2 + 0.75·0.2 = 0.35; q75 at 5.25 → 0.6 + 0.25·0.2 = 0.65. Inside: .4, .6, .5, .5
    # → weight 2, the other four 1; mean 1.5 → 4/3 and 2/3.
    w = weights(difficulty_band(), [[0, 0.4, 0.6, 1.0], [0.2, 0.8, 0.5, 0.5]])
    np.testing.assert_allclose(w, [[2 / 3, 4 / 3, 4 / 3, 2 / 3], [2 / 3, 2 / 3, 4 / 3, 4 / 3]])
    np.testing.assert_allclose(w.mean(), 1.0)


def test_difficulty_band_binary_and_degenerate():
    # 2 of 8 succeed: q25 = 0, q75 = 0 + 0.25·1 = 0.25 → failures inside (2), successes
    # outside (1):
    # w = [1, 1, 2×6] / (14/8).
    w = weights(difficulty_band(), [[1, 1, 0, 0], [0, 0, 0, 0]])
    np.testing.assert_allclose(w, np.array([[1, 1, 2, 2], [2, 2, 2, 2]]) / 1.75)
    np.testing.assert_array_equal(weights(difficulty_band(), [[0.3]]), [[1.0]])     # one rollout
    # inside = 0 and no rollout outside → mean 0 → all ones.
    np.testing.assert_array_equal(weights(difficulty_band(inside=0.0), [[1, 1], [1, 1]]), np.ones((2, 2)))


def test_softmax_advantage_hand_computed():
    # |A| = [0, ln 3]: softmax = [1/4, 3/4], × 2 rollouts = [0.5, 1.5].
    np.testing.assert_allclose(weights(softmax_advantage(), [[1, 0]], [[0.0, math.log(3)]]), [[0.5, 1.5]])
    # T = 2: softmax([0, ln3 / 2]) = [1, √3] / (1 + √3), × 2.
    w = weights(softmax_advantage(temperature=2.0), [[1, 0]], [[0.0, -math.log(3)]])
    np.testing.assert_allclose(w, [[2 / (1 + math.sqrt(3)), 2 * math.sqrt(3) / (1 + math.sqrt(3))]])
    big = weights(softmax_advantage(temperature=1e-3), [[1, 0]], [[0.0, 50.0]])      # no overflow
    np.testing.assert_allclose(big, [[0.0, 2.0]])


@pytest.mark.parametrize("factory", [per_advantage, difficulty_band, softmax_advantage])
def test_empty_batch_and_mean_one(factory):
    assert weights(factory(), np.zeros((0, 3))).shape == (0, 3)
    rng = np.random.default_rng(0)
    w = weights(factory(), rng.random((4, 5)))
    assert w.shape == (4, 5) and np.isfinite(w).all() and (w >= 0).all()
    np.testing.assert_allclose(w.mean(), 1.0)


@pytest.mark.parametrize("name", ["per_advantage", "difficulty_band", "softmax_advantage"])
def test_end_to_end(name):
    rng = np.random.default_rng(0)
    pool = Pool(rng.choice(["a", "b"], 40))
    s = Scheduler(pool, name, seed=1)
    for t in range(4):
        ids = s.propose(8)
        fb = Feedback(ids, (rng.random((8, 4)) < 0.5).astype(float), step=t)
        s.observe(fb)
        assert s.admit(fb).all()
        w = s.loss_weights(fb)
        assert w.shape == (8, 4)
        np.testing.assert_allclose(w.mean(), 1.0)
    fresh = Scheduler(pool, name, seed=1)
    fresh.load_state_dict(pickle.loads(pickle.dumps(s.state_dict())))
    np.testing.assert_array_equal(s.propose(8), fresh.propose(8))


def test_bad_hyperparameters():
    for make in (lambda: per_advantage(alpha=-1), lambda: difficulty_band(low_q=0.8, high_q=0.2),
                 lambda: difficulty_band(inside=-1), lambda: softmax_advantage(temperature=0)):
        with pytest.raises(ValueError):
            make()
