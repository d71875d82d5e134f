"""The simulator: scenarios, the learner against a per-group reference loop, rollout
accounting with refills, determinism, records — and the learning tests (adaptive proposal
policies vs uniform on the ladder and homogeneous scenarios)."""

import json
import math

import numpy as np
import pytest

from rlpace import Feedback, Scheduler, group_advantages
from rlpace.errors import InputError
from rlpace.sim import (SCENARIOS, Scenario, build_world, group_signal, heldout_accuracy, make_scenario,
                        proposal_names, sigmoid, simulate)

TINY = make_scenario("ladder", prompts_per_domain=30, heldout_per_domain=20, forgetting=0.01,
                     transfer_backward=0.2)


# ---- scenarios -----------------------------------------------------------------------------
def test_named_scenarios_exist_and_are_documented():
    assert {"ladder", "homogeneous", "solved_majority"} <= set(SCENARIOS)
    for name, sc in SCENARIOS.items():
        assert sc.name == name and len(sc.description) > 100
    ladder = SCENARIOS["ladder"]
    assert ladder.n_domains == 12
    assert ladder.base_accuracy[0] == pytest.approx(0.95) and ladder.base_accuracy[-1] == pytest.approx(0.02)
    assert all(a > b for a, b in zip(ladder.base_accuracy, ladder.base_accuracy[1:]))
    assert SCENARIOS["homogeneous"].n_domains == 1
    assert SCENARIOS["solved_majority"].solved_fraction >= 0.5


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_difficulty_means_give_base_accuracy(name):
    sc = SCENARIOS[name]
    mu = sc.difficulty_means()
    # independent check by Monte Carlo with 2e5 normal draws
    z = np.random.default_rng(0).standard_normal(200_000)
    for m, a in zip(mu, sc.base_accuracy):
        assert sigmoid(-m - sc.difficulty_sd * z).mean() == pytest.approx(a, abs=3e-3)
    world = build_world(sc)
    acc0 = heldout_accuracy(np.zeros(sc.n_domains), world.heldout)
    np.testing.assert_allclose(acc0, sc.base_accuracy, atol=0.04)       # finite held-out sample


def test_world_matches_scenario():
    sc = make_scenario("solved_majority", prompts_per_domain=400)
    w = build_world(sc)
    assert len(w.pool) == 1600 and w.pool.n_domains == 4 and w.pool.n_clusters == 8
    assert np.bincount(w.domain).tolist() == [400] * 4
    solved = w.difficulty < -4
    assert abs(solved.mean() - 0.9) < 0.03
    assert w.heldout.shape == (4, sc.heldout_per_domain) and (w.heldout > -4).all()   # open prompts only
    # the Pool's offline difficulty is the latent one plus noise: strongly correlated
    assert np.corrcoef(w.pool.difficulty, w.difficulty)[0, 1] > 0.9
    assert build_world(sc) is w                                          # cached
    assert not w.difficulty.flags.writeable


def test_domain_order_independent_of_label_sorting():
    sc = Scenario(name="x", description="labels not in sorted order", domains=("hard", "easy"),
                  base_accuracy=(0.1, 0.9), prompts_per_domain=50, heldout_per_domain=10)
    w = build_world(sc)
    assert w.pool.domain_names == ("easy", "hard")
    assert w.pool_order.tolist() == [1, 0]
    np.testing.assert_array_equal(w.pool.domains, w.pool_order[w.domain])
    assert w.difficulty[w.domain == 0].mean() > w.difficulty[w.domain == 1].mean()
    res = simulate(sc, "dump", steps=3, batch_size=8, group_size=4)
    assert res.domain_prob.shape == (3, 2)


def test_transfer_matrix_hand_values():
    sc = Scenario(name="t", description="", domains=("a", "b", "c"), base_accuracy=(0.5, 0.5, 0.5),
                  transfer_forward=0.5, transfer_backward=0.1)
    np.testing.assert_allclose(sc.transfer_matrix(), [[1.0, 0.1, 0.01], [0.5, 1.0, 0.1], [0.25, 0.5, 1.0]])
    explicit = Scenario(name="t", description="", domains=("a", "b"), base_accuracy=(0.5, 0.5),
                        transfer=[[1.0, 0.3], [0.0, 1.0]])
    np.testing.assert_allclose(explicit.transfer_matrix(), [[1.0, 0.3], [0.0, 1.0]])
    hash(explicit)                                                       # hashable for the cache


@pytest.mark.parametrize("overrides, field", [
    (dict(base_accuracy=(0.5,) * 11), "base_accuracy"),
    (dict(base_accuracy=(1.0,) * 12), "base_accuracy"),
    (dict(prompts_per_domain=0), "prompts_per_domain"),
    (dict(forgetting=1.0), "forgetting"),
    (dict(lr=-1.0), "lr"),
    (dict(target=1.5), "target"),
    (dict(transfer=np.eye(3)), "transfer"),
    (dict(solved_fraction=1.0), "solved_fraction"),
])
def test_scenario_validation(overrides, field):
    with pytest.raises(ValueError, match=f"Scenario.{field}"):
        make_scenario("ladder", **overrides)


def test_make_scenario_errors():
    with pytest.raises(ValueError, match="unknown scenario"):
        make_scenario("nope")
    with pytest.raises(ValueError, match="unknown Scenario field"):
        make_scenario("ladder", n_prompts=5)
    assert make_scenario("ladder", lr=0.2).lr == 0.2 and SCENARIOS["ladder"].lr != 0.2


# ---- the learner ---------------------------------------------------------------------------
def test_group_signal_hand_values():
    r = np.array([[1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    full = np.ones_like(r, dtype=bool)
    s = group_signal(r, full, np.ones_like(r))
    np.testing.assert_allclose(s, np.abs(group_advantages(r)).mean(axis=1))
    # PODS-style subset: keep one success and one failure → A' = ±0.5/(0.5+1e-6)
    keep = np.array([[True, False, True, False], [False] * 4, [True, True, False, False]])
    s = group_signal(r, keep, np.ones_like(r))
    np.testing.assert_allclose(s, [0.5 / (0.5 + 1e-6), 0.0, 0.0])
    w = np.array([[2.0, 0.0, 1.0, 1.0]] * 3)
    np.testing.assert_allclose(group_signal(r[:1], full[:1], w[:1]), [(2 + 0 + 1 + 1) * (0.5 / (0.5 + 1e-6)) / 4])


def reference_run(sc, seed, steps, b, g, eval_every, cap=0.0, offset=None):
    """The obvious per-group loop for a uniform run: same rollout draws, plain Python math.
    With a skill cap of 1/cap logits (no forgetting) the skill is the closed form on the linear
    skill x (Σ of the steps' lr·M·gain/B): absolute skill a = (1 − (1 − cap·a₀)·e^(−cap·x))/cap
    from a₀ = offset, the run's skill a − a₀. Returns the curve and the final skills."""
    assert cap == 0.0 or sc.forgetting == 0.0
    world = build_world(sc)
    sched = Scheduler(world.pool, "uniform", seed=seed)
    k = sc.n_domains
    m = sc.transfer_matrix().tolist()
    x = [0.0] * k
    skill = [0.0] * k

    def acc():
        return [float(np.mean([1 / (1 + math.exp(-(skill[d] - h))) for h in world.heldout[d]])) for d in range(k)]
    curve = [acc()]
    for t in range(steps):
        rng = np.random.default_rng([seed, t, 0x5101])
        ids = sched.propose(b)
        u = rng.random((b, g))
        rewards = [[1.0 if u[i, j] < 1 / (1 + math.exp(-(skill[world.domain[p]] - world.difficulty[p])))
                    else 0.0 for j in range(g)] for i, p in enumerate(ids)]
        sched.observe(Feedback(ids, rewards, step=t))
        gain = [0.0] * k
        for p, row in zip(ids, rewards):
            mean = sum(row) / g
            sd = math.sqrt(sum((v - mean) ** 2 for v in row) / g)
            gain[world.domain[p]] += sum(abs(v - mean) / (sd + 1e-6) for v in row) / g if sd > 0 else 0.0
        step = [sc.lr * sum(m[d][j] * gain[j] / b for j in range(k)) for d in range(k)]
        if cap == 0.0:
            skill = [(1 - sc.forgetting) * skill[d] + step[d] for d in range(k)]
        else:
            x = [x[d] + step[d] for d in range(k)]
            skill = [(1 - (1 - cap * offset[d]) * math.exp(-cap * x[d])) / cap - offset[d] for d in range(k)]
        if (t + 1) % eval_every == 0 or t + 1 == steps:
            curve.append(acc())
    return np.array(curve), np.array(skill)


def test_learner_equals_reference_loop():
    res = simulate(TINY, "uniform", steps=23, seed=3, batch_size=16, group_size=6, eval_every=5)
    ref, _ = reference_run(TINY, 3, 23, 16, 6, 5)
    assert res.eval_step.tolist() == [0, 5, 10, 15, 20, 23]
    np.testing.assert_allclose(res.accuracy, ref, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(res.mean_accuracy, ref.mean(axis=1), rtol=1e-9)
    assert res.accuracy[-1].mean() > res.accuracy[0].mean()             # it learns


def test_learner_with_a_skill_cap_equals_the_closed_form():
    """With saturation c the skill is (1 − e^(−c·x))/c of the linear skill x, measured from the
    run's offset on the cap: the per-step update equals the closed form of an independent loop,
    and no skill passes the cap."""
    sc = make_scenario("ladder", prompts_per_domain=30, heldout_per_domain=20, lr=0.5, transfer_backward=0.2)
    offset = np.linspace(0.0, 1.0, sc.n_domains)
    res = simulate(sc, "uniform", steps=23, seed=3, batch_size=16, group_size=6, eval_every=5, saturation=0.4,
                   skill_offset=offset)
    ref, skill = reference_run(sc, 3, 23, 16, 6, 5, cap=0.4, offset=offset)
    np.testing.assert_allclose(res.accuracy, ref, rtol=1e-9, atol=1e-12)
    assert np.all(skill + offset < 1 / 0.4) and skill.max() > 0.3          # it learns, under the cap
    plain = simulate(sc, "uniform", steps=23, seed=3, batch_size=16, group_size=6, eval_every=5)
    assert plain.accuracy[-1].mean() > res.accuracy[-1].mean()             # the cap slows the same run
    with pytest.raises(InputError, match="saturation"):
        simulate(sc, "uniform", steps=1, batch_size=4, group_size=2, saturation=-0.1)
    with pytest.raises(InputError, match="skill_offset"):
        simulate(sc, "uniform", steps=1, batch_size=4, group_size=2, saturation=0.5, skill_offset=np.full(3, 2.5))


def test_rollout_accounting_without_and_with_refills():
    sc = make_scenario("solved_majority", prompts_per_domain=300)
    plain = simulate(sc, "uniform", steps=12, batch_size=16, group_size=4)
    assert plain.rollouts.tolist() == [16 * 4 * (t + 1) for t in range(12)]
    np.testing.assert_array_equal(plain.kept_fraction, 1.0)
    dapo = simulate(sc, "dapo_dynamic_sampling", steps=12, batch_size=16, group_size=4)
    assert (np.diff(dapo.rollouts) > 16 * 4).all()                       # refills cost rollouts
    assert dapo.final_metrics["rollouts_observed"] == dapo.rollouts[-1]  # everything generated was observed
    assert dapo.final_metrics["groups_observed"] * 4 == dapo.rollouts[-1]
    assert (dapo.kept_fraction <= 1.0).all() and (dapo.kept_fraction < 0.5).all()
    capped = simulate(sc, "dapo_dynamic_sampling", steps=12, batch_size=16, group_size=4, max_gen_batches=1)
    assert capped.rollouts[-1] == 12 * 16 * 4


def test_determinism_and_seeds():
    a = simulate(TINY, "dump", steps=15, seed=1, batch_size=16, group_size=4, eval_every=5)
    b = simulate(TINY, "dump", steps=15, seed=1, batch_size=16, group_size=4, eval_every=5)
    c = simulate(TINY, "dump", steps=15, seed=2, batch_size=16, group_size=4, eval_every=5)
    for f in ("accuracy", "domain_prob", "domain_share", "informative_fraction", "rollouts"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
    assert not np.array_equal(a.domain_share, c.domain_share)


def test_result_shapes_target_and_record():
    res = simulate(TINY, "dump", steps=20, batch_size=16, group_size=4, eval_every=4, target=0.3)
    k = TINY.n_domains
    assert res.accuracy.shape == (6, k) and res.domain_prob.shape == (20, k)
    np.testing.assert_allclose(res.domain_prob.sum(axis=1), 1.0)
    np.testing.assert_allclose(res.domain_share.sum(axis=1), 1.0)
    assert res.steps_to_target == 0 and res.rollouts_to_target == 0      # base accuracy 0.44 > 0.3
    assert res.final_accuracy == res.mean_accuracy[-1]
    assert res.accuracy_at(9) == res.mean_accuracy[2]
    rec = json.loads(json.dumps(res.to_record()))
    assert rec["policy"] == "dump" and rec["config"]["scenario"]["name"] == "ladder"
    assert rec["config"]["numpy"] == np.__version__ and "git_commit" in rec["config"]
    assert len(rec["mean_accuracy"]) == 6 and rec["domains"][0] == "L00"
    never = simulate(TINY, "uniform", steps=5, batch_size=8, group_size=4, target=0.999)
    assert never.steps_to_target is None and never.domain_prob is None
    stop = simulate(TINY, "uniform", steps=100, batch_size=16, group_size=4, eval_every=2, target=0.45,
                    stop_at_target=True)
    assert stop.eval_step[-1] == stop.steps_to_target < 100 and stop.rollouts.shape == (stop.steps_to_target,)


def test_simulate_bad_arguments():
    for kw in (dict(steps=-1), dict(steps=2, batch_size=0), dict(steps=2, group_size=1.5),
               dict(steps=2, target=0.0), dict(steps=2, weight_norm="adam")):
        with pytest.raises(ValueError):
            simulate(TINY, "uniform", **kw)
    with pytest.raises(ValueError, match="unknown scenario"):
        simulate("nope", "uniform", steps=1)
    with pytest.raises(ValueError, match="unknown policy"):
        simulate(TINY, "nope", steps=1)


def test_weight_norm_removes_pure_rescaling():
    # per_advantage renormalises weights over the whole batch, so the informative rollouts
    # get mean weight > 1: a larger step under "none", a redistribution under "informative".
    kw = dict(steps=30, batch_size=32, group_size=8, eval_every=30)
    base = simulate(TINY, "uniform", **kw).final_accuracy
    unit = simulate(TINY, "uniform", weight_norm="none", **kw).final_accuracy
    assert base == unit                                                  # unit weights: c = 1
    raw = simulate(TINY, "per_advantage", weight_norm="none", **kw).final_accuracy
    normed = simulate(TINY, "per_advantage", **kw).final_accuracy
    assert raw > normed


def test_ads_gets_batch_dependent_window():
    res = simulate(TINY, "ads", steps=2, batch_size=40, group_size=4)
    assert res.config["policy_kwargs"]["mini_cluster_size"] == 10
    res = simulate(TINY, "ads", steps=2, batch_size=40, group_size=4, policy_kwargs={"mini_cluster_size": 3})
    assert res.config["policy_kwargs"]["mini_cluster_size"] == 3


# ---- learning tests ------------------------------------------------------------------------
ADAPTIVE = proposal_names(adaptive_only=True)
SEEDS = (0, 1, 2)
MAX_STEPS = 1000
# ADS (card 1) tilts its cluster mixture towards clusters with *higher* success and starts each
# cluster's window at the easiest B prompts, moving it at most one rank per step and
# resetting it every len(pool)/128 steps. On the ladder (clusters = rungs) it keeps training
# on the easiest prompts of each rung (windows stay in the easiest ~3%), so with card
# defaults it is slower than uniform. Reported, not tuned away.
KNOWN_SLOWER = {"ads": "ADS with card defaults trains on the easiest prompts of each cluster "
                       "(windows start at rank 0, move ≤ 1 rank/step, reset every |D|/128 steps)"}
# Slower or no faster on the ladder only (they pass the homogeneous test, so a strict xfail
# there would XPASS). DataFlex's tscl (card 3, config 13) at its T = 1 scores |slope| in
# reward per step (~0.002 on the ladder), so softmax(|slope|/1) is uniform to within a
# max/min probability ratio of 1.05 over 300 steps: measured 350/350/350 steps on seeds
# 0/1/2, the same as uniform (T = 0.001 would give 290/290/280). Reported, not tuned away.
KNOWN_NOT_FASTER_ON_LADDER = {
    **KNOWN_SLOWER,
    "tscl": "tscl at DataFlex's T = 1 stays uniform (|slope| ~ 0.002 reward/step): 350 steps "
            "on seeds 0-2, equal to uniform's 350",
    "epiplexity": "epiplexity learns from held-out loss curves (Scheduler.observe_losses), which the "
                  "simulator does not produce: it stays uniform (350 steps on seeds 0-2, as uniform)",
}


# Held-out domain-balanced accuracy to reach (start: ladder 0.44, homogeneous 0.35).
TARGET = {"ladder": 0.8, "homogeneous": 0.8}


def _steps(scenario, policy, seed):
    res = simulate(scenario, policy, steps=MAX_STEPS, seed=seed, eval_every=10, target=TARGET[scenario],
                   stop_at_target=True)
    return res.steps_to_target


@pytest.fixture(scope="module")
def uniform_steps():
    return {name: [_steps(name, "uniform", s) for s in SEEDS] for name in ("ladder", "homogeneous")}


def test_adaptive_list_is_populated():
    assert {"dump"} <= set(ADAPTIVE) and "uniform" not in ADAPTIVE and "fixed_mixture" not in ADAPTIVE


@pytest.mark.parametrize("policy", [pytest.param(p, marks=pytest.mark.xfail(reason=KNOWN_NOT_FASTER_ON_LADDER[p],
                                                                          strict=True))
                                    if p in KNOWN_NOT_FASTER_ON_LADDER else p for p in ADAPTIVE])
def test_ladder_adaptive_beats_uniform(policy, uniform_steps):
    """Target: held-out domain-balanced accuracy 0.8 (ladder default; start 0.44).
    Uniform needs ~350 steps; every adaptive proposal policy must need fewer on each seed."""
    base = uniform_steps["ladder"]
    assert all(b is not None for b in base)
    got = [_steps("ladder", policy, s) for s in SEEDS]
    assert all(g is not None and g < b for g, b in zip(got, base)), (policy, got, base)


HOMOGENEOUS_MARGIN = 1.10   # steps-to-target at most 10% above uniform's (plus one eval period)


@pytest.mark.parametrize("policy", [pytest.param(p, marks=pytest.mark.xfail(reason=KNOWN_SLOWER[p], strict=True))
                                    if p in KNOWN_SLOWER else p for p in ADAPTIVE])
def test_homogeneous_not_worse_than_uniform(policy, uniform_steps):
    """One domain: mixtures reduce to uniform. Target 0.8 (start 0.35); uniform needs ~410
    steps. Each adaptive proposal policy may be at most 10% slower (+10 steps of eval grid)."""
    base = uniform_steps["homogeneous"]
    got = [_steps("homogeneous", policy, s) for s in SEEDS]
    assert all(g is not None and g <= HOMOGENEOUS_MARGIN * b + 10 for g, b in zip(got, base)), (policy, got, base)


# ---- progress and CLI ----------------------------------------------------------------------
def test_progress_bar_plain_fallback_without_tqdm(monkeypatch, capsys):
    import sys as _sys

    from rlpace.sim import progress_bar
    monkeypatch.setitem(_sys.modules, "tqdm", None)            # import tqdm → ImportError
    monkeypatch.setitem(_sys.modules, "tqdm.auto", None)
    bar = progress_bar(20, desc="run")
    assert type(bar).__name__ == "_PlainBar"
    for _ in range(20):
        bar.set_postfix_str("acc=0.5", refresh=False)
        bar.update(1)
    bar.close()
    err = capsys.readouterr().err
    assert "run" in err and "100.0%" in err and "acc=0.5" in err


def test_cli_simulate_side_by_side_and_json(tmp_path, capsys):
    from rlpace.cli import main
    out = tmp_path / "sim.json"
    rc = main(["simulate", "--scenario", "ladder", "--policy", "dump", "--steps", "30", "--seed", "0,1",
               "--batch-size", "32", "--group-size", "8", "--set", "prompts_per_domain=40",
               "--target", "0.45", "--no-progress", "--json", str(out), "dump.temperature=0.2"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "uniform" in text and "dump" in text and "×uniform" in text and "steps→tgt" in text
    data = json.loads(out.read_text())
    rows = {r["policy"]: r for r in data["summary"]}
    assert set(rows) == {"uniform", "dump"} and rows["uniform"]["vs_uniform"] == 1.0
    assert len(data["runs"]) == 4 and data["runs"][-1]["config"]["policy_kwargs"] == {"temperature": 0.2}
    direct = simulate(make_scenario("ladder", prompts_per_domain=40), "dump", steps=30, seed=1, batch_size=32,
                      group_size=8, target=0.45, policy_kwargs={"temperature": 0.2})
    assert data["runs"][-1]["mean_accuracy"] == pytest.approx(direct.mean_accuracy.tolist())
    assert main(["simulate", "--policy", "dump", "--steps", "2", "--no-progress", "bogus=1"]) == 2
    assert main(["simulate", "--policy", "dump", "--steps", "2", "--no-progress", "sec.alpha=1"]) == 2
    assert main(["simulate", "--set", "nope=1", "--steps", "2", "--no-progress"]) == 2
