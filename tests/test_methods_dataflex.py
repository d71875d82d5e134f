"""DataFlex-RL's `topk`, `reward_gap` and `tscl` (arXiv 2609.06107, configs 9, 11, 13):
hand-computed values, plain-Python references of DataFlex's own rules, exact resume."""

import math
import warnings
from collections import deque

import numpy as np
import pytest

from rlpace import Feedback, Pool, Scheduler
from rlpace.policies import MIXTURE, reward_gap, topk_advantage, tscl
from rlpace.policies._reward_gap import apply_floor
from rlpace.policies._tscl import windowed_slopes
from rlpace.types import Batch


def _batch(pool, ids, rewards, adv=None, step=0):
    return Batch.from_feedback(Feedback(ids, rewards, adv, step=step), pool, 0.5)


def _softmax(z):
    e = np.exp(np.asarray(z, dtype=np.float64) - np.max(z))
    return e / e.sum()


# ---- topk -----------------------------------------------------------------------------------
def test_topk_hand_values_and_position_tie_break():
    pool = Pool([0, 0])
    # |A| (row-major) = [0.5, 2.0, 1.0, 1.0, 0.0, 1.5]; M = 6, k = round(0.5·6) = 3:
    # 2.0 (row 0 col 1), 1.5 (row 1 col 2), then 1.0 tied between row 0 col 2 and row 1
    # col 0 — the earlier position (row 0 col 2) wins.
    b = _batch(pool, [0, 1], [[1, 0, 1], [1, 0, 0]], adv=[[0.5, -2.0, 1.0], [1.0, 0.0, -1.5]])
    p = topk_advantage()
    out = p.apply(p.init(pool), pool, b)
    assert out.keep.tolist() == [[False, True, True], [False, False, True]]
    assert out.refill == 0
    # swapping the two tied rollouts' rows moves the kept one with the position
    b2 = _batch(pool, [1, 0], [[1, 0, 0], [1, 0, 1]], adv=[[1.0, 0.0, -1.5], [0.5, -2.0, 1.0]])
    assert p.apply(p.init(pool), pool, b2).keep.tolist() == [[True, False, True], [False, True, False]]


def test_topk_grpo_binary_rewards():
    pool = Pool([0, 0])
    # group 0: one success in 4 -> |A| = 0.75/0.4330 = 1.7321 for the success, 0.5774 for
    # the failures; group 1: two in 4 -> |A| = 0.5/0.5 = 1.0 for all four (eps 1e-6 aside).
    # M = 8, k = 4: 1.7321, then the three earliest of the four tied 1.0s.
    b = _batch(pool, [0, 1], [[1, 0, 0, 0], [1, 1, 0, 0]])
    r3 = math.sqrt(3)
    np.testing.assert_allclose(np.abs(b.advantages), [[r3, 1 / r3, 1 / r3, 1 / r3], [1, 1, 1, 1]], atol=1e-5)
    p = topk_advantage()
    assert p.apply(p.init(pool), pool, b).keep.tolist() == [[True, False, False, False],
                                                             [True, True, True, False]]


@pytest.mark.parametrize("m, fraction, k", [(5, 0.5, 2), (7, 0.5, 4), (6, 0.5, 3), (10, 0.01, 1),
                                            (4, 1.0, 4), (3, 0.3, 1), (9, 0.25, 2)])
def test_topk_count_rounds_half_to_even_at_least_one(m, fraction, k):
    # DataFlex: k = max(1, int(round(fraction·M))), Python's round (2.5 -> 2, 3.5 -> 4, 2.25 -> 2)
    pool = Pool([0])
    b = _batch(pool, [0], [list(range(m))], adv=[np.linspace(1.0, 2.0, m)])
    p = topk_advantage(fraction)
    keep = p.apply(p.init(pool), pool, b).keep
    assert keep.sum() == k
    assert keep[0, m - k:].all()                       # the k largest |A| are the last k


def _topk_reference(abs_adv, fraction):
    """Sort positions by (−|A|, position) in Python; keep the first k."""
    flat = [float(x) for x in np.ravel(abs_adv)]
    k = max(1, int(round(fraction * len(flat))))
    order = sorted(range(len(flat)), key=lambda i: (-flat[i], i))
    keep = [False] * len(flat)
    for i in order[:k]:
        keep[i] = True
    return np.array(keep).reshape(np.shape(abs_adv))


def test_topk_matches_reference_loop_on_random_batches():
    pool = Pool(np.arange(30) % 3)
    rng = np.random.default_rng(0)
    for trial in range(200):
        b_, g = int(rng.integers(1, 12)), int(rng.integers(1, 9))
        ids = rng.integers(0, 30, size=b_)
        if trial % 2:                                   # binary rewards: many tied |A|
            batch = _batch(pool, ids, (rng.random((b_, g)) < 0.5).astype(float))
        else:
            batch = _batch(pool, ids, rng.random((b_, g)), adv=rng.integers(-3, 4, (b_, g)) / 2)
        fraction = float(rng.choice([0.1, 0.25, 0.5, 0.75, 1.0]))
        p = topk_advantage(fraction)
        got = p.apply(p.init(pool), pool, batch).keep
        np.testing.assert_array_equal(got, _topk_reference(np.abs(batch.advantages), fraction))


def test_topk_empty_batch_and_scheduler():
    pool = Pool([0, 1])
    p = topk_advantage()
    empty = _batch(pool, np.zeros(0, np.int64), np.zeros((0, 4)))
    out = p.apply(p.init(pool), pool, empty)
    assert out.keep.shape == (0, 4) and out.refill == 0
    s = Scheduler(pool, "topk", seed=0)
    assert s.method.admission.name == "topk" and s.method.mixture is None
    fb = Feedback([0, 1], [[1, 0], [1, 1]], advantages=[[0.5, -2.0], [1.0, 0.5]], step=0)
    adm = s.admission(fb)
    assert adm.keep.tolist() == [[False, True], [True, False]] and adm.refill == 0


@pytest.mark.parametrize("bad", [0, 0.0, -0.5, 1.5, True, "half", float("nan")])
def test_topk_bad_fraction(bad):
    with pytest.raises(ValueError, match="topk fraction"):
        topk_advantage(bad)


# ---- reward_gap -----------------------------------------------------------------------------
def test_reward_gap_hand_values_two_domains():
    pool = Pool(["a", "b"])
    # r̄ = [3/4, 1/4]; gaps [0, 0.5]; p = softmax([0, 0.5]) = [1, e^0.5]/(1 + e^0.5)
    b = _batch(pool, [0, 1], [[1, 1, 1, 0], [0, 0, 1, 0]])
    p1 = 1.0 / (1.0 + math.exp(-0.5))
    assert p1 == pytest.approx(0.622459, abs=1e-6)
    m = reward_gap()
    probs = m.apply(m.update(m.init(pool), pool, b), pool)
    np.testing.assert_allclose(probs, [0.9 * (1 - p1) + 0.05, 0.9 * p1 + 0.05], rtol=0, atol=1e-15)
    np.testing.assert_allclose(probs, [0.389787, 0.610213], atol=1e-6)
    # DataFlex's clip rule: both already above the floor, so p unchanged
    m = reward_gap(floor_rule="clip")
    np.testing.assert_allclose(m.apply(m.update(m.init(pool), pool, b), pool), [1 - p1, p1], atol=1e-15)
    # no floor, T = 0.5: softmax([0, 1]) = [1, e]/(1 + e)
    m = reward_gap(temperature=0.5, floor=0.0)
    np.testing.assert_allclose(m.apply(m.update(m.init(pool), pool, b), pool),
                               [1 / (1 + math.e), math.e / (1 + math.e)], atol=1e-15)


def test_reward_gap_unseen_domain_counts_as_zero_reward():
    pool = Pool(["a", "b", "c"])
    m = reward_gap()
    s = m.init(pool)
    np.testing.assert_allclose(m.apply(s, pool), [1 / 3] * 3, atol=1e-15)     # DataFlex's start
    # a: all solved (r̄ = 1), c: half (0.5), b: never seen -> r̄ = 0 (tracker default).
    # gaps [0, 1, 0.5]; p = [1, e, e^0.5] / (1 + e + e^0.5) = [0.186324, 0.506480, 0.307196];
    # floored: 0.85·p + 0.05 = [0.208375, 0.480508, 0.311117].
    s = m.update(s, pool, _batch(pool, [0, 2], [[1, 1], [1, 0]]))
    expect = np.array([1, math.e, math.exp(0.5)]) / (1 + math.e + math.exp(0.5))
    np.testing.assert_allclose(expect, [0.186324, 0.506480, 0.307196], atol=1e-6)
    np.testing.assert_allclose(m.apply(s, pool), 0.85 * expect + 0.05, atol=1e-15)
    np.testing.assert_allclose(m.apply(s, pool), [0.208375, 0.480508, 0.311117], atol=1e-6)


def test_reward_gap_window_counts_rollouts():
    pool = Pool(["a", "b"])
    m = reward_gap(window=3)
    s = m.update(m.init(pool), pool, _batch(pool, [0], [[1, 1, 0, 0]]))
    # the last 3 rollouts of a: [1, 0, 0] -> 1/3 (not a step mean of 1/2)
    assert s.window.filled.tolist() == [3, 0]
    assert s.window.values[0].sum() / 3 == pytest.approx(1 / 3)
    s = m.update(s, pool, _batch(pool, [0], [[1, 1]]))         # window [0, 1, 1] -> 2/3
    assert s.window.values[0].sum() / 3 == pytest.approx(2 / 3)
    gap = 2 / 3                                                 # b unseen: r̄ = 0
    probs = m.apply(s, pool)
    p = _softmax([0.0, gap])
    np.testing.assert_allclose(probs, 0.9 * p + 0.05, atol=1e-15)


class _DataFlexRewardGap:
    """DataFlex's DomainStatsTracker (deque per domain, one value per rollout) and
    RewardGapMixer.act, as plain Python (DataFlex-RL mixers.py)."""

    def __init__(self, domains, window, temperature, floor):
        self.domains, self.t, self.floor = list(domains), temperature, floor
        self.buf = {d: deque(maxlen=window) for d in self.domains}

    def update(self, domains_per_row, rewards):
        for d, row in zip(domains_per_row, rewards):
            for r in row:
                self.buf[d].append(float(r))

    def act(self, rule):
        means = np.array([sum(self.buf[d]) / len(self.buf[d]) if self.buf[d] else 0.0
                          for d in self.domains])
        p = _softmax((means.max() - means) / self.t)
        if rule == "clip":
            p = np.maximum(p, self.floor)
            return p / p.sum()
        return (1 - len(p) * self.floor) * p + self.floor


@pytest.mark.parametrize("rule", ["clip", "mix"])
def test_reward_gap_matches_dataflex_reference_on_a_stream(rule):
    pool = Pool(np.repeat([0, 1, 2, 3], 10))
    rng = np.random.default_rng(1)
    m = reward_gap(temperature=0.7, floor=0.05, window=7, floor_rule=rule)
    ref = _DataFlexRewardGap(range(4), 7, 0.7, 0.05)
    s = m.init(pool)
    for t in range(40):
        b, g = int(rng.integers(0, 6)), int(rng.integers(1, 5))
        ids = rng.integers(0, 40, size=b)
        rewards = rng.random((b, g)) * 2 - 1                     # math_dapo-like: may be negative
        s = m.update(s, pool, _batch(pool, ids, rewards, step=t))
        ref.update(pool.domains[ids], rewards)
        np.testing.assert_allclose(m.apply(s, pool), ref.act(rule), rtol=0, atol=1e-12)


def test_clip_floor_can_fall_below_floor_mix_cannot():
    p = np.array([0.98, 0.01, 0.01])
    low = apply_floor(p, 0.05, "clip").min()
    assert low == pytest.approx(0.05 / 1.08) and low < 0.05
    assert apply_floor(p, 0.05, "mix").min() == pytest.approx(0.0585)


# ---- tscl -----------------------------------------------------------------------------------
def _tscl_stream(pool):
    """Domain 0's step means 0.2, 0.4, 0.9 at steps 1, 2, 3 (two prompts a step, so the
    step mean is over all four rollouts); domain 1 at 0.5 every step."""
    return [_batch(pool, [0, 1, 2], [[0.0, 0.4], [0.2, 0.2], [0.5, 0.5]], step=1),
            _batch(pool, [0, 1, 2], [[0.4, 0.4], [0.4, 0.4], [1.0, 0.0]], step=2),
            _batch(pool, [0, 1, 2], [[1.0, 0.8], [0.9, 0.9], [0.5, 0.5]], step=3)]


def test_tscl_hand_values():
    pool = Pool(["a", "a", "b"])
    # slope_a: t̄ = 2, ȳ = 0.5, Σ(t−t̄)(y−ȳ) = (−1)(−0.3) + 0 + (1)(0.4) = 0.7, Σ(t−t̄)² = 2
    # -> 0.35; slope_b = 0.
    for temperature, expect in ((0.1, [0.970688, 0.029312]), (1.0, [0.586618, 0.413382])):
        m = tscl(temperature=temperature)
        s = m.init(pool)
        for b in _tscl_stream(pool):
            s = m.update(s, pool, b)
        np.testing.assert_allclose(windowed_slopes(s.reward, s.step, s.filled), [0.35, 0.0], atol=1e-12)
        p = _softmax([0.35 / temperature, 0.0])
        np.testing.assert_allclose(p, expect, atol=1e-6)
        np.testing.assert_allclose(m.apply(s, pool), 0.9 * p + 0.05, atol=1e-12)
    # T = 0.1 with the floor: 0.9·0.970688 + 0.05 = 0.923619
    assert m.metrics(s, pool)["tscl/max_abs_slope"] == pytest.approx(0.35)
    m = tscl(temperature=0.1)
    s = m.init(pool)
    for b in _tscl_stream(pool):
        s = m.update(s, pool, b)
    np.testing.assert_allclose(m.apply(s, pool), [0.923619, 0.076381], atol=1e-6)


def test_tscl_window_counts_steps_and_magnitude_drives_sampling():
    pool = Pool(["a", "a", "b"])
    m = tscl(window=2, temperature=0.1, floor=0.0)
    s = m.init(pool)
    for b in _tscl_stream(pool):
        s = m.update(s, pool, b)
    # only steps 2 and 3 remain for a: slope (0.9 − 0.4)/1 = 0.5
    assert s.filled.tolist() == [2, 2]
    np.testing.assert_allclose(windowed_slopes(s.reward, s.step, s.filled), [0.5, 0.0], atol=1e-12)
    np.testing.assert_allclose(m.apply(s, pool), _softmax([5.0, 0.0]), atol=1e-12)
    # a falling curve (forgetting) weighs as much as a rising one: |slope|
    s2 = m.init(pool)
    for t, y in ((1, 0.9), (2, 0.4)):
        s2 = m.update(s2, pool, _batch(pool, [0, 2], [[y], [0.5]], step=t))
    np.testing.assert_allclose(windowed_slopes(s2.reward, s2.step, s2.filled), [-0.5, 0.0], atol=1e-12)
    np.testing.assert_allclose(m.apply(s2, pool), _softmax([5.0, 0.0]), atol=1e-12)


def test_tscl_zero_slope_cases_give_uniform():
    pool = Pool(["a", "b"])
    m = tscl()
    s = m.init(pool)
    np.testing.assert_allclose(m.apply(s, pool), [0.5, 0.5], atol=1e-15)   # no data
    s = m.update(s, pool, _batch(pool, [0], [[1.0, 0.0]], step=4))
    np.testing.assert_allclose(m.apply(s, pool), [0.5, 0.5], atol=1e-15)   # one entry
    s = m.update(s, pool, _batch(pool, [0], [[1.0, 1.0]], step=4))         # same step again
    assert s.filled.tolist() == [2, 0]
    np.testing.assert_allclose(m.apply(s, pool), [0.5, 0.5], atol=1e-15)   # Σ(t − t̄)² = 0


def test_tscl_warns_once_when_every_feedback_has_the_same_step():
    # A trainer that never sets Feedback.step (default 0): slopes are 0 and the mixture is
    # uniform. The 8th entry of an arm at one step triggers one warning naming the fix.
    pool = Pool(["a", "b"])
    s = Scheduler(pool, "tscl", seed=0)
    rng = np.random.default_rng(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for t in range(7):
            s.observe(Feedback([0, 1], (rng.random((2, 4)) < 0.5).astype(float), step=0))
        assert [w for w in caught if "tscl" in str(w.message)] == []
        s.observe(Feedback([0, 1], [[1.0, 0.0], [0.0, 0.0]], step=0))
        s.observe(Feedback([0, 1], [[1.0, 1.0], [0.0, 0.0]], step=0))
    msgs = [str(w.message) for w in caught if "tscl" in str(w.message)]
    assert len(msgs) == 1 and issubclass(caught[-1].category, UserWarning)
    assert "step=0" in msgs[0] and "Feedback(..., step=" in msgs[0]
    np.testing.assert_allclose(s.domain_probs(), [0.5, 0.5], atol=1e-15)


def test_tscl_does_not_warn_with_real_steps_or_a_few_repeats():
    # Gradient accumulation: two batches per step, steps advance: no warning.
    pool = Pool(["a", "b"])
    m = tscl()
    s = m.init(pool)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for t in range(20):
            for _ in range(2):
                s = m.update(s, pool, _batch(pool, [0, 1], [[1.0, 0.0], [1.0, 1.0]], step=t))
    assert s.filled.tolist() == [40, 40]


def test_tscl_window_below_two_refused():
    with pytest.raises(ValueError, match=r"tscl window must be an int in \[2, inf\)"):
        tscl(window=1)


def test_windowed_slopes_precise_at_large_steps():
    # y = 1e-3·t + 0.1 over t = 10⁶ .. 10⁶ + 4: the centred formula recovers 1e-3 exactly
    t = np.arange(10**6, 10**6 + 5)
    np.testing.assert_allclose(windowed_slopes((1e-3 * (t - 10**6) + 0.1)[None], t[None], np.array([5])),
                               [1e-3], rtol=1e-9)


class _TsclReference:
    """Per arm a deque of (step, mean reward of the arm's rollouts at that update), and
    np.polyfit(deg=1) for the slope."""

    def __init__(self, k, window, temperature, floor):
        self.buf = [deque(maxlen=window) for _ in range(k)]
        self.t, self.floor = temperature, floor

    def update(self, arms, rewards, step):
        for a in sorted(set(arms.tolist())):
            rows = rewards[arms == a]
            self.buf[a].append((step, float(np.mean(rows))))

    def probs(self):
        slopes = []
        for b in self.buf:
            xs = np.array([x for x, _ in b], dtype=float)
            if len(b) < 2 or np.ptp(xs) == 0:
                slopes.append(0.0)
            else:
                slopes.append(np.polyfit(xs, [y for _, y in b], 1)[0])
        p = _softmax(np.abs(slopes) / self.t)
        return (1 - len(p) * self.floor) * p + self.floor


def test_tscl_matches_reference_on_a_stream_with_late_and_repeated_steps():
    pool = Pool(np.repeat([0, 1, 2], 10))
    rng = np.random.default_rng(2)
    m = tscl(temperature=0.05, window=5)
    ref = _TsclReference(3, 5, 0.05, 0.05)
    s = m.init(pool)
    for t in range(60):
        b, g = int(rng.integers(0, 5)), int(rng.integers(1, 4))
        ids = rng.integers(0, 30, size=b)
        step = max(0, t - int(rng.integers(0, 3)))               # late or repeated steps
        rewards = rng.random((b, g)) + 0.02 * t * (pool.domains[ids] == 1)[:, None]
        s = m.update(s, pool, _batch(pool, ids, rewards, step=step))
        if b:
            ref.update(pool.domains[ids], rewards, step)
        np.testing.assert_allclose(m.apply(s, pool), ref.probs(), rtol=0, atol=1e-9)


# ---- shared: arguments, floors, resume ------------------------------------------------------
@pytest.mark.parametrize("factory", [reward_gap, tscl])
@pytest.mark.parametrize("kwargs, field", [({"temperature": 0}, "temperature"),
                                           ({"temperature": float("inf")}, "temperature"),
                                           ({"floor": -0.1}, "floor"), ({"floor": 1.0}, "floor"),
                                           ({"window": 0}, "window"), ({"window": 2.5}, "window"),
                                           ({"floor_rule": "max"}, "floor_rule"),
                                           ({"arms": "prompt"}, "arms")])
def test_mixer_bad_arguments(factory, kwargs, field):
    with pytest.raises(ValueError, match=field):
        factory(**kwargs)


@pytest.mark.parametrize("name", ["reward_gap", "tscl"])
def test_mixer_infeasible_floor_and_cluster_arms(name):
    pool = Pool(["a", "b", "c"], clusters=[0, 1, 1])
    with pytest.raises(ValueError, match="infeasible"):
        Scheduler(pool, name, floor=0.4)
    s = Scheduler(pool, name, arms="cluster", floor=0.0)
    assert s.method.mixture.arms == "cluster"
    np.testing.assert_allclose(s.method.mixture.apply(s.states[MIXTURE], pool), [0.5, 0.5])


POOL = Pool(np.repeat(["easy", "mid", "hard"], 20))
HIDDEN = np.repeat([0.9, 0.5, 0.1], 20) + np.tile(np.linspace(-0.05, 0.05, 20), 3)


def _drive(sched, start, stop):
    out = []
    for t in range(start, stop):
        ids = sched.propose(12)
        rng = np.random.default_rng([t, 7])
        p = np.clip(HIDDEN[ids] + 0.01 * t, 0, 1)[:, None]       # domains improve over time
        fb = Feedback(ids, (rng.random((12, 4)) < p).astype(float), step=t)
        sched.observe(fb)
        out.append((ids, sched.domain_probs(), sched.admission(fb).keep))
    return out


@pytest.mark.parametrize("name, kwargs", [("reward_gap", {"window": 10}), ("tscl", {"temperature": 0.01}),
                                          ("topk", {}), ("reward_gap+topk", {})])
def test_exact_resume_through_scheduler(name, kwargs):
    ref = Scheduler(POOL, name, seed=3, **kwargs)
    _drive(ref, 0, 15)
    fresh = Scheduler(POOL, name, seed=99, **kwargs)
    fresh.load_state_dict(ref.state_dict())
    a, b = _drive(fresh, 15, 30), _drive(ref, 15, 30)
    for (i1, p1, k1), (i2, p2, k2) in zip(a, b):
        np.testing.assert_array_equal(i1, i2)
        np.testing.assert_array_equal(k1, k2)
        if p1 is not None:
            np.testing.assert_array_equal(p1, p2)
    sd1, sd2 = fresh.state_dict(), ref.state_dict()
    assert sd1.keys() == sd2.keys()
    for k in sd1:
        np.testing.assert_array_equal(sd1[k], sd2[k], err_msg=k)
    if name != "topk":                                          # the mixture moved off uniform
        assert np.ptp(ref.domain_probs()) > 0.01, ref.domain_probs()
