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
    A = clip((R − b) / max(σ, 1e-8), ±5)         b, σ²: EMAs of R and of (R − b)² (baseline)
    φ ← φ + lr · (A · Σ_j (e_{c_j} − π) + β · ∇_φ H(π))
    ∇_φ H(π) = −π ⊙ (log π + H)                  entropy bonus keeps every setting alive

A · Σ_j (e_{c_j} − π) is the score-function (REINFORCE) estimate of ∇_φ E[R] for the batch
as one action (log P(batch) = Σ_j log π(c_j)): unbiased for any baseline b that does not
depend on this batch (`reinforce_gradient`; tested against the exact gradient of a toy).
The first update only sets b (A = 0). New items enter a ring buffer of `buffer_size` item
keys. State is a NamedTuple of arrays, saved with the trainer's checkpoint (exact resume).

>>> st = generator_init(3, buffer_size=4)
>>> generator_probs(st).round(3).tolist()
[0.333, 0.333, 0.333]
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ._embedded import FAMILIES

__all__ = ["GeneratorState", "generator_init", "generator_probs", "generator_sample", "reinforce_gradient",
           "entropy_gradient", "generator_update", "buffer_push", "family_configs", "generator_to_json",
           "generator_from_json", "ADV_CLIP", "GENERATED_PREFIX", "generated_taskset"]

ADV_CLIP = 5.0
_LOGIT_MAX = 50.0       # |φ| bound: π stays a finite distribution whatever the rewards were


class GeneratorState(NamedTuple):
    logits: np.ndarray      # float64[M] φ, the generator's parameters
    baseline: np.ndarray    # float64[] EMA of the reward R
    reward_var: np.ndarray  # float64[] EMA of (R − baseline)²
    updates: np.ndarray     # int64[] rewards received so far
    buffer: np.ndarray      # int64[C] item keys (pool ids) of previously generated items; −1 empty
    buffer_len: np.ndarray  # int64[] filled slots (≤ C)
    cursor: np.ndarray      # int64[] next slot to write


def family_configs(family: str) -> list[str]:
    """The configurations of an embedded family, as distribution names (`last` → last2..last10)."""
    if family not in FAMILIES:
        raise ValueError(f"tasks=generated:{family}: unknown family; embedded families are "
                         f"{', '.join(sorted(FAMILIES))}.")
    return [f"{family}{s}" for s in FAMILIES[family][1]]


def generator_init(n_configs: int, buffer_size: int = 64) -> GeneratorState:
    """Uniform generator over `n_configs` settings with an empty buffer."""
    if n_configs < 1 or buffer_size < 1:
        raise ValueError(f"generator needs n_configs ≥ 1 and buffer_size ≥ 1; got {n_configs}, {buffer_size}.")
    return GeneratorState(np.zeros(n_configs), np.array(0.0), np.array(0.0), np.array(0, np.int64),
                          np.full(buffer_size, -1, np.int64), np.array(0, np.int64), np.array(0, np.int64))


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
        raise ValueError(f"generator reward must be finite; got {reward!r}.")
    r = float(np.clip(r, -1e6, 1e6))
    first = int(state.updates) == 0
    b, var = (r, 0.0) if first else (float(state.baseline), float(state.reward_var))
    adv = 0.0 if first else float(np.clip((r - b) / max(np.sqrt(var), 1e-8), -ADV_CLIP, ADV_CLIP))
    grad = reinforce_gradient(state.logits, choices, adv) + entropy_coef * entropy_gradient(state.logits)
    logits = np.clip(state.logits + lr * grad, -_LOGIT_MAX, _LOGIT_MAX)
    new_var = (1 - baseline_decay) * var + baseline_decay * (r - b) ** 2
    new_b = (1 - baseline_decay) * b + baseline_decay * r
    return state._replace(logits=logits, baseline=np.array(new_b), reward_var=np.array(new_var),
                          updates=np.array(int(state.updates) + 1, np.int64))


def buffer_push(state: GeneratorState, keys: np.ndarray) -> GeneratorState:
    """Append item keys to the ring buffer (oldest overwritten), in order."""
    buf = state.buffer.copy()
    c = buf.shape[0]
    cur, n = int(state.cursor), int(state.buffer_len)
    for k in np.asarray(keys, np.int64).ravel()[-c:].tolist():     # ≤ C keys: the last ones win
        buf[cur] = k
        cur = (cur + 1) % c
        n = min(c, n + 1)
    return state._replace(buffer=buf, buffer_len=np.array(n, np.int64), cursor=np.array(cur, np.int64))


def generator_to_json(state: GeneratorState) -> dict:
    """A JSON-able copy (floats round-trip exactly through json: shortest repr)."""
    return {k: np.asarray(v).tolist() for k, v in zip(state._fields, state)}


def generator_from_json(raw, n_configs: int, buffer_size: int, n_items: int) -> GeneratorState:
    """The state `generator_to_json` wrote, validated (ValueError naming the field)."""
    def fail(field, why):
        return ValueError(f"state.json counters['generator'][{field!r}] {why}; the checkpoint is corrupt "
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
    if st.buffer.shape != (buffer_size,):
        raise fail("buffer", f"must hold {buffer_size} keys")
    n = int(st.buffer_len) if st.buffer_len.shape == () else -1
    if not 0 <= n <= buffer_size:
        raise fail("buffer_len", f"must be in [0, {buffer_size}]")
    if st.cursor.shape != () or not 0 <= int(st.cursor) < buffer_size:
        raise fail("cursor", f"must be in [0, {buffer_size})")
    filled = st.buffer[:n] if n < buffer_size else st.buffer
    if ((filled < 0) | (filled >= n_items)).any() or (n < buffer_size and (st.buffer[n:] != -1).any()):
        raise fail("buffer", f"must hold item keys in [0, {n_items}) then −1")
    return st


GENERATED_PREFIX = "generated:"


def generated_taskset(spec: str, *, train_per_domain: int = 256, heldout_per_domain: int = 32, seed: int = 0):
    """The task set of `tasks=generated:<family>`: the embedded suite over every configuration
    of the family (one distribution per size), from which the generator draws its prompts;
    the held-out items cover the family's whole parameter range.

    >>> generated_taskset("generated:max", train_per_domain=2, heldout_per_domain=1).domains[:3]
    ('max1', 'max10', 'max2')
    """
    from ._embedded import embedded_suite
    if not isinstance(spec, str) or not spec.startswith(GENERATED_PREFIX):
        raise ValueError(f"a generated task spec is 'generated:<family>'; got {spec!r}.")
    configs = family_configs(spec[len(GENERATED_PREFIX):].strip())
    return embedded_suite(",".join(configs), train_per_domain=train_per_domain,
                          heldout_per_domain=heldout_per_domain, seed=seed)
