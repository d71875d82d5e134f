"""Answers factorised for voting: each group's majority answer, computed over a whole batch.

The primitives under the target places of `rlpace.policies` (`ttrl`, `olr`, `trapo`; the
rules, their sources and the tie rules are documented in `rlpace.policies._vote`), kept at the
records' level so that a `Feedback` can hold the votes over its own answers
(`Feedback.answer_votes`) without the records importing the policies.

Answers are compared by exact string equality after `.strip()`; None and empty strings are
"no answer extracted" (`clean_answer`). A batch's B·G answers are factorised once
(`answer_codes`) and each row's mode is found from one bincount or one row sort (`row_modes`),
with either tie rule (`group_majorities`): `"first"` (the answer seen first wins) or
`"abstain"` (no majority unless the largest count is unique). Persistent state keeps answers
as stable 64-bit hashes (`answer_hash`); `NO_MAJORITY` (0) is reserved for "no majority".
"""

from __future__ import annotations

import hashlib
import itertools
from typing import Sequence

import numpy as np

__all__ = ["NO_MAJORITY", "clean_answer", "answer_hash", "answer_codes", "row_modes", "group_majorities",
           "AnswerVotes", "answer_hashes"]

NO_MAJORITY = 0     # hash of "no unique majority" ('__NoMajorityAnswer__' in OLR / TraPO)


def clean_answer(a) -> str | None:
    """The answer as rlpace compares it: stripped; None for None or an empty string."""
    if a is None:
        return None
    a = a.strip()
    return a or None


def answer_hash(a: str | None) -> int:
    """Stable int64 hash of a cleaned answer (blake2b, 8 bytes); `NO_MAJORITY` (0) for None."""
    if a is None:
        return NO_MAJORITY
    h = int.from_bytes(hashlib.blake2b(a.encode("utf-8"), digest_size=8).digest(), "little", signed=True)
    return h if h != NO_MAJORITY else 1


def answer_codes(answers) -> tuple[np.ndarray, list[str]]:
    """(codes int64[B, G], values list[str]): each answer as an index into `values`, the distinct
    cleaned answers (`clean_answer`) in first-seen order; −1 where no answer was extracted.

    One pass over the B·G answers in C (`dict.setdefault` through `map`), then `clean_answer`
    once per distinct raw answer, not once per rollout. The positions the pass hands out are
    4-byte strings (`_position_bytes`), joined into one buffer that numpy reads as uint32: the
    same positions as counting with Python ints, without converting 8,192 of them one by one
    (the call paired on the overhead benchmark's answers: 0.90× on fresh strings, as a trainer
    passes them; 0.80× when their hashes are already cached).

    >>> codes, values = answer_codes([["b", " a", None], ["a", "", "b"]])
    >>> codes.tolist(), values
    ([[0, 1, -1], [1, -1, 0]], ['b', 'a'])
    """
    a = np.asarray(answers, dtype=object)
    flat = a.ravel().tolist()
    n = len(flat)
    first: dict = {}
    # the flat position of each raw answer's first occurrence: equal answers, equal positions
    if n <= _MAX_POSITION_BYTES:
        raw = np.frombuffer(b"".join(map(first.setdefault, flat, _position_bytes(n))), "<u4")
        positions = ((answer, int.from_bytes(pos, "little")) for answer, pos in first.items())
    else:
        raw = np.fromiter(map(first.setdefault, flat, itertools.count()), np.int64, n)
        positions = iter(first.items())
    lut = np.full(n, -1, np.int64)
    index: dict[str, int] = {}
    for answer, pos in positions:
        c = clean_answer(answer)
        if c is not None:
            lut[pos] = index.setdefault(c, len(index))
    return lut[raw].reshape(a.shape), list(index)


#: Beyond this many answers in one call the positions are counted with Python ints instead
#: (the table of 4-byte positions would hold ~37 bytes per entry).
_MAX_POSITION_BYTES = 1 << 20
_POSITIONS: tuple[bytes, ...] = ()


def _position_bytes(n: int) -> tuple[bytes, ...]:
    """A tuple whose entry i is i as 4 little-endian bytes, for i < n at least (longer is fine:
    `map` stops at the shortest input). Immutable and grown by rebinding the name to a longer
    one, so a caller never sees a table another thread is extending. Positions only: nothing
    about any answers is kept here."""
    global _POSITIONS
    table = _POSITIONS
    if len(table) < n:
        table = table + tuple(i.to_bytes(4, "little") for i in range(len(table), n))
        _POSITIONS = table
    return table


def row_modes(codes: np.ndarray, valid: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row of int64[B, L] `codes`, over the entries where bool[B, L] `valid`:
    (first int64[B] position of the first occurrence of the earliest-seen most frequent value,
    L when the row has no valid entry; count int64[B] that value's count, 0 without valid
    entries; n_top int64[B] how many distinct values share that count).

    `unique_majority` of every row at once: `ties="first"` is the value at `first`, and
    `ties="abstain"` the same value when n_top == 1. O(B·L log L), no loop over rows.

    >>> row_modes(np.array([[5, 3, 3, 5, 7], [1, 2, 2, 2, 1]]), np.ones((2, 5), bool))
    (array([0, 1]), array([2, 3]), array([2, 1]))
    """
    codes = np.asarray(codes, dtype=np.int64)
    valid = np.asarray(valid, dtype=bool)
    b, n = codes.shape
    if b == 0 or n == 0 or not valid.any():
        return np.full(b, n, np.int64), np.zeros(b, np.int64), np.zeros(b, np.int64)
    lo, hi = int(codes[valid].min()), int(codes[valid].max())
    if hi - lo < 4 * n:
        # few distinct values (answer codes): count each row's values with one bincount
        span = hi - lo + 1
        rel = np.where(valid, codes - lo, span)                         # span: "not valid"
        flat = rel + (np.arange(b) * (span + 1))[:, None]
        counts = np.bincount(flat.ravel(), minlength=b * (span + 1)).reshape(b, span + 1)[:, :span]
        top = counts.max(axis=1)
        is_top = (counts == top[:, None]) & (counts > 0)                # [B, span]
        n_top = np.count_nonzero(is_top, axis=1)
        # the first position holding a most frequent value: that value was seen first
        at_top = np.append(is_top, np.zeros((b, 1), bool), axis=1).ravel()[flat]
        first = np.where(top > 0, at_top.argmax(axis=1), n)
        return first, top, n_top
    # many distinct values (hashes): sort each row; equal values are runs, in position order
    if lo > np.iinfo(np.int64).min:     # entries not valid sort first, below every valid value
        order = np.argsort(np.where(valid, codes, lo - 1), axis=1, kind="stable")
    else:
        order = np.lexsort((codes, ~valid), axis=-1)                    # [B, L], stable
    base = (np.arange(b) * n)[:, None]
    s = codes.ravel()[order + base]
    v = valid.ravel()[order + base]
    start = np.ones((b, n), bool)
    start[:, 1:] = (s[:, 1:] != s[:, :-1]) | (v[:, 1:] != v[:, :-1])
    starts = np.flatnonzero(start)                                      # run heads, row-major
    counts = np.diff(np.append(starts, b * n))
    counts[~v.ravel()[starts]] = 0                                      # runs of invalid entries
    heads = np.flatnonzero(starts % n == 0)                             # each row's first run
    top = np.maximum.reduceat(counts, heads)                            # [B]
    per_row = np.diff(np.append(heads, starts.size))
    is_top = (counts == np.repeat(top, per_row)) & (counts > 0)
    n_top = np.add.reduceat(is_top.astype(np.int64), heads)
    first = np.minimum.reduceat(np.where(is_top, order.ravel()[starts], n), heads)
    return first, top, n_top


def group_majorities(codes: np.ndarray, ties: str = "abstain",
                     n_values: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(winner int64[B] code or −1, count int64[B]) of each row of `answer_codes`' codes:
    `unique_majority` of every group at once (same tie rules, same counts).

    `n_values`: the codes are known to lie in [−1, n_values) (`len(values)` of `answer_codes`);
    with few values (n_values < 4·G) each row's counts then come from one bincount without
    first scanning the codes for their range (`_small_code_modes`).

    >>> group_majorities(np.array([[0, 1, 1, 0, -1], [2, -1, -1, -1, -1]]), ties="first")
    (array([0, 2]), array([2, 1]))
    """
    b, n = codes.shape
    if n_values is not None and b and n and n_values < 4 * n:
        first, count, n_top = _small_code_modes(codes, n_values)
    else:
        first, count, n_top = row_modes(codes, codes >= 0)
    win = np.full(b, -1, np.int64)
    has = first < n
    if ties == "abstain":
        has &= n_top == 1
    win[has] = codes[np.flatnonzero(has), first[has]]
    return win, count


def _small_code_modes(codes: np.ndarray, n_values: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`row_modes(codes, codes >= 0)` of int64[B, L] codes in [−1, n_values): each row's counts
    from one bincount over (row, code + 1), column 0 the entries without an answer."""
    b, n = codes.shape
    span = n_values + 1
    flat = codes + (np.arange(1, b * span + 1, span))[:, None]           # [B, L] row·span + code + 1
    counts = np.bincount(flat.ravel(), minlength=b * span).reshape(b, span)
    counts[:, 0] = 0                                                    # no answer: never a mode
    top = counts.max(axis=1)                                            # [B]
    is_top = counts == top[:, None]                                     # [B, span]
    n_top = np.count_nonzero(is_top, axis=1)
    # the first position holding a most frequent value: that value was seen first
    first = np.where(top > 0, is_top.ravel()[flat].argmax(axis=1), n)
    return first, top, np.where(top > 0, n_top, 0)


class AnswerVotes:
    """The votes over one answers array object[B, G], each computed on first use and kept:
    the factorisation (`codes`, `values`: `answer_codes`) and, per tie rule, every group's
    majority with its hash (`majorities`).

    A `Feedback` holds the one over its own answers (`Feedback.answer_votes`) and every `Batch`
    built from it carries that same object, so the target place (`Scheduler.targets`) and the
    history update (`Scheduler.observe`) factorise the B·G answer strings — the costliest part
    of a vote — once per Feedback, and two Feedbacks never share votes. The answers are
    read-only there; nothing here writes into them.

    >>> v = AnswerVotes(np.array([["4", " 5", "5"], [None, "1", "2"]], dtype=object))
    >>> v.codes.tolist(), v.values
    ([[0, 1, 1], [-1, 2, 3]], ['4', '5', '1', '2'])
    >>> win, count, hashes = v.majorities("abstain")
    >>> win.tolist(), count.tolist(), v.majorities("abstain")[0] is win
    ([1, -1], [2, 1], True)
    """

    __slots__ = ("answers", "_codes", "_values", "_by_ties")

    def __init__(self, answers: np.ndarray):
        self.answers = answers
        self._codes: np.ndarray | None = None
        self._values: list[str] = []
        self._by_ties: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    @property
    def codes(self) -> np.ndarray:
        """int64[B, G] each answer's index into `values`; −1 where none was extracted."""
        if self._codes is None:
            codes, self._values = answer_codes(self.answers)
            codes.setflags(write=False)         # shared by every reader of this Feedback
            self._codes = codes
        return self._codes

    @property
    def values(self) -> list[str]:
        """The distinct cleaned answers, in first-seen order (`answer_codes`)."""
        self.codes
        return self._values

    def majorities(self, ties: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(winner int64[B] code into `values` or −1, count int64[B], hash int64[B]
        `answer_hash` of the winner): `group_majorities` of every row, then the hashes."""
        if ties not in self._by_ties:
            win, count = group_majorities(self.codes, ties, n_values=len(self.values))
            out = (win, count, answer_hashes(self.values, win))
            for a in out:
                a.setflags(write=False)
            self._by_ties[ties] = out
        return self._by_ties[ties]


def answer_hashes(values: Sequence[str], winners: np.ndarray) -> np.ndarray:
    """int64[B] `answer_hash(values[w])` of each winner code w, `NO_MAJORITY` for −1; one
    blake2b per distinct winner."""
    won = winners >= 0
    if not won.any():
        return np.full(winners.shape, NO_MAJORITY, np.int64)
    lut = np.zeros(len(values) + 1, np.int64)          # [code + 1]: NO_MAJORITY (0) at −1
    uniq = np.unique(winners[won])
    lut[uniq + 1] = [answer_hash(values[w]) for w in uniq.tolist()]
    return lut[winners + 1]
