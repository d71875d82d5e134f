"""GRPO with TRL on CPU, prompts scheduled by rlpace — a complete, tiny run.

    python examples/trl_grpo.py [--policy dump] [--steps 20] [--zero-lag] [--out runs/trl_grpo]
    python examples/trl_grpo.py --compare-refills     # DAPO dynamic sampling with vs without refills
    python examples/trl_grpo.py --policy uniform --record pilot.jsonl   # a pilot for `rlpace advise`

A random-init 2-layer Qwen2 and a byte-level BPE tokenizer are built locally (no hub).
The prompts come from two domains whose verifiable rewards differ by construction: for
`echo` prompts the reward is 1 when the completion contains a digit of the prompt, for
`never` prompts it is always 0 (nothing to learn: GRPO advantage 0). An adaptive policy
(`dump`) should move its mass to `echo`; the run prints `rlpace/domain_prob/*` from TRL's
logs. A checkpoint is written every 10 steps with `rlpace_scheduler.npz` beside the model;
`--resume PATH` continues from one.

With an admission policy that drops groups (`--policy dump+dapo_dynamic_sampling`: every
`never` group is uniform, and so is most of `echo` early on), the trainer generates further
chunks until the batch holds B kept groups or `--max-refill-rounds` extra rounds ran (DAPO's
`max_num_gen_batches`). `--compare-refills` runs that policy twice, with 0 and with 4 refill
rounds, and prints the share of the trained batch's groups that carry a gradient and the
rollouts each run generated.

`--record PATH` writes the pilot record `rlpace advise --pilot PATH` reads (one line per
generation batch: prompt ids, rewards [B, G], step, rollouts); `--pool-out PATH` writes the
prompts as the JSONL pool it takes (`--pool`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from datasets import Dataset
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM, TrainerCallback
from transformers.trainer_callback import PrinterCallback
from trl import GRPOConfig

from rlpace import Scheduler
from rlpace.adapters.trl import RlpaceGRPOTrainer, pool_from_dataset


def tiny_model_and_tokenizer(texts: list[str]):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<eos>", "<pad>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>",
                                   padding_side="left")
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=len(fast), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id, tie_word_embeddings=True))
    return model, fast


def reward(prompts, completions, data_source, **kwargs):
    """1 if an `echo` completion repeats a digit of its prompt; `never` prompts get 0."""
    return [float(src == "echo" and any(ch.isdigit() and ch in p for ch in c))
            for p, c, src in zip(prompts, completions, data_source)]


class PrintSchedule(TrainerCallback):
    def __init__(self):
        self.logs = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        if "rlpace/rollouts_total" in logs:
            self.logs.append(logs)
        probs = {k.split("/")[-1]: round(v, 2) for k, v in logs.items() if "domain_prob" in k}
        if probs or "rlpace/rollouts_total" in logs:
            print(f"step {state.global_step:3d}  reward {logs.get('reward', float('nan')):.2f}  "
                  f"kept {logs.get('rlpace/kept_fraction_trained', float('nan')):.2f}  "
                  f"rollouts {logs.get('rlpace/rollouts_total', 0):.0f}  p(domain) {probs}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy", default="dump")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--zero-lag", action="store_true", help="propose at generation time (no lag)")
    ap.add_argument("--out", default="runs/trl_grpo")
    ap.add_argument("--resume", default=None, help="a checkpoint-N directory of an earlier run")
    ap.add_argument("--max-refill-rounds", type=int, default=4,
                    help="extra generation rounds while the admission drops groups (0: never refill)")
    ap.add_argument("--record", default=None, help="write the pilot record `rlpace advise --pilot` reads")
    ap.add_argument("--pool-out", default=None, help="write the prompts as a JSONL pool for `rlpace advise --pool`")
    ap.add_argument("--compare-refills", action="store_true",
                    help="run dump+dapo_dynamic_sampling with 0 and 4 refill rounds and compare")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if not args.compare_refills:
        train(args.policy, args.steps, args.zero_lag, args.max_refill_rounds, args.out, args.resume, args.record,
              args.pool_out)
        print("checkpoints:", sorted(p.name for p in Path(args.out).glob("checkpoint-*")))
        return
    rows = {}
    for rounds in (0, 4):
        logs = train("dump+dapo_dynamic_sampling", args.steps, args.zero_lag, rounds, f"{args.out}/refill{rounds}")
        rows[rounds] = (sum(x["rlpace/kept_fraction_trained"] for x in logs) / len(logs),
                        int(logs[-1]["rlpace/rollouts_total"]), sum(x["reward"] for x in logs) / len(logs))
    print(f"\n{'max_refill_rounds':>17}  {'trained groups with a gradient':>30}  {'rollouts':>8}  {'mean reward of the rollouts':>28}")
    for rounds, (kept, rollouts, rew) in rows.items():
        print(f"{rounds:>17}  {kept:>30.2f}  {rollouts:>8d}  {rew:>28.3f}")


def train(policy: str, steps: int, zero_lag: bool, max_refill_rounds: int, out: str, resume=None, record=None,
          pool_out=None) -> list[dict]:
    """One run; returns the logged steps (each with the rlpace/* metrics)."""
    rows = [{"prompt": f"repeat {i % 10}{i % 7}:", "data_source": "echo", "index": i} for i in range(64)]
    rows += [{"prompt": f"say nothing {i}:", "data_source": "never", "index": 64 + i} for i in range(64)]
    dataset = Dataset.from_list(rows)
    if pool_out:
        pool = [{"data_source": r["data_source"], "extra_info": {"index": r["index"]}} for r in rows]
        Path(pool_out).write_text("".join(json.dumps(p) + "\n" for p in pool))
    model, tokenizer = tiny_model_and_tokenizer([r["prompt"] + " 0123456789" for r in rows])

    scheduler = Scheduler(pool_from_dataset(dataset, domain_column="data_source", id_column="index"),
                          policy, seed=0)
    config = GRPOConfig(output_dir=out, use_cpu=True, bf16=False, report_to="none", seed=0,
                        per_device_train_batch_size=32, num_generations=4, max_completion_length=8,
                        max_steps=steps, logging_steps=1, save_steps=10, beta=0.0,
                        learning_rate=3e-3, dataloader_num_workers=0, gradient_checkpointing=False,
                        disable_tqdm=True)
    trainer = RlpaceGRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=dataset,
                                processing_class=tokenizer, scheduler=scheduler, zero_lag=zero_lag,
                                max_refill_rounds=max_refill_rounds, record=record,
                                callbacks=[printer := PrintSchedule()])
    trainer.remove_callback(PrinterCallback)           # PrintSchedule prints a short line instead
    trainer.train(resume_from_checkpoint=resume)
    return printer.logs


if __name__ == "__main__":
    main()
