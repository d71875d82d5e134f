"""rlpace inside TRL: `RlpaceGRPOTrainer`, a `GRPOTrainer` whose prompts come from a Scheduler.

* Prompts: `_get_train_sampler` returns a `SchedulerRepeatSampler` with `RepeatSampler`'s
  layout and length (B = generation_batch_size // G prompts per chunk, each index G times
  in a row, each chunk `num_iterations × steps_per_generation` times); every rank holds
  an identical replica, so accelerate's shards agree.
* Feedback: after TRL scores a generation batch (`_generate_and_score_completions`), the
  gathered rewards (weighted sum over reward functions, as TRL computes it) and the
  gathered advantages reach `Scheduler.observe` on every rank, in the same order.
* Lag: accelerate reads one batch ahead, so with R = steps_per_generation × num_iterations
  = 1 chunk j is drawn before chunk j−1 is scored. The sampler makes the lag fixed
  instead of timing-dependent: chunk j is always proposed right after the feedback of
  chunk j−1−lag, lag = 1 if R == 1 else 0. `zero_lag=True` instead proposes inside
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
from ..types import Feedback, Pool

try:
    import torch
    import trl
    from accelerate.utils import gather, gather_object
    from torch.utils.data import Sampler
    from trl import GRPOTrainer
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("rlpace.adapters.trl needs trl: pip install 'rlpace[trl]'") from e

__all__ = ["RlpaceGRPOTrainer", "SchedulerRepeatSampler", "pool_from_dataset", "SUPPORTED_TRL", "STATE_FILE"]

SUPPORTED_TRL = ("1.10", "1.17")   # [lowest, highest) trl release checked
STATE_FILE = "rlpace_scheduler.npz"


def pool_from_dataset(dataset, *, domain_column: str = "data_source", id_column: str = "index") -> Pool:
    """A `Pool` over a `datasets.Dataset`: position = row, domain and stable id from columns."""
    for col in (domain_column, id_column):
        if col not in dataset.column_names:
            raise ValueError(f"the train dataset has no {col!r} column; add it (a domain label and a "
                             f"unique stable id per prompt), or name the column that holds it.")
    return Pool(dataset[domain_column], ids=dataset[id_column])


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
        lag: chunks proposed ahead (0 or 1); placeholder: yield row 0 (zero-lag mode).
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
            raise RuntimeError("the dataloader asked for a chunk whose feedback horizon has not arrived: "
                               "set dataloader_num_workers=0 and keep TRL's default prefetching.")
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
        self.queue = deque(np.asarray(state["sampler/queue"], dtype=np.int64))
        self.primed, self.handed = bool(state["sampler/primed"]), 0


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
        self.rlpace_sampler = SchedulerRepeatSampler(scheduler, rows, b, self.num_generations, r,
                                                     len(ds) // b, lag=int(r == 1), placeholder=zero_lag)
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
        adv_local = output["advantages"]
        adv = gather(adv_local if adv_local.dim() == 1 else adv_local.mean(-1))
        fb = Feedback(pos[:, 0], self._rlpace_rewards.double().cpu().numpy().reshape(-1, g),
                      adv.double().cpu().numpy().reshape(-1, g), step=self.state.global_step)
        self.scheduler.observe(fb)
        self.rlpace_sampler.scored(pos[:, 0])
        if self.rlpace_loss_weights:
            w = torch.as_tensor(self.scheduler.loss_weights(fb).ravel(), dtype=adv_local.dtype,
                                device=adv_local.device)
            start = self.accelerator.process_index * adv_local.shape[0]
            w = w[start:start + adv_local.shape[0]]
            output["advantages"] = adv_local * (w if adv_local.dim() == 1 else w[:, None])
        for k, v in self.scheduler.metrics().items():
            self._metrics["train"][f"rlpace/{k}"].append(v)

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
        self.scheduler.load_state_dict({k: v for k, v in state.items() if not k.startswith("sampler/")})
        self.rlpace_sampler.load_state_dict(state)
