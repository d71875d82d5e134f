"""epiplexity benchmarks (not timed tests): the mixture beside DUMP and uniform on the
headroom suites, and the generator against a fixed uniform parameter mix.

A. Mixture. For each suite (`embedded`, `ladder`, `mostly_solved`), `uniform`, `dump` and
   `epiplexity` train the tiny base policy with the built-in GRPO recipe under one rollout
   budget, S seeds, paired by seed; the table is `benchmarks/learning_efficiency.py`'s
   (rollouts and tokens to reach 80% of uniform's gain, AUC, final accuracy and its paired
   difference to uniform with 95% bootstrap CIs). epiplexity is fed by the recipe's loss
   probe every `--loss-probe-every` steps.
B. Generator. `tasks=generated:<family>` (REINFORCE over the family's sizes, each step a fresh
   item of the family at every drawn size, reward = NLL drop on the previously generated items)
   against two fixed mixes, with the same base policy (built from the same task set):
     uniform       `tasks=generated:<family> gen_lr=0`: fresh items at uniformly drawn sizes —
                   the fixed uniform parameter mix; the table's baseline;
     uniform_pool  `tasks=embedded:<every size> policy=uniform`: the pre-generated pool of
                   `train_per_domain` items per size, uniform over its prompts.
   Held-out accuracy is the mean over every size (the family's whole parameter range). Default
   family: the ladder suite's (`sort`), warmed up with the ladder's mistake shares (sizes
   learned in order: headroom).

Usage:
    python benchmarks/epiplexity.py                      # 8 seeds, 100-step budget, 3 suites + the ladder's family
    python benchmarks/epiplexity.py --quick              # 2 seeds, 60 steps
    python benchmarks/epiplexity.py --seeds 1 --steps 10 --suites embedded --family max   # smoke
    python benchmarks/epiplexity.py --suites embedded --family '' --jobs 1      # the docs' mixture figures
    python benchmarks/epiplexity.py --suites '' --family sort --jobs 1          # the docs' generator figures

Runs are cached under --out (a finished run with the same config is not rerun).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import learning_efficiency as le  # noqa: E402

MIXTURES = ["uniform", "dump", "epiplexity"]
FRESH_UNIFORM, POOL, GENERATED = "uniform", "uniform_pool", "generated"    # generator part's arms


def _args(base, **kw):
    out = argparse.Namespace(**vars(base))
    for k, v in kw.items():
        setattr(out, k, v)
    return out


def _load(cfg) -> list:
    from rlpace.train.report import load_run
    return load_run(cfg.out)


def _run_all(cfgs, jobs: int) -> None:
    from tqdm.auto import tqdm
    with ProcessPoolExecutor(max_workers=jobs) as ex:
        list(tqdm(ex.map(le._run_one, [c.to_dict() for c in cfgs]), total=len(cfgs), desc="runs"))


def _table(runs: dict, arms, seeds, args) -> str:
    """learning_efficiency's table with `arms[0]` as the baseline (named "uniform" there); when
    the baseline gained nothing on some seed (short smoke runs), only base and final accuracy."""
    try:
        _, rows = le.analyse(runs, arms, seeds, fraction=args.fraction)
        return le.table(rows, len(seeds), args.fraction)
    except ValueError as e:
        lines = [f"(no efficiency ratios: {e})", f"{'arm':16s} {'base acc':>9s} {'final acc':>9s}"]
        for a in arms:
            acc = [[r["eval/mean"] for r in runs[(a, s)] if "eval/mean" in r] for s in seeds]
            lines.append(f"{a:16s} {sum(x[0] for x in acc) / len(acc):9.3f} {sum(x[-1] for x in acc) / len(acc):9.3f}")
        return "\n".join(lines)


def mixture_suite(suite: str, seeds, args) -> str:
    a = _args(args, tasks=suite, out=str(Path(args.out) / suite), policies=",".join(MIXTURES))
    le.build_bases(seeds, a)

    def cfg(p, s):
        return dataclasses.replace(le.run_config(p, s, a), loss_probe_every=args.loss_probe_every)
    cfgs = [cfg(p, s) for s in seeds for p in MIXTURES]
    _run_all(cfgs, args.jobs)
    runs = {(p, s): _load(cfg(p, s)) for p in MIXTURES for s in seeds}
    return _table(runs, MIXTURES, seeds, args)


def generator_family(family: str, seeds, args) -> str:
    from rlpace.tasks import LADDER_MISTAKES, SORT_LADDER_MISTAKES
    from rlpace.tasks._generator import family_configs
    configs = family_configs(family)
    fixed_tasks = "embedded:" + ",".join(configs)
    mistakes = args.gen_mistakes
    if mistakes == "ladder":       # the ladder suite's warm-up shares: sizes learned in order (headroom)
        ramps = {**SORT_LADDER_MISTAKES, **LADDER_MISTAKES}          # sort (the earlier ladder) and rev
        mistakes = ",".join(f"{k}={v}" for k, v in ramps.items() if k in configs) or "default"
    a = _args(args, tasks=fixed_tasks, mistakes=mistakes, out=str(Path(args.out) / f"generated_{family}"))
    le.build_bases(seeds, a)                         # the same base policy serves both arms

    def cfg(arm, s):
        c = le.run_config("uniform", s, a)
        if arm != POOL:                      # fresh items; gen_lr=0 keeps π uniform over the sizes
            c = dataclasses.replace(c, tasks=f"generated:{family}", gen_lr=args.gen_lr if arm == GENERATED else 0.0)
        return dataclasses.replace(c, out=str(Path(a.out) / f"{arm}__seed{s}"))
    arms = [FRESH_UNIFORM, GENERATED, POOL]
    cfgs = [cfg(arm, s) for s in seeds for arm in arms]
    _run_all(cfgs, args.jobs)
    runs = {(arm, s): _load(cfg(arm, s)) for arm in arms for s in seeds}
    text = _table(runs, arms, seeds, args)
    probs = {}                                               # the generator's final π over the sizes
    for s in seeds:
        last = [r for r in runs[(GENERATED, s)] if not r.get("final")][-1]
        for k, v in last.items():
            if k.startswith("gen/prob/"):
                probs.setdefault(k[len("gen/prob/"):], []).append(v)
    order = sorted(probs, key=lambda d: (len(d), d))
    pi = "  ".join(f"{d} {sum(v) / len(v):.2f}" for d, v in ((d, probs[d]) for d in order))
    return ("baseline `uniform` = fresh items at uniformly drawn sizes (gen_lr=0); `uniform_pool` = the "
            "pre-generated pool, uniform over its prompts\n" + text + f"\n\ngenerator's final π (mean over seeds): {pi}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 seeds, 60-step budget")
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=100, help="uniform's steps; the budget is steps × B × G rollouts")
    ap.add_argument("--suites", default="embedded,ladder,mostly_solved", help="mixture part; '' skips it")
    ap.add_argument("--family", default="ladder",
                    help="generator part: an embedded family, or 'ladder' (the ladder suite's family); '' skips it")
    ap.add_argument("--loss-probe-every", type=int, default=5)
    ap.add_argument("--gen-lr", type=float, default=0.1)
    ap.add_argument("--gen-mistakes", default="ladder",
                    help="generator part's warm-up mistakes: 'ladder' (the ladder suite's shares for the sizes "
                         "it has: with --family ladder, its headroom), or a TrainConfig.warmup_mistakes")
    ap.add_argument("--batch-prompts", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--heldout", type=int, default=32, help="held-out prompts per distribution")
    ap.add_argument("--mistakes", default="default", help="TrainConfig.warmup_mistakes")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--fraction", type=float, default=0.8)
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--out", default="runs/bench/epiplexity")
    args = ap.parse_args(argv)
    if args.quick:
        args.seeds, args.steps = 2, 60
    if args.family == "ladder":
        from rlpace.tasks import LADDER_SUITE, parse_distribution
        args.family = parse_distribution(LADDER_SUITE.split(",")[0])[0]
    seeds = list(range(args.seeds))
    t0 = time.perf_counter()
    budget = args.steps * args.batch_prompts * args.group_size
    parts = []
    for suite in [s for s in args.suites.split(",") if s]:
        parts.append(f"### {suite}: uniform, dump, epiplexity ({len(seeds)} seeds, {budget} rollouts)\n\n"
                     + mixture_suite(suite, seeds, args))
    if args.family:
        parts.append(f"### generated:{args.family} vs a fixed uniform mix over its sizes ({len(seeds)} seeds, "
                     f"{budget} rollouts)\n\n" + generator_family(args.family, seeds, args))
    text = "\n\n".join(parts)
    print(text)
    print(f"\n{time.perf_counter() - t0:.0f} s wall (cached runs are not rerun).")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "results.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
