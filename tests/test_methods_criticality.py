"""`criticality_is` (criticality-guided importance sampling): the proposal, the weight floor / mean-1 / clamp, the fallback
to p, unbiasedness of the exact weights, stage versioning of the weights, and the ESS metric."""

import numpy as np
import pytest

from rlpace import Feedback, Pool, Scheduler
from rlpace.policies import compose, make_policy
from rlpace.policies._criticality import proposal, shape_weights


def _sig(z):
    return 1.0 / (1.0 + np.exp(-z))


# ---- the proposal, hand-computed ---------------------------------------------------------------
def test_proposal_hand_computed_with_fallback():
    # N = 4, c = [1, 0, 0, 0], α = ln 9, ε = 0: e = [1, 1/9, 1/9, 1/9], Z = 4/3, q = [3/4, 1/12 ×3].
    # τ = 0.5: p/q = [1/3, 3, 3, 3] → F = {0}, M = 3/4, q' = [3/16, 1/12 + 3/16 ×3].
    q, norm = proposal(np.array([1.0, 0, 0, 0]), np.log(9.0), 0.0, 0.0, 0.5)
    np.testing.assert_allclose(q, [0.75, 1 / 12, 1 / 12, 1 / 12], rtol=1e-12)
    np.testing.assert_allclose(norm, [1.0, 1.0, 4 / 3, 0.75], rtol=1e-12)
    # ε mixes p in: ε = 0.2 → q = 0.8·[3/4, 1/12 ...] + 0.05
    q2, _ = proposal(np.array([1.0, 0, 0, 0]), np.log(9.0), 0.2, 0.0, 0.0)
    np.testing.assert_allclose(q2, [0.65, 0.05 + 0.8 / 12, 0.05 + 0.8 / 12, 0.05 + 0.8 / 12], rtol=1e-12)


def test_below_threshold_the_proposal_is_p():
    q, norm = proposal(np.array([0.3, 0.1, 0.2]), 3.0, 0.1, 0.5, 0.01)
    np.testing.assert_array_equal(q, np.full(3, 1 / 3))
    assert norm[0] == 0.0


# ---- floor, mean 1, clamp ---------------------------------------------------------------------
def test_floor_then_mean_one():
    w = shape_weights(np.array([0.01, 1.0, 1.0, 1.0]), 0.1, True, 10.0)
    np.testing.assert_allclose(w, np.array([0.1, 1, 1, 1]) / 0.775, rtol=1e-12)


def test_clamp_after_normalising():
    raw = np.r_[1000.0, np.ones(19)]
    w = shape_weights(raw, 0.1, True, 10.0)
    # mean = 1019/20 = 50.95: 1000/50.95 = 19.63 → 10; the others 1/50.95
    np.testing.assert_allclose(w, np.r_[10.0, np.full(19, 1 / 50.95)], rtol=1e-12)


def test_no_normalising_keeps_raw_floored_weights():
    np.testing.assert_allclose(shape_weights(np.array([0.05, 2 / 3, 40.0]), 0.1, False, 10.0),
                               [0.1, 2 / 3, 10.0])


# ---- the fallback: draws follow q', weights are p/q' -------------------------------------------
def test_fallback_draws_follow_q_prime():
    # 4 prompts, one per domain; stage weights θ = [0, −a, b, b, b] (bias, one-hot domains) give
    # c = [1 − σ(−a), 1 − σ(b), 1 − σ(b), 1 − σ(b)], set through the state dict as a resumed run holds them.
    pool = Pool(["d0", "d1", "d2", "d3"])
    a = b = 4.0
    c = np.array([1 - _sig(-a), 1 - _sig(b), 1 - _sig(b), 1 - _sig(b)])
    alpha, tau = 5.0, 0.5
    e = np.exp(alpha * (c - c.max()))
    q = e / e.sum()                                                # ε = 0
    fb = 0.25 / q < tau
    assert fb.tolist() == [True, False, False, False]
    q_eff = np.where(fb, 0.0, q) + q[fb].sum() * 0.25
    kw = dict(seed=1, alpha=alpha, epsilon=0.0, weight_threshold=tau, unbiased=True, target="failure")
    sd = Scheduler(pool, "criticality_is", **kw).state_dict()
    theta = np.array([0.0, -a, b, b, b])
    for kind in ("selection", "reweighting"):
        for key in ("predictor/theta", "predictor/stage_theta", "prev_theta"):
            sd[f"policy/{kind}/{key}"] = theta
        for key in ("norm", "prev_norm"):
            sd[f"policy/{kind}/{key}"] = np.array([1.0, c.max(), e.sum(), q[fb].sum()])
    sd["policy/selection/cdf"] = np.cumsum(q) / np.cumsum(q)[-1]
    s = Scheduler(pool, "criticality_is", **kw)
    s.load_state_dict(sd)
    ids = s.propose(40000)
    freq = np.bincount(ids, minlength=4) / ids.size
    np.testing.assert_allclose(freq, q_eff, atol=4 * np.sqrt(q_eff * (1 - q_eff) / ids.size).max())
    w = s.loss_weights(Feedback(np.arange(4), np.zeros((4, 2)), step=5))[:, 0]
    np.testing.assert_allclose(w, 0.25 / q_eff, rtol=1e-9)


# ---- unbiasedness: E_q'[w·f] = E_p[f] ----------------------------------------------------------------
def _signal_pool(n=200, seed=0):
    rng = np.random.default_rng(seed)
    feats = rng.standard_normal((n, 2)).astype(np.float32)
    true = _sig(3.0 * feats[:, 0])
    return Pool(["a"] * n, features=feats), true


def _trained(pool, true, **kw):
    s = Scheduler(pool, "criticality_is", seed=0, **{"stage_steps": 1, **kw})
    rng = np.random.default_rng(1)
    ids = np.arange(len(pool))
    s.observe(Feedback(ids, (rng.random((ids.size, 8)) < true[ids, None]).astype(float), step=0))
    return s


def test_unbiased_weights_estimate_the_p_mean():
    pool, true = _signal_pool()
    s = _trained(pool, true, unbiased=True, weight_threshold=0.5, alpha=6.0, target="failure")
    assert s.metrics()["criticality/fallback_mass"] > 0          # the fallback is exercised
    ids = s.propose(100_000)
    f = np.random.default_rng(5).standard_normal(len(pool)) + 2.0 * true   # correlated with q
    w = s.loss_weights(Feedback(ids, np.zeros((ids.size, 1)), step=1))[:, 0]
    assert w.max() / w.min() > 3                                  # q is far from p
    est = w * f[ids]
    half = 2.576 * est.std(ddof=1) / np.sqrt(ids.size)            # 99 % CI
    assert abs(est.mean() - f.mean()) < half
    # the same draws without weights are biased far beyond that interval (the test has power)
    assert abs(f[ids].mean() - f.mean()) > 5 * half


def test_default_weights_are_floored_mean_one_and_clamped():
    pool, true = _signal_pool()
    s = _trained(pool, true, alpha=6.0)
    ids = s.propose(256)
    w = s.loss_weights(Feedback(ids, np.zeros((ids.size, 2)), step=1))
    # floored at 0.1, then mean 1: the smallest weight is ≥ 0.1 / mean(floored raw) > 0
    assert w.max() <= 10.0 and w.min() > 0
    if w.max() < 10.0:
        assert w[:, 0].mean() == pytest.approx(1.0, abs=1e-12)
    np.testing.assert_array_equal(w[:, 0], w[:, 1])               # one weight per group


def test_oversamples_predicted_failures():
    pool, true = _signal_pool()
    s = _trained(pool, true, alpha=6.0, target="failure")
    ids = s.propose(5000)
    assert true[ids].mean() < true.mean() - 0.1
    # learnability (the default) favours pass rates near 1/2 instead
    s = _trained(pool, true, alpha=6.0)
    ids = s.propose(5000)
    gap = np.abs(true - 0.5)
    assert gap[ids].mean() < gap.mean() - 0.05


# ---- weights follow the stage that drew the batch --------------------------------------------------
def test_weights_of_a_batch_use_the_stage_that_drew_it():
    pool, true = _signal_pool()
    s = Scheduler(pool, "criticality_is", seed=0, alpha=6.0, stage_steps=2)
    rng = np.random.default_rng(3)
    for t in range(3):                                             # stage 1 ends at step 1
        ids = s.propose(64)
        s.observe(Feedback(ids, (rng.random((64, 4)) < true[ids, None]).astype(float), step=t))
    ids = s.propose(64)
    fb = Feedback(ids, (rng.random((64, 4)) < true[ids, None]).astype(float), step=3)
    before = s.loss_weights(fb)
    assert before.std() > 0.05                                     # stage 1's q is not p
    s.observe(fb)                                                  # ends stage 2: θ and q change
    assert s.metrics()["criticality/stage"] == 2.0
    np.testing.assert_array_equal(s.loss_weights(fb), before)      # still the proposal's weights
    later = Feedback(ids, fb.rewards, step=4)
    assert not np.allclose(s.loss_weights(later), before)          # a new batch: the new stage


# ---- ESS -----------------------------------------------------------------------------------------
def test_metrics_report_the_effective_sample_size_of_the_weights():
    pool, true = _signal_pool()
    s = _trained(pool, true, alpha=6.0, stage_steps=50)
    ids = s.propose(128)
    fb = Feedback(ids, np.ones((128, 4)), step=1)
    w = s.loss_weights(fb)[:, 0]
    s.observe(fb)
    m = s.metrics()
    assert m["criticality/ess"] == pytest.approx(w.sum() ** 2 / (w * w).sum(), rel=1e-12)
    assert m["criticality/ess_fraction"] == pytest.approx(m["criticality/ess"] / 128, rel=1e-12)


def test_refuses_a_mixture_and_bad_hyperparameters():
    with pytest.raises(ValueError, match="does not follow a mixture"):
        compose(make_policy("fixed_mixture"), make_policy("criticality_is"))
    with pytest.raises(ValueError, match="weight_clamp must be ≥ weight_floor"):
        make_policy("criticality_is", weight_floor=2.0, weight_clamp=1.0)
    with pytest.raises(ValueError, match="unbiased must be True or False"):
        make_policy("criticality_is", unbiased=1)


# ---- the stage's pass over the pool: exact against the plain formulas, done once -----------------
def _stage_pool(n, seed, features=False):
    rng = np.random.default_rng(seed)
    dom = rng.integers(0, 5, size=n)
    return Pool(dom, clusters=dom * 3 + rng.integers(0, 3, size=n),
                difficulty=rng.normal(size=n), features=rng.normal(size=(n, 2)) if features else None)


@pytest.mark.parametrize("target", ["learnability", "failure"])
@pytest.mark.parametrize("wt", [0.0, 0.01, 0.9])
def test_stage_proposal_equals_the_plain_formulas(target, wt):
    """The chunked pass (`_stage_proposal`, pieces of 2¹⁶ prompts) against the whole-array
    formulas: c = 4π(1 − π) or 1 − π from σ, `proposal`, cumsum(q)/sum(q); N spans several
    pieces, and τ = 0.9 makes the fallback pass run (M > 0)."""
    from rlpace.policies._criticality import _stage_proposal
    from rlpace.predict._logistic import dim, logits
    n = 150_001
    pool = _stage_pool(n, 1, features=True)
    theta = np.random.default_rng(2).normal(0.0, 1.5, size=dim(pool))
    norm, cdf = _stage_proposal(theta, pool, target, 3.0, 0.1, 0.0, wt)
    pi = _sig(logits(theta, pool))
    c = 1.0 - pi if target == "failure" else 4.0 * pi * (1.0 - pi)
    q, ref = proposal(c, 3.0, 0.1, 0.0, wt)
    np.testing.assert_allclose(norm, ref, rtol=1e-9, atol=1e-12)
    ref_cdf = np.cumsum(q)
    np.testing.assert_allclose(cdf, ref_cdf / ref_cdf[-1], rtol=1e-9, atol=1e-15)
    assert cdf[-1] == 1.0 and (np.diff(cdf) >= 0).all()
    if wt == 0.9:
        assert ref[3] > 0            # the fallback pass did run
    # below the threshold: q = p, its CDF (i + 1)/N
    norm0, cdf0 = _stage_proposal(theta, pool, target, 3.0, 0.1, 1.0, wt)
    assert norm0[0] == 0.0 and norm0[2] == n
    np.testing.assert_allclose(cdf0, np.arange(1, n + 1) / n, rtol=1e-15)


def test_a_stage_switch_scores_the_pool_once_and_refits_once(monkeypatch):
    """Selection and reweighting of criticality_is keep one predictor each and update it alike:
    at a stage switch the pool is scored once (N rows), not once per policy (2N), and the Newton
    refit runs once; the second policy reads the first's result, bit for bit."""
    import rlpace.policies._criticality as crit_mod
    n, b = 20_000, 64
    pool = _stage_pool(n, 3)
    s = Scheduler(pool, "criticality_is", seed=0, stage_steps=3)
    rng = np.random.default_rng(4)
    for t in range(2):
        ids = s.propose(b)
        s.observe(Feedback(ids, (rng.random((b, 8)) < 0.4).astype(float), step=t))
    scored = []
    real = crit_mod.logits
    monkeypatch.setattr(crit_mod, "logits", lambda th, pl, ids=None, **kw: scored.append(real(th, pl, ids, **kw))
                        or scored[-1])
    solves = []
    real_solve = np.linalg.solve
    monkeypatch.setattr(np.linalg, "solve", lambda a, v: solves.append(1) or real_solve(a, v))
    ids = s.propose(b)
    s.observe(Feedback(ids, (rng.random((b, 8)) < 0.4).astype(float), step=2))   # the third update: a switch
    sel, rew = s.states["selection"], s.states["reweighting"]
    assert int(sel.predictor.stage) == int(rew.predictor.stage) == 1
    rows = sum(x.shape[0] for x in scored)
    assert n <= rows <= n + 8 * b, rows              # the pool once, plus the batch's own prompts
    assert len(solves) == 5                          # newton_steps = 5, once
    np.testing.assert_array_equal(sel.predictor.stage_theta, rew.predictor.stage_theta)
    np.testing.assert_array_equal(sel.norm, rew.norm)
