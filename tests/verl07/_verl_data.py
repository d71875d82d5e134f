"""Shared helpers for the verl adapter tests (main env: verl 0.9; .venv-verl07: verl 0.7).

A tiny local tokenizer with a chat template (no hub), a verl-schema parquet, a data
config, and synthetic rollout batches (`DataProto`) with a hand-built reference
`Feedback` — the rows shuffled the way verl's batch balancing shuffles them.
"""

from __future__ import annotations

import os
import uuid

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")

CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def load_example(name: str):
    """The repository's examples/<name>.py, loaded as a module (the examples are no package)."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[2] / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def make_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "<eos>", "<unk>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([f"what is {a} plus {b}?" for a in range(20) for b in range(5)], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                   unk_token="<unk>", padding_side="left")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def write_parquet(path, n=40, *, index=True, duplicate=False, offset=100, domains=("math", "logic")):
    """verl schema: data_source, prompt (chat), ability, reward_model, extra_info.index."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    rows = []
    for i in range(n):
        extra = {"split": "train"}
        if index:
            extra["index"] = offset + (0 if duplicate and i == 1 else i)
        rows.append({"data_source": domains[i % len(domains)],
                     "prompt": [{"role": "user", "content": f"what is {i} plus {i % 5}?"}],
                     "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(i + i % 5)},
                     "extra_info": extra})
    pq.write_table(pa.Table.from_pylist(rows), str(path))
    return str(path)


def data_config(train, val, *, cache_dir, batch=4, policy="dump", seed=3, **over):
    from omegaconf import OmegaConf
    cfg = {"train_files": [train], "val_files": [val], "prompt_key": "prompt", "max_prompt_length": 256,
           "filter_overlong_prompts": True, "filter_overlong_prompts_workers": 1, "truncation": "error",
           "return_raw_chat": True, "shuffle": False, "seed": None, "dataloader_num_workers": 0,
           "train_batch_size": batch, "gen_batch_size": None, "cache_dir": cache_dir,
           "custom_cls": {"path": "pkg://rlpace.adapters.verl", "name": "RlpaceDataset"},
           "sampler": {"class_path": None, "class_name": None},
           "rlpace": {"policy": policy, "seed": seed}}
    for k, v in over.items():
        cfg[k] = v
    return OmegaConf.create(cfg)


def outcome(index: int, g: int, step: int) -> int:
    """Deterministic synthetic verifier result of rollout g of prompt `index` at `step`."""
    return int((index * 7 + g * 3 + step) % 5 < 2)


def rollout_batch(batch_dict, step, *, G=3, acc=True, seed=0, pool=None):
    """A post-`compute_advantage` DataProto for the prompts of one loader batch, and the
    reference (prompt positions, rewards[B,G], advantages[B,G]) built by a plain loop in
    the adapter's documented order (groups by first appearance, rows in engine order).
    The batch's `advantages` are 3·A_GRPO + 0.25; the reference advantages are GRPO's
    (r − mean) / (population std + 1e-6) of the rewards, what the Feedback must carry.

    Score = 0.7 − 0.5·acc, so success read from `acc` and from the score disagree.
    """
    import torch
    from verl import DataProto
    rng = np.random.default_rng([seed, step])
    extra = list(batch_dict["extra_info"])
    b, L = len(extra), 5
    uids = [str(uuid.uuid4()) for _ in range(b)]
    rows = [(p, g) for p in range(b) for g in range(G)]            # interleaved, as batch.repeat
    perm = rng.permutation(len(rows))                               # batch balancing reorders rows
    rows = [rows[i] for i in perm]
    acc_v = np.array([outcome(extra[p]["index"], g, step) for p, g in rows], dtype=np.float64)
    score = 0.7 - 0.5 * acc_v if acc else acc_v
    reward = acc_v if acc else score
    lengths = rng.integers(1, L + 1, size=len(rows))
    mask = torch.zeros(len(rows), L)
    scores = torch.zeros(len(rows), L)
    for r, n in enumerate(lengths):
        mask[r, :n] = 1
        scores[r, n - 1] = float(score[r])
    # GRPO advantage per group of the (success) rewards, broadcast over the response tokens.
    adv_seq = np.zeros(len(rows))
    for p in range(b):
        rr = [r for r, (q, _) in enumerate(rows) if q == p]
        v = reward[rr]
        adv_seq[rr] = (v - v.mean()) / (v.std() + 1e-6)
    # the engine's advantages are on another scale (as verl's other estimators give): the
    # Feedback must carry GRPO's, not these
    advantages = torch.tensor(3.0 * adv_seq + 0.25, dtype=torch.float32).unsqueeze(-1) * mask
    nt = {"uid": np.array([uids[p] for p, _ in rows], dtype=object),
          "extra_info": np.array([extra[p] for p, _ in rows], dtype=object),
          "data_source": np.array([batch_dict["data_source"][p] for p, _ in rows], dtype=object)}
    if acc:
        nt["acc"] = acc_v.copy()
    proto = DataProto.from_dict(tensors={"token_level_scores": scores, "response_mask": mask,
                                         "advantages": advantages}, non_tensors=nt)
    # reference: plain loop, groups in first-appearance order, rows in engine order
    order, groups = [], {}
    for r, (p, _) in enumerate(rows):
        if p not in groups:
            order.append(p)
            groups[p] = []
        groups[p].append(r)
    ids = [extra[p]["index"] for p in order]
    positions = pool.index_of(ids) if pool is not None else None
    rew = np.array([[reward[r] for r in groups[p]] for p in order])
    adv = np.array([[adv_seq[r] for r in groups[p]] for p in order])      # GRPO, float64
    return proto, positions, rew, adv, rows, order
