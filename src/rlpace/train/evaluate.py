"""Held-out evaluation: greedy accuracy per distribution."""

from __future__ import annotations

import numpy as np
import torch

from .rollout import decode_completions, encode_prompts, generate

__all__ = ["heldout_accuracy"]


@torch.no_grad()
def heldout_accuracy(model, tokenizer, taskset, *, max_new_tokens: int, chat: bool = False,
                     batch: int = 512) -> dict[str, float]:
    """domain -> greedy accuracy on its held-out items (NaN for a domain without any),
    plus "mean": the unweighted mean over domains that have items (DUMP reports the
    average over distributions, not over items)."""
    items = list(taskset.heldout)
    scores = np.zeros(len(items), dtype=np.float32)
    prompts = encode_prompts(tokenizer, [it.prompt for it in items], chat)
    was_training = model.training
    model.eval()
    for s in range(0, len(items), batch):
        ro = generate(model, prompts[s:s + batch], max_new_tokens=max_new_tokens, greedy=True,
                      eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id)
        scores[s:s + batch] = taskset.score(items[s:s + batch], decode_completions(tokenizer, ro))
    model.train(was_training)
    out = {}
    for d in taskset.domains:
        m = np.array([it.domain == d for it in items], dtype=bool)
        out[d] = float(scores[m].mean()) if m.any() else float("nan")
    vals = [v for v in out.values() if np.isfinite(v)]
    out["mean"] = float(np.mean(vals)) if vals else float("nan")
    return out
