"""Policy-gradient objectives as pure functions of tensors (torchtune `dev/grpo/loss.py`
style: shape comments on each line, no model, no optimizer, no config objects).

Notation: N rollouts (B prompts × G), T completion tokens; `logp`, `old_logp` are
log π(o_t | q, o_<t) under the current and the sampling policy; `mask` marks real
completion tokens; `weight` is each rollout's admission (0/1) × Scheduler loss weight.
Per-token ratio r_it = exp(logp_it − old_logp_it); clipped surrogate
s_it = min(r_it·A_i, clip(r_it, 1−ε_low, 1+ε_high)·A_i).

| objective | advantage A_i                  | aggregation of −w_i·s_it                         | clip (ε_low, ε_high) |
|-----------|--------------------------------|---------------------------------------------------|----------------------|
| grpo      | (r − mean_g) / (std_g + 1e-6)  | mean over kept rollouts of the token mean          | (0.2, 0.2)           |
| dr_grpo   | r − mean_g                     | sum over tokens / (N_kept · T_max)                 | (0.2, 0.2)           |
| dapo      | (r − mean_g) / (std_g + 1e-6)  | sum over all tokens / kept tokens (token level)    | (0.2, 0.28)          |
| gspo      | (r − mean_g) / (std_g + 1e-6)  | sequence ratio s_i = exp(mean_t(logp − old)), mean | (3e-4, 4e-4)         |

References: GRPO — Shao et al. 2024 (DeepSeekMath) eq. 3; Dr. GRPO — Liu et al. 2025
("Understanding R1-Zero-Like Training") §3.1, which drops the std and the 1/|o_i|;
DAPO — Yu et al. 2025 eq. 8–10 (clip-higher, token-level loss); GSPO — Zheng et al.
2025 eq. 5–7 (length-normalised sequence ratio, clip 3e-4/4e-4).

Weights: a rollout's term is multiplied by w_i; normalisers count *kept* rollouts
(w_i > 0) or their tokens, so a weight of 0.5 halves that rollout's gradient instead of
being renormalised away, and a weight of 0 removes it entirely (its tokens do not enter
the token-level denominator either).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["OBJECTIVES", "LossOut", "advantages", "aggregation_units", "clipped_surrogate", "grpo_loss", "dr_grpo_loss",
           "dapo_loss", "gspo_loss", "kl_k3", "policy_loss", "default_clip"]

OBJECTIVES = ("grpo", "dr_grpo", "dapo", "gspo")


class LossOut(NamedTuple):
    loss: torch.Tensor        # float32[] to minimise
    clip_fraction: float      # share of kept tokens (sequences for GSPO) whose ratio was clipped


def default_clip(objective: str) -> tuple[float, float]:
    """(ε_low, ε_high) each paper uses."""
    return {"grpo": (0.2, 0.2), "dr_grpo": (0.2, 0.2), "dapo": (0.2, 0.28), "gspo": (3e-4, 4e-4)}[objective]


def advantages(rewards: torch.Tensor, objective: str, eps: float = 1e-6) -> torch.Tensor:
    """float32[B, G] group advantages: r − mean for Dr. GRPO, (r − mean)/(std + eps)
    otherwise (population std, as `rlpace.group_advantages`).

    >>> advantages(torch.tensor([[1., 0., 0., 0.]]), "dr_grpo").tolist()
    [[0.75, -0.25, -0.25, -0.25]]
    """
    centred = rewards - rewards.mean(dim=1, keepdim=True)                      # [B, G]
    if objective == "dr_grpo":
        return centred
    std = rewards.std(dim=1, keepdim=True, unbiased=False)                     # [B, 1]
    return torch.where(std > 0, centred / (std + eps), torch.zeros_like(centred))


def clipped_surrogate(ratio: torch.Tensor, adv: torch.Tensor, clip_low: float, clip_high: float):
    """(min(ratio·A, clip(ratio, 1−ε_low, 1+ε_high)·A), clipped bool) elementwise."""
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    return torch.minimum(unclipped, clipped), clipped < unclipped


def _kept(weight: torch.Tensor) -> torch.Tensor:
    return (weight > 0).float()                                                 # [N]


def grpo_loss(logp, old_logp, adv, mask, weight, clip_low=0.2, clip_high=0.2, **_) -> LossOut:
    """GRPO: −(1/N_kept) Σ_i w_i · (1/|o_i|) Σ_t s_it.

    >>> lp = torch.zeros(2, 2); m = torch.tensor([[1., 1.], [1., 0.]])
    >>> round(grpo_loss(lp, lp, torch.tensor([1., 0.]), m, torch.ones(2)).loss.item(), 3)
    -0.5
    """
    ratio = torch.exp(logp - old_logp)                                          # [N, T]
    surr, clipped = clipped_surrogate(ratio, adv[:, None], clip_low, clip_high)  # [N, T]
    per_seq = (surr * mask).sum(1) / mask.sum(1).clamp(min=1)                   # [N]
    n_kept = _kept(weight).sum().clamp(min=1)
    loss = -(weight * per_seq).sum() / n_kept
    return LossOut(loss, _token_share(clipped, mask, weight))


def dr_grpo_loss(logp, old_logp, adv, mask, weight, clip_low=0.2, clip_high=0.2, max_tokens=None, **_) -> LossOut:
    """Dr. GRPO: −(1/(N_kept · T_max)) Σ_i w_i Σ_t s_it, T_max = `max_tokens` (the
    generation budget; default the padded width T). No length normalisation per rollout."""
    ratio = torch.exp(logp - old_logp)                                          # [N, T]
    surr, clipped = clipped_surrogate(ratio, adv[:, None], clip_low, clip_high)  # [N, T]
    t_max = float(max_tokens if max_tokens is not None else mask.shape[1])
    n_kept = _kept(weight).sum().clamp(min=1)
    loss = -(weight[:, None] * surr * mask).sum() / (n_kept * t_max)
    return LossOut(loss, _token_share(clipped, mask, weight))


def dapo_loss(logp, old_logp, adv, mask, weight, clip_low=0.2, clip_high=0.28, **_) -> LossOut:
    """DAPO: −Σ_i w_i Σ_t s_it / Σ_i 1[w_i>0] |o_i| (token-level mean, clip-higher)."""
    ratio = torch.exp(logp - old_logp)                                          # [N, T]
    surr, clipped = clipped_surrogate(ratio, adv[:, None], clip_low, clip_high)  # [N, T]
    n_tokens = (mask * _kept(weight)[:, None]).sum().clamp(min=1)
    loss = -(weight[:, None] * surr * mask).sum() / n_tokens
    return LossOut(loss, _token_share(clipped, mask, weight))


def gspo_loss(logp, old_logp, adv, mask, weight, clip_low=3e-4, clip_high=4e-4, **_) -> LossOut:
    """GSPO: s_i = exp((1/|o_i|) Σ_t (logp − old_logp)); −(1/N_kept) Σ_i w_i ·
    min(s_i A_i, clip(s_i, 1−ε_low, 1+ε_high) A_i). The gradient of s_i spreads evenly
    over o_i's tokens (GSPO eq. 10)."""
    log_ratio = ((logp - old_logp) * mask).sum(1) / mask.sum(1).clamp(min=1)    # [N]
    seq_ratio = torch.exp(log_ratio)                                            # [N]
    surr, clipped = clipped_surrogate(seq_ratio, adv, clip_low, clip_high)     # [N]
    kept = _kept(weight)
    loss = -(weight * surr).sum() / kept.sum().clamp(min=1)
    share = float((clipped.float() * kept).sum() / kept.sum().clamp(min=1))
    return LossOut(loss, share)


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(π‖π_ref), mean over kept tokens:
    exp(ref − logp) − (ref − logp) − 1 ≥ 0 (GRPO eq. 4).

    >>> kl_k3(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1)).item()
    0.0
    """
    d = ref_logp - logp                                                         # [N, T]
    k3 = torch.exp(d) - d - 1.0                                                 # [N, T]
    m = mask * _kept(weight)[:, None]
    return (k3 * m).sum() / m.sum().clamp(min=1)


def _token_share(clipped, mask, weight) -> float:
    m = mask * _kept(weight)[:, None]
    return float((clipped.float() * m).sum() / m.sum().clamp(min=1))


_LOSSES = {"grpo": grpo_loss, "dr_grpo": dr_grpo_loss, "dapo": dapo_loss, "gspo": gspo_loss}


def policy_loss(objective: str, logp, old_logp, adv, mask, weight, *, clip_low=None, clip_high=None,
                max_tokens=None) -> LossOut:
    """Dispatch to the named objective; clip defaults to the paper's (`default_clip`)."""
    if objective not in _LOSSES:
        raise ValueError(f"unknown objective {objective!r}; valid: {', '.join(OBJECTIVES)}.")
    lo, hi = default_clip(objective)
    return _LOSSES[objective](logp, old_logp, adv, mask, weight,
                              clip_low=lo if clip_low is None else clip_low,
                              clip_high=hi if clip_high is None else clip_high, max_tokens=max_tokens)


def aggregation_units(objective: str, mask: torch.Tensor, weight: torch.Tensor) -> float:
    """How many units a (micro-)batch contributes to its objective's normaliser: kept
    tokens for DAPO, kept rollouts otherwise. Splitting a batch into micro-batches and
    summing `loss_m · units_m / Σ units` reproduces the full-batch loss exactly."""
    kept = _kept(weight)
    if objective == "dapo":
        return float((mask * kept[:, None]).sum())
    return float(kept.sum())
