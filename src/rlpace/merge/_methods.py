"""Per-tensor merge rules: ISO-Merger (arXiv 2607.19331), task arithmetic (arXiv 2212.04089),
TIES (arXiv 2306.01708). Pure functions of the base tensor and the experts' tensors,
computed in float64; `rlpace.merge.merge_checkpoints` applies them to whole checkpoints."""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["iso_merge_matrix", "iso_merge_matrix_gram", "task_vector_mean", "task_arithmetic", "ties", "RHO_KEEP", "RIDGE", "C_CLIP"]

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
    """X·(XᵀX)^(-1/2), the orthonormal polar factor of X [m, q], m ≥ q, by one q × q eigh
    instead of an SVD (about 3× cheaper at q = 896). Exact to rounding here because every X
    retracted is U₀ + ξ with U₀ᵀξ skew (ξ a tangent vector), so XᵀX = I + ξᵀξ has all its
    eigenvalues ≥ 1: nothing is squared into an ill-conditioned system."""
    return x @ _inv_sqrt(x.transpose(-1, -2) @ x)


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
    c = _retention(gram, ridge, clip)
    ct = torch.as_tensor(c, dtype=torch.float64, device=w0.device)
    xu = _tangent(u0, sum(ci * x for ci, x in zip(ct, xus)))
    xv = _tangent(v0, sum(ci * x for ci, x in zip(ct, xvs)))
    return (_polar(u0 + xu) * s0) @ _polar(v0 + xv).T, c


def _retention(gram: np.ndarray, ridge: float, clip: tuple) -> np.ndarray:
    """c of (Γ + ridge·I)·c = diag Γ, clipped; a singular system gives every expert c = 1."""
    try:
        c = np.linalg.solve(gram + ridge * np.eye(len(gram)), np.diag(gram))
    except np.linalg.LinAlgError:                 # exactly singular: every expert at unit strength
        c = np.ones(len(gram))
    return np.clip(c, *clip)


GRAM_BLOCK = 128           # column block of `_add_gram`'s upper-triangle products


def _add_gram(out: torch.Tensor, x: torch.Tensor) -> None:
    """out += xᵀx (x [rows, n]; out float64 [n, n]) from the upper triangle's column blocks
    only, each mirrored: (p + 1)/(2p) of the product's flops for p = ⌈n/128⌉ blocks (4/7 at
    n = 896; measured 0.144 → 0.089 s in float64 and 0.062 → 0.045 s in float32 for a
    4864 × 896 x, one thread). Each entry is the same dot product as in x.T @ x (equal bit
    for bit with torch's CPU BLAS here); torch has no syrk."""
    n = x.shape[1]
    edges = list(range(0, n, GRAM_BLOCK)) + [n]
    for lo, hi in zip(edges[:-1], edges[1:]):
        blk = (x[:, lo:hi].T @ x[:, lo:]).to(out.dtype)                # rows lo:hi, columns lo:n
        out[lo:hi, lo:] += blk
        out[hi:, lo:hi] += blk[:, hi - lo:].T


def _inv_sqrt(a: torch.Tensor) -> torch.Tensor:
    """A^(-1/2) of a symmetric positive definite A (eigh; A is near I here)."""
    lam, vec = torch.linalg.eigh((a + a.T) / 2)
    return (vec * lam.rsqrt()) @ vec.T


def _inv_sqrt_lower(a: torch.Tensor) -> torch.Tensor:
    """A^(-1/2) of a symmetric positive definite A from its lower triangle (eigh reads only that
    triangle): F·Fᵀ with F = vec·Λ^(-1/4), a symmetric product at 4/7 of a full one's flops
    (`_gram_sym`), exactly symmetric."""
    lam, vec = torch.linalg.eigh(a)
    return _gram_sym((vec * lam.rsqrt().sqrt_()).T)


def _gram_sym(x: torch.Tensor) -> torch.Tensor:
    """xᵀx (x [r, n], float64) by `_add_gram`'s upper-triangle blocks: 4/7 of x.T @ x's flops at
    n = 896, each entry the same dot product (measured 0.025 → 0.015 s for 896 × 896, one thread)."""
    out = torch.zeros(x.shape[1], x.shape[1], dtype=x.dtype, device=x.device)
    _add_gram(out, x)
    return out


def _sym(m: torch.Tensor) -> torch.Tensor:
    return (m + m.T) / 2


# σ_max/σ_min (base or expert) above which the Gram route hands a matrix to the LAPACK-SVD rule.
# Measured against that rule on 896 × 896 and 2048 × 512 matrices with a log-spaced spectrum
# and two 1e-3 experts (docs/methods/iso.md#precision): float64 products stay within 1e-11
# relative up to cond 1.1e5; float32 products (a bf16 / fp16 output) read 2.5e-8 at cond 1e2,
# 3e-8 at 1e3 and 2.7e-7 at 1e5, with 3e-4 of the bf16 outputs then one ulp off.
MAX_GRAM_COND = 1e5
MAX_GRAM_COND_F32 = 1e3
KEEP_BLOCKS_BYTES = 64 << 20


def iso_merge_matrix_gram(w0: torch.Tensor, experts, *, rho_keep: float = RHO_KEEP, ridge: float = RIDGE,
                          clip: tuple = C_CLIP, dtype=torch.float64, block_rows: int = 4096,
                          max_cond: float | None = None, blas_dtype=torch.float64):
    """`iso_merge_matrix`'s result from n × n Gram matrices (n = the short side), streamed
    over row blocks, or None when a matrix is too ill-conditioned for that route.

    The SVDs of a tall m × n matrix are read off its Gram matrix — WᵀW = V·Σ²·Vᵀ, U = W·V·Σ⁻¹
    kept implicit — so nothing m × q is ever formed: one pass accumulates, in float64,
    W₀ᵀW₀, W₀ᵀΔ_i and Δ_iᵀΔ_j (Δ_i = W_i − W₀) over blocks of `block_rows` rows; every step
    of the merge (sign alignment, tangent projections, the ρ mask, the Gram system of the
    weight effects, both polar retractions) is then algebra on n × n matrices, since each
    frame is a combination U★ = Σ_a U_a·γ_a of the implicit frames; a second pass writes
    W★ = W₀·Σ_a Z_a + Σ_i Δ_i·Z_i block by block in `dtype`. A wide matrix is merged as its
    transpose (with the sign rule still taken on its left vectors). Cost: (K+1)(K+2)/2 + K + 1
    products of m × n by n × n and K + 3 n × n eigendecompositions, against 2K + 3 thin SVDs.

    Exactness: a Gram matrix squares the condition number, so frames and Σ₀ carry a relative
    error of about eps·cond² (the merged weight much less: its small modes are scaled by their
    small σ); above `max_cond` (σ_max/σ_min of the base or of an expert; None = MAX_GRAM_COND
    for float64 products, MAX_GRAM_COND_F32 for float32 ones) this returns None and the caller
    uses `iso_merge_matrix` (LAPACK SVDs) or retries with float64 products. Tested against it.

    `blas_dtype=torch.float32` runs the two passes' m × n products in float32 (about 2.5× the
    float64 speed on a CPU) and keeps the n × n algebra in float64. The merged weight is
    written as W₀ + [W₀ | Δ_1 | … | Δ_K]·[Σ_a Z_a − I; Z_1; …; Z_K], so float32 rounding
    touches only the frame motion, never W₀ itself, and the Gram blocks' float32 rounding
    is common to base and experts to first order: measured 1e-9–1e-7 relative to the float64
    result (tests/test_merge.py asserts ≤ 1e-6), far below a bf16 output's rounding (2^-9).
    """
    f64 = torch.float64
    if max_cond is None:
        max_cond = MAX_GRAM_COND if blas_dtype == f64 else MAX_GRAM_COND_F32
    wide = w0.shape[0] < w0.shape[1]
    big0 = w0.T if wide else w0                                        # [M, N], M ≥ N
    bigs = [w.T if wide else w for w in experts]
    m, n = big0.shape
    k = len(bigs)
    dev = w0.device

    def rows(r):                                                       # [W₀ | Δ_1 | … | Δ_K] of rows r…
        w0b = big0[r:r + block_rows]
        x = torch.empty(w0b.shape[0], (k + 1) * n, dtype=blas_dtype, device=dev)
        x0 = x[:, :n]
        x0.copy_(w0b)
        for i, w in enumerate(bigs):                                   # written in place: no concatenation
            torch.sub(w[r:r + block_rows].to(dev), x0, out=x[:, (i + 1) * n:(i + 2) * n])
        return x

    # acc[a] = X_aᵀ·[X_a | … | X_K], X_0 = W₀, X_i = Δ_i: the (K+1)(K+2)/2 distinct n × n blocks;
    # W₀ᵀW₀ always in float64 (it fixes Σ₀ and the conditioning check)
    acc = [torch.zeros(n, (k + 1 - a) * n, dtype=f64, device=dev) for a in range(k + 1)]
    # the blocks of a matrix up to KEEP_BLOCKS_BYTES are kept for the second pass instead of being
    # converted, subtracted and concatenated again (a 4864 × 896 matrix with 2 experts: 52 MB)
    kept = [] if m * (k + 1) * n * torch.finfo(blas_dtype).bits // 8 <= KEEP_BLOCKS_BYTES else None
    for r in range(0, m, block_rows):
        x = rows(r)
        if kept is not None:
            kept.append(x)
        w0b = x[:, :n] if blas_dtype == f64 else big0[r:r + block_rows].to(f64)
        _add_gram(acc[0][:, :n], w0b)
        for a in range(k + 1):
            if a:
                _add_gram(acc[a][:, :n], x[:, a * n:(a + 1) * n])
            if a < k:
                acc[a][:, n:] += (x[:, a * n:(a + 1) * n].T @ x[:, (a + 1) * n:]).to(f64)
    c00 = acc[0][:, :n]
    b = [acc[0][:, (i + 1) * n:(i + 2) * n] for i in range(k)]        # W₀ᵀΔ_i
    d = {(i, j): acc[i + 1][:, (j - i) * n:(j - i + 1) * n] for i in range(k) for j in range(i, k)}   # Δ_iᵀΔ_j

    def gram(a, c):                                                    # W_aᵀW_c, 0 ≤ a < c ≤ K
        if a == 0:
            return c00 + b[c - 1]
        i, j = a - 1, c - 1
        g = b[i].T + d[i, j]
        g += c00
        g += b[j]
        return g

    lam, vecs = [], []
    for a in range(k + 1):
        # W_aᵀW_a = C₀₀ + (B + Bᵀ) + D: symmetric up to the rounding of the Gram blocks' own
        # products; eigh reads the lower triangle only, so no (G + Gᵀ)/2 pass is made
        if a == 0:
            g = c00
        else:
            g = b[a - 1] + b[a - 1].T
            g += c00
            g += d[a - 1, a - 1]
        la, va = torch.linalg.eigh(g)
        la, va = la.flip(0), va.flip(1)                                # descending
        if not bool(la[-1] > 0) or float(la[0] / la[-1]) > max_cond ** 2:
            return None
        lam.append(la)
        vecs.append(va)
    sig = [la.sqrt() for la in lam]
    qs = [va / sa for va, sa in zip(vecs, sig)]                       # U_a = W_a·Q_a
    # U_aᵀU_c for a < c; U_aᵀU_a = I by construction, U_cᵀU_a the transpose
    o = {(a, c): (qs[a].T @ gram(a, c)) @ qs[c] for a in range(k + 1) for c in range(a + 1, k + 1)}
    s0, v0 = sig[0], vecs[0]
    keep = max(1, int(round(rho_keep * n)))
    mask = torch.ones(n, dtype=f64, device=dev)
    mask[keep:] = 0.0
    alphas, betas, a_s, b_s = [], [], [], []
    for i in range(1, k + 1):
        oi = o[0, i]
        pv = v0.T @ vecs[i]                                            # V₀ᵀV_i (V₀ is n × n orthogonal)
        lead = torch.diagonal(pv if wide else oi)                      # ⟨left vectors of the original⟩
        sign = torch.where(lead >= 0, 1.0, -1.0).to(f64)
        mi = oi * sign                                                 # U₀ᵀŨ_i
        alpha = _sym(mi).mul_(-mask)                                   # ξ_u,i = U₀·α_i + U_i·diag(β_i)
        beta = sign * mask
        alphas.append(alpha)
        betas.append(beta)
        a_s.append(oi * beta + alpha)                                  # U₀ᵀξ_u,i
        pv *= sign
        b_s.append(pv.sub_(_sym(pv)).mul_(mask))                       # ξ_v,i = V₀·b_i
    ss = s0[:, None] * s0[None, :]
    s2 = s0 * s0

    def dot(x, y):                                                     # ⟨x, y⟩_F: one pass, no temporary
        return torch.dot(x.reshape(-1), y.reshape(-1))

    # Γ_ij = ⟨ξ_u,iΣ₀, ξ_u,jΣ₀⟩ + ⟨ξ_v,iΣ₀, ξ_v,jΣ₀⟩ + the two cross terms, from n × n factors
    # formed once per expert and Frobenius dots per pair (Γ is symmetric: pairs i ≤ j only).
    # With ξ_u,i = U₀·α_i + U_i·diag(β_i): ξ_u,iΣ₀ has U₀-part α_iΣ₀ and U_i-part diag(β_i)Σ₀,
    # whose overlap is U₀ᵀU_i, so ⟨ξ_u,iΣ₀, ξ_u,jΣ₀⟩ = ⟨α_iΣ₀, α_jΣ₀⟩ + ⟨α_iΣ₀, (U₀ᵀU_j)β_jΣ₀⟩
    # + ⟨(U₀ᵀU_i)β_iΣ₀, α_jΣ₀⟩ + Σ_k σ_k²·β_ik·β_jk·(U_iᵀU_j)_kk
    sa = [al * s0 for al in alphas]                                    # α_i·Σ₀
    sq = [o[0, i + 1] * (be * s0) for i, be in enumerate(betas)]       # U₀ᵀU_i·diag(β_i)·Σ₀
    sb = [bs * s0 for bs in b_s]                                       # b_i·Σ₀ (ξ_v,i = V₀·b_i)
    sat = [(a * ss).T.contiguous() for a in a_s]                       # (Σ₀·(U₀ᵀξ_u,i)·Σ₀)ᵀ
    gm = np.zeros((k, k))
    for i in range(k):
        for j in range(i, k):
            oii = torch.ones(n, dtype=f64, device=dev) if i == j else o[i + 1, j + 1].diagonal()
            uu = dot(sa[i], sa[j]) + dot(sa[i], sq[j]) + dot(sq[i], sa[j]) + (s2 * betas[i] * betas[j] * oii).sum()
            cross = dot(sat[i], b_s[j]) + dot(sat[j], b_s[i])          # ⟨ξ_u,iΣ₀V₀ᵀ, U₀Σ₀ξ_v,jᵀ⟩ + (i ↔ j)
            gm[i, j] = gm[j, i] = float(uu + dot(sb[i], sb[j]) + cross)
    del sa, sq, sb, sat
    c = _retention(gm, ridge, clip)
    ct = [float(x) for x in c]
    # Y = U₀ + Π_U₀(Σ c_i ξ_u,i) = U₀·γ₀ + Σ U_i·diag(γ_i): γ₀ = I + Σ c_i α_i − sym(U₀ᵀ·Σ c_i ξ_u,i)
    a_star = sum(ci * ai for ci, ai in zip(ct, a_s))                   # U₀ᵀ·Σ c_i ξ_u,i
    g0 = _sym(a_star).neg_()
    for ci, al in zip(ct, alphas):
        g0.add_(al, alpha=ci)
    g0.diagonal().add_(1.0)
    gd = [ci * be for ci, be in zip(ct, betas)]
    # YᵀY = γ₀ᵀγ₀ + T + Tᵀ + Σ_i diag(γ_i)², T = γ₀ᵀ·Σ_i U₀ᵀU_i·diag(γ_i) + Σ_{i<j} diag(γ_i)·U_iᵀU_j·diag(γ_j):
    # the experts' U₀ᵀU_i·diag(γ_i) summed before the one product with γ₀ᵀ, γ₀ᵀγ₀ as a symmetric product
    u0u = o[0, 1] * gd[0]
    for i in range(1, k):
        u0u.add_(o[0, i + 1] * gd[i])
    t = g0.T @ u0u
    del u0u
    for i in range(k):
        for j in range(i + 1, k):
            t += (gd[i][:, None] * o[i + 1, j + 1]) * gd[j]
    yty = _gram_sym(g0)
    yty += t
    yty += t.T
    del t
    yty.diagonal().add_(sum(gi * gi for gi in gd))
    h = _inv_sqrt_lower(yty)                                           # U★ = Y·(YᵀY)^(-1/2)
    # V₀ + Π_V₀(Σ c_i ξ_v,i) = V₀·(I + S), S = skew(Σ c_i b_i); (I + S)ᵀ(I + S) = I + SᵀS
    b_star = sum(ci * bi for ci, bi in zip(ct, b_s))
    sk = b_star.sub_(b_star.T.clone()).mul_(0.5)                       # S = (B − Bᵀ)/2
    sts = _gram_sym(sk)
    sts.diagonal().add_(1.0)
    hv = _inv_sqrt_lower(sts)
    v_star = v0 @ (sk @ hv).add_(hv)                                   # V★ = V₀·(I + S)·(I + SᵀS)^(-1/2)
    r = (h * s0) @ v_star.T                                            # W★ = Σ_a U_a·γ_a·R
    # Z_a = Q_a·γ_a·R; γ_i = diag(c_i·β_i) is zero past the kept modes, so those rows of R are skipped
    zstack = torch.empty((k + 1) * n, n, dtype=f64, device=dev)
    z0 = zstack[:n]
    torch.matmul(qs[0], g0 @ r, out=z0)
    for i in range(k):
        zi = zstack[(i + 1) * n:(i + 2) * n]
        torch.matmul(qs[i + 1][:, :keep] * gd[i][:keep], r[:keep], out=zi)
        z0 += zi
    z0.diagonal().sub_(1.0)
    # W★ = W₀·Σ_a Z_a + Σ_i Δ_i·Z_i = W₀ + [W₀ | Δ_1 | … | Δ_K]·[Σ_a Z_a − I; Z_1; …; Z_K]
    zstack = zstack.to(blas_dtype)
    out = torch.empty(m, n, dtype=dtype, device=dev)
    for bi, r0 in enumerate(range(0, m, block_rows)):
        x = rows(r0) if kept is None else kept[bi]
        y = x @ zstack
        y += x[:, :n]
        out[r0:r0 + block_rows] = y
    return (out.T.contiguous() if wide else out), c


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
