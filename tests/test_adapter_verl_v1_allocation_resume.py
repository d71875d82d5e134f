"""Resume with an allocation policy on rlpace's async V1 trainers (`rlpace_colocate_async`,
`rlpace_separate_async`), over verl's real V1 code and a REAL TransferQueue.

verl's async modes checkpoint TransferQueue beside `data.pt` (`PPOTrainer._save_checkpoint`):
prompt groups generated ahead of training survive the restart — finished groups as they are,
pending ones re-issued with their stored prompt fields (`_reissue_inflight_prompts`), among them
`__rollout_n__`, the N_i rlpace's `_submit_batch_to_rollout` wrote. Each run here is three steps
of `knapsack` (min_n 1) over 8 prompts, 4 per step, 12 rollouts per step; the next step's
prompts are submitted after each step's training, as verl's async prefetch does, step 3's in two
fetches of 2 (as verl's refills come): at the checkpoint after step 2 the first fetch is finished
in TransferQueue but not yet decided, the second still pending. The run interrupted there (`data.pt` through
`RlpaceDataset.state_dict`, TransferQueue through `tq.save_checkpoint`) and resumed in a new
process (`RlpaceDataset.load_state_dict`, `tq.load_checkpoint`, verl's `_reissue_inflight_prompts`)
must end with the uninterrupted run's Scheduler state, observe the same ragged Feedback and
train step 3 on the same allocations, rewards and advantages.

Runs in subprocesses with a bounded timeout (Ray on shared cores can stall); marked slow.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from _isolated import require_verl_transfer_queue, run_tq_script

require_verl_transfer_queue()

pytestmark = [pytest.mark.slow]

SCRIPT = textwrap.dedent('''
    import os, pickle, torch
    run, ckpt, trainer_mode = sys.argv[1], sys.argv[2], sys.argv[3]
    from rlpace import Pool, Scheduler
    from rlpace.adapters import _verl_v1, _verl_v1_trainer
    from rlpace.adapters._verl_core import VerlFeedback
    from rlpace.adapters.verl import RlpaceDataset
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput
    from _isolated import V1_TRAINER_CONFIG, recording_tq_worker, run_to_completion_manager, sampled_advantages, zero_log_prob_actor

    pool = Pool(["math"] * 8, ids=list(range(100, 108)))
    sched = Scheduler(pool, "knapsack", min_n=1, max_n=8, min_count=2, seed=0)
    observed, worker = recording_tq_worker(sched)
    worker.background_tasks = set()
    worker.config = OmegaConf.create({"actor_rollout_ref": {"rollout": {
        "n": 3, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "calculate_log_probs": False,
        "val_kwargs": {"n": 1}, "agent": {"default_agent_loop": "single_turn_agent"}}}})

    def score(index, k):
        return float((index * 5 + k * 3) % 7 < 3)

    async def model_call(sampling_params, trajectory, *, agent_name, trace=False, session_id=0, **kw):
        out = AgentLoopOutput(prompt_ids=[1, 2], response_ids=[3, 4, 5], response_mask=[1, 1, 1],
                              metrics=AgentLoopMetrics(), extra_fields={})
        out.reward_score = score(int(kw["index"]), session_id)
        out.extra_fields["reward_extra_info"] = {"acc": out.reward_score}
        await worker._agent_loop_postprocess([out], False, uid=kw["uid"], session_id=session_id,
                                             global_steps=kw["global_steps"], index=kw["index"], data_source="math")
    worker._run_agent_loop = model_call

    t = object.__new__({"colocate_async": _verl_v1_trainer.RlpacePPOTrainerColocateAsync,
                        "separate_async": _verl_v1_trainer.RlpacePPOTrainerSeparateAsync}[trainer_mode])
    t.config = OmegaConf.create({"data": {"train_batch_size": 4}, "trainer": {"v1": {}}, **V1_TRAINER_CONFIG})
    t.trainer_mode, t.local_trigger_step = trainer_mode, 0
    t.agent_loop_manager, t.actor_rollout_wg = run_to_completion_manager(worker), zero_log_prob_actor()
    t.train_dataset = object.__new__(RlpaceDataset)
    t.train_dataset.rlpace = VerlFeedback(sched, reward_key="acc")
    t.replay_buffer = _verl_v1.RlpaceReplayBufferAsync(
        trainer_mode=trainer_mode, trainer_config={}, max_off_policy_threshold=None, max_off_policy_strategy="drop",
        poll_interval=0.0, refill_fn=t._add_prompts_to_generate,
        sampler_kwargs={"train_batch_size": 4, "gen_batch_size": 1})

    BATCHES = {1: [102, 100, 103, 101], 2: [105, 107, 104, 106], 3: [101, 106, 100, 105]}

    def submit(step, ids, defer=False):
        t.global_steps = step
        batch = tu.get_tensordict({"uid": np.array([f"s{step}p{i}" for i in ids], dtype=object),
                                   "index": np.array(ids, dtype=object),
                                   "data_source": np.array(["math"] * len(ids), dtype=object)})
        tu.assign_non_tensor_data(batch, "global_steps", step)
        t.agent_loop_manager.defer = defer
        t._submit_batch_to_rollout(batch)
        t.agent_loop_manager.defer = False

    def plain(x):
        if isinstance(x, dict):
            return {str(k): plain(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [plain(v) for v in x]
        if hasattr(x, "tolist"):
            return x.tolist()
        return x

    steps, first, ahead, reissued = [], 1, {}, 0
    if run == "resume":                    # verl's _load_checkpoint, then fit's re-issue of pending prompts
        state = torch.load(os.path.join(ckpt, "data.pt"), weights_only=False)
        t.train_dataset.load_state_dict(state)
        tq.load_checkpoint(os.path.join(ckpt, "transfer_queue"))
        first = 3
        t.global_steps = first
        reissued = t._reissue_inflight_prompts()
    else:
        submit(1, BATCHES[1])
    for step in range(first, 4):
        t.global_steps = step
        steps.append({"step": step, **sampled_advantages(t, step, 4)})
        if step == 1:
            submit(2, BATCHES[2])          # async prefetch: the next batch generates while this one trains
        elif step == 2:                    # in two fetches of 2 (as verl's refills): one finished, one
            submit(3, BATCHES[3][:2])      # still pending when the interrupted run checkpoints
            submit(3, BATCHES[3][2:], defer=run == "first")
        if run == "first" and step == 2:   # verl's _save_checkpoint after step 2 (before its cleanup), then the end
            ahead = {k: tag["status"] for k, tag in tq.kv_list("train")["train"].items() if tag.get("is_prompt")}
            os.makedirs(ckpt, exist_ok=True)
            torch.save(t.train_dataset.state_dict(), os.path.join(ckpt, "data.pt"))
            tq.save_checkpoint(os.path.join(ckpt, "transfer_queue"), metadata={"global_steps": step})
            break
        tq.kv_clear(keys=steps[-1]["keys"], partition_id="train")      # trained: gone, as at the end of verl's fit step
    print("RESULT " + json.dumps({
        "steps": steps, "state": plain(sched.state_dict()), "ahead": ahead, "reissued": reissued,
        "observed": [[fb.step, pool.ids[fb.prompt_ids].tolist(), fb.rewards.tolist(),
                      None if fb.group_sizes is None else fb.group_sizes.tolist()] for fb in observed],
        "rollouts": int(sched.counters.rollouts), "left": len(t.train_dataset.rlpace.allocated)}), flush=True)
    tq.close()
    ray.shutdown()
''')


@pytest.mark.parametrize("trainer_mode", ["colocate_async", "separate_async"])
def test_v1_async_resume_with_allocation_replays_the_uninterrupted_run(tmp_path, trainer_mode):
    ckpt = str(tmp_path / "global_step_2")
    whole = run_tq_script(SCRIPT, ["whole", "-", trainer_mode], tmp_path, "whole.py", 300)
    first = run_tq_script(SCRIPT, ["first", ckpt, trainer_mode], tmp_path, "first.py", 300)
    resumed = run_tq_script(SCRIPT, ["resume", ckpt, trainer_mode], tmp_path, "resume.py", 300)
    # the uninterrupted run: step 3 was allocated unevenly from what steps 1-2 observed
    sizes3 = [o[3] for o in whole["observed"] if o[0] == 3]
    assert sizes3 and all(s is not None for s in sizes3)
    n3 = [k for s in sizes3 for k in s]
    assert sum(n3) == 12 and len(set(n3)) > 1
    assert whole["rollouts"] == 36 and whole["left"] == 0
    # at the checkpoint: step 3's first fetch finished (undecided), the second pending; re-issued on resume
    assert first["ahead"] == {"s3p101": "finished", "s3p106": "finished", "s3p100": "pending", "s3p105": "pending"}
    assert resumed["reissued"] == 2
    # interrupted after step 2, resumed: the same steps 1-2, then the same step 3
    assert first["steps"] == whole["steps"][:2] and first["observed"] == whole["observed"][:len(first["observed"])]
    assert resumed["steps"] == whole["steps"][2:]
    assert first["observed"] + resumed["observed"] == whole["observed"]
    assert resumed["state"] == whole["state"] and resumed["rollouts"] == 36 and resumed["left"] == 0
    # step 3 by hand: prompt i ran N_i sessions; verl's GRPO (unbiased std) over them, 0 for a singleton
    n_of = {i: k for o in whole["observed"] if o[0] == 3 for i, k in zip(o[1], o[3])}
    st = resumed["steps"][0]
    sessions = {}
    for k, a, r in zip(st["keys"], st["advantages"], st["scores"]):
        uid, s, _ = k.split("_")
        sessions.setdefault(int(uid.split("p")[1]), []).append((int(s), a, r))
    assert {i: len(v) for i, v in sessions.items()} == n_of
    for i, v in sessions.items():
        r = np.array([float((i * 5 + s * 3) % 7 < 3) for s, _, _ in sorted(v)])
        assert [x[2] for x in sorted(v)] == r.tolist()
        want = (r - r.mean()) / (r.std(ddof=1) + 1e-6) if r.size > 1 else np.zeros(1)
        np.testing.assert_allclose([x[1] for x in sorted(v)], want, atol=1e-5)
