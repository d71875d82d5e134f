"""`rlpace compare` with rollout-allocation policies (`knapsack`, `recommended+knapsack`) on the
simulator and on the built-in trainer: the matrix runs them, and every record counts the
rollouts the allocation generated, Σ N_i, which an independent run of the same seed records."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rlpace.cli import main
from rlpace.sim import make_scenario, simulate

POLICIES = "uniform,knapsack,recommended+knapsack"


class _Sizes:
    """A simulator `record` that keeps each generated batch's N_i (the Feedback's group sizes)."""

    def __init__(self):
        self.steps = []

    def write(self, fb, rollouts=None, eval=None):
        n = np.full(len(fb.prompt_ids), np.asarray(fb.rewards).shape[1]) if fb.group_sizes is None else fb.group_sizes
        if fb.step == len(self.steps):
            self.steps.append([])
        self.steps[fb.step] += np.asarray(n).tolist()


def _record(out, name):
    return json.loads((out / "runs" / f"{name}.jsonl").read_text().splitlines()[-1])


def test_compare_runs_allocation_policies_on_the_simulator_and_counts_sum_n_i(tmp_path, capsys):
    out = tmp_path / "cmp"
    rc = main(["compare", "--suite", "sim:solved_majority", "--policies", POLICIES, "--seeds", "2", "--steps", "30",
               "--set", "batch_size=16", "--set", "group_size=8", "--set", 'scenario={"prompts_per_domain": 20}',
               "--workers", "1", "--quiet", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    sc = make_scenario("solved_majority", prompts_per_domain=20)
    for pol in ("knapsack", "recommended+knapsack"):
        for seed in (0, 1):
            rec = _record(out, f"sim-solved_majority__{pol}__seed{seed}")
            sizes = _Sizes()                             # the same run, its N_i recorded independently
            simulate(sc, pol, steps=30, seed=seed, batch_size=16, group_size=8, record=sizes)
            per_step = [sum(n) for n in sizes.steps]
            assert any(len(set(n)) > 1 for n in sizes.steps)          # the allocation was really ragged
            assert rec["steps"]["rollouts"] == np.cumsum(per_step).tolist()
            assert rec["rollouts"] == sum(per_step) == 30 * 16 * 8     # Σ N_i = B·G every step
    summary = (out / "report" / "summary.md").read_text()
    assert "knapsack" in summary and "recommended+knapsack" in summary


@pytest.mark.slow
def test_compare_runs_allocation_policies_on_the_trainer_and_counts_sum_n_i(tmp_path, cache, capsys):
    from _tiny_train import TINY
    # knapsack's p̂ valid after one visit (min_count 2 of G = 4), so the tiny trainer's split is ragged
    grid = {"policies": ["uniform", {"name": "knapsack", "kwargs": {"min_count": 2, "max_n": 10}}], "seeds": 1,
            "suites": [TINY["tasks"]], "steps": 6,
            "options": {**{k: v for k, v in TINY.items() if k not in ("tasks", "steps", "progress")},
                        "cache_dir": cache}}
    (tmp_path / "grid.json").write_text(json.dumps(grid))
    out = tmp_path / "cmp"
    rc = main(["compare", "--grid", str(tmp_path / "grid.json"), "--workers", "1", "--quiet", "--no-report",
               "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    rec = json.loads(next((out / "runs").glob("*knapsack__seed0.jsonl")).read_text().splitlines()[-1])
    log = [json.loads(x) for x in next((out / "work").glob("*knapsack__seed0")).joinpath(
        "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [r for r in log if not r.get("final")]
    per_step = [sum(r["group_sizes"]) for r in steps]                  # the trainer's own N_i
    assert any(len(set(r["group_sizes"])) > 1 for r in steps)          # the allocation was really ragged
    assert rec["steps"]["rollouts"] == np.cumsum(per_step).tolist()
    assert rec["rollouts"] == sum(per_step) == 6 * 4 * 4               # Σ N_i = B·G every step
