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
  process or DDP (FSDP / ZeRO-3 shard the weights the pass would call).

* Supervision transforms (a method with a target, reward or advantage place): inside
  `_calculate_rewards`, on the gathered groups — answers, optional token statistics (one
  extra forward), `Scheduler.targets`, re-scoring against the targets, `Scheduler.rewards`
  — and `Scheduler.advantage_weights` on the advantages (`rlpace.adapters._trl_supervision`,
  a mixin that also overrides `_generate` to keep the token ids).

Private overrides (checked against trl 1.16.0; `SUPPORTED_TRL`): `_get_train_sampler`,
`_calculate_rewards`, `_generate_and_score_completions`, `_save_checkpoint`,
`_load_optimizer_and_scheduler` — each calls `super()` and adds a few lines. The feature
pass calls `_compute_loss` with `_get_per_token_logps_and_entropies` shadowed on the instance
(unfused head) and undoes the metrics `_compute_loss` logs.
"""

from __future__ import annotations

from ..errors import InputError
import inspect
import os
from collections import deque

import numpy as np

from ..scheduler import Scheduler
from ..types import Feedback, Pool, group_advantages

try:
    import torch
    import trl
    from accelerate.utils import gather_object
    from torch.utils.data import Sampler
    from trl import GRPOTrainer
    from trl.models.utils import disable_gradient_checkpointing
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("rlpace.adapters.trl needs trl: pip install 'rlpace[trl]'") from e
from ..train.gradfeatures import GradFeatures, needs_grad_features
from ._convert import admitted_advantages
from ._supervision import has_supervision_places
from ._trl_supervision import TrlSupervision

__all__ = ["RlpaceGRPOTrainer", "SchedulerRepeatSampler", "lookahead_chunks", "pool_from_dataset",
           "SUPPORTED_TRL", "STATE_FILE"]

SUPPORTED_TRL = ("1.10", "1.17")   # [lowest, highest) trl release checked
STATE_FILE = "rlpace_scheduler.npz"


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
            raise InputError(f"the checkpoint's sampler looks {len(queue) - 1} chunk(s) ahead, this run {self.lag} "
                             f"(gradient_accumulation_steps // (steps_per_generation × num_iterations)): resume "
                             f"with the gradient_accumulation_steps, steps_per_generation and num_iterations "
                             f"the checkpoint was trained with.")
        self.queue, self.primed, self.handed = deque(queue), primed, 0


class RlpaceGRPOTrainer(TrlSupervision, GRPOTrainer):
    """`GRPOTrainer` with prompts proposed by `scheduler` and feedback returned to it.

    Args (besides GRPOTrainer's; pass `args` and `train_dataset` by keyword):
        scheduler: a `Scheduler` whose pool's ids are the dataset's `id_column`
            (`pool_from_dataset(train_dataset)` builds one).
        id_column: dataset column with each prompt's stable id.
        zero_lag: propose each chunk at generation time (after the previous feedback).
        loss_weights: multiply advantages by `scheduler.loss_weights`.
        grad_features: per-rollout gradient features for `Feedback.grads`: "auto" (when a
            policy reads them: diem, dvc), "on" or "off". Cost: one extra forward of the
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

    Example:
        >>> pool = pool_from_dataset(ds)                                # doctest: +SKIP
        >>> trainer = RlpaceGRPOTrainer(model=m, reward_funcs=f, args=cfg, train_dataset=ds,
        ...                             scheduler=Scheduler(pool, "dump", seed=0))  # doctest: +SKIP
    """

    def __init__(self, *args, scheduler: Scheduler, id_column: str = "index", zero_lag: bool = False,
                 loss_weights: bool = False, grad_features: str = "auto", grad_params: str = "lm_head",
                 grad_dim: int = 256, grad_reference: str = "previous", target_column: str | None = None,
                 answer_extractor=None, **kwargs):
        from packaging.version import Version
        if not Version(SUPPORTED_TRL[0]) <= Version(trl.__version__) < Version(SUPPORTED_TRL[1]):
            raise InputError(f"RlpaceGRPOTrainer supports trl >={SUPPORTED_TRL[0]},<{SUPPORTED_TRL[1]}; "
                             f"trl {trl.__version__} is installed. Install a trl in that range.")
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
        if grad_reference not in ("previous", "none"):
            raise InputError(f"grad_reference must be 'previous' or 'none'; got {grad_reference!r}.")
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
        rows = np.empty(len(pos), dtype=np.int64)
        rows[pos] = np.arange(len(pos))
        b = self.args.generation_batch_size // self.num_generations
        r = self.num_iterations * self.args.steps_per_generation
        self.rlpace_sampler = SchedulerRepeatSampler(
            scheduler, rows, b, self.num_generations, r, len(ds) // b,
            lag=lookahead_chunks(self.args.gradient_accumulation_steps, r), placeholder=zero_lag)
        self.args.ignore_data_skip = True   # the sampler resumes itself; HF's skip would re-draw
        self._rlpace_rewards = None
        self.rlpace_gf = (GradFeatures(self.model, grad_params, grad_dim, self.args.seed)   # validates
                          if needs_grad_features(scheduler, grad_features) else None)
        self.rlpace_grad_reference = grad_reference
        self.rlpace_ref_grad = None                      # float32[d] Feedback.ref_grad (checkpointed)
        self._rlpace_supervision_init(target_column, answer_extractor)   # issue 14 (supervision transforms)

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
        fb = Feedback(pos[:, 0], rewards, group_advantages(rewards), step=self.state.global_step, **self._rlpace_sup)
        n_local = output["advantages"].shape[0]
        local = slice(self.accelerator.process_index * n_local, (self.accelerator.process_index + 1) * n_local)
        admitted = []

        def features(adm):
            # the features of the loss as admitted (a dropped rollout's are 0)
            self._rlpace_admit(output, rewards, adm.keep, local, adm.full_group_advantages)
            admitted.append(True)
            grads = self._rlpace_grad_features(output).cpu().numpy().reshape(*rewards.shape, -1)  # [B, G, d]
            return grads, self.rlpace_ref_grad

        # observe → admission → (features → their readers) → weights: `Scheduler.step`'s one order
        r = self.scheduler.step(fb, features=features if self.rlpace_gf is not None else None)
        self.rlpace_sampler.scored(pos[:, 0])
        if not admitted:
            self._rlpace_admit(output, rewards, r.keep, local, r.full_group_advantages)
        if r.feedback.grads is not None and self.rlpace_grad_reference == "previous":
            self.rlpace_ref_grad = r.feedback.grads.sum(axis=(0, 1)).astype(np.float32)   # the next batch's
        if self.rlpace_loss_weights:
            self._rlpace_scale_advantages(output, r.weights, local)
        if self.rlpace_supervises and has_supervision_places(self.scheduler):
            self._rlpace_scale_advantages(output, r.advantage_weights, local)    # Ã = w·Â
        for k, v in self.scheduler.metrics().items():
            self._metrics["train"][f"rlpace/{k}"].append(v)

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
                                              "beta", "_entropy_bonus_enabled", "aux_loss_enabled")
                if hasattr(self, k)}
        # the policy-gradient term only (as the built-in trainer's features): no KL, entropy bonus
        # or MoE router loss in the differentiated loss
        self.beta, self._entropy_bonus_enabled, self.aux_loss_enabled = 0.0, False, False
        self._get_per_token_logps_and_entropies = self._rlpace_unfused_logps   # instance shadow, undone below
        feats = []
        try:
            with disable_gradient_checkpointing(model, self.args.gradient_checkpointing_kwargs):
                for s in range(0, n, mb):
                    rows = slice(s, min(n, s + mb))
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
        logp = (out.logits[:, :-1].float() / self.temperature).log_softmax(-1)          # [n, T, V]
        per_token = logp.gather(-1, input_ids[:, -logits_to_keep:, None]).squeeze(-1)    # [n, T]
        if compute_entropy and self.top_entropy_quantile >= 1.0:
            entropy = torch.zeros_like(per_token)     # read only by the metrics this pass discards
        else:
            entropy = -(logp.exp() * logp).sum(-1) if compute_entropy else None
        return per_token, entropy, (out.aux_loss if compute_aux_loss else None)

    def _rlpace_admit(self, output: dict, rewards: np.ndarray, keep: np.ndarray, local: slice,
                      full_group_advantages: bool = False) -> None:
        """Dropped rollouts leave the loss; thinned groups train on kept-subset advantages
        (`admitted_advantages`)."""
        if keep.all():
            return
        replace, value = admitted_advantages(rewards, keep, full_group_advantages)
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

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        if self.args.should_save:
            out = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
            ref = {} if self.rlpace_ref_grad is None else {"grads/ref_grad": self.rlpace_ref_grad}
            np.savez(os.path.join(out, STATE_FILE), **self.scheduler.state_dict(),
                     **self.rlpace_sampler.state_dict(), **ref)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        path = os.path.join(checkpoint, STATE_FILE)
        if not os.path.exists(path):
            raise InputError(f"{path} is missing: this checkpoint was not written by RlpaceGRPOTrainer, so "
                             f"the schedule cannot resume. Resume from an rlpace checkpoint or start fresh.")
        with np.load(path, allow_pickle=False) as z:
            state = {k: z[k] for k in z.files}
        self.rlpace_sampler.load_state_dict(state)
        ref = state.get("grads/ref_grad")
        if ref is not None and (self.rlpace_gf is None or ref.shape != (self.rlpace_gf.dim,)):
            raise InputError(f"the checkpoint holds a reference gradient of shape {ref.shape}, this run's features "
                             f"have d = {None if self.rlpace_gf is None else self.rlpace_gf.dim}: resume with the "
                             f"grad_features, grad_params and grad_dim the checkpoint was trained with.")
        self.scheduler.load_state_dict({k: v for k, v in state.items() if not k.startswith(("sampler/", "grads/"))})
        self.rlpace_ref_grad = None if ref is None else ref.astype(np.float32)
