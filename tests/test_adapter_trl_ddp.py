"""RlpaceGRPOTrainer on 2 CPU processes (`torchrun --nproc_per_node 2`, gloo).

Each rank holds its own Scheduler replica; accelerate shards the sampler's chunks across
ranks and TRL gathers rewards process-major. With gradient_accumulation_steps = 2 (TRL's
default steps_per_generation = 2, so the sampler's look-ahead is 2 // 2 = 1 chunk; the
lag formula that counted only accumulation crashed here) both ranks must propose the same chunks, train
the rows of those chunks (rank r the r-th half of each generation batch), and end with
bit-identical Scheduler states. About a minute on 2 cores.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

pytest.importorskip("trl")

from _tiny_lm import build_tiny_lm  # noqa: E402

pytestmark = [pytest.mark.slow]

WORKER = textwrap.dedent('''
    import os, sys
    import numpy as np, torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig
    from rlpace import Scheduler
    from rlpace.adapters.trl import RlpaceGRPOTrainer, pool_from_dataset

    lm, out = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    G = 2
    ds = Dataset.from_list([{"prompt": f"what is {i} plus 3?", "index": 1000 + i,
                             "data_source": ["math", "logic"][i % 2]} for i in range(8)])
    sched = Scheduler(pool_from_dataset(ds), "dump", seed=5)
    proposals, trained = [], []
    propose = sched.propose
    sched.propose = lambda n: proposals.append(propose(n)) or proposals[-1]

    def reward(prompts, completions, index, trainer_state, **kw):
        trained.append(list(index))
        return [float((i * 7 + j % G * 3 + trainer_state.global_step) % 5 < 2) for j, i in enumerate(index)]

    cfg = GRPOConfig(output_dir=out, use_cpu=True, bf16=False, report_to="none", seed=0,
                     per_device_train_batch_size=G, num_generations=G, max_completion_length=2,
                     gradient_accumulation_steps=2, max_steps=5, beta=0.0, save_strategy="no",
                     logging_steps=100, dataloader_num_workers=0, gradient_checkpointing=False,
                     learning_rate=1e-3)
    RlpaceGRPOTrainer(model=AutoModelForCausalLM.from_pretrained(lm), reward_funcs=reward, args=cfg,
                      train_dataset=ds, processing_class=AutoTokenizer.from_pretrained(lm),
                      scheduler=sched).train()
    rank = int(os.environ["RANK"])
    np.savez(os.path.join(out, f"rank{rank}.npz"), proposals=np.stack(proposals),
             trained=np.array(trained), world=int(os.environ["WORLD_SIZE"]), **sched.state_dict())
''')


def test_two_ranks_propose_the_same_chunks_and_end_in_the_same_state(tmp_path):
    from _isolated import run_two_ranks
    lm = build_tiny_lm(tmp_path / "lm", [f"what is {i} plus 3?" for i in range(8)])
    run_two_ranks(WORKER, lm, tmp_path, port=29531)
    r0, r1 = (np.load(tmp_path / f"rank{r}.npz") for r in (0, 1))
    assert int(r0["world"]) == 2
    np.testing.assert_array_equal(r0["proposals"], r1["proposals"])
    # generation batch = 2 rows × 2 ranks × steps_per_generation 2 = 8 rows = B 4 prompts × G 2
    assert r0["proposals"].shape[1] == 4
    # 5 optimizer steps × 2 micro-batches / R = 2 → 5 generations, each of one proposed chunk;
    # rank r scores (and trains) the r-th half of each chunk's rows, process-major
    assert len(r0["trained"]) == len(r1["trained"]) == 5
    ids = np.arange(1000, 1008)
    for j in range(5):
        rows = np.repeat(ids[r0["proposals"][j]], 2)
        assert r0["trained"][j].tolist() == rows[:4].tolist() and r1["trained"][j].tolist() == rows[4:].tolist()
    state_keys = [k for k in r0.files if k not in ("proposals", "trained", "world")]
    assert "history/attempts" in state_keys and int(r0["history/attempts"].sum()) == 5 * 4 * 2
    for k in state_keys:
        np.testing.assert_array_equal(r0[k], r1[k], err_msg=k)
