"""The after-rollout policies computed for the whole batch at once (no Python loop over the
B groups or B·G answers) give the numbers of the per-group rules: the vote helpers against
`collections.Counter`, the history slopes bit for bit against the scalar OLS, `olr`, `ttrl`
and `trapo` through the Scheduler against plain loops of their rules written here (prompts
repeated within a batch, ties, missing answers, ragged groups of sizes 0, 1, 2, ...), and
DIEM's d × d solve against the N × N eigendecomposition and an SVD reference."""

from collections import Counter
from fractions import Fraction

import numpy as np
import pytest

from rlpace import Feedback, Pool, Scheduler
from rlpace.policies import make_policy
from rlpace.policies._diem import _solve, constrained_weights
from rlpace.policies._vote import (AnswerVotes, answer_codes, answer_hash, group_majorities, ols_slope,
                                   ols_slopes, row_modes)
from rlpace.types import Batch

ANSWERS = ["1", " 1", "2", "2 ", "3", None, "", "  ", "x"]


def _majority(answers, ties):
    """The vote of one group, as the public codes count it: stripped, empty = no answer."""
    valid = [a.strip() for a in answers if a is not None and a.strip()]
    if not valid:
        return None, 0
    counts = Counter(valid)
    top = max(counts.values())
    tops = [a for a in dict.fromkeys(valid) if counts[a] == top]          # first-seen order
    if ties == "abstain" and len(tops) > 1:
        return None, top
    return tops[0], top


def _slope(y):
    """Exact OLS slope of y against 0..n−1 (Fractions), 0 with fewer than 2 points."""
    n = len(y)
    if n < 2:
        return Fraction(0)
    ys = [Fraction(v) for v in y]
    mean = sum(ys) / n
    xs = [Fraction(2 * i - (n - 1), 2) for i in range(n)]
    return sum(x * (v - mean) for x, v in zip(xs, ys)) / sum(x * x for x in xs)


def _random_answers(rng, b, g, p_first=0.45):
    return [[ANSWERS[min(int(rng.geometric(p_first)) - 1, len(ANSWERS) - 1)] for _ in range(g)] for _ in range(b)]


# ---- the vote helpers --------------------------------------------------------------------------
def test_answer_codes_and_group_majorities_equal_counter_votes():
    rng = np.random.default_rng(0)
    for trial in range(400):
        b, g = int(rng.integers(0, 7)), int(rng.integers(1, 9))
        answers = np.empty((b, g), dtype=object)
        answers[...] = _random_answers(rng, b, g, p_first=[0.2, 0.45, 0.9][trial % 3]) if b else answers
        codes, values = answer_codes(answers)
        assert codes.shape == (b, g)
        for i in range(b):
            for j in range(g):
                a = answers[i, j]
                clean = None if a is None or not a.strip() else a.strip()
                assert (values[codes[i, j]] if codes[i, j] >= 0 else None) == clean
        for ties in ("first", "abstain"):
            win, count = group_majorities(codes, ties)
            got = [(values[w] if w >= 0 else None, int(c)) for w, c in zip(win, count)]
            assert got == [_majority(answers[i], ties) for i in range(b)], (answers, ties)
            votes = AnswerVotes(answers)                # what the policies read (votes_of)
            w2, c2, hashes = votes.majorities(ties)
            v2 = votes.values
            assert [(v2[w] if w >= 0 else None, int(c)) for w, c in zip(w2, c2)] == got
            assert hashes.tolist() == [answer_hash(m) for m, _ in got]


@pytest.mark.parametrize("span", [3, 40, 2**62])
def test_row_modes_equal_a_counter_per_row(span):
    # span 3: few distinct values (one bincount); 40 and 2**62: many (hash-like: a sort per row)
    rng = np.random.default_rng(span % 1000)
    for trial in range(300):
        b, n = int(rng.integers(0, 6)), int(rng.integers(1, 12))
        codes = rng.integers(-span, span, size=(b, n))
        if trial % 5 == 0 and b:
            codes[0] = np.iinfo(np.int64).min + rng.integers(0, 2, n)      # the smallest int64 too
        if trial % 2:
            valid = rng.random((b, n)) < 0.8
        else:                                                              # a valid prefix (histories)
            valid = np.arange(n) < rng.integers(0, n + 1, size=b)[:, None]
        first, top, n_top = row_modes(codes, valid)
        for i in range(b):
            vals = [int(c) for c, ok in zip(codes[i], valid[i]) if ok]
            if not vals:
                assert (first[i], top[i], n_top[i]) == (n, 0, 0)
                continue
            counts = Counter(vals)
            mx = max(counts.values())
            tops = {v for v, c in counts.items() if c == mx}
            pos = min(j for j in range(n) if valid[i, j] and int(codes[i, j]) in tops)
            assert (first[i], top[i], n_top[i]) == (pos, mx, len(tops))


def test_ols_slopes_are_the_scalar_slope_bit_for_bit():
    rng = np.random.default_rng(1)
    for cap in (2, 5, 16, 40):
        y = rng.integers(0, 17, size=(300, cap)) / rng.integers(1, 17, size=(300, 1))   # pass rates k/G
        y[:50] = rng.random((50, cap))
        lengths = rng.integers(0, cap + 1, size=300)
        got = ols_slopes(y, lengths)
        for row, n, s in zip(y, lengths, got):
            assert s == ols_slope(list(row[:n]))                         # the same float
            assert abs(Fraction(s) - _slope(list(row[:n]))) <= 1e-12 * (1 + abs(_slope(list(row[:n]))))


# ---- OLR ----------------------------------------------------------------------------------------
class OlrLoop:
    """OLR's rule (module docstring of rlpace.policies._olr) as a loop over rows."""

    def __init__(self, n, cap, start_step, threshold, min_pass_rate=None, margin=None):
        self.hist = [([], []) for _ in range(n)]          # (pass rates, majority hashes), last cap
        self.visits = [0] * n
        self.label_rate = [None] * n
        self.cap, self.start, self.thr = cap, start_step, threshold
        self.min_p, self.margin = min_pass_rate, margin
        self.relabels = self.kept = 0

    def decide(self, pos, answers, hist, visits):
        m, count = _majority(answers, "abstain")
        p = Fraction(count, len(answers)) if m is not None else Fraction(0)
        rates = (hist[0] + [p])[-self.cap:]
        majs = (hist[1] + [answer_hash(m)])[-self.cap:]
        h, _ = _majority([str(x) for x in majs], "abstain")
        ok = (m is not None and visits > self.start and _slope(rates) >= self.thr
              and h is not None and int(h) == answer_hash(m))
        lr = self.label_rate[pos]
        if ok and self.min_p is not None:
            ok = p >= self.min_p
        if ok and self.margin is not None:
            ok = lr is not None and p - lr >= self.margin
        return (m if ok else None), (rates, majs)

    def targets(self, ids, answers):
        pending, out = {}, []
        for pos, row in zip(ids, answers):
            hist, visits = pending.get(pos, (self.hist[pos], self.visits[pos]))
            target, new = self.decide(pos, row, hist, visits)
            pending[pos] = (new, visits + 1)
            out.append(target)
        return out

    def observe(self, ids, answers, rewards):
        for pos, row, r in zip(ids, answers, rewards):
            target, self.hist[pos] = self.decide(pos, row, self.hist[pos], self.visits[pos])
            self.visits[pos] += 1
            if target is None:
                self.label_rate[pos] = Fraction(sum(v >= 0.5 for v in r), len(r))
                self.kept += 1
            else:
                self.relabels += 1


def _parts(ids, answers, rewards, sizes):
    """The Scheduler's reading of a ragged batch: one full batch per size, increasing, rows in order."""
    if sizes is None:
        return [(list(range(len(ids))), ids, answers, rewards)]
    out = []
    for n in sorted(set(sizes) - {0}):
        rows = [i for i, s in enumerate(sizes) if s == n]
        out.append((rows, [ids[i] for i in rows], [answers[i][:n] for i in rows],
                    [list(rewards[i][:n]) for i in rows]))
    return out


def _stream(seed, n_pool, steps, b, g, ragged):
    rng = np.random.default_rng(seed)
    for t in range(steps):
        ids = rng.integers(0, n_pool, size=b).tolist()        # small pools: prompts repeat in a batch
        answers = _random_answers(rng, b, g)
        rewards = rng.integers(0, 2, size=(b, g)).astype(float)
        sizes = rng.integers(0, g + 1, size=b).tolist() if ragged else None   # 0, 1, 2, ... rollouts
        yield t, ids, answers, rewards, sizes


@pytest.mark.parametrize("kw", [dict(start_step=1, slope_threshold=0.0123456789),
                                dict(start_step=0, slope_threshold=-0.0123456789, capacity=3),
                                dict(start_step=1, slope_threshold=-1.0, capacity=4, min_pass_rate=0.3, margin=-0.2)])
@pytest.mark.parametrize("seed, n_pool, b, g, ragged", [(0, 4, 7, 4, False), (1, 30, 12, 5, True),
                                                        (2, 3, 6, 3, True)])
def test_olr_equals_a_loop_of_its_rule(kw, seed, n_pool, b, g, ragged):
    s = Scheduler(Pool(["d"] * n_pool), "olr", **kw)
    loop = OlrLoop(n_pool, kw.get("capacity", 16), kw["start_step"], Fraction(kw["slope_threshold"]),
                   kw.get("min_pass_rate") and Fraction(kw["min_pass_rate"]), kw.get("margin") and Fraction(kw["margin"]))
    relabelled = 0
    for t, ids, answers, rewards, sizes in _stream(seed, n_pool, 14, b, g, ragged):
        fb = Feedback(ids, rewards, answers=answers, step=t, group_sizes=sizes)
        want = [None] * b
        for rows, p_ids, p_ans, _ in _parts(ids, answers, rewards, sizes):
            for r, target in zip(rows, loop.targets(p_ids, p_ans)):       # each part sees the state
                want[r] = target
        assert s.targets(fb) == want
        relabelled += sum(x is not None for x in want)
        s.observe(fb)
        for _, p_ids, p_ans, p_rew in _parts(ids, answers, rewards, sizes):
            loop.observe(p_ids, p_ans, p_rew)
    st = s.states["target"]
    cap = kw.get("capacity", 16)
    assert st.visits.tolist() == loop.visits
    for pos in range(n_pool):
        k = min(loop.visits[pos], cap)
        assert st.rate[pos, :k].tolist() == [float(v) for v in loop.hist[pos][0]]
        assert st.majority[pos, :k].tolist() == loop.hist[pos][1]
        lr = loop.label_rate[pos]
        assert (np.isnan(st.label_rate[pos]) and lr is None) or st.label_rate[pos] == float(lr)
    assert (int(st.relabels), int(st.kept)) == (loop.relabels, loop.kept)
    assert relabelled > 0 and loop.relabels > 0                          # the rule did fire


# ---- TTRL ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw", [{}, dict(all_prompts=True), dict(vote_rollouts=2)])
def test_ttrl_equals_a_loop_of_its_rule(kw):
    rng = np.random.default_rng(4)
    labeled = rng.random(20) < 0.4
    s = Scheduler(Pool(["d"] * 20, labeled=labeled), "ttrl", **kw)
    pseudo = none = 0
    for t, ids, answers, rewards, sizes in _stream(5, 20, 10, 9, 4, ragged=not kw.get("vote_rollouts")):
        fb = Feedback(ids, rewards, answers=answers, step=t, group_sizes=sizes)
        want = [None] * 9
        for rows, p_ids, p_ans, _ in _parts(ids, answers, rewards, sizes):
            for r, pos, row in zip(rows, p_ids, p_ans):
                if labeled[pos] and not kw.get("all_prompts"):
                    continue
                want[r] = _majority(row[:kw.get("vote_rollouts", len(row))], "first")[0]
                pseudo += want[r] is not None
                none += want[r] is None
        assert s.targets(fb) == want
        s.observe(fb)
    m = s.metrics()
    assert (m["supervision/pseudo_labels"], m["supervision/no_target"]) == (pseudo, none)
    assert pseudo > 0


# ---- TraPO ----------------------------------------------------------------------------------------
class TrapoLoop:
    """TraPO's history, targets, promotion and selection (module docstring of
    rlpace.policies._trapo) as loops over rows, with numpy only for the cosine scores."""

    def __init__(self, labeled, cap, warm_up, topk, thres, update_db, promote, window, promote_rate):
        n = len(labeled)
        self.promote = promote
        self.labeled, self.cap, self.warm_up, self.topk, self.thres = list(labeled), cap, warm_up, topk, thres
        self.update_db, self.window, self.promote_rate = update_db, window, promote_rate
        self.rate = [[] for _ in range(n)]
        self.maj = [[] for _ in range(n)]
        self.visits = [0] * n
        self.db = {}
        self.selected_at = [-1] * n
        self.label = [""] * n
        self.steps = self.selected = self.dropped = 0

    def is_lab(self, pos):
        return self.labeled[pos] or self.label[pos] != ""

    def targets(self, ids, answers):
        out = []
        for pos, row in zip(ids, answers):
            out.append(None if self.labeled[pos] else self.label[pos] or _majority(row, "abstain")[0])
        return out

    def observe(self, ids, answers, rewards):
        for pos, row, r in zip(ids, answers, rewards):
            m, count = _majority(row, "abstain")
            if self.is_lab(pos):
                p = sum(v >= 0.5 for v in r) / len(r)
            else:
                p = count / len(row) if m is not None else 0.0
            if self.visits[pos] < self.cap:
                self.rate[pos].append(p)
                self.maj[pos].append(answer_hash(m))
            self.visits[pos] += 1
            if self.promote and not self.is_lab(pos) and m is not None:
                k = len(self.rate[pos])
                if (k >= self.window and p >= self.promote_rate and _slope(self.rate[pos]) > 0
                        and all(h == answer_hash(m) for h in self.maj[pos][k - self.window:])):
                    self.label[pos] = m
        unl = list(dict.fromkeys(q for q in ids if not self.is_lab(q)))
        n_sel = 0
        if self.steps >= self.warm_up and unl:
            lab = [q for q in range(len(self.labeled)) if self.is_lab(q) and self.visits[q] >= 1]
            rows = [self.rate[q] for q in lab] + list(self.db.values())
            if rows:
                length = min(len(x) for x in rows)
                def z(v):
                    v = np.asarray(v[:length], dtype=np.float64)
                    if length < 2:
                        return np.zeros(length)
                    v = (v - v.mean()) / (v.std(ddof=1) + 1e-8)
                    return v / max(np.linalg.norm(v), 1e-8)
                dbz = [z(x) for x in rows]
                scores = [float(np.mean([z(self.rate[q]) @ d for d in dbz])) if len(self.rate[q]) >= length
                          else -np.inf for q in unl]
                k = max(1, int(np.floor(self.topk * len(unl))))
                top = sorted(range(len(unl)), key=lambda j: -scores[j])[:k]     # stable: ties by position
                chosen = [j for j in range(len(unl)) if (j in top or scores[j] >= self.thres)
                          and scores[j] > -np.inf]
                for j in chosen:
                    self.selected_at[unl[j]] = self.steps
                    if self.update_db:
                        self.db[unl[j]] = list(self.rate[unl[j]])
                n_sel = len(chosen)
        self.selected += n_sel
        self.dropped += len(unl) - n_sel
        self.steps += 1


@pytest.mark.parametrize("kw", [dict(warm_up=2), dict(warm_up=1, topk=0.5, thres=0.2, capacity=4),
                                dict(warm_up=2, promote=True, promote_pass_rate=0.3, promote_window=2,
                                     capacity=5, update_db=False)])
@pytest.mark.parametrize("seed, n_pool, b, g, ragged", [(0, 6, 8, 4, False), (1, 25, 10, 5, True)])
def test_trapo_equals_a_loop_of_its_rule(kw, seed, n_pool, b, g, ragged):
    labeled = np.random.default_rng(seed + 10).random(n_pool) < 0.4
    s = Scheduler(Pool(["d"] * n_pool, labeled=labeled), "trapo", **kw)
    loop = TrapoLoop(labeled, kw.get("capacity", 16), kw["warm_up"], kw.get("topk", 0.1), kw.get("thres", 0.4),
                     kw.get("update_db", True), kw.get("promote", False), kw.get("promote_window", 3),
                     kw.get("promote_pass_rate", 0.8))
    promote = kw.get("promote", False)
    for t, ids, answers, rewards, sizes in _stream(seed, n_pool, 12, b, g, ragged):
        fb = Feedback(ids, rewards, answers=answers, step=t, group_sizes=sizes)
        want = [None] * b
        for rows, p_ids, p_ans, _ in _parts(ids, answers, rewards, sizes):
            for r, target in zip(rows, loop.targets(p_ids, p_ans)):
                want[r] = target if promote or not labeled[p_ids[rows.index(r)]] else None
        assert s.targets(fb) == want
        s.observe(fb)
        for _, p_ids, p_ans, p_rew in _parts(ids, answers, rewards, sizes):
            loop.observe(p_ids, p_ans, p_rew)
        admitted = s.admit(fb)
        if sizes is None:                                # the last observed batch's keep pattern
            keep = [loop.is_lab(q) or (loop.selected_at[q] == loop.steps - 1 and loop.steps - 1 >= loop.warm_up)
                    for q in ids]
            assert admitted[:, 0].tolist() == keep
    st = s.states["admission"]
    assert st.visits.tolist() == loop.visits
    for pos in range(n_pool):
        k = min(loop.visits[pos], loop.cap)
        np.testing.assert_array_equal(st.rate[pos, :k], loop.rate[pos])
        assert st.majority[pos, :k].tolist() == loop.maj[pos]
        assert str(st.label[pos]) == loop.label[pos]
        assert st.selected_at[pos] == loop.selected_at[pos]
        assert (st.db_len[pos] > 0) == (pos in loop.db)
        if pos in loop.db:
            np.testing.assert_array_equal(st.db[pos, :st.db_len[pos]], loop.db[pos])
    assert (int(st.selected), int(st.dropped)) == (loop.selected, loop.dropped)
    assert loop.selected > 0
    if promote:
        assert any(loop.label) and int(st.promotions) == sum(x != "" for x in loop.label)


# ---- DIEM: the d × d solve -------------------------------------------------------------------------
def _eigh_nn(f, i, ridge, rcond=1e-10):
    """The N × N path: eigendecomposition of P + λI (P = F·Fᵀ), pseudo-inverse, rescaling."""
    n = f.shape[0]
    p = f @ f.T
    m = p + ridge * np.trace(p) / n * np.eye(n)
    e, v = np.linalg.eigh(m)
    keep = np.abs(e) > rcond * np.abs(e).max()
    w = v @ (np.where(keep, 1.0 / np.where(keep, e, 1.0), 0.0) * (v.T @ i))
    return w * np.sqrt(np.sum(f.sum(axis=0) ** 2) / (w @ p @ w))


def _svd(f, i, ridge, rcond=1e-10):
    """(P + λI)⁺Î rescaled, from the SVD of F itself (no squared condition number)."""
    n = f.shape[0]
    u, s, _ = np.linalg.svd(f, full_matrices=True)
    e = np.zeros(n)
    e[:s.size] = s ** 2
    m = e + ridge * float((s ** 2).sum()) / n
    keep = np.abs(m) > rcond * np.abs(m).max()
    w = u @ (np.where(keep, 1.0 / np.where(keep, m, 1.0), 0.0) * (u.T @ i))
    return w * np.sqrt(np.sum(f.sum(axis=0) ** 2) / np.sum((f.T @ w) ** 2))


@pytest.mark.parametrize("kind", ["full", "zero_rows", "rank3", "tiny_row"])
def test_diem_d_by_d_solve_equals_the_n_by_n_one(kind):
    rng = np.random.default_rng(["full", "zero_rows", "rank3", "tiny_row"].index(kind))
    n, d = 512, 64                                        # the benchmark's B prompts, d features
    f = rng.standard_normal((n, d))
    if kind == "zero_rows":
        f[:100] = 0.0                                     # groups with A = 0
    elif kind == "rank3":
        f = rng.standard_normal((n, 3)) @ rng.standard_normal((3, d))
    elif kind == "tiny_row":
        f[0] *= 1e-4
    f /= np.abs(f).max()
    g = f.sum(axis=0)
    for imp in (f @ g, np.einsum("nd,nd->n", f, g - f), f @ rng.standard_normal(d), rng.random(n)):
        want = _eigh_nn(f, imp, 0.0)
        got = constrained_weights(f, imp)
        assert np.abs(got - want).max() <= 1e-12 * np.abs(want).max()
        assert np.abs(got - _svd(f, imp, 0.0)).max() <= 1e-12 * np.abs(want).max()
        # ridge > 0 (the Woodbury form). P + λI has the eigenvalue λ on the N − d dimensions
        # outside span(F), so Î's component there is multiplied by 1/λ; any float64 path forms
        # that component with an error ~eps·‖Î‖, i.e. relative ~eps·e_max/λ ≤ eps·N/ρ. The N × N
        # eigendecomposition is no closer to the SVD reference (on the rank-3 features with a
        # random Î it is 7e-6 away, the d × d solve 2e-10).
        for ridge in (1e-3, 1.0):
            ref = _svd(f, imp, ridge)
            tol = max(1e-12, 20 * np.finfo(float).eps * n / ridge) * np.abs(ref).max()
            err = np.abs(constrained_weights(f, imp, ridge) - ref).max()
            assert err <= tol and err <= np.abs(_eigh_nn(f, imp, ridge) - ref).max() + tol
    assert _solve(f, f @ g)[1] is not None


def test_diem_rollout_unit_runs_at_b_g_samples():
    # unit="rollout" at B·G = 8,192 samples: the N × N Gram matrix would be 512 MB and its
    # eigendecomposition minutes; the d × d solve gives the projection of 1 onto span(F)
    rng = np.random.default_rng(7)
    b, g, d = 512, 16, 64
    grads = rng.standard_normal((b, g, d)).astype(np.float32)
    pool = Pool(list(range(b)))
    fb = Feedback(np.arange(b), rng.integers(0, 2, (b, g)).astype(float), grads=grads, step=0)
    p = make_policy("diem", unit="rollout", max_weight=None, relu=False)
    w = p.apply(p.init(pool), pool, Batch.from_feedback(fb, pool, 0.5)).ravel()
    f = grads.reshape(-1, d).astype(np.float64)
    f /= np.abs(f).max()
    q, _ = np.linalg.qr(f)                                # orthonormal basis of span(F)
    proj = q @ (q.T @ np.ones(b * g))
    want = proj * np.sqrt(np.sum(f.sum(axis=0) ** 2) / np.sum((f.T @ proj) ** 2))
    assert np.abs(w - want).max() <= 1e-10 * np.abs(want).max()


# ---- Feedback.answers: the one-pass check ------------------------------------------------------------
def test_feedback_answers_fast_check_keeps_values_types_and_errors():
    fb = Feedback([0, 1], np.zeros((2, 2)), answers=[["1", None], ["", " 2 "]], step=0)
    assert fb.answers.tolist() == [["1", None], ["", " 2 "]] and fb.answers.dtype == object
    assert fb.answers.shape == (2, 2) and not fb.answers.flags.writeable
    mixed = Feedback([0], np.zeros((1, 2)), answers=[[np.str_("a"), "b"]], step=0)
    assert [type(a) for a in mixed.answers.ravel()] == [str, str]         # np.str_ → str, as before
    for bad, where in (([["1", 2]], r"answers\[0\]\[1\] is int"), ([[("a",), "b"]], r"answers\[0\]\[0\] is tuple"),
                       ([[b"x", "a"]], r"answers\[0\]\[0\] is bytes")):
        with pytest.raises(ValueError, match=where):
            Feedback([0], np.zeros((1, 2)), answers=bad, step=0)
    assert Feedback([], np.zeros((0, 3)), answers=[], step=0).answers.shape == (0, 3)
    given = np.array([["1", None], [" 2", "x"]], dtype=object)              # an object array: copied
    fb = Feedback([0, 1], np.zeros((2, 2)), answers=given, step=0)
    given[0, 0] = "changed"
    assert fb.answers.tolist() == [["1", None], [" 2", "x"]] and not fb.answers.flags.writeable
    mixed = Feedback([0], np.zeros((1, 2)), answers=np.array([["a", np.str_("b")]], dtype=object), step=0)
    assert [type(a) for a in mixed.answers.ravel()] == [str, str]
    with pytest.raises(ValueError, match=r"answers\[0\]\[1\] is int"):
        Feedback([0], np.zeros((1, 2)), answers=np.array([["a", 1]], dtype=object), step=0)


# ---- admission and reweighting: sorts replaced by partitions and row argmaxes ------------------------
def test_top_k_first_is_the_stable_sort_prefix():
    from rlpace.policies._admission import _top_k_first
    rng = np.random.default_rng(8)
    for trial in range(500):
        n = int(rng.integers(1, 60))
        a = rng.integers(0, 4, n).astype(float) if trial % 2 else rng.random(n)     # many ties, or none
        k = int(rng.integers(1, n + 1))
        want = np.zeros(n, bool)
        want[sorted(range(n), key=lambda j: -a[j])[:k]] = True         # Python's sort is stable
        assert _top_k_first(a, k).tolist() == want.tolist()


def test_best_k_per_row_is_the_stable_sort_prefix_of_each_row():
    from rlpace.policies._gfpo import _best_k_per_row
    rng = np.random.default_rng(9)
    for trial in range(300):
        b, g = int(rng.integers(1, 8)), int(rng.integers(2, 12))
        s = rng.integers(-2, 3, (b, g)).astype(float) if trial % 2 else rng.standard_normal((b, g))
        k = int(rng.integers(1, g))                                     # k ≤ 4: argmax rounds; above: sort
        for i, row in enumerate(_best_k_per_row(s, k)):
            assert np.flatnonzero(row).tolist() == sorted(sorted(range(g), key=lambda j: -s[i, j])[:k])


def test_quantiles_are_numpys_bit_for_bit():
    from rlpace.policies._reweighting import _quantiles
    rng = np.random.default_rng(10)
    for trial in range(2000):
        n = int(rng.integers(1, 50)) if trial % 10 else int(rng.integers(1, 9000))
        x = rng.integers(0, 3, n).astype(float) if trial % 3 == 0 else rng.standard_normal(n) * 10.0 ** rng.uniform(-3, 3)
        qs = (0.25, 0.75) if trial % 4 == 0 else (0.0, 1.0) if trial % 7 == 0 else tuple(rng.random(2))
        assert np.quantile(x, qs).tobytes() == _quantiles(x.copy(), qs).tobytes()
