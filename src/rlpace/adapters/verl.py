"""rlpace inside verl: prompts drawn by a `Scheduler`, feedback from verl's batches.

Three entry points, one per verl generation (config lines: `docs/engines.md`):

* verl 0.8–0.9 (`RlpaceDataset`, `data.custom_cls`): an `RLHFDataset` whose batches are
  drawn by the Scheduler (index indirection: the dataloader's indices are ignored, each
  batch fetch calls `propose(batch_size)`); verl calls `on_batch_end(batch)` after every
  step of the legacy trainer; its state rides in the dataloader's `data.pt`.
* verl 0.5–0.7 (`RlpaceSampler`, `data.sampler.class_path`): an `AbstractCurriculumSampler`
  (`rlpace.adapters._verl_legacy`), fed by verl's `sampler.update(batch)`.
* verl 0.9 V1 trainer (`RlpaceReplayBuffer`, `trainer.v1.sampler.custom_sampler`): admission
  of finished groups (`rlpace.adapters._verl_v1`), sharing the dataset's Scheduler; rlpace's
  V1 trainers (`trainer.v1.trainer_mode=rlpace_sync|rlpace_colocate_async|rlpace_separate_async`,
  `rlpace.adapters._verl_v1_trainer`, started by `examples/verl_v1_trainer.py`) add loss
  weights, the advantage place and token-statistic rewards.

`RlpaceTrainerMixin` (legacy `RayPPOTrainer`, any version) adds what no config reaches:
feedback *before* the checkpoint is written (exact resume), loss weights, and
`rlpace/*` metrics in verl's logger. The adapters translate; the scheduling is the core's.
"""

from __future__ import annotations

from ..errors import InputError
import os

import numpy as np

from ..scheduler import Scheduler

try:
    import verl
    from verl.utils.dataset.rl_dataset import RLHFDataset
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("rlpace.adapters.verl needs verl: pip install 'rlpace[verl]'") from e

from ._verl_core import (SUPPORTED, VerlFeedback, _check_loader_config, _plain, check_verl_internals,
                         check_verl_version, feedback_from_config, pool_from_dataframe, refuse_gradient_features)

__all__ = ["RlpaceDataset", "RlpaceSampler", "RlpaceReplayBuffer", "RlpaceReplayBufferAsync",
           "RlpaceTrainerMixin", "RlpaceV1TrainerMixin", "VerlFeedback", "pool_from_dataframe",
           "feedback_from_config", "check_verl_version", "check_verl_internals", "load_data_pt", "SUPPORTED"]

def _train_files(data_files, data_config) -> bool:
    as_list = lambda x: [str(p) for p in (_plain(x) if isinstance(_plain(x), list) else [x])]  # noqa: E731
    train, val = as_list(data_config.get("train_files", [])), as_list(data_config.get("val_files", []))
    files = as_list(data_files)
    if files == train and train == val:
        raise InputError("data.train_files and data.val_files name the same files: the rlpace dataset "
                         "cannot tell the validation set apart. Point data.val_files at a copy.")
    return files == train or files != val


V1_BUFFERS = ("RlpaceReplayBuffer", "RlpaceReplayBufferAsync")


def _check_v1_feedback_channel(data_config) -> str | None:
    """Which V1 path the run's config selects: None (not V1), "trainer" (rlpace's V1 trainer,
    `trainer.v1.trainer_mode=rlpace_*`: it marks `trainer.v1.rlpace_trainer` when it hands verl
    verl's own mode name) or "buffer" (verl's V1 trainer with `RlpaceReplayBuffer`). InputError
    when V1 has neither: V1 never calls `on_batch_end`, its only feedback channel is the replay
    buffer, so with verl's own buffer the Scheduler would propose forever on no feedback. Read
    from the run's whole config, which the `data` node verl hands the dataset belongs to (a bare
    `data` config, as in tests or scripts, is not checked)."""
    from omegaconf import OmegaConf
    root = data_config._get_root() if OmegaConf.is_config(data_config) else None
    if root is None or root is data_config or not OmegaConf.select(root, "trainer.use_v1", default=False):
        return None
    mode = str(OmegaConf.select(root, "trainer.v1.trainer_mode", default="sync"))
    name = OmegaConf.select(root, "trainer.v1.sampler.custom_sampler.name", default=None)
    if mode.startswith("rlpace_") or OmegaConf.select(root, "trainer.v1.rlpace_trainer", default=False):
        return "trainer"
    if name in V1_BUFFERS:
        return "buffer"
    raise InputError(
        "verl's V1 trainer (trainer.use_v1=True) never calls the dataset's on_batch_end, so the Scheduler "
        "would get no feedback: run examples/verl_v1_trainer.py with trainer.v1.trainer_mode=rlpace_"
        f"{mode} (every rlpace place; docs/engines.md), or set trainer.v1.sampler.custom_sampler.path="
        f"pkg://rlpace.adapters.verl trainer.v1.sampler.custom_sampler.name="
        f"{V1_BUFFERS[0] if mode == 'sync' else V1_BUFFERS[1]}, or run the legacy trainer with trainer.use_v1=False.")


def _check_separated_trainer(data_config) -> bool:
    """True when the run is verl's one-step-off-policy trainer; InputError for its fully-async
    trainer. Both (verl.experimental.one_step_off_policy, verl.experimental.fully_async_policy)
    ignore `trainer.use_v1` and are recognised by the keys their configs add at the top:
    `rollout.n_gpus_per_node` (the rollout's own GPUs, both) and `async_training` (fully async
    only). The fully-async rollouter draws the prompts in its own process and nothing there
    calls `on_batch_end`: no feedback would reach the Scheduler. The one-step-off trainer calls
    `on_batch_end` after each step (`SeparateRayPPOTrainer._fit_experimental`), one batch late."""
    from omegaconf import OmegaConf
    root = data_config._get_root() if OmegaConf.is_config(data_config) else None
    if root is None or root is data_config:
        return False
    if OmegaConf.select(root, "async_training", default=None) is not None:
        raise InputError(
            "verl's fully-async trainer (a config with async_training, verl.experimental.fully_async_policy."
            "fully_async_main) draws prompts in its rollouter, which never passes a finished step to the "
            "dataset (no on_batch_end), so the Scheduler would propose on no feedback. Run verl's V1 "
            "trainer in its fully-async mode instead, where rlpace has every place: examples/verl_v1_trainer.py "
            "trainer.use_v1=True trainer.v1.trainer_mode=rlpace_separate_async (docs/engines.md).")
    return OmegaConf.select(root, "rollout.n_gpus_per_node", default=None) is not None


def _refuse_beyond_selection(sched, trainer: str) -> None:
    """InputError when the method has a place besides mixture and selection, or a policy reads a
    signal besides rewards: `trainer` calls only `on_batch_end`, and nothing would apply them."""
    from ..policies import active_supervision_places, is_neutral
    from ._supervision import needs
    m = sched.method
    extra = [k for k in ("admission", "reweighting", "allocation") if getattr(m, k, None) is not None
             and not is_neutral(getattr(m, k))] + sorted(active_supervision_places(m))
    read = sorted(needs(sched))
    if extra or read:
        what = (f"{', '.join(extra)} place(s)" if extra else "") + (" and " if extra and read else "") + \
            (f"reads {read}" if read else "")
        raise InputError(
            f"method {sched.name!r} has {what}, which nothing applies on {trainer}: it only passes each finished "
            f"step to the dataset (on_batch_end), so rlpace chooses the prompts there (mixture, selection) and "
            f"nothing else. Use a method with mixture and selection only, or verl's V1 trainer in an async mode "
            f"with every place: examples/verl_v1_trainer.py trainer.use_v1=True "
            f"trainer.v1.trainer_mode=rlpace_colocate_async (docs/engines.md).")


class RlpaceDataset(RLHFDataset):
    """verl ≥ 0.8 `data.custom_cls`: the train batches come from `Scheduler.propose`.

    Each batch fetch (`__getitems__`, called once per batch with `num_workers=0`) ignores
    the sampler's indices and returns the rows of `propose(len(indices))`. The validation
    dataset (built from `data.val_files` with the same class) is left as verl's. State:
    `state_dict()` holds the Scheduler's, so torchdata writes it into `data.pt`; since the
    proposals depend on that state only, a restored loader replays the next batches. With an
    allocation place it also holds the N_i of prompts submitted but not yet observed (verl's
    async V1 modes restore those prompts from their TransferQueue checkpoint).
    """

    def __init__(self, data_files, tokenizer, config, processor=None, max_samples: int = -1):
        check_verl_version("dataset")
        _check_loader_config(config)
        scheduled = _train_files(data_files, config)
        one_step_off = _check_separated_trainer(config) if scheduled else False
        v1 = _check_v1_feedback_channel(config) if scheduled and not one_step_off else None
        super().__init__(data_files, tokenizer, config, processor=processor, max_samples=max_samples)
        self.rlpace = feedback_from_config(pool_from_dataframe(self.dataframe), config) if scheduled else None
        if one_step_off:
            _refuse_beyond_selection(self.rlpace.scheduler, "verl's one-step-off-policy trainer")
        if v1 is not None:
            from ._verl_v1 import refuse_trainer_places
            refuse_gradient_features(self.rlpace.scheduler, allocation=v1 == "trainer")
            if v1 == "buffer":            # verl's own V1 trainer: refuse what only rlpace's trainer applies
                refuse_trainer_places(self.rlpace.scheduler)

    @property
    def scheduler(self) -> Scheduler | None:
        return None if self.rlpace is None else self.rlpace.scheduler

    def __getitems__(self, indices: list[int]) -> list[dict]:
        if self.rlpace is not None:
            indices = self.rlpace.scheduler.propose(len(indices)).tolist()
        return [self[int(i)] for i in indices]

    def on_batch_end(self, batch) -> None:
        """Called by verl's legacy trainer after each step but the last."""
        if self.rlpace is not None:
            self.rlpace.observe(batch)

    def state_dict(self) -> dict:
        if self.rlpace is None:
            return {}
        out = {"rlpace": self.rlpace.scheduler.state_dict()}
        if self.rlpace.record is not None:          # the pilot record's lines this state had observed
            out["rlpace_record_lines"] = self.rlpace.record_lines
        if self.rlpace.v1_buffer is not None:       # V1: the groups its buffer decided, not yet trained
            out["rlpace_v1_buffer"] = self.rlpace.v1_buffer.rlpace_state()
        if self.rlpace.allocated:                   # V1 async: allocations of prompts generated ahead
            out["rlpace_allocated"] = self.rlpace.allocation_state()
        return out

    def load_state_dict(self, state: dict) -> None:
        if self.rlpace is not None and state and "rlpace" in state:
            self.rlpace.scheduler.load_state_dict(state["rlpace"])
            if self.rlpace.record is not None and "rlpace_record_lines" in state:
                self.rlpace.restore_record(int(state["rlpace_record_lines"]))
            self.rlpace.v1_restored = state.get("rlpace_v1_buffer")
            self.rlpace.restore_allocation(state.get("rlpace_allocated"))


class RlpaceTrainerMixin:
    """Mix into verl's legacy `RayPPOTrainer` (0.5–0.9): `class T(RlpaceTrainerMixin, RayPPOTrainer)`.

    `_update_actor(batch)` runs after `compute_advantage` and before `_save_checkpoint`;
    there the mixin observes the batch (so `data.pt` holds this step's feedback and resume
    is exact), applies admission (`VerlFeedback.apply_admission`: dropped rollouts leave
    the loss, thinned groups train on kept-subset GRPO advantages), scales advantages by
    the loss weights, and adds `rlpace/*` to the actor's
    metrics, which verl reduces and hands to its logger with the step's metrics.
    `_load_checkpoint` also restores the dataset state that verl 0.9 skips at an epoch
    boundary. See `examples/verl_legacy_trainer.py` for the entry point.

    Allocation (a method with an allocation place: `knapsack`, `gvm`, ...): `_get_gen_batch`,
    which fit calls right after giving each prompt row its uid, decides N_i per prompt
    (`Scheduler.allocate`, budget B·rollout.n or `data.rlpace.budget`) and makes verl's next
    `repeat(rollout.n)` of the prompt batch and of the generation batch repeat row i N_i times:
    N_i rows sharing the uid, Σ N_i rows (`rlpace.adapters._verl_allocation`). `_update_actor`
    observes them as one ragged Feedback and sets the advantage of a one-rollout prompt to 0.
    The pilot record (`data.rlpace.record`) is written by the dataset's `VerlFeedback`, with
    verl's validations (`_val_metrics_update` receives their per-sample rewards).

    Supervision transforms (a method with a target, reward or advantage place: `ttrl`,
    `olr`, `trapo`, `entropy_min`, ...; `rlpace.adapters._verl_supervision`): `fit` wraps
    verl's `extract_reward` so that each train batch, once its groups are complete, gets
    answers → `Scheduler.targets` → re-verification by verl's own reward manager against
    per-row copies of `reward_model` → `Scheduler.rewards`; token-statistic rewards wait for
    `_compute_old_log_prob`; `_update_actor` multiplies the advantages by
    `Scheduler.advantage_weights`. `rlpace_answer_extractor` (a class attribute,
    str -> str | None) replaces the default extractor.
    """

    def _rlpace(self) -> VerlFeedback:
        for owner in (getattr(self.train_dataloader, "sampler", None), self.train_dataset):
            if getattr(owner, "rlpace", None) is not None:
                return owner.rlpace
        raise InputError("RlpaceTrainerMixin found no rlpace data source: set data.custom_cls to "
                         "RlpaceDataset (verl ≥ 0.8) or data.sampler to RlpaceSampler (verl ≤ 0.7).")

    def _update_actor(self, batch):
        from ._verl_allocation import zero_singleton_advantages
        bridge = self._rlpace()
        fbs = bridge.step(batch, step=self.global_steps)       # observe → admission → weights, one order
        if any(fb.group_sizes is not None for fb, _ in fbs):      # an allocated step
            zero_singleton_advantages(batch, fbs, self.config.algorithm.adv_estimator)
        out = super()._update_actor(batch)
        out.meta_info.setdefault("metrics", {}).update(bridge.metrics())
        out.meta_info["metrics"].update(getattr(self, "_rlpace_supervision_metrics", {}))
        return out

    # -- allocation: N_i rows per prompt sharing its uid (`rlpace.adapters._verl_allocation`) -------
    def _get_gen_batch(self, batch):
        # fit has just given each prompt row its uid; verl repeats `batch` and the generation batch
        # by rollout.n next: with an allocation place both repeat row i N_i times instead
        from ._verl_allocation import allocates, repeat_by_counts
        gen = super()._get_gen_batch(batch)
        bridge = self._rlpace()
        if getattr(self, "_rlpace_validating", False) or not allocates(bridge.scheduler):
            return gen
        nt = batch.non_tensor_batch
        n = int(self.config.actor_rollout_ref.rollout.n)
        alloc = bridge.allocate(nt["uid"], [e["index"] for e in nt["extra_info"]],
                                int(self.config.data.train_batch_size), n)
        for proto in (batch, gen):
            repeat_by_counts(proto, alloc.counts, n)
        return gen

    def _validate(self, *args, **kwargs):
        self._rlpace_validating = True          # validation batches keep verl's val_kwargs.n
        try:
            return super()._validate(*args, **kwargs)
        finally:
            self._rlpace_validating = False

    def _val_metrics_update(self, data_sources, sample_uids, reward_extra_infos_dict, *args, **kwargs):
        # verl's `_validate` hands its per-sample data sources, uids and rewards here (merged
        # validation too): the pilot record's evaluation, written with the next step's line
        self._rlpace().record_eval(data_sources, reward_extra_infos_dict, sample_uids)
        return super()._val_metrics_update(data_sources, sample_uids, reward_extra_infos_dict, *args, **kwargs)

    # -- supervision transforms (`rlpace.adapters._verl_supervision`) ------------------------------
    rlpace_answer_extractor = None   # str -> str | None; None: `_supervision.extract_answer`

    def fit(self):
        """verl's `fit`, with `ray_trainer.extract_reward` wrapped while it runs when the
        Scheduler's method has a target, reward or advantage place: train batches then get
        the supervision transforms before verl reads their rewards (validation batches,
        flagged `meta_info["validate"]`, pass through untouched)."""
        from ._supervision import needs_supervision_pass
        from ._verl_supervision import check_token_signals
        check_verl_internals("legacy_trainer")
        sched = self._rlpace().scheduler
        refuse_gradient_features(sched, allocation=True)
        from ._verl_allocation import allocates, check_legacy_allocation
        if allocates(sched):
            check_legacy_allocation(self._rlpace(), self.config)
        if not needs_supervision_pass(sched):
            out = super().fit()
            self._rlpace().flush_eval()          # the validation after the last step: a line of its own
            return out
        check_token_signals(sched)
        from ._supervision import TOKEN_SIGNALS, needs
        corr = self.config.algorithm.get("rollout_correction", None) or {}
        if needs(sched) & TOKEN_SIGNALS and corr.get("bypass_mode", False):
            raise InputError(f"method {sched.name!r} reads {sorted(needs(sched) & TOKEN_SIGNALS)}, which rlpace takes "
                             f"from verl's old-log-prob pass; algorithm.rollout_correction.bypass_mode=True skips it. "
                             f"Set bypass_mode=False.")
        from verl.trainer.ppo import ray_trainer
        original = ray_trainer.extract_reward

        def extract_reward(batch):
            if not batch.meta_info.get("validate", False):
                self._rlpace_supervise(batch)
            return original(batch)
        ray_trainer.extract_reward = extract_reward
        try:
            out = super().fit()
        finally:
            ray_trainer.extract_reward = original
        self._rlpace().flush_eval()
        return out

    def _rlpace_supervise(self, batch) -> None:
        from ._supervision import extract_answer
        from ._verl_supervision import supervise_batch
        if getattr(self, "_rlpace_reward_manager", None) is None:
            from verl.trainer.ppo.reward import load_reward_manager
            reward = self.config.reward
            if (reward.get("reward_model") or {}).get("enable", False) and \
                    not (reward.get("custom_reward_function") or {}).get("path"):
                raise InputError("rlpace re-verifies rollouts against the Scheduler's targets with verl's reward "
                                 "function; a discriminative reward model (reward.reward_model.enable=True without "
                                 "reward.custom_reward_function.path) has no target to verify against. Use a "
                                 "rule-based reward function.")
            self._rlpace_reward_manager = load_reward_manager(self.config, self.tokenizer)
            check_verl_internals("reward_manager", self._rlpace_reward_manager)
        self._rlpace_supervision_metrics = supervise_batch(
            self._rlpace(), batch, manager=self._rlpace_reward_manager, tokenizer=self.tokenizer,
            step=int(self.global_steps), extractor=self.rlpace_answer_extractor or extract_answer)

    def _balance_batch(self, batch, *args, **kwargs):
        # remember the generation order: batch balancing reorders rows, and a group's first-seen
        # tie rule (TTRL's vote) must read its rollouts as they were sampled
        from ._supervision import needs_supervision_pass
        if needs_supervision_pass(self._rlpace().scheduler):
            batch.non_tensor_batch["rlpace_order"] = np.arange(len(batch))
        return super()._balance_batch(batch, *args, **kwargs)

    def _compute_old_log_prob(self, batch):
        out = super()._compute_old_log_prob(batch)
        if batch.meta_info.get("rlpace_rewards_deferred"):
            from ._verl_supervision import apply_deferred
            old = out[0] if isinstance(out, tuple) else out
            apply_deferred(self._rlpace(), batch, old, step=int(self.global_steps))
        return out

    def _load_checkpoint(self):
        out = super()._load_checkpoint()
        ds, trainer = self.train_dataset, self.config.trainer
        if getattr(ds, "rlpace", None) is not None and self.global_steps > 0:
            folder = (trainer.resume_from_path if trainer.resume_mode == "resume_path" else
                      os.path.join(os.path.abspath(trainer.default_local_dir), f"global_step_{self.global_steps}"))
            path = os.path.join(folder, "data.pt")
            if os.path.exists(path):
                state = load_data_pt(path)
                ds.load_state_dict(state.get("dataset_state", state.get("_dataset_state")) or {})
        return out


def load_data_pt(path: str) -> dict:
    """verl's `data.pt` (a torchdata loader state holding the Scheduler's numpy arrays),
    read with `torch.load(weights_only=True)`: only tensors, containers, scalars and the
    numpy array/dtype reconstructors are unpickled, so a crafted file cannot run code.
    (verl itself reads the file with `weights_only=False`; rlpace does not repeat that.)"""
    import pickle

    import torch
    core = getattr(np, "_core", None) or np.core
    allowed = [core.multiarray._reconstruct, core.multiarray.scalar, np.ndarray, np.dtype]
    allowed += sorted({type(np.dtype(c)) for c in "?bhilqBHILQefdgFDGUS"}, key=str)
    try:
        with torch.serialization.safe_globals(allowed):
            return torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as e:
        raise InputError(f"{path} holds objects other than tensors and numpy arrays, so rlpace refuses to "
                         f"unpickle it (it could run code): {str(e).splitlines()[0]} Resume from a checkpoint "
                         f"written by verl with RlpaceDataset, or delete data.pt to start the data fresh.") from None


def __getattr__(name: str):
    # The sampler and the replay buffer subclass base classes that exist only in some verl
    # releases; import them when verl's loader asks for them (`getattr(module, class_name)`).
    if name == "RlpaceSampler":
        check_verl_version("sampler")
        from ._verl_legacy import RlpaceSampler
        return RlpaceSampler
    if name in ("RlpaceReplayBuffer", "RlpaceReplayBufferAsync"):
        check_verl_version("replay_buffer")
        from . import _verl_v1
        return getattr(_verl_v1, name)
    if name == "RlpaceV1TrainerMixin":
        from ._verl_v1_trainer import RlpaceV1TrainerMixin
        return RlpaceV1TrainerMixin
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
