"""Held-out evaluation reuses a process's greedy completions of the same weights (the step-0
evaluation every policy of a (suite, seed) shares in a `rlpace compare` worker) where its
caller passes a `GreedyMemo`, and its encoded prompts, and gives the numbers of the plain
encode → generate → score loop. A plain `rlpace train` never hashes the weights; the compare
runner's runs of one base decode its step-0 evaluation once."""

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
    memo = ev.GreedyMemo()
    first = ev.heldout_accuracy(model, tok, ts, max_new_tokens=4, batch=5, memo=memo)
    assert calls == [5, 5, 2]                                     # 12 held-out prompts in batches of 5
    want = _reference(model, tok, ts, 4, 5)
    assert first == want
    (texts,) = memo._entries.values()                             # what was decoded: the loop's texts
    prompts = encode_prompts(tok, [it.prompt for it in ts.heldout], False)
    with torch.no_grad():
        ro = real(model, prompts, max_new_tokens=4, greedy=True, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    assert texts == decode_completions(tok, ro) and len(texts) == 12 and any(texts)
    again = ev.heldout_accuracy(model, tok, ts, max_new_tokens=4, batch=5, memo=memo)
    assert again == first and calls == [5, 5, 2]                  # same weights: no decoding
    # a second copy of the same base (another run of the same seed) reuses it too
    _, tok2, model2 = _setup()
    assert ev.heldout_accuracy(model2, tok2, ts, max_new_tokens=4, batch=5, memo=memo) == first
    assert calls == [5, 5, 2]
    # other settings, or any changed weight: decoded again
    ev.heldout_accuracy(model, tok, ts, max_new_tokens=3, batch=5, memo=memo)
    assert calls == [5, 5, 2] * 2
    with torch.no_grad():
        model.model.norm.weight[0] += 1e-6
    after = ev.heldout_accuracy(model, tok, ts, max_new_tokens=4, batch=5, memo=memo)
    assert calls == [5, 5, 2] * 3
    assert after == _reference(model, tok, ts, 4, 5)


def test_a_model_too_large_to_hash_is_not_memoised(monkeypatch):
    ts, tok, model = _setup(1)
    memo = ev.GreedyMemo(max_params=10)
    calls = []
    real = ev.generate
    monkeypatch.setattr(ev, "generate", lambda *a, **k: calls.append(1) or real(*a, **k))
    a = ev.heldout_accuracy(model, tok, ts, max_new_tokens=4, memo=memo)
    b = ev.heldout_accuracy(model, tok, ts, max_new_tokens=4, memo=memo)
    assert a == b == _reference(model, tok, ts, 4, 512) and calls == [1, 1] and len(memo) == 0


class _Sha256Spy:
    """Stands in for `hashlib` in the evaluation module: counts the weight digests taken."""

    def __init__(self):
        import hashlib
        self.calls, self._real = 0, hashlib

    def sha256(self, *a):
        self.calls += 1
        return self._real.sha256(*a)


def test_a_plain_train_run_never_hashes_the_weights(tmp_path, cache, monkeypatch):
    from _tiny_train import log_without_timing, tiny_config
    from rlpace.train import train
    spy = _Sha256Spy()
    monkeypatch.setattr(ev, "hashlib", spy)
    plain = tiny_config(tmp_path / "plain", cache, steps=2)
    train(plain)                                                  # evaluations at steps 0 and 2
    assert spy.calls == 0
    memo = ev.GreedyMemo()
    shared = tiny_config(tmp_path / "shared", cache, steps=2)
    train(shared, eval_memo=memo)                                 # the runner's way: one digest per evaluation
    assert spy.calls == 2 and len(memo) == 2
    assert log_without_timing(plain.out) == log_without_timing(shared.out)


def test_the_compare_runner_shares_the_step0_evaluation_of_one_base(tmp_path, cache, monkeypatch):
    from _tiny_train import TINY
    from rlpace.experiments import Grid, read_records, run_grid
    from rlpace.experiments import _backends
    _backends._worker_eval_memo.cache_clear()                     # a fresh worker
    calls = []
    real = ev.generate
    monkeypatch.setattr(ev, "generate", lambda *a, **k: calls.append(len(a[1])) or real(*a, **k))
    opts = {k: v for k, v in TINY.items() if k not in ("tasks", "steps", "progress", "checkpoint_every")}
    grid = Grid(policies=("uniform", "dump"), seeds=1, suites=TINY["tasks"], steps=2,
                options={**opts, "cache_dir": cache})
    res = run_grid(grid, tmp_path / "out", workers=1, progress=False)
    assert res.complete and len(res.ran) == 2, res.failed
    recs = list(read_records(tmp_path / "out" / "runs"))
    assert [r["evals"]["step"] for r in recs] == [[0, 2], [0, 2]]
    assert all(sum(r["steps"]["groups_trained"]) > 0 for r in recs)      # trained: new weights at step 2
    # the first run decodes its 16 held-out prompts at steps 0 and 2, the second (same base) at step 2 only
    assert calls == [16, 16, 16] and len(_backends._worker_eval_memo()) == 3
