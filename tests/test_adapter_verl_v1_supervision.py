"""Targets and answer-reading rewards on verl's V1 trainers, sync and both async modes, over
verl's real V1 code and a REAL TransferQueue.

Groups are written by verl's own `AgentLoopWorkerTQ._agent_loop_postprocess` with decodable
responses; `RlpaceReplayBuffer` (sync) or `RlpaceReplayBufferAsync` (colocate_async,
separate_async: verl's `wait_for_sampleable` loop) samples them, running rlpace's supervision
transforms on the finished groups (answers decoded, TTRL's vote, re-verification by verl's
reward manager, the reward place); then rlpace's V1 trainer runs verl's real
`_compute_old_log_prob` (stub actor worker) and `_compute_advantage` (GRPO). Checked by hand:
the rewards the Scheduler observes, the `rm_scores` verl trains on, and the advantages in
TransferQueue are GRPO's of the hand-computed rewards.

Runs in a subprocess with a bounded timeout (Ray on shared cores can stall); marked slow.
"""

from __future__ import annotations

import textwrap
from collections import Counter

import numpy as np
import pytest

from _isolated import require_verl_transfer_queue, run_tq_script

require_verl_transfer_queue()

pytestmark = [pytest.mark.slow]

REWARD_FILE = textwrap.dedent('''
    import re

    def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw):
        found = re.findall(r"<answer>(.*?)</answer>", solution_str)
        ok = float(bool(found) and found[-1].strip() == str(ground_truth).strip())
        return {"score": ok, "acc": ok}
''')

# rollouts' answers (None: no answer tag); 100 and 102 are labelled ("1", "3"), 101 and 103 are
# not (their parquet label "x" never matches)
ANSWERS = {100: ["1", "2", "1"], 101: ["7", "3", "3"], 102: [None, "5", "5"], 103: ["4", "9", None]}
LABELS = {100: "1", 101: "x", 102: "3", 103: "x"}
LABELED = {100: True, 101: False, 102: True, 103: False}

# After _isolated's TransferQueue start (Ray and TransferQueue up, `tq` imported).
SCRIPT = textwrap.dedent('''
    import torch
    mode, reward_path = sys.argv[1], sys.argv[2]
    ANSWERS = {int(k): v for k, v in json.loads(sys.argv[3]).items()}
    LABELS = {int(k): v for k, v in json.loads(sys.argv[4]).items()}
    LABELED = {int(k): v for k, v in json.loads(sys.argv[5]).items()}

    from rlpace import Pool, Scheduler, compose
    from rlpace.policies import make_policy
    from rlpace.policies._base import REWARD, DataPolicy, EmptyState
    from tokenizers import decoders
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput
    from verl07._verl_data import make_tokenizer
    from _isolated import bare_v1_trainer, recording_tq_worker
    tok = make_tokenizer()
    tok.backend_tokenizer.decoder = decoders.ByteLevel()

    # a reward place that reads the answers: −0.5 for a rollout without an answer tag
    no_answer = DataPolicy(REWARD, lambda p: EmptyState(), lambda s, p, b: s,
                           lambda s, p, b: b.rewards - 0.5 * np.array([[a is None for a in row] for row in b.answers]),
                           name="test_no_answer_penalty", reads=frozenset({"answers"}))
    ids = sorted(ANSWERS)
    pool = Pool(["math"] * len(ids), ids=ids, labeled=[LABELED[i] for i in ids])
    sched = Scheduler(pool, compose(make_policy("ttrl"), no_answer))
    observed, worker = recording_tq_worker(sched)

    def write_group(uid, index, step):
        tq.kv_put(key=uid, partition_id="train", tag={"is_prompt": True, "status": "running", "global_steps": step})
        for s, a in enumerate(ANSWERS[index]):
            resp = tok.encode("so" if a is None else "so <answer>" + a + "</answer>")
            out = AgentLoopOutput(prompt_ids=[1, 2], response_ids=resp, response_mask=[1] * len(resp),
                                  metrics=AgentLoopMetrics(), extra_fields={})
            r = float(a is not None and a == LABELS[index])           # the streaming score: dataset label
            out.reward_score = r
            out.extra_fields["reward_extra_info"] = {"acc": r, "score": r}
            asyncio.run(worker._agent_loop_postprocess(
                [out], False, uid=uid, session_id=s, global_steps=step, index=index, data_source="math",
                reward_model={"style": "rule", "ground_truth": LABELS[index]}, extra_info={"index": index}))
        tq.kv_put(key=uid, partition_id="train", tag={"is_prompt": True, "status": "finished", "global_steps": step})

    def per_token(batch):             # zero log-probs/entropies over prompt + response, as verl's worker
        z = [torch.zeros(int(tag["seq_len"])) for tag in batch.tags]
        return z, z

    def refill(n):
        raise AssertionError("ttrl keeps every group")
    t = bare_v1_trainer(mode, sched, per_token, global_steps=2, train_batch_size=4, refill=refill, extra_config={
        "reward": {"reward_manager": {"source": "register", "name": "naive"},
                   "custom_reward_function": {"path": reward_path, "name": "compute_score"},
                   "sandbox_fusion": None}})
    t.tokenizer = tok

    for j, index in enumerate(ids):
        write_group("u" + "ABCD"[j], index, 1)
    batch, _ = t.replay_buffer.sample(global_steps=2, partition_id="train", batch_size=4)
    metrics = {}
    batch = t._compute_old_log_prob(batch, metrics)
    batch = t._compute_advantage(batch, metrics)
    keys = sorted(batch.keys)
    got = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["advantages", "rm_scores"])
    print("RESULT " + json.dumps({
        "keys": keys, "advantages": [a.tolist() for a in got["advantages"].unbind()],
        "rm_scores": [a.tolist() for a in got["rm_scores"].unbind()],
        "observed": [[fb.prompt_ids.tolist(), fb.rewards.tolist(), [list(r) for r in fb.answers]] for fb in observed],
        "metrics": {k: v for k, v in sched.metrics().items() if k.startswith("supervision/")},
        "weights_left": len(t.replay_buffer.rlpace_weights), "actor_calls": t.actor_rollout_wg.calls}), flush=True)
    tq.close()
    ray.shutdown()
''')

ACTOR_CALLS = {"sync": [["log_prob", "current"]], "async": [["log_prob", "current"]],
               "separate": [["save", 1], ["restore", 0], ["log_prob", 0], ["restore", 1], ["clear", 1]]}


def hand_rewards(index: int) -> list[float]:
    """TTRL: an unlabelled prompt's target is its most common answer, first seen on ties; a
    labelled one keeps its label; reward 1 when the answer equals the target; then the reward
    place's −0.5 for no answer."""
    group = ANSWERS[index]
    if LABELED[index]:
        target = LABELS[index]
    else:
        votes = [a for a in group if a is not None]
        target = Counter(votes).most_common(1)[0][0]
    return [float(a is not None and a == target) - 0.5 * (a is None) for a in group]


def grpo(r):
    r = np.asarray(r, dtype=np.float64)
    return (r - r.mean()) / (r.std(ddof=1) + 1e-6)          # verl's GRPO: torch.std (unbiased), eps 1e-6


@pytest.mark.parametrize("mode", ["sync", "async", "separate"])
def test_v1_targets_and_answer_rewards_reach_verls_advantages(tmp_path, mode):
    import json
    (tmp_path / "reward_fn.py").write_text(REWARD_FILE)
    out = run_tq_script(SCRIPT, [mode, tmp_path / "reward_fn.py", json.dumps(ANSWERS), json.dumps(LABELS),
                                 json.dumps(LABELED)], tmp_path, "v1_supervision_run.py", 300)
    ids = sorted(ANSWERS)
    want = {f"u{'ABCD'[j]}_{s}_0": r for j, i in enumerate(ids) for s, r in enumerate(hand_rewards(i))}
    # the hand values: 100 [1, 0, 1]; 101 votes "3" → [0, 1, 1]; 102 [−0.5, 0, 0]; 103 ties, first
    # seen "4" → [1, 0, −0.5]
    assert [hand_rewards(i) for i in ids] == [[1, 0, 1], [0, 1, 1], [-0.5, 0, 0], [1, 0, -0.5]]
    assert out["keys"] == sorted(want)
    # what verl trains on: rm_scores (the score on the last response token) ...
    assert {k: sc[-1] for k, sc in zip(out["keys"], out["rm_scores"])} == want
    assert {k: sum(sc) for k, sc in zip(out["keys"], out["rm_scores"])} == want
    # ... and the advantages verl's GRPO computed from them, on every response token
    for j, i in enumerate(ids):
        adv = grpo(hand_rewards(i))
        for s in range(3):
            row = out["advantages"][out["keys"].index(f"u{'ABCD'[j]}_{s}_0")]
            np.testing.assert_allclose(row, np.full(len(row), adv[s]), rtol=1e-5, atol=1e-6)
    # what the Scheduler observed: the same rewards, the decoded answers, once per group
    (pids, rewards, answers), = out["observed"]
    for b, p in enumerate(pids):
        assert answers[b] == ANSWERS[ids[p]]
        assert rewards[b] == hand_rewards(ids[p])
    assert out["metrics"]["supervision/pseudo_labels"] == 2
    assert out["weights_left"] == 0
    assert out["actor_calls"] == ACTOR_CALLS[mode]
