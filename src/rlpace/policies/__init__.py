"""Data policies: the four kinds (mixture, selection, admission, reweighting), their
algebra (`compose`, `chain`, `with_floor`) and the registry of methods by name.

Every method's algorithm lives in one short file here (`_dump.py`, `_ads.py`, ...) that
cites its paper and card in `../shared/research/`.

>>> from rlpace import policies
>>> "dump" in policies.names()
True
"""

from ._base import (ADMISSION, KINDS, MIXTURE, REWEIGHTING, SELECTION, Admission, DataPolicy,
                    EmptyState, Method, chain, compose, keep_all, softmax, unit_weights, with_floor)
from ._dump import dump_ucb
from ._registry import make_method, make_policy, names, register
from ._uniform import fixed_mixture, uniform_pool, uniform_within_arm

__all__ = [
    "DataPolicy", "Method", "Admission", "EmptyState", "KINDS", "MIXTURE", "SELECTION",
    "ADMISSION", "REWEIGHTING", "compose", "chain", "with_floor", "softmax", "keep_all",
    "unit_weights", "names", "register", "make_policy", "make_method",
    "uniform_pool", "uniform_within_arm", "fixed_mixture", "dump_ucb",
]


def _uniform() -> Method:
    """Plain GRPO sampling: every prompt equally likely (no mixture, keep all, weight 1)."""
    return compose(uniform_pool(), name="uniform")


# ---- the registry: name -> factory. Proposal methods first, then admission, reweighting.
register("uniform", _uniform)
register("fixed_mixture", fixed_mixture)
register("dump", dump_ucb)
