"""The built-in trainer writes `rlpace advise`'s pilot record (`record=PATH`): one line per
generated batch (refills and probes counted), the held-out evaluations, exact on resume."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).parent))
from _tiny_train import read_log, tiny_config  # noqa: E402

from rlpace import Feedback  # noqa: E402
from rlpace.advise import Pilot, PilotRecorder, read_pilot  # noqa: E402
from rlpace.advise._trainer import plateau  # noqa: E402
from rlpace.train import train  # noqa: E402
from rlpace.train.recipes.grpo import _build_data  # noqa: E402

torch.set_num_threads(1)


def _lines(path):
    return [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]


def test_trainer_record_round_trips_with_refills(tmp_path, cache):
    cfg = tiny_config(tmp_path / "run", cache, steps=3, policy="uniform+dapo_dynamic_sampling", objective="dapo",
                      max_refill_rounds=2, record=str(tmp_path / "pilot.jsonl"))
    train(cfg)
    pool = _build_data(cfg)[2]
    logged = read_log(cfg.out)
    steps = [r for r in logged if not r.get("final")]
    pilot = read_pilot(tmp_path / "pilot.jsonl")
    lines = _lines(tmp_path / "pilot.jsonl")[1:]
    assert any(r["refill_rounds"] > 0 for r in steps)                   # refills happened and were recorded
    assert len([x for x in lines if "rewards" in x]) == sum(r["refill_rounds"] + 1 for r in steps)
    for r in steps:
        t = r["step"]
        rows = pilot.step == t
        # ids: the pool's stable ids of exactly the prompts the step generated, in order
        assert list(pilot.prompt_ids[rows]) == [int(pool.ids[i]) for i in r["prompt_ids"]]
        assert pilot.step_rollouts[t] == r["rollouts"] == 4 * int(rows.sum())
        assert pilot.rewards[rows].shape == (len(r["prompt_ids"]), 4)
        assert pilot.rewards[rows].mean() == pytest.approx(r["reward_mean"], abs=1e-6)   # float32 there
    assert pilot.rollouts == steps[-1]["rollouts_total"]
    # every held-out evaluation (steps 0 and 2, and the final one at step 3), with the rollouts before it
    evals = [(r["step"], r["eval/mean"]) for r in logged if "eval/mean" in r]
    assert [(t, a) for t, _, a in pilot.evals] == [(t, pytest.approx(a)) for t, a in evals] and len(evals) == 3
    before = {0: 0, 2: steps[0]["rollouts"] + steps[1]["rollouts"], 3: steps[-1]["rollouts_total"]}
    assert [n for _, n, _ in pilot.evals] == [before[t] for t, _ in evals]
    # each evaluation's per-domain accuracies with each domain's held-out size (the held-out solved share's fit)
    n_held = {d: len(v) for d, v in _build_data(cfg)[1].heldout_by_domain().items()}
    assert [t for t, _, _ in pilot.domain_evals] == [t for t, _ in evals] and min(n_held.values()) > 0
    for (t, acc, n), r in zip(pilot.domain_evals, [r for r in logged if "eval/mean" in r]):
        assert n == n_held and set(acc) <= set(n_held) and acc
        assert all(acc[d] == pytest.approx(r[f"eval/{d}"]) for d in acc)


def test_trainer_record_counts_lilo_probes(tmp_path, cache):
    cfg = tiny_config(tmp_path / "run", cache, steps=2, lilo_candidates=3, lilo_probes=2,
                      record=str(tmp_path / "pilot.jsonl"))
    train(cfg)
    pilot = read_pilot(tmp_path / "pilot.jsonl")
    assert pilot.step_rollouts == {0: 3 * 4 * 2 + 16, 1: 3 * 4 * 2 + 16}    # probes + B·G
    assert pilot.rewards.shape == (8, 4)


def test_trainer_record_on_resume_equals_one_run(tmp_path, cache):
    whole = tiny_config(tmp_path / "a", cache, steps=4, record=str(tmp_path / "a.jsonl"))
    train(whole)
    part = tiny_config(tmp_path / "b", cache, steps=2, checkpoint_every=2, record=str(tmp_path / "b.jsonl"))
    train(part)
    with open(tmp_path / "b.jsonl", "a") as f:        # a line written after the checkpoint, then a crash
        f.write(json.dumps({"step": 2, "prompt_ids": [0], "rewards": [[1, 1, 1, 1]], "rollouts": 4}) + "\n")
    train(dataclasses.replace(part, steps=4, resume=True))
    a, b = _lines(tmp_path / "a.jsonl"), _lines(tmp_path / "b.jsonl")
    # batches and evaluations alike; the first run's final eval (at step 2) and the stray line are dropped
    assert b[1:] == a[1:] and len(a) == 1 + 4 + 1 and [x["step"] for x in a[1:]] == [0, 1, 2, 3, 4]


def test_recorder_restart_keeps_the_lines_before_the_step(tmp_path):
    path = tmp_path / "p.jsonl"
    rec = PilotRecorder(path, restart_at=0)
    for t in range(3):
        rec.write(Feedback(np.array([t]), np.ones((1, 2)), None, t))
    rec.write_eval(3, {"mean": 0.5, "d": 0.5})
    PilotRecorder(path, restart_at=2)
    assert [x["step"] for x in _lines(path)[1:]] == [0, 1]
    PilotRecorder(path, restart_at=0)
    assert len(_lines(path)) == 1 and _lines(path)[0]["format"] == "rlpace-pilot"


def _cli(argv, capsys):
    from rlpace.cli import main
    rc = main(argv)
    cap = capsys.readouterr()
    return rc, cap.out, [ln for ln in cap.err.strip().splitlines()       # less progress lines
                        if ln.startswith("rlpace advise: error") or not ln.startswith("rlpace advise: ")]


def _tiny_overrides(cache, out, **kw):
    from _tiny_train import TINY
    return [f"{k}={v}" for k, v in {**TINY, "cache_dir": cache, "out": str(out), **kw}.items()]


def test_cli_advise_runs_its_pilot_then_reprofiles_the_run(tmp_path, cache, capsys):
    run = tmp_path / "run"
    rc, text, err = _cli(["advise", *_tiny_overrides(cache, run, steps=50), "--policies", "dump", "--draws", "2",
                          "--out", str(tmp_path / "o")], capsys)
    assert rc == 0, err
    pilot = read_pilot(run / "pilot" / "pilot.jsonl")
    assert sorted(pilot.step_rollouts) == list(range(10))            # 20 % of 50 steps, uniform
    adv = json.loads((tmp_path / "o" / "advice.json").read_text())
    assert adv["pilot_rollouts"] == 10 * 16 == pilot.rollouts and adv["budget_rollouts"] == 50 * 16
    assert adv["sentence"] in text
    # the pilot run re-profiled from its own record: its budget (10 steps) is spent unless a larger one is given
    rc, _, err = _cli(["advise", "--from-run", str(run / "pilot"), "--out", str(tmp_path / "p")], capsys)
    assert rc == 2 and len(err) == 1 and "spent 160 rollouts of its 160" in err[0]
    rc, text, err = _cli(["advise", "--from-run", str(run / "pilot"), "--budget-rollouts", "800", "--policies",
                          "dump", "--draws", "2", "--out", str(tmp_path / "p")], capsys)
    assert rc == 0, err
    state = plateau(pilot)
    assert state.evals == 6                                     # steps 0, 2, ..., 8 and the final one at 10
    assert ("has plateaued" if state.plateaued else "is still improving") in text and "switch now: " in text
    assert json.loads((tmp_path / "p" / "advice.json").read_text())["pilot_rollouts"] == 160


def test_cli_advise_fits_a_knapsack_pilot_of_the_trainer(tmp_path, cache, capsys):
    """A pilot run with a rollout-allocation policy (`policy=knapsack`, the built-in trainer's
    `record=`): its ragged record reads back with each step's N_i and rewards as the trainer
    logged them, its rollouts are Σ N_i, and advise fits it and predicts knapsack beside the
    oracle allocation."""
    run = tmp_path / "run"
    rc, text, err = _cli(["advise", *_tiny_overrides(cache, run, steps=50, policy="knapsack",
                                                      policy_kwargs='{"min_count": 2, "max_n": 10}'),
                          "--policies", "knapsack", "--draws", "2", "--out", str(tmp_path / "o")], capsys)
    assert rc == 0, err
    pilot = read_pilot(run / "pilot" / "pilot.jsonl")
    logged = [r for r in read_log(run / "pilot") if not r.get("final")]
    assert [r["step"] for r in logged] == list(range(10))
    assert pilot.sizes is not None and len(set(pilot.sizes.tolist())) > 1          # ragged: knapsack split
    for r in logged:
        rows = pilot.step == r["step"]
        assert pilot.sizes[rows].tolist() == r["group_sizes"] and sum(r["group_sizes"]) == 16
        assert pilot.step_rollouts[r["step"]] == r["rollouts"] == 16
        live = pilot.rewards[rows][pilot.valid[rows]]                             # the Σ N_i rewards
        assert live.size == 16 and live.mean() == pytest.approx(r["reward_mean"], abs=1e-6)
    adv = json.loads((tmp_path / "o" / "advice.json").read_text())
    assert adv["pilot_rollouts"] == pilot.rollouts == 10 * 16 == logged[-1]["rollouts_total"]
    assert adv["fit"]["groups"] == int(pilot.sizes.size)
    assert [p["policy"] for p in adv["policies"]] == ["knapsack"] and "oracle_allocation" in adv["oracles"]
    assert "oracle_allocation (allocation's headroom)" in text


def test_cli_advise_bad_inputs(tmp_path, cache, capsys):
    out = tmp_path / "o"
    # no pilot at all; two pilots at once
    rc, _, err = _cli(["advise", "--out", str(out)], capsys)
    assert rc == 2 and len(err) == 1 and "give one pilot" in err[0]
    rc, _, err = _cli(["advise", "tasks=ladder", "--from-run", str(tmp_path), "--out", str(out)], capsys)
    assert rc == 2 and len(err) == 1 and "key=value and --from-run" in err[0]
    # 20 % of 20 steps is 4 < 10 steps: ask for steps ≥ 50, before any work
    rc, _, err = _cli(["advise", *_tiny_overrides(cache, tmp_path / "r", steps=20), "--out", str(out)], capsys)
    assert rc == 2 and len(err) == 1 and "is 4 steps" in err[0] and "steps ≥ 50" in err[0]
    assert not (tmp_path / "r").exists()
    rc, _, err = _cli(["advise", "tasks=ladder", "steps=100", "--pilot-share", "1.5", "--out", str(out)], capsys)
    assert rc == 2 and len(err) == 1 and "--pilot-share" in err[0]
    rc, _, err = _cli(["advise", "tasks=ladder", "stepz=100", "--out", str(out)], capsys)
    assert rc == 2 and len(err) == 1 and "stepz" in err[0]
    # a run without a record; a folder that is no run
    from rlpace.train import TrainConfig
    (tmp_path / "norec").mkdir()
    (tmp_path / "norec" / "config.json").write_text(json.dumps(TrainConfig().to_dict()))
    rc, _, err = _cli(["advise", "--from-run", str(tmp_path / "norec"), "--out", str(out)], capsys)
    assert rc == 2 and len(err) == 1 and "record=PATH" in err[0]
    rc, _, err = _cli(["advise", "--from-run", str(tmp_path / "none"), "--out", str(out)], capsys)
    assert rc == 2 and len(err) == 1 and "no config.json" in err[0]
    assert not out.exists()


def _with_evals(evals):
    return Pilot(np.zeros(1, object), np.zeros(1, np.int64), np.zeros((1, 2)), {0: 2}, evals, (0.0, 1.0), 0.5,
                 "pool", "training")


def test_plateau_reads_the_last_half_of_the_rollouts():
    # the eval at ≤ half of 300 rollouts is the one at 100: late gain 0.53 − 0.50 = 0.03 < 0.1 × 0.33
    s = plateau(_with_evals([(0, 0, 0.2), (1, 100, 0.5), (2, 200, 0.52), (3, 300, 0.53)]))
    assert s.plateaued and s.gain == pytest.approx(0.33) and s.late_gain == pytest.approx(0.03) and s.evals == 4
    s = plateau(_with_evals([(0, 0, 0.2), (1, 100, 0.5), (2, 200, 0.52), (3, 300, 0.6)]))
    assert not s.plateaued and s.late_gain == pytest.approx(0.1)
    assert plateau(_with_evals([(0, 0, 0.2), (3, 300, 0.6)])) is None
