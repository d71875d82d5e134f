"""rlpace's verl data path on CPU, without Ray or a GPU: the same objects verl builds.

    python examples/verl_dataset.py [--policy dump] [--steps 8]

It writes a small verl-schema parquet (two domains: `easy` prompts are solved 90% of the
time, `hard` 10%), builds the dataset from the config lines a real run passes
(`data.custom_cls` → `RlpaceDataset`), draws batches through verl's `StatefulDataLoader`
and collate function, sends a synthetic post-advantage `DataProto` to `on_batch_end` each
step (what verl's trainer does), prints the Scheduler's domain shares, then saves the
loader state the way verl writes `data.pt` and shows the restored loader continues.

A real run (GPU) takes the same data.* lines; see examples/verl_grpo.sh and docs/engines.md.
"""

from __future__ import annotations

import argparse
import tempfile
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from omegaconf import OmegaConf
from torchdata.stateful_dataloader import StatefulDataLoader
from verl import DataProto
from verl.trainer.ppo.utils import create_rl_dataset, create_rl_sampler
from verl.utils.dataset.rl_dataset import collate_fn

from rlpace.adapters.verl import load_data_pt

G = 4  # rollouts per prompt (actor_rollout_ref.rollout.n)


def write_parquet(path: Path, n: int) -> None:
    rows = [{"data_source": "easy" if i % 2 else "hard",
             "prompt": [{"role": "user", "content": f"question {i}"}],
             "reward_model": {"style": "rule", "ground_truth": "0"},
             "extra_info": {"index": i, "split": "train"}} for i in range(n)]
    pq.write_table(pa.Table.from_pylist(rows), str(path))


def fake_rollouts(batch_dict: dict, rng: np.random.Generator) -> DataProto:
    """What verl's batch holds after compute_advantage: G rows per prompt, shuffled."""
    b = len(batch_dict["extra_info"])
    p_success = np.where(batch_dict["data_source"] == "easy", 0.9, 0.1)
    prompt = np.repeat(np.arange(b), G)
    acc = (rng.random(b * G) < p_success[prompt]).astype(np.float64)
    grouped = acc.reshape(b, G)
    adv = ((grouped - grouped.mean(1, keepdims=True)) / (grouped.std(1, keepdims=True) + 1e-6)).ravel()
    perm = rng.permutation(b * G)                      # verl's batch balancing reorders rows
    uid = np.array([str(uuid.uuid4()) for _ in range(b)], dtype=object)
    mask = torch.ones(b * G, 3)
    return DataProto.from_dict(
        tensors={"token_level_scores": torch.tensor(acc[perm])[:, None] * torch.tensor([0.0, 0.0, 1.0]),
                 "advantages": torch.tensor(adv[perm], dtype=torch.float32)[:, None] * mask,
                 "response_mask": mask},
        non_tensors={"uid": uid[prompt[perm]], "extra_info": batch_dict["extra_info"][prompt[perm]],
                     "acc": acc[perm]})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy", default="dump", help="an rlpace policy name (rlpace policies)")
    ap.add_argument("--steps", type=int, default=8)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="rlpace_verl_"))
    write_parquet(tmp / "train.parquet", 128)
    write_parquet(tmp / "val.parquet", 8)
    # The lines a verl run passes on its command line (Hydra overrides), as a config here.
    cfg = OmegaConf.from_dotlist([
        f"train_files=[{tmp / 'train.parquet'}]", f"val_files=[{tmp / 'val.parquet'}]",
        "train_batch_size=8", "shuffle=False", "dataloader_num_workers=0",
        "filter_overlong_prompts=False", f"cache_dir={tmp / 'cache'}",
        "custom_cls.path=pkg://rlpace.adapters.verl", "custom_cls.name=RlpaceDataset",
        f"rlpace.policy={args.policy}", "rlpace.seed=0"])
    ds = create_rl_dataset(cfg.train_files, cfg, tokenizer=None, processor=None)
    loader = StatefulDataLoader(ds, batch_size=cfg.train_batch_size, num_workers=0, drop_last=True,
                                collate_fn=collate_fn, sampler=create_rl_sampler(cfg, ds))
    rng = np.random.default_rng(0)
    it = iter(loader)
    for step in range(args.steps):
        batch = next(it)
        ds.on_batch_end(fake_rollouts(batch, rng))
        m = ds.scheduler.metrics()
        print(f"step {step}: drew {sorted(batch['data_source'].tolist())}  "
              f"p(easy)={m.get('domain_prob/easy', float('nan')):.2f} "
              f"success easy={m.get('domain_success/easy', float('nan')):.2f} "
              f"hard={m.get('domain_success/hard', float('nan')):.2f}")
    torch.save(loader.state_dict(), tmp / "data.pt")   # verl: global_step_N/data.pt
    nxt = [e["index"] for e in next(it)["extra_info"]]
    ds2 = create_rl_dataset(cfg.train_files, cfg, tokenizer=None, processor=None)
    loader2 = StatefulDataLoader(ds2, batch_size=cfg.train_batch_size, num_workers=0, drop_last=True,
                                 collate_fn=collate_fn, sampler=create_rl_sampler(cfg, ds2))
    loader2.load_state_dict(load_data_pt(str(tmp / "data.pt")))   # weights_only, numpy allow-list
    resumed = [e["index"] for e in next(iter(loader2))["extra_info"]]
    print(f"next batch {nxt}\nresumed    {resumed}\nidentical: {nxt == resumed}")


if __name__ == "__main__":
    main()
