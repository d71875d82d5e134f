"""The embedded task suite: short procedural string and arithmetic tasks with exact
answers, small enough for a character-level model of ~0.1–1 M parameters on a CPU.

A distribution is a (family, size) pair, e.g. `max4` = the largest of 4 digits. Its
difficulty is the size. Prompts are plain text ending in "=", answers are the exact
string after it. Each family also names a *typical mistake* — a plausible wrong rule —
which the tiny base policy's warm-up corpus uses (see `rlpace.train.model`):

| family | prompt       | answer | typical mistake      | size is                      |
|--------|--------------|--------|----------------------|------------------------------|
| max    | `x:3142=`    | `4`    | the smallest: `1`    | number of digits             |
| sumd   | `d:787=`     | `22`   | units only: `2`      | number of digits summed      |
| last   | `l:cabd=`    | `d`    | the first: `c`       | string length                |
| add    | `47+85=`     | `132`  | no carry: `22`       | digits per operand           |
| rev    | `r:cabd=`    | `dbac` | a copy: `cabd`       | string length                |
| sort   | `s:3142=`    | `1234` | descending: `4321`   | number of digits             |
| cnt    | `c:a:abca=`  | `2`    | one too many: `3`    | string length                |
| mul    | `m:47*6=`    | `282`  | one b too many       | digits of the first factor   |
| idx    | `i:b:cabd=`  | `3`    | from the end: `2`    | string length                |
| next   | `n:a:cabd=`  | `b`    | the one before: `c`  | string length                |

The default suite (`DEFAULT_SUITE`, 12 distributions) uses max, sumd and last: answers
of one or two tokens, so a rollout's reward reflects one decision rather than the
product of many per-character errors — what a 0.1 M-parameter policy can learn from in
a hundred RL steps. The other families are there for larger models and custom suites.

Two named suites give data scheduling *headroom* (an oracle saves rollouts on them; `SUITES`, `tasks=ladder` /
`tasks=mostly_solved` in the trainer), beside `embedded` as the balanced control:

* `ladder` — one family at seven sizes (reversal, rev2…rev8) with a steep mistake ramp: the sizes
  are learned in order, each lifted off zero by RL on the one below (DUMP's
  Knights-and-Knaves 3…14 structure, arXiv 2504.09710);
* `mostly_solved` — 62% of the prompts solved by the base (sampled wrong now and then),
  23% it cannot learn (the warm-up never shows their right answer), 15% learnable
  (reversal at 4 and 5 letters: the longer is reachable once the shorter is learned).

`sort_ladder` and `mostly_solved_last` are the earlier versions of the two, with less
headroom, kept so that the figures measured on them reproduce.

Two more suites come from the families the ones above do not use (neither reversal nor
sorting), with structures none of them has; they are there to check `rlpace advise` on setups
it was not developed on, and their shares were fixed before any scheduling run:

* `families_parallel` — eight families at one size each (add2, mul2, sumd3, cnt6, idx6,
  next6, max6, last6), all at the warm-up mistake share 0.75: the domains differ only in how
  learnable their family is and are learned side by side, none unlocking another;
* `small_domains` — the seven smallest prompt spaces of seven families (add1, mul1, max2,
  sumd2, last2, cnt1, idx2: 80–180 prompts, so 16–116 training prompts each after 64
  held-out) beside three large domains (add3, max6, last6), all at 0.75: small domains that
  a scheduler can revisit until they are memorised.

Each carries its own warm-up mistake shares (`parse_mistakes("default", name)`).

Items are drawn without repetition per distribution; held-out items are drawn first and
never appear among the training items (compared by prompt text). Generation is
deterministic in (seed, distribution name). Small spaces hold few items: add1 has 100
prompts, so most of them go to the held-out set.
"""

from __future__ import annotations

from ..errors import InputError
import hashlib
import re
from typing import Callable

import numpy as np

from ._types import Item, TaskSet
from ._verify import exact_score

__all__ = ["FAMILIES", "DEFAULT_SUITE", "DEFAULT_MISTAKES", "embedded_suite", "parse_distribution",
           "sample_items", "parse_mistakes", "SUITES", "LADDER_SUITE", "LADDER_MISTAKES", "SORT_LADDER_SUITE",
           "SORT_LADDER_MISTAKES",
           "MOSTLY_SOLVED_SUITE", "MOSTLY_SOLVED_MISTAKES", "MOSTLY_SOLVED_ROLES", "MOSTLY_SOLVED_LAST_SUITE",
           "MOSTLY_SOLVED_LAST_MISTAKES", "MOSTLY_SOLVED_LAST_ROLES", "FAMILIES_PARALLEL_SUITE",
           "FAMILIES_PARALLEL_MISTAKES", "SMALL_DOMAINS_SUITE", "SMALL_DOMAINS_MISTAKES"]

LETTERS = "abcdefghij"


def _digits(rng, n):
    return "".join(str(d) for d in rng.integers(0, 10, size=n))


def _letters(rng, n):
    return "".join(LETTERS[i] for i in rng.integers(0, len(LETTERS), size=n))


def _number(rng, n):
    """A uniformly drawn number with exactly n digits (1-digit numbers include 0)."""
    lo = 0 if n == 1 else 10 ** (n - 1)
    return int(rng.integers(lo, 10 ** n))


def _add(rng, n):
    a, b = _number(rng, n), _number(rng, n)
    no_carry = int("".join(str((int(x) + int(y)) % 10) for x, y in zip(f"{a:0{n}d}", f"{b:0{n}d}")))
    return f"{a}+{b}=", str(a + b), str(no_carry)


def _rev(rng, n):
    s = _letters(rng, n)
    return f"r:{s}=", s[::-1], s


def _sort(rng, n):
    s = _digits(rng, n)
    return f"s:{s}=", "".join(sorted(s)), "".join(sorted(s, reverse=True))


def _cnt(rng, n):
    s = _letters(rng, n)
    x = s[int(rng.integers(0, n))] if rng.random() < 0.75 else LETTERS[int(rng.integers(0, len(LETTERS)))]
    return f"c:{x}:{s}=", str(s.count(x)), str(s.count(x) + 1)


def _mul(rng, n):
    a, b = _number(rng, n), int(rng.integers(2, 10))
    return f"m:{a}*{b}=", str(a * b), str(a * b + b)


def _max(rng, n):
    s = _digits(rng, n)
    return f"x:{s}=", max(s), min(s)


def _idx(rng, n):
    s = "".join(LETTERS[i] for i in rng.permutation(len(LETTERS))[:n])
    k = int(rng.integers(0, n))
    return f"i:{s[k]}:{s}=", str(k + 1), str(n - k)


def _sumd(rng, n):
    s = _digits(rng, n)
    total = sum(int(c) for c in s)
    return f"d:{s}=", str(total), str(total % 10)


def _last(rng, n):
    s = _letters(rng, n)
    return f"l:{s}=", s[-1], s[0]


def _next(rng, n):
    s = "".join(LETTERS[i] for i in rng.permutation(len(LETTERS))[:n])
    k = int(rng.integers(1, n - 1))
    return f"n:{s[k]}:{s}=", s[k + 1], s[k - 1]


# family -> (generator(rng, size) -> (prompt, answer, typical mistake), allowed sizes)
FAMILIES: dict[str, tuple[Callable, range]] = {
    "add": (_add, range(1, 6)),
    "rev": (_rev, range(1, 9)),
    "sort": (_sort, range(1, 9)),
    "cnt": (_cnt, range(1, 11)),
    "mul": (_mul, range(1, 5)),
    "max": (_max, range(1, 11)),
    "idx": (_idx, range(1, 11)),
    "sumd": (_sumd, range(1, 9)),
    "next": (_next, range(3, 11)),
    "last": (_last, range(2, 11)),
}

#: The default suite: 12 distributions, three families at four sizes each, whose greedy
#: accuracy under the tiny base policy spans ≈100% to ≈0% (see `DEFAULT_MISTAKES`).
DEFAULT_SUITE = "max2,max3,max4,max5,sumd2,sumd3,sumd4,sumd5,last3,last5,last7,last9"

#: Share of the tiny base's warm-up answers replaced by the family's typical mistake
#: (`rlpace.train.model.warmup_corpus`): 0 / 0.5 / 0.75 / 0.97 from the smallest to the
#: largest size of each family; distributions not listed get none.
DEFAULT_MISTAKES = {"max3": 0.5, "max4": 0.75, "max5": 0.97,
                    "sumd3": 0.5, "sumd4": 0.75, "sumd5": 0.97,
                    "last5": 0.5, "last7": 0.75, "last9": 0.97}

# ---- suites with headroom -------------------------------------------------------------------
# `embedded` above is the balanced control: every family has learnable sizes, so uniform
# already spends many rollouts where they teach. The two suites below are built so that it
# does not; each is a set of distributions *and* the warm-up mistake shares that give the
# tiny base the intended starting point (`SUITES[name][1]`, used when warmup_mistakes is
# 'default'). Figures: docs/methods/oracle.md and the report of `benchmarks/headroom.py`.

#: Curriculum ladder: one family (`rev`, reverse a string; the mistake is a copy) at seven
#: lengths whose warm-up mistake share rises steeply with the length, so the base reverses 2
#: letters, 3 often, 4 rarely and 5–8 never (greedy ≈ 0). Reversing is learned per length
#: (each output position maps to its own input position), so RL on length n only partly
#: transfers to n + 1: with uniform the rungs unlock one after another over the whole budget
#: (rev4 by step ~20, rev5 by ~40–100, rev6 late, rev7–8 not within 100 steps) — the
#: structure of DUMP's Knights-and-Knaves 3…14 people (arXiv 2504.09710). Measured (8 seeds,
#: B=16, G=8, 100 steps; `benchmarks/headroom.py --suites ladder`): uniform 0.229 → 0.429,
#: still improving at the end; `oracle_boundary` reaches 80 % of that gain with 0.35× [0.24,
#: 0.54] uniform's rollouts, `recommended` 0.46× [0.30, 0.71] (83 % of the oracle's saving;
#: 0.40× with DUMP's own T = 0.1 over uniform domains).
LADDER_SUITE = "rev2,rev3,rev4,rev5,rev6,rev7,rev8"
LADDER_MISTAKES = {"rev2": 0.15, "rev3": 0.4, "rev4": 0.7, "rev5": 0.9, "rev6": 0.97,
                   "rev7": 0.99, "rev8": 0.995}

#: The previous `ladder` (kept as `sort_ladder` so that its figures can be reproduced): the
#: same ramp over `sort` (ascending; the mistake is descending). One shared rule (ascending
#: order) lifts sizes 3–6 in a burst within the first ~20 steps under any schedule, so it has
#: no measurable headroom: `oracle_boundary` 0.89× [0.73, 1.09] (8 seeds; 0.81× with the
#: sharper oracle, 4 seeds). One-token `last` ladders showed even less (0.85–0.93×).
SORT_LADDER_SUITE = "sort2,sort3,sort4,sort5,sort6,sort7,sort8"
SORT_LADDER_MISTAKES = {"sort2": 0.15, "sort3": 0.4, "sort4": 0.7, "sort5": 0.9, "sort6": 0.97,
                        "sort7": 0.99, "sort8": 0.995}

#: Mostly solved / mostly unsolvable: 8 of 13 distributions (62% of the prompts) the base
#: solves (greedy ≈ 1; mistake share 0.05, so it samples a wrong answer now and then and RL
#: only sharpens them, which moves no held-out accuracy), 3 (23%) it cannot learn in the
#: budget (sumd5–7 with mistake share 1: the warm-up never shows a right answer, so every
#: group is all-wrong), and a learnable minority of 2 (15%): reversal at 4 and 5 letters
#: (`rev4` at mistake share 0.5, `rev5` at 0.8), above a solved `rev3`. Reversal is learned
#: per length (each output position maps to its own input position), so rev5 only becomes
#: reachable once rev4 is learned: uniform lifts rev4 from 0.30 to ≈ 0.9 over the whole budget
#: and never reaches rev5 (0.02), a scheduler that spends its rollouts on rev4 first gets rev5
#: off the ground within the budget. Every distribution has ≥ 1000 distinct prompts, so these
#: are also the shares of the training pool. The regime of real math sets for a small model:
#: uniform spends most rollouts on prompts that teach nothing, and the learnable part has an
#: order. Measured (8 seeds, B=16, G=8, 100 steps; `benchmarks/headroom.py --suites
#: mostly_solved`): uniform 0.636 → 0.682, reaching 90% of its final gain at step 37–81
#: (median 52); `oracle_boundary` reaches 80% of that gain with 0.36× [0.28, 0.49] uniform's
#: rollouts, `recommended` 0.52× [0.38, 0.74] (75% of the oracle's saving).
MOSTLY_SOLVED_ROLES = {"solved": ("rev3", "last3", "last4", "last5", "max3", "max4", "max5", "max6"),
                       "learnable": ("rev4", "rev5"), "unlearnable": ("sumd5", "sumd6", "sumd7")}
MOSTLY_SOLVED_SUITE = ",".join(d for role in MOSTLY_SOLVED_ROLES.values() for d in role)
MOSTLY_SOLVED_MISTAKES = {**{d: 0.05 for d in MOSTLY_SOLVED_ROLES["solved"]},
                          "rev4": 0.5, "rev5": 0.8, **{d: 1.0 for d in MOSTLY_SOLVED_ROLES["unlearnable"]}}

#: The previous `mostly_solved` (kept as `mostly_solved_last` so that its figures can be
#: reproduced): the same regime with a one-token learnable minority (`last7` at 0.7, `last9`
#: at 0.9, solved last3–5 and max3–7). Its learnable rule is shared across lengths and its
#: gradient is clean from a couple of groups, so the only edge of knowing the pass rates is
#: noise: `oracle_boundary` 0.56× [0.44, 0.67] (8 seeds), above the 0.5× bar.
MOSTLY_SOLVED_LAST_ROLES = {"solved": ("last3", "last4", "last5", "max3", "max4", "max5", "max6", "max7"),
                            "learnable": ("last7", "last9"), "unlearnable": ("sumd5", "sumd6", "sumd7")}
MOSTLY_SOLVED_LAST_SUITE = ",".join(d for role in MOSTLY_SOLVED_LAST_ROLES.values() for d in role)
MOSTLY_SOLVED_LAST_MISTAKES = {**{d: 0.05 for d in MOSTLY_SOLVED_LAST_ROLES["solved"]},
                               "last7": 0.7, "last9": 0.9,
                               **{d: 1.0 for d in MOSTLY_SOLVED_LAST_ROLES["unlearnable"]}}

# ---- suites from the other families (validation of `rlpace advise`) -------------------------
# Two structures none of the suites above has, from families other than `rev` and `sort`. They
# were built to test predictions on setups the predictor was not developed on, not to show
# headroom: their shares below were fixed before any scheduling run.

#: Eight families side by side, learned in parallel: one size of each of `add`, `mul`, `cnt`,
#: `idx`, `next`, `max`, `sumd`, `last`, every one at the same warm-up mistake share (0.75), so
#: the domains differ only in what the family asks — a one-token lookup (`last`, `max`, `idx`,
#: `next`, `cnt`) or a multi-token computation with carries (`add2`, `mul2`, `sumd3`). No domain
#: unlocks another (no ladder); each has ≥ 1000 distinct prompts (`mul2` 720), equal pool shares.
FAMILIES_PARALLEL_SUITE = "add2,mul2,sumd3,cnt6,idx6,next6,max6,last6"
FAMILIES_PARALLEL_MISTAKES = {d: 0.75 for d in FAMILIES_PARALLEL_SUITE.split(",")}

#: Many small domains: the seven smallest prompt spaces of seven families (`add1` 100 prompts,
#: `mul1` 80, `max2` 100, `sumd2` 100, `last2` 100, `cnt1` 100, `idx2` 180) beside one large
#: domain of each of three of them (`add3`, `max6`, `last6`, ≥ 1000 prompts). The held-out
#: items are drawn first, so with 64 held-out per domain a small domain keeps 16–116 training
#: prompts (a few % of the pool each) and is seen many times over the budget: the regime where
#: a repeated small domain can be memorised rather than learned. Warm-up mistake share 0.75 on
#: the small domains and on the large ones alike.
SMALL_DOMAINS_SUITE = "add1,mul1,max2,sumd2,last2,cnt1,idx2,add3,max6,last6"
SMALL_DOMAINS_MISTAKES = {d: 0.75 for d in SMALL_DOMAINS_SUITE.split(",")}

#: Named embedded suites: name -> (distributions, default warm-up mistake shares).
SUITES = {"embedded": (DEFAULT_SUITE, DEFAULT_MISTAKES),
          "ladder": (LADDER_SUITE, LADDER_MISTAKES),
          "mostly_solved": (MOSTLY_SOLVED_SUITE, MOSTLY_SOLVED_MISTAKES),
          "mostly_solved_last": (MOSTLY_SOLVED_LAST_SUITE, MOSTLY_SOLVED_LAST_MISTAKES),
          "sort_ladder": (SORT_LADDER_SUITE, SORT_LADDER_MISTAKES),
          "families_parallel": (FAMILIES_PARALLEL_SUITE, FAMILIES_PARALLEL_MISTAKES),
          "small_domains": (SMALL_DOMAINS_SUITE, SMALL_DOMAINS_MISTAKES)}


_NAME = re.compile(r"^([a-z]+)(\d+)$")


def parse_distribution(name: str) -> tuple[str, int]:
    """'add2' -> ('add', 2); ValueError naming the valid families and sizes otherwise."""
    m = _NAME.match(name.strip())
    fams = ", ".join(f"{f}{s.start}..{f}{s.stop - 1}" for f, (_, s) in FAMILIES.items())
    if m is None or m.group(1) not in FAMILIES:
        raise InputError(f"unknown embedded distribution {name!r}; valid: {fams}.")
    fam, size = m.group(1), int(m.group(2))
    if size not in FAMILIES[fam][1]:
        raise InputError(f"embedded distribution {name!r}: size {size} is out of range; valid: {fams}.")
    return fam, size


def parse_mistakes(spec: str, tasks: str = "embedded") -> dict[str, float]:
    """'default' -> the default shares of the task set `tasks` names (`SUITES[tasks][1]` for
    a named suite — `ladder`, `mostly_solved` — else `DEFAULT_MISTAKES`); '' or 'none' -> {};
    'max3=0.5,last4=0.7' -> that mapping. Names must be embedded distributions, rates in
    [0, 1] (ValueError otherwise).

    >>> parse_mistakes("max3=0.5, last4=0.7")
    {'max3': 0.5, 'last4': 0.7}
    >>> parse_mistakes("default", "ladder")["rev8"]
    0.995
    """
    text = spec.strip()
    if text == "default":
        name = tasks.strip() if isinstance(tasks, str) else ""
        return dict(SUITES[name][1] if name in SUITES else DEFAULT_MISTAKES)
    if text in ("", "none"):
        return {}
    out = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, eq, rate = part.partition("=")
        try:
            r = float(rate)
        except ValueError:
            r = -1.0
        if not eq or not 0.0 <= r <= 1.0:
            raise InputError(f"warmup_mistakes item {part!r} is not name=rate with a rate in [0, 1] "
                             f"(e.g. 'max3=0.5,last4=0.75', or 'default', or 'none').")
        parse_distribution(name)
        out[name.strip()] = r
    return out


def _stream(seed: int, name: str, purpose: str) -> np.random.Generator:
    key = int.from_bytes(hashlib.sha256(f"{name}/{purpose}".encode()).digest()[:8], "little")
    return np.random.default_rng([int(seed), key])


def sample_items(name: str, n: int, seed: int, purpose: str, exclude=frozenset(),
                 with_mistakes: bool = False) -> list[tuple]:
    """Up to n distinct (prompt, answer) pairs of distribution `name` not in `exclude`
    (prompt texts); (prompt, answer, mistake) triples when `with_mistakes`. Fewer when the
    distribution has fewer distinct prompts (add1 has 100)."""
    fam, size = parse_distribution(name)
    gen = FAMILIES[fam][0]
    rng = _stream(seed, name, purpose)
    out, seen = [], set(exclude)
    tries = 0
    while len(out) < n and tries < 20 * n + 100:
        p, a, wrong = gen(rng, size)
        tries += 1
        if p not in seen:
            seen.add(p)
            out.append((p, a, wrong) if with_mistakes else (p, a))
    return out


def embedded_suite(distributions: str = DEFAULT_SUITE, *, train_per_domain: int = 256,
                   heldout_per_domain: int = 32, seed: int = 0) -> TaskSet:
    """Build the embedded suite.

    Args:
        distributions: comma-separated names, family + size (`add2`, `rev5`, ...).
        train_per_domain: training prompts per distribution (fewer where the space is small).
        heldout_per_domain: held-out prompts per distribution, drawn first.
        seed: generation seed (items are a pure function of seed and names).

    Returns:
        A `TaskSet` whose items are scored by exact match (`exact_score`).

    Example:
        >>> ts = embedded_suite("add1,rev3", train_per_domain=8, heldout_per_domain=4)
        >>> ts.domains, len(ts.train), ts.train[0].ability
        (('add1', 'rev3'), 16, 'exact')
    """
    names = [s.strip() for s in distributions.split(",") if s.strip()]
    if not names:
        raise InputError("embedded_suite needs at least one distribution, e.g. 'add1,rev3'.")
    if len(set(names)) != len(names):
        raise InputError(f"embedded_suite: distribution names repeat in {distributions!r}.")
    for nm in names:
        parse_distribution(nm)
    if train_per_domain < 1 or heldout_per_domain < 0:
        raise InputError("train_per_domain must be ≥ 1 and heldout_per_domain ≥ 0.")
    train, heldout = [], []
    for nm in names:
        _, size = parse_distribution(nm)
        held = sample_items(nm, heldout_per_domain, seed, "heldout")
        tr = sample_items(nm, train_per_domain, seed, "train", exclude={p for p, _ in held})
        heldout += [Item(p, a, nm, float(size), len(heldout) + j) for j, (p, a) in enumerate(held)]
        train += [Item(p, a, nm, float(size), len(train) + j) for j, (p, a) in enumerate(tr)]
    return TaskSet("embedded:" + ",".join(names), tuple(train), tuple(heldout), {"exact": exact_score})
