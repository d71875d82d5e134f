"""Step time of `RlpaceGRPOTrainer` with and without per-rollout gradient features, side by
side in one run (not a timed test).

A random Qwen2 (hidden H, L layers; the BPE tokenizer of tests/_tiny_lm.py, vocabulary
≈ 300) trained by TRL's GRPOTrainer on CPU, B prompts × G rollouts per step, one
micro-batch per step (steps_per_generation = 1), lm_head features (d ≤ 256):

    plain     policy=uniform                 no features
    features  policy=uniform grad_features=on  the feature pass on every generation batch (the
                                             benchmark calls it: uniform reads no features, so
                                             `Scheduler.step` would skip it), weights 1
    diem      policy=diem, loss_weights=True   features → DIEM weights → scaled advantages

Runs alternate (plain, features, diem, plain, ...) so drifts of a shared machine hit every
configuration alike. Reported: the median step time (generation, scoring, the feature pass
and the optimizer step) over the steps after `--skip`, the median time of the feature pass
alone, and the step time relative to `plain`. Times are CPU time of the process
(`time.process_time`, all its threads; `--clock wall` for wall-clock seconds): on 2 cores
shared with other jobs the wall-clock medians read `features` 27 % *faster* than `plain`.

Usage:
    python benchmarks/trl_gradients.py                      # B = 16, G = 8, H = 128, L = 4
    python benchmarks/trl_gradients.py --hidden 256 --layers 4 --completion 32
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

CONFIGS = ("plain", "features", "diem")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--skip", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batch-prompts", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--completion", type=int, default=16, help="max_completion_length")
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                    help="cpu: CPU time of the process (default); wall: wall-clock seconds")
    args = ap.parse_args(argv)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    warnings.filterwarnings("ignore")
    import torch
    import transformers
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig

    from rlpace import Scheduler
    from rlpace.adapters.trl import RlpaceGRPOTrainer, pool_from_dataset
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from _tiny_lm import build_tiny_lm

    torch.set_num_threads(1)
    transformers.utils.logging.disable_progress_bar()
    tmp = Path(tempfile.mkdtemp())
    prompts = [f"what is {i} plus {3 * i % 7}?" for i in range(4 * args.batch_prompts)]
    lm = build_tiny_lm(tmp / "lm", prompts, hidden=args.hidden, layers=args.layers)
    ds = Dataset.from_list([{"prompt": p, "index": i, "data_source": ["a", "b"][i % 2]} for i, p in enumerate(prompts)])
    b, g = args.batch_prompts, args.group_size

    def reward(completions, **kw):
        return [float(len(c) % 3 == 0) for c in completions]

    def one(name: str, k: int) -> tuple[list[float], list[float]]:
        feat_times: list[float] = []
        step_times: list[float] = []

        class Timed(RlpaceGRPOTrainer):
            def _rlpace_grad_features(self, output):
                t = clock()
                out = super()._rlpace_grad_features(output)
                feat_times.append(clock() - t)
                return out

            def _rlpace_feedback(self, inputs, output, first=True):
                r = super()._rlpace_feedback(inputs, output, first)
                if name == "features":
                    # `Scheduler.step` calls the features only for a policy that reads them, and
                    # uniform does not: run the same pass here, on the loss as admitted
                    self._rlpace_grad_features(output)
                return r

        class StepTimer(TrainerCallback):
            def on_step_begin(self, a, state, control, **kw):
                self.t = clock()

            def on_step_end(self, a, state, control, **kw):
                step_times.append(clock() - self.t)

        cfg = GRPOConfig(output_dir=str(tmp / f"{name}{k}"), use_cpu=True, bf16=False, report_to="none", seed=0,
                         per_device_train_batch_size=b * g, num_generations=g, max_completion_length=args.completion,
                         max_steps=args.steps, logging_steps=1, save_strategy="no", beta=0.0,
                         dataloader_num_workers=0, learning_rate=1e-5, disable_tqdm=True)
        sched = Scheduler(pool_from_dataset(ds, domain_column="data_source"), "diem" if name == "diem" else "uniform",
                          seed=0)
        tr = Timed(model=AutoModelForCausalLM.from_pretrained(lm), reward_funcs=reward, args=cfg, train_dataset=ds,
                   processing_class=AutoTokenizer.from_pretrained(lm), scheduler=sched,
                   loss_weights=name == "diem", grad_features="on" if name == "features" else "auto",
                   callbacks=[StepTimer()])
        tr.train()
        return step_times[args.skip:], feat_times[args.skip:]

    times = {c: [] for c in CONFIGS}
    feats = {c: [] for c in CONFIGS}
    for k in range(args.rounds):
        for c in CONFIGS:
            s, f = one(c, k)
            times[c] += s
            feats[c] += f
    base = float(np.median(times["plain"]))
    print(f"TRL {__import__('trl').__version__}, Qwen2 H={args.hidden} L={args.layers} V≈300, B={b}, G={g}, "
          f"completion ≤ {args.completion} tokens, {args.rounds} rounds × {args.steps - args.skip} timed steps, 1 thread, "
          f"{'process CPU time' if args.clock == 'cpu' else 'wall-clock'}; load average {os.getloadavg()[0]:.1f}\n")
    print("| config | median step (s) | vs plain | feature pass (s) |")
    print("|---|---|---|---|")
    for c in CONFIGS:
        m = float(np.median(times[c]))
        fp = f"{np.median(feats[c]):.3f}" if feats[c] else "–"
        print(f"| {c} | {m:.3f} | {100 * (m / base - 1):+.1f} % | {fp} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
