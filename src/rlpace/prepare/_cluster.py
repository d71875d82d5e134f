"""Semantic clusters: L2 normalisation → PCA → k-means (ADS, arXiv 2606.22305, docs/methods/ads.md, "Offline pipeline",
step 2; ADS `src/cluster_embeddings.py`)."""

from __future__ import annotations

from ..errors import InputError
from typing import NamedTuple, Sequence

import numpy as np

METHODS = ("auto", "kmeans", "minibatch", "faiss")
AUTO_MINIBATCH_ABOVE = 100_000  # rows; sklearn KMeans (lloyd) above this is ~4x slower (ecosystem §6)
SILHOUETTE_SAMPLE = 5000        # ADS `_silhouette_sampled(max_samples=5000)`


class Clusters(NamedTuple):
    labels: np.ndarray     # int64[N]  cluster id 0..C-1, numbered by first appearance in the rows
    centroids: np.ndarray  # float32[C, d] centroids in the clustered feature space
    inertia: float         # Σ squared distance of each row to its centroid (feature space)
    pca_dim: int | None    # dimensions after PCA (None: PCA skipped)
    method: str            # "kmeans" | "minibatch" | "faiss" — what actually ran


def l2_normalize(x: np.ndarray) -> np.ndarray:
    """Rows divided by max(‖x‖₂, 1e-12) (ADS `_l2_normalize`); zero rows stay zero.

    Example:
        >>> l2_normalize(np.array([[3.0, 4.0], [0.0, 0.0]])).tolist()
        [[0.6000000238418579, 0.800000011920929], [0.0, 0.0]]
    """
    x = np.asarray(x, dtype=np.float32)
    return x / np.clip(np.linalg.norm(x, axis=1, keepdims=True), 1e-12, None)


def project_embeddings(embeddings: np.ndarray, pca_dim: int | None = 128, *,
                       seed: int = 42) -> tuple[np.ndarray, int | None]:
    """L2-normalise, then PCA to `min(pca_dim, D, N − 1)` dims (ADS's clamp; randomized SVD
    with `random_state=seed`). `pca_dim=None` or 0 skips PCA.

    Returns:
        (float32[N, d] features, d after PCA or None).

    Example:
        >>> x = np.random.default_rng(0).normal(size=(10, 6))
        >>> feats, d = project_embeddings(x, pca_dim=128)   # clamped to min(128, 6, 10 - 1)
        >>> feats.shape, d
        ((10, 6), 6)
    """
    x = _check_embeddings(embeddings)
    x = l2_normalize(x)
    if not pca_dim:
        return x, None
    dim = min(int(pca_dim), x.shape[1], x.shape[0] - 1)
    if dim < 1:
        return x, None
    from sklearn.decomposition import PCA
    feats = PCA(n_components=dim, random_state=seed, svd_solver="randomized").fit_transform(x)
    return np.ascontiguousarray(feats, dtype=np.float32), dim


def _check_embeddings(embeddings) -> np.ndarray:
    x = np.asarray(embeddings)
    if x.ndim != 2 or x.shape[0] == 0:
        raise InputError(f"embeddings must be a non-empty 2-D array [N, D]; got shape {x.shape}.")
    if not np.isfinite(x).all():
        raise InputError("embeddings contain NaN or inf; recompute them (check the model dtype).")
    return x


def check_k(k: int, n: int) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= n:
        raise InputError(f"k must be an integer in [1, N={n}]; got {k!r}. Pass a smaller k "
                         f"(--k) or k='auto' to pick one by silhouette.")
    return int(k)


def check_method(method: str) -> str:
    if method not in METHODS:
        raise InputError(f"cluster method must be one of {METHODS}; got {method!r}.")
    if method == "faiss":
        try:
            import faiss  # noqa: F401
        except ImportError:
            raise InputError("cluster method 'faiss' needs faiss: pip install faiss-cpu; or use "
                             "'kmeans'/'minibatch'.") from None
    return method


def kmeans_labels(features: np.ndarray, k: int, *, method: str = "auto", seed: int = 42,
                  max_iter: int = 100, n_init: int = 3) -> tuple[np.ndarray, np.ndarray, float, str]:
    """k-means on already projected features; labels renumbered by first appearance.

    Returns:
        (labels int64[N], centroids float32[C, d], inertia, method that ran).
    """
    x = np.ascontiguousarray(features, dtype=np.float32)
    n = x.shape[0]
    k = check_k(k, n)
    method = check_method(method)
    if method == "auto":
        method = "minibatch" if n > AUTO_MINIBATCH_ABOVE else "kmeans"
    if method == "kmeans":
        from sklearn.cluster import KMeans
        km = KMeans(n_clusters=k, random_state=seed, n_init=n_init, max_iter=max_iter).fit(x)
        labels, centers = km.labels_, km.cluster_centers_
    elif method == "minibatch":
        from sklearn.cluster import MiniBatchKMeans
        km = MiniBatchKMeans(n_clusters=k, random_state=seed, n_init=n_init, batch_size=4096,
                             max_iter=max_iter).fit(x)
        labels, centers = km.labels_, km.cluster_centers_
    else:
        import faiss
        # All points (not faiss' default 256 per centroid sample), seeded.
        km = faiss.Kmeans(x.shape[1], k, niter=max_iter, seed=seed, nredo=n_init, verbose=False,
                          max_points_per_centroid=max(256, n // k + 1), min_points_per_centroid=1)
        km.train(x)
        centers = km.centroids
        labels = km.index.search(x, 1)[1][:, 0]
    labels = np.asarray(labels, dtype=np.int64)
    # Renumber by first appearance so that ids do not depend on the backend's numbering,
    # and drop centroids no row is assigned to (ids stay dense 0..C-1).
    used, first = np.unique(labels, return_index=True)
    old = used[np.argsort(first)]
    remap = np.full(k, -1, dtype=np.int64)
    remap[old] = np.arange(old.size)
    labels = remap[labels]
    centers = np.asarray(centers, dtype=np.float32)[old]
    inertia = float(((x - centers[labels]) ** 2).sum())
    return labels, centers, inertia, method


def cluster_embeddings(embeddings: np.ndarray, k: int, *, pca_dim: int | None = 128,
                       method: str = "auto", seed: int = 42, max_iter: int = 100,
                       n_init: int = 3) -> Clusters:
    """ADS clustering: x̂ = x/‖x‖₂ → PCA(min(pca_dim, D, N−1)) → k-means with k clusters.

    Backends: "kmeans" (sklearn KMeans), "minibatch" (sklearn
    MiniBatchKMeans, batch 4096), "faiss" (faiss.Kmeans over all points), "auto" = kmeans up
    to 100k rows, minibatch above. Deterministic for a fixed `seed` on one machine.
    Deviations from ADS: `n_init=3` k-means++ restarts, best inertia kept (ADS: sklearn's
    `n_init="auto"`, one start; one start missed a clean 4-topic split for 1 seed in 20 in
    our tests); cluster ids are renumbered by first appearance in the rows, and an empty
    cluster (possible with faiss) is dropped, so ids are dense 0..C−1 with C ≤ k.

    Args:
        embeddings: float[N, D].
        k: number of clusters, 1 ≤ k ≤ N (ADS: 64).
        pca_dim: PCA dimensions (ADS: 128); None or 0 skips PCA.
        method: "auto" | "kmeans" | "minibatch" | "faiss".
        seed: random state for PCA and k-means (ADS: 42).
        max_iter: k-means iterations.
        n_init: k-means restarts (faiss: `nredo`); the lowest inertia wins.

    Example:
        >>> rng = np.random.default_rng(0)
        >>> x = np.r_[rng.normal([5, 0], 0.1, (5, 2)), rng.normal([0, 5], 0.1, (5, 2))]
        >>> cluster_embeddings(x, 2, pca_dim=None).labels.tolist()
        [0, 0, 0, 0, 0, 1, 1, 1, 1, 1]
    """
    x = _check_embeddings(embeddings)
    check_k(k, x.shape[0])
    check_method(method)
    feats, dim = project_embeddings(x, pca_dim, seed=seed)
    labels, centers, inertia, ran = kmeans_labels(feats, k, method=method, seed=seed, max_iter=max_iter,
                                                  n_init=n_init)
    return Clusters(labels, centers, inertia, dim, ran)


def suggest_k(embeddings: np.ndarray, candidates: Sequence[int] = (2, 4, 8, 16, 32, 64), *,
              pca_dim: int | None = 128, method: str = "auto", seed: int = 42,
              n_init: int = 3, sample_size: int = SILHOUETTE_SAMPLE,
              progress: bool = True) -> tuple[int, dict[int, float]]:
    """Pick k by the mean silhouette coefficient over candidate values.

    For each candidate k the rows are clustered as in `cluster_embeddings` (one PCA shared by
    all candidates), and the silhouette s = mean_i (b_i − a_i) / max(a_i, b_i) is computed on
    the projected features (euclidean, on at most `sample_size` rows drawn with `seed`, as
    ADS's `_silhouette_sampled`). The best score wins; ties go to the smaller k. Candidates
    outside [2, N − 1] are skipped (silhouette needs 2 ≤ k < N).

    Returns:
        (best k, {k: silhouette}).

    Example:
        >>> rng = np.random.default_rng(0)
        >>> x = np.concatenate([rng.normal(c, 0.05, (10, 3)) for c in np.eye(3) * 5])
        >>> suggest_k(x, [2, 3, 4], pca_dim=None, progress=False)[0]
        3
    """
    from sklearn.metrics import silhouette_score
    from tqdm.auto import tqdm

    x = _check_embeddings(embeddings)
    n = x.shape[0]
    ks = sorted({int(c) for c in candidates if 2 <= int(c) <= n - 1})
    if not ks:
        raise InputError(f"no candidate k in {list(candidates)} lies in [2, N-1={n - 1}]; pass "
                         f"candidates that fit the data size.")
    check_method(method)
    feats, _ = project_embeddings(x, pca_dim, seed=seed)
    rng = np.random.default_rng(seed)
    sample = np.sort(rng.choice(n, size=sample_size, replace=False)) if n > sample_size else None
    scores: dict[int, float] = {}
    for k in tqdm(ks, desc="silhouette over k", disable=not progress):
        labels = kmeans_labels(feats, k, method=method, seed=seed, n_init=n_init)[0]
        f, lab = (feats, labels) if sample is None else (feats[sample], labels[sample])
        scores[k] = float(silhouette_score(f, lab)) if len(np.unique(lab)) > 1 else -1.0
    best = max(ks, key=lambda k: (scores[k], -k))
    return best, scores
