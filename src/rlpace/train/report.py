"""The demo's comparison of runs: statistics from metrics.jsonl files (pure functions),
PNG plots (matplotlib, Agg) and a small self-contained HTML page."""

from __future__ import annotations

import html
import json
import math
from pathlib import Path

import numpy as np

__all__ = ["load_run", "compare_runs", "format_table", "plot_runs", "write_html"]


def load_run(directory) -> list[dict]:
    """The step records of a run (its metrics.jsonl)."""
    path = Path(directory) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _evals(recs):
    return [r for r in recs if "eval/mean" in r]


def rollouts_before(recs, step) -> int:
    """Rollouts spent before `step` started (what the evaluation at `step` had seen), from
    per-step log records (the final evaluation record is skipped)."""
    before = [r["rollouts_total"] for r in recs if not r.get("final") and r["step"] < step]
    return int(before[-1]) if before else 0


def first_reach(recs, target: float) -> tuple[float, float]:
    """(steps, rollouts) spent before the first evaluation with mean accuracy ≥ target;
    (nan, nan) when never reached."""
    for r in _evals(recs):
        if r["eval/mean"] >= target - 1e-12:
            return float(r["step"]), float(rollouts_before(recs, r["step"]))
    return math.nan, math.nan


def compare_runs(runs: dict[str, list[dict]], reference: str, last_k: int = 3) -> dict:
    """Per-policy summary: steps/rollouts to reach the target, final and base accuracy per
    distribution, informative-group fraction, rollouts, seconds.

    The target is the reference run's final mean accuracy, taken as the mean of its last
    `last_k` evaluations because a single evaluation is noisy (the learning-efficiency
    benchmark uses the same definition)."""
    ref_final = float(np.mean([r["eval/mean"] for r in _evals(runs[reference])[-last_k:]]))
    out = {"target": ref_final, "reference": reference, "policies": {}}
    for name, recs in runs.items():
        ev = _evals(recs)
        steps = [r for r in recs if not r.get("final")]
        s, ro = first_reach(recs, ref_final)
        out["policies"][name] = {
            "base": {k[5:]: v for k, v in ev[0].items() if k.startswith("eval/")},
            "final": {k[5:]: v for k, v in ev[-1].items() if k.startswith("eval/")},
            "steps_to_target": s, "rollouts_to_target": ro,
            "informative_fraction": float(np.mean([r["informative_groups"] for r in steps])),
            "rollouts": int(steps[-1]["rollouts_total"]), "steps": len(steps),
            "seconds": float(steps[-1]["seconds_total"]),
        }
    return out


def format_table(cmp: dict) -> str:
    """The summary as fixed-width text: held-out accuracy per distribution (base, then
    each policy's final), then steps to target, informative fraction, rollouts."""
    names = list(cmp["policies"])
    first = cmp["policies"][names[0]]
    doms = [d for d in first["base"] if d != "mean"] + ["mean"]
    w = max(12, *(len(n) + 2 for n in names))
    lines = [f"{'held-out acc.':14s}{'base':>8s}" + "".join(f"{n:>{w}s}" for n in names)]
    for d in doms:
        lines.append(f"{d:14s}{first['base'][d]:8.2f}" + "".join(f"{cmp['policies'][n]['final'][d]:{w}.2f}" for n in names))
    lines.append("-" * len(lines[0]))

    def row(label, fmt):
        return f"{label:22s}" + "".join(f"{fmt(cmp['policies'][n]):>{w}s}" for n in names)
    fmt_num = lambda x: "never" if not np.isfinite(x) else f"{x:.0f}"     # noqa: E731
    lines.append(f"target = final mean accuracy of {cmp['reference']} (mean of its last 3 evaluations): "
                 f"{cmp['target']:.3f}")
    lines.append(row("steps to target", lambda p: fmt_num(p["steps_to_target"])))
    lines.append(row("rollouts to target", lambda p: fmt_num(p["rollouts_to_target"])))
    lines.append(row("informative groups", lambda p: f"{p['informative_fraction']:.2f}"))
    lines.append(row("rollouts spent", lambda p: f"{p['rollouts']}"))
    lines.append(row("steps", lambda p: f"{p['steps']}"))
    lines.append(row("train seconds", lambda p: f"{p['seconds']:.0f}"))
    return "\n".join(lines)


def _smooth(x, k=10):
    x = np.asarray(x, dtype=float)
    if x.size == 0:
        return x
    c = np.cumsum(np.insert(x, 0, 0.0))
    lo = np.maximum(0, np.arange(1, x.size + 1) - k)
    return (c[1:] - c[lo]) / (np.arange(1, x.size + 1) - lo)


def plot_runs(runs: dict[str, list[dict]], out_dir, target: float | None = None) -> list[Path]:
    """accuracy.png (mean held-out accuracy per policy), per_domain.png, domain_probs.png
    (each policy's domain probabilities, or the proposed shares when it has no mixture),
    informative.png (share of groups with non-zero advantage, 10-step mean)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    paths = []
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for name, recs in runs.items():
        ev = _evals(recs)
        ax.plot([r["step"] for r in ev], [r["eval/mean"] for r in ev], marker="o", ms=3, label=name)
    if target is not None:
        ax.axhline(target, color="gray", ls="--", lw=1, label="target")
    ax.set(xlabel="step", ylabel="mean held-out accuracy (greedy)", ylim=(0, 1.02),
           title="Held-out accuracy over training")
    ax.legend()
    fig.tight_layout()
    paths.append(out_dir / "accuracy.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    doms = sorted({k[5:] for recs in runs.values() for r in _evals(recs) for k in r
                   if k.startswith("eval/") and k != "eval/mean"})
    cols = 4
    rows = max(1, math.ceil(len(doms) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(2.6 * cols, 1.9 * rows), sharex=True, sharey=True, squeeze=False)
    for ax, d in zip(axes.ravel(), doms):
        for name, recs in runs.items():
            ev = [r for r in _evals(recs) if f"eval/{d}" in r]
            ax.plot([r["step"] for r in ev], [r[f"eval/{d}"] for r in ev], label=name)
        ax.set_title(d, fontsize=9)
        ax.set_ylim(-0.02, 1.02)
    for ax in axes.ravel()[len(doms):]:
        ax.axis("off")
    axes[0, 0].legend(fontsize=7)
    fig.suptitle("Held-out accuracy per distribution")
    fig.tight_layout()
    paths.append(out_dir / "per_domain.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)

    fig, axes = plt.subplots(1, len(runs), figsize=(5 * len(runs), 3.6), squeeze=False, sharey=True)
    for ax, (name, recs) in zip(axes[0], runs.items()):
        steps = [r for r in recs if not r.get("final")]
        key = "sched/domain_prob/" if any(k.startswith("sched/domain_prob/") for k in steps[0]) else "sched/domain_share/"
        names = sorted({k[len(key):] for r in steps for k in r if k.startswith(key)})
        mat = np.array([[r.get(key + d, 0.0) for d in names] for r in steps])
        if key.endswith("share/"):
            mat = np.stack([_smooth(mat[:, j]) for j in range(mat.shape[1])], axis=1)
        colors = plt.get_cmap("tab20")(np.linspace(0, 1, 20))[:len(names)] if len(names) > 10 else None
        ax.stackplot([r["step"] for r in steps], mat.T, labels=names, colors=colors)
        ax.set(title=f"{name}: {'domain probabilities' if 'prob' in key else 'proposed share (10-step mean)'}",
               xlabel="step", ylim=(0, 1))
    axes[0, -1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    paths.append(out_dir / "domain_probs.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for name, recs in runs.items():
        steps = [r for r in recs if not r.get("final")]
        ax.plot([r["step"] for r in steps], _smooth([r["informative_groups"] for r in steps]), label=name)
    ax.set(xlabel="step", ylabel="informative groups (10-step mean)", ylim=(0, 1.02),
           title="Share of groups with non-zero advantage")
    ax.legend()
    fig.tight_layout()
    paths.append(out_dir / "informative.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


def write_html(path, *, title: str, table: str, images, notes: str = "") -> Path:
    """A self-contained page: the text table and the PNGs (linked by file name)."""
    path = Path(path)
    imgs = "\n".join(f'<p><img src="{html.escape(Path(p).name)}" style="max-width:100%"></p>' for p in images)
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto}}"
            f"pre{{background:#f6f6f6;padding:1em}}</style></head><body>"
            f"<h1>{html.escape(title)}</h1><p>{html.escape(notes)}</p><pre>{html.escape(table)}</pre>{imgs}"
            f"</body></html>")
    path.write_text(page)
    return path
