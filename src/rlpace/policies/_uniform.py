"""Non-adaptive baselines: uniform prompts, and a fixed mixture over domains.

`uniform` is plain GRPO sampling (every prompt equally likely, i.e. domains in proportion
to their size); `fixed_mixture` is DataFlex-RL's `static` control (arXiv 2609.06107,
configuration 10: a fixed share per domain, equal by default), against which adaptive mixtures must be
compared.

How a selection follows a mixture lives here too, in one place: `arm_distribution` (the
mixture restricted to non-empty arms) and `split_by_arm` (n slots ~ Multinomial over it),
used by `uniform_within_arm`, MoPPS and the learnability selections.
"""

from __future__ import annotations

from ..errors import InputError
import numpy as np

from ._base import MIXTURE, SELECTION, DataPolicy, EmptyState, _empty_init, _no_update
from ._checks import check_choice


def uniform_pool() -> DataPolicy:
    """Selection: n prompts uniformly at random from the whole pool, with replacement
    (an i.i.d. draw per slot, so the per-step cost is O(n) whatever the pool size).
    Ignores any mixture.

    >>> import numpy as np; from rlpace import Pool
    >>> p = uniform_pool(); pool = Pool([0, 1, 1])
    >>> p.apply(p.init(pool), pool, 4, None, None, np.random.default_rng(0)).shape
    (4,)
    """
    def apply(state, pool, n, probs, arms, rng):
        return rng.integers(0, len(pool), size=n, dtype=np.int64)
    return DataPolicy(SELECTION, _empty_init, _no_update, apply, name="uniform_pool", neutral=True)


def uniform_within_arm() -> DataPolicy:
    """Selection: for each of the n slots draw an arm k ~ probs (DUMP's per-sample source
    draw, arXiv 2504.09710), then a prompt uniformly (with replacement) inside arm k. Arms with no
    prompts get their mass spread over the others. O(n).
    """
    def apply(state, pool, n, probs, arms, rng):
        order, offsets = pool.members(arms)
        sizes, full = pool.arm_sizes(arms)
        p = arm_distribution(sizes, probs, full=full)
        # The arms' draws, then the positions' draws: two halves of one rng.random(2n) are
        # the numbers two calls rng.random(n) would give, in the same order.
        u = rng.random(2 * n)
        arm = _choice(rng, p, n, u[:n])
        within = (u[n:] * pool.arm_sizes_float(arms)[arm]).astype(np.int64)   # floor(u·size)
        return order[offsets[arm] + within]
    return DataPolicy(SELECTION, _empty_init, _no_update, apply, name="uniform_within_arm",
                      follows_mixture=True)


def arm_distribution(sizes: np.ndarray, probs, full: bool = False) -> np.ndarray:
    """float64[K] the mixture's `probs` restricted to the arms that have prompts (`sizes` > 0)
    and renormalised; when it puts no mass on a non-empty arm, every arm in proportion to its
    size. What `uniform_within_arm` draws each slot's arm from and `split_by_arm` splits over.
    `full=True` (the caller knows every arm has prompts, `Pool.arm_sizes`) skips the
    restriction when `probs` is already a float64[K] array: the same numbers.

    >>> arm_distribution(np.array([2, 0, 2]), [0.2, 0.6, 0.2]).tolist()
    [0.5, 0.0, 0.5]
    """
    if full and isinstance(probs, np.ndarray) and probs.dtype == np.float64 and probs.shape == sizes.shape:
        p = probs
    else:
        p = np.where(sizes > 0, probs, 0.0)
    total = p.sum()
    return p / total if total > 0 else sizes / sizes.sum()


def split_by_arm(pool, n: int, probs, arms: str, rng: np.random.Generator,
                 owner: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """How a selection that follows a mixture splits n slots over the arms.

    Returns (counts int64[K], order, offsets) with (order, offsets) = `pool.members(arms)`
    and counts ~ Multinomial(n, p), p = probs restricted to the arms that have prompts and
    renormalised (all of them in proportion to their size when probs puts no mass on a
    non-empty arm, as `uniform_within_arm`). So E[counts[k]] = n·p[k] exactly: the slots
    are the i.i.d. per-slot arm draws of DUMP (arXiv 2504.09710) and of
    `uniform_within_arm`, counted. (Largest-remainder rounding would have a lower
    variance, but it never gives an arm with n·p[k] < 1/2 a slot, e.g. with n = 1 the
    second arm of p = [0.6, 0.4] would never be drawn: a bias a bandit cannot learn past.)
    The multinomial is drawn over the arms with p[k] > 0 only, so an empty arm never gets
    a slot (numpy gives its last category the remainder n − Σ others, which rounding could
    leave positive for a last arm of probability 0).

    Raises ValueError naming `owner` when probs is not K finite non-negative numbers.

    >>> import numpy as np; from rlpace import Pool
    >>> pool = Pool(["a", "a", "b", "c"])
    >>> c, _, _ = split_by_arm(pool, 5, [0.0, 1.0, 0.0], "domain", np.random.default_rng(0), "x")
    >>> c.tolist()
    [0, 5, 0]
    """
    order, offsets = pool.members(arms)
    # np.diff(offsets) and "every arm has prompts", computed once per pool (`Pool.arm_sizes`;
    # an object with only `members` gets them here): with every arm non-empty the
    # restriction to non-empty arms keeps probs as they are (`full`)
    cached = getattr(pool, "arm_sizes", None)
    sizes, full = cached(arms) if cached is not None else (np.diff(offsets), False)
    p = np.asarray(probs, dtype=np.float64)
    # min ≥ 0 is False for a NaN or a negative entry, max < inf for +inf: finite and ≥ 0
    if p.shape != sizes.shape or not (p.min() >= 0 and p.max() < np.inf):
        raise InputError(f"{owner}: the mixture's probs must be {sizes.shape[0]} finite non-negative "
                         f"numbers, one per {arms}; got {p.tolist()!r} (a bug in the mixture policy).")
    p = arm_distribution(sizes, p, full=full)
    live = p > 0
    if live.all():               # the same numbers as below, without the gathers
        return rng.multinomial(n, p / p.sum()), order, offsets
    counts = np.zeros(sizes.shape[0], dtype=np.int64)
    live = np.flatnonzero(live)
    counts[live] = rng.multinomial(n, p[live] / p[live].sum())
    return counts, order, offsets


def _choice(rng: np.random.Generator, p: np.ndarray, n: int, u: np.ndarray | None = None) -> np.ndarray:
    """int64[n] i.i.d. draws of an index ∝ p: the very draws of `rng.choice(len(p), size=n,
    p=p)` (numpy's own inverse-CDF lines, `Generator.choice` with replace=True), without
    its ~15 μs of argument checks. p must be a normalised distribution; anything else
    (negative, NaN or inf entries) goes to `rng.choice`, which rejects it the usual way.
    `u`: the n uniforms `rng.random(n)` would draw, when the caller drew them already."""
    p = np.asarray(p, dtype=np.float64)
    # p.min() is NaN when some entry is; the cumulative sum's end is the total
    cdf = p.cumsum() if p.ndim == 1 and p.size else None
    if cdf is None or not (p.min() >= 0 and abs(cdf[-1] - 1.0) <= 1e-8):
        return rng.choice(p.shape[0], size=n, p=p)
    cdf /= cdf[-1]
    return cdf.searchsorted(rng.random(n) if u is None else u, side="right").astype(np.int64, copy=False)


def fixed_mixture(weights=None, arms: str = "domain") -> DataPolicy:
    """Mixture: a fixed distribution over arms, equal by default (DataFlex-RL's static control).

    DataFlex-RL (arXiv 2609.06107) configuration 10; docs/methods/fixed_mixture.md.

    Args:
        weights: K non-negative weights, normalised to sum 1; None → equal shares 1/K.
        arms: "domain" or "cluster".

    >>> from rlpace import Pool
    >>> pool = Pool(["a", "b", "b"])
    >>> m = fixed_mixture([3, 1]); m.apply(m.init(pool), pool).tolist()
    [0.75, 0.25]
    """
    check_choice("fixed_mixture", "arms", arms, ("domain", "cluster"))
    try:
        w = None if weights is None else np.asarray(weights, dtype=np.float64)
    except (TypeError, ValueError):
        w = np.array([np.nan])                                    # reported just below
    if w is not None and (w.ndim != 1 or (w < 0).any() or not np.isfinite(w).all() or w.sum() <= 0):
        raise InputError(f"fixed_mixture weights must be a 1-D list of finite non-negative numbers "
                         f"with a positive sum; got {weights!r}.")

    if w is not None and not np.isfinite(w.sum()):
        w = w / w.max()                                   # finite weights whose sum overflows

    def init(pool):
        k = pool.n_arms(arms)
        if w is not None and w.shape[0] != k:
            raise InputError(f"fixed_mixture got {w.shape[0]} weights but the pool has {k} {arms}s "
                             f"({list(pool.domain_names if arms == 'domain' else pool.cluster_names)}); "
                             f"give one weight per {arms}.")
        return EmptyState()

    def apply(state, pool, *_):
        k = pool.n_arms(arms)
        return np.full(k, 1.0 / k) if w is None else w / w.sum()

    return DataPolicy(MIXTURE, init, _no_update, apply, arms=arms, name="fixed_mixture")
