"""Data-free merging of RL specialists of one base (needs torch, safetensors, tqdm:
`rlpace[train]`): ISO-Merger (arXiv 2607.19331; docs/methods/iso.md), with task arithmetic
and TIES as baselines. The CLI is `rlpace merge`."""

from ._checkpoint import METHODS, merge_checkpoints, read_layout
from ._methods import iso_merge_matrix, task_arithmetic, task_vector_mean, ties

__all__ = ["merge_checkpoints", "METHODS", "read_layout", "iso_merge_matrix", "task_vector_mean",
           "task_arithmetic", "ties"]
