"""rlpace's V1 trainers for verl 0.9: every rlpace place on verl's default (V1) trainer.

Registered with verl (`@register_trainer`) as `rlpace_sync`, `rlpace_colocate_async` and
`rlpace_separate_async`, selected by `trainer.v1.trainer_mode`, started by
`examples/verl_v1_trainer.py` (which imports this module inside verl's TaskRunner actor, where
`get_trainer_cls` looks the mode up). Each is verl's trainer of that mode with
`RlpaceV1TrainerMixin` in front; `__init__` hands verl its own mode name (`trainer_mode` keys
verl's per-mode config and its sync/async branches), selects `RlpaceReplayBuffer[Async]`
(admission of finished groups, `rlpace.adapters._verl_v1`) and sets `data.gen_batch_size=1`.

Where each place acts, in verl's step (`PPOTrainer._step_once`: sample → old log-prob →
advantage → update):

* admission, targets, rewards that read no token statistic: the replay buffer, before
  sampling (evicted groups are refilled by verl's rule);
* loss weights and the advantage place: `Scheduler.step` returns them when the buffer decides
  a group; `_compute_advantage` multiplies verl's advantages in TransferQueue by loss weight ×
  advantage weight per rollout. For w ≥ 0 verl's clipped surrogate is positively homogeneous
  in A, so this is the weighted loss (`VerlFeedback`'s docstring); the advantage place is
  DE-Venus's Ã = w·Â;
* rewards that read token statistics (`entropy_min`): they exist only after verl's
  old-log-prob pass, so the buffer admits such groups unobserved and `_compute_old_log_prob`,
  after verl's pass, reads `entropy` / `old_log_probs` from TransferQueue (means over
  `response_mask`), applies the reward place, rewrites `rm_scores` of the groups it changes
  (before verl's `_compute_advantage` reads them), then `Scheduler.step`. The batch is already
  sampled there: rollouts admission drops get weight 0 (advantage 0), with no refill.
  `self_certainty` needs the full logits, which verl's actor does not return: refused.

Resume: the Scheduler's state rides in `data.pt` (`RlpaceDataset`); weights are applied in the
step whose groups they were decided for, so no weight outlives a checkpoint of a sync run.

Allocation (rollouts per prompt; `rlpace.adapters._verl_allocation`): `_submit_batch_to_rollout`
sees each batch of fetched prompts (the step's batch, or a refill) before generation; there
`Scheduler.allocate` gives prompt i N_i rollouts (budget: rollout.n each, or
`data.rlpace.budget` per `data.train_batch_size` prompts), written into the prompt's
`__rollout_n__` field, which verl's agent loop reads as the prompt's session count
(`AgentLoopWorkerTQ._run_prompt`). The buffer decides the finished groups as one ragged Feedback;
a group of one rollout trains on weight 0 under a group estimator (`GROUP_ESTIMATORS`). A prompt
allocated 0 runs no session: verl marks it finished with no trajectories, so the sync buffer still
counts it among the step's prompts; it is not in any Feedback (it has no rollout to observe).
"""

from __future__ import annotations

import numpy as np
import torch
from omegaconf import OmegaConf, open_dict
from verl.trainer.ppo.v1 import trainer_base as _tb
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from ..errors import InputError
from ..policies import active_supervision_places
from ._convert import Rows, feedbacks_from_rows
from ._supervision import TOKEN_SIGNALS, needs
from ._verl_core import check_verl_internals, check_verl_version
from ._verl_v1 import decide_groups

__all__ = ["RlpaceV1TrainerMixin", "RlpacePPOTrainerSync", "RlpacePPOTrainerColocateAsync",
           "RlpacePPOTrainerSeparateAsync", "MODES"]


class RlpaceV1TrainerMixin:
    """Put in front of a verl V1 `PPOTrainer` subclass; set `rlpace_mode` to verl's mode name."""

    rlpace_mode = "sync"
    rlpace_applies_weights = True      # read by the replay buffer: this trainer applies weights

    def __init__(self, config):
        check_verl_version("v1_trainer")
        check_verl_internals("v1_trainer")
        v1 = config.trainer.v1
        custom = OmegaConf.select(v1, "sampler.custom_sampler.name", default=None)
        buffer = "RlpaceReplayBuffer" if self.rlpace_mode == "sync" else "RlpaceReplayBufferAsync"
        if custom and custom != buffer:
            raise InputError(f"trainer.v1.sampler.custom_sampler.name={custom} with rlpace's V1 trainer, which "
                             f"selects {buffer} itself: remove trainer.v1.sampler.custom_sampler.")
        with open_dict(config):
            v1.trainer_mode = self.rlpace_mode
            v1.rlpace_trainer = True        # read by RlpaceDataset: the V1 path is rlpace's trainer
            v1.sampler.custom_sampler = {"path": "pkg://rlpace.adapters.verl", "name": buffer}
            kwargs = OmegaConf.to_container(v1.sampler.get("sampler_kwargs", None) or OmegaConf.create({}))
            kwargs.setdefault("train_batch_size", int(config.data.train_batch_size))
            kwargs.setdefault("gen_batch_size", 1)
            v1.sampler.sampler_kwargs = kwargs
            config.data.gen_batch_size = 1
        super().__init__(config)

    def _init_dataloader(self):
        super()._init_dataloader()
        # RlpaceDataset (rlpace.adapters.verl) is the one dataset that carries a Scheduler as
        # `.rlpace`; reading the attribute keeps this module below verl.py, which exports it lazily
        if getattr(self.train_dataset, "rlpace", None) is None:
            raise InputError("rlpace's V1 trainer needs data.custom_cls.path=pkg://rlpace.adapters.verl "
                             "data.custom_cls.name=RlpaceDataset (the Scheduler lives in the train dataset).")
        sched = self.replay_buffer.rlpace.scheduler          # also checks the buffer reaches it
        need = needs(sched) & TOKEN_SIGNALS
        if "self_certainty" in need:
            raise InputError("the method's reward place reads self-certainty, which needs the full logits; verl's "
                             "actor returns only per-token log-probs and entropies. Use RlpaceGRPOTrainer (TRL) or "
                             "the built-in trainer for self_certainty, or entropy_min here.")
        if need and "target" in active_supervision_places(sched.method):
            raise InputError(f"method {sched.name!r} has a target place and a reward that reads {sorted(need)}: on "
                             f"verl's V1 trainer targets are decided before sampling and token statistics after "
                             f"it, so the two cannot run on the same groups. Use the legacy trainer "
                             f"(examples/verl_legacy_trainer.py).")
        corr = self.config.algorithm.get("rollout_correction", None) or {}
        if need and corr.get("bypass_mode", False):
            raise InputError(f"method {sched.name!r} reads {sorted(need)}, which rlpace takes from verl's "
                             f"old-log-prob pass; algorithm.rollout_correction.bypass_mode=True skips it. "
                             f"Set bypass_mode=False.")

    def _val_metrics_update(self, data_sources, sample_uids, reward_extra_infos_dict, *args, **kwargs):
        # verl's `_validate` hands its per-sample data sources, uids and rewards here: the pilot
        # record's evaluation, written with the next line the buffer writes
        self.train_dataset.rlpace.record_eval(data_sources, reward_extra_infos_dict, sample_uids)
        return super()._val_metrics_update(data_sources, sample_uids, reward_extra_infos_dict, *args, **kwargs)

    def fit(self, *args, **kwargs):
        out = super().fit(*args, **kwargs)
        self.train_dataset.rlpace.flush_eval()      # the validation after the last step: a line of its own
        return out

    def _submit_batch_to_rollout(self, batch):
        from ._verl_allocation import GROUP_ESTIMATORS, allocates
        bridge = self.train_dataset.rlpace
        if allocates(bridge.scheduler):
            n = int(self.config.actor_rollout_ref.rollout.n)
            bridge.zero_singletons = str(getattr(self.config.algorithm.adv_estimator, "value",
                                                 self.config.algorithm.adv_estimator)) in GROUP_ESTIMATORS
            from tensordict import NonTensorData
            ids = [v.data if isinstance(v, NonTensorData) else v for v in batch["index"]]
            ids = [v.item() if hasattr(v, "item") else v for v in ids]           # numpy / torch scalars
            alloc = bridge.allocate(list(batch["uid"]), ids, int(self.config.data.train_batch_size), n,
                                    keep_zero=False)
            batch["__rollout_n__"] = torch.as_tensor(alloc.counts, dtype=torch.int64)
        return super()._submit_batch_to_rollout(batch)

    def _compute_old_log_prob(self, batch, metrics):
        out = super()._compute_old_log_prob(batch, metrics)
        if self.replay_buffer._deferred():
            metrics.update(self._rlpace_decide_after_log_prob(out))
        return out

    def _rlpace_decide_after_log_prob(self, batch) -> dict:
        """Token statistics → reward place → `rm_scores` → `Scheduler.step` for the sampled
        groups the buffer admitted unobserved (see the module docstring)."""
        buf = self.replay_buffer
        bridge = buf.rlpace
        sched, keys, part = bridge.scheduler, list(batch.keys), batch.partition_id
        if any(k.rsplit("_", 1)[1] != "0" for k in keys):
            raise InputError("rlpace's token-statistic rewards on verl's V1 trainer support agent loops with one "
                             "output per session (each rollout is one trajectory); this one writes several.")
        data = _tb.tq.kv_batch_get(keys=keys, partition_id=part, select_fields=[
            "rm_scores", "extra_fields", "index", "entropy", "old_log_probs", "response_mask"])
        rows = buf._rows(keys, data)
        masks = [m.double() for m in data["response_mask"].unbind()]
        mean = lambda col: np.array([float((v.double() * m).sum() / m.sum().clamp(min=1.0))  # noqa: E731
                                     for v, m in zip(data[col].unbind(), masks)])
        need = needs(sched)
        if "token_entropy" in need:
            rows = rows._replace(token_entropy=np.maximum(mean("entropy"), 0.0))
        if "mean_logprob" in need:
            rows = rows._replace(mean_logprob=np.minimum(mean("old_log_probs"), 0.0))
        steps = np.array([int(t.get("global_steps", self.global_steps)) for t in batch.tags])
        rewards, scores = np.array(rows.rewards, dtype=np.float64), np.full(len(keys), np.nan)
        dropped = 0
        for s in np.unique(steps):
            at = np.flatnonzero(steps == s)
            sub = Rows(*(None if f is None else f[at] for f in rows))
            for fb, idx in feedbacks_from_rows(sched.pool, sub, step=int(s)):
                new = np.asarray(sched.rewards(fb), dtype=np.float64)
                rewards[at[idx]] = new
                moved = (new != fb.rewards).any(axis=1)              # the groups the place changed
                scores[at[idx[moved]]] = new[moved]
            sub_keys = [keys[i] for i in at]
            evicted, cleared, _ = decide_groups(bridge, sub._replace(rewards=rewards[at]), sub_keys, step=int(s),
                                                weights=buf.rlpace_weights)
            for k in sub_keys:                  # admission after sampling: dropped rollouts get weight 0
                if k in cleared or k.split("_")[0] in evicted:
                    buf.rlpace_weights[k.rsplit("_", 1)[0]] = 0.0
                    dropped += 1
        changed = np.flatnonzero(~np.isnan(scores))
        if changed.size:
            old = data["rm_scores"].unbind()
            rm = []
            for i in changed:
                sc = torch.zeros_like(old[i])
                sc[-1] = float(scores[i])           # the agent loop's convention: score on the last token
                rm.append(sc)
            from tensordict import TensorDict
            _tb.tq.kv_batch_put(keys=[keys[i] for i in changed], partition_id=part, fields=TensorDict(
                {"rm_scores": torch.nested.as_nested_tensor(rm, layout=torch.jagged)}, batch_size=len(changed)))
        return {"rlpace/token_rewards/rewritten_rows": float(changed.size),
                "rlpace/token_rewards/dropped_rows": float(dropped)}

    def _compute_advantage(self, batch, metrics):
        out = super()._compute_advantage(batch, metrics)
        w = self.replay_buffer.pop_weights(list(out.keys))
        if not np.all(w == 1.0):
            from tensordict import TensorDict
            adv = _tb.tq.kv_batch_get(keys=out.keys, partition_id=out.partition_id,
                                      select_fields=["advantages"])["advantages"].unbind()
            scaled = torch.nested.as_nested_tensor([a * float(x) for a, x in zip(adv, w)], layout=torch.jagged)
            _tb.tq.kv_batch_put(keys=out.keys, partition_id=out.partition_id,
                                fields=TensorDict({"advantages": scaled}, batch_size=len(w)))
        metrics.update({"rlpace/weights/mean": float(w.mean()) if w.size else 1.0})
        return out


@register_trainer("rlpace_sync")
class RlpacePPOTrainerSync(RlpaceV1TrainerMixin, PPOTrainerSync):
    """verl's sync V1 trainer with every rlpace place (`trainer.v1.trainer_mode=rlpace_sync`)."""
    rlpace_mode = "sync"


@register_trainer("rlpace_colocate_async")
class RlpacePPOTrainerColocateAsync(RlpaceV1TrainerMixin, PPOTrainerColocateAsync):
    """verl's colocated async V1 trainer with every rlpace place."""
    rlpace_mode = "colocate_async"


@register_trainer("rlpace_separate_async")
class RlpacePPOTrainerSeparateAsync(RlpaceV1TrainerMixin, PPOTrainerSeparateAsync):
    """verl's separate (fully) async V1 trainer with every rlpace place."""
    rlpace_mode = "separate_async"


MODES = {"rlpace_sync": RlpacePPOTrainerSync, "rlpace_colocate_async": RlpacePPOTrainerColocateAsync,
         "rlpace_separate_async": RlpacePPOTrainerSeparateAsync}
