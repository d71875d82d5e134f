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
from collections import Counter
from typing import Sequence

import numpy as np

from ..stats._votes import (NO_MAJORITY, AnswerVotes, answer_codes, answer_hash, answer_hashes, clean_answer,
                            group_majorities, row_modes)

__all__ = ["clean_answer", "unique_majority", "answer_hash", "agreement_rewards", "ols_slope",
           "require_answers", "NO_MAJORITY", "answer_codes", "group_majorities", "row_modes",
           "ols_slopes", "answer_hashes", "AnswerVotes", "votes_of"]


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


def votes_of(batch, owner: str) -> AnswerVotes:
    """The votes over `batch.answers` (a ValueError naming Feedback.answers when there are
    none, `require_answers`): the ones its Feedback holds (`Batch.answer_votes`), or, for a
    Batch built without them, a fresh `AnswerVotes` of its answers."""
    answers = require_answers(batch, owner)
    votes = getattr(batch, "answer_votes", None)
    if votes is None or votes.answers is not answers:
        votes = AnswerVotes(answers)
    return votes


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
