"""Task suites and verifiers: embedded families checked against independent computations,
exact and math-verify scoring on right / wrong / malformed answers, the verl parquet
round trip, and task-spec errors."""

import json
import threading

import numpy as np
import pytest

from rlpace import Pool
from rlpace.tasks import (DEFAULT_SUITE, FAMILIES, Item, embedded_suite, exact_score, make_taskset,
                          math_score, read_taskset, sample_items, write_taskset)


def _solve(prompt: str) -> str:
    """An independent solver for every embedded family (parses the prompt text)."""
    body = prompt[:-1]
    if "+" in body and ":" not in body:
        a, b = body.split("+")
        return str(int(a) + int(b))
    tag, rest = body.split(":", 1)
    if tag == "r":
        return rest[::-1]
    if tag == "s":
        return "".join(sorted(rest))
    if tag == "x":
        return str(max(int(c) for c in rest))
    if tag == "d":
        return str(sum(int(c) for c in rest))
    if tag == "l":
        return rest[-1]
    if tag == "m":
        a, b = rest.split("*")
        return str(int(a) * int(b))
    x, s = rest.split(":")
    if tag == "c":
        return str(s.count(x))
    if tag == "i":
        return str(s.index(x) + 1)
    if tag == "n":
        return s[s.index(x) + 1]
    raise AssertionError(prompt)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_answers_correctly(family):
    sizes = FAMILIES[family][1]
    for size in (sizes.start, sizes.stop - 1):
        for p, a in sample_items(f"{family}{size}", 40, seed=3, purpose="t"):
            assert a == _solve(p), (p, a)


def test_mistakes_differ_from_answers_for_the_default_families():
    for name in ("max3", "sumd3", "last5"):
        triples = sample_items(name, 200, seed=0, purpose="t", with_mistakes=True)
        wrong = [m != a for _, a, m in triples]
        assert np.mean(wrong) > 0.5                    # mostly a real alternative
        for p, a, m in triples:
            if name.startswith("max"):
                assert m == str(min(int(c) for c in p[2:-1]))
            if name.startswith("sumd"):
                assert m == str(int(a) % 10)
            if name.startswith("last"):
                assert m == p[2]


def test_parse_mistakes():
    from rlpace.tasks import DEFAULT_MISTAKES, parse_mistakes
    assert parse_mistakes("default") == DEFAULT_MISTAKES and parse_mistakes("none") == {}
    assert parse_mistakes(" max3=0.5 , last4=1 ") == {"max3": 0.5, "last4": 1.0}
    for bad, msg in (("max3=2", "rate in"), ("max3", "name=rate"), ("foo3=0.1", "unknown embedded")):
        with pytest.raises(ValueError, match=msg):
            parse_mistakes(bad)
    assert set(DEFAULT_MISTAKES) <= set(DEFAULT_SUITE.split(","))


def test_embedded_suite_split_pool_and_determinism():
    ts = embedded_suite(train_per_domain=50, heldout_per_domain=20, seed=1)
    assert len(ts.domains) == 12 and ts.domains == tuple(sorted(DEFAULT_SUITE.split(",")))
    for d in ts.domains:
        tr = {it.prompt for it in ts.train if it.domain == d}
        he = {it.prompt for it in ts.heldout if it.domain == d}
        assert len(he) == 20 and len(tr) == 50 and not (tr & he)
    pool = ts.pool()
    assert len(pool) == len(ts.train) and pool.domain_names == ts.domains
    # difficulty = the size: max2 → 2, last9 → 9
    assert pool.difficulty[[i for i, it in enumerate(ts.train) if it.domain == "last9"]].tolist() == [9.0] * 50
    again = embedded_suite(train_per_domain=50, heldout_per_domain=20, seed=1)
    assert again.train == ts.train and again.heldout == ts.heldout
    assert embedded_suite(train_per_domain=50, heldout_per_domain=20, seed=2).train != ts.train


def test_small_spaces_give_fewer_items():
    ts = embedded_suite("add1", train_per_domain=500, heldout_per_domain=30)
    assert len(ts.heldout) == 30 and len(ts.train) == 70        # add1 has 10 × 10 prompts


def test_exact_score_right_wrong_malformed():
    it = Item("x:3142=", "4", "max4", 4.0, 0)
    assert exact_score("4", it) == 1.0
    assert exact_score(" 4 \n", it) == 1.0
    assert exact_score("<answer>4</answer>", it) == 1.0
    assert exact_score("I think <answer>3</answer> or <answer>4</answer>", it) == 1.0   # the last tag
    for bad in ("1", "44", "", "4!", "<answer>1</answer>", None, 4):
        assert exact_score(bad, it) == 0.0


def test_math_score_right_wrong_malformed_and_threads():
    it = Item("3/4 as a decimal?", "0.75", "frac", 1.0, 0, ability="math")
    assert math_score("so \\boxed{\\frac{3}{4}}", it) == 1.0
    assert math_score("The answer is $0.75$", it) == 1.0
    assert math_score("<answer>3/4</answer>", it) == 1.0
    for bad in ("\\boxed{0.7}", "", "\\boxed{", "no number here", None):
        assert math_score(bad, it) == 0.0
    # off the main thread math-verify's signal.alarm would raise; we run without a timeout
    got = []
    th = threading.Thread(target=lambda: got.append(math_score("\\boxed{3/4}", it)))
    th.start()
    th.join()
    assert got == [1.0]


def test_taskset_score_vector_and_length_check():
    ts = embedded_suite("max2,last3", train_per_domain=4, heldout_per_domain=2)
    items = list(ts.train[:3])
    comps = [items[0].answer, "zz", items[2].answer + "x"]
    assert ts.score(items, comps).tolist() == [1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="one completion per item"):
        ts.score(items, comps[:2])


def test_parquet_round_trip(tmp_path):
    ts = embedded_suite("max3,sumd2", train_per_domain=10, heldout_per_domain=5)
    train_p, test_p = write_taskset(ts, tmp_path)
    back = read_taskset(train_p, test_p)
    assert back.train == ts.train and back.heldout == ts.heldout
    # the verl schema, column by column
    import pyarrow.parquet as pq
    row = pq.read_table(train_p).to_pylist()[0]
    it = ts.train[0]
    assert row["data_source"] == it.domain
    assert row["prompt"] == [{"role": "user", "content": it.prompt}]
    assert row["ability"] == "exact"
    assert row["reward_model"]["ground_truth"] == it.answer
    assert row["extra_info"]["index"] == it.index
    # rlpace's own Pool reader sees the same pool
    assert Pool.from_parquet(train_p).fingerprint() == ts.pool().fingerprint()
    # a train .parquet spec picks up test.parquet beside it
    assert make_taskset(str(train_p)).heldout == ts.heldout


def test_task_spec_errors_before_work(tmp_path):
    with pytest.raises(ValueError, match="unknown task set"):
        make_taskset("gsm9k")
    with pytest.raises(ValueError, match="unknown embedded distribution 'foo2'"):
        make_taskset("embedded:max2,foo2")
    with pytest.raises(ValueError, match="size 42 is out of range"):
        make_taskset("embedded:max42")
    with pytest.raises(ValueError, match="repeat"):
        make_taskset("embedded:max2,max2")
    with pytest.raises(ValueError, match="no such parquet"):
        make_taskset(str(tmp_path / "nope.parquet"))


def test_spec_help_lists_every_named_suite_from_suites(monkeypatch):
    """The help text's suite names come from `SUITES`, in its order: a suite added there is
    listed without a second hand-kept list (a name without a note is listed bare)."""
    import rlpace.tasks._spec as spec
    from rlpace.tasks import SPEC_HELP, SUITES
    at = [SPEC_HELP.index(f"'{name}'") for name in SUITES]
    assert at == sorted(at)                                  # every name, in SUITES' order
    monkeypatch.setitem(SUITES, "new_suite", ("add1,rev2", {}))
    text = spec._suite_help()
    assert text.endswith(", 'new_suite'")
    assert text.startswith("'embedded' (the default 12-distribution suite), 'ladder' (")
