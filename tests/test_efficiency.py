"""The rollouts-to-a-fraction-of-gain metric, the area under accuracy vs rollouts, and the
report's censored ratios — against hand-computed curves."""

import numpy as np
import pytest

from rlpace.evaluation import (Curve, analyze, captured_share, cost_to_reach, efficiency_vs_baseline,
                               gain_target, normalized_auc, paired_cost_ratio)

X = np.array([0.0, 100.0, 200.0, 300.0])


def test_gain_target_hand_computed():
    assert gain_target(0.3, 0.8, 0.8) == pytest.approx(0.7)
    assert gain_target(0.3, 0.8, 1.0) == pytest.approx(0.8)
    np.testing.assert_allclose(gain_target(np.array([0.2, 0.4]), np.array([0.7, 0.9]), 0.5), [0.45, 0.65])
    with pytest.raises(ValueError, match="fraction"):
        gain_target(0.3, 0.8, 0.0)


def test_cost_to_reach_interpolates_between_evaluations():
    a = np.array([0.3, 0.5, 0.7, 0.8])
    assert cost_to_reach(X, a, 0.6) == (pytest.approx(150.0), True)    # halfway from 0.5 to 0.7
    assert cost_to_reach(X, a, 0.7) == (200.0, True)                   # exactly at an evaluation
    assert cost_to_reach(X, a, 0.75) == (pytest.approx(250.0), True)
    assert cost_to_reach(X, a, 0.3) == (0.0, True)                     # at the target from the start
    # the first crossing counts, even when the curve dips afterwards
    assert cost_to_reach(X, np.array([0.3, 0.7, 0.5, 0.8]), 0.6) == (pytest.approx(75.0), True)


def test_cost_to_reach_censored_at_own_budget():
    assert cost_to_reach(X, np.array([0.3, 0.5, 0.7, 0.8]), 0.85) == (300.0, False)
    assert cost_to_reach(np.array([0.0, 50.0]), np.array([0.1, 0.2]), 0.9) == (50.0, False)
    with pytest.raises(ValueError, match="non-decreasing"):
        cost_to_reach(np.array([0.0, 100.0, 50.0]), np.array([0.1, 0.2, 0.3]), 0.9)
    with pytest.raises(ValueError, match="NaN"):
        cost_to_reach(np.array([0.0, 100.0]), np.array([0.1, np.nan]), 0.9)


def test_normalized_auc_hand_computed():
    x, a = np.array([0.0, 100.0, 200.0]), np.array([0.2, 0.6, 0.6])
    # trapezoids: 100·(0.2+0.6)/2 = 40, 100·0.6 = 60 → 100 / 200
    assert normalized_auc(x, a, 200.0) == pytest.approx(0.5)
    # up to 150: 40 + 50·0.6 = 70 → 70 / 150
    assert normalized_auc(x, a, 150.0) == pytest.approx(70.0 / 150.0)
    # up to 50: the curve at 50 is 0.4 → 50·(0.2 + 0.4)/2 = 15 → 0.3
    assert normalized_auc(x, a, 50.0) == pytest.approx(0.3)
    # beyond the last evaluation the curve holds: 40 + 60 + 60 → 160 / 300
    assert normalized_auc(x, a, 300.0) == pytest.approx(160.0 / 300.0)


def test_paired_cost_ratio_bounds():
    r = paired_cost_ratio(np.array([100.0, 150.0]), np.array([200.0, 250.0]), random_state=0, n_boot=200)
    assert r.estimate == pytest.approx(250.0 / 450.0) and r.bound == "" and r.n == 2
    assert r.low <= r.estimate <= r.high
    r = paired_cost_ratio(np.array([100.0, 300.0]), np.array([200.0, 250.0]), np.array([True, False]),
                          random_state=0, n_boot=200)
    assert r.bound == "≥" and r.reached_method == 1 and r.reached_baseline == 2
    r = paired_cost_ratio(np.array([100.0, 150.0]), np.array([200.0, 300.0]), None, np.array([True, False]),
                          random_state=0, n_boot=200)
    assert r.bound == "≤"
    r = paired_cost_ratio(np.array([300.0, 150.0]), np.array([200.0, 300.0]), np.array([False, True]),
                          np.array([True, False]), random_state=0, n_boot=200)
    assert r.bound == "?"
    assert str(paired_cost_ratio(np.array([50.0]), np.array([100.0]), random_state=0)) == "0.50×"


def test_captured_share():
    assert captured_share(0.7, 0.4) == pytest.approx(0.5)
    assert captured_share(1.0, 0.4) == pytest.approx(0.0)
    assert np.isnan(captured_share(0.7, 1.0))


def _curves():
    u = {0: Curve(X, np.array([0.2, 0.4, 0.6, 0.7]), X / 10, X * 5),
         1: Curve(X, np.array([0.2, 0.3, 0.5, 0.7]), X / 10, X * 5)}
    m = {0: Curve(X, np.array([0.2, 0.6, 0.7, 0.7]), X / 10, X * 3),
         1: Curve(X, np.array([0.2, 0.4, 0.8, 0.8]), X / 10, X * 3)}
    slow = {0: Curve(X, np.array([0.2, 0.3, 0.4, 0.5]), X / 10, None),       # never reaches 0.6
            1: Curve(np.array([0.0, 80.0, 160.0, 240.0]), np.array([0.2, 0.3, 0.5, 0.7]), X / 10, None)}
    return {"uniform": u, "fast": m, "slow": slow}


def test_efficiency_vs_baseline_hand_computed():
    eff = efficiency_vs_baseline(_curves(), fraction=0.8, n_boot=500, random_state=0)
    # targets: seed 0: 0.2 + 0.8·(0.7 − 0.2) = 0.6 → uniform at 200; seed 1: 0.6 → 250 (0.5 → 0.7).
    fast = eff["fast"]
    np.testing.assert_allclose(fast.target, [0.6, 0.6])
    # fast: seed 0 at 100 (0.6 exactly), seed 1: 100 + (0.2/0.4)·100 = 150 → (100 + 150) / (200 + 250)
    np.testing.assert_allclose(fast.rollouts_to_target, [100.0, 150.0])
    assert fast.rollouts.estimate == pytest.approx(250.0 / 450.0) and fast.rollouts.bound == ""
    assert fast.steps.estimate == pytest.approx(25.0 / 45.0)
    # tokens: 3 per rollout against 5 → (300 + 450) / (1000 + 1250)
    assert fast.tokens.estimate == pytest.approx(750.0 / 2250.0)
    # final accuracy: (0.7 − 0.7, 0.8 − 0.7) → mean +0.05
    assert fast.final_diff.estimate == pytest.approx(0.05)
    # AUC up to the common budget (240, slow's seed 1 ends there):
    #   uniform s0: 100·0.3 + 100·0.5 + 40·(0.6 + 0.64)/2 = 104.8; s1: 25 + 40 + 40·(0.5+0.58)/2 = 86.6
    #   fast s0: 40 + 65 + 40·0.7 = 133; s1: 30 + 60 + 32 = 122
    assert fast.auc_budget == 240.0
    assert fast.auc.estimate == pytest.approx((133 + 122) / (104.8 + 86.6))
    slow = eff["slow"]
    # slow seed 0 never reaches 0.6: censored at its own 300; seed 1: 160 + (0.1/0.2)·80 = 200
    np.testing.assert_allclose(slow.rollouts_to_target, [300.0, 200.0])
    np.testing.assert_array_equal(slow.reached, [False, True])
    assert slow.rollouts.estimate == pytest.approx(500.0 / 450.0) and slow.rollouts.bound == "≥"
    assert slow.tokens is None                 # no token counts in its runs


def test_efficiency_fixed_target_and_bad_baseline():
    eff = efficiency_vs_baseline(_curves(), target=0.5, n_boot=200, random_state=0)
    # uniform at 0.5: seed 0: 150, seed 1: 200; fast: 75, 100 + (0.1/0.4)·100 = 125 → 200 / 350
    assert eff["fast"].rollouts.estimate == pytest.approx(200.0 / 350.0)
    flat = {"uniform": {0: Curve(X, np.array([0.5, 0.5, 0.4, 0.5]))}, "m": {0: Curve(X, np.full(4, 0.6))}}
    with pytest.raises(ValueError, match="gained nothing"):
        efficiency_vs_baseline(flat)
    with pytest.raises(ValueError, match="baseline"):
        efficiency_vs_baseline({"m": {0: Curve(X, np.full(4, 0.6))}})


def _rec(label, seed, acc, rollouts):
    from rlpace.experiments import minimal_record
    r = minimal_record(run_id=f"{label}{seed}", label=label, seed=seed, final_acc={"a": acc[-1]})
    r["budget"] = {"steps": 30, "batch_size": None, "group_size": None, "eval_every": None}
    r["evals"] = {"step": [0, 10, 20, 30], "rollouts": rollouts, "acc_mean": acc}
    r["rollouts"] = rollouts[-1]
    return r


def test_report_censored_baseline_uses_its_own_budget():
    # uniform never reaches 0.6 in its 300 rollouts; "refill" reaches it at 600 but spends
    # 1200 in all (refills). Before the fix uniform's NaN became the largest rollout count of
    # any run (1200), giving refill a 2× "speed-up" although it spent 600 against 300.
    recs = []
    for s in range(3):
        recs.append(_rec("uniform", s, [0.4, 0.5, 0.55, 0.58], [0, 100, 200, 300]))
        recs.append(_rec("refill", s, [0.4, 0.5, 0.6, 0.7], [0, 300, 600, 1200]))
    a = analyze(recs, baseline="uniform", target=0.6, random_state=0, n_boot=500)
    (cp,) = a.comparisons
    rr = cp.rollouts_ratio
    assert rr.estimate == pytest.approx(300.0 / 600.0)      # mean(baseline at own 300) / mean(600)
    assert rr.censored and rr.reached_baseline == 0 and rr.reached_method == 3
    assert cp.steps_ratio.estimate == pytest.approx(30.0 / 20.0) and cp.steps_ratio.censored
    np.testing.assert_array_equal(a.target["own_rollouts"][a.matrix.index("uniform")], [300, 300, 300])


def test_analyze_reports_fraction_of_gain_efficiency():
    recs = []
    for s in range(2):
        recs.append(_rec("uniform", s, [0.2, 0.4, 0.6, 0.7], [0, 100, 200, 300]))
        recs.append(_rec("fast", s, [0.2, 0.6, 0.7, 0.7], [0, 100, 200, 300]))
    a = analyze(recs, baseline="uniform", random_state=0, n_boot=500)
    e = a.efficiency["fast"]
    assert a.gain_fraction == 0.8 and a.efficiency_note == ""
    np.testing.assert_allclose(e.target, [0.6, 0.6])
    assert e.rollouts.estimate == pytest.approx(100.0 / 200.0)
    assert e.steps.estimate == pytest.approx(10.0 / 20.0)


def test_efficiency_table_rows():
    from rlpace.evaluation import efficiency_table
    recs = []
    for s in range(2):
        recs.append(_rec("uniform", s, [0.2, 0.4, 0.6, 0.7], [0, 100, 200, 300]))
        recs.append(_rec("slow", s, [0.2, 0.3, 0.4, 0.5], [0, 100, 200, 300]))
    head, rows = efficiency_table(analyze(recs, baseline="uniform", random_state=0, n_boot=500))
    assert head[2].startswith("rollouts to 80% of uniform's gain")
    (row,) = rows
    # slow never reaches 0.6: censored at its own 300 against uniform's 200 → a lower bound 1.5
    assert row[0] == "slow" and row[2].startswith("≥1.50×") and row[5] == "0/2"


def test_headroom_rows_captured_share_against_best_oracle():
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import headroom
    u = {s: Curve(X, np.array([0.2, 0.4, 0.6, 0.7])) for s in (0, 1)}            # 80% gain at 200
    ob = {s: Curve(X, np.array([0.2, 0.6, 0.7, 0.8])) for s in (0, 1)}           # at 100 → 0.5
    op = {s: Curve(X, np.array([0.2, 0.5, 0.65, 0.7])) for s in (0, 1)}          # at 150 → 0.75
    m = {s: Curve(X, np.array([0.2, 0.45, 0.7, 0.7])) for s in (0, 1)}           # 100 + (0.15/0.25)·100 = 160 → 0.8
    rows = headroom.headroom_rows("t", {"uniform": u, "oracle_boundary": ob, "oracle_progress": op, "m": m},
                                  {k: 0.5 for k in ("uniform", "oracle_boundary", "oracle_progress", "m")},
                                  fraction=0.8, tail=1)
    by = {r["policy"]: r for r in rows}
    assert [r["policy"] for r in rows[:3]] == ["uniform", "oracle_boundary", "oracle_progress"]
    assert by["oracle_boundary"]["ratio"] == pytest.approx(0.5) and by["m"]["headroom"] == pytest.approx(0.5)
    # captured share = (1 − 0.8) / (1 − 0.5) against the best oracle
    assert by["m"]["ratio"] == pytest.approx(0.8) and by["m"]["captured"] == pytest.approx(0.4)
    assert by["m"]["final_diff"] == pytest.approx(0.0)
