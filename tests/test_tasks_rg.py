"""The reasoning-gym bridge: DUMP's Knights-and-Knaves setup, any dataset by name and
config, its own score_answer, errors before work, and the parquet round trip."""

import json

import pytest

pytest.importorskip("reasoning_gym")

from rlpace.tasks import (knights_knaves_specs, knights_knaves_suite, make_taskset, read_taskset, reasoning_gym_suite,  # noqa: E402
                          rg_score, rg_spec, write_taskset)


def test_knights_knaves_dump_setup():
    specs = knights_knaves_specs()
    assert [s.label for s in specs] == [f"kk{n:02d}" for n in range(3, 15)]
    assert [s.config for s in specs] == [{"n_people": n} for n in range(3, 15)]
    # generation is ~1–2 s per 14-person puzzle, so the test builds the small sizes only
    ts = knights_knaves_suite(people=(3, 4, 6), train_per_domain=3, heldout_per_domain=2)
    assert ts.domains == ("kk03", "kk04", "kk06")
    pool = ts.pool()
    assert sorted(set(pool.difficulty.tolist())) == [3.0, 4.0, 6.0]
    it = next(i for i in ts.train if i.domain == "kk06")
    assert len(json.loads(it.entry)["metadata"]["names"]) == 6
    # the gold answer scores 1 (bare and tagged), a wrong one 0, malformed 0
    assert rg_score(it.answer, it) == 1.0
    assert rg_score(f"thinking... <answer>{it.answer}</answer>", it) == 1.0
    meta = json.loads(it.entry)["metadata"]
    terms, first = meta["knight_knave_terms"], meta["names"][0]
    good, bad = (terms["a_knight"], terms["a_knave"]) if meta["solution"][0] else (terms["a_knave"], terms["a_knight"])
    flipped = it.answer.replace(f"{first} is {good}", f"{first} is {bad}", 1)
    assert flipped != it.answer and rg_score(flipped, it) < 1.0
    assert rg_score("", it) == 0.0 and rg_score(None, it) == 0.0
    # held-out questions never repeat training ones
    tr = {i.prompt for i in ts.train}
    assert not any(h.prompt in tr for h in ts.heldout)


def test_any_dataset_by_name_and_config_via_spec():
    ts = make_taskset("rg:basic_arithmetic:max_terms=2;max_digits=1;label=arith|rg:chain_sum",
                      train_per_domain=4, heldout_per_domain=2)
    assert ts.domains == ("arith", "chain_sum")
    for it in ts.train:
        assert ts.score([it], [it.answer]).tolist() == [1.0]
        assert ts.score([it], ["<answer>999999</answer>"]).tolist() == [0.0]


def test_unknown_dataset_or_config_field_fails_before_generation():
    with pytest.raises(ValueError, match="unknown reasoning-gym dataset 'knights_and_knaves'"):
        rg_spec("knights_and_knaves")
    with pytest.raises(ValueError, match=r"no config field\(s\) \['people'\]"):
        make_taskset("rg:knights_knaves:people=3")
    with pytest.raises(ValueError, match="key=value"):
        make_taskset("rg:knights_knaves:n_people")


def test_rg_parquet_round_trip_keeps_grading(tmp_path):
    ts = reasoning_gym_suite([rg_spec("knights_knaves", "kk03", 3, n_people=3)], 3, 2, seed=5)
    back = read_taskset(*write_taskset(ts, tmp_path))
    assert back.train == ts.train and back.heldout == ts.heldout
    assert back.score(list(back.train), [it.answer for it in back.train]).tolist() == [1.0] * 3
