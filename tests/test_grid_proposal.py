"""criticality_grid (criticality-guided IS over a parameter grid), tasks=grid:<family>, and the
trainer pools' prompt features."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

from rlpace import Feedback, Pool, Scheduler
from rlpace.policies import criticality_grid, grid_proposal, grid_weights
from rlpace.policies._base import MIXTURE, REWEIGHTING
from rlpace.tasks import make_taskset, prompt_features
from rlpace.tasks._grid import cell_keys, grid_pool

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_contract import assert_resume_equivalent  # noqa: E402

# 3 cells of unequal size, no features, no difficulty: a cell's design row is [1, onehot(cell)]
POOL3 = Pool(["a"] * 4 + ["b"] * 6 + ["c"] * 2)
THETA = np.array([0.0, 0.0, math.log(4.0), -math.log(4.0)])      # π̂ = [1/2, 4/5, 1/5]


def _hand_q():
    """c = 4π(1 − π) = [1, 0.64, 0.64]; q = 0.9·softmax(3(c − 1)) + 0.1/3 (α = 3, ε = 0.1)."""
    e = math.exp(3.0 * (0.64 - 1.0))
    z = 1.0 + 2.0 * e
    return np.array([0.9 / z + 0.1 / 3, 0.9 * e / z + 0.1 / 3, 0.9 * e / z + 0.1 / 3]), z


def _staged(policy, z):
    """`policy`'s state with stage weights THETA and that stage's normaliser, written by hand."""
    st = policy.init(POOL3)
    return st._replace(predictor=st.predictor._replace(stage_theta=THETA.copy()),
                       norm=np.array([1.0, 1.0, z, 0.0]))


def test_q_over_a_three_cell_grid_is_hand_computed():
    q_hand, z = _hand_q()
    assert q_hand.round(3).tolist() == [0.569, 0.215, 0.215]
    mix = grid_proposal()
    assert mix.kind == MIXTURE and mix.arms == "domain"
    np.testing.assert_allclose(mix.apply(_staged(mix, z), POOL3), q_hand, rtol=1e-12)
    # exact weights p/q' with p = 1/3 per cell, whichever prompt of the cell was drawn
    rw = grid_weights(unbiased=True)
    assert rw.kind == REWEIGHTING
    from rlpace.types import Batch
    ids = np.array([0, 5, 11, 3])                                  # cells a, b, c, a
    batch = Batch.from_feedback(Feedback(ids, np.zeros((4, 2)), step=0), POOL3, 0.5)
    w = rw.apply(_staged(rw, z), POOL3, batch)
    np.testing.assert_allclose(w[:, 0], (1 / 3) / q_hand[[0, 1, 2, 0]], rtol=1e-12)
    np.testing.assert_allclose(w[:, 0], [0.58551, 1.54789, 1.54789, 0.58551], atol=1e-5)
    # default weights: floored at 0.1 (no effect here), divided by the batch mean 1.06670
    shaped = grid_weights()
    w = shaped.apply(_staged(shaped, z), POOL3, batch)
    np.testing.assert_allclose(w[:, 0], [0.54890, 1.45110, 1.45110, 0.54890], atol=1e-5)


def test_a_stage_switch_sets_q_from_the_refit_predictor():
    s = Scheduler(POOL3, "criticality_grid", seed=0, stage_steps=2)
    rates = np.array([0.9, 0.5, 0.1])                              # cell a mostly solved, b at 1/2
    rng = np.random.default_rng(1)
    for t in range(2):
        ids = np.arange(12)
        s.observe(Feedback(ids, (rng.random((12, 16)) < rates[POOL3.domains][:, None]).astype(float), step=t))
    st = s.states[MIXTURE]
    assert int(st.predictor.stage) == 1
    th = st.predictor.stage_theta                                  # design [1, onehot]: logit_k = θ0 + θ_{1+k}
    pi = 1.0 / (1.0 + np.exp(-(th[0] + th[1:])))
    c = 4.0 * pi * (1.0 - pi)
    e = np.exp(3.0 * (c - c.max()))
    q = 0.9 * e / e.sum() + 0.1 / 3
    np.testing.assert_allclose(s.domain_probs(), q, rtol=1e-9)
    assert int(np.argmax(q)) == 1                                  # the cell at a 1/2 pass rate


def test_unbiased_weights_estimate_the_p_mean():
    q_hand, z = _hand_q()
    s = Scheduler(POOL3, "criticality_grid", seed=3, unbiased=True)
    s.states[MIXTURE] = _staged(s.method.mixture, z)
    s.states[REWEIGHTING] = _staged(s.method.reweighting, z)
    ids = s.propose(100_000)
    f = np.random.default_rng(5).standard_normal(len(POOL3)) + 3.0 * (POOL3.domains == 0)
    # p: a cell uniformly (1/3 each), then a prompt of it uniformly
    p_mean = np.mean([f[POOL3.domains == k].mean() for k in range(3)])
    w = s.loss_weights(Feedback(ids, np.zeros((ids.size, 1)), step=0))[:, 0]
    est = w * f[ids]
    half = 2.576 * est.std(ddof=1) / np.sqrt(ids.size)            # 99 % CI
    assert abs(est.mean() - p_mean) < half
    assert abs(f[ids].mean() - p_mean) > 5 * half                  # unweighted draws are biased: power
    # the cells are drawn from q
    freq = np.bincount(POOL3.domains[ids], minlength=3) / ids.size
    np.testing.assert_allclose(freq, q_hand, atol=4 * np.sqrt(0.25 / ids.size))


def test_items_are_drawn_only_from_the_chosen_cells():
    # α = 50, ε = 0: q ≈ [1, 1.5e-8, 1.5e-8] — every prompt must come from cell a
    s = Scheduler(POOL3, "criticality_grid", seed=0, alpha=50.0, epsilon=0.0)
    e = math.exp(50.0 * (0.64 - 1.0))
    for kind in (MIXTURE, REWEIGHTING):
        st = s.states[kind]
        s.states[kind] = st._replace(predictor=st.predictor._replace(stage_theta=THETA.copy()),
                                     norm=np.array([1.0, 1.0, 1.0 + 2.0 * e, 0.0]))
    ids = s.propose(2000)
    assert set(POOL3.domains[ids].tolist()) == {0}
    assert set(ids.tolist()) == {0, 1, 2, 3}                     # and every prompt of the cell


def _drive(s, steps, start=0):
    rng = np.random.default_rng(start + 11)
    rates = np.array([0.9, 0.5, 0.1])
    out = []
    for t in range(start, start + steps):
        ids = s.propose(6)
        r = (rng.random((6, 4)) < rates[POOL3.domains[ids]][:, None]).astype(float)
        fb = Feedback(ids, r, step=t)
        s.observe(fb)
        out.append((ids, s.loss_weights(fb)))
    return out


def test_reproducible_from_seed_and_step():
    a = _drive(Scheduler(POOL3, "criticality_grid", seed=7, stage_steps=2), 8)
    b = _drive(Scheduler(POOL3, "criticality_grid", seed=7, stage_steps=2), 8)
    c = _drive(Scheduler(POOL3, "criticality_grid", seed=8, stage_steps=2), 8)
    for (ia, wa), (ib, wb) in zip(a, b):
        np.testing.assert_array_equal(ia, ib)
        np.testing.assert_array_equal(wa, wb)
    assert any(not np.array_equal(ia, ic) for (ia, _), (ic, _) in zip(a, c))


def test_exact_resume_mid_stage():
    ref = Scheduler(POOL3, "criticality_grid", seed=4, stage_steps=3)
    _drive(ref, 4)                                                 # one stage switch done, one under way
    fresh = Scheduler(POOL3, "criticality_grid", seed=99, stage_steps=3)
    fresh.load_state_dict(ref.state_dict())
    for (i1, w1), (i2, w2) in zip(_drive(ref, 6, start=4), _drive(fresh, 6, start=4)):
        np.testing.assert_array_equal(i1, i2)
        np.testing.assert_array_equal(w1, w2)
    assert ref.metrics() == fresh.metrics()


@pytest.mark.parametrize("at", [0, 5])
def test_contract_resume_helper(at):
    from test_contract import STREAM
    assert_resume_equivalent("criticality_grid", STREAM, at, stage_steps=3)


def test_cell_features_are_the_mean_of_the_cells_prompts():
    ts = make_taskset("grid:max", train_per_domain=3, heldout_per_domain=1)
    pool = ts.pool(features=prompt_features(ts))
    from rlpace.policies._grid import cell_pool
    cells = cell_pool(pool)
    assert cells.domain_names == pool.domain_names == ts.domains
    k = pool.domain_names.index("max4")
    # family one-hot (max only: 1), size 4 / 10, log(1 + len("x:dddd=")) = log 8
    np.testing.assert_allclose(cells.features[k], [1.0, 0.4, math.log(8.0)], rtol=1e-6)
    assert cells.difficulty[k] == 4.0


def test_prompt_features_hand_computed():
    ts = make_taskset("embedded:sort3,last4,sort6", train_per_domain=1, heldout_per_domain=1)
    f = prompt_features(ts)
    assert f.dtype == np.float32 and f.shape == (3, 4)          # families (last, sort) + size + length
    # sort3 's:ddd=' (6 chars), last4 'l:abcd=' (7), sort6 's:dddddd=' (9); sort's max size here 6
    np.testing.assert_allclose(f, [[0, 1, 0.5, math.log(7)], [1, 0, 1.0, math.log(8)],
                                   [0, 1, 1.0, math.log(10)]], rtol=1e-6)
    pool = ts.pool(features=f)
    assert pool.features.shape == (3, 4) and pool.fingerprint() != ts.pool().fingerprint()


def test_grid_task_spec_and_its_errors():
    ts = make_taskset("grid:mul", train_per_domain=2, heldout_per_domain=1)
    assert ts.domains == ("mul1", "mul2", "mul3", "mul4")
    with pytest.raises(ValueError, match="unknown family 'bogus'.*sort"):
        make_taskset("grid:bogus")


def test_bad_hyperparameters_name_the_policy():
    with pytest.raises(ValueError, match="criticality_grid alpha"):
        criticality_grid(alpha=-1.0)
    with pytest.raises(ValueError, match="criticality_grid weight_clamp must be ≥ weight_floor"):
        criticality_grid(weight_floor=2.0, weight_clamp=1.0)


def test_trainer_runs_the_grid_and_logs_the_ess(tmp_path):
    import json

    from _tiny_train import read_log, tiny_config
    from rlpace.train import train
    cfg = tiny_config(tmp_path / "run", str(tmp_path / "cache"), tasks="grid:mul", policy="criticality_grid",
                      policy_kwargs='{"stage_steps": 2}', train_per_domain=8, heldout_per_domain=2, steps=3)
    train(cfg)
    recs = [r for r in read_log(tmp_path / "run") if not r.get("final")]
    assert [r["sched/criticality/stage"] for r in recs] == [0.0, 1.0, 1.0]   # a refit every 2 updates
    assert all(0.0 < r["sched/criticality/ess_fraction"] <= 1.0 + 1e-9 for r in recs)
    # the Scheduler's pool is the grid: 4 cells with their features (part of the checkpointed fingerprint)
    with np.load(tmp_path / "run" / "checkpoint" / "scheduler.npz") as z:
        parts = json.loads(str(z["meta/pool_parts"]))
    ts = make_taskset("grid:mul", train_per_domain=8, heldout_per_domain=2)
    assert parts == grid_pool(ts).fingerprint_parts()
    assert all(0 <= i < 4 for r in recs for i in r["prompt_ids"])    # cells


def test_grid_items_are_fresh_items_of_the_proposed_cells():
    from rlpace.tasks._generator import fresh_items
    ts = make_taskset("grid:sort", train_per_domain=4, heldout_per_domain=4)
    pool = grid_pool(ts)
    cells = np.array([3, 3, 0, 7])
    a = fresh_items(pool.domain_names, cell_keys(cells, step=5, round_=0), seed=0)
    b = fresh_items(pool.domain_names, cell_keys(cells, step=6, round_=0), seed=0)
    assert [it.domain for it in a] == ["sort4", "sort4", "sort1", "sort8"]            # only the chosen cells
    assert [len(it.prompt) for it in a] == [len("s:dddd="), len("s:dddd="), len("s:d="), len("s:dddddddd=")]
    assert a[0].prompt != a[1].prompt and a[0].prompt != b[0].prompt                  # fresh per slot and step
    assert a[0].prompt == fresh_items(pool.domain_names, cell_keys(cells, 5, 0), seed=0)[0].prompt  # pure


def test_trainer_grid_resumes_exactly(tmp_path):
    import dataclasses

    from _tiny_train import read_log, tiny_config
    from rlpace.train import train
    kw = dict(tasks="grid:mul", policy="criticality_grid", policy_kwargs='{"stage_steps": 2}',
              train_per_domain=8, heldout_per_domain=2, checkpoint_every=3)
    cache = str(tmp_path / "cache")
    train(tiny_config(tmp_path / "full", cache, steps=5, **kw))
    part = tiny_config(tmp_path / "part", cache, steps=3, **kw)
    train(part)
    train(dataclasses.replace(part, steps=5, resume=True))       # resumes mid-stage (3 updates, stage 2)
    a = [r for r in read_log(tmp_path / "full") if not r.get("final")]
    b = [r for r in read_log(tmp_path / "part") if not r.get("final")]
    assert [r["step"] for r in b] == list(range(5))
    for ra, rb in zip(a[3:], b[3:]):
        assert ra["prompt_ids"] == rb["prompt_ids"]
        assert {k: v for k, v in ra.items() if k.startswith("sched/")} == \
            {k: v for k, v in rb.items() if k.startswith("sched/")}
    with np.load(tmp_path / "full" / "checkpoint" / "scheduler.npz") as za, \
            np.load(tmp_path / "part" / "checkpoint" / "scheduler.npz") as zb:
        assert all(np.array_equal(za[k], zb[k]) for k in za.files)


# ---- ESS in the trainer tables -------------------------------------------------------------------
def _step_log(accs, ess=None):
    """A trainer metrics.jsonl as rows: an evaluation every step, 8 rollouts a step."""
    rows = []
    for t, a in enumerate(accs[:-1]):
        r = {"step": t, "rollouts": 8, "rollouts_total": 8 * (t + 1), "eval/x": a, "eval/mean": a}
        if ess is not None:
            r["sched/criticality/ess_fraction"] = ess[t]
        rows.append(r)
    rows.append({"step": len(accs) - 1, "final": True, "eval/x": accs[-1], "eval/mean": accs[-1]})
    return rows


def test_headroom_table_has_an_ess_column_blank_without_weights():
    bench = Path(__file__).resolve().parents[1] / "benchmarks"
    sys.path.insert(0, str(bench))
    import headroom
    from rlpace.evaluation import Curve
    assert headroom.ess_fraction(_step_log([0.1, 0.2, 0.3], ess=[0.5, 1.0])) == 0.75
    assert math.isnan(headroom.ess_fraction(_step_log([0.1, 0.2, 0.3])))
    x = np.array([0.0, 100.0, 200.0, 300.0])
    u = {s: Curve(x, np.array([0.2, 0.4, 0.6, 0.7])) for s in (0, 1)}
    m = {s: Curve(x, np.array([0.2, 0.45, 0.7, 0.7])) for s in (0, 1)}
    rows = headroom.headroom_rows("t", {"uniform": u, "criticality_is": m}, {"uniform": 0.5, "criticality_is": 0.5},
                                  fraction=0.8, tail=1, ess={"uniform": math.nan, "criticality_is": 0.625})
    md = headroom.markdown(rows, 0.8)
    head = next(ln for ln in md.splitlines() if ln.startswith("| policy"))
    assert head.rstrip(" |").endswith("ESS / B")
    line = {ln.split(" | ")[0][2:]: ln for ln in md.splitlines() if ln.startswith("| ")}
    assert line["criticality_is"].endswith("| 0.62 |") or line["criticality_is"].endswith("| 0.63 |")
    assert line["uniform"].endswith("|  |")                        # blank: weights 1


def test_report_efficiency_table_has_an_ess_column(tmp_path):
    from rlpace.evaluation import write_report
    from rlpace.evaluation._analysis import analyze
    from rlpace.experiments._records import record_from_step_log
    recs = []
    for s in range(2):
        for lab, accs, ess in (("uniform", [0.2, 0.4, 0.6, 0.7], None),
                               ("criticality_is", [0.2, 0.5, 0.7, 0.7], [0.5, 0.7, 0.9] if s else [0.3, 0.3, 0.3])):
            recs.append(record_from_step_log(_step_log(accs, ess), run_id=f"{lab}{s}", label=lab, policy=lab,
                                             seed=s, suite="t", backend="embedded", budget_steps=3))
    files = write_report(analyze(recs, baseline="uniform", n_boot=200, random_state=0), tmp_path / "rep")
    md = files.markdown.read_text()
    lines = md.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith("| method | paired seeds | rollouts to"))
    assert lines[at].rstrip(" |").endswith("ESS / B (loss weights)")
    row = next(ln for ln in lines[at:] if ln.startswith("| criticality_is | 2 | "))
    assert row.endswith("| 0.50 |")                                # mean(0.7, 0.3)
    assert "ESS / B" in files.html.read_text()


def test_trainer_grid_refuses_settings_it_cannot_honour(tmp_path):
    from _tiny_train import tiny_config
    from rlpace.train import check_config, train
    base = dict(tasks="grid:mul", policy="criticality_grid", train_per_domain=8, heldout_per_domain=2)
    with pytest.raises(ValueError, match="tasks=grid:<family> rolls out fresh items.*lilo_candidates=0"):
        check_config(tiny_config(tmp_path / "a", str(tmp_path / "c"), lilo_candidates=2, **base))
    with pytest.raises(ValueError, match="unknown family 'nope'"):
        check_config(tiny_config(tmp_path / "a", str(tmp_path / "c"), **{**base, "tasks": "grid:nope"}))
    with pytest.raises(ValueError, match="an oracle cannot measure"):
        train(tiny_config(tmp_path / "a", str(tmp_path / "c"), **{**base, "policy": "oracle_boundary"}))
    assert not (tmp_path / "a").exists()                               # refused before any work


# ---- tasks=grid:rg:NAME:FIELD=v1,v2,... — a reasoning-gym dataset's config as the grid ------------
KK = "grid:rg:knights_knaves:n_people=3,4,6"


def _kk_question(seed: int, n: int, **fixed) -> dict:
    """reasoning-gym's own knights-and-knaves entry for (seed, n_people), called directly."""
    import reasoning_gym
    return reasoning_gym.create_dataset("knights_knaves", size=1, seed=seed, n_people=n, **fixed)[0]


def test_rg_grid_spec_names_one_cell_per_value():
    pytest.importorskip("reasoning_gym")
    from rlpace.tasks._grid import grid_cells, rg_cell, rg_grid
    assert grid_cells("grid:rg:knights_knaves:n_people=3,4,5,6") == [
        "rg:knights_knaves:n_people=3", "rg:knights_knaves:n_people=4", "rg:knights_knaves:n_people=5",
        "rg:knights_knaves:n_people=6"]
    cells = rg_grid(" grid:rg:knights_knaves:n_people=6, 3 ; depth_constraint=1;width_constraint=3 ")
    assert [c.label for c in cells] == ["rg:knights_knaves:n_people=6;depth_constraint=1;width_constraint=3",
                                        "rg:knights_knaves:n_people=3;depth_constraint=1;width_constraint=3"]
    assert [c.difficulty for c in cells] == [6.0, 3.0]
    assert cells[1].dataset == "knights_knaves"
    assert cells[1].config == {"n_people": 3, "depth_constraint": 1, "width_constraint": 3}
    assert rg_cell(cells[1].label) == cells[1]                      # a cell's name reads back exactly
    # a tuple as a fixed value, a float grid value
    ar = rg_grid("grid:rg:basic_arithmetic:max_terms=2,3.0;operators=('+', '-')")
    assert [c.label for c in ar] == ["rg:basic_arithmetic:max_terms=2;operators=('+', '-')",
                                     "rg:basic_arithmetic:max_terms=3.0;operators=('+', '-')"]
    assert [rg_cell(c.label).config for c in ar] == [{"max_terms": 2, "operators": ("+", "-")},
                                                     {"max_terms": 3.0, "operators": ("+", "-")}]


@pytest.mark.parametrize("spec, match", [
    ("grid:rg:knights_knaves", r"names no grid field; write grid:rg:NAME:FIELD=v1,v2"),
    ("grid:rg:knights_knaves:n_people", r"names no grid field"),
    ("grid:rg:knights_knaves:people=3,4", r"no config field\(s\) \['people'\]; valid fields: \['depth_constraint'"),
    ("grid:rg:knights_knaves:n_people=3,many", r"grid field 'n_people' has the value 'many'; a grid's values are "
                                               r"finite numbers"),
    ("grid:rg:knights_knaves:n_people=3,", r"grid field 'n_people' has the value ''"),
    ("grid:rg:knights_knaves:n_people=3,4,3", r"grid field 'n_people' repeats the value 3"),
    ("grid:rg:knights_knaves:n_people=0,3", r"reasoning-gym rejects knights_knaves config \{'n_people': 0\}.*"
                                            r"Number of people must be at least 1"),
    ("grid:rg:knights_knaves:depth_constraint=1;n_people=3,4", r"n_people=3,4 lists values, but only the first "
                                                               r"key=value item is the grid"),
    ("grid:rg:knights_knaves:n_people=3,4;n_people=5", r"'n_people' is the grid field; it cannot also be fixed"),
    ("grid:rg:knights_knaves:n_people=3;depth_constraint", r"config item 'depth_constraint'.* is not key=value"),
    ("grid:rg:knights_and_knaves:n_people=3", r"unknown reasoning-gym dataset 'knights_and_knaves'"),
    ("grid:rg:knights_knaves:n_people=3|rg:gcd", r"a grid runs over one reasoning-gym dataset"),
])
def test_rg_grid_bad_specs_name_the_field(spec, match):
    pytest.importorskip("reasoning_gym")
    from rlpace.train import check_config
    with pytest.raises(ValueError, match=match):
        make_taskset(spec, train_per_domain=1, heldout_per_domain=1)
    from _tiny_train import tiny_config
    with pytest.raises(ValueError, match=match):                      # the trainer: before any work
        check_config(tiny_config("/nonexistent/out", "/nonexistent/cache", tasks=spec))


def test_rg_grid_cells_and_features_by_hand():
    pytest.importorskip("reasoning_gym")
    import json
    ts = make_taskset(KK, train_per_domain=2, heldout_per_domain=1)
    assert ts.name == KK
    assert ts.domains == ("rg:knights_knaves:n_people=3", "rg:knights_knaves:n_people=4",
                          "rg:knights_knaves:n_people=6")
    for it in ts.train + ts.heldout:              # each cell's items: reasoning-gym's, at the cell's config
        n = int(it.domain.rsplit("=", 1)[1])
        assert it.difficulty == n and len(json.loads(it.entry)["metadata"]["names"]) == n
        assert it.ability == "reasoning_gym"
    pool = grid_pool(ts)
    assert pool.domain_names == ts.domains and len(pool) == 3
    assert pool.difficulty.tolist() == [3.0, 4.0, 6.0]
    np.testing.assert_allclose(pool.features, [[3 / 6], [4 / 6], [1.0]], rtol=1e-6)    # value / max |value|
    assert pool.features.dtype == np.float32


def test_rg_grid_fresh_items_are_reasoning_gyms_items_at_a_key_derived_seed():
    reasoning_gym = pytest.importorskip("reasoning_gym")
    import json

    from rlpace.tasks import rg_score
    from rlpace.tasks._generator import fresh_items
    names = ("rg:knights_knaves:n_people=3", "rg:knights_knaves:n_people=4", "rg:knights_knaves:n_people=6")
    keys = cell_keys(np.array([0, 2, 2, 1]), step=5, round_=1)
    items = fresh_items(names, keys, seed=3)
    # independent reference: the seed is the first integer of default_rng([seed, 7, cell, step, round, slot])
    for (c, t, r, j), it in zip(keys.tolist(), items):
        s = int(np.random.default_rng([3, 7, c, t, r, j]).integers(2**31 - 1))
        e = _kk_question(s, (3, 4, 6)[c])
        assert (it.prompt, it.answer, it.domain, it.difficulty, it.index) == \
            (e["question"], e["answer"], names[c], float((3, 4, 6)[c]), j)
        # graded by reasoning-gym's own scorer: the gold answer scores 1, a flipped one less
        score = reasoning_gym.get_score_answer_fn("knights_knaves")
        assert score(it.answer, json.loads(it.entry)) == 1.0
        meta = json.loads(it.entry)["metadata"]
        terms, first = meta["knight_knave_terms"], meta["names"][0]
        good, bad = (terms["a_knight"], terms["a_knave"]) if meta["solution"][0] else \
            (terms["a_knave"], terms["a_knight"])
        flipped = it.answer.replace(f"{first} is {good}", f"{first} is {bad}", 1)
        assert flipped != it.answer and score(flipped, json.loads(it.entry)) < 1.0
        assert rg_score(f"<answer>{it.answer}</answer>", it) == 1.0 and rg_score(flipped, it) < 1.0
    ts = make_taskset(KK, train_per_domain=1, heldout_per_domain=1)
    assert ts.score(items, [it.answer for it in items]).tolist() == [1.0] * 4      # the task set's scorer
    # reproducible from the key; new at every slot, step and round
    again = fresh_items(names, keys, seed=3)
    assert [(it.prompt, it.answer) for it in again] == [(it.prompt, it.answer) for it in items]
    assert items[1].prompt != items[2].prompt                                   # same cell, two slots
    for other in (cell_keys(np.array([0, 2, 2, 1]), step=6, round_=1),
                  cell_keys(np.array([0, 2, 2, 1]), step=5, round_=2)):
        assert all(a.prompt != b.prompt for a, b in zip(items, fresh_items(names, other, seed=3)))
    assert all(a.prompt != b.prompt for a, b in zip(items, fresh_items(names, keys, seed=4)))


def test_rg_grid_fresh_item_is_never_a_heldout_prompt():
    pytest.importorskip("reasoning_gym")
    from rlpace.tasks._generator import fresh_items
    names = ("rg:knights_knaves:n_people=3",)
    key = np.array([[0, 2, 0, 1]])
    rng = np.random.default_rng([0, 7, 0, 2, 0, 1])
    first, second = (_kk_question(int(rng.integers(2**31 - 1)), 3)["question"] for _ in range(2))
    assert fresh_items(names, key, seed=0)[0].prompt == first
    # the first draw is a held-out prompt: the item is the next draw of the same stream
    assert fresh_items(names, key, seed=0, exclude=frozenset([first]))[0].prompt == second

    class Everything:                              # every prompt held out: the cell's training items
        def __contains__(self, prompt):
            return True
    ts = make_taskset("grid:rg:knights_knaves:n_people=3", train_per_domain=3, heldout_per_domain=1)
    got = fresh_items(names, key, seed=0, exclude=Everything(), fallback=(ts.train,))
    assert got == [ts.train[1]]                    # slot 1 of 3
    with pytest.raises(ValueError, match="no prompt outside the held-out set"):
        fresh_items(names, key, seed=0, exclude=Everything())


def test_trainer_runs_an_rg_grid_on_fresh_items(tmp_path, monkeypatch):
    pytest.importorskip("reasoning_gym")
    import json

    import rlpace.train.generated as generated
    from _tiny_train import read_log, tiny_config
    from rlpace.train import train
    made = []                                      # (keys, items) of every fresh batch the trainer rolled out

    def spy(names, keys, seed, **kw):
        items = generated_fresh_items(names, keys, seed, **kw)
        made.append((np.asarray(keys).copy(), items))
        return items
    generated_fresh_items = generated.fresh_items
    monkeypatch.setattr(generated, "fresh_items", spy)
    spec = "grid:rg:basic_arithmetic:max_terms=2,3;max_digits=1;operators=('+',)"
    cfg = tiny_config(tmp_path / "run", str(tmp_path / "cache"), tasks=spec, policy="criticality_grid",
                      policy_kwargs='{"stage_steps": 2}', train_per_domain=8, heldout_per_domain=2, steps=3,
                      warmup_mistakes="none")
    train(cfg)
    recs = [r for r in read_log(tmp_path / "run") if not r.get("final")]
    assert [r["step"] for r in recs] == [0, 1, 2]
    assert [r["sched/criticality/stage"] for r in recs] == [0.0, 1.0, 1.0]   # a refit every 2 updates
    assert all(0.0 < r["sched/criticality/ess_fraction"] <= 1.0 + 1e-9 for r in recs)
    assert all(0 <= i < 2 for r in recs for i in r["prompt_ids"]) and all(len(r["prompt_ids"]) == 4 for r in recs)
    cells = ["rg:basic_arithmetic:max_terms=2;max_digits=1;operators=('+',)",
             "rg:basic_arithmetic:max_terms=3;max_digits=1;operators=('+',)"]
    assert all(f"eval/{c}" in recs[0] for c in cells)                  # held-out accuracy per cell
    # every step rolled out fresh items of the proposed cells, keyed (cell, step, round 0, slot)
    assert [k[:, 0].tolist() for k, _ in made] == [r["prompt_ids"] for r in recs]
    assert [k[:, 1:].tolist() for k, _ in made] == [[[t, 0, j] for j in range(4)] for t in range(3)]
    ts = make_taskset(spec, train_per_domain=8, heldout_per_domain=2)
    stored = {it.prompt for it in ts.train + ts.heldout}
    for keys, items in made:
        assert [it.domain for it in items] == [cells[c] for c in keys[:, 0]]
        assert all(it.prompt not in {h.prompt for h in ts.heldout} for it in items)
        assert sum(it.prompt in stored for it in items) <= 1     # new items (a short prompt may recur by chance)
    with np.load(tmp_path / "run" / "checkpoint" / "scheduler.npz") as z:
        parts = json.loads(str(z["meta/pool_parts"]))
    assert parts == grid_pool(ts).fingerprint_parts()                  # the pool is the 2 cells, features [2/3, 1]
    np.testing.assert_allclose(grid_pool(ts).features[:, 0], [2 / 3, 1.0], rtol=1e-6)


def test_trainer_rg_grid_resumes_exactly(tmp_path):
    pytest.importorskip("reasoning_gym")
    import dataclasses

    from _tiny_train import read_log, tiny_config
    from rlpace.train import train
    kw = dict(tasks="grid:rg:knights_knaves:n_people=2,3", policy="criticality_grid",
              policy_kwargs='{"stage_steps": 2}', train_per_domain=4, heldout_per_domain=1, checkpoint_every=2,
              warmup_mistakes="none", warmup_steps=20, batch_prompts=2, group_size=2, max_new_tokens=2)
    cache = str(tmp_path / "cache")
    train(tiny_config(tmp_path / "full", cache, steps=4, **kw))
    part = tiny_config(tmp_path / "part", cache, steps=2, **kw)
    train(part)
    train(dataclasses.replace(part, steps=4, resume=True))
    a = [r for r in read_log(tmp_path / "full") if not r.get("final")]
    b = [r for r in read_log(tmp_path / "part") if not r.get("final")]
    assert [r["step"] for r in b] == list(range(4))
    for ra, rb in zip(a[2:], b[2:]):
        assert ra["prompt_ids"] == rb["prompt_ids"]
        keep = ("sched/", "reward", "loss", "eval/")
        assert {k: v for k, v in ra.items() if k.startswith(keep)} == {k: v for k, v in rb.items() if k.startswith(keep)}
