"""Run a policy × seed matrix (DataFlex-RL style) and write the comparison report.

Runs every policy with every seed on each suite — the simulator (`sim:<scenario>`) or the
built-in trainer (`embedded`, `ladder`, `mostly_solved`, `embedded:<distributions>`) — in
parallel worker processes, resumably (rerun the same command to finish an interrupted
matrix), then writes the report (`rlpace report`), one per suite. Without --policies the
matrix mirrors DataFlex-RL's 13 configurations where the registry has them, and prints the
ones it does not; `--policies registry` runs every registered policy (the oracle_*
measurement tools left out).

The workers are persistent processes: each imports torch and the trainer once and runs
one run after another; a trainer suite's base policy is built once per seed (cached, see
`rlpace train --help`: cache_dir) and shared by every policy of that seed.

Examples:
    rlpace compare --suite sim:ladder --seeds 8 --out runs/cmp
    rlpace compare --suite sim:ladder --policies uniform,fixed_mixture,dump --seeds 4 \\
        --steps 100 --set batch_size=32 --set group_size=8 --out runs/small
    rlpace compare --grid grid.yaml --out runs/grid
    rlpace compare --suite embedded --seeds 8 --out runs/embedded
    rlpace compare --suite embedded --suite ladder --suite mostly_solved --policies registry \
        --seeds 8 --out runs/matrix
"""

from __future__ import annotations

from ..errors import InputError
import sys
from pathlib import Path

DEFAULT_STEPS = {"sim": 200, "embedded": None}
REGISTRY = "registry"      # --policies registry: every registered policy but the oracle_* tools


def add_arguments(parser) -> None:
    parser.add_argument("--suite", action="append", default=None,
                        help="'sim:<scenario>' (see `rlpace simulate --help`), a built-in trainer "
                             "suite ('embedded', 'ladder', 'mostly_solved') or "
                             "'embedded:<distributions>'; repeat it for several suites (default: "
                             "sim:ladder)")
    parser.add_argument("--policies", default=None,
                        help="comma-separated registry names, or 'registry' for every registered "
                             "policy but the oracle_* measurement tools (default: the DataFlex-RL "
                             "matrix; see --list)")
    parser.add_argument("--seeds", type=int, default=8, help="matched seeds 0..N-1 (default 8)")
    parser.add_argument("--steps", type=int, default=None,
                        help="training steps per run (default: 200 on the simulator, the "
                             "trainer preset's on trainer suites; required when both kinds are "
                             "in one matrix)")
    parser.add_argument("--workers", type=int, default=None,
                        help="worker processes (default min(cores, 2))")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="backend option for every run, e.g. batch_size=32 (repeatable)")
    parser.add_argument("--grid", default=None,
                        help="a YAML/JSON grid file instead of --suite/--policies/--seeds/--steps")
    parser.add_argument("--out", default=None, help="runs folder (required unless --list)")
    parser.add_argument("--baseline", default="uniform", help="report baseline (default uniform)")
    parser.add_argument("--no-report", action="store_true", help="run the matrix only")
    parser.add_argument("--list", action="store_true",
                        help="print the default matrix and what is missing, then exit")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def _parse_sets(items) -> dict:
    out = {}
    for item in items:
        key, eq, val = item.partition("=")
        if not eq or not key:
            raise InputError(f"--set {item!r} must be KEY=VALUE, e.g. --set batch_size=32.")
        from rlpace._flow import parse_value   # JSON or Hydra flow style, as every policy argument
        try:
            out[key] = parse_value(val, f"--set {key}")
        except InputError:
            out[key] = val
    return out


def _policy_list(text: str) -> list[str]:
    """--policies as a list: comma-separated names, where `registry` stands for every
    registered policy but the oracle_* measurement tools (each name once, in order)."""
    from rlpace.policies import names
    out = []
    for part in (p.strip() for p in text.split(",")):
        if part == REGISTRY:
            out += [n for n in names() if not n.startswith("oracle_")]
        elif part:
            out.append(part)
    if not out:
        raise InputError(f"--policies {text!r} names no policy; give registry names separated by "
                         f"commas (e.g. uniform,dump) or 'registry'.")
    return list(dict.fromkeys(out))


def _check_policy_names(names) -> None:
    from rlpace.policies._registry import _resolve
    for spec in names:
        for part in spec.split("+"):
            _resolve(part.strip())   # ValueError listing valid names


def _check_suites(suites) -> None:
    """Every suite's backend and scenario exist (before the first run starts)."""
    from rlpace.experiments import suite_backend
    from rlpace.sim import SCENARIOS
    for suite in suites:
        backend = suite_backend(suite)
        if backend == "sim" and suite[4:] not in SCENARIOS:
            raise InputError(f"unknown scenario {suite[4:]!r} in suite {suite!r}; the simulator has "
                             f"{', '.join('sim:' + n for n in sorted(SCENARIOS))}.")
        if backend == "embedded":
            from rlpace.tasks import make_taskset
            make_taskset(suite, train_per_domain=1, heldout_per_domain=1)   # names the bad distribution


def _load_grid(path):
    """`load_grid`, with any way a grid file can be malformed reported as an InputError."""
    from rlpace.experiments import load_grid
    try:
        return load_grid(path)
    except (InputError, FileNotFoundError, ImportError):
        raise
    except OSError as e:
        raise InputError(f"--grid {path!r}: cannot read it ({e.strerror or e}).") from None
    except Exception as e:   # yaml.YAMLError, or a mapping of the wrong shape (TypeError, KeyError ...)
        raise InputError(f"--grid {path!r} is not a valid grid file ({type(e).__name__}: {e}); "
                         f"see `rlpace compare --help` and rlpace.experiments.Grid for the fields.") from None


def build_grid(args):
    """The grid from the command line (or --grid), plus lines describing the matrix."""
    from rlpace.experiments import Grid, default_policies, suite_backend
    lines = []
    if args.grid:
        clash = [f for f, v in (("--suite", args.suite), ("--policies", args.policies),
                                ("--steps", args.steps), ("--set", args.set)) if v]
        if clash:
            raise InputError(f"--grid defines the whole matrix; drop {clash} or edit the grid file.")
        if not Path(args.grid).is_file():
            raise FileNotFoundError(2, "no such grid file", args.grid)
        grid = _load_grid(args.grid)
    else:
        suites = list(dict.fromkeys(x.strip() for x in (args.suite or ["sim:ladder"])))
        if not all(suites):
            raise InputError("--suite '' names no suite; give e.g. --suite ladder or --suite sim:ladder.")
        backends = {suite_backend(x) for x in suites}
        if args.policies is not None:
            policies = _policy_list(args.policies)
        else:
            plan = default_policies()
            policies = list(plan.policies)
            lines.append(f"default matrix ({len(policies)} configurations; DataFlex-RL slot -> policy):")
            lines += list(plan.lines)
            if plan.missing:
                lines.append(f"not yet available in rlpace: {', '.join(plan.missing)}")
        if args.steps is None and len(backends) > 1:
            raise InputError(f"--suite {' '.join(suites)}: the simulator and the trainer have different "
                             f"default budgets (200 and {_embedded_default_steps()} steps); give --steps "
                             f"for the whole matrix, or run them as two matrices.")
        steps = args.steps if args.steps is not None else DEFAULT_STEPS[backends.pop()]
        if steps is None:
            steps = _embedded_default_steps()
        grid = Grid(policies=tuple(policies), seeds=args.seeds, suites=tuple(suites), steps=steps,
                    options=_parse_sets(args.set))
    _check_policy_names([p.name for p in grid.policies])
    _check_suites(grid.suites)
    from rlpace.experiments._backends import check_options
    for suite in grid.suites:                 # options every suite's backend takes, before any run
        check_options(suite, dict(grid.options))
    if args.workers is not None and (args.workers < 1):
        raise InputError(f"--workers {args.workers}: give 1 or more worker processes (default "
                         f"min(cores, 2)).")
    if args.baseline not in [p.label for p in grid.policies] and not args.no_report:
        raise InputError(f"the baseline {args.baseline!r} is not in the matrix "
                         f"{[p.label for p in grid.policies]}; add it to --policies or pass "
                         f"--baseline <one of them>.")
    if len(grid.seeds) < 2 and not args.no_report:
        raise InputError(f"--seeds {len(grid.seeds)}: a paired CI needs at least 2 matched seeds; "
                         f"use --seeds 8 (DataFlex-RL used 12).")
    return grid, lines


def _embedded_default_steps() -> int:
    try:
        from rlpace.experiments._backends import embedded_default_steps
        return int(embedded_default_steps())
    except (ImportError, NotImplementedError, AttributeError):
        return 200


def run(args) -> int:
    from rlpace.experiments import run_grid
    grid, lines = build_grid(args)        # every input error (ValueError) before any run
    if args.list:
        print("\n".join(lines or [f"policies: {[p.label for p in grid.policies]}"]))
        return 0
    if not args.out:
        raise InputError("--out is required: the folder for run records and the report "
                         "(rerun the same command to resume).")
    from ._paths import check_output
    check_output(args.out, "--out", kind="dir")
    for line in lines:
        print(line)
    runs = grid.runs()
    print(f"matrix: {len(grid.policies)} policies × {len(grid.seeds)} seeds × {len(grid.suites)} "
          f"suite(s) = {len(runs)} runs, {grid.steps} steps each -> {args.out}")
    try:
        res = run_grid(grid, args.out, workers=args.workers, progress=not args.quiet)
    except NotImplementedError as e:
        raise InputError(str(e)) from None
    print(res.summary())
    for rid, err in res.failed.items():
        last = [x for x in err.strip().splitlines() if x.strip()]
        print(f"  FAILED {rid}: {last[-1] if last else err}", file=sys.stderr)
    if not args.no_report:
        from rlpace.experiments import report_from_dir
        from .report import print_findings
        suites = list(grid.suites)
        for suite in suites:
            out = None if len(suites) == 1 else f"{args.out}/report-{suite.replace(':', '-')}"
            try:
                files = report_from_dir(args.out, out, baseline=args.baseline, suite=suite)
            except InputError as e:
                print(f"rlpace compare: cannot write the report: {e}", file=sys.stderr)
                return 1
            print_findings(files)
    return 0 if res.complete else 1
