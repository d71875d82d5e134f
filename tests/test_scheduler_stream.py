"""The scheduler's hot path: the same seed gives the same stream after a speed-up.

`stream_digest` runs one registered policy for 50 steps on a fixed synthetic stream (propose,
the supervision calls where the method has them, `step`) and hashes what it proposed, what
it kept and weighted, and its final state. `tests/fixtures/stream_digests.json` holds the
digests of the code before the per-step costs were cut (commit 844c909), written by

    PYTHONPATH=<a checkout of that commit>/src python tests/test_scheduler_stream.py \\
        > tests/fixtures/stream_digests.json

so every policy whose code was not meant to change must still match them bit for bit. The
helpers that replaced slower code are also checked against the plain formulas here.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from rlpace import Feedback, Pool, Scheduler

FIXTURE = Path(__file__).parent / "fixtures" / "stream_digests.json"
N, K, CLUSTERS, B, G, STEPS, D = 3000, 6, 24, 64, 8, 50, 8
#: Policies whose stream was changed on purpose since the fixture, and why (their law is
#: tested below instead).
CHANGED = {
    "recommended": "MoPPS's candidates inside each arm are drawn for all arms at once (the same "
                   "law as one Generator.choice per arm, another stream)",
    "diem": "its weights are solved on the d x d Gram matrix of the features instead of the "
            "n x n one, and by LU solves instead of an eigendecomposition when that matrix is "
            "well conditioned: equal to 1e-12 relative, not bit for bit (checked against the "
            "n x n solve and an SVD in tests/test_after_rollout_vectorised.py and "
            "tests/test_methods_diem.py)",
}
#: The digest of a changed stream, recorded after its change (from 6fe649c, state keys added
#: since left out as for the fixture), so later speed-ups must keep that stream bit for bit.
RECORDED_AFTER_CHANGE = {
    "recommended": "1e2abb03cc859f87e55b87b39387cc03b58142b64011b00b85c4351570d42581",
    # the direct solve on well-conditioned Gram matrices (within 1e-10 of a float64 pseudo-inverse:
    # tests/test_methods_diem.py); before it, 40d10a34711e3cadc7fc25a83e798d53b0e027511e05eb63b074ca8d54dd800b
    "diem": "db7d5a93c9a96a1ed7409a22a6e6ddd07b75a7d5eed8bf35652210181925c989",
}


def _pool_and_rates():
    rng = np.random.default_rng(0)
    dom = rng.integers(0, K, size=N)
    clusters = dom * (CLUSTERS // K) + rng.integers(0, CLUSTERS // K, size=N)
    logit = rng.normal(0.0, 2.0, size=N) + (dom - K / 2) * 0.5
    pool = Pool(dom, clusters=clusters, difficulty=logit + 0.3 * rng.standard_normal(N))
    return pool, 1.0 / (1.0 + np.exp(logit))


def _extras(reads, t):
    rng = np.random.default_rng([7, t])
    out = {"lengths": rng.integers(16, 512, size=(B, G))}
    if "answers" in reads:
        out["answers"] = [[str(v) for v in row] for row in rng.integers(0, 4, size=(B, G))]
    if "token_entropy" in reads:
        out["token_entropy"] = rng.random((B, G))
    if "self_certainty" in reads:
        out["self_certainty"] = rng.random((B, G))
    if "mean_logprob" in reads:
        out["mean_logprob"] = -rng.random((B, G))
    if "grads" in reads or "ref_grad" in reads:
        out["grads"] = rng.standard_normal((B, G, D)).astype(np.float32)
        out["ref_grad"] = rng.standard_normal(D).astype(np.float32)
    return out


#: State keys added since the fixture (the digest leaves them out, so the stream and every
#: other state array must still match bit for bit): MoPPS's `moved` mask, saved with α and β
#: since it became part of the state instead of an index kept beside it.
ADDED_STATE = {"mopps": ("policy/selection/moved",), "recommended": ("policy/selection/moved",)}


def stream_digest(name: str, leave_out: tuple = ()) -> str:
    """sha256 over 50 steps of `name` (seed 3): proposed ids, keep, loss and advantage
    weights of every step, then every array of the final `state_dict` but the keys in
    `leave_out`."""
    pool, p = _pool_and_rates()
    sched = Scheduler(pool, name, seed=3, **({"mini_cluster_size": B // 4} if name == "ads" else {}))
    reads = frozenset().union(*(getattr(q, "reads", frozenset()) for q in sched.method.policies().values()))
    supervised = any(getattr(sched.method, place, None) is not None and
                     getattr(getattr(sched.method, place), "name", "") not in
                     ("dataset_labels", "identity_reward", "unit_advantage")
                     for place in ("target", "reward", "advantage"))
    h = hashlib.sha256()
    for t in range(STEPS):
        ids = sched.propose(B)
        u = np.random.default_rng([5, t]).random((B, G))
        fb = Feedback(ids, (u < p[ids][:, None]).astype(np.float64), step=t, **_extras(reads, t))
        if supervised:
            sched.targets(fb)
            fb = Feedback(ids, sched.rewards(fb), step=t, **_extras(reads, t))
        r = sched.step(fb)
        for arr in (ids, r.keep, r.weights, r.advantage_weights):
            h.update(np.ascontiguousarray(arr).tobytes())
    for key, val in sorted(sched.state_dict().items()):
        if key in leave_out:
            continue
        h.update(key.encode())
        h.update(np.ascontiguousarray(val).tobytes() if val.dtype.kind != "U" else str(val).encode())
    return h.hexdigest()


def _recorded() -> dict:
    if not FIXTURE.exists():                # the test below then fails on this name
        return {"<tests/fixtures/stream_digests.json is missing>": ""}
    return json.loads(FIXTURE.read_text())["digests"]


@pytest.mark.parametrize("name", sorted(_recorded()))
def test_stream_equals_the_recorded_one(name):
    if name in CHANGED and name not in RECORDED_AFTER_CHANGE:
        pytest.skip(f"changed on purpose: {CHANGED[name]}")
    want = RECORDED_AFTER_CHANGE.get(name, _recorded()[name])
    assert stream_digest(name, ADDED_STATE.get(name, ())) == want, (
        f"{name}: 50 steps of proposals, keep / weights or the final state differ from the code "
        f"the fixture was written from (see this module's docstring)")


def test_nearest_in_each_arm_equals_lexsort():
    from rlpace.policies._mopps import _nearest_in_each_arm
    rng = np.random.default_rng(0)
    for trial in range(200):
        n_arms = int(rng.integers(1, 30))
        lens = rng.integers(1, 700, size=n_arms)
        arm = np.repeat(np.arange(n_arms), lens)
        dist = [(rng.random(arm.size) - 0.5) ** 2, np.round((rng.random(arm.size) - 0.5) ** 2, 3),
                np.zeros(arm.size), rng.integers(0, 3, arm.size) / 4.0][trial % 4]
        keep = np.minimum(lens, rng.integers(0, 60, size=n_arms))
        # reference: every candidate sorted by (arm, distance, position), the first keep[a] of arm a
        by = np.lexsort((dist, arm))
        start = np.cumsum(lens) - lens
        rank = np.arange(by.size) - start[arm[by]]
        np.testing.assert_array_equal(_nearest_in_each_arm(arm, dist, keep), by[rank < keep[arm[by]]])


def test_candidates_by_arm_sizes_ranges_and_distinctness():
    from rlpace.policies._mopps import _candidates_by_arm
    # arm sizes 40, 5, 0, 1000, 3; counts 2, 3, 0, 20, 4 with ratio 5: 10 of 40 (common draw),
    # all 5 of arm 1 (ratio·n > size ≥ n), 100 of 1000 (common), 20 with replacement of 3 (n > size)
    offsets = np.array([0, 40, 45, 45, 1045, 1048])
    counts = np.array([2, 3, 0, 20, 4])
    for seed in range(50):
        pos, arm = _candidates_by_arm(np.random.default_rng(seed), offsets, counts, 5)
        assert np.bincount(arm).tolist() == [10, 5, 100, 20]
        assert (np.diff(arm) >= 0).all()
        for a, k in enumerate([0, 1, 3, 4]):
            mine = pos[arm == a]
            assert mine.min() >= offsets[k] and mine.max() < offsets[k + 1]
            if k != 4:
                assert np.unique(mine).size == mine.size
        assert sorted(pos[arm == 1].tolist()) == [40, 41, 42, 43, 44]


def test_candidates_by_arm_is_a_uniform_subset():
    """10 of 40 without replacement: every position in 1/4 of the draws, every pair in
    (10·9)/(40·39) of them, as for Generator.choice(40, 10, replace=False)."""
    from rlpace.policies._mopps import _candidates_by_arm
    reps = 20000
    inc = np.zeros((reps, 40))
    for r in range(reps):
        pos, _ = _candidates_by_arm(np.random.default_rng([11, r]), np.array([0, 40]), np.array([2]), 5)
        inc[r, pos] = 1
    freq = inc.mean(axis=0)
    pair = (inc.T @ inc / reps)[~np.eye(40, dtype=bool)]
    # binomial standard errors: sqrt(.25·.75/20000) = 0.0031, sqrt(.0577·.9423/20000) = 0.0016
    assert np.abs(freq - 0.25).max() < 5 * 0.0031
    assert np.abs(pair - 90 / 1560).max() < 5 * 0.0017


if __name__ == "__main__":              # write the fixture from the rlpace on sys.path
    from rlpace.policies import names
    out = {}
    for n in names():
        if n.startswith("oracle_"):
            continue
        out[n] = stream_digest(n)
        print(n, file=sys.stderr)
    print(json.dumps({"commit": sys.argv[1] if len(sys.argv) > 1 else "", "digests": out}, indent=1))


def test_distinct_draw_keeps_each_range_and_its_count():
    """Two ranges of 6 and 1000 values, 5 and 300 draws: the small range repeats often and
    every repeat is drawn again inside its own range, so each keeps its count."""
    from rlpace.policies._mopps import _distinct_draw
    lo = np.repeat([0, 6], [5, 300])
    width = np.repeat([6, 1000], [5, 300])
    for seed in range(200):
        v = _distinct_draw(np.random.default_rng(seed), lo, width)
        assert (np.diff(v) > 0).all()                          # distinct, increasing
        assert np.count_nonzero(v < 6) == 5 and np.count_nonzero((v >= 6) & (v < 1006)) == 300
