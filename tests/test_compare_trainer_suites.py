"""`rlpace compare` on the built-in trainer's suites (`embedded`, `ladder`, `mostly_solved`):
a run in the matrix's runner gives the metrics a standalone `rlpace train` gives, input errors
are one line before any work, `--policies registry` is the registry without the oracle_*
tools, and a run refused for its input is not retried."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from _cli import one_line_error
from rlpace.errors import InputError
from rlpace.experiments import Grid, minimal_record, run_grid, suite_backend

# A tiny trainer (the tiny base builds in seconds); the suite's own distributions and mistakes.
TINY = {"eval_every": 1, "warmup_steps": 20, "warmup_batch": 32, "hidden": 16, "layers": 1, "heads": 2,
        "train_per_domain": 16, "heldout_per_domain": 4, "batch_prompts": 4, "group_size": 4,
        "max_new_tokens": 4}
TIMING = ("seconds", "train_seconds", "seconds_total")     # wall-clock fields: differ between any two runs


def _rows(path):
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


@pytest.mark.slow
def test_a_matrix_run_equals_a_standalone_train_run(tmp_path):
    # Two policies run one after the other in one process (what a persistent worker does) on
    # `ladder`; each one's per-step log equals that of its own `rlpace train` process.
    opts = {**TINY, "cache_dir": str(tmp_path / "cache")}
    grid = Grid(policies=("uniform", "dump"), seeds=(0,), suites=("ladder",), steps=2, options=opts)
    res = run_grid(grid, tmp_path / "grid", workers=1, progress=False)
    assert res.complete and len(res.ran) == 2, res.failed
    for spec in grid.runs():
        alone = tmp_path / f"alone-{spec.label}"
        argv = [f"{k}={v}" for k, v in opts.items()] + [
            f"out={alone}", "tasks=ladder", f"policy={spec.policy}", "seed=0", "steps=2", "threads=1",
            "checkpoint_every=0", "progress=false"]
        r = subprocess.run([sys.executable, "-m", "rlpace", "train", *argv], capture_output=True, text=True,
                           timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
        got = _rows(tmp_path / "grid" / "work" / spec.run_id / "metrics.jsonl")
        want = _rows(alone / "metrics.jsonl")
        assert len(got) == 3 and [x["step"] for x in got] == [0, 1, 2]       # 2 steps + the final eval
        assert got == want, spec.label
        assert got[0]["eval/mean"] == pytest.approx(sum(got[0][f"eval/rev{n}"] for n in range(2, 9)) / 7)


def test_the_trainer_suites_have_the_trainer_backend():
    assert [suite_backend(s) for s in ("embedded", "ladder", "mostly_solved", "embedded:add1,rev3",
                                       "sim:ladder")] == ["embedded"] * 4 + ["sim"]
    with pytest.raises(InputError, match=r"unknown suite 'ladr'.*ladder, mostly_solved"):
        suite_backend("ladr")


def _args(**kw):
    base = dict(suite=None, policies=None, seeds=8, steps=None, workers=None, set=[], grid=None, out=None,
                baseline="uniform", no_report=False, list=False, quiet=True)
    return argparse.Namespace(**{**base, **kw})


def test_three_trainer_suites_and_the_registry_make_one_matrix():
    from rlpace.cli.compare import build_grid
    from rlpace.policies import names
    grid, _ = build_grid(_args(suite=["embedded", "ladder", "mostly_solved", "ladder"], policies="registry"))
    pols = [n for n in names() if not n.startswith("oracle_")]
    assert [p.name for p in grid.policies] == pols and "uniform" in pols and len(pols) >= 30
    assert grid.suites == ("embedded", "ladder", "mostly_solved")      # a repeated suite runs once
    assert grid.steps == 100 and grid.seeds == tuple(range(8))
    assert len(grid.runs()) == 3 * len(pols) * 8
    grid, _ = build_grid(_args(suite=["ladder"], policies="dump,registry", seeds=2))
    assert [p.name for p in grid.policies][:2] == ["dump", pols[0]] and len(grid.policies) == len(pols)


@pytest.mark.parametrize("argv, needle", [
    (["--suite", "ladr"], "unknown suite 'ladr'"),
    (["--suite", ""], "--suite '' names no suite"),
    (["--suite", "sim:ladder", "--suite", "ladder"], "give --steps for the whole matrix"),
    (["--suite", "ladder", "--set", "batch_size=32"], "unknown trainer option(s) ['batch_size']"),
    (["--suite", "ladder", "--set", "seed=3"], "grid options ['seed'] are set by the grid"),
    (["--suite", "ladder", "--workers", "0"], "--workers 0"),
    (["--suite", "ladder", "--policies", ","], "names no policy"),
    (["--suite", "ladder", "--policies", "registry,nosuch"], "unknown policy"),
    (["--suite", "ladder", "--policies", "dump"], "baseline 'uniform' is not in the matrix"),
    (["--suite", "mostly_solved", "--seeds", "1"], "at least 2 matched seeds"),
    (["--suite", "embedded", "--seeds", "0"], "Grid.seeds must be"),
    (["--suite", "ladder", "--steps", "0"], "Grid.steps must be"),
])
def test_bad_trainer_matrix_input_is_one_line_before_any_work(tmp_path, capsys, monkeypatch, argv, needle):
    import rlpace.experiments as ex
    monkeypatch.setattr(ex, "run_grid", lambda *a, **k: pytest.fail("a run started"))
    out = tmp_path / "o"
    err, _ = one_line_error(capsys, ["compare", *argv, "--out", str(out)], "compare")
    assert needle in err and not out.exists()


# ---- a run refused for its input is not retried ----------------------------------------------------

CALLS: list = []


def refusing_run(spec):
    CALLS.append(spec.run_id)
    if spec.label == "dump":
        raise InputError("policy='dump' cannot run on this suite")
    if spec.label == "sec":
        raise RuntimeError("transient failure")
    rec = minimal_record(run_id=spec.run_id, label=spec.label, seed=spec.seed, final_acc={"a": 0.5},
                         policy=spec.policy, suite=spec.suite, backend="fake", steps=spec.steps)
    rec["config"] = {"grid_run": spec.to_dict()}
    return rec


def test_a_run_refused_for_its_input_is_tried_once(tmp_path):
    CALLS.clear()
    grid = Grid(policies=("uniform", "dump", "sec"), seeds=1, suites="sim:toy", steps=3)
    res = run_grid(grid, tmp_path, workers=1, run_fn=refusing_run, progress=False)
    assert CALLS == ["sim-toy__uniform__seed0", "sim-toy__dump__seed0", "sim-toy__sec__seed0",
                     "sim-toy__sec__seed0"]          # the RuntimeError is retried once, the InputError not
    assert sorted(res.failed) == ["sim-toy__dump__seed0", "sim-toy__sec__seed0"]
    assert "cannot run on this suite" in res.failed["sim-toy__dump__seed0"]
    saved = json.loads((tmp_path / "failed" / "sim-toy__dump__seed0.json").read_text())
    assert saved["attempts"] == 1
    assert json.loads((tmp_path / "failed" / "sim-toy__sec__seed0.json").read_text())["attempts"] == 2
