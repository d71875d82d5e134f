"""Oracle reference policies (`oracle_boundary`, `oracle_progress`) and the simulator's
measurement feed: choices against hand-computed ones, and a learning test."""

import itertools

import numpy as np
import pytest

from rlpace import Feedback, Pool, Scheduler
from rlpace.policies._oracle import distinct_values, expected_group_signal
from rlpace.sim import build_world, group_signal, make_scenario, oracle_kwargs, proposal_names, sigmoid, simulate


def _rows(rates, m=4):
    """rewards[len(rates), m] with exactly rate·m successes per row."""
    return [[1.0] * int(round(r * m)) + [0.0] * (m - int(round(r * m))) for r in rates]


def _boundary(n_pool=6, seed=0):
    s = Scheduler(Pool(["a"] * n_pool), "oracle_boundary", seed=seed)
    # pass rates 0.5, 1, 0.25, 0, 0.75; prompt 5 never measured (counts as 1/2)
    s.observe(Feedback([0, 1, 2, 3, 4], _rows([0.5, 1.0, 0.25, 0.0, 0.75]), step=0))
    return s


def test_boundary_picks_highest_learnability_hand_computed():
    s = _boundary()
    np.testing.assert_array_equal(s.states["selection"].pass_rate[:5], [0.5, 1.0, 0.25, 0.0, 0.75])
    assert np.isnan(s.states["selection"].pass_rate[5])
    # scores p(1 − p): [1/4, 0, 3/16, 0, 3/16, 1/4 (unmeasured)]
    assert sorted(s.propose(2).tolist()) == [0, 5]
    assert sorted(s.propose(4).tolist()) == [0, 2, 4, 5]
    # n > N: every prompt once, then the best again
    ids = s.propose(8).tolist()
    assert sorted(ids[:6]) == list(range(6)) and sorted(ids[6:]) == [0, 5]


def test_boundary_breaks_ties_at_the_cut_by_seeded_randomness():
    picks = set()
    for seed in range(20):
        a, b = _boundary(seed=seed), _boundary(seed=seed)
        ids = a.propose(3)
        np.testing.assert_array_equal(ids, b.propose(3))      # deterministic in (seed, step)
        assert {0, 5} <= set(ids.tolist())
        picks.add((set(ids.tolist()) - {0, 5}).pop())
    assert picks == {2, 4}                                    # the tie 3/16 goes either way


def test_boundary_latest_measurement_wins():
    s = _boundary()
    # prompt 0 twice in one batch: the last group (all wrong) wins; prompt 3 now at 1/2
    s.observe(Feedback([0, 3, 0], _rows([0.5, 0.5, 0.0]), step=1))
    np.testing.assert_array_equal(s.states["selection"].pass_rate[[0, 3]], [0.0, 0.5])
    assert sorted(s.propose(2).tolist()) == [3, 5]
    # an empty batch changes nothing
    before = s.states["selection"].pass_rate.copy()
    s.observe(Feedback(np.zeros(0, np.int64), np.zeros((0, 4)), step=2))
    np.testing.assert_array_equal(s.states["selection"].pass_rate, before)


def test_expected_group_signal_matches_enumeration():
    # independent reference: enumerate all 2^G outcomes, weight the learner's own group signal
    g = 4
    outcomes = np.array(list(itertools.product([0.0, 1.0], repeat=g)))          # [16, G]
    sig = group_signal(outcomes, np.ones_like(outcomes, bool), np.ones_like(outcomes))  # [16]
    k = outcomes.sum(axis=1)
    for p in (0.0, 0.1, 0.5, 0.83, 1.0):
        ref = float(np.sum(p ** k * (1 - p) ** (g - k) * sig))
        assert expected_group_signal(np.array([p]), g)[0] == pytest.approx(ref, abs=1e-12)


@pytest.mark.parametrize("case", ["grid", "half_and_grid", "off_grid", "shared_key", "nan", "signed_zero"])
def test_distinct_values_equal_np_unique(case):
    """The keyed dedup of measured rates gives np.unique's values and inverse (the grid
    k/m, m ≤ 16, and 1/2 of an unmeasured prompt), and falls back to it where the key could
    merge two values or cannot be formed (NaN); the oracle's group signal over the pool is
    the per-prompt one, element for element."""
    rng = np.random.default_rng(3)
    n = 5000
    p = {"grid": rng.integers(0, 17, n) / 16,
         "half_and_grid": np.where(rng.random(n) < 0.4, 0.5, rng.integers(0, 9, n) / 8),
         "off_grid": rng.integers(0, 4, n) / 3 + 1e-3 * (rng.random(n) < 0.01),
         "shared_key": np.where(rng.random(n) < 0.5, 0.25, 0.25 + 1e-12),   # one key, two values
         "nan": np.where(rng.random(n) < 0.1, np.nan, rng.integers(0, 17, n) / 16),
         "signed_zero": np.where(rng.random(n) < 0.5, -0.0, rng.integers(0, 5, n) / 4)}[case]
    u, inv = distinct_values(p)
    ru, rinv = np.unique(p, return_inverse=True)
    np.testing.assert_array_equal(u, ru)
    np.testing.assert_array_equal(inv.reshape(-1), rinv.reshape(-1))
    ok = ~np.isnan(p)
    each = np.array([expected_group_signal(np.array([v]), 16)[0] for v in p[ok]])
    np.testing.assert_array_equal(expected_group_signal(p, 16)[ok], each)


def test_progress_picks_domain_by_hand_computed_value():
    pool = Pool(["a", "a", "b", "b"])
    fb = Feedback([0, 1, 2, 3], _rows([0.5, 0.5, 0.25, 0.25]), step=0)
    # G = 2: E[signal] at p = 1/2 is 1/2·(2·¼/(½ + 1e-6)) ≈ 0.5, at p = ¼ it is 0.375·… ≈ 0.375;
    # slopes p(1 − p): a 0.25, b 0.1875. No transfer: value a = 0.125 > value b = 0.0703.
    s = Scheduler(pool, "oracle_progress", group_size=2)
    assert s.domain_probs().tolist() == [0.5, 0.5]            # nothing measured: all tie
    s.observe(fb)
    assert s.domain_probs().tolist() == [1.0, 0.0]
    # Transfer M[j, k] (signal in k moves skill j): b's signal moves a twice over.
    # value a = 0.5·(1·0.25) = 0.125; value b = 0.375·(2·0.25 + 1·0.1875) = 0.258 → b.
    s = Scheduler(pool, "oracle_progress", group_size=2, transfer=[[1.0, 2.0], [0.0, 1.0]])
    s.observe(fb)
    assert s.domain_probs().tolist() == [0.0, 1.0]
    with pytest.raises(ValueError, match="2 domains"):
        Scheduler(pool, "oracle_progress", transfer=np.eye(3))
    with pytest.raises(ValueError, match="group_size"):
        Scheduler(pool, "oracle_progress", group_size=0)


def test_oracle_kwargs_permutes_transfer_to_pool_order():
    sc = make_scenario("solved_majority", domains=("S3", "S1", "S2", "S0"), transfer_forward=0.5,
                       prompts_per_domain=20)
    m = np.asarray(oracle_kwargs(sc, "oracle_progress", 8)["transfer"])
    # pool order S0, S1, S2, S3; scenario indices S0 → 3, S1 → 1: M[S0, S1] = M_scen[3, 1] = 0.5²
    assert m[0, 1] == pytest.approx(0.25) and m[1, 0] == 0.0 and m[3, 1] == 0.0
    assert oracle_kwargs(sc, "oracle_boundary", 8) == {}


def test_oracles_not_in_proposal_lists():
    assert not any(n.startswith("oracle_") for n in proposal_names())


def test_sim_measurement_feed_and_first_choice():
    sc = make_scenario("ladder", prompts_per_domain=40)
    n_pool, b, g, m, steps = 12 * 40, 16, 8, 32, 5
    res = simulate(sc, "oracle_boundary", steps=steps, batch_size=b, group_size=g, eval_every=5,
                   measure_every=2, measure_rollouts=m)
    assert res.measurement_rollouts == 3 * n_pool * m          # steps 0, 2, 4
    assert int(res.rollouts[-1]) == steps * b * g              # measurement not charged
    # the first proposal, rebuilt by hand: true p at skill 0, quantised to 1/m
    world = build_world(sc)
    p = np.rint(sigmoid(-world.difficulty) * m) / m
    score = p * (1 - p)
    s = Scheduler(world.pool, "oracle_boundary", seed=0)
    s.observe(Feedback(np.arange(n_pool), (np.arange(m)[None, :] < np.rint(p * m)[:, None]).astype(float),
                       step=0))
    ids = s.propose(b)
    rest = np.setdiff1d(np.arange(n_pool), ids)
    assert len(set(ids.tolist())) == b and score[ids].min() >= score[rest].max()
    # sampled measurement: same count, other draws
    res2 = simulate(sc, "oracle_boundary", steps=2, batch_size=b, group_size=g, measure_every=1,
                    measure_rollouts=m, measure_exact=False)
    assert res2.measurement_rollouts == 2 * n_pool * m
    with pytest.raises(ValueError, match="measure_rollouts"):
        simulate(sc, "uniform", steps=1, measure_rollouts=0)


def test_oracle_boundary_learns_faster_than_uniform():
    sc = make_scenario("solved_majority", prompts_per_domain=500)
    kw = dict(steps=120, batch_size=32, group_size=8, eval_every=10)
    uni = simulate(sc, "uniform", **kw)
    ora = simulate(sc, "oracle_boundary", measure_every=1, **kw)
    # uniform spends ~90% of its rollouts on solved prompts; the oracle almost none (until
    # it has solved the open prompts too)
    assert ora.final_accuracy > uni.final_accuracy + 0.1
    assert ora.steps_to_target is not None and (uni.steps_to_target is None or ora.steps_to_target < uni.steps_to_target)
    assert ora.informative_fraction[:30].mean() > 0.9 > 0.3 > uni.informative_fraction[:30].mean()
