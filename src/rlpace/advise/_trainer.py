"""`rlpace advise` on the built-in trainer: run the pilot itself (`pilot_on_trainer`), or
re-profile a run from its own record (`profile_run`: has it plateaued? would a switch pay?).

Both import torch (through `rlpace.train`) only when called.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..errors import InputError
from ._record import Pilot, read_pilot

__all__ = ["pilot_plan", "pilot_on_trainer", "profile_run", "plateau", "Plateau"]

#: the pilot's share of the budget when the user names none: long enough to read how pass
#: rates move (the fit's learning rate), short enough to leave most of the budget to advise on
PILOT_SHARE = 0.2


def _budget(cfg) -> int:
    """The run's rollout budget: max_rollouts when set, else steps · B · G."""
    return int(cfg.max_rollouts or cfg.steps * cfg.batch_prompts * cfg.group_size)


def pilot_plan(cfg, share: float = PILOT_SHARE, budget_rollouts: int | None = None):
    """(pilot config, budget) for a run `cfg` of the built-in trainer: the pilot is `cfg`
    for ⌈share · steps⌉ steps (and share · max_rollouts, when set), policy as given
    (uniform by default), writing its record to out/pilot.jsonl. InputError, before any
    work, when the pilot would be too short for the fit."""
    from ._advice import MIN_PILOT_STEPS
    if not (isinstance(share, (int, float)) and 0 < share < 1):
        raise InputError(f"--pilot-share must lie in (0, 1); got {share!r}.")
    budget = int(budget_rollouts) if budget_rollouts else _budget(cfg)
    if budget < 1:
        raise InputError("give the run's length: steps=N (or max_rollouts=N, or --budget-rollouts N).")
    n = math.ceil(share * cfg.steps)
    if n < MIN_PILOT_STEPS:
        need = math.ceil(MIN_PILOT_STEPS / share)
        raise InputError(f"a pilot of {share:.0%} of steps={cfg.steps} is {n} step{'s' if n != 1 else ''}; the fit "
                         f"needs ≥ {MIN_PILOT_STEPS}: give steps ≥ {need} or a larger --pilot-share.")
    out = Path(cfg.out) / "pilot"
    pcfg = dataclasses.replace(cfg, steps=n, max_rollouts=int(share * cfg.max_rollouts), out=str(out),
                               record=str(out / "pilot.jsonl"), resume=False)
    return pcfg, budget


def pilot_on_trainer(cfg, share: float = PILOT_SHARE, budget_rollouts: int | None = None):
    """Run the pilot of `pilot_plan` on the built-in trainer; returns (record path, Pool, budget)."""
    from ..train import train
    from ..train.recipes.grpo import _build_data, check_config
    pcfg, budget = pilot_plan(cfg, share, budget_rollouts)
    check_config(pcfg)
    pool = _build_data(pcfg)[2]
    train(pcfg)
    return Path(pcfg.record), pool, budget


class Plateau(NamedTuple):
    """How the held-out accuracy moved over the run's record."""

    plateaued: bool          # the last half of the rollouts gained < 10 % of the run's gain (or nothing)
    gain: float              # last eval − first eval (accuracy points)
    late_gain: float         # last eval − the eval at half the rollouts spent
    evals: int


def plateau(pilot: Pilot, share: float = 0.1) -> Plateau | None:
    """Whether training has plateaued, from the record's held-out evaluations: the gain over
    the last half of the rollouts spent is below `share` of the whole gain (or ≤ 0). None
    with fewer than three evaluations."""
    if len(pilot.evals) < 3:
        return None
    spent = np.array([n for _, n, _ in pilot.evals], dtype=np.float64)
    acc = np.array([a for _, _, a in pilot.evals], dtype=np.float64)
    mid = int(np.searchsorted(spent, spent[-1] / 2, side="right")) - 1      # the last eval at ≤ half the spend
    gain, late = float(acc[-1] - acc[0]), float(acc[-1] - acc[max(mid, 0)])
    return Plateau(bool(late <= 0 or late < share * max(gain, 0.0)), gain, late, len(acc))


def profile_run(run_dir, budget_rollouts: int | None = None):
    """(Pilot, Pool, budget, Plateau | None) of a built-in trainer run from its own record
    (`record=` in its config.json). InputError when it wrote none, or its budget is spent."""
    from ..train import TrainConfig
    from ..train.recipes.grpo import _build_data
    d = Path(run_dir)
    cfg_path = d / "config.json"
    if not cfg_path.is_file():
        raise InputError(f"--from-run {d}: no config.json; pass the out= folder of an `rlpace train` run.")
    saved = json.loads(cfg_path.read_text())
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    cfg = TrainConfig(**{k: v for k, v in saved.items() if k in names})
    if not cfg.record:
        raise InputError(f"--from-run {d}: the run wrote no pilot record; run it with record=PATH "
                         f"(e.g. rlpace train ... record={d}/pilot.jsonl).")
    path = Path(cfg.record)
    if not path.is_file() and (d / path.name).is_file():
        path = d / path.name
    pilot = read_pilot(path)
    budget = int(budget_rollouts) if budget_rollouts else _budget(cfg)
    if budget <= pilot.rollouts:
        raise InputError(f"--from-run {d}: the run has spent {pilot.rollouts} rollouts of its {budget}; pass "
                         f"--budget-rollouts N (the whole run's, its rollouts so far included) to ask about more.")
    return pilot, _build_data(cfg)[2], budget, plateau(pilot)
