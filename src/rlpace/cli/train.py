"""Run the built-in GRPO recipe with one policy: `rlpace train key=value ...`.

Every field of `rlpace.train.TrainConfig` can be set as key=value (listed below). The
run writes out/config.json, out/metrics.jsonl (one record per step), out/summary.json
and out/checkpoint/; `--resume` continues from that checkpoint.

Examples:
  rlpace train steps=100 policy=dump out=runs/dump
  rlpace train policy=uniform+dapo_dynamic_sampling objective=dapo
  rlpace train model=/path/to/Qwen2.5-0.5B-Instruct tasks=knights_knaves chat=true device=cuda
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import textwrap


def add_arguments(parser) -> None:
    from rlpace.train.config import field_help

    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.description = __doc__.split("\n\n")[0] + "\n\n" + __doc__.split("\n\n", 1)[1]
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="TrainConfig fields (see below)")
    parser.add_argument("--resume", action="store_true", help="continue the run in out/ from its checkpoint")
    parser.add_argument("--model", default=None, help="local Hugging Face causal-LM directory (same as model=DIR)")
    lines = ["config fields (key=value, default in brackets):"]
    for name, typ, default, doc in field_help():
        lines.append(f"  {name} ({typ}) [{default!r}]")
        lines += ["      " + w for w in textwrap.wrap(doc, 84)]
    parser.epilog = "\n".join(lines)


def run(args) -> int:
    from rlpace.train import TrainConfig, from_overrides, train

    cfg = from_overrides(args.overrides, TrainConfig())
    if args.resume:
        cfg = dataclasses.replace(cfg, resume=True)
    if args.model:
        cfg = dataclasses.replace(cfg, model=args.model)
    summary = train(cfg)
    base, final = summary["base"], summary["final"]
    print(f"policy {summary['policy']}: held-out mean accuracy {base.get('mean', float('nan')):.3f} -> "
          f"{final.get('mean', float('nan')):.3f} in {summary['steps']} steps, "
          f"{summary['rollouts_total']} rollouts, {summary['seconds_total']:.0f} s; "
          f"informative groups {summary['informative_fraction']:.2f}")
    print(f"wrote {cfg.out}/metrics.jsonl, summary.json, checkpoint/")
    return 0


if __name__ == "__main__":  # pragma: no cover
    import sys
    p = argparse.ArgumentParser()
    add_arguments(p)
    sys.exit(run(p.parse_args()))
