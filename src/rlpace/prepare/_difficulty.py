"""Offline difficulty: mean token NLL of the reference answer, and easy → hard ranks
inside each cluster (ADS, arXiv 2606.22305, docs/methods/ads.md, "Offline pipeline", steps 3–4; ADS
`src/compute_difficulty.py` and `src/sort_clusters_by_difficulty.py`)."""

from __future__ import annotations

from ..errors import InputError
import inspect
from pathlib import Path
from typing import Sequence

import numpy as np

from ._models import check_model, load_causal_lm

PROMPT_TEMPLATE = "Question:\n{q}\n\nAnswer:\n"


def answer_nll(questions: Sequence[str], answers: Sequence[str], model: str | Path, *,
               batch_size: int = 8, max_length: int = 4096, device: str = "cpu",
               dtype: str = "float32", progress: bool = True) -> np.ndarray:
    """Mean token NLL of each reference answer under a causal LM, teacher forced.

    With p = "Question:\\n{q}\\n\\nAnswer:\\n" (no system prompt, no chat template) and
    x = tokens(p + a) right-truncated to `max_length`, P = |tokens(p)|, T = |x| − P:

        d = (1/T) Σ_{t=P}^{P+T−1} −log softmax(f(x_{<t}))[x_t]

    the loss over the answer tokens only. Both strings are tokenised without special
    tokens, and the answer span is "what the full text has past the prompt's token count",
    exactly as ADS's `_compute_sample_nll`. An empty answer, or one truncated away (T ≤ 0),
    scores +inf; `fill_infinite` then maps inf to max_finite + 1 as ADS does.

    Batching (ADS scores one sample per forward): rows are sorted longest first and
    right-padded, and only the logits from the earliest answer position on are computed
    (`logits_to_keep`), so a batch costs B × span × vocab floats.

    Args:
        questions, answers: N strings each (answers already stripped; "" = missing).
        model: local causal-LM directory (the base policy, in ADS).
        batch_size: sequences per forward pass.
        max_length: token cut (ADS script: 4096).
        device, dtype: torch device and weight dtype ("float32", "bfloat16", "float16").
        progress: show a tqdm bar.

    Returns:
        float64[N] difficulty, +inf where the answer is empty.

    Example:
        >>> answer_nll(["2+2?"], ["4"], "path/to/causal-lm", progress=False)  # doctest: +SKIP
        array([3.91...])
    """
    import torch
    from tqdm.auto import tqdm

    if len(questions) != len(answers):
        raise InputError(f"questions ({len(questions)}) and answers ({len(answers)}) differ in "
                         f"length; give one answer per question.")
    if batch_size < 1:
        raise InputError(f"batch_size must be ≥ 1; got {batch_size}.")
    _, path = check_model(model, "nll_model", causal_only=True)
    lm, tok = load_causal_lm(str(path), device, dtype)
    n = len(questions)
    out = np.full(n, np.inf, dtype=np.float64)
    live = [i for i in range(n) if answers[i]]
    if not live:
        return out
    prompts = [PROMPT_TEMPLATE.format(q=questions[i]) for i in live]
    fulls = [p + answers[i] for p, i in zip(prompts, live)]
    p_len = np.array([len(x) for x in tok(prompts, add_special_tokens=False)["input_ids"]])
    full_ids = [x[:max_length] for x in tok(fulls, add_special_tokens=False)["input_ids"]]
    f_len = np.array([len(x) for x in full_ids])
    if (p_len < 1).any():
        raise InputError("the tokenizer gives an empty prompt for 'Question:\\n...'; the answer's "
                         "first token would have no context. Use a different tokenizer.")
    scored = np.flatnonzero(f_len > p_len)            # T ≤ 0 stays +inf, as in ADS
    order = scored[np.argsort(-f_len[scored], kind="stable")]
    keep_arg = "logits_to_keep" in inspect.signature(lm.forward).parameters
    bar = tqdm(total=len(live), desc="answer NLL", unit="row", disable=not progress)
    bar.update(len(live) - len(order))
    with torch.inference_mode():
        for s in range(0, len(order), batch_size):
            rows = order[s:s + batch_size]
            width = int(f_len[rows].max())
            ids = torch.zeros((len(rows), width), dtype=torch.long)
            mask = torch.zeros((len(rows), width), dtype=torch.long)
            for j, r in enumerate(rows):
                ids[j, :f_len[r]] = torch.tensor(full_ids[r], dtype=torch.long)
                mask[j, :f_len[r]] = 1
            # logits at position t predict token t+1: answer tokens t ∈ [P, L) need
            # logits at [P−1, L−1); keep the span [min P − 1, width − 1) for the batch.
            start = int(p_len[rows].min()) - 1
            pos = torch.arange(start, width - 1)                       # [S]
            kwargs = {"logits_to_keep": pos.to(device)} if keep_arg else {}
            logits = lm(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False,
                        **kwargs).logits
            if not keep_arg:  # pragma: no cover - models without logits_to_keep
                logits = logits[:, start:width - 1]
            logp = torch.log_softmax(logits.float(), dim=-1)            # [B, S, V]
            target = ids[:, start + 1:width].to(device)                 # [B, S]
            tok_nll = -logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)
            p = torch.as_tensor(p_len[rows]).unsqueeze(1).to(device)    # [B, 1]
            L = torch.as_tensor(f_len[rows]).unsqueeze(1).to(device)
            t = pos.to(device).unsqueeze(0) + 1                         # target token position
            on = (t >= p) & (t < L)                                     # [B, S] answer tokens
            mean = (tok_nll * on).sum(1) / on.sum(1)
            out[np.asarray(live)[rows]] = mean.double().cpu().numpy()
            bar.update(len(rows))
    bar.close()
    return out


def fill_infinite(difficulty: np.ndarray) -> tuple[np.ndarray, float | None]:
    """Replace +inf (empty answers) by max_finite + 1, as ADS does before sorting.

    When no score is finite the fill is 1.0 (max_finite taken as 0). NaN is left as NaN.

    Returns:
        (float64[N] scores, the fill value or None when nothing was replaced).

    Example:
        >>> fill_infinite(np.array([0.5, np.inf, 2.0]))[0].tolist()
        [0.5, 3.0, 2.0]
    """
    d = np.array(difficulty, dtype=np.float64)
    inf = np.isinf(d)
    if not inf.any():
        return d, None
    finite = d[np.isfinite(d)]
    fill = float(finite.max()) + 1.0 if finite.size else 1.0
    d[inf] = fill
    return d, fill


def rank_within_clusters(cluster_ids: np.ndarray, difficulty: np.ndarray | None = None
                         ) -> tuple[np.ndarray, np.ndarray]:
    """Rank each row inside its cluster easy → hard, and give each row its cluster's size.

    Rows are sorted by (cluster_id, difficulty, row position) ascending, as ADS's
    `sort_clusters_by_difficulty.py` (ties by position make the order deterministic); NaN
    difficulty sorts last, and without difficulty the rank is the row order. Unlike ADS the
    rows are not reordered: `rank_in_cluster` carries the order.

    Returns:
        (rank int64[N] with 0 = easiest, cluster_size int64[N]).

    Example:
        >>> r, s = rank_within_clusters(np.array([1, 0, 1, 1]), np.array([0.9, 0.1, 0.2, 0.5]))
        >>> r.tolist(), s.tolist()
        ([2, 0, 0, 1], [3, 1, 3, 3])
    """
    c = np.asarray(cluster_ids, dtype=np.int64)
    n = c.shape[0]
    if difficulty is None:
        key = np.zeros(n)
    else:
        key = np.asarray(difficulty, dtype=np.float64)
        if key.shape != c.shape:
            raise InputError(f"difficulty has shape {key.shape} but cluster_ids has {c.shape}; "
                             f"give one score per row.")
        key = np.where(np.isnan(key), np.inf, key)
    order = np.lexsort((np.arange(n), key, c))
    sorted_c = c[order]
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_c)) + 1]
    group_start = np.repeat(starts, np.diff(np.r_[starts, n]))
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n) - group_start
    uniq, inv, counts = np.unique(c, return_inverse=True, return_counts=True)
    return rank, counts[inv].astype(np.int64)
