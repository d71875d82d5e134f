"""DIEM reweighting (docs/methods/diem.md): the published rule is uniform on full-rank
Gram matrices; hand-computed weights in the ridge and rank-deficient regimes; the
magnitude constraint ‖WᵀF‖ = ‖1ᵀF‖; the ReLU; the ablations; the fallback without features."""

import numpy as np
import pytest

from rlpace import Feedback, Pool, Scheduler
from rlpace.policies import make_policy
from rlpace.policies._diem import MAX_WEIGHT, cap_weights, constrained_weights, diem, diem_importance
from rlpace.types import Batch

POOL = Pool(["a"] * 4 + ["b"] * 4)


def _weights(policy, grads, rewards=None, ref=None, step=0):
    grads = np.asarray(grads, dtype=np.float64)
    b, g = grads.shape[:2]
    rewards = np.tile([1.0, 0.0], (b, g // 2)) if rewards is None else rewards
    fb = Feedback(np.arange(b), rewards, step=step, grads=grads, ref_grad=ref)
    return policy.apply(policy.init(POOL), POOL, Batch.from_feedback(fb, POOL, 0.5))


@pytest.mark.parametrize("seed", range(5))
def test_published_rule_is_uniform_on_full_rank_gram(seed):
    rng = np.random.default_rng(seed)
    f = rng.standard_normal((8, 64))                     # N = 8 ≤ d = 64: P invertible
    i = f @ f.sum(axis=0)                                # Î = F·g_B (η cancels)
    w = constrained_weights(f, i, ridge=0.0)
    np.testing.assert_allclose(w, 1.0, rtol=0, atol=1e-10)
    # through the policy, rollout unit, ReLU on: still exactly uniform
    p = diem(importance="batch", ridge=0.0, unit="rollout")
    np.testing.assert_allclose(_weights(p, f.reshape(4, 2, 64)), 1.0, rtol=0, atol=1e-10)


def test_ridge_regime_hand_computed():
    # f1 = [1, 0], f2 = [0, 2]: P = diag(1, 4), Î = P·1 = [1, 4], λ = 1·tr(P)/2 = 2.5,
    # W ∝ [1/3.5, 4/6.5]; WᵀPW = (1/3.5)² + 4·(4/6.5)² = 1.596534; C = ‖[1, 2]‖² = 5.
    w0 = np.array([1 / 3.5, 4 / 6.5])
    expect = w0 * np.sqrt(5 / (w0[0] ** 2 + 4 * w0[1] ** 2))
    np.testing.assert_allclose(expect, [0.505641, 1.089074], atol=1e-6)
    f = np.array([[1.0, 0.0], [0.0, 2.0]])
    np.testing.assert_allclose(constrained_weights(f, f @ f.sum(axis=0), ridge=1.0), expect, rtol=1e-12)
    p = diem(importance="batch", ridge=1.0, unit="rollout")
    np.testing.assert_allclose(_weights(p, f[None]), expect[None], rtol=1e-12)


def test_rank_deficient_regime_hand_computed():
    # N = 3 > d = 1, f = [1, 1, 2]: P⁺P·1 projects 1 on span(f): (1ᵀf / fᵀf)·f = (4/6)·f.
    f = np.array([[1.0], [1.0], [2.0]])
    w = constrained_weights(f, f @ f.sum(axis=0), ridge=0.0)
    np.testing.assert_allclose(w, [2 / 3, 2 / 3, 4 / 3], rtol=1e-12)
    assert float(w @ f[:, 0]) == pytest.approx(4.0)        # WᵀF = 1ᵀF: same update


@pytest.mark.parametrize("kind, ridge, n, d", [("batch", 0.0, 32, 6), ("loo", 0.0, 8, 64),
                                               ("loo", 0.3, 32, 6), ("reference", 0.0, 8, 64),
                                               ("reference", 0.0, 32, 6), ("batch", 5.0, 8, 64)])
def test_norm_constraint_before_relu(kind, ridge, n, d):
    rng = np.random.default_rng(n + d)
    f = rng.standard_normal((n, d)) + 0.3
    ref = rng.standard_normal(d)
    i = diem_importance(kind, f, ref, np.zeros(n))
    w = constrained_weights(f, i, ridge=ridge)
    np.testing.assert_allclose(np.linalg.norm(w @ f), np.linalg.norm(f.sum(axis=0)), rtol=1e-9)
    if kind == "batch" and ridge == 0.0:                     # rank deficient: same update, W ≠ 1
        np.testing.assert_allclose(w @ f, f.sum(axis=0), rtol=1e-9, atol=1e-9)
        assert np.abs(w - 1).max() > 0.05
    else:
        assert np.abs(w - 1).max() > 0.01                    # non-trivial weights


def test_loo_importance_matches_a_loop():
    rng = np.random.default_rng(3)
    f = rng.standard_normal((5, 7))
    loop = [f[z] @ (f.sum(axis=0) - f[z]) for z in range(5)]
    np.testing.assert_allclose(diem_importance("loo", f, None, np.zeros(5)), loop, rtol=1e-12)
    # "reference" without a reference is "loo"
    np.testing.assert_allclose(diem_importance("reference", f, None, np.zeros(5)), loop, rtol=1e-12)


def test_relu_case_hand_computed():
    # Reference h = [1, −1] on f1 = [1, 0], f2 = [0, 1]: P = I, W ∝ Î = F·h = [1, −1];
    # C = ‖[1, 1]‖² = 2 = WᵀPW: W* = [1, −1]. ReLU → [1, 0], rescaled to WᵀPW = C: [√2, 0].
    f = np.array([[[1.0, 0.0], [0.0, 1.0]]])
    np.testing.assert_allclose(constrained_weights(f[0], f[0] @ [1.0, -1.0]), [1.0, -1.0], rtol=1e-12)
    p = diem(importance="reference", ridge=0.0, unit="rollout")
    np.testing.assert_allclose(_weights(p, f, ref=[1.0, -1.0]), [[np.sqrt(2), 0.0]], rtol=1e-12)
    p = diem(importance="reference", ridge=0.0, unit="rollout", rescale_after_relu=False)
    np.testing.assert_allclose(_weights(p, f, ref=[1.0, -1.0]), [[1.0, 0.0]], rtol=1e-12)
    p = diem(importance="reference", ridge=0.0, unit="rollout", relu=False)
    # the Scheduler refuses negative weights; the policy itself returns W*
    np.testing.assert_allclose(_weights(p, f, ref=[1.0, -1.0]), [[1.0, -1.0]], rtol=1e-12)


def test_prompt_unit_sums_rollout_features_and_broadcasts():
    # groups: prompt 0 = rollouts [1,0],[1,0] → f = [2, 0]; prompt 1 → [0, 1]. h = [1, 1]:
    # P = diag(4, 1), Î = [2, 1], W ∝ P⁻¹Î = [0.5, 1]; WᵀPW = 1 + 1 = 2, C = ‖[2, 1]‖² = 5.
    g = np.array([[[1.0, 0.0], [1.0, 0.0]], [[0.0, 0.5], [0.0, 0.5]]])
    w = _weights(diem(importance="reference", ridge=0.0), g, ref=[1.0, 1.0])
    expect = np.array([0.5, 1.0]) * np.sqrt(5 / 2)
    np.testing.assert_allclose(w, np.repeat(expect[:, None], 2, axis=1), rtol=1e-12)


def test_without_features_weights_are_one():
    s = Scheduler(POOL, "diem")
    fb = Feedback([0, 5], [[1, 0, 1, 1], [0, 0, 0, 1]], step=0)
    np.testing.assert_array_equal(s.loss_weights(fb), np.ones((2, 4)))


def test_softmax_ablation_hand_computed_and_needs_no_features():
    # pass_at_k score = pass rates [0.5, 0.25], max 0.5, T = 1: z = [1, 0.5];
    # W = 2·softmax(z) = 2·[e, e^0.5] / (e + e^0.5).
    p = make_policy("diem", importance="pass_at_k", solver="softmax")
    fb = Feedback([0, 1], [[1, 0, 1, 0], [1, 0, 0, 0]], step=0)
    w = p.apply(p.init(POOL), POOL, Batch.from_feedback(fb, POOL, 0.5))
    e = np.exp([1.0, 0.5])
    np.testing.assert_allclose(w[:, 0], 2 * e / e.sum(), rtol=1e-12)
    assert (w == w[:, :1]).all()


def test_random_ablation_depends_on_seed_and_step_only():
    g = np.random.default_rng(0).standard_normal((2, 2, 5))
    p = diem(importance="random", solver="softmax", seed=3)
    a, b = _weights(p, g, step=4), _weights(p, g, step=4)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, _weights(p, g, step=5))


def test_scale_invariance_and_huge_features_stay_finite():
    g = np.random.default_rng(1).standard_normal((3, 2, 4))
    p = diem()
    w1 = _weights(p, g)
    np.testing.assert_allclose(_weights(p, g * 1e30), w1, rtol=1e-9)
    assert np.isfinite(_weights(p, np.full((3, 2, 4), 3e38))).all()
    np.testing.assert_array_equal(_weights(p, np.zeros((3, 2, 4))), 1.0)   # no gradient: uniform


def test_loss_weights_through_the_scheduler_are_nonneg_and_match_the_policy():
    g = np.random.default_rng(2).standard_normal((3, 2, 16)).astype(np.float32)
    s = Scheduler(POOL, "diem", importance="loo", ridge=0.0)
    fb = Feedback([0, 1, 2], [[1, 0], [0, 1], [1, 1]], grads=g, step=0)
    w = s.loss_weights(fb)
    f = g.astype(np.float64).sum(axis=1)
    w0 = constrained_weights(f, diem_importance("loo", f, None, np.zeros(3)))
    w0 = np.maximum(w0, 0)
    w0 = w0 * np.linalg.norm(f.sum(axis=0)) / np.linalg.norm(w0 @ f)
    np.testing.assert_allclose(w, np.repeat(w0[:, None], 2, axis=1), rtol=1e-6)
    assert (w >= 0).all()


def test_bad_hyperparameters_are_refused():
    for kw in ({"importance": "grad"}, {"ridge": -1.0}, {"unit": "token"}, {"relu": 1},
               {"temperature": 0.0}, {"seed": -2}, {"max_weight": 0.5}, {"max_weight": float("inf")},
               {"max_weight": True}):
        with pytest.raises(ValueError, match=f"diem {next(iter(kw))}"):
            diem(**kw)


def test_one_informative_group_gets_uniform_weights_not_rounding_noise():
    # Only group 1 has a gradient (the others have A = 0): g_B − f_1 = 0 exactly, so Î = 0 and
    # the weights are 1 — before, ⟨f_1, g_B⟩ − ‖f_1‖² left rounding noise whose sign chose W.
    g = np.zeros((4, 2, 5))
    g[1] = np.random.default_rng(0).standard_normal((2, 5)) * 0.37
    np.testing.assert_array_equal(_weights(diem(importance="loo"), g), np.ones((4, 2)))
    assert (diem_importance("loo", g.sum(axis=1), None, np.zeros(4)) == 0).all()


def test_default_is_the_published_rule_and_gives_uniform_weights():
    p = diem()
    g = np.random.default_rng(4).standard_normal((4, 2, 32))         # 4 groups ≤ d = 32: full rank
    np.testing.assert_allclose(_weights(p, g), 1.0, rtol=0, atol=1e-10)
    s = Scheduler(POOL, "diem")
    assert s.hyperparameters[0][1]["importance"] == "batch" and s.hyperparameters[0][1]["ridge"] == 0.0


# ---- the weight cap (`max_weight`) ------------------------------------------------------------
def _tiny_group_batch(seed):
    """8 groups × 2 rollouts, d = 64, group 0's features 100× smaller than the others'."""
    g = np.random.default_rng(seed).standard_normal((8, 2, 64))
    g[0] *= 0.01
    return g


def test_loo_and_reference_weights_are_capped_by_default_on_a_tiny_gradient_group():
    # Uncapped, the exact solution piles weight on the group whose features are 100× smaller:
    # it moves the update little per unit of weight. The default cap bounds every weight by 4
    # and keeps the update's norm ‖WᵀF‖ = ‖1ᵀF‖ (the free weights are scaled up to make room).
    assert MAX_WEIGHT == 4.0
    top_uncapped = []
    for seed in range(10):
        g = _tiny_group_batch(seed)
        f = g.astype(np.float32).sum(axis=1, dtype=np.float64)        # Feedback holds float32 features
        ref = np.random.default_rng(100 + seed).standard_normal(64)
        for kind in ("loo", "reference"):
            capped = _weights(diem(importance=kind), g, ref=ref)[:, 0]
            free = _weights(diem(importance=kind, max_weight=None), g, ref=ref)[:, 0]
            top_uncapped.append(free.max())
            assert capped.max() <= 4.0 + 1e-12 and (capped >= 0).all()
            if free.max() <= 4.0:                                   # nothing to cap: unchanged
                np.testing.assert_array_equal(capped, free)
            elif (capped[free > 0] < 4.0).any():                    # a free weight left: norm kept
                fn = f / np.abs(f).max()
                np.testing.assert_allclose(np.linalg.norm(capped @ fn), np.linalg.norm(fn.sum(axis=0)), rtol=1e-9)
    assert max(top_uncapped) > 50.0                                  # the pile-up the cap removes


def test_cap_weights_hand_computed_water_filling():
    # f = e1, 0.1·e2, 0.01·e3: P = diag(1, 1e-2, 1e-4), C = ‖1ᵀF‖² = 1.0101; cap 4.
    p, c = np.diag([1.0, 1e-2, 1e-4]), 1.0101
    # round 1: w3 = 60 → 4; the free part [0.1, 3.5] is scaled by s = sqrt((C − 16e-4)/0.1325)
    # = 2.7589, which lifts w2 to 9.66 > 4 → round 2: w2 = 4 too, and
    # w1 = sqrt(C − 16·1e-2 − 16·1e-4) = sqrt(0.8485)
    w = cap_weights(np.array([0.1, 3.5, 60.0]), p, c, 4.0)
    np.testing.assert_allclose(w, [np.sqrt(0.8485), 4.0, 4.0], rtol=1e-12)
    assert float(w @ p @ w) == pytest.approx(c, rel=1e-12)
    # the docstring's two-sample case; and weights under the cap are returned unchanged
    np.testing.assert_allclose(cap_weights(np.array([np.sqrt(0.7501), 50.0]), np.diag([1.0, 1e-4]), 1.0001, 4.0),
                               [np.sqrt(0.9985), 4.0], rtol=1e-12)
    w0 = np.array([0.5, 3.99, 0.0])
    np.testing.assert_array_equal(cap_weights(w0, p, c, 4.0), w0)


def test_default_is_plain_grpo_only_when_the_gram_matrix_has_full_numerical_rank():
    # Orthogonal features e1, e2, e3 and s·e4 (one group at scale s): P = diag(1, 1, 1, s²).
    # The pseudo-inverse keeps eigenvalues above 1e-10 × the largest, so at s = 1e-4 (1e-8)
    # P has full rank and W = 1; at s = 1e-6 (1e-12) the fourth direction is dropped:
    # W = [1, 1, 1, 0] rescaled by sqrt(C / 3) = sqrt((3 + 1e-12) / 3), i.e. 1 to 1e-12, and
    # the fourth group's gradient leaves the update.
    pool = Pool(["a"] * 4)

    def w_of(scale):
        f = np.eye(4)
        f[3] *= scale
        fb = Feedback(np.arange(4), np.tile([1.0, 0.0], (4, 1)), grads=np.repeat(f[:, None] / 2, 2, axis=1), step=0)
        p = diem()
        return p.apply(p.init(pool), pool, Batch.from_feedback(fb, pool, 0.5))[:, 0]
    np.testing.assert_allclose(w_of(1e-4), [1.0, 1.0, 1.0, 1.0], rtol=0, atol=1e-12)
    np.testing.assert_allclose(w_of(1e-6), [1.0, 1.0, 1.0, 0.0], rtol=0, atol=1e-12)


def test_read_only_float32_grads_are_kept_without_a_copy():
    """A float32 grads array the caller marked read-only is kept as a read-only view (no copy
    of the B·G·d features); a writeable one is still copied; both are validated the same, and
    diem's weights are the same numbers either way."""
    from rlpace import Feedback, Pool, Scheduler
    rng = np.random.default_rng(0)
    g = rng.standard_normal((4, 3, 5)).astype(np.float32)
    ro = g.copy()
    ro.setflags(write=False)
    kept = Feedback(np.arange(4), np.ones((4, 3)), step=0, grads=ro)
    copied = Feedback(np.arange(4), np.ones((4, 3)), step=0, grads=g)
    assert np.shares_memory(kept.grads, ro) and not kept.grads.flags.writeable
    assert not np.shares_memory(copied.grads, g) and not copied.grads.flags.writeable
    assert not np.shares_memory(Feedback([0], [[1.0]], step=0).with_grads(g[:1, :1]).grads, g)
    assert np.shares_memory(Feedback([0], [[1.0]], step=0).with_grads(ro[:1, :1]).grads, ro)
    bad = g.copy()
    bad[1, 2, 3] = np.nan
    bad.setflags(write=False)
    with pytest.raises(ValueError, match="Feedback.grads has NaN"):
        Feedback(np.arange(4), np.ones((4, 3)), step=0, grads=bad)
    pool = Pool(["a"] * 4)
    w_kept = Scheduler(pool, "diem", importance="loo").loss_weights(kept)
    w_copied = Scheduler(pool, "diem", importance="loo").loss_weights(copied)
    np.testing.assert_array_equal(w_kept, w_copied)
    assert not np.allclose(w_kept, 1.0)                     # loo: non-uniform weights


# ---- the direct solve: LU solves instead of the eigendecomposition on a well-conditioned Gram --
def _default_weights_reference(g):
    """float64[B] the default diem weights of float32 features g [B, G, d], written out: group
    sums by a loop over rollouts, P = F·Fᵀ pseudo-inverted through the SVD (np.linalg.pinv) on
    the B × B matrix, Î = F·g_B = P·1, rescaled to ‖WᵀF‖ = ‖1ᵀF‖, ReLU, rescaled again."""
    f = np.zeros((g.shape[0], g.shape[2]))
    for j in range(g.shape[1]):
        f += g[:, j].astype(np.float64)
    f /= np.abs(f).max()
    p = f @ f.T
    c = float(f.sum(axis=0) @ f.sum(axis=0))
    w = np.linalg.pinv(p, rcond=1e-10, hermitian=True) @ (p @ np.ones(len(f)))
    w = np.maximum(w * np.sqrt(c / (w @ p @ w)), 0.0)
    return w * np.sqrt(c / (w @ p @ w)), f


@pytest.mark.parametrize("b, g, d", [(64, 8, 8),      # the stream digest's batches
                                     (512, 16, 64),   # the overhead benchmark's
                                     (16, 8, 256)])   # the built-in trainer's (N ≤ d)
def test_direct_solve_within_1e_10_of_the_float64_pseudo_inverse(b, g, d):
    from rlpace.policies._diem import _inverse_applies
    rng = np.random.default_rng(b + d)
    grads = rng.standard_normal((b, g, d)).astype(np.float32)
    ref, f = _default_weights_reference(grads)
    gram = f.T @ f if b > d else f @ f.T
    assert _inverse_applies(gram, 1e-10)                 # the direct route is the one taken
    assert ref.max() < MAX_WEIGHT                         # the cap does not bind: the rule alone
    fb = Feedback(np.arange(b), rng.integers(0, 2, (b, g)).astype(float), step=0, grads=grads)
    pool = Pool(list(range(b)))
    w = diem().apply((), pool, Batch.from_feedback(fb, pool, 0.5))
    assert np.abs(w - ref[:, None]).max() <= 1e-10 * np.abs(ref).max()
    if b > d:
        assert np.abs(ref - 1.0).max() > 1e-3            # N > d: not the trivial all-ones answer


def test_inverse_applies_only_when_every_eigenvalue_clears_the_margin():
    from rlpace.policies._diem import _DIRECT_COND, _inverse_applies
    rng = np.random.default_rng(0)
    v, _ = np.linalg.qr(rng.standard_normal((6, 6)))     # a random orthogonal basis
    top = np.array([4.0, 3.0, 2.0, 1.0, 0.5])
    fro = lambda e: np.sqrt(np.sum(e ** 2))              # ‖V diag(e) Vᵀ‖_F
    for factor, want in ((2.0, True), (0.5, False)):      # smallest eigenvalue 2δ or δ/2, δ = ‖m‖_F / 1e4
        e = np.append(top, 0.0)
        for _ in range(50):                               # the fixed point e_min = factor·‖m‖_F / 1e4
            e[-1] = factor * fro(e) / _DIRECT_COND
        assert _inverse_applies(v @ np.diag(e) @ v.T, 1e-10) is want
    rank4 = v @ np.diag(np.append(top[:4], [0.0, 0.0])) @ v.T
    assert not _inverse_applies(rank4, 1e-10)            # rank deficient: the pseudo-inverse cuts
    assert not _inverse_applies(np.zeros((3, 3)), 1e-10)
    assert not _inverse_applies(np.eye(3), 1e-3)          # a coarse cut-off: the eigendecomposition decides
    assert _inverse_applies(np.eye(3), 1e-10)


# ---- the group sums: derived by the pass that validates Feedback.grads, read by diem ------------
def test_feedback_grad_sums_come_from_the_validating_pass():
    from rlpace.types import group_grad_sums
    rng = np.random.default_rng(1)
    g = (rng.standard_normal((5, 4, 3)) * np.exp(rng.uniform(-40, 40, (5, 4, 3)))).astype(np.float32)
    loop = np.zeros((5, 3))
    for j in range(4):                                     # rollouts added in order, in float64
        loop += g[:, j].astype(np.float64)
    ro = g.copy()
    ro.setflags(write=False)
    for grads in (g, ro, g.astype(np.float64)):            # copied, kept as a view, cast from float64
        fb = Feedback(np.arange(5), np.ones((5, 4)), step=0, grads=grads)
        np.testing.assert_array_equal(fb.grad_sums, loop)  # bit for bit
        assert not fb.grad_sums.flags.writeable
        batch = Batch.from_feedback(fb, Pool(list(range(5))), 0.5)
        assert batch.grad_sums is fb.grad_sums and group_grad_sums(batch) is fb.grad_sums
        np.testing.assert_array_equal(group_grad_sums(batch._replace(grad_sums=None)), loop)
    later = Feedback(np.arange(5), np.ones((5, 4)), step=0).with_grads(2 * g)
    np.testing.assert_array_equal(later.grad_sums, 2 * loop)
    assert Feedback([0], [[1.0]], step=0).grad_sums is None
    ragged = Feedback([0, 1], np.ones((2, 2)), step=0, grads=np.ones((2, 2, 3)), group_sizes=[2, 1])
    assert ragged.grad_sums is None                        # padding columns: the parts have their own
    assert [part.grad_sums.tolist() for _, part in ragged.by_size()] == [[[1.0] * 3], [[2.0] * 3]]
    for value, dtype in ((np.nan, np.float32), (np.inf, np.float32), (-np.inf, np.float32), (1e39, np.float64)):
        bad = g.astype(dtype)
        bad[3, 1, 2] = value
        for arr in (bad, bad.copy()):
            arr.setflags(write=False)
            with pytest.raises(ValueError, match=r"Feedback.grads has NaN.*first at \[3, 1, 2\]"):
                Feedback(np.arange(5), np.ones((5, 4)), step=0, grads=arr)
    big = np.full((1, 2, 1), np.finfo(np.float32).max, np.float32)
    assert Feedback([0], [[1.0, 1.0]], step=0, grads=big).grad_sums.tolist() == [[2 * 3.4028234663852886e+38]]


def test_features_given_to_step_replace_the_sums_of_earlier_ones():
    rng = np.random.default_rng(2)
    old, new = (rng.standard_normal((4, 3, 6)).astype(np.float32) for _ in range(2))
    rewards = rng.integers(0, 2, (4, 3)).astype(float)
    pool = Pool(list(range(4)))
    s = Scheduler(pool, "diem", importance="loo")
    got = s.step(Feedback(np.arange(4), rewards, step=0, grads=old), features=lambda adm: new).weights
    want = Scheduler(pool, "diem", importance="loo").loss_weights(Feedback(np.arange(4), rewards, step=0, grads=new))
    np.testing.assert_array_equal(got, want)
    assert not np.allclose(got, Scheduler(pool, "diem", importance="loo").loss_weights(
        Feedback(np.arange(4), rewards, step=0, grads=old)))
