"""Per-arm rolling windows of the last W values, stored as one float64[K, W] ring buffer.

`window_push` appends a batch of (arm, value) pairs in order — the same result as the
per-item loop `for a, v in zip(arms, values): buf[a].append(v); buf[a] = buf[a][-W:]`
(DUMP's `LearnabilityEstimator`, docs/methods/dump.md) — in O(M log M) numpy for M
values, with no per-item Python loop. Unfilled slots hold 0, so the mean over a window is
`sum / filled`.
"""

from __future__ import annotations

from ..errors import InputError
import functools
from typing import NamedTuple

import numpy as np


class Window(NamedTuple):
    values: np.ndarray  # float64[K, W] ring buffer; slot (cursor-1) % W is the newest
    cursor: np.ndarray  # int64[K] next slot to write per arm
    filled: np.ndarray  # int64[K] number of valid slots per arm (≤ W)


def window_init(n_arms: int, width: int) -> Window:
    if width < 1:
        raise InputError(f"window width must be ≥ 1; got {width}.")
    return Window(np.zeros((n_arms, width)), np.zeros(n_arms, dtype=np.int64),
                  np.zeros(n_arms, dtype=np.int64))


def window_push(win: Window, arms: np.ndarray, values: np.ndarray, rows: np.ndarray | None = None) -> Window:
    """Append `values[j]` to the window of `arms[j]`, in order j = 0..M-1 (in place).

    `values` may also be 2-D [B, G] with `arms` [B]: row i's G values go to arm i in
    column order — the same as `window_push(win, np.repeat(arms, G), values.ravel())`,
    but it sorts the B rows instead of the B·G values (a step's rollouts by group).

    A push of at least K·W values (a step's rollouts into a per-domain window) is written
    slot by slot over the whole ring (`_push_slots`, ~10 numpy calls whatever the rows);
    a smaller one row by row, over the rows that can still survive (`_push_rows`). Both
    give the per-item loop's result bit for bit.

    `rows`: `np.bincount(arms, minlength=K)` when the caller counted it already (DUMP counts
    the same rows for its n_d).
    """
    values = np.asarray(values)
    arms = np.asarray(arms, dtype=np.int64).ravel()
    g = values.shape[1] if values.ndim == 2 and values.shape[0] == arms.size else 1
    if g == 1:
        values = values.reshape(-1)
    if arms.size == 0 or values.size == 0:
        return win
    k, w = win.values.shape
    # Group rows by arm, keep arrival order. A narrow key makes numpy's stable sort a
    # radix sort, O(M) instead of O(M log M).
    key = arms.astype(np.uint8) if k <= 1 << 8 else arms.astype(np.uint16) if k <= 1 << 16 else arms
    order = np.argsort(key, kind="stable")
    if k * w <= values.size:
        return _push_slots(win, arms, values, g, order, rows)
    return _push_rows(win, arms, values, g, order, rows)


def _push_slots(win: Window, arms, values, g, order, rows=None) -> Window:
    """`window_push` for a push at least as large as the ring (K·W ≤ M values): one pass
    over the [K, W] slots, whatever M. Only an arm's last L = ceil(W / g) rows can hold a
    survivor; they are gathered into `tail` [K, L·g], the arm's newest value in the last
    column (rows before an arm's first are clipped to some row: their values are never
    read). After the push slot s of arm a holds the value of age j = (c_a − s) mod W (0 =
    newest, c_a the arm's newest slot), which is new when j < count_a, at column
    L·g − 1 − j of the arm's tail, and is left as it was otherwise. One gather and one
    masked copy write every surviving value, with no per-row cases (a row cut by the
    window's edge or wrapping the ring is slots like any other)."""
    k, w = win.values.shape
    if rows is None:
        rows = np.bincount(arms, minlength=k)         # rows (entries, or groups of g) per arm
    counts = rows * g                                 # values per arm
    span = -(-w // g)                                 # L
    newest = np.cumsum(rows) - 1                      # [K] position in `order` of each arm's newest row
    pick = order[np.maximum(newest[:, None] - _descending(span), 0)]     # [K, L] oldest → newest
    # `take` along the rows copies the same values as `values[pick]`, ~2.5× faster at [12, 19] of [512, 16]
    tail = values.take(pick, axis=0).reshape(k, span * g)
    cursor_end = win.cursor + counts                  # [K] cursors after the push, not yet wrapped
    age = _ages(w)[(w - cursor_end) % w]              # [K, W]: row W − 1 − c_a of `_ages`
    src = _row_starts(k, span * g) - age              # flat position in `tail` of each slot's value
    if int(counts.min()) >= w and tail.dtype == win.values.dtype and win.values.flags.c_contiguous:
        # every arm got at least W values (age < W ≤ count_a everywhere): every slot is new,
        # so the gather writes the ring directly, without the mask and its temporary
        # mode="wrap": every index is in range, and a "raise" take buffers its `out` (a copy of
        # the ring) to leave it untouched on an error; the same values, ~30 % less time
        np.take(tail, src, out=win.values, mode="wrap")
    else:
        np.copyto(win.values, tail.take(src), where=age < counts[:, None])
    return _advance(win, cursor_end, counts)


@functools.lru_cache(maxsize=16)
def _descending(n: int) -> np.ndarray:
    """int64[n] read-only n − 1, ..., 1, 0."""
    out = np.arange(n - 1, -1, -1)
    out.setflags(write=False)
    return out


@functools.lru_cache(maxsize=16)
def _row_starts(k: int, width: int) -> np.ndarray:
    """int64[K, 1] read-only a·width + width − 1: the flat position of row a's last column."""
    out = (np.arange(k) * width + width - 1)[:, None]
    out.setflags(write=False)
    return out


def _push_rows(win: Window, arms, values, g, order, rows=None) -> Window:
    """`window_push` for a push smaller than the ring: row by row, only the rows that can
    still hold a survivor."""
    k, w = win.values.shape
    a_sorted = arms[order]
    if rows is None:
        rows = np.bincount(arms, minlength=k)         # rows (entries, or groups of g) per arm
    counts = rows * g                                 # values per arm
    # Rows counted back from the arm's newest: only the last ceil(w / g) of each arm can
    # hold a survivor (the arm's last w values); older rows are skipped before any
    # per-value work, so a long push costs O(K·w) values, not O(M).
    back = np.cumsum(rows)[a_sorted] - np.arange(arms.size)   # 1 = the arm's newest row
    live = back <= -(-w // g)
    idx, a = order[live], a_sorted[live]
    tail = back[live] * g                             # values from the row's first to the arm's end
    cursor_end = win.cursor + counts                  # [K] cursors after the push, not yet wrapped
    start = (cursor_end[a] - tail) % w                # ring slot of each row's first value
    dst = a * w + start                               # ... as a position in the flat [K·W] buffer
    contiguous = win.values.flags.c_contiguous
    # Slot s of arm a is a·W + s of the flat buffer (a view; `.flat` for a buffer that is
    # not C-contiguous, where reshape would copy and the writes would be lost).
    flat = win.values.reshape(-1) if contiguous else win.values.flat
    if g == 1:
        flat[dst] = values[idx]                       # live rows hold exactly one survivor
        return _advance(win, cursor_end, counts)
    rest = None                                       # live rows written value by value
    if contiguous and g <= w:
        # Rows that survive whole (tail ≤ w) and do not wrap around the ring fill g
        # consecutive slots: write each as one block through a view whose row r is
        # flat[r:r + g] (rows overlap in memory; the blocks written never do, the slots
        # being distinct).
        blocks = np.ndarray(shape=(flat.size - g + 1, g), dtype=flat.dtype, buffer=flat,
                            strides=(flat.strides[0],) * 2)
        whole = (tail <= w) & (start + g <= w)
        if whole.all():                               # always when g divides w and all rows had g
            blocks[dst] = values[idx]
        else:
            blocks[dst[whole]] = values[idx[whole]]
            rest = ~whole
    else:
        rest = np.ones(idx.size, dtype=bool)
    if rest is not None:                              # cut rows, rows wrapping the ring
        cols = np.arange(g)
        slot = start[rest, None] + cols               # [L', G]
        slot %= w
        slot += (a[rest] * w)[:, None]
        keep = cols >= (tail[rest] - w)[:, None]      # the oldest live row of an arm may be cut
        flat[slot[keep]] = values[idx[rest]][keep]
    return _advance(win, cursor_end, counts)


@functools.lru_cache(maxsize=16)
def _ages(w: int) -> np.ndarray:
    """int64[W, W] read-only view: row i, slot s holds (W − 1 − i − s) mod W, so row
    W − 1 − c gives each slot's age (c − s) mod W behind a newest slot c."""
    e = (w - 1 - np.arange(2 * w - 1)) % w
    e.setflags(write=False)
    return np.lib.stride_tricks.sliding_window_view(e, w)


def _advance(win: Window, cursor_end: np.ndarray, counts: np.ndarray) -> Window:
    """Set each arm's cursor to `cursor_end` (mod W) and its fill count past `counts` new values."""
    w = win.values.shape[1]
    win.cursor[:] = cursor_end % w
    np.minimum(win.filled + counts, w, out=win.filled)
    return win


def window_mean(win: Window, empty: float = 0.0) -> np.ndarray:
    """float64[K] mean of each arm's window; `empty` where an arm has no values yet."""
    sums = win.values.sum(axis=1)
    return np.where(win.filled > 0, sums / np.maximum(win.filled, 1), empty)
