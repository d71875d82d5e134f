"""Run policies on the synthetic learner (rlpace.sim) and compare them with uniform.

Example:
    rlpace simulate --scenario ladder --policy dump,sec,mopps --steps 600 --seed 0,1,2
    rlpace simulate --scenario homogeneous --policy dump temperature=0.5 --json runs/h.json
    rlpace simulate --policy all --set prompts_per_domain=83334      # 10^6 prompts

Trailing `key=value` arguments are policy hyperparameters: `key=value` goes to every
policy listed (each must accept it), `name.key=value` to that policy only. `--set
key=value` overrides a Scenario field. Without `--no-baseline`, uniform is run too and
every policy's steps-to-target is shown next to uniform's.
"""

from __future__ import annotations

from ..errors import InputError
import json
import sys
import time

import numpy as np


def add_arguments(parser) -> None:
    import argparse
    import textwrap

    from rlpace.sim import SCENARIOS
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    scen = "\n".join(textwrap.fill(f"{n}: {sc.description}", 88, initial_indent="  ", subsequent_indent="    ")
                     for n, sc in sorted(SCENARIOS.items()))
    parser.epilog = __doc__.split("\n\n", 1)[1] + "\nScenarios:\n" + scen
    parser.add_argument("--scenario", default="ladder", choices=sorted(SCENARIOS),
                        help="named scenario (rlpace.sim.SCENARIOS); default ladder")
    parser.add_argument("--policy", default="dump",
                        help="policy name, a comma list, 'proposal' (every proposal policy) or 'all' "
                             "(every registered name); default dump")
    parser.add_argument("--steps", type=int, default=600, help="training steps per run (default 600)")
    parser.add_argument("--seed", default="0", help="seed, or a comma list of seeds (default 0)")
    parser.add_argument("--batch-size", type=int, default=128, help="prompts per batch B (default 128)")
    parser.add_argument("--group-size", type=int, default=16, help="rollouts per prompt G (default 16)")
    parser.add_argument("--eval-every", type=int, default=10, help="held-out evaluation period (default 10)")
    parser.add_argument("--target", type=float, default=None,
                        help="held-out mean accuracy for steps-to-target (default: the scenario's)")
    parser.add_argument("--weight-norm", default="informative", choices=["informative", "none"],
                        help="loss-weight scaling in the learner (see rlpace.sim; default informative)")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="override a Scenario field, e.g. --set prompts_per_domain=83334 (repeatable)")
    parser.add_argument("--json", metavar="FILE", help="write every run record and the summary as JSON")
    parser.add_argument("--no-baseline", action="store_true", help="do not add uniform when it is not listed")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("kwargs", nargs="*", metavar="[POLICY.]KEY=VALUE", help="policy hyperparameters")


def _value(text: str):
    """A KEY=VALUE value: JSON or Hydra's flow style (rlpace._flow, the one parser of policy
    arguments), else the text itself (temperature=0.5, floors=[0.05,0.1], base=pool)."""
    from rlpace._flow import parse_value
    try:
        return parse_value(text)
    except InputError:
        return text


def _pairs(items, what):
    out = []
    for item in items:
        if "=" not in item:
            raise InputError(f"{what} {item!r} is not KEY=VALUE.")
        key, _, val = item.partition("=")
        out.append((key.strip(), _value(val.strip())))
    return out


def _policy_list(spec: str) -> list[str]:
    from rlpace.policies import names
    from rlpace.sim import proposal_names
    out = []
    for part in [p.strip() for p in spec.split(",") if p.strip()]:
        if part == "all":
            out += names()
        elif part == "proposal":
            out += proposal_names()
        else:
            out.append(part)
    out = list(dict.fromkeys(out))
    return (["uniform"] + [n for n in out if n != "uniform"]) if "uniform" in out else out


def _fmt_int(x) -> str:
    return "—" if x is None else f"{int(x):,}"


def summarize(results: dict, target: float) -> list[dict]:
    """One row per policy: mean over seeds of the accuracy curve, steps and rollouts to
    target (None when any seed missed it), informative fraction, rollouts spent."""
    rows = []
    base = results.get("uniform")
    base_steps = _mean_reached([r.steps_to_target for r in base]) if base else None
    for name, runs in results.items():
        steps = _mean_reached([r.steps_to_target for r in runs])
        rolls = _mean_reached([r.rollouts_to_target for r in runs])
        rows.append({
            "policy": name,
            "seeds": [r.seed for r in runs],
            "steps_to_target": steps,
            "steps_to_target_per_seed": [r.steps_to_target for r in runs],
            "vs_uniform": None if steps is None or not base_steps else steps / base_steps,
            "rollouts_to_target": rolls,
            "final_accuracy": float(np.mean([r.final_accuracy for r in runs])),
            "informative_fraction": float(np.mean([r.informative_fraction.mean() for r in runs])),
            "rollouts": float(np.mean([r.rollouts[-1] if r.rollouts.size else 0 for r in runs])),
            "eval_step": runs[0].eval_step.tolist(),
            "mean_accuracy": np.mean([r.mean_accuracy for r in runs], axis=0).tolist(),
        })
    return rows


def _mean_reached(values):
    return None if any(v is None for v in values) or not values else float(np.mean(values))


def print_summary(rows: list[dict], scenario, args, target: float, out=None) -> None:
    out = sys.stdout if out is None else out   # resolved per call: sys.stdout may be swapped
    steps = rows[0]["eval_step"]
    marks = sorted({0, steps[-1]} | {steps[int(round(f * (len(steps) - 1)))] for f in (0.25, 0.5, 0.75)})
    seeds = rows[0]["seeds"]
    print(f"\nscenario {scenario.name}: {scenario.n_domains} domains, "
          f"{scenario.n_domains * scenario.prompts_per_domain:,} prompts; B={args.batch_size}, "
          f"G={args.group_size}, target {target:.2f}, seeds {','.join(map(str, seeds))}"
          + (" (means over seeds)" if len(seeds) > 1 else ""), file=out)
    head = f"{'policy':26s}" + "".join(f"{'acc@' + str(s):>9s}" for s in marks) + \
        f"{'steps→tgt':>11s}{'×uniform':>9s}{'rollouts→tgt':>14s}{'informative':>12s}{'rollouts':>13s}"
    print(head, file=out)
    print("-" * len(head), file=out)
    for r in rows:
        acc = dict(zip(r["eval_step"], r["mean_accuracy"]))
        cells = "".join(f"{acc.get(s, float('nan')):9.3f}" for s in marks)
        st = "—" if r["steps_to_target"] is None else f"{r['steps_to_target']:.0f}"
        vs = "—" if r["vs_uniform"] is None else f"{r['vs_uniform']:.2f}"
        print(f"{r['policy']:26s}{cells}{st:>11s}{vs:>9s}{_fmt_int(r['rollouts_to_target']):>14s}"
              f"{r['informative_fraction']:12.3f}{_fmt_int(r['rollouts']):>13s}", file=out)
    print("steps→tgt: first evaluated step with held-out mean accuracy ≥ target (— = not reached by "
          "every seed); ×uniform < 1 means fewer steps than uniform; informative: share of generated "
          "groups with non-zero advantage; rollouts include refills.", file=out)


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in str(text).split(",") if s.strip()]
    except ValueError:
        raise InputError(f"--seed {text!r} is not an integer or a comma list of integers "
                         f"(e.g. --seed 0,1,2).") from None
    if not seeds:
        raise InputError(f"--seed {text!r} names no seed; give an integer or a comma list (e.g. --seed 0,1,2).")
    return seeds


def _check_policies(names, per_policy) -> None:
    """Build every policy with its hyperparameters before any run starts: an unknown name
    or a bad value fails here, not after uniform already ran."""
    from rlpace.policies import make_method
    for name in names:
        try:
            make_method(name, **per_policy[name])
        except TypeError as e:   # a value of the wrong type (temperature=abc) reaching a factory
            raise InputError(f"{name}: a hyperparameter has the wrong type ({e}); "
                             f"given {per_policy[name]} (numbers are written e.g. temperature=0.5).") from None
        except InputError as e:
            raise InputError(f"{name}: {e}") from None


def run(args) -> int:
    from rlpace.sim import make_scenario, simulate

    from ._paths import check_output
    if args.json:
        check_output(args.json, "--json")      # before the runs, not after them
    overrides = dict(_pairs(args.set, "--set"))
    scenario = make_scenario(args.scenario, **overrides)
    seeds = _seeds(args.seed)
    names = _policy_list(args.policy)
    if not names:
        raise InputError(f"--policy {args.policy!r} names no policy; give a name from `rlpace policies`, "
                         f"a comma list, 'proposal' or 'all'.")
    if not args.no_baseline and "uniform" not in names:
        names = ["uniform"] + names
    kwargs = _pairs(args.kwargs, "policy argument")
    per_policy: dict[str, dict] = {n: {} for n in names}
    for key, val in kwargs:
        name, dot, k = key.rpartition(".")
        if dot and name in per_policy:
            per_policy[name][k] = val
        elif dot:
            raise InputError(f"{key!r} names policy {name!r}, which is not in --policy ({', '.join(names)}).")
        else:
            for n in names:
                if n != "uniform" or "uniform" in _policy_list(args.policy):
                    per_policy[n][key] = val
    _check_policies(names, per_policy)
    target = scenario.target if args.target is None else args.target
    results: dict[str, list] = {}
    records = []
    t0 = time.perf_counter()
    from ._notes import notes
    with notes("simulate"):   # a policy's warning (gfpo without lengths): one line, once
        for name in names:
            results[name] = []
            for seed in seeds:
                try:
                    res = simulate(scenario, name, steps=args.steps, seed=seed, batch_size=args.batch_size,
                                   group_size=args.group_size, eval_every=args.eval_every, target=target,
                                   policy_kwargs=per_policy[name], progress=not args.no_progress,
                                   weight_norm=args.weight_norm)
                except InputError as e:
                    raise InputError(f"{name}: {e}") from None
                results[name].append(res)
                records.append(res.to_record())
                if not args.no_progress:
                    print(f"  {name} seed {seed}: steps→target {res.steps_to_target}, final accuracy "
                          f"{res.final_accuracy:.3f} ({res.wall_s:.1f}s)", file=sys.stderr)
    rows = summarize(results, target)
    print_summary(rows, scenario, args, target)
    print(f"({len(records)} runs in {time.perf_counter() - t0:.1f}s)")
    if args.json:
        import os
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"scenario": scenario.name, "target": target, "summary": rows, "runs": records}, f, indent=1)
        print(f"wrote {args.json}")
    return 0
