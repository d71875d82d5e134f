"""Plots for the comparison report. They only draw: every number comes in computed
(`rlpace.evaluation.analyze` / `_stats`), and each function returns `fig, ax` (rliable's
`plot_utils.py` convention, STYLE.md §8).

Figures are built with `matplotlib.figure.Figure` directly (the Agg canvas, no pyplot), so
drawing never touches a GUI backend or pyplot's global state; save with `fig.savefig(path)`.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

__all__ = ["plot_learning_curves", "plot_forest", "plot_domain_heatmaps", "plot_rankings",
           "method_colors"]


def _figure(width: float, height: float):
    from matplotlib.figure import Figure
    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def method_colors(labels: Sequence[str]) -> dict:
    """A stable color per method label (tab20, baseline-independent order)."""
    from matplotlib import colormaps
    cmap = colormaps["tab20" if len(labels) > 10 else "tab10"]
    return {lab: cmap(i % cmap.N) for i, lab in enumerate(labels)}


def plot_learning_curves(curves: Mapping[str, tuple], *, baseline: str | None = None,
                         xlabel: str = "training step", ylabel: str = "held-out accuracy",
                         title: str | None = None, colors: Mapping | None = None, ax=None):
    """Mean curve per method with its confidence band.

    Args:
        curves: {label: (x[T], mean[T], low[T], high[T])}.
        baseline: drawn black and thicker.
        ax: draw into this Axes (else a new figure).
    """
    fig = ax.figure if ax is not None else _figure(9, 5.5)
    ax = ax if ax is not None else fig.add_subplot()
    colors = colors or method_colors(list(curves))
    for lab, (x, mean, lo, hi) in curves.items():
        is_base = lab == baseline
        col = "black" if is_base else colors.get(lab)
        ax.plot(x, mean, color=col, lw=2.4 if is_base else 1.4, label=lab, zorder=3 if is_base else 2)
        ax.fill_between(x, lo, hi, color=col, alpha=0.15 if is_base else 0.10, lw=0)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2 if len(curves) > 7 else 1, loc="lower right")
    return fig, ax


def plot_forest(rows: Sequence[tuple], *, xlabel: str = "paired difference vs baseline",
                title: str | None = None, ax=None):
    """Forest plot: one horizontal interval per method, a line at 0.

    Args:
        rows: (label, estimate, low, high) per method, drawn top to bottom in order.
            Intervals that exclude 0 are drawn solid, the others hollow.
    """
    n = max(len(rows), 1)
    fig = ax.figure if ax is not None else _figure(8, 0.45 * n + 1.4)
    ax = ax if ax is not None else fig.add_subplot()
    y = np.arange(len(rows))[::-1]
    for yi, (lab, est, lo, hi) in zip(y, rows):
        excl = lo > 0 or hi < 0
        col = "tab:green" if excl and est > 0 else ("tab:red" if excl else "tab:blue")
        ax.plot([lo, hi], [yi, yi], color=col, lw=2.2)
        ax.plot([est], [yi], "o", color=col, mfc=col if excl else "white", ms=7, mew=1.8)
    ax.axvline(0.0, color="black", lw=1, ls="--")
    ax.set_yticks(y, [r[0] for r in rows])
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.set_xlabel(xlabel)
    if title:
        ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
    return fig, ax


def plot_domain_heatmaps(series: Mapping[str, tuple], *, ncols: int = 3, title: str | None = None):
    """One heatmap per method: domain probability (rows: domains, columns: steps).

    Args:
        series: {label: (steps[T], domains[K], probs[T, K], source)}; `source` names the
            column family drawn ("domain_prob" or "domain_share"), shown in the panel title.

    Returns:
        (fig, axes) with axes a flat list of the panels in `series` order.
    """
    from matplotlib.colors import PowerNorm
    labels = list(series)
    n = max(len(labels), 1)
    ncols = min(ncols, n)
    nrows = (n + ncols - 1) // ncols
    kmax = max((len(v[1]) for v in series.values()), default=1)
    fig = _figure(4.2 * ncols, max(2.4, 0.18 * kmax + 1.6) * nrows)
    axes = [fig.add_subplot(nrows, ncols, i + 1) for i in range(n)]
    vmax = max((float(np.nanmax(v[2])) for v in series.values() if np.isfinite(v[2]).any()),
               default=1.0)
    im = None
    for ax, lab in zip(axes, labels):
        steps, doms, probs, src = series[lab]
        extent = (float(steps[0]) - 0.5, float(steps[-1]) + 0.5, len(doms) - 0.5, -0.5)
        # One colour scale for all panels (comparable), square-root stretched so that small
        # probabilities stay visible next to a sharp curriculum's peaks.
        im = ax.imshow(np.asarray(probs, dtype=float).T, aspect="auto", interpolation="nearest",
                       cmap="viridis", norm=PowerNorm(0.5, vmin=0.0, vmax=vmax), extent=extent)
        ax.set_yticks(range(len(doms)), doms, fontsize=7 if len(doms) > 8 else 8)
        ax.set_title(f"{lab} ({src})", fontsize=9)
        ax.set_xlabel("step", fontsize=8)
    if im is not None:
        fig.colorbar(im, ax=axes, shrink=0.8, label="probability")
    if title:
        fig.suptitle(title)
    return fig, axes


def plot_rankings(labels: Sequence[str], ranks: Mapping[str, np.ndarray], *, title: str | None = None,
                  colors: Mapping | None = None, ax=None):
    """Bump chart: each method's rank (1 = best, top) under each summary.

    Methods are named in a legend outside the axes, listed in their rank order under the
    first summary (top = best), so it reads like the left edge of the chart; labels written
    at the line ends overlapped on tied ranks and ran off the figure. Beyond 10 methods the
    markers and line styles vary too, since tab20's paired colours are close.

    Args:
        labels: M methods.
        ranks: {summary name: float[M] ranks}, drawn left to right in order.
    """
    names = list(ranks)
    fig = ax.figure if ax is not None else _figure(max(6.0, 1.1 * len(names) + 4.5), 0.35 * len(labels) + 2.2)
    ax = ax if ax is not None else fig.add_subplot()
    colors = colors or method_colors(list(labels))
    xs = np.arange(len(names))
    markers, styles = "osD^v<>p", ["-", "--", "-.", ":"]
    order = np.argsort(np.asarray(ranks[names[0]], dtype=float), kind="stable") if names else range(len(labels))
    handles = {}
    for i, lab in enumerate(labels):
        r = np.array([ranks[nm][i] for nm in names])
        many = len(labels) > 10
        (line,) = ax.plot(xs, r, color=colors.get(lab), lw=1.5, ms=4, marker=markers[i % 8] if many else "o",
                          ls=styles[(i // 8) % 4] if many else "-", label=lab)
        handles[lab] = line
    ax.set_xticks(xs, names, rotation=30, ha="right", fontsize=8)
    ax.set_ylim(len(labels) + 0.5, 0.5)
    ax.set_ylabel("rank (1 = best)")
    ax.legend([handles[labels[i]] for i in order], [labels[i] for i in order], fontsize=8,
              loc="center left", bbox_to_anchor=(1.01, 0.5), title=f"by rank under {names[0]}" if names else None,
              title_fontsize=8, frameon=False)
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    return fig, ax
