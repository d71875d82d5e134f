"""`vip` against the reference pipeline as its stored code runs it: SLSQP at scipy's default
tolerance from the uniform start, then the reference's greedy rounding (the loop transcription
`reference_rounding` of tests/test_methods_vip.py). Prints how many random states get the same
allocation and how far SLSQP's continuous objective stays above the exact minimum
(docs/methods/vip.md, "Agreement with the reference"). Needs scipy.

Usage:
    python benchmarks/vip_agreement.py [--states 400] [--seed 0]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_methods_vip import reference_rounding  # noqa: E402

from rlpace.policies._vip import vip_allocation, vip_continuous  # noqa: E402


def reference_slsqp(a, b, budget, lower=4, upper=32):
    """The stored code's `solve` (rule "rloo"): SLSQP at its defaults."""
    from scipy.optimize import minimize
    f = lambda n: np.sum(a / (n - 1) + b * n)   # noqa: E731
    res = minimize(f, np.full(a.shape[0], budget / a.shape[0]), method="SLSQP", bounds=[(lower, upper)] * a.shape[0],
                   constraints=[{"type": "eq", "fun": lambda n: np.sum(n) - budget}])
    return res.x, f


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--states", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    same, moved, gaps = 0, [], []
    for _ in range(args.states):
        b, g = int(rng.choice([8, 16, 32, 64])), int(rng.choice([8, 16]))
        p = np.clip(1 / (1 + np.exp(-rng.normal(-1, 1.5, b))), 1e-6, 1 - 1e-6)   # GP-like predictions
        a, hard = p * (1 - p), 0.0007 * np.log(p)
        ours = vip_allocation(p, b * g)
        x, f = reference_slsqp(a, hard, b * g)
        ref = reference_rounding(x, a, b * g, 32)
        same += int((ref == ours).all())
        moved.append(int(np.abs(ref - ours).sum()))
        gaps.append(f(x) - f(vip_continuous(a, hard, b * g)))
    gaps = np.array(gaps)
    print(f"{args.states} states, B in {{8, 16, 32, 64}}, G in {{8, 16}}, p = sigmoid(N(-1, 1.5))")
    print(f"identical allocations: {same}/{args.states}; rollouts moved (sum |ours - reference|): "
          f"median {np.median(moved):.0f}, max {max(moved)}")
    print(f"SLSQP objective above the exact minimum: {(gaps > 1e-9).sum()}/{args.states} states, "
          f"median {np.median(gaps):.2e}, max {gaps.max():.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
