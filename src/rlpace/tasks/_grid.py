"""`tasks=grid:<family>` / `tasks=grid:rg:...`: a procedural generator as a parameter grid,
one cell per parameter value.

The task set holds every size of the family as its own distribution (`grid:sort` → sort1 …
sort8, held-out prompts over the whole range). In the built-in trainer the Scheduler's pool is
the grid itself (`grid_pool`: one entry per cell, its features the mean `prompt_features` of
the cell's items), and every proposed cell is rolled out on a *fresh* item of that size
(`cell_keys` → `rlpace.tasks._generator.fresh_items`, a pure function of (seed, cell, step,
round, slot)), as the robot code draws a fresh episode at each chosen disturbance.
`criticality_grid` (docs/methods/criticality_grid.md) is the proposal over the cells: a
predictor over the cells' parameters scores each cell's pass rate, q oversamples the critical
ones, the loss is weighted by p/q. Any other policy runs on the same pool of cells.

A reasoning-gym dataset is a generator too, its config the parameters:

    tasks=grid:rg:NAME:FIELD=v1,v2,...[;key=value;...]
    e.g.  grid:rg:knights_knaves:n_people=3,4,5,6
          grid:rg:basic_arithmetic:max_terms=2,3,4;max_digits=1

The first key=value item is the grid: one cell per value (numbers, each once); the other
items are fixed config shared by every cell, read as in `tasks=rg:...`. A cell is named by
its own single-distribution spec, `rg:knights_knaves:n_people=3` (the grid field first, then
the fixed items: `rg_cell` reads it back), its difficulty is its value, and its feature is
the value over the grid's largest |value| (`grid_pool`: [3, 4, 5, 6] → [0.5, 0.667, 0.833, 1]).
A fresh item of cell c is reasoning-gym's item for that config at the seed
`default_rng([seed, 7, c, step, round, slot]).integers(2**31 − 1)` (`fresh_items`; redrawn
from the same stream while it is a held-out prompt). Every value is checked by
reasoning-gym's own config validation before any item is generated (`rg_grid`).

>>> ts = grid_taskset("grid:max", train_per_domain=2, heldout_per_domain=1)
>>> ts.domains[:3], len(ts.domains)
(('max1', 'max10', 'max2'), 10)
>>> grid_cells("grid:rg:knights_knaves:n_people=3,4;depth_constraint=1")
['rg:knights_knaves:n_people=3;depth_constraint=1', 'rg:knights_knaves:n_people=4;depth_constraint=1']
"""

from __future__ import annotations

from ..errors import InputError
import ast
import functools
import math

import numpy as np

from ..types import Pool
from ._embedded import FAMILIES, embedded_suite
from ._features import prompt_features
from ._rg import RGSpec, reasoning_gym_suite, rg_check, rg_config, rg_spec

__all__ = ["GRID_PREFIX", "RG_GRID_PREFIX", "RG_CELL_PREFIX", "grid_taskset", "grid_cells", "grid_pool",
           "cell_keys", "rg_grid", "rg_cell"]

GRID_PREFIX = "grid:"
RG_GRID_PREFIX = "grid:rg:"
RG_CELL_PREFIX = "rg:"          # a reasoning-gym cell's name: its own spec, rg:NAME:FIELD=v;key=value...
_RG_SYNTAX = ("grid:rg:NAME:FIELD=v1,v2,...[;key=value;...] (the first item is the grid, e.g. "
              "grid:rg:knights_knaves:n_people=3,4,5,6)")


def _cell_name(dataset: str, config: dict) -> str:
    return f"{RG_CELL_PREFIX}{dataset}:" + ";".join(f"{k}={v!r}" for k, v in config.items())


@functools.lru_cache(maxsize=4096)
def rg_cell(name: str) -> RGSpec:
    """The distribution a reasoning-gym cell name describes: 'rg:NAME:FIELD=v;key=value...' →
    RGSpec(NAME, label=name, difficulty=v, config in the name's order). ValueError for a name
    that is not one (`rg_grid` names every cell so that it reads back exactly).

    >>> rg_cell("rg:knights_knaves:n_people=4;depth_constraint=1")
    ('knights_knaves', 'rg:knights_knaves:n_people=4;depth_constraint=1', 4.0, {'n_people': 4, 'depth_constraint': 1})
    """
    dataset, _, text = name[len(RG_CELL_PREFIX):].partition(":") if name.startswith(RG_CELL_PREFIX) else ("", "", "")
    config = rg_config(text, name) if dataset else {}
    value = next(iter(config.values()), None)
    if not _is_number(value):
        raise InputError(f"{name!r} is not a reasoning-gym grid cell 'rg:NAME:FIELD=number[;key=value...]'.")
    return rg_spec(dataset.strip(), name, float(value), **config)


def _is_number(v) -> bool:
    return isinstance(v, (bool, int, float)) and math.isfinite(v)


def rg_grid(spec: str) -> list[RGSpec]:
    """The cells of 'grid:rg:NAME:FIELD=v1,v2,...[;key=value...]' as reasoning-gym specs, in the
    order of the values: label = the cell's name (`rg_cell`), difficulty = its value, config =
    {FIELD: value, **fixed}. Every input error is a ValueError naming the field, before any
    item is generated (the dataset, the field names, each value through reasoning-gym's own
    config validation).

    >>> [(s.label, s.difficulty) for s in rg_grid("grid:rg:knights_knaves:n_people=3,5")]
    [('rg:knights_knaves:n_people=3', 3.0), ('rg:knights_knaves:n_people=5', 5.0)]
    """
    s = spec.strip()
    if not s.startswith(RG_GRID_PREFIX):
        raise InputError(f"a reasoning-gym grid task spec is {_RG_SYNTAX}; got {spec!r}.")
    dataset, _, text = s[len(RG_GRID_PREFIX):].partition(":")
    dataset = dataset.strip()
    if "|" in s:
        raise InputError(f"tasks={spec!r}: a grid runs over one reasoning-gym dataset; drop the '|' parts.")
    field, eq, values_text = text.split(";")[0].partition("=")
    field = field.strip()
    if not dataset or not field or not eq:
        raise InputError(f"tasks={spec!r} names no grid field; write {_RG_SYNTAX}.")
    values = []
    for v in (v.strip() for v in values_text.split(",")):
        try:
            val = ast.literal_eval(v)
        except (ValueError, SyntaxError):
            val = v
        if not _is_number(val):
            raise InputError(f"tasks={spec!r}: grid field {field!r} has the value {v!r}; a grid's values are "
                             f"finite numbers separated by commas (e.g. {field}=3,4,5).")
        if val in values:
            raise InputError(f"tasks={spec!r}: grid field {field!r} repeats the value {v}; give each value once.")
        values.append(val)
    rest = text.split(";")[1:]
    for item in rest:               # a bare list of values after the first item: only that one is the grid
        key, _, raw = item.partition("=")
        if "," in raw and raw.strip()[:1] not in "([{'\"":
            raise InputError(f"tasks={spec!r}: {key.strip()}={raw.strip()} lists values, but only the first "
                             f"key=value item is the grid; put the grid field first ({_RG_SYNTAX}).")
    fixed = rg_config(";".join(rest), spec)
    if field in fixed:
        raise InputError(f"tasks={spec!r}: {field!r} is the grid field; it cannot also be fixed.")
    cells = [rg_spec(dataset, _cell_name(dataset, {field: v, **fixed}), float(v), **{field: v, **fixed})
             for v in values]       # ValueError naming an unknown dataset or config field
    for c in cells:
        rg_check(c, spec)
        if rg_cell(c.label) != c:
            raise InputError(f"tasks={spec!r}: the fixed config {fixed} cannot be written in a cell name that "
                             f"reads back; use plain numbers, words or tuples as values.")
    return cells


def grid_cells(spec: str) -> list[str]:
    """The cells (distribution names) of 'grid:<family>', smallest size first, or of
    'grid:rg:NAME:FIELD=v1,v2,...' in the order of the values (`rg_grid`); ValueError naming
    the families, the field or the value otherwise."""
    if not isinstance(spec, str) or not spec.strip().startswith(GRID_PREFIX):
        raise InputError(f"a grid task spec is 'grid:<family>' or {_RG_SYNTAX}; got {spec!r}.")
    if spec.strip().startswith(RG_GRID_PREFIX):
        return [c.label for c in rg_grid(spec)]
    family = spec.strip()[len(GRID_PREFIX):].strip()
    if family not in FAMILIES:
        raise InputError(f"tasks={spec!r}: unknown family {family!r}; embedded families are "
                         f"{', '.join(sorted(FAMILIES))} (e.g. tasks=grid:sort).")
    return [f"{family}{s}" for s in FAMILIES[family][1]]


def grid_taskset(spec: str, *, train_per_domain: int = 256, heldout_per_domain: int = 32, seed: int = 0):
    """The task set of `tasks=grid:<family>`: the embedded suite over every size of the family;
    of `tasks=grid:rg:...`: `reasoning_gym_suite` over the cells (`rg_grid`), named `spec`."""
    if spec.strip().startswith(RG_GRID_PREFIX):
        return reasoning_gym_suite(rg_grid(spec), train_per_domain, heldout_per_domain, seed, name=spec.strip())
    return embedded_suite(",".join(grid_cells(spec)), train_per_domain=train_per_domain,
                          heldout_per_domain=heldout_per_domain, seed=seed)


def grid_pool(tasks) -> Pool:
    """The Scheduler's pool under `tasks=grid:<family>`: one entry per cell (distribution) of
    `tasks`, in the sorted order of `tasks.domains`; difficulty = the size; features = the mean
    `prompt_features` row of the cell's training items. Under `tasks=grid:rg:...` (every domain
    a reasoning-gym cell, `rg_cell`): difficulty = the cell's value v, features = [v / max |v|]
    over the grid (the config value, normalised as a size is; [v] when every v is 0).

    >>> p = grid_pool(grid_taskset("grid:max", train_per_domain=2, heldout_per_domain=1))
    >>> len(p), p.domain_names[:2], p.difficulty[:2].tolist(), p.features[:2, 1].astype(float).round(2).tolist()
    (10, ('max1', 'max10'), [1.0, 10.0], [0.1, 1.0])
    """
    names = tasks.domains
    if names and all(n.startswith(RG_CELL_PREFIX) for n in names):       # a reasoning-gym grid
        v = np.array([rg_cell(n).difficulty for n in names], np.float64)   # [K] the grid field's values
        top = np.abs(v).max()
        return Pool(list(names), difficulty=v, features=(v / (top if top > 0 else 1.0))[:, None].astype(np.float32))
    f = prompt_features(tasks).astype(np.float64)                                   # [N, F + 2]
    code = np.array([names.index(it.domain) for it in tasks.train], dtype=np.int64)
    sums = np.zeros((len(names), f.shape[1]))
    np.add.at(sums, code, f)
    feats = sums / np.bincount(code, minlength=len(names))[:, None]
    size = {it.domain: it.difficulty for it in tasks.train}
    return Pool(list(names), difficulty=[size[n] for n in names], features=feats.astype(np.float32))


def cell_keys(cells: np.ndarray, step: int, round_: int) -> np.ndarray:
    """int64[n, 4] item keys (cell, step, round, slot j) of the proposed cells, the rows
    `fresh_items` turns into new items (slot = position in the round, so keys never repeat).

    >>> cell_keys(np.array([2, 0]), step=5, round_=1).tolist()
    [[2, 5, 1, 0], [0, 5, 1, 1]]
    """
    c = np.asarray(cells, np.int64)
    n = c.shape[0]
    return np.stack([c, np.full(n, step), np.full(n, round_), np.arange(n)], axis=1).astype(np.int64)
