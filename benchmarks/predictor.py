"""The pass-rate predictor at scale: AUC on prompts never rolled out, rollouts saved
by `greso` and `criticality_is` against `uniform` and `mopps`, and overhead per step.

    .venv/bin/python benchmarks/predictor.py                    # N = 1e5, 100 steps of B = 512
    .venv/bin/python benchmarks/predictor.py --n 1000000 --steps 40 --policies criticality_is greso
    .venv/bin/python benchmarks/predictor.py --noise 100      # a control: features without signal

The world. The simulator's `solved_majority` scenario (rlpace.sim) scaled to N prompts: four
domains, 90 % of prompts already solved (P(success) ≈ 0.998), the open ones at 40/20/8/3 %
starting accuracy. Each prompt's pass rate is fixed for the run (a static learner: this
benchmark measures prediction and selection, not learning). Features (`Pool.features`):
the prompt's latent difficulty plus N(0, 0.5²) noise (the scenario's offline annotation, an
imperfect difficulty ranker) and a one-hot of its domain — signal the predictor can use on
prompts it has never seen. With B = 512, G = 8 and N = 1e5, 100 steps roll out about half the
prompts once and few twice: per-prompt statistics are mostly empty.

Reported per policy:
  * informative: share of proposed groups with 0 < k < G (non-zero GRPO advantage);
  * rollouts/informative: rollouts spent per informative group; `saved` = 1 − that / uniform's;
  * ESS: criticality_is's mean effective sample size of its loss weights (fraction of B);
  * AUC (predictor policies): on prompts never rolled out in the run, the AUC of the predicted
    pass rate π̂ as a score for one fresh rollout's success, next to the ceiling the true pass
    rate reaches on the same draws; and the AUC of π̂ for "the prompt is solved" (true rate > 0.9);
  * ms/step: median wall time of propose(B) + Feedback + observe + loss_weights (the
    stream's reward draws excluded); the stage refits show in the mean, printed beside it.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from rlpace import Feedback, Pool, Scheduler
from rlpace.predict._logistic import _sigmoid, logits
from rlpace.sim._scenarios import build_world, make_scenario, sigmoid


def world(n: int, seed: int = 0, noise: float = 0.5):
    sc = make_scenario("solved_majority", prompts_per_domain=n // 4, pool_seed=seed)
    w = build_world(sc)
    rate = sigmoid(-w.difficulty)                         # skill 0: P = σ(s − d), s = 0
    rng = np.random.default_rng([seed, 0xFEA7])
    noisy = w.difficulty + noise * rng.standard_normal(w.difficulty.shape[0])
    k = int(w.domain.max()) + 1
    feats = np.concatenate([noisy[:, None], np.eye(k)[w.domain]], axis=1).astype(np.float32)
    p = w.pool
    # No `difficulty` on the Pool: the noisy difficulty travels in the features only, so
    # --noise controls all the signal the predictor gets (a large value is a no-signal control).
    pool = Pool(np.asarray(p.domain_names)[p.domains], clusters=np.asarray(p.cluster_names)[p.clusters],
                features=feats)
    return pool, rate


def auc(score: np.ndarray, label: np.ndarray) -> float:
    """Mann–Whitney AUC with average ranks for ties."""
    order = np.argsort(score, kind="mergesort")
    s = score[order]
    ranks = np.empty(s.size)
    # average ranks over tied runs
    starts = np.r_[0, np.flatnonzero(np.diff(s)) + 1]
    ends = np.r_[starts[1:], s.size]
    avg = (starts + ends + 1) / 2.0
    ranks[order] = np.repeat(avg, ends - starts)
    pos = label.astype(bool)
    n1, n0 = pos.sum(), (~pos).sum()
    return float((ranks[pos].sum() - n1 * (n1 + 1) / 2) / (n1 * n0)) if n1 and n0 else float("nan")


def run(pool, rate, name, kw, steps, b, g, seed):
    s = Scheduler(pool, name, seed=seed, **kw)
    seen = np.zeros(len(pool), bool)
    informative = groups = 0
    times, ess = [], []
    for t in range(steps):
        rng = np.random.default_rng([seed, t, 7])
        t0 = time.perf_counter()
        ids = s.propose(b)
        t1 = time.perf_counter()
        r = (rng.random((b, g)) < rate[ids, None]).astype(np.float64)   # the stream (not timed)
        t2 = time.perf_counter()
        fb = Feedback(ids, r, step=t)
        s.observe(fb)
        s.loss_weights(fb)
        t3 = time.perf_counter()
        times.append((t1 - t0) + (t3 - t2))
        k = r.sum(axis=1)
        informative += int(((k > 0) & (k < g)).sum())
        groups += b
        seen[ids] = True
        m = s.metrics() if "criticality" in name else {}
        if "criticality/ess_fraction" in m:
            ess.append(m["criticality/ess_fraction"])
    out = {"informative": informative / groups, "rollouts_per_informative": groups * g / max(informative, 1),
           "ms_median": 1e3 * float(np.median(times)), "ms_mean": 1e3 * float(np.mean(times)),
           "ess": float(np.mean(ess)) if ess else float("nan"), "seen": float(seen.mean())}
    st = s.states["selection"]
    pred = getattr(st, "predictor", None)
    if pred is not None and int(pred.stage) > 0:
        unseen = np.flatnonzero(~seen)
        pi = _sigmoid(logits(pred.stage_theta, pool, unseen))
        rng = np.random.default_rng([seed, 0xA0C])
        outcome = rng.random(unseen.size) < rate[unseen]
        out["auc_rollout"] = auc(pi, outcome)
        out["auc_rollout_ceiling"] = auc(rate[unseen], outcome)
        out["auc_solved"] = auc(pi, rate[unseen] > 0.9)
    return out


POLICIES = {
    "uniform": {},
    "mopps": {},
    "mopps+prior": {"prior_strength": 8.0},
    "greso": {},
    "criticality_is": {"target": "learnability", "alpha": 3.0},
    "criticality_is/failure": {"target": "failure"},
}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--policies", nargs="*", default=list(POLICIES))
    ap.add_argument("--noise", type=float, default=0.5,
                    help="sd of the noise on the difficulty feature (large = features carry no signal)")
    args = ap.parse_args(argv)
    pool, rate = world(args.n, args.seed, args.noise)
    print(f"N = {len(pool)}, B = {args.batch}, G = {args.group}, steps = {args.steps}; "
          f"solved share {np.mean(rate > 0.9):.2f}, mean pass rate {rate.mean():.3f}")
    rows = {}
    for label in args.policies:
        name = label.split("/")[0]
        kw = dict(POLICIES[label])
        if name == "mopps+prior":
            name = "mopps"
        rows[label] = run(pool, rate, name, kw, args.steps, args.batch, args.group, args.seed)
    base = rows.get("uniform", {}).get("rollouts_per_informative")
    print(f"{'policy':24s} {'informative':>11s} {'rollouts/inf':>12s} {'saved':>7s} {'ESS':>6s} "
          f"{'AUC roll':>8s} {'(ceiling)':>9s} {'AUC solved':>10s} {'ms/step':>8s} {'(mean)':>7s} {'seen':>5s}")
    for label, r in rows.items():
        saved = 1 - r["rollouts_per_informative"] / base if base else float("nan")
        print(f"{label:24s} {r['informative']:11.3f} {r['rollouts_per_informative']:12.1f} {saved:7.2f} "
              f"{r['ess']:6.2f} {r.get('auc_rollout', float('nan')):8.3f} "
              f"{r.get('auc_rollout_ceiling', float('nan')):9.3f} {r.get('auc_solved', float('nan')):10.3f} "
              f"{r['ms_median']:8.2f} {r['ms_mean']:7.2f} {r['seen']:5.2f}")


if __name__ == "__main__":
    main()
