"""Learnability p̂(1 − p̂) as a prompt-selection score: SFL's top-k buffer mixed with
uniform draws, and a PER-style sum-tree sampler.

Foster, Sims, Forkel, Fellows, Foerster, "Learning to Reason at the Frontier of
Learnability" (LILO), arXiv 2502.12272, and its parent SFL (Rutherford et al., "No
Regrets", NeurIPS 2024; `amacrutherford/sampling-for-learnability`) — methods-core.md
card 9. For binary rewards, a prompt with success rate p contributes policy-gradient
signal only when 0 < p < 1, and the expected improvement is bounded by the variance
p(1 − p) (card 9, "Idea"; = (mean |A| / 2)² under GRPO, "one identity").

Both policies score a prompt from its own history, p̂ = successes / attempts over every
rollout observed so far (success = reward ≥ the Scheduler's threshold); they spend no
extra rollouts. The probe variant of LILO (4·|B| candidates, 8 fresh rollouts each) needs
the trainer's help and belongs to the trainer issue.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..stats._sumtree import SumTree, _unique, sumtree_build, sumtree_sample, sumtree_set
from ..types import _success_counts
from ._base import SELECTION, DataPolicy

__all__ = ["learnability_buffer", "prioritized_learnability"]


def _learnability(successes: np.ndarray, attempts: np.ndarray) -> np.ndarray:
    p = successes / np.maximum(attempts, 1)
    return p * (1.0 - p)


def _positive_int(owner: str, name: str, val) -> None:
    if isinstance(val, bool) or not isinstance(val, (int, np.integer)) or val < 1:
        raise ValueError(f"{owner} {name} must be a positive int; got {val!r}.")


# ---- SFL: top-k buffer + uniform ---------------------------------------------------------
class LearnabilityBufferState(NamedTuple):
    attempts: np.ndarray       # int64[N] rollouts observed per prompt
    successes: np.ndarray      # int64[N] successful rollouts per prompt
    buffer: np.ndarray         # int64[k] prompt ids, best first; −1 after buffer_len
    buffer_len: np.ndarray     # int64[] valid entries in buffer
    pending: np.ndarray        # int64[P] ring of prompt ids observed since the last refresh
    pending_count: np.ndarray  # int64[] pushes into the ring since the last refresh
    since_refresh: np.ndarray  # int64[] updates since the last refresh


def learnability_buffer(buffer_size: int = 1000, refresh_every: int = 100, mix: float = 0.5,
                        max_candidates: int = 25_000) -> DataPolicy:
    """SFL selection: a `mix` share of each batch uniform over the pool, the rest uniform
    from a buffer of the top-`buffer_size` prompts by learnability p̂(1 − p̂).

    Card 9 ("Algorithm, original SFL"), defaults from SFL's `minigrid-sfl.yaml` /
    `ippo-minigrid.yaml`: buffer 1000 (`NUM_TO_SAVE`), half the batch from the buffer
    and half fresh (`NUM_ENVS_FROM_SAMPLED` = `NUM_ENVS_TO_GENERATE` = 128, both drawn
    with replacement), a refresh every 100 updates (`EVAL_FREQ`), and at most 25,000
    candidates per refresh (`NUM_BATCHES × BATCH_SIZE` = 5 × 5000).

    Refresh: buffer ← the top-k by current p̂(1 − p̂) of (buffer ∪ prompts observed since
    the last refresh), ties to the smaller id, keeping only prompts with p̂(1 − p̂) > 0.
    Cost O(k + candidates); per update O(B). Until the buffer first holds `buffer_size`
    prompts it is refreshed after every update, and while it is empty every slot is
    uniform.

    Deviations from SFL, because we reuse training rollouts instead of probing: scores
    are cumulative over the prompt's history (SFL scores fresh probes); candidates are
    the prompts the trainer observed (the ring keeps the latest `max_candidates`
    observations when more arrive between refreshes); the old buffer competes with them
    (SFL replaces it); prompts with zero learnability never enter the buffer (SFL's
    top-1000 of 25,000 probes can include them).

    Args:
        buffer_size: k, prompts kept in the buffer.
        refresh_every: updates between refreshes once the buffer is full.
        mix: share of each batch drawn uniformly from the pool, round(mix · n).
        max_candidates: capacity of the ring of observed prompt ids.

    Example: pool of 4, after observing prompt 0 with p̂ = 1/2 and prompt 1 with p̂ = 1,
    the buffer is [0] (score 0.25; prompt 1 scores 0) and propose(4) returns 2 uniform
    ids and 2 copies of prompt 0.
    """
    for name, val in (("buffer_size", buffer_size), ("refresh_every", refresh_every),
                      ("max_candidates", max_candidates)):
        _positive_int("learnability_buffer", name, val)
    if not 0.0 <= mix <= 1.0:
        raise ValueError(f"learnability_buffer mix (uniform share) must be in [0, 1]; got {mix}.")

    def init(pool):
        n = len(pool)
        return LearnabilityBufferState(np.zeros(n, np.int64), np.zeros(n, np.int64),
                                       np.full(buffer_size, -1, np.int64), np.array(0, np.int64),
                                       np.full(max_candidates, -1, np.int64), np.array(0, np.int64),
                                       np.array(0, np.int64))

    def refresh(state):
        filled = min(int(state.pending_count), max_candidates)
        cand = np.unique(np.concatenate([state.buffer[:int(state.buffer_len)], state.pending[:filled]]))
        score = _learnability(state.successes[cand], state.attempts[cand])
        cand, score = cand[score > 0], score[score > 0]
        top = cand[np.lexsort((cand, -score))[:buffer_size]]
        state.buffer[:] = -1
        state.buffer[:top.size] = top
        state.buffer_len[...] = top.size
        state.pending_count[...] = 0
        state.since_refresh[...] = 0

    def update(state, pool, batch):
        ids = batch.prompt_ids
        b = ids.size
        if b == 0:
            return state
        np.add.at(state.attempts, ids, batch.rewards.shape[1])
        np.add.at(state.successes, ids, _success_counts(batch.success))
        tail = ids[-max_candidates:]                       # a batch larger than the ring
        start = int(state.pending_count) + b - tail.size
        state.pending[(start + np.arange(tail.size)) % max_candidates] = tail
        state.pending_count[...] += b
        state.since_refresh[...] += 1
        if state.since_refresh >= refresh_every or state.buffer_len < buffer_size:
            refresh(state)
        return state

    def apply(state, pool, n, probs, arms, rng):
        size = int(state.buffer_len)
        n_buf = 0 if size == 0 else n - int(round(mix * n))
        uniform = rng.integers(0, len(pool), size=n - n_buf, dtype=np.int64)
        from_buf = state.buffer[rng.integers(0, max(size, 1), size=n_buf)]
        return np.concatenate([uniform, from_buf])

    def metrics(state, pool):
        size = int(state.buffer_len)
        buf = state.buffer[:size]
        mean = float(_learnability(state.successes[buf], state.attempts[buf]).mean()) if size else 0.0
        return {"learnability/buffer_size": float(size), "learnability/buffer_mean_score": mean}

    return DataPolicy(SELECTION, init, update, apply, name="learnability_buffer", metrics=metrics)


# ---- PER over learnability ----------------------------------------------------------------
class PrioritizedState(NamedTuple):
    attempts: np.ndarray   # int64[N] rollouts observed per prompt
    successes: np.ndarray  # int64[N] successful rollouts per prompt
    tree: SumTree          # leaves: priority (p̂(1 − p̂) + eps)^alpha, unseen at the maximum


def prioritized_learnability(alpha: float = 0.6, eps: float = 1e-6) -> DataPolicy:
    """Draw prompts with probability ∝ (p̂(1 − p̂) + eps)^α from a sum tree.

    Prioritized Experience Replay (Schaul et al., arXiv 1511.05952; methods-peers-and-
    engines.md card A15; `openai/baselines` defaults α = 0.6, eps = 1e-6) with LILO's
    learnability as the priority (methods-core.md card 9, "Library notes"). Each draw
    is independent (with replacement, as baselines' `_sample_proportional`), O(log N);
    an update re-prices only the batch's prompts, O(B log N). Building the tree at
    init is the one O(N) step.

    Unseen prompts get the maximum attainable priority (1/4 + eps)^α: PER gives new
    items the largest priority seen so far, and p̂(1 − p̂) ≤ 1/4, so that maximum is
    known in advance (baselines' initial max of 1.0 is a TD-error scale and would make
    unseen prompts 2.3× likelier than the most learnable seen ones). No importance
    weights: this selects data for the next batch, it does not estimate a value.

    Args:
        alpha: priority exponent α (0 = uniform).
        eps: floor added to the score so solved and never-solved prompts stay drawable
            (> 0).

    Example: prompt 0 seen with p̂ = 1/2, prompt 1 with p̂ = 1, prompt 2 unseen, α = 1,
    eps = 0: priorities [0.25, 0, 0.25] → each of prompts 0 and 2 drawn with
    probability 1/2.
    """
    if not (np.isfinite(alpha) and alpha >= 0):
        raise ValueError(f"prioritized_learnability alpha must be finite and ≥ 0; got {alpha!r}.")
    if not (np.isfinite(eps) and eps > 0):
        raise ValueError(f"prioritized_learnability eps must be > 0 so every prompt stays "
                         f"drawable; got {eps!r}.")
    unseen = (0.25 + eps) ** alpha

    def init(pool):
        n = len(pool)
        return PrioritizedState(np.zeros(n, np.int64), np.zeros(n, np.int64),
                                sumtree_build(np.full(n, unseen)))

    def update(state, pool, batch):
        ids = batch.prompt_ids
        if ids.size == 0:
            return state
        np.add.at(state.attempts, ids, batch.rewards.shape[1])
        np.add.at(state.successes, ids, _success_counts(batch.success))
        touched = _unique(ids)
        score = _learnability(state.successes[touched], state.attempts[touched])
        sumtree_set(state.tree, touched, (score + eps) ** alpha)
        return state

    def apply(state, pool, n, probs, arms, rng):
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        return sumtree_sample(state.tree, rng.random(n)).astype(np.int64)

    def metrics(state, pool):
        return {"prioritized/total_priority": float(state.tree.tree[1])}

    return DataPolicy(SELECTION, init, update, apply, name="prioritized_learnability",
                      metrics=metrics)
