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
2. by state type, for the records rlpace itself defines (`Window`, `SumTree`, `History`,
   the built-in policies' states): counts ≥ 0, probabilities a distribution, Beta
   parameters > 0, prompt ids in [0, N) (−1 where the type documents it as "empty"),
   ring cursors inside their ring. A rule whose field a state does not have is skipped.
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

__all__ = ["check_tree", "check_finite", "bad", "COUNT_MAX", "count_limit"]


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

_FIELD_RULES: dict[str, dict[str, str]] = {
    "History": {"attempts": NONNEG, "successes": NONNEG, "last_step": STEP},
    "Counters": {"proposals": NONNEG, "observations": NONNEG, "rollouts": NONNEG, "groups": NONNEG,
                 "informative": NONNEG, "last_informative": UNIT, "last_proposed": NONNEG},
    "DumpState": {"count": NONNEG},
    "Exp3State": {"prob": PROB, "eps": UNIT, "t": NONNEG},
    "DvcState": {"prob": PROB, "counts": NONNEG, "t": NONNEG},
    "LearnabilityBufferState": {"attempts": NONNEG, "successes": NONNEG, "pending": IDS,
                                "pending_count": NONNEG, "since_refresh": NONNEG},
    "PrioritizedState": {"attempts": NONNEG, "successes": NONNEG},
    "MoppsState": {"alpha": POS, "beta": POS},
    "MoppsPriorState": {"alpha": POS, "beta": POS},
    "PredictorState": {"buf_ids": IDS, "buf_wins": NONNEG, "buf_n": NONNEG, "buf_weight": NONNEG,
                       "buf_len": NONNEG, "steps": NONNEG, "stage": NONNEG},
    "CriticalityState": {"switch_step": STEP, "ess": NONNEG},
    "GresoState": {"easy_streak": NONNEG, "hard_streak": NONNEG, "p_explore": UNIT,
                   "last_ratio": UNIT, "skipped": NONNEG},
    "TsclState": {"step": NONNEG},
    "ClusterEmaState": {"rate": UNIT, "prob": PROB, "steps": NONNEG},
    "BoundaryWindowState": {"width": NONNEG, "steps": NONNEG, "last_moves": NONNEG},
    "TtrlState": {"pseudo_labels": NONNEG, "no_answer": NONNEG},
    "OlrState": {"rate": UNIT, "visits": NONNEG, "label_rate": UNIT, "relabels": NONNEG, "kept": NONNEG,
                 "no_answers": NONNEG},
    "TrapoState": {"rate": UNIT, "visits": NONNEG, "db": UNIT, "db_len": NONNEG, "selected_at": STEP,
                   "steps": NONNEG, "selected": NONNEG, "dropped": NONNEG, "promotions": NONNEG,
                   "scored_at": STEP, "compared": NONNEG},
    "EpiplexityState": {k: NONNEG for k in ("tokens", "losses", "n_points", "first_tokens", "last_tokens",
                                            "last_loss", "loss_area", "E", "A", "alpha", "rmse",
                                            "observations")},
}


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
    if name == "Window" or name == "TsclState":
        _ring(key, node)
    elif name == "DvcState":
        _range(f"{key}cursor", node.cursor, 0, np.asarray(node.sums).shape[0])
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
    elif name == "LearnabilityBufferState":
        buf, length = np.asarray(node.buffer), int(np.asarray(node.buffer_len))
        _range(f"{key}buffer_len", node.buffer_len, 0, buf.shape[0], high_open=False)
        if n is not None:
            _range(f"{key}buffer", buf[:length], 0, n)     # the valid prefix: prompt ids
        if (buf[length:] != -1).any():
            raise bad(f"{key}buffer", "has entries after buffer_len that are not −1 (empty)",
                      buf, np.r_[np.zeros(length, bool), buf[length:] != -1])
    elif name == "BoundaryWindowState" and pool is not None:
        pos, width = np.asarray(node.positions), np.asarray(node.width)
        sizes = np.bincount(pool.clusters, minlength=pool.n_clusters)
        if width.shape != sizes.shape:
            return                                         # caught by the shape check
        _range(f"{key}width", width - sizes, None, 0, high_open=False)   # width ≤ cluster size
        cols = np.arange(pos.shape[1])[None, :]
        inside = cols < width[:, None]
        too_big = inside & ((pos < 0) | (pos >= sizes[:, None]))
        if too_big.any():
            raise bad(f"{key}positions", "has window positions outside their cluster [0, size)",
                      pos, too_big)


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
            for field, rule in _FIELD_RULES.get(tname, {}).items():
                if field in fields:
                    _field_rule(f"{prefix}{field}", getattr(node, field), rule, n)
            _special(tname, prefix, node, pool)
        return
    if node is None:
        return
    key = prefix.rstrip("/")
    check_finite(key, np.asarray(node), key in nan_ok)
