"""What the TRL adapter tests share: 8 prompts over two domains (4 chunks per epoch at
B = 2, so 6 steps cross an epoch boundary), a tiny causal LM built for them, and a
deterministic outcome per (prompt, rollout, step) so feedback is known in advance."""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset

from _tiny_lm import build_tiny_lm

PROMPTS = [f"what is {i} plus 3?" for i in range(8)]


def outcome(index: int, g: int, step: int) -> float:
    """Reward of rollout g of the prompt with stable id `index` at trainer step `step`."""
    return float((index * 7 + g * 3 + step) % 5 < 2)


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    torch.set_num_threads(1)
    return build_tiny_lm(tmp_path_factory.mktemp("lm"), PROMPTS)


@pytest.fixture(scope="module")
def dataset():
    return Dataset.from_list([{"prompt": p, "index": 1000 + i, "data_source": ["math", "logic"][i % 2]}
                              for i, p in enumerate(PROMPTS)])
