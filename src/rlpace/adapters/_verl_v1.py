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
std); its decisions live in the Scheduler, which `data.pt` saves through the dataset, with
the uids of the decided groups not yet trained and their weights (`rlpace_state`: verl's async
modes restore those groups from their TransferQueue checkpoint, and the resumed buffer must not
observe them again). The weights of a group verl evicts go with it (`_clear_groups`). The
buffer reaches the dataset's Scheduler through
the trainer that verl binds `refill_fn` to (`refill_fn.__self__.train_dataset`).

Loss weights and the advantage place: `decide_groups` keeps each kept rollout's weight
(loss weight × advantage weight) by session, and rlpace's V1 trainer
(`rlpace.adapters._verl_v1_trainer`, `trainer.v1.trainer_mode=rlpace_sync`, ...) multiplies
verl's advantages by it after `_compute_advantage`; with verl's own V1 trainer a method
that needs them is refused (nothing would apply them).

Supervision transforms (a method with a target or reward place: `ttrl`, `olr`,
`trapo`): `_supervise` runs on each step's finished groups before `decide_groups` observes
them — answers from the decoded `responses`, `Scheduler.targets`, re-verification by verl's
reward manager (built from the trainer's config and tokenizer, reached through `refill_fn`,
which verl binds to the trainer), `Scheduler.rewards` — and writes changed rewards into
TransferQueue's `rm_scores` before verl's `_compute_advantage` reads them. Token-statistic
rewards need verl's old-log-prob pass, which runs after sampling: with rlpace's V1 trainer the
buffer then admits every finished group unobserved and the trainer decides them after that
pass (`RlpaceV1TrainerMixin`); with verl's own trainer they are refused.
"""

from __future__ import annotations

from ..errors import InputError
from collections import Counter

import numpy as np
from verl.trainer.ppo.v1 import replay_buffer as _rb

from ..policies import active_supervision_places, is_neutral
from ._convert import Rows, chosen_rewards, feedbacks_from_rows
from ._supervision import TOKEN_SIGNALS, extract_answer, needs, needs_supervision_pass
from ._verl_core import VerlFeedback, check_verl_internals, check_verl_version, refuse_gradient_features

__all__ = ["RlpaceReplayBuffer", "RlpaceReplayBufferAsync", "decide_groups"]


def decide_groups(bridge: VerlFeedback, rows: Rows, keys: list[str], step: int,
                  weights: dict | None = None) -> tuple[set, set, dict]:
    """Observe finished groups and apply admission (`Scheduler.step`: observe, admission, weights).

    Returns (evicted uids, trajectory keys to clear inside kept groups, {uid: mean reward}).
    `weights` (when given) receives {session `uid_s`: loss weight × advantage weight} of every
    kept rollout whose product is not 1 (the advantage weight only with an advantage place).
    Allocated groups (rlpace's V1 trainer with an allocation place) form one ragged Feedback;
    with `bridge.zero_singletons` (a group estimator) a group of one rollout gets weight 0: verl's
    GRPO would give it A = r, rlpace's `group_advantages` gives 0 (no relative signal).
    """
    evicted, cleared, mean = set(), set(), {}
    advantage = bool(active_supervision_places(bridge.scheduler.method) & {"advantage"})
    single = getattr(bridge, "zero_singletons", False)
    for fb, idx in bridge.feedbacks(rows, step, finished=list(dict.fromkeys(rows.group_keys))):
        res = bridge.scheduler.step(fb)                     # observe, admission, weights: one validation
        bridge.write_record(fb)
        keep = res.keep
        w = res.weights * res.advantage_weights if advantage else res.weights
        sizes = np.full(idx.shape[0], idx.shape[1]) if fb.group_sizes is None else fb.group_sizes
        for b in range(idx.shape[0]):
            n = int(sizes[b])
            if n == 0:
                continue
            uid = str(rows.group_keys[idx[b, 0]])
            mean[uid] = float(fb.rewards[b, :n].mean())
            kb, wb = keep[b, :n], w[b, :n].copy()
            if single and fb.group_sizes is not None and n == 1:
                wb[:] = 0.0
            if not kb.any():
                evicted.add(uid)
            else:
                cleared.update(keys[i] for i in idx[b, :n][~kb])
            if weights is not None:
                for g in np.flatnonzero(kb & (wb != 1.0)):
                    weights[keys[idx[b, g]].rsplit("_", 1)[0]] = float(wb[g])
    return evicted, cleared, mean


def trainer_places(sched) -> list[str]:
    """What of the Scheduler's method only rlpace's V1 trainer applies (empty: the buffer alone
    does the method): loss weights, the advantage place, token-statistic rewards."""
    m = sched.method
    out = [f"loss weights ({m.reweighting.name!r})"] if not is_neutral(m.reweighting) else []
    if "advantage" in active_supervision_places(m):
        out.append(f"advantage place {m.advantage.name!r}")
    return out + [f"token statistic {s!r}" for s in sorted(needs(sched) & TOKEN_SIGNALS)]


def refuse_trainer_places(sched) -> None:
    """InputError when the method needs what only rlpace's V1 trainer applies (`trainer_places`)."""
    missing = trainer_places(sched)
    if missing:
        raise InputError(
            f"method {sched.name!r} needs {', '.join(missing)}, which rlpace applies in its own V1 trainer "
            f"(verl's V1 trainer would never apply them): run examples/verl_v1_trainer.py with "
            f"trainer.v1.trainer_mode=rlpace_sync (or rlpace_colocate_async, rlpace_separate_async; "
            f"docs/engines.md), or the legacy trainer (examples/verl_legacy_trainer.py).")


class _RlpaceAdmission:
    def __init__(self, trainer_mode, trainer_config, max_off_policy_threshold, max_off_policy_strategy,
                 sampler_kwargs, poll_interval: float = 2.0, refill_fn=None):
        check_verl_version("replay_buffer")
        kw = dict(sampler_kwargs or {})
        missing = [k for k in ("train_batch_size", "gen_batch_size") if k not in kw]
        if missing:
            raise InputError(f"trainer.v1.sampler.sampler_kwargs needs {missing} (verl passes them only to "
                             f"its own buffer): add '+trainer.v1.sampler.sampler_kwargs.train_batch_size="
                             f"${{data.train_batch_size}}' and '...gen_batch_size=1'.")
        if int(kw["gen_batch_size"]) != 1:
            raise InputError("sampler_kwargs.gen_batch_size must be 1 (and data.gen_batch_size=1): refills "
                             "are whole dataloader fetches, and evictions come one group at a time.")
        check_verl_internals("replay_buffer")
        # verl passes the trainer's bound `_add_prompts_to_generate`: the trainer holds the train
        # dataset (its Scheduler) and the config and tokenizer the supervision transforms need
        # (verl gives the buffer none of them)
        self._rlpace_trainer = getattr(refill_fn, "__self__", None)
        if self._rlpace_trainer is None:
            raise InputError("RlpaceReplayBuffer reaches the train dataset's Scheduler through refill_fn.__self__ "
                             "(verl passes the trainer's bound _add_prompts_to_generate); this refill_fn is "
                             f"{refill_fn!r}. Build the buffer from verl's V1 trainer.")
        self.rlpace_answer_extractor = extract_answer
        self.rlpace_weights: dict[str, float] = {}       # session uid_s -> weight, until its batch trains
        self._rlpace_checked = False
        super().__init__(trainer_mode, trainer_config, max_off_policy_threshold, max_off_policy_strategy,
                         sampler_kwargs, poll_interval=poll_interval, refill_fn=refill_fn,
                         filter_groups_metric="rlpace", train_batch_size=int(kw["train_batch_size"]),
                         gen_batch_size=1, max_inflight_gen_batches=int(kw.get("max_inflight_gen_batches", 1)))
        check_verl_internals("replay_buffer_state", self)

    @property
    def rlpace(self) -> VerlFeedback:
        bridge = getattr(getattr(self._rlpace_trainer, "train_dataset", None), "rlpace", None)
        if bridge is None:
            raise InputError("RlpaceReplayBuffer shares the train dataset's Scheduler: set "
                             "data.custom_cls.path=pkg://rlpace.adapters.verl data.custom_cls.name=RlpaceDataset.")
        if not getattr(self, "_rlpace_checked", False):
            bridge.v1_buffer = self                      # the dataset saves this buffer's state with the Scheduler's
            # rlpace's V1 trainer (it applies weights) also applies allocation; verl's own does not
            refuse_gradient_features(bridge.scheduler,
                                     allocation=getattr(self._rlpace_trainer, "rlpace_applies_weights", False))
            if not getattr(self._rlpace_trainer, "rlpace_applies_weights", False):
                refuse_trainer_places(bridge.scheduler)
            self._rlpace_checked = True
        return bridge

    def _deferred(self) -> bool:
        """True when the groups are decided after verl's old-log-prob pass (token statistics)."""
        return bool(needs(self.rlpace.scheduler) & TOKEN_SIGNALS)

    def _supervised(self) -> bool:
        """True when finished groups go through `_supervise` before they are decided: a target or
        reward place, or a policy that reads answers (an advantage place alone acts in the trainer)."""
        sched = self.rlpace.scheduler
        return needs_supervision_pass(sched) and bool(
            active_supervision_places(sched.method) & {"target", "reward"} or "answers" in needs(sched))

    def pop_weights(self, keys: list[str]) -> np.ndarray:
        """float64[len(keys)]: the weight of each trajectory key's session (1 when none), forgotten."""
        sessions = [k.rsplit("_", 1)[0] for k in keys]
        w = np.array([self.rlpace_weights.get(s, 1.0) for s in sessions])
        for s in set(sessions):
            self.rlpace_weights.pop(s, None)
        return w

    def rlpace_state(self) -> dict:
        """What `data.pt` carries of this buffer (through the dataset): the uids of the finished
        groups it decided that no batch has trained yet, and their sessions' weights. verl's async
        modes checkpoint TransferQueue and restore those groups on resume; without this the resumed
        buffer would observe them a second time."""
        return {"decided": sorted(self._dapo_classification_cache.get("train", {})),
                "weights": dict(self.rlpace_weights)}

    def _restore(self, cache: dict, finished: set) -> None:
        """Take the state `data.pt` restored (`rlpace_state`): its groups still in TransferQueue
        count as decided (admitted, not observed again), with their weights."""
        state, self.rlpace.v1_restored = self.rlpace.v1_restored, None
        for uid in set(state["decided"]) & finished:
            cache.setdefault(uid, None)
        self.rlpace_weights.update({s: float(w) for s, w in state["weights"].items() if s.split("_")[0] in finished})

    def _clear_groups(self, partition_id: str, uids: set[str]) -> None:
        # verl clears every group it evicts here (stale past max_off_policy_threshold, filtered,
        # failed, the surplus of a full sync batch), after this buffer decided some of them: no
        # batch will train their rollouts, so their weights go too (else the map grows each step)
        super()._clear_groups(partition_id, uids)
        if uids and self.rlpace_weights:
            for s in [s for s in self.rlpace_weights if s.split("_")[0] in uids]:
                del self.rlpace_weights[s]
        if partition_id != "val" and uids:       # allocations of groups never decided (failed ones)
            allocated = getattr(getattr(getattr(self._rlpace_trainer, "train_dataset", None), "rlpace", None),
                                "allocated", None)
            for uid in uids if allocated else ():
                allocated.pop(str(uid), None)

    def _dapo_filtered_keys(self, partition_id: str):
        if partition_id == "val":
            return set(), Counter()
        cache = self._dapo_classification_cache[partition_id]     # uid -> mean reward if evicted else None
        finished = self.finished_keys[partition_id]
        if self.rlpace.v1_restored is not None:                    # the first poll after a resume
            self._restore(cache, finished)
        for uid in cache.keys() - finished:
            del cache[uid]
        new = finished - cache.keys()
        if self._deferred():             # token statistics exist only after sampling: the trainer decides
            for uid in new:
                cache[uid] = None
            new = set()
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
                sub = Rows(*(None if f is None else f[at] for f in rows))
                if self._supervised():            # targets → re-verification → reward place
                    sub = self._supervise(partition_id, [keys[i] for i in at], sub, int(s))
                e, c, m = decide_groups(self.rlpace, sub, [keys[i] for i in at], step=int(s),
                                        weights=self.rlpace_weights)
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

    def _supervise(self, partition_id: str, keys: list[str], rows: Rows, step: int) -> Rows:
        """The supervision transforms on finished groups, before they are observed: answers
        from the decoded responses, `Scheduler.targets`, re-verification of the rollouts of
        prompts with a target by verl's reward manager (fresh `reward_model` dict per rollout),
        `Scheduler.rewards`. TransferQueue's `rm_scores` (the score on the last response token,
        as the agent loop writes it), which verl's `_compute_advantage` reads, is rewritten for
        re-verified rollouts (the manager's `reward_score`), unverified ones (0) and the groups
        the reward place changes (its output). Returns the rows with the rewards rlpace
        observes (`reward_key`, then the reward place) and the answers."""
        import torch
        from tensordict import TensorDict

        from ._supervision import retargeted, step_targets
        sched = self.rlpace.scheduler
        sessions = {k.rsplit("_", 1)[0] for k in keys}
        if any(k.rsplit("_", 1)[0] in sessions and k.rsplit("_", 1)[1] != "0" for k in self.partitions[partition_id]):
            raise InputError("rlpace's supervision transforms on verl's V1 trainer support agent loops with one "
                             "output per session (each rollout is one trajectory); this one writes several.")
        trainer = self._rlpace_trainer
        data = _rb.tq.kv_batch_get(keys=keys, partition_id=partition_id,
                                   select_fields=["responses", "reward_model", "data_source", "extra_info"])
        plain = lambda col: [getattr(v, "data", v) for v in data[col]]  # noqa: E731
        responses = list(data["responses"])
        answers = np.empty(len(keys), dtype=object)
        for i, r in enumerate(responses):
            a = self.rlpace_answer_extractor(trainer.tokenizer.decode(r, skip_special_tokens=True))
            answers[i] = None if a is None else str(a).strip()
        # a group's rollouts in session order (keys sort as strings): TTRL's first-seen tie rule
        rows = rows._replace(answers=answers, order=np.array([int(k.rsplit("_", 2)[1]) for k in keys]))
        n = len(keys)
        target, zero = step_targets(sched, feedbacks_from_rows(sched.pool, rows._replace(rewards=np.zeros(n)),
                                                               step=step), n)
        rewards = np.array(rows.rewards, dtype=np.float64)
        # the score verl trains on (rm_scores), where it changes: the reward manager's
        # `reward_score` for a re-verified rollout (which may differ from the observed
        # `reward_key`, e.g. math_dapo's score ±1 beside acc 0/1), 0 for an unverified one,
        # the reward place's output for a group it changes
        scores = np.full(n, np.nan)
        rescored = np.flatnonzero(target != None)  # noqa: E711
        if rescored.size:
            from verl import DataProto
            manager = self._rlpace_manager()
            rms, sources, extras = plain("reward_model"), plain("data_source"), plain("extra_info")
            items = []
            for i in rescored:
                resp = responses[i].reshape(1, -1)
                rm = retargeted(rms[i], target[i])
                items.append(DataProto.from_dict(
                    tensors={"responses": resp, "attention_mask": torch.ones_like(resp)},
                    non_tensors={"reward_model": np.array([rm], dtype=object),
                                 "data_source": np.array([sources[i]], dtype=object),
                                 "extra_info": np.array([dict(extras[i] or {})], dtype=object)}))

            async def run():
                import asyncio
                return await asyncio.gather(*(manager.run_single(it) for it in items))
            for i, res in zip(rescored, manager.loop.run_until_complete(run())):
                info = res.get("reward_extra_info", {})
                rewards[i] = float(chosen_rewards(info, self.rlpace.reward_key, res["reward_score"]))
                scores[i] = float(res["reward_score"])
        rewards[zero] = scores[zero] = 0.0
        out = rewards.copy()
        for fb, idx in feedbacks_from_rows(sched.pool, rows._replace(rewards=rewards), step=step):
            new = np.asarray(sched.rewards(fb), dtype=np.float64)
            out[idx] = new
            moved = (new != fb.rewards).any(axis=1)              # groups the reward place changed
            scores[idx[moved]] = new[moved]
        changed = np.flatnonzero(~np.isnan(scores))
        if changed.size:
            rm = [torch.zeros(len(responses[i]), dtype=torch.float32) for i in changed]
            for sc, i in zip(rm, changed):
                sc[-1] = float(scores[i])
            nested = torch.nested.as_nested_tensor(rm, layout=torch.jagged)
            _rb.tq.kv_batch_put(keys=[keys[i] for i in changed], partition_id=partition_id,
                                fields=TensorDict({"rm_scores": nested}, batch_size=len(changed)))
        return rows._replace(rewards=out)

    def _rlpace_manager(self):
        if getattr(self, "_rlpace_reward_manager", None) is None:
            from verl.trainer.ppo.reward import load_reward_manager
            t = self._rlpace_trainer
            if t is None or not hasattr(t, "config") or not hasattr(t, "tokenizer"):
                raise InputError("rlpace's supervision transforms on verl's V1 trainer reach the trainer's config and "
                                 "tokenizer through the buffer's refill_fn (verl passes the trainer's bound "
                                 "_add_prompts_to_generate); this buffer was built without it.")
            self._rlpace_reward_manager = load_reward_manager(t.config, t.tokenizer)
        return self._rlpace_reward_manager

    def _rows(self, keys: list[str], data) -> Rows:
        key = self.rlpace.reward_key
        extra = [getattr(v, "data", v) for v in data["extra_fields"]]
        infos = [e.get("reward_extra_info", {}) if isinstance(e, dict) else {} for e in extra]

        def sequence_scores():
            try:
                scores = data["rm_scores"]
            except (KeyError, TypeError):
                scores = None
            if scores is None or len(scores) != len(keys):
                raise InputError(
                    f"finished rollouts reached the replay buffer without rewards (no 'rm_scores' and no "
                    f"reward_extra_info[{key!r}] in TransferQueue): rlpace admission reads rewards when it "
                    f"samples, and a colocated reward model (reward.reward_model.enable=True without "
                    f"enable_resource_pool) scores only after sampling. Use a rule-based reward or set "
                    f"reward.reward_model.enable_resource_pool=True (verl's own condition for "
                    f"algorithm.filter_groups).")
            return np.array([float(s.sum()) for s in scores])

        # the reward function's field counts only when every rollout carries it
        fields = {key: [float(i[key]) for i in infos]} if key and all(key in i for i in infos) else {}
        rewards = chosen_rewards(fields, key, sequence_scores)
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
