"""Render an `Analysis` as report.html (self-contained, images embedded) and summary.md
(tables, figures linked from figures/). Statistics come computed; this module formats
numbers and calls the plotting functions.
"""

from __future__ import annotations

import base64
import html
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from . import plots
from ._analysis import Analysis, analyze, efficiency_table
from ._tables import ess_fractions

__all__ = ["ReportFiles", "write_report", "zero_verdict"]


@dataclass(frozen=True)
class ReportFiles:
    html: Path
    markdown: Path
    figures: dict          # name -> Path of the PNG
    analysis: Analysis = field(repr=False)


# ---- number formatting -----------------------------------------------------------------------

def _scale(a: Analysis) -> tuple[float, str, str]:
    """Accuracies in [0, 1] are shown in percent and differences in percentage points."""
    v = a.matrix.values
    if np.isfinite(v).any() and np.nanmin(v) >= 0 and np.nanmax(v) <= 1:
        return 100.0, "%", "pp"
    return 1.0, "", ""


def _f(x: float | None, scale: float = 1.0, digits: int = 2, signed: bool = False) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return f"{x * scale:+.{digits}f}" if signed else f"{x * scale:.{digits}f}"


def _ci(lo: float, hi: float, scale: float, digits: int = 2) -> str:
    if lo is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return "–"
    return f"[{lo * scale:+.{digits}f}, {hi * scale:+.{digits}f}]"


def _p(p: float | None) -> str:
    if p is None or not math.isfinite(p):
        return "–"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def _ratio(r) -> str:
    if r is None:
        return "–"
    if r.reached_method == 0 and r.reached_baseline == 0:
        return f"target not reached (0/{r.n} seeds either way)"
    s = f"{r.estimate:.2f}× {_ci_plain(r.low, r.high)}"
    if r.censored:
        s += f" (censored: reached {r.reached_method}/{r.n} vs {r.reached_baseline}/{r.n})"
    return s


def _ci_plain(lo: float, hi: float) -> str:
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return ""
    return f"[{lo:.2f}, {hi:.2f}]"


#: verdicts that agree with the Holm-adjusted p (highlighted in the HTML table)
SIGNIFICANT = ("yes (both)", "t only", "bootstrap only")


def zero_verdict(cp) -> str:
    """Do the paired CIs exclude 0, and does the Holm-adjusted p agree?

    "yes (both)", "t only" or "bootstrap only" when those CIs exclude 0 *and* the Holm p
    (printed beside the verdict) is below α = 1 − confidence; "unadjusted only (both|t|
    bootstrap)" when a CI excludes 0 but the Holm p does not (the CIs are per comparison,
    Holm corrects for testing every method against the baseline); "no" otherwise.
    """
    if cp.t is None:
        return "–"
    ex_t, ex_b = cp.t.excludes_zero, cp.boot.excludes_zero
    if not (ex_t or ex_b):
        return "no"
    which = "both" if ex_t and ex_b else "t" if ex_t else "bootstrap"
    alpha = round(1.0 - cp.t.confidence, 12)       # 1 − 0.95 is 0.050000000000000044 in floats
    if cp.p_holm is not None and not cp.p_holm < alpha:
        return f"unadjusted only ({which})"
    return {"both": "yes (both)", "t": "t only", "bootstrap": "bootstrap only"}[which]


# ---- tables as rows (shared by HTML and Markdown) ------------------------------------------

def _diff_table(a: Analysis) -> tuple[list[str], list[list[str]]]:
    sc, unit, dunit = _scale(a)
    conf = f"{a.confidence:.0%}"
    head = ["method", "paired seeds", f"mean{f' ({unit})' if unit else ''}",
            f"Δ vs {a.baseline}{f' ({dunit})' if dunit else ''}", f"{conf} CI (t)", f"{conf} CI (bootstrap)",
            "zero excluded?", "p (t)", "p (Holm)", "P(improvement) [CI]"]
    if a.target is not None:
        head += [f"steps-to-{a.target['target']:.2f} speed-up [CI]", "rollouts-to-target speed-up [CI]"]
    rows = []
    base_row = [a.baseline + " (baseline)", "", "", "", "", "", "", "", "", ""]
    bi = a.matrix.index(a.baseline)
    primary = next(iter(a.summaries))
    b = a.summary_scores[primary][bi]
    base_row[1] = str(int(np.sum(~np.isnan(b))))
    base_row[2] = _f(float(np.nanmean(b)) if np.isfinite(b).any() else None, sc)
    if a.target is not None:
        base_row += ["1.00×", "1.00×"]
    rows.append(base_row)
    for cp in a.comparisons:
        if cp.t is None:
            row = [cp.label, str(cp.n_pairs), _f(cp.mean, sc), "–", "–", "–", cp.note, "–", "–", "–"]
        else:
            row = [cp.label, str(cp.n_pairs), _f(cp.mean, sc), _f(cp.t.estimate, sc, signed=True),
                   _ci(cp.t.low, cp.t.high, sc), _ci(cp.boot.low, cp.boot.high, sc), zero_verdict(cp),
                   _p(cp.t.p_value), _p(cp.p_holm),
                   f"{cp.poi.estimate:.2f} {_ci_plain(cp.poi.low, cp.poi.high)}"]
        if a.target is not None:
            row += [_ratio(cp.steps_ratio), _ratio(cp.rollouts_ratio)]
        rows.append(row)
    return head, rows


def _bench_table(a: Analysis) -> tuple[list[str], list[list[str]]]:
    sc, unit, _ = _scale(a)
    sm = a.matrix
    head = ["method"] + [f"{b}" + (f" [{d}]" if d != b else "")
                         for b, d in zip(sm.benchmarks, sm.benchmark_domains)]
    rows = [[lab] + [_f(v, sc, 1) for v in a.benchmark_means[i]] for i, lab in enumerate(sm.labels)]
    return head, rows


def _ranking_tables(a: Analysis) -> tuple[tuple, tuple]:
    primary = next(iter(a.summaries))
    head1 = ["summary", f"Spearman ρ vs {primary}", f"Kendall τ vs {primary}"]
    rows1 = [[name, _f(r.spearman, 1, 2), _f(r.kendall, 1, 2)] for name, r in a.ranking.items()]
    names = [primary] + list(a.ranking)
    head2 = ["method"] + names
    rows2 = []
    for i, lab in enumerate(a.ranking_labels):
        first = next(iter(a.ranking.values())) if a.ranking else None
        r0 = first.ranks_a[i] if first is not None else float("nan")
        rows2.append([lab, _f(r0, 1, 1)] + [_f(a.ranking[nm].ranks_b[i], 1, 1) for nm in a.ranking])
    return (head1, rows1), (head2, rows2)


def _status_lines(a: Analysis) -> list[str]:
    sm = a.matrix
    n_cells = len(sm.labels) * len(sm.seeds)
    lines = []
    if sm.missing or sm.excluded or a.failed:
        lines.append(f"PARTIAL RESULTS: {n_cells - len(sm.missing)} of {n_cells} (method, seed) runs are "
                     f"complete. Statistics use the complete, paired runs only.")
    by_label: dict[str, list] = {}
    for lab, seed in sm.missing:
        by_label.setdefault(lab, []).append(seed)
    for lab, seeds in by_label.items():
        lines.append(f"missing: {lab} seeds {seeds}")
    for rid, lab, seed, why in sm.excluded:
        lines.append(f"partial (left out of the statistics): {rid} — {why}")
    for rid, err in a.failed:
        lines.append(f"failed: {rid} — {err}")
    return lines


# ---- figures -------------------------------------------------------------------------------

def _figures(a: Analysis, fig_dir: Path) -> dict:
    fig_dir.mkdir(parents=True, exist_ok=True)
    sc, unit, dunit = _scale(a)
    out = {}
    colors = plots.method_colors(list(a.labels))

    def save(name, fig):
        path = fig_dir / f"{name}.png"
        fig.savefig(path, dpi=100)
        out[name] = path

    rows = [(cp.label, cp.boot.estimate * sc, cp.boot.low * sc, cp.boot.high * sc)
            for cp in a.comparisons if cp.boot is not None]
    if rows:
        fig, _ = plots.plot_forest(rows, xlabel=f"paired difference vs {a.baseline} "
                                   f"({dunit or 'score'}), {a.confidence:.0%} bootstrap CI",
                                   title=f"{next(iter(a.summaries))}: paired differences")
        save("forest", fig)
    for name, curves, xlabel in (("curves_step", a.curves, "training step"),
                                 ("curves_rollouts", a.curves_rollouts, "rollouts spent")):
        if curves:
            scaled = {lab: (x, m * sc, lo * sc, hi * sc) for lab, (x, m, lo, hi) in curves.items()}
            fig, _ = plots.plot_learning_curves(
                scaled, baseline=a.baseline, xlabel=xlabel, colors=colors,
                ylabel=f"held-out accuracy, mean over distributions{f' ({unit})' if unit else ''}",
                title=f"learning curves (mean over seeds, {a.confidence:.0%} t band)")
            save(name, fig)
    if a.domain_probs:
        fig, _ = plots.plot_domain_heatmaps(a.domain_probs, title="domain probability over training "
                                            "(mean over seeds)")
        save("domain_probs", fig)
    if a.ranking:
        first = next(iter(a.ranking.values()))
        ranks = {next(iter(a.summaries)): first.ranks_a,
                 **{name: r.ranks_b for name, r in a.ranking.items()}}
        fig, _ = plots.plot_rankings(list(a.ranking_labels), ranks, colors=colors,
                                     title="method rank under each summary")
        save("rankings", fig)
    return out


# ---- rendering -----------------------------------------------------------------------------

def _md_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    esc = lambda s: str(s).replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(map(esc, head)) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(map(esc, r)) + " |" for r in rows]
    return "\n".join(lines)


def _html_table(head: Sequence[str], rows: Sequence[Sequence[str]], cls: str = "") -> str:
    th = "".join(f"<th>{html.escape(str(h))}</th>" for h in head)
    body = []
    for r in rows:
        tds = []
        for j, v in enumerate(r):
            txt = html.escape(str(v))
            klass = ""
            if v in SIGNIFICANT:
                klass = ' class="excl"'
            tds.append(f"<td{klass}>{txt}</td>")
        body.append("<tr>" + "".join(tds) + "</tr>")
    return f'<table class="{cls}"><thead><tr>{th}</tr></thead><tbody>{"".join(body)}</tbody></table>'


_CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px;color:#222;max-width:1150px}
h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:12px;margin:8px 0}
th,td{border:1px solid #ccc;padding:3px 6px;text-align:right}th{background:#f3f3f3}
td:first-child,th:first-child{text-align:left}
td.excl{background:#e6f4e6;font-weight:bold}
.warn{background:#fff3cd;border:1px solid #e0c060;padding:8px;margin:8px 0;font-size:13px}
.note{font-size:13px;color:#444}
img{max-width:100%;border:1px solid #eee;margin:6px 0}
code{background:#f5f5f5;padding:1px 3px}
"""


def figure_html(src: str, caption: str, name: str) -> str:
    """One figure with its caption under it: the figure markup of every rlpace HTML page
    (`rlpace report`, `rlpace compare`, the demo's report). `src` is a file name or a data
    URI; `name` identifies the figure (id `fig-<name>`, alt text when there is no caption)."""
    esc = html.escape
    return (f'<figure id="fig-{esc(name)}"><img alt="{esc(caption or name)}" src="{esc(src)}" '
            f'style="max-width:100%"><figcaption>{esc(caption)}</figcaption></figure>')


def _img_tag(path: Path, caption: str, name: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return figure_html(f"data:image/png;base64,{data}", caption, name)


def report_captions(a: Analysis) -> dict[str, str]:
    """What each report figure shows and how to read it (printed under the image)."""
    c, b = f"{a.confidence:.0%}", a.baseline
    return {
        "forest": f"Each method's paired difference from {b} on the primary summary (held-out accuracy, method − "
                  f"{b} on the same seed, mean over seeds) with its {c} percentile bootstrap interval. An interval "
                  f"right of 0 is better than {b}; one that crosses 0 is not distinguished from it.",
        "curves_step": f"Held-out mean accuracy over training steps, mean over seeds with a {c} t band. Higher "
                       f"and earlier is better; overlapping bands are within seed noise.",
        "curves_rollouts": f"The same curves against rollouts spent (refills and probes included): a method that "
                           f"generates more per step moves right. Compare at equal rollouts, the efficiency table's "
                           f"axis.",
        "domain_probs": "Where each policy spent its batches: for every distribution (rows) and step (columns) the "
                        "share of proposed prompts drawn from it, mean over seeds. Uniform stays at the pool share; "
                        "bright rows are the distributions a policy favours.",
        "rankings": "Each method's rank (1 = best) under every benchmark summary. Lines that cross mean the ranking "
                    "depends on how the held-out distributions are weighted.",
    }


def _sections(a: Analysis) -> dict:
    sm = a.matrix
    primary = next(iter(a.summaries))
    header = (f"Suite `{sm.suite}`, budget {json.dumps(sm.budget)}; {len(sm.labels)} methods × "
              f"{len(sm.seeds)} seeds {list(sm.seeds)}; baseline `{a.baseline}`; primary summary "
              f"`{primary}` (weights over {len(sm.benchmarks)} held-out distributions). Paired "
              f"differences are per seed (method − baseline on the same seed), {a.confidence:.0%} "
              f"intervals: paired t and paired percentile bootstrap. \"Zero excluded?\" says which "
              f"intervals exclude 0 and agrees with the Holm-adjusted p beside it: \"yes\" only when that "
              f"p < {1 - a.confidence:.2g}; \"unadjusted only\" when an interval excludes 0 but Holm's "
              f"correction for comparing every method with the baseline does not.")
    if a.target is not None:
        header += (f" Speed-ups: mean(baseline) / mean(method) of the steps (rollouts) to reach a "
                   f"held-out mean accuracy of {a.target['target']:.3f} (target from the "
                   f"{a.target['source']}), paired bootstrap CI; a run that never reaches it counts "
                   f"as its whole budget and the ratio is marked censored.")
    eff_head, eff_rows = efficiency_table(a)
    ess = ess_fractions(sm)
    if eff_rows and any(math.isfinite(v) for v in ess.values()):
        # importance-weighting methods (criticality_is, criticality_grid) log the ESS of their
        # loss weights; blank for the others, whose weights are 1
        eff_head = eff_head + ["ESS / B (loss weights)"]
        eff_rows = [row + ["" if not math.isfinite(ess.get(row[0], math.nan)) else f"{ess[row[0]]:.2f}"]
                    for row in eff_rows]
    eff_note = (f"Efficiency: per seed the target is base + {a.gain_fraction:.0%}·({a.baseline}'s final − base); "
                f"the cost of a run is the rollouts (refills and probes included), generated tokens and steps "
                f"it spent to reach it, linearly interpolated between evaluations; a run that never reaches it "
                f"counts its own budget and the ratio is a bound (≥, ≤, or ? when both sides are censored). "
                f"Ratios < 1 are cheaper than {a.baseline}; the area under accuracy vs rollouts (up to the "
                f"smallest budget) > 1 is better. Paired ratio of means over seeds, {a.confidence:.0%} "
                f"bootstrap CI.")
    return {"header": header, "status": _status_lines(a), "diff": _diff_table(a),
            "bench": _bench_table(a), "ranking": _ranking_tables(a),
            "efficiency": (eff_head, eff_rows, eff_note)}


def _render_md(a: Analysis, sec: dict, figs: dict, title: str) -> str:
    (h1, r1), (h2, r2) = sec["ranking"]
    out = [f"# {title}", "", sec["header"], ""]
    if sec["status"]:
        out += ["**" + sec["status"][0] + "**", ""] + [f"- {x}" for x in sec["status"][1:]] + [""]
    out += ["## Paired differences vs the baseline", "", _md_table(*sec["diff"]), "", a.mc_note, ""]
    eh, er, en = sec["efficiency"]
    if er:
        out += [f"## Rollouts to {a.gain_fraction:.0%} of {a.baseline}'s gain", "", _md_table(eh, er), "", en, ""]
    for name, cap in (("forest", "Forest plot"), ("curves_step", "Learning curves (steps)"),
                      ("curves_rollouts", "Learning curves (rollouts)"),
                      ("domain_probs", "Domain probabilities over time"), ("rankings", "Ranks")):
        if name in figs:
            out += [f"![{cap}](figures/{figs[name].name})", "", f"*{report_captions(a)[name]}*", ""]
    out += ["## Ranking sensitivity", "",
            "Does the method ranking depend on how benchmarks are summarised? DataFlex-RL found "
            "ρ = −0.33 between a math-heavy and the domain-balanced summary.", ""]
    if r1:
        out += [_md_table(h1, r1), "", _md_table(h2, r2), ""]
    else:
        out += ["(only one summary or fewer than 2 ranked methods: nothing to compare)", ""]
    out += ["## Per-benchmark means", "", _md_table(*sec["bench"]), ""]
    out += ["## Provenance", "", f"- git commits: {', '.join(a.provenance['git_commits'])}",
            f"- packages: " + ", ".join(f"{k} {'/'.join(v)}" for k, v in a.provenance["packages"].items()),
            f"- total run time {a.provenance['run_seconds']:.1f} s, {a.provenance['rollouts']} rollouts", ""]
    return "\n".join(out)


def _render_html(a: Analysis, sec: dict, figs: dict, title: str) -> str:
    (h1, r1), (h2, r2) = sec["ranking"]
    esc = html.escape
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{esc(title)}</title>"
             f"<style>{_CSS}</style></head><body>", f"<h1>{esc(title)}</h1>",
             f"<p class='note'>{esc(sec['header'])}</p>"]
    if sec["status"]:
        parts.append("<div class='warn'><b>" + esc(sec["status"][0]) + "</b><ul>" +
                     "".join(f"<li>{esc(x)}</li>" for x in sec["status"][1:]) + "</ul></div>")
    parts += ["<h2>Paired differences vs the baseline</h2>", _html_table(*sec["diff"], cls="diff"),
              f"<p class='note'>{esc(a.mc_note)}</p>"]
    eh, er, en = sec["efficiency"]
    if er:
        parts += [f"<h2>Rollouts to {a.gain_fraction:.0%} of {esc(a.baseline)}'s gain</h2>",
                  _html_table(eh, er), f"<p class='note'>{esc(en)}</p>"]
    for name, cap in (("forest", "Forest plot"), ("curves_step", "Learning curves"),
                      ("curves_rollouts", "Learning curves on the rollouts axis"),
                      ("domain_probs", "Domain probabilities over time, per policy"),
                      ("rankings", "Ranks under each summary")):
        if name in figs:
            parts += [f"<h2>{esc(cap)}</h2>", _img_tag(figs[name], report_captions(a)[name], name)]
    parts += ["<h2>Ranking sensitivity</h2>",
              "<p class='note'>Does the method ranking depend on how benchmarks are summarised? "
              "DataFlex-RL found ρ = −0.33 between a math-heavy and the domain-balanced summary.</p>"]
    if r1:
        parts += [_html_table(h1, r1), _html_table(h2, r2)]
    else:
        parts.append("<p class='note'>(only one summary or fewer than 2 ranked methods)</p>")
    parts += ["<h2>Per-benchmark means</h2>", _html_table(*sec["bench"]), "<h2>Provenance</h2><ul>",
              f"<li>git commits: {esc(', '.join(a.provenance['git_commits']))}</li>",
              "<li>packages: " + esc(", ".join(f"{k} {'/'.join(v)}"
                                               for k, v in a.provenance["packages"].items())) + "</li>",
              f"<li>total run time {a.provenance['run_seconds']:.1f} s, "
              f"{a.provenance['rollouts']} rollouts</li></ul></body></html>"]
    return "\n".join(parts)


def write_report(analysis: Analysis, out_dir: str | Path, *, title: str | None = None) -> ReportFiles:
    """Write report.html, summary.md and figures/*.png for `analysis` into `out_dir`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    title = title or f"rlpace comparison: {analysis.matrix.suite}"
    figs = _figures(analysis, out / "figures")
    sec = _sections(analysis)
    md = out / "summary.md"
    md.write_text(_render_md(analysis, sec, figs, title), encoding="utf-8")
    page = out / "report.html"
    page.write_text(_render_html(analysis, sec, figs, title), encoding="utf-8")
    return ReportFiles(page, md, figs, analysis)
