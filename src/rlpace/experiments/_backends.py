"""Backends that turn one `RunSpec` into one run record: the simulator and the built-in
trainer. Each is a plain function `(spec) -> record dict` run inside a grid worker.

Imports of the heavy parts (the simulator, torch and the trainer) happen inside the
functions, so a worker only loads what its suite needs.
"""

from __future__ import annotations

from ..errors import InputError
import functools
import json
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from ._grid import RunSpec, suite_backend
from ._records import SCHEMA_VERSION, provenance, record_from_step_log

__all__ = ["run_spec", "run_sim", "run_embedded", "sim_result_to_record", "embedded_default_steps",
           "check_options"]

# Options the simulator takes from `Grid.options` (anything else is an error).
SIM_OPTIONS = ("batch_size", "group_size", "eval_every", "target", "max_gen_batches", "scenario")


def run_spec(spec: RunSpec, work_dir: str | None = None) -> dict:
    """The default run function of a grid: dispatch on the suite's backend. `work_dir` is
    a scratch folder for the run (the built-in trainer writes its log there)."""
    if spec.backend == "sim":
        return run_sim(spec)
    return run_embedded(spec, work_dir)


def check_options(suite: str, options: dict) -> None:
    """Reject grid options the suite's backend does not take, before any run starts."""
    backend = suite_backend(suite)
    if backend == "sim":
        unknown = sorted(set(options) - set(SIM_OPTIONS))
        if unknown:
            raise InputError(f"unknown simulator option(s) {unknown} for suite {suite!r}; valid: "
                             f"{list(SIM_OPTIONS)}.")
        return
    clash = sorted(set(options) & set(EMBEDDED_RESERVED))
    if clash:
        raise InputError(f"grid options {clash} are set by the grid itself (suite, policy, seed, "
                         f"steps); remove them from the options.")
    import dataclasses
    from ..train import TrainConfig
    valid = {f.name for f in dataclasses.fields(TrainConfig)} | {"target"}
    unknown = sorted(set(options) - valid)
    if unknown:
        raise InputError(f"unknown trainer option(s) {unknown} for suite {suite!r}; valid: TrainConfig "
                         f"fields (see `rlpace train --help`) and 'target'.")


def sim_result_to_record(res: Any, spec: RunSpec, *, eval_every: int) -> dict:
    """Convert a `rlpace.sim.SimResult` to a schema-1 run record (see `_records`)."""
    domains = [str(d) for d in res.domains]
    n = int(res.informative_fraction.shape[0])
    steps: dict[str, list] = {"step": list(range(n)), "rollouts": res.rollouts.tolist(),
                              "informative_fraction": res.informative_fraction.tolist(),
                              "kept_fraction": res.kept_fraction.tolist()}
    if res.domain_prob is not None:
        for j, d in enumerate(domains):
            steps[f"domain_prob/{d}"] = res.domain_prob[:, j].tolist()
    for j, d in enumerate(domains):
        steps[f"domain_share/{d}"] = res.domain_share[:, j].tolist()
    evals: dict[str, list] = {"step": res.eval_step.tolist(), "rollouts": res.eval_rollouts.tolist()}
    for j, d in enumerate(domains):
        evals[f"acc/{d}"] = res.accuracy[:, j].tolist()
    evals["acc_mean"] = res.mean_accuracy.tolist()
    final = {"acc": {d: float(res.accuracy[-1, j]) for j, d in enumerate(domains)},
             "acc_mean": float(res.mean_accuracy[-1])}
    return {
        "schema_version": SCHEMA_VERSION, "run_id": spec.run_id, "label": spec.label,
        "policy": spec.policy, "policy_kwargs": dict(spec.policy_kwargs), "seed": spec.seed,
        "suite": spec.suite, "backend": "sim",
        "status": "complete" if n == spec.steps else "partial",
        "budget": {"steps": spec.steps, "batch_size": int(res.batch_size),
                   "group_size": int(res.group_size), "eval_every": int(eval_every)},
        "config": {"grid_run": spec.to_dict(), "sim": res.config},
        "steps": steps, "evals": evals, "final": final,
        "rollouts": int(res.rollouts[-1]) if n else 0, "seconds": float(res.wall_s),
        "target": float(res.target), "steps_to_target": res.steps_to_target,
        "rollouts_to_target": res.rollouts_to_target,
        "benchmark_domains": {d: d for d in domains},
        "provenance": provenance(),
    }


def run_sim(spec: RunSpec) -> dict:
    """Run one simulator run (`rlpace.sim.simulate`) and return its record.

    `spec.suite` is "sim:<scenario>"; `spec.options` may hold `batch_size`, `group_size`,
    `eval_every`, `target`, `max_gen_batches` and `scenario` (a dict of `make_scenario`
    overrides, e.g. {"prompts_per_domain": 200})."""
    from ..sim import make_scenario, simulate
    check_options(spec.suite, dict(spec.options))
    opts = dict(spec.options)
    scenario = make_scenario(spec.suite.split(":", 1)[1], **(opts.pop("scenario", None) or {}))
    eval_every = int(opts.get("eval_every", 10))
    res = simulate(scenario, spec.policy, steps=spec.steps, seed=spec.seed,
                   policy_kwargs=dict(spec.policy_kwargs) or None, progress=False, **opts)
    return sim_result_to_record(res, spec, eval_every=eval_every)


# TrainConfig fields the grid sets itself (from the spec or the runs folder).
EMBEDDED_RESERVED = ("out", "seed", "steps", "policy", "policy_kwargs", "tasks", "progress", "resume")


def embedded_default_steps() -> int:
    """Steps of the built-in trainer's default preset (`TrainConfig().steps`)."""
    from ..train import TrainConfig
    return int(TrainConfig().steps)


def _family(dist: str) -> str:
    """'add2' -> 'add': the embedded suite's task family, the domain of the balanced summary."""
    m = re.match(r"^([A-Za-z_]+?)(\d+)$", dist)
    return m.group(1) if m else dist


@functools.cache
def _worker_eval_memo():
    """This process's greedy held-out completions by weights (`GreedyMemo`): the runs of one
    (suite, seed) in a worker start from one base and share its step-0 evaluation."""
    from ..train.evaluate import GreedyMemo
    return GreedyMemo()


def run_embedded(spec: RunSpec, work_dir: str | None = None) -> dict:
    """Run the built-in GRPO recipe (`rlpace.train.train`) on the embedded task suite and
    convert its per-step log (metrics.jsonl) into a run record.

    `spec.suite` ("embedded", "embedded:add2,rev5,...", or a named trainer suite such as
    "ladder" and "mostly_solved") is the trainer's `tasks`;
    `spec.options` are `TrainConfig` fields (`batch_prompts`, `group_size`, `eval_every`,
    ...; see `rlpace train --help`) plus `target` (held-out mean accuracy for the
    steps-to-target fields). The trainer writes into `work_dir` (default: a temporary
    folder); its checkpoint is deleted afterwards, its metrics.jsonl and config.json kept.
    Held-out distributions are grouped by task family (add, rev, sort, ...) for the
    domain-balanced summary.
    """
    from ..train import TrainConfig, check_config, from_overrides, train
    check_options(spec.suite, dict(spec.options))
    opts = dict(spec.options)
    target = opts.pop("target", None)
    work = Path(work_dir) if work_dir is not None else Path(tempfile.mkdtemp(prefix="rlpace-run-"))
    fields = {"out": str(work), "seed": spec.seed, "steps": spec.steps, "policy": spec.policy,
              "policy_kwargs": json.dumps(dict(spec.policy_kwargs)), "tasks": spec.suite,
              "progress": False, "threads": 1, "checkpoint_every": 0}
    cfg = from_overrides({**fields, **opts}, base=TrainConfig())
    check_config(cfg)
    t0 = time.perf_counter()
    train(cfg, eval_memo=_worker_eval_memo())
    seconds = time.perf_counter() - t0
    rows = [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines() if line.strip()]
    dists = sorted({k[len("eval/"):] for r in rows for k in r
                    if k.startswith("eval/") and k != "eval/mean"})
    rec = record_from_step_log(
        rows, run_id=spec.run_id, label=spec.label, policy=spec.policy,
        policy_kwargs=spec.policy_kwargs, seed=spec.seed, suite=spec.suite, backend="embedded",
        budget_steps=spec.steps, config={"grid_run": spec.to_dict(), "train": cfg.to_dict()},
        batch_size=cfg.batch_prompts, group_size=cfg.group_size, eval_every=cfg.eval_every,
        target=target, seconds=seconds, benchmark_domains={d: _family(d) for d in dists})
    shutil.rmtree(work / "checkpoint", ignore_errors=True)   # the record is the result
    return rec
