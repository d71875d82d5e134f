"""epiplexity: a domain mixture driven by power-law fits to each domain's held-out loss curve.

Foundation: Finzi, Qiu, Jiang, Izmailov, Kolter, Wilson, "From Entropy to Epiplexity:
Rethinking Information for Computationally Bounded Intelligence", arXiv 2601.03220 — the
prequential estimate of epiplexity (structural information a bounded learner can extract) is
the area under the training-loss curve above the final loss. The online, per-domain mixing
rule below is rlpace's **reconstruction**: no public code implements it
(docs/methods/epiplexity.md).

Signal: `Scheduler.observe_losses({domain: (tokens_seen, loss)})` — the teacher-forced NLL
of reference answers on a small fixed probe set per domain, against the tokens of that domain
trained on so far (the built-in trainer measures it every `loss_probe_every` steps). Rollout
`Feedback` does not move this mixture.

Per domain d, with its points (t_i, L_i):

    fit       L_d(t) = E_d + A_d·t^(−α_d)       robust, bounded (rlpace.stats._curvefit),
                                                refit every `refit_every` loss observations
    area      S_d = ∫ L_d dt − E_d·(t_last − t_first) ≈ Σ_i (t_{i+1} − t_i)(L_i + L_{i+1})/2 − E_d·span
                (trapezoid over every point ever observed: the prequential area above the asymptote)
    horizon   Δ   = horizon · mean_d t_d            (t_d = largest tokens_seen of d)
    value     v_d = L̂_d(t_d) − L̂_d(t_d + Δ) = A_d·t_d^(−α_d)·(1 − (1 + Δ/t_d)^(−α_d))
    weights   p   = softmax((v / max v) / T),  p' = (1 − K·floor)·p + floor

Fallbacks (documented, never NaN): a domain with fewer than `min_points` points at t > 0 (or
fewer than two distinct t) is *unfitted* and valued as the best fitted domain (optimism, so it
keeps being sampled until it has a curve); with no fitted domain, or every v = 0 (flat curves:
A = 0), the mixture is uniform (plus floor). Curves hold at most `capacity` points per domain:
when full, every second point is dropped (the span is kept; the area is accumulated as points
arrive, so it still covers every point).
"""

from __future__ import annotations

from ..errors import InputError
from typing import NamedTuple

import numpy as np

from ..stats._curvefit import fit_power_law
from ..types import LOSS_MAX
from ._base import MIXTURE, DataPolicy, _no_update, softmax
from ._checks import check_int, check_real
from ._state_checks import bad

__all__ = ["epiplexity", "EpiplexityState", "epiplexity_values"]

_KEY = "policy/mixture/"     # where a Scheduler's state_dict holds this state (for messages)


class EpiplexityState(NamedTuple):
    tokens: np.ndarray       # float64[K, C] curve points: tokens of d trained on (0 in empty slots)
    losses: np.ndarray       # float64[K, C] held-out loss at each point (0 in empty slots)
    n_points: np.ndarray     # int64[K] filled slots per domain (slots 0..n−1, in arrival order)
    first_tokens: np.ndarray  # float64[K] tokens of the first point (start of the area)
    last_tokens: np.ndarray  # float64[K] largest tokens seen (t_d; end of the area)
    last_loss: np.ndarray    # float64[K] loss at last_tokens
    loss_area: np.ndarray    # float64[K] trapezoid ∫ L dt over [first_tokens, last_tokens]
    E: np.ndarray            # float64[K] fitted asymptote (0 where unfitted)
    A: np.ndarray            # float64[K] fitted amplitude (tokens units)
    alpha: np.ndarray        # float64[K] fitted exponent (0 where unfitted)
    rmse: np.ndarray         # float64[K] fit residual RMS
    fitted: np.ndarray       # bool[K] the domain has a fit (see fallbacks)
    observations: np.ndarray  # int64[] observe_losses calls with ≥ 1 point (refit cadence)
    #: value rules `Scheduler.load_state_dict` checks for each field (policies/_state_checks.py)
    STATE_RULES = {"tokens": "nonneg", "losses": "nonneg", "n_points": "nonneg", "first_tokens": "nonneg",
                   "last_tokens": "nonneg", "last_loss": "nonneg", "loss_area": "nonneg", "E": "nonneg",
                   "A": "nonneg", "alpha": "nonneg", "rmse": "nonneg", "observations": "nonneg"}


def epiplexity_values(state: EpiplexityState, horizon: float) -> np.ndarray:
    """float64[K] v_d, the predicted loss drop over the next Δ = horizon·mean(t_d) tokens,
    with the fallbacks of the module docstring (unfitted: best fitted value; all zeros when
    nothing is fitted)."""
    t = state.last_tokens
    ok = state.fitted & (t > 0)
    if not ok.any():
        return np.zeros(t.shape[0])         # what the lines below give with nothing fitted
    seen = state.n_points > 0
    delta = horizon * (t[seen].mean() if seen.any() else 0.0)
    safe_t = np.where(ok, t, 1.0)
    alpha = np.where(ok, state.alpha, 0.0)
    excess = np.where(ok, state.A * safe_t ** -alpha, 0.0)          # L̂(t_d) − E_d ≥ 0
    # 1 − (1 + Δ/t)^(−α) = −expm1(−α·log1p(Δ/t)): exact for small Δ/t
    v = np.where(ok, excess * -np.expm1(-alpha * np.log1p(delta / safe_t)), 0.0)
    v = np.clip(v, 0.0, LOSS_MAX)
    return np.where(state.fitted, v, v[ok].max())   # some domain is fitted (returned above if none)


def epiplexity(temperature: float = 0.2, floor: float = 0.05, horizon: float = 0.1,
               refit_every: int = 1, min_points: int = 5, capacity: int = 64,
               alpha_min: float = 0.01, alpha_max: float = 2.0) -> DataPolicy:
    """Epiplexity mixture (arXiv 2601.03220, a reconstruction): softmax over domains of the predicted loss drop from power-law fits of their held-out loss curves, at `temperature`.

    See the module docstring for the rule and fallbacks, and docs/methods/epiplexity.md.
    Feed it with `Scheduler.observe_losses({domain: (tokens_seen, loss)})`.

    Args:
        temperature: softmax temperature T over v / max(v) (unitless).
        floor: minimum probability per domain.
        horizon: Δ as a fraction of the mean tokens seen per domain.
        refit_every: refit the curves every this many `observe_losses` calls.
        min_points: points at t > 0 a domain needs before it is fitted.
        capacity: points kept per domain (even, ≥ 2·min_points); older points are thinned.
        alpha_min, alpha_max: bounds of the fitted exponent α.

    Example (hand-computed): two domains at t = 100 tokens with fits E = 1, α = 1 and
    A = 100 (d0) or 50 (d1), horizon 0.1 (Δ = 10): v = A·t^(−1)·(1 − 1/1.1) = [0.0909, 0.0455],
    v / max v = [1, 0.5], p = softmax([5, 2.5]) = [0.924, 0.076] before the floor.
    """
    check_real("epiplexity", "temperature", temperature, low=0, low_open=True)
    check_real("epiplexity", "floor", floor, low=0, high=1, high_open=True)
    check_real("epiplexity", "horizon", horizon, low=0, low_open=True)
    check_int("epiplexity", "refit_every", refit_every)
    check_int("epiplexity", "min_points", min_points, low=2)
    check_int("epiplexity", "capacity", capacity, low=4)
    if capacity % 2 or capacity < 2 * min_points:
        raise InputError(f"epiplexity capacity must be even and ≥ 2·min_points = {2 * min_points}; "
                         f"got {capacity}.")
    check_real("epiplexity", "alpha_min", alpha_min, low=0, low_open=True)
    check_real("epiplexity", "alpha_max", alpha_max, low=alpha_min, low_open=True, high=8)

    def init(pool):
        k = pool.n_domains
        if floor * k > 1:
            raise InputError(f"epiplexity floor={floor} is infeasible for {k} domains (needs ≤ 1/{k}).")
        z = lambda: np.zeros(k)                                   # noqa: E731
        return EpiplexityState(np.zeros((k, capacity)), np.zeros((k, capacity)), np.zeros(k, np.int64),
                               z(), z(), z(), z(), z(), z(), z(), z(), np.zeros(k, bool),
                               np.array(0, np.int64))

    def update_losses(state, pool, lf):
        if lf.domains.size == 0:
            return state
        s = state
        # one loop iteration per point: M ≤ K domains per call (not per prompt)
        for d, t, loss in zip(lf.domains.tolist(), lf.tokens.tolist(), lf.losses.tolist()):
            n = int(s.n_points[d])
            if n == capacity:                                     # thin: keep slots 0, 2, 4, ...
                half = capacity // 2
                for arr in (s.tokens, s.losses):
                    arr[d, :half] = arr[d, 0::2]
                    arr[d, half:] = 0.0
                n = half
            s.tokens[d, n], s.losses[d, n] = t, loss
            s.n_points[d] = n + 1
            if n == 0:                                            # the domain's first point ever
                s.first_tokens[d], s.last_tokens[d], s.last_loss[d] = t, t, loss
            elif t > s.last_tokens[d]:
                # trapezoid from the previous furthest point; a point at t ≤ t_d (a repeated probe)
                # enters the fit but not the area
                s.loss_area[d] += (t - s.last_tokens[d]) * 0.5 * (loss + s.last_loss[d])
                s.last_tokens[d], s.last_loss[d] = t, loss
        s.observations[...] += 1
        if int(s.observations) % refit_every == 0:
            mask = np.arange(capacity)[None, :] < s.n_points[:, None]
            fit = fit_power_law(s.tokens, s.losses, mask, alpha_min=alpha_min, alpha_max=alpha_max)
            enough = (mask & (s.tokens > 0)).sum(1) >= min_points
            ok = fit.ok & enough
            s.E[:] = np.where(ok, fit.E, 0.0)
            s.A[:] = np.where(ok, np.minimum(fit.A, 1e300), 0.0)
            s.alpha[:] = np.where(ok, fit.alpha, 0.0)
            s.rmse[:] = np.where(ok, fit.rmse, 0.0)
            s.fitted[:] = ok
        return s

    def apply(state, pool, *_):
        v = epiplexity_values(state, horizon)
        top = v.max() if v.size else 0.0
        if top > 0:
            p = softmax(v / top, temperature)
        else:                           # softmax of zeros: exp(0) / K, the same numbers
            p = np.full(v.shape[0], 1.0 / v.shape[0])
        return (1.0 - p.shape[0] * floor) * p + floor

    def metrics(state, pool):
        v = epiplexity_values(state, horizon)
        span = state.last_tokens - state.first_tokens
        area = np.maximum(state.loss_area - state.E * span, 0.0)
        out = {}
        for i, name in enumerate(pool.domain_names):
            for key, arr in (("E", state.E), ("A", state.A), ("alpha", state.alpha), ("rmse", state.rmse),
                             ("area", area), ("value", v), ("points", state.n_points),
                             ("fitted", state.fitted)):
                out[f"epiplexity/{name}/{key}"] = float(arr[i])
        return out

    def check_state(state, pool):
        n = state.n_points
        if (n > capacity).any():
            raise bad(_KEY + "n_points", f"has counts above capacity {capacity}", n, n > capacity)
        past = np.arange(capacity)[None, :] >= n[:, None]
        for key, arr in (("tokens", state.tokens), ("losses", state.losses)):
            if (past & (arr != 0)).any():
                raise bad(_KEY + key, "has values in slots past n_points (empty slots hold 0)", arr, past & (arr != 0))
        if (state.losses > LOSS_MAX).any() or (state.last_loss > LOSS_MAX).any():
            raise bad(_KEY + "losses", f"has losses above {LOSS_MAX:g}", state.losses, state.losses > LOSS_MAX)
        if (state.first_tokens > state.last_tokens).any():
            m = state.first_tokens > state.last_tokens
            raise bad(_KEY + "first_tokens", "exceeds last_tokens", state.first_tokens, m)
        wrong = state.fitted & ((state.alpha < alpha_min) | (state.alpha > alpha_max))
        if wrong.any():
            raise bad(_KEY + "alpha", f"has fitted exponents outside [{alpha_min:g}, {alpha_max:g}]",
                      state.alpha, wrong)

    # rollouts do not move it: the neutral update, which the Scheduler skips (`_Places.updating`)
    return DataPolicy(MIXTURE, init, _no_update, apply, arms="domain", name="epiplexity", metrics=metrics,
                      check_state=check_state, update_losses=update_losses)
