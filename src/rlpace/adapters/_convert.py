"""Engine rows → `Feedback`, and per-rollout weights back onto rows. Pure numpy.

Engines hand over one row per rollout, in an order of their own (verl's batch balancing
reorders rows across data-parallel ranks; TRL gathers ranks process-major). Each row
carries a *group key* (verl's `uid`: a fresh uuid per prompt per step) and a *stable
prompt id* (verl's `extra_info["index"]`, a TRL dataset column). Grouping rows by the
group key gives the `[B, G]` layout a `Feedback` needs; the stable id maps each group to
its pool position. `rows[b, g]` remembers which engine row each rollout came from, so that
per-rollout loss weights can be written back in the engine's order.

Nothing here imports an engine: `dataproto_rows` reads a verl `DataProto` by attribute
only, so this module is tested without verl.
"""

from __future__ import annotations

from ..errors import InputError
from typing import Any, NamedTuple, Sequence

import numpy as np

from ..types import Feedback, Pool, group_advantages, kept_group_advantages
from ._supervision import SIGNALS as _SIGNALS   # the per-rollout signals a Feedback carries

__all__ = ["Rows", "group_rows", "feedbacks_from_rows", "dataproto_rows", "scatter_to_rows", "eval_summary"]


class Rows(NamedTuple):
    """One step's rollouts as flat engine rows (R rows)."""

    group_keys: np.ndarray          # object[R] rollouts of one prompt share a key (verl uid)
    prompt_ids: np.ndarray          # object[R] or int64[R] stable prompt id (extra_info.index)
    rewards: np.ndarray             # float64[R] score (or `acc`) of each rollout
    answers: np.ndarray | None = None          # object[R] extracted answer (str or None)
    token_entropy: np.ndarray | None = None    # float64[R] mean token entropy of each rollout
    self_certainty: np.ndarray | None = None   # float64[R] mean self-certainty of each rollout
    mean_logprob: np.ndarray | None = None     # float64[R] mean sampled-token log-prob of each rollout
    order: np.ndarray | None = None            # int64[R] generation order (rows of a group are taken in it)


def group_rows(group_keys: Sequence, prompt_ids: Sequence) -> list[np.ndarray]:
    """Rows of each group, groups in order of first appearance, rows in engine order.

    Returns a list of int64 arrays, one per group. A group whose rows disagree on the
    stable prompt id is an error (it would mean `uid` no longer identifies a prompt).

    >>> [g.tolist() for g in group_rows(["b", "a", "b", "a"], [7, 3, 7, 3])]
    [[0, 2], [1, 3]]
    """
    keys = np.asarray(group_keys, dtype=object).astype(str)
    ids = np.asarray(prompt_ids, dtype=object)
    if keys.shape != ids.shape or keys.ndim != 1:
        raise InputError(f"group keys {keys.shape} and prompt ids {ids.shape} must be 1-D and equal "
                         f"in length: one of each per rollout row.")
    if keys.size == 0:
        return []
    uniq, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")            # groups by first appearance
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    by_group = np.argsort(rank[inverse], kind="stable")  # rows sorted by group, engine order kept
    bounds = np.cumsum(np.bincount(rank[inverse], minlength=order.size))[:-1]
    groups = np.split(by_group.astype(np.int64), bounds)
    str_ids = ids.astype(str)
    for g in groups:
        if (str_ids[g] != str_ids[g[0]]).any():
            raise InputError(f"rows of group {keys[g[0]]!r} carry different prompt ids "
                             f"{sorted(set(str_ids[g]))[:4]}; every rollout of one prompt must have "
                             f"the same extra_info.index.")
    return groups


def feedbacks_from_rows(pool: Pool, rows: Rows, *, step: int = 0) -> list[tuple[Feedback, np.ndarray]]:
    """Group engine rows into `Feedback` records, one per distinct group size G.

    Returns `[(feedback, row_index int64[B, G]), ...]`; `row_index[b, g]` is the engine
    row of rollout g of prompt b. Engines normally give every prompt the same G (one
    record); groups of unequal size (failed or filtered rollouts) are kept, as one record
    per size, rather than padded, so no invented reward reaches a policy.

    The advantages are `rlpace.group_advantages(rewards)` — GRPO's (r − mean) / (population
    std + 1e-6) over each group — never the engine's: verl's estimator (GRPO, Dr.GRPO's
    unscaled variant, RLOO, REINFORCE++, …) and its scaling differ by config, and every
    policy must see one scale.

    >>> pool = Pool(["a", "b"], ids=[10, 20])
    >>> rows = Rows(np.array(["u", "v", "u", "v"], object), np.array([20, 10, 20, 10]),
    ...             np.array([1.0, 0.0, 0.0, 0.0]))
    >>> [(f.prompt_ids.tolist(), f.rewards.tolist(), r.tolist()) for f, r in feedbacks_from_rows(pool, rows)]
    [([1, 0], [[1.0, 0.0], [0.0, 0.0]], [[0, 2], [1, 3]])]
    """
    # rows of a group in generation order when the engine reordered them (verl's batch
    # balancing): a first-seen tie rule (TTRL's vote) must see the rollouts as sampled
    keys, ids = np.asarray(rows.group_keys, dtype=object), np.asarray(rows.prompt_ids, dtype=object)
    if rows.order is None:
        groups = group_rows(keys, ids)
    else:
        perm = np.argsort(np.asarray(rows.order), kind="stable")
        groups = [perm[g] for g in group_rows(keys[perm], ids[perm])]
    if not groups:
        return []
    sizes = np.array([g.size for g in groups])
    out = []
    for size in np.unique(sizes):
        idx = np.stack([g for g, s in zip(groups, sizes) if s == size])          # [B, G]
        first = [rows.prompt_ids[i] for i in idx[:, 0]]
        positions = pool.index_of(first)
        rewards = rows.rewards[idx]
        signals = {k: np.asarray(getattr(rows, k))[idx] for k in _SIGNALS
                   if getattr(rows, k) is not None}       # supervision signals, when measured
        if "answers" in signals:
            signals["answers"] = signals["answers"].tolist()
        out.append((Feedback(positions, rewards, group_advantages(rewards), step=step, **signals), idx))
    return out


def chosen_rewards(fields, reward_key: str | None, score) -> np.ndarray:
    """The reward rlpace observes, by one rule for every verl path: `fields[reward_key]` when
    the reward function returned that field (verl's `non_tensor_batch`, or one rollout's
    `reward_extra_info`: e.g. `acc` 0/1 beside math_dapo's ±1 score), else `score` — the
    sequence score, or a callable that computes it (or raises) only when needed.

    >>> chosen_rewards({"acc": [1, 0]}, "acc", None).tolist(), chosen_rewards({}, "acc", [-1.0, 1.0]).tolist()
    ([1.0, 0.0], [-1.0, 1.0])
    """
    if reward_key and reward_key in fields:
        return np.asarray(fields[reward_key], dtype=np.float64)
    return np.asarray(score() if callable(score) else score, dtype=np.float64)


def eval_summary(rows: Sequence) -> dict:
    """A pilot record's held-out evaluation from (success, distribution or None[, prompt key]) per
    evaluated completion: `acc_mean` the share of successes, `acc` the share per distribution when
    every row names one (the TRL and verl adapters' evaluations), and `n` the held-out prompts per
    distribution (distinct prompt keys: a prompt sampled k times counts once, the unit the
    built-in trainer writes) when every row also carries a key. `rlpace advise` fits each
    domain's held-out solved share only from evaluations with both `acc` and `n`.

    Examples:
        >>> eval_summary([(True, "math"), (False, "math"), (True, "logic"), (True, "logic")])
        {'acc_mean': 0.75, 'acc': {'logic': 1.0, 'math': 0.5}}
        >>> eval_summary([(True, "math", 0), (False, "math", 0), (True, "logic", 1), (True, "math", 2)])
        {'acc_mean': 0.75, 'acc': {'logic': 1.0, 'math': 0.6666666666666666}, 'n': {'logic': 1, 'math': 2}}
        >>> eval_summary([(True, None), (False, None)])
        {'acc_mean': 0.5}
    """
    ok = np.array([r[0] for r in rows], dtype=np.float64)
    names = [r[1] for r in rows]
    out = {"acc_mean": float(ok.mean())}
    if all(d is not None for d in names):
        out["acc"] = {d: float(ok[[x == d for x in names]].mean()) for d in sorted(set(names))}
        if all(len(r) > 2 and r[2] is not None for r in rows):
            keys = {d: set() for d in out["acc"]}
            for r in rows:
                keys[r[1]].add(r[2])
            out["n"] = {d: len(k) for d, k in keys.items()}
    return out


def admitted_advantages(rewards: np.ndarray, keep: np.ndarray, full_group_advantages: bool = False
                        ) -> tuple[np.ndarray, np.ndarray]:
    """Where admission changes a rollout's advantage, and to what: (replace bool[B, G],
    value float64[B, G]) — the one rule every engine adapter applies to its own tensors.

    A dropped rollout gets advantage 0 (its loss mask is zeroed as well, by the adapter). A
    group that keeps a strict subset (PODS, GFPO) trains on `kept_group_advantages` of its
    kept rewards, unless `full_group_advantages` (`Admission.full_group_advantages`,
    DataFlex-RL's `topk`) keeps the full group's. Groups kept whole are left alone.

    >>> r = np.array([[1.0, 0.0, 0.0, 1.0], [1.0, 0.0, 1.0, 0.0]])
    >>> keep = np.array([[True, True, False, False], [True, True, True, True]])
    >>> replace, value = admitted_advantages(r, keep)
    >>> replace.tolist(), np.round(value[0], 4).tolist()
    ([[True, True, True, True], [False, False, False, False]], [1.0, -1.0, 0.0, 0.0])
    """
    keep = np.asarray(keep, dtype=bool)
    thinned = (keep.any(axis=1) & ~keep.all(axis=1))[:, None] & (not full_group_advantages)
    replace = ~keep | thinned
    value = np.where(keep & thinned, kept_group_advantages(rewards, keep), 0.0)
    return replace, value


def scatter_to_rows(values: np.ndarray, row_index: np.ndarray, n_rows: int, fill: float = 1.0) -> np.ndarray:
    """float64[n_rows]: `values[b, g]` written at engine row `row_index[b, g]`; rows not
    covered keep `fill`."""
    out = np.full(n_rows, fill, dtype=np.float64)
    out[np.asarray(row_index).ravel()] = np.asarray(values, dtype=np.float64).ravel()
    return out


def dataproto_rows(batch: Any, reward_key: str | None = "acc") -> Rows:
    """Read a verl `DataProto` (after the reward is computed) into `Rows`.

    * group key: `non_tensor_batch["uid"]`;
    * stable id: `non_tensor_batch["extra_info"][i]["index"]`;
    * reward: `non_tensor_batch["rlpace_reward"]` when the supervision transforms ran (the
      reward place's output, `rlpace.adapters._verl_supervision`), else
      `non_tensor_batch[reward_key]` when the reward function returned that extra
      (verl's `acc` is the verifier's correctness; DAPO recipes filter on it, not on the
      shaped `score`), else the sequence score `token_level_scores.sum(-1)` (verl puts the
      outcome reward on the last response token).

    The supervision transforms' per-row answers, token statistics and generation order
    (`rlpace_answer`, `rlpace_token_entropy`, `rlpace_mean_logprob`, `rlpace_order`) are
    read when present.

    verl's `advantages` are not read: `feedbacks_from_rows` gives every policy GRPO group
    advantages of these rewards, whatever `algorithm.adv_estimator` is.
    """
    nt, td = batch.non_tensor_batch, batch.batch
    for key in ("uid", "extra_info"):
        if key not in nt:
            raise InputError(f"the verl batch has no non_tensor_batch[{key!r}]; rlpace reads uid and "
                             f"extra_info.index from it (keep them on the batch).")
    extra = nt["extra_info"]
    try:
        ids = np.array([e["index"] for e in extra], dtype=object)
    except (KeyError, TypeError):
        raise InputError("a row's extra_info has no 'index'; write extra_info.index (a unique prompt "
                         "id) into the parquet.") from None
    def sequence_scores():
        if "token_level_scores" not in td.keys():
            raise InputError(f"the verl batch has neither non_tensor_batch[{reward_key!r}] nor "
                             f"batch['token_level_scores']; feed it after the reward is computed.")
        return td["token_level_scores"].sum(-1).double().cpu().numpy()

    if "rlpace_reward" in nt:               # the reward place's output (supervision transforms)
        rewards = np.asarray(nt["rlpace_reward"], dtype=np.float64)
    else:
        rewards = chosen_rewards(nt, reward_key, sequence_scores)
    signals = {k: nt[key] for k, key in (("answers", "rlpace_answer"), ("token_entropy", "rlpace_token_entropy"),
                                        ("mean_logprob", "rlpace_mean_logprob"), ("order", "rlpace_order"))
               if key in nt}                             # written by the supervision transforms
    return Rows(np.asarray(nt["uid"], dtype=object), ids, rewards, **signals)
