"""Records of the task layer: one `Item` per prompt, a `TaskSet` of train and held-out items
with a scorer per ability, and the `Pool` it produces for a `Scheduler`."""

from __future__ import annotations

from ..errors import InputError
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Sequence

import numpy as np

from ..types import Pool

__all__ = ["Item", "TaskSet"]


class Item(NamedTuple):
    """One prompt with its ground truth, as the verl parquet schema stores it.

    Attributes:
        prompt: the user text (verl `prompt[0].content`).
        answer: the ground truth as a string (verl `reward_model.ground_truth`).
        domain: the distribution it was drawn from (verl `data_source`; rlpace domain).
        difficulty: the distribution's known size or level (higher = harder).
        index: stable id, unique inside its split (verl `extra_info.index`).
        ability: which scorer grades it: "exact" | "math" | "reasoning_gym" (verl `ability`).
        entry: JSON of the source entry for scorers that need more than the answer
            (reasoning-gym's `score_answer(answer, entry)`); "" otherwise.
    """

    prompt: str
    answer: str
    domain: str
    difficulty: float
    index: int
    ability: str = "exact"
    entry: str = ""


Scorer = Callable[[str, Item], float]


@dataclass(frozen=True)
class TaskSet:
    """Train items (the pool, in pool order) and held-out items, with their scorers.

    Attributes:
        name: what built it ("embedded", "knights_knaves", a file path, ...).
        train: the prompt pool; `train[i]` is pool position i.
        heldout: evaluation items, disjoint from `train` by prompt text.
        scorers: ability -> `score(completion, item) -> float in [0, 1]`.
    """

    name: str
    train: tuple
    heldout: tuple
    scorers: dict = field(default_factory=dict)

    def __post_init__(self):
        if not self.train:
            raise InputError(f"task set {self.name!r} has no training items; check its spec.")
        missing = sorted({it.ability for it in self.train + self.heldout} - set(self.scorers))
        if missing:
            raise InputError(f"task set {self.name!r} has items of ability {missing} with no scorer; "
                             f"abilities with scorers: {sorted(self.scorers)}.")

    @property
    def domains(self) -> tuple:
        """Distribution names, sorted (the order `Pool.domain_names` uses)."""
        return tuple(sorted({it.domain for it in self.train}))

    def pool(self, labeled=None, features=None) -> Pool:
        """The `rlpace.Pool` of the training items: domain = distribution, difficulty =
        its known size or level, ids = `Item.index`; `labeled` (bool[N], optional) marks
        the prompts whose ground truth training may use (`Pool.labeled`); `features`
        (float32[N, f], optional) is `Pool.features`, e.g. `rlpace.tasks.prompt_features(self)`."""
        extra = {} if labeled is None else {"labeled": labeled}
        if features is not None:
            extra["features"] = features
        return Pool([it.domain for it in self.train],
                    difficulty=[it.difficulty for it in self.train],
                    ids=[it.index for it in self.train], **extra)

    def score(self, items: Sequence[Item], completions: Sequence[str]) -> np.ndarray:
        """float32[len(items)] reward of each completion under its item's scorer."""
        if len(items) != len(completions):
            raise InputError(f"score got {len(items)} items and {len(completions)} completions; "
                             f"give one completion per item.")
        return np.array([self.scorers[it.ability](c, it) for it, c in zip(items, completions)],
                        dtype=np.float32)

    def heldout_by_domain(self) -> dict:
        """domain -> list of held-out items (every training domain present, maybe empty)."""
        out = {d: [] for d in self.domains}
        for it in self.heldout:
            out.setdefault(it.domain, []).append(it)
        return out
