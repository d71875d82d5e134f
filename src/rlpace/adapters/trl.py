"""rlpace inside TRL: `RlpaceGRPOTrainer`, a `GRPOTrainer` whose prompts come from a Scheduler.

* Prompts: `_get_train_sampler` returns a `SchedulerRepeatSampler` with `RepeatSampler`'s
  layout and length (B = generation_batch_size // G prompts per chunk, each index G times
  in a row, each chunk `num_iterations × steps_per_generation` times); every rank holds
  an identical replica, so accelerate's shards agree.
* Feedback: after TRL scores a generation batch (`_generate_and_score_completions`), the
  gathered rewards (weighted sum over reward functions, as TRL computes it) reach
  `Scheduler.step` (observe, then admission, then weights) on every rank, in the same
  order, with `rlpace.group_advantages` of those rewards as the advantages (one definition
  whatever TRL's `scale_rewards`, `loss_type` or multi-objective aggregation:
  A = (r − mean) / (population std + 1e-6)).
* Admission: the step's `keep` decides which rollouts enter the loss. A dropped rollout's
  `completion_mask` row is zeroed (no policy or KL term, not in `num_items_in_batch`) and
  its advantage set to 0; a group that keeps a strict subset (PODS) trains on
  `rlpace.kept_group_advantages(rewards, keep)`, GRPO advantages of the kept rollouts
  only, unless the admission keeps full-group advantages (`topk`); groups kept whole keep
  TRL's advantages (the rule: `rlpace.adapters._convert.admitted_advantages`). (`loss_type` "grpo"/"sapo"/"luspo"
  average per sequence over the whole micro-batch, so dropped rows still count in that
  mean; "dapo", "bnpo", "cispo" and "vespo" normalise by tokens and exclude them.)
* Refills: while the step's admission asks for replacements (`StepResult.refill` > 0),
  some rank's slice of the batch holds fewer kept groups than its share, and fewer than
  `max_refill_rounds` extra rounds ran, a whole chunk of fresh proposals is generated,
  scored and stepped; each rank trains its first kept groups in round order (then, at the
  limit, dropped ones, masked out), so the batch keeps B·G rows. Decided from the gathered
  keep masks: the same on every rank. `rlpace/rollouts_total` counts every rollout.
* Allocation (a method with an allocation place: `knapsack`, `gvm`, `oracle_allocation`): TRL
  generates a fixed G = num_generations per dataset row, so a prompt's N_i rollouts are
  k_i = N_i / G copies of its row. Each chunk's B proposals get N_i from
  `Scheduler.allocate(ids, B·G, unit=G)` (multiples of G, Σ = B·G: the policy's allocation
  rounded by largest remainder), and the chunk's B group slots are proposal i k_i times in a
  row (k_i = 0: not generated). The copies' k_i·G rollouts are one group: rows of a prompt
  with k_i ≥ 2 train on TRL's formula over all of them (`merged_group_advantages`: mean, and
  unbiased std for `scale_rewards="group"`, over the k_i·G rewards), and the Scheduler sees
  one ragged group per proposal (`Feedback.group_sizes` = N_i, 0 included). Decided inside
  the sampler, which every rank replicates, so all ranks agree; every rank's slice is
  B / world group slots of G rows, as without allocation. The copies are part of the
  sampler's checkpointed queue (exact resume). Not with refills, gradient features,
  supervision places or `normalize_then_sum` (refused at start-up, naming the fix).
* Pilot record (`record=PATH`): `rlpace advise`'s JSONL (`rlpace.advise.PilotRecorder`), one
  line per generated chunk (refills included), each generated group of G a row (a prompt
  with k copies has k rows), the pool's stable ids, the step and the rollouts spent; written
  by the main process; a resumed run keeps the lines before its step and rewrites the rest.
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
* Gradient features (`grad_features`, on by default when a policy reads "grads": diem, dvc):
  after scoring and admission, a feature pass runs TRL's own `_compute_loss` over the local
  generation batch in chunks of `per_device_train_batch_size`, with the LM head unfused (a
  plain `model(...)` forward, logits / temperature → log-softmax) so that hooked
  `nn.Linear` calls are visible, and `rlpace.train.gradfeatures.GradFeatures` turns the
  hooked layers' inputs and output gradients into each rollout's projected gradient of that
  loss's policy-gradient term (`beta`, the entropy bonus and the router loss are off for the
  pass; `Feedback.grads`, float32[B, G, d], gathered across ranks). The pass is a forward
  without a graph up to the first hooked layer (lm_head: the whole body) plus a backward to
  the hooked outputs only — no parameter gradient. Each generation batch goes through one
  `Scheduler.step`, in its fixed order: observe, admission, the feature pass on the loss as
  admitted and the update of the policies that read the features, then `loss_weights`
  (e.g. DIEM's) scale the advantages: a rollout's policy-gradient term is
  linear in its advantage, so the step's gradient is Σ_i w_i·g_i exactly. `ref_grad` is the
  previous generation batch's summed features (`grad_reference="previous"`) or none; a user
  may set `trainer.rlpace_ref_grad` (float32[d]) before a step. Text-only models; single
  process or DDP (FSDP / ZeRO-3 shard the weights the pass would call: detected at start-up,
  `sharded_model_setting`, and refused).

* Supervision transforms (a method with a target, reward or advantage place): inside
  `_calculate_rewards`, on the gathered groups — answers, optional token statistics (one
  extra forward), `Scheduler.targets`, re-scoring against the targets, `Scheduler.rewards`
  — and `Scheduler.advantage_weights` on the advantages (`rlpace.adapters._trl_supervision`,
  a mixin that also overrides `_generate` to keep the token ids).

Private overrides (checked against trl 1.16.0; `SUPPORTED_TRL`): `_get_train_sampler`,
`_calculate_rewards`, `_generate_and_score_completions`, `_generate_single_turn` (lm_head
features: keeps the head's inputs during generation), `_save_checkpoint`,
`_load_optimizer_and_scheduler` — each calls `super()` and adds a few lines. Every private
method and attribute relied on (`TRL_PRIVATE_METHODS`, `TRL_PRIVATE_ATTRIBUTES`) is checked
when the trainer is built; on several ranks a digest of the Scheduler copies is all-gathered
before every generation batch, and the state file is read by the main process and broadcast. The feature
pass calls `_compute_loss` with `_get_per_token_logps_and_entropies` shadowed on the instance
(unfused head; for lm_head features, the head alone on the hidden states generation computed)
and undoes the metrics `_compute_loss` logs.
"""

from __future__ import annotations

from ..errors import InputError
import contextlib
import hashlib
import inspect
import os
from collections import deque

import numpy as np

from ..scheduler import Scheduler
from ..policies._base import is_neutral
from ..types import Feedback, Pool, group_advantages
from ..advise._record import PilotRecorder

try:
    import torch
    import trl
    from accelerate.utils import broadcast_object_list, gather_object
    from torch.utils.data import Sampler
    from trl import GRPOTrainer
    from trl.models.utils import disable_gradient_checkpointing
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("rlpace.adapters.trl needs trl: pip install 'rlpace[trl]'") from e
from ..train.gradfeatures import GradFeatures, needs_grad_features
from ._convert import admitted_advantages, eval_summary as _eval_summary
from ._supervision import has_supervision_places
from ._trl_supervision import TrlSupervision

__all__ = ["RlpaceGRPOTrainer", "SchedulerRepeatSampler", "lookahead_chunks", "pool_from_dataset",
           "ragged_layout", "merged_group_advantages", "ragged_admission", "sharded_model_setting",
           "check_trl_version", "missing_trl_methods", "state_digest", "SUPPORTED_TRL", "STATE_FILE"]

SUPPORTED_TRL = ("1.16", "1.17")   # [lowest, highest) trl releases tested (1.16.0)
# What the adapter relies on beyond GRPOTrainer's public API, checked when a trainer is built so
# that a rename in a new TRL fails loudly (naming it) instead of being skipped: methods it
# overrides or calls, with the parameters it passes; attributes it reads or saves and restores.
TRL_PRIVATE_METHODS = {
    "_get_train_sampler": ("dataset",),
    "_calculate_rewards": ("inputs", "prompts", "completions", "completion_ids_list"),
    "_generate_and_score_completions": ("inputs",),
    "_generate": ("prompts",),
    "_generate_single_turn": ("prompt_ids", "num_generations"),
    "_compute_loss": ("model", "inputs"),
    "_get_per_token_logps_and_entropies": ("model", "input_ids", "attention_mask", "logits_to_keep",
                                           "batch_size", "compute_entropy", "compute_aux_loss"),
    "_save_checkpoint": ("model", "trial"),
    "_load_optimizer_and_scheduler": ("checkpoint",),
    "_get_output_dir": ("trial",),
}
TRL_PRIVATE_ATTRIBUTES = ("_metrics", "num_generations", "num_iterations", "reward_weights", "reward_funcs",
                          "scale_rewards",
                          "temperature", "top_entropy_quantile", "multi_objective_aggregation", "beta",
                          "_entropy_bonus_enabled", "aux_loss_enabled", "entropy_coef", "_last_world_entropy",
                          "_entropy_window_stats", "use_vllm", "use_transformers_continuous_batching")
STATE_FILE = "rlpace_scheduler.npz"
# the keys of TRL's generation output that a refilled (multi-round) batch is assembled from:
# [n] or [n, T] tensors (prompts padded on the left, the rest on the right) and the loss normaliser
_REFILL_KEYS = frozenset({"prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages",
                          "num_items_in_batch", "old_per_token_logps", "ref_per_token_logps",
                          "sampling_per_token_logps", "importance_sampling_ratio", "tool_mask"})


def pool_from_dataset(dataset, *, domain_column: str = "data_source", id_column: str = "index",
                      labeled_column: str | None = "labeled") -> Pool:
    """A `Pool` over a `datasets.Dataset`: position = row, domain and stable id from columns;
    `Pool.labeled` from `labeled_column` when the dataset has it (bool per row: may the
    prompt's label be used in training; ttrl, trapo, the weak-supervision rewards), else all True."""
    for col in (domain_column, id_column):
        if col not in dataset.column_names:
            raise InputError(f"the train dataset has no {col!r} column; add it (a domain label and a "
                             f"unique stable id per prompt), or name the column that holds it.")
    labeled = dataset[labeled_column] if labeled_column and labeled_column in dataset.column_names else None
    return Pool(dataset[domain_column], ids=dataset[id_column], labeled=labeled)


def lookahead_chunks(gradient_accumulation_steps: int, batches_per_chunk: int) -> int:
    """Chunks the dataloader draws before the previous ones are scored: A // R.

    A = gradient_accumulation_steps, R = steps_per_generation × num_iterations. transformers
    fetches an optimizer step's A batches, plus accelerate's one read-ahead, before training
    on the first; chunk j starts at batch j·R (derivation in the module docstring).

    Examples:
        >>> [lookahead_chunks(a, r) for a, r in [(1, 1), (2, 2), (2, 1), (4, 2), (3, 2), (2, 4)]]
        [1, 1, 2, 2, 1, 0]
    """
    a, r = int(gradient_accumulation_steps), int(batches_per_chunk)
    if a < 1 or r < 1:
        raise InputError(f"gradient_accumulation_steps ({a}) and steps_per_generation × num_iterations ({r}) "
                         f"must be ≥ 1.")
    return a // r


def check_trl_version(version: str) -> None:
    """Refuse a trl outside `SUPPORTED_TRL`, pre-releases of the next release included
    (`1.17.0.dev0` sorts below 1.17 but already carries its changes).

    Examples:
        >>> check_trl_version("1.16.0"); check_trl_version("1.16.1.dev0")
        >>> check_trl_version("1.17.0.dev0")                       # doctest: +ELLIPSIS
        Traceback (most recent call last):
        rlpace.errors.InputError: RlpaceGRPOTrainer supports trl >=1.16,<1.17 ...
    """
    from packaging.version import Version
    v, lo, hi = Version(version), Version(SUPPORTED_TRL[0]), Version(SUPPORTED_TRL[1])
    if not (lo <= v and Version(v.base_version) < hi):
        raise InputError(f"RlpaceGRPOTrainer supports trl >={SUPPORTED_TRL[0]},<{SUPPORTED_TRL[1]} (the releases "
                         f"its private overrides were tested against); trl {version} is installed. Install a trl "
                         f"in that range.")


def missing_trl_methods(cls) -> list[str]:
    """The `TRL_PRIVATE_METHODS` that `cls` lacks, or whose signature lacks a parameter the
    adapter passes, each as "method(param)"; [] when all are there."""
    out = []
    for name, params in TRL_PRIVATE_METHODS.items():
        fn = getattr(cls, name, None)
        if not callable(fn):
            out.append(f"method {name}")
            continue
        have = inspect.signature(fn).parameters
        out += [f"parameter {p!r} of {name}" for p in params if p not in have]
    return out


def _require(missing: list[str]) -> None:
    if missing:
        raise InputError(f"trl {trl.__version__}'s GRPOTrainer has no {', no '.join(missing)}: RlpaceGRPOTrainer "
                         f"relies on it (tested against trl {SUPPORTED_TRL[0]}.x). Install a trl "
                         f">={SUPPORTED_TRL[0]},<{SUPPORTED_TRL[1]}.")


def state_digest(state: dict[str, np.ndarray]) -> int:
    """A signed 64-bit BLAKE2b digest of a flat `{key: array}` state (keys, dtypes, shapes, bytes)."""
    h = hashlib.blake2b(digest_size=8)
    for k in sorted(state):
        a = np.ascontiguousarray(state[k])
        h.update(f"{k}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return int.from_bytes(h.digest(), "little", signed=True)


def sharded_model_setting(accelerator) -> str | None:
    """The accelerate setting that shards the model's weights across ranks — "FSDP" or
    "DeepSpeed ZeRO-3" — or None (single process, DDP, ZeRO-1/2). Gradient features call
    the hooked layers (lm_head) as whole modules, so they need every rank to hold the full weight."""
    from accelerate.utils import DistributedType
    kind = getattr(accelerator, "distributed_type", None)
    if kind == DistributedType.FSDP:
        return "FSDP"
    if kind == DistributedType.DEEPSPEED:
        plugin = getattr(getattr(accelerator, "state", None), "deepspeed_plugin", None)
        if plugin is not None and getattr(plugin, "zero_stage", None) == 3:
            return "DeepSpeed ZeRO-3"
    return None


def ragged_layout(copies: np.ndarray, g: int) -> np.ndarray:
    """int64[B, W] the generation batch's row of each rollout of each proposal, −1 on padding:
    proposal i's N_i = copies[i]·g rollouts are the rows of its copies' group slots, which
    follow each other (`SchedulerRepeatSampler.slots`); W = max N_i (at least 1).

    >>> ragged_layout(np.array([2, 0, 1]), 2).tolist()
    [[0, 1, 2, 3], [-1, -1, -1, -1], [4, 5, -1, -1]]
    """
    n = np.asarray(copies, dtype=np.int64) * g                               # [B]
    width = max(1, int(n.max(initial=0)))
    start = np.cumsum(n) - n                                                 # [B] first row
    cols = np.arange(width)[None, :]                                         # [1, W]
    return np.where(cols < n[:, None], start[:, None] + cols, -1)


def merged_group_advantages(rewards: np.ndarray, layout: np.ndarray, scale_rewards: str = "group") -> np.ndarray:
    """float64[n] TRL's advantage with each proposal's rollouts as one group: rewards float[n]
    of the generation batch's rows, `layout` from `ragged_layout`. A = r − mean over the
    prompt's N_i rollouts, divided by (std + 1e-4) where std is the unbiased std of those N_i
    (`scale_rewards="group"`) or of the whole batch ("batch"); "none" does not divide —
    TRL's `sum_then_normalize` formulas with the group widened from G to N_i = k·G.

    >>> r = np.array([1.0, 0.0, 0.0, 0.0, 1.0, 1.0])
    >>> merged_group_advantages(r, ragged_layout(np.array([2, 1]), 2)).round(4).tolist()
    [1.4997, -0.4999, -0.4999, -0.4999, 0.0, 0.0]
    """
    r = np.asarray(rewards, dtype=np.float64)
    valid = layout >= 0                                                      # a prefix of each row
    x = np.where(valid, r[np.maximum(layout, 0)], 0.0)                       # [B, W]
    if scale_rewards == "group":     # rlpace's ragged GRPO advantage with TRL's eps and unbiased std
        centred = group_advantages(x, eps=1e-4, group_sizes=valid.sum(axis=1), ddof=1)
    else:
        n = valid.sum(axis=1, keepdims=True).astype(np.float64)              # [B, 1]
        centred = np.where(valid, x - x.sum(axis=1, keepdims=True) / np.maximum(n, 1.0), 0.0)
    if scale_rewards == "batch":
        centred = centred / (r.std(ddof=1) + 1e-4)
    elif scale_rewards not in ("group", "none"):
        raise InputError(f"scale_rewards must be 'group', 'batch' or 'none'; got {scale_rewards!r}.")
    out = np.zeros(r.shape[0])
    out[layout[valid]] = centred[valid]
    return out


def ragged_admission(rewards: np.ndarray, keep: np.ndarray, layout: np.ndarray, full_group_advantages: bool
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`admitted_advantages` of ragged groups (rewards, keep [B, W]; `layout` from
    `ragged_layout`) in the generation batch's rows: (replace bool[n], value float64[n],
    keep bool[n]); each group size's groups go through the rectangular rule."""
    valid = layout >= 0
    n_rows = int(valid.sum())
    replace, value, kept = np.zeros(n_rows, bool), np.zeros(n_rows), np.zeros(n_rows, bool)
    sizes = valid.sum(axis=1)
    for size in np.unique(sizes[sizes > 0]):
        rows = np.flatnonzero(sizes == size)
        rep, val = admitted_advantages(rewards[rows, :size], keep[rows, :size], full_group_advantages)
        at = layout[rows, :size]
        replace[at], value[at], kept[at] = rep, val, keep[rows, :size]
    return replace, value, kept


class SchedulerRepeatSampler(Sampler[int]):
    """`RepeatSampler`'s index layout, with chunks proposed by a Scheduler at fixed points.

    Chunks proposed but not yet scored wait in `queue`; the dataloader is handed them in
    order. After the feedback of a chunk arrives (`scored`), the next chunk is proposed,
    so chunk j always sees the feedback of chunks 0..j−1−lag whatever the prefetching.

    A chunk is B proposals and each one's copies (Σ copies = B): one copy each, or with an
    allocation policy `Scheduler.allocate(ids, B·G, unit=G) // G` — a prompt given N_i = k·G
    rollouts fills k group slots in a row (k = 0: none). Its B slots are what TRL generates.

    Args:
        scheduler: the Scheduler (its pool positions map to dataset rows by `rows`).
        rows: int64[N] dataset row of each pool position.
        batch_size: B proposals (and group slots) per chunk; mini_repeat_count: G; repeat_count: R.
        num_batches: chunks per epoch (fixes `len`, hence TRL's steps per epoch).
        lag: chunks proposed ahead of the feedback (`lookahead_chunks`); placeholder: yield
            row 0 (zero-lag mode).
        allocate: ask the Scheduler's allocation policy for each proposal's copies.
    """

    def __init__(self, scheduler: Scheduler, rows: np.ndarray, batch_size: int, mini_repeat_count: int,
                 repeat_count: int, num_batches: int, lag: int, placeholder: bool = False,
                 allocate: bool = False):
        self.scheduler, self.rows = scheduler, rows
        self.b, self.g, self.r, self.num_batches = batch_size, mini_repeat_count, repeat_count, num_batches
        self.lag, self.placeholder, self.allocate = lag, placeholder, allocate
        # proposed, not yet scored: (pool positions int64[B], copies int64[B])
        self.queue: deque[tuple[np.ndarray, np.ndarray]] = deque()
        self.handed = 0                           # how many of `queue` the dataloader has taken
        self.primed = False

    def propose(self) -> tuple[np.ndarray, np.ndarray]:
        """One chunk: (pool positions int64[B], copies int64[B]), Σ copies = B."""
        ids = self.scheduler.propose(self.b)
        if not self.allocate:
            return ids, np.ones(self.b, np.int64)
        return ids, self.scheduler.allocate(ids, self.b * self.g, unit=self.g) // self.g

    @staticmethod
    def slots(chunk: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        """int64[B] the pool position of each group slot: proposal i `copies[i]` times in a row."""
        return np.repeat(chunk[0], chunk[1])

    def __len__(self) -> int:
        return self.num_batches * self.b * self.g * self.r

    def _next_chunk(self) -> np.ndarray:
        if self.placeholder:
            return np.zeros(self.b, dtype=np.int64)
        if not self.primed:
            self.queue.extend(self.propose() for _ in range(self.lag + 1))
            self.primed = True
        if self.handed >= len(self.queue):
            raise RuntimeError(f"the dataloader asked for a chunk more than {self.lag} chunk(s) ahead of the "
                               f"last feedback, the look-ahead of transformers' loop this sampler was built for "
                               f"(gradient_accumulation_steps // (steps_per_generation × num_iterations)); "
                               f"something reads further ahead: set dataloader_num_workers=0, or pass "
                               f"zero_lag=True to RlpaceGRPOTrainer.")
        self.handed += 1
        return self.rows[self.slots(self.queue[self.handed - 1])]

    def __iter__(self):
        for _ in range(self.num_batches):
            chunk = self._next_chunk()
            for _ in range(self.r):
                for i in chunk:
                    for _ in range(self.g):
                        yield int(i)

    def oldest(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The oldest handed chunk, checked against the generated groups' pool positions."""
        if not self.queue or self.handed == 0 or not np.array_equal(self.slots(self.queue[0]), positions):
            raise RuntimeError(f"scored prompts {positions.tolist()} are not the oldest proposed chunk "
                               f"{self.slots(self.queue[0]).tolist() if self.queue else []}: the batch layout "
                               f"was changed.")
        return self.queue[0]

    def scored(self, positions: np.ndarray) -> None:
        """The oldest handed chunk was generated and scored: drop it, propose the next."""
        if self.placeholder:
            return
        self.oldest(positions)
        self.queue.popleft()
        self.handed -= 1
        self.queue.append(self.propose())

    def state_dict(self) -> dict[str, np.ndarray]:
        q = np.stack([c[0] for c in self.queue]) if self.queue else np.zeros((0, self.b), np.int64)
        k = np.stack([c[1] for c in self.queue]) if self.queue else np.zeros((0, self.b), np.int64)
        return {"sampler/queue": q, "sampler/copies": k, "sampler/primed": np.array(self.primed)}

    def load_state_dict(self, state) -> None:
        queue, primed = np.asarray(state["sampler/queue"], dtype=np.int64), bool(state["sampler/primed"])
        # checkpoints written before allocation existed hold no copies: one copy each
        copies = np.asarray(state.get("sampler/copies", np.ones_like(queue)), dtype=np.int64)
        if primed and not self.placeholder and len(queue) != self.lag + 1:
            # the queue always holds lag + 1 chunks once primed (one proposed per feedback)
            raise InputError(f"the checkpoint's sampler looks {len(queue) - 1} chunk(s) ahead, this run {self.lag} "
                             f"(gradient_accumulation_steps // (steps_per_generation × num_iterations)): resume "
                             f"with the gradient_accumulation_steps, steps_per_generation and num_iterations "
                             f"the checkpoint was trained with.")
        self.queue, self.primed, self.handed = deque(zip(queue, copies)), primed, 0


def _to_rows(values: np.ndarray, layout: np.ndarray, fill: float) -> np.ndarray:
    """float64[n] ragged [B, W] `values` at the generation batch's rows (`ragged_layout`)."""
    out = np.full(int((layout >= 0).sum()), fill)
    out[layout[layout >= 0]] = values[layout >= 0]
    return out


def _check_allocation(scheduler: Scheduler, cfg, grad_features: str, max_refill_rounds: int) -> None:
    """Refuse what an allocation method cannot do in TRL (each with the fix)."""
    name = f"method {scheduler.name!r} allocates rollouts ({scheduler.method.allocation.name})"
    g = getattr(cfg, "num_generations", None) or 8
    lo, hi = scheduler.method.allocation.bounds or (0, None)
    if lo > g or (hi is not None and hi < g):
        # the step's budget is B·G (every proposal's share G on average); N_i are multiples of G
        bad = f"min_n = {lo} is above" if lo > g else f"max_n = {hi} is below"
        raise InputError(f"{name}: {bad} num_generations = {g}, but the step's budget is B·num_generations "
                         f"(the bounds must hold num_generations); change the policy's bounds or num_generations.")
    agg = getattr(cfg, "multi_objective_aggregation", "sum_then_normalize")
    if agg != "sum_then_normalize":
        raise InputError(f"{name}: a prompt's copies are merged into one group of its summed rewards, so "
                         f"multi_objective_aggregation must be 'sum_then_normalize'; got {agg!r}.")
    if max_refill_rounds and not is_neutral(scheduler.method.admission):
        raise InputError(f"{name} and has an admission ({scheduler.method.admission.name}) that may ask for "
                         f"refills; refills of allocated chunks are not supported: pass max_refill_rounds=0 "
                         f"(dropped groups then leave the loss without replacement).")
    if needs_grad_features(scheduler, grad_features):
        raise InputError(f"{name}; gradient features of merged groups are not supported in TRL: pass "
                         f"grad_features='off' with a method that does not read 'grads'.")
    if has_supervision_places(scheduler):
        raise InputError(f"{name}; the supervision places (targets, rewards, advantage weights) are not "
                         f"supported with allocation in TRL: use a method without them.")


class RlpaceGRPOTrainer(TrlSupervision, GRPOTrainer):
    """`GRPOTrainer` with prompts proposed by `scheduler` and feedback returned to it.

    Args (besides GRPOTrainer's; pass `args` and `train_dataset` by keyword):
        scheduler: a `Scheduler` whose pool's ids are the dataset's `id_column`
            (`pool_from_dataset(train_dataset)` builds one).
        id_column: dataset column with each prompt's stable id.
        zero_lag: propose each chunk at generation time (after the previous feedback).
        loss_weights: multiply advantages by `scheduler.loss_weights`.
        grad_features: per-rollout gradient features for `Feedback.grads`: "auto" (when a
            policy reads them: diem, dvc), "on" or "off". Cost: for lm_head alone with
            Hugging Face generation, the head and its backward on the completion positions,
            from the hidden states generation computed; otherwise one extra forward of the
            generation batch (without a graph below the hooked layers) per generation.
        grad_params: the layers they cover: "lm_head" | "last_block" | "all".
        grad_dim: upper bound on the feature dimension d (seeded by `args.seed`).
        grad_reference: `Feedback.ref_grad`: "previous" (the previous generation batch's
            summed features) or "none".
        target_column: the dataset column your reward functions read the label from; with a
            target place (`ttrl`, `olr`, `trapo`) the rows of prompts with a target are
            re-scored with this column replaced by the target (`_trl_supervision`).
        answer_extractor: completion -> str | None, the final answer the target place votes
            on; None: `rlpace.adapters._supervision.extract_answer`.
        max_refill_rounds: extra generation rounds while the admission asks for refills
            (DAPO dynamic sampling; DAPO's `max_num_gen_batches` − 1); 0: never refill.
        record: a path: write the pilot record `rlpace advise --pilot` reads (docs/run-records.md,
            "Pilot records"), one line per generated chunk — what the built-in trainer's
            `record=` writes; the main process writes it, a resumed run keeps its lines
            before the resumed step. record_reward_range: (low, high) the rewards' weighted
            sum lies in (a reward outside is refused when written). With an `eval_dataset`,
            each evaluation goes into the record too: `acc_mean` the share of evaluation
            completions whose weighted reward reaches the Scheduler's success_threshold, `acc`
            the same per value of `record_domain_column` when every evaluation row has it,
            and `n` the evaluation prompts per value (gathered over the ranks, padding dropped).

    Example:
        >>> pool = pool_from_dataset(ds)                                # doctest: +SKIP
        >>> trainer = RlpaceGRPOTrainer(model=m, reward_funcs=f, args=cfg, train_dataset=ds,
        ...                             scheduler=Scheduler(pool, "dump", seed=0))  # doctest: +SKIP
    """

    def __init__(self, *args, scheduler: Scheduler, id_column: str = "index", zero_lag: bool = False,
                 loss_weights: bool = False, grad_features: str = "auto", grad_params: str = "lm_head",
                 grad_dim: int = 256, grad_reference: str = "previous", target_column: str | None = None,
                 answer_extractor=None, max_refill_rounds: int = 4, record=None,
                 record_reward_range: tuple = (0.0, 1.0), record_domain_column: str | None = "data_source",
                 **kwargs):
        check_trl_version(trl.__version__)
        _require(missing_trl_methods(GRPOTrainer))
        bound = inspect.signature(GRPOTrainer.__init__).bind(self, *args, **kwargs).arguments
        cfg, ds = bound.get("args"), bound.get("train_dataset")
        if ds is None or not hasattr(ds, "column_names") or not hasattr(ds, "select"):
            raise InputError("train_dataset must be a map-style datasets.Dataset: the Scheduler picks rows "
                             "by index (an IterableDataset cannot be indexed).")
        if cfg is not None and cfg.dataloader_num_workers != 0:
            raise InputError("dataloader_num_workers must be 0 with RlpaceGRPOTrainer (workers prefetch "
                             "ahead of the feedback). Set GRPOConfig(dataloader_num_workers=0).")
        if id_column not in ds.column_names:
            raise InputError(f"train_dataset has no {id_column!r} column; pass id_column=... naming the "
                             f"column with each prompt's stable id.")
        if grad_features not in ("auto", "on", "off"):
            raise InputError(f"grad_features must be 'auto', 'on' or 'off'; got {grad_features!r}.")
        if isinstance(max_refill_rounds, bool) or not isinstance(max_refill_rounds, int) or max_refill_rounds < 0:
            raise InputError(f"max_refill_rounds must be an int ≥ 0 (0: never refill); got {max_refill_rounds!r}.")
        lo_hi = tuple(record_reward_range) if isinstance(record_reward_range, (tuple, list)) else ()
        if record is not None and not (len(lo_hi) == 2 and all(isinstance(x, (int, float)) and np.isfinite(x)
                                                               for x in lo_hi) and lo_hi[0] < lo_hi[1]
                                       and lo_hi[0] <= scheduler.success_threshold <= lo_hi[1]):
            raise InputError(f"record_reward_range must be (low, high), finite, low < high, holding the "
                             f"Scheduler's success_threshold {scheduler.success_threshold}: the range your reward "
                             f"functions' weighted sum lies in; got {record_reward_range!r}.")
        if grad_reference not in ("previous", "none"):
            raise InputError(f"grad_reference must be 'previous' or 'none'; got {grad_reference!r}.")
        alloc = scheduler.method.allocation
        allocates = alloc is not None and not is_neutral(alloc)
        if allocates:
            _check_allocation(scheduler, cfg, grad_features, max_refill_rounds)
        mismatch = (f"the Scheduler's pool ({len(scheduler.pool)} prompts) is not the train dataset "
                    f"({len(ds)} rows, column {id_column!r}); build it with pool_from_dataset(ds)")
        try:
            pos = scheduler.pool.index_of(ds[id_column])
        except InputError as e:
            raise InputError(f"{mismatch}: {e}") from None
        if len(pos) != len(scheduler.pool) or len(np.unique(pos)) != len(pos):
            raise InputError(mismatch + ".")
        super().__init__(*args, **kwargs)
        self.scheduler, self.rlpace_id_column = scheduler, id_column
        self.rlpace_zero_lag, self.rlpace_loss_weights = zero_lag, loss_weights
        self.rlpace_max_refill_rounds, self.rlpace_rollouts_total = max_refill_rounds, 0
        self.rlpace_allocates = allocates
        # the pilot record (`rlpace advise`): its path until the first batch opens it, main process only
        self.rlpace_record, self.rlpace_record_reward_range = record, record_reward_range
        self.rlpace_record_domain_column = record_domain_column
        # held-out evaluations for the record: this evaluate()'s (success, distribution) per
        # completion, its nesting depth (a dict eval_dataset recurses), and the evaluation
        # (step, rows) waiting for the next generation batch (main process)
        self._rlpace_eval_rows, self._rlpace_eval_depth, self._rlpace_eval_pending = [], 0, None
        self._rlpace_chunk = None                 # zero-lag: the chunk _rlpace_swap proposed
        self._rlpace_batches, self._rlpace_layout = [], None   # this generation batch's rounds; ragged rows
        n_local = self.args.per_device_train_batch_size * self.args.steps_per_generation
        if max_refill_rounds and not is_neutral(scheduler.method.admission) and n_local % self.num_generations:
            raise InputError(f"refills fill each rank's slice of the generation batch with whole groups: "
                             f"per_device_train_batch_size × steps_per_generation ({n_local}) must be a multiple "
                             f"of num_generations ({self.num_generations}); change one, or pass max_refill_rounds=0.")
        rows = np.empty(len(pos), dtype=np.int64)
        rows[pos] = np.arange(len(pos))
        b = self.args.generation_batch_size // self.num_generations
        r = self.num_iterations * self.args.steps_per_generation
        self.rlpace_sampler = SchedulerRepeatSampler(
            scheduler, rows, b, self.num_generations, r, len(ds) // b,
            lag=lookahead_chunks(self.args.gradient_accumulation_steps, r), placeholder=zero_lag, allocate=allocates)
        self.args.ignore_data_skip = True   # the sampler resumes itself; HF's skip would re-draw
        self._rlpace_rewards = None
        self._rlpace_gen_heads, self._rlpace_hidden = [], None   # lm_head features: generation's head inputs
        if needs_grad_features(scheduler, grad_features) and sharded_model_setting(self.accelerator):
            raise InputError(f"gradient features (grad_features={grad_features!r}, method {scheduler.name!r}) need "
                             f"the full lm_head weight on every rank, and this run shards the model with "
                             f"{sharded_model_setting(self.accelerator)}: run data-parallel without sharding (DDP, "
                             f"or DeepSpeed ZeRO stage 1/2), or pass grad_features='off' with a method that does "
                             f"not read 'grads' (not diem or dvc).")
        self.rlpace_gf = (GradFeatures(self.model, grad_params, grad_dim, self.args.seed)   # validates
                          if needs_grad_features(scheduler, grad_features) else None)
        self.rlpace_grad_reference = grad_reference
        self.rlpace_ref_grad = None                      # float32[d] Feedback.ref_grad (checkpointed)
        self._rlpace_supervision_init(target_column, answer_extractor)   # the target, reward and advantage places
        _require([f"attribute {a}" for a in TRL_PRIVATE_ATTRIBUTES if not hasattr(self, a)])

    def _get_train_sampler(self, dataset=None):
        return self.rlpace_sampler

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._rlpace_sup = {}
        if self.rlpace_supervises and self.model.training:
            per_func = self._rlpace_supervise(inputs, prompts, completions, completion_ids_list, per_func)
        self._rlpace_rewards = (per_func * self.reward_weights.to(per_func.device)).nansum(dim=1)
        return per_func

    def _generate_and_score_completions(self, inputs):
        if not self.model.training:
            output = super()._generate_and_score_completions(inputs)
            if self.rlpace_record is not None and self._rlpace_eval_depth:
                self._rlpace_eval_collect(inputs)
            return output
        self._rlpace_check_replicas()        # before anything of this batch is proposed or generated
        self._rlpace_batches = []            # (pool positions [B], rewards [B, G]) per round: the pilot record
        if self.rlpace_zero_lag:
            inputs = self._rlpace_swap(len(inputs))
        # round 0 is the sampler's chunk; while the admission asks for refills (DAPO dynamic
        # sampling) and some rank's slice lacks kept groups, generate another whole chunk
        # from fresh proposals (the same on every rank: all ranks drive identical Schedulers)
        rounds = [self._rlpace_round(inputs, first=True)]
        while (rounds[-1][1].refill > 0 and len(rounds) <= self.rlpace_max_refill_rounds
               and self._rlpace_short(rounds)):
            rounds.append(self._rlpace_round(self._rlpace_swap(len(inputs)), first=False))
        output = rounds[0][0] if len(rounds) == 1 else self._rlpace_assemble(rounds)
        self._rlpace_hidden = None               # the feature passes of the rounds are done
        b_local = self.rlpace_sampler.b // self.accelerator.num_processes
        spent = len(rounds) * self.rlpace_sampler.b * self.num_generations     # every generated rollout
        self.rlpace_rollouts_total += spent
        self._rlpace_record(spent)
        m = self._metrics["train"]
        for k, v in self.scheduler.metrics().items():
            m[f"rlpace/{k}"].append(v)
        m["rlpace/rollouts_total"].append(float(self.rlpace_rollouts_total))    # refills included
        m["rlpace/refill_rounds"].append(float(len(rounds) - 1))
        # kept groups generated beyond each rank's share: discarded (docs/engines.md, "Refill surplus")
        surplus = sum(max(0, n - b_local) for n in self._rlpace_kept_per_rank(rounds)) if len(rounds) > 1 else 0
        m["rlpace/refill_surplus_groups"].append(float(surplus))
        if self._rlpace_layout is not None:                  # group slots with a kept rollout
            keep = _to_rows(rounds[0][1].keep, self._rlpace_layout, 0.0)
            kept = int(keep.reshape(self.rlpace_sampler.b, -1).any(axis=1).sum())
        else:
            kept = (int(rounds[0][1].keep.any(axis=1).sum()) if len(rounds) == 1 else   # (a group may straddle ranks)
                    sum(min(n, b_local) for n in self._rlpace_kept_per_rank(rounds)))
        m["rlpace/kept_fraction_trained"].append(kept / self.rlpace_sampler.b)   # groups trained on / B
        return output

    def _rlpace_round(self, inputs: list[dict], first: bool):
        """Generate and score one chunk, report it to the Scheduler: (TRL's output, StepResult)."""
        self._rlpace_gen_heads = []              # the lm_head calls of this chunk's generation
        output = super()._generate_and_score_completions(inputs)
        self._rlpace_hidden = self._rlpace_completion_hidden(output)
        return output, self._rlpace_feedback(inputs, output, first)

    def _rlpace_heads_from_generation(self) -> bool:
        """Whether the lm_head feature pass can start from the hidden states generation computed:
        features of lm_head alone, generated by Hugging Face `generate` on this process (not vLLM,
        not continuous batching), the head in the model's dtype."""
        gf = self.rlpace_gf
        return (gf is not None and len(gf.layers) == 1 and gf.head == 0 and self.model.training
                and not self.use_vllm and not self.use_transformers_continuous_batching
                and not getattr(self.args, "cast_lm_head_to_fp32", False))

    def _generate_single_turn(self, prompt_ids, *args, **kwargs):
        if not self._rlpace_heads_from_generation():
            return super()._generate_single_turn(prompt_ids, *args, **kwargs)
        # Each generation step calls lm_head on the hidden states that predict the next token:
        # their last position is kept (and the first call's head output and model logits, to
        # check that the logits are the head's output), so the feature pass needs no forward
        # of the body.
        calls, first = [], []
        head = self.rlpace_gf.layers[0].module

        def keep(module, inputs, out):
            calls.append((tuple(inputs[0].shape), inputs[0][:, -1:].detach()))
            if len(calls) == 1:
                first.append(out[:, -1].detach())

        def logits(module, inputs, out):
            if len(first) == 1:
                first.append(getattr(out, "logits", None))
        hooks = [head.register_forward_hook(keep), self.model.register_forward_hook(logits)]
        try:
            out = super()._generate_single_turn(prompt_ids, *args, **kwargs)
        finally:
            for h in hooks:
                h.remove()
        self._rlpace_gen_heads.append((calls, first))
        return out

    def _rlpace_completion_hidden(self, output: dict):
        """(completion_ids, [n, T', H]): the head's inputs that predicted each completion token of
        `output` (T' ≥ its width) from one generation's lm_head calls — the prompt call's last
        position, then one position per new token — or None when they are not that (several
        generation calls, as with tools; a model whose logits are not the head's output): the
        feature pass then forwards the batch."""
        heads, self._rlpace_gen_heads = self._rlpace_gen_heads, []
        if len(heads) != 1:
            return None
        (calls, first), ids = heads[0], output["completion_ids"]
        n = ids.shape[0]
        if (len(first) != 2 or first[1] is None or len(calls) < ids.shape[1]
                or any(len(shape) != 3 or shape[0] != n for shape, _ in calls)
                or any(shape[1] != 1 for shape, _ in calls[1:])
                or not torch.equal(first[0], first[1][:, -1].to(first[0].dtype))):
            return None
        return ids, torch.cat([h for _, h in calls], dim=1)

    def _rlpace_slots(self, rounds) -> list[list[tuple[int, int]]]:
        """Per rank, its (round, local group) slots in order: the first kept groups of its own
        slices, then (at the round limit) its first dropped ones (they train on nothing)."""
        b_local = self.rlpace_sampler.b // self.accelerator.num_processes
        slots = []
        for rank in range(self.accelerator.num_processes):
            groups = [(i, j) for i, (_, r) in enumerate(rounds) for j in range(b_local)]
            kept = [(i, j) for i, j in groups if rounds[i][1].keep[rank * b_local + j].any()]
            slots.append((kept + [x for x in groups if x not in kept])[:b_local] if len(kept) < b_local
                         else kept[:b_local])
        return slots

    def _rlpace_kept_per_rank(self, rounds) -> list[int]:
        """Groups with a kept rollout in each rank's slices, over the rounds (from the gathered
        keep masks: the same on every rank)."""
        world = self.accelerator.num_processes
        kept = sum(r.keep.any(axis=1).reshape(world, -1).sum(axis=1) for _, r in rounds)   # int[world]
        return [int(x) for x in kept]

    def _rlpace_short(self, rounds) -> bool:
        """Some rank's slice holds fewer kept groups than its share of the batch."""
        return min(self._rlpace_kept_per_rank(rounds)) < self.rlpace_sampler.b // self.accelerator.num_processes

    def _rlpace_assemble(self, rounds) -> dict:
        """This rank's trained batch from several rounds: its slots' rows, prompts re-padded on
        the left and completions on the right to the widest round (padding is masked out)."""
        g = self.num_generations
        slots = self._rlpace_slots(rounds)[self.accelerator.process_index]
        unknown = set(rounds[0][0]) - _REFILL_KEYS
        if unknown:
            raise InputError(f"refills (max_refill_rounds > 0 with an admission that asks for them) support "
                             f"text-only batches; TRL's batch has {sorted(unknown)}. Pass max_refill_rounds=0.")
        tok = getattr(self.processing_class, "tokenizer", self.processing_class)
        pad_id = getattr(tok, "pad_token_id", None) or 0
        out = {}
        for k, v in rounds[0][0].items():
            if k == "num_items_in_batch" or not torch.is_tensor(v):
                continue
            parts = [rounds[i][0][k][j * g:(j + 1) * g] for i, j in slots]
            if v.dim() == 2 and len({p.shape[1] for p in parts}) > 1:
                width = max(p.shape[1] for p in parts)
                fill = pad_id if k.endswith("_ids") else 0
                left = k.startswith("prompt_")
                parts = [torch.nn.functional.pad(p, (width - p.shape[1], 0) if left else (0, width - p.shape[1]),
                                                 value=fill) for p in parts]
            out[k] = torch.cat(parts)
        loss_mask = out["completion_mask"] if "tool_mask" not in out else out["completion_mask"] * out["tool_mask"]
        out["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()
        return out

    def _rlpace_swap(self, n_local: int) -> list[dict]:
        self._rlpace_chunk = chunk = self.rlpace_sampler.propose()
        rows = np.repeat(self.rlpace_sampler.rows[self.rlpace_sampler.slots(chunk)], self.num_generations)
        start = self.accelerator.process_index * n_local    # the same process-major slice as TRL's
        return self.train_dataset.select(rows[start:start + n_local].tolist()).to_list()

    def _rlpace_feedback(self, inputs: list[dict], output: dict, first: bool = True):
        g = self.num_generations
        ids = gather_object([x[self.rlpace_id_column] for x in inputs])
        pos = self.scheduler.pool.index_of(ids).reshape(-1, g)
        if (pos != pos[:, :1]).any():
            raise RuntimeError("rows of one generation group carry different prompt ids; the sampler "
                               "layout (each prompt num_generations times in a row) was changed.")
        rewards = self._rlpace_rewards.double().cpu().numpy().reshape(-1, g)    # [B, G] per generated group
        self._rlpace_batches.append((pos[:, 0], rewards))
        n_local = output["advantages"].shape[0]
        local = slice(self.accelerator.process_index * n_local, (self.accelerator.process_index + 1) * n_local)
        layout = None
        if self.rlpace_allocates:
            # one ragged group per proposal: its N_i = k·G rollouts are its k copies' rows
            ids, copies = (self.rlpace_sampler.oldest(pos[:, 0]) if not self.rlpace_zero_lag
                           else self._rlpace_chunk)
            if not np.array_equal(self.rlpace_sampler.slots((ids, copies)), pos[:, 0]):
                raise RuntimeError("the generated groups are not the proposed chunk's copies; the batch "
                                   "layout was changed.")
            layout = ragged_layout(copies, g)                                # [B', W], −1 padding
            flat = rewards.ravel()
            rewards = np.where(layout >= 0, flat[np.maximum(layout, 0)], 0.0)   # [B', W]
            fb = Feedback(ids, rewards, group_advantages(rewards, group_sizes=copies * g),
                          step=self.state.global_step, group_sizes=copies * g)
            self._rlpace_merge(output, flat, layout, copies, local)
        else:
            fb = Feedback(pos[:, 0], rewards, group_advantages(rewards), step=self.state.global_step,
                          **self._rlpace_sup)
        self._rlpace_layout = layout
        admitted = []

        def features(adm):
            # the features of the loss as admitted (a dropped rollout's are 0)
            self._rlpace_admit(output, rewards, adm.keep, local, adm.full_group_advantages)
            admitted.append(True)
            grads = self._rlpace_grad_features(output).cpu().numpy().reshape(*rewards.shape, -1)  # [B, G, d]
            grads.setflags(write=False)     # never written again: the Feedback keeps it without a copy
            return grads, self.rlpace_ref_grad

        # observe → admission → (features → their readers) → weights: `Scheduler.step`'s one order
        r = self.scheduler.step(fb, features=features if self.rlpace_gf is not None else None)
        if first:
            self.rlpace_sampler.scored(pos[:, 0])
        if not admitted:
            self._rlpace_admit(output, rewards, r.keep, local, r.full_group_advantages, layout)
        if r.feedback.grads is not None and self.rlpace_grad_reference == "previous":
            self.rlpace_ref_grad = r.feedback.grads.sum(axis=(0, 1)).astype(np.float32)   # the next batch's
        if self.rlpace_loss_weights:
            self._rlpace_scale_advantages(output, r.weights if layout is None else
                                          _to_rows(r.weights, layout, 1.0), local)
        if self.rlpace_supervises and has_supervision_places(self.scheduler):
            self._rlpace_scale_advantages(output, r.advantage_weights, local)    # Ã = w·Â
        return r

    def _rlpace_grad_features(self, output: dict) -> torch.Tensor:
        """float32[N, d] (all ranks' rows, gathered): each rollout's projected gradient of TRL's
        `_compute_loss` over chunks of `per_device_train_batch_size` local rows, at the current
        weights (importance ratio 1), its policy-gradient term only (beta, the entropy bonus and
        the router loss are switched off for the pass). The pass leaves no trace:
        `_compute_loss`'s logged metrics and adaptive-entropy state are restored, and no
        parameter gradient is formed."""
        gf, n = self.rlpace_gf, output["completion_ids"].shape[0]
        mb = self.args.per_device_train_batch_size
        model = self.model
        metrics = self._metrics["train"]
        lengths = {k: len(v) for k, v in metrics.items()}
        kept = {k: getattr(self, k) for k in ("_entropy_window_stats", "entropy_coef", "_last_world_entropy",
                                              "beta", "_entropy_bonus_enabled", "aux_loss_enabled")}
        # the policy-gradient term only (as the built-in trainer's features): no KL, entropy bonus
        # or MoE router loss in the differentiated loss
        self.beta, self._entropy_bonus_enabled, self.aux_loss_enabled = 0.0, False, False
        hidden = self._rlpace_hidden
        hidden = hidden[1] if hidden is not None and hidden[0] is output["completion_ids"] else None
        # lm_head alone: the head on the hidden states generation computed, else a forward of the batch
        self._get_per_token_logps_and_entropies = (self._rlpace_unfused_logps if hidden is None   # instance
                                                   else self._rlpace_head_logps)                 # shadow, undone below
        feats = []
        try:
            # (the head alone runs no checkpointed layer: switching checkpointing off and on walks the model)
            with (disable_gradient_checkpointing(model, self.args.gradient_checkpointing_kwargs) if hidden is None
                  else contextlib.nullcontext()):
                for s in range(0, n, mb):
                    rows = slice(s, min(n, s + mb))
                    self._rlpace_rows = rows
                    chunk = {k: v[rows] if torch.is_tensor(v) and v.dim() and v.shape[0] == n else v
                             for k, v in output.items()}
                    # the graph starts at the hooked layers (GradFeatures.capture's docstring)
                    with torch.no_grad(), gf.capture(graph_from_hooks=True):
                        loss = self._compute_loss(model, chunk)
                    feats.append(gf.features(loss, rows.stop - rows.start))
        finally:
            del self._get_per_token_logps_and_entropies
            for k in list(metrics):
                if k not in lengths:
                    del metrics[k]
                else:
                    del metrics[k][lengths[k]:]
            for k, v in kept.items():
                setattr(self, k, v)
        return self.accelerator.gather(torch.cat(feats).contiguous())

    def _rlpace_unfused_logps(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                              compute_entropy=False, compute_aux_loss=False, **multimodal):
        """`_get_per_token_logps_and_entropies` with the LM head called as a module (hooks see it):
        log-softmax(logits / temperature) at the completion tokens, and their entropies."""
        if any(v is not None for v in multimodal.values()):
            raise InputError("gradient features in RlpaceGRPOTrainer support text-only models; pass "
                             "grad_features='off' (or use a policy that does not read 'grads').")
        kw = {"output_router_logits": True} if compute_aux_loss else {}
        out = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=logits_to_keep + 1, **kw)
        per_token, entropy = self._rlpace_logps_of(out.logits[:, :-1], input_ids, logits_to_keep, compute_entropy)
        return per_token, entropy, (out.aux_loss if compute_aux_loss else None)

    def _rlpace_head_logps(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,
                           compute_entropy=False, compute_aux_loss=False, **multimodal):
        """`_rlpace_unfused_logps` of the feature pass's rows (`_rlpace_rows`) from the head's inputs
        kept during their generation (`_rlpace_completion_hidden`): the LM head, called as a module
        (hooks see it), on the completion positions only; no forward of the body. The same weights
        (generation ran just before, in the same step); the hidden states come from the KV-cached
        decode rather than one forward over [prompt | completion], equal up to float rounding."""
        h = self._rlpace_hidden[1][self._rlpace_rows, :logits_to_keep]                   # [n, T, H]
        logits = self.rlpace_gf.layers[0].module(h)                                       # [n, T, V]
        per_token, entropy = self._rlpace_logps_of(logits, input_ids, logits_to_keep, compute_entropy)
        return per_token, entropy, None

    def _rlpace_logps_of(self, logits, input_ids, logits_to_keep, compute_entropy):
        """(log-softmax(logits / temperature) at the completion tokens [n, T], their entropies or
        None) from the logits [n, T, V] that predict them."""
        logp = (logits.float() / self.temperature).log_softmax(-1)                       # [n, T, V]
        per_token = logp.gather(-1, input_ids[:, -logits_to_keep:, None]).squeeze(-1)    # [n, T]
        if compute_entropy and self.top_entropy_quantile >= 1.0:
            entropy = torch.zeros_like(per_token)     # read only by the metrics this pass discards
        else:
            entropy = -(logp.exp() * logp).sum(-1) if compute_entropy else None
        return per_token, entropy

    def _rlpace_merge(self, output: dict, rewards: np.ndarray, layout: np.ndarray, copies: np.ndarray,
                      local: slice) -> None:
        """Rows of a proposal with k ≥ 2 copies train on TRL's advantages of its k·G rollouts as one
        group (`merged_group_advantages`); a single copy keeps TRL's own."""
        if (copies < 2).all():
            return
        value = merged_group_advantages(rewards, layout, self.scale_rewards)
        at = layout[copies >= 2]
        replace = np.zeros(rewards.shape[0], bool)
        replace[at[at >= 0]] = True
        adv = output["advantages"]
        rep = torch.as_tensor(replace[local], device=adv.device)
        val = torch.as_tensor(value[local], dtype=adv.dtype, device=adv.device)
        if adv.dim() == 2:
            rep, val = rep[:, None], val[:, None]
        output["advantages"] = torch.where(rep, val, adv)

    def _rlpace_admit(self, output: dict, rewards: np.ndarray, keep: np.ndarray, local: slice,
                      full_group_advantages: bool = False, layout: np.ndarray | None = None) -> None:
        """Dropped rollouts leave the loss; thinned groups train on kept-subset advantages
        (`admitted_advantages`; ragged groups, `layout` given: `ragged_admission`)."""
        if (keep if layout is None else keep[layout >= 0]).all():
            return
        if layout is None:
            replace, value = admitted_advantages(rewards, keep, full_group_advantages)
        else:
            replace, value, keep = ragged_admission(rewards, keep, layout, full_group_advantages)
        replace, value = replace.ravel()[local], value.ravel()[local]        # rows whose advantage changes
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

    def _rlpace_record(self, rollouts: int) -> None:
        """The pilot record's lines for this generation batch (main process): one per generated
        chunk, each generated group of G a row (a prompt with k copies has k rows); an evaluation
        made at this step goes with the first, an earlier one is a line of its own before it."""
        if self.rlpace_record is None or not self.accelerator.is_main_process:
            return
        ev, pending = None, self._rlpace_eval_pending
        if pending is not None and pending[0] == self.state.global_step:
            ev, self._rlpace_eval_pending = _eval_summary(pending[1]), None
        elif pending is not None:
            self._rlpace_flush_eval()
        fbs = [Feedback(p, r, step=self.state.global_step) for p, r in self._rlpace_batches]
        self._rlpace_recorder().write_step(fbs, rollouts=rollouts, eval=ev)

    def _rlpace_recorder(self) -> PilotRecorder:
        if isinstance(self.rlpace_record, (str, os.PathLike)):
            # opened at the first line: a resumed run (global_step k) keeps the lines before step k
            self.rlpace_record = PilotRecorder(self.rlpace_record, self.scheduler.pool,
                                               reward_range=self.rlpace_record_reward_range,
                                               success_threshold=self.scheduler.success_threshold,
                                               restart_at=self.state.global_step)
        return self.rlpace_record

    def evaluate(self, *args, **kwargs):
        """transformers' evaluation; with `record=`, its completions' successes become the
        record's evaluation at this step (written with the next generation batch, or as a line
        of its own when no batch of this step follows)."""
        if self.rlpace_record is None:
            return super().evaluate(*args, **kwargs)
        if self._rlpace_eval_depth == 0:
            self._rlpace_eval_rows = []
        start = len(self._rlpace_eval_rows)
        self._rlpace_eval_depth += 1
        try:
            metrics = super().evaluate(*args, **kwargs)
        finally:
            self._rlpace_eval_depth -= 1
        # several ranks: accelerate pads the last evaluation batch with samples from the start; they
        # come last in the gathered order, so the dataset's len × num_generations_eval rows are kept
        ds = kwargs.get("eval_dataset", args[0] if args else None)
        ds = self.eval_dataset if ds is None else self.eval_dataset[ds] if isinstance(ds, str) else ds
        if not isinstance(ds, dict) and hasattr(ds, "__len__"):
            del self._rlpace_eval_rows[start + len(ds) * self.num_generations_eval:]
        if self._rlpace_eval_depth == 0 and self._rlpace_eval_rows and self.accelerator.is_main_process:
            if self._rlpace_eval_pending is not None:     # an earlier evaluation no batch followed
                self._rlpace_flush_eval()
            self._rlpace_eval_pending = (self.state.global_step, self._rlpace_eval_rows)
            if not self.is_in_train:                      # evaluate() called outside train(): no batch follows
                self._rlpace_flush_eval()
        return metrics

    def train(self, *args, **kwargs):
        out = super().train(*args, **kwargs)
        if self._rlpace_eval_pending is not None:         # the evaluation after the last step
            self._rlpace_flush_eval()
        return out

    def _rlpace_eval_collect(self, inputs: list[dict]) -> None:
        """Each local evaluation completion's (success, distribution, prompt key), gathered from
        every rank in rank order (`evaluate` drops the padding of the last batch). TRL's rewards are
        already gathered over the ranks; this rank's rows are its slice of them. (accelerate's
        `gather_for_metrics` would cut the last batch at len(dataset) % batch, counting prompts,
        not TRL's num_generations_eval samples per prompt.) The gathered order is the sampler's,
        which repeats each prompt num_generations_eval times in a row: a completion's prompt key
        is its gathered position // num_generations_eval (the record's held-out `n` per domain)."""
        n, rank, col = len(inputs), self.accelerator.process_index, self.rlpace_record_domain_column
        reward = self._rlpace_rewards[rank * n:(rank + 1) * n].tolist()
        first = len(self._rlpace_eval_rows) + rank * n           # this rank's first gathered position
        rows = [(bool(r >= self.scheduler.success_threshold), None if col is None or col not in x else str(x[col]),
                 (first + j) // self.num_generations_eval) for j, (r, x) in enumerate(zip(reward, inputs))]
        self._rlpace_eval_rows.extend(gather_object(rows))

    def _rlpace_flush_eval(self) -> None:
        step, rows = self._rlpace_eval_pending
        self._rlpace_eval_pending = None
        self._rlpace_recorder().write_eval(step, _eval_summary(rows))

    def _rlpace_check_replicas(self) -> None:
        """On several ranks, all-gather an 8-byte digest of the Scheduler's and the sampler's state
        and fail if a rank's copy differs (they must agree: every rank proposes for itself)."""
        if self.accelerator.num_processes == 1:
            return
        mine = state_digest({**self.scheduler.state_dict(), **self.rlpace_sampler.state_dict()})
        every = self.accelerator.gather(torch.tensor([mine], dtype=torch.int64, device=self.accelerator.device))
        every = every.cpu().tolist()
        if len(set(every)) > 1:
            raise RuntimeError(f"the Scheduler copies disagree at step {self.state.global_step}: rank(s) "
                               f"{[r for r, d in enumerate(every) if d != every[0]]} differ from rank 0. Every rank "
                               f"must build the same Scheduler (policy, seed, pool, state) and see the same "
                               f"feedback; a reward function that is not deterministic across ranks, or a "
                               f"Scheduler changed on one rank, breaks that.")

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        if self.args.should_save:
            out = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
            ref = {} if self.rlpace_ref_grad is None else {"grads/ref_grad": self.rlpace_ref_grad}
            np.savez(os.path.join(out, STATE_FILE), **self.scheduler.state_dict(),
                     **self.rlpace_sampler.state_dict(), **ref,
                     **{"trl/rollouts_total": np.array(self.rlpace_rollouts_total, np.int64)})

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        # the main process reads the state file and broadcasts it: the other ranks (other
        # nodes) need not see it (no shared filesystem assumed); all ranks raise on a bad one
        path, got = os.path.join(checkpoint, STATE_FILE), [None]
        if self.accelerator.is_main_process:
            if os.path.exists(path):
                with np.load(path, allow_pickle=False) as z:
                    got = [{k: z[k] for k in z.files}]
        if self.accelerator.num_processes > 1:
            broadcast_object_list(got, from_process=0)
        state = got[0]
        if state is None:
            raise InputError(f"{path} is missing: this checkpoint was not written by RlpaceGRPOTrainer, so "
                             f"the schedule cannot resume. Resume from an rlpace checkpoint or start fresh.")
        self.rlpace_sampler.load_state_dict(state)
        ref = state.get("grads/ref_grad")
        if ref is not None and (self.rlpace_gf is None or ref.shape != (self.rlpace_gf.dim,)):
            raise InputError(f"the checkpoint holds a reference gradient of shape {ref.shape}, this run's features "
                             f"have d = {None if self.rlpace_gf is None else self.rlpace_gf.dim}: resume with the "
                             f"grad_features, grad_params and grad_dim the checkpoint was trained with.")
        self.scheduler.load_state_dict({k: v for k, v in state.items()
                                        if not k.startswith(("sampler/", "grads/", "trl/"))})
        self.rlpace_ref_grad = None if ref is None else ref.astype(np.float32)
        self.rlpace_rollouts_total = int(state.get("trl/rollouts_total", self.scheduler.counters.rollouts))
