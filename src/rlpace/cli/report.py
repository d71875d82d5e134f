"""Paired statistics and an HTML + Markdown report over a folder of run records.

Reads every run record under RUNS_DIR (the folder `rlpace compare` wrote, or any folder of
*.jsonl records from the trainer, the simulator or the verl/TRL adapters), compares each
policy with the baseline over matched seeds, and writes report.html, summary.md and
figures/*.png.

Example:
    rlpace report runs/cmp --baseline uniform --out runs/cmp/report
    rlpace report runs/cmp --summary mathy=L00,L01,L02 --summary hard=L08:1,L09:1,L10:2
"""

from __future__ import annotations

import sys


def add_arguments(parser) -> None:
    parser.add_argument("runs_dir", metavar="RUNS_DIR", help="folder of run records (*.jsonl), "
                        "e.g. the --out folder of `rlpace compare`")
    parser.add_argument("--baseline", default="uniform",
                        help="label every policy is compared with (default: uniform)")
    parser.add_argument("--out", default=None, help="output folder (default: RUNS_DIR/report)")
    parser.add_argument("--suite", default=None,
                        help="which suite to report when the records hold several")
    parser.add_argument("--summary", action="append", default=[], metavar="NAME=B1,B2|B1:W1,...",
                        help="an extra benchmark summary for the ranking-sensitivity table: a "
                             "subset with equal weights or explicit weights (repeatable)")
    parser.add_argument("--confidence", type=float, default=0.95, help="interval level (0.95)")
    parser.add_argument("--n-boot", type=int, default=10_000, help="bootstrap resamples (10000)")
    parser.add_argument("--seed", type=int, default=0, help="random state of the bootstrap (0)")
    parser.add_argument("--target", type=float, default=None,
                        help="held-out mean accuracy for the steps/rollouts-to-target speed-ups "
                             "(default: the target stored in the records, if any)")
    parser.add_argument("--title", default=None, help="report title")


def print_findings(files) -> None:
    """A few lines for the terminal: what was written and what it says."""
    from rlpace.evaluation._report import zero_verdict
    a = files.analysis
    print(f"report: {files.html}\nsummary: {files.markdown}")
    sm = a.matrix
    missing = len(sm.missing) + len(sm.excluded)
    if missing or a.failed:
        print(f"PARTIAL RESULTS: {len(sm.missing)} (method, seed) cells without a complete run, "
              f"{len(sm.excluded)} partial runs, {len(a.failed)} failed runs (see the report).")
    for cp in a.comparisons:
        if cp.t is None:
            print(f"  {cp.label:24s} {cp.note}")
            continue
        ex = f"zero excluded: {zero_verdict(cp)}"
        print(f"  {cp.label:24s} Δ={cp.t.estimate:+.4f}  t CI [{cp.t.low:+.4f}, {cp.t.high:+.4f}]  "
              f"boot CI [{cp.boot.low:+.4f}, {cp.boot.high:+.4f}]  p_holm={cp.p_holm:.3g}  {ex}")


def run(args) -> int:
    from rlpace.experiments import report_from_dir
    from rlpace.errors import InputError

    from ._paths import check_output
    check_output(args.out if args.out is not None else f"{args.runs_dir}/report", "--out", kind="dir")
    try:
        files = report_from_dir(args.runs_dir, args.out, baseline=args.baseline, suite=args.suite,
                                extra_summaries=args.summary, confidence=args.confidence,
                                n_boot=args.n_boot, random_state=args.seed, target=args.target,
                                title=args.title)
    except (InputError, FileNotFoundError) as e:   # RecordError is an InputError
        print(f"rlpace report: error: {e}", file=sys.stderr)
        return 2
    print_findings(files)
    return 0
