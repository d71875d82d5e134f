"""Policy-gradient objectives as pure functions of tensors (torchtune `dev/grpo/loss.py`
style: shape comments on each line, no model, no optimizer, no config objects).

Notation: N rollouts (B prompts × G), T completion tokens; `logp`, `old_logp` are
log π(o_t | q, o_<t) under the current and the sampling policy; `mask` marks real
completion tokens. Two per-rollout inputs say how a rollout enters the loss:

* `keep` float[N] ∈ {0, 1}: admission (the Scheduler's `admission(fb).keep`). It alone
  decides what the normaliser counts — kept rollouts, or their tokens.
* `weight` float[N] or float[N, T] (default 1): the Scheduler's loss weights
  (`loss_weights`, per rollout; `token_weights`, per token). Weights multiply each term
  *inside* that normaliser; a weight of 0 silences a kept rollout (or token) but it still
  counts, exactly as DataFlex-RL's `rollout_is_weights` enter verl's token-mean loss.

Reweighters return weights with mean 1 over the batch's B·G rollouts, so counting only the
rollouts with weight > 0 (what this module did before) would scale the step a second time,
by 1/(share of non-zero weights): 18.5× the unweighted GRPO gradient instead of DataFlex's
≈4.6× when one group of four carries signal under `per_advantage`
(`tests/test_losses.py::test_weights_multiply_inside_the_admission_normaliser`).

Per-token ratio r_it = exp(logp_it − old_logp_it); clipped surrogate
s_it = min(r_it·A_i, clip(r_it, 1−ε_low, 1+ε_high)·A_i); u_it = keep_i · w_it.

| objective | advantage A_i                 | loss                                                  | (ε_low, ε_high) |
|-----------|-------------------------------|-------------------------------------------------------|-----------------|
| grpo      | (r − mean_g) / (std_g + 1e-6) | −(1/Σ keep) Σ_i (1/|o_i|) Σ_t u_it s_it               | (0.2, 0.2)      |
| dr_grpo   | r − mean_g                    | −(1/(Σ keep · T_max)) Σ_i Σ_t u_it s_it               | (0.2, 0.2)      |
| dapo      | (r − mean_g) / (std_g + 1e-6) | −Σ_i Σ_t u_it s_it / Σ_i keep_i |o_i|  (token level)   | (0.2, 0.28)     |
| gspo      | (r − mean_g) / (std_g + 1e-6) | −(1/Σ keep) Σ_i keep_i w̄_i min(s_i A_i, clip(s_i)A_i) | (3e-4, 4e-4)    |

GSPO's ratio s_i = exp(mean_t(logp − old)) is per sequence; a per-token weight enters it as
its mean over the rollout's tokens, w̄_i = Σ_t w_it / |o_i|.

References: GRPO — Shao et al. 2024 (DeepSeekMath) eq. 3; Dr. GRPO — Liu et al. 2025
("Understanding R1-Zero-Like Training") §3.1, which drops the std and the 1/|o_i|;
DAPO — Yu et al. 2025 eq. 8–10 (clip-higher, token-level loss); GSPO — Zheng et al.
2025 eq. 5–7 (length-normalised sequence ratio, clip 3e-4/4e-4).

The built-in recipe recomputes advantages on each group's kept rollouts
(`advantages(..., keep=...)`: PODS and GFPO train their subset as if it were the group);
DataFlex-RL's `topk` keeps the full-group advantages (it masks after computing them).
"""

from __future__ import annotations

from ..errors import InputError
from typing import NamedTuple

import numpy as np
import torch

from ..types import kept_group_advantages

__all__ = ["OBJECTIVES", "LossOut", "advantages", "aggregation_units", "clipped_surrogate", "grpo_loss", "dr_grpo_loss",
           "dapo_loss", "gspo_loss", "kl_k3", "policy_loss", "default_clip", "logp_grad_scale"]

OBJECTIVES = ("grpo", "dr_grpo", "dapo", "gspo")


class LossOut(NamedTuple):
    loss: torch.Tensor        # float32[] to minimise
    clip_fraction: float      # share of kept tokens (sequences for GSPO) whose ratio was clipped


def default_clip(objective: str) -> tuple[float, float]:
    """(ε_low, ε_high) each paper uses."""
    return {"grpo": (0.2, 0.2), "dr_grpo": (0.2, 0.2), "dapo": (0.2, 0.28), "gspo": (3e-4, 4e-4)}[objective]


def advantages(rewards: torch.Tensor, objective: str, keep: torch.Tensor | None = None,
               eps: float = 1e-6) -> torch.Tensor:
    """float32[B, G] group advantages over each group's kept rollouts (all when `keep` is
    None), 0 for the others: r − mean_kept for Dr. GRPO, (r − mean_kept)/(std_kept + eps)
    otherwise — `rlpace.kept_group_advantages`, the one implementation of that rule.

    >>> advantages(torch.tensor([[1., 0., 0., 0.]]), "dr_grpo").tolist()
    [[0.75, -0.25, -0.25, -0.25]]
    >>> advantages(torch.tensor([[1., 1., 0., 0.]]), "grpo",
    ...            keep=torch.tensor([[True, False, True, False]])).round().tolist()
    [[1.0, 0.0, -1.0, 0.0]]
    """
    r = rewards.detach().cpu().double().numpy()                                 # [B, G]
    k = np.ones(r.shape, bool) if keep is None else keep.detach().cpu().numpy().astype(bool)
    if objective == "dr_grpo":
        n = np.maximum(k.sum(axis=1, keepdims=True), 1)
        mean = np.where(k, r, 0.0).sum(axis=1, keepdims=True) / n
        adv = np.where(k, r - mean, 0.0)                                        # [B, G]
    else:
        adv = kept_group_advantages(r, k, eps)                                  # [B, G]
    return torch.from_numpy(adv).to(dtype=torch.float32, device=rewards.device)


def clipped_surrogate(ratio: torch.Tensor, adv: torch.Tensor, clip_low: float, clip_high: float):
    """(min(ratio·A, clip(ratio, 1−ε_low, 1+ε_high)·A), clipped bool) elementwise."""
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    return torch.minimum(unclipped, clipped), clipped < unclipped


def _token_weights(keep: torch.Tensor, weight: torch.Tensor | None, mask: torch.Tensor) -> torch.Tensor:
    """float[N, T] u_it = keep_i · w_it (w broadcast over tokens when per rollout)."""
    k = keep.to(mask.dtype)[:, None]                                            # [N, 1]
    if weight is None:
        return k.expand_as(mask)
    w = weight.to(mask.dtype)
    return k * (w[:, None] if w.dim() == 1 else w)                              # [N, T]


def grpo_loss(logp, old_logp, adv, mask, keep, weight=None, clip_low=0.2, clip_high=0.2, **_) -> LossOut:
    """GRPO: −(1/Σ keep) Σ_i (1/|o_i|) Σ_t keep_i w_it s_it.

    >>> lp = torch.zeros(2, 2); m = torch.tensor([[1., 1.], [1., 0.]])
    >>> round(grpo_loss(lp, lp, torch.tensor([1., 0.]), m, torch.ones(2)).loss.item(), 3)
    -0.5
    """
    ratio = torch.exp(logp - old_logp)                                          # [N, T]
    surr, clipped = clipped_surrogate(ratio, adv[:, None], clip_low, clip_high)  # [N, T]
    u = _token_weights(keep, weight, mask)                                      # [N, T]
    per_seq = (u * surr * mask).sum(1) / mask.sum(1).clamp(min=1)               # [N]
    loss = -per_seq.sum() / keep.sum().clamp(min=1)
    return LossOut(loss, _token_share(clipped, mask, keep))


def dr_grpo_loss(logp, old_logp, adv, mask, keep, weight=None, clip_low=0.2, clip_high=0.2, max_tokens=None,
                 **_) -> LossOut:
    """Dr. GRPO: −(1/(Σ keep · T_max)) Σ_i Σ_t keep_i w_it s_it, T_max = `max_tokens` (the
    generation budget; default the padded width T). No length normalisation per rollout."""
    ratio = torch.exp(logp - old_logp)                                          # [N, T]
    surr, clipped = clipped_surrogate(ratio, adv[:, None], clip_low, clip_high)  # [N, T]
    t_max = float(max_tokens if max_tokens is not None else mask.shape[1])
    u = _token_weights(keep, weight, mask)                                      # [N, T]
    loss = -(u * surr * mask).sum() / (keep.sum().clamp(min=1) * t_max)
    return LossOut(loss, _token_share(clipped, mask, keep))


def dapo_loss(logp, old_logp, adv, mask, keep, weight=None, clip_low=0.2, clip_high=0.28, **_) -> LossOut:
    """DAPO: −Σ_i Σ_t keep_i w_it s_it / Σ_i keep_i |o_i| (token-level mean, clip-higher)."""
    ratio = torch.exp(logp - old_logp)                                          # [N, T]
    surr, clipped = clipped_surrogate(ratio, adv[:, None], clip_low, clip_high)  # [N, T]
    n_tokens = (mask * keep.to(mask.dtype)[:, None]).sum().clamp(min=1)
    u = _token_weights(keep, weight, mask)                                      # [N, T]
    loss = -(u * surr * mask).sum() / n_tokens
    return LossOut(loss, _token_share(clipped, mask, keep))


def gspo_loss(logp, old_logp, adv, mask, keep, weight=None, clip_low=3e-4, clip_high=4e-4, **_) -> LossOut:
    """GSPO: s_i = exp((1/|o_i|) Σ_t (logp − old_logp)); −(1/Σ keep) Σ_i keep_i w̄_i ·
    min(s_i A_i, clip(s_i, 1−ε_low, 1+ε_high) A_i), w̄_i the mean of a per-token weight over
    o_i (the rollout's weight when per rollout). The gradient of s_i spreads evenly over
    o_i's tokens (GSPO eq. 10)."""
    lens = mask.sum(1).clamp(min=1)                                             # [N]
    log_ratio = ((logp - old_logp) * mask).sum(1) / lens                        # [N]
    seq_ratio = torch.exp(log_ratio)                                            # [N]
    surr, clipped = clipped_surrogate(seq_ratio, adv, clip_low, clip_high)     # [N]
    kept = keep.to(mask.dtype)
    if weight is None:
        w = torch.ones_like(kept)
    elif weight.dim() == 1:
        w = weight.to(mask.dtype)
    else:
        w = (weight.to(mask.dtype) * mask).sum(1) / lens                        # [N] mean token weight
    loss = -(kept * w * surr).sum() / kept.sum().clamp(min=1)
    share = float((clipped.float() * kept).sum() / kept.sum().clamp(min=1))
    return LossOut(loss, share)


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(π‖π_ref), mean over kept tokens (loss weights do not
    enter it): exp(ref − logp) − (ref − logp) − 1 ≥ 0 (GRPO eq. 4).

    >>> kl_k3(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1)).item()
    0.0
    """
    d = ref_logp - logp                                                         # [N, T]
    k3 = torch.exp(d) - d - 1.0                                                 # [N, T]
    m = mask * keep.to(mask.dtype)[:, None]
    return (k3 * m).sum() / m.sum().clamp(min=1)


def _token_share(clipped, mask, keep) -> float:
    m = mask * keep.to(mask.dtype)[:, None]
    return float((clipped.float() * m).sum() / m.sum().clamp(min=1))


_LOSSES = {"grpo": grpo_loss, "dr_grpo": dr_grpo_loss, "dapo": dapo_loss, "gspo": gspo_loss}


def _check_inputs(logp, adv, mask, keep, weight) -> None:
    n, t = logp.shape
    if keep.shape != (n,) or not bool(((keep == 0) | (keep == 1)).all()):
        raise InputError(f"keep must be float[N] of 0/1 admission flags with N = {n}; got shape "
                         f"{tuple(keep.shape)}. Pass the admission mask and the loss weights separately: "
                         f"keep=admission.keep, weight=Scheduler.loss_weights(...).")
    if adv.shape != (n,) or mask.shape != (n, t):
        raise InputError(f"adv must be [N] and mask [N, T] = {(n, t)}; got {tuple(adv.shape)} and "
                         f"{tuple(mask.shape)}.")
    if weight is not None and tuple(weight.shape) not in ((n,), (n, t)):
        raise InputError(f"weight must be float[N] (per rollout) or float[N, T] (per token) with N, T = "
                         f"{n}, {t}; got shape {tuple(weight.shape)}.")


def policy_loss(objective: str, logp, old_logp, adv, mask, keep, weight=None, *, clip_low=None,
                clip_high=None, max_tokens=None) -> LossOut:
    """Dispatch to the named objective; clip defaults to the paper's (`default_clip`).

    Args:
        objective: one of `OBJECTIVES`.
        logp, old_logp: float[N, T] current and sampling-policy token log-probs.
        adv: float[N] advantages (`advantages(rewards, objective, keep)` flattened).
        mask: float[N, T] 1 on completion tokens.
        keep: float[N] 0/1 admission; the normaliser counts these rollouts (or their tokens).
        weight: None, float[N] or float[N, T] loss weights, multiplied inside the normaliser.
    """
    if objective not in _LOSSES:
        raise InputError(f"unknown objective {objective!r}; valid: {', '.join(OBJECTIVES)}.")
    _check_inputs(logp, adv, mask, keep, weight)
    lo, hi = default_clip(objective)
    return _LOSSES[objective](logp, old_logp, adv, mask, keep, weight,
                              clip_low=lo if clip_low is None else clip_low,
                              clip_high=hi if clip_high is None else clip_high, max_tokens=max_tokens)


def logp_grad_scale(objective: str, weight: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """float[N, T] c with ∇_logp L(weight) = c ⊙ ∇_logp L(1) — every objective is linear in
    its loss weights, so the gradient of a weighted loss at the log-probs is the unit-weight
    one scaled token by token (same logp, old_logp, adv, mask, keep):

    * grpo, dr_grpo, dapo: token t of rollout i enters only through u_it·s_it with u_it =
      keep_i·w_it, and s_it depends on logp_it alone, so c_it = w_it (a per-rollout weight
      broadcast over the tokens);
    * gspo: rollout i enters through keep_i·w̄_i·min(s_i A_i, clip(s_i) A_i), s_i a function
      of all its tokens, so c_it = w̄_i = Σ_t w_it·mask_it / |o_i| (w_i when per rollout).

    What lets the built-in trainer start the weighted backward at the log-probs when the
    unit-weight loss's gradient there is already known (gradient features: docs/methods/diem.md).

    >>> w = torch.tensor([[1., 3.], [2., 2.]]); m = torch.tensor([[1., 1.], [1., 0.]])
    >>> logp_grad_scale("dapo", w, m).tolist(), logp_grad_scale("gspo", w, m).tolist()
    ([[1.0, 3.0], [2.0, 2.0]], [[2.0, 2.0], [2.0, 2.0]])
    """
    if objective not in _LOSSES:
        raise InputError(f"unknown objective {objective!r}; valid: {', '.join(OBJECTIVES)}.")
    w = weight.to(mask.dtype)
    if objective == "gspo" and w.dim() == 2:
        w = (w * mask).sum(1) / mask.sum(1).clamp(min=1)                        # [N] w̄_i
    return (w[:, None] if w.dim() == 1 else w).expand_as(mask)                  # [N, T]


def aggregation_units(objective: str, mask: torch.Tensor, keep: torch.Tensor) -> float:
    """How many units a (micro-)batch contributes to its objective's normaliser: kept
    tokens for DAPO, kept rollouts otherwise (admission only: weights never change it).
    Splitting a batch into micro-batches and summing `loss_m · units_m / Σ units`
    reproduces the full-batch loss exactly."""
    kept = keep.to(mask.dtype)
    if objective == "dapo":
        return float((mask * kept[:, None]).sum())
    return float(kept.sum())
