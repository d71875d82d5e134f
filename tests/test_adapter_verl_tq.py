"""verl's V1 replay buffer with rlpace admission over a REAL TransferQueue.

TransferQueue runs its controller and storage units as Ray actors, each reserving one
logical CPU; on a 2-core machine TransferQueue's default 2 storage units (verl's config
asks for 8) plus the controller exceed what `ray.init()` offers and `tq.init()` waits
forever. With `backend.SimpleStorage.num_data_storage_units=1` and `ray.init(num_cpus=2)`
it starts in a few seconds (Ray itself takes ~20 s here).

Rollouts are written by verl's own `AgentLoopWorkerTQ._agent_loop_postprocess` (the
method the rollout worker runs after each agent-loop session: reward copy onto every
output of a multi-output session, `{uid}_{session}_{i}` keys, tags, `kv_batch_put`), on a
worker built without its rollout server. G = 3 sessions per prompt, 2 outputs each.
Admission drops groups whose rewards are all equal (evicted, refilled by verl's rule) and
session 2 of groups at odd pool positions (cleared from TransferQueue inside a kept
group). Checked: the Scheduler's history is exactly the written rewards (a plain loop),
each Feedback is the group's rewards with GRPO advantages, the sampled keys are every
output of every kept session, and the dropped ones are gone from TransferQueue.

Runs in a subprocess with a bounded timeout (Ray on shared cores can stall); marked slow.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from _isolated import require_verl_transfer_queue, run_tq_script

require_verl_transfer_queue()

pytestmark = [pytest.mark.slow]

# After _isolated's TransferQueue start (Ray and TransferQueue up, `tq` imported).
SCRIPT = textwrap.dedent('''
    mode = sys.argv[1]

    from rlpace import Pool, Scheduler, compose
    from rlpace.adapters import _verl_v1
    from rlpace.policies import make_policy
    from rlpace.policies._base import ADMISSION, Admission, DataPolicy, EmptyState
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

    def keep_fn(b):
        keep = np.ones(b.rewards.shape, bool)
        keep[b.prompt_ids % 2 == 1, 2] = False
        keep[b.rewards.std(axis=1) == 0] = False
        return keep

    pool = Pool(["math", "logic"] * 5, ids=list(range(100, 110)))
    sched = Scheduler(pool, compose(make_policy("uniform"), DataPolicy(
        ADMISSION, lambda p: EmptyState(), lambda s, p, b: s, lambda s, p, b: Admission(keep_fn(b), 0),
        name="test_admission")))
    from _isolated import recording_tq_worker
    observed, worker = recording_tq_worker(sched)                     # verl's write path, no server
    written = {}

    def write_group(uid, index, rewards, step):
        tq.kv_put(key=uid, partition_id="train", tag={"is_prompt": True, "status": "running", "global_steps": step})
        for s, r in enumerate(rewards):
            outs = [AgentLoopOutput(prompt_ids=[1, 2], response_ids=[3, 4 + i], response_mask=[1, 1],
                                    metrics=AgentLoopMetrics(), extra_fields={}) for i in range(2)]
            outs[-1].reward_score = float(r)                               # the final output is scored
            outs[-1].extra_fields["reward_extra_info"] = {"acc": float(r)}
            asyncio.run(worker._agent_loop_postprocess(outs, False, uid=uid, session_id=s, global_steps=step,
                                                       index=index, data_source="math"))
        tq.kv_put(key=uid, partition_id="train", tag={"is_prompt": True, "status": "finished", "global_steps": step})
        written[uid] = (index, list(rewards), step)

    refills, queue = [], [("uD", 103, [0.0, 1.0, 1.0]), ("uE", 104, [1.0, 1.0, 1.0]),   # uE: evicted too
                          ("uF", 105, [1.0, 0.0, 1.0]), ("uG", 106, [0.0, 1.0, 0.0])]
    def refill(n):                       # verl's refill_fn: n more prompts, drawn at step 2
        refills.append(n)
        for _ in range(n):
            write_group(*queue.pop(0), 2)

    import rlpace.adapters.verl as rv

    class Trainer:                       # what verl binds refill_fn to: the buffer reaches the dataset's Scheduler
        train_dataset = type("Dataset", (), {"rlpace": rv.VerlFeedback(sched, reward_key="acc")})

        def _add_prompts_to_generate(self, n):
            return refill(n)

    kw = dict(trainer_config={}, max_off_policy_threshold=None, max_off_policy_strategy="drop", poll_interval=0.0,
              refill_fn=Trainer()._add_prompts_to_generate,
              sampler_kwargs={"train_batch_size": 3, "gen_batch_size": 1})
    if mode == "sync":
        buf = _verl_v1.RlpaceReplayBuffer(trainer_mode="sync", **kw)
    else:
        buf = _verl_v1.RlpaceReplayBufferAsync(trainer_mode="fully_async", **kw)
    write_group("uA", 100, [1.0, 0.0, 0.0], 1)
    write_group("uB", 101, [1.0, 1.0, 1.0], 1)                          # no variance: evicted
    write_group("uC", 102, [0.0, 1.0, 1.0], 1)
    meta, metrics = buf.sample(global_steps=2, partition_id="train", batch_size=3)
    left = sorted(tq.kv_list(partition_id="train")["train"])
    print("RESULT " + json.dumps({
        "keys": sorted(meta.keys), "left": left, "refills": refills, "written": written,
        "evicted": metrics.get("training/filter_groups/evicted_samples"),
        "observed": [[fb.prompt_ids.tolist(), fb.rewards.tolist(), fb.advantages.tolist(), fb.step]
                     for fb in observed],
        "attempts": sched.history.attempts.tolist(), "successes": sched.history.successes.tolist(),
        "last_step": sched.history.last_step.tolist()}), flush=True)
    tq.close()
    ray.shutdown()
''')


def run_buffer(tmp_path, mode):
    return run_tq_script(SCRIPT, [mode], tmp_path, "tq_run.py", 240)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_replay_buffer_over_real_transfer_queue_feeds_the_scheduler_exactly(tmp_path, mode):
    out = run_buffer(tmp_path, mode)
    written = out["written"]
    # hand reference: every written group observed once, at the step it was drawn
    attempts, successes, last = np.zeros(10, int), np.zeros(10, int), np.full(10, -1)
    for uid, (index, rewards, step) in written.items():
        attempts[index - 100] += 3
        successes[index - 100] += int(sum(r >= 0.5 for r in rewards))
        last[index - 100] = max(last[index - 100], step)
    assert out["attempts"] == attempts.tolist() and out["successes"] == successes.tolist()
    assert out["last_step"] == last.tolist()
    seen = {}
    for ids, rewards, adv, step in out["observed"]:
        for i, r, a in zip(ids, rewards, adv):
            r = np.array(r)
            want = (r - r.mean()) / (r.std() + 1e-6) if r.std() > 0 else np.zeros(3)
            np.testing.assert_allclose(a, want, rtol=1e-12)
            seen[i + 100] = (r.tolist(), step)
    assert seen == {index: (rewards, step) for index, rewards, step in written.values()}
    # uA, uC (even positions 0, 2) kept whole; uD (position 3) keeps sessions 0 and 1; uB (and
    # in sync mode uE) evicted. verl's refill rule: sync 2 prompts per eviction, async 1.
    kept_sessions = {"uA": [0, 1, 2], "uC": [0, 1, 2], "uD": [0, 1]}
    assert sorted(out["keys"]) == sorted(f"{u}_{s}_{i}" for u, ss in kept_sessions.items() for s in ss
                                         for i in (0, 1))
    assert "uD_2_0" not in out["left"] and "uD_2_1" not in out["left"] and "uD_1_1" in out["left"]
    assert not any(k.startswith(("uB_", "uE_")) for k in out["left"])
    if mode == "sync":
        assert out["refills"] == [2] and sorted(written) == ["uA", "uB", "uC", "uD", "uE"]
        assert out["evicted"] == 2
    else:
        assert out["refills"] == [1] and sorted(written) == ["uA", "uB", "uC", "uD"]
        assert out["evicted"] == 1
