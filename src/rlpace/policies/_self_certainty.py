"""Self-certainty reward (Intuitor / RLIF): the model's confidence replaces the verifier.

Zhao, Kang, Feng, Levine, Song, "Learning to Reason without External Rewards", arXiv
2505.19590, following `sunblaze-ucb/Intuitor` `verl-intuitor/verl/utils/torch_functional.py`
(`self_certainty_from_logits`) and `verl-intuitor/verl/trainer/ppo/ray_trainer.py`
(`AdvantageEstimator.INTUITOR`); docs/methods/self_certainty.md.

For rollout y with T valid response tokens and logits z_t over a vocabulary of V (the
pre-update policy, temperature-scaled, at the positions that predict each response token):

    SC(y) = (1/T) Σ_t KL(U ‖ p_t) = (1/T) Σ_t [logsumexp_j z_tj − mean_j z_tj − log V]

The trainer passes SC as `Feedback.self_certainty`; this reward place returns it as the
reward of every rollout of an unlabelled prompt (`Pool.labeled` False; every prompt with
`all_prompts=True`), and the verified reward elsewhere. Group normalisation (GRPO) then gives
Intuitor's advantage (SC − mean_g SC) / std_g SC; the −log V constant cancels.

>>> import numpy as np
>>> from rlpace import Pool, Feedback, Scheduler
>>> s = Scheduler(Pool(["x"] * 2, labeled=[True, False]), "self_certainty")
>>> s.rewards(Feedback([0, 1], [[1, 0], [0, 0]], self_certainty=[[.1, .2], [.3, .4]], step=0)).tolist()
[[1.0, 0.0], [0.3, 0.4]]
"""

from __future__ import annotations

from ..errors import InputError
import numpy as np

from ._base import REWARD, DataPolicy, EmptyState


def _empty(pool):
    return EmptyState()


def _same(state, pool, batch):
    return state


def token_stat_reward(owner: str, field: str, sign: float, all_prompts: bool, how: str) -> DataPolicy:
    """A reward place that puts sign·batch.<field> in the rows of unlabelled prompts (all rows
    with `all_prompts`); shared by `self_certainty` and `entropy_min`."""
    if not isinstance(all_prompts, (bool, np.bool_)):
        raise InputError(f"{owner} all_prompts must be True or False; got {all_prompts!r}.")

    def apply(state, pool, batch):
        r = np.array(batch.rewards, dtype=np.float64)
        rows = np.ones(r.shape[0], bool) if all_prompts else ~pool.labeled[batch.prompt_ids]
        if not rows.any():
            return r
        stat = getattr(batch, field)
        if stat is None:
            raise InputError(f"{owner} needs Feedback.{field} for its {int(rows.sum())} unlabelled "
                             f"prompt(s): the trainer must pass {field}=float64[B, G], {how}.")
        r[rows] = sign * stat[rows]
        return r

    return DataPolicy(REWARD, _empty, _same, apply, name=owner, reads=frozenset({field}))


def self_certainty(all_prompts: bool = False) -> DataPolicy:
    """Intuitor (arXiv 2505.19590): the reward of an unlabelled prompt's rollout is its self-certainty, mean KL(U ‖ p_t).

    Args:
        all_prompts: True replaces the reward of every prompt (Intuitor's setting: no
            verifier); False (default) only of unlabelled prompts (`Pool.labeled`).
    """
    return token_stat_reward("self_certainty", "self_certainty", 1.0, all_prompts,
                             "the mean over valid response tokens of logsumexp(z_t) − mean_j z_t,j − log V")
