"""Items to and from the verl parquet schema (verl `examples/data_preprocess/*.py`):

| column                      | type                        | from `Item`         |
|-----------------------------|-----------------------------|---------------------|
| `data_source`               | string                      | `domain`            |
| `prompt`                    | list<{role, content}>       | `[{"role": "user", "content": prompt}]` |
| `ability`                   | string                      | `ability`           |
| `reward_model`              | {style, ground_truth}       | `{"rule", answer}`  |
| `extra_info`                | {index, split, difficulty, entry} | `index`, split, `difficulty`, `entry` |

`Pool.from_parquet` reads the same files (domain = `data_source`, id = `extra_info.index`,
difficulty from `extra_info.difficulty`).
"""

from __future__ import annotations

from ..errors import InputError
import math
from pathlib import Path

from ..types import read_jsonl as json_lines
from ._types import Item, TaskSet

__all__ = ["items_to_rows", "rows_to_items", "write_parquet", "read_parquet",
           "write_taskset", "read_taskset"]


def items_to_rows(items, split: str = "train") -> list[dict]:
    """verl-schema row dicts for `items`."""
    return [{"data_source": it.domain,
             "prompt": [{"role": "user", "content": it.prompt}],
             "ability": it.ability,
             "reward_model": {"style": "rule", "ground_truth": str(it.answer)},
             "extra_info": {"index": int(it.index), "split": split,
                            "difficulty": float(it.difficulty), "entry": it.entry}}
            for it in items]


def _prompt_text(prompt) -> str:
    if isinstance(prompt, str):
        return prompt
    users = [m["content"] for m in prompt if m.get("role") == "user"]
    if not users:
        raise InputError("a verl row's `prompt` has no user message; expected "
                         "[{'role': 'user', 'content': ...}].")
    return users[-1]


def rows_to_items(rows) -> list[Item]:
    """Items from verl-schema rows; without `extra_info.difficulty`, NaN.

    `extra_info.index` is required in every row (ValueError listing the rows otherwise), as
    `Pool.from_records` and the verl adapter require it: it is the prompt's id in feedback,
    checkpoints and run records, and verl silently defaults a missing index to 0."""
    missing = [i for i, r in enumerate(rows) if not isinstance(r.get("extra_info"), dict)
               or r["extra_info"].get("index") is None]
    if missing:
        raise InputError(f"extra_info.index is missing in {len(missing)} of {len(rows)} rows (first rows: "
                         f"{missing[:5]}); rlpace names prompts by this stable id (verl would default it to "
                         f"0). Write a unique extra_info.index per row, e.g. with `rlpace prepare IN --out OUT` "
                         f"or, in pandas, df['extra_info'] = [{{**(e or {{}}), 'index': i}} "
                         f"for i, e in enumerate(df['extra_info'])].")
    out = []
    for i, r in enumerate(rows):
        for col in ("data_source", "prompt", "reward_model"):
            if col not in r or r[col] is None:
                raise InputError(f"verl row {i} has no {col!r} column; the verl schema needs "
                                 f"data_source, prompt, reward_model.ground_truth.")
        extra = r.get("extra_info") or {}
        diff = extra.get("difficulty")
        out.append(Item(prompt=_prompt_text(r["prompt"]), answer=str(r["reward_model"]["ground_truth"]),
                        domain=str(r["data_source"]),
                        difficulty=math.nan if diff is None else float(diff),
                        index=int(extra["index"]),
                        ability=str(r.get("ability") or "exact"), entry=extra.get("entry") or ""))
    return out


def write_parquet(items, path, split: str = "train") -> Path:
    """Write items as one verl-schema parquet file; returns the path."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(items_to_rows(items, split)), path)
    return path


def read_parquet(path) -> list[Item]:
    """Items from a verl-schema parquet file."""
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise InputError(f"parquet file {str(path)!r} does not exist.")
    return rows_to_items(pq.read_table(path).to_pylist())


def read_jsonl(path) -> list[Item]:
    """Items from a verl-schema JSON-lines file (what `rlpace prepare --out x.jsonl` writes)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"JSON-lines file {str(path)!r} does not exist.")
    return rows_to_items(json_lines(path))


def _read_named(path, what: str) -> list[Item]:
    try:
        return read_jsonl(path) if str(path).endswith((".jsonl", ".json")) else read_parquet(path)
    except ValueError as e:
        raise InputError(f"{what} file {str(path)!r}: {e}") from None


def write_taskset(ts: TaskSet, directory) -> tuple[Path, Path]:
    """`directory/train.parquet` and `directory/test.parquet` (held-out), as verl reads them."""
    d = Path(directory)
    return write_parquet(ts.train, d / "train.parquet", "train"), write_parquet(ts.heldout, d / "test.parquet", "test")


def read_taskset(train_path, test_path=None, name: str | None = None) -> TaskSet:
    """A `TaskSet` from verl parquet files. Scorers by `ability`: "exact" → exact match,
    "math" → math-verify, "reasoning_gym" → the dataset's `score_answer`; any other
    ability is graded with math-verify when its name contains "math", else exact match."""
    from ._rg import rg_score
    from ._verify import exact_score, math_score

    train = _read_named(train_path, "training")
    test = _read_named(test_path, "held-out") if test_path is not None else []
    scorers = {"exact": exact_score, "math": math_score, "reasoning_gym": rg_score}
    for it in train + test:
        if it.ability not in scorers:
            scorers[it.ability] = math_score if "math" in it.ability.lower() else exact_score
    return TaskSet(name or str(train_path), tuple(train), tuple(test), scorers)
