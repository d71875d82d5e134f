"""Where the built-in trainer's step records go: `metrics.jsonl` always (the record rlpace's
own tools read), and TensorBoard and/or Weights & Biases beside it when `logger=` asks, so
the runs read like TRL's and verl's (`report_to` / `trainer.logger`).

    logger=jsonl                  metrics.jsonl only (default)
    logger=tensorboard            + out/tensorboard/ event files (`tensorboard --logdir out`)
    logger=tensorboard,wandb      + a wandb run in offline mode under out/wandb/
                                  (`wandb sync out/wandb/offline-run-*` uploads it later)

Every numeric field of a record becomes a scalar under its own name (`loss`, `eval/mean`,
`sched/domain_prob/add2`, ...) at `global_step = record["step"]`; lists (`prompt_ids`) and
flags (`final`) stay in the JSONL only. On resume, TensorBoard drops its events at steps ≥
the checkpoint's step (`purge_step`), as the JSONL is truncated there.

>>> parse_loggers("tensorboard")
('jsonl', 'tensorboard')
"""

from __future__ import annotations

from ..errors import InputError
import importlib.util
import json
import math
import shutil
from pathlib import Path

__all__ = ["LOGGERS", "parse_loggers", "scalars", "StepLogger"]

LOGGERS = ("jsonl", "tensorboard", "wandb")


def parse_loggers(spec: str) -> tuple[str, ...]:
    """The loggers `spec` names ('tensorboard', 'jsonl,wandb', 'tensorboard|wandb'), jsonl
    first and always; ValueError for an unknown name or a logger whose package is missing
    (checked without importing it, so before any work)."""
    names = [p.strip() for p in str(spec).replace("|", ",").split(",") if p.strip()]
    unknown = [n for n in names if n not in LOGGERS]
    if unknown:
        raise InputError(f"logger={spec!r}: unknown logger {unknown[0]!r}; use jsonl, tensorboard, wandb "
                         f"or a comma list (jsonl is always written).")
    if "tensorboard" in names and importlib.util.find_spec("tensorboard") is None:
        raise InputError("logger=tensorboard needs the tensorboard package: pip install 'rlpace[train]' "
                         "(or pip install tensorboard); or drop it (logger=jsonl).")
    if "wandb" in names and importlib.util.find_spec("wandb") is None:
        raise InputError("logger=wandb needs the wandb package: pip install wandb (rlpace runs it in offline "
                         "mode; `wandb sync` uploads later); or use logger=tensorboard.")
    return tuple(dict.fromkeys(["jsonl", *names]))


def scalars(rec: dict) -> dict[str, float]:
    """The numeric fields of a step record except `step` (bools and lists excluded)."""
    return {k: float(v) for k, v in rec.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}


class StepLogger:
    """Writes each step record to `out/metrics.jsonl` and the other loggers.

    Args:
        out: the run directory.
        loggers: as `parse_loggers` returns (or a spec string).
        config: the run's config dict (wandb's `config`).
        start_step: the step the run starts or resumes at (TensorBoard's purge step).
    """

    def __init__(self, out, loggers=("jsonl",), *, config: dict | None = None, start_step: int = 0):
        self.out = Path(out)
        self.loggers = parse_loggers(",".join(loggers) if not isinstance(loggers, str) else loggers)
        self.path = self.out / "metrics.jsonl"
        self._tb = self._wandb = None
        if "tensorboard" in self.loggers:
            from torch.utils.tensorboard import SummaryWriter
            if not start_step:      # a fresh run replaces the old events, as it resets metrics.jsonl
                shutil.rmtree(self.out / "tensorboard", ignore_errors=True)
            self._tb = SummaryWriter(str(self.out / "tensorboard"), purge_step=start_step or None)
        if "wandb" in self.loggers:
            import wandb
            (self.out / "wandb").mkdir(parents=True, exist_ok=True)
            self._wandb = wandb.init(project="rlpace", name=self.out.name, dir=str(self.out), mode="offline",
                                     config=config or {})

    def __call__(self, rec: dict) -> None:
        # The file is opened per record: no handle outlives an exception, and a crash leaves
        # every finished step on disk (resume truncates to the checkpoint).
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")
        values = scalars(rec)
        if self._tb is not None:
            for k, v in values.items():
                self._tb.add_scalar(k, v, global_step=int(rec["step"]))
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in values.items() if math.isfinite(v)}, step=int(rec["step"]))

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None
