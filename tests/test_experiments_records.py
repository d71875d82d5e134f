"""Run records: schema validation, round trip, bad input, the step-log converter, and the
records -> score-matrix checks (budgets, baselines, partial runs)."""

import json

import numpy as np
import pytest

from rlpace.evaluation import analyze, score_matrix
from rlpace.experiments import (SCHEMA_VERSION, Grid, RecordError, append_record, minimal_record,
                                read_records, record_from_step_log, validate_record, write_record)


def _rec(label, seed, acc, **kw):
    return minimal_record(run_id=f"{label}__{seed}", label=label, seed=seed, final_acc=acc,
                          suite="sim:toy", steps=kw.pop("steps", 10), **kw)


def test_round_trip_and_nan_becomes_null(tmp_path):
    rec = _rec("uniform", 0, {"a": 0.5, "b": float("nan")})
    rec["steps"] = {"step": [0, 1], "loss": [np.float32(0.5), float("inf")]}
    write_record(tmp_path / "r.jsonl", rec)
    line = (tmp_path / "r.jsonl").read_text()
    assert line.count("\n") == 1 and "NaN" not in line and "Infinity" not in line
    (back,) = read_records(tmp_path)
    assert back["final"]["acc"] == {"a": 0.5, "b": None}
    assert back["steps"]["loss"] == [0.5, None]
    assert back["schema_version"] == SCHEMA_VERSION
    prov = back["provenance"]
    assert {"packages", "git_commit", "python", "created"} <= set(prov)
    assert prov["packages"]["numpy"] == np.__version__


def test_missing_field_names_the_field(tmp_path):
    rec = _rec("uniform", 0, {"a": 0.5})
    del rec["seed"]
    with pytest.raises(RecordError, match=r"missing required field\(s\) \['seed'\].*run-records.md"):
        validate_record(rec)
    (tmp_path / "bad.jsonl").write_text(json.dumps(rec) + "\n")
    with pytest.raises(RecordError, match="bad.jsonl:1"):
        read_records(tmp_path)


def test_wrong_types_and_ragged_columns_are_rejected():
    rec = _rec("uniform", 0, {"a": 0.5})
    rec["seed"] = "0"
    with pytest.raises(RecordError, match="field 'seed' must be int"):
        validate_record(rec)
    rec = _rec("uniform", 0, {"a": 0.5})
    rec["steps"] = {"step": [0, 1], "loss": [0.1]}
    with pytest.raises(RecordError, match=r"steps column\(s\) \['loss'\]"):
        validate_record(rec)
    rec = _rec("uniform", 0, {"a": 0.5}, status="done")
    with pytest.raises(RecordError, match="status must be one of"):
        validate_record(rec)


def test_mixed_schema_versions_are_rejected(tmp_path):
    append_record(tmp_path / "a.jsonl", _rec("uniform", 0, {"a": 0.5}))
    old = _rec("dump", 0, {"a": 0.6})
    old["schema_version"] = 0
    (tmp_path / "b.jsonl").write_text(json.dumps(old) + "\n")
    with pytest.raises(RecordError, match="schema_version 0|mix schema versions"):
        read_records(tmp_path)


def test_duplicate_run_ids_are_rejected(tmp_path):
    append_record(tmp_path / "a.jsonl", _rec("uniform", 0, {"a": 0.5}))
    append_record(tmp_path / "a.jsonl", _rec("uniform", 0, {"a": 0.6}))
    with pytest.raises(RecordError, match="appears twice"):
        read_records(tmp_path)


def test_step_log_converter_trainer_format():
    # The built-in trainer's metrics.jsonl: eval at the start of a step, per-step `rollouts`
    # and `seconds`, cumulative `rollouts_total` / `seconds_total`, scheduler metrics under
    # sched/, and a closing {"final": true} evaluation.
    rows = [{"step": 1, "loss": 0.4, "rollouts": 8, "rollouts_total": 16, "seconds": 2.0,
             "seconds_total": 3.0, "sched/domain_prob/math": 0.3, "note": "text is ignored"},
            {"step": 0, "loss": 0.5, "rollouts": 8, "rollouts_total": 8, "seconds": 1.0,
             "seconds_total": 1.0, "sched/domain_prob/math": 0.5,
             "eval/math": 0.0, "eval/logic": 0.5, "eval/mean": 0.25},
            {"step": 2, "loss": 0.3, "rollouts": 16, "rollouts_total": 32, "seconds": 1.5,
             "seconds_total": 4.5, "eval/math": 0.5, "eval/logic": 0.75, "eval/mean": 0.625},
            {"step": 3, "final": True, "eval/math": 0.75, "eval/logic": 0.75, "eval/mean": 0.75}]
    rec = record_from_step_log(rows, run_id="r", label="dump", policy="dump", seed=3, suite="embedded",
                               backend="embedded", budget_steps=3, target=0.6,
                               benchmark_domains={"math": "m", "logic": "l"})
    validate_record(rec)
    assert rec["steps"]["step"] == [0, 1, 2]
    assert rec["steps"]["loss"] == [0.5, 0.4, 0.3]
    assert rec["steps"]["domain_prob/math"] == [0.5, 0.3, None]
    assert rec["steps"]["rollouts"] == [8, 16, 32]          # cumulative
    assert rec["steps"]["rollouts_step"] == [8, 8, 16]
    assert "note" not in rec["steps"] and "rollouts_total" not in rec["steps"]
    # evaluations: after 0, 2 and 3 finished steps, with the rollouts spent before them
    assert rec["evals"] == {"step": [0, 2, 3], "rollouts": [0, 16, 32], "acc/math": [0.0, 0.5, 0.75],
                            "acc/logic": [0.5, 0.75, 0.75], "acc_mean": [0.25, 0.625, 0.75]}
    assert rec["final"] == {"acc": {"math": 0.75, "logic": 0.75}, "acc_mean": 0.75}
    assert (rec["rollouts"], rec["seconds"], rec["status"]) == (32, 4.5, "complete")
    assert (rec["steps_to_target"], rec["rollouts_to_target"]) == (2, 16)
    assert rec["benchmark_domains"] == {"math": "m", "logic": "l"}
    short = record_from_step_log(rows[:2], run_id="r", label="dump", policy="dump", seed=3,
                                 suite="embedded", backend="embedded", budget_steps=3)
    assert short["status"] == "partial" and "2 of a budget of 3" in short["error"]


def test_step_log_converter_eval_at_end_and_per_step_counters():
    # An adapter that logs an evaluation after the step, with only per-step counters.
    rows = [{"step": 0, "rollouts": 4, "seconds": 1.0},
            {"step": 1, "rollouts": 6, "seconds": 2.0, "heldout/acc/a": 0.5}]
    rec = record_from_step_log(rows, run_id="r", label="u", policy="uniform", seed=0, suite="verl:x",
                               backend="verl", eval_at="end")
    assert rec["steps"]["rollouts"] == [4, 10] and rec["steps"]["rollouts_step"] == [4, 6]
    assert rec["evals"]["step"] == [2] and rec["evals"]["rollouts"] == [10]
    assert (rec["rollouts"], rec["seconds"], rec["budget"]["steps"]) == (10, 3.0, 2)


def test_step_log_without_heldout_accuracy_is_an_error():
    with pytest.raises(RecordError, match="no held-out accuracy"):
        record_from_step_log([{"step": 0, "loss": 1.0}], run_id="r", label="u", policy="u", seed=0,
                             suite="embedded", backend="embedded")
    with pytest.raises(RecordError, match="no 'step' field"):
        record_from_step_log([{"loss": 1.0}], run_id="r", label="u", policy="u", seed=0,
                             suite="embedded", backend="embedded")


# ---- from records to the score matrix: what cannot be compared ----------------------------------

def _grid_records(labels=("uniform", "dump"), seeds=(0, 1, 2), steps=10):
    out = []
    for li, lab in enumerate(labels):
        for s in seeds:
            out.append(_rec(lab, s, {"a": 0.5 + 0.01 * li + 0.001 * s, "b": 0.3 + 0.02 * li},
                            steps=steps))
    return out


def test_different_budgets_are_not_paired():
    recs = _grid_records()
    recs[-1]["budget"]["steps"] = 20
    with pytest.raises(ValueError, match="different budgets cannot be compared as if paired.*steps=20"):
        score_matrix(recs)


def test_baseline_absent_is_a_clear_error():
    with pytest.raises(ValueError, match="baseline 'grpo' is not among.*--baseline"):
        analyze(_grid_records(), baseline="grpo")


def test_one_seed_is_a_clear_error():
    with pytest.raises(ValueError, match="paired CI needs at least 2.*--seeds"):
        analyze(_grid_records(seeds=(0,)), baseline="uniform")


def test_several_suites_need_a_choice():
    recs = _grid_records()
    recs[0]["suite"] = "sim:other"
    with pytest.raises(ValueError, match="--suite"):
        score_matrix(recs)


def test_partial_and_missing_runs_are_reported_not_dropped():
    recs = _grid_records(labels=("uniform", "dump", "sec"))
    recs[3]["status"] = "partial"        # dump seed 0 stopped early
    recs[3]["error"] = "killed at step 4"
    recs = [r for r in recs if not (r["label"] == "sec" and r["seed"] == 2)]
    sm = score_matrix(recs, label_order=["uniform", "dump", "sec"])
    assert sm.labels == ("uniform", "dump", "sec")
    assert ("dump", 0) in sm.missing and ("sec", 2) in sm.missing
    assert sm.excluded[0][0] == "dump__0" and "killed at step 4" in sm.excluded[0][3]
    a = analyze(recs, baseline="uniform", random_state=0, n_boot=500)
    n_pairs = {cp.label: cp.n_pairs for cp in a.comparisons}
    assert n_pairs == {"dump": 2, "sec": 2}


def test_analysis_numbers_match_a_hand_computation():
    recs = _grid_records()
    a = analyze(recs, baseline="uniform", random_state=0, n_boot=1000)
    (cp,) = a.comparisons
    # each benchmark is its own domain: summary = (a + b) / 2; dump - uniform = (0.01 + 0.02) / 2
    assert cp.t.estimate == pytest.approx(0.015)
    assert cp.boot.low == pytest.approx(0.015) and cp.boot.high == pytest.approx(0.015)
    assert cp.poi.estimate == 1.0
    assert cp.p_holm == cp.t.p_value   # one comparison
    sc = a.summary_scores["domain_balanced"]
    assert sc.shape == (2, 3)
    assert sc[0, 1] == pytest.approx((0.501 + 0.3) / 2)


def test_grid_bad_input():
    with pytest.raises(ValueError, match="duplicate labels"):
        Grid(policies=("dump", "dump"), seeds=2, suites="sim:ladder", steps=5)
    with pytest.raises(ValueError, match="unknown suite"):
        Grid(policies=("dump",), seeds=2, suites="gsm8k", steps=5)
    with pytest.raises(ValueError, match="unknown grid key"):
        Grid.from_dict({"policies": ["dump"], "seed": 3})
    with pytest.raises(ValueError, match="seeds must be"):
        Grid(policies=("dump",), seeds=0, suites="sim:ladder", steps=5)


def test_steps_to_target_from_evals_hand_computed():
    # uniform reaches 0.6 at step 20 (200 rollouts) on every seed; dump at step 10 (100
    # rollouts) on seeds 0, 1 and never on seed 2 (budget 30 steps -> censored).
    recs = []
    for s in range(3):
        for lab, curve in (("uniform", [0.4, 0.5, 0.6, 0.62]),
                           ("dump", [0.4, 0.6, 0.65, 0.7] if s < 2 else [0.4, 0.45, 0.5, 0.55])):
            r = _rec(lab, s, {"a": curve[-1]}, steps=30)
            r["evals"] = {"step": [0, 10, 20, 30], "rollouts": [0, 100, 200, 300], "acc_mean": curve}
            r["rollouts"] = 300
            recs.append(r)
    a = analyze(recs, baseline="uniform", target=0.6, random_state=0, n_boot=500)
    (cp,) = a.comparisons
    assert a.target["source"] == "evals" and a.target["target"] == 0.6
    np.testing.assert_array_equal(a.target["steps"][1], [10, 10, np.nan])
    # dump: (10 + 10 + 30 [censored at the budget]) / 3 = 50/3; uniform: 20 -> ratio 1.2
    assert cp.steps_ratio.estimate == pytest.approx(20 / (50 / 3))
    assert cp.steps_ratio.censored and cp.steps_ratio.reached_method == 2
    assert cp.rollouts_ratio.estimate == pytest.approx(200 / ((100 + 100 + 300) / 3))
    # without a target in the records or the call, no ratios
    assert analyze(recs, baseline="uniform", random_state=0, n_boot=500).target is None


def test_generated_tokens_reach_the_evaluations_and_the_efficiency_curves():
    """Per-step `tokens` (generation, refills and probes) become the cumulative tokens each
    evaluation had cost — what `rlpace report`'s tokens-to-80 %-of-gain column reads."""
    from rlpace.experiments import record_from_step_log
    rows = [{"step": 0, "rollouts": 8, "tokens": 30, "eval/a": 0.0},
            {"step": 1, "rollouts": 8, "tokens": 50},
            {"step": 2, "rollouts": 8, "tokens": 20, "eval/a": 0.5},
            {"step": 3, "final": True, "eval/a": 0.75}]
    rec = record_from_step_log(rows, run_id="r", label="u", policy="uniform", seed=0, suite="s",
                               backend="embedded", budget_steps=3)
    assert rec["evals"]["step"] == [0, 2, 3]
    assert rec["evals"]["rollouts"] == [0, 16, 24]
    assert rec["evals"]["tokens"] == [0, 80, 100]            # spent before each evaluation
    no_tokens = record_from_step_log([{k: v for k, v in r.items() if k != "tokens"} for r in rows],
                                     run_id="r", label="u", policy="uniform", seed=0, suite="s",
                                     backend="embedded", budget_steps=3)
    assert "tokens" not in no_tokens["evals"]
