"""Learning efficiency of every proposal policy on the embedded suite (not a timed test).

Each policy trains the tiny base policy with the built-in GRPO recipe under one rollout
budget (uniform's steps × B × G rollouts), for S seeds (the seed sets the base policy,
the Scheduler and the sampling; runs with the same seed are paired). For each policy:

* rollouts (training, refills and probes) and generated tokens to reach 80% of uniform's
  gain — target_s = base_s + 0.8·(final_s − base_s), base_s the seed's first evaluation,
  final_s the mean of uniform's last 3 evaluations (one eval is noisy) — as a ratio to
  uniform's, with a paired 95% bootstrap CI over seeds (ratio of means; seeds resampled
  as pairs); linear interpolation between evaluations. A run that never reaches it counts
  as its own budget and the ratio is flagged as a bound (≥). Steps to the target are a
  secondary column; the area under accuracy vs rollouts (up to the smallest budget) is a
  ratio to uniform's (> 1 = better). Definitions: `rlpace.evaluation.efficiency_vs_baseline`.
  The target used to be uniform's *final* accuracy, which sits on its late plateau and
  made the ratio measure noise.
* the fraction of informative groups (non-zero advantage) over training. Goal ≥ 0.9.
* final mean held-out accuracy and its paired difference to uniform (95% bootstrap CI).

"Proposal policies" are the registered ones that choose prompts before rollout (a
mixture or a non-uniform selection), plus `lilo`: uniform proposals through the recipe's
LILO probe (k = 4 candidates per slot, 4 probe rollouts each, counted in the budget).

Usage:
    python benchmarks/learning_efficiency.py               # 8 seeds, 100-step budget
    python benchmarks/learning_efficiency.py --quick       # 2 seeds, 60 steps
    python benchmarks/learning_efficiency.py --policies uniform,dump,mopps --seeds 4
    python benchmarks/learning_efficiency.py --fraction 0.5       # rollouts to 50% of uniform's gain

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
        if n.startswith("oracle_"):      # measurement tools (benchmarks/headroom.py), not methods
            continue
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
    """`rlpace.evaluation.Curve` of a run's evaluations: rollouts spent before each one
    (training + refills + probes; an oracle's measurement rollouts are logged apart and not
    included), generated tokens before it, its step, and the mean held-out accuracy."""
    from rlpace.evaluation import Curve
    steps = [r for r in recs if not r.get("final") and "rollouts_total" in r]
    ro, tok, st, acc = [], [], [], []
    for r in recs:
        if "eval/mean" in r:
            before = [x for x in steps if x["step"] < r["step"]]
            ro.append(before[-1]["rollouts_total"] if before else 0)
            tok.append(sum(x.get("tokens", 0) for x in before))
            st.append(r["step"])
            acc.append(r["eval/mean"])
    f = (lambda v: np.asarray(v, dtype=np.float64))
    return Curve(f(ro), f(acc), f(st), f(tok))


def analyse(runs: dict, policies, seeds, fraction: float = 0.8, tail: int = 3):
    """{policy: row} with the ratios to uniform (`efficiency_vs_baseline`), final accuracy
    and its paired difference, and the informative fraction; and the per-seed targets."""
    from rlpace.evaluation import efficiency_vs_baseline

    curves = {p: {s: curve(runs[(p, s)]) for s in seeds} for p in policies}
    eff = efficiency_vs_baseline(curves, baseline="uniform", fraction=fraction, tail=tail,
                                 n_boot=10_000 if len(seeds) > 1 else 100, random_state=0)
    rows = {}
    for p in policies:
        e = eff.get(p)
        inf = np.array([np.mean([r["informative_groups"] for r in runs[(p, s)] if not r.get("final")]) for s in seeds])
        rows[p] = {"rollouts_ratio": e.rollouts if e else None, "tokens_ratio": e.tokens if e else None,
                   "steps_ratio": e.steps if e else None, "auc_ratio": e.auc if e else None,
                   "reached": int(e.reached.sum()) if e else len(seeds),
                   "final": float(np.mean([curves[p][s].accuracy[-1] for s in seeds])),
                   "final_diff": e.final_diff if e else None, "informative": float(inf.mean()),
                   "base": float(np.mean([curves[p][s].accuracy[0] for s in seeds])),
                   "steps_run": float(np.mean([len([r for r in runs[(p, s)] if not r.get('final')]) for s in seeds]))}
    target = {s: float(t) for s, t in zip(seeds, next(iter(eff.values())).target)} if eff else {}
    return target, rows


def fmt_ratio(r):
    if r is None:
        return "–"
    ci = f" [{r.low:.2f}, {r.high:.2f}]" if math.isfinite(r.low) else ""
    return f"{r.bound}{r.estimate:.2f}{ci}"       # ≥: the policy missed the target on some seed


def table(rows, n_seeds, fraction: float = 0.8) -> str:
    pct = f"{fraction:.0%}"
    head = (f"{'policy':26s} {f'rollouts to {pct} gain /unif':>30s} {'tokens /unif':>22s} {'AUC /unif':>20s} "
            f"{'reached':>8s} {'inform.':>8s} {'final acc':>9s} {'Δ vs uniform [95% CI]':>24s} "
            f"{'steps /unif':>22s}")
    lines = [head, "-" * len(head)]
    for p, r in sorted(rows.items(), key=lambda kv: (kv[0] != "uniform", -kv[1]["final"])):
        d = r["final_diff"]
        dtxt = f"{d.estimate:+.3f} [{d.low:+.3f}, {d.high:+.3f}]" if d is not None else "n/a"
        lines.append(f"{p:26s} {fmt_ratio(r['rollouts_ratio']):>30s} {fmt_ratio(r['tokens_ratio']):>22s} "
                     f"{fmt_ratio(r['auc_ratio']):>20s} {r['reached']:>5d}/{n_seeds:<2d} {r['informative']:8.2f} "
                     f"{r['final']:9.3f} {dtxt:>24s} {fmt_ratio(r['steps_ratio']):>22s}")
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
    ap.add_argument("--fraction", type=float, default=0.8, help="target = base + fraction·(uniform final − base)")
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
    target, rows = analyse(runs, policies, seeds, fraction=args.fraction)
    text = table(rows, len(seeds), args.fraction)
    wall = time.perf_counter() - t0
    print(f"\n{args.tasks} suite, {len(seeds)} seeds, budget {budget} rollouts ({args.steps} uniform steps of "
          f"{args.batch_prompts}×{args.group_size}); target = {args.fraction:.0%} of uniform's gain per seed "
          f"(mean {np.mean(list(target.values())):.3f}); cost ratios < 1 are cheaper than uniform, AUC > 1 better.")
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
