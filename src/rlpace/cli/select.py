"""Budgeted offline data selection: generate → score → route a verl dataset, with a manifest.

DE-Venus's active data selection (arXiv 2609.03324; docs/select.md). With labels: keep the
prompts whose pass rate is in --band (inclusive), the most uncertain first, up to --budget.
Without labels: rank by uncertainty, calibrate two thresholds on --probes labelled prompts,
route each prompt to discard / weak_supervision / annotate. Writes OUT (kept rows, with
extra_info.labeled), <stem>.annotate<suffix> (rows to label) and <stem>.manifest.json.

Examples:
    rlpace select train.parquet --out next.parquet --model models/Qwen3-4B-Base \\
        --samples 8 --budget 4000 --band 0.1,0.9
    rlpace select train.parquet --out next.parquet --rollouts rollouts.jsonl \\
        --mode unlabeled --probes 32 --annotate-budget 500
    rlpace select --replay next.manifest.json --data train.parquet --out next.again.parquet
"""

from __future__ import annotations

from ..errors import InputError
import argparse


def _pair(value: str) -> tuple[float, float]:
    try:
        lo, hi = (float(x) for x in value.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected two numbers lo,hi; got {value!r}") from None
    return lo, hi


def add_arguments(parser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = ("Rollouts JSONL, one line per prompt: {\"index\": <extra_info.index>, \"completions\": "
                     "[...G strings], \"answers\": [...] (optional), \"token_entropy\": [...G numbers] "
                     "(optional), \"self_certainty\": [...G numbers] (optional)}. See docs/select.md.")
    parser.add_argument("data", nargs="?", default=None, help="verl-schema .parquet or .jsonl file")
    parser.add_argument("--data", dest="data_opt", default=None, metavar="DATA", help="the same, as an option (for --replay)")
    parser.add_argument("--out", required=True, help="next dataset: .parquet or .jsonl")
    parser.add_argument("--manifest", default=None, help="manifest path (default <stem of --out>.manifest.json)")
    parser.add_argument("--replay", default=None, metavar="MANIFEST",
                        help="rebuild the dataset of MANIFEST from --data without generating")
    g = parser.add_argument_group("rollouts (one of)")
    g.add_argument("--model", default=None, help="local causal-LM directory to sample from")
    g.add_argument("--rollouts", default=None, help="JSONL of precomputed rollouts (format below)")
    g.add_argument("--samples", type=int, default=8, help="G completions per prompt (default 8)")
    g.add_argument("--max-new-tokens", type=int, default=512, help="(default 512)")
    g.add_argument("--temperature", type=float, default=1.0, help="(default 1.0)")
    g.add_argument("--top-p", type=float, default=1.0, help="(default 1.0)")
    g.add_argument("--batch-size", type=int, default=8, help="prompts per generate call (default 8)")
    g.add_argument("--seed", type=int, default=0, help="torch seed of batch b is seed + b (default 0)")
    g.add_argument("--device", default="cpu", help="torch device (default cpu)")
    g.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    g = parser.add_argument_group("routing")
    g.add_argument("--mode", default="auto", choices=["auto", "labeled", "unlabeled"],
                   help="auto: labeled when every row has a label, else unlabeled")
    g.add_argument("--budget", type=int, default=None, help="prompts to keep at most (default: no cap)")
    g.add_argument("--annotate-budget", type=int, default=None,
                   help="labels to request at most (default: no cap)")
    g.add_argument("--band", type=_pair, default=(0.1, 0.9),
                   help="labeled mode: keep lo ≤ pass rate ≤ hi, both inclusive (default 0.1,0.9)")
    g.add_argument("--uncertainty", default="answer_entropy",
                   choices=["answer_entropy", "disagreement", "token_entropy", "self_certainty"],
                   help="ranking signal, higher = less sure (self_certainty ranks by its negative)")
    g.add_argument("--probes", type=int, default=16, help="unlabeled mode: probe prompts (default 16)")
    g.add_argument("--calibrate", type=_pair, default=(0.1, 0.9),
                   help="unlabeled mode: lo,hi: discard where probes pass ≥ hi, annotate where ≤ lo")
    g.add_argument("--verifier", default="auto", choices=["auto", "exact", "math"],
                   help="auto: math-verify when the row's ability contains 'math', else exact match")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")


def run(args) -> int:
    from rlpace.select import ROUTES, replay, select
    from rlpace.select._manifest import output_paths

    from ._paths import check_output
    paths = output_paths(args.out, args.manifest)   # every output path before any scoring
    for key, option in (("data", "--out"), ("annotate", "--out (its .annotate file)"), ("manifest", "--manifest")):
        check_output(paths[key], option)
    if args.data is not None and args.data_opt is not None and args.data != args.data_opt:
        raise InputError("give the data once: as the positional DATA or as --data.")
    data = args.data if args.data is not None else args.data_opt
    if data is None:
        raise InputError("no input: pass DATA (a verl .parquet or .jsonl file), or --data with --replay.")
    if args.replay is not None:
        if args.model is not None or args.rollouts is not None:
            raise InputError("--replay rebuilds from the manifest; drop --model/--rollouts.")
        res = replay(args.replay, data, args.out)
        verb = "replayed"
    else:
        res = select(data, args.out, model=args.model, rollouts=args.rollouts, samples=args.samples,
                     max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                     batch_size=args.batch_size, seed=args.seed, device=args.device, dtype=args.dtype,
                     mode=args.mode, budget=args.budget, annotate_budget=args.annotate_budget,
                     band=args.band, uncertainty=args.uncertainty, probes=args.probes,
                     calibrate=args.calibrate, verifier=args.verifier, manifest=args.manifest,
                     progress=not args.no_progress)
        verb = "wrote"
    m = res.manifest
    # counted from the routes written, not read from the manifest: a replayed manifest may
    # lack "counts" or carry stale ones (only its routes are replayed)
    counts = {r: int((res.routes == r).sum()) for r in ROUTES}
    print(f"{verb} {res.output}: {counts['keep'] + counts['weak_supervision']} rows "
          f"({counts['keep']} labelled, {counts['weak_supervision']} weak supervision); "
          f"{counts['annotate']} to annotate in {res.annotate_path}; {counts['discard']} discarded")
    if args.replay is None and m["parameters"]["mode_used"] == "unlabeled":
        t = m["thresholds"]
        def show(x):
            return "none" if x is None else f"{x:.4g}"
        print(f"thresholds ({m['parameters']['uncertainty']}): discard ≤ {show(t['discard_at_or_below'])}, "
              f"annotate ≥ {show(t['annotate_at_or_above'])}"
              + ("" if t["calibrated"] else " (probe round: label the probes and run again)"))
    print(f"manifest: {res.manifest_path}")
    return 0
