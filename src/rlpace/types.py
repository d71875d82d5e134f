"""Typed records at the boundary: the prompt `Pool`, one step's `Feedback`, and the
derived `Batch` that policies read.

Every field says its dtype and shape. Records validate at construction and raise a
`ValueError` naming the field and the fix; engine objects (verl `DataProto`, TRL input
dicts) never get past the adapters — policies see only these records.

Example:
    >>> import numpy as np
    >>> pool = Pool(["math", "logic", "math"], difficulty=[0.2, 0.9, 0.5])
    >>> pool.domain_names, pool.domains.tolist()
    (('logic', 'math'), [1, 0, 1])
    >>> fb = Feedback(prompt_ids=[0, 2], rewards=[[1, 0, 1, 1], [0, 0, 0, 0]], step=3)
    >>> fb.rewards.shape
    (2, 4)
"""

from __future__ import annotations

from ._checks import abs_signal
from .errors import InputError
from .stats._votes import AnswerVotes
import functools
import hashlib
import itertools
import json
import operator
from dataclasses import dataclass, field, fields as dataclass_fields
from typing import Any, NamedTuple, Sequence

import numpy as np

__all__ = ["Pool", "Feedback", "LossFeedback", "Batch", "group_advantages", "kept_group_advantages",
           "informative_groups"]


def _as_1d(name: str, values: Any, n: int | None, dtype=None) -> np.ndarray:
    try:
        arr = np.asarray(values) if dtype is None else np.asarray(values, dtype=dtype)
    except (TypeError, ValueError) as e:     # e.g. difficulty=["x"]: name the field, not numpy's cast
        raise InputError(f"Pool.{name} must hold {np.dtype(dtype).name} numbers (one per prompt); "
                         f"{e}. Convert the values, or leave {name} out.") from None
    if arr.ndim != 1:
        raise InputError(f"Pool.{name} must be 1-D (one entry per prompt); got shape {arr.shape}. "
                         f"Pass a flat list or array.")
    if n is not None and arr.shape[0] != n:
        raise InputError(f"Pool.{name} has {arr.shape[0]} entries but the pool has {n} prompts; "
                         f"give exactly one {name} value per prompt.")
    return arr


def _factorize(name: str, labels: np.ndarray) -> tuple[np.ndarray, tuple]:
    """Map labels (ints or strings) to dense codes 0..K-1 in sorted label order."""
    if labels.dtype.kind in "iu":
        uniq, codes = np.unique(labels, return_inverse=True)
        return codes.astype(np.int64), tuple(int(u) for u in uniq)
    if labels.dtype.kind in "UO":
        as_str = labels.astype(str)
        uniq, codes = np.unique(as_str, return_inverse=True)
        return codes.astype(np.int64), tuple(str(u) for u in uniq)
    raise InputError(f"Pool.{name} must hold ints or strings; got dtype {labels.dtype}. "
                     f"Convert labels to int or str.")


def _group_index(codes: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Members of each group: `order[offsets[g]:offsets[g+1]]` are the prompts of group g."""
    order = np.argsort(codes, kind="stable").astype(np.int64)
    counts = np.bincount(codes, minlength=k)
    offsets = np.zeros(k + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return order, offsets


_FEATURE_CHUNK = 1 << 16   # rows per pass over a (memory-mapped) feature matrix


def _pool_features(features: Any, n: int) -> np.ndarray:
    """float32[N, f] read-only features, or a ValueError naming Pool.features and the fix.

    A str / Path is a `.npy` file (`rlpace prepare`'s `<stem>.embeddings.npy`), opened
    memory-mapped; a float32 array (or memmap) is kept without a copy, other real arrays are
    converted. Finiteness is checked in row chunks, so a memory-mapped 10⁶-row file is never
    loaded whole."""
    import os
    if isinstance(features, (str, os.PathLike)):
        path = os.fspath(features)
        if not path.endswith(".npy") or not os.path.isfile(path):
            raise InputError(f"Pool.features path {path!r} is not a .npy file; pass the "
                             f"<stem>.embeddings.npy that `rlpace prepare` wrote, or an array.")
        try:
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
        except ValueError as e:
            raise InputError(f"Pool.features file {path!r} could not be read as a numeric .npy ({e}).") from None
    else:
        arr = features if isinstance(features, np.ndarray) else np.asarray(features)
    if arr.dtype.kind not in "fiu" or arr.dtype.kind == "b":
        raise InputError(f"Pool.features must hold real numbers; got dtype {arr.dtype}. Pass float32[N, f].")
    if arr.ndim != 2:
        raise InputError(f"Pool.features must be 2-D [N, f] (one row per prompt); got shape {arr.shape}.")
    if arr.shape[0] != n:
        raise InputError(f"Pool.features has {arr.shape[0]} rows but the pool has {n} prompts; give "
                         f"one feature row per prompt, in pool order.")
    if arr.shape[1] == 0:
        raise InputError("Pool.features has 0 columns; pass at least one feature per prompt or None.")
    if arr.dtype != np.float32:
        with np.errstate(over="ignore"):      # too large for float32 → inf, reported just below
            arr = np.array(arr, dtype=np.float32)
        if not np.isfinite(arr).all():    # values beyond float32's range became inf
            bad = np.argwhere(~np.isfinite(arr))[0].tolist()
            raise InputError(f"Pool.features has NaN or inf values (or values beyond float32; first "
                             f"at [{bad[0]}, {bad[1]}]); fix or drop those prompts.")
    else:
        for start in range(0, n, _FEATURE_CHUNK):
            chunk = np.asarray(arr[start:start + _FEATURE_CHUNK])
            if not np.isfinite(chunk).all():
                bad = np.argwhere(~np.isfinite(chunk))[0].tolist()
                raise InputError(f"Pool.features has NaN or inf values (first at [{bad[0] + start}, "
                                 f"{bad[1]}]); fix or drop those prompts.")
        if not isinstance(arr, np.memmap):
            arr = np.array(arr, copy=True)          # never share memory with the caller
    if arr.flags.writeable:
        arr.setflags(write=False)
    return arr


def _pool_labeled(labeled: Any, n: int) -> np.ndarray:
    """bool[N] (a copy), all True when None, or a ValueError naming Pool.labeled."""
    if labeled is None:
        return np.ones(n, dtype=bool)
    arr = np.asarray(labeled)
    if arr.dtype == object:
        if not all(isinstance(v, (bool, np.bool_)) for v in arr.ravel()):
            raise InputError("Pool.labeled must hold booleans (True = the dataset label may be used in "
                             "training); got non-boolean entries such as None or strings.")
        arr = arr.astype(bool)
    if arr.ndim != 1 or arr.shape[0] != n:
        raise InputError(f"Pool.labeled must be bool[N] with N = {n} (one flag per prompt); got shape "
                         f"{arr.shape}.")
    if arr.dtype.kind == "b":
        return np.array(arr, dtype=bool)
    if arr.dtype.kind in "iu" and np.isin(arr, (0, 1)).all():
        return arr.astype(bool)
    raise InputError(f"Pool.labeled must hold booleans (or 0/1); got dtype {arr.dtype}.")


def _features_digest(features: np.ndarray) -> str:
    h = hashlib.sha256()
    h.update(str(features.shape).encode())
    for start in range(0, features.shape[0], _FEATURE_CHUNK):
        h.update(np.ascontiguousarray(features[start:start + _FEATURE_CHUNK]).tobytes())
    return h.hexdigest()[:16]


@dataclass(frozen=True, eq=False)
class Pool:
    """The prompt pool: what a scheduler may propose, with its static annotations.

    Attributes:
        domains: int64[N] dense domain code of each prompt (0..K-1).
        domain_names: tuple of K original labels, `domain_names[domains[i]]` is prompt i's label.
        clusters: int64[N] dense cluster code (0..C-1); equal to `domains` when not given.
        cluster_names: tuple of C original cluster labels.
        ranks: int64[N] rank of the prompt inside its cluster, 0 = easiest. When not given:
            by `difficulty` (ascending, ties by position) if given, else by position.
        difficulty: float64[N] offline difficulty score (higher = harder); NaN when not given.
        ids: int64[N] or object[N] stable external id of each prompt (verl `extra_info.index`);
            `arange(N)` when not given. Must be unique.
        features: float32[N, f] or None — per-prompt features for the pass-rate predictor
            (`rlpace.predict`): an array, or the path of a `.npy` file such as the
            `<stem>.embeddings.npy` that `rlpace prepare` writes (opened memory-mapped, so a
            10⁶-row file is not read into memory). Must be finite with one row per prompt;
            part of the fingerprint when given. Read-only.
        labeled: bool[N] — whether each prompt's dataset label may be used for training
            (semi-supervised and test-time methods: `ttrl`, `trapo`, the `self_certainty` /
            `entropy_min` rewards; docs/methods/README.md "Supervision as state"). All True
            when not given; part of the fingerprint only when some entry is False, so pools
            without unlabelled prompts keep their fingerprints. Read-only.

    Positions 0..N-1 are what `Feedback.prompt_ids` and `Scheduler.propose` speak in.
    """

    domains: np.ndarray
    domain_names: tuple
    clusters: np.ndarray
    cluster_names: tuple
    ranks: np.ndarray
    difficulty: np.ndarray
    ids: np.ndarray
    features: np.ndarray | None = None
    labeled: np.ndarray | None = None
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    def __init__(self, domains: Sequence, *, clusters: Sequence | None = None,
                 ranks: Sequence | None = None, difficulty: Sequence | None = None,
                 ids: Sequence | None = None, features: Any = None, labeled: Sequence | None = None):
        dom = _as_1d("domains", domains, None)
        n = dom.shape[0]
        if n == 0:
            raise InputError("Pool.domains is empty: a pool needs at least one prompt. "
                             "Pass one domain label per prompt.")
        codes, names = _factorize("domains", dom)
        if clusters is None:
            c_codes, c_names = codes, names
        else:
            c_codes, c_names = _factorize("clusters", _as_1d("clusters", clusters, n))
        if difficulty is None:
            diff = np.full(n, np.nan)
        else:
            diff = _as_1d("difficulty", difficulty, n, dtype=np.float64)
            if np.isinf(diff).any():
                raise InputError("Pool.difficulty has inf values; replace them by a finite "
                                 "score (ADS uses max_finite + 1) or NaN for unknown.")
        if ranks is None:
            # Rank inside each cluster: by difficulty (NaN last) then position.
            key = np.where(np.isnan(diff), np.inf, diff)
            order = np.lexsort((np.arange(n), key, c_codes))
            rk = np.empty(n, dtype=np.int64)
            sorted_c = c_codes[order]
            starts = np.r_[0, np.flatnonzero(np.diff(sorted_c)) + 1]
            group_start = np.repeat(starts, np.diff(np.r_[starts, n]))
            rk[order] = np.arange(n) - group_start
        else:
            rk = _as_1d("ranks", ranks, n)
            if rk.dtype.kind not in "iu":
                raise InputError(f"Pool.ranks must be integers (0 = easiest); got dtype {rk.dtype}.")
            rk = rk.astype(np.int64)
            if (rk < 0).any():
                raise InputError("Pool.ranks has negative values; ranks count from 0 (easiest).")
        if ids is None:
            id_arr = np.arange(n, dtype=np.int64)
        else:
            id_arr = _as_1d("ids", ids, n)
            if id_arr.dtype.kind in "iu":
                id_arr = id_arr.astype(np.int64)
            else:
                id_arr = id_arr.astype(object)
            if len(np.unique(id_arr.astype(str) if id_arr.dtype == object else id_arr)) != n:
                raise InputError("Pool.ids has duplicates; each prompt needs a unique stable id "
                                 "(verl: extra_info.index). Deduplicate or re-index the data.")
        lab = _pool_labeled(labeled, n)
        for name, val in (("domains", codes), ("clusters", c_codes), ("ranks", rk),
                          ("difficulty", diff), ("ids", id_arr), ("labeled", lab)):
            val.setflags(write=False)
        object.__setattr__(self, "domains", codes)
        object.__setattr__(self, "domain_names", names)
        object.__setattr__(self, "clusters", c_codes)
        object.__setattr__(self, "cluster_names", c_names)
        object.__setattr__(self, "ranks", rk)
        object.__setattr__(self, "difficulty", diff)
        object.__setattr__(self, "ids", id_arr)
        object.__setattr__(self, "features", None if features is None else _pool_features(features, n))
        object.__setattr__(self, "labeled", lab)
        object.__setattr__(self, "_cache", {})

    # ---- sizes -------------------------------------------------------------------------
    def __len__(self) -> int:
        return int(self.domains.shape[0])

    @property
    def n_domains(self) -> int:
        return len(self.domain_names)

    @property
    def n_clusters(self) -> int:
        return len(self.cluster_names)

    def arm_codes(self, arms: str) -> np.ndarray:
        """int64[N] arm of each prompt, for `arms` in {"domain", "cluster"}."""
        if arms == "domain":
            return self.domains
        if arms == "cluster":
            return self.clusters
        raise InputError(f"arms must be 'domain' or 'cluster'; got {arms!r}.")

    def n_arms(self, arms: str) -> int:
        return self.n_domains if arms == "domain" else self.n_clusters

    def members(self, arms: str) -> tuple[np.ndarray, np.ndarray]:
        """(order int64[N], offsets int64[K+1]): prompts of arm k are
        `order[offsets[k]:offsets[k+1]]`, in position order."""
        key = ("members", arms)
        if key not in self._cache:
            self._cache[key] = _group_index(self.arm_codes(arms), self.n_arms(arms))
        return self._cache[key]

    def by_rank(self) -> tuple[np.ndarray, np.ndarray]:
        """(order, offsets) over clusters with members sorted easy → hard by `ranks`:
        `order[offsets[k] + r]` is the prompt at rank-order r of cluster k."""
        if "by_rank" not in self._cache:
            n = len(self)
            order = np.lexsort((np.arange(n), self.ranks, self.clusters)).astype(np.int64)
            counts = np.bincount(self.clusters, minlength=self.n_clusters)
            offsets = np.zeros(self.n_clusters + 1, dtype=np.int64)
            np.cumsum(counts, out=offsets[1:])
            pos = np.empty(n, dtype=np.int64)
            pos[order] = np.arange(n) - offsets[self.clusters[order]]
            self._cache["by_rank"] = (order, offsets, pos)
        order, offsets, _ = self._cache["by_rank"]
        return order, offsets

    def cluster_domain_shares(self) -> np.ndarray:
        """float64[K, C]: column c is the domain make-up of cluster c (its members' share in
        each domain; sums to 1, or 0 for an empty cluster). Computed once per pool."""
        if "cluster_domain_shares" not in self._cache:
            m = self.domain_cluster_counts()
            shares = m / np.maximum(m.sum(axis=0, keepdims=True), 1.0)
            shares.setflags(write=False)
            self._cache["cluster_domain_shares"] = shares
        return self._cache["cluster_domain_shares"]

    def rank_position(self) -> np.ndarray:
        """int64[N] position of each prompt in its cluster's easy → hard order (0..size-1)."""
        self.by_rank()
        return self._cache["by_rank"][2]

    def domain_cluster_counts(self) -> np.ndarray:
        """float64[K, C] number of prompts of domain k in cluster c (cached): what turns a
        cluster distribution into a domain one and back."""
        if "domain_cluster_counts" not in self._cache:
            m = np.zeros((self.n_domains, self.n_clusters))
            np.add.at(m, (self.domains, self.clusters), 1.0)
            m.setflags(write=False)
            self._cache["domain_cluster_counts"] = m
        return self._cache["domain_cluster_counts"]

    def domain_share(self) -> np.ndarray:
        """float64[K] fraction of the pool in each domain (a writable copy of `arm_share`)."""
        return self.arm_share("domain").copy()

    def arm_sizes(self, arms: str) -> tuple[np.ndarray, bool]:
        """(sizes int64[K] read-only prompts per arm, every arm non-empty), computed once:
        `np.diff(members(arms)[1])`, which a selection that follows a mixture reads at every
        proposal."""
        key = ("arm_sizes", arms)
        if key not in self._cache:
            sizes = np.diff(self.members(arms)[1])
            sizes.setflags(write=False)
            self._cache[key] = (sizes, bool((sizes > 0).all()))
        return self._cache[key]

    def arm_sizes_float(self, arms: str) -> np.ndarray:
        """float64[K] read-only `arm_sizes(arms)[0]` as floats (cached): a product with
        float draws then needs no int-to-float cast per element."""
        key = ("arm_sizes_float", arms)
        if key not in self._cache:
            sizes = self.arm_sizes(arms)[0].astype(np.float64)
            sizes.setflags(write=False)
            self._cache[key] = sizes
        return self._cache[key]

    def arm_share(self, arms: str) -> np.ndarray:
        """float64[K] read-only fraction of the pool's prompts in each arm ("domain" or
        "cluster"), computed once (a mixture reads it at every proposal)."""
        key = ("arm_share", arms)
        if key not in self._cache:
            share = np.bincount(self.arm_codes(arms), minlength=self.n_arms(arms)) / len(self)
            share.setflags(write=False)
            self._cache[key] = share
        return self._cache[key]

    def fingerprint_parts(self) -> dict[str, str]:
        """{part: short hash} for each part of what identifies the pool: `size`, `domains`
        (labels and codes), `clusters` (labels and codes), `ranks`, `difficulty`, `ids`, and
        `features` when the pool has them. Stored in checkpoints beside `fingerprint()`, so a
        mismatch can name what differs."""
        if "fp_parts" not in self._cache:
            def digest(*chunks: bytes) -> str:
                h = hashlib.sha256()
                for c in chunks:
                    h.update(len(c).to_bytes(8, "little"))     # unambiguous concatenation
                    h.update(c)
                return h.hexdigest()[:16]

            def arr(a: np.ndarray) -> bytes:
                return np.ascontiguousarray(a).tobytes()

            diff = self.difficulty
            nan = np.isnan(diff)
            ids = ("\x00".join(map(str, self.ids)).encode() if self.ids.dtype == object
                   else arr(self.ids))
            self._cache["fp_parts"] = {
                "size": digest(str(len(self)).encode()),
                "domains": digest(json.dumps([str(x) for x in self.domain_names]).encode(), arr(self.domains)),
                "clusters": digest(json.dumps([str(x) for x in self.cluster_names]).encode(), arr(self.clusters)),
                "ranks": digest(arr(self.ranks)),
                # NaN (unknown) by mask: NaN payload bits are not part of the pool's identity
                "difficulty": digest(arr(nan), arr(np.where(nan, 0.0, diff))),
                "ids": digest(str(self.ids.dtype.kind).encode(), ids),
            }
            if self.features is not None:
                # Only when given, so pools without features keep their fingerprints.
                self._cache["fp_parts"]["features"] = _features_digest(self.features)
            if not self.labeled.all():
                # Only when some prompt is unlabelled, so older checkpoints keep loading.
                self._cache["fp_parts"]["labeled"] = digest(arr(self.labeled))
        return dict(self._cache["fp_parts"])

    def fingerprint(self) -> str:
        """A short hash of what identifies the pool (size, domain and cluster labels,
        ranks, difficulty, ids), stored in checkpoints so that state is never restored onto
        a different pool — a re-ranked pool, for instance, would make ADS propose other
        prompts. `fingerprint_parts()` holds the hash of each part."""
        if "fp" not in self._cache:
            parts = self.fingerprint_parts()
            self._cache["fp"] = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]
        return self._cache["fp"]

    def index_of(self, ids: Sequence) -> np.ndarray:
        """int64 pool positions of the given stable ids; ValueError naming unknown ids."""
        if "id_map" not in self._cache:
            keys = self.ids.tolist()
            self._cache["id_map"] = {k: i for i, k in enumerate(keys)}
        m = self._cache["id_map"]
        out = np.empty(len(ids), dtype=np.int64)
        missing = []
        for j, k in enumerate(ids):
            k = k.item() if hasattr(k, "item") else k
            pos = m.get(k)
            if pos is None:
                missing.append(k)
                pos = -1
            out[j] = pos
        if missing:
            raise InputError(f"{len(missing)} prompt ids are not in the pool (first: {missing[:5]}); "
                             f"feedback must use the pool's stable ids (extra_info.index).")
        return out

    # ---- loaders -----------------------------------------------------------------------
    @classmethod
    def from_records(cls, records: Sequence[dict], *, domain_key: str = "data_source",
                     id_key: str = "extra_info.index", cluster_key: str = "cluster_id",
                     rank_key: str = "rank_in_cluster", difficulty_key: str = "difficulty",
                     features: Any = None, labeled_key: str = "extra_info.labeled") -> "Pool":
        """Build from row dicts in the verl schema. Dotted keys reach into nested dicts
        (`extra_info.index`). Optional columns are used when every row has them; the
        cluster, rank and difficulty columns are also looked up inside `extra_info`.

        The stable id (`id_key`, default `extra_info.index`) is required in every row, as
        the verl adapter requires it: feedback, checkpoints and run records name prompts by
        it, and verl silently defaults a missing index to 0. `id_key=None` uses row
        positions 0..N-1 instead (they change when the file is filtered or reordered).

        `labeled_key` (default `extra_info.labeled`, TraPO's column) fills `Pool.labeled`
        when some row has it; a row without it, or with null, counts as labelled.

        >>> Pool.from_records([{"data_source": "a", "extra_info": {"index": 7}}]).ids.tolist()
        [7]
        >>> Pool.from_records([{"data_source": "a"}], id_key=None).ids.tolist()
        [0]
        """
        if len(records) == 0:
            raise InputError("the dataset has no rows: a pool needs at least one prompt.")

        def get(row, key):
            cur = row
            for part in key.split("."):
                if not isinstance(cur, dict) or part not in cur:
                    return _MISSING
                cur = cur[part]
            return cur

        def column(key, required):
            vals = [get(r, key) for r in records]
            if any(v is _MISSING for v in vals):
                alt = [get(r, "extra_info." + key) for r in records] if "." not in key else None
                if alt is not None and not any(v is _MISSING for v in alt):
                    return alt
                if required:
                    missing = [i for i, v in enumerate(vals) if v is _MISSING]
                    raise InputError(f"column {key!r} is missing in {len(missing)} rows (first rows: "
                                     f"{missing[:5]}); add it, or pass {key.split('.')[0]}_key=... "
                                     f"naming the column that holds it.")
                return None
            return vals

        domains = column(domain_key, required=True)
        ids = None
        if id_key is not None:
            ids = [get(r, id_key) for r in records]
            missing = [i for i, v in enumerate(ids) if v is _MISSING or v is None]
            if missing:
                raise InputError(
                    f"{id_key} is missing in {len(missing)} of {len(records)} rows (first rows: {missing[:5]}); "
                    f"rlpace names prompts by a stable id (verl would default a missing index to 0). Write a "
                    f"unique {id_key} per row (`rlpace prepare` adds one), pass id_key=... naming the column "
                    f"that holds it, or id_key=None to use row positions.")
        labeled = None
        if labeled_key is not None:
            flags = [get(r, labeled_key) for r in records]
            if any(v is not _MISSING and v is not None for v in flags):
                labeled = [True if v is _MISSING or v is None else v for v in flags]
                bad = [i for i, v in enumerate(labeled) if not isinstance(v, (bool, np.bool_))]
                if bad:
                    raise InputError(f"{labeled_key} must be true/false; row {bad[0]} has "
                                     f"{labeled[bad[0]]!r}.")
        return cls(domains, clusters=column(cluster_key, False), ranks=column(rank_key, False),
                   difficulty=column(difficulty_key, False), ids=ids, features=features,
                   labeled=labeled)

    @classmethod
    def from_jsonl(cls, path, **keys) -> "Pool":
        """Build from a JSON-lines file in the verl schema (see `from_records`)."""
        return cls.from_records(read_jsonl(path), **keys)

    @classmethod
    def from_parquet(cls, path, **keys) -> "Pool":
        """Build from a verl-schema parquet file (`data_source`, `extra_info.index`, ...).
        Needs pyarrow (`pip install pyarrow`)."""
        try:
            import pyarrow.parquet as pq
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError("Pool.from_parquet needs pyarrow: pip install pyarrow") from e
        table = pq.read_table(path)
        return cls.from_records(table.to_pylist(), **keys)


class _Missing:
    pass


_MISSING = _Missing()


# Feedback.step lies in [0, STEP_MAX): far beyond any trainer's step count, and small enough
# that step arithmetic (lags, differences, int64 history) cannot overflow.
STEP_MAX = 2**62
_INT64_MAX = np.iinfo(np.int64).max


def read_jsonl(path, error: type = InputError) -> list:
    """The JSON value of every non-blank line of a JSON-lines file, in order; a line that is
    not valid JSON raises `error` (an InputError; `rlpace.experiments.RecordError` for run
    records) naming the file and the line."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise error(f"{str(path)}: line {lineno} is not valid JSON ({e.msg}); fix or "
                                f"remove that line.") from None
    return rows


def _numeric(name: str, values: Any) -> np.ndarray:
    """`values` as an array of real numbers (bool, int or float), or a ValueError naming
    `Feedback.<name>` and the fix: numpy would otherwise parse strings as floats, drop the
    imaginary part of complex numbers, or fail on ragged rows with its own message."""
    try:
        raw = np.asarray(values)
    except (ValueError, TypeError) as e:
        raise InputError(f"Feedback.{name} could not be read as an array ({e}); rows of different "
                         f"lengths are not allowed: give every prompt the same number G of rollouts "
                         f"(one Feedback per G), as a numpy array or a list of equal-length lists.") from None
    kind = raw.dtype.kind
    if kind in "biuf":
        return raw
    if kind == "c":
        why = "complex numbers; pass real rewards (np.real(x) if the imaginary part is 0)"
    elif kind in "USa":
        why = "strings; convert them to numbers first (float(x))"
    else:
        why = (f"values of dtype {raw.dtype} (ragged rows, None, or non-numbers); give every prompt "
               f"the same number G of rollouts, as real numbers")
    raise InputError(f"Feedback.{name} holds {why}.")


def _feedback_ids(prompt_ids: Any) -> np.ndarray:
    """int64[B] pool positions, or a ValueError naming Feedback.prompt_ids and the fix."""
    ids = _numeric("prompt_ids", prompt_ids)
    if ids.ndim != 1:
        raise InputError(f"Feedback.prompt_ids must be 1-D [B]; got shape {ids.shape}.")
    if ids.size == 0:
        return np.zeros(0, np.int64)
    if ids.dtype.kind == "f":
        if not (np.all(np.isfinite(ids)) and np.all(ids == np.round(ids))):
            raise InputError(f"Feedback.prompt_ids must be integer pool positions; got dtype "
                             f"{ids.dtype} with non-integer values. Map stable ids with Pool.index_of(...).")
    elif ids.dtype.kind not in "iu":
        raise InputError(f"Feedback.prompt_ids must be integer pool positions; got dtype "
                         f"{ids.dtype}. Map stable ids with Pool.index_of(...).")
    if ids.dtype.kind == "i":
        # Signed integers (the common int64 case): none exceeds the int64 range, so one
        # reduction checks them; the scans below only run to name the first bad value.
        if ids.min() >= 0:
            return ids.astype(np.int64)     # astype copies, also when ids already is int64
    # Range before the cast: 1e20 or uint64 2**63 would wrap to negative int64 values.
    too_big = ids >= 2.0**63 if ids.dtype.kind == "f" else ids > _INT64_MAX
    if too_big.any():
        raise InputError(f"Feedback.prompt_ids has values beyond the int64 range (first: "
                         f"{ids[too_big][0]!r}); ids are pool positions 0..N-1 (map stable ids with "
                         f"Pool.index_of(...)).")
    if (ids < 0).any():
        raise InputError(f"Feedback.prompt_ids has negative values (first: {ids[ids < 0][0]!r}); "
                         f"ids are pool positions 0..N-1.")
    return ids.astype(np.int64)         # astype copies, also when ids already is int64


def _feedback_step(step: Any) -> int:
    """`step` as a Python int in [0, STEP_MAX), or a ValueError naming Feedback.step."""
    if isinstance(step, (bool, np.bool_)) or isinstance(step, (float, np.floating, str, bytes)):
        raise InputError(f"Feedback.step must be an int in [0, 2**62); got {step!r} "
                         f"({type(step).__name__}). Pass the trainer's integer step.")
    try:
        step_i = operator.index(step)   # int, numpy integers, 0-d integer arrays and tensors
    except TypeError:
        raise InputError(f"Feedback.step must be an int in [0, 2**62); got {step!r} "
                         f"({type(step).__name__}). Pass the trainer's integer step.") from None
    if not 0 <= step_i < STEP_MAX:
        raise InputError(f"Feedback.step must be in [0, 2**62); got {step_i}. Pass the trainer's "
                         f"step count (0 for the first step).")
    return int(step_i)


def _feedback_lengths(values: Any, shape: tuple) -> np.ndarray:
    """int64[B, G] response lengths (a copy), or a ValueError naming Feedback.lengths."""
    arr = np.array(_numeric("lengths", values))
    if arr.shape != shape and not (arr.size == 0 and shape[0] == 0):
        raise InputError(f"Feedback.lengths has shape {arr.shape} but rewards has {shape}; give one "
                         f"response length (in tokens) per rollout.")
    if arr.dtype.kind == "f" and not (np.isfinite(arr).all() and (arr == np.round(arr)).all()):
        raise InputError("Feedback.lengths must be whole numbers of tokens; got non-integer values.")
    if arr.dtype.kind == "b":
        raise InputError("Feedback.lengths must be integers (tokens per response); got booleans.")
    # a min and a max decide what the elementwise test would (no [B, G] temporaries); the mask
    # is built only to name the first bad value
    if arr.size and (arr.min() < 0 or arr.max() >= 2.0**62):
        bad = (arr < 0) | (arr >= 2.0**62)
        raise InputError(f"Feedback.lengths must be non-negative integers (tokens per response) below "
                         f"2**62; got {arr[bad][0]!r}.")
    return arr.astype(np.int64, copy=False).reshape(shape)      # arr is this record's own copy


def _feedback_group_sizes(values: Any, shape: tuple) -> np.ndarray | None:
    """int64[B] rollouts of each group in [0, G] (a copy), None when every group is full, or a
    ValueError naming Feedback.group_sizes."""
    arr = _numeric("group_sizes", values)
    if arr.ndim != 1 or arr.shape[0] != shape[0]:
        raise InputError(f"Feedback.group_sizes must be int[B] with B = {shape[0]} (one rollout count per "
                         f"prompt); got shape {arr.shape}.")
    if arr.dtype.kind == "b" or (arr.dtype.kind == "f" and not (np.isfinite(arr).all()
                                                                 and (arr == np.round(arr)).all())):
        raise InputError(f"Feedback.group_sizes must be whole numbers of rollouts; got {arr.dtype} values.")
    g = shape[1] if len(shape) > 1 else 0
    bad = (arr < 0) | (arr > g)
    if bad.any():
        raise InputError(f"Feedback.group_sizes must be in [0, G] with G = {g} (the rewards' columns); got "
                         f"{arr[bad][0]!r}. Row i's rollouts are rewards[i, :group_sizes[i]].")
    arr = arr.astype(np.int64)
    return None if (arr == g).all() else arr


def _feedback_answers(values: Any, shape: tuple) -> np.ndarray:
    """object[B, G] of str / None (a copy), or a ValueError naming Feedback.answers."""
    if isinstance(values, (str, bytes)):
        rows = None
    elif isinstance(values, np.ndarray) and values.ndim == 2 and values.dtype.kind in "OU":
        if (values.shape == shape and values.dtype.kind == "O"
                and set(map(type, values.ravel().tolist())) <= {str, type(None)}):
            return values.copy()    # already object[B, G] of str / None: one C-level check, a copy
        rows = values.tolist()      # one C-level pass (iterating the rows of an array is slow)
    else:
        try:
            rows = [None if isinstance(r, (str, bytes)) else list(r) for r in values]
        except TypeError:
            rows = None
    if rows is None or any(r is None for r in rows):
        raise InputError(f"Feedback.answers must be [B, G] = {list(shape)} extracted answers (a list of "
                         f"rows of str, or None where none was extracted); got {type(values).__name__}.")
    if len(rows) != shape[0] or any(len(r) != shape[1] for r in rows):
        raise InputError(f"Feedback.answers must have the rewards' shape {shape} (one answer per "
                         f"rollout); got {len(rows)} rows of lengths {sorted({len(r) for r in rows})}.")
    flat = list(itertools.chain.from_iterable(rows))
    if set(map(type, flat)) <= {str, type(None)}:
        # every answer a str or None: checked with one C-level pass, no conversion needed
        arr = np.empty(len(flat), dtype=object)
        arr[:] = flat
        return arr.reshape(shape)
    arr = np.empty(shape, dtype=object)
    for i, r in enumerate(rows):
        for j, a in enumerate(r):
            if a is not None and not isinstance(a, str):
                raise InputError(f"Feedback.answers[{i}][{j}] is {type(a).__name__} {a!r}; answers are "
                                 f"str (the extracted final answer) or None (no answer extracted).")
            arr[i, j] = None if a is None else str(a)    # np.str_ → str
    return arr


def _feedback_stat(name: str, values: Any, shape: tuple, low: float | None = None,
                   high: float | None = None) -> np.ndarray:
    """float64[B, G] per-rollout token statistic (a copy), or a ValueError naming Feedback.<name>."""
    arr = np.array(_numeric(name, values), dtype=np.float64)
    if arr.shape != shape and not (arr.size == 0 and shape[0] == 0):
        raise InputError(f"Feedback.{name} has shape {arr.shape} but rewards has {shape}; give one "
                         f"value per rollout (the mean over its valid response tokens).")
    arr = arr.reshape(shape)
    if not np.isfinite(arr).all():
        bad = np.argwhere(~np.isfinite(arr))[0].tolist()
        raise InputError(f"Feedback.{name} has NaN or inf values (first at {bad}); a rollout with no "
                         f"valid token has no {name}: drop it or pass 0.")
    wrong = np.zeros(shape, bool)
    if low is not None:
        wrong |= arr < low
    if high is not None:
        wrong |= arr > high
    if wrong.any():
        bound = f"≥ {low:g}" if low is not None else f"≤ {high:g}"
        raise InputError(f"Feedback.{name} must be {bound}; got {arr[wrong][0]!r}.")
    return arr


def _feedback_grads(values: Any, shape: tuple) -> tuple[np.ndarray, np.ndarray]:
    """(float32[B, G, d] per-rollout gradient features (a copy; a read-only view of a float32
    array that is itself read-only), float64[B, d] each group's sum of them), or a ValueError
    naming Feedback.grads.

    The group sums are the check: G float32 values add up to a finite float64 (|sum| ≤
    G·3.4e38) unless one of them is NaN or ±inf, which makes its group's sum NaN or ±inf. So one
    pass over [B, G, d] validates the features and gives the group gradient features that
    group-level readers need (`Feedback.grad_sums`, `group_grad_sums`)."""
    raw = _numeric("grads", values)
    if raw.dtype == np.float32 and not raw.flags.writeable:
        # marked read-only by the caller (rlpace's trainer and TRL adapter mark theirs): its
        # promise not to write that memory while the Feedback is in use; no copy of [B, G, d]
        arr = raw.view()
    else:
        # float32 input (the trainers') is checked as float32: no float64 copy of [B, G, d]
        arr = np.array(raw, dtype=np.float32 if raw.dtype == np.float32 else np.float64)
    if shape[0] == 0 and arr.size == 0:
        d = arr.shape[-1] if arr.ndim == 3 else 0
        return np.zeros((0, shape[1], d), np.float32), np.zeros((0, d))
    if arr.ndim != 3 or arr.shape[:2] != shape or arr.shape[2] == 0:
        raise InputError(f"Feedback.grads has shape {arr.shape} but must be [B, G, d] = [{shape[0]}, "
                         f"{shape[1]}, d ≥ 1] (rewards has {shape}): one d-dim gradient feature per "
                         f"rollout (rlpace.train.gradfeatures computes them).")
    top = np.finfo(np.float32).max
    if arr.dtype != np.float32:
        # float32 storage: values beyond its range (±3.4e38) would become inf, so they are refused
        # (NaN and ±inf fail the comparison too): min and max propagate NaN, so both bounds hold
        # exactly when every |value| ≤ the float32 maximum
        if not (arr.min() >= -top and arr.max() <= top):
            _bad_grads(arr, top)
        arr = arr.astype(np.float32)
    # each group's rollouts added in order in float64; finite exactly when every value is
    sums = np.einsum("bgd->bd", arr, dtype=np.float64)
    if not np.isfinite(sums).all():
        _bad_grads(arr, top)
    return arr, sums


def _bad_grads(arr: np.ndarray, top: float):
    bad = np.argwhere(~(np.abs(arr) <= top))[0].tolist()
    raise InputError(f"Feedback.grads has NaN, inf or values beyond float32 range (first at {bad}); "
                     f"check the loss for overflow or drop those rollouts.")


def _feedback_ref_grad(values: Any, grads: np.ndarray | None) -> np.ndarray:
    """float32[d] reference direction (a copy), or a ValueError naming Feedback.ref_grad."""
    arr = np.array(_numeric("ref_grad", values), dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise InputError(f"Feedback.ref_grad must be 1-D [d] with d ≥ 1 (a gradient feature of a "
                         f"held-out loss, projected like Feedback.grads); got shape {arr.shape}.")
    if grads is not None and grads.shape[2] not in (0, arr.shape[0]):
        raise InputError(f"Feedback.ref_grad has d = {arr.shape[0]} but Feedback.grads has d = "
                         f"{grads.shape[2]}; project both with the same sketch (same grad_dim and seed).")
    if not (np.abs(arr) <= np.finfo(np.float32).max).all():
        raise InputError("Feedback.ref_grad has NaN, inf or values beyond float32 range; recompute the "
                         "reference gradient.")
    return arr.astype(np.float32)


def _finite_2d(name: str, values: Any, b: int) -> np.ndarray:
    # np.array copies: a Feedback never shares memory with the caller's arrays, so changing
    # them after construction cannot bypass this validation (stored read-only, see Feedback).
    arr = np.array(_numeric(name, values), dtype=np.float64)
    if b == 0 and arr.size == 0:
        return arr.reshape(0, arr.shape[-1] if arr.ndim == 2 else 0)
    if arr.ndim != 2:
        raise InputError(f"Feedback.{name} must be 2-D [B, G] (one row per prompt, one column per "
                         f"rollout); got shape {arr.shape}. Reshape to (len(prompt_ids), G).")
    if arr.shape[0] != b:
        raise InputError(f"Feedback.{name} has {arr.shape[0]} rows but prompt_ids has {b} entries; "
                         f"give one row of rollouts per prompt id.")
    if arr.shape[1] == 0:
        raise InputError(f"Feedback.{name} has G = 0 rollouts per prompt; each prompt needs at "
                         f"least one rollout (drop prompts that got none).")
    if not np.isfinite(arr).all():
        bad = np.argwhere(~np.isfinite(arr))[0].tolist()
        raise InputError(f"Feedback.{name} has NaN or inf values (first at [{bad[0]}, {bad[1]}]); "
                         f"fix the reward function or drop those rollouts.")
    return arr


class _Required:
    """The default of an argument that must be given (shown as `<required>` in signatures)."""

    def __repr__(self) -> str:
        return "<required>"


_REQUIRED: Any = _Required()


@dataclass(frozen=True, init=False)
class Feedback:
    """One training step's outcome, as a trainer or adapter reports it.

    Attributes:
        prompt_ids: int64[B] pool positions of the prompts that were rolled out.
        rewards: float64[B, G] reward of each of the G rollouts of each prompt.
        advantages: float64[B, G] or None — advantages as the trainer computed them; when
            None, policies that need them use GRPO group-normalised advantages of `rewards`.
        step: int — the trainer step the rollouts were generated at (for recency and lag).
            Required (a TypeError when left out): a default of 0 would make every prompt look
            as if last seen at step 0 and silently zero the recency that policies read.
        lengths: int64[B, G] or None — response length of each rollout in tokens (GFPO's
            reward per token, docs/methods/gfpo.md); None when the trainer does not report it.
        grads: float32[B, G, d] or None — per-rollout gradient features: the gradient of
            rollout (i, j)'s term of the policy-gradient loss, restricted to a parameter subset
            and/or projected to d dims by a seeded random sketch
            (`rlpace.train.gradfeatures`); rows sum to the batch gradient's feature. Read
            by gradient-informed policies (`diem`, `dvc`); others ignore it.
        ref_grad: float32[d] or None — a reference direction in the same feature space,
            e.g. the gradient of a held-out loss refreshed every k steps (`diem`, `dvc`).
        answers: object[B, G] or None — the final answer extracted from each rollout, a str,
            or None where no answer was extracted; the target place (`ttrl`, `olr`, `trapo`)
            votes over them. rlpace compares answers by exact string equality after
            `.strip()` (an empty string counts as no answer): trainers normalise answers
            (e.g. the content of the last boxed expression) before passing them. Read-only.
        token_entropy: float64[B, G] or None — mean over each rollout's valid response tokens
            of the entropy H(p_t) of the sampling distribution (nats), ≥ 0 (`entropy_min`).
        self_certainty: float64[B, G] or None — mean over valid response tokens of
            KL(U ‖ p_t) = logsumexp(z_t) − mean_j z_t,j − log V for logits z_t over a vocabulary
            of V (Intuitor, arXiv 2505.19590; `self_certainty`).
        mean_logprob: float64[B, G] or None — mean over valid response tokens of the sampled
            token's log-probability log π(y_t), ≤ 0 (`entropy_min` with level="sequence").
        group_sizes: int64[B] or None — ragged groups (an allocation policy gave prompt i
            N_i rollouts, `Scheduler.allocate`): row i's rollouts are the first
            `group_sizes[i]` columns of every [B, G] field, G = max N_i; the columns after them
            are padding that nothing reads. 0 is a prompt that got no rollouts. None (also
            when every size equals G) is the rectangular batch. The Scheduler hands a ragged
            batch to the policies as one rectangular group per size (`by_size`), so every
            policy reads full groups only; what it returns is scattered back to [B, G] with
            padding False / 0 (docs/methods/knapsack.md, "Variable group sizes").

    Validation (each a ValueError naming the field and the fix): ids must be non-negative
    integers (integral floats are accepted) within int64; rewards and advantages real
    numbers (bool, int or float — not strings, complex numbers or ragged rows), 2-D with
    G ≥ 1 and finite, advantages of the rewards' shape; step a Python or numpy integer
    (not bool, float or str) in [0, 2**62); lengths non-negative integers of the rewards'
    shape; grads real and finite within float32 range, of shape [B, G, d ≥ 1]; ref_grad
    the same, of shape [d] (grads' d when both are given); answers of shape [B, G] holding
    str or None; token_entropy finite ≥ 0, self_certainty finite, mean_logprob finite ≤ 0, each
    of the rewards' shape. An empty batch (B = 0) is valid and is a no-op
    for the Scheduler. Range of ids is checked by the Scheduler against its pool.

    The arrays are copies, stored read-only: changing the caller's arrays after
    construction cannot bypass this validation, and a policy cannot write into them. One
    exception, for speed: `grads` given as a float32 array that is already read-only
    (`flags.writeable` False) is kept as a read-only view, not copied (2 MB a step at
    B = 512, G = 16, d = 64) — marking the array read-only is the caller's promise not to
    write its memory while the Feedback is in use; rlpace's trainer and TRL adapter mark the
    features they pass. A writeable array is copied as before.

    >>> r = np.array([[1.0, 0.0]]); fb = Feedback([0], r, step=2)
    >>> r[0, 0] = np.nan; fb.rewards.tolist(), fb.rewards.flags.writeable
    ([[1.0, 0.0]], False)
    """

    prompt_ids: np.ndarray
    rewards: np.ndarray
    advantages: np.ndarray | None = None
    step: int = None  # type: ignore[assignment]   # required: see `__init__`
    lengths: np.ndarray | None = None
    grads: np.ndarray | None = None
    ref_grad: np.ndarray | None = None
    answers: np.ndarray | None = None
    token_entropy: np.ndarray | None = None
    self_certainty: np.ndarray | None = None
    mean_logprob: np.ndarray | None = None
    group_sizes: np.ndarray | None = None

    def __init__(self, prompt_ids, rewards, advantages=None, step: int = _REQUIRED, lengths=None,
                 grads=None, ref_grad=None, answers=None, token_entropy=None, self_certainty=None,
                 mean_logprob=None, group_sizes=None):
        if step is _REQUIRED:
            raise TypeError("Feedback needs step=: the trainer step the rollouts were generated at "
                            "(History.last_step and every recency or lag rule read it). Pass the step "
                            "counter of the trainer, e.g. Feedback(ids, rewards, step=global_step).")
        step_i = _feedback_step(step)       # first: checks never depend on a bad step
        ids = _feedback_ids(prompt_ids)
        b = ids.shape[0]
        rew = _finite_2d("rewards", rewards, b)
        adv = None
        if advantages is not None:
            adv = _finite_2d("advantages", advantages, b)
            if adv.shape != rew.shape:
                raise InputError(f"Feedback.advantages has shape {adv.shape} but rewards has "
                                 f"{rew.shape}; give one advantage per rollout.")
        lens = None if lengths is None else _feedback_lengths(lengths, rew.shape)
        grd, gsum = (None, None) if grads is None else _feedback_grads(grads, rew.shape)
        ref = None if ref_grad is None else _feedback_ref_grad(ref_grad, grd)
        ans = None if answers is None else _feedback_answers(answers, rew.shape)
        ent = None if token_entropy is None else _feedback_stat("token_entropy", token_entropy, rew.shape,
                                                                low=0.0)
        sc = None if self_certainty is None else _feedback_stat("self_certainty", self_certainty, rew.shape)
        mlp = None if mean_logprob is None else _feedback_stat("mean_logprob", mean_logprob, rew.shape,
                                                               high=0.0)
        sizes = None if group_sizes is None else _feedback_group_sizes(group_sizes, rew.shape)
        for arr in (ids, rew, adv, lens, grd, ref, ans, ent, sc, mlp, sizes, gsum):
            if arr is not None:
                arr.setflags(write=False)
        # one write of the frozen record's fields (object.__setattr__ per field costs ~12 calls)
        self.__dict__.update(prompt_ids=ids, rewards=rew, advantages=adv, step=step_i, lengths=lens,
                             grads=grd, ref_grad=ref, answers=ans, token_entropy=ent, self_certainty=sc,
                             mean_logprob=mlp, group_sizes=sizes)
        if gsum is not None and sizes is None:
            self.__dict__["_grad_sums"] = gsum       # `grad_sums`, from the validating pass

    def with_grads(self, grads, ref_grad=None) -> "Feedback":
        """This Feedback with `grads` (and `ref_grad`, None to leave it out) attached, the two
        validated as the constructor validates them (ValueError naming the field; this record
        is unchanged) and every other field shared — its arrays are validated and read-only
        already. What a trainer calls once the step's gradient features exist: rebuilding the
        whole record would check the ids, rewards, advantages and lengths a second time.

        >>> fb = Feedback([3], [[1.0, 0.0]], step=5).with_grads(np.ones((1, 2, 4)))
        >>> fb.grads.shape, fb.grads.dtype, fb.step, fb.ref_grad
        ((1, 2, 4), dtype('float32'), 5, None)
        """
        grd, gsum = _feedback_grads(grads, self.rewards.shape)
        ref = None if ref_grad is None else _feedback_ref_grad(ref_grad, grd)
        fields = {f.name: getattr(self, f.name) for f in dataclass_fields(self)}
        out = Feedback._from_validated(**{**fields, "grads": grd, "ref_grad": ref})
        if self.group_sizes is None:
            gsum.setflags(write=False)
            object.__setattr__(out, "_grad_sums", gsum)
        return out

    @classmethod
    def _from_validated(cls, **fields) -> "Feedback":
        """A Feedback assembled from arrays that already passed this class's validation (row
        subsets of validated Feedbacks: `rlpace.train.gradfeatures.split_with_grads`), stored
        read-only, without checking them again; fields not given are None. TypeError for a
        name that is not a field."""
        unknown = set(fields) - {f.name for f in dataclass_fields(cls)}
        if unknown:
            raise TypeError(f"Feedback has no fields {sorted(unknown)}.")
        out = object.__new__(cls)
        for f in dataclass_fields(cls):
            v = fields.get(f.name)
            if isinstance(v, np.ndarray):
                v.setflags(write=False)
            object.__setattr__(out, f.name, v)
        return out

    def by_size(self) -> list[tuple[np.ndarray, "Feedback"]]:
        """[(rows int64[b], Feedback with b full groups of size n)] for each group size n > 0
        present, in increasing n: the ragged batch as rectangular ones (rows with
        `group_sizes == 0` are left out: they have no rollouts). A rectangular Feedback gives
        [(arange(B), self)]. Rows keep their batch order within each size.

        >>> fb = Feedback([4, 5, 6], [[1, 0, 1], [1, 9, 9], [0, 0, 9]], step=0, group_sizes=[3, 1, 2])
        >>> [(rows.tolist(), f.rewards.tolist()) for rows, f in fb.by_size()]
        [([1], [[1.0]]), ([2], [[0.0, 0.0]]), ([0], [[1.0, 0.0, 1.0]])]
        """
        if self.group_sizes is None:
            return [(np.arange(self.prompt_ids.shape[0], dtype=np.int64), self)]
        cached = self.__dict__.get("_by_size")      # the record is immutable: split once
        if cached is not None:
            return list(cached)
        out = []
        per_rollout = ("rewards", "advantages", "lengths", "grads", "answers", "token_entropy",
                       "self_certainty", "mean_logprob")
        for n in np.unique(self.group_sizes):
            if n == 0:
                continue
            rows = np.flatnonzero(self.group_sizes == n).astype(np.int64)
            fields = {"prompt_ids": self.prompt_ids[rows], "step": self.step, "ref_grad": self.ref_grad}
            for name in per_rollout:
                v = getattr(self, name)
                fields[name] = None if v is None else np.array(v[rows, :int(n)])
            out.append((rows, Feedback._from_validated(**fields)))
        object.__setattr__(self, "_by_size", tuple(out))
        return out

    @property
    def answer_votes(self):
        """`rlpace.stats._votes.AnswerVotes` over this record's `answers` (None without
        answers): derived from them, factorised on first use and kept with this record (it is
        immutable), so every voter reading this Feedback — the target place in
        `Scheduler.targets`, the history in `observe` — votes its answers once. Another
        Feedback, even over equal answers, has its own."""
        votes = self.__dict__.get("_answer_votes")
        if votes is None and self.answers is not None:
            votes = AnswerVotes(self.answers)
            object.__setattr__(self, "_answer_votes", votes)
        return votes

    @property
    def grad_sums(self) -> np.ndarray | None:
        """float64[B, d] or None — each group's gradient feature Σ_j grads[i, j], the rollouts
        added in order in float64. Derived from the same pass that validates `grads` and kept
        with this record (it is immutable), so a group-level reader (`diem` with
        unit="prompt") does not pass over [B, G, d] again; computed on first use for records
        assembled from validated parts. None without grads, and for ragged feedback (its
        columns after `group_sizes[i]` are padding: each part of `by_size` has its own).

        >>> Feedback([3], [[1.0, 0.0]], step=0, grads=[[[1.0, 2.0], [0.5, -2.0]]]).grad_sums.tolist()
        [[1.5, 0.0]]
        """
        if self.grads is None or self.group_sizes is not None:
            return None
        sums = self.__dict__.get("_grad_sums")
        if sums is None:
            sums = np.einsum("bgd->bd", self.grads, dtype=np.float64)
            sums.setflags(write=False)
            object.__setattr__(self, "_grad_sums", sums)
        return sums

    @property
    def batch_size(self) -> int:
        return int(self.prompt_ids.shape[0])

    @property
    def group_size(self) -> int:
        return int(self.rewards.shape[1]) if self.rewards.ndim == 2 else 0


class Batch(NamedTuple):
    """Feedback as policies read it: validated, with derived per-rollout fields.

    Built once per call by the Scheduler (`Batch.from_feedback`), so every policy reads
    the same success threshold and the same advantages.
    """

    prompt_ids: np.ndarray  # int64[B]       pool positions
    rewards: np.ndarray     # float64[B, G]  raw rewards
    success: np.ndarray     # bool[B, G]     reward >= success_threshold
    pass_rate: np.ndarray   # float64[B]     mean of success over the group
    advantages: np.ndarray  # float64[B, G]  given, or GRPO group-normalised rewards
    domains: np.ndarray     # int64[B]       domain code of each prompt
    clusters: np.ndarray    # int64[B]       cluster code of each prompt
    step: int               # trainer step of the rollouts
    lengths: np.ndarray | None = None      # int64[B, G]    response lengths (Feedback.lengths)
    # Only inside `Scheduler.token_weights` (None elsewhere): the sampling policy's token
    # probabilities π_old(o_t) and which tokens are real (docs/methods/ar.md).
    token_probs: np.ndarray | None = None  # float64[B, G, T] in [0, 1]
    token_mask: np.ndarray | None = None   # bool[B, G, T]
    grads: np.ndarray | None = None        # float32[B, G, d] per-rollout gradient features (Feedback.grads)
    ref_grad: np.ndarray | None = None     # float32[d] reference direction (Feedback.ref_grad)
    answers: np.ndarray | None = None      # object[B, G] str | None extracted answers (Feedback.answers)
    token_entropy: np.ndarray | None = None   # float64[B, G] mean token entropy (nats)
    self_certainty: np.ndarray | None = None  # float64[B, G] mean KL(U ‖ p_t)
    mean_logprob: np.ndarray | None = None    # float64[B, G] mean log π(y_t) of the sampled tokens
    answer_votes: Any = None                  # AnswerVotes over `answers`, computed once (Feedback.answer_votes)
    #: float64[B] each group's mean of min(|A|, SIGNAL_MAX) (the learnability signal SEC, EXP3 and
    #: DVC read through `group_mean_abs_advantage`), derived once per batch; None where the batch
    #: was built for a method none of whose policies reads it (`DataPolicy.batch_reads`)
    mean_abs_advantage: np.ndarray | None = None
    #: float64[B, G] min(|A|, SIGNAL_MAX) of each rollout (DUMP's window entries, read through
    #: `rollout_abs_advantages`), derived once per batch; None where no policy reads it
    abs_advantages: np.ndarray | None = None
    #: [B] str | None: what the target place decided for this visit (`Targets.labels`), handed
    #: by `Scheduler.observe` to the updates of the same Feedback (from its `targets` call, or
    #: from observe's own call for the decision log) so an update need not decide again; None
    #: elsewhere
    targets: list | None = None
    #: float64[B, d] each group's Σ_j grads[i, j] as its Feedback derived it while validating the
    #: features (`Feedback.grad_sums`), read through `group_grad_sums`; None where not derived
    grad_sums: np.ndarray | None = None

    @property
    def informative(self) -> np.ndarray:
        """bool[B]: the group carries GRPO signal (some advantage is non-zero)."""
        return informative_groups(self.advantages)

    @staticmethod
    def from_feedback(fb: Feedback, pool: Pool, success_threshold: float) -> "Batch":
        return _batch_and_counts(fb, pool, success_threshold)[0]


def _batch_and_counts(fb: Feedback, pool: Pool, success_threshold: float,
                      fields: frozenset | None = None) -> tuple[Batch, np.ndarray, np.ndarray]:
    """(`Batch`, wins int64[B] successes per group, informative bool[B]) — what
    `Batch.from_feedback` and the Scheduler's history need, each computed once.

    `fields` (`Scheduler.observe`: the union of its updating policies' `DataPolicy.batch_reads`)
    names the derived fields only policies read that this batch needs, among BATCH_DERIVED
    ("clusters", "advantages", "mean_abs_advantage", "abs_advantages"); None (the default)
    builds BATCH_FULL, the clusters and the advantages: what any policy may read directly
    (the group means and |A| are shortcuts read through `group_mean_abs_advantage` and
    `rollout_abs_advantages`, which compute them from the advantages when they are None).
    A field left out is None, except the advantages of a non-binary batch (the informative
    flags are read from them). `fields=frozenset()` is what `observe` of a method none of
    whose places reads the batch there asks for (`uniform`, `fixed_mixture`, `epiplexity`).

    The mean |A| of a binary group with G a power of two ≤ 16 is read from a table over its
    2^G success patterns (`_binary_mean_abs_table`), each entry the plain formula of that
    pattern's row: the row's bit pattern comes from the same matrix product as its count.

    Exactly the values of the plain formulas (`success.sum(axis=1)`, `success.mean(axis=1)`,
    `group_advantages(rewards)`, `Batch.informative`), bit for bit, computed faster:
    row reductions over G columns cost ~10 μs each in numpy, so counts come from a
    matrix-vector product (exact: sums of 0/1 values), and for binary rewards
    (every reward 0 or 1) the advantages and the informative flag follow from the count
    k of each group (see `_binary_advantage_table`).
    """
    want = BATCH_FULL if fields is None else fields
    r = fb.rewards
    success = r >= success_threshold
    b = r.shape[0]
    domains = pool.domains[fb.prompt_ids]
    clusters = pool.clusters[fb.prompt_ids] if "clusters" in want else None
    # read-only like the Feedback's arrays: the Scheduler queues success and domains for its
    # metrics window (`Scheduler.domain_window`), so no policy may write into them
    for a in (success, domains, clusters):
        if a is not None:
            a.setflags(write=False)
    if b == 0:
        adv = fb.advantages if fb.advantages is not None else group_advantages(r)
        mean_abs = np.zeros(0) if "mean_abs_advantage" in want else None
        abs_adv = abs_signal(adv) if "abs_advantages" in want else None
        return (_batch(fb, r, success, np.zeros(0), adv, domains, clusters, mean_abs, abs_adv),
                np.zeros(0, np.int64), np.zeros(0, bool))
    g = r.shape[1]
    # r == success (as 0/1) everywhere ⟺ every reward is 0 or 1; then success ⟺ r == 1
    # whatever the threshold, so the count of successes is the row sum of r.
    binary = fb.advantages is None and bool((r == success).all())
    table = _binary_advantage_table(g) if binary else None
    mean_table = _binary_mean_abs_table(g) if table is not None and "mean_abs_advantage" in want else None
    pattern = None
    if mean_table is not None:
        # [B, 2]: each row's count of successes and its bit pattern Σ_j s_j·2^j, both exact
        # (integers below 2^16); one product, about the cost of the count's alone
        both = r @ _count_and_pattern_weights(g)
        wins, pattern = both[:, 0], both[:, 1].astype(np.intp)
    else:
        wins = (r if binary else success.astype(np.float64)) @ np.ones(g)   # see _success_counts
    rate = wins / g                                   # = success.mean(axis=1), same division
    wins = wins.astype(np.int64)
    # the signed advantages: asked for, or what an asked-for field is computed from
    need_adv = ("advantages" in want or ("mean_abs_advantage" in want and mean_table is None)
                or ("abs_advantages" in want and table is None))
    index = None
    if table is not None and (need_adv or "abs_advantages" in want):
        # pairs[2k + s]: the advantage of a failure (s = 0) / success (s = 1) in a group with k
        # successes; one gather over [B, G] (np.where with broadcast [B, 1] rows costs 2.5×).
        # The index 2k + s ≤ 2G + 1 is built in uint8 where it fits (half the cost of int64).
        if g < 127:
            index = np.add(success.view(np.uint8), (2 * wins).astype(np.uint8)[:, None])
        else:
            index = success + (2 * wins)[:, None]
    if binary and not need_adv:
        adv = None                                    # no reader (docstring)
    elif table is not None:
        adv = table[2].take(index)
    else:
        adv = fb.advantages if fb.advantages is not None else group_advantages(r)
    if binary:
        # 0 < k < G: the group's advantages are ±(≥ 1/G)/(std + eps), far above 1e-12.
        informative = _informative_counts(g).take(wins)     # (wins > 0) & (wins < g), one gather
    else:
        informative = informative_groups(adv)
    mean_abs = None
    if "mean_abs_advantage" in want:
        # the plain formula's arithmetic (row sum, then / G: `.mean(axis=1)`'s), or its table
        mean_abs = mean_table.take(pattern) if mean_table is not None else mean_abs_signal(adv)
        mean_abs.setflags(write=False)
    abs_adv = None
    if "abs_advantages" in want:
        # |pairs| capped, gathered with the same index: abs_signal(A) element for element
        abs_adv = _binary_abs_pairs(g).take(index) if table is not None else abs_signal(adv)
        abs_adv.setflags(write=False)
    return _batch(fb, r, success, rate, adv, domains, clusters, mean_abs, abs_adv), wins, informative


#: The fields of a `Batch` that only policies read, built on request (`_batch_and_counts`,
#: `DataPolicy.batch_reads`).
BATCH_DERIVED = frozenset({"clusters", "advantages", "mean_abs_advantage", "abs_advantages"})
#: What a batch holds when nothing narrower was asked for: the fields any policy may read
#: directly (the other two are shortcuts with a fallback on the advantages).
BATCH_FULL = frozenset({"clusters", "advantages"})


def rollout_abs_advantages(batch: Batch) -> np.ndarray:
    """float64[B, G] min(|A|, SIGNAL_MAX) of each rollout: the batch's derived
    `abs_advantages` when it was built with it, else `abs_signal(batch.advantages)` — the
    same numbers either way. A policy that reads it declares "abs_advantages" in
    `DataPolicy.batch_reads`.

    >>> import numpy as np
    >>> b = Batch(np.array([0]), None, None, None, np.array([[1.0, -2.0, -1e300]]), None, None, 0)
    >>> rollout_abs_advantages(b).tolist()
    [[1.0, 2.0, 1e+100]]
    """
    return batch.abs_advantages if batch.abs_advantages is not None else abs_signal(batch.advantages)


def group_mean_abs_advantage(batch: Batch) -> np.ndarray:
    """float64[B] each group's mean of min(|A|, SIGNAL_MAX) over its G rollouts: the batch's
    derived `mean_abs_advantage` when it was built with it, else computed from
    `batch.advantages` (`abs_signal(A).sum(axis=1) / G`, `.mean(axis=1)`'s arithmetic) —
    the same numbers either way. A policy that reads it declares "mean_abs_advantage" in
    `DataPolicy.batch_reads`.

    >>> import numpy as np
    >>> b = Batch(np.array([0]), None, None, None, np.array([[1.0, -1.0, 0.5, 0.0]]), None, None, 0)
    >>> group_mean_abs_advantage(b).tolist()
    [0.625]
    """
    if batch.mean_abs_advantage is not None:
        return batch.mean_abs_advantage
    return mean_abs_signal(batch.advantages)


def mean_abs_signal(advantages: np.ndarray) -> np.ndarray:
    """float64[B] of float[B, G] advantages: each row's mean of min(|A|, SIGNAL_MAX), as the
    row sum divided by G (`.mean(axis=1)`'s own arithmetic) — the one formula behind the
    batch's `mean_abs_advantage`, its binary table and `group_mean_abs_advantage`."""
    return abs_signal(advantages).sum(axis=1) / advantages.shape[1]


def _batch(fb: Feedback, rewards, success, pass_rate, advantages, domains, clusters,
           mean_abs_advantage=None, abs_advantages=None) -> Batch:
    """The `Batch` of `fb` with its derived fields, every field by name."""
    return Batch(prompt_ids=fb.prompt_ids, rewards=rewards, success=success, pass_rate=pass_rate,
                 advantages=advantages, domains=domains, clusters=clusters, step=fb.step,
                 lengths=fb.lengths, grads=fb.grads, ref_grad=fb.ref_grad,
                 mean_abs_advantage=mean_abs_advantage, abs_advantages=abs_advantages,
                 grad_sums=fb.__dict__.get("_grad_sums"), **_supervision(fb))


def group_grad_sums(batch: Batch) -> np.ndarray:
    """float64[B, d] each group's gradient feature Σ_j grads[i, j], the rollouts added in order
    in float64: `batch.grad_sums` where its Feedback derived them while validating the features,
    else computed here the same way (the same numbers, bit for bit). Needs `batch.grads`; the
    result is read-only where it is the Feedback's.

    >>> b = Batch(np.array([0]), None, None, None, None, None, None, 0, grads=np.ones((1, 3, 2), np.float32))
    >>> group_grad_sums(b).tolist()
    [[3.0, 3.0]]
    """
    if batch.grad_sums is not None:
        return batch.grad_sums
    return np.einsum("bgd->bd", batch.grads, dtype=np.float64)


def _supervision(fb: Feedback) -> dict:
    """The supervision fields a Batch carries over from its Feedback (None when absent)."""
    return {"answers": fb.answers, "answer_votes": fb.answer_votes, "token_entropy": fb.token_entropy,
            "self_certainty": fb.self_certainty, "mean_logprob": fb.mean_logprob}


def _success_counts(success: np.ndarray) -> np.ndarray:
    """int64[B] successes per group of a bool[B, G] mask: `success.sum(axis=1)`, via a
    matrix-vector product (3× faster than numpy's row reduction for G ≈ 16; exact, as
    sums of 0/1 values below 2^53 are exact in any order)."""
    return (success.astype(np.float64) @ np.ones(success.shape[1])).astype(np.int64)


def group_wins(batch: Batch) -> np.ndarray:
    """float64[B] successes per group of a `Batch`: `_success_counts(batch.success)` as floats.
    When G is a power of two it is read back from `batch.pass_rate` (built as the float count
    / G, `_batch_and_counts`): dividing an integer below 2^53 by a power of two and multiplying
    back are both exact, so the product is the count bit for bit, in one multiply instead of
    a cast and a matrix product over [B, G]. A batch without a matching pass_rate (built by
    hand) is counted from its success mask."""
    g = batch.success.shape[1]
    rate = batch.pass_rate
    if g and not g & (g - 1) and isinstance(rate, np.ndarray) and rate.shape == batch.success.shape[:1]:
        return rate * g
    return _success_counts(batch.success).astype(np.float64)


@functools.lru_cache(maxsize=64)
def _informative_counts(g: int) -> np.ndarray:
    """bool[G + 1] read-only: a group of G 0/1 rewards with k successes carries signal
    (0 < k < G)."""
    k = np.arange(g + 1)
    out = (k > 0) & (k < g)
    out.setflags(write=False)
    return out


@functools.lru_cache(maxsize=64)
def _binary_advantage_table(g: int, eps: float = 1e-6
                            ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(up, down float64[G + 1], pairs float64[2(G + 1)]): the `group_advantages` of a success
    and of a failure in a group of G 0/1 rewards with k successes, bit for bit, when G is a
    power of two (else None: the caller uses `group_advantages`); pairs[2k + s] is down[k]
    (s = 0) or up[k] (s = 1), for one gather per batch.

    With G = 2^a every quantity in `group_advantages` is a dyadic rational with at most
    3a + 1 significant bits: the mean m = k/G, the centred values 1 − m and −m, their
    squares, and the sum of squares (G − k)·m² + k·(1 − m)². Floating point computes them
    exactly in any order, so the std below equals numpy's pairwise row sum to the bit, and
    each advantage is the same single division (1 − m)/(std + eps) or (0 − m)/(std + eps).
    """
    if g & (g - 1) or g > 1 << 16:
        return None
    k = np.arange(g + 1, dtype=np.float64)
    m = k / g                                             # the group mean, as r.sum() / g
    std = np.sqrt(((g - k) * m * m + k * (1.0 - m) * (1.0 - m)) / g)
    denom = std + eps
    spread = std > 0
    up = np.where(spread, (1.0 - m) / denom, 0.0)
    down = np.where(spread, (0.0 - m) / denom, 0.0)
    pairs = np.stack([down, up], axis=1).ravel()          # [2(G + 1)]: pairs[2k + s]
    for a in (up, down, pairs):
        a.setflags(write=False)
    return up, down, pairs


@functools.lru_cache(maxsize=8)
def _binary_mean_abs_table(g: int) -> np.ndarray | None:
    """float64[2^G] read-only: entry p is `abs_signal(A).sum(axis=1) / G` of the binary group
    whose rollout j succeeded iff bit j of p is set, A its advantages from
    `_binary_advantage_table` — the plain formula over that very row, so a batch's group reads
    the same number from here (`_batch_and_counts`). For G a power of two ≤ 16 (a 512 KB
    table at G = 16), else None. Built in blocks of 4,096 rows, each row reduced on its own
    as in any [B, G] batch."""
    table = _binary_advantage_table(g)
    if table is None or g > 16:
        return None
    out = np.empty(1 << g)
    for start in range(0, 1 << g, 4096):
        p = np.arange(start, min(start + 4096, 1 << g))
        bits = ((p[:, None] >> np.arange(g)) & 1).astype(bool)            # [rows, G] successes
        adv = table[2].take(bits + 2 * bits.sum(axis=1)[:, None])
        out[start:start + p.shape[0]] = mean_abs_signal(adv)
    out.setflags(write=False)
    return out


@functools.lru_cache(maxsize=64)
def _binary_abs_pairs(g: int) -> np.ndarray:
    """float64[2(G + 1)] read-only `abs_signal` of `_binary_advantage_table(g)`'s pairs: the
    capped |A| of a failure / success in a group with k successes, gathered like the pairs."""
    out = abs_signal(_binary_advantage_table(g)[2])
    out.setflags(write=False)
    return out


@functools.lru_cache(maxsize=8)
def _count_and_pattern_weights(g: int) -> np.ndarray:
    """float64[G, 2] read-only: columns 1 and 2^j, so `rewards @ W` of 0/1 rewards is each
    row's count of successes and its bit pattern (exact: integers below 2^53)."""
    w = np.stack([np.ones(g), np.ldexp(1.0, np.arange(g))], axis=1)
    w.setflags(write=False)
    return w


def informative_groups(advantages: np.ndarray) -> np.ndarray:
    """bool[B] of float[B, G] advantages: the group carries GRPO signal, some |A| > 1e-12
    (`Batch.informative`, the trainer's logged `informative_groups` share). Padding columns
    of ragged groups hold A = 0, and a group of N_i <= 1 has none. From group-normalised
    advantages this is "the rewards are not all equal" except for rewards that differ by less
    than ~1e-18 (A = d / (std + 1e-6)): those count as equal."""
    return np.abs(advantages).max(axis=1, initial=0.0) > 1e-12


def group_advantages(rewards: np.ndarray, eps: float = 1e-6, *, group_sizes=None, ddof: int = 0,
                     clip: float | None = None, leave_one_out: bool = False) -> np.ndarray:
    """GRPO advantages: A = (r − mean_group) / (std_group + eps), population std.

    Options (keyword-only; the defaults are the formula above, bit for bit):
        group_sizes: int[B] rollouts of each row (ragged groups, `Feedback.group_sizes`): row
            i's group is `rewards[i, :N_i]`; its mean and std are over those N_i only, and the
            padding columns get A = 0. A group of N_i = 1 gets A = 0 (no relative signal;
            verl's GRPO gives a singleton A = r instead) and N_i = 0 a row of zeros.
        ddof: 0 (population std, the default) or 1 (unbiased, N − 1: verl's and Knapsack
            RL's `torch.std`). With ddof = 1 a binary group of N with one success gets
            A = (1 − 1/N)/sqrt(1/N) ≈ sqrt(N): about 9.5 at N = 93.
        clip: clamp A to [−clip, clip] (Knapsack RL's `adv_clip_value=5.0`, which bounds the
            large advantages of rare successes in large groups); None (default) does not clip.
        leave_one_out: the RLOO baseline instead: A_j = r_j − mean_{k≠j} r_k
            = N/(N − 1)·(r_j − r̄), not divided by a std (`ddof` is then ignored); N = 1 gives 0.

    >>> group_advantages(np.array([[1.0, 0.0, 0.0, 9.0]]), group_sizes=[3], ddof=1).round(3).tolist()
    [[1.155, -0.577, -0.577, 0.0]]
    >>> group_advantages(np.array([[1.0, 0.0, 0.0, 0.0]]), leave_one_out=True).round(3).tolist()
    [[1.0, -0.333, -0.333, -0.333]]

    A group whose rewards are all equal (or G = 1) has A = 0. For binary rewards with pass
    rate p the mean |A| is 2·sqrt(p(1−p)) / (1 + eps/σ) ≈ 2·sqrt(p(1−p))
    (E|A| of a two-valued group; see docs/methods/README.md).

    Rewards of any finite size are safe: a row whose |r| exceeds 1e150 (where r² or the row
    sum would overflow) is computed on x = r / max|r| as (x − mean x) / (std x + eps / max|r|),
    the same value in exact arithmetic; other rows keep the plain formula bit for bit.

    >>> group_advantages(np.array([[1.0, 0.0, 1.0, 0.0]])).round(3).tolist()
    [[1.0, -1.0, 1.0, -1.0]]
    >>> group_advantages(np.array([[1e308, -1e308]])).round(3).tolist()
    [[1.0, -1.0]]
    """
    if group_sizes is not None or ddof != 0 or clip is not None or leave_one_out:
        return _group_advantages_options(rewards, eps, group_sizes, ddof, clip, leave_one_out)
    r = np.asarray(rewards, dtype=np.float64)
    if r.size == 0:
        return np.zeros_like(r)
    r, eps = _tame_huge_rows(r, eps)
    # The arithmetic of r.mean / r.std (population), spelled out so the centred values are
    # computed once: bit-identical results, ~40% less time on the hot path.
    g = r.shape[1]
    centred = r - r.sum(axis=1, keepdims=True) / g
    std = np.sqrt((centred * centred).sum(axis=1, keepdims=True) / g)
    return np.where(std > 0, centred / (std + eps), 0.0)


def _group_advantages_options(rewards, eps, group_sizes, ddof, clip, leave_one_out) -> np.ndarray:
    """`group_advantages` with its options (ragged groups, unbiased std, clip, leave-one-out)."""
    r = np.asarray(rewards, dtype=np.float64)
    if r.ndim != 2:
        raise InputError(f"group_advantages: rewards must be 2-D [B, G]; got shape {r.shape}.")
    if ddof not in (0, 1) or isinstance(ddof, bool):
        raise InputError(f"group_advantages: ddof must be 0 (population std) or 1 (unbiased); got {ddof!r}.")
    if clip is not None and not (isinstance(clip, (int, float, np.integer, np.floating)) and clip > 0):
        raise InputError(f"group_advantages: clip must be a number > 0 or None; got {clip!r}.")
    b, g = r.shape
    if group_sizes is None:
        n = np.full(b, g, dtype=np.int64)
    else:
        n = _feedback_group_sizes(group_sizes, r.shape)
        n = np.full(b, g, dtype=np.int64) if n is None else n
    if r.size == 0:
        return np.zeros_like(r)
    valid = np.arange(g)[None, :] < n[:, None]                       # [B, G]
    r, eps = _tame_huge_rows(np.where(valid, r, 0.0), eps)
    nf = n[:, None].astype(np.float64)                               # [B, 1]
    mean = r.sum(axis=1, keepdims=True) / np.maximum(nf, 1.0)
    centred = np.where(valid, r - mean, 0.0)
    if leave_one_out:
        adv = np.where(nf > 1, centred * nf / np.maximum(nf - 1.0, 1.0), 0.0)
    else:
        var = (centred * centred).sum(axis=1, keepdims=True) / np.maximum(nf - ddof, 1.0)
        std = np.sqrt(var)
        adv = np.where((std > 0) & (nf > 1), centred / (std + eps), 0.0)
    adv = np.where(valid, adv, 0.0)
    return adv if clip is None else np.clip(adv, -float(clip), float(clip))


_HUGE = 1e150


def _tame_huge_rows(r: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray | float]:
    """(r', eps') with rows holding |r| > 1e150 divided by their max |r| and their eps by the
    same factor — advantages are invariant to that rescaling — so no square or sum overflows.
    Returns the inputs unchanged (same objects) when no row is that large: the hot path pays one
    max over the batch."""
    big = np.abs(r).max(axis=1, keepdims=True)                                   # [B, 1]
    if not (big > _HUGE).any():
        return r, eps
    scale = np.where(big > _HUGE, big, 1.0)
    return r / scale, eps / scale


def kept_group_advantages(rewards: np.ndarray, keep: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """float64[B, G] GRPO advantages recomputed on each group's *kept* rollouts only:
    A_ij = (r_ij − mean_{k kept} r_ik) / (std_{k kept} r_ik + eps) where keep[i, j], else 0.

    This is PODS's rule (Xu et al. 2025, arXiv 2504.13818, §3: the policy update sees the
    down-sampled group as if it were the whole group), and the one place rlpace computes it:
    the built-in trainer, the simulator and the verl/TRL adapters all call it. A row whose
    kept rollouts all share one reward (or that keeps ≤ 1) gets A = 0. With `keep` all True
    it equals `group_advantages` bit for bit.

    >>> r = np.array([[1.0, 1.0, 0.0, 0.0]]); keep = np.array([[True, False, True, False]])
    >>> kept_group_advantages(r, keep).round(3).tolist()
    [[1.0, 0.0, -1.0, 0.0]]
    """
    r = np.asarray(rewards, dtype=np.float64)
    k = np.asarray(keep, dtype=bool)
    if k.shape != r.shape:
        raise InputError(f"kept_group_advantages: keep has shape {k.shape} but rewards has {r.shape}; "
                         f"give one flag per rollout.")
    if r.size == 0:
        return np.zeros_like(r)
    if k.all():
        return group_advantages(r, eps)
    r, eps = _tame_huge_rows(np.where(k, r, 0.0), eps)
    n = k.sum(axis=1, keepdims=True)
    safe_n = np.maximum(n, 1)
    mean = np.where(k, r, 0.0).sum(axis=1, keepdims=True) / safe_n
    centred = np.where(k, r - mean, 0.0)
    std = np.sqrt((centred * centred).sum(axis=1, keepdims=True) / safe_n)
    return np.where(k & (std > 0), centred / (std + eps), 0.0)


# A held-out NLL per token above this is not a language model's loss (uniform over a 10⁶-token
# vocabulary is 13.8 nats); the bound keeps curve areas (tokens × loss ≤ 2**62 · 1e4) finite.
LOSS_MAX = 1e4


def _loss_number(domain, what: str, value: Any, high: float, high_open: bool) -> float:
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))
    x = float(value) if ok else float("nan")
    ok = ok and np.isfinite(x) and x >= 0 and (x < high if high_open else x <= high)
    if not ok:
        bound = f"[0, {high:g}{')' if high_open else ']'}"
        raise InputError(f"observe_losses: {what} of domain {domain!r} must be a finite number in "
                         f"{bound}; got {value!r}. Pass {{domain: (tokens_seen, loss)}} with the "
                         f"tokens of that domain trained on so far and its mean held-out NLL per token.")
    return x


@dataclass(frozen=True)
class LossFeedback:
    """Held-out loss of some domains at one point of training: a second kind of feedback,
    beside `Feedback`, for policies that learn from loss curves (`epiplexity`,
    docs/methods/epiplexity.md). Built and validated by `Scheduler.observe_losses`, which
    passes it to each policy's `DataPolicy.update_losses`.

    Attributes:
        domains: int64[M] domain codes (positions in `Pool.domain_names`), one per point.
        tokens: float64[M] tokens (or rollouts: any unit, used consistently) of that domain
            trained on so far, in [0, 2**62).
        losses: float64[M] mean teacher-forced NLL per token of reference answers on that
            domain's fixed probe set, in [0, 1e4].
        step: int — trainer step at which the losses were measured.

    Validation (`from_mapping`; each a ValueError naming the domain and the field): keys are
    domain labels of the pool; values are (tokens_seen, loss) pairs of real numbers (not
    bools), finite and in range. An empty mapping is valid (no points).

    >>> pool = Pool(["math", "code", "math"])
    >>> lf = LossFeedback.from_mapping(pool, {"math": (1000, 2.5)}, step=3)
    >>> lf.domains.tolist(), lf.tokens.tolist(), lf.losses.tolist()
    ([1], [1000.0], [2.5])
    """

    domains: np.ndarray
    tokens: np.ndarray
    losses: np.ndarray
    step: int = 0

    def __init__(self, domains, tokens, losses, step: int = 0):
        d = np.array(domains, dtype=np.int64).reshape(-1)
        t = np.array(tokens, dtype=np.float64).reshape(-1)
        loss = np.array(losses, dtype=np.float64).reshape(-1)
        if not d.shape == t.shape == loss.shape:
            raise InputError(f"LossFeedback: domains, tokens and losses must have one entry per point; "
                             f"got shapes {d.shape}, {t.shape}, {loss.shape}.")
        if not (np.isfinite(t).all() and (t >= 0).all() and (t < float(STEP_MAX)).all()):
            raise InputError("LossFeedback.tokens must be finite numbers in [0, 2**62).")
        if not (np.isfinite(loss).all() and (loss >= 0).all() and (loss <= LOSS_MAX).all()):
            raise InputError(f"LossFeedback.losses must be finite numbers in [0, {LOSS_MAX:g}] (nats per token).")
        if (d < 0).any():
            raise InputError("LossFeedback.domains must be domain codes ≥ 0.")
        step_i = _feedback_step(step)
        for arr in (d, t, loss):
            arr.setflags(write=False)
        object.__setattr__(self, "domains", d)
        object.__setattr__(self, "tokens", t)
        object.__setattr__(self, "losses", loss)
        object.__setattr__(self, "step", step_i)

    @classmethod
    def from_mapping(cls, pool: "Pool", losses: Any, step: int = 0) -> "LossFeedback":
        """From `{domain label: (tokens_seen, loss)}`, validated against `pool` (see class doc)."""
        if not isinstance(losses, dict):
            raise InputError(f"observe_losses takes a dict {{domain: (tokens_seen, loss)}}; got "
                             f"{type(losses).__name__}.")
        step_i = _feedback_step(step)
        by_label = {str(name): i for i, name in enumerate(pool.domain_names)}
        codes, tokens, values = [], [], []
        for key, pair in losses.items():
            code = by_label.get(str(key))
            if code is None:
                raise InputError(f"observe_losses: unknown domain {key!r}; the pool's domains are "
                                 f"{[str(x) for x in pool.domain_names]}.")
            if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
                raise InputError(f"observe_losses: the value for domain {key!r} must be a pair "
                                 f"(tokens_seen, loss); got {pair!r}.")
            tokens.append(_loss_number(key, "tokens_seen", pair[0], float(STEP_MAX), True))
            values.append(_loss_number(key, "loss", pair[1], LOSS_MAX, False))
            codes.append(code)
        return cls(np.array(codes, np.int64), np.array(tokens), np.array(values), step_i)
