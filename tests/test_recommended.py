"""`recommended` is DUMP's mixture composed with MoPPS inside each domain — checked against
the two parts built by hand, and on a pool where the right choice is known."""

import numpy as np

import rlpace
from rlpace import Feedback, Pool, Scheduler
from rlpace.policies import compose, dump_ucb, mopps


def test_same_batches_as_dump_composed_with_mopps():
    # the defaults: DUMP at T = 0.15 over the pool's shares (docs/methods/recommended.md)
    pool = Pool(["a"] * 50 + ["b"] * 30 + ["c"] * 20)
    a = Scheduler(pool, "recommended", seed=3)
    b = Scheduler(pool, compose(dump_ucb(temperature=0.15, base="pool"), mopps(), name="x"), seed=3)
    rng = np.random.default_rng(0)
    for step in range(6):
        ids_a, ids_b = a.propose(16), b.propose(16)
        assert np.array_equal(ids_a, ids_b)
        r = (rng.random((16, 4)) < 0.5).astype(float)
        a.observe(Feedback(ids_a, r, step=step))
        b.observe(Feedback(ids_b, r, step=step))
    assert rlpace.recommended().mixture.name and a.name == "recommended"


def test_moves_slots_to_the_learnable_domain_and_to_boundary_prompts():
    # domain a: always solved (|A| = 0); domain b: prompts 10..29 at p = 1/2, 30..49 never solved.
    pool = Pool(["a"] * 10 + ["b"] * 40)
    s = Scheduler(pool, "recommended", seed=0)
    for step in range(40):
        ids = s.propose(8)
        r = np.zeros((8, 4))
        r[ids < 10] = 1.0
        half = (ids >= 10) & (ids < 30)
        r[half, :2] = 1.0
        s.observe(Feedback(ids, r, step=step))
    ids = np.concatenate([s.propose(8) for _ in range(20)])
    share_b = np.mean(ids >= 10)
    assert share_b > 0.8                                   # DUMP: b carries the |A| signal
    in_b = ids[ids >= 10]
    assert np.mean(in_b < 30) > 0.8                        # MoPPS: b's boundary prompts
