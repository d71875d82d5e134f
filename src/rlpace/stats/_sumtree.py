"""Sum tree: O(log N) update and O(log N) draw of an index with probability ∝ its weight.

Layout as in Prioritized Experience Replay (Schaul et al. 2015; openai/baselines
`segment_tree.py`; methods-peers-and-engines.md card A15): capacity C is a power of two,
leaf i lives at `tree[C + i]`, and `tree[j] = tree[2j] + tree[2j+1]`, so `tree[1]` is the
total. Updates and draws are vectorised over a batch: B leaves are set (or B draws
walk the tree) together, level by level, so a batch costs O(B log N) numpy work.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class SumTree(NamedTuple):
    tree: np.ndarray  # float64[2C]; leaves at [C, C+N)
    size: np.ndarray  # int64[] number of real leaves N (0-d array, so it checkpoints)


def sumtree_build(weights: np.ndarray) -> SumTree:
    """Build from float64[N] non-negative weights in O(N)."""
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or w.size == 0:
        raise ValueError("sumtree_build needs a non-empty 1-D weight array.")
    if (w < 0).any() or not np.isfinite(w).all():
        raise ValueError("sum-tree weights must be finite and ≥ 0.")
    cap = 1 << int(np.ceil(np.log2(max(w.size, 1))))
    tree = np.zeros(2 * cap)
    tree[cap:cap + w.size] = w
    level = cap
    while level > 1:
        half = level // 2
        tree[half:level] = tree[level:2 * level:2] + tree[level + 1:2 * level:2]
        level = half
    return SumTree(tree, np.array(w.size, dtype=np.int64))


def sumtree_total(st: SumTree) -> float:
    return float(st.tree[1])


def sumtree_set(st: SumTree, index: np.ndarray, weights: np.ndarray) -> SumTree:
    """Set leaves `index` to `weights` (in place) and repair their ancestors. With a
    repeated index the last weight wins, as in a sequential loop."""
    index = np.asarray(index, dtype=np.int64).ravel()
    weights = np.asarray(weights, dtype=np.float64).ravel()
    if index.size == 0:
        return st
    if (weights < 0).any() or not np.isfinite(weights).all():
        raise ValueError("sum-tree weights must be finite and ≥ 0.")
    cap = st.tree.shape[0] // 2
    st.tree[cap + index] = weights                   # fancy assignment: last one wins
    # All leaves sit at one depth, so their ancestors move up level by level together.
    # Repeated nodes are harmless (each copy writes the same sum), so no np.unique per
    # level: that sort was most of the cost.
    nodes = np.unique((cap + index) >> 1)
    for _ in range(int(np.log2(cap))):
        st.tree[nodes] = st.tree[2 * nodes] + st.tree[2 * nodes + 1]
        nodes >>= 1
    return st


def sumtree_sample(st: SumTree, u: np.ndarray) -> np.ndarray:
    """Leaf index for each uniform u in [0, 1): the i with prefix(i) ≤ u·total < prefix(i+1).
    Draw `u = rng.random(B)` for B independent draws ∝ weight."""
    total = st.tree[1]
    if not total > 0:
        raise ValueError("cannot sample from a sum tree whose weights are all zero.")
    cap = st.tree.shape[0] // 2
    mass = np.asarray(u, dtype=np.float64) * total
    idx = np.ones(mass.shape, dtype=np.int64)
    for _ in range(int(np.log2(cap))):
        left = st.tree[2 * idx]
        # Never step into an empty subtree: float round-off in the partial sums could
        # otherwise send a draw to a zero-weight leaf.
        go_right = ((mass >= left) & (st.tree[2 * idx + 1] > 0)) | (left <= 0)
        mass = np.where(go_right, mass - left, mass)
        idx = 2 * idx + go_right
    return idx - cap
