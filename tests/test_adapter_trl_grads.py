"""rlpace.adapters.trl gradient features: real GRPOTrainer runs on CPU, tiny model.

* The features the Scheduler observes (`Feedback.grads`) equal, row by row, the Kronecker
  sketch P_out·∇W·P_inᵀ of an independent loop of single-rollout `backward()` calls on the
  hand-written GRPO term −A_i/(m·T_i)·Σ_t log π(y_t) (m rows per TRL micro-batch, T_i the
  rollout's completion tokens; importance ratio 1, beta = 0 — TRL's "grpo" loss).
* DIEM's weights reach TRL's loss: one SGD step moves lm_head by −lr·Σ_i w_i·∇W ℓ_i, with w
  the non-uniform weights the Scheduler returned for that batch (and not by −lr·Σ_i ∇W ℓ_i).
* Chunks of 4 rows over the last block; the KL term left out (beta > 0); the reference
  gradient through a checkpoint; two torchrun ranks gathering features in row order.
Runtime: about 35 s at 1 thread (short runs of a 2-layer, width-32 Qwen2; one torchrun).
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
from rlpace.adapters.trl import RlpaceGRPOTrainer, pool_from_dataset  # noqa: E402
from rlpace.policies import make_policy  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore"), pytest.mark.slow]
G, B, LR = 4, 2, 0.5


def run(lm, dataset, out, *, steps, per_device, spg, grad_params="lm_head", method=None, loss_weights=True,
        grad_features="auto", save_steps=0, resume=None, beta=0.0):
    """Train; record what each feature pass saw (inputs, weights before it) and what was observed."""
    passes, observed = [], []
    method = method or compose(make_policy("uniform"), make_policy("diem", importance="loo", unit="rollout"))
    sched = Scheduler(pool_from_dataset(dataset), method, seed=3)
    observe = sched.observe
    sched.observe = lambda fb: observed.append(fb) or observe(fb)
    _step = sched.step       # Scheduler.step observes too (the adapter calls it): record the
    # feedback as observed, with the features it attached
    sched.step = lambda fb, features=None: (lambda r: observed.append(r.feedback) or r)(_step(fb, features))

    def reward(prompts, completions, index, trainer_state, **kw):
        return [outcome(i, j % G, trainer_state.global_step) for j, i in enumerate(index)]

    class Probe(RlpaceGRPOTrainer):
        def _rlpace_grad_features(self, output):
            rec = {k: output[k].detach().clone() for k in ("prompt_ids", "prompt_mask", "completion_ids",
                                                            "completion_mask", "advantages")}
            rec["state"] = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
            before = {k: list(v) for k, v in self._metrics["train"].items()}
            feats = super()._rlpace_grad_features(output)
            rec["metrics_kept"] = dict(self._metrics["train"]) == before     # the pass logs nothing
            passes.append(rec)
            return feats

    cfg = GRPOConfig(output_dir=str(out), use_cpu=True, bf16=False, report_to="none", seed=0,
                     per_device_train_batch_size=per_device, steps_per_generation=spg, num_generations=G,
                     max_completion_length=5, max_steps=steps, logging_steps=100, beta=beta,
                     save_strategy="steps" if save_steps else "no", save_steps=save_steps or 500,
                     dataloader_num_workers=0, gradient_checkpointing=False, learning_rate=LR, optim="sgd",
                     lr_scheduler_type="constant", max_grad_norm=0.0, loss_type="grpo")
    trainer = Probe(model=AutoModelForCausalLM.from_pretrained(lm), reward_funcs=reward, args=cfg,
                    train_dataset=dataset, processing_class=AutoTokenizer.from_pretrained(lm), scheduler=sched,
                    loss_weights=loss_weights, grad_params=grad_params, grad_dim=64, grad_features=grad_features)
    trainer.train(resume_from_checkpoint=resume)
    return dict(passes=passes, observed=observed, sched=sched, trainer=trainer)


def per_rollout_grads(lm, rec, names, per_device):
    """[N] lists of weight gradients of the hooked layers: one `backward()` per rollout of
    −A_i/(m·T_i)·Σ_t log π(y_t) at the recorded weights (m = rows per micro-batch)."""
    model = AutoModelForCausalLM.from_pretrained(lm)
    model.load_state_dict(rec["state"])
    mods = dict(model.named_modules())
    p_len, c_ids, c_mask = rec["prompt_ids"].shape[1], rec["completion_ids"], rec["completion_mask"].float()
    ids = torch.cat([rec["prompt_ids"], c_ids], 1)
    att = torch.cat([rec["prompt_mask"], rec["completion_mask"]], 1)
    logits = model(input_ids=ids, attention_mask=att).logits[:, p_len - 1:-1]        # temperature 1
    logp = logits.log_softmax(-1).gather(-1, c_ids[..., None]).squeeze(-1)            # [N, T]
    out = []
    for i in range(ids.shape[0]):
        model.zero_grad(set_to_none=True)
        term = -rec["advantages"][i] * (logp[i] * c_mask[i]).sum() / c_mask[i].sum().clamp(min=1) / per_device
        term.backward(retain_graph=True)
        out.append([mods[n].weight.grad.clone() for n in names])
    return out


def sketch(gf, grads):
    return torch.cat([(l.p_out @ g @ l.p_in.T).reshape(-1) for l, g in zip(gf.layers, grads)])


@pytest.fixture(scope="module")
def one_chunk(lm, dataset, tmp_path_factory):
    """B·G = 8 rows per generation, one micro-batch of 8: every step generates."""
    return run(lm, dataset, tmp_path_factory.mktemp("one"), steps=2, per_device=B * G, spg=1)


def test_features_equal_single_rollout_backward_loop(one_chunk, lm):
    gf = one_chunk["trainer"].rlpace_gf
    assert gf.dim == 64 and [l.name for l in gf.layers] == ["lm_head"]
    assert len(one_chunk["passes"]) == len(one_chunk["observed"]) == 2
    for rec, fb in zip(one_chunk["passes"], one_chunk["observed"]):
        assert rec["metrics_kept"]
        assert fb.grads.shape == (B, G, gf.dim) and fb.grads.dtype == np.float32
        want = torch.stack([sketch(gf, g) for g in per_rollout_grads(lm, rec, ["lm_head"], B * G)])
        assert want.abs().max() > 1e-4                                   # not a vacuous 0 == 0
        np.testing.assert_allclose(fb.grads.reshape(B * G, -1), want.numpy(), rtol=1e-4, atol=1e-7)
    # grad_reference="previous": the second batch carries the first one's summed features
    first, second = one_chunk["observed"]
    assert first.ref_grad is None
    np.testing.assert_allclose(second.ref_grad, first.grads.sum(axis=(0, 1)), rtol=1e-6)


def test_diem_weights_reach_the_trl_loss(one_chunk, lm):
    """Step 0's SGD update of lm_head = −lr·Σ_i w_i·∇ℓ_i with DIEM's (non-uniform) weights."""
    rec0, rec1 = one_chunk["passes"]
    fb0 = one_chunk["observed"][0]
    w = one_chunk["sched"].loss_weights(fb0).ravel()
    assert w.max() - w.min() > 0.1                      # the weights are not uniform
    grads = [g[0] for g in per_rollout_grads(lm, rec0, ["lm_head"], B * G)]
    moved = rec1["state"]["lm_head.weight"] - rec0["state"]["lm_head.weight"]
    weighted = -LR * sum(float(wi) * g for wi, g in zip(w, grads))
    plain = -LR * sum(grads)
    assert (weighted - plain).abs().max() > 100 * (moved - weighted).abs().max()   # distinguishable
    torch.testing.assert_close(moved, weighted, rtol=1e-4, atol=1e-7)


def test_chunked_features_over_the_last_block(lm, dataset, tmp_path):
    """Two micro-batches of 4 rows per generation (steps_per_generation=2): each chunk's rows
    are normalised by its own size, as TRL's "grpo" loss is; last_block = 7 linears."""
    r = run(lm, dataset, tmp_path, steps=2, per_device=4, spg=2, grad_params="last_block", loss_weights=False)
    gf = r["trainer"].rlpace_gf
    names = [l.name for l in gf.layers]
    assert len(names) == 7 and all(n.startswith("model.layers.1.") for n in names)
    (rec,), (fb,) = r["passes"], r["observed"]
    want = torch.stack([sketch(gf, g) for g in per_rollout_grads(lm, rec, names, 4)])
    np.testing.assert_allclose(fb.grads.reshape(B * G, -1), want.numpy(), rtol=1e-4, atol=1e-7)


def test_features_leave_the_kl_term_out(lm, dataset, tmp_path):
    """beta = 0.5: after one step the policy has left the reference, so the KL term has a
    gradient; the features are still those of the policy-gradient term alone."""
    r = run(lm, dataset, tmp_path, steps=2, per_device=B * G, spg=1, beta=0.5, loss_weights=False)
    gf, rec, fb = r["trainer"].rlpace_gf, r["passes"][1], r["observed"][1]
    assert not torch.equal(rec["state"]["lm_head.weight"], r["passes"][0]["state"]["lm_head.weight"])
    want = torch.stack([sketch(gf, g) for g in per_rollout_grads(lm, rec, ["lm_head"], B * G)])
    np.testing.assert_allclose(fb.grads.reshape(B * G, -1), want.numpy(), rtol=1e-4, atol=1e-7)
    assert r["trainer"].beta == 0.5                           # restored after the pass


def test_no_features_without_a_reader_and_bad_options_rejected(lm, dataset, tmp_path):
    r = run(lm, dataset, tmp_path, steps=1, per_device=B * G, spg=1, method=compose(make_policy("dump")))
    assert r["trainer"].rlpace_gf is None and r["passes"] == [] and r["observed"][0].grads is None
    base = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none",
                per_device_train_batch_size=4, num_generations=2, max_completion_length=4)
    kw = dict(model=AutoModelForCausalLM.from_pretrained(lm), args=GRPOConfig(**base), train_dataset=dataset,
              reward_funcs=lambda completions, **k: [0.0] * len(completions),
              scheduler=Scheduler(pool_from_dataset(dataset), "uniform"))
    with pytest.raises(ValueError, match="grad_features must be"):
        RlpaceGRPOTrainer(**kw, grad_features="yes")
    with pytest.raises(ValueError, match="grad_reference must be"):
        RlpaceGRPOTrainer(**kw, grad_reference="heldout")
    with pytest.raises(ValueError, match="grad_params must be one of"):
        RlpaceGRPOTrainer(**kw, grad_features="on", grad_params="head")


def test_reference_gradient_survives_a_resume(lm, dataset, tmp_path):
    """checkpoint-1 holds the first batch's summed features; the resumed run's first batch
    (step 1) carries them as ref_grad, as the uninterrupted run's second batch does."""
    full = run(lm, dataset, tmp_path / "a", steps=2, per_device=B * G, spg=1, save_steps=1)
    want = full["observed"][0].grads.sum(axis=(0, 1))
    resumed = run(lm, dataset, tmp_path / "b", steps=2, per_device=B * G, spg=1,
                  resume=str(tmp_path / "a" / "checkpoint-1"))
    assert len(resumed["observed"]) == 1 and resumed["observed"][0].step == 1
    np.testing.assert_allclose(resumed["observed"][0].ref_grad, want, rtol=1e-6)
    np.testing.assert_allclose(full["observed"][1].ref_grad, want, rtol=1e-6)


DDP_WORKER = '''
import os, sys
import numpy as np, torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig
from rlpace import Scheduler, compose
from rlpace.adapters.trl import RlpaceGRPOTrainer, pool_from_dataset
from rlpace.policies import make_policy

lm, out = sys.argv[1], sys.argv[2]
torch.set_num_threads(1)
G = 4
ds = Dataset.from_list([{"prompt": f"what is {i} plus 3?", "index": 1000 + i,
                         "data_source": ["math", "logic"][i % 2]} for i in range(8)])
sched = Scheduler(pool_from_dataset(ds), compose(make_policy("uniform"),
                  make_policy("diem", importance="loo", unit="rollout")), seed=3)
observed, passes = [], []
observe = sched.observe
sched.observe = lambda fb: observed.append(fb) or observe(fb)
_step = sched.step      # Scheduler.step observes too (the adapter calls it): the features attached
sched.step = lambda fb, features=None: (lambda r: observed.append(r.feedback) or r)(_step(fb, features))

def reward(prompts, completions, index, trainer_state, **kw):
    return [float((i * 7 + j % G * 3 + trainer_state.global_step) % 5 < 2) for j, i in enumerate(index)]

class Probe(RlpaceGRPOTrainer):
    def _rlpace_grad_features(self, output):
        if not passes:
            passes.append({k: output[k].clone() for k in ("prompt_ids", "prompt_mask", "completion_ids",
                                                          "completion_mask", "advantages")})
            passes[0]["state"] = {k: v.clone() for k, v in self.model.state_dict().items()}
        return super()._rlpace_grad_features(output)

cfg = GRPOConfig(output_dir=out, use_cpu=True, bf16=False, report_to="none", seed=0,
                 per_device_train_batch_size=G, num_generations=G, max_completion_length=4,
                 steps_per_generation=1, max_steps=2, beta=0.0, save_strategy="no", logging_steps=100, loss_type="grpo",
                 dataloader_num_workers=0, gradient_checkpointing=False, learning_rate=1e-3)
Probe(model=AutoModelForCausalLM.from_pretrained(lm), reward_funcs=reward, args=cfg, train_dataset=ds,
      processing_class=AutoTokenizer.from_pretrained(lm), scheduler=sched, loss_weights=True,
      grad_dim=64).train()
rank = int(os.environ["RANK"])
torch.save(passes[0], os.path.join(out, f"pass{rank}.pt"))
np.savez(os.path.join(out, f"rank{rank}.npz"), grads=np.stack([fb.grads for fb in observed]),
         **sched.state_dict())
'''


def test_two_ranks_gather_the_same_features_in_row_order(lm, tmp_path):
    """torchrun, 2 CPU ranks (gloo), G = 4 rows per rank: both ranks observe the same
    float32[2, 4, d] features, rank r's rows r·4…r·4+3 equal its own rollouts' single-rollout
    loop, and the Scheduler states end identical."""
    from rlpace.train.gradfeatures import GradFeatures
    from _isolated import run_two_ranks
    run_two_ranks(DDP_WORKER, lm, tmp_path, port=29547)
    r0, r1 = (np.load(tmp_path / f"rank{r}.npz") for r in (0, 1))
    assert r0["grads"].shape == (2, 2, 4, 64)                  # 2 batches × B 2 × G 4 × d
    np.testing.assert_array_equal(r0["grads"], r1["grads"])
    for k in r0.files:
        np.testing.assert_array_equal(r0[k], r1[k], err_msg=k)
    gf = GradFeatures(AutoModelForCausalLM.from_pretrained(lm), "lm_head", 64, seed=0)
    rows = r0["grads"][0].reshape(8, -1)
    for rank in (0, 1):
        rec = torch.load(tmp_path / f"pass{rank}.pt")
        want = torch.stack([sketch(gf, g) for g in per_rollout_grads(lm, rec, ["lm_head"], 4)])
        np.testing.assert_allclose(rows[rank * 4:(rank + 1) * 4], want.numpy(), rtol=1e-4, atol=1e-7)


def test_graph_from_hooks_matches_the_full_graph_and_a_frozen_head(lm):
    """GradFeatures.capture(graph_from_hooks=True) under no_grad: the same features as a
    forward with a full graph — also when the hooked head is frozen (requires_grad False)."""
    from rlpace.train.gradfeatures import GradFeatures
    model = AutoModelForCausalLM.from_pretrained(lm)
    ids = torch.tensor([[5, 9, 17, 33, 2, 8], [7, 7, 40, 12, 3, 1]])
    adv = torch.tensor([0.7, -1.3])

    def loss_of(m):
        logp = m(input_ids=ids).logits[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        return -(adv[:, None] * logp).mean()

    gf = GradFeatures(model, "lm_head", 64, seed=1)
    with gf.capture():
        loss = loss_of(model)
    full = gf.features(loss, 2)
    assert full.abs().max() > 1e-4
    model.lm_head.weight.requires_grad_(False)
    for _ in range(2):                     # frozen head, then frozen head + frozen body
        with torch.no_grad(), gf.capture(graph_from_hooks=True):
            loss = loss_of(model)
        assert torch.is_grad_enabled()
        torch.testing.assert_close(gf.features(loss, 2), full, rtol=1e-5, atol=1e-8)
        model.requires_grad_(False)
