"""ISO benchmarks (not timed tests): the isospectral optimizer in the built-in trainer, and
the ISO-Merger against task arithmetic and TIES (arXiv 2607.19331; docs/methods/iso.md).

    python benchmarks/iso.py overhead                 # step time of every optimizer, one process
    python benchmarks/iso.py efficiency --seeds 8     # rollouts to 80% of AdamW's gain
    python benchmarks/iso.py merge                    # specialists on disjoint families, merged
    python benchmarks/iso.py merge-time --shape 0.5b  # merge time and peak memory, random 0.5B-shaped model
    python benchmarks/iso.py merge-matrices --cache DIR  # ISO's CPU time per matrix kind of a cached model

overhead: the trainer runs each optimizer for --steps steps from the same base policy, in
one process, round-robin --repeats times; reports the median per-step time of the
training phase (loss, backward, optimizer step: `train_seconds`) and of the whole step,
and the optimizer step alone on the tiny model and on one Qwen2.5-0.5B-shaped decoder
layer (hidden 896, MLP 4864), where the float64 SVD retraction is what ISO adds.

efficiency: each optimizer trains the tiny base with uniform scheduling for --steps steps
and S seeds (runs with one seed are paired: same base, same sampling streams); rollouts to
80 % of the baseline's gain (iso_adamw vs adamw, iso_muon vs muon), paired 95 % bootstrap
CIs, via `rlpace.evaluation.efficiency_vs_baseline` (tail = 3). Runs are cached under --out.

merge: two specialists are trained with adamw from one base, each on one family of the
embedded suite (default: max* and last*); they are merged by ISO-Merger, task arithmetic
(λ = 1) and TIES (density 0.2, λ = 1); each merge's held-out accuracy on each specialist's
families, as a share of that specialist's own (the paper reports 99.5–106 %).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np


def _cfg(out, **kw):
    from rlpace.train import TrainConfig
    return TrainConfig(out=str(out), progress=False, threads=1, checkpoint_every=0, **kw)


def _run(cfg, cache=True) -> dict:
    from rlpace.train import train
    import dataclasses
    done = Path(cfg.out) / "summary.json"
    if cache and done.is_file():
        s = json.loads(done.read_text())
        saved = s.get("config") or {}
        # a field added to TrainConfig since the run was saved has its default there
        defaults = {f.name: f.default for f in dataclasses.fields(cfg)}
        if all(saved.get(k, defaults[k]) == v for k, v in cfg.to_dict().items()):
            return s
    return train(cfg)


# ---- overhead ----------------------------------------------------------------------------
def overhead(args):
    import os

    import torch

    from rlpace.optim import build_optimizer
    from rlpace.train.report import load_run
    torch.set_num_threads(1)
    opts = args.optimizers.split(",")
    per = {o: {"train": [], "step": []} for o in opts}
    for rep in range(args.repeats if args.steps else 0):      # --steps 0: the optimizer alone only
        for o in opts:
            cfg = _cfg(Path(args.out) / f"overhead_{o}_{rep}", optimizer=o, steps=args.steps, seed=args.seed,
                       eval_every=10_000, tasks=args.tasks)
            _run(cfg, cache=False)
            recs = load_run(cfg.out)
            recs = [r for r in recs if not r.get("final")][1:]          # the first step holds the eval
            per[o]["train"] += [r["train_seconds"] for r in recs]
            per[o]["step"] += [r["seconds"] for r in recs]
    from rlpace.optim import IsoSpectral
    pairs = [(m, b) for m, b in (("iso_adamw", "adamw"), ("iso_muon", "muon")) if m in per and b in per]
    if args.steps:
        print(f"trainer, tasks={args.tasks}, {args.steps} steps × {args.repeats} repeats, median seconds per step "
              f"(load average {os.getloadavg()[0]:.1f}):")
        ref = statistics.median(per[opts[0]]["train"])
        for o in opts:
            tr, st = statistics.median(per[o]["train"]), statistics.median(per[o]["step"])
            print(f"  {o:10s} train phase {tr:.4f} s ({tr / ref:.2f}× {opts[0]})   whole step {st:.4f} s")
    for m, b in pairs if args.steps else ():
        tr = statistics.median(per[m]["train"]) / statistics.median(per[b]["train"])
        st = statistics.median(per[m]["step"]) / statistics.median(per[b]["step"])
        print(f"  {m} / {b}: train phase {tr:.2f}×, whole step {st:.2f}×")

    def make(name, model):
        if name.endswith("+f64"):               # frames in float64 (build_optimizer's are float32 here)
            base = name[len("iso_"):-len("+f64")]
            kw = dict(lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0) if base == "adamw" else dict(
                lr=1e-4, weight_decay=0.0, momentum=0.95, adjust_lr_fn="match_rms_adamw",
                aux_kwargs=dict(lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0))
            return IsoSpectral(model, base, frame_dtype=torch.float64, **kw)
        return build_optimizer(name, model, lr=1e-4)

    def opt_step_times(model, names, n=args.micro):
        """Median seconds of one step of each optimizer, timed round-robin (a shared machine's
        load then falls on all alike)."""
        for p in model.parameters():
            p.grad = torch.randn_like(p) * 1e-3
        built = {name: make(name, model) for name in names}
        for o in built.values():
            o.step()                                # lazy state
        t = {name: [] for name in names}
        clock = time.thread_time if args.clock == "cpu" else time.perf_counter
        for _ in range(n):
            for name, o in built.items():
                t0 = clock()
                o.step()
                t[name].append(clock() - t0)
        return {name: statistics.median(v) for name, v in t.items()}, built

    def breakdown(opt, n=args.micro):
        """Shares of one IsoSpectral step's CPU time (cProfile, inclusive times), by phase."""
        import cProfile
        import pstats
        prof = cProfile.Profile(time.thread_time)
        prof.enable()
        for _ in range(n):
            opt.step()
        prof.disable()
        st = pstats.Stats(prof).stats
        total = sum(v[3] for k, v in st.items() if k[2] == "step" and k[0].endswith("_iso.py"))
        phases = {"chain rule": "frame_gradients", "tangent projection": "project_tangent",
                  "chain rule + projection": "_riemannian_frame_gradients",
                  "frames' AdamW (stacked)": "_adamw_step_stacked", "polar retraction": "_polar_many",
                  "W = U·Σ·Vᵀ": "_write_weights", "stacking frames": "_stack",
                  "non-finite check": "_nonfinite_gradient"}
        out = {}
        for label, fn in phases.items():
            t = sum(v[3] for k, v in st.items() if k[2] == fn and k[0].endswith("_iso.py"))
            if t:                                  # the phases this version of _iso.py has
                out[label] = t
        out["base optimizer step"] = sum(v[3] for k, v in st.items() if k[2] == "step" and "torch/optim" in k[0]
                                         and "_chain" not in k[0])
        if opt.base.__class__.__name__ == "ChainedOptimizer":
            out["base optimizer step"] = sum(v[3] for k, v in st.items() if k[2] == "step" and k[0].endswith("_chain.py"))
        out["other (grads, copies)"] = total - sum(out.values())
        return {k: v / total for k, v in out.items()}, total / n

    from transformers import Qwen2Config, Qwen2ForCausalLM
    shapes = {"tiny (hidden 64, 2 layers)": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                                 num_attention_heads=4, num_key_value_heads=4, vocab_size=64),
              "0.5B-shaped layer (896, MLP 4864)": dict(hidden_size=896, intermediate_size=4864,
                                                        num_hidden_layers=1, num_attention_heads=14,
                                                        num_key_value_heads=2, vocab_size=64)}
    shapes = dict(zip(("tiny", "0.5b-layer"), shapes.items()))
    shapes = dict(shapes[k] for k in args.shapes.split(","))
    names = opts + [f"{m}+f64" for m, _ in pairs]
    print(f"optimizer step alone (median {'thread CPU' if args.clock == 'cpu' else 'wall'} seconds, round-robin; "
          f"iso_*: frames in float32, the built-in trainer's; +f64: in float64):")
    for label, kw in shapes.items():
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(Qwen2Config(tie_word_embeddings=True, **kw))
        times, built = opt_step_times(model, names)
        print(f"  {label}: " + ", ".join(f"{o} {t:.4f}" for o, t in times.items()))
        print("    " + ", ".join(f"{m}{f} / {b} {times[m + f] / times[b]:.1f}×" for m, b in pairs for f in ("", "+f64")))
        for m, _ in pairs:
            shares, per = breakdown(built[m])
            groups = ", ".join(f"{len(idx)}× {tuple(built[m]._weights[idx[0]].shape)}" for idx in built[m]._by_shape)
            print(f"    {m} step by phase (profiled, {per:.4f} s/step; managed: {groups}): "
                  + ", ".join(f"{k} {v:.0%}" for k, v in shares.items()))


def _interval(iv) -> str:
    return "-" if iv is None else f"{iv.estimate:+.3f} [{iv.low:+.3f}, {iv.high:+.3f}]"


# ---- efficiency ----------------------------------------------------------------------------
def efficiency(args):
    from rlpace.evaluation import efficiency_vs_baseline
    from rlpace.evaluation._efficiency import Curve

    opts = args.optimizers.split(",")
    curves = {o: {} for o in opts}
    t0 = time.time()
    for seed in range(args.seeds):
        for o in opts:
            cfg = _cfg(Path(args.out) / f"{args.tasks.replace(':', '_')}__{o}__lr{args.lr:g}__seed{seed}",
                       optimizer=o, steps=args.steps, seed=seed, tasks=args.tasks, lr=args.lr,
                       eval_every=args.eval_every)
            s = _run(cfg)
            c = s["curve"]
            curves[o][seed] = Curve(np.array([p["rollouts"] for p in c], float),
                                    np.array([p["mean"] for p in c], float),
                                    np.array([p["step"] for p in c], float))
            print(f"  seed {seed} {o:10s} base {c[0]['mean']:.3f} final {c[-1]['mean']:.3f} "
                  f"({time.time() - t0:.0f} s)", flush=True)
    print(f"\ntasks={args.tasks}, {args.steps} steps, lr {args.lr:g}, {args.seeds} seeds; rollouts to "
          f"{args.fraction:.0%} of the baseline's gain (ratio < 1: fewer), paired 95% CI:")
    for base, method in (("adamw", "iso_adamw"), ("muon", "iso_muon")):
        if base in curves and method in curves:
            try:
                eff = efficiency_vs_baseline({base: curves[base], method: curves[method]}, baseline=base,
                                             fraction=args.fraction, tail=3)[method]
            except ValueError as e:
                print(f"  {method} vs {base}: no target ({e})")
                continue
            print(f"  {method} vs {base}: rollouts {eff.rollouts}  (reached {eff.rollouts.reached_method}/"
                  f"{eff.rollouts.n}, baseline {eff.rollouts.reached_baseline}/{eff.rollouts.n});  "
                  f"AUC {eff.auc};  final acc diff {_interval(eff.final_diff)}")
    for o in opts:
        fin = [curves[o][s].accuracy[-1] for s in curves[o]]
        print(f"  {o:10s} mean base {np.mean([curves[o][s].accuracy[0] for s in curves[o]]):.3f} "
              f"final {np.mean(fin):.3f}")


# ---- merge ----------------------------------------------------------------------------------
def _merge_seed(args, seed):
    """Held-out accuracy by domain of base, specialists and merges for one seed, and merge times."""
    import shutil

    import torch

    from rlpace.merge import merge_checkpoints
    from rlpace.tasks import make_taskset
    from rlpace.train.evaluate import heldout_accuracy
    from rlpace.train.model import load_policy
    from rlpace.train.recipes.grpo import base_policy

    torch.set_num_threads(1)
    out = Path(args.out) / f"merge_seed{seed}"
    fams = [f.split("+") for f in args.families.split(",")]
    common = dict(steps=args.steps, seed=seed, lr=args.lr, eval_every=args.steps)
    full = _cfg(out / "base", tasks="embedded", **common)
    tasks = make_taskset("embedded", train_per_domain=full.train_per_domain,
                         heldout_per_domain=full.heldout_per_domain, seed=seed)
    base_dir = Path(base_policy(full, tasks, progress=False))
    names = tasks.pool().domain_names
    specs = []
    for i, fam in enumerate(fams):
        doms = [n for n in names if any(n.startswith(f) for f in fam)]
        # every specialist starts from the same base (the full suite's) and trains on its family only
        cfg = _cfg(out / f"specialist{i}", tasks="embedded:" + ",".join(doms), model=str(base_dir), **common)
        _run(cfg)
        d = out / f"specialist{i}_hf"
        if not d.exists():
            m, tok = load_policy(base_dir, "cpu")
            m.load_state_dict(torch.load(Path(cfg.out) / "checkpoint" / "model.pt", weights_only=True))
            m.save_pretrained(d)
            tok.save_pretrained(d)
        specs.append(("+".join(fam), doms, d))

    def acc(model_dir):
        m, tok = load_policy(model_dir, "cpu")
        return heldout_accuracy(m, tok, tasks, max_new_tokens=full.max_new_tokens, batch=512)

    rows = {"base": acc(base_dir)}
    for fam, _, d in specs:
        rows[f"specialist {fam}"] = acc(d)
    times = {}
    for method in ("iso", "task_arithmetic", "ties"):
        dst = out / f"merged_{method}"
        shutil.rmtree(dst, ignore_errors=True)
        t0 = time.perf_counter()
        merge_checkpoints(base_dir, [d for _, _, d in specs], dst, method=method, progress=False)
        times[method] = time.perf_counter() - t0
        rows[f"merged {method}"] = acc(dst)
    by_fam = {label: [float(np.mean([a[n] for n in doms])) for _, doms, _ in specs] for label, a in rows.items()}
    return [f for f, _, _ in specs], by_fam, times


def merge(args):
    per_seed = []
    for seed in range(args.seeds):
        fams, by_fam, times = _merge_seed(args, seed)
        per_seed.append(by_fam)
        print(f"seed {seed}: " + "; ".join(f"{k} " + "/".join(f"{x:.3f}" for x in v) for k, v in by_fam.items())
              + "; merge s " + ", ".join(f"{k} {v:.2f}" for k, v in times.items()), flush=True)
    print(f"\nheld-out accuracy on each specialist's families ({', '.join(fams)}), {args.seeds} seeds, "
          f"specialists: {args.steps} GRPO steps from the seed's base, lr {args.lr:g}. Recovery = merged / "
          f"specialist on that specialist's families, mean [min, max] over seeds:")
    for label in per_seed[0]:
        accs = np.array([s[label] for s in per_seed])                          # [S, F]
        own = np.array([[s[f"specialist {f}"][j] for j, f in enumerate(fams)] for s in per_seed])
        rec = accs / own
        print(f"  {label:26s} acc " + " ".join(f"{m:.3f}" for m in accs.mean(0)) + "   recovery " +
              "  ".join(f"{f} {r.mean():.1%} [{r.min():.1%}, {r.max():.1%}]" for f, r in zip(fams, rec.T)))
    print("merge seconds (tiny model, 2 experts, CPU, last seed): " + ", ".join(f"{k} {v:.2f}" for k, v in times.items()))


def merge_time(args):
    """Time and peak memory of `merge_checkpoints` on a random Qwen2.5-0.5B-shaped model (bf16,
    2 experts = base + 1e-3 Gaussian noise per entry), each method in a fresh child process
    (`merge-one`) so its peak resident memory is its own; printed beside the model's size and
    the load average (the machine may be shared)."""
    import os
    import shutil
    import subprocess
    import tempfile

    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    shapes = {"0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                           num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
              "0.5b-1layer": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=1,
                                  num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                                  tie_word_embeddings=True),
              "0.5b-noembed": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=2,
                                   num_attention_heads=14, num_key_value_heads=2, vocab_size=64,
                                   tie_word_embeddings=True)}
    if args.tmp:
        Path(args.tmp).mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="iso-merge-time-", dir=args.tmp))
    # --cache DIR keeps the random base and experts between runs (building them takes minutes)
    src = Path(args.cache) / args.shape if args.cache else tmp
    try:
        if not (src / "e1" / "config.json").is_file():
            torch.manual_seed(0)
            model = Qwen2ForCausalLM(Qwen2Config(**shapes[args.shape])).to(torch.bfloat16)
            model.save_pretrained(src / "base")
            for i in range(2):
                with torch.no_grad():
                    for p in model.parameters():
                        p.add_(1e-3 * torch.randn_like(p))
                model.save_pretrained(src / f"e{i}")
            del model
        from safetensors import safe_open
        n = size = 0
        for f in (src / "base").glob("*.safetensors"):
            with safe_open(str(f), framework="pt") as h:
                for name in h.keys():
                    t = h.get_slice(name)
                    numel = int(np.prod(t.get_shape()))
                    n += numel
                    size += numel * {"BF16": 2, "F16": 2, "F32": 4, "F64": 8}[t.get_dtype()]
        rows = []
        for method in args.methods.split(","):
            load = os.getloadavg()
            res = subprocess.run([sys.executable, __file__, "merge-one", str(src), method, str(args.threads),
                                  str(tmp / f"m_{method}")], capture_output=True, text=True, check=True)
            secs, cpu, peak = (float(x) for x in res.stdout.split())
            print(f"{args.shape} ({n / 1e6:.0f} M parameters, bf16 {size / 2**30:.2f} GiB, 2 experts, CPU "
                  f"{args.threads} thread(s)): {method} {secs:.1f} s ({cpu:.1f} s CPU), peak memory {peak / 2**30:.2f} GiB "
                  f"({peak / size:.1f}× the model); load average before {load[0]:.1f}, after "
                  f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
            rows.append((method, secs, cpu, peak))
            shutil.rmtree(tmp / f"m_{method}", ignore_errors=True)
        print(f"\n| method ({args.threads} thread(s)) | wall s | CPU s | peak GiB (× model) |\n|---|---|---|---|")
        for method, secs, cpu, peak in rows:
            print(f"| {method} | {secs:.1f} | {cpu:.1f} | {peak / 2**30:.2f} ({peak / size:.1f}×) |")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def merge_matrices(args):
    """ISO's CPU time per matrix kind of a cached merge-time model (--cache DIR --shape S; one
    thread, thread CPU time, float32 products as for its bf16 output), and their sum over
    the model's matrices: the figure to read when the machine is too loaded for a full run.
    Square matrices too ill-conditioned for the Gram route are timed apart (the SVD rule)."""
    import os

    from safetensors import safe_open

    import torch

    from rlpace.merge._checkpoint import _iso_stack
    from rlpace.merge._methods import MAX_GRAM_COND
    torch.set_num_threads(1)
    d = Path(args.cache) / args.shape
    hs = [safe_open(str(d / x / "model.safetensors"), framework="pt") for x in ("base", "e0", "e1")]
    kinds: dict = {}
    for n in hs[0].keys():
        shape = tuple(hs[0].get_slice(n).get_shape())
        if len(shape) == 2:
            kinds.setdefault(shape, []).append(n)
    total = 0.0
    for shape, names in sorted(kinds.items(), key=lambda kv: kv[0][0] * kv[0][1]):
        cond = {n: float((lambda s: s[0] / s[-1])(torch.linalg.svdvals(hs[0].get_tensor(n).double())))
                for n in names} if shape[0] == shape[1] else {n: 0.0 for n in names}
        ill = [n for n in names if cond[n] > MAX_GRAM_COND]
        well = [n for n in names if n not in ill]
        secs = {}
        for label, group in (("Gram route", well), ("SVD rule", ill)):
            if group:
                w0, e0, e1 = (h.get_tensor(group[0]) for h in hs)
                t0 = time.thread_time()
                _iso_stack(w0, [e0, e1], 0.9, torch.bfloat16, torch.float32)
                secs[label] = (time.thread_time() - t0, len(group))
        sub = sum(t * k for t, k in secs.values())
        total += sub
        print(f"  {shape[0]} × {shape[1]}: {len(names)} matrices, " + ", ".join(
            f"{label} {t:.2f} s each × {k}" for label, (t, k) in secs.items()) + f" = {sub:.1f} s", flush=True)
    print(f"ISO merge of the {args.shape} model's matrices, 2 experts: {total:.1f} s of CPU (one thread); load "
          f"average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


def merge_one(args):
    """Child of merge-time: one merge; prints wall seconds, CPU seconds and peak resident bytes."""
    import resource

    import torch

    from rlpace.merge import merge_checkpoints
    torch.set_num_threads(args.threads)
    d = Path(args.dir)
    t0 = time.perf_counter()
    merge_checkpoints(d / "base", [d / "e0", d / "e1"], args.out, method=args.method, threads=args.threads,
                      progress=False)
    secs = time.perf_counter() - t0
    ru = resource.getrusage(resource.RUSAGE_SELF)
    print(secs, ru.ru_utime + ru.ru_stime, ru.ru_maxrss * 1024)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    o = sub.add_parser("overhead")
    o.add_argument("--optimizers", default="adamw,iso_adamw,muon,iso_muon")
    o.add_argument("--steps", type=int, default=10)
    o.add_argument("--repeats", type=int, default=2)
    o.add_argument("--micro", type=int, default=5, help="optimizer steps timed alone per shape")
    o.add_argument("--tasks", default="embedded")
    o.add_argument("--seed", type=int, default=0)
    o.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                   help="optimizer step alone: thread CPU time (default; robust to a shared machine) or wall")
    o.add_argument("--shapes", default="tiny,0.5b-layer", help="which optimizer-alone shapes: tiny,0.5b-layer")
    e = sub.add_parser("efficiency")
    e.add_argument("--optimizers", default="adamw,iso_adamw")
    e.add_argument("--seeds", type=int, default=8)
    e.add_argument("--steps", type=int, default=100)
    e.add_argument("--eval-every", type=int, default=10)
    e.add_argument("--lr", type=float, default=3e-4)
    e.add_argument("--tasks", default="embedded")
    e.add_argument("--fraction", type=float, default=0.8)
    m = sub.add_parser("merge")
    m.add_argument("--families", default="max,last", help="comma-separated specialists, '+' joins families")
    m.add_argument("--steps", type=int, default=60)
    m.add_argument("--lr", type=float, default=3e-4)
    m.add_argument("--seeds", type=int, default=4)
    t = sub.add_parser("merge-time")
    t.add_argument("--shape", default="0.5b", choices=["0.5b", "0.5b-1layer", "0.5b-noembed"])
    t.add_argument("--methods", default="iso,task_arithmetic,ties")
    t.add_argument("--threads", type=int, default=1)
    t.add_argument("--tmp", default=None)
    t.add_argument("--cache", default=None, help="directory that keeps the random base and experts between runs")
    mm = sub.add_parser("merge-matrices")
    mm.add_argument("--shape", default="0.5b", choices=["0.5b", "0.5b-1layer", "0.5b-noembed"])
    mm.add_argument("--cache", required=True, help="the --cache directory of a merge-time run")
    one = sub.add_parser("merge-one")
    one.add_argument("dir")
    one.add_argument("method")
    one.add_argument("threads", type=int)
    one.add_argument("out")
    for p in (o, e, m):
        p.add_argument("--out", default="runs/bench_iso")
    args = ap.parse_args(argv)
    {"overhead": overhead, "efficiency": efficiency, "merge": merge, "merge-time": merge_time,
     "merge-matrices": merge_matrices, "merge-one": merge_one}[args.cmd](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
