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
    """Append `values[j]` to the window of `arms[j]`, in order j = 0..M-1 (in place).

    `values` may also be 2-D [B, G] with `arms` [B]: row i's G values go to arm i in
    column order — the same as `window_push(win, np.repeat(arms, G), values.ravel())`,
    but it sorts the B rows instead of the B·G values (a step's rollouts by group).
    """
    values = np.asarray(values, dtype=np.float64)
    arms = np.asarray(arms, dtype=np.int64).ravel()
    g = values.shape[1] if values.ndim == 2 and values.shape[0] == arms.size else 1
    if g == 1:
        values = values.ravel()
    if arms.size == 0 or values.size == 0:
        return win
    k, w = win.values.shape
    # Group by arm, keep arrival order. A narrow key makes numpy's stable sort a radix
    # sort, O(M) instead of O(M log M).
    key = arms.astype(np.uint8) if k <= 1 << 8 else arms.astype(np.uint16) if k <= 1 << 16 else arms
    order = np.argsort(key, kind="stable")
    a_sorted = arms[order]
    rows = np.bincount(a_sorted, minlength=k)         # rows (entries, or groups of g) per arm
    counts = rows * g                                 # values per arm
    starts = np.zeros(k, dtype=np.int64)
    np.cumsum(rows[:-1], out=starts[1:])
    j = (np.arange(arms.size) - starts[a_sorted]) * g  # index of each row's first value in its arm
    first = counts[a_sorted] - w                      # only values j ≥ first survive (last W)
    live = j + g > first                              # rows with at least one survivor
    order, a_sorted, j, first = order[live], a_sorted[live], j[live], first[live]
    cur = win.cursor[a_sorted]
    if g > 1:
        j = j[:, None] + np.arange(g)                 # [B', G]
        a_sorted = np.broadcast_to(a_sorted[:, None], j.shape)
        first, cur = first[:, None], cur[:, None]
    keep = j >= first
    slot = (cur + j) % w
    win.values[a_sorted[keep], slot[keep]] = values[order][keep]
    win.cursor[:] = (win.cursor + counts) % w
    np.minimum(win.filled + counts, w, out=win.filled)
    return win


def window_mean(win: Window, empty: float = 0.0) -> np.ndarray:
    """float64[K] mean of each arm's window; `empty` where an arm has no values yet."""
    sums = win.values.sum(axis=1)
    return np.where(win.filled > 0, sums / np.maximum(win.filled, 1), empty)
