"""Task suites with exact verifiers: what the built-in trainer rolls out and grades.

* `embedded_suite` — procedural arithmetic and string tasks for a tiny CPU model
  (12 distributions by default, from near-certain to near-impossible for the base).
  Two named suites with *headroom* for data scheduling (where an oracle saves rollouts): `ladder` (string
  reversal at seven lengths, unlocked one after another) and `mostly_solved` (62% solved,
  23% unlearnable, a learnable minority of reversal lengths learned in order);
  `sort_ladder` and `mostly_solved_last` are their earlier versions, with less headroom
  (kept so that their figures reproduce); `families_parallel` (eight other families side by
  side) and `small_domains` (small prompt spaces beside large ones); see `SUITES`.
* `reasoning_gym_suite`, `knights_knaves_suite` — reasoning-gym datasets as distributions,
  graded by their own `score_answer` (DUMP's Knights-and-Knaves 3…14 setup).
* `math_score` — math-verify grading for math answers.
* `write_taskset` / `read_taskset` — the verl parquet schema, both ways.

A `TaskSet` gives the `Pool` a `Scheduler` runs on (domain = distribution,
difficulty = its size or level, ids = `Item.index`).

>>> from rlpace.tasks import make_taskset
>>> ts = make_taskset("embedded:add1,rev3", train_per_domain=4, heldout_per_domain=2)
>>> ts.pool().domain_names, ts.score(ts.train[:1], [ts.train[0].answer]).tolist()
(('add1', 'rev3'), [1.0])
"""

from ._embedded import (DEFAULT_MISTAKES, DEFAULT_SUITE, FAMILIES, LADDER_MISTAKES, LADDER_SUITE,
                        MOSTLY_SOLVED_LAST_MISTAKES, MOSTLY_SOLVED_LAST_ROLES, MOSTLY_SOLVED_LAST_SUITE,
                        MOSTLY_SOLVED_MISTAKES, MOSTLY_SOLVED_ROLES, MOSTLY_SOLVED_SUITE, SORT_LADDER_MISTAKES,
                        SORT_LADDER_SUITE, SUITES, embedded_suite,
                        parse_distribution, parse_mistakes, sample_items)
from ._parquet import read_parquet, read_taskset, rows_to_items, items_to_rows, write_parquet, write_taskset
from ._rg import knights_knaves_specs, knights_knaves_suite, reasoning_gym_suite, rg_score, rg_spec
from ._spec import SPEC_HELP, make_taskset
from ._features import prompt_features
from ._grid import grid_taskset
from ._types import Item, TaskSet
from ._verify import exact_score, extract_tagged, math_equal, math_score

__all__ = [
    "Item", "TaskSet", "make_taskset", "SPEC_HELP", "prompt_features", "grid_taskset",
    "embedded_suite", "DEFAULT_SUITE", "DEFAULT_MISTAKES", "FAMILIES", "parse_distribution",
    "parse_mistakes", "sample_items", "SUITES", "LADDER_SUITE", "LADDER_MISTAKES", "SORT_LADDER_SUITE",
    "SORT_LADDER_MISTAKES", "MOSTLY_SOLVED_SUITE",
    "MOSTLY_SOLVED_MISTAKES", "MOSTLY_SOLVED_ROLES", "MOSTLY_SOLVED_LAST_SUITE", "MOSTLY_SOLVED_LAST_MISTAKES",
    "MOSTLY_SOLVED_LAST_ROLES",
    "reasoning_gym_suite", "knights_knaves_suite", "knights_knaves_specs", "rg_spec", "rg_score",
    "exact_score", "math_score", "math_equal", "extract_tagged",
    "write_parquet", "read_parquet", "write_taskset", "read_taskset", "items_to_rows", "rows_to_items",
]
