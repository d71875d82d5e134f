"""The shared step's fast paths against plain reference code: the same numbers, and bad input
still refused with the same InputError and the state unchanged (the 50-step stream digests in
test_scheduler_stream.py check the whole streams)."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

from rlpace import Feedback, Pool, Scheduler
from rlpace._checks import SIGNAL_MAX, abs_signal, clip_signal, shifted
from rlpace.errors import InputError
from rlpace.policies import make_policy
from rlpace.policies._base import shifted_softmax, softmax
from rlpace.policies._sec import arm_mean_abs_advantage
from rlpace.policies._uniform import _choice, arm_distribution, uniform_within_arm
from rlpace.scheduler import _STREAM_PROPOSE, _propose_rng, _uint32_words
from rlpace.types import Batch


def test_abs_signal_is_abs_of_clip_bit_for_bit():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(1000) * 10.0 ** rng.integers(-300, 300, 1000),
                        [0.0, -0.0, SIGNAL_MAX, -SIGNAL_MAX, 2e100, -2e100, 1e308, -1e308]])
    got, ref = abs_signal(x), np.abs(clip_signal(x))
    assert got.dtype == np.float64
    assert got.tobytes() == ref.tobytes()
    assert abs_signal(np.array([[-3.0, 1e200]])).tolist() == [[3.0, 1e100]]


def _reference_within_arm(pool, n, probs, arms, rng):
    """The selection written plainly: arm ~ Generator.choice over the non-empty arms' renormalised
    probs, then a uniform position inside the arm, floor(u * size)."""
    order, offsets = pool.members(arms)
    sizes = np.diff(offsets)
    arm = rng.choice(len(sizes), size=n, p=arm_distribution(sizes, probs))
    picks = []
    for a in arm:
        u = rng.random()
        picks.append(order[offsets[a] + int(u * sizes[a])])
    return arm, np.array(picks, dtype=np.int64)


@pytest.mark.parametrize("labels,probs", [
    (["a"] * 5 + ["b"] * 3 + ["c"] * 9, [0.2, 0.5, 0.3]),      # every arm has prompts: the fast path
    (["a"] * 5 + ["b"] * 3 + ["c"] * 9, np.array([0.0, 1.0, 0.0])),
    (["a"] * 5 + ["b"] * 3 + ["c"] * 9, [1, 1, 2]),             # ints: arm_distribution's path
])
def test_uniform_within_arm_equals_reference_draws(labels, probs):
    pool = Pool(labels)
    sel = uniform_within_arm()
    for seed in range(5):
        n = 37
        got = sel.apply(sel.init(pool), pool, n, probs, "domain", np.random.default_rng(seed))
        # the reference draws the n arms first, then the n positions (one uniform per slot)
        rng = np.random.default_rng(seed)
        order, offsets = pool.members("domain")
        sizes = np.diff(offsets)
        arm = rng.choice(len(sizes), size=n, p=arm_distribution(sizes, probs))
        pos = [order[offsets[a] + int(u * sizes[a])] for a, u in zip(arm, rng.random(n))]
        assert got.tolist() == [int(x) for x in pos]


def test_uniform_within_arm_with_an_empty_cluster_equals_reference():
    # cluster codes 0..3 with cluster 2 empty in the pool's own coding is impossible (codes are
    # dense), so an empty arm comes from a mixture over clusters whose probs skip none: use
    # arm_distribution directly on sizes with a zero and compare _choice with Generator.choice
    sizes = np.array([4, 0, 2])
    p = arm_distribution(sizes, [0.5, 0.3, 0.2])
    assert p.tolist() == [0.5 / 0.7, 0.0, 0.2 / 0.7]
    for seed in range(5):
        u = np.random.default_rng(seed).random(50)
        ref = np.random.default_rng(seed).choice(3, size=50, p=p)
        assert _choice(np.random.default_rng(seed), p, 50).tolist() == ref.tolist()
        assert _choice(np.random.default_rng(99), p, 50, u).tolist() == ref.tolist()


def test_pool_arm_sizes_are_diff_of_offsets():
    pool = Pool(["x", "y", "y", "z", "z", "z"], clusters=[0, 0, 1, 1, 2, 2])
    for arms in ("domain", "cluster"):
        sizes, full = pool.arm_sizes(arms)
        assert sizes.tolist() == np.diff(pool.members(arms)[1]).tolist()
        assert full is True
        assert pool.arm_sizes_float(arms).tolist() == [float(s) for s in sizes]
        assert not sizes.flags.writeable
    assert pool.arm_sizes("domain")[0].tolist() == [1, 2, 3]


@pytest.mark.parametrize("ids,message", [
    (np.array([0, -1, 2], dtype=np.int64), "negative values (first: np.int64(-1))"),
    (np.array([0, -7], dtype=np.int32), "negative values (first: np.int32(-7))"),
    (np.array([0, 2**63], dtype=np.uint64), "beyond the int64 range"),
    (np.array([0.0, 1.5]), "non-integer"),
])
def test_feedback_ids_still_refused(ids, message):
    with pytest.raises(InputError, match=re.escape(message)):
        Feedback(ids, np.ones((ids.shape[0], 2)), step=0)


def test_feedback_int_ids_copied_and_cast():
    src = np.array([3, 1, 2], dtype=np.int32)
    fb = Feedback(src, np.ones((3, 2)), step=0)
    src[0] = -5
    assert fb.prompt_ids.dtype == np.int64 and fb.prompt_ids.tolist() == [3, 1, 2]
    assert not fb.prompt_ids.flags.writeable


def test_counters_count_like_a_plain_tally():
    # the item writes of the counters against a tally kept here by hand
    pool = Pool(["a"] * 30 + ["b"] * 10)
    s = Scheduler(pool, "uniform", seed=1)
    rollouts = groups = informative = 0
    rng = np.random.default_rng(0)
    for t in range(6):
        ids = s.propose(8)
        r = (rng.random((8, 4)) < 0.5).astype(float)
        s.observe(Feedback(ids, r, step=t))
        rollouts += r.size
        groups += 8
        k = r.sum(axis=1)
        informative += int(((k > 0) & (k < 4)).sum())
        last = ((k > 0) & (k < 4)).sum() / 8
    c = s.counters
    assert (int(c.proposals), int(c.observations), int(c.rollouts), int(c.groups), int(c.informative)) == \
        (6, 6, rollouts, groups, informative)
    assert float(c.last_informative) == last
    assert c.proposals.dtype == np.int64 and c.proposals.shape == ()


def test_bad_feedback_leaves_the_step_state_unchanged():
    pool = Pool(["a"] * 30 + ["b"] * 10)
    s = Scheduler(pool, "dump", seed=1)
    ids = s.propose(8)
    s.observe(Feedback(ids, np.ones((8, 4)), step=0))
    before = {k: v.copy() for k, v in s.state_dict().items()}
    with pytest.raises(InputError, match="ids ≥ pool size"):
        s.observe(Feedback(np.array([0, 40]), np.ones((2, 4)), step=1))
    after = s.state_dict()
    assert before.keys() == after.keys()
    for k in before:
        assert np.array_equal(before[k], after[k]), k


def _window_contents(win):
    k, w = win.values.shape
    return [[float(win.values[a, (int(win.cursor[a]) - int(win.filled[a]) + j) % w])
             for j in range(int(win.filled[a]))] for a in range(k)]


@pytest.mark.parametrize("steps", [1, 5, 16, 17, 37])
def test_queued_domain_window_equals_a_push_per_step(steps):
    # observe queues each step's (domains, success) and writes up to WINDOW_QUEUE steps at once;
    # every read sees what a per-rollout loop of appends and truncations keeps, ragged steps too
    pool = Pool(["a"] * 7 + ["b"] * 5 + ["c"] * 3)
    s = Scheduler(pool, "uniform", seed=2, metrics_window=6)
    bufs = [[] for _ in range(3)]
    rng = np.random.default_rng(steps)
    for t in range(steps):
        ids = s.propose(6)
        r = (rng.random((6, 4)) < 0.5).astype(float)
        sizes = None if t % 3 else np.array([4, 1, 0, 3, 4, 2])     # every third step ragged
        s.observe(Feedback(ids, r, step=t, group_sizes=sizes))
        order = range(6) if sizes is None else \
            [i for n in sorted(set(sizes.tolist()) - {0}) for i in range(6) if sizes[i] == n]
        for i in order:                                   # ragged parts arrive by group size
            n = 4 if sizes is None else int(sizes[i])
            for v in r[i, :n]:
                d = int(pool.domains[ids[i]])
                bufs[d] = (bufs[d] + [float(v >= 0.5)])[-6:]
        if t in (0, 3, steps - 1):                        # reads in the middle of a queue
            assert _window_contents(s.domain_window) == bufs
            rates = s.metrics()
            for d, name in enumerate(pool.domain_names):
                if bufs[d]:
                    assert rates[f"domain_success/{name}"] == pytest.approx(np.mean(bufs[d]), abs=1e-15)


def test_load_state_dict_drops_the_queued_window_pushes():
    pool = Pool(["a"] * 7 + ["b"] * 5)
    s = Scheduler(pool, "uniform", seed=2)
    saved = s.state_dict()                                 # empty window
    ids = s.propose(4)
    s.observe(Feedback(ids, np.ones((4, 3)), step=0))     # queued, not yet written
    s.load_state_dict(saved)
    assert s.domain_window.filled.tolist() == [0, 0]
    for k, v in saved.items():
        assert np.array_equal(v, s.state_dict()[k]), k


def test_epiplexity_unfitted_fast_path_equals_the_full_formula():
    # with no domain fitted, epiplexity_values returns zeros and the mixture is uniform plus
    # floor: the same numbers the full formula gives (written out here)
    from rlpace.policies import epiplexity
    from rlpace.policies._base import softmax
    from rlpace.policies._epiplexity import epiplexity_values
    pool = Pool(["a", "b", "c"])
    pol = epiplexity(floor=0.05)
    st = pol.init(pool)
    st.n_points[:] = [2, 0, 1]                       # points seen, but none fitted yet
    st.last_tokens[:] = [10.0, 0.0, 5.0]
    v = epiplexity_values(st, 0.1)
    assert v.tolist() == [0.0, 0.0, 0.0]
    ref = softmax(np.zeros(3), 0.2)
    ref = (1.0 - 3 * 0.05) * ref + 0.05
    assert pol.apply(st, pool).tobytes() == ref.tobytes()
    # one fitted domain takes the full path: unfitted domains get the best fitted value
    st.fitted[0], st.A[0], st.alpha[0] = True, 100.0, 1.0
    v = epiplexity_values(st, 0.1)
    delta = 0.1 * np.mean([10.0, 5.0])
    expected = 100.0 * 10.0 ** -1.0 * -np.expm1(-1.0 * np.log1p(delta / 10.0))
    assert v.tolist() == pytest.approx([expected] * 3, rel=1e-15)


@pytest.mark.parametrize("steps", [1, 15, 16, 17, 40])
def test_prompts_seen_counted_from_the_queue_equals_the_history(steps):
    # the queued steps' first visits are counted when the queue is written; every read of
    # prompts_seen equals the number of prompts with attempts > 0, with repeated ids in a
    # batch and across queued steps, ragged steps (group sizes 0..G) and a load in between
    pool = Pool(["a"] * 9 + ["b"] * 6)                  # 15 prompts: repeats are common
    s = Scheduler(pool, "uniform", seed=4)
    rng = np.random.default_rng(steps)
    for t in range(steps):
        ids = s.propose(6)
        sizes = None if t % 4 else rng.integers(0, 4, size=6)
        s.observe(Feedback(ids, rng.random((6, 3)), step=t, group_sizes=sizes))
        if t % 7 == 3:
            assert s.metrics()["prompts_seen"] == np.count_nonzero(s.history.attempts)
        if t == 9:
            s.load_state_dict(s.state_dict())
    assert s.metrics()["prompts_seen"] == np.count_nonzero(s.history.attempts)
    fresh = Scheduler(pool, "uniform", seed=4)
    fresh.load_state_dict(s.state_dict())
    assert fresh.metrics()["prompts_seen"] == s.metrics()["prompts_seen"]


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
    lean, wins_l, inf_l = _batch_and_counts(fb, pool, 0.5, fields=frozenset())
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


def test_observe_builds_only_the_fields_its_places_read():
    pool = Pool(np.arange(60) % 3, clusters=np.arange(60) % 6)
    fields = {name: Scheduler(pool, name)._places().batch_fields
              for name in ("uniform", "fixed_mixture", "epiplexity", "dump", "sec", "exp3", "dvc", "ttrl",
                           "topk")}
    mean, none = frozenset({"mean_abs_advantage"}), frozenset()
    assert fields == {"uniform": none, "fixed_mixture": none, "epiplexity": none,
                      "dump": frozenset({"abs_advantages"}), "sec": mean, "exp3": mean, "dvc": mean,
                      "ttrl": None, "topk": none}      # ttrl: a target place reads the whole batch
    assert Scheduler(pool, "sec", arms="cluster")._places().batch_fields == mean | {"clusters"}
    assert Scheduler(pool, "dump", arms="cluster")._places().batch_fields == frozenset({"abs_advantages",
                                                                                          "clusters"})
    # step: the full batch (admission and weights read it) with the shortcuts the updates declared
    steps = {name: Scheduler(pool, name)._places().step_fields for name in ("uniform", "sec", "dump", "ttrl")}
    full = frozenset({"clusters", "advantages"})
    assert steps == {"uniform": full, "sec": full | mean, "dump": full | {"abs_advantages"}, "ttrl": None}
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
    assert s._places().batch_fields is None
    assert np.allclose(seen[0], [[1.0, -1.0], [0.0, 0.0]], atol=1e-5)


@pytest.mark.parametrize("g", [1, 2, 4, 8, 16])
def test_binary_mean_abs_table_equals_a_row_by_row_loop(g):
    """Entry p of the table is the mean |A| of the binary group whose rollout j succeeded iff
    bit j of p is set: each of the 2^G rows checked against the plain formula on that row
    alone (GRPO advantages, |A| capped at 1e100, row sum / G), bit for bit."""
    from rlpace.types import _binary_mean_abs_table, group_advantages
    table = _binary_mean_abs_table(g)
    assert table.shape == (1 << g,) and not table.flags.writeable
    want = np.empty(1 << g)
    for p in range(1 << g):
        row = np.array([[(p >> j) & 1 for j in range(g)]], dtype=np.float64)
        want[p] = np.minimum(np.abs(group_advantages(row)), 1e100).sum(axis=1)[0] / g
    assert table.tobytes() == want.tobytes()
    assert _binary_mean_abs_table(3) is None and _binary_mean_abs_table(32) is None   # not tabulated


@pytest.mark.parametrize("rewards", ["binary16", "binary8", "binary12", "binary32", "graded", "given_advantages",
                                     "empty"])
def test_batch_mean_abs_advantage_equals_the_plain_formula(rewards):
    """`Batch.mean_abs_advantage` (a table for binary G ≤ 16, else the formula),
    `Batch.abs_advantages` (gathered from the capped |A| table for binary G a power of two)
    and the batches built with only the fields asked for: the same wins, flags, group means
    and |A| as the plain loops over rows and values, bit for bit."""
    from rlpace.types import (BATCH_DERIVED, _batch_and_counts, group_advantages, group_mean_abs_advantage,
                              rollout_abs_advantages)
    pool = Pool(np.arange(300) % 4, clusters=np.arange(300) % 9)
    rng = np.random.default_rng(11)
    b = 0 if rewards == "empty" else 200
    g = {"binary8": 8, "binary12": 12, "binary32": 32}.get(rewards, 16)
    r = (rng.random((b, g)) < rng.random((b, 1))).astype(float)
    r[:3] = 1.0
    kw = {}
    if rewards == "graded":
        r = r * rng.random((b, g))
    if rewards == "given_advantages":
        kw["advantages"] = rng.normal(size=(b, g)) * 10.0 ** rng.integers(-5, 120, size=(b, 1))
    fb = Feedback(rng.integers(0, 300, size=b), r, step=2, **kw)
    plain, _, _ = _batch_and_counts(fb, pool, 0.5)          # the default: clusters and advantages only
    assert plain.mean_abs_advantage is None and plain.abs_advantages is None
    full, wins, inf = _batch_and_counts(fb, pool, 0.5, fields=BATCH_DERIVED)
    assert plain.advantages.tobytes() == full.advantages.tobytes()
    mean_only, wins_m, inf_m = _batch_and_counts(fb, pool, 0.5, fields=frozenset({"mean_abs_advantage"}))
    adv = fb.advantages if fb.advantages is not None else group_advantages(fb.rewards)
    want = np.array([np.minimum(np.abs(row), 1e100).sum() / g for row in adv.reshape(b, g)])
    for batch in (full, mean_only):
        assert batch.mean_abs_advantage.tobytes() == want.tobytes()
        assert group_mean_abs_advantage(batch).tobytes() == want.tobytes()
    assert group_mean_abs_advantage(full._replace(mean_abs_advantage=None)).tobytes() == want.tobytes()
    assert wins_m.tolist() == wins.tolist() == [int(row.sum()) for row in (r >= 0.5)]
    assert inf_m.tolist() == inf.tolist()
    abs_only, wins_a, inf_a = _batch_and_counts(fb, pool, 0.5, fields=frozenset({"abs_advantages"}))
    want_abs = np.array([[min(abs(float(a)), 1e100) for a in row] for row in adv.reshape(b, g)]).reshape(b, g)
    for batch in (full, abs_only):
        assert batch.abs_advantages.tobytes() == want_abs.tobytes()
        assert rollout_abs_advantages(batch).tobytes() == want_abs.tobytes()
    assert rollout_abs_advantages(full._replace(abs_advantages=None)).tobytes() == want_abs.tobytes()
    assert wins_a.tolist() == wins.tolist() and inf_a.tolist() == inf.tolist()
    assert abs_only.mean_abs_advantage is None and abs_only.clusters is None
    if rewards in ("binary16", "binary8", "binary32"):   # |A| from the table: no signed advantages
        assert abs_only.advantages is None
    assert mean_only.clusters is None and full.clusters.tolist() == (fb.prompt_ids % 9).tolist()
    assert full.advantages.tobytes() == adv.tobytes()
    if rewards in ("binary16", "binary8", "empty"):      # tabulated: no [B, G] advantages built
        assert mean_only.advantages is None or b == 0
    else:
        assert mean_only.advantages.tobytes() == adv.tobytes()


def _leaves(state):
    if isinstance(state, tuple):
        return [x for s in state for x in _leaves(s)]
    return [np.asarray(state)]


@pytest.mark.parametrize("name", ["dump", "sec", "exp3", "dvc"])
@pytest.mark.parametrize("rewards", ["binary16", "binary8", "binary12", "graded", "given_advantages"])
@pytest.mark.parametrize("arms", ["domain", "cluster"])
@pytest.mark.parametrize("call", ["observe", "step"])
def test_observe_of_a_domain_mixture_equals_its_update_on_the_plain_batch(name, rewards, arms, call):
    """`observe` builds only the fields the mixture declares (`batch_reads`), `step` the full
    batch with them; the state after each step equals a loop that calls the same policy's
    update on the full batch with the group means and |A| left to the plain formulas, bit
    for bit."""
    from rlpace.policies import make_method
    from rlpace.types import Batch
    pool = Pool(np.arange(400) % 5, clusters=np.arange(400) % 13)
    rng = np.random.default_rng(3)
    rate = rng.random(400)
    g = {"binary8": 8, "binary12": 12}.get(rewards, 16)
    s = Scheduler(pool, name, seed=4, arms=arms)
    ref = make_method(name, arms=arms).mixture
    state = ref.init(pool)
    for t in range(12):
        ids = s.propose(48)
        u = rng.random((48, g))
        r = (u < rate[ids][:, None]).astype(float)
        kw = {}
        if rewards == "graded":
            r = r * u
        if rewards == "given_advantages":
            kw["advantages"] = u - 0.5
        fb = Feedback(ids, r, step=t, **kw)
        getattr(s, call)(fb)
        plain = Batch.from_feedback(fb, pool, 0.5)
        assert plain.mean_abs_advantage is None and plain.abs_advantages is None
        state = ref.update(state, pool, plain)
        got, want = _leaves(s.states["mixture"]), _leaves(state)
        assert [a.tobytes() for a in got] == [a.tobytes() for a in want], t


def test_a_user_policy_declaring_batch_reads_gets_only_those_fields():
    from rlpace.policies import DataPolicy
    from rlpace.policies._base import MIXTURE
    seen = []

    def update(state, pool, batch):
        seen.append(batch)
        return state
    user = DataPolicy(MIXTURE, lambda pool: np.zeros(1), update, lambda st, pool, *_: np.ones(2) / 2,
                      name="reads_means", batch_reads=frozenset({"mean_abs_advantage"}))
    s = Scheduler(Pool([0, 0, 1, 1], clusters=[0, 1, 2, 3]), user)
    s.observe(Feedback([0, 2], [[1.0, 0.0], [1.0, 1.0]], step=0))
    batch = seen[0]
    assert batch.advantages is None and batch.clusters is None
    # group 0: mean 0.5, std 0.5, A = ±0.5 / (0.5 + 1e-6) = mean |A|; group 1: all equal, 0
    assert batch.mean_abs_advantage.tolist() == [0.5 / (0.5 + 1e-6), 0.0]
    assert batch.domains.tolist() == [0, 1] and batch.pass_rate.tolist() == [0.5, 1.0]


@pytest.mark.parametrize("width,g", [(300, 16), (7, 3), (5, 1), (16, 20), (4, 4)])
def test_window_push_that_replaces_every_arm_equals_the_loop(width, g):
    """A push giving every arm at least W values (DUMP's window at B·G ≫ K·W) writes the ring
    with one gather and no mask: the same windows, cursors and fills as the per-item loop
    `buf[a].append(v); buf[a] = buf[a][-W:]`, after partial pushes that left old values and
    cursors anywhere in the ring."""
    from rlpace.stats._window import window_init, window_push
    rng = np.random.default_rng(width + g)
    k = 5
    win = window_init(k, width)
    buf = [[] for _ in range(k)]
    pushed = [0] * k
    for b in (3, 200, 1, 300, 2, 257):
        arms = rng.integers(0, k, size=b)
        if b >= 200:                                   # every arm gets ≥ W values: the whole ring is new
            arms[:k * (-(-width // g))] = np.repeat(np.arange(k), -(-width // g))
            rng.shuffle(arms)
        values = rng.standard_normal((b, g))
        window_push(win, arms, values if g > 1 else values.reshape(-1))
        for a, row in zip(arms, values):
            for v in row:
                buf[a].append(float(v))
                buf[a] = buf[a][-width:]
                pushed[a] += 1
        for a in range(k):                             # the ring read oldest → newest from the cursor
            f, c = int(win.filled[a]), int(win.cursor[a])
            ring = [float(win.values[a, (c - f + i) % width]) for i in range(f)]
            assert ring == buf[a], (b, a)
            assert (c, f) == (pushed[a] % width, min(pushed[a], width)), (b, a)


@pytest.mark.parametrize("width,g", [(300, 16), (7, 3), (5, 1), (16, 20), (4, 4), (9, 2)])
def test_slot_push_of_skewed_and_full_pushes_equals_a_plain_loop(width, g, monkeypatch):
    """`_push_slots` (the arms' last rows gathered with `take` along the rows, the ring written
    by a wrap-mode `take` when every arm gets ≥ W values, by a masked copy otherwise) is the
    path `window_push` takes for a push of ≥ K·W values, and leaves the windows, cursors and
    fills of the per-item loop: every arm given ≥ W values, or a skewed push (absent arms,
    arms with a row or two, one arm with most: DUMP's mixture at T = 0.1), from cursors left
    anywhere in the ring by smaller pushes, the rows given by the caller or counted inside."""
    import rlpace.stats._window as wmod
    taken = []
    real = wmod._push_slots
    monkeypatch.setattr(wmod, "_push_slots", lambda *a: taken.append(1) or real(*a))
    rng = np.random.default_rng(7 * width + g)
    k = 4
    need = -(-width // g)                              # rows per arm for W values
    win = wmod.window_init(k, width)
    buf, pushed = [[] for _ in range(k)], [0] * k
    for i, (b, kind) in enumerate([(2, "any"), (k * need, "full"), (1, "any"), (k * need + 3, "skew"),
                                   (3, "any"), (k * need + 5, "full"), (1, "any"), (k * need + 30, "skew"),
                                   (k * need + 1, "skew"), (k * need + 30, "full")]):
        if kind == "skew":                             # arm 0 absent, arm 1 one row, arm 2 two, arm 3 the rest
            arms = np.array([1] + [2] * 2 + [3] * (b - 3))
            rng.shuffle(arms)
        else:
            arms = rng.integers(0, k, size=b)
        if kind == "full":
            arms[:k * need] = np.repeat(np.arange(k), need)
            rng.shuffle(arms)
        values = rng.standard_normal((b, g))
        before = len(taken)
        wmod.window_push(win, arms, values if g > 1 else values.reshape(-1),
                         rows=np.bincount(arms, minlength=k) if i % 2 else None)
        assert len(taken) - before == (1 if b * g >= k * width else 0), (b, kind)
        for a, row in zip(arms.tolist(), values.tolist()):
            for v in row:
                buf[a] = (buf[a] + [v])[-width:]
                pushed[a] += 1
        for a in range(k):
            f, c = int(win.filled[a]), int(win.cursor[a])
            assert (c, f) == (pushed[a] % width, min(pushed[a], width)), (b, a)
            assert [float(win.values[a, (c - f + j) % width]) for j in range(f)] == buf[a], (b, a)
    assert len(taken) == 6


def test_batch_reads_names_only_fields_built_on_request():
    from rlpace.errors import InputError
    from rlpace.policies import DataPolicy
    from rlpace.policies._base import MIXTURE

    def make(reads):
        return DataPolicy(MIXTURE, lambda pool: np.zeros(1), lambda st, pool, b: st,
                          lambda st, pool, *_: np.ones(2) / 2, name="mine", batch_reads=reads)
    for bad in (frozenset({"advantage"}), frozenset({"rewards"}), ["advantages"]):
        with pytest.raises(InputError, match="batch_reads") as e:
            make(bad)
        assert "mine" in str(e.value)
    assert make(frozenset({"abs_advantages", "clusters"})).batch_reads == {"abs_advantages", "clusters"}
    assert make(None).batch_reads is None


def test_pcg64_states_are_numpys_for_every_entropy_layout():
    """The block hash against numpy's own SeedSequence and PCG64, for entropies of 3 to 6 words
    (seeds and steps of one and two words; more words than SeedSequence's pool of 4)."""
    from rlpace._seeding import pcg64_states, seed_sequence_words
    for seed in SEEDS:
        for steps in ([0, 1, 2, 255, 256], [2**32 - 2, 2**32 - 1], [2**32, 2**32 + 7], [2**62 - 1]):
            rows = [_uint32_words(seed) + _uint32_words(t) + _uint32_words(_STREAM_PROPOSE) for t in steps]
            entropy = np.array(rows, dtype=np.uint32)
            want_words = np.array([np.random.SeedSequence(r).generate_state(8) for r in rows])
            assert seed_sequence_words(entropy).tolist() == want_words.tolist(), (seed, steps)
            for row, (state, inc) in zip(rows, pcg64_states(entropy)):
                want = np.random.PCG64(np.random.SeedSequence(row)).state["state"]
                assert (state, inc) == (want["state"], want["inc"]), (seed, row)


@pytest.mark.parametrize("start", [0, 250, 2**32 - 3])
def test_proposals_across_hash_blocks_follow_the_documented_generator(start):
    """Proposal t of a Scheduler whose step counter crosses a block of hashed states (256
    steps) and the 2**32 boundary, where the step takes a second entropy word: each is what
    `default_rng([seed, t, stream])` draws; a seed changed by a restore is picked up."""
    pool = Pool(np.arange(50) % 3)
    s = Scheduler(pool, "uniform", seed=2**33 + 5)
    s.counters.proposals[()] = start
    for t in range(start, start + 10):
        want = np.random.default_rng([2**33 + 5, t, _STREAM_PROPOSE]).integers(0, 50, size=9, dtype=np.int64)
        assert s.propose(9).tolist() == want.tolist(), t
    other = Scheduler(pool, "uniform", seed=4)
    other.propose(3)
    s.load_state_dict(other.state_dict())
    want = np.random.default_rng([4, 1, _STREAM_PROPOSE]).integers(0, 50, size=9, dtype=np.int64)
    assert s.propose(9).tolist() == want.tolist()


@pytest.mark.parametrize("counting", ["cumulative", "windowed"])
def test_dump_scores_in_python_floats_equal_the_array_formula(counting):
    """DUMP's apply (base="arms") against its rule written with numpy arrays, bit for bit:
    windows of every fill (empty arms included), counts up to 10**12, |A| up to 1e100."""
    from rlpace.policies._dump import DumpState
    from rlpace.stats._window import Window, window_mean
    rng = np.random.default_rng(11)
    for trial in range(300):
        k, w = int(rng.integers(1, 70)), int(rng.integers(1, 40))
        c, temp = float(rng.choice([0.0, 1.0, rng.random() * 3])), float(rng.choice([0.1, 1.0, rng.random() + 0.01]))
        policy = make_policy("dump", c=c, temperature=temp, window=w, counting=counting)
        filled = rng.integers(0, w + 1, size=k)
        values = rng.random((k, w)) * 10.0 ** rng.integers(-3, 101, size=(k, 1))
        values[np.arange(w)[None, :] >= filled[:, None]] = 0.0
        count = np.maximum(filled, rng.integers(0, 10 ** int(rng.integers(1, 13)), size=k))
        state = DumpState(Window(values, rng.integers(0, w, size=k), filled), count)
        n = count if counting == "cumulative" else filled
        score = window_mean(state.window) + c * np.sqrt(2.0 * np.log(max(1, int(n.sum())) + 1) / (n + 1))
        want = softmax(shifted(score), temp)
        got = policy.apply(state, Pool(np.arange(k)))
        assert got.dtype == np.float64 and got.tobytes() == want.tobytes(), trial


def test_softmax_of_floats_equals_shifted_softmax():
    from rlpace.policies._base import softmax_of_floats
    for scores, temp in _score_cases():
        want = shifted_softmax(np.asarray(scores, dtype=np.float64), temp)
        got = softmax_of_floats(np.asarray(scores, dtype=np.float64).tolist(), temp)
        assert got.dtype == np.float64 and np.array_equal(got, want, equal_nan=True), (scores, temp)
        assert got.tobytes() == want.tobytes() or np.isnan(want).any()


def _mixture_batch(rng, k):
    """A Batch of b groups over k arms (some arms absent) with group mean |A| up to 1e100."""
    b = int(rng.integers(1, 40))
    arm = rng.integers(0, k, size=b)
    mean_abs = rng.random(b) * 10.0 ** rng.integers(-5, 101, size=b)
    return Batch(np.arange(b), None, None, None, None, arm, arm, 0, mean_abs_advantage=mean_abs)


def test_sec_and_exp3_updates_in_floats_equal_their_array_rules():
    """SEC's and EXP3's update (and SEC's softmax) against their rules written with numpy arrays
    (`arm_mean_abs_advantage`), bit for bit, over random states and batches: absent arms, |A| up
    to 1e100, a tiny scale, and EXP3 states whose π is 0 for a present arm (restored by hand)."""
    from rlpace.policies._exp3 import Exp3State
    from rlpace.policies._sec import SecState
    rng = np.random.default_rng(21)
    for trial in range(300):
        k = int(rng.integers(1, 70))
        pool = Pool(np.arange(k))
        batch = _mixture_batch(rng, k)
        r, present = arm_mean_abs_advantage(pool, batch, "domain", k)
        alpha, temp = float(rng.random() * 0.99 + 0.01), float(rng.random() + 0.05)
        sec = make_policy("sec", alpha=alpha, temperature=temp)
        q = rng.random(k) * 10.0 ** float(rng.integers(-3, 3))
        want_q = q.copy()
        np.copyto(want_q, alpha * r + (1.0 - alpha) * want_q, where=present)
        got = sec.update(SecState(q.copy()), pool, batch)
        assert got.q.tobytes() == want_q.tobytes(), trial
        assert sec.apply(got, pool).tobytes() == shifted_softmax(want_q, temp).tobytes()

        scale = float(rng.choice([10.0, 1e-300, rng.random() + 0.1]))
        exp3 = make_policy("exp3", scale=scale)
        prob = rng.dirichlet(np.ones(k))
        if trial % 5 == 0:
            prob[int(rng.integers(0, k))] = 0.0          # π_i = 0, present or not
        state = Exp3State(rng.random(k) * 10.0 ** float(rng.integers(-3, 300)), prob,
                          np.array(float(rng.random()) / k), np.array(int(rng.integers(0, 10**6)), np.int64))
        ref = Exp3State(*(np.array(x, copy=True) for x in state))
        with np.errstate(all="ignore"):
            gain = r / scale
            np.divide(gain, ref.prob, out=gain, where=present)
            np.add(ref.reward, gain, out=ref.reward, where=present)
            np.minimum(ref.reward, 1e300, out=ref.reward)
            t = int(ref.t) + 1
            eps_prev, eps = float(ref.eps), min(1.0 / k, float(np.sqrt(np.log(k) / (k * t))))
            w = shifted_softmax(ref.reward * eps_prev, 1.0) * (1.0 - k * eps) + eps
            want_prob = w / w.sum()
            got = exp3.update(state, pool, batch)
        assert got.reward.tobytes() == ref.reward.tobytes(), trial
        assert np.array_equal(got.prob, want_prob, equal_nan=True), trial
        assert int(got.t) == t and float(got.eps) == eps
