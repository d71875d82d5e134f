"""The held-out loss probe in the built-in trainer: the loss curves that epiplexity reads.

Built only when a policy of the Scheduler learns from loss curves (`DataPolicy.update_losses`:
epiplexity). One point in the loop:

    measure(step, domain_tokens)   at the start of the step, every `loss_probe_every` steps
                    (and at step 0): the teacher-forced NLL of reference answers on a fixed
                    probe set per domain (`sampling.build_loss_probe`, one batched forward),
                    paired with the completion tokens trained on per domain so far, fed to
                    `Scheduler.observe_losses`; returns the step record's `probe_loss/<domain>`.

No randomness and no state of its own: the probe set is fixed for the run.
"""

from __future__ import annotations

import numpy as np

from .config import TrainConfig
from .sampling import build_loss_probe, probe_losses, uses_losses

__all__ = ["LossCurves"]


class LossCurves:
    """The loss-curve policies' held-out loss probe (module docstring)."""

    def __init__(self, sched, model, probe, pool, every: int):
        self.sched, self.model, self.probe, self.pool, self.every = sched, model, probe, pool, every

    @classmethod
    def build(cls, sched, model, tok, tasks, pool, cfg: TrainConfig) -> LossCurves | None:
        """The component, or None when no policy of `sched` reads loss curves."""
        if not uses_losses(sched):
            return None
        return cls(sched, model, build_loss_probe(tasks, pool, tok, cfg), pool, cfg.loss_probe_every)

    def measure(self, step: int, domain_tokens: np.ndarray) -> dict:
        """{"probe_loss/<domain>": mean NLL per answer token} at a probe step, else {}.
        `domain_tokens`: float64[K] kept completion tokens trained on per domain."""
        if step % self.every:
            return {}
        self.model.eval()
        nll = probe_losses(self.model, self.probe)                                    # [K] nats
        measured = {str(d): (float(domain_tokens[i]), float(nll[i]))
                    for i, d in enumerate(self.pool.domain_names) if np.isfinite(nll[i])}
        self.sched.observe_losses(measured, step=step)
        return {f"probe_loss/{d}": v for d, (_, v) in measured.items()}
