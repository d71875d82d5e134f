"""Checkpoints of the built-in recipe: model, optimizer, Scheduler state and counters.

No RNG is pickled: sampling draws from `torch.Generator` seeded by (seed, step, round)
and the Scheduler from `np.random.default_rng([seed, proposals, stream])`, so restoring
the counters restores the random streams (STYLE.md §3).
"""

from __future__ import annotations

from ..errors import InputError
import json
import math
import os
import pickle
import shutil
import zipfile
from pathlib import Path

import numpy as np
import torch

from .config import RESUMABLE_CHANGES, TrainConfig

__all__ = ["save_checkpoint", "load_checkpoint", "check_resumable", "restore_domain_tokens", "restore_grad_ref"]


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
        raise InputError(f"resume=true but {str(d)!r} holds no checkpoint; run without resume first "
                         f"(or point out=... at the run to continue).")
    state = json.loads((d / "state.json").read_text())
    saved, now = state["config"], config.to_dict()
    # A field the saved config lacks was added to TrainConfig after that run: the run had
    # its default behaviour (every new field defaults to the old behaviour), so compare
    # against the default, not against "missing".
    defaults = TrainConfig().to_dict()
    saved = {**{k: defaults[k] for k in now if k not in saved}, **saved}
    diff = [f"{k}: saved {saved.get(k)!r}, now {now[k]!r}" for k in now
            if k not in RESUMABLE_CHANGES and saved.get(k) != now[k]]
    if diff:
        raise InputError("cannot resume: the checkpoint was written by a different config ("
                         + "; ".join(diff) + "). Use the saved values or a new out directory.")
    return state


def _check_model_state(saved: dict, model) -> None:
    """ValueError unless `saved` has exactly the model's keys, shapes and dtypes: checked
    before loading, as `load_state_dict` would overwrite the matching tensors before it
    reports a mismatched one."""
    own = model.state_dict()
    if not isinstance(saved, dict):
        raise InputError(f"model.pt holds {type(saved).__name__}, not a state dict; the checkpoint is corrupt.")
    missing, extra = sorted(set(own) - set(saved)), sorted(set(saved) - set(own))
    if missing or extra:
        raise InputError(f"model.pt does not match the model (missing {missing[:5]}, unexpected "
                         f"{extra[:5]}); was it written with another model config?")
    for k, v in own.items():
        got = saved[k]
        if not isinstance(got, torch.Tensor) or got.shape != v.shape or got.dtype != v.dtype:
            raise InputError(f"model.pt[{k!r}] is {getattr(got, 'dtype', type(got).__name__)} "
                             f"{tuple(getattr(got, 'shape', ()))}, the model has {v.dtype} {tuple(v.shape)}; "
                             f"the checkpoint is corrupt or from another model config.")
        if got.is_floating_point() and not torch.isfinite(got).all():
            raise InputError(f"model.pt[{k!r}] has NaN or inf values; the checkpoint is corrupt.")


def _check_optimizer_state(saved: dict, optimizer) -> None:
    """ValueError unless `saved` has the optimizer's parameter groups, group by group (what
    `optimizer.load_state_dict` checks, done here before anything is restored)."""
    if not isinstance(saved, dict) or not isinstance(saved.get("param_groups"), list) \
            or not isinstance(saved.get("state"), dict):
        raise InputError("optimizer.pt is not an optimizer state dict; the checkpoint is corrupt.")
    groups = saved["param_groups"]
    sizes = [len(g.get("params", ())) for g in groups if isinstance(g, dict)]
    own = [len(g["params"]) for g in optimizer.param_groups]
    if sizes != own:
        raise InputError(f"optimizer.pt has parameter groups of sizes {sizes}, the optimizer {own}; the "
                         f"checkpoint was written for another model or optimizer.")


def _check_counters(counters) -> dict:
    if not isinstance(counters, dict):
        raise InputError("state.json has no 'counters' mapping; the checkpoint is corrupt.")
    for key in ("step", "rollouts"):
        v = counters.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise InputError(f"state.json counters[{key!r}] is {v!r}; it must be an int ≥ 0. The "
                             f"checkpoint is corrupt.")
    v = counters.get("seconds")
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise InputError(f"state.json counters['seconds'] is {v!r}; it must be a finite number ≥ 0. The "
                         f"checkpoint is corrupt.")
    return counters


def load_checkpoint(directory, *, model, optimizer, scheduler) -> dict:
    """Restore model, optimizer and Scheduler in place; returns the saved counters.

    Everything is read and checked first — the four files, the model's keys, shapes and
    dtypes, the optimizer's parameter groups, the Scheduler state (`check_state_dict`: the
    pool, method, hyperparameters and every value), the counters — and only then restored,
    so a corrupt or mismatched checkpoint raises a ValueError and changes nothing."""
    d = Path(directory)
    device = next(model.parameters()).device
    try:
        counters = _check_counters(json.loads((d / "state.json").read_text()).get("counters"))
        model_sd = torch.load(d / "model.pt", map_location=device, weights_only=True)
        optim_sd = torch.load(d / "optimizer.pt", weights_only=True)
        with np.load(d / "scheduler.npz", allow_pickle=False) as z:
            sched_sd = {k: z[k] for k in z.files}
    except (OSError, EOFError, ValueError, RuntimeError, zipfile.BadZipFile, pickle.UnpicklingError) as e:
        raise InputError(f"cannot read the checkpoint in {str(d)!r}: {e}") from e
    _check_model_state(model_sd, model)
    _check_optimizer_state(optim_sd, optimizer)
    scheduler.check_state_dict(sched_sd)
    # Everything checked: restore. The Scheduler last, as its load cannot fail after its check.
    model.load_state_dict(model_sd)
    optimizer.load_state_dict(optim_sd)
    scheduler.load_state_dict(sched_sd)
    return counters


def restore_domain_tokens(counters: dict, k: int) -> np.ndarray:
    """float64[K] answer tokens trained on per domain, from a checkpoint's counters."""
    raw = counters.get("domain_tokens", [0] * k)
    arr = np.asarray(raw, dtype=np.float64) if isinstance(raw, list) else np.full(1, np.nan)
    if arr.shape != (k,) or not (np.isfinite(arr).all() and (arr >= 0).all()):
        raise InputError(f"state.json counters['domain_tokens'] is {raw!r}; it must be a list of {k} "
                         f"numbers ≥ 0. The checkpoint is corrupt.")
    return arr


def restore_grad_ref(counters: dict, gf) -> np.ndarray | None:
    """float32[d] reference direction from a checkpoint's counters (None when absent)."""
    raw = counters.get("grad_ref")
    if raw is None or gf is None:
        return None
    arr = np.asarray(raw, dtype=np.float64) if isinstance(raw, list) else np.full(1, np.nan)
    if arr.shape != (gf.dim,) or not np.isfinite(arr).all():
        raise InputError(f"state.json counters['grad_ref'] must be a list of {gf.dim} finite numbers; the "
                         f"checkpoint is corrupt.")
    return arr.astype(np.float32)
