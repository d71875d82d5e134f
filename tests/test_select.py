"""`rlpace select`: offline selection of prompts under a rollout budget (DE-Venus arXiv 2609.03324).

Hand-made verl parquet files with hand-made rollouts whose routes are worked out by hand;
manifest replay; bad input rejected with nothing written; one end-to-end run with a tiny
random-init Qwen2 built here (tests/_tiny_lm.py).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
import pyarrow.parquet as pq  # noqa: E402

from rlpace.cli import main as cli_main  # noqa: E402
from rlpace.select import (answer_consistency, calibrate_thresholds, extract_answer, replay,  # noqa: E402
                           route_labeled, route_unlabeled, select, select_probes)

# Answer patterns of a group of G = 4 and their answer entropies (nats), by hand.
H_B = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))   # x x x y   = 0.5623
H_C = math.log(2)                                         # x x y y   = 0.6931
H_D = -(2 * 0.25 * math.log(0.25) + 0.5 * math.log(0.5))  # x x y z   = 1.0397
H_E = math.log(4)                                         # x y z w   = 1.3863


def verl_rows(ids, gts, *, ability="exact"):
    return [{"data_source": "toy",
             "prompt": [{"role": "user", "content": f"question {i}"}],
             "ability": ability,
             "reward_model": {"style": "rule", "ground_truth": gt},
             "extra_info": {"index": i, "split": "train"}}
            for i, gt in zip(ids, gts)]


def write_parquet(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def write_rollouts(path, groups: dict):
    with open(path, "w") as f:
        for i, comps in groups.items():
            rec = comps if isinstance(comps, dict) else {"completions": comps}
            f.write(json.dumps({"index": i, **rec}) + "\n")
    return path


# ---- labelled: band, then uncertainty within the budget --------------------------------

LABELED = {  # id: completions; every label is "4"
    10: ["4", "4", "4", "4"],                                        # p 1,    H 0    → above band
    11: ["<answer>4</answer>", "<answer> 4 </answer>", "4", "5"],     # p .75,  H_B
    12: ["4", "5", "4", "5"],                                        # p .5,   H_C
    13: ["4", "5", "6", "7"],                                        # p .25,  H_E
    14: ["5", "5", "5", "5"],                                        # p 0            → below band
    15: ["4", "5", "5", ""],                                         # p .25,  H_D ("" a singleton)
}


@pytest.fixture
def labeled_data(tmp_path):
    data = write_parquet(tmp_path / "train.parquet", verl_rows(list(LABELED), ["4"] * 6))
    roll = write_rollouts(tmp_path / "roll.jsonl", LABELED)
    return data, roll


def test_labeled_routes_band_then_most_uncertain_within_budget(tmp_path, labeled_data):
    data, roll = labeled_data
    res = select(data, tmp_path / "out" / "next.parquet", rollouts=roll, band=(0.1, 0.9), budget=3,
                 progress=False)
    man = res.manifest
    by_id = {p["id"]: p for p in man["prompts"]}
    # in band: 11 (H_B), 12 (H_C), 13 (H_E), 15 (H_D); most uncertain first: 13, 15, 12 | 11
    assert {i: (p["route"], p["reason"]) for i, p in by_id.items()} == {
        10: ("discard", "above_band"), 11: ("discard", "budget"), 12: ("keep", "in_band"),
        13: ("keep", "in_band"), 14: ("discard", "below_band"), 15: ("keep", "in_band")}
    assert [by_id[i]["pass_rate"] for i in LABELED] == [1.0, 0.75, 0.5, 0.25, 0.0, 0.25]
    np.testing.assert_allclose([by_id[i]["answer_entropy"] for i in LABELED],
                               [0.0, H_B, H_C, H_E, 0.0, H_D], atol=1e-12)
    assert [by_id[i]["majority_share"] for i in LABELED] == [1.0, 0.75, 0.5, 0.25, 1.0, 0.5]
    assert by_id[15]["majority_answer"] == "5" and by_id[12]["majority_answer"] == "4"
    assert man["rule"] == "pass_band_then_uncertainty" and man["parameters"]["band"] == [0.1, 0.9]
    assert man["counts"] == {"keep": 3, "weak_supervision": 0, "annotate": 0, "discard": 3}
    out = pq.read_table(res.output).to_pylist()
    assert [r["extra_info"]["index"] for r in out] == [12, 13, 15]          # input order
    assert [r["extra_info"]["labeled"] for r in out] == [True, True, True]
    assert out[0]["prompt"] == [{"role": "user", "content": "question 12"}]
    assert pq.read_table(res.annotate_path).num_rows == 0


def test_band_ends_are_inclusive(tmp_path, labeled_data):
    data, roll = labeled_data
    res = select(data, tmp_path / "next.parquet", rollouts=roll, band=(0.25, 0.75), progress=False)
    kept = [p["id"] for p in res.manifest["prompts"] if p["route"] == "keep"]
    assert kept == [11, 12, 13, 15]      # p = .75 and p = .25 sit on the ends and are kept


# ---- unlabelled: probes, calibrated thresholds, three routes ---------------------------

# Labelled probes (label "x") and unlabelled prompts, one answer pattern each.
MIXED = {
    1: (["x", "x", "x", "x"], "x"),   # u 0,   p 1
    2: (["x", "x", "x", "y"], "x"),   # u H_B, p .75
    3: (["x", "x", "y", "y"], "x"),   # u H_C, p .5
    4: (["y", "y", "z", "w"], "x"),   # u H_D, p 0
    5: (["y", "z", "w", "v"], "x"),   # u H_E, p 0
    6: (["a", "a", "a", "a"], None),  # u 0
    7: (["a", "a", "a", "b"], None),  # u H_B
    8: (["a", "a", "b", "b"], None),  # u H_C
    9: (["a", "a", "b", "c"], None),  # u H_D
    0: (["a", "b", "c", "d"], None),  # u H_E
}


@pytest.fixture
def mixed_data(tmp_path):
    data = write_parquet(tmp_path / "mixed.parquet",
                         verl_rows(list(MIXED), [gt for _, gt in MIXED.values()]))
    roll = write_rollouts(tmp_path / "mixed.jsonl", {i: c for i, (c, _) in MIXED.items()})
    return data, roll


def test_unlabeled_calibrates_on_probes_and_routes_three_ways(tmp_path, mixed_data):
    data, roll = mixed_data
    res = select(data, tmp_path / "next.parquet", rollouts=roll, probes=5, annotate_budget=1,
                 calibrate=(0.1, 0.9), progress=False)
    man = res.manifest
    # probes 1..5 (all labelled rows). t_discard: probe 1 (p 1 ≥ .9) yes, probe 2 (.75) no → 0.
    # t_annotate: probes 5 and 4 (p 0 ≤ .1) yes, probe 3 (.5) no → H_D.
    assert man["rule"] == "uncertainty_probes_calibrated"
    assert sorted(man["probe_ids"]) == [1, 2, 3, 4, 5]
    assert man["thresholds"]["calibrated"] is True
    assert man["thresholds"]["discard_at_or_below"] == 0.0
    assert man["thresholds"]["annotate_at_or_above"] == pytest.approx(H_D, abs=1e-12)
    routes = {p["id"]: (p["route"], p["reason"]) for p in man["prompts"]}
    assert routes == {
        1: ("discard", "mastered"), 2: ("keep", "labeled"), 3: ("keep", "labeled"),
        4: ("keep", "labeled"), 5: ("keep", "labeled"),
        6: ("discard", "mastered"), 7: ("weak_supervision", "uncertain_mid"),
        8: ("weak_supervision", "uncertain_mid"),
        9: ("discard", "annotate_budget"),      # above t_annotate, but the one label goes to 0 (H_E)
        0: ("annotate", "uncertain_high")}
    out = pq.read_table(res.output).to_pylist()
    assert [(r["extra_info"]["index"], r["extra_info"]["labeled"]) for r in out] == [
        (2, True), (3, True), (4, True), (5, True), (7, False), (8, False)]
    req = pq.read_table(res.annotate_path).to_pylist()
    assert [(r["extra_info"]["index"], r["extra_info"]["labeled"]) for r in req] == [(0, False)]


def test_unlabeled_budget_priority_annotate_then_labelled_then_weak(tmp_path, mixed_data):
    data, roll = mixed_data
    res = select(data, tmp_path / "next.parquet", rollouts=roll, probes=5, annotate_budget=1, budget=3,
                 progress=False)
    routes = {p["id"]: p["route"] for p in res.manifest["prompts"]}
    # ranked: annotate 0, then keep by u: 5 (H_E), 4 (H_D) | 3, 2, then weak 8, 7 → over budget
    assert {i for i, r in routes.items() if r != "discard"} == {0, 5, 4}
    assert {p["id"] for p in res.manifest["prompts"] if p["reason"] == "budget"} == {3, 2, 8, 7}


def test_probe_round_marks_probes_for_annotation_without_discarding(tmp_path):
    # no row labelled, 6 prompts, uncertainties 0, H_B, H_C, H_D, H_E, H_E
    groups = {20: ["a"] * 4, 21: ["a", "a", "a", "b"], 22: ["a", "a", "b", "b"],
              23: ["a", "a", "b", "c"], 24: ["a", "b", "c", "d"], 25: ["p", "q", "r", "s"]}
    data = write_parquet(tmp_path / "u.parquet", verl_rows(list(groups), [None] * 6))
    roll = write_rollouts(tmp_path / "u.jsonl", groups)
    res = select(data, tmp_path / "next.parquet", rollouts=roll, probes=3, annotate_budget=3, progress=False)
    man = res.manifest
    # sorted positions ⌊(j + ½)·6/3⌋ = 1, 3, 5 → targets H_B, H_D, H_E → ids 21, 23 and, of
    # the two prompts at H_E, the lower row: 24
    assert man["probe_ids"] == [21, 23, 24]
    assert man["thresholds"] == {"discard_at_or_below": None, "annotate_at_or_above": None,
                                 "calibrated": False}
    assert {p["id"]: (p["route"], p["reason"]) for p in man["prompts"]} == {
        20: ("weak_supervision", "uncertain_mid"), 21: ("annotate", "probe"),
        22: ("weak_supervision", "uncertain_mid"), 23: ("annotate", "probe"),
        24: ("annotate", "probe"), 25: ("weak_supervision", "uncertain_mid")}
    # a probe round needs room in the annotation budget for every probe
    with pytest.raises(ValueError, match="annotate_budget ≥ 3"):
        select(data, tmp_path / "n2.parquet", rollouts=roll, probes=3, annotate_budget=2, progress=False)
    assert not (tmp_path / "n2.parquet").exists()


# ---- the pieces, by hand ---------------------------------------------------------------

def test_rule_pieces_by_hand():
    assert extract_answer("so <answer> 42 </answer>") == "42"
    assert extract_answer("we get $\\boxed{\\frac{1}{2}}$ and \\boxed{x^{2}}") == "x^{2}"
    assert extract_answer("  7\n") == "7" and extract_answer("\\boxed{unclosed") == "\\boxed{unclosed"
    share, h, maj = answer_consistency(["b", "a", "a", "b"])
    assert (share, maj) == (0.5, "b") and h == pytest.approx(math.log(2))   # tie → first seen
    assert answer_consistency(["", ""]) == (0.0, pytest.approx(math.log(2)), None)
    # probes: sorted u = 0 (r0), .125 (r4), .25 (r1), .5 (r2), .625 (r5), .75 (r3); K = 3 →
    # positions 1, 3, 5 → targets .125, .5, .75 → nearest free candidate r4, r2, then r5 (.625)
    u = np.array([0.0, 0.25, 0.5, 0.75, 0.125, 0.625])
    cand = np.zeros(6, bool)
    cand[[2, 4, 5]] = True
    assert select_probes(u, cand, 3).tolist() == [4, 2, 5]
    assert select_probes(u, cand, 9).tolist() == [4, 2, 5]        # K' = min(K, #candidates)
    assert select_probes(u, cand, 2).tolist() == [4, 5]           # positions 1, 4
    # a tie in distance (target .25, candidates .125 and .375) goes to the lower row
    assert select_probes(np.array([.25, .375, .125]), np.array([False, True, True]), 1).tolist() == [1]
    # ties in probe uncertainty: both probes at u = .5 count for both thresholds
    assert calibrate_thresholds(np.array([.5, .5, .9]), np.array([1., .5, 0.])) == (-np.inf, 0.9)
    assert calibrate_thresholds(np.array([.1, .5]), np.array([.95, .95])) == (0.5, np.inf)
    with pytest.raises(ValueError, match="lo < hi"):
        calibrate_thresholds(np.array([.1]), np.array([1.]), lo=0.5, hi=0.5)
    r, why = route_labeled(np.array([.5, np.nan]), np.array([0., 1.]), np.array([True, False]))
    assert r.tolist() == ["keep", "discard"] and why.tolist() == ["in_band", "no_label"]
    r, why = route_unlabeled(np.array([.1, .5, .9]), np.array([False, True, False]), 0.1, 0.9,
                             annotate_budget=0)
    assert r.tolist() == ["discard", "keep", "discard"]
    assert why.tolist() == ["mastered", "labeled", "annotate_budget"]


# ---- manifest replay ---------------------------------------------------------------------

def test_manifest_replays_to_the_same_dataset(tmp_path, mixed_data, capsys):
    data, roll = mixed_data
    rc = cli_main(["select", str(data), "--out", str(tmp_path / "a" / "next.parquet"), "--rollouts", str(roll),
                   "--probes", "5", "--annotate-budget", "1", "--no-progress"])
    assert rc == 0
    assert "6 rows (4 labelled, 2 weak supervision); 1 to annotate" in capsys.readouterr().out
    man_path = tmp_path / "a" / "next.manifest.json"
    man = json.loads(man_path.read_text())
    assert man["parameters"]["probes"] == 5 and man["parameters"]["annotate_budget"] == 1
    assert man["input"]["sha256"] == __import__("hashlib").sha256(data.read_bytes()).hexdigest()
    rc = cli_main(["select", "--replay", str(man_path), "--data", str(data), "--out", str(tmp_path / "b" / "again.parquet")])
    assert rc == 0
    a, b = tmp_path / "a", tmp_path / "b"
    assert (b / "again.parquet").read_bytes() == (a / "next.parquet").read_bytes()
    assert (b / "again.annotate.parquet").read_bytes() == (a / "next.annotate.parquet").read_bytes()
    assert json.loads((b / "again.manifest.json").read_text()) == man
    # the library call gives the same rows too
    res = replay(man_path, data, tmp_path / "c" / "x.parquet")
    assert pq.read_table(res.output).equals(pq.read_table(a / "next.parquet"))


def test_replay_refuses_a_changed_input_or_unknown_ids_and_writes_nothing(tmp_path, mixed_data, capsys):
    data, roll = mixed_data
    res = select(data, tmp_path / "next.parquet", rollouts=roll, probes=5, progress=False)
    capsys.readouterr()
    # a changed input file (one label edited) → hash mismatch
    rows = pq.read_table(data).to_pylist()
    rows[0]["reward_model"]["ground_truth"] = "changed"
    changed = write_parquet(tmp_path / "changed.parquet", rows)
    out = tmp_path / "r1"
    assert cli_main(["select", "--replay", str(res.manifest_path), "--data", str(changed), "--out", str(out / "x.parquet")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rlpace select: error: data") and "sha256" in err and "\n" not in err
    assert not out.exists()
    # an id the input does not hold (same input file, manifest edited)
    man = json.loads(res.manifest_path.read_text())
    man["prompts"][0]["id"] = 999
    bad = tmp_path / "bad.manifest.json"
    bad.write_text(json.dumps(man))
    assert cli_main(["select", "--replay", str(bad), "--data", str(data), "--out", str(out / "x.parquet")]) == 2
    err = capsys.readouterr().err.strip()
    assert "ids that are not in" in err and "[999]" in err and "\n" not in err
    assert not out.exists()
    # not a manifest at all
    (tmp_path / "junk.json").write_text('{"__class__": "os.system"}')
    assert cli_main(["select", "--replay", str(tmp_path / "junk.json"), "--data", str(data), "--out", str(out / "x.parquet")]) == 2
    assert "not an rlpace select manifest" in capsys.readouterr().err
    assert not out.exists()


def test_replay_reports_the_routes_it_wrote_not_the_manifest_counts(tmp_path, labeled_data, capsys):
    # A manifest whose routes were edited (and whose stale "counts" was dropped) replays its
    # routes; the CLI's summary counts those routes (it used to read "counts": KeyError).
    data, roll = labeled_data
    res = select(data, tmp_path / "next.parquet", rollouts=roll, band=(0.1, 0.9), budget=3, progress=False)
    man = json.loads(res.manifest_path.read_text())
    for p in man["prompts"]:
        p["route"] = "keep" if p["id"] in (10, 11) else "discard"
    del man["counts"]
    edited = tmp_path / "edited.manifest.json"
    edited.write_text(json.dumps(man))
    capsys.readouterr()
    assert cli_main(["select", "--replay", str(edited), "--data", str(data),
                     "--out", str(tmp_path / "r" / "x.parquet")]) == 0
    out = capsys.readouterr().out
    assert "2 rows (2 labelled, 0 weak supervision); 0 to annotate" in out and "4 discarded" in out
    assert [r["extra_info"]["index"] for r in pq.read_table(tmp_path / "r" / "x.parquet").to_pylist()] == [10, 11]


# ---- bad input: one line, exit 2, nothing written ------------------------------------------

def _no_index(tmp_path):
    rows = verl_rows([1, 2], ["x", "x"])
    for r in rows:
        r["extra_info"] = {"split": "train"}
    return write_parquet(tmp_path / "noindex.parquet", rows)


def _no_prompt(tmp_path):
    rows = verl_rows([1, 2], ["x", "x"])
    for r in rows:
        del r["prompt"]
    return write_parquet(tmp_path / "noprompt.parquet", rows)


@pytest.mark.parametrize("make,extra,needle", [
    (None, ["--budget", "-1"], "budget (--budget) must be an integer ≥ 0"),
    (None, ["--annotate-budget", "-2"], "annotate_budget (--annotate-budget) must be an integer ≥ 0"),
    (None, ["--band", "0.9,0.1"], "Order the pair lo,hi"),
    (None, ["--band", "0.2"], "expected two numbers lo,hi"),
    (None, ["--calibrate", "0.5,0.5"], "needs lo < hi"),
    (None, ["--probes", "0"], "probes (--probes) must be an integer ≥ 1"),
    (None, ["--uncertainty", "token_entropy"], "needs 'token_entropy' lists in the rollouts"),
    ("model", [], "is not a directory"),
    ("notamodel", [], "is not a causal LM"),
    ("both", [], "pass exactly one of model"),
    ("noindex", [], "has no extra_info.index"),
    ("noprompt", [], "prompt column 'prompt' is not in the input"),
    ("badroll", [], "'token_entropy' must be a list of 4 finite numbers"),
    ("unknownroll", [], "index 77 is not an extra_info.index"),
    ("listroll", [], "'index' must be the row's extra_info.index"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, labeled_data, capsys, make, extra, needle):
    data, roll = labeled_data
    args = ["select", str(data), "--rollouts", str(roll)]
    if make == "model":
        args = ["select", str(data), "--model", str(tmp_path / "no-such-model")]
    elif make == "notamodel":
        (tmp_path / "empty").mkdir()
        args = ["select", str(data), "--model", str(tmp_path / "empty")]
    elif make == "both":
        args += ["--model", str(tmp_path)]
    elif make == "noindex":
        args[1] = str(_no_index(tmp_path))
    elif make == "noprompt":
        args[1] = str(_no_prompt(tmp_path))
    elif make == "badroll":
        args[3] = str(write_rollouts(tmp_path / "bad.jsonl", {
            i: {"completions": c, "token_entropy": [0.1] * 3} for i, c in LABELED.items()}))
    elif make == "unknownroll":
        args[3] = str(write_rollouts(tmp_path / "unk.jsonl", {**LABELED, 77: ["4"]}))
    elif make == "listroll":      # an unhashable id used to escape as a TypeError traceback
        bad = tmp_path / "list.jsonl"
        bad.write_text(json.dumps({"index": [10], "completions": ["4"]}) + "\n")
        args[3] = str(bad)
    out = tmp_path / "out"
    assert cli_main(args + ["--out", str(out / "next.parquet"), "--no-progress"] + extra) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rlpace select: error:") and "\n" not in err and "Traceback" not in err
    assert needle in err
    assert not out.exists()


# ---- token statistics, by hand and against a loop ---------------------------------------------

def test_token_stats_by_hand_and_against_a_reference_loop():
    torch = pytest.importorskip("torch")
    from rlpace.select import response_mask, token_stats
    # z = [0, ln 3]: p = (1/4, 3/4); H = 0.5623; SC = KL(U‖p) = ½ ln(4/3) = 0.1438
    z = torch.tensor([[[0.0, math.log(3)]]], dtype=torch.float64)
    e, s = token_stats(z, torch.ones(1, 1, dtype=torch.bool))
    assert e[0] == pytest.approx(H_B, abs=1e-12) and s[0] == pytest.approx(0.5 * math.log(4 / 3), abs=1e-12)
    # uniform logits: entropy ln V, self-certainty 0
    e, s = token_stats(torch.zeros(1, 2, 5, dtype=torch.float64), torch.ones(1, 2, dtype=torch.bool))
    assert e[0] == pytest.approx(math.log(5)) and s[0] == pytest.approx(0.0, abs=1e-12)
    # mask: tokens up to and including the first EOS (id 9)
    resp = torch.tensor([[3, 9, 9, 9], [3, 4, 5, 6], [9, 1, 1, 1]])
    assert response_mask(resp, 9).tolist() == [[True, True, False, False], [True] * 4,
                                               [True, False, False, False]]
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 4, 7)) * 2
    e, s = token_stats(torch.tensor(logits), response_mask(resp, 9))
    for r, n_tok in enumerate([2, 4, 1]):
        ents, scs = [], []
        for t in range(n_tok):
            p = np.exp(logits[r, t] - logits[r, t].max())
            p /= p.sum()
            ents.append(-sum(pj * math.log(pj) for pj in p))
            scs.append(sum(math.log(1 / 7 / pj) for pj in p) / 7)      # KL(U ‖ p)
        assert e[r] == pytest.approx(np.mean(ents), abs=1e-10)
        assert s[r] == pytest.approx(np.mean(scs), abs=1e-10)


# ---- end to end with a tiny local model -----------------------------------------------------

def test_end_to_end_with_a_tiny_model(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from _tiny_lm import build_tiny_lm
    from transformers import AutoModelForCausalLM, AutoTokenizer
    torch.set_num_threads(1)
    lm = build_tiny_lm(tmp_path / "lm")
    ids = [5, 6, 7, 8, 9]
    rows = verl_rows(ids, ["42", "4", None, "9", None])   # 3 labelled, 2 unlabelled
    for r, q in zip(rows, ["What is 12 plus 30?", "Sort 5, 3", "The knight", "Mix flour", "Jupiter is"]):
        r["prompt"][0]["content"] = q
    data = write_parquet(tmp_path / "d.parquet", rows)
    args = ["select", str(data), "--model", str(lm), "--samples", "3", "--max-new-tokens", "5", "--batch-size", "2",
            "--seed", "3", "--probes", "2", "--uncertainty", "self_certainty", "--no-progress"]
    assert cli_main(args + ["--out", str(tmp_path / "a.parquet")]) == 0
    assert cli_main(args + ["--out", str(tmp_path / "b.parquet")]) == 0
    capsys.readouterr()
    a = json.loads((tmp_path / "a.manifest.json").read_text())
    b = json.loads((tmp_path / "b.manifest.json").read_text())
    assert a["prompts"] == b["prompts"]                                  # seeded
    assert a["parameters"]["mode_used"] == "unlabeled" and a["parameters"]["source"]["samples"] == 3
    assert a["thresholds"]["calibrated"] is True and len(a["probe_ids"]) == 2
    vocab = AutoModelForCausalLM.from_pretrained(lm).config.vocab_size
    for p in a["prompts"]:
        assert p["n_samples"] == 3 and p["uncertainty"] == pytest.approx(-p["self_certainty"])
        assert 0 <= p["token_entropy"] <= math.log(vocab) + 1e-9 and p["self_certainty"] >= -1e-9
        assert (p["pass_rate"] is None) == (p["id"] in (7, 9))
    # the token statistics of one rollout, recomputed by a teacher-forced forward pass
    from rlpace.select import generate_rollouts
    from rlpace.prepare import read_table
    tok = AutoTokenizer.from_pretrained(lm)
    model = AutoModelForCausalLM.from_pretrained(lm).eval()
    groups = generate_rollouts(read_table(data).slice(0, 1), lm, samples=1, max_new_tokens=5, batch_size=1,
                               seed=3, progress=False)
    torch.manual_seed(3)
    enc = tok(["What is 12 plus 30?"], return_tensors="pt")
    gen = model.generate(**enc, do_sample=True, temperature=1.0, top_k=0, max_new_tokens=5,
                         pad_token_id=tok.pad_token_id)
    resp = gen[0, enc["input_ids"].shape[1]:]
    assert tok.decode(resp, skip_special_tokens=True) == groups[0]["completions"][0]
    with torch.no_grad():
        logits = model(gen).logits[0, enc["input_ids"].shape[1] - 1:-1].double()   # predict each token
    eos = (resp == tok.eos_token_id).nonzero()
    n_tok = int(eos[0]) + 1 if len(eos) else len(resp)
    lp = torch.log_softmax(logits[:n_tok], -1)
    ent = float(-(lp.exp() * lp).sum(-1).mean())
    sc = float((-lp.mean(-1) - math.log(logits.shape[-1])).mean())         # KL(U‖p) = −mean log p − log V
    assert groups[0]["token_entropy"][0] == pytest.approx(ent, abs=1e-4)
    assert groups[0]["self_certainty"][0] == pytest.approx(sc, abs=1e-4)


def test_jsonl_input_with_string_ids_and_math_answers_replays(tmp_path, capsys):
    rows = verl_rows(["a", "b"], ["\\frac{1}{2}", "3"], ability="math")
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    roll = write_rollouts(tmp_path / "r.jsonl", {"a": ["so \\boxed{0.5}", "\\boxed{1/2}", "\\boxed{2}"],
                                                 "b": ["\\boxed{3}"] * 3})
    res = select(data, tmp_path / "o.jsonl", rollouts=roll, band=(0.0, 0.9), progress=False)
    by_id = {p["id"]: p for p in res.manifest["prompts"]}
    # math-verify: 0.5 and 1/2 equal 1/2, 2 does not → 2/3; answers are compared as strings
    assert by_id["a"]["pass_rate"] == pytest.approx(2 / 3) and by_id["a"]["majority_share"] == pytest.approx(1 / 3)
    assert (by_id["a"]["route"], by_id["b"]["route"], by_id["b"]["reason"]) == ("keep", "discard", "above_band")
    out = [json.loads(line) for line in res.output.read_text().splitlines()]
    assert [(r["extra_info"]["index"], r["extra_info"]["labeled"]) for r in out] == [("a", True)]
    assert cli_main(["select", "--replay", str(res.manifest_path), "--data", str(data),
                     "--out", str(tmp_path / "again.jsonl")]) == 0
    assert (tmp_path / "again.jsonl").read_bytes() == res.output.read_bytes()


def test_outputs_never_overwrite_the_input(tmp_path, labeled_data, capsys):
    data, roll = labeled_data
    before = data.read_bytes()
    man = tmp_path / "m.json"
    for extra in (["--out", str(data)], ["--out", str(tmp_path / "o.parquet"), "--manifest", str(data)]):
        assert cli_main(["select", str(data), "--rollouts", str(roll)] + extra) == 2
        assert "is the input" in capsys.readouterr().err
    assert data.read_bytes() == before and not (tmp_path / "o.parquet").exists() and not man.exists()
