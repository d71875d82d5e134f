"""Supervision transforms in verl's legacy trainer (`RlpaceTrainerMixin`), read against verl 0.9.1.

In verl 0.9.1 every reward manager scores one rollout at a time inside the agent loop,
before its group is complete (`experimental/agent_loop/agent_loop.py::_compute_score`), so
no reward manager can take a majority vote. The legacy `RayPPOTrainer.fit` has the whole
step's batch at `extract_reward(batch)` (`trainer/ppo/ray_trainer.py`, called by that
module-level name after rollout and batch balancing): `supervise_batch` runs there.

1. answers: each response decoded as verl's naive manager decodes it (valid length from
   `attention_mask`, `skip_special_tokens=True`) and passed to the extractor;
2. `sched.targets(fb)`: one target per prompt (rewards are a placeholder of zeros);
3. re-verification: rows whose prompt has a target are re-scored by verl's own reward
   manager (`verl.trainer.ppo.reward.load_reward_manager(config, tokenizer)`: the same
   class, custom `compute_score` and `reward_kwargs` the reward workers use), one
   `run_single` per row against a *per-row copy* of `reward_model` whose `ground_truth` is
   the target. After `DataProto.repeat(interleave=True)` the G rows of a prompt hold the
   same `reward_model` dict object (numpy repeats object references), so writing a target
   into it would be a group-wide (and dataset-wide, for the validation copy) write; the
   copy carries the dataset's label under `dataset_ground_truth`. Rows of an unlabelled
   prompt without a target score 0 (not verified). `rm_scores` (score at the last valid
   token, verl's `assemble_rm_scores` convention) and the `reward_extra_info` columns are
   overwritten in place, so the `reward_tensor` verl extracts next sees them;
4. `sched.rewards(fb)` (on the `reward_key` column, else the sequence score): in each group
   it changes, the transformed reward replaces the sequence score (last valid token); the
   `reward_key` column keeps the verifier's value, and rlpace observes `rlpace_reward`. A
   reward place that reads token entropy is applied after the old-log-prob pass instead (`apply_deferred`),
   where verl computes per-token entropies (then popped by `fit`).

The answers (`rlpace_answer`), targets (`rlpace_target`), token statistics
(`rlpace_token_entropy`, `rlpace_mean_logprob`) and the reward rlpace observes
(`rlpace_reward`: the reward place's output) ride in `non_tensor_batch`, so the Feedback
that reaches `Scheduler.observe` in `_update_actor` carries them, and verl's rollout dump
shows them.
"""

from __future__ import annotations

from ..errors import InputError
import asyncio

import numpy as np

from ._convert import Rows, chosen_rewards, feedbacks_from_rows
from ._supervision import TOKEN_SIGNALS, extract_answer, needs, retargeted, step_targets

__all__ = ["supervise_batch", "apply_deferred", "check_token_signals", "ANSWER", "TARGET", "ENTROPY", "LOGPROB",
           "REWARD", "ORDER"]

ANSWER, TARGET, REWARD = "rlpace_answer", "rlpace_target", "rlpace_reward"
ENTROPY, LOGPROB, ORDER = "rlpace_token_entropy", "rlpace_mean_logprob", "rlpace_order"
_DEFERRED = "rlpace_rewards_deferred"


def _valid_lengths(batch) -> np.ndarray:
    resp = batch.batch["responses"]
    return batch.batch["attention_mask"][:, -resp.shape[-1]:].sum(-1).cpu().numpy().astype(np.int64)


def _ids(batch) -> np.ndarray:
    nt = batch.non_tensor_batch
    for key in ("uid", "extra_info", "reward_model"):
        if key not in nt:
            raise InputError(f"the verl batch has no non_tensor_batch[{key!r}]; rlpace's supervision transforms "
                             f"read uid, extra_info.index and reward_model from it (keep them on the batch).")
    try:
        return np.array([e["index"] for e in nt["extra_info"]], dtype=object)
    except (KeyError, TypeError):
        raise InputError("a row's extra_info has no 'index'; write extra_info.index (a unique prompt id) "
                         "into the parquet.") from None


def _feedbacks(sched, batch, rewards: np.ndarray, step: int, **signals):
    """[(Feedback, row_index)] with the given per-row signals gathered to [B, G]."""
    nt = batch.non_tensor_batch
    rows = Rows(np.asarray(nt["uid"], dtype=object), _ids(batch), rewards, order=nt.get(ORDER),
                **{k: v for k, v in signals.items() if v is not None})
    return feedbacks_from_rows(sched.pool, rows, step=step)


def _sequence_rewards(batch, reward_key: str | None) -> np.ndarray:
    return chosen_rewards(batch.non_tensor_batch, reward_key,
                          lambda: batch.batch["rm_scores"].sum(-1).double().cpu().numpy())


def _write(batch, i: int, score: float, extra: dict, valid: np.ndarray, keys: list) -> None:
    rm = batch.batch["rm_scores"]
    rm[i].zero_()
    rm[i, max(int(valid[i]) - 1, 0)] = float(score)          # assemble_rm_scores' position
    nt = batch.non_tensor_batch
    for k in keys:
        if k not in extra:
            raise InputError(f"the reward function returned keys {sorted(extra)} when re-verifying against a "
                             f"target, but {k!r} during rollout; verl needs the same keys for every sample.")
        if nt[k].dtype.kind in "US":          # np.array of strings is fixed-width: a longer value would be cut
            nt[k] = nt[k].astype(object)
        nt[k][i] = extra[k]


def _rescore(manager, batch, rows: np.ndarray, target: np.ndarray) -> tuple[list, list]:
    """verl's reward manager, one `run_single` per row, each on a one-row slice whose
    `reward_model` is a fresh dict with `ground_truth = target[row]`."""
    items = []
    for i in rows:
        item = batch[int(i):int(i) + 1]
        rm = retargeted(item.non_tensor_batch["reward_model"][0], target[i])
        item.non_tensor_batch["reward_model"] = np.array([rm], dtype=object)
        item.non_tensor_batch["extra_info"] = np.array([dict(item.non_tensor_batch["extra_info"][0])], dtype=object)
        items.append(item)

    async def run():
        return await asyncio.gather(*(manager.run_single(it) for it in items))
    return manager.loop.run_until_complete(run()), items


def supervise_batch(bridge, batch, *, manager, tokenizer, step: int, extractor=extract_answer) -> dict:
    """Run target → re-verification → reward place on a post-rollout verl batch, in place.

    Args: bridge the `VerlFeedback`; batch the `DataProto` `fit` hands to `extract_reward`
    (rows in any order, `uid`, `extra_info.index`, `reward_model`, `responses`,
    `attention_mask`, `rm_scores`, `meta_info["reward_extra_keys"]`); manager a verl
    reward manager (`run_single`); tokenizer the actor's. Returns counters for metrics.
    """
    sched = bridge.scheduler
    nt = batch.non_tensor_batch
    n = len(batch)
    valid = _valid_lengths(batch)
    resp = batch.batch["responses"]
    texts = [tokenizer.decode(resp[i, :valid[i]], skip_special_tokens=True) for i in range(n)]
    answers = np.empty(n, dtype=object)
    for i, t in enumerate(texts):
        a = extractor(t)
        answers[i] = None if a is None else str(a).strip()
    nt[ANSWER] = answers
    keys = list(batch.meta_info.get("reward_extra_keys", []))

    # targets: a placeholder reward (the target place must not read rewards)
    target, zero = step_targets(sched, _feedbacks(sched, batch, np.zeros(n), step, answers=answers), n)
    nt[TARGET] = target
    rescored = np.flatnonzero(target != None)  # noqa: E711
    if rescored.size:
        results, items = _rescore(manager, batch, rescored, target)
        gts = np.array(list(nt["reward_model"]), dtype=object)       # new array: rows keep their dicts
        for i, res, item in zip(rescored, results, items):
            _write(batch, int(i), res["reward_score"], res.get("reward_extra_info", {}), valid, keys)
            gts[i] = item.non_tensor_batch["reward_model"][0]
        nt["reward_model"] = gts
    for i in np.flatnonzero(zero):                           # unlabelled, no target: not verified
        extra = {k: nt[k][i] for k in keys}
        extra.update({k: 0.0 for k in (bridge.reward_key, "score", "acc") if k in extra})
        _write(batch, int(i), 0.0, extra, valid, keys)

    if needs(sched) & TOKEN_SIGNALS:
        batch.meta_info[_DEFERRED] = True                   # after the old-log-prob pass
    else:
        _apply_rewards(bridge, batch, step, valid)
    return {"rlpace/supervision/rescored_rows": float(rescored.size), "rlpace/supervision/unverified_rows":
            float(zero.sum())}


def _apply_rewards(bridge, batch, step: int, valid: np.ndarray, **signals) -> None:
    """`Scheduler.rewards` on the step's groups; the result is the reward rlpace observes
    (`rlpace_reward`, float64 per row) and, when it differs from the verified reward, the
    sequence score verl trains on (`rm_scores`, in place: `fit` already holds that tensor)."""
    sched, nt = bridge.scheduler, batch.non_tensor_batch
    r = _sequence_rewards(batch, bridge.reward_key)
    out = r.copy()
    rm = batch.batch["rm_scores"]
    for fb, idx in _feedbacks(sched, batch, r, step, answers=nt[ANSWER], **signals):
        new = np.asarray(sched.rewards(fb), dtype=np.float64)
        out[idx] = new
        # only the groups the place changed: the others keep verl's score (its scale may
        # differ from the observed reward_key: math_dapo's score ±1 beside acc 0/1)
        for b in np.flatnonzero((new != fb.rewards).any(axis=1)):
            for g, v in enumerate(new[b]):
                i = int(idx[b, g])
                rm[i].zero_()
                rm[i, max(int(valid[i]) - 1, 0)] = v
    nt[REWARD] = out


def check_token_signals(sched) -> None:
    """ValueError before training when the method reads a token statistic verl cannot give."""
    if "self_certainty" in needs(sched):
        raise InputError("the method's reward place reads self-certainty, which needs the full logits; verl's "
                         "actor returns only per-token log-probs and entropies. Use RlpaceGRPOTrainer (TRL) or "
                         "the built-in trainer for self_certainty, or a reward that reads token_entropy / "
                         "mean_logprob (entropy_min) here.")


def apply_deferred(bridge, batch, old_log_prob, step: int) -> None:
    """The reward place for rewards that read token statistics, after verl's old-log-prob
    pass: `old_log_prob` is what `_compute_old_log_prob` returned (`entropys`: verl's
    per-token entropy of the pre-update policy at the rollout temperature; `old_log_probs`:
    the sampled tokens' log-probs), averaged over `response_mask`."""
    if not batch.meta_info.pop(_DEFERRED, False):
        return
    need = needs(bridge.scheduler)
    check_token_signals(bridge.scheduler)
    m = batch.batch["response_mask"].double()
    n = m.sum(-1).clamp(min=1.0)
    signals = {}
    for signal, key, col in (("token_entropy", "entropys", ENTROPY), ("mean_logprob", "old_log_probs", LOGPROB)):
        if signal in need:
            v = ((old_log_prob.batch[key].double() * m).sum(-1) / n).cpu().numpy()
            v = np.maximum(v, 0.0) if signal == "token_entropy" else np.minimum(v, 0.0)
            batch.non_tensor_batch[col] = v
            signals[signal] = v
    _apply_rewards(bridge, batch, step, _valid_lengths(batch), **signals)
