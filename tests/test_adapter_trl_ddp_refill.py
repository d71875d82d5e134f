"""RlpaceGRPOTrainer with DAPO refills on 2 CPU processes (`torchrun --nproc_per_node 2`, gloo).

Each rank generates its half of every round (B = 4 prompts of G = 2, 2 groups per rank) and
fills its slice of the trained batch with its own first kept groups; another round runs while
either rank's slice is short (decided from the gathered keep masks, so both ranks agree). The
reward's rule (prompt id, step, round) makes every round's outcome known in advance. Checked:
the trained batch of each rank is the reference's; both Scheduler copies end identical; a
resume where rank 1's copy of the checkpoint lacks `rlpace_scheduler.npz` (no shared
filesystem) replays the uninterrupted run; Scheduler copies that differ (another seed on one
rank) stop training with an error naming the rank. About three minutes on 2 cores.
"""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest

pytest.importorskip("trl")

from _tiny_lm import build_tiny_lm  # noqa: E402

pytestmark = [pytest.mark.slow]
G, B_LOCAL, MAX_REFILL = 2, 2, 2

WORKER = textwrap.dedent('''
    import json, os, shutil, sys
    import numpy as np, torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig
    from rlpace import Scheduler, compose
    from rlpace.adapters.trl import STATE_FILE, RlpaceGRPOTrainer, pool_from_dataset
    from rlpace.policies import make_policy
    from _trl_common import probe_trainer, refill_reward   # the tests folder is on PYTHONPATH (run_two_ranks)

    lm, out, mode = sys.argv[1], sys.argv[2], os.environ["RLPACE_TEST_MODE"]
    rank = int(os.environ["RANK"])
    torch.set_num_threads(1)
    # transformers loads the optimizer with map_location=args.device when world_size > 1, which is
    # "cpu:0" on CPU ranks, and torch.load cannot restore to "cpu:0": map it to "cpu" (test-only)
    _load = torch.load
    torch.load = lambda *a, map_location=None, **k: _load(
        *a, map_location="cpu" if str(map_location) == "cpu:0" else map_location, **k)
    G = 2
    prompts = [f"what is {i} plus 3?" for i in range(8)]
    ds = Dataset.from_list([{"prompt": p, "index": 1000 + i, "data_source": ["math", "logic"][i % 2]}
                            for i, p in enumerate(prompts)])
    seed = 4 if mode == "diverge" and rank == 1 else 3
    sched = Scheduler(pool_from_dataset(ds), compose(make_policy("uniform"), make_policy("dapo_dynamic_sampling")),
                      seed=seed)
    calls, trained = [], []
    reward = refill_reward(calls, G)

    tok = AutoTokenizer.from_pretrained(lm)

    Probe = probe_trainer(RlpaceGRPOTrainer, tok, prompts, G, lambda trainer, o, ids: trained.append(
        [ids, [int(x) for x in o["completion_mask"].sum(-1).tolist()]]))

    run_dir = os.path.join(out, "run")
    cfg = GRPOConfig(output_dir=run_dir if mode != "resume" else os.path.join(out, "resumed"), use_cpu=True,
                     bf16=False, report_to="none", seed=0, per_device_train_batch_size=G, num_generations=G,
                     max_completion_length=2, gradient_accumulation_steps=2, steps_per_generation=2,
                     max_steps=1 if mode == "diverge" else 6, beta=0.0, save_strategy="steps", save_steps=3,
                     logging_steps=100, dataloader_num_workers=0, gradient_checkpointing=False, learning_rate=1e-3)
    trainer = Probe(model=AutoModelForCausalLM.from_pretrained(lm), reward_funcs=reward, args=cfg,
                    train_dataset=ds, processing_class=tok, scheduler=sched, max_refill_rounds=2)
    resume = None
    if mode == "resume":
        resume = os.path.join(run_dir, "checkpoint-3")
        if rank == 1:      # this rank sees a copy of the checkpoint without the Scheduler's state file
            resume = shutil.copytree(resume, os.path.join(out, "rank1-copy"),
                                     ignore=shutil.ignore_patterns(STATE_FILE))
    error = None
    try:
        trainer.train(resume_from_checkpoint=resume)
    except RuntimeError as e:
        import traceback
        error = str(e)
        traceback.print_exc()
    with open(os.path.join(out, f"{mode}-rank{rank}.json"), "w") as f:
        json.dump({"calls": calls, "trained": trained, "error": error,
                   "state": {k: np.asarray(v).tolist() for k, v in sched.state_dict().items()}}, f)
''')


def reference(calls0, calls1):
    """Per generation (one step): (rounds, per rank: its trained prompt ids and kept flags)."""
    out = []
    for step in sorted({c[0] for c in calls0}):
        per_rank = []
        for calls in (calls0, calls1):
            groups = [(c[1], c[2][k * G], max(c[3][k * G:(k + 1) * G]) > 0)
                      for c in calls if c[0] == step for k in range(B_LOCAL)]
            per_rank.append(groups)
        n_rounds = next((r + 1 for r in range(MAX_REFILL + 1)
                         if all(sum(g[2] for g in gs if g[0] <= r) >= B_LOCAL for gs in per_rank)), MAX_REFILL + 1)
        batch = []
        for gs in per_rank:
            gs = [g for g in gs if g[0] < n_rounds]
            chosen = ([g for g in gs if g[2]] + [g for g in gs if not g[2]])[:B_LOCAL]
            batch.append(([g[1] for g in chosen], [g[2] for g in chosen]))
        out.append((n_rounds, batch))
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    import os
    from _isolated import run_two_ranks
    tmp = tmp_path_factory.mktemp("ddp_refill")
    lm = build_tiny_lm(tmp / "lm", [f"what is {i} plus 3?" for i in range(8)])
    got = {}
    for mode, port in (("full", 29541), ("resume", 29542), ("diverge", 29543)):
        os.environ["RLPACE_TEST_MODE"] = mode
        try:
            run_two_ranks(WORKER, lm, tmp, port=port)
        finally:
            del os.environ["RLPACE_TEST_MODE"]
        got[mode] = [json.loads((tmp / f"{mode}-rank{r}.json").read_text()) for r in (0, 1)]
    return got


def test_each_rank_trains_its_first_kept_groups_and_the_copies_agree(runs):
    r0, r1 = runs["full"]
    assert r0["error"] is None and r1["error"] is None
    ref = reference(r0["calls"], r1["calls"])
    assert len(ref) == len(r0["trained"]) == len(r1["trained"]) == 6
    rounds = []
    for step, (n_rounds, batch) in enumerate(ref):
        rounds.append(n_rounds)
        assert sum(c[0] == step for c in r0["calls"]) == sum(c[0] == step for c in r1["calls"]) == n_rounds
        for rank, got in enumerate((r0, r1)):
            ids, rows = got["trained"][step]
            assert ids == batch[rank][0] and len(rows) == B_LOCAL * G        # each rank's slice keeps its size
            assert [x > 0 for x in rows[::G]] == batch[rank][1]
    assert max(rounds) > 1                                                   # refills happened
    for k in r0["state"]:
        assert r0["state"][k] == r1["state"][k], k
    total = sum(len(c[2]) for c in r0["calls"] + r1["calls"])
    assert int(np.sum(r0["state"]["history/attempts"])) == total            # every rollout observed


def test_resume_without_a_shared_state_file_replays_the_run(runs):
    full, resumed = runs["full"], runs["resume"]
    for rank in (0, 1):
        assert resumed[rank]["error"] is None
        assert resumed[rank]["calls"] == [c for c in full[rank]["calls"] if c[0] >= 3]
        assert resumed[rank]["trained"] == full[rank]["trained"][3:]
        for k in full[0]["state"]:
            assert resumed[rank]["state"][k] == full[0]["state"][k], k


def test_scheduler_copies_that_differ_stop_training(runs):
    for rank in (0, 1):
        err = runs["diverge"][rank]["error"]
        assert err is not None and "Scheduler copies disagree at step 0: rank(s) [1] differ from rank 0" in err
