"""rlpace.adapters.trl: real GRPOTrainer runs on CPU with a tiny local model.

The reward function depends only on (prompt id, rollout position in its group, step), so
feedback — and hence an adaptive policy's proposals — is reproducible across a resume.
It records what it saw; the Scheduler's observations are recorded next to it.
Runtime: about 30–60 s at 1 thread (three short runs of a 2-layer, width-32 Qwen2).
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("trl")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from trl import GRPOConfig  # noqa: E402

from _tiny_lm import build_tiny_lm  # noqa: E402
from rlpace import Scheduler, compose  # noqa: E402
from rlpace.adapters.trl import STATE_FILE, RlpaceGRPOTrainer, pool_from_dataset  # noqa: E402
from rlpace.policies import make_policy  # noqa: E402
from rlpace.policies._base import REWEIGHTING, DataPolicy, EmptyState  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore"), pytest.mark.slow]
G, B = 2, 2


def outcome(index: int, g: int, step: int) -> float:
    return float((index * 7 + g * 3 + step) % 5 < 2)


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    torch.set_num_threads(1)
    return build_tiny_lm(tmp_path_factory.mktemp("lm"), [f"what is {i} plus 3?" for i in range(8)])


@pytest.fixture(scope="module")
def dataset():
    # 8 prompts → 4 chunks per epoch: 6 steps cross an epoch boundary
    return Dataset.from_list([{"prompt": f"what is {i} plus 3?", "index": 1000 + i,
                               "data_source": ["math", "logic"][i % 2]} for i in range(8)])


def pass_rate_weights():
    def apply(state, pool, batch):
        return np.repeat(1.0 + batch.pass_rate[:, None], batch.rewards.shape[1], axis=1)
    return DataPolicy(REWEIGHTING, lambda pool: EmptyState(), lambda s, p, b: s, apply, name="w")


def run(lm, dataset, out, *, steps=6, resume=None, zero_lag=False, loss_weights=False):
    seen, proposals, observed, advantages = [], [], [], []
    sched = Scheduler(pool_from_dataset(dataset), compose(make_policy("dump"), pass_rate_weights()), seed=5)
    propose, observe = sched.propose, sched.observe
    sched.propose = lambda n: proposals.append((int(sched.counters.observations), propose(n))) or proposals[-1][1]
    sched.observe = lambda fb: observed.append(fb) or observe(fb)

    def reward(prompts, completions, index, trainer_state, **kw):
        r = [outcome(i, j % G, trainer_state.global_step) for j, i in enumerate(index)]
        seen.append((trainer_state.global_step, list(index), r))
        return r

    class Probe(RlpaceGRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            advantages.append(output["advantages"].clone())
            return output

    cfg = GRPOConfig(output_dir=str(out), use_cpu=True, bf16=False, report_to="none", seed=0,
                     per_device_train_batch_size=B * G, num_generations=G, max_completion_length=4,
                     max_steps=steps, logging_steps=1, save_strategy="steps", save_steps=3, beta=0.0,
                     dataloader_num_workers=0, gradient_checkpointing=False, learning_rate=1e-3)
    trainer = Probe(model=AutoModelForCausalLM.from_pretrained(lm), reward_funcs=reward, args=cfg,
                    train_dataset=dataset, processing_class=AutoTokenizer.from_pretrained(lm),
                    scheduler=sched, zero_lag=zero_lag, loss_weights=loss_weights)
    trainer.train(resume_from_checkpoint=resume)
    return dict(seen=seen, proposals=proposals, observed=observed, adv=advantages, sched=sched, trainer=trainer)


@pytest.fixture(scope="module")
def lagged(lm, dataset, tmp_path_factory):
    return run(lm, dataset, tmp_path_factory.mktemp("a"), loss_weights=True)


def test_scheduler_gets_what_the_reward_function_saw(lagged):
    seen, observed, pool = lagged["seen"], lagged["observed"], lagged["sched"].pool
    assert len(seen) == len(observed) == 6
    for (step, index, r), fb in zip(seen, observed):
        assert fb.step == step
        assert index == [i for i in pool.ids[fb.prompt_ids] for _ in range(G)]   # G in a row
        np.testing.assert_array_equal(fb.rewards, np.reshape(r, (-1, G)))
        rr = torch.tensor(r).view(-1, G)                                       # TRL's GRPO formula
        want = (rr - rr.mean(1, keepdim=True)) / (rr.std(1, keepdim=True) + 1e-4)
        np.testing.assert_allclose(fb.advantages, want.numpy(), rtol=1e-6, atol=1e-6)


def test_trained_chunks_are_the_proposals_and_the_lag_is_one(lagged):
    seen, proposals, pool = lagged["seen"], lagged["proposals"], lagged["sched"].pool
    # R = 1: accelerate reads one batch ahead, so chunk j is proposed after the feedback of
    # chunks 0..j-2 (j-1 observations), at epoch boundaries too (steps 4 = new epoch)
    assert [obs for obs, _ in proposals[:7]] == [0, 0, 1, 2, 3, 4, 5]
    for (_, index, _), (_, ids) in zip(seen, proposals):
        assert index[::G] == pool.ids[ids].tolist()


def test_loss_weights_scale_advantages(lagged):
    for (_, index, r), adv in zip(lagged["seen"], lagged["adv"]):
        rr = torch.tensor(r).view(-1, G)
        base = (rr - rr.mean(1, keepdim=True)) / (rr.std(1, keepdim=True) + 1e-4)
        w = 1.0 + rr.mean(1, keepdim=True)                                     # 1 + pass rate
        torch.testing.assert_close(adv, (base * w).view(-1))


def test_resume_proposes_the_uninterrupted_batches(lagged, lm, dataset, tmp_path):
    ckpt = lagged["trainer"].args.output_dir + "/checkpoint-3"
    import os
    assert os.path.exists(os.path.join(ckpt, STATE_FILE))
    resumed = run(lm, dataset, tmp_path, resume=ckpt)
    assert [s[1] for s in resumed["seen"]] == [s[1] for s in lagged["seen"][3:]]
    a, b = lagged["sched"].state_dict(), resumed["sched"].state_dict()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_zero_lag_proposes_after_the_previous_feedback(lm, dataset, tmp_path):
    z = run(lm, dataset, tmp_path, steps=4, zero_lag=True)
    assert [obs for obs, _ in z["proposals"]] == [0, 1, 2, 3]
    for (_, index, _), (_, ids) in zip(z["seen"], z["proposals"]):
        assert index[::G] == z["sched"].pool.ids[ids].tolist()


def test_bad_input_is_rejected_before_training(lm, dataset, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(lm)
    base = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none",
                per_device_train_batch_size=4, num_generations=2, max_completion_length=4)
    sched = Scheduler(pool_from_dataset(dataset), "uniform")
    kw = dict(model=model, reward_funcs=lambda completions, **k: [0.0] * len(completions))
    with pytest.raises(ValueError, match="dataloader_num_workers"):
        RlpaceGRPOTrainer(**kw, args=GRPOConfig(**base, dataloader_num_workers=2), train_dataset=dataset,
                          scheduler=sched)
    with pytest.raises(ValueError, match="no 'idx' column"):
        RlpaceGRPOTrainer(**kw, args=GRPOConfig(**base), train_dataset=dataset, scheduler=sched, id_column="idx")
    other = Scheduler(pool_from_dataset(dataset.select(range(6))), "uniform")
    with pytest.raises(ValueError, match="is not the train dataset"):
        RlpaceGRPOTrainer(**kw, args=GRPOConfig(**base), train_dataset=dataset, scheduler=other)


def test_checkpoint_of_another_pool_is_rejected(lagged, lm, dataset, tmp_path):
    ckpt = lagged["trainer"].args.output_dir + "/checkpoint-3"
    shifted = dataset.map(lambda r: {"index": r["index"] + 1})
    with pytest.raises(ValueError, match="different pool"):
        run(lm, shifted, tmp_path, resume=ckpt)
