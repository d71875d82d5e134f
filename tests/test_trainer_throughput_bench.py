"""benchmarks/trainer_throughput.py: the profile's phase table (what each phase of a step costs
and what the step is made of) and the median [min, max] summary, on hand-made profiles."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import trainer_throughput as tp  # noqa: E402


def _stats(entries):
    """A pstats-like object: {(file, line, func): (cc, nc, tt, ct, callers)}."""
    return SimpleNamespace(stats={(f, 1, fn): (1, 1, 0.0, ct, callers) for f, fn, ct, callers in entries})


def test_rlpace_phase_table_splits_the_step():
    score = ("/x/tasks/_spec.py", 1, "score")
    st = _stats([
        ("/x/train/sampling.py", "sample_groups", 5.0, {}),
        ("/x/train/recipes/grpo.py", "_update", 4.0, {}),
        ("/x/scheduler.py", "propose", 0.3, {}), ("/x/scheduler.py", "observe", 0.2, {}),
        # scoring: 0.5 s called from sample_groups, 0.4 s from the held-out evaluation (not a step)
        ("/x/tasks/_spec.py", "score", 0.9, {("/x/train/sampling.py", 1, "sample_groups"): (1, 1, 0, 0.5),
                                            ("/x/train/evaluate.py", 1, "heldout_accuracy"): (1, 1, 0, 0.4)}),
        ("/x/train/rollout.py", "completion_logprobs", 1.5, {("/x/train/recipes/grpo.py", 1, "_update"): (1, 1, 0, 1.5)}),
        ("/torch/autograd/__init__.py", "backward", 1.0, {}),
        ("/torch/optim/optimizer.py", "wrapper", 0.6, {}),
    ])
    assert score in st.stats
    step, ph = tp.phase_table(st, "rlpace")
    assert step == pytest.approx(5.0 + 4.0 + 0.3 + 0.2)
    assert ph["generation"] == pytest.approx(5.0 - 0.5)          # sample_groups less its scoring
    assert ph["reward (scoring)"] == pytest.approx(0.5)
    assert ph["Scheduler"] == pytest.approx(0.5)
    assert (ph["loss forward"], ph["backward"], ph["optimizer step"]) == pytest.approx((1.5, 1.0, 0.6))
    assert ph["grad clipping"] == 0.0


def test_trl_step_is_training_step_plus_optimizer_and_clipping():
    st = _stats([("/trl/trainer/grpo_trainer.py", "training_step", 3.0, {}),
                 ("/torch/optim/optimizer.py", "wrapper", 0.2, {}),
                 ("/accelerate/accelerator.py", "clip_grad_norm_", 0.1, {}),
                 ("/trl/trainer/grpo_trainer.py", "_generate", 1.2, {})])
    step, ph = tp.phase_table(st, "trl")
    assert step == pytest.approx(3.3)
    assert ph["generation"] == pytest.approx(1.2) and ph["grad clipping"] == pytest.approx(0.1)


def test_summary_is_median_min_max():
    assert tp._summary([2.45, 3.26, 2.82, 2.73, 2.67]) == "2.73 [2.45, 3.26]"
    assert tp._summary([0.0612, 0.07, 0.065], 3) == "0.065 [0.061, 0.070]"
