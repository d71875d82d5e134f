"""The oracle measurement in the built-in trainer: every training prompt's pass rate, measured.

Built only when a policy of the Scheduler reads "measurement" (`DataPolicy.reads`: the oracle_*
tools, which are measurement instruments, not methods). One point in the loop:

    measure(step)   before the step's proposal, every `oracle_every` steps (and at step 0):
                    m = `oracle_rollouts` rollouts of every training prompt, fed to the
                    Scheduler as one Feedback (`sampling.oracle_measure`); returns the rollouts
                    spent, which the recipe logs as `oracle_rollouts` and never charges to the
                    budget: the oracle is an upper bound on what scheduling could save.

Its draws come from the ORACLE stream of (seed, step), so a resumed run measures the same.
"""

from __future__ import annotations

from .config import TrainConfig
from .sampling import oracle_measure, uses_oracle

__all__ = ["OracleMeasurement"]


class OracleMeasurement:
    """The oracle_* policies' pass-rate measurement (module docstring)."""

    def __init__(self, sched, model, tok, tasks, prompt_tokens, cfg: TrainConfig):
        self.sched, self.model, self.tok, self.tasks = sched, model, tok, tasks
        self.prompt_tokens, self.cfg = prompt_tokens, cfg

    @classmethod
    def build(cls, sched, model, tok, tasks, prompt_tokens, cfg: TrainConfig) -> OracleMeasurement | None:
        """The component, or None when no policy of `sched` reads the measurement."""
        return cls(sched, model, tok, tasks, prompt_tokens, cfg) if uses_oracle(sched) else None

    def measure(self, step: int) -> int:
        """Rollouts spent measuring at `step` (0 between measurements); the model must be in eval mode."""
        if step % self.cfg.oracle_every:
            return 0
        return oracle_measure(self.sched, self.model, self.tok, self.tasks, self.prompt_tokens, self.cfg, step)
