"""The simulator's learner fitted to a pilot by maximum a posteriori, with a Laplace posterior.

The family is `rlpace.sim`'s learner (docs/advise.md says why, with the measurements):

    prompt i of domain k:   d_i = −6 + 0.5·ε      with probability π_k   (solved by the base)
                            d_i ~ N(μ_k, σ_k²)    otherwise
    success of a rollout:   Bernoulli(σ(s_k(t) − d_i))
    skill:                  x(t) = lr · M(τ, ω) @ Σ_{t' < t} gain(t'),   s(t) = (1 − e^(−c·x(t)))/c
                            (s = x for c = 0; with c > 0 no skill passes 1/c logits)
    gain_k(t')              = Σ_{groups of domain k at t'} mean|A| / B   (GRPO advantages)

`gain` is computed from the pilot's own rewards (the signal every group gave), so the
skill path is a deterministic function of (lr, τ, ω) and the likelihood of the pilot is a
product over groups of a binomial integrated over the difficulty prior:

    P(w | k, t, n) = π_k·Bin(w; n, σ(s_k(t) + 6)) + (1 − π_k)·E_z[Bin(w; n, σ(s_k(t) − μ_k − σ_k z))]

with n the group's own rollouts: G, or N_i when the pilot ran a rollout-allocation policy
(ragged groups; a group of N_i = 0 carries no likelihood and no signal, and a group's signal is
the mean |A| over its own N_i, as in the simulator).

(Q equal-probability quantile nodes for z). M(τ, ω)[k, j] = τ^(r_k − r_j) + ω for r_j < r_k and
ω for r_j > r_k, where r ranks the domains from the easiest (highest pilot pass rate):
practice transfers to harder domains (the simulator's `transfer_forward`) and, by ω, to every
domain (a skill the domains share, as one network's are; prior centred at ω ≈ 0.08). Forgetting is fixed at 0 (a 50-step pilot
cannot identify it). The skill cap c is fitted only where the pilot supports it
(`saturation="auto"`: kept when it raises the log likelihood by more than `SAT_MARGIN`, a
likelihood-ratio test at 5 %; otherwise c = 0 and the fit is the linear learner's, to the bit);
kept, log c is one more coordinate of θ and its Laplace posterior (prior N(log 0.025, 1.5²):
a cap near 40 logits, no cap within a pilot's reach). Weak priors make the MAP finite where the data say nothing (a domain
the pilot never sampled gets the prior; a one-step profile cannot identify lr and τ, so
their draws come from the prior — a weaker pilot, and the advice says so).

Uncertainty: a Laplace approximation, θ ~ N(θ̂, H⁻¹) with H the finite-difference Hessian
of the negative log posterior at θ̂; `draw_params` samples it. The model's own error, which
the Laplace posterior does not carry, is read from the pilot by held-out prediction
(`rate_discrepancy`); what the user's held-out number measures, from the pilot's own
evaluations (`predicted_evals`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..errors import InputError
from ..sim import group_signal
from ..types import Pool
from ._record import Pilot

__all__ = ["LearnerFit", "fit_learner", "draw_params", "transfer_matrix", "LearnerParams", "prompt_difficulties",
           "Discrepancy", "rate_discrepancy", "predicted_evals", "heldout_difficulties", "eval_accuracy",
           "greedy_from_sampled", "EVAL_MODES", "HeldoutSolved", "fit_heldout_solved"]

SOLVED_D = -6.0
#: step_norm="auto" switches to the "signal" learner only past this log-likelihood gain (a
#: likelihood ratio of e³ ≈ 20 between two families of equal size)
AUTO_MARGIN = 3.0
_Q = 24
# quantile nodes of N(0, 1): z_q = Φ⁻¹((q + ½)/Q), each of weight 1/Q
_Z = None

# weak priors (mean, sd) on the unconstrained parameters
PRIOR = {"mu": (0.0, 4.0), "log_sd": (0.0, 0.75), "logit_pi": (-1.5, 2.0), "log_lr": (math.log(0.1), 2.0),
         "logit_tau": (-1.0, 1.5), "logit_omega": (-2.5, 1.5), "log_sat": (math.log(0.025), 1.5)}
#: saturation="auto" keeps the skill cap only past this log-likelihood gain: the likelihood-ratio
#: test of one added parameter at 5 % (χ²₁ 95th percentile 3.84, halved)
SAT_MARGIN = 1.92


def _nodes() -> np.ndarray:
    global _Z
    if _Z is None:
        from scipy.special import ndtri
        _Z = ndtri((np.arange(_Q) + 0.5) / _Q)
    return _Z


class LearnerParams(NamedTuple):
    """One learner: per-domain difficulty prior and the learning dynamics."""

    mu: np.ndarray       # float64[K] mean difficulty of the unsolved prompts, logits
    sd: np.ndarray       # float64[K] their spread
    solved: np.ndarray   # float64[K] π_k share of prompts the base already solves
    lr: float            # skill per unit of batch-normalised GRPO signal
    tau: float           # transfer to the next harder domain
    omega: float = 0.0   # transfer to every other domain (a skill the domains share)
    sat: float = 0.0     # c = 1 / (skill cap): skill (1 − e^(−c·x))/c of the linear skill x (0: x, no cap)
    heldout_solved: np.ndarray | None = None  # float64[K] h_k share of held-out prompts the base solves
                                              # (None: π_k, the training prompts'; `fit_heldout_solved`)


class LearnerFit(NamedTuple):
    """The fit: MAP parameters, Laplace covariance, and what the predictions need."""

    domains: tuple            # K pool domain names (pool code order)
    params: LearnerParams     # MAP
    theta: np.ndarray         # float64[P] MAP on the unconstrained scale
    cov: np.ndarray           # float64[P, P] Laplace covariance
    rank: np.ndarray          # int64[K] curriculum rank of each domain (0 = easiest)
    log_lik: float            # log likelihood of the pilot at the MAP
    n_groups: int
    n_steps: int
    group_size: int
    batch_size: int
    observed: np.ndarray      # bool[K] domains the pilot sampled
    identifiable_dynamics: bool   # False for a one-step profile: lr, τ come from the prior
    step_norm: str            # "batch" or "signal": how a step's gain is normalised (`rlpace.sim.simulate`)
    log_lik_other: float      # log likelihood at the MAP of the other step_norm (the family choice)
    data: dict                # arrays for per-prompt posteriors (positions, wins, step index, gains)
    saturation_gain: float = math.nan   # log lik with the skill cap − without it (NaN: not fitted)
    heldout: "HeldoutSolved | None" = None   # the held-out solved share h_k and its uncertainty (`fit_heldout_solved`)

    def skill_path(self, p: LearnerParams | None = None) -> np.ndarray:
        """float64[T + 1, K] skill before each pilot step and after the last."""
        p = self.params if p is None else p
        return saturated_skill(p.lr * self.data["cum"] @ transfer_matrix(self.rank, p.tau, p.omega).T, p.sat)

    def to_json(self) -> dict:
        p = self.params
        sd = np.sqrt(np.clip(np.diag(self.cov), 0, None))
        k = len(self.domains)
        return {"domains": list(self.domains), "mu": p.mu.tolist(), "sd": p.sd.tolist(), "solved": p.solved.tolist(),
                "lr": p.lr, "transfer": p.tau, "curriculum_rank": self.rank.tolist(),
                "se_unconstrained": {"mu": sd[:k].tolist(), "log_sd": sd[k:2 * k].tolist(),
                                     "logit_solved": sd[2 * k:3 * k].tolist(), "log_lr": float(sd[3 * k]),
                                     "logit_transfer": float(sd[3 * k + 1]),
                                     "logit_shared_transfer": float(sd[3 * k + 2])},
                "shared_transfer": p.omega, "skill_cap": None if p.sat <= 0 else 1.0 / p.sat,
                "se_log_saturation": float(sd[3 * k + 3]) if sd.shape[0] > 3 * k + 3 else None,
                "skill_cap_log_lik_gain": None if not math.isfinite(self.saturation_gain) else self.saturation_gain,
                "log_lik": self.log_lik, "groups": self.n_groups, "steps": self.n_steps,
                "group_size": self.group_size, "batch_size": self.batch_size,
                "domains_observed": self.observed.tolist(),
                "dynamics_identifiable": self.identifiable_dynamics,
                "skill_after_pilot": self.skill_path()[-1].tolist(), "step_norm": self.step_norm,
                "log_lik_other_step_norm": self.log_lik_other,
                "heldout_solved": None if self.heldout is None else self.heldout.to_json()}


def transfer_matrix(rank: np.ndarray, tau: float, omega: float = 0.0) -> np.ndarray:
    """float64[K, K] M with M[k, j] = τ^(r_k − r_j) + ω when r_j < r_k, ω when r_j > r_k, 1 on
    the diagonal: practice transfers up the curriculum (τ) and, besides, to every domain (ω).

    >>> transfer_matrix(np.array([1, 0]), 0.5).tolist()
    [[1.0, 0.5], [0.0, 1.0]]
    >>> transfer_matrix(np.array([1, 0]), 0.5, 0.25).tolist()
    [[1.0, 0.75], [0.25, 1.0]]
    """
    gap = rank[:, None] - rank[None, :]
    k = len(rank)
    return (np.eye(k) + np.where(gap > 0, float(tau) ** np.maximum(gap, 0), 0.0)
            + float(omega) * (1.0 - np.eye(k)))


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def saturated_skill(x, c: float):
    """The skill (1 − e^(−c·x))/c reached from the linear skill x (lr · M @ cumulative gain):
    x itself for c = 0, at most 1/c logits for c > 0, with slope e^(−c·x) (each unit of signal
    moves the skill less the more it has moved).

    >>> float(saturated_skill(2.0, 0.0)), round(float(saturated_skill(2.0, 0.25)), 4), round(float(saturated_skill(1e3, 0.25)), 4)
    (2.0, 1.5739, 4.0)
    """
    return x if c <= 0.0 else -np.expm1(-c * np.asarray(x, np.float64)) / c


def _n_params(k: int, saturating: bool) -> int:
    return 3 * k + 3 + int(saturating)


def _unpack(theta: np.ndarray, k: int) -> LearnerParams:
    # a θ with one more entry than 3K + 3 carries log c (the skill cap's inverse); without it c = 0
    return LearnerParams(theta[:k].copy(), np.exp(theta[k:2 * k]), _sigmoid(theta[2 * k:3 * k]),
                         float(np.exp(theta[3 * k])), float(_sigmoid(theta[3 * k + 1])),
                         float(_sigmoid(theta[3 * k + 2])),
                         float(np.exp(theta[3 * k + 3])) if theta.shape[0] > 3 * k + 3 else 0.0)


def _prior_blocks(k: int, n: int) -> tuple:
    out = (((0, k), "mu"), ((k, 2 * k), "log_sd"), ((2 * k, 3 * k), "logit_pi"),
           ((3 * k, 3 * k + 1), "log_lr"), ((3 * k + 1, 3 * k + 2), "logit_tau"), ((3 * k + 2, 3 * k + 3), "logit_omega"))
    return out + ((((3 * k + 3, 3 * k + 4), "log_sat"),) if n > 3 * k + 3 else ())


def _log_prior(theta: np.ndarray, k: int) -> float:
    out = 0.0
    for (lo, hi), key in _prior_blocks(k, theta.shape[0]):
        m, s = PRIOR[key]
        out -= 0.5 * float(np.sum(((theta[lo:hi] - m) / s) ** 2))
    return out


def _log_binom_mix(w, g, skill, mu, sd, pi, lgc):
    """float64[R] log P(w | ·) per row: the solved atom mixed with the quantile-node normal."""
    z = _nodes()
    x = skill[:, None] - mu[:, None] - sd[:, None] * z[None, :]                # [R, Q]
    ll = lgc[:, None] - w[:, None] * np.logaddexp(0.0, -x) - (g - w)[:, None] * np.logaddexp(0.0, x)
    m = ll.max(axis=1)
    normal = m + np.log(np.exp(ll - m[:, None]).mean(axis=1))                  # [R]
    xa = skill - SOLVED_D
    atom = lgc - w * np.logaddexp(0.0, -xa) - (g - w) * np.logaddexp(0.0, xa)
    return np.logaddexp(np.log(pi) + atom, np.log1p(-pi) + normal)


def fit_learner(pilot: Pilot, pool: Pool, *, step_norm: str = "batch", maxiter: int = 400,
                saturation: str = "auto") -> LearnerFit:
    """Fit the learner to `pilot` on `pool` (MAP + Laplace; see the module docstring).

    Args:
        pilot: the record (`read_pilot`, `pilot_from_select`).
        pool: the pool the pilot ran on (its domains give K; unknown ids are refused).
        step_norm: "batch" (gain / B, the simulator's default learner; the default),
            "signal" (gain / Σ_k gain_k: an Adam-like step of fixed size), or "auto": fit both
            (same number of parameters) and keep "signal" only when its log likelihood is
            higher by more than `AUTO_MARGIN` nats. A uniform pilot barely tells them apart
            (its total signal changes little from step to step; docs/advise.md).
        saturation: "auto" (fit the learner with and without a skill cap, s = (1 − e^(−c·x))/c
            of the linear skill x, and keep the cap only when it raises the log likelihood by
            more than `SAT_MARGIN`: a likelihood-ratio test at 5 %), "on" or "off" (c = 0:
            the linear learner).

    Returns:
        A `LearnerFit`. O(K·T·G) per likelihood evaluation after one pass over the groups.
    """
    from scipy.optimize import minimize
    from scipy.special import gammaln

    pos = pilot.positions(pool)                                                  # [M]
    g = pilot.group_size
    n_of = pilot.group_sizes.astype(np.int64)                                    # [M] G, or N_i (ragged)
    valid = pilot.valid                                                          # [M, G] False on padding
    if int(n_of.max(initial=0)) < 2:
        raise InputError(f"the pilot's groups have at most {int(n_of.max(initial=0))} rollout; the fit needs "
                         f"groups of ≥ 2 rollouts.")
    succ = (pilot.rewards >= pilot.success_threshold) & valid                    # [M, G]
    wins = succ.sum(axis=1).astype(np.int64)                                     # [M]
    dom = pool.domains[pos].astype(np.int64)                                     # [M]
    k = pool.n_domains
    steps, tix = np.unique(pilot.step, return_inverse=True)                     # [T], [M]
    n_t = steps.shape[0]
    b = pilot.batch_size
    sig = group_signal(succ.astype(np.float64), valid, np.ones(succ.shape))      # [M] mean |A| over each N_i
    if step_norm not in ("auto", "batch", "signal"):
        raise InputError(f"fit_learner step_norm must be 'auto', 'batch' or 'signal'; got {step_norm!r}.")
    raw = np.zeros((n_t, k))
    np.add.at(raw, (tix, dom), sig)
    if saturation not in ("auto", "on", "off"):
        raise InputError(f"fit_learner saturation must be 'auto', 'on' or 'off'; got {saturation!r}.")
    if step_norm == "auto":
        fb, fs = (fit_learner(pilot, pool, step_norm=n, maxiter=maxiter, saturation=saturation)
                  for n in ("batch", "signal"))
        if fs.log_lik > fb.log_lik + AUTO_MARGIN:
            return fs._replace(log_lik_other=fb.log_lik)
        return fb._replace(log_lik_other=fs.log_lik)
    gain = raw / (b if step_norm == "batch" else np.maximum(raw.sum(axis=1, keepdims=True), 1e-12))
    cum = np.vstack([np.zeros((1, k)), np.cumsum(gain, axis=0)])                # [T + 1, K] before each step

    rolled = n_of > 0                                                            # N_i = 0: never generated
    seen = np.bincount(dom[rolled], minlength=k) > 0
    rate = (np.bincount(dom[rolled], weights=wins[rolled] / n_of[rolled], minlength=k)
            / np.maximum(np.bincount(dom[rolled], minlength=k), 1))
    rate[~seen] = -1.0                                                          # never sampled: hardest
    order = np.argsort(-rate, kind="stable")                                     # easiest first
    rank = np.empty(k, np.int64)
    rank[order] = np.arange(k)

    # rows: unique (domain, step index, rollouts, wins) with counts; a group of 0 rollouts has none
    gm = int(n_of.max()) + 1
    key = (((dom * n_t + tix) * gm + n_of) * gm + wins)[rolled]
    uniq, count = np.unique(key, return_counts=True)
    r_w = (uniq % gm).astype(np.float64)
    r_n = ((uniq // gm) % gm).astype(np.float64)                                # the group's own n
    r_t = (uniq // gm // gm) % n_t
    r_k = (uniq // gm // gm) // n_t
    lgc = gammaln(r_n + 1.0) - gammaln(r_w + 1.0) - gammaln(r_n - r_w + 1.0)
    count = count.astype(np.float64)

    def neg_log_post(theta):
        """(−log posterior, its gradient): the gradient in closed form (module docstring's
        mixture; responsibilities ρ of the atom and of each node)."""
        p = _unpack(theta, k)
        m_t = transfer_matrix(rank, p.tau, p.omega)
        base = cum[:-1] @ m_t.T                                                     # [T, K]
        lin = p.lr * base[r_t, r_k]                                                 # [R] linear skill x
        skill = saturated_skill(lin, p.sat)                                         # [R]
        slope = np.exp(-p.sat * lin)                                                # ∂skill/∂x (1 without a cap)
        mu, sd, pi = p.mu[r_k], p.sd[r_k], p.solved[r_k]
        z = _nodes()
        x = skill[:, None] - mu[:, None] - sd[:, None] * z[None, :]                 # [R, Q]
        llq = lgc[:, None] - r_w[:, None] * np.logaddexp(0.0, -x) - (r_n - r_w)[:, None] * np.logaddexp(0.0, x)
        xa = skill - SOLVED_D
        lla = lgc - r_w * np.logaddexp(0.0, -xa) - (r_n - r_w) * np.logaddexp(0.0, xa)
        la = np.log(pi) + lla                                                       # [R]
        lq = np.log1p(-pi)[:, None] - math.log(_Q) + llq                            # [R, Q]
        top = np.maximum(la, lq.max(axis=1))
        ea, eq = np.exp(la - top), np.exp(lq - top[:, None])
        tot = ea + eq.sum(axis=1)
        ll = top + np.log(tot)                                                      # [R]
        rho_a, rho_q = ea / tot, eq / tot[:, None]                                  # responsibilities
        sc_q = r_w[:, None] - r_n[:, None] * _sigmoid(x)                            # ∂llq/∂x  [R, Q]
        sc_a = r_w - r_n * _sigmoid(xa)
        c = count
        d_mu = -(c[:, None] * rho_q * sc_q).sum(axis=1)                             # [R]
        d_lsd = -(c[:, None] * rho_q * sc_q * z[None, :]).sum(axis=1) * sd
        d_lpi = c * (rho_a - pi)
        d_s = c * (rho_a * sc_a + (rho_q * sc_q).sum(axis=1))
        gap = rank[:, None] - rank[None, :]
        dm = np.where(gap > 0, gap * p.tau ** np.maximum(gap - 1, 0), 0.0)          # ∂M/∂τ
        dbase = (cum[:-1] @ dm.T)[r_t, r_k]
        dshared = (cum[:-1] @ (1.0 - np.eye(k)).T)[r_t, r_k]                        # ∂M/∂ω = 1 − I
        d_x = d_s * slope                                                           # ∂ll/∂x
        grad = np.concatenate([np.bincount(r_k, d_mu, k), np.bincount(r_k, d_lsd, k), np.bincount(r_k, d_lpi, k),
                               [float(d_x @ lin), float(d_x @ dbase) * p.lr * p.tau * (1 - p.tau),
                                float(d_x @ dshared) * p.lr * p.omega * (1 - p.omega)],
                               [float(d_s @ (lin * slope - skill))] if theta.shape[0] > 3 * k + 3 else []])
        for (lo, hi), key in _prior_blocks(k, theta.shape[0]):
            mp, sp = PRIOR[key]
            grad[lo:hi] -= (theta[lo:hi] - mp) / sp ** 2
        return -(float(c @ ll) + _log_prior(theta, k)), -grad

    # start: μ from each domain's pass rate (logit), others at their prior means
    mean_rate = np.clip(np.where(seen, rate, 0.3), 0.02, 0.98)
    theta0 = np.concatenate([-np.log(mean_rate / (1 - mean_rate)), np.zeros(k), np.full(k, -1.5),
                             [math.log(0.1), -1.0, PRIOR["logit_omega"][0]]])
    res = minimize(neg_log_post, theta0, jac=True, method="L-BFGS-B", options={"maxiter": maxiter})
    ll = -float(res.fun) - _log_prior(res.x, k)
    sat_gain = math.nan
    if saturation != "off" and n_t >= 2:
        # the skill cap: one more parameter, started at the linear fit and the prior's c
        res_c = minimize(neg_log_post, np.append(res.x, PRIOR["log_sat"][0]), jac=True, method="L-BFGS-B",
                         options={"maxiter": maxiter})
        ll_c = -float(res_c.fun) - _log_prior(res_c.x, k)
        sat_gain = ll_c - ll
        if saturation == "on" or sat_gain > SAT_MARGIN:
            res, ll = res_c, ll_c
    theta = res.x
    cov = _laplace_cov(lambda th: neg_log_post(th)[1], theta)
    p = _unpack(theta, k)
    return LearnerFit(tuple(pool.domain_names), p, theta, cov, rank, ll,
                      int(pos.shape[0]), int(n_t), int(g), int(b), seen, bool(n_t >= 2), step_norm, math.nan,
                      {"pos": pos, "wins": wins, "n": n_of, "tix": tix, "dom": dom, "cum": cum}, sat_gain)


def _laplace_cov(grad, theta: np.ndarray, h: float = 1e-4) -> np.ndarray:
    """H⁻¹ with H from central differences of the closed-form gradient at θ̂ (symmetrised;
    eigenvalues floored so that a flat direction gets a wide, not an infinite, variance)."""
    n = theta.shape[0]
    e = np.eye(n) * h
    hess = np.stack([(grad(theta + e[i]) - grad(theta - e[i])) / (2 * h) for i in range(n)])
    vals, vecs = np.linalg.eigh(0.5 * (hess + hess.T))
    vals = np.maximum(vals, 1.0 / 16.0)                 # variance ≤ 16 on the unconstrained scale
    return (vecs / vals) @ vecs.T


def draw_params(fit: LearnerFit, n: int, rng: np.random.Generator) -> list[LearnerParams]:
    """n learners from the Laplace posterior (the first is the MAP when n ≥ 1)."""
    k = len(fit.domains)
    out = [fit.params] if n else []
    if n > 1:
        th = rng.multivariate_normal(fit.theta, fit.cov, size=n - 1, method="eigh")
        out += [_unpack(t, k) for t in th]
        h = fit.heldout
        if h is not None and h.kept.any():
            # its uncertainty: each draw but the MAP its own h_k ~ N(ĥ_k, se_k²) (clipped to [0, 1]) where
            # kept, its own π_k elsewhere; drawn after θ, so the θ draws are those of a fit without it
            eps = rng.standard_normal((n - 1, k))
            out[1:] = [q._replace(heldout_solved=np.where(h.kept, np.clip(h.share + h.se * e, 0.0, 1.0), q.solved))
                       for q, e in zip(out[1:], eps)]
    return out


def prompt_difficulties(fit: LearnerFit, p: LearnerParams, n_pool: int, domain: np.ndarray,
                        rng: np.random.Generator) -> np.ndarray:
    """float64[N] one draw of every prompt's difficulty under learner `p`: a prompt the pilot
    rolled out from its posterior given its rewards (on the quantile-node grid, uniform within
    a node's probability bin), any other from its domain's prior."""
    from scipy.special import ndtri
    k = len(fit.domains)
    z = _nodes()
    # prior draws for everyone
    solved = rng.random(n_pool) < p.solved[domain]
    d = p.mu[domain] + p.sd[domain] * ndtri(rng.random(n_pool).clip(1e-12, 1 - 1e-12))
    d[solved] = SOLVED_D + 0.5 * rng.standard_normal(int(solved.sum()))
    data = fit.data
    if data["pos"].size:
        skill = saturated_skill(p.lr * data["cum"][:-1] @ transfer_matrix(fit.rank, p.tau, p.omega).T,
                                p.sat)[data["tix"], data["dom"]]                             # [M]
        w, g = data["wins"].astype(np.float64), data["n"].astype(np.float64)[:, None]   # [M], [M, 1]
        x = skill[:, None] - np.concatenate([np.full((skill.size, 1), SOLVED_D),
                                             p.mu[data["dom"]][:, None] + p.sd[data["dom"]][:, None] * z[None, :]],
                                            axis=1)                                         # [M, Q + 1]
        ll = -w[:, None] * np.logaddexp(0.0, -x) - (g - w[:, None]) * np.logaddexp(0.0, x)
        uniq, inv = np.unique(data["pos"], return_inverse=True)
        tot = np.zeros((uniq.size, _Q + 1))
        np.add.at(tot, inv, ll)
        dk = domain[uniq]
        prior = np.concatenate([np.log(p.solved[dk])[:, None],
                                (np.log1p(-p.solved[dk]) - math.log(_Q))[:, None] + np.zeros((1, _Q))], axis=1)
        lp = tot + prior
        lp -= lp.max(axis=1, keepdims=True)
        post = np.exp(lp)
        post /= post.sum(axis=1, keepdims=True)
        c = (post.cumsum(axis=1) < rng.random(uniq.size)[:, None]).sum(axis=1).clip(0, _Q)   # component
        u = (c - 1 + rng.random(uniq.size)) / _Q                                               # inside the node's bin
        dz = p.mu[dk] + p.sd[dk] * ndtri(u.clip(1e-12, 1 - 1e-12))
        d[uniq] = np.where(c == 0, SOLVED_D + 0.5 * rng.standard_normal(uniq.size), dz)
    return d


class Discrepancy(NamedTuple):
    """The model's own error, read from the pilot by held-out prediction (`rate_discrepancy`)."""

    sd_log_rate: float        # sd of a per-domain log multiplier on the learning rate (0: none found)
    log_rate: np.ndarray      # float64[K] per-domain log multiplier that fits the late half best (NaN: unused)
    se: np.ndarray            # float64[K] its standard error (NaN: unused)
    split_step: int           # first pilot step of the late half (-1: not estimated)
    reason: str               # why it is 0 when it is

    def to_json(self) -> dict:
        return {"sd_log_rate": self.sd_log_rate, "split_step": self.split_step, "reason": self.reason,
                "log_rate_per_domain": [None if not math.isfinite(x) else float(x) for x in self.log_rate],
                "se_per_domain": [None if not math.isfinite(x) else float(x) for x in self.se]}


#: cap on the discrepancy's sd: a factor e ≈ 2.7 on a domain's learning rate at one sd. A
#: constant chosen before any validation (a pilot that short cannot tell wilder errors apart)
MAX_RATE_SD = 1.0
#: a domain enters the discrepancy only where the early fit predicts this much skill growth
#: (logits) by the late half: a rate multiplier is unidentified where nothing is learned
MIN_GROWTH = 0.05


def rate_discrepancy(pilot: Pilot, pool: Pool, fit: LearnerFit, *, split: float = 0.5) -> Discrepancy:
    """How wrong the fitted family is on this pilot, as a spread of per-domain learning rates.

    Held-out prediction inside the pilot: the learner is fitted to the steps before the
    split (the first half), then the late half is predicted from the early fit and the late
    steps' observed signal. For each domain k one multiplier c_k on its skill growth,
    s_k(t) = c_k · ŝ_k(t), is fitted to the late half alone (grid MLE over log c ∈ [−3, 3],
    standard error from the curvature). log c_k = 0 everywhere is a family that predicts its
    own future; the spread of log c_k beyond its sampling error is the model's error:

        sd² = max(0, mean_k (log ĉ_k)² − mean_k se_k²)        (method of moments)

    over the domains the early fit expects to move (mean ŝ_k over the late groups ≥
    `MIN_GROWTH`), capped at `MAX_RATE_SD`. `predict(rate_sd=sd)` then gives every draw but
    the MAP its own per-domain multipliers exp(sd·ε_k), ε_k ~ N(0, 1): abrupt unlocking,
    memorised gains and domain-specific rates, which one lr and one transfer cannot express,
    widen the intervals by as much as they mispredicted the pilot's own second half. No
    constant here comes from a validation suite.
    """
    k = len(fit.domains)
    nan = np.full(k, np.nan)
    steps = pilot.steps
    n = steps.shape[0]
    if not fit.identifiable_dynamics or n < 6:
        return Discrepancy(0.0, nan, nan, -1, "the pilot has fewer than 6 training steps: not estimated")
    n_early = int(round(n * split))
    cut = int(steps[n_early])
    early = pilot.step < cut
    sub = pilot._replace(prompt_ids=pilot.prompt_ids[early], step=pilot.step[early], rewards=pilot.rewards[early],
                         evals=[e for e in pilot.evals if e[0] < cut],
                         sizes=None if pilot.sizes is None else pilot.sizes[early])
    fa = fit_learner(sub, pool, step_norm=fit.step_norm, saturation="on" if fit.params.sat > 0 else "off")
    pa = fa.params
    d = fit.data
    skill = saturated_skill(pa.lr * d["cum"][:-1] @ transfer_matrix(fa.rank, pa.tau, pa.omega).T,
                            pa.sat)[d["tix"], d["dom"]]                                        # [M] early fit
    late = d["tix"] >= n_early
    from scipy.special import gammaln
    logc = np.linspace(-3.0, 3.0, 121)
    est, se = nan.copy(), nan.copy()
    for j in range(k):
        rows = late & (d["dom"] == j) & (d["n"] > 0)
        if not rows.any() or skill[rows].mean() < MIN_GROWTH:
            continue
        w, g = d["wins"][rows].astype(np.float64), d["n"][rows].astype(np.float64)
        lgc = gammaln(g + 1.0) - gammaln(w + 1.0) - gammaln(g - w + 1.0)
        ll = np.array([_log_binom_mix(w, g, np.exp(c) * skill[rows], np.full(w.size, pa.mu[j]),
                                      np.full(w.size, pa.sd[j]), np.full(w.size, pa.solved[j]), lgc).sum()
                       for c in logc])                                                      # [121]
        i = int(np.clip(np.argmax(ll), 1, logc.size - 2))
        h = logc[1] - logc[0]
        curv = (ll[i + 1] - 2 * ll[i] + ll[i - 1]) / h ** 2
        est[j] = logc[int(np.argmax(ll))]
        se[j] = 1.0 / math.sqrt(-curv) if curv < 0 else 3.0
    used = np.isfinite(est)
    if not used.any():
        return Discrepancy(0.0, est, se, cut, "no domain's skill moves enough in the pilot to read its rate")
    var = float(np.mean(est[used] ** 2) - np.mean(np.minimum(se[used], 3.0) ** 2))
    sd = min(math.sqrt(max(var, 0.0)), MAX_RATE_SD)
    return Discrepancy(sd, est, se, cut, "" if sd > 0 else "the late half is predicted within its noise")


#: held-out prompts per domain in the predicted worlds (equal-probability quantiles)
HELDOUT = 256
EVAL_MODES = ("sampled", "greedy")


def heldout_difficulties(p: LearnerParams, n: int = HELDOUT) -> np.ndarray:
    """float64[K, n] a domain's held-out set: its solved share at `SOLVED_D`, the rest at the
    equal-probability quantiles of N(μ_k, σ_k²)."""
    from scipy.special import ndtri
    q = ndtri((np.arange(n) + 0.5) / n)
    held = p.mu[:, None] + p.sd[:, None] * q[None, :]
    solved = p.solved if p.heldout_solved is None else np.asarray(p.heldout_solved, np.float64)
    for j, m in enumerate(np.rint(solved * n).astype(int)):
        held[j, :m] = SOLVED_D
    return held


def eval_accuracy(skill: np.ndarray, held: np.ndarray, mode: str) -> np.ndarray:
    """float64[..., K] held-out accuracy per domain at skill float64[..., K]: "sampled" = the
    mean pass rate σ(s − d) (what a sampled evaluation measures, the simulator's), "greedy" =
    the share of prompts whose most likely answer is right, σ(s − d) > ½ ⇔ s > d (what a
    greedy evaluation measures: the built-in trainer's)."""
    return _hits(skill[..., :, None] - held, mode).mean(axis=-1)                  # [..., K, H] → [..., K]


def _hits(x, mode: str):
    """Each held-out prompt's expected score at skill − difficulty `x` (float64[...] or a
    float): "greedy" 1.0 where x > 0 else 0.0 (the most likely answer is right), "sampled"
    the pass rate σ(x). `eval_accuracy` and `fit_heldout_solved` score prompts with it."""
    return (np.asarray(x) > 0).astype(np.float64) if mode == "greedy" else _sigmoid(x)


def greedy_from_sampled(acc: np.ndarray, held: np.ndarray) -> np.ndarray:
    """float64[E, K] greedy accuracy from the sampled accuracy float64[E, K] on held-out set
    `held` [K, H]: the sampled accuracy is strictly increasing in the skill, so the skill is
    read back from it (interpolation on a 0.005-logit grid) and thresholded."""
    grid = np.linspace(-25.0, 25.0, 10001)                                          # [S]
    out = np.empty_like(acc)
    for j in range(held.shape[0]):
        table = _sigmoid(grid[:, None] - held[j][None, :]).mean(axis=1)              # [S] increasing
        s = np.interp(acc[:, j], table, grid)                                        # [E]
        out[:, j] = (s[:, None] > held[j][None, :]).mean(axis=1)
    return out


def predicted_evals(pilot: Pilot, fit: LearnerFit) -> dict:
    """The pilot's held-out evaluations against the fit's prediction of them under each
    evaluation mode, and the mode that predicts them better (least squares; "sampled" when
    the pilot has fewer than two evaluations): the fitted family's own choice of what the
    user's held-out number measures, read from the pilot."""
    ev = [(t, a) for t, _, a in pilot.evals if a is not None and math.isfinite(a)]
    if len(ev) < 2:
        return {"choice": "sampled", "evals": len(ev), "reason": "fewer than 2 held-out evaluations in the pilot"}
    steps = pilot.steps
    path = fit.skill_path()                                                          # [T + 1, K]
    ix = np.searchsorted(steps, [t for t, _ in ev])                                  # eval before step t
    held = heldout_difficulties(fit.params)
    meas = np.array([a for _, a in ev])
    pred = {m: eval_accuracy(path[ix], held, m).mean(axis=1) for m in EVAL_MODES}
    sse = {m: float(np.sum((pred[m] - meas) ** 2)) for m in EVAL_MODES}
    return {"choice": min(EVAL_MODES, key=lambda m: sse[m]), "evals": len(ev), "measured": meas.tolist(),
            **{f"predicted_{m}": pred[m].tolist() for m in EVAL_MODES}, **{f"sse_{m}": sse[m] for m in EVAL_MODES}}


class HeldoutSolved(NamedTuple):
    """The share of held-out prompts the base already solves, per domain (`fit_heldout_solved`)."""

    share: np.ndarray     # float64[K] ĥ_k (π_k, the training prompts' share, where not kept)
    se: np.ndarray        # float64[K] its standard error (half the 1-sd profile interval; 0 where not kept)
    gain: np.ndarray      # float64[K] log lik at ĥ_k − at h_k = π_k (NaN: the domain has no evaluation)
    kept: np.ndarray      # bool[K] gain > `SAT_MARGIN`
    evals: int            # per-domain evaluations read
    mode: str             # the evaluation mode the accuracies were predicted in
    reason: str           # why nothing is kept, when nothing is

    def to_json(self) -> dict:
        return {"share": self.share.tolist(), "se": self.se.tolist(), "kept": self.kept.tolist(),
                "log_lik_gain": [None if not math.isfinite(x) else float(x) for x in self.gain],
                "evals": self.evals, "mode": self.mode, "reason": self.reason}


#: the grid of held-out solved shares h the profile likelihood is read on (step 0.005)
SOLVED_GRID = np.linspace(0.0, 1.0, 201)


def fit_heldout_solved(pilot: Pilot, fit: LearnerFit, mode: str) -> LearnerFit:
    """The held-out solved share h_k, fitted by maximum likelihood to the pilot's per-domain
    held-out evaluations: `fit` with `params.heldout_solved` and `heldout` set.

    The family draws a domain's held-out set from its training prompts' fit: a share π_k at
    `SOLVED_D` (solved by the base), the rest N(μ_k, σ_k²). A base that has memorised its
    training prompts solves far more of them than of the held-out ones (the trainer's
    `small_domains`: `max2` training pass rate 1.00, held-out greedy 0.11), so π_k overstates
    the held-out accuracy and the share of it that training cannot move. h_k replaces π_k in
    the held-out set only (the training prompts and the dynamics keep π_k). At each
    evaluation (step t, n_k held-out prompts, accuracy a_k) the count round(a_k·n_k) is
    binomial with the predicted accuracy at the fitted skill path, s_k(t) against the held-out
    set of share h (`eval_accuracy` in `mode`, clipped to [½/H, 1 − ½/H], the held-out grid's
    resolution); the evaluations re-use one held-out set, so the E_k evaluations of a domain
    enter with weight 1/E_k (each prompt counted once); the log likelihood is read on
    `SOLVED_GRID`. h_k is kept where it raises the
    log likelihood over h_k = π_k by more than `SAT_MARGIN` (a likelihood-ratio test of one
    parameter at 5 %); elsewhere h_k = π_k, the family as before. Its standard error is half
    the width of {h: ℓ(h) ≥ ℓ(ĥ) − ½} (at least the grid step); `draw_params` gives every draw
    but the MAP its own h_k ~ N(ĥ_k, se_k²), clipped to [0, 1].

    Needs evaluations with per-domain accuracies and held-out sizes (the record's eval "acc"
    and "n"); without them the fit is returned with nothing kept (a reason says why).
    """
    k = len(fit.domains)
    pi = fit.params.solved
    ev = [e for e in pilot.domain_evals if e[2] is not None]

    def unchanged(reason, n_ev=0, gain=None):
        h = HeldoutSolved(pi.copy(), np.zeros(k), np.full(k, np.nan) if gain is None else gain, np.zeros(k, bool),
                          n_ev, mode, reason)
        return fit._replace(heldout=h, params=fit.params._replace(heldout_solved=None))
    if mode not in EVAL_MODES:
        raise InputError(f"fit_heldout_solved mode must be one of {EVAL_MODES}; got {mode!r}.")
    if not ev:
        return unchanged("no per-domain held-out evaluations with their held-out sizes in the pilot")
    steps = pilot.steps
    path = fit.skill_path()                                                     # [T + 1, K]
    base = fit.params._replace(heldout_solved=None)
    hn = HELDOUT
    lo = 0.5 / hn
    grid = np.append(SOLVED_GRID, pi)                                          # [S + K]: π_k's own value last
    ll = np.zeros((k, grid.size))
    seen = np.zeros(k, np.int64)
    normal = heldout_difficulties(base._replace(heldout_solved=np.zeros(k)), hn)  # [K, H] no solved atom
    for t, acc, n in ev:
        s = path[int(np.searchsorted(steps, t))]                               # skill before step t
        for j, name in enumerate(fit.domains):
            if name not in acc or name not in n or n[name] <= 0:
                continue
            m = int(n[name])
            w = float(np.clip(round(acc[name] * m), 0, m))
            held = normal[j]                                                  # [H] the quantiles, no atom
            # a held-out set of share h: its first round(h·H) prompts solved, the rest at the normal's quantiles
            x = s[j] - held                                                   # [H]
            hit = _hits(x, mode)
            hit_solved = float(_hits(s[j] - SOLVED_D, mode))
            n_at = np.rint(grid * hn).astype(np.int64)                          # [S + K] atoms
            csum = np.concatenate([[0.0], np.cumsum(hit)])                       # prefix sums over the quantiles
            p = (n_at * hit_solved + (csum[-1] - csum[n_at])) / hn              # [S + K]
            p = np.clip(p, lo, 1.0 - lo)
            ll[j] += w * np.log(p) + (m - w) * np.log1p(-p)
            seen[j] += 1
    # the evaluations re-use one held-out set: each prompt counted once (a composite likelihood
    # weighted 1/E_k over the E_k evaluations of domain k), not E_k times as independent draws
    ll /= np.maximum(seen, 1)[:, None]
    seen = seen > 0
    ns = SOLVED_GRID.size
    ll0 = ll[np.arange(k), ns + np.arange(k)]                                   # at h_k = π_k
    prof = ll[:, :ns]
    best = prof.argmax(axis=1)
    gain = np.where(seen, prof.max(axis=1) - ll0, np.nan)
    kept = seen & (gain > SAT_MARGIN)
    if not kept.any():
        return unchanged("the held-out evaluations are predicted within their noise with the training prompts' "
                         "solved share", len(ev), gain)
    share = np.where(kept, SOLVED_GRID[best], pi)
    inside = prof >= prof.max(axis=1, keepdims=True) - 0.5                      # [K, S] the 1-sd profile interval
    width = np.array([SOLVED_GRID[r].max() - SOLVED_GRID[r].min() for r in inside])
    se = np.where(kept, np.maximum(width / 2, SOLVED_GRID[1] - SOLVED_GRID[0]), 0.0)
    h = HeldoutSolved(share, se, gain, kept, len(ev), mode, "")
    return fit._replace(heldout=h, params=fit.params._replace(heldout_solved=share))
