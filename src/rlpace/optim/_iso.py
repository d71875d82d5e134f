"""ISO: isospectral optimization (Zhu, Cong et al. 2026, arXiv 2607.19331; docs/methods/iso.md).

Every managed weight matrix keeps the spectrum of the base model and learns only its
singular frames:

    W₀ = U₀·diag(Σ₀)·V₀ᵀ  (thin SVD in float64, once)     W(U, V) = U·diag(Σ₀)·Vᵀ

The trainable variables are the frames U ∈ St(m, q), V ∈ St(n, q) (q = min(m, n)); the
module keeps computing with W, whose gradient G = ∂L/∂W reaches the frames by the chain
rule,

    ∂L/∂U = G·V·diag(Σ₀)        ∂L/∂V = Gᵀ·U·diag(Σ₀),

projected onto the Stiefel tangent space, Π_X(Z) = Z − X·sym(XᵀZ). The base optimizer
(AdamW, Muon, or any you pass) steps the frames with its state kept across steps ("states
and all", as the paper describes), and a polar retraction in float64, X = A·S·Bᵀ → A·Bᵀ,
puts U and V back on the manifold; then W ← U·diag(Σ₀)·Vᵀ is written into the module.
"""

from __future__ import annotations

import math
import warnings
from typing import Callable, Iterable

import torch
from torch.optim.adam import adam

from ..errors import InputError
from ._chain import ChainedOptimizer, evaluate_closure
from ._muon import BatchedMuon

__all__ = ["IsoSpectral", "polar", "project_tangent", "frame_gradients", "default_managed"]


NEWTON_MAX = 0.1           # ‖XᵀX − I‖_F up to which Newton–Schulz is used (then ≤ 4 iterations)
NEWTON_TARGET = {torch.float64: 1e-16, torch.float32: 1e-7}   # the bound on ‖polar(X)ᵀpolar(X) − I‖
                           # run down to (`_newton_iterations`): at or below the rounding of the
                           # float32 products themselves (‖UᵀU − I‖ ≈ 3e-7 measured after any route)
GRAM_MIN_RATIO = {torch.float64: 1e-8, torch.float32: 1e-2}   # λ_min/λ_max of XᵀX below this
                           # (cond X above 1e4, or 10 in float32, error eps·cond²): an SVD instead


def polar(x: torch.Tensor) -> torch.Tensor:
    """The polar factor A·Bᵀ of x = A·S·Bᵀ [..., m, q], m ≥ q, full column rank: the closest
    matrix with orthonormal columns to x in Frobenius norm.

    Computed as X·(XᵀX)^(-1/2), batched over leading dimensions, in float64 (float32 for a
    float32 input). An optimizer step leaves X near the manifold, δ = ‖XᵀX − I‖_F small:
    for δ ≤ 0.1 the coupled Newton–Schulz iteration for (XᵀX)^(-1/2) (three q × q products an
    iteration, ‖(X·Z)ᵀ(X·Z) − I‖ ≤ ((3 + δ)/4)^(2^k − 1)·δ^(2^k) after k, run until below
    1e-16, 1e-7 in float32: four iterations at most); else
    an eigendecomposition of XᵀX; an SVD when XᵀX is ill-conditioned (cond X > 1e4), where
    the Gram matrix would lose digits. Every route agrees with the SVD's A·Bᵀ to rounding
    (tested against numpy's SVD).

    >>> import torch
    >>> q = polar(torch.tensor([[2.0, 0.0], [0.0, 3.0], [0.0, 0.0]], dtype=torch.float64))
    >>> q.tolist()
    [[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]]
    """
    dt = x.dtype if x.dtype in (torch.float32, torch.float64) else torch.float64
    xd = x.to(dt)
    a = xd.mT @ xd
    eye = torch.eye(a.shape[-1], dtype=dt, device=a.device)
    e = a - eye
    delta = float(torch.linalg.matrix_norm(e).max())
    if delta <= NEWTON_MAX:
        return (xd @ _inverse_sqrt_near_identity(a, e, eye, delta)).to(x.dtype)
    lam, vec = torch.linalg.eigh((a + a.mT) / 2)
    if bool((lam[..., 0] <= GRAM_MIN_RATIO[dt] * lam[..., -1]).any()):
        u, _, vh = torch.linalg.svd(xd, full_matrices=False)
        return (u @ vh).to(x.dtype)
    return (xd @ ((vec * lam.rsqrt().unsqueeze(-2)) @ vec.mT)).to(x.dtype)


def _newton_iterations(delta: float, dt: torch.dtype) -> int:
    """The fewest Newton–Schulz iterations k with c^(2^k − 1)·δ^(2^k) ≤ NEWTON_TARGET[dt],
    c = (3 + δ)/4 (none at δ = 0), for δ = ‖XᵀX − I‖_F.

    Why that bound: every iterate is a function of A = XᵀX, and the result Z_k gives
    (X·Z_k)ᵀ(X·Z_k) = Z_k·A·Z_k = R_k = Z_k·Y_k, with I − R_0 = I − A and, eigenvalue by
    eigenvalue, s ← s²·(3 + s)/4 for s = 1 − r, so |s_k| ≤ c^(2^k − 1)·δ^(2^k): the columns
    of X·Z_k are orthonormal to that, in exact arithmetic (δ ≥ the spectral norm). The
    plain δ^(2^k) bound (c = 1) asks for one iteration more whenever δ is near its edge."""
    if delta == 0:
        return 0
    c, k = (3 + delta) / 4, 1
    while c ** (2 ** k - 1) * delta ** (2 ** k) > NEWTON_TARGET[dt]:
        k += 1
    return k


def _series_degree(delta: float, dt: torch.dtype) -> int:
    """The lowest degree n of the binomial series (I + E)^(-1/2) ≈ Σ_{j≤n} C(−1/2, j)·E^j
    whose result Z gives ‖(X·Z)ᵀ(X·Z) − I‖ ≤ NEWTON_TARGET[dt] for ‖E‖ ≤ δ < 1 (none at δ = 0).

    Why that bound: eigenvalue by eigenvalue (1 + e)·Z(e)² = 1 − 2·(1 + e)^(1/2)·ρ + (1 + e)·ρ²
    for the tail ρ = (1 + e)^(-1/2) − Z(e), and |ρ| ≤ |C(−1/2, n + 1)|·δ^(n+1)/(1 − δ) (the
    coefficients' magnitudes C(2j, j)/4^j fall with j)."""
    if delta == 0:
        return 0
    n, coef = 1, 3 / 8                                # |C(−1/2, n + 1)|
    while True:
        rho = coef * delta ** (n + 1) / (1 - delta)
        if 2 * math.sqrt(1 + delta) * rho + (1 + delta) * rho * rho <= NEWTON_TARGET[dt]:
            return n
        n += 1
        coef *= (2 * n + 1) / (2 * n + 2)


def _inverse_sqrt_near_identity(a: torch.Tensor, e: torch.Tensor, eye: torch.Tensor, delta: float,
                                target_dtype: torch.dtype | None = None) -> torch.Tensor:
    """A^(-1/2) [..., q, q] for A = I + E, ‖E‖_F = δ ≤ NEWTON_MAX, to NEWTON_TARGET: by the
    binomial series in Horner form (n − 1 products for degree n) or the coupled Newton–Schulz
    iteration (3k − 3 products for k ≥ 2 iterations), whichever needs fewer q × q products
    for the target. Near the manifold, as after an optimizer step, the series wins (δ ≈ 0.004:
    degree 2, one product, against Newton–Schulz's three); farther out Newton–Schulz does.
    `target_dtype` (default a's) picks the target."""
    dt = target_dtype or a.dtype
    n, k = _series_degree(delta, dt), _newton_iterations(delta, dt)
    if n == 0:
        return eye.expand_as(a)
    if n - 1 > (3 * k - 3 if k > 1 else 0):
        return _inverse_sqrt_newton_schulz(a, eye, k)
    coefs = [1.0]
    for j in range(1, n + 1):                          # C(−1/2, j) = (−1)^j·C(2j, j)/4^j
        coefs.append(-coefs[-1] * (2 * j - 1) / (2 * j))
    z = torch.add(eye * coefs[n - 1], e, alpha=coefs[n])
    for c in reversed(coefs[:n - 1]):
        z = torch.baddbmm(eye * c, z, e) if z.ndim == 3 else eye * c + z @ e
    return z


def _inverse_sqrt_newton_schulz(a: torch.Tensor, eye: torch.Tensor, iterations: int) -> torch.Tensor:
    """A^(-1/2) [..., q, q] by the coupled Newton–Schulz iteration y → A^(1/2), z → A^(-1/2)
    from y = A, z = I: t = (3I − z·y)/2, y ← y·t, z ← t·z. The products with z = I in the
    first iteration and y·t in the last are skipped (the first two are exact in floating
    point, the last is unused): 3k − 3 products for k ≥ 2 iterations instead of 3k."""
    if iterations == 0:
        return eye.expand_as(a)
    t = 1.5 * eye - 0.5 * a
    y, z = (a @ t if iterations > 1 else None), t
    for k in range(1, iterations):
        t = 1.5 * eye - 0.5 * (z @ y)
        if k < iterations - 1:
            y = y @ t
        z = t @ z
    return z


def _polar_many(xs: list) -> list:
    """[polar(x) for x in xs], each x [B, m, q], with one Newton–Schulz run for all the x of
    one q (and dtype, device): their q × q Gram matrices are stacked, so the iteration is a
    few batched q × q products for every frame of a step, and one host sync decides the route.
    Where any of them is too far from the manifold for Newton–Schulz (δ > 0.1), each x goes
    through `polar`'s own routes."""
    out = [None] * len(xs)
    by_q: dict = {}
    for j, x in enumerate(xs):
        by_q.setdefault((x.shape[-1], x.dtype, x.device), []).append(j)
    for (q, dt, dev), js in by_q.items():
        if dt not in (torch.float32, torch.float64):
            for j in js:
                out[j] = polar(xs[j])
            continue
        a = torch.cat([xs[j].mT @ xs[j] for j in js])                  # [N, q, q]
        eye = torch.eye(q, dtype=dt, device=dev)
        e = a - eye
        delta = float(torch.linalg.matrix_norm(e).max())
        if delta > NEWTON_MAX:
            for j in js:
                out[j] = polar(xs[j])
            continue
        z = _inverse_sqrt_near_identity(a, e, eye, delta)
        for j, zj in zip(js, torch.split(z, [xs[j].shape[0] for j in js])):
            out[j] = xs[j] @ zj
    return out


def project_tangent(x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """Π_X(Z) = Z − X·sym(XᵀZ): the component of Z in the tangent space of the Stiefel
    manifold at X (XᵀX = I), sym(M) = (M + Mᵀ)/2."""
    m = x.transpose(-1, -2) @ z
    return z - x @ ((m + m.transpose(-1, -2)) / 2)


def frame_gradients(grad_w: torch.Tensor, u: torch.Tensor, sigma: torch.Tensor, v: torch.Tensor):
    """(∂L/∂U, ∂L/∂V) = (G·V·diag(Σ), Gᵀ·U·diag(Σ)) for W = U·diag(Σ)·Vᵀ and G = ∂L/∂W
    (Euclidean: the chain rule, no projection)."""
    g = grad_w.to(u.dtype)
    return (g @ v) * sigma, (g.transpose(-1, -2) @ u) * sigma


def _riemannian_frame_gradients(g: torch.Tensor, u: torch.Tensor, s: torch.Tensor, v: torch.Tensor, project: bool):
    """(Π_U(G·V·Σ), Π_V(Gᵀ·U·Σ)) for stacks g [B, m, n], u [B, m, q], s [B, q], v [B, n, q]
    (unprojected with project=False). Both projections need only M = Uᵀ·G·V [B, q, q]:
    Uᵀ·(G·V·Σ) = M·Σ and Vᵀ·(Gᵀ·U·Σ) = Mᵀ·Σ, one q × q product where `project_tangent` takes
    two (the same algebra, tested against it). M is contracted over the short side of G:
    Uᵀ·(G·V) costs m·q², (Vᵀ·(Gᵀ·U))ᵀ costs n·q², for a 4864 × 896 MLP matrix 5.4× fewer."""
    sr = s.unsqueeze(-2)                                   # [B, 1, q]: scales columns
    gv, gtu = g @ v, g.mT @ u                              # G·V [B, m, q], Gᵀ·U [B, n, q]
    if not project:
        return gv * sr, gtu * sr
    # M = Uᵀ·G·V [B, q, q], from whichever of G·V [B, m, q] and Gᵀ·U [B, n, q] is shorter
    m = u.mT @ gv if g.shape[-2] <= g.shape[-1] else (v.mT @ gtu).mT
    a, b = m * sr, m.mT * sr                               # Uᵀ·∂U = M·Σ, Vᵀ·∂V = Mᵀ·Σ
    # sym(·)'s halving as the product's alpha: a power of two, so the same numbers, two calls fewer
    return (torch.baddbmm(gv * sr, u, a + a.mT, alpha=-0.5),
            torch.baddbmm(gtu * sr, v, b + b.mT, alpha=-0.5))


def default_managed(model: torch.nn.Module) -> Callable[[str, torch.Tensor], bool]:
    """The default rule: every 2-D parameter except embedding tables and the output head
    (tied or not). Why: an embedding is a lookup table whose rows are vectors of their own,
    not a linear map whose spectrum the paper's analysis concerns; a tied head is the same
    tensor; and the vocab × hidden SVD is the most expensive one for the least structure.
    The same split as Muon's (hidden matrices only; arXiv 2502.16982, Keller Jordan's Muon)."""
    skip = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    head = getattr(model, "get_output_embeddings", lambda: None)()
    if head is not None and getattr(head, "weight", None) is not None:
        skip.add(id(head.weight))
    return lambda name, p: p.ndim == 2 and id(p) not in skip


class IsoSpectral(torch.optim.Optimizer):
    """Fixed-spectrum optimizer: a base optimizer steps the singular frames of every managed
    matrix; its spectrum stays the base's (arXiv 2607.19331).

    Args:
        model_or_params: an `nn.Module` (managed by `manage`, default `default_managed`:
            2-D weights except embeddings and the head) or an iterable of parameters (then
            every 2-D parameter is managed: pass a model to exclude embeddings).
        base: "adamw" (`torch.optim.AdamW` over frames and the rest; `fused=True` runs its
            fused kernel instead of the multi-tensor code, faster on a CPU), "muon"
            (`torch.optim.Muon` over the frames, as `BatchedMuon`: one Newton–Schulz loop
            per shape; AdamW over the rest), or a callable
            `base(param_groups) -> torch.optim.Optimizer`, called with two groups:
            `[{"params": frames}, {"params": other parameters}]` (the second may be empty).
        manage: `(name, param) -> bool`, which parameters get frames.
        project: project the frame gradients onto the tangent space before the base
            optimizer (default True; see docs/methods/iso.md "momentum").
        aux_kwargs: keyword arguments of the AdamW over the unmanaged parameters with
            base="muon" (default: `lr` and `weight_decay` of `base_kwargs`).
        **base_kwargs: the base optimizer's arguments (lr, betas, weight_decay, ...).

    Frames are float64 (U: [m, q], V: [n, q], Σ₀: [q]) whatever the model's dtype, and the
    base optimizer's state of the frames with them; `frame_dtype=torch.float32` keeps them
    in float32 instead (half the memory and about half the time on a CPU; the spectrum then
    holds to float32 rounding, see docs/methods/iso.md "Cost"). Unmanaged parameters (1-D norms
    and biases, embeddings, the head) are stepped by the base optimizer as usual.

    Momentum: the base state (Adam moments, Muon's buffer) is kept in the ambient
    coordinates across retractions, not transported. With projected gradients every
    buffer is a sum of tangent vectors at recent points; the part normal to the current
    point is O(lr), and the polar retraction removes a normal step X·S (S symmetric) exactly,
    polar(X(I + S)) = X, unlike a QR retraction.

    Example:
        >>> import torch
        >>> lin = torch.nn.Linear(4, 3, bias=False)
        >>> opt = IsoSpectral(lin, base="adamw", lr=1e-2)
        >>> s0 = torch.linalg.svdvals(lin.weight.double())
        >>> lin(torch.randn(8, 4)).square().sum().backward(); opt.step()
        >>> bool(torch.allclose(torch.linalg.svdvals(lin.weight.double()), s0, rtol=1e-6))
        True
    """

    def __init__(self, model_or_params, base: str | Callable = "adamw", *, manage=None, project: bool = True,
                 aux_kwargs: dict | None = None, frame_dtype: torch.dtype = torch.float64, **base_kwargs):
        if frame_dtype not in (torch.float64, torch.float32):
            raise InputError(f"frame_dtype must be torch.float64 or torch.float32; got {frame_dtype}.")
        if isinstance(model_or_params, torch.nn.Module):
            named = list(model_or_params.named_parameters())
            rule = manage or default_managed(model_or_params)
        else:
            params = list(model_or_params) if isinstance(model_or_params, Iterable) else None
            if params is None or not all(isinstance(p, torch.Tensor) for p in params):
                raise InputError("model_or_params must be an nn.Module or an iterable of tensors "
                                 "(param groups are not supported: IsoSpectral makes its own).")
            named = [(f"param{i}", p) for i, p in enumerate(params)]
            rule = manage or (lambda name, p: p.ndim == 2)
        named = [(n, p) for n, p in named if p.requires_grad]
        if not named:
            raise InputError("IsoSpectral got no trainable parameters.")
        self.managed: list[str] = []
        self.skipped_steps = 0          # steps refused for a non-finite gradient (a trainer can log it)
        self._weights, self._u, self._v, self._sigma, others = [], [], [], [], []
        self._other_names: list[str] = []
        for name, p in named:
            if rule(name, p):
                if p.ndim != 2:
                    raise InputError(f"manage selected {name!r} of shape {tuple(p.shape)}; only 2-D weights "
                                     f"can be managed.")
                u, s, vh = torch.linalg.svd(p.detach().double(), full_matrices=False)
                self.managed.append(name)
                self._weights.append(p)
                self._u.append(u.to(frame_dtype))
                self._v.append(vh.T.to(frame_dtype))
                self._sigma.append(s.to(frame_dtype))
            else:
                others.append(p)
                self._other_names.append(name)
        self._others = others
        if not self._weights and not isinstance(model_or_params, torch.nn.Module):
            # e.g. verl's default strategy: fsdp (FSDP1) hands over flattened 1-D shards: ISO
            # would silently be its base optimizer.
            raise InputError("IsoSpectral found no 2-D parameter among the parameters it was given; "
                             "flattened parameters (FSDP1, verl's strategy: fsdp) cannot keep a spectrum. "
                             "Use unflattened parameters (verl: actor.strategy=fsdp2) or pass the model.")
        self.project = bool(project)
        # a wide matrix W [m, n], m < n, is stepped as its tall transpose Wᵀ = V·Σ₀·Uᵀ (frames V,
        # U, gradient Gᵀ): the same algebra, so an n × m matrix joins the m × n ones' stack (the
        # MLP's down projection goes with its up and gate projections: one group fewer, about
        # twenty torch calls fewer per step)
        self._flip = [w.shape[0] < w.shape[1] for w in self._weights]
        shapes: dict = {}
        for i, w in enumerate(self._weights):
            shapes.setdefault((tuple(sorted(w.shape, reverse=True)), w.dtype, w.device), []).append(i)
        self._by_shape = list(shapes.values())        # indices of the managed weights, by shape
        # the frames of one shape live in one stacked tensor (U: [B, m, q], V: [B, n, q], Σ₀:
        # [B, q], m ≥ n: V and U for a flipped matrix); each matrix's frames, the base
        # optimizer's parameters, are views of it, so every product of the step runs batched
        # with no stacking and no copying back
        self._stacks = []
        for idx in self._by_shape:
            rows = [(*self._side_frames(i), self._sigma[i]) for i in idx]   # (U, V, σ); (V, U, σ) flipped
            stack = tuple(torch.stack(xs) for xs in zip(*rows))
            for j, i in enumerate(idx):
                a, b, self._sigma[i] = (x[j] for x in stack)
                self._u[i], self._v[i] = (b, a) if self._flip[i] else (a, b)
            self._stacks.append(stack)
        frames = [x for pair in zip(self._u, self._v) for x in pair]
        self.base = _make_base(base, frames, others, base_kwargs, aux_kwargs)
        # base="adamw": the frames' AdamW runs on the stacks themselves (`_adamw_stacks`)
        self._own_adamw = base == "adamw"
        self._adam_stacks: dict = {}     # (shape group, 0 for U / 1 for V) -> the stacked AdamW state
        groups = list(self.base.param_groups)
        super().__init__(groups, {})
        self._write_weights()

    # ---- the step ---------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure=None):
        """Chain rule → (projection) → base step → polar retraction → W = U·Σ₀·Vᵀ.

        A step whose gradients hold a NaN or an inf anywhere (managed or not) is skipped,
        as torch's AMP GradScaler skips one: nothing changes (weights, frames, the base
        optimizer's moments and step counts), a RuntimeWarning names the first such
        parameter, and `skipped_steps` counts it. Taken, a NaN would reach the float64
        frames and the moments, the polar SVD would fail, and so would every later step."""
        loss = evaluate_closure(closure)
        bad = self._nonfinite_gradient()
        if bad is not None:
            self.skipped_steps += 1
            warnings.warn(f"IsoSpectral skipped this step: the gradient of {bad!r} holds NaN or inf values; "
                          f"weights, frames and optimizer state are unchanged ({self.skipped_steps} step(s) "
                          f"skipped so far: IsoSpectral.skipped_steps).", RuntimeWarning, stacklevel=2)
            return loss
        # matrices of one shape go through each product together (torch.linalg batches)
        live = []                                  # (shape group, positions in it with a gradient)
        stacked_grads = []                         # (shape group, ∂U [B, m, q], ∂V [B, n, q]) of whole groups
        for k, idx in enumerate(self._by_shape):
            pos = [j for j, i in enumerate(idx) if self._weights[i].grad is not None]
            for j, i in enumerate(idx):
                if self._weights[i].grad is None:
                    self._u[i].grad = self._v[i].grad = None
            if not pos:
                continue
            live.append((k, pos))
            u, v, s = self._stack(k, pos)
            g = torch.stack([self._weights[idx[j]].grad.mT if self._flip[idx[j]] else self._weights[idx[j]].grad
                             for j in pos]).to(u.dtype)                                  # [B, m, n]
            gu, gv = _riemannian_frame_gradients(g, u, s, v, self.project)
            if len(pos) == len(idx) and self._own_adamw and self._adamw_stacks(k) is not None:
                stacked_grads.append((k, gu, gv))
                for i in idx:
                    self._u[i].grad = self._v[i].grad = None
                continue
            self._unshare_steps(k)
            for j, gu_j, gv_j in zip(pos, gu, gv):
                a, b = self._side_frames(idx[j])
                a.grad, b.grad = gu_j, gv_j
        # base="adamw" with every frame on its stack: one functional AdamW call per set of
        # hyperparameters steps the frames and the rest, without AdamW.step's per-parameter
        # bookkeeping; else the base optimizer steps what the stacks did not
        others = self._adamw_others() if stacked_grads and len(stacked_grads) == len(live) == len(
            self._by_shape) else None
        if stacked_grads:
            self._adamw_step_stacked(stacked_grads, others or [])
        if others is None:
            self.base.step()
        # one retraction for every frame of the step: U and V of every shape share q × q Gram
        # matrices wherever their q agree (all of them, when every matrix has one short side)
        retracted = _polar_many([x for k, pos in live for x in self._stack(k, pos)[:2]])
        for (k, pos), pu, pv in zip(live, retracted[0::2], retracted[1::2]):
            stack = self._stacks[k]
            if len(pos) == len(self._by_shape[k]):
                stack[0].copy_(pu)
                stack[1].copy_(pv)
            else:
                stack[0][pos], stack[1][pos] = pu, pv
        self._write_weights([k for k, _ in live])
        return loss

    def _stack(self, k, pos=None):
        """(U, V, Σ₀) of shape group k: the stacked tensors themselves, or copies of the rows
        `pos` when only some of the group's matrices have a gradient."""
        stack = self._stacks[k]
        if pos is None or len(pos) == len(self._by_shape[k]):
            return stack
        return tuple(x[pos] for x in stack)

    def _nonfinite_gradient(self) -> str | None:
        """The name of the first parameter whose gradient holds a NaN or an inf, else None;
        one host sync per device and dtype."""
        named = [(n, p.grad) for n, p in zip(self.managed, self._weights) if p.grad is not None]
        named += [(n, p.grad) for n, p in zip(self._other_names, self._others) if p.grad is not None]
        if not named:
            return None
        by_device: dict = {}
        for _, g in named:
            by_device.setdefault((g.device, g.dtype), []).append(g)
        for (device, _), grads in by_device.items():
            # AMP's check (grouped as GradScaler groups it): one call over the gradients, found
            # = 1 where an entry is NaN or inf (it also multiplies each by 1.0 in place, which
            # changes no value)
            found, one = torch.zeros((), device=device), torch.ones((), device=device)
            torch._amp_foreach_non_finite_check_and_unscale_(grads, found, one)
            if bool(found):
                return next(n for n, g in named if not bool(torch.isfinite(g).all()))
        return None

    # ---- the frames' AdamW on the stacks --------------------------------------------------
    def _side_frames(self, i: int):
        """Matrix i's rows of its group's stacks: (U, V), or (V, U) for a flipped matrix."""
        return (self._v[i], self._u[i]) if self._flip[i] else (self._u[i], self._v[i])

    def _frame_views(self, k: int, side: int) -> list:
        return [self._side_frames(i)[side] for i in self._by_shape[k]]

    def _adamw_stacks(self, k: int):
        """The AdamW state of shape group k's frames as stacks: per side (U, V) the frame
        stack, its exp_avg and exp_avg_sq [B, ·, q] whose rows are the very tensors in the
        base optimizer's per-frame state, and one `step` tensor the side's frames share. Built
        from the per-frame state (zeros for a fresh one) when that is not what the state holds
        (first step, a loaded state dict, a step some matrices of the group sat out); None
        where the group's frames have different step counts or the base optimizer's first
        group asks for more than plain AdamW (then each frame goes through the base step)."""
        if not _plain_adamw(self.base.param_groups[0]):
            return None
        held = [self._adam_stacks.get((k, side)) for side in (0, 1)]
        state = self.base.state
        if all(h is not None and all(
                (st := state.get(f)) is not None and st.get("step") is h["step"] and st.get("exp_avg") is a
                and st.get("exp_avg_sq") is b for f, a, b in zip(self._frame_views(k, side), h["views"][0], h["views"][1]))
               for side, h in enumerate(held)):
            return held
        built = []
        for side in (0, 1):
            frames = self._frame_views(k, side)
            sts = [state.get(f, {}) for f in frames]
            steps = {float(st["step"]) if "step" in st else 0.0 for st in sts}
            if len(steps) != 1:
                return None
            moments = [torch.stack([st[key] if key in st else torch.zeros_like(f) for st, f in zip(sts, frames)])
                       for key in ("exp_avg", "exp_avg_sq")]
            step = torch.tensor(steps.pop(), dtype=torch.float32, device=self._stacks[k][side].device
                                if self.base.param_groups[0].get("fused") else None)
            views = [list(m.unbind(0)) for m in moments]
            for f, a, b in zip(frames, *views):
                state[f] = {**state.get(f, {}), "step": step, "exp_avg": a, "exp_avg_sq": b}
            built.append({"param": self._stacks[k][side], "step": step, "moments": moments, "views": views})
            self._adam_stacks[(k, side)] = built[-1]
        return built

    def _unshare_steps(self, k: int) -> None:
        """Before group k's frames go through the base step one by one: each its own `step`
        (a shared one would be counted once per frame)."""
        for side in (0, 1):
            if (k, side) in self._adam_stacks:
                for f in self._frame_views(k, side):
                    st = self.base.state.get(f)
                    if st is not None and isinstance(st.get("step"), torch.Tensor):
                        st["step"] = st["step"].clone()
                del self._adam_stacks[(k, side)]

    def _adamw_others(self):
        """The base AdamW's second group (the unmanaged parameters) as (params with a
        gradient, their exp_avg, exp_avg_sq, step), the state made as torch's AdamW makes it
        on a first step; None where that group asks for more than plain AdamW or holds a
        sparse or complex gradient (then the base optimizer steps it)."""
        groups = self.base.param_groups
        if not self._own_adamw or len(groups) != 2 or not _plain_adamw(groups[1]):
            return None
        params = [p for p in groups[1]["params"] if p.grad is not None]
        if any(p.grad.is_sparse or torch.is_complex(p) for p in params):
            return None
        fused = bool(groups[1].get("fused"))
        cols = ([], [], [], [])
        for p in params:
            st = self.base.state[p]
            if not st:
                st["step"] = torch.tensor(0.0, dtype=torch.float32, device=p.device if fused else None)
                st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            for col, x in zip(cols, (p, st["exp_avg"], st["exp_avg_sq"], st["step"])):
                col.append(x)
        return cols

    def _adamw_step_stacked(self, stacked_grads, others) -> None:
        """torch's AdamW (its functional code: multi-tensor, or its fused kernel where the
        group says fused=True) on the frame stacks with the first group's hyperparameters, and
        on `others` ((params, exp_avg, exp_avg_sq, step) of the second group, or []) with the
        second's: the per-frame update elementwise in a few calls for all the frames, one
        call for both groups when their hyperparameters agree."""
        params, grads, avgs, sqs, steps = [], [], [], [], []
        for k, gu, gv in stacked_grads:
            for h, g in zip(self._adam_stacks_now(k), (gu, gv)):
                params.append(h["param"])
                grads.append(g)
                avgs.append(h["moments"][0])
                sqs.append(h["moments"][1])
                steps.append(h["step"])
        calls = [(self.base.param_groups[0], (params, grads, avgs, sqs, steps))]
        if others and others[0]:
            rest = (others[0], [p.grad for p in others[0]], *others[1:])
            if _adamw_key(self.base.param_groups[1]) == _adamw_key(calls[0][0]):
                calls[0] = (calls[0][0], tuple(a + list(b) for a, b in zip(calls[0][1], rest)))
            else:
                calls.append((self.base.param_groups[1], rest))
        for group, (ps, gs, ms, vs, ts) in calls:
            beta1, beta2 = group["betas"]
            fused = bool(group.get("fused"))
            adam(ps, gs, ms, vs, [], ts, foreach=not fused, fused=fused or None, decoupled_weight_decay=True,
                 amsgrad=False, beta1=beta1, beta2=beta2, lr=group["lr"], weight_decay=group["weight_decay"],
                 eps=group["eps"], maximize=False)

    def _adam_stacks_now(self, k: int):
        return [self._adam_stacks[(k, side)] for side in (0, 1)]

    def zero_grad(self, set_to_none: bool = True):
        self.base.zero_grad(set_to_none=set_to_none)
        for w in self._weights:
            if set_to_none:
                w.grad = None
            elif w.grad is not None:
                w.grad.zero_()

    @torch.no_grad()
    def _write_weights(self, groups=None):
        """W ← U·diag(Σ₀)·Vᵀ for the managed weights of the shape `groups` (default all),
        batched by shape."""
        for k in range(len(self._by_shape)) if groups is None else groups:
            u, v, s = self._stacks[k]
            w = ((u * s.unsqueeze(-2)) @ v.mT).to(self._weights[self._by_shape[k][0]].dtype)
            torch._foreach_copy_([self._weights[i] for i in self._by_shape[k]],
                                 [x.mT if self._flip[i] else x for i, x in zip(self._by_shape[k], w.unbind(0))])

    def frames(self) -> dict:
        """{name: (U float64[m, q], Σ₀ float64[q], V float64[n, q])} of every managed weight."""
        return {n: (u, s, v) for n, u, s, v in zip(self.managed, self._u, self._sigma, self._v)}

    # ---- exact resume -------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The base optimizer's state dict plus `"iso"`: the float64 frames and spectra
        (the module's W is their rounded product, so they are needed for exact resume)."""
        sd = self.base.state_dict()
        # the frames of one stack share one `step` tensor (`_adamw_stacks`): each saved entry
        # gets its own, as torch's AdamW writes them
        sd["state"] = {i: ({**st, "step": st["step"].clone()} if isinstance(st.get("step"), torch.Tensor) else st)
                       for i, st in sd["state"].items()}
        sd["iso"] = {"names": list(self.managed), "u": [u.clone() for u in self._u],
                     "v": [v.clone() for v in self._v], "sigma": [s.clone() for s in self._sigma],
                     "skipped_steps": self.skipped_steps}
        return sd

    @torch.no_grad()
    def load_state_dict(self, state_dict: dict) -> None:
        iso = state_dict.get("iso") if isinstance(state_dict, dict) else None
        if not isinstance(iso, dict) or list(iso.get("names", ())) != self.managed:
            raise InputError("optimizer state has no IsoSpectral frames for the managed weights "
                             f"{self.managed[:3]}...; it was saved by another optimizer or model.")
        for key, own in (("u", self._u), ("v", self._v), ("sigma", self._sigma)):
            got = iso.get(key)
            if not isinstance(got, list) or len(got) != len(own) or any(
                    not isinstance(a, torch.Tensor) or a.shape != b.shape for a, b in zip(got, own)):
                raise InputError(f"optimizer state iso[{key!r}] does not match the managed weights' shapes; "
                                 f"the checkpoint is corrupt or from another model.")
        self.base.load_state_dict({k: v for k, v in state_dict.items() if k != "iso"})
        self.param_groups[:] = list(self.base.param_groups)
        for key, own in (("u", self._u), ("v", self._v), ("sigma", self._sigma)):
            for a, b in zip(iso[key], own):
                b.copy_(a)
        self.skipped_steps = int(iso.get("skipped_steps", 0))
        self._write_weights()


def _plain_adamw(group: dict) -> bool:
    """Whether an AdamW param group asks for nothing but the plain update (foreach or fused)."""
    return not (group.get("amsgrad") or group.get("maximize") or group.get("capturable")
                or group.get("differentiable") or not group.get("decoupled_weight_decay", True))


def _adamw_key(group: dict):
    """What one functional AdamW call takes from a param group."""
    return tuple(group[k] for k in ("lr", "betas", "eps", "weight_decay")) + (bool(group.get("fused")),)


def _make_base(base, frames, others, kw: dict, aux: dict | None) -> torch.optim.Optimizer:
    if callable(base) and not isinstance(base, str):
        opt = base([{"params": frames}, {"params": others}])
        if not isinstance(opt, torch.optim.Optimizer):
            raise InputError(f"base(param_groups) must return a torch.optim.Optimizer; got {type(opt).__name__}.")
        return opt
    # foreach: AdamW's update as one multi-tensor kernel per op instead of a Python loop over
    # the frames and parameters (torch leaves it off on CPU); the same numbers bit for bit
    if base == "adamw":
        return torch.optim.AdamW([{"params": frames}, {"params": others}], **{"foreach": not kw.get("fused"), **kw})
    if base == "muon":
        aux = dict(aux if aux is not None else {k: kw[k] for k in ("lr", "weight_decay") if k in kw})
        aux.setdefault("foreach", True)
        parts = [BatchedMuon(frames, **kw)] if frames else []
        if others:
            parts.append(torch.optim.AdamW(others, **aux))
        return ChainedOptimizer(parts)
    raise InputError(f"base must be 'adamw', 'muon' or a callable returning a torch optimizer; got {base!r}.")
