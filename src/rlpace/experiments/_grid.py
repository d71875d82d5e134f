"""Declarative experiment grids: policy configurations × seeds × suites.

A grid is plain data (a Python dict or a YAML file) that expands into one `RunSpec` per
(suite, policy configuration, seed). Paired statistics need *matched seeds*: every policy
runs with every seed on every suite, under one budget (`steps` and `options`).

YAML form (every key but `policies` is optional):

    suites: [sim:ladder]          # or `suite: embedded`; "sim:<scenario>" | "embedded[:<dists>]"
                                  # | a trainer suite: ladder, mostly_solved (rlpace.tasks.SUITES)
    seeds: 8                      # 8 -> seeds 0..7; or an explicit list [0, 1, 5]
    steps: 200                    # training steps per run (the budget)
    options:                      # backend options, the same for every run (budget!)
      batch_size: 32
      group_size: 8
      eval_every: 10
    policies:
      - uniform                   # a bare registry name: label = name, no kwargs
      - name: dump
        kwargs: {c: 0.5}
        label: dump_c0.5          # the row name in every table; must be unique

Example:
    >>> g = Grid.from_dict({"suite": "sim:ladder", "seeds": 2, "steps": 5,
    ...                     "policies": ["uniform", {"name": "dump", "kwargs": {"c": 0.5}}]})
    >>> [r.run_id for r in g.runs()]
    ['sim-ladder__uniform__seed0', 'sim-ladder__uniform__seed1', 'sim-ladder__dump__seed0', 'sim-ladder__dump__seed1']
"""

from __future__ import annotations

from ..errors import InputError
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

__all__ = ["PolicyConfig", "Grid", "RunSpec", "load_grid", "suite_backend"]

_LABEL_OK = re.compile(r"^[A-Za-z0-9_.+\-=]+$")


def suite_backend(suite: str) -> str:
    """The backend that runs `suite`: "sim" for "sim:<scenario>"; "embedded" (the built-in
    trainer) for "embedded", "embedded:<distributions>" and the trainer's named suites
    (`rlpace.tasks.SUITES`: ladder, mostly_solved, ...); InputError otherwise."""
    if suite.startswith("sim:") and len(suite) > 4:
        return "sim"
    from ..tasks._embedded import SUITES
    if suite in SUITES or suite.startswith("embedded:"):
        return "embedded"
    raise InputError(f"unknown suite {suite!r}; use 'sim:<scenario>' (see rlpace.sim.SCENARIOS), a "
                     f"built-in trainer suite ({', '.join(sorted(SUITES))}) or 'embedded:<distributions>'.")


@dataclass(frozen=True)
class PolicyConfig:
    """One row of the comparison: a policy name, its hyperparameters, and a label.

    Attributes:
        name: registry name, '+'-joined names, or a dotted path (`rlpace.policies.names()`).
        kwargs: hyperparameters passed to the policy factory.
        label: the row name in tables and plots; defaults to `name`. Unique in a grid.
    """

    name: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    label: str = ""

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise InputError(f"PolicyConfig.name must be a non-empty string; got {self.name!r}.")
        if not isinstance(self.kwargs, Mapping):
            raise InputError(f"PolicyConfig.kwargs of {self.name!r} must be a mapping; got "
                             f"{type(self.kwargs).__name__}.")
        label = self.label or self.name
        if not _LABEL_OK.match(label):
            raise InputError(f"policy label {label!r} may only use letters, digits and _.+-=; it "
                             f"names record files. Pass label=... with a simpler name.")
        object.__setattr__(self, "label", label)
        object.__setattr__(self, "kwargs", dict(self.kwargs))

    @classmethod
    def parse(cls, item: Any) -> "PolicyConfig":
        """From a bare name ("dump"), a dict {name, kwargs?, label?}, or a PolicyConfig."""
        if isinstance(item, PolicyConfig):
            return item
        if isinstance(item, str):
            return cls(item)
        if isinstance(item, Mapping):
            unknown = set(item) - {"name", "kwargs", "label"}
            if unknown or "name" not in item:
                raise InputError(f"a policy entry needs 'name' and may have 'kwargs' and 'label'; got "
                                 f"keys {sorted(item)}.")
            return cls(item["name"], item.get("kwargs") or {}, item.get("label") or "")
        raise InputError(f"a policy entry must be a name or a mapping; got {type(item).__name__}.")


@dataclass(frozen=True)
class RunSpec:
    """One run of a grid (picklable: it crosses into worker processes).

    Attributes:
        run_id: "<suite slug>__<label>__seed<k>", also the record file's stem.
        suite, policy, policy_kwargs, label, seed: what to run.
        steps: training steps (the budget).
        options: backend options (batch_size, group_size, eval_every, target, ...).
    """

    run_id: str
    suite: str
    policy: str
    policy_kwargs: Mapping[str, Any]
    label: str
    seed: int
    steps: int
    options: Mapping[str, Any]

    @property
    def backend(self) -> str:
        return suite_backend(self.suite)

    def to_dict(self) -> dict:
        return json.loads(json.dumps(asdict(self), sort_keys=True, default=str))


def _slug(suite: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.\-]+", "-", suite)


@dataclass(frozen=True)
class Grid:
    """Policy configurations × seeds × suites under one budget.

    Attributes:
        policies: tuple of `PolicyConfig` (labels unique).
        seeds: tuple of int seeds, shared by every policy (matched seeds).
        suites: tuple of suite names ("sim:<scenario>", "embedded", "ladder", ...).
        steps: training steps per run.
        options: backend options shared by every run (batch_size, group_size, ...).
    """

    policies: tuple
    seeds: tuple
    suites: tuple
    steps: int
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        pols = tuple(PolicyConfig.parse(p) for p in self.policies)
        if not pols:
            raise InputError("Grid.policies is empty; list at least one policy (e.g. uniform and the "
                             "policy to compare).")
        labels = [p.label for p in pols]
        dup = sorted({x for x in labels if labels.count(x) > 1})
        if dup:
            raise InputError(f"Grid.policies has duplicate labels {dup}; give each configuration its "
                             f"own label (label: ...).")
        seeds = self.seeds
        if isinstance(seeds, int) and not isinstance(seeds, bool):
            if seeds < 1:
                raise InputError(f"Grid.seeds must be ≥ 1 (or a list of seeds); got {seeds}.")
            seeds = tuple(range(seeds))
        seeds = tuple(seeds)
        if not seeds or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
            raise InputError(f"Grid.seeds must be a count or a non-empty list of ints; got {self.seeds!r}.")
        if len(set(seeds)) != len(seeds):
            raise InputError(f"Grid.seeds has duplicates: {list(seeds)}.")
        suites = (self.suites,) if isinstance(self.suites, str) else tuple(self.suites)
        if not suites:
            raise InputError("Grid.suites is empty; give e.g. 'sim:ladder' or 'embedded'.")
        for s in suites:
            suite_backend(s)
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise InputError(f"Grid.steps must be an int ≥ 1; got {self.steps!r}.")
        if not isinstance(self.options, Mapping):
            raise InputError(f"Grid.options must be a mapping; got {type(self.options).__name__}.")
        object.__setattr__(self, "policies", pols)
        object.__setattr__(self, "seeds", seeds)
        object.__setattr__(self, "suites", suites)
        object.__setattr__(self, "options", dict(self.options))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Grid":
        """From the YAML/dict form in the module docstring; unknown keys are an error."""
        known = {"policies", "seeds", "suite", "suites", "steps", "options"}
        unknown = sorted(set(d) - known)
        if unknown:
            raise InputError(f"unknown grid key(s) {unknown}; valid keys: {sorted(known)}.")
        if "policies" not in d:
            raise InputError("a grid needs 'policies' (a list of names or {name, kwargs, label}).")
        if "suite" in d and "suites" in d:
            raise InputError("give either 'suite' or 'suites' in a grid, not both.")
        suites = d.get("suites", d.get("suite", "sim:ladder"))
        return cls(policies=tuple(d["policies"]), seeds=d.get("seeds", 8), suites=suites,
                   steps=d.get("steps", 200), options=d.get("options") or {})

    def to_dict(self) -> dict:
        return {"suites": list(self.suites), "seeds": list(self.seeds), "steps": self.steps,
                "options": dict(self.options),
                "policies": [{"name": p.name, "kwargs": dict(p.kwargs), "label": p.label}
                             for p in self.policies]}

    def runs(self) -> list[RunSpec]:
        """Every run, suite-major then policy then seed (so early results pair up)."""
        out = []
        for suite in self.suites:
            for p in self.policies:
                for seed in self.seeds:
                    out.append(RunSpec(run_id=f"{_slug(suite)}__{p.label}__seed{seed}", suite=suite,
                                       policy=p.name, policy_kwargs=dict(p.kwargs), label=p.label,
                                       seed=int(seed), steps=int(self.steps),
                                       options=dict(self.options)))
        return out


def load_grid(path: str | Path) -> Grid:
    """Read a grid from a YAML (.yaml/.yml) or JSON file."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    if path.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError as e:  # pragma: no cover - pyyaml is in the report extra
            raise ImportError("reading a YAML grid needs pyyaml: pip install 'rlpace[report]'") from e
        data = yaml.safe_load(text)
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise InputError(f"{path}: not valid JSON ({e}); fix the grid file.") from None
    if not isinstance(data, Mapping):
        raise InputError(f"{path}: a grid file must hold a mapping at the top level.")
    return Grid.from_dict(data)
