"""Step time of the built-in GRPO recipe with and without per-rollout gradient features,
side by side in one run (not a timed test).

Configurations (same tiny base policy, tasks, B, G, seed; one torch thread each):

    plain     policy=uniform                      no features (the shared-prompt forward)
    features  policy=uniform grad_features=on     exact features computed, weights 1 (lm_head:
                                                  the shared-prompt forward + the first token's
                                                  share from its repeated logits; last_block/all:
                                                  per row)
    diem      policy=diem                         features → DIEM weights → weighted backward
    diem_shared  ... grad_exact=false               the shared-prompt forward, approximate features
    dvc       policy=dvc                          features → observe → EXP3.S mixture
    diem_ref  policy=diem importance=reference    + a held-out reference gradient every k steps
              grad_reference=heldout                (computed only for a policy that reads it)

Paired by step (the default). The configurations run in lockstep — one thread each, taking
turns step by step (plain's step k, features' step k, ..., then plain's step k + 1), the
order rotated by one every round — so drifts of a shared machine hit them alike. A
training run's step time depends on what was generated, and a reweighted policy soon
generates other lengths than plain GRPO's: over 20 steps that difference (±6 % between runs)
is larger than the overhead measured. So every run trains at
a learning rate of 1e-12 (`lr` must be > 0; a float32 weight of magnitude ≥ 1e-4 does not
move at that rate): the policy stays the base, and since prompts and samples derive from
(seed, step), every configuration whose mixture is uniform (all but dvc) draws the same
prompts and generates the same rollouts as plain at every step — checked, and printed as
"same batches". All the step computes is still done (features, weights, the weighted
backward, the optimizer step). Reported per configuration: the median over steps of the
paired difference of CPU time (`time.thread_time` of the training thread: what the step
computed, less the time a busy machine made it wait for a core) to plain's same step of the
same round, in ms and relative to plain's median step, with a 95 % bootstrap interval over
rounds (each round's median difference; rounds resampled); the mean difference (which, unlike
the median, counts work done every k steps, such as `diem_ref`'s held-out reference); and the
median step time. dvc draws its own prompts (its mixture is not uniform): its difference
is against other batches of the same policy, so it carries the length noise again.

`--moving` times real training instead (lr as configured), one run after the other in
alternating rounds (plain, features, diem, ..., plain, ...): the median step time, the
median loss/backward time (`train_seconds`) and the median CPU time, each relative to
`plain`, and each round's median CPU time against that round's plain (median and range).
The first `--skip` steps of every run are left out (warm-up).

`--synthetic H,L,V,P,T` instead times one loss forward + backward of a random Qwen2 (hidden
H, L layers, vocabulary V, P prompt and T completion tokens, B·G rows) without the trainer:
shared-prompt vs per-row forward, and the feature computation for each parameter subset in
both modes (plus `shared_exact_lm_head`: exact lm_head features over the shared-prompt forward)
— how the overhead scales beyond the tiny model.

Usage:
    python benchmarks/gradients.py                         # B = 16, G = 8, lm_head, d = 256, paired
    python benchmarks/gradients.py --moving --rounds 8     # step times of real training runs
    python benchmarks/gradients.py --steps 10 --rounds 2 --grad-params last_block
    python benchmarks/gradients.py --synthetic 256,4,4096,32,64 --batch-prompts 8
    python benchmarks/gradients.py --learning --seeds 3 --steps 60   # final accuracy vs uniform

`--learning` trains each of `LEARNING` for `--steps` steps on `--seeds` seeds (paired: the seed
sets the base policy, the Scheduler and the sampling) and reports the final held-out accuracy
(mean of the last 3 evaluations) and its paired difference to uniform, mean ± 1.96·s/√n over
seeds (a normal approximation: with a handful of seeds, read it as a rough interval).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import tempfile
from pathlib import Path

CONFIGS = {
    "plain": dict(policy="uniform", grad_features="off"),
    "features": dict(policy="uniform", grad_features="on", grad_reference="none"),
    "diem": dict(policy="diem", grad_reference="none"),
    "diem_shared": dict(policy="diem", grad_reference="none", grad_exact=False),
    "dvc": dict(policy="dvc", grad_reference="none"),
    "diem_ref": dict(policy="diem", policy_kwargs='{"importance": "reference"}', grad_reference="heldout"),
}


LEARNING = {
    "uniform": dict(policy="uniform"),
    "diem_batch": dict(policy="diem", grad_reference="none"),            # the default: the published rule
    "diem_loo": dict(policy="diem", policy_kwargs='{"importance": "loo", "ridge": 1e-3}', grad_reference="none"),
    "diem_reference": dict(policy="diem", policy_kwargs='{"importance": "reference", "ridge": 1e-3}'),
    "diem_loo_ridge1": dict(policy="diem", policy_kwargs='{"importance": "loo", "ridge": 1.0}',
                            grad_reference="none"),
    "diem_loo_softmax": dict(policy="diem", policy_kwargs='{"importance": "loo", "solver": "softmax"}',
                             grad_reference="none"),
    "dvc": dict(policy="dvc"),
    "dvc_reward": dict(policy="dvc", policy_kwargs='{"signal": "reward"}'),
    "dvc_swucb": dict(policy="dvc", policy_kwargs='{"bandit": "swucb", "window": 20}'),
}


def learning(base, names, seeds: int, steps: int, seed0: int = 0) -> dict:
    """Final accuracy of each configuration and its paired difference to uniform (module docstring)."""
    import numpy as np

    from rlpace.train import train
    final = {n: [] for n in names}
    for seed in range(seed0, seed0 + seeds):
        for n in names:
            out = Path(tempfile.mkdtemp(prefix=f"rlpace-learn-{n}-{seed}-"))
            summary = train(dataclasses.replace(base, out=str(out), steps=steps, seed=seed, eval_every=10,
                                                **LEARNING[n]))
            shutil.rmtree(out, ignore_errors=True)
            accs = [c["mean"] for c in summary["curve"]]
            final[n].append(float(np.mean(accs[-3:])))
    print(f"final held-out accuracy after {steps} steps, seeds {seed0}..{seed0 + seeds - 1} (paired by seed)")
    print(f"{'config':<16} {'accuracy':>9} {'vs uniform':>22}")
    rows = {}
    for n in names:
        acc = np.array(final[n])
        d = acc - np.array(final["uniform"])
        half = 1.96 * d.std(ddof=1) / np.sqrt(len(d)) if len(d) > 1 else float("nan")
        rows[n] = {"final": acc.tolist(), "mean": float(acc.mean()), "diff": float(d.mean()), "half_ci": float(half)}
        print(f"{n:<16} {acc.mean():9.3f} {d.mean():+10.3f} ± {half:.3f}")
    return {"steps": steps, "seeds": list(range(seed0, seed0 + seeds)), "rows": rows}


def run_once(base, name: str, steps: int, skip: int) -> tuple[list[float], list[float], list[float], list]:
    """Wall seconds, train_seconds and CPU seconds of this thread (`time.thread_time`) of each
    step after the first `skip`, and each step's batch (its prompt ids and generated token
    count: what pairs two runs' steps). CPU time is read at every step record the trainer logs: the
    difference of two consecutive reads is everything step k did. With one torch thread it
    equals the wall time on an idle machine, and on a shared one it leaves out the time spent
    waiting for a core."""
    import time

    from rlpace.train import train
    from rlpace.train.recipes import grpo
    from rlpace.train.report import load_run
    out = Path(tempfile.mkdtemp(prefix=f"rlpace-grad-{name}-"))
    cfg = dataclasses.replace(base, out=str(out), steps=steps + skip, **CONFIGS[name])
    stamps, logger = [], grpo.StepLogger

    class Stamped(logger):
        def __call__(self, rec):
            if not rec.get("final"):
                stamps.append(time.thread_time())
            return super().__call__(rec)

    grpo.StepLogger = Stamped
    try:
        train(cfg)
    finally:
        grpo.StepLogger = logger
    recs = load_run(out)
    shutil.rmtree(out, ignore_errors=True)                  # the run's checkpoint: not needed here
    recs = [r for r in recs if not r.get("final")][skip:]
    cpu = [b - a for a, b in zip(stamps, stamps[1:])][max(skip, 1) - 1:]     # steps max(skip, 1)..
    return ([r["seconds"] for r in recs], [r["train_seconds"] for r in recs], cpu,
            [(tuple(r["prompt_ids"]), r["tokens"]) for r in recs])


def lockstep(base, names: list[str], steps: int, skip: int) -> dict:
    """One training run per configuration, in threads that take turns step by step (plain's
    step k, then features' step k, ... then plain's step k + 1): steps of the same index run
    within a few tens of ms of each other, so drifts of a shared machine (another process
    waking up, the clock) hit them alike; `paired_steps` rotates the order between rounds, so
    what a step inherits from the one before it (caches) is shared out too. Only the thread whose turn it is computes (the
    others wait on a condition; torch runs one thread). Returns, per configuration, each
    step's CPU time of its thread (`time.thread_time`) and batch (prompt ids, tokens), the
    first `skip` steps left out."""
    import threading
    import time

    from rlpace.train import train
    from rlpace.train.recipes import grpo
    from rlpace.train.report import load_run

    turn = {"i": 0, "active": list(range(len(names)))}
    cond = threading.Condition()
    stamps = {n: [] for n in names}
    local = threading.local()

    class Lockstep(grpo.StepLogger):
        def __call__(self, rec):
            out = super().__call__(rec)
            if rec.get("final"):
                return out
            i = local.index
            stamps[names[i]].append(time.thread_time())
            with cond:
                last = len(stamps[names[i]]) == steps + skip
                order = turn["active"]
                nxt = order[(order.index(i) + 1) % len(order)]
                if last:
                    order.remove(i)
                turn["i"] = nxt if order else -1
                cond.notify_all()
                if not last:
                    cond.wait_for(lambda: turn["i"] == i)
            return out

    outs = {n: Path(tempfile.mkdtemp(prefix=f"rlpace-grad-{n}-")) for n in names}
    errors = []

    def run(i, n):
        local.index = i
        try:
            with cond:                  # step 0 starts in turn too
                cond.wait_for(lambda: turn["i"] == i)
            train(dataclasses.replace(base, out=str(outs[n]), steps=steps + skip, **CONFIGS[n]))
        except BaseException as e:      # noqa: BLE001 — reported after the join
            errors.append((n, e))
            with cond:
                if i in turn["active"]:
                    turn["active"].remove(i)
                turn["i"] = turn["active"][0] if turn["active"] else -1
                cond.notify_all()

    real = grpo.StepLogger
    grpo.StepLogger = Lockstep
    try:
        threads = [threading.Thread(target=run, args=(i, n)) for i, n in enumerate(names)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        grpo.StepLogger = real
    if errors:
        raise RuntimeError(f"{errors[0][0]}: {errors[0][1]!r}")
    result = {}
    for n in names:
        recs = load_run(outs[n])
        shutil.rmtree(outs[n], ignore_errors=True)
        recs = [r for r in recs if not r.get("final")]
        st = stamps[n]
        # step k's CPU time: from the stamp of step k − 1 (when its turn began is after that
        # stamp, and waiting costs no CPU) to the stamp of step k
        cpu = [b - a for a, b in zip(st, st[1:])][skip - 1 if skip else 0:]
        batches = [(tuple(r["prompt_ids"]), r["tokens"]) for r in recs][max(skip, 1):]
        result[n] = (cpu, batches, [r["seconds"] for r in recs][max(skip, 1):])
    return result


def paired_steps(base, names: list[str], rounds: int, steps: int, skip: int, seed: int = 0) -> dict:
    """Per-step paired CPU-time differences to plain at a frozen policy, configurations in
    lockstep (module docstring)."""
    import numpy as np

    base = dataclasses.replace(base, lr=1e-12)
    ref = "plain"
    runs = {n: [] for n in names}                     # per round: (cpu, batches, wall)
    for k in range(rounds):                           # the turn order rotates by one each round
        order = names[k % len(names):] + names[:k % len(names)]
        for n, r in lockstep(base, order, steps, skip).items():
            runs[n].append(r)
    plain_cpu = float(np.median([c for r in runs[ref] for c in r[0]]))
    rng = np.random.default_rng(seed)
    print(f"paired by step at a frozen policy (lr = 1e-12), configurations in lockstep; {rounds} rounds × "
          f"{steps} steps; plain step {1e3 * plain_cpu:.2f} ms CPU (median)")
    print(f"{'config':<12} {'Δ ms/step':>10} {'vs plain':>9} {'95 % CI (rounds)':>20} {'mean Δ':>8} {'step ms':>8} "
          f"{'same batches':>13}")
    result = {"plain_cpu_s": plain_cpu, "rows": {}}
    for n in names:
        diffs, round_meds, same = [], [], True
        for mine, theirs in zip(runs[n], runs[ref]):
            d = np.array(mine[0]) - np.array(theirs[0])
            diffs += d.tolist()
            round_meds.append(float(np.median(d)))
            same &= mine[1] == theirs[1]
        med = float(np.median(diffs))
        boot = [np.median(rng.choice(round_meds, len(round_meds))) for _ in range(2000)]
        lo, hi = np.percentile(boot, [2.5, 97.5]) if len(round_meds) > 1 else (float("nan"),) * 2
        step = float(np.median([c for r in runs[n] for c in r[0]]))
        mean = float(np.mean(diffs))           # counts what runs every k steps (a held-out reference)
        result["rows"][n] = {"median_diff_s": med, "overhead": med / plain_cpu, "ci": [lo / plain_cpu, hi / plain_cpu],
                             "mean_overhead": mean / plain_cpu, "round_diffs_s": round_meds, "median_cpu_s": step,
                             "same_batches": bool(same)}
        print(f"{n:<12} {1e3 * med:+10.2f} {100 * med / plain_cpu:+8.1f}% "
              f"{f'[{100 * lo / plain_cpu:+.1f}%, {100 * hi / plain_cpu:+.1f}%]':>20} {100 * mean / plain_cpu:+7.1f}% "
              f"{1e3 * step:8.2f} {'yes' if same else 'no':>13}")
    return result


def synthetic(spec: str, b: int, g: int, grad_dim: int, repeats: int = 3) -> dict:
    """Median seconds of one loss forward + backward (module docstring, `--synthetic`)."""
    import time

    import numpy as np
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlpace.train.gradfeatures import FirstToken, GradFeatures
    from rlpace.train.losses import policy_loss
    from rlpace.train.rollout import Rollout, completion_logprobs

    torch.set_num_threads(1)
    h, layers, v, p, t = (int(x) for x in spec.split(","))
    cfg = Qwen2Config(vocab_size=v, hidden_size=h, intermediate_size=4 * h, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=p + t + 8,
                      tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).train()
    n = b * g
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, v, (b, p), generator=gen).repeat_interleave(g, 0)
    ro = Rollout(prompts, torch.ones(n, p, dtype=torch.long), torch.randint(3, v, (n, t), generator=gen),
                 torch.ones(n, t))
    adv, keep = torch.randn(n, generator=gen), torch.ones(n)

    def step(group, gf=None, exact_head=False):
        model.zero_grad(set_to_none=True)
        ctx = gf.capture() if gf is not None else _null()
        with ctx:
            lp, z0 = completion_logprobs(model, ro, 1.0, group, first_logits=True)
            loss = policy_loss("grpo", lp, lp.detach(), adv, ro.completion_mask, keep).loss
        if gf is not None and exact_head:
            gf.features(loss, n, first_token=FirstToken(z0))
        elif gf is not None:
            gf.features(loss, n, shared_prefix=group > 1)
        loss.backward()

    def timed(fn):
        fn()
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return float(np.median(ts))

    rows = {"shared": timed(lambda: step(g)), "per_row": timed(lambda: step(1))}
    for gp in ("lm_head", "last_block", "all"):
        gf = GradFeatures(model, gp, grad_dim)
        rows[f"exact_{gp}"] = timed(lambda: step(1, gf))
        rows[f"shared_{gp}"] = timed(lambda: step(g, gf))
        if gp == "lm_head":
            rows["shared_exact_lm_head"] = timed(lambda: step(g, gf, True))
    print(f"synthetic Qwen2 H={h} L={layers} V={v} P={p} T={t}, N={n} rows, d≤{grad_dim} "
          f"({repeats} repeats, median)")
    for k, sec in rows.items():
        print(f"  {k:<18} {sec:8.3f} s  {100 * (sec / rows['shared'] - 1):+6.1f}% vs shared")
    return {"spec": spec, "rows": rows}


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=10, help="timed steps per run")
    ap.add_argument("--skip", type=int, default=2, help="warm-up steps left out of each run")
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds over the configurations")
    ap.add_argument("--batch-prompts", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--grad-params", default="lm_head", choices=["lm_head", "last_block", "all"])
    ap.add_argument("--grad-dim", type=int, default=256)
    ap.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated subset of " + ",".join(CONFIGS))
    ap.add_argument("--out", default="", help="write the figures as JSON here")
    ap.add_argument("--synthetic", default="", help="H,L,V,P,T: time a random Qwen2's loss step instead")
    ap.add_argument("--repeats", type=int, default=3, help="--synthetic: timed repeats per row (median)")
    ap.add_argument("--learning", action="store_true", help="final accuracy vs uniform instead of step time")
    ap.add_argument("--moving", action="store_true",
                    help="time real training runs (the policy moves) instead of paired steps at a frozen policy")
    ap.add_argument("--seeds", type=int, default=3, help="--learning: seeds (paired)")
    ap.add_argument("--seed0", type=int, default=0, help="--learning: first seed")
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.learning:
        from rlpace.train import TrainConfig
        names = [n.strip() for n in args.configs.split(",") if n.strip()] if args.configs != ",".join(CONFIGS) \
            else list(LEARNING)
        base = TrainConfig(batch_prompts=args.batch_prompts, group_size=args.group_size, checkpoint_every=0,
                           progress=False, threads=1, grad_params=args.grad_params, grad_dim=args.grad_dim)
        result = learning(base, ["uniform"] + [n for n in names if n != "uniform"], args.seeds, args.steps,
                          args.seed0)
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=1))
        return result
    if args.synthetic:
        result = synthetic(args.synthetic, args.batch_prompts, args.group_size, args.grad_dim, args.repeats)
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=1))
        return result

    from rlpace.train import TrainConfig
    base = TrainConfig(batch_prompts=args.batch_prompts, group_size=args.group_size, eval_every=10**9,
                       checkpoint_every=0, progress=False, threads=1, grad_params=args.grad_params,
                       grad_dim=args.grad_dim)
    names = [n.strip() for n in args.configs.split(",") if n.strip()]
    if not args.moving:
        names = ["plain"] + [n for n in names if n != "plain"]
        result = paired_steps(base, names, args.rounds, args.steps, args.skip)
        result["config"] = {k: v for k, v in vars(args).items() if k != "out"}
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=1))
        return result
    step_s = {n: [] for n in names}
    train_s = {n: [] for n in names}
    cpu_s = {n: [] for n in names}
    round_s = {n: [] for n in names}                 # each round's median step CPU time
    for _ in range(args.rounds):
        for n in names:
            s, t, c, _ = run_once(base, n, args.steps, args.skip)
            step_s[n] += s
            train_s[n] += t
            cpu_s[n] += c
            round_s[n].append(statistics.median(c))
    ref = "plain" if "plain" in names else names[0]
    med = {n: (statistics.median(step_s[n]), statistics.median(train_s[n]), statistics.median(cpu_s[n]))
           for n in names}
    result = {"config": {k: v for k, v in vars(args).items() if k != "out"}, "rows": {}}
    print(f"B={args.batch_prompts} G={args.group_size} grad_params={args.grad_params} grad_dim={args.grad_dim} "
          f"({args.rounds} rounds × {args.steps} steps; medians)")
    # "per round": each round's median CPU time against the same round's plain one (paired,
    # so a slow spell of a shared machine cancels); median and range over the rounds.
    print(f"{'config':<12} {'step ms':>8} {'vs plain':>9} {'loss+bwd ms':>12} {'vs plain':>9} {'cpu ms':>8} "
          f"{'vs plain':>9}   {'per round: median [min, max]':>28}")
    for n in names:
        (s, t, c), (s0, t0, c0) = med[n], med[ref]
        paired = [a / b - 1 for a, b in zip(round_s[n], round_s[ref])]
        result["rows"][n] = {"median_step_s": s, "median_train_s": t, "median_cpu_s": c,
                             "step_overhead": s / s0 - 1, "train_overhead": t / t0 - 1, "cpu_overhead": c / c0 - 1,
                             "round_cpu_overheads": paired, "steps": len(step_s[n])}
        print(f"{n:<12} {1e3 * s:8.2f} {100 * (s / s0 - 1):+8.1f}% {1e3 * t:12.2f} {100 * (t / t0 - 1):+8.1f}% "
              f"{1e3 * c:8.2f} {100 * (c / c0 - 1):+8.1f}%   {100 * statistics.median(paired):+9.1f}% "
              f"[{100 * min(paired):+.1f}%, {100 * max(paired):+.1f}%]")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
