"""Rollouts per second of rlpace's GRPO recipe versus TRL's GRPOTrainer (not a timed test).

Same tiny base policy (the cached warmed-up Qwen2 of `rlpace demo`), same prompts (the
embedded suite's pool), same group size G, prompts per step B, generation budget and
sampling temperature, same learning rate and one optimizer step per batch, one torch
thread each, in one process one after the other. TRL runs on CPU as ecosystem.md §2
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

Usage:
    python benchmarks/trainer_throughput.py              # 30 timed steps each
    python benchmarks/trainer_throughput.py --steps 10 --batch-prompts 8
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=30, help="timed steps per trainer")
    ap.add_argument("--skip", type=int, default=3, help="warm-up steps left out of the timing")
    ap.add_argument("--batch-prompts", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                    help="cpu: CPU time of the process (default; needs --threads 1); wall: wall-clock")
    args = ap.parse_args(argv)
    if args.clock == "cpu" and args.threads != 1:
        ap.error("--clock cpu adds up the CPU time of every thread; use --threads 1 or --clock wall")

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
    load = os.getloadavg()[0]
    ours = measure_rlpace(args, cfg)
    trl = measure_trl(args, cfg, model_dir, tasks)
    load = max(load, os.getloadavg()[0])
    import trl as trl_mod
    print(f"\nB={cfg.batch_prompts} prompts × G={cfg.group_size}, ≤{cfg.max_new_tokens} new tokens, "
          f"{args.steps} timed steps, {args.threads} torch thread(s), TRL {trl_mod.__version__}, "
          f"{'process CPU time' if args.clock == 'cpu' else 'wall-clock'}; "
          f"load average up to {load:.1f} on {os.cpu_count()} CPUs"
          f"{' (contended)' if load > (os.cpu_count() or 1) else ''}")
    print(f"{'':24s}{'rlpace':>12s}{'TRL':>12s}{'ratio':>10s}")
    for key, label in (("rollouts_per_s", "rollouts / s"), ("tokens_per_s", "completion tokens / s"),
                       ("median_step_s", "median step (s)"), ("mean_completion_tokens", "tokens / rollout")):
        ratio = ours[key] / trl[key] if key != "median_step_s" else trl[key] / ours[key]
        print(f"{label:24s}{ours[key]:12.2f}{trl[key]:12.2f}{ratio:9.2f}×")
    return 0


if __name__ == "__main__":
    sys.exit(main())
