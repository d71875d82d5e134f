"""Per-prompt evidence from a group of G rollouts: pass rate, answer consistency, token statistics.

DE-Venus's scoring adapters (arXiv 2609.03324, §"Active Data Selection"): question-level
empirical accuracy, consistency, entropy and self-certainty. All of it is plain numpy over
the rollouts' texts and (optionally) per-rollout token statistics; the token statistics
themselves come from the generator (`_generate.py`) or from the user's own engine.
"""

from __future__ import annotations

from ..errors import InputError
import math
from collections import Counter
from typing import NamedTuple, Sequence

import numpy as np

from rlpace.tasks._verify import extract_tagged, last_boxed

#: uncertainty signals `select` can rank by (higher = more uncertain).
UNCERTAINTY = ("answer_entropy", "disagreement", "token_entropy", "self_certainty")
VERIFIERS = ("auto", "exact", "math")


def extract_answer(completion: str) -> str:
    """The answer a completion gives, for consistency and majority votes.

    Rule: the stripped text inside the last `<answer>...</answer>` pair; else the content of
    the last `\\boxed{...}` (braces balanced); else the whole completion, stripped. "" means
    no answer.

    >>> extract_answer("so <answer> 42 </answer>"), extract_answer("thus $\\\\boxed{\\\\frac{1}{2}}$")
    ('42', '\\\\frac{1}{2}')
    >>> extract_answer("  7\\n"), extract_answer("")
    ('7', '')
    """
    if not isinstance(completion, str):
        return ""
    tagged = extract_tagged(completion)
    if tagged is not None:
        return tagged.strip()
    boxed = last_boxed(completion, ("boxed",))
    return (completion if boxed is None else boxed).strip()


def answer_consistency(answers: Sequence[str]) -> tuple[float, float, str | None]:
    """(majority share, answer entropy in nats, majority answer) of one group.

    Every empty answer ("" = the completion gave none) is its own singleton class, so that
    a group that never answers reads as maximally inconsistent, not as confident:
        majority share = max_a n_a / G over non-empty answers a (0 when none);
        answer entropy = −Σ_c (n_c / G) ln(n_c / G) over the classes c;
        majority answer = the most frequent non-empty answer, a tie going to the one that
        appears first in the group (None when every answer is empty).

    >>> answer_consistency(["4", "4", "5", "4"])[0], round(answer_consistency(["4", "4", "5", "4"])[1], 4)
    (0.75, 0.5623)
    >>> share, h, _ = answer_consistency(["", "", "3"])   # 3 singleton classes: ln 3
    >>> round(share, 4), round(h, 4)
    (0.3333, 1.0986)
    """
    g = len(answers)
    if g == 0:
        raise InputError("a group needs at least one rollout; got an empty completions list.")
    counts = Counter(a for a in answers if a)
    empties = sum(1 for a in answers if not a)
    sizes = list(counts.values()) + [1] * empties
    entropy = -sum((c / g) * math.log(c / g) for c in sizes)
    if not counts:
        return 0.0, float(entropy), None
    top = max(counts.values())
    majority = next(a for a in answers if a and counts[a] == top)
    return top / g, float(entropy) + 0.0, majority   # + 0.0: one class gives -0.0


def verifier_for(ability: str | None, verifier: str):
    """The scorer `score(completion, item) -> float` for a row: `verifier` unless "auto";
    "auto" → math-verify when the row's `ability` contains "math", else exact match
    (`rlpace.tasks.read_taskset`'s rule)."""
    from rlpace.tasks._verify import exact_score, math_score
    if verifier == "exact":
        return exact_score
    if verifier == "math":
        return math_score
    return math_score if "math" in str(ability or "").lower() else exact_score


class Evidence(NamedTuple):
    """What `score_groups` measured, one entry per prompt (row order of the input).

    Attributes:
        n_samples: int64[N] rollouts in the group (G).
        pass_rate: float64[N] mean verifier score against the label; NaN when unlabelled.
        majority_share: float64[N] share of the majority answer (see `answer_consistency`).
        answer_entropy: float64[N] entropy of the answers over the group, nats.
        token_entropy: float64[N] mean over rollouts of the masked mean token entropy, nats;
            NaN when the rollouts carry no token statistics.
        self_certainty: float64[N] mean over rollouts of Intuitor's self-certainty
            (masked mean of logsumexp(z) − mean(z) − log V); NaN when not supplied.
        majority_answer: object[N] majority answer (str) or None.
    """

    n_samples: np.ndarray
    pass_rate: np.ndarray
    majority_share: np.ndarray
    answer_entropy: np.ndarray
    token_entropy: np.ndarray
    self_certainty: np.ndarray
    majority_answer: np.ndarray


def score_groups(groups: Sequence[dict], ground_truths: Sequence[str | None],
                 abilities: Sequence[str | None], *, verifier: str = "auto") -> Evidence:
    """Evidence of each prompt from its rollouts.

    Args:
        groups: one dict per prompt: "completions" (list of G strings), optional "answers"
            (G extracted answers; default `extract_answer` of each completion), optional
            "token_entropy" and "self_certainty" (G floats each).
        ground_truths: the label of each prompt, None when unlabelled (pass rate NaN).
        abilities: verl `ability` of each row (picks the verifier under "auto").
        verifier: "auto" | "exact" | "math".

    Example:
        >>> ev = score_groups([{"completions": ["4", "4", "5", ""]}], ["4"], ["exact"])
        >>> ev.pass_rate.tolist(), ev.majority_share.tolist(), ev.majority_answer.tolist()
        ([0.5], [0.5], ['4'])
    """
    from rlpace.tasks import Item
    if verifier not in VERIFIERS:
        raise InputError(f"verifier must be one of {VERIFIERS}; got {verifier!r}.")
    n = len(groups)
    ev = Evidence(np.zeros(n, np.int64), np.full(n, np.nan), np.zeros(n), np.zeros(n),
                  np.full(n, np.nan), np.full(n, np.nan), np.empty(n, object))
    for i, (grp, gt, ab) in enumerate(zip(groups, ground_truths, abilities)):
        comps = grp["completions"]
        answers = grp.get("answers") or [extract_answer(c) for c in comps]
        ev.n_samples[i] = len(comps)
        ev.majority_share[i], ev.answer_entropy[i], ev.majority_answer[i] = answer_consistency(answers)
        if gt is not None:
            item = Item(prompt="", answer=str(gt), domain="", difficulty=math.nan, index=0,
                        ability=str(ab or "exact"))
            score = verifier_for(ab, verifier)
            ev.pass_rate[i] = float(np.mean([score(c, item) for c in comps]))
        for key, arr in (("token_entropy", ev.token_entropy), ("self_certainty", ev.self_certainty)):
            if grp.get(key) is not None:
                arr[i] = float(np.mean(np.asarray(grp[key], dtype=np.float64)))
    return ev


def uncertainty_of(ev: Evidence, signal: str) -> np.ndarray:
    """float64[N] uncertainty (higher = less sure) from one signal:

    answer_entropy → the answer entropy; disagreement → 1 − majority share;
    token_entropy → mean token entropy; self_certainty → −self-certainty (Intuitor: a
    confident model has high self-certainty)."""
    if signal == "answer_entropy":
        return ev.answer_entropy.astype(np.float64)
    if signal == "disagreement":
        return 1.0 - ev.majority_share
    if signal == "token_entropy":
        return ev.token_entropy.astype(np.float64)
    if signal == "self_certainty":
        return -ev.self_certainty
    raise InputError(f"uncertainty must be one of {UNCERTAINTY}; got {signal!r}.")
