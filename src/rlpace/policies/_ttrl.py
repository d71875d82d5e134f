"""TTRL: the majority answer of the group becomes the target (test-time RL without labels).

Zuo et al., "TTRL: Test-Time Reinforcement Learning", arXiv 2504.16084, following the
current public code `PRIME-RL/TTRL` (v2, verl 0.4.1 refactor) `verl/trainer/ppo/ttrl_utils.py`
(`_majority_vote`, `apply_ttrl_gt`); docs/methods/ttrl.md.

For each prompt whose target TTRL sets (unlabelled prompts, or every prompt with
`all_prompts=True`), over the first N = `vote_rollouts` answers of its group (all G by default):

    valid  = [a.strip() for a in answers[:N] if a is not None and a.strip() != ""]
    ŷ      = Counter(valid).most_common(1)          # ties: the answer seen first
    target = ŷ, or None ("no target": every rollout gets reward 0) when `valid` is empty
    ratio  = count(ŷ) / N                           # over all N votes, unparseable ones included

The trainer then verifies every rollout against ŷ (TTRL's reward: 1 if the answer matches
the pseudo-label, else 0; `rlpace.policies.agreement_rewards` for exact-match verifiers).
Labelled prompts keep their dataset label.

>>> import numpy as np
>>> from rlpace import Pool, Feedback, Scheduler
>>> s = Scheduler(Pool(["x"] * 2, labeled=[False, False]), "ttrl", vote_rollouts=2)
>>> s.targets(Feedback([0, 1], np.zeros((2, 3)), answers=[["5", "6", "6"], [None, " ", "1"]], step=0))
['5', None]
"""

from __future__ import annotations

from ..errors import InputError
from typing import NamedTuple

import numpy as np

from ._base import TARGET, DataPolicy, Targets
from ._checks import check_int
from ._vote import group_majorities, votes_of


class TtrlState(NamedTuple):
    pseudo_labels: np.ndarray   # int64[] visits whose target was a majority answer
    no_answer: np.ndarray       # int64[] visits of target-less prompts with no valid vote (no target)
    #: value rules `Scheduler.load_state_dict` checks for each field (policies/_state_checks.py)
    STATE_RULES = {"pseudo_labels": "nonneg", "no_answer": "nonneg"}


def ttrl(vote_rollouts: int | None = None, all_prompts: bool = False) -> DataPolicy:
    """TTRL (arXiv 2504.16084): the target of an unlabelled prompt is the majority of its first `vote_rollouts` answers.

    Args:
        vote_rollouts: N, the answers that vote (the first N of the G in `Feedback.answers`;
            TTRL's N/G split, its scripts vote 64 and train 32). None: all G. N > G is a
            ValueError naming vote_rollouts, raised by `targets` and `observe` before
            anything changes.
        all_prompts: True sets the target of every prompt (pure test-time RL, labels unused);
            False (default) keeps the dataset label of labelled prompts (`Pool.labeled`).
    """
    if vote_rollouts is not None:
        vote_rollouts = check_int("ttrl", "vote_rollouts", vote_rollouts, low=1)
    if not isinstance(all_prompts, (bool, np.bool_)):
        raise InputError(f"ttrl all_prompts must be True or False; got {all_prompts!r}.")

    def init(pool):
        return TtrlState(np.array(0, np.int64), np.array(0, np.int64))

    def vote(pool, batch):
        """(rows int64[R] whose target TTRL sets, winner int64[R] code or −1, count int64[R],
        values, voters): the majority of each of those rows, all at once, from the answers'
        factorisation the Feedback holds (`votes_of`: once for targets and observe)."""
        votes = votes_of(batch, "ttrl")
        answers = votes.answers
        if vote_rollouts is not None and vote_rollouts > answers.shape[1]:
            # silently voting with fewer answers than asked would misreport TTRL's N
            raise InputError(f"ttrl vote_rollouts={vote_rollouts} but Feedback.answers holds "
                             f"{answers.shape[1]} answers per prompt: pass all N answers (and "
                             f"admit the G that train), or set vote_rollouts ≤ {answers.shape[1]}.")
        voters = answers.shape[1] if vote_rollouts is None else vote_rollouts
        b = batch.prompt_ids.shape[0]
        if all_prompts:
            rows = np.arange(b, dtype=np.int64)
        else:
            rows = np.flatnonzero(~pool.labeled[batch.prompt_ids])
        if rows.size == 0:
            return rows, rows, rows, [], voters
        if rows.size == b and voters == answers.shape[1]:
            win, count, _ = votes.majorities("first")
        else:   # a sub-array of the codes: the same winners (first-seen ties read positions, not codes)
            win, count = group_majorities(votes.codes[rows, :voters], ties="first", n_values=len(votes.values))
        return rows, win, count, votes.values, voters

    def apply(state, pool, batch):
        rows, win, count, values, voters = vote(pool, batch)
        labels: list = [None] * batch.prompt_ids.shape[0]
        decisions = []
        for i, w, c in zip(rows.tolist(), win.tolist(), count.tolist()):
            if w >= 0:
                labels[i] = values[w]
                decisions.append({"row": i, "rule": "ttrl_majority", "decision": "pseudo_label",
                                  "target": values[w], "evidence": {"votes": c, "voters": voters,
                                                                    "majority_ratio": c / voters}})
        return Targets(labels, decisions)

    def update(state, pool, batch):
        if batch.answers is None:       # nothing to count; `targets` is where answers are required
            return state
        rows, win, _, _, _ = vote(pool, batch)
        got = int(np.count_nonzero(win >= 0))
        return TtrlState(state.pseudo_labels + got, state.no_answer + (rows.size - got))

    def metrics(state, pool):
        return {"supervision/pseudo_labels": float(state.pseudo_labels),
                "supervision/no_target": float(state.no_answer)}

    return DataPolicy(TARGET, init, update, apply, name="ttrl", metrics=metrics,
                      reads=frozenset({"answers"}))
