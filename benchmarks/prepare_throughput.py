"""Throughput of `rlpace prepare`'s pieces on CPU (not a timed test).

Measures, on synthetic short prompts (one sentence, ~12–20 words, 8 topics):
  1. embedding with the default model (packaged all-MiniLM-L6-v2) → prompts per second;
  2. L2 + PCA and k-means at N = --cluster-n rows: sklearn KMeans vs MiniBatchKMeans vs faiss,
     with times side by side and ratios to sklearn KMeans;
  3. answer-NLL scoring with the tiny random Qwen2 of tests/_tiny_lm.py → rows and answer
     tokens per second.

Embedding dominates: at --n below --cluster-n the embedding time of --cluster-n prompts is
extrapolated linearly from --n (printed as such), and clustering runs on the --n real
embeddings tiled with small Gaussian noise up to --cluster-n rows.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/prepare_throughput.py --n 10000 --threads 2
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402

TOPICS = [
    ("What is {a} plus {b}?", "{s}"),
    ("How long should I bake the {food} at {t} degrees?", "Bake it for about {m} minutes."),
    ("Which team scored {a} goals in the {y} football final?", "The team from {city}."),
    ("How many moons does the planet {planet} have according to {y} data?", "{a}"),
    ("Sort the numbers {a}, {b}, {m} and {t} in ascending order.", "{sorted}"),
    ("If the knight from {city} says the knave is lying, who tells the truth?", "The knight."),
    ("Translate the word {word} into French and use it in a sentence.", "Le mot est {word}."),
    ("A train leaves {city} at {h} o'clock at {a} km/h; when does it cover {b} km?", "After {m} minutes."),
]
WORDS = dict(food=["bread", "cake", "lasagna", "pie", "chicken", "pizza"],
             planet=["Mars", "Jupiter", "Saturn", "Uranus", "Neptune"],
             city=["Paris", "Lima", "Oslo", "Cairo", "Tokyo", "Quito"],
             word=["house", "river", "apple", "window", "friend", "garden"])


def make_prompts(n: int, seed: int = 0) -> tuple[list[str], list[str], np.ndarray]:
    rng = np.random.default_rng(seed)
    qs, ans, topic = [], [], rng.integers(0, len(TOPICS), n)
    for i in range(n):
        a, b, m, t, h = (int(x) for x in rng.integers(1, 300, 5))
        fill = dict(a=a, b=b, m=m, t=t, h=h % 24, s=a + b, y=int(rng.integers(1950, 2024)),
                    sorted=", ".join(map(str, sorted((a, b, m, t)))),
                    **{k: v[int(rng.integers(len(v)))] for k, v in WORDS.items()})
        q, r = TOPICS[topic[i]]
        qs.append(q.format(**fill))
        ans.append(r.format(**fill))
    return qs, ans, topic


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=100_000, help="prompts to embed")
    ap.add_argument("--cluster-n", type=int, default=100_000, help="rows to cluster")
    ap.add_argument("--threads", type=int, default=2, help="torch / BLAS threads")
    ap.add_argument("--k", type=int, default=64)
    ap.add_argument("--pca-dim", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--nll-n", type=int, default=1024, help="rows scored with the tiny LM")
    ap.add_argument("--nll-batch-size", type=int, default=16)
    args = ap.parse_args()

    import torch
    torch.set_num_threads(args.threads)
    from threadpoolctl import threadpool_limits
    threadpool_limits(args.threads)

    from rlpace.prepare import answer_nll, embed_texts
    from rlpace.prepare._cluster import kmeans_labels, project_embeddings

    qs, ans, topic = make_prompts(max(args.n, args.nll_n))
    words = np.mean([len(q.split()) for q in qs[:args.n]])
    print(f"# prepare throughput — {args.threads} threads, load avg {os.getloadavg()[0]:.1f} "
          f"(machine shared with other jobs: figures are contended)")
    print(f"prompts: {args.n}, mean {words:.1f} words, {len(TOPICS)} topics")

    # ---- 1. embedding -------------------------------------------------------------------
    t0 = time.perf_counter()
    embed_texts(qs[:8], progress=False)                        # load MiniLM (cached after)
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    emb = embed_texts(qs[:args.n], batch_size=args.batch_size, progress=True)
    embed_s = time.perf_counter() - t0
    rate = args.n / embed_s
    print(f"\nembed (all-MiniLM-L6-v2, batch {args.batch_size}): load {load_s:.1f} s, "
          f"{args.n} prompts in {embed_s:.1f} s = {rate:.0f} prompts/s")
    if args.n < args.cluster_n:
        print(f"  {args.cluster_n} prompts: {args.cluster_n / rate:.0f} s (EXTRAPOLATED from {args.n})")
    if args.threads != 1:
        # On a shared machine extra OMP threads can spin and lose (ecosystem.md §2.5): compare.
        m = min(args.n, 2000)
        torch.set_num_threads(1)
        t0 = time.perf_counter()
        embed_texts(qs[:m], batch_size=args.batch_size, progress=False)
        one = m / (time.perf_counter() - t0)
        torch.set_num_threads(args.threads)
        print(f"  same at 1 thread on {m} prompts: {one:.0f} prompts/s "
              f"({args.threads} threads / 1 thread = {rate / one:.2f}x)")

    # ---- 2. clustering ------------------------------------------------------------------
    x = emb
    if args.cluster_n > args.n:
        rng = np.random.default_rng(1)
        reps = -(-args.cluster_n // args.n)
        x = np.tile(emb, (reps, 1))[:args.cluster_n]
        x = x + rng.normal(0, 0.01, x.shape).astype(np.float32)
        print(f"clustering on {args.cluster_n} rows = {args.n} embeddings tiled + N(0, 0.01) noise")
    import sklearn.cluster  # noqa: F401  (imports outside the timed regions)
    import sklearn.decomposition  # noqa: F401
    import faiss  # noqa: F401
    t0 = time.perf_counter()
    feats, dim = project_embeddings(x, args.pca_dim, seed=42)
    pca_s = time.perf_counter() - t0
    print(f"L2 + PCA {x.shape[1]} → {dim}: {pca_s:.1f} s")
    rows = []
    for method in ("kmeans", "minibatch", "faiss"):
        for n_init in (1, 3):
            t0 = time.perf_counter()
            labels, _, inertia, _ = kmeans_labels(feats, args.k, method=method, seed=42, n_init=n_init)
            rows.append((method, n_init, time.perf_counter() - t0, inertia, len(np.unique(labels))))
    base = rows[0][2]
    print(f"\nk-means, k={args.k}, N={feats.shape[0]}, d={feats.shape[1]}, max_iter 100")
    print(f"{'method':10s} {'n_init':>6s} {'seconds':>8s} {'vs kmeans/1':>11s} {'inertia':>10s} {'clusters':>8s}")
    for m, ni, s, inert, c in rows:
        print(f"{m:10s} {ni:6d} {s:8.2f} {s / base:10.2f}x {inert:10.1f} {c:8d}")
    total = args.cluster_n / rate + pca_s + rows[1][2]
    print(f"\nembed + cluster {args.cluster_n} prompts (default path: sklearn KMeans, n_init 3): "
          f"~{total:.0f} s"
          + (" (embedding part extrapolated)" if args.n < args.cluster_n else ""))

    # ---- 3. NLL with the tiny LM --------------------------------------------------------
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from _tiny_lm import build_tiny_lm
    with tempfile.TemporaryDirectory() as d:
        lm = build_tiny_lm(Path(d) / "tiny", corpus=qs[:2000] + ans[:2000])
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(lm)
        nq, na = qs[:args.nll_n], ans[:args.nll_n]
        answer_nll(nq[:8], na[:8], lm, progress=False)         # load
        n_tok = sum(len(tok(a, add_special_tokens=False)["input_ids"]) for a in na)
        print(f"\nanswer NLL, tiny Qwen2 (2 layers, width 32, vocab 300), {args.nll_n} rows, "
              f"{n_tok} answer tokens")
        print(f"{'threads':>7s} {'batch':>5s} {'seconds':>8s} {'rows/s':>7s} {'tokens/s':>8s}")
        for threads in sorted({1, args.threads}):
            torch.set_num_threads(threads)
            for bs in (args.nll_batch_size, 4 * args.nll_batch_size):
                t0 = time.perf_counter()
                answer_nll(nq, na, lm, batch_size=bs, progress=False)
                s = time.perf_counter() - t0
                print(f"{threads:7d} {bs:5d} {s:8.2f} {args.nll_n / s:7.0f} {n_tok / s:8.0f}")


if __name__ == "__main__":
    main()
