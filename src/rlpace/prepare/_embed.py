"""Text embeddings for semantic clustering (ADS, arXiv 2606.22305, docs/methods/ads.md, "Offline pipeline", step 1)."""

from __future__ import annotations

from ..errors import InputError
from pathlib import Path
from typing import Sequence

import numpy as np

from ._models import CAUSAL_LM, check_model, load_causal_lm, load_sentence_transformer

QA_TEMPLATE = "Question:\n{q}\n\nAnswer:\n{a}"


def embedding_texts(questions: Sequence[str], answers: Sequence[str] | None,
                    text_mode: str) -> list[str]:
    """The text each row is embedded from.

    "question": the question alone. "question_plus_cot": ADS's `question_plus_cot`,
    `"Question:\\n{q}\\n\\nAnswer:\\n{a}"` (ADS `src/data_utils.py::build_input_text`); a row
    whose answer is missing is embedded from its question alone.

    Example:
        >>> embedding_texts(["2+2?"], ["4"], "question_plus_cot")
        ['Question:\\n2+2?\\n\\nAnswer:\\n4']
    """
    if text_mode == "question":
        return list(questions)
    if text_mode == "question_plus_cot":
        if answers is None:
            raise InputError("text_mode='question_plus_cot' needs the reference answers.")
        return [QA_TEMPLATE.format(q=q, a=a) if a else q for q, a in zip(questions, answers)]
    raise InputError(f"text_mode must be 'question' or 'question_plus_cot'; got {text_mode!r}.")


def embed_texts(texts: Sequence[str], model: str | Path | None = None, *, batch_size: int = 64,
                max_length: int = 4096, device: str = "cpu", dtype: str = "float32",
                progress: bool = True) -> np.ndarray:
    """Embed texts with a sentence-transformers model or a causal LM's mean hidden state.

    * sentence-transformers (default: the packaged all-MiniLM-L6-v2, 384 dims, texts cut at
      its 256-token `max_seq_length`): `model.encode`, un-normalised.
    * a local causal LM (ADS's way, `src/extract_embeddings.py` with `pooling=mean`):
          e(x) = Σ_t m_t · h_L,t / max(1, Σ_t m_t)
      the attention-mask-weighted mean of the last hidden state h_L over the tokens of x
      (tokenizer special tokens included, right-truncated at `max_length`). Rows are
      batched longest first so that padding stays small; the order of the output is the
      order of `texts`.

    L2 normalisation is left to `cluster_embeddings`, as in ADS.

    Args:
        texts: N strings.
        model: local model directory, or None for the packaged MiniLM.
        batch_size: texts per forward pass.
        max_length: token cut for the causal LM (ADS: 4096).
        device: torch device ("cpu", "cuda").
        dtype: causal-LM weights dtype ("float32", "bfloat16", "float16").
        progress: show a tqdm bar.

    Returns:
        float32[N, D] embeddings.

    Example:
        >>> e = embed_texts(["What is 2+2?", "Name a red fruit."], progress=False)  # doctest: +SKIP
        >>> e.shape                                                               # doctest: +SKIP
        (2, 384)
    """
    if batch_size < 1:
        raise InputError(f"batch_size must be ≥ 1; got {batch_size}.")
    kind, path = check_model(model, "embed_model", causal_only=False)
    if len(texts) == 0:
        raise InputError("no texts to embed; the input has no rows.")
    if kind == CAUSAL_LM:
        return _embed_causal(list(texts), str(path), batch_size, max_length, device, dtype, progress)
    st = load_sentence_transformer(str(path), device)
    out = st.encode(list(texts), batch_size=batch_size, show_progress_bar=progress,
                    convert_to_numpy=True, normalize_embeddings=False)
    return np.ascontiguousarray(out, dtype=np.float32)


def _embed_causal(texts, path, batch_size, max_length, device, dtype, progress) -> np.ndarray:
    import torch
    from tqdm.auto import tqdm

    model, tok = load_causal_lm(path, device, dtype)
    ids = tok(texts, add_special_tokens=True, truncation=True, max_length=max_length)["input_ids"]
    lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
    order = np.argsort(-lengths, kind="stable")
    base = model.base_model if model.base_model is not model else None
    dim = model.config.get_text_config().hidden_size
    out = np.zeros((len(texts), dim), dtype=np.float32)
    bar = tqdm(total=len(texts), desc="embed (causal LM)", unit="text", disable=not progress)
    with torch.inference_mode():
        for s in range(0, len(texts), batch_size):
            rows = order[s:s + batch_size]
            width = max(1, int(lengths[rows].max()))
            # Own right-padding: no pad token needed, real tokens keep positions 0..len-1.
            input_ids = torch.zeros((len(rows), width), dtype=torch.long)
            mask = torch.zeros((len(rows), width), dtype=torch.long)
            for j, r in enumerate(rows):
                input_ids[j, :lengths[r]] = torch.tensor(ids[r], dtype=torch.long)
                mask[j, :lengths[r]] = 1
            input_ids, mask = input_ids.to(device), mask.to(device)
            if base is not None:
                hidden = base(input_ids=input_ids, attention_mask=mask, use_cache=False).last_hidden_state
            else:  # pragma: no cover - models without a separate base model
                hidden = model(input_ids=input_ids, attention_mask=mask, use_cache=False,
                               output_hidden_states=True).hidden_states[-1]
            m = mask.unsqueeze(-1).to(hidden.dtype)                      # [B, L, 1]
            pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1.0)       # [B, H]
            out[rows] = pooled.float().cpu().numpy()
            bar.update(len(rows))
    bar.close()
    return out
