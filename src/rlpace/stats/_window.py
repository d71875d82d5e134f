"""Per-arm rolling windows of the last W values, stored as one float64[K, W] ring buffer.

`window_push` appends a batch of (arm, value) pairs in order — the same result as the
per-item loop `for a, v in zip(arms, values): buf[a].append(v); buf[a] = buf[a][-W:]`
(DUMP's `LearnabilityEstimator`, methods-core.md card 10) — in O(M log M) numpy for M
values, with no per-item Python loop. Unfilled slots hold 0, so the mean over a window is
`sum / filled`.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Window(NamedTuple):
    values: np.ndarray  # float64[K, W] ring buffer; slot (cursor-1) % W is the newest
    cursor: np.ndarray  # int64[K] next slot to write per arm
    filled: np.ndarray  # int64[K] number of valid slots per arm (≤ W)


def window_init(n_arms: int, width: int) -> Window:
    if width < 1:
        raise ValueError(f"window width must be ≥ 1; got {width}.")
    return Window(np.zeros((n_arms, width)), np.zeros(n_arms, dtype=np.int64),
                  np.zeros(n_arms, dtype=np.int64))


def window_push(win: Window, arms: np.ndarray, values: np.ndarray) -> Window:
    """Append `values[j]` to the window of `arms[j]`, in order j = 0..M-1 (in place)."""
    arms = np.asarray(arms, dtype=np.int64).ravel()
    values = np.asarray(values, dtype=np.float64).ravel()
    if arms.size == 0:
        return win
    k, w = win.values.shape
    order = np.argsort(arms, kind="stable")          # group by arm, keep arrival order
    a_sorted = arms[order]
    counts = np.bincount(a_sorted, minlength=k)
    starts = np.zeros(k, dtype=np.int64)
    np.cumsum(counts[:-1], out=starts[1:])
    j = np.arange(arms.size) - starts[a_sorted]      # index of each value within its arm
    keep = j >= counts[a_sorted] - w                 # only the last W of each arm survive
    slot = (win.cursor[a_sorted] + j) % w
    win.values[a_sorted[keep], slot[keep]] = values[order][keep]
    win.cursor[:] = (win.cursor + counts) % w
    np.minimum(win.filled + counts, w, out=win.filled)
    return win


def window_mean(win: Window, empty: float = 0.0) -> np.ndarray:
    """float64[K] mean of each arm's window; `empty` where an arm has no values yet."""
    sums = win.values.sum(axis=1)
    return np.where(win.filled > 0, sums / np.maximum(win.filled, 1), empty)
