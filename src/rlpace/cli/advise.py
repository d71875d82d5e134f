"""Predict what adaptive scheduling saves on your setup, and which policy, from a short pilot.

    rlpace advise --pilot pilot.jsonl --pool train.parquet --budget-rollouts 400000
    rlpace advise tasks=ladder steps=300                  # runs the pilot on the built-in trainer
    rlpace advise --from-run runs/train                   # re-profiles a run from its own record

The pilot is a record written by `rlpace.advise.PilotRecorder` (a few steps of uniform
training: prompt ids, rewards [B, G], rollouts spent; the built-in trainer writes it with
`record=PATH`), or an `rlpace select` manifest (a zero-training profile: weaker). With
`key=value` trainer fields instead, advise runs the pilot itself: the first 20 % of the
steps (`--pilot-share`) on the built-in trainer, policy uniform unless `policy=` says
otherwise, into out/pilot/. `--from-run DIR` reads a run's own record: has held-out accuracy
plateaued, and would switching policy pay for the rest of the budget? rlpace fits its
simulator's learner to the pilot, simulates uniform, the oracle and each candidate policy for
the rest of the budget on learners drawn from the fit, prints a table and one sentence, and
writes advice.json and advice.html. docs/advise.md has the method and its validation.
"""

from __future__ import annotations

import os
import sys


def add_arguments(p) -> None:
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="built-in trainer fields (see `rlpace train --help`): advise runs the pilot itself")
    p.add_argument("--pilot", default="", help="pilot record (.jsonl), or an `rlpace select` manifest (.json)")
    p.add_argument("--pool", default="", help="the prompts the pilot ran on: verl-schema parquet or JSONL")
    p.add_argument("--from-run", default="", metavar="DIR",
                   help="a built-in trainer run (its out= folder, run with record=PATH): re-profile it")
    p.add_argument("--budget-rollouts", type=int, default=0,
                   help="the whole run's rollout budget, the pilot's rollouts included (with key=value or "
                        "--from-run: default max_rollouts, else steps × batch_prompts × group_size)")
    p.add_argument("--pilot-share", type=float, default=0.2, help="with key=value: the pilot's share of the steps")
    p.add_argument("--policies", default="",
                   help="comma list of candidates (default: recommended, every proposal and admission policy)")
    p.add_argument("--draws", type=int, default=8, help="learners drawn from the fit's posterior (first: the MAP)")
    p.add_argument("--seeds", type=int, default=1, help="simulated runs per draw")
    p.add_argument("--measurement-seeds", type=int, default=0, metavar="M",
                   help="make each 90 %% interval the one for a measurement over M seeds (e.g. the 8 of a "
                        "headroom table; needs --seeds 2 or more); default: for a --seeds-seed measurement")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                   help="worker processes (one draw each at a time; default 2, or 1 on one core)")
    p.add_argument("--heldout-eval", default="auto", choices=["auto", "sampled", "greedy"],
                   help="what your held-out accuracy measures: the mean pass rate (sampled), the share of prompts "
                        "answered right by greedy decoding (greedy), or auto: the one that predicts the pilot's own "
                        "evaluations better (sampled without two of them). The built-in trainer's is greedy.")
    p.add_argument("--saving-level", type=float, default=None, metavar="P",
                   help="recommend a switch only when the least-regret policy saves more than 10 %% on at least "
                        "this share of the fit's draws (default 0.3; docs/advise.md, section 3)")
    p.add_argument("--out", default=".", help="folder for advice.json and advice.html")


def run(args) -> int:
    from ..advise._advice import SAVING_LEVEL, advise, check_level, load_pool, usage_lines, write_advice
    from ..advise._predict import check_prediction_args
    from ..errors import InputError
    pols = [p.strip() for p in args.policies.split(",") if p.strip()] or None
    # every prediction argument, before a trainer pilot runs (advise() checks them again, in the same place)
    check_prediction_args(draws=args.draws, seeds=args.seeds, jobs=args.jobs, heldout_eval=args.heldout_eval,
                          measurement_seeds=args.measurement_seeds or None, policies=pols)
    level = SAVING_LEVEL if args.saving_level is None else args.saving_level
    check_level(level)
    if args.budget_rollouts < 0:
        raise InputError(f"--budget-rollouts must be a positive integer; got {args.budget_rollouts}.")
    modes = [m for m, on in (("--pilot", bool(args.pilot or args.pool)), ("key=value", bool(args.overrides)),
                             ("--from-run", bool(args.from_run))) if on]
    if len(modes) != 1:
        raise InputError("give one pilot: --pilot FILE --pool FILE --budget-rollouts N, or trainer fields "
                         "(e.g. tasks=ladder steps=300) to run it, or --from-run DIR"
                         + (f"; got {' and '.join(modes)}." if modes else "."))
    say = lambda s: print(f"rlpace advise: {s}", file=sys.stderr, flush=True)     # noqa: E731
    kw = dict(policies=pols, draws=args.draws, seeds=args.seeds, seed=args.seed, jobs=args.jobs, progress=say,
              heldout_eval=args.heldout_eval, measurement_seeds=args.measurement_seeds or None, level=level)
    if args.heldout_eval == "auto" and (args.overrides or args.from_run):
        kw["heldout_eval"] = "greedy"                # the built-in trainer evaluates greedily
    state = None
    if args.overrides:
        from ..advise._trainer import pilot_on_trainer, pilot_plan
        from ..train import TrainConfig, from_overrides
        from ..train.recipes.grpo import check_config
        cfg = from_overrides(list(args.overrides), TrainConfig())
        pcfg, _ = pilot_plan(cfg, args.pilot_share, args.budget_rollouts)      # checks before any work
        check_config(pcfg)
        say(f"pilot: {pcfg.steps} steps of policy={pcfg.policy} into {pcfg.out}")
        pilot, pool, budget = pilot_on_trainer(cfg, args.pilot_share, args.budget_rollouts)
    elif args.from_run:
        from ..advise._trainer import profile_run
        pilot, pool, budget, state = profile_run(args.from_run, args.budget_rollouts)
    else:
        if not (args.pilot and args.pool and args.budget_rollouts):
            raise InputError("--pilot needs --pool (the prompts it ran on) and --budget-rollouts N.")
        pilot, pool, budget = args.pilot, load_pool(args.pool), args.budget_rollouts
    adv = advise(pilot, pool, budget_rollouts=budget, **kw)
    print(adv.table())
    print()
    if state is not None:
        print(f"training {'has plateaued' if state.plateaued else 'is still improving'}: held-out accuracy "
              f"{state.gain:+.3f} since the start, {state.late_gain:+.3f} over the last half of the rollouts "
              f"({state.evals} evaluations)")
    elif args.from_run:
        print("plateau: unknown (the record holds fewer than 3 held-out evaluations)")
    print(("switch now: " if args.from_run else "") + adv.sentence)
    for engine, line in usage_lines(adv.recommended or "uniform").items():
        print(f"  {engine}: {line}")
    j, h = write_advice(adv, args.out)
    print(f"wrote {j} and {h} (fit + prediction {adv.prediction.seconds:.0f} s)")
    return 0
