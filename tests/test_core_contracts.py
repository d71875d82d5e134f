"""Contracts of the core: which policies are neutral, how chained policies combine, and the
records' invariants (a user policy is never mistaken for a built-in by its name)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pytest

from rlpace import Feedback, InputError, Pool, Scheduler
from rlpace.policies import (Admission, DataPolicy, EmptyState, compose, dataset_labels, identity_reward,
                             is_neutral, keep_all, make_policy, active_supervision_places, unit_advantage,
                             unit_weights)
from rlpace.policies._uniform import uniform_pool

POOL = Pool(["a"] * 4 + ["b"] * 4)


def _mine(kind, name, apply):
    return DataPolicy(kind, lambda pool: EmptyState(), lambda s, pool, b: s, apply, name=name)


def test_builtin_neutral_policies_are_flagged_and_nothing_else_is():
    for factory in (keep_all, unit_weights, uniform_pool, dataset_labels, identity_reward, unit_advantage):
        assert is_neutral(factory()), factory.__name__
    assert not is_neutral(make_policy("dapo_dynamic_sampling")) and not is_neutral(None)


def test_a_user_admission_named_keep_all_is_kept_by_compose():
    # keeps only the rollouts with reward > 0.5: not neutral, whatever its name
    mine = _mine("admission", "keep_all", lambda s, pool, b: Admission(b.rewards > 0.5, 1))
    assert not is_neutral(mine)
    method = compose(compose(mine), make_policy("dump"))     # merging a Method used to drop it
    assert method.admission is mine
    s = Scheduler(POOL, method)
    adm = s.admission(Feedback([0, 5], [[1.0, 0.0], [0.0, 0.0]], step=0))
    assert adm.keep.tolist() == [[True, False], [False, False]] and adm.refill == 1


def test_a_user_target_named_dataset_labels_is_a_supervising_place():
    mine = _mine("target", "dataset_labels", lambda s, pool, b: None)
    assert active_supervision_places(compose(make_policy("dump"), mine)) == frozenset({"target"})
    assert active_supervision_places(compose(make_policy("dump"))) == frozenset()


# ---- Scheduler.step: one validation, one documented order --------------------------------------
from _isolated import assert_state_equal  # noqa: E402
from test_contract import NAMES, STREAM, feedback_for  # noqa: E402
from test_contract import POOL as CPOOL  # noqa: E402


def _separate(s: Scheduler, fb):
    """The documented order, call by call."""
    s.observe(fb)
    adm = s.admission(fb)
    return adm.keep, adm.refill, adm.full_group_advantages, s.loss_weights(fb), s.advantage_weights(fb)


def _stepped(s: Scheduler, fb):
    r = s.step(fb)
    return r.keep, r.refill, r.full_group_advantages, r.weights, r.advantage_weights


def _drive(s: Scheduler, call, start: int, stop: int) -> list:
    out = []
    for t in range(start, stop):
        ids = s.propose(STREAM[t].n)
        out.append((ids, *call(s, feedback_for(STREAM[t], ids, t)), s.metrics()))
    return out


def _assert_same(x, y):
    assert len(x) == len(y)
    for t, (a, b) in enumerate(zip(x, y)):
        for i, (u, v) in enumerate(zip(a[:-1], b[:-1])):
            np.testing.assert_array_equal(u, v, err_msg=f"step {t}, field {i}")
        assert a[-1].keys() == b[-1].keys()
        for k in a[-1]:
            assert a[-1][k] == b[-1][k] or (np.isnan(a[-1][k]) and np.isnan(b[-1][k])), (t, k)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("name", NAMES)
def test_step_equals_the_separate_calls_in_the_documented_order(name):
    a, b = Scheduler(CPOOL, name, seed=3), Scheduler(CPOOL, name, seed=3)
    _assert_same(_drive(a, _stepped, 0, len(STREAM)), _drive(b, _separate, 0, len(STREAM)))
    assert_state_equal(a.state_dict(), b.state_dict())


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("name", NAMES)
def test_step_resumes_exactly(name):
    ref = Scheduler(CPOOL, name, seed=5)
    _drive(ref, _stepped, 0, 5)
    fresh = Scheduler(CPOOL, name, seed=1005)
    fresh.load_state_dict(ref.state_dict())
    _assert_same(_drive(fresh, _stepped, 5, len(STREAM)), _drive(ref, _stepped, 5, len(STREAM)))
    assert_state_equal(fresh.state_dict(), ref.state_dict())


def _features(d=3):
    calls = []

    def features(adm):
        keep = adm.keep
        calls.append(keep.copy())
        # a deterministic stand-in for the loss-gradient features: 0 on dropped rollouts
        g = np.arange(keep.size * d, dtype=np.float32).reshape(*keep.shape, d) % 7 - 3
        return g * keep[..., None]
    return features, calls


@pytest.mark.parametrize("name", ["diem", "dvc", "dapo_dynamic_sampling+diem"])
def test_step_with_features_admits_then_updates_the_readers(name):
    a, b = Scheduler(POOL, name, seed=1), Scheduler(POOL, name, seed=1)
    for t in range(4):
        ids = a.propose(4)
        assert (b.propose(4) == ids).all()
        rewards = (np.arange(8).reshape(4, 2) + t) % 3 == 0
        fb = Feedback(ids, rewards.astype(float), step=t)
        features, calls = _features()
        r = a.step(fb, features=features)
        # reference: admission before the features exist, then observe with them, then weights
        keep = b.admission(fb).keep
        fg = fb.with_grads(features(b.admission(fb)))
        b.observe(fg)
        np.testing.assert_array_equal(r.keep, keep)
        np.testing.assert_array_equal(calls[0], keep)
        np.testing.assert_array_equal(r.weights, b.loss_weights(fg))
        np.testing.assert_array_equal(r.feedback.grads, fg.grads)
        assert_state_equal(a.state_dict(), b.state_dict())
    # a method that reads no features never calls the callable
    s = Scheduler(POOL, "dump")
    features, calls = _features()
    s.step(Feedback(s.propose(2), [[1.0, 0.0], [0.0, 0.0]], step=0), features=features)
    assert calls == []


def test_step_admission_sees_this_visit_with_or_without_features():
    # TraPO's admission reads the selection its update made for this visit: step observes first,
    # with or without features (the gradient path used to admit before observing).
    pool = Pool(["a"] * 6, labeled=[True, False, True, False, True, False])
    fb = [Feedback([0, 1, 3], [[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]], step=t,
                   answers=[["1", "2"], ["7", "7"], ["3", "4"]]) for t in range(12)]
    a, b, c = (Scheduler(pool, "trapo+diem", seed=0) for _ in range(3))
    for f in fb:
        features, _ = _features()
        ra, rb = a.step(f, features=features), b.step(f)
        np.testing.assert_array_equal(ra.keep, rb.keep)
        c.observe(f)
        np.testing.assert_array_equal(ra.keep, c.admit(f))


def test_step_rejects_bad_features_and_leaves_the_readers_alone():
    from rlpace.errors import InputError
    s = Scheduler(POOL, "dvc", seed=0)                 # a mixture that learns from the features
    fb = Feedback(s.propose(2), [[1.0, 0.0], [0.0, 1.0]], step=0)
    before = s.state_dict()
    with pytest.raises(InputError, match="grads"):
        s.step(fb, features=lambda adm: np.ones((2, 3, 4), np.float32))     # G = 2, not 3
    after = s.state_dict()
    mixture = [k for k in before if k.startswith("policy/mixture")]
    assert mixture
    for k in mixture:
        np.testing.assert_array_equal(np.asarray(after[k]), np.asarray(before[k]), err_msg=k)
    assert int(after["history/attempts"].sum()) == 4     # step 1 (observe) ran: 2 groups × 2


# ---- records ----------------------------------------------------------------------------------
def test_feedback_step_is_required():
    # a default of 0 made every prompt look last seen at step 0: recency silently zeroed
    with pytest.raises(TypeError, match="Feedback needs step="):
        Feedback([0, 1], [[1.0, 0.0], [0.0, 1.0]])
    s = Scheduler(POOL, "uniform")
    s.observe(Feedback([0, 1], [[1.0, 0.0], [0.0, 1.0]], step=7))
    assert s.history.last_step.tolist() == [7, 7, -1, -1, -1, -1, -1, -1]


def test_chain_keeps_update_losses_and_refuses_follows_mixture():
    from rlpace.errors import InputError
    from rlpace.policies import chain

    def counting(name):
        # a reweighter whose state counts the loss points it was fed (weight 1 + that count)
        return DataPolicy("reweighting", lambda pool: np.zeros(1), lambda s, pool, b: s,
                          lambda s, pool, b: np.full(b.rewards.shape, 1.0 + s[0]), name=name,
                          update_losses=lambda s, pool, losses: s + losses.domains.size)
    plain = _mine("reweighting", "plain", lambda s, pool, b: np.full(b.rewards.shape, 2.0))
    s = Scheduler(POOL, compose(counting("c1"), plain, counting("c2")))
    s.observe_losses({"a": (100, 1.5), "b": (100, 2.0)})
    s.observe_losses({"a": (200, 1.2)})
    # each counting member saw 3 points: weight 4 each; the plain one 2: 4 · 2 · 4 = 32
    assert s.loss_weights(Feedback([0], [[1.0, 0.0]], step=0)).tolist() == [[32.0, 32.0]]
    follower = plain._replace(follows_mixture=True)
    with pytest.raises(InputError, match="follows_mixture"):
        chain(plain, follower)


# ---- names and leaks --------------------------------------------------------------------------
def test_prompts_seen_is_exact_above_a_million_prompts_and_after_resume():
    # it was NaN above 10⁶ prompts (an O(N) count skipped); now kept in step with the history
    pool = Pool(np.zeros(2_000_000, np.int64))
    s = Scheduler(pool, "uniform", seed=0)
    s.observe(Feedback([5, 1_999_999, 5, 7], np.ones((4, 2)), step=0))     # 3 distinct
    s.observe(Feedback([7, 12], np.zeros((2, 2)), step=1))                  # 1 new
    s.observe(Feedback([], np.zeros((0, 2)), step=2))
    assert s.metrics()["prompts_seen"] == 4.0 == np.count_nonzero(s.history.attempts)
    fresh = Scheduler(pool, "uniform", seed=0)
    fresh.load_state_dict(s.state_dict())
    assert fresh.metrics()["prompts_seen"] == 4.0


def test_pool_owns_its_cluster_domain_shares():
    pool = Pool(["a", "a", "b", "b", "b"], clusters=[0, 1, 1, 1, 2])
    shares = pool.cluster_domain_shares()                                  # [K=2 domains, C=3 clusters]
    np.testing.assert_array_equal(shares, [[1.0, 1 / 3, 0.0], [0.0, 2 / 3, 1.0]])
    assert shares is pool.cluster_domain_shares() and not shares.flags.writeable


def test_supervision_checks_say_what_they_check():
    from rlpace.adapters._supervision import has_supervision_places, needs_supervision_pass
    from rlpace.policies import supervising_places
    assert supervising_places is active_supervision_places          # the old public name still works
    ttrl, sc, dump = (Scheduler(POOL, n) for n in ("ttrl", "self_certainty", "dump"))
    assert has_supervision_places(ttrl) and needs_supervision_pass(ttrl)
    assert has_supervision_places(sc) and needs_supervision_pass(sc)
    assert not has_supervision_places(dump) and not needs_supervision_pass(dump)


# ---- what the adapters share ---------------------------------------------------------------------
def test_admitted_advantages_by_hand():
    from rlpace.adapters._convert import admitted_advantages
    r = np.array([[1.0, 0.0, 0.0, 1.0], [1.0, 0.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    keep = np.array([[True, True, False, False],       # thinned: kept pair {1, 0} -> ±1/(0.5 + 1e-6)
                     [True, True, True, True],         # whole: untouched
                     [False, False, False, False]])    # dropped: 0
    replace, value = admitted_advantages(r, keep)
    a = 0.5 / (0.5 + 1e-6)
    assert replace.tolist() == [[True] * 4, [False] * 4, [True] * 4]
    np.testing.assert_allclose(value, [[a, -a, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]], rtol=1e-12)
    # topk's full-group advantages: only the dropped rollouts change
    replace, value = admitted_advantages(r, keep, full_group_advantages=True)
    assert replace.tolist() == [[False, False, True, True], [False] * 4, [True] * 4]
    assert not value.any()


def test_dump_floor_is_with_floor():
    from rlpace.errors import InputError
    pool = Pool(["a"] * 6 + ["b"] * 2 + ["c"] * 2)
    fb = Feedback(np.arange(10), np.tile([[1.0, 0.0]], (10, 1)) * (np.arange(10) < 6)[:, None], step=0)
    plain, floored = Scheduler(pool, "dump"), Scheduler(pool, "dump", floor=0.2)
    for s in (plain, floored):
        s.observe(fb)
    p = plain.domain_probs()
    np.testing.assert_array_equal(floored.domain_probs(), (1 - 3 * 0.2) * p + 0.2)
    assert floored.method.mixture.name == "dump" and floored.domain_probs().min() >= 0.2
    with pytest.raises(InputError, match="infeasible for 3 arms"):
        Scheduler(pool, "dump", floor=0.4)


def test_chosen_rewards_one_rule():
    from rlpace.adapters._convert import chosen_rewards
    calls = []
    score = lambda: calls.append(1) or np.array([2.0, -1.0])            # noqa: E731
    assert chosen_rewards({"acc": [1, 0], "score": [2, -1]}, "acc", score).tolist() == [1.0, 0.0]
    assert calls == []                                                  # the fallback is not computed
    assert chosen_rewards({"score": [2, -1]}, "acc", score).tolist() == [2.0, -1.0]
    assert chosen_rewards({"acc": [1, 0]}, None, score).tolist() == [2.0, -1.0] and len(calls) == 2


def test_step_targets_and_retargeted_shared_by_both_verl_paths():
    from rlpace.adapters._supervision import retargeted, step_targets
    s = Scheduler(Pool(["a", "a", "a"], labeled=[True, False, False]), "ttrl")
    fb = Feedback([0, 1, 2], np.zeros((3, 2)), step=0, answers=[["3", "3"], ["5", "5"], [None, None]])
    target, zero = step_targets(s, [(fb, np.array([[0, 3], [1, 4], [2, 5]]))], 7)
    # labelled: its dataset label (None); unlabelled with a majority: "5"; no answer: unverified (0)
    assert target.tolist() == [None, "5", None, None, "5", None, None]
    assert zero.tolist() == [False, False, True, False, False, True, False]
    rm = {"ground_truth": "4", "style": "rule"}
    assert retargeted(rm, "5") == {"ground_truth": "5", "style": "rule", "dataset_ground_truth": "4"}
    assert rm == {"ground_truth": "4", "style": "rule"}


# ---- state value rules: one place per record ----------------------------------------------------
class _CountState(NamedTuple):
    n: np.ndarray                    # int64[] groups seen
    STATE_RULES = {"n": "nonneg"}


def test_state_rules_live_on_the_record_and_reach_user_states():
    from rlpace.errors import InputError
    from rlpace.policies._dump import DumpState
    assert DumpState.STATE_RULES == {"count": "nonneg"}
    mine = DataPolicy("reweighting", lambda pool: _CountState(np.zeros((), np.int64)),
                      lambda s, pool, b: _CountState(s.n + b.prompt_ids.size),
                      lambda s, pool, b: np.ones(b.rewards.shape), name="counting")
    s = Scheduler(POOL, compose(mine))
    s.observe(Feedback([0, 1], np.ones((2, 2)), step=0))
    sd = s.state_dict()
    key = next(k for k in sd if k.endswith("/n"))
    assert int(sd[key]) == 2
    bad = dict(sd, **{key: np.array(-3, np.int64)})
    with pytest.raises(InputError, match=r"has values outside \[0, "):
        Scheduler(POOL, compose(mine)).load_state_dict(bad)


def test_one_json_lines_reader_names_the_bad_line(tmp_path):
    from rlpace.experiments import RecordError, records_from_trainer_jsonl
    from rlpace.tasks._parquet import read_jsonl as task_items
    from rlpace.types import read_jsonl
    f = tmp_path / "x.jsonl"
    f.write_text('{"a": 1}\n\n{"b": 2}\n{oops\n')
    with pytest.raises(InputError, match=r"x.jsonl: line 4 is not valid JSON"):
        read_jsonl(f)
    with pytest.raises(InputError, match="line 4 is not valid JSON"):
        task_items(f)
    with pytest.raises(RecordError, match="line 4 is not valid JSON"):
        records_from_trainer_jsonl(f, run_id="r", label="l", policy="p", seed=0, suite="s")
    f.write_text('{"a": 1}\n\n{"b": 2}\n')
    assert read_jsonl(f) == [{"a": 1}, {"b": 2}]


def test_a_bug_in_a_chained_reweighter_keeps_its_own_error():
    # token_weights used to rewrite any ValueError of a chain as "a token-level reweighter
    # cannot be chained", hiding a member's real bug
    def buggy(s, pool, b):
        raise ValueError("bug in my reweighter")
    s = Scheduler(POOL, compose(make_policy("ar"), _mine("reweighting", "mine", buggy)))
    with pytest.raises(ValueError, match="bug in my reweighter"):
        s.token_weights(Feedback([0], [[1.0, 0.0]], step=0), np.full((1, 2, 3), 0.5), np.ones((1, 2, 3), bool))
