"""DUMP (arXiv 2504.09710; docs/methods/dump.md): hand-computed scores and a per-rollout
reference loop."""

import math

import numpy as np
import pytest

from rlpace import Feedback, Pool, Scheduler
from rlpace.policies import dump_ucb
from rlpace.types import Batch


def _batch(pool, ids, rewards, adv=None):
    return Batch.from_feedback(Feedback(ids, rewards, adv, step=0), pool, 0.5)


def test_docstring_example_two_arms():
    # Arm 0 saw 4 rollouts with |A| = 1, arm 1 none: N = 4,
    # score = [1 + sqrt(2 ln 5 / 5), sqrt(2 ln 5 / 1)] = [1.802356, 1.794123],
    # p = softmax(score / 0.1) -> p0 = 1 / (1 + exp(-0.082329)) = 0.520571.
    pool = Pool([0, 0, 1, 1])
    p = dump_ucb()
    s = p.update(p.init(pool), pool, _batch(pool, [0], [[1, 0, 1, 0]], adv=[[1, -1, 1, -1]]))
    probs = p.apply(s, pool)
    s0 = 1 + math.sqrt(2 * math.log(5) / 5)
    s1 = math.sqrt(2 * math.log(5) / 1)
    assert s0 == pytest.approx(1.802356, abs=1e-6) and s1 == pytest.approx(1.794123, abs=1e-6)
    assert probs[0] == pytest.approx(1 / (1 + math.exp(-(s0 - s1) / 0.1)), abs=1e-12)
    assert probs[0] == pytest.approx(0.520571, abs=1e-6)


def test_initial_weights_uniform_and_floor():
    pool = Pool([0, 1, 2])
    p = dump_ucb(floor=0.1)
    np.testing.assert_allclose(p.apply(p.init(pool), pool), [1 / 3] * 3)
    # A dominant arm: p' = (1 - 3*0.1) p + 0.1 keeps every arm >= 0.1.
    s = p.init(pool)
    for _ in range(20):
        s = p.update(s, pool, _batch(pool, [0], [[1, 0, 1, 0]]))
    probs = p.apply(s, pool)
    assert probs.min() >= 0.1 - 1e-12 and probs.sum() == pytest.approx(1.0)


def test_window_units_hand_values():
    pool = Pool([0, 1])
    rewards = [[1, 0, 0, 0], [1, 1, 1, 1]]          # |A| of group 0: [sqrt3, 1/sqrt3 x3]
    b = _batch(pool, [0, 1], rewards)
    a0 = np.abs(b.advantages[0])
    # rollouts: arm 0 window has 4 entries, mean |A| = (sqrt3 + 3/sqrt3)/4 = 0.866025
    for unit, count0 in (("rollouts", 4), ("prompts", 1), ("steps", 1)):
        p = dump_ucb(window_unit=unit)
        s = p.update(p.init(pool), pool, b)
        assert s.count.tolist() == [count0, count0]
        mean0 = s.window.values[0, :s.window.filled[0]].mean()
        assert mean0 == pytest.approx(a0.mean(), abs=1e-9)
        assert mean0 == pytest.approx(0.866025, abs=1e-5)


def test_window_units_differ_with_two_groups_per_arm():
    # Arm 0 gets two groups in one step (mean |A| 1 and 3), arm 1 one group (mean |A| 2).
    # rollouts: 8 and 4 entries; prompts: one entry per group, [1, 3] and [2];
    # steps: one entry per arm per update, the mean of its groups, [2] and [2].
    pool = Pool([0, 0, 1, 1])
    adv = [[1, -1, 1, -1], [3, -3, 3, -3], [2, -2, 2, -2]]
    b = _batch(pool, [0, 1, 2], [[1, 0, 1, 0]] * 3, adv=adv)
    got = {}
    for unit in ("rollouts", "prompts", "steps"):
        p = dump_ucb(window_unit=unit)
        s = p.update(p.init(pool), pool, b)
        got[unit] = (s.count.tolist(), [s.window.values[a, :s.window.filled[a]].tolist() for a in (0, 1)],
                     p.apply(s, pool))
    assert got["rollouts"][:2] == ([8, 4], [[1, 1, 1, 1, 3, 3, 3, 3], [2, 2, 2, 2]])
    assert got["prompts"][:2] == ([2, 1], [[1.0, 3.0], [2.0]])
    assert got["steps"][:2] == ([1, 1], [[2.0], [2.0]])

    def probs(n0, n1):                          # both window means are 2: only the bonus differs
        total = n0 + n1
        score = np.array([2 + math.sqrt(2 * math.log(total + 1) / (n0 + 1)),
                          2 + math.sqrt(2 * math.log(total + 1) / (n1 + 1))])
        e = np.exp((score - score.max()) / 0.1)
        return e / e.sum()
    np.testing.assert_allclose(got["steps"][2], [0.5, 0.5], rtol=1e-12)
    np.testing.assert_allclose(got["prompts"][2], probs(2, 1), rtol=1e-12)
    np.testing.assert_allclose(got["rollouts"][2], probs(8, 4), rtol=1e-12)
    # prompts: p0 = 1 / (1 + exp((sqrt(2 ln 4 / 2) − sqrt(2 ln 4 / 3)) / 0.1))
    #             = 1 / (1 + exp((1.177410 − 0.961352) / 0.1)) = 1 / (1 + 8.6763) = 0.103346
    assert got["prompts"][2][0] == pytest.approx(0.103346, abs=1e-6)


def test_windowed_counting_uses_filled_slots():
    pool = Pool([0, 1])
    p = dump_ucb(window=3, counting="windowed")
    s = p.init(pool)
    s = p.update(s, pool, _batch(pool, [0, 0], [[1, 0], [1, 0]], adv=[[1, -1], [1, -1]]))  # window keeps 3
    assert s.window.filled.tolist() == [3, 0] and s.count.tolist() == [4, 0]
    # windowed: N = 3, n = [3, 0]; |A| = 1 for every rollout (G=2, one success).
    score = np.array([1 + math.sqrt(2 * math.log(4) / 4), math.sqrt(2 * math.log(4) / 1)])
    e = np.exp((score - score.max()) / 0.1)
    np.testing.assert_allclose(p.apply(s, pool), e / e.sum(), rtol=1e-12)


class _DumpReference:
    """DUMP's LearnabilityEstimator + CurriculumController, per rollout in Python lists."""

    def __init__(self, k, window=300, c=1.0, t=0.1):
        self.adv = [[] for _ in range(k)]
        self.n = [0] * k
        self.window, self.c, self.t = window, c, t

    def update(self, domains, abs_adv):
        for d, row in zip(domains, abs_adv):
            for a in row:
                self.adv[d].append(a)
                self.adv[d] = self.adv[d][-self.window:]
                self.n[d] += 1

    def weights(self):
        total = max(1, sum(self.n))
        score = [(sum(w) / len(w) if w else 0.0) + self.c * math.sqrt(2 * math.log(total + 1) / (n + 1))
                 for w, n in zip(self.adv, self.n)]
        top = max(score)
        e = [math.exp((s - top) / self.t) for s in score]
        return [x / sum(e) for x in e]


def test_vectorised_equals_reference_loop_on_random_stream():
    rng = np.random.default_rng(0)
    k = 5
    pool = Pool(rng.integers(0, k, 200))
    p, ref = dump_ucb(window=37), _DumpReference(k, window=37)
    s = p.init(pool)
    for _ in range(40):
        b_size, g = rng.integers(0, 30), rng.integers(1, 9)
        ids = rng.integers(0, len(pool), b_size)
        rewards = (rng.random((b_size, g)) < 0.4).astype(float)
        b = _batch(pool, ids, rewards)
        s = p.update(s, pool, b)
        ref.update(pool.domains[ids].tolist(), np.abs(b.advantages).tolist())
        np.testing.assert_allclose(p.apply(s, pool), ref.weights(), rtol=1e-9, atol=1e-12)


def test_scheduler_moves_mass_to_the_learnable_domain():
    # Domain "a" always solved (|A| = 0), "b" half solved (|A| = 1): DUMP prefers b.
    pool = Pool(["a"] * 10 + ["b"] * 10)
    s = Scheduler(pool, "dump", seed=0)
    for step in range(30):
        ids = s.propose(8)
        r = np.where(pool.domains[ids][:, None] == 0, 1.0, np.tile([1.0, 0.0], (8, 2)))
        s.observe(Feedback(ids, r, step=step))
    m = s.metrics()
    # The exploration bonus keeps the solved arm alive: after 30 steps p(a) is ~2 %.
    assert m["domain_prob/b"] > 0.95


def test_bad_hyperparameters():
    for kw in ({"temperature": 0}, {"window_unit": "tokens"}, {"counting": "ema"}, {"c": -1}):
        with pytest.raises(ValueError):
            dump_ucb(**kw)
    with pytest.raises(ValueError, match="floor"):
        dump_ucb(floor=0.5).init(Pool([0, 1, 2]))


def test_pool_base_tilts_the_pool_shares():
    # Arms of 1 and 3 prompts. Before any feedback every score is equal (bonus sqrt(2 ln 2)):
    # base="arms" gives [1/2, 1/2], base="pool" the pool's shares [1/4, 3/4].
    pool = Pool([0, 1, 1, 1])
    for base, want in (("arms", [0.5, 0.5]), ("pool", [0.25, 0.75])):
        p = dump_ucb(base=base)
        np.testing.assert_allclose(p.apply(p.init(pool), pool), want, rtol=0, atol=1e-15)
    # Arm 0 saw 4 rollouts with |A| = 1, arm 1 none (the docstring example, scores
    # [1.802356, 1.794123]): p0 = 1 / (1 + 3·exp(−(s0 − s1)/T)) = 1 / (1 + 3·0.920964) = 0.265753.
    p = dump_ucb(base="pool")
    s = p.update(p.init(pool), pool, _batch(pool, [0], [[1, 0, 1, 0]], adv=[[1, -1, 1, -1]]))
    s0, s1 = 1 + math.sqrt(2 * math.log(5) / 5), math.sqrt(2 * math.log(5) / 1)
    probs = p.apply(s, pool)
    assert probs[0] == pytest.approx(1 / (1 + 3 * math.exp(-(s0 - s1) / 0.1)), abs=1e-12)
    assert probs[0] == pytest.approx(0.265753, abs=1e-6) and probs.sum() == pytest.approx(1.0, abs=1e-12)
    # a score lead of T·ln 3 exactly offsets a third of the size: equal shares
    lead = np.array([0.1 * math.log(3), 0.0])
    z = lead + 0.1 * np.log([0.25, 0.75])
    np.testing.assert_allclose(np.exp(z / 0.1) / np.exp(z / 0.1).sum(), [0.5, 0.5], atol=1e-12)
    with pytest.raises(ValueError, match="base"):
        dump_ucb(base="prompts")


def test_pool_arm_share_is_computed_once_and_read_only():
    pool = Pool([0, 1, 1, 1, 2, 2])
    share = pool.arm_share("domain")
    np.testing.assert_array_equal(share, [1 / 6, 3 / 6, 2 / 6])
    assert pool.arm_share("domain") is share and not share.flags.writeable
    with pytest.raises(ValueError, match="arms"):
        pool.arm_share("prompt")
