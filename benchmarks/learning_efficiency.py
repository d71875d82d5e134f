"""Learning efficiency of every proposal policy on the embedded suite (not a timed test).

Each policy trains the tiny base policy with the built-in GRPO recipe under one rollout
budget (uniform's steps × B × G rollouts), for S seeds (the seed sets the base policy,
the Scheduler and the sampling; runs with the same seed are paired). For each policy:

* steps (and rollouts) to reach uniform's final held-out accuracy, as a ratio to
  uniform's, with a paired 95% bootstrap CI over seeds (ratio of means; seeds resampled
  as pairs). "Uniform's final accuracy" is the mean of its last 3 evaluations (one eval
  is noisy); a run that never reaches it counts as the whole budget and the ratio is
  flagged censored (≥). Goal of the project: best ratio ≤ 0.33.
* the fraction of informative groups (non-zero advantage) over training. Goal ≥ 0.9.
* final mean held-out accuracy and its paired difference to uniform (95% bootstrap CI).

"Proposal policies" are the registered ones that choose prompts before rollout (a
mixture or a non-uniform selection), plus `lilo`: uniform proposals through the recipe's
LILO probe (k = 4 candidates per slot, 4 probe rollouts each, counted in the budget).

Usage:
    python benchmarks/learning_efficiency.py               # 8 seeds, 100-step budget
    python benchmarks/learning_efficiency.py --quick       # 2 seeds, 60 steps
    python benchmarks/learning_efficiency.py --policies uniform,dump,mopps --seeds 4

Runs are cached under --out (a finished run with the same config is not rerun), so the
matrix can be grown seed by seed. Each run uses one torch thread; --jobs runs in parallel.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

LILO = "lilo"


def proposal_policies() -> list[str]:
    """Registered policies that act before rollout, uniform first, then `lilo`."""
    from rlpace.policies import make_method, names

    out = []
    for n in names():
        m = make_method(n)
        if n == "uniform" or m.mixture is not None or m.selection.name not in ("uniform_pool",):
            out.append(n)
    out.remove("uniform")
    return ["uniform"] + out + [LILO]


def run_config(policy: str, seed: int, args):
    from rlpace.train import TrainConfig
    budget = args.steps * args.batch_prompts * args.group_size
    cfg = TrainConfig(out=str(Path(args.out) / f"{policy}__seed{seed}"), seed=seed, steps=args.steps,
                      tasks=args.tasks, warmup_mistakes=args.mistakes, lr=args.lr,
                      max_rollouts=budget, policy="uniform" if policy == LILO else policy,
                      batch_prompts=args.batch_prompts, group_size=args.group_size, eval_every=args.eval_every,
                      heldout_per_domain=args.heldout, checkpoint_every=0, progress=False, threads=1,
                      lilo_candidates=4 if policy == LILO else 0, lilo_probes=4)
    return cfg


def _run_one(cfg_dict: dict) -> str:
    import torch
    import transformers

    from rlpace.train import TrainConfig, train
    torch.set_num_threads(1)
    transformers.utils.logging.disable_progress_bar()
    cfg = TrainConfig(**cfg_dict)
    done = Path(cfg.out) / "summary.json"
    if done.is_file() and json.loads(done.read_text())["config"] == cfg.to_dict():
        return cfg.out
    train(cfg)
    return cfg.out


def build_bases(seeds, args) -> None:
    """Build the base policies first (one per seed), so parallel runs never race on them."""
    from rlpace.tasks import make_taskset
    from rlpace.train.recipes.grpo import base_policy
    for s in seeds:
        cfg = run_config("uniform", s, args)
        tasks = make_taskset(cfg.tasks, train_per_domain=cfg.train_per_domain,
                             heldout_per_domain=cfg.heldout_per_domain, seed=cfg.seed)
        t0 = time.perf_counter()
        d = base_policy(cfg, tasks, progress=True)
        print(f"base seed {s}: {d.name} ({time.perf_counter() - t0:.0f} s)", flush=True)


# ---- statistics over the run logs (pure) --------------------------------------------------
def curve(recs):
    """[(step, rollouts spent before it, mean held-out accuracy)] of the evaluations."""
    steps = [r for r in recs if not r.get("final")]
    out = []
    for r in recs:
        if "eval/mean" in r:
            before = [x["rollouts_total"] for x in steps if x["step"] < r["step"]]
            out.append((r["step"], before[-1] if before else 0, r["eval/mean"]))
    return out


def to_target(cv, target):
    for step, ro, acc in cv:
        if acc >= target - 1e-12:
            return float(step), float(ro)
    return math.nan, math.nan


def analyse(runs: dict, policies, seeds, budget_steps, budget_rollouts):
    from rlpace.evaluation import paired_bootstrap_interval, ratio_to_target

    curves = {(p, s): curve(runs[(p, s)]) for p in policies for s in seeds}
    target = {s: float(np.mean([a for _, _, a in curves[("uniform", s)][-3:]])) for s in seeds}
    final = {(p, s): curves[(p, s)][-1][2] for p in policies for s in seeds}
    rows = {}
    u_steps = np.array([to_target(curves[("uniform", s)], target[s])[0] for s in seeds])
    u_ro = np.array([to_target(curves[("uniform", s)], target[s])[1] for s in seeds])
    for p in policies:
        st = np.array([to_target(curves[(p, s)], target[s])[0] for s in seeds])
        ro = np.array([to_target(curves[(p, s)], target[s])[1] for s in seeds])
        # ratio_to_target(method=a, baseline=b) = mean(b)/mean(a): passing uniform as the
        # "method" gives mean(policy)/mean(uniform), the ratio the goal is stated in.
        r_steps = ratio_to_target(u_steps, st, budget=budget_steps, random_state=0) if len(seeds) > 1 else None
        r_ro = ratio_to_target(u_ro, ro, budget=budget_rollouts, random_state=1) if len(seeds) > 1 else None
        fin = np.array([final[(p, s)] for s in seeds])
        ufin = np.array([final[("uniform", s)] for s in seeds])
        diff = paired_bootstrap_interval(fin, ufin, random_state=2) if len(seeds) > 1 else None
        inf = np.array([np.mean([r["informative_groups"] for r in runs[(p, s)] if not r.get("final")]) for s in seeds])
        rows[p] = {"steps_ratio": r_steps, "rollouts_ratio": r_ro, "reached": int(np.sum(~np.isnan(st))),
                   "steps_to_target": np.nanmean(st) if np.any(~np.isnan(st)) else math.nan,
                   "final": float(fin.mean()), "final_diff": diff, "informative": float(inf.mean()),
                   "base": float(np.mean([curves[(p, s)][0][2] for s in seeds])),
                   "steps_run": float(np.mean([len([r for r in runs[(p, s)] if not r.get('final')]) for s in seeds]))}
    return target, rows


def fmt_ratio(r):
    if r is None:
        return "n/a"
    ge = "≥" if r.censored else ""         # a policy that missed the target counts as the budget
    return f"{ge}{r.estimate:.2f} [{r.low:.2f}, {r.high:.2f}]"


def table(rows, n_seeds) -> str:
    head = (f"{'policy':26s} {'steps/uniform [95% CI]':>26s} {'rollouts/uniform [95% CI]':>26s} "
            f"{'reached':>8s} {'inform.':>8s} {'final acc':>9s} {'Δ vs uniform [95% CI]':>24s} {'steps':>6s}")
    lines = [head, "-" * len(head)]
    for p, r in sorted(rows.items(), key=lambda kv: (kv[0] != "uniform", -kv[1]["final"])):
        d = r["final_diff"]
        dtxt = f"{d.estimate:+.3f} [{d.low:+.3f}, {d.high:+.3f}]" if d is not None else "n/a"
        lines.append(f"{p:26s} {fmt_ratio(r['steps_ratio']):>26s} {fmt_ratio(r['rollouts_ratio']):>26s} "
                     f"{r['reached']:>5d}/{n_seeds:<2d} {r['informative']:8.2f} {r['final']:9.3f} {dtxt:>24s} "
                     f"{r['steps_run']:6.0f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 seeds, 60-step budget")
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=100, help="uniform's steps; the budget is steps × B × G rollouts")
    ap.add_argument("--policies", default="", help="comma list (default: every proposal policy + lilo)")
    ap.add_argument("--batch-prompts", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--heldout", type=int, default=32, help="held-out prompts per distribution")
    ap.add_argument("--tasks", default="embedded", help="TrainConfig.tasks (default: the embedded suite)")
    ap.add_argument("--mistakes", default="default", help="TrainConfig.warmup_mistakes")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--out", default="runs/bench/learning_efficiency")
    args = ap.parse_args(argv)
    if args.quick:
        args.seeds, args.steps = 2, 60
    policies = [p for p in args.policies.split(",") if p] or proposal_policies()
    if "uniform" not in policies:
        policies = ["uniform"] + policies
    seeds = list(range(args.seeds))
    t0 = time.perf_counter()
    build_bases(seeds, args)
    cfgs = [run_config(p, s, args) for s in seeds for p in policies]
    from tqdm.auto import tqdm
    with ProcessPoolExecutor(max_workers=args.jobs) as ex:
        list(tqdm(ex.map(_run_one, [c.to_dict() for c in cfgs]), total=len(cfgs), desc="runs"))
    runs = {}
    for p in policies:
        for s in seeds:
            path = Path(run_config(p, s, args).out) / "metrics.jsonl"
            runs[(p, s)] = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    budget = args.steps * args.batch_prompts * args.group_size
    target, rows = analyse(runs, policies, seeds, args.steps, budget)
    text = table(rows, len(seeds))
    wall = time.perf_counter() - t0
    print(f"\n{args.tasks} suite, {len(seeds)} seeds, budget {budget} rollouts ({args.steps} uniform steps of "
          f"{args.batch_prompts}×{args.group_size}); target = uniform's final accuracy per seed "
          f"(mean {np.mean(list(target.values())):.3f}); ratios < 1 are faster than uniform.")
    print(text)
    print(f"\n{len(cfgs)} runs in {wall / 60:.1f} min wall (cached runs are not rerun).")
    out = Path(args.out)
    (out / "results.md").write_text(text + "\n")
    (out / "results.json").write_text(json.dumps(
        {"seeds": seeds, "budget_rollouts": budget, "target": target,
         "rows": {p: {k: (v._asdict() if hasattr(v, "_asdict") else v) for k, v in r.items()}
                  for p, r in rows.items()}}, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
