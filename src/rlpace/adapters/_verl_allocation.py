"""Rollout allocation on verl: prompt i gets N_i rollouts as N_i rows (legacy trainer) or N_i
sessions (V1 trainer) that share its uid, so verl's group estimators (GRPO, RLOO, ...) group
them as one prompt, whatever N_i.

Legacy trainer (`RayPPOTrainer.fit`, verl 0.9.1): fit gives each dataloader row a uid, calls
`_get_gen_batch(batch)`, then repeats the generation batch and, after generation, the prompt
batch with `repeat(rollout.n, interleave=True)`. Knapsack RL's verl fork (liziniu/KnapsackRL,
`ray_trainer.py::budget_allocation`) assigns the uid first and then duplicates each prompt's
row N_i times, copying the uid; `repeat_by_counts` does the same at verl's own repeat: the two
batches that `_get_gen_batch` sees repeat row i N_i times instead of `rollout.n` times.
`actor_rollout_ref.rollout.n` keeps its value G: it is the unit of the budget (W = B·G rows by
default, the row count every verl setting derived from rollout.n expects: mini-batches of
`ppo_mini_batch_size`·G rows, data-parallel chunks), and each row is sampled once (verl's agent
loop samples one response per row). Prompts with N_i = 0 leave the batch.

V1 trainer (`_submit_batch_to_rollout`): verl's agent loop reads a per-prompt session count
from the prompt's `__rollout_n__` field (`AgentLoopWorkerTQ._run_prompt`: "user can
dynamically adjust n for each sample here"); rlpace writes N_i there.

Advantages: verl computes its own over the rows of each uid (GRPO: unbiased std, eps 1e-6);
a prompt with one rollout has no group baseline, and verl's GRPO then gives A = r (mean 0,
std 1). rlpace gives it A = 0 (`rlpace.group_advantages`: no relative signal), and the
adapters zero those rows for the estimators in `GROUP_ESTIMATORS`.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..errors import InputError
from ..policies import is_neutral
from ..types import Feedback, Pool, group_advantages
from ._convert import Rows, group_rows
from ._supervision import SIGNALS

__all__ = ["Allocation", "allocates", "step_budget", "allocate_prompts", "repeat_by_counts",
           "ragged_feedback", "zero_singleton_advantages", "check_legacy_allocation", "GROUP_ESTIMATORS"]

# verl estimators whose baseline is the mean of the prompt's group (rows sharing a uid): a
# singleton group has none (verl's GRPO falls back to mean 0, std 1, so A = r).
GROUP_ESTIMATORS = frozenset({"grpo", "grpo_vectorized", "grpo_passk", "rloo", "rloo_vectorized", "opo"})


class Allocation(NamedTuple):
    """One submitted batch's allocation."""

    uids: np.ndarray        # object[B] verl's uid of each prompt
    prompt_ids: np.ndarray  # object[B] stable prompt id (extra_info.index)
    positions: np.ndarray   # int64[B] pool positions
    counts: np.ndarray      # int64[B] N_i rollouts of each prompt


def allocates(sched) -> bool:
    """True when the Scheduler's method has an allocation place that is not uniform."""
    alloc = getattr(sched.method, "allocation", None)
    return alloc is not None and not is_neutral(alloc)


def step_budget(budget: int | None, prompts: int, n: int, batch_prompts: int) -> int:
    """Rollouts for `prompts` prompts: `prompts`·n (verl's uniform count) without a budget; with
    `data.rlpace.budget` = W per batch of `batch_prompts` prompts, W·prompts/batch_prompts (an
    InputError when that is not a whole number: a V1 refill of one prompt then needs W/B whole)."""
    if budget is None:
        return prompts * n
    if (budget * prompts) % batch_prompts:
        raise InputError(f"data.rlpace.budget={budget} rollouts per {batch_prompts} prompts does not split into "
                         f"whole rollouts for {prompts} prompts; give a multiple of data.train_batch_size "
                         f"({batch_prompts}).")
    return budget * prompts // batch_prompts


def allocate_prompts(sched, uids, prompt_ids, budget: int) -> Allocation:
    """`Scheduler.allocate` of the prompts `prompt_ids` (stable ids) with `budget` rollouts."""
    ids = np.asarray(prompt_ids, dtype=object)
    positions = sched.pool.index_of(list(ids))
    counts = sched.allocate(positions, int(budget))
    return Allocation(np.asarray(uids, dtype=object), ids, np.asarray(positions, np.int64), counts)


def repeat_by_counts(proto, counts: np.ndarray, n: int) -> None:
    """Make `proto.repeat(repeat_times=n, interleave=True)` — the call verl's legacy `fit` makes on
    the generation batch and on the prompt batch — return row i `counts[i]` times, in row order
    (rows of a prompt adjacent, as interleave gives them). Only that one call on this object
    changes; any other repeat is a verl this adapter was not checked against (RuntimeError)."""
    idx = np.repeat(np.arange(len(proto), dtype=np.int64), np.asarray(counts, dtype=np.int64))

    def repeat(repeat_times=2, interleave=True):
        if repeat_times != n or not interleave:
            raise RuntimeError(f"rlpace's allocation expected verl to repeat this batch by rollout.n={n} "
                               f"(interleaved); it asked for repeat_times={repeat_times}, interleave={interleave}: "
                               f"this verl's fit differs from the 0.9 release rlpace was checked against.")
        del proto.repeat                       # one use: the next repeat is verl's own again
        return proto.select_idxs(idx)

    proto.repeat = repeat                      # an instance attribute shadows DataProto.repeat


def ragged_feedback(pool: Pool, rows: Rows, alloc: Allocation, *, step: int) -> tuple[Feedback, np.ndarray]:
    """One ragged Feedback for an allocated batch: row b is prompt b of `alloc` (N_b = 0
    included), its rollouts the engine rows of its uid (in generation order when `rows.order` gives
    it, else in the engine's row order, as `feedbacks_from_rows`), `group_sizes` the
    rows found (= N_b when every rollout came back). Returns (feedback, row_index int64[B, max N])
    with -1 on padding. Advantages: `group_advantages(rewards, group_sizes=N)` (population std,
    one scale for every policy, as on every rlpace path)."""
    keys = np.asarray(rows.group_keys, dtype=object)
    if rows.order is None:
        groups = group_rows(keys, rows.prompt_ids)
    else:
        perm = np.argsort(np.asarray(rows.order), kind="stable")
        groups = [perm[g] for g in group_rows(keys[perm], np.asarray(rows.prompt_ids, dtype=object)[perm])]
    by_uid = {str(keys[g[0]]): g for g in groups}
    unknown = sorted(set(by_uid) - {str(u) for u in alloc.uids})
    if unknown:
        raise InputError(f"the verl batch holds rows of uids {unknown[:3]} that rlpace's allocation did not submit; "
                         f"allocation needs the rows of one submitted batch.")
    members = [by_uid.get(str(u), np.zeros(0, np.int64)) for u in alloc.uids]
    sizes = np.array([m.size for m in members], dtype=np.int64)
    g = max(1, int(sizes.max(initial=0)))
    index = np.full((len(members), g), -1, dtype=np.int64)
    for b, m in enumerate(members):
        index[b, :m.size] = m
    pad = index < 0
    take = np.where(pad, 0, index)
    rewards = np.where(pad, 0.0, np.asarray(rows.rewards, dtype=np.float64)[take])
    signals = {}
    for k in SIGNALS:
        v = getattr(rows, k)
        if v is None:
            continue
        v = np.asarray(v)[take]
        if k == "answers":
            v = np.where(pad, None, v).tolist()
        else:
            v = np.where(pad, 0.0, v.astype(np.float64))
        signals[k] = v
    fb = Feedback(alloc.positions, rewards, group_advantages(rewards, group_sizes=sizes), step=step,
                  group_sizes=sizes, **signals)
    return fb, index


def zero_singleton_advantages(batch, fbs: list, estimator) -> int:
    """Set the advantages of prompts allocated one rollout to 0 in a verl `DataProto` (after
    `compute_advantage`), for the estimators in `GROUP_ESTIMATORS`. `fbs`: the
    [(Feedback, rows)] `VerlFeedback.step` returned. Returns the number of rows zeroed."""
    name = getattr(estimator, "value", estimator)
    if str(name) not in GROUP_ESTIMATORS or "advantages" not in batch.batch.keys():
        return 0
    single = [rows[fb.group_sizes == 1, 0] for fb, rows in fbs if fb.group_sizes is not None]
    single = np.concatenate(single) if single else np.zeros(0, np.int64)
    if single.size:
        import torch
        adv = batch.batch["advantages"]
        mask = torch.zeros(adv.shape[0], dtype=torch.bool, device=adv.device)
        mask[torch.as_tensor(single, device=adv.device)] = True
        batch.batch["advantages"] = torch.where(mask.unsqueeze(-1), torch.zeros_like(adv), adv)
    return int(single.size)


def check_legacy_allocation(bridge, config) -> None:
    """InputError, before the first step, for an allocation budget verl's legacy trainer cannot
    train on: W rows per step must fill whole PPO mini-batches of `ppo_mini_batch_size`·rollout.n
    rows (verl's `_update_actor`), which also splits them evenly over the data-parallel ranks
    (verl's own config check makes the mini-batch a multiple of the ranks). The default W = B·n is
    the row count of a run without allocation, so it always fits."""
    if not allocates(bridge.scheduler) or bridge.budget is None:
        return
    n = int(config.actor_rollout_ref.rollout.n)
    mini = int(config.actor_rollout_ref.actor.ppo_mini_batch_size) * n
    b = int(config.data.train_batch_size)
    if bridge.budget % mini:
        raise InputError(f"data.rlpace.budget={bridge.budget} rows per step does not fill whole PPO mini-batches of "
                         f"actor_rollout_ref.actor.ppo_mini_batch_size·rollout.n = {mini} rows; give a multiple of "
                         f"{mini} (e.g. {max(mini, bridge.budget - bridge.budget % mini)}), or leave it unset "
                         f"(B·n = {b * n}).")
