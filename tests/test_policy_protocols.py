"""Each kind's call shape is a typing.Protocol, and `DataPolicy(...)` checks the functions it is
given against it: a user policy of the wrong arity fails at construction with the expected
signature, not at its first step with an obscure TypeError; every registered policy satisfies
its protocol; and the protocols say exactly what the Scheduler passes."""

from __future__ import annotations

import inspect
from collections import defaultdict

import numpy as np
import pytest

from rlpace import Feedback, InputError, Pool, Scheduler, policies
from rlpace.policies import (KINDS, Admission, DataPolicy, EmptyState, Targets, compose, make_method,
                             with_floor)
from rlpace.policies._protocols import _HOOKS, APPLY_PROTOCOLS

# What scheduler.py passes to each kind's apply, written out by hand from its call sites.
APPLY = {
    "mixture": "apply(state, pool)",
    "selection": "apply(state, pool, n, probs, arms, rng)",
    "admission": "apply(state, pool, batch)",
    "reweighting": "apply(state, pool, batch)",
    "target": "apply(state, pool, batch)",
    "reward": "apply(state, pool, batch)",
    "advantage": "apply(state, pool, batch)",
    "allocation": "apply(state, pool, ids, budget)",
}
HOOKS = {"init": "init(pool)", "update": "update(state, pool, batch)", "metrics": "metrics(state, pool)",
         "check_state": "check_state(state, pool)", "update_losses": "update_losses(state, pool, losses)",
         "decisions": "decisions(state, pool, batch)"}


def arity(signature: str) -> int:
    return signature.count(",") + 1


def _init(pool):
    return EmptyState()


def _update(state, pool, batch):
    return state


def _takes(n):
    """A function of exactly n positional parameters."""
    def fn(*args):
        return None
    fn.__signature__ = inspect.Signature([inspect.Parameter(f"a{i}", inspect.Parameter.POSITIONAL_ONLY)
                                          for i in range(n)])
    return fn


def test_protocols_are_exported_and_cover_every_kind():
    assert set(APPLY_PROTOCOLS) == set(KINDS) == set(APPLY)
    for kind, proto in APPLY_PROTOCOLS.items():
        assert getattr(policies, proto.__name__) is proto and proto.__name__ in policies.__all__
        params = list(inspect.signature(proto.__call__).parameters)[1:]
        assert f"apply({', '.join(params)})" == APPLY[kind]
        assert proto.__doc__.startswith(f"`{APPLY[kind]} -> ")      # the shape the errors quote
    for field, proto in _HOOKS:
        params = list(inspect.signature(proto.__call__).parameters)[1:]
        assert f"{field}({', '.join(params)})" == HOOKS[field] and proto.__name__ in policies.__all__


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("delta", [-1, +1])
def test_a_user_apply_of_the_wrong_arity_is_refused_naming_the_expected_signature(kind, delta):
    n = arity(APPLY[kind])
    bad = _takes(n + delta)
    with pytest.raises(InputError) as e:
        DataPolicy(kind, _init, _update, bad, name="mine")
    msg = str(e.value)
    assert msg.startswith(f"{kind} policy 'mine': apply = ")
    assert "fn(" in msg and f"cannot be called as {APPLY[kind]} -> " in msg
    assert f"takes {n} positional arguments" in msg
    DataPolicy(kind, _init, _update, _takes(n), name="mine")        # the right arity is accepted


@pytest.mark.parametrize("field", sorted(HOOKS))
def test_init_update_and_hooks_of_the_wrong_arity_are_refused(field):
    n = arity(HOOKS[field])
    fields = {"init": _init, "update": _update, field: _takes(n + 1)}
    with pytest.raises(InputError, match=rf"admission policy 'mine': {field} = .*cannot be called as "
                                         rf"{HOOKS[field].replace('(', '[(]').replace(')', '[)]')}"):
        DataPolicy("admission", apply=_takes(3), name="mine", **fields)
    fields[field] = _takes(n)
    DataPolicy("admission", apply=_takes(3), name="mine", **fields)


def test_keyword_only_extras_with_defaults_and_star_args_are_accepted_required_ones_refused():
    DataPolicy("allocation", _init, _update, lambda s, p, ids, budget, *, scale=1.0: ids)
    DataPolicy("selection", _init, _update, lambda s, p, *rest: rest)
    DataPolicy("mixture", _init, _update, lambda s, p, extra=None: None)     # a defaulted third
    with pytest.raises(InputError, match=r"<lambda>\(s, p, \*, scale\) cannot be called as apply\(state, pool\)"):
        DataPolicy("mixture", _init, _update, lambda s, p, *, scale: None, name="mine")
    with pytest.raises(InputError, match="apply must be a function apply"):
        DataPolicy("reward", _init, _update, "not callable")


def test_unknown_kind_and_replace_are_checked_at_construction():
    with pytest.raises(InputError, match="kind must be one of .*got 'weights'"):
        DataPolicy("weights", _init, _update, _takes(3), name="mine")
    mix = policies.make_policy("fixed_mixture", weights=[1.0, 0.0])
    with pytest.raises(InputError, match=r"mixture policy 'fixed_mixture': apply = "):
        mix._replace(apply=lambda s, p, batch: None)
    assert with_floor(mix, 0.1).kind == "mixture"               # with_floor builds through _replace


@pytest.mark.parametrize("name", policies.names())
def test_every_registered_policy_satisfies_its_protocol(name):
    for kind, p in make_method(name).policies().items():
        assert p.kind == kind
        for field, signature in (*HOOKS.items(), ("apply", APPLY[kind])):
            fn = getattr(p, field)
            if fn is not None:
                inspect.signature(fn).bind(*range(arity(signature)))     # raises on a mismatch


# ---- the protocols match what the Scheduler passes ----------------------------------------------
def _recording(calls, kind, returns, **kw):
    def record(field, fn):
        def call(*args):
            calls[(kind, field)].append(len(args))
            return fn(*args)
        return call
    return DataPolicy(kind, record("init", lambda pool: EmptyState()), record("update", lambda s, p, b: s),
                      record("apply", returns), name=f"rec_{kind}",
                      metrics=record("metrics", lambda s, p: {}), check_state=record("check_state", lambda s, p: None),
                      update_losses=record("update_losses", lambda s, p, losses: s),
                      decisions=record("decisions", lambda s, p, b: []), **kw)


def _split(s, p, ids, budget):
    out = np.full(ids.shape[0], budget // ids.shape[0], np.int64)
    out[:budget % ids.shape[0]] += 1
    return out


def test_the_scheduler_calls_each_kind_with_its_protocols_positional_arity():
    pool = Pool(["a"] * 4 + ["b"] * 4)
    calls = defaultdict(list)
    ones = lambda s, p, b: np.ones(b.rewards.shape)                      # noqa: E731
    method = compose(
        _recording(calls, "mixture", lambda s, p: np.full(2, 0.5), arms="domain"),
        _recording(calls, "selection", lambda s, p, n, probs, arms, rng: np.arange(n, dtype=np.int64) % 8,
                   follows_mixture=True),
        _recording(calls, "admission", lambda s, p, b: Admission(np.ones(b.rewards.shape, bool), 0)),
        _recording(calls, "reweighting", ones),
        _recording(calls, "target", lambda s, p, b: Targets([None] * b.prompt_ids.shape[0], [])),
        _recording(calls, "reward", lambda s, p, b: np.asarray(b.rewards, np.float64)),
        _recording(calls, "advantage", ones),
        _recording(calls, "allocation", _split, bounds=(0, None)),
    )
    s = Scheduler(pool, method)
    ids = s.propose(3)
    s.domain_probs()
    assert s.allocate(ids, 7).tolist() == [3, 2, 2]
    fb = Feedback(ids, [[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]], step=0, answers=[["1", "2"]] * 3)
    s.targets(fb), s.rewards(fb), s.advantage_weights(fb), s.admission(fb), s.loss_weights(fb)
    s.token_weights(fb, np.full((3, 2, 4), 0.5), np.ones((3, 2, 4), bool))
    s.observe(fb)
    s.observe_losses({"a": (100, 1.5)}, step=1)
    s.metrics()
    s.load_state_dict(s.state_dict())
    for kind in KINDS:
        expected = {"apply": APPLY[kind], **HOOKS}
        for field, signature in expected.items():
            got = calls[(kind, field)]
            assert got, (kind, field)                                        # the Scheduler called it
            assert set(got) == {arity(signature)}, (kind, field, got)
