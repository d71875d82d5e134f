"""Library warnings reach the command line as one `rlpace <cmd>: note:` line each, once,
without Python's source-line form; `prepare --no-progress` turns transformers' bars off."""

from __future__ import annotations

import warnings

import pytest

from rlpace.cli import main
from rlpace.errors import InputError


def test_simulate_gfpo_warning_is_one_note_line(capsys):
    assert main(["simulate", "--policy", "uniform,gfpo", "--steps", "20", "--no-progress", "--batch-size", "16",
                 "--group-size", "8", "--seed", "0,1", "--eval-every", "10"]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1, err                                     # 2 seeds × 20 steps: still one line
    assert err[0].startswith("rlpace simulate: note: gfpo: Feedback.lengths is None")
    assert "RuntimeWarning" not in err[0] and ".py:" not in err[0]


def test_prepare_no_progress_silences_bars_and_shows_notes(tmp_path, capsys, monkeypatch):
    transformers = pytest.importorskip("transformers")
    import rlpace.prepare

    def fake_prepare(*args, progress=True, **kwargs):
        for _ in range(3):
            warnings.warn("no nll_model: difficulty is NaN.", UserWarning, stacklevel=2)
        assert not progress and not transformers.utils.logging.is_progress_bar_enabled()
        raise InputError("stop here")

    monkeypatch.setattr(rlpace.prepare, "prepare", fake_prepare)
    try:
        assert main(["prepare", str(tmp_path / "in.parquet"), "--out", str(tmp_path / "o.parquet"),
                     "--no-progress"]) == 2
    finally:
        transformers.utils.logging.enable_progress_bar()
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["rlpace prepare: note: no nll_model: difficulty is NaN.", "rlpace prepare: error: stop here"]
