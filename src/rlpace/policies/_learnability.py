"""Learnability p̂(1 − p̂) as a prompt-selection score: SFL's top-k buffer mixed with
uniform draws, and a PER-style sum-tree sampler.

Foster, Sims, Forkel, Fellows, Foerster, "Learning to Reason at the Frontier of
Learnability" (LILO), arXiv 2502.12272, and its parent SFL (Rutherford et al., "No
Regrets", NeurIPS 2024, arXiv 2408.15099; `amacrutherford/sampling-for-learnability`);
docs/methods/learnability_buffer.md and prioritized_learnability.md. For binary rewards,
a prompt with success rate p contributes policy-gradient signal only when 0 < p < 1, and
the expected improvement is bounded by the variance p(1 − p) (= (mean |A| / 2)² under
GRPO).

Both policies score a prompt from its own history of training rollouts (success = reward
≥ the Scheduler's threshold) and spend no extra rollouts. The history forgets, as MoPPS's
posterior does (Qu et al., arXiv 2507.04632): each time prompt i is observed with k
successes out of G,

    s_i ← λ·s_i + k        a_i ← λ·a_i + G        p̂_i = s_i / a_i

so an observation m groups old weighs λ^m. λ = `decay` = 0.5 by default: a prompt
once at 2 of 4 (score 1/4) that the model has since mastered (4 of 4) scores 5/36 after
one more group and 0.066 after two, where a cumulative count (λ = 1) would keep it near its old
score for as long as its old rollouts outnumber the new ones. SFL itself re-scores fresh
probes at every refresh (λ = 0 in this notation); λ = 0.5 is our choice [unverified for
LLMs]. A prompt listed twice in one batch is updated once per group, in batch order (the
closed form of `beta_posterior_update`). The probe variant of LILO (4·|B| candidates, 8
fresh rollouts each) needs the trainer's help and belongs to the trainer issue.
"""

from __future__ import annotations

from ..errors import InputError
from typing import NamedTuple

import numpy as np

from ..stats._sumtree import SumTree, _unique, sumtree_build, sumtree_sample, sumtree_set
from ..types import group_wins
from ._base import SELECTION, DataPolicy
from ._checks import check_int, check_real
from ._mopps import beta_posterior_update
from ._uniform import split_by_arm
from ._state_checks import bad, check_range

__all__ = ["learnability_buffer", "prioritized_learnability"]


def _learnability(successes: np.ndarray, attempts: np.ndarray) -> np.ndarray:
    """p̂(1 − p̂) with p̂ = successes / attempts; 0 for a prompt never observed."""
    p = np.divide(successes, attempts, out=np.zeros(np.shape(successes)), where=attempts > 0)
    return p * (1.0 - p)


def _observe(successes: np.ndarray, attempts: np.ndarray, batch, decay: float) -> None:
    """In place: s ← λ·s + k, a ← λ·a + G per observed group, in batch order."""
    wins = group_wins(batch)                                          # k per group
    g = np.full(wins.shape, float(batch.rewards.shape[1]))           # G per group
    beta_posterior_update(successes, attempts, batch.prompt_ids, wins, g, decay, 0.0, 0.0)


def _check_decay(owner: str, decay) -> None:
    check_real(owner, "decay", decay, low=0, high=1, low_open=True,
               hint=" (weight of a prompt's past per new observation; 1 = never forget)")


# ---- SFL: top-k buffer + uniform ---------------------------------------------------------
class LearnabilityBufferState(NamedTuple):
    attempts: np.ndarray       # float64[N] decayed rollouts observed per prompt
    successes: np.ndarray      # float64[N] decayed successful rollouts per prompt
    buffer: np.ndarray         # int64[k] prompt ids, best first; −1 after buffer_len
    buffer_len: np.ndarray     # int64[] valid entries in buffer
    pending: np.ndarray        # int64[P] ring of prompt ids observed since the last refresh
    pending_count: np.ndarray  # int64[] pushes into the ring since the last refresh
    since_refresh: np.ndarray  # int64[] updates since the last refresh
    #: value rules `Scheduler.load_state_dict` checks for each field (policies/_state_checks.py)
    STATE_RULES = {"attempts": "nonneg", "successes": "nonneg", "pending": "ids", "pending_count": "nonneg",
                   "since_refresh": "nonneg"}

    def check_values(self, key: str, pool) -> None:
        """buffer_len ≤ capacity, prompt ids in its valid prefix, −1 after it (restored state)."""
        buf, length = np.asarray(self.buffer), int(np.asarray(self.buffer_len))
        check_range(f"{key}buffer_len", self.buffer_len, 0, buf.shape[0], high_open=False)
        if pool is not None:
            check_range(f"{key}buffer", buf[:length], 0, len(pool))     # the valid prefix: prompt ids
        if (buf[length:] != -1).any():
            raise bad(f"{key}buffer", "has entries after buffer_len that are not −1 (empty)",
                      buf, np.r_[np.zeros(length, bool), buf[length:] != -1])


def learnability_buffer(buffer_size: int = 1000, refresh_every: int = 100, mix: float = 0.5,
                        max_candidates: int = 25_000, decay: float = 0.5) -> DataPolicy:
    """SFL selection: a `mix` share of each batch uniform, the rest from a top-`buffer_size` learnability buffer.

    The buffer holds the `buffer_size` prompts with the largest p̂(1 − p̂), p̂ from a
    history that forgets at rate `decay` (module docstring). SFL (arXiv 2408.15099) as
    used by LILO (arXiv 2502.12272); docs/methods/learnability_buffer.md. Defaults from
    SFL's `minigrid-sfl.yaml` / `ippo-minigrid.yaml`: buffer 1000 (`NUM_TO_SAVE`), half the batch from the buffer
    and half fresh (`NUM_ENVS_FROM_SAMPLED` = `NUM_ENVS_TO_GENERATE` = 128, both drawn
    with replacement), a refresh every 100 updates (`EVAL_FREQ`), and at most 25,000
    candidates per refresh (`NUM_BATCHES × BATCH_SIZE` = 5 × 5000).

    Refresh: buffer ← the top-k by current p̂(1 − p̂) of (buffer ∪ prompts observed since
    the last refresh), ties to the smaller id, keeping only prompts with p̂(1 − p̂) > 0.
    Cost O(k + candidates); per update O(B). Until the buffer first holds `buffer_size`
    prompts it is refreshed after every update, and while it is empty every slot is
    uniform.

    Composed with a mixture (`"dump+learnability_buffer"`): the same round(mix·n)
    uniform and n − round(mix·n) buffer slots, each share spread over the arms ~
    Multinomial(share, probs), so arm k gets n_k ~ Multinomial(n, probs) slots in all; a
    uniform slot of arm k takes a uniform prompt of arm k, a buffer slot a uniform entry
    among arm k's buffered prompts (a uniform prompt of arm k when the buffer holds none).
    Without a mixture the draw is exactly the pool-wide one above.

    Deviations from SFL, because we reuse training rollouts instead of probing: scores
    come from the prompt's decayed history (SFL scores fresh probes); candidates are
    the prompts the trainer observed (the ring keeps the latest `max_candidates`
    observations when more arrive between refreshes); the old buffer competes with them
    (SFL replaces it); prompts with zero learnability never enter the buffer (SFL's
    top-1000 of 25,000 probes can include them).

    Args:
        buffer_size: k, prompts kept in the buffer.
        refresh_every: updates between refreshes once the buffer is full.
        mix: share of each batch drawn uniformly from the pool, round(mix · n).
        max_candidates: capacity of the ring of observed prompt ids.
        decay: λ in (0, 1], the weight of a prompt's past at each new observation
            (0.5; 1 = cumulative counts, which never forget).

    Example: pool of 4, after observing prompt 0 with p̂ = 1/2 and prompt 1 with p̂ = 1,
    the buffer is [0] (score 0.25; prompt 1 scores 0) and propose(4) returns 2 uniform
    ids and 2 copies of prompt 0. Forgetting (buffer_size 1, refresh every update, G = 4,
    λ = 0.5): prompt 0 at 2/4 (score 1/4), prompt 1 at 1/4 (3/16); then one batch where
    prompt 0 solves 4/4 (s = 0.5·2 + 4 = 5, a = 0.5·4 + 4 = 6, score 5/36) and prompt 1
    again 1/4 (score 3/16): prompt 1 replaces prompt 0. With λ = 1 prompt 0 would sit at
    6/8 (3/16, a tie that goes to the smaller id) and stay.
    """
    for name, val in (("buffer_size", buffer_size), ("refresh_every", refresh_every),
                      ("max_candidates", max_candidates)):
        check_int("learnability_buffer", name, val)
    check_real("learnability_buffer", "mix", mix, low=0, high=1, hint=" (uniform share of each batch)")
    _check_decay("learnability_buffer", decay)

    def init(pool):
        n = len(pool)
        return LearnabilityBufferState(np.zeros(n), np.zeros(n),
                                       np.full(buffer_size, -1, np.int64), np.array(0, np.int64),
                                       np.full(max_candidates, -1, np.int64), np.array(0, np.int64),
                                       np.array(0, np.int64))

    def refresh(state):
        filled = min(int(state.pending_count), max_candidates)
        cand = _unique(np.concatenate([state.buffer[:int(state.buffer_len)], state.pending[:filled]]))
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
        _observe(state.successes, state.attempts, batch, decay)
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
        if probs is not None:
            return _buffer_by_arm(state.buffer[:size], pool, n - n_buf, n_buf, probs, arms, rng)
        uniform = rng.integers(0, len(pool), size=n - n_buf, dtype=np.int64)
        from_buf = state.buffer[rng.integers(0, max(size, 1), size=n_buf)]
        return np.concatenate([uniform, from_buf])

    def metrics(state, pool):
        size = int(state.buffer_len)
        buf = state.buffer[:size]
        mean = float(_learnability(state.successes[buf], state.attempts[buf]).mean()) if size else 0.0
        return {"learnability/buffer_size": float(size), "learnability/buffer_mean_score": mean}

    return DataPolicy(SELECTION, init, update, apply, name="learnability_buffer", metrics=metrics,
                      follows_mixture=True)


def _buffer_by_arm(buf: np.ndarray, pool, n_uni: int, n_buf: int, probs, arms: str,
                   rng: np.random.Generator) -> np.ndarray:
    """int64[n_uni + n_buf] SFL's draw under a mixture: each share's slots are spread over
    the arms ~ Multinomial(share, probs) (`split_by_arm`; the two together are
    Multinomial(n, probs), as a single split would be); a uniform slot of arm k takes a
    uniform prompt of arm k, a buffer slot a uniform entry of arm k's part of `buf`, or a
    uniform prompt of arm k when the buffer holds none of it. O(n + |buf| + K)."""
    c_uni, order, offsets = split_by_arm(pool, n_uni, probs, arms, rng, "learnability_buffer")
    c_buf, _, _ = split_by_arm(pool, n_buf, probs, arms, rng, "learnability_buffer")
    k = c_uni.shape[0]
    codes = pool.arm_codes(arms)[buf]
    b_size = np.bincount(codes, minlength=k)
    b_order = buf[np.argsort(codes, kind="stable")]       # buffer grouped by arm
    b_off = np.cumsum(b_size) - b_size
    c_uni = c_uni + np.where(b_size > 0, 0, c_buf)         # no buffered prompt: uniform in the arm
    c_buf = np.where(b_size > 0, c_buf, 0)
    arm_u = np.repeat(np.arange(k), c_uni)
    arm_b = np.repeat(np.arange(k), c_buf)
    uniform = order[offsets[arm_u] + (rng.random(arm_u.size) * np.diff(offsets)[arm_u]).astype(np.int64)]
    from_buf = b_order[b_off[arm_b] + (rng.random(arm_b.size) * b_size[arm_b]).astype(np.int64)]
    return np.concatenate([uniform, from_buf]).astype(np.int64)


# ---- PER over learnability ----------------------------------------------------------------
class PrioritizedState(NamedTuple):
    attempts: np.ndarray   # float64[N] decayed rollouts observed per prompt
    successes: np.ndarray  # float64[N] decayed successful rollouts per prompt
    tree: SumTree          # leaves: priority (p̂(1 − p̂) + eps)^alpha, unseen at the maximum
    #: value rules `Scheduler.load_state_dict` checks for each field (policies/_state_checks.py)
    STATE_RULES = {"attempts": "nonneg", "successes": "nonneg"}


def prioritized_learnability(alpha: float = 0.6, eps: float = 1e-6, decay: float = 0.5) -> DataPolicy:
    """Draw prompts with probability ∝ (p̂(1 − p̂) + `eps`)^`alpha` from a sum tree.

    Prioritized Experience Replay (Schaul et al., arXiv 1511.05952; `openai/baselines`
    defaults α = 0.6, eps = 1e-6) with LILO's learnability (arXiv 2502.12272) as the
    priority, p̂ from a history that forgets at rate `decay` (module docstring);
    docs/methods/prioritized_learnability.md. Each draw
    is independent (with replacement, as baselines' `_sample_proportional`), O(log N);
    an update re-prices only the batch's prompts, O(B log N). Building the tree at
    init is the one O(N) step.

    Unseen prompts get the maximum attainable priority (1/4 + eps)^α: PER gives new
    items the largest priority seen so far, and p̂(1 − p̂) ≤ 1/4, so that maximum is
    known in advance (baselines' initial max of 1.0 is a TD-error scale and would make
    unseen prompts 2.3× likelier than the most learnable seen ones). No importance
    weights: this selects data for the next batch, it does not estimate a value.

    Composed with a mixture (`"dump+prioritized_learnability"`): n_k ~ Multinomial(n,
    probs) slots for arm k, each filled by a draw ∝ priority among arm k's prompts. The
    tree cannot restrict a draw to an arm (an arm's prompts are not a subtree), so each
    arm drawn costs O(|arm k|) (a cumulative sum of its leaves) + O(n_k log |arm k|): at
    most O(N) per step. Without a mixture the O(n log N) tree draw runs as before.

    Args:
        alpha: priority exponent α in [0, 1] (0 = uniform, 1 = proportional; PER's range).
        eps: floor added to the score so solved and never-solved prompts stay drawable
            (> 0).
        decay: λ in (0, 1], the weight of a prompt's past at each new observation
            (0.5; 1 = cumulative counts, which never forget).

    Example: prompt 0 seen with p̂ = 1/2, prompt 1 with p̂ = 1, prompt 2 unseen, α = 1,
    eps = 0: priorities [0.25, 0, 0.25] → each of prompts 0 and 2 drawn with
    probability 1/2. Forgetting (λ = 0.5, α = 1): prompt 0 at 2/4 has priority 1/4 + eps;
    after it solves 4/4, s = 5, a = 6 and its priority falls to 5/36 + eps (λ = 1: 3/16 + eps).
    """
    check_real("prioritized_learnability", "alpha", alpha, low=0, high=1,
               hint=" (PER's range: 0 = uniform, 1 = fully prioritized; PER: 0.6)")
    check_real("prioritized_learnability", "eps", eps, low=0, high=1, low_open=True,
               hint=" (> 0 keeps every prompt drawable; PER: 1e-6)")
    _check_decay("prioritized_learnability", decay)
    unseen = (0.25 + eps) ** alpha

    def init(pool):
        n = len(pool)
        return PrioritizedState(np.zeros(n), np.zeros(n),
                                sumtree_build(np.full(n, unseen)))

    def update(state, pool, batch):
        ids = batch.prompt_ids
        if ids.size == 0:
            return state
        touched = _unique(ids)
        if touched.size == ids.size:
            # Every prompt once (the usual batch): `_observe`'s update written once per prompt
            # (with no repeat the order of the writes does not matter, and (1 − λ)·0 + k is k),
            # the scores from the new values (a ≥ G > 0, so p̂ = s / a), and the same leaves
            # re-priced in batch order (a node's sum does not depend on the order its distinct
            # leaves were set in): one sort of the ids instead of two, no re-gather.
            wins = group_wins(batch)
            s = decay * state.successes[ids] + wins
            a = decay * state.attempts[ids] + float(batch.rewards.shape[1])
            state.successes[ids] = s
            state.attempts[ids] = a
            p = np.divide(s, a, out=s)
            sumtree_set(state.tree, ids, (p * (1.0 - p) + eps) ** alpha)
            return state
        _observe(state.successes, state.attempts, batch, decay)
        score = _learnability(state.successes[touched], state.attempts[touched])
        sumtree_set(state.tree, touched, (score + eps) ** alpha)
        return state

    def apply(state, pool, n, probs, arms, rng):
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        if probs is None:
            return sumtree_sample(state.tree, rng.random(n)).astype(np.int64)
        # Under a mixture: n_k ~ Multinomial(n, probs), then n_k draws ∝ priority among arm
        # k's prompts. The tree's leaves are in pool order, so an arm's prompts are not a
        # subtree: each active arm costs one O(|arm k|) cumulative sum of its leaves plus
        # O(n_k log |arm k|) for the draws (at most O(N) per step, and only for the arms drawn).
        counts, order, offsets = split_by_arm(pool, n, probs, arms, rng, "prioritized_learnability")
        cap = state.tree.tree.shape[0] // 2
        out = []
        for k in np.flatnonzero(counts):
            members = order[offsets[k]:offsets[k + 1]]
            cdf = np.cumsum(state.tree.tree[cap + members])
            if not cdf[-1] > 0:
                raise InputError(f"prioritized_learnability: every prompt of {arms} {int(k)} has "
                                 f"priority 0; cannot draw from it.")
            at = cdf.searchsorted(rng.random(int(counts[k])) * cdf[-1], side="right")
            out.append(members[np.minimum(at, members.size - 1)])
        return np.concatenate(out).astype(np.int64)

    def metrics(state, pool):
        return {"prioritized/total_priority": float(state.tree.tree[1])}

    return DataPolicy(SELECTION, init, update, apply, name="prioritized_learnability",
                      metrics=metrics, follows_mixture=True)
