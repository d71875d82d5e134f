"""`report_from_dir`: a folder of run records (what `rlpace compare` or an adapter wrote) →
report.html and summary.md. The folder layout (runs/, failed/, grid.json) is this package's;
`rlpace.evaluation` analyses and renders the records it is given, as data."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from ._records import read_records

if TYPE_CHECKING:
    from ..evaluation import ReportFiles

__all__ = ["report_from_dir"]


def _failed_runs(runs_dir: Path) -> list[tuple[str, str]]:
    out = []
    for p in sorted((runs_dir / "failed").glob("*.json")) if (runs_dir / "failed").is_dir() else []:
        try:
            d = json.loads(p.read_text(encoding="utf-8"))
            out.append((d.get("run_id", p.stem), d.get("error", "")))
        except (OSError, json.JSONDecodeError):
            out.append((p.stem, "unreadable failure file"))
    return out


def report_from_dir(runs_dir: str | Path, out_dir: str | Path | None = None, *,
                    baseline: str = "uniform", suite: str | None = None,
                    extra_summaries: Sequence[str] = (), confidence: float = 0.95,
                    n_boot: int = 10_000, random_state: int = 0, target: float | None = None,
                    title: str | None = None) -> ReportFiles:
    """Read every record under `runs_dir` (and `failed/`, `grid.json` when present), analyse,
    and write the report into `out_dir` (default `<runs_dir>/report`).

    Example:
        >>> # rlpace compare writes runs/…; then:
        >>> # files = report_from_dir("runs/cmp", baseline="uniform"); files.html
    """
    from ..evaluation import analyze, write_report
    runs = Path(runs_dir)
    # A grid folder keeps its records in runs/; elsewhere (adapters) any *.jsonl below counts.
    records = read_records(runs / "runs" if (runs / "runs").is_dir() else runs)
    order: Any = None
    grid_file = runs / "grid.json"
    if grid_file.is_file():
        try:
            order = [p["label"] for p in json.loads(grid_file.read_text(encoding="utf-8"))["policies"]]
        except (KeyError, TypeError, json.JSONDecodeError):
            order = None
    a = analyze(records, baseline=baseline, suite=suite, extra_summaries=extra_summaries,
                label_order=order, confidence=confidence, n_boot=n_boot, random_state=random_state,
                target=target, failed=_failed_runs(runs))
    return write_report(a, out_dir if out_dir is not None else runs / "report", title=title)
