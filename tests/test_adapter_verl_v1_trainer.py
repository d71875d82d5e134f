"""rlpace's V1 trainer (`rlpace.adapters._verl_v1_trainer`) over verl's real V1 code and a REAL
TransferQueue.

Groups are written by verl's own `AgentLoopWorkerTQ._agent_loop_postprocess` (as in
test_adapter_verl_tq.py), sampled by `RlpaceReplayBuffer` (sync) or `RlpaceReplayBufferAsync`
(colocate_async, separate_async), then the rlpace trainer runs verl's real `_compute_old_log_prob` (over a stub
actor worker that writes per-token log-probs and entropies into TransferQueue, as verl's worker
does) and verl's real `_compute_advantage` (GRPO), each with rlpace's step after it. Checked by
hand: the advantages in TransferQueue are GRPO's (unbiased std, eps 1e-6) times loss weight ×
advantage weight; with `entropy_min` the rewards verl trains on are −mean token entropy and the
dropped rollouts train on 0; one optimizer step of verl's own PPO loss on those advantages
equals the hand-computed weighted step.

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
    import torch
    mode, method = sys.argv[1], sys.argv[2]

    from rlpace import Pool, Scheduler, compose
    from rlpace.policies import make_policy
    from rlpace.policies._base import ADMISSION, ADVANTAGE, REWEIGHTING, Admission, DataPolicy, EmptyState
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput
    from _isolated import bare_v1_trainer, recording_tq_worker

    e = lambda p: EmptyState()                                                 # noqa: E731
    same = lambda s, p, b: s                                                   # noqa: E731
    # loss weight 1 + 0.5·g (rollout g of a group), advantage weight 0.5 on odd pool positions
    reweight = DataPolicy(REWEIGHTING, e, same, lambda s, p, b: np.tile(1.0 + 0.5 * np.arange(b.rewards.shape[1]),
                                                                         (b.rewards.shape[0], 1)), name="test_w")
    adv = DataPolicy(ADVANTAGE, e, same, lambda s, p, b: np.where((b.prompt_ids % 2 == 1)[:, None], 0.5, 1.0)
                     * np.ones(b.rewards.shape), name="test_adv")
    drop = DataPolicy(ADMISSION, e, same, lambda s, p, b: Admission(np.arange(b.rewards.shape[1])[None, :]
                                                                     != np.where(b.prompt_ids % 2 == 1, 2, -1)[:, None],
                                                                     0), name="test_drop_g2_of_odd")
    pool = Pool(["math"] * 6, ids=list(range(100, 106)))
    if method == "weights":
        m = compose(make_policy("uniform"), reweight, adv)
    else:
        m = compose(make_policy("uniform"), make_policy("entropy_min", all_prompts=True), drop)
    sched = Scheduler(pool, m)
    observed, worker = recording_tq_worker(sched)

    def write_group(uid, index, rewards, step):
        tq.kv_put(key=uid, partition_id="train", tag={"is_prompt": True, "status": "running", "global_steps": step})
        for s, r in enumerate(rewards):
            out = AgentLoopOutput(prompt_ids=[1, 2], response_ids=[3, 4, 5], response_mask=[1, 1, 1],
                                  metrics=AgentLoopMetrics(), extra_fields={})
            out.reward_score = float(r)
            out.extra_fields["reward_extra_info"] = {"acc": float(r)}
            asyncio.run(worker._agent_loop_postprocess([out], False, uid=uid, session_id=s, global_steps=step,
                                                       index=index, data_source="math"))
        tq.kv_put(key=uid, partition_id="train", tag={"is_prompt": True, "status": "finished", "global_steps": step})

    def per_token(batch):             # verl's worker writes per-token log-probs/entropies over prompt+response
        lp, ent = [], []
        for k in batch.keys:
            s = int(k.split("_")[1])
            ent.append(torch.tensor([9.0, 0.1 * (s + 1), 0.2 * (s + 1), 0.3 * (s + 1), 9.0]))
            lp.append(torch.tensor([0.0, -0.5, -1.0, -1.5, 0.0]))
        return lp, ent
    t = bare_v1_trainer(mode, sched, per_token)

    write_group("uA", 100, [1.0, 0.0, 0.0], 1)
    write_group("uB", 101, [1.0, 1.0, 0.0], 1)
    batch, _ = t.replay_buffer.sample(global_steps=1, partition_id="train", batch_size=2)
    metrics = {}
    batch = t._compute_old_log_prob(batch, metrics)
    batch = t._compute_advantage(batch, metrics)
    keys = sorted(batch.keys)
    got = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["advantages", "rm_scores", "response_mask"])
    print("RESULT " + json.dumps({
        "keys": keys, "advantages": [a.tolist() for a in got["advantages"].unbind()],
        "rm_scores": [a.tolist() for a in got["rm_scores"].unbind()],
        "observed": [[fb.prompt_ids.tolist(), fb.rewards.tolist()] for fb in observed],
        "metrics": {k: v for k, v in metrics.items() if k.startswith("rlpace/")},
        "weights_left": len(t.replay_buffer.rlpace_weights), "actor_calls": t.actor_rollout_wg.calls}), flush=True)
    tq.close()
    ray.shutdown()
''')


def run(tmp_path, mode, method):
    return run_tq_script(SCRIPT, [mode, method], tmp_path, "v1_trainer_run.py", 300)


# the actor worker's calls: separate_async (at local_trigger_step 1) keeps the current weights, computes the
# old log-probs on pi_old (version 0) and restores; the other modes compute on the loaded weights
ACTOR_CALLS = {"sync": [["log_prob", "current"]], "async": [["log_prob", "current"]],
               "separate": [["save", 1], ["restore", 0], ["log_prob", 0], ["restore", 1], ["clear", 1]]}


def grpo(r):
    r = np.asarray(r, dtype=np.float64)
    return (r - r.mean()) / (r.std(ddof=1) + 1e-6)          # verl's GRPO: torch.std (unbiased), eps 1e-6


@pytest.mark.parametrize("mode", ["sync", "async", "separate"])
def test_v1_trainer_weights_reach_verls_advantages_and_the_loss(tmp_path, mode):
    out = run(tmp_path, mode, "weights")
    assert out["keys"] == [f"{u}_{s}_0" for u in ("uA", "uB") for s in range(3)]
    # hand: A = GRPO(r) · (1 + 0.5·g) · (0.5 on odd pool position 101, else 1), on every response token
    want = np.concatenate([grpo([1, 0, 0]) * [1.0, 1.5, 2.0], grpo([1, 1, 0]) * [1.0, 1.5, 2.0] * 0.5])
    got = np.array(out["advantages"])
    assert got.shape == (6, 3)
    np.testing.assert_allclose(got, np.repeat(want[:, None], 3, axis=1), rtol=1e-5)
    assert out["weights_left"] == 0                         # applied once, then forgotten
    assert out["actor_calls"] == ACTOR_CALLS[mode]
    assert out["observed"] == [[[0, 1], [[1.0, 0.0, 0.0], [1.0, 1.0, 0.0]]]]

    # one optimizer step of verl's own PPO loss on these advantages = the hand-computed weighted step
    import torch
    from omegaconf import OmegaConf
    from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla
    lp = torch.zeros(6, 3, dtype=torch.float64, requires_grad=True)
    adv = torch.tensor(got, dtype=torch.float64)
    cfg = OmegaConf.create({"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 3.0,
                            "global_batch_info": {}})
    loss = compute_policy_loss_vanilla(lp.detach(), lp, adv, torch.ones(6, 3), loss_agg_mode="token-mean",
                                       config=cfg)[0]
    loss.backward()
    lr = 0.1
    stepped = (lp - lr * lp.grad).detach().numpy()
    # ratio 1 at the start: d/dθ[−mean(A·ratio)] = −A/18 per token, so θ' = lr·A_weighted/18
    np.testing.assert_allclose(stepped, lr * np.repeat(want[:, None], 3, axis=1) / 18, rtol=1e-5)


@pytest.mark.parametrize("mode", ["sync", "async", "separate"])
def test_v1_trainer_token_entropy_rewards_after_the_old_log_prob_pass(tmp_path, mode):
    out = run(tmp_path, mode, "entropy")
    # the response tokens' entropies of session s: 0.1, 0.2, 0.3 × (s + 1) (verl's left shift of the
    # full-sequence output); entropy_min: reward −mean = −0.2 (s + 1)
    r = [-0.2 * (s + 1) for s in range(3)]
    np.testing.assert_allclose(np.array(out["observed"][0][1]), [r, r], rtol=1e-6)
    assert out["observed"][0][0] == [0, 1]
    np.testing.assert_allclose([sc[-1] for sc in out["rm_scores"]], r + r, rtol=1e-6)   # what verl trains on
    # admission after the pass: rollout 2 of odd position 101 trains on 0; no weights otherwise
    want = np.concatenate([grpo(r), grpo(r) * [1, 1, 0]])
    np.testing.assert_allclose(np.array(out["advantages"]), np.repeat(want[:, None], 3, axis=1), rtol=1e-5, atol=1e-7)
    assert out["metrics"]["rlpace/token_rewards/dropped_rows"] == 1.0
    assert out["metrics"]["rlpace/token_rewards/rewritten_rows"] == 6.0
    assert out["actor_calls"] == ACTOR_CALLS[mode]

