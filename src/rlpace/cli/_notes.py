"""Library warnings as one-line notes on stderr, each distinct message once.

A `UserWarning` or `RuntimeWarning` raised for the user to read (no held-out file, no NLL
model, a policy that lacks a signal) reaches the command line as
`rlpace <cmd>: note: <message>` — not Python's two-line form with the source file and line
of the caller, which reads like a crash. The message text is the library's own.
"""

from __future__ import annotations

import contextlib
import sys
import warnings

__all__ = ["notes", "quiet_transformers"]


@contextlib.contextmanager
def notes(command: str):
    """Within the block, every warning prints once as `rlpace <command>: note: ...` on stderr."""
    seen: set[str] = set()

    def show(message, category, filename, lineno, file=None, line=None):
        text = " ".join(str(message).split())
        if text not in seen:
            seen.add(text)
            print(f"rlpace {command}: note: {text}", file=sys.stderr, flush=True)

    with warnings.catch_warnings():
        warnings.simplefilter("always")          # dedup is by message text, above
        warnings.showwarning = show
        yield


def quiet_transformers() -> None:
    """No transformers progress bars (its 'Loading weights' bar ignores our --no-progress)."""
    try:
        import transformers
    except ImportError:
        return
    transformers.utils.logging.disable_progress_bar()
