"""The shared step's and the domain mixtures' fast paths against the plain code they replace,
bit for bit (the 50-step stream digests in test_scheduler_stream.py check the whole streams)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from rlpace import Feedback, Pool, Scheduler
from rlpace._checks import shifted
from rlpace.policies import make_policy
from rlpace.policies._base import shifted_softmax, softmax
from rlpace.policies._sec import arm_mean_abs_advantage
from rlpace.scheduler import _STREAM_PROPOSE, _propose_rng, _uint32_words
from rlpace.types import Batch

SEEDS = (0, 1, 7, 2**32 - 1, 2**32, 2**40 + 3, 2**63 - 1)
STEPS = (0, 1, 99, 2**32 - 1, 2**32, 2**62 - 1)


@pytest.mark.parametrize("seed", SEEDS)
def test_propose_rng_is_default_rng_of_the_list(seed):
    for step in STEPS:
        fast, plain = _propose_rng(seed, step), np.random.default_rng([seed, step, _STREAM_PROPOSE])
        assert fast.random(6).tobytes() == plain.random(6).tobytes(), (seed, step)
        assert fast.integers(0, 10**9, size=6).tolist() == plain.integers(0, 10**9, size=6).tolist()


def test_uint32_words_by_hand():
    assert _uint32_words(0) == [0]
    assert _uint32_words(0x5EED) == [0x5EED]
    assert _uint32_words(2**32) == [0, 1]
    assert _uint32_words(2**63 - 1) == [0xFFFFFFFF, 0x7FFFFFFF]


def test_scheduler_proposals_follow_the_documented_generator():
    """A Scheduler's proposal t is what `default_rng([seed, t, stream])` draws (uniform_pool:
    one `integers` call), so the stream is the documented one, not only a stable one."""
    pool = Pool(np.arange(50) % 3)
    s = Scheduler(pool, "uniform", seed=2**33 + 5)
    for t in range(3):
        want = np.random.default_rng([2**33 + 5, t, _STREAM_PROPOSE]).integers(0, 50, size=9, dtype=np.int64)
        assert s.propose(9).tolist() == want.tolist()


def _score_cases():
    rng = np.random.default_rng(3)
    for _ in range(200):
        k = int(rng.integers(1, 20))
        x = rng.normal(0, 10.0 ** rng.integers(-3, 4), size=k)
        if rng.random() < 0.3:
            x[rng.integers(0, k)] = -np.inf           # an empty arm of dump's base="pool"
        if rng.random() < 0.3:
            x[:] = x[0]                               # ties: every entry the maximum
        if rng.random() < 0.2:
            x[rng.random(k) < 0.5] = -0.0
        yield x, float(10.0 ** rng.uniform(-3, 2))


def test_shifted_softmax_is_softmax_of_shifted_bit_for_bit():
    n = 0
    for x, t in _score_cases():
        if not np.isfinite(x.max()):
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = shifted_softmax(x, t)
        assert got.tobytes() == softmax(shifted(x), t).tobytes(), (x, t)
        n += 1
    assert n > 150


@pytest.mark.parametrize("bad", [np.inf, np.nan])
def test_shifted_softmax_without_a_finite_maximum_takes_the_plain_path(bad):
    x = np.array([0.5, bad, -1.0])
    with np.errstate(invalid="ignore"):
        got, want = shifted_softmax(x, 0.2), softmax(shifted(x), 0.2)
    assert np.array_equal(got, want, equal_nan=True)


def _batch(pool, rng, b=40, g=8, absent=(2,)):
    ids = rng.integers(0, len(pool), size=4 * b)
    ids = ids[~np.isin(pool.domains[ids], absent)][:b]
    fb = Feedback(ids, rng.normal(size=(b, g)) * 3, step=0)
    return Batch.from_feedback(fb, pool, 0.5)


def test_arm_mean_abs_advantage_equals_a_loop_over_arms():
    pool = Pool(np.arange(400) % 5)
    rng = np.random.default_rng(0)
    batch = _batch(pool, rng)
    mean, present = arm_mean_abs_advantage(pool, batch, "domain", 5)
    for a in range(5):
        rows = [i for i in range(batch.prompt_ids.shape[0]) if batch.domains[i] == a]
        total = 0.0
        for i in rows:                                 # bincount adds in batch order
            total += float(np.abs(batch.advantages[i]).sum()) / batch.advantages.shape[1]
        want = total / len(rows) if rows else 0.0
        assert present[a] == bool(rows)
        assert mean[a] == want and np.signbit(mean[a]) == np.signbit(want), a
    assert not present[2]


def test_sec_update_equals_the_indexed_td_step():
    pool = Pool(np.arange(400) % 5)
    rng = np.random.default_rng(1)
    p = make_policy("sec", alpha=0.3)
    state = p.init(pool)
    state.q[:] = rng.normal(size=5)
    before = state.q.copy()
    batch = _batch(pool, rng)
    r, present = arm_mean_abs_advantage(pool, batch, "domain", 5)
    want = before.copy()
    for a in np.flatnonzero(present):
        want[a] = 0.3 * r[a] + (1.0 - 0.3) * before[a]
    got = p.update(state, pool, batch).q
    assert got.tobytes() == want.tobytes()
    assert got[2] == before[2]


def test_exp3_update_equals_the_indexed_reward_step_and_skips_absent_arms():
    pool = Pool(np.arange(400) % 5)
    rng = np.random.default_rng(2)
    p = make_policy("exp3", scale=10.0)
    state = p.init(pool)
    state.reward[:] = rng.random(5)
    state.prob[:] = [0.3, 0.2, 0.0, 0.25, 0.25]       # a restored state may hold π = 0 for an arm
    reward0, prob0 = state.reward.copy(), state.prob.copy()
    batch = _batch(pool, rng)                          # arm 2 (π = 0) is absent: no 0 / 0
    r, present = arm_mean_abs_advantage(pool, batch, "domain", 5)
    want = reward0.copy()
    for a in np.flatnonzero(present):
        want[a] += (r[a] / 10.0) / prob0[a]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = p.update(state, pool, batch).reward
    assert got.tobytes() == np.minimum(want, 1e300).tobytes()


@pytest.mark.parametrize("rewards", ["binary", "binary_g12", "graded", "given_advantages"])
def test_lean_batch_keeps_every_count_observe_reads(rewards):
    """`observe` of a method whose places read no batch builds it lean: the same wins,
    informative flags, pass rates, success and domains; only what policies read is left out."""
    from rlpace.types import _batch_and_counts
    pool = Pool(np.arange(300) % 4, clusters=np.arange(300) % 9)
    rng = np.random.default_rng(5)
    g = 12 if rewards == "binary_g12" else 8
    r = (rng.random((30, g)) < 0.5).astype(float)
    r[:3] = 1.0                                        # all-correct groups: not informative
    kw = {}
    if rewards == "graded":
        r = r * rng.random((30, g))
    if rewards == "given_advantages":
        kw["advantages"] = rng.normal(size=(30, g))
    fb = Feedback(rng.integers(0, 300, size=30), r, step=4, **kw)
    full, wins, inf = _batch_and_counts(fb, pool, 0.5)
    lean, wins_l, inf_l = _batch_and_counts(fb, pool, 0.5, lean=True)
    assert wins_l.tolist() == wins.tolist() and inf_l.tolist() == inf.tolist()
    for field in ("success", "pass_rate", "domains", "prompt_ids", "rewards"):
        assert getattr(lean, field).tobytes() == getattr(full, field).tobytes(), field
    assert lean.clusters is None
    if rewards.startswith("binary"):
        assert lean.advantages is None
    else:
        assert lean.advantages.tobytes() == full.advantages.tobytes()
    if rewards.startswith("binary"):
        assert inf.tolist()[:3] == [False] * 3 and wins.tolist()[:3] == [g] * 3


def test_lean_only_where_no_place_reads_the_batch_in_observe():
    pool = Pool(np.arange(60) % 3)
    lean = {name: Scheduler(pool, name)._places().lean
            for name in ("uniform", "fixed_mixture", "epiplexity", "dump", "sec", "exp3", "dvc", "ttrl",
                         "topk")}
    assert lean == {"uniform": True, "fixed_mixture": True, "epiplexity": True, "dump": False, "sec": False,
                    "exp3": False, "dvc": False, "ttrl": False, "topk": True}
    # topk's admission reads a batch of its own (`admit`, `step`), built in full
    s = Scheduler(pool, "topk")
    fb = Feedback([0, 1], [[1.0, 0.0], [0.0, 0.0]], step=0)
    s.observe(fb)
    assert s.admit(fb).tolist() == [[True, True], [False, False]]   # |A| = 1 in group 0 only


def test_a_user_mixture_that_reads_advantages_gets_them():
    """A user policy with its own update turns the lean batch off: it reads the advantages."""
    from rlpace.policies import DataPolicy
    from rlpace.policies._base import MIXTURE
    seen = []

    def update(state, pool, batch):
        seen.append(np.array(batch.advantages))
        return state
    user = DataPolicy(MIXTURE, lambda pool: np.zeros(1), update, lambda s, pool, *_: np.ones(2) / 2,
                      name="reads_advantages")
    s = Scheduler(Pool([0, 0, 1, 1]), user)
    s.observe(Feedback([0, 2], [[1.0, 0.0], [1.0, 1.0]], step=0))
    assert not s._places().lean
    assert np.allclose(seen[0], [[1.0, -1.0], [0.0, 0.0]], atol=1e-5)
