"""Weak and noisy supervision on the built-in trainer (not a timed test).

Two matrices, each arm run on the same seeds (paired), the same rollout budget and the same
base policy per seed:

* A — 10 % labels (`labeled_fraction=0.1`, per distribution, drawn from the seed):
  `labelled-only` (policy uniform: the unlabelled prompts are left out of training),
  `ttrl` (majority-vote targets), `trapo` (majority targets + trajectory admission), and
  `full` supervision (`labeled_fraction=1`);
* B — 30 % noisy labels (`label_noise=0.3`: a wrong but realisable answer, that of another
  item of the distribution): `no refinement` (uniform on the noisy labels), `olr`
  (majority relabelling), and `clean` labels (the very runs of `full`).

Per arm: final held-out accuracy (mean of the last 3 evaluations of each run), its paired
95 % bootstrap CI of the difference to the matrix's weak baseline (`labelled-only`, `no
refinement`), rollouts to reach 80 % of the clean run's gain as a ratio to the clean run's
(`rlpace.evaluation.efficiency_vs_baseline`; "≥": some seed never reached it, its budget
counted), two measurements only the built-in trainer can make, from the hidden truth of
the training prompts: the accuracy of the targets (pseudo-labels / relabels) and of the
effective training labels, averaged over steps, and the groups that entered the loss per
step (of `--batch-prompts`; TraPO's admission drops unlabelled groups).

Default budget: the `embedded` suite (12 distributions) with 20 training prompts per
distribution, 150 steps × 16 prompts × 8 rollouts. The 240-prompt pool is then visited
about 10 times per prompt — OLR's 10 epochs: its relabelling needs a pass-rate history and
starts after the 5th visit of a prompt, and TraPO compares per-prompt pass-rate trajectories,
neither of which can act on a pool seen once — and 10 % labels are exactly 2 prompts per
distribution, 30 % noise 6 of 20. The base policy is built (once per seed, cached) from
this task set, so every arm of a seed starts from the same weights.

Usage:
    python benchmarks/supervision.py --seeds 8 --jobs 1
    python benchmarks/supervision.py --seeds 2 --steps 40 --arms labelled-only,full   # a smoke run

Runs are cached: a run whose summary.json holds the same config is not repeated.
Writes `supervision.csv` and `supervision.md` to --out/<task>/.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

# arm -> (matrix, config overrides); "full" is matrix A's full supervision and matrix B's clean labels
ARMS = {
    "labelled-only": ("A", {"policy": "uniform", "labeled_fraction": 0.1}),
    "ttrl": ("A", {"policy": "ttrl", "labeled_fraction": 0.1}),
    "trapo": ("A", {"policy": "trapo", "labeled_fraction": 0.1}),
    "full": ("A", {"policy": "uniform"}),
    "no refinement": ("B", {"policy": "uniform", "label_noise": 0.3}),
    "olr": ("B", {"policy": "olr", "label_noise": 0.3}),
}
WEAK = {"A": "labelled-only", "B": "no refinement"}
CLEAN = "full"


def run_config(arm: str, seed: int, args):
    from rlpace.train import TrainConfig
    _, over = ARMS[arm]
    return TrainConfig(out=str(Path(args.out) / args.task / f"{arm.replace(' ', '_')}__seed{seed}"), seed=seed,
                       steps=args.steps, tasks=args.task, lr=args.lr,
                       max_rollouts=args.steps * args.batch_prompts * args.group_size,
                       batch_prompts=args.batch_prompts, group_size=args.group_size, eval_every=args.eval_every,
                       heldout_per_domain=args.heldout, train_per_domain=args.train_per_domain,
                       checkpoint_every=0, progress=False, threads=1, **over)


def _run_one(cfg_dict: dict) -> str:
    """learning_efficiency's runner (cached by config), with the run's wall time printed."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import learning_efficiency as le
    t0 = time.perf_counter()
    out = le._run_one(cfg_dict)
    print(f"  {out}: {time.perf_counter() - t0:.0f} s", flush=True)
    return out


def available(arm: str) -> str:
    """'' when the arm's policy is registered, else why not."""
    from rlpace.policies import make_method
    try:
        make_method(ARMS[arm][1]["policy"])
    except Exception as e:  # noqa: BLE001 - any failure means "not available here"
        return f"{type(e).__name__}: {e}"
    return ""


def read_run(out: str) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import learning_efficiency as le
    from rlpace.train.report import load_run
    recs = load_run(out)
    steps = [r for r in recs if not r.get("final")]

    def mean_of(key):
        v = [r[key] for r in steps if key in r]
        return float(np.mean(v)) if v else math.nan
    return {"curve": le.curve(recs), "target_accuracy": mean_of("sup/target_accuracy"),
            "label_accuracy": mean_of("sup/label_accuracy"), "targets": mean_of("sup/targets"),
            "groups_trained": mean_of("groups_trained")}


def rows_for(runs: dict, tail: int, fraction: float) -> list[dict]:
    """One row per arm: final accuracy, Δ vs the matrix's weak baseline, rollouts to
    `fraction` of the clean run's gain / the clean run's, supervision measurements."""
    from rlpace.evaluation import efficiency_vs_baseline, paired_bootstrap_interval
    final = {a: {s: float(np.mean(r["curve"].accuracy[-tail:])) for s, r in rs.items()} for a, rs in runs.items()}
    eff = {}
    if CLEAN in runs:
        curves = {a: {s: r["curve"] for s, r in rs.items()} for a, rs in runs.items()}
        try:
            eff = efficiency_vs_baseline(curves, baseline=CLEAN, fraction=fraction, tail=tail, n_boot=10_000,
                                         random_state=0)
        except ValueError as e:               # the clean run gained nothing on some seed
            print(f"supervision: no rollouts-to-target column ({e})", flush=True)
    rows = []
    for arm, rs in runs.items():
        matrix = ARMS[arm][0]
        for m in (("A", "B") if arm == CLEAN else (matrix,)):
            weak = WEAK[m]
            row = {"matrix": m, "arm": "clean labels" if (arm == CLEAN and m == "B") else arm,
                   "seeds": len(rs), "final": float(np.mean(list(final[arm].values()))),
                   "delta": math.nan, "delta_low": math.nan, "delta_high": math.nan,
                   "ratio": math.nan, "ratio_low": math.nan, "ratio_high": math.nan, "bound": "", "reached": "",
                   "target_accuracy": float(np.nanmean([r["target_accuracy"] for r in rs.values()]))
                   if any(np.isfinite(r["target_accuracy"]) for r in rs.values()) else math.nan,
                   "label_accuracy": float(np.nanmean([r["label_accuracy"] for r in rs.values()]))
                   if any(np.isfinite(r["label_accuracy"]) for r in rs.values()) else 1.0,
                   "groups_trained": float(np.mean([r["groups_trained"] for r in rs.values()]))}
            if arm != weak and weak in final:
                seeds = sorted(set(final[arm]) & set(final[weak]))
                if len(seeds) >= 2:
                    iv = paired_bootstrap_interval(np.array([final[arm][s] for s in seeds]),
                                                   np.array([final[weak][s] for s in seeds]), random_state=0)
                    row.update(delta=iv.estimate, delta_low=iv.low, delta_high=iv.high)
            if arm == CLEAN:
                row.update(ratio=1.0, ratio_low=1.0, ratio_high=1.0, reached=f"{len(rs)}/{len(rs)}")
            elif arm in eff and eff[arm].rollouts is not None:
                r = eff[arm].rollouts
                row.update(ratio=r.estimate, ratio_low=r.low, ratio_high=r.high, bound=r.bound,
                           reached=f"{int(eff[arm].reached.sum())}/{len(eff[arm].seeds)}")
            rows.append(row)
    order = {a: i for i, a in enumerate(["labelled-only", "ttrl", "trapo", "full", "no refinement", "olr",
                                         "clean labels"])}
    rows.sort(key=lambda x: (x["matrix"], order.get(x["arm"], 9)))
    return rows


def _f(x, fmt="{:.3f}"):
    return "–" if x is None or (isinstance(x, float) and not math.isfinite(x)) else fmt.format(x)


def markdown(rows: list[dict], args) -> str:
    head = ["matrix", "arm", "seeds", "final acc", "Δ final vs weak baseline [95% CI]",
            f"rollouts to {args.fraction:.0%} of clean gain / clean [95% CI]", "reached",
            "target acc (vs truth)", "training-label acc", "groups trained / step"]
    out = [f"task `{args.task}`, {args.steps} steps × {args.batch_prompts} prompts × {args.group_size} rollouts, "
           f"final = mean of the last {args.tail} evaluations; A: labeled_fraction=0.1, B: label_noise=0.3\n",
           "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        weak = r["arm"] == WEAK[r["matrix"]]
        delta = "(baseline)" if weak else (f"{_f(r['delta'], '{:+.3f}')} [{_f(r['delta_low'], '{:+.3f}')}, "
                                           f"{_f(r['delta_high'], '{:+.3f}')}]")
        ratio = "1.00×" if r["arm"] in (CLEAN, "clean labels") else (
            f"{r['bound']}{_f(r['ratio'], '{:.2f}')}× [{_f(r['ratio_low'], '{:.2f}')}, {_f(r['ratio_high'], '{:.2f}')}]")
        out.append("| " + " | ".join([r["matrix"], r["arm"], str(r["seeds"]), _f(r["final"]), delta, ratio,
                                      r["reached"] or "–", _f(r["target_accuracy"], "{:.2f}"),
                                      _f(r["label_accuracy"], "{:.2f}"), _f(r["groups_trained"], "{:.1f}")]) + " |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", default="embedded", help="trainer task set (embedded, mostly_solved, ...)")
    ap.add_argument("--arms", default=",".join(ARMS), help=f"comma list of {', '.join(ARMS)}")
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--batch-prompts", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--heldout", type=int, default=64)
    ap.add_argument("--train-per-domain", type=int, default=20)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--fraction", type=float, default=0.8)
    ap.add_argument("--tail", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--out", default="runs/bench/supervision")
    args = ap.parse_args(argv)
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    bad = [a for a in arms if a not in ARMS]
    if bad:
        ap.error(f"--arms: unknown {bad}; choose from {', '.join(ARMS)}")
    for a in list(arms):
        why = available(a)
        if why:
            print(f"supervision: arm {a!r} skipped — {why}", flush=True)
            arms.remove(a)
    seeds = list(range(args.seeds))
    t0 = time.perf_counter()
    from rlpace.tasks import make_taskset
    from rlpace.train.recipes.grpo import base_policy
    for s in seeds:                               # bases first: parallel runs never race on them
        c = run_config(CLEAN, s, args)
        base_policy(c, make_taskset(c.tasks, train_per_domain=c.train_per_domain,
                                    heldout_per_domain=c.heldout_per_domain, seed=c.seed), progress=False)
    # seed-major: an interrupted run leaves whole seeds, which a rerun with fewer --seeds tabulates
    cfgs = {(a, s): run_config(a, s, args) for s in seeds for a in arms}
    with ProcessPoolExecutor(max_workers=args.jobs) as ex:
        list(ex.map(_run_one, [c.to_dict() for c in cfgs.values()]))
    runs: dict = {a: {} for a in arms}
    for (a, s), c in cfgs.items():
        runs[a][s] = read_run(c.out)
    rows = rows_for(runs, args.tail, args.fraction)
    out = Path(args.out) / args.task
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "supervision.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    md = markdown(rows, args)
    (out / "supervision.md").write_text(md)
    print(md)
    print(f"supervision: {len(cfgs)} runs in {time.perf_counter() - t0:.0f} s; {out / 'supervision.md'}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
