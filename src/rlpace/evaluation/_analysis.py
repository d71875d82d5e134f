"""The whole comparison as data: `analyze(records, baseline=...)` -> `Analysis`.

`analyze` arranges records into a score matrix (`_tables`), builds the summaries, and calls
the pure statistics of `_stats` for each method against the baseline. The report and the
plots only read the resulting `Analysis`; nothing here draws.
"""

from __future__ import annotations

from ..errors import InputError
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from . import _stats as st
from ._efficiency import efficiency_vs_baseline
from ._tables import (ScoreMatrix, domain_prob_series, efficiency_curves, learning_curves, score_matrix,
                      to_target_arrays)

__all__ = ["Comparison", "Analysis", "analyze", "default_summaries", "parse_summary", "efficiency_table"]

PRIMARY = "domain_balanced"


@dataclass(frozen=True)
class Comparison:
    """One method against the baseline on the primary summary.

    Attributes:
        label: the method.
        n_pairs: seeds that both the method and the baseline completed.
        mean, baseline_mean: mean primary summary over those paired seeds.
        t: paired t interval/test (None when n_pairs < 2).
        boot: paired bootstrap interval (None when n_pairs < 2).
        poi: probability of improvement with a bootstrap interval (None when n_pairs < 2).
        p_holm: Holm–Bonferroni adjusted p-value over all comparisons.
        steps_ratio, rollouts_ratio: speed-up to the target (None without a target).
        note: why statistics are missing, or "" when complete.
    """

    label: str
    n_pairs: int
    mean: float
    baseline_mean: float
    t: st.TTest | None
    boot: st.Interval | None
    poi: st.Interval | None
    p_holm: float | None = None
    steps_ratio: st.RatioResult | None = None
    rollouts_ratio: st.RatioResult | None = None
    note: str = ""


@dataclass
class Analysis:
    """Everything the report shows, as arrays and NamedTuples."""

    matrix: ScoreMatrix
    baseline: str
    confidence: float
    summaries: dict                 # name -> float[B] weights; PRIMARY first
    summary_scores: dict            # name -> float[M, S]
    benchmark_means: np.ndarray     # float[M, B]
    comparisons: list               # Comparison per non-baseline label
    ranking: dict                   # summary name -> RankingSensitivity vs PRIMARY
    ranking_labels: tuple           # labels ranked (those with a finite mean under every summary)
    mc_note: str
    curves: dict                    # label -> (x[T], mean[T], low[T], high[T])
    curves_rollouts: dict           # same on the rollouts axis
    domain_probs: dict              # label -> (steps[T], domains, mean probs[T, K], source)
    target: dict | None             # to_target_arrays(...) or None
    failed: list = field(default_factory=list)   # [(run_id, first line of error)]
    provenance: dict = field(default_factory=dict)
    # label -> `Efficiency` (rlpace.evaluation._efficiency): rollouts / tokens / steps to
    # `gain_fraction` of the baseline's gain and the area under accuracy vs rollouts, as
    # paired ratios to the baseline; empty when it cannot be computed (`efficiency_note` says why).
    efficiency: dict = field(default_factory=dict)
    efficiency_note: str = ""
    gain_fraction: float = 0.8

    @property
    def labels(self) -> tuple:
        return self.matrix.labels


def parse_summary(spec: str, benchmarks: Sequence[str]) -> tuple[str, np.ndarray]:
    """Parse a `--summary` argument: "NAME=b1,b2" (equal weights on a subset) or
    "NAME=b1:2,b2:1" (explicit weights).

    >>> parse_summary("mathy=a:3,b:1", ["a", "b", "c"])[1].tolist()
    [0.75, 0.25, 0.0]
    """
    name, eq, body = spec.partition("=")
    if not eq or not name or not body:
        raise InputError(f"--summary {spec!r} must look like NAME=bench1,bench2 or "
                         f"NAME=bench1:w1,bench2:w2; benchmarks: {list(benchmarks)}.")
    items = [x.strip() for x in body.split(",") if x.strip()]
    if all(":" in x for x in items):
        weights = {}
        for x in items:
            b, _, w = x.rpartition(":")
            try:
                weights[b] = float(w)
            except ValueError:
                raise InputError(f"--summary {spec!r}: weight {w!r} of {b!r} is not a number.") from None
        return name, st.summary_weights(benchmarks, weights)
    if any(":" in x for x in items):
        raise InputError(f"--summary {spec!r} mixes weighted and unweighted benchmarks; give a weight "
                         f"to all or none.")
    return name, st.subset_weights(benchmarks, items)


def default_summaries(benchmarks: Sequence[str], benchmark_domains: Sequence[str]) -> dict:
    """The primary domain-balanced summary, the plain benchmark mean (when it differs), and
    one single-domain summary per domain (when there are ≥ 2): the alternatives against
    which ranking sensitivity is checked (DataFlex-RL re-scored with a math-heavy subset)."""
    out = {PRIMARY: st.domain_balanced_weights(benchmark_domains)}
    flat = np.full(len(benchmarks), 1.0 / len(benchmarks))
    if not np.allclose(flat, out[PRIMARY]):
        out["benchmark_mean"] = flat
    doms = list(dict.fromkeys(benchmark_domains))
    if len(doms) >= 2:
        for d in doms:
            out[f"only:{d}"] = st.subset_weights(
                benchmarks, [b for b, bd in zip(benchmarks, benchmark_domains) if bd == d])
    return out


def _first_line(text: str) -> str:
    lines = [x for x in str(text).strip().splitlines() if x.strip()]
    return lines[-1][:300] if lines else ""


def more_seeds_hint(records) -> str:
    """How to get the seeds a paired CI needs, for the producer of these records: demo runs
    gain seeds from `rlpace demo --seed N` into the same folder (or the headroom benchmark's
    8 seeds); any other records from `rlpace compare --seeds 8`."""
    producers = {str((r.get("config") or {}).get("producer", "")) for r in records}
    if producers == {"rlpace demo"}:
        return ("Add demo seeds to the same folder (rlpace demo --seed 1 --out <this folder>, then --seed 2, "
                "...), or measure 8 seeds with python benchmarks/headroom.py --suite mostly_solved.")
    return "Run more seeds (rlpace compare --seeds 8)."


def analyze(records: Sequence[Mapping[str, Any]], *, baseline: str = "uniform",
            suite: str | None = None, summaries: Mapping[str, np.ndarray] | None = None,
            extra_summaries: Sequence[str] = (), label_order: Sequence[str] | None = None,
            confidence: float = 0.95, n_boot: int = 10_000, random_state: int = 0,
            target: float | None = None, failed: Sequence[tuple] = (), gain_fraction: float = 0.8) -> Analysis:
    """Compare every method with `baseline` over matched seeds.

    Args:
        records: run records (`read_records(runs_dir)`).
        baseline: label of the reference method (DataFlex-RL: uniform GRPO).
        suite: which suite, when the records hold several.
        summaries: {name: float[B] weights} replacing the defaults (`default_summaries`);
            the first is the primary summary used for the paired statistics.
        extra_summaries: "NAME=b1,b2" / "NAME=b1:w,..." specs added to the summaries.
        label_order: preferred row order (e.g. the grid's policy order).
        confidence: interval level.
        n_boot: bootstrap resamples.
        random_state: seed of every bootstrap (one Generator consumed in label order).
        target: held-out mean accuracy for the steps/rollouts-to-target speed-ups, found in
            each run's evals; default: the target stored in the records, if any.
        failed: (run_id, error) of runs that failed, listed in the report.
        gain_fraction: f of the baseline's gain for `Analysis.efficiency` (rollouts to
            base + f·(baseline final − base), per seed; see `efficiency_vs_baseline`).

    Raises:
        ValueError: the baseline is not among the labels, or no method has 2 seeds paired
            with the baseline (plus everything `score_matrix` rejects).
    """
    c = st._check_confidence(confidence)
    # The baseline is the first row of every table.
    order = [baseline] + [x for x in (label_order or []) if x != baseline]
    sm = score_matrix(records, suite=suite, label_order=order)
    if baseline not in sm.labels:
        raise InputError(f"baseline {baseline!r} is not among the complete runs' labels "
                         f"{list(sm.labels)}; pass --baseline <one of them>, or add {baseline!r} to "
                         f"the grid (it must run the same seeds).")
    if summaries is None:
        summaries = default_summaries(sm.benchmarks, sm.benchmark_domains)
    summaries = dict(summaries)
    for spec in extra_summaries:
        name, w = parse_summary(spec, sm.benchmarks)
        summaries[name] = w
    if not summaries:
        raise InputError("no summaries: give at least one (the first is the primary).")
    primary = next(iter(summaries))
    scores = {name: st.summarize(sm.values, w) for name, w in summaries.items()}   # [M, S]
    rng = st.as_rng(random_state)
    bi = sm.index(baseline)
    base = scores[primary][bi]
    target_info = to_target_arrays(sm, target)
    others = [lab for lab in sm.labels if lab != baseline]
    comps: list[Comparison] = []
    for lab in others:
        i = sm.index(lab)
        x = scores[primary][i]
        ok = ~(np.isnan(x) | np.isnan(base))
        n = int(ok.sum())
        mean = float(x[ok].mean()) if n else float("nan")
        bmean = float(base[ok].mean()) if n else float("nan")
        if n < 2:
            comps.append(Comparison(lab, n, mean, bmean, None, None, None,
                                    note=f"only {n} seed(s) paired with {baseline!r}; a paired CI "
                                         f"needs ≥ 2 — run more seeds of both."))
            continue
        t = st.paired_t_interval(x, base, c)
        boot = st.paired_bootstrap_interval(x, base, confidence=c, n_boot=n_boot, random_state=rng)
        poi = st.poi_bootstrap_interval(x, base, confidence=c, n_boot=min(n_boot, 2000),
                                        random_state=rng)
        sr = rr = None
        if target_info is not None:
            ti = target_info
            both = ti["has_run"][i] & ti["has_run"][bi]
            if both.sum() >= 1:
                sr = _safe_ratio(ti["steps"][i][both], ti["steps"][bi][both], ti["own_steps"][i][both],
                                 ti["own_steps"][bi][both], c, n_boot, rng)
                rr = _safe_ratio(ti["rollouts"][i][both], ti["rollouts"][bi][both], ti["own_rollouts"][i][both],
                                 ti["own_rollouts"][bi][both], c, n_boot, rng)
        comps.append(Comparison(lab, n, mean, bmean, t, boot, poi, steps_ratio=sr, rollouts_ratio=rr))
    tested = [k for k, cp in enumerate(comps) if cp.t is not None]
    if others and not tested:
        raise InputError(f"no method has ≥ 2 seeds paired with the baseline {baseline!r} (paired "
                         f"seeds: {[cp.n_pairs for cp in comps]}); a paired CI needs at least 2. "
                         f"{more_seeds_hint(records)}")
    if tested:
        adj = st.holm_adjust(np.array([comps[k].t.p_value for k in tested]))
        for k, p in zip(tested, adj):
            comps[k] = _replace(comps[k], p_holm=float(p))
    alpha = 1.0 - c
    mc = st.multiple_comparison_note(len(tested), sum(comps[k].t.p_value <= alpha for k in tested),
                                     sum(comps[k].p_holm <= alpha for k in tested), alpha=alpha)
    # Ranking sensitivity: methods with a finite mean under every summary; a method's mean is
    # over the seeds it completed (listed as missing in the report when not all).
    means = {name: _row_means(v) for name, v in scores.items()}                     # [M]
    finite = np.all([np.isfinite(m) for m in means.values()], axis=0)
    ranked = tuple(lab for lab, f in zip(sm.labels, finite) if f)
    ranking = {}
    if len(ranked) >= 2:
        for name in summaries:
            if name == primary:
                continue
            ranking[name] = st.ranking_sensitivity(means[primary][finite], means[name][finite])
    curves, curves_r = {}, {}
    for lab, (xs, vals) in learning_curves(sm, x="step").items():
        curves[lab] = (xs, *st.t_band(vals, c))
    for lab, (xs, vals) in learning_curves(sm, x="rollouts").items():
        curves_r[lab] = (xs, *st.t_band(vals, c))
    dprobs = {}
    for lab, (steps, doms, probs, src) in domain_prob_series(sm).items():
        with np.errstate(invalid="ignore"):
            cnt = np.sum(~np.isnan(probs), axis=0)
            mean = np.where(cnt > 0, np.nansum(probs, axis=0) / np.maximum(cnt, 1), np.nan)
        dprobs[lab] = (steps, doms, mean, src)
    prov = _provenance_summary(sm)
    eff, eff_note = {}, ""
    try:
        eff = efficiency_vs_baseline(efficiency_curves(sm), baseline=baseline, fraction=gain_fraction,
                                     confidence=c, n_boot=n_boot, random_state=rng)
    except InputError as e:   # no evals with rollouts, or a baseline that gained nothing
        eff_note = str(e)
    return Analysis(matrix=sm, baseline=baseline, confidence=c, summaries=summaries,
                    summary_scores=scores, benchmark_means=st.benchmark_means(sm.values),
                    comparisons=comps, ranking=ranking, ranking_labels=ranked, mc_note=mc,
                    curves=curves, curves_rollouts=curves_r, domain_probs=dprobs, target=target_info,
                    failed=[(rid, _first_line(err)) for rid, err in failed], provenance=prov,
                    efficiency=eff, efficiency_note=eff_note, gain_fraction=float(gain_fraction))


def efficiency_table(a: Analysis) -> tuple[list[str], list[list[str]]]:
    """(head, rows) of `Analysis.efficiency` for a report: per method, rollouts (refills and
    probes included) and generated tokens to `gain_fraction` of the baseline's gain, the
    area under accuracy vs rollouts, and steps (secondary), each as a paired ratio to the
    baseline with its CI; "≥"/"≤"/"?" mark bounds (censored runs, at their own budget).
    Rows are empty when there is no efficiency (see `Analysis.efficiency_note`).

    Cost ratios < 1 mean cheaper than the baseline; the area ratio > 1 means better."""
    conf = f"{a.confidence:.0%}"
    pct = f"{a.gain_fraction:.0%}"
    head = ["method", "paired seeds", f"rollouts to {pct} of {a.baseline}'s gain / {a.baseline} [{conf} CI]",
            f"tokens / {a.baseline}", f"AUC (accuracy vs rollouts) / {a.baseline}", "reached target",
            f"steps / {a.baseline}"]
    fmt = (lambda r: "–" if r is None else str(r))
    rows = []
    for lab, e in a.efficiency.items():
        rows.append([lab, str(len(e.seeds)), fmt(e.rollouts), fmt(e.tokens), fmt(e.auc),
                     f"{int(e.reached.sum())}/{len(e.seeds)}", fmt(e.steps)])
    return head, rows


def _safe_ratio(x, y, own_x, own_y, c, n_boot, rng):
    """`ratio_to_target` with each censored run (NaN: never reached the target) at its *own*
    budget `own_x` / `own_y` — a censored baseline used to get the largest rollout count of
    any run in the matrix, which inflated the speed-up of every method that spent less — and
    the result marked `censored` (a bound). None where it is undefined (a run at the target
    from step 0: the target is below the starting accuracy)."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    reached_x, reached_y = int(np.sum(~np.isnan(x))), int(np.sum(~np.isnan(y)))
    xf = np.where(np.isnan(x), np.asarray(own_x, dtype=np.float64), x)
    yf = np.where(np.isnan(y), np.asarray(own_y, dtype=np.float64), y)
    try:
        r = st.ratio_to_target(xf, yf, budget=1.0, confidence=c, n_boot=n_boot, random_state=rng)
    except InputError:
        return None
    return r._replace(reached_method=reached_x, reached_baseline=reached_y,
                      censored=reached_x < x.size or reached_y < y.size)


def _row_means(v: np.ndarray) -> np.ndarray:
    """Mean over seeds (axis 1) of the available values; NaN for a row with none."""
    cnt = np.sum(~np.isnan(v), axis=1)
    return np.where(cnt > 0, np.nansum(v, axis=1) / np.maximum(cnt, 1), np.nan)


def _replace(cp: Comparison, **kw) -> Comparison:
    from dataclasses import replace
    return replace(cp, **kw)


def _provenance_summary(sm: ScoreMatrix) -> dict:
    commits, packages, seconds, rollouts = set(), {}, 0.0, 0
    for row in sm.records:
        for r in row:
            if r is None:
                continue
            p = r["provenance"]
            commits.add((p.get("git_commit") or "unknown") + (" (dirty)" if p.get("git_dirty") else ""))
            for k, v in (p.get("packages") or {}).items():
                packages.setdefault(k, set()).add(v)
            seconds += float(r["seconds"])
            rollouts += int(r["rollouts"])
    return {"git_commits": sorted(commits), "packages": {k: sorted(v) for k, v in packages.items()},
            "run_seconds": seconds, "rollouts": rollouts}
