"""Vectorised statistics that policies keep in their state: per-arm rolling windows and a
sum tree for O(log N) weighted sampling. Pure numpy; each has a reference loop in tests."""

from ._sumtree import SumTree, sumtree_build, sumtree_sample, sumtree_set, sumtree_total
from ._window import window_init, window_mean, window_push

__all__ = ["window_init", "window_push", "window_mean",
           "SumTree", "sumtree_build", "sumtree_set", "sumtree_sample", "sumtree_total"]
