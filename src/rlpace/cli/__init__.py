"""`rlpace` command line: a thin dispatcher over library functions.

Each subcommand lives in its own module (`rlpace.cli.<name>`) exposing
`add_arguments(parser)` and `run(args) -> int`; modules are imported lazily so that
`rlpace simulate` never imports torch.

Errors. `main` is the one error boundary. What a user typed or pointed at is wrong →
one line on stderr, `rlpace <cmd>: error: <what is wrong and how to fix it>`, exit code 2,
no traceback. Which exceptions count as user errors is a whitelist by type:

- `rlpace.errors.InputError` (and its subclass `rlpace.experiments.RecordError`): rlpace's
  contract is that invalid input raises InputError naming the field and the fix, before any
  work or state change, so every library check reaches the user as is. Where a library
  parses what the user gave (JSON of a file or a `--set` value, `int` of a CLI value, ...)
  it turns that library's ValueError into an InputError at the spot;
- `FileNotFoundError`, `NotADirectoryError`, `IsADirectoryError`, `PermissionError`: a path
  the user gave;
- `ModuleNotFoundError` of an optional dependency (anywhere in the exception's cause chain):
  the line names the extra to install (and torch, which no extra installs);
- argparse's own errors (unknown option, bad `--k`): the same one line instead of the usage.

Anything else (any other ValueError, TypeError, KeyError, IndexError, RuntimeError, an
ImportError of rlpace itself ...) is a bug and keeps its traceback. `RLPACE_TRACEBACK=1` shows the traceback of
user errors too.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from ..errors import InputError

# name -> (module, one-line help)
COMMANDS = {
    "simulate": ("rlpace.cli.simulate", "run a policy on the synthetic learner (no torch)"),
    "demo": ("rlpace.cli.demo", "train a tiny model with uniform vs adaptive scheduling (CPU, minutes)"),
    "train": ("rlpace.cli.train", "run the built-in GRPO recipe with one policy"),
    "prepare": ("rlpace.cli.prepare", "annotate a prompt dataset: clusters, ranks, NLL difficulty"),
    "compare": ("rlpace.cli.compare", "run a policy x seed matrix and write the report"),
    "report": ("rlpace.cli.report", "statistics and HTML report over a directory of run records"),
    "policies": ("rlpace.cli.policies", "list the registered policies"),
    "merge": ("rlpace.cli.merge", "merge RL specialists of one base without data (ISO-Merger, TIES, ...)"),
    "select": ("rlpace.cli.select", "budgeted offline data selection: generate, score, route, manifest"),
    "advise": ("rlpace.cli.advise", "predict the saving and the best policy from a short pilot"),
}

_TORCH = "pip install torch==2.13.0 (or your CUDA build) first, then pip install 'rlpace[train]'"

#: top-level module of an optional dependency -> the extra that installs it. A module two
#: extras share maps per command (`{command: extra}`, "" = any other command).
OPTIONAL = {
    "torch": _TORCH,
    "transformers": "train", "tokenizers": "train", "tqdm": "train", "pyarrow": "train",
    "reasoning_gym": "train", "math_verify": "train", "tensorboard": "train",
    "matplotlib": {"report": "report", "compare": "report", "prepare": "prepare", "": "train"},
    "sentence_transformers": "prepare", "sklearn": "prepare", "faiss": "prepare", "datasets": "prepare",
    "scipy": {"prepare": "prepare", "": "report"}, "yaml": "report",
    "verl": "verl", "transfer_queue": "verl", "trl": "trl", "accelerate": "trl",
    "wandb": "pip install wandb",
}

USER_ERRORS = (InputError, FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError)


class UsageError(Exception):
    """Raised by argparse's error hook: a malformed command line."""


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line through `main`'s boundary, not usage + exit."""

    def error(self, message):
        raise UsageError(message)


def missing_dependency(exc: BaseException, command: str) -> str | None:
    """The one-line install advice when `exc` (or an exception it was raised from) is a
    ModuleNotFoundError of an optional dependency; None otherwise."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, ModuleNotFoundError) and exc.name:
            top = exc.name.split(".")[0]
            extra = OPTIONAL.get(top)
            if isinstance(extra, dict):
                extra = extra.get(command, extra[""])
            if extra is None:
                return None
            fix = extra if extra.startswith("pip ") else f"pip install 'rlpace[{extra}]'"
            if extra == "train":    # no extra installs torch: the user picks CPU or CUDA
                fix += " (with torch==2.13.0 or your CUDA build installed first)"
            return f"this command needs the optional package {top!r}, which is not installed: {fix}."
        exc = exc.__cause__ or exc.__context__
    return None


def _one_line(command: str, message: str) -> str:
    text = " ".join(str(message).split())
    return f"rlpace {command}: error: {text}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = _Parser(prog="rlpace", description="Adaptive data scheduling for LLM RL post-training.",
                     epilog="A user error prints one line and exits with code 2; set RLPACE_TRACEBACK=1 "
                            "to see its traceback.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
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
    command = next((a for a in argv if a in available), "")
    show = os.environ.get("RLPACE_TRACEBACK", "") not in ("", "0")
    try:
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            print("rlpace: error: no COMMAND given; pick one of the commands listed above "
                  "(e.g. `rlpace demo`, `rlpace simulate --help`).", file=sys.stderr)
            return 2
        return int(available[args.command].run(args) or 0)
    except UsageError as e:
        where = f"rlpace {command}".strip()
        print(f"{where}: error: {' '.join(str(e).split())} (see `{where} --help`)", file=sys.stderr)
        return 2
    except USER_ERRORS as e:
        if show:
            raise
        msg = str(e) if not isinstance(e, OSError) or not e.filename else \
            f"{e.strerror or e}: {e.filename!r}; check the path."
        print(_one_line(command, msg), file=sys.stderr)
        return 2
    except ImportError as e:
        advice = missing_dependency(e, command)
        if advice is None or show:
            raise
        print(_one_line(command, advice), file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
