"""`select`: read → check → generate (or read rollouts) → score → route → write; and `replay`."""

from __future__ import annotations

from ..errors import InputError
import json
from pathlib import Path
from typing import NamedTuple

import numpy as np

from rlpace.prepare import _io

from . import _manifest as mf
from ._generate import generate_rollouts, read_rollouts
from ._route import ROUTES, calibrate_thresholds, route_labeled, route_unlabeled, select_probes
from ._score import UNCERTAINTY, VERIFIERS, Evidence, score_groups, uncertainty_of

MODES = ("auto", "labeled", "unlabeled")
RULES = {"labeled": "pass_band_then_uncertainty", "unlabeled": "uncertainty_probes_calibrated"}


class SelectResult(NamedTuple):
    output: Path                # the next dataset
    annotate_path: Path         # rows routed annotate (annotation requests)
    manifest_path: Path         # the manifest JSON
    manifest: dict              # what manifest_path holds
    routes: np.ndarray          # object[N] route per input row
    evidence: Evidence | None   # None after a replay


def _check_pair(name: str, value, lo_ok=0.0, hi_ok=1.0) -> tuple[float, float]:
    try:
        lo, hi = (float(v) for v in value)
    except (TypeError, ValueError):
        raise InputError(f"{name} must be two numbers lo,hi; got {value!r}.") from None
    if not (lo_ok <= lo <= hi_ok and lo_ok <= hi <= hi_ok) or lo > hi:
        raise InputError(f"{name} must satisfy {lo_ok} ≤ lo ≤ hi ≤ {hi_ok}; got ({lo}, {hi}). "
                         f"Order the pair lo,hi.")
    return lo, hi


def _check_count(name: str, value, minimum: int = 0) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or int(value) != value or value < minimum:
        raise InputError(f"{name} must be an integer ≥ {minimum}; got {value!r}.")
    return int(value)


def labeled_rows(table) -> np.ndarray:
    """bool[N]: a row is labelled when `reward_model.ground_truth` is a non-empty value and
    `extra_info.labeled` (when present) is not False."""
    if _io.has_column(table, "reward_model.ground_truth"):
        gts = _io.answer_texts(table, "reward_model.ground_truth")
        lab = np.array([bool(g) for g in gts], dtype=bool)
    else:
        lab = np.zeros(table.num_rows, dtype=bool)
    if _io.has_column(table, "extra_info.labeled"):
        flags = _io.column_values(table, "extra_info.labeled")
        lab &= np.array([f is not False for f in flags], dtype=bool)
    return lab


def _read_input(data, out, paths: dict) -> tuple:
    p = Path(data)
    if not p.is_file():
        raise InputError(f"data {str(p)!r} is not a file; pass a verl-schema .parquet or .jsonl file.")
    for what, path in paths.items():
        if Path(path).resolve() == p.resolve():
            raise InputError(f"the {what} output {str(path)!r} is the input; write to a new path.")
    if _io.output_format(out) == "hf":
        raise InputError(f"out {str(out)!r} must end in .parquet or .jsonl.")
    table = _io.read_table(p)
    if table.num_rows == 0:
        raise InputError(f"data {str(p)!r} has no rows; nothing to select.")
    _io.check_column(table, "prompt", "prompt", "a verl `prompt` column")
    if not _io.has_column(table, "extra_info.index"):
        raise InputError(f"data {str(p)!r} has no extra_info.index; the manifest names prompts by it. "
                         f"Add a unique index per row, e.g. with `rlpace prepare IN --out OUT`.")
    ids, _ = _io.resolve_index(table)
    return table, ids


def select(data: str | Path, out: str | Path, *, model: str | Path | None = None,
           rollouts: str | Path | None = None, samples: int = 8, max_new_tokens: int = 512,
           temperature: float = 1.0, top_p: float = 1.0, batch_size: int = 8, seed: int = 0,
           device: str = "cpu", dtype: str = "float32", mode: str = "auto", budget: int | None = None,
           annotate_budget: int | None = None, band: tuple[float, float] = (0.1, 0.9),
           uncertainty: str = "answer_entropy", probes: int = 16,
           calibrate: tuple[float, float] = (0.1, 0.9), verifier: str = "auto",
           manifest: str | Path | None = None, progress: bool = True) -> SelectResult:
    """Budgeted offline data selection (DE-Venus active data selection, arXiv 2609.03324;
    docs/select.md): generate → score → route over a verl-schema dataset.

    1. Rollouts: G = `samples` completions per prompt from the local causal LM `model`
       (sampled, seeded), or precomputed ones from `rollouts` (JSONL, see `read_rollouts`).
    2. Evidence per prompt (`score_groups`): pass rate against `reward_model.ground_truth`
       (labelled rows), majority share and answer entropy, mean token entropy and
       self-certainty. `uncertainty` picks the ranking signal.
    3. Routes. mode "labeled" (default under "auto" when every row is labelled):
       `route_labeled` — lo ≤ pass rate ≤ hi (`band`, inclusive), then the `budget` most
       uncertain. mode "unlabeled" (auto otherwise): `select_probes` picks `probes` labelled
       prompts over the uncertainty quantiles, `calibrate_thresholds` sets t_discard (probes
       below it pass ≥ calibrate[1]) and t_annotate (probes above it pass ≤ calibrate[0]),
       `route_unlabeled` routes each prompt to discard / weak_supervision / annotate / keep
       within `budget` and `annotate_budget`. With fewer labelled rows than `probes`, the run
       is a probe round: the probes are routed annotate, nothing is discarded, the rest is
       weak supervision; label the probes and run again.
    4. Writes `out` (rows kept, `extra_info.labeled`), `<stem>.annotate<suffix>` (rows to
       label) and `<stem>.manifest.json` (or `manifest`), which `replay` rebuilds `out` from.

    Every check runs before any generation or writing; bad input raises ValueError.

    Example:
        >>> r = select("train.parquet", "next.parquet", model="models/Qwen3-4B-Base",  # doctest: +SKIP
        ...            samples=8, budget=4000, band=(0.1, 0.9))
        >>> r.manifest["counts"]                                                      # doctest: +SKIP
        {'keep': 4000, 'weak_supervision': 0, 'annotate': 0, 'discard': 10304}
    """
    # ---- checks, all before any work ------------------------------------------------------
    if (model is None) == (rollouts is None):
        raise InputError("pass exactly one of model (--model, a local causal LM to sample from) and "
                         "rollouts (--rollouts, a JSONL of precomputed rollouts).")
    if mode not in MODES:
        raise InputError(f"mode must be one of {MODES}; got {mode!r}.")
    if uncertainty not in UNCERTAINTY:
        raise InputError(f"uncertainty must be one of {UNCERTAINTY}; got {uncertainty!r}.")
    if verifier not in VERIFIERS:
        raise InputError(f"verifier must be one of {VERIFIERS}; got {verifier!r}.")
    budget = _check_count("budget (--budget)", budget)
    annotate_budget = _check_count("annotate_budget (--annotate-budget)", annotate_budget)
    probes = _check_count("probes (--probes)", probes, 1)
    band = _check_pair("band (--band)", band)
    calibrate = _check_pair("calibrate (--calibrate)", calibrate)
    if calibrate[0] == calibrate[1]:
        raise InputError(f"calibrate (--calibrate) needs lo < hi; got {calibrate}.")
    for name, val in (("samples", samples), ("max_new_tokens", max_new_tokens), ("batch_size", batch_size)):
        _check_count(name, val, 1)
    if not temperature > 0 or not 0 < top_p <= 1:
        raise InputError(f"temperature must be > 0 and 0 < top_p ≤ 1; got {temperature}, {top_p}.")
    paths = mf.output_paths(out, manifest)
    table, ids = _read_input(data, out, paths)
    labeled = labeled_rows(table)
    mode_used = mode if mode != "auto" else ("labeled" if labeled.all() else "unlabeled")
    if mode_used == "labeled" and not labeled.any():
        raise InputError("mode 'labeled' needs labelled rows (reward_model.ground_truth); none has one. "
                         "Use mode 'unlabeled' (--mode unlabeled).")
    probe_round = mode_used == "unlabeled" and labeled.sum() < probes
    if probe_round and annotate_budget is not None and annotate_budget < probes:
        raise InputError(f"only {int(labeled.sum())} rows are labelled, fewer than probes={probes}: this "
                         f"run asks for probe labels, which needs annotate_budget ≥ {probes} (got "
                         f"{annotate_budget}). Raise --annotate-budget or lower --probes.")
    if model is not None:
        from rlpace.prepare._models import check_model
        check_model(model, "model (--model)", causal_only=True)
        groups = None
    else:
        groups = read_rollouts(rollouts, ids)
    if uncertainty in ("token_entropy", "self_certainty") and groups is not None:
        lacking = [ids[i] for i, g in enumerate(groups) if uncertainty not in g]
        if lacking:
            raise InputError(f"uncertainty {uncertainty!r} needs {uncertainty!r} lists in the rollouts; "
                             f"{len(lacking)} prompts lack them (first ids "
                             f"{[plain_id(x) for x in lacking[:5]]}). Add them or "
                             f"rank by answer_entropy.")

    # ---- work -----------------------------------------------------------------------------
    if groups is None:
        groups = generate_rollouts(table, model, samples=samples, max_new_tokens=max_new_tokens,
                                   temperature=temperature, top_p=top_p, batch_size=batch_size, seed=seed,
                                   device=device, dtype=dtype, progress=progress)
    gts = _io.answer_texts(table, "reward_model.ground_truth") if labeled.any() else [""] * len(ids)
    abilities = (_io.column_values(table, "ability") if "ability" in table.column_names
                 else [None] * len(ids))
    ev = score_groups(groups, [g if lab else None for g, lab in zip(gts, labeled)], abilities,
                      verifier=verifier)
    u = uncertainty_of(ev, uncertainty)
    if np.isnan(u).any():   # cannot happen: generated responses hold ≥ 1 token, rollouts were checked
        raise InputError(f"uncertainty {uncertainty!r} is undefined for ids "
                         f"{[plain_id(ids[i]) for i in np.flatnonzero(np.isnan(u))[:5]]}; rank by "
                         f"answer_entropy.")
    probe_rows = np.zeros(0, np.int64)
    thresholds = {"discard_at_or_below": None, "annotate_at_or_above": None, "calibrated": False}
    if mode_used == "labeled":
        routes, reasons = route_labeled(ev.pass_rate, u, labeled, band=band, budget=budget)
    else:
        candidates = labeled if not probe_round else np.ones(len(ids), bool)
        probe_rows = select_probes(u, candidates, probes)
        if probe_round:
            t_d, t_a = -np.inf, np.inf
        else:
            t_d, t_a = calibrate_thresholds(u[probe_rows], ev.pass_rate[probe_rows],
                                            lo=calibrate[0], hi=calibrate[1])
        thresholds = {"discard_at_or_below": mf.json_number(t_d), "annotate_at_or_above": mf.json_number(t_a),
                      "calibrated": not probe_round}
        routes, reasons = route_unlabeled(u, labeled, t_d, t_a, probes=probe_rows, budget=budget,
                                          annotate_budget=annotate_budget)
    data_t, req_t = mf.build_outputs(table, routes)

    is_probe = np.zeros(len(ids), bool)
    is_probe[probe_rows] = True
    plain = [plain_id(x) for x in ids]
    source = ({"model": str(model), "samples": samples, "max_new_tokens": max_new_tokens,
               "temperature": temperature, "top_p": top_p, "batch_size": batch_size, "seed": seed,
               "device": device, "dtype": dtype} if model is not None else
              {"rollouts": str(rollouts), "rollouts_sha256": mf.file_sha256(rollouts)})
    man = {
        "format": mf.FORMAT, "version": mf.VERSION, "rlpace_version": _version(),
        "input": {"path": str(data), "sha256": mf.file_sha256(data), "rows": len(ids)},
        "rule": RULES[mode_used],
        "parameters": {"mode": mode, "mode_used": mode_used, "budget": budget,
                       "annotate_budget": annotate_budget, "band": list(band), "band_inclusive": True,
                       "uncertainty": uncertainty, "probes": probes, "calibrate": list(calibrate),
                       "verifier": verifier, "source": source},
        "thresholds": thresholds,
        "probe_ids": [plain[i] for i in probe_rows],
        "counts": {r: int((routes == r).sum()) for r in ROUTES},
        "outputs": {"data": paths["data"].name, "annotate": paths["annotate"].name},
        "prompts": [{"id": plain[i], "route": routes[i], "reason": reasons[i], "labeled": bool(labeled[i]),
                     "probe": bool(is_probe[i]), "uncertainty": mf.json_number(u[i]),
                     "pass_rate": mf.json_number(ev.pass_rate[i]), "n_samples": int(ev.n_samples[i]),
                     "majority_share": mf.json_number(ev.majority_share[i]),
                     "answer_entropy": mf.json_number(ev.answer_entropy[i]),
                     "token_entropy": mf.json_number(ev.token_entropy[i]),
                     "self_certainty": mf.json_number(ev.self_certainty[i]),
                     "majority_answer": ev.majority_answer[i]} for i in range(len(ids))],
    }
    text = json.dumps(man, indent=1, ensure_ascii=False, allow_nan=False)
    _write(paths, data_t, req_t, text)
    return SelectResult(paths["data"], paths["annotate"], paths["manifest"], man, routes, ev)


def _write(paths, data_t, req_t, manifest_text: str) -> None:
    _io.write_table(data_t, paths["data"])
    _io.write_table(req_t, paths["annotate"])
    paths["manifest"].parent.mkdir(parents=True, exist_ok=True)
    paths["manifest"].write_text(manifest_text + "\n", encoding="utf-8")


def replay(manifest: str | Path, data: str | Path, out: str | Path) -> SelectResult:
    """Rebuild the next dataset of a manifest without generating: the same rows, the same
    `extra_info.labeled`, written as `select` wrote them (byte-identical parquet with the
    same pyarrow). Writes `out`, `<stem>.annotate<suffix>` and a copy of the manifest at
    `<stem>.manifest.json` (unless that is the manifest itself).

    Raises ValueError, writing nothing, when `data`'s sha256 differs from the manifest's,
    or when their ids differ.

    Example:
        >>> replay("next.manifest.json", "train.parquet", "next.again.parquet")  # doctest: +SKIP
    """
    m = mf.read_manifest(manifest)
    paths = mf.output_paths(out)
    table, ids = _read_input(data, out, paths)
    digest = mf.file_sha256(data)
    if digest != m["input"]["sha256"]:
        raise InputError(f"data {str(data)!r} has sha256 {digest[:12]}…, the manifest was made from "
                         f"{m['input']['sha256'][:12]}… ({m['input'].get('path')!r}); replay it on that file.")
    routes = mf.routes_from_manifest(m, ids, f"data {str(data)!r}")
    data_t, req_t = mf.build_outputs(table, routes)
    same = paths["manifest"].resolve() == Path(manifest).resolve()
    _io.write_table(data_t, paths["data"])
    _io.write_table(req_t, paths["annotate"])
    if not same:
        paths["manifest"].write_text(Path(manifest).read_text(encoding="utf-8"), encoding="utf-8")
    return SelectResult(paths["data"], paths["annotate"], paths["manifest"], m, routes, None)


def plain_id(x):
    """A numpy scalar id as its Python value (JSON writes int and str ids as they are)."""
    return x.item() if hasattr(x, "item") else x


def _version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("rlpace")
    except PackageNotFoundError:
        return None
