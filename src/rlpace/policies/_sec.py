"""SEC: a non-stationary bandit over problem categories, TD(0) values of the absolute
advantage, Boltzmann sampling.

Chen, Lu, Kim, Zhang, Tang, Piché, Gontier, Bengio, Kamalloo, "Self-Evolving Curriculum
for LLM Reasoning", arXiv 2505.14970; docs/methods/sec.md. No official code was found;
we implement the standard TD(0) / Boltzmann form the paper describes:

    r_t(c)     = mean over the batch's groups of category c of (1/G)·Σ_j |Â_j|
    Q_{t+1}(c) = α·r_t(c) + (1 − α)·Q_t(c)       for categories present in the batch
    π_t(c)     = softmax(Q_t / τ)(c)

Prompts are then drawn uniformly inside each category drawn from π (the composed
`uniform_within_arm` selection). A category whose groups are all-0 or all-1 earns 0 and
fades — the learnability signal DUMP uses with UCB (arXiv 2504.09710).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..types import group_mean_abs_advantage
from ._base import MIXTURE, DataPolicy, softmax_of_floats
from ._checks import check_choice, check_real

__all__ = ["sec", "arm_mean_abs_advantage", "arm_sums"]


def arm_mean_abs_advantage(pool, batch, arms: str, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(mean float64[K], present bool[K]): per arm, the mean over the batch's groups of the
    group's mean |A|; `present` marks arms with at least one group. |A| is clipped to
    1e100 first (`abs_signal`), so the sums stay finite for any finite advantages. The
    group means are the batch's derived `mean_abs_advantage` (`group_mean_abs_advantage`):
    a policy calling this declares `batch_reads` = `arm_batch_reads(arms)`."""
    arm = batch.domains if arms == "domain" else batch.clusters     # = pool.arm_codes(arms)[ids]
    count = np.bincount(arm, minlength=k)
    # the row sum / G is .mean(axis=1)'s own arithmetic (numpy divides the sum by the count)
    total = np.bincount(arm, weights=group_mean_abs_advantage(batch), minlength=k)
    # an arm without groups has total 0.0 (bincount's start), and 0.0 / 1 is the 0 it gets
    return total / np.maximum(count, 1), count > 0


def arm_sums(batch, arms: str, k: int) -> tuple[list, list]:
    """([int] groups, [float] sum of the groups' mean |A|) per arm, as Python numbers: the two
    bincounts of `arm_mean_abs_advantage`, for mixtures that do their K-sized arithmetic in
    floats (its mean is total / count where count > 0)."""
    arm = batch.domains if arms == "domain" else batch.clusters
    return (np.bincount(arm, minlength=k).tolist(),
            np.bincount(arm, weights=group_mean_abs_advantage(batch), minlength=k).tolist())


def arm_batch_reads(arms: str, signal: str = "mean_abs_advantage") -> frozenset:
    """`DataPolicy.batch_reads` of a mixture whose update reads `signal` per arm (the group
    means of `arm_mean_abs_advantage` by default; DUMP: "abs_advantages"), and the clusters
    when its arms are clusters."""
    return frozenset({signal} | ({"clusters"} if arms == "cluster" else set()))


class SecState(NamedTuple):
    q: np.ndarray  # float64[K] TD(0) value of each category, 0 before its first update


def sec(alpha: float = 0.5, temperature: float = 0.2, arms: str = "domain") -> DataPolicy:
    """SEC (arXiv 2505.14970): Boltzmann mixture over arms of TD(0) values of their mean |A|.

    See the module docstring for the rule and docs/methods/sec.md.

    Args:
        alpha: TD(0) step α. [unverified] We could not read the paper's value;
            0.5 is our choice (one update halves the weight of the past).
        temperature: Boltzmann τ. [unverified] Our choice: 0.2. With |A|-rewards in
            [0, 1] (GRPO: mean |A| = 2·sqrt(p(1 − p)) ≤ 1), τ = 1 would bound the
            probability ratio of two categories by e ≈ 2.7 — close to uniform — while
            DUMP uses τ = 0.1 on the same signal; 0.2 sits between.
        arms: "domain" (categories = the Pool's domains, e.g. difficulty levels) or
            "cluster".

    Q starts at 0 for every category, so π starts uniform. Cost O(K + B) per step.

    Example (hand-computed): 2 categories, α = 0.5, τ = 1; a batch where category 0's
    groups have mean |A| 1.0 and 0.6 and category 1 is absent: r_0 = 0.8, Q = [0.4, 0],
    π = softmax([0.4, 0]) = [0.5987, 0.4013].
    """
    check_real("sec", "alpha", alpha, low=0, high=1, low_open=True, hint=" (TD step)")
    check_real("sec", "temperature", temperature, low=0, low_open=True)
    check_choice("sec", "arms", arms, ("domain", "cluster"))

    def init(pool):
        return SecState(np.zeros(pool.n_arms(arms)))

    def update(state, pool, batch):
        if batch.prompt_ids.size == 0:
            return state
        count, total = arm_sums(batch, arms, state.q.shape[0])
        # Q ← α·r + (1 − α)·Q where the arm is present, r = total / count: the array rule
        # (`arm_mean_abs_advantage`) in floats for K arms, bit for bit
        state.q[:] = [alpha * (t / c) + (1.0 - alpha) * q if c else q
                      for c, t, q in zip(count, total, state.q.tolist())]
        return state

    def apply(state, pool, *_):
        return softmax_of_floats(state.q.tolist(), temperature)

    def metrics(state, pool):
        return {"sec/q_max": float(state.q.max()), "sec/q_min": float(state.q.min())}

    return DataPolicy(MIXTURE, init, update, apply, arms=arms, name="sec", metrics=metrics,
                      batch_reads=arm_batch_reads(arms))
