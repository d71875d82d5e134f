"""prioritized_learnability's update (one write per prompt when the batch repeats none) against
the plain per-group loop: the decayed counts and the whole sum tree, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from rlpace import Feedback, Pool, Scheduler
from rlpace.stats._sumtree import sumtree_build


def _loop_state(n, batches, decay, alpha, eps):
    """s ← λ·s + k, a ← λ·a + G per group in batch order (Python floats), then every leaf
    (p̂(1 − p̂) + eps)^α (unseen: (1/4 + eps)^α) and the tree built from the leaves."""
    s, a = [0.0] * n, [0.0] * n
    for ids, rewards in batches:
        g = rewards.shape[1]
        for i, row in zip(ids.tolist(), rewards.tolist()):
            s[i] = decay * s[i] + float(sum(1 for r in row if r >= 1.0))
            a[i] = decay * a[i] + float(g)
    s, a = np.array(s), np.array(a)
    p = np.divide(s, a, out=np.zeros(n), where=a > 0)
    leaves = np.where(a > 0, (p * (1.0 - p) + eps) ** alpha, (0.25 + eps) ** alpha)
    return s, a, sumtree_build(leaves).tree


@pytest.mark.parametrize("decay,alpha,eps", [(0.5, 0.6, 1e-6), (1.0, 1.0, 1e-3), (0.3, 0.25, 0.01)])
def test_update_equals_the_per_group_loop(decay, alpha, eps):
    n, g = 700, 8
    pool = Pool(np.arange(n) % 5)
    sched = Scheduler(pool, "prioritized_learnability", seed=0, decay=decay, alpha=alpha, eps=eps)
    rng = np.random.default_rng(1)
    batches = []
    for t in range(40):
        b = int(rng.integers(1, 90))
        # distinct prompts in most batches (the one-write path), repeats in every fifth where
        # the closed form of repeated groups is the loop's own rounding (λ a power of two)
        ids = rng.choice(n, size=b, replace=t % 5 == 4 and decay in (0.5, 1.0))
        rewards = (rng.random((b, g)) < rng.random((b, 1))).astype(np.float64)
        sched.observe(Feedback(ids, rewards, step=t))
        batches.append((ids, rewards))
    st = sched.states["selection"]
    s, a, tree = _loop_state(n, batches, decay, alpha, eps)
    assert st.successes.tobytes() == s.tobytes()
    assert st.attempts.tobytes() == a.tobytes()
    assert st.tree.tree.tobytes() == tree.tobytes()


def test_update_hand_computed():
    """λ = 0.5, α = 1, eps = 0: prompt 0 at 2/4 (priority 1/4), then 4/4 in a batch with prompt 1
    at 1/4: s = 0.5·2 + 4 = 5, a = 6, priority 5/36; prompt 1 at 3/16; prompt 2 unseen at 1/4."""
    pool = Pool(["x"] * 3)
    sched = Scheduler(pool, "prioritized_learnability", seed=0, decay=0.5, alpha=1.0, eps=1e-12)
    sched.observe(Feedback(np.array([0]), np.array([[1.0, 1.0, 0.0, 0.0]]), step=0))
    sched.observe(Feedback(np.array([1, 0]), np.array([[1.0, 0.0, 0.0, 0.0], [1.0] * 4]), step=1))
    st = sched.states["selection"]
    assert st.successes[:2].tolist() == [5.0, 1.0] and st.attempts[:2].tolist() == [6.0, 4.0]
    cap = st.tree.tree.shape[0] // 2
    np.testing.assert_allclose(st.tree.tree[cap:cap + 3], [5 / 36 + 1e-12, 3 / 16 + 1e-12, 0.25 + 1e-12],
                               rtol=1e-12)


def test_a_batch_without_repeats_takes_the_one_write_path(monkeypatch):
    """Distinct prompts: no call of the general (sorting, closed-form) update; a repeated prompt
    still takes it."""
    import rlpace.policies._learnability as mod
    calls = []
    real = mod._observe
    monkeypatch.setattr(mod, "_observe", lambda *a: calls.append(1) or real(*a))
    sched = Scheduler(Pool(["x"] * 50), "prioritized_learnability", seed=0)
    sched.observe(Feedback(np.arange(10), np.ones((10, 4)), step=0))
    assert calls == []
    sched.observe(Feedback(np.array([3, 3]), np.ones((2, 4)), step=1))
    assert calls == [1]
