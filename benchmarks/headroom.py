"""Headroom: how much could any scheduler save on a setup, and how much of it does each
policy capture? (not a timed test)

For each suite, uniform vs the oracles vs every registered proposal and admission policy,
over S seeds (runs with one seed are paired):

* rollouts to 80% of uniform's gain, as a ratio to uniform's with a paired 95% bootstrap CI
  (`rlpace.evaluation.efficiency_vs_baseline`: target_s = base_s + 0.8·(uniform final_s −
  base_s), linear interpolation between evaluations, refills and probes counted; "≥" marks
  a bound: the policy missed the target on some seed and counts its own budget there);
* final accuracy Δ vs uniform (paired 95% bootstrap CI), informative fraction (share of
  generated groups with a non-zero GRPO advantage), area under accuracy vs rollouts as a
  ratio (> 1 better), steps ratio (secondary);
* headroom = the best oracle's ratio (`oracle_boundary`: top-B prompts by true p(1 − p);
  `oracle_progress`: the domain with the largest true expected accuracy gain;
  docs/methods/oracle.md). Their measurement rollouts are *not* charged: the oracle is an
  upper bound, not a method. Each policy's captured share = (1 − ratio) / (1 − oracle ratio).
  `--oracles ...,oracle_allocation` adds the allocation headroom (Knapsack RL's DP on the
  true pass rates; docs/methods/knapsack.md).
* allocation policies (`knapsack`, `gvm`, `recommended+knapsack`, ...) run like any other:
  each step's B·G rollouts are split by `Scheduler.allocate`; every rollout is counted.
  The informative fraction (Knapsack RL's "effective gradient ratio") has a paired 95%
  bootstrap CI of its difference to uniform.

Suites: `sim:<scenario>` runs the simulator (exact oracle: true p every step, quantised to
1/64); any other name is a built-in trainer task set looked up through `rlpace.tasks`
(`embedded`, and the headroom suites `ladder` / `mostly_solved`; a name
`make_taskset` does not know is skipped with its error). Trainer oracles measure every
prompt with `oracle_rollouts` rollouts every `oracle_every` steps (TrainConfig).

Usage:
    python benchmarks/headroom.py                                   # simulator suites, 8 seeds
    python benchmarks/headroom.py --suites embedded,ladder,mostly_solved --quick   # trainer, 2 seeds
    python benchmarks/headroom.py --policies dump,mopps --seeds 4
    python benchmarks/headroom.py --suite embedded:add1,rev3,rev4 --suite ladder   # a suite with commas, whole

A uniform run that gains nothing on some seed leaves that suite without a fraction-of-gain
target: its table says "no gain, no target" and the other suites are measured as usual.

Writes `headroom.csv` and `headroom.md` to --out.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

SIM_SUITES = ("sim:ladder", "sim:homogeneous", "sim:solved_majority")
ORACLES = ("oracle_boundary", "oracle_progress", "oracle_allocation")
DEFAULT_ORACLES = ("oracle_boundary", "oracle_progress")
QUICK_TRAINER_POLICIES = ("uniform", "oracle_boundary", "dump", "dapo_dynamic_sampling")


def compared_policies() -> list[str]:
    """uniform, the oracles, then every registered proposal policy (a mixture or a
    non-uniform selection) and every admission policy, each once."""
    from rlpace.policies import make_method, names
    from rlpace.sim import proposal_names
    adm = [n for n in names() if not n.startswith("oracle_") and make_method(n).admission.name != "keep_all"]
    return ["uniform", *DEFAULT_ORACLES] + list(dict.fromkeys(proposal_names() + adm))


# ---- simulator --------------------------------------------------------------------------
def _sim_one(job: tuple) -> tuple:
    scenario, policy, seed, steps, b, g, eval_every = job
    import warnings

    from rlpace.evaluation import Curve
    from rlpace.sim import oracle_kwargs, simulate
    oracle = policy.startswith("oracle_")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # gfpo warns that the simulator has no lengths
        res = simulate(scenario, policy, steps=steps, seed=seed, batch_size=b, group_size=g,
                       eval_every=eval_every, measure_every=1 if oracle else 0, measure_rollouts=64,
                       policy_kwargs=oracle_kwargs(scenario, policy, g))
    cv = Curve(res.eval_rollouts.astype(float), res.mean_accuracy.copy(), res.eval_step.astype(float), None)
    return scenario, policy, seed, cv, float(res.informative_fraction.mean()), int(res.measurement_rollouts)


def run_sim(suite: str, policies, seeds, args) -> tuple[dict, dict]:
    scenario = suite.split(":", 1)[1]
    jobs = [(scenario, p, s, args.sim_steps, args.sim_batch, args.sim_group, args.sim_eval_every)
            for p in policies for s in seeds]
    curves: dict = {p: {} for p in policies}
    inform: dict = {p: [] for p in policies}
    with ProcessPoolExecutor(max_workers=args.jobs) as ex:
        for _, p, s, cv, inf, _ in ex.map(_sim_one, jobs, chunksize=4):
            curves[p][s] = cv
            inform[p].append(inf)
    return curves, inform


# ---- built-in trainer ---------------------------------------------------------------------
def trainer_available(name: str) -> str:
    """'' when `rlpace.tasks.make_taskset` knows `name`, else its error."""
    from rlpace.tasks import make_taskset
    try:
        make_taskset(name, train_per_domain=2, heldout_per_domain=1)
    except Exception as e:  # noqa: BLE001 - any failure means "not available here"
        return f"{type(e).__name__}: {e}"
    return ""


def run_trainer(suite: str, policies, seeds, args) -> tuple[dict, dict]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import learning_efficiency as le
    from rlpace.train.report import load_run
    ns = argparse.Namespace(out=str(Path(args.out) / suite.replace(":", "_")), steps=args.trainer_steps,
                            batch_prompts=args.batch_prompts, group_size=args.group_size,
                            eval_every=args.eval_every, heldout=args.heldout, tasks=suite,
                            mistakes="default", lr=args.lr)

    def cfg_for(p, s):
        base = p.split("@", 1)[0]           # "diem@loo": policy diem, with the kwargs and run dir of "diem@loo"
        cfg = le.run_config(base, s, ns)
        extra = {"train_per_domain": args.train_per_domain, "oracle_every": args.oracle_every,
                 "oracle_rollouts": args.oracle_rollouts}
        if p != base:
            extra["out"] = str(Path(ns.out) / f"{p}__seed{s}")
        extra.update(args.train_overrides.get(p, {}))   # --train-overrides '{"dvc@reward": {"grad_features": "off"}}'
        if p == "oracle_progress":
            extra["policy_kwargs"] = json.dumps({"group_size": args.group_size})
        if p in args.policy_kwargs:                # --policy-kwargs '{"mopps": {"prior_strength": 8}}'
            kw = dict(args.policy_kwargs[p])
            # a label of its own for a setting: '{"mopps+prior": {"policy": "mopps", "prior_strength": 8}}'
            extra["policy"] = kw.pop("policy", base)
            extra["policy_kwargs"] = json.dumps(kw)
        return dataclasses.replace(cfg, **extra)

    for s in seeds:                               # bases first: parallel runs never race on them
        from rlpace.tasks import make_taskset
        from rlpace.train.recipes.grpo import base_policy
        c = cfg_for("uniform", s)
        base_policy(c, make_taskset(c.tasks, train_per_domain=c.train_per_domain,
                                    heldout_per_domain=c.heldout_per_domain, seed=c.seed), progress=False)
    cfgs = {(p, s): cfg_for(p, s) for p in policies for s in seeds}
    with ProcessPoolExecutor(max_workers=args.jobs) as ex:
        list(ex.map(le._run_one, [c.to_dict() for c in cfgs.values()]))
    curves: dict = {p: {} for p in policies}
    inform: dict = {p: [] for p in policies}
    ess: dict = {p: [] for p in policies}
    for (p, s), c in cfgs.items():
        recs = load_run(c.out)
        curves[p][s] = le.curve(recs)
        inform[p].append(float(np.mean([r["informative_groups"] for r in recs if "informative_groups" in r])))
        ess[p].append(ess_fraction(recs))
    args.ess = {**getattr(args, "ess", {}), suite: {p: float(np.mean(v)) for p, v in ess.items()}}
    return curves, inform


def ess_fraction(recs) -> float:
    """Mean over a run's steps of its importance weights' effective sample size as a share of the
    batch, (Σw)²/(B·Σw²) (`criticality/ess_fraction` in metrics.jsonl: criticality_is,
    criticality_grid); NaN for a policy that logs none (its weights are 1: ESS = B)."""
    v = [r["sched/criticality/ess_fraction"] for r in recs if "sched/criticality/ess_fraction" in r]
    return float(np.mean(v)) if v else math.nan


# ---- the table ------------------------------------------------------------------------------
def informative_ci(inform: dict, p: str) -> tuple[float, float, float]:
    """(mean difference, low, high): paired 95% bootstrap CI of policy p's informative fraction
    minus uniform's over the seeds (lists in seed order); NaN without pairs."""
    from rlpace.evaluation import paired_bootstrap_interval
    a, b = np.asarray(inform.get(p, []), float), np.asarray(inform.get("uniform", []), float)
    if p == "uniform" or a.size < 2 or a.size != b.size:
        return (0.0, 0.0, 0.0) if p == "uniform" else (math.nan,) * 3
    ci = paired_bootstrap_interval(a, b, n_boot=10_000, random_state=0)
    return float(ci.estimate), float(ci.low), float(ci.high)


def headroom_rows(suite: str, curves: dict, inform: dict, *, fraction: float, tail: int,
                  ess: dict | None = None) -> list[dict]:
    """One row per policy: ratios to uniform, the oracle's headroom and the captured share;
    `ess` (policy -> mean ESS / B of its loss weights, NaN or absent = none) fills the ESS column.
    `inform` holds each policy's per-seed informative fractions (lists, seed order) or a mean."""
    ess = ess or {}
    per_seed = {p: list(np.atleast_1d(np.asarray(v, float))) for p, v in inform.items()}
    inform = {p: float(np.mean(v)) for p, v in per_seed.items()}
    from rlpace.errors import InputError
    from rlpace.evaluation import captured_share, efficiency_vs_baseline
    try:
        eff = efficiency_vs_baseline(curves, baseline="uniform", fraction=fraction, tail=tail,
                                     n_boot=10_000, random_state=0)
    except InputError as e:     # uniform gained nothing on a seed: no fraction-of-gain target
        return [no_target_row(suite, curves, inform, str(e))]
    oracle_r = [eff[o].rollouts.estimate for o in ORACLES if o in eff and eff[o].rollouts is not None]
    best_oracle = min(oracle_r) if oracle_r else math.nan
    u_final = np.mean([c.accuracy[-1] for c in curves["uniform"].values()])
    u_base = np.mean([c.accuracy[0] for c in curves["uniform"].values()])
    rows = [{"suite": suite, "policy": "uniform", "seeds": len(curves["uniform"]), "ratio": 1.0, "ratio_low": 1.0,
             "ratio_high": 1.0, "bound": "", "reached": len(curves["uniform"]), "captured": 0.0,
             "final": float(u_final), "final_diff": 0.0, "final_low": 0.0, "final_high": 0.0,
             "informative": inform["uniform"], "auc_ratio": 1.0, "steps_ratio": 1.0,
             "base": float(u_base), "headroom": best_oracle, "ess": ess.get("uniform", math.nan),
             "inf_diff": 0.0, "inf_low": 0.0, "inf_high": 0.0, "note": ""}]
    for p, e in eff.items():
        r, d = e.rollouts, e.final_diff
        rows.append({"suite": suite, "policy": p, "seeds": len(e.seeds), "ratio": r.estimate, "ratio_low": r.low,
                     "ratio_high": r.high, "bound": r.bound, "reached": int(e.reached.sum()),
                     "captured": math.nan if p in ORACLES else captured_share(r.estimate, best_oracle),
                     "final": float(np.mean([curves[p][s].accuracy[-1] for s in e.seeds])),
                     "final_diff": d.estimate if d else math.nan, "final_low": d.low if d else math.nan,
                     "final_high": d.high if d else math.nan, "informative": inform[p],
                     "auc_ratio": e.auc.estimate if e.auc else math.nan,
                     "steps_ratio": e.steps.estimate if e.steps else math.nan,
                     "base": float(u_base), "headroom": best_oracle, "ess": ess.get(p, math.nan),
                     **dict(zip(("inf_diff", "inf_low", "inf_high"), informative_ci(per_seed, p))), "note": ""})
    order = {p: i for i, p in enumerate(["uniform", *ORACLES])}
    rows.sort(key=lambda x: (order.get(x["policy"], 9), x["ratio"] if math.isfinite(x["ratio"]) else 9e9))
    return rows


NO_TARGET = "no gain, no target"


def no_target_row(suite: str, curves: dict, inform: dict, why: str) -> dict:
    """The suite's one row when uniform gained nothing on a seed: no ratios (there is no
    fraction-of-gain target to reach), uniform's accuracies and the reason in `note`."""
    u = curves["uniform"]
    nan = math.nan
    inform = {p: float(np.mean(v)) for p, v in inform.items()}
    return {"suite": suite, "policy": "uniform", "seeds": len(u), "ratio": nan, "ratio_low": nan,
            "ratio_high": nan, "bound": "", "reached": 0, "captured": nan,
            "final": float(np.mean([c.accuracy[-1] for c in u.values()])), "final_diff": nan, "final_low": nan,
            "final_high": nan, "informative": inform.get("uniform", nan), "auc_ratio": nan, "steps_ratio": nan,
            "base": float(np.mean([c.accuracy[0] for c in u.values()])), "headroom": nan, "ess": nan,
            "inf_diff": nan, "inf_low": nan, "inf_high": nan, "note": f"{NO_TARGET}: {why}"}


def _f(x, fmt="{:.2f}"):
    return "–" if x is None or (isinstance(x, float) and not math.isfinite(x)) else fmt.format(x)


def markdown(rows: list[dict], fraction: float) -> str:
    pct = f"{fraction:.0%}"
    head = ["policy", f"rollouts to {pct} gain / uniform [95% CI]", "reached", "captured share",
            "final acc", "Δ final vs uniform [95% CI]", "informative", "Δ informative [95% CI]",
            "AUC / uniform", "steps / uniform", "ESS / B"]
    out = []
    for suite in dict.fromkeys(r["suite"] for r in rows):
        rs = [r for r in rows if r["suite"] == suite]
        if rs[0].get("note", "").startswith(NO_TARGET):
            out.append(f"\n### {suite}: {rs[0]['note']}\n")
            continue
        h = rs[0]["headroom"]
        out.append(f"\n### {suite}: headroom (best oracle ratio) {_f(h)}; uniform {rs[0]['base']:.3f} → "
                   f"{rs[0]['final']:.3f}, {rs[0]['seeds']} seeds\n")
        out.append("| " + " | ".join(head) + " |")
        out.append("|" + "---|" * len(head))
        for r in rs:
            ci = "" if r["policy"] == "uniform" else f" [{_f(r['ratio_low'])}, {_f(r['ratio_high'])}]"
            dci = "" if r["policy"] == "uniform" else f" [{_f(r['final_low'], '{:+.3f}')}, {_f(r['final_high'], '{:+.3f}')}]"
            out.append("| " + " | ".join([
                r["policy"], f"{r['bound']}{_f(r['ratio'])}×{ci}", f"{r['reached']}/{r['seeds']}",
                _f(r["captured"], "{:.0%}"), f"{r['final']:.3f}", f"{_f(r['final_diff'], '{:+.3f}')}{dci}",
                f"{r['informative']:.2f}",
                "" if r["policy"] == "uniform" else
                f"{_f(r.get('inf_diff', math.nan), '{:+.3f}')} [{_f(r.get('inf_low', math.nan), '{:+.3f}')}, "
                f"{_f(r.get('inf_high', math.nan), '{:+.3f}')}]",
                _f(r["auc_ratio"]), _f(r["steps_ratio"]),
                "" if not math.isfinite(r.get("ess", math.nan)) else f"{r['ess']:.2f}"]) + " |")
    return "\n".join(out) + "\n"


#: How a suite starts: a part of a comma list that starts none of these continues the suite
#: before it ('embedded:add1,rev3' is one suite; 'sim:ladder,embedded' two).
_SUITE_STARTS = ("sim:", "embedded", "grid:", "rg:", "knights_knaves", "ladder", "mostly_solved",
                 "sort_ladder", "families_parallel", "small_domains", "generated:", "/", "./", "~")


def split_suites(text: str | None) -> list[str]:
    """--suites as a list: split on ';' when it has one, else on ',' keeping a part that starts
    no suite (`_SUITE_STARTS`, or a .parquet/.jsonl path) with the suite before it.

    >>> split_suites("sim:ladder,embedded:add1,rev3,mostly_solved")
    ['sim:ladder', 'embedded:add1,rev3', 'mostly_solved']
    >>> split_suites("embedded:a,b;sim:ladder")
    ['embedded:a,b', 'sim:ladder']
    """
    if not text:
        return []
    if ";" in text:
        return [x.strip() for x in text.split(";") if x.strip()]
    out: list[str] = []
    for part in (x.strip() for x in text.split(",")):
        if not part:
            continue
        starts = part.startswith(_SUITE_STARTS) or part.endswith((".parquet", ".jsonl"))
        if out and not starts and ":" in out[-1]:
            out[-1] += "," + part
        else:
            out.append(part)
    return out


def _policy_map(ap, flag: str, text: str, what: str) -> dict:
    """A --flag's JSON object mapping policy names (or labels) to JSON objects; argparse error otherwise."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        ap.error(f"{flag} must be a JSON object ({e})")
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        ap.error(f"{flag} must map policy names to {what}")
    return value


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suites", default=None,
                    help="suites separated by ';' (or by ',' where unambiguous: a part that does not start a "
                         "suite continues the one before, so 'embedded:a,b,c' stays one suite): sim:<scenario> "
                         "and/or trainer task sets (embedded, ladder, mostly_solved, embedded:<names>, ...)")
    ap.add_argument("--suite", action="append", default=[],
                    help="one suite, taken whole (repeatable); added to --suites")
    ap.add_argument("--policies", default="", help="comma list (default: every proposal and admission policy); "
                                                   "uniform and the oracles are always run")
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--oracles", default=",".join(DEFAULT_ORACLES),
                    help="comma list of the oracles to run with --policies (trainer oracles cost m·N "
                         "measurement rollouts every k steps; oracle_progress only models the simulator)")
    ap.add_argument("--quick", action="store_true",
                    help=f"2 seeds; trainer suites only run {','.join(QUICK_TRAINER_POLICIES)} for a short budget")
    ap.add_argument("--fraction", type=float, default=0.8, help="target = base + fraction·(uniform final − base)")
    ap.add_argument("--sim-steps", type=int, default=400)
    ap.add_argument("--sim-batch", type=int, default=128)
    ap.add_argument("--sim-group", type=int, default=16)
    ap.add_argument("--sim-eval-every", type=int, default=10)
    ap.add_argument("--trainer-steps", type=int, default=100)
    ap.add_argument("--batch-prompts", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--heldout", type=int, default=32)
    ap.add_argument("--train-per-domain", type=int, default=256)
    # A sharper measurement than TrainConfig's defaults (10, 8): the oracle is an upper bound,
    # so it should see fresh, low-noise pass rates (measured on mostly_solved_last: 0.56× vs 0.60×).
    ap.add_argument("--oracle-every", type=int, default=5)
    ap.add_argument("--oracle-rollouts", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--policy-kwargs", default="{}",
                    help='JSON object: policy -> its keyword arguments, e.g. \'{"mopps": {"prior_strength": 8}}\'; '
                         'a key that is a label of its own names its policy: '
                         '\'{"mopps+prior": {"policy": "mopps", "prior_strength": 8}}\' with --policies mopps,mopps+prior')
    ap.add_argument("--train-overrides", default="{}",
                    help='JSON object: policy -> TrainConfig fields for its runs, e.g. '
                         '\'{"dvc@reward": {"grad_features": "off"}}\'. A policy may carry a label, '
                         '"name@label": it runs `name` with the --policy-kwargs and overrides of "name@label"')
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--out", default="runs/bench/headroom")
    args = ap.parse_args(argv)
    args.oracles = [o for o in args.oracles.split(",") if o]
    args.policy_kwargs = _policy_map(ap, "--policy-kwargs", args.policy_kwargs,
                                     "JSON objects, e.g. '{\"mopps\": {\"prior_strength\": 8}}'")
    args.train_overrides = _policy_map(ap, "--train-overrides", args.train_overrides,
                                       "JSON objects of TrainConfig fields")
    if any(o not in ORACLES for o in args.oracles):
        ap.error(f"--oracles: choose from {', '.join(ORACLES)}")
    if args.quick:
        args.seeds = 2
    seeds = list(range(args.seeds))
    t0 = time.perf_counter()
    rows: list[dict] = []
    suites = split_suites(args.suites) + [x.strip() for x in args.suite if x.strip()]
    if args.suites is None and not args.suite:
        suites = list(SIM_SUITES)
    for suite in suites:
        sim = suite.startswith("sim:")
        if args.policies:
            pols = ["uniform", *args.oracles] + [p for p in args.policies.split(",") if p and p not in ("uniform", *ORACLES)]
        elif args.quick and not sim:
            pols = list(QUICK_TRAINER_POLICIES)
        else:
            pols = compared_policies()
        if not sim:
            why = trainer_available(suite)
            if why:
                print(f"headroom: suite {suite!r} skipped — not a task set here ({why})", flush=True)
                continue
            if args.quick:       # shows that the suite runs, not a measurement
                args.trainer_steps = min(args.trainer_steps, 40)
                args.train_per_domain = min(args.train_per_domain, 64)
                args.oracle_rollouts = min(args.oracle_rollouts, 4)
        t1 = time.perf_counter()
        curves, inform = (run_sim if sim else run_trainer)(suite, pols, seeds, args)
        # trainer evaluations are noisy: uniform's final = mean of its last 3 (as learning_efficiency)
        suite_rows = headroom_rows(suite, curves, inform, fraction=args.fraction, tail=1 if sim else 3,
                                   ess=getattr(args, "ess", {}).get(suite))
        rows += suite_rows
        print(markdown(suite_rows, args.fraction), flush=True)
        print(f"({suite}: {len(pols)} policies × {len(seeds)} seeds in {time.perf_counter() - t1:.0f} s)", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if rows:
        with open(out / "headroom.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        (out / "headroom.md").write_text(markdown(rows, args.fraction))
    print(f"\nwrote {out / 'headroom.csv'} and headroom.md ({(time.perf_counter() - t0) / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
