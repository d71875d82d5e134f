"""MoPPS (arXiv 2507.04632), SEC (arXiv 2505.14970), EXP3/ODM (arXiv 2312.02406), and the
learnability selectors (SFL buffer, arXiv 2408.15099; PER sum tree, arXiv 1511.05952):
hand-computed updates, reference loops, and each registered name end to end through the
Scheduler."""

import math
import pickle

import numpy as np
import pytest

from rlpace import Feedback, Pool, Scheduler
from rlpace.policies import (exp3, learnability_buffer, mopps, prioritized_learnability, sec,
                             uniform_pool)
from rlpace.policies._mopps import beta_posterior_update
from rlpace.stats import sumtree_total
from rlpace.types import Batch


def batch(pool, ids, rewards, advantages=None):
    return Batch.from_feedback(Feedback(ids, rewards, advantages, step=0), pool, 0.5)


def wins(k, g):
    return [1.0] * k + [0.0] * (g - k)


# ---- MoPPS ---------------------------------------------------------------------------------
def test_mopps_posterior_lambda_one():
    pool = Pool([0] * 4)
    p = mopps()
    s = p.init(pool)
    np.testing.assert_array_equal(s.alpha, 1.0)
    # prompt 0: 3/4 → (1+3, 1+1) = (4, 2); then a 2nd group in the same batch, 1/4 → (5, 5).
    # prompt 1: 0/4 → (1, 5).
    s = p.update(s, pool, batch(pool, [0, 1, 0], [wins(3, 4), wins(0, 4), wins(1, 4)]))
    assert s.alpha.tolist() == [5.0, 1.0, 1.0, 1.0]
    assert s.beta.tolist() == [5.0, 5.0, 1.0, 1.0]


def test_mopps_group_of_one_updates_normally():
    # The reference's `… + s*n if n > 1 else 8` would set α = 8 here; we count 1 rollout.
    pool = Pool([0] * 3)
    p = mopps()
    s = p.update(p.init(pool), pool, batch(pool, [0, 1], [[1.0], [0.0]]))
    assert s.alpha.tolist() == [2.0, 1.0, 1.0]
    assert s.beta.tolist() == [1.0, 2.0, 1.0]


def test_mopps_posterior_lambda_half():
    pool = Pool([0] * 2)
    p = mopps(decay=0.5)
    s = p.init(pool)
    # (1, 1), 3/4: α = 0.5·1 + 0.5·1 + 3 = 4, β = 0.5 + 0.5 + 1 = 2.
    s = p.update(s, pool, batch(pool, [0], [wins(3, 4)]))
    assert (s.alpha[0], s.beta[0]) == (4.0, 2.0)
    # again 3/4: α = 0.5·4 + 0.5 + 3 = 5.5, β = 0.5·2 + 0.5 + 1 = 2.5.
    s = p.update(s, pool, batch(pool, [0], [wins(3, 4)]))
    assert (s.alpha[0], s.beta[0]) == (5.5, 2.5)
    # Twice in one batch = twice in a row, in batch order: 0/4 then 4/4 from (5.5, 2.5):
    # after 0/4: α = 2.75 + 0.5 = 3.25, β = 1.25 + 0.5 + 4 = 5.75;
    # after 4/4: α = 1.625 + 0.5 + 4 = 6.125, β = 2.875 + 0.5 = 3.375.
    s = p.update(s, pool, batch(pool, [0, 0], [wins(0, 4), wins(4, 4)]))
    assert (s.alpha[0], s.beta[0]) == (6.125, 3.375)


def test_mopps_update_equals_sequential_loop():
    rng = np.random.default_rng(0)
    for decay in (1.0, 0.5, 0.9, 0.0):
        n = 20
        a, b = np.full(n, 1.0), np.full(n, 2.0)
        ra, rb = a.copy(), b.copy()
        for _ in range(30):
            ids = rng.integers(0, n, rng.integers(0, 12))      # duplicates, sometimes empty
            g = int(rng.integers(1, 9))
            s = rng.integers(0, g + 1, ids.size).astype(float)
            beta_posterior_update(a, b, ids, s, g - s, decay, 1.0, 2.0)
            for i, x in zip(ids, s):
                ra[i] = decay * ra[i] + (1 - decay) * 1.0 + x
                rb[i] = decay * rb[i] + (1 - decay) * 2.0 + (g - x)
        np.testing.assert_allclose(a, ra, rtol=1e-12)
        np.testing.assert_allclose(b, rb, rtol=1e-12)


def test_mopps_non_binary_rewards_use_threshold():
    pool = Pool([0])
    p = mopps()
    s = p.update(p.init(pool), pool, batch(pool, [0], [[0.7, 0.2, 0.5, 0.49]]))   # 2 ≥ 0.5
    assert (s.alpha[0], s.beta[0]) == (3.0, 3.0)


def test_mopps_keeps_candidates_closest_to_target():
    pool = Pool([0] * 50)
    p = mopps(ratio=16)
    s = p.init(pool)
    s.alpha[:] = 1000.0
    s.beta[:] = 1.0                                            # γ̂ ≈ 1 for most prompts
    s.beta[:10] = 1000.0                                       # γ̂ ≈ 0.5 for prompts 0..9
    s = s._replace(moved=None)           # α, β written by hand: the mask is derived from them
    # ratio·n = 80 > 50 = pool: every prompt is a candidate, so the 5 kept are from 0..9.
    ids = p.apply(s, pool, 5, None, None, np.random.default_rng(0))
    assert len(set(ids.tolist())) == 5 and ids.max() < 10
    # ratio·n ≤ pool: candidates without replacement → distinct ids.
    ids = p.apply(s, pool, 3, None, None, np.random.default_rng(1))
    assert len(set(ids.tolist())) == 3
    # n > pool: still n ids in range.
    ids = p.apply(s, Pool([0] * 50), 60, None, None, np.random.default_rng(2))
    assert ids.shape == (60,) and ids.min() >= 0 and ids.max() < 50


def test_mopps_beta_draw_has_beta_law():
    from rlpace.policies._mopps import _beta_draw
    rng = np.random.default_rng(0)
    for a, b in ((1.0, 1.0), (2.0, 5.0), (0.3, 0.7)):
        x = _beta_draw(rng, np.full(200_000, a), np.full(200_000, b))
        assert abs(x.mean() - a / (a + b)) < 0.003
        assert abs(x.var() - a * b / ((a + b) ** 2 * (a + b + 1))) < 0.002
    x = _beta_draw(rng, np.full(1000, 1e-4), np.full(1000, 1e-4))  # underflow fallback
    assert np.isfinite(x).all() and ((x >= 0) & (x <= 1)).all()


# ---- SEC -----------------------------------------------------------------------------------
def test_sec_td0_and_boltzmann_hand_computed():
    pool = Pool(["a", "a", "b", "b"])
    p = sec(alpha=0.5, temperature=1.0)
    s = p.init(pool)
    np.testing.assert_allclose(p.apply(s, pool), [0.5, 0.5])
    # a: groups with mean |A| 1.0 and 0.6 → r_a = 0.8 → Q_a = 0.4; b absent → 0.
    s = p.update(s, pool, batch(pool, [0, 1], [[1, 0], [1, 0]], [[1.0, -1.0], [0.2, -1.0]]))
    np.testing.assert_allclose(s.q, [0.4, 0.0])
    np.testing.assert_allclose(p.apply(s, pool), [0.598687660, 0.401312340])   # e^.4/(1+e^.4)
    # b: mean |A| 0.5 → Q_b = 0.25; a absent keeps 0.4. π = softmax([0.4, 0.25]).
    s = p.update(s, pool, batch(pool, [2], [[1, 0]], [[0.5, -0.5]]))
    np.testing.assert_allclose(s.q, [0.4, 0.25])
    np.testing.assert_allclose(p.apply(s, pool), [0.537429845, 0.462570155])


def test_sec_defaults_and_temperature():
    pool = Pool(["a", "b"])
    p = sec()                                                  # α = 0.5, τ = 0.2 (unverified)
    s = p.update(p.init(pool), pool, batch(pool, [0], [[1, 0]], [[1.0, -1.0]]))
    np.testing.assert_allclose(s.q, [0.5, 0.0])
    e = math.exp(0.5 / 0.2)
    np.testing.assert_allclose(p.apply(s, pool), [e / (1 + e), 1 / (1 + e)])


# ---- EXP3 ----------------------------------------------------------------------------------
def test_exp3_two_arms_two_updates_hand_computed():
    pool = Pool(["a", "b"])
    p = exp3()                                                 # scale 10
    s = p.init(pool)
    # Update 1, r = [1, –]: R̂ = [0.1/0.5, 0] = [0.2, 0]; ε_1 = min(1/2, sqrt(ln2/2)=0.589)
    # = 1/2 → w = softmax·0 + 1/2: uniform.
    s = p.update(s, pool, batch(pool, [0], [[1, 0]], [[1.0, -1.0]]))
    np.testing.assert_allclose(s.reward, [0.2, 0.0])
    np.testing.assert_allclose(p.apply(s, pool), [0.5, 0.5])
    # Update 2, r = [1, 0.5]: R̂ = [0.4, 0.1]; ε_2 = sqrt(ln2/4) = 0.416277; ε_1 = 0.5:
    # w = softmax([0.2, 0.05])·(1 − 2·0.416277) + 0.416277 = [0.506267, 0.493733].
    s = p.update(s, pool, batch(pool, [0, 1], [[1, 0], [1, 0]], [[1.0, -1.0], [0.5, -0.5]]))
    np.testing.assert_allclose(s.reward, [0.4, 0.1])
    np.testing.assert_allclose(float(s.eps), 0.416277306, rtol=1e-8)
    np.testing.assert_allclose(p.apply(s, pool), [0.506267455, 0.493732545], rtol=1e-8)


def test_exp3_three_arms_four_updates_hand_computed():
    # scale = 1; π stays uniform while ε_t = 1/3 (t ≤ K ln K = 3.3):
    # t=1 r0=.5 → R̂=[1.5,0,0]; t=2 r0=.5, r1=.2 → [3, .6, 0]; t=3 r2=.9 → [3, .6, 2.7];
    # t=4 r=[.1,.3,.2] → [3.3, 1.5, 3.3]; ε_4 = sqrt(ln3/12) = 0.302574, ε_3 = 1/3:
    # w = softmax(R̂/3)·(1 − 3·0.302574) + 0.302574 → π = [0.338778, 0.322443, 0.338778].
    pool = Pool(["a", "b", "c"])
    p = exp3(scale=1.0)
    s = p.init(pool)
    steps = [{0: 0.5}, {0: 0.5, 1: 0.2}, {2: 0.9}, {0: 0.1, 1: 0.3, 2: 0.2}]
    for t, r in enumerate(steps, 1):
        ids = list(r)
        adv = [[v, -v] for v in r.values()]
        s = p.update(s, pool, batch(pool, ids, [[1, 0]] * len(ids), adv))
        if t < 4:
            np.testing.assert_allclose(p.apply(s, pool), [1 / 3] * 3)
    np.testing.assert_allclose(s.reward, [3.3, 1.5, 3.3])
    np.testing.assert_allclose(p.apply(s, pool), [0.338778324, 0.322443353, 0.338778324], rtol=1e-8)


def test_exp3_huge_rewards_stay_finite():
    pool = Pool(["a", "b", "c"])
    p = exp3(scale=1e-6)
    s = p.init(pool)
    for t in range(200):
        s = p.update(s, pool, batch(pool, [t % 2], [[1, 0]], [[50.0, -50.0]]))
    probs = p.apply(s, pool)
    assert np.isfinite(probs).all() and abs(probs.sum() - 1) < 1e-12 and (probs > 0).all()
    # softmax of a huge R̂ puts all exploitation mass on one earning arm; c sits at the ε floor
    assert probs.argmax() in (0, 1) and probs[2] == probs.min()


# ---- learnability buffer (SFL) -----------------------------------------------------------
def test_learnability_buffer_refresh_hand_computed():
    pool = Pool([0] * 10)
    p = learnability_buffer(buffer_size=2, refresh_every=3, mix=0.5, max_candidates=100, decay=1.0)
    s = p.init(pool)
    # Cumulative counts (decay 1). Update 1: 0 → 2/4 (0.25), 1 → 4/4 (0), 2 → 1/4 (0.1875). Buffer not full → refresh.
    s = p.update(s, pool, batch(pool, [0, 1, 2], [wins(2, 4), wins(4, 4), wins(1, 4)]))
    assert s.buffer.tolist() == [0, 2] and int(s.buffer_len) == 2
    # Full: the next refresh comes 3 updates later.
    s = p.update(s, pool, batch(pool, [3], [wins(2, 4)]))            # 3 → 0.25
    s = p.update(s, pool, batch(pool, [2], [wins(2, 4)]))            # 2 → 3/8 → 0.234375
    assert s.buffer.tolist() == [0, 2]
    s = p.update(s, pool, batch(pool, [0], [wins(4, 4)]))            # 0 → 6/8 → 0.1875
    assert s.buffer.tolist() == [3, 2]                               # 0.25, 0.234375
    assert int(s.pending_count) == 0 and int(s.since_refresh) == 0
    # Proposals: 5 uniform, then 5 from the buffer {3, 2}.
    ids = p.apply(s, pool, 10, None, None, np.random.default_rng(0))
    assert set(ids[5:].tolist()) <= {2, 3}


def test_learnability_buffer_empty_is_uniform_and_zero_scores_stay_out():
    pool = Pool([0] * 10)
    p = learnability_buffer(buffer_size=3)
    s = p.init(pool)
    u = uniform_pool()
    got = p.apply(s, pool, 7, None, None, np.random.default_rng(4))
    np.testing.assert_array_equal(got, u.apply(None, pool, 7, None, None, np.random.default_rng(4)))
    s = p.update(s, pool, batch(pool, [0, 1], [wins(0, 4), wins(4, 4)]))
    assert int(s.buffer_len) == 0                                    # p̂ ∈ {0, 1}: no signal


def test_learnability_buffer_ring_keeps_latest_and_counts_duplicates():
    pool = Pool([0] * 10)
    p = learnability_buffer(buffer_size=5, max_candidates=2)
    s = p.update(p.init(pool), pool, batch(pool, [0, 1, 2], [wins(2, 4)] * 3))
    assert sorted(s.buffer[:int(s.buffer_len)].tolist()) == [1, 2]   # 0 fell out of the ring
    s = p.update(s, pool, batch(pool, [4, 4], [wins(1, 4), wins(3, 4)]))
    # Two groups of prompt 4 in one batch, in order, λ = 0.5: s = 0.5·1 + 3, a = 0.5·4 + 4.
    assert s.successes[4] == 3.5 and s.attempts[4] == 6.0


# ---- forgetting -----------------------------------------------------------------------------
def test_learnability_buffer_forgets_a_mastered_prompt():
    pool = Pool([0] * 2)
    p = learnability_buffer(buffer_size=1, refresh_every=1, mix=0.0)    # default decay 0.5
    s = p.init(pool)
    s = p.update(s, pool, batch(pool, [0], [wins(2, 4)]))             # 0: 2/4 → 1/4
    s = p.update(s, pool, batch(pool, [1], [wins(1, 4)]))             # 1: 1/4 → 3/16
    assert s.buffer.tolist() == [0]
    # 0 is now mastered; 1 is seen again at 1/4. Both are candidates of this refresh.
    s = p.update(s, pool, batch(pool, [0, 1], [wins(4, 4), wins(1, 4)]))
    # 0: s = 0.5·2 + 4 = 5, a = 0.5·4 + 4 = 6: p̂ = 5/6, score 5/36 = 0.1389.
    # 1: s = 0.5·1 + 1 = 1.5, a = 6: p̂ = 1/4, score 3/16 = 0.1875 > 5/36.
    assert (s.successes[0], s.attempts[0]) == (5.0, 6.0)
    assert (s.successes[1], s.attempts[1]) == (1.5, 6.0)
    assert s.buffer.tolist() == [1]
    ids = p.apply(s, pool, 6, None, None, np.random.default_rng(0))
    assert ids.tolist() == [1] * 6                                    # mix 0: all from the buffer
    # One more mastered group: s = 0.5·5 + 4 = 6.5, a = 7, score 6.5·0.5/49 = 0.0663.
    s = p.update(s, pool, batch(pool, [0], [wins(4, 4)]))
    assert (s.successes[0], s.attempts[0]) == (6.5, 7.0)


def test_learnability_buffer_without_decay_keeps_the_stale_score():
    # decay 1 (cumulative, the behaviour before forgetting): 0 sits at 6/8 → 3/16, ties
    # prompt 1 (2/8 → 3/16) and keeps its place by the smaller id.
    pool = Pool([0] * 2)
    p = learnability_buffer(buffer_size=1, refresh_every=1, mix=0.0, decay=1.0)
    s = p.init(pool)
    for ids, r in (([0], [wins(2, 4)]), ([1], [wins(1, 4)]), ([0, 1], [wins(4, 4), wins(1, 4)])):
        s = p.update(s, pool, batch(pool, ids, r))
    assert (s.successes[0], s.attempts[0]) == (6.0, 8.0) and s.buffer.tolist() == [0]


def test_prioritized_learnability_forgets_a_mastered_prompt():
    pool = Pool([0] * 3)
    eps = 1e-6
    p = prioritized_learnability(alpha=1.0, eps=eps)                   # default decay 0.5
    s = p.update(p.init(pool), pool, batch(pool, [0, 1], [wins(2, 4), wins(1, 4)]))
    cap = s.tree.tree.shape[0] // 2
    np.testing.assert_allclose(s.tree.tree[cap:cap + 3], [0.25 + eps, 0.1875 + eps, 0.25 + eps])
    s = p.update(s, pool, batch(pool, [0], [wins(4, 4)]))
    np.testing.assert_allclose(s.tree.tree[cap:cap + 3], [5 / 36 + eps, 0.1875 + eps, 0.25 + eps],
                               rtol=1e-12)
    # draws follow the new priorities: P(0) = (5/36 + eps) / total
    total = 5 / 36 + 0.1875 + 0.25 + 3 * eps
    assert sumtree_total(s.tree) == pytest.approx(total, rel=1e-12)
    ids = p.apply(s, pool, 40_000, None, None, np.random.default_rng(1))
    assert abs(np.mean(ids == 0) - (5 / 36 + eps) / total) < 0.01
    never = prioritized_learnability(alpha=1.0, eps=eps, decay=1.0)
    s = never.update(never.init(pool), pool, batch(pool, [0, 1], [wins(2, 4), wins(1, 4)]))
    s = never.update(s, pool, batch(pool, [0], [wins(4, 4)]))
    np.testing.assert_allclose(s.tree.tree[cap], 0.1875 + eps, rtol=1e-12)   # 6/8 → 3/16


def test_decay_equals_sequential_reference_loop():
    rng = np.random.default_rng(5)
    n, lam = 11, 0.5
    pool = Pool([0] * n)
    p = prioritized_learnability(alpha=0.6, eps=1e-3, decay=lam)
    s = p.init(pool)
    suc, att = [0.0] * n, [0.0] * n
    for _ in range(20):
        ids = rng.integers(0, n, 7)                                   # duplicates on purpose
        g = int(rng.integers(1, 5))
        rew = rng.random((7, g))
        s = p.update(s, pool, batch(pool, ids, rew))
        for i, row in zip(ids.tolist(), rew):
            suc[i] = lam * suc[i] + float((row >= 0.5).sum())
            att[i] = lam * att[i] + g
    np.testing.assert_allclose(s.successes, suc, rtol=1e-12)
    np.testing.assert_allclose(s.attempts, att, rtol=1e-12)


# ---- prioritized learnability (PER sum tree) -------------------------------------------
def test_prioritized_priorities_hand_computed():
    pool = Pool([0] * 5)
    p = prioritized_learnability(alpha=0.6, eps=1e-6)
    s = p.init(pool)
    cap = s.tree.tree.shape[0] // 2
    unseen = (0.25 + 1e-6) ** 0.6
    np.testing.assert_allclose(s.tree.tree[cap:cap + 5], unseen)
    s = p.update(s, pool, batch(pool, [0, 1, 2], [wins(2, 4), wins(4, 4), wins(1, 4)]))
    np.testing.assert_allclose(s.tree.tree[cap:cap + 5],
                               [unseen, 1e-6 ** 0.6, (0.1875 + 1e-6) ** 0.6, unseen, unseen])
    np.testing.assert_allclose(sumtree_total(s.tree), 3 * unseen + 1e-6 ** 0.6 + (0.1875 + 1e-6) ** 0.6)


def test_prioritized_draw_frequencies():
    pool = Pool([0] * 3)
    p = prioritized_learnability(alpha=1.0, eps=1e-9)
    s = p.update(p.init(pool), pool, batch(pool, [0, 1], [wins(2, 4), wins(4, 4)]))
    # priorities ≈ [0.25, 0, 0.25]: prompts 0 and 2 each about half.
    ids = p.apply(s, pool, 40_000, None, None, np.random.default_rng(0))
    freq = np.bincount(ids, minlength=3) / ids.size
    assert freq[1] < 1e-3 and abs(freq[0] - 0.5) < 0.01


def test_prioritized_tree_equals_reference_loop():
    rng = np.random.default_rng(3)
    n = 37
    pool = Pool([0] * n)
    p = prioritized_learnability(alpha=0.6, eps=1e-3, decay=1.0)
    s = p.init(pool)
    att, suc = [0] * n, [0] * n
    for _ in range(25):
        ids = rng.integers(0, n, 6)
        g = int(rng.integers(1, 5))
        rew = rng.random((6, g))
        s = p.update(s, pool, batch(pool, ids, rew))
        for i, row in zip(ids, rew):
            att[i] += g
            suc[i] += int((row >= 0.5).sum())
    ref = []
    for a, k in zip(att, suc):
        if a == 0:
            ref.append((0.25 + 1e-3) ** 0.6)
        else:
            q = k / a
            ref.append((q * (1 - q) + 1e-3) ** 0.6)
    cap = s.tree.tree.shape[0] // 2
    np.testing.assert_allclose(s.tree.tree[cap:cap + n], ref)
    np.testing.assert_allclose(sumtree_total(s.tree), sum(ref))


# ---- end to end through the Scheduler ---------------------------------------------------
@pytest.mark.parametrize("name, kw", [
    ("mopps", {}), ("mopps", {"decay": 0.5, "ratio": 8}), ("sec", {}), ("exp3", {}),
    ("learnability_buffer", {"buffer_size": 8, "refresh_every": 2}),
    ("prioritized_learnability", {}),
])
def test_end_to_end_resume(name, kw):
    rng = np.random.default_rng(0)
    pool = Pool(rng.choice(["a", "b", "c"], 200))
    s = Scheduler(pool, name, seed=11, **kw)
    for t in range(6):
        ids = s.propose(16)
        assert ids.shape == (16,) and ids.dtype == np.int64 and 0 <= ids.min() and ids.max() < 200
        fb = Feedback(ids, (rng.random((16, 4)) < 0.5).astype(float), step=t)
        s.observe(fb)
        assert s.admit(fb).all()
        np.testing.assert_array_equal(s.loss_weights(fb), np.ones((16, 4)))
    fresh = Scheduler(pool, name, seed=11, **kw)
    fresh.load_state_dict(pickle.loads(pickle.dumps(s.state_dict())))
    for t in range(6, 10):
        a, b = s.propose(16), fresh.propose(16)
        np.testing.assert_array_equal(a, b)
        fb = Feedback(a, (rng.random((16, 4)) < 0.5).astype(float), step=t)
        s.observe(fb), fresh.observe(fb)
    assert s.metrics() == fresh.metrics()
    probs = s.domain_probs()
    if name in ("sec", "exp3"):
        assert np.isfinite(probs).all() and abs(probs.sum() - 1) < 1e-12 and (probs >= 0).all()


@pytest.mark.parametrize("factory, kw", [
    (mopps, {"ratio": 0}), (mopps, {"decay": 1.5}), (mopps, {"prior_alpha": 0}),
    (sec, {"temperature": 0}), (sec, {"alpha": 0}), (exp3, {"scale": 0}), (exp3, {"arms": "x"}),
    (learnability_buffer, {"mix": 2}), (learnability_buffer, {"buffer_size": 0}),
    (prioritized_learnability, {"eps": 0}), (learnability_buffer, {"decay": 0}),
    (learnability_buffer, {"decay": float("nan")}), (prioritized_learnability, {"decay": 1.5}),
    (prioritized_learnability, {"alpha": float("inf")}),
])
def test_bad_hyperparameters_rejected(factory, kw):
    with pytest.raises(ValueError):
        factory(**kw)


# ---- MoPPS's hot path inside arms (recommended, dump+mopps) ---------------------------------------
def test_mopps_beta_draw_at_the_uniform_prior_is_one_uniform_each():
    """A candidate at Beta(1, 1) gets one uniform draw (the same law as X/(X+Y) with
    X, Y ~ Exp(1)); the others keep the gamma ratio, drawn after, in order."""
    from rlpace.policies._mopps import _beta_draw
    a = np.array([1.0, 2.0, 1.0, 1.0, 0.5])
    b = np.array([1.0, 3.0, 1.0, 2.0, 0.5])
    got = _beta_draw(np.random.default_rng(5), a, b)
    ref = np.random.default_rng(5)
    u = ref.random(2)
    rest = np.array([1, 3, 4])
    x, y = ref.standard_gamma(a[rest]), ref.standard_gamma(b[rest])
    np.testing.assert_array_equal(got[[0, 2]], u)
    np.testing.assert_array_equal(got[rest], x / (x + y))
    # the law in a mixed array: each part keeps its Beta moments
    rng = np.random.default_rng(0)
    a = np.where(np.arange(200_000) % 2 == 0, 1.0, 2.0)
    b = np.where(np.arange(200_000) % 2 == 0, 1.0, 5.0)
    x = _beta_draw(rng, a, b)
    for sel, (aa, bb) in ((a == 1.0, (1.0, 1.0)), (a == 2.0, (2.0, 5.0))):
        assert abs(x[sel].mean() - aa / (aa + bb)) < 0.004
        assert abs(x[sel].var() - aa * bb / ((aa + bb) ** 2 * (aa + bb + 1))) < 0.003


def test_mopps_arm_then_distance_order_equals_lexsort():
    from rlpace.policies._mopps import _by_arm_then_distance
    rng = np.random.default_rng(3)
    for trial in range(20):
        lens = rng.integers(1, 60, size=rng.integers(1, 9))
        arm = np.repeat(np.arange(lens.size), lens)
        dist = rng.random(arm.size) ** 2
        if trial % 2:                                    # ties: the stable path must order them
            dist = np.round(dist, 1)
        np.testing.assert_array_equal(_by_arm_then_distance(arm, dist), np.lexsort((dist, arm)))
