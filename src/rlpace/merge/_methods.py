"""Per-tensor merge rules: ISO-Merger (arXiv 2607.19331), task arithmetic (arXiv 2212.04089),
TIES (arXiv 2306.01708). Pure functions of the base tensor and the experts' tensors,
computed in float64; `rlpace.merge.merge_checkpoints` applies them to whole checkpoints."""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["iso_merge_matrix", "task_vector_mean", "task_arithmetic", "ties", "RHO_KEEP", "RIDGE", "C_CLIP"]

RHO_KEEP = 0.9            # share of the base's singular modes whose frame motion is kept
RIDGE = 1e-12             # absolute ridge of the Gram system (the public script's value)
C_CLIP = (0.0, 1.5)       # retention coefficients are clipped to this interval


def _thin_svd(w: torch.Tensor):
    """(U [m, q], Σ [q], V [n, q]) of w [m, n], q = min(m, n)."""
    u, s, vh = torch.linalg.svd(w, full_matrices=False)
    return u, s, vh.transpose(-1, -2)


def _tangent(x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """Π_X(Z) = Z − X·sym(XᵀZ), the Stiefel tangent projection at X."""
    m = x.transpose(-1, -2) @ z
    return z - x @ ((m + m.transpose(-1, -2)) / 2)


def _polar(x: torch.Tensor) -> torch.Tensor:
    a, _, bh = torch.linalg.svd(x, full_matrices=False)
    return a @ bh


def iso_merge_matrix(w0: torch.Tensor, experts, *, rho_keep: float = RHO_KEEP, ridge: float = RIDGE,
                     clip: tuple = C_CLIP):
    """ISO-Merger of one matrix (arXiv 2607.19331, App. E): float64[m, n] merged weight and
    the retention coefficients c float64[K].

        W₀ = U₀·Σ₀·V₀ᵀ,  W_i = U_i·Σ_i·V_iᵀ      thin SVDs; each pair (u_ik, v_ik) flipped
                                                   to s_k = sign⟨u₀k, u_ik⟩ (sign 0 := +1)
        ξ_u,i = Π_U₀(U_i − U₀),  ξ_v,i = Π_V₀(V_i − V₀),  columns k ≥ round(ρ·q) zeroed
        g_i = ξ_u,i·Σ₀·V₀ᵀ + U₀·Σ₀·ξ_v,iᵀ           first-order weight effect of expert i
        (Γ + ridge·I)·c = diag Γ,  Γ_ij = ⟨g_i, g_j⟩_F;  c ← clip(c, 0, 1.5)
                                                   (Γc)_i/Γ_ii = 1: each expert's own effect
                                                   is kept at unit strength
        U★ = polar(U₀ + Π_U₀(Σ c_i ξ_u,i)),  V★ likewise,  W★ = U★·Σ₀·V★ᵀ

    so W★ has the base's singular values exactly (up to rounding). One expert gives c ≈ 1;
    an expert equal to the base gives Γ = 0 and c = 0, W★ = W₀.

    >>> import torch
    >>> w0 = torch.diag(torch.tensor([3.0, 2.0, 1.0], dtype=torch.float64))
    >>> w, c = iso_merge_matrix(w0, [w0, w0])
    >>> bool(torch.allclose(w, w0, atol=1e-12)), c.tolist()
    (True, [0.0, 0.0])
    """
    w0 = w0.to(torch.float64)
    ws = [w.to(device=w0.device, dtype=torch.float64) for w in experts]
    u0, s0, v0 = _thin_svd(w0)
    q = s0.numel()
    keep = max(1, int(round(rho_keep * q)))       # Python's round: half to even, like the public script
    xus, xvs = [], []
    for w in ws:
        u, _, v = _thin_svd(w)
        sign = torch.where((u0 * u).sum(0) >= 0, 1.0, -1.0).to(u)     # [q]: joint sign of (u_k, v_k)
        xu, xv = _tangent(u0, u * sign - u0), _tangent(v0, v * sign - v0)
        xu[:, keep:] = 0.0                        # a coordinate mask: tangency is restored below
        xv[:, keep:] = 0.0
        xus.append(xu)
        xvs.append(xv)
    effects = torch.stack([((xu * s0) @ v0.T + (u0 * s0) @ xv.T).reshape(-1) for xu, xv in zip(xus, xvs)])
    gram = (effects @ effects.T).cpu().numpy()                         # [K, K]
    try:
        c = np.linalg.solve(gram + ridge * np.eye(len(ws)), np.diag(gram))
    except np.linalg.LinAlgError:                 # exactly singular: every expert at unit strength
        c = np.ones(len(ws))
    c = np.clip(c, *clip)
    ct = torch.as_tensor(c, dtype=torch.float64, device=w0.device)
    xu = _tangent(u0, sum(ci * x for ci, x in zip(ct, xus)))
    xv = _tangent(v0, sum(ci * x for ci, x in zip(ct, xvs)))
    return (_polar(u0 + xu) * s0) @ _polar(v0 + xv).T, c


def task_vector_mean(w0: torch.Tensor, experts) -> torch.Tensor:
    """w₀ + (1/K)·Σ (w_i − w₀) in float64 (ISO-Merger's rule for 1-D tensors)."""
    w0 = w0.to(torch.float64)
    return w0 + sum(w.to(w0) - w0 for w in experts) / len(experts)


def task_arithmetic(w0: torch.Tensor, experts, *, scale: float = 1.0) -> torch.Tensor:
    """Task arithmetic (Ilharco et al. 2023, arXiv 2212.04089): w₀ + λ·Σ (w_i − w₀), λ = `scale`."""
    w0 = w0.to(torch.float64)
    return w0 + scale * sum(w.to(w0) - w0 for w in experts)


def ties(w0: torch.Tensor, experts, *, density: float = 0.2, scale: float = 1.0) -> torch.Tensor:
    """TIES-Merging (Yadav et al. 2023, arXiv 2306.01708): trim each task vector τ_i = w_i − w₀
    to its `density` share of largest |τ| entries, elect the sign γ = sign(Σ trimmed τ_i), and
    average, entry by entry, only the trimmed τ_i whose sign is γ: w₀ + λ·mean.

    >>> import torch
    >>> w0 = torch.zeros(4, dtype=torch.float64)
    >>> ties(w0, [torch.tensor([4.0, -1, 0, 0]), torch.tensor([2.0, 3, 0, 0])], density=0.5).tolist()
    [3.0, 3.0, 0.0, 0.0]
    """
    w0 = w0.to(torch.float64)
    taus = torch.stack([w.to(w0) - w0 for w in experts])               # [K, ...]
    flat = taus.reshape(len(experts), -1)
    k = max(1, int(round(density * flat.shape[1])))
    # ties in |τ| at the threshold keep every tied entry (a value rule, not a position rule)
    thresh = flat.abs().kthvalue(flat.shape[1] - k + 1, dim=1, keepdim=True).values
    trimmed = torch.where(flat.abs() >= thresh, flat, torch.zeros_like(flat))
    elected = torch.sign(trimmed.sum(0))                               # [P]
    agree = (torch.sign(trimmed) == elected) & (trimmed != 0)
    mean = (trimmed * agree).sum(0) / agree.sum(0).clamp(min=1)
    return w0 + scale * mean.reshape(w0.shape)
