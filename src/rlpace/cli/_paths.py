"""Output paths checked before any work: one helper every subcommand calls first.

A path the command will write is refused, naming its option, when it cannot be created:
one of its parents is a regular file (`--json f.txt/out.json`), the path itself is a
directory where a file goes (or a file where a directory goes), or the nearest existing
parent is not writable. Nothing is created here: the command makes its folders only
after every input has been checked.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import InputError

__all__ = ["check_output"]


def check_output(path, option: str, *, kind: str = "file") -> Path:
    """`path` as a Path, or InputError naming `option` when the command could not write it.

    Args:
        path: where the command will write.
        option: the option or field the user gave it with, e.g. "--json" or "out=".
        kind: "file" (a file is written at `path`) or "dir" (a folder is made at `path`).

    Example:
        >>> check_output("runs/h.json", "--json")      # doctest: +SKIP
        PosixPath('runs/h.json')
    """
    if kind not in ("file", "dir"):
        raise ValueError(f"kind must be 'file' or 'dir', got {kind!r}")
    p = Path(path)
    if not str(path).strip():
        raise InputError(f"{option} is empty; give a path to write to.")
    if p.exists():
        if kind == "file" and p.is_dir():
            raise InputError(f"{option} {str(p)!r} is a directory; give a file path (e.g. {str(p / 'out')!r}).")
        if kind == "dir" and not p.is_dir():
            raise InputError(f"{option} {str(p)!r} is an existing file, not a folder; give a folder path.")
        if not os.access(p, os.W_OK):
            raise InputError(f"{option} {str(p)!r} is not writable; choose another path.")
        return p
    parent = p.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise InputError(f"{option} {str(p)!r} cannot be created: {str(parent)!r} is a file, not a folder; "
                         f"choose a path under a folder.")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"{option} {str(p)!r} cannot be created: the folder {str(parent)!r} is not writable.")
    return p
