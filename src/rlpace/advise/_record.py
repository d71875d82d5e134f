"""The pilot record: what a short run (or a zero-training profile) tells `rlpace advise`.

One JSON Lines file (UTF-8). The first line is a header, every other line one generated
batch (a step's first batch, or one of its refills):

    {"format": "rlpace-pilot", "version": 1, "reward_range": [0.0, 1.0],
     "success_threshold": 0.5, "ids": "pool" | "positions", "kind": "training" | "profile",
     "created": "...", "rlpace": "0.1.0"}
    {"step": 0, "prompt_ids": [17, 4, ...], "rewards": [[1.0, 0.0, ...], ...],
     "rollouts": 128, "eval": {"acc_mean": 0.41, "acc": {"math": 0.41}, "n": {"math": 64}} | null}
    {"step": 50, "eval": {"acc_mean": 0.63}}          (an evaluation without a batch: the final one)

`prompt_ids` are the pool's stable ids (`Pool.ids`, verl's `extra_info.index`) when the
writer was given the pool, else pool positions (`"ids": "positions"`); `rewards` is [B, G], or
one list of N_i rewards per prompt when a rollout-allocation policy gave the prompts different
counts (ragged rows; N_i = 0 is an empty list); `rollouts` every rollout the batch cost
(refills, probes and measurements included; default B·G, or Σ N_i); `eval` the held-out evaluation made before this batch, if any
(`acc` per domain and `n`, the held-out prompts per domain — one int for all or a dict — are
optional; with both, advise fits each domain's held-out solved share). A rollout is a success
when its reward ≥ `success_threshold`: the fitted learner models binary outcomes, as GRPO's
verifiable rewards are.

Three sources give a `Pilot`: `read_pilot` (this file), `pilot_from_select` (the manifest of
`rlpace select`: a zero-training profile, G samples per prompt from the base model, pass
rates only) and `pilot_from_run_dir` (a built-in trainer run directory: its metrics.jsonl
logs `prompt_ids` per step but only the batch's mean reward, not one reward per rollout, so
it is refused with that reason unless a step also logs `group_rewards`).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ..errors import InputError
from ..types import Feedback, Pool

__all__ = ["PilotRecorder", "Pilot", "read_pilot", "pilot_from_select", "pilot_from_run_dir", "load_pilot",
           "FORMAT", "VERSION"]

FORMAT, VERSION = "rlpace-pilot", 1


class Pilot(NamedTuple):
    """A pilot as the fit reads it: one row per generated group.

    Attributes:
        prompt_ids: object[M] the prompts' ids as recorded (pool ids or positions).
        step: int64[M] trainer step each group was generated at.
        rewards: float64[M, G] rewards; with ragged groups, row m's first `sizes[m]` entries
            (G = the largest group, padding 0).
        step_rollouts: dict step -> rollouts spent at that step (refills, probes included).
        evals: list of (step, rollouts spent before it, acc_mean) held-out evaluations.
        reward_range: (low, high) the record declares; success_threshold: reward ≥ it is a success.
        ids: "pool" (stable ids) or "positions".
        kind: "training" (a run that learned) or "profile" (base-model samples, no training).
        sizes: int64[M] rollouts of each group when they differ (a pilot recorded with a
            rollout-allocation policy: N_i ≥ 0 per prompt), None when every group has G.
        domain_evals: tuple of (step, {domain: accuracy}, {domain: held-out prompts} or None)
            — the per-domain held-out evaluations an eval record carries ("acc", and "n" when
            the writer gives the held-out set's size; `fit_heldout_solved` needs it).
    """

    prompt_ids: np.ndarray
    step: np.ndarray
    rewards: np.ndarray
    step_rollouts: dict
    evals: list
    reward_range: tuple
    success_threshold: float
    ids: str
    kind: str
    sizes: np.ndarray | None = None
    domain_evals: tuple = ()

    @property
    def steps(self) -> np.ndarray:
        """int64[T] the distinct steps, in order."""
        return np.unique(self.step)

    @property
    def rollouts(self) -> int:
        """Rollouts the pilot cost in total."""
        return int(sum(self.step_rollouts.values()))

    @property
    def group_size(self) -> int:
        """G: the rollouts per group, or with ragged groups the mean Σ N_i / M rounded (the
        step's budget per prompt, W / B, when the record lists the prompts allocated 0)."""
        if self.sizes is None:
            return int(self.rewards.shape[1])
        return int(max(1, round(float(self.sizes.sum()) / max(self.sizes.shape[0], 1))))

    @property
    def group_sizes(self) -> np.ndarray:
        """int64[M] rollouts of each group (G for all when the groups are equal)."""
        if self.sizes is not None:
            return self.sizes
        return np.full(self.rewards.shape[0], self.rewards.shape[1], dtype=np.int64)

    @property
    def valid(self) -> np.ndarray:
        """bool[M, G] the rewards that were generated (False on a ragged row's padding)."""
        return np.arange(self.rewards.shape[1])[None, :] < self.group_sizes[:, None]

    @property
    def batch_size(self) -> int:
        """Median groups per step: the batch the fitted learner trains on."""
        _, counts = np.unique(self.step, return_counts=True)
        return int(max(1, round(float(np.median(counts)))))

    def positions(self, pool: Pool) -> np.ndarray:
        """int64[M] pool positions of every group's prompt; InputError naming the fix when
        the pilot was recorded on another pool."""
        if self.ids == "positions":
            pos = np.asarray([int(x) for x in self.prompt_ids], dtype=np.int64)
            if pos.size and (pos.min() < 0 or pos.max() >= len(pool)):
                raise InputError(f"the pilot's prompt positions reach {int(pos.max())} but --pool has {len(pool)} "
                                 f"prompts: the pilot was recorded on another pool; pass the pool it ran on.")
            return pos
        try:
            return pool.index_of(list(self.prompt_ids))
        except InputError as e:
            raise InputError(f"the pilot names prompts that --pool does not have ({e}); it was recorded on "
                             f"another pool: pass the pool it ran on.") from None


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


class PilotRecorder:
    """Append a trainer's batches to a pilot record, one line each (see the module docstring).

    Any trainer can call it after each generated batch:

        rec = PilotRecorder("pilot.jsonl", pool=pool)         # header written once
        rec.write(fb, rollouts=n_spent, eval={"acc_mean": 0.41})

    Args:
        path: the JSONL file; created (with its header) if absent or empty, appended to
            otherwise (a resumed run keeps writing the same record).
        pool: when given, prompt ids are written as the pool's stable ids (`Pool.ids`), so
            the record names the prompts whatever the file's row order; else as positions.
        reward_range: (low, high) every reward lies in; a reward outside is refused.
        success_threshold: reward ≥ this is a success (the fit models binary outcomes).
        kind: "training" or "profile".
        restart_at: None appends to the file as it is; a step k keeps only its lines of steps
            before k (0: a new record), as a run that starts (k = 0) or resumes at step k needs.
    """

    def __init__(self, path, pool: Pool | None = None, *, reward_range=(0.0, 1.0), success_threshold: float = 0.5,
                 kind: str = "training", restart_at: int | None = None):
        lo, hi = (float(x) for x in reward_range)
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise InputError(f"PilotRecorder reward_range must be two finite numbers low < high; got {reward_range!r}.")
        if not lo <= float(success_threshold) <= hi:
            raise InputError(f"PilotRecorder success_threshold {success_threshold} must lie in reward_range "
                             f"[{lo}, {hi}].")
        if kind not in ("training", "profile"):
            raise InputError(f"PilotRecorder kind must be 'training' or 'profile'; got {kind!r}.")
        self.path, self.pool = Path(path), pool
        self.reward_range, self.success_threshold = (lo, hi), float(success_threshold)
        if restart_at is not None and self.path.exists():
            lines = [ln for ln in self.path.read_text(encoding="utf-8").splitlines() if ln.strip()]
            keep = lines[:1] + [ln for ln in lines[1:] if json.loads(ln)["step"] < restart_at] if restart_at else []
            self.path.write_text("".join(ln + "\n" for ln in keep), encoding="utf-8")
        if not self.path.exists() or self.path.stat().st_size == 0:
            from .. import __version__
            header = {"format": FORMAT, "version": VERSION, "reward_range": [lo, hi],
                      "success_threshold": self.success_threshold, "ids": "pool" if pool is not None else "positions",
                      "kind": kind, "created": _now(), "rlpace": __version__}
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps(header) + "\n", encoding="utf-8")

    def write(self, fb: Feedback, *, rollouts: int | None = None, eval: Any = None) -> None:
        """Append one batch. `rollouts`: what it cost (default B·G); `eval`: a held-out
        evaluation made before it, a float (mean accuracy) or {"acc_mean": float, "acc": {...}}."""
        r = np.asarray(fb.rewards, dtype=np.float64)
        lo, hi = self.reward_range
        if r.size and (r.min() < lo or r.max() > hi):
            raise InputError(f"PilotRecorder.write: rewards span [{r.min():g}, {r.max():g}], outside the declared "
                             f"reward_range [{lo:g}, {hi:g}]; declare the range your verifier returns.")
        own = _rollouts_of(fb)
        n = int(own if rollouts is None else rollouts)
        if n < own:
            raise InputError(f"PilotRecorder.write rollouts={rollouts} is less than the batch's {own} rollouts; "
                             f"count every generated rollout (refills and probes included).")
        ev = _eval_record(eval)
        ids = fb.prompt_ids if self.pool is None else self.pool.ids[fb.prompt_ids]
        sizes = getattr(fb, "group_sizes", None)      # ragged groups: row i's first N_i rewards
        rows = r.tolist() if sizes is None else [row[:k] for row, k in zip(r.tolist(), sizes.tolist())]
        line = {"step": int(fb.step), "prompt_ids": [x.item() if hasattr(x, "item") else x for x in ids],
                "rewards": rows, "rollouts": n, "eval": ev}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line, allow_nan=False) + "\n")


    def write_step(self, fbs: list, *, rollouts: int, eval: Any = None) -> None:
        """Append a trainer step: one line per generated batch `fbs` (the first batch, then its
        refills). `rollouts` is all the step cost; what exceeds the batches' own rollouts
        (probes) is charged to the first line, and `eval` goes with it."""
        extra = int(rollouts) - sum(_rollouts_of(fb) for fb in fbs)
        for k, fb in enumerate(fbs):
            first = k == 0
            self.write(fb, rollouts=_rollouts_of(fb) + (extra if first else 0), eval=eval if first else None)

    def write_eval(self, step: int, eval: Any) -> None:
        """Append a held-out evaluation without a batch (e.g. the final one, after the last step)."""
        line = {"step": int(step), "eval": _eval_record(eval)}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line, allow_nan=False) + "\n")


def _rollouts_of(fb) -> int:
    """Rollouts a batch holds: B·G, or Σ N_i for ragged groups (`Feedback.group_sizes`)."""
    sizes = getattr(fb, "group_sizes", None)
    return int(np.asarray(fb.rewards).size) if sizes is None else int(np.sum(sizes))


def _eval_record(ev: Any) -> dict | None:
    if ev is None:
        return None
    if isinstance(ev, dict) and "acc_mean" not in ev and "mean" in ev:     # the trainer's heldout_accuracy
        ev = {"acc_mean": ev["mean"], "acc": {k: v for k, v in ev.items() if k not in ("mean", "n")},
              **({"n": ev["n"]} if "n" in ev else {})}
    if isinstance(ev, (int, float, np.floating)) and not isinstance(ev, bool):
        ev = {"acc_mean": float(ev)}
    if not isinstance(ev, dict) or not isinstance(ev.get("acc_mean"), (int, float)) \
            or not math.isfinite(float(ev["acc_mean"])):
        raise InputError(f"pilot eval must be a finite mean accuracy or {{'acc_mean': float, 'acc': {{...}}}}; "
                         f"got {ev!r}.")
    return {"acc_mean": float(ev["acc_mean"]), **({"acc": ev["acc"]} if "acc" in ev else {}),
            **({"n": ev["n"]} if "n" in ev else {})}


def _domain_eval(t: int, ev: dict) -> tuple | None:
    """(step, {domain: accuracy}, {domain: n} or None) of an eval record with per-domain
    accuracies; an InputError for an accuracy that is not a finite number in [0, 1] or a
    held-out size that is not a whole number ≥ 0 (they enter the held-out fit's likelihood)."""
    acc = ev.get("acc")
    if not isinstance(acc, dict) or not acc:
        return None
    n = ev.get("n")
    n = {k: n for k in acc} if isinstance(n, int) and not isinstance(n, bool) else n
    out = {}
    for k, v in acc.items():
        a = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan
        if not 0.0 <= a <= 1.0:                      # NaN fails too
            raise InputError(f"pilot eval at step {t}: acc[{k!r}] = {v!r} must be a finite accuracy in [0, 1]; "
                             f"fix the writer's per-domain accuracies or leave 'acc' out.")
        out[str(k)] = a
    if isinstance(n, dict):
        for k, v in n.items():
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise InputError(f"pilot eval at step {t}: n[{k!r}] = {v!r} must be a whole number of held-out "
                                 f"prompts (≥ 0); fix the writer's held-out sizes or leave 'n' out.")
    return int(t), out, ({str(k): int(v) for k, v in n.items()} if isinstance(n, dict) else None)


def read_pilot(path) -> Pilot:
    """Read a pilot record; InputError naming the line and the fix for anything malformed,
    including a reward outside the declared range."""
    path = Path(path)
    lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    if not lines:
        raise InputError(f"pilot {path} is empty; record one with rlpace.advise.PilotRecorder.")
    try:
        header = json.loads(lines[0])
    except json.JSONDecodeError as e:
        raise InputError(f"pilot {path} line 1 is not JSON ({e}); its first line is the header.") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise InputError(f"pilot {path} has no rlpace-pilot header on line 1; write it with "
                         f"rlpace.advise.PilotRecorder (or pass an `rlpace select` manifest).")
    if header.get("version") != VERSION:
        raise InputError(f"pilot {path} has version {header.get('version')!r}; this rlpace reads version {VERSION}.")
    lo, hi = (float(x) for x in header.get("reward_range", (0.0, 1.0)))
    thr = float(header.get("success_threshold", 0.5))
    ids, steps, rows, sizes, spent, evals, dev = [], [], [], [], {}, [], []
    for n, ln in enumerate(lines[1:], start=2):
        try:
            rec = json.loads(ln)
            if isinstance(rec, dict) and "rewards" not in rec and rec.get("eval") is not None:   # an eval alone
                er = _eval_record(rec["eval"])
                evals.append((int(rec["step"]), sum(spent.values()), er["acc_mean"]))
                dev.append(_domain_eval(int(rec["step"]), er))
                continue
            t, pid, raw = int(rec["step"]), list(rec["prompt_ids"]), rec["rewards"]
            if not isinstance(raw, list) or not all(isinstance(r, list) for r in raw):
                raise TypeError("rewards is not a list of lists")
            size = np.array([len(r) for r in raw], dtype=np.int64)          # [B] N_i: ragged with allocation
            rew = np.zeros((len(raw), int(size.max(initial=0))))
            for i, r in enumerate(raw):
                rew[i, :len(r)] = np.asarray(r, dtype=np.float64)
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise InputError(f"pilot {path} line {n} is not a batch record ({type(e).__name__}: {e}); each line "
                             f"needs step, prompt_ids and rewards [B, G] (or one list of N_i rewards per "
                             f"prompt).") from None
        if rew.shape[0] != len(pid) or not np.isfinite(rew).all():
            raise InputError(f"pilot {path} line {n}: rewards must be finite, one row per prompt id; got "
                             f"{rew.shape[0]} rows for {len(pid)} ids.")
        live = rew[np.arange(rew.shape[1])[None, :] < size[:, None]]
        if live.size and (live.min() < lo or live.max() > hi):
            raise InputError(f"pilot {path} line {n}: rewards span [{live.min():g}, {live.max():g}], outside the "
                             f"declared reward_range [{lo:g}, {hi:g}]; fix the verifier or the header's range.")
        ev = rec.get("eval")
        if ev is not None:
            er = _eval_record(ev)
            evals.append((t, sum(spent.values()), er["acc_mean"]))
            dev.append(_domain_eval(t, er))
        spent[t] = spent.get(t, 0) + int(rec.get("rollouts", int(size.sum())))
        ids += pid
        steps += [t] * len(pid)
        if len(pid):
            rows.append(rew)
            sizes.append(size)
    if not rows or not sum(int(s.sum()) for s in sizes):
        raise InputError(f"pilot {path} holds no batch; record at least one step.")
    g = max(r.shape[1] for r in rows)
    sizes = np.concatenate(sizes)
    rewards = np.concatenate([np.pad(r, ((0, 0), (0, g - r.shape[1]))) for r in rows])
    return Pilot(np.asarray(ids, dtype=object), np.asarray(steps, dtype=np.int64), rewards, spent,
                 evals, (lo, hi), thr, str(header.get("ids", "pool")), str(header.get("kind", "training")),
                 None if (sizes == g).all() else sizes, tuple(d for d in dev if d is not None))


def pilot_from_select(manifest_path) -> Pilot:
    """A zero-training profile from `rlpace select`'s manifest: each prompt's G samples as
    round(pass_rate·n_samples) successes (the manifest keeps pass rates, not the rewards).
    Prompts without a pass rate (unlabelled rows) are left out."""
    m = json.loads(Path(manifest_path).read_text(encoding="utf-8"))
    if not isinstance(m, dict) or not isinstance(m.get("prompts"), list):
        raise InputError(f"{manifest_path} is not an `rlpace select` manifest (no 'prompts' list).")
    rows = [p for p in m["prompts"] if isinstance(p, dict) and p.get("pass_rate") is not None
            and int(p.get("n_samples", 0)) > 0]
    if not rows:
        raise InputError(f"{manifest_path} has no prompt with a pass rate; profile labelled prompts.")
    g = max(int(p["n_samples"]) for p in rows)
    rows = [p for p in rows if int(p["n_samples"]) == g]          # one group size: the fit needs it
    wins = np.rint(np.asarray([float(p["pass_rate"]) for p in rows]) * g)
    rewards = (np.arange(g)[None, :] < wins[:, None]).astype(np.float64)
    return Pilot(np.asarray([p["id"] for p in rows], dtype=object), np.zeros(len(rows), np.int64), rewards,
                 {0: int(rewards.size)}, [], (0.0, 1.0), 0.5, "pool", "profile")


def pilot_from_run_dir(run_dir) -> Pilot:
    """A pilot from a built-in trainer run directory's metrics.jsonl, when every step logged
    `prompt_ids` and `group_rewards` [B, G]. The trainer's log has had `prompt_ids` and the
    batch's `reward_mean` only: such a directory is refused with that reason (record the
    pilot with `PilotRecorder` instead)."""
    path = Path(run_dir) / "metrics.jsonl"
    recs = [json.loads(ln) for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    train = [r for r in recs if "prompt_ids" in r]
    if not train:
        raise InputError(f"{path} logs no training step (no prompt_ids); nothing to fit.")
    if any("group_rewards" not in r for r in train):
        raise InputError(f"{path} logs each step's prompt_ids and mean reward but not one reward per rollout "
                         f"('group_rewards'): the learner cannot be fitted from it; record the pilot with "
                         f"rlpace.advise.PilotRecorder.")
    ids, steps, rows, spent, evals = [], [], [], {}, []
    done = 0
    for r in recs:
        if "eval/mean" in r and not r.get("final"):
            evals.append((int(r.get("step", 0)), done, float(r["eval/mean"])))
        if "prompt_ids" not in r:
            continue
        rew = np.asarray(r["group_rewards"], dtype=np.float64)
        t = int(r["step"])
        ids += list(r["prompt_ids"])[: rew.shape[0]]
        steps += [t] * rew.shape[0]
        rows.append(rew)
        spent[t] = int(r.get("rollouts_total", done + rew.size)) - done
        done += spent[t]
    return Pilot(np.asarray(ids, dtype=object), np.asarray(steps, np.int64), np.concatenate(rows), spent, evals,
                 (0.0, 1.0), 0.5, "positions", "training")


def load_pilot(path) -> Pilot:
    """Any of the three sources: a run directory, an `rlpace select` manifest (.json), or a
    pilot record (.jsonl)."""
    p = Path(path)
    if p.is_dir():
        return pilot_from_run_dir(p)
    if not p.exists():
        raise FileNotFoundError(2, "No such file", str(p))
    if p.suffix == ".json":
        return pilot_from_select(p)
    return read_pilot(p)
