"""Run a `Grid`: parallel worker processes, resumable, every failure reported.

Layout of a runs folder:

    <out>/grid.json                 the grid as last run (for the report and for humans)
    <out>/runs/<run_id>.jsonl       one finished run = one record file (see `_records`)
    <out>/failed/<run_id>.json      a run that failed twice: its spec, attempts, traceback
    <out>/work/<run_id>/            scratch folder of a run (the trainer's metrics.jsonl), for
                                    run functions that take a `work_dir` argument

Rules:
  * Resume: a run whose record file exists is skipped (and its stored spec must equal the
    grid's, else ValueError before any work: the folder holds a different experiment).
  * A run that raises, or whose worker process dies, is retried once; a second failure is
    written to `failed/` and returned in `GridResult.failed` — never silently dropped.
    A later `run_grid` retries it again (and removes its `failed/` file on success).
    A run refused for its input (`InputError`: e.g. a policy the suite's trainer cannot
    run) is not retried: the same input fails the same way, and a retry would cost a
    second setup in a matrix of hundreds of runs.
  * When a worker process dies, every run in flight in that pool is charged one attempt
    (the pool cannot tell which one killed it); at most `workers` runs are in flight, so
    an innocent run can only fail if it is also in flight for a second crash.
  * Workers use the `spawn` start method (no forked torch/BLAS state) and one thread each
    (OMP_NUM_THREADS=1; `torch.set_num_threads(1)` if torch is loaded).
  * With `workers=1` runs execute in this process (same retry rules; a hard crash then
    ends the grid, and a rerun resumes it).
"""

from __future__ import annotations

from ..errors import InputError
import importlib
import inspect
import json
import os
import sys
import time
import traceback
from collections import deque
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ._grid import Grid, RunSpec
from ._records import RecordError, read_records, write_record

__all__ = ["run_grid", "GridResult", "default_workers", "record_path"]

# Worker environment: one thread per process (2 workers on 2 cores must not oversubscribe),
# and no per-run progress bars from transformers under the grid's own bar.
_WORKER_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
               "TOKENIZERS_PARALLELISM": "false", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
               "TRANSFORMERS_VERBOSITY": "error", "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1"}


def default_workers() -> int:
    """min(usable CPU cores, 2): the grid's default process count."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        n = os.cpu_count() or 1
    return max(1, min(n, 2))


def record_path(out_dir: str | Path, run_id: str) -> Path:
    """Where the record of `run_id` lives in a runs folder."""
    return Path(out_dir) / "runs" / f"{run_id}.jsonl"


@dataclass
class GridResult:
    """What `run_grid` did.

    Attributes:
        out_dir: the runs folder.
        ran: run_ids computed by this call, in completion order.
        skipped: run_ids whose record already existed (resume).
        failed: run_id -> error text of the last attempt, for runs that failed twice.
        partial: run_ids whose record has status "partial" (ran short of the budget).
        seconds: wall-clock time of this call.
    """

    out_dir: Path
    ran: list = field(default_factory=list)
    skipped: list = field(default_factory=list)
    failed: dict = field(default_factory=dict)
    partial: list = field(default_factory=list)
    seconds: float = 0.0

    @property
    def complete(self) -> bool:
        """True when every run of the grid has a complete record."""
        return not self.failed and not self.partial

    def records(self) -> list[dict]:
        return read_records(Path(self.out_dir) / "runs")

    def summary(self) -> str:
        parts = [f"{len(self.ran)} ran", f"{len(self.skipped)} already done"]
        if self.partial:
            parts.append(f"{len(self.partial)} PARTIAL ({', '.join(self.partial[:5])})")
        if self.failed:
            parts.append(f"{len(self.failed)} FAILED ({', '.join(list(self.failed)[:5])}; see "
                         f"{Path(self.out_dir) / 'failed'})")
        return f"grid: {'; '.join(parts)} in {self.seconds:.1f}s"


def _init_worker() -> None:
    os.environ.update(_WORKER_ENV)


def _resolve_run_fn(run_fn: Callable | str | None) -> Callable[[RunSpec], dict]:
    if run_fn is None:
        from ._backends import run_spec
        return run_spec
    if isinstance(run_fn, str):
        mod, _, attr = run_fn.rpartition(":") if ":" in run_fn else run_fn.rpartition(".")
        return getattr(importlib.import_module(mod), attr)
    return run_fn


def _execute(run_fn: Callable | str | None, spec: RunSpec, path: str) -> dict:
    """Run one spec and write its record (in the worker, so a finished run survives the
    parent). Returns {"ok": bool, "error": str | None, "partial": bool, "retry": bool}; a
    run refused for its input (InputError) is not worth a retry."""
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)
    try:
        fn = _resolve_run_fn(run_fn)
        try:
            takes_work_dir = "work_dir" in inspect.signature(fn).parameters
        except (TypeError, ValueError):
            takes_work_dir = False
        # A scratch folder per run, next to the records: <out>/work/<run_id>.
        kw = {"work_dir": str(Path(path).parent.parent / "work" / spec.run_id)} if takes_work_dir else {}
        rec = fn(spec, **kw)
        if not isinstance(rec, dict):
            raise TypeError(f"the run function returned {type(rec).__name__}; it must return a run "
                            f"record dict (see rlpace.experiments.write_record).")
        if rec.get("run_id") != spec.run_id:
            raise InputError(f"the run function returned run_id {rec.get('run_id')!r} for spec "
                             f"{spec.run_id!r}; records must keep the spec's run_id.")
        write_record(path, rec)
        return {"ok": True, "error": None, "partial": rec.get("status") == "partial", "retry": False}
    except Exception as e:  # noqa: BLE001 - reported to the parent, retried, then recorded as failed
        return {"ok": False, "error": traceback.format_exc(), "partial": False,
                "retry": not isinstance(e, InputError)}


def _check_existing(spec: RunSpec, path: Path) -> dict:
    recs = read_records(path)
    if len(recs) != 1:
        raise RecordError(f"{path} holds {len(recs)} records; a grid record file holds exactly one. "
                          f"Delete it to recompute run {spec.run_id!r}.")
    rec = recs[0]
    stored = (rec.get("config") or {}).get("grid_run")
    if stored is None:
        # A record written by another tool (an adapter, a hand-made file) says nothing about
        # the grid's steps or options: reusing it could pair runs of different budgets.
        raise InputError(f"{path} has no config.grid_run, so it was not written by this grid; "
                         f"move it out of the runs folder, or write this grid to a new --out "
                         f"folder.")
    if stored != spec.to_dict():
        diff = sorted(k for k in set(stored) | set(spec.to_dict())
                      if stored.get(k) != spec.to_dict().get(k))
        raise InputError(f"{path} was produced by a different configuration of run {spec.run_id!r} "
                         f"(differs in {diff}); write this grid to a new --out folder, or delete the "
                         f"old records to recompute them.")
    return rec


def run_grid(grid: Grid, out_dir: str | Path, *, workers: int | None = None,
             run_fn: Callable[[RunSpec], dict] | str | None = None, progress: bool = True,
             max_attempts: int = 2) -> GridResult:
    """Run every `RunSpec` of `grid` that has no record yet in `out_dir`.

    Args:
        grid: the experiment (`Grid` or `load_grid(path)`).
        out_dir: the runs folder (created); see the module docstring for its layout.
        workers: worker processes; default `default_workers()` (= min(cores, 2)).
            1 runs in this process.
        run_fn: `(RunSpec) -> record dict`; default dispatches on the suite (simulator or
            built-in trainer). A module-level function or "pkg.module:function" (it must
            be importable in a spawned worker).
        progress: show a tqdm bar over runs.
        max_attempts: tries per run before it is reported failed (default 2 = one retry).

    Returns:
        A `GridResult`; `result.records()` reads every finished record.

    Example:
        >>> from rlpace.experiments import Grid, run_grid
        >>> g = Grid.from_dict({"suite": "sim:ladder", "seeds": 2, "steps": 5,
        ...                     "options": {"batch_size": 8, "group_size": 4},
        ...                     "policies": ["uniform", "dump"]})
        >>> import tempfile; res = run_grid(g, tempfile.mkdtemp(), workers=1, progress=False)
        >>> len(res.ran), res.failed
        (4, {})
    """
    if not isinstance(grid, Grid):
        raise TypeError(f"run_grid needs a Grid (Grid.from_dict / load_grid); got {type(grid).__name__}.")
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
        raise InputError(f"max_attempts must be an int ≥ 1; got {max_attempts!r}.")
    n_workers = default_workers() if workers is None else workers
    if isinstance(n_workers, bool) or not isinstance(n_workers, int) or n_workers < 1:
        raise InputError(f"workers must be an int ≥ 1; got {workers!r}.")
    if run_fn is None:
        # The built-in backends: unknown options are an error now, not 2 failures per run.
        from ._backends import check_options
        for suite in grid.suites:
            check_options(suite, dict(grid.options))
    t0 = time.perf_counter()
    out = Path(out_dir)
    specs = grid.runs()
    # Check every existing record before any work: a mismatch must not half-run a grid.
    result = GridResult(out_dir=out)
    todo: list[RunSpec] = []
    for spec in specs:
        path = record_path(out, spec.run_id)
        if path.exists():
            rec = _check_existing(spec, path)
            result.skipped.append(spec.run_id)
            if rec["status"] == "partial":
                result.partial.append(spec.run_id)
        else:
            todo.append(spec)
    out.mkdir(parents=True, exist_ok=True)
    (out / "grid.json").write_text(json.dumps(grid.to_dict(), indent=2) + "\n", encoding="utf-8")

    from tqdm.auto import tqdm
    bar = tqdm(total=len(specs), initial=len(result.skipped), desc="grid", unit="run",
               disable=not progress, dynamic_ncols=True)

    def finish(spec: RunSpec, outcome: dict, attempts: dict, pending: deque) -> None:
        fail_path = out / "failed" / f"{spec.run_id}.json"
        if outcome["ok"]:
            result.ran.append(spec.run_id)
            if outcome["partial"]:
                result.partial.append(spec.run_id)
            if fail_path.exists():
                fail_path.unlink()
            bar.update(1)
            return
        attempts[spec.run_id] = attempts.get(spec.run_id, 0) + 1
        if attempts[spec.run_id] < max_attempts and outcome.get("retry", True):
            pending.appendleft(spec)  # retry next, while the failure is fresh in the logs
            return
        result.failed[spec.run_id] = outcome["error"]
        fail_path.parent.mkdir(parents=True, exist_ok=True)
        fail_path.write_text(json.dumps({"run_id": spec.run_id, "spec": spec.to_dict(),
                                         "attempts": attempts[spec.run_id],
                                         "error": outcome["error"]}, indent=2) + "\n",
                             encoding="utf-8")
        bar.update(1)
        bar.set_postfix_str(f"failed={len(result.failed)}")

    attempts: dict[str, int] = {}
    pending: deque = deque(todo)
    try:
        if n_workers == 1:
            while pending:
                spec = pending.popleft()
                finish(spec, _execute(run_fn, spec, str(record_path(out, spec.run_id))), attempts,
                       pending)
        else:
            _run_parallel(pending, min(n_workers, max(1, len(todo))), run_fn, out, finish, attempts)
    finally:
        bar.close()
    result.seconds = time.perf_counter() - t0
    return result


def _run_parallel(pending: deque, n_workers: int, run_fn: Any, out: Path,
                  finish: Callable, attempts: dict) -> None:
    import multiprocessing as mp
    ctx = mp.get_context("spawn")

    def new_pool() -> ProcessPoolExecutor:
        return ProcessPoolExecutor(max_workers=n_workers, mp_context=ctx, initializer=_init_worker)

    pool = new_pool()
    inflight: dict = {}
    try:
        while pending or inflight:
            # At most n_workers runs in flight: a dying worker then only charges runs that
            # were really running, not ones still waiting in the queue.
            while pending and len(inflight) < n_workers:
                spec = pending.popleft()
                inflight[pool.submit(_execute, run_fn, spec, str(record_path(out, spec.run_id)))] = spec
            done, _ = wait(list(inflight), return_when=FIRST_COMPLETED)
            broken = False
            for fut in done:
                spec = inflight.pop(fut)
                try:
                    outcome = fut.result()
                except BrokenProcessPool as e:
                    broken = True
                    outcome = {"ok": False, "partial": False,
                               "error": f"the worker process running this run died ({e}); it may "
                                        f"have run out of memory or crashed in native code."}
                finish(spec, outcome, attempts, pending)
            if broken:
                # The whole pool is unusable: settle the other runs in flight, start afresh.
                rest, _ = wait(list(inflight))
                for fut in rest:
                    spec = inflight.pop(fut)
                    try:
                        outcome = fut.result()
                    except BrokenProcessPool as e:
                        outcome = {"ok": False, "partial": False,
                                   "error": f"a worker process died while this run was in flight "
                                            f"({e})."}
                    finish(spec, outcome, attempts, pending)
                pool.shutdown(wait=True, cancel_futures=True)
                pool = new_pool()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
