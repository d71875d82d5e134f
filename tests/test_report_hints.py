"""What `rlpace report` advises when a folder has too few seeds for a paired CI: demo runs
gain seeds from `rlpace demo --seed N` (or the headroom benchmark), other records from
`rlpace compare --seeds 8`."""

from __future__ import annotations

import pytest

from rlpace.cli import main
from rlpace.evaluation import analyze
from rlpace.experiments import minimal_record, write_record


def _rec(label, seed, acc, producer=None):
    r = minimal_record(run_id=f"{label}{seed}", label=label, seed=seed, final_acc={"a": acc[-1]})
    r["budget"] = {"steps": 30, "batch_size": None, "group_size": None, "eval_every": None}
    r["evals"] = {"step": [0, 10, 20, 30], "rollouts": [0, 100, 200, 300], "acc_mean": acc}
    r["rollouts"] = 300
    if producer:
        r["config"] = {"producer": producer}
    return r


@pytest.mark.parametrize("producer, hint, not_hint", [
    ("rlpace demo", "rlpace demo --seed 1", "compare --seeds"),
    (None, "rlpace compare --seeds 8", "rlpace demo"),
])
def test_one_seed_hint_follows_the_producer(producer, hint, not_hint):
    recs = [_rec("uniform", 0, [0.2, 0.4, 0.6, 0.7], producer), _rec("recommended", 0, [0.2, 0.5, 0.7, 0.7], producer)]
    with pytest.raises(ValueError, match="a paired CI needs at least 2") as e:
        analyze(recs, baseline="uniform", random_state=0, n_boot=200)
    assert hint in str(e.value) and not_hint not in str(e.value)


def test_report_of_one_demo_seed_points_at_demo_seeds(tmp_path, capsys):
    for r in (_rec("uniform", 0, [0.2, 0.4, 0.6, 0.7], "rlpace demo"),
              _rec("recommended", 0, [0.2, 0.5, 0.7, 0.7], "rlpace demo")):
        write_record(tmp_path / "runs" / f"{r['run_id']}.jsonl", r)
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "rlpace demo --seed 1" in err and "headroom" in err and "compare --seeds" not in err
