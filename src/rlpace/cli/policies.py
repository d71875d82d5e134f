"""List the registered policies with the first line of their docstring."""

from __future__ import annotations

import inspect


def add_arguments(parser) -> None:
    pass


def run(args) -> int:
    from rlpace.policies._registry import _REGISTRY
    for name in sorted(_REGISTRY):
        f = _REGISTRY[name]
        doc = (inspect.getdoc(f) or "").split("\n")[0]
        sig = str(inspect.signature(f))
        print(f"{name:28s} {doc}\n{'':28s} {sig}")
    return 0
