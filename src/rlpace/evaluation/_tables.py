"""From run records to arrays: the score matrix, learning curves, domain-probability series.

This is where bad input is caught, before any statistic is computed: records from several
suites or budgets compared as if paired, duplicate runs, conflicting benchmark domains.
Partial runs (status "partial") are kept out of the paired statistics — their budget
differs — and listed, never silently dropped.
"""

from __future__ import annotations

from ..errors import InputError
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

__all__ = ["ScoreMatrix", "score_matrix", "learning_curves", "domain_prob_series",
           "to_target_arrays", "budget_key", "efficiency_curves", "ess_fractions"]


def budget_key(rec: Mapping[str, Any]) -> tuple:
    """What must match for two runs to be paired: (steps, batch_size, group_size)."""
    b = rec["budget"]
    return (b.get("steps"), b.get("batch_size"), b.get("group_size"))


def _fmt_budget(key: tuple) -> str:
    return f"steps={key[0]}, batch_size={key[1]}, group_size={key[2]}"


@dataclass(frozen=True)
class ScoreMatrix:
    """Final held-out accuracy of every (method, seed, benchmark), with what is missing.

    Attributes:
        suite: the suite all runs share.
        labels: M method labels (row order of every table).
        seeds: S seeds (union over methods).
        benchmarks: B held-out distributions.
        benchmark_domains: B domain names (for the domain-balanced summary).
        values: float64[M, S, B]; NaN = no complete run (or that benchmark not evaluated).
        run_ids: object[M, S] run id of each cell, None where missing.
        records: object[M, S] the record of each cell, None where missing.
        budget: {"steps", "batch_size", "group_size"} shared by the runs.
        excluded: ((run_id, label, seed, reason), ...) records left out (partial runs).
        missing: ((label, seed), ...) cells with no complete run.
    """

    suite: str
    labels: tuple
    seeds: tuple
    benchmarks: tuple
    benchmark_domains: tuple
    values: np.ndarray
    run_ids: np.ndarray
    records: np.ndarray
    budget: dict
    excluded: tuple
    missing: tuple

    def index(self, label: str) -> int:
        return self.labels.index(label)


def score_matrix(records: Sequence[Mapping[str, Any]], *, suite: str | None = None,
                 label_order: Sequence[str] | None = None) -> ScoreMatrix:
    """Arrange records into a [M, S, B] score matrix, checking that they can be compared.

    Args:
        records: validated run records (`rlpace.experiments.read_records`).
        suite: which suite to use when the records hold several.
        label_order: preferred row order (e.g. the grid's); other labels follow sorted.

    Raises:
        ValueError: no records; several suites and no `suite`; complete runs with different
            budgets (they are not paired); one (label, seed) twice; a benchmark assigned to
            two domains. Each message says what to fix.
    """
    if not records:
        raise InputError("no run records to report on; run a grid first (rlpace compare) or point "
                         "at the folder that holds the *.jsonl records.")
    suites = sorted({r["suite"] for r in records})
    if suite is None:
        if len(suites) > 1:
            raise InputError(f"the records come from {len(suites)} suites {suites}; statistics pair "
                             f"runs within one suite. Pass --suite <one of them>.")
        suite = suites[0]
    elif suite not in suites:
        raise InputError(f"no records of suite {suite!r}; the records hold suites {suites}.")
    recs = [r for r in records if r["suite"] == suite]
    complete = [r for r in recs if r["status"] == "complete"]
    excluded = tuple((r["run_id"], r["label"], r["seed"],
                      f"partial run: {r.get('error') or 'stopped before its budget'}")
                     for r in recs if r["status"] != "complete")
    budgets: dict[tuple, Mapping] = {}
    for r in complete:
        budgets.setdefault(budget_key(r), r)
    if len(budgets) > 1:
        (k1, r1), (k2, r2) = list(budgets.items())[:2]
        raise InputError(f"runs of different budgets cannot be compared as if paired: "
                         f"{r1['run_id']!r} has {_fmt_budget(k1)} but {r2['run_id']!r} has "
                         f"{_fmt_budget(k2)} ({len(budgets)} budgets in suite {suite!r}). Re-run the "
                         f"odd ones with the common budget, or report each budget from its own folder.")
    present = [r["label"] for r in recs]
    order = list(dict.fromkeys([x for x in (label_order or []) if x in present]))
    order += sorted(set(present) - set(order))
    seeds = sorted({int(r["seed"]) for r in recs})
    bench: list[str] = []
    domains: dict[str, str] = {}
    for r in complete:
        for b in r["final"]["acc"]:
            if b not in bench:
                bench.append(str(b))
        for b, d in (r.get("benchmark_domains") or {}).items():
            if b in domains and domains[b] != d:
                raise InputError(f"benchmark {b!r} is in domain {domains[b]!r} in one record and "
                                 f"{d!r} in {r['run_id']!r}; give every record the same "
                                 f"benchmark_domains.")
            domains[str(b)] = str(d)
    m, s, nb = len(order), len(seeds), len(bench)
    values = np.full((m, s, nb), np.nan)
    run_ids = np.full((m, s), None, dtype=object)
    recs_arr = np.full((m, s), None, dtype=object)
    li = {lab: i for i, lab in enumerate(order)}
    si = {sd: j for j, sd in enumerate(seeds)}
    bi = {b: k for k, b in enumerate(bench)}
    for r in complete:
        i, j = li[r["label"]], si[int(r["seed"])]
        if run_ids[i, j] is not None:
            raise InputError(f"label {r['label']!r} seed {r['seed']} has two complete runs "
                             f"({run_ids[i, j]!r} and {r['run_id']!r}); keep one of them.")
        run_ids[i, j] = r["run_id"]
        recs_arr[i, j] = r
        for b, v in r["final"]["acc"].items():
            if v is not None:
                values[i, j, bi[str(b)]] = float(v)
    missing = tuple((order[i], seeds[j]) for i in range(m) for j in range(s) if run_ids[i, j] is None)
    budget = dict(zip(("steps", "batch_size", "group_size"), next(iter(budgets)))) if budgets else {}
    return ScoreMatrix(suite=suite, labels=tuple(order), seeds=tuple(seeds), benchmarks=tuple(bench),
                       benchmark_domains=tuple(domains.get(b, b) for b in bench), values=values,
                       run_ids=run_ids, records=recs_arr, budget=budget, excluded=excluded,
                       missing=missing)


def learning_curves(sm: ScoreMatrix, *, x: str = "step",
                    metric: str = "acc_mean") -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Held-out curves per method: {label: (x[T], values[S, T])}, aligned on the union of
    evaluation points (NaN where a seed has no evaluation there).

    Args:
        sm: the score matrix (its complete runs are used).
        x: "step" or "rollouts" (the evals column for the x axis).
        metric: an evals column, "acc_mean" or "acc/<dist>".
    """
    out = {}
    for i, lab in enumerate(sm.labels):
        rows = [r for r in sm.records[i] if r is not None]
        if not rows:
            continue
        xs = sorted({v for r in rows for v in r["evals"].get(x, []) if v is not None})
        if not xs:
            continue
        pos = {v: t for t, v in enumerate(xs)}
        vals = np.full((len(sm.seeds), len(xs)), np.nan)
        for j, r in enumerate(sm.records[i]):
            if r is None:
                continue
            ev = r["evals"]
            for xv, yv in zip(ev.get(x, []), ev.get(metric, [])):
                if xv is not None and yv is not None:
                    vals[j, pos[xv]] = yv
        out[lab] = (np.asarray(xs, dtype=np.float64), vals)
    return out


def domain_prob_series(sm: ScoreMatrix) -> dict[str, tuple[np.ndarray, tuple, np.ndarray, str]]:
    """Per method: (steps[T], domains[K], probs[S, T, K], source) from the per-step columns
    `domain_prob/<d>` (the scheduler's mixture) or, for methods without a mixture,
    `domain_share/<d>` (the share of each domain in the proposals). Methods with neither
    are left out."""
    out = {}
    for i, lab in enumerate(sm.labels):
        rows = [r for r in sm.records[i] if r is not None]
        if not rows:
            continue
        source = None
        for prefix in ("domain_prob/", "domain_share/"):
            if any(any(k.startswith(prefix) for k in r["steps"]) for r in rows):
                source = prefix
                break
        if source is None:
            continue
        doms: list[str] = []
        for r in rows:
            for k in r["steps"]:
                if k.startswith(source) and k[len(source):] not in doms:
                    doms.append(k[len(source):])
        steps = sorted({s for r in rows for s in r["steps"]["step"]})
        pos = {v: t for t, v in enumerate(steps)}
        probs = np.full((len(sm.seeds), len(steps), len(doms)), np.nan)
        for j, r in enumerate(sm.records[i]):
            if r is None:
                continue
            t_idx = np.array([pos[v] for v in r["steps"]["step"]], dtype=np.int64)
            for kk, d in enumerate(doms):
                col = r["steps"].get(source + d)
                if col is not None:
                    probs[j, t_idx, kk] = np.array([np.nan if v is None else v for v in col], dtype=float)
        out[lab] = (np.asarray(steps, dtype=np.float64), tuple(doms), probs, source.rstrip("/"))
    return out


ESS_COLUMN = "criticality/ess_fraction"


def ess_fractions(sm: ScoreMatrix) -> dict[str, float]:
    """Per method: the effective sample size of its loss weights as a share of the batch,
    ESS / B = (Σw)² / (B·Σw²), from the per-step column `criticality/ess_fraction`
    (`criticality_is`, `criticality_grid`: their `metrics()`): the mean over the run's steps,
    then over its seeds. NaN for a method that logs none (its weights are 1, ESS = B).

    >>> sm = ScoreMatrix("s", ("u", "c"), (0, 1), ("a",), ("a",), np.zeros((2, 2, 1)),
    ...                  np.full((2, 2), None, dtype=object), np.array(
    ...                      [[{"steps": {"step": [0]}}, None],
    ...                       [{"steps": {"step": [0, 1], ESS_COLUMN: [0.5, 1.0]}},
    ...                        {"steps": {"step": [0, 1], ESS_COLUMN: [0.25, None]}}]], dtype=object), {}, (), ())
    >>> ess_fractions(sm)                    # c: mean(0.75, 0.25)
    {'u': nan, 'c': 0.5}
    """
    out = {}
    for i, lab in enumerate(sm.labels):
        per_run = []
        for r in sm.records[i]:
            col = None if r is None else r["steps"].get(ESS_COLUMN)
            v = [float(x) for x in (col or []) if x is not None]
            if v:
                per_run.append(float(np.mean(v)))
        out[lab] = float(np.mean(per_run)) if per_run else float("nan")
    return out


def _first_reaching(rec: Mapping[str, Any], target: float) -> tuple[float, float]:
    """(step, rollouts) of the first evaluation with acc_mean ≥ target; NaN if none."""
    ev = rec["evals"]
    for st, ro, acc in zip(ev.get("step", []), ev.get("rollouts", []), ev.get("acc_mean", [])):
        if acc is not None and acc >= target:
            return float(st), (np.nan if ro is None else float(ro))
    return np.nan, np.nan


def to_target_arrays(sm: ScoreMatrix, target: float | None = None) -> dict[str, Any] | None:
    """Steps and rollouts to a held-out mean-accuracy target per (method, seed).

    With `target`, they are recomputed from each record's evals (first evaluation with
    acc_mean ≥ target); without, the records' own `steps_to_target` / `rollouts_to_target`
    are used, and None is returned when the records carry no target or disagree on it.

    Returns:
        {"target", "source", "steps"[M, S], "rollouts"[M, S], "has_run"[M, S],
        "budget_steps", "budget_rollouts", "own_steps"[M, S], "own_rollouts"[M, S]};
        NaN = not reached (or no run). `own_*` is each run's own budget (its steps and the
        rollouts it actually spent): a run that never reaches the target is censored at
        its own budget, never at another run's (`budget_rollouts`, the largest of any
        run, is kept for display only).
    """
    if target is None:
        targets = {r.get("target") for row in sm.records for r in row if r is not None}
        if len(targets) != 1 or None in targets:
            return None
    m, s = sm.run_ids.shape
    steps = np.full((m, s), np.nan)
    rolls = np.full((m, s), np.nan)
    has_run = np.zeros((m, s), dtype=bool)
    own_steps = np.full((m, s), np.nan)
    own_rolls = np.full((m, s), np.nan)
    max_roll = 0
    for i in range(m):
        for j in range(s):
            r = sm.records[i, j]
            if r is None:
                continue
            has_run[i, j] = True
            max_roll = max(max_roll, int(r["rollouts"]))
            own_rolls[i, j] = float(r["rollouts"])
            own_steps[i, j] = float((r.get("budget") or {}).get("steps") or sm.budget.get("steps") or 0)
            if target is not None:
                steps[i, j], rolls[i, j] = _first_reaching(r, target)
                continue
            if r.get("steps_to_target") is not None:
                steps[i, j] = float(r["steps_to_target"])
            if r.get("rollouts_to_target") is not None:
                rolls[i, j] = float(r["rollouts_to_target"])
    if target is None:
        target = float(next(iter(targets)))
        source = "records"
    else:
        source = "evals"
    return {"target": float(target), "source": source, "steps": steps, "rollouts": rolls,
            "has_run": has_run, "budget_steps": float(sm.budget.get("steps") or 0),
            "budget_rollouts": float(max_roll), "own_steps": own_steps, "own_rollouts": own_rolls}


def efficiency_curves(sm: ScoreMatrix) -> dict:
    """{label: {seed: Curve}} of the complete runs, for `efficiency_vs_baseline`: the evals'
    cumulative `rollouts`, `acc_mean`, `step` and, where every evaluation of the run has
    one, `tokens` (generated tokens). Evaluations without rollouts or accuracy are dropped;
    a run left with none is left out."""
    from ._efficiency import Curve
    out: dict = {}
    for i, lab in enumerate(sm.labels):
        for j, seed in enumerate(sm.seeds):
            r = sm.records[i, j]
            if r is None:
                continue
            ev = r["evals"]
            n = len(ev.get("acc_mean", []))
            cols = {k: list(ev.get(k) or [None] * n) for k in ("rollouts", "acc_mean", "step", "tokens")}
            keep = [t for t in range(n) if cols["rollouts"][t] is not None and cols["acc_mean"][t] is not None]
            if not keep:
                continue
            pick = (lambda k: np.array([cols[k][t] for t in keep], dtype=np.float64))
            steps = pick("step") if all(cols["step"][t] is not None for t in keep) else None
            tokens = pick("tokens") if all(cols["tokens"][t] is not None for t in keep) else None
            out.setdefault(lab, {})[int(seed)] = Curve(pick("rollouts"), pick("acc_mean"), steps, tokens)
    return out
