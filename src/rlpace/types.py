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

import functools
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Sequence

import numpy as np

__all__ = ["Pool", "Feedback", "Batch", "group_advantages"]


def _as_1d(name: str, values: Any, n: int | None, dtype=None) -> np.ndarray:
    arr = np.asarray(values) if dtype is None else np.asarray(values, dtype=dtype)
    if arr.ndim != 1:
        raise ValueError(f"Pool.{name} must be 1-D (one entry per prompt); got shape {arr.shape}. "
                         f"Pass a flat list or array.")
    if n is not None and arr.shape[0] != n:
        raise ValueError(f"Pool.{name} has {arr.shape[0]} entries but the pool has {n} prompts; "
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
    raise ValueError(f"Pool.{name} must hold ints or strings; got dtype {labels.dtype}. "
                     f"Convert labels to int or str.")


def _group_index(codes: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Members of each group: `order[offsets[g]:offsets[g+1]]` are the prompts of group g."""
    order = np.argsort(codes, kind="stable").astype(np.int64)
    counts = np.bincount(codes, minlength=k)
    offsets = np.zeros(k + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return order, offsets


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

    Positions 0..N-1 are what `Feedback.prompt_ids` and `Scheduler.propose` speak in.
    """

    domains: np.ndarray
    domain_names: tuple
    clusters: np.ndarray
    cluster_names: tuple
    ranks: np.ndarray
    difficulty: np.ndarray
    ids: np.ndarray
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    def __init__(self, domains: Sequence, *, clusters: Sequence | None = None,
                 ranks: Sequence | None = None, difficulty: Sequence | None = None,
                 ids: Sequence | None = None):
        dom = _as_1d("domains", domains, None)
        n = dom.shape[0]
        if n == 0:
            raise ValueError("Pool.domains is empty: a pool needs at least one prompt. "
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
                raise ValueError("Pool.difficulty has inf values; replace them by a finite "
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
                raise ValueError(f"Pool.ranks must be integers (0 = easiest); got dtype {rk.dtype}.")
            rk = rk.astype(np.int64)
            if (rk < 0).any():
                raise ValueError("Pool.ranks has negative values; ranks count from 0 (easiest).")
        if ids is None:
            id_arr = np.arange(n, dtype=np.int64)
        else:
            id_arr = _as_1d("ids", ids, n)
            if id_arr.dtype.kind in "iu":
                id_arr = id_arr.astype(np.int64)
            else:
                id_arr = id_arr.astype(object)
            if len(np.unique(id_arr.astype(str) if id_arr.dtype == object else id_arr)) != n:
                raise ValueError("Pool.ids has duplicates; each prompt needs a unique stable id "
                                 "(verl: extra_info.index). Deduplicate or re-index the data.")
        for name, val in (("domains", codes), ("clusters", c_codes), ("ranks", rk),
                          ("difficulty", diff), ("ids", id_arr)):
            val.setflags(write=False)
        object.__setattr__(self, "domains", codes)
        object.__setattr__(self, "domain_names", names)
        object.__setattr__(self, "clusters", c_codes)
        object.__setattr__(self, "cluster_names", c_names)
        object.__setattr__(self, "ranks", rk)
        object.__setattr__(self, "difficulty", diff)
        object.__setattr__(self, "ids", id_arr)
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
        raise ValueError(f"arms must be 'domain' or 'cluster'; got {arms!r}.")

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
        """float64[K] fraction of the pool in each domain."""
        return np.bincount(self.domains, minlength=self.n_domains) / len(self)

    def fingerprint(self) -> str:
        """A short hash of what identifies the pool (size, labels, ids), stored in
        checkpoints so that state is never restored onto a different pool."""
        if "fp" not in self._cache:
            h = hashlib.sha256()
            h.update(str(len(self)).encode())
            h.update(json.dumps([str(x) for x in self.domain_names]).encode())
            h.update(np.ascontiguousarray(self.domains).tobytes())
            h.update(np.ascontiguousarray(self.clusters).tobytes())
            if self.ids.dtype == object:
                h.update("\x00".join(map(str, self.ids)).encode())
            else:
                h.update(np.ascontiguousarray(self.ids).tobytes())
            self._cache["fp"] = h.hexdigest()[:16]
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
            raise ValueError(f"{len(missing)} prompt ids are not in the pool (first: {missing[:5]}); "
                             f"feedback must use the pool's stable ids (extra_info.index).")
        return out

    # ---- loaders -----------------------------------------------------------------------
    @classmethod
    def from_records(cls, records: Sequence[dict], *, domain_key: str = "data_source",
                     id_key: str = "extra_info.index", cluster_key: str = "cluster_id",
                     rank_key: str = "rank_in_cluster", difficulty_key: str = "difficulty") -> "Pool":
        """Build from row dicts in the verl schema. Dotted keys reach into nested dicts
        (`extra_info.index`). Optional columns are used when every row has them; the
        cluster, rank and difficulty columns are also looked up inside `extra_info`."""
        if len(records) == 0:
            raise ValueError("the dataset has no rows: a pool needs at least one prompt.")

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
                    raise ValueError(f"column {key!r} is missing in {len(missing)} rows (first rows: "
                                     f"{missing[:5]}); add it, or pass {key.split('.')[0]}_key=... "
                                     f"naming the column that holds it.")
                return None
            return vals

        domains = column(domain_key, required=True)
        ids = column(id_key, required=False)
        return cls(domains, clusters=column(cluster_key, False), ranks=column(rank_key, False),
                   difficulty=column(difficulty_key, False), ids=ids)

    @classmethod
    def from_jsonl(cls, path, **keys) -> "Pool":
        """Build from a JSON-lines file in the verl schema (see `from_records`)."""
        with open(path, encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
        return cls.from_records(rows, **keys)

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


def _finite_2d(name: str, values: Any, b: int) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if b == 0 and arr.size == 0:
        return arr.reshape(0, arr.shape[-1] if arr.ndim == 2 else 0)
    if arr.ndim != 2:
        raise ValueError(f"Feedback.{name} must be 2-D [B, G] (one row per prompt, one column per "
                         f"rollout); got shape {arr.shape}. Reshape to (len(prompt_ids), G).")
    if arr.shape[0] != b:
        raise ValueError(f"Feedback.{name} has {arr.shape[0]} rows but prompt_ids has {b} entries; "
                         f"give one row of rollouts per prompt id.")
    if arr.shape[1] == 0:
        raise ValueError(f"Feedback.{name} has G = 0 rollouts per prompt; each prompt needs at "
                         f"least one rollout (drop prompts that got none).")
    if not np.isfinite(arr).all():
        bad = np.argwhere(~np.isfinite(arr))[0].tolist()
        raise ValueError(f"Feedback.{name} has NaN or inf values (first at [{bad[0]}, {bad[1]}]); "
                         f"fix the reward function or drop those rollouts.")
    return arr


@dataclass(frozen=True)
class Feedback:
    """One training step's outcome, as a trainer or adapter reports it.

    Attributes:
        prompt_ids: int64[B] pool positions of the prompts that were rolled out.
        rewards: float64[B, G] reward of each of the G rollouts of each prompt.
        advantages: float64[B, G] or None — advantages as the trainer computed them; when
            None, policies that need them use GRPO group-normalised advantages of `rewards`.
        step: int — the trainer step the rollouts were generated at (for recency and lag).

    Validation (each a ValueError naming the field): ids must be non-negative integers,
    rewards 2-D with G ≥ 1 and finite, advantages the rewards' shape and finite. An empty
    batch (B = 0) is valid and is a no-op for the Scheduler. Range of ids is checked by the
    Scheduler against its pool.
    """

    prompt_ids: np.ndarray
    rewards: np.ndarray
    advantages: np.ndarray | None = None
    step: int = 0

    def __init__(self, prompt_ids, rewards, advantages=None, step: int = 0):
        ids = np.asarray(prompt_ids)
        if ids.ndim != 1:
            raise ValueError(f"Feedback.prompt_ids must be 1-D [B]; got shape {ids.shape}.")
        if ids.size and ids.dtype.kind not in "iu":
            if ids.dtype.kind == "f" and np.all(np.isfinite(ids)) and np.all(ids == np.round(ids)):
                pass
            else:
                raise ValueError(f"Feedback.prompt_ids must be integer pool positions; got dtype "
                                 f"{ids.dtype}. Map stable ids with Pool.index_of(...).")
        ids = ids.astype(np.int64)
        if (ids < 0).any():
            raise ValueError(f"Feedback.prompt_ids has negative values (first: {int(ids[ids < 0][0])}); "
                             f"ids are pool positions 0..N-1.")
        b = ids.shape[0]
        rew = _finite_2d("rewards", rewards, b)
        adv = None
        if advantages is not None:
            adv = _finite_2d("advantages", advantages, b)
            if adv.shape != rew.shape:
                raise ValueError(f"Feedback.advantages has shape {adv.shape} but rewards has "
                                 f"{rew.shape}; give one advantage per rollout.")
        try:
            step_i = int(step)
        except (TypeError, ValueError):
            raise ValueError(f"Feedback.step must be an int; got {step!r}.") from None
        if step_i < 0:
            raise ValueError(f"Feedback.step must be ≥ 0; got {step_i}.")
        object.__setattr__(self, "prompt_ids", ids)
        object.__setattr__(self, "rewards", rew)
        object.__setattr__(self, "advantages", adv)
        object.__setattr__(self, "step", step_i)

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

    @property
    def informative(self) -> np.ndarray:
        """bool[B]: the group carries GRPO signal (some advantage is non-zero)."""
        return np.abs(self.advantages).max(axis=1, initial=0.0) > 1e-12

    @staticmethod
    def from_feedback(fb: Feedback, pool: Pool, success_threshold: float) -> "Batch":
        return _batch_and_counts(fb, pool, success_threshold)[0]


def _batch_and_counts(fb: Feedback, pool: Pool, success_threshold: float
                      ) -> tuple[Batch, np.ndarray, np.ndarray]:
    """(`Batch`, wins int64[B] successes per group, informative bool[B]) — what
    `Batch.from_feedback` and the Scheduler's history need, each computed once.

    Exactly the values of the plain formulas (`success.sum(axis=1)`, `success.mean(axis=1)`,
    `group_advantages(rewards)`, `Batch.informative`), bit for bit, computed faster:
    row reductions over G columns cost ~10 μs each in numpy, so counts come from a
    matrix-vector product (exact: sums of 0/1 values), and for binary rewards
    (every reward 0 or 1) the advantages and the informative flag follow from the count
    k of each group (see `_binary_advantage_table`).
    """
    r = fb.rewards
    success = r >= success_threshold
    b = r.shape[0]
    domains, clusters = pool.domains[fb.prompt_ids], pool.clusters[fb.prompt_ids]
    if b == 0:
        adv = fb.advantages if fb.advantages is not None else group_advantages(r)
        batch = Batch(fb.prompt_ids, r, success, np.zeros(0), adv, domains, clusters, fb.step)
        return batch, np.zeros(0, np.int64), np.zeros(0, bool)
    g = r.shape[1]
    # r == success (as 0/1) everywhere ⟺ every reward is 0 or 1; then success ⟺ r == 1
    # whatever the threshold, so the count of successes is the row sum of r.
    binary = fb.advantages is None and bool((r == success).all())
    wins = (r if binary else success.astype(np.float64)) @ np.ones(g)   # see _success_counts
    rate = wins / g                                   # = success.mean(axis=1), same division
    wins = wins.astype(np.int64)
    table = _binary_advantage_table(g) if binary else None
    if table is not None:
        up, down = table                              # advantage of a success / failure, by k
        adv = np.where(success, up[wins][:, None], down[wins][:, None])
    else:
        adv = fb.advantages if fb.advantages is not None else group_advantages(r)
    if binary:
        # 0 < k < G: the group's advantages are ±(≥ 1/G)/(std + eps), far above 1e-12.
        informative = (wins > 0) & (wins < g)
    else:
        informative = np.abs(adv).max(axis=1, initial=0.0) > 1e-12
    batch = Batch(fb.prompt_ids, r, success, rate, adv, domains, clusters, fb.step)
    return batch, wins, informative


def _success_counts(success: np.ndarray) -> np.ndarray:
    """int64[B] successes per group of a bool[B, G] mask: `success.sum(axis=1)`, via a
    matrix-vector product (3× faster than numpy's row reduction for G ≈ 16; exact, as
    sums of 0/1 values below 2^53 are exact in any order)."""
    return (success.astype(np.float64) @ np.ones(success.shape[1])).astype(np.int64)


@functools.lru_cache(maxsize=64)
def _binary_advantage_table(g: int, eps: float = 1e-6) -> tuple[np.ndarray, np.ndarray] | None:
    """(up, down) float64[G + 1]: the `group_advantages` of a success and of a failure in a
    group of G 0/1 rewards with k successes, bit for bit, when G is a power of two (else
    None: the caller uses `group_advantages`).

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
    up.setflags(write=False)
    down.setflags(write=False)
    return up, down


def group_advantages(rewards: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """GRPO advantages: A = (r − mean_group) / (std_group + eps), population std.

    A group whose rewards are all equal (or G = 1) has A = 0. For binary rewards with pass
    rate p the mean |A| is 2·sqrt(p(1−p)) / (1 + eps/σ) ≈ 2·sqrt(p(1−p))
    (methods-core.md, "one identity").

    >>> group_advantages(np.array([[1.0, 0.0, 1.0, 0.0]])).round(3).tolist()
    [[1.0, -1.0, 1.0, -1.0]]
    """
    r = np.asarray(rewards, dtype=np.float64)
    if r.size == 0:
        return np.zeros_like(r)
    # The arithmetic of r.mean / r.std (population), spelled out so the centred values are
    # computed once: bit-identical results, ~40% less time on the hot path.
    g = r.shape[1]
    centred = r - r.sum(axis=1, keepdims=True) / g
    std = np.sqrt((centred * centred).sum(axis=1, keepdims=True) / g)
    return np.where(std > 0, centred / (std + eps), 0.0)
