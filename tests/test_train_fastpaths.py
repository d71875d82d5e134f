"""The built-in trainer's per-step shortcuts give what the plain calls give.

* `left_pad` / `right_pad` (vectorised) equal the per-row loops they replaced, ragged and
  empty rows included.
* `decode_completions` decodes each distinct completion once and returns every row's text.
* `ModeSwitch` sets exactly the flags `model.train(mode)` sets, and defers to a module's own
  `train` override.
* A trainer run with the flag switch writes the same metrics and ends at the same weights as
  one that switches with `model.train()` / `model.eval()`.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from _tiny_train import assert_same_run, tiny_config
from rlpace.train import train
from rlpace.train.model import ModeSwitch, tiny_causal_lm
from rlpace.train.recipes import grpo
from rlpace.train.rollout import Rollout, decode_completions, left_pad, right_pad

torch.set_num_threads(1)


def _left_pad_loop(seqs, pad_id):
    p = max(len(s) for s in seqs)
    ids, mask = np.full((len(seqs), p), pad_id, np.int64), np.zeros((len(seqs), p), np.int64)
    for i, s in enumerate(seqs):
        if len(s):
            ids[i, p - len(s):], mask[i, p - len(s):] = s, 1
    return torch.from_numpy(ids), torch.from_numpy(mask)


def _right_pad_loop(seqs, pad_id):
    t = max(1, max(len(s) for s in seqs))
    ids, mask = np.full((len(seqs), t), pad_id, np.int64), np.zeros((len(seqs), t), np.float32)
    for i, s in enumerate(seqs):
        ids[i, :len(s)], mask[i, :len(s)] = s, 1.0
    return torch.from_numpy(ids), torch.from_numpy(mask)


@pytest.mark.parametrize("seed", range(5))
def test_padding_equals_the_row_loop(seed):
    rng = np.random.default_rng(seed)
    seqs = [rng.integers(3, 50, size=rng.integers(0, 7)).tolist() for _ in range(rng.integers(1, 12))]
    seqs[0] = [7, 8, 9, 10, 11, 12, 13]                 # one full row
    for fast, loop in ((left_pad, _left_pad_loop), (right_pad, _right_pad_loop)):
        for got, want in zip(fast(seqs, 1), loop(seqs, 1)):
            assert got.dtype == want.dtype and torch.equal(got, want)
    ids, mask = left_pad([[5, 6], [7]], 0)
    assert ids.tolist() == [[5, 6], [0, 7]] and mask.tolist() == [[1, 1], [0, 1]]
    ids, mask = right_pad([[], []], 0)                  # a batch of empty completions: one column
    assert ids.tolist() == [[0], [0]] and mask.tolist() == [[0.0], [0.0]]


def test_decode_decodes_each_distinct_completion_once():
    seen = []

    class Tok:
        def batch_decode(self, seqs, skip_special_tokens=True):
            seen.extend(map(tuple, seqs))
            return [" ".join(map(str, s)) for s in seqs]
    ids = torch.tensor([[5, 2, 0], [6, 7, 8], [5, 2, 9], [6, 7, 8], [4, 0, 0]])
    mask = torch.tensor([[1.0, 1, 0], [1, 1, 1], [1, 1, 0], [1, 1, 1], [0, 0, 0]])
    ro = Rollout(torch.zeros(5, 1, dtype=torch.long), torch.ones(5, 1, dtype=torch.long), ids, mask)
    assert decode_completions(Tok(), ro) == ["5 2", "6 7 8", "5 2", "6 7 8", ""]
    assert seen == [(5, 2), (6, 7, 8), ()]             # row 3 repeats row 1 and row 4 row 2


def test_mode_switch_sets_the_flags_train_sets():
    model, plain = tiny_causal_lm(12, hidden=16, layers=2, heads=2), tiny_causal_lm(12, hidden=16, layers=2, heads=2)
    switch = ModeSwitch(model)
    assert switch.flags_only and len(switch.modules) == len(list(model.modules()))
    for mode in (False, True, False):
        switch(mode)
        plain.train(mode)
        assert [m.training for m in model.modules()] == [m.training for m in plain.modules()] == \
            [mode] * len(switch.modules)

    calls = []

    class Custom(torch.nn.Linear):                     # a train() that does more than set flags
        def train(self, mode=True):
            calls.append(mode)
            return super().train(mode)
    net = torch.nn.Sequential(torch.nn.Linear(2, 2), Custom(2, 2))
    switch = ModeSwitch(net)
    assert not switch.flags_only
    switch(False)
    assert calls == [False] and not any(m.training for m in net.modules())


def test_a_run_with_the_mode_switch_equals_one_with_train_and_eval(tmp_path, cache, monkeypatch):
    fast = tiny_config(tmp_path / "fast", cache, steps=3)
    train(fast)

    class Walk:                                         # the recursive nn.Module.train of every step
        def __init__(self, model):
            self.model = model

        def __call__(self, training):
            self.model.train(training)
    monkeypatch.setattr(grpo, "ModeSwitch", Walk)
    slow = tiny_config(tmp_path / "slow", cache, steps=3)
    train(slow)
    assert_same_run(fast, slow)
