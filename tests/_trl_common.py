"""What the TRL adapter tests share: 8 prompts over two domains (4 chunks per epoch at
B = 2, so 6 steps cross an epoch boundary), a tiny causal LM built for them, and a
deterministic outcome per (prompt, rollout, step) so feedback is known in advance."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from datasets import Dataset

from _tiny_lm import build_tiny_lm

PROMPTS = [f"what is {i} plus 3?" for i in range(8)]


def outcome(index: int, g: int, step: int) -> float:
    """Reward of rollout g of the prompt with stable id `index` at trainer step `step`."""
    return float((index * 7 + g * 3 + step) % 5 < 2)


def informative(index: int, step: int, round_: int) -> bool:
    """The refill tests' rule: every group at step 0; later one in three (so one round rarely fills
    the batch)."""
    return step == 0 or (index + step + round_) % 3 == 0


def refill_reward(calls: list, group: int):
    """A TRL reward function for the refill tests: rollout j of the prompt with stable id i gets 1
    when j % group == 0 and `informative(i, step, round_)`, else 0 (each group is [1, 0, ...] or
    all 0), where round_ counts the reward calls of the trainer step so far. Appends
    [step, round_, ids, rewards] to `calls` per call."""
    per_step = Counter()

    def reward(prompts, completions, index, trainer_state, **kw):
        step = trainer_state.global_step
        round_ = per_step[step]
        per_step[step] += 1
        r = [float(informative(i, step, round_) and j % group == 0) for j, i in enumerate(index)]
        calls.append([step, round_, list(index), r])
        return r

    return reward


def probe_trainer(base, tok, prompts: list, group: int, record):
    """A subclass of `base` (an RlpaceGRPOTrainer) that calls `record(trainer, outputs, ids)` after
    each generation batch: `ids` are the stable ids (1000 + position in `prompts`) of the trained
    groups, read back from the decoded prompts with the tokenizer `tok`."""
    class Probe(base):
        def _generate_and_score_completions(self, inputs):
            o = super()._generate_and_score_completions(inputs)
            text = tok.batch_decode(o["prompt_ids"], skip_special_tokens=True)
            record(self, o, [1000 + prompts.index(t.strip()) for t in text[::group]])
            return o

    return Probe


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    torch.set_num_threads(1)
    return build_tiny_lm(tmp_path_factory.mktemp("lm"), PROMPTS)


@pytest.fixture(scope="module")
def dataset():
    return Dataset.from_list([{"prompt": p, "index": 1000 + i, "data_source": ["math", "logic"][i % 2]}
                              for i, p in enumerate(PROMPTS)])
