"""Statistics for policy comparisons: pure functions over arrays, explicit random state.

Following rliable (Agarwal et al. 2021, `rliable/library.py`; STYLE.md §8): every function
takes arrays and returns numbers or NamedTuples, nothing reads files or draws; resampling
takes a `random_state` (int seed or `np.random.Generator`) so results are reproducible.

The evaluation protocol is DataFlex-RL's (arXiv 2609.06107,
"Statistics"): matched seeds, per-seed *paired* differences against uniform GRPO, a paired
95% CI on the domain-balanced average with the decision bar "does the CI exclude 0?", and
a check of the method ranking under an alternative benchmark summary (they found
ρ = −0.33 between a math-heavy and the domain-balanced summary). DataFlex does not say
whether its CI is t or bootstrap [not found], so we give both.

Shapes: `scores` arrays are float64[S, B] (seeds × benchmarks) for one method or
float64[M, S, B] for M methods; NaN marks a missing run or benchmark.

scipy is imported lazily (t quantiles) so that importing this module stays cheap.
"""

from __future__ import annotations

from ..errors import InputError
import math
from typing import Mapping, NamedTuple, Sequence

import numpy as np

__all__ = [
    "Interval", "TTest", "RatioResult", "RankingSensitivity",
    "as_rng", "benchmark_means", "summary_weights", "domain_balanced_weights", "subset_weights",
    "summarize", "paired_differences", "paired_t_interval", "paired_bootstrap_interval",
    "probability_of_improvement", "poi_bootstrap_interval", "ratio_to_target", "rankdata",
    "method_ranks", "spearman_rho", "kendall_tau", "ranking_sensitivity", "holm_adjust",
    "multiple_comparison_note", "t_band",
]


class Interval(NamedTuple):
    """A point estimate with a two-sided confidence interval."""

    estimate: float
    low: float
    high: float
    confidence: float
    method: str          # "t" | "bootstrap"

    @property
    def excludes_zero(self) -> bool:
        return bool(self.low > 0 or self.high < 0)


class TTest(NamedTuple):
    """Paired t interval and two-sided test of mean difference = 0."""

    estimate: float      # mean of the paired differences
    low: float
    high: float
    confidence: float
    se: float            # sd(d, ddof=1) / sqrt(n)
    df: int              # n − 1
    t: float             # estimate / se (±inf when se = 0 and estimate ≠ 0)
    p_value: float       # two-sided
    n: int

    @property
    def excludes_zero(self) -> bool:
        return bool(self.low > 0 or self.high < 0)

    def interval(self) -> Interval:
        return Interval(self.estimate, self.low, self.high, self.confidence, "t")


class RatioResult(NamedTuple):
    """Speed-up of a method over the baseline in steps (or rollouts) to a target."""

    estimate: float      # mean(baseline) / mean(method): > 1 means the method is faster
    low: float           # bootstrap CI over paired seeds (NaN if not computable)
    high: float
    confidence: float
    n: int               # paired seeds used
    reached_method: int  # seeds where the method reached the target
    reached_baseline: int
    censored: bool       # some run did not reach the target (value set to the budget)


class RankingSensitivity(NamedTuple):
    """How a method ranking changes between two summaries (DataFlex-RL's ρ)."""

    ranks_a: np.ndarray  # float64[M] rank under summary a, 1 = best (ties averaged)
    ranks_b: np.ndarray  # float64[M]
    spearman: float
    kendall: float


# ---- basics ---------------------------------------------------------------------------------

def as_rng(random_state: int | np.random.Generator | None) -> np.random.Generator:
    """A Generator from a seed or a Generator. None is refused: results must be
    reproducible, so pass a seed."""
    if isinstance(random_state, np.random.Generator):
        return random_state
    if random_state is None:
        raise InputError("random_state is None; pass an int seed (e.g. random_state=0) or a "
                         "np.random.Generator so the bootstrap is reproducible.")
    if isinstance(random_state, (bool, float)) or not isinstance(random_state, (int, np.integer)):
        raise InputError(f"random_state must be an int seed or a np.random.Generator; got "
                         f"{random_state!r}.")
    return np.random.default_rng(int(random_state))


def _check_confidence(confidence: float) -> float:
    c = float(confidence)
    if not 0.0 < c < 1.0:
        raise InputError(f"confidence must be in (0, 1), e.g. 0.95; got {confidence!r}.")
    return c


def benchmark_means(scores: np.ndarray) -> np.ndarray:
    """Per-benchmark mean over seeds, ignoring missing (NaN) runs.

    Args:
        scores: float[S, B] or float[M, S, B].

    Returns:
        float[B] or float[M, B]; NaN where a benchmark has no run.

    >>> benchmark_means(np.array([[0.2, 0.4], [0.4, np.nan]])).tolist()
    [0.30000000000000004, 0.4]
    """
    x = np.asarray(scores, dtype=np.float64)
    if x.ndim < 2:
        raise InputError(f"scores must be [S, B] or [M, S, B]; got shape {x.shape}.")
    cnt = np.sum(~np.isnan(x), axis=-2)
    tot = np.nansum(x, axis=-2)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(cnt > 0, tot / np.maximum(cnt, 1), np.nan)


# ---- summaries ------------------------------------------------------------------------------

def domain_balanced_weights(benchmark_domains: Sequence[str]) -> np.ndarray:
    """Weights w[B] such that w·x is the mean over domains of the per-domain benchmark means.

    DataFlex-RL's primary metric (arXiv 2609.06107): with D domains and n_d benchmarks in domain d,
    w_b = 1 / (D · n_{d(b)}).

    >>> domain_balanced_weights(["math", "math", "logic"]).tolist()
    [0.25, 0.25, 0.5]
    """
    doms = [str(d) for d in benchmark_domains]
    if not doms:
        raise InputError("benchmark_domains is empty; give one domain per benchmark.")
    uniq = sorted(set(doms))
    counts = {d: doms.count(d) for d in uniq}
    return np.array([1.0 / (len(uniq) * counts[d]) for d in doms])


def subset_weights(benchmarks: Sequence[str], subset: Sequence[str]) -> np.ndarray:
    """Equal weights on `subset` (e.g. DataFlex's math-heavy 6-benchmark summary), 0 elsewhere.

    >>> subset_weights(["a", "b", "c"], ["a", "c"]).tolist()
    [0.5, 0.0, 0.5]
    """
    bench = [str(b) for b in benchmarks]
    unknown = sorted(set(map(str, subset)) - set(bench))
    if unknown:
        raise InputError(f"summary subset names unknown benchmark(s) {unknown}; valid: {bench}.")
    if not subset:
        raise InputError("summary subset is empty; name at least one benchmark.")
    chosen = set(map(str, subset))
    w = np.array([1.0 if b in chosen else 0.0 for b in bench])
    return w / w.sum()


def summary_weights(benchmarks: Sequence[str], weights: Mapping[str, float]) -> np.ndarray:
    """User weights {benchmark: w} as a normalised float[B] vector (missing names get 0).

    >>> summary_weights(["a", "b"], {"a": 3, "b": 1}).tolist()
    [0.75, 0.25]
    """
    bench = [str(b) for b in benchmarks]
    unknown = sorted(set(map(str, weights)) - set(bench))
    if unknown:
        raise InputError(f"summary weights name unknown benchmark(s) {unknown}; valid: {bench}.")
    w = np.array([float(weights.get(b, 0.0)) for b in bench])
    if (w < 0).any() or not np.isfinite(w).all() or w.sum() <= 0:
        raise InputError(f"summary weights must be finite, ≥ 0 and not all 0; got {dict(weights)}.")
    return w / w.sum()


def summarize(scores: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Weighted summary over the last (benchmark) axis: Σ_b w_b x_b / Σ_b w_b.

    A run missing a benchmark with non-zero weight gets NaN (it is not comparable), never a
    silently re-weighted value.

    >>> summarize(np.array([[0.2, 0.6], [0.4, 0.8]]), np.array([0.5, 0.5])).tolist()
    [0.4, 0.6000000000000001]
    """
    x = np.asarray(scores, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or x.shape[-1] != w.shape[0]:
        raise InputError(f"weights have shape {w.shape} but scores have {x.shape[-1]} benchmarks "
                         f"(last axis); give one weight per benchmark.")
    if (w < 0).any() or w.sum() <= 0:
        raise InputError("summary weights must be ≥ 0 and not all 0.")
    used = w > 0
    out = np.einsum("...b,b->...", np.where(np.isnan(x), 0.0, x), w) / w.sum()
    return np.where(np.isnan(x[..., used]).any(axis=-1), np.nan, out)


# ---- paired comparisons ---------------------------------------------------------------------

def paired_differences(method: np.ndarray, baseline: np.ndarray) -> np.ndarray:
    """d_s = method_s − baseline_s over seeds where both are present (NaN pairs dropped).

    Args:
        method, baseline: float[S] one summary score per seed, aligned by seed.

    >>> paired_differences(np.array([0.5, 0.7, np.nan]), np.array([0.4, 0.4, 0.4])).round(6).tolist()
    [0.1, 0.3]
    """
    x, y = _aligned_pair(method, baseline, "paired_differences")
    ok = ~(np.isnan(x) | np.isnan(y))
    return x[ok] - y[ok]


def _aligned_pair(method, baseline, who: str) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) float64[S] per-seed scores of the method and the baseline, checked to be 1-D and
    aligned by seed (the precondition of every paired statistic here)."""
    x = np.asarray(method, dtype=np.float64)
    y = np.asarray(baseline, dtype=np.float64)
    if x.ndim != 1 or x.shape != y.shape:
        raise InputError(f"{who} needs two 1-D arrays aligned by seed; got shapes {x.shape} and "
                         f"{y.shape}. Pair runs by seed first.")
    return x, y


def _need_pairs(d: np.ndarray, what: str) -> None:
    if d.shape[0] < 2:
        raise InputError(f"{what} needs at least 2 paired seeds (a seed run by both the method and "
                         f"the baseline); got {d.shape[0]}. Run more seeds (rlpace compare --seeds 8).")


def _scipy_stats():
    try:
        from scipy import stats  # lazy: keep `import rlpace.evaluation` light
    except ImportError as e:  # pragma: no cover - scipy comes with the report/prepare extras
        raise ImportError("t intervals need scipy for the t distribution: pip install scipy") from e
    return stats


def _t_quantile(q: float, df: int) -> float:
    return float(_scipy_stats().t.ppf(q, df))


def _t_sf(t: float, df: int) -> float:
    return float(_scipy_stats().t.sf(t, df))


def paired_t_interval(method: np.ndarray, baseline: np.ndarray, confidence: float = 0.95) -> TTest:
    """Paired t interval for the mean difference, and the two-sided p-value of "no difference".

    With d_s = method_s − baseline_s (s = 1..n paired seeds), d̄ = mean(d),
    se = sd(d, ddof=1)/√n:   CI = d̄ ± t_{(1+c)/2, n−1} · se,   t = d̄/se,
    p = 2·P(T_{n−1} > |t|). When se = 0 the interval is [d̄, d̄] and p is 0 (d̄ ≠ 0) or 1.

    Raises:
        ValueError: fewer than 2 paired seeds, or shapes that do not align.

    Example:
        >>> r = paired_t_interval(np.array([1.0, 2.0, 3.0]), np.array([0.0, 0.0, 0.0]))
        >>> round(r.estimate, 3), round(r.low, 3), round(r.high, 3)   # 2 ± 4.303·(1/√3)
        (2.0, -0.484, 4.484)
    """
    c = _check_confidence(confidence)
    d = paired_differences(method, baseline)
    _need_pairs(d, "a paired t interval")
    n = d.shape[0]
    mean = float(d.mean())
    se = float(d.std(ddof=1) / math.sqrt(n))
    df = n - 1
    if se == 0.0:
        t = 0.0 if mean == 0.0 else math.copysign(math.inf, mean)
        p = 1.0 if mean == 0.0 else 0.0
        return TTest(mean, mean, mean, c, 0.0, df, t, p, n)
    half = _t_quantile(0.5 + c / 2.0, df) * se
    t = mean / se
    p = min(1.0, 2.0 * _t_sf(abs(t), df))
    return TTest(mean, mean - half, mean + half, c, se, df, t, p, n)


def _resample_idx(rng: np.random.Generator, n: int, n_boot: int) -> np.ndarray:
    if isinstance(n_boot, bool) or not isinstance(n_boot, (int, np.integer)) or n_boot < 100:
        raise InputError(f"n_boot must be an int ≥ 100 (10 000 is typical); got {n_boot!r}.")
    return rng.integers(0, n, size=(int(n_boot), n))                      # [n_boot, n]


def paired_bootstrap_interval(method: np.ndarray, baseline: np.ndarray, *, confidence: float = 0.95,
                              n_boot: int = 10_000,
                              random_state: int | np.random.Generator) -> Interval:
    """Paired percentile bootstrap CI of the mean difference.

    Seeds are resampled with replacement *as pairs* (the same seed index for the method and
    the baseline, which keeps the pairing): `d*_b = mean(d[idx_b])`, CI = the
    ((1−c)/2, (1+c)/2) quantiles of `{d*_b}`. Estimate = mean(d).

    Args:
        method, baseline: float[S] summary score per seed.
        confidence: interval level (0.95).
        n_boot: bootstrap resamples.
        random_state: int seed or Generator (required: results are reproducible).

    >>> iv = paired_bootstrap_interval(np.array([0.5, 0.6, 0.7]), np.array([0.4, 0.4, 0.4]),
    ...                                random_state=0)
    >>> round(iv.estimate, 3), iv.low <= iv.estimate <= iv.high
    (0.2, True)
    """
    c = _check_confidence(confidence)
    rng = as_rng(random_state)
    d = paired_differences(method, baseline)
    _need_pairs(d, "a paired bootstrap interval")
    means = d[_resample_idx(rng, d.shape[0], n_boot)].mean(axis=1)       # [n_boot]
    lo, hi = np.quantile(means, [(1.0 - c) / 2.0, (1.0 + c) / 2.0])
    return Interval(float(d.mean()), float(lo), float(hi), c, "bootstrap")


def probability_of_improvement(method: np.ndarray, baseline: np.ndarray) -> float:
    """P(X > Y) + ½·P(X = Y) for X a method run and Y a baseline run (rliable's
    `probability_of_improvement`, the normalised Mann–Whitney U), averaged over benchmarks.

    Args:
        method: float[S] or float[S, B]; baseline: float[S'] or float[S', B]. All pairs of
            runs are compared (this statistic is unpaired); NaN runs are left out.

    >>> probability_of_improvement(np.array([2.0, 3.0]), np.array([1.0, 2.0]))
    0.875
    """
    x = np.asarray(method, dtype=np.float64)
    y = np.asarray(baseline, dtype=np.float64)
    x = x[:, None] if x.ndim == 1 else x
    y = y[:, None] if y.ndim == 1 else y
    if x.ndim != 2 or y.ndim != 2 or x.shape[1] != y.shape[1]:
        raise InputError(f"probability_of_improvement needs [S, B] and [S', B] with the same B; got "
                         f"{np.shape(method)} and {np.shape(baseline)}.")
    vals = []
    for b in range(x.shape[1]):
        xb = x[:, b][~np.isnan(x[:, b])]
        yb = y[:, b][~np.isnan(y[:, b])]
        if xb.size == 0 or yb.size == 0:
            continue
        gt = (xb[:, None] > yb[None, :]).mean()
        eq = (xb[:, None] == yb[None, :]).mean()
        vals.append(gt + 0.5 * eq)
    if not vals:
        raise InputError("probability_of_improvement: no benchmark has runs of both the method and "
                         "the baseline.")
    return float(np.mean(vals))


def poi_bootstrap_interval(method: np.ndarray, baseline: np.ndarray, *, confidence: float = 0.95,
                           n_boot: int = 2_000,
                           random_state: int | np.random.Generator) -> Interval:
    """Bootstrap CI of `probability_of_improvement` for 1-D summary scores, resampling *paired*
    seeds: replicate b draws one index vector idx_b (n seeds with replacement) and uses it for
    both the method and the baseline, `PoI*_b = PoI(x[idx_b], y[idx_b])`; the CI is the
    percentile interval of the `PoI*_b`. Seeds where either is NaN are dropped first.

    Why paired, unlike rliable: rliable's `get_interval_estimates` resamples each algorithm's
    runs independently, because its runs are unrelated. Ours are matched (seed s of the
    method and of the baseline share tasks, base policy and random streams), and every other
    interval of the report resamples them as pairs (`paired_bootstrap_interval`), so the PoI
    interval does too. It is therefore narrower than rliable's when pairs are correlated.

    Hand-checkable: x = [0, 10], y = [−1, 9] has PoI 3/4; a paired replicate is either one
    seed twice (PoI 1, probability ½) or both seeds (PoI 3/4), so the 95 % CI is [0.75, 1];
    independent resampling would reach 0 (x = {0, 0} against y = {9, 9}, probability 1/16).

    >>> iv = poi_bootstrap_interval(np.array([2.0, 3.0, 4.0]), np.array([1.0, 1.0, 1.0]), random_state=0)
    >>> (iv.estimate, iv.low, iv.high)
    (1.0, 1.0, 1.0)
    """
    c = _check_confidence(confidence)
    rng = as_rng(random_state)
    x, y = _aligned_pair(method, baseline, "poi_bootstrap_interval")
    ok = ~(np.isnan(x) | np.isnan(y))
    x, y = x[ok], y[ok]
    _need_pairs(x, "a probability-of-improvement interval")
    idx = _resample_idx(rng, x.shape[0], n_boot)                          # [n_boot, n]
    xb, yb = x[idx], y[idx]                  # [n_boot, n]; the same idx: pairs stay pairs
    cmp = (xb[:, :, None] > yb[:, None, :]).mean(axis=(1, 2)) \
        + 0.5 * (xb[:, :, None] == yb[:, None, :]).mean(axis=(1, 2))      # [n_boot]
    lo, hi = np.quantile(cmp, [(1.0 - c) / 2.0, (1.0 + c) / 2.0])
    return Interval(probability_of_improvement(x, y), float(lo), float(hi), c, "bootstrap")


def ratio_to_target(method: np.ndarray, baseline: np.ndarray, *, budget: float,
                    confidence: float = 0.95, n_boot: int = 10_000,
                    random_state: int | np.random.Generator) -> RatioResult:
    """Speed-up to a target: mean(baseline) / mean(method) of steps (or rollouts) to target,
    with a paired bootstrap CI (seeds resampled as pairs).

    Papers report such ratios from single runs (1.5–3×); over matched seeds we report the
    ratio of means and its CI. A run that never reached the target has NaN; it is set to
    `budget` (the true value is larger), so the ratio is then a bound, flagged `censored`:
    a method that missed the target makes the speed-up an over-estimate, a baseline that
    missed makes it an under-estimate.

    Args:
        method, baseline: float[S] steps (or rollouts) to target per seed, NaN = not reached.
        budget: steps (or rollouts) of the whole run, substituted for NaN.

    Returns:
        `RatioResult`; estimate > 1 means the method reaches the target sooner.

    >>> r = ratio_to_target(np.array([50.0, 100.0]), np.array([100.0, 200.0]), budget=300, random_state=0)
    >>> r.estimate, r.censored
    (2.0, False)
    """
    c = _check_confidence(confidence)
    rng = as_rng(random_state)
    x, y = _aligned_pair(method, baseline, "ratio_to_target")
    if not np.isfinite(budget) or budget <= 0:
        raise InputError(f"budget must be a positive number (steps or rollouts of a run); got {budget}.")
    n = x.shape[0]
    rm, rb = int(np.sum(~np.isnan(x))), int(np.sum(~np.isnan(y)))
    censored = rm < n or rb < n
    xf, yf = np.where(np.isnan(x), budget, x), np.where(np.isnan(y), budget, y)
    if (xf <= 0).any():
        raise InputError("steps/rollouts to target must be > 0 for the method (a run that starts at "
                         "the target gives no ratio); raise the target.")
    est = float(yf.mean() / xf.mean())
    if n < 2:
        return RatioResult(est, math.nan, math.nan, c, n, rm, rb, censored)
    idx = _resample_idx(rng, n, n_boot)
    ratios = yf[idx].mean(axis=1) / xf[idx].mean(axis=1)                  # [n_boot]
    lo, hi = np.quantile(ratios, [(1.0 - c) / 2.0, (1.0 + c) / 2.0])
    return RatioResult(est, float(lo), float(hi), c, n, rm, rb, censored)


# ---- rankings -------------------------------------------------------------------------------

def rankdata(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n of x ascending, ties get their average rank (scipy's 'average').

    >>> rankdata(np.array([10.0, 30.0, 20.0, 20.0])).tolist()
    [1.0, 4.0, 2.5, 2.5]
    """
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 1:
        raise InputError(f"rankdata needs a 1-D array; got shape {a.shape}.")
    if np.isnan(a).any():
        raise InputError("cannot rank NaN values; drop methods with missing summaries first.")
    order = np.argsort(a, kind="mergesort")
    ranks = np.empty(a.shape[0])
    ranks[order] = np.arange(1, a.shape[0] + 1, dtype=np.float64)
    # average tied ranks: group equal values
    vals, inv = np.unique(a, return_inverse=True)
    sums = np.bincount(inv, weights=ranks)
    cnts = np.bincount(inv)
    return (sums / cnts)[inv]


def method_ranks(summary: np.ndarray) -> np.ndarray:
    """Rank of each method by a summary score, 1 = best (highest); ties averaged.

    >>> method_ranks(np.array([0.3, 0.5, 0.4])).tolist()
    [3.0, 1.0, 2.0]
    """
    return rankdata(-np.asarray(summary, dtype=np.float64))


def spearman_rho(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's ρ: Pearson correlation of the average ranks (tie-corrected). NaN when a
    ranking is constant.

    >>> spearman_rho(np.array([1.0, 2.0, 3.0]), np.array([3.0, 2.0, 1.0]))
    -1.0
    """
    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1 or a.shape[0] < 2:
        raise InputError(f"spearman_rho needs two 1-D arrays of one length ≥ 2; got {a.shape}, {b.shape}.")
    ra, rb = rankdata(a) - (a.shape[0] + 1) / 2.0, rankdata(b) - (b.shape[0] + 1) / 2.0
    den = math.sqrt(float(ra @ ra) * float(rb @ rb))
    return float(ra @ rb / den) if den > 0 else math.nan


def kendall_tau(x: np.ndarray, y: np.ndarray) -> float:
    """Kendall's τ_b = (C − D) / sqrt((n0 − n1)(n0 − n2)) over all pairs (ties handled as in
    scipy's default). O(n²) memory: fine for tens of methods. NaN when a ranking is constant.

    >>> kendall_tau(np.array([1.0, 2.0, 3.0]), np.array([3.0, 2.0, 1.0]))
    -1.0
    """
    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1 or a.shape[0] < 2:
        raise InputError(f"kendall_tau needs two 1-D arrays of one length ≥ 2; got {a.shape}, {b.shape}.")
    iu = np.triu_indices(a.shape[0], k=1)
    sa = np.sign(a[:, None] - a[None, :])[iu]                            # [n(n-1)/2]
    sb = np.sign(b[:, None] - b[None, :])[iu]
    s = float(np.sum(sa * sb))
    den = math.sqrt(float(np.sum(sa != 0)) * float(np.sum(sb != 0)))
    return s / den if den > 0 else math.nan


def ranking_sensitivity(summary_a: np.ndarray, summary_b: np.ndarray) -> RankingSensitivity:
    """Compare method rankings under two summaries (DataFlex-RL, arXiv 2609.06107: ρ = −0.33 between a
    math-heavy 6-benchmark summary and the 12-benchmark domain-balanced one).

    Args:
        summary_a, summary_b: float[M] each method's mean score under summary a and b.

    >>> r = ranking_sensitivity(np.array([0.1, 0.2, 0.3]), np.array([0.3, 0.2, 0.1]))
    >>> r.ranks_a.tolist(), r.spearman, r.kendall
    ([3.0, 2.0, 1.0], -1.0, -1.0)
    """
    a, b = np.asarray(summary_a, dtype=np.float64), np.asarray(summary_b, dtype=np.float64)
    return RankingSensitivity(method_ranks(a), method_ranks(b), spearman_rho(a, b), kendall_tau(a, b))


# ---- multiple comparisons -------------------------------------------------------------------

def holm_adjust(p_values: np.ndarray) -> np.ndarray:
    """Holm–Bonferroni adjusted p-values (step-down; controls the family-wise error rate).

    Sort p ascending: p_(1) ≤ … ≤ p_(m). Adjusted p_(i) = max_{j ≤ i} min(1, (m − j + 1)·p_(j)).
    Reject at level α exactly the hypotheses with adjusted p ≤ α.

    >>> holm_adjust(np.array([0.01, 0.04, 0.03])).round(4).tolist()
    [0.03, 0.06, 0.06]
    """
    p = np.asarray(p_values, dtype=np.float64)
    if p.ndim != 1:
        raise InputError(f"p_values must be 1-D; got shape {p.shape}.")
    if np.isnan(p).any() or (p < 0).any() or (p > 1).any():
        raise InputError("p_values must be in [0, 1] without NaN.")
    m = p.shape[0]
    order = np.argsort(p, kind="mergesort")
    adj_sorted = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    out = np.empty(m)
    out[order] = adj_sorted
    return out


def multiple_comparison_note(n_comparisons: int, n_significant_raw: int, n_significant_holm: int,
                             alpha: float = 0.05) -> str:
    """One paragraph for the report on the multiple-comparison problem.

    >>> multiple_comparison_note(12, 1, 0)[:60]
    '12 policies were compared with the baseline. At α = 0.05 eac'
    """
    if n_comparisons <= 1:
        return (f"{n_comparisons} comparison with the baseline: no multiple-comparison "
                f"correction needed.")
    expected = n_comparisons * alpha
    return (f"{n_comparisons} policies were compared with the baseline. At α = {alpha:g} each "
            f"unadjusted test has a {alpha:.0%} false-positive rate, so about {expected:.1f} "
            f"'significant' result(s) are expected by chance alone even if no policy helps. "
            f"Unadjusted paired t tests: {n_significant_raw} of {n_comparisons} with p ≤ {alpha:g}; "
            f"after Holm–Bonferroni adjustment (family-wise error ≤ {alpha:g}): "
            f"{n_significant_holm} of {n_comparisons}. The {1 - alpha:.0%} intervals in the table are "
            f"per-comparison (unadjusted).")


# ---- curves ---------------------------------------------------------------------------------

def t_band(values: np.ndarray, confidence: float = 0.95) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean over seeds and a t-interval band at each time point (for learning curves).

    Args:
        values: float[S, T]; NaN entries are left out per time point.

    Returns:
        (mean[T], low[T], high[T]); with fewer than 2 values at a point the band collapses
        to the mean.

    >>> m, lo, hi = t_band(np.array([[0.0, 1.0], [2.0, 1.0]]))
    >>> m.tolist(), round(float(hi[0]), 3)    # 1 + 12.706 · 1
    ([1.0, 1.0], 13.706)
    """
    c = _check_confidence(confidence)
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 2:
        raise InputError(f"values must be [S, T]; got shape {v.shape}.")
    n = np.sum(~np.isnan(v), axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(n > 0, np.nansum(v, axis=0) / np.maximum(n, 1), np.nan)
        dev = np.where(np.isnan(v), 0.0, v - mean)
        sd = np.sqrt(np.sum(dev ** 2, axis=0) / np.maximum(n - 1, 1))
    half = np.zeros_like(mean)
    for k in np.unique(n[n >= 2]):
        half[n == k] = _t_quantile(0.5 + c / 2.0, int(k) - 1) * sd[n == k] / math.sqrt(k)
    return mean, mean - half, mean + half
