"""Train a tiny model with `uniform` and with the recommended adaptive policy on the
embedded suite (same rollout budget), then print a summary table and write an HTML
report with plots under runs/demo/.

The first run builds the tiny base policy (supervised warm-up, ~30–60 s) and caches it
(`$RLPACE_CACHE` or ~/.cache/rlpace); later runs reuse it. The two policies train one
after the other with one torch thread (measured faster than two processes at this
size), or in two processes with `--parallel on`. One seed is a demonstration, not a
measurement: benchmarks/learning_efficiency.py compares policies over 8 seeds.

Example:
  rlpace demo                       # uniform vs the recommended policy, ~1 min on 2 cores
  rlpace demo --policy dump --steps 150 lr=5e-4
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import time
from pathlib import Path

#: Chosen by measurement (benchmarks/learning_efficiency.py, 8 seeds, 100-step budget): no
#: proposal policy learned faster than uniform on the embedded suite (all steps-to-target
#: CIs include 1 or lie above it; final accuracy within ±0.03). DUMP keeps uniform's
#: accuracy (+0.005 [−0.007, +0.016]) while raising the share of informative groups from
#: 0.44 to 0.61, and its domain probabilities show the curriculum it follows, so it is
#: the one the demo shows. The benchmark prints the current figures.
RECOMMENDED = "dump"


def add_arguments(parser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.description = __doc__
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="TrainConfig fields applied to both runs (see `rlpace train --help`)")
    parser.add_argument("--out", default="runs/demo", help="output directory (default runs/demo)")
    parser.add_argument("--steps", type=int, default=None, help="steps per policy (default: TrainConfig's)")
    parser.add_argument("--policy", default=RECOMMENDED, help=f"the adaptive policy (default {RECOMMENDED})")
    parser.add_argument("--baseline", default="uniform", help="the reference policy (default uniform)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--parallel", choices=("auto", "on", "off"), default="auto",
                        help="on: the two policies in two processes (one torch thread each); "
                             "off / auto: one after the other in this process, one thread")


def _train_quietly(cfg_dict: dict) -> None:
    """Subprocess entry point: one run, no progress bar (the parent draws them)."""
    import transformers

    from rlpace.train import TrainConfig, train
    transformers.utils.logging.disable_progress_bar()
    train(TrainConfig(**cfg_dict))


def _count_steps(path: Path) -> int:
    try:
        return sum(1 for line in path.read_text().splitlines() if line.strip() and '"final"' not in line)
    except OSError:
        return 0


def run(args) -> int:
    import multiprocessing as mp

    import transformers
    from tqdm.auto import tqdm

    from rlpace.policies import make_method
    from rlpace.tasks import make_taskset
    from rlpace.train import TrainConfig, check_config, from_overrides, train
    from rlpace.train.recipes.grpo import base_policy
    from rlpace.train.report import compare_runs, format_table, load_run, plot_runs, write_html

    transformers.utils.logging.disable_progress_bar()
    t0 = time.perf_counter()
    out = Path(args.out)
    base = from_overrides(args.overrides, TrainConfig())
    base = dataclasses.replace(base, seed=args.seed, progress=False,
                               steps=args.steps if args.steps is not None else base.steps)
    names = [args.baseline, args.policy]
    if len(set(names)) != 2:
        raise ValueError(f"--policy and --baseline must differ; both are {args.policy!r}.")
    cfgs = {n: dataclasses.replace(base, policy=n, out=str(out / n.replace("/", "_"))) for n in names}
    for c in cfgs.values():                      # every input error before any work
        check_config(c)
        make_method(c.policy, **json.loads(c.policy_kwargs))
    # auto = one after the other. Measured on 2 shared cores: a 100-step run takes ~8 s at one
    # thread, so spawning two processes (each re-importing torch and transformers, 4–8 s)
    # does not pay: 24–34 s in two processes vs ~20 s in one; and two torch threads under
    # contention made one run take 33–91 s instead of 8 s (oversubscription).
    parallel = args.parallel == "on"
    out.mkdir(parents=True, exist_ok=True)

    # 1. the base policy (cached after the first run)
    tasks = make_taskset(base.tasks, train_per_domain=base.train_per_domain,
                         heldout_per_domain=base.heldout_per_domain, seed=base.seed)
    t_base = time.perf_counter()
    if not base.model:
        print("base policy: building or loading from cache ...")
        base_dir = base_policy(base, tasks, progress=True)
        print(f"base policy: {base_dir} ({time.perf_counter() - t_base:.0f} s)")
    t_base = time.perf_counter() - t_base

    # 2. train both policies under the same budget
    t_train = time.perf_counter()
    if parallel:
        cfgs = {n: dataclasses.replace(c, threads=1) for n, c in cfgs.items()}
        ctx = mp.get_context("spawn")
        procs = {n: ctx.Process(target=_train_quietly, args=(c.to_dict(),)) for n, c in cfgs.items()}
        for p in procs.values():
            p.start()
        bars = {n: tqdm(total=c.steps, desc=f"{n:>16s}", position=i) for i, (n, c) in enumerate(cfgs.items())}
        while any(p.is_alive() for p in procs.values()):
            for n, bar in bars.items():
                bar.update(_count_steps(Path(cfgs[n].out) / "metrics.jsonl") - bar.n)
            time.sleep(0.5)
        for n, bar in bars.items():
            bar.update(_count_steps(Path(cfgs[n].out) / "metrics.jsonl") - bar.n)
            bar.close()
        failed = [n for n, p in procs.items() if p.exitcode != 0]
        if failed:
            raise RuntimeError(f"training {failed} failed (exit codes "
                               f"{[procs[n].exitcode for n in failed]}); see the messages above.")
    else:
        for n, c in cfgs.items():
            train(dataclasses.replace(c, progress=True))
    t_train = time.perf_counter() - t_train

    # 3. summary table, plots, HTML
    runs = {n: load_run(c.out) for n, c in cfgs.items()}
    cmp = compare_runs(runs, reference=args.baseline)
    table = format_table(cmp)
    wall = time.perf_counter() - t0
    usage = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = sum(u.ru_utime + u.ru_stime for u in usage)
    print()
    print(table)
    images = plot_runs(runs, out, target=cmp["target"])
    notes = (f"rlpace demo: {args.baseline} vs {args.policy} on '{base.tasks}', {base.steps} steps × "
             f"{base.batch_prompts} prompts × {base.group_size} rollouts each, seed {args.seed}. "
             f"Wall {wall:.0f} s (base {t_base:.0f} s, training {t_train:.0f} s, "
             f"{'two processes' if parallel else 'one after the other'}), CPU {cpu:.0f} s. "
             f"One seed: see benchmarks/learning_efficiency.py for a comparison over seeds with CIs.")
    page = write_html(out / "report.html", title="rlpace demo: adaptive vs uniform scheduling",
                      table=table, images=images, notes=notes)
    (out / "summary.json").write_text(json.dumps({**cmp, "wall_seconds": wall, "cpu_seconds": cpu,
                                                  "base_seconds": t_base, "train_seconds": t_train,
                                                  "parallel": parallel}, indent=1, default=float))
    print(f"\n{notes}\nreport: {page}")
    return 0
