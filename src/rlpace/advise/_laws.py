"""Two step laws a pilot may not tell apart: their weight, read by simulation, and one interval over both.

The fitted learner has two step laws (`fit_learner(step_norm=...)`): "batch" (a step grows
with the signal its groups carry) and "signal" (an Adam-like step of fixed size). A uniform
pilot barely separates them: their log likelihoods differ by about one nat, which a
likelihood ratio read as an exact Bayes factor turns into weights of 0.25–0.75 that a
different seed of the same pilot would flip. Two rules make the prediction honest about it:

1. **The weight is calibrated by simulation** (`law_weight`). The statistic is the observed
   difference Δ = ℓ_a − ℓ_b of the two fits' log likelihoods. Its sampling distribution under
   each law is read from pilots simulated from that law's MAP learner (same pool, batch,
   group size and steps, uniform), each fitted with both laws. With Δ ~ N(m_law, s²) under
   each law (its own mean m_law, the pooled sd s) and equal prior odds,

       P(a | Δ) = 1 / (1 + exp(−[(Δ − m_b)² − (Δ − m_a)²] / (2 s²)))

   When the two laws give Δ the same distribution (the pilot cannot resolve them) the weight
   stays at ½ whatever Δ was; when their distributions are far apart relative to s, it goes
   to 0 or 1 as fast as the data warrant.

2. **The interval covers both laws when both keep weight** (`mixture_summary`). A law whose
   weight is below one tail of the 90 % interval (`TAIL` = 5 %) cannot be required inside
   it: its draws are left out. Otherwise the laws are *not separable* and the draws are
   stratified (half each, so each law has enough draws for its own quantiles); the point
   prediction is the weighted median (each draw weighted by its law's weight over its law's
   draws) and the interval is the hull of the two laws' own 5–95 % intervals — the weights
   are themselves uncertain, so the interval holds whichever law is true.

No constant here comes from a validation suite: `TAIL` is the interval's own tail, the half
split is the even split, and the replicate count only sets the simulation's precision.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..errors import InputError

__all__ = ["TAIL", "LawWeight", "calibrated_weight", "law_weight", "simulate_pilot", "mixture_summary", "draw_law_weights",
           "stratified_draws", "draw_interval", "seed_terms", "pooled_seed_var"]

#: one tail of the 90 % interval: a law with less weight than this cannot move its ends
TAIL = 0.05


class LawWeight(NamedTuple):
    """The weight of step law `a` against `b`, calibrated by simulated pilots."""

    weight_a: float            # P(a | Δ) calibrated (`calibrated_weight`)
    raw_weight_a: float        # 1 / (1 + e^(−Δ)): Δ read as an exact log Bayes factor
    delta: float               # observed ℓ_a − ℓ_b
    delta_under_a: np.ndarray  # float64[R] Δ on pilots simulated from a's MAP
    delta_under_b: np.ndarray  # float64[R] Δ on pilots simulated from b's MAP

    def to_json(self) -> dict:
        return {"weight": self.weight_a, "raw_weight": self.raw_weight_a, "delta_log_lik": self.delta,
                "delta_simulated_under_a": self.delta_under_a.tolist(),
                "delta_simulated_under_b": self.delta_under_b.tolist()}


def calibrated_weight(delta: float, under_a: np.ndarray, under_b: np.ndarray) -> float:
    """P(a | Δ) with equal prior odds, Δ ~ N(mean of `under_a`, s²) under a and N(mean of
    `under_b`, s²) under b, s² the pooled variance (ddof 1 within each; floored at 1e-6).

    >>> round(calibrated_weight(1.0, np.array([0.0, 2.0]), np.array([-2.0, 0.0])), 4)   # m ±1, s² 2
    0.7311
    >>> calibrated_weight(3.0, np.array([-1.0, 1.0]), np.array([-1.0, 1.0]))          # same law of Δ
    0.5
    """
    a, b = np.asarray(under_a, np.float64), np.asarray(under_b, np.float64)
    if a.size < 2 or b.size < 2 or not (np.isfinite(a).all() and np.isfinite(b).all() and math.isfinite(delta)):
        raise InputError("calibrated_weight needs ≥ 2 finite simulated differences under each law and a finite Δ.")
    s2 = max((float(np.sum((a - a.mean()) ** 2)) + float(np.sum((b - b.mean()) ** 2))) / (a.size + b.size - 2), 1e-6)
    log_lr = ((delta - b.mean()) ** 2 - (delta - a.mean()) ** 2) / (2.0 * s2)
    return float(1.0 / (1.0 + math.exp(-min(max(log_lr, -700.0), 700.0))))


def simulate_pilot(fit, pool, seed: int):
    """A uniform pilot like the fitted one (its steps, batch and group size) simulated on a
    world drawn from `fit`'s MAP learner with its own step law: a `Pilot` of positions."""
    import warnings

    from ..sim import Scenario, World, simulate
    from ._fit import heldout_difficulties, prompt_difficulties, transfer_matrix
    from ._record import Pilot
    p = fit.params
    dom = pool.domains.astype(np.int64)                  # the world `predict` builds, at the pilot's start
    world = World(pool, prompt_difficulties(fit, p, len(pool), dom, np.random.default_rng([seed, 0x1A3])), dom,
                  np.arange(pool.n_domains, dtype=np.int64), heldout_difficulties(p), transfer_matrix(fit.rank, p.tau, p.omega))
    ids, steps, rewards, spent = [], [], [], {}

    class _Keep:
        def write(self, fb, *, rollouts=None, eval=None):
            ids.append(np.asarray(fb.prompt_ids, np.int64))
            steps.append(np.full(len(fb.prompt_ids), int(fb.step), np.int64))
            rewards.append(np.asarray(fb.rewards, np.float64))
            spent[int(fb.step)] = spent.get(int(fb.step), 0) + int(rollouts if rollouts is not None else fb.rewards.size)

    sc = Scenario(name="fitted", description="a learner fitted to a pilot", domains=pool.domain_names,
                  base_accuracy=(0.5,) * pool.n_domains, lr=p.lr, forgetting=0.0, target=0.999)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        simulate(sc, "uniform", steps=fit.n_steps, seed=seed, batch_size=fit.batch_size, group_size=fit.group_size,
                 eval_every=max(fit.n_steps, 1), world=world, record=_Keep(), step_norm=fit.step_norm,
                 saturation=p.sat)
    return Pilot(np.concatenate(ids), np.concatenate(steps), np.concatenate(rewards), spent, [], (0.0, 1.0), 0.5,
                 "positions", "training")


def _replicate_delta(job) -> float:
    """Δ = ℓ_a − ℓ_b on one pilot simulated from `src` (one replicate of `law_weight`)."""
    from ._fit import fit_learner
    src, pool, seed, (norm_a, sat_a), (norm_b, sat_b) = job
    sim = simulate_pilot(src, pool, seed=seed)
    return (fit_learner(sim, pool, step_norm=norm_a, saturation=sat_a).log_lik
            - fit_learner(sim, pool, step_norm=norm_b, saturation=sat_b).log_lik)


def law_weight(fit_a, fit_b, pool, *, replicates: int = 8, seed: int = 0, jobs: int = 1) -> LawWeight:
    """Calibrated weight of law `fit_a.step_norm` against `fit_b.step_norm` (both fitted to
    the same pilot): `replicates` pilots simulated from each law's MAP, each fitted with both
    laws, give Δ's distribution under each (module docstring, rule 1). Cost: 4·replicates
    fits of the pilot's size, over `jobs` worker processes (each replicate has its own seed,
    so the result does not depend on `jobs`)."""
    if replicates < 2:
        raise InputError(f"law_weight replicates must be ≥ 2 (a spread needs two); got {replicates!r}.")
    delta = float(fit_a.log_lik - fit_b.log_lik)
    # each law refitted in the family its own fit ended in (with the skill cap or without: `fit_learner`)
    law_a, law_b = ((f.step_norm, "on" if f.params.sat > 0 else "off") for f in (fit_a, fit_b))
    work = [(src, pool, int(seed) * 1000 + 97 * j + r, law_a, law_b)
            for j, src in enumerate((fit_a, fit_b)) for r in range(replicates)]
    if jobs > 1:
        from concurrent.futures import ProcessPoolExecutor
        with ProcessPoolExecutor(max_workers=min(int(jobs), len(work))) as ex:
            d = np.array(list(ex.map(_replicate_delta, work)))
    else:
        d = np.array([_replicate_delta(job) for job in work])
    under = [d[:replicates], d[replicates:]]
    w = calibrated_weight(delta, under[0], under[1])
    raw = 1.0 / (1.0 + math.exp(-min(max(delta, -700.0), 700.0)))
    return LawWeight(w, raw, delta, under[0], under[1])


def stratified_draws(draws: int, weight_alt: float) -> int:
    """Draws given to the alternative law: none when its weight is below `TAIL` (it cannot
    move the interval's ends), else half (rule 2: each law enough draws for its quantiles).

    >>> stratified_draws(8, 0.04), stratified_draws(8, 0.3), stratified_draws(5, 0.5)
    (0, 4, 2)
    """
    return 0 if weight_alt < TAIL or draws < 2 else int(draws) // 2


def _weighted_quantile(x: np.ndarray, w: np.ndarray, q: float) -> float:
    """The q-quantile of the discrete distribution with atoms x and weights w, each atom at
    its weight's midpoint (for equal weights: numpy's "hazen" quantile)."""
    o = np.argsort(x, kind="stable")
    xs, ws = x[o], w[o] / w.sum()
    mid = np.cumsum(ws) - 0.5 * ws
    return float(np.interp(q, mid, xs))


def draw_interval(ratios: np.ndarray, level: float = 0.9, *, seed_var: float = 0.0, seeds: int = 1,
                  measurement_seeds: int | None = None) -> tuple[float, float]:
    """The `level` prediction interval for one more draw, from n draws `ratios` float64[n]:
    on the log scale, mean ± t_{(1+level)/2, n−1} · sd · √(1 + 1/n) (a normal prediction
    interval: the spread of a new draw plus the uncertainty of the mean, Student's t for the
    sd estimated from n draws). The empirical 5th–95th percentiles of 4–8 draws cover a new
    draw far less often than 90 % (the range of n draws holds the next one with probability
    (n − 1)/(n + 1): 60 % for n = 4). One draw: that draw, both ends.

    A draw's ratio is itself a measurement: the ratio of mean costs over its S = `seeds`
    seeded runs, log r = log ρ(θ) + ē + O(1/S), where ρ(θ) is the drawn learner's expected
    ratio and ē the mean over the seeds of the paired seed term e = c_p/μ_p − c_u/μ_u (delta
    method), Var ē = v/S. So the draws' variance is s² ≈ τ² + v/S (τ² the learners' spread).
    With `measurement_seeds` M ≠ S and `seed_var` v̂ (the pooled within-draw estimate of v)
    the interval is the one for what an M-seed paired measurement would read:
    mean ± t · √(τ̂² + v̂/M + s²/n), τ̂² = max(s² − v̂/S, 0) (one-way random effects, method of
    moments). M = S (or v̂ = 0) gives the plain interval above.

    >>> [round(v, 4) for v in draw_interval(np.exp(np.array([-1.0, 0.0, 1.0])))]   # m 0, sd 1, t(2) 2.92
    [0.0343, 29.1283]
    >>> [round(v, 4) for v in draw_interval(np.exp(np.array([-1.0, 0.0, 1.0])), seed_var=1.6, seeds=2,
    ...                                      measurement_seeds=8)]     # τ̂² 0.2, v̂/M 0.2, s²/n 1/3
    [0.082, 12.1889]
    """
    from scipy.stats import t
    x = np.log(np.maximum(np.asarray(ratios, np.float64), 1e-12))
    n = x.size
    if n < 2:
        return float(np.exp(x[0])), float(np.exp(x[0]))
    s2 = float(x.var(ddof=1))
    var = s2 * (1.0 + 1.0 / n)
    if measurement_seeds is not None and int(measurement_seeds) != int(seeds) and seed_var > 0:
        var = max(s2 - seed_var / int(seeds), 0.0) + seed_var / int(measurement_seeds) + s2 / n
    h = float(t.ppf(0.5 + level / 2, n - 1)) * math.sqrt(var)
    return float(np.exp(x.mean() - h)), float(np.exp(x.mean() + h))


def draw_law_weights(law: np.ndarray, weight_alt: float) -> np.ndarray:
    """float64[D] each draw's weight, summing to 1, for draws of which `law` bool[D] marks the
    alternative step law's: `weight_alt` shared by those, 1 − `weight_alt` by the others; alike
    when the draws are of one law only. `mixture_summary` and the advice (`choose_policy`)
    weigh the draws with it.

    >>> draw_law_weights(np.arange(4) >= 2, 0.2).tolist()
    [0.4, 0.4, 0.1, 0.1]
    """
    alt = np.asarray(law, bool)
    if not alt.any() or alt.all():
        return np.full(alt.size, 1.0 / alt.size)
    return np.where(alt, weight_alt / alt.sum(), (1.0 - weight_alt) / (~alt).sum())


def mixture_summary(ratios: np.ndarray, law: np.ndarray, weight_alt: float, *, seed_terms: np.ndarray | None = None,
                    measurement_seeds: int | None = None) -> tuple[float, float, float, float]:
    """(point, low, high, P(ratio < 0.9)) over draws `ratios` float64[D] of which `law`
    bool[D] marks the alternative law's. With draws of one law only: numpy's median, the
    90 % `draw_interval`, the share below 0.9. With both: each draw weighted by its law's
    weight over its law's draws; the weighted median; the interval the hull of each law's own
    90 % `draw_interval`; the weighted share below 0.9.

    `seed_terms` float64[D, S]: each draw's paired seed terms e (`seed_terms`); with
    `measurement_seeds` M each law's interval is the one for an M-seed measurement, its v̂
    pooled over that law's draws (`draw_interval`). The point and P(ratio < 0.9) stay per draw.

    >>> r = np.array([1.0, 0.9, 1.1, 0.8, 0.5, 0.6, 0.7, 0.4]); alt = np.arange(8) >= 4
    >>> [round(v, 4) for v in mixture_summary(r, alt, 0.25)]
    [0.8833, 0.2855, 1.3531, 0.4375]
    """
    r = np.asarray(ratios, np.float64)
    alt = np.asarray(law, bool)

    def interval(mask):
        if seed_terms is None or measurement_seeds is None:
            return draw_interval(r[mask])
        e = np.asarray(seed_terms, np.float64)[mask]
        return draw_interval(r[mask], seed_var=pooled_seed_var(e), seeds=e.shape[1], measurement_seeds=measurement_seeds)
    if not alt.any() or alt.all():
        lo, hi = interval(np.ones(r.size, bool))
        return float(np.median(r)), lo, hi, float(np.mean(r < 0.9))
    w = draw_law_weights(alt, weight_alt)
    (la, ha), (lm, hm) = interval(alt), interval(~alt)
    return _weighted_quantile(r, w, 0.5), min(la, lm), max(ha, hm), float(w[r < 0.9].sum() / w.sum())


def seed_terms(cost: np.ndarray, uniform_cost: np.ndarray) -> np.ndarray:
    """float64[D, S] paired seed terms e_js = c_js/c̄_j − u_js/ū_j of a policy's costs `cost`
    and uniform's `uniform_cost` (float64[D, S], draw × seed; c̄_j, ū_j the draw's means):
    log(c̄_j/ū_j) − log ρ_j ≈ mean_s e_js to first order (`draw_interval`).

    >>> seed_terms(np.array([[1.0, 3.0]]), np.array([[2.0, 2.0]])).tolist()
    [[-0.5, 0.5]]
    """
    c, u = np.asarray(cost, np.float64), np.asarray(uniform_cost, np.float64)
    return c / np.maximum(c.mean(axis=1, keepdims=True), 1e-12) - u / np.maximum(u.mean(axis=1, keepdims=True), 1e-12)


def pooled_seed_var(terms: np.ndarray) -> float:
    """v̂ = Σ_j Σ_s e_js² / (D·(S − 1)): the within-draw variance of one seed's term, pooled
    over the D draws (each draw's terms sum to zero: S − 1 degrees of freedom each); 0 when
    S < 2 (nothing to separate).

    >>> pooled_seed_var(np.array([[-0.5, 0.5], [0.1, -0.1]]))
    0.26
    """
    e = np.asarray(terms, np.float64)
    if e.ndim != 2 or e.shape[1] < 2 or e.shape[0] < 1:
        return 0.0
    return float(np.sum(e ** 2) / (e.shape[0] * (e.shape[1] - 1)))
