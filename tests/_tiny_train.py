"""The built-in trainer at its smallest, shared by the trainer tests: two distributions,
a 1-layer model warmed up in 200 steps, 4 prompts × 4 rollouts per step."""

from __future__ import annotations

import json
from pathlib import Path

TINY = dict(tasks="embedded:max2,last3", train_per_domain=16, heldout_per_domain=8, hidden=32, layers=1,
            heads=2, warmup_steps=200, warmup_batch=32, warmup_mistakes="last3=0.5", batch_prompts=4,
            group_size=4, max_new_tokens=3, eval_every=2, checkpoint_every=0, progress=False, lr=1e-3,
            lr_warmup=0, steps=4)


def tiny_config(out, cache: str, **overrides):
    """A `TrainConfig` of `TINY` writing to `out`, its base policy cached in `cache`."""
    from rlpace.train import TrainConfig
    return TrainConfig(**{**TINY, "cache_dir": cache, "out": str(out), **overrides})


def read_log(out) -> list[dict]:
    """The JSONL records a run wrote to `out/metrics.jsonl`."""
    return [json.loads(x) for x in Path(out, "metrics.jsonl").read_text().splitlines() if x.strip()]


#: the fields of a run's records that measure time, so differ between two runs of the same numbers
TIMING = {"seconds", "train_seconds", "seconds_total"}


def log_without_timing(out) -> list[dict]:
    """`read_log(out)` with the timing fields left out: what two runs of the same numbers share."""
    return [{k: v for k, v in r.items() if k not in TIMING} for r in read_log(out)]


def assert_same_run(a, b) -> None:
    """Runs `a` and `b` (TrainConfigs) wrote the same records, timing aside, and checkpoints
    with the same tensors, bit for bit."""
    import torch
    assert log_without_timing(a.out) == log_without_timing(b.out)
    wa = torch.load(Path(a.out, "checkpoint", "model.pt"), weights_only=False)
    wb = torch.load(Path(b.out, "checkpoint", "model.pt"), weights_only=False)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
