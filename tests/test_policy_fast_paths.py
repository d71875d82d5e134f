"""Cheaper per-step paths of the answer-voting and feature policies (olr, diem) and of the
Feedback's gradient-feature check, each against a plain loop written here."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from rlpace import Feedback, Pool, Scheduler
from rlpace.errors import InputError
from rlpace.policies._diem import _solve, diem, diem_importance
from rlpace.types import Batch

F32_MAX = float(np.finfo(np.float32).max)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_grads_range_check_equals_the_elementwise_rule(dtype):
    rng = np.random.default_rng(0)
    specials = [np.nan, np.inf, -np.inf, F32_MAX, -F32_MAX, 1e39, -1e39, 0.0]
    for trial in range(60):
        g = rng.standard_normal((3, 2, 4)).astype(dtype)
        for _ in range(int(rng.integers(0, 3))):
            v = specials[int(rng.integers(0, len(specials)))]
            if dtype == np.float32 and abs(v) == 1e39:
                continue                                   # not representable in float32
            g[tuple(rng.integers(0, s) for s in g.shape)] = v
        bad = [(i, j, k) for i in range(3) for j in range(2) for k in range(4)
               if not abs(float(g[i, j, k])) <= F32_MAX]     # NaN fails the comparison
        if not bad:
            fb = Feedback([0, 1, 2], np.zeros((3, 2)), step=0, grads=g)
            np.testing.assert_array_equal(fb.grads, g.astype(np.float32))
        else:
            with pytest.raises(InputError, match=rf"first at \[{bad[0][0]}, {bad[0][1]}, {bad[0][2]}\]"):
                Feedback([0, 1, 2], np.zeros((3, 2)), step=0, grads=g)


def test_diem_prompt_features_equal_a_plain_sum():
    """unit="prompt": the weights solved from features summed in float64 one rollout at a time."""
    rng = np.random.default_rng(1)
    b, g, d = 12, 5, 3                       # N > d: the Gram path with a null space
    grads = rng.standard_normal((b, g, d)).astype(np.float32)
    fb = Feedback(np.arange(b), rng.integers(0, 2, (b, g)), step=0, grads=grads)
    pool = Pool([0] * b)
    batch = Batch.from_feedback(fb, pool, 0.5)
    feats = np.zeros((b, d))
    for i in range(b):
        for j in range(g):
            for k in range(d):
                feats[i, k] += float(grads[i, j, k])
    feats /= np.abs(feats).max()
    for kind in ("loo", "batch"):
        p = diem(importance=kind, relu=False, max_weight=None)
        want = _solve(feats, diem_importance(kind, feats, None, batch.pass_rate))[0]
        np.testing.assert_array_equal(p.apply(p.init(pool), pool, batch), np.repeat(want[:, None], g, axis=1))


def _plain_olr_histories(visits, cap):
    """Per prompt, the last `cap` (majority pass rate, majority answer) of its visits, oldest
    first, by list appends: OLR's unique majority, no majority on a tie."""
    hist = {}
    for pid, answers in visits:
        valid = [a.strip() for a in answers if a is not None and a.strip()]
        top = Counter(valid).most_common(2)
        m = None
        if top and not (len(top) == 2 and top[1][1] == top[0][1]):
            m = top[0][0]
        rate = top[0][1] / len(answers) if m is not None else 0.0
        hist.setdefault(pid, []).append((rate, m))
        hist[pid] = hist[pid][-cap:]
    return hist


def test_olr_full_histories_shift_like_a_plain_loop():
    """capacity 3 over 7 visits of the same prompts: the shift of full histories (taken only
    when some history is full) against list appends."""
    from rlpace.policies._vote import answer_hash
    rng = np.random.default_rng(2)
    cap, n = 3, 5
    s = Scheduler(Pool(["a"] * n), "olr", capacity=cap)
    seen = []
    for t in range(7):
        ids = rng.permutation(n)[:4] if t % 2 else np.arange(n)
        rows = [[["1", "2", "3", None][int(k)] for k in rng.integers(0, 4, 4)] for _ in ids]
        fb = Feedback(ids, np.zeros((len(ids), 4)), step=t, answers=rows)
        s.targets(fb)
        s.observe(fb)
        seen += list(zip(ids.tolist(), rows))
    want = _plain_olr_histories(seen, cap)
    state = s.state_dict()
    rate, maj = state["policy/target/rate"], state["policy/target/majority"]
    for pid, h in want.items():
        k = len(h)
        assert rate[pid, :k].tolist() == [r for r, _ in h]
        assert maj[pid, :k].tolist() == [answer_hash(m) for _, m in h]
