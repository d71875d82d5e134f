"""Supervision transforms in TRL's `GRPOTrainer` (checked against trl 1.16.0): a mixin of
`RlpaceGRPOTrainer`.

TRL calls each reward function on the process-local slice of a generation batch (a group
can straddle ranks) and never hands it log-probs, so the group-level transforms run in the
trainer, on gathered groups, inside `_calculate_rewards` (which must return the gathered
[N, n_funcs] rewards, before TRL computes its advantages):

1. answers: `answer_extractor(completion)` per local completion, gathered ([B, G]);
2. token statistics, only when the method reads them (`DataPolicy.reads` holds
   "token_entropy" / "self_certainty"): one extra forward of the generation batch under
   `no_grad` with the LM head unfused (TRL's fused head never forms logsumexp), logits /
   `temperature` (the sampling temperature), per-sequence means over the completion tokens
   (`_supervision.token_stats`), gathered;
3. `Scheduler.targets`: when some prompt has a target, TRL's reward functions are called
   once more on the local batch with the `target_column` of those rows replaced by the
   target (copies of the row dicts), and their rows take the re-verified rewards; rows of
   an unlabelled prompt without a target score 0;
4. `Scheduler.rewards`: when it changes the weighted reward r = Σ_k w_k r_k, the returned
   per-function tensor carries r'/w_j in the first function with w_j ≠ 0 and 0 elsewhere,
   so TRL's `sum_then_normalize` aggregation sees exactly r' (TRL's per-function reward
   logs then show r' under that function's name);
5. after TRL's advantages (and rlpace admission / loss weights), advantages are multiplied
   by `Scheduler.advantage_weights` (DE-Venus's Ã = w·Â).

The Feedback that reaches `Scheduler.observe` carries the answers and token statistics.
"""

from __future__ import annotations

from ..errors import InputError
import numpy as np
import torch
from accelerate.utils import gather_object

from ..policies import is_neutral
from ..types import Feedback, group_advantages
from ._supervision import (TOKEN_SIGNALS, extract_answer, needs, needs_supervision_pass, pool_labeled, row_targets,
                           token_stats)

__all__ = ["TrlSupervision"]


class TrlSupervision:
    """Mixin for `RlpaceGRPOTrainer` (placed before `GRPOTrainer` in the MRO)."""

    def _rlpace_supervision_init(self, target_column, answer_extractor) -> None:
        sched = self.scheduler
        self.rlpace_supervises = needs_supervision_pass(sched)
        self.rlpace_needs = needs(sched) if self.rlpace_supervises else frozenset()
        self.rlpace_target_column = target_column
        self.rlpace_answer_extractor = answer_extractor or extract_answer
        if target_column is not None and target_column not in self.train_dataset.column_names:
            raise InputError(f"train_dataset has no {target_column!r} column; target_column names the column "
                             f"your reward functions read the label from (e.g. 'solution').")
        target = getattr(sched.method, "target", None)
        if target_column is None and target is not None and not is_neutral(target):
            raise InputError(f"method {sched.name!r} sets targets (target place {target.name!r}) that TRL's reward "
                             f"functions must verify against: pass target_column='solution', the dataset column "
                             f"your reward functions read the label from.")
        reward = getattr(sched.method, "reward", None)
        if (reward is not None and not is_neutral(reward) and len(self.reward_funcs) > 1
                and getattr(self, "multi_objective_aggregation", "sum_then_normalize") != "sum_then_normalize"):
            # the reward place returns one reward per rollout, r' = place(Σ_k w_k r_k): it has no
            # per-function parts for normalize_then_sum to normalise separately
            raise InputError(f"method {sched.name!r} has a reward place ({reward.name!r}), which replaces the "
                             f"weighted sum of your {len(self.reward_funcs)} reward functions by one reward; "
                             f"multi_objective_aggregation='{self.multi_objective_aggregation}' would normalise "
                             f"each function on its own. Set GRPOConfig(multi_objective_aggregation="
                             f"'sum_then_normalize') or pass one reward function.")
        self._rlpace_sup, self._rlpace_gen, self.rlpace_targets_used = {}, None, []

    def _generate(self, prompts):
        out = super()._generate(prompts)
        if self.model.training and self.rlpace_needs & TOKEN_SIGNALS:
            self._rlpace_gen = (out[0], out[1])          # local prompt ids, completion ids (lists)
        return out

    def _rlpace_token_stats(self) -> dict:
        """{signal: gathered float64[N]} for the token statistics the method reads."""
        prompt_ids, completion_ids = self._rlpace_gen
        pad = self.processing_class.pad_token_id if hasattr(self.processing_class, "pad_token_id") else 0
        pad = 0 if pad is None else pad
        device = self.accelerator.device
        p_len, c_len = max(len(p) for p in prompt_ids), max(max(len(c) for c in completion_ids), 1)
        n = len(prompt_ids)
        ids = torch.full((n, p_len + c_len), pad, dtype=torch.long)
        att = torch.zeros((n, p_len + c_len), dtype=torch.long)
        cmask = torch.zeros((n, c_len), dtype=torch.long)
        for i, (p, c) in enumerate(zip(prompt_ids, completion_ids)):
            p, c = list(p), list(c)
            ids[i, p_len - len(p):p_len] = torch.tensor(p, dtype=torch.long)    # prompts left-padded
            att[i, p_len - len(p):p_len] = 1
            if c:
                ids[i, p_len:p_len + len(c)] = torch.tensor(c, dtype=torch.long)
                att[i, p_len:p_len + len(c)] = 1
                cmask[i, :len(c)] = 1
        names = sorted(self.rlpace_needs & TOKEN_SIGNALS)
        parts = {k: [] for k in names}
        mb = self.args.per_device_train_batch_size
        with torch.no_grad():
            for s in range(0, n, mb):
                rows = slice(s, min(n, s + mb))
                logits = self.model(input_ids=ids[rows].to(device), attention_mask=att[rows].to(device)).logits
                stats = token_stats(logits[:, p_len - 1:p_len - 1 + c_len], cmask[rows].to(device), self.temperature,
                                    tokens=ids[rows, p_len:].to(device))
                for k in names:
                    parts[k].append(stats[k])
        local = torch.tensor(np.stack([np.concatenate(parts[k]) for k in names], axis=1), device=device)
        both = self.accelerator.gather(local).double().cpu().numpy()
        return {k: both[:, j] for j, k in enumerate(names)}

    def _rlpace_supervise(self, inputs, prompts, completions, completion_ids_list, per_func):
        """Targets → re-verification → reward place on the gathered groups (module docstring)."""
        g, sched = self.num_generations, self.scheduler
        local_answers = []
        for c in completions:
            a = self.rlpace_answer_extractor(c)
            local_answers.append(None if a is None else str(a).strip())
        answers = np.array(gather_object(local_answers), dtype=object).reshape(-1, g)
        ids = gather_object([x[self.rlpace_id_column] for x in inputs])
        pos = sched.pool.index_of(ids).reshape(-1, g)[:, 0]
        signals = {"answers": answers.tolist()}
        if self.rlpace_needs & TOKEN_SIGNALS:
            signals.update({k: v.reshape(-1, g) for k, v in self._rlpace_token_stats().items()})
        step = self.state.global_step
        placeholder = np.zeros(answers.shape)
        targets = list(sched.targets(Feedback(pos, placeholder, placeholder, step=step, answers=signals["answers"])))
        self.rlpace_targets_used.append((step, sched.pool.ids[pos].tolist(), targets))
        del self.rlpace_targets_used[:-64]                     # bounded: a record for tests and debugging
        n = answers.size
        t_row, zero_row = row_targets(targets, pool_labeled(sched.pool, pos), np.arange(n).reshape(-1, g), n)
        if any(t is not None for t in targets):
            col = self.rlpace_target_column
            if col is None:
                raise InputError("the Scheduler's target place gave prompts a target, but RlpaceGRPOTrainer does not "
                                 "know which column your reward functions read the label from: pass "
                                 "target_column='solution' (the dataset column with the label).")
            n_local = len(inputs)
            start = self.accelerator.process_index * n_local
            swapped = [x if t is None else {**x, col: t} for x, t in zip(inputs, t_row[start:start + n_local])]
            again = super()._calculate_rewards(swapped, prompts, completions, completion_ids_list)
            hit = torch.as_tensor(np.asarray([t is not None for t in t_row]), device=per_func.device)
            per_func = torch.where(hit[:, None], again, per_func)
        if zero_row.any():
            per_func = per_func.clone()
            per_func[torch.as_tensor(zero_row, device=per_func.device)] = 0.0
        w = self.reward_weights.to(per_func.device)
        rewards = (per_func * w).nansum(dim=1).double().cpu().numpy().reshape(-1, g)
        new = np.asarray(sched.rewards(Feedback(pos, rewards, group_advantages(rewards), step=step, **signals)),
                         dtype=np.float64)
        if not np.array_equal(new, rewards):
            j = int(torch.nonzero(w != 0)[0, 0])
            per_func = torch.zeros_like(per_func)
            per_func[:, j] = torch.as_tensor(new.ravel() / float(w[j]), dtype=per_func.dtype, device=per_func.device)
        self._rlpace_sup = signals
        return per_func

    def _rlpace_scale_advantages(self, output: dict, weights: np.ndarray, local: slice) -> None:
        """Multiply this rank's advantages by its rows of `weights` (float64[B, G]: the step's
        loss weights, or its advantage weights Ã = w·Â); untouched when every weight is 1."""
        w = weights.ravel()[local]
        if np.all(w == 1.0):
            return
        adv = output["advantages"]
        w = torch.as_tensor(w, dtype=adv.dtype, device=adv.device)
        output["advantages"] = adv * (w if adv.dim() == 1 else w[:, None])
