"""Votes over a Feedback's answers: derived once from the record itself (`Feedback.answer_votes`),
never kept in module state, and equal to a plain per-group loop."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from rlpace import Feedback, Pool, Scheduler
from rlpace.policies import _vote
from rlpace.stats import _votes

POOL_ANSWERS = ["7", " 7", "7 ", "8", "", "  ", None, "x", "10", "1"]


def _random_answers(rng, b, g):
    return [[POOL_ANSWERS[k] for k in rng.integers(0, len(POOL_ANSWERS), size=g)] for _ in range(b)]


def _plain_factorisation(rows):
    """codes[i][j] and the distinct stripped answers in first-seen order, one answer at a time."""
    values, codes = [], []
    for row in rows:
        out = []
        for a in row:
            c = None if a is None else (a.strip() or None)
            if c is None:
                out.append(-1)
                continue
            if c not in values:
                values.append(c)
            out.append(values.index(c))
        codes.append(out)
    return codes, values


def _plain_majority(row, ties):
    valid = [a.strip() for a in row if a is not None and a.strip()]
    if not valid:
        return None, 0
    counts = Counter()
    for a in valid:
        counts[a] += 1
    top = max(counts.values())
    leaders = [a for a in dict.fromkeys(valid) if counts[a] == top]    # first-seen order
    if ties == "abstain" and len(leaders) > 1:
        return None, top
    return leaders[0], top


@pytest.mark.parametrize("seed", range(6))
def test_feedback_votes_equal_a_plain_loop(seed):
    rng = np.random.default_rng(seed)
    b, g = int(rng.integers(1, 40)), int(rng.integers(1, 9))
    rows = _random_answers(rng, b, g)
    given = rows
    if seed % 2:                # the constructor's other fast path: an object[B, G] array
        given = np.empty((b, g), dtype=object)
        given[...] = rows
    fb = Feedback(np.arange(b), np.zeros((b, g)), step=0, answers=given)
    votes = fb.answer_votes
    codes, values = _plain_factorisation(rows)
    assert votes.codes.tolist() == codes
    assert votes.values == values
    for ties in ("first", "abstain"):
        win, count, hashes = votes.majorities(ties)
        for i, row in enumerate(rows):
            want, n = _plain_majority(row, ties)
            assert (values[win[i]] if win[i] >= 0 else None) == want
            assert count[i] == n
            assert hashes[i] == _vote.answer_hash(want)


def test_two_feedbacks_never_share_votes():
    rows = [["1", "2", "2"], ["3", None, "3"]]
    fb1 = Feedback([0, 1], np.zeros((2, 3)), step=0, answers=rows)
    fb2 = Feedback([0, 1], np.zeros((2, 3)), step=0, answers=rows)
    fb3 = fb1.with_grads(np.ones((2, 3, 4)))          # another record over the same answers array
    v1, v2, v3 = fb1.answer_votes, fb2.answer_votes, fb3.answer_votes
    assert v1 is fb1.answer_votes                       # derived once, kept with its record
    assert v1 is not v2 and v1 is not v3 and v2 is not v3
    assert v1.answers is fb1.answers and v2.answers is fb2.answers
    assert v1.codes.tolist() == v2.codes.tolist() == [[0, 1, 1], [2, -1, 2]]
    assert Feedback([0], np.zeros((1, 2)), step=0).answer_votes is None
    # the votes are read-only, like the record they come from
    with pytest.raises(ValueError):
        v1.codes[0, 0] = 5
    with pytest.raises(ValueError):
        v1.majorities("first")[0][0] = 1
    # no module-level cache of votes remains
    for module in (_vote, _votes):
        assert not [k for k, v in vars(module).items() if isinstance(v, (list, dict)) and not k.startswith("__")]


@pytest.mark.parametrize("method", ["olr", "trapo", "ttrl"])
def test_answers_factorised_once_per_feedback(method, monkeypatch):
    """targets and observe of two interleaved Feedbacks: each one's answers factorised once
    (a cache of the last array voted would factorise fb1 twice), and the same targets as a
    Scheduler that sees them one at a time."""
    calls = []
    real = _votes.answer_codes

    def counting(answers):
        calls.append(answers.shape)
        return real(answers)

    monkeypatch.setattr(_votes, "answer_codes", counting)
    kw = {"all_prompts": True} if method == "ttrl" else {}
    pool = Pool(["a"] * 6, labeled=[False] * 6)
    rows1 = [["1", "1", "2", None], ["3", "4", "4", "4"], ["5", "5", "6", "6"]]
    rows2 = [["9", "9", "9", "8"], [None, None, "", " "], ["2", "2", "1", "1"]]
    fb1 = Feedback([0, 1, 2], np.zeros((3, 4)), step=0, answers=rows1)
    fb2 = Feedback([3, 4, 5], np.zeros((3, 4)), step=0, answers=rows2)
    s = Scheduler(pool, method, **kw)
    t1, t2 = s.targets(fb1), s.targets(fb2)
    s.observe(fb1)
    s.observe(fb2)
    assert len(calls) == 2
    if method == "olr":                 # a first visit keeps the dataset label (warm-up)
        assert t1 == t2 == [None] * 3
        assert s.state_dict()["policy/target/rate"][:6, 0].tolist() == [0.5, 0.75, 0.0, 0.75, 0.0, 0.0]
        return
    first_seen = method == "ttrl"       # ttrl breaks ties by the first answer; trapo abstains
    assert t1 == ["1", "4", "5" if first_seen else None]
    assert t2 == ["9", None, "2" if first_seen else None]


def test_olr_decides_once_per_feedback(monkeypatch):
    """OLR decides once per Feedback, with nothing kept on the Feedback or its votes: the
    Scheduler hands what `targets` returned to `observe` (its decision log and, through
    `Batch.targets`, OLR's update, which appends the visit under that decision), and an
    `observe` without `targets` asks the target place once. The targets, the log and the
    state equal a Scheduler given a fresh Feedback for each call, and the numbers are the
    rule's by hand: "7" has 2 of 3 votes on every visit, so from visit 1 on (start_step 0) it is
    the unique majority of a history of "7"s."""
    from rlpace.policies import _olr
    calls = []
    real = _olr.ols_slopes
    monkeypatch.setattr(_olr, "ols_slopes", lambda y, n: calls.append(1) or real(y, n))
    pool = Pool(["a"] * 3)
    kw = dict(start_step=0, slope_threshold=-1.0)
    s, ref, alone = (Scheduler(pool, "olr", **kw) for _ in range(3))
    rows = [["7", "7", "8"], ["1", "2", None], ["4", " 4", "4"]]
    for t in range(3):
        fb = Feedback([0, 1, 2], np.ones((3, 3)), step=t, answers=rows)
        before = len(calls)
        got = s.targets(fb)
        s.observe(fb)
        assert len(calls) - before == (t > 0)               # one decision: targets; log and update reuse it
        before = len(calls)
        alone.observe(Feedback([0, 1, 2], np.ones((3, 3)), step=t, answers=rows))
        assert len(calls) - before == (t > 0)               # observe alone: one decision, log and update
        want = ref.targets(Feedback([0, 1, 2], np.ones((3, 3)), step=t, answers=rows))
        ref.observe(Feedback([0, 1, 2], np.ones((3, 3)), step=t, answers=rows))
        assert got == want == ([None, None, None] if t == 0 else ["7", None, "4"])
    assert s.supervision_log() == ref.supervision_log() == alone.supervision_log()
    assert [d["evidence"]["pass_rate"] for d in s.supervision_log()] == [2 / 3, 1.0, 2 / 3, 1.0]
    for key, val in ref.state_dict().items():
        np.testing.assert_array_equal(s.state_dict()[key], val)
        np.testing.assert_array_equal(alone.state_dict()[key], val)
    assert s.metrics()["supervision/relabels"] == 4.0
    assert not hasattr(fb.answer_votes, "derived")         # nothing kept on the Feedback's votes


def test_olr_targets_of_another_feedback_or_state_are_not_handed_over():
    """`targets(fb1)`, `targets(fb2)`, `observe(fb1)`, `observe(fb2)`: fb1's observe decides
    again (the kept targets are fb2's) and fb2's too (fb1's update changed the state), so the
    log and the state equal the plain sequence of one Feedback at a time."""
    pool = Pool(["a"] * 2)
    kw = dict(start_step=0, slope_threshold=-1.0)
    s, ref = Scheduler(pool, "olr", **kw), Scheduler(pool, "olr", **kw)
    for t in range(3):
        fb1 = Feedback([0, 1], np.ones((2, 3)), step=t, answers=[["7", "7", "8"], ["5", "6", "6"]])
        fb2 = Feedback([0, 1], np.ones((2, 3)), step=t, answers=[["7", "7", "7"], ["6", "6", "6"]])
        s.targets(fb1), s.targets(fb2)
        s.observe(fb1), s.observe(fb2)
        for fb in (fb1, fb2):
            ref.observe(fb)
    assert s.supervision_log() == ref.supervision_log() and len(ref.supervision_log()) == 10   # every visit but the first
    for key, val in ref.state_dict().items():
        np.testing.assert_array_equal(s.state_dict()[key], val)


def test_olr_update_appends_under_the_handed_decision():
    """`Batch.targets` carries the target place's decision into OLR's update: a visit handed
    as relabelled counts as a relabel and records no label pass rate; handed as kept, the
    reverse — whatever OLR's own rule would decide (here: a first visit, never relabelled)."""
    from rlpace.policies import make_policy
    from rlpace.types import Batch
    pool = Pool(["a"] * 2)
    p = make_policy("olr")
    fb = Feedback([0, 1], np.array([[1.0, 1, 0], [0.0, 0, 0]]), step=0, answers=[["5", "5", "6"], ["1", "1", "1"]])
    batch = Batch.from_feedback(fb, pool, 0.5)
    own = p.update(p.init(pool), pool, batch)
    handed = p.update(p.init(pool), pool, batch._replace(targets=["5", None]))
    assert (int(own.relabels), int(own.kept)) == (0, 2)
    assert (int(handed.relabels), int(handed.kept)) == (1, 1)
    assert own.label_rate.tolist() == [2 / 3, 0.0]
    assert np.isnan(handed.label_rate[0]) and handed.label_rate[1] == 0.0
    for st in (own, handed):    # the visit itself is appended either way: P = 2/3 and 1
        assert st.rate[:, 0].tolist() == [2 / 3, 1.0] and st.visits.tolist() == [1, 1]


def test_olr_pass_is_not_reused_for_a_changed_state():
    """The kept pass belongs to the state object it was computed from: after `update` (which
    writes into that state's arrays) the same Feedback is decided again on the new state."""
    from rlpace.policies import make_policy
    from rlpace.types import Batch
    pool = Pool(["a"])
    p = make_policy("olr", start_step=0, slope_threshold=-1.0)
    fb = Feedback([0], np.ones((1, 3)), step=0, answers=[["5", "5", "6"]])
    batch = Batch.from_feedback(fb, pool, 0.5)
    s0 = p.init(pool)
    assert p.apply(s0, pool, batch).labels == [None]        # visit 0: warm-up
    s1 = p.update(s0, pool, batch)
    assert p.apply(s1, pool, batch).labels == ["5"]         # visit 1 on the new state: relabel
    assert s1.visits.tolist() == [1] and s1.rate[0, :1].tolist() == [2 / 3]



def _plain_row_majority(row, ties):
    """(winner code or −1, top count) of one row of codes, −1 = no answer, one code at a time."""
    counts: dict = {}
    for c in row:
        if c >= 0:
            counts[c] = counts.get(c, 0) + 1                    # dict keeps first-seen order
    if not counts:
        return -1, 0
    top = max(counts.values())
    leaders = [c for c, k in counts.items() if k == top]
    if ties == "abstain" and len(leaders) > 1:
        return -1, top
    return leaders[0], top


@pytest.mark.parametrize("seed", range(4))
def test_majorities_of_few_codes_equal_a_plain_loop(seed):
    """`group_majorities` told the codes' range (`n_values`: one bincount over (row, code),
    the path the votes take) against a loop over each row, both tie rules, with rows without
    answers, ties, a single column and every value count up to 4·G."""
    rng = np.random.default_rng(seed)
    for _ in range(300):
        b, g = int(rng.integers(0, 9)), int(rng.integers(1, 9))
        n_values = int(rng.integers(1, 4 * g))
        codes = rng.integers(-1, n_values, size=(b, g))
        codes[rng.random(b) < 0.2] = -1                         # groups without any answer
        for ties in ("first", "abstain"):
            win, count = _votes.group_majorities(codes, ties, n_values=n_values)
            want = [_plain_row_majority(r, ties) for r in codes.tolist()]
            assert win.tolist() == [w for w, _ in want] and count.tolist() == [c for _, c in want]


def test_winner_hashes_equal_a_plain_loop():
    """`answer_hashes` (one blake2b per distinct winner, gathered) against `answer_hash` of
    each winner's value, NO_MAJORITY (0) for −1."""
    rng = np.random.default_rng(0)
    for _ in range(300):
        values = [str(v) for v in rng.integers(0, 50, size=int(rng.integers(1, 12)))]
        winners = rng.integers(-1, len(values), size=int(rng.integers(0, 20)))
        got = _votes.answer_hashes(values, winners)
        assert got.dtype == np.int64
        assert got.tolist() == [_votes.NO_MAJORITY if w < 0 else _votes.answer_hash(values[w])
                                for w in winners.tolist()]
    assert _votes.answer_hashes(["a"], np.full(3, -1)).tolist() == [0, 0, 0]


def test_olr_in_place_append_equals_its_walk():
    """OLR's update given the targets of a batch of distinct prompts appends each visit in
    place (`append_visits`); against the same update deciding itself (its walk over copies of
    the histories) over 40 steps of 4 prompts in a pool of 6: histories of capacity 3 fill and
    shift, relabels happen (start_step 1, any slope), the label pass rates are recorded."""
    from rlpace.policies import make_policy
    from rlpace.types import Batch
    pool = Pool(["a"] * 6, labeled=[True, True, True, False, False, False])
    p = make_policy("olr", start_step=1, slope_threshold=-1.0, capacity=3)
    s_fast, s_walk = p.init(pool), p.init(pool)
    rng = np.random.default_rng(0)
    relabels = 0
    for t in range(40):
        ids = rng.choice(6, size=4, replace=False)
        rows = [[str(v) for v in rng.integers(0, 3, size=5)] for _ in ids]
        fb = Feedback(ids, (rng.random((4, 5)) < 0.5).astype(float), step=t, answers=rows)
        batch = Batch.from_feedback(fb, pool, 0.5)
        labels = p.apply(s_fast, pool, batch).labels
        relabels += sum(x is not None for x in labels)
        s_fast = p.update(s_fast, pool, batch._replace(targets=labels))
        s_walk = p.update(s_walk, pool, batch)
        for a, b in zip(s_fast, s_walk):
            np.testing.assert_array_equal(a, b)
    assert relabels > 5 and (s_fast.visits > 3).all()          # decisions made, histories shifted


@pytest.mark.parametrize("limit", [None, 100])
def test_answer_codes_positions_as_bytes_equal_a_plain_loop(limit, monkeypatch):
    """`answer_codes` reads each answer's first position from 4-byte strings joined into one
    buffer (`_position_bytes`); against the one-answer-at-a-time factorisation on batches of
    up to 300 × 260 answers (first positions past 255 and 65,535, so every byte of a position
    is used), with many distinct answers, None and blanks; with `limit` the calls above 100
    answers take the Python-int count instead, with the same codes."""
    if limit is not None:
        monkeypatch.setattr(_votes, "_MAX_POSITION_BYTES", limit)
    assert _votes._position_bytes(70_000)[65_793] == bytes([1, 1, 1, 0])   # 65,793 = 0x010101
    rng = np.random.default_rng(1)
    for b, g, distinct in [(3, 4, 5), (40, 16, 2000), (300, 260, 70_000), (1, 1, 1)]:
        words = [None, "", " "] + [f" v{k}" if k % 3 else f"v{k}" for k in range(distinct)]
        rows = [[words[k] for k in rng.integers(0, len(words), size=g)] for _ in range(b)]
        rows[-1][-1] = f"v{distinct + 7}"                   # first seen at the very last position
        codes, values = _votes.answer_codes(rows)
        index: dict = {}                                    # stripped answer -> code, first seen
        want_codes = []
        for row in rows:
            out = []
            for a in row:
                c = None if a is None else (a.strip() or None)
                out.append(-1 if c is None else index.setdefault(c, len(index)))
            want_codes.append(out)
        assert codes.dtype == np.int64 and codes.tolist() == want_codes and values == list(index)


def _plain_olr_targets(state, ids, rows, start_step, slope_threshold, cap, min_pass_rate, margin):
    """OLR's decision for each row of a batch of distinct prompts, one row at a time: the
    visit's majority and pass rate appended to the prompt's last `cap` visits, then the rule."""
    labels = []
    for q, row in zip(ids.tolist(), rows):
        m, n = _plain_majority(row, "abstain")
        p = n / len(row) if m is not None else 0.0
        v = int(state.visits[q])
        hist_r = list(state.rate[q, :min(v, cap)]) + [p]
        hist_m = list(state.majority[q, :min(v, cap)]) + [_vote.answer_hash(m)]
        hist_r, hist_m = hist_r[-cap:], hist_m[-cap:]
        lr = float(state.label_rate[q])
        ok = m is not None and v > start_step
        ok = ok and (min_pass_rate is None or p >= min_pass_rate)
        ok = ok and (margin is None or (np.isfinite(lr) and p - lr >= margin))
        ok = ok and _vote.ols_slope(hist_r) >= slope_threshold
        if ok:
            counts = Counter(hist_m).most_common(2)
            ok = counts[0][0] == _vote.answer_hash(m) and (len(counts) == 1 or counts[1][1] < counts[0][1])
        labels.append(m if ok else None)
    return labels


@pytest.mark.parametrize("options", [{}, {"min_pass_rate": 0.5}, {"margin": 0.1}])
def test_olr_decision_of_distinct_prompts_equals_a_plain_loop(options):
    """OLR's target place on a batch of distinct prompts gathers the histories of the rows
    that pass the cheap conditions only (a majority, past start_step, the options); its
    labels against a loop over rows on random states — histories empty, partial and full
    (capacity 4, visits up to 9, so some have shifted), majorities drawn from the answers the
    batch votes, label pass rates unknown or known — and the rows it gathers are exactly those."""
    from rlpace.policies import make_policy
    from rlpace.types import Batch
    cap, start_step = 4, 2
    pool = Pool(["a"] * 50)
    p = make_policy("olr", start_step=start_step, slope_threshold=0.0, capacity=cap, **options)
    rng = np.random.default_rng(3)
    hashes = [_vote.NO_MAJORITY] + [_vote.answer_hash(str(k)) for k in range(3)]
    relabels = 0
    for _ in range(60):
        s = p.init(pool)
        s.visits[:] = rng.integers(0, 10, size=50)
        s.rate[:] = rng.random((50, cap)).round(2)
        s.majority[:] = np.array(hashes)[rng.integers(0, 4, size=(50, cap))]
        s.label_rate[:] = np.where(rng.random(50) < 0.3, np.nan, rng.random(50))
        ids = rng.choice(50, size=20, replace=False)
        rows = [[str(v) if v < 3 else None for v in rng.integers(0, 4, size=6)] for _ in ids]
        fb = Feedback(ids, np.zeros((20, 6)), step=0, answers=rows)
        batch = Batch.from_feedback(fb, pool, 0.5)
        reads = []
        rate = s.rate

        class Recorded(np.ndarray):
            def __getitem__(self, key):
                if isinstance(key, np.ndarray):
                    reads.append(key.copy())
                return np.ndarray.__getitem__(self.view(np.ndarray), key)

        s = s._replace(rate=rate.view(Recorded))
        got = p.apply(s, pool, batch).labels
        want = _plain_olr_targets(s, ids, rows, start_step, 0.0, cap, options.get("min_pass_rate"),
                                  options.get("margin"))
        assert got == want
        relabels += sum(x is not None for x in got)
        visits, maj = s.visits[ids], [_plain_majority(r, "abstain")[0] for r in rows]
        cheap = [m is not None and v > start_step for m, v in zip(maj, visits.tolist())]
        gathered = np.concatenate(reads) if reads else np.zeros(0, np.int64)
        assert sorted(gathered.tolist()) == sorted(q for q, c in zip(ids.tolist(), cheap) if c) \
            or options       # with an option the gathered rows are fewer still
        assert set(gathered.tolist()) <= {q for q, c in zip(ids.tolist(), cheap) if c}
    assert relabels > 10


def test_trapo_decision_log_equals_a_plain_loop():
    """TraPO's target decisions and keep / drop decisions, built from whole-batch gathers
    (Python values, not a numpy scalar per row), against a loop over rows reading the states
    one prompt at a time: 30 steps of 12 prompts from a pool of 40, half unlabelled, warm-up 3,
    repeated prompts in a batch, ties (no majority) and groups without answers."""
    from rlpace.policies import make_policy
    from rlpace.types import Batch
    pool = Pool(["a"] * 40, labeled=[k % 2 == 0 for k in range(40)])
    m = make_policy("trapo", warm_up=3, topk=0.3, thres=0.2)
    t_state, a_state = m.target.init(pool), m.admission.init(pool)
    rng = np.random.default_rng(4)
    seen = {"trapo_majority": 0, "trapo_trajectory": 0, "trapo_warm_up": 0}
    for t in range(30):
        ids = rng.integers(0, 40, size=12)
        rows = [[str(v) if v < 3 else None for v in rng.integers(0, 5, size=4)] for _ in ids]
        fb = Feedback(ids, (rng.random((12, 4)) < 0.5).astype(float), step=t, answers=rows)
        batch = Batch.from_feedback(fb, pool, 0.5)
        got = m.target.apply(t_state, pool, batch)
        want_labels, want_dec = [], []
        for i, (q, row) in enumerate(zip(ids.tolist(), rows)):
            maj, n = _plain_majority(row, "abstain")
            label = None if pool.labeled[q] else maj
            want_labels.append(label)
            if label is not None:
                want_dec.append({"row": i, "rule": "trapo_majority", "decision": "pseudo_label",
                                 "target": maj, "evidence": {"votes": n, "voters": 4}})
        assert got.labels == want_labels and list(got.decisions) == want_dec
        a_state = m.admission.update(a_state, pool, batch)
        step = t
        want_dec, first = [], set()
        for i, q in enumerate(ids.tolist()):
            if pool.labeled[q] or q in first:
                continue
            first.add(q)
            if step < 3:
                want_dec.append({"row": i, "rule": "trapo_warm_up", "decision": "drop",
                                 "evidence": {"step": step, "warm_up": 3}})
            elif int(a_state.scored_at[q]) == step:
                sc = float(a_state.score[q])
                want_dec.append({"row": i, "rule": "trapo_trajectory",
                                 "decision": "keep" if int(a_state.selected_at[q]) == step else "drop",
                                 "evidence": {"score": None if np.isnan(sc) else sc, "thres": 0.2,
                                              "topk": 0.3, "length": int(a_state.compared[0]),
                                              "database": int(a_state.compared[1])}})
        got_dec = m.admission.decisions(a_state, pool, batch)
        assert got_dec == want_dec
        for d in list(got.decisions) + got_dec:
            seen[d["rule"]] += 1
            assert all(type(v) in (int, float, str, type(None)) for v in d["evidence"].values())
    assert min(seen.values()) > 5
