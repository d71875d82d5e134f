"""Epiplexity-guided task generation: a parametric distribution over a procedural family's
parameters, trained by REINFORCE on the learner's loss drop over previously generated items.

Foundation: Finzi et al., "From Entropy to Epiplexity", arXiv 2601.03220 (prequential
epiplexity: the loss area a learner removes by training). The generator rule below is
rlpace's **reconstruction** — no public code implements it (docs/methods/epiplexity.md,
"Generator").

The family's parameter settings are a list of M configurations (for an embedded family, its
sizes: `generated:last` → last2 … last10). The generator is a categorical distribution
π = softmax(φ) over them. Each step:

    c_1..c_n ~ π                                  configurations of the new batch (n prompts)
    R = L_buf(before) − L_buf(after)              teacher-forced NLL on a buffer of previously
                                                  generated items, before vs after training on
                                                  the batch: the prequential loss (epiplexity) gain
    A = clip((R − b) / s, ±5),  s = max(σ, 0.1·|b|)   b, σ²: EMAs of R and of (R − b)² (baseline);
                                                  A = 0 when s = 0
    φ ← φ + lr · (A · Σ_j (e_{c_j} − π) + β · ∇_φ H(π))
    ∇_φ H(π) = −π ⊙ (log π + H)                  entropy bonus keeps every setting alive

A · Σ_j (e_{c_j} − π) is the score-function (REINFORCE) estimate of ∇_φ E[R] for the batch
as one action (log P(batch) = Σ_j log π(c_j)): unbiased for any baseline b that does not
depend on this batch (`reinforce_gradient`; tested against the exact gradient of a toy).
The first update only sets b (A = 0).

The scale s. σ alone is 0 after the first update (one reward, no spread yet) and stays tiny
while the rewards barely differ; dividing by it (the rule once divided by max(σ, 1e-8))
made a difference of 1e-4 nats a full ±5 advantage. The floor 0.1·|b| ties the scale to the
rewards' own size: |A| ≤ |R − b| / (0.1·|b|), so a difference that is small next to the rewards
gives a small move (σ = 0, b = 0.1, R = 0.1001: A = 0.01, not 5). It binds only while the
rewards' spread is under a tenth of their size (σ < 0.1·|b|); rewards that do vary are
standardised by σ as before. With b = 0 as well (every reward so far exactly 0) there is no
scale at all and A = 0. We chose a floor over waiting for two distinct rewards because waiting
only moves the problem: after rewards 0.1 and 0.1001, σ = 4.5e-5, and a third reward of
0.1002 would again be a +4 advantage (+0.018 with the floor). The floor reads only b and σ², already in the state, so the
checkpoint format and exact resume are unchanged.

Fresh items. Each drawn configuration c_j gets a *new* item of the family at that size,
generated from the key (c_j, step, round, j): `fresh_items` runs the family's own generator
with `np.random.default_rng([seed, 7, c, step, round, j])`, redrawing (same stream) while the
prompt is a held-out prompt. An item is a pure function of its key and the seed, so the ring
buffer of previously generated items stores the keys of the real items trained on — int64[C, 4]
rows (cell, step, round, slot) — and regenerates exactly those items to measure their NLL.
State is a NamedTuple of arrays, saved with the trainer's checkpoint (exact resume: the next
draws depend only on (seed, step, round) and the saved π).

>>> st = generator_init(3, buffer_size=4)
>>> generator_probs(st).round(3).tolist()
[0.333, 0.333, 0.333]
>>> keys = draw_keys(st, 2, np.random.default_rng(0), step=5, round_=0)
>>> keys[:, 1:].tolist()                               # (step, round, slot) of each new item
[[5, 0, 0], [5, 0, 1]]
>>> [it.domain for it in fresh_items(("max2", "max3", "max4"), keys, seed=0)] == [f"max{2 + c}" for c in keys[:, 0]]
True
"""

from __future__ import annotations

from ..errors import InputError
from typing import NamedTuple

import numpy as np

from ._embedded import FAMILIES, parse_distribution
from ._types import Item

__all__ = ["GeneratorState", "generator_init", "generator_probs", "generator_sample", "reinforce_gradient",
           "entropy_gradient", "generator_update", "buffer_push", "family_configs", "generator_to_json",
           "generator_from_json", "ADV_CLIP", "GENERATED_PREFIX", "generated_taskset", "draw_keys", "fresh_items",
           "KEY_FIELDS"]

ADV_CLIP = 5.0
_LOGIT_MAX = 50.0       # |φ| bound: π stays a finite distribution whatever the rewards were
_SCALE_FLOOR = 0.1      # the advantage's scale is at least this fraction of |baseline| (module doc)
KEY_FIELDS = ("cell", "step", "round", "slot")   # one generated item's key (a buffer row)
_ITEM_STREAM = 7        # random stream of fresh items, apart from the trainer's streams 0–3
_REDRAWS = 100          # redraws of a fresh item that hit a held-out prompt before the fallback


class GeneratorState(NamedTuple):
    logits: np.ndarray      # float64[M] φ, the generator's parameters
    baseline: np.ndarray    # float64[] EMA of the reward R
    reward_var: np.ndarray  # float64[] EMA of (R − baseline)²
    updates: np.ndarray     # int64[] rewards received so far
    buffer: np.ndarray      # int64[C, 4] keys (cell, step, round, slot) of previously generated
                            #   items (`fresh_items` regenerates them); rows of −1 are empty
    buffer_len: np.ndarray  # int64[] filled slots (≤ C)
    cursor: np.ndarray      # int64[] next slot to write


def family_configs(family: str) -> list[str]:
    """The configurations of an embedded family, as distribution names (`last` → last2..last10)."""
    if family not in FAMILIES:
        raise InputError(f"tasks=generated:{family}: unknown family; embedded families are "
                         f"{', '.join(sorted(FAMILIES))}.")
    return [f"{family}{s}" for s in FAMILIES[family][1]]


def generator_init(n_configs: int, buffer_size: int = 64) -> GeneratorState:
    """Uniform generator over `n_configs` settings with an empty buffer."""
    if n_configs < 1 or buffer_size < 1:
        raise InputError(f"generator needs n_configs ≥ 1 and buffer_size ≥ 1; got {n_configs}, {buffer_size}.")
    return GeneratorState(np.zeros(n_configs), np.array(0.0), np.array(0.0), np.array(0, np.int64),
                          np.full((buffer_size, len(KEY_FIELDS)), -1, np.int64), np.array(0, np.int64),
                          np.array(0, np.int64))


def generator_probs(state: GeneratorState) -> np.ndarray:
    """float64[M] π = softmax(φ)."""
    z = state.logits - state.logits.max()
    e = np.exp(z)
    return e / e.sum()


def generator_sample(state: GeneratorState, n: int, rng: np.random.Generator) -> np.ndarray:
    """int64[n] configurations drawn i.i.d. from π."""
    return rng.choice(state.logits.shape[0], size=n, p=generator_probs(state)).astype(np.int64)


def reinforce_gradient(logits: np.ndarray, choices: np.ndarray, advantage: float) -> np.ndarray:
    """float64[M] advantage · Σ_j ∇_φ log π(c_j) = advantage · (counts − n·π)."""
    z = np.exp(logits - logits.max())
    p = z / z.sum()
    counts = np.bincount(np.asarray(choices, np.int64), minlength=logits.shape[0])
    return float(advantage) * (counts - counts.sum() * p)


def entropy_gradient(logits: np.ndarray) -> np.ndarray:
    """float64[M] ∇_φ H(softmax(φ)) = −π ⊙ (log π + H)."""
    z = logits - logits.max()
    logp = z - np.log(np.exp(z).sum())
    p = np.exp(logp)
    h = -(p * logp).sum()
    return -p * (logp + h)


def generator_update(state: GeneratorState, choices: np.ndarray, reward: float, *, lr: float = 0.5,
                     entropy_coef: float = 0.01, baseline_decay: float = 0.2) -> GeneratorState:
    """One REINFORCE step for the batch `choices` that earned `reward` (see module doc).
    Returns a new state (the arrays are small; nothing is written in place)."""
    r = float(reward)
    if not np.isfinite(r):
        raise InputError(f"generator reward must be finite; got {reward!r}.")
    r = float(np.clip(r, -1e6, 1e6))
    first = int(state.updates) == 0
    b, var = (r, 0.0) if first else (float(state.baseline), float(state.reward_var))
    scale = max(np.sqrt(var), _SCALE_FLOOR * abs(b))                # σ = 0 after one reward: floor on |b|
    adv = 0.0 if first or scale == 0.0 else float(np.clip((r - b) / scale, -ADV_CLIP, ADV_CLIP))
    grad = reinforce_gradient(state.logits, choices, adv) + entropy_coef * entropy_gradient(state.logits)
    logits = np.clip(state.logits + lr * grad, -_LOGIT_MAX, _LOGIT_MAX)
    new_var = (1 - baseline_decay) * var + baseline_decay * (r - b) ** 2
    new_b = (1 - baseline_decay) * b + baseline_decay * r
    return state._replace(logits=logits, baseline=np.array(new_b), reward_var=np.array(new_var),
                          updates=np.array(int(state.updates) + 1, np.int64))


def buffer_push(state: GeneratorState, keys: np.ndarray) -> GeneratorState:
    """Append item keys (int64[n, 4] rows, see `KEY_FIELDS`) to the ring buffer in order; the
    oldest rows are overwritten."""
    rows = np.asarray(keys, np.int64).reshape(-1, len(KEY_FIELDS))
    buf = state.buffer.copy()
    c = buf.shape[0]
    cur, n = int(state.cursor), int(state.buffer_len)
    for row in rows[-c:]:                                  # ≤ C rows: the last ones win
        buf[cur] = row
        cur = (cur + 1) % c
        n = min(c, n + 1)
    return state._replace(buffer=buf, buffer_len=np.array(n, np.int64), cursor=np.array(cur, np.int64))


def draw_keys(state: GeneratorState, n: int, rng: np.random.Generator, *, step: int, round_: int) -> np.ndarray:
    """int64[n, 4] keys of n new items: cells c_1..c_n ~ π (`generator_sample`), then
    (step, round, slot j). The trainer passes rng = default_rng([seed, step, round, stream])."""
    cells = generator_sample(state, n, rng)
    return np.stack([cells, np.full(n, step), np.full(n, round_), np.arange(n)], axis=1).astype(np.int64)


def fresh_items(names, keys: np.ndarray, seed: int, *, exclude=frozenset(), fallback=None) -> list:
    """The items of `keys` (int64[n, 4] rows (cell, step, round, slot)): for each, the family's
    generator at the size of `names[cell]` (a distribution name, e.g. "sort4"), with
    rng = default_rng([seed, 7, cell, step, round, slot]); a prompt in `exclude` (the held-out
    prompts) is redrawn from the same stream, up to 100 times, then the item is
    `fallback[cell][slot % len]` (a training item of that size; ValueError when none is given).
    A reasoning-gym grid cell (`names[cell]` = 'rg:NAME:FIELD=v;...', `rlpace.tasks._grid.rg_cell`)
    is drawn the same way, each draw being reasoning-gym's item for that config at the seed
    `rng.integers(2**31 - 1)`. Pure in (names, keys, seed, exclude): the same key always gives
    the same item.

    >>> [tuple(it[:3]) for it in fresh_items(("last3",), np.array([[0, 4, 0, 1]]), seed=0)]
    [('l:haf=', 'f', 'last3')]
    """
    rows = np.asarray(keys, np.int64).reshape(-1, len(KEY_FIELDS))
    out = []
    for cell, step, round_, slot in rows.tolist():
        if not 0 <= cell < len(names) or min(step, round_, slot) < 0:
            raise InputError(f"fresh_items: key {(cell, step, round_, slot)} needs a cell in [0, {len(names)}) "
                             f"and step, round, slot ≥ 0.")
        name = names[cell]
        rng = np.random.default_rng([int(seed), _ITEM_STREAM, cell, step, round_, slot])
        if name.startswith("rg:"):          # a reasoning-gym grid cell (tasks=grid:rg:...)
            from ._grid import rg_cell
            from ._rg import rg_item
            spec = rg_cell(name)
            draw = lambda: rg_item(spec, int(rng.integers(2**31 - 1)), slot)   # noqa: E731
        else:
            fam, size = parse_distribution(name)
            draw = lambda: Item(*FAMILIES[fam][0](rng, size)[:2], name, float(size), slot)   # noqa: E731
        for _ in range(_REDRAWS):
            it = draw()
            if it.prompt not in exclude:
                out.append(it)
                break
        else:      # the size's space is (almost) all held out: reuse a training item of that size
            pool = fallback[cell] if fallback is not None and cell < len(fallback) else ()
            if not pool:
                raise InputError(f"fresh_items: {name} has no prompt outside the held-out set after {_REDRAWS} "
                                 f"draws and no fallback item; lower heldout_per_domain.")
            out.append(pool[slot % len(pool)])
    return out


def generator_to_json(state: GeneratorState) -> dict:
    """A JSON-able copy (floats round-trip exactly through json: shortest repr)."""
    return {k: np.asarray(v).tolist() for k, v in zip(state._fields, state)}


def generator_from_json(raw, n_configs: int, buffer_size: int) -> GeneratorState:
    """The state `generator_to_json` wrote, validated (ValueError naming the field)."""
    def fail(field, why):
        return InputError(f"state.json counters['generator'][{field!r}] {why}; the checkpoint is corrupt "
                          f"or was written with other settings.")
    if not isinstance(raw, dict) or set(raw) != set(GeneratorState._fields):
        raise fail("*", f"must hold exactly {list(GeneratorState._fields)}")
    try:
        st = GeneratorState(np.asarray(raw["logits"], np.float64), np.asarray(raw["baseline"], np.float64),
                            np.asarray(raw["reward_var"], np.float64), np.asarray(raw["updates"], np.int64),
                            np.asarray(raw["buffer"], np.int64), np.asarray(raw["buffer_len"], np.int64),
                            np.asarray(raw["cursor"], np.int64))
    except (TypeError, ValueError, OverflowError):
        raise fail("*", "has values that are not numbers") from None
    if st.logits.shape != (n_configs,) or not np.isfinite(st.logits).all() or np.abs(st.logits).max() > _LOGIT_MAX:
        raise fail("logits", f"must be {n_configs} finite numbers in [−{_LOGIT_MAX:g}, {_LOGIT_MAX:g}]")
    for f in ("baseline", "reward_var"):
        v = getattr(st, f)
        if v.shape != () or not np.isfinite(v) or (f == "reward_var" and v < 0):
            raise fail(f, "must be one finite number" + (" ≥ 0" if f == "reward_var" else ""))
    if st.updates.shape != () or st.updates < 0:
        raise fail("updates", "must be an int ≥ 0")
    w = len(KEY_FIELDS)
    if st.buffer.shape != (buffer_size, w):
        raise fail("buffer", f"must hold {buffer_size} keys of {w} ints {KEY_FIELDS}")
    n = int(st.buffer_len) if st.buffer_len.shape == () else -1
    if not 0 <= n <= buffer_size:
        raise fail("buffer_len", f"must be in [0, {buffer_size}]")
    if st.cursor.shape != () or not 0 <= int(st.cursor) < buffer_size:
        raise fail("cursor", f"must be in [0, {buffer_size})")
    filled = st.buffer[:n]
    if ((filled < 0).any() or (filled[:, 0] >= n_configs).any()
            or (n < buffer_size and (st.buffer[n:] != -1).any())):
        raise fail("buffer", f"must hold keys with a cell in [0, {n_configs}) and step, round, slot ≥ 0, "
                             f"then rows of −1")
    return st


GENERATED_PREFIX = "generated:"


def generated_taskset(spec: str, *, train_per_domain: int = 256, heldout_per_domain: int = 32, seed: int = 0):
    """The task set of `tasks=generated:<family>`: the embedded suite over every configuration
    of the family (one distribution per size). Its held-out items cover the family's whole
    parameter range (evaluation and loss probe); a fresh item never repeats one. Its training
    items are not what the generator trains on (it generates fresh ones, `fresh_items`): they
    name the sizes that have prompts outside the held-out set (the generator's cells), serve
    as the fallback of a size whose space is nearly all held out, and are the pool of the
    fixed-mix baseline `tasks=embedded:<the same sizes>` (the same items, the same base policy).

    >>> generated_taskset("generated:max", train_per_domain=2, heldout_per_domain=1).domains[:3]
    ('max1', 'max10', 'max2')
    """
    from ._embedded import embedded_suite
    if not isinstance(spec, str) or not spec.startswith(GENERATED_PREFIX):
        raise InputError(f"a generated task spec is 'generated:<family>'; got {spec!r}.")
    configs = family_configs(spec[len(GENERATED_PREFIX):].strip())
    return embedded_suite(",".join(configs), train_per_domain=train_per_domain,
                          heldout_per_domain=heldout_per_domain, seed=seed)
