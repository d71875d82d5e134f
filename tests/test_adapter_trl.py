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
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from trl import GRPOConfig  # noqa: E402

from _trl_common import dataset, lm, outcome  # noqa: E402,F401 (fixtures)
from rlpace import Scheduler, compose  # noqa: E402
from rlpace.adapters.trl import STATE_FILE, RlpaceGRPOTrainer, pool_from_dataset  # noqa: E402
from rlpace.policies import make_policy  # noqa: E402
from rlpace.policies._base import REWEIGHTING, DataPolicy, EmptyState  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore"), pytest.mark.slow]
G, B = 2, 2


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
    _step = sched.step       # Scheduler.step observes too (adapters call it)
    sched.step = lambda fb, features=None: observed.append(fb) or _step(fb, features)

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
        # rlpace's one definition (population std, eps 1e-6), not TRL's (unbiased std, 1e-4):
        # for rewards (1, 0) that is ±0.999998, where TRL trains on ±0.99986
        want = [[(x - np.mean(row)) / (np.std(row) + 1e-6) if np.std(row) > 0 else 0.0 for x in row]
                for row in np.reshape(r, (-1, G))]
        np.testing.assert_allclose(fb.advantages, want, rtol=1e-12)


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


def _admission(keep_fn):
    from rlpace.policies._base import ADMISSION, Admission
    return DataPolicy(ADMISSION, lambda pool: EmptyState(), lambda s, p, b: s,
                      lambda s, p, b: Admission(keep_fn(b), 0), name="test_admission")


def test_admission_drops_rollouts_and_thinned_groups_train_on_kept_advantages(lm, dataset, tmp_path):
    """G = 4. Groups whose rewards are all equal are dropped; groups of even pool position are
    kept whole (TRL's advantages stay); the others keep rollouts 0–2 (PODS): those train on
    GRPO advantages of the three kept rewards, rollout 3 on nothing (mask row 0)."""
    g4 = 4

    def keep_fn(b):
        keep = np.ones(b.rewards.shape, bool)
        keep[b.prompt_ids % 2 == 1, 3] = False
        keep[b.rewards.std(axis=1) == 0] = False
        return keep

    seen, outs = [], []

    def reward(prompts, completions, index, trainer_state, **kw):
        r = [0.0 if i % 3 == 0 else outcome(i, j % g4, trainer_state.global_step) for j, i in enumerate(index)]
        seen.append((list(index), r))
        return r

    class Probe(RlpaceGRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            outs.append({k: out[k].clone() for k in ("advantages", "completion_mask", "num_items_in_batch")})
            return out

    sched = Scheduler(pool_from_dataset(dataset), compose(make_policy("uniform"), _admission(keep_fn)), seed=2)
    cfg = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", seed=0,
                     per_device_train_batch_size=2 * g4, num_generations=g4, max_completion_length=3,
                     max_steps=4, beta=0.0, save_strategy="no", dataloader_num_workers=0, logging_steps=100,
                     gradient_checkpointing=False, learning_rate=1e-3)
    Probe(model=AutoModelForCausalLM.from_pretrained(lm), reward_funcs=reward, args=cfg, train_dataset=dataset,
          processing_class=AutoTokenizer.from_pretrained(lm), scheduler=sched).train()
    kinds = set()
    for (index, r), out in zip(seen, outs):
        want, kept = [], []
        for b in range(len(index) // g4):
            rr = np.array(r[b * g4:(b + 1) * g4])
            pos = int(sched.pool.index_of([index[b * g4]])[0])
            if rr.std() == 0:
                kinds.add("dropped")
                want += [0.0] * g4
                kept += [False] * g4
            elif pos % 2 == 0:                                   # TRL's own formula, untouched
                kinds.add("whole")
                want += ((rr - rr.mean()) / (rr.std(ddof=1) + 1e-4)).tolist()
                kept += [True] * g4
            else:
                kinds.add("thinned")
                k = rr[:3]
                want += [(x - k.mean()) / (k.std() + 1e-6) if k.std() > 0 else 0.0 for x in k] + [0.0]
                kept += [True, True, True, False]
        np.testing.assert_allclose(out["advantages"].double().numpy(), want, rtol=1e-5, atol=1e-6)
        rows = out["completion_mask"].sum(-1)
        assert (rows[~torch.tensor(kept)] == 0).all() and (rows[torch.tensor(kept)] > 0).all()
        assert int(out["num_items_in_batch"]) == int(out["completion_mask"].sum())
    assert kinds == {"dropped", "whole", "thinned"}
