"""Wall time of the default `rlpace compare` matrix (DataFlex-RL's 13 configurations × 8
seeds), on the simulator and on the embedded suite (built-in trainer), and where it goes.

    .venv/bin/python benchmarks/compare_matrix.py                      # sim full + embedded estimate
    .venv/bin/python benchmarks/compare_matrix.py --only sim
    .venv/bin/python benchmarks/compare_matrix.py --only embedded --embedded-seeds 8   # full (≈ 1 h+)
    .venv/bin/python benchmarks/compare_matrix.py --only registry --out /tmp/slice   # registry × 3 suites × 1 seed
    .venv/bin/python benchmarks/compare_matrix.py --only registry --registry-analyze --out /tmp/slice  # stopped early
    .venv/bin/python benchmarks/compare_matrix.py --only eval          # held-out evaluation, memo vs none

Registry: `rlpace compare`'s runner over every registered policy (the oracle_* tools left
out) × embedded, ladder, mostly_solved × --registry-seeds seeds at the trainer's 100 steps,
in persistent worker processes; the 8-seed matrix is estimated from each run's process CPU
time (see `bench_registry`).

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
import functools
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


def _cpu_timed_run(spec, work_dir: str | None = None) -> dict:
    """`rlpace.experiments.run_spec` (what `rlpace compare` runs in each worker), with the run's
    process CPU seconds and its worker in the record (`bench`): on shared cores the CPU time
    is what the run would take on a core of its own, the wall time is not."""
    from rlpace.experiments import run_spec
    first = not _WORKER.get("warm")
    c0, w0 = time.process_time(), time.perf_counter()
    rec = run_spec(spec, work_dir)
    _WORKER["warm"] = True
    rec["bench"] = {"cpu_seconds": time.process_time() - c0, "wall_seconds": time.perf_counter() - w0,
                    "worker_pid": os.getpid(), "first_in_worker": first,
                    "worker_cpu_before": c0, "load": os.getloadavg()[0]}
    return rec


_WORKER: dict = {}


def _startup_cpu(suite: str) -> float:
    """Process CPU seconds of a fresh process's imports and first model load (what a worker's
    first run pays once), in one fresh process."""
    import subprocess
    import sys
    code = ("import time, torch; from rlpace.train import TrainConfig; "
            "from rlpace.train.recipes.grpo import base_policy, _build_data; "
            "from rlpace.train.model import load_policy; "
            f"c = TrainConfig(tasks={suite!r}, seed=0, progress=False); "
            "load_policy(base_policy(c, _build_data(c)[0]), 'cpu'); print(time.process_time())")
    vals = [float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                 env={**os.environ, "OMP_NUM_THREADS": "1"}).stdout.split()[-1])
            for _ in range(1)]
    return vals[0]


def _base_builds(suites: list[str], seeds: int) -> tuple[dict, list]:
    """({(suite, seed): build seconds} of the cached base policies of the trainer's default
    config, [(suite, seed) not cached yet]), as `rlpace compare` would look them up."""
    from rlpace.tasks import make_taskset
    from rlpace.tasks import parse_mistakes
    from rlpace.train import TrainConfig
    from rlpace.train.model import base_policy_dir, default_cache_dir
    built, missing = {}, []
    for suite in suites:
        for seed in range(seeds):
            c = TrainConfig(tasks=suite, seed=seed)
            ts = make_taskset(suite, train_per_domain=c.train_per_domain,
                              heldout_per_domain=c.heldout_per_domain, seed=seed)
            spec = dict(hidden=c.hidden, layers=c.layers, heads=c.heads, warmup_steps=c.warmup_steps,
                        warmup_batch=c.warmup_batch, warmup_lr=c.warmup_lr, warmup_decay=c.warmup_decay,
                        warmup_mistakes=dict(sorted(parse_mistakes(c.warmup_mistakes, suite).items())),
                        corpus_per_domain=2000, seed=seed)
            meta = base_policy_dir(ts, c.cache_dir or default_cache_dir(), **spec) / "rlpace_base.json"
            if meta.is_file():
                built[(suite, seed)] = float(json.loads(meta.read_text())["seconds"])
            else:
                missing.append((suite, seed))
    return built, missing


def _interleaved(grid_cls):
    """A Grid whose runs go policy by policy in a seeded random order, each policy's suites and
    seeds together: a slice stopped early (rerun with --registry-analyze) has measured a random
    subset of the policies on every suite, so its mean run is an unbiased estimate."""
    class Interleaved(grid_cls):
        def runs(self):
            runs = grid_cls.runs(self)
            labels = [p.label for p in self.policies]
            order = np.random.default_rng(0).permutation(len(labels))
            rank = {labels[i]: k for k, i in enumerate(order)}
            return sorted(runs, key=lambda r: (rank[r.label], r.seed))       # stable: suites in order
    return Interleaved


def bench_registry(out: Path, workers: int, suites: list[str], steps: int, seeds: int,
                   full_seeds: int = 8, run: bool = True) -> dict:
    """The whole registry (the oracle_* measurement tools left out) × `suites` × `seeds` seeds
    at `steps` steps, through `rlpace compare`'s own runner (`run_grid`: persistent worker
    processes, one record per run, resumable: rerun with the same --out to finish a slice),
    then the `full_seeds`-seed matrix ESTIMATED from process CPU time:

        matrix CPU  = full_seeds / seeds × Σ (CPU seconds of each measured run)
        2 cores     = matrix CPU / workers + one worker start (imports, first model load)
                      (+ every base build / workers, for a fresh cache: the median of the
                      cached builds' own timer per suite, wall time as contended as they ran)

    printed beside the 60-minute goal, with CPU per run per suite and the dearest policies.

    CPU time, not wall time, because the cores are shared: a run's CPU seconds are what it
    takes on a core of its own (the estimate assumes the workers stay busy, as they do on a
    queue of hundreds of runs). Each worker's first run also pays the lazy imports (a few
    seconds, once per worker): scaling it with the seeds overstates the matrix slightly."""
    from rlpace.experiments import Grid, read_records, run_grid
    from rlpace.policies import names
    pols = [n for n in names() if not n.startswith("oracle_")]
    grid = _interleaved(Grid)(policies=tuple(pols), seeds=seeds, suites=tuple(suites), steps=steps)
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    failed: dict = {}
    if run:
        res = run_grid(grid, out, workers=workers, run_fn=_cpu_timed_run, progress=True)
        failed = res.failed
    t_grid = time.perf_counter() - t0
    load1 = os.getloadavg()
    recs = {r["run_id"]: r for r in read_records(out / "runs")}
    stamps = sorted(r["provenance"]["created"] for r in recs.values())
    print(f"\n== registry: {len(pols)} policies × {len(suites)} suites × {seeds} seed(s), {steps} steps "
          f"each, workers={workers}: {_fmt(t_grid)} wall in this call; {len(recs)} records "
          f"({stamps[0] if stamps else '-'} .. {stamps[-1] if stamps else '-'}); load average "
          f"{load0[0]:.1f} at the start, {load1[0]:.1f} at the end")
    print(f"{'suite':14s} {'policy':26s} {'cpu s':>7s} {'wall s':>7s} {'loop s':>7s} {'eval s':>7s}")
    cpu_by_suite: dict = {x: 0.0 for x in suites}
    n_by_suite: dict = {x: 0 for x in suites}
    warm_by_suite: dict = {x: 0 for x in suites}
    startup = None
    eval_share, firsts = [], []
    run_cpu_of: dict = {}                 # (label, suite) -> CPU s of the run (a worker's start taken out)
    for spec in grid.runs():
        r = recs.get(spec.run_id)
        if r is None or "bench" not in r:
            continue
        b = r["bench"]
        ph = _split_run(out / "work" / spec.run_id)
        n_by_suite[spec.suite] += 1
        eval_share.append(ph["eval"] / max(b["wall_seconds"], 1e-9))
        run_cpu = b["cpu_seconds"]
        if b["first_in_worker"]:         # its CPU includes the worker's imports: less a fresh process's
            startup = startup if startup is not None else _startup_cpu(suites[0])
            firsts.append(f"{spec.run_id} {run_cpu:.1f} s")
            run_cpu = max(run_cpu - startup, 0.0)
        cpu_by_suite[spec.suite] += run_cpu
        warm_by_suite[spec.suite] += 1
        run_cpu_of[(spec.label, spec.suite)] = run_cpu
        print(f"{spec.suite:14s} {spec.label:26s} {b['cpu_seconds']:7.1f} {b['wall_seconds']:7.1f} "
              f"{ph['loop']:7.1f} {ph['eval']:7.1f}")
    for rid, err in failed.items():
        last = [x for x in err.strip().splitlines() if x.strip()]
        print(f"FAILED {rid}: {last[-1] if last else err}")
    done = sum(n_by_suite.values())
    # policies the trainer refuses (InputError, e.g. gvm: an allocation with gradient features)
    # cost the matrix nothing: the projection counts the policies that run
    label_of = {spec.run_id: spec.label for spec in grid.runs()}
    refused = sorted({label_of[json.loads(f.read_text())["run_id"]] for f in (out / "failed").glob("*.json")
                      if "InputError" in json.loads(f.read_text())["error"]
                      and json.loads(f.read_text())["run_id"] in label_of})
    n_run = len(pols) - len(refused)
    if refused:
        print(f"refused by the trainer (not counted in the projection): {', '.join(refused)}")
    # Per suite: the mean measured run × every policy (a random subset of the policies when the
    # slice was stopped early; the whole registry once it is complete).
    cpu = sum(cpu_by_suite[x] / warm_by_suite[x] * n_run for x in suites if warm_by_suite[x])
    if any(n_by_suite[x] < len(pols) for x in suites):
        print(f"PARTIAL slice: {', '.join(f'{x} {n_by_suite[x]}/{len(pols)}' for x in suites)} policies "
              f"measured; each suite's Σ is its mean run × {n_run}")
    scale = full_seeds / seeds
    built, missing = _base_builds(suites, full_seeds)
    # a base build's seconds as its builder timed them (wall time, under whatever load it ran at):
    # the median per suite, so that one build under heavy load does not set the figure
    med = {x: float(np.median([v for (a, _), v in built.items() if a == x])) for x in suites
           if any(a == x for a, _ in built)}
    build_mean = float(np.mean(list(med.values()))) if med else 0.0
    build_missing = sum(med.get(a, build_mean) for a, _ in missing)
    build_all = full_seeds * sum(med.get(x, build_mean) for x in suites)   # a fresh cache: every base once
    low = {x: min(v for (a, _), v in built.items() if a == x) for x in med}
    print("base build by the cached builds' own timer (wall s, as contended as they ran): median "
          + ", ".join(f"{x} {v:.0f} s" for x, v in med.items()) + "; fastest "
          + ", ".join(f"{x} {v:.0f} s" for x, v in low.items()))
    est_cpu = scale * cpu
    est = est_cpu / workers
    start = startup if startup is not None else 0.0            # each worker's imports + first load, in parallel
    print(f"per suite: " + ", ".join(f"{x} {cpu_by_suite[x]:.0f} CPU s over {warm_by_suite[x]} runs "
                                      f"({cpu_by_suite[x] / max(1, warm_by_suite[x]):.1f} s/run)" for x in suites))
    if firsts:
        print(f"first run of a worker, less the {startup:.1f} CPU s of a fresh process's imports and first "
              f"model load (once per worker in the matrix): {', '.join(firsts)}")
    print(f"held-out evaluation: median {100 * np.median(eval_share) if eval_share else float('nan'):.0f}% "
          f"of a run's wall time")
    print(f"measured: {done} of {len(grid.runs())} runs, Σ CPU {sum(cpu_by_suite.values()):.0f} s "
          f"(all {n_run} policies that run: {cpu:.0f} s); this call's wall {t_grid:.0f} s")
    print(f"base policies of seeds 0-{full_seeds - 1}: {len(built)} cached, {len(missing)} to build "
          f"({', '.join(f'{a}/{b}' for a, b in missing) or 'none'}; ≈ {build_missing:.0f} s of one core at "
          f"the cached builds' mean)")
    # the dearest policies: CPU per run summed over the suites (a policy's cost in one seed's matrix row)
    by_label: dict = {}
    for (label, suite), v in run_cpu_of.items():
        by_label.setdefault(label, {})[suite] = v
    full = {k: v for k, v in by_label.items() if len(v) == len(suites)}
    dear = sorted(full, key=lambda k: -sum(full[k].values()))[:6]
    mean_row = cpu / n_run if n_run else float("nan")
    print(f"dearest policies (CPU s per run, over the {len(suites)} suites; the mean policy {mean_row:.1f} s): "
          + "; ".join(f"{k} {sum(full[k].values()):.1f} (" + ", ".join(f"{full[k][x]:.1f}" for x in suites) + ")"
                      for k in dear))
    print(f"{full_seeds}-seed matrix PROJECTION on {workers} idle cores of its own "
          f"(runs: {scale:g} × Σ CPU {cpu:.0f} s / {workers}; worker start {start:.1f} s once, in parallel):")
    print(f"  bases cached       {_fmt(est + start)}   ratio {(est + start) / 3600:.2f} × the 60-min goal")
    print(f"  + every base built {_fmt(est + start + build_all / workers)}   ratio "
          f"{(est + start + build_all / workers) / 3600:.2f} × the 60-min goal "
          f"({len(suites) * full_seeds} builds at the medians above, / {workers})")
    if missing:
        print(f"  this cache ({len(missing)} to build) {_fmt(est + start + build_missing / workers)}")
    print(f"goal 60 min         ratio {(est + start) / 3600:.2f} × the goal (bases cached)")
    return {"grid_s": t_grid, "cpu_s": cpu, "estimate_s": est + start,
            "estimate_built_s": est + start + build_all / workers, "dearest": dear, "failed": list(failed)}


def _plain_heldout_accuracy(model, tokenizer, taskset, *, max_new_tokens, chat=False, batch=512) -> dict:
    """The held-out evaluation without its memo (as before it had one): encode, greedy decode,
    score, at every call."""
    import torch

    from rlpace.train.rollout import decode_completions, encode_prompts, generate
    items = list(taskset.heldout)
    scores = np.zeros(len(items), dtype=np.float32)
    prompts = encode_prompts(tokenizer, [it.prompt for it in items], chat)
    model.eval()
    with torch.no_grad():
        for s in range(0, len(items), batch):
            ro = generate(model, prompts[s:s + batch], max_new_tokens=max_new_tokens, greedy=True,
                          eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id)
            scores[s:s + batch] = taskset.score(items[s:s + batch], decode_completions(tokenizer, ro))
    out = {d: float(scores[[it.domain == d for it in items]].mean()) for d in taskset.domains}
    out["mean"] = float(np.mean(list(out.values())))
    return out


def bench_eval(suites: list[str], runs: int = 3) -> dict:
    """Held-out evaluation's CPU seconds in one process, as `runs` trainer runs of one (suite,
    seed) call it: 11 evaluations each (steps 0, 10, ..., 100), a weight changed between
    them as training would; with the memo (`rlpace.train.evaluate`: the step-0 greedy decoding
    of the shared base once per process, the prompts encoded once per run) and without it."""
    import copy

    import torch

    import rlpace.train.evaluate as ev
    from rlpace.train import TrainConfig
    from rlpace.train.recipes.grpo import _build_data, base_policy
    from rlpace.train.model import load_policy
    torch.set_num_threads(1)
    out = {}
    for suite in suites:
        cfg = TrainConfig(tasks=suite, seed=0, progress=False)
        full, tasks, *_ = _build_data(cfg)
        base, tok0 = load_policy(base_policy(cfg, full), "cpu")
        row = {}
        for memo in (False, True):
            fn = (functools.partial(ev.heldout_accuracy, memo=ev.GreedyMemo()) if memo
                  else _plain_heldout_accuracy)
            c0 = time.process_time()
            accs = []
            for r in range(runs):         # each run trains its own way after step 0: its own weights
                model, tok = copy.deepcopy(base), copy.deepcopy(tok0)      # a run's fresh load
                for k in range(11):
                    accs.append(fn(model, tok, tasks, max_new_tokens=cfg.max_new_tokens,
                                   chat=cfg.chat, batch=cfg.eval_batch)["mean"])
                    with torch.no_grad():                                  # "training" between evaluations
                        model.lm_head.weight.add_(torch.randn(model.lm_head.weight.shape,
                                                              generator=torch.Generator().manual_seed(1000 * r + k)) * 1e-3)
            row[memo] = (time.process_time() - c0, accs)
        same = row[False][1] == row[True][1]
        print(f"{suite:14s} evaluation CPU per run: {row[False][0] / runs:6.2f} s without the memo, "
              f"{row[True][0] / runs:6.2f} s with it ({runs} runs of one seed, 11 evaluations each; "
              f"same accuracies: {same})")
        out[suite] = (row[False][0] / runs, row[True][0] / runs, same)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=("sim", "embedded", "registry", "eval"), default=None,
                    help="registry: every registered policy × --suites, one seed, --registry-steps steps, "
                         "and the 8-seed estimate (not run by default)")
    ap.add_argument("--suites", default="embedded,ladder,mostly_solved", help="--only registry: trainer suites")
    ap.add_argument("--registry-steps", type=int, default=None,
                    help="--only registry: steps per measured run (default: the trainer's, 100)")
    ap.add_argument("--registry-seeds", type=int, default=1, help="--only registry: seeds measured")
    ap.add_argument("--registry-analyze", action="store_true",
                    help="--only registry: no runs, the estimate from the records already in --out "
                         "(a slice stopped early)")
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
                       args.registry_steps or TrainConfig().steps, args.registry_seeds,
                       run=not args.registry_analyze)
    if args.only == "eval":
        bench_eval([x for x in args.suites.split(",") if x])
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
