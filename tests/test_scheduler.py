"""The Scheduler: determinism, exact resume (pickle and npz), bad input rejected with state
unchanged, the documented behaviour for awkward feedback, and metrics on hand examples."""

import pickle

import numpy as np
import pytest

from _isolated import assert_state_equal

from rlpace import Feedback, Pool, Scheduler, policies
from rlpace.policies import fixed_mixture

POOL = Pool(["a"] * 20 + ["b"] * 20 + ["c"] * 20, clusters=np.arange(60) % 6,
            difficulty=np.linspace(0.0, 1.0, 60))
HIDDEN_P = np.linspace(0.95, 0.05, 60)   # hidden pass rate of each prompt


def world(ids, step, g=4, seed=0):
    """Deterministic binary feedback for proposed ids (the stream a trainer would produce)."""
    rng = np.random.default_rng([seed, step, 77])
    return Feedback(ids, (rng.random((len(ids), g)) < HIDDEN_P[ids][:, None]).astype(float), step=step)


def run(sched, steps, start=0, n=8):
    """Drive `steps` full trainer steps; return what a trainer would see at each."""
    out = []
    for t in range(start, start + steps):
        ids = sched.propose(n)
        fb = world(ids, t)
        sched.observe(fb)
        adm = sched.admission(fb)
        out.append((ids, adm.keep, adm.refill, sched.loss_weights(fb), sched.metrics()))
    return out




def assert_trace_equal(x, y):
    assert len(x) == len(y)
    for (i1, k1, r1, w1, m1), (i2, k2, r2, w2, m2) in zip(x, y):
        np.testing.assert_array_equal(i1, i2)
        np.testing.assert_array_equal(k1, k2)
        assert r1 == r2
        np.testing.assert_array_equal(w1, w2)
        assert m1.keys() == m2.keys()
        for key in m1:
            assert m1[key] == m2[key] or (np.isnan(m1[key]) and np.isnan(m2[key])), key


# ---- determinism and resume ----------------------------------------------------------------
@pytest.mark.parametrize("name", ["uniform", "dump", "fixed_mixture"])
def test_same_seed_same_proposals_different_seed_different(name):
    a = run(Scheduler(POOL, name, seed=3), 6)
    b = run(Scheduler(POOL, name, seed=3), 6)
    c = run(Scheduler(POOL, name, seed=4), 6)
    assert_trace_equal(a, b)
    assert any(not np.array_equal(x[0], y[0]) for x, y in zip(a, c))


def _roundtrip_pickle(sd):
    return pickle.loads(pickle.dumps(sd))


def _roundtrip_npz(sd, tmp_path):
    path = tmp_path / "sched.npz"
    np.savez(path, **sd)
    with np.load(path) as z:                 # no allow_pickle: state must be plain arrays
        return {k: z[k] for k in z.files}


@pytest.mark.parametrize("name", ["uniform", "dump", "fixed_mixture"])
@pytest.mark.parametrize("channel", ["pickle", "npz"])
def test_exact_resume_into_fresh_scheduler(name, channel, tmp_path):
    k = 5
    ref = Scheduler(POOL, name, seed=11)
    run(ref, k)
    sd = ref.state_dict()
    sd = _roundtrip_pickle(sd) if channel == "pickle" else _roundtrip_npz(sd, tmp_path)
    fresh = Scheduler(POOL, name, seed=0)      # the seed comes back from the state
    fresh.load_state_dict(sd)
    assert_state_equal(fresh.state_dict(), ref.state_dict())
    assert_trace_equal(run(fresh, 6, start=k), run(ref, 6, start=k))
    assert_state_equal(fresh.state_dict(), ref.state_dict())


def test_state_dict_is_a_copy():
    s = Scheduler(POOL, "dump")
    sd = s.state_dict()
    before = {k: np.array(v, copy=True) for k, v in sd.items()}
    run(s, 3)
    assert_state_equal(sd, before)


# ---- bad input leaves state unchanged ------------------------------------------------------
BAD = [
    (lambda: Feedback([0, 1], [[1.0, np.nan], [0.0, 1.0]], step=0), "Feedback.rewards"),
    (lambda: Feedback([0, 1], [[1.0, np.inf], [0.0, 1.0]], step=0), "Feedback.rewards"),
    (lambda: Feedback([0, 1], [[1.0, 0.0], [0.0, 1.0]], advantages=[[np.nan, 0], [0, 0]], step=0), "Feedback.advantages"),
    (lambda: Feedback([0, 1], [[1.0, 0.0], [0.0, 1.0]], advantages=[[-np.inf, 0], [0, 0]], step=0), "Feedback.advantages"),
    (lambda: Feedback([0, 1], [[1.0, 0.0], [0.0, 1.0]], advantages=[[1.0, 0.0, 0.0]], step=0), "Feedback.advantages"),
    (lambda: Feedback([0, -3], [[1.0], [0.0]], step=0), "Feedback.prompt_ids"),
    (lambda: Feedback([0, 1], [1.0, 0.0], step=0), "Feedback.rewards"),
    (lambda: Feedback([0, 1], np.zeros((2, 0)), step=0), "Feedback.rewards"),
    (lambda: Feedback([0, 60], [[1.0], [0.0]], step=0), "Feedback.prompt_ids"),     # out of range: Scheduler
    (lambda: Feedback([10**9], [[1.0, 0.0]], step=0), "Feedback.prompt_ids"),
]


@pytest.mark.parametrize("name", ["uniform", "dump"])
@pytest.mark.parametrize("make, field", BAD)
@pytest.mark.parametrize("call", ["observe", "admission", "admit", "loss_weights"])
def test_bad_feedback_raises_naming_field_and_state_unchanged(name, make, field, call):
    s = Scheduler(POOL, name, seed=1)
    run(s, 2)
    before = s.state_dict()
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        getattr(s, call)(make())
    assert_state_equal(s.state_dict(), before)


def test_non_feedback_and_bad_propose_and_bad_pool():
    s = Scheduler(POOL, "uniform")
    before = s.state_dict()
    with pytest.raises(TypeError, match="Feedback"):
        s.observe({"prompt_ids": [0], "rewards": [[1.0]]})
    for n in (-1, 1.5, True, "3"):
        with pytest.raises(ValueError, match="propose"):
            s.propose(n)
    assert_state_equal(s.state_dict(), before)
    assert s.propose(0).shape == (0,) and s.propose(0).dtype == np.int64
    with pytest.raises(TypeError, match="Pool"):
        Scheduler(["a", "b"], "uniform")
    with pytest.raises(ValueError, match="success_threshold"):
        Scheduler(POOL, "uniform", success_threshold=float("nan"))


def test_unknown_policy_lists_valid_names():
    with pytest.raises(ValueError, match="unknown policy") as e:
        Scheduler(POOL, "not_a_policy")
    for name in policies.names():
        assert name in str(e.value)
    with pytest.raises(ValueError, match="cannot import module"):
        Scheduler(POOL, "no_such_pkg.mod:factory")


def test_unknown_kwargs_list_valid_ones():
    with pytest.raises(ValueError, match="bogus") as e:
        Scheduler(POOL, "dump", bogus=1)
    assert "temperature" in str(e.value) and "window" in str(e.value)
    with pytest.raises(ValueError, match="bogus"):
        Scheduler(POOL, "uniform", bogus=1)


def test_state_from_other_pool_method_or_hyperparameters_rejected_unchanged():
    s = Scheduler(POOL, "dump", seed=2)
    run(s, 2)
    before = s.state_dict()
    other_pool = Pool(["a"] * 20 + ["b"] * 20 + ["d"] * 20)
    with pytest.raises(ValueError, match="different pool"):
        s.load_state_dict(Scheduler(other_pool, "dump").state_dict())
    with pytest.raises(ValueError, match="method"):
        s.load_state_dict(Scheduler(POOL, "uniform").state_dict())
    with pytest.raises(ValueError, match="other hyperparameters"):
        s.load_state_dict(Scheduler(POOL, "dump", window=10).state_dict())
    broken = dict(before)
    del broken["meta/version"]
    with pytest.raises(ValueError, match="meta/version"):
        s.load_state_dict(broken)
    wrong_version = dict(before, **{"meta/version": np.array(999)})
    with pytest.raises(ValueError, match="version"):
        s.load_state_dict(wrong_version)
    assert_state_equal(s.state_dict(), before)


def _without(state, part_params):
    """The state as saved before the hyperparameters `part_params` existed: their record removed."""
    import json
    h = json.loads(str(state["meta/hyperparameters"]))
    for i, name in part_params:
        del h[i][1][name]
    return dict(state, **{"meta/hyperparameters": np.array(json.dumps(h, sort_keys=True))})


def test_states_saved_before_a_hyperparameter_existed_load_with_its_old_value():
    from rlpace.scheduler import ADDED_HYPERPARAMETERS
    assert ADDED_HYPERPARAMETERS[("dump", "base")] == "arms"
    a = Scheduler(POOL, "dump", seed=2)
    run(a, 2)
    old = _without(a.state_dict(), [(0, "base")])
    b = Scheduler(POOL, "dump", seed=2)
    b.load_state_dict(old)                                     # absent = "arms", the default: loads
    assert_state_equal(b.state_dict(), a.state_dict())
    c = Scheduler(POOL, "dump", seed=2, base="pool")
    before = c.state_dict()
    with pytest.raises(ValueError, match=r"dump.base: saved 'arms', now 'pool'"):
        c.load_state_dict(old)
    assert_state_equal(c.state_dict(), before)
    # recommended's defaults changed (T 0.1 -> 0.15, base "arms" -> "pool"; prior_strength added):
    # a state of the old defaults is refused by the new ones, naming both, and loads into them
    r = Scheduler(POOL, "recommended", seed=1, temperature=0.1, base="arms")
    run(r, 2)
    old = _without(r.state_dict(), [(0, "base"), (0, "prior_strength")])
    with pytest.raises(ValueError, match=r"recommended.base: saved 'arms', now 'pool'; "
                                         r"recommended.temperature: saved 0.1, now 0.15"):
        Scheduler(POOL, "recommended", seed=1).load_state_dict(old)
    r2 = Scheduler(POOL, "recommended", seed=1, temperature=0.1, base="arms")
    r2.load_state_dict(old)
    assert np.array_equal(r2.propose(8), r.propose(8))
    # a parameter not in the table stays a mismatch when it is missing
    with pytest.raises(ValueError, match=r"dump.window: saved '<absent>', now 300"):
        Scheduler(POOL, "dump", seed=2).load_state_dict(_without(a.state_dict(), [(0, "window")]))


# ---- defined behaviour for awkward feedback ------------------------------------------------
def test_empty_batch_is_a_no_op():
    s = Scheduler(POOL, "dump")
    run(s, 2)
    before = s.state_dict()
    fb = Feedback([], np.zeros((0, 4)), step=5)
    s.observe(fb)
    assert_state_equal(s.state_dict(), before)
    assert s.admit(fb).shape == (0, 4) and s.admit(fb).dtype == bool
    assert s.loss_weights(fb).shape == (0, 4)


def test_same_prompt_twice_counts_both_groups():
    s = Scheduler(POOL, "uniform")
    s.observe(Feedback([7, 7, 3], [[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]], step=0))
    assert s.history.attempts[7] == 8 and s.history.successes[7] == 3
    assert s.history.attempts[3] == 4 and s.history.successes[3] == 4
    m = s.metrics()
    assert m["domain_success/a"] == pytest.approx(7 / 12)      # both groups of 7 and the group of 3
    assert m["groups_observed"] == 3 and m["rollouts_observed"] == 12


def test_never_proposed_and_late_feedback():
    s = Scheduler(POOL, "dump")
    s.observe(Feedback([59], [[1.0, 0.0]], step=9))            # never proposed: used as it arrives
    assert s.history.attempts[59] == 2 and s.history.last_step[59] == 9
    s.observe(Feedback([59, 58], [[1.0, 1.0], [0.0, 0.0]], step=4))   # 5 steps late
    assert s.history.attempts[59] == 4 and s.history.successes[59] == 3
    assert s.history.last_step.tolist()[58:] == [4, 9]          # latest step kept, never rewound
    assert s.history.last_step[0] == -1
    s.propose(16)                                               # proposals without feedback: nothing waits
    s.propose(16)
    assert s.history.attempts.sum() == 6


def test_group_size_one():
    s = Scheduler(POOL, "dump")
    s.observe(Feedback([0, 1, 25], [[1.0], [0.0], [1.0]], step=0))
    m = s.metrics()
    assert m["informative_fraction"] == 0.0                     # G = 1 carries no GRPO signal
    assert s.history.attempts[[0, 1, 25]].tolist() == [1, 1, 1]
    assert m["domain_success/a"] == 0.5 and m["domain_success/b"] == 1.0
    assert s.admit(Feedback([0], [[1.0]], step=0)).shape == (1, 1)


def test_non_binary_rewards_with_threshold():
    s = Scheduler(POOL, "uniform", success_threshold=3.0)      # K&K: 3 = format + answer
    s.observe(Feedback([0, 30], [[3.0, 1.0, -1.5, 3.0], [-2.0, 1.0, 1.0, 1.0]], step=0))
    assert s.history.successes[[0, 30]].tolist() == [2, 0]
    m = s.metrics()
    assert m["domain_success/a"] == 0.5 and m["domain_success/b"] == 0.0
    assert m["informative_fraction"] == 1.0                     # both groups have reward spread


# ---- metrics on hand examples --------------------------------------------------------------
def test_metrics_keys_and_values_fixed_mixture():
    pool = Pool(["a", "a", "b", "b"])
    s = Scheduler(pool, fixed_mixture([3.0, 1.0]), seed=0)
    m = s.metrics()
    assert m["domain_prob/a"] == 0.75 and m["domain_prob/b"] == 0.25
    assert not any(k.startswith("domain_success/") for k in m)   # nothing observed yet
    assert m["informative_fraction"] == 0.0
    ids = s.propose(400)
    m = s.metrics()
    share_a = np.isin(ids, [0, 1]).mean()
    assert m["domain_share/a"] == pytest.approx(share_a) and 0.68 < share_a < 0.82
    s.observe(Feedback([0, 2], [[1, 0, 1, 1], [0, 0, 0, 0]], step=0))
    m = s.metrics()
    assert m["domain_success/a"] == 0.75 and m["domain_success/b"] == 0.0
    assert m["informative_fraction"] == 0.5 and m["informative_fraction_total"] == 0.5
    assert m["rollouts_observed"] == 8 and m["groups_observed"] == 2 and m["prompts_seen"] == 2
    s.observe(Feedback([1, 1, 3], [[1, 1, 1, 1], [0, 1, 0, 1], [0, 0, 0, 1]], step=1))
    m = s.metrics()
    assert m["informative_fraction"] == pytest.approx(2 / 3)
    assert m["informative_fraction_total"] == pytest.approx(3 / 5)
    assert m["domain_success/a"] == pytest.approx(9 / 12) and m["domain_success/b"] == pytest.approx(1 / 8)


def test_uniform_has_no_domain_prob():
    s = Scheduler(POOL, "uniform")
    s.propose(8)
    m = s.metrics()
    assert not any(k.startswith("domain_prob/") for k in m)
    assert s.domain_probs() is None
    assert sum(v for k, v in m.items() if k.startswith("domain_share/")) == pytest.approx(1.0)


def test_cluster_mixture_maps_to_domain_probs():
    # clusters: 0 = {a}, 1 = {a, b}, 2 = {b}; weights over clusters [2, 1, 1] / 4
    pool = Pool(["a", "a", "b", "b"], clusters=[0, 1, 1, 2])
    s = Scheduler(pool, fixed_mixture([2.0, 1.0, 1.0], arms="cluster"))
    np.testing.assert_allclose(s.domain_probs(), [0.5 + 0.125, 0.125 + 0.25])
    m = s.metrics()
    assert m["domain_prob/a"] == pytest.approx(0.625)


def test_dump_domain_prob_hand_value():
    # arm a sees one group [1, 0, 1, 0]: 4 rollouts with |A| = 0.5/(0.5 + 1e-6); arm b nothing.
    pool = Pool(["a", "a", "b", "b"])
    s = Scheduler(pool, "dump")
    s.observe(Feedback([0], [[1.0, 0.0, 1.0, 0.0]], step=0))
    mu = np.array([0.5 / (0.5 + 1e-6), 0.0])
    n = np.array([4, 0])
    score = mu + np.sqrt(2 * np.log(4 + 1) / (n + 1))
    p = np.exp((score - score.max()) / 0.1)
    p /= p.sum()
    m = s.metrics()
    assert m["domain_prob/a"] == pytest.approx(p[0], rel=1e-12)
    assert m["domain_prob/b"] == pytest.approx(p[1], rel=1e-12)
    assert p[0] == pytest.approx(0.520, abs=1e-3)                 # the docstring's hand value


# ---- review fixes: validation at construction ------------------------------------------------
def test_negative_seed_rejected_at_construction():
    pool = Pool(["a"] * 4 + ["b"] * 4)
    with pytest.raises(ValueError, match="seed must be an int in"):
        Scheduler(pool, "uniform", seed=-1)
    assert Scheduler(pool, "uniform", seed=0).propose(3).shape == (3,)


def test_with_floor_hand_values_and_infeasible_floor_at_construction():
    pool = Pool(["a"] * 4 + ["b"] * 4)
    floored = policies.with_floor(fixed_mixture([3.0, 1.0]), 0.1)
    s = Scheduler(pool, floored)
    # p' = (1 − K·floor)·p + floor = 0.8·[0.75, 0.25] + 0.1
    np.testing.assert_allclose(s.domain_probs(), [0.7, 0.3])
    with pytest.raises(ValueError, match="infeasible for 2 arms"):
        Scheduler(pool, policies.with_floor(fixed_mixture(), 0.6))


def test_seed_and_threshold_types_rejected_with_value_error():
    pool = Pool([0, 1])
    for bad in (2**63, 1.5, "3", True):
        with pytest.raises(ValueError, match="seed must be an int in"):
            Scheduler(pool, "uniform", seed=bad)
    with pytest.raises(ValueError, match="success_threshold must be a number"):
        Scheduler(pool, "uniform", success_threshold="half")
    assert Scheduler(pool, "uniform", success_threshold="0.25").success_threshold == 0.25
    assert Scheduler(pool, "uniform", seed=np.int64(2**63 - 1)).seed == 2**63 - 1
