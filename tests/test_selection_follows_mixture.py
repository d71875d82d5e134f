"""Selections composed with a mixture honour it: the mixture decides how many prompts each
arm gets (n_k ~ Multinomial(n, probs)), the selection which prompts of the arm; and
`compose` refuses a selection that would silently ignore the mixture
(`DataPolicy.follows_mixture`). Without a mixture, the selections are bit for bit as before.
"""

import pickle

import numpy as np
import pytest

from rlpace import Feedback, Pool, Scheduler
from rlpace.policies import (SELECTION, DataPolicy, compose, fixed_mixture, learnability_buffer,
                             make_method, make_policy, mopps, names, oracle_boundary,
                             prioritized_learnability)
from rlpace.policies._learnability import LearnabilityBufferState
from rlpace.policies._mopps import MoppsState
from rlpace.policies._uniform import split_by_arm
from rlpace.stats._sumtree import sumtree_set

FOLLOWERS = ("mopps", "learnability_buffer", "prioritized_learnability")
# Arm a = prompts 0..5, arm b = prompts 6..9.
AB = Pool(["a"] * 6 + ["b"] * 4)


def _feedback(ids, step, hidden):
    rng = np.random.default_rng([7, step])
    return Feedback(ids, (rng.random((ids.size, 4)) < hidden[ids][:, None]).astype(float), step=step)


# ---- 1. the algebra refuses the silent case ------------------------------------------------
def _ignoring_selection(**kw):
    def apply(state, pool, n, probs, arms, rng):
        return np.zeros(n, dtype=np.int64)
    return DataPolicy(SELECTION, lambda pool: (), lambda s, p, b: s, apply, name="mine", **kw)


def test_compose_refuses_a_selection_that_ignores_the_mixture():
    with pytest.raises(ValueError, match=r"selection 'mine' does not follow a mixture.*"
                                         r"mixture 'fixed_mixture'.*follows_mixture=True"):
        compose(fixed_mixture(), _ignoring_selection())
    with pytest.raises(ValueError, match="selection 'oracle_boundary' does not follow a mixture"):
        compose(make_policy("oracle_progress"), oracle_boundary())
    with pytest.raises(ValueError, match="selection 'oracle_boundary' does not follow a mixture"):
        Scheduler(AB, "oracle_progress+oracle_boundary")
    # The same selections build alone, and a user selection that declares it follows builds.
    assert compose(_ignoring_selection()).selection.name == "mine"
    assert Scheduler(AB, "oracle_boundary").method.selection.name == "oracle_boundary"
    m = compose(fixed_mixture(), _ignoring_selection(follows_mixture=True))
    assert (m.mixture.name, m.selection.name) == ("fixed_mixture", "mine")


def test_default_places_and_followers_still_compose():
    assert compose(fixed_mixture()).selection.name == "uniform_within_arm"
    # A built method (its uniform_within_arm is no placeholder) composed again.
    m = compose(make_method("dump"), make_policy("dapo_dynamic_sampling"))
    assert (m.mixture.name, m.selection.name, m.admission.name) == (
        "dump", "uniform_within_arm", "dapo_dynamic_sampling")
    assert make_method("dump+uniform").selection.name == "uniform_within_arm"
    assert make_method("ads").selection.name == "ads_boundary_window"
    for sel in FOLLOWERS:
        m = make_method(f"dump+{sel}+dapo_dynamic_sampling")
        assert (m.mixture.name, m.selection.name) == ("dump", sel)
        assert m.selection.follows_mixture


def test_every_registered_name_builds():
    for name in names():
        assert make_method(name).selection.kind == SELECTION, name


# ---- 2. the split over arms ----------------------------------------------------------------
class _PoolWithEmptyArm:
    """Arms a = {0, 1}, b = {} , c = {2, 3, 4} (a Pool factorizes labels, so it never has an
    empty arm; a subclass or a future filtered pool might)."""

    def members(self, arms):
        return np.arange(5), np.array([0, 2, 2, 5])


def test_split_by_arm_hand_computed():
    pool = _PoolWithEmptyArm()
    # All mass on one arm: every slot there, whatever the generator.
    c, order, offsets = split_by_arm(pool, 7, [0.0, 0.0, 1.0], "domain", np.random.default_rng(3), "t")
    assert c.tolist() == [0, 0, 7] and offsets.tolist() == [0, 2, 2, 5]
    # The empty arm's mass is dropped and the rest renormalised: [0.5, 0.2] / 0.7.
    c, _, _ = split_by_arm(pool, 50, [0.5, 0.3, 0.2], "domain", np.random.default_rng(3), "t")
    ref = np.random.default_rng(3).multinomial(50, [5 / 7, 2 / 7])
    assert c.tolist() == [ref[0], 0, ref[1]]
    # No mass on a non-empty arm: arms in proportion to their size, 2 : 3.
    c, _, _ = split_by_arm(pool, 50, [0.0, 1.0, 0.0], "domain", np.random.default_rng(3), "t")
    ref = np.random.default_rng(3).multinomial(50, [0.4, 0.6])
    assert c.tolist() == [ref[0], 0, ref[1]]
    for bad in ([0.5, np.nan, 0.5], [0.5, 0.5], [1.0, -0.1, 0.1]):
        with pytest.raises(ValueError, match="mopps: the mixture's probs must be 3 finite"):
            split_by_arm(pool, 4, bad, "domain", np.random.default_rng(0), "mopps")


@pytest.mark.parametrize("name", FOLLOWERS)
def test_per_arm_counts_are_the_multinomial_of_the_generator(name):
    p = make_policy(name)
    state = p.init(AB)
    probs = np.array([0.3, 0.7])
    for seed in range(5):
        ids = p.apply(state, AB, 9, probs, "domain", np.random.default_rng(seed))
        got = np.bincount(AB.domains[ids], minlength=2)
        ref = np.random.default_rng(seed).multinomial(9, probs)     # first draw of the generator
        if name == "learnability_buffer":                             # empty buffer: all uniform
            r = np.random.default_rng(seed)
            ref = r.multinomial(9, probs) + r.multinomial(0, probs)
        assert got.tolist() == ref.tolist()
        assert (AB.domains[ids] == np.sort(AB.domains[ids])).all()    # arm by arm (a first)


@pytest.mark.parametrize("name", FOLLOWERS)
@pytest.mark.parametrize("arms, weights", [("domain", [0.6, 0.3, 0.1]),
                                           ("cluster", [0.05, 0.25, 0.4, 0.3])])
def test_arm_shares_match_the_mixture(name, arms, weights):
    pool = Pool(np.repeat(["x", "y", "z"], [30, 50, 20]), clusters=np.arange(100) % 4)
    hidden = np.linspace(0.05, 0.95, 100)
    s = Scheduler(pool, compose(fixed_mixture(weights, arms=arms), make_policy(name)), seed=2)
    codes = pool.arm_codes(arms)
    counts = np.zeros(len(weights))
    for step in range(300):
        ids = s.propose(10)
        counts += np.bincount(codes[ids], minlength=len(weights))
        s.observe(_feedback(ids, step, hidden))
    w = np.asarray(weights)
    sd = np.sqrt(w * (1 - w) / counts.sum())                          # 3000 slots
    assert (np.abs(counts / counts.sum() - w) < 5 * sd).all(), counts


def test_without_the_fix_the_mixture_would_be_ignored():
    # weights [1, 0]: every prompt from arm a. Before the fix MoPPS drew from the whole pool.
    for name in FOLLOWERS:
        s = Scheduler(AB, f"fixed_mixture+{name}", weights=[1.0, 0.0], seed=0)
        hidden = np.linspace(0.1, 0.9, 10)
        for step in range(20):
            ids = s.propose(5)
            assert (ids < 6).all(), (name, ids)
            s.observe(_feedback(ids, step, hidden))
    a, b = Scheduler(AB, "dump+mopps", seed=1), Scheduler(AB, "mopps", seed=1)
    assert not np.array_equal(a.propose(8), b.propose(8))


# ---- 3. inside an arm, the selection's own rule --------------------------------------------
def test_mopps_keeps_the_closest_to_target_inside_each_arm():
    # Sharp posteriors (α + β = 10⁶: Thompson draws within ±0.003 of the mean); ratio 16
    # makes every prompt of the arm a candidate. |mean − 0.5| per arm:
    # a: [.4, .05, .45, .02, .2, .25] → order 3, 1, 4, 5, 0, 2;  b: [0, .45, .47, .12] → 6, 9, 7, 8.
    mean = np.array([0.1, 0.45, 0.95, 0.52, 0.3, 0.75, 0.5, 0.05, 0.97, 0.62])
    p = mopps(ratio=16)
    state = MoppsState(mean * 1e6, (1 - mean) * 1e6)
    order_a, order_b = [3, 1, 4, 5, 0, 2], [6, 9, 7, 8]
    seen_a = set()
    for seed in range(40):
        ids = p.apply(state, AB, 4, np.array([0.5, 0.5]), "domain", np.random.default_rng(seed))
        n_a = int((ids < 6).sum())
        assert ids.tolist() == order_a[:n_a] + order_b[:4 - n_a]
        seen_a.add(n_a)
    assert len(seen_a) >= 3                                           # the split does vary
    # n_k > |arm k| (5 slots, arm b has 4 prompts): candidates with replacement, as MoPPS
    # does pool-wide when n > N, so the closest prompt fills every slot.
    ids = p.apply(state, AB, 5, np.array([0.0, 1.0]), "domain", np.random.default_rng(0))
    assert ids.tolist() == [6] * 5
    # Without a mixture: the 5 closest of the whole pool, 6 3 1 9 4 (0, .02, .05, .12, .2).
    ids = p.apply(state, AB, 5, None, None, np.random.default_rng(0))
    assert ids.tolist() == [6, 3, 1, 9, 4]


def test_learnability_buffer_draws_each_arm_from_its_own_buffered_prompts():
    # Buffer {2, 4} (arm a only), mix 0: arm a's slots come from {2, 4}; arm b has nothing
    # buffered, so its slots are uniform over 6..9.
    p = learnability_buffer(buffer_size=4, mix=0.0)
    st = p.init(AB)
    st = st._replace(buffer=np.array([4, 2, -1, -1]), buffer_len=np.array(2))
    assert isinstance(st, LearnabilityBufferState)
    ids = np.concatenate([p.apply(st, AB, 6, np.array([0.5, 0.5]), "domain", np.random.default_rng(s))
                          for s in range(2000)])
    freq = np.bincount(ids, minlength=10)
    assert freq[[0, 1, 3, 5]].sum() == 0
    a, b = freq[[2, 4]], freq[6:]
    assert abs(a[0] / a.sum() - 0.5) < 5 * np.sqrt(0.25 / a.sum())
    assert (np.abs(b / b.sum() - 0.25) < 5 * np.sqrt(0.1875 / b.sum())).all()
    # mix 0.5, n = 7: round(3.5) = 4 uniform slots and 3 buffer slots, each spread over the arms.
    p = learnability_buffer(buffer_size=4, mix=0.5)
    r = np.random.default_rng(9)
    c_uni, c_buf = r.multinomial(4, [0.5, 0.5]), r.multinomial(3, [0.5, 0.5])
    ids = p.apply(st, AB, 7, np.array([0.5, 0.5]), "domain", np.random.default_rng(9))
    assert np.bincount(AB.domains[ids], minlength=2).tolist() == (c_uni + c_buf).tolist()
    # The buffer slots come last; arm b's (nothing buffered) went to the uniform part.
    assert set(ids[ids.size - c_buf[0]:].tolist()) <= {2, 4}


def test_prioritized_learnability_draws_by_priority_inside_each_arm():
    p = prioritized_learnability(alpha=1.0)
    st = p.init(AB)
    sumtree_set(st.tree, np.arange(10), np.array([1, 0, 3, 0, 0, 4, 1, 1, 2, 0], dtype=float))
    ids = np.concatenate([p.apply(st, AB, 6, np.array([0.25, 0.75]), "domain", np.random.default_rng(s))
                          for s in range(2000)])
    freq = np.bincount(ids, minlength=10).astype(float)
    assert freq[[1, 3, 4, 9]].sum() == 0                              # priority 0: never drawn
    a, b = freq[:6], freq[6:]
    for got, want in ((a / a.sum(), [1 / 8, 0, 3 / 8, 0, 0, 4 / 8]), (b / b.sum(), [1 / 4, 1 / 4, 1 / 2, 0])):
        want = np.array(want)
        sd = np.sqrt(want * (1 - want) / 3000) + 1e-12
        assert (np.abs(got - want) <= 5 * sd).all(), (got, want)
    assert abs(a.sum() / freq.sum() - 0.25) < 5 * np.sqrt(0.1875 / 12000)
    # The reference: an arm's draw ∝ its leaves, independently of the other arm's priorities.
    sumtree_set(st.tree, np.arange(6, 10), np.array([1e6, 1e6, 2e6, 0.0]))
    ids = p.apply(st, AB, 400, np.array([1.0, 0.0]), "domain", np.random.default_rng(1))
    assert (ids < 6).all()


# ---- 4. no mixture: bit for bit as before --------------------------------------------------
# Proposals at steps 0, 1, 3 of `_golden_run`, recorded on the code before this change. MoPPS's
# were recorded again when a candidate at the uniform prior Beta(1, 1) began to take one uniform
# draw instead of two gamma draws (the same law, another stream: `_mopps._beta_draw`).
GOLDEN = {
    ("mopps", ()): [[22, 36, 6, 15, 26, 3], [24, 17, 3, 7, 4, 10, 9, 22, 12, 28],
                    [15, 37, 24, 26, 16, 36, 22]],
    ("mopps", (("decay", 0.5), ("ratio", 4))): [[29, 7, 36, 15, 6, 8],
                                                [28, 39, 19, 18, 38, 5, 0, 23, 16, 20],
                                                [19, 10, 1, 4, 22, 34, 20]],
    ("learnability_buffer", (("buffer_size", 6), ("refresh_every", 2))): [
        [24, 16, 35, 27, 37, 12], [0, 28, 38, 19, 13, 24, 24, 16, 12, 12], [31, 3, 1, 7, 16, 16, 37]],
    ("prioritized_learnability", ()): [[16, 27, 12, 0, 23, 12], [29, 19, 33, 1, 24, 7, 7, 24, 21, 39],
                                       [5, 8, 7, 26, 35, 30, 26]],
}


def _golden_run(name, **kw):
    pool = Pool(np.repeat(["a", "b", "c"], [12, 20, 8]), clusters=np.arange(40) % 5)
    hidden = np.linspace(0.05, 0.95, 40)
    s = Scheduler(pool, name, seed=3, **kw)
    seq = []
    for step, n in enumerate([6, 10, 50, 7]):          # 50 > the pool: MoPPS's with-replacement path
        ids = s.propose(n)
        seq.append(ids.tolist())
        rng = np.random.default_rng([7, step])
        s.observe(Feedback(ids, (rng.random((n, 4)) < hidden[ids][:, None]).astype(float), step=step))
    return [seq[0], seq[1], seq[3]]


@pytest.mark.parametrize("key", list(GOLDEN), ids=lambda k: k[0] + str(dict(k[1])))
def test_no_mixture_proposals_unchanged(key):
    name, kw = key
    assert _golden_run(name, **dict(kw)) == GOLDEN[key]


# ---- 5. exact resume of the composed methods -----------------------------------------------
@pytest.mark.parametrize("spec, kw", [("dump+mopps", {}), ("dump+mopps", {"arms": "cluster"}),
                                      ("sec+learnability_buffer", {"buffer_size": 8, "refresh_every": 2}),
                                      ("exp3+prioritized_learnability", {}),
                                      ("dump+mopps", {"prior_strength": 4.0, "prior_stage_steps": 2})])
def test_composed_exact_resume(spec, kw):
    pool = Pool(np.repeat(["x", "y", "z"], [30, 50, 20]), clusters=np.arange(100) % 7)
    hidden = np.linspace(0.05, 0.95, 100)

    def drive(s, start, stop):
        out = []
        for step in range(start, stop):
            ids = s.propose([8, 0, 130, 1][step % 4])                 # 130 > the pool of 100
            s.observe(_feedback(ids, step, hidden))
            out.append(ids.tolist())
        return out

    ref = Scheduler(pool, spec, seed=4, **kw)
    drive(ref, 0, 6)
    fresh = Scheduler(pool, spec, seed=99, **kw)
    fresh.load_state_dict(pickle.loads(pickle.dumps(ref.state_dict())))
    assert drive(fresh, 6, 12) == drive(ref, 6, 12)
