"""`rlpace prepare`: semantic clusters and NLL difficulty (ADS, arXiv 2606.22305).

Uses the packaged all-MiniLM-L6-v2 and a tiny random-init Qwen2 built here (tests/_tiny_lm.py).
About 13 s on a quiet machine (up to ~90 s heavily contended), most of it importing torch,
transformers and MiniLM once.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sentence_transformers")
pytest.importorskip("sklearn")
pa = pytest.importorskip("pyarrow")
import pyarrow.parquet as pq  # noqa: E402

from _tiny_lm import build_tiny_lm  # noqa: E402
from rlpace import Pool  # noqa: E402
from rlpace.cli import main as cli_main  # noqa: E402
from rlpace.prepare import (answer_nll, answer_texts, cluster_embeddings, default_embed_model_path,  # noqa: E402
                            embed_texts, fill_infinite, prepare, question_texts, rank_within_clusters,
                            read_table, suggest_k)
from rlpace.prepare import _pipeline  # noqa: E402

torch.set_num_threads(1)
# Runs without --nll-model warn that difficulty is NaN; that is the documented behaviour.
pytestmark = pytest.mark.filterwarnings("ignore:no nll_model:UserWarning")
ANNOT = ("cluster_id", "rank_in_cluster", "cluster_size", "difficulty")


# ---- data -------------------------------------------------------------------------------

def topic_rows(per_topic: int = 15, seed: int = 0) -> list[tuple[str, str, str]]:
    """(topic, question, answer) over four visibly different topics, interleaved."""
    rng = np.random.default_rng(seed)
    foods = ["bread", "chocolate cake", "lasagna", "apple pie", "roast chicken", "banana bread",
             "pizza", "cookies"]
    teams = ["Brazil", "Germany", "Italy", "Argentina", "France", "Spain", "England", "Uruguay"]
    planets = ["Mars", "Jupiter", "Saturn", "Uranus", "Neptune", "Venus", "Mercury", "Earth"]
    rows = []
    for i in range(per_topic):
        a, b = rng.integers(10, 99, 2)
        rows.append(("arithmetic", f"What is {a} plus {b}? Give the sum as an integer.", str(a + b)))
        f, t = foods[i % 8], int(rng.integers(160, 240))
        rows.append(("cooking", f"How long should I bake the {f} in the oven at {t} degrees Celsius?",
                     f"Bake the {f} for about {int(rng.integers(20, 60))} minutes until golden."))
        tm, y = teams[i % 8], int(rng.integers(1950, 2022))
        rows.append(("football", f"Which national team did {tm} beat in the {y} World Cup football match?",
                     teams[(i + 3) % 8]))
        rows.append(("astronomy", f"How many moons orbit the planet {planets[i % 8]} in our solar system?",
                     str(int(rng.integers(0, 90)))))
    return rows


def verl_records(rows, *, index_base: int = 1000) -> list[dict]:
    return [{"data_source": topic,
             "prompt": [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": q}],
             "ability": "qa",
             "reward_model": {"style": "rule", "ground_truth": a},
             "extra_info": {"index": index_base + i, "split": "train"}}
            for i, (topic, q, a) in enumerate(rows)]


@pytest.fixture(scope="module")
def rows():
    return topic_rows()


@pytest.fixture(scope="module")
def data_parquet(tmp_path_factory, rows):
    path = tmp_path_factory.mktemp("data") / "train.parquet"
    pq.write_table(pa.Table.from_pylist(verl_records(rows)), path)
    return path


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory, rows):
    return build_tiny_lm(tmp_path_factory.mktemp("lm") / "tiny", corpus=[q + " " + a for _, q, a in rows])


PREP = dict(k=4, pca_dim=16, seed=7, nll_batch_size=5, progress=False)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, data_parquet, tiny_lm):
    out = tmp_path_factory.mktemp("out") / "train.prepared.parquet"
    return prepare(data_parquet, out, nll_model=tiny_lm, **PREP)


@pytest.fixture(scope="module")
def out_table(prepared):
    return pq.read_table(prepared.output)


# ---- round trip -------------------------------------------------------------------------

def test_input_columns_kept_and_annotations_typed(data_parquet, out_table):
    inp = pq.read_table(data_parquet)
    assert out_table.num_rows == inp.num_rows == 60
    for name in ("data_source", "prompt", "ability", "reward_model"):
        assert out_table.column(name).to_pylist() == inp.column(name).to_pylist()
    types = {name: out_table.schema.field(name).type for name in ANNOT}
    assert types == {"cluster_id": pa.int64(), "rank_in_cluster": pa.int64(),
                     "cluster_size": pa.int64(), "difficulty": pa.float64()}
    extra = out_table.column("extra_info").to_pylist()
    assert [e["index"] for e in extra] == list(range(1000, 1060))   # kept, not re-created
    assert all(e["split"] == "train" for e in extra)
    for name in ANNOT:                                              # same values in extra_info
        assert [e[name] for e in extra] == out_table.column(name).to_pylist()
    d = np.array(out_table.column("difficulty").to_pylist())
    assert np.isfinite(d).all() and (d > 0).all()


def test_ranks_follow_difficulty_inside_each_cluster(out_table):
    c = np.array(out_table.column("cluster_id").to_pylist())
    r = np.array(out_table.column("rank_in_cluster").to_pylist())
    s = np.array(out_table.column("cluster_size").to_pylist())
    d = np.array(out_table.column("difficulty").to_pylist())
    assert sorted(set(c.tolist())) == [0, 1, 2, 3]
    for j in range(4):
        members = np.flatnonzero(c == j)
        assert (s[members] == members.size).all()
        assert sorted(r[members].tolist()) == list(range(members.size))
        by_rank = members[np.argsort(r[members])]
        assert (np.diff(d[by_rank]) >= 0).all()                     # rank 0 = easiest


def test_rank_within_clusters_matches_reference_loop():
    rng = np.random.default_rng(3)
    for _ in range(20):
        n = int(rng.integers(1, 40))
        c = rng.integers(0, 5, n)
        d = rng.integers(0, 4, n).astype(float)                    # many ties
        d[rng.random(n) < 0.2] = np.nan
        rank, size = rank_within_clusters(c, d)
        ref_rank, ref_size = np.empty(n, int), np.empty(n, int)
        for j in set(c.tolist()):
            members = [i for i in range(n) if c[i] == j]
            members.sort(key=lambda i: (np.inf if np.isnan(d[i]) else d[i], i))
            for pos, i in enumerate(members):
                ref_rank[i], ref_size[i] = pos, len(members)
        assert rank.tolist() == ref_rank.tolist() and size.tolist() == ref_size.tolist()
    rank, _ = rank_within_clusters(np.array([0, 0, 0]))           # no difficulty: row order
    assert rank.tolist() == [0, 1, 2]


def test_clusters_separate_the_topics(rows, out_table):
    from sklearn.metrics import adjusted_rand_score
    assert adjusted_rand_score([t for t, _, _ in rows], out_table.column("cluster_id").to_pylist()) == 1.0


def test_nll_equals_hand_computed_teacher_forced_loss(rows, tiny_lm, out_table):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tiny_lm)
    model = AutoModelForCausalLM.from_pretrained(tiny_lm).eval()
    i = 1                                                          # a cooking row: long answer
    _, q, a = rows[i]
    prompt = f"Question:\n{q}\n\nAnswer:\n"
    full = tok(prompt + a, add_special_tokens=False)["input_ids"]
    p = len(tok(prompt, add_special_tokens=False)["input_ids"])
    with torch.no_grad():
        logits = model(torch.tensor([full])).logits[0]             # [L, V], one unpadded sequence
    logp = torch.log_softmax(logits.double(), dim=-1)
    expected = -np.mean([logp[t - 1, full[t]].item() for t in range(p, len(full))])
    assert len(full) - p >= 5
    got = out_table.column("difficulty").to_pylist()[i]            # batched, padded, logits_to_keep
    assert got == pytest.approx(expected, abs=1e-5)
    # batch size and neighbours do not change a row's score
    qs, ans = [r[1] for r in rows[:9]], [r[2] for r in rows[:9]]
    one = answer_nll(qs, ans, tiny_lm, batch_size=1, progress=False)
    many = answer_nll(qs, ans, tiny_lm, batch_size=4, progress=False)
    np.testing.assert_allclose(one, many, atol=1e-5)
    assert one[1] == pytest.approx(expected, abs=1e-5)


def test_deterministic_under_seed(tmp_path, data_parquet, tiny_lm, prepared, out_table):
    again = prepare(data_parquet, tmp_path / "again.parquet", nll_model=tiny_lm, **PREP)
    assert pq.read_table(again.output).equals(out_table)
    np.testing.assert_array_equal(np.load(again.embeddings_path), np.load(prepared.embeddings_path))


def test_pool_from_parquet_reads_annotations(prepared, out_table):
    pool = Pool.from_parquet(prepared.output)
    assert pool.cluster_names == (0, 1, 2, 3)
    assert pool.clusters.tolist() == out_table.column("cluster_id").to_pylist()
    assert pool.ranks.tolist() == out_table.column("rank_in_cluster").to_pylist()
    np.testing.assert_array_equal(pool.difficulty, out_table.column("difficulty").to_pylist())
    assert pool.ids.tolist() == list(range(1000, 1060))
    assert pool.domain_names == ("arithmetic", "astronomy", "cooking", "football")
    # only extra_info (what survives verl's dataset) is enough too
    nested = out_table.drop_columns(list(ANNOT)).to_pylist()
    pool2 = Pool.from_records(nested)
    assert pool2.clusters.tolist() == pool.clusters.tolist() and pool2.ranks.tolist() == pool.ranks.tolist()


def test_summary_json_and_plot(prepared, out_table):
    s = json.loads(prepared.summary_path.read_text())
    c = np.array(out_table.column("cluster_id").to_pylist())
    d = np.array(out_table.column("difficulty").to_pylist())
    assert s["n_rows"] == 60 and s["n_clusters"] == 4 and s["k"] == 4 and s["pca_dim"] == 16
    assert s["cluster_sizes"] == np.bincount(c).tolist() == [15, 15, 15, 15]
    edges = s["difficulty"]["bin_edges"]
    assert edges[0] == pytest.approx(d.min()) and edges[-1] == pytest.approx(d.max())
    for j, pc in enumerate(s["difficulty"]["per_cluster"]):
        assert sum(pc["hist"]) == pc["size"] == 15
        assert pc["median"] == pytest.approx(float(np.median(d[c == j])))
    assert s["missing"]["question"]["count"] == 0 and s["missing"]["answer"]["count"] == 0
    assert s["index_created"] is False
    assert prepared.plot_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    meta = json.loads(prepared.embeddings_path.with_suffix(".json").read_text())
    assert meta["dim"] == 384 and meta["n"] == 60 and meta["text_mode"] == "question"


# ---- missing data, ids, bad input -------------------------------------------------------

def test_missing_answers_and_questions_are_reported_and_kept(tmp_path, rows, tiny_lm):
    recs = verl_records(rows[:20])
    recs[3]["reward_model"]["ground_truth"] = None
    recs[7]["reward_model"]["ground_truth"] = "   "
    recs[5]["prompt"] = [{"role": "user", "content": ""}]
    path = tmp_path / "gaps.parquet"
    pq.write_table(pa.Table.from_pylist(recs), path)
    with pytest.warns(UserWarning, match=r"2 rows have no answer \(first rows \[3, 7\], ids \[1003, 1007\]\)"):
        res = prepare(path, tmp_path / "gaps.out.parquet", nll_model=tiny_lm, k=2, pca_dim=None,
                      progress=False, plot=False)
    t = res.table
    assert t.num_rows == 20
    d = np.array(t.column("difficulty").to_pylist())
    finite_max = np.delete(d, [3, 7]).max()
    assert d[3] == d[7] == pytest.approx(finite_max + 1.0)         # ADS: inf → max_finite + 1
    c, r, s = (np.array(t.column(x).to_pylist()) for x in ("cluster_id", "rank_in_cluster", "cluster_size"))
    for i in (3, 7):                                               # hardest of their cluster (ties by row)
        later = sum(1 for j in (3, 7) if j > i and c[j] == c[i])
        assert r[i] == s[i] - 1 - later
    assert res.summary["missing"]["answer"] == {"count": 2, "rows": [3, 7], "ids": [1003, 1007]}
    assert res.summary["missing"]["question"]["count"] == 1
    assert res.summary["difficulty_infinite"] == {"count": 2, "filled_with": pytest.approx(finite_max + 1)}
    with pytest.raises(ValueError, match="2 rows have no answer"):
        prepare(path, tmp_path / "x.parquet", nll_model=tiny_lm, k=2, on_missing="error", progress=False)


def test_fill_infinite_hand_values():
    assert fill_infinite(np.array([0.5, np.inf, 2.0]))[0].tolist() == [0.5, 3.0, 2.0]
    d, fill = fill_infinite(np.array([np.inf, np.inf]))
    assert d.tolist() == [1.0, 1.0] and fill == 1.0
    assert fill_infinite(np.array([1.0]))[1] is None


def test_missing_index_is_created_with_warning_and_duplicates_rejected(tmp_path, rows, prepared):
    recs = verl_records(rows)
    for r in recs:
        del r["extra_info"]
    path = tmp_path / "noindex.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in recs))
    with pytest.warns(UserWarning, match="no extra_info.index; creating ids 0..59"):
        res = prepare(path, tmp_path / "noindex.out.jsonl", reuse_embeddings=prepared.embeddings_path,
                      **PREP)
    pool = Pool.from_jsonl(res.output)
    assert pool.ids.tolist() == list(range(60)) and res.summary["index_created"] is True

    recs = verl_records(rows[:10])
    recs[4]["extra_info"]["index"] = recs[2]["extra_info"]["index"]
    dup = tmp_path / "dup.parquet"
    pq.write_table(pa.Table.from_pylist(recs), dup)
    with pytest.raises(ValueError, match=r"extra_info.index has 1 duplicate ids \(first: \[1002\]\)"):
        prepare(dup, tmp_path / "dup.out.parquet", k=2, progress=False)


@pytest.fixture
def no_work(monkeypatch):
    """Fail the test if embedding or scoring starts."""
    def boom(*a, **k):
        raise AssertionError("work started before the input was checked")
    monkeypatch.setattr(_pipeline, "embed_texts", boom)
    monkeypatch.setattr(_pipeline, "answer_nll", boom)


@pytest.mark.parametrize("kwargs, match", [
    ({"question_key": "question"}, r"question column 'question' is not in the input .*--question-key"),
    ({"answer_key": "extra_info.answer", "nll_model": "LM"},
     r"reference answer column 'extra_info.answer' .* has fields \['index', 'split'\]"),
    ({"nll_model": "MINILM"}, r"is not a causal LM \(config: \['BertModel'\]\)"),
    ({"nll_model": "/nonexistent/model"}, "is not a directory"),
    ({"embed_model": "EMPTYDIR"}, "is not a sentence-transformers model or a causal LM"),
    ({"k": 61}, r"k must be an integer in \[1, N=60\]"),
    ({"k": "auto", "k_candidates": [80]}, r"k='auto' needs candidates in \[2, N-1=59\]"),
    ({"cluster_method": "dbscan"}, "cluster method must be one of"),
    ({"text_mode": "cot"}, "text_mode must be"),
    ({"reuse_embeddings": "MISSING.npy"}, "is not a file"),
])
def test_bad_input_fails_before_any_work(tmp_path, data_parquet, tiny_lm, no_work, kwargs, match):
    subst = {"LM": str(tiny_lm), "MINILM": str(default_embed_model_path()),
             "EMPTYDIR": str(tmp_path), "MISSING.npy": str(tmp_path / "missing.npy")}
    kwargs = {k: subst.get(v, v) if isinstance(v, str) else v for k, v in kwargs.items()}
    out = tmp_path / "o.parquet"
    with pytest.raises(ValueError, match=match):
        prepare(data_parquet, out, **{"k": 4, "progress": False, **kwargs})
    assert not out.exists() and not (tmp_path / "o.embeddings.npy").exists()


def test_empty_input_and_unknown_format_fail(tmp_path, no_work):
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text('{"prompt": "a", "extra_info": {"index": 1}}\n{"prompt": "b", "extra_info": {"index": "x"}}\n')
    with pytest.raises(ValueError, match="rows disagree on a field's type"):
        prepare(mixed, tmp_path / "o.parquet", progress=False)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match="has no rows"):
        prepare(empty, tmp_path / "o.parquet", progress=False)
    bad = tmp_path / "data.csv"
    bad.write_text("a,b\n")
    with pytest.raises(ValueError, match="unknown format '.csv'"):
        prepare(bad, tmp_path / "o.parquet", progress=False)


# ---- formats, reuse, pieces -------------------------------------------------------------

def test_jsonl_and_hf_dataset_inputs_read_like_parquet(tmp_path, rows, data_parquet, prepared, out_table):
    import datasets
    recs = verl_records(rows)
    jl = tmp_path / "train.jsonl"
    jl.write_text("\n".join(json.dumps(r) for r in recs))
    hf = tmp_path / "train_hf"
    datasets.Dataset.from_list(recs).save_to_disk(str(hf))
    ref = pq.read_table(data_parquet)
    for src in (jl, hf):
        t = read_table(src)
        assert t.to_pylist() == ref.to_pylist()
    res = prepare(hf, tmp_path / "from_hf", reuse_embeddings=prepared.embeddings_path, **PREP)
    back = datasets.load_from_disk(str(tmp_path / "from_hf"))
    assert back["cluster_id"] == out_table.column("cluster_id").to_pylist()
    assert res.embeddings_path == tmp_path / "from_hf.embeddings.npy"


def test_reuse_embeddings_reclusters_without_embedding(tmp_path, data_parquet, prepared, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("re-embedded")
    monkeypatch.setattr(_pipeline, "embed_texts", boom)
    res = prepare(data_parquet, tmp_path / "k2.parquet", reuse_embeddings=prepared.embeddings_path,
                  k=2, pca_dim=16, seed=7, progress=False, plot=False)
    assert res.summary["n_clusters"] == 2 and sum(res.summary["cluster_sizes"]) == 60
    expected = cluster_embeddings(np.load(prepared.embeddings_path), 2, pca_dim=16, seed=7).labels
    assert res.table.column("cluster_id").to_pylist() == expected.tolist()
    # embeddings of other texts are refused
    with pytest.raises(ValueError, match="computed from different texts"):
        prepare(data_parquet, tmp_path / "qa.parquet", reuse_embeddings=prepared.embeddings_path,
                text_mode="question_plus_cot", k=2, progress=False)


def test_causal_lm_embeddings_are_masked_mean_of_last_hidden_state(tiny_lm):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tiny_lm)
    model = AutoModelForCausalLM.from_pretrained(tiny_lm).eval()
    texts = ["What is 12 plus 30?", "Bake the bread for about forty minutes until golden brown.", "Mars"]
    got = embed_texts(texts, tiny_lm, batch_size=3, progress=False)   # padded batch
    for i, t in enumerate(texts):
        ids = torch.tensor([tok(t)["input_ids"]])
        with torch.no_grad():
            h = model(ids, output_hidden_states=True).hidden_states[-1][0]   # [L, H], no padding
        np.testing.assert_allclose(got[i], h.mean(0).numpy(), atol=1e-5)


def test_prepare_with_the_policy_as_embedder_ads_way(tmp_path, data_parquet, tiny_lm):
    res = prepare(data_parquet, tmp_path / "ads.parquet", embed_model=tiny_lm, nll_model=tiny_lm,
                  text_mode="question_plus_cot", **{**PREP, "plot": False})
    emb = np.load(res.embeddings_path)
    rows = pq.read_table(data_parquet).to_pylist()
    texts = [f"Question:\n{r['prompt'][1]['content']}\n\nAnswer:\n{r['reward_model']['ground_truth']}"
             for r in rows]
    np.testing.assert_allclose(emb[:3], embed_texts(texts[:3], tiny_lm, progress=False), atol=1e-5)
    assert emb.shape == (60, 32) and res.summary["config"]["embed"]["kind"] == "causal-lm"
    assert sum(res.summary["cluster_sizes"]) == 60


def test_suggest_k_and_backends_on_topics(rows, prepared):
    from sklearn.metrics import adjusted_rand_score
    emb = np.load(prepared.embeddings_path)
    best, scores = suggest_k(emb, [2, 3, 4, 6, 8], pca_dim=16, seed=7, progress=False)
    assert best == 4 and max(scores, key=scores.get) == 4
    topics = [t for t, _, _ in rows]
    for method in ("kmeans", "minibatch", "faiss"):
        labels = cluster_embeddings(emb, 4, pca_dim=16, method=method, seed=7).labels
        assert adjusted_rand_score(topics, labels) == 1.0
        first = [int(np.flatnonzero(labels == j)[0]) for j in range(4)]
        assert first == sorted(first)                              # ids by first appearance
        again = cluster_embeddings(emb, 4, pca_dim=16, method=method, seed=7).labels
        assert again.tolist() == labels.tolist()


def test_prepare_k_auto_picks_by_silhouette(tmp_path, data_parquet, prepared, out_table):
    res = prepare(data_parquet, tmp_path / "auto.parquet", reuse_embeddings=prepared.embeddings_path,
                  **{**PREP, "k": "auto", "plot": False}, k_candidates=[2, 3, 4, 6])
    kr = res.summary["k_suggestion"]
    assert kr["chosen"] == 4 == res.summary["k"] and kr["candidates"] == [2, 3, 4, 6]
    assert max(kr["silhouette"], key=kr["silhouette"].get) == "4"
    assert res.table.column("cluster_id").to_pylist() == out_table.column("cluster_id").to_pylist()


def test_question_and_answer_extraction():
    t = pa.Table.from_pylist([
        {"prompt": [{"role": "system", "content": "sys"}, {"role": "user", "content": " a "},
                    {"role": "user", "content": "b"}], "q": "plain", "sol": [{"role": "assistant", "content": " s "}],
         "extra_info": {"answer": 7}},
        {"prompt": [{"role": "system", "content": "only system"}], "q": None, "sol": None,
         "extra_info": {"answer": None}},
    ])
    assert question_texts(t) == ["a\n\nb", "only system"]          # user turns; else all roles (ADS)
    assert question_texts(t, "q") == ["plain", ""]
    assert answer_texts(t, "sol") == ["s", ""]
    assert answer_texts(t, "extra_info.answer") == ["7", ""]


def test_cli_matches_library(tmp_path, data_parquet, tiny_lm, prepared, out_table, capsys):
    out = tmp_path / "cli.parquet"
    rc = cli_main(["prepare", str(data_parquet), "--out", str(out), "--k", "4", "--pca-dim", "16",
                   "--seed", "7", "--nll-model", str(tiny_lm), "--nll-batch-size", "3",
                   "--reuse-embeddings", str(prepared.embeddings_path), "--no-progress", "--no-plot"])
    assert rc == 0
    t = pq.read_table(out)
    for name in ("cluster_id", "rank_in_cluster", "cluster_size"):
        assert t.column(name).to_pylist() == out_table.column(name).to_pylist()
    np.testing.assert_allclose(t.column("difficulty").to_pylist(), out_table.column("difficulty").to_pylist(),
                               atol=1e-5)
    assert "60 rows, 4 clusters" in capsys.readouterr().out
    assert not (tmp_path / "cli.summary.png").exists()


@pytest.mark.slow
def test_verl_adapter_reads_prepared_output(prepared, out_table):
    """verl's dataset hands rlpace its rows as a HF Dataset (`pool_from_dataframe`).
    Slow only because importing verl takes 10–40 s on this machine."""
    pytest.importorskip("verl")
    import datasets
    from rlpace.adapters.verl import pool_from_dataframe
    pool = pool_from_dataframe(datasets.Dataset(pq.read_table(prepared.output)))
    assert pool.clusters.tolist() == out_table.column("cluster_id").to_pylist()
    assert pool.ranks.tolist() == out_table.column("rank_in_cluster").to_pylist()
    np.testing.assert_array_equal(pool.difficulty, out_table.column("difficulty").to_pylist())
    assert pool.ids.tolist() == list(range(1000, 1060))


# ---- default k scales with N; CLI errors are one line ------------------------------------------

def test_default_k_rule_by_hand():
    from rlpace.prepare import default_k
    # round(sqrt(N/2)) clamped to [2, 64] and to N: sqrt(100) = 10, sqrt(1000) = 31.6, sqrt(4032) = 63.498
    assert [default_k(n) for n in (1, 2, 7, 60, 200, 2000, 8064, 8065, 100_000)] == \
        [1, 2, 2, 5, 10, 32, 63, 64, 64]


def test_prepare_without_k_uses_the_rule(tmp_path, data_parquet, prepared, capsys):
    # 60 rows: round(sqrt(30)) = round(5.48) = 5 clusters (a fixed 64 would exceed N and fail)
    out = tmp_path / "auto.parquet"
    rc = cli_main(["prepare", str(data_parquet), "--out", str(out), "--pca-dim", "16", "--seed", "7",
                   "--reuse-embeddings", str(prepared.embeddings_path), "--no-progress", "--no-plot"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "60 rows, 5 clusters" in printed and "clamp(round(sqrt(N/2)), 2, 64) with N = 60" in printed
    s = json.loads((tmp_path / "auto.summary.json").read_text())
    assert s["k"] == 5 and s["n_clusters"] == 5 and s["k_rule"].startswith("default")
    assert len(set(pq.read_table(out).column("cluster_id").to_pylist())) == 5


@pytest.mark.parametrize("make, argv, needle", [
    (None, ["--k", "abc"], "argument --k: --k takes an integer ≥ 1 or 'auto'; got 'abc'"),
    (None, ["--k", "0"], "--k takes an integer ≥ 1"),
    (None, ["--k", "61"], "k must be an integer in [1, N=60]"),
    ("missing", [], "does not exist"),
    ("badline", [], "line 2 is not valid JSON"),
])
def test_prepare_cli_user_errors_are_one_line(tmp_path, data_parquet, capsys, make, argv, needle):
    src = str(data_parquet)
    if make == "missing":
        src = str(tmp_path / "nope.jsonl")
    elif make == "badline":
        src = str(tmp_path / "bad.jsonl")
        (tmp_path / "bad.jsonl").write_text('{"prompt": "a", "data_source": "x"}\n{"prompt": \n')
    rc = cli_main(["prepare", src, "--out", str(tmp_path / "o.parquet"), "--no-progress", *argv])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and needle in err and err.startswith("rlpace prepare: error: ")
    assert "\n" not in err and "Traceback" not in err
    assert not (tmp_path / "o.parquet").exists()
