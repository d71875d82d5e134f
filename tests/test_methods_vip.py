"""`vip` (VIP's rollout allocation, a reconstruction; docs/methods/vip.md): the exact continuous
solution against hand-computed KKT points and scipy's SLSQP, the rounding and the GP against
plain-loop transcriptions of the reference's stored code (`HieuNT91/VIP`
`bernoulli_allocation.py::allocate_rollout`, `gaussian_process.py::GPR`), the policy's
predictor, resume, and bad input."""

import numpy as np
import pytest

from _isolated import assert_state_equal
from rlpace import Feedback, Pool, Scheduler, policies
from rlpace.policies._vip import gp_pass_rates, vip_allocation, vip_continuous, vip_rounding

P0 = 1.0 / (1.0 + np.exp(1.0))            # sigmoid(prior logit −1)


# ---- the continuous problem: hand-computed KKT points ---------------------------------------
def test_rloo_interior_solution_is_proportional_to_sqrt_a():
    # γ = 0: n_i − 1 = c·sqrt(a_i); sqrt(a) = .5, .25, .5, .25 and 4 + 1.5c = 40 → c = 24
    got = vip_continuous(np.array([0.25, 0.0625, 0.25, 0.0625]), np.zeros(4), 40)
    np.testing.assert_allclose(got, [13, 7, 13, 7], atol=1e-9)


def test_rloo_bounds_bind():
    # unconstrained: n − 1 = c·(.5, .1, .5), 3 + 1.1c = 30 → item 2 at 3.45 < 4: clipped to 4,
    # then 2 + c = 26 → c = 24 → (13, 4, 13)
    got = vip_continuous(np.array([0.25, 0.01, 0.25]), np.zeros(3), 30)
    np.testing.assert_allclose(got, [13, 4, 13], atol=1e-9)
    # upper = 20: item 0 capped, the other two split the rest (10 each; their KKT point asks
    # c = 180, at which item 0 would want 91 > 20: the cap is consistent)
    got = vip_continuous(np.array([0.25, 0.0025, 0.0025]), np.zeros(3), 40, upper=20)
    np.testing.assert_allclose(got, [20, 10, 10], atol=1e-9)


def test_grpo_stationary_point():
    # f'(n) = a(2 − n)/n³: a1·φ(4) = a2·φ(6) with φ(n) = (n − 2)/n³ ⇔ .16/32 = .27/54
    got = vip_continuous(np.array([0.16, 0.27]), np.zeros(2), 10, lower=3, rule="grpo")
    np.testing.assert_allclose(got, [4, 6], atol=1e-9)


def test_hardness_term_moves_rollouts_to_harder_prompts():
    # equal a (p = .2 and .8), γ·log p differs: the harder prompt gets more
    p = np.array([0.2, 0.8])
    n = vip_continuous(p * (1 - p), 0.0007 * np.log(p), 24)
    assert n[0] > n[1] and n.sum() == pytest.approx(24, abs=1e-9)
    # its KKT point: −a/(n0 − 1)² + b0 = −a/(n1 − 1)² + b1
    a, b = 0.16, 0.0007 * np.log(p)
    assert -a / (n[0] - 1) ** 2 + b[0] == pytest.approx(-a / (n[1] - 1) ** 2 + b[1], abs=1e-12)


def _slsqp(a, b, budget, lower, upper, rule):
    from scipy.optimize import minimize
    f = (lambda n: np.sum(a / (n - 1) + b * n)) if rule == "rloo" else (lambda n: np.sum(a * (n - 1) / n ** 2 + b * n))
    res = minimize(f, np.full(a.shape[0], budget / a.shape[0]), method="SLSQP",
                   bounds=[(lower, upper)] * a.shape[0], options={"ftol": 1e-15, "maxiter": 2000},
                   constraints=[{"type": "eq", "fun": lambda n: np.sum(n) - budget}])
    return res.x, f


@pytest.mark.parametrize("rule", ["rloo", "grpo"])
def test_exact_solution_equals_scipy_slsqp_on_random_instances(rule):
    pytest.importorskip("scipy")
    rng = np.random.default_rng(7)
    for _ in range(60):
        b = int(rng.integers(2, 40))
        budget = b * int(rng.choice([6, 8, 12, 16]))
        p = np.clip(rng.random(b), 1e-6, 1 - 1e-6)
        a, hard = p * (1 - p), (0.0007 if rule == "rloo" else 0.0004) * np.log(p)
        ref, f = _slsqp(a, hard, budget, 4, 32, rule)
        got = vip_continuous(a, hard, budget, 4, 32, rule)
        assert got.sum() == pytest.approx(budget, abs=1e-7)
        assert got.min() >= 4 and got.max() <= 32
        assert f(got) <= f(ref) + 1e-12                  # never worse than SLSQP's optimum
        np.testing.assert_allclose(got, ref, atol=5e-3)          # SLSQP stops within ~1e-3


# ---- the reference's rounding and degenerate case, transcribed as loops ----------------------
def reference_rounding(n_list, a_list, budget, upper):
    """`allocation_rounding` of the stored `bernoulli_allocation.py`, one unit at a time. The
    reference computes each prompt's drop as a difference of two full surrogate sums, which
    leaves exact ties (equal a, equal n) to rounding; here the drop is the prompt's own term
    and the argsort stable, so ties go to the last prompt."""
    a = np.array(a_list)
    n = np.array([int(np.floor(v)) for v in n_list])
    n[n < 4] = 0
    term = lambda ai, m: ai * (m + 3) / (m + 4) ** 2   # noqa: E731
    remain = budget - n.sum()
    while remain > 0:
        inc = [term(a[i], n[i]) - term(a[i], n[i] + 1) for i in range(len(n))]
        for i in np.argsort(inc, kind="stable")[::-1]:
            if n[i] < upper:
                n[i] += 1
                break
        remain -= 1
    return n


def reference_allocation(p, budget, continuous):
    """`allocate_rollout` with the SLSQP step replaced by `continuous(a, b)`."""
    p = np.clip(p, 1e-6, 1 - 1e-6)
    if np.std(p) < 1e-6:
        out = np.full(len(p), budget // len(p))
        for i in range(budget % len(p)):
            out[i] += 1
        return out
    a, b = p * (1 - p), 0.0007 * np.log(p)
    return reference_rounding(continuous(a, b), a, budget, 32)


def test_hand_computed_rounding():
    # floors 13, 7, 13, 7 (40), one unit left: the surrogate drops .25·(16/289 − 17/324) =
    # 7.24e-4 for the a = .25 prompts and .0625·(10/121 − 11/144) = 3.91e-4 for the others;
    # of the tied pair the last one gets it
    a = np.array([0.25, 0.0625, 0.25, 0.0625])
    assert vip_rounding(np.array([13.3, 7.2, 13.3, 7.2]), a, 41).tolist() == [13, 7, 14, 7]
    assert reference_rounding([13.3, 7.2, 13.3, 7.2], a, 41, 32).tolist() == [13, 7, 14, 7]
    # the cap: a prompt at upper takes no unit
    assert vip_rounding(np.array([32.0, 4.5, 4.5]), np.array([0.25, 0.01, 0.02]), 42).tolist() == [32, 4, 6]


def test_equal_predictions_split_evenly_first_prompts_first():
    assert vip_allocation(np.full(5, 0.3), 42).tolist() == [9, 9, 8, 8, 8]
    assert vip_allocation(np.full(5, 0.3), 42).tolist() == reference_allocation(np.full(5, 0.3), 42, None).tolist()


@pytest.mark.parametrize("seed", range(6))
def test_allocation_equals_the_reference_rules_on_random_states(seed):
    rng = np.random.default_rng(seed)
    for _ in range(30):
        b = int(rng.integers(2, 64))
        budget = b * int(rng.choice([5, 8, 16]))
        # predictions as the reference's GP gives them: sigmoid of a logit around the prior −1,
        # and measured accuracies k/G (ties in p are kept: equal p, equal n, the last one first)
        p = np.where(rng.random(b) < 0.5, 1 / (1 + np.exp(-rng.normal(-1, 1.5, b))), rng.integers(0, 9, b) / 8)
        exact = lambda a, hb: vip_continuous(a, hb, budget, 4, 32, "rloo")   # noqa: E731
        want = reference_allocation(p, budget, exact)
        got = vip_allocation(p, budget)
        np.testing.assert_array_equal(got, want)
        assert got.sum() == budget and got.min() >= 4 and got.max() <= 32


# ---- the GP predictor -------------------------------------------------------------------------
def test_gp_hand_computed():
    # one training prompt at 0 with acc .5 (logit 0); a query at distance .4: k = e^{−1/2};
    # mean = −1 + k/(1 + 1e-4)·(0 − (−1)) = −0.393530 → sigmoid = 0.402868
    got = gp_pass_rates(np.zeros((1, 2)), np.array([0.5]), np.array([[0.4, 0.0], [0.0, 0.0], [9.0, 9.0]]))
    k = np.exp(-0.5)
    assert got[0] == pytest.approx(1 / (1 + np.exp(1 - k / (1 + 1e-4))), abs=1e-15)
    assert got[0] == pytest.approx(0.402868, abs=1e-6)
    assert got[1] == pytest.approx(1 / (1 + np.exp(1 - 1 / (1 + 1e-4))), abs=1e-15)   # same place, not the prompt
    assert got[2] == pytest.approx(P0, abs=1e-12)                                      # far: the prior
    # the training prompt itself: its own accuracy, clipped
    assert gp_pass_rates(np.zeros((1, 2)), np.array([1.0]), np.zeros((1, 2)), same=np.array([0]))[0] == \
        pytest.approx(1 - 1e-6, abs=1e-12)
    # no training data: the prior
    assert gp_pass_rates(np.zeros((0, 2)), np.zeros(0), np.zeros((3, 2))).tolist() == pytest.approx([P0] * 3)


def reference_gp(dist, train, acc, query, length_scale=0.4, prior=-1.0):
    """`GPR.fit` + `predict` of the stored `gaussian_process.py` over a local universe with a
    precomputed distance matrix (reuse_mean=False), written out with an explicit inverse."""
    cov = np.exp(-0.5 * (dist / length_scale) ** 2)
    mean = np.full(dist.shape[0], prior)
    g = np.log(np.clip(acc, 1e-6, 1 - 1e-6) / (1 - np.clip(acc, 1e-6, 1 - 1e-6)))
    kin = cov[np.ix_(train, train)] + 1e-4 * np.eye(len(train))
    alpha = np.linalg.inv(kin) @ (g - mean[train])
    mean = mean + cov[:, train] @ alpha
    mean[train] = g
    return 1 / (1 + np.exp(-mean[query]))


def test_gp_equals_the_reference_gpr_on_random_embeddings():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((40, 8))
    x /= np.linalg.norm(x, axis=1, keepdims=True)            # unit-norm sentence embeddings
    dist = np.sqrt(((x[:, None] - x[None]) ** 2).sum(-1))
    train = rng.choice(40, 16, replace=False)
    acc = rng.integers(0, 9, 16) / 8
    query = np.concatenate([rng.choice(np.setdiff1d(np.arange(40), train), 10, replace=False), train[:3]])
    same = np.array([list(train).index(q) if q in train else -1 for q in query])
    got = gp_pass_rates(x[train], acc, x[query], same=same)
    np.testing.assert_allclose(got, reference_gp(dist, train, acc, query), rtol=1e-9, atol=1e-12)


# ---- the policy ---------------------------------------------------------------------------------
def test_policy_without_features_uses_the_shrunk_latest_accuracy():
    s = Scheduler(Pool(["a"] * 4), "vip")
    s.observe(Feedback([0, 1, 2], [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]], step=0))
    p = np.array([(1 + 2 * P0) / 6, (2 + 2 * P0) / 6, (4 + 2 * P0) / 6, P0])   # prompt 3 unseen
    ids = np.array([0, 1, 2, 3])
    assert s.allocate(ids, 32).tolist() == vip_allocation(p, 32).tolist()
    # copies of a prompt in one step merge; a later step replaces the visit; older feedback is ignored
    s.observe(Feedback([0, 0], [[1, 1, 1, 1], [0, 0, 0, 0]], step=1))
    s.observe(Feedback([0, 2], [[0, 0, 0, 0], [0, 0, 0, 0]], step=0))   # prompt 0 late, prompt 2 merged
    st = s.states["allocation"]
    assert (st.last_n[:3].tolist(), st.last_k[:3].tolist(), st.last_step[:3].tolist()) == ([8, 4, 8], [4, 2, 4], [1, 0, 0])
    assert int(st.newest) == 1


def test_policy_with_features_trains_the_gp_on_the_newest_step_only():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((12, 4)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    s = Scheduler(Pool(["a"] * 12, features=x), "vip")
    ids = np.arange(8)
    assert s.allocate(ids, 64).tolist() == [8] * 8            # nothing seen: all at the prior
    s.observe(Feedback([0, 1, 2], [[1, 0, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0]], step=0))
    s.observe(Feedback([3, 4], [[1, 1, 0, 0], [0, 0, 0, 1]], step=1))      # the previous batch
    want_p = gp_pass_rates(x[[3, 4]].astype(np.float64), np.array([0.5, 0.25]), x[ids].astype(np.float64),
                           same=np.array([-1, -1, -1, 0, 1, -1, -1, -1]))
    assert s.allocate(ids, 64).tolist() == vip_allocation(want_p, 64).tolist()
    assert want_p[3] == pytest.approx(0.5) and want_p[4] == pytest.approx(0.25)


def test_composed_resume_exact_and_budget_kept():
    pool = Pool(np.repeat(["a", "b", "c"], 20))
    s = Scheduler(pool, "recommended+vip", seed=2)
    for t in range(5):
        ids = s.propose(6)
        n_i = s.allocate(ids, 48)
        assert n_i.sum() == 48 and n_i.min() >= 4 and n_i.max() <= 32
        rng = np.random.default_rng(t)
        r = np.zeros((6, int(n_i.max())))
        for j, k in enumerate(n_i):
            r[j, :k] = rng.random(k) < 0.3 + 0.1 * j
        s.step(Feedback(ids, r, step=t, group_sizes=n_i))
    fresh = Scheduler(pool, "recommended+vip", seed=2)
    fresh.load_state_dict(s.state_dict())
    assert_state_equal(fresh.state_dict(), s.state_dict())
    ids = s.propose(6)
    assert fresh.propose(6).tolist() == ids.tolist()
    assert fresh.allocate(ids, 48).tolist() == s.allocate(ids, 48).tolist()


@pytest.mark.parametrize("kwargs, match", [
    ({"rule": "ppo"}, "rule must be one of"), ({"lower": 1}, "lower must be an int"),
    ({"rule": "grpo", "lower": 2}, "lower must be an int in \\[3"), ({"lower": 8, "upper": 4}, "bounds inverted"),
    ({"gamma": -1e-3}, "gamma"), ({"gamma": float("nan")}, "gamma"), ({"length_scale": 0.0}, "length_scale"),
    ({"upper": 4.5}, "upper must be an int")])
def test_bad_hyperparameters(kwargs, match):
    with pytest.raises(ValueError, match=match):
        policies.make_policy("vip", **kwargs)


@pytest.mark.parametrize("budget, match", [(6 * 4 - 1, "below B·min_n"), (6 * 32 + 1, "above B·max_n"),
                                           (48.0, "must be an int")])
def test_bad_budgets_one_error_state_unchanged(budget, match):
    s = Scheduler(Pool(["a"] * 10), "vip")
    s.observe(Feedback([0, 1], [[1, 0, 0, 0], [1, 1, 1, 0]], step=0))
    before = s.state_dict()
    with pytest.raises(ValueError, match=match):
        s.allocate(np.arange(6), budget)
    assert_state_equal(s.state_dict(), before)


def test_corrupt_state_refused():
    s = Scheduler(Pool(["a"] * 4), "vip")
    s.observe(Feedback([0], [[1, 0]], step=3))
    sd = s.state_dict()
    key = next(k for k in sd if k.endswith("last_k"))
    sd[key] = sd[key].copy()
    sd[key][0] = 5
    with pytest.raises(ValueError, match="last_k ≤ last_n"):
        Scheduler(Pool(["a"] * 4), "vip").load_state_dict(sd)
