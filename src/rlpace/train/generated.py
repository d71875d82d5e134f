"""`tasks=generated:<family>` in the built-in trainer: fresh items at the sizes the generator draws.

The REINFORCE generator (`rlpace.tasks._generator`, docs/methods/epiplexity.md "Generator")
chooses a size for each prompt of the batch; this module turns those draws into *new* items
of the family and measures the generator's reward on the items it generated before.

    cells   one per size of the family (`cell_pool`): the Scheduler's pool. Feedback speaks in
            cells, so an admission or reweighting policy keeps per-size state (a fresh item is
            seen once; its size is what recurs).
    step t, round r:  keys (c_j, t, r, j), c_j ~ π  →  fresh_items  →  G rollouts each  →  train
    reward  NLL per answer token of the buffer's items (keys of the last `gen_buffer` generated
            items, regenerated exactly), before vs after the step's update

Every draw is a pure function of (seed, step, round) and the checkpointed generator state, so
a resumed run draws the same items as an uninterrupted one.

`tasks=grid:<family>` (criticality_grid) shares the fresh items: the Scheduler proposes the
cells and each proposed cell gets a new item, keys (cell, step, round, j) (`cell_keys`).

The recipe's component is `FreshItems` (built when the task spec starts with `generated:` or
`grid:`). Its points in the loop, in order:

    propose(sched, n, step, round)   the cells of the round's n prompts (round 0 starts the step)
    sample(...)                      G rollouts on a new item of each proposed cell
    before_update()                  generated: the buffer's NLL before the step's update
    after_update(trained)            generated: the generator's REINFORCE step on the NLL drop,
                                     the round's keys into the buffer; the record's gen/* fields
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np
import torch

from ..tasks._generator import (GENERATED_PREFIX, buffer_push, draw_keys, fresh_items, generator_from_json,
                                 generator_init, generator_probs, generator_to_json, generator_update)
from ..tasks._grid import GRID_PREFIX, cell_keys
from ..types import Pool
from .config import TrainConfig
from .rollout import completion_logprobs, encode_prompts
from .sampling import answer_rollout, sample_groups

__all__ = ["FreshSource", "fresh_source", "cell_pool", "draw", "sample_fresh", "buffer_nll", "generator_state",
           "FreshItems"]

_GENERATE = 3                   # the trainer's random stream of the generator's draws


class FreshSource(NamedTuple):
    """What generating an item needs, fixed for the run."""

    names: tuple                 # M cell names, pool domain order ("sort2", ...)
    heldout: frozenset           # held-out prompt texts: a fresh item is never one of them
    fallback: tuple              # M tuples: the task set's training items of each size
    seed: int                    # TrainConfig.seed


def cell_pool(tasks) -> Pool:
    """The Scheduler's pool under `tasks=generated:<family>`: one entry per size that has
    training items (domain = the size's distribution name, difficulty = the size), in the
    sorted order of `tasks.domains`.

    >>> from rlpace.tasks._generator import generated_taskset
    >>> p = cell_pool(generated_taskset("generated:max", train_per_domain=2, heldout_per_domain=1))
    >>> len(p), p.domain_names[:3], p.difficulty[:3].tolist()
    (10, ('max1', 'max10', 'max2'), [1.0, 10.0, 2.0])
    """
    names = tasks.domains
    size = {it.domain: it.difficulty for it in tasks.train}
    return Pool(list(names), difficulty=[size[n] for n in names])


def fresh_source(tasks, pool: Pool, seed: int) -> FreshSource:
    """The run's `FreshSource`: the pool's cells, the held-out prompts, each size's training items."""
    by = {n: [] for n in pool.domain_names}
    for it in tasks.train:
        by[it.domain].append(it)
    return FreshSource(tuple(pool.domain_names), frozenset(it.prompt for it in tasks.heldout),
                       tuple(tuple(by[n]) for n in pool.domain_names), int(seed))


def draw(gen, n: int, cfg: TrainConfig, step: int, round_: int) -> np.ndarray:
    """int64[n, 4] keys (cell, step, round, slot) of this round's n new items, cells ~ π,
    from rng = default_rng([seed, step, round, 3])."""
    return draw_keys(gen, n, np.random.default_rng([cfg.seed, step, round_, _GENERATE]), step=step, round_=round_)


def sample_fresh(model, tok, tasks, src: FreshSource, keys: np.ndarray, g: int, cfg: TrainConfig, torch_gen,
                 token_stats: bool = False):
    """`Groups` of g rollouts on each fresh item of `keys`, scored by the task set's scorers
    (`sample_groups` on the new items); `Groups.ids` are the items' cells (the Scheduler's
    pool positions)."""
    items = fresh_items(src.names, keys, src.seed, exclude=src.heldout, fallback=src.fallback)
    view = dataclasses.replace(tasks, train=tuple(items))           # position j = the j-th fresh item
    tokens = encode_prompts(tok, [it.prompt for it in items], cfg.chat)
    grp = sample_groups(model, tok, view, tokens, np.arange(len(items)), g, cfg, torch_gen, token_stats=token_stats)
    return grp._replace(ids=np.asarray(keys, np.int64)[:, 0].copy())


@torch.no_grad()
def buffer_nll(model, tok, src: FreshSource, gen, cfg: TrainConfig) -> float | None:
    """Mean NLL per answer token (nats) of the generator's buffer of previously generated items
    — regenerated from their keys, teacher-forced reference answers + EOS, one batched forward;
    None while the buffer is empty."""
    n = int(gen.buffer_len)
    if n == 0:
        return None
    items = fresh_items(src.names, gen.buffer[:n], src.seed, exclude=src.heldout, fallback=src.fallback)
    ro = answer_rollout(tok, items, cfg)
    logp = completion_logprobs(model, ro, 1.0)                                       # [n, T]
    mask = ro.completion_mask.float()
    return float(-(logp * mask).sum() / mask.sum())


def generator_state(counters: dict, pool: Pool, cfg: TrainConfig):
    """The generator state a checkpoint's counters hold (ValueError naming the field)."""
    return generator_from_json(counters.get("generator"), pool.n_domains, cfg.gen_buffer)


class FreshItems:
    """Fresh items of proposed cells: `tasks=generated:<family>` (the generator draws the cells)
    or `tasks=grid:<family>` (the Scheduler proposes them). Points in the loop: module docstring.

    Attributes:
        gen: the generator's state (`GeneratorState`; None under grid:), checkpointed as
            counters["generator"].
    """

    def __init__(self, tasks, pool: Pool, cfg: TrainConfig, generated: bool):
        self.pool, self.cfg = pool, cfg
        self.src = fresh_source(tasks, pool, cfg.seed)
        self.gen = generator_init(pool.n_domains, cfg.gen_buffer) if generated else None
        self._keys, self._drawn, self._nll_before = None, [], None

    @classmethod
    def build(cls, tasks, pool: Pool, cfg: TrainConfig) -> FreshItems | None:
        """The component, or None for a fixed task set."""
        spec = cfg.tasks.strip()
        if not spec.startswith((GENERATED_PREFIX, GRID_PREFIX)):
            return None
        return cls(tasks, pool, cfg, spec.startswith(GENERATED_PREFIX))

    def load_counters(self, counters: dict) -> None:
        """Restore the generator from a checkpoint's counters (InputError when corrupt)."""
        if self.gen is not None:
            self.gen = generator_state(counters, self.pool, self.cfg)

    def generator_json(self):
        return None if self.gen is None else generator_to_json(self.gen)

    def propose(self, sched, n: int, step: int, round_: int) -> np.ndarray:
        """int64[n] cells of the round's prompts: drawn from the generator, or proposed by `sched`
        (grid:); their item keys are kept for `sample`. Round 0 starts the step."""
        if round_ == 0:
            self._drawn = []
        if self.gen is not None:
            self._keys = draw(self.gen, n, self.cfg, step, round_)                 # int64[n, 4]
            return self._keys[:, 0]
        ids = sched.propose(n)
        self._keys = cell_keys(ids, step, round_)
        return ids

    def sample(self, model, tok, tasks, g: int, torch_gen, token_stats: bool = False):
        """`Groups` of g rollouts on a new item of each cell `propose` returned (ids = the cells)."""
        grp = sample_fresh(model, tok, tasks, self.src, self._keys, g, self.cfg, torch_gen, token_stats=token_stats)
        self._drawn.append(self._keys)
        return grp

    def before_update(self, model, tok) -> None:
        """generated: the buffer's NLL before the step's update (the reward's "before")."""
        self._nll_before = buffer_nll(model, tok, self.src, self.gen, self.cfg) if self.gen is not None else None

    def after_update(self, model, tok, trained: bool) -> dict:
        """generated: reward = the buffer's NLL drop from this step (prequential epiplexity
        gain) → the generator's step over every drawn prompt's cell; then the step's items
        enter the buffer. Returns the record's gen/* fields ({} under grid:)."""
        if self.gen is None:
            return {}
        rec = {}
        if trained and self._nll_before is not None:
            model.eval()
            nll_after = buffer_nll(model, tok, self.src, self.gen, self.cfg)
            configs = self.pool.domains[np.concatenate([k[:, 0] for k in self._drawn])]    # every drawn prompt
            self.gen = generator_update(self.gen, configs, self._nll_before - nll_after, lr=self.cfg.gen_lr,
                                        entropy_coef=self.cfg.gen_entropy)
            rec.update({"gen/reward": self._nll_before - nll_after, "gen/buffer_nll": nll_after})
        self.gen = buffer_push(self.gen, np.concatenate(self._drawn))             # the real items of this step
        rec.update({f"gen/prob/{d}": float(q) for d, q in zip(self.pool.domain_names, generator_probs(self.gen))})
        return rec
