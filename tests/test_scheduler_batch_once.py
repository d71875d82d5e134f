"""The Scheduler builds a Feedback's Batch once for observe + admit + loss_weights (the calls a
trainer's step makes on one Feedback), and a different Feedback, pool or threshold its own."""
import numpy as np
import pytest

import rlpace.scheduler as scheduler_module
from rlpace import Feedback, Pool, Scheduler
from rlpace.types import Batch


@pytest.fixture
def builds(monkeypatch):
    """A list that grows by one per Batch the Scheduler builds."""
    calls = []
    real = scheduler_module._batch_and_counts

    def counting(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(scheduler_module, "_batch_and_counts", counting)
    return calls


def _pool(n=64):
    rng = np.random.default_rng(0)
    return Pool(rng.integers(0, 4, size=n), clusters=rng.integers(0, 8, size=n),
                difficulty=rng.normal(size=n))


def _feedback(ids, t, seed=0):
    rewards = (np.random.default_rng([seed, t]).random((ids.shape[0], 8)) < 0.5).astype(np.float64)
    rewards[0] = 0.0            # an all-wrong group: ADS's admission drops it
    return Feedback(ids, rewards, step=t)


def _reference(sched, fb):
    """keep and weights of the admission and reweighting policies on a batch built
    independently of the Scheduler (`Batch.from_feedback`), from the current states."""
    batch = Batch.from_feedback(fb, sched.pool, sched.success_threshold)
    m = sched.method
    keep = np.asarray(m.admission.apply(sched.states["admission"], sched.pool, batch).keep, bool)
    w = np.asarray(m.reweighting.apply(sched.states["reweighting"], sched.pool, batch), np.float64)
    return keep, w


@pytest.mark.parametrize("name", ["ads", "criticality_is", "criticality_grid", "pods_max_variance"])
def test_one_build_per_step_for_after_rollout_policies(name, builds):
    kwargs = {"mini_cluster_size": 4} if name == "ads" else {}
    s = Scheduler(_pool(), name, seed=3, **kwargs)
    for t in range(4):
        ids = s.propose(16)
        fb = _feedback(ids, t)
        before = len(builds)
        s.observe(fb)
        keep = s.admit(fb)
        w = s.loss_weights(fb)
        assert len(builds) - before == 1            # was 3: observe, admit, loss_weights each
        ref_keep, ref_w = _reference(s, fb)
        np.testing.assert_array_equal(keep, ref_keep)
        np.testing.assert_array_equal(w, ref_w)
    if name == "ads":
        assert not keep[0].any() and keep[1:].any()     # the all-wrong group is dropped


def test_a_different_feedback_of_the_same_shape_gets_its_own_batch(builds):
    s = Scheduler(_pool(), "criticality_is", seed=1)
    ids = s.propose(16)
    fb1 = _feedback(ids, 0, seed=0)
    fb2 = _feedback(ids, 0, seed=1)                 # same ids, shape and step; other rewards
    assert not np.array_equal(fb1.rewards, fb2.rewards)
    s.observe(fb1)
    n = len(builds)
    w1 = s.loss_weights(fb1)
    assert len(builds) == n                          # reused
    w2 = s.loss_weights(fb2)
    assert len(builds) == n + 1 and builds[-1] is fb2
    np.testing.assert_array_equal(w2, _reference(s, fb2)[1])
    np.testing.assert_array_equal(w1, _reference(s, fb1)[1])
    np.testing.assert_array_equal(s.loss_weights(fb1), w1)
    assert len(builds) == n + 2                      # fb1 again: the kept batch is fb2's now
    # an equal Feedback that is another object: built again (the check is identity)
    fb1_copy = Feedback(fb1.prompt_ids, fb1.rewards, step=fb1.step)
    np.testing.assert_array_equal(s.loss_weights(fb1_copy), w1)
    assert len(builds) == n + 3


def test_the_pool_and_threshold_are_part_of_the_key(builds):
    s = Scheduler(_pool(), "ads", seed=0, mini_cluster_size=4)
    ids = s.propose(16)
    rewards = np.tile(np.linspace(0.0, 0.7, 8), (16, 1))
    fb = Feedback(ids, rewards, step=0)
    s.observe(fb)
    n = len(builds)
    assert s.admit(fb).all()                         # success ≥ 0.5 in every group
    assert len(builds) == n
    s.success_threshold = 0.9                        # now every group is all wrong
    assert not s.admit(fb).any()
    assert len(builds) == n + 1
    s.pool = Pool(s.pool.domains, clusters=s.pool.clusters, difficulty=s.pool.difficulty)
    s.admit(fb)
    assert len(builds) == n + 2


def test_the_kept_batch_is_read_only_and_not_in_the_state(builds):
    s = Scheduler(_pool(), "ads", seed=0, mini_cluster_size=4)
    fb = _feedback(s.propose(16), 0)
    s.observe(fb)
    batch, wins, informative = s._batch_and_counts(fb)
    for a in (batch.pass_rate, batch.advantages, batch.success, batch.domains, wins, informative):
        assert not a.flags.writeable
    np.testing.assert_array_equal(wins, (fb.rewards >= 0.5).sum(axis=1))
    assert not any("last_batch" in k for k in s.state_dict())


def test_a_method_without_after_rollout_places_keeps_no_batch(builds):
    s = Scheduler(_pool(), "uniform", seed=0)
    fb = _feedback(s.propose(16), 0)
    s.observe(fb)
    s.admit(fb)
    assert len(builds) == 2                          # observe's narrow batch, admit's full one
    assert "_last_batch" not in s.__dict__
    assert s.admit(fb).all() and s.counters.rollouts == 16 * 8
