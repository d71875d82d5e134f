"""The one error type for bad input.

Every check of what a user, a config file, a checkpoint or a calling trainer handed to
rlpace raises `InputError`, a `ValueError` whose message names the field and the fix.
The CLI shortens exactly this type to one line (exit code 2); any other exception —
a numpy broadcast error inside a policy, a `ValueError` from a library — is a bug and keeps
its traceback. Catching `ValueError` still catches it.

    >>> from rlpace import InputError
    >>> issubclass(InputError, ValueError)
    True
"""

from __future__ import annotations

__all__ = ["InputError"]


class InputError(ValueError):
    """Invalid input: the message names the field and how to fix it; no state was changed."""
