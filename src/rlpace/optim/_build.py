"""The built-in trainer's optimizers by name (`TrainConfig.optimizer`)."""

from __future__ import annotations

from ..errors import InputError
import torch

from ._chain import ChainedOptimizer
from ._iso import IsoSpectral, default_managed
from ._muon import BatchedMuon

__all__ = ["OPTIMIZERS", "build_optimizer"]

OPTIMIZERS = ("adamw", "iso_adamw", "muon", "iso_muon")


def build_optimizer(name: str, model: torch.nn.Module, *, lr: float, betas=(0.9, 0.99),
                    weight_decay: float = 0.0) -> torch.optim.Optimizer:
    """One of `OPTIMIZERS` over `model`, all with one learning rate `lr`:

    - `adamw`: `torch.optim.AdamW` over every parameter;
    - `iso_adamw`: `IsoSpectral(base="adamw")`: AdamW on the frames of the hidden matrices
      (`default_managed`), AdamW on the rest, both by torch's fused AdamW kernel (`fused=True`:
      one pass per tensor where the multi-tensor code makes ten; the same update, rounded
      differently); frames in float32 (float64 for a float64 model);
    - `muon`: `torch.optim.Muon` on the hidden matrices, as `BatchedMuon` (its update, one Newton–Schulz
      loop per shape; the same numbers but for rare bfloat16 roundings) (`adjust_lr_fn="match_rms_adamw"`,
      Moonshot's scaling, arXiv 2502.16982, so AdamW's `lr` carries over), AdamW on
      embeddings, head, norms and biases;
    - `iso_muon`: `IsoSpectral(base="muon")`: the same Muon on the frames.

    >>> import torch
    >>> type(build_optimizer("muon", torch.nn.Sequential(torch.nn.Linear(2, 2)), lr=1e-3)).__name__
    'ChainedOptimizer'
    """
    if name not in OPTIMIZERS:
        raise InputError(f"optimizer must be one of {', '.join(OPTIMIZERS)}; got {name!r}.")
    adamw = dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay)
    muon = dict(lr=lr, weight_decay=weight_decay, momentum=0.95, adjust_lr_fn="match_rms_adamw")
    if name == "adamw":
        # foreach: one multi-tensor kernel per update op instead of a loop over the parameters;
        # on CPU torch leaves it off by default. The same numbers bit for bit, ~15 % less
        # optimizer time on the tiny policy (fused=True is faster still but not bit-identical).
        return torch.optim.AdamW(model.parameters(), **adamw, foreach=True)
    # ISO frames in float32 unless the model is float64: the spectrum then holds to float32
    # rounding (≤ 2.6e-7 of σ_max measured over 1,000 steps, not growing: each retraction
    # starts afresh), about a float32 W's own rounding and far below bf16's, for half the
    # frame products' time (docs/methods/iso.md, "Cost")
    frames = torch.float64 if any(p.dtype == torch.float64 for p in model.parameters()) else torch.float32
    if name == "iso_adamw":
        return IsoSpectral(model, "adamw", frame_dtype=frames, fused=True, **adamw)
    if name == "iso_muon":
        return IsoSpectral(model, "muon", aux_kwargs=adamw, frame_dtype=frames, **muon)
    rule = default_managed(model)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    mats = [p for n, p in named if rule(n, p)]
    rest = [p for n, p in named if not rule(n, p)]
    # BatchedMuon: torch's Muon bit for bit, one Newton–Schulz loop per shape instead of per matrix
    parts = ([BatchedMuon(mats, **muon)] if mats else []) + ([torch.optim.AdamW(rest, **adamw)] if rest else [])
    return ChainedOptimizer(parts)
