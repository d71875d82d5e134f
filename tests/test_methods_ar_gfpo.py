"""DataFlex-RL's last two configurations: `ar` (token-level reweighting
from the sampling policy's token probabilities) and `gfpo` (top-k per group by reward per
token), with the records they need — `Feedback.lengths` and `Scheduler.token_weights` —
against hand-computed values and an independent loop."""

import warnings

import numpy as np
import pytest

from rlpace import Feedback, Pool, Scheduler
from rlpace.policies import advantage_reweight, gfpo
from rlpace.types import Batch

POOL = Pool(["a", "a", "b", "b", "b"])


def batch(rewards, lengths=None, probs=None, mask=None):
    b = Batch.from_feedback(Feedback(np.arange(len(rewards)), rewards, lengths=lengths, step=0), POOL, 0.5)
    return b._replace(token_probs=probs, token_mask=mask)


# ---- ar ------------------------------------------------------------------------------------
def test_ar_by_hand():
    # 2 groups × 2 rollouts × T = 3; real tokens: 3, 1, 2, 0
    probs = np.array([[[0.2, 1.0, 0.6], [0.5, 0.9, 0.9]], [[0.0, 0.4, 0.3], [0.7, 0.7, 0.7]]])
    mask = np.array([[[1, 1, 1], [1, 0, 0]], [[1, 1, 0], [0, 0, 0]]], bool)
    w = advantage_reweight().apply((), POOL, batch([[1, 0], [0, 1]], probs=probs, mask=mask))
    # raw 0.5π + 0.5 on the 6 real tokens: .6 1 .8 | .75 | .5 .7 → sum 4.35, scale 6/4.35
    s = 6 / 4.35
    want = [[[0.6 * s, 1.0 * s, 0.8 * s], [0.75 * s, 0, 0]], [[0.5 * s, 0.7 * s, 0], [0, 0, 0]]]
    np.testing.assert_allclose(w, want, rtol=1e-12)
    assert w[mask].mean() == pytest.approx(1.0)
    # α = 0 → weights 1; α = 1 → proportional to π
    np.testing.assert_allclose(advantage_reweight(0.0).apply((), POOL, batch([[1, 0], [0, 1]], probs=probs,
                                                                             mask=mask)), mask * 1.0)
    w1 = advantage_reweight(1.0).apply((), POOL, batch([[1, 0], [0, 1]], probs=probs, mask=mask))
    np.testing.assert_allclose(w1[mask], probs[mask] * 6 / probs[mask].sum(), rtol=1e-12)


def test_ar_without_token_statistics_is_neutral_and_degenerate_batches():
    assert advantage_reweight().apply((), POOL, batch([[1, 0], [0, 1]])).tolist() == [[1, 1], [1, 1]]
    mask = np.zeros((1, 2, 2), bool)
    assert (advantage_reweight().apply((), POOL, batch([[1, 0]], probs=np.zeros((1, 2, 2)), mask=mask)) == 0).all()
    m = np.ones((1, 2, 2), bool)
    np.testing.assert_array_equal(advantage_reweight(1.0).apply((), POOL, batch([[1, 0]], probs=np.zeros((1, 2, 2)),
                                                                                mask=m)), np.ones((1, 2, 2)))


@pytest.mark.parametrize("alpha", [-0.1, 1.5, float("nan"), "0.5", True])
def test_ar_alpha_validated(alpha):
    with pytest.raises(ValueError, match="ar alpha"):
        advantage_reweight(alpha)


# ---- Scheduler.token_weights --------------------------------------------------------------
def test_token_weights_entry_point():
    s = Scheduler(POOL, "ar")
    fb = Feedback([0, 2], [[1.0, 0.0], [0.0, 0.0]], step=0)
    probs = np.full((2, 2, 3), 0.5)
    probs[0, 0] = [0.0, 1.0, 0.2]
    mask = np.ones((2, 2, 3), bool)
    mask[1, 1, 1:] = False
    w = s.token_weights(fb, probs, mask)
    raw = np.where(mask, 0.5 * probs + 0.5, 0.0)
    np.testing.assert_allclose(w, raw * mask.sum() / raw.sum(), rtol=1e-12)
    assert s.loss_weights(fb).tolist() == [[1, 1], [1, 1]]            # no token statistics: neutral
    # a rollout-level reweighter is broadcast over real tokens: per_advantage's weights
    p = Scheduler(POOL, "per_advantage")
    np.testing.assert_array_equal(p.token_weights(fb, probs, mask), p.loss_weights(fb)[:, :, None] * mask)
    # and a method without a reweighter gives 1 on every real token
    np.testing.assert_array_equal(Scheduler(POOL, "uniform").token_weights(fb, probs, mask), mask * 1.0)


@pytest.mark.parametrize("probs, mask, match", [
    (np.full((2, 3, 3), 0.5), np.ones((2, 3, 3), bool), r"token_probs must be float\[B, G, T\]"),
    (np.full((2, 2), 0.5), np.ones((2, 2), bool), r"token_probs must be float\[B, G, T\]"),
    (np.full((2, 2, 3), 1.5), np.ones((2, 2, 3), bool), "probabilities in \\[0, 1\\]"),
    (np.full((2, 2, 3), np.nan), np.ones((2, 2, 3), bool), "probabilities in \\[0, 1\\]"),
    (np.full((2, 2, 3), -0.2), np.ones((2, 2, 3), bool), "pass exp\\(old_logp\\)"),
    (np.full((2, 2, 3), 0.5), np.ones((2, 2, 2), bool), "token_mask must have"),
    (np.full((2, 2, 3), 0.5), np.full((2, 2, 3), 0.5), "token_mask must be boolean"),
])
def test_token_weights_rejects_bad_input(probs, mask, match):
    s = Scheduler(POOL, "ar")
    before = s.state_dict()
    with pytest.raises(ValueError, match=match):
        s.token_weights(Feedback([0, 2], [[1.0, 0.0], [0.0, 0.0]], step=0), probs, mask)
    assert s.state_dict().keys() == before.keys()


def test_token_level_reweighter_chains_with_a_rollout_level_one():
    # Chained, the rollout weight multiplies each of its tokens' ar weight (it used to fail
    # with "cannot yet be chained").
    s = Scheduler(POOL, "ar+per_advantage")
    fb = Feedback([0, 2], [[1.0, 0.0], [0.0, 1.0]], step=0)
    rollout = s.loss_weights(fb)                                       # ar alone gives 1 here
    assert rollout.shape == (2, 2)
    probs = np.array([[[0.2, 1.0, 0.6], [0.5, 0.5, 0.5]], [[1.0, 1.0, 1.0], [0.0, 0.4, 0.8]]])
    mask = np.ones((2, 2, 3), bool); mask[0, 0, 2] = False
    ar = Scheduler(POOL, "ar").token_weights(fb, probs, mask)
    w = s.token_weights(fb, probs, mask)
    ref = np.zeros((2, 2, 3))
    for b in range(2):
        for g in range(2):
            for t in range(3):
                ref[b, g, t] = ar[b, g, t] * rollout[b, g] if mask[b, g, t] else 0.0
    np.testing.assert_allclose(w, ref, rtol=1e-12)
    # ar's own numbers: 0.5π + 0.5 over the 11 real tokens, scaled to mean 1 (sum 8.95 -> 11/8.95)
    assert ar[0, 0, 0] == pytest.approx(0.6 * 11 / 8.95) and ar[0, 0, 2] == 0.0


# ---- Feedback.lengths ------------------------------------------------------------------------
def test_feedback_lengths_validated_and_copied():
    lens = np.array([[3, 0], [7, 2]])
    fb = Feedback([0, 1], [[1, 0], [0, 1]], lengths=lens, step=0)
    lens[0, 0] = 99
    assert fb.lengths.tolist() == [[3, 0], [7, 2]] and fb.lengths.dtype == np.int64
    assert Feedback([0, 1], [[1, 0], [0, 1]], lengths=[[3.0, 1.0], [2.0, 2.0]], step=0).lengths.tolist() == [[3, 1], [2, 2]]
    assert Feedback([0, 1], [[1, 0], [0, 1]], step=0).lengths is None
    for bad, match in (([[1, 2]], "has shape"), ([[-1, 2], [1, 1]], "non-negative"),
                       ([[1.5, 2], [1, 1]], "whole numbers"), ([[True, False], [True, True]], "booleans"),
                       ([["a", "b"], ["c", "d"]], "strings")):
        with pytest.raises(ValueError, match=f"Feedback.lengths.*{match}|{match}"):
            Feedback([0, 1], [[1, 0], [0, 1]], lengths=bad, step=0)
    assert Feedback([], np.zeros((0, 4)), lengths=np.zeros((0, 4)), step=0).lengths.shape == (0, 4)


# ---- gfpo ------------------------------------------------------------------------------------
def test_gfpo_by_hand():
    p = gfpo()                                                        # k = 3, reward per token
    r = [[1, 1, 0, 1, 1], [0, 0, 0, 0, 0], [1, 0, 1, 0, 1]]
    lens = [[8, 2, 1, 4, 2], [5, 1, 3, 2, 4], [0, 3, 6, 2, 3]]
    keep = p.apply((), POOL, batch(r, lengths=lens)).keep
    # row 0: r/L = .125 .5 0 .25 .5 → 1, 4 (tie .5: both), 3 ; row 1: all 0 → the first three;
    # row 2: L clamped to 1: 1, 0, 1/6, 0, 1/3 → 0, 4, 2
    assert keep.tolist() == [[False, True, False, True, True], [True, True, True, False, False],
                             [True, False, True, False, True]]
    short = gfpo(k=2, metric="short").apply((), POOL, batch(r, lengths=lens)).keep
    assert short.tolist() == [[False, True, True, False, False], [False, True, False, True, False],
                              [True, False, False, True, False]]
    out = gfpo(k=5).apply((), POOL, batch(r, lengths=lens))
    assert out.keep.all() and out.refill == 0


def test_gfpo_matches_an_independent_loop():
    rng = np.random.default_rng(0)
    for _ in range(50):
        b, g, k = rng.integers(1, 6), rng.integers(1, 9), rng.integers(1, 5)
        r = rng.integers(-1, 3, size=(b, g)).astype(float) * rng.choice([1.0, 0.5])
        lens = rng.integers(0, 6, size=(b, g))
        keep = gfpo(k=int(k)).apply((), POOL, batch(r.tolist(), lengths=lens)).keep
        for i in range(b):
            score = [r[i, j] / max(lens[i, j], 1) for j in range(g)]
            top = sorted(range(g), key=lambda j: (-score[j], j))[:k]
            assert [j for j in range(g) if keep[i, j]] == sorted(top)


def test_gfpo_without_lengths_ranks_by_reward_and_says_so():
    with pytest.warns(RuntimeWarning, match="Feedback.lengths is None"):
        keep = gfpo(k=2).apply((), POOL, batch([[0, 1, 0, 1, 1]])).keep
    assert keep.tolist() == [[False, True, False, True, False]]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gfpo(k=2).apply((), POOL, batch([[0, 1, 0, 1, 1]], lengths=[[1, 1, 1, 1, 1]]))   # no warning


@pytest.mark.parametrize("kw, match", [({"k": 0}, "gfpo k"), ({"k": 2.0}, "gfpo k"), ({"k": True}, "gfpo k"),
                                       ({"metric": "long"}, "gfpo metric")])
def test_gfpo_hyperparameters_validated(kw, match):
    with pytest.raises(ValueError, match=match):
        gfpo(**kw)


def test_gfpo_through_the_scheduler_reads_feedback_lengths():
    s = Scheduler(POOL, "gfpo", k=1)
    fb = Feedback([0, 3], [[1, 1, 1], [0, 1, 1]], lengths=[[3, 1, 2], [1, 5, 4]], step=0)
    s.observe(fb)
    assert s.admission(fb).keep.tolist() == [[False, True, False], [False, False, True]]
