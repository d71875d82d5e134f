"""Records at the boundary: Pool and Feedback validation, Pool indexes on hand examples,
verl-schema loaders, and GRPO group advantages against hand-computed values."""

import json

import numpy as np
import pytest

from rlpace import Batch, Feedback, Pool, group_advantages


# ---- Pool: bad input -----------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, field", [
    (dict(domains=[]), "Pool.domains"),
    (dict(domains=[[0, 1], [1, 0]]), "Pool.domains"),
    (dict(domains=[0.5, 1.5]), "Pool.domains"),
    (dict(domains=[0, 1, 1], clusters=[0, 1]), "Pool.clusters"),
    (dict(domains=[0, 1, 1], clusters=[[0], [1], [2]]), "Pool.clusters"),
    (dict(domains=[0, 1, 1], difficulty=[0.1, np.inf, 0.2]), "Pool.difficulty"),
    (dict(domains=[0, 1, 1], difficulty=[0.1, 0.2]), "Pool.difficulty"),
    (dict(domains=[0, 1, 1], ranks=[0, -1, 0]), "Pool.ranks"),
    (dict(domains=[0, 1, 1], ranks=[0.0, 1.0, 0.0]), "Pool.ranks"),
    (dict(domains=[0, 1, 1], ranks=[0, 1]), "Pool.ranks"),
    (dict(domains=[0, 1, 1], ids=[7, 8, 7]), "Pool.ids"),
    (dict(domains=[0, 1, 1], ids=["a", "b", "a"]), "Pool.ids"),
    (dict(domains=[0, 1, 1], ids=[1, 2]), "Pool.ids"),
])
def test_pool_rejects_bad_input_naming_the_field(kwargs, field):
    domains = kwargs.pop("domains")
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        Pool(domains, **kwargs)


# ---- Pool: hand examples -------------------------------------------------------------------
def test_pool_codes_names_and_default_annotations():
    pool = Pool(["math", "logic", "math", "code"])
    assert pool.domain_names == ("code", "logic", "math")
    assert pool.domains.tolist() == [2, 1, 2, 0]
    assert pool.clusters.tolist() == pool.domains.tolist()     # clusters default to domains
    assert pool.cluster_names == pool.domain_names
    assert pool.ids.tolist() == [0, 1, 2, 3]
    assert np.isnan(pool.difficulty).all()
    assert pool.ranks.tolist() == [0, 0, 1, 0]                 # by position inside the domain
    assert len(pool) == 4 and pool.n_domains == 3 and pool.n_clusters == 3
    np.testing.assert_allclose(pool.domain_share(), [0.25, 0.25, 0.5])
    assert not pool.domains.flags.writeable                      # immutable


def test_pool_int_labels_keep_their_values():
    pool = Pool([14, 3, 3, 7])
    assert pool.domain_names == (3, 7, 14)
    assert pool.domains.tolist() == [2, 0, 0, 1]


def test_pool_ranks_by_difficulty_nan_last_ties_by_position():
    #            pos:  0    1    2     3    4     5    6
    clusters = ["a", "a", "b", "a", "b", "a", "b"]
    diff = [0.5, 0.1, np.nan, 0.1, 0.3, np.nan, 0.3]
    pool = Pool(["d"] * 7, clusters=clusters, difficulty=diff)
    # cluster a: pos1 (0.1), pos3 (0.1, later), pos0 (0.5), pos5 (NaN)
    # cluster b: pos4 (0.3), pos6 (0.3, later), pos2 (NaN)
    assert pool.ranks.tolist() == [2, 0, 2, 1, 0, 3, 1]
    order, offsets = pool.by_rank()
    assert offsets.tolist() == [0, 4, 7]
    assert order.tolist() == [1, 3, 0, 5, 4, 6, 2]
    assert pool.rank_position().tolist() == [2, 0, 2, 1, 0, 3, 1]


def test_pool_explicit_ranks_and_by_rank_uses_them():
    pool = Pool([0, 0, 0, 1, 1], ranks=[2, 0, 1, 1, 0])
    order, offsets = pool.by_rank()
    assert order.tolist() == [1, 2, 0, 4, 3]
    assert offsets.tolist() == [0, 3, 5]
    assert pool.rank_position().tolist() == [2, 0, 1, 1, 0]


def test_pool_members_groups_in_position_order():
    pool = Pool(["b", "a", "b", "c", "a"], clusters=[1, 0, 0, 2, 1])
    order, offsets = pool.members("domain")
    assert offsets.tolist() == [0, 2, 4, 5]
    assert order.tolist() == [1, 4, 0, 2, 3]
    order, offsets = pool.members("cluster")
    assert offsets.tolist() == [0, 2, 4, 5]
    assert order.tolist() == [1, 2, 0, 4, 3]
    with pytest.raises(ValueError, match="arms"):
        pool.members("prompt")


def test_pool_fingerprint_and_index_of():
    a = Pool(["x", "y", "x"], ids=[10, 20, 30])
    assert a.fingerprint() == Pool(["x", "y", "x"], ids=[10, 20, 30]).fingerprint()
    assert a.fingerprint() != Pool(["x", "y", "y"], ids=[10, 20, 30]).fingerprint()
    assert a.fingerprint() != Pool(["x", "y", "x"], ids=[10, 20, 31]).fingerprint()
    assert a.index_of([30, 10]).tolist() == [2, 0]
    with pytest.raises(ValueError, match="not in the pool"):
        a.index_of([10, 99])


# ---- Pool loaders (verl schema) ------------------------------------------------------------
ROWS = [
    {"data_source": "kk3", "prompt": "p0", "extra_info": {"index": 100, "cluster_id": 1, "rank_in_cluster": 0}},
    {"data_source": "kk5", "prompt": "p1", "extra_info": {"index": 101, "cluster_id": 0, "rank_in_cluster": 1}},
    {"data_source": "kk3", "prompt": "p2", "extra_info": {"index": 102, "cluster_id": 0, "rank_in_cluster": 0}},
]


def _expected():
    return Pool(["kk3", "kk5", "kk3"], clusters=[1, 0, 0], ranks=[0, 1, 0], ids=[100, 101, 102])


def _same_pool(a, b):
    for f in ("domains", "clusters", "ranks", "ids"):
        assert getattr(a, f).tolist() == getattr(b, f).tolist(), f
    assert a.domain_names == b.domain_names and a.cluster_names == b.cluster_names
    np.testing.assert_array_equal(a.difficulty, b.difficulty)
    assert a.fingerprint() == b.fingerprint()


def test_from_jsonl_reads_verl_rows(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n\n")
    _same_pool(Pool.from_jsonl(path), _expected())


def test_from_parquet_reads_verl_rows(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), path)
    _same_pool(Pool.from_parquet(path), _expected())


def test_loader_top_level_columns_and_difficulty(tmp_path):
    rows = [{"data_source": "a", "extra_info": {"index": "q1"}, "cluster_id": 3, "difficulty": 0.9},
            {"data_source": "b", "extra_info": {"index": "q2"}, "cluster_id": 4, "difficulty": 0.1},
            {"data_source": "a", "extra_info": {"index": "q3"}, "cluster_id": 3, "difficulty": 0.2}]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    pool = Pool.from_jsonl(path)
    assert pool.ids.tolist() == ["q1", "q2", "q3"]
    assert pool.clusters.tolist() == [0, 1, 0] and pool.cluster_names == (3, 4)
    np.testing.assert_allclose(pool.difficulty, [0.9, 0.1, 0.2])
    assert pool.ranks.tolist() == [1, 0, 0]                       # cluster 3: 0.2 < 0.9
    assert pool.index_of(["q3"]).tolist() == [2]


def test_loader_optional_columns_absent_and_missing_required(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"data_source": "a"}) + "\n" + json.dumps({"data_source": "b"}))
    with pytest.raises(ValueError, match=r"extra_info.index is missing in 2 of 2 rows .*id_key=None"):
        Pool.from_jsonl(path)                      # refused, as the verl adapter refuses it
    pool = Pool.from_jsonl(path, id_key=None)      # row positions, asked for explicitly
    assert pool.ids.tolist() == [0, 1] and np.isnan(pool.difficulty).all()
    path.write_text(json.dumps({"data_source": "a"}) + "\n" + json.dumps({"prompt": "no source"}))
    with pytest.raises(ValueError, match="data_source"):
        Pool.from_jsonl(path)
    path.write_text("")
    with pytest.raises(ValueError, match="no rows"):
        Pool.from_jsonl(path)


def test_loader_rejects_duplicate_ids(tmp_path):
    rows = [dict(r) for r in ROWS]
    rows[2] = {"data_source": "kk3", "extra_info": {"index": 100}}
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    with pytest.raises(ValueError, match=r"Pool\.ids"):
        Pool.from_jsonl(path)


# ---- Feedback: bad input -------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, field", [
    (dict(prompt_ids=[[0, 1]], rewards=[[1.0], [0.0]]), "Feedback.prompt_ids"),
    (dict(prompt_ids=[0.5, 1.0], rewards=[[1.0], [0.0]]), "Feedback.prompt_ids"),
    (dict(prompt_ids=["a", "b"], rewards=[[1.0], [0.0]]), "Feedback.prompt_ids"),
    (dict(prompt_ids=[0, -1], rewards=[[1.0], [0.0]]), "Feedback.prompt_ids"),
    (dict(prompt_ids=[0, 1], rewards=[1.0, 0.0]), "Feedback.rewards"),
    (dict(prompt_ids=[0, 1], rewards=[[[1.0]], [[0.0]]]), "Feedback.rewards"),
    (dict(prompt_ids=[0, 1], rewards=[[1.0, 0.0]]), "Feedback.rewards"),
    (dict(prompt_ids=[0, 1], rewards=np.zeros((2, 0))), "Feedback.rewards"),
    (dict(prompt_ids=[0, 1], rewards=[[1.0, np.nan], [0.0, 1.0]]), "Feedback.rewards"),
    (dict(prompt_ids=[0, 1], rewards=[[1.0, np.inf], [0.0, 1.0]]), "Feedback.rewards"),
    (dict(prompt_ids=[0, 1], rewards=[[1.0, -np.inf], [0.0, 1.0]]), "Feedback.rewards"),
    (dict(prompt_ids=[0, 1], rewards=[[1.0, 0.0], [0.0, 1.0]], advantages=[[1.0], [0.0]]),
     "Feedback.advantages"),
    (dict(prompt_ids=[0, 1], rewards=[[1.0, 0.0], [0.0, 1.0]], advantages=[1.0, 0.0]),
     "Feedback.advantages"),
    (dict(prompt_ids=[0, 1], rewards=[[1.0, 0.0], [0.0, 1.0]], advantages=[[1.0, np.nan], [0.0, 1.0]]),
     "Feedback.advantages"),
    (dict(prompt_ids=[0, 1], rewards=[[1.0, 0.0], [0.0, 1.0]], advantages=[[1.0, np.inf], [0.0, 1.0]]),
     "Feedback.advantages"),
    (dict(prompt_ids=[0, 1], rewards=[[1.0, 0.0], [0.0, 1.0]], step=-1), "Feedback.step"),
    (dict(prompt_ids=[0, 1], rewards=[[1.0, 0.0], [0.0, 1.0]], step="three"), "Feedback.step"),
])
def test_feedback_rejects_bad_input_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        Feedback(**{"step": 0, **kwargs})


def test_feedback_normalises_types_and_accepts_edge_cases():
    fb = Feedback(np.array([1.0, 2.0]), [[1, 0, 1], [0, 0, 0]], step=np.int64(3))
    assert fb.prompt_ids.dtype == np.int64 and fb.prompt_ids.tolist() == [1, 2]
    assert fb.rewards.dtype == np.float64 and fb.rewards.shape == (2, 3)
    assert fb.advantages is None and fb.step == 3 and isinstance(fb.step, int)
    assert (fb.batch_size, fb.group_size) == (2, 3)
    empty = Feedback([], np.zeros((0, 4)), step=0)
    assert empty.batch_size == 0 and empty.rewards.shape == (0, 4)
    assert Feedback([], [], step=0).batch_size == 0
    g1 = Feedback([0], [[1.0]], step=0)
    assert g1.group_size == 1


# ---- group advantages and Batch ------------------------------------------------------------
def test_group_advantages_hand_values():
    eps = 1e-6
    r = np.array([[1.0, 0.0, 1.0, 0.0],      # mean .5, std .5
                  [1.0, 0.0, 0.0, 0.0],      # mean .25, std sqrt(3)/4
                  [1.0, 1.0, 1.0, 1.0],      # all same → 0
                  [0.2, 0.8, 0.2, 0.8]])     # non-binary: mean .5, std .3
    a = group_advantages(r)
    np.testing.assert_allclose(a[0], np.array([0.5, -0.5, 0.5, -0.5]) / (0.5 + eps))
    s = np.sqrt(3) / 4
    np.testing.assert_allclose(a[1], np.array([0.75, -0.25, -0.25, -0.25]) / (s + eps))
    np.testing.assert_array_equal(a[2], 0.0)
    np.testing.assert_allclose(a[3], np.array([-0.3, 0.3, -0.3, 0.3]) / (0.3 + eps))
    np.testing.assert_array_equal(group_advantages(np.array([[1.0], [0.0]])), 0.0)   # G = 1
    assert group_advantages(np.zeros((0, 4))).shape == (0, 4)


@pytest.mark.parametrize("k", [0, 1, 3, 4, 7, 8])
def test_group_advantages_mean_abs_identity(k):
    # binary rewards with pass rate p: mean |A| = 2 sqrt(p(1-p)) / (1 + eps/σ); 0 at p ∈ {0, 1}
    g = 8
    r = np.zeros((1, g))
    r[0, :k] = 1.0
    p = k / g
    sigma = np.sqrt(p * (1 - p))
    expected = 0.0 if sigma == 0 else 2 * sigma / (1 + 1e-6 / sigma)
    np.testing.assert_allclose(np.abs(group_advantages(r)).mean(), expected, rtol=1e-12)


def test_batch_from_feedback_threshold_and_derived_fields():
    pool = Pool(["a", "b", "a"], clusters=[5, 6, 6])
    fb = Feedback([2, 1, 2], [[3.0, 1.0, -1.0, 3.0], [0.0, 0.0, 0.0, 0.0], [3.0, 3.0, 3.0, 3.0]], step=4)
    batch = Batch.from_feedback(fb, pool, success_threshold=3.0)
    assert batch.success.tolist() == [[True, False, False, True], [False] * 4, [True] * 4]
    np.testing.assert_allclose(batch.pass_rate, [0.5, 0.0, 1.0])
    assert batch.domains.tolist() == [0, 1, 0] and batch.clusters.tolist() == [1, 1, 1]
    assert batch.informative.tolist() == [True, False, False]
    np.testing.assert_allclose(batch.advantages, group_advantages(fb.rewards))
    assert batch.step == 4
    given = Feedback([0], [[1.0, 0.0]], advantages=[[0.0, 0.0]], step=0)
    b2 = Batch.from_feedback(given, pool, 0.5)
    np.testing.assert_array_equal(b2.advantages, 0.0)               # the trainer's advantages win
    assert b2.informative.tolist() == [False]
