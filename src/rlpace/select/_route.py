"""Routing rules of `rlpace select` (DE-Venus active data selection, arXiv 2609.03324).

Pure functions over float64[N] evidence; every tie is broken by row order, so a route
depends only on the numbers. Routes:

    keep              labelled prompt kept for training with its label
    weak_supervision  unlabelled prompt kept for training without a label
    annotate          unlabelled prompt whose label should be requested
    discard           dropped (the reason code says why)
"""

from __future__ import annotations

from ..errors import InputError
import numpy as np

ROUTES = ("keep", "weak_supervision", "annotate", "discard")


def _by_uncertainty(rows: np.ndarray, u: np.ndarray) -> np.ndarray:
    """`rows` ordered most uncertain first, ties by row position."""
    rows = np.asarray(rows, dtype=np.int64)
    return rows[np.lexsort((rows, -u[rows]))]


def route_labeled(pass_rate: np.ndarray, uncertainty: np.ndarray, labeled: np.ndarray, *,
                  band: tuple[float, float] = (0.1, 0.9),
                  budget: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """With labels: a pass-rate band, then the most uncertain within the budget.

    Rule: a labelled prompt is in the band when lo ≤ pass_rate ≤ hi (both ends inclusive).
    In-band prompts are ordered by uncertainty, highest first (ties: row order); the first
    `budget` are kept, the rest discarded ("budget"). Out-of-band prompts are discarded
    ("below_band" / "above_band"), unlabelled ones too ("no_label").

    Returns:
        (routes, reasons): object[N] arrays of strings.

    Example:
        >>> r, why = route_labeled(np.array([0.0, 0.5, 0.5, 1.0]), np.array([0., .2, .9, .5]),
        ...                        np.ones(4, bool), band=(0.1, 0.9), budget=1)
        >>> r.tolist(), why.tolist()
        (['discard', 'discard', 'keep', 'discard'], ['below_band', 'budget', 'in_band', 'above_band'])
    """
    lo, hi = band
    n = len(pass_rate)
    routes = np.full(n, "discard", dtype=object)
    reasons = np.full(n, "no_label", dtype=object)
    p = np.where(labeled, pass_rate, np.nan)
    reasons[labeled & (p < lo)] = "below_band"
    reasons[labeled & (p > hi)] = "above_band"
    order = _by_uncertainty(np.flatnonzero(labeled & (p >= lo) & (p <= hi)), uncertainty)
    kept = order if budget is None else order[:budget]
    routes[kept], reasons[kept] = "keep", "in_band"
    reasons[order[len(kept):]] = "budget"
    return routes, reasons


def select_probes(uncertainty: np.ndarray, candidates: np.ndarray, k: int) -> np.ndarray:
    """int64[K'] rows of K' = min(k, #candidates) probes spread over the uncertainty quantiles.

    Rule: with all N prompts sorted by (uncertainty, row), target j (j = 0..K'−1) is the
    uncertainty at sorted position ⌊(j + ½)·N / K'⌋ (the (j + ½)/K' quantile); probe j is
    the not yet chosen candidate nearest to it (|u − target|, then row).

    Example:
        >>> select_probes(np.array([0., .1, .2, .3, .4, .5]), np.ones(6, bool), 3).tolist()
        [1, 3, 5]
    """
    n = len(uncertainty)
    cand = np.flatnonzero(candidates)
    k = min(int(k), cand.size)
    if k == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort((np.arange(n), uncertainty))
    targets = uncertainty[order[((np.arange(k) + 0.5) * n / k).astype(np.int64)]]
    free = np.ones(cand.size, bool)
    chosen = []
    for t in targets:   # K is small (a few dozen): a plain loop reads best
        dist = np.where(free, np.abs(uncertainty[cand] - t), np.inf)
        j = int(np.argmin(dist))        # argmin takes the first minimum: lowest row
        free[j] = False
        chosen.append(cand[j])
    return np.asarray(chosen, dtype=np.int64)


def calibrate_thresholds(u_probe: np.ndarray, pass_probe: np.ndarray, *, lo: float = 0.1,
                         hi: float = 0.9) -> tuple[float, float]:
    """(t_discard, t_annotate) from the probes' uncertainties and pass rates.

    Rule (monotone, conservative):
        t_discard  = the largest probe uncertainty v such that EVERY probe with u ≤ v has
                     pass rate ≥ hi (−inf when the least uncertain probe is below hi);
        t_annotate = the smallest probe uncertainty v such that EVERY probe with u ≥ v has
                     pass rate ≤ lo (+inf when the most uncertain probe is above lo).
    Since lo < hi, t_discard < t_annotate. A prompt with u ≤ t_discard is treated as
    mastered, one with u ≥ t_annotate as one whose majority answer cannot be trusted.

    Example:
        >>> calibrate_thresholds(np.array([.1, .2, .5, .8, .9]), np.array([1., .9, .5, .1, 0.]))
        (0.2, 0.8)
    """
    if not lo < hi:
        raise InputError(f"calibrate needs lo < hi; got ({lo}, {hi}).")
    t_d, t_a = -np.inf, np.inf
    values = np.unique(u_probe)
    for v in values:
        if np.all(pass_probe[u_probe <= v] >= hi):
            t_d = float(v)
        else:
            break
    for v in values[::-1]:
        if np.all(pass_probe[u_probe >= v] <= lo):
            t_a = float(v)
        else:
            break
    return t_d, t_a


def route_unlabeled(uncertainty: np.ndarray, labeled: np.ndarray, t_discard: float,
                    t_annotate: float, *, probes: np.ndarray | None = None,
                    budget: int | None = None,
                    annotate_budget: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Without (enough) labels: three zones by the calibrated thresholds, then the budgets.

    Rule:
      1. u ≤ t_discard → discard ("mastered"), labelled or not.
      2. labelled prompts above it → keep ("labeled").
      3. unlabelled, t_discard < u < t_annotate → weak_supervision ("uncertain_mid").
      4. unlabelled, u ≥ t_annotate → annotation candidates ("uncertain_high"); `probes`
         that are unlabelled (a probe round) are candidates first ("probe"). Candidates in
         that order, then by uncertainty (highest first, ties by row): the first
         `annotate_budget` → annotate, the rest → discard ("annotate_budget") — their
         majority answers were shown to be wrong, so weak supervision would train on errors.
      5. `budget` caps annotate + keep + weak_supervision: annotate first, then keep, then
         weak_supervision, each by uncertainty (highest first); the overflow → discard
         ("budget").

    Example:
        >>> r, why = route_unlabeled(np.array([.1, .5, .6, .9, .95]), np.zeros(5, bool), 0.2, 0.8,
        ...                          annotate_budget=1)
        >>> r.tolist()
        ['discard', 'weak_supervision', 'weak_supervision', 'discard', 'annotate']
    """
    u = uncertainty
    n = len(u)
    routes = np.full(n, "discard", dtype=object)
    reasons = np.full(n, "mastered", dtype=object)
    low, high = u <= t_discard, u >= t_annotate
    keep = labeled & ~low
    routes[keep], reasons[keep] = "keep", "labeled"
    weak = ~labeled & ~low & ~high
    routes[weak], reasons[weak] = "weak_supervision", "uncertain_mid"
    is_probe = np.zeros(n, bool)
    if probes is not None and len(probes):
        is_probe[probes] = True
    probe_ann = is_probe & ~labeled
    routes[probe_ann] = "discard"
    first = _by_uncertainty(np.flatnonzero(probe_ann), u)
    rest = _by_uncertainty(np.flatnonzero(~labeled & high & ~probe_ann), u)
    cand = np.concatenate([first, rest])
    reasons[first], reasons[rest] = "probe", "uncertain_high"
    m = cand.size if annotate_budget is None else int(annotate_budget)
    routes[cand[:m]] = "annotate"
    routes[cand[m:]], reasons[cand[m:]] = "discard", "annotate_budget"
    if budget is not None:
        ann = cand[:m]
        ranked = np.concatenate([ann, _by_uncertainty(np.flatnonzero(routes == "keep"), u),
                                 _by_uncertainty(np.flatnonzero(routes == "weak_supervision"), u)])
        over = ranked[int(budget):]
        routes[over], reasons[over] = "discard", "budget"
    return routes, reasons
