"""Checkpoints of the built-in recipe: model, optimizer, Scheduler state and counters.

No RNG is pickled: sampling draws from `torch.Generator` seeded by (seed, step, round)
and the Scheduler from `np.random.default_rng([seed, proposals, stream])`, so restoring
the counters restores the random streams (STYLE.md §3).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import torch

from .config import RESUMABLE_CHANGES, TrainConfig

__all__ = ["save_checkpoint", "load_checkpoint", "check_resumable"]


def save_checkpoint(directory, *, model, optimizer, scheduler, counters: dict, config: TrainConfig) -> None:
    """Write `directory` atomically (a temporary sibling, then rename)."""
    d = Path(directory)
    tmp = d.with_name(d.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    torch.save(model.state_dict(), tmp / "model.pt")
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    np.savez(tmp / "scheduler.npz", **scheduler.state_dict())
    (tmp / "state.json").write_text(json.dumps({"counters": counters, "config": config.to_dict()}, indent=1))
    old = d.with_name(d.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if d.exists():
        os.replace(d, old)
    os.replace(tmp, d)
    shutil.rmtree(old, ignore_errors=True)


def check_resumable(directory, config: TrainConfig) -> dict:
    """The saved state.json, after checking that `config` matches the saved one in every
    field outside `RESUMABLE_CHANGES` (ValueError listing the differences otherwise)."""
    d = Path(directory)
    if not (d / "state.json").is_file():
        raise ValueError(f"resume=true but {str(d)!r} holds no checkpoint; run without resume first "
                         f"(or point out=... at the run to continue).")
    state = json.loads((d / "state.json").read_text())
    saved, now = state["config"], config.to_dict()
    diff = [f"{k}: saved {saved.get(k)!r}, now {now[k]!r}" for k in now
            if k not in RESUMABLE_CHANGES and saved.get(k) != now[k]]
    if diff:
        raise ValueError("cannot resume: the checkpoint was written by a different config ("
                         + "; ".join(diff) + "). Use the saved values or a new out directory.")
    return state


def load_checkpoint(directory, *, model, optimizer, scheduler) -> dict:
    """Restore model, optimizer and Scheduler in place; returns the saved counters."""
    d = Path(directory)
    model.load_state_dict(torch.load(d / "model.pt", map_location=next(model.parameters()).device))
    optimizer.load_state_dict(torch.load(d / "optimizer.pt"))
    with np.load(d / "scheduler.npz", allow_pickle=False) as z:
        scheduler.load_state_dict({k: z[k] for k in z.files})
    return json.loads((d / "state.json").read_text())["counters"]
