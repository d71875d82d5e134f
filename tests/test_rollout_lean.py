"""The lean one-token decode forward gives the bits `model(...)` gives.

`rollout.generate` decodes a stock Qwen2 causal LM through `_lean_decoder` (the same ops on
the same weights, without Hugging Face's wrappers). Every field of the rollout — tokens,
masks, per-token entropy, self-certainty and log-probability — must equal the rollout of
the plain `model(...)` call bit for bit, with and without left padding, sampled and greedy;
any other model (eager attention, a forward hook, training mode) keeps the plain call; and
a trainer run writes the same metrics and ends at the same weights either way. The packed
loss forward takes the same path in training mode (log-probs and gradients equal bit for
bit), generation runs in inference mode, and the decode's KV cache is written in place —
each checked against the plain call the same way.
"""

from __future__ import annotations

import pytest
import torch

from _tiny_train import assert_same_run, tiny_config
from rlpace.train import rollout, train
from rlpace.train.model import tiny_causal_lm

torch.set_num_threads(1)


def _model(seed: int, attn: str = "sdpa"):
    model = tiny_causal_lm(23, hidden=32, layers=2, heads=4, seed=seed)
    model.config._attn_implementation = attn
    return model.eval()


def _prompts(seed: int, padded: bool):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(2, 9, (5,), generator=g).tolist() if padded else [6] * 5
    return [torch.randint(4, 23, (n,), generator=g).tolist() for n in lens]


def _generate(model, prompts, **kw):
    return rollout.generate(model, prompts, max_new_tokens=9, eos_id=2, pad_id=0, stats=True, **kw)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("padded", [True, False])
@pytest.mark.parametrize("greedy", [True, False])
def test_lean_decode_equals_the_model_call_bit_for_bit(seed, padded, greedy, monkeypatch):
    model, prompts = _model(seed), _prompts(seed, padded)
    assert rollout._lean_decoder(model) is not None
    kw = dict(greedy=greedy, repeats=1 if greedy else 4)
    lean = _generate(model, prompts, generator=torch.Generator().manual_seed(seed), **kw)
    monkeypatch.setattr(rollout, "_lean_decoder", lambda m: None)
    plain = _generate(model, prompts, generator=torch.Generator().manual_seed(seed), **kw)
    assert lean.completion_ids.shape[1] > 1                  # the decode loop ran
    for name, a, b in zip(lean._fields, lean, plain):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("padded", [True, False])
def test_lean_forward_logits_and_cache_equal_the_model_call(padded):
    """The prompt forward, then three decode steps: logits and KV cache equal `model(...)`'s."""
    from transformers import DynamicCache
    from transformers.masking_utils import create_causal_mask

    model = _model(7)
    ids, mask = rollout.left_pad(_prompts(7, padded=padded), 0)
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    step = rollout._lean_decoder(model)
    with torch.no_grad():
        caches = [DynamicCache(), DynamicCache()]
        ref = model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=caches[0],
                    use_cache=True).logits
        want = create_causal_mask(model.config, model.model.embed_tokens(ids), mask, DynamicCache(), pos)
        got_mask = rollout._prompt_mask4(mask)
        assert (want is None and got_mask is None) or torch.equal(want, got_mask)
        assert (got_mask is None) == (not padded)
        assert torch.equal(step(ids, got_mask, pos, caches[1]), ref)
        tok, nxt = torch.tensor([5, 9, 11, 2, 17]), pos[:, -1:] + 1
        for _ in range(3):
            mask = torch.cat([mask, torch.ones(5, 1, dtype=mask.dtype)], 1)
            ref = model(input_ids=tok[:, None], attention_mask=mask, position_ids=nxt, past_key_values=caches[0],
                        use_cache=True).logits
            got = step(tok[:, None], mask.bool()[:, None, None, :], nxt, caches[1])
            assert got.shape == ref.shape and torch.equal(got, ref)
            tok, nxt = ref[:, -1].argmax(-1), nxt + 1
        for a, b in zip(caches[0].layers, caches[1].layers):
            assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_other_models_keep_the_model_call():
    assert rollout._lean_decoder(_model(0, attn="eager")) is None
    hooked = _model(0)
    hooked.model.layers[0].mlp.register_forward_hook(lambda *a: None)
    assert rollout._lean_decoder(hooked) is None
    assert rollout._lean_decoder(_model(0).train()) is None


def test_a_run_with_the_lean_decode_equals_one_with_the_model_call(tmp_path, cache, monkeypatch):
    lean = tiny_config(tmp_path / "lean", cache, steps=3)
    train(lean)
    monkeypatch.setattr(rollout, "_lean_decoder", lambda m: None)
    plain = tiny_config(tmp_path / "plain", cache, steps=3)
    train(plain)
    assert_same_run(lean, plain)


def _packed_rollout(seed: int):
    """Two groups of 4 rollouts of left-padded prompts, completions of 1-4 tokens."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(4, 23, (n,), generator=g).tolist() for n in (3, 7)]
    comps = [torch.randint(3, 23, (int(n),), generator=g).tolist() for n in torch.randint(1, 5, (8,), generator=g)]
    p_ids, p_mask = rollout.left_pad([p for p in prompts for _ in range(4)], 0)
    c_ids, c_mask = rollout.right_pad(comps, 0)
    return rollout.Rollout(p_ids, p_mask, c_ids, c_mask)


@pytest.mark.parametrize("seed", range(3))
def test_lean_loss_forward_gives_the_log_probs_and_gradients_of_the_model_call(seed, monkeypatch):
    """The packed loss forward in training mode through `_lean_forward(model, training=True)`:
    the log-probs, the first-token logits and every parameter's gradient equal those of
    `model(...)` bit for bit."""
    model, ro = _model(seed).train(), _packed_rollout(seed)
    assert rollout._lean_forward(model, training=True) is not None
    w = torch.linspace(-1.0, 1.0, ro.completion_ids.numel()).view(ro.completion_ids.shape)   # [N, T]

    def run():
        model.zero_grad(set_to_none=True)
        logp, first = rollout.completion_logprobs(model, ro, 0.7, 4, first_logits=True, packed=True)
        ((logp * w).sum() + first.square().sum()).backward()
        return [logp.detach(), first.detach()] + [p.grad for p in model.parameters()]

    lean = run()
    monkeypatch.setattr(rollout, "_lean_forward", lambda m, training=False: None)
    plain = run()
    assert len(lean) == len(plain) == 2 + len(list(model.parameters()))
    assert bool((lean[0] != 0).any()) and all(g is not None and bool((g != 0).any()) for g in lean[2:])
    for a, b in zip(lean, plain):
        assert torch.equal(a, b)


def test_a_hooked_lm_head_is_called_as_a_module_with_the_tensors_of_the_model_call(monkeypatch):
    """The exact gradient features hook lm_head: the lean loss forward then calls lm_head as a
    module, so its forward hook sees the input and output `model(...)` gives it, and the
    log-probs and gradients stay the plain call's bits; a hook on any other module, or a
    backward hook anywhere, keeps `model(...)`."""
    model, ro = _model(1).train(), _packed_rollout(1)
    seen = []
    model.lm_head.register_forward_hook(lambda mod, args, out: seen.append((args[0].detach().clone(),
                                                                             out.detach().clone())))
    assert rollout._lean_forward(model, training=True) is not None

    def run():
        seen.clear()
        model.zero_grad(set_to_none=True)
        logp = rollout.completion_logprobs(model, ro, 0.7, 4, packed=True)
        logp.sum().backward()
        return list(seen), logp.detach(), [p.grad for p in model.parameters()]

    lean = run()
    monkeypatch.setattr(rollout, "_lean_forward", lambda m, training=False: None)
    plain = run()
    assert len(lean[0]) == len(plain[0]) == 1                      # one lm_head call each
    for (xa, ya), (xb, yb) in zip(lean[0], plain[0]):
        assert xa.shape[-1] == 32 and torch.equal(xa, xb) and torch.equal(ya, yb)
    assert torch.equal(lean[1], plain[1])
    assert all(torch.equal(a, b) for a, b in zip(lean[2], plain[2]))
    monkeypatch.undo()
    other = _model(1).train()
    other.model.norm.register_forward_hook(lambda *a: None)
    assert rollout._lean_forward(other, training=True) is None
    backward = _model(1).train()
    backward.lm_head.register_full_backward_hook(lambda *a: None)
    assert rollout._lean_forward(backward, training=True) is None


def test_the_lean_loss_forward_keeps_the_model_call_where_training_mode_matters():
    assert rollout._lean_forward(_model(0).train()) is None              # decoding: eval mode only
    dropout = _model(0).train()
    dropout.config.attention_dropout = 0.1
    assert rollout._lean_forward(dropout, training=True) is None
    ckpt = _model(0).train()
    ckpt.model.layers[1].gradient_checkpointing = True
    assert rollout._lean_forward(ckpt, training=True) is None


def test_a_run_with_the_lean_loss_forward_equals_one_with_the_model_call(tmp_path, cache, monkeypatch):
    lean = tiny_config(tmp_path / "lean", cache, steps=3)
    train(lean)
    monkeypatch.setattr(rollout, "_lean_forward", lambda m, training=False: None)
    plain = tiny_config(tmp_path / "plain", cache, steps=3)
    train(plain)
    assert_same_run(lean, plain)


@pytest.mark.parametrize("greedy", [True, False])
def test_generation_runs_in_inference_mode_with_the_bits_of_no_grad(greedy, monkeypatch):
    """`generate` decodes under `torch.inference_mode()` (the model is called with it on) and
    returns ordinary tensors (a loss can read them) equal bit for bit to the decode under
    `no_grad` alone."""
    model, prompts = _model(3), _prompts(3, padded=True)
    seen = []
    forward = rollout._lean_forward
    monkeypatch.setattr(rollout, "_lean_forward",
                        lambda m, training=False: seen.append(torch.is_inference_mode_enabled()) or forward(m, training))
    kw = dict(greedy=greedy, repeats=1 if greedy else 4)
    fast = _generate(model, prompts, generator=torch.Generator().manual_seed(3), **kw)
    assert seen == [True]
    with torch.no_grad():
        ref = rollout._generate(model, prompts, max_new_tokens=9, eos_id=2, pad_id=0, temperature=1.0, stats=True,
                                generator=torch.Generator().manual_seed(3), **kw)
    assert fast.completion_ids.shape[1] > 1
    for name, a, b in zip(fast._fields, fast, ref):
        assert not a.is_inference() and not b.is_inference() and torch.equal(a, b), name
    ids = fast.completion_ids.clone()
    emb = torch.nn.Embedding(23, 3)
    emb(ids).sum().backward()                     # an ordinary tensor: autograd may save it
    assert emb.weight.grad is not None


@pytest.mark.parametrize("padded", [True, False])
def test_the_lean_decode_writes_its_cache_in_place_with_the_bits_of_a_dynamic_cache(padded, monkeypatch):
    """The lean decode keeps keys and values in `_KVBuffers` (P + max_new_tokens positions,
    filled in place); its rollout equals the one `model(...)` decodes with a `DynamicCache`."""
    made = []

    class Recorded(rollout._KVBuffers):
        def __init__(self, capacity):
            super().__init__(capacity)
            made.append(self)

    monkeypatch.setattr(rollout, "_KVBuffers", Recorded)
    model, prompts = _model(5), _prompts(5, padded)
    fast = _generate(model, prompts, generator=torch.Generator().manual_seed(5), repeats=3)
    p, t = max(map(len, prompts)), fast.completion_ids.shape[1]
    assert len(made) == 1 and made[0].capacity == p + 9 and t > 1
    assert sorted(made[0].length.values()) == [p + t - 1, p + t - 1]      # both layers, every token but the last
    assert made[0].keys[0].shape == (15, 4, p + 9, 8)                      # 5 prompts × 3 rows, 4 heads of 8
    monkeypatch.setattr(rollout, "_lean_decoder", lambda m: None)
    plain = _generate(model, prompts, generator=torch.Generator().manual_seed(5), repeats=3)
    for name, a, b in zip(fast._fields, fast, plain):
        assert torch.equal(a, b), name
