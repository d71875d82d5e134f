"""The selection manifest: a plain-JSON record of one dataset transition D(k) → D(k+1).

It holds the input file's sha256, the rule and every parameter, the thresholds, and per
prompt id (`extra_info.index`) the route, the reason and the evidence numbers. `replay`
rebuilds the same next dataset from it without generating anything. Only `json.loads`
reads it: nothing in a manifest can run code.
"""

from __future__ import annotations

from ..errors import InputError
import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa

from ._route import ROUTES

FORMAT = "rlpace.select.manifest"
VERSION = 1


def file_sha256(path: str | Path) -> str:
    """sha256 hex digest of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def json_number(x) -> float | None:
    """A finite float, or None for NaN/±inf (JSON has neither)."""
    x = float(x)
    return x if math.isfinite(x) else None


def output_paths(out: str | Path, manifest: str | Path | None = None) -> dict[str, Path]:
    """{"data": out, "annotate": <stem>.annotate<suffix>, "manifest": <stem>.manifest.json}."""
    out = Path(out)
    stem = out.with_suffix("")
    return {"data": out, "annotate": Path(f"{stem}.annotate{out.suffix}"),
            "manifest": Path(manifest) if manifest is not None else Path(f"{stem}.manifest.json")}


def with_labeled(table: pa.Table, labeled: np.ndarray) -> pa.Table:
    """`table` with `extra_info.labeled` (bool) set, replacing a field of that name."""
    field = pa.array(np.asarray(labeled, dtype=bool))
    ei = table.column("extra_info").combine_chunks()
    names = [ei.type.field(i).name for i in range(ei.type.num_fields)]
    kids = dict(zip(names, ei.flatten()))
    kids["labeled"] = field
    extra = pa.StructArray.from_arrays(list(kids.values()), names=list(kids.keys()))
    return table.set_column(table.column_names.index("extra_info"), "extra_info", extra)


def build_outputs(table: pa.Table, routes: np.ndarray) -> tuple[pa.Table, pa.Table]:
    """(next dataset, annotation requests) in input row order.

    The next dataset holds the rows routed keep (`extra_info.labeled` True) and
    weak_supervision (False); the requests hold the rows routed annotate (False)."""
    routes = np.asarray(routes, dtype=object)
    rows = np.flatnonzero((routes == "keep") | (routes == "weak_supervision"))
    data = with_labeled(table.take(pa.array(rows, pa.int64())), routes[rows] == "keep")
    ann = np.flatnonzero(routes == "annotate")
    requests = with_labeled(table.take(pa.array(ann, pa.int64())), np.zeros(ann.size, bool))
    return data, requests


def read_manifest(path: str | Path) -> dict:
    """The manifest at `path`, checked: format, version, and a route in ROUTES per prompt."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"manifest {str(p)!r} is not a file; pass the .manifest.json `rlpace select` wrote.")
    try:
        m = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"manifest {str(p)!r} is not valid JSON ({e}); pass the file `rlpace select` "
                         f"wrote.") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise InputError(f"manifest {str(p)!r} is not an rlpace select manifest (format {FORMAT!r}).")
    if m.get("version") != VERSION:
        raise InputError(f"manifest {str(p)!r} has version {m.get('version')!r}; this rlpace reads "
                         f"version {VERSION}.")
    prompts = m.get("prompts")
    if not isinstance(prompts, list) or not all(
            isinstance(r, dict) and isinstance(r.get("id"), (int, str)) and not isinstance(r.get("id"), bool)
            and r.get("route") in ROUTES for r in prompts):
        raise InputError(f"manifest {str(p)!r}: 'prompts' must list objects with an int or str 'id' "
                         f"and a 'route' in {ROUTES}.")
    if not isinstance(m.get("input"), dict) or not isinstance(m["input"].get("sha256"), str):
        raise InputError(f"manifest {str(p)!r} has no input.sha256.")
    return m


def routes_from_manifest(m: dict, ids: np.ndarray, source: str) -> np.ndarray:
    """object[N] routes of the input rows (ids in row order) from a checked manifest."""
    pos = {(type(i).__name__, i): k for k, i in enumerate(x.item() if hasattr(x, "item") else x
                                                          for x in ids)}
    routes = np.full(len(ids), None, dtype=object)
    unknown = []
    for r in m["prompts"]:
        k = pos.get((type(r["id"]).__name__, r["id"]))
        if k is None:
            unknown.append(r["id"])
            continue
        if routes[k] is not None:
            raise InputError(f"manifest lists id {r['id']!r} twice; it is corrupt.")
        routes[k] = r["route"]
    if unknown:
        raise InputError(f"manifest has {len(unknown)} ids that are not in {source} (first "
                         f"{unknown[:5]}); replay it on the file it was made from.")
    missing = [ids[k] for k in np.flatnonzero(routes == None)]  # noqa: E711 - elementwise
    if missing:
        raise InputError(f"{source} has {len(missing)} ids the manifest does not list (first "
                         f"{[x.item() if hasattr(x, 'item') else x for x in missing[:5]]}); replay it "
                         f"on the file it was made from.")
    return routes
