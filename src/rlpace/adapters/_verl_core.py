"""What every verl entry point shares: the version gate, the pool over verl's dataframe, the
Scheduler named by `data.rlpace`, and `VerlFeedback` (verl batches → `Feedback`). Apart from
`verl.py` so that the legacy sampler and the V1 replay buffer build on it without importing
the module that imports them."""

from __future__ import annotations

from ..errors import InputError
from typing import Any, NamedTuple

import numpy as np
import verl

from ..policies import active_supervision_places
from ..scheduler import Scheduler
from ..types import Pool
from ._convert import admitted_advantages, dataproto_rows, feedbacks_from_rows, scatter_to_rows

# feature -> [lowest, highest) verl release checked against it.
SUPPORTED = {"sampler": ("0.5", "0.8"), "dataset": ("0.8", "0.10"), "replay_buffer": ("0.9", "0.10"),
             "v1_trainer": ("0.9", "0.10")}
_SEEN = "rlpace_observed"   # meta_info flag: this batch's feedback already reached the Scheduler


def check_verl_version(feature: str) -> None:
    """InputError unless the installed verl is in `SUPPORTED[feature]`. A pre-release counts
    as the release it precedes (verl main's `0.10.0.dev0` is a 0.10, outside `< 0.10`, though
    PEP 440 orders it below 0.10: the code it ships is the next release's, not a 0.9)."""
    from packaging.version import Version
    lo, hi = SUPPORTED[feature]
    v = Version(verl.__version__)
    if not (Version(lo) <= v and Version(v.base_version) < Version(hi)):
        alt = {"sampler": "RlpaceDataset (data.custom_cls) on verl ≥ 0.8",
               "dataset": "RlpaceSampler (data.sampler.class_path) on verl 0.5–0.7"}.get(feature, "")
        raise InputError(f"rlpace's verl {feature} supports verl >={lo},<{hi} (releases; a pre-release of {hi} "
                         f"or later is outside it); verl {v} is installed. Install a verl in that range"
                         + (f", or use {alt}." if alt else "."))


# The private parts of verl each adapter path relies on, read from verl 0.9.1 (public hooks
# that would replace them: docs/engines.md, "Coupling"). (module, dotted attribute): the
# module is imported and the attribute looked up; "source:" checks that the module's code
# still writes that text (the trajectory key format). Module None: on the object passed.
_INTERNALS = {
    "replay_buffer": [
        ("verl.trainer.ppo.v1.replay_buffer", "ReplayBuffer._dapo_filtered_keys"),
        # every eviction goes through _clear_groups, which the buffer extends to drop weights
        ("verl.trainer.ppo.v1.replay_buffer", "ReplayBuffer._clear_groups"),
        ("verl.trainer.ppo.v1.replay_buffer", "source:self._clear_groups(partition_id, evicted_uids)"),
        ("verl.trainer.ppo.v1.replay_buffer", "source:self._clear_groups(partition_id, surplus_uids)"),
        ("verl.trainer.ppo.v1.replay_buffer", "tq.kv_batch_get"),
        ("verl.trainer.ppo.v1.replay_buffer", "tq.kv_batch_put"),
        ("verl.trainer.ppo.v1.replay_buffer", "tq.kv_clear"),
        ("verl.trainer.ppo.v1.agent_loop_tq", 'source:f"{uid}_{session_id}_{i}"'),
    ],
    "replay_buffer_state": [(None, "_dapo_classification_cache"), (None, "finished_keys"), (None, "partitions"),
                            (None, "prompt_global_steps")],
    "v1_trainer": [
        ("verl.trainer.ppo.v1.trainer_base", "PPOTrainer._compute_advantage"),
        ("verl.trainer.ppo.v1.trainer_base", "PPOTrainer._compute_old_log_prob"),
        ("verl.trainer.ppo.v1.trainer_base", "PPOTrainer._init_dataloader"),
        ("verl.trainer.ppo.v1.trainer_base", "PPOTrainer._add_prompts_to_generate"),
        ("verl.trainer.ppo.v1.trainer_base", "PPOTrainer._submit_batch_to_rollout"),
        ("verl.trainer.ppo.v1.agent_loop_tq", 'source:prompt.pop("__rollout_n__"'),
        ("verl.trainer.ppo.v1.trainer_base", "tq.kv_batch_get"),
        ("verl.trainer.ppo.v1.trainer_base", "tq.kv_batch_put"),
    ],
    "legacy_trainer": [
        ("verl.trainer.ppo.ray_trainer", "extract_reward"),
        ("verl.trainer.ppo.ray_trainer", "RayPPOTrainer._update_actor"),
        ("verl.trainer.ppo.ray_trainer", "RayPPOTrainer._compute_old_log_prob"),
        ("verl.trainer.ppo.ray_trainer", "RayPPOTrainer._balance_batch"),
        ("verl.trainer.ppo.ray_trainer", "RayPPOTrainer._load_checkpoint"),
        ("verl.trainer.ppo.ray_trainer", "RayPPOTrainer._get_gen_batch"),
        ("verl.trainer.ppo.ray_trainer", "RayPPOTrainer._validate"),
    ],
    "reward_manager": [(None, "loop.run_until_complete"), (None, "run_single")],
}


def check_verl_internals(feature: str, obj: Any = None) -> None:
    """InputError naming the first private verl name in `_INTERNALS[feature]` that the installed
    verl lacks, so that a renamed internal fails at start-up instead of being skipped or
    failing mid-run. `obj`: the object whose attributes the (None, name) entries check."""
    import importlib
    import inspect
    for module, path in _INTERNALS[feature]:
        if path.startswith("source:"):
            found = path[len("source:"):] in inspect.getsource(importlib.import_module(module))
        else:
            target, found = obj if module is None else importlib.import_module(module), True
            for part in path.split("."):
                if not hasattr(target, part):
                    found = False
                    break
                target = getattr(target, part)
        if not found:
            where = f"{module}.{path}" if module else f"{type(obj).__name__}.{path}"
            lo, hi = SUPPORTED.get(feature, SUPPORTED["replay_buffer"] if feature.startswith("replay") else
                                   SUPPORTED["dataset"])
            raise InputError(f"rlpace's verl adapter relies on verl's {where!r} ({feature}), which verl "
                             f"{verl.__version__} no longer has: rlpace was checked against verl >={lo},<{hi}. "
                             f"Install a verl in that range.")


def refuse_gradient_features(sched, allocation: bool = False) -> None:
    """InputError when a policy reads per-rollout gradient features (`diem`, `dvc`: "grads",
    "ref_grad"): verl's actor computes gradients inside its FSDP/Megatron workers and returns no
    per-rollout features, and without them such a policy would silently weigh every rollout 1.
    Also when the method has an allocation place and the caller's path does not apply it
    (`allocation=False`: only `RlpaceTrainerMixin` and rlpace's V1 trainer change the number of
    rollouts per prompt; verl's own trainers repeat every prompt `rollout.n` times)."""
    from ..scheduler import FEATURE_SIGNALS
    from ._supervision import needs
    from ._verl_allocation import allocates
    if allocates(sched) and not allocation:
        raise InputError(f"method {sched.name!r} has an allocation place ({sched.method.allocation.name!r}: rollouts "
                         f"per prompt), which verl's own trainers do not apply (they repeat every prompt "
                         f"actor_rollout_ref.rollout.n times): run examples/verl_legacy_trainer.py "
                         f"(RlpaceTrainerMixin) or examples/verl_v1_trainer.py (trainer.v1.trainer_mode=rlpace_sync, "
                         f"...), or use a method without allocation.")
    read = sorted(needs(sched) & FEATURE_SIGNALS)
    if read:
        raise InputError(f"method {sched.name!r} reads {read} (per-rollout gradient features), which verl's actor "
                         f"workers do not return (they compute gradients inside FSDP/Megatron): use "
                         f"RlpaceGRPOTrainer (TRL), which computes them, or a method that does not read them.")


def pool_from_dataframe(df, *, domain_key: str = "data_source") -> Pool:
    """A `Pool` over the rows of verl's (filtered) dataframe: domain = `data_source`, stable
    id = `extra_info.index` (required and unique: verl silently defaults a missing index to
    0), optional `cluster_id` / `rank_in_cluster` / `difficulty` columns."""
    names = set(df.column_names)
    for col in (domain_key, "extra_info"):
        if col not in names:
            raise InputError(f"the training data has no {col!r} column; rlpace needs {domain_key} and "
                             f"extra_info.index (verl's schema). Add it to the parquet.")
    extra = df["extra_info"]
    missing = [i for i, e in enumerate(extra) if not isinstance(e, dict) or e.get("index") is None]
    if missing:
        raise InputError(f"extra_info.index is missing in {len(missing)} rows (first rows: {missing[:5]}); "
                         f"verl would default it to 0. Write a unique extra_info.index per prompt.")
    optional = [c for c in ("cluster_id", "rank_in_cluster", "difficulty") if c in names]
    records = [{domain_key: d, "extra_info": e} for d, e in zip(df[domain_key], extra)]
    for c in optional:
        for r, v in zip(records, df[c]):
            r[c] = v
    return Pool.from_records(records, domain_key=domain_key)


def _plain(x: Any) -> Any:
    try:
        from omegaconf import OmegaConf
        return OmegaConf.to_container(x, resolve=True) if OmegaConf.is_config(x) else x
    except ImportError:  # pragma: no cover
        return x


def _kwargs(value) -> dict:
    """data.rlpace.kwargs: a mapping (Hydra parsed it), or a string a launcher quoted: JSON or
    Hydra's flow style ('{temperature:0.1}'), read by rlpace's one parser."""
    if isinstance(value, str):
        from .._flow import parse_mapping
        return parse_mapping(value, "data.rlpace.kwargs")
    return dict(value or {})


def feedback_from_config(pool: Pool, data_config) -> "VerlFeedback":
    """The Scheduler named by `data.rlpace` (`policy`, `kwargs`, `seed`, `success_threshold`,
    `reward_key`), wrapped in a `VerlFeedback`; `budget` (rollouts per batch of
    `data.train_batch_size` prompts for an allocation place, default B·rollout.n) and `record`
    (the pilot record's path, `rlpace.advise.PilotRecorder`; `record_reward_range`, default
    [0, 1], the rewards it declares) go with it."""
    cfg = _plain(data_config.get("rlpace", None)) or {}
    valid = ("policy", "kwargs", "seed", "success_threshold", "reward_key", "budget", "record", "record_reward_range")
    unknown = sorted(set(cfg) - set(valid))
    if unknown:
        raise InputError(f"unknown data.rlpace keys {unknown}; valid: {', '.join(valid)}.")
    seed = cfg.get("seed", data_config.get("seed", None))
    thr = float(cfg.get("success_threshold", 0.5))
    sched = Scheduler(pool, cfg.get("policy", "uniform"), seed=0 if seed is None else int(seed),
                      success_threshold=thr, **_kwargs(cfg.get("kwargs")))
    budget = cfg.get("budget", None)
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
        raise InputError(f"data.rlpace.budget must be a positive int (rollouts per batch of data.train_batch_size "
                         f"prompts); got {budget!r}.")
    record = None
    if cfg.get("record"):
        rng = cfg.get("record_reward_range", None) or (0.0, 1.0)
        try:
            lo, hi = (float(x) for x in rng)
        except (TypeError, ValueError):
            lo, hi = float("nan"), float("nan")
        if not (np.isfinite(lo) and np.isfinite(hi) and lo < hi and lo <= thr <= hi):
            raise InputError(f"data.rlpace.record_reward_range must be [low, high] with low < high around "
                             f"success_threshold {thr}; got {rng!r}. Give the range your reward_key's values lie in.")
        record = _RecordSpec(str(cfg["record"]), (lo, hi), thr)
    return VerlFeedback(sched, reward_key=cfg.get("reward_key", "acc"), budget=budget, record=record)


class _RecordSpec(NamedTuple):
    path: str
    reward_range: tuple
    success_threshold: float


def _check_loader_config(data_config) -> None:
    """The dataloader settings index indirection needs, checked before any data is read."""
    if data_config.get("shuffle", True):
        raise InputError("data.shuffle must be False with rlpace: the Scheduler chooses the prompts, "
                         "a shuffling sampler would only hide that. Set data.shuffle=False.")
    if data_config.get("dataloader_num_workers", 8) != 0:
        raise InputError("data.dataloader_num_workers must be 0 with rlpace: worker processes hold "
                         "copies of the Scheduler that never see feedback, and prefetch ahead of it. "
                         "Set data.dataloader_num_workers=0.")
    sampler = data_config.get("sampler", None) or {}
    if "rlpace" in str(sampler.get("class_path", None) or ""):
        raise InputError("data.sampler.class_path is ignored by verl ≥ 0.8; remove it and keep "
                         "data.custom_cls=RlpaceDataset.")


class VerlFeedback:
    """The Scheduler plus the verl-batch translation that the sampler, the dataset, the
    trainer mixin and the V1 replay buffer share.

    `observe(batch)` groups rows by `uid`, maps `extra_info.index` to pool positions and
    calls `Scheduler.observe` once (a batch already observed is skipped, so verl's own
    hook and the trainer mixin can both fire); the Feedback carries `group_advantages` of
    the rewards, never verl's advantages (one scale for every policy, whatever
    `algorithm.adv_estimator`). `apply_admission` removes the rollouts `Scheduler.admit`
    drops from the loss (their `response_mask` row is zeroed, advantage 0) and gives a
    group that keeps a strict subset (PODS) `kept_group_advantages` of its kept rewards
    (full-group advantages under `topk`; `_convert.admitted_advantages`); groups kept whole
    keep verl's advantages. `scale_advantages` writes the Scheduler's
    loss weights into `batch.batch["advantages"]`: for weights w ≥ 0 the PPO/GRPO clipped
    surrogate is positively homogeneous in A, so −min(r·wA, clip(r)·wA) = w·(−min(rA, clip(r)A))
    exactly, and verl's `rollout_is_weights` (rollout correction) still multiplies on top.
    """

    def __init__(self, scheduler: Scheduler, reward_key: str | None = "acc", budget: int | None = None,
                 record=None):
        self.scheduler, self.reward_key, self.budget, self.record = scheduler, reward_key, budget, record
        self.allocated: dict[str, Any] = {}   # uid -> Allocation of the submitted batches not yet observed
        self.record_lines = 0                 # batch lines this run's pilot record holds
        self._recorder, self._record_keep, self._allocation_applied = None, None, False
        self._eval_pending, self._last_step = None, None   # record: a validation awaiting its line; last line's step
        self.zero_singletons = False          # V1: a one-rollout group trains on weight 0 (set by rlpace's V1 trainer)
        self.v1_buffer = None                 # V1: the replay buffer deciding groups for this Scheduler (saved with it)
        self.v1_restored = None               # V1: that buffer's state read from data.pt, until the buffer takes it

    # -- allocation (`rlpace.adapters._verl_allocation`) ----------------------------------------
    def allocate(self, uids, prompt_ids, prompts_per_batch: int, n: int, *, keep_zero: bool = True):
        """`Scheduler.allocate` of one submitted batch (budget: `data.rlpace.budget` per
        `prompts_per_batch` prompts, else rollout.n each), remembered by uid until observed
        (prompts allocated 0 only with `keep_zero`: the legacy Feedback lists them, with size 0)."""
        from ._verl_allocation import allocate_prompts, step_budget
        budget = step_budget(self.budget, len(uids), n, prompts_per_batch)
        alloc = allocate_prompts(self.scheduler, uids, prompt_ids, budget)
        for u, k in zip(alloc.uids, alloc.counts):
            if k or keep_zero:
                self.allocated[str(u)] = alloc
        return alloc

    def _allocation_of(self, uids, whole: bool = True) -> Any:
        """The allocation of the prompts `uids` (None when none was allocated), as one Allocation:
        every prompt of the submissions they belong to (`whole`: a legacy step, whose prompts
        allocated 0 have no rows) or those uids only (V1: groups finish one by one); forgotten
        once taken."""
        from ._verl_allocation import Allocation
        touched = {id(a): a for a in (self.allocated.get(str(u)) for u in uids) if a is not None}
        if not touched:
            return None
        want = None if whole else {str(u) for u in uids}
        parts = []
        for a in touched.values():
            sel = np.array([str(u) in self.allocated and (want is None or str(u) in want) for u in a.uids], bool)
            parts.append(Allocation(*(f[sel] for f in a)))
        alloc = Allocation(*(np.concatenate(f) for f in zip(*parts)))
        for u in alloc.uids:
            self.allocated.pop(str(u), None)
        return alloc

    def allocation_state(self) -> list:
        """The allocations of submitted prompts not yet observed, as plain lists (one entry per
        submission): what `data.pt` carries beside the Scheduler's state. verl's async V1 modes
        checkpoint TransferQueue, and a resumed run finds there the prompts generated ahead of
        training (finished, or re-issued with the `__rollout_n__` written at submission); without
        their allocations it would observe them as even groups of whatever size they have."""
        out, seen = [], set()
        for a in self.allocated.values():
            if id(a) in seen:
                continue
            seen.add(id(a))
            sel = np.array([self.allocated.get(str(u)) is a for u in a.uids], bool)
            out.append({"uids": [str(u) for u in a.uids[sel]],
                        "prompt_ids": [x.item() if hasattr(x, "item") else x for x in a.prompt_ids[sel]],
                        "positions": a.positions[sel].tolist(), "counts": a.counts[sel].tolist()})
        return out

    def restore_allocation(self, state) -> None:
        """Take `allocation_state()`'s lists back (a resumed run; None or [] = none pending)."""
        from ._verl_allocation import Allocation
        self.allocated = {}
        for e in state or ():
            a = Allocation(np.asarray(e["uids"], dtype=object), np.asarray(e["prompt_ids"], dtype=object),
                           np.asarray(e["positions"], dtype=np.int64), np.asarray(e["counts"], dtype=np.int64))
            for u in a.uids:
                self.allocated[str(u)] = a

    def feedbacks(self, rows, step: int, finished=None) -> list:
        """[(Feedback, rows int64[B, G])] of engine rows; one ragged Feedback (`group_sizes`, row
        index −1 on padding) when they were allocated. `finished`: V1's finished uids (only those
        prompts' allocations are taken), None: a legacy step's batch (its whole submission)."""
        alloc = self._allocation_of(rows.group_keys if finished is None else finished, whole=finished is None)
        self._allocation_applied = alloc is not None
        if alloc is not None:
            from ._verl_allocation import ragged_feedback
            return [ragged_feedback(self.scheduler.pool, rows, alloc, step=step)]
        return feedbacks_from_rows(self.scheduler.pool, rows, step=step)

    # -- pilot record (`rlpace.advise.PilotRecorder`) --------------------------------------------
    def write_record(self, fb) -> None:
        """Append `fb` (what the Scheduler just observed) to the pilot record, when one is set.
        The first write of a run starts the file afresh, or, after `restore_record(n)`, keeps its
        header and first n batch lines (what the checkpoint's Scheduler had observed)."""
        if self.record is None or fb.batch_size == 0:
            return
        sizes = fb.group_sizes
        self._open_record().write(fb, rollouts=int(fb.rewards.size if sizes is None else sizes.sum()),
                                  eval=self._eval_pending)
        self._eval_pending, self._last_step = None, int(fb.step)
        self.record_lines += 1

    def _open_record(self):
        if self._recorder is None:
            from ..advise._record import PilotRecorder
            _truncate_record(self.record.path, self._record_keep)
            self._recorder = PilotRecorder(self.record.path, self.scheduler.pool, reward_range=self.record.reward_range,
                                           success_threshold=self.record.success_threshold)
        return self._recorder

    def record_eval(self, data_sources, reward_extra_infos_dict: dict, sample_uids=None) -> None:
        """A validation for the pilot record, from what verl's `_val_metrics_update` receives
        (one entry per validation sample): each sample succeeds when its `reward_key` value
        (else its sequence score, `reward`: `chosen_rewards`' rule) is ≥ success_threshold;
        `acc_mean` is the share of successes, `acc` the share per data source, `n` the held-out
        prompts per data source: distinct `sample_uids` (verl repeats a prompt's uid for its
        `val_kwargs.n` samples), absent without one uid per sample. It goes with the next line
        written; an earlier validation no line followed is written alone first."""
        if self.record is None:
            return
        from ._convert import eval_summary
        score = list(reward_extra_infos_dict.get("reward", []))
        own = list(reward_extra_infos_dict.get(self.reward_key, [])) if self.reward_key else []
        value = [o if o is not None else r for o, r in zip(own, score)] if own else score
        if not value:
            return
        if self._eval_pending is not None:
            self.flush_eval()
        thr = self.record.success_threshold
        uids = list(sample_uids) if sample_uids is not None else []
        uids = [str(u) for u in uids] if len(uids) == len(value) else [None] * len(value)
        self._eval_pending = eval_summary([(float(v) >= thr, str(d), u)
                                           for v, d, u in zip(value, data_sources, uids)])

    def flush_eval(self) -> None:
        """Write the validation no line followed (the one after the last step) as a line of its
        own, at the step a next batch would have: the last line's step + 1."""
        if self.record is None or self._eval_pending is None:
            return
        step = 0 if self._last_step is None else self._last_step + 1
        self._open_record().write_eval(step, self._eval_pending)
        self._eval_pending = None

    def restore_record(self, lines: int) -> None:
        """A resumed run: its record keeps the header and the first `lines` batch lines."""
        self._recorder, self._record_keep, self.record_lines = None, int(lines), int(lines)

    def _feedbacks(self, batch, step: int | None) -> list:
        """[(Feedback, rows int64[B, G])] of the batch's groups; [] when already observed. An
        allocated batch gives one ragged Feedback (`group_sizes`, rows −1 on padding)."""
        if batch.meta_info.get(_SEEN):
            return []
        s = int(self.scheduler.counters.observations) if step is None else int(step)
        return self.feedbacks(dataproto_rows(batch, self.reward_key), s)

    def observe(self, batch, step: int | None = None) -> list:
        """`Scheduler.observe` of the batch's groups (verl's own hook: no admission, no weights)."""
        fbs = self._feedbacks(batch, step)
        if fbs and not self._allocation_applied:
            from ._verl_allocation import allocates
            if allocates(self.scheduler):
                raise InputError(f"method {self.scheduler.name!r} has an allocation place, which verl's own legacy "
                                 f"trainer does not apply: run examples/verl_legacy_trainer.py (RlpaceTrainerMixin).")
        for fb, _ in fbs:
            self.scheduler.observe(fb)
            self.write_record(fb)
        batch.meta_info[_SEEN] = True
        return fbs

    def step(self, batch, step: int | None = None) -> list:
        """One `Scheduler.step` per set of groups (observe → admission → weights, validated
        once), written into the batch: admission, then loss weights, then advantage weights
        (the last only with an advantage place). Returns [(Feedback, rows)]."""
        fbs = self._feedbacks(batch, step)
        results = []
        for fb, _ in fbs:
            results.append(self.scheduler.step(fb))
            self.write_record(fb)
        batch.meta_info[_SEEN] = True
        if fbs and "advantages" in batch.batch.keys():
            # a ragged Feedback's results, one rectangular part per group size (padding left out)
            parts = [(sub, rows[r, :sub.group_size], res, r, sub.group_size)
                     for (fb, rows), res in zip(fbs, results) for r, sub in fb.by_size()]
            self._admit_rows(batch, [(sub, idx, res.keep[r, :n], res.full_group_advantages)
                                     for sub, idx, res, r, n in parts])
            _scale_rows(batch, [(idx, res.weights[r, :n]) for sub, idx, res, r, n in parts])
            if active_supervision_places(self.scheduler.method):
                _scale_rows(batch, [(idx, res.advantage_weights[r, :n]) for sub, idx, res, r, n in parts])
        return fbs

    def apply_admission(self, batch, fbs: list) -> None:
        """`Scheduler.admit` of each (Feedback, rows) written into the batch (see the class)."""
        if fbs and "advantages" in batch.batch.keys():
            decided = [(fb, rows, self.scheduler.admission(fb)) for fb, rows in fbs]
            self._admit_rows(batch, [(fb, rows, a.keep, a.full_group_advantages) for fb, rows, a in decided])

    def _admit_rows(self, batch, decided: list) -> None:
        import torch
        n = len(batch)
        replace, value, kept = np.zeros(n, bool), np.zeros(n), np.ones(n, bool)
        for fb, rows, keep, full in decided:                                  # keep: bool[B, G]
            if keep.all():
                continue
            rep, val = admitted_advantages(fb.rewards, keep, full)
            replace[rows[rep]] = True
            value[rows[rep]] = val[rep]
            kept[rows[~keep]] = False
        if not replace.any():
            return
        adv, mask = batch.batch["advantages"], batch.batch["response_mask"]
        new = adv.new_tensor(value).unsqueeze(-1) * mask.to(adv.dtype)       # one scalar per sequence
        batch.batch["advantages"] = torch.where(torch.as_tensor(replace).unsqueeze(-1).to(adv.device), new, adv)
        batch.batch["response_mask"] = mask * mask.new_tensor(kept).unsqueeze(-1)

    def scale_advantages(self, batch, fbs: list) -> None:
        """Multiply `advantages` by `Scheduler.loss_weights` of each (Feedback, rows)."""
        if fbs and "advantages" in batch.batch.keys():
            _scale_rows(batch, [(rows, self.scheduler.loss_weights(fb)) for fb, rows in fbs])

    def weight_advantages(self, batch, fbs: list) -> None:
        """Multiply `advantages` by `Scheduler.advantage_weights` (DE-Venus's Ã = w·Â, w ∈ [0, 1])
        when the method has an advantage place (a Scheduler without one is left alone)."""
        if fbs and "advantages" in batch.batch.keys() and active_supervision_places(self.scheduler.method):
            _scale_rows(batch, [(rows, self.scheduler.advantage_weights(fb)) for fb, rows in fbs])

    def metrics(self) -> dict[str, float]:
        return {f"rlpace/{k}": v for k, v in self.scheduler.metrics().items()}


def _truncate_record(path: str, keep: int | None) -> None:
    """Start the pilot record at `path` afresh (keep None), or keep its header and first `keep`
    batch lines (a resumed run: the lines the restored Scheduler had observed)."""
    import os
    if not os.path.exists(path):
        return
    if keep is None:
        open(path, "w").close()
        return
    with open(path, encoding="utf-8") as f:
        lines = [ln for ln in f.read().splitlines() if ln.strip()]
    import json
    batch = np.array([i > 0 and "rewards" in json.loads(ln) for i, ln in enumerate(lines)])   # not evaluations alone
    end = int(np.flatnonzero(batch)[int(keep) - 1]) + 1 if 0 < int(keep) <= int(batch.sum()) else 1
    kept = lines[:end]
    if int(batch.sum()) < int(keep):
        raise InputError(f"the pilot record {path} holds {int(batch.sum())} batch lines but the checkpoint was written "
                         f"after {keep}: it is not this run's record. Point data.rlpace.record at this run's file.")
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(ln + "\n" for ln in kept))


def _scale_rows(batch, weighted: list) -> None:
    """Multiply each row's `advantages` by its weight: `weighted` = [(rows int64[B, G],
    weights float64[B, G])], scattered to the batch's rows (1 elsewhere); untouched when every
    weight is 1. For w ≥ 0 the clipped surrogate is positively homogeneous in A (class docstring)."""
    n = len(batch)
    w = np.ones(n)
    for rows, weights in weighted:
        w *= scatter_to_rows(weights, rows, n)
    if not np.all(w == 1.0):
        adv = batch.batch["advantages"]
        batch.batch["advantages"] = adv * adv.new_tensor(w).unsqueeze(-1)
