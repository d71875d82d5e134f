"""Predict what adaptive scheduling saves on your setup, and which policy, from a short pilot.

    rlpace advise --pilot pilot.jsonl --pool train.parquet --budget-rollouts 400000

The pilot is a record written by `rlpace.advise.PilotRecorder` (a few steps of uniform
training: prompt ids, rewards [B, G], rollouts spent), or an `rlpace select` manifest (a
zero-training profile: weaker). rlpace fits its simulator's learner to it, simulates
uniform, the oracle and each candidate policy for the rest of the budget on learners drawn
from the fit, prints a table and one sentence, and writes advice.json and advice.html.
docs/advise.md has the method and its validation.
"""

from __future__ import annotations

import sys


def add_arguments(p) -> None:
    p.add_argument("--pilot", required=True, help="pilot record (.jsonl), or an `rlpace select` manifest (.json)")
    p.add_argument("--pool", required=True, help="the prompts the pilot ran on: verl-schema parquet or JSONL")
    p.add_argument("--budget-rollouts", type=int, required=True,
                   help="the whole run's rollout budget, the pilot's rollouts included")
    p.add_argument("--policies", default="",
                   help="comma list of candidates (default: recommended, every proposal and admission policy)")
    p.add_argument("--draws", type=int, default=8, help="learners drawn from the fit's posterior (first: the MAP)")
    p.add_argument("--seeds", type=int, default=1, help="simulated runs per draw")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=1, help="worker processes (one draw each at a time)")
    p.add_argument("--out", default=".", help="folder for advice.json and advice.html")


def run(args) -> int:
    from ..advise._advice import advise, load_pool, usage_lines, write_advice
    from ..errors import InputError
    for name in ("draws", "seeds", "jobs"):
        if getattr(args, name) < 1:
            raise InputError(f"--{name} must be ≥ 1; got {getattr(args, name)}.")
    pols = [p.strip() for p in args.policies.split(",") if p.strip()] or None
    if pols:
        from ..policies import names
        unknown = [p for p in pols if p not in names() and "+" not in p]
        if unknown:
            raise InputError(f"--policies: unknown {unknown}; see `rlpace policies`.")
    adv = advise(args.pilot, load_pool(args.pool), budget_rollouts=args.budget_rollouts, policies=pols,
                 draws=args.draws, seeds=args.seeds, seed=args.seed, jobs=args.jobs,
                 progress=lambda s: print(f"rlpace advise: {s}", file=sys.stderr, flush=True))
    print(adv.table())
    print()
    print(adv.sentence)
    for engine, line in usage_lines(adv.recommended or "uniform").items():
        print(f"  {engine}: {line}")
    j, h = write_advice(adv, args.out)
    print(f"wrote {j} and {h} (fit + prediction {adv.prediction.seconds:.0f} s)")
    return 0
