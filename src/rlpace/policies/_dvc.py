"""DVC: distribution-level influence values allocated by a non-stationary bandit.

A reconstruction from the abstract of Yang et al., "Distribution-Value Coevolution for
Adaptive RLHF Data Scheduling" (KDD 2026, DOI 10.1145/3770855.3817990): distributions as
units, sliding-window influence estimation, bandit-guided scheduling with exploration–
exploitation guarantees. The paper's text and code are not public; every rule below is ours,
chosen from the literature the abstract points to (docs/methods/dvc.md).

Value of a group (one prompt's G rollouts), in [0, 1]:

  * influence (when `Feedback.grads` is given): x_z = (1 + cos(f_z, h_z)) / 2 with
    f_z = Σ_j grads[z, j] the group's gradient feature and h_z the reference: the held-out
    direction `Feedback.ref_grad` when given, else the leave-one-out batch gradient
    g_B − f_z (the plain batch gradient would contain f_z and reward a group for agreeing
    with itself). The cosine keeps the value bounded as gradient norms decay — a bandit's
    gains must lie in [0, 1]. A zero feature (a group with A = 0) has cos = 0, x = 1/2.
  * reward fallback (no features, so it runs in every adapter): x_z = min(1, mean_j |A_zj|)
    — the learnability signal DUMP and SEC use; GRPO's mean |A| is ≤ 1 by Cauchy–Schwarz.

An arm's gain at a step is the mean x of its groups in the batch. Allocation, `bandit=`:

  * "exp3s" (default) — EXP3.S (Auer, Cesa-Bianchi, Freund, Schapire, SIAM J. Comput. 32(1),
    2002, §8), in the log domain, with the semi-bandit estimate of a batch of n prompts:
    q_i = 1 − (1 − p_i)^n (probability that arm i appears), x̂_i = x_i/q_i if present else 0,

        w_i ← w_i·exp(γ·x̂_i/K) + (e·α/K)·Σ_j w_j      (Σ before the update)
        p_i = (1 − γ)·w_i/Σ_j w_j + γ/K

    with α = 1/T and γ = min(1, sqrt(K·(S·ln(KT) + e) / ((e − 1)·T))), T = `horizon`,
    S = `switches` + 1 (Corollary 8.3). Bound (Theorem 8.1 at these values; n = 1): for every
    sequence of arms with at most S − 1 switches, G_seq − E[G_EXP3.S] ≤
    2·sqrt(e − 1)·sqrt(K·T·(S·ln(KT) + e)) = O(sqrt(K·T·S·ln(KT))). γx̂/K ≤ 1 because
    q_i ≥ p_i ≥ γ/K. The fixed share (e·α/K)·Σw is what lets a collapsed arm recover.
  * "swucb" — Sliding-Window UCB (Garivier & Moulines, ALT 2011, arXiv 0805.3415) over the
    last τ = `window` steps (global steps, not per-arm pulls): index_i = X̄_i(τ) +
    sqrt(ξ·ln(min(t, τ)) / N_i(τ)) with ξ = 0.6 and gains in [0, 1] (B = 1); an arm unseen
    in the window gets 1 + sqrt(ξ·ln(max(2, min(t, τ)))). Mixture p = softmax(index / T).
    Regret O(sqrt(T·Γ·ln T)) for Γ breakpoints with τ = 2·sqrt(T·ln T / Γ) under
    piecewise-i.i.d. gains (the guarantee is for argmax play; the softmax is our mixture).

Both keep the sliding window (per-step sums and counts per arm, float64[τ, K]): it is the
SW-UCB statistic and, for EXP3.S, the logged value `dvc/value/<arm>`. Memory is bounded:
summaries per step, never raw gradients.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..types import group_mean_abs_advantage
from ._base import MIXTURE, DataPolicy, shifted_softmax
from ._checks import check_choice, check_int, check_real
from ._sec import arm_batch_reads
from ._state_checks import check_range

__all__ = ["dvc", "exp3s_parameters", "exp3s_probs", "exp3s_update", "dvc_values"]

_XI = 0.6                  # SW-UCB padding constant ξ > 1/2 (Garivier & Moulines' simulations)


class DvcState(NamedTuple):
    log_w: np.ndarray    # float64[K] EXP3.S log-weights (normalised: logsumexp = 0)
    prob: np.ndarray     # float64[K] current distribution p
    sums: np.ndarray     # float64[W, K] per-step sum of group values per arm (ring, W = window)
    counts: np.ndarray   # float64[W, K] per-step number of groups per arm
    cursor: np.ndarray   # int64[] next ring slot
    t: np.ndarray        # int64[] updates so far
    #: value rules `Scheduler.load_state_dict` checks for each field (policies/_state_checks.py)
    STATE_RULES = {"prob": "prob", "counts": "nonneg", "t": "nonneg"}

    def check_values(self, key: str, pool) -> None:
        """The cursor inside the ring of sums (restored state)."""
        check_range(f"{key}cursor", self.cursor, 0, np.asarray(self.sums).shape[0])


def exp3s_parameters(k: int, horizon: int, switches: int) -> tuple[float, float]:
    """(γ, α) of EXP3.S Corollary 8.3: α = 1/T, γ = min(1, sqrt(K(S ln(KT) + e)/((e−1)T))), S = switches + 1.

    >>> [round(x, 6) for x in exp3s_parameters(2, 1000, 4)]
    [0.217714, 0.001]
    """
    s = switches + 1
    gamma = min(1.0, math.sqrt(k * (s * math.log(k * horizon) + math.e) / ((math.e - 1) * horizon)))
    return gamma, 1.0 / horizon


def exp3s_probs(log_w: np.ndarray, gamma: float) -> np.ndarray:
    """float64[K] p = (1 − γ)·w/Σw + γ/K."""
    w = np.exp(log_w - log_w.max())
    return (1.0 - gamma) * w / w.sum() + gamma / log_w.shape[0]


def exp3s_update(log_w: np.ndarray, prob: np.ndarray, gains: np.ndarray, present: np.ndarray,
                 n: int, gamma: float, alpha: float) -> np.ndarray:
    """float64[K] new (normalised) log-weights after one EXP3.S round.

    `gains` float64[K] in [0, 1] for the arms in `present` (bool[K]), which were observed
    among `n` draws from `prob`; n = 1 is the classic one-pull bandit (q = p).
    """
    k = log_w.shape[0]
    q = -np.expm1(n * np.log1p(-np.minimum(prob, 1.0 - 1e-16)))     # 1 − (1 − p)^n, accurate
    x_hat = np.where(present, gains / np.maximum(q, 1e-300), 0.0)
    total = _logsumexp(log_w)
    grown = log_w + gamma * x_hat / k
    new = np.logaddexp(grown, math.log(math.e * alpha / k) + total)
    return new - _logsumexp(new)


def _logsumexp(x: np.ndarray) -> float:
    top = float(x.max())
    return top + math.log(float(np.exp(x - top).sum()))


def dvc_values(batch, signal: str) -> np.ndarray:
    """float64[B] value in [0, 1] of each group (module docstring): influence when `signal`
    is "influence" or "auto" with features, else the reward fallback."""
    if signal != "reward" and batch.grads is not None and batch.grads.shape[2] > 0:
        f = batch.grads.astype(np.float64).sum(axis=1)                   # [B, d]
        top = np.abs(f).max()
        f = f / top if top > 0 else f
        if batch.ref_grad is not None:
            h = np.broadcast_to(batch.ref_grad.astype(np.float64), f.shape)
            h = h / max(np.abs(h).max(), 1e-300)
        else:
            h = f.sum(axis=0)[None, :] - f                               # leave-one-out g_B
        dot = np.einsum("bd,bd->b", f, h)
        norm = np.linalg.norm(f, axis=1) * np.linalg.norm(h, axis=1)
        cos = np.where(norm > 0, dot / np.where(norm > 0, norm, 1.0), 0.0)
        return np.clip((1.0 + cos) / 2.0, 0.0, 1.0)
    # row sum / G (.mean(axis=1)'s arithmetic), derived once per batch
    return np.minimum(group_mean_abs_advantage(batch), 1.0)


def dvc(bandit: str = "exp3s", signal: str = "auto", horizon: int = 1000, switches: int = 4,
        window: int = 0, temperature: float = 0.1, arms: str = "domain") -> DataPolicy:
    """DVC (KDD 2026; reconstruction from the abstract): arms valued by windowed gradient influence, allocated by EXP3.S or SW-UCB.

    See the module docstring for the values, both bandits and their regret bounds;
    docs/methods/dvc.md.

    Args:
        bandit: "exp3s" (default) or "swucb".
        signal: "auto" (influence when `Feedback.grads` is given, else reward), "influence"
            (falls back to reward on batches without features) or "reward".
        horizon: T, the expected number of updates (sets EXP3.S's γ, α and the default window).
        switches: expected number of changes of the best arm over the horizon (S − 1).
        window: τ in steps (0 = 4·sqrt(T·ln T), the setting of Garivier & Moulines'
            simulations and of SMPyBandits' SWUCBPlus).
        temperature: softmax temperature of the SW-UCB mixture.
        arms: "domain" or "cluster".

    Example: K = 2, T = 1000, S = 5 gives γ = 0.2177 and α = 0.001, so p starts at [0.5, 0.5]
    and never drops below γ/K = 0.1089.
    """
    check_choice("dvc", "bandit", bandit, ("exp3s", "swucb"))
    check_choice("dvc", "signal", signal, ("auto", "influence", "reward"))
    check_int("dvc", "horizon", horizon, low=2, high=10**9)
    check_int("dvc", "switches", switches, low=0, high=10**9)
    check_int("dvc", "window", window, low=0, high=10**6, hint=" (0 = 4·sqrt(T ln T))")
    check_real("dvc", "temperature", temperature, low=0, low_open=True)
    check_choice("dvc", "arms", arms, ("domain", "cluster"))
    tau = window or max(1, int(round(4 * math.sqrt(horizon * math.log(horizon)))))

    def init(pool):
        k = pool.n_arms(arms)
        gamma, _ = exp3s_parameters(k, horizon, switches)
        log_w = np.full(k, -math.log(k))
        prob = exp3s_probs(log_w, gamma) if bandit == "exp3s" else np.full(k, 1.0 / k)
        return DvcState(log_w, prob, np.zeros((tau, k)), np.zeros((tau, k)),
                        np.array(0, np.int64), np.array(0, np.int64))

    def update(state, pool, batch):
        b = batch.prompt_ids.shape[0]
        if b == 0:
            return state
        k = state.prob.shape[0]
        arm = batch.domains if arms == "domain" else batch.clusters    # [B] (gathered once per step)
        x = dvc_values(batch, signal)                                    # [B] in [0, 1]
        cnt = np.bincount(arm, minlength=k).astype(np.float64)
        tot = np.bincount(arm, weights=x, minlength=k)       # 0.0 where an arm has no group
        present = cnt > 0
        slot = int(state.cursor)
        state.sums[slot] = tot
        state.counts[slot] = cnt
        state.cursor[...] = (slot + 1) % tau
        state.t[()] = int(state.t) + 1                   # item write: ~10× cheaper than += on 0-d
        if bandit == "exp3s":
            gamma, alpha = exp3s_parameters(k, horizon, switches)
            gains = tot / np.maximum(cnt, 1.0)                   # absent arms: 0.0 / 1 = 0
            state.log_w[:] = exp3s_update(state.log_w, state.prob, gains, present, b, gamma, alpha)
            state.prob[:] = exp3s_probs(state.log_w, gamma)
        else:
            state.prob[:] = _swucb_probs(state, tau)
        return state

    def _swucb_probs(state, tau):
        n = state.counts.sum(axis=0)
        mean = state.sums.sum(axis=0) / np.maximum(n, 1.0)
        horizon_now = max(2, min(int(state.t), tau))
        pad = np.sqrt(_XI * math.log(horizon_now) / np.maximum(n, 1.0))
        index = np.where(n > 0, mean + pad, 1.0 + math.sqrt(_XI * math.log(horizon_now)))
        return shifted_softmax(index, temperature)

    def apply(state, pool, *_):
        return state.prob.copy()

    def metrics(state, pool):
        n = state.counts.sum(axis=0)
        mean = state.sums.sum(axis=0) / np.maximum(n, 1.0)
        names = pool.domain_names if arms == "domain" else pool.cluster_names
        return {f"dvc/value/{a}": float(v) for a, v, c in zip(names, mean, n) if c > 0}

    # the reward fallback needs no features; the influence value reads the held-out direction
    # when a trainer provides it (else the leave-one-out batch gradient)
    reads = frozenset() if signal == "reward" else frozenset({"grads", "ref_grad"})
    return DataPolicy(MIXTURE, init, update, apply, arms=arms, name="dvc", metrics=metrics, reads=reads,
                      batch_reads=arm_batch_reads(arms))
