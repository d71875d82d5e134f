"""GRPO with TRL on CPU, prompts scheduled by rlpace — a complete, tiny run.

    python examples/trl_grpo.py [--policy dump] [--steps 20] [--zero-lag] [--out runs/trl_grpo]

A random-init 2-layer Qwen2 and a byte-level BPE tokenizer are built locally (no hub).
The prompts come from two domains whose verifiable rewards differ by construction: for
`echo` prompts the reward is 1 when the completion contains a digit of the prompt, for
`never` prompts it is always 0 (nothing to learn: GRPO advantage 0). An adaptive policy
(`dump`) should move its mass to `echo`; the run prints `rlpace/domain_prob/*` from TRL's
logs. A checkpoint is written every 10 steps with `rlpace_scheduler.npz` beside the model;
`--resume PATH` continues from one.
"""

from __future__ import annotations

import argparse
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
    def on_log(self, args, state, control, logs=None, **kwargs):
        probs = {k.split("/")[-1]: round(v, 2) for k, v in (logs or {}).items() if "domain_prob" in k}
        if probs:
            print(f"step {state.global_step:3d}  reward {logs.get('reward', float('nan')):.2f}  "
                  f"p(domain) {probs}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy", default="dump")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--zero-lag", action="store_true", help="propose at generation time (no lag)")
    ap.add_argument("--out", default="runs/trl_grpo")
    ap.add_argument("--resume", default=None, help="a checkpoint-N directory of an earlier run")
    args = ap.parse_args()
    torch.set_num_threads(1)

    rows = [{"prompt": f"repeat {i % 10}{i % 7}:", "data_source": "echo", "index": i} for i in range(64)]
    rows += [{"prompt": f"say nothing {i}:", "data_source": "never", "index": 64 + i} for i in range(64)]
    dataset = Dataset.from_list(rows)
    model, tokenizer = tiny_model_and_tokenizer([r["prompt"] + " 0123456789" for r in rows])

    scheduler = Scheduler(pool_from_dataset(dataset, domain_column="data_source", id_column="index"),
                          args.policy, seed=0)
    config = GRPOConfig(output_dir=args.out, use_cpu=True, bf16=False, report_to="none", seed=0,
                        per_device_train_batch_size=32, num_generations=4, max_completion_length=8,
                        max_steps=args.steps, logging_steps=1, save_steps=10, beta=0.0,
                        learning_rate=3e-3, dataloader_num_workers=0, gradient_checkpointing=False,
                        disable_tqdm=True)
    trainer = RlpaceGRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=dataset,
                                processing_class=tokenizer, scheduler=scheduler, zero_lag=args.zero_lag,
                                callbacks=[PrintSchedule()])
    trainer.remove_callback(PrinterCallback)           # PrintSchedule prints a short line instead
    trainer.train(resume_from_checkpoint=args.resume)
    print("checkpoints:", sorted(p.name for p in Path(args.out).glob("checkpoint-*")))


if __name__ == "__main__":
    main()
