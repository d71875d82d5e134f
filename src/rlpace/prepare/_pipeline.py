"""`prepare`: read → check → embed → cluster → score → rank → write (ADS, arXiv 2606.22305)."""

from __future__ import annotations

from ..errors import InputError
import json
import time
import warnings
from pathlib import Path
from typing import NamedTuple, Sequence

import numpy as np

from . import _io
from ._cluster import check_k, check_method, cluster_embeddings, suggest_k
from ._difficulty import answer_nll, fill_infinite, rank_within_clusters
from ._embed import embed_texts, embedding_texts
from ._models import check_model
from ._summary import plot_summary, summarize

DEFAULT_K_CANDIDATES = (2, 4, 8, 16, 32, 64)
MAX_DEFAULT_K = 64      # ADS's k (its datasets hold 10^4-10^5 prompts)


def default_k(n: int) -> int:
    """The number of clusters when none is given: k = clamp(round(√(N/2)), 2, 64), at most N.

    The √(N/2) rule of thumb keeps ~√(2N) prompts per cluster, so ADS's per-cluster windows
    have room to move as N grows (200 rows → k = 10 of ~20 prompts; 2,000 → 32 of ~63); ADS's
    k = 64 is reached from N = 8,065 rows on. A fixed k = 64 on 200 rows would make clusters of
    1–8 prompts whose easy → hard ranks mean little.

    >>> [default_k(n) for n in (1, 5, 200, 2000, 8064, 8065, 10**6)]
    [1, 2, 10, 32, 63, 64, 64]
    """
    return int(min(n, max(2, min(MAX_DEFAULT_K, round((n / 2) ** 0.5)))))


class PrepareResult(NamedTuple):
    output: Path             # the annotated dataset
    embeddings_path: Path    # float32[N, D] .npy beside the output (+ .json metadata)
    summary_path: Path       # summary JSON
    plot_path: Path | None   # PNG, None when plot=False
    summary: dict            # what summary_path holds
    table: "object"          # pyarrow.Table that was written


def sidecar_paths(out: str | Path) -> dict[str, Path]:
    """Files written beside `out`: `<stem>.embeddings.npy`, `.embeddings.json`,
    `.summary.json`, `.summary.png` (stem = `out` without its .parquet/.jsonl suffix)."""
    p = Path(out)
    base = p.with_suffix("") if _io.output_format(p) != "hf" else p
    return {name: Path(f"{base}.{name}") for name in
            ("embeddings.npy", "embeddings.json", "summary.json", "summary.png")}


def prepare(input: str | Path, out: str | Path, *, k: int | str | None = None,
            k_candidates: Sequence[int] = DEFAULT_K_CANDIDATES, embed_model: str | Path | None = None,
            nll_model: str | Path | None = None, text_mode: str = "question",
            question_key: str = "prompt", answer_key: str = "reward_model.ground_truth",
            pca_dim: int | None = 128, cluster_method: str = "auto", seed: int = 42, n_init: int = 3,
            batch_size: int = 64, nll_batch_size: int = 8, max_length: int = 4096,
            device: str = "cpu", dtype: str = "float32", split: str | None = None,
            reuse_embeddings: str | Path | None = None, on_missing: str = "keep",
            plot: bool = True, progress: bool = True) -> PrepareResult:
    """Annotate a prompt dataset with semantic clusters and NLL difficulty (ADS, arXiv 2606.22305).

    Pipeline (ADS `scripts/build_ads_dataset.sh`, ADS's offline pipeline, docs/methods/ads.md):
      1. text of row i: its question, or "Question:\\n{q}\\n\\nAnswer:\\n{a}" when
         `text_mode="question_plus_cot"`;
      2. e_i = embedding (MiniLM by default; a causal LM's mean last hidden state, the ADS way);
      3. cluster_id = k-means(PCA(e / ‖e‖₂)) with a fixed seed;
      4. difficulty_i = mean NLL of answer tokens of "Question:\\n{q}\\n\\nAnswer:\\n{a}" under
         `nll_model`, +inf (empty answer) → max_finite + 1;
      5. rank_in_cluster = position in sort by (cluster_id, difficulty, row), 0 = easiest;
         cluster_size = rows in the cluster.

    Output: every input column and row in input order, plus `cluster_id`, `rank_in_cluster`,
    `cluster_size` (int64) and `difficulty` (float64), written both top-level and inside the
    `extra_info` struct (with `extra_info.index`, created as 0..N−1 when absent), so that
    `rlpace.Pool.from_parquet(out)` and the verl adapter read them. Beside it: the
    embeddings (`.embeddings.npy`, reusable via `reuse_embeddings`), `.summary.json` and
    `.summary.png` (see `sidecar_paths`). Format by suffix: .parquet, .jsonl, else a HF
    dataset directory.

    Missing data (reported as a warning and in the summary: count, first rows and ids; the
    rows are always kept): a missing answer scores +inf → max_finite + 1, i.e. hardest in
    its cluster (ADS), and is embedded from its question alone; a missing question is
    embedded and scored with an empty question. `on_missing="error"` refuses such input.

    Deviations from ADS: sentence-transformers MiniLM as the default embedder (ADS uses the
    policy); text mode "question" by default (ADS: question_plus_cot, which needs a full
    reference solution — verl's `reward_model.ground_truth` is often only the final
    answer); k-means with 3 restarts; batched NLL; rows not reordered; cluster ids
    renumbered by first appearance.

    Args:
        input: .parquet, .jsonl/.json, or a `save_to_disk` directory (verl schema).
        out: output path; its suffix picks the format.
        k: number of clusters (ADS: 64), "auto" for the silhouette pick over `k_candidates`,
            or None (default) for `default_k(N)` = clamp(round(√(N/2)), 2, 64).
        k_candidates: candidates for k="auto".
        embed_model: local sentence-transformers or causal-LM directory; None = MiniLM.
        nll_model: local causal-LM directory for difficulty; None = no difficulty (NaN,
            ranks follow row order, with a warning).
        text_mode: "question" | "question_plus_cot".
        question_key: column of the question: a verl chat list (user contents) or a string;
            dotted paths reach into structs.
        answer_key: column of the reference answer (e.g. "extra_info.answer", "solution").
        pca_dim: PCA dimensions before k-means (ADS: 128); None/0 = no PCA.
        cluster_method: "auto" | "kmeans" | "minibatch" | "faiss".
        seed: seed of PCA, k-means and silhouette sampling (ADS: 42).
        n_init: k-means restarts, lowest inertia kept (ADS: 1).
        batch_size: embedding batch; nll_batch_size: NLL batch.
        max_length: token cut for causal-LM embedding and NLL (ADS: 4096).
        device, dtype: torch device and causal-LM weight dtype.
        split: split of a saved DatasetDict.
        reuse_embeddings: a .npy written by an earlier run; skips embedding (its row count,
            and text fingerprint when its .json is beside it, must match).
        on_missing: "keep" (documented handling above) | "error".
        plot: write the PNG. progress: tqdm bars.

    Returns:
        PrepareResult(output, embeddings_path, summary_path, plot_path, summary, table).

    Example:
        >>> r = prepare("train.parquet", "train.ads.parquet", k=64,     # doctest: +SKIP
        ...             nll_model="models/Qwen2.5-Math-1.5B")
        >>> rlpace.Pool.from_parquet(r.output).n_clusters                # doctest: +SKIP
        64
    """
    t_start = time.perf_counter()
    # ---- checks, all before any embedding or scoring --------------------------------------
    if text_mode not in ("question", "question_plus_cot"):
        raise InputError(f"text_mode must be 'question' or 'question_plus_cot'; got {text_mode!r}.")
    if on_missing not in ("keep", "error"):
        raise InputError(f"on_missing must be 'keep' or 'error'; got {on_missing!r}.")
    check_method(cluster_method)
    for name, val in (("batch_size", batch_size), ("nll_batch_size", nll_batch_size), ("n_init", n_init),
                      ("max_length", max_length)):
        if int(val) < 1:
            raise InputError(f"{name} must be ≥ 1; got {val}.")
    if pca_dim is not None and int(pca_dim) < 0:
        raise InputError(f"pca_dim must be ≥ 0 (0 or None = no PCA); got {pca_dim}.")
    if dtype not in ("float32", "bfloat16", "float16"):
        raise InputError(f"dtype must be 'float32', 'bfloat16' or 'float16'; got {dtype!r}.")
    out = Path(out)
    if Path(input).resolve() == out.resolve():
        raise InputError(f"out {str(out)!r} is the input; write the annotated data to a new path.")
    side = sidecar_paths(out)

    table = _io.read_table(input, split=split)
    n = table.num_rows
    if n == 0:
        raise InputError(f"input {str(input)!r} has no rows; nothing to prepare.")
    _io.check_column(table, question_key, "question", "question_key (--question-key)")
    need_answer = nll_model is not None or text_mode == "question_plus_cot"
    if need_answer:
        _io.check_column(table, answer_key, "reference answer", "answer_key (--answer-key)")
    ids, index_created = _io.resolve_index(table)

    k_rule = None
    if k is None:
        k, k_rule = default_k(n), f"default: clamp(round(sqrt(N/2)), 2, {MAX_DEFAULT_K}) with N = {n}"
    if k == "auto":
        ks = [c for c in k_candidates if 2 <= int(c) <= n - 1]
        if not ks:
            raise InputError(f"k='auto' needs candidates in [2, N-1={n - 1}]; got {list(k_candidates)}.")
    else:
        k = check_k(k, n)
    reuse = Path(reuse_embeddings) if reuse_embeddings is not None else None
    if reuse is not None:
        if not reuse.is_file():
            raise InputError(f"reuse_embeddings {str(reuse)!r} is not a file; pass the "
                             f".embeddings.npy an earlier run wrote.")
        embed_desc = {"reused": str(reuse)}
    else:
        kind, path = check_model(embed_model, "embed_model", causal_only=False)
        embed_desc = {"kind": kind, "path": str(path)}
    if nll_model is not None:
        check_model(nll_model, "nll_model", causal_only=True)

    questions = _io.question_texts(table, question_key)
    answers = _io.answer_texts(table, answer_key) if need_answer else None
    missing = {"question": _io.first_rows(np.array([not q for q in questions]), ids)}
    if answers is not None:
        missing["answer"] = _io.first_rows(np.array([not a for a in answers]), ids)
    bad = {what: v for what, v in missing.items() if v["count"]}
    if bad:
        msg = "; ".join(f"{v['count']} rows have no {what} (first rows {v['rows']}, ids {v['ids']})"
                        for what, v in bad.items())
        if on_missing == "error":
            raise InputError(f"{msg}. Fill them, or pass on_missing='keep' (--on-missing keep): "
                             f"a missing answer then ranks hardest in its cluster (max NLL + 1).")
        warnings.warn(f"{msg}. Kept: a missing answer scores max_finite + 1 (hardest); a missing "
                      f"question is embedded and scored as empty text.", stacklevel=2)

    texts = embedding_texts(questions, answers, text_mode)
    fingerprint = _io.texts_fingerprint(texts)
    if reuse is not None:
        emb = np.load(reuse)
        if emb.ndim != 2 or emb.shape[0] != n:
            raise InputError(f"reuse_embeddings {str(reuse)!r} has shape {emb.shape} but the input "
                             f"has {n} rows; recompute (drop reuse_embeddings).")
        meta_path = Path(str(reuse)[:-4] + ".json") if str(reuse).endswith(".npy") else None
        if meta_path is not None and meta_path.is_file():
            try:
                meta = json.loads(meta_path.read_text())
            except json.JSONDecodeError as e:
                raise InputError(f"reuse_embeddings metadata {str(meta_path)!r} is not valid JSON ({e}); "
                                 f"recompute (drop reuse_embeddings) or restore the file.") from None
            if meta.get("texts_sha256") not in (None, fingerprint):
                raise InputError(f"reuse_embeddings {str(reuse)!r} was computed from different "
                                 f"texts (text_mode {meta.get('text_mode')!r}, other rows or keys); "
                                 f"recompute (drop reuse_embeddings) or use the matching file.")
            embed_desc.update({"from": meta})

    # ---- work ------------------------------------------------------------------------------
    timings = {}
    t0 = time.perf_counter()
    if reuse is None:
        emb = embed_texts(texts, embed_model, batch_size=batch_size, max_length=max_length,
                          device=device, dtype=dtype, progress=progress)
    timings["embed_s"] = time.perf_counter() - t0
    side["embeddings.npy"].parent.mkdir(parents=True, exist_ok=True)
    if reuse is None or reuse.resolve() != side["embeddings.npy"].resolve():
        np.save(side["embeddings.npy"], emb)
        side["embeddings.json"].write_text(json.dumps(
            {**embed_desc, "text_mode": text_mode, "n": int(emb.shape[0]), "dim": int(emb.shape[1]),
             "texts_sha256": fingerprint}, indent=1))

    t0 = time.perf_counter()
    k_report = None
    if k == "auto":
        k, scores = suggest_k(emb, k_candidates, pca_dim=pca_dim, method=cluster_method, seed=seed,
                              n_init=n_init, progress=progress)
        k_report = {"candidates": sorted(scores), "silhouette": {str(c): s for c, s in scores.items()},
                    "chosen": k}
    clusters = cluster_embeddings(emb, k, pca_dim=pca_dim, method=cluster_method, seed=seed,
                                  n_init=n_init)
    timings["cluster_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    fill = None
    if nll_model is not None:
        raw = answer_nll(questions, answers, nll_model, batch_size=nll_batch_size,
                         max_length=max_length, device=device, dtype=dtype, progress=progress)
        difficulty, fill = fill_infinite(raw)
        n_inf = int(np.isinf(raw).sum())
        if np.isnan(raw).any():
            bad_rows = _io.first_rows(np.isnan(raw), ids)
            warnings.warn(f"answer NLL is NaN in {bad_rows['count']} rows (first rows "
                          f"{bad_rows['rows']}); they rank last in their cluster. Score in float32 "
                          f"(--dtype float32) if float16 overflowed.", stacklevel=2)
    else:
        warnings.warn("no nll_model: difficulty is NaN and rank_in_cluster follows row order. "
                      "Pass nll_model (--nll-model) to rank easy → hard.", stacklevel=2)
        difficulty, n_inf = np.full(n, np.nan), 0
    timings["nll_s"] = time.perf_counter() - t0

    rank, size = rank_within_clusters(clusters.labels, difficulty)
    annotated = _io.annotate(table, {"cluster_id": clusters.labels, "rank_in_cluster": rank,
                                     "cluster_size": size, "difficulty": difficulty},
                             ids if index_created else None)
    _io.write_table(annotated, out)

    summary = summarize(clusters.labels, difficulty if nll_model is not None else None)
    summary.update({
        "k": int(k), "k_rule": k_rule, "k_suggestion": k_report, "pca_dim": clusters.pca_dim,
        "cluster_method": clusters.method, "inertia": clusters.inertia,
        "difficulty_infinite": {"count": n_inf, "filled_with": fill},
        "missing": missing, "index_created": index_created,
        "config": {"input": str(input), "out": str(out), "embed": embed_desc,
                   "nll_model": None if nll_model is None else str(nll_model), "text_mode": text_mode,
                   "question_key": question_key, "answer_key": answer_key if need_answer else None,
                   "seed": seed, "n_init": n_init, "batch_size": batch_size, "nll_batch_size": nll_batch_size,
                   "max_length": max_length, "device": device, "dtype": dtype, "split": split,
                   "on_missing": on_missing},
        "versions": _versions(),
        "timings_s": {**timings, "total_s": time.perf_counter() - t_start},
    })
    side["summary.json"].write_text(json.dumps(summary, indent=1))
    plot_path = None
    if plot:
        import matplotlib.pyplot as plt
        fig, _ = plot_summary(summary)
        fig.savefig(side["summary.png"], dpi=100)
        plt.close(fig)
        plot_path = side["summary.png"]
    return PrepareResult(out, side["embeddings.npy"], side["summary.json"], plot_path, summary, annotated)


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version
    out = {}
    for pkg in ("rlpace", "torch", "transformers", "sentence-transformers", "scikit-learn",
                "faiss-cpu", "pyarrow"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out
