"""Does the saving hold at a larger scale? One command for one lent GPU (not a timed test).

The headroom question of `benchmarks/headroom.py` at a scale the 2-core CPU cannot run:
the `ladder` and `mostly_solved` suites with a base model ~12× the tiny one's parameters
(hidden 128, 6 layers, 4 heads: 1.58 M against the default 0.13 M), B = 64 prompts × G = 16
rollouts per step, `uniform` vs `recommended` vs the oracle (`oracle_boundary`: the top-B
prompts by measured p(1 − p); its measurement rollouts are not charged), 2 seeds: 12 runs.

Each suite and seed gets one base policy, built on the device: the same corpus, tokenizer,
model and warm-up schedule as `rlpace.train.model.build_base_policy` (its loop runs on the
model's device), saved under `--out`/bases and passed to the trainer as `model=`. Then the
runs go to `--jobs` worker processes that share the device. Every run has the same budget
(steps × B × G rollouts); held-out greedy accuracy every `--eval-every` steps.

Written to `--out`: `gpu_scale.md` (the device, the scale, one row per run, and per suite
the rollouts to 80 % of uniform's gain as a ratio to uniform with its paired bootstrap CI,
as `headroom.py` computes it), `gpu_scale.csv` (the runs) and `gpu_scale.json` (both,
with the device, versions, wall time and load average).

Usage:
    python benchmarks/gpu_scale.py                 # on the GPU (defaults: ≤ 8 min on one H200-class device)
    python benchmarks/gpu_scale.py --toy           # CPU smoke test at a toy size (~1 min on 2 cores)
    python benchmarks/gpu_scale.py --steps 40 --jobs 6 --out runs/bench/gpu_scale

The package never needs a GPU: on a machine without one the script runs on the CPU (say so
with --device cpu, or use --toy), and the table names the device it ran on.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import multiprocessing as mp
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

POLICIES = ("uniform", "recommended", "oracle_boundary")
SUITES = ("ladder", "mostly_solved")
TARGET_MINUTES = 8.0


def device_name(device: str) -> str:
    """What the table says the run ran on: the CUDA device's name and memory, else the CPU."""
    import torch
    if device.startswith("cuda"):
        i = torch.device(device).index or 0
        p = torch.cuda.get_device_properties(i)
        return f"{p.name} ({p.total_memory / 2**30:.0f} GiB), CUDA {torch.version.cuda}"
    return f"CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} logical cores"


def build_base(suite: str, seed: int, args) -> dict:
    """The suite's base policy for `seed` at the benchmark's scale, built on `args.device`
    (`build_base_policy`'s corpus, tokenizer, model and schedule); returns its record."""
    import torch

    from rlpace.tasks import make_taskset, parse_mistakes
    from rlpace.train.model import _quiet_transformers, supervised_warmup, tiny_causal_lm, train_char_tokenizer, \
        warmup_corpus
    out = Path(args.out) / "bases" / f"{suite}-seed{seed}"
    meta_path = out / "rlpace_base.json"
    spec = {"suite": suite, "seed": seed, "hidden": args.hidden, "layers": args.layers, "heads": args.heads,
            "warmup_steps": args.warmup_steps, "warmup_batch": args.warmup_batch, "device": args.device,
            "train_per_domain": args.train_per_domain, "heldout_per_domain": args.heldout}
    if meta_path.is_file() and json.loads(meta_path.read_text()).get("spec") == spec:
        return json.loads(meta_path.read_text())
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    tasks = make_taskset(suite, train_per_domain=args.train_per_domain, heldout_per_domain=args.heldout, seed=seed)
    items, weights = warmup_corpus(tasks, args.corpus_per_domain, 1.0, seed, parse_mistakes("default", suite))
    texts = [p + a for p, a in items] + [it.prompt + it.answer for it in tasks.train + tasks.heldout]
    tok = train_char_tokenizer(texts)
    max_len = 2 + max(len(t) for t in texts) + 8
    model = tiny_causal_lm(len(tok), hidden=args.hidden, layers=args.layers, heads=args.heads,
                           max_positions=max(64, max_len), seed=seed).to(args.device)
    losses = supervised_warmup(model, tok, items, weights, steps=args.warmup_steps, batch=args.warmup_batch,
                               lr=3e-3, seed=seed, progress=False)
    tiny = tiny_causal_lm(len(tok), hidden=64, layers=2, heads=4, seed=seed)     # TrainConfig's default size
    _quiet_transformers()
    out.mkdir(parents=True, exist_ok=True)
    model.to("cpu").save_pretrained(out)
    tok.save_pretrained(out)
    meta = {"spec": spec, "dir": str(out), "params": sum(p.numel() for p in model.parameters()),
            "tiny_params": sum(p.numel() for p in tiny.parameters()),
            "final_loss": float(np.mean(losses[-20:])), "seconds": time.perf_counter() - t0}
    meta_path.write_text(json.dumps(meta, indent=1))
    return meta


def run_config(suite: str, policy: str, seed: int, base_dir: str, args):
    from rlpace.train import TrainConfig
    return TrainConfig(out=str(Path(args.out) / "runs" / f"{suite}__{policy}__seed{seed}"), seed=seed,
                       policy=policy, tasks=suite, model=base_dir, device=args.device, threads=1,
                       steps=args.steps, max_rollouts=args.steps * args.batch_prompts * args.group_size,
                       batch_prompts=args.batch_prompts, group_size=args.group_size,
                       train_per_domain=args.train_per_domain, heldout_per_domain=args.heldout,
                       eval_every=args.eval_every, eval_batch=args.eval_batch, oracle_every=args.oracle_every,
                       oracle_rollouts=args.oracle_rollouts, lr=args.lr, checkpoint_every=0, progress=False)


def _run_one(cfg_dict: dict) -> dict:
    """Train one run (in a worker process) and return its row."""
    import torch
    import transformers

    from rlpace.train import TrainConfig, train
    from rlpace.train.report import load_run
    torch.set_num_threads(1)
    transformers.utils.logging.disable_progress_bar()
    cfg = TrainConfig(**cfg_dict)
    t0 = time.perf_counter()
    try:
        train(cfg)
    except Exception as e:  # noqa: BLE001 - one failed run is a row with its error, the table goes on
        return {"out": cfg.out, "error": f"{type(e).__name__}: {e}"}
    recs = load_run(cfg.out)
    steps = [r for r in recs if not r.get("final") and "rollouts_total" in r]
    evals = [r for r in recs if "eval/mean" in r]
    return {"out": cfg.out, "error": "", "steps": len(steps), "rollouts": steps[-1]["rollouts_total"] if steps else 0,
            "oracle_rollouts": int(sum(r.get("oracle_rollouts", 0) for r in steps)),
            "tokens": int(sum(r.get("tokens", 0) for r in steps)), "evals": len(evals),
            "base_acc": evals[0]["eval/mean"] if evals else math.nan,
            "final_acc": evals[-1]["eval/mean"] if evals else math.nan,
            "train_seconds": float(sum(r["seconds"] for r in steps)), "wall_seconds": time.perf_counter() - t0}


def _pool(jobs: int):
    # spawn: a CUDA context does not survive fork
    return ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn"))


def summary_rows(suite: str, runs: dict, seeds, policies) -> list[dict]:
    """`headroom.headroom_rows` of one suite's runs {(policy, seed): run dir}: rollouts to 80 %
    of uniform's gain / uniform's (paired bootstrap CI), final accuracy, captured share."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import headroom
    import learning_efficiency as le

    from rlpace.train.report import load_run
    curves = {p: {s: le.curve(load_run(runs[(p, s)])) for s in seeds} for p in policies}
    inform = {p: float(np.mean([np.mean([r["informative_groups"] for r in load_run(runs[(p, s)])
                                         if "informative_groups" in r]) for s in seeds])) for p in policies}
    return headroom.headroom_rows(suite, curves, inform, fraction=0.8, tail=3)


def _f(x, fmt="{:.3f}"):
    return "–" if x is None or (isinstance(x, float) and not math.isfinite(x)) else fmt.format(x)


def markdown(meta: dict, runs: list[dict], summaries: list[dict]) -> str:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import headroom
    a = meta["args"]
    lines = [f"# gpu_scale: {', '.join(a['suites'])} at {meta['params_ratio']:.3g}× the tiny model's parameters",
             "",
             f"Device: **{meta['device_name']}** (`{a['device']}`); torch {meta['torch']}, transformers "
             f"{meta['transformers']}; {a['jobs']} worker process(es); wall time {meta['wall_seconds'] / 60:.1f} min "
             f"(target ≤ {TARGET_MINUTES:.0f} min: {'met' if meta['wall_seconds'] <= 60 * TARGET_MINUTES else 'missed'}); "
             f"load average {meta['load_before']:.1f} → {meta['load_after']:.1f} on {os.cpu_count()} CPUs.",
             "",
             f"Model: Qwen2, hidden {a['hidden']}, {a['layers']} layers, {a['heads']} heads: {meta['params']:,} "
             f"parameters vs {meta['tiny_params']:,} (TrainConfig's default tiny model) = "
             f"{meta['params_ratio']:.3g}×. B = {a['batch_prompts']}, G = {a['group_size']}, {a['steps']} steps "
             f"({a['steps'] * a['batch_prompts'] * a['group_size']:,} rollouts per run), ≤ {meta['max_new_tokens']} "
             f"new tokens, lr {a['lr']}, eval every {a['eval_every']} steps on {a['heldout']} held-out prompts "
             f"per domain; oracle: {a['oracle_rollouts']} rollouts of every training prompt every "
             f"{a['oracle_every']} steps (not charged). Seeds {', '.join(map(str, meta['seeds']))}."
             f"{' TOY SIZE: a smoke test, not a measurement.' if a['toy'] else ''}",
             "", "## Runs", "",
             "| suite | policy | seed | steps | rollouts | oracle rollouts | base acc | final acc | train s | error |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        lines.append(f"| {r['suite']} | {r['policy']} | {r['seed']} | {r.get('steps', '–')} | {r.get('rollouts', '–')} | "
                     f"{r.get('oracle_rollouts', '–')} | {_f(r.get('base_acc'))} | {_f(r.get('final_acc'))} | "
                     f"{_f(r.get('train_seconds'), '{:.1f}')} | {r['error']} |")
    lines += ["", "## Rollouts to 80 % of uniform's gain, as a ratio to uniform (< 1 saves)", "",
              headroom.markdown(summaries, 0.8) if summaries else "(no suite finished every run)\n"]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--toy", action="store_true",
                    help="CPU smoke test: 1 suite (ladder), tiny model, B = 4, G = 4, 4 steps, 1 seed per policy")
    ap.add_argument("--device", default="", help="cuda, cuda:1, cpu (default: cuda when torch sees one, else cpu)")
    ap.add_argument("--suites", default=",".join(SUITES))
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--warmup-steps", type=int, default=600)
    ap.add_argument("--warmup-batch", type=int, default=128)
    ap.add_argument("--corpus-per-domain", type=int, default=2000)
    ap.add_argument("--batch-prompts", type=int, default=64)
    ap.add_argument("--group-size", type=int, default=16)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--eval-every", type=int, default=3)
    ap.add_argument("--eval-batch", type=int, default=1024)
    ap.add_argument("--heldout", type=int, default=64)
    ap.add_argument("--train-per-domain", type=int, default=256)
    ap.add_argument("--oracle-every", type=int, default=5)
    ap.add_argument("--oracle-rollouts", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--jobs", type=int, default=0, help="worker processes (default: 12 on a GPU, i.e. every run at once; 1 on the CPU)")
    ap.add_argument("--out", default="runs/bench/gpu_scale")
    args = ap.parse_args(argv)

    import torch
    import transformers
    if not args.device:
        args.device = "cpu" if args.toy or not torch.cuda.is_available() else "cuda"
    if args.toy:
        args.suites, args.seeds, args.hidden, args.layers, args.heads = "ladder", 1, 16, 1, 2
        args.warmup_steps, args.warmup_batch, args.corpus_per_domain = 20, 32, 50
        args.batch_prompts, args.group_size, args.steps, args.eval_every = 4, 4, 4, 2
        args.heldout, args.train_per_domain, args.oracle_every, args.oracle_rollouts = 4, 8, 2, 2
        args.eval_batch = 64
    args.jobs = args.jobs or (min(12, os.cpu_count() or 1) if args.device.startswith("cuda") else 1)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error(f"--device {args.device}: torch sees no CUDA device; use --device cpu or --toy")
    suites = [s for s in args.suites.split(",") if s]
    policies = [p for p in args.policies.split(",") if p]
    if "uniform" not in policies:
        ap.error("--policies must include uniform (the ratios are to uniform)")
    seeds = list(range(args.seeds))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    load_before, t0 = os.getloadavg()[0], time.perf_counter()

    # 1. base policies (one per suite and seed), on the device, in parallel
    pairs = [(s, seed) for s in suites for seed in seeds]
    if args.jobs > 1:
        with _pool(min(args.jobs, len(pairs))) as ex:
            bases = dict(zip(pairs, ex.map(build_base, *zip(*pairs), [args] * len(pairs))))
    else:
        bases = {(s, seed): build_base(s, seed, args) for s, seed in pairs}
    print(f"gpu_scale: {len(bases)} base policies on {args.device} in {time.perf_counter() - t0:.0f} s "
          f"({next(iter(bases.values()))['params']:,} parameters)", flush=True)

    # 2. the runs
    jobs = [(s, p, seed) for s in suites for p in policies for seed in seeds]
    cfgs = [run_config(s, p, seed, bases[(s, seed)]["dir"], args).to_dict() for s, p, seed in jobs]
    if args.jobs > 1:
        with _pool(args.jobs) as ex:
            results = list(ex.map(_run_one, cfgs))
    else:
        results = [_run_one(c) for c in cfgs]
    rows = [{"suite": s, "policy": p, "seed": seed, **r} for (s, p, seed), r in zip(jobs, results)]
    wall = time.perf_counter() - t0

    # 3. the tables
    summaries = []
    for s in suites:
        if all(not r["error"] for r in rows if r["suite"] == s):
            summaries += summary_rows(s, {(r["policy"], r["seed"]): r["out"] for r in rows if r["suite"] == s},
                                      seeds, policies)
    b0 = next(iter(bases.values()))
    meta = {"args": {**vars(args), "suites": suites, "policies": policies}, "seeds": seeds,
            "device_name": device_name(args.device), "torch": torch.__version__,
            "transformers": transformers.__version__, "params": b0["params"], "tiny_params": b0["tiny_params"],
            "params_ratio": b0["params"] / b0["tiny_params"], "max_new_tokens": run_config(
                suites[0], "uniform", 0, "", args).max_new_tokens, "bases": list(bases.values()),
            "wall_seconds": wall, "load_before": load_before, "load_after": os.getloadavg()[0]}
    (out / "gpu_scale.json").write_text(json.dumps({**meta, "runs": rows, "summary": summaries}, indent=1,
                                                   default=float))
    with open(out / "gpu_scale.csv", "w", newline="") as f:
        keys = list(dict.fromkeys(k for r in rows for k in r))
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    md = markdown(meta, rows, summaries)
    (out / "gpu_scale.md").write_text(md)
    print(md)
    print(f"wrote {out / 'gpu_scale.md'}, gpu_scale.csv, gpu_scale.json ({wall / 60:.1f} min)")
    return 1 if any(r["error"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
