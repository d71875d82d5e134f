"""The built-in trainer: a tiny causal LM, batched KV-cache rollouts, pure loss functions,
and the GRPO recipe (`rlpace.train.recipes.grpo`) that drives a `Scheduler`.

Needs torch and the `train` extra (transformers, tokenizers, tqdm, matplotlib, pyarrow).
Attributes are imported lazily, so `rlpace.train.config` (and `rlpace train --help`)
does not import torch.

>>> from rlpace.train import TrainConfig
>>> TrainConfig(steps=5).objective
'grpo'
"""

import importlib

_EXPORTS = {
    "TrainConfig": "config", "from_overrides": "config",
    "train": "recipes.grpo", "check_config": "recipes.grpo",
    "OBJECTIVES": "losses", "advantages": "losses", "policy_loss": "losses", "grpo_loss": "losses",
    "dr_grpo_loss": "losses", "dapo_loss": "losses", "gspo_loss": "losses", "kl_k3": "losses",
}

__all__ = list(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'rlpace.train' has no attribute {name!r}")
