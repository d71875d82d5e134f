"""List the registered policies: the first line of each factory's docstring (one complete
sentence), its signature, and its method page in the project's docs."""

from __future__ import annotations

import inspect


def add_arguments(parser) -> None:
    pass


def summary(factory) -> str:
    """The first line of the factory's docstring (PEP 257's summary line)."""
    return (inspect.getdoc(factory) or "").split("\n")[0].strip()


def run(args) -> int:
    from rlpace.policies._registry import _REGISTRY
    for name in sorted(_REGISTRY):
        f = _REGISTRY[name]
        pad = " " * 28
        print(f"{name:28s} {summary(f)}\n{pad} {inspect.signature(f)}\n{pad} docs/methods/{name}.md")
    print("\nEach method's rule, paper and deviations: docs/methods/<name>.md "
          "(index: docs/methods/README.md).")
    return 0
