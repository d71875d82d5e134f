"""Held-out evaluation: greedy accuracy per distribution.

Two memos keep work from being repeated without changing any result:

* the held-out prompts' token ids, per tokenizer: encoded once, not at every evaluation;
* `GreedyMemo`, only where the caller passes one (the `rlpace compare` runner does; a plain
  `rlpace train` does not): the greedy completions of a small model (≤ `max_params`
  parameters) keyed by a digest of its exact weights, config and the prompts. Every policy of
  a (suite, seed) starts from the same base policy, so in a compare worker their step-0
  evaluations are one greedy decoding. Greedy decoding is a function of the weights and the
  prompts; the digest changes with any weight (it is taken at every call), so a trained model
  never hits an older entry. A single run meets the same weights again only where no update
  happened between two evaluations, too seldom to pay for a hash at every evaluation.
"""

from __future__ import annotations

import hashlib
import weakref
from collections import OrderedDict

import numpy as np
import torch

from .rollout import decode_completions, encode_prompts, generate

__all__ = ["GreedyMemo", "heldout_accuracy"]

_ENCODED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # tokenizer -> {(chat, prompts): ids}


class GreedyMemo:
    """Greedy held-out completions by a sha256 of the model's class, config, every parameter
    and buffer, the prompts and the decoding settings; the `size` most recently used kept.

    Args:
        size: entries kept (a compare worker's (suite, seed) bases; each a few hundred strings).
        max_params: larger models (a real LLM) are never hashed: hashing at every call would
            cost seconds.
    """

    def __init__(self, size: int = 64, max_params: int = 10_000_000):
        self.size, self.max_params = size, max_params
        self._entries: OrderedDict = OrderedDict()      # digest -> list[str], least recently used first

    def __len__(self) -> int:
        return len(self._entries)

    def key(self, model, prompts: tuple, settings: tuple) -> str | None:
        """The digest of (model, prompts, settings); None for a model too large to hash."""
        if sum(p.numel() for p in model.parameters()) > self.max_params:
            return None
        h = hashlib.sha256(repr((type(model).__name__, settings, torch.get_num_threads())).encode())
        cfg = getattr(model, "config", None)
        h.update((cfg.to_json_string() if hasattr(cfg, "to_json_string") else repr(cfg)).encode())
        for name, t in model.state_dict().items():
            t = t.detach()
            h.update(f"{name}{t.dtype}{tuple(t.shape)}{t.device}".encode())
            h.update(t.cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        h.update("\x00".join(prompts).encode())
        return h.hexdigest()

    def get(self, key: str | None) -> list | None:
        """The completions stored under `key` (now the most recently used), or None."""
        if key is None or key not in self._entries:
            return None
        self._entries.move_to_end(key)
        return self._entries[key]

    def put(self, key: str | None, completions: list) -> None:
        """Store `completions` under `key` (a None key: nothing), dropping the least recently used."""
        if key is None:
            return
        self._entries[key] = completions
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)


def _encoded(tokenizer, prompts: tuple, chat: bool) -> list:
    """Token ids of `prompts` (`encode_prompts`), once per tokenizer and prompt list."""
    try:
        per_tok = _ENCODED.setdefault(tokenizer, {})
    except TypeError:                                # a tokenizer that takes no weak reference
        return encode_prompts(tokenizer, list(prompts), chat)
    key = (chat, prompts)
    if key not in per_tok:
        per_tok.clear()                              # one held-out set per tokenizer at a time
        per_tok[key] = encode_prompts(tokenizer, list(prompts), chat)
    return per_tok[key]


@torch.no_grad()
def heldout_accuracy(model, tokenizer, taskset, *, max_new_tokens: int, chat: bool = False,
                     batch: int = 512, memo: GreedyMemo | None = None) -> dict[str, float]:
    """domain -> greedy accuracy on its held-out items (NaN for a domain without any),
    plus "mean": the unweighted mean over domains that have items (DUMP reports the
    average over distributions, not over items). With `memo`, the greedy completions of
    weights it has seen are reused instead of decoded again (same numbers)."""
    items = list(taskset.heldout)
    texts = tuple(it.prompt for it in items)
    key = (memo.key(model, texts, (max_new_tokens, chat, batch, tokenizer.eos_token_id, tokenizer.pad_token_id))
           if memo is not None else None)
    completions = memo.get(key) if key is not None else None
    if completions is None:
        prompts = _encoded(tokenizer, texts, chat)
        was_training = model.training
        model.eval()
        completions = []
        for s in range(0, len(items), batch):
            ro = generate(model, prompts[s:s + batch], max_new_tokens=max_new_tokens, greedy=True,
                          eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id)
            completions += decode_completions(tokenizer, ro)
        model.train(was_training)
        if key is not None:
            memo.put(key, completions)
    scores = np.zeros(len(items), dtype=np.float32)
    for s in range(0, len(items), batch):
        scores[s:s + batch] = taskset.score(items[s:s + batch], completions[s:s + batch])
    out = {}
    for d in taskset.domains:
        m = np.array([it.domain == d for it in items], dtype=bool)
        out[d] = float(scores[m].mean()) if m.any() else float("nan")
    vals = [v for v in out.values() if np.isfinite(v)]
    out["mean"] = float(np.mean(vals)) if vals else float("nan")
    return out
