"""Predictions: every candidate policy, uniform and the oracles run on learners drawn from the fit.

For each draw j of the Laplace posterior (the first is the MAP) and each of `seeds` seeds:
a world is built on the user's pool (every prompt's difficulty drawn: a prompt the pilot saw
from its posterior, any other from its domain's prior; held-out sets at the domain's
quantiles, solved share included), then `rlpace.sim.simulate` runs each policy for the rest
of the budget from the state after the pilot (difficulties shifted by the fitted skill, so
the simulator's skill starts at 0 there). Every curve starts at the pilot's start
(rollouts 0, the base accuracy) and counts the pilot's rollouts.

Per draw: target = base + 0.8·(uniform's final − base); each policy's cost to reach it
(linear interpolation; a run that never gets there costs its budget and is marked) and its
ratio to uniform's (mean cost over the draw's seeds over uniform's mean, the headroom tables'
estimator). Per policy: the ratio at the MAP draw pooled with the others (median over draws),
a 90 % prediction interval for one more draw (`_laws.draw_interval`: the fit's uncertainty,
the second family's draws (`alternative`), the model error's per-domain rates (`rate_sd`) and
the seeds' spread), and P(saving > 10 %) = share of draws with ratio < 0.9.

What the interval is for: a draw's ratio over `seeds` seeds is exactly what a `seeds`-seed
paired measurement on that learner reads, so the interval over draws is one for a
`seeds`-seed measurement — with one seed per draw, wider than an 8-seed table's, whose seed
noise averages over 8 runs. `measurement_seeds=M` (seeds ≥ 2) makes it the interval for an
M-seed measurement: the seed term's variance v̂ is read within the draws (`_laws.seed_terms`,
`pooled_seed_var`) and the draws' variance s² ≈ τ² + v/S is re-split as τ̂² + v̂/M
(`_laws.draw_interval`). Headroom = the better oracle per draw;
captured share = (1 − ratio)/(1 − oracle ratio) at the medians. The held-out accuracy is
the mean pass rate or, with `heldout_eval="greedy"`, the share of prompts whose most likely
answer is right. With many candidates the dominated ones stop after the screening draws
(`screen`, `survivors`).
"""

from __future__ import annotations

import math
import time
import warnings
from typing import NamedTuple

import numpy as np

from ..errors import InputError
from ..evaluation import captured_share, cost_to_reach, gain_target
from ..sim import Scenario, World, simulate
from ..types import Pool
from ._laws import mixture_summary, pooled_seed_var, seed_terms
from ._fit import (HELDOUT, EVAL_MODES, LearnerFit, LearnerParams, draw_params, eval_accuracy, greedy_from_sampled,
                   heldout_difficulties, prompt_difficulties, saturated_skill, transfer_matrix)

__all__ = ["Prediction", "PolicyPrediction", "predict", "default_candidates", "ORACLES", "unmodelled_signals"]

ORACLES = ("oracle_boundary", "oracle_progress")
#: the headroom of rollout allocation (Knapsack RL's DP on the true pass rates), run beside the
#: candidates when one of them has an allocation place; a row of its own, not in `ORACLES`' best
ALLOCATION_ORACLE = "oracle_allocation"
_HELDOUT = HELDOUT
#: a candidate is dropped after the screening draws when it is this much worse than the best
#: candidate on every one of them: the advice's own tolerance (its pick must be within 0.1 of
#: the best), so a dropped candidate could not have been the advice
SCREEN_MARGIN = 0.1


class PolicyPrediction(NamedTuple):
    policy: str
    ratio: float             # median over draws of rollouts-to-target / uniform's
    low: float               # 5th percentile over draws
    high: float              # 95th percentile
    p_saving: float          # P(ratio < 0.9)
    reached: float           # share of (draw, seed) runs that reached the target
    captured: float          # (1 − ratio)/(1 − oracle ratio)
    final_diff: float        # median final accuracy − uniform's
    ratios: np.ndarray       # float64[D] per draw (the screening draws only for a dropped candidate)
    screened_out: bool = False   # dropped after the screening draws (`predict(screen=...)`)
    not_modelled: str = ""   # the signals it reads that the simulator does not produce ("": modelled)
    seed_var: float = math.nan   # v̂: one seed's variance of the log ratio, read within draws (`measurement_seeds`)


class Prediction(NamedTuple):
    policies: list           # [PolicyPrediction] candidates, best ratio first
    oracle: PolicyPrediction  # the better oracle per draw
    oracles: dict             # name -> PolicyPrediction of each oracle alone
    uniform_final: float     # median final accuracy of uniform
    base: float              # accuracy before the pilot
    curves: dict             # policy -> (rollouts float64[E], accuracy float64[D, E]) on a common grid
    budget_rollouts: int
    pilot_rollouts: int
    steps: int               # simulated steps after the pilot
    batch_size: int
    group_size: int
    draws: int
    seeds: int
    seconds: float
    screen: int = 0           # draws every candidate ran on before the dominated ones were dropped
    alternative_draws: int = 0   # draws from the alternative family (`predict(alternative=...)`)
    rate_sd: float = 0.0      # the model-error spread the draws carry (`rate_discrepancy`)
    heldout_eval: str = "sampled"
    measurement_seeds: int | None = None   # the interval is for a measurement over this many seeds (None: `seeds`)


#: what the simulator feeds a policy besides rollout rewards (`DataPolicy.reads`)
SIMULATED_SIGNALS = frozenset({"measurement"})


def unmodelled_signals(policy: str) -> str:
    """The signals `policy` learns from that the simulator does not produce ("" when it
    produces every one): what its places declare in `DataPolicy.reads` beyond
    `SIMULATED_SIGNALS`, and held-out loss curves for a place with `update_losses`. Such a
    policy would run on its fallback in the simulator (epiplexity: a uniform mixture) and be
    predicted ≈ 1× whatever it does on a trainer, so it is not predicted at all.

    >>> unmodelled_signals("dump"), unmodelled_signals("epiplexity")
    ('', 'held-out loss curves')
    """
    from ..policies import make_method
    why = set()
    for p in make_method(policy).policies().values():
        why |= set(p.reads) - SIMULATED_SIGNALS
        if p.update_losses is not None:
            why.add("held-out loss curves")
    return ", ".join(sorted(why))


def check_prediction_args(*, draws=8, seeds=1, jobs=1, screen=None, measurement_seeds=None,
                          heldout_eval="sampled", policies=None) -> None:
    """InputError naming the field (and its `rlpace advise` flag) for a bad argument of
    `predict` or `advise`, before any work: the one place these are checked (`advise` calls
    it before its fits, `predict` before its simulations, the CLI before a trainer pilot).
    `heldout_eval` may also be "auto" (advise's, resolved before `predict`)."""
    for name, value, low in (("draws", draws, 1), ("seeds", seeds, 1), ("jobs", jobs, 1),
                             ("screen", 0 if screen is None else screen, 0)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise InputError(f"{name} (--{name}) must be an integer ≥ {low}; got {value!r}.")
    if heldout_eval not in ("auto", *EVAL_MODES):
        raise InputError(f"heldout_eval (--heldout-eval) must be auto, {' or '.join(EVAL_MODES)}; "
                         f"got {heldout_eval!r}.")
    if measurement_seeds is not None:
        m = measurement_seeds
        if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 1:
            raise InputError(f"measurement_seeds (--measurement-seeds) must be a positive integer (the "
                             f"measurement's seed count; 0 at the CLI: off); got {m!r}.")
        if m != seeds and seeds < 2:
            raise InputError(f"measurement_seeds={m} (--measurement-seeds {m}) needs seeds ≥ 2 per draw, "
                             f"--seeds 2 or more (the seed spread is read within each draw's seeds); got "
                             f"seeds={seeds}.")
    if policies is not None:
        from ..policies import names
        known = set(names())
        unknown = [p for p in policies if not isinstance(p, str)
                   or not all(part in known for part in p.split("+"))]
        if unknown:
            raise InputError(f"policies (--policies): unknown {unknown}; see `rlpace policies` "
                             f"(a chain is name+name).")


def default_candidates() -> list[str]:
    """`recommended`, then every registered proposal policy, every admission policy and every
    rollout-allocation policy, alone and after `recommended` (`recommended+knapsack`; as
    benchmarks/headroom.py compares them), without uniform and the oracles."""
    from ..policies import make_method, names
    from ..sim import proposal_names
    adm = [n for n in names() if not n.startswith("oracle_") and make_method(n).admission.name != "keep_all"]
    alloc = [n for n in names() if _allocates(n) and not n.startswith("oracle_")]
    out = ["recommended", *proposal_names(), *adm, *alloc, *[f"recommended+{n}" for n in alloc]]
    return [p for p in dict.fromkeys(out) if p != "uniform"]


def _allocates(policy: str) -> bool:
    """True when `policy` has a rollout-allocation place (`knapsack`, `gvm`, `vip`, ...)."""
    from ..policies import is_neutral, make_method
    alloc = make_method(policy).allocation
    return alloc is not None and not is_neutral(alloc)


def _world(fit: LearnerFit, p: LearnerParams, pool: Pool, shift: np.ndarray, rng: np.random.Generator,
           rate: np.ndarray | None = None) -> World:
    """One world drawn from learner `p`; `rate` float64[K] multiplies each domain's learning
    (rows of the transfer matrix: the discrepancy's per-domain multipliers), None = 1."""
    dom = pool.domains.astype(np.int64)
    d = prompt_difficulties(fit, p, len(pool), dom, rng) - shift[dom]
    held = heldout_difficulties(p, _HELDOUT) - shift[:, None]
    m = transfer_matrix(fit.rank, p.tau, p.omega)
    if rate is not None:
        m = rate[:, None] * m
    for a in (d, dom, held):
        a.setflags(write=False)
    return World(pool, d, dom, np.arange(pool.n_domains, dtype=np.int64), held, m)


def _run(world: World, params: LearnerParams, policy: str, *, steps, seed, b, g, eval_every, measure, step_norm,
         offset=None):
    k = world.transfer.shape[0]
    sc = Scenario(name="fitted", description="a learner fitted to a pilot", domains=world.pool.domain_names,
                  base_accuracy=(0.5,) * k, lr=params.lr, forgetting=0.0, target=0.999)
    oracle = policy.startswith("oracle_")
    kw = {"group_size": g, "transfer": world.transfer.tolist()} if policy == "oracle_progress" else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                   # e.g. gfpo: the simulator has no lengths
        res = simulate(sc, policy, steps=steps, seed=seed, batch_size=b, group_size=g, eval_every=eval_every,
                       world=world, policy_kwargs=kw, measure_every=measure[0] if oracle else 0, measure_rollouts=measure[1],
                       measure_exact=measure[2],
                       step_norm=step_norm, saturation=params.sat, skill_offset=offset if params.sat > 0 else None)
    return res.eval_rollouts.astype(np.float64), res.accuracy                    # [E], [E, K]


def _one_draw(job) -> tuple:
    """One learner drawn from the fit: every policy on `seeds` worlds; costs to the target,
    whether reached, final accuracy, base accuracy and the mean curve on `grid`."""
    (fit, pool, pj, j, run_names, seeds, seed, steps, eval_every, measure, from_start, offset, fraction, grid,
     rate_sd, heldout_eval) = job
    b, g, k = fit.batch_size, fit.group_size, pool.n_domains
    shift = np.zeros(k) if from_start else saturated_skill(
        pj.lr * fit.data["cum"][-1] @ transfer_matrix(fit.rank, pj.tau, pj.omega).T, pj.sat)
    # the model's own error (`rate_discrepancy`): every draw but the MAP its own per-domain rates
    rate = np.exp(rate_sd * np.random.default_rng([seed, j, 0xC0DE]).standard_normal(k)) if j and rate_sd else None
    curves = {p: [] for p in run_names}
    cost = {p: np.zeros(seeds) for p in run_names}
    hit = {p: np.zeros(seeds, bool) for p in run_names}
    final = {p: np.zeros(seeds) for p in run_names}
    base = 0.0
    for s in range(seeds):
        world = _world(fit, pj, pool, shift, np.random.default_rng([seed, j, s, 0xD1FF]), rate)
        base = float(eval_accuracy(-shift, world.heldout, heldout_eval).mean())   # accuracy at the pilot's start
        for p in run_names:
            x, acc = _run(world, pj, p, steps=steps, seed=seed * 1000 + j * 31 + s, b=b, g=g,
                          eval_every=eval_every, measure=measure, step_norm=fit.step_norm, offset=shift)
            if heldout_eval == "greedy":
                acc = greedy_from_sampled(acc, world.heldout)
            a = acc.mean(axis=1)
            if not from_start:
                x = np.concatenate([[0.0], x + offset])
                a = np.concatenate([[base], a])
            curves[p].append((x, a))
        tgt = gain_target(base, curves["uniform"][-1][1][-1], fraction)
        for p in run_names:
            x, a = curves[p][-1]
            cost[p][s], hit[p][s] = cost_to_reach(x, a, tgt)
            final[p][s] = a[-1]
    rows = {p: np.mean([np.interp(grid, x, a) for x, a in curves[p]], axis=0) for p in run_names}
    return j, cost, hit, final, base, rows


def survivors(screened: dict, margin: float = SCREEN_MARGIN) -> list[str]:
    """Candidates not clearly dominated after the screening draws: those whose best screened
    ratio is within `margin` of the best candidate's worst, min_j r_p(j) ≤ min_q max_j r_q(j)
    + margin (`screened`: name -> float64[S] ratios on the S screening draws). A candidate
    left out is at least `margin` worse than the best one on every screened draw.

    >>> survivors({"a": np.array([0.5, 0.6]), "b": np.array([0.65, 0.9]), "c": np.array([0.75, 0.8])})
    ['a', 'b']
    """
    bar = min(float(np.max(r)) for r in screened.values()) + margin
    return [p for p, r in screened.items() if float(np.min(r)) <= bar]


def predict(fit: LearnerFit, pool: Pool, *, budget_rollouts: int, pilot_rollouts: int,
            policies: list[str] | None = None, draws: int = 8, seeds: int = 1, seed: int = 0,
            from_start: bool = False, fraction: float = 0.8, jobs: int = 1, oracle_every: int | None = None,
            oracle_rollouts: int = 16, oracle_exact: bool = True, progress=None, screen: int | None = None,
            rate_sd: float = 0.0, heldout_eval: str = "sampled", alternative: tuple | None = None,
            measurement_seeds: int | None = None) -> Prediction:
    """Simulate uniform, the oracles and `policies` on `draws` learners from the fit.

    Args:
        fit: `fit_learner`'s result on `pool`.
        budget_rollouts: the whole run's budget, the pilot's rollouts included.
        pilot_rollouts: what the pilot cost (counted in every policy's cost).
        policies: candidates (default `default_candidates()`).
        draws: learners drawn from the fit (the first is the MAP); seeds: runs per draw.
        from_start: simulate every policy from the pilot's start (no pilot counted) instead
            of after it — what a headroom table measures.
        jobs: worker processes, one draw each at a time (1 = in this process).
        oracle_every, oracle_rollouts, oracle_exact: how the oracles measure every prompt's
            pass rate (`simulate`'s measure_*): by default the true rate quantised to 1/16
            every max(1, steps // 50) steps, an upper bound; a trainer's oracle measures m
            Bernoulli draws every k steps (`oracle_exact=False`), which is what its headroom
            table measured.
        progress: a callable(str) told each finished draw.
        screen: every candidate runs on the first `screen` draws only; the others run uniform,
            the oracles and the candidates `survivors` keeps (not clearly dominated: within
            `SCREEN_MARGIN` of the best). A kept candidate's numbers are exactly those of a
            run without screening (each draw's worlds and seeds do not depend on what else
            runs); a dropped one reports its screening draws (`screened_out`). None: 2 when
            there are more than 8 candidates and more than 3 draws, else 0 (off).
        rate_sd: the model's own error (`rate_discrepancy`): every draw but the first gets
            per-domain learning-rate multipliers exp(rate_sd·ε_k), ε_k ~ N(0, 1).
        heldout_eval: what the user's held-out accuracy measures: "sampled" (mean pass rate)
            or "greedy" (share of prompts whose most likely answer is right;
            `predicted_evals` reads it from the pilot).
        alternative: (another `LearnerFit` of the same pilot, n) or (fit, n, weight): the
            last n draws come from it (its MAP first) — a second step law the pilot cannot
            rule out. With `weight` (its calibrated weight, `_laws.law_weight`) and n ≥ 1 the
            summaries are `_laws.mixture_summary`'s: the weighted median and the hull of the
            two laws' own 5–95 % intervals; without it every draw counts alike.
        measurement_seeds: the seeds of the measurement the 90 % intervals should hold
            (a headroom table's 8): the seed spread is read within the draws and scaled
            to M seeds (module docstring); needs seeds ≥ 2 when it differs from `seeds`.
            None: the interval for a `seeds`-seed measurement.

    Returns:
        A `Prediction`. Cost: (3 + len(policies)) · screen · seeds simulator runs, then (3 +
        survivors) · (draws − screen) · seeds.
    """
    t0 = time.perf_counter()
    b, g = fit.batch_size, fit.group_size
    if budget_rollouts <= pilot_rollouts and not from_start:
        raise InputError(f"--budget-rollouts {budget_rollouts} is not larger than the pilot's {pilot_rollouts} "
                         f"rollouts; give the whole run's budget, pilot included.")
    left = budget_rollouts if from_start else budget_rollouts - pilot_rollouts
    steps = int(left // (b * g))
    if steps < 2:
        raise InputError(f"the budget leaves {left} rollouts after the pilot, fewer than two steps of "
                         f"{b}×{g}; raise --budget-rollouts.")
    policies = default_candidates() if policies is None else list(policies)
    check_prediction_args(draws=draws, seeds=seeds, jobs=jobs, screen=screen, measurement_seeds=measurement_seeds,
                          heldout_eval=heldout_eval, policies=policies)
    if heldout_eval not in EVAL_MODES:
        raise InputError(f"heldout_eval must be one of {EVAL_MODES} here (advise resolves 'auto'); got "
                         f"{heldout_eval!r}.")
    if not (math.isfinite(rate_sd) and rate_sd >= 0):
        raise InputError(f"rate_sd must be a finite number ≥ 0; got {rate_sd!r}.")
    measurement_seeds = None if measurement_seeds is None else int(measurement_seeds)
    if screen is None:
        screen = 2 if len(policies) > 8 and draws > 3 else 0
    screen = int(screen) if 0 < int(screen) < draws else 0
    eval_every = max(1, steps // 25)
    measure = (max(1, steps // 50) if oracle_every is None else int(oracle_every), int(oracle_rollouts),
               bool(oracle_exact))
    unmodelled = {p: unmodelled_signals(p) for p in policies if p not in ("uniform", *ORACLES)}
    unmodelled = {p: why for p, why in unmodelled.items() if why}
    head = ["uniform", *ORACLES]                        # always run, never screened out
    cands = [p for p in policies if p not in ("uniform", *ORACLES, ALLOCATION_ORACLE, *unmodelled)]
    if any(_allocates(p) for p in cands):                # allocation's headroom: a row of its own
        head.append(ALLOCATION_ORACLE)
    run_names = [*head, *cands]
    rng_draw = np.random.default_rng([seed, 0xAD715E])
    n_alt = 0 if alternative is None else int(np.clip(alternative[1], 0, draws - 1))
    w_alt = None if alternative is None or len(alternative) < 3 or not n_alt else float(alternative[2])
    if w_alt is not None and not 0.0 <= w_alt <= 1.0:
        raise InputError(f"predict alternative weight must lie in [0, 1]; got {w_alt!r}.")
    params = draw_params(fit, draws - n_alt, rng_draw)
    fits = [fit] * len(params)
    if n_alt:                                            # the other family's draws last, its MAP first
        params += draw_params(alternative[0], n_alt, np.random.default_rng([seed, 0xA17]))
        fits += [alternative[0]] * n_alt
    offset = 0.0 if from_start else float(pilot_rollouts)
    grid = np.linspace(0.0, float(budget_rollouts if not from_start else left), 60)
    acc_grid = {p: [] for p in run_names}
    cost = {p: np.zeros((draws, seeds)) for p in run_names}
    hit = {p: np.zeros((draws, seeds), bool) for p in run_names}
    final = {p: np.zeros((draws, seeds)) for p in run_names}
    base_acc = np.zeros(draws)
    ex = None
    if jobs > 1 and draws > 1:
        from concurrent.futures import ProcessPoolExecutor
        ex = ProcessPoolExecutor(max_workers=min(jobs, draws))
    done = 0
    stages = [(range(screen), run_names), (range(screen, draws), None)] if screen else [(range(draws), run_names)]
    kept = run_names
    try:
        for rng_j, names_j in stages:
            if names_j is None:                          # after screening: drop the dominated candidates
                scr = {p: cost[p][:screen].mean(axis=1) / np.maximum(cost["uniform"][:screen].mean(axis=1), 1e-9)
                       for p in run_names[len(head):]}
                keep = set(survivors(scr)) if scr else set()
                kept = names_j = [p for p in run_names if p in head or p in keep]
            jobs_list = [(fits[j], pool, params[j], j, names_j, seeds, seed, steps, eval_every, measure, from_start,
                          offset, fraction, grid, float(rate_sd), heldout_eval) for j in rng_j]
            results = ex.map(_one_draw, jobs_list) if ex is not None else map(_one_draw, jobs_list)
            for j, c_j, h_j, f_j, base, rows in results:
                for p in names_j:
                    cost[p][j], hit[p][j], final[p][j] = c_j[p], h_j[p], f_j[p]
                    acc_grid[p].append(rows[p])
                base_acc[j] = base
                done += 1
                if progress is not None:
                    progress(f"draw {done}/{draws} done ({time.perf_counter() - t0:.0f} s)")
    finally:
        if ex is not None:
            ex.shutdown()
    n_of = {p: draws if p in kept else screen for p in run_names}            # draws each policy ran on
    cost, hit, final = ({p: v[p][:n_of[p]] for p in run_names} for v in (cost, hit, final))

    def summary(p, ratios):
        fd = np.median(final[p].mean(axis=1) - final["uniform"][:n_of[p]].mean(axis=1))
        # the median and a 90 % prediction interval for one more draw (`_laws.draw_interval`); with
        # two step laws the weighted median and the hull of both laws' intervals
        alt_mask = np.arange(ratios.size) >= draws - n_alt if w_alt is not None else np.zeros(ratios.size, bool)
        terms = None if measurement_seeds is None else seed_terms(cost[p], cost["uniform"][:n_of[p]])
        mid, lo, hi, ps = mixture_summary(ratios, alt_mask, 0.0 if w_alt is None else w_alt, seed_terms=terms,
                                          measurement_seeds=measurement_seeds)
        v = math.nan if terms is None else pooled_seed_var(terms)
        return PolicyPrediction(p, mid, lo, hi, ps, float(hit[p].mean()), math.nan, float(fd), ratios,
                                n_of[p] < draws, seed_var=v)

    u_cost = np.maximum(cost["uniform"].mean(axis=1), 1e-9)
    # a draw whose uniform run gains nothing has its target at the start: a policy that is there
    # at no cost either does what uniform does (ratio 1), not infinitely better (0 / 1e-9)
    ratio = {p: np.where((cost[p].mean(axis=1) == 0) & (cost["uniform"][:n_of[p]].mean(axis=1) == 0), 1.0,
                         cost[p].mean(axis=1) / u_cost[:n_of[p]]) for p in run_names}  # [D] per draw
    orc = np.minimum(ratio[ORACLES[0]], ratio[ORACLES[1]])
    oracle = summary(min(ORACLES, key=lambda o: np.median(ratio[o])), orc)._replace(policy="oracle")
    preds = []
    for p in run_names[len(head):]:
        pp = summary(p, ratio[p])
        preds.append(pp._replace(captured=captured_share(pp.ratio, oracle.ratio)))
    nan = float("nan")
    preds += [PolicyPrediction(p, nan, nan, nan, nan, nan, nan, nan, np.zeros(0), False, why)
              for p, why in unmodelled.items()]
    # the kept candidates first, best first; the screened-out next; the not-modelled last, unranked
    preds.sort(key=lambda x: (bool(x.not_modelled), x.screened_out, x.ratio if not x.not_modelled else 0.0))
    curves = {p: (grid, np.asarray(acc_grid[p])) for p in run_names}
    each = {o: summary(o, ratio[o]) for o in head[1:]}      # ORACLES, and ALLOCATION_ORACLE when run
    return Prediction(preds, oracle, each, float(np.median(final["uniform"])), float(np.median(base_acc)), curves,
                      int(budget_rollouts), int(pilot_rollouts), steps, b, g, draws, seeds,
                      time.perf_counter() - t0, screen, n_alt, float(rate_sd), heldout_eval, measurement_seeds)
