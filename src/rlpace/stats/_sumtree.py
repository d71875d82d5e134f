"""Sum tree: O(log N) update and O(log N) draw of an index with probability ∝ its weight.

Layout as in Prioritized Experience Replay (Schaul et al. 2015; openai/baselines
`segment_tree.py`; docs/methods/prioritized_learnability.md): capacity C is a power of two,
leaf i lives at `tree[C + i]`, and `tree[j] = tree[2j] + tree[2j+1]`, so `tree[1]` is the
total. Updates and draws are vectorised over a batch: B leaves are set (or B draws
walk the tree) together, level by level, so a batch costs O(B log N) numpy work.
"""

from __future__ import annotations

from ..errors import InputError
from typing import NamedTuple

import numpy as np


class SumTree(NamedTuple):
    tree: np.ndarray  # float64[2C]; leaves at [C, C+N)
    size: np.ndarray  # int64[] number of real leaves N (0-d array, so it checkpoints)


def sumtree_build(weights: np.ndarray) -> SumTree:
    """Build from float64[N] non-negative weights in O(N)."""
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or w.size == 0:
        raise InputError("sumtree_build needs a non-empty 1-D weight array.")
    if (w < 0).any() or not np.isfinite(w).all():
        raise InputError("sum-tree weights must be finite and ≥ 0.")
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
        raise InputError("sum-tree weights must be finite and ≥ 0.")
    tree = st.tree
    cap = tree.shape[0] // 2
    tree[cap + index] = weights                      # fancy assignment: last one wins
    # entry j = tree[2j] + i·tree[2j+1]: one 1-D gather reads both children of node j
    children = _children(tree).view(np.complex128).reshape(-1)
    # All leaves sit at one depth, so their ancestors move up level by level together.
    # Repeated nodes are harmless (each copy writes the same sum), so nodes are made
    # unique once, at the bottom level.
    nodes = _unique((cap + index) >> 1)
    level = cap >> 1                                 # the first node of the nodes' level
    while level > _DENSE_TOP and level > nodes.size:
        pair = children.take(nodes)
        tree[nodes] = pair.real + pair.imag
        nodes >>= 1
        level >>= 1
    # The levels above hold no more nodes than the batch: each is recomputed whole, one add per
    # level (sumtree_build's sums: a node whose children did not change gets the value it had).
    while level >= 1:
        np.add(tree[2 * level:4 * level:2], tree[2 * level + 1:4 * level:2], out=tree[level:2 * level])
        level >>= 1
    return st


#: `sumtree_set` recomputes whole the levels of at most this many nodes (or at most as many as
#: the leaves it sets), where one dense add costs less than a gather, an add and a scatter
_DENSE_TOP = 1024


def sumtree_sample(st: SumTree, u: np.ndarray) -> np.ndarray:
    """Leaf index for each uniform u in [0, 1): the i with prefix(i) ≤ u·total < prefix(i+1).
    Draw `u = rng.random(B)` for B independent draws ∝ weight."""
    tree = st.tree
    total = tree[1]
    if not total > 0:
        raise InputError("cannot sample from a sum tree whose weights are all zero.")
    cap = tree.shape[0] // 2
    # complex128[C] view: entry j is (tree[2j], tree[2j+1]), node j's two children, so one
    # gather reads both (one cache line at the deep levels, where every read misses)
    children = _children(tree).view(np.complex128).reshape(-1)
    mass = np.asarray(u, dtype=np.float64) * total
    idx = np.ones(mass.shape, dtype=np.int64)
    for _ in range(int(np.log2(cap))):
        pair = children.take(idx)
        left = pair.real
        # Never step into an empty subtree: float round-off in the partial sums could
        # otherwise send a draw to a zero-weight leaf. "right > 0 and mass ≥ left" is enough:
        # mass stays ≥ 0, so an empty left child (left = 0 ≤ mass) is never entered, and a
        # node the walk enters has a positive sum (the root; then a positive child each
        # level), so its two children are never both empty.
        go_right = pair.imag > 0
        go_right &= mass >= left
        np.subtract(mass, left, out=mass, where=go_right)      # mass − left where it goes right
        idx += idx                                             # the left child, 2j ...
        idx += go_right                                        # ... or the right one, 2j + 1
    return idx - cap


def _children(tree: np.ndarray) -> np.ndarray:
    """float64[C, 2] view of the tree: row j holds node j's children (tree[2j], tree[2j+1])."""
    if not tree.flags.c_contiguous:
        raise InputError("the sum tree's array must be C-contiguous (np.ascontiguousarray).")
    return tree.reshape(-1, 2)


def _unique(x: np.ndarray) -> np.ndarray:
    """Sorted unique values of a 1-D int array (= np.unique, without its overhead)."""
    x = np.sort(x)
    keep = np.empty(x.shape, dtype=bool)
    keep[:1] = True
    np.not_equal(x[1:], x[:-1], out=keep[1:])
    return x[keep]
