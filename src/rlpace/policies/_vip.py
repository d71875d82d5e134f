"""VIP's rollout allocation, a reconstruction (Nguyen et al. 2026, "Adaptive Rollout Allocation
for Online RL with Verifiable Rewards", arXiv 2602.01601). Method page: docs/methods/vip.md.

The authors' repository (`HieuNT91/VIP`) holds no code in its latest version; this follows
its earlier public files `src/vip/allocation/bernoulli_allocation.py` (`solve`,
`allocate_rollout`, `allocation_rounding`) and `src/vip/success_rate_prediction/
gaussian_process.py` (`GPR`), and the trainer of `HieuNT91/verl`
(`gaussian_allocation/gaussian_allocation_ray_trainer.py`), which may differ from the
paper's final code.

Rule (stored code): with p_i the predicted success rate of prompt i, clipped to
[1e-6, 1 − 1e-6], a_i = p_i(1 − p_i) and the hardness term b_i = γ·log p_i (< 0: harder
prompts earn a larger per-rollout bonus), minimise the predicted gradient variance

    rloo (default, γ = 0.0007):  Σ a_i/(n_i − 1) + b_i·n_i
    grpo (Dr.GRPO, γ = 0.0004):  Σ a_i(n_i − 1)/n_i² + b_i·n_i

subject to Σ n_i = W and lower ≤ n_i ≤ upper (4 and 32), then round: floor every n_i and
give the remaining units one at a time to the prompt whose surrogate a(n + 3)/(n + 4)²
drops most (never past upper). All predictions equal (std < 1e-6): W split evenly, the
first prompts +1.

Predictor (stored code): a Gaussian process on prompt embeddings, trained on the previous
batch's per-prompt accuracies: RBF kernel exp(−d²/(2·0.4²)) on L2 distances, prior mean
logit −1, targets logit(clip(acc, 1e-6, 1 − 1e-6)), jitter 1e-4; the posterior mean of a
query is prior + K_q,train·α, a training prompt's own prediction is its observed accuracy,
and p = sigmoid(mean). Here the embeddings are `Pool.features`.

What we chose (the method page lists each):
* The continuous problem is convex and separable, so it is solved exactly by its KKT
  conditions (water-filling: n_i(λ) = the n where the marginal f_i'(n) = λ, clipped to the
  bounds, and λ by bisection until Σ n_i(λ) = W) instead of SLSQP from the uniform start.
* Without `Pool.features`, p_i is a per-prompt Beta estimate: (k + 2·p0)/(m + 2) from the
  k successes of the prompt's m rollouts at its latest trainer step, p0 = sigmoid(prior
  logit); unseen prompts get p0.
* "The previous batch" is every prompt whose latest visit is the newest trainer step seen
  (copies of a prompt in one step are merged).
* No prompt is dropped: the reference zeroes rounded values below 4, which cannot happen
  when lower ≥ 4 (its trainer's setting for rollout.n > 4); with a smaller lower we keep
  every prompt ≥ lower.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..errors import InputError
from ._base import ALLOCATION, DataPolicy
from ._checks import check_choice, check_int, check_real

__all__ = ["VIPState", "vip", "vip_continuous", "vip_rounding", "vip_allocation", "gp_pass_rates"]

_P_CLIP = 1e-6
_GAMMA = {"rloo": 0.0007, "grpo": 0.0004}


class VIPState(NamedTuple):
    last_n: np.ndarray   # int64[N] rollouts at the prompt's latest trainer step (0 = unseen)
    last_k: np.ndarray   # int64[N] successes among them
    last_step: np.ndarray  # int64[N] trainer step of that visit; −1 = never seen
    newest: np.ndarray   # int64[] newest trainer step observed; −1 = none
    STATE_RULES = {"last_n": "nonneg", "last_k": "nonneg", "last_step": "step", "newest": "step"}


def _marginal(n, a, b, rule):
    """f_i'(n): rloo −a/(n − 1)² + b; grpo a(2 − n)/n³ + b (increasing for n ≥ 3)."""
    if rule == "rloo":
        return b - a / (n - 1.0) ** 2
    return b + a * (2.0 - n) / n ** 3


def _n_at(lam, a, b, lower, upper, rule):
    """float64[B]: argmin over [lower, upper] of f_i(n) − λ·n (the KKT stationary point, clipped)."""
    lo, hi = _marginal(lower, a, b, rule), _marginal(upper, a, b, rule)
    inside = (lam > lo) & (lam < hi)
    n = np.where(lam <= lo, float(lower), float(upper))
    if not inside.any():
        return n
    if rule == "rloo":
        n[inside] = 1.0 + np.sqrt(a[inside] / (b[inside] - lam))
        return np.clip(n, lower, upper)
    # grpo: a(n − 2)/n³ = b − λ has one root in (lower, upper); bisection in n
    ai, ci = a[inside], b[inside] - lam
    x0, x1 = np.full(ai.shape, float(lower)), np.full(ai.shape, float(upper))
    for _ in range(64):
        mid = 0.5 * (x0 + x1)
        above = ai * (mid - 2.0) / mid ** 3 > ci             # marginal still below λ: move right
        x0, x1 = np.where(above, mid, x0), np.where(above, x1, mid)
    n[inside] = 0.5 * (x0 + x1)
    return n


def vip_continuous(a, b, budget, lower=4, upper=32, rule="rloo") -> np.ndarray:
    """float64[B]: the exact minimiser of Σ f_i(n_i) under Σ n_i = budget, lower ≤ n_i ≤ upper
    (f_i as in the module; convex and separable). KKT: every n_i is its own stationary point
    at one multiplier λ, clipped to the bounds; Σ n_i(λ) is non-decreasing in λ, so λ is
    found by bisection (to the last bit) and the sum hits the budget to ~1e-9.

    >>> vip_continuous(np.array([0.25, 0.0625, 0.25, 0.0625]), np.zeros(4), 40).tolist()
    [13.0, 7.0, 13.0, 7.0]
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    lam_lo = float(_marginal(float(lower), a, b, rule).min())     # every n_i = lower
    lam_hi = float(_marginal(float(upper), a, b, rule).max())     # every n_i = upper
    for _ in range(200):
        mid = 0.5 * (lam_lo + lam_hi)
        if mid in (lam_lo, lam_hi):
            break
        if _n_at(mid, a, b, lower, upper, rule).sum() > budget:
            lam_hi = mid
        else:
            lam_lo = mid
    # Σ n(λ_lo) ≤ budget throughout the bisection, so the floors never overshoot the budget
    return _n_at(lam_lo, a, b, lower, upper, rule)


def vip_rounding(n, a, budget, upper=32) -> np.ndarray:
    """int64[B]: the reference's greedy rounding of a continuous allocation: floor, then each
    remaining unit to the prompt whose surrogate a(m + 3)/(m + 4)² drops most by m → m + 1
    (prompts at `upper` skipped; exact ties: the last such prompt, as a stable descending
    sort gives). Only the chosen prompt's gain changes per unit: O(R·B), R < B units.

    >>> vip_rounding(np.array([13.2, 7.4, 13.2, 7.2]), np.array([0.25, 0.0625, 0.25, 0.0625]), 41).tolist()
    [13, 7, 14, 7]
    """
    a = np.asarray(a, dtype=np.float64)
    out = np.floor(np.asarray(n, dtype=np.float64) + 1e-9).astype(np.int64)

    def gain(m, ai):
        return ai * ((m + 3.0) / (m + 4.0) ** 2 - (m + 4.0) / (m + 5.0) ** 2)

    g = np.where(out < upper, gain(out, a), -np.inf)
    b = out.shape[0]
    for _ in range(int(budget - out.sum())):
        i = b - 1 - int(np.argmax(g[::-1]))          # the last maximum
        out[i] += 1
        g[i] = gain(out[i], a[i]) if out[i] < upper else -np.inf
    return out


def vip_allocation(p, budget, *, lower=4, upper=32, rule="rloo", gamma=None) -> np.ndarray:
    """int64[B] rollouts per prompt from predicted success rates `p` (float[B]); Σ = budget,
    each in [lower, upper]: the exact continuous solution, then `vip_rounding`. Predictions
    that are all equal (std < 1e-6) split the budget evenly (first prompts +1), as the
    reference does.

    >>> vip_allocation(np.array([0.5, 0.1, 0.02, 0.9]), 40).tolist()
    [13, 9, 12, 6]
    """
    p = np.clip(np.asarray(p, dtype=np.float64), _P_CLIP, 1.0 - _P_CLIP)
    bsz = p.shape[0]
    if bsz == 0:
        return np.zeros(0, np.int64)
    if np.std(p) < 1e-6:
        out = np.full(bsz, budget // bsz, np.int64)
        out[:budget % bsz] += 1
        return out
    a = p * (1.0 - p)
    b = (_GAMMA[rule] if gamma is None else gamma) * np.log(p)
    return vip_rounding(vip_continuous(a, b, budget, lower, upper, rule), a, budget, upper)


def _logit(p):
    p = np.clip(p, _P_CLIP, 1.0 - _P_CLIP)
    return np.log(p / (1.0 - p))


def gp_pass_rates(x_train, acc, x_query, *, length_scale=0.4, prior_logit=-1.0, jitter=1e-4,
                  same=None) -> np.ndarray:
    """float64[Q]: the reference GP's predicted success rates at `x_query` (float[Q, f]) from
    the accuracies `acc` (float[T]) observed at `x_train` (float[T, f]). `same` (int[Q], −1 =
    none) marks a query that is training row j: its prediction is acc[j] (clipped), as the
    reference sets a training point's posterior mean to its own target.

    >>> gp_pass_rates(np.zeros((1, 1)), np.array([0.5]), np.array([[0.4]])).round(5).tolist()
    [0.40287]
    """
    q = np.asarray(x_query, dtype=np.float64)
    if len(acc) == 0:
        return np.full(q.shape[0], 1.0 / (1.0 + np.exp(-prior_logit)))
    x = np.asarray(x_train, dtype=np.float64)
    g = _logit(np.asarray(acc, dtype=np.float64))                              # [T]

    def kernel(u, v):                                                         # [U, V]
        d2 = (u * u).sum(1)[:, None] + (v * v).sum(1)[None, :] - 2.0 * u @ v.T
        return np.exp(-0.5 * np.maximum(d2, 0.0) / length_scale ** 2)

    chol = np.linalg.cholesky(kernel(x, x) + jitter * np.eye(x.shape[0]))     # [T, T]
    alpha = np.linalg.solve(chol.T, np.linalg.solve(chol, g - prior_logit))   # [T]
    mean = prior_logit + kernel(q, x) @ alpha                                 # [Q]
    if same is not None:
        same = np.asarray(same)
        mean = np.where(same >= 0, g[np.maximum(same, 0)], mean)
    return 1.0 / (1.0 + np.exp(-mean))


def vip(rule: str = "rloo", lower: int = 4, upper: int = 32, gamma: float | None = None,
        length_scale: float = 0.4, prior_logit: float = -1.0) -> DataPolicy:
    """VIP (arXiv 2602.01601; docs/methods/vip.md), a reconstruction: rollouts that minimise predicted gradient variance.

    An allocation policy: n_i minimises Σ a_i/(n_i − 1) + γ·log(p_i)·n_i (rule "rloo"; "grpo":
    Σ a_i(n_i − 1)/n_i² + γ·log(p_i)·n_i) with a_i = p_i(1 − p_i), Σ n_i = W, lower ≤ n_i ≤
    upper, solved exactly and rounded greedily as the reference rounds. p_i: a Gaussian
    process on `Pool.features` trained on the previous step's per-prompt accuracies (RBF,
    length scale 0.4, prior logit −1); without features, the prompt's latest accuracy
    shrunk towards sigmoid(prior_logit) by 2 pseudo-rollouts. γ: 0.0007 (rloo), 0.0004 (grpo).

    >>> import numpy as np; from rlpace import Pool, Feedback, Scheduler
    >>> s = Scheduler(Pool(["a"] * 3), "vip")
    >>> s.observe(Feedback([0, 1, 2], [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]], step=0))
    >>> s.allocate(np.array([0, 1, 2]), 24).tolist()   # p̂ = (k + 0.54)/6 = .256, .423, .756
    [8, 9, 7]
    """
    check_choice("vip", "rule", rule, ("rloo", "grpo"))
    need = 2 if rule == "rloo" else 3
    lower = check_int("vip", "lower", lower, low=need,
                      hint=f" (the {rule} variance needs n > {need - 1}; reference 4)")
    upper = check_int("vip", "upper", upper, low=1, hint=" (reference 32)")
    if lower > upper:
        raise InputError(f"vip lower = {lower} is above upper = {upper} (bounds inverted); give "
                         f"lower ≤ upper (reference: lower=4, upper=32).")
    if gamma is not None:
        gamma = check_real("vip", "gamma", gamma, low=0, hint=f" (reference {_GAMMA[rule]}; None = that)")
    length_scale = check_real("vip", "length_scale", length_scale, low=0, low_open=True, hint=" (reference 0.4)")
    prior_logit = check_real("vip", "prior_logit", prior_logit, hint=" (reference −1)")
    p0 = 1.0 / (1.0 + np.exp(-prior_logit))

    def init(pool):
        n = len(pool)
        return VIPState(np.zeros(n, np.int64), np.zeros(n, np.int64), np.full(n, -1, np.int64),
                        np.array(-1, np.int64))

    def update(state, pool, batch):
        ids = batch.prompt_ids
        if ids.size == 0:
            return state
        t = int(batch.step)
        m = np.full(ids.shape[0], batch.rewards.shape[1], np.int64)
        k = batch.success.sum(axis=1).astype(np.int64)
        newer = state.last_step[ids] < t                  # a later step replaces the visit
        state.last_n[ids[newer]] = 0
        state.last_k[ids[newer]] = 0
        state.last_step[ids[newer]] = t
        same = state.last_step[ids] == t                  # copies of a prompt in one step merge
        np.add.at(state.last_n, ids[same], m[same])
        np.add.at(state.last_k, ids[same], k[same])
        state.newest[...] = max(int(state.newest), t)
        return state

    def predict(state, pool, ids):
        seen = state.last_n[ids] > 0
        if pool.features is None:
            return np.where(seen, (state.last_k[ids] + 2.0 * p0) / (state.last_n[ids] + 2.0), p0)
        train = np.flatnonzero((state.last_step == state.newest) & (state.last_n > 0))   # previous batch
        acc = state.last_k[train] / state.last_n[train]
        same = np.full(ids.shape[0], -1, np.int64)       # a query that is a training prompt
        if train.size:
            pos = np.minimum(np.searchsorted(train, ids), train.size - 1)
            same = np.where(train[pos] == ids, pos, -1)
        feats = pool.features
        return gp_pass_rates(feats[train], acc, feats[ids], length_scale=length_scale,
                             prior_logit=prior_logit, same=same)

    def apply(state, pool, ids, budget):
        return vip_allocation(predict(state, pool, ids), budget, lower=lower, upper=upper, rule=rule,
                              gamma=gamma)

    def check_state(state, pool):
        if (state.last_k > state.last_n).any():
            raise InputError("vip state: last_k ≤ last_n must hold for every prompt; the state is "
                             "corrupt or was edited.")
        if state.last_step.size and int(state.last_step.max()) > int(state.newest):
            raise InputError("vip state: newest must be ≥ every last_step; the state is corrupt or was edited.")

    return DataPolicy(ALLOCATION, init, update, apply, name="vip", check_state=check_state,
                      bounds=(int(lower), int(upper)))
