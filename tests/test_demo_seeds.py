"""The demo's seeds: every seed's records in one folder are paired (efficiency_vs_baseline
over them), the measured 8-seed figure is printed beside one seed's, and a new seed's base
build is announced whatever `progress` is."""

from __future__ import annotations

import numpy as np
import pytest

from rlpace.cli.demo import MEASURED, measured_line, seeds_summary
from rlpace.experiments import minimal_record

X = [0, 100, 200, 300]


def _rec(label, seed, acc, suite="mostly_solved", steps=30, producer="rlpace demo"):
    return minimal_record(run_id=f"{label}{seed}", label=label, seed=seed, final_acc={"a": acc[-1]}, suite=suite,
                          steps=steps, config={"producer": producer},
                          evals={"step": [0, 10, 20, 30], "rollouts": X, "acc_mean": acc})


# uniform: base 0.2, final (tail 1) 0.7 → target 0.6, reached at 200 on both seeds.
# recommended: seed 0 at 100 + (0.15/0.25)·100 = 160; seed 1 at 100 (0.6 exactly).
UNIFORM = [0.2, 0.4, 0.6, 0.7]
REC = {0: [0.2, 0.45, 0.7, 0.7], 1: [0.2, 0.6, 0.7, 0.7]}


def test_paired_over_the_seeds_in_the_folder():
    recs = [_rec("uniform", s, UNIFORM) for s in (0, 1)] + [_rec("recommended", s, REC[s]) for s in (0, 1)]
    recs += [_rec("uniform", 2, UNIFORM, suite="embedded"),          # another suite: not paired
             _rec("recommended", 3, REC[0]), _rec("uniform", 4, UNIFORM, steps=99)]   # unpaired / other budget
    out = seeds_summary(recs, suite="mostly_solved", policy="recommended", baseline="uniform", steps=30, tail=1)
    assert out["seeds"] == [0, 1]
    r = out["ratio"]
    assert r.estimate == pytest.approx((160 + 100) / (200 + 200)) and r.n == 2 and r.reached_method == 2
    assert out["line"].startswith("over seeds 0, 1 in this folder (2 paired): recommended needed 0.65× [")


def test_one_seed_says_how_to_add_one_and_no_gain_says_why():
    one = seeds_summary([_rec("uniform", 0, UNIFORM), _rec("recommended", 0, REC[0])], suite="mostly_solved",
                        policy="recommended", baseline="uniform", steps=30)
    assert one["ratio"] is None and "rerun with --seed 1 and the same --out" in one["line"]
    flat = [_rec("uniform", 0, UNIFORM), _rec("uniform", 1, [0.5, 0.4, 0.5, 0.5]),
            _rec("recommended", 0, REC[0]), _rec("recommended", 1, REC[1])]
    out = seeds_summary(flat, suite="mostly_solved", policy="recommended", baseline="uniform", steps=30)
    assert out["ratio"] is None and "no paired figure" in out["line"] and "seed 1 gained nothing" in out["line"]


def test_measured_line_applies_to_the_default_demo_only():
    line = measured_line("mostly_solved", "recommended", "uniform")
    assert "measured over 8 seeds" in line and "0.54× [0.37, 0.78]" in line and MEASURED["command"] in line
    other = measured_line("embedded", "recommended", "uniform")
    assert other.startswith("no multi-seed figure is recorded for recommended vs uniform on embedded")


def test_base_build_is_announced_with_progress_off(tmp_path, capsys, monkeypatch):
    pytest.importorskip("torch")
    import rlpace.train.model as model
    from rlpace.tasks import make_taskset

    class Stop(Exception):
        pass

    def stop(*a, **k):
        raise Stop
    monkeypatch.setattr(model, "supervised_warmup", stop)
    ts = make_taskset("embedded:max2", train_per_domain=4, heldout_per_domain=2)
    with pytest.raises(Stop):
        model.build_base_policy(ts, hidden=16, layers=1, heads=2, warmup_steps=5, warmup_batch=4, seed=7,
                                corpus_per_domain=8, cache_dir=tmp_path, progress=False)
    err = capsys.readouterr().err
    assert "building the base policy once for seed 7 (cached at " + str(tmp_path) in err
    assert "about 2 minutes on 2 cores" in err
