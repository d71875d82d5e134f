"""Per-prompt features of a task set, for the pass-rate predictor (`rlpace.predict`): what the
built-in trainer gives its `Pool` so `criticality_is`, `criticality_grid` and `mopps` with its
predictor prior (`prior_strength` > 0) can score prompts they have never rolled out.

Columns, for prompt i of distribution d_i (all cheap, deterministic functions of the task
set; no model, no ground truth):

    [ onehot(family(d_i)) (F columns) | size_i / max size of its family | log(1 + len(prompt_i)) ]

family(d) is the letter prefix of an embedded distribution name (`sort5` → `sort`, size 5 =
`Item.difficulty`); any other distribution (reasoning-gym, parquet `data_source`) is its own
family, with its `Item.difficulty` as the size (0 where unknown). The predictor adds its own
intercept, domain one-hot and z-scored `Pool.difficulty` columns and z-scores these (a
constant column adds nothing), so the family columns and the within-family size let it carry
what it learned on one size of a family to the others — what a grid proposal over a family's
sizes needs (`criticality_grid`). Within one distribution every embedded prompt gets the same
family and size and nearly the same length: these features rank distributions, not prompts
inside one.

>>> from rlpace.tasks import make_taskset
>>> ts = make_taskset("embedded:max2,max4,last3", train_per_domain=1, heldout_per_domain=1)
>>> prompt_features(ts).astype(float).round(3).tolist()   # families (last, max), size / family max, log(1 + chars)
[[0.0, 1.0, 0.5, 1.792], [0.0, 1.0, 1.0, 2.079], [1.0, 0.0, 1.0, 1.946]]
"""

from __future__ import annotations

import re

import numpy as np

__all__ = ["prompt_features", "FEATURE_HELP"]

FEATURE_HELP = "[family one-hot, size / family's max size, log(1 + prompt characters)]"

_NAME = re.compile(r"^([a-z]+)(\d+)$")


def _family(domain) -> str:
    m = _NAME.match(str(domain))
    return m.group(1) if m else str(domain)


def prompt_features(tasks) -> np.ndarray:
    """float32[N, F + 2] features of `tasks.train` in pool order (module docstring)."""
    items = tasks.train
    fam = [_family(it.domain) for it in items]
    names = sorted(set(fam))
    code = np.array([names.index(f) for f in fam], dtype=np.int64)                  # [N]
    size = np.array([it.difficulty for it in items], dtype=np.float64)              # [N]
    size = np.where(np.isfinite(size), size, 0.0)
    top = np.zeros(len(names))
    np.maximum.at(top, code, np.abs(size))
    rel = size / np.where(top[code] > 0, top[code], 1.0)                            # [N] in [-1, 1]
    length = np.log1p(np.array([len(it.prompt) for it in items], dtype=np.float64))
    out = np.zeros((len(items), len(names) + 2), dtype=np.float32)
    out[np.arange(len(items)), code] = 1.0
    out[:, -2] = rel
    out[:, -1] = length
    return out
