"""`rlpace demo` end to end on a tiny config, and the comparison statistics it prints."""

import json
import math
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("matplotlib")

from rlpace.train.report import compare_runs, first_reach, format_table  # noqa: E402

TINY = ["tasks=embedded:max2,last3", "train_per_domain=16", "heldout_per_domain=8", "hidden=32",
        "layers=1", "heads=2", "warmup_steps=60", "warmup_batch=32", "warmup_mistakes=last3=0.5",
        "batch_prompts=4", "group_size=4", "max_new_tokens=3", "eval_every=2", "lr=0.001", "lr_warmup=0"]


def _recs(evals, rollouts_per_step=16, steps=6):
    recs = []
    for s in range(steps):
        r = {"step": s, "rollouts_total": rollouts_per_step * (s + 1), "informative_groups": 0.5,
             "seconds_total": float(s + 1)}
        if s in evals:
            r.update({"eval/a": evals[s], "eval/b": evals[s], "eval/mean": evals[s]})
        recs.append(r)
    recs.append({"step": steps, "final": True, "eval/a": evals[steps], "eval/b": evals[steps],
                 "eval/mean": evals[steps]})
    return recs


def test_compare_runs_by_hand():
    runs = {"uniform": _recs({0: 0.2, 2: 0.4, 4: 0.5, 6: 0.6}),
            "fast": _recs({0: 0.2, 2: 0.6, 4: 0.7, 6: 0.7}),
            "slow": _recs({0: 0.2, 2: 0.3, 4: 0.4, 6: 0.5})}
    cmp = compare_runs(runs, reference="uniform")
    assert cmp["target"] == pytest.approx(0.5)                          # mean of 0.4, 0.5, 0.6
    assert cmp["policies"]["uniform"]["steps_to_target"] == 4.0
    assert cmp["policies"]["fast"]["steps_to_target"] == 2.0
    assert cmp["policies"]["fast"]["rollouts_to_target"] == 32.0        # two steps of 16 before step 2
    assert cmp["policies"]["slow"]["steps_to_target"] == 6.0
    assert math.isnan(compare_runs(runs, reference="fast")["policies"]["slow"]["steps_to_target"])
    assert first_reach(runs["slow"], 0.45) == (6.0, 96.0)
    text = format_table(compare_runs(runs, reference="fast"))
    assert "never" in text and "target = final mean accuracy of fast (mean of its last 3 evaluations): 0.667" in text


@pytest.mark.parametrize("parallel", ["off", pytest.param("on", marks=pytest.mark.slow)])  # on: ~25 s (spawn)
def test_demo_end_to_end(tmp_path, parallel, capsys, monkeypatch):
    monkeypatch.setenv("RLPACE_CACHE", str(tmp_path / "cache"))
    from rlpace.cli import main
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--steps", "4", "--parallel", parallel, *TINY]) == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["policies"]) == {"uniform", "dump"}
    # the same rollout budget for both, and the table shows it
    assert summary["policies"]["uniform"]["rollouts"] == summary["policies"]["dump"]["rollouts"] == 4 * 16
    for row in ("max2", "last3", "mean", "steps to target", "informative groups", "rollouts spent"):
        assert row in printed
    page = (out / "report.html").read_text()
    for png in ("accuracy.png", "per_domain.png", "domain_probs.png", "informative.png"):
        assert (out / png).stat().st_size > 1000 and png in page
    assert summary["parallel"] is (parallel == "on")


def test_demo_rejects_bad_input_before_work(tmp_path):
    from rlpace.cli import main
    with pytest.raises(ValueError, match="unknown policy"):
        main(["demo", "--out", str(tmp_path / "d"), "--policy", "nope", *TINY])
    with pytest.raises(ValueError, match="unknown config field"):
        main(["demo", "--out", str(tmp_path / "d"), "stepz=3"])
    assert not (tmp_path / "d").exists()
