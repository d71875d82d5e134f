"""Wall time of the default `rlpace compare` matrix (DataFlex-RL's 13 configurations × 8
seeds), on the simulator and on the embedded suite (built-in trainer), and where it goes.

    .venv/bin/python benchmarks/compare_matrix.py                      # sim full + embedded estimate
    .venv/bin/python benchmarks/compare_matrix.py --only sim
    .venv/bin/python benchmarks/compare_matrix.py --only embedded --embedded-seeds 8   # full (≈ 1 h+)
    .venv/bin/python benchmarks/compare_matrix.py --only registry      # whole registry × 3 suites, estimate

Simulator: the whole 13 × 8 matrix at the `rlpace compare` defaults (sim:ladder, 200
steps, B = 128, G = 16), `--workers` processes, then the report (analysis + figures + HTML).

Embedded: the 13 configurations × `--embedded-seeds` seeds (default 1) at the trainer's
default budget, in `--workers` processes, with a fresh base-policy cache so that building
the per-seed base policy is counted. The 8-seed figure is then an ESTIMATE:

    base builds:  8 × (build seconds of one base policy) / workers
    runs:         8 × Σ_policies (run seconds, base build excluded) / workers

(both assume the workers stay busy, as they do on a 104-run queue). With
--embedded-seeds 8 it is measured instead. Time per run is split from the trainer's log
into rollout generation + bookkeeping, the loss/optimizer step, the periodic held-out
evaluation, and setup (loading, tokenising, the final evaluation, checkpoint).

Goal: ≤ 60 minutes for the embedded matrix on 2 cores. The machine is shared
with other jobs: figures are contended and noisy — report them with the command.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("OMP_NUM_THREADS", "1")


def _fmt(sec: float) -> str:
    return f"{sec / 60:6.1f} min ({sec:7.0f} s)"


def bench_sim(out: Path, workers: int, seeds: int) -> dict:
    from rlpace.experiments import report_from_dir
    from rlpace.experiments import Grid, default_policies, read_records, run_grid
    plan = default_policies()
    grid = Grid(policies=plan.policies, seeds=seeds, suites=("sim:ladder",), steps=200)
    t0 = time.perf_counter()
    res = run_grid(grid, out, workers=workers, progress=True)
    t_grid = time.perf_counter() - t0
    recs = read_records(out / "runs")
    per_policy = {}
    for r in recs:
        per_policy.setdefault(r["label"], []).append(r["seconds"])
    t1 = time.perf_counter()
    report_from_dir(out, n_boot=10_000)
    t_report = time.perf_counter() - t1
    serial = sum(sum(v) for v in per_policy.values())
    print(f"\n== simulator: {len(plan.policies)} configurations × {seeds} seeds = {len(grid.runs())} runs "
          f"(sim:ladder, 200 steps, B=128, G=16), workers={workers}")
    print(f"{'policy':26s} {'mean s/run':>10s} {'× uniform':>10s}")
    base = np.mean(per_policy.get("uniform", [np.nan]))
    for lab in [p.label for p in plan.policies]:
        v = np.mean(per_policy[lab])
        print(f"{lab:26s} {v:10.2f} {v / base:10.2f}")
    print(f"grid wall time      {_fmt(t_grid)}   (Σ run seconds {serial:.0f} s -> parallel "
          f"efficiency {serial / (t_grid * workers):.2f} over {workers} workers; the rest is "
          f"worker start-up, imports and writing records)")
    print(f"report              {_fmt(t_report)}   (10 000 bootstrap resamples per comparison, 5 figures)")
    print(f"total               {_fmt(t_grid + t_report)}   {res.summary()}")
    return {"grid_s": t_grid, "report_s": t_report, "runs": len(grid.runs())}


def _split_run(work: Path) -> dict:
    """Seconds of one trainer run by phase, from its metrics.jsonl."""
    from rlpace.train.report import load_run
    rows = load_run(work)
    steps = [r for r in rows if not r.get("final")]
    sec = np.array([r["seconds"] for r in steps])
    train = np.array([r["train_seconds"] for r in steps])
    is_eval = np.array(["eval/mean" in r for r in steps])
    # An eval step costs its step's usual time plus the evaluation: estimate the evaluation
    # as the excess of eval steps over the median of the other steps.
    plain = np.median(sec[~is_eval]) if (~is_eval).any() else 0.0
    t_eval = float(np.clip(sec[is_eval] - plain, 0, None).sum())
    return {"loop": float(sec.sum()), "train": float(train.sum()), "eval": t_eval,
            "rollout": float(sec.sum() - train.sum() - t_eval), "steps": len(steps)}


def bench_embedded(out: Path, workers: int, seeds: int, steps: int | None) -> dict:
    from rlpace.experiments import Grid, default_policies, read_records, run_grid
    from rlpace.train import TrainConfig
    plan = default_policies()
    n_steps = steps or TrainConfig().steps
    cache = out / "base-cache"
    shutil.rmtree(cache, ignore_errors=True)
    grid = Grid(policies=plan.policies, seeds=seeds, suites=("embedded",), steps=n_steps,
                options={"cache_dir": str(cache)})
    t0 = time.perf_counter()
    res = run_grid(grid, out, workers=workers, progress=True)
    t_grid = time.perf_counter() - t0
    recs = read_records(out / "runs")
    builds = [json.loads(p.read_text())["seconds"] for p in cache.glob("*/rlpace_base.json")]
    labels = [p.label for p in plan.policies]
    phases = {r["run_id"]: _split_run(out / "work" / r["run_id"]) for r in recs}
    setup_raw = {r["run_id"]: max(r["seconds"] - phases[r["run_id"]]["loop"], 0.0) for r in recs}
    typical = float(np.median(list(setup_raw.values())))
    # The first run of each seed also builds that seed's base policy (in its setup): its
    # excess setup over the typical run is the build, as it ran (contended) in the grid.
    excess = {rid: v - typical for rid, v in setup_raw.items() if v - typical > 10.0}
    t_build = float(np.mean(list(excess.values()))) if excess else (float(np.mean(builds)) if builds else 0.0)
    print(f"\n== embedded: {len(plan.policies)} configurations × {seeds} seed(s) measured, "
          f"{n_steps} steps each (trainer defaults), workers={workers}")
    print(f"base policy build   {t_build:7.1f} s per seed in the grid ({len(excess)} builds; the builder's "
          f"own timer says {np.mean(builds) if builds else float('nan'):.1f} s); shared by all policies of a seed")
    print(f"mean seconds per run (base build excluded), over {seeds} seed(s):")
    print(f"{'policy':26s} {'run s':>7s} {'loop':>7s} {'rollout':>8s} {'train':>7s} {'eval':>7s} "
          f"{'setup':>7s} {'× uniform':>9s}")
    run_s: dict = {}
    tot = {"rollout": 0.0, "train": 0.0, "eval": 0.0, "setup": 0.0, "base build": sum(excess.values())}
    rows: dict = {}
    for r in recs:
        ph = dict(phases[r["run_id"]])
        ph["setup"] = setup_raw[r["run_id"]] - excess.get(r["run_id"], 0.0)
        run_s.setdefault(r["label"], []).append(ph["loop"] + ph["setup"])
        rows.setdefault(r["label"], []).append(ph)
        for k in ("rollout", "train", "eval", "setup"):
            tot[k] += ph[k]
    base = np.mean(run_s.get("uniform", [np.nan]))
    for lab in labels:
        m = {k: np.mean([ph[k] for ph in rows[lab]]) for k in ("loop", "rollout", "train", "eval", "setup")}
        own = np.mean(run_s[lab])
        print(f"{lab:26s} {own:7.1f} {m['loop']:7.1f} {m['rollout']:8.1f} {m['train']:7.1f} "
              f"{m['eval']:7.1f} {m['setup']:7.1f} {own / base:9.2f}")
    per_seed = sum(np.mean(v) for v in run_s.values())            # Σ over policies, one seed
    est_runs = 8 * per_seed / workers
    est_build = 8 * t_build / workers
    est = est_runs + est_build
    total_phase = sum(tot.values())
    print("where the time goes (all measured runs): " + ", ".join(
        f"{k} {100 * v / total_phase:.0f}%" for k, v in tot.items()))
    print(f"measured grid wall  {_fmt(t_grid)}   {res.summary()}")
    measured = seeds == 8 and len(res.ran) == len(grid.runs())
    value = t_grid if measured else est
    how = ("MEASURED wall time" if measured else
           "ESTIMATE from the per-run times" + ("" if seeds == 8 else f" of {seeds} seed(s)"))
    print(f"8-seed matrix       {_fmt(value)}   [{how}; per worker ≈ base builds {est_build:.0f} s + "
          f"runs {est_runs:.0f} s, {workers} workers]")
    print(f"goal 60 min         ratio {value / 3600:.2f} × the goal")
    return {"grid_s": t_grid, "estimate_s": est, "per_seed_s": per_seed, "build_s": t_build}


def _timed_run(cfg_dict: dict) -> tuple[float, str]:
    """(wall seconds, error or '') of one trainer run in a worker process."""
    import torch

    from rlpace.train import TrainConfig, train
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    try:
        train(TrainConfig(**cfg_dict))
    except Exception as e:  # noqa: BLE001 - a policy that cannot run on a suite is a row, not a crash
        return time.perf_counter() - t0, f"{type(e).__name__}: {str(e)[:120]}"
    return time.perf_counter() - t0, ""


def bench_registry(out: Path, workers: int, suites: list[str], steps: int, full_steps: int,
                   seeds: int = 8) -> dict:
    """The whole registry (the oracle_* measurement tools left out) × `suites`, one seed, `steps`
    steps per run, then the full matrix (`seeds` seeds × `full_steps` steps) ESTIMATED per run as

        setup (loading, tokenising, final evaluation) + full_steps × (its median non-evaluation
        step) + full_steps / eval_every × (its evaluation's excess over a plain step)

    plus one base build per suite and seed (its `rlpace_base.json` build time), all over
    `workers` busy workers. Runs go straight to the built-in trainer (the way
    `benchmarks/headroom.py` runs ladder and mostly_solved; `rlpace compare` takes sim: and
    embedded suites only)."""
    from concurrent.futures import ProcessPoolExecutor

    from rlpace.policies import names
    from rlpace.tasks import make_taskset
    from rlpace.train import TrainConfig
    from rlpace.train.recipes.grpo import base_policy
    pols = [n for n in names() if not n.startswith("oracle_")]
    builds = {}
    for suite in suites:                          # bases first: parallel runs never race on them
        c = TrainConfig(tasks=suite, seed=0, progress=False)
        d = base_policy(c, make_taskset(suite, train_per_domain=c.train_per_domain,
                                        heldout_per_domain=c.heldout_per_domain, seed=0), progress=False)
        builds[suite] = json.loads((Path(d) / "rlpace_base.json").read_text())["seconds"]
    jobs = [(suite, p) for suite in suites for p in pols]
    cfgs = [TrainConfig(out=str(out / suite / p), tasks=suite, policy=p, seed=0, steps=steps, threads=1,
                        checkpoint_every=0, progress=False).to_dict() for suite, p in jobs]
    eval_every = TrainConfig().eval_every
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=workers) as ex:
        results = list(ex.map(_timed_run, cfgs))
    t_grid = time.perf_counter() - t0
    print(f"\n== registry: {len(pols)} policies × {len(suites)} suites × 1 seed, {steps} steps each, "
          f"workers={workers}: {_fmt(t_grid)} wall")
    print(f"{'suite':14s} {'policy':26s} {'run s':>7s} {'setup':>7s} {'step s':>7s} {'eval s':>7s} "
          f"{'est. ' + str(full_steps) + '-step run':>18s}")
    est_runs, failed = 0.0, []
    for (suite, p), (sec, err), c in zip(jobs, results, cfgs):
        if err:
            failed.append(f"{suite}/{p}: {err}")
            continue
        ph = _split_run(Path(c["out"]))
        from rlpace.train.report import load_run
        recs = [r for r in load_run(c["out"]) if not r.get("final")]
        evals = sum(1 for r in recs if "eval/mean" in r)
        plain = [r["seconds"] for r in recs if "eval/mean" not in r] or [0.0]
        step_s = float(np.median(plain))
        eval_s = ph["eval"] / max(1, evals)
        setup = max(sec - ph["loop"], 0.0)
        est = setup + full_steps * step_s + (full_steps // eval_every) * eval_s
        est_runs += est
        print(f"{suite:14s} {p:26s} {sec:7.1f} {setup:7.1f} {step_s:7.3f} {eval_s:7.2f} {est:18.1f}")
    for f in failed:
        print(f"not run: {f}")
    est_build = sum(builds.values())
    total = seeds * (est_runs + est_build) / workers
    print(f"base builds (one per suite and seed): {', '.join(f'{k} {v:.0f} s' for k, v in builds.items())}")
    print(f"{seeds}-seed matrix ESTIMATE  {_fmt(total)}   [{seeds} × (Σ estimated runs {est_runs:.0f} s + "
          f"base builds {est_build:.0f} s) / {workers} workers; {len(jobs) - len(failed)} of {len(jobs)} "
          f"runs ran]")
    print(f"goal 60 min         ratio {total / 3600:.2f} × the goal")
    return {"grid_s": t_grid, "estimate_s": total, "failed": failed}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=("sim", "embedded", "registry"), default=None,
                    help="registry: every registered policy × --suites, one seed, --registry-steps steps, "
                         "and the 8-seed estimate (not run by default)")
    ap.add_argument("--suites", default="embedded,ladder,mostly_solved", help="--only registry: trainer suites")
    ap.add_argument("--registry-steps", type=int, default=10, help="--only registry: steps per measured run")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--sim-seeds", type=int, default=8)
    ap.add_argument("--embedded-seeds", type=int, default=1,
                    help="seeds measured on the embedded suite (8 = the full matrix, ≈ 1 h+)")
    ap.add_argument("--embedded-steps", type=int, default=None, help="default: TrainConfig().steps")
    ap.add_argument("--out", default=None, help="keep the runs here (default: a temporary folder)")
    args = ap.parse_args()
    root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="rlpace-bench-"))
    print(f"runs under {root}; machine: {os.cpu_count()} cores visible, load average "
          f"{os.getloadavg()[0]:.1f} (shared: figures are contended)")
    if args.only in (None, "sim"):
        bench_sim(root / "sim", args.workers, args.sim_seeds)
    if args.only in (None, "embedded"):
        bench_embedded(root / "embedded", args.workers, args.embedded_seeds, args.embedded_steps)
    if args.only == "registry":
        from rlpace.train import TrainConfig
        bench_registry(root / "registry", args.workers, [x for x in args.suites.split(",") if x],
                       args.registry_steps, args.embedded_steps or TrainConfig().steps)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
