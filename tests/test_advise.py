"""rlpace.advise: the pilot record, the fitted learner, the prediction, the CLI's bad inputs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rlpace import Feedback
from rlpace.advise import (LearnerParams, PilotRecorder, fit_learner, pilot_from_run_dir, pilot_from_select,
                           predict, read_pilot)
from rlpace.errors import InputError
from rlpace.evaluation import cost_to_reach, gain_target
from rlpace.sim import build_world, make_scenario, simulate

pytest.importorskip("scipy")

# a 6-rung ladder: small enough for tests, the same learner family as the fit
SC = make_scenario("ladder", domains=tuple(f"L{i}" for i in range(6)),
                   base_accuracy=(0.9, 0.7, 0.45, 0.25, 0.1, 0.04), prompts_per_domain=300, lr=0.15,
                   transfer_forward=0.5)


def _pilot(tmp_path, steps=40, b=64, g=8, name="pilot.jsonl"):
    w = build_world(SC)
    path = tmp_path / name
    simulate(SC, "uniform", steps=steps, seed=0, batch_size=b, group_size=g, record=PilotRecorder(path, pool=w.pool))
    return path, w


def _pool_file(tmp_path, w, offset=0):
    path = tmp_path / f"pool{offset}.jsonl"
    with open(path, "w") as f:
        for i in range(len(w.pool)):
            f.write(json.dumps({"data_source": w.pool.domain_names[w.pool.domains[i]],
                                "extra_info": {"index": int(w.pool.ids[i]) + offset}}) + "\n")
    return path


def test_record_round_trip(tmp_path):
    w = build_world(SC)
    rec = PilotRecorder(tmp_path / "p.jsonl", pool=w.pool)
    r0 = np.array([[1.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    r1 = np.array([[1.0, 1.0, 0.5]])
    rec.write(Feedback([3, 5], r0, step=0), eval=0.25)
    rec.write(Feedback([7], r1, step=0), rollouts=9)            # a refill whose probes cost 6 more
    rec.write(Feedback([3], r1, step=1))
    p = read_pilot(tmp_path / "p.jsonl")
    assert p.prompt_ids.tolist() == [int(w.pool.ids[i]) for i in (3, 5, 7, 3)]
    assert p.step.tolist() == [0, 0, 0, 1]
    np.testing.assert_array_equal(p.rewards, np.vstack([r0, r1, r1]))
    assert p.step_rollouts == {0: 6 + 9, 1: 3} and p.rollouts == 18
    assert p.evals == [(0, 0, 0.25)]
    assert p.positions(w.pool).tolist() == [3, 5, 7, 3]
    assert p.batch_size == 2 and p.group_size == 3           # median groups per step: (3 + 1) / 2


def test_record_refuses_rewards_outside_range(tmp_path):
    rec = PilotRecorder(tmp_path / "p.jsonl", reward_range=(0.0, 1.0))
    with pytest.raises(InputError, match="reward_range"):
        rec.write(Feedback([0], [[1.0, 2.0]], step=0))
    assert len((tmp_path / "p.jsonl").read_text().splitlines()) == 1       # header only: nothing appended
    with open(tmp_path / "p.jsonl", "a") as f:                             # a hand-edited record
        f.write(json.dumps({"step": 0, "prompt_ids": [0], "rewards": [[1.0, -1.0]]}) + "\n")
    with pytest.raises(InputError, match="outside the declared reward_range"):
        read_pilot(tmp_path / "p.jsonl")


def test_a_ragged_pilot_round_trips_with_each_prompts_own_count(tmp_path):
    # a rollout-allocation policy's groups (N_i = 3, 0, 1, 2) are written trimmed to their sizes
    rec = PilotRecorder(tmp_path / "p.jsonl")
    rec.write(Feedback([0, 1, 2, 3], [[1.0, 0.0, 1.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]], step=0,
                       group_sizes=np.array([3, 0, 1, 2])))
    rec.write(Feedback([4, 5], [[1.0, 1.0], [0.0, 1.0]], step=1))                  # an even batch after it
    assert json.loads((tmp_path / "p.jsonl").read_text().splitlines()[1])["rewards"] == [[1, 0, 1], [], [1], [0, 1]]
    p = read_pilot(tmp_path / "p.jsonl")
    assert p.sizes.tolist() == p.group_sizes.tolist() == [3, 0, 1, 2, 2, 2]
    np.testing.assert_array_equal(p.rewards, [[1, 0, 1], [0, 0, 0], [1, 0, 0], [0, 1, 0], [1, 1, 0], [0, 1, 0]])
    assert p.valid.sum(axis=1).tolist() == [3, 0, 1, 2, 2, 2]
    assert p.step_rollouts == {0: 6, 1: 4} and p.rollouts == 10      # Σ N_i, not B·max N
    assert p.group_size == 2                                          # Σ N_i / M = 10 / 6, rounded
    assert read_pilot(_even(tmp_path)).sizes is None


def _even(tmp_path):
    rec = PilotRecorder(tmp_path / "even.jsonl")
    rec.write(Feedback([0, 1], [[1.0, 0.0], [0.0, 0.0]], step=0))
    return tmp_path / "even.jsonl"


def _ragged_pilot(tmp_path, steps=60, b=128, g=16, split=(0, 1, 2, 4, 13, 20, 36, 52)):
    """A uniform proposal with a fixed, data-independent ragged split of each step's B·G
    rollouts: N_i cycles through `split` (mean G)."""
    from rlpace import compose
    from rlpace.policies import make_policy
    from rlpace.policies._base import ALLOCATION, DataPolicy, EmptyState
    split = np.asarray(split)

    def apply(state, pool, ids, budget):
        n = np.resize(split, len(ids)).astype(np.int64)
        assert n.sum() == budget
        return n
    fixed = DataPolicy(ALLOCATION, lambda p: EmptyState(), lambda s, p, f: s, apply, name="fixed_split",
                       bounds=(0, 64))
    w = build_world(SC)
    path = tmp_path / "ragged.jsonl"
    simulate(SC, compose(make_policy("uniform"), fixed), steps=steps, seed=0, batch_size=b, group_size=g,
             record=PilotRecorder(path, pool=w.pool))
    return path, w


def test_fit_recovers_a_simulated_learner_from_a_ragged_pilot(tmp_path):
    """The same learner and tolerances as the even pilot's test, the pilot's groups of
    0, 1, 2, ..., 52 rollouts: the likelihood takes each prompt's own count."""
    path, w = _ragged_pilot(tmp_path)
    pilot = read_pilot(path)
    assert sorted(set(pilot.sizes.tolist())) == [0, 1, 2, 4, 13, 20, 36, 52]
    assert pilot.rollouts == 60 * 128 * 16 and pilot.group_size == 16
    fit = fit_learner(pilot, w.pool)
    mu, sd = fit.params.mu[w.pool_order], fit.params.sd[w.pool_order]
    assert abs(fit.params.lr - SC.lr) / SC.lr < 0.25, fit.params.lr
    assert abs(fit.params.tau - SC.transfer_forward) < 0.2, fit.params.tau
    np.testing.assert_allclose(mu, SC.difficulty_means(), atol=0.3)
    np.testing.assert_allclose(sd, 1.0, atol=0.3)
    assert fit.params.solved.max() < 0.1
    assert fit.rank[w.pool_order].tolist() == list(range(6))


def test_ragged_likelihood_equals_a_per_group_binomial_loop(tmp_path):
    """The fit's log likelihood at its MAP equals a plain loop over the pilot's groups: group m
    of n_m rollouts and w_m successes (n_m = 0 groups contribute nothing) has probability
    π·Bin(w; n, σ(s + 6)) + (1 − π)·mean_q Bin(w; n, σ(s − μ − σ z_q)), and the skill path is
    lr · M @ cumulative gain, the gain being each step's Σ mean|A| over each group's own N_i / B."""
    from scipy.special import ndtri
    from scipy.stats import binom
    from rlpace.advise import transfer_matrix
    path, w = _ragged_pilot(tmp_path, steps=12, b=32, g=8, split=(0, 1, 2, 3, 6, 10, 16, 26))
    pilot = read_pilot(path)
    fit = fit_learner(pilot, w.pool)
    p, pos = fit.params, pilot.positions(w.pool)
    z = ndtri((np.arange(24) + 0.5) / 24)
    steps = sorted(set(pilot.step.tolist()))
    k = w.pool.n_domains
    gain = np.zeros((len(steps), k))
    for m in range(len(pos)):                      # the signal: mean |A| (population std) over the own N_i
        n = int(pilot.sizes[m])
        r = (pilot.rewards[m, :n] >= 0.5).astype(float)
        if n and r.std() > 0:
            gain[steps.index(int(pilot.step[m])), w.pool.domains[pos[m]]] += np.abs((r - r.mean()) / (r.std() + 1e-6)
                                                                                      ).mean() / pilot.batch_size
    cum = np.vstack([np.zeros(k), np.cumsum(gain, axis=0)])
    skill = p.lr * cum @ transfer_matrix(fit.rank, p.tau, p.omega).T
    ll = 0.0
    for m in range(len(pos)):
        n = int(pilot.sizes[m])
        if n == 0:
            continue
        wins = int((pilot.rewards[m, :n] >= 0.5).sum())
        d = w.pool.domains[pos[m]]
        s = skill[steps.index(int(pilot.step[m])), d]
        prob = (p.solved[d] * binom.pmf(wins, n, 1 / (1 + np.exp(-(s + 6))))
                + (1 - p.solved[d]) * np.mean(binom.pmf(wins, n, 1 / (1 + np.exp(-(s - p.mu[d] - p.sd[d] * z))))))
        ll += np.log(prob)
    assert fit.log_lik == pytest.approx(ll, rel=1e-4)


def test_select_manifest_is_a_profile(tmp_path):
    man = {"prompts": [{"id": 4, "pass_rate": 0.25, "n_samples": 8}, {"id": 9, "pass_rate": 1.0, "n_samples": 8},
                       {"id": 2, "pass_rate": None, "n_samples": 8}]}
    (tmp_path / "m.json").write_text(json.dumps(man))
    p = pilot_from_select(tmp_path / "m.json")
    assert p.kind == "profile" and p.prompt_ids.tolist() == [4, 9]
    assert p.rewards.sum(axis=1).tolist() == [2.0, 8.0] and p.rollouts == 16


def test_run_dir_without_group_rewards_is_refused(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 0, "prompt_ids": [1, 2], "reward_mean": 0.5}) + "\n")
    with pytest.raises(InputError, match="not one reward per rollout"):
        pilot_from_run_dir(tmp_path)


def test_fit_recovers_a_simulated_learner(tmp_path):
    path, w = _pilot(tmp_path, steps=60, b=128, g=16)
    fit = fit_learner(read_pilot(path), w.pool)
    mu = fit.params.mu[w.pool_order]                     # pool code order -> scenario order
    sd = fit.params.sd[w.pool_order]
    # tolerances: 3-4 Laplace standard errors at this pilot size (60 steps × 128 × 16)
    assert abs(fit.params.lr - SC.lr) / SC.lr < 0.25, fit.params.lr
    assert abs(fit.params.tau - SC.transfer_forward) < 0.2, fit.params.tau
    np.testing.assert_allclose(mu, SC.difficulty_means(), atol=0.3)
    np.testing.assert_allclose(sd, 1.0, atol=0.3)
    assert fit.params.solved.max() < 0.1                 # no solved share in this scenario
    assert fit.rank[w.pool_order].tolist() == list(range(6))       # the curriculum order: easiest first
    assert fit.identifiable_dynamics


def _fit_at_truth(tmp_path):
    """(fit, world): a 20-step pilot's fit with its parameters set to the scenario's true
    learner and no fit noise (one draw is the truth)."""
    path, w = _pilot(tmp_path, steps=20, b=64, g=8)
    fit = fit_learner(read_pilot(path), w.pool)
    k = len(SC.domains)
    inv = np.argsort(w.pool_order)                       # scenario index of each pool code
    truth = LearnerParams(SC.difficulty_means()[inv], np.ones(k), np.full(k, 1e-9), SC.lr, SC.transfer_forward)
    return fit._replace(params=truth, cov=np.eye(fit.theta.size) * 1e-12, rank=inv.astype(np.int64)), w  # code -> rung


def test_prediction_on_the_true_learner_matches_direct_simulation(tmp_path):
    """Given the true parameters (one draw, no fit noise), the predicted ratio of dump to
    uniform equals the one measured on the scenario's own world within seed noise."""
    fit, w = _fit_at_truth(tmp_path)
    steps, b, g = 150, 64, 8
    pr = predict(fit, w.pool, budget_rollouts=steps * b * g, pilot_rollouts=0, policies=["dump"], draws=1,
                 seeds=3, from_start=True)
    direct = []
    for s in range(3):
        cu = simulate(SC, "uniform", steps=steps, seed=s, batch_size=b, group_size=g, eval_every=6)
        cd = simulate(SC, "dump", steps=steps, seed=s, batch_size=b, group_size=g, eval_every=6)
        tgt = gain_target(cu.mean_accuracy[0], cu.mean_accuracy[-1])
        direct.append((cost_to_reach(cd.eval_rollouts, cd.mean_accuracy, tgt)[0],
                       cost_to_reach(cu.eval_rollouts, cu.mean_accuracy, tgt)[0]))
    direct_ratio = np.mean([a for a, _ in direct]) / np.mean([u for _, u in direct])
    dump = pr.policies[0]
    assert dump.policy == "dump"
    assert abs(dump.ratio - direct_ratio) < 0.08, (dump.ratio, direct_ratio)
    assert direct_ratio < 0.9                            # the scenario has a saving to predict


def test_allocation_policies_are_candidates_with_the_oracle_allocation_as_their_headroom(tmp_path):
    """knapsack and recommended+knapsack are in the default candidates; predicted on the true
    learner (as the dump test above) their ratios match a direct simulation of the scenario
    within seed noise, and the oracle allocation runs beside them as a headroom row of its own."""
    from rlpace.advise import default_candidates
    cands = default_candidates()
    assert {"knapsack", "vip", "recommended+knapsack"} <= set(cands) and "oracle_allocation" not in cands
    fit, w = _fit_at_truth(tmp_path)
    steps, b, g = 120, 64, 8
    pols = ["knapsack", "recommended+knapsack"]
    pr = predict(fit, w.pool, budget_rollouts=steps * b * g, pilot_rollouts=0, policies=pols, draws=1, seeds=2,
                 from_start=True)
    assert set(pr.oracles) == {"oracle_boundary", "oracle_progress", "oracle_allocation"}
    assert np.isfinite(pr.oracles["oracle_allocation"].ratio)
    got = {p.policy: p.ratio for p in pr.policies}
    assert set(got) == set(pols)
    for pol in pols:
        direct = []
        for s in range(2):
            cu = simulate(SC, "uniform", steps=steps, seed=s, batch_size=b, group_size=g, eval_every=5)
            ca = simulate(SC, pol, steps=steps, seed=s, batch_size=b, group_size=g, eval_every=5)
            assert int(ca.rollouts[-1]) == steps * b * g                   # Σ N_i = B·G every step
            tgt = gain_target(cu.mean_accuracy[0], cu.mean_accuracy[-1])
            direct.append((cost_to_reach(ca.eval_rollouts, ca.mean_accuracy, tgt)[0],
                           cost_to_reach(cu.eval_rollouts, cu.mean_accuracy, tgt)[0]))
        ratio = np.mean([a for a, _ in direct]) / np.mean([u for _, u in direct])
        assert abs(got[pol] - ratio) < 0.08, (pol, got[pol], ratio)


def _cli(argv, capsys):
    from rlpace.cli import main
    rc = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    return rc, [ln for ln in err if not ln.startswith("rlpace advise: draw")]


def test_cli_bad_inputs(tmp_path, capsys):
    path, w = _pilot(tmp_path, steps=12, b=32, g=4)
    pool = _pool_file(tmp_path, w)
    out = tmp_path / "out"
    base = ["advise", "--pilot", str(path), "--pool", str(pool), "--out", str(out), "--policies", "dump"]
    # a pilot of another pool
    rc, err = _cli(base[:4] + [str(_pool_file(tmp_path, w, offset=10_000))] + base[5:] + ["--budget-rollouts", "99999"],
                   capsys)
    assert rc == 2 and len(err) == 1 and "another pool" in err[0]
    # too short: 5 steps of the required 10 → "5 more steps"
    short, _ = _pilot(tmp_path, steps=5, b=32, g=4, name="short.jsonl")
    rc, err = _cli(["advise", "--pilot", str(short)] + base[3:] + ["--budget-rollouts", "99999"], capsys)
    assert rc == 2 and len(err) == 1 and "run 5 more steps" in err[0]
    # rewards outside the declared range
    bad = tmp_path / "bad.jsonl"
    lines = path.read_text().splitlines()
    rec = json.loads(lines[3])
    rec["rewards"][0][0] = 1.5
    bad.write_text("\n".join(lines[:3] + [json.dumps(rec)] + lines[4:]) + "\n")
    rc, err = _cli(["advise", "--pilot", str(bad)] + base[3:] + ["--budget-rollouts", "99999"], capsys)
    assert rc == 2 and len(err) == 1 and "reward_range" in err[0] and "line 4" in err[0]
    # a budget not larger than the pilot (12 steps × 32 × 4 = 1536 rollouts)
    rc, err = _cli(base + ["--budget-rollouts", "1536"], capsys)
    assert rc == 2 and len(err) == 1 and "1536" in err[0] and "not larger" in err[0]
    # a saving level outside (0, 1]
    rc, err = _cli(base + ["--budget-rollouts", "99999", "--saving-level", "1.5"], capsys)
    assert rc == 2 and len(err) == 1 and "--saving-level" in err[0] and "(0, 1]" in err[0]
    assert not out.exists()                              # nothing written on any bad input


def test_cli_writes_advice(tmp_path, capsys):
    path, w = _pilot(tmp_path, steps=12, b=32, g=4)
    pool = _pool_file(tmp_path, w)
    from rlpace.cli import main
    rc = main(["advise", "--pilot", str(path), "--pool", str(pool), "--budget-rollouts", str(12 * 128 * 6),
               "--policies", "dump", "--draws", "2", "--out", str(tmp_path / "o")])
    text = capsys.readouterr().out
    assert rc == 0
    adv = json.loads((tmp_path / "o" / "advice.json").read_text())
    assert adv["pilot_rollouts"] == 12 * 128 and adv["simulated_steps"] == 5 * 12 * 128 // 128
    assert [p["policy"] for p in adv["policies"]] == ["dump"] and len(adv["policies"][0]["ratio_per_draw"]) == 2
    assert adv["sentence"] in text and "rlpace train policy=" in text
    assert "<svg" in (tmp_path / "o" / "advice.html").read_text()


def test_signal_step_norm_gives_every_informative_step_the_same_size():
    """step_norm="signal": one domain, one step with any signal → skill = lr exactly."""
    from rlpace.sim import heldout_accuracy
    sc = make_scenario("homogeneous", prompts_per_domain=400, lr=0.3)
    w = build_world(sc)
    res = simulate(sc, "uniform", steps=1, batch_size=32, group_size=8, step_norm="signal")
    assert res.informative_fraction[0] > 0
    np.testing.assert_allclose(res.accuracy[-1], heldout_accuracy(np.array([0.3]), w.heldout), rtol=1e-12)
    with pytest.raises(InputError, match="step_norm"):
        simulate(sc, "uniform", steps=1, batch_size=8, group_size=4, step_norm="adam")


def test_expected_group_signal_equals_the_binomial_sum_per_prompt():
    """The oracles' expected group signal (summed over k with running products, the hot path of
    advise's predictions) equals the binomial sum written out per prompt."""
    import math
    from rlpace.policies._oracle import expected_group_signal

    def by_hand(p, g, eps=1e-6):
        return sum(math.comb(g, k) * p ** k * (1 - p) ** (g - k) * 2 * (k / g) * (1 - k / g)
                   / (math.sqrt((k / g) * (1 - k / g)) + eps) for k in range(g + 1))

    p = np.concatenate([[0.0, 1.0, 0.5, 1e-9], np.random.default_rng(3).random(200)])
    for g in (2, 3, 8, 16):
        got = expected_group_signal(p, g)
        assert np.allclose(got, [by_hand(x, g) for x in p], rtol=0, atol=1e-14)
    # any shape; G = 2, p = 1/2: k = 1 with probability 1/2, signal 2·¼/(½ + 1e-6)
    assert np.allclose(expected_group_signal(np.full((2, 3), 0.5), 2), 0.25 / (0.5 + 1e-6), rtol=0, atol=1e-15)


# ---- the faster prediction, the model's error, the evaluation mode, the second family ---------------------------

def _sc_fit(tmp_path, steps=30, b=64, g=8):
    path, w = _pilot(tmp_path, steps=steps, b=b, g=g)
    pilot = read_pilot(path)
    return pilot, fit_learner(pilot, w.pool), w


def test_screening_keeps_the_survivors_numbers_exactly(tmp_path):
    """A candidate kept after the screening draws has the very ratios of a run without screening
    (each draw's worlds and seeds do not depend on what else runs); a dropped one reports its
    screening draws, and was at least SCREEN_MARGIN worse than the best on each of them."""
    from rlpace.advise._predict import SCREEN_MARGIN
    _, fit, w = _sc_fit(tmp_path)
    kw = dict(budget_rollouts=120 * 64 * 8, pilot_rollouts=0, policies=["dump", "mopps", "success_band", "recommended"],
              draws=4, from_start=True)
    full = predict(fit, w.pool, screen=0, **kw)
    fast = predict(fit, w.pool, screen=2, **kw)
    by_full = {p.policy: p for p in full.policies}
    by_fast = {p.policy: p for p in fast.policies}
    assert by_fast["success_band"].screened_out and not by_full["success_band"].screened_out
    for name, p in by_fast.items():
        if p.screened_out:
            np.testing.assert_array_equal(p.ratios, by_full[name].ratios[:2])
            best_worst = min(max(q.ratios[:2]) for q in full.policies)
            assert min(p.ratios) > best_worst + SCREEN_MARGIN
        else:
            np.testing.assert_array_equal(p.ratios, by_full[name].ratios)
            assert (p.ratio, p.low, p.high) == (by_full[name].ratio, by_full[name].low, by_full[name].high)
    np.testing.assert_array_equal(fast.oracle.ratios, full.oracle.ratios)
    assert [p.policy for p in fast.policies if not p.screened_out] == [p.policy for p in full.policies
                                                                       if p.policy in by_fast
                                                                       and not by_fast[p.policy].screened_out]


def test_survivors_by_hand():
    from rlpace.advise._predict import survivors
    # best worst-case: a's 0.6 → bar 0.7; b's best 0.65 ≤ 0.7 stays; c's best 0.75 goes
    assert survivors({"a": np.array([0.5, 0.6]), "b": np.array([0.65, 0.9]), "c": np.array([0.75, 0.8])}) == ["a", "b"]
    assert survivors({"a": np.array([1.0, 1.0]), "b": np.array([1.1, 1.3])}, margin=0.1) == ["a", "b"]
    assert survivors({"a": np.array([1.0, 1.0]), "b": np.array([1.11, 1.3])}, margin=0.1) == ["a"]


def test_expected_group_signal_on_a_large_measured_pool_equals_the_direct_sum():
    """The oracles' per-distinct-value path (taken for a large pool of measured rates) gives the
    numbers of the direct running-product sum, to the last bit of a per-element evaluation."""
    from rlpace.policies._oracle import expected_group_signal
    rng = np.random.default_rng(0)
    p = rng.integers(0, 17, 100_000) / 16.0
    p[rng.random(p.size) < 0.3] = 0.5                       # unmeasured prompts
    fast = expected_group_signal(p, 16)
    direct = np.concatenate([expected_group_signal(c, 16) for c in np.array_split(p, 200)])   # 500 < 64·17 each
    np.testing.assert_allclose(fast, direct, rtol=0, atol=1e-15)


def test_greedy_accuracy_is_read_back_from_the_sampled_one():
    from rlpace.advise._fit import eval_accuracy, greedy_from_sampled
    held = np.array([[-1.0, 0.0, 1.0], [-6.0, 2.0, 3.0]])
    skill = np.array([[0.5, -2.0], [1.5, 2.5]])                                     # [E = 2, K = 2]
    sampled = eval_accuracy(skill, held, "sampled")
    sig = lambda x: 1 / (1 + np.exp(-x))                                            # noqa: E731
    assert sampled[0, 0] == pytest.approx((sig(1.5) + sig(0.5) + sig(-0.5)) / 3, abs=1e-15)
    # greedy: s > d — 0.5 beats −1 and 0 (2/3); −2 beats −6 (1/3); 1.5 beats all three; 2.5 beats −6 and 2
    want = np.array([[2 / 3, 1 / 3], [1.0, 2 / 3]])
    np.testing.assert_allclose(eval_accuracy(skill, held, "greedy"), want, rtol=0, atol=1e-15)
    np.testing.assert_allclose(greedy_from_sampled(sampled, held), want, rtol=0, atol=1e-15)


def test_the_pilots_own_evaluations_choose_the_eval_mode(tmp_path):
    """A simulator pilot records the mean pass rate: "sampled" predicts it better. The same
    pilot with greedy evaluations of the same learner (the true world's held-out set at the
    same skills): "greedy" does."""
    from rlpace.advise._fit import greedy_from_sampled, predicted_evals
    w = build_world(SC)
    res = simulate(SC, "uniform", steps=40, seed=0, batch_size=64, group_size=8, eval_every=10,
                   record=PilotRecorder(tmp_path / "p.jsonl", pool=w.pool))
    pilot = read_pilot(tmp_path / "p.jsonl")
    fit = fit_learner(pilot, w.pool)
    assert [e[0] for e in pilot.evals] == res.eval_step[:-1].tolist() == [0, 10, 20, 30]   # each before a step
    assert predicted_evals(pilot, fit)["choice"] == "sampled"
    greedy = greedy_from_sampled(res.accuracy, w.heldout).mean(axis=1)[:-1]          # [E] true greedy accuracy
    assert np.abs(greedy - res.mean_accuracy[:-1]).sum() > 0.03                       # the two modes differ here
    gp = pilot._replace(evals=[(t, r, float(a)) for (t, r, _), a in zip(pilot.evals, greedy)])
    check = predicted_evals(gp, fit)
    assert check["choice"] == "greedy" and check["sse_greedy"] < check["sse_sampled"]


def test_model_error_is_small_in_family_and_large_when_domains_learn_at_their_own_rates(tmp_path):
    """The held-out prediction inside the pilot: a learner of the fitted family predicts its own
    second half (sd of the per-domain log rate ≤ 0.25); one whose domains learn at 3× and ⅓×
    the common rate in turn (outside the family: one lr for all) does not (≥ 0.5)."""
    from rlpace.advise._fit import rate_discrepancy
    from rlpace.sim import World
    w = build_world(SC)
    out = {}
    for name, rate in (("in", np.ones(6)), ("out", np.array([3.0, 1 / 3, 3.0, 1 / 3, 3.0, 1 / 3]))):
        wr = World(w.pool, w.difficulty, w.domain, w.pool_order, w.heldout, rate[:, None] * w.transfer)
        path = tmp_path / f"{name}.jsonl"
        simulate(SC, "uniform", steps=40, seed=0, batch_size=128, group_size=8, world=wr,
                 record=PilotRecorder(path, pool=w.pool))
        pilot = read_pilot(path)
        out[name] = rate_discrepancy(pilot, w.pool, fit_learner(pilot, w.pool))
    assert out["in"].sd_log_rate <= 0.25, out["in"]
    assert out["out"].sd_log_rate >= 0.5, out["out"]
    assert out["in"].split_step == 20


def test_fit_recovers_a_shared_transfer(tmp_path):
    """ω, the transfer to every domain, is recovered from a learner that has it (true 0.3), and
    stays near 0 for one that has not."""
    from rlpace.advise import transfer_matrix
    from rlpace.sim import World
    w = build_world(SC)
    m = transfer_matrix(np.arange(6), SC.transfer_forward, 0.3)                      # scenario order = rung order
    got = {}
    for name, tr in (("shared", m), ("none", w.transfer)):
        path = tmp_path / f"{name}.jsonl"
        simulate(SC, "uniform", steps=60, seed=0, batch_size=128, group_size=16, record=PilotRecorder(path, pool=w.pool),
                 world=World(w.pool, w.difficulty, w.domain, w.pool_order, w.heldout, tr))
        got[name] = fit_learner(read_pilot(path), w.pool).params
    assert abs(got["shared"].omega - 0.3) < 0.1, got["shared"]
    assert got["none"].omega < 0.1, got["none"]
    np.testing.assert_allclose(m[:2, :2], [[1.0, 0.3], [0.8, 1.0]])


def test_mixture_weighs_the_step_laws_by_simulated_pilots_and_spans_both(tmp_path):
    """advise(step_norm="mixture"): the weight of the second step law is the calibrated one
    (Δ's simulated distribution under each law), the draws are split half and half when both
    keep weight ≥ TAIL, and every interval is the hull of the two laws' own 5–95 % intervals."""
    from rlpace.advise import advise
    from rlpace.advise._laws import TAIL, calibrated_weight, draw_interval, stratified_draws
    pilot, _, w = _sc_fit(tmp_path)
    fb, fs = fit_learner(pilot, w.pool, step_norm="batch"), fit_learner(pilot, w.pool, step_norm="signal")
    adv = advise(pilot, w.pool, budget_rollouts=80 * 64 * 8, policies=["dump"], draws=5, from_start=True,
                 step_norm="mixture", model_error=False, law_replicates=3)
    cal = adv.alternative["calibration"]
    assert cal["delta_log_lik"] == pytest.approx(fs.log_lik - fb.log_lik, abs=1e-9)
    w_signal = calibrated_weight(cal["delta_log_lik"], np.array(cal["delta_simulated_under_a"]),
                                 np.array(cal["delta_simulated_under_b"]))
    assert cal["weight"] == pytest.approx(w_signal, rel=1e-12)
    top = "signal" if w_signal >= 0.5 else "batch"
    assert adv.fit.step_norm == top and adv.alternative["step_norm"] != top
    assert adv.alternative["weight"] == pytest.approx(min(w_signal, 1 - w_signal), rel=1e-12)
    n_alt = stratified_draws(5, adv.alternative["weight"])
    assert adv.alternative["draws"] == adv.prediction.alternative_draws == n_alt
    assert n_alt == (0 if adv.alternative["weight"] < TAIL else 2)
    for p in [adv.prediction.oracle, *adv.prediction.policies]:
        r = p.ratios
        assert r.shape == (5,)
        if n_alt:
            (lm, hm), (la, ha) = draw_interval(r[:5 - n_alt]), draw_interval(r[5 - n_alt:])
            assert (p.low, p.high) == (pytest.approx(min(lm, la), abs=1e-12), pytest.approx(max(hm, ha), abs=1e-12))



# ---- two step laws: the calibrated weight and the interval that spans both ------------------
def test_calibrated_weight_by_hand():
    """P(a | Δ) from Δ's simulated distribution under each law: N(m_a, s²) vs N(m_b, s²), s² pooled."""
    from rlpace.advise._laws import calibrated_weight
    # m_a = 1, m_b = −1, s² = (2 + 2)/2 = 2: log LR at Δ = 1 is ((1 + 1)² − 0)/(2·2) = 1
    assert calibrated_weight(1.0, np.array([0.0, 2.0]), np.array([-2.0, 0.0])) == pytest.approx(1 / (1 + np.exp(-1.0)))
    # at Δ = 0 (half-way) the odds stay even, and under one law of Δ for both any Δ leaves them even
    assert calibrated_weight(0.0, np.array([0.0, 2.0]), np.array([-2.0, 0.0])) == pytest.approx(0.5)
    assert calibrated_weight(5.0, np.array([-1.0, 1.0, 0.5]), np.array([-1.0, 1.0, 0.5])) == pytest.approx(0.5)
    # m_a = 3, m_b = 0, s² = 0.5: at Δ = 3, log LR = (9 − 0)/1 = 9
    assert calibrated_weight(3.0, np.array([2.5, 3.5]), np.array([-0.5, 0.5])) == pytest.approx(1 / (1 + np.exp(-9.0)))
    with pytest.raises(InputError):
        calibrated_weight(1.0, np.array([1.0]), np.array([0.0, 1.0]))


def test_draw_interval_is_the_normal_prediction_interval_by_hand():
    """One more draw's 90 % interval from n draws, on the log scale: mean ± t(0.95, n − 1)·sd·√(1 + 1/n)."""
    from rlpace.advise._laws import draw_interval
    # log draws −1, 0, 1: mean 0, sd 1, t(0.95, 2) = 2.919986, √(4/3): half-width 3.371709
    lo, hi = draw_interval(np.exp(np.array([-1.0, 0.0, 1.0])))
    assert (np.log(lo), np.log(hi)) == (pytest.approx(-2.919986 * np.sqrt(4 / 3), abs=1e-5),
                                        pytest.approx(2.919986 * np.sqrt(4 / 3), abs=1e-5))
    # log draws 0, 0.2, 0.4, 0.6: mean 0.3, sd 0.258199, t(0.95, 3) = 2.353363, √(5/4)
    h = 2.353363 * 0.2581989 * np.sqrt(1.25)
    lo, hi = draw_interval(np.exp(np.array([0.0, 0.2, 0.4, 0.6])))
    assert (lo, hi) == (pytest.approx(np.exp(0.3 - h), rel=1e-5), pytest.approx(np.exp(0.3 + h), rel=1e-5))
    # wider than the empirical 5th–95th percentiles of the same draws, which the earlier code reported
    assert lo < np.exp(np.quantile([0.0, 0.2, 0.4, 0.6], 0.05)) and hi > np.exp(np.quantile([0.0, 0.2, 0.4, 0.6], 0.95))
    assert draw_interval(np.array([0.7])) == (0.7, 0.7)


def test_two_law_summary_is_the_hand_computed_mixture():
    """Four draws of each law, the second law's weight ¼: each of its draws weighs 1/16, each
    of the first law's 3/16. Sorted: 0.4 0.5 0.6 0.7 (second law) 0.8 0.9 1.0 1.1; midpoints
    of the cumulative weight 1/32, 3/32, 5/32, 7/32, 11/32, 17/32, 23/32, 29/32. Median: 0.8 +
    0.1·(16/32 − 11/32)/(6/32) = 0.8833; interval: the hull of the laws' own 90 % intervals,
    [min(low₁, low₂), max(high₁, high₂)]; P(ratio < 0.9) = 4/16 + 3/16 = 0.4375."""
    from scipy.stats import t
    from rlpace.advise._laws import mixture_summary, stratified_draws

    def by_hand(x):                                      # the normal prediction interval on log x
        lx = np.log(x)
        h = t.ppf(0.95, lx.size - 1) * lx.std(ddof=1) * np.sqrt(1 + 1 / lx.size)
        return np.exp(lx.mean() - h), np.exp(lx.mean() + h)
    r = np.array([1.0, 0.9, 1.1, 0.8, 0.5, 0.6, 0.7, 0.4])
    alt = np.arange(8) >= 4
    mid, lo, hi, ps = mixture_summary(r, alt, 0.25)
    (l1, h1), (l2, h2) = by_hand(r[:4]), by_hand(r[4:])
    assert mid == pytest.approx(0.8 + 0.1 * 5 / 6)
    assert (lo, hi) == (pytest.approx(min(l1, l2)), pytest.approx(max(h1, h2)))
    assert (lo, hi) == (pytest.approx(l2), pytest.approx(h1))   # the second law's low end, the first's high
    assert ps == pytest.approx(0.4375)
    # one law only: numpy's median and that law's own interval
    assert mixture_summary(r[:4], np.zeros(4, bool), 0.3) == (pytest.approx(0.95), pytest.approx(l1),
                                                               pytest.approx(h1), 0.25)
    assert [stratified_draws(8, w) for w in (0.0, 0.049, 0.05, 0.5)] == [0, 0, 4, 4]


def test_predict_gives_the_hull_of_the_two_laws_intervals(tmp_path):
    """predict(alternative=(fit, n, weight)): every policy's interval is the hull of the two
    laws' own percentiles and its point the weighted median (the earlier code pooled the 8
    draws into one set of percentiles, which a 1-nat likelihood difference tipped)."""
    from rlpace.advise._laws import draw_interval, mixture_summary
    pilot, fb, w = _sc_fit(tmp_path)
    fs = fit_learner(pilot, w.pool, step_norm="signal")
    pr = predict(fb, w.pool, budget_rollouts=60 * 64 * 8, pilot_rollouts=0, policies=["dump"], draws=4,
                 from_start=True, alternative=(fs, 2, 0.3))
    assert pr.alternative_draws == 2
    for p in [pr.oracle, *pr.policies]:
        r = p.ratios
        expect = mixture_summary(r, np.array([False, False, True, True]), 0.3)
        assert (p.ratio, p.low, p.high, p.p_saving) == pytest.approx(expect, abs=1e-12)
        (lm, hm), (la, ha) = draw_interval(r[:2]), draw_interval(r[2:])
        assert (p.low, p.high) == (pytest.approx(min(lm, la), abs=1e-12), pytest.approx(max(hm, ha), abs=1e-12))


def test_pilots_simulated_from_a_law_are_fitted_back_to_it(tmp_path):
    """`simulate_pilot` draws a uniform pilot of the fit's own shape from its MAP learner: the
    batch law fitted to it recovers that learner's lr (within a third: a 30-step pilot of
    64 × 8) and the calibration's differences come from fits of both laws to such pilots."""
    from rlpace.advise._laws import law_weight, simulate_pilot
    pilot, fb, w = _sc_fit(tmp_path)
    sim = simulate_pilot(fb, w.pool, seed=3)
    assert sim.rewards.shape == (fb.n_steps * fb.batch_size, fb.group_size)
    assert len(sim.steps) == fb.n_steps and sim.batch_size == fb.batch_size
    assert sim.rollouts == fb.n_steps * fb.batch_size * fb.group_size
    again = fit_learner(sim, w.pool, step_norm="batch")
    assert abs(np.log(again.params.lr / fb.params.lr)) < np.log(1.35), (again.params.lr, fb.params.lr)
    fs = fit_learner(pilot, w.pool, step_norm="signal")
    lw = law_weight(fs, fb, w.pool, replicates=2, seed=5)
    first = simulate_pilot(fs, w.pool, seed=5 * 1000)
    d0 = (fit_learner(first, w.pool, step_norm="signal").log_lik - fit_learner(first, w.pool, step_norm="batch").log_lik)
    assert lw.delta_under_a[0] == pytest.approx(d0, abs=1e-9)
    assert lw.delta == pytest.approx(fs.log_lik - fb.log_lik, abs=1e-12)



def test_law_calibration_in_worker_processes_gives_the_same_differences(tmp_path):
    """`law_weight(jobs=2)` runs the replicates in two processes: every simulated pilot keeps
    its own seed, so the differences and the weight are those of the serial loop, bit for bit."""
    from rlpace.advise._laws import law_weight
    pilot, fb, w = _sc_fit(tmp_path)
    fs = fit_learner(pilot, w.pool, step_norm="signal")
    one, two = (law_weight(fs, fb, w.pool, replicates=2, seed=1, jobs=j) for j in (1, 2))
    assert two.delta_under_a.tolist() == one.delta_under_a.tolist()
    assert two.delta_under_b.tolist() == one.delta_under_b.tolist()
    assert (two.weight_a, two.delta) == (one.weight_a, one.delta)

def test_policies_the_simulator_cannot_feed_are_not_ranked(tmp_path):
    """A policy that learns from a signal the simulator does not produce (epiplexity: held-out
    loss curves; dvc: gradients) is not simulated: no ratio, marked with the missing signal,
    listed after every ranked candidate and never the advice."""
    from rlpace.advise import advise
    pilot, fit, w = _sc_fit(tmp_path)
    pr = predict(fit, w.pool, budget_rollouts=60 * 64 * 8, pilot_rollouts=0, policies=["epiplexity", "dump", "dvc"],
                 draws=2, from_start=True)
    assert [p.policy for p in pr.policies] == ["dump", "epiplexity", "dvc"]
    assert [p.not_modelled for p in pr.policies] == ["", "held-out loss curves", "grads, ref_grad"]
    assert all(np.isnan(p.ratio) and p.ratios.size == 0 for p in pr.policies[1:])
    assert np.isfinite(pr.policies[0].ratio)
    adv = advise(pilot, w.pool, budget_rollouts=60 * 64 * 8, policies=["epiplexity"], draws=2, from_start=True,
                 step_norm="batch", model_error=False)
    assert adv.recommended is None
    assert adv.sentence.startswith("no expected saving: headroom") or "no candidate the simulator can model" in adv.sentence
    assert "not modelled" in adv.table()
    assert adv.to_json()["policies"][0]["not_modelled"] == "held-out loss curves"


def test_measurement_interval_by_hand():
    """The interval for an M-seed measurement from draws of S seeds each: on the log scale,
    mean ± t(0.95, n − 1)·√(max(s² − v̂/S, 0) + v̂/M + s²/n); M = S is the plain interval."""
    from rlpace.advise._laws import draw_interval, pooled_seed_var, seed_terms
    # terms of one draw: costs (1, 3) against uniform's (2, 2): 1/2 − 1, 3/2 − 1
    assert seed_terms(np.array([[1.0, 3.0]]), np.array([[2.0, 2.0]])).tolist() == [[-0.5, 0.5]]
    # two draws of two seeds: (0.25 + 0.25 + 0.01 + 0.01) / (2 · 1) = 0.26
    assert pooled_seed_var(np.array([[-0.5, 0.5], [0.1, -0.1]])) == pytest.approx(0.26)
    assert pooled_seed_var(np.array([[0.3], [0.1]])) == 0.0          # one seed: nothing to separate
    # log draws −1, 0, 1: s² = 1, n = 3; v̂ = 1.6, S = 2: τ̂² = 1 − 0.8 = 0.2; M = 8: v̂/M = 0.2
    x = np.exp(np.array([-1.0, 0.0, 1.0]))
    lo, hi = draw_interval(x, seed_var=1.6, seeds=2, measurement_seeds=8)
    h = 2.919986 * np.sqrt(0.2 + 0.2 + 1 / 3)
    assert (np.log(lo), np.log(hi)) == (pytest.approx(-h, abs=1e-5), pytest.approx(h, abs=1e-5))
    # v̂/S above s²: τ̂² floors at 0; v̂ = 4, S = 2, M = 8: 0 + 0.5 + 1/3
    lo, hi = draw_interval(x, seed_var=4.0, seeds=2, measurement_seeds=8)
    assert np.log(hi) == pytest.approx(2.919986 * np.sqrt(0.5 + 1 / 3), abs=1e-5)
    assert draw_interval(x, seed_var=1.6, seeds=2, measurement_seeds=2) == draw_interval(x)


def test_predicted_interval_holds_an_eight_seed_measurement_of_a_known_learner(tmp_path):
    """On the true learner (no fit noise), `measurement_seeds=8` makes the 90 % interval the one
    for what an 8-seed paired measurement reads: the seed variance v̂ read within the draws
    matches a direct simulation's (independent loop, a fresh world per seed, as each predicted
    seed draws one), every direct 8-seed measurement lies inside, and the interval is narrower
    than the plain one, which holds a measurement over the draws' own 3 seeds."""
    import dataclasses

    from scipy.stats import t
    fit, w = _fit_at_truth(tmp_path)
    steps, b, g, draws, seeds = 80, 64, 8, 4, 3
    kw = dict(budget_rollouts=steps * b * g, pilot_rollouts=0, policies=["dump"], draws=draws, seeds=seeds,
              from_start=True)
    m8 = predict(fit, w.pool, measurement_seeds=8, **kw).policies[0]
    plain = predict(fit, w.pool, **kw).policies[0]
    np.testing.assert_array_equal(m8.ratios, plain.ratios)              # same draws, same runs
    # the interval by hand from the draws and v̂
    x = np.log(m8.ratios)
    s2 = x.var(ddof=1)
    h = t.ppf(0.95, draws - 1) * np.sqrt(max(s2 - m8.seed_var / seeds, 0.0) + m8.seed_var / 8 + s2 / draws)
    assert (m8.low, m8.high) == (pytest.approx(np.exp(x.mean() - h)), pytest.approx(np.exp(x.mean() + h)))
    assert m8.high - m8.low < plain.high - plain.low
    # direct: 5 measurements of 8 seeds, each seed on its own world of the scenario
    cu, cd = [], []
    for s in range(40):
        sc = dataclasses.replace(SC, pool_seed=100 + s)
        u = simulate(sc, "uniform", steps=steps, seed=1000 + s, batch_size=b, group_size=g, eval_every=steps // 25)
        d = simulate(sc, "dump", steps=steps, seed=1000 + s, batch_size=b, group_size=g, eval_every=steps // 25)
        tgt = gain_target(u.mean_accuracy[0], u.mean_accuracy[-1])
        cu.append(cost_to_reach(u.eval_rollouts, u.mean_accuracy, tgt)[0])
        cd.append(cost_to_reach(d.eval_rollouts, d.mean_accuracy, tgt)[0])
    cu, cd = np.array(cu), np.array(cd)
    e = cd / cd.mean() - cu / cu.mean()                                  # one seed's paired term
    v_direct = e.var(ddof=1)
    assert 0.4 < m8.seed_var / v_direct < 2.5, (m8.seed_var, v_direct)  # v̂ has 8 degrees of freedom
    r8 = cd.reshape(5, 8).mean(axis=1) / cu.reshape(5, 8).mean(axis=1)
    assert ((m8.low <= r8) & (r8 <= m8.high)).all(), (m8.low, m8.high, r8)


def test_measurement_seeds_needs_two_seeds_per_draw(tmp_path):
    _, fit, w = _sc_fit(tmp_path)
    with pytest.raises(InputError, match="seeds"):
        predict(fit, w.pool, budget_rollouts=60 * 64 * 8, pilot_rollouts=0, policies=["dump"], draws=2, seeds=1,
                from_start=True, measurement_seeds=8)
    with pytest.raises(InputError, match="measurement_seeds"):
        predict(fit, w.pool, budget_rollouts=60 * 64 * 8, pilot_rollouts=0, policies=["dump"], draws=2, seeds=2,
                from_start=True, measurement_seeds=0)



def test_cli_measurement_seeds_without_seeds_is_one_line_exit_2(tmp_path, capsys):
    path, w = _pilot(tmp_path, steps=12, b=32, g=4)
    out = tmp_path / "out"
    argv = ["advise", "--pilot", str(path), "--pool", str(_pool_file(tmp_path, w)), "--out", str(out),
            "--policies", "dump", "--budget-rollouts", "99999", "--measurement-seeds", "8"]
    rc, err = _cli(argv, capsys)
    assert rc == 2 and len(err) == 1 and "--seeds 2" in err[0]
    rc, err = _cli(argv[:-1] + ["-1"], capsys)
    assert rc == 2 and len(err) == 1 and "--measurement-seeds" in err[0]
    assert not out.exists()


@pytest.mark.parametrize("kw, field", [
    (dict(seeds=2, measurement_seeds=0), "measurement_seeds"),      # passed advise's own check, refused after the fits
    (dict(seeds=2, measurement_seeds=-3), "measurement_seeds"),
    (dict(draws=0), "draws"), (dict(jobs=0), "jobs"), (dict(seeds=0), "seeds"), (dict(screen=-1), "screen"),
    (dict(policies=["dump", "no_such_policy"]), "policies"), (dict(step_norm="batchy"), "step_norm"),
    (dict(law_replicates=1), "law_replicates"), (dict(budget_rollouts=0), "budget_rollouts"),
])
def test_advise_refuses_bad_arguments_before_any_work(tmp_path, monkeypatch, kw, field):
    """Every argument is checked before the pilot is read or a fit runs: InputError naming
    the field, and neither the pilot's load nor `fit_learner` is called."""
    import rlpace.advise._advice as adv_mod
    path, w = _pilot(tmp_path, steps=12, b=32, g=4)
    calls = []
    monkeypatch.setattr(adv_mod, "fit_learner", lambda *a, **k: calls.append("fit"))
    monkeypatch.setattr(adv_mod, "load_pilot", lambda *a, **k: calls.append("load"))
    args = {**dict(budget_rollouts=99_999, policies=["dump"], draws=2), **kw}
    with pytest.raises(InputError, match=field):
        adv_mod.advise(path, w.pool, **args)
    assert calls == []



def test_cli_trainer_pilot_is_not_run_for_a_bad_measurement_seeds(tmp_path, capsys, monkeypatch):
    """With trainer fields the CLI runs a pilot first: the prediction's arguments are checked
    before it (one line, exit 2), not after the pilot's training."""
    import rlpace.advise._trainer as tr
    ran = []

    def pilot_on_trainer(*a, **k):
        ran.append(1)
        raise RuntimeError("the pilot ran")
    monkeypatch.setattr(tr, "pilot_on_trainer", pilot_on_trainer)
    out = tmp_path / "out"
    rc, err = _cli(["advise", "tasks=ladder", f"out={tmp_path / 'pilot'}", "--budget-rollouts", "99999",
                    "--policies", "dump", "--measurement-seeds", "8", "--out", str(out)], capsys)
    assert rc == 2 and len(err) == 1 and "--seeds 2" in err[0] and "measurement_seeds" in err[0]
    assert ran == [] and not out.exists() and not (tmp_path / "pilot").exists()


def test_fit_recovers_a_skill_cap_and_keeps_the_linear_learner_without_one(tmp_path):
    """The skill cap (saturation c: skill (1 − e^(−c·x))/c of the linear skill x). On a pilot of
    a learner capped at 2 logits (c = 0.5; 60 steps of 128 × 16) the likelihood-ratio gate
    opens and ĉ is within a factor 2 of c, the truth inside ĉ·e^(±2 se); on the same pilot of
    the uncapped learner the gate stays shut and the fit is the linear fit to the last bit."""
    from rlpace.advise._fit import SAT_MARGIN
    w = build_world(SC)
    fits = {}
    for c in (0.5, 0.0):
        path = tmp_path / f"cap{c}.jsonl"
        simulate(SC, "uniform", steps=60, seed=0, batch_size=128, group_size=16, record=PilotRecorder(path, pool=w.pool),
                 saturation=c)
        fits[c] = (fit_learner(read_pilot(path), w.pool), fit_learner(read_pilot(path), w.pool, saturation="off"))
    capped, linear = fits[0.5]
    assert capped.saturation_gain > SAT_MARGIN, capped.saturation_gain
    assert abs(np.log(capped.params.sat / 0.5)) < np.log(2.0), capped.params.sat
    se = float(np.sqrt(capped.cov[-1, -1]))                   # log c is θ's last entry
    assert abs(np.log(capped.params.sat / 0.5)) < 2 * se, (capped.params.sat, se)
    assert capped.log_lik > linear.log_lik + SAT_MARGIN
    assert capped.to_json()["skill_cap"] == pytest.approx(1 / capped.params.sat)
    auto, off = fits[0.0]
    assert auto.saturation_gain < SAT_MARGIN and auto.params.sat == 0.0
    np.testing.assert_array_equal(auto.theta, off.theta)
    np.testing.assert_array_equal(auto.cov, off.cov)
    assert auto.to_json()["skill_cap"] is None
    with pytest.raises(InputError, match="saturation"):
        fit_learner(read_pilot(tmp_path / "cap0.0.jsonl"), w.pool, saturation="yes")


def _held_out_solved_pilot(tmp_path, truth: dict, n: int = 256):
    """(pilot, world, res): a 40-step uniform pilot of the test ladder whose held-out sets
    differ from the training prompts: in scenario domain k a share truth[k] of its held-out
    prompts (the easiest) is solved by the base (at `SOLVED_D`), where no training prompt is.
    The per-domain evaluations are the simulator's (mean pass rate) read as counts of n prompts."""
    from rlpace.advise._fit import SOLVED_D
    w = build_world(SC)
    held = w.heldout.copy()
    for k, h in truth.items():
        held[k, np.argsort(held[k])[:int(round(h * held.shape[1]))]] = SOLVED_D
    wh = w._replace(heldout=held)
    res = simulate(SC, "uniform", steps=40, seed=0, batch_size=64, group_size=8, eval_every=10, world=wh,
                   record=PilotRecorder(tmp_path / "p.jsonl", pool=w.pool))
    names = SC.domains
    dev = tuple((int(t), {names[k]: float(res.accuracy[e, k]) for k in range(len(names))},
                 {d: n for d in names}) for e, t in enumerate(res.eval_step))
    return read_pilot(tmp_path / "p.jsonl")._replace(domain_evals=dev), w, res


def test_fit_recovers_the_held_out_solved_share_and_keeps_the_family_without_one(tmp_path):
    """A base that solves held-out prompts its training prompts do not show (or the reverse:
    memorised training prompts): h_k is fitted to the pilot's per-domain held-out evaluations.
    Tolerance 0.1 on h (≈ 3 standard errors at 5 evaluations of 256 prompts, each prompt counted
    once); where the truth is the training prompts' share, nothing is kept."""
    from rlpace.advise._fit import draw_params, fit_heldout_solved, heldout_difficulties
    truth = {1: 0.5, 4: 0.3}                             # L1, L4; the training prompts: none solved
    pilot, w, _ = _held_out_solved_pilot(tmp_path, truth)
    fit = fit_learner(pilot, w.pool, saturation="off")
    got = fit_heldout_solved(pilot, fit, "sampled")
    h = got.heldout
    for k in range(len(SC.domains)):
        c = int(w.pool_order[k])
        if k in truth:
            assert h.kept[c] and abs(h.share[c] - truth[k]) < 0.1, (k, h.share[c], h.se[c], h.gain[c])
            assert abs(h.share[c] - truth[k]) < 3 * h.se[c] + 0.01, (k, h.share[c], h.se[c])
        else:
            assert not h.kept[c] and h.share[c] == fit.params.solved[c], (k, h.share[c], h.gain[c])
    # the held-out set the predictions use: share ĥ_k solved, the training prompts and θ untouched
    held = heldout_difficulties(got.params)
    for k in truth:
        c = int(w.pool_order[k])
        assert (held[c] == -6.0).sum() == int(round(h.share[c] * held.shape[1]))
    assert np.array_equal(got.theta, fit.theta) and np.array_equal(got.params.mu, fit.params.mu)
    # the draws carry ĥ's uncertainty where kept (θ drawn first, unchanged), π_k elsewhere
    d0, d1 = draw_params(fit, 6, np.random.default_rng(3)), draw_params(got, 6, np.random.default_rng(3))
    shares = np.array([q.heldout_solved for q in d1[1:]])                         # [5, K]
    for a, b in zip(d0[1:], d1[1:]):
        assert np.array_equal(a.mu, b.mu) and a.lr == b.lr
        assert np.array_equal(b.heldout_solved[~h.kept], a.solved[~h.kept])
    assert shares[:, h.kept].std(axis=0).min() > 0
    # without per-domain evaluations (or without their sizes) the family is the one before, to the bit
    for bare in (pilot._replace(domain_evals=()),
                 pilot._replace(domain_evals=tuple((t, a, None) for t, a, _ in pilot.domain_evals))):
        same = fit_heldout_solved(bare, fit, "sampled")
        assert same.params.heldout_solved is None and not same.heldout.kept.any()
        for a, b in zip(draw_params(fit, 6, np.random.default_rng(3)), draw_params(same, 6, np.random.default_rng(3))):
            assert np.array_equal(heldout_difficulties(a), heldout_difficulties(b))
            assert np.array_equal(a.mu, b.mu) and a.lr == b.lr and a.tau == b.tau


def test_held_out_solved_share_is_not_kept_when_the_held_out_set_is_the_training_prompts(tmp_path):
    from rlpace.advise._fit import fit_heldout_solved
    pilot, w, _ = _held_out_solved_pilot(tmp_path, {})
    fit = fit_learner(pilot, w.pool, saturation="off")
    got = fit_heldout_solved(pilot, fit, "sampled")
    assert got.heldout.evals == 5 and not got.heldout.kept.any(), got.heldout.gain
    assert got.params.heldout_solved is None and got.heldout.reason


def test_record_keeps_per_domain_evaluations_and_their_sizes(tmp_path):
    """The built-in trainer's evaluation dict {domain: acc, "mean": m, "n": held-out prompts per
    domain} round trips into `Pilot.domain_evals`; an evaluation without "n" keeps None."""
    rec = PilotRecorder(tmp_path / "p.jsonl")
    fb = Feedback(np.array([0, 1]), np.array([[1.0, 0.0], [0.0, 0.0]], np.float32), step=0)
    rec.write(fb, eval={"mean": 0.25, "a": 0.5, "b": 0.0, "n": 64})
    rec.write(Feedback(fb.prompt_ids, fb.rewards, step=1), eval={"acc_mean": 0.3, "acc": {"a": 0.6}})
    rec.write_eval(2, {"mean": 0.5, "a": 0.75, "b": 0.25, "n": 32})
    p = read_pilot(tmp_path / "p.jsonl")
    assert [e[2] for e in p.evals] == [0.25, 0.3, 0.5]
    assert p.domain_evals == ((0, {"a": 0.5, "b": 0.0}, {"a": 64, "b": 64}), (1, {"a": 0.6}, None),
                              (2, {"a": 0.75, "b": 0.25}, {"a": 32, "b": 32}))


@pytest.mark.parametrize("field, bad", [("acc", float("nan")), ("acc", 1.5), ("acc", -0.1), ("acc", "0.5"),
                                        ("n", -1), ("n", 2.5), ("n", True)])
@pytest.mark.parametrize("alone", [False, True])
def test_record_refuses_a_bad_per_domain_accuracy_or_size(tmp_path, field, bad, alone):
    """A per-domain accuracy that is not a finite number in [0, 1], or a held-out size that is
    not a whole number ≥ 0, is refused by name (it would enter the held-out fit's likelihood:
    round(NaN · n) raises, 1.5 gives a negative failure count), on a batch's evaluation and on
    an evaluation alone."""
    ev = {"acc_mean": 0.5, "acc": {"a": 0.5, "b": 0.25}, "n": {"a": 8, "b": 8}}
    path = tmp_path / "p.jsonl"
    rec = PilotRecorder(path)
    fb = Feedback(np.array([0, 1]), np.array([[1.0, 0.0], [0.0, 0.0]], np.float32), step=0)
    rec.write(fb, eval=None if alone else ev)
    if alone:
        rec.write_eval(1, ev)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    lines[-1]["eval"][field]["b"] = bad                 # as a faulty writer would (NaN: json's literal)
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    with pytest.raises(InputError, match=rf"pilot eval at step {1 if alone else 0}: {field}\['b'\]"):
        read_pilot(tmp_path / "p.jsonl")


def test_a_draw_whose_uniform_run_gains_nothing_has_ratio_one(tmp_path):
    """A learner that does not learn (lr 10⁻⁹) under a greedy evaluation: uniform's held-out
    accuracy never moves, so its 80 %-of-gain target is the start, reached at no cost by every
    policy. Each policy's ratio is then 1 (it does what uniform does), not 0 / 10⁻⁹ = 0, which
    the log-scale interval turned into [0, 10¹²] on the trainer's families_parallel."""
    fit, w = _fit_at_truth(tmp_path)
    fit = fit._replace(params=fit.params._replace(lr=1e-9))
    pr = predict(fit, w.pool, budget_rollouts=20 * 64 * 8, pilot_rollouts=0, policies=["dump"], draws=1, seeds=2,
                 from_start=True, heldout_eval="greedy")        # one draw: the MAP, the learner set here
    dump = pr.policies[0]
    assert dump.policy == "dump" and dump.ratios.tolist() == [1.0], dump.ratios
    assert (dump.ratio, dump.low, dump.high) == (1.0, 1.0, 1.0) and pr.oracle.ratio == 1.0


def test_hits_scores_a_prompt_greedy_or_sampled_by_hand():
    """`_hits`: greedy 1 where skill − difficulty > 0 (0 at exactly 0), sampled σ(x); and
    `eval_accuracy` is its mean over the held-out prompts, the numbers of the inline rules
    it replaced (greedy `(x > 0).mean()`, sampled `σ(x).mean()`)."""
    from rlpace.advise._fit import _hits, eval_accuracy
    x = np.array([-0.1, 0.0, 0.3, np.log(3.0)])
    assert _hits(x, "greedy").tolist() == [0.0, 0.0, 1.0, 1.0]
    np.testing.assert_allclose(_hits(x, "sampled"), [1 / (1 + np.exp(0.1)), 0.5, 1 / (1 + np.exp(-0.3)), 0.75],
                               rtol=0, atol=1e-15)
    assert float(_hits(0.2, "greedy")) == 1.0 and float(_hits(-2.0, "sampled")) == pytest.approx(1 / (1 + np.e ** 2))
    rng = np.random.default_rng(3)
    skill, held = rng.normal(size=(5, 3)), rng.normal(size=(3, 40))
    d = skill[..., :, None] - held
    assert np.array_equal(eval_accuracy(skill, held, "greedy"), (d > 0).mean(axis=-1))
    assert np.array_equal(eval_accuracy(skill, held, "sampled"), (1.0 / (1.0 + np.exp(-d))).mean(axis=-1))


def test_choose_policy_least_expected_regret_by_hand():
    """Four equally weighted draws: a = [0.5, 0.6, 1.2, 0.7], b = 0.8 on every draw. Per draw
    the best log ratio is log 0.5, log 0.6, log 0.8, log 0.7; the expected regret is
    a: log(1.2/0.8)/4 = 0.10137, b: (log 1.6 + log(4/3) + log(8/7))/4 = 0.22280, uniform:
    −(log 0.5 + log 0.6 + log 0.8 + log 0.7)/4 = 0.44595. a is chosen; it saves > 10 % on 3
    of 4 draws (P = 0.75 ≥ 0.5). b's median (0.8) is above a's (0.65) here too, but with
    a = [0.5, 0.6, 2.0, 2.0] the median rule still picks a (1.3 vs b's 0.8) while the
    regret rule picks b."""
    from math import log

    from rlpace.advise._advice import choose_policy
    w = np.full(4, 0.25)
    a, b, o = np.array([0.5, 0.6, 1.2, 0.7]), np.full(4, 0.8), np.array([0.4, 0.5, 0.6, 0.5])
    c = choose_policy({"a": a, "b": b}, o, w)
    assert c.policy == "a" and c.reason == "" and c.p_saving == 0.75 and c.oracle_p_saving == 1.0
    assert c.regret["a"] == pytest.approx(log(1.5) / 4, abs=1e-12)
    assert c.regret["b"] == pytest.approx((log(1.6) + log(4 / 3) + log(8 / 7)) / 4, abs=1e-12)
    assert c.regret["uniform"] == pytest.approx(-(log(0.5) + log(0.6) + log(0.8) + log(0.7)) / 4, abs=1e-12)
    # a heavy right tail: regret a = (log 2.5 + log 2.5)/4 = 0.458, b = (log 1.6 + log(4/3))/4 = 0.189
    c = choose_policy({"a": np.array([0.5, 0.6, 2.0, 2.0]), "b": b}, o, w)
    assert c.policy == "b" and c.regret["b"] == pytest.approx((log(1.6) + log(4 / 3)) / 4, abs=1e-12)


def test_choose_policy_keeps_uniform_below_the_level():
    """"No expected saving" when the oracle saves > 10 % on fewer than `level` of the weighted
    draws (reason "headroom"), or the least-regret candidate does (reason "candidates"); a
    candidate dropped after screening (fewer ratios than draws) is never chosen; weights
    from `draw_weights` move the probability."""
    from rlpace.advise._advice import choose_policy, draw_weights
    w = np.full(4, 0.25)
    a = np.array([0.5, 0.95, 0.95, 0.95])                     # saves > 10 % on 1 of 4 draws
    c = choose_policy({"a": a}, np.array([0.5, 0.7, 0.95, 0.95]), w, level=0.5)
    assert (c.policy, c.reason, c.p_saving, c.oracle_p_saving) == (None, "candidates", 0.25, 0.5)
    c = choose_policy({"a": a}, np.array([0.5, 0.7, 0.95, 0.95]), w, level=0.25)
    assert (c.policy, c.p_saving) == ("a", 0.25)
    c = choose_policy({"a": a}, np.array([0.5, 0.95, 0.95, 0.95]), w, level=0.5)
    assert (c.policy, c.reason, c.oracle_p_saving) == (None, "headroom", 0.25)
    c = choose_policy({"a": a, "dropped": np.array([0.1, 0.1])}, np.full(4, 0.5), w, level=0.25)
    assert c.policy == "a" and "dropped" not in c.regret
    # the last draw is the alternative law's, weight 0.7: a saves on it only
    wd = draw_weights(4, 1, 0.7)
    np.testing.assert_allclose(wd, [0.1, 0.1, 0.1, 0.7], rtol=0, atol=1e-15)
    c = choose_policy({"a": np.array([0.95, 0.95, 0.95, 0.5])}, np.full(4, 0.5), wd, level=0.5)
    assert c.policy == "a" and c.p_saving == pytest.approx(0.7, abs=1e-15)
    # a draw that never reaches the target (inf) weighs as a ratio of RATIO_CLIP: against b's 0.85 there
    c = choose_policy({"a": np.array([0.5, 0.5, 0.5, np.inf]), "b": np.full(4, 0.85)}, np.full(4, 0.5), w)
    assert c.policy == "b" and c.regret["a"] == pytest.approx((np.log(1e3) - np.log(0.85)) / 4, abs=1e-12)


def test_choose_policy_equals_a_reference_loop_on_random_draws():
    """The vectorised rule against the obvious loop over draws and policies, 200 random cases."""
    from rlpace.advise._advice import choose_policy
    rng = np.random.default_rng(11)
    for _ in range(200):
        d, k = int(rng.integers(1, 9)), int(rng.integers(1, 5))
        ratios = {f"p{i}": np.exp(rng.normal(-0.1, 0.4, d)) for i in range(k)}
        oracle = np.exp(rng.normal(-0.3, 0.4, d))
        w = rng.dirichlet(np.ones(d))
        level = float(rng.uniform(0.1, 0.9))
        names = ["uniform", *ratios]
        r = {"uniform": [1.0] * d, **{p: list(v) for p, v in ratios.items()}}
        regret = {}
        for p in names:
            tot = 0.0
            for j in range(d):
                tot += w[j] * (np.log(r[p][j]) - min(np.log(r[q][j]) for q in names))
            regret[p] = tot
        pick = min(names, key=lambda p: (regret[p], p != "uniform"))
        po = sum(w[j] for j in range(d) if oracle[j] < 0.9)
        ps = 0.0 if pick == "uniform" else sum(w[j] for j in range(d) if r[pick][j] < 0.9)
        want = None if po < level or pick == "uniform" or ps < level else pick
        c = choose_policy(ratios, oracle, w, level=level)
        assert c.policy == want
        for p in names:
            assert c.regret[p] == pytest.approx(regret[p], abs=1e-12)


def test_advise_takes_the_least_regret_policy_of_its_own_draws(tmp_path):
    """On the 6-rung ladder (a learner of the fitted family, large headroom), `advise`'s
    recommendation is `choose_policy` on its own prediction's draws, advice.json records the
    decision, and at a level of 1.0 (a saving on every draw) the same draws give
    `choose_policy`'s stricter answer."""
    from rlpace.advise import advise
    from rlpace.advise._advice import SAVING_LEVEL, choose_policy, draw_weights
    pilot, _, w = _sc_fit(tmp_path)
    kw = dict(budget_rollouts=120 * 64 * 8, policies=["dump", "mopps"], draws=3, from_start=True,
              step_norm="batch", model_error=False)
    adv = advise(pilot, w.pool, **kw)
    pr = adv.prediction
    want = choose_policy({p.policy: p.ratios for p in pr.policies}, pr.oracle.ratios, draw_weights(3))
    assert adv.recommended == want.policy and adv.recommended in ("dump", "mopps")
    dec = adv.to_json()["decision"]
    assert dec["policy"] == adv.recommended and dec["level"] == SAVING_LEVEL == 0.3
    assert dec["p_saving_gt_10pct"] == want.p_saving >= SAVING_LEVEL
    assert "P(saving > 10 %)" in adv.sentence
    strict = advise(pilot, w.pool, **kw, level=1.0)
    assert strict.prediction.policies[0].ratios.tolist() == pr.policies[0].ratios.tolist()   # the same draws
    want = choose_policy({p.policy: p.ratios for p in pr.policies}, pr.oracle.ratios, draw_weights(3), level=1.0)
    assert strict.recommended == want.policy
    assert (strict.recommended is None) == (want.p_saving < 1.0 or want.oracle_p_saving < 1.0 or want.reason != "")
    with pytest.raises(InputError, match="level"):
        advise(pilot, w.pool, **kw, level=0.0)
