"""Resuming rollout allocation in RlpaceGRPOTrainer on 2 CPU processes (`torchrun
--nproc_per_node 2`, gloo).

`knapsack` (min_n = 1: a prompt gets 0, 1 or several copies of G) runs 8 steps on two ranks,
saving at step 4; a second run resumes from that checkpoint. Checked: on both ranks the resumed
run's Scheduler state and its sampler's queue (the proposed chunks and their allocations not yet
trained) end equal to the uninterrupted run's, and the resumed run generates the same allocations
and gathers the same rewards at steps 4–7. About four minutes on 2 cores.
"""

from __future__ import annotations

import os
import textwrap

import numpy as np
import pytest

pytest.importorskip("trl")

from _tiny_lm import build_tiny_lm  # noqa: E402

pytestmark = [pytest.mark.slow]
STEPS, SAVE = 8, 4

WORKER = textwrap.dedent('''
    import os, sys
    import numpy as np, torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig
    from rlpace import Scheduler
    from rlpace.adapters.trl import RlpaceGRPOTrainer, pool_from_dataset

    lm, out, mode = sys.argv[1], sys.argv[2], os.environ["RLPACE_TEST_MODE"]
    torch.set_num_threads(1)
    # transformers loads the optimizer with map_location=args.device when world_size > 1, which is
    # "cpu:0" on CPU ranks, and torch.load cannot restore to "cpu:0": map it to "cpu" (test-only)
    _load = torch.load
    torch.load = lambda *a, map_location=None, **k: _load(
        *a, map_location="cpu" if str(map_location) == "cpu:0" else map_location, **k)
    G = 2
    rank = int(os.environ["RANK"])
    ds = Dataset.from_list([{"prompt": f"what is {i} plus 3?", "index": 1000 + i,
                             "data_source": ["math", "logic"][i % 2]} for i in range(8)])
    sched = Scheduler(pool_from_dataset(ds), "knapsack", min_n=1, max_n=8, min_count=2, seed=5)
    steps, rewards = [], []

    def reward(prompts, completions, index, trainer_state, **kw):
        n = len(index)
        return [{0: 0.0, 1: 1.0}.get(i % 4, float((i * 7 + (rank * n + j) * 3 + trainer_state.global_step) % 5 < 2))
                for j, i in enumerate(index)]

    class Probe(RlpaceGRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            o = super()._generate_and_score_completions(inputs)
            steps.append(self.state.global_step)
            rewards.append(self._rlpace_rewards.double().cpu().numpy())     # gathered [B·G]
            return o

    run_dir = os.path.join(out, "run")
    cfg = GRPOConfig(output_dir=run_dir if mode == "full" else os.path.join(out, "resumed"), use_cpu=True,
                     bf16=False, report_to="none", seed=0, per_device_train_batch_size=G, num_generations=G,
                     max_completion_length=2, gradient_accumulation_steps=2, max_steps=8, beta=0.0,
                     save_strategy="steps", save_steps=4, logging_steps=100, dataloader_num_workers=0,
                     gradient_checkpointing=False, learning_rate=1e-3)
    t = Probe(model=AutoModelForCausalLM.from_pretrained(lm), reward_funcs=reward, args=cfg,
              train_dataset=ds, processing_class=AutoTokenizer.from_pretrained(lm), scheduler=sched)
    t.train(resume_from_checkpoint=os.path.join(run_dir, "checkpoint-4") if mode == "resume" else None)
    np.savez(os.path.join(out, f"{mode}-rank{rank}.npz"), steps=np.array(steps), rewards=np.stack(rewards),
             **sched.state_dict(), **t.rlpace_sampler.state_dict())
''')


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from _isolated import run_two_ranks
    tmp = tmp_path_factory.mktemp("ddp_allocation_resume")
    lm = build_tiny_lm(tmp / "lm", [f"what is {i} plus 3?" for i in range(8)])
    for mode, port in (("full", 29571), ("resume", 29572)):
        os.environ["RLPACE_TEST_MODE"] = mode
        try:
            run_two_ranks(WORKER, lm, tmp, port=port, timeout=500)
        finally:
            del os.environ["RLPACE_TEST_MODE"]
    return {mode: [np.load(tmp / f"{mode}-rank{r}.npz") for r in (0, 1)] for mode in ("full", "resume")}


def test_resumed_allocation_run_ends_where_the_uninterrupted_one_does(runs):
    full, resumed = runs["full"], runs["resume"]
    assert full[0]["steps"].tolist() == list(range(STEPS))
    keys = [k for k in full[0].files if k not in ("steps", "rewards")]
    assert any(k.startswith("sampler/") for k in keys) and "history/attempts" in keys
    assert int(full[0]["history/attempts"].sum()) == STEPS * 4 * 2            # B = 4 group slots of G = 2
    for rank in (0, 1):
        assert resumed[rank]["steps"].tolist() == list(range(SAVE, STEPS))
        # the same allocations generated and scored after the resume (rewards depend on the rows' prompts)
        np.testing.assert_array_equal(resumed[rank]["rewards"], full[rank]["rewards"][SAVE:])
        for k in keys:
            np.testing.assert_array_equal(resumed[rank][k], full[0][k], err_msg=f"rank {rank}: {k}")
            np.testing.assert_array_equal(full[rank][k], full[0][k], err_msg=f"rank {rank}: {k}")
