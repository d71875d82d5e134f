"""`make_taskset(spec)`: one string names a task set (what `TrainConfig.tasks` holds)."""

from __future__ import annotations

from ..errors import InputError
import ast
import warnings
from pathlib import Path

from ._embedded import DEFAULT_SUITE, SUITES, embedded_suite
from ._grid import GRID_PREFIX, grid_taskset
from ._parquet import read_taskset
from ._rg import knights_knaves_suite, reasoning_gym_suite, rg_spec
from ._types import TaskSet

__all__ = ["make_taskset", "SPEC_HELP"]

# What each named suite is, for the help text; the names themselves come from `SUITES`, so a
# suite added there is listed without an edit here (one without a note is listed bare).
SUITE_NOTES = {"embedded": "the default 12-distribution suite",
               "ladder": "a curriculum ladder with headroom",
               "mostly_solved": "a mostly solved / unsolvable pool with headroom",
               "mostly_solved_last": "the earlier mostly_solved",
               "sort_ladder": "the earlier ladder",
               "families_parallel": "eight families side by side, learned in parallel",
               "small_domains": "seven small prompt spaces beside three large ones"}


def _suite_help() -> str:
    return ", ".join(f"'{name}'" + (f" ({SUITE_NOTES[name]})" if name in SUITE_NOTES else "")
                     for name in SUITES)


SPEC_HELP = (f"a named suite: {_suite_help()}; or "
             "'embedded:add1,rev3,...', "
             "'grid:<family>' (every size of an embedded family, one distribution each: the parameter grid of "
             "criticality_grid), 'grid:rg:NAME:FIELD=v1,v2,...[;key=value]' (a reasoning-gym dataset, one "
             "distribution per value of its config field FIELD, the other items fixed, e.g. "
             "grid:rg:knights_knaves:n_people=3,4,5,6), 'knights_knaves' (DUMP's 3…14 people via reasoning-gym), "
             "'rg:NAME[:key=value;key=value]|rg:NAME2...' (reasoning-gym datasets, one "
             "distribution each), or a path to a verl train .parquet or .jsonl (as `rlpace prepare` writes; "
             "test.parquet or test.jsonl beside it is the held-out set)")


def _value(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def parse_rg(spec: str) -> list:
    """'rg:basic_arithmetic:max_terms=3;min_terms=2|rg:chain_sum' -> [RGSpec, ...]."""
    out = []
    for k, part in enumerate(p.strip() for p in spec.split("|") if p.strip()):
        if not part.startswith("rg:"):
            raise InputError(f"reasoning-gym task spec parts start with 'rg:'; got {part!r}.")
        name, _, cfg_text = part[3:].partition(":")
        config = {}
        for kv in (s.strip() for s in cfg_text.split(";") if s.strip()):
            key, eq, val = kv.partition("=")
            if not eq:
                raise InputError(f"reasoning-gym config item {kv!r} in {part!r} is not key=value.")
            config[key.strip()] = _value(val.strip())
        label = config.pop("label", None)
        difficulty = float(config.pop("difficulty", k))
        out.append(rg_spec(name.strip(), label, difficulty, **config))
    return out


def make_taskset(spec: str = "embedded", *, train_per_domain: int = 256,
                 heldout_per_domain: int = 32, seed: int = 0) -> TaskSet:
    """Build the task set a spec string names (see `SPEC_HELP`). Raises ValueError for an
    unknown name, dataset or config field before generating anything.

    >>> make_taskset("embedded:add1,rev3", train_per_domain=4, heldout_per_domain=2).domains
    ('add1', 'rev3')
    """
    if not isinstance(spec, str) or not spec.strip():
        raise InputError(f"tasks must be a non-empty string: {SPEC_HELP}.")
    s = spec.strip()
    if s == "embedded":
        return embedded_suite(DEFAULT_SUITE, train_per_domain=train_per_domain,
                              heldout_per_domain=heldout_per_domain, seed=seed)
    if s in SUITES:               # the headroom suites; their warm-up shares: SUITES[s][1]
        return embedded_suite(SUITES[s][0], train_per_domain=train_per_domain,
                              heldout_per_domain=heldout_per_domain, seed=seed)
    if s.startswith("embedded:"):
        return embedded_suite(s[len("embedded:"):], train_per_domain=train_per_domain,
                              heldout_per_domain=heldout_per_domain, seed=seed)
    if s.startswith(GRID_PREFIX):      # a family's sizes / an rg config field as a parameter grid (criticality_grid)
        return grid_taskset(s, train_per_domain=train_per_domain,
                            heldout_per_domain=heldout_per_domain, seed=seed)
    if s == "knights_knaves":
        return knights_knaves_suite(train_per_domain=train_per_domain,
                                    heldout_per_domain=heldout_per_domain, seed=seed)
    if s.startswith("rg:"):
        return reasoning_gym_suite(parse_rg(s), train_per_domain, heldout_per_domain, seed, name=s)
    if s.endswith((".parquet", ".jsonl")):      # verl's parquet, or the .jsonl `rlpace prepare` writes
        path = Path(s)
        if not path.is_file():
            raise InputError(f"tasks={s!r}: no such {'parquet' if s.endswith('.parquet') else 'JSON-lines'} file.")
        # the held-out set: test<same suffix> beside it, else verl's test.parquet
        test = next((t for t in (path.with_name("test" + path.suffix), path.with_name("test.parquet"))
                     if t.is_file() and t != path), path.with_name("test.parquet"))
        has_test = test.is_file() and test != path
        ts = read_taskset(path, test if has_test else None, name=s)
        if not has_test:
            # Loud, not silent: without it every held-out accuracy is NaN ("nan -> nan").
            warnings.warn(f"tasks={s!r}: no held-out file {str(test)!r} beside it, so held-out accuracy "
                          f"is not measured (reported as NaN). Write the held-out prompts there in the "
                          f"same schema (verl's test.parquet).", UserWarning, stacklevel=2)
        return ts
    raise InputError(f"unknown task set {spec[:80]!r}: a suite ({', '.join(SUITES)}), "
                     f"embedded:<names>, grid:..., rg:..., or a .parquet / .jsonl file; "
                     f"`rlpace train --help` lists every form.")
