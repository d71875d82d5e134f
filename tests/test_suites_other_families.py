"""The two suites built from the families other than reversal and sorting, `families_parallel`
(eight families side by side) and `small_domains` (seven small prompt spaces beside three large
ones): their compositions, the domain sizes the prompt spaces allow, their warm-up shares (their
items against independent solvers, held-out and training items disjoint and determinism in the
seed: tests/test_suites_headroom.py, with the other suites), and the name accepted wherever a
trainer suite is (`rlpace train`, `rlpace compare`, `benchmarks/headroom.py`), a misspelt one
rejected with the choices."""

import sys
from pathlib import Path

import pytest

from rlpace.errors import InputError
from rlpace.experiments import suite_backend
from rlpace.tasks import SUITES, make_taskset, parse_mistakes
from rlpace.tasks._embedded import (FAMILIES_PARALLEL_MISTAKES, FAMILIES_PARALLEL_SUITE, SMALL_DOMAINS_MISTAKES,
                                    SMALL_DOMAINS_SUITE)
from rlpace.train import TrainConfig
from rlpace.train.recipes.grpo import check_config

def test_compositions_and_warmup_shares():
    assert FAMILIES_PARALLEL_SUITE.split(",") == ["add2", "mul2", "sumd3", "cnt6", "idx6", "next6", "max6", "last6"]
    assert SMALL_DOMAINS_SUITE.split(",") == ["add1", "mul1", "max2", "sumd2", "last2", "cnt1", "idx2",
                                              "add3", "max6", "last6"]
    assert SUITES["families_parallel"] == (FAMILIES_PARALLEL_SUITE, FAMILIES_PARALLEL_MISTAKES)
    assert SUITES["small_domains"] == (SMALL_DOMAINS_SUITE, SMALL_DOMAINS_MISTAKES)
    # neither uses the reversal or sorting families of the other headroom suites
    fams = {d.rstrip("0123456789") for s in ("families_parallel", "small_domains") for d in SUITES[s][0].split(",")}
    assert fams == {"add", "mul", "sumd", "cnt", "idx", "next", "max", "last"}
    # one warm-up mistake share for every domain: the domains differ by their family only
    assert parse_mistakes("default", "families_parallel") == {d: 0.75 for d in FAMILIES_PARALLEL_SUITE.split(",")}
    assert parse_mistakes("default", " small_domains ") == {d: 0.75 for d in SMALL_DOMAINS_SUITE.split(",")}


def test_domain_sizes_at_the_headroom_settings():
    """At the tables' settings (256 training, 64 held-out per domain) a small domain keeps its
    prompt space minus the 64 held-out items: add1, max2, sumd2, last2 10·10 = 100, cnt1 10
    letters × 10 asked = 100, mul1 10 digits × 8 factors (2…9) = 80, idx2 10·9 ordered pairs × 2
    positions = 180; the large domains keep 256."""
    ts = make_taskset("small_domains", train_per_domain=256, heldout_per_domain=64, seed=0)
    count = {d: sum(it.domain == d for it in ts.train) for d in ts.domains}
    assert count == {"add1": 36, "mul1": 16, "max2": 36, "sumd2": 36, "last2": 36, "cnt1": 36, "idx2": 116,
                     "add3": 256, "max6": 256, "last6": 256}
    assert all(sum(it.domain == d for it in ts.heldout) == 64 for d in ts.domains)
    prompts = {it.prompt for it in ts.train} | {it.prompt for it in ts.heldout}
    assert len(prompts) == 5 * 36 + 16 + 116 + 3 * 256 + 10 * 64          # no prompt in two domains
    fp = make_taskset("families_parallel", train_per_domain=256, heldout_per_domain=64, seed=0)
    assert len(fp.train) == 8 * 256 and len(fp.heldout) == 8 * 64       # mul2: 90 · 8 = 720 ≥ 320


@pytest.mark.parametrize("name", ["families_parallel", "small_domains"])
def test_the_name_is_accepted_wherever_a_trainer_suite_is(name):
    check_config(TrainConfig(tasks=name, steps=2))                              # rlpace train tasks=<name>
    assert suite_backend(name) == "embedded"                                    # rlpace compare --suite <name>
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import headroom
    assert headroom.trainer_available(name) == ""                               # headroom.py --suites <name>
    # after a suite with commas it starts a suite of its own
    assert headroom.split_suites(f"embedded:add1,rev3,{name},ladder") == ["embedded:add1,rev3", name, "ladder"]


@pytest.mark.parametrize("bad", ["families-parallel", "small_domain"])
def test_a_misspelt_suite_names_the_choices(bad):
    with pytest.raises(InputError, match=r"unknown task set .*: a suite \(embedded, ladder, mostly_solved, "
                                         r"mostly_solved_last, sort_ladder, families_parallel, small_domains\)"):
        make_taskset(bad)
    with pytest.raises(InputError, match=r"unknown suite .*families_parallel.*small_domains"):
        suite_backend(bad)
