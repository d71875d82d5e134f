"""A robust, bounded fit of the power law L(t) = E + A·t^(−α) to loss curves, in pure numpy.

Used by the `epiplexity` mixture (docs/methods/epiplexity.md) to fit each domain's held-out
loss against the tokens of that domain trained on so far. No scipy: the core install stays
numpy-only, and the fit is small enough that a structured search is exact enough.

Method. For a fixed exponent α the model is linear in (E, A): with x = (t / t_ref)^(−α),
L = E + A_ref·x, whose box-constrained (E ≥ 0, A ≥ 0) weighted least squares has a closed
form (the interior solution, or the better of the two faces E = 0 and A = 0 — the problem
is convex, so that is the optimum). So the fit is a 1-D search over α ∈ [alpha_min,
alpha_max]: a log-spaced grid, then three rounds of refinement around the best grid point,
every curve and every α at once ([K, grid, C] arrays). Robustness: Huber weights
(c = 1.345, scale 1.4826·MAD of the residuals) re-estimated for `robust_iters` rounds
(IRLS), so one spiky probe does not bend the curve. t is divided by each curve's largest
t before the search, so x stays in a range where float64 is exact; A is reported in the
caller's units, A = A_ref · t_ref^α.

Bounds: E ≥ 0 and A ≥ 0 (losses are non-negative and the curve never rises), α within the
given interval. A flat or rising curve fits with A = 0 (no learnable structure left), a curve
with fewer than two distinct t > 0 is reported as not fitted (`ok` False) with zeros.

>>> t = np.array([[1e3, 2e3, 4e3, 8e3, 16e3, 32e3]])
>>> y = 1.0 + 30.0 * t ** -0.5
>>> fit = fit_power_law(t, y, np.ones_like(t, bool))
>>> np.round([fit.E[0], fit.A[0], fit.alpha[0]], 3).tolist(), bool(fit.ok[0])
([1.0, 30.0, 0.5], True)
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["PowerLawFit", "fit_power_law", "power_law"]

_HUBER_C = 1.345
_MAD_SCALE = 1.4826


class PowerLawFit(NamedTuple):
    E: np.ndarray       # float64[K] asymptote (irreducible loss), ≥ 0
    A: np.ndarray       # float64[K] amplitude in the caller's t units, ≥ 0
    alpha: np.ndarray   # float64[K] exponent in [alpha_min, alpha_max] (0 where not ok)
    rmse: np.ndarray    # float64[K] root mean squared residual over the curve's points
    ok: np.ndarray      # bool[K] the curve had ≥ 2 distinct t > 0 and was fitted


def power_law(t, E, A, alpha) -> np.ndarray:
    """E + A·t^(−α), elementwise (broadcasting)."""
    return np.asarray(E) + np.asarray(A) * np.asarray(t, dtype=np.float64) ** (-np.asarray(alpha))


def _ls_box(x, y, w):
    """Box-constrained weighted least squares of y ≈ E + A·x with E, A ≥ 0, along the last axis.

    x: [..., C], y, w broadcastable to it (w ≥ 0, 0 = point absent). Returns (E, A, sse) [...].
    """
    y, w = np.broadcast_to(y, x.shape), np.broadcast_to(w, x.shape)
    sw = np.maximum(w.sum(-1), 1e-300)
    xm = (w * x).sum(-1) / sw
    ym = (w * y).sum(-1) / sw
    dx = x - xm[..., None]
    sxx = (w * dx * dx).sum(-1)
    sxy = (w * dx * (y - ym[..., None])).sum(-1)
    # interior (unconstrained) solution; sxx = 0 means x is constant: A is not identified
    a_in = np.where(sxx > 1e-300, sxy / np.where(sxx > 1e-300, sxx, 1.0), 0.0)
    e_in = ym - a_in * xm
    # face A = 0: E = weighted mean (≥ 0 for y ≥ 0); face E = 0: A = Σwxy / Σwxx (≥ 0 for x, y ≥ 0)
    wxx = (w * x * x).sum(-1)
    a_e0 = np.maximum((w * x * y).sum(-1) / np.maximum(wxx, 1e-300), 0.0)

    def sse(e, a):
        r = y - e[..., None] - a[..., None] * x
        return (w * r * r).sum(-1)

    feasible = (a_in >= 0) & (e_in >= 0)
    cands_e = np.stack([np.where(feasible, e_in, 0.0), np.maximum(ym, 0.0), np.zeros_like(ym)])
    cands_a = np.stack([np.where(feasible, a_in, 0.0), np.zeros_like(ym), a_e0])
    errs = np.stack([np.where(feasible, sse(e_in, a_in), np.inf), sse(cands_e[1], cands_a[1]),
                     sse(cands_e[2], cands_a[2])])
    best = errs.argmin(0)
    pick = lambda c: np.take_along_axis(c, best[None], 0)[0]   # noqa: E731
    return pick(cands_e), pick(cands_a), pick(errs)


def _search_alpha(s, y, w, lo, hi, n_grid):
    """Best α per curve on a log grid over [lo, hi] plus two refinements. s: [K, C] scaled t."""
    k = s.shape[0]
    logs = np.log(np.where(w > 0, s, 1.0))                  # [K, C], 0 where absent
    grid = np.broadcast_to(np.geomspace(lo, hi, n_grid), (k, n_grid))
    for level in range(4):
        x = np.exp(-grid[:, :, None] * logs[:, None, :])    # [K, n, C] = s^(−α)
        e, a, err = _ls_box(x, y[:, None, :], w[:, None, :])
        i = err.argmin(1)                                   # [K]
        best = grid[np.arange(k), i]
        if level == 3:
            break
        # refine between the best point's neighbours (log scale), clipped to [lo, hi]
        left = grid[np.arange(k), np.maximum(i - 1, 0)]
        right = grid[np.arange(k), np.minimum(i + 1, n_grid - 1)]
        grid = np.geomspace(np.maximum(left, lo), np.minimum(right, hi), n_grid, axis=1)
    rows = np.arange(k)
    return best, e[rows, i], a[rows, i]


def fit_power_law(t, y, mask, *, alpha_min: float = 0.01, alpha_max: float = 2.0,
                  n_grid: int = 48, robust_iters: int = 3) -> PowerLawFit:
    """Fit L(t) = E + A·t^(−α) to each row of `t`, `y` where `mask` is True (see module doc).

    Args:
        t: float[K, C] tokens (or steps) at each point; only points with t > 0 are used.
        y: float[K, C] loss at each point (finite, ≥ 0 where used).
        mask: bool[K, C] which slots hold points.
        alpha_min, alpha_max: bounds of α (0 < alpha_min < alpha_max).
        n_grid: α grid size per search level.
        robust_iters: Huber reweighting rounds after the first least-squares fit (0 = plain LS).

    Returns:
        `PowerLawFit` with one entry per row.
    """
    t = np.atleast_2d(np.asarray(t, dtype=np.float64))
    y = np.atleast_2d(np.asarray(y, dtype=np.float64))
    use = np.atleast_2d(np.asarray(mask, dtype=bool)) & (t > 0)
    k = t.shape[0]
    t_ref = np.where(use, t, 0.0).max(1)                                   # [K]
    t_min = np.where(use, t, np.inf).min(1)
    ok = use.any(1) & (t_min < t_ref)                                      # ≥ 2 distinct t > 0
    s = np.where(use, t / np.where(t_ref > 0, t_ref, 1.0)[:, None], 1.0)   # (0, 1]
    y0 = np.where(use, y, 0.0)
    w0 = use.astype(np.float64)
    w = w0.copy()
    for it in range(robust_iters + 1):
        alpha, e, a_ref = _search_alpha(s, y0, w, alpha_min, alpha_max, n_grid)
        resid = y0 - e[:, None] - a_ref[:, None] * s ** -alpha[:, None]
        if it == robust_iters:
            break
        # rows without points get zeros (not all-NaN): nanmedian would warn on them
        r = np.where(use, resid, np.where(use.any(1)[:, None], np.nan, 0.0))
        med = np.nanmedian(r, axis=1)
        mad = np.nanmedian(np.abs(r - med[:, None]), axis=1)
        scale = _MAD_SCALE * np.nan_to_num(mad)
        # scale 0: the points lie on the curve (or all but < half do); keep their weights
        cut = _HUBER_C * scale[:, None]
        hub = np.where(np.abs(resid) > cut, cut / np.maximum(np.abs(resid), 1e-300), 1.0)
        w = w0 * np.where(scale[:, None] > 0, hub, 1.0)
    n = np.maximum(w0.sum(1), 1.0)
    rmse = np.sqrt((w0 * resid * resid).sum(1) / n)
    a = a_ref * np.where(t_ref > 0, t_ref, 1.0) ** alpha                 # back to the caller's t
    zero = np.zeros(k)
    return PowerLawFit(np.where(ok, e, zero), np.where(ok, a, zero), np.where(ok, alpha, zero),
                       np.where(ok, rmse, zero), ok)
