"""One contract suite over every registered policy (STYLE.md §4; optax `contrib/_common_test`,
SB3 `MODEL_LIST`): valid distributions, floors kept, stable state, determinism, exact
resume, bad input rejected with state unchanged, degenerate feedback handled — plus
hypothesis property tests over random feedback streams.

New policies added to the registry are covered automatically (parametrized over
`rlpace.policies.names()`), with their card defaults.
"""

import inspect
import pickle
from typing import NamedTuple

import numpy as np
import pytest

from _isolated import assert_state_equal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlpace import Feedback, Pool, Scheduler, policies
from rlpace.policies import MIXTURE
from rlpace.policies._registry import _resolve

NAMES = policies.names()

# 3 domains × 40 prompts, 2 clusters per domain, offline difficulty = hidden difficulty + noise.
_rng = np.random.default_rng(0)
N = 120
DOMAINS = np.repeat(["easy", "mid", "hard"], 40)
CLUSTERS = np.repeat(np.arange(3), 40) * 2 + (np.arange(N) % 2)
HIDDEN_P = np.concatenate([np.linspace(1.0, 0.7, 40), np.linspace(0.8, 0.2, 40), np.linspace(0.3, 0.0, 40)])
# Every third prompt unlabelled (Pool.labeled): the supervision places (ttrl, trapo) act on them.
POOL = Pool(DOMAINS, clusters=CLUSTERS, difficulty=1 - HIDDEN_P + 0.1 * _rng.standard_normal(N),
            labeled=np.arange(N) % 3 != 2)


class StepSpec(NamedTuple):
    n: int          # prompts proposed this step
    g: int          # rollouts per prompt
    kind: str       # how the rewards are made (see `feedback_for`)


KINDS = ("normal", "all0", "all1", "advantages", "duplicates", "late", "real", "unproposed")


def feedback_for(spec: StepSpec, ids: np.ndarray, step: int, seed: int = 0) -> Feedback:
    """Deterministic feedback a trainer could produce for `ids` at `step`."""
    rng = np.random.default_rng([seed, step, 99])
    b, g = ids.shape[0], spec.g
    rewards = (rng.random((b, g)) < HIDDEN_P[ids][:, None]).astype(np.float64)
    adv = None
    if spec.kind == "all0":
        rewards[:] = 0.0
    elif spec.kind == "all1":
        rewards[:] = 1.0
    elif spec.kind == "advantages":
        adv = rng.standard_normal((b, g))
    elif spec.kind == "duplicates" and b >= 2:
        ids = ids.copy()
        ids[1::2] = ids[0]
    elif spec.kind == "real":
        rewards = rewards * 3.0 - rng.random((b, g))             # K&K-like shaped rewards
    elif spec.kind == "unproposed":
        ids = rng.integers(0, N, size=b)
    # extracted answers for the target places: "42" where the rollout succeeded, else one of
    # two wrong answers or none (methods that do not read answers ignore them)
    wrong = rng.choice(np.array(["41", "43", None], dtype=object), size=(b, g))
    answers = np.where(rewards >= 0.5, "42", wrong).tolist()
    return Feedback(ids, rewards, advantages=adv, step=max(0, step - 3) if spec.kind == "late" else step,
                    answers=answers)


STREAM = [StepSpec(8, 4, k) for k in ("normal", "normal", "all0", "normal", "all1", "advantages",
                                       "normal", "duplicates", "late", "real", "unproposed", "normal")]
STREAM[3] = StepSpec(0, 4, "normal")                             # an empty batch
STREAM[6] = StepSpec(6, 1, "normal")                             # G = 1


def drive(sched: Scheduler, stream, start: int, stop: int, seed: int = 0):
    """Run steps [start, stop) of `stream`; return (ids, keep, refill, weights, metrics) per step."""
    out = []
    for t in range(start, stop):
        spec = stream[t]
        ids = sched.propose(spec.n)
        fb = feedback_for(spec, ids, t, seed)
        sched.observe(fb)
        adm = sched.admission(fb)
        w = sched.loss_weights(fb)
        out.append((ids, adm.keep, adm.refill, w, sched.metrics()))
    return out




def assert_trace_equal(x, y):
    assert len(x) == len(y)
    for step, ((i1, k1, r1, w1, m1), (i2, k2, r2, w2, m2)) in enumerate(zip(x, y)):
        np.testing.assert_array_equal(i1, i2, err_msg=f"proposals at step {step}")
        np.testing.assert_array_equal(k1, k2, err_msg=f"admission at step {step}")
        assert r1 == r2, f"refill at step {step}"
        np.testing.assert_array_equal(w1, w2, err_msg=f"weights at step {step}")
        assert m1.keys() == m2.keys()
        for key in m1:
            assert m1[key] == m2[key] or (np.isnan(m1[key]) and np.isnan(m2[key])), (step, key)


def _roundtrip(sd, channel, tmp_path=None):
    if channel == "pickle":
        return pickle.loads(pickle.dumps(sd))
    path = tmp_path / "state.npz"
    np.savez(path, **sd)
    with np.load(path) as z:                 # no allow_pickle: state must be plain arrays
        return {k: z[k] for k in z.files}


def assert_resume_equivalent(policy, stream, at, *, channel="pickle", tmp_path=None, seed=5, **kwargs):
    """Restore at step `at` into a fresh Scheduler: the rest of the stream must replay
    identically (proposals, admission, weights, metrics) and end in the same state."""
    ref = Scheduler(POOL, policy, seed=seed, **kwargs)
    drive(ref, stream, 0, at)
    sd = _roundtrip(ref.state_dict(), channel, tmp_path)
    fresh = Scheduler(POOL, policy, seed=seed + 1000, **kwargs)   # seed must come from the state
    fresh.load_state_dict(sd)
    assert_state_equal(fresh.state_dict(), ref.state_dict())
    assert_trace_equal(drive(fresh, stream, at, len(stream)), drive(ref, stream, at, len(stream)))
    assert_state_equal(fresh.state_dict(), ref.state_dict())


def assert_valid_distribution(sched: Scheduler):
    mix = sched.method.mixture
    if mix is None:
        assert sched.domain_probs() is None
        return
    for p, k in ((mix.apply(sched.states[MIXTURE], sched.pool), sched.pool.n_arms(mix.arms)),
                 (sched.domain_probs(), sched.pool.n_domains)):
        assert p.shape == (k,)
        assert np.isfinite(p).all() and (p >= 0).all()
        assert p.sum() == pytest.approx(1.0, abs=1e-9)


def shapes(sd):
    return {k: (np.asarray(v).shape, np.asarray(v).dtype) for k, v in sd.items()}


# ---- the suite -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_distribution_valid_and_proposals_in_range(name):
    s = Scheduler(POOL, name, seed=0)
    assert_valid_distribution(s)
    for t, spec in enumerate(STREAM):
        ids = s.propose(spec.n)
        assert ids.dtype == np.int64 and ids.shape == (spec.n,)
        assert ((ids >= 0) & (ids < N)).all()
        s.observe(feedback_for(spec, ids, t))
        assert_valid_distribution(s)
        m = s.metrics()
        assert all(isinstance(v, float) for v in m.values())
        if s.method.mixture is not None:
            assert sum(m[f"domain_prob/{d}"] for d in POOL.domain_names) == pytest.approx(1.0)


FLOORED = [n for n in NAMES if "floor" in inspect.signature(_resolve(n)).parameters]


@pytest.mark.parametrize("name", FLOORED)
def test_floor_kept(name):
    s = Scheduler(POOL, name, seed=0, floor=0.05)
    for t, spec in enumerate(STREAM * 2):
        ids = s.propose(spec.n)
        s.observe(feedback_for(spec, ids, t))
        p = s.method.mixture.apply(s.states[MIXTURE], POOL)
        assert (p >= 0.05 - 1e-12).all() and p.sum() == pytest.approx(1.0)
        assert_valid_distribution(s)


def test_dump_is_floored():
    # the brief's example; guards against the floor list silently becoming empty
    assert "dump" in FLOORED


@pytest.mark.parametrize("name", NAMES)
def test_state_shapes_and_dtypes_stable(name):
    s = Scheduler(POOL, name, seed=0)
    ref = shapes(s.state_dict())
    for t, spec in enumerate(STREAM + [StepSpec(5, 9, "normal"), StepSpec(3, 2, "all1")]):
        ids = s.propose(spec.n)
        s.observe(feedback_for(spec, ids, t))
        assert shapes(s.state_dict()) == ref, f"state changed shape or dtype at step {t} ({spec})"


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_proposals(name):
    a = drive(Scheduler(POOL, name, seed=7), STREAM, 0, len(STREAM))
    b = drive(Scheduler(POOL, name, seed=7), STREAM, 0, len(STREAM))
    assert_trace_equal(a, b)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("at", [0, 5, 9])
def test_exact_resume_pickle(name, at):
    assert_resume_equivalent(name, STREAM, at)


@pytest.mark.parametrize("name", NAMES)
def test_exact_resume_npz(name, tmp_path):
    assert_resume_equivalent(name, STREAM, 7, channel="npz", tmp_path=tmp_path)


BAD_FEEDBACK = [
    (lambda: Feedback([0, N], [[1.0, 0.0], [0.0, 1.0]], step=0), "Feedback.prompt_ids"),
    (lambda: Feedback([0, -1], [[1.0, 0.0], [0.0, 1.0]], step=0), "Feedback.prompt_ids"),
    (lambda: Feedback([0, 1], [[1.0, np.nan], [0.0, 1.0]], step=0), "Feedback.rewards"),
    (lambda: Feedback([0, 1], [[1.0, 0.0], [0.0, 1.0]], advantages=[[np.inf, 0.0], [0.0, 0.0]], step=0),
     "Feedback.advantages"),
    (lambda: Feedback([0, 1], np.zeros((2, 0)), step=0), "Feedback.rewards"),
    (lambda: Feedback([0, 1], [0.0, 1.0], step=0), "Feedback.rewards"),
]


@pytest.mark.parametrize("name", NAMES)
def test_bad_input_rejected_state_unchanged(name):
    s = Scheduler(POOL, name, seed=0)
    drive(s, STREAM, 0, 5)
    before = s.state_dict()
    for make, field in BAD_FEEDBACK:
        for call in (s.observe, s.admission, s.loss_weights):
            with pytest.raises(ValueError, match=field.replace(".", r"\.")):
                call(make())
    assert_state_equal(s.state_dict(), before)
    with pytest.raises(ValueError, match="bogus"):
        Scheduler(POOL, name, bogus_hyperparameter=1)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("kind, g", [("all0", 4), ("all1", 4), ("normal", 1), ("empty", 4), ("all0", 1)])
def test_degenerate_feedback_handled(name, kind, g):
    s = Scheduler(POOL, name, seed=0)
    for t in range(6):                              # repeated, so windows fill with the degenerate case
        n = 0 if kind == "empty" else 8
        ids = s.propose(n)
        fb = feedback_for(StepSpec(n, g, "normal" if kind == "empty" else kind), ids, t)
        s.observe(fb)
        adm = s.admission(fb)
        assert adm.keep.dtype == bool and adm.keep.shape == (n, g)
        assert isinstance(adm.refill, int) and adm.refill >= 0
        w = s.loss_weights(fb)
        assert w.shape == (n, g) and np.isfinite(w).all() and (w >= 0).all()
        assert_valid_distribution(s)
        assert all(np.isfinite(v) or k == "prompts_seen" for k, v in s.metrics().items()), s.metrics()
    ids = s.propose(8)
    assert ids.shape == (8,) and ((ids >= 0) & (ids < N)).all()


# ---- property tests over random feedback streams -------------------------------------------
step_specs = st.builds(StepSpec, n=st.integers(0, 10), g=st.integers(1, 6), kind=st.sampled_from(KINDS))


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=st.lists(step_specs, min_size=1, max_size=6), seed=st.integers(0, 3))
def test_invariants_on_random_streams(name, stream, seed):
    s = Scheduler(POOL, name, seed=seed)
    ref = shapes(s.state_dict())
    for t, spec in enumerate(stream):
        ids = s.propose(spec.n)
        assert ids.shape == (spec.n,) and ((ids >= 0) & (ids < N)).all()
        fb = feedback_for(spec, ids, t, seed)
        s.observe(fb)
        adm = s.admission(fb)
        assert adm.keep.dtype == bool and adm.keep.shape == fb.rewards.shape and adm.refill >= 0
        w = s.loss_weights(fb)
        assert w.shape == fb.rewards.shape and np.isfinite(w).all() and (w >= 0).all()
        assert_valid_distribution(s)
        assert shapes(s.state_dict()) == ref
    # history counts exactly what was observed
    total = sum(spec.g * spec.n for spec in stream)
    assert int(s.history.attempts.sum()) == total == s.metrics()["rollouts_observed"]


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=st.lists(step_specs, min_size=2, max_size=6), data=st.data())
def test_resume_on_random_streams(name, stream, data):
    at = data.draw(st.integers(0, len(stream) - 1))
    assert_resume_equivalent(name, stream, at)
