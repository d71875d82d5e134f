"""verl 0.5–0.7: `RlpaceSampler`, an `AbstractCurriculumSampler` driven by a Scheduler.

verl builds it in `create_rl_sampler` as `cls(data_source=dataset, data_config=data.*)`
when `data.sampler.class_path=pkg://rlpace.adapters.verl` and
`data.sampler.class_name=RlpaceSampler`, and calls `update(batch=...)` at the end of every
step, after the checkpoint (methods-peers-and-engines.md B2). This module imports
`verl.experimental.dataset.sampler`, which verl removed in 0.8; `rlpace.adapters.verl`
imports it only when asked for `RlpaceSampler`.
"""

from __future__ import annotations

from ..errors import InputError
from verl.experimental.dataset.sampler import AbstractCurriculumSampler

from ._verl_core import check_verl_version, feedback_from_config, pool_from_dataframe

__all__ = ["RlpaceSampler"]


class RlpaceSampler(AbstractCurriculumSampler):
    """Yields pool positions (= dataset rows), `batch_size` at a time from `propose`.

    A batch is proposed lazily, when the dataloader asks for its first index; with
    `num_workers=0` that is after `update()` of the previous step, so there is no feedback
    lag. `len` is `(N // batch_size) * batch_size` (verl's steps per epoch with
    `drop_last=True`). State: the Scheduler's, plus the position inside the epoch and the
    batch being yielded — torchdata does not fast-forward a stateful sampler, it resumes it.

    Args:
        data_source: verl's `RLHFDataset` (its `dataframe` gives `data_source` and
            `extra_info.index`).
        data_config: the `data` config; `data.rlpace.*` names the policy (see
            `feedback_from_config`), `gen_batch_size` or `train_batch_size` the batch.
    """

    def __init__(self, data_source, data_config):
        check_verl_version("sampler")
        if data_config.get("dataloader_num_workers", 8) != 0:
            raise InputError("data.dataloader_num_workers must be 0 with RlpaceSampler (workers "
                             "would prefetch ahead of the feedback). Set data.dataloader_num_workers=0.")
        self.batch_size = int(data_config.get("gen_batch_size", None) or data_config.train_batch_size)
        self.rlpace = feedback_from_config(pool_from_dataframe(data_source.dataframe), data_config)
        n = len(self.rlpace.scheduler.pool)
        if n < self.batch_size:
            raise InputError(f"the dataset has {n} prompts, fewer than one batch ({self.batch_size}); "
                             f"lower data.train_batch_size or add prompts.")
        self._len = n // self.batch_size * self.batch_size
        self._pos, self._batch = 0, None

    @property
    def scheduler(self):
        return self.rlpace.scheduler

    def __len__(self) -> int:
        return self._len

    def __iter__(self):
        b = self.batch_size
        while self._pos < self._len:
            if self._pos % b == 0 or self._batch is None:
                self._batch = self.rlpace.scheduler.propose(b)
            i = int(self._batch[self._pos % b])
            self._pos += 1
            yield i
        self._pos, self._batch = 0, None

    def update(self, batch) -> None:
        """verl's end-of-step hook: learn from the finished batch."""
        self.rlpace.observe(batch)

    def state_dict(self) -> dict:
        return {"rlpace": self.rlpace.scheduler.state_dict(), "pos": self._pos,
                "batch": None if self._batch is None else self._batch.copy()}

    def load_state_dict(self, state: dict) -> None:
        self.rlpace.scheduler.load_state_dict(state["rlpace"])
        self._pos, self._batch = int(state["pos"]), state["batch"]
