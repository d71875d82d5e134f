"""Learning efficiency against uniform: rollouts (and tokens, steps) to reach a fraction of
uniform's gain, and the area under accuracy vs rollouts — each as a paired ratio to the
baseline over seeds with a 95% bootstrap CI.

Why a fraction of the gain: "steps to reach uniform's final accuracy" puts the target on
uniform's late plateau, where a 0.006 accuracy gap decides "70 steps vs never" and the
ratio measures noise. The target

    target_s = base_s + f · (final_s − base_s)          (f = 0.8 by default)

lies on the rising part of uniform's curve: base_s is the baseline's first evaluation of
seed s (the common starting model of every run with that seed), final_s the mean of the
baseline's last `tail` evaluations (tail = 1: its final accuracy; the trainer benchmarks
use 3 to smooth evaluation noise).

Cost to target (`cost_to_reach`): the curve is linear between evaluations, and the cost
is where it first crosses the target — x_{t−1} + (target − a_{t−1}) / (a_t − a_{t−1}) ·
(x_t − x_{t−1}) at the first evaluation t with a_t ≥ target. Interpolation, not "the first
evaluation at or above": with evaluations every 10 steps, the latter rounds every cost up
to a multiple of 10 steps and pulls fast methods' ratios towards 1. A run that never
reaches the target is *censored*: its cost is set to its own budget (the cost of its last
evaluation), a lower bound on the truth, and every ratio it enters is marked a bound.

Costs are cumulative counters at each evaluation: rollouts generated for training,
refills and probes included (an oracle's measurement rollouts are not: it is a reference,
not a method), generated tokens where the record has them, and training steps (a
secondary column).

Area (`normalized_auc`): the mean held-out accuracy over rollouts 0..X, (1/X)∫₀^X a(x) dx
with a linear between evaluations; X is a budget common to all runs compared (default: the
smallest final rollout count, so no curve is extrapolated). A larger area is better.

Ratios (`paired_cost_ratio`): mean over paired seeds of the method's cost divided by the
mean of the baseline's (< 1 = cheaper; for the area, > 1 = better), with a paired
percentile bootstrap CI over seeds (`rlpace.evaluation.ratio_to_target`, seeds resampled as
pairs). Censoring marks the ratio as a bound: only the method censored → the true ratio is
larger ("≥"); only the baseline → smaller ("≤"); both → the direction is unknown ("?").

>>> import numpy as np
>>> x = np.array([0., 100., 200., 300.]); a = np.array([0.2, 0.4, 0.6, 0.7])
>>> gain_target(0.2, 0.7, 0.8), cost_to_reach(x, a, 0.6)
(0.6, (200.0, True))
>>> round(cost_to_reach(x, a, 0.5)[0], 6), cost_to_reach(x, a, 0.9)
(150.0, (300.0, False))
"""

from __future__ import annotations

from ..errors import InputError
import math
from typing import Mapping, NamedTuple, Sequence

import numpy as np

from . import _stats as st

__all__ = ["Curve", "CostRatio", "Efficiency", "gain_target", "cost_to_reach", "normalized_auc",
           "paired_cost_ratio", "efficiency_vs_baseline", "captured_share", "curves_from_runs"]


class Curve(NamedTuple):
    """One run's held-out curve. All arrays have one entry per evaluation, in order."""

    rollouts: np.ndarray             # float64[T] cumulative rollouts generated (refills, probes included)
    accuracy: np.ndarray             # float64[T] held-out mean accuracy
    steps: np.ndarray | None = None  # float64[T] training steps done
    tokens: np.ndarray | None = None  # float64[T] cumulative generated tokens


class CostRatio(NamedTuple):
    """mean(method cost) / mean(baseline cost) over paired seeds (< 1 = cheaper), or the
    ratio of mean areas (> 1 = better) for the AUC."""

    estimate: float
    low: float               # paired percentile bootstrap CI (NaN with < 2 seeds)
    high: float
    confidence: float
    n: int                   # paired seeds
    reached_method: int      # seeds where the method reached the target (n for the AUC)
    reached_baseline: int
    bound: str               # "" exact; "≥" lower bound; "≤" upper bound; "?" both censored

    def __str__(self) -> str:
        ci = f" [{self.low:.2f}, {self.high:.2f}]" if math.isfinite(self.low) else ""
        return f"{self.bound}{self.estimate:.2f}×{ci}"


class Efficiency(NamedTuple):
    """A method against the baseline (see the module docstring for every definition).

    Attributes:
        label: the method.
        seeds: S paired seeds, in order.
        target: float64[S] accuracy target of each seed.
        rollouts_to_target: float64[S] the method's rollouts to the target (censored runs:
            their budget); `reached`: bool[S] which seeds got there.
        rollouts, tokens, steps: `CostRatio` to the baseline (tokens None without token
            counts in every run).
        auc: ratio of normalised areas under accuracy vs rollouts up to `auc_budget`.
        final_diff: paired bootstrap interval of final accuracy − baseline's.
        auc_budget: X, the common rollout budget of the areas.
    """

    label: str
    seeds: tuple
    target: np.ndarray
    rollouts_to_target: np.ndarray
    reached: np.ndarray
    rollouts: CostRatio | None
    tokens: CostRatio | None
    steps: CostRatio | None
    auc: CostRatio | None
    final_diff: st.Interval | None
    auc_budget: float


def gain_target(base: float | np.ndarray, final: float | np.ndarray, fraction: float = 0.8):
    """base + fraction · (final − base): the accuracy at which `fraction` of the
    baseline's gain is reached. `fraction` in (0, 1]."""
    if not 0.0 < fraction <= 1.0:
        raise InputError(f"fraction of the baseline's gain must be in (0, 1], e.g. 0.8; got {fraction!r}.")
    out = np.asarray(base, dtype=np.float64) + fraction * (np.asarray(final, dtype=np.float64) - base)
    return float(out) if out.ndim == 0 else out


def _check_curve(x: np.ndarray, a: np.ndarray, what: str) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(x, dtype=np.float64)
    a = np.asarray(a, dtype=np.float64)
    if x.ndim != 1 or x.shape != a.shape or x.size == 0:
        raise InputError(f"{what}: cost and accuracy must be 1-D arrays of one length ≥ 1 (one entry per "
                         f"evaluation); got shapes {x.shape} and {a.shape}.")
    if not (np.isfinite(x).all() and np.isfinite(a).all()):
        raise InputError(f"{what}: the curve has NaN or inf values; drop evaluations without a cost or "
                         f"an accuracy first.")
    if (np.diff(x) < 0).any():
        raise InputError(f"{what}: the cost must be non-decreasing over evaluations (a cumulative "
                         f"counter); got {x.tolist()[:8]}.")
    return x, a


def cost_to_reach(cost: np.ndarray, accuracy: np.ndarray, target: float) -> tuple[float, bool]:
    """(cost at which the curve first reaches `target`, reached?) with linear
    interpolation between evaluations; (last cost, False) when it never does (censored at
    the run's own budget). A curve already at the target at its first evaluation costs
    that evaluation's cost (usually 0)."""
    x, a = _check_curve(cost, accuracy, "cost_to_reach")
    hit = np.flatnonzero(a >= target)
    if hit.size == 0:
        return float(x[-1]), False
    t = int(hit[0])
    if t == 0:
        return float(x[0]), True
    frac = (target - a[t - 1]) / (a[t] - a[t - 1])      # a[t-1] < target ≤ a[t], so 0 < frac ≤ 1
    return float(x[t - 1] + frac * (x[t] - x[t - 1])), True


def normalized_auc(cost: np.ndarray, accuracy: np.ndarray, budget: float) -> float:
    """(1/X) ∫₀^X a(x) dx with a linear between evaluations: the mean accuracy over the
    first X = `budget` rollouts. Before the first evaluation the curve holds its first
    value, after the last its last value (pass X ≤ the run's budget to avoid that).

    >>> normalized_auc(np.array([0., 100.]), np.array([0.2, 0.6]), 100.0)
    0.4
    """
    x, a = _check_curve(cost, accuracy, "normalized_auc")
    if not (np.isfinite(budget) and budget > 0):
        raise InputError(f"normalized_auc budget must be a positive number of rollouts; got {budget!r}.")
    grid = np.union1d(x[(x > 0) & (x < budget)], [0.0, float(budget)])       # knots in [0, X]
    vals = np.interp(grid, x, a)
    return float(np.sum(np.diff(grid) * (vals[1:] + vals[:-1]) / 2.0) / budget)


def paired_cost_ratio(method: np.ndarray, baseline: np.ndarray, method_reached: np.ndarray | None = None,
                      baseline_reached: np.ndarray | None = None, *, confidence: float = 0.95,
                      n_boot: int = 10_000, random_state: int | np.random.Generator = 0) -> CostRatio:
    """mean(method) / mean(baseline) over paired seeds with a paired bootstrap CI.

    Args:
        method, baseline: float[S] costs per seed (censored runs already at their budget).
        method_reached, baseline_reached: bool[S]; False marks a censored value (None = all
            reached). Sets `bound` (module docstring).

    >>> r = paired_cost_ratio(np.array([50., 100.]), np.array([100., 200.]), random_state=0)
    >>> r.estimate, r.bound
    (0.5, '')
    """
    x = np.asarray(method, dtype=np.float64)
    y = np.asarray(baseline, dtype=np.float64)
    n = x.shape[0]
    mr = np.ones(n, bool) if method_reached is None else np.asarray(method_reached, bool)
    br = np.ones(n, bool) if baseline_reached is None else np.asarray(baseline_reached, bool)
    if (y <= 0).any() and n:
        raise InputError("baseline costs must be > 0 for a ratio (a baseline at the target from its first "
                         "evaluation gives none); raise the target or check the baseline's curve.")
    # ratio_to_target(method=a, baseline=b) is mean(b) / mean(a) with seeds resampled as pairs;
    # passing the baseline as its `method` gives mean(method) / mean(baseline). Nothing is NaN
    # here (censored costs are already each run's own budget), so its one `budget` is unused.
    r = st.ratio_to_target(y, x, budget=1.0, confidence=confidence, n_boot=n_boot, random_state=random_state)
    cm, cb = not mr.all(), not br.all()
    bound = "?" if cm and cb else "≥" if cm else "≤" if cb else ""
    return CostRatio(r.estimate, r.low, r.high, r.confidence, n, int(mr.sum()), int(br.sum()), bound)


def captured_share(ratio: float, oracle_ratio: float) -> float:
    """(1 − ratio) / (1 − oracle ratio): the share of the oracle's saving a method
    captures; NaN when the oracle saves nothing (oracle ratio ≥ 1).

    >>> round(captured_share(0.7, 0.4), 6)
    0.5
    """
    if not (math.isfinite(oracle_ratio) and oracle_ratio < 1.0) or not math.isfinite(ratio):
        return math.nan
    return float((1.0 - ratio) / (1.0 - oracle_ratio))


def efficiency_vs_baseline(curves: Mapping[str, Mapping[int, Curve]], *, baseline: str = "uniform",
                           fraction: float = 0.8, tail: int = 1, target: float | None = None,
                           auc_budget: float | None = None, confidence: float = 0.95, n_boot: int = 10_000,
                           random_state: int | np.random.Generator = 0) -> dict[str, Efficiency]:
    """Every method against `baseline` on the seeds both ran (module docstring).

    Args:
        curves: {label: {seed: Curve}}.
        baseline: the reference label (uniform GRPO).
        fraction: f of the baseline's gain that defines each seed's target.
        tail: the baseline's final accuracy is the mean of its last `tail` evaluations.
        target: a fixed accuracy target instead (every seed).
        auc_budget: X for the areas; None = the smallest final rollout count of all runs.
        confidence, n_boot, random_state: the bootstraps (one Generator, consumed in label order).

    Returns:
        {label: Efficiency} for every label but the baseline (ratios None with no paired seed).

    Raises:
        ValueError: the baseline is missing, or its gain on a seed is ≤ 0 (no target).
    """
    if baseline not in curves:
        raise InputError(f"baseline {baseline!r} has no curves; labels: {sorted(curves)}.")
    if isinstance(tail, bool) or not isinstance(tail, (int, np.integer)) or tail < 1:
        raise InputError(f"tail must be a positive int (evaluations averaged for the final accuracy); got {tail!r}.")
    rng = st.as_rng(random_state)
    base_curves = curves[baseline]
    tgt: dict[int, float] = {}
    for s, c in base_curves.items():
        a = np.asarray(c.accuracy, dtype=np.float64)
        if target is not None:
            tgt[s] = float(target)
            continue
        final = float(a[-tail:].mean())
        if final <= a[0]:
            raise InputError(f"baseline {baseline!r} seed {s} gained nothing (first evaluation {a[0]:.4f}, "
                             f"final {final:.4f}): no fraction-of-gain target. Train longer, or pass a "
                             f"fixed target.")
        tgt[s] = gain_target(float(a[0]), final, fraction)
    if auc_budget is None:
        ends = [float(np.asarray(c.rollouts)[-1]) for runs in curves.values() for c in runs.values()]
        auc_budget = min(ends) if ends else 0.0
    out = {}
    for lab, runs in curves.items():
        if lab == baseline:
            continue
        seeds = tuple(sorted(set(runs) & set(base_curves)))
        t = np.array([tgt[s] for s in seeds])

        def costs(which: str, label_runs, seeds=seeds, t=t):
            vals, ok = [], []
            for s, ts in zip(seeds, t):
                c = label_runs[s]
                x = getattr(c, which)
                if x is None:
                    return None, None
                v, r = cost_to_reach(np.asarray(x, dtype=np.float64), c.accuracy, ts)
                vals.append(v)
                ok.append(r)
            return np.asarray(vals, dtype=np.float64), np.asarray(ok, dtype=bool)

        ratios = {}
        for which in ("rollouts", "tokens", "steps"):
            m, mr = costs(which, runs)
            b, br = costs(which, base_curves)
            ratios[which] = None if (m is None or b is None or len(seeds) == 0) else paired_cost_ratio(
                m, b, mr, br, confidence=confidence, n_boot=n_boot, random_state=rng)
            if which == "rollouts":
                r_cost, r_ok = (m, mr) if m is not None else (np.zeros(0), np.zeros(0, bool))
        auc = fin = None
        if seeds and auc_budget > 0:
            am = np.array([normalized_auc(runs[s].rollouts, runs[s].accuracy, auc_budget) for s in seeds])
            ab = np.array([normalized_auc(base_curves[s].rollouts, base_curves[s].accuracy, auc_budget)
                           for s in seeds])
            auc = paired_cost_ratio(am, ab, confidence=confidence, n_boot=n_boot, random_state=rng)
        if len(seeds) >= 2:
            fm = np.array([float(np.asarray(runs[s].accuracy)[-1]) for s in seeds])
            fb = np.array([float(np.asarray(base_curves[s].accuracy)[-1]) for s in seeds])
            fin = st.paired_bootstrap_interval(fm, fb, confidence=confidence, n_boot=n_boot, random_state=rng)
        out[lab] = Efficiency(lab, seeds, t, r_cost, r_ok, ratios["rollouts"], ratios["tokens"],
                              ratios["steps"], auc, fin, float(auc_budget))
    return out


def curves_from_runs(eval_rollouts: Sequence, eval_accuracy: Sequence, eval_steps: Sequence | None = None,
                     eval_tokens: Sequence | None = None) -> Curve:
    """A `Curve` from plain lists (e.g. a record's evals columns)."""
    f = (lambda v: None if v is None else np.asarray(v, dtype=np.float64))
    return Curve(f(eval_rollouts), f(eval_accuracy), f(eval_steps), f(eval_tokens))
