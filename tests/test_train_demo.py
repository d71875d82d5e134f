"""`rlpace demo` end to end on a tiny config, and the comparison statistics it prints."""

import html
import json
import math
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("matplotlib")

from rlpace.train.report import compare_runs, eval_curve, format_table, summary_lines  # noqa: E402

TINY = ["tasks=embedded:max2,last3", "train_per_domain=16", "heldout_per_domain=8", "hidden=32",
        "layers=1", "heads=2", "warmup_steps=60", "warmup_batch=32", "warmup_mistakes=last3=0.5",
        "batch_prompts=4", "group_size=4", "max_new_tokens=3", "eval_every=2", "lr=0.001", "lr_warmup=0"]

#: TINY, with a base that is wrong often enough for 8 GRPO steps to move it (seed 0 gains:
#: the headline's numbers exist), evaluated after every step.
LEARNS = [*TINY, "hidden=64", "warmup_steps=200", "warmup_mistakes=last3=0.6,max2=0.6", "lr=0.003", "eval_every=1"]


def _recs(evals, rollouts_per_step=16, steps=6, tokens=None):
    recs = []
    for s in range(steps):
        r = {"step": s, "rollouts_total": rollouts_per_step * (s + 1), "informative_groups": 0.5,
             "seconds_total": float(s + 1)}
        if tokens is not None:
            r["tokens"] = tokens
        if s in evals:
            r.update({"eval/a": evals[s], "eval/b": evals[s], "eval/mean": evals[s]})
        recs.append(r)
    recs.append({"step": steps, "final": True, "eval/a": evals[steps], "eval/b": evals[steps],
                 "eval/mean": evals[steps]})
    return recs


def test_eval_curve_counts_what_each_evaluation_had_seen():
    c = eval_curve(_recs({0: 0.2, 2: 0.4, 4: 0.5, 6: 0.6}, tokens=10))
    # the evaluation logged at step s ran before step s trained: s steps × 16 rollouts, × 10 tokens
    np.testing.assert_array_equal(c.rollouts, [0, 32, 64, 96])
    np.testing.assert_array_equal(c.steps, [0, 2, 4, 6])
    np.testing.assert_array_equal(c.tokens, [0, 20, 40, 60])
    np.testing.assert_array_equal(c.accuracy, [0.2, 0.4, 0.5, 0.6])
    assert eval_curve(_recs({0: 0.2, 2: 0.4, 4: 0.5, 6: 0.6})).tokens is None


def test_compare_runs_by_hand():
    runs = {"uniform": _recs({0: 0.2, 2: 0.4, 4: 0.5, 6: 0.6}),
            "fast": _recs({0: 0.2, 2: 0.6, 4: 0.7, 6: 0.7}),
            "slow": _recs({0: 0.2, 2: 0.3, 4: 0.4, 6: 0.5}),
            "never": _recs({0: 0.2, 2: 0.3, 4: 0.35, 6: 0.4})}
    cmp = compare_runs(runs, reference="uniform")
    # uniform's final = mean of its last 3 evaluations = 0.5; target = 0.2 + 0.8·(0.5 − 0.2) = 0.44
    assert cmp["reference_final"] == pytest.approx(0.5) and cmp["target"] == pytest.approx(0.44)
    p = cmp["policies"]
    # uniform crosses 0.44 between (32, 0.4) and (64, 0.5): 32 + 0.4·32 = 44.8 rollouts, step 2.8
    assert p["uniform"]["rollouts_to_target"] == pytest.approx(44.8)
    assert p["uniform"]["steps_to_target"] == pytest.approx(2.8)
    # fast: between (0, 0.2) and (32, 0.6): 0.24/0.4·32 = 19.2 rollouts; 19.2/44.8 = 3/7
    assert p["fast"]["rollouts_to_target"] == pytest.approx(19.2) and p["fast"]["reached"]
    assert p["fast"]["rollout_ratio"] == pytest.approx(3 / 7) and p["fast"]["ratio_bound"] == ""
    assert p["fast"]["steps_to_target"] == pytest.approx(1.2) and p["fast"]["step_ratio"] == pytest.approx(3 / 7)
    # area over 0..96 rollouts (trapezoids of 32): uniform 32·1.3/96, fast 32·1.75/96
    assert p["fast"]["auc_ratio"] == pytest.approx(1.75 / 1.3)
    # slow: between (64, 0.4) and (96, 0.5): 76.8 rollouts = 12/7 of uniform's
    assert p["slow"]["rollouts_to_target"] == pytest.approx(76.8)
    assert p["slow"]["rollout_ratio"] == pytest.approx(12 / 7)
    # never: censored at its budget of 96 rollouts, a lower bound 96/44.8 = 15/7
    assert not p["never"]["reached"] and p["never"]["rollouts_to_target"] == 96.0
    assert p["never"]["rollout_ratio"] == pytest.approx(15 / 7) and p["never"]["ratio_bound"] == "≥"
    assert summary_lines(cmp, "fast")[0] == ("fast reached 80 % of uniform's gain with 43 % of uniform's "
                                             "rollouts (19 vs 45 rollouts; one seed)")
    assert summary_lines(cmp, "never")[0] == ("never did not reach 80 % of uniform's gain within its budget "
                                              "of 96 rollouts: ≥ 96/45 = 214 % of uniform's rollouts (one seed)")
    assert "steps to the target 1.2 vs 2.8 (0.43×)" in summary_lines(cmp, "fast")[2]
    text = format_table(cmp)
    assert "target = 80 % of uniform's gain: 0.440" in text
    assert "≥96" in text and "≥2.14" in text and "0.43" in text
    # a reference that gained nothing gives no target, said plainly, and no ratio
    flat = compare_runs({"uniform": _recs({0: 0.5, 2: 0.5, 4: 0.5, 6: 0.5}), "fast": runs["fast"]}, "uniform")
    assert flat["target"] is None and "gained nothing" in flat["no_target"]
    assert summary_lines(flat, "fast")[0].startswith("no 80 %-of-gain target: baseline 'uniform' seed 0 gained nothing")
    assert math.isnan(flat["policies"]["fast"]["rollout_ratio"])


def test_demo_defaults_are_recommended_on_mostly_solved(tmp_path, monkeypatch, capsys):
    import rlpace.train
    from rlpace.cli import main
    from rlpace.errors import InputError
    seen = []

    def stop(cfg):                                   # record both configs, then stop before any work
        seen.append(cfg)
        if len(seen) == 2:
            raise InputError("stop here")           # a user error: the CLI's one line, exit 2
    monkeypatch.setattr(rlpace.train, "check_config", stop)
    assert main(["demo", "--out", str(tmp_path / "d")]) == 2
    assert "stop here" in capsys.readouterr().err
    assert [(c.policy, c.tasks) for c in seen] == [("uniform", "mostly_solved"), ("recommended", "mostly_solved")]
    seen.clear()
    assert main(["demo", "--out", str(tmp_path / "d"), "tasks=embedded"]) == 2
    assert [c.tasks for c in seen] == ["embedded", "embedded"]
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("parallel", ["off", pytest.param("on", marks=pytest.mark.slow)])  # on: ~25 s (spawn)
def test_demo_end_to_end(tmp_path, parallel, capsys, monkeypatch):
    monkeypatch.setenv("RLPACE_CACHE", str(tmp_path / "cache"))
    from rlpace.cli import main
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--steps", "8", "--seed", "1", "--parallel", parallel, *LEARNS]) == 0
    cap = capsys.readouterr()
    printed = cap.out
    # the one-off base build is announced with what it does and roughly how long it takes
    assert ("base policy: building the base policy once for seed 1 (cached at " in cap.err
            and "about 2 minutes on 2 cores (200 supervised warm-up steps" in cap.err)
    assert "base policy: built in" in cap.err
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["policies"]) == {"uniform", "recommended"}
    # the same rollout budget for both, and the table shows it
    assert summary["policies"]["uniform"]["rollouts"] == summary["policies"]["recommended"]["rollouts"] == 8 * 16
    for row in ("max2", "last3", "mean", "rollouts to target", "steps to target", "informative groups",
                "rollouts spent"):
        assert row in printed
    # the headline is efficiency_vs_baseline's figure on the two runs' metrics.jsonl: curves
    # rebuilt here (an evaluation logged at step s had seen the rollouts of steps < s)
    from rlpace.evaluation import Curve, cost_to_reach, efficiency_vs_baseline
    curves = {}
    for name in ("uniform", "recommended"):
        rows = [json.loads(x) for x in (out / name / "metrics.jsonl").read_text().splitlines()]
        spent = {r["step"]: r["rollouts_total"] for r in rows if not r.get("final")}
        ev = [r for r in rows if "eval/mean" in r]
        curves[name] = {0: Curve(np.array([spent.get(r["step"] - 1, 0) for r in ev], float),
                                 np.array([r["eval/mean"] for r in ev]))}
    eff = efficiency_vs_baseline(curves, baseline="uniform", tail=3)["recommended"]
    z = cost_to_reach(curves["uniform"][0].rollouts, curves["uniform"][0].accuracy, eff.target[0])[0]
    y, x = eff.rollouts_to_target[0], 100 * eff.rollouts.estimate
    if eff.reached[0]:
        want = (f"recommended reached 80 % of uniform's gain with {x:.0f} % of uniform's rollouts "
                f"({y:.0f} vs {z:.0f} rollouts; one seed)")
    else:                                            # censored: said plainly, as a bound
        want = (f"recommended did not reach 80 % of uniform's gain within its budget of {y:.0f} rollouts: "
                f"≥ {y:.0f}/{z:.0f} = {x:.0f} % of uniform's rollouts (one seed)")
    assert want in printed.splitlines(), printed
    assert y != z                                    # seed 1 here: ≥ 128 vs 97 rollouts, a ratio that says something
    assert summary["target"] == pytest.approx(eff.target[0])
    assert summary["policies"]["recommended"]["rollout_ratio"] == pytest.approx(eff.rollouts.estimate)
    assert "secondary: steps to the target" in printed
    page = (out / "report.html").read_text()
    from rlpace.train.report import CAPTIONS
    for png in ("accuracy.png", "per_domain.png", "domain_probs.png", "informative.png"):
        assert (out / png).stat().st_size > 1000 and png in page
        assert f"<figcaption>{html.escape(CAPTIONS[png])}</figcaption>" in page     # every plot explained
    assert summary["parallel"] is (parallel == "on")
    # run records in the format `rlpace report` reads, one per policy, same numbers as the table
    from rlpace.experiments import read_records
    recs = {r["label"]: r for r in read_records(out / "runs")}
    assert set(recs) == {"uniform", "recommended"} and all(r["status"] == "complete" for r in recs.values())
    for name, r in recs.items():
        p = summary["policies"][name]
        assert r["rollouts"] == p["rollouts"] == 128 and r["seed"] == 1
        assert r["final"]["acc_mean"] == pytest.approx(p["final"]["mean"])
        assert r["final"]["acc"]["max2"] == pytest.approx(p["final"]["max2"])
        assert r["target"] == pytest.approx(summary["target"])
    if parallel == "off":
        # another seed into the same folder: `rlpace report` pairs them (the evaluation code)
        assert main(["demo", "--out", str(out), "--steps", "8", "--seed", "0", *LEARNS]) == 0
        cap = capsys.readouterr()
        assert "building the base policy once for seed 0" in cap.err        # a new seed: a new base, said so
        # every seed's records stay; the demo pairs the seeds in its folder, as the report does
        recs = read_records(out / "runs")
        assert sorted((r["label"], r["seed"]) for r in recs) == [("recommended", 0), ("recommended", 1),
                                                                 ("uniform", 0), ("uniform", 1)]
        from rlpace.cli.demo import seeds_summary
        want = seeds_summary(recs, suite="embedded:max2,last3", policy="recommended", baseline="uniform", steps=8)
        assert want["seeds"] == [0, 1] and want["line"] in cap.out.splitlines()
        assert "over seeds 0, 1 in this folder" in want["line"]
        assert "no multi-seed figure is recorded for recommended vs uniform on embedded:max2,last3" in cap.out
        summary = json.loads((out / "summary.json").read_text())
        assert summary["seeds"] == [0, 1] and (out / "summary_seed0.json").is_file()
        assert html.escape(want["line"]) in (out / "report.html").read_text()
        assert main(["report", str(out), "--n-boot", "200"]) == 0
        printed = capsys.readouterr().out
        assert "recommended" in printed and "zero excluded" in printed
        assert (out / "report" / "report.html").is_file()


def test_demo_rejects_bad_input_before_work(tmp_path, capsys):
    from rlpace.cli import main
    assert main(["demo", "--out", str(tmp_path / "d"), "--policy", "nope", *TINY]) == 2
    assert capsys.readouterr().err.startswith("rlpace demo: error: unknown policy 'nope'")
    assert main(["demo", "--out", str(tmp_path / "d"), "stepz=3"]) == 2
    assert capsys.readouterr().err.startswith("rlpace demo: error: unknown config field 'stepz'")
    assert not (tmp_path / "d").exists()


def test_tensorboard_logger_writes_the_jsonl_scalars(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from rlpace.train import TrainConfig, from_overrides, train
    monkeypatch.setenv("RLPACE_CACHE", str(tmp_path / "cache"))
    cfg = from_overrides([*TINY, "steps=3", "progress=false", "logger=tensorboard", "policy=dump",
                          f"out={tmp_path / 'run'}"], TrainConfig())
    train(cfg)
    recs = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    [events] = list((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))
    acc = EventAccumulator(str(events.parent), size_guidance={"scalars": 0})
    acc.Reload()
    expected: dict[str, list] = {}
    for r in recs:                                   # every numeric field, at its step
        for k, v in r.items():
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
                expected.setdefault(k, []).append((r["step"], float(v)))
    assert set(acc.Tags()["scalars"]) == set(expected)
    assert {"loss", "eval/mean", "eval/max2", "reward_mean", "sched/domain_prob/max2"} <= set(expected)
    for tag, want in expected.items():
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        assert [s for s, _ in got] == [s for s, _ in want], tag
        assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-6, abs=1e-6), tag
    assert [s for s, _ in expected["eval/mean"]] == [0, 2, 3]       # eval_every=2, plus the final


def test_logger_names_are_checked_before_work(monkeypatch):
    import importlib.util

    from rlpace.train import TrainConfig
    from rlpace.train.logging import parse_loggers
    assert parse_loggers("tensorboard|wandb") == ("jsonl", "tensorboard", "wandb")
    assert parse_loggers("jsonl") == ("jsonl",)
    with pytest.raises(ValueError, match="unknown logger 'tb'"):
        TrainConfig(logger="tb")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "wandb" else real(n, *a))
    with pytest.raises(ValueError, match="logger=wandb needs the wandb package: pip install wandb"):
        TrainConfig(logger="wandb")


def test_demo_plots_show_one_quantity_with_labelled_axes(tmp_path, monkeypatch):
    from rlpace.evaluation import plots
    from rlpace.train import report
    runs = {"uniform": _recs({0: 0.2, 2: 0.4, 4: 0.5, 6: 0.6}), "dump": _recs({0: 0.2, 2: 0.6, 4: 0.7, 6: 0.7})}
    for name, recs in runs.items():
        for r in recs[:-1]:
            r.update({"sched/domain_share/a": 0.25, "sched/domain_share/b": 0.75})
            if name == "dump":                       # only a mixture policy has domain probabilities
                r.update({"sched/domain_prob/a": 0.9, "sched/domain_prob/b": 0.1})
    seen = {}
    real = plots.plot_domain_heatmaps
    monkeypatch.setattr(plots, "plot_domain_heatmaps", lambda series, **k: seen.update(series) or real(series, **k))
    figs = {}
    real_save = plots._figure

    def keep(*a, **k):
        fig = real_save(*a, **k)
        figs[len(figs)] = fig
        return fig
    monkeypatch.setattr(plots, "_figure", keep)
    paths = report.plot_runs(runs, tmp_path, target=0.5, reference="uniform")
    assert [p.name for p in paths] == ["accuracy.png", "per_domain.png", "domain_probs.png", "informative.png"]
    # both panels: the proposed share (smoothed), never one policy's probabilities beside another's shares
    assert {s[3] for s in seen.values()} == {"proposed share, 10-step mean"}
    np.testing.assert_allclose(seen["dump"][2], [[0.25, 0.75]] * 6)
    per_domain = next(f for f in figs.values() if f._suptitle and "per distribution" in f._suptitle.get_text())
    assert per_domain._supxlabel.get_text() == "training step"
    assert per_domain._supylabel.get_text() == "held-out accuracy (greedy)"
    assert set(report.CAPTIONS) == {p.name for p in paths}


def test_wandb_logger_runs_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from rlpace.train.logging import StepLogger
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.chdir(tmp_path)
    log = StepLogger(tmp_path, "wandb", config={"policy": "dump"})
    log({"step": 0, "loss": 1.5, "prompt_ids": [1, 2]})
    log({"step": 1, "eval/mean": 0.5, "final": True})
    log.close()
    [run] = list((tmp_path / "wandb").glob("offline-run-*"))          # offline: nothing uploaded
    assert list(run.glob("run-*.wandb"))
    assert [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [0, 1]
