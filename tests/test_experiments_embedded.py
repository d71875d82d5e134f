"""A tiny grid on the built-in trainer (embedded suite): records equal the trainer's own
per-step log, and the grid resumes. About 15 s on 2 shared cores (base-policy builds)."""

import json

import pytest

pytest.importorskip("torch")

from rlpace.experiments import Grid, read_records, run_grid  # noqa: E402

TINY = {"eval_every": 2, "warmup_steps": 20, "hidden": 16, "layers": 1, "heads": 2,
        "train_per_domain": 16, "heldout_per_domain": 4, "batch_prompts": 4, "group_size": 4,
        "max_new_tokens": 4, "target": 0.3}


@pytest.mark.slow
def test_tiny_embedded_grid_matches_the_trainer_log(tmp_path):
    opts = {**TINY, "cache_dir": str(tmp_path / "cache")}
    grid = Grid(policies=("uniform", "dump"), seeds=2, suites="embedded:add1,rev3", steps=4, options=opts)
    res = run_grid(grid, tmp_path / "out", workers=1, progress=False)
    assert res.complete and len(res.ran) == 4, res.failed
    recs = {r["run_id"]: r for r in read_records(tmp_path / "out" / "runs")}
    for spec in grid.runs():
        rec = recs[spec.run_id]
        work = tmp_path / "out" / "work" / spec.run_id
        rows = [json.loads(x) for x in (work / "metrics.jsonl").read_text().splitlines() if x.strip()]
        steps = [r for r in rows if not r.get("final")]
        final = [r for r in rows if r.get("final")][-1]
        assert rec["final"]["acc"] == {"add1": final["eval/add1"], "rev3": final["eval/rev3"]}
        assert rec["final"]["acc_mean"] == pytest.approx(final["eval/mean"])
        assert rec["rollouts"] == steps[-1]["rollouts_total"]
        assert rec["steps"]["loss"] == [r["loss"] for r in steps]
        assert rec["evals"]["step"] == [0, 2, 4]
        assert rec["budget"] == {"steps": 4, "batch_size": 4, "group_size": 4, "eval_every": 2}
        assert rec["benchmark_domains"] == {"add1": "add", "rev3": "rev"}
        assert rec["config"]["train"]["policy"] == spec.policy and rec["seed"] == spec.seed
        assert rec["target"] == 0.3
        assert not (work / "checkpoint").exists()
    dump = recs["embedded-add1-rev3__dump__seed0"]
    assert any(k.startswith("domain_prob/") for k in dump["steps"])
    again = run_grid(grid, tmp_path / "out", workers=1, progress=False)
    assert again.ran == [] and len(again.skipped) == 4


def test_bad_backend_options_are_refused_before_any_work(tmp_path):
    grid = Grid(policies=("uniform",), seeds=1, suites="embedded", steps=2, options={"seed": 3})
    with pytest.raises(ValueError, match=r"grid options \['seed'\] are set by the grid"):
        run_grid(grid, tmp_path / "a", progress=False)
    grid = Grid(policies=("uniform",), seeds=1, suites="embedded", steps=2, options={"batch_size": 3})
    with pytest.raises(ValueError, match=r"unknown trainer option\(s\) \['batch_size'\]"):
        run_grid(grid, tmp_path / "b", progress=False)
    grid = Grid(policies=("uniform",), seeds=1, suites="sim:ladder", steps=2, options={"batch_prompts": 3})
    with pytest.raises(ValueError, match=r"unknown simulator option\(s\) \['batch_prompts'\]"):
        run_grid(grid, tmp_path / "c", progress=False)
    assert not (tmp_path / "a").exists() and not (tmp_path / "c").exists()
