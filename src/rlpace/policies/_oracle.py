"""Oracle reference policies: measurement tools for *headroom*, not methods.

An oracle knows every training prompt's current pass rate because someone measured it —
the simulator from the learner's true success probability, the built-in trainer with m
extra rollouts of every prompt every k steps. Those measurement rollouts are counted
apart from the training budget, so an oracle's rollouts-to-target is an upper bound on
what any scheduler could save on that setup ("headroom"), not something a user can run:
**do not use `oracle_*` in production** — without the measurement feed they only see the
training feedback and degrade into a greedy, unexplored selection.

The measurement arrives through the ordinary seam (STYLE.md, "a new signal travels the
way feedback does"): the trainer rolls out every prompt m times and calls

    sched.observe(Feedback(np.arange(N), rewards[N, m], step=t))

Each policy's `update` overwrites `pass_rate[ids]` with each observed group's pass rate
(`Batch.pass_rate`, the share of rollouts with reward ≥ the Scheduler's success
threshold). The latest measurement wins, whatever its size: training feedback (G
rollouts of the proposed prompts) also overwrites, so between measurements the oracle
follows what the trainer saw last. Within one batch a prompt seen twice keeps its last
group.

* `oracle_boundary` (selection): the n prompts with the highest p(1 − p) — the prompts
  at the learnability boundary (LILO, arXiv 2502.12272: for binary rewards the expected
  policy-gradient signal is bounded by p(1 − p)).
* `oracle_progress` (mixture over domains): all mass on the domain whose next prompt has
  the largest expected first-order gain in held-out accuracy (see its docstring; the
  gain formula is the simulator's learner, `rlpace.sim._learner`).

Method page: docs/methods/oracle.md.
"""

from __future__ import annotations

from ..errors import InputError
import math
from typing import NamedTuple

import numpy as np

from ..types import Pool
from ._base import MIXTURE, SELECTION, DataPolicy

__all__ = ["OracleState", "oracle_boundary", "oracle_progress", "expected_group_signal"]

# The pass rate an unmeasured prompt counts as: 1/2, the maximum of p(1 − p). Before the
# first measurement every prompt ties, so the oracle then draws uniformly from the pool.
UNMEASURED_P = 0.5


class OracleState(NamedTuple):
    pass_rate: np.ndarray   # float64[N] latest measured pass rate of each prompt; NaN = never measured


def _init(pool: Pool) -> OracleState:
    return OracleState(np.full(len(pool), np.nan))


def _update(state: OracleState, pool: Pool, batch) -> OracleState:
    ids = batch.prompt_ids
    if ids.size == 0:
        return state
    # Latest wins: for a prompt twice in the batch keep its last group (np.unique on the
    # reversed ids returns the first index of each id there, i.e. the last one here).
    rev = ids[::-1]
    uniq, first = np.unique(rev, return_index=True)
    state.pass_rate[uniq] = batch.pass_rate[::-1][first]
    return state


def _measured(state: OracleState) -> np.ndarray:
    """float64[N] pass rates with unmeasured prompts at `UNMEASURED_P`."""
    p = state.pass_rate
    return np.where(np.isnan(p), UNMEASURED_P, p)


def _metrics(state: OracleState, pool: Pool) -> dict:
    seen = ~np.isnan(state.pass_rate)
    p = state.pass_rate[seen]
    return {"oracle/measured_fraction": float(seen.mean()) if seen.size else 0.0,
            "oracle/mean_learnability": float((p * (1 - p)).mean()) if p.size else 0.0}


def oracle_boundary() -> DataPolicy:
    """Headroom reference selection: the n prompts with the highest measured p(1 − p), not for production.

    A measurement tool (see the module docstring): it needs every prompt's pass rate fed
    through `Scheduler.observe`. Rule: score_i = p_i(1 − p_i), an unmeasured prompt counts as p = 1/2 (score 1/4, the
    maximum: never-measured prompts are tried first, and before any measurement the draw
    is uniform). The top n by score are proposed, each once; ties at the cut are broken
    uniformly at random with the Scheduler's (seed, step) generator. When n > N every
    prompt is proposed ⌊n/N⌋ or ⌈n/N⌉ times, in score order. Any mixture is ignored.
    O(N) per proposal (a partition, not a sort), O(B) per update.

    Example: pass rates [0.5, 1.0, 0.25, 0.0] (prompt 2 scores 3/16, prompt 0 1/4):
    propose(2) returns prompts {0, 2}; propose(1) returns [0].

    >>> import numpy as np; from rlpace import Pool, Feedback, Scheduler
    >>> s = Scheduler(Pool(["a"] * 4), "oracle_boundary")
    >>> s.observe(Feedback([0, 1, 2, 3], [[1, 0, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0], [0, 0, 0, 0]], step=0))
    >>> sorted(s.propose(2).tolist())
    [0, 2]
    """
    def apply(state, pool, n, probs, arms, rng):
        n_pool = len(pool)
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        p = _measured(state)
        score = p * (1.0 - p)                                            # [N]
        if n >= n_pool:
            order = np.lexsort((rng.random(n_pool), -score))             # best first, random ties
            return order[np.arange(n) % n_pool].astype(np.int64)
        thr = np.partition(score, n_pool - n)[n_pool - n]                # n-th largest score
        above = np.flatnonzero(score > thr)
        ties = np.flatnonzero(score == thr)
        pick = ties[rng.permutation(ties.size)[: n - above.size]]
        return np.concatenate([above, pick]).astype(np.int64)

    return DataPolicy(SELECTION, _init, _update, apply, name="oracle_boundary", metrics=_metrics,
                      reads=frozenset({"measurement"}))


# lcm(1, …, 16): a rate k/m with m ≤ 16 times this is an integer (up to the division's rounding)
_RATE_GRID = 720720


def distinct_values(p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(u float64[U], inv int64[N]) with u[inv] == p element for element (flat `p`): the
    distinct values of `p` and where each element's is, like np.unique(p, return_inverse=True)
    but without its argsort when `p` holds rates k/m, m ≤ 16 (a measured pass rate): such
    values are keyed by rint(p·720720) and counted, and the keyed values are checked equal
    to `p` bit for bit (any other input, or two values on one key, takes np.unique).
    u is sorted and holds each value once either way; only the cost differs.
    """
    p = np.asarray(p, dtype=np.float64).reshape(-1)
    key = np.rint(p * _RATE_GRID)
    if p.size and (key >= 0).all() and (key <= _RATE_GRID).all():          # NaN fails both
        key = key.astype(np.int64)
        present = np.zeros(_RATE_GRID + 1, bool)
        present[key] = True
        keys = np.flatnonzero(present)
        slot = np.empty(_RATE_GRID + 1, np.int64)
        slot[keys] = np.arange(keys.size)
        inv = slot[key]
        u = np.empty(keys.size)
        u[inv] = p
        if (u[inv] == p).all() and (np.diff(u) > 0).all():
            return u, inv
    return np.unique(p, return_inverse=True)


def expected_group_signal(p: np.ndarray, group_size: int, eps: float = 1e-6) -> np.ndarray:
    """float64[...] E[mean_j |A_j|] of a GRPO group of `group_size` binary rollouts of a
    prompt with pass rate p: the learner's per-group signal (`rlpace.sim.group_signal`).

    With k ~ Binomial(G, p) successes and q = k/G, the group's mean |A| is
    2q(1 − q) / (√(q(1 − q)) + eps) (0 for k ∈ {0, G}), so
    E = Σ_k C(G, k) p^k (1 − p)^(G−k) · 2q(1 − q) / (√(q(1 − q)) + eps).

    >>> expected_group_signal(np.array([0.0, 0.5, 1.0]), 2).round(4).tolist()
    [0.0, 0.5, 0.0]
    """
    g = int(group_size)
    p = np.asarray(p, dtype=np.float64)
    if p.size > 64 * (g + 1):
        # measured pass rates take few values (multiples of 1/m, and 1/2 before a measurement):
        # the sum once per distinct value, then a gather — the same numbers, and a 10⁵-prompt
        # oracle_progress simulation no longer spends most of its time here
        u, inv = distinct_values(p)
        if u.size * 8 < p.size:
            return expected_group_signal(u, g, eps)[inv].reshape(p.shape)
    k = np.arange(g + 1, dtype=np.float64)
    q = k / g
    sig = 2.0 * q * (1.0 - q) / (np.sqrt(q * (1.0 - q)) + eps)           # [G+1]
    comb = np.array([math.comb(g, int(j)) for j in k], dtype=np.float64)
    # Σ_k over G + 1 terms of whole-pool vectors, with p^k and (1 − p)^k as running products:
    # the oracles call this on the whole pool every step, and a [N, G+1] power (`**`) was
    # most of a 10⁵-prompt simulation's time
    up, down = [np.ones_like(p)], [np.ones_like(p)]
    for _ in range(g):
        up.append(up[-1] * p)                                             # p^k
        down.append(down[-1] * (1.0 - p))                                 # (1 − p)^k
    out = np.zeros_like(p)
    for j in range(1, g):                                                 # sig is 0 at k ∈ {0, G}
        out += (comb[j] * sig[j]) * up[j] * down[g - j]
    return out


def oracle_progress(group_size: int = 16, transfer=None) -> DataPolicy:
    """Headroom reference mixture: all mass on the domain with the largest expected accuracy gain, not for production.

    A measurement tool (see the module docstring): the domain whose prompts promise the
    largest expected first-order gain in domain-balanced held-out accuracy per rollout,
    under the latest measured pass rates. The learner (`rlpace.sim._learner`): a step adds lr·M @ gain to the skills, where
    gain_k = Σ over the batch's groups of domain k of the group's mean |A| / B, and held-out
    accuracy of domain j is mean σ(s_j − d). One prompt of domain k (drawn uniformly in k)
    therefore raises the mean accuracy by, to first order,

        value_k = g_k · Σ_j M[j, k] · slope_j,
        g_k     = mean_{i ∈ k} E[group mean |A| | p_i, G]     (`expected_group_signal`)
        slope_j = mean_{i ∈ j} p_i (1 − p_i)                  (dσ/ds at the measured p)

    (lr, B and 1/K are common factors). Every prompt costs G rollouts, so the order per
    rollout is the same. The mixture puts probability 1 on argmax value_k, split equally
    among ties; unmeasured prompts count as p = 1/2, so before any measurement all
    domains tie and the mixture is uniform. The slope is read on the training prompts,
    which the simulator draws from the held-out distribution (already-solved prompts
    lower every domain's slope alike in `solved_majority`).

    We maximise the accuracy gain, not the raw skill gain the issue names: skill gained
    in an already-solved domain moves no accuracy, and with forward transfer the raw
    skill gain favours the easiest rung for ever.

    Args:
        group_size: G, rollouts per training prompt (the simulator's and the trainer's).
        transfer: K×K matrix M in the pool's domain order (`pool.domain_names`): a unit
            of signal in domain k moves skill j by M[j, k]; None = identity (no transfer).
            The simulator's is `Scenario.transfer_matrix()` (permute it by
            `World.pool_order` when the scenario's order differs from the pool's).

    O(N·G) per `apply` (each proposal), O(B) per update.

    >>> import numpy as np; from rlpace import Pool, Feedback, Scheduler
    >>> s = Scheduler(Pool(["a", "a", "b", "b"]), "oracle_progress", group_size=4)
    >>> s.observe(Feedback([0, 1, 2, 3], [[1, 1, 1, 1], [1, 1, 1, 0], [1, 0, 1, 0], [1, 1, 0, 0]], step=0))
    >>> s.domain_probs().tolist()
    [0.0, 1.0]
    """
    if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)) or group_size < 1:
        raise InputError(f"oracle_progress group_size must be a positive int (rollouts per prompt); "
                         f"got {group_size!r}.")
    m = None
    if transfer is not None:
        m = np.asarray(transfer, dtype=np.float64)
        if m.ndim != 2 or m.shape[0] != m.shape[1] or not np.isfinite(m).all():
            raise InputError(f"oracle_progress transfer must be a finite K×K matrix; got shape {m.shape}.")

    def init(pool):
        k = pool.n_domains
        if m is not None and m.shape[0] != k:
            raise InputError(f"oracle_progress transfer is {m.shape[0]}×{m.shape[0]} but the pool has "
                             f"{k} domains {list(pool.domain_names)}; give a {k}×{k} matrix.")
        return _init(pool)

    def apply(state, pool, *_):
        k = pool.n_domains
        p = _measured(state)                                              # [N]
        size = np.maximum(np.bincount(pool.domains, minlength=k), 1)
        g_k = np.bincount(pool.domains, weights=expected_group_signal(p, group_size), minlength=k) / size
        slope = np.bincount(pool.domains, weights=p * (1.0 - p), minlength=k) / size
        reach = slope if m is None else m.T @ slope                       # [K] Σ_j M[j, k] slope_j
        value = g_k * reach
        best = value >= value.max() - 1e-12 * max(abs(value.max()), 1e-300)
        return best / best.sum()

    return DataPolicy(MIXTURE, init, _update, apply, arms="domain", name="oracle_progress",
                      metrics=_metrics, reads=frozenset({"measurement"}))
