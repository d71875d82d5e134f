"""Grid runner: resume after a kill, retry-once-then-fail, dead workers, and a tiny grid
end to end on the simulator."""

import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from rlpace.experiments import Grid, minimal_record, read_records, record_path, run_grid

HERE = Path(__file__).resolve().parent


# ---- a deterministic fake backend, importable by spawned workers ---------------------------------

def fake_run(spec):
    """A record whose numbers depend only on (label, seed). Side channels via spec.options:
    marker_dir (one line appended per call), crash_after (os._exit once that many calls were
    made in total), fail_labels (always raise), flaky (raise on the first call of each run),
    die_once (os._exit on the first call of these run_ids)."""
    opts = spec.options
    mdir = Path(opts["marker_dir"])
    mdir.mkdir(parents=True, exist_ok=True)
    marker = mdir / spec.run_id
    with open(marker, "a") as f:
        f.write("x\n")
    n_calls_run = len(marker.read_text().splitlines())
    total = sum(len(p.read_text().splitlines()) for p in mdir.iterdir())
    if opts.get("crash_after") is not None and total > opts["crash_after"]:
        os._exit(3)
    if spec.label in opts.get("fail_labels", ()):
        raise RuntimeError(f"boom in {spec.run_id}")
    if opts.get("flaky") and n_calls_run == 1:
        raise RuntimeError("transient failure")
    if spec.run_id in opts.get("die_once", ()) and n_calls_run == 1:
        os._exit(7)
    rng = np.random.default_rng([spec.seed, zlib.crc32(spec.label.encode())])
    acc = {"a": float(rng.uniform(0.3, 0.6)), "b": float(rng.uniform(0.3, 0.6))}
    rec = minimal_record(run_id=spec.run_id, label=spec.label, seed=spec.seed, final_acc=acc,
                         policy=spec.policy, suite=spec.suite, backend="fake", steps=spec.steps)
    rec["config"] = {"grid_run": spec.to_dict()}
    return rec


def _grid(tmp, **opts):
    return Grid(policies=("uniform", "dump", "sec"), seeds=3, suites="sim:toy", steps=5,
                options={"marker_dir": str(tmp / "markers"), **opts})


def _stable(records):
    """Records without the fields that legitimately change between runs (time stamps)."""
    out = {}
    for r in records:
        r = json.loads(json.dumps(r))
        r["provenance"].pop("created")
        out[r["run_id"]] = r
    return out


def _calls(tmp):
    return {p.name: len(p.read_text().splitlines()) for p in (tmp / "markers").iterdir()}


def test_resume_skips_finished_runs_and_gives_identical_records(tmp_path):
    # Kill a grid (hard exit of the process) during its 6th run, rerun: the 5 finished runs are
    # not recomputed, and the final records equal those of an uninterrupted run elsewhere.
    opts = {"crash_after": 5}
    grid = _grid(tmp_path / "a", **opts)
    g_json = json.dumps(grid.to_dict())
    script = (f"import sys, json; sys.path.insert(0, {str(HERE)!r}); "
              f"import test_experiments_grid as t; from rlpace.experiments import Grid, run_grid; "
              f"run_grid(Grid.from_dict(json.loads({g_json!r})), {str(tmp_path / 'a' / 'out')!r}, "
              f"workers=1, run_fn=t.fake_run, progress=False)")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 3, proc.stderr
    first = {p.stem for p in (tmp_path / "a" / "out" / "runs").glob("*.jsonl")}
    assert len(first) == 5
    mtimes = {p: p.stat().st_mtime_ns for p in (tmp_path / "a" / "out" / "runs").glob("*.jsonl")}
    # Rerun the same grid (same spec). The fake crash counts calls in the marker folder, so
    # clear it: the rerun then never passes the threshold (4 runs left ≤ 5).
    calls_before = _calls(tmp_path / "a")
    for p in (tmp_path / "a" / "markers").iterdir():
        p.unlink()
    res = run_grid(grid, tmp_path / "a" / "out", workers=1, run_fn=fake_run, progress=False)
    assert sorted(res.skipped) == sorted(first)
    assert len(res.ran) == 4 and not res.failed
    calls_after = _calls(tmp_path / "a")
    assert not (set(calls_after) & first), "a finished run was recomputed"
    assert all(n == 1 for n in calls_after.values())
    assert sum(calls_before.values()) == 6   # 5 finished + the one killed mid-run
    for p, t in mtimes.items():
        assert p.stat().st_mtime_ns == t     # finished records untouched
    # A third call does nothing at all.
    res3 = run_grid(grid, tmp_path / "a" / "out", workers=1, run_fn=fake_run, progress=False)
    assert res3.ran == [] and len(res3.skipped) == 9
    # Same records as an uninterrupted grid.
    ref_grid = _grid(tmp_path / "b", crash_after=10**6)
    run_grid(ref_grid, tmp_path / "b" / "out", workers=1, run_fn=fake_run, progress=False)
    a = _stable(read_records(tmp_path / "a" / "out" / "runs"))
    b = _stable(read_records(tmp_path / "b" / "out" / "runs"))
    for r in list(a.values()) + list(b.values()):
        r["config"]["grid_run"]["options"].pop("marker_dir")   # side channels of the fake
        r["config"]["grid_run"]["options"].pop("crash_after")
    assert a == b


def test_changed_configuration_is_refused_before_any_work(tmp_path):
    run_grid(_grid(tmp_path), tmp_path / "out", workers=1, run_fn=fake_run, progress=False)
    changed = Grid(policies=("uniform", "dump", "sec"), seeds=3, suites="sim:toy", steps=6,
                   options={"marker_dir": str(tmp_path / "markers")})
    before = _calls(tmp_path)
    with pytest.raises(ValueError, match=r"different configuration.*differs in \['steps'\]"):
        run_grid(changed, tmp_path / "out", workers=1, run_fn=fake_run, progress=False)
    assert _calls(tmp_path) == before


def test_flaky_run_is_retried_once_and_failing_run_is_reported(tmp_path):
    res = run_grid(_grid(tmp_path, flaky=True, fail_labels=["sec"]), tmp_path / "out", workers=1,
                   run_fn=fake_run, progress=False)
    calls = _calls(tmp_path)
    assert all(n == 2 for n in calls.values())          # every run: one failure + one retry
    assert sorted(res.failed) == [f"sim-toy__sec__seed{s}" for s in range(3)]
    assert "boom in sim-toy__sec__seed0" in res.failed["sim-toy__sec__seed0"]
    assert len(res.ran) == 6 and not res.complete
    failed_file = json.loads((tmp_path / "out" / "failed" / "sim-toy__sec__seed0.json").read_text())
    assert failed_file["attempts"] == 2 and "RuntimeError" in failed_file["error"]
    assert "FAILED" in res.summary()


def test_parallel_workers_survive_a_dying_worker(tmp_path):
    grid = Grid(policies=("uniform", "dump"), seeds=2, suites="sim:toy", steps=5,
                options={"marker_dir": str(tmp_path / "markers"),
                         "die_once": ["sim-toy__dump__seed0"]})
    res = run_grid(grid, tmp_path / "out", workers=2, run_fn=fake_run, progress=False)
    assert not res.failed and len(res.ran) == 4
    calls = _calls(tmp_path)
    assert calls["sim-toy__dump__seed0"] == 2            # died once, retried in a fresh pool
    recs = read_records(tmp_path / "out" / "runs")
    assert len(recs) == 4
    ref = {r["run_id"]: r["final"] for r in recs}
    # worker processes give the same numbers as this process
    for spec in grid.runs():
        assert fake_run(spec)["final"] == ref[spec.run_id]


def test_tiny_grid_end_to_end_on_the_simulator(tmp_path):
    from rlpace.evaluation import analyze
    from rlpace.sim import make_scenario, simulate
    opts = {"batch_size": 16, "group_size": 4, "eval_every": 5,
            "scenario": {"prompts_per_domain": 40}}
    grid = Grid(policies=("uniform", "fixed_mixture", "dump"), seeds=2, suites="sim:ladder",
                steps=10, options=opts)
    res = run_grid(grid, tmp_path, workers=1, progress=False)
    assert len(res.ran) == 6 and res.complete
    recs = {r["run_id"]: r for r in read_records(tmp_path / "runs")}
    # Each record holds exactly what simulate() returns for that (policy, seed).
    sim = simulate(make_scenario("ladder", prompts_per_domain=40), "dump", steps=10, seed=1,
                   batch_size=16, group_size=4, eval_every=5)
    rec = recs["sim-ladder__dump__seed1"]
    assert rec["evals"]["step"] == [0, 5, 10]
    assert rec["final"]["acc_mean"] == pytest.approx(sim.final_accuracy, abs=1e-12)
    assert rec["evals"]["acc_mean"] == pytest.approx(sim.mean_accuracy.tolist(), abs=1e-12)
    assert rec["rollouts"] == int(sim.rollouts[-1])
    assert rec["steps"]["domain_prob/L00"] == pytest.approx(sim.domain_prob[:, 0].tolist())
    assert rec["budget"] == {"steps": 10, "batch_size": 16, "group_size": 4, "eval_every": 5}
    assert rec["provenance"]["git_commit"] is None or len(rec["provenance"]["git_commit"]) == 40
    # The analysis pairs by seed: Δ equals the hand-computed mean of per-seed differences.
    a = analyze(list(recs.values()), baseline="uniform", n_boot=500, random_state=0)
    cp = {c.label: c for c in a.comparisons}["dump"]
    d = [recs[f"sim-ladder__dump__seed{s}"]["final"]["acc_mean"]
         - recs[f"sim-ladder__uniform__seed{s}"]["final"]["acc_mean"] for s in range(2)]
    assert cp.t.estimate == pytest.approx(np.mean(d), abs=1e-12)
    assert a.labels[0] == "uniform"
    assert set(a.domain_probs) == {"uniform", "fixed_mixture", "dump"}
    # Rerun: resumable, nothing recomputed.
    again = run_grid(grid, tmp_path, workers=1, progress=False)
    assert again.ran == [] and len(again.skipped) == 6


def test_record_path_layout(tmp_path):
    assert record_path(tmp_path, "x__y__seed0") == tmp_path / "runs" / "x__y__seed0.jsonl"


def test_yaml_grid_round_trip(tmp_path):
    from rlpace.experiments import load_grid
    (tmp_path / "g.yaml").write_text(
        "suite: sim:ladder\nseeds: [3, 5]\nsteps: 7\noptions: {batch_size: 8}\n"
        "policies:\n  - uniform\n  - {name: dump, kwargs: {c: 0.5}, label: dump_c0.5}\n")
    g = load_grid(tmp_path / "g.yaml")
    runs = g.runs()
    assert [r.run_id for r in runs] == ["sim-ladder__uniform__seed3", "sim-ladder__uniform__seed5",
                                        "sim-ladder__dump_c0.5__seed3", "sim-ladder__dump_c0.5__seed5"]
    assert runs[2].policy == "dump" and runs[2].policy_kwargs == {"c": 0.5} and runs[2].steps == 7
    assert runs[0].options == {"batch_size": 8}
    assert Grid.from_dict(g.to_dict()) == g


def test_default_matrix_maps_dataflex_slots():
    from rlpace.experiments import DATAFLEX_SLOTS, default_policies
    assert len(DATAFLEX_SLOTS) == 13
    plan = default_policies(["uniform", "fixed_mixture", "dump", "exp3", "ads", "per_advantage",
                             "dapo_dynamic_sampling"])
    # exact matches fill their slots, dapo_dynamic_sampling is gfpo's analogue; tscl and
    # reward_gap have no analogue any more (their exact policies exist), so ads and exp3 fill up
    assert [p.label for p in plan.policies] == ["uniform", "per_advantage", "dapo_dynamic_sampling",
                                                "fixed_mixture", "dump", "ads", "exp3"]
    assert set(plan.missing) == {"ar", "softmax", "diffband", "difffilter", "maxvar", "topk",
                                 "reward_gap", "tscl"}
    assert any("gfpo" in line and "ANALOGUE" in line for line in plan.lines)
    assert any(line.split()[0] == "tscl" and "NOT AVAILABLE" in line for line in plan.lines)
    full = default_policies([c for s in DATAFLEX_SLOTS for c in s.candidates[:1]])
    assert len(full.policies) == 13 and full.missing == ()


def test_default_matrix_with_the_registry_maps_dataflex_methods_exactly():
    from rlpace.experiments import default_policies
    plan = default_policies()
    by_slot = {line.split()[0]: line for line in plan.lines if not line.lstrip().startswith("(filler)")}
    for slot, name in (("topk", "topk"), ("reward_gap", "reward_gap"), ("tscl", "tscl")):
        assert f"-> {name} (DataFlex:" in by_slot[slot], by_slot[slot]
    # all 13 DataFlex configurations run exactly: ar (token weights) and gfpo (lengths) included
    assert plan.missing == () and "-> ar (DataFlex:" in by_slot["ar"]
    assert "-> gfpo (DataFlex:" in by_slot["gfpo"]
    assert sum("ANALOGUE" in line for line in plan.lines) == 0
    assert len(plan.policies) == 13 and not any(line.lstrip().startswith("(filler)") for line in plan.lines)
