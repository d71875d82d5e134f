"""Statistics of rlpace.evaluation against hand-computed values (no scipy in the expected
numbers: t quantiles are copied from printed tables)."""

import math

import numpy as np
import pytest

from rlpace import evaluation as ev

T975_DF3 = 3.182446305284263   # t_{0.975, 3}, from a t table
T975_DF1 = 12.706204736174706  # t_{0.975, 1}


# ---- paired differences and the t interval ---------------------------------------------------

def test_paired_t_interval_matches_hand_computation():
    method = np.array([0.50, 0.55, 0.60, 0.52])
    base = np.array([0.45, 0.50, 0.50, 0.50])
    # d = [0.05, 0.05, 0.10, 0.02]; mean 0.055; deviations -.005 -.005 .045 -.035
    # sum of squares 0.0033 -> var 0.0011 -> sd 0.033166 -> se 0.016583
    se = math.sqrt(0.0033 / 3) / 2.0
    r = ev.paired_t_interval(method, base)
    assert r.estimate == pytest.approx(0.055, abs=1e-12)
    assert r.se == pytest.approx(se, rel=1e-12)
    assert r.low == pytest.approx(0.055 - T975_DF3 * se, rel=1e-9)
    assert r.high == pytest.approx(0.055 + T975_DF3 * se, rel=1e-9)
    assert r.df == 3 and r.n == 4
    assert r.t == pytest.approx(0.055 / se)
    assert r.low <= r.estimate <= r.high
    assert r.excludes_zero and r.p_value < 0.05


def test_t_p_value_is_alpha_exactly_at_the_critical_t():
    # d = [c - 1, c + 1] has mean c and se = 1 (sd = sqrt(2), n = 2 -> se = 1). With
    # c = t_{0.975,1} the CI touches 0 and the two-sided p is 0.05.
    c = T975_DF1
    r = ev.paired_t_interval(np.array([c - 1.0, c + 1.0]), np.zeros(2))
    assert r.low == pytest.approx(0.0, abs=1e-9)
    assert r.p_value == pytest.approx(0.05, rel=1e-9)


def test_t_interval_degenerate_differences():
    r = ev.paired_t_interval(np.array([1.0, 2.0, 3.0]), np.array([0.5, 1.5, 2.5]))
    assert (r.estimate, r.low, r.high, r.p_value) == (0.5, 0.5, 0.5, 0.0)
    r0 = ev.paired_t_interval(np.array([1.0, 2.0]), np.array([1.0, 2.0]))
    assert (r0.estimate, r0.p_value) == (0.0, 1.0)


def test_missing_seeds_are_dropped_pairwise():
    d = ev.paired_differences(np.array([0.5, np.nan, 0.7]), np.array([0.4, 0.4, np.nan]))
    assert d.tolist() == pytest.approx([0.1])


def test_fewer_than_two_paired_seeds_is_a_clear_error():
    with pytest.raises(ValueError, match="at least 2 paired seeds.*--seeds"):
        ev.paired_t_interval(np.array([0.5, np.nan]), np.array([0.4, 0.4]))
    with pytest.raises(ValueError, match="at least 2 paired seeds"):
        ev.paired_bootstrap_interval(np.array([0.5]), np.array([0.4]), random_state=0)
    with pytest.raises(ValueError, match="aligned by seed"):
        ev.paired_differences(np.zeros(3), np.zeros(4))


# ---- bootstrap ----------------------------------------------------------------------------

def test_bootstrap_exact_quantiles_on_a_tiny_sample():
    # d = [0, 0, 3]: a resample mean is k with k ~ Binomial(3, 1/3):
    # P = 8/27, 12/27, 6/27, 1/27 for k = 0..3. CDF(2) = 26/27 = 0.963:
    # 95% CI -> quantiles 0.025 and 0.975 -> [0, 3];  90% CI -> 0.05, 0.95 -> [0, 2].
    x, y = np.array([0.0, 0.0, 3.0]), np.zeros(3)
    iv = ev.paired_bootstrap_interval(x, y, n_boot=20_000, random_state=1)
    assert (iv.estimate, iv.low, iv.high) == (1.0, 0.0, 3.0)
    iv90 = ev.paired_bootstrap_interval(x, y, confidence=0.90, n_boot=20_000, random_state=1)
    assert (iv90.low, iv90.high) == (0.0, 2.0)


def test_bootstrap_contains_estimate_and_is_reproducible():
    rng = np.random.default_rng(7)
    base = rng.normal(0.5, 0.05, size=12)
    method = base + rng.normal(0.01, 0.02, size=12)
    a = ev.paired_bootstrap_interval(method, base, random_state=123)
    b = ev.paired_bootstrap_interval(method, base, random_state=123)
    c = ev.paired_bootstrap_interval(method, base, random_state=124)
    assert a == b
    assert (a.low, a.high) != (c.low, c.high)
    assert a.low <= a.estimate <= a.high
    assert a.estimate == pytest.approx(float(np.mean(method - base)))
    # A Generator works too and advances (two draws differ).
    g = np.random.default_rng(123)
    assert ev.paired_bootstrap_interval(method, base, random_state=g) == a
    assert ev.paired_bootstrap_interval(method, base, random_state=g) != a


def test_bootstrap_interval_shrinks_towards_t_interval_on_normal_data():
    rng = np.random.default_rng(0)
    d = rng.normal(0.02, 0.01, size=200)
    t = ev.paired_t_interval(d, np.zeros_like(d))
    b = ev.paired_bootstrap_interval(d, np.zeros_like(d), random_state=0)
    assert b.low == pytest.approx(t.low, abs=3e-4) and b.high == pytest.approx(t.high, abs=3e-4)


def test_random_state_is_required():
    with pytest.raises(ValueError, match="random_state is None"):
        ev.paired_bootstrap_interval(np.zeros(3), np.zeros(3), random_state=None)


# ---- probability of improvement, ratios ---------------------------------------------------

def test_probability_of_improvement_hand_computed():
    # pairs: 2>1, 2=2 (half), 3>1, 3>2  -> (3 + 0.5) / 4
    assert ev.probability_of_improvement(np.array([2.0, 3.0]), np.array([1.0, 2.0])) == 0.875
    # per-benchmark average: benchmark 0 -> 1.0, benchmark 1 -> 0.0
    x = np.array([[1.0, 0.0], [1.0, 0.0]])
    y = np.array([[0.0, 1.0], [0.0, 1.0]])
    assert ev.probability_of_improvement(x, y) == 0.5
    iv = ev.poi_bootstrap_interval(np.array([2.0, 3.0, 4.0]), np.array([1.0, 1.0, 5.0]), random_state=0)
    # pairs: 2 wins of 3 against (1,1,5) for x=2,3; x=4 wins 2 -> 6/9
    assert iv.estimate == pytest.approx(6 / 9)
    assert iv.low <= iv.estimate <= iv.high


def test_poi_interval_resamples_pairs_hand_computed():
    # x = [0, 10], y = [-1, 9]: PoI = (1 + 0 + 1 + 1) / 4 = 0.75. A paired replicate holds one
    # seed twice (PoI 1; probability 1/2) or both seeds (PoI 0.75), so the CI is [0.75, 1].
    # Independent resampling (rliable's) would draw x = {0, 0} against y = {9, 9} (PoI 0) with
    # probability 1/16 > 2.5 % and put the lower bound at 0.
    iv = ev.poi_bootstrap_interval(np.array([0.0, 10.0]), np.array([-1.0, 9.0]), n_boot=2000,
                                   random_state=0)
    assert (iv.estimate, iv.low, iv.high) == (0.75, 0.75, 1.0)


def test_poi_interval_matches_an_independent_paired_loop():
    x = np.array([0.3, 0.5, 0.5, 0.9, 0.1])
    y = np.array([0.2, 0.6, 0.5, 0.4, 0.4])
    n_boot = 300
    idx = np.random.default_rng(7).integers(0, 5, size=(n_boot, 5))   # the draws seed 7 makes
    reps = []
    for row in idx:
        xs, ys = [x[i] for i in row], [y[i] for i in row]   # the same indices for both
        wins = 0.0
        for a in xs:
            for b in ys:
                wins += 1.0 if a > b else (0.5 if a == b else 0.0)
        reps.append(wins / 25)
    reps.sort()
    lo, hi = np.quantile(reps, [0.05, 0.95])
    iv = ev.poi_bootstrap_interval(x, y, confidence=0.9, n_boot=n_boot, random_state=7)
    # PoI by hand, each x against the five y (a tie counts 1/2):
    # x=0.3: > 0.2         -> 1      x=0.5: > 0.2, 0.4, 0.4, = 0.5 -> 3.5 (twice)
    # x=0.9: > all five    -> 5      x=0.1: none             -> 0     total 13 / 25
    assert iv.estimate == pytest.approx(13 / 25)
    assert (iv.low, iv.high) == (pytest.approx(lo), pytest.approx(hi))


def test_ratio_to_target_hand_computed_and_censoring():
    r = ev.ratio_to_target(np.array([50.0, 100.0]), np.array([100.0, 200.0]), budget=300, random_state=0)
    assert r.estimate == 2.0 and not r.censored and r.reached_method == 2
    # both resampled seeds keep ratio 2 (each seed alone has ratio 2) -> CI [2, 2]
    assert (r.low, r.high) == (2.0, 2.0)
    c = ev.ratio_to_target(np.array([np.nan, 100.0]), np.array([100.0, 200.0]), budget=300,
                           random_state=0)
    # method mean (300 + 100) / 2 = 200, baseline 150 -> 0.75, flagged censored
    assert c.estimate == pytest.approx(0.75) and c.censored and c.reached_method == 1


# ---- summaries ----------------------------------------------------------------------------

def test_domain_balanced_summary_is_mean_of_domain_means():
    w = ev.domain_balanced_weights(["math", "math", "logic"])
    scores = np.array([[0.2, 0.4, 0.9]])
    # math mean 0.3, logic 0.9 -> 0.6 ; the plain benchmark mean would be 0.5
    assert ev.summarize(scores, w).tolist() == pytest.approx([0.6])
    assert ev.summarize(scores, np.full(3, 1 / 3)).tolist() == pytest.approx([0.5])
    assert ev.summarize(scores, ev.subset_weights(["m1", "m2", "l"], ["m2", "l"])).tolist() == \
        pytest.approx([0.65])
    assert ev.summary_weights(["a", "b", "c"], {"a": 1, "c": 3}).tolist() == [0.25, 0.0, 0.75]


def test_summary_of_a_run_missing_a_weighted_benchmark_is_nan():
    scores = np.array([[0.2, np.nan], [0.4, 0.6]])
    out = ev.summarize(scores, np.array([0.5, 0.5]))
    assert np.isnan(out[0]) and out[1] == pytest.approx(0.5)
    # a zero-weight benchmark may be missing
    assert ev.summarize(scores, np.array([1.0, 0.0])).tolist() == pytest.approx([0.2, 0.4])


def test_benchmark_means():
    x = np.array([[[0.1, 0.2], [0.3, np.nan]], [[0.5, 0.5], [0.7, 0.9]]])   # [M=2, S=2, B=2]
    np.testing.assert_allclose(ev.benchmark_means(x), [[0.2, 0.2], [0.6, 0.7]])


def test_unknown_benchmark_in_summary_is_an_error():
    with pytest.raises(ValueError, match="unknown benchmark"):
        ev.subset_weights(["a", "b"], ["c"])
    with pytest.raises(ValueError, match="NAME=bench1"):
        ev.parse_summary("nonsense", ["a"])


# ---- rankings -----------------------------------------------------------------------------

def test_reversed_ranking_gives_minus_one():
    a = np.array([0.1, 0.2, 0.3, 0.4, 0.5])
    r = ev.ranking_sensitivity(a, a[::-1].copy())
    assert r.spearman == -1.0 and r.kendall == -1.0
    assert r.ranks_a.tolist() == [5.0, 4.0, 3.0, 2.0, 1.0]
    same = ev.ranking_sensitivity(a, a * 2)
    assert same.spearman == 1.0 and same.kendall == 1.0


def test_rank_correlations_hand_computed():
    x, y = np.array([1.0, 2.0, 3.0, 4.0]), np.array([1.0, 3.0, 2.0, 4.0])
    # Spearman: Σd² = 2 -> 1 - 6·2/(4·15) = 0.8 ; Kendall: 5 concordant, 1 discordant of 6
    assert ev.spearman_rho(x, y) == pytest.approx(0.8)
    assert ev.kendall_tau(x, y) == pytest.approx(4 / 6)
    assert ev.rankdata(np.array([10.0, 30.0, 20.0, 20.0])).tolist() == [1.0, 4.0, 2.5, 2.5]


def test_rank_correlations_agree_with_scipy_with_ties():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(3)
    for _ in range(20):
        x = rng.integers(0, 5, size=9).astype(float)
        y = rng.integers(0, 5, size=9).astype(float)
        if np.ptp(x) == 0 or np.ptp(y) == 0:
            continue
        assert ev.spearman_rho(x, y) == pytest.approx(stats.spearmanr(x, y).statistic, abs=1e-12)
        assert ev.kendall_tau(x, y) == pytest.approx(stats.kendalltau(x, y).statistic, abs=1e-12)


# ---- multiple comparisons ---------------------------------------------------------------------

def test_holm_adjust_hand_computed():
    # sorted 0.01·3 = 0.03; 0.03·2 = 0.06; 0.04·1 = 0.04 -> running max 0.06
    assert ev.holm_adjust(np.array([0.01, 0.04, 0.03])).tolist() == pytest.approx([0.03, 0.06, 0.06])
    assert ev.holm_adjust(np.array([0.5, 0.6])).tolist() == pytest.approx([1.0, 1.0])
    assert ev.holm_adjust(np.array([0.02])).tolist() == [0.02]
    note = ev.multiple_comparison_note(12, 2, 0)
    assert "12 policies" in note and "0.6" in note and "Holm" in note


# ---- curves ---------------------------------------------------------------------------------

def test_t_band_hand_computed():
    vals = np.array([[0.0, 1.0, 5.0], [2.0, 1.0, np.nan]])
    mean, lo, hi = ev.t_band(vals)
    assert mean.tolist() == [1.0, 1.0, 5.0]
    # column 0: sd = sqrt(2), se = 1 -> ± t_{.975,1}; column 1: sd 0; column 2: one value
    assert hi[0] == pytest.approx(1.0 + T975_DF1) and lo[0] == pytest.approx(1.0 - T975_DF1)
    assert (lo[1], hi[1], lo[2], hi[2]) == (1.0, 1.0, 5.0, 5.0)


def test_importing_the_statistics_does_not_import_scipy_or_matplotlib():
    import subprocess
    import sys
    code = ("import sys, rlpace.evaluation, rlpace.experiments; "
            "print(sorted(m for m in ('scipy', 'matplotlib', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
