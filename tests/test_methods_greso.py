"""`greso` (arXiv 2506.02177): streaks, the keep probability, the self-tuning of p,
the skip rate of proposals, and the estimated count of skipped prompts."""

import numpy as np
import pytest

from rlpace import Feedback, Pool, Scheduler
from rlpace.policies._greso import greso_keep_prob


def test_keep_probability_hand_computed():
    pi = greso_keep_prob(np.array([0, 1, 3, 0, 0, 9]), np.array([0, 0, 0, 2, 8, 0]), 0.5, 0.6)
    # 1; 0.5; 0.125; 0.36; max(0.6^8 = 0.0168, 0.01); max(0.5^9 = 0.00195, 0.01) = 0.01
    np.testing.assert_allclose(pi, [1.0, 0.5, 0.125, 0.36, 0.6 ** 8, 0.01], rtol=1e-12)


def _state(s):
    return s.states["selection"]


def test_streaks_follow_groups_in_order():
    s = Scheduler(Pool(["a"] * 5), "greso")
    ones, zeros, mixed = [1.0] * 4, [0.0] * 4, [1.0, 0.0, 0.0, 0.0]
    s.observe(Feedback([0, 1, 2], [ones, zeros, mixed], step=0))
    s.observe(Feedback([0, 1, 1, 2], [ones, zeros, zeros, ones], step=1))   # prompt 1 twice
    st = _state(s)
    assert st.easy_streak.tolist() == [2, 0, 1, 0, 0]
    assert st.hard_streak.tolist() == [0, 3, 0, 0, 0]
    s.observe(Feedback([0, 1], [mixed, ones], step=2))                      # streaks break
    st = _state(s)
    assert st.easy_streak.tolist() == [0, 1, 1, 0, 0] and st.hard_streak.tolist() == [0, 0, 0, 0, 0]


def test_p_tunes_toward_the_target_shares():
    s = Scheduler(Pool(["a"] * 4), "greso")                 # t = 0.25: targets 1/12 easy, 1/6 hard
    s.observe(Feedback([0, 1, 2, 3], [[0.0] * 4, [0.0] * 4, [1.0, 0, 0, 0], [1.0, 0, 1, 0]], step=0))
    # all-wrong share 0.5 ≥ 1/6 → p_hard 0.49 (skip more); all-correct 0 < 1/12 → p_easy 0.51
    np.testing.assert_allclose(_state(s).p_explore, [0.51, 0.49], rtol=1e-12)
    m = s.metrics()
    assert m["greso/all_wrong_share"] == 0.5 and m["greso/all_correct_share"] == 0.0
    for t in range(1, 100):                                 # bounded by p_min
        s.observe(Feedback([0, 1], [[0.0] * 4] * 2, step=t))
    np.testing.assert_allclose(_state(s).p_explore, [0.95, 0.05], rtol=1e-12)


def test_proposals_skip_streak_prompts_at_the_keep_rate():
    n = 1000
    s = Scheduler(Pool(["a"] * n), "greso", seed=0, step_size=0.0)   # p fixed at 0.5
    s.observe(Feedback(np.arange(500), np.ones((500, 4)), step=0))  # easy streak 1: kept w.p. 0.5
    ids = np.concatenate([s.propose(500) for _ in range(40)])
    share = (ids < 500).mean()
    # candidates are uniform; kept ∝ π: (500·0.5) / (500·0.5 + 500) = 1/3
    assert share == pytest.approx(1 / 3, abs=4 * np.sqrt((1 / 3) * (2 / 3) / ids.size))
    assert s.metrics()["greso/skip_prob"] == pytest.approx(0.25, abs=1e-12)


def test_skipped_prompts_are_estimated_from_the_kept_ones():
    s = Scheduler(Pool(["a"] * 6), "greso", step_size=0.0)
    s.observe(Feedback([0, 1, 2], [[1.0] * 4, [1.0] * 4, [0.0] * 4], step=0))
    # at proposal time: prompts 0, 1 easy streak 1 (π = 0.5), prompt 2 hard streak 1 (π = 0.5), 3 fresh
    s.observe(Feedback([0, 2, 3], [[1.0, 0, 0, 0]] * 3, step=1))
    m = s.metrics()
    assert m["greso/skipped_last"] == pytest.approx(2.0)     # (1/0.5 − 1)·2 + (1/1 − 1)
    assert m["greso/skipped"] == pytest.approx(2.0)


def test_more_informative_groups_than_uniform_when_zero_variance_persists():
    # 60 % of the pool always passes or always fails; greso learns to skip them.
    rng = np.random.default_rng(0)
    n = 2000
    rate = np.where(np.arange(n) % 5 < 3, np.where(np.arange(n) % 2 == 0, 1.0, 0.0), 0.5)
    share = {}
    for name in ("uniform", "greso"):
        s = Scheduler(Pool(["a"] * n), name, seed=0)
        informative = []
        for t in range(60):
            ids = s.propose(64)
            r = (rng.random((64, 4)) < rate[ids, None]).astype(float)
            s.observe(Feedback(ids, r, step=t))
            if t >= 40:
                informative.append(((r.sum(1) > 0) & (r.sum(1) < 4)).mean())
        share[name] = np.mean(informative)
    assert share["greso"] > share["uniform"] + 0.1


def test_candidates_follow_a_composed_mixture():
    pool = Pool(["a"] * 50 + ["b"] * 50)
    s = Scheduler(pool, "fixed_mixture+greso", seed=0, weights=[0.9, 0.1])
    ids = np.concatenate([s.propose(100) for _ in range(20)])
    # no streaks yet: every candidate is kept, so domains follow the mixture's 0.9 / 0.1
    assert (ids < 50).mean() == pytest.approx(0.9, abs=4 * np.sqrt(0.09 / ids.size))


def _plain_greso_update(easy_streak, hard_streak, ids, pass_rate, easy_threshold=0.98, hard_threshold=0.11):
    """The streak rule one group at a time, in batch order, and the batch's shares as means."""
    easy_streak, hard_streak = easy_streak.copy(), hard_streak.copy()
    n_easy = n_hard = 0
    for i, rate in zip(ids.tolist(), pass_rate.tolist()):
        e = rate >= easy_threshold
        h = rate <= hard_threshold and not e
        easy_streak[i] = min(easy_streak[i] + 1, 2**30) if e else 0
        hard_streak[i] = min(hard_streak[i] + 1, 2**30) if h else 0
        n_easy, n_hard = n_easy + e, n_hard + h
    return easy_streak, hard_streak, [n_easy / len(ids), n_hard / len(ids)]


@pytest.mark.parametrize("repeats", [False, True])
def test_streak_update_equals_the_group_by_group_loop(repeats):
    """The update with every prompt once (written without the occurrence rounds) and with
    prompts listed several times, against the plain loop: the same streaks and shares, over
    20 random batches of a 300-prompt pool."""
    rng = np.random.default_rng(5 + repeats)
    pool = Pool(rng.integers(0, 3, size=300))
    s = Scheduler(pool, "greso", seed=1)
    for t in range(20):
        b = int(rng.integers(1, 120))
        ids = rng.integers(0, 40, size=b) if repeats else rng.choice(len(pool), size=b, replace=False)
        p = rng.choice([0.0, 1.0, 0.5], size=(b, 1), p=[0.4, 0.4, 0.2])
        rewards = (rng.random((b, 8)) < p).astype(np.float64)
        before = _state(s)
        want_e, want_h, want_ratio = _plain_greso_update(before.easy_streak, before.hard_streak, ids,
                                                         rewards.mean(axis=1))
        s.observe(Feedback(ids, rewards, step=t))
        after = _state(s)
        assert after.easy_streak.tolist() == want_e.tolist()
        assert after.hard_streak.tolist() == want_h.tolist()
        assert after.last_ratio.tolist() == want_ratio
