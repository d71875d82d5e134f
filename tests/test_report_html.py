"""The report: files, tables, figures, the CLI, and a real headless Chromium rendering whose
screenshot must show the plots.

Chromium comes from Debian (`apt-get install -y chromium`). The browser test is skipped only
when /usr/bin/chromium is missing and CI is not "true"; in CI it must run.
"""

import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from rlpace.cli import main as cli_main
from rlpace.experiments import report_from_dir
from rlpace.experiments import Grid, run_grid

CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    grid = Grid(policies=("uniform", "fixed_mixture", "dump"), seeds=3, suites="sim:ladder", steps=20,
                options={"batch_size": 16, "group_size": 4, "eval_every": 5,
                         "scenario": {"prompts_per_domain": 40}})
    res = run_grid(grid, out, workers=1, progress=False)
    assert res.complete
    return out


@pytest.fixture(scope="module")
def report(runs_dir):
    return report_from_dir(runs_dir, runs_dir / "report", baseline="uniform", n_boot=1000,
                           extra_summaries=["hard=L09,L10,L11"])


def _nonwhite_fraction(png: Path) -> float:
    from matplotlib.image import imread
    img = imread(png)[..., :3]                                    # float [H, W, 3] in [0, 1]
    return float(np.mean(img.min(axis=-1) < 0.9))


def _colored_pixels(png: Path) -> int:
    """Pixels with a clearly saturated color (plot lines, bands, heatmaps); page text, table
    borders and the light table highlights are grey or nearly white."""
    from matplotlib.image import imread
    img = (imread(png)[..., :3] * 255).astype(int)
    return int(np.sum(img.max(axis=-1) - img.min(axis=-1) > 60))


def test_report_files_and_tables(report, runs_dir):
    assert report.html.is_file() and report.markdown.is_file()
    assert set(report.figures) == {"forest", "curves_step", "curves_rollouts", "domain_probs", "rankings"}
    for png in report.figures.values():
        assert _nonwhite_fraction(png) > 0.02, f"{png.name} looks blank"
    md = report.markdown.read_text()
    a = report.analysis
    cp = {c.label: c for c in a.comparisons}["dump"]
    # the Markdown shows the analysis' numbers, in percentage points
    assert f"{cp.t.estimate * 100:+.2f}" in md
    assert f"[{cp.boot.low * 100:+.2f}, {cp.boot.high * 100:+.2f}]" in md
    assert "zero excluded?" in md and "Holm" in md and "Ranking sensitivity" in md
    assert "| hard |" in md                                     # the user summary is in the table
    assert "figures/forest.png" in md
    html = report.html.read_text()
    # images are embedded, so the page is self-contained
    assert len(re.findall(r'src="data:image/png;base64,', html)) == 5
    assert "PARTIAL" not in html


def test_partial_results_are_flagged(runs_dir, tmp_path):
    import shutil
    part = tmp_path / "partial"
    shutil.copytree(runs_dir / "runs", part / "runs")
    (part / "runs" / "sim-ladder__dump__seed2.jsonl").unlink()
    (part / "failed").mkdir()
    (part / "failed" / "sim-ladder__dump__seed2.json").write_text(
        '{"run_id": "sim-ladder__dump__seed2", "error": "Traceback...\\nMemoryError: out of memory"}')
    files = report_from_dir(part, n_boot=500)
    md = files.markdown.read_text()
    assert "PARTIAL RESULTS: 8 of 9" in md
    assert "missing: dump seeds [2]" in md
    assert "failed: sim-ladder__dump__seed2 — MemoryError: out of memory" in md
    cp = {c.label: c for c in files.analysis.comparisons}["dump"]
    assert cp.n_pairs == 2


def test_report_cli(runs_dir, tmp_path, capsys):
    rc = cli_main(["report", str(runs_dir), "--out", str(tmp_path / "r"), "--n-boot", "500"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "report.html" in out and "dump" in out and "zero excluded" in out
    rc = cli_main(["report", str(runs_dir), "--baseline", "grpo", "--out", str(tmp_path / "r2")])
    err = capsys.readouterr().err
    assert rc == 2 and "baseline 'grpo' is not among" in err and "--baseline" in err


def test_compare_cli_end_to_end(tmp_path, capsys):
    out = tmp_path / "cmp"
    args = ["compare", "--suite", "sim:ladder", "--policies", "uniform,dump", "--seeds", "2",
            "--steps", "10", "--workers", "1", "--set", "batch_size=16", "--set", "group_size=4",
            "--out", str(out), "--quiet"]
    assert cli_main(args) == 0
    text = capsys.readouterr().out
    assert "2 policies × 2 seeds" in text and "4 ran" in text
    assert (out / "report" / "report.html").is_file()
    assert cli_main(args) == 0                                  # resume: nothing to run
    assert "0 ran; 4 already done" in capsys.readouterr().out
    bad = ["compare", "--suite", "sim:ladder", "--policies", "uniform,nosuch", "--out", str(out)]
    assert cli_main(bad) == 2
    assert "unknown policy 'nosuch'" in capsys.readouterr().err
    one = ["compare", "--suite", "sim:ladder", "--policies", "uniform,dump", "--seeds", "1",
           "--out", str(tmp_path / "one")]
    assert cli_main(one) == 2
    assert "at least 2 matched seeds" in capsys.readouterr().err


def test_compare_lists_the_dataflex_matrix(capsys):
    assert cli_main(["compare", "--list"]) == 0
    out = capsys.readouterr().out
    assert "baseline    -> uniform" in out and "static      -> fixed_mixture" in out
    assert "dump_ucb    -> dump" in out
    from rlpace.policies import names
    if "ar" not in names():
        assert "ar          -> NOT AVAILABLE" in out


def _screenshot(html: Path, png: Path, profile: Path) -> None:
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={profile}", f"--screenshot={png}", "--window-size=1200,2000",
           html.resolve().as_uri()]
    subprocess.run(cmd, capture_output=True, timeout=180, check=True)
    assert png.is_file()


def _bands(mask_rows: np.ndarray, min_gap: int = 12) -> list[tuple[int, int]]:
    """Contiguous row ranges [start, stop) where `mask_rows` is True (gaps < min_gap joined)."""
    rows = np.flatnonzero(mask_rows)
    if rows.size == 0:
        return []
    splits = np.flatnonzero(np.diff(rows) >= min_gap)
    starts = np.r_[rows[0], rows[splits + 1]]
    stops = np.r_[rows[splits] + 1, rows[-1] + 1]
    return list(zip(starts.tolist(), stops.tolist()))


@pytest.mark.skipif(not os.path.exists(CHROMIUM) and os.environ.get("CI") != "true",
                    reason="needs Debian's chromium (apt-get install -y chromium); required in CI")
def test_report_renders_in_headless_chromium(report, tmp_path):
    from matplotlib.image import imread
    shot = tmp_path / "report.png"
    _screenshot(report.html, shot, tmp_path / "profile")
    # Control: the same page with every image hidden but its box kept (visibility:hidden keeps
    # the layout), so the two screenshots differ exactly where the plots are drawn.
    bare = tmp_path / "bare.html"
    bare.write_text(report.html.read_text().replace("</style>", "img{visibility:hidden}</style>", 1))
    shot_bare = tmp_path / "bare.png"
    _screenshot(bare, shot_bare, tmp_path / "profile2")
    img, ctl = imread(shot)[..., :3], imread(shot_bare)[..., :3]
    assert img.shape[:2] == (2000, 1200) and ctl.shape == img.shape
    plot_px = np.abs(img - ctl).max(axis=-1) > 0.1                        # bool [H, W]
    assert plot_px.sum() > 30_000, f"only {int(plot_px.sum())} plot pixels: plots did not render"
    # The first 2000 px hold the forest plot and the step learning curves (at least 2 plots);
    # each plot region must be non-blank: a real share of its box is ink, and it has colour.
    bands = [(a, b) for a, b in _bands(plot_px.any(axis=1)) if b - a > 150]
    assert len(bands) >= 2, f"plot regions found: {bands}"
    for a, b in bands:
        cols = np.flatnonzero(plot_px[a:b].any(axis=0))
        box = img[a:b, cols.min():cols.max() + 1]
        ink = float(np.mean(box.min(axis=-1) < 0.9))
        rgb = (box * 255).astype(int)
        coloured = int(np.sum(rgb.max(axis=-1) - rgb.min(axis=-1) > 60))
        assert ink > 0.03, f"plot at rows {a}-{b} is nearly blank ({ink:.3f} ink)"
        assert coloured > 300, f"plot at rows {a}-{b} has no coloured marks ({coloured})"


def test_zero_verdict_agrees_with_the_holm_p():
    from types import SimpleNamespace as NS

    from rlpace.evaluation._report import zero_verdict

    def cp(t_lo, b_lo, p_holm):
        return NS(t=NS(excludes_zero=t_lo > 0, confidence=0.95), boot=NS(excludes_zero=b_lo > 0), p_holm=p_holm)
    # the case seen in a real report: both CIs exclude 0, Holm p = 0.0514 -> not "yes"
    assert zero_verdict(cp(0.012, 0.016, 0.0514)) == "unadjusted only (both)"
    assert zero_verdict(cp(0.012, 0.016, 0.0207)) == "yes (both)"
    assert zero_verdict(cp(0.012, -0.1, 0.03)) == "t only"
    assert zero_verdict(cp(-0.1, 0.016, 0.2)) == "unadjusted only (bootstrap)"
    assert zero_verdict(cp(-0.1, -0.1, 0.9)) == "no"
    assert zero_verdict(cp(0.012, 0.016, 0.05)) == "unadjusted only (both)"     # p = α is not < α


def test_rankings_plot_names_methods_in_a_legend_in_rank_order():
    from rlpace.evaluation.plots import plot_rankings
    labels = [f"method_{i}" for i in range(12)]
    first = np.array([3, 1, 2, 12, 11, 10, 9, 8, 7, 6, 5, 4], dtype=float)
    fig, ax = plot_rankings(labels, {"primary": first, "other": first[::-1].copy()})
    leg = ax.get_legend()
    assert [t.get_text() for t in leg.get_texts()] == [labels[i] for i in np.argsort(first, kind="stable")]
    assert len(ax.texts) == 0                              # no end-of-line labels to overlap
    styles = {(ln.get_marker(), ln.get_linestyle()) for ln in ax.get_lines()}
    assert len(styles) >= 8                                # 12 methods: markers vary as well as colours


def test_report_shows_rollouts_to_a_fraction_of_the_baseline_gain(report):
    from rlpace.evaluation._analysis import efficiency_table
    a = report.analysis
    head, rows = efficiency_table(a)
    assert rows, a.efficiency_note
    md, html = report.markdown.read_text(), report.html.read_text()
    assert "## Rollouts to 80% of uniform's gain" in md
    for row in rows:                                       # every method's ratios, as computed
        assert "| " + " | ".join(row) + " |" in md
        assert row[2] in html


def test_every_report_figure_has_its_caption(report):
    """`rlpace report` / `rlpace compare` pages caption each figure with the one figure helper
    the demo's page uses (evaluation._report.figure_html)."""
    import html as html_mod
    page = report.html.read_text()
    from rlpace.evaluation._report import report_captions
    caps = report_captions(report.analysis)
    for name in report.figures:
        assert caps[name], name
        m = re.search(rf'<figure id="fig-{name}"><img alt="[^"]*" src="data:image/png;base64,[^"]+" '
                      rf'style="max-width:100%"><figcaption>(.*?)</figcaption></figure>', page)
        assert m and m.group(1) == html_mod.escape(caps[name]), name
    assert page.count("<figcaption>") == len(report.figures) == 5
    md = report.markdown.read_text()
    assert f"*{caps['forest']}*" in md
