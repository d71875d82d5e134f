"""verl 0.9 V1 trainer: a `ReplayBuffer` whose group filter is rlpace admission.

Selected with `trainer.v1.sampler.custom_sampler.{path,name}`; verl builds it with
`trainer_mode, trainer_config, max_off_policy_threshold, max_off_policy_strategy,
sampler_kwargs, refill_fn` (verl/trainer/ppo/v1/trainer_base.py `_build_replay_buffer`)
and calls `sample(global_steps, partition_id, batch_size) -> (KVBatchMeta, metrics)`.

verl's own buffer already evicts "DAPO" groups and refills them (sync: 2k prompts per k
evicted, async: k) when `filter_groups_metric` is set. This subclass turns that machinery
on and replaces only the decision, `_dapo_filtered_keys`: each newly finished group is
read from TransferQueue once (rewards from `rm_scores`, or `reward_extra_info[reward_key]`;
the stable id from the `index` field), observed by the train dataset's Scheduler, and
evicted when admission keeps none of its rollouts; rollouts dropped inside a kept group
are cleared from TransferQueue, so the group trains on the rest. `sample` adds
`rlpace/*` metrics, which the trainer merges into the step's metrics for its logger.

Contract notes (read from the installed verl 0.9.1 source, and run against a real
TransferQueue in tests/test_adapter_verl_tq.py): trajectory keys are `{uid}_{session}_{i}`;
rewards must be in TransferQueue when `sample` runs (a colocated reward model scores
later: a ValueError says so); advantages do not exist yet when groups are chosen, so the
Feedback carries `group_advantages` of the rewards, as on every rlpace path; verl then
computes its advantages over the rollouts left in each group (with its GRPO estimator
that is the kept-subset rule of PODS, `kept_group_advantages`, up to verl's unbiased
std); the buffer is not checkpointed (its decisions live in the Scheduler, which
`data.pt` saves through the dataset).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
from verl.trainer.ppo.v1 import replay_buffer as _rb

from ._convert import Rows, feedbacks_from_rows
from .verl import _SHARED, VerlFeedback, check_verl_version

__all__ = ["RlpaceReplayBuffer", "RlpaceReplayBufferAsync", "decide_groups"]


def decide_groups(bridge: VerlFeedback, rows: Rows, keys: list[str], step: int) -> tuple[set, set, dict]:
    """Observe finished groups and apply admission.

    Returns (evicted uids, trajectory keys to clear inside kept groups, {uid: mean reward}).
    """
    evicted, cleared, mean = set(), set(), {}
    for fb, idx in feedbacks_from_rows(bridge.scheduler.pool, rows, step=step):
        bridge.scheduler.observe(fb)
        keep = bridge.scheduler.admit(fb)
        for b in range(idx.shape[0]):
            uid = str(rows.group_keys[idx[b, 0]])
            mean[uid] = float(fb.rewards[b].mean())
            if not keep[b].any():
                evicted.add(uid)
            else:
                cleared.update(keys[i] for i in idx[b][~keep[b]])
    return evicted, cleared, mean


class _RlpaceAdmission:
    def __init__(self, trainer_mode, trainer_config, max_off_policy_threshold, max_off_policy_strategy,
                 sampler_kwargs, poll_interval: float = 2.0, refill_fn=None):
        check_verl_version("replay_buffer")
        kw = dict(sampler_kwargs or {})
        missing = [k for k in ("train_batch_size", "gen_batch_size") if k not in kw]
        if missing:
            raise ValueError(f"trainer.v1.sampler.sampler_kwargs needs {missing} (verl passes them only to "
                             f"its own buffer): add '+trainer.v1.sampler.sampler_kwargs.train_batch_size="
                             f"${{data.train_batch_size}}' and '...gen_batch_size=1'.")
        if int(kw["gen_batch_size"]) != 1:
            raise ValueError("sampler_kwargs.gen_batch_size must be 1 (and data.gen_batch_size=1): refills "
                             "are whole dataloader fetches, and evictions come one group at a time.")
        super().__init__(trainer_mode, trainer_config, max_off_policy_threshold, max_off_policy_strategy,
                         sampler_kwargs, poll_interval=poll_interval, refill_fn=refill_fn,
                         filter_groups_metric="rlpace", train_batch_size=int(kw["train_batch_size"]),
                         gen_batch_size=1, max_inflight_gen_batches=int(kw.get("max_inflight_gen_batches", 1)))

    @property
    def rlpace(self) -> VerlFeedback:
        if "train" not in _SHARED:
            raise ValueError("RlpaceReplayBuffer shares the train dataset's Scheduler: set "
                             "data.custom_cls.path=pkg://rlpace.adapters.verl data.custom_cls.name=RlpaceDataset.")
        return _SHARED["train"]

    def _dapo_filtered_keys(self, partition_id: str):
        if partition_id == "val":
            return set(), Counter()
        cache = self._dapo_classification_cache[partition_id]     # uid -> mean reward if evicted else None
        finished = self.finished_keys[partition_id]
        for uid in cache.keys() - finished:
            del cache[uid]
        new = finished - cache.keys()
        # one row per rollout: output 0 of each session (multi-output agent loops copy the
        # final reward onto every output of a session)
        keys = sorted(k for k in self.partitions[partition_id]
                      if k.split("_")[0] in new and k.rsplit("_", 1)[1] == "0")
        if keys:
            try:
                data = _rb.tq.kv_batch_get(keys=keys, partition_id=partition_id,
                                           select_fields=["rm_scores", "extra_fields", "index"])
            except KeyError:        # no rm_scores yet: `_rows` may still find reward_extra_info
                data = _rb.tq.kv_batch_get(keys=keys, partition_id=partition_id,
                                           select_fields=["extra_fields", "index"])
            rows = self._rows(keys, data)
            step_of = self.prompt_global_steps[partition_id]
            steps = np.array([step_of.get(k.split("_")[0], 0) for k in keys])
            evicted, cleared, mean = set(), set(), {}
            for s in np.unique(steps):          # one Feedback per step the prompts were drawn at
                at = np.flatnonzero(steps == s)
                sub = Rows(*(f[at] for f in rows))
                e, c, m = decide_groups(self.rlpace, sub, [keys[i] for i in at], step=int(s))
                evicted |= e
                cleared |= c
                mean.update(m)
            sessions = {k.rsplit("_", 1)[0] for k in cleared}
            outputs = sorted(k for k in self.partitions[partition_id] if k.rsplit("_", 1)[0] in sessions)
            if outputs:
                _rb.tq.kv_clear(keys=outputs, partition_id=partition_id)
                for k in outputs:
                    del self.partitions[partition_id][k]
            for uid in new:
                cache[uid] = mean.get(uid) if uid in evicted else None
        dropped = {uid for uid, v in cache.items() if v is not None}
        return dropped, Counter(cache[uid] for uid in dropped)

    def _rows(self, keys: list[str], data) -> Rows:
        key = self.rlpace.reward_key
        extra = [getattr(v, "data", v) for v in data["extra_fields"]]
        infos = [e.get("reward_extra_info", {}) if isinstance(e, dict) else {} for e in extra]
        if key and all(key in i for i in infos):
            rewards = np.array([float(i[key]) for i in infos])
        else:
            try:
                scores = data["rm_scores"]
            except (KeyError, TypeError):
                scores = None
            if scores is None or len(scores) != len(keys):
                raise ValueError(
                    f"finished rollouts reached the replay buffer without rewards (no 'rm_scores' and no "
                    f"reward_extra_info[{key!r}] in TransferQueue): rlpace admission reads rewards when it "
                    f"samples, and a colocated reward model (reward.reward_model.enable=True without "
                    f"enable_resource_pool) scores only after sampling. Use a rule-based reward or set "
                    f"reward.reward_model.enable_resource_pool=True (verl's own condition for "
                    f"algorithm.filter_groups).")
            rewards = np.array([float(s.sum()) for s in scores])
        ids = np.array([getattr(v, "data", v) for v in data["index"]], dtype=object)
        return Rows(np.array([k.split("_")[0] for k in keys], dtype=object), ids, rewards)

    def sample(self, global_steps: int, partition_id: str, batch_size: int):
        meta, metrics = super().sample(global_steps, partition_id, batch_size)
        if partition_id != "val":
            metrics.update(self.rlpace.metrics())
        return meta, metrics


class RlpaceReplayBuffer(_RlpaceAdmission, _rb.ReplayBuffer):
    """`trainer.v1.trainer_mode=sync`: rlpace admission over verl's synchronous buffer."""


class RlpaceReplayBufferAsync(_RlpaceAdmission, _rb.ReplayBufferAsync):
    """Async trainer modes: rlpace admission over verl's asynchronous buffer (feedback
    arrives as groups finish, so it lags behind the proposals by the in-flight batches)."""
