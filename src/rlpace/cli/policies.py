"""List the registered policies: the first line of each factory's docstring (one complete
sentence), its signature, and its method page in the project's docs."""

from __future__ import annotations

import inspect


def add_arguments(parser) -> None:
    pass


def summary(factory) -> str:
    """The first line of the factory's docstring (PEP 257's summary line)."""
    return (inspect.getdoc(factory) or "").split("\n")[0].strip()


#: Registered names documented on a page of another name (one page covers both oracles).
SHARED_PAGES = {"oracle_boundary": "oracle", "oracle_progress": "oracle"}


def doc_page(name: str) -> str:
    """The method page of a registered policy, relative to the repository root."""
    return f"docs/methods/{SHARED_PAGES.get(name, name)}.md"


def run(args) -> int:
    from rlpace.policies._registry import _REGISTRY
    for name in sorted(_REGISTRY):
        f = _REGISTRY[name]
        pad = " " * 28
        print(f"{name:28s} {summary(f)}\n{pad} {inspect.signature(f)}\n{pad} {doc_page(name)}")
    print("\nEach method's rule, paper and deviations: docs/methods/<name>.md "
          "(index: docs/methods/README.md).")
    return 0
