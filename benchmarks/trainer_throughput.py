"""Rollouts per second of rlpace's GRPO recipe versus TRL's GRPOTrainer (not a timed test).

Same tiny base policy (the cached warmed-up Qwen2 of `rlpace demo`), same prompts (the
embedded suite's pool), same group size G, prompts per step B, generation budget and
sampling temperature, same learning rate and one optimizer step per batch, one torch
thread each, in one process. TRL runs on CPU as ecosystem.md §2
prescribes: `use_cpu=True, bf16=False, report_to="none"`, no gradient checkpointing,
beta = 0 (no reference model; ours runs without one too), `loss_type="grpo"`.

Both stop a batch's generation when every row has produced EOS. Prompts get the same
tokens in both (BOS + text: the BOS is written into TRL's prompt text, which its
tokenizer maps to the BOS id). A step's time counts generation, reward, loss and the
optimizer; our time excludes held-out evaluation (TRL's run has none); the first steps
(warm-up) are left out of both. Reported: rollouts/s, completion tokens/s, the mean
completion length (to confirm equal work) and the ratio.

Clock: `--clock cpu` (the default) times each step in CPU time of the process, all its threads
(`time.process_time`; one torch thread each), so
the ratio measures the work each trainer does per rollout, not how long a shared machine
made it wait; the two trainers run one after the other, and on 2 cores shared with other
jobs their wall-clock ratio moved between 2.7× and 4.7× from one run to the next.
`--clock wall` times wall-clock seconds (`time.perf_counter`), the figure on a quiet machine.

Repeats: `--repeats` runs of each trainer, interleaved in one process with the order
alternating (rlpace, TRL, TRL, rlpace, ...); the figure is the median over repeats of the
ratio within a repeat, with its IQR and range, and the completion tokens per rollout of both
sides are printed and checked to be within 10 % (equal work).

Usage:
    python benchmarks/trainer_throughput.py              # 5 repeats × 20 timed steps each
    python benchmarks/trainer_throughput.py --steps 10 --batch-prompts 8 --repeats 3
    python benchmarks/trainer_throughput.py --profile /tmp/prof   # where a step's time goes
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def _clock(args):
    return time.process_time if args.clock == "cpu" else time.perf_counter


def measure_rlpace(args, base_cfg) -> dict:
    import types

    from rlpace.train import train
    from rlpace.train.recipes import grpo
    out = Path(tempfile.mkdtemp(prefix="rlpace-tp-"))
    cfg = dataclasses.replace(base_cfg, out=str(out), steps=args.steps + args.skip, eval_every=10**9,
                              checkpoint_every=0, progress=False)
    real = grpo.time
    grpo.time = types.SimpleNamespace(perf_counter=_clock(args))     # the recipe's per-step "seconds"
    try:
        train(cfg)
    finally:
        grpo.time = real
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [r for r in recs if not r.get("final")][args.skip:]
    secs = [r["seconds"] for r in steps]
    rollouts = sum(r["rollouts"] for r in steps)
    tokens = sum(r["tokens"] for r in steps)
    return {"rollouts_per_s": rollouts / sum(secs), "tokens_per_s": tokens / sum(secs),
            "median_step_s": statistics.median(secs), "mean_completion_tokens": tokens / rollouts,
            "steps": len(steps)}


def measure_trl(args, base_cfg, model_dir, tasks) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    items = list(tasks.train)
    ds = Dataset.from_list([{"prompt": tok.bos_token + it.prompt, "idx": i} for i, it in enumerate(items)])
    lengths = []

    def reward(prompts, completions, completion_ids, idx, **_):
        lengths.extend(len(c) for c in completion_ids)
        return tasks.score([items[i] for i in idx], completions).tolist()

    times = []
    clock = _clock(args)

    class StepTimer(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):
            self.t = clock()

        def on_step_end(self, a, state, control, **kw):
            times.append(clock() - self.t)

    b, g = base_cfg.batch_prompts, base_cfg.group_size
    conf = GRPOConfig(output_dir=tempfile.mkdtemp(prefix="trl-tp-"), use_cpu=True, bf16=False, fp16=False,
                      report_to="none", save_strategy="no", gradient_checkpointing=False,
                      per_device_train_batch_size=b * g, num_generations=g,
                      max_completion_length=base_cfg.max_new_tokens, temperature=base_cfg.temperature,
                      learning_rate=base_cfg.lr, beta=0.0, loss_type="grpo", logging_steps=10**6,
                      max_steps=args.steps + args.skip, dataloader_num_workers=0, seed=0,
                      disable_tqdm=True, lr_scheduler_type="constant")
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=conf, train_dataset=ds,
                          processing_class=tok, callbacks=[StepTimer()])
    trainer.train()
    secs = times[args.skip:]
    n = len(secs) * b * g
    toks = sum(lengths[args.skip * b * g:])
    return {"rollouts_per_s": n / sum(secs), "tokens_per_s": toks / sum(secs),
            "median_step_s": statistics.median(secs), "mean_completion_tokens": toks / max(1, n),
            "steps": len(secs)}


def _summary(values, digits: int = 2) -> str:
    """median [min, max] of a list of numbers."""
    return f"{statistics.median(values):.{digits}f} [{min(values):.{digits}f}, {max(values):.{digits}f}]"


# Phases of a training step: (label, file suffix, function, caller or None); a phase's time is
# the function's cumulative time (from that caller only, when one is named). STEP: the calls
# that make up a step; the step's time is their sum, and "other" is what no phase covers.
PHASES = {
    "rlpace": [("generation", "sampling.py", "sample_groups", None),     # less the scoring (below)
               ("reward (scoring)", "", "score", "sample_groups"),
               ("Scheduler", "scheduler.py", "propose", None), ("Scheduler", "scheduler.py", "observe", None),
               ("Scheduler", "scheduler.py", "admission", None), ("Scheduler", "scheduler.py", "loss_weights", None),
               ("Scheduler", "scheduler.py", "token_weights", None), ("Scheduler", "scheduler.py", "allocate", None),
               ("loss forward", "rollout.py", "completion_logprobs", "_update"),
               ("backward", "__init__.py", "backward", None), ("optimizer step", "optimizer.py", "wrapper", None),
               ("grad clipping", "clip_grad.py", "clip_grad_norm_", None),
               ("train()/eval() switches", "module.py", "train", None),
               ("train()/eval() switches", "train/model.py", "__call__", None)],      # ModeSwitch
    "trl": [("generation", "grpo_trainer.py", "_generate", None),
            ("reward (scoring)", "grpo_trainer.py", "_calculate_rewards", None),
            ("loss forward", "grpo_trainer.py", "_get_per_token_logps_and_entropies", None),
            ("backward", "accelerator.py", "backward", None), ("optimizer step", "optimizer.py", "wrapper", None),
            ("grad clipping", "accelerator.py", "clip_grad_norm_", None),
            ("train()/eval() switches", "module.py", "train", None)],
}
STEP = {"rlpace": [("sampling.py", "sample_groups"), ("grpo.py", "_update"), ("scheduler.py", "propose"),
                   ("scheduler.py", "observe"), ("scheduler.py", "admission"), ("scheduler.py", "loss_weights"),
                   ("scheduler.py", "token_weights"), ("scheduler.py", "allocate")],
        "trl": [("grpo_trainer.py", "training_step"), ("optimizer.py", "wrapper"),
                ("accelerator.py", "clip_grad_norm_")]}


def phase_table(stats, side: str) -> tuple[float, dict]:
    """(step seconds, {phase: seconds}) from a `pstats.Stats` of one trainer's run."""
    def cum(f_end, name, caller=None):
        t = 0.0
        for (file, _line, func), (_cc, _nc, _tt, ct, callers) in stats.stats.items():
            if func == name and file.endswith(f_end):
                t += ct if caller is None else sum(v[3] for k, v in callers.items() if k[2] == caller)
        return t
    out: dict = {}
    for label, f_end, name, caller in PHASES[side]:
        out[label] = out.get(label, 0.0) + cum(f_end, name, caller)
    if side == "rlpace":     # sample_groups = generate (under no_grad's wrapper) + decode + score
        out["generation"] -= out["reward (scoring)"]
    return sum(cum(f, n) for f, n in STEP[side]), out


def profile_phases(args, base_cfg, model_dir, tasks, out_dir: Path) -> None:
    """cProfile each trainer over one run (CPU clock, after an unprofiled warm-up run of each)
    and print where its steps' time goes: each phase's share of the steps (`PHASES`, `STEP`)."""
    import cProfile
    import pstats

    warm = argparse.Namespace(**{**vars(args), "steps": 1, "skip": 0})
    measure_rlpace(warm, base_cfg)              # imports and first-call costs, left out of the profiles
    measure_trl(warm, base_cfg, model_dir, tasks)
    for side in ("rlpace", "trl"):
        prof = cProfile.Profile(time.process_time)
        prof.enable()
        res = measure_rlpace(args, base_cfg) if side == "rlpace" else measure_trl(args, base_cfg, model_dir, tasks)
        prof.disable()
        path = out_dir / f"profile_{side}.pstats"
        prof.dump_stats(str(path))
        step, phases = phase_table(pstats.Stats(str(path)), side)
        n = res["steps"] + args.skip
        print(f"\n{side}: {n} steps, {1000 * step / n:.1f} ms CPU per step under the profiler; pstats in {path}")
        for label, t in sorted(phases.items(), key=lambda kv: -kv[1]):
            print(f"  {label:32s}{1000 * t / n:8.1f} ms  {100 * t / step:5.1f} %")
        rest = step - sum(phases.values())
        print(f"  {'other (padding, advantages, ...)':32s}{1000 * rest / n:8.1f} ms  {100 * rest / step:5.1f} %")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=20, help="timed steps per trainer and repeat")
    ap.add_argument("--skip", type=int, default=3, help="warm-up steps left out of the timing")
    ap.add_argument("--repeats", type=int, default=5,
                    help="runs of each trainer, interleaved (rlpace, TRL, TRL, rlpace, ...); the ratio "
                         "is the median over repeats of rlpace / TRL from the same repeat")
    ap.add_argument("--batch-prompts", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                    help="cpu: CPU time of the process (default; needs --threads 1); wall: wall-clock")
    ap.add_argument("--profile", metavar="DIR", default=None,
                    help="instead of timing: one cProfile'd run of each trainer (CPU clock), the share "
                         "of each phase printed and the pstats files written to DIR")
    args = ap.parse_args(argv)
    if args.clock == "cpu" and args.threads != 1:
        ap.error("--clock cpu adds up the CPU time of every thread; use --threads 1 or --clock wall")
    if args.repeats < 1:
        ap.error("--repeats must be ≥ 1")

    import torch
    import transformers
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    from rlpace.tasks import make_taskset
    from rlpace.train import TrainConfig
    from rlpace.train.recipes.grpo import base_policy

    cfg = TrainConfig(batch_prompts=args.batch_prompts, group_size=args.group_size,
                      max_new_tokens=args.max_new_tokens, threads=args.threads)
    tasks = make_taskset(cfg.tasks, train_per_domain=cfg.train_per_domain,
                         heldout_per_domain=cfg.heldout_per_domain, seed=cfg.seed)
    model_dir = base_policy(cfg, tasks, progress=True)
    if args.profile:
        out = Path(args.profile)
        out.mkdir(parents=True, exist_ok=True)
        profile_phases(args, cfg, model_dir, tasks, out)
        return 0
    loads, runs = [os.getloadavg()[0]], []
    for r in range(args.repeats):
        run = {}
        # interleaved, the order alternating: a load change hits both sides of neighbouring repeats
        for side in (("rlpace", "trl") if r % 2 == 0 else ("trl", "rlpace")):
            run[side] = measure_rlpace(args, cfg) if side == "rlpace" else measure_trl(args, cfg, model_dir, tasks)
            loads.append(os.getloadavg()[0])
        runs.append(run)
        print(f"repeat {r + 1}/{args.repeats}: rlpace {run['rlpace']['rollouts_per_s']:.0f}, TRL "
              f"{run['trl']['rollouts_per_s']:.0f} rollouts/s, ratio "
              f"{run['rlpace']['rollouts_per_s'] / run['trl']['rollouts_per_s']:.2f}×, load {loads[-1]:.1f}",
              flush=True)
    import trl as trl_mod
    print(f"\nB={cfg.batch_prompts} prompts × G={cfg.group_size}, ≤{cfg.max_new_tokens} new tokens, "
          f"{args.steps} timed steps × {args.repeats} interleaved repeats, {args.threads} torch thread(s), "
          f"TRL {trl_mod.__version__}, {'process CPU time' if args.clock == 'cpu' else 'wall-clock'}; "
          f"1-min load average {_summary(loads)} (median [min, max]) on {os.cpu_count()} CPUs"
          f"{' (contended)' if statistics.median(loads) > (os.cpu_count() or 1) else ''}")
    print(f"{'median [min, max] over repeats':30s}{'rlpace':>28s}{'TRL':>28s}")
    for key, label in (("rollouts_per_s", "rollouts / s"), ("tokens_per_s", "completion tokens / s"),
                       ("median_step_s", "median step (s)"), ("mean_completion_tokens", "tokens / rollout")):
        digits = 3 if key == "median_step_s" else 2
        print(f"{label:30s}{_summary([x['rlpace'][key] for x in runs], digits):>28s}"
              f"{_summary([x['trl'][key] for x in runs], digits):>28s}")
    ratios = [x["rlpace"]["rollouts_per_s"] / x["trl"]["rollouts_per_s"] for x in runs]
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    print(f"ratio rlpace / TRL rollouts/s: median {statistics.median(ratios):.2f}×, "
          f"IQR [{q[0]:.2f}, {q[2]:.2f}], range [{min(ratios):.2f}, {max(ratios):.2f}] "
          f"({', '.join(f'{x:.2f}' for x in ratios)})")
    ours_t = statistics.mean(x["rlpace"]["mean_completion_tokens"] for x in runs)
    trl_t = statistics.mean(x["trl"]["mean_completion_tokens"] for x in runs)
    gap = abs(ours_t - trl_t) / max(trl_t, 1e-9)
    print(f"equal work: {ours_t:.2f} vs {trl_t:.2f} completion tokens per rollout ({100 * gap:.1f} % apart; "
          f"{'within' if gap <= 0.1 else 'NOT within'} 10 %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
