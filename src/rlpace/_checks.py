"""Hyperparameter checks shared by every policy factory (and by `predict`, which policies
build on: so they live below both), the one bound on signal size, and `bad`, the message of
a restored state that breaks a rule.

A factory validates each hyperparameter when it is called, so a bad value fails where the
user typed it, with a ValueError that names the policy, the parameter, the valid range
and the value given — never later, inside a step, as a NaN:

>>> check_real("dump", "temperature", float("nan"), low=0, low_open=True)
Traceback (most recent call last):
...
ValueError: dump temperature must be a finite number in (0, inf); got nan.

Signals. Rewards and advantages reach the policies finite (`Feedback` checks that), but
finite is not small: a window of 300 advantages of 1e308 sums to inf, and a softmax of
1e308 / 0.1 is NaN. Policies that add, average or divide these signals pass them through
`clip_signal` first, which bounds them to ±SIGNAL_MAX = 1e100. No reward or advantage of
a real trainer comes near that bound, so nothing changes for real input, while sums of
up to 10²⁰⁰ clipped values stay finite. Softmaxes over such scores subtract the maximum
before dividing by the temperature (`shifted`), so any temperature > 0 is safe.
"""

from __future__ import annotations

from .errors import InputError
import math
from numbers import Integral, Real

import numpy as np

__all__ = ["check_real", "check_int", "check_choice", "clip_signal", "abs_signal", "shifted", "SIGNAL_MAX",
           "bad"]

SIGNAL_MAX = 1e100


def _interval(low, high, low_open, high_open) -> str:
    lo = "-inf" if low is None else f"{low:g}"
    hi = "inf" if high is None else f"{high:g}"
    return f"{'(' if low_open or low is None else '['}{lo}, {hi}{')' if high_open or high is None else ']'}"


def check_real(owner: str, name: str, value, *, low: float | None = None, high: float | None = None,
               low_open: bool = False, high_open: bool = False, hint: str = "") -> float:
    """`value` as a float, or ValueError unless it is a finite real number in the interval
    (closed ends by default; `low_open` / `high_open` exclude an end; None = unbounded).
    Booleans are refused: `True` is not a temperature."""
    ok = isinstance(value, Real) and not isinstance(value, (bool, np.bool_))
    x = float(value) if ok else math.nan
    ok = ok and math.isfinite(x)
    if ok and low is not None:
        ok = x > low if low_open else x >= low
    if ok and high is not None:
        ok = x < high if high_open else x <= high
    if not ok:
        raise InputError(f"{owner} {name} must be a finite number in "
                         f"{_interval(low, high, low_open, high_open)}{hint}; got {value!r}.")
    return x


def check_int(owner: str, name: str, value, *, low: int = 1, high: int | None = None,
              hint: str = "") -> int:
    """`value` as an int, or ValueError unless it is an integer (not a bool, not a float)
    in [low, high]."""
    ok = isinstance(value, Integral) and not isinstance(value, (bool, np.bool_))
    ok = ok and int(value) >= low and (high is None or int(value) <= high)
    if not ok:
        rng = f"[{low}, {'inf)' if high is None else f'{high}]'}"
        raise InputError(f"{owner} {name} must be an int in {rng}{hint}; got {value!r}.")
    return int(value)


def check_choice(owner: str, name: str, value, choices: tuple) -> None:
    """ValueError unless `value` is one of `choices`."""
    if not isinstance(value, str) or value not in choices:
        raise InputError(f"{owner} {name} must be one of {', '.join(repr(c) for c in choices)}; "
                         f"got {value!r}.")


def shifted(scores: np.ndarray) -> np.ndarray:
    """scores − max(scores): a softmax of these divides values ≤ 0 by the temperature, which
    can underflow to exp(−inf) = 0 but never overflow (softmax is shift-invariant)."""
    s = np.asarray(scores, dtype=np.float64)
    return s - s.max() if s.size else s


def clip_signal(x: np.ndarray) -> np.ndarray:
    """float64 copy of `x` clipped to [−SIGNAL_MAX, SIGNAL_MAX] (see the module docstring)."""
    return np.clip(np.asarray(x, dtype=np.float64), -SIGNAL_MAX, SIGNAL_MAX)


def abs_signal(x: np.ndarray) -> np.ndarray:
    """float64 |x| capped at SIGNAL_MAX: `np.abs(clip_signal(x))` bit for bit (the cap of |x|
    is the clip's bound either side), without np.clip's per-call overhead."""
    return np.minimum(np.abs(np.asarray(x, dtype=np.float64)), SIGNAL_MAX)


def bad(key: str, what: str, arr: np.ndarray, mask: np.ndarray) -> InputError:
    """The InputError for state[key] whose entries under `mask` break a rule."""
    where = np.argwhere(np.atleast_1d(mask))[0]
    val = np.atleast_1d(arr)[tuple(where)]
    val = val.item() if hasattr(val, "item") else val
    index = tuple(int(i) for i in where) if np.ndim(arr) else ()
    return InputError(f"state[{key!r}] {what} (first: {val!r} at index {index}); the state is corrupt "
                      f"or was edited: restore one written by Scheduler.state_dict().")
