"""Held-out evaluation reuses a process's greedy completions of the same weights (the step-0
evaluation every policy of a (suite, seed) shares in a `rlpace compare` worker) and its
encoded prompts, and gives the numbers of the plain encode → generate → score loop."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import rlpace.train.evaluate as ev  # noqa: E402
from rlpace.tasks import make_taskset  # noqa: E402
from rlpace.train.model import tiny_causal_lm, train_char_tokenizer  # noqa: E402
from rlpace.train.rollout import decode_completions, encode_prompts, generate  # noqa: E402


def _setup(seed=0):
    ts = make_taskset("embedded:add1,rev3", train_per_domain=4, heldout_per_domain=6, seed=seed)
    tok = train_char_tokenizer([it.prompt + it.answer for it in ts.train + ts.heldout] + ["0123456789"])
    model = tiny_causal_lm(len(tok), hidden=16, layers=1, heads=2, seed=seed)
    return ts, tok, model


def _reference(model, tok, ts, max_new_tokens, batch):
    """The plain loop: encode, greedy generate, decode, score, mean per domain."""
    items = list(ts.heldout)
    prompts = encode_prompts(tok, [it.prompt for it in items], False)
    scores = []
    for s in range(0, len(items), batch):
        with torch.no_grad():
            ro = generate(model, prompts[s:s + batch], max_new_tokens=max_new_tokens, greedy=True,
                          eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
        scores += list(ts.score(items[s:s + batch], decode_completions(tok, ro)))
    scores = np.array(scores)
    out = {d: float(np.mean([x for x, it in zip(scores, items) if it.domain == d])) for d in ts.domains}
    out["mean"] = float(np.mean([out[d] for d in ts.domains]))
    return out


def test_same_weights_decode_once_and_a_changed_weight_decodes_again(monkeypatch):
    ts, tok, model = _setup()
    calls = []
    real = ev.generate
    monkeypatch.setattr(ev, "generate", lambda *a, **k: calls.append(len(a[1])) or real(*a, **k))
    ev._COMPLETIONS.clear()
    first = ev.heldout_accuracy(model, tok, ts, max_new_tokens=4, batch=5)
    assert calls == [5, 5, 2]                                     # 12 held-out prompts in batches of 5
    want = _reference(model, tok, ts, 4, 5)
    assert first == want
    (texts,) = ev._COMPLETIONS.values()                           # what was decoded: the loop's texts
    prompts = encode_prompts(tok, [it.prompt for it in ts.heldout], False)
    with torch.no_grad():
        ro = real(model, prompts, max_new_tokens=4, greedy=True, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    assert texts == decode_completions(tok, ro) and len(texts) == 12 and any(texts)
    again = ev.heldout_accuracy(model, tok, ts, max_new_tokens=4, batch=5)
    assert again == first and calls == [5, 5, 2]                  # same weights: no decoding
    # a second copy of the same base (another run of the same seed) reuses it too
    _, tok2, model2 = _setup()
    assert ev.heldout_accuracy(model2, tok2, ts, max_new_tokens=4, batch=5) == first
    assert calls == [5, 5, 2]
    # other settings, or any changed weight: decoded again
    ev.heldout_accuracy(model, tok, ts, max_new_tokens=3, batch=5)
    assert calls == [5, 5, 2] * 2
    with torch.no_grad():
        model.model.norm.weight[0] += 1e-6
    after = ev.heldout_accuracy(model, tok, ts, max_new_tokens=4, batch=5)
    assert calls == [5, 5, 2] * 3
    assert after == _reference(model, tok, ts, 4, 5)


def test_a_model_too_large_to_hash_is_not_memoised(monkeypatch):
    ts, tok, model = _setup(1)
    monkeypatch.setattr(ev, "_MEMO_MAX_PARAMS", 10)
    calls = []
    real = ev.generate
    monkeypatch.setattr(ev, "generate", lambda *a, **k: calls.append(1) or real(*a, **k))
    a = ev.heldout_accuracy(model, tok, ts, max_new_tokens=4)
    b = ev.heldout_accuracy(model, tok, ts, max_new_tokens=4)
    assert a == b == _reference(model, tok, ts, 4, 512) and calls == [1, 1]
