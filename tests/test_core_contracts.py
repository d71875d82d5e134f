"""Contracts of the core: which policies are neutral, how chained policies combine, and the
records' invariants (a user policy is never mistaken for a built-in by its name)."""

from __future__ import annotations

import numpy as np
import pytest

from rlpace import Feedback, Pool, Scheduler
from rlpace.policies import (Admission, DataPolicy, EmptyState, compose, dataset_labels, identity_reward,
                             is_neutral, keep_all, make_policy, supervising_places, unit_advantage,
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
    assert supervising_places(compose(make_policy("dump"), mine)) == frozenset({"target"})
    assert supervising_places(compose(make_policy("dump"))) == frozenset()
