"""RlpaceGRPOTrainer under every batching setting of transformers' loop.

transformers collects the `gradient_accumulation_steps` (A) batches of an optimizer step
before training on them and accelerate reads one more; TRL generates a chunk every
R = steps_per_generation × num_iterations batches. The sampler must therefore propose
A // R chunks ahead of the feedback. Each case runs the real `GRPOTrainer` on the tiny
Qwen2 of `_tiny_lm` (8 prompts, G = 2, one prompt per micro-batch) for enough optimizer
steps to generate `lag + 3` chunks, and checks: training finishes; the trained chunks are
the proposals, in order; chunk j was proposed after exactly max(0, j − lag) feedbacks
(lag from the hand-derived table below, zero-lag mode: j); the feedback carries
`group_advantages` of the rewards.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("trl")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from trl import GRPOConfig  # noqa: E402

from _trl_common import dataset, lm, outcome  # noqa: E402,F401 (fixtures)
from rlpace import Scheduler  # noqa: E402
from rlpace.adapters.trl import RlpaceGRPOTrainer, pool_from_dataset  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore"), pytest.mark.slow]
G = 2

# Hand-derived look-ahead (chunks proposed before the previous ones are scored), by
# (gradient_accumulation_steps A, R = steps_per_generation × num_iterations). Chunk j is
# drawn at the start of optimizer step u = max(0, ceil(jR/A) - 1), when the chunks whose
# first batch precedes u·A are scored; e.g. A=4, R=1: chunks 0..4 are all drawn before
# the first step trains, so chunk 4 is drawn with 0 scored: lag 4.
LAG = {(1, 1): 1, (1, 2): 0, (1, 4): 0, (1, 8): 0,
       (2, 1): 2, (2, 2): 1, (2, 4): 0, (2, 8): 0,
       (4, 1): 4, (4, 2): 2, (4, 4): 1, (4, 8): 0}


def run(lm, dataset, out, *, ga, spg, ni, zero_lag, steps):
    seen, proposals, observed = [], [], []
    sched = Scheduler(pool_from_dataset(dataset), "dump", seed=5)
    propose, observe = sched.propose, sched.observe
    sched.propose = lambda n: proposals.append((int(sched.counters.observations), propose(n))) or proposals[-1][1]
    sched.observe = lambda fb: observed.append(fb) or observe(fb)
    _step = sched.step       # Scheduler.step observes too (adapters call it)
    sched.step = lambda fb, features=None: observed.append(fb) or _step(fb, features)

    def reward(prompts, completions, index, trainer_state, **kw):
        r = [outcome(i, j % G, len(seen)) for j, i in enumerate(index)]
        seen.append((list(index), r))
        return r

    extra = {} if spg is None else {"steps_per_generation": spg}
    cfg = GRPOConfig(output_dir=str(out), use_cpu=True, bf16=False, report_to="none", seed=0,
                     per_device_train_batch_size=G, num_generations=G, max_completion_length=2,
                     gradient_accumulation_steps=ga, num_iterations=ni, max_steps=steps, beta=0.0,
                     logging_steps=1000, save_strategy="no", dataloader_num_workers=0,
                     gradient_checkpointing=False, learning_rate=1e-3, **extra)
    trainer = RlpaceGRPOTrainer(model=AutoModelForCausalLM.from_pretrained(lm), reward_funcs=reward, args=cfg,
                                train_dataset=dataset, processing_class=AutoTokenizer.from_pretrained(lm),
                                scheduler=sched, zero_lag=zero_lag)
    trainer.train()
    return seen, proposals, observed, sched


@pytest.mark.parametrize("zero_lag", [False, True], ids=["lagged", "zero_lag"])
@pytest.mark.parametrize("ni", [1, 2])
@pytest.mark.parametrize("spg", [None, 1, 2, 4], ids=["spg_default", "spg1", "spg2", "spg4"])
@pytest.mark.parametrize("ga", [1, 2, 4])
def test_every_accumulation_setting_trains_the_proposals(lm, dataset, tmp_path, ga, spg, ni, zero_lag):
    r = (ga if spg is None else spg) * ni
    lag = 0 if zero_lag else LAG[(ga, r)]
    chunks = lag + 3
    steps = math.ceil(chunks * r / ga)                       # optimizer steps that generate `chunks`
    seen, proposals, observed, sched = run(lm, dataset, tmp_path, ga=ga, spg=spg, ni=ni,
                                           zero_lag=zero_lag, steps=steps)
    assert len(seen) == len(observed) >= chunks
    assert [obs for obs, _ in proposals[:len(seen)]] == [max(0, j - lag) for j in range(len(seen))]
    for (index, rew), (_, ids), fb in zip(seen, proposals, observed):
        assert index[::G] == sched.pool.ids[ids].tolist() and index == np.repeat(index[::G], G).tolist()
        rr = np.reshape(rew, (-1, G))
        want = [[(x - row.mean()) / (row.std() + 1e-6) if row.std() > 0 else 0.0 for x in row] for row in rr]
        np.testing.assert_allclose(fb.advantages, want, rtol=1e-12)
        np.testing.assert_array_equal(fb.rewards, rr)


def test_resume_under_gradient_accumulation_proposes_the_uninterrupted_chunks(lm, dataset, tmp_path):
    """A = 2, R = 2 (TRL's default steps_per_generation = A): look-ahead 1. A checkpoint at
    optimizer step 3 (a generation boundary: 6 batches, chunks 0–2 trained) holds the
    Scheduler and the chunks proposed but not trained; resuming replays chunks 3–5.
    Resuming it with another look-ahead is refused with the settings to keep."""
    def go(out, steps, resume=None, spg=None):
        seen, proposals = [], []
        sched = Scheduler(pool_from_dataset(dataset), "dump", seed=5)
        propose = sched.propose
        sched.propose = lambda n: proposals.append(propose(n)) or proposals[-1]

        def reward(prompts, completions, index, trainer_state, **kw):
            seen.append(list(index))
            return [outcome(i, j % G, trainer_state.global_step) for j, i in enumerate(index)]

        cfg = GRPOConfig(output_dir=str(out), use_cpu=True, bf16=False, report_to="none", seed=0,
                         per_device_train_batch_size=G, num_generations=G, max_completion_length=2,
                         gradient_accumulation_steps=2, max_steps=steps, beta=0.0, logging_steps=1000,
                         save_strategy="steps", save_steps=3, dataloader_num_workers=0,
                         gradient_checkpointing=False, learning_rate=1e-3,
                         **({} if spg is None else {"steps_per_generation": spg}))
        RlpaceGRPOTrainer(model=AutoModelForCausalLM.from_pretrained(lm), reward_funcs=reward, args=cfg,
                          train_dataset=dataset, processing_class=AutoTokenizer.from_pretrained(lm),
                          scheduler=sched).train(resume_from_checkpoint=resume)
        return seen, sched

    full, a = go(tmp_path / "a", 6)
    assert len(full) == 6
    rest, b = go(tmp_path / "b", 6, resume=str(tmp_path / "a" / "checkpoint-3"))
    assert rest == full[3:]
    for k, v in a.state_dict().items():
        np.testing.assert_array_equal(b.state_dict()[k], v, err_msg=k)
    # another look-ahead (steps_per_generation 1: 2 // 1 = 2) cannot continue this queue
    with pytest.raises(ValueError, match="resume with the gradient_accumulation_steps"):
        go(tmp_path / "c", 6, resume=str(tmp_path / "a" / "checkpoint-3"), spg=1)
