"""Per-rollout gradient features in the built-in trainer: what diem and dvc read.

Built only when a policy of the Scheduler reads "grads" (`DataPolicy.reads`: diem, dvc; or
`grad_features=on`). The features are projected per-rollout gradients of the recipe's own loss
(`rlpace.train.gradfeatures`), so the recipe hands over the functions it computes log-probs and
the loss with. Points in the loop, in order:

    update_reference(step, reference_fn)   at the start of the step, every `grad_ref_every`
                    steps, when a policy reads `Feedback.ref_grad` (diem importance=reference,
                    dvc's influence value) and grad_reference=heldout: the feature of the
                    held-out answers' NLL gradient (`gradfeatures.heldout_reference`)
    (rounds)        the recipe admits each generation round at the state before this step and
                    keeps its Feedback; nothing is observed yet
    forward(...)    in the loss step, before the first update: per chunk, the unit-weight loss
                    L₁ (one forward, inside `GradFeatures.capture`), its per-rollout features,
                    and ∂L₁/∂logp, ∂L₁/∂w; the graph is kept: the first epoch's weighted
                    backward starts at the log-probs (`losses.logp_grad_scale`)
    observe(...)    right after forward: every round's groups to the Scheduler, the trained
                    ones with their features (`split_with_grads`), so the step's token
                    weights read them; with nothing trained, at the end of the step, without

Checkpointed: the reference direction (`ref`, counters["grad_ref"]); grad_reference=previous
makes it the previous step's batch gradient.
"""

from __future__ import annotations

import numpy as np
import torch

from ..errors import InputError
from .checkpoint import restore_grad_ref
from .config import TrainConfig
from .gradfeatures import FirstToken, GradFeatures, needs_grad_features, needs_ref_grad, split_with_grads
from .sampling import build_loss_probe

__all__ = ["GradSignal"]


class GradSignal:
    """Gradient features of the training batch and the reference direction (module docstring).

    Attributes:
        gf: the `GradFeatures` hooks and projections (dimension gf.dim).
        ref: float32[d] `Feedback.ref_grad`, or None (checkpointed).
    """

    def __init__(self, model, gf: GradFeatures, ref_rollout, cfg: TrainConfig):
        self.model, self.gf, self.ref_rollout, self.cfg = model, gf, ref_rollout, cfg
        self.ref: np.ndarray | None = None

    @classmethod
    def build(cls, sched, model, tok, tasks, pool, cfg: TrainConfig, supervised: bool,
              features=GradFeatures) -> GradSignal | None:
        """The component, or None when no policy of `sched` reads features (`grad_features`
        "auto"; "on"/"off" force it). `features`: the hooks-and-projection class, called as
        features(model, grad_params, grad_dim, seed) (`GradFeatures`). InputError when
        `supervised` (labels or a supervision place): the built-in trainer does not carry
        answers through the features."""
        if not needs_grad_features(sched, cfg.grad_features):
            return None
        gf = features(model, cfg.grad_params, cfg.grad_dim, cfg.seed)
        if supervised:
            raise InputError(f"policy={cfg.policy!r} with labeled_fraction / label_noise or a target, reward or "
                             f"advantage place cannot run with gradient features (grad_features=off, or drop "
                             f"diem / dvc): the built-in trainer does not carry answers through them yet.")
        ref = (build_loss_probe(tasks, pool, tok, cfg).rollout
               if cfg.grad_reference == "heldout" and needs_ref_grad(sched) else None)
        return cls(model, gf, ref, cfg)

    def load_counters(self, counters: dict) -> None:
        """Restore `ref` from a checkpoint's counters (InputError when corrupt)."""
        self.ref = restore_grad_ref(counters, self.gf)

    def ref_json(self):
        return None if self.ref is None else self.ref.tolist()

    def update_reference(self, step: int, reference_fn) -> None:
        """Every `grad_ref_every` steps, `ref` = reference_fn(model, gf, held-out rollout, temperature)."""
        if self.ref_rollout is None or step % self.cfg.grad_ref_every:
            return
        self.model.eval()
        self.ref = reference_fn(self.model, self.gf, self.ref_rollout, self.cfg.temperature)

    def forward(self, batches, shares, logprobs, loss_of):
        """The unit-weight pass over the training batch's chunks.

        Args:
            batches: the chunks' `Rollout`s (whole groups each).
            shares: each chunk's share of the batch's aggregation units.
            logprobs: (rollout, group_size, packed) → (log-probs [n, T], first-token logits or None),
                the recipe's `completion_logprobs(..., first_logits=True, packed=packed)`; group_size 1
                forwards [prompt | completion] per row.
            loss_of: (chunk k, log-probs, loss weights [n, T]) → the recipe's `LossOut`.

        Returns (pre, feats): pre[k] = (logp, ∂L₁/∂logp, ∂L₁/∂w, clip fraction) of chunk k, the
        graph kept for the first epoch's backward; feats float32[N, d] on the model's device.
        """
        cfg, gf = self.cfg, self.gf
        # exact lm_head features need no per-row forward: one packed forward per group over
        # [prompt | its G completions], whose head call FirstToken.prompt_len splits by rollout,
        # the first token's share from its repeated logits; exact last_block / all features
        # forward one row per rollout
        head_exact = cfg.grad_exact and cfg.grad_params == "lm_head"
        pre, feats = [], []
        for k, (r, share) in enumerate(zip(batches, shares)):
            unit = torch.ones_like(r.completion_mask).requires_grad_(True)          # [n, T] weights 1
            with gf.capture():
                logp, z0 = logprobs(r, cfg.group_size if head_exact or not cfg.grad_exact else 1, head_exact)
                lo = loss_of(k, logp, unit)
            first = FirstToken(z0, r.prompt_ids.shape[1]) if head_exact and z0 is not None else None
            f_k, (g_logp, g_unit) = gf.features(lo.loss * share, logp.shape[0], not cfg.grad_exact,
                                                first_token=first, wrt=(logp, unit))          # [n, d]
            feats.append(f_k)
            pre.append((logp, g_logp, g_unit, lo.clip_fraction))
        return pre, (feats[0] if len(feats) == 1 else torch.cat(feats))

    def observe(self, sched, rounds: list, src: list | None = None, trained=None, feats=None):
        """Observe every round's Feedback; the trained groups (`trained`, the batch's Feedback,
        row k = group src[k][1] of round src[k][0]) with their features `feats` [N, d] and `ref`.
        Returns `trained` with its features (or None without a trained batch). Without one,
        the rounds are observed as they are."""
        if trained is None:
            for fb in rounds:
                sched.observe(fb)
            return None
        b, g = trained.rewards.shape
        grads_np = feats.cpu().numpy().reshape(b, g, self.gf.dim)                         # [Bt, G, d]
        grads_np.setflags(write=False)      # never written again: the Feedback keeps it without a copy
        trained = trained.with_grads(grads_np, self.ref)
        for pi, fb_r in enumerate(rounds):
            mine = [i for i, (p_, _) in enumerate(src) if p_ == pi]
            for part in split_with_grads(fb_r, [src[i][1] for i in mine], trained, mine):
                sched.observe(part)      # trained's validated features: not checked twice
        if self.cfg.grad_reference == "previous":
            self.ref = grads_np.sum(axis=(0, 1))          # the next step's reference
        return trained
