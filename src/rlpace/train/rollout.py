"""Batched sampling with a KV cache, and the log-probabilities the loss needs.

`generate` is a hand-written incremental decode loop: one forward over the left-padded
prompts fills the KV cache, then one forward per new token. Two reasons over
`model.generate`: it draws from an explicit `torch.Generator` seeded by (seed, step), so
a resumed run samples exactly what the uninterrupted one did (HF `generate` uses the
global RNG), and it skips the per-step logits-processor machinery — on the tiny policy
(128 rollouts, ≤ 10 tokens, one thread) it took 28–38 ms against `generate`'s 42 ms.
"""

from __future__ import annotations

from ..errors import InputError
import itertools
import math
from typing import NamedTuple, Sequence

import numpy as np
import torch

__all__ = ["Rollout", "encode_prompts", "left_pad", "right_pad", "generate", "completion_logprobs",
           "completion_logprobs_reference", "decode_completions", "token_statistics"]


class Rollout(NamedTuple):
    """N sampled sequences (N = prompts × G), prompt left-padded, completion right-padded."""

    prompt_ids: torch.Tensor       # int64[N, P]
    prompt_mask: torch.Tensor      # int64[N, P]  1 = real token
    completion_ids: torch.Tensor   # int64[N, T]  pad after EOS
    completion_mask: torch.Tensor  # float32[N, T] 1 up to and including EOS
    # per-token statistics of the sampling distribution (generate(..., stats=True); else None)
    token_entropy: torch.Tensor | None = None    # float32[N, T] H(p_t) in nats, 0 where masked
    self_certainty: torch.Tensor | None = None   # float32[N, T] KL(U ‖ p_t), 0 where masked
    token_logprob: torch.Tensor | None = None    # float32[N, T] log p_t(o_t) of the drawn token, 0 where masked


def token_statistics(logits: torch.Tensor, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(entropy, self-certainty), each float32[...], of the distributions p = softmax(z / τ)
    whose logits z are the last axis of `logits` ([..., V]):

        H(p)        = −Σ_j p_j log p_j                                    (nats, ≥ 0)
        KL(U ‖ p)   = logsumexp(z/τ) − mean_j (z/τ)_j − log V             (≥ 0)

    The second is Intuitor's self-certainty (arXiv 2505.19590; `self_certainty_from_logits`
    in sunblaze-ucb/Intuitor's verl fork) with the constant log V kept, so a uniform p
    scores exactly 0; as in that verl code the logits are first divided by the sampling
    temperature, i.e. both read the distribution the token was drawn from.

    >>> h, sc = token_statistics(torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0]]))
    >>> [round(x, 4) for x in h.tolist()], [round(x, 4) for x in sc.tolist()]
    ([0.6931, 0.5623], [0.0, 0.1438])
    """
    z = (logits if logits.dtype == torch.float64 else logits.float()) / temperature   # [..., V]
    lse = torch.logsumexp(z, dim=-1)                              # [...]
    logp = z - lse[..., None]
    entropy = (-(logp.exp() * logp).sum(-1)).clamp(min=0.0)     # rounding can give −1e-8 when p_t is one-hot
    certainty = lse - z.mean(-1) - math.log(z.shape[-1])
    return entropy, certainty


def encode_prompts(tokenizer, texts: Sequence[str], chat: bool) -> list[list[int]]:
    """Token ids of each prompt: the tokenizer's chat template with a generation prompt
    when `chat`, else BOS (when the tokenizer has one) + the raw text."""
    if chat:
        return [list(tokenizer.apply_chat_template([{"role": "user", "content": t}],
                                                   add_generation_prompt=True, tokenize=True,
                                                   return_dict=False))
                for t in texts]
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    return [bos + tokenizer.encode(t, add_special_tokens=False) for t in texts]


def left_pad(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids int64[N, P], mask int64[N, P]) with each sequence right-aligned."""
    lens = np.fromiter(map(len, seqs), dtype=np.int64, count=len(seqs))             # [N]
    p = int(lens.max())
    mask = np.arange(p)[None, :] >= (p - lens)[:, None]                           # [N, P] right-aligned
    ids = np.full((len(seqs), p), pad_id, dtype=np.int64)
    ids[mask] = np.fromiter(itertools.chain.from_iterable(seqs), dtype=np.int64, count=int(lens.sum()))
    return torch.from_numpy(ids), torch.from_numpy(mask.astype(np.int64))


def right_pad(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids int64[N, T], mask float32[N, T]) with each sequence left-aligned (T ≥ 1, so a
    batch of empty completions still has one padded column)."""
    lens = np.fromiter(map(len, seqs), dtype=np.int64, count=len(seqs))             # [N]
    t = max(1, int(lens.max()))
    mask = np.arange(t)[None, :] < lens[:, None]                                  # [N, T] left-aligned
    ids = np.full((len(seqs), t), pad_id, dtype=np.int64)
    ids[mask] = np.fromiter(itertools.chain.from_iterable(seqs), dtype=np.int64, count=int(lens.sum()))
    return torch.from_numpy(ids), torch.from_numpy(mask.astype(np.float32))


class _KVBuffers:
    """The lean decode's KV cache: per layer, keys and values in buffers of `capacity`
    positions allocated at the prompt forward, each new token's written in place; `update`
    returns views of the filled part. `DynamicCache` concatenates the whole cache at every
    token instead (keys and values of every layer copied each step: ~70 µs a copy for 128
    rows of the tiny policy, ~0.3 s of a 11–15 s `ladder` run by that count). The attention
    reads the same values through a strided view, the same bits (tested)."""

    def __init__(self, capacity: int):
        self.capacity, self.keys, self.values, self.length = capacity, {}, {}, {}

    def update(self, k: torch.Tensor, v: torch.Tensor, idx: int):
        """Append k, v [N, H, L, D] to layer `idx`; its keys and values [N, H, S, D] so far."""
        if idx not in self.keys:
            n, h, _, d = k.shape
            self.keys[idx], self.values[idx], self.length[idx] = k.new_empty(n, h, self.capacity, d), \
                v.new_empty(n, h, self.capacity, v.shape[-1]), 0
        kb, vb, start = self.keys[idx], self.values[idx], self.length[idx]
        end = start + k.shape[2]
        kb[:, :, start:end] = k
        vb[:, :, start:end] = v
        self.length[idx] = end
        return kb[:, :, :end], vb[:, :, :end]

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Repeat every row `repeats` times (the G rollouts of a prompt share its cache)."""
        for idx in self.keys:
            self.keys[idx] = self.keys[idx].repeat_interleave(repeats, dim=0)
            self.values[idx] = self.values[idx].repeat_interleave(repeats, dim=0)


def _prefill(model, ids, mask, repeats: int, lean=None, capacity: int = 0):
    """Forward the (unique) prompts once, then repeat logits, cache and masks `repeats`
    times row-wise: the G rollouts of a group share one prompt forward. `lean`: the forward
    `_lean_decoder(model)` returned (no gradients), with a `_KVBuffers` cache of `capacity`
    positions, else `model(...)` with a `DynamicCache`."""
    from transformers import DynamicCache

    pos = (mask.cumsum(1) - 1).clamp(min=0)
    if lean is not None:
        cache = _KVBuffers(capacity)
        last = lean(ids, _prompt_mask4(mask), pos, cache)[:, -1:, :]
    else:
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos,
                    past_key_values=DynamicCache(), use_cache=True)
        last = out.logits[:, -1:, :]
        cache = out.past_key_values
    if repeats > 1:
        cache.batch_repeat_interleave(repeats)
        last = last.repeat_interleave(repeats, dim=0)
        mask, pos = mask.repeat_interleave(repeats, dim=0), pos.repeat_interleave(repeats, dim=0)
    return last, cache, mask, pos


def _prompt_mask4(mask: torch.Tensor) -> torch.Tensor | None:
    """What `create_causal_mask` gives sdpa for left-padded prompts mask int64[B, P] and an
    empty cache: None when nothing is padded (sdpa's own causal mask), else causal ∧ padding,
    bool[B, 1, P, P]."""
    if bool(mask.all()):
        return None
    pos = torch.arange(mask.shape[1], device=mask.device)
    return (pos[None, :] <= pos[:, None])[None, None] & mask.bool()[:, None, None, :]


def _shares_cache(model) -> bool:
    """Whether the model's cache can be repeated row-wise. True for models that use a
    plain `DynamicCache` (Llama, Qwen2/3, Mistral, Phi, GPT-2, ...); the listed types keep
    sliding-window or recurrent state, for which we take the reference path."""
    from transformers import DynamicCache
    return hasattr(DynamicCache, "batch_repeat_interleave") and getattr(model.config, "model_type", "") not in (
        "gemma2", "gemma3", "mamba", "falcon_mamba", "jamba", "zamba", "recurrent_gemma")


def _lean_decoder(model):
    """`_lean_forward(model)`: the no-gradient decode forward of a plain Qwen2 causal LM, or None."""
    return _lean_forward(model)


def _lean_forward(model, training: bool = False):
    """The forward of a plain Qwen2 causal LM, as a function `step(ids int64[N, L],
    mask4, pos int64[N, L], cache) -> logits [N, L, V]` (mask4: what `create_causal_mask`
    builds for sdpa — `_prompt_mask4` for the prompts, the padding mask bool[N, 1, 1, S] for
    one decoded token, None where nothing is padded); None for any other model.

    It runs the ops of `Qwen2ForCausalLM.forward` in their order (embedding, rotary
    embedding once, per layer RMSNorm → q/k/v projections → rotary → cache update → sdpa →
    o_proj → residual → RMSNorm → SwiGLU MLP → residual, final norm, lm_head) on the same
    weights, without the wrappers around them: Hugging Face's output capturing, config
    defaults, `ModelOutput` records, the per-call mask construction and a module call per
    submodule. Same ops on the same tensors, so the logits and the cache are the same bits
    (`tests/test_rollout_lean.py`); on the tiny policy a `ladder` generation (16 prompts × 8,
    ≤ 10 tokens) takes 15.7–17.4 ms of CPU against 19.9 (medians of 7 × 20, load ~3).
    Taken only where every module is exactly the stock Qwen2 class, attention is sdpa over
    full (not sliding) layers with one key/value head per query head, no kernels, no hooks
    (but forward hooks on lm_head, which is then called as a module: the exact gradient
    features hook it) and no training mode; anything else runs `model(...)`.

    `training=True` (the loss forward, `_packed_logprobs`): also in training mode — where it
    changes nothing: attention dropout 0 and no gradient checkpointing — with `cache` None (no
    KV cache). Autograd records the same ops on the same tensors, so the log-probs and the
    gradients are the bits of `model(...)`'s (tested).
    """
    try:
        from transformers.activations import SiLUActivation
        from transformers.integrations.sdpa_attention import use_gqa_in_sdpa
        from transformers.models.qwen2 import modeling_qwen2 as q2
    except ImportError:                                   # another transformers layout
        return None
    if type(model) is not q2.Qwen2ForCausalLM or type(model.model) is not q2.Qwen2Model:
        return None
    m, cfg = model.model, model.config
    layers = list(m.layers)
    if model.training and not (training and getattr(cfg, "attention_dropout", None) == 0
                               and not any(getattr(x, "gradient_checkpointing", True) for x in layers)):
        return None
    plain = (cfg._attn_implementation == "sdpa" and not getattr(model, "use_kernels", False)
             and len(layers) == cfg.num_hidden_layers and getattr(m, "has_sliding_layers", True) is False
             and getattr(cfg, "is_causal", True) and model.lm_head.bias is None
             and (getattr(cfg, "rope_parameters", None) or {}).get("rope_type") == "default"
             and type(m.rotary_emb) is q2.Qwen2RotaryEmbedding and type(m.norm) is q2.Qwen2RMSNorm
             and type(m.embed_tokens) is torch.nn.Embedding and m.embed_tokens.max_norm is None)
    for layer in layers:
        a = layer.self_attn
        plain = plain and (type(layer) is q2.Qwen2DecoderLayer and type(a) is q2.Qwen2Attention
                           and type(layer.mlp) is q2.Qwen2MLP and type(layer.mlp.act_fn) is SiLUActivation
                           and type(layer.input_layernorm) is q2.Qwen2RMSNorm
                           and type(layer.post_attention_layernorm) is q2.Qwen2RMSNorm
                           and a.num_key_value_groups == 1 and a.sliding_window is None)
    # hooks run only where a module is called: a module with hooks takes `model(...)`, but for
    # lm_head alone (what the exact gradient features hook), which is then called as a module
    # (`nn.Linear.forward` is the same `linear`), so its hooks see the tensors `model(...)` gives
    head = model.lm_head
    hooked = head._forward_hooks or head._forward_pre_hooks
    plain = plain and not any(x._forward_hooks or x._forward_pre_hooks for x in model.modules() if x is not head)
    plain = plain and not any(x._backward_hooks or x._backward_pre_hooks for x in model.modules())
    plain = plain and not (hooked and type(head) is not torch.nn.Linear)
    module = torch.nn.modules.module
    if not plain or module._global_forward_hooks or module._global_forward_pre_hooks or \
            module._global_backward_hooks or module._global_backward_pre_hooks:
        return None
    f = torch.nn.functional

    def rms(x, norm):                    # Qwen2RMSNorm.forward
        dtype = x.dtype
        x = x.to(torch.float32)
        var = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(var + norm.variance_epsilon)
        return norm.weight * x.to(dtype)

    def half(x):                         # rotate_half
        d = x.shape[-1] // 2
        return torch.cat((-x[..., d:], x[..., :d]), dim=-1)

    emb = m.embed_tokens
    emb_args = (emb.weight, emb.padding_idx, None, emb.norm_type, emb.scale_grad_by_freq, emb.sparse)
    # each layer's tensors, read once per call of `_lean_decoder` (the parameters themselves:
    # an optimizer step between two generations updates them in place)
    per_layer = [(x.input_layernorm, x.post_attention_layernorm, x.self_attn.head_dim, x.self_attn.scaling,
                  x.self_attn.layer_idx, x.self_attn.q_proj.weight, x.self_attn.q_proj.bias,
                  x.self_attn.k_proj.weight, x.self_attn.k_proj.bias, x.self_attn.v_proj.weight,
                  x.self_attn.v_proj.bias, x.self_attn.o_proj.weight, x.self_attn.o_proj.bias,
                  x.mlp.gate_proj.weight, x.mlp.gate_proj.bias, x.mlp.up_proj.weight, x.mlp.up_proj.bias,
                  x.mlp.down_proj.weight, x.mlp.down_proj.bias) for x in layers]
    lm_head = model.lm_head.weight

    def step(ids, mask4, pos, cache):
        """logits [N, L, V] of ids int64[N, L] at positions pos int64[N, L] on top of `cache`
        (None: no cache), under `mask4` (what create_causal_mask returns: bool[N, 1, L, S] or
        None; or a 4-D additive mask, which it passes through as given)."""
        h = f.embedding(ids, *emb_args)                                            # [N, L, H]
        cos, sin = m.rotary_emb(h, pos)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        gqa = {"enable_gqa": True} if use_gqa_in_sdpa(mask4, h) else {}            # as sdpa_attention_forward
        causal = ids.shape[1] > 1 and mask4 is None
        n, length = ids.shape
        for (norm1, norm2, head_dim, scaling, idx, wq, bq, wk, bk, wv, bv, wo, bo,
             wg, bg, wu, bu, wd, bd) in per_layer:
            res = h
            x = rms(h, norm1)
            shape = (n, length, -1, head_dim)
            q = f.linear(x, wq, bq).view(shape).transpose(1, 2)
            k = f.linear(x, wk, bk).view(shape).transpose(1, 2)
            v = f.linear(x, wv, bv).view(shape).transpose(1, 2)
            q = (q * cos) + (half(q) * sin)
            k = (k * cos) + (half(k) * sin)
            if cache is not None:
                k, v = cache.update(k, v, idx)
            o = f.scaled_dot_product_attention(q, k, v, attn_mask=mask4, dropout_p=0.0, scale=scaling,
                                               is_causal=causal, **gqa)
            o = o.transpose(1, 2).contiguous().reshape(n, length, -1).contiguous()
            h = res + f.linear(o, wo, bo)
            res = h
            x = rms(h, norm2)
            h = res + f.linear(f.silu(f.linear(x, wg, bg)) * f.linear(x, wu, bu), wd, bd)
        h = rms(h, m.norm)
        return head(h) if hooked else f.linear(h, lm_head)                         # [N, L, V]

    return step


def generate(model, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, eos_id: int,
             pad_id: int, temperature: float = 1.0, greedy: bool = False,
             generator: torch.Generator | None = None, repeats: int = 1, stats: bool = False) -> Rollout:
    """Sample `repeats` completions for every prompt; rows are prompt-major (the G
    rollouts of prompt i are rows i·G … i·G + G − 1).

    The prompts are run through the model once and their KV cache is repeated G times
    (the shared-prefix fast path), then one forward per new token over all rows. Tokens
    are drawn from softmax(logits / temperature) with `generator` (so a run is
    reproducible from its seed), or argmax when `greedy`. A row stops at its first EOS;
    the loop stops when every row has, or after `max_new_tokens`.

    With `stats`, the returned rollout also carries each token's entropy and
    self-certainty (`token_statistics`) of the temperature-scaled distribution it was drawn
    from, and the drawn token's log-probability under it, read off the logits the loop
    computes anyway (no extra forward).

    It runs under `torch.inference_mode()`: the same kernels on the same tensors as under
    `no_grad` (the same bits, tested), without autograd's per-op bookkeeping (version counters,
    view tracking): a `ladder` generation of 16 prompts × 8 rollouts on the tiny policy took
    8.1–9.7 ms of CPU against 10.0–13.6 under `no_grad` (3 × 20 calls each, alternating, load
    ~10). The returned tensors are copied out of inference mode, so a loss may read them.

    Example:
        >>> # rollout = generate(model, [[1, 5, 6]], repeats=8, max_new_tokens=6, eos_id=2, pad_id=0)
    """
    with torch.inference_mode():
        ro = _generate(model, prompts, max_new_tokens=max_new_tokens, eos_id=eos_id, pad_id=pad_id,
                       temperature=temperature, greedy=greedy, generator=generator, repeats=repeats, stats=stats)
    return Rollout(*(None if x is None else x.clone() for x in ro))


def _generate(model, prompts, *, max_new_tokens, eos_id, pad_id, temperature, greedy, generator, repeats,
              stats) -> Rollout:
    """`generate`'s decode loop (the caller holds inference mode)."""
    device = next(model.parameters()).device
    if repeats > 1 and not _shares_cache(model):      # reference path: repeat the prompts
        prompts, repeats = [p for p in prompts for _ in range(repeats)], 1
    ids, mask = left_pad(prompts, pad_id)
    ids, mask = ids.to(device), mask.to(device)
    lean = _lean_decoder(model)
    last, cache, attn, pos = _prefill(model, ids, mask, repeats, lean, capacity=ids.shape[1] + max_new_tokens)
    ids = ids.repeat_interleave(repeats, dim=0)
    prompt_mask = attn
    n = ids.shape[0]
    next_pos = pos[:, -1:] + 1
    done = torch.zeros(n, dtype=torch.bool, device=device)
    tokens, live, ents, certs, lps = [], [], [], [], []
    logits = last[:, -1, :].float()
    padded = not bool(prompt_mask.all())     # create_causal_mask's None for one query token and no padding
    for t in range(max_new_tokens):
        if stats:
            h, sc = token_statistics(logits, temperature)
            ents.append(h)
            certs.append(sc)
        if greedy:
            tok = logits.argmax(-1)
        else:
            probs = torch.softmax(logits / temperature, dim=-1)
            tok = torch.multinomial(probs, 1, generator=generator).squeeze(1)  # generator on `device`
        live.append(~done)
        tok = torch.where(done, torch.full_like(tok, pad_id), tok)
        if stats:
            lps.append(torch.log_softmax(logits / temperature, dim=-1).gather(-1, tok[:, None]).squeeze(-1)
                       .clamp(max=0.0))
        tokens.append(tok)
        done = done | (tok == eos_id)
        if bool(done.all()) or t == max_new_tokens - 1:
            break
        attn = torch.cat([attn, torch.ones(n, 1, dtype=attn.dtype, device=device)], dim=1)
        if lean is not None:
            logits = lean(tok[:, None], attn.bool()[:, None, None, :] if padded else None, next_pos,
                          cache)[:, -1, :].float()
        else:
            out = model(input_ids=tok[:, None], attention_mask=attn, position_ids=next_pos,
                        past_key_values=cache, use_cache=True)
            cache, logits = out.past_key_values, out.logits[:, -1, :].float()
        next_pos = next_pos + 1
    comp = torch.stack(tokens, dim=1)                       # [N, T]
    cmask = torch.stack(live, dim=1).float()                # [N, T]
    if not stats:
        return Rollout(ids, prompt_mask, comp, cmask)
    return Rollout(ids, prompt_mask, comp, cmask, torch.stack(ents, dim=1) * cmask,
                   torch.stack(certs, dim=1) * cmask, torch.stack(lps, dim=1) * cmask)


def completion_logprobs(model, rollout: Rollout, temperature: float = 1.0, group_size: int = 1,
                        first_logits: bool = False, packed: bool = False):
    """float32[N, T] log π(o_t | q, o_<t) of each completion token (0 where masked).

    Logits are divided by the sampling temperature so the ratio compares the
    distribution the tokens were drawn from.

    With `group_size` G > 1 the rows must come in groups of G sharing one prompt (as
    `generate(..., repeats=G)` returns them): each prompt is then forwarded once with
    gradients, its KV cache repeated G times, and the completions forwarded on top —
    the same numbers as one forward over [prompt | completion] per row
    (`completion_logprobs_reference`, tested to 1e-5), with G× fewer prompt tokens.

    `first_logits=True` returns (log-probs, z) with z [N, 1, V] the first completion token's
    logits as the log-probs read them — the prompt forward's last position, repeated per
    group, before the temperature; in the graph — or None on the per-row path (no shared
    prompt forward). What exact lm_head gradient features differentiate to
    (`rlpace.train.gradfeatures.FirstToken`).

    `packed=True` (groups of G > 1 only) makes that ONE forward instead of two: each group is
    one sequence [prompt | completion 1 | … | completion G] under a block mask (a completion
    sees the prompt's real tokens and itself, causally; positions restart after the prompt
    for every completion), so no KV cache is built and repeated. Faster where the model call's
    fixed cost dominates (the tiny policy: −20…25 % forward + backward time for B = 16, G = 8,
    T ≤ 10); the same numbers up to float rounding (≤ 1e-6 on the tiny policy: longer masked
    rows change the reduction order), not bit for bit. Left to the two-call path when the
    model's attention does not take a 4-D mask (only sdpa and eager do) or a group's sequence
    would be long (P + G·T > 2048: the mask and the attention grow as its square), and
    unsuitable under `GradFeatures` hooks, which need one lm_head call per rollout.
    """
    n = rollout.prompt_ids.shape[0]
    if group_size <= 1 or not _shares_cache(model):
        logp = completion_logprobs_reference(model, rollout, temperature)
        return (logp, None) if first_logits else logp
    if n % group_size:
        raise InputError(f"completion_logprobs: {n} rows are not whole groups of {group_size}.")
    ids, mask = rollout.prompt_ids[::group_size], rollout.prompt_mask[::group_size]
    b, p = ids.shape
    if not torch.equal(rollout.prompt_ids.view(b, group_size, p), ids[:, None].expand(b, group_size, p)):
        raise InputError("completion_logprobs: rows of a group do not share their prompt; pass "
                         "group_size=1 or order rows prompt-major.")
    if packed and _packs(model, p + group_size * rollout.completion_ids.shape[1]):
        return _packed_logprobs(model, rollout, temperature, group_size, first_logits)
    last, cache, pmask, pos = _prefill(model, ids, mask, group_size)                # [N, 1, V]
    attn = torch.cat([pmask, rollout.completion_mask.long()], dim=1)                # [N, P+T]
    cpos = pos[:, -1:] + 1 + torch.arange(rollout.completion_ids.shape[1], device=pos.device)[None]
    out = model(input_ids=rollout.completion_ids, attention_mask=attn, position_ids=cpos,
                past_key_values=cache, use_cache=True)
    logits = torch.cat([last, out.logits[:, :-1, :]], dim=1).float() / temperature  # [N, T, V]
    logp = torch.log_softmax(logits, dim=-1).gather(-1, rollout.completion_ids[..., None]).squeeze(-1)
    logp = logp * rollout.completion_mask
    return (logp, last) if first_logits else logp


PACKED_MAX_LEN = 2048     # longest packed group sequence P + G·T (its mask is [L, L] per group)


def _packs(model, length: int) -> bool:
    """Whether `completion_logprobs(..., packed=True)` packs: an attention that takes a 4-D mask
    (sdpa, eager; flash attention does not) and a group sequence of at most PACKED_MAX_LEN."""
    return (getattr(model.config, "_attn_implementation", None) in ("sdpa", "eager")
            and length <= PACKED_MAX_LEN)


def _packed_logprobs(model, rollout: Rollout, temperature: float, g: int, first_logits: bool):
    """`completion_logprobs` in one forward per group: [prompt | o_1 | … | o_G] (docstring there)."""
    ids, pmask = rollout.prompt_ids[::g], rollout.prompt_mask[::g]                  # [B, P]
    b, p = ids.shape
    n, t = rollout.completion_ids.shape
    dev = ids.device
    seq = torch.cat([ids, rollout.completion_ids.reshape(b, g * t)], dim=1)         # [B, L], L = P + G·T
    length = p + g * t
    ppos = (pmask.cumsum(1) - 1).clamp(min=0)                                       # [B, P]
    cpos = (pmask.sum(1, keepdim=True) + torch.arange(t, device=dev)[None]).repeat(1, g)   # [B, G·T]
    seg = torch.cat([torch.zeros(p, dtype=torch.long, device=dev),                  # [L] 0 = prompt, j = o_j
                     torch.arange(1, g + 1, device=dev).repeat_interleave(t)])
    pos_ = torch.arange(length, device=dev)
    block = (pos_[:, None] >= pos_[None, :]) & ((seg[:, None] == seg[None, :]) | (seg[None, :] == 0))  # [L, L]
    real = torch.cat([pmask.bool(), torch.ones(b, g * t, dtype=torch.bool, device=dev)], dim=1)         # [B, L]
    # a left-padding row of the prompt sees itself only (a row that sees nothing would be NaN)
    allow = (block[None] & real[:, None, :]) | torch.eye(length, dtype=torch.bool, device=dev)[None]
    # additive (0 / dtype min), the form both sdpa and eager attention add to their scores
    dtype = next(model.parameters()).dtype
    bias = torch.zeros(allow.shape, dtype=dtype, device=dev).masked_fill_(~allow, torch.finfo(dtype).min)
    lean = _lean_forward(model, training=True)     # the same ops as model(...) without its wrappers
    positions = torch.cat([ppos, cpos], 1)
    logits = (lean(seq, bias[:, None], positions, None) if lean is not None else
              model(input_ids=seq, attention_mask=bias[:, None], position_ids=positions).logits)
    # o_j's first token is read at the prompt's last position (repeated per rollout, the tensor
    # `first_logits` returns), its token k ≥ 1 at o_j's token k − 1
    first = logits[:, p - 1:p, :].repeat_interleave(g, dim=0)                                    # [N, 1, V]
    at = (p + torch.arange(g, device=dev)[:, None] * t + torch.arange(t - 1, device=dev)[None]).reshape(-1)
    z = torch.cat([first, logits[:, at, :].reshape(n, t - 1, -1)], dim=1).float() / temperature  # [N, T, V]
    logp = torch.log_softmax(z, dim=-1).gather(-1, rollout.completion_ids[..., None]).squeeze(-1)
    logp = logp * rollout.completion_mask
    return (logp, first) if first_logits else logp


def completion_logprobs_reference(model, rollout: Rollout, temperature: float = 1.0) -> torch.Tensor:
    """The plain path of `completion_logprobs`: one forward over [prompt | completion]."""
    ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], dim=1)          # [N, P+T]
    attn = torch.cat([rollout.prompt_mask, rollout.completion_mask.long()], dim=1)
    pos = (attn.cumsum(1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits   # [N, P+T, V]
    p, t = rollout.prompt_ids.shape[1], rollout.completion_ids.shape[1]
    logits = logits[:, p - 1:p + t - 1, :].float() / temperature                  # [N, T, V]
    logp = torch.log_softmax(logits, dim=-1).gather(-1, rollout.completion_ids[..., None]).squeeze(-1)
    return logp * rollout.completion_mask


def decode_completions(tokenizer, rollout: Rollout) -> list[str]:
    """Completion texts, special tokens (EOS, padding) removed.

    Each distinct token sequence is decoded once: the G rollouts of a group often repeat one
    another (short answers), and the tokenizer's per-row decode was ~6 % of a tiny-policy
    step. Decoding is a function of the ids, so the texts are those of decoding every row."""
    ids = (rollout.completion_ids * rollout.completion_mask.long()).tolist()
    lens = rollout.completion_mask.sum(1).long().tolist()
    rows = [tuple(row[:n]) for row, n in zip(ids, lens)]
    unique = list(dict.fromkeys(rows))                               # first-seen order
    texts = dict(zip(unique, tokenizer.batch_decode([list(r) for r in unique], skip_special_tokens=True)))
    return [texts[r] for r in rows]
