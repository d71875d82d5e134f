"""The package's import structure: no import circles, and no arrow from a lower floor to a
higher one — read from the source with `ast`, so a function-level import that hides a circle
from Python at import time is caught too. Module-level and function-level imports are
collected apart (`GRAPH.module`, `GRAPH.function`); both obey the floors. Imports under
`if TYPE_CHECKING:` are for type checkers only (they never run) and are left out."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import NamedTuple

import pytest

import rlpace

ROOT = Path(rlpace.__file__).parent

#: Floors, lowest first: a module may import its own floor and the floors below it. Keyed by
#: the first name under `rlpace` ("" = the package itself, the curated public API).
FLOORS = [
    {"errors", "_checks", "_flow", "_seeding"},   # InputError; shared checks; kwargs parser; generator states
    {"types", "stats"},                     # records; windows, posteriors, sum trees
    {"predict", "optim"},                   # difficulty predictor (policies build on it); ISO merging math
    {"policies"},                           # the algebra and every method
    {"scheduler", ""},                      # the stateful driver; `import rlpace`
    {"sim", "tasks", "prepare"},            # synthetic learner; task suites; dataset annotation
    {"evaluation"},                         # statistics and reports over records given as data
    {"experiments", "train", "adapters", "select", "merge", "advise"},   # runners, trainers, engines
    {"cli", "__main__"},
]
FLOOR = {name: i for i, names in enumerate(FLOORS) for name in names}


class Graph(NamedTuple):
    module: dict    # module -> {(imported module, line)}, imports executed when the module loads
    function: dict  # the same for imports inside a function body


def _name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(node) -> bool:
    """`if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`): a block of annotations' imports."""
    if not isinstance(node, ast.If):
        return False
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def build_graph() -> Graph:
    modules = {_name(p): p for p in ROOT.rglob("*.py")}

    def resolve(name: str) -> str:           # `rlpace.a.b.Thing` -> the module `rlpace.a.b`
        while name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph = Graph({m: set() for m in modules}, {m: set() for m in modules})
    for mod, path in modules.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]

        def visit(node, in_function: bool) -> None:
            for child in ast.iter_child_nodes(node):
                if _type_checking_only(child):
                    continue         # read by type checkers only: never executed, no arrow at run time
                inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                targets = []
                if isinstance(child, ast.Import):
                    targets = [resolve(a.name) for a in child.names if a.name.split(".")[0] == "rlpace"]
                elif isinstance(child, ast.ImportFrom):
                    if child.level:
                        base = package.split(".")[:len(package.split(".")) - child.level + 1]
                        source = ".".join(base + ([child.module] if child.module else []))
                    else:
                        source = child.module or ""
                    if source.split(".")[0] == "rlpace":
                        # `from . import _io` names a module; `from .x import f` a module's member
                        targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in modules else resolve(source)
                                   for a in child.names]
                for t in targets:
                    if t != mod:
                        (graph.function if inner else graph.module)[mod].add((t, child.lineno))
                visit(child, inner)

        visit(ast.parse(path.read_text(encoding="utf-8")), False)
    return graph


GRAPH = build_graph()


def _top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _cycles(edges: dict) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def connect(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w, _ in edges.get(v, ()):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            connect(v)
    return out


def test_every_top_level_name_has_a_floor():
    tops = {_top(m) for m in GRAPH.module}
    assert tops <= set(FLOOR), f"give these a floor in FLOORS: {sorted(tops - set(FLOOR))}"


def test_the_walk_sees_both_kinds_of_import():
    # guards the walker itself: a known module-level and a known function-level edge
    assert "rlpace.types" in {t for t, _ in GRAPH.module["rlpace.scheduler"]}
    assert any(t.startswith("rlpace.train") for m in GRAPH.function if m.startswith("rlpace.cli")
               for t, _ in GRAPH.function[m])


def test_no_import_cycle_among_module_level_imports():
    assert _cycles(GRAPH.module) == []


def test_no_import_cycle_even_through_function_level_imports():
    # a function-level import that closes a circle is a circle postponed, not removed
    both = {m: GRAPH.module[m] | GRAPH.function[m] for m in GRAPH.module}
    assert _cycles(both) == []


@pytest.mark.parametrize("kind", ["module", "function"])
def test_no_import_points_to_a_higher_floor(kind):
    upward = sorted(f"{m}:{line} -> {t} (floor {FLOOR[_top(m)]} -> {FLOOR[_top(t)]})"
                    for m, targets in getattr(GRAPH, kind).items() for t, line in targets
                    if FLOOR[_top(t)] > FLOOR[_top(m)])
    assert upward == []
