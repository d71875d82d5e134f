"""The advice: checks, fit, prediction, and what `rlpace advise` prints and writes.

`advise(...)` checks every input before any work (a pilot of another pool, a pilot too
short, rewards outside the declared range, a budget not larger than the pilot: each an
`InputError` naming the fix, nothing written), fits the learner, predicts, and returns an
`Advice` whose `to_json()` is advice.json and `html()` advice.html.
"""

from __future__ import annotations

import html as _html
import json
import math
import platform
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..errors import InputError
from ..types import Pool
from ._fit import Discrepancy, LearnerFit, fit_heldout_solved, fit_learner, predicted_evals, rate_discrepancy
from ._laws import draw_law_weights, law_weight, stratified_draws
from ._predict import Prediction, check_prediction_args, predict
from ._record import Pilot, load_pilot

#: advise's step laws: fit_learner's, or "mixture" (both, weighed by `_laws.law_weight`)
STEP_NORMS = ("mixture", "batch", "signal", "auto")

__all__ = ["Advice", "advise", "MIN_PILOT_STEPS", "SAVING_BAR", "SAVING_LEVEL", "Choice", "choose_policy",
           "draw_weights", "usage_lines", "load_pool"]

#: a training pilot needs this many steps: lr and transfer are read from how pass rates move
MIN_PILOT_STEPS = 10
#: a saving below this share is "no expected saving"
SAVING_BAR = 0.10
#: advise recommends a switch only when the chosen policy saves more than SAVING_BAR on at
#: least this (weighted) share of the fit's draws (`choose_policy`); read from the simulator's
#: scenarios, where the truth is measured directly (docs/advise.md, section 4)
SAVING_LEVEL = 0.3
#: ratios are clipped to [1/RATIO_CLIP, RATIO_CLIP] before their log: a draw where a policy
#: never reaches the target (or uniform reaches it at no cost) weighs as a large, finite loss
RATIO_CLIP = 1e3


class Choice(NamedTuple):
    policy: str | None      # None: keep uniform
    regret: dict            # name -> expected regret Σ_j w_j (log r_pj − min_q log r_qj), "uniform" included
    p_saving: float         # Σ_j w_j [r_pj < 1 − SAVING_BAR] of the chosen policy (of the oracle when none)
    oracle_p_saving: float  # the same for the oracle
    reason: str             # "" (a switch), "headroom" (the oracle itself is unlikely to save), "candidates"


def draw_weights(draws: int, alternative_draws: int = 0, weight_alt: float | None = None) -> np.ndarray:
    """float64[D] each draw's weight (summing to 1): alike, or with a second step law the last
    `alternative_draws` share `weight_alt` and the others 1 − weight_alt (`_laws.mixture_summary`'s).

    >>> draw_weights(4, 1, 0.25).tolist()
    [0.25, 0.25, 0.25, 0.25]
    >>> draw_weights(4, 2, 0.2).tolist()
    [0.4, 0.4, 0.1, 0.1]
    """
    d, n = int(draws), int(alternative_draws)
    return draw_law_weights(np.arange(d) >= d - n if n and weight_alt is not None else np.zeros(d, bool),
                            0.0 if weight_alt is None else weight_alt)


def choose_policy(ratios: dict, oracle: np.ndarray, weights: np.ndarray, *, level: float = SAVING_LEVEL,
                  bar: float = SAVING_BAR) -> Choice:
    """The advice as a decision under the fit's uncertainty, not from the point estimates.

    `ratios`: name -> float64[D] each candidate's ratio on the D draws (paired: draw j is the
    same learner for every policy; a candidate with fewer than D — dropped after screening —
    is not eligible); `oracle` float64[D]; `weights` float64[D] (`draw_weights`).
    Rule: with L_pj = log r_pj (uniform's 0; r clipped to [1/RATIO_CLIP, RATIO_CLIP]) and
    L*_j = min over the eligible candidates and uniform, the expected regret of p is
    Σ_j w_j (L_pj − L*_j) (relative extra cost against the best choice had the draw been
    known); the choice minimises it (uniform wins ties). The choice is kept only when it
    saves more than `bar` with probability ≥ `level` over the draws, and nothing is
    recommended when even the oracle does not; otherwise keep uniform.

    >>> w = np.full(4, 0.25)
    >>> c = choose_policy({"a": np.array([0.5, 0.6, 1.2, 0.7]), "b": np.array([0.8, 0.8, 0.8, 0.8])},
    ...                   np.array([0.4, 0.5, 0.6, 0.5]), w)
    >>> c.policy, round(c.p_saving, 2), round(c.regret["uniform"], 4)
    ('a', 0.75, 0.4459)
    """
    w = np.asarray(weights, np.float64)
    d = w.size
    logs = {"uniform": np.zeros(d)}
    for p, r in ratios.items():
        r = np.asarray(r, np.float64)
        if r.size == d:
            logs[p] = np.log(np.clip(np.nan_to_num(r, nan=RATIO_CLIP), 1.0 / RATIO_CLIP, RATIO_CLIP))
    best = np.min(np.stack(list(logs.values())), axis=0)                             # [D]
    regret = {p: float(w @ (v - best)) for p, v in logs.items()}
    pick = min(logs, key=lambda p: (regret[p], p != "uniform"))                      # dict order breaks other ties

    def p_save(r):
        return float(w @ (np.asarray(r, np.float64) < 1.0 - bar))
    po = p_save(oracle)
    if po < level:
        return Choice(None, regret, po, po, "headroom")
    ps = 0.0 if pick == "uniform" else p_save(ratios[pick])
    if pick == "uniform" or ps < level:
        return Choice(None, regret, ps, po, "candidates")
    return Choice(pick, regret, ps, po, "")


class Advice(NamedTuple):
    fit: LearnerFit
    prediction: Prediction
    recommended: str | None      # None: keep uniform
    sentence: str
    pilot: dict                  # what the pilot was: kind, steps, groups, rollouts
    discrepancy: Discrepancy | None = None   # the model's error read from the pilot (None: not used)
    alternative: dict | None = None   # the second family's step_norm, posterior weight and draws (mixture)
    evals: dict | None = None    # the pilot's held-out evaluations vs the fit's, and the eval mode used
    choice: Choice | None = None  # the decision behind `recommended` (`choose_policy`)
    choice_level: float = SAVING_LEVEL   # the level it was taken at

    def table(self) -> str:
        pr = self.prediction
        rows = [("policy", "rollouts to 80% of uniform's gain / uniform [90% interval]", "P(saving>10%)",
                 "captured", "reached")]
        o = pr.oracle
        rows.append(("oracle (headroom)", f"{o.ratio:.2f}× [{o.low:.2f}, {o.high:.2f}]", f"{o.p_saving:.0%}", "", ""))
        oa = pr.oracles.get("oracle_allocation")            # run when a candidate allocates rollouts
        if oa is not None:
            rows.append(("oracle_allocation (allocation's headroom)", f"{oa.ratio:.2f}× [{oa.low:.2f}, {oa.high:.2f}]",
                         f"{oa.p_saving:.0%}", "", f"{oa.reached:.0%}"))
        for p in pr.policies:
            if p.not_modelled:
                rows.append((p.policy, f"not modelled: the simulator has no {p.not_modelled}", "", "", ""))
                continue
            cap = "" if not math.isfinite(p.captured) else f"{p.captured:.0%}"
            name = p.policy + (f" (dropped after {pr.screen} draws)" if p.screened_out else "")
            rows.append((name, f"{p.ratio:.2f}× [{p.low:.2f}, {p.high:.2f}]", f"{p.p_saving:.0%}", cap,
                         f"{p.reached:.0%}"))
        w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        return "\n".join("  ".join(c.ljust(w[i]) for i, c in enumerate(r)) for r in rows)

    def to_json(self) -> dict:
        from .. import __version__
        pr = self.prediction

        def row(p):
            return {"policy": p.policy, "ratio": p.ratio, "ratio_90": [p.low, p.high], "p_saving_gt_10pct": p.p_saving,
                    "reached": p.reached, "captured_share": None if not math.isfinite(p.captured) else p.captured,
                    "final_diff_vs_uniform": p.final_diff, "ratio_per_draw": p.ratios.tolist(),
                    "screened_out": p.screened_out, "not_modelled": getattr(p, "not_modelled", "") or None,
                    "seed_var_log_ratio": p.seed_var if math.isfinite(p.seed_var) else None}
        import scipy
        return {"recommended": self.recommended, "sentence": self.sentence,
                "usage": usage_lines(self.recommended or "uniform"),
                "oracle": row(pr.oracle), "oracles": {o: row(v) for o, v in pr.oracles.items()},
                "policies": [row(p) for p in pr.policies],
                "uniform": {"base": pr.base, "final": pr.uniform_final},
                "budget_rollouts": pr.budget_rollouts, "pilot_rollouts": pr.pilot_rollouts,
                "simulated_steps": pr.steps, "batch_size": pr.batch_size, "group_size": pr.group_size,
                "draws": pr.draws, "seeds": pr.seeds, "measurement_seeds": pr.measurement_seeds or pr.seeds,
                "seconds": pr.seconds, "pilot": self.pilot,
                "fit": self.fit.to_json(), "screen_draws": pr.screen,
                "model_error": None if self.discrepancy is None else self.discrepancy.to_json(),
                "heldout_eval": pr.heldout_eval, "heldout_eval_check": self.evals,
                "alternative_family": self.alternative,
                "decision": None if self.choice is None else {
                    "rule": "least expected regret over the draws, kept when P(saving > 10 %) >= level",
                    "level": self.choice_level, "policy": self.choice.policy, "reason": self.choice.reason,
                    "p_saving_gt_10pct": self.choice.p_saving, "oracle_p_saving_gt_10pct": self.choice.oracle_p_saving,
                    "expected_regret_log": self.choice.regret},
                "curves": {p: {"rollouts": x.tolist(), "accuracy_median": np.median(a, axis=0).tolist(),
                               "accuracy_05": np.quantile(a, 0.05, axis=0).tolist(),
                               "accuracy_95": np.quantile(a, 0.95, axis=0).tolist()}
                           for p, (x, a) in pr.curves.items()},
                "versions": {"rlpace": __version__, "numpy": np.__version__, "scipy": scipy.__version__,
                             "python": platform.python_version()}}

    def html(self) -> str:
        """A self-contained page: the table and predicted accuracy-vs-rollouts curves (median
        over draws, 5–95 % band) for uniform, the oracle and the three best candidates."""
        pr = self.prediction
        shown = ["uniform", min(("oracle_boundary", "oracle_progress"),
                                key=lambda o: np.median(pr.curves[o][1][:, -1]) * -1)]
        shown += [p.policy for p in pr.policies if not p.not_modelled][:3]
        w, h, pad = 720, 360, 48
        xs = pr.curves["uniform"][0]
        lo_y = min(float(np.quantile(pr.curves[p][1], 0.05, axis=0).min()) for p in shown)
        hi_y = max(float(np.quantile(pr.curves[p][1], 0.95, axis=0).max()) for p in shown)
        span = max(hi_y - lo_y, 1e-6)

        def px(x, y):
            return pad + (w - 2 * pad) * x / max(xs[-1], 1), h - pad - (h - 2 * pad) * (y - lo_y) / span
        colors = ["#555", "#999", "#1f77b4", "#d62728", "#2ca02c"]
        parts = []
        for c, p in zip(colors, shown):
            x, a = pr.curves[p]
            lo, md, hi = np.quantile(a, 0.05, axis=0), np.median(a, axis=0), np.quantile(a, 0.95, axis=0)
            band = [px(xi, yi) for xi, yi in zip(x, hi)] + [px(xi, yi) for xi, yi in zip(x[::-1], lo[::-1])]
            parts.append(f'<polygon points="{" ".join(f"{u:.1f},{v:.1f}" for u, v in band)}" fill="{c}" '
                         f'fill-opacity="0.15" stroke="none"/>')
            parts.append(f'<polyline points="{" ".join(f"{u:.1f},{v:.1f}" for u, v in (px(xi, yi) for xi, yi in zip(x, md)))}" '
                         f'fill="none" stroke="{c}" stroke-width="2"><title>{_html.escape(p)}</title></polyline>')
        legend = "".join(f'<span style="color:{c}">■ {_html.escape(p)}</span> ' for c, p in zip(colors, shown))
        axes = (f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="#000"/>'
                f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{h - pad}" stroke="#000"/>'
                f'<text x="{w / 2}" y="{h - 10}" text-anchor="middle">rollouts (pilot included), 0 … {int(xs[-1]):,}</text>'
                f'<text x="12" y="{pad - 10}">held-out accuracy {lo_y:.3f} … {hi_y:.3f}</text>')
        usage = "\n".join(f"<h3>{k}</h3><pre>{_html.escape(v)}</pre>" for k, v in usage_lines(self.recommended or "uniform").items())
        return (f"<!doctype html><meta charset='utf-8'><title>rlpace advise</title>"
                f"<h1>rlpace advise</h1><p><b>{_html.escape(self.sentence)}</b></p>"
                f"<pre>{_html.escape(self.table())}</pre>"
                f"<p>Predicted held-out accuracy vs rollouts: median over {pr.draws} learners drawn from the fit, "
                f"band 5–95 %.</p><svg width='{w}' height='{h}'>{axes}{''.join(parts)}</svg><p>{legend}</p>"
                f"<h2>Use it</h2>{usage}")


def usage_lines(policy: str) -> dict:
    """The lines that run `policy` in verl, TRL and the built-in trainer (docs/engines.md)."""
    return {"verl": ("python -m verl.trainer.main_ppo data.custom_cls.path=pkg://rlpace.adapters.verl "
                     f"data.custom_cls.name=RlpaceDataset data.shuffle=False data.dataloader_num_workers=0 "
                     f"+data.rlpace.policy={policy} ...your usual overrides..."),
            "trl": f"RlpaceGRPOTrainer(..., scheduler=Scheduler(pool, \"{policy}\", seed=0))",
            "built-in": f"rlpace train policy={policy} ..."}


def load_pool(path) -> Pool:
    """The pool a pilot ran on: verl-schema parquet (needs pyarrow) or JSON Lines."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(2, "No such file", str(p))
    return Pool.from_jsonl(p) if p.suffix in (".jsonl", ".json") else Pool.from_parquet(p)


def check_pilot(pilot: Pilot, pool: Pool, budget_rollouts: int) -> None:
    """Every input check before any work (see the module docstring)."""
    pilot.positions(pool)
    n = len(pilot.steps)
    if pilot.kind == "training" and n < MIN_PILOT_STEPS:
        raise InputError(f"the pilot has {n} training step{'s' if n != 1 else ''}; the fit reads the learning rate "
                         f"from how pass rates move and needs {MIN_PILOT_STEPS}: run {MIN_PILOT_STEPS - n} more "
                         f"step{'s' if MIN_PILOT_STEPS - n != 1 else ''} (or pass a zero-training profile).")
    if int(budget_rollouts) <= pilot.rollouts:
        raise InputError(f"--budget-rollouts {budget_rollouts} is not larger than the pilot's {pilot.rollouts} "
                         f"rollouts; give the whole run's budget, pilot included.")


def check_level(level) -> None:
    """InputError unless 0 < level ≤ 1 (`choose_policy`'s level; the CLI's --saving-level)."""
    if (isinstance(level, bool) or not isinstance(level, (int, float, np.number)) or not math.isfinite(level)
            or not 0.0 < level <= 1.0):
        raise InputError(f"level (--saving-level: the probability of a saving > 10 % the advice needs) must lie "
                         f"in (0, 1]; got {level!r}.")


def check_advise_args(*, budget_rollouts, policies=None, draws=8, seeds=1, jobs=1, step_norm="mixture",
                      heldout_eval="auto", screen=None, law_replicates=8, measurement_seeds=None,
                      level=SAVING_LEVEL) -> None:
    """InputError naming the field for a bad argument of `advise`, before any work (the pilot's
    load, the fits, a trainer pilot: the CLI calls it first). The prediction's own arguments
    are `check_prediction_args`'s, the one place they are checked."""
    if (isinstance(budget_rollouts, bool) or not isinstance(budget_rollouts, (int, float, np.number))
            or int(budget_rollouts) != budget_rollouts or budget_rollouts < 1):
        raise InputError(f"budget_rollouts (--budget-rollouts) must be a positive integer; got {budget_rollouts!r}.")
    if step_norm not in STEP_NORMS:
        raise InputError(f"step_norm must be one of {STEP_NORMS}; got {step_norm!r}.")
    check_level(level)
    if step_norm == "mixture" and (isinstance(law_replicates, bool) or not isinstance(law_replicates, (int, np.integer))
                                   or law_replicates < 2):
        raise InputError(f"law_replicates must be an integer ≥ 2 (a spread needs two); got {law_replicates!r}.")
    check_prediction_args(draws=draws, seeds=seeds, jobs=jobs, screen=screen, measurement_seeds=measurement_seeds,
                          heldout_eval=heldout_eval, policies=None if policies is None else list(policies))


def advise(pilot: Pilot | str | Path, pool: Pool | str | Path, *, budget_rollouts: int,
           policies: list[str] | None = None, draws: int = 8, seeds: int = 1, seed: int = 0,
           from_start: bool = False, step_norm: str = "mixture", jobs: int = 1, oracle: dict | None = None,
           progress=None, heldout_eval: str = "auto", model_error: bool = True, screen: int | None = None,
           law_replicates: int = 8, measurement_seeds: int | None = None, saturation: str = "auto",
           heldout_solved: bool = True, level: float = SAVING_LEVEL) -> Advice:
    """Fit the learner to the pilot and predict every candidate's saving.

    `heldout_eval`: "sampled", "greedy" or "auto" (the mode that predicts the pilot's own
    held-out evaluations better, `predicted_evals`; "sampled" without two of them).
    `step_norm`: "batch", "signal", "auto" (`fit_learner`'s) or "mixture" (both: their weight
    calibrated on `law_replicates` pilots simulated from each, `_laws.law_weight`; a law
    below `_laws.TAIL` is dropped, otherwise half the draws each and the interval spans both,
    `_laws.mixture_summary`).
    `model_error`: carry the model's error read from the pilot (`rate_discrepancy`) into the
    draws, besides the fit's uncertainty. `screen`, `measurement_seeds` (the intervals hold
    an M-seed paired measurement; needs seeds ≥ 2): `predict`'s.
    `saturation`: the skill cap, `fit_learner`'s ("auto": kept only where the pilot's likelihood
    supports it; "on": always, its uncertainty in the draws; "off": the linear learner).
    `heldout_solved`: fit each domain's held-out solved share to the pilot's per-domain held-out
    evaluations (`fit_heldout_solved`: kept only where it beats the training prompts' share by
    a likelihood-ratio test; a pilot without them keeps the family as it was); False: never.
    `level`: the advice (`choose_policy`) is the policy of least expected regret over the
    draws, kept when it saves more than 10 % with probability ≥ `level`; else keep uniform.

    Example:
        >>> adv = advise("pilot.jsonl", "train.parquet", budget_rollouts=400_000)   # doctest: +SKIP
        >>> print(adv.sentence)                                                     # doctest: +SKIP
        expected saving 38 % [22, 51] with `recommended`; the oracle's 55 %
    """
    check_advise_args(budget_rollouts=budget_rollouts, policies=policies, draws=draws, seeds=seeds, jobs=jobs,
                      step_norm=step_norm, heldout_eval=heldout_eval, screen=screen, law_replicates=law_replicates,
                      measurement_seeds=measurement_seeds, level=level)
    pilot = load_pilot(pilot) if not isinstance(pilot, Pilot) else pilot
    pool = load_pool(pool) if not isinstance(pool, Pool) else pool
    check_pilot(pilot, pool, int(budget_rollouts))
    alt = None
    if step_norm == "mixture":
        # the two step normalisations fit a uniform pilot about equally well (docs/advise.md):
        # draws from each in proportion to its posterior weight (equal prior odds, the same
        # number of parameters), the likelier one's MAP first
        # the two step laws fit a uniform pilot about equally well (docs/advise.md): their weight
        # is read from simulated pilots of each (how far a likelihood difference this size
        # moves the odds), the likelier law's MAP first; a law that keeps weight gets half
        # the draws and the interval spans both (`_laws`)
        fb, fs = (fit_learner(pilot, pool, step_norm=n, saturation=saturation) for n in ("batch", "signal"))
        lw = law_weight(fs, fb, pool, replicates=law_replicates, seed=seed, jobs=jobs)
        fit, other = (fs, fb) if lw.weight_a >= 0.5 else (fb, fs)
        w_other = min(lw.weight_a, 1.0 - lw.weight_a)
        fit, other = fit._replace(log_lik_other=other.log_lik), other._replace(log_lik_other=fit.log_lik)
        alt = (other, stratified_draws(draws, w_other), w_other, lw)
    else:
        fit = fit_learner(pilot, pool, step_norm=step_norm, saturation=saturation)
    evals = predicted_evals(pilot, fit)
    mode = evals["choice"] if heldout_eval == "auto" else heldout_eval
    if heldout_solved:
        # the held-out set's own solved share (a base that memorised its training prompts): the
        # metric fitted to the held-out evaluations, the dynamics to the training rewards
        fit = fit_heldout_solved(pilot, fit, mode)
        if alt is not None:
            alt = (fit_heldout_solved(pilot, alt[0], mode), *alt[1:])
    disc = rate_discrepancy(pilot, pool, fit) if model_error else None
    pr = predict(fit, pool, budget_rollouts=int(budget_rollouts), pilot_rollouts=pilot.rollouts, policies=policies,
                 draws=draws, seeds=seeds, seed=seed, from_start=from_start, jobs=jobs,
                 progress=progress, screen=screen, rate_sd=0.0 if disc is None else disc.sd_log_rate,
                 heldout_eval=mode, alternative=None if alt is None else alt[:3], measurement_seeds=measurement_seeds,
                 **(oracle or {}))
    ranked = [p for p in pr.policies if not p.not_modelled]
    o = pr.oracle
    choice = choose_policy({p.policy: p.ratios for p in ranked if not p.screened_out}, o.ratios,
                           draw_weights(pr.draws, pr.alternative_draws, None if alt is None else alt[2]),
                           level=level)
    if choice.reason == "headroom":
        rec, sentence = None, (f"no expected saving: headroom ≤ 10 % (oracle {o.ratio:.2f}×, P(saving > 10 %) "
                               f"{choice.oracle_p_saving:.1%} < {level:.0%}); keep uniform")
    elif choice.reason:
        which = "no candidate" if ranked else "no candidate the simulator can model"
        rec, sentence = None, (f"no expected saving: {which} saves more than 10 % with probability ≥ {level:.0%} "
                               f"(the oracle's {1 - o.ratio:.0%}); keep uniform")
    else:
        rec = choice.policy
        best = next(p for p in ranked if p.policy == rec)
        sentence = (f"expected saving {1 - best.ratio:.0%} [{1 - best.high:.0%}, {1 - best.low:.0%}] with "
                    f"`{rec}` (P(saving > 10 %) {choice.p_saving:.0%}); the oracle's {1 - o.ratio:.0%}")
    if not fit.identifiable_dynamics:
        sentence += " (zero-training profile: learning rate and transfer from the prior; a training pilot is sharper)"
    info = {"kind": pilot.kind, "steps": int(len(pilot.steps)), "groups": int(pilot.rewards.shape[0]),
            "rollouts": pilot.rollouts, "evals": len(pilot.evals)}
    if alt is not None and pr.alternative_draws:
        sentence += "; the pilot does not tell the two step laws apart, the interval spans both"
    alt_info = None if alt is None else {"step_norm": alt[0].step_norm, "weight": alt[2], "draws": pr.alternative_draws,
                                         "separable": pr.alternative_draws == 0, "log_lik": alt[0].log_lik,
                                         "calibration": {"law_a": "signal", "law_b": "batch", **alt[3].to_json()},
                                         "fit": alt[0].to_json()}
    return Advice(fit, pr, rec, sentence, info, discrepancy=disc, evals=evals, alternative=alt_info, choice=choice,
                  choice_level=float(level))


def write_advice(adv: Advice, out) -> tuple[Path, Path]:
    """advice.json and advice.html into `out` (created)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    j, h = out / "advice.json", out / "advice.html"
    j.write_text(json.dumps(_finite(adv.to_json()), indent=1, allow_nan=False), encoding="utf-8")
    h.write_text(adv.html(), encoding="utf-8")
    return j, h


def _finite(v):
    """NaN and ±inf as null, recursively (JSON has neither)."""
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    if isinstance(v, (float, np.floating)):
        return float(v) if math.isfinite(v) else None
    if isinstance(v, (np.integer, np.bool_)):
        return v.item()
    return v
