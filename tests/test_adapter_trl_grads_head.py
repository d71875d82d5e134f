"""rlpace.adapters.trl lm_head features from the hidden states generation computed.

With features of lm_head alone, the feature pass runs the head on the inputs it received
during Hugging Face `generate` (kept by `_generate_single_turn`), not a forward of the batch:

* the pass makes no call to the model's body, and its features equal the forward pass's
  (`_rlpace_unfused_logps`, run on the same batch at the same weights) and an independent loop
  of single-rollout `backward()` calls (tests/test_adapter_trl_grads.py's reference);
* a model whose logits are not the head's output (here scaled after the head) falls back to
  the forward.
Runtime: about 10 s at 1 thread.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("trl")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from trl import GRPOConfig  # noqa: E402

from _trl_common import dataset, lm, outcome  # noqa: E402,F401 (fixtures)
from test_adapter_trl_grads import per_rollout_grads, sketch  # noqa: E402
from rlpace import Scheduler, compose  # noqa: E402
from rlpace.adapters.trl import RlpaceGRPOTrainer, pool_from_dataset  # noqa: E402
from rlpace.policies import make_policy  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore"), pytest.mark.slow]
G, B = 4, 2


def run(lm, dataset, out, scale_logits=None):
    """Two steps of diem on lm_head features; per pass: whether generation's hidden states were
    used, the body's forward calls during it, its features, and the forward path's features."""
    passes, observed = [], []
    sched = Scheduler(pool_from_dataset(dataset),
                      compose(make_policy("uniform"), make_policy("diem", importance="loo", unit="rollout")), seed=3)
    _step = sched.step
    sched.step = lambda fb, features=None: (lambda r: observed.append(r.feedback) or r)(_step(fb, features))

    class Probe(RlpaceGRPOTrainer):
        def _rlpace_grad_features(self, output):
            rec = {k: output[k].detach().clone() for k in ("prompt_ids", "prompt_mask", "completion_ids",
                                                            "completion_mask", "advantages")}
            rec["state"] = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
            rec["used"] = self._rlpace_hidden is not None and self._rlpace_hidden[0] is output["completion_ids"]
            body = []
            hook = self.model.model.register_forward_hook(lambda *a: body.append(1))
            feats = super()._rlpace_grad_features(output)
            hook.remove()
            rec["body_calls"], rec["feats"] = len(body), feats.clone()
            kept, self._rlpace_hidden = self._rlpace_hidden, None        # the forward path, same batch
            rec["forward"] = super()._rlpace_grad_features(output)
            self._rlpace_hidden = kept
            passes.append(rec)
            return feats

    def reward(prompts, completions, index, trainer_state, **kw):
        return [outcome(i, j % G, trainer_state.global_step) for j, i in enumerate(index)]

    cfg = GRPOConfig(output_dir=str(out), use_cpu=True, bf16=False, report_to="none", seed=0,
                     per_device_train_batch_size=B * G, steps_per_generation=1, num_generations=G,
                     max_completion_length=5, max_steps=2, logging_steps=100, beta=0.0, save_strategy="no",
                     dataloader_num_workers=0, learning_rate=0.5, optim="sgd", lr_scheduler_type="constant",
                     max_grad_norm=0.0, loss_type="grpo")
    model = AutoModelForCausalLM.from_pretrained(lm)
    if scale_logits is not None:             # logits = scale · head output (as soft-capping models differ)
        def scaled(module, inputs, out):
            if getattr(out, "logits", None) is not None:      # TRL's fused loss output has none
                out.logits = out.logits * scale_logits
            return out
        model.register_forward_hook(scaled)
    trainer = Probe(model=model, reward_funcs=reward, args=cfg, train_dataset=dataset,
                    processing_class=AutoTokenizer.from_pretrained(lm), scheduler=sched, loss_weights=True,
                    grad_dim=64)
    trainer.train()
    return passes, observed, trainer


def test_features_from_generation_equal_the_forward_and_the_backward_loop(lm, dataset, tmp_path):
    passes, observed, trainer = run(lm, dataset, tmp_path)
    gf = trainer.rlpace_gf
    assert len(passes) == len(observed) == 2
    for rec, fb in zip(passes, observed):
        assert rec["used"] and rec["body_calls"] == 0                  # the head alone, no forward
        np.testing.assert_array_equal(fb.grads.reshape(B * G, -1), rec["feats"].numpy())   # what was observed
        want = torch.stack([sketch(gf, g) for g in per_rollout_grads(lm, rec, ["lm_head"], B * G)])
        assert want.abs().max() > 1e-4
        np.testing.assert_allclose(rec["feats"].numpy(), want.numpy(), rtol=1e-4, atol=1e-7)
        np.testing.assert_allclose(rec["feats"].numpy(), rec["forward"].numpy(), rtol=1e-5, atol=1e-7)
    assert trainer._rlpace_hidden is None                             # not kept past the generation batch


def test_logits_that_are_not_the_head_output_fall_back_to_the_forward(lm, dataset, tmp_path):
    passes, observed, _ = run(lm, dataset, tmp_path, scale_logits=2.0)
    for rec in passes:
        assert not rec["used"] and rec["body_calls"] == 1
        np.testing.assert_array_equal(rec["feats"].numpy(), rec["forward"].numpy())
