"""Entropy minimisation as the reward (EM-RL): low entropy is rewarded, no verifier needed.

Agarwal, Zhang, Yuan, Han, Peng, "The Unreasonable Effectiveness of Entropy Minimization in
LLM Reasoning", arXiv 2505.15134, following the authors' EM-RL training code (fork
`chotkrin/EM_PT`, `EM-RL/verl/verl/workers/reward_manager/emrl_token_manager.py` and
`emrl_sequence_manager.py`); docs/methods/entropy_min.md.

For rollout y with T valid response tokens, from the pre-update policy's log-prob pass:

    level="token"    : r(y) = −(1/T) Σ_t H(p_t)            (Feedback.token_entropy, negated)
    level="sequence" : r(y) =  (1/T) Σ_t log π(y_t | x, y_<t)   (Feedback.mean_logprob)

Both replace the reward of unlabelled prompts' rollouts (`Pool.labeled` False; every prompt
with `all_prompts=True`); labelled prompts keep the verified reward.

>>> import numpy as np
>>> from rlpace import Pool, Feedback, Scheduler
>>> s = Scheduler(Pool(["x"]), "entropy_min", all_prompts=True)
>>> s.rewards(Feedback([0], [[1, 0]], token_entropy=[[0.5, 2.0]], step=0)).tolist()
[[-0.5, -2.0]]
"""

from __future__ import annotations

from ._base import DataPolicy
from ._checks import check_choice
from ._self_certainty import token_stat_reward


def entropy_min(level: str = "token", all_prompts: bool = False) -> DataPolicy:
    """EM-RL (arXiv 2505.15134): the reward of an unlabelled prompt's rollout is minus its mean token entropy.

    Args:
        level: "token" (−mean_t H(p_t), `Feedback.token_entropy`) or "sequence" (mean_t log π(y_t),
            `Feedback.mean_logprob`, a one-sample estimate of the negative per-token entropy).
        all_prompts: True replaces the reward of every prompt (EM-RL's setting); False (default)
            only of unlabelled prompts (`Pool.labeled`).
    """
    check_choice("entropy_min", "level", level, ("token", "sequence"))
    if level == "token":
        return token_stat_reward("entropy_min", "token_entropy", -1.0, all_prompts,
                                 "the mean over valid response tokens of the entropy H(p_t) in nats")
    return token_stat_reward("entropy_min", "mean_logprob", 1.0, all_prompts,
                             "the mean over valid response tokens of the sampled token's log-probability")
