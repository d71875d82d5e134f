"""rlpace inside TRL: `RlpaceGRPOTrainer`, a `GRPOTrainer` whose prompts come from a Scheduler.

* Prompts: `_get_train_sampler` returns a `SchedulerRepeatSampler` with `RepeatSampler`'s
  layout and length (B = generation_batch_size // G prompts per chunk, each index G times
  in a row, each chunk `num_iterations × steps_per_generation` times); every rank holds
  an identical replica, so accelerate's shards agree.
* Feedback: after TRL scores a generation batch (`_generate_and_score_completions`), the
  gathered rewards (weighted sum over reward functions, as TRL computes it) reach
  `Scheduler.observe` on every rank, in the same order, with `rlpace.group_advantages` of
  those rewards as the advantages (one definition whatever TRL's `scale_rewards`,
  `loss_type` or multi-objective aggregation: A = (r − mean) / (population std + 1e-6)).
* Admission: `Scheduler.admit` decides which rollouts enter the loss. A dropped rollout's
  `completion_mask` row is zeroed (no policy or KL term, not in `num_items_in_batch`) and
  its advantage set to 0; a group that keeps a strict subset (PODS) trains on
  `rlpace.kept_group_advantages(rewards, keep)`, GRPO advantages of the kept rollouts
  only. Groups kept whole keep TRL's advantages. (`loss_type` "grpo"/"sapo"/"luspo"
  average per sequence over the whole micro-batch, so dropped rows still count in that
  mean; "dapo", "bnpo", "cispo" and "vespo" normalise by tokens and exclude them.)
* Lag: the sampler draws a chunk when the dataloader first asks for one of its rows, and
  the loops ahead of training decide when that is. With A = gradient_accumulation_steps and
  R = steps_per_generation × num_iterations (dataloader batches per chunk): transformers'
  `_inner_training_loop` collects the A batches of an optimizer step (`get_batch_samples`)
  before training on any of them, and accelerate's `DataLoaderShard` fetches one batch
  beyond the one it yields. At the start of optimizer step u, batches up to (u+1)·A are
  fetched while only the chunks generated before batch u·A are scored; TRL generates chunk
  j at batch j·R (`_prepare_inputs`). Chunk j is therefore drawn with ⌈u·A/R⌉ chunks
  scored, u = max(0, ⌈jR/A⌉ − 1), and the number not yet scored is at most ⌊A/R⌋ (reached
  at j = ⌊A/R⌋). The sampler makes that lag fixed instead of timing-dependent: chunk j is
  always proposed right after the feedback of chunk j−1−lag, lag = A // R (A=1, R=1: 1;
  TRL's default R = A: 1; A=2, R=1: 2; R > A: 0). `zero_lag=True` instead proposes inside
  `_generate_and_score_completions`, after the previous chunk's feedback, and swaps the
  prefetched rows (the sampler then yields placeholders).
* Checkpoints: `rlpace_scheduler.npz` in each `checkpoint-N/` holds the Scheduler state and
  the proposed-but-unscored chunks; `train(resume_from_checkpoint=...)` restores both, so
  the resumed run proposes the uninterrupted run's chunks. Requires `ignore_data_skip`
  (set by the trainer: HF's skip would re-draw chunks from the sampler).
* Loss weights (`loss_weights=True`): advantages are multiplied by `Scheduler.loss_weights`;
  for w ≥ 0 the clipped surrogate is positively homogeneous in A, so this equals weighting
  each sequence's policy loss (the KL term, if any, is not weighted).

Private overrides (checked against trl 1.16.0; `SUPPORTED_TRL`): `_get_train_sampler`,
`_calculate_rewards`, `_generate_and_score_completions`, `_save_checkpoint`,
`_load_optimizer_and_scheduler` — each calls `super()` and adds a few lines.
"""

from __future__ import annotations

import inspect
import os
from collections import deque

import numpy as np

from ..scheduler import Scheduler
from ..types import Feedback, Pool, group_advantages, kept_group_advantages

try:
    import torch
    import trl
    from accelerate.utils import gather_object
    from torch.utils.data import Sampler
    from trl import GRPOTrainer
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("rlpace.adapters.trl needs trl: pip install 'rlpace[trl]'") from e

__all__ = ["RlpaceGRPOTrainer", "SchedulerRepeatSampler", "lookahead_chunks", "pool_from_dataset",
           "SUPPORTED_TRL", "STATE_FILE"]

SUPPORTED_TRL = ("1.10", "1.17")   # [lowest, highest) trl release checked
STATE_FILE = "rlpace_scheduler.npz"


def pool_from_dataset(dataset, *, domain_column: str = "data_source", id_column: str = "index") -> Pool:
    """A `Pool` over a `datasets.Dataset`: position = row, domain and stable id from columns."""
    for col in (domain_column, id_column):
        if col not in dataset.column_names:
            raise ValueError(f"the train dataset has no {col!r} column; add it (a domain label and a "
                             f"unique stable id per prompt), or name the column that holds it.")
    return Pool(dataset[domain_column], ids=dataset[id_column])


def lookahead_chunks(gradient_accumulation_steps: int, batches_per_chunk: int) -> int:
    """Chunks the dataloader draws before the previous ones are scored: A // R.

    A = gradient_accumulation_steps, R = steps_per_generation × num_iterations. transformers
    fetches an optimizer step's A batches, plus accelerate's one read-ahead, before training
    on the first; chunk j starts at batch j·R (derivation in the module docstring).

    >>> [lookahead_chunks(a, r) for a, r in [(1, 1), (2, 2), (2, 1), (4, 2), (3, 2), (2, 4)]]
    [1, 1, 2, 2, 1, 0]
    """
    a, r = int(gradient_accumulation_steps), int(batches_per_chunk)
    if a < 1 or r < 1:
        raise ValueError(f"gradient_accumulation_steps ({a}) and steps_per_generation × num_iterations ({r}) "
                         f"must be ≥ 1.")
    return a // r


class SchedulerRepeatSampler(Sampler[int]):
    """`RepeatSampler`'s index layout, with chunks proposed by a Scheduler at fixed points.

    Chunks proposed but not yet scored wait in `queue`; the dataloader is handed them in
    order. After the feedback of a chunk arrives (`scored`), the next chunk is proposed,
    so chunk j always sees the feedback of chunks 0..j−1−lag whatever the prefetching.

    Args:
        scheduler: the Scheduler (its pool positions map to dataset rows by `rows`).
        rows: int64[N] dataset row of each pool position.
        batch_size: B distinct proposals per chunk; mini_repeat_count: G; repeat_count: R.
        num_batches: chunks per epoch (fixes `len`, hence TRL's steps per epoch).
        lag: chunks proposed ahead of the feedback (`lookahead_chunks`); placeholder: yield
            row 0 (zero-lag mode).
    """

    def __init__(self, scheduler: Scheduler, rows: np.ndarray, batch_size: int, mini_repeat_count: int,
                 repeat_count: int, num_batches: int, lag: int, placeholder: bool = False):
        self.scheduler, self.rows = scheduler, rows
        self.b, self.g, self.r, self.num_batches = batch_size, mini_repeat_count, repeat_count, num_batches
        self.lag, self.placeholder = lag, placeholder
        self.queue: deque[np.ndarray] = deque()   # proposed, not yet scored (pool positions)
        self.handed = 0                           # how many of `queue` the dataloader has taken
        self.primed = False

    def __len__(self) -> int:
        return self.num_batches * self.b * self.g * self.r

    def _next_chunk(self) -> np.ndarray:
        if self.placeholder:
            return np.zeros(self.b, dtype=np.int64)
        if not self.primed:
            self.queue.extend(self.scheduler.propose(self.b) for _ in range(self.lag + 1))
            self.primed = True
        if self.handed >= len(self.queue):
            raise RuntimeError(f"the dataloader asked for a chunk more than {self.lag} chunk(s) ahead of the "
                               f"last feedback, the look-ahead of transformers' loop this sampler was built for "
                               f"(gradient_accumulation_steps // (steps_per_generation × num_iterations)); "
                               f"something reads further ahead: set dataloader_num_workers=0, or pass "
                               f"zero_lag=True to RlpaceGRPOTrainer.")
        self.handed += 1
        return self.rows[self.queue[self.handed - 1]]

    def __iter__(self):
        for _ in range(self.num_batches):
            chunk = self._next_chunk()
            for _ in range(self.r):
                for i in chunk:
                    for _ in range(self.g):
                        yield int(i)

    def scored(self, positions: np.ndarray) -> None:
        """The oldest handed chunk was generated and scored: drop it, propose the next."""
        if self.placeholder:
            return
        if not self.queue or self.handed == 0 or not np.array_equal(self.queue[0], positions):
            raise RuntimeError(f"scored prompts {positions.tolist()} are not the oldest proposed chunk "
                               f"{self.queue[0].tolist() if self.queue else []}: the batch layout was changed.")
        self.queue.popleft()
        self.handed -= 1
        self.queue.append(self.scheduler.propose(self.b))

    def state_dict(self) -> dict[str, np.ndarray]:
        q = np.stack(self.queue) if self.queue else np.zeros((0, self.b), np.int64)
        return {"sampler/queue": q, "sampler/primed": np.array(self.primed)}

    def load_state_dict(self, state) -> None:
        queue, primed = np.asarray(state["sampler/queue"], dtype=np.int64), bool(state["sampler/primed"])
        if primed and not self.placeholder and len(queue) != self.lag + 1:
            # the queue always holds lag + 1 chunks once primed (one proposed per feedback)
            raise ValueError(f"the checkpoint's sampler looks {len(queue) - 1} chunk(s) ahead, this run {self.lag} "
                             f"(gradient_accumulation_steps // (steps_per_generation × num_iterations)): resume "
                             f"with the gradient_accumulation_steps, steps_per_generation and num_iterations "
                             f"the checkpoint was trained with.")
        self.queue, self.primed, self.handed = deque(queue), primed, 0


class RlpaceGRPOTrainer(GRPOTrainer):
    """`GRPOTrainer` with prompts proposed by `scheduler` and feedback returned to it.

    Args (besides GRPOTrainer's; pass `args` and `train_dataset` by keyword):
        scheduler: a `Scheduler` whose pool's ids are the dataset's `id_column`
            (`pool_from_dataset(train_dataset)` builds one).
        id_column: dataset column with each prompt's stable id.
        zero_lag: propose each chunk at generation time (after the previous feedback).
        loss_weights: multiply advantages by `scheduler.loss_weights`.

    Example:
        >>> pool = pool_from_dataset(ds)                                # doctest: +SKIP
        >>> trainer = RlpaceGRPOTrainer(model=m, reward_funcs=f, args=cfg, train_dataset=ds,
        ...                             scheduler=Scheduler(pool, "dump", seed=0))  # doctest: +SKIP
    """

    def __init__(self, *args, scheduler: Scheduler, id_column: str = "index", zero_lag: bool = False,
                 loss_weights: bool = False, **kwargs):
        from packaging.version import Version
        if not Version(SUPPORTED_TRL[0]) <= Version(trl.__version__) < Version(SUPPORTED_TRL[1]):
            raise ValueError(f"RlpaceGRPOTrainer supports trl >={SUPPORTED_TRL[0]},<{SUPPORTED_TRL[1]}; "
                             f"trl {trl.__version__} is installed. Install a trl in that range.")
        bound = inspect.signature(GRPOTrainer.__init__).bind(self, *args, **kwargs).arguments
        cfg, ds = bound.get("args"), bound.get("train_dataset")
        if ds is None or not hasattr(ds, "column_names") or not hasattr(ds, "select"):
            raise ValueError("train_dataset must be a map-style datasets.Dataset: the Scheduler picks rows "
                             "by index (an IterableDataset cannot be indexed).")
        if cfg is not None and cfg.dataloader_num_workers != 0:
            raise ValueError("dataloader_num_workers must be 0 with RlpaceGRPOTrainer (workers prefetch "
                             "ahead of the feedback). Set GRPOConfig(dataloader_num_workers=0).")
        if id_column not in ds.column_names:
            raise ValueError(f"train_dataset has no {id_column!r} column; pass id_column=... naming the "
                             f"column with each prompt's stable id.")
        mismatch = (f"the Scheduler's pool ({len(scheduler.pool)} prompts) is not the train dataset "
                    f"({len(ds)} rows, column {id_column!r}); build it with pool_from_dataset(ds)")
        try:
            pos = scheduler.pool.index_of(ds[id_column])
        except ValueError as e:
            raise ValueError(f"{mismatch}: {e}") from None
        if len(pos) != len(scheduler.pool) or len(np.unique(pos)) != len(pos):
            raise ValueError(mismatch + ".")
        super().__init__(*args, **kwargs)
        self.scheduler, self.rlpace_id_column = scheduler, id_column
        self.rlpace_zero_lag, self.rlpace_loss_weights = zero_lag, loss_weights
        rows = np.empty(len(pos), dtype=np.int64)
        rows[pos] = np.arange(len(pos))
        b = self.args.generation_batch_size // self.num_generations
        r = self.num_iterations * self.args.steps_per_generation
        self.rlpace_sampler = SchedulerRepeatSampler(
            scheduler, rows, b, self.num_generations, r, len(ds) // b,
            lag=lookahead_chunks(self.args.gradient_accumulation_steps, r), placeholder=zero_lag)
        self.args.ignore_data_skip = True   # the sampler resumes itself; HF's skip would re-draw
        self._rlpace_rewards = None

    def _get_train_sampler(self, dataset=None):
        return self.rlpace_sampler

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._rlpace_rewards = (per_func * self.reward_weights.to(per_func.device)).nansum(dim=1)
        return per_func

    def _generate_and_score_completions(self, inputs):
        training = self.model.training
        if training and self.rlpace_zero_lag:
            inputs = self._rlpace_swap(len(inputs))
        output = super()._generate_and_score_completions(inputs)
        if training:
            self._rlpace_feedback(inputs, output)
        return output

    def _rlpace_swap(self, n_local: int) -> list[dict]:
        rows = np.repeat(self.rlpace_sampler.rows[self.scheduler.propose(self.rlpace_sampler.b)], self.num_generations)
        start = self.accelerator.process_index * n_local    # the same process-major slice as TRL's
        return self.train_dataset.select(rows[start:start + n_local].tolist()).to_list()

    def _rlpace_feedback(self, inputs: list[dict], output: dict) -> None:
        g = self.num_generations
        ids = gather_object([x[self.rlpace_id_column] for x in inputs])
        pos = self.scheduler.pool.index_of(ids).reshape(-1, g)
        if (pos != pos[:, :1]).any():
            raise RuntimeError("rows of one generation group carry different prompt ids; the sampler "
                               "layout (each prompt num_generations times in a row) was changed.")
        rewards = self._rlpace_rewards.double().cpu().numpy().reshape(-1, g)
        fb = Feedback(pos[:, 0], rewards, group_advantages(rewards), step=self.state.global_step)
        self.scheduler.observe(fb)
        self.rlpace_sampler.scored(pos[:, 0])
        n_local = output["advantages"].shape[0]
        local = slice(self.accelerator.process_index * n_local, (self.accelerator.process_index + 1) * n_local)
        keep = self.scheduler.admit(fb)
        if not keep.all():
            self._rlpace_admit(output, rewards, keep, local)
        if self.rlpace_loss_weights:
            adv = output["advantages"]
            w = torch.as_tensor(self.scheduler.loss_weights(fb).ravel()[local], dtype=adv.dtype, device=adv.device)
            output["advantages"] = adv * (w if adv.dim() == 1 else w[:, None])
        for k, v in self.scheduler.metrics().items():
            self._metrics["train"][f"rlpace/{k}"].append(v)

    def _rlpace_admit(self, output: dict, rewards: np.ndarray, keep: np.ndarray, local: slice) -> None:
        """Dropped rollouts leave the loss; thinned groups train on kept-subset advantages."""
        thinned = keep.any(axis=1) & ~keep.all(axis=1)                      # [B] PODS-style groups
        replace = (~keep | thinned[:, None]).ravel()[local]                  # rows whose advantage changes
        value = np.where(keep & thinned[:, None], kept_group_advantages(rewards, keep), 0.0).ravel()[local]
        adv = output["advantages"]
        rep = torch.as_tensor(replace, device=adv.device)
        val = torch.as_tensor(value, dtype=adv.dtype, device=adv.device)
        if adv.dim() == 2:
            rep, val = rep[:, None], val[:, None]
        output["advantages"] = torch.where(rep, val, adv)
        kept = torch.as_tensor(keep.ravel()[local], device=adv.device)
        mask = output["completion_mask"] * kept[:, None].to(output["completion_mask"].dtype)
        output["completion_mask"] = mask
        loss_mask = mask if "tool_mask" not in output else mask * output["tool_mask"]
        output["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        if self.args.should_save:
            out = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
            np.savez(os.path.join(out, STATE_FILE), **self.scheduler.state_dict(),
                     **self.rlpace_sampler.state_dict())

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        path = os.path.join(checkpoint, STATE_FILE)
        if not os.path.exists(path):
            raise ValueError(f"{path} is missing: this checkpoint was not written by RlpaceGRPOTrainer, so "
                             f"the schedule cannot resume. Resume from an rlpace checkpoint or start fresh.")
        with np.load(path, allow_pickle=False) as z:
            state = {k: z[k] for k in z.files}
        self.rlpace_sampler.load_state_dict(state)
        self.scheduler.load_state_dict({k: v for k, v in state.items() if not k.startswith("sampler/")})
