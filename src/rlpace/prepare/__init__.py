"""Offline preparation of a prompt dataset: semantic clusters and NLL difficulty.

ADS (arXiv 2606.22305; docs/methods/ads.md, "Offline pipeline") in pieces that also work alone:

    texts = embedding_texts(question_texts(t), answer_texts(t), "question")
    emb = embed_texts(texts)                              # MiniLM, or a causal LM's mean hidden state
    k, scores = suggest_k(emb, [8, 16, 32, 64])           # optional: silhouette over k
    clusters = cluster_embeddings(emb, k, pca_dim=128)    # L2 → PCA → k-means
    d, _ = fill_infinite(answer_nll(qs, answers, "path/to/causal-lm"))
    rank, size = rank_within_clusters(clusters.labels, d)

and all of it as `prepare(input, out, ...)` (CLI: `rlpace prepare INPUT --out OUTPUT`).
Heavy libraries (torch, transformers, sklearn) are imported only when a step runs.
"""

from ._cluster import Clusters, cluster_embeddings, l2_normalize, project_embeddings, suggest_k
from ._difficulty import answer_nll, fill_infinite, rank_within_clusters
from ._embed import embed_texts, embedding_texts
from ._io import answer_texts, question_texts, read_table, write_table
from ._models import check_model, default_embed_model_path
from ._pipeline import PrepareResult, default_k, prepare, sidecar_paths
from ._summary import plot_summary, summarize

__all__ = [
    "prepare", "PrepareResult", "sidecar_paths", "default_k",
    "read_table", "write_table", "question_texts", "answer_texts",
    "embedding_texts", "embed_texts", "check_model", "default_embed_model_path",
    "Clusters", "cluster_embeddings", "project_embeddings", "l2_normalize", "suggest_k",
    "answer_nll", "fill_infinite", "rank_within_clusters",
    "summarize", "plot_summary",
]
