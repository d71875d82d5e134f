"""Rollouts for `rlpace select`: generated with a local HF causal LM, or read from a JSONL file.

Rollouts file (`--rollouts FILE.jsonl`), one JSON object per line, one line per prompt:

    {"index": 17, "completions": ["... <answer>4</answer>", "...", ...],
     "answers": ["4", ...],                 # optional: your own extracted answers
     "token_entropy": [0.71, 0.64, ...],    # optional: per completion, masked mean, nats
     "self_certainty": [3.2, 3.5, ...]}     # optional: per completion (Intuitor, see below)

`index` is the row's `extra_info.index`; every prompt of the input needs exactly one line.
The optional lists hold one number (or string) per completion.

Token statistics of a completion with logits z_t ∈ R^V at its response positions t
(temperature-scaled, z = logits / T, as verl-intuitor computes them; arXiv 2505.19590):
    token entropy   H_t  = logsumexp(z_t) − Σ_j softmax(z_t)_j z_tj
    self-certainty  SC_t = logsumexp(z_t) − mean_j(z_tj) − log V   ( = KL(U ‖ p_t) )
each averaged over the response tokens (masked mean: up to and including the first EOS).
"""

from __future__ import annotations

from ..errors import InputError
import json
import math
from pathlib import Path
from typing import Sequence

_OPTIONAL = ("answers", "token_entropy", "self_certainty")


def read_rollouts(path: str | Path, ids: Sequence) -> list[dict]:
    """The rollouts of each input row (in `ids` order) from a rollouts JSONL file.

    Raises ValueError (file, line and fix) on malformed lines, unknown or duplicated ids,
    prompts without a line, an empty completions list, or optional lists of the wrong
    length.
    """
    p = Path(path)
    if not p.is_file():
        raise InputError(f"rollouts {str(p)!r} is not a file; pass a JSONL file with one line per "
                         f"prompt (see `rlpace select --help`).")
    wanted = {_key(i): pos for pos, i in enumerate(ids)}
    out: list[dict | None] = [None] * len(ids)
    for lineno, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f"rollouts {str(p)!r} line {lineno}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"{where} is not valid JSON ({e.msg}); fix or remove that line.") from None
        if not isinstance(rec, dict) or "index" not in rec or "completions" not in rec:
            raise InputError(f"{where} needs an object with 'index' and 'completions'.")
        if not isinstance(rec["index"], (int, str)) or isinstance(rec["index"], bool):
            # a list or object id would reach a dict lookup as an unhashable key (TypeError)
            raise InputError(f"{where}: 'index' must be the row's extra_info.index, an integer or a "
                             f"string; got {type(rec['index']).__name__} {rec['index']!r}.")
        pos = wanted.get(_key(rec["index"]))
        if pos is None:
            raise InputError(f"{where}: index {rec['index']!r} is not an extra_info.index of the input; "
                             f"write rollouts for the input's prompts only.")
        if out[pos] is not None:
            raise InputError(f"{where}: index {rec['index']!r} appears twice; one line per prompt.")
        comps = rec["completions"]
        if not isinstance(comps, list) or not comps or not all(isinstance(c, str) for c in comps):
            raise InputError(f"{where}: 'completions' must be a non-empty list of strings.")
        grp = {"completions": comps}
        for key in _OPTIONAL:
            val = rec.get(key)
            if val is None:
                continue
            ok = isinstance(val, list) and len(val) == len(comps) and all(
                isinstance(v, str) if key == "answers" else
                (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)) for v in val)
            if not ok:
                kind = "strings" if key == "answers" else "finite numbers"
                raise InputError(f"{where}: {key!r} must be a list of {len(comps)} {kind} (one per "
                                 f"completion).")
            grp[key] = val
        out[pos] = grp
    missing = [ids[i] for i, g in enumerate(out) if g is None]
    if missing:
        raise InputError(f"rollouts {str(p)!r} have no line for {len(missing)} of {len(ids)} prompts "
                         f"(first ids {[_plain(m) for m in missing[:5]]}); write one line per prompt.")
    return out


def _key(x):
    """An id as a dict key: ints and integer strings differ (JSON keeps the type)."""
    x = _plain(x)
    return (type(x).__name__, x)


def _plain(x):
    return x.item() if hasattr(x, "item") else x


def prompt_texts(table, tokenizer) -> list[str]:
    """The text given to the model: the chat template over the verl `prompt` list when the
    tokenizer has one (with the generation prompt), else the user content (rlpace prepare's
    rule) or the string itself."""
    from rlpace.prepare._io import _message_text, column_values
    out = []
    for v in column_values(table, "prompt"):
        if getattr(tokenizer, "chat_template", None) and isinstance(v, list):
            msgs = [{"role": m.get("role", "user"), "content": m.get("content") or ""} for m in v]
            out.append(tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True))
        else:
            out.append(_message_text(v))
    return out


def generate_rollouts(table, model_path: str | Path, *, samples: int = 8, max_new_tokens: int = 512,
                      temperature: float = 1.0, top_p: float = 1.0, batch_size: int = 8, seed: int = 0,
                      device: str = "cpu", dtype: str = "float32", progress: bool = True) -> list[dict]:
    """G = `samples` sampled completions per prompt with their token statistics.

    Batches of `batch_size` prompts, each sampled G times (`num_return_sequences`), left
    padding; before batch b the torch seed is set to `seed + b`, so the same seed, batch
    size and machine give the same rollouts.

    Returns:
        one dict per row: completions (G strings), token_entropy, self_certainty (G floats).
    """
    import torch
    from tqdm.auto import tqdm

    from rlpace.prepare._models import load_causal_lm
    model, tok = load_causal_lm(str(model_path), device, dtype)
    texts = prompt_texts(table, tok)
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    out = []
    starts = range(0, len(texts), batch_size)
    for b, s in enumerate(tqdm(starts, desc="select: generate", unit="batch", disable=not progress)):
        torch.manual_seed(seed + b)
        enc = tok(texts[s:s + batch_size], return_tensors="pt", padding=True).to(device)
        with torch.no_grad():
            gen = model.generate(**enc, do_sample=True, temperature=temperature, top_p=top_p,
                                 top_k=0, max_new_tokens=max_new_tokens, num_return_sequences=samples,
                                 output_logits=True, return_dict_in_generate=True,
                                 pad_token_id=tok.pad_token_id)
        resp = gen.sequences[:, enc["input_ids"].shape[1]:]                     # [B·G, T]
        logits = torch.stack(gen.logits, dim=1).float() / temperature           # [B·G, T, V]
        ent, sc = token_stats(logits, response_mask(resp, tok.eos_token_id))
        decoded = tok.batch_decode(resp, skip_special_tokens=True)
        for i in range(len(texts[s:s + batch_size])):
            sl = slice(i * samples, (i + 1) * samples)
            out.append({"completions": decoded[sl], "token_entropy": ent[sl].tolist(),
                        "self_certainty": sc[sl].tolist()})
    return out


def response_mask(resp, eos_id):
    """bool[R, T]: response tokens up to and including the first EOS (generate pads after it)."""
    import torch
    if eos_id is None:
        return torch.ones_like(resp, dtype=torch.bool)
    is_eos = (resp == eos_id).long()
    before = torch.cumsum(is_eos, dim=1) - is_eos          # EOS tokens strictly before t
    return before == 0


def token_stats(logits, mask):
    """(mean token entropy, mean self-certainty) per row, float64[R] numpy, from
    logits [R, T, V] (already temperature-scaled) and mask bool[R, T]; rows with an empty
    mask give NaN. SC_t = logsumexp(z) − mean(z) − log V (Intuitor's KL(U ‖ p)); the
    per-token definitions are the trainer's and the engines' (`rlpace.train.rollout.token_statistics`)."""
    import numpy as np

    from rlpace.adapters._supervision import token_stats as sequence_means
    out = sequence_means(logits, mask, temperature=1.0)
    empty = (mask.sum(1) == 0).cpu().numpy()
    ent, sc = out["token_entropy"].astype(np.float64), out["self_certainty"].astype(np.float64)
    ent[empty] = np.nan
    sc[empty] = np.nan
    return ent, sc
