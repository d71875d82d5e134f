"""The pass-rate predictor (`rlpace.predict`), `Pool.features`, and MoPPS's predictor prior:
hand-computed SGD and staging, importance weighting, features validated before
anything is built, exact resume."""

import pickle

import numpy as np
import pytest

from rlpace import Feedback, Pool, Scheduler
from rlpace.policies import make_policy
from rlpace.policies._mopps import MoppsPriorState, MoppsState
from rlpace.predict import design, predictor


def _sig(z):
    return 1.0 / (1.0 + np.exp(-z))


# ---- online SGD, hand-computed ---------------------------------------------------------------
def test_sgd_step_hand_computed():
    pool = Pool(["a", "b"])                                  # x = [1, onehot(a), onehot(b)]
    pr = predictor(lr=0.4, l2=1e-3, stage_steps=100)
    st = pr.init(pool)
    st = pr.update(st, pool, np.array([0]), np.array([3.0]), np.array([4.0]), np.array([1.0]))
    # θ = 0 → σ = 0.5; g = (3 − 4·0.5)/4 · [1, 1, 0]; θ = 0.4·g (the l2 term is 0 at θ = 0)
    np.testing.assert_allclose(st.theta, [0.1, 0.1, 0.0], atol=1e-15)
    np.testing.assert_array_equal(st.stage_theta, 0.0)        # scoring waits for the stage


def test_sgd_step_importance_weighted_hand_computed():
    pool = Pool(["a", "b"])
    pr = predictor(lr=0.4, l2=1e-3, stage_steps=100)
    st = pr.update(pr.init(pool), pool, np.array([0, 1]), np.array([4.0, 0.0]), np.array([4.0, 4.0]),
                   np.array([1.0, 3.0]))
    # Σωn = 4 + 12 = 16; g = (1·(4 − 2)·[1,1,0] + 3·(0 − 2)·[1,0,1]) / 16 = [−4, 2, −6]/16
    np.testing.assert_allclose(st.theta, 0.4 * np.array([-4.0, 2.0, -6.0]) / 16, atol=1e-15)


# ---- stages ------------------------------------------------------------------------------------
def _reference_fit(x, k, n, w, l2, iters=20000, lr=0.5):
    """Plain gradient ascent on Σω[k log σ + (n − k) log(1 − σ)]/Σωn − l2/2 ‖θ‖² (a loop, not Newton)."""
    theta = np.zeros(x.shape[1])
    total = (w * n).sum()
    for _ in range(iters):
        s = _sig(x @ theta)
        theta = theta + lr * (x.T @ (w * (k - n * s)) / total - l2 * theta)
    return theta


def test_stage_refit_matches_an_independent_fit_and_empties_the_buffer():
    pool = Pool(["a", "b", "b"])
    pr = predictor(lr=0.0, l2=0.1, stage_steps=2, newton_steps=25)
    st = pr.init(pool)
    st = pr.update(st, pool, np.array([0, 1]), np.array([3.0, 1.0]), np.array([4.0, 4.0]), np.array([1.0, 2.0]))
    assert int(st.stage) == 0 and int(st.buf_len) == 2
    np.testing.assert_array_equal(st.stage_theta, 0.0)
    st = pr.update(st, pool, np.array([2]), np.array([0.0]), np.array([8.0]), np.array([0.5]))
    assert int(st.stage) == 1 and int(st.buf_len) == 0 and (st.buf_ids == -1).all()
    x = np.array([[1.0, 1, 0], [1, 0, 1], [1, 0, 1]])
    ref = _reference_fit(x, np.array([3.0, 1, 0]), np.array([4.0, 4, 8]), np.array([1.0, 2, 0.5]), 0.1)
    np.testing.assert_allclose(st.stage_theta, ref, atol=1e-8)
    np.testing.assert_array_equal(st.theta, st.stage_theta)


def test_weight_two_equals_the_group_twice():
    pool = Pool(["a", "b"], features=[[0.0], [1.0]])
    pr = predictor(lr=0.0, l2=0.01, stage_steps=1, newton_steps=30)
    one = pr.update(pr.init(pool), pool, np.array([0, 1]), np.array([1.0, 3.0]), np.array([4.0, 4.0]),
                    np.array([2.0, 1.0]))
    two = pr.update(pr.init(pool), pool, np.array([0, 0, 1]), np.array([1.0, 1.0, 3.0]),
                    np.array([4.0, 4.0, 4.0]), np.array([1.0, 1.0, 1.0]))
    np.testing.assert_allclose(one.stage_theta, two.stage_theta, atol=1e-10)


def test_design_standardises_features_and_one_hots():
    pool = Pool(["a", "b", "a", "b"], clusters=[0, 0, 1, 2], features=[[1.0], [3.0], [1.0], [3.0]])
    # mean 2, std 1; domains a, b; clusters 0, 1, 2 (they differ from the domains)
    np.testing.assert_allclose(design(pool, np.array([1, 2])),
                               [[1, 1, 0, 1, 1, 0, 0], [1, -1, 1, 0, 0, 1, 0]])


def test_design_uses_the_offline_difficulty_with_an_unknown_indicator():
    pool = Pool(["a", "a", "a"], difficulty=[1.0, 3.0, np.nan])
    # known scores 1, 3: mean 2, std 1 → z = −1, 1; the NaN one gets z = 0 and the indicator 1
    np.testing.assert_allclose(design(pool, np.arange(3)), [[1, -1, 0, 1], [1, 1, 0, 1], [1, 0, 1, 1]])


def test_predicts_unseen_prompts_from_features():
    rng = np.random.default_rng(0)
    n = 4000
    feats = rng.standard_normal((n, 4)).astype(np.float32)
    true = _sig(2.0 * feats[:, 0] - 1.5 * feats[:, 1])
    pool = Pool(["a"] * n, features=feats)
    pr = predictor(stage_steps=5)
    st = pr.init(pool)
    for t in range(10):                                      # 10 · 100 prompts rolled out once
        ids = np.arange(t * 100, (t + 1) * 100)
        wins = (rng.random((100, 8)) < true[ids, None]).sum(axis=1).astype(float)
        st = pr.update(st, pool, ids, wins, np.full(100, 8.0), np.ones(100))
    unseen = np.arange(1000, n)
    pred = pr.predict(st, pool, unseen)
    # AUC of the prediction for "true pass rate > 0.5" on never-rolled-out prompts, by ranks
    y = true[unseen] > 0.5
    ranks = np.argsort(np.argsort(pred)) + 1
    auc = (ranks[y].sum() - y.sum() * (y.sum() + 1) / 2) / (y.sum() * (~y).sum())
    assert auc > 0.9
    assert np.corrcoef(pred, true[unseen])[0, 1] > 0.9


# ---- Pool.features -------------------------------------------------------------------------------
def test_features_validated_before_anything_is_built(tmp_path):
    with pytest.raises(ValueError, match=r"Pool.features has NaN or inf values .*first at \[1, 0\]"):
        Pool(["a", "b"], features=[[0.0], [np.nan]])
    with pytest.raises(ValueError, match="Pool.features has 3 rows but the pool has 2 prompts"):
        Pool(["a", "b"], features=np.zeros((3, 2)))
    with pytest.raises(ValueError, match="Pool.features must be 2-D"):
        Pool(["a", "b"], features=np.zeros(2))
    with pytest.raises(ValueError, match="Pool.features must hold real numbers"):
        Pool(["a", "b"], features=[["x"], ["y"]])
    with pytest.raises(ValueError, match="not a .npy file"):
        Pool(["a", "b"], features=str(tmp_path / "missing.npy"))
    with pytest.raises(ValueError, match="NaN or inf"):
        Pool(["a", "b"], features=np.array([[1e39], [0.0]]))     # beyond float32


def test_features_from_prepare_embeddings_are_memory_mapped(tmp_path):
    emb = np.arange(12, dtype=np.float32).reshape(4, 3)
    path = tmp_path / "train.embeddings.npy"
    np.save(path, emb)
    pool = Pool(["a"] * 4, features=str(path))
    assert isinstance(pool.features, np.memmap) and pool.features.dtype == np.float32
    np.testing.assert_array_equal(pool.features, emb)
    assert not pool.features.flags.writeable
    bad = emb.copy()
    bad[2, 1] = np.inf
    np.save(path, bad)
    with pytest.raises(ValueError, match=r"first at \[2, 1\]"):
        Pool(["a"] * 4, features=str(path))


def test_features_are_part_of_the_fingerprint_only_when_given():
    plain = Pool(["a", "b"])
    assert "features" not in plain.fingerprint_parts()
    f1 = Pool(["a", "b"], features=[[0.0], [1.0]])
    f2 = Pool(["a", "b"], features=[[0.0], [2.0]])
    assert f1.fingerprint() != f2.fingerprint() != plain.fingerprint()
    assert f1.fingerprint() == Pool(["a", "b"], features=np.array([[0.0], [1.0]], np.float64)).fingerprint()
    s = Scheduler(f1, "criticality_is")
    with pytest.raises(ValueError, match="its features differ"):
        Scheduler(f2, "criticality_is").load_state_dict(s.state_dict())


def test_dataset_loaders_take_features(tmp_path):
    rows = tmp_path / "train.jsonl"
    rows.write_text('{"data_source": "a", "extra_info": {"index": 5}}\n'
                    '{"data_source": "b", "extra_info": {"index": 9}}\n')
    emb = tmp_path / "train.embeddings.npy"
    np.save(emb, np.array([[0.5, 1.0], [2.0, -1.0]], np.float32))
    pool = Pool.from_jsonl(rows, features=str(emb))
    np.testing.assert_array_equal(pool.features, [[0.5, 1.0], [2.0, -1.0]])
    with pytest.raises(ValueError, match="Pool.features has 3 rows but the pool has 2 prompts"):
        Pool.from_jsonl(rows, features=np.zeros((3, 2)))


def test_caller_array_changes_do_not_reach_the_pool():
    x = np.zeros((2, 1), np.float32)
    pool = Pool(["a", "b"], features=x)
    x[0, 0] = np.nan
    assert np.isfinite(pool.features).all()


# ---- exact resume through the Scheduler ------------------------------------------------------------
def _pool_with_signal(n=300, seed=0):
    rng = np.random.default_rng(seed)
    feats = rng.standard_normal((n, 3)).astype(np.float32)
    true = _sig(2.5 * feats[:, 0])
    return Pool(np.where(np.arange(n) < n // 2, "x", "y"), features=feats), true


def _drive(s, true, steps, start=0):
    out = []
    for t in range(start, start + steps):
        ids = s.propose(16)
        rng = np.random.default_rng([7, t])
        fb = Feedback(ids, (rng.random((16, 4)) < true[ids, None]).astype(float), step=t)
        s.observe(fb)
        out.append((ids, s.loss_weights(fb)))
    return out


@pytest.mark.parametrize("policy, kw", [("criticality_is", {"stage_steps": 3}),
                                        ("mopps", {"prior_strength": 5.0, "prior_stage_steps": 3}),
                                        ("greso", {})])
def test_exact_resume_across_stages(policy, kw):
    pool, true = _pool_with_signal()
    ref = Scheduler(pool, policy, seed=3, **kw)
    _drive(ref, true, 7)                                     # the checkpoint falls inside stage 3
    sd = pickle.loads(pickle.dumps(ref.state_dict()))
    fresh = Scheduler(pool, policy, seed=3, **kw)
    fresh.load_state_dict(sd)
    a, b = _drive(ref, true, 8, start=7), _drive(fresh, true, 8, start=7)
    for (i1, w1), (i2, w2) in zip(a, b):
        np.testing.assert_array_equal(i1, i2)
        np.testing.assert_array_equal(w1, w2)


# ---- MoPPS prior ------------------------------------------------------------------------------------
def test_mopps_prior_off_keeps_the_plain_state():
    pool = Pool(["a", "b"])
    assert type(make_policy("mopps").init(pool)) is MoppsState
    assert type(make_policy("mopps", prior_strength=1.0).init(pool)) is MoppsPriorState


def test_mopps_prior_steers_unseen_prompts_by_the_prediction():
    # domain "easy" always passes, "hard" never; prompts 0..19 of each are observed, the rest
    # never. With target 0.9 and a strong prior, unseen easy prompts win the Thompson draw.
    n = 400
    pool = Pool(np.repeat(["easy", "hard"], n // 2))
    seen = np.r_[np.arange(20), n // 2 + np.arange(20)]
    counts = {}
    for strength in (0.0, 50.0):
        s = Scheduler(pool, "mopps", seed=0, target=0.9, ratio=4, prior_strength=strength,
                      prior_stage_steps=1)
        s.observe(Feedback(seen, np.repeat([[1.0] * 4, [0.0] * 4], 20, axis=0), step=0))
        ids = np.concatenate([s.propose(32) for _ in range(10)])
        unseen = ids[~np.isin(ids, seen)]
        counts[strength] = (unseen < n // 2).mean()          # share of easy among unseen picks
    # Without the prior, unseen prompts sit at Beta(1, 1): both domains alike (≈ 0.5).
    assert 0.35 < counts[0.0] < 0.65
    assert counts[50.0] > 0.9


# ---- the block-form design products: exact against the dense design -----------------------------
@pytest.mark.parametrize("kind", ["plain", "clusters", "features+difficulty"])
def test_refit_and_sgd_in_block_form_equal_the_dense_design(kind):
    """The SGD step and the Newton refit use Xᵀv and XᵀWX by blocks (bincounts for the one-hot
    columns); an independent loop over the dense `design` rows gives the same θ."""
    rng = np.random.default_rng(7)
    n = 300
    dom = rng.integers(0, 4, size=n)
    kw = {}
    if kind != "plain":
        kw["clusters"] = dom * 2 + rng.integers(0, 2, size=n)
    if kind == "features+difficulty":
        kw["features"] = rng.normal(size=(n, 3))
        diff = rng.normal(size=n)
        diff[::7] = np.nan
        kw["difficulty"] = diff
    pool = Pool(dom, **kw)
    b = 200
    ids = rng.integers(0, n, size=b)
    wins = rng.integers(0, 9, size=b).astype(float)
    nn = np.full(b, 8.0)
    wt = rng.uniform(0.2, 3.0, size=b)
    lr, l2, steps = 0.3, 0.01, 4
    pr = predictor(lr=lr, l2=l2, stage_steps=1, newton_steps=steps)
    st = pr.update(pr.init(pool), pool, ids, wins, nn, wt)
    # reference: the SGD step, then Newton steps, each written over the dense rows one by one
    x = design(pool, ids)
    d = x.shape[1]
    total = float((wt * nn).sum())
    theta = np.zeros(d)
    g = np.zeros(d)
    for j in range(b):
        g += wt[j] * (wins[j] - nn[j] * _sig(x[j] @ theta)) * x[j]
    theta = theta + lr * (g / total - l2 * theta)
    for _ in range(steps):
        g, h = -l2 * theta * total, l2 * np.eye(d) * total
        for j in range(b):
            s = _sig(x[j] @ theta)
            g += wt[j] * (wins[j] - nn[j] * s) * x[j]
            h += wt[j] * nn[j] * s * (1 - s) * np.outer(x[j], x[j])
        theta = theta + np.linalg.solve(h, g)
    np.testing.assert_allclose(st.stage_theta, theta, rtol=1e-9, atol=1e-12)
    assert int(st.stage) == 1
