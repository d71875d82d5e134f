"""Summary statistics of a prepared dataset, and their plot (statistics apart from
drawing, STYLE §8)."""

from __future__ import annotations

import numpy as np


def summarize(cluster_ids: np.ndarray, difficulty: np.ndarray | None, *, bins: int = 10) -> dict:
    """Cluster sizes and a difficulty histogram per cluster over shared bin edges.

    Returns:
        {"n_rows", "n_clusters", "cluster_sizes": [C],
         "difficulty": None | {"bin_edges": [bins+1], "per_cluster": [
             {"cluster_id", "size", "min", "median", "mean", "max", "hist": [bins]}]}}
        Histogram counts of a cluster sum to its size (NaN scores are left out and counted
        in "n_nan").

    Example:
        >>> s = summarize(np.array([0, 0, 1]), np.array([0.0, 1.0, 0.5]), bins=2)
        >>> s["cluster_sizes"], s["difficulty"]["per_cluster"][0]["hist"]
        ([2, 1], [1, 1])
    """
    c = np.asarray(cluster_ids, dtype=np.int64)
    k = int(c.max()) + 1 if c.size else 0
    sizes = np.bincount(c, minlength=k)
    out = {"n_rows": int(c.size), "n_clusters": k, "cluster_sizes": sizes.tolist(), "difficulty": None}
    if difficulty is None:
        return out
    d = np.asarray(difficulty, dtype=np.float64)
    ok = ~np.isnan(d)
    if not ok.any():
        return out
    lo, hi = float(d[ok].min()), float(d[ok].max())
    edges = np.linspace(lo, hi if hi > lo else lo + 1.0, bins + 1)
    per = []
    for j in range(k):
        dj = d[(c == j) & ok]
        hist = np.histogram(dj, bins=edges)[0] if dj.size else np.zeros(bins, dtype=np.int64)
        stats = ({"min": float(dj.min()), "median": float(np.median(dj)), "mean": float(dj.mean()),
                  "max": float(dj.max())} if dj.size else
                 {"min": None, "median": None, "mean": None, "max": None})
        per.append({"cluster_id": j, "size": int(sizes[j]), **stats, "hist": hist.tolist(),
                    "n_nan": int(((c == j) & ~ok).sum())})
    out["difficulty"] = {"bin_edges": edges.tolist(), "per_cluster": per}
    return out


def plot_summary(summary: dict):
    """Cluster sizes (bars) and, when scored, each cluster's difficulty histogram as a
    heat-map row (share of the cluster per bin). Returns (fig, axes).

    Example:
        >>> fig, axes = plot_summary(summarize(np.array([0, 1, 1]), np.array([1.0, 2.0, 3.0])))
        >>> axes.shape
        (1, 2)
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    sizes = summary["cluster_sizes"]
    diff = summary.get("difficulty")
    ncols = 2 if diff else 1
    fig, axes = plt.subplots(1, ncols, figsize=(6 * ncols, 4), squeeze=False)
    ax = axes[0, 0]
    ax.bar(np.arange(len(sizes)), sizes, color="tab:blue")
    ax.set_xlabel("cluster_id")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("rows")
    ax.set_title(f"cluster sizes (N={summary['n_rows']}, C={len(sizes)})")
    if diff:
        hist = np.array([p["hist"] for p in diff["per_cluster"]], dtype=np.float64)
        share = hist / np.maximum(hist.sum(1, keepdims=True), 1)
        edges = diff["bin_edges"]
        ax = axes[0, 1]
        im = ax.imshow(share, aspect="auto", origin="lower", cmap="viridis",
                       extent=(edges[0], edges[-1], -0.5, len(sizes) - 0.5))
        ax.set_xlabel("difficulty (mean answer NLL, nats/token)")
        ax.set_ylabel("cluster_id")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title("difficulty histogram per cluster (share of rows)")
        fig.colorbar(im, ax=ax)
    fig.tight_layout()
    return fig, axes
