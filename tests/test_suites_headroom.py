"""The headroom suites, where an oracle saves rollouts: `ladder`, `mostly_solved` (and the earlier
`sort_ladder`) — their generators and
verifiers against independent computations, disjoint held-out items, determinism, the
mistake shares that set the base's starting point — and the trainer-side oracle
measurement: its rollouts reach the Scheduler as one Feedback over every prompt, are
logged apart and never counted in the budget."""

import numpy as np
import pytest

from rlpace.tasks import (DEFAULT_MISTAKES, LADDER_MISTAKES, LADDER_SUITE, MOSTLY_SOLVED_LAST_MISTAKES,
                          MOSTLY_SOLVED_LAST_ROLES, MOSTLY_SOLVED_LAST_SUITE, MOSTLY_SOLVED_MISTAKES,
                          MOSTLY_SOLVED_ROLES, MOSTLY_SOLVED_SUITE, SORT_LADDER_MISTAKES, SORT_LADDER_SUITE, SUITES,
                          make_taskset, parse_mistakes)


def _solve(prompt: str) -> str:
    """Independent solvers for the families the suites use (rev, sort, last, max, sumd, add,
    mul, cnt, idx, next)."""
    body = prompt[:-1]
    if "+" in body:                                   # schoolbook addition, digit by digit
        a, b = body.split("+")
        a, b = a.zfill(len(b)), b.zfill(len(a))
        out, carry = "", 0
        for x, y in zip(reversed(a), reversed(b)):
            s = int(x) + int(y) + carry
            out, carry = str(s % 10) + out, s // 10
        return ((str(carry) if carry else "") + out).lstrip("0") or "0"
    tag, rest = body.split(":", 1)
    if tag == "m":                                   # repeated addition
        a, b = rest.split("*")
        return str(sum(int(a) for _ in range(int(b))))
    if tag in ("c", "i", "n"):                       # count, 1-based index, next letter after x
        x, s = rest.split(":")
        return {"c": lambda: str(sum(1 for c in s if c == x)),
                "i": lambda: str([j for j, c in enumerate(s) if c == x][0] + 1),
                "n": lambda: s[s.index(x) + 1]}[tag]()
    if tag == "r":                                   # reversal by index
        return "".join(rest[len(rest) - 1 - i] for i in range(len(rest)))
    if tag == "s":                                   # counting sort
        return "".join(d * rest.count(d) for d in "0123456789")
    if tag == "l":
        return rest[len(rest) - 1]
    if tag == "x":
        return str(sorted(int(c) for c in rest)[-1])
    if tag == "d":
        total = 0
        for c in rest:
            total += ord(c) - ord("0")
        return str(total)
    raise AssertionError(prompt)


def test_suite_compositions_are_the_documented_ones():
    assert LADDER_SUITE.split(",") == [f"rev{n}" for n in range(2, 9)]
    assert SORT_LADDER_SUITE.split(",") == [f"sort{n}" for n in range(2, 9)]
    assert MOSTLY_SOLVED_SUITE.split(",") == ["rev3", "last3", "last4", "last5", "max3", "max4", "max5", "max6",
                                              "rev4", "rev5", "sumd5", "sumd6", "sumd7"]
    assert MOSTLY_SOLVED_LAST_SUITE.split(",") == ["last3", "last4", "last5", "max3", "max4", "max5", "max6",
                                                   "max7", "last7", "last9", "sumd5", "sumd6", "sumd7"]
    assert SUITES["mostly_solved_last"] == (MOSTLY_SOLVED_LAST_SUITE, MOSTLY_SOLVED_LAST_MISTAKES)
    assert SUITES["embedded"] == (SUITES["embedded"][0], DEFAULT_MISTAKES)
    # the ladder's warm-up mistake share rises strictly with the size, from the rung the
    # base solves (0.15) to one it never does (0.995)
    shares = [LADDER_MISTAKES[f"rev{n}"] for n in range(2, 9)]
    assert shares == [0.15, 0.4, 0.7, 0.9, 0.97, 0.99, 0.995]
    assert [SORT_LADDER_MISTAKES[f"sort{n}"] for n in range(2, 9)] == shares
    assert set(MOSTLY_SOLVED_MISTAKES) == set(MOSTLY_SOLVED_SUITE.split(","))
    assert [MOSTLY_SOLVED_MISTAKES[d] for d in ("rev3", "max6", "rev4", "rev5", "sumd5", "sumd7")] == \
        [0.05, 0.05, 0.5, 0.8, 1.0, 1.0]
    assert set(MOSTLY_SOLVED_LAST_MISTAKES) == set(MOSTLY_SOLVED_LAST_SUITE.split(","))
    assert [MOSTLY_SOLVED_LAST_MISTAKES[d] for d in ("last3", "max7", "last7", "last9", "sumd5", "sumd7")] == \
        [0.05, 0.05, 0.7, 0.9, 1.0, 1.0]


@pytest.mark.parametrize("name", ["ladder", "mostly_solved", "mostly_solved_last", "sort_ladder",
                                  "families_parallel", "small_domains"])
def test_named_suite_items_are_exact_disjoint_and_deterministic(name):
    ts = make_taskset(name, train_per_domain=40, heldout_per_domain=12, seed=1)
    names = SUITES[name][0].split(",")
    assert sorted(ts.domains) == sorted(names) and ts.name == "embedded:" + SUITES[name][0]
    for it in ts.train + ts.heldout:
        assert it.answer == _solve(it.prompt), it
        assert it.difficulty == float(it.domain.lstrip("abcdefghijklmnopqrstuvwxyz"))   # difficulty = the size
    for d in names:
        tr = [it.prompt for it in ts.train if it.domain == d]
        he = [it.prompt for it in ts.heldout if it.domain == d]
        assert len(he) == 12 and len(tr) == 40 and len(set(tr)) == 40 and not (set(tr) & set(he))
    assert [it.index for it in ts.train] == list(range(len(names) * 40))
    again = make_taskset(name, train_per_domain=40, heldout_per_domain=12, seed=1)
    assert again.train == ts.train and again.heldout == ts.heldout
    assert make_taskset(name, train_per_domain=40, heldout_per_domain=12, seed=2).train != ts.train


@pytest.mark.parametrize("name", ["ladder", "mostly_solved", "mostly_solved_last", "sort_ladder"])
def test_named_suite_verifier_right_wrong_malformed(name):
    ts = make_taskset(name, train_per_domain=5, heldout_per_domain=2, seed=0)
    items = list(ts.train)
    wrong = [str(int(it.answer) + 1) if it.answer.isdigit() else ("b" if it.answer != "b" else "c")
             for it in items]
    assert ts.score(items, [it.answer for it in items]).tolist() == [1.0] * len(items)
    assert ts.score(items, wrong).tolist() == [0.0] * len(items)
    assert ts.score(items, [it.answer + "x" for it in items]).tolist() == [0.0] * len(items)


def test_default_mistakes_follow_the_task_set():
    assert parse_mistakes("default") == DEFAULT_MISTAKES
    assert parse_mistakes("default", "embedded") == DEFAULT_MISTAKES
    assert parse_mistakes("default", "embedded:last3,last5") == DEFAULT_MISTAKES
    assert parse_mistakes("default", "ladder") == LADDER_MISTAKES
    assert parse_mistakes("default", " mostly_solved ") == MOSTLY_SOLVED_MISTAKES
    assert parse_mistakes("none", "ladder") == {} and parse_mistakes("last4=0.5", "ladder") == {"last4": 0.5}
    assert parse_mistakes("default", "sort_ladder") == SORT_LADDER_MISTAKES
    parse_mistakes("default", "ladder")["rev2"] = 0.9           # a copy: the table is not changed
    assert LADDER_MISTAKES["rev2"] == 0.15


@pytest.mark.parametrize("name,roles", [("mostly_solved", MOSTLY_SOLVED_ROLES),
                                        ("mostly_solved_last", MOSTLY_SOLVED_LAST_ROLES)])
def test_mostly_solved_shares_of_the_training_pool(name, roles):
    ts = make_taskset(name, train_per_domain=256, heldout_per_domain=64, seed=0)
    dom = np.array([it.domain for it in ts.train])
    share = {role: float(np.isin(dom, names).mean()) for role, names in roles.items()}
    # 8, 2 and 3 of 13 equal-sized distributions (every one has ≥ 1000 distinct prompts)
    assert len(ts.train) == 13 * 256
    assert share == pytest.approx({"solved": 8 / 13, "learnable": 2 / 13, "unlearnable": 3 / 13})
    assert share["solved"] >= 0.6 and share["unlearnable"] >= 0.2


def test_unlearnable_distributions_never_see_a_right_answer_in_the_warmup():
    pytest.importorskip("torch")
    from rlpace.train.model import warmup_corpus
    ts = make_taskset("mostly_solved", train_per_domain=8, heldout_per_domain=8, seed=0)
    items, _ = warmup_corpus(ts, 300, 1.0, 0, parse_mistakes("default", "mostly_solved"))
    for p, a in items:
        if p.startswith("d:"):
            total = sum(int(c) for c in p[2:-1])
            assert a == str(total % 10)                  # always the mistake (units digit only) ...
            assert (a == _solve(p)) == (total < 10)      # ... right only when the sum has one digit
    sumd = [(p, a) for p, a in items if p.startswith("d:")]
    assert len(sumd) == 900 and np.mean([a == _solve(p) for p, a in sumd]) < 0.01
    # a solved distribution keeps most answers right (share 0.05 replaced by a copy, itself
    # right when the string is a palindrome), the learnable ones fewer: expected shares
    # rev3 0.95 + 0.05·0.1 = 0.955, rev4 0.5 + 0.5·0.01 = 0.505, rev5 0.2 + 0.8·0.01 = 0.208
    right = {n: [a == _solve(p) for p, a in items if p.startswith("r:") and len(p) == n + 3] for n in (3, 4, 5)}
    assert [len(v) for v in right.values()] == [300, 300, 300]
    assert 0.91 < np.mean(right[3]) < 0.995
    assert 0.42 < np.mean(right[4]) < 0.59
    assert 0.14 < np.mean(right[5]) < 0.28


# ---- the trainer-side oracle measurement -----------------------------------------------------
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from _tiny_train import TINY, read_log  # noqa: E402
from rlpace.scheduler import Scheduler  # noqa: E402
from rlpace.train import TrainConfig, check_config, train  # noqa: E402

torch.set_num_threads(1)


_records = read_log


def _spy(monkeypatch):
    calls = []
    real = Scheduler.observe

    def observe(self, fb):
        calls.append((np.asarray(fb.prompt_ids).copy(), np.asarray(fb.rewards).shape, fb.step))
        return real(self, fb)
    monkeypatch.setattr(Scheduler, "observe", observe)
    return calls


def test_oracle_measurement_is_logged_apart_and_not_charged(tmp_path, cache, monkeypatch):
    calls = _spy(monkeypatch)
    # N = 32 prompts (16 per distribution), m = 3, every 2 steps; B·G = 16 per step; the
    # budget of 48 rollouts stops the run after 3 steps although the two measurements
    # (steps 0 and 2) spent 2 · 32 · 3 = 192 rollouts
    cfg = TrainConfig(**{**TINY, "cache_dir": cache, "out": str(tmp_path / "o"), "policy": "oracle_boundary",
                         "oracle_every": 2, "oracle_rollouts": 3, "max_rollouts": 48, "steps": 10})
    summary = train(cfg)
    recs = [r for r in _records(cfg.out) if not r.get("final")]
    assert [r["step"] for r in recs] == [0, 1, 2]
    assert [r["oracle_rollouts"] for r in recs] == [96, 0, 96]
    assert [r["rollouts"] for r in recs] == [16, 16, 16]
    assert [r["rollouts_total"] for r in recs] == [16, 32, 48]
    assert summary["rollouts_total"] == 48 and summary["oracle_rollouts_total"] == 192
    # the measurement is ONE Feedback over every training prompt, m rollouts each, before the
    # step's own B prompts; the oracle has then measured every prompt
    measured = [c for c in calls if c[1] == (32, 3)]
    assert [c[2] for c in measured] == [0, 2]
    assert all(c[0].tolist() == list(range(32)) for c in measured)
    assert calls[0][1] == (32, 3) and calls[1][1] == (4, 4)
    assert len(calls) == 3 + 2
    assert recs[0]["sched/oracle/measured_fraction"] == 1.0


def test_no_measurement_without_an_oracle_policy(tmp_path, cache, monkeypatch):
    calls = _spy(monkeypatch)
    cfg = TrainConfig(**{**TINY, "cache_dir": cache, "out": str(tmp_path / "u"), "steps": 3,
                         "oracle_every": 1, "oracle_rollouts": 3})
    summary = train(cfg)
    recs = [r for r in _records(cfg.out) if not r.get("final")]
    assert [r["oracle_rollouts"] for r in recs] == [0, 0, 0] and summary["oracle_rollouts_total"] == 0
    assert [c[1] for c in calls] == [(4, 4)] * 3


@pytest.mark.parametrize("change, message", [({"oracle_every": 0}, "oracle_every"),
                                             ({"oracle_rollouts": 0}, "oracle_rollouts")])
def test_bad_oracle_settings_are_rejected(change, message):
    with pytest.raises(ValueError, match=message):
        check_config(TrainConfig(**{**TINY, **change}))
