"""Logistic pass-rate model with online SGD and staged, importance-weighted Newton refits.

Model. For prompt i with design row
x_i = [1, z(f_i), z(difficulty_i), [difficulty_i unknown], onehot(domain_i), onehot(cluster_i)]
(z standardises each column by its pool mean and std; the difficulty columns only when the
pool has an offline `difficulty` score — `rlpace prepare`'s NLL difficulty — with the
"unknown" indicator only when some scores are NaN, whose z is then 0; the cluster one-hot only
when the pool's clusters differ from its domains), the predicted pass rate is σ(θ·x_i).

Data. Each observed group j is (prompt i_j, k_j successes of n_j rollouts, weight ω_j),
with ω_j = p/q the importance weight of the proposal that drew the prompt (1 when the
proposal is the naturalistic p itself), so the fit targets the pass rates under p whatever
proposal gathered the data.

Online step (every `update`), on the batch's groups j = 1..B:

    g = Σ_j ω_j (k_j − n_j σ(θ·x_j)) x_j / Σ_j ω_j n_j          (mean log-likelihood gradient)
    θ ← θ + lr · (g − l2 · θ)

Stages (the self-evolving loop of criticality-guided IS): the groups of the current stage
are kept in a ring buffer of `buffer` rows; every `stage_steps` updates the model is refit on
that buffer by `newton_steps` Newton steps on the weighted, L2-penalised mean log-likelihood

    L(θ) = Σ_j ω_j [k_j log σ_j + (n_j − k_j) log(1 − σ_j)] / Σ_j ω_j n_j − (l2/2)·‖θ‖²,

warm-started from the online θ. The result becomes both θ and `stage_theta` (the weights
scoring uses until the next stage), and the buffer is emptied: stage s learns from the
outcomes gathered under stage s − 1's proposal. Scoring reads `stage_theta` only, so a
proposal distribution built from it stays fixed for a whole stage.

Deviations from the criticality-IS robotics code (criticality MLP on [obs, force], binary
cross-entropy, 20 % of negatives kept): a linear-logistic model on prompt features (the
scale RLVR pools need: 10⁶ prompts scored in one pass), importance weights instead of
negative down-sampling, and no per-prompt history inputs — per-prompt histories belong to
the methods that own them (MoPPS's posterior, GRESO's streaks); the predictor covers the
prompts those know nothing about.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from .._checks import bad, check_int, check_real
from ..types import Pool

__all__ = ["Predictor", "PredictorState", "predictor", "design", "dim"]

_CHUNK = 1 << 16        # rows per pass when scoring the whole pool
_THETA_MAX = 1e3        # |θ| bound: keeps logits finite for any finite input
_WEIGHT_MAX = 1e6       # importance weights beyond this are clipped (state stays finite)


class PredictorState(NamedTuple):
    theta: np.ndarray        # float64[d] online weights (SGD every update)
    stage_theta: np.ndarray  # float64[d] weights of the current stage: what scoring uses
    buf_ids: np.ndarray      # int64[M] prompt of each buffered group of this stage; −1 = empty
    buf_wins: np.ndarray     # float64[M] successes k_j of the group
    buf_n: np.ndarray        # float64[M] rollouts n_j of the group
    buf_weight: np.ndarray   # float64[M] importance weight ω_j = p/q of its proposal
    buf_len: np.ndarray      # int64[] groups written this stage (slot of the next: buf_len % M)
    steps: np.ndarray        # int64[] non-empty updates so far
    stage: np.ndarray        # int64[] refits done so far
    #: value rules `Scheduler.load_state_dict` checks for each field (policies/_state_checks.py)
    STATE_RULES = {"buf_ids": "ids", "buf_wins": "nonneg", "buf_n": "nonneg", "buf_weight": "nonneg",
                   "buf_len": "nonneg", "steps": "nonneg", "stage": "nonneg"}


class Predictor(NamedTuple):
    """A pass-rate predictor: pure functions over `PredictorState` (see the module docstring).

    Attributes:
        init: (pool) -> PredictorState.
        update: (state, pool, ids int64[B], wins float64[B], n float64[B], weight float64[B])
            -> state; may write into the state's arrays (as policy updates do).
        predict: (state, pool, ids int64[m] | None) -> float64[m] pass rates σ(stage_theta·x);
            ids None scores the whole pool, in chunks.
        refit: (state, pool) -> state, the stage refit (what `update` runs every
            `stage_steps` updates).
    """

    init: callable
    update: callable
    predict: callable
    refit: callable
    stage_steps: int


def _use_clusters(pool: Pool) -> bool:
    key = "predict/use_clusters"
    if key not in pool._cache:
        pool._cache[key] = not np.array_equal(pool.clusters, pool.domains)
    return pool._cache[key]


def _feature_stats(pool: Pool) -> tuple[np.ndarray, np.ndarray]:
    """(mean, 1/std) float64[f] of the pool's feature columns (cached; constant columns get
    1/std = 0, so they add nothing)."""
    key = "predict/feature_stats"
    if key not in pool._cache:
        f = pool.features
        s1 = np.zeros(f.shape[1])
        s2 = np.zeros(f.shape[1])
        for start in range(0, f.shape[0], _CHUNK):
            c = np.asarray(f[start:start + _CHUNK], dtype=np.float64)
            s1 += c.sum(axis=0)
            s2 += (c * c).sum(axis=0)
        n = f.shape[0]
        mean = s1 / n
        var = np.maximum(s2 / n - mean * mean, 0.0)
        inv = np.where(var > 1e-12, 1.0 / np.sqrt(np.where(var > 1e-12, var, 1.0)), 0.0)
        pool._cache[key] = (mean, inv)
    return pool._cache[key]


def _difficulty_columns(pool: Pool) -> tuple[np.ndarray, ...]:
    """() without a difficulty score; (z float64[N],) when every prompt has one; (z, unknown
    float64[N]) when some are NaN (z = 0 there). Cached."""
    key = "predict/difficulty"
    if key not in pool._cache:
        d = pool.difficulty
        known = np.isfinite(d)
        if not known.any():
            cols: tuple = ()
        else:
            v = d[known]
            sd = float(v.std())
            z = np.zeros(d.shape[0])
            z[known] = (v - v.mean()) / sd if sd > 1e-12 else 0.0
            cols = (z,) if known.all() else (z, (~known).astype(np.float64))
        for c in cols:
            c.setflags(write=False)
        pool._cache[key] = cols
    return pool._cache[key]


def dim(pool: Pool) -> int:
    """d: length of a design row for this pool (1 + f + [1 or 2] + K [+ C])."""
    f = 0 if pool.features is None else pool.features.shape[1]
    return (1 + f + len(_difficulty_columns(pool)) + pool.n_domains
            + (pool.n_clusters if _use_clusters(pool) else 0))


def design(pool: Pool, ids: np.ndarray) -> np.ndarray:
    """float64[m, d] design rows (module docstring).

    >>> from rlpace import Pool
    >>> design(Pool(["a", "b"], features=[[1.0], [3.0]]), np.array([1])).tolist()
    [[1.0, 1.0, 0.0, 1.0]]
    >>> design(Pool(["a", "b"], difficulty=[0.2, float("nan")]), np.array([0, 1])).tolist()
    [[1.0, 0.0, 0.0, 1.0, 0.0], [1.0, 0.0, 1.0, 0.0, 1.0]]
    """
    ids = np.asarray(ids, dtype=np.int64)
    m = ids.shape[0]
    x = np.zeros((m, dim(pool)))
    x[:, 0] = 1.0
    col = 1
    if pool.features is not None:
        mean, inv = _feature_stats(pool)
        f = pool.features.shape[1]
        x[:, col:col + f] = (np.asarray(pool.features[ids], dtype=np.float64) - mean) * inv
        col += f
    for c in _difficulty_columns(pool):
        x[:, col] = c[ids]
        col += 1
    x[np.arange(m), col + pool.domains[ids]] = 1.0
    col += pool.n_domains
    if _use_clusters(pool):
        x[np.arange(m), col + pool.clusters[ids]] = 1.0
    return x


def last_result(pool: Pool, name: str, key: tuple, compute):
    """`compute()`, or a copy of its last result when the call named `name` last ran on this
    pool with the same `key` (every input of the pure computation, arrays as bytes).

    Why: the two policies of a criticality method (`criticality_is`, `criticality_grid`: a
    selection and a reweighting) each keep their own predictor, as a policy sees only its own
    state, and update it identically; the second one reads the first one's SGD step, refit
    and stage proposal instead of computing them again. Only the last result is kept."""
    memo = pool._cache.get(name)
    if memo is None or memo[0] != key:
        memo = (key, compute())
        pool._cache[name] = memo
    out = memo[1]
    return tuple(np.array(v, copy=True) for v in out) if isinstance(out, tuple) else np.array(out, copy=True)


def _dense(pool: Pool, ids: np.ndarray) -> np.ndarray:
    """float64[m, e] the dense columns of the design rows, [1, z(f), difficulty columns]: what
    `design` holds left of the one-hot blocks, built the same way."""
    f = 0 if pool.features is None else pool.features.shape[1]
    dcols = _difficulty_columns(pool)
    x = np.empty((ids.shape[0], 1 + f + len(dcols)))
    x[:, 0] = 1.0
    if f:
        mean, inv = _feature_stats(pool)
        x[:, 1:1 + f] = (np.asarray(pool.features[ids], dtype=np.float64) - mean) * inv
    for j, c in enumerate(dcols):
        x[:, 1 + f + j] = c[ids]
    return x


class _Rows(NamedTuple):
    """Design rows of some prompts in block form: `design(pool, ids)` is
    [dense, onehot(dom), onehot(cl)] (the cluster block only when `cl` is not None)."""

    dense: np.ndarray          # float64[m, e]
    dom: np.ndarray            # int64[m] domain code
    cl: np.ndarray | None      # int64[m] cluster code, or None without a cluster block
    k: int                     # domains
    c: int                     # clusters (0 without a cluster block)


def _rows(pool: Pool, ids: np.ndarray) -> _Rows:
    use_cl = _use_clusters(pool)
    return _Rows(_dense(pool, ids), pool.domains[ids], pool.clusters[ids] if use_cl else None,
                 pool.n_domains, pool.n_clusters if use_cl else 0)


def _x_theta(rows: _Rows, theta: np.ndarray) -> np.ndarray:
    """float64[m] X·θ without the one-hot columns (= design(pool, ids) @ θ up to rounding)."""
    e = rows.dense.shape[1]
    z = rows.dense @ theta[:e] + theta[e:e + rows.k][rows.dom]
    if rows.cl is not None:
        z += theta[e + rows.k:][rows.cl]
    return z


def _xt_v(rows: _Rows, v: np.ndarray) -> np.ndarray:
    """float64[d] Xᵀ·v: the one-hot blocks as bincounts (O(m·e + K + C), not O(m·d))."""
    parts = [rows.dense.T @ v, np.bincount(rows.dom, weights=v, minlength=rows.k)]
    if rows.cl is not None:
        parts.append(np.bincount(rows.cl, weights=v, minlength=rows.c))
    return np.concatenate(parts)


def _xt_w_x(rows: _Rows, w: np.ndarray) -> np.ndarray:
    """float64[d, d] Xᵀ·diag(w)·X block by block: dense×dense a product, dense×one-hot and
    one-hot×one-hot bincounts (O(m·e² + m·e + K·C) instead of O(m·d²))."""
    x, dom, cl, k, c = rows
    e = x.shape[1]
    d = e + k + c
    h = np.zeros((d, d))
    wx = x * w[:, None]
    h[:e, :e] = x.T @ wx
    h[:e, e:e + k] = np.stack([np.bincount(dom, weights=wx[:, j], minlength=k) for j in range(e)])
    h[e:e + k, e:e + k] = np.diag(np.bincount(dom, weights=w, minlength=k))
    if cl is not None:
        h[:e, e + k:] = np.stack([np.bincount(cl, weights=wx[:, j], minlength=c) for j in range(e)])
        h[e + k:, e + k:] = np.diag(np.bincount(cl, weights=w, minlength=c))
        h[e:e + k, e + k:] = np.bincount(dom * c + cl, weights=w, minlength=k * c).reshape(k, c)
    # the lower triangle mirrors the upper one (H is symmetric): one masked copy of Hᵀ, the
    # same values as writing h[j, i] = h[i, j] through np.triu_indices (~0.2 ms a call at d = 78,
    # five calls per refit)
    np.copyto(h, h.T, where=_strict_lower(d))
    return h


@functools.lru_cache(maxsize=16)
def _strict_lower(d: int) -> np.ndarray:
    """bool[d, d] read-only: True below the diagonal."""
    mask = np.tri(d, d, -1, dtype=bool)
    mask.setflags(write=False)
    return mask


def logits(theta: np.ndarray, pool: Pool, ids: np.ndarray | None = None,
           out: np.ndarray | None = None, scratch: np.ndarray | None = None) -> np.ndarray:
    """float64[m] θ·x_i for the prompts `ids` (None: the whole pool, in chunks of 65536 rows;
    a slice: that range of pool positions),
    computed without building the one-hot columns: θ_0 + z(f_i)·θ_f + θ_diff·(difficulty
    columns) + θ_dom[d_i] + θ_cl[c_i].

    `out` and `scratch` (float64[m] each, a slice only) take the sum and the gathered terms:
    the criticality stage pass scores the pool piece by piece into buffers it reuses, as a
    fresh piece-sized temporary costs more than the arithmetic on it (page faults). The same
    operations in the same order, so the same bits."""
    f = 0 if pool.features is None else pool.features.shape[1]
    k = pool.n_domains
    dcols = _difficulty_columns(pool)
    e = 1 + f + len(dcols)                            # first domain column
    t_f = theta[1:1 + f]
    t_d = theta[1 + f:e]
    t_dom = theta[e:e + k]
    t_cl = theta[e + k:] if _use_clusters(pool) else None
    if f:
        mean, inv = _feature_stats(pool)
        u = t_f * inv                                   # z(f)·θ_f = f·u − mean·u
        u32 = u.astype(np.float32)
        offset = theta[0] - float(mean @ u)
    else:
        offset = theta[0]

    def part(sel, z=None, tmp=None):
        dom = pool.domains[sel]
        if z is None:
            z = np.empty(dom.shape[0])
        if f or not dcols:
            z[...] = offset
            if f:
                z += np.asarray(pool.features[sel], dtype=np.float32) @ u32
            terms = zip(dcols, t_d)
        else:               # offset + t·c as t·c + offset: the same sum, one pass fewer
            np.multiply(dcols[0][sel], t_d[0], out=z)
            z += offset
            terms = zip(dcols[1:], t_d[1:])
        for c, t in terms:
            z += np.multiply(c[sel], t, out=tmp)
        # the gathers into the scratch buffer when there is one ('clip': the codes are in
        # range, and a take with `out` and the default mode would buffer)
        z += t_dom[dom] if tmp is None else t_dom.take(dom, out=tmp, mode="clip")
        if t_cl is not None:
            cl = pool.clusters[sel]
            z += t_cl[cl] if tmp is None else t_cl.take(cl, out=tmp, mode="clip")
        return z

    if isinstance(ids, slice):                 # a contiguous range of the pool (chunked scoring)
        return part(ids, out, scratch)
    if ids is not None:
        return part(np.asarray(ids, dtype=np.int64))
    n = len(pool)
    return np.concatenate([part(slice(s, min(s + _CHUNK, n))) for s in range(0, n, _CHUNK)])


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))                # no overflow for any finite z


def predictor(lr: float = 0.1, l2: float = 1e-3, stage_steps: int = 20, buffer: int = 8192,
              newton_steps: int = 5, owner: str = "predictor") -> Predictor:
    """A logistic pass-rate predictor updated online and refit in stages (module docstring).

    Args:
        lr: SGD step size of the online update.
        l2: L2 penalty on θ (online and refit); > 0 keeps the refit well posed.
        stage_steps: updates per stage (K): the refit and the switch of `stage_theta`.
        buffer: groups kept per stage for the refit (a ring: the newest `buffer` groups).
        newton_steps: Newton iterations per refit.
        owner: the policy name used in error messages.

    Example (hand-computed, one prompt of domain "a" in a pool of domains a, b):
    θ = 0 predicts 0.5; a group of 3 successes in 4 with ω = 1 gives
    g = (3 − 2)/4 · [1, 1, 0] and, with lr = 0.4, θ = [0.1, 0.1, 0].
    """
    lr = check_real(owner, "lr", lr, low=0, hint=" (SGD step of the predictor)")
    l2 = check_real(owner, "l2", l2, low=0, low_open=True, hint=" (L2 penalty of the predictor)")
    stage_steps = check_int(owner, "stage_steps", stage_steps, hint=" (updates per predictor stage)")
    buffer = check_int(owner, "buffer", buffer, hint=" (groups kept per predictor stage)")
    newton_steps = check_int(owner, "newton_steps", newton_steps, low=0, hint=" (Newton iterations per refit)")

    def init(pool):
        d = dim(pool)
        return PredictorState(np.zeros(d), np.zeros(d), np.full(buffer, -1, np.int64),
                              np.zeros(buffer), np.zeros(buffer), np.zeros(buffer),
                              np.array(0, np.int64), np.array(0, np.int64), np.array(0, np.int64))

    def _newton(pool, ids, wt, k, n, total, theta):
        """`newton_steps` Newton steps on L(θ) (module docstring), the design in block form."""
        rows = _rows(pool, ids)
        ridge = l2 * np.eye(theta.shape[0])
        for _ in range(newton_steps):
            s = _sigmoid(_x_theta(rows, theta))
            g = _xt_v(rows, wt * (k - n * s)) / total - l2 * theta
            h = _xt_w_x(rows, wt * n * s * (1.0 - s)) / total + ridge
            theta = np.clip(theta + np.linalg.solve(h, g), -_THETA_MAX, _THETA_MAX)
        return theta

    def refit(state, pool):
        used = int(min(int(state.buf_len), buffer))
        theta = state.theta.copy()
        if used:
            ids = state.buf_ids[:used]
            wt = state.buf_weight[:used]
            k, n = state.buf_wins[:used], state.buf_n[:used]
            total = float((wt * n).sum())
            if total > 0:
                theta = last_result(pool, "predict/last_refit", (theta.tobytes(), ids.tobytes(), wt.tobytes(),
                                    k.tobytes(), n.tobytes(), l2, newton_steps),
                                    lambda: _newton(pool, ids, wt, k, n, total, theta))
        state.theta[:] = theta
        state.stage_theta[:] = theta
        state.buf_ids[:] = -1
        state.buf_wins[:] = 0.0
        state.buf_n[:] = 0.0
        state.buf_weight[:] = 0.0
        state.buf_len[...] = 0
        state.stage[...] += 1
        return state

    def update(state, pool, ids, wins, n, weight):
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size == 0:
            return state
        wins = np.asarray(wins, dtype=np.float64)
        n = np.asarray(n, dtype=np.float64)
        wt = np.clip(np.asarray(weight, dtype=np.float64), 0.0, _WEIGHT_MAX)
        # online SGD step on the batch's mean log-likelihood
        total = float((wt * n).sum())
        if total > 0 and lr > 0:
            def sgd():
                rows = _rows(pool, ids)
                s = _sigmoid(_x_theta(rows, state.theta))
                g = _xt_v(rows, wt * (wins - n * s)) / total
                return np.clip(state.theta + lr * (g - l2 * state.theta), -_THETA_MAX, _THETA_MAX)
            state.theta[:] = last_result(pool, "predict/last_sgd", (state.theta.tobytes(), ids.tobytes(),
                                         wins.tobytes(), n.tobytes(), wt.tobytes(), lr, l2), sgd)
        # the stage's ring buffer (only the newest `buffer` groups of an oversized batch)
        b = ids.shape[0]
        keep = slice(max(0, b - buffer), b)
        start = int(state.buf_len) + keep.start
        m = b - keep.start
        # a run that does not wrap is a slice of the ring (the same slots as the index below)
        pos = (slice(start % buffer, start % buffer + m) if start % buffer + m <= buffer
               else (start + np.arange(m)) % buffer)
        state.buf_ids[pos] = ids[keep]
        state.buf_wins[pos] = wins[keep]
        state.buf_n[pos] = n[keep]
        state.buf_weight[pos] = wt[keep]
        state.buf_len[...] += b
        state.steps[...] += 1
        if int(state.steps) % stage_steps == 0:
            state = refit(state, pool)
        return state

    def predict(state, pool, ids=None):
        return _sigmoid(logits(state.stage_theta, pool, ids))

    return Predictor(init, update, predict, refit, stage_steps)


def check_predictor_state(state: PredictorState, key: str) -> None:
    """ValueError naming the key when a restored predictor state breaks its own rules
    (a group with more successes than rollouts)."""
    over = state.buf_wins > state.buf_n
    if over.any():
        raise bad(f"{key}/buf_wins", "exceeds buf_n", state.buf_wins, over)
