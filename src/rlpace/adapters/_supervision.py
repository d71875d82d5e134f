"""Supervision transforms inside an engine: what verl's and TRL's adapters share.

DE-Venus (arXiv 2609.03324) runs the group-level supervision transforms where whole groups
exist: after the rollouts of a step are complete and before the group advantages. The
adapters do, for each step's Feedback [B, G]:

    answers  = extract(decode(response))           # [B][G] str | None
    targets  = sched.targets(fb(answers))          # [B]: str (re-verify) | None (dataset label)
    rewards  = verifier(response, target)          # the engine's own reward function
    rewards  = sched.rewards(fb(rewards, answers, token stats))
    A        = engine advantages(rewards) · sched.advantage_weights(fb)

This module holds the engine-free pieces: which signals a Scheduler's method needs
(`needs`, `needs_supervision_pass`), the default answer extractor (`extract_answer`), the token
statistics (`token_stats`) and the per-row verification plan (`row_targets`). Pure numpy
except `token_stats` (torch, imported when called). Engine code: `_verl_supervision`
(legacy trainer), `_verl_v1` (V1 replay buffer), `_trl_supervision` (TRL).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["SIGNALS", "TOKEN_SIGNALS", "needs", "needs_supervision_pass", "has_supervision_places", "step_targets", "retargeted", "extract_answer", "token_stats",
           "row_targets", "pool_labeled"]

SIGNALS = ("answers", "token_entropy", "self_certainty", "mean_logprob")
TOKEN_SIGNALS = frozenset(SIGNALS[1:])


def has_supervision_places(sched) -> bool:
    """True when the Scheduler's method has a non-neutral target, reward or advantage place
    (`rlpace.policies.active_supervision_places` is not empty)."""
    from ..policies import active_supervision_places
    return bool(active_supervision_places(sched.method))


def needs(sched) -> frozenset:
    """The signals (`DataPolicy.reads`) the Scheduler's method asks a trainer to produce.
    Trainers decide what to compute from this set, never from policy names."""
    return frozenset().union(*(p.reads for p in sched.method.policies().values()))


def needs_supervision_pass(sched) -> bool:
    """True when the trainer must run the supervision transforms: the method has a
    non-neutral target, reward or advantage place, or reads one of `SIGNALS`. Answers
    are then always extracted (decoding is cheap next to a forward)."""
    return has_supervision_places(sched) or bool(needs(sched) & set(SIGNALS))


def extract_answer(completion) -> str | None:
    """The final answer of a completion as rlpace's math verifiers read it; None when it
    states none. The built-in trainer's extractor for math items
    (`rlpace.train.supervision.extract_answer(text, "math")`): the text of the last
    `<answer>...</answer>` (the tag the `rlpace.tasks` verifiers read), else of the last
    brace-matched `\\boxed{...}` / `\\fbox{...}` (math-verify's first choice; TTRL-v2's
    extractor), stripped; an empty answer is None (TTRL-v2 leaves it out of the vote). A
    chat completion (list of messages) is read from its last message's content.

    >>> extract_answer("so <answer> 42 </answer>"), extract_answer("is $\\\\boxed{\\\\frac{1}{2}}$.")
    ('42', '\\\\frac{1}{2}')
    >>> extract_answer("no answer"), extract_answer("<answer>  </answer>")
    (None, None)
    """
    from ..train.supervision import extract_answer as _extract
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        completion = completion[-1].get("content", "")
    return _extract(completion, "math") if isinstance(completion, str) else None


def token_stats(logits, mask, temperature: float = 1.0, tokens=None) -> dict:
    """Per-sequence means over the valid response tokens of the token statistics.

    With z_t the logits at temperature T (z/T), p_t = softmax(z_t) and V the vocabulary size:
        H_t  = logsumexp(z_t) − Σ_j p_t,j z_t,j                          (nats)
        SC_t = logsumexp(z_t) − mean_j z_t,j − log V  = KL(U ‖ p_t)     (Intuitor's code)
        LP_t = log p_t[y_t]                                            (sampled token y_t)
    each averaged over the tokens where `mask` is 1 (a row with none gives 0).

    Args: logits float[R, T, V] (position t predicts response token t); mask {0,1}[R, T];
    tokens int[R, T] the sampled tokens (for `mean_logprob`; omitted: not computed).
    Returns {"token_entropy", "self_certainty"[, "mean_logprob"]: float64 numpy [R]}.

    >>> import torch
    >>> out = token_stats(torch.zeros(1, 2, 4), torch.tensor([[1, 0]]), tokens=torch.tensor([[3, 0]]))
    >>> [round(float(out[k][0]), 6) for k in ("token_entropy", "self_certainty", "mean_logprob")]
    [1.386294, 0.0, -1.386294]
    """
    import torch

    from ..train.rollout import token_statistics      # the one per-token definition (trainer, engines, select)
    z = logits.detach().double()
    entropy, certainty = token_statistics(z, float(temperature))
    per_token = {"token_entropy": entropy, "self_certainty": certainty}
    if tokens is not None:
        zt = z / float(temperature)
        per_token["mean_logprob"] = (zt.gather(-1, tokens.long()[..., None]).squeeze(-1)
                                     - torch.logsumexp(zt, dim=-1))
    m = mask.to(z.dtype)
    n = m.sum(-1).clamp(min=1.0)
    out = {k: ((v * m).sum(-1) / n).cpu().numpy() for k, v in per_token.items()}
    out["token_entropy"] = np.maximum(out["token_entropy"], 0.0)      # rounding below 0
    out["self_certainty"] = np.maximum(out["self_certainty"], 0.0)    # KL ≥ 0
    if "mean_logprob" in out:
        out["mean_logprob"] = np.minimum(out["mean_logprob"], 0.0)
    return out


def row_targets(targets: Sequence, labeled: np.ndarray, row_index: np.ndarray, n_rows: int):
    """Spread per-prompt targets onto engine rows.

    Args: targets [B] from `Scheduler.targets`; labeled bool[B] (`pool.labeled` of the
    prompts); row_index int64[B, G] (engine row of each rollout).
    Returns (target object[n_rows]: the string to verify against, or None; zero bool[n_rows]:
    rows whose verified reward is 0 without calling the verifier — an unlabelled prompt with
    no target). Rows not in `row_index` get (None, False).

    >>> t, z = row_targets(["7", None, None], np.array([False, True, False]), np.array([[0, 3], [1, 4], [2, 5]]), 6)
    >>> t.tolist(), z.tolist()
    (['7', None, None, '7', None, None], [False, False, True, False, False, True])
    """
    target = np.full(n_rows, None, dtype=object)
    zero = np.zeros(n_rows, dtype=bool)
    for b, t in enumerate(targets):
        rows = np.asarray(row_index[b])
        if t is not None:
            target[rows] = str(t)
        elif not bool(labeled[b]):
            zero[rows] = True
    return target, zero


def step_targets(sched, feedbacks, n_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """`Scheduler.targets` of each (Feedback, row_index int64[B, G]) spread onto the engine's
    `n_rows` rows (`row_targets`): (target object[n_rows], zero bool[n_rows]) — what every
    engine's re-verification reads, whatever the engine.

    >>> from rlpace import Feedback, Pool, Scheduler
    >>> s = Scheduler(Pool(["a", "a"], labeled=[True, False]), "ttrl")
    >>> fb = Feedback([0, 1], np.zeros((2, 2)), step=0, answers=[["3", "3"], ["5", "5"]])
    >>> t, z = step_targets(s, [(fb, np.array([[0, 1], [2, 3]]))], 4)
    >>> t.tolist(), z.tolist()
    ([None, None, '5', '5'], [False, False, False, False])
    """
    target, zero = np.full(n_rows, None, dtype=object), np.zeros(n_rows, dtype=bool)
    for fb, idx in feedbacks:
        t, z = row_targets(sched.targets(fb), pool_labeled(sched.pool, fb.prompt_ids), idx, n_rows)
        hit = np.flatnonzero(t != None)  # noqa: E711 (object array)
        target[hit] = t[hit]
        zero |= z
    return target, zero


def retargeted(reward_model: dict, target: str) -> dict:
    """A fresh copy of a row's verl `reward_model` whose `ground_truth` is `target`; the
    dataset's label stays beside it as `dataset_ground_truth` (the original dict is shared by
    the group's rows and is not touched).

    >>> retargeted({"ground_truth": "4", "style": "rule"}, "5")
    {'ground_truth': '5', 'style': 'rule', 'dataset_ground_truth': '4'}
    """
    return {**reward_model, "dataset_ground_truth": reward_model.get("ground_truth"), "ground_truth": target}


def pool_labeled(pool, positions: np.ndarray) -> np.ndarray:
    """bool[B]: `pool.labeled` at the positions (all True for a Pool without the field)."""
    lab = getattr(pool, "labeled", None)
    if lab is None:
        return np.ones(len(positions), dtype=bool)
    return np.asarray(lab, dtype=bool)[np.asarray(positions)]
