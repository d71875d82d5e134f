"""Run records: one JSON object per run, written as JSON Lines, read by the report.

A *run record* is everything the statistics need about one training (or simulated) run,
plus the provenance to reproduce it (STYLE.md §8, after rliable: every run record carries
its config, seed, package versions and git commit). The built-in trainer, the simulator
and the verl/TRL adapters all write this one format, so a GPU run is analysed with the
same `rlpace report` as a laptop run.

File layout: a record file is JSON Lines (`*.jsonl`, UTF-8), one record per line. The grid
runner writes one file per run (`<runs_dir>/runs/<run_id>.jsonl`) so that a finished run is
recognised by its file (resume); adapters may append many records to one file. Files are
written atomically (temporary file, then rename), so a killed writer never leaves half a
record behind.

Schema, version 1 (`SCHEMA_VERSION`). Required fields are marked *; the rest may be absent
or null.

    schema_version*  int     1
    run_id*          str     unique id of the run; the grid uses "<suite>__<label>__seed<k>"
    label*           str     the row name in every table (policy configuration label)
    policy*          str     registry name or dotted path of the policy ("dump", "a+b")
    policy_kwargs*   dict    hyperparameters passed to the policy factory
    seed*            int     the run's seed; runs of two labels with one seed are *paired*
    suite*           str     what was trained on: "sim:<scenario>", "embedded", "verl:<name>" ...
    backend*         str     who produced the record: "sim" | "embedded" | "verl" | "trl" | other
    status*          str     "complete" (ran its full budget) or "partial" (stopped early;
                             kept and reported as partial, never silently dropped)
    budget*          dict    {"steps": int, "batch_size": int|null, "group_size": int|null,
                             "eval_every": int|null}. Runs are paired only if budgets match.
    config*          dict    the complete configuration (scenario or trainer config), as
                             JSON, enough to re-run
    steps*           dict    per-step metrics, *columnar*: {"step": [int, ...], name: [...]}.
                             Every list has len(steps["step"]). Conventional names:
                             "rollouts" (cumulative rollouts spent), "informative_fraction",
                             "domain_prob/<d>" (scheduler.metrics()), "loss", "reward_mean",
                             "seconds". Missing values are null.
    evals*           dict    held-out evaluation, columnar: {"step": [...], "rollouts": [...],
                             "acc/<dist>": [...] for each held-out distribution,
                             "acc_mean": [...]}.
    final*           dict    {"acc": {dist: float}, "acc_mean": float}: held-out accuracy per
                             distribution at the end of the run (the report's score matrix)
    rollouts*        int     rollouts spent in total
    seconds*         float   wall-clock seconds of the run
    target           float   accuracy target for the *_to_target fields (held-out mean)
    steps_to_target  int     first eval step at which acc_mean >= target; null = not reached
    rollouts_to_target int   rollouts spent at that step; null = not reached
    benchmark_domains dict   {dist: domain}: groups held-out distributions into domains for
                             the domain-balanced summary; absent = each distribution is its
                             own domain
    provenance*      dict    {"packages": {name: version}, "git_commit": str|null,
                             "git_dirty": bool|null, "python": str, "platform": str,
                             "created": ISO-8601 UTC time}
    error            str     for status "partial": why the run stopped

Example:
    >>> import tempfile, os
    >>> rec = minimal_record(run_id="r0", label="uniform", seed=0, final_acc={"math": 0.5})
    >>> d = tempfile.mkdtemp(); path = os.path.join(d, "r0.jsonl")
    >>> write_record(path, rec)
    >>> [r["label"] for r in read_records(d)]
    ['uniform']
"""

from __future__ import annotations

from ..errors import InputError
import datetime as _dt
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ..types import read_jsonl

__all__ = ["SCHEMA_VERSION", "REQUIRED_FIELDS", "validate_record", "write_record", "append_record",
           "read_records", "provenance", "minimal_record", "record_from_step_log",
           "records_from_trainer_jsonl", "RecordError"]

SCHEMA_VERSION = 1

# field -> accepted Python types (after json.loads)
REQUIRED_FIELDS: dict[str, tuple[type, ...]] = {
    "schema_version": (int,),
    "run_id": (str,),
    "label": (str,),
    "policy": (str,),
    "policy_kwargs": (dict,),
    "seed": (int,),
    "suite": (str,),
    "backend": (str,),
    "status": (str,),
    "budget": (dict,),
    "config": (dict,),
    "steps": (dict,),
    "evals": (dict,),
    "final": (dict,),
    "rollouts": (int,),
    "seconds": (int, float),
    "provenance": (dict,),
}
STATUSES = ("complete", "partial")

# Packages whose versions go into every record (those present are listed).
_PROVENANCE_PACKAGES = ("rlpace", "numpy", "torch", "transformers", "verl", "trl", "scipy",
                        "matplotlib")


class RecordError(InputError):
    """A run record that does not follow the schema; the message names the file, the
    field and the fix."""


def _where(source: str | None) -> str:
    return f" in {source}" if source else ""


def validate_record(rec: Mapping[str, Any], source: str | None = None) -> None:
    """Check one record against schema version 1; raise `RecordError` naming the field.

    Checks presence and type of every required field, the status value, that columnar
    `steps`/`evals` lists all have the length of their `step` column, and that
    `final.acc` is a non-empty {dist: number} map.

    >>> try:
    ...     validate_record({"schema_version": 1, "run_id": "r1"})
    ... except RecordError as e:
    ...     print("missing required field(s) ['backend', 'budget'," in str(e))
    True
    """
    if not isinstance(rec, Mapping):
        raise RecordError(f"a run record must be a JSON object{_where(source)}; got "
                          f"{type(rec).__name__}.")
    version = rec.get("schema_version")
    if version is not None and version != SCHEMA_VERSION:
        raise RecordError(f"run record{_where(source)} has schema_version {version!r}; this rlpace "
                          f"reads version {SCHEMA_VERSION}. Re-export the run with this rlpace "
                          f"version (rlpace.experiments.write_record) or upgrade rlpace.")
    missing = sorted(k for k in REQUIRED_FIELDS if k not in rec)
    if missing:
        rid = rec.get("run_id", "?")
        raise RecordError(f"run record {rid!r}{_where(source)} is missing required field(s) "
                          f"{missing}; see docs/run-records.md for the schema, or build records with "
                          f"rlpace.experiments.record_from_step_log(...).")
    for key, types in REQUIRED_FIELDS.items():
        val = rec[key]
        ok = isinstance(val, types) and not (types == (int,) and isinstance(val, bool))
        if not ok:
            raise RecordError(f"run record {rec['run_id']!r}{_where(source)}: field {key!r} must be "
                              f"{' or '.join(t.__name__ for t in types)}; got {type(val).__name__}.")
    if rec["status"] not in STATUSES:
        raise RecordError(f"run record {rec['run_id']!r}{_where(source)}: status must be one of "
                          f"{STATUSES}; got {rec['status']!r}.")
    if "steps" not in rec["budget"]:
        raise RecordError(f"run record {rec['run_id']!r}{_where(source)}: budget needs 'steps' "
                          f"(the planned number of training steps).")
    for table in ("steps", "evals"):
        cols = rec[table]
        if cols and "step" not in cols:
            raise RecordError(f"run record {rec['run_id']!r}{_where(source)}: {table!r} is columnar "
                              f"and needs a 'step' column; got columns {sorted(cols)[:8]}.")
        n = len(cols.get("step", []))
        bad = [k for k, v in cols.items() if not isinstance(v, list) or len(v) != n]
        if bad:
            raise RecordError(f"run record {rec['run_id']!r}{_where(source)}: {table} column(s) {bad} "
                              f"are not lists of length {n} (the length of {table}['step']); every "
                              f"column needs one value per row (null where missing).")
    acc = rec["final"].get("acc")
    if not isinstance(acc, Mapping) or not acc:
        raise RecordError(f"run record {rec['run_id']!r}{_where(source)}: final.acc must be a "
                          f"non-empty {{distribution: accuracy}} object; got {acc!r}.")
    for d, v in acc.items():
        if v is not None and not isinstance(v, (int, float)):
            raise RecordError(f"run record {rec['run_id']!r}{_where(source)}: final.acc[{d!r}] must "
                              f"be a number or null; got {v!r}.")


def _jsonable(x: Any) -> Any:
    """numpy scalars/arrays and NaN -> plain JSON (NaN and inf become null)."""
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return [_jsonable(v) for v in x.tolist()]
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def _dumps(rec: Mapping[str, Any]) -> str:
    return json.dumps(_jsonable(rec), separators=(",", ":"), allow_nan=False)


def write_record(path: str | os.PathLike, record: Mapping[str, Any]) -> None:
    """Validate `record` and write it as the only line of `path`, atomically.

    NaN/inf become null, numpy values plain JSON. The parent folder is created. A crash
    mid-write leaves either the old file or none, never half a record (temp + rename).
    """
    rec = _jsonable(record)
    validate_record(rec, str(path))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".jsonl", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(_dumps(rec) + "\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def append_record(path: str | os.PathLike, record: Mapping[str, Any]) -> None:
    """Validate `record` and append it as one line to `path` (for adapters that keep all
    their runs in one file). Not atomic across processes: one writer per file."""
    rec = _jsonable(record)
    validate_record(rec, str(path))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(_dumps(rec) + "\n")


def _record_files(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    if not root.exists():
        raise FileNotFoundError(f"no run records at {root}: the path does not exist. Pass the "
                                f"folder that `rlpace compare` wrote (or a .jsonl file).")
    # Hidden temp files of an interrupted write are skipped on purpose.
    return sorted(p for p in root.rglob("*.jsonl") if not p.name.startswith("."))


def read_records(path: str | os.PathLike, *, validate: bool = True) -> list[dict]:
    """All records under `path` (a .jsonl file or a folder searched recursively).

    Raises:
        RecordError: a line that is not JSON, a record that fails `validate_record`, two
            records with one run_id, or records of more than one schema version (each
            message names the file and what to fix).
        FileNotFoundError: `path` does not exist.
    """
    root = Path(path)
    out: list[dict] = []
    where: dict[str, str] = {}
    versions: dict[Any, str] = {}
    for file in _record_files(root):
        with open(file, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                src = f"{file}:{lineno}"
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    raise RecordError(f"{src} is not valid JSON ({e.msg}); a record file holds one "
                                      f"JSON object per line. Delete or fix that line.") from None
                if isinstance(rec, dict):
                    versions.setdefault(rec.get("schema_version"), src)
                if len(versions) > 1:
                    desc = ", ".join(f"{v!r} (e.g. {s})" for v, s in versions.items())
                    raise RecordError(f"run records under {root} mix schema versions: {desc}. "
                                      f"Re-export the old runs with this rlpace version, or report "
                                      f"them separately.")
                if validate:
                    validate_record(rec, src)
                rid = rec.get("run_id")
                if rid in where:
                    raise RecordError(f"run_id {rid!r} appears twice: {where[rid]} and {src}. Each "
                                      f"run needs a unique run_id; remove the duplicate.")
                where[rid] = src
                out.append(rec)
    return out


# ---- provenance ------------------------------------------------------------------------------

def _git(args: Sequence[str], cwd: Path) -> str | None:
    try:
        res = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout.strip() if res.returncode == 0 else None


_PROV_CACHE: dict[str, Any] = {}


def provenance(packages: Iterable[str] = _PROVENANCE_PACKAGES) -> dict[str, Any]:
    """Package versions, git commit (of the rlpace checkout, when it is one), Python and
    platform, and the UTC time. Versions come from installed metadata, so no package is
    imported; the git calls are cached per process."""
    from importlib import metadata
    pk = tuple(packages)
    if pk not in _PROV_CACHE:
        versions = {}
        for name in pk:
            try:
                versions[name] = metadata.version(name)
            except metadata.PackageNotFoundError:
                continue
        repo = Path(__file__).resolve().parents[3]
        commit = _git(["rev-parse", "HEAD"], repo)
        dirty = None
        if commit is not None:
            status = _git(["status", "--porcelain", "--untracked-files=no"], repo)
            dirty = bool(status) if status is not None else None
        _PROV_CACHE[pk] = {"packages": versions, "git_commit": commit, "git_dirty": dirty,
                           "python": sys.version.split()[0], "platform": platform.platform()}
    out = dict(_PROV_CACHE[pk])
    out["created"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return out


def minimal_record(*, run_id: str, label: str, seed: int, final_acc: Mapping[str, float],
                   policy: str | None = None, suite: str = "unknown", backend: str = "external",
                   steps: int = 0, rollouts: int = 0, seconds: float = 0.0,
                   status: str = "complete", **extra) -> dict:
    """A schema-valid record from the least one needs for the score tables (final held-out
    accuracy per distribution). Extra keyword arguments become fields (e.g. `evals=`,
    `budget=`, `benchmark_domains=`)."""
    acc = {str(k): (None if v is None else float(v)) for k, v in final_acc.items()}
    vals = [v for v in acc.values() if v is not None]
    rec = {"schema_version": SCHEMA_VERSION, "run_id": run_id, "label": label,
           "policy": policy or label, "policy_kwargs": {}, "seed": int(seed), "suite": suite,
           "backend": backend, "status": status,
           "budget": {"steps": int(steps), "batch_size": None, "group_size": None, "eval_every": None},
           "config": {}, "steps": {"step": []}, "evals": {"step": []},
           "final": {"acc": acc, "acc_mean": float(np.mean(vals)) if vals else None},
           "rollouts": int(rollouts), "seconds": float(seconds), "provenance": provenance()}
    rec.update(extra)
    return rec


# ---- conversion from a trainer's per-step log ------------------------------------------------

def _num(v: Any) -> Any:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return v if not (isinstance(v, float) and not math.isfinite(v)) else None
    return None


def _cumulative(rows: Sequence[Mapping[str, Any]], cum_key: str | None, step_key: str | None) -> list:
    """Per-row cumulative counter: the `cum_key` column if logged, else the running sum of
    the per-step `step_key` column, else None for every row."""
    if cum_key is not None:
        return [_num(r.get(cum_key)) for r in rows]
    if step_key is not None:
        out, tot = [], 0.0
        for r in rows:
            v = _num(r.get(step_key))
            tot += v or 0.0
            out.append(tot)
        return out
    return [None] * len(rows)


def record_from_step_log(rows: Sequence[Mapping[str, Any]], *, run_id: str, label: str,
                         policy: str, seed: int, suite: str, backend: str,
                         budget_steps: int | None = None, policy_kwargs: Mapping | None = None,
                         config: Mapping | None = None, batch_size: int | None = None,
                         group_size: int | None = None, eval_every: int | None = None,
                         eval_prefixes: Sequence[str] = ("heldout/acc/", "eval/acc/", "eval/"),
                         mean_names: Sequence[str] = ("mean", "acc_mean"),
                         strip_prefixes: Sequence[str] = ("sched/",),
                         eval_at: str = "start", target: float | None = None,
                         seconds: float | None = None,
                         benchmark_domains: Mapping[str, str] | None = None) -> dict:
    """Build a run record from per-step log rows (one flat dict per training step).

    This is the converter the built-in trainer and the verl/TRL adapters use: they log one
    flat dict per step (their JSONL) and call this at the end. Rules:

    * `step` is required in every row; rows are sorted by it. A row with `"final": true`
      (the trainer's closing evaluation) only contributes an evaluation.
    * Numeric keys that start with one of `eval_prefixes` (first match wins) are held-out
      accuracies of the distribution named by the rest of the key (`"eval/add2"` -> `add2`);
      a rest in `mean_names` is the logged mean over distributions. A row with any of them
      is an evaluation: `evals` gets `step`, `rollouts`, `acc/<dist>` and `acc_mean` (the
      logged mean, else the mean over the row's distributions).
    * `eval_at`: "start" (the built-in trainer, verl's validation) means an evaluation
      logged in the row of step t saw t finished steps, so its `rollouts` are those spent
      *before* step t; "end" means after step t (its `step` is then t + 1).
    * Cumulative counters: `rollouts` comes from `rollouts_total` (else the running sum of
      the per-step `rollouts`), `seconds` from `seconds_total` (else the sum of the per-step
      `seconds`). In `steps`, the cumulative value is the `rollouts` column and the
      per-step one is renamed `rollouts_step`.
    * Every other numeric key becomes a `steps` column (null where a row lacks it), with
      `strip_prefixes` removed (`sched/domain_prob/add2` -> `domain_prob/add2`).
    * `status` is "complete" when the log reaches `budget_steps`, else "partial".
    * With `target`, `steps_to_target` / `rollouts_to_target` are the first evaluation whose
      acc_mean ≥ target.

    Args:
        rows: per-step dicts, e.g. `[json.loads(l) for l in open("metrics.jsonl")]`.
        run_id, label, policy, seed, suite, backend: identity fields (see module docstring).
        budget_steps: planned number of steps; defaults to the number of step rows.

    Raises:
        RecordError: no rows, a row without `step`, or no held-out accuracy anywhere.

    Example:
        >>> rows = [{"step": 0, "loss": 0.5, "rollouts": 8, "eval/math": 0.0},
        ...         {"step": 1, "loss": 0.4, "rollouts": 8},
        ...         {"step": 2, "final": True, "eval/math": 0.25, "eval/mean": 0.25}]
        >>> rec = record_from_step_log(rows, run_id="r", label="u", policy="uniform", seed=0,
        ...                            suite="embedded", backend="embedded", budget_steps=2)
        >>> rec["final"]["acc"], rec["rollouts"], rec["status"], rec["evals"]["rollouts"]
        ({'math': 0.25}, 16, 'complete', [0, 16])
    """
    if eval_at not in ("start", "end"):
        raise InputError(f"eval_at must be 'start' or 'end'; got {eval_at!r}.")
    if not rows:
        raise RecordError(f"run {run_id!r}: the step log is empty; nothing to convert. Check the "
                          f"trainer wrote its metrics file.")
    for i, r in enumerate(rows):
        if "step" not in r:
            raise RecordError(f"run {run_id!r}: step-log row {i} has no 'step' field; every row "
                              f"needs the trainer step number.")
    rows = sorted(rows, key=lambda r: (int(r["step"]), bool(r.get("final"))))
    step_rows = [r for r in rows if not r.get("final")]

    def eval_key(k: str) -> str | None:
        for p in eval_prefixes:
            if k.startswith(p) and len(k) > len(p):
                return k[len(p):]
        return None

    def col_name(k: str) -> str:
        for p in strip_prefixes:
            if k.startswith(p):
                return k[len(p):]
        return k

    cum_roll_key = next((k for k in ("rollouts_total", "rollouts_spent") if any(k in r for r in rows)), None)
    cum_sec_key = "seconds_total" if any("seconds_total" in r for r in rows) else None
    step_cols: list[str] = []
    dists: list[str] = []
    for r in rows:
        for k, v in r.items():
            if k in ("step", "final") or (v is not None and _num(v) is None):
                continue
            d = eval_key(k)
            if d is not None:
                if d not in mean_names and d not in dists:
                    dists.append(d)
            elif not r.get("final") and k not in step_cols:
                step_cols.append(k)
    if not dists:
        raise RecordError(f"run {run_id!r}: no held-out accuracy in the step log (no key starting "
                          f"with {list(eval_prefixes)}); log e.g. 'eval/<dist>' every k steps, or "
                          f"pass eval_prefixes=... naming your keys.")

    # cumulative rollouts after each step row
    roll_after = _cumulative(step_rows, cum_roll_key,
                             "rollouts" if cum_roll_key is None and any("rollouts" in r for r in step_rows)
                             else None)
    after = {int(r["step"]): v for r, v in zip(step_rows, roll_after)}
    # cumulative generated tokens after each step row, when every step logs `tokens`
    tok_after = None
    if step_rows and all(_num(r.get("tokens")) is not None for r in step_rows):
        tok_after = dict(zip((int(r["step"]) for r in step_rows),
                             np.cumsum([_num(r["tokens"]) for r in step_rows]).tolist()))

    steps: dict[str, list] = {"step": [int(r["step"]) for r in step_rows]}
    for k in step_cols:
        if k == cum_roll_key:
            continue
        name = "rollouts_step" if (k == "rollouts" and cum_roll_key is not None) else col_name(k)
        if k == "rollouts" and cum_roll_key is None:
            continue                          # becomes the cumulative column below
        steps[name] = [_num(r.get(k)) for r in step_rows]
    if any(v is not None for v in roll_after):
        steps["rollouts"] = [None if v is None else int(v) for v in roll_after]
        if cum_roll_key is None and any("rollouts" in r for r in step_rows):
            steps["rollouts_step"] = [_num(r.get("rollouts")) for r in step_rows]

    evals: dict[str, list] = {"step": [], "rollouts": [], **{f"acc/{d}": [] for d in dists},
                              "acc_mean": []}
    if tok_after is not None:
        evals["tokens"] = []
    for r in rows:
        vals = {d: None for d in dists}
        logged_mean, hit = None, False
        for k, v in r.items():
            d = eval_key(k)
            if d is None or _num(v) is None:
                continue
            hit = True
            if d in mean_names:
                logged_mean = float(v)
            else:
                vals[d] = float(v)
        if not hit:
            continue
        t = int(r["step"])
        if eval_at == "start" or r.get("final"):
            seen = t                                   # evaluated after t finished steps
            prev = [v for s_, v in after.items() if s_ < t and v is not None]
            roll = int(prev[-1]) if prev else 0
            tok = None if tok_after is None else int(max([v for s_, v in tok_after.items() if s_ < t],
                                                         default=0))
        else:
            seen = t + 1
            roll = None if after.get(t) is None else int(after[t])
            tok = None if tok_after is None else int(tok_after[t])
        if evals["step"] and evals["step"][-1] == seen:    # a final eval repeating the last one
            for key in list(evals):
                evals[key].pop()
        evals["step"].append(seen)
        evals["rollouts"].append(roll)
        if tok_after is not None:
            evals["tokens"].append(tok)
        for d in dists:
            evals[f"acc/{d}"].append(vals[d])
        present = [v for v in vals.values() if v is not None]
        evals["acc_mean"].append(logged_mean if logged_mean is not None else
                                 (float(np.mean(present)) if present else None))
    final_acc = {d: next((v for v in reversed(evals[f"acc/{d}"]) if v is not None), None)
                 for d in dists}
    present = [v for v in final_acc.values() if v is not None]
    rollouts = next((int(v) for v in reversed(roll_after) if v is not None), 0)
    if seconds is None:
        sec = _cumulative(step_rows, cum_sec_key, "seconds")
        seconds = float(next((v for v in reversed(sec) if v is not None), 0.0))
    n_steps_done = (int(step_rows[-1]["step"]) + 1) if step_rows else 0
    n_budget = int(budget_steps) if budget_steps is not None else n_steps_done
    status = "complete" if n_steps_done >= n_budget else "partial"
    rec = {"schema_version": SCHEMA_VERSION, "run_id": run_id, "label": label, "policy": policy,
           "policy_kwargs": dict(policy_kwargs or {}), "seed": int(seed), "suite": suite,
           "backend": backend, "status": status,
           "budget": {"steps": n_budget, "batch_size": batch_size, "group_size": group_size,
                      "eval_every": eval_every},
           "config": dict(config or {}), "steps": steps, "evals": evals,
           "final": {"acc": final_acc, "acc_mean": float(np.mean(present)) if present else None},
           "rollouts": int(rollouts), "seconds": float(seconds), "provenance": provenance()}
    if status == "partial":
        rec["error"] = f"the step log ends after {n_steps_done} of a budget of {n_budget} steps"
    if target is not None:
        rec["target"] = float(target)
        hit = [i for i, m in enumerate(evals["acc_mean"]) if m is not None and m >= target]
        rec["steps_to_target"] = evals["step"][hit[0]] if hit else None
        rec["rollouts_to_target"] = evals["rollouts"][hit[0]] if hit else None
    if benchmark_domains:
        rec["benchmark_domains"] = dict(benchmark_domains)
    return rec


def records_from_trainer_jsonl(path: str | os.PathLike, **identity) -> dict:
    """Read a trainer's per-step JSONL (one flat dict per line) and convert it with
    `record_from_step_log(rows, **identity)`."""
    return record_from_step_log(read_jsonl(path, RecordError), **identity)
