"""benchmarks/headroom.py: a suite where uniform gains nothing on a seed is reported as
"no gain, no target" and the benchmark goes on to write its table; --suites keeps a suite
with commas in it whole (`embedded:a,b,c`), `;` and repeatable --suite take it as is."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from rlpace.evaluation import Curve

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import headroom  # noqa: E402

X = np.array([0.0, 100.0, 200.0, 300.0])
GAINS = {s: Curve(X, np.array([0.2, 0.4, 0.6, 0.7])) for s in (0, 1)}
FLAT = {0: Curve(X, np.array([0.2, 0.4, 0.6, 0.7])), 1: Curve(X, np.array([0.5, 0.45, 0.5, 0.5]))}
POLICY = {s: Curve(X, np.array([0.2, 0.45, 0.7, 0.7])) for s in (0, 1)}


def test_no_gain_suite_is_one_row_not_an_exception():
    rows = headroom.headroom_rows("t", {"uniform": FLAT, "m": POLICY}, {"uniform": 0.5, "m": 0.5},
                                  fraction=0.8, tail=1)
    (row,) = rows
    assert row["policy"] == "uniform" and row["note"].startswith("no gain, no target")
    assert "seed 1 gained nothing" in row["note"]
    assert row["final"] == pytest.approx((0.7 + 0.5) / 2) and row["base"] == pytest.approx((0.2 + 0.5) / 2)
    assert "t: no gain, no target" in headroom.markdown(rows, 0.8)


def test_benchmark_writes_its_table_past_a_no_gain_suite(tmp_path, monkeypatch, capsys):
    def fake_sim(suite, pols, seeds, args):
        u = FLAT if suite == "sim:flat" else GAINS
        return {"uniform": u, "m": POLICY}, {"uniform": 0.5, "m": 0.5}
    monkeypatch.setattr(headroom, "run_sim", fake_sim)
    monkeypatch.setattr(headroom, "ORACLES", ())
    assert headroom.main(["--suites", "sim:flat;sim:ok", "--policies", "m", "--oracles", "",
                          "--seeds", "2", "--out", str(tmp_path)]) == 0
    md = (tmp_path / "headroom.md").read_text()
    assert "sim:flat: no gain, no target" in md
    # sim:ok: m reaches 80 % of the gain (0.6) at 100 + (0.15/0.25)·100 = 160 vs uniform's 200
    assert "| m | 0.80×" in md
    csv = (tmp_path / "headroom.csv").read_text().splitlines()
    assert csv[0].endswith(",note") and len(csv) == 1 + 1 + 2


@pytest.mark.parametrize("text, expected", [
    ("embedded:a,b,c", ["embedded:a,b,c"]),
    ("sim:ladder,embedded:add1,rev3,mostly_solved", ["sim:ladder", "embedded:add1,rev3", "mostly_solved"]),
    ("embedded,ladder,mostly_solved", ["embedded", "ladder", "mostly_solved"]),
    ("embedded:a,b;embedded:c,d", ["embedded:a,b", "embedded:c,d"]),
    ("sim:ladder,sim:homogeneous", ["sim:ladder", "sim:homogeneous"]),
])
def test_split_suites(text, expected):
    assert headroom.split_suites(text) == expected


def test_repeatable_suite_is_taken_whole(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(headroom, "trainer_available", lambda suite: seen.append(suite) or "skipped in test")
    headroom.main(["--suite", "embedded:a,b,c", "--suites", "embedded:d,e", "--out", str(tmp_path)])
    assert seen == ["embedded:d,e", "embedded:a,b,c"]
