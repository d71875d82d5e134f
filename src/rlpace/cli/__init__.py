"""`rlpace` command line: a thin dispatcher over library functions.

Each subcommand lives in its own module (`rlpace.cli.<name>`) exposing
`add_arguments(parser)` and `run(args) -> int`; modules are imported lazily so that
`rlpace simulate` never imports torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help)
COMMANDS = {
    "simulate": ("rlpace.cli.simulate", "run a policy on the synthetic learner (no torch)"),
    "demo": ("rlpace.cli.demo", "train a tiny model with uniform vs adaptive scheduling (CPU, minutes)"),
    "train": ("rlpace.cli.train", "run the built-in GRPO recipe with one policy"),
    "prepare": ("rlpace.cli.prepare", "annotate a prompt dataset: clusters, ranks, NLL difficulty"),
    "compare": ("rlpace.cli.compare", "run a policy x seed matrix and write the report"),
    "report": ("rlpace.cli.report", "statistics and HTML report over a directory of run records"),
    "policies": ("rlpace.cli.policies", "list the registered policies"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="rlpace", description="Adaptive data scheduling for LLM RL post-training.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    available = {}
    for name, (mod_name, help_text) in COMMANDS.items():
        try:
            mod = importlib.import_module(mod_name)
        except ModuleNotFoundError as e:
            if e.name and e.name.startswith("rlpace.cli."):
                continue  # subcommand not shipped in this build
            raise
        p = sub.add_parser(name, help=help_text, description=(mod.__doc__ or help_text).strip().split("\n\n")[0])
        mod.add_arguments(p)
        available[name] = mod
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return int(available[args.command].run(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
