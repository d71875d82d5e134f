"""Criticality-guided importance sampling: draw prompts from a proposal q that oversamples
the ones a learned model predicts to fail, and weight their loss terms by p/q.

The rule of the public criticality-IS code for robot finetuning (`helx-20/go2_mujoco`,
`helx-20/multitask_maniskill`; NADE-style evaluation, background in arXiv 2403.13869), brought
to RLVR — docs/methods/criticality_is.md. For the naturalistic distribution p (uniform over
the pool, p_i = 1/N) and criticality c_i ∈ [0, 1] of each prompt:

    c_i = 4·π̂_i(1 − π̂_i)  (target="learnability", default)   or  1 − π̂_i  (target="failure")
    q   = (1 − ε)·softmax(α·(c − max c)) + ε·p    if max c > threshold,  else q = p
    fallback F = {i : p_i/q_i < τ}: a draw that lands in F is replaced by a draw from p,
    so the effective proposal is q'_i = q_i·[i ∉ F] + (Σ_{j∈F} q_j)·p_i

where π̂ is the pass rate the staged predictor (`rlpace.predict`) scores for the prompt.
Loss weights of a group of prompt i:

    unbiased=True:   w_i = p_i / q'_i                       (exact: E_q'[w·f] = E_p[f])
    unbiased=False:  w_i = 1 if i ∈ F else p_i / q_i, then max(w, weight_floor), then divided by the
                     batch mean (normalize=True), then min(w, weight_clamp)   (the code's 0.1, mean 1, 10)

The predictor learns from every observed group with weight p/q' (exact), so its fit targets
pass rates under p, and it is refit every `stage_steps` updates (the self-evolving loop):
only then do the scores c, the softmax normaliser and the proposal change. Between switches
the proposal is fixed, which is what makes scoring cheap: one pass over the pool per stage
(O(N·d)), then O(n log N) per proposal by inverse CDF.

A method is two policies: the selection draws from q', the reweighting returns the weights.
Each keeps its own copy of the predictor (a policy sees only its own state); both update
identically. Which stage drew a batch is read from `Feedback.step`: a batch whose step is ≤
the step of the batch that ended the last stage was drawn by the previous stage, whose
weights and normaliser are kept (`prev_theta`, `prev_norm`). Feedback more than one stage
late is weighted by the previous stage (an approximation); a trainer must report increasing
steps for the weights to follow the switches.
"""

from __future__ import annotations

from ..errors import InputError
from typing import NamedTuple

import numpy as np

from ..predict._logistic import PredictorState, check_predictor_state, last_result, logits, predictor
from ..types import group_wins
from ._base import REWEIGHTING, SELECTION, DataPolicy
from ._compose import compose
from ._checks import check_choice, check_real

__all__ = ["criticality_is", "criticality_selection", "criticality_weights", "proposal", "shape_weights"]


class CriticalityState(NamedTuple):
    predictor: PredictorState
    prev_theta: np.ndarray   # float64[d] stage weights of the previous stage
    norm: np.ndarray         # float64[4] [active 0/1, max c, Z = Σ e^{α(c − max c)}, M = q(F)] now
    prev_norm: np.ndarray    # float64[4] the same for the previous stage
    switch_step: np.ndarray  # int64[] Feedback.step of the batch that ended the last stage; −1 none
    cdf: np.ndarray          # float64[N] cumulative q of the current stage (selection); [0] (weights)
    ess: np.ndarray          # float64[2] [ESS = (Σw)²/Σw² of the last batch's weights, its B]
    #: value rules `Scheduler.load_state_dict` checks for each field (policies/_state_checks.py)
    STATE_RULES = {"switch_step": "step", "ess": "nonneg"}


def _check_bool(owner: str, name: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise InputError(f"{owner} {name} must be True or False; got {value!r}.")
    return bool(value)


def proposal(c: np.ndarray, alpha: float, epsilon: float, threshold: float,
             weight_threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """(q float64[N], norm float64[4]) for criticalities c of the whole pool (module docstring).

    `q` is the proposal before the fallback; norm = [active, max c, Z, M] with M = Σ_{i∈F} q_i
    the mass the fallback moves to p.

    >>> q, norm = proposal(np.array([1.0, 0.0]), alpha=np.log(3.0), epsilon=0.0, threshold=0.0,
    ...                    weight_threshold=0.0)
    >>> q.round(3).tolist(), norm.round(3).tolist()     # softmax(ln3·[0, −1]) = [3/4, 1/4]
    ([0.75, 0.25], [1.0, 1.0, 1.333, 0.0])
    """
    n = c.shape[0]
    cmax = float(c.max())
    if not cmax > threshold:
        return np.full(n, 1.0 / n), np.array([0.0, cmax, float(n), 0.0])
    e = np.exp(alpha * (c - cmax))
    z = float(e.sum())
    q = (1.0 - epsilon) * e / z + epsilon / n
    fallback = q * (n * weight_threshold) > 1.0               # p/q < τ
    m = float(q[fallback].sum()) if weight_threshold > 0 else 0.0
    return q, np.array([1.0, cmax, z, m])


def shape_weights(w: np.ndarray, weight_floor: float, normalize: bool, weight_clamp: float) -> np.ndarray:
    """The robot code's weight control: max(w, floor), then w / mean(w) over the batch (normalize),
    then min(w, clamp).

    >>> shape_weights(np.array([2 / 3, 2.0]), 0.1, True, 10.0).tolist()
    [0.5, 1.5]
    """
    w = np.maximum(w, weight_floor)
    if normalize and w.size:
        w /= w.sum() / w.size           # w.mean()'s own sum and division, without its wrapper
    return np.minimum(w, weight_clamp, out=w)



def proposal_metrics(state, pool) -> dict:
    """The proposal's stage, whether q is active, max c and the fallback mass (metrics())."""
    return {"criticality/stage": float(state.predictor.stage),
            "criticality/active": float(state.norm[0]),
            "criticality/max_c": float(state.norm[1]),
            "criticality/fallback_mass": float(state.norm[3])}


def weight_metrics(state, pool) -> dict:
    """Effective sample size of the last batch's loss weights, absolute and over B."""
    ess, b = float(state.ess[0]), float(state.ess[1])
    return {"criticality/ess": ess, "criticality/ess_fraction": ess / b if b else 1.0}

def _criticality(z: np.ndarray, target: str, out: np.ndarray | None = None) -> np.ndarray:
    """c of logits z: with π = σ(z) = (1 + t)/2, t = tanh(z/2), 4π(1 − π) = 1 − t² (learnability)
    and 1 − π = (1 − t)/2 (failure), two operations fewer per prompt than through π. `out`
    (float64, z's shape) receives c: the stage pass writes each piece in place, no copy."""
    t = np.multiply(z, 0.5, out=out)
    np.tanh(t, out=t)
    if target == "failure":
        np.subtract(1.0, t, out=t)
        return np.multiply(t, 0.5, out=t)
    t *= t
    return np.subtract(1.0, t, out=t)


_CHUNK = 1 << 16        # prompts per piece of the stage's pass over the pool (cache-sized)


def _stage_proposal(theta, pool, target: str, alpha: float, epsilon: float, threshold: float,
                    weight_threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """(norm float64[4], cdf float64[N]) of the stage with weights θ: `proposal` over the
    criticalities of the whole pool and the CDF of q, computed in cache-sized pieces (one pass
    for c and max c, one for the cumulative exp, one affine map), without the N-sized
    temporaries of the plain formula. The fallback mass M needs a further pass only when
    some prompt can fall back, i.e. when the largest q, (1 − ε)/Z + ε/N, exceeds 1/(Nτ).
    Equal to `proposal` and `cumsum(q) / sum(q)` up to rounding (test_methods_criticality)."""
    n = len(pool)
    c = np.empty(n)
    cmax = -np.inf
    buf = np.empty(min(n, _CHUNK))                # one piece's scratch, reused by every pass
    for s in range(0, n, _CHUNK):
        part = c[s:s + _CHUNK]
        _criticality(logits(theta, pool, slice(s, s + _CHUNK), out=part, scratch=buf[:part.shape[0]]),
                     target, out=part)
        cmax = max(cmax, float(part.max()))
    if not cmax > threshold:
        return np.array([0.0, cmax, float(n), 0.0]), np.arange(1, n + 1, dtype=np.float64) / n
    cdf = c                                       # reused: c[s:] is read before cdf[s:] is written
    z, run = 0.0, 0.0
    for s in range(0, n, _CHUNK):
        part = cdf[s:s + _CHUNK]
        e = np.subtract(part, cmax, out=buf[:part.shape[0]])
        e *= alpha
        np.exp(e, out=e)
        z += float(e.sum())
        np.cumsum(e, out=part)
        part += run
        run = float(part[-1])
    # cdf_i = Σ_{j ≤ i} q_j = (1 − ε)·E_i/Z + ε·(i + 1)/N, E the cumulative exp; then divided
    # by its last entry. One pass in cache-sized pieces, each entry through the same
    # operations in the same order as the whole-array formula (so the same bits).
    scale = (1.0 - epsilon) / run
    last = np.array([run]) * scale
    if epsilon:
        last += np.array([float(n)]) * (epsilon / n)
    last = float(last[0])
    ramp = _epsilon_ramp(pool, n, epsilon) if epsilon else None
    # the selection's `_block_ends` of this CDF, taken from each piece while it is in cache
    # (from the whole array after the pass, they would be ~N/4 cache lines read again)
    ends = np.empty(-(-n // _BLOCK))
    for s in range(0, n, _CHUNK):
        part = cdf[s:s + _CHUNK]
        part *= scale
        if epsilon:
            part += ramp[s:s + _CHUNK]
        part /= last
        ends[s // _BLOCK:(s + part.shape[0]) // _BLOCK] = part[_BLOCK - 1::_BLOCK]
    if n % _BLOCK:
        ends[-1] = cdf[-1]
    pool._cache["criticality/cdf_block_ends"] = (cdf, ends)
    m = 0.0
    if weight_threshold > 0 and ((1.0 - epsilon) / z + epsilon / n) * (n * weight_threshold) > 1.0:
        norm = np.array([1.0, cmax, z, 0.0])
        for s in range(0, n, _CHUNK):
            cc = _criticality(logits(theta, pool, slice(s, s + _CHUNK)), target)
            q, _, fb = _q_of(cc, norm, n, alpha, epsilon, weight_threshold)
            m += float(q[fb].sum())
    return np.array([1.0, cmax, z, m]), cdf


_BLOCK = 32             # CDF entries per block of `search_cdf` (a power of two)
_LIFTS = tuple(_BLOCK >> j for j in range(1, _BLOCK.bit_length()))     # 16, 8, 4, 2, 1


def search_cdf(cdf: np.ndarray, keys: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """int64[n] `cdf.searchsorted(keys, side="right")` for a non-decreasing float64[N] `cdf`,
    with `ends` = `_block_ends(cdf)`, the last entry of each `_BLOCK`-entry block.

    Why: numpy's search runs key by key, and at N = 10⁶ each key's last ~10 probes are cache
    misses that wait on one another (~0.7 μs a key once the 8 MB CDF has left the cache). Here
    a search over the block ends (250 KB at 10⁶, N/32 entries) finds each key's block, then
    five probes inside it are made for all keys at once (one `take` per level, so the misses of
    different keys overlap). The same answers: the blocks before key u's block b have ends
    ≤ u, so all their entries are ≤ u; block b's end is > u (or b is past the last block and
    every entry is ≤ u), so the count of its entries ≤ u is a prefix of at most 31, which
    binary lifting finds (probes past the end read the last entry, `take(mode="clip")`: they
    only ever add when every entry is ≤ u, and the answer is then clipped to N).
    """
    pos = ends.searchsorted(keys, side="right")
    pos *= _BLOCK
    probe = np.empty_like(pos)
    below = np.empty(pos.shape, dtype=bool)
    for k in _LIFTS:
        np.add(pos, k - 1, out=probe)
        np.less_equal(cdf.take(probe, mode="clip"), keys, out=below)
        np.add(pos, k, out=pos, where=below)
    return np.minimum(pos, cdf.shape[0], out=pos)


def _block_ends(pool, cdf: np.ndarray) -> np.ndarray:
    """float64[ceil(N / _BLOCK)] the last entry of each block of `cdf` (the last block may be
    short), for `search_cdf`. Built once per stage CDF (the state's array object, which
    nothing writes after the stage pass made it or a restore read it) and kept with the
    pool, not in the state: derived, like the CDF's other copies."""
    memo = pool._cache.get("criticality/cdf_block_ends")
    if memo is None or memo[0] is not cdf:
        ends = cdf[_BLOCK - 1::_BLOCK]
        ends = np.append(ends, cdf[-1:]) if cdf.shape[0] % _BLOCK else ends.copy()
        memo = pool._cache["criticality/cdf_block_ends"] = (cdf, ends)
    return memo[1]


def _epsilon_ramp(pool, n: int, epsilon: float) -> np.ndarray:
    """float64[N] ε·(i + 1)/N, the uniform part of the CDF (the same product as the piecewise
    `np.arange(s + 1, ...) · (ε/N)`): a function of (N, ε) only, so it is built once per pool
    and read by every stage switch (three passes of each switch's affine map become one)."""
    memo = pool._cache.get("criticality/epsilon_ramp")
    if memo is None or memo[0] != (n, epsilon):
        ramp = np.arange(1, n + 1, dtype=np.float64)
        ramp *= epsilon / n
        ramp.setflags(write=False)
        memo = pool._cache["criticality/epsilon_ramp"] = ((n, epsilon), ramp)
    return memo[1]


def _q_of(c: np.ndarray, norm: np.ndarray, n: int, alpha: float, epsilon: float,
          weight_threshold: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(q_i, q'_i, in_fallback_i) for criticalities c of some prompts, from a stage's norm."""
    if norm[0] == 0.0:
        q = np.full(c.shape[0], 1.0 / n)
        return q, q, np.zeros(c.shape[0], bool)
    q = (1.0 - epsilon) * np.exp(alpha * (c - norm[1])) / norm[2] + epsilon / n
    fb = q * (n * weight_threshold) > 1.0
    q_eff = np.where(fb, 0.0, q) + norm[3] / n
    return q, q_eff, fb


def _core(alpha, epsilon, threshold, weight_threshold, weight_floor, weight_clamp, normalize,
          unbiased, target, lr, l2, stage_steps, buffer, newton_steps, with_cdf: bool,
          owner: str = "criticality_is"):
    """(init, update, weights, crit, version, check_state), shared by the selection and the
    reweighting (and by the grid proposal, `criticality_grid`, which runs them over a pool of
    parameter cells); `with_cdf` keeps the stage's CDF in the state (the selection draws from it)."""
    pr = predictor(lr=lr, l2=l2, stage_steps=stage_steps, buffer=buffer, newton_steps=newton_steps,
                   owner=owner)

    def crit(theta, pool, ids=None):
        return _criticality(logits(theta, pool, ids), target)

    def stage_proposal(theta, pool):
        # The selection and the reweighting each keep a predictor and update it identically,
        # so at a stage switch both ask for the proposal of the same θ: a pure function of
        # (θ, hyperparameters, pool), computed once and read by the second.
        key = (theta.tobytes(), alpha, epsilon, threshold, weight_threshold, target)
        memo = pool._cache.get("criticality/last_stage")
        if memo is None or memo[0] != key:
            memo = (key, _stage_proposal(theta, pool, target, alpha, epsilon, threshold, weight_threshold))
            pool._cache["criticality/last_stage"] = memo
        norm, cdf = memo[1]
        return norm.copy(), (cdf if with_cdf else np.zeros(0))   # cdf: read-only use, never written

    def init(pool):
        ps = pr.init(pool)
        norm, cdf = stage_proposal(ps.stage_theta, pool)
        return CriticalityState(ps, ps.stage_theta.copy(), norm, norm.copy(), np.array(-1, np.int64),
                                cdf, np.zeros(2))

    def version(state, step):
        """(theta, norm) of the stage that drew a batch reported at `step`."""
        if int(state.switch_step) >= 0 and step <= int(state.switch_step):
            return state.prev_theta, state.prev_norm
        return state.predictor.stage_theta, state.norm

    def weights(state, pool, ids, step):
        """(exact p/q' float64[B], shaped float64[B]) for the prompts of one batch."""
        n = len(pool)
        theta, norm = version(state, step)

        def compute():
            q, q_eff, fb = _q_of(crit(theta, pool, ids), norm, n, alpha, epsilon, weight_threshold)
            exact = (1.0 / n) / q_eff
            if unbiased:
                return exact, exact
            return exact, shape_weights(np.where(fb, 1.0, (1.0 / n) / q), weight_floor, normalize,
                                        weight_clamp)
        # the selection's and the reweighting's update both weigh the same batch
        return last_result(pool, "criticality/last_weights", (theta.tobytes(), norm.tobytes(), ids.tobytes(),
                           alpha, epsilon, weight_threshold, target, unbiased, weight_floor, normalize,
                           weight_clamp), compute)

    def update(state, pool, batch):
        ids = batch.prompt_ids
        if ids.size == 0:
            return state
        exact, shaped = weights(state, pool, ids, batch.step)
        g = batch.rewards.shape[1]
        wins = group_wins(batch)                  # successes per group, float64[B]
        stage_before = int(state.predictor.stage)
        old_theta = state.predictor.stage_theta.copy()
        ps = pr.update(state.predictor, pool, ids, wins, np.full(ids.shape[0], float(g)), exact)
        s1, s2 = float(shaped.sum()), float((shaped * shaped).sum())
        ess = np.array([s1 * s1 / s2 if s2 > 0 else 0.0, float(ids.shape[0])])
        if int(ps.stage) == stage_before:
            return state._replace(predictor=ps, ess=ess)
        norm, cdf = stage_proposal(ps.stage_theta, pool)
        return CriticalityState(ps, old_theta, norm, state.norm.copy(), np.array(batch.step, np.int64),
                                cdf, ess)

    def check_state(state, pool):
        check_predictor_state(state.predictor, "predictor")
        for key in ("norm", "prev_norm"):
            v = getattr(state, key)
            if v[0] not in (0.0, 1.0) or v[2] < 1.0 or not 0.0 <= v[3] <= 1.0 + 1e-9:
                raise InputError(f"state[{key!r}] = {v.tolist()} is not a criticality proposal's "
                                 f"[active, max c, Z ≥ 1, M in [0, 1]]; the state is corrupt or was "
                                 f"edited: restore one written by Scheduler.state_dict().")
        cdf = state.cdf
        if cdf.size and ((np.diff(cdf) < 0).any() or cdf[0] < 0 or abs(cdf[-1] - 1.0) > 1e-9):
            raise InputError("state['cdf'] is not a cumulative distribution (non-decreasing, ending "
                             "at 1); the state is corrupt or was edited: restore one written by "
                             "Scheduler.state_dict().")

    return init, update, weights, crit, version, check_state


_DEFAULTS = dict(alpha=3.0, epsilon=0.1, threshold=0.0, weight_threshold=0.01, weight_floor=0.1,
                 weight_clamp=10.0, normalize=True, unbiased=False, target="learnability", lr=0.1, l2=1e-3, stage_steps=20,
                 buffer=8192, newton_steps=5)


def _checked(alpha, epsilon, threshold, weight_threshold, weight_floor, weight_clamp, normalize,
             unbiased, target, lr, l2, stage_steps, buffer, newton_steps, owner: str = "criticality_is") -> dict:
    o = owner
    check_real(o, "alpha", alpha, low=0, high=50,
               hint=" (softmax sharpness; the criticality-IS code: 3)")
    check_real(o, "epsilon", epsilon, low=0, high=1, hint=" (share of p mixed into q)")
    check_real(o, "threshold", threshold, low=0, high=1, hint=" (q = p unless max c exceeds it)")
    check_real(o, "weight_threshold", weight_threshold, low=0, high=1,
               hint=" (draws with p/q below it fall back to p; 0 = off)")
    check_real(o, "weight_floor", weight_floor, low=0,
               hint=" (weight floor; the criticality-IS code: 0.1)")
    check_real(o, "weight_clamp", weight_clamp, low=0, low_open=True,
               hint=" (weight cap after normalising; 10)")
    if weight_clamp < weight_floor:
        raise InputError(f"{o} weight_clamp must be ≥ weight_floor; got "
                         f"weight_clamp={weight_clamp}, weight_floor={weight_floor}.")
    _check_bool(o, "normalize", normalize)
    _check_bool(o, "unbiased", unbiased)
    check_choice(o, "target", target, ("failure", "learnability"))
    predictor(lr=lr, l2=l2, stage_steps=stage_steps, buffer=buffer, newton_steps=newton_steps, owner=o)
    return dict(alpha=float(alpha), epsilon=float(epsilon), threshold=float(threshold),
                weight_threshold=float(weight_threshold), weight_floor=float(weight_floor),
                weight_clamp=float(weight_clamp),
                normalize=bool(normalize), unbiased=bool(unbiased), target=target, lr=float(lr),
                l2=float(l2), stage_steps=int(stage_steps), buffer=int(buffer),
                newton_steps=int(newton_steps))


def criticality_selection(**kw) -> DataPolicy:
    """Selection: draw n prompts i.i.d. from the criticality proposal q' (module docstring);
    keyword arguments as `criticality_is`."""
    hp = _checked(**{**_DEFAULTS, **kw})
    init, update, _, crit, _, check_state = _core(**hp, with_cdf=True)
    n_fb = hp["weight_threshold"] > 0

    def apply(state, pool, n, probs, arms, rng):
        if probs is not None:
            raise InputError("criticality_is draws from the pool's uniform p; compose it without a "
                             "mixture (a mixture's p changes every step, the stage proposal does not).")
        size = len(pool)
        cdf = state.cdf
        u = rng.random(n)
        # Sorted keys: the search walks the N-entry CDF in order; the same answers.
        order = np.argsort(u)
        ids = np.empty(n, dtype=np.int64)
        ids[order] = np.minimum(search_cdf(cdf, u[order], _block_ends(pool, cdf)), size - 1)
        if n_fb and state.norm[0] and state.norm[3] > 0 and n:
            # drawn only here: nothing draws from this proposal's generator after it (the
            # Scheduler seeds the next proposal's from (seed, step)), so the ids are the same
            alt = rng.integers(0, size, size=n, dtype=np.int64)
            _, _, fb = _q_of(crit(state.predictor.stage_theta, pool, ids), state.norm, size,
                             hp["alpha"], hp["epsilon"], hp["weight_threshold"])
            ids = np.where(fb, alt, ids)
        return ids

    return DataPolicy(SELECTION, init, update, apply, name="criticality_selection", metrics=proposal_metrics,
                      check_state=check_state)


def criticality_weights(**kw) -> DataPolicy:
    """Reweighting: w = p/q' of the stage that drew each prompt, shaped by `weight_floor`, mean-1 and
    `weight_clamp` unless `unbiased` (module docstring); keyword arguments as `criticality_is`."""
    hp = _checked(**{**_DEFAULTS, **kw})
    init, update, weights, _, _, check_state = _core(**hp, with_cdf=False)

    def apply(state, pool, batch):
        _, w = weights(state, pool, batch.prompt_ids, batch.step)
        return np.broadcast_to(w[:, None], batch.rewards.shape).astype(np.float64)

    return DataPolicy(REWEIGHTING, init, update, apply, name="criticality_weights", metrics=weight_metrics,
                      check_state=check_state)


def criticality_is(alpha: float = 3.0, epsilon: float = 0.1, threshold: float = 0.0,
                   weight_threshold: float = 0.01, weight_floor: float = 0.1, weight_clamp: float = 10.0,
                   normalize: bool = True, unbiased: bool = False, target: str = "learnability",
                   lr: float = 0.1, l2: float = 1e-3, stage_steps: int = 20, buffer: int = 8192,
                   newton_steps: int = 5):
    """Criticality-guided IS: oversample prompts a staged pass-rate predictor scores as critical, weight losses by p/q.

    q = (1 − ε)·softmax(α·(c − max c)) + ε·p when max c > `threshold` (else q = p), with
    c = 4·π̂(1 − π̂) the predicted learnability (`target="learnability"`, the RLVR default:
    an all-wrong group carries no GRPO signal) or the robot code's predicted failure
    probability 1 − π̂ (`target="failure"`); draws whose weight p/q is below
    `weight_threshold` fall back to p; loss weights p/q floored at `weight_floor`, divided by their batch mean (`normalize`) and
    clamped at `weight_clamp` — or the exact p/q' with `unbiased=True`. The predictor
    (`rlpace.predict`, hyperparameters `lr`, `l2`, `stage_steps`, `buffer`, `newton_steps`) is
    refit every `stage_steps` updates on the stage's groups, importance-weighted. See the
    module docstring and docs/methods/criticality_is.md. `metrics()` reports the effective
    sample size of the last batch's weights (`criticality/ess`, `criticality/ess_fraction`).

    Example (hand-computed): N = 2, c = [1, 0], α = ln 3, ε = 0: q = [3/4, 1/4], so
    p/q = [2/3, 2]; with a floor of 0.1, mean-1 over a batch holding both prompts the weights
    are [0.5, 1.5].
    """
    hp = _checked(alpha, epsilon, threshold, weight_threshold, weight_floor, weight_clamp, normalize,
                  unbiased, target, lr, l2, stage_steps, buffer, newton_steps)
    return compose(criticality_selection(**hp), criticality_weights(**hp), name="criticality_is")
