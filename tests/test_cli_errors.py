"""Every user error at the command line is one line `rlpace <cmd>: error: ...` and exit code 2:
names are checked before work starts, `--resume` reads the run's
config, verl data without ids is refused, a missing optional dependency names its extra."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import pytest

from _cli import one_line_error as cli_error
from rlpace.cli import main, missing_dependency

TINY = ["tasks=embedded:max2,last3", "train_per_domain=16", "heldout_per_domain=8", "hidden=32",
        "layers=1", "heads=2", "warmup_steps=60", "warmup_batch=32", "warmup_mistakes=last3=0.5",
        "batch_prompts=4", "group_size=4", "max_new_tokens=3", "eval_every=2", "lr=0.001", "lr_warmup=0",
        "progress=false", "checkpoint_every=0"]


def one_line_error(capsys, argv, cmd):
    """Run the CLI in-process; assert exit 2 and a single `rlpace <cmd>: error:` line; return it."""
    return cli_error(capsys, argv, cmd)[0]


@pytest.mark.parametrize("argv, needle", [
    (["train", "policy=nope"], "unknown policy 'nope'"),
    (["train", "foo=1"], "unknown config field 'foo'"),
    (["train", "steps=abc"], "steps='abc' is not a valid int"),
    (["train", "steps"], "config override 'steps' is not key=value"),
    (["train", "tasks=/nonexistent/train.parquet"], "no such parquet file"),
    (["train", "logger=tb"], "unknown logger 'tb'"),
    (["train", "--bogus"], "unrecognized arguments: --bogus (see `rlpace train --help`)"),
    (["demo", "--policy", "nope"], "unknown policy 'nope'"),
    (["demo", "stepz=3"], "unknown config field 'stepz'"),
    (["demo", "--steps", "x"], "argument --steps: invalid int value: 'x'"),
    (["simulate", "--seed", ""], "--seed '' names no seed"),
    (["simulate", "--seed", "a,b"], "--seed 'a,b' is not an integer"),
    (["simulate", "--no-baseline", "temperature=abc"], "dump"),
    (["simulate", "--policy", "dupm"], "unknown policy 'dupm'"),
    (["simulate", "--policy", ""], "--policy '' names no policy"),
    (["simulate", "--policy", ","], "names no policy"),
    (["simulate", "--set", "nope=1"], "nope"),
    (["compare", "--grid", "/nonexistent/grid.yaml", "--out", "OUT"], "no such grid file"),
    (["compare", "--suite", "sim:laddr", "--out", "OUT"], "unknown scenario 'laddr'"),
    (["compare", "--suite", "embedded:max2,add9", "--out", "OUT"], "embedded distribution 'add9'"),
    (["compare", "--suite", "sim:ladder", "--policies", "uniform,nosuch", "--out", "OUT"], "unknown policy"),
    (["report", "/nonexistent/runs"], "no run records"),
    (["report", "RUNS", "--confidence", "2"], ""),
    (["nosuchcommand"], "invalid choice: 'nosuchcommand'"),
])
def test_user_errors_are_one_line_and_exit_2(tmp_path, capsys, argv, needle):
    (tmp_path / "runs").mkdir()
    argv = [a.replace("OUT", str(tmp_path / "out")).replace("RUNS", str(tmp_path / "runs")) for a in argv]
    cmd = argv[0] if argv[0] != "nosuchcommand" else ""
    err = one_line_error(capsys, argv, cmd) if cmd else None
    if not cmd:
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("rlpace: error: ") and "\n" not in err
    assert needle in err
    assert not (tmp_path / "out").exists()          # no work started


def test_report_malformed_record_line_is_one_line(tmp_path, capsys):
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "a.jsonl").write_text('{"schema_version": 1,\n')
    err = one_line_error(capsys, ["report", str(tmp_path)], "report")
    assert "a.jsonl:1 is not valid JSON" in err


@pytest.mark.parametrize("body, needle", [
    ("garbage: [\n", "is not a valid grid file"),
    ("[1, 2]", "must hold a mapping"),
    ('{"policies": 3}', "is not a valid grid file"),
])
def test_compare_garbage_grid_is_one_line(tmp_path, capsys, body, needle):
    grid = tmp_path / ("g.yaml" if body.startswith("garbage") else "g.json")
    grid.write_text(body)
    err = one_line_error(capsys, ["compare", "--grid", str(grid), "--out", str(tmp_path / "o")], "compare")
    assert needle in err and not (tmp_path / "o").exists()


def test_simulate_checks_every_name_before_running_uniform(capsys, monkeypatch):
    import rlpace.sim as sim
    calls = []
    monkeypatch.setattr(sim, "simulate", lambda *a, **k: calls.append(a) or pytest.fail("ran"))
    one_line_error(capsys, ["simulate", "--policy", "dump,dupm", "--no-progress"], "simulate")
    one_line_error(capsys, ["simulate", "--policy", "dump", "--no-progress", "temperature=-1"], "simulate")
    assert calls == []


def test_compare_checks_the_suite_before_any_run(tmp_path, capsys, monkeypatch):
    import rlpace.experiments as ex
    monkeypatch.setattr(ex, "run_grid", lambda *a, **k: pytest.fail("a run started"))
    err = one_line_error(capsys, ["compare", "--suite", "sim:laddr", "--out", str(tmp_path / "o")], "compare")
    assert "sim:ladder" in err                           # the valid names are listed


def test_missing_optional_dependency_names_the_extra():
    def chained(name):
        try:
            try:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            except ModuleNotFoundError as e:
                raise ImportError("wrapped") from e
        except ImportError as e:
            return e
    assert "pip install 'rlpace[train]'" in missing_dependency(chained("transformers"), "train")
    assert "torch==2.13.0" in missing_dependency(chained("torch"), "demo")
    assert "pip install 'rlpace[report]'" in missing_dependency(chained("matplotlib"), "report")
    assert "pip install 'rlpace[prepare]'" in missing_dependency(chained("sentence_transformers.x"), "prepare")
    assert missing_dependency(chained("rlpace.nothere"), "train") is None       # a bug: traceback
    assert missing_dependency(ValueError("x"), "train") is None


def test_missing_dependency_through_main(capsys, monkeypatch):
    import rlpace.cli.report as rep

    def boom(args):
        raise ModuleNotFoundError("No module named 'scipy'", name="scipy")
    monkeypatch.setattr(rep, "run", boom)
    err = one_line_error(capsys, ["report", "x"], "report")
    assert "'scipy'" in err and "pip install 'rlpace[report]'" in err


def test_bugs_keep_their_traceback(monkeypatch):
    import rlpace.cli.report as rep

    def bug(args):
        raise KeyError("internal")
    monkeypatch.setattr(rep, "run", bug)
    with pytest.raises(KeyError):
        main(["report", "x"])
    monkeypatch.setenv("RLPACE_TRACEBACK", "1")
    monkeypatch.setattr(rep, "run", lambda args: (_ for _ in ()).throw(ValueError("user")))
    with pytest.raises(ValueError, match="user"):
        main(["report", "x"])


def test_a_plain_value_error_is_a_bug_and_keeps_its_traceback(monkeypatch, capsys):
    # Only InputError is a user error: a ValueError from a library call that nobody turned
    # into an InputError (numpy, json, a member policy's bug) keeps its traceback.
    import rlpace.cli.report as rep
    from rlpace.errors import InputError
    monkeypatch.setattr(rep, "run", lambda args: (_ for _ in ()).throw(ValueError("bug inside")))
    with pytest.raises(ValueError, match="bug inside"):
        main(["report", "x"])
    monkeypatch.setattr(rep, "run", lambda args: (_ for _ in ()).throw(InputError("fix the x")))
    assert one_line_error(capsys, ["report", "x"], "report") == "rlpace report: error: fix the x"


@pytest.mark.parametrize("body, name", [("{not json", "g.json"), ("[{\"a\": 1}, oops", "p.jsonl")])
def test_malformed_json_the_user_points_at_is_one_line(tmp_path, capsys, body, name):
    # json.JSONDecodeError is a ValueError, not an InputError: the readers convert it.
    f = tmp_path / name
    f.write_text(body)
    if name == "g.json":
        err = one_line_error(capsys, ["compare", "--grid", str(f), "--out", str(tmp_path / "o")], "compare")
    else:
        from rlpace.errors import InputError
        from rlpace.prepare._io import _read_jsonl
        with pytest.raises(InputError, match="not valid JSON"):
            _read_jsonl(f)
        return
    assert "not valid" in err and not (tmp_path / "o").exists()


def test_pool_from_jsonl_names_the_bad_line(tmp_path):
    from rlpace import Pool
    from rlpace.errors import InputError
    f = tmp_path / "p.jsonl"
    f.write_text('{"data_source": "a"}\n{oops\n')
    with pytest.raises(InputError, match="line 2 is not valid JSON"):
        Pool.from_jsonl(f)


def test_subprocess_prints_one_line_and_no_traceback(tmp_path):
    r = subprocess.run([sys.executable, "-m", "rlpace", "simulate", "--seed", ""], capture_output=True,
                       text=True, cwd=tmp_path, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "Traceback" not in r.stderr
    assert r.stderr.startswith("rlpace simulate: error: --seed '' names no seed")


# ---- verl parquet data without ids, held-out file --------------------------------------------

def _write_rows(path, rows):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _row(i, index=True, difficulty=0.0):
    extra = {"split": "train", "difficulty": difficulty}
    if index:
        extra["index"] = i
    return {"data_source": "a", "prompt": [{"role": "user", "content": f"q{i}"}], "ability": "exact",
            "reward_model": {"style": "rule", "ground_truth": str(i)}, "extra_info": extra}


def test_parquet_without_index_is_refused(tmp_path, capsys):
    from rlpace import Pool
    from rlpace.tasks import make_taskset
    path = _write_rows(tmp_path / "train.parquet", [_row(0), _row(1, index=False), _row(2, index=False)])
    with pytest.raises(ValueError, match=r"extra_info.index is missing in 2 of 3 rows \(first rows: \[1, 2\]\)"):
        make_taskset(str(path))
    with pytest.raises(ValueError, match=r"extra_info.index is missing in 2 of 3 rows"):
        Pool.from_parquet(path)
    assert Pool.from_parquet(path, id_key=None).ids.tolist() == [0, 1, 2]
    err = one_line_error(capsys, ["train", f"tasks={path}", f"out={tmp_path / 'o'}"], "train")
    assert "training file" in err and "extra_info.index" in err and not (tmp_path / "o").exists()


def test_parquet_without_heldout_file_warns(tmp_path):
    from rlpace.tasks import make_taskset
    d = tmp_path / "data"
    d.mkdir()
    path = _write_rows(d / "mine.parquet", [_row(i) for i in range(3)])
    with pytest.warns(UserWarning, match="no held-out file .*test.parquet.* not measured"):
        ts = make_taskset(str(path))
    assert ts.heldout == ()
    _write_rows(d / "test.parquet", [_row(i + 10) for i in range(2)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(make_taskset(str(path)).heldout) == 2


def test_base_policy_cache_is_keyed_on_content_not_name(tmp_path):
    pytest.importorskip("torch")
    from rlpace.tasks import read_taskset
    from rlpace.train.model import base_policy_dir
    rows = [_row(i) for i in range(4)]
    a = _write_rows(tmp_path / "a.parquet", rows)
    b = _write_rows(tmp_path / "copy_of_a.parquet", rows)
    c = _write_rows(tmp_path / "harder.parquet", [_row(i, difficulty=float(i)) for i in range(4)])
    key = lambda p: base_policy_dir(read_taskset(p), tmp_path, seed=0)      # noqa: E731
    assert key(a) == key(b)                     # two copies: one base (was two builds)
    assert key(a) != key(c)                     # difficulty sets the warm-up level: another base


# ---- --resume reads out/config.json -----------------------------------------------------------

def test_resume_reads_the_saved_config_and_equals_an_uninterrupted_run(tmp_path, capsys, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setenv("RLPACE_CACHE", str(tmp_path / "cache"))
    full, part = tmp_path / "full", tmp_path / "part"
    assert main(["train", *TINY, "policy=dump", "steps=4", f"out={full}"]) == 0
    assert main(["train", *TINY, "policy=dump", "steps=2", f"out={part}"]) == 0
    capsys.readouterr()
    # only the out dir and the new length: the rest comes from part/config.json
    assert main(["train", "--resume", f"out={part}", "steps=4"]) == 0
    saved = json.loads((part / "config.json").read_text())
    assert saved["steps"] == 4 and saved["resume"] is True and saved["policy"] == "dump"

    def steps(d):
        return [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines() if x.strip()]
    a, b = steps(full), steps(part)
    assert [r["step"] for r in b] == [r["step"] for r in a] == [0, 1, 2, 3, 4]
    for ra, rb in zip(a, b):
        assert ra.get("prompt_ids") == rb.get("prompt_ids")
        assert ra.get("eval/mean") == rb.get("eval/mean")
        assert ra.get("loss", 0.0) == pytest.approx(rb.get("loss", 0.0), abs=1e-6)
    # changing the trajectory on resume is refused, naming the field; the run is untouched
    before = (part / "metrics.jsonl").read_text()
    err = one_line_error(capsys, ["train", "--resume", f"out={part}", "steps=6", "lr=0.5"], "train")
    assert "cannot change lr=0.5 (the run has 0.001)" in err and "steps" in err
    err = one_line_error(capsys, ["train", "--resume", f"out={tmp_path / 'none'}"], "train")
    assert "config.json' does not exist" in err
    assert (part / "metrics.jsonl").read_text() == before
