"""Run the built-in GRPO recipe with one policy: `rlpace train key=value ...`.

Every field of `rlpace.train.TrainConfig` can be set as key=value (listed below). The
run writes out/config.json, out/metrics.jsonl (one record per step), out/summary.json
and out/checkpoint/. `rlpace train --resume out=DIR` continues that run from its
checkpoint with the config it saved in DIR/config.json (add steps=N to extend it; only
steps, max_rollouts and reporting fields may change).

Examples:
  rlpace train steps=100 policy=dump out=runs/dump
  rlpace train --resume out=runs/dump steps=200          # continue it to 200 steps
  rlpace train policy=uniform+dapo_dynamic_sampling objective=dapo
  rlpace train model=/path/to/Qwen2.5-0.5B-Instruct tasks=knights_knaves chat=true device=cuda
"""

from __future__ import annotations

import argparse
import textwrap


def add_arguments(parser) -> None:
    from rlpace.train.config import field_help

    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.description = __doc__.split("\n\n")[0] + "\n\n" + __doc__.split("\n\n", 1)[1]
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="TrainConfig fields (see below)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in out=DIR from its checkpoint with its saved config.json; "
                             "key=value may only extend steps / max_rollouts or change reporting fields")
    parser.add_argument("--model", default=None, help="local Hugging Face causal-LM directory (same as model=DIR)")
    lines = ["config fields (key=value, default in brackets):"]
    for name, typ, default, doc in field_help():
        lines.append(f"  {name} ({typ}) [{default!r}]")
        lines += ["      " + w for w in textwrap.wrap(doc, 84)]
    parser.epilog = "\n".join(lines)


def run(args) -> int:
    import math

    from rlpace.train import TrainConfig, from_overrides, train
    from rlpace.train.config import resume_config

    overrides = list(args.overrides) + ([f"model={args.model}"] if args.model else [])
    if args.resume:
        cfg = resume_config([o for o in overrides if not o.startswith("resume=")])
    else:
        cfg = from_overrides(overrides, TrainConfig())
    from ._paths import check_output
    check_output(cfg.out, "out=", kind="dir")
    summary = train(cfg)
    base, final = summary["base"].get("mean", math.nan), summary["final"].get("mean", math.nan)
    acc = (f"held-out mean accuracy {base:.3f} -> {final:.3f}" if math.isfinite(final) else
           "held-out accuracy not measured (no held-out set)")
    print(f"policy {summary['policy']}: {acc} in {summary['steps']} steps, "
          f"{summary['rollouts_total']} rollouts, {summary['seconds_total']:.0f} s; "
          f"informative groups {summary['informative_fraction']:.2f}")
    print(f"wrote {cfg.out}/metrics.jsonl, summary.json, checkpoint/")
    return 0


if __name__ == "__main__":  # pragma: no cover
    import sys
    p = argparse.ArgumentParser()
    add_arguments(p)
    sys.exit(run(p.parse_args()))
