"""Output paths are checked before any work, by one helper (rlpace.cli._paths.check_output):
a path under a regular file, a folder where a file goes, a file suffix prepare does not
write, and a refused input leave one `rlpace <cmd>: error:` line, exit code 2, and nothing
created."""

from __future__ import annotations

import pytest

from _cli import one_line_error
from rlpace.errors import InputError


@pytest.fixture
def blocker(tmp_path):
    f = tmp_path / "f.txt"
    f.write_text("hi\n")
    return f


def test_check_output_refuses_paths_it_cannot_create(tmp_path, blocker):
    from rlpace.cli._paths import check_output
    with pytest.raises(InputError, match=r"--json .*f\.txt.* is a file, not a folder"):
        check_output(blocker / "out.json", "--json")
    with pytest.raises(InputError, match="is a file, not a folder"):
        check_output(blocker / "a" / "b" / "out.json", "--json")      # deeper under the file
    with pytest.raises(InputError, match="is a directory; give a file path"):
        check_output(tmp_path, "--json")
    with pytest.raises(InputError, match="is an existing file, not a folder"):
        check_output(blocker, "--out", kind="dir")
    assert check_output(tmp_path / "new" / "x.json", "--json") == tmp_path / "new" / "x.json"
    assert not (tmp_path / "new").exists()                     # the check creates nothing


def test_simulate_json_under_a_file_fails_before_any_run(capsys, blocker, monkeypatch):
    import rlpace.sim
    ran = []
    monkeypatch.setattr(rlpace.sim, "simulate", lambda *a, **k: ran.append(1))
    err, out = one_line_error(capsys, ["simulate", "--steps", "5", "--no-progress", "--json",
                                       str(blocker / "out.json")], "simulate")
    assert "--json" in err and "is a file, not a folder" in err
    assert ran == [] and "runs in" not in out


def test_select_out_under_a_file_fails_before_scoring(capsys, tmp_path, blocker):
    data = tmp_path / "train.jsonl"
    data.write_text("")
    err, _ = one_line_error(capsys, ["select", str(data), "--out", str(blocker / "next.parquet"),
                                     "--rollouts", str(tmp_path / "r.jsonl")], "select")
    assert "--out" in err and "is a file, not a folder" in err


def test_prepare_out_under_a_file_fails_before_loading(capsys, tmp_path, blocker):
    err, _ = one_line_error(capsys, ["prepare", str(tmp_path / "in.parquet"), "--out",
                                     str(blocker / "out.parquet")], "prepare")
    assert "--out" in err and "is a file, not a folder" in err


@pytest.mark.parametrize("name", ["y.csv", "y.tsv", "y.txt", "y.arrow"])
def test_prepare_refuses_a_file_suffix_it_does_not_write(capsys, tmp_path, name):
    err, _ = one_line_error(capsys, ["prepare", str(tmp_path / "in.parquet"), "--out",
                                     str(tmp_path / name)], "prepare")
    assert "prepare writes .parquet, .jsonl" in err and name.split(".")[1] in err
    assert not (tmp_path / name).exists()


@pytest.mark.parametrize("cmd, argv", [
    ("compare", ["compare", "--suite", "sim:ladder", "--policies", "uniform,dump", "--seeds", "2",
                 "--out", "BLOCK/runs"]),
    ("report", ["report", "TMP", "--out", "BLOCK/report"]),
])
def test_folder_outputs_under_a_file(capsys, tmp_path, blocker, cmd, argv):
    argv = [a.replace("BLOCK", str(blocker)).replace("TMP", str(tmp_path)) for a in argv]
    err, _ = one_line_error(capsys, argv, cmd)
    assert "--out" in err and "is a file, not a folder" in err


def test_demo_bad_tasks_leaves_no_out_folder(capsys, tmp_path):
    out = tmp_path / "demo_out"
    err, _ = one_line_error(capsys, ["demo", "tasks=/nonexistent.parquet", "--out", str(out)], "demo")
    assert "no such parquet file" in err
    assert not out.exists()
