"""`BatchedMuon`: `torch.optim.Muon`'s update, run once per shape instead of once per matrix.

torch's Muon orthogonalises each matrix's momentum with its own Newton–Schulz loop (five
iterations of three bfloat16 products, about twenty torch calls per matrix). On a small
model those calls, not their flops, are the step: a model's hidden matrices come in a few
shapes, so here every matrix of one (shape, dtype, device) goes through one loop on a
[B, m, n] stack (`baddbmm` in place of `addmm`). The numbers are torch's (the same bfloat16
products, per-matrix Frobenius norms, the same elementwise momentum and update; tested
against `torch.optim.Muon`): bit for bit except that bfloat16 `baddbmm` and `addmm` round a
few entries of β·C + A·B differently (measured: one product in ~300 on 6 × 10 matrices, one
bfloat16 rounding of those entries). The state is torch's too: one `momentum_buffer` per
parameter, which here is a view of the shape's stacked buffer, kept across steps.
"""

from __future__ import annotations

import torch

__all__ = ["BatchedMuon", "newton_schulz_batched"]


def newton_schulz_batched(g: torch.Tensor, coefficients, steps: int, eps: float) -> torch.Tensor:
    """torch's `_zeropower_via_newtonschulz` over a stack g [B, m, n] at once, in bfloat16:
    X = g / ‖g‖_F (each matrix its own norm, the wide orientation), then `steps` times
    A = X·Xᵀ, B = b·A + c·A·A, X = a·X + B·X."""
    a, b, c = coefficients
    x = g.bfloat16()
    tall = g.size(-2) > g.size(-1)
    if tall:
        x = x.mT
    x = x / torch.linalg.vector_norm(x, dim=(-2, -1), keepdim=True).clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.mT
        x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.mT if tall else x


class BatchedMuon(torch.optim.Muon):
    """`torch.optim.Muon` (same arguments, same state, its numbers to a bfloat16 rounding) whose step batches the
    matrices of one shape. The built-in trainer's `muon` and ISO's `base="muon"` use it.

    >>> import torch
    >>> w = [torch.nn.Parameter(torch.randn(3, 2)) for _ in range(2)]
    >>> opt = BatchedMuon(w, lr=0.1)
    >>> for p in w: p.grad = torch.ones(3, 2)
    >>> opt.step(); [tuple(opt.state[p]["momentum_buffer"].shape) for p in w]
    [(3, 2), (3, 2)]
    """

    def __init__(self, params, **kwargs):
        super().__init__(params, **kwargs)
        self._buffers_by_shape: dict = {}     # (group, shape key) -> (params, stacked buffer [B, m, n])

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for gi, group in enumerate(self.param_groups):
            lr = group["lr"]
            lr = float(lr) if isinstance(lr, torch.Tensor) else lr
            by_shape: dict = {}
            for p in group["params"]:
                if p.grad is None:
                    continue
                if torch.is_complex(p):
                    raise RuntimeError("Muon does not support complex parameters")
                if p.grad.is_sparse:
                    raise RuntimeError("Muon does not support sparse gradients")
                by_shape.setdefault((tuple(p.shape), p.dtype, p.device, p.grad.dtype), []).append(p)
            for key, params in by_shape.items():
                bufs = self._stacked_buffer(gi, key, params)
                grads = torch.stack([p.grad for p in params])                  # [B, m, n]
                bufs.lerp_(grads, 1 - group["momentum"])
                update = grads.lerp(bufs, group["momentum"]) if group["nesterov"] else bufs
                update = newton_schulz_batched(update, group["ns_coefficients"], group["ns_steps"], group["eps"])
                decay = 1 - lr * group["weight_decay"]
                if decay != 1:                   # torch multiplies by 1.0 too: exact, so skipped
                    torch._foreach_mul_(params, decay)
                adjusted = torch.optim._muon._adjust_lr(lr, group["adjust_lr_fn"], params[0].shape)
                torch._foreach_add_(params, list(update.unbind(0)), alpha=-adjusted)
        return loss

    def _stacked_buffer(self, gi: int, key, params) -> torch.Tensor:
        """The momentum buffers of `params` as one [B, m, n] tensor whose rows are the very
        tensors in `self.state` (rebuilt, values kept, when the set of parameters with a
        gradient changes or a state dict was loaded)."""
        held = self._buffers_by_shape.get((gi, key))
        if held is not None and len(held[0]) == len(params) and all(
                a is p and self.state[p].get("momentum_buffer") is b for a, p, b in zip(held[0], params, held[2])):
            return held[1]
        stacked = torch.stack([self.state[p]["momentum_buffer"] if "momentum_buffer" in self.state[p]
                               else torch.zeros_like(p.grad, memory_format=torch.contiguous_format)
                               for p in params])
        views = list(stacked.unbind(0))
        for p, b in zip(params, views):
            self.state[p]["momentum_buffer"] = b
        self._buffers_by_shape[(gi, key)] = (tuple(params), stacked, views)
        return stacked
