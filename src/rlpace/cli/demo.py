"""Train a tiny model with `uniform` and with the `recommended` policy on the
`mostly_solved` suite (same rollout budget), then print how many rollouts each needed to
reach 80 % of uniform's gain, a summary table, and write an HTML report with captioned
plots and one run record per policy (runs/demo/runs/*.jsonl, the format `rlpace report`
reads) under runs/demo/.

The headline is `rlpace.evaluation.efficiency_vs_baseline`'s metric (the one `rlpace
report` and benchmarks/headroom.py use): target = base + 0.8 × (uniform's final − base),
uniform's final the mean of its last 3 evaluations; rollouts (refills and probes included)
to reach it, interpolated between evaluations; a run that never reaches it is censored at
its budget and its ratio is a lower bound. Steps to the target are a secondary line.
`mostly_solved` is the suite where scheduling has room to help (62 % of the prompts
solved by the base, 23 % it cannot learn): `tasks=embedded` gives the balanced control,
where no scheduler saves much.

The first run of a seed builds the tiny base policy (supervised warm-up, about 2 minutes on
2 cores; a new seed builds a new base) and caches it (`$RLPACE_CACHE` or ~/.cache/rlpace);
later runs reuse it. The two policies train one after the other with one torch thread
(measured faster than two processes at this size), or in two processes with `--parallel on`.

One seed is a demonstration, not a measurement: the demo prints the measured 8-seed figure
of the default demo (`MEASURED`, from benchmarks/headroom.py) beside its one seed. Every
seed's run records stay in OUT/runs/; rerun with `--seed 1`, `--seed 2`, ... and the same
--out, and the demo pairs the seeds in the folder (`seeds_summary`: the paired ratio with its
95 % bootstrap CI once there are 2 or more).

Example:
  rlpace demo                       # uniform vs recommended on mostly_solved, ~1 min on 2 cores
  rlpace demo tasks=embedded        # the balanced control suite
  rlpace demo --policy dump --steps 150 lr=5e-4
"""

from __future__ import annotations

from ..errors import InputError
import argparse
import dataclasses
import json
import re
import resource
import time
from pathlib import Path

#: The registry's `recommended` (DUMP's domain mixture with MoPPS inside each domain): the
#: composition the headroom evidence supports. Its figures against uniform and the oracle,
#: 8 seeds per suite, are in docs/headroom.md (benchmarks/headroom.py); the demo
#: shows one seed of it.
RECOMMENDED = "recommended"

#: The demo's task suite unless `tasks=...` is given: the one where the oracle shows
#: headroom (rlpace.tasks.SUITES).
DEMO_TASKS = "mostly_solved"

#: The measured multi-seed figure for the default demo (suite DEMO_TASKS, RECOMMENDED vs
#: uniform): rollouts to 80 % of uniform's gain as a ratio to uniform's, paired 95 %
#: bootstrap CI over 8 seeds, with the command that measured it (docs/headroom.md). The demo
#: prints it beside its one seed, so one seed is not read as the expected saving.
MEASURED = {"suite": DEMO_TASKS, "policy": RECOMMENDED, "baseline": "uniform", "seeds": 8,
            "ratio": 0.54, "low": 0.37, "high": 0.78,
            "command": "python benchmarks/headroom.py --suites mostly_solved --policies recommended "
                       "--seeds 8 --heldout 64 --eval-every 10"}


def measured_line(suite: str, policy: str, baseline: str) -> str:
    """The multi-seed figure that applies to this demo, or why none does."""
    m = MEASURED
    if (suite, policy, baseline) == (m["suite"], m["policy"], m["baseline"]):
        return (f"measured over {m['seeds']} seeds ({policy} vs {baseline} on {suite}, the default demo): "
                f"{m['ratio']:.2f}× [{m['low']:.2f}, {m['high']:.2f}] of {baseline}'s rollouts (paired 95 % "
                f"bootstrap CI; `{m['command']}`). Expect that, not one seed's figure.")
    return (f"no multi-seed figure is recorded for {policy} vs {baseline} on {suite} (the measured one, "
            f"{m['ratio']:.2f}× [{m['low']:.2f}, {m['high']:.2f}] over {m['seeds']} seeds, is for "
            f"{m['policy']} vs {m['baseline']} on {m['suite']}): add seeds with --seed 1, 2, ... and the same --out.")


def seeds_summary(records, *, suite: str, policy: str, baseline: str, steps: int, fraction: float = 0.8,
                  tail: int = 3) -> dict:
    """The demo's runs of every seed in its folder, paired: `efficiency_vs_baseline` over the
    seeds where both `policy` and `baseline` ran `suite` for `steps` steps.

    Returns {"seeds": [...], "ratio": CostRatio | None, "line": str}; ratio is None with fewer
    than 2 paired seeds or when the baseline gained nothing on a seed (the line says which).
    """
    from rlpace.errors import InputError
    from rlpace.evaluation import curves_from_runs, efficiency_vs_baseline
    curves: dict[str, dict[int, object]] = {policy: {}, baseline: {}}
    for r in records:
        if (r.get("suite") == suite and r.get("label") in curves
                and (r.get("budget") or {}).get("steps") == steps
                and (r.get("config") or {}).get("producer") == "rlpace demo"):
            ev = r["evals"]
            curves[r["label"]][int(r["seed"])] = curves_from_runs(ev["rollouts"], ev["acc_mean"], ev.get("step"))
    seeds = sorted(set(curves[policy]) & set(curves[baseline]))
    out = {"seeds": seeds, "ratio": None}
    where = f"seeds {', '.join(map(str, seeds))} in this folder"
    if len(seeds) < 2:
        out["line"] = (f"seeds so far: {', '.join(map(str, seeds)) or 'none'}; a paired CI needs ≥ 2: rerun with "
                       f"--seed {max(seeds, default=0) + 1} and the same --out.")
        return out
    try:
        eff = efficiency_vs_baseline({policy: {s: curves[policy][s] for s in seeds},
                                      baseline: {s: curves[baseline][s] for s in seeds}},
                                     baseline=baseline, fraction=fraction, tail=tail, n_boot=10_000, random_state=0)
    except InputError as e:
        out["line"] = f"over {where}: no paired figure ({e})"
        return out
    out["ratio"] = r = eff[policy].rollouts
    out["line"] = (f"over {where} ({len(seeds)} paired): {policy} needed {r} of {baseline}'s rollouts to reach "
                   f"{100 * fraction:.0f} % of its gain (paired 95 % bootstrap CI; reached on "
                   f"{r.reached_method}/{r.n} seeds).")
    return out


def add_arguments(parser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.description = __doc__
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="TrainConfig fields applied to both runs (see `rlpace train --help`); "
                             f"tasks defaults to {DEMO_TASKS}")
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
    from rlpace.experiments import read_records, write_record
    from rlpace.train.report import (compare_runs, format_table, load_run, plot_runs, run_records,
                                     summary_lines, write_html)

    from ._paths import check_output

    transformers.utils.logging.disable_progress_bar()
    t0 = time.perf_counter()
    out = Path(args.out)
    base = from_overrides(args.overrides, TrainConfig(tasks=DEMO_TASKS))
    base = dataclasses.replace(base, seed=args.seed, progress=False,
                               steps=args.steps if args.steps is not None else base.steps)
    names = [args.baseline, args.policy]
    if len(set(names)) != 2:
        raise InputError(f"--policy and --baseline must differ; both are {args.policy!r}.")
    cfgs = {n: dataclasses.replace(base, policy=n, out=str(out / n.replace("/", "_"))) for n in names}
    for c in cfgs.values():                      # every input error before any work
        check_config(c)
        make_method(c.policy, **json.loads(c.policy_kwargs))
    # auto = one after the other. Measured on 2 shared cores: a 100-step run takes ~8 s at one
    # thread, so spawning two processes (each re-importing torch and transformers, 4–8 s)
    # does not pay: 24–34 s in two processes vs ~20 s in one; and two torch threads under
    # contention made one run take 33–91 s instead of 8 s (oversubscription).
    parallel = args.parallel == "on"
    tasks = make_taskset(base.tasks, train_per_domain=base.train_per_domain,   # names a bad tasks=
                         heldout_per_domain=base.heldout_per_domain, seed=base.seed)
    check_output(out, "--out", kind="dir")
    out.mkdir(parents=True, exist_ok=True)       # only now: a refused input leaves no folder behind

    # 1. the base policy (cached after the first run)
    t_base = time.perf_counter()
    if not base.model:
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

    # 3. run records (read by `rlpace report`), summary table, plots, HTML
    runs = {n: load_run(c.out) for n, c in cfgs.items()}
    cmp = compare_runs(runs, reference=args.baseline)
    table = format_table(cmp)
    headline = summary_lines(cmp, args.policy)
    records = run_records(runs, cfgs, seed=args.seed, target=cmp["target"])
    for rec in records.values():
        write_record(out / "runs" / (re.sub(r"[^A-Za-z0-9_.-]", "-", rec["run_id"]) + ".jsonl"), rec)
    wall = time.perf_counter() - t0
    usage = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = sum(u.ru_utime + u.ru_stime for u in usage)
    # every seed's records in the folder: the paired figure over them, beside the measured one
    multi = seeds_summary(read_records(out / "runs"), suite=base.tasks, policy=args.policy,
                          baseline=args.baseline, steps=base.steps, tail=cmp["tail"])
    headline = headline + [multi["line"], measured_line(base.tasks, args.policy, args.baseline)]
    print()
    print(table)
    print()
    print("\n".join(headline))
    images = plot_runs(runs, out, target=cmp["target"], reference=args.baseline)
    seeds = multi["seeds"]
    notes = (f"rlpace demo: {args.baseline} vs {args.policy} on '{base.tasks}', {base.steps} steps × "
             f"{base.batch_prompts} prompts × {base.group_size} rollouts each; this run: seed {args.seed} "
             f"(the table and figures), the folder: seeds {', '.join(map(str, seeds))} (the paired line). "
             f"Wall {wall:.0f} s (base {t_base:.0f} s, training {t_train:.0f} s, "
             f"{'two processes' if parallel else 'one after the other'}), CPU {cpu:.0f} s. "
             f"One seed is a demonstration, not a measurement: run records of every seed are in {out / 'runs'}; "
             f"rerun with --seed {max(seeds, default=args.seed) + 1} and the same --out to add one, and "
             f"`rlpace report {out}` for the full paired statistics.")
    page = write_html(out / "report.html", title="rlpace demo: adaptive vs uniform scheduling",
                      table="\n".join(headline) + "\n\n" + table, images=images, notes=notes)
    ratio = multi["ratio"]
    (out / f"summary_seed{args.seed}.json").write_text(json.dumps({**cmp, "seed": args.seed}, indent=1, default=float))
    (out / "summary.json").write_text(json.dumps({**cmp, "summary": headline, "wall_seconds": wall, "cpu_seconds": cpu,
                                                  "seeds": seeds, "seeds_ratio": None if ratio is None else ratio._asdict(),
                                                  "base_seconds": t_base, "train_seconds": t_train,
                                                  "parallel": parallel}, indent=1, default=float))
    print(f"\n{notes}\nreport: {page}")
    return 0
