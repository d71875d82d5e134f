"""Rollout allocation and the pilot record on rlpace's V1 trainers (`rlpace_sync`,
`rlpace_colocate_async`, `rlpace_separate_async`), over verl's real V1 code and a REAL TransferQueue.

Each step: the rlpace trainer's `_submit_batch_to_rollout` (over verl's, which registers the
prompts in TransferQueue) hands the batch to verl's real `AgentLoopWorkerTQ.generate_sequences`
and `_run_prompt`, which start one session per rollout (`__rollout_n__`); each session's output
is written by verl's `_agent_loop_postprocess` (the model call replaced by a fixed response and
score); `RlpaceReplayBuffer.sample` (sync) or `RlpaceReplayBufferAsync.sample` (the async modes,
over verl's `ReplayBufferAsync`; their `_submit_batch_to_rollout` also stores the prompt fields,
`__rollout_n__` among them, in TransferQueue) decides the finished groups; verl's
`_compute_old_log_prob` (over a stub actor; separate_async's π_old swap included) and GRPO
`_compute_advantage` run, with rlpace's weights after it.

Runs in a subprocess with a bounded timeout (Ray on shared cores can stall); marked slow.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from _isolated import require_verl_transfer_queue, run_tq_script
from rlpace import group_advantages

require_verl_transfer_queue()

pytestmark = [pytest.mark.slow]

SHARES = [0, 1, 4, 7]        # N_i by rank of the pool position in the step's 4 prompts (budget 4·3)

SCRIPT = textwrap.dedent('''
    import torch
    mode, record, trainer_mode = sys.argv[1], sys.argv[2], sys.argv[3]
    from rlpace import Pool, Scheduler, compose
    from rlpace.adapters import _verl_v1, _verl_v1_trainer
    from rlpace.adapters._verl_core import VerlFeedback, _RecordSpec
    from rlpace.policies import make_policy
    from rlpace.policies._base import ALLOCATION, DataPolicy, EmptyState
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput
    from _isolated import V1_TRAINER_CONFIG, recording_tq_worker, run_to_completion_manager, sampled_advantages, zero_log_prob_actor

    SHARES = np.array(%s)
    def apply(state, pool, ids, budget):
        assert (len(ids), budget) == (4, 12)
        out = np.zeros(len(ids), np.int64)
        out[np.argsort(ids, kind="stable")] = SHARES
        return out
    ranked = DataPolicy(ALLOCATION, lambda p: EmptyState(), lambda s, p, b: s, apply, name="test_ranked", bounds=(0, 7))
    pool = Pool(["math"] * 8, ids=list(range(100, 108)))
    sched = Scheduler(pool, compose(make_policy("uniform"), ranked) if mode == "alloc" else make_policy("uniform"))
    observed, worker = recording_tq_worker(sched)
    worker.background_tasks = set()
    worker.config = OmegaConf.create({"actor_rollout_ref": {"rollout": {
        "n": 3, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "calculate_log_probs": False,
        "val_kwargs": {"n": 1}, "agent": {"default_agent_loop": "single_turn_agent"}}}})

    def score(index, k, step):
        return float((index * 5 + k * 3 + step) %% 7 < 3)

    async def model_call(sampling_params, trajectory, *, agent_name, trace=False, session_id=0, **kw):
        # verl's agent loop minus the model: a fixed response, scored, written by verl's postprocess
        out = AgentLoopOutput(prompt_ids=[1, 2], response_ids=[3, 4, 5], response_mask=[1, 1, 1],
                              metrics=AgentLoopMetrics(), extra_fields={})
        out.reward_score = score(int(kw["index"]), session_id, int(kw["global_steps"]))
        out.extra_fields["reward_extra_info"] = {"acc": out.reward_score}
        await worker._agent_loop_postprocess([out], False, uid=kw["uid"], session_id=session_id,
                                             global_steps=kw["global_steps"], index=kw["index"], data_source="math")
    worker._run_agent_loop = model_call

    t = object.__new__({"sync": _verl_v1_trainer.RlpacePPOTrainerSync,
                        "colocate_async": _verl_v1_trainer.RlpacePPOTrainerColocateAsync,
                        "separate_async": _verl_v1_trainer.RlpacePPOTrainerSeparateAsync}[trainer_mode])
    t.config = OmegaConf.create({"data": {"train_batch_size": 4}, **V1_TRAINER_CONFIG})
    t.trainer_mode, t.local_trigger_step = trainer_mode, 0
    t.agent_loop_manager, t.actor_rollout_wg = run_to_completion_manager(worker), zero_log_prob_actor()
    spec = _RecordSpec(record, (0.0, 1.0), 0.5) if record != "-" else None
    t.train_dataset = type("Dataset", (), {"rlpace": VerlFeedback(sched, reward_key="acc", record=spec)})
    buffer = _verl_v1.RlpaceReplayBuffer if trainer_mode == "sync" else _verl_v1.RlpaceReplayBufferAsync
    t.replay_buffer = buffer(
        trainer_mode=trainer_mode, trainer_config={}, max_off_policy_threshold=None, max_off_policy_strategy="drop",
        poll_interval=0.0, refill_fn=t._add_prompts_to_generate,
        sampler_kwargs={"train_batch_size": 4, "gen_batch_size": 1})

    steps = []
    for step, ids in ((1, [102, 100, 103, 101]), (2, [105, 107, 104, 106])):
        t.global_steps = step
        batch = tu.get_tensordict({"uid": np.array([f"s{step}p{i}" for i in ids], dtype=object),
                                   "index": np.array(ids, dtype=object),      # verl's collate_fn: object arrays
                                   "data_source": np.array(["math"] * 4, dtype=object)})
        tu.assign_non_tensor_data(batch, "global_steps", step)
        t._submit_batch_to_rollout(batch)
        steps.append(sampled_advantages(t, step, 4))
    print("RESULT " + json.dumps({
        "steps": steps, "observed": [[fb.step, pool.ids[fb.prompt_ids].tolist(), fb.rewards.tolist(),
                                      None if fb.group_sizes is None else fb.group_sizes.tolist()] for fb in observed],
        "rollouts": int(sched.counters.rollouts), "left": len(t.train_dataset.rlpace.allocated),
        "classes": [c.__name__ for c in type(t.replay_buffer).__mro__] + [type(t).__name__],
        "weights_left": len(t.replay_buffer.rlpace_weights)}), flush=True)
    tq.close()
    ray.shutdown()
''' % SHARES)


def score(index, k, step):
    return float((index * 5 + k * 3 + step) % 7 < 3)


MODES = ["sync", "colocate_async", "separate_async"]     # verl's trainer_mode of rlpace_<mode>


@pytest.mark.parametrize("trainer_mode", MODES)
def test_v1_allocation_runs_n_i_sessions_per_prompt_and_verls_grpo_equals_group_advantages(tmp_path, trainer_mode):
    out = run_tq_script(SCRIPT, ["alloc", "-", trainer_mode], tmp_path, "v1_alloc.py", 300)
    for step, ids, st in zip((1, 2), ([102, 100, 103, 101], [105, 107, 104, 106]), out["steps"]):
        n_of = dict(zip(sorted(ids), SHARES))
        sessions = {}
        for k, a, r in zip(st["keys"], st["advantages"], st["scores"]):
            uid, s, _ = k.split("_")
            sessions.setdefault(int(uid.split("p")[1]), []).append((int(s), a, r))
        # prompt i ran N_i sessions (verl's _run_prompt read __rollout_n__); N_i = 0: none; Σ = 12 - 0
        assert {i: len(v) for i, v in sessions.items()} == {i: k for i, k in n_of.items() if k}
        assert sum(len(v) for v in sessions.values()) == 12
        for i, v in sessions.items():
            r = np.array([score(i, s, step) for s, _, _ in sorted(v)])
            assert [x[2] for x in sorted(v)] == r.tolist()
            # verl's GRPO (unbiased std, eps 1e-6); one rollout: 0 (rlpace), not verl's A = r
            want = (r - r.mean()) / (r.std(ddof=1) + 1e-6) if r.size > 1 else np.zeros(1)
            np.testing.assert_allclose([x[1] for x in sorted(v)], want, atol=1e-5)
            np.testing.assert_allclose([x[1] for x in sorted(v)], group_advantages(
                np.pad(r, (0, 7 - r.size))[None, :], group_sizes=[r.size], ddof=1)[0, :r.size], atol=1e-5)
    # the Scheduler saw ragged Feedback: the prompts with rollouts, their N_i rewards
    sizes = {}
    for step, ids, rew, gs in out["observed"]:
        assert gs is not None
        for i, r, k in zip(ids, rew, gs):
            sizes[(step, i)] = k
            assert r[:k] == [score(i, s, step) for s in range(k)]
    assert sizes == {(s, i): k for s, ids in ((1, range(100, 104)), (2, range(104, 108)))
                     for i, k in zip(ids, SHARES) if k}
    assert out["rollouts"] == 24 and out["left"] == 0 and out["weights_left"] == 0
    assert_mode(out, trainer_mode)


def assert_mode(out, trainer_mode):
    """The run went through rlpace's trainer of the mode and the mode's buffer over verl's."""
    sync = trainer_mode == "sync"
    assert out["classes"][-1] == {"sync": "RlpacePPOTrainerSync", "colocate_async": "RlpacePPOTrainerColocateAsync",
                                  "separate_async": "RlpacePPOTrainerSeparateAsync"}[trainer_mode]
    assert out["classes"][:3] == (["RlpaceReplayBuffer", "_RlpaceAdmission", "ReplayBuffer"] if sync else
                                  ["RlpaceReplayBufferAsync", "_RlpaceAdmission", "ReplayBufferAsync"])


@pytest.mark.parametrize("trainer_mode", MODES)
def test_v1_pilot_record_round_trips(tmp_path, trainer_mode):
    from rlpace.advise import read_pilot
    rec = tmp_path / "pilot.jsonl"
    out = run_tq_script(SCRIPT, ["uniform", str(rec), trainer_mode], tmp_path, "v1_record.py", 300)
    pilot = read_pilot(rec)
    obs = out["observed"]
    assert [o[3] for o in obs] == [None] * len(obs)
    assert pilot.step.tolist() == [o[0] for o in obs for _ in o[1]] and sorted(set(pilot.step.tolist())) == [1, 2]
    assert list(pilot.prompt_ids) == [i for o in obs for i in o[1]]
    np.testing.assert_array_equal(pilot.rewards, np.concatenate([o[2] for o in obs]))
    assert pilot.rollouts == 24 and sorted(pilot.prompt_ids) == list(range(100, 108))
    assert_mode(out, trainer_mode)


def test_v1_pilot_record_holds_verls_validations(tmp_path, monkeypatch):
    """rlpace's V1 trainer hands what verl's V1 `_validate` passes to `_val_metrics_update` (per
    sample data source and rewards; verl's own method still computes the metrics) to the record:
    the validation before training goes on the first line written, the one after the last line
    is written alone (step 2: the last line's + 1) when verl's fit returns. acc_mean by hand: the
    share with acc (else reward) ≥ 0.5. In process; verl's fit is replaced by those calls."""
    import json
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
    from rlpace import Pool, Scheduler
    from rlpace.adapters import _verl_v1_trainer
    from rlpace.adapters._verl_core import VerlFeedback, _RecordSpec
    from rlpace.advise import read_pilot
    from rlpace.types import Feedback
    rec = tmp_path / "p.jsonl"
    sched = Scheduler(Pool(["a", "a", "b", "b"], ids=[10, 11, 12, 13]), "uniform", seed=0)
    bridge = VerlFeedback(sched, reward_key="acc", record=_RecordSpec(str(rec), (0.0, 1.0), 0.5))
    t = object.__new__(_verl_v1_trainer.RlpacePPOTrainerSync)
    t.train_dataset = type("Dataset", (), {"rlpace": bridge})
    src = ["a", "a", "b", "b"]

    def fit(self, manager):
        m = self._val_metrics_update(src, ["u0", "u1", "u2", "u3"], {"reward": [1.0, -1.0, 0.9, -1.0],
                                     "acc": [1.0, 0.0, None, 0.0]}, [], expected_acc_counts=None)
        assert any(k.startswith("val-core/a/") for k in m)
        bridge.write_record(Feedback(np.array([0, 2]), np.array([[1.0, 0.0], [0.0, 0.0]]), step=1))
        self._val_metrics_update(src, ["u0", "u1", "u2", "u3"], {"reward": [1.0, 1.0, 1.0, -1.0],
                                 "acc": [1.0, 1.0, 1.0, 0.0]}, [], expected_acc_counts=None)

    monkeypatch.setattr(PPOTrainerSync, "fit", fit)
    t.fit(None)
    lines = [json.loads(x) for x in rec.read_text().splitlines()[1:]]
    sizes = {"a": 2, "b": 2}              # one uid per sample: two held-out prompts per data source
    assert lines[0]["eval"] == {"acc_mean": 0.5, "acc": {"a": 0.5, "b": 0.5}, "n": sizes}   # 0.9 (no acc) passes
    assert lines[1] == {"step": 2, "eval": {"acc_mean": 0.75, "acc": {"a": 1.0, "b": 0.5}, "n": sizes}}
    assert [(s, n, a) for s, n, a in read_pilot(rec).evals] == [(1, 0, 0.5), (2, 4, 0.75)]


def test_v1_pilot_record_holds_the_held_out_prompts_per_data_source(tmp_path, monkeypatch):
    """With `val_kwargs.n` = 3 verl's V1 `_validate` passes each prompt's uid once per sample:
    the record's `n` per data source counts distinct uids (a: 2 prompts, b: 1, counted below from
    what is passed), the accuracies stay per sample (a 4/6, b 1/3), and `rlpace.advise`'s reader
    gives both back as the pilot's `domain_evals`, at the step of the line the validation went on."""
    import json
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
    from rlpace import Pool, Scheduler
    from rlpace.adapters import _verl_v1_trainer
    from rlpace.adapters._verl_core import VerlFeedback, _RecordSpec
    from rlpace.advise import read_pilot
    from rlpace.types import Feedback
    rec = tmp_path / "p.jsonl"
    sched = Scheduler(Pool(["a", "a", "b", "b"], ids=[10, 11, 12, 13]), "uniform", seed=0)
    bridge = VerlFeedback(sched, reward_key="acc", record=_RecordSpec(str(rec), (0.0, 1.0), 0.5))
    t = object.__new__(_verl_v1_trainer.RlpacePPOTrainerSync)
    t.train_dataset = type("Dataset", (), {"rlpace": bridge})
    uids = ["p", "p", "p", "q", "q", "q", "r", "r", "r"]
    src = ["a", "a", "a", "a", "a", "a", "b", "b", "b"]
    acc = [1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0]

    def fit(self, manager):
        self._val_metrics_update(src, uids, {"reward": acc, "acc": acc}, [], expected_acc_counts=None)
        bridge.write_record(Feedback(np.array([0, 2]), np.array([[1.0, 0.0], [0.0, 0.0]]), step=1))

    monkeypatch.setattr(PPOTrainerSync, "fit", fit)
    t.fit(None)
    sizes = {d: len({u for u, x in zip(uids, src) if x == d}) for d in set(src)}
    assert sizes == {"a": 2, "b": 1}
    ev = json.loads(rec.read_text().splitlines()[1])["eval"]
    assert ev["n"] == sizes and ev["acc"] == pytest.approx({"a": 4 / 6, "b": 1 / 3})
    assert read_pilot(rec).domain_evals == ((1, pytest.approx({"a": 4 / 6, "b": 1 / 3}), sizes),)
