"""Registry of policies by name, plus dotted-path import for user code.

A registry entry is a factory `(**hyperparameters) -> DataPolicy | Method`. Names are
what configs, the CLI and the engine adapters use (`Scheduler(pool, "dump", c=0.5)`);
user code can be named as `"my_pkg.my_module:my_factory"` (or `my_pkg.my_module.my_factory`)
without registering it.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Callable

from ._base import DataPolicy, Method, compose

_REGISTRY: dict[str, Callable[..., DataPolicy | Method]] = {}


def register(name: str, factory: Callable[..., DataPolicy | Method] | None = None):
    """Register `factory` under `name` (usable as a decorator). Re-registering a name is
    an error, so two plugins cannot silently shadow each other."""
    def deco(f):
        if name in _REGISTRY and _REGISTRY[name] is not f:
            raise ValueError(f"policy name {name!r} is already registered; pick another name.")
        _REGISTRY[name] = f
        return f
    return deco(factory) if factory is not None else deco


def names() -> list[str]:
    """All registered policy names, sorted."""
    return sorted(_REGISTRY)


def _resolve(spec: str) -> Callable:
    if spec in _REGISTRY:
        return _REGISTRY[spec]
    if ":" in spec or "." in spec:
        mod_name, _, attr = spec.rpartition(":") if ":" in spec else spec.rpartition(".")
        try:
            mod = importlib.import_module(mod_name)
        except ImportError as e:
            raise ValueError(f"cannot import module {mod_name!r} for policy {spec!r}: {e}") from e
        if not hasattr(mod, attr):
            raise ValueError(f"module {mod_name!r} has no attribute {attr!r} (policy {spec!r}).")
        return getattr(mod, attr)
    raise ValueError(f"unknown policy {spec!r}. Valid names: {', '.join(names())}; "
                     f"or a dotted path 'package.module:factory' to your own.")


def check_kwargs(factory: Callable, kwargs: dict, spec: str) -> None:
    """Reject keyword arguments the factory does not take, listing the valid ones."""
    sig = inspect.signature(factory)
    if any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        return
    valid = [p for p in sig.parameters if p != "self"]
    unknown = sorted(set(kwargs) - set(valid))
    if unknown:
        raise ValueError(f"unknown keyword argument(s) {unknown} for policy {spec!r}; "
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
            raise ValueError(f"keyword arguments {sorted(kwargs)} given with an already built "
                             f"method; pass them to its factory instead.")
        return spec
    if isinstance(spec, DataPolicy):
        if kwargs:
            raise ValueError(f"keyword arguments {sorted(kwargs)} given with an already built "
                             f"policy; pass them to its factory instead.")
        return compose(spec, name=spec.name)
    if not isinstance(spec, str):
        raise TypeError(f"policy must be a name, a DataPolicy or a Method; got {type(spec).__name__}.")
    parts = [s.strip() for s in spec.split("+") if s.strip()]
    if len(parts) == 1:
        out = make_policy(parts[0], **kwargs)
        return out._replace(name=parts[0]) if isinstance(out, Method) else compose(out, name=parts[0])
    factories = [_resolve(p) for p in parts]
    per_part: list[dict] = [{} for _ in parts]
    for key, val in kwargs.items():
        takers = [i for i, f in enumerate(factories) if key in inspect.signature(f).parameters]
        if not takers:
            raise ValueError(f"unknown keyword argument {key!r} for policy {spec!r}; none of "
                             f"{parts} takes it.")
        if len(takers) > 1:
            raise ValueError(f"keyword argument {key!r} is ambiguous in {spec!r} (taken by "
                             f"{[parts[i] for i in takers]}); build the policies with make_policy "
                             f"and join them with compose().")
        per_part[takers[0]][key] = val
    return compose(*[make_policy(p, **kw) for p, kw in zip(parts, per_part)], name=spec)
