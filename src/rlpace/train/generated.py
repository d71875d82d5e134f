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
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np
import torch

from ..tasks._generator import draw_keys, fresh_items, generator_from_json
from ..types import Pool
from .config import TrainConfig
from .rollout import completion_logprobs, encode_prompts
from .sampling import answer_rollout, sample_groups

__all__ = ["FreshSource", "fresh_source", "cell_pool", "draw", "sample_fresh", "buffer_nll", "generator_state"]

_GENERATE = 3                   # the trainer's random stream of the generator's draws (issue 15)


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
