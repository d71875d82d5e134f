"""Criticality-guided IS over a parameter grid: the proposal of `criticality_is` run over the
cells of a procedural generator instead of over single prompts.

The robot code of criticality-guided IS (`helx-20/go2_mujoco`, `helx-20/multitask_maniskill`)
samples disturbance parameters from a grid: a criticality model over the parameters scores
every cell, a proposal oversamples the critical cells, and episodes are drawn inside them with
weights p/q. In rlpace a cell is a pool domain — one distribution of a procedural family
(`tasks=grid:<family>`: one cell per size; `ladder`: rev2 … rev8; `mostly_solved`: 13
(family, size) cells) — with the cell's parameters as features:

    x_k = [1, z(mean features of cell k's prompts), z(mean difficulty of cell k), onehot(k)]
    π̂_k = σ(θ·x_k)                                  predicted pass rate of cell k (rlpace.predict)
    c_k = 4·π̂_k(1 − π̂_k)  or  1 − π̂_k                 (target)
    q   = (1 − ε)·softmax(α·(c − max c)) + ε·p          if max c > threshold, else q = p
    q'  = q with the fallback: cells with p/q < τ give their mass to p
    draw: cell k ~ q' for each slot, then a prompt of cell k uniformly (`uniform_within_arm`)
    w   = p_k / q'_k (unbiased=True), else the card's floor, mean-1 and clamp

with p = 1/K, uniform over the grid (the uniform pool when every cell holds as many prompts,
as in the embedded suites). The features are the pool's own (`Pool.features`: the built-in
trainer gives [family one-hot, size, log prompt length], `rlpace.tasks.prompt_features`),
averaged per cell, so the predictor can carry what one size taught to the next. The predictor
learns from every observed group at its cell, weighted by the exact p/q', and is refit every
`stage_steps` updates; the proposal changes only then (the self-evolving loop). All of this is
`criticality_is`'s code (`_criticality._core`) run on the pool of cells: the same q, the same
weights, the same staging, the same state record.

Fresh items: the robot code draws a fresh episode at each chosen cell. The built-in trainer
does the same under `tasks=grid:<family>` (its pool is the grid, one entry per size, and each
proposed cell is rolled out on a new item of that size: `rlpace.tasks._grid`). Over a pool of
stored prompts (`ladder`, `mostly_solved`, any `Scheduler`) a prompt is drawn uniformly inside
the chosen cell, with replacement.
"""

from __future__ import annotations

import numpy as np

from ..types import Pool
from ._base import MIXTURE, REWEIGHTING, DataPolicy
from ._compose import compose
from ._criticality import _DEFAULTS, _checked, _core, _q_of, proposal_metrics, weight_metrics

__all__ = ["criticality_grid", "grid_proposal", "grid_weights", "cell_pool"]

_OWNER = "criticality_grid"
_CHUNK = 1 << 16


def cell_pool(pool: Pool) -> Pool:
    """The pool of K cells (one per domain of `pool`, in domain-code order): difficulty = the
    mean known difficulty of the cell's prompts (NaN if none), features = the mean feature row
    of the cell's prompts (None when `pool` has none). Cached on `pool`.

    >>> cells = cell_pool(Pool(["a", "b", "a"], difficulty=[1.0, 4.0, 3.0], features=[[0.0], [1.0], [2.0]]))
    >>> cells.domain_names, cells.difficulty.tolist(), cells.features.tolist()
    (('a', 'b'), [2.0, 4.0], [[1.0], [1.0]])
    """
    key = "grid/cells"
    if key not in pool._cache:
        k = pool.n_domains
        dom = pool.domains
        d = pool.difficulty
        known = np.isfinite(d)
        num = np.bincount(dom[known], weights=d[known], minlength=k)
        den = np.bincount(dom[known], minlength=k)
        diff = np.where(den > 0, num / np.maximum(den, 1), np.nan)
        feats = None
        if pool.features is not None:
            f = pool.features
            sums = np.zeros((k, f.shape[1]))
            for start in range(0, f.shape[0], _CHUNK):     # memory-mapped features: in chunks
                np.add.at(sums, dom[start:start + _CHUNK], np.asarray(f[start:start + _CHUNK], np.float64))
            feats = sums / np.bincount(dom, minlength=k)[:, None]
        cells = Pool(list(pool.domain_names), difficulty=diff, features=feats)
        if cells.domain_names != tuple(pool.domain_names):
            raise RuntimeError("criticality_grid: the cell pool's domain order differs from the pool's; "
                               "a bug in cell_pool.")
        pool._cache[key] = cells
    return pool._cache[key]


def _parts(kw: dict):
    hp = _checked(**{**_DEFAULTS, **kw}, owner=_OWNER)
    return hp, _core(**hp, with_cdf=False, owner=_OWNER)


def _on_cells(batch):
    """The batch as the cell predictor reads it: each group at its cell (domain code)."""
    return batch._replace(prompt_ids=batch.domains)


def grid_proposal(**kw) -> DataPolicy:
    """Mixture over the pool's domains (the grid's cells): q' of the current stage (module
    docstring); keyword arguments as `criticality_grid`."""
    hp, (init, update, _, crit, _, check_state) = _parts(kw)

    def apply(state, pool):
        cells = cell_pool(pool)
        _, q_eff, _ = _q_of(crit(state.predictor.stage_theta, cells), state.norm, len(cells),
                            hp["alpha"], hp["epsilon"], hp["weight_threshold"])
        return q_eff

    return DataPolicy(MIXTURE, lambda pool: init(cell_pool(pool)),
                      lambda state, pool, batch: update(state, cell_pool(pool), _on_cells(batch)),
                      apply, arms="domain", name="grid_proposal", metrics=proposal_metrics,
                      check_state=lambda state, pool: check_state(state, cell_pool(pool)))


def grid_weights(**kw) -> DataPolicy:
    """Reweighting: w = p/q' of the cell of each group under the stage that drew it, shaped
    unless `unbiased`; keyword arguments as `criticality_grid`."""
    hp, (init, update, weights, _, _, check_state) = _parts(kw)

    def apply(state, pool, batch):
        _, w = weights(state, cell_pool(pool), batch.domains, batch.step)
        return np.broadcast_to(w[:, None], batch.rewards.shape).astype(np.float64)

    return DataPolicy(REWEIGHTING, lambda pool: init(cell_pool(pool)),
                      lambda state, pool, batch: update(state, cell_pool(pool), _on_cells(batch)),
                      apply, name="grid_weights", metrics=weight_metrics,
                      check_state=lambda state, pool: check_state(state, cell_pool(pool)))


def criticality_grid(alpha: float = 3.0, epsilon: float = 0.1, threshold: float = 0.0,
                     weight_threshold: float = 0.01, weight_floor: float = 0.1, weight_clamp: float = 10.0,
                     normalize: bool = True, unbiased: bool = False, target: str = "learnability",
                     lr: float = 0.1, l2: float = 1e-3, stage_steps: int = 20, buffer: int = 8192,
                     newton_steps: int = 5):
    """Criticality-guided IS over a parameter grid: q over the pool's domains (cells) from a staged predictor over the cells' parameters, prompts drawn inside the chosen cells, losses weighted by p/q.

    The rule of `criticality_is` (same arguments, same q, floor, mean-1, clamp, fallback and
    `unbiased=True`) with a cell as the unit: a predictor over cell features (the mean
    `Pool.features` and difficulty of the cell's prompts, plus a cell one-hot) predicts each
    cell's pass rate π̂_k; c_k = 4π̂_k(1 − π̂_k) (or 1 − π̂_k with `target="failure"`);
    q = (1 − ε)·softmax(α(c − max c)) + ε/K; each slot draws a cell from q' and a prompt
    uniformly inside it; w = (1/K)/q'_k. `metrics()` reports the weights' effective sample
    size (`criticality/ess`). Built-in trainer: `rlpace train tasks=grid:sort
    policy=criticality_grid`, or on any suite whose distributions are a family's sizes
    (`ladder`, `mostly_solved`). See the module docstring and docs/methods/criticality_grid.md.

    Example (hand-computed): 3 cells with predicted pass rates [0.5, 0.8, 0.2] give
    c = [1, 0.64, 0.64]; α = 3, ε = 0.1: q = 0.9·[1, e^−1.08, e^−1.08]/(1 + 2e^−1.08) + 0.1/3
    = [0.569, 0.215, 0.215], and unbiased weights (1/3)/q = [0.586, 1.548, 1.548].
    """
    kw = dict(alpha=alpha, epsilon=epsilon, threshold=threshold, weight_threshold=weight_threshold,
              weight_floor=weight_floor, weight_clamp=weight_clamp, normalize=normalize, unbiased=unbiased,
              target=target, lr=lr, l2=l2, stage_steps=stage_steps, buffer=buffer, newton_steps=newton_steps)
    return compose(grid_proposal(**kw), grid_weights(**kw), name="criticality_grid")
