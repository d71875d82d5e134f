"""completion_logprobs(..., packed=True): one forward per group over [prompt | o_1 | … | o_G]
under a block mask gives the per-row reference's log-probs, first-token logits and gradients
(to float rounding), in one model call instead of two; it falls back to the two-call path
where it cannot pack."""

from __future__ import annotations

import pytest
import torch

from rlpace.train.model import tiny_causal_lm
from rlpace.train.rollout import PACKED_MAX_LEN, completion_logprobs, completion_logprobs_reference, generate


def _model(seed=0, attn="sdpa"):
    m = tiny_causal_lm(12, hidden=16, layers=2, heads=2, seed=seed)
    m.config._attn_implementation = attn
    return m.eval()


def _rollout(model, seed=3):
    prompts = [[1, 5, 6, 7], [1, 8], [1, 9, 4, 4, 5, 6]]        # different lengths: left padding
    return generate(model, prompts, repeats=4, max_new_tokens=6, eos_id=2, pad_id=0,
                    generator=torch.Generator().manual_seed(seed))


def _calls(model):
    n = [0]
    model.model.register_forward_hook(lambda *_: n.__setitem__(0, n[0] + 1))
    return n


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_matches_the_per_row_reference(attn):
    model = _model(attn=attn)
    ro = _rollout(model)
    assert (ro.completion_mask == 0).any() and (ro.prompt_mask == 0).any()      # padding on both sides
    w = torch.rand(ro.completion_ids.shape, generator=torch.Generator().manual_seed(1))
    calls = _calls(model)
    lp, z0 = completion_logprobs(model, ro, 0.7, group_size=4, first_logits=True, packed=True)
    assert calls[0] == 1                                         # one forward for 3 prompts × 4 rollouts
    ref = completion_logprobs_reference(model, ro, 0.7)
    assert calls[0] == 2
    assert lp.shape == ref.shape == (12, ro.completion_ids.shape[1])
    assert torch.allclose(lp, ref, atol=1e-5) and torch.equal(lp == 0, ref == 0)
    p = ro.prompt_ids.shape[1]
    per_row = model(input_ids=ro.prompt_ids, attention_mask=ro.prompt_mask,
                    position_ids=(ro.prompt_mask.cumsum(1) - 1).clamp(min=0)).logits[:, p - 1:p]
    assert z0.shape == (12, 1, 12) and z0.requires_grad and torch.allclose(z0, per_row, atol=1e-5)
    params = list(model.parameters())
    g_packed = torch.autograd.grad((lp * w).sum() + z0.sum(), params)
    g_ref = torch.autograd.grad((ref * w).sum() + per_row.sum(), params)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(g_packed, g_ref))
    # the unpacked shared-prefix path: two calls (prompt forward, completions on its cache)
    assert torch.allclose(completion_logprobs(model, ro, 0.7, group_size=4), lp, atol=1e-5)
    assert calls[0] == 3 + 2                                     # after packed, reference, per_row: two more


def test_packed_falls_back_where_it_cannot_pack(monkeypatch):
    model = _model()
    ro = _rollout(model)
    calls = _calls(model)
    import rlpace.train.rollout as rollout
    length = ro.prompt_ids.shape[1] + 4 * ro.completion_ids.shape[1]         # P + G·T of a group
    assert rollout._packs(model, length) and not rollout._packs(model, PACKED_MAX_LEN + 1)
    monkeypatch.setattr(model.config, "_attn_implementation", "flash_attention_2")   # takes no 4-D mask
    assert not rollout._packs(model, length)
    monkeypatch.setattr(model.config, "_attn_implementation", "sdpa")
    monkeypatch.setattr(rollout, "PACKED_MAX_LEN", length - 1)
    completion_logprobs(model, ro, 1.0, group_size=4, packed=True)
    assert calls[0] == 2                                         # too long to pack: the two-call path
    with pytest.raises(ValueError, match="do not share their prompt"):
        completion_logprobs(model, ro._replace(prompt_ids=ro.prompt_ids.roll(1, dims=0)), group_size=4, packed=True)
