"""benchmarks/gpu_scale.py: the --toy run on the CPU writes a table whose runs are counted
(rollouts = steps·B·G, the oracle's measurements = its measurement steps × N × m, one
evaluation every eval_every steps and a final one) and whose accuracies are well-formed; the
per-suite ratio is the paired rollouts-to-80 %-of-gain ratio, checked on hand-written runs."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import gpu_scale  # noqa: E402


def test_toy_run_writes_a_counted_table(tmp_path):
    assert gpu_scale.main(["--toy", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "gpu_scale.json").read_text())
    a = data["args"]
    assert a["device"] == "cpu" and data["device_name"].startswith("CPU")
    from rlpace.tasks import make_taskset
    n_train = len(make_taskset("ladder", train_per_domain=a["train_per_domain"], heldout_per_domain=a["heldout"],
                               seed=0).train)
    runs = data["runs"]
    assert [(r["suite"], r["policy"], r["seed"]) for r in runs] == [
        ("ladder", p, 0) for p in ("uniform", "recommended", "oracle_boundary")]
    measured_at = len(range(0, a["steps"], a["oracle_every"]))                      # steps 0 and 2 of 4
    for r in runs:
        assert r["error"] == "" and r["steps"] == a["steps"] == 4
        assert r["rollouts"] == a["steps"] * a["batch_prompts"] * a["group_size"] == 64
        assert r["oracle_rollouts"] == (measured_at * n_train * a["oracle_rollouts"]
                                        if r["policy"].startswith("oracle_") else 0)
        assert r["evals"] == a["steps"] // a["eval_every"] + 1                        # steps 0, 2 and the final one
        for acc in (r["base_acc"], r["final_acc"]):      # a mean over 7 domains of k/4
            assert 0.0 <= acc <= 1.0 and math.isclose(acc * 28, round(acc * 28), abs_tol=1e-9)
        assert 0 < r["tokens"] <= r["rollouts"] * data["max_new_tokens"]
    assert data["params"] < data["tiny_params"] and data["params_ratio"] == data["params"] / data["tiny_params"]
    md = (tmp_path / "gpu_scale.md").read_text()
    assert "Device: **CPU" in md and "TOY SIZE" in md and md.count("| ladder |") == 3
    assert (tmp_path / "gpu_scale.csv").read_text().count("\n") == 1 + 3


def _write_run(path: Path, accs, rollouts_per_step=100):
    """A metrics.jsonl of len(accs) − 1 steps: evaluations at steps 0, 1, ... and a final one."""
    path.mkdir(parents=True)
    recs = []
    for k, acc in enumerate(accs[:-1]):
        recs.append({"step": k, "eval/mean": acc, "rollouts_total": rollouts_per_step * (k + 1),
                     "informative_groups": 0.5, "tokens": 10})
    recs.append({"step": len(accs) - 1, "final": True, "eval/mean": accs[-1]})
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


def test_summary_ratio_is_rollouts_to_80_percent_of_uniforms_gain(tmp_path):
    # evaluations at 0, 100, 200, 300, 400 rollouts; uniform 0.2 → 0.7 (last three 0.7), target
    # 0.2 + 0.8·0.5 = 0.6: uniform reaches it at 100 + (0.15/0.25)·100 = 160, the policy at
    # (0.4/0.5)·100 = 80 → ratio 0.5 on each seed
    runs = {}
    for s in (0, 1):
        for p, accs in (("uniform", [0.2, 0.45, 0.7, 0.7, 0.7]), ("recommended", [0.2, 0.7, 0.7, 0.7, 0.7])):
            runs[(p, s)] = tmp_path / f"{p}{s}"
            _write_run(runs[(p, s)], accs)
    rows = {r["policy"]: r for r in gpu_scale.summary_rows("ladder", runs, [0, 1], ["uniform", "recommended"])}
    assert rows["uniform"]["ratio"] == 1.0
    assert rows["recommended"]["ratio"] == pytest.approx(0.5)
    assert rows["recommended"]["reached"] == 2 and rows["recommended"]["final"] == pytest.approx(0.7)
