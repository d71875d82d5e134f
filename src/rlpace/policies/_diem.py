"""DIEM: gradient-alignment importance and magnitude-preserving batch reweighting.

Tan et al., "Dynamic Important Example Mining for Reinforcement Finetuning", CVPR 2026,
arXiv 2608.29252; docs/methods/diem.md. Per (mini)batch of N samples with per-sample
gradient features F (N×d, rows f_z; `Feedback.grads`), the published rule is

    Î  = η·F·g_B              g_B = Fᵀ1, the batch gradient
    P  = F·Fᵀ,  C = ‖g_B‖²
    W* = P⁻¹Î · sqrt(C / ÎᵀP⁻¹Î),  then W ← max(0, W*)      (loss weights)

the solution of max_W ÎᵀW s.t. ‖WᵀF‖ = ‖1ᵀF‖.

What this computes (derivation in docs/methods/diem.md). Î = η·F·Fᵀ·1 = η·P·1, so when P is
invertible P⁻¹Î = η·1 and W* = 1 exactly; and whatever P, any exact maximiser has WᵀF = 1ᵀF
(Cauchy–Schwarz on u = WᵀF): the update equals plain GRPO's. Non-uniform weights — and a
different update — come only from

  * a reference direction h ≠ g_B: Î = F·h with h a held-out gradient (`Feedback.ref_grad`;
    the trainer can also pass the previous step's batch gradient) — `importance="reference"`;
  * leave-one-out importance Î_z = ⟨f_z, g_B − f_z⟩, i.e. Î = P·1 − diag(P) —
    `importance="loo"` (the paper's I_t(z) without the sample's self-influence);
  * a ridge, W ∝ (P + λI)⁺Î with λ = `ridge`·tr(P)/N: from uniform (λ → 0) to W ∝ Î (λ → ∞);
  * rank deficiency (N > d, e.g. projected features): P⁺P projects 1 onto the span of F's
    columns; the weights then differ from 1 by a null(Fᵀ) component, the update does not;
  * the ReLU, which truncates negative weights of a non-trivial solution.

Every variant solves W = (P + λI)⁺Î and rescales by the *actual* constraint,
W ← W·sqrt(C / WᵀPW) (= the paper's factor when λ = 0 and P is invertible; exact in every
regime), so ‖WᵀF‖ = ‖1ᵀF‖ before the ReLU; after the ReLU the weights are rescaled once
more by the same rule (`rescale_after_relu`). η cancels in the rescaling and is omitted.
(P + λI)⁺ cuts eigenvalues below 1e-10 × the largest: "P invertible" above means that.

The exact solution is unbounded with "loo" and "reference": a sample with tiny features
moves the update little per unit of weight, so the maximiser can give it a weight in the
hundreds while most others go to 0 (docs/methods/diem.md, "Unbounded weights"). The last step caps
each weight at `max_weight` (default 4, `cap_weights`: weights above it are set to it and
the others scaled by one factor so that ‖WᵀF‖ = ‖1ᵀF‖ again); when no weight exceeds the
cap nothing changes, so uniform weights (the published rule on a full-rank P) stay 1.

The paper's ablations: `importance` ∈ {"random", "pass_at_k", "difficulty",
"median_distance"} replaces Î by a non-gradient score (then W = (P + λI)⁺Î: with an
invertible P these are arbitrary directions in weight space, not the paper's numbers), and
`solver="softmax"` replaces the constrained solution by W = N·softmax(Î/(T·max|Î|))
(mean 1), which needs no features for the non-gradient scores.

Without `Feedback.grads` (any adapter that does not produce them) every weight is 1,
except for the softmax solver over a non-gradient score. Features are rescaled by their
max |entry| in float64 before any product (the weights are invariant to it), so any
finite float32 features give finite weights.
"""

from __future__ import annotations

from ..errors import InputError
import numpy as np

from ..types import group_grad_sums
from ._base import REWEIGHTING, DataPolicy, _empty_init, _no_update
from ._checks import check_choice, check_int, check_real

__all__ = ["diem", "constrained_weights", "diem_importance", "cap_weights", "MAX_WEIGHT"]

_GRADIENT_SCORES = ("loo", "batch", "reference")
_ABLATION_SCORES = ("random", "pass_at_k", "difficulty", "median_distance")
_STREAM_RANDOM = 0xD1E
MAX_WEIGHT = 4.0      # default cap of one weight (`cap_weights`; measured choice: docs/methods/diem.md)
#: Without a ridge, a Gram matrix M whose eigenvalues all exceed ‖M‖_F / _DIRECT_COND is solved
#: directly (LU solves, no eigendecomposition): `_inverse_applies`.
_DIRECT_COND = 1e4


def constrained_weights(features: np.ndarray, importance: np.ndarray, ridge: float = 0.0,
                        rcond: float = 1e-10) -> np.ndarray:
    """float64[N] W = (P + λI)⁺Î · sqrt(C / WᵀPW) with P = F·Fᵀ, C = ‖1ᵀF‖², λ = ridge·tr(P)/N:
    DIEM's magnitude-preserving solution before the ReLU (‖WᵀF‖ = ‖1ᵀF‖).

    All ones when the batch gradient is 0, or when (P + λI)⁺Î lies in null(Fᵀ) (no direction
    to preserve). `rcond` is the pseudo-inverse's relative cut-off (`np.linalg.pinv`).

    >>> f = np.array([[1.0, 0.0], [0.0, 2.0]]); p = f @ f.T
    >>> constrained_weights(f, p @ np.ones(2)).round(12).tolist()        # Î = P·1: uniform
    [1.0, 1.0]
    """
    return _solve(features, importance, ridge, rcond)[0]


def _solve(features, importance, ridge: float = 0.0, rcond: float = 1e-10) -> tuple[np.ndarray, np.ndarray, float]:
    """(`constrained_weights`, F float64[N, d], C = ‖1ᵀF‖²): the features and norm returned
    for the rescaling after the ReLU and the cap (quadratic forms wᵀPw = ‖Fᵀw‖², `_norms`).

    (P + λI)⁺Î, P = F·Fᵀ, as `np.linalg.pinv(P + λI, hermitian=True) @ Î` computes it
    (eigenvalues |e| ≤ rcond·max|e| cut), from whichever Gram matrix is smaller:

    * N ≤ d: the eigendecomposition P + λI = V·diag(e)·Vᵀ, then V·diag(1/e, kept)·VᵀÎ;
    * N > d (a batch of B = 512 prompts with d = 64 features): P has rank ≤ d, and its non-zero
      eigenvalues are those of FᵀF = V·diag(e)·Vᵀ [d, d], with eigenvectors U = F·V·diag(e)^−½.
      λ = 0: P⁺ = U·diag(1/e)·Uᵀ = F·V·diag(1/e²)·VᵀFᵀ. λ > 0: P + λI has e + λ on span(F) and
      λ on its complement; when λ is kept, (P + λI)⁻¹ = (I − F·(FᵀF + λI)⁻¹·Fᵀ)/λ (Woodbury),
      else the complement is cut and it is F·V·diag(1/(e(e + λ)))·VᵀFᵀ.

    O(N·d² + d³) instead of O(N³); the same numbers up to rounding (≤ 1e-12 relative to the
    N × N path for λ = 0; tests/test_after_rollout_vectorised.py).

    Without a ridge, when the Gram matrix keeps every eigenvalue with a margin
    (`_inverse_applies`), its pseudo-inverse is its inverse: P⁻¹Î (N ≤ d) or F·(FᵀF)⁻²·FᵀÎ
    (N > d) by LU solves, without the eigendecomposition (the same weights to ≤ 1e-12 relative).
    """
    f = np.asarray(features, dtype=np.float64)
    i = np.asarray(importance, dtype=np.float64)
    n, d = f.shape
    g_b = f.sum(axis=0)                                               # [d]
    c = float(g_b @ g_b)
    if n == 0 or c <= 0.0:
        return np.ones(n), f, c
    if n <= d:
        p = f @ f.T                                                   # [N, N]
        m = p + (ridge * float(np.trace(p)) / n) * np.eye(n) if ridge else p
        if not ridge and _inverse_applies(m, rcond):                  # every eigenvalue kept: P⁺ = P⁻¹
            return _rescale_features(np.linalg.solve(m, i), f, c), f, c
        e, v = np.linalg.eigh(m)                                      # m = V diag(e) Vᵀ
        keep = np.abs(e) > rcond * np.abs(e).max()
        inv = np.divide(1.0, e, out=np.zeros_like(e), where=keep)
        w = v @ (inv * (v.T @ i))                                     # (P + λI)⁺Î
        return _rescale_features(w, f, c), f, c
    gram = f.T @ f                                                    # [d, d] = FᵀF
    lam = ridge * float(np.trace(gram)) / n if ridge else 0.0
    if not lam and _inverse_applies(gram, rcond):                     # P⁺ = F·(FᵀF)⁻²·Fᵀ
        w = f @ np.linalg.solve(gram, np.linalg.solve(gram, f.T @ i))
        return _rescale_features(w, f, c), f, c
    e, v = np.linalg.eigh(gram)
    top = max(float(np.abs(e + lam).max()), lam)                      # largest |eigenvalue| of P + λI
    proj = v.T @ (f.T @ i)                                            # [d] = VᵀFᵀÎ
    if lam > rcond * top:                                             # every eigenvalue kept
        w = (i - f @ (v @ (proj / (e + lam)))) / lam
    else:                                                             # span(F) only
        keep = (np.abs(e + lam) > rcond * top) & (e > 0)
        coef = np.divide(1.0, e * (e + lam), out=np.zeros_like(e), where=keep)
        w = f @ (v @ (coef * proj))
    return _rescale_features(w, f, c), f, c


def _inverse_applies(m: np.ndarray, rcond: float) -> bool:
    """True when every eigenvalue of the symmetric positive semi-definite `m` is at least
    ‖m‖_F / _DIRECT_COND: the pseudo-inverse then keeps all of them (‖m‖_F ≥ the largest, and
    1/_DIRECT_COND > rcond), so m⁺ is m⁻¹, applied by LU solves instead of the eigendecomposition.

    The certificate is one Cholesky factorisation of m − δI, δ = ‖m‖_F / _DIRECT_COND: it
    succeeds only when m − δI is positive definite up to rounding (≈ d·eps·‖m‖, far below δ),
    i.e. when m's smallest eigenvalue exceeds δ. At d = 64 the Cholesky and two solves cost about
    a quarter of the eigendecomposition. The two routes differ by rounding only; with the
    condition number at most _DIRECT_COND = 1e4 they agree to about that times the float64
    epsilon (~1e-12 relative) at worst and ~1e-14 on well-conditioned features (within 1e-10 of
    an SVD pseudo-inverse: tests/test_methods_diem.py). Otherwise (rank
    deficiency, a cut eigenvalue, an ill-conditioned Gram) the eigendecomposition decides, and
    with a ridge it always does (bit for bit the earlier weights)."""
    if not rcond * _DIRECT_COND < 1e-2:
        return False
    scale = float(np.sqrt(np.einsum("ij,ij->", m, m)))
    if not (scale > 0.0 and np.isfinite(scale)):
        return False
    try:
        np.linalg.cholesky(m - (scale / _DIRECT_COND) * np.eye(m.shape[0]))
    except np.linalg.LinAlgError:
        return False
    return True


def _rescale(w: np.ndarray, p: np.ndarray, c: float) -> np.ndarray:
    """w·sqrt(C / wᵀPw) (= ‖wᵀF‖² in the denominator); ones when wᵀPw is 0."""
    q = float(w @ p @ w)
    if not q > 1e-300 * max(c, 1e-300) or not np.isfinite(q):
        return np.ones(w.shape[0])
    return w * np.sqrt(c / q)


def _rescale_features(w: np.ndarray, f: np.ndarray, c: float) -> np.ndarray:
    """`_rescale` with wᵀPw = ‖Fᵀw‖², from the features F [N, d] (P = F·Fᵀ never formed)."""
    u = f.T @ w
    q = float(u @ u)
    if not q > 1e-300 * max(c, 1e-300) or not np.isfinite(q):
        return np.ones(w.shape[0])
    return w * np.sqrt(c / q)


def cap_weights(w: np.ndarray, p: np.ndarray, c: float, cap: float) -> np.ndarray:
    """float64[N] non-negative weights `w` bounded by `cap`, keeping ‖WᵀF‖² = C where it can.

    Water-filling: weights above `cap` are set to `cap`; the others are multiplied by one common
    factor s ≥ 0 chosen so that ‖WᵀF‖² = WᵀPW = C again (the larger root of
    (a + s·b)ᵀP(a + s·b) = C, a = the capped part, b = the free part; with no real root, the s
    that brings the norm closest); repeated while that factor lifts another weight past `cap`
    (at most N rounds: the capped set only grows). When every non-zero weight is capped the
    result is `cap` on those and the norm may stay below C. `cap` ≥ 1, so a uniform W = 1 is
    never changed.

    f_1 = [1, 0], f_2 = [0, 0.01] (P = diag(1, 1e-4), C = ‖1ᵀF‖² = 1.0001) and weights
    [sqrt(0.7501), 50] (WᵀPW = 0.7501 + 0.25 = C): the second is capped at 4 and the first
    scaled to sqrt(C − 16·1e-4) = sqrt(0.9985):

    >>> cap_weights(np.array([np.sqrt(0.7501), 50.0]), np.diag([1.0, 1e-4]), 1.0001, 4.0).round(6).tolist()
    [0.99925, 4.0]
    """
    p = np.asarray(p, dtype=np.float64)
    return _cap(w, lambda a, b: (float(a @ p @ a), float(a @ p @ b), float(b @ p @ b)), c, cap)


def _cap_features(w: np.ndarray, f: np.ndarray, c: float, cap: float) -> np.ndarray:
    """`cap_weights` with the quadratic forms from the features F [N, d]: aᵀPb = (Fᵀa)·(Fᵀb)."""
    def forms(a, b):
        ua, ub = f.T @ a, f.T @ b
        return float(ua @ ua), float(ua @ ub), float(ub @ ub)
    return _cap(w, forms, c, cap)


def _cap(w: np.ndarray, forms, c: float, cap: float) -> np.ndarray:
    """The water-filling of `cap_weights`; forms(a, b) = (aᵀPa, aᵀPb, bᵀPb)."""
    w = np.asarray(w, dtype=np.float64)
    fixed = w >= cap
    if not fixed.any():
        return w
    for _ in range(w.shape[0]):
        a = np.where(fixed, cap, 0.0)                                 # capped part
        b = np.where(fixed, 0.0, w)                                   # free part
        aa, ab, bb = forms(a, b)
        if bb <= 0.0:
            return a + b
        disc = ab * ab - bb * (aa - c)
        s = (-ab + np.sqrt(disc)) / bb if disc >= 0 else -ab / bb
        out = a + max(s, 0.0) * b
        over = ~fixed & (out > cap)
        if not over.any():
            return out
        fixed |= over
    return np.minimum(out, cap)


def diem_importance(kind: str, features: np.ndarray | None, ref: np.ndarray | None,
                    pass_rate: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray | None:
    """float64[N] importance Î (η omitted) of each sample, or None when `kind` needs features
    that are missing. `features` float64[N, d], `ref` float64[d] or None, `pass_rate`
    float64[N] (each sample's group pass rate). "reference" without `ref` is "loo".

    >>> f = np.array([[1.0, 0.0], [1.0, 1.0]])
    >>> diem_importance("loo", f, None, np.zeros(2)).tolist()           # ⟨f_z, g_B − f_z⟩
    [1.0, 1.0]
    >>> diem_importance("batch", f, None, np.zeros(2)).tolist()         # ⟨f_z, g_B⟩, g_B = [2, 1]
    [2.0, 3.0]
    """
    if kind in _GRADIENT_SCORES:
        if features is None:
            return None
        if kind == "reference" and ref is not None:
            return features @ ref
        g_b = features.sum(axis=0)
        if kind == "batch":
            return features @ g_b
        # loo (and reference without a reference): ⟨f_z, g_B − f_z⟩ with the difference formed
        # first — ⟨f_z, g_B⟩ − ‖f_z‖² would cancel to rounding noise when f_z is the only
        # non-zero row (a batch with one informative group), and that noise's sign would decide.
        return np.einsum("nd,nd->n", features, g_b[None, :] - features)
    if kind == "random":
        return rng.random(pass_rate.shape[0])
    if kind == "pass_at_k":
        return pass_rate.astype(np.float64)
    if kind == "difficulty":
        return 1.0 - pass_rate
    # "median_distance": closer to the batch's median pass rate = more important
    return -np.abs(pass_rate - np.median(pass_rate)) if pass_rate.size else pass_rate.copy()


def diem(importance: str = "batch", solver: str = "constrained", ridge: float = 0.0,
         unit: str = "prompt", relu: bool = True, rescale_after_relu: bool = True,
         temperature: float = 1.0, seed: int = 0, max_weight: float | None = MAX_WEIGHT) -> DataPolicy:
    """DIEM (arXiv 2608.29252): per-sample loss weights maximising gradient-alignment importance at the batch gradient's norm.

    See the module docstring for the rule, why the published definition gives uniform
    weights, and which options do not; docs/methods/diem.md.

    Args:
        importance: "batch" (the published Î = F·g_B; default). It gives weights 1, and so the
            plain GRPO update, when P = F·Fᵀ has full numerical rank: every eigenvalue above
            1e-10 × the largest (the pseudo-inverse's cut-off), which needs N ≤ d and no
            sample's features ≲ 1e-5 of the largest or nearly a combination of the others'.
            Otherwise the dropped directions change the weights: with N > d, W − 1 lies in
            null(Fᵀ) and the update is unchanged before the ReLU; with one group at 1e-6 scale
            among orthogonal ones the weights are [1, 1, 1, 0] and that group's gradient
            leaves the update. "loo" (Î_z = ⟨f_z, g_B − f_z⟩), "reference" (Î = F·h, h =
            `Feedback.ref_grad`; "loo" when absent), or an ablation "random" | "pass_at_k" |
            "difficulty" | "median_distance". Measured on the embedded suite, every non-trivial
            variant trained worse than uniform weights (docs/methods/diem.md), hence the default.
        solver: "constrained" (the closed form) or "softmax" (W = N·softmax(Î/(T·max|Î|))).
        ridge: ρ in λ = ρ·tr(P)/N (0 = the pseudo-inverse of P, default).
        unit: "prompt" (a sample is a prompt's group: f_z = Σ_j f_zj, one weight per group,
            the paper's GRPO group form) or "rollout" (N = B·G samples).
        relu: clip negative weights to 0 (the paper's post-processing).
        rescale_after_relu: rescale the clipped weights so ‖WᵀF‖ = ‖1ᵀF‖ again.
        temperature: T of the softmax solver.
        seed: randomness of the "random" ablation, from (seed, step).
        max_weight: cap c ≥ 1 of one weight under the constrained solver (`cap_weights`: weights
            above c are set to c, the others scaled so that ‖WᵀF‖ = ‖1ᵀF‖ again); None leaves the
            weights unbounded. The exact solution of "loo" and "reference" is unbounded: it piles
            weight on samples with tiny features, which move the update little per unit of weight
            (8 groups, d = 64, one group's features 100× smaller: weights up to 241 on it, most
            other groups at 0; docs/methods/diem.md). Weights ≤ c are left as they are, so
            the published rule's weights are unchanged (they are 1 where P has full rank).

    Example (hand-computed; ridge regime, see docs/methods/diem.md): two orthogonal rollout
    features f_1 = [1, 0], f_2 = [0, 2] with Î = P·1 = [1, 4] and λ = ρ·tr(P)/2 = 2.5 at
    ρ = 1 give W ∝ [1/3.5, 4/6.5] = [0.28571, 0.61538], with WᵀPW = 1.59653 rescaled by
    sqrt(C / WᵀPW) = sqrt(5 / 1.59653) = 1.76968: [0.5056, 1.0891].

    >>> from rlpace import Pool, Feedback; from rlpace.types import Batch
    >>> pool = Pool([0]); p = diem(importance="batch", ridge=1.0, unit="rollout")
    >>> fb = Feedback([0], [[1, 0]], grads=[[[1, 0], [0, 2]]], step=0)
    >>> p.apply(p.init(pool), pool, Batch.from_feedback(fb, pool, 0.5)).round(4).tolist()
    [[0.5056, 1.0891]]
    """
    check_choice("diem", "importance", importance, _GRADIENT_SCORES + _ABLATION_SCORES)
    check_choice("diem", "solver", solver, ("constrained", "softmax"))
    check_real("diem", "ridge", ridge, low=0, hint=" (0 = pseudo-inverse)")
    check_choice("diem", "unit", unit, ("prompt", "rollout"))
    if not isinstance(relu, (bool, np.bool_)):
        raise InputError(f"diem relu must be True or False; got {relu!r}.")
    if not isinstance(rescale_after_relu, (bool, np.bool_)):
        raise InputError(f"diem rescale_after_relu must be True or False; got {rescale_after_relu!r}.")
    check_real("diem", "temperature", temperature, low=0, low_open=True)
    check_int("diem", "seed", seed, low=0, high=2**63 - 1)
    if max_weight is not None:
        check_real("diem", "max_weight", max_weight, low=1, hint=" (None = no cap)")

    def apply(state, pool, batch):
        shape = batch.rewards.shape
        b = shape[0]
        if b == 0:
            return np.ones(shape)
        feats = None
        if batch.grads is not None and batch.grads.shape[2] > 0:
            g = batch.grads                                         # float32[B, G, d]
            # [B, d]: the G rollouts summed in float64, in order (the Feedback derived the sums in
            # the pass that validated the features: `group_grad_sums`), or [B·G, d]
            feats = (group_grad_sums(batch) if unit == "prompt"
                     else g.reshape(-1, g.shape[2]).astype(np.float64))
            top = max(float(feats.max()), -float(feats.min()))     # max |entry|, no [N, d] temporary
            if top > 0:
                feats = feats / top                                 # scale-free (module docstring)
        ref = None
        if batch.ref_grad is not None:
            ref = batch.ref_grad.astype(np.float64)
            top = np.abs(ref).max()
            ref = ref / top if top > 0 else ref
        rate = batch.pass_rate if unit == "prompt" else np.repeat(batch.pass_rate, shape[1])
        rng = np.random.default_rng([seed, batch.step, _STREAM_RANDOM]) if importance == "random" else None
        score = diem_importance(importance, feats, ref, rate, rng)
        if score is None:
            return np.ones(shape)
        if solver == "softmax":
            top = np.abs(score).max()
            z = score / (temperature * top) if top > 0 else score
            e = np.exp(z - z.max())
            w = e / e.sum() * e.shape[0]
        else:
            if feats is None:
                return np.ones(shape)
            w, f, c = _solve(feats, score, ridge)
            if relu:
                w = np.maximum(w, 0.0)
                if rescale_after_relu:
                    w = _rescale_features(w, f, c)
                if not (w > 0).any():
                    w = np.ones_like(w)      # every weight clipped: fall back to plain GRPO
            if max_weight is not None:
                w = _cap_features(w, f, c, float(max_weight))
        w = np.where(np.isfinite(w), w, 1.0)
        return np.repeat(w[:, None], shape[1], axis=1) if unit == "prompt" else w.reshape(shape)

    reads = frozenset({"grads", "ref_grad"}) if importance == "reference" else frozenset({"grads"})
    return DataPolicy(REWEIGHTING, _empty_init, _no_update, apply, name="diem", reads=reads)
