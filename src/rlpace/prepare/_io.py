"""Reading and writing prompt datasets for `rlpace prepare`.

Everything is carried as a `pyarrow.Table` so that every input column and the verl schema
(`data_source`, `prompt`, `ability`, `reward_model`, `extra_info`) survive untouched; the
annotations are appended as columns and as fields of the `extra_info` struct.

Formats, chosen by the path:
    *.parquet                  verl's own format (`pyarrow.parquet`)
    *.jsonl / *.json           JSON lines (a `*.json` file holding one JSON list also reads)
    a directory                a Hugging Face dataset saved with `save_to_disk`
                               (`datasets.load_from_disk`; a DatasetDict needs `split`)

Text extraction follows ADS `src/data_utils.py` (arXiv 2606.22305, docs/methods/ads.md, "Offline
pipeline"): the question is the stripped contents of the `user` messages of the verl
`prompt` chat list joined by a blank line (all roles when there is no user message), the
reference answer is a stripped string.
"""

from __future__ import annotations

from ..errors import InputError
import json
import math
import warnings
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

# The columns `prepare` writes, top level and inside extra_info.
ANNOTATIONS = ("cluster_id", "rank_in_cluster", "cluster_size", "difficulty")
_SHOW = 5  # how many offending rows an error or warning lists


def output_format(path: str | Path) -> str:
    """'parquet', 'jsonl' or 'hf' (a `save_to_disk` directory), from the path's suffix."""
    suffix = Path(path).suffix.lower()
    if suffix == ".parquet":
        return "parquet"
    if suffix in (".jsonl", ".json"):
        return "jsonl"
    return "hf"


def read_table(path: str | Path, *, split: str | None = None) -> pa.Table:
    """Read a verl-schema parquet file, a JSON-lines file or a local HF dataset directory.

    Args:
        path: `*.parquet`, `*.jsonl`/`*.json`, or a directory written by
            `datasets.Dataset.save_to_disk` / `DatasetDict.save_to_disk`.
        split: which split of a saved `DatasetDict` to read (default: its only split, or
            "train").

    Returns:
        The rows as a `pyarrow.Table`, in file order.

    Example:
        >>> table = read_table("train.parquet")          # doctest: +SKIP
        >>> table.column_names                           # doctest: +SKIP
        ['data_source', 'prompt', 'ability', 'reward_model', 'extra_info']
    """
    p = Path(path)
    if not p.exists():
        raise InputError(f"input {str(p)!r} does not exist; pass a .parquet or .jsonl file or a "
                         f"directory saved with datasets' save_to_disk.")
    if p.is_dir():
        return _read_hf(p, split)
    suffix = p.suffix.lower()
    if suffix == ".parquet":
        return pq.read_table(p)
    if suffix in (".jsonl", ".json"):
        return _read_jsonl(p)
    raise InputError(f"input {str(p)!r} has an unknown format {suffix!r}; use .parquet, .jsonl or "
                     f"a Hugging Face dataset directory (save_to_disk).")


def _read_jsonl(p: Path) -> pa.Table:
    text = p.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise InputError(f"{p}: a file starting with '[' must be one JSON array of objects; it is "
                             f"not valid JSON ({e}).") from None
    else:
        rows = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise InputError(f"{p}: line {lineno} is not valid JSON ({e.msg}); fix or remove "
                                 f"that line.") from None
    if not rows:
        return pa.table({})
    if not all(isinstance(r, dict) for r in rows):
        raise InputError(f"{p}: every JSON line must be an object (one row); found "
                         f"{type(next(r for r in rows if not isinstance(r, dict))).__name__}.")
    # pa.array infers the type over all rows (from_pylist would look at the first only).
    try:
        return pa.Table.from_struct_array(pa.array(rows))
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise InputError(f"{p}: rows disagree on a field's type ({e}); give each field one type "
                         f"in every row (e.g. all ids int or all str).") from None


def _read_hf(p: Path, split: str | None) -> pa.Table:
    try:
        import datasets
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("reading a dataset directory needs `datasets`: pip install datasets") from e
    ds = datasets.load_from_disk(str(p))
    if isinstance(ds, datasets.DatasetDict):
        names = list(ds.keys())
        if split is None:
            split = names[0] if len(names) == 1 else ("train" if "train" in names else None)
        if split not in ds:
            raise InputError(f"{p} holds splits {names}; pass split=... (--split) naming one.")
        ds = ds[split]
    # with_format("arrow")[:] honours any indices mapping left by select/shuffle.
    return ds.with_format("arrow")[:]


def write_table(table: pa.Table, path: str | Path) -> None:
    """Write `table` as parquet, JSON lines or a HF dataset directory (see `output_format`).

    JSON lines write NaN as null (JSON has no NaN); `Pool.from_jsonl` reads it back as NaN.

    Example:
        >>> write_table(pa.table({"x": [1, 2]}), "/tmp/x.parquet")   # doctest: +SKIP
    """
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fmt = output_format(p)
    if fmt == "parquet":
        pq.write_table(table, p)
    elif fmt == "jsonl":
        with open(p, "w", encoding="utf-8") as f:
            for row in table.to_pylist():
                f.write(json.dumps(_nan_to_none(row), ensure_ascii=False) + "\n")
    else:
        import datasets
        datasets.Dataset(table).save_to_disk(str(p))


def _nan_to_none(x: Any) -> Any:
    # JSON has no NaN; null reads back as NaN in Pool.from_records.
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: _nan_to_none(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_nan_to_none(v) for v in x]
    return x


# ---- columns ---------------------------------------------------------------------------

def _fields(t: pa.DataType) -> list[str]:
    return [t.field(i).name for i in range(t.num_fields)] if pa.types.is_struct(t) else []


def has_column(table: pa.Table, key: str) -> bool:
    """True when the dotted `key` (e.g. "reward_model.ground_truth") names a column."""
    parts = key.split(".")
    if parts[0] not in table.column_names:
        return False
    t = table.schema.field(parts[0]).type
    for part in parts[1:]:
        if part not in _fields(t):
            return False
        t = t.field(part).type
    return True


def check_column(table: pa.Table, key: str, role: str, flag: str) -> None:
    """ValueError naming the column, what exists, and the option that picks another."""
    if has_column(table, key):
        return
    parts = key.split(".")
    if parts[0] in table.column_names and len(parts) > 1:
        t = table.schema.field(parts[0]).type
        for part in parts[1:-1]:
            t = t.field(part).type if part in _fields(t) else pa.null()
        where = f"; the struct {'.'.join(parts[:-1])!r} has fields {_fields(t)}"
    else:
        where = ""
    raise InputError(f"{role} column {key!r} is not in the input (columns: {table.column_names}"
                     f"{where}); pass {flag} naming the column that holds the {role}.")


def column_values(table: pa.Table, key: str) -> list:
    """Python values of the dotted column `key` (None where a parent struct is null)."""
    parts = key.split(".")
    arr = table.column(parts[0]).combine_chunks()
    for part in parts[1:]:
        # pc.struct_field propagates the parent's nulls to the child.
        arr = pc.struct_field(arr, part)
    return arr.to_pylist()


def _message_text(value: Any) -> str:
    """ADS `_build_question_text(..., prompt_text_mode="user_only")` on one value."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, dict):
        value = [value]
    if isinstance(value, list):
        msgs = [m if isinstance(m, dict) else {"role": "user", "content": m} for m in value]

        def join(roles):
            chunks = [str(m.get("content") or "").strip() for m in msgs
                      if roles is None or str(m.get("role", "")).lower() in roles]
            return "\n\n".join(c for c in chunks if c)
        return join({"user"}) or join(None)
    return str(value).strip()


def _answer_text(value: Any) -> str:
    """A reference answer as stripped text: strings as they are, chat lists by their first
    message's content (ADS's `target` column), numbers and other values via JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, list) and value and isinstance(value[0], dict) and "content" in value[0]:
        return str(value[0]["content"] or "").strip()
    if isinstance(value, float) and math.isnan(value):
        return ""
    if isinstance(value, (int, float)):
        return str(value)
    return json.dumps(value, ensure_ascii=False).strip()


def question_texts(table: pa.Table, key: str = "prompt") -> list[str]:
    """The question of each row: user content of a verl chat list, or a string column.

    Example:
        >>> t = pa.table({"prompt": [[{"role": "system", "content": "Be brief."},
        ...                           {"role": "user", "content": " 2+2? "}]]})
        >>> question_texts(t)
        ['2+2?']
    """
    return [_message_text(v) for v in column_values(table, key)]


def answer_texts(table: pa.Table, key: str = "reward_model.ground_truth") -> list[str]:
    """The reference answer of each row as stripped text ("" when missing).

    Example:
        >>> answer_texts(pa.table({"reward_model": [{"ground_truth": " 4 "}, {"ground_truth": None}]}))
        ['4', '']
    """
    return [_answer_text(v) for v in column_values(table, key)]


# ---- extra_info.index ------------------------------------------------------------------

def resolve_index(table: pa.Table) -> tuple[np.ndarray, bool]:
    """The stable id of each row (`extra_info.index`), and whether it had to be created.

    When no row has an index, ids 0..N-1 are created (with a warning); partly missing or
    duplicated ids are a ValueError, since a scheduler maps feedback to prompts by them.
    """
    n = table.num_rows
    if "extra_info" in table.column_names:
        t = table.schema.field("extra_info").type
        if not pa.types.is_struct(t):
            raise InputError(f"column 'extra_info' has type {t}, not a struct; verl expects a dict "
                             f"per row (extra_info={{'index': ...}}). Convert it, or drop the column "
                             f"to let prepare create one.")
    if not has_column(table, "extra_info.index"):
        warnings.warn(f"the input has no extra_info.index; creating ids 0..{n - 1} (row order). "
                      f"Keep the written file as the training data so ids stay stable.", stacklevel=3)
        return np.arange(n, dtype=np.int64), True
    vals = column_values(table, "extra_info.index")
    missing = [i for i, v in enumerate(vals) if v is None]
    if len(missing) == n:
        warnings.warn(f"extra_info.index is null in every row; creating ids 0..{n - 1} (row order).",
                      stacklevel=3)
        return np.arange(n, dtype=np.int64), True
    if missing:
        raise InputError(f"extra_info.index is null in {len(missing)} of {n} rows (first rows: "
                         f"{missing[:_SHOW]}); give every row a unique index, or remove the field "
                         f"so that prepare creates 0..N-1.")
    ids = np.asarray(vals)
    ids = ids.astype(np.int64) if ids.dtype.kind in "iu" else ids.astype(str).astype(object)
    uniq, first, counts = np.unique(ids.astype(str) if ids.dtype == object else ids,
                                    return_index=True, return_counts=True)
    if len(uniq) != n:
        dup = uniq[counts > 1]
        raise InputError(f"extra_info.index has {int((counts - 1).sum())} duplicate ids (first: "
                         f"{dup[:_SHOW].tolist()}); each prompt needs a unique stable id. "
                         f"Deduplicate the rows or re-index them.")
    return ids, False


def annotate(table: pa.Table, columns: dict[str, np.ndarray], index: np.ndarray | None) -> pa.Table:
    """Append `columns` top level and inside the `extra_info` struct; set `extra_info.index`
    when `index` is given. Existing columns of the same name are replaced (with a warning)."""
    n = table.num_rows
    clash = [c for c in columns if c in table.column_names]
    if clash:
        warnings.warn(f"replacing existing columns {clash} with the new annotations.", stacklevel=3)
    new = {name: pa.array(val) for name, val in columns.items()}
    if index is not None:
        new_extra = {"index": pa.array(index)}
    else:
        new_extra = {}
    new_extra.update(new)
    if "extra_info" in table.column_names:
        ei = table.column("extra_info").combine_chunks()
        if isinstance(ei, pa.ChunkedArray):  # pragma: no cover - zero chunks
            ei = pa.array([None] * n, type=ei.type)
        names = _fields(ei.type)
        # flatten() gives the children with the parent's nulls merged in.
        kids = dict(zip(names, ei.flatten()))
        replaced = [k for k in new_extra if k in kids and k != "index"]
        if replaced:
            warnings.warn(f"replacing existing extra_info fields {replaced} with the new annotations.",
                          stacklevel=3)
        kids.update(new_extra)
        extra = pa.StructArray.from_arrays(list(kids.values()), names=list(kids.keys()))
        pos = table.column_names.index("extra_info")
        table = table.set_column(pos, "extra_info", extra)
    else:
        extra = pa.StructArray.from_arrays(list(new_extra.values()), names=list(new_extra.keys()))
        table = table.append_column("extra_info", extra)
    for name, arr in new.items():
        if name in table.column_names:
            table = table.set_column(table.column_names.index(name), name, arr)
        else:
            table = table.append_column(name, arr)
    return table


def first_rows(mask: np.ndarray, ids: np.ndarray, limit: int = _SHOW) -> dict:
    """{'count', 'rows', 'ids'}: how many rows are flagged, the first few positions and ids."""
    rows = np.flatnonzero(mask)
    return {"count": int(rows.size), "rows": rows[:limit].tolist(),
            "ids": [x.item() if hasattr(x, "item") else x for x in ids[rows[:limit]]]}


def texts_fingerprint(texts: Sequence[str]) -> str:
    """sha256 of the texts, stored beside saved embeddings to check a reuse matches."""
    import hashlib
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode("utf-8"))
        h.update(b"\x00")
    return h.hexdigest()
