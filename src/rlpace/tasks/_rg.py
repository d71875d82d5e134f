"""Bridge to reasoning-gym (≥ 0.1.25): any of its datasets, by name and config, as one
distribution of a `TaskSet`, graded with that dataset's own `score_answer`.

`knights_knaves_suite()` builds DUMP's setup (Wang et al. 2025, arXiv 2504.09710; docs/methods/dump.md):
Knights and Knaves with 3…14 people, one distribution per size, `difficulty = n_people`.

Items are reasoning-gym entries (`question`, `answer`, `metadata`); the entry is stored as
JSON in `Item.entry` (and in the verl parquet's `extra_info.entry`), so a task set read
back from parquet is graded exactly as the original. The model's answer is the text in
its last `<answer>...</answer>` pair (reasoning-gym's convention), or the whole stripped
completion when it has none.
"""

from __future__ import annotations

from ..errors import InputError
import ast
import dataclasses
import functools
import json

from ._types import Item, TaskSet
from ._verify import extract_tagged

__all__ = ["RGSpec", "rg_spec", "reasoning_gym_suite", "knights_knaves_specs", "knights_knaves_suite", "rg_score",
           "rg_config", "rg_check", "rg_item"]


class RGSpec(tuple):
    """(dataset, label, difficulty, config) of one reasoning-gym distribution."""

    __slots__ = ()

    def __new__(cls, dataset: str, label: str, difficulty: float, config: dict):
        return super().__new__(cls, (dataset, label, float(difficulty), dict(config)))

    dataset = property(lambda s: s[0])
    label = property(lambda s: s[1])
    difficulty = property(lambda s: s[2])
    config = property(lambda s: s[3])


def _rg():
    try:
        import reasoning_gym
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("the reasoning-gym bridge needs reasoning-gym: "
                          "pip install 'reasoning-gym>=0.1.25'") from e
    return reasoning_gym


def rg_spec(dataset: str, label: str | None = None, difficulty: float = 0.0, **config) -> RGSpec:
    """Validate one distribution spec now (before any work): the dataset must exist and
    every config key must be a field of its config dataclass (`size`, `seed` are set by
    the suite).

    >>> rg_spec("knights_knaves", n_people=4).label
    'knights_knaves'
    """
    rg = _rg()
    if dataset not in rg.factory.DATASETS:
        raise InputError(f"unknown reasoning-gym dataset {dataset!r}; valid names: "
                         f"{', '.join(sorted(rg.factory.DATASETS))}.")
    _, cfg_cls = rg.factory.DATASETS[dataset]
    fields = {f.name for f in dataclasses.fields(cfg_cls)} - {"size", "seed"}
    unknown = sorted(set(config) - fields)
    if unknown:
        raise InputError(f"reasoning-gym dataset {dataset!r} has no config field(s) {unknown}; "
                         f"valid fields: {sorted(fields)}.")
    return RGSpec(dataset, label or dataset, difficulty, config)


def rg_config(text: str, where: str) -> dict:
    """'key=value;key=value' -> {key: value}, in order: a value is read as a Python literal
    (`3`, `0.5`, `True`, `('+', '-')`), else kept as text; ValueError naming `where` (the spec)
    for an item that is not key=value or a key given twice.

    >>> rg_config("n_people=3; mode=hard", "rg:x")
    {'n_people': 3, 'mode': 'hard'}
    """
    out = {}
    for kv in (s.strip() for s in text.split(";") if s.strip()):
        key, eq, val = kv.partition("=")
        key = key.strip()
        if not eq or not key:
            raise InputError(f"reasoning-gym config item {kv!r} in {where!r} is not key=value.")
        if key in out:
            raise InputError(f"reasoning-gym config field {key!r} is given twice in {where!r}.")
        try:
            out[key] = ast.literal_eval(val.strip())
        except (ValueError, SyntaxError):
            out[key] = val.strip()
    return out


def rg_check(spec: RGSpec, where: str = "") -> None:
    """reasoning-gym's own check of the spec's config values (its config dataclass and
    `validate()`), run now, before any item is generated: ValueError naming the dataset, the
    config and reasoning-gym's reason.

    >>> rg_check(rg_spec("knights_knaves", n_people=0))
    Traceback (most recent call last):
    ...
    ValueError: reasoning-gym rejects knights_knaves config {'n_people': 0}: Number of people must be at least 1.
    """
    _, cfg_cls = _rg().factory.DATASETS[spec.dataset]
    try:
        cfg = cfg_cls(**spec.config, size=1, seed=0)
        if hasattr(cfg, "validate"):
            cfg.validate()
    except (AssertionError, ValueError, TypeError) as e:
        at = f" in {where!r}" if where else ""
        raise InputError(f"reasoning-gym rejects {spec.dataset} config {spec.config}{at}: {e}.") from None


def rg_item(spec: RGSpec, seed: int, index: int = 0) -> Item:
    """The entry reasoning-gym generates for the spec's config with this seed (its dataset of
    size 1, entry 0) as an `Item` of distribution `spec.label`, graded by `rg_score`.

    >>> it = rg_item(rg_spec("basic_arithmetic", "a", 2.0, max_terms=2, max_digits=1), seed=5)
    >>> it.domain, it.difficulty, rg_score(it.answer, it)
    ('a', 2.0, 1.0)
    """
    e = _rg().create_dataset(spec.dataset, size=1, seed=int(seed), **spec.config)[0]
    return Item(e["question"], str(e["answer"]), spec.label, spec.difficulty, int(index), "reasoning_gym",
                json.dumps(e, default=_jsonable))


@functools.lru_cache(maxsize=None)
def _scorer(dataset: str):
    return _rg().get_score_answer_fn(dataset)


def rg_score(completion: str, item: Item) -> float:
    """reasoning-gym's own `score_answer(answer, entry)` for the item's source dataset.

    >>> ts = reasoning_gym_suite([rg_spec("basic_arithmetic", max_terms=2)], 2, 0)
    >>> it = ts.train[0]
    >>> rg_score(f"<answer>{it.answer}</answer>", it), rg_score("no idea", it)
    (1.0, 0.0)
    """
    if not isinstance(completion, str):
        return 0.0
    entry = json.loads(item.entry)
    tagged = extract_tagged(completion)
    answer = (tagged if tagged is not None else completion).strip()
    try:
        return float(_scorer(entry["metadata"]["source_dataset"])(answer or None, entry))
    except Exception:  # a dataset's scorer choking on malformed text is a wrong answer
        return 0.0


def _entries(spec: RGSpec, n: int, seed: int, exclude: set) -> list[dict]:
    rg = _rg()
    ds = rg.create_dataset(spec.dataset, size=max(1, 2 * n + 8), seed=seed, **spec.config)
    out = []
    for i in range(len(ds)):
        if len(out) == n:
            break
        e = ds[i]
        if e["question"] not in exclude:
            exclude.add(e["question"])
            out.append(e)
    return out


def reasoning_gym_suite(specs, train_per_domain: int = 256, heldout_per_domain: int = 32,
                        seed: int = 0, name: str = "reasoning_gym") -> TaskSet:
    """A `TaskSet` with one distribution per spec (see `rg_spec`).

    Held-out items come from seed `seed + 1_000_003` (and never repeat a training
    question); training items from `seed`. Difficulty is the spec's (e.g. n_people).
    """
    specs = list(specs)
    labels = [s.label for s in specs]
    if len(set(labels)) != len(labels):
        raise InputError(f"reasoning-gym distributions need distinct labels; got {labels}. "
                         f"Pass label=... to rg_spec.")
    train, heldout = [], []
    for k, spec in enumerate(specs):
        seen: set = set()
        held = _entries(spec, heldout_per_domain, seed + 1_000_003 + k, seen)
        tr = _entries(spec, train_per_domain, seed + k, seen)
        for bucket, entries in ((heldout, held), (train, tr)):
            for e in entries:
                bucket.append(Item(e["question"], str(e["answer"]), spec.label, spec.difficulty,
                                   len(bucket), "reasoning_gym", json.dumps(e, default=_jsonable)))
    return TaskSet(name, tuple(train), tuple(heldout), {"reasoning_gym": rg_score})


def _jsonable(x):
    if hasattr(x, "tolist"):
        return x.tolist()
    if isinstance(x, (set, frozenset)):
        return sorted(x)
    return str(x)


def knights_knaves_specs(people=range(3, 15)) -> list:
    """DUMP's 12 Knights-and-Knaves distributions (3…14 people), labelled `kk03`…`kk14`,
    difficulty = number of people (DUMP, arXiv 2504.09710)."""
    return [rg_spec("knights_knaves", f"kk{n:02d}", float(n), n_people=n) for n in people]


def knights_knaves_suite(people=range(3, 15), train_per_domain: int = 256,
                         heldout_per_domain: int = 32, seed: int = 0) -> TaskSet:
    """DUMP's setup as a `TaskSet` (see `knights_knaves_specs`).

    Generation cost grows fast with the number of people: reasoning-gym 0.1.25 takes
    ~0.01 s per 3-person puzzle and ~1–2 s per 14-person one, so the full default suite
    takes minutes; build it once and keep it as parquet (`write_taskset`).
    """
    return reasoning_gym_suite(knights_knaves_specs(people), train_per_domain, heldout_per_domain, seed,
                               name="knights_knaves")
