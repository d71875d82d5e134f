"""Registry of policies by name, plus dotted-path import of marked user factories.

A registry entry is a factory `(**hyperparameters) -> DataPolicy | Method`. Names are
what configs, the CLI and the engine adapters use (`Scheduler(pool, "dump", c=0.5)`);
user code can be named as `"my_pkg.my_module:my_factory"` (or `my_pkg.my_module.my_factory`)
without registering it, when the factory is marked with `@policy_factory`.

Trust boundary. A policy string comes from configuration (a CLI argument, a grid file,
verl's `data.rlpace.policy`) and its keyword arguments from the same place, so the string
may only ever reach a policy factory — never an arbitrary callable such as `os:system`.
A string resolves to (a) a registered name, or (b) a dotted path whose target is a
registered factory or a function marked `@rlpace.policy_factory`; anything else is
refused before it is called. Standard-library modules are refused before they are
imported. Importing the module of a dotted path runs that module's top-level code, so
the module must come from the import path the user controls (their own package, an
installed plugin), exactly as with any Python import. Objects passed from Python — a
`DataPolicy`, a `Method`, or a factory callable — are code the user wrote and need no mark.
"""

from __future__ import annotations

from ..errors import InputError
import importlib
import inspect
import sys
from typing import Callable

import numpy as np

from ._base import DataPolicy, Method
from ._compose import compose

_REGISTRY: dict[str, Callable[..., DataPolicy | Method]] = {}
# id -> factory of every function marked with @policy_factory (identity, not an attribute
# flag: an object whose __getattr__ answers anything must not pass as marked).
_MARKED: dict[int, Callable] = {}


def policy_factory(factory: Callable[..., DataPolicy | Method]) -> Callable[..., DataPolicy | Method]:
    """Mark `factory` as a policy factory that configuration strings may name by dotted path.

    Only registered names and marked factories can be reached from a string
    (`Scheduler(pool, "my_pkg.policies:my_factory")`, `rlpace simulate --policy ...`,
    a grid file, verl's `data.rlpace.policy`): a string such as `"os:system"` is refused
    before anything is called. The factory is returned unchanged.

    >>> import rlpace
    >>> @rlpace.policy_factory
    ... def my_uniform():
    ...     return rlpace.policies.uniform_pool()
    >>> is_policy_factory(my_uniform), is_policy_factory(print)
    (True, False)
    """
    if not callable(factory) or isinstance(factory, type):
        raise TypeError(f"@policy_factory marks a function returning a DataPolicy or Method; got "
                        f"{factory!r}.")
    _MARKED[id(factory)] = factory
    return factory


def is_policy_factory(obj) -> bool:
    """True when `obj` is a registered factory or one marked with `@policy_factory`."""
    return _MARKED.get(id(obj)) is obj or any(obj is f for f in _REGISTRY.values())


def register(name: str, factory: Callable[..., DataPolicy | Method] | None = None):
    """Register `factory` under `name` (usable as a decorator). Re-registering a name is
    an error, so two plugins cannot silently shadow each other."""
    def deco(f):
        if name in _REGISTRY and _REGISTRY[name] is not f:
            raise InputError(f"policy name {name!r} is already registered; pick another name.")
        _REGISTRY[name] = f
        return f
    return deco(factory) if factory is not None else deco


def names() -> list[str]:
    """All registered policy names, sorted."""
    return sorted(_REGISTRY)


def _refuse(spec: str, why: str) -> InputError:
    return InputError(f"policy {spec!r} {why}: a policy string may only name a registered policy "
                      f"(`rlpace policies`) or a factory marked with @rlpace.policy_factory. Mark "
                      f"your factory, register it (rlpace.policies.register(name, factory)), or pass "
                      f"the policy object itself from Python.")


def _resolve(spec: str) -> Callable:
    """The factory a policy string names (see the module docstring: registered names and
    marked factories only; ValueError otherwise, before anything is called)."""
    if not isinstance(spec, str):
        raise TypeError(f"a policy name must be a string; got {type(spec).__name__}.")
    if spec in _REGISTRY:
        return _REGISTRY[spec]
    if ":" in spec or "." in spec:
        mod_name, _, attr = spec.rpartition(":") if ":" in spec else spec.rpartition(".")
        if not (attr.isidentifier() and mod_name and all(p.isidentifier() for p in mod_name.split("."))):
            raise InputError(f"policy {spec!r} is not a dotted path 'package.module:factory' (nor a "
                             f"registered name: {', '.join(names())}).")
        top = mod_name.partition(".")[0]
        if top in sys.stdlib_module_names or top in sys.builtin_module_names:
            # Refused before the import: a standard-library module never holds a policy factory.
            raise _refuse(spec, f"names the standard-library module {mod_name!r}")
        try:
            mod = importlib.import_module(mod_name)
        except ImportError as e:
            raise InputError(f"cannot import module {mod_name!r} for policy {spec!r}: {e}") from e
        obj = getattr(mod, attr, None)
        if obj is None:
            raise InputError(f"module {mod_name!r} has no attribute {attr!r} (policy {spec!r}).")
        if not is_policy_factory(obj):
            raise _refuse(spec, "is not a policy factory")
        return obj
    raise InputError(f"unknown policy {spec!r}. Valid names: {', '.join(names())}; "
                     f"or a dotted path 'package.module:factory' to your own factory, marked "
                     f"with @rlpace.policy_factory.")


def check_kwargs(factory: Callable, kwargs: dict, spec: str) -> None:
    """Reject keyword arguments the factory does not take, listing the valid ones."""
    sig = inspect.signature(factory)
    if any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        return
    valid = [p for p in sig.parameters if p != "self"]
    unknown = sorted(set(kwargs) - set(valid))
    if unknown:
        raise InputError(f"unknown keyword argument(s) {unknown} for policy {spec!r}; "
                         f"valid ones: {valid}.")


def make_policy(spec: str, **kwargs) -> DataPolicy | Method:
    """Instantiate a registered (or dotted-path) policy with its hyperparameters."""
    factory = _resolve(spec)
    check_kwargs(factory, kwargs, spec)
    out = factory(**kwargs)
    if not isinstance(out, (DataPolicy, Method)):
        raise TypeError(f"policy factory {spec!r} returned {type(out).__name__}; "
                        f"it must return a DataPolicy or a Method.")
    return out


def make_method(spec: str | DataPolicy | Method, **kwargs) -> Method:
    """A full `Method` from a name, a policy or a method (see `compose`). A name may join
    several policies with '+', e.g. "dump+dapo_dynamic_sampling"; keyword arguments then
    go to the policy that accepts them (an argument two of them accept is an error)."""
    if isinstance(spec, Method):
        if kwargs:
            raise InputError(f"keyword arguments {sorted(kwargs)} given with an already built "
                             f"method; pass them to its factory instead.")
        return spec
    if isinstance(spec, DataPolicy):
        if kwargs:
            raise InputError(f"keyword arguments {sorted(kwargs)} given with an already built "
                             f"policy; pass them to its factory instead.")
        return compose(spec, name=spec.name)
    if callable(spec) and not isinstance(spec, (str, type)):
        # A factory passed from Python is the user's own code: no mark needed.
        name = getattr(spec, "__name__", "policy")
        check_kwargs(spec, kwargs, name)
        out = spec(**kwargs)
        if not isinstance(out, (DataPolicy, Method)):
            raise TypeError(f"policy factory {name!r} returned {type(out).__name__}; it must return "
                            f"a DataPolicy or a Method.")
        return out if isinstance(out, Method) else compose(out, name=out.name or name)
    if not isinstance(spec, str):
        raise TypeError(f"policy must be a name, a DataPolicy, a Method or a factory; got "
                        f"{type(spec).__name__}.")
    parts = _parts(spec)
    if len(parts) == 1:
        out = make_policy(parts[0], **kwargs)
        return out._replace(name=parts[0]) if isinstance(out, Method) else compose(out, name=parts[0])
    per_part = _split_kwargs(spec, parts, [_resolve(p) for p in parts], kwargs)
    return compose(*[make_policy(p, **kw) for p, kw in zip(parts, per_part)], name=spec)


def _parts(spec: str) -> list[str]:
    parts = [s.strip() for s in spec.split("+")]
    if not all(parts):
        raise InputError(f"policy {spec!r} has an empty name; give a registered name "
                         f"(`rlpace policies`), several joined with '+' (\"dump+topk\").")
    return parts


def _split_kwargs(spec: str, parts: list[str], factories: list[Callable], kwargs: dict) -> list[dict]:
    """Each keyword argument goes to the one part whose factory takes it."""
    per_part: list[dict] = [{} for _ in parts]
    for key, val in kwargs.items():
        takers = [i for i, f in enumerate(factories) if key in inspect.signature(f).parameters]
        if not takers:
            raise InputError(f"unknown keyword argument {key!r} for policy {spec!r}; none of "
                             f"{parts} takes it.")
        if len(takers) > 1:
            raise InputError(f"keyword argument {key!r} is ambiguous in {spec!r} (taken by "
                             f"{[parts[i] for i in takers]}); build the policies with make_policy "
                             f"and join them with compose().")
        per_part[takers[0]][key] = val
    return per_part


def _plain(value):
    """A JSON-able copy of a hyperparameter value (arrays as lists; other objects by repr)."""
    if isinstance(value, np.ndarray):
        return _plain(value.tolist())
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if callable(value):     # by name: a repr with a memory address would differ on every run
        return f"{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', type(value).__name__)}"
    text = repr(value)
    return f"<{type(value).__module__}.{type(value).__qualname__}>" if " at 0x" in text else text


def hyperparameters(spec, **kwargs) -> list | None:
    """Every hyperparameter of the policy `spec` names, defaults filled in, as
    `[[part, {param: value}], ...]` with JSON-able values — what the Scheduler records in
    its state so that a state saved with other hyperparameters is not restored silently.
    None for an already built `DataPolicy` or `Method` (its factory arguments are unknown).

    >>> hyperparameters("dump+topk", c=5)[0][1]["c"], hyperparameters("dump+topk", c=5)[1][0]
    (5, 'topk')
    """
    if isinstance(spec, (DataPolicy, Method)):
        return None
    if callable(spec) and not isinstance(spec, (str, type)):
        parts, factories, per_part = [getattr(spec, "__name__", "policy")], [spec], [kwargs]
    else:
        parts = _parts(spec)
        factories = [_resolve(p) for p in parts]
        per_part = _split_kwargs(spec, parts, factories, kwargs) if len(parts) > 1 else [kwargs]
    out = []
    for part, factory, kw in zip(parts, factories, per_part):
        try:
            params = inspect.signature(factory).parameters.values()
        except (TypeError, ValueError):
            params = []
        bound = {p.name: p.default for p in params
                 if p.default is not p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
        bound.update(kw)
        out.append([part, {k: _plain(v) for k, v in sorted(bound.items())}])
    return out
