"""How large DIEM's weights get, with and without the cap (`diem(max_weight=...)`); not a timed test.

Two synthetic batches of per-rollout gradient features (unit="prompt": a group's feature is
the sum over its G rollouts), 8 groups × G = 4 rollouts, d = 64, standard normal:

    tiny      group 0's features 100× smaller than the others' (the case the cap is for)
    even      every group at the same scale, plus a shared mean 0.3 (the features of one
              batch point roughly one way, as real gradients do)

For `importance` loo and reference (a standard normal reference direction), `ridge` 0 and
1e-3, and max_weight None (uncapped) and 4 (the default), over `--seeds` batches: the
median and largest weight of group 0, the largest weight of any group, the median number of
groups with a non-zero weight, and the share of batches the cap changed.

    python benchmarks/diem_weights.py --seeds 20
"""

from __future__ import annotations

import argparse

import numpy as np

from rlpace import Feedback, Pool
from rlpace.policies._diem import diem
from rlpace.types import Batch

B, G, D = 8, 4, 64


def batch(kind: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([seed, 0 if kind == "tiny" else 1])
    g = rng.standard_normal((B, G, D))
    if kind == "tiny":
        g[0] *= 0.01
    else:
        g += 0.3
    return g.astype(np.float32), rng.standard_normal(D).astype(np.float32)


def weights(policy, g: np.ndarray, ref: np.ndarray) -> np.ndarray:
    pool = Pool(list(range(B)))
    fb = Feedback(np.arange(B), np.tile([1.0, 0.0], (B, G // 2)), grads=g, ref_grad=ref, step=0)
    return policy.apply(policy.init(pool), pool, Batch.from_feedback(fb, pool, 0.5))[:, 0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    args = ap.parse_args(argv)
    print("| batch | importance | ridge | cap | group 0 median | group 0 max | any max | groups > 0 (median) "
          "| batches changed by the cap |")
    print("|---|---|---|---|---|---|---|---|---|")
    for kind in ("tiny", "even"):
        for imp in ("loo", "reference"):
            for ridge in (0.0, 1e-3):
                runs = {}
                for cap in (None, 4.0):
                    p = diem(importance=imp, ridge=ridge, max_weight=cap)
                    runs[cap] = np.array([weights(p, *batch(kind, s)) for s in range(args.seeds)])
                changed = float(np.mean([(a != b).any() for a, b in zip(runs[None], runs[4.0])]))
                for cap, w in runs.items():
                    print(f"| {kind} | {imp} | {ridge:g} | {cap if cap else 'none'} | {np.median(w[:, 0]):.2f} "
                          f"| {w[:, 0].max():.2f} | {w.max():.2f} | {np.median((w > 0).sum(1)):.1f} "
                          f"| {'' if cap is None else f'{changed:.0%}'} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
