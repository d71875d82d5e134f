"""`rlpace train tasks=x.jsonl` takes what `rlpace prepare` writes (verl rows as JSON lines,
NaN written as null), and an unknown task set is a short message pointing at the forms."""

from __future__ import annotations

import json
import math

import pytest

from rlpace.tasks import make_taskset


def _row(i, domain, q, a, split="train", difficulty=None):
    return {"data_source": domain, "prompt": [{"role": "user", "content": q}], "ability": "exact",
            "reward_model": {"style": "rule", "ground_truth": a},
            "extra_info": {"index": i, "split": split, "difficulty": difficulty, "cluster_id": i % 2},
            "cluster_id": i % 2, "rank_in_cluster": 0, "difficulty": difficulty}


def test_jsonl_task_set_with_held_out_beside_it(tmp_path):
    train = tmp_path / "train.ads.jsonl"
    train.write_text("\n".join(json.dumps(_row(i, "add", f"{i}+1=", str(i + 1), difficulty=0.5 if i else None))
                               for i in range(3)) + "\n")
    (tmp_path / "test.jsonl").write_text(json.dumps(_row(7, "add", "7+1=", "8", "test")) + "\n")
    ts = make_taskset(str(train))
    assert [it.prompt for it in ts.train] == ["0+1=", "1+1=", "2+1="]
    assert [it.answer for it in ts.train] == ["1", "2", "3"] and [it.index for it in ts.train] == [0, 1, 2]
    assert math.isnan(ts.train[0].difficulty) and ts.train[1].difficulty == 0.5
    assert [it.answer for it in ts.heldout] == ["8"] and ts.domains == ("add",)


def test_jsonl_without_held_out_warns(tmp_path):
    train = tmp_path / "x.jsonl"
    train.write_text(json.dumps(_row(0, "d", "q", "a")) + "\n")
    with pytest.warns(UserWarning, match="no held-out file"):
        ts = make_taskset(str(train))
    assert len(ts.train) == 1 and ts.heldout == ()


def test_unknown_task_set_is_short_and_points_at_the_forms():
    with pytest.raises(ValueError, match="unknown task set") as e:
        make_taskset("/data/x.csv")
    msg = str(e.value)
    assert len(msg) < 260 and ".parquet / .jsonl" in msg and "rlpace train --help" in msg
