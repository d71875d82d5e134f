"""Validation of `rlpace advise`: predictions from a 20 % uniform pilot against measured ratios.

Three parts (`--part`):

* `trainer`: the built-in trainer's headroom suites (embedded, ladder, mostly_solved,
  sort_ladder, mostly_solved_last) and the suites built from the other families
  (small_domains, families_parallel). Pilot = uniform's first 20 % of the headroom budget
  (20 of 100 steps, 16 prompts × 8 rollouts, seed 0), recorded through a uniform selection
  whose update appends each batch to a `PilotRecorder` (the recipe has no recorder call
  yet). Predicted ratios (every policy from step 0, as the headroom tables measure them)
  against the measured 8-seed tables of docs/headroom.md, pair by pair (suite × policy); each
  interval is the one for an 8-seed measurement (2 seeds per draw, `--measurement-seeds`).
* `sim`: the simulator's scenarios, the truth measured directly (S seeds per policy), and two
  learners outside the fitted family (misspecified): forgetting plus backward transfer, and a
  uniform (not normal) spread of difficulty inside each domain.
* `speed`: fit + prediction on a 10⁵-prompt pool after a 50-step pilot, default candidates.

Criteria (each printed as met / missed, with the numbers): Spearman(predicted, measured) ≥
0.7 over the policy pairs; measured inside the predicted 90 % interval for ≥ 80 % of pairs;
the recommended policy's measured ratio within 0.1 of the best measured; "no expected saving"
wherever the measured oracle ratio ≥ 0.85×.

Usage:
    python benchmarks/advise.py --part trainer      # ≈ 7 min on 1 core (six suites)
    python benchmarks/advise.py --part sim          # ≈ 15 min
    python benchmarks/advise.py --part speed
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

import rlpace
from rlpace.advise import PilotRecorder

# Measured 8-seed ratios (rollouts to 80 % of uniform's gain / uniform's), docs/headroom.md:
# the suite table and the every-method table. "≥" bounds are taken at their value.
# `recommended` on ladder and mostly_solved: re-measured on this version (docs/headroom.md, note ²:
# 0.76× [0.63, 0.90] and 0.54× [0.37, 0.78]; the 0.46× published before did not reproduce).
MEASURED = {
    # ladder: every row re-measured on this version (docs/headroom.md, note ⁴), the same flags, 8 seeds
    "ladder": {"oracle": 0.46, "recommended": 0.76, "dump": 0.69, "mopps": 0.94, "criticality_is": 0.87,
               "greso": 1.15, "epiplexity": 1.40, "dapo_dynamic_sampling": 1.56},
    "mostly_solved": {"oracle": 0.36, "recommended": 0.54, "dump": 0.42, "mopps": 0.98, "criticality_is": 0.89,
                      "greso": 1.09, "epiplexity": 0.82, "dapo_dynamic_sampling": 1.78},
    # embedded: recommended re-measured on this version with the allocation run (docs/headroom.md, note ³)
    "embedded": {"oracle": 0.92, "recommended": 0.92, "mopps": 1.11},
    # recommended's rows on these two were measured with its earlier defaults (DUMP's T = 0.1)
    "mostly_solved_last": {"oracle": 0.56, "recommended": 0.64, "dump": 0.76},
    "sort_ladder": {"oracle": 0.81, "recommended": 1.02},
    # the suites from the other families, measured for this validation (docs/headroom.md, same flags)
    "small_domains": {"oracle": 0.77, "recommended": 1.09, "dump": 1.28, "mopps": 1.02, "criticality_is": 0.90,
                      "greso": 0.89, "epiplexity": 0.86, "dapo_dynamic_sampling": 1.48},
    # the boundary oracle misses uniform's target on 5 of 8 seeds here (≥2.63×): no saving from it
    "families_parallel": {"oracle": 2.63, "recommended": 1.05, "dump": 1.02, "mopps": 0.88, "criticality_is": 0.94,
                          "greso": 0.97, "epiplexity": 0.99, "dapo_dynamic_sampling": 1.61},
}
TRAINER_POLICIES = ["recommended", "dump", "mopps", "criticality_is", "greso", "epiplexity", "dapo_dynamic_sampling"]
SIM_POLICIES = ["recommended", "dump", "mopps", "learnability_buffer", "dapo_dynamic_sampling", "success_band"]

_RECORD_TO = "RLPACE_ADVISE_PILOT"


@rlpace.policy_factory
def recording_uniform():
    """`uniform` (the same draws: `uniform_pool`'s apply) whose update appends every observed
    batch to the PilotRecorder file named by $RLPACE_ADVISE_PILOT (positions as ids). A
    benchmark device: the built-in recipe has no recorder call yet."""
    from rlpace.policies import compose, uniform_pool
    from rlpace.policies._base import DataPolicy
    from rlpace.types import Feedback
    base = uniform_pool()
    rec = PilotRecorder(os.environ[_RECORD_TO])

    def update(state, pool, batch):
        rec.write(Feedback(batch.prompt_ids, batch.rewards, step=batch.step))
        return state
    return compose(DataPolicy(base.kind, base.init, update, base.apply, name="uniform_pool"), name="uniform")


def spearman(a, b) -> float:
    ra = np.argsort(np.argsort(a)).astype(float)
    rb = np.argsort(np.argsort(b)).astype(float)
    return float(np.corrcoef(ra, rb)[0, 1])


def judge(rows: list[dict], verdicts: dict) -> str:
    """The four criteria over rows {suite, policy, pred, low, high, measured} and per-suite
    verdicts {suite: (recommended or None, predicted oracle, measured oracle)}."""
    measured = [r for r in rows if r["policy"] != "oracle" and r["measured"] is not None]
    pol = [r for r in measured if not r.get("not_modelled")]
    out = [f"{r['suite']}:{r['policy']} ({r['not_modelled']})" for r in measured if r.get("not_modelled")]
    rho = spearman([r["pred"] for r in pol], [r["measured"] for r in pol])
    inside = [r["low"] <= r["measured"] <= r["high"] for r in pol]
    lines = [f"pairs: {len(pol)} (suite × policy, oracles apart)"
             + (f"; left out, not modelled (the simulator has no such signal): {', '.join(out)}" if out else ""),
             f"Spearman(predicted, measured) = {rho:.2f}  ({'met' if rho >= 0.7 else 'missed'}: ≥ 0.7)",
             f"measured inside the predicted 90 % interval: {sum(inside)}/{len(inside)} = "
             f"{np.mean(inside):.0%}  ({'met' if np.mean(inside) >= 0.8 else 'missed'}: ≥ 80 %)"]
    for suite, (rec, pred_oracle, meas_oracle) in verdicts.items():
        meas = {r["policy"]: r["measured"] for r in rows if r["suite"] == suite and r["measured"] is not None
                and r["policy"] != "oracle"}
        best = min(meas.values()) if meas else float("nan")
        if rec is None:
            got = "keep uniform"
            ok_rec = min(best, 1.0) >= 1.0 - 0.1 if meas else True          # uniform is within 0.1 of the best
            gap = 1.0 - best
        else:
            got = rec
            gap = meas.get(rec, float("nan")) - best
            ok_rec = rec in meas and gap <= 0.1
        no_saving_needed = meas_oracle is not None and meas_oracle >= 0.85
        ok_ns = (rec is None) if no_saving_needed else True
        lines.append(f"{suite}: advice {got!r} (predicted oracle {pred_oracle:.2f}×, measured "
                     f"{meas_oracle if meas_oracle is not None else float('nan'):.2f}×); recommended vs best measured: "
                     f"{'+' if gap >= 0 else ''}{gap:.2f} ({'met' if ok_rec else 'missed'} ≤ 0.1"
                     f"{'' if rec is None or rec in meas else '; not in the measured table'})"
                     + (f"; 'no expected saving' required: {'met' if ok_ns else 'missed'}" if no_saving_needed else ""))
    return "\n".join(lines)


def _table(rows) -> str:
    out = ["| suite | policy | predicted [90 %] | P(saving > 10 %) | measured | inside |", "|---|---|---|---|---|---|"]
    for r in rows:
        m = r["measured"]
        if r.get("not_modelled"):
            out.append(f"| {r['suite']} | {r['policy']} | not modelled ({r['not_modelled']}) | | "
                       f"{'' if m is None else f'{m:.2f}×'} | left out |")
            continue
        ins = "" if m is None else ("yes" if r["low"] <= m <= r["high"] else "no")
        out.append(f"| {r['suite']} | {r['policy']} | {r['pred']:.2f}× [{r['low']:.2f}, {r['high']:.2f}] | "
                   f"{r['p_saving']:.0%} | {'' if m is None else f'{m:.2f}×'} | {ins} |")
    return "\n".join(out)


def _model_line(adv) -> str:
    """What the prediction carried besides the fit: the second family, the model error, the eval mode."""
    alt, d, pr = adv.alternative, adv.discrepancy, adv.prediction
    cal = (alt or {}).get("calibration")
    return (f"families: {adv.fit.step_norm} (MAP first)"
            + (f" + {alt['step_norm']} with weight {alt['weight']:.2f} ({alt['draws']} of {pr.draws} draws)" if alt else "")
            + (f" [calibrated by simulated pilots; Δ log lik signal − batch {cal['delta_log_lik']:.2f}, uncalibrated "
               f"weight of signal {cal['raw_weight']:.2f}, calibrated {cal['weight']:.2f}]" if cal else "")
            + f"; shared transfer ω {adv.fit.params.omega:.3f}; model error sd(log rate) "
            + (f"{d.sd_log_rate:.2f}" + (f" ({d.reason})" if d.reason else "") if d is not None else "off")
            + f"; held-out eval {pr.heldout_eval}" + (f" (pilot evals: {adv.evals.get('choice')}, "
                                                     f"{adv.evals.get('evals')} evals)" if adv.evals else "")
            + f"; intervals for a {getattr(pr, 'measurement_seeds', None) or pr.seeds}-seed measurement "
              f"({pr.seeds} seed(s) per draw" + _seed_sd(pr) + ")")


def _seed_sd(pr) -> str:
    """', one seed's sd of the log ratio √v̂ a–b over the candidates' when read within draws."""
    v = [p.seed_var for p in pr.policies if math.isfinite(getattr(p, "seed_var", math.nan))]
    return f"; one seed's sd of log ratio {np.sqrt(min(v)):.3f}–{np.sqrt(max(v)):.3f}" if v else ""


def _rows(suite, adv, measured: dict, oracle: str | None = None) -> list[dict]:
    """Rows of one suite; `oracle` names the one oracle its table ran (None: the better per draw)."""
    pr = adv.prediction
    o = pr.oracle if oracle is None else pr.oracles[oracle]
    return [_row(suite, "oracle", o.ratio, o.low, o.high, o.p_saving, measured)] + [
        _row(suite, p.policy, p.ratio, p.low, p.high, p.p_saving, measured, getattr(p, "not_modelled", ""))
        for p in pr.policies]


def _row(suite, policy, pred, low, high, p_saving, measured: dict, not_modelled=None) -> dict:
    """One (suite, policy) row of the criteria: the prediction and the measured ratio."""
    row = {"suite": suite, "policy": policy, "pred": pred, "low": low, "high": high, "p_saving": p_saving,
           "measured": measured.get(policy)}
    return row if not_modelled is None else {**row, "not_modelled": not_modelled}


# ---- trainer ------------------------------------------------------------------------------
def trainer_part(args) -> tuple[list, dict]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import dataclasses

    import learning_efficiency as le
    from rlpace.advise import advise, read_pilot
    from rlpace.tasks import make_taskset
    from rlpace.tasks._features import prompt_features
    rows, verdicts = [], {}
    out = Path(args.out) / "trainer"
    for suite in args.suites.split(","):
        ns = argparse.Namespace(out=str(out / suite), steps=100, batch_prompts=16, group_size=8, eval_every=10,
                                heldout=64, tasks=suite, mistakes="default", lr=3e-4)
        pilot_steps = int(round(0.2 * ns.steps))
        cfg = dataclasses.replace(le.run_config("uniform", 0, ns), steps=pilot_steps, policy="advise:recording_uniform",
                                  train_per_domain=256, max_rollouts=pilot_steps * 16 * 8,
                                  out=str(out / suite / "pilot_run"))
        path = out / suite / "pilot.jsonl"
        t0 = time.perf_counter()
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".part")
            tmp.unlink(missing_ok=True)
            os.environ[_RECORD_TO] = str(tmp)
            le._run_one(cfg.to_dict())
            tmp.rename(path)
        t_pilot = time.perf_counter() - t0
        tasks = make_taskset(cfg.tasks, train_per_domain=cfg.train_per_domain,
                             heldout_per_domain=cfg.heldout_per_domain, seed=cfg.seed)
        pool = tasks.pool(features=prompt_features(tasks))
        pilot = _with_domain_evals(read_pilot(path), out / suite / "pilot_run" / "metrics.jsonl",
                                   cfg.heldout_per_domain)
        t1 = time.perf_counter()
        # the tables' oracle measured 16 Bernoulli rollouts per prompt every 5 steps (--oracle-every 5
        # --oracle-rollouts 16); --exact-oracle predicts the exact-rate upper bound instead
        orc = {} if args.exact_oracle else {"oracle_every": 5, "oracle_rollouts": 16, "oracle_exact": False}
        # the built-in trainer's held-out accuracy is greedy (TrainConfig.heldout_per_domain): its protocol,
        # known before any measurement
        adv = advise(pilot, pool, budget_rollouts=ns.steps * 16 * 8, policies=TRAINER_POLICIES, draws=args.draws,
                     seeds=args.seeds, from_start=True, step_norm=args.step_norm, oracle=orc, heldout_eval="greedy",
                     model_error=not args.no_model_error, measurement_seeds=_measurement_seeds(args, 8),
                     saturation=args.saturation, heldout_solved=not args.no_heldout_solved)
        print(f"\n## trainer {suite}: pilot {len(pilot.steps)} steps ({t_pilot:.0f} s), fit + prediction "
              f"{time.perf_counter() - t1:.0f} s; fitted lr {adv.fit.params.lr:.3f}, transfer {adv.fit.params.tau:.2f}, "
              f"step_norm {adv.fit.step_norm} (log lik {adv.fit.log_lik:.1f} vs {adv.fit.log_lik_other:.1f})",
              flush=True)
        print(_model_line(adv), flush=True)
        print(adv.sentence, flush=True)
        (out / suite / "advice.json").write_text(json.dumps(_finite(adv.to_json())))
        r = _rows(suite, adv, MEASURED.get(suite, {}), oracle="oracle_boundary")   # the tables ran only it
        print(_table(r), flush=True)
        rows += r
        verdicts[suite] = (adv.recommended, r[0]["pred"], MEASURED.get(suite, {}).get("oracle"))
    return rows, verdicts


def _with_domain_evals(pilot, metrics, n: int):
    """The pilot with the per-domain held-out evaluations of its own run (the trainer's metrics
    file: eval/<domain> at steps 0 and 10 and the final one after step 19; `n` held-out prompts
    per domain), as the trainer's own pilot record carries them: the recording device above
    sees batches only."""
    if not Path(metrics).exists():
        return pilot
    dev = []
    for ln in Path(metrics).read_text().splitlines():
        r = json.loads(ln)
        acc = {k[5:]: float(v) for k, v in r.items() if k.startswith("eval/") and k != "eval/mean"}
        if acc:
            dev.append((int(r["step"]), acc, {d: int(n) for d in acc}))
    return pilot._replace(domain_evals=tuple(dev))


def _measurement_seeds(args, table_seeds: int) -> int | None:
    """The seeds of the measurement each interval must hold: the table's (8 on the trainer,
    --truth-seeds on the simulator) unless --measurement-seeds says otherwise; None (the
    interval for a --seeds-seed measurement) with one seed per draw, where the seed spread
    cannot be read within the draws."""
    m = table_seeds if args.measurement_seeds is None else args.measurement_seeds
    return None if m <= 0 or (args.seeds < 2 and m != args.seeds) else m


def _finite(v):
    from rlpace.advise._advice import _finite as f
    return f(v)


# ---- simulator ----------------------------------------------------------------------------
def _uniform_spread(sc):
    """The scenario's world with each domain's difficulties spread uniformly (same mean and
    sd) instead of normally: outside the fitted family."""
    from rlpace.sim import build_world
    from rlpace.sim._scenarios import World
    w = build_world(sc)
    rng = np.random.default_rng([sc.pool_seed, 0xBAD])
    mu = sc.difficulty_means()
    half = np.sqrt(3.0) * sc.difficulty_sd
    d = mu[w.domain] + rng.uniform(-half, half, w.domain.shape[0])
    held = mu[:, None] + rng.uniform(-half, half, w.heldout.shape)
    return World(w.pool, d, w.domain, w.pool_order, held, w.transfer)


def sim_part(args) -> tuple[list, dict]:
    from rlpace.advise import advise, read_pilot
    from rlpace.evaluation import cost_to_reach, gain_target
    from rlpace.sim import build_world, make_scenario, oracle_kwargs, simulate
    cases = {"ladder": (make_scenario("ladder"), None),
             "homogeneous": (make_scenario("homogeneous"), None),
             "solved_majority": (make_scenario("solved_majority"), None),
             "ladder+forgetting+backward (misspecified)": (make_scenario("ladder", forgetting=0.004,
                                                                         transfer_backward=0.3), None),
             "ladder, uniform spread (misspecified)": (make_scenario("ladder"), "uniform_spread")}
    rows, verdicts = [], {}
    out = Path(args.out) / "sim"
    out.mkdir(parents=True, exist_ok=True)
    steps, b, g = 400, 128, 16
    for name, (sc, variant) in cases.items():
        wanted = [c.strip() for c in args.sim_cases.split(",") if c.strip()]      # a name, "ladder+" or the variant
        if wanted and not any(c == name.split()[0] or (c.endswith("+") and name.startswith(c)) or (variant or "") == c
                              for c in wanted):
            continue
        world = _uniform_spread(sc) if variant else build_world(sc)
        t0 = time.perf_counter()
        path = out / f"{name.split()[0]}_{variant or 'normal'}.jsonl"
        path.unlink(missing_ok=True)
        simulate(sc, "uniform", steps=steps // 5, seed=0, batch_size=b, group_size=g, world=world,
                 record=PilotRecorder(path, pool=world.pool))
        pilot = read_pilot(path)
        adv = advise(pilot, world.pool, budget_rollouts=steps * b * g, policies=SIM_POLICIES, draws=args.draws,
                     seeds=args.seeds, from_start=True, step_norm=args.step_norm,
                     model_error=not args.no_model_error, measurement_seeds=_measurement_seeds(args, args.truth_seeds))
        t_pred = time.perf_counter() - t0
        # the truth: every policy on the true world, S seeds, paired with uniform
        t1 = time.perf_counter()
        costs = {}
        for p in ["uniform", "oracle_boundary", "oracle_progress", *SIM_POLICIES]:
            cs = []
            for s in range(args.truth_seeds):
                kw = oracle_kwargs(sc, p, g)
                r = simulate(sc, p, steps=steps, seed=100 + s, batch_size=b, group_size=g, eval_every=10, world=world,
                             policy_kwargs=kw, measure_every=1 if p.startswith("oracle_") else 0)
                cs.append((r.eval_rollouts.astype(float), r.mean_accuracy))
            costs[p] = cs
        meas = {}
        for p, cs in costs.items():
            num = den = 0.0
            for (x, a), (xu, au) in zip(cs, costs["uniform"]):
                tgt = gain_target(au[0], au[-1])
                num += cost_to_reach(x, a, tgt)[0]
                den += cost_to_reach(xu, au, tgt)[0]
            meas[p] = num / den
        meas["oracle"] = min(meas.pop("oracle_boundary"), meas.pop("oracle_progress"))
        print(f"\n## sim {name}: pilot + fit + prediction {t_pred:.0f} s, truth {args.truth_seeds} seeds "
              f"{time.perf_counter() - t1:.0f} s; fitted lr {adv.fit.params.lr:.3f} (true {sc.lr}), transfer "
              f"{adv.fit.params.tau:.2f} (true fwd {sc.transfer_forward}, bwd {sc.transfer_backward}), forgetting "
              f"{sc.forgetting}", flush=True)
        print(_model_line(adv), flush=True)
        print(adv.sentence, flush=True)
        r = _rows(name, adv, meas)
        print(_table(r), flush=True)
        rows += r
        verdicts[name] = (adv.recommended, adv.prediction.oracle.ratio, meas["oracle"])
        # every draw's ratios and the truth, for `--rejudge` (the advice rule re-applied at another level)
        (out / f"{name.split()[0]}_{variant or 'normal'}.advice.json").write_text(
            json.dumps(_finite({**adv.to_json(), "suite": name, "measured": meas})))
    return rows, verdicts


# ---- the advice rule re-applied to saved predictions ---------------------------------------
def decide(advice: dict, level: float):
    """`rlpace.advise.choose_policy` on an advice.json's per-draw ratios: what `advise` would
    have recommended at `level` (the prediction itself does not depend on it)."""
    from rlpace.advise._advice import choose_policy, draw_weights
    alt = advice.get("alternative_family") or {}
    d = len(advice["oracle"]["ratio_per_draw"])
    ratios = {p["policy"]: np.asarray([math.inf if v is None else v for v in p["ratio_per_draw"]])
              for p in advice["policies"] if not p.get("not_modelled") and not p.get("screened_out")}
    oracle = np.asarray([math.inf if v is None else v for v in advice["oracle"]["ratio_per_draw"]])
    w = draw_weights(d, int(alt.get("draws") or 0), alt.get("weight"))
    return choose_policy(ratios, oracle, w, level=level)


def rejudge(args) -> None:
    """The criteria again from a finished run's saved predictions (`--out`), the advice taken
    by `choose_policy` at each of `--levels`: Spearman and the intervals are the run's own."""
    out = Path(args.out)
    files = (sorted((out / "trainer").glob("*/advice.json")) if args.part == "trainer"
             else sorted((out / "sim").glob("*.advice.json")))
    if (out / f"{args.part}.json").exists():
        rows = json.loads((out / f"{args.part}.json").read_text())["rows"]
    else:                                   # a run stopped early: the rows of the suites it finished
        rows = []
        for f in files:
            a = json.loads(f.read_text())
            suite = a.get("suite") or f.parent.name
            meas = a["measured"] if "measured" in a else MEASURED.get(suite, {})
            o = a["oracles"]["oracle_boundary"] if args.part == "trainer" else a["oracle"]
            rows.append(_row(suite, "oracle", o["ratio"], *o["ratio_90"], o["p_saving_gt_10pct"], meas))
            rows += [_row(suite, p["policy"], p["ratio"], *p["ratio_90"], p["p_saving_gt_10pct"], meas,
                          p.get("not_modelled") or "") for p in a["policies"]]
    for level in [float(v) for v in args.levels.split(",")]:
        verdicts = {}
        for f in files:
            a = json.loads(f.read_text())
            suite = a.get("suite") or f.parent.name
            c = decide(a, level)
            pred_oracle = next(r["pred"] for r in rows if r["suite"] == suite and r["policy"] == "oracle")
            meas_oracle = next(r["measured"] for r in rows if r["suite"] == suite and r["policy"] == "oracle")
            verdicts[suite] = (c.policy, pred_oracle, meas_oracle)
            print(f"level {level:.2f} {suite}: {c.policy or 'keep uniform'} ({c.reason or 'switch'}; "
                  f"P(saving > 10 %) {c.p_saving:.2f}, oracle {c.oracle_p_saving:.2f}; expected regret "
                  + ", ".join(f"{p} {v:.3f}" for p, v in sorted(c.regret.items(), key=lambda kv: kv[1])[:4]) + ")")
        print(f"\n# {args.part}, level {level:.2f}: criteria\n{judge(rows, verdicts)}\n", flush=True)


# ---- speed --------------------------------------------------------------------------------
def speed_part(args) -> None:
    from rlpace.advise import advise, read_pilot
    from rlpace.sim import build_world, make_scenario, simulate
    sc = make_scenario("ladder", prompts_per_domain=8334)               # 100,008 prompts
    w = build_world(sc)
    path = Path(args.out) / "speed_pilot.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    simulate(sc, "uniform", steps=50, seed=0, batch_size=128, group_size=16, record=PilotRecorder(path, pool=w.pool))
    pilot = read_pilot(path)
    import resource

    def cpu():
        return sum(resource.getrusage(who).ru_utime + resource.getrusage(who).ru_stime
                   for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    load0, c0, t0 = os.getloadavg(), cpu(), time.perf_counter()
    kw = {} if args.legacy_speed else {"screen": args.screen}
    adv = advise(pilot, w.pool, budget_rollouts=250 * 128 * 16, draws=args.draws, seeds=1, jobs=args.jobs,
                 progress=lambda s: print(s, flush=True), **kw)
    dt, dc, load1 = time.perf_counter() - t0, cpu() - c0, os.getloadavg()
    pr = adv.prediction
    kept = sum(not p.screened_out for p in pr.policies) if hasattr(pr.policies[0], "screened_out") else len(pr.policies)
    print(f"\nspeed: pool {len(w.pool):,} prompts, pilot 50 steps × 128 × 16, budget 250 steps, "
          f"{len(pr.policies)} candidates + uniform + 2 oracles × {args.draws} draws "
          f"(screening: {getattr(pr, 'screen', 0)} draws, {kept} candidates kept): fit + prediction {dt:.0f} s wall, "
          f"{dc:.0f} s CPU with {args.jobs} process(es) ({'met' if dt <= 120 else 'missed'}: ≤ 120 s on 2 cores); "
          f"load average {load0[0]:.1f} → {load1[0]:.1f}")
    print(adv.sentence)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", default="trainer", choices=["trainer", "sim", "speed"])
    ap.add_argument("--suites",
                    default="embedded,ladder,mostly_solved,sort_ladder,mostly_solved_last,small_domains,"
                            "families_parallel")
    ap.add_argument("--sim-cases", default="",
                    help="comma list of cases: ladder, homogeneous, solved_majority, ladder+ (forgetting), "
                         "uniform_spread (default: all)")
    ap.add_argument("--draws", type=int, default=8)
    ap.add_argument("--seeds", type=int, default=2,
                    help="simulated runs per draw (≥ 2: the seed spread is read within the draws)")
    ap.add_argument("--measurement-seeds", type=int, default=None,
                    help="the intervals hold a measurement over this many seeds (default: the table's, 8 on the "
                         "trainer, --truth-seeds on the simulator; 0 = --seeds)")
    ap.add_argument("--truth-seeds", type=int, default=4)
    ap.add_argument("--exact-oracle", action="store_true",
                    help="trainer part: predict the exact-rate oracle, not the tables' measured one")
    ap.add_argument("--step-norm", default="mixture", choices=["auto", "batch", "signal", "mixture"],
                    help="the fitted learner's step normalisation (rlpace.advise.fit_learner)")
    ap.add_argument("--saturation", default="auto", choices=["auto", "on", "off"],
                    help="trainer part: the fitted learner's skill cap (rlpace.advise.fit_learner's saturation)")
    ap.add_argument("--no-heldout-solved", action="store_true",
                    help="trainer part: leave the held-out solved share unfitted (the family before it)")
    ap.add_argument("--jobs", type=int, default=1, help="speed part: worker processes")
    ap.add_argument("--no-model-error", action="store_true",
                    help="leave the model's error read from the pilot out of the draws (the fit's uncertainty only)")
    ap.add_argument("--screen", type=int, default=None,
                    help="speed part: screening draws (default: advise's own choice; 0 = every candidate on every draw)")
    ap.add_argument("--legacy-speed", action="store_true",
                    help="speed part: call advise with the arguments the code before screening took (to time it)")
    ap.add_argument("--out", default="runs/bench/advise")
    ap.add_argument("--rejudge", action="store_true",
                    help="re-apply the advice rule to the saved predictions of a finished --part run in --out")
    ap.add_argument("--levels", default="0.5",
                    help="--rejudge: comma list of levels (the P(saving > 10 %%) the advice needs)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    if args.rejudge:
        rejudge(args)
        return 0
    if args.part == "speed":
        speed_part(args)
        return 0
    rows, verdicts = (trainer_part if args.part == "trainer" else sim_part)(args)
    print(f"\n# {args.part}: criteria\n{judge(rows, verdicts)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.part}.json").write_text(json.dumps({"rows": rows, "verdicts": verdicts}, default=str))
    print(f"\n({(time.perf_counter() - t0) / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
