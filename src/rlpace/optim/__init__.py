"""Optimizers for the trainers (needs torch: `pip install torch` + `rlpace[train]`).

- `IsoSpectral`: ISO, the fixed-spectrum optimizer (arXiv 2607.19331; docs/methods/iso.md).
- `ChainedOptimizer`: several torch optimizers as one (Muon + AdamW).
- `BatchedMuon`: `torch.optim.Muon` with one Newton–Schulz loop per shape instead of per matrix.
- `build_optimizer`: the built-in trainer's `optimizer=adamw|iso_adamw|muon|iso_muon`.

`import rlpace` never imports this package, so the core install stays torch-free.
"""

from ._build import OPTIMIZERS, build_optimizer
from ._chain import ChainedOptimizer
from ._muon import BatchedMuon
from ._iso import IsoSpectral, default_managed, frame_gradients, polar, project_tangent

__all__ = ["IsoSpectral", "ChainedOptimizer", "BatchedMuon", "build_optimizer", "OPTIMIZERS", "polar", "project_tangent",
           "frame_gradients", "default_managed"]
