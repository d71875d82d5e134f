"""Value checks for restored state: what `Scheduler.load_state_dict` runs before it replaces
anything.

A checkpoint is data from disk: its keys, shapes and dtypes can be right while its values
are not (a NaN in a window, a negative Beta parameter, a buffer id ≥ N, a cursor past the
ring's end). Such a state would fail later, far from its cause, or run silently wrong.
Three layers of checks, each a ValueError naming the state key and the fix:

1. generic, on every array of every state (built-in or user policy): floats are finite —
   or NaN, in an array whose fresh `init` state holds NaN (the policy's "not measured yet"
   marker, as `oracle_boundary` uses). Policies keep their state finite for any finite
   input, so inf, or NaN elsewhere, can only come from a corrupt or edited file.
2. by state type, for the records rlpace itself defines: each record declares its field
   rules beside its fields, as a class attribute `STATE_RULES = {field: rule}` (rules:
   "nonneg" counts ≥ 0, "pos" > 0, "unit" in [0, 1], "prob" a distribution, "ids" prompt
   ids in [0, N) or −1 = empty, "step" a step ≥ −1) — `History`, `Counters` and every
   built-in policy's state, one place per record. The structural rules of the shared
   records (`Window`, `SumTree`: ring cursors, sum-tree sums) and the few that relate two
   fields of a policy's state are below (`_special`).
3. the policy's own `DataPolicy.check_state(state, pool)`, when it defines one: the place
   for constraints only the policy knows (see `rlpace.policies.DataPolicy`).

>>> import numpy as np
>>> from rlpace.stats._window import Window
>>> check_tree(Window(np.zeros((2, 3)), np.array([0, 3]), np.array([0, 3])), "w", None)
Traceback (most recent call last):
...
ValueError: state['w/cursor'] has values outside [0, 3) (first: 3 at index (1,)); the state is corrupt or was edited: restore one written by Scheduler.state_dict().
"""

from __future__ import annotations

from ..errors import InputError
from typing import Any

import numpy as np

from .._checks import bad

__all__ = ["check_tree", "check_finite", "check_range", "check_ring", "bad", "COUNT_MAX", "count_limit"]


def check_finite(key: str, arr: np.ndarray, nan_ok: bool = False) -> None:
    arr = np.asarray(arr)
    if arr.dtype.kind in "fc":
        wrong = np.isinf(arr) if nan_ok else ~np.isfinite(arr)
        if wrong.any():
            raise bad(key, "has inf values" if nan_ok else "has NaN or inf values", arr, wrong)


def _range(key: str, arr, low=None, high=None, high_open=True, low_open=False) -> None:
    arr = np.asarray(arr)
    mask = np.zeros(arr.shape, bool)
    if low is not None:
        mask |= (arr <= low) if low_open else (arr < low)
    if high is not None:
        mask |= (arr >= high) if high_open else (arr > high)
    if mask.any():
        lo = "-inf" if low is None else f"{low:g}"
        hi = "inf" if high is None else f"{high:g}"
        interval = f"{'(' if low_open or low is None else '['}{lo}, {hi}{')' if high_open or high is None else ']'}"
        raise bad(key, f"has values outside {interval}", arr, mask)


def _distribution(key: str, arr) -> None:
    arr = np.asarray(arr, dtype=np.float64)
    _range(key, arr, 0.0, 1.0, high_open=False)
    total = arr.sum(axis=-1)
    if arr.size and not np.allclose(total, 1.0, rtol=0, atol=1e-6):
        raise InputError(f"state[{key!r}] is not a probability distribution (sums to "
                         f"{np.ravel(total)[0]!r}); the state is corrupt or was edited: restore one "
                         f"written by Scheduler.state_dict().")


# ---- rules by field, for the state records rlpace defines ----------------------------------
NONNEG, POS, UNIT, PROB, IDS, STEP = "nonneg", "pos", "unit", "prob", "ids", "step"
_STEP_MAX = 2**62
#: Counts and steps in a loaded state are < COUNT_MAX = 2**62 (2**62 rollouts is ~10**18: no
#: run reaches it), far enough below int64's 2**63 − 1 that later increments cannot wrap a
#: count or turn it into uint64; a narrower integer counter gets half its dtype's range.
COUNT_MAX = 2**62


def count_limit(dtype) -> int:
    """The bound on a count of `dtype` in a loaded state: COUNT_MAX for int64, half the
    range of a narrower integer dtype (int32: 2**30); COUNT_MAX for float counts too."""
    dtype = np.dtype(dtype)
    if dtype.kind not in "iu":
        return COUNT_MAX
    return min(COUNT_MAX, (int(np.iinfo(dtype).max) + 1) // 2)

def _field_rule(key: str, arr, rule: str, n: int | None) -> None:
    if rule == NONNEG:
        _range(key, arr, 0, count_limit(np.asarray(arr).dtype))
    elif rule == POS:
        _range(key, arr, 0, low_open=True)
    elif rule == UNIT:
        _range(key, arr, 0.0, 1.0, high_open=False)
    elif rule == PROB:
        _distribution(key, arr)
    elif rule == STEP:
        _range(key, arr, -1, min(_STEP_MAX, count_limit(np.asarray(arr).dtype)))   # −1 = never observed
    elif rule == IDS and n is not None:
        _range(key, arr, -1, n)                           # −1 = empty slot


def _ring(key: str, node) -> None:
    """A ring buffer with `cursor` (next slot) in [0, W) and `filled` in [0, W]."""
    w = np.asarray(node.reward if hasattr(node, "reward") else node.values).shape[-1]
    _range(f"{key}cursor", node.cursor, 0, w)
    _range(f"{key}filled", node.filled, 0, w, high_open=False)


def _special(name: str, key: str, node, pool) -> None:
    n = None if pool is None else len(pool)
    if hasattr(node, "check_values"):      # rules that relate fields, declared by the record
        node.check_values(key, pool)
    if name == "Window":
        _ring(key, node)
    elif name == "SumTree":
        tree, size = np.asarray(node.tree, dtype=np.float64), int(np.asarray(node.size))
        cap = tree.shape[0] // 2
        _range(f"{key}size", node.size, 0, cap, high_open=False)
        if n is not None and size != n:
            raise InputError(f"state[{key + 'size'!r}] is {size} but the pool has {n} prompts; the "
                             f"state is corrupt or was edited: restore one written by Scheduler.state_dict().")
        _range(f"{key}tree", tree, 0.0)
        pad = tree[cap + size:]
        if (pad != 0).any():    # a leaf past the N real ones would be drawn as prompt id ≥ N
            raise bad(f"{key}tree", "has weight on padding leaves past the pool size", tree,
                      np.r_[np.zeros(cap + size, bool), pad != 0])
        if cap > 1:
            # every inner node is the sum of its two children (what sampling relies on)
            child = tree[2:2 * cap:2] + tree[3:2 * cap:2]
            if not np.allclose(tree[1:cap], child, rtol=1e-9, atol=1e-12):
                raise bad(f"{key}tree", "is not a sum tree (an inner node differs from the sum of its "
                          "children)", tree[1:cap], ~np.isclose(tree[1:cap], child, rtol=1e-9, atol=1e-12))


def check_tree(node: Any, prefix: str, pool, nan_ok: frozenset = frozenset()) -> None:
    """Check every array under `node` (a state tree as `Scheduler._tree()` holds it):
    floats finite everywhere (NaN allowed in the keys of `nan_ok`), and the rules of the
    rlpace state records found on the way. `prefix` is the node's state-dict key
    ("policy/mixture"), used in messages."""
    prefix = prefix.rstrip("/") + "/" if prefix else ""
    if isinstance(node, dict):
        for k, v in node.items():
            check_tree(v, f"{prefix}{k}", pool, nan_ok)
        return
    if isinstance(node, tuple):
        fields = getattr(node, "_fields", None)
        names = fields if fields is not None else [str(i) for i in range(len(node))]
        for k, v in zip(names, node):
            check_tree(v, f"{prefix}{k}", pool, nan_ok)
        if fields is not None:
            tname = type(node).__name__
            n = None if pool is None else len(pool)
            for field, rule in getattr(type(node), "STATE_RULES", {}).items():
                if field in fields:
                    _field_rule(f"{prefix}{field}", getattr(node, field), rule, n)
            _special(tname, prefix, node, pool)
        return
    if node is None:
        return
    key = prefix.rstrip("/")
    check_finite(key, np.asarray(node), key in nan_ok)


#: For the `check_values(key, pool)` of a state record: `check_range(key, arr, low, high,
#: high_open=True, low_open=False)` and `check_ring(key, ring)` (cursor in [0, W), filled in
#: [0, W]), each raising the InputError that names state[key].
check_range, check_ring = _range, _ring
