"""The allocation place (rollouts per prompt): `Scheduler.allocate`, ragged feedback
(`Feedback.group_sizes`) for every registered policy, `group_advantages` over N_i rollouts, and
`knapsack` / `gvm` / `oracle_allocation` against hand-computed values, brute force and a plain
loop of the reference's rules (Knapsack RL, `exploration_utils.sampling_budget_by_knapsack`)."""

import itertools

import numpy as np
import pytest

from _isolated import assert_state_equal
from rlpace import Feedback, Pool, Scheduler, group_advantages, policies
from rlpace.policies import DataPolicy, compose
from rlpace.policies._knapsack import (_dp_choose, _dp_extras, _dp_full, knapsack_allocation,
                                      knapsack_value, pass_rate_estimate)

NAMES = policies.names()
POOL = Pool(np.repeat(["a", "b", "c"], 20), labeled=np.arange(60) % 3 != 2)


# ---- the DP -------------------------------------------------------------------------------
def brute_force(p, k_max, budget, min_n):
    best, arg = -1.0, None
    for ks in itertools.product(range(k_max + 1), repeat=len(p)):
        if sum(ks) != budget:
            continue
        v = sum(0.0 if k == 0 else float(knapsack_value(min_n + k, q)) for k, q in zip(ks, p))
        if v > best + 1e-15:
            best, arg = v, ks
    return best, arg


@pytest.mark.parametrize("seed", range(12))
def test_dp_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    m, k_max = int(rng.integers(1, 5)), int(rng.integers(1, 5))
    p = rng.choice(np.arange(1, 16) / 16, size=m)
    budget = int(rng.integers(0, m * k_max + 1))
    extras = _dp_extras(p, k_max, budget, 2)
    best, _ = brute_force(p, k_max, budget, 2)
    got = sum(0.0 if k == 0 else float(knapsack_value(2 + k, q)) for k, q in zip(extras, p))
    assert extras.sum() == budget and got == pytest.approx(best, abs=1e-12)


def test_dp_ties_go_to_the_first_item_and_the_infogain_asymmetry():
    # equal p: the extra unit goes to the later item in the DP's backtrack order, as the
    # reference's strict '>' (smallest k for the last item first) decides
    assert _dp_extras(np.array([0.5, 0.5]), 4, 3, 2).tolist() == [2, 1]
    # p = 1/3 beats p = 2/3 (p(1 − p)² peaks at 1/3): one unit goes to 1/3
    assert _dp_extras(np.array([2 / 3, 1 / 3]), 4, 1, 2).tolist() == [0, 1]




def full_table_dp(p, k_max, budget, min_n):
    """The DP as the plain loop over every budget row: column k of item i's table is
    dp[w − k] + Value(min_n + k, p_i) (−inf where w < k), the first maximum over k wins, then
    the choices are walked back from the largest budget the items can fill
    (`full_table_choose` on the table of Knapsack RL's values)."""
    gains = np.array([[0.0] + [float(knapsack_value(np.array(min_n + k), np.array(p_i))) for k in range(1, k_max + 1)]
                      for p_i in p]).reshape(len(p), k_max + 1)
    return full_table_choose(gains, budget)


@pytest.mark.parametrize("seed", range(6))
def test_dp_equals_the_full_table_loop_at_the_simulators_sizes(seed):
    """The DP computes each item's rows only up to what the items so far can fill: the same
    extras, ties included, as the full table filled column by column, at the sizes a 128 × 16
    step gives it (pass rates on the 1/16 grid, so many items tie; budgets below, at and
    above what the items can fill)."""
    rng = np.random.default_rng(seed)
    m = int(rng.integers(2, 40))
    p = rng.choice(np.arange(1, 16) / 16, size=m)
    k_max = int(rng.choice([3, 14, 126]))
    for budget in (1, int(rng.integers(1, m * k_max + 1)), m * k_max, m * k_max + 5, 1792):
        fast, ref = _dp_extras(p, k_max, budget, 2), full_table_dp(p, k_max, budget, 2)
        assert fast.tolist() == ref.tolist(), (m, k_max, budget)
        assert fast.sum() == min(budget, m * k_max)

def full_table_choose(gains, budget):
    """`full_table_dp` for any value table gains[i, k] (k = 0..K): every budget row, column
    by column, the first maximum over k, walked back from the largest budget filled."""
    m, k_max = gains.shape[0], gains.shape[1] - 1
    if budget <= 0 or m == 0 or k_max <= 0:
        return np.zeros(m, np.int64)
    table_choice = np.zeros((m, budget + 1), np.int64)
    best = np.concatenate([[0.0], np.full(budget, -np.inf)])
    for i in range(m):
        cols = np.full((budget + 1, k_max + 1), -np.inf)
        for k in range(min(k_max, budget) + 1):
            cols[k:, k] = best[: budget + 1 - k] + gains[i, k]
        table_choice[i] = cols.argmax(axis=1)
        best = cols[np.arange(budget + 1), table_choice[i]]
    w = int(np.flatnonzero(np.isfinite(best)).max())
    extras = np.zeros(m, np.int64)
    for i in reversed(range(m)):
        extras[i] = table_choice[i, w]
        w -= extras[i]
    return extras


def value_tables(rng):
    """Value tables of every shape the banded DP must get right: concave (decreasing random
    increments), Knapsack RL's on the 1/16 grid (identical items: ties between allocations),
    small integers (exact ties everywhere), random non-concave, convex, flat, negative."""
    m, k_max = int(rng.integers(1, 24)), int(rng.integers(1, 20))
    inc = -np.sort(-rng.exponential(1.0, (m, k_max)), axis=1)
    p = rng.choice(np.arange(1, 16) / 16, size=m)
    kn = knapsack_value(2 + np.arange(k_max + 1)[None, :], p[:, None])
    kn[:, 0] = 0.0
    yield "concave", np.concatenate([np.zeros((m, 1)), np.cumsum(inc, axis=1)], axis=1)
    yield "knapsack", kn
    yield "integers", rng.integers(0, 3, (m, k_max + 1)).astype(np.float64)
    yield "random", rng.normal(size=(m, k_max + 1))
    yield "convex", np.cumsum(np.sort(rng.exponential(1.0, (m, k_max + 1)), axis=1), axis=1)
    yield "flat", np.zeros((m, k_max + 1))
    yield "negative", -rng.exponential(1.0, (m, k_max + 1))


@pytest.mark.parametrize("seed", range(40))
def test_banded_dp_equals_the_full_table_loop_on_any_value_table(seed):
    """The DP on the rows an optimal path can cross (Lagrangian bounds) gives the choices of
    the full table filled column by column — same extras, same ties — on concave and
    non-concave tables, with budgets below, at and above what the items can fill."""
    rng = np.random.default_rng(seed)
    for kind, gains in value_tables(rng):
        m, k_max = gains.shape[0], gains.shape[1] - 1
        for budget in (1, int(rng.integers(1, m * k_max + 1)), m * k_max, m * k_max + 3):
            ref = full_table_choose(gains, budget)
            assert _dp_choose(gains, budget).tolist() == ref.tolist(), (kind, m, k_max, budget)
            assert _dp_full(gains, budget).tolist() == ref.tolist(), (kind, m, k_max, budget)


def test_banded_dp_at_the_advise_pilots_size_with_ties():
    """128 items on the 1/16 grid (a 128 × 16 step's pass rates: many identical items), the
    reference's max_n = 128 and the 1,792 extra rollouts the allocation oracle's DP gets."""
    rng = np.random.default_rng(7)
    p = rng.choice(np.arange(1, 16) / 16, size=128)
    gains = knapsack_value(2 + np.arange(127)[None, :], p[:, None])
    gains[:, 0] = 0.0
    fast = _dp_choose(gains, 1792)
    assert fast.tolist() == full_table_dp(p, 126, 1792, 2).tolist()
    assert fast.sum() == 1792


# ---- the whole rule, against a plain loop of the reference's rules (bugs fixed) ------------
def loop_allocation(p, valid, budget, min_n=2, max_n=16, alpha=0.9):
    """The reference's `sampling_budget_by_knapsack` rules written as loops, with the five
    named fixes (docs/methods/knapsack.md); the DP as a table loop."""
    b = len(p)
    n = budget // b
    p = [float(np.float32(x)) for x in p]
    alloc, eff, zero = [], [], []
    for i in range(b):
        if not valid[i]:
            alloc.append(n)
        elif 0 < p[i] < 1:
            alloc.append(min_n); eff.append(i)
        else:
            alloc.append(min_n)
            if p[i] == 0:
                zero.append(i)
    rest = budget - sum(alloc)

    def spread(extra, groups):
        for g in groups:
            while extra > 0:
                open_ = [i for i in g if alloc[i] < max_n]
                if not open_:
                    break
                q, r = divmod(extra, len(open_))
                for j, i in enumerate(open_):
                    add = min(q + (1 if j < r else 0), max_n - alloc[i])
                    alloc[i] += add
                    extra -= add
        return extra

    others = [i for i in range(b) if i not in eff]
    if rest > 0 and not eff:
        if zero:
            spread(rest, [zero, list(range(b))])
        else:
            alloc = [n] * b
            spread(budget - n * b, [list(range(b))])
        return alloc
    est = 0
    for i in eff:
        cost = float(np.float32(np.log(1 - alpha) / np.log(max(p[i], 1 - p[i]))))
        est += int(min(max_n, cost))
    dp_budget = rest
    if est < rest and others:
        dp_budget = est + spread(rest - est, [zero if zero else others, others])
    k_max = max_n - min_n
    dp = [[-np.inf] * (dp_budget + 1) for _ in range(len(eff) + 1)]
    ch = [[0] * (dp_budget + 1) for _ in range(len(eff) + 1)]
    dp[0][0] = 0.0
    for t, i in enumerate(eff, start=1):
        for w in range(dp_budget + 1):
            if dp[t - 1][w] > dp[t][w]:
                dp[t][w], ch[t][w] = dp[t - 1][w], 0
            for k in range(1, min(k_max + 1, w + 1)):
                if dp[t - 1][w - k] == -np.inf:
                    continue
                v = dp[t - 1][w - k] + (1 - p[i] ** (k + min_n) - (1 - p[i]) ** (k + min_n)) * p[i] * (1 - p[i]) ** 2
                if v > dp[t][w]:
                    dp[t][w], ch[t][w] = v, k
    w = max(x for x in range(dp_budget + 1) if dp[len(eff)][x] > -np.inf) if eff else 0
    used = w
    for t in range(len(eff), 0, -1):
        alloc[eff[t - 1]] += ch[t][w]
        w -= ch[t][w]
    spread(dp_budget - used, [eff, zero, others, list(range(b))])
    return alloc


def verl_like_state(rng, b, n):
    """(p̂, valid) drawn as KnapsackRL's dataset state: visits of n rollouts, p̂ of the last
    visit or of the 16 newest rewards, valid after 8."""
    true_p = rng.beta(0.6, 0.6, size=b)
    true_p[rng.random(b) < 0.2] = 0.0
    visits = rng.integers(0 if rng.random() < 0.4 else 1, 4, size=b)
    p, valid = np.zeros(b), np.zeros(b, bool)
    for i in range(b):
        hist = [list(rng.random(n) < true_p[i]) for _ in range(visits[i])]
        flat = [r for h in reversed(hist) for r in reversed(h)]
        if flat:
            p[i] = np.mean(hist[-1]) if n >= 16 else np.mean(flat[:16])
        valid[i] = len(flat) >= 8
    return p, valid


@pytest.mark.parametrize("seed", range(25))
def test_knapsack_allocation_equals_the_reference_loop(seed):
    rng = np.random.default_rng(seed)
    b, n = int(rng.choice([4, 8, 12])), int(rng.choice([4, 8]))
    p, valid = verl_like_state(rng, b, n)
    got = knapsack_allocation(p, valid, b * n, max_n=16)
    assert got.tolist() == loop_allocation(p, valid, b * n)
    assert got.sum() == b * n and got.min() >= 2 and got.max() <= 16


def test_hand_computed_allocation():
    # p̂ = .5, .25, 0, 1; W = 32: bases 2 each, R = 24; costs int(3.32) + int(8.00) = 11 < 24:
    # the surplus 13 goes to the p̂ = 0 prompt, the DP shares 11 (4 and 7 extra)
    got = knapsack_allocation(np.array([0.5, 0.25, 0.0, 1.0]), np.ones(4, bool), 32, max_n=16)
    assert got.tolist() == [6, 9, 15, 2]


# ---- the reference's bugs, fixed ----------------------------------------------------------
def test_bug1_max_n_none_is_refused():
    with pytest.raises(ValueError, match="max_n"):
        policies.make_policy("knapsack", max_n=None)


def test_bug2_fallback_with_every_prompt_in_the_dp_does_not_divide_by_zero():
    # all effective, est = 4·int(3.32) = 12 < R = 32 − 8 = 24: the reference divides by zero
    got = knapsack_allocation(np.full(4, 0.5), np.ones(4, bool), 32, max_n=16)
    assert got.sum() == 32 and got.tolist() == [8, 8, 8, 8]


def test_bug3_spreads_keep_max_n():
    # 2 prompts at p̂ = .5 can use at most 2·(4 − 2) = 4 extra; the reference spread the other
    # 8 over them (8 each > max_n = 4); here they go to the p̂ = 0 and p̂ = 1 prompts
    got = knapsack_allocation(np.array([0.5, 0.5, 0.0, 1.0]), np.ones(4, bool), 16, max_n=4,
                              allow_fallback=False)
    assert got.tolist() == [4, 4, 4, 4]


def test_bug4_unseen_prompts_do_not_take_the_p0_surplus():
    # prompt 0 unseen (n = 8), prompt 1 at p̂ = 0, prompt 2 at p̂ = 1: no DP item, R = 32 − 12 = 20
    # goes to prompt 1 only (the reference split it with the unseen prompt 0)
    got = knapsack_allocation(np.array([0.0, 0.0, 1.0]), np.array([False, True, True]), 24, max_n=32)
    assert got.tolist() == [8, 14, 2]


def test_bug5_no_dp_item_no_zero_prompt_sums_to_a_budget_b_does_not_divide():
    got = knapsack_allocation(np.ones(3), np.ones(3, bool), 26, max_n=32)
    assert got.tolist() == [9, 9, 8]


# ---- p̂ estimate: the reference's last visit / 16 newest rule -------------------------------
def test_pass_rate_estimate_matches_a_replay_of_the_reference_rule():
    rng = np.random.default_rng(3)
    s = Scheduler(Pool(["a"] * 5), "knapsack")
    hist = {i: [] for i in range(5)}
    for t in range(6):
        g = int(rng.choice([2, 4, 8, 20]))
        ids = rng.choice(5, size=3, replace=False)
        r = (rng.random((3, g)) < 0.4).astype(float)
        s.observe(Feedback(ids, r, step=t))
        for i, row in zip(ids, r):
            hist[int(i)].append(list(row))
    valid, p = pass_rate_estimate(s.states["allocation"], np.arange(5), 16, 8)
    for i in range(5):
        flat = [x for h in reversed(hist[i]) for x in reversed(h)]
        assert valid[i] == (len(flat) >= 8)
        if valid[i]:
            want = np.mean(hist[i][-1]) if len(hist[i][-1]) >= 16 else np.mean(flat[:16])
            assert p[i] == pytest.approx(want, abs=1e-15)


# ---- Scheduler.allocate: sums, bounds, bad input ------------------------------------------
def test_uniform_without_an_allocation_policy():
    s = Scheduler(POOL, "recommended")
    assert s.allocate(np.array([0, 5, 9]), 24).tolist() == [8, 8, 8]
    assert s.allocate(np.array([0, 5, 9]), 10).tolist() == [4, 3, 3]


def test_composed_with_recommended_and_exact_resume():
    s = Scheduler(POOL, "recommended+knapsack", seed=1, max_n=16)
    for t in range(4):
        ids = s.propose(6)
        n_i = s.allocate(ids, 48)
        assert n_i.sum() == 48 and n_i.min() >= 2 and n_i.max() <= 16
        r = np.zeros((6, int(n_i.max())))
        rng = np.random.default_rng(t)
        for j, k in enumerate(n_i):
            r[j, :k] = rng.random(k) < 0.4
        s.step(Feedback(ids, r, step=t, group_sizes=n_i))
    fresh = Scheduler(POOL, "recommended+knapsack", seed=1, max_n=16)
    fresh.load_state_dict(s.state_dict())
    ids = s.propose(6)
    assert fresh.propose(6).tolist() == ids.tolist()
    assert fresh.allocate(ids, 48).tolist() == s.allocate(ids, 48).tolist()


@pytest.mark.parametrize("budget, match", [(11, "below B·min_n"), (6 * 16 + 1, "above B·max_n"),
                                           (48.0, "must be an int"), (True, "must be an int")])
def test_bad_budgets_one_error_state_unchanged(budget, match):
    s = Scheduler(POOL, "knapsack", max_n=16)
    before = s.state_dict()
    with pytest.raises(ValueError, match=match):
        s.allocate(np.arange(6), budget)
    assert_state_equal(s.state_dict(), before)


def test_inverted_bounds_refused():
    with pytest.raises(ValueError, match="bounds inverted"):
        policies.make_policy("knapsack", min_n=8, max_n=4)


def test_a_user_policy_with_a_wrong_sum_is_named():
    bad = DataPolicy("allocation", lambda pool: (), lambda st, pool, b: st,
                     lambda st, pool, ids, budget: np.full(ids.shape[0], 3), name="my_alloc", bounds=(1, 9))
    s = Scheduler(POOL, compose(policies.uniform_pool(), bad))
    with pytest.raises(RuntimeError, match="my_alloc.*sum 18.*budget 20"):
        s.allocate(np.arange(6), 20)


# ---- ragged feedback: every registered policy reads full groups -----------------------------
def ragged_feedback(ids, sizes, step, seed=0):
    rng = np.random.default_rng([seed, step])
    g = max(1, int(max(sizes)))
    r = (rng.random((len(ids), g)) < 0.5).astype(float)
    r[np.arange(g)[None, :] >= np.asarray(sizes)[:, None]] = 7.0      # padding nobody may read
    wrong = rng.choice(np.array(["41", "43", None], dtype=object), size=r.shape)
    answers = np.where(r == 1.0, "42", wrong).tolist()
    return Feedback(ids, r, step=step, group_sizes=sizes, answers=answers)


@pytest.mark.parametrize("name", NAMES)
def test_ragged_step_equals_its_parts_for_every_policy(name):
    a, b = Scheduler(POOL, name, seed=3), Scheduler(POOL, name, seed=3)
    for t in range(3):
        ids = a.propose(6)
        assert b.propose(6).tolist() == ids.tolist()
        sizes = np.array([0, 1, 2, 5, 2, 3])[np.random.default_rng(t).permutation(6)]
        fb = ragged_feedback(ids, sizes, t)
        res = a.step(fb)
        valid = np.arange(fb.rewards.shape[1])[None, :] < sizes[:, None]
        assert res.keep.shape == fb.rewards.shape and not res.keep[~valid].any()
        assert (res.weights[~valid] == 0).all() and np.isfinite(res.weights).all()
        for rows, sub in fb.by_size():               # the parts, observed as full batches
            b.observe(sub)
            np.testing.assert_array_equal(res.keep[rows, :sub.rewards.shape[1]], b.admission(sub).keep)
    sa, sb = a.state_dict(), b.state_dict()
    for k in ("counters/observations", "counters/last_informative"):   # one observation per step
        sa.pop(k), sb.pop(k)
    assert_state_equal(sa, sb)
    assert int(a.counters.observations) == 3
    assert int(a.history.attempts.sum()) == 3 * 13 == a.metrics()["rollouts_observed"]


def test_ragged_group_sizes_validated():
    with pytest.raises(ValueError, match="Feedback.group_sizes"):
        Feedback([0, 1], [[1.0, 0.0], [0.0, 1.0]], step=0, group_sizes=[3, 1])
    with pytest.raises(ValueError, match="Feedback.group_sizes"):
        Feedback([0, 1], [[1.0, 0.0], [0.0, 1.0]], step=0, group_sizes=[1.5, 1])
    assert Feedback([0], [[1.0, 0.0]], step=0, group_sizes=[2]).group_sizes is None


# ---- group advantages over N_i rollouts ----------------------------------------------------
def loop_advantages(r, sizes, ddof, clip, loo, eps=1e-6):
    out = np.zeros_like(r)
    for i, n in enumerate(sizes):
        x = r[i, :n]
        for j in range(n):
            if n < 2:
                a = 0.0
            elif loo:
                a = x[j] - (x.sum() - x[j]) / (n - 1)
            else:
                m = x.mean()
                sd = (sum((v - m) ** 2 for v in x) / (n - ddof)) ** 0.5
                a = 0.0 if sd == 0 else (x[j] - m) / (sd + eps)
            out[i, j] = a if clip is None else min(max(a, -clip), clip)
    return out


@pytest.mark.parametrize("ddof, clip, loo", [(0, None, False), (1, None, False), (1, 5.0, False),
                                             (0, None, True)])
def test_group_advantages_over_ragged_groups(ddof, clip, loo):
    rng = np.random.default_rng(ddof + 3 * loo)
    sizes = np.array([0, 1, 2, 5, 40, 40])
    r = (rng.random((6, 40)) < 0.05).astype(float)
    r[5] = 0.0
    r[5, 0] = 1.0                                      # one success in 40
    got = group_advantages(r, group_sizes=sizes, ddof=ddof, clip=clip, leave_one_out=loo)
    np.testing.assert_allclose(got, loop_advantages(r, sizes, ddof, clip, loo), rtol=1e-12, atol=1e-12)
    if ddof == 1 and clip == 5.0:
        assert got.max() == 5.0                        # a rare success in 40: sqrt-N advantage, clipped


# ---- the simulator and the built-in trainer ------------------------------------------------
def test_simulator_spends_exactly_the_budget_with_allocation():
    from rlpace.sim import make_scenario, simulate
    sc = make_scenario("ladder", prompts_per_domain=6)          # small pool: prompts are revisited
    a = simulate(sc, "knapsack", steps=30, batch_size=16, group_size=4, seed=0, policy_kwargs={"max_n": 16})
    b = simulate(sc, "knapsack", steps=30, batch_size=16, group_size=4, seed=0, policy_kwargs={"max_n": 16})
    assert a.rollouts.tolist() == [16 * 4 * (t + 1) for t in range(30)]
    assert a.final_metrics["knapsack/valid_fraction"] > 0.5       # p̂ in use, not the uniform share
    assert a.mean_accuracy.tolist() == b.mean_accuracy.tolist()
    u = simulate(sc, "uniform", steps=30, batch_size=16, group_size=4, seed=0)
    assert a.mean_accuracy.tolist() != u.mean_accuracy.tolist()


def test_builtin_trainer_refuses_allocation_with_a_part_that_reads_g_rollouts(tmp_path):
    # the trainer runs allocation policies (tests/test_train_allocation.py); what reads G rollouts
    # per prompt (here gradient features) is refused before any work rather than fed ragged groups
    from rlpace.train import TrainConfig, train
    with pytest.raises(ValueError, match="allocates rollouts per prompt .* cannot combine with gradient features"):
        train(TrainConfig(steps=1, policy="recommended+knapsack", grad_features="on", out=str(tmp_path / "r")))
    assert not (tmp_path / "r").exists()


def test_gvm_reads_gradient_features_of_ragged_groups():
    # ‖Σ_j g_ij‖: prompt 0 √2 (p = .5), prompt 1 10 (p = .4), prompt 2 unseen, prompt 3 p = 0 (s = 0).
    # s = √2/√(.5 + .002) = 1.996, 10/√(.4 + .0025) = 15.76, unseen = their mean with 0 = 5.92;
    # 24 − 4·2 = 16 ∝ s → 1.35, 10.65, 4.00, 0 → floors 1, 10, 4, 0 and the last unit to prompt 1
    s = Scheduler(Pool(["a"] * 6), "gvm", max_n=16)
    r = np.zeros((4, 5))
    r[0, :2], r[1] = [1, 0], [1, 1, 0, 0, 0]
    grads = np.zeros((4, 5, 3), np.float32)
    grads[0, :2] = [[1, 0, 0], [0, 1, 0]]
    grads[1, :, 2] = 2.0
    s.step(Feedback(np.arange(4), r, step=0, group_sizes=[2, 5, 0, 1]), features=lambda adm: grads)
    assert s.allocate(np.arange(4), 24).tolist() == [3, 13, 6, 2]
