"""Voting over a group's extracted answers, shared by the target places (`ttrl`, `olr`, `trapo`).

Answers are compared by exact string equality after `.strip()`; an empty string counts as
"no answer extracted", like None (TTRL-v2 drops answers without a boxed expression before
its vote; dropping empty strings too means an empty answer can never win the vote and reward
the rollouts that failed to answer — the edge case of TTRL-v1, arXiv 2504.16084). The vote is `collections.Counter(valid).most_common` with one
of two tie rules, as the public codes have them:

* `ties="first"` (TTRL's `_majority_vote`): the answer seen first, in rollout order, wins;
* `ties="abstain"` (OLR's and TraPO's `_get_freq_list_count_freq`): no majority unless the
  largest count is unique.

`unique_majority` votes one group; the policies vote every group of a batch at once
(`AnswerVotes`: the answers factorised once, `answer_codes`, and each row's mode from one
bincount or one row sort, `row_modes`): the same winners and counts, no loop over groups. The
votes over a Feedback's answers are derived once and kept with that Feedback
(`Feedback.answer_votes`, carried by every Batch built from it: `votes_of`).

Persistent per-prompt state stores answers as stable 64-bit hashes (`answer_hash`, blake2b of
the stripped UTF-8 string): numeric, so state stays plain npz; 0 is reserved for "no unique
majority".

>>> unique_majority(["b", "a", " a", "b", None], ties="first")
('b', 2)
>>> unique_majority(["b", "a", " a", "b", None], ties="abstain")
(None, 2)
>>> unique_majority([None, "", "  "], ties="first")
(None, 0)
>>> agreement_rewards([["7", "8", None]], ["7"]).tolist()
[[1.0, 0.0, 0.0]]
"""

from __future__ import annotations

from ..errors import InputError
import hashlib
import itertools
from collections import Counter
from typing import Sequence

import numpy as np

__all__ = ["clean_answer", "unique_majority", "answer_hash", "agreement_rewards", "ols_slope",
           "require_answers", "NO_MAJORITY", "answer_codes", "group_majorities", "row_modes",
           "ols_slopes", "answer_hashes", "batch_votes", "AnswerVotes", "votes_of"]

NO_MAJORITY = 0     # hash of "no unique majority" ('__NoMajorityAnswer__' in OLR / TraPO)


def clean_answer(a) -> str | None:
    """The answer as rlpace compares it: stripped; None for None or an empty string."""
    if a is None:
        return None
    a = a.strip()
    return a or None


def unique_majority(answers: Sequence, ties: str = "abstain") -> tuple[str | None, int]:
    """(majority answer or None, its count) over the valid answers of one group.

    None when no answer is valid, or (with `ties="abstain"`) when the top count is shared;
    the count is the top count either way (0 without valid answers)."""
    valid = [c for c in (clean_answer(a) for a in answers) if c is not None]
    if not valid:
        return None, 0
    top = Counter(valid).most_common(2)       # Counter keeps first-seen order among equal counts
    if ties == "abstain" and len(top) == 2 and top[1][1] == top[0][1]:
        return None, top[0][1]
    return top[0]


def answer_hash(a: str | None) -> int:
    """Stable int64 hash of a cleaned answer (blake2b, 8 bytes); `NO_MAJORITY` (0) for None."""
    if a is None:
        return NO_MAJORITY
    h = int.from_bytes(hashlib.blake2b(a.encode("utf-8"), digest_size=8).digest(), "little", signed=True)
    return h if h != NO_MAJORITY else 1


def agreement_rewards(answers, targets: Sequence) -> np.ndarray:
    """float64[B, G]: 1 where rollout j of prompt i answered `targets[i]` (after `.strip()`),
    else 0 (also for a None target: no target, no reward). TTRL's binary reward against the
    majority, for trainers whose verifier is exact string match.

    >>> agreement_rewards([["4", " 4", "5"], ["1", "1", "1"]], ["4", None]).tolist()
    [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]
    """
    rows = [list(r) for r in answers]
    if len(rows) != len(targets):
        raise InputError(f"agreement_rewards: {len(rows)} rows of answers but {len(targets)} targets; "
                         f"give one target per prompt.")
    g = len(rows[0]) if rows else 0
    out = np.zeros((len(rows), g), dtype=np.float64)
    for i, (row, t) in enumerate(zip(rows, targets)):
        t = clean_answer(t)
        if t is not None:
            out[i] = [clean_answer(a) == t for a in row]
    return out


def ols_slope(y: Sequence[float]) -> float:
    """Ordinary-least-squares slope of y against x = 0..n−1 (`scipy.stats.linregress`, as
    OLR's `_get_slope`); 0.0 with fewer than 2 points.

    >>> ols_slope([0.0, 0.25, 0.5]), ols_slope([1.0])
    (0.25, 0.0)
    """
    y = np.asarray(y, dtype=np.float64)
    n = y.shape[0]
    if n < 2:
        return 0.0
    x = np.arange(n, dtype=np.float64) - (n - 1) / 2.0
    return float((x * (y - y.mean())).sum() / (x * x).sum())


def answer_codes(answers) -> tuple[np.ndarray, list[str]]:
    """(codes int64[B, G], values list[str]): each answer as an index into `values`, the distinct
    cleaned answers (`clean_answer`) in first-seen order; −1 where no answer was extracted.

    One pass over the B·G answers in C (`dict.setdefault` through `map`), then `clean_answer`
    once per distinct raw answer, not once per rollout.

    >>> codes, values = answer_codes([["b", " a", None], ["a", "", "b"]])
    >>> codes.tolist(), values
    ([[0, 1, -1], [1, -1, 0]], ['b', 'a'])
    """
    a = np.asarray(answers, dtype=object)
    flat = a.ravel().tolist()
    first: dict = {}
    # the flat position of each raw answer's first occurrence: equal answers, equal positions
    raw = np.fromiter(map(first.setdefault, flat, itertools.count()), np.int64, len(flat))
    lut = np.full(len(flat), -1, np.int64)
    index: dict[str, int] = {}
    for answer, pos in first.items():
        c = clean_answer(answer)
        if c is not None:
            lut[pos] = index.setdefault(c, len(index))
    return lut[raw].reshape(a.shape), list(index)


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


def group_majorities(codes: np.ndarray, ties: str = "abstain") -> tuple[np.ndarray, np.ndarray]:
    """(winner int64[B] code or −1, count int64[B]) of each row of `answer_codes`' codes:
    `unique_majority` of every group at once (same tie rules, same counts).

    >>> group_majorities(np.array([[0, 1, 1, 0, -1], [2, -1, -1, -1, -1]]), ties="first")
    (array([0, 2]), array([2, 1]))
    """
    first, count, n_top = row_modes(codes, codes >= 0)
    b, n = codes.shape
    win = np.full(b, -1, np.int64)
    has = first < n
    if ties == "abstain":
        has &= n_top == 1
    win[has] = codes[np.flatnonzero(has), first[has]]
    return win, count


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
            win, count = group_majorities(self.codes, ties)
            out = (win, count, answer_hashes(self.values, win))
            for a in out:
                a.setflags(write=False)
            self._by_ties[ties] = out
        return self._by_ties[ties]


def batch_votes(answers, ties: str = "abstain") -> tuple[np.ndarray, np.ndarray, list[str], np.ndarray]:
    """(winner int64[B], count int64[B], values list[str], hash int64[B]) over the groups of
    `answers` object[B, G]: row i's `unique_majority(answers[i], ties)` is
    (values[winner[i]] if winner[i] ≥ 0 else None, count[i]), and hash[i] its `answer_hash`.
    Policies read the votes their Batch carries instead (`votes_of`): computed once per Feedback.

    >>> win, count, values, _ = batch_votes([["4", "5", "5"], [None, "1", "2"]], ties="abstain")
    >>> [values[w] if w >= 0 else None for w in win], count.tolist()
    (['5', None], [2, 1])
    """
    votes = AnswerVotes(answers)
    win, count, hashes = votes.majorities(ties)
    return win, count, votes.values, hashes


def votes_of(batch, owner: str) -> AnswerVotes:
    """The votes over `batch.answers` (a ValueError naming Feedback.answers when there are
    none, `require_answers`): the ones its Feedback holds (`Batch.answer_votes`), or, for a
    Batch built without them, a fresh `AnswerVotes` of its answers."""
    answers = require_answers(batch, owner)
    votes = getattr(batch, "answer_votes", None)
    if votes is None or votes.answers is not answers:
        votes = AnswerVotes(answers)
    return votes


def answer_hashes(values: Sequence[str], winners: np.ndarray) -> np.ndarray:
    """int64[B] `answer_hash(values[w])` of each winner code w, `NO_MAJORITY` for −1; one
    blake2b per distinct winner."""
    out = np.full(winners.shape, NO_MAJORITY, np.int64)
    won = winners >= 0
    if won.any():
        uniq, inv = np.unique(winners[won], return_inverse=True)
        out[won] = np.array([answer_hash(values[w]) for w in uniq.tolist()], np.int64)[inv]
    return out


def ols_slopes(y: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """float64[B] `ols_slope(y[i, :lengths[i]])` of each row, bit for bit: rows are grouped by
    length and each group computes the scalar formula with numpy reductions along its rows
    (the same per-row summation order as the 1-D sums of `ols_slope`).

    >>> ols_slopes(np.array([[0.0, 0.25, 0.5], [1.0, 9.0, 9.0]]), np.array([3, 1])).tolist()
    [0.25, 0.0]
    """
    y = np.asarray(y, dtype=np.float64)
    lengths = np.asarray(lengths, dtype=np.int64)
    out = np.zeros(y.shape[0])
    for n in np.unique(lengths[lengths >= 2]).tolist():
        rows = np.flatnonzero(lengths == n)
        part = y[rows, :n]                                              # contiguous [r, n]
        x = np.arange(n, dtype=np.float64) - (n - 1) / 2.0
        mean = part.mean(axis=1, keepdims=True)
        out[rows] = (x * (part - mean)).sum(axis=1) / (x * x).sum()
    return out


def require_answers(batch, owner: str):
    """`batch.answers`, or a ValueError naming Feedback.answers and what the trainer passes."""
    if batch.answers is None:
        raise InputError(f"{owner} needs Feedback.answers: pass answers=[B][G] extracted final answers "
                         f"(str, or None where none was extracted) with the feedback given to "
                         f"Scheduler.targets and Scheduler.observe.")
    return batch.answers
