"""The demo's comparison of runs: a one-seed table from metrics.jsonl files (pure
functions; the efficiency figures are `rlpace.evaluation.efficiency_vs_baseline`'s), run
records for `rlpace report` (the converter `rlpace compare` uses), PNG plots drawn by
`rlpace.evaluation.plots`, and a small self-contained HTML page with a caption under each
figure."""

from __future__ import annotations

import html
import json
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ..evaluation import Curve

__all__ = ["load_run", "eval_curve", "compare_runs", "summary_lines", "format_table", "run_records",
           "plot_runs", "write_html", "CAPTIONS"]


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


def eval_curve(recs) -> "Curve":
    """The run's held-out curve, as `rlpace.evaluation.efficiency_vs_baseline` reads it: one
    entry per evaluation (the final one included) with the rollouts spent before it
    (`rollouts_total`: refills and probes included; an oracle's measurement rollouts are
    logged apart and not counted), its mean accuracy, the steps done and, where every step
    logs `tokens`, the generated tokens spent before it. An evaluation logged at step t ran
    before step t trained, so it had seen t steps."""
    from ..evaluation import Curve
    by_step = {}
    for r in _evals(recs):                      # a final evaluation repeating a step replaces it
        by_step[int(r["step"])] = r
    at = sorted(by_step)
    steps = [r for r in recs if not r.get("final")]
    tokens = None
    if steps and all("tokens" in r for r in steps):
        tokens = np.array([sum(r["tokens"] for r in steps if r["step"] < s) for s in at], dtype=np.float64)
    return Curve(np.array([rollouts_before(recs, s) for s in at], dtype=np.float64),
                 np.array([by_step[s]["eval/mean"] for s in at], dtype=np.float64),
                 np.array(at, dtype=np.float64), tokens)


def compare_runs(runs: dict[str, list[dict]], reference: str, *, fraction: float = 0.8, tail: int = 3) -> dict:
    """Per-policy summary of one seed: rollouts (and steps, tokens) to reach `fraction` of
    the reference's gain, final and base accuracy per distribution, informative-group
    fraction, rollouts, seconds.

    The metric is `rlpace.evaluation.efficiency_vs_baseline`'s, the one `rlpace report` and
    the benchmarks use: target = base + f·(reference final − base), base the reference's
    first evaluation, its final the mean of its last `tail` evaluations (3, as the trainer
    benchmarks: one evaluation is noisy); the cost to the target is interpolated linearly
    between evaluations; a run that never reaches it is censored at its own budget and its
    ratio is a lower bound ("≥"). When the reference gained nothing there is no target:
    `target` is None and `no_target` says why.

    Returns:
        {"target", "fraction", "tail", "reference", "reference_base", "reference_final",
        "no_target", "policies": {name: {"base", "final" (per distribution), "rollouts_to_target",
        "steps_to_target", "tokens_to_target" (NaN when not measured), "reached" (bool),
        "rollout_ratio", "step_ratio", "token_ratio", "auc_ratio" (to the reference; 1 for it),
        "ratio_bound" ("", "≥", "≤", "?"), "informative_fraction", "rollouts", "steps", "seconds"}}}
    """
    from ..evaluation import cost_to_reach, efficiency_vs_baseline

    curves = {n: eval_curve(r) for n, r in runs.items()}
    ref = curves[reference]
    ref_final = float(np.mean(ref.accuracy[-tail:]))
    out = {"target": None, "fraction": fraction, "tail": tail, "reference": reference,
           "reference_base": float(ref.accuracy[0]), "reference_final": ref_final, "no_target": None,
           "policies": {}}
    try:
        eff = efficiency_vs_baseline({n: {0: c} for n, c in curves.items()}, baseline=reference,
                                     fraction=fraction, tail=tail, n_boot=200, random_state=0)
        out["target"] = float(next(iter(eff.values())).target[0]) if eff else None
    except ValueError as e:                     # the reference gained nothing: no target
        eff, out["no_target"] = {}, str(e)
    if out["target"] is None and out["no_target"] is None:
        out["no_target"] = "only the reference ran: nothing to compare."
    nan = math.nan
    for name, recs in runs.items():
        ev = _evals(recs)
        steps = [r for r in recs if not r.get("final")]
        row = {"base": {k[5:]: v for k, v in ev[0].items() if k.startswith("eval/")},
               "final": {k[5:]: v for k, v in ev[-1].items() if k.startswith("eval/")},
               "rollouts_to_target": nan, "steps_to_target": nan, "tokens_to_target": nan, "reached": False,
               "rollout_ratio": nan, "step_ratio": nan, "token_ratio": nan, "auc_ratio": nan, "ratio_bound": "",
               "informative_fraction": float(np.mean([r["informative_groups"] for r in steps])),
               "rollouts": int(steps[-1]["rollouts_total"]), "steps": len(steps),
               "seconds": float(steps[-1]["seconds_total"])}
        if out["target"] is not None:
            c = curves[name]
            row["rollouts_to_target"], row["reached"] = cost_to_reach(c.rollouts, c.accuracy, out["target"])
            row["steps_to_target"] = cost_to_reach(c.steps, c.accuracy, out["target"])[0]
            if c.tokens is not None:
                row["tokens_to_target"] = cost_to_reach(c.tokens, c.accuracy, out["target"])[0]
            if name == reference:
                row.update(rollout_ratio=1.0, step_ratio=1.0, auc_ratio=1.0,
                           token_ratio=1.0 if c.tokens is not None else nan)
            else:
                e = eff[name]
                row.update(rollout_ratio=e.rollouts.estimate, ratio_bound=e.rollouts.bound,
                           step_ratio=e.steps.estimate if e.steps else nan,
                           token_ratio=e.tokens.estimate if e.tokens else nan,
                           auc_ratio=e.auc.estimate if e.auc else nan)
        out["policies"][name] = row
    return out


def summary_lines(cmp: dict, policy: str) -> list[str]:
    """The demo's headline, from `compare_runs`: rollouts to `fraction` of the reference's
    gain as a share of the reference's (one seed), then steps and the area as secondary
    lines; or, plainly, why there is no such figure."""
    ref, pct = cmp["reference"], f"{100 * cmp['fraction']:.0f} %"
    if cmp["target"] is None:
        return [f"no {pct}-of-gain target: {cmp['no_target']}"]
    p, r = cmp["policies"][policy], cmp["policies"][ref]
    z = r["rollouts_to_target"]
    if p["reached"]:
        head = (f"{policy} reached {pct} of {ref}'s gain with {100 * p['rollout_ratio']:.0f} % of {ref}'s "
                f"rollouts ({p['rollouts_to_target']:.0f} vs {z:.0f} rollouts; one seed)")
    else:
        head = (f"{policy} did not reach {pct} of {ref}'s gain within its budget of "
                f"{p['rollouts_to_target']:.0f} rollouts: ≥ {p['rollouts_to_target']:.0f}/{z:.0f} = "
                f"{100 * p['rollout_ratio']:.0f} % of {ref}'s rollouts (one seed)")
    lines = [head,
             f"target: base {cmp['reference_base']:.3f} + {cmp['fraction']:g} × ({ref} final "
             f"{cmp['reference_final']:.3f} − base) = {cmp['target']:.3f} held-out accuracy ({ref}'s final = "
             f"mean of its last {cmp['tail']} evaluations; costs interpolated between evaluations)",
             f"secondary: steps to the target {p['steps_to_target']:.1f} vs {r['steps_to_target']:.1f} "
             f"({'≥ ' if p['ratio_bound'] else ''}{p['step_ratio']:.2f}×); area under accuracy vs rollouts "
             f"{p['auc_ratio']:.2f}× {ref}'s (> 1 = better)"]
    return lines


def format_table(cmp: dict) -> str:
    """The summary as fixed-width text: held-out accuracy per distribution (base, then
    each policy's final), then rollouts and steps to the fraction-of-gain target (and the
    ratio to the reference; "≥" marks a run censored at its budget), informative
    fraction, rollouts spent."""
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

    def cost(key, digits):
        def f(p):
            if not np.isfinite(p[key]):
                return "—"
            return ("" if p["reached"] else "≥") + f"{p[key]:.{digits}f}"
        return f
    pct = f"{100 * cmp['fraction']:.0f} %"
    if cmp["target"] is not None:                # else summary_lines says why there is none
        lines.append(f"target = {pct} of {cmp['reference']}'s gain: {cmp['target']:.3f}")
        lines.append(row("rollouts to target", cost("rollouts_to_target", 0)))
        lines.append(row(f"× {cmp['reference']}'s rollouts",
                         lambda p: f"{p['ratio_bound']}{p['rollout_ratio']:.2f}"))
        lines.append(row("steps to target", cost("steps_to_target", 1)))
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


def _family(dist: str) -> str:
    """'add2' -> 'add' (the embedded suite's task family); other names are their own family."""
    m = re.match(r"^([A-Za-z_]+?)(\d+)$", dist)
    return m.group(1) if m else dist


def run_records(runs: dict[str, list[dict]], cfgs: dict, *, seed: int, target: float | None,
                seconds: dict[str, float] | None = None) -> dict[str, dict]:
    """One run record (docs/run-records.md) per demo run, built by the converter every
    rlpace producer uses (`rlpace.experiments.record_from_step_log`), so the demo's runs are
    read by the same evaluation code as `rlpace compare`'s: written under `<out>/runs/`,
    several demo seeds in one --out folder make a matrix for `rlpace report`.

    Args:
        runs: {label: the run's metrics.jsonl rows}; cfgs: {label: its TrainConfig}.
    """
    from ..experiments import record_from_step_log
    out = {}
    for label, rows in runs.items():
        cfg = cfgs[label]
        dists = sorted({k[5:] for r in rows for k in r if k.startswith("eval/") and k != "eval/mean"})
        out[label] = record_from_step_log(
            rows, run_id=f"demo__{cfg.tasks}__{label.replace('/', '_')}__seed{seed}", label=label,
            policy=cfg.policy, policy_kwargs=json.loads(cfg.policy_kwargs), seed=seed, suite=cfg.tasks,
            backend="embedded", budget_steps=cfg.steps, config={"train": cfg.to_dict(), "producer": "rlpace demo"},
            batch_size=cfg.batch_prompts, group_size=cfg.group_size, eval_every=cfg.eval_every, target=target,
            seconds=(seconds or {}).get(label), benchmark_domains={d: _family(d) for d in dists})
    return out


#: What each demo figure shows and how to read it (the HTML prints it under the image).
CAPTIONS = {
    "accuracy.png": "Mean greedy held-out accuracy over the distributions (unweighted mean of the per-"
                    "distribution accuracies), evaluated every eval_every steps, for each policy. Higher "
                    "and earlier is better; the dashed line is the target: 80 % of the reference policy's "
                    "gain, base + 0.8 × (its final accuracy, mean of its last 3 evaluations − base). One "
                    "seed: differences of a few points are within seed noise.",
    "per_domain.png": "The same held-out accuracy, one panel per distribution (x: training step, y: greedy "
                      "accuracy on that distribution's held-out prompts). It shows where a policy's gain "
                      "or loss comes from: distributions the base already solves stay near 1, the hardest "
                      "near 0; scheduling matters on the ones in between.",
    "domain_probs.png": "Where each policy spent its batches: for every distribution (rows) and step "
                        "(columns), the share of the proposed prompts drawn from it (10-step moving mean; "
                        "the same quantity for every policy, so the panels compare). Uniform stays at its "
                        "pool share (1/K each); an adaptive policy's bright rows are the distributions it "
                        "favours, and their drift over steps is its curriculum.",
    "informative.png": "Share of the generated groups whose rollouts did not all get the same reward "
                       "(non-zero GRPO advantage, so they carry a learning signal), 10-step moving mean. "
                       "Higher means fewer rollouts wasted on prompts that are already solved or still "
                       "impossible.",
}


def plot_runs(runs: dict[str, list[dict]], out_dir, target: float | None = None,
              reference: str | None = None) -> list[Path]:
    """accuracy.png (mean held-out accuracy per policy), per_domain.png (one panel per
    distribution), domain_probs.png (each policy's proposed share per distribution, a
    heatmap: legible for any number of distributions), informative.png (share of groups
    with non-zero advantage). The curves and heatmaps are drawn by `rlpace.evaluation.plots`,
    the report's own plotting code; captions in `CAPTIONS`."""
    from ..evaluation import plots

    out_dir = Path(out_dir)
    colors = plots.method_colors(list(runs))
    if reference in colors:
        colors[reference] = "black"                 # as plot_learning_curves draws the baseline
    paths = []

    def save(fig, name):
        paths.append(out_dir / name)
        fig.savefig(paths[-1], dpi=110)

    curves = {}
    for name, recs in runs.items():
        ev = _evals(recs)
        x, m = np.array([r["step"] for r in ev], float), np.array([r["eval/mean"] for r in ev], float)
        curves[name] = (x, m, m, m)                 # one seed: no band
    fig, ax = plots.plot_learning_curves(curves, baseline=reference, colors=colors, xlabel="training step",
                                         ylabel="held-out accuracy, mean over distributions",
                                         title="Held-out accuracy over training (greedy, one seed)")
    if target is not None:
        ax.axhline(target, color="gray", ls="--", lw=1, label=f"target {target:.3f}")
        ax.legend(fontsize=8, loc="lower right")
    ax.set_ylim(0, 1.02)
    save(fig, "accuracy.png")

    doms = sorted({k[5:] for recs in runs.values() for r in _evals(recs) for k in r
                   if k.startswith("eval/") and k != "eval/mean"})
    cols = 4
    rows = max(1, math.ceil(len(doms) / cols))
    fig = plots._figure(2.7 * cols, 1.9 * rows + 0.9)
    axes = fig.subplots(rows, cols, sharex=True, sharey=True, squeeze=False)
    for ax, d in zip(axes.ravel(), doms):
        for name, recs in runs.items():
            ev = [r for r in _evals(recs) if f"eval/{d}" in r]
            ax.plot([r["step"] for r in ev], [r[f"eval/{d}"] for r in ev], label=name, color=colors[name],
                    lw=2.0 if name == reference else 1.4)
        ax.set_title(d, fontsize=9)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
    for ax in axes.ravel()[len(doms):]:
        ax.axis("off")
    axes[0, 0].legend(fontsize=7)
    fig.supxlabel("training step", fontsize=9)
    fig.supylabel("held-out accuracy (greedy)", fontsize=9)
    fig.suptitle("Held-out accuracy per distribution")
    save(fig, "per_domain.png")

    series = {}
    for name, recs in runs.items():
        steps = [r for r in recs if not r.get("final")]
        key = "sched/domain_share/"
        names = sorted({k[len(key):] for r in steps for k in r if k.startswith(key)})
        if not names:
            continue
        mat = np.array([[r.get(key + d, 0.0) for d in names] for r in steps], dtype=float)
        mat = np.stack([_smooth(mat[:, j]) for j in range(mat.shape[1])], axis=1)
        series[name] = (np.array([r["step"] for r in steps]), names, mat, "proposed share, 10-step mean")
    if series:
        fig, _ = plots.plot_domain_heatmaps(series, ncols=len(series),
                                            title="Share of proposed prompts per distribution")
        save(fig, "domain_probs.png")

    fig = plots._figure(6.4, 3.8)
    ax = fig.add_subplot()
    for name, recs in runs.items():
        steps = [r for r in recs if not r.get("final")]
        ax.plot([r["step"] for r in steps], _smooth([r["informative_groups"] for r in steps]), label=name,
                color=colors[name], lw=2.0 if name == reference else 1.4)
    ax.set(xlabel="training step", ylabel="informative groups (10-step mean)", ylim=(0, 1.02),
           title="Share of groups with non-zero advantage")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save(fig, "informative.png")
    return paths


def write_html(path, *, title: str, table: str, images, notes: str = "", captions=None) -> Path:
    """A self-contained page: the text table and the PNGs (linked by file name), each with
    its caption (`captions`: {file name: text}, default `CAPTIONS`)."""
    path = Path(path)
    captions = CAPTIONS if captions is None else captions
    from ..evaluation._report import figure_html     # the one figure + caption markup
    figs = [figure_html(Path(p).name, captions.get(Path(p).name, ""), Path(p).stem) for p in images]
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto}}"
            f"pre{{background:#f6f6f6;padding:1em}}figure{{margin:1.5em 0}}"
            f"figcaption{{font-size:0.9em;color:#333;max-width:900px}}</style></head><body>"
            f"<h1>{html.escape(title)}</h1><p>{html.escape(notes)}</p><pre>{html.escape(table)}</pre>"
            f"{''.join(figs)}</body></html>")
    path.write_text(page)
    return path
