"""The PCG64 states `np.random.default_rng(entropy)` starts from, for many entropies at once.

`default_rng([seed, step, stream])` costs ~15 μs per call: numpy's `SeedSequence` hashes the
entropy with a Python loop over numpy scalars, and `PCG64` then seeds itself from four of its
words. A Scheduler builds one such generator per proposal, for consecutive steps, so the
hash is done here for a block of steps in one pass of uint32 array arithmetic and each
proposal only sets one reused bit generator's state (`PCG64.state`, ~3 μs).

The arithmetic is numpy's own (`numpy/random/bit_generator.pyx`: `hashmix`, `mix`,
`SeedSequence.mix_entropy` and `generate_state`, pool size 4, no spawn key; and
`pcg64_set_seed` of `_pcg64.pyx`: state 0, inc = 2·seq + 1, step, state += seed, step); the
test suite checks every state against `np.random.PCG64(SeedSequence(entropy)).state`.
"""

from __future__ import annotations

import numpy as np

_MASK32 = 0xFFFFFFFF
_INIT_A, _MULT_A = 0x43B0D7E5, 0x931E8875
_INIT_B, _MULT_B = 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R = 0xCA01F9DD, 0x4973F715
_POOL = 4                                  # SeedSequence's default pool size (32-bit words)
_PCG_MULT = 0x2360ED051FC65DA44385DF649FCCF645   # PCG_DEFAULT_MULTIPLIER_128
_MASK128 = (1 << 128) - 1


def _hash_constants(init: int, mult: int, n: int) -> list:
    """The n values the running hash constant takes, in order (they never depend on the data)."""
    out, h = [], init
    for _ in range(n):
        out.append(h)
        h = (h * mult) & _MASK32
    return out


def _hashmix(value: np.ndarray, const: int, mult: int) -> np.ndarray:
    """numpy's `hashmix` of uint32 words with the constant's current value (`const`)."""
    value = value ^ np.uint32(const)
    value *= np.uint32((const * mult) & _MASK32)
    value ^= value >> np.uint32(16)
    return value


def _mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """numpy's `mix`: (L·x − R·y) mod 2^32, then xor-shift."""
    out = x * np.uint32(_MIX_L)
    out -= y * np.uint32(_MIX_R)
    out ^= out >> np.uint32(16)
    return out


def seed_sequence_words(entropy: np.ndarray) -> np.ndarray:
    """uint32[M, 8] `SeedSequence(entropy[m]).generate_state(8)` for each row of a uint32[M, E]
    entropy (the words `SeedSequence` splits a list of ints into, least significant first)."""
    entropy = np.asarray(entropy, dtype=np.uint32)
    m, e = entropy.shape
    consts = iter(_hash_constants(_INIT_A, _MULT_A, _POOL + _POOL * (_POOL - 1) + _POOL * max(0, e - _POOL)))
    zero = np.zeros(m, dtype=np.uint32)
    mixer = [_hashmix(entropy[:, i] if i < e else zero, next(consts), _MULT_A) for i in range(_POOL)]
    for src in range(_POOL):
        for dst in range(_POOL):
            if src != dst:
                mixer[dst] = _mix(mixer[dst], _hashmix(mixer[src], next(consts), _MULT_A))
    for src in range(_POOL, e):
        for dst in range(_POOL):
            mixer[dst] = _mix(mixer[dst], _hashmix(entropy[:, src], next(consts), _MULT_A))
    out = np.empty((m, 8), dtype=np.uint32)
    for i, c in enumerate(_hash_constants(_INIT_B, _MULT_B, 8)):
        out[:, i] = _hashmix(mixer[i % _POOL], c, _MULT_B)
    return out


def pcg64_states(entropy: np.ndarray) -> list:
    """[(state, inc)] as Python ints: the 128-bit state of `np.random.PCG64(entropy[m])` for
    each row of a uint32[M, E] entropy (what `PCG64.state["state"]` reads)."""
    words = seed_sequence_words(entropy).astype(np.uint64)
    # generate_state(4, uint64) is the 8 words read as little-endian uint64 pairs
    u64 = (words[:, 0::2] | (words[:, 1::2] << np.uint64(32))).tolist()
    out = []
    for s_hi, s_lo, i_hi, i_lo in u64:
        inc = (((i_hi << 64) | i_lo) << 1 | 1) & _MASK128
        state = (inc + ((s_hi << 64) | s_lo)) & _MASK128     # one step from 0 gives inc; add the seed
        out.append(((state * _PCG_MULT + inc) & _MASK128, inc))   # and one more step
    return out
