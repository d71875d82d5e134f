"""Annotate a prompt dataset with semantic clusters, easy → hard ranks and NLL difficulty.

ADS's offline pipeline (arXiv 2606.22305; docs/methods/ads.md): embed → L2 → PCA → k-means, mean NLL of the
reference answer under a local causal LM, rank inside each cluster. Writes OUTPUT (format by
suffix: .parquet, .jsonl, else a Hugging Face dataset directory; a suffix of another file
format, such as .csv, is refused rather than made a directory) with every input column plus
cluster_id, rank_in_cluster, cluster_size, difficulty (top level and in extra_info), and beside
it <stem>.embeddings.npy, <stem>.summary.json, <stem>.summary.png.

Example:
    rlpace prepare train.parquet --out train.ads.parquet --k 64 \\
        --nll-model models/Qwen2.5-Math-1.5B --text-mode question_plus_cot \\
        --answer-key extra_info.solution
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import InputError


def _k(value: str):
    if value == "auto":
        return value
    try:
        k = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--k takes an integer ≥ 1 or 'auto'; got {value!r}") from None
    if k < 1:
        raise argparse.ArgumentTypeError(f"--k takes an integer ≥ 1 or 'auto'; got {value!r}")
    return k


def _ints(value: str) -> list[int]:
    try:
        return [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers; got {value!r}") from None


def add_arguments(parser) -> None:
    parser.formatter_class = argparse.ArgumentDefaultsHelpFormatter
    parser.add_argument("input", help="verl-schema .parquet, .jsonl, or a save_to_disk dataset directory")
    parser.add_argument("--out", required=True,
                        help="output path: .parquet, .jsonl (.json: JSON lines too), or a path without a file "
                             "suffix for a Hugging Face dataset directory; another file suffix (.csv, .txt, ...) "
                             "is refused")
    g = parser.add_argument_group("clustering")
    g.add_argument("--k", type=_k, default=None,
                   help="clusters, or 'auto' for a silhouette pick; default clamp(round(sqrt(N/2)), 2, 64) "
                        "for N rows (ADS's 64 from N = 8,065 on; 200 rows -> 10)")
    g.add_argument("--k-candidates", type=_ints, default=[2, 4, 8, 16, 32, 64],
                   help="comma-separated candidates for --k auto")
    g.add_argument("--pca-dim", type=int, default=128, help="PCA dims before k-means (0 = none)")
    g.add_argument("--cluster-method", default="auto", choices=["auto", "kmeans", "minibatch", "faiss"],
                   help="auto = sklearn KMeans up to 100k rows, MiniBatchKMeans above")
    g.add_argument("--seed", type=int, default=42, help="seed of PCA, k-means, silhouette sample")
    g.add_argument("--n-init", type=int, default=3, help="k-means restarts, lowest inertia kept (ADS: 1)")
    g = parser.add_argument_group("embedding")
    g.add_argument("--embed-model", default=None,
                   help="local sentence-transformers or causal-LM dir (default: packaged all-MiniLM-L6-v2)")
    g.add_argument("--text-mode", default="question", choices=["question", "question_plus_cot"],
                   help="embed the question, or 'Question:\\n{q}\\n\\nAnswer:\\n{a}' (ADS)")
    g.add_argument("--batch-size", type=int, default=64, help="embedding batch size")
    g.add_argument("--reuse-embeddings", default=None,
                   help="a .embeddings.npy from an earlier run: re-cluster without re-embedding")
    g = parser.add_argument_group("difficulty")
    g.add_argument("--nll-model", default=None,
                   help="local causal-LM dir scoring the reference answer (none: difficulty NaN)")
    g.add_argument("--nll-batch-size", type=int, default=8, help="NLL batch size")
    g.add_argument("--max-length", type=int, default=4096, help="token cut for causal LMs (ADS: 4096)")
    g = parser.add_argument_group("columns and data")
    g.add_argument("--question-key", default="prompt",
                   help="question column: verl chat list (user content) or string; dotted paths ok")
    g.add_argument("--answer-key", default="reward_model.ground_truth",
                   help="reference answer column, e.g. extra_info.answer or solution")
    g.add_argument("--split", default=None, help="split of a saved DatasetDict")
    g.add_argument("--on-missing", default="keep", choices=["keep", "error"],
                   help="rows without question/answer: keep (reported; empty answer = hardest) or error")
    g = parser.add_argument_group("runtime")
    g.add_argument("--device", default="cpu", help="torch device")
    g.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="causal-LM weight dtype")
    g.add_argument("--no-plot", action="store_true", help="skip the PNG")
    g.add_argument("--no-progress", action="store_true", help="hide progress bars")


#: Suffixes of file formats prepare does not write. An --out ending in one of them would
#: become a Hugging Face dataset *directory* of that name (`y.csv/`), which no reader of
#: `y.csv` expects: refused instead, naming the formats prepare writes.
FOREIGN_SUFFIXES = frozenset({".csv", ".tsv", ".txt", ".xlsx", ".xls", ".arrow", ".feather", ".pq",
                              ".orc", ".avro", ".pkl", ".pickle", ".npy", ".npz", ".pt", ".gz", ".zip",
                              ".tar", ".bz2", ".xz", ".zst", ".ndjson", ".yaml", ".yml", ".html", ".md"})


def check_out(out: str) -> None:
    """Refuse an --out prepare cannot write as asked (before any model loads): a foreign
    file suffix, or a path (or one of its sidecar files) that cannot be created."""
    from rlpace.prepare._io import output_format
    from rlpace.prepare._pipeline import sidecar_paths

    from ._paths import check_output
    suffix = Path(out).suffix.lower()
    if suffix in FOREIGN_SUFFIXES:
        raise InputError(f"--out {out!r}: prepare writes .parquet, .jsonl (or .json lines) or a Hugging Face "
                         f"dataset directory (a path without a file suffix), not {suffix}; e.g. --out "
                         f"{str(Path(out).with_suffix('.parquet'))!r}.")
    check_output(out, "--out", kind="dir" if output_format(out) == "hf" else "file")
    for side in sidecar_paths(out).values():
        check_output(side, "--out (its sidecar file)")


def run(args) -> int:
    from rlpace.prepare import prepare

    from ._notes import notes, quiet_transformers

    check_out(args.out)
    if args.no_progress:
        quiet_transformers()
    with notes("prepare"):
        res = prepare(args.input, args.out, k=args.k, k_candidates=args.k_candidates,
                      embed_model=args.embed_model, nll_model=args.nll_model, text_mode=args.text_mode,
                      question_key=args.question_key, answer_key=args.answer_key, pca_dim=args.pca_dim,
                      cluster_method=args.cluster_method, seed=args.seed, n_init=args.n_init,
                      batch_size=args.batch_size,
                      nll_batch_size=args.nll_batch_size, max_length=args.max_length, device=args.device,
                      dtype=args.dtype, split=args.split, reuse_embeddings=args.reuse_embeddings,
                      on_missing=args.on_missing, plot=not args.no_plot, progress=not args.no_progress)
    s = res.summary
    sizes = s["cluster_sizes"]
    print(f"wrote {res.output}: {s['n_rows']} rows, {s['n_clusters']} clusters "
          f"(sizes {min(sizes)}..{max(sizes)}), method {s['cluster_method']}"
          + (f"; k {s['k']} by the {s['k_rule']} (set --k to choose)" if s.get("k_rule") else ""))
    if s["k_suggestion"]:
        print(f"k by silhouette: {s['k_suggestion']['chosen']} "
              f"({', '.join(f'{k}: {v:.3f}' for k, v in s['k_suggestion']['silhouette'].items())})")
    print(f"embeddings: {res.embeddings_path}\nsummary:    {res.summary_path}"
          + (f"\nplot:       {res.plot_path}" if res.plot_path else ""))
    t = s["timings_s"]
    print(f"time: embed {t['embed_s']:.1f}s, cluster {t['cluster_s']:.1f}s, nll {t['nll_s']:.1f}s, "
          f"total {t['total_s']:.1f}s")
    return 0
