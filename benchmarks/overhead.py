"""Scheduler overhead: μs per step for `propose(512)` + `observe` (G = 16) at growing pool
sizes, for every registered policy, next to a per-rollout Python loop doing the same
bookkeeping the way the reference codes do (DUMP's `LearnabilityEstimator` and
`CurriculumSampler`; MoPPS's dict of Beta posteriors).

    .venv/bin/python benchmarks/overhead.py            # N = 1e4, 1e5, 1e6, 1e7 (several minutes)
    .venv/bin/python benchmarks/overhead.py --quick    # N = 1e4, 1e5, 1e6, fewer steps
    RLPACE_SRC=/path/to/other/checkout/src .venv/bin/python benchmarks/overhead.py ...
                                                       # time another checkout alone
    .venv/bin/python benchmarks/overhead.py --against /path/to/other/checkout/src --cpu-time
                                                       # before / after, steps interleaved
    .venv/bin/python benchmarks/overhead.py --paired-growth --sizes 10000,10000000 --cpu-time
                                                       # growth, the two sizes' steps interleaved

What is timed, per step: `Scheduler.propose(512)`, building the `Feedback` (validation)
and `Scheduler.observe(fb)`. Policies that act after rollout only (admission, reweighting,
supervision: `topk`, `diem`, `ttrl`, ...) run in their registered composition, i.e. with
uniform selection, and for them the step also times the calls that use them: `admit` and
`loss_weights`, and `targets`, `rewards` and `advantage_weights` where the method has a
supervision place; the `Feedback` then carries the fields the method reads (lengths,
answers, token statistics, gradient features: synthetic, built outside the timed part).
The `oracle_*` measurement tools are left out (they need a measurement stream). Not timed:
generating rewards (the stream) and `metrics()` (which is O(N) for `prompts_seen` and is
meant for logging, not every step). The stream: each prompt has a fixed hidden pass rate; rewards for step t
are `u_t < p[ids]` with u_t drawn from `default_rng([seed, t])`, so every implementation
sees the same reward model. The loop baseline observes exactly the (ids, rewards) the
vectorised run produced, and proposes with its own per-slot draws.

Loop baselines (what "the same bookkeeping" means here):
  * DUMP-style (all policies but MoPPS): per rollout, dict updates of the per-prompt
    history (attempts, successes, last step) and list appends to per-domain |A| and
    success windows (truncated to 300 once per step — cheaper than per append), then the
    UCB softmax over domains and, per slot, `random.choices` of a domain and a uniform
    index in it. This is the Scheduler's own shared bookkeeping plus DUMP's method.
  * MoPPS-style (mopps): per group, dict updates of (α, β) keyed by prompt index (as
    `PosteriorSampler` does), and per step `ratio·n` candidates, a Thompson draw each with
    `random.betavariate`, sorted by distance to 0.5.
Targets: ≤ 1 ms/step median at N = 1e6 for every policy, ≤ 0.3 ms for the domain-level
ones (a mixture over domains with uniform prompts inside them), the mean ≤ 2× the median
(periodic work such as a predictor refit or a buffer refresh shows in the mean and the
max, not the median), cost growing ≤ 2× from 1e4 to 1e7, and ≥ 100× faster than the
loop. The table prints median, mean and max over steps (the machine is shared and adds
multi-ms spikes to the max).

Quiet machine: figures are only comparable on an idle machine (`uptime` load below the
core count). On a shared one they swing by 1.5–2× from run to run, and the footer prints
the load average seen. `--cpu-time` times both sides with the thread's CPU clock
(`time.thread_time`) instead of the wall clock, which leaves out the time the process
waits for a core (not the slowdown of a shared cache), so it moves less under load;
report which clock you used. The loop baseline is timed the same way either way.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import random
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.environ.get("RLPACE_SRC") or str(Path(__file__).resolve().parents[1] / "src"))

from rlpace import Feedback, Pool, Scheduler  # noqa: E402
from rlpace.policies import make_method, names as registered_names  # noqa: E402
from rlpace.sim import proposal_names  # noqa: E402

B, G, K, CLUSTERS = 512, 16, 12, 64
#: Mixtures over domains with uniform prompts inside them: the 0.3 ms target.
DOMAIN_LEVEL = ("uniform", "fixed_mixture", "dump", "sec", "exp3", "dvc", "epiplexity")
GRAD_DIM = 64


def all_policy_names() -> list[str]:
    """uniform, every proposal policy, then every other registered policy (admission,
    reweighting, supervision: run in its registered composition with uniform selection);
    the oracle_* measurement tools are left out."""
    proposal = proposal_names()
    rest = [n for n in registered_names() if n not in proposal and n != "uniform"
            and not n.startswith("oracle_")]
    return ["uniform"] + proposal + rest


def reads_of(name: str) -> frozenset:
    """The signals beyond rewards the method reads (`DataPolicy.reads`); empty on a checkout
    whose policies do not declare them."""
    m = make_method(name)
    return frozenset().union(*(getattr(p, "reads", frozenset()) for p in m.policies().values()))


def after_rollout(name: str) -> bool:
    """True when the method acts after rollout (admission, reweighting or supervision)."""
    m = make_method(name)
    trivial = {"keep_all", "unit_weights", "dataset_labels", "identity_reward", "unit_advantage", None}
    return any(getattr(getattr(m, place, None), "name", None) not in trivial
               for place in ("admission", "reweighting", "target", "reward", "advantage"))


def feedback_extras(reads: frozenset, t: int, seed: int = 0) -> dict:
    """Synthetic values of the fields a method reads (not timed: the trainer produces them)."""
    rng = np.random.default_rng([seed, t, 1])
    out = {"lengths": rng.integers(16, 512, size=(B, G))}
    if "answers" in reads:
        out["answers"] = np.array([str(v) for v in rng.integers(0, 4, size=B * G)], dtype=object).reshape(B, G)
    if "token_entropy" in reads:
        out["token_entropy"] = rng.random((B, G))
    if "self_certainty" in reads:
        out["self_certainty"] = rng.random((B, G))
    if "grads" in reads or "ref_grad" in reads:
        out["grads"] = rng.standard_normal((B, G, GRAD_DIM)).astype(np.float32)
        out["grads"].setflags(write=False)      # as rlpace's trainer and TRL adapter pass them (no copy)
        out["ref_grad"] = rng.standard_normal(GRAD_DIM).astype(np.float32)
    return out


def make_pool(n: int, seed: int = 0, pool_class=Pool) -> tuple[Pool, np.ndarray]:
    """K domains, 64 clusters, a noisy offline difficulty; hidden pass rate per prompt."""
    rng = np.random.default_rng(seed)
    dom = rng.integers(0, K, size=n)
    clusters = (dom * (CLUSTERS // K) + rng.integers(0, CLUSTERS // K, size=n)).astype(np.int64)
    logit = rng.normal(0.0, 2.0, size=n) + (dom - K / 2) * 0.5
    p = 1.0 / (1.0 + np.exp(logit))
    pool = pool_class(dom, clusters=clusters, difficulty=logit + 0.3 * rng.standard_normal(n))
    return pool, p


def policy_kwargs(name: str) -> dict:
    # ADS proposes active_clusters × mini_cluster_size per step: 4 × 128 = 512 here.
    return {"mini_cluster_size": B // 4} if name == "ads" else {}


def stepper(pool, p, name, seed=0, clock=time.perf_counter, lib=None):
    """step(t) -> (μs of step t's timed part, ids, rewards) for a fresh Scheduler of `name`;
    `lib` is the package to build it from (this checkout's rlpace by default; another
    checkout's with --against), `pool` one of its Pools."""
    lib_scheduler, lib_feedback = (Scheduler, Feedback) if lib is None else (lib.Scheduler, lib.Feedback)
    sched = lib_scheduler(pool, name, seed=seed, **policy_kwargs(name))
    reads = reads_of(name)
    post = after_rollout(name)
    supervised = any(getattr(sched.method, place, None) is not None and
                     getattr(getattr(sched.method, place), "name", "") not in
                     ("dataset_labels", "identity_reward", "unit_advantage")
                     for place in ("target", "reward", "advantage"))

    def step(t):
        u = np.random.default_rng([seed, t]).random((B, G))
        extras = feedback_extras(reads, t, seed) if post else {}
        t0 = clock()
        ids = sched.propose(B)
        t1 = clock()
        rewards = (u < p[ids][:, None]).astype(np.float64)   # the stream: not timed
        t2 = clock()
        fb = lib_feedback(ids, rewards, step=t, **extras)
        if supervised:
            sched.targets(fb)
            sched.rewards(fb)
            sched.advantage_weights(fb)
        sched.observe(fb)
        if post:
            sched.admit(fb)
            sched.loss_weights(fb)
        t3 = clock()
        return ((t1 - t0) + (t3 - t2)) * 1e6, ids, rewards
    return step


def time_vectorised(pool, p, name, steps, warmup, seed=0, clock=time.perf_counter):
    step = stepper(pool, p, name, seed, clock)
    trace, per_step = [], []
    for t in range(warmup + steps):
        us, ids, rewards = step(t)
        if t >= warmup:
            per_step.append(us)
            trace.append((ids, rewards))
    return np.asarray(per_step), trace


def load_other(src: str):
    """Another checkout's rlpace (its `src` folder), imported as the package `rlpace_before`
    next to this one (the core imports itself relatively, so both live in one process)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("rlpace_before", str(Path(src) / "rlpace" / "__init__.py"),
                                                  submodule_search_locations=[str(Path(src) / "rlpace")])
    mod = importlib.util.module_from_spec(spec)
    sys.modules["rlpace_before"] = mod
    spec.loader.exec_module(mod)
    return mod


def time_paired(pools, p, name, steps, warmup, other, seed=0, clock=time.perf_counter):
    """(μs before, μs after): the other checkout's Scheduler and this one's on the same stream,
    their steps interleaved (before, after, after, before, ...), so both see the same load."""
    a = stepper(pools[0], p, name, seed, clock, lib=other)
    b = stepper(pools[1], p, name, seed, clock)
    before, after = [], []
    for t in range(warmup + steps):
        first, second = (a, b) if t % 2 == 0 else (b, a)
        x, y = first(t)[0], second(t)[0]
        ua, ub = (x, y) if t % 2 == 0 else (y, x)
        if t >= warmup:
            before.append(ua)
            after.append(ub)
    return np.asarray(before), np.asarray(after)


class DumpLoop:
    """DUMP's reference bookkeeping, per rollout in Python (card 10, 'Code: exact logic')."""

    def __init__(self, domain_of: list, by_source: list, seed: int = 0, window: int = 300):
        self.domain_of, self.by_source, self.window = domain_of, by_source, window
        self.attempts, self.successes, self.last_step = {}, {}, {}
        self.recent_adv = [[] for _ in range(K)]
        self.recent_succ = [[] for _ in range(K)]
        self.n_samples = [0] * K
        self.weights = [1.0 / K] * K
        self.rng = random.Random(seed)

    def propose(self, n):
        out = []
        for _ in range(n):                     # CurriculumSampler: a source per slot
            src = self.rng.choices(range(K), weights=self.weights)[0]
            idx = self.by_source[src]
            out.append(idx[self.rng.randrange(len(idx))])
        return out

    def observe(self, ids, rewards, step):
        touched = set()
        for pid, row in zip(ids, rewards):
            g = len(row)
            mean = sum(row) / g
            std = math.sqrt(sum((r - mean) ** 2 for r in row) / g)
            d = self.domain_of[pid]
            touched.add(d)
            for r in row:
                a = (r - mean) / (std + 1e-6) if std > 0 else 0.0
                self.attempts[pid] = self.attempts.get(pid, 0) + 1
                if r >= 0.5:
                    self.successes[pid] = self.successes.get(pid, 0) + 1
                self.recent_adv[d].append(abs(a))
                self.recent_succ[d].append(1.0 if r >= 0.5 else 0.0)
                self.n_samples[d] += 1
            self.last_step[pid] = max(step, self.last_step.get(pid, -1))
        for d in touched:
            self.recent_adv[d] = self.recent_adv[d][-self.window:]
            self.recent_succ[d] = self.recent_succ[d][-self.window:]
        total = max(1, sum(self.n_samples))
        scores = [(sum(w) / len(w) if w else 0.0) + math.sqrt(2 * math.log(total + 1) / (n + 1))
                  for w, n in zip(self.recent_adv, self.n_samples)]
        top = max(scores)
        e = [math.exp((s - top) / 0.1) for s in scores]
        z = sum(e)
        self.weights = [x / z for x in e]


class MoppsLoop:
    """MoPPS's PosteriorSampler: dict of [α, β] by prompt index, Thompson over candidates."""

    def __init__(self, n_pool: int, seed: int = 0, ratio: int = 16):
        self.n_pool, self.ratio = n_pool, ratio
        self.ab = {}
        self.attempts, self.successes, self.last_step = {}, {}, {}
        self.rng = random.Random(seed)

    def propose(self, n):
        cand = [self.rng.randrange(self.n_pool) for _ in range(self.ratio * n)]
        scored = []
        for i in cand:
            a, b = self.ab.get(str(i), (1.0, 1.0))
            scored.append(((self.rng.betavariate(a, b) - 0.5) ** 2, i))
        scored.sort()
        return [i for _, i in scored[:n]]

    def observe(self, ids, rewards, step):
        for pid, row in zip(ids, rewards):
            g = len(row)
            s = sum(1 for r in row if r >= 0.5)
            for r in row:
                self.attempts[pid] = self.attempts.get(pid, 0) + 1
                if r >= 0.5:
                    self.successes[pid] = self.successes.get(pid, 0) + 1
            self.last_step[pid] = max(step, self.last_step.get(pid, -1))
            a, b = self.ab.get(str(pid), (1.0, 1.0))
            self.ab[str(pid)] = (a + s, b + g - s)


def time_loop(loop, trace, warmup_trace=(), clock=time.perf_counter):
    for t, (ids, rewards) in enumerate(warmup_trace):
        loop.observe(ids, rewards, t)
    per_step = []
    for t, (ids, rewards) in enumerate(trace):
        ids_l, rew_l = ids.tolist(), rewards.tolist()    # a loop code holds Python lists
        t0 = clock()
        loop.propose(B)
        loop.observe(ids_l, rew_l, t)
        per_step.append(clock() - t0)
    return np.asarray(per_step) * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="N up to 1e6 and fewer steps")
    ap.add_argument("--sizes", help="comma list of pool sizes (overrides --quick)")
    ap.add_argument("--steps", type=int, help="timed steps per run (default 100; quick 30)")
    ap.add_argument("--loop-steps", type=int, help="timed steps of the loop baseline (default 10; quick 5)")
    ap.add_argument("--policies", help="comma list (default: every registered policy but the oracle_* tools)")
    ap.add_argument("--cpu-time", action="store_true",
                    help="time with the thread's CPU clock instead of the wall clock (both sides)")
    ap.add_argument("--json", help="also write the figures to this JSON file")
    ap.add_argument("--against", metavar="SRC",
                    help="another checkout's src folder (e.g. a git worktree of an older commit): time "
                         "its Scheduler and this one's side by side, steps interleaved (no loop baseline)")
    ap.add_argument("--paired-growth", action="store_true",
                    help="with --sizes SMALL,LARGE: one Scheduler at each size, this checkout, steps "
                         "interleaved; the growth is the median over steps of LARGE / SMALL (no loop baseline)")
    args = ap.parse_args(argv)
    if args.against:
        return compare(args)
    if args.paired_growth:
        return paired_growth(args)
    clock = time.thread_time if args.cpu_time else time.perf_counter
    load_before = os.getloadavg()[0]
    sizes = [int(float(s)) for s in args.sizes.split(",")] if args.sizes else \
        ([10**4, 10**5, 10**6] if args.quick else [10**4, 10**5, 10**6, 10**7])
    steps = args.steps or (30 if args.quick else 100)
    loop_steps = args.loop_steps or (5 if args.quick else 10)
    names = args.policies.split(",") if args.policies else all_policy_names()
    warmup = 5

    results: dict[tuple[str, int], dict] = {}
    for n in sizes:
        t0 = time.perf_counter()
        pool, p = make_pool(n)
        domain_of = pool.domains.tolist()
        order, offsets = pool.members("domain")
        by_source = [order[offsets[k]:offsets[k + 1]].tolist() for k in range(K)]
        print(f"N = {n:.0e}: pool built in {time.perf_counter() - t0:.1f}s", file=sys.stderr, flush=True)
        for name in names:
            us, trace = time_vectorised(pool, p, name, steps, warmup, clock=clock)
            loop = MoppsLoop(n) if name == "mopps" else DumpLoop(domain_of, by_source)
            loop_us = time_loop(loop, trace[:loop_steps], warmup_trace=trace[loop_steps:loop_steps + warmup],
                                clock=clock)
            results[(name, n)] = {"p50": float(np.median(us)), "mean": float(us.mean()), "max": float(us.max()),
                                  "loop": float(np.median(loop_us)), "loop_mean": float(loop_us.mean()),
                                  "loop_kind": "MoPPS" if name == "mopps" else "DUMP"}
            r = results[(name, n)]
            print(f"  {name:26s} median {r['p50']:7.0f} μs/step (mean {r['mean']:.0f}, max {r['max']:.0f}); "
                  f"loop median {r['loop']:8.0f} μs; ×{r['loop'] / r['p50']:.0f}", file=sys.stderr, flush=True)
            del trace, loop
            gc.collect()
        del pool, p, domain_of, by_source
        gc.collect()

    load_after = os.getloadavg()[0]
    contended = max(load_before, load_after) >= (os.cpu_count() or 1)
    print(f"\nμs per step, propose({B}) + Feedback + observe (+ admit, loss_weights and the supervision "
          f"calls for methods that act after rollout), G = {G}, over {steps} steps after {warmup} warm-up "
          f"steps (loop: {loop_steps} steps).\n"
          f"clock: {'thread CPU time' if args.cpu_time else 'wall'}; 1-min load average "
          f"{load_before:.1f} → {load_after:.1f} on {os.cpu_count()} cores"
          f"{' (contended: figures inflated)' if contended else ''}.")
    head = f"{'policy':26s}" + "".join(f"{f'N={n:.0e} median/mean/max':>28s}" for n in sizes) + \
        f"{'×loop':>7s}{'growth':>8s}  targets"
    print(head)
    print("-" * len(head))
    for name in names:
        cells, verdict = "", []
        for n in sizes:
            r = results[(name, n)]
            cells += f"{r['p50']:10.0f}{r['mean']:9.0f}{r['max']:9.0f}"
        growth = results[(name, sizes[-1])]["p50"] / results[(name, sizes[0])]["p50"]
        if 10**6 in sizes:
            r6 = results[(name, 10**6)]
            budget = 300 if name in DOMAIN_LEVEL else 1000
            if r6["p50"] > budget:
                verdict.append(f"{r6['p50'] / 1000:.2f} ms at 1e6 > {budget / 1000:g} ms")
            if r6["mean"] > 2 * r6["p50"]:
                verdict.append(f"mean {r6['mean'] / r6['p50']:.1f}× median at 1e6")
        worst = min(results[(name, n)]["loop"] / results[(name, n)]["p50"] for n in sizes)
        if worst < 100:
            verdict.append(f"{worst:.0f}× vs loop")
        if sizes[0] == 10**4 and sizes[-1] == 10**7 and growth > 2:
            verdict.append(f"grows {growth:.1f}× 1e4→1e7")
        print(f"{name:26s}{cells}{worst:7.0f}{growth:8.2f}  {'ok' if not verdict else '; '.join(verdict)}")
    print(f"targets: ≤ 1 ms median at N = 1e6 (≤ 0.3 ms for the domain-level {', '.join(DOMAIN_LEVEL)}), "
          f"mean ≤ 2× median, growth ≤ 2× from 1e4 to 1e7, ≥ 100× the loop.")
    if args.json:
        import json
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"B": B, "G": G, "steps": steps, "loop_steps": loop_steps,
                       "clock": "thread_time" if args.cpu_time else "perf_counter",
                       "load_average": [load_before, load_after],
                       "results": [{"policy": k[0], "N": k[1], **v} for k, v in results.items()]}, f, indent=1)
    print(f"loop = per-rollout Python bookkeeping ({'MoPPS-style for mopps, ' if 'mopps' in names else ''}"
          f"DUMP-style otherwise); × = loop / vectorised; growth = cost at N={sizes[-1]:.0e} / N={sizes[0]:.0e}.")
    return 0


def _verdict(name: str, r6: dict) -> str:
    budget = 300 if name in DOMAIN_LEVEL else 1000
    out = []
    if r6["p50"] > budget:
        out.append(f"{r6['p50'] / 1000:.2f} ms > {budget / 1000:g} ms")
    if r6["mean"] > 2 * r6["p50"]:
        out.append(f"mean {r6['mean'] / r6['p50']:.1f}× median")
    return "; ".join(out) or "ok"


def paired_growth(args) -> int:
    """--paired-growth: the same policy at two pool sizes, steps interleaved (small, large, large,
    small, ...), so both sizes see the same load; growth = median over steps of large / small."""
    clock = time.thread_time if args.cpu_time else time.perf_counter
    sizes = [int(float(s)) for s in (args.sizes or "10000,10000000").split(",")]
    if len(sizes) != 2:
        raise SystemExit("--paired-growth needs --sizes SMALL,LARGE (two sizes)")
    steps, warmup = args.steps or 30, 5
    names = args.policies.split(",") if args.policies else all_policy_names()
    load_before = os.getloadavg()[0]
    pools = [make_pool(n) for n in sizes]
    rows = []
    for name in names:
        a, b = (stepper(pool, p, name, clock=clock) for pool, p in pools)
        small, large = [], []
        for t in range(warmup + steps):
            first, second = (a, b) if t % 2 == 0 else (b, a)
            x, y = first(t)[0], second(t)[0]
            if t >= warmup:
                small.append(x if t % 2 == 0 else y)
                large.append(y if t % 2 == 0 else x)
        small, large = np.asarray(small), np.asarray(large)
        rows.append((name, float(np.median(small)), float(np.median(large)), float(np.median(large / small))))
        print(f"  {name:26s} N={sizes[0]:.0e} {rows[-1][1]:7.0f}  N={sizes[1]:.0e} {rows[-1][2]:7.0f} μs "
              f"(growth {rows[-1][3]:.2f})", file=sys.stderr, flush=True)
        gc.collect()
    load_after = os.getloadavg()[0]
    print(f"\nμs per step (median), N = {sizes[0]:.0e} and {sizes[1]:.0e} interleaved; {steps} steps after {warmup} "
          f"warm-up steps; clock: {'thread CPU time' if args.cpu_time else 'wall'}; 1-min load average "
          f"{load_before:.1f} → {load_after:.1f} on {os.cpu_count()} cores.")
    print(f"{'policy':26s}{f'N={sizes[0]:.0e}':>10s}{f'N={sizes[1]:.0e}':>10s}{'growth':>8s}  target ≤ 2")
    for name, s_, l_, g in rows:
        print(f"{name:26s}{s_:10.0f}{l_:10.0f}{g:8.2f}  {'ok' if g <= 2 else 'missed'}")
    print("growth = median over steps of (large / small), paired by step.")
    if args.json:
        import json
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"B": B, "G": G, "steps": steps, "sizes": sizes,
                       "clock": "thread_time" if args.cpu_time else "perf_counter",
                       "load_average": [load_before, load_after],
                       "results": [{"policy": r[0], "small_p50": r[1], "large_p50": r[2], "growth": r[3]}
                                   for r in rows]}, f, indent=1)
    return 0


def compare(args) -> int:
    """--against: before (the other checkout) and after (this one), steps interleaved."""
    clock = time.thread_time if args.cpu_time else time.perf_counter
    other = load_other(args.against)
    load_before = os.getloadavg()[0]
    sizes = [int(float(s)) for s in args.sizes.split(",")] if args.sizes else [10**6]
    steps = args.steps or 30
    names = args.policies.split(",") if args.policies else all_policy_names()
    known = set(other.policies.names())
    names = [n for n in names if n in known]
    warmup = 5
    results = []
    for n in sizes:
        pools = (make_pool(n, pool_class=other.Pool)[0],) + make_pool(n)
        p = pools[2]
        for name in names:
            before, after = time_paired(pools[:2], p, name, steps, warmup, other, clock=clock)
            row = {"policy": name, "N": n}
            for side, us in (("before", before), ("after", after)):
                row[side] = {"p50": float(np.median(us)), "mean": float(us.mean()), "max": float(us.max())}
            row["paired_ratio"] = float(np.median(after / before))
            results.append(row)
            print(f"  {name:26s} N={n:.0e} before {row['before']['p50']:7.0f} after {row['after']['p50']:7.0f} μs "
                  f"(median of paired ratios {row['paired_ratio']:.2f})", file=sys.stderr, flush=True)
            gc.collect()
        del pools, p
        gc.collect()
    load_after = os.getloadavg()[0]
    print(f"\nμs per step, before = {args.against}, after = this checkout; steps interleaved; {steps} steps "
          f"after {warmup} warm-up steps; clock: {'thread CPU time' if args.cpu_time else 'wall'}; 1-min load "
          f"average {load_before:.1f} → {load_after:.1f} on {os.cpu_count()} cores.")
    head = f"{'policy':26s}{'N':>7s}{'before median/mean/max':>26s}{'after median/mean/max':>26s}{'ratio':>7s}  targets (after)"
    print(head)
    print("-" * len(head))
    for r in results:
        b, a = r["before"], r["after"]
        print(f"{r['policy']:26s}{r['N']:7.0e}{b['p50']:10.0f}{b['mean']:8.0f}{b['max']:8.0f}"
              f"{a['p50']:10.0f}{a['mean']:8.0f}{a['max']:8.0f}{r['paired_ratio']:7.2f}  "
              f"{_verdict(r['policy'], a) if r['N'] == 10**6 else ''}")
    print("ratio = median over steps of after / before (paired by step).")
    if args.json:
        import json
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"B": B, "G": G, "steps": steps, "against": args.against,
                       "clock": "thread_time" if args.cpu_time else "perf_counter",
                       "load_average": [load_before, load_after], "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
