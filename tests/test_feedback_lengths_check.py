"""Feedback's range check of the response lengths (a min and a max instead of an elementwise
mask): the same arrays accepted, with the same values, and the same first bad value named, as
a plain loop over the entries."""

from __future__ import annotations

import re

import numpy as np
import pytest

from rlpace import Feedback


def _plain(lengths: np.ndarray):
    """None when every entry is in [0, 2**62) (compared as the check compares them, in
    float64), else the first entry outside it in row-major order."""
    for v in lengths.ravel().tolist():
        if float(np.float64(v)) < 0 or float(np.float64(v)) >= 2.0**62:
            return v
    return None


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint64, np.float64])
def test_lengths_range_check_equals_a_plain_loop(dtype):
    rng = np.random.default_rng(7)
    for trial in range(300):
        b, g = int(rng.integers(1, 9)), int(rng.integers(1, 6))
        lengths = rng.integers(0, 600, size=(b, g)).astype(dtype)
        if trial % 3:
            for _ in range(int(rng.integers(1, 3))):      # one or two entries out of range
                i, j = int(rng.integers(0, b)), int(rng.integers(0, g))
                if dtype in (np.int64, np.float64) and rng.random() < 0.5:
                    lengths[i, j] = -int(rng.integers(1, 5))
                elif dtype != np.int32:
                    lengths[i, j] = dtype(2**62 + (0 if dtype == np.float64 else int(rng.integers(0, 99))))
        first = _plain(lengths)
        if first is None:
            fb = Feedback(np.arange(b), np.zeros((b, g)), step=0, lengths=lengths)
            assert fb.lengths.dtype == np.int64 and fb.lengths.tolist() == lengths.astype(np.int64).tolist()
            assert not np.shares_memory(fb.lengths, lengths)
        else:
            with pytest.raises(ValueError, match=rf"below 2\*\*62; got (np\.\w+\()?{re.escape(str(first))}\)?\.$"):
                Feedback(np.arange(b), np.zeros((b, g)), step=0, lengths=lengths)
