"""`TrainConfig`: every knob of the built-in GRPO recipe in one flat, frozen, documented
dataclass (torchtune / cleanrl style). The CLI is `rlpace train key=value ...`;
`rlpace train --help` prints each field's doc from the `help` metadata below.

Fields that may change when a run is resumed (`RESUMABLE_CHANGES`): how long it runs
and how it reports — never anything that changes the trajectory.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

__all__ = ["TrainConfig", "from_overrides", "RESUMABLE_CHANGES", "field_help"]


def _f(default, help_text: str):
    return field(default=default, metadata={"help": help_text})


@dataclass(frozen=True)
class TrainConfig:
    # ---- run
    out: str = _f("runs/train", "output directory: config.json, metrics.jsonl (one record per step), "
                                "summary.json, checkpoint/")
    seed: int = _f(0, "seed of everything: tasks, base policy, Scheduler, sampling")
    steps: int = _f(100, "optimizer steps (one batch of B prompts × G rollouts each)")
    max_rollouts: int = _f(0, "stop once this many rollouts (training + refills + probes) are spent; 0 = no limit")
    # ---- data scheduling
    policy: str = _f("uniform", "Scheduler policy: a name from `rlpace policies`, several joined by '+', "
                                "or 'pkg.module:factory'")
    policy_kwargs: str = _f("{}", "JSON object of the policy's hyperparameters, e.g. '{\"c\": 0.5}'")
    success_threshold: float = _f(0.5, "a rollout succeeds when its reward ≥ this")
    max_refill_rounds: int = _f(4, "cap on extra generation rounds when admission requests refills (DAPO dynamic sampling)")
    lilo_candidates: int = _f(0, "LILO probe (card 9): propose k·B candidates, probe each, keep the top-B by p(1−p); "
                                 "k here, 0 = off")
    lilo_probes: int = _f(4, "LILO: probe rollouts per candidate (counted in the rollout budget)")
    # ---- tasks
    tasks: str = _f("embedded", "task set: 'embedded', 'embedded:add2,rev5,...', 'knights_knaves', "
                                "'rg:NAME[:k=v;k=v]|rg:...', or a verl train .parquet")
    train_per_domain: int = _f(256, "training prompts per distribution (the Scheduler's pool)")
    heldout_per_domain: int = _f(64, "held-out prompts per distribution (greedy evaluation)")
    # ---- model
    model: str = _f("", "local Hugging Face causal-LM directory; empty = the tiny base policy (built once, cached)")
    chat: bool = _f(False, "wrap prompts in the tokenizer's chat template (real instruction models)")
    device: str = _f("cpu", "torch device: cpu, cuda, cuda:1, ...")
    threads: int = _f(1, "torch CPU threads (1 avoids oversubscription on shared cores)")
    cache_dir: str = _f("", "where tiny base policies are cached; empty = $RLPACE_CACHE or ~/.cache/rlpace")
    hidden: int = _f(64, "tiny model: hidden size")
    layers: int = _f(2, "tiny model: transformer layers")
    heads: int = _f(4, "tiny model: attention heads")
    warmup_steps: int = _f(600, "tiny model: supervised warm-up steps that make the base policy")
    warmup_batch: int = _f(128, "tiny model: warm-up batch (sequences)")
    warmup_lr: float = _f(3e-3, "tiny model: warm-up peak learning rate")
    warmup_decay: float = _f(1.0, "tiny model: warm-up share of size level k is decay**k")
    warmup_mistakes: str = _f("default", "tiny model: share of each distribution's warm-up answers replaced by its "
                                         "family's typical mistake: 'default' (rlpace.tasks.DEFAULT_MISTAKES), "
                                         "'none', or 'max3=0.5,last4=0.75,...' (unlisted: 0)")
    # ---- RL
    batch_prompts: int = _f(16, "B: prompts per step")
    group_size: int = _f(8, "G: rollouts per prompt")
    max_new_tokens: int = _f(10, "generation budget per rollout (tokens)")
    temperature: float = _f(1.0, "sampling temperature of rollouts")
    objective: str = _f("grpo", "loss: grpo | dr_grpo | dapo | gspo")
    clip_low: float = _f(-1.0, "ε_low of the ratio clip; negative = the objective's paper value")
    clip_high: float = _f(-1.0, "ε_high of the ratio clip; negative = the objective's paper value")
    kl_coef: float = _f(0.0, "β of the k3 KL penalty to the base policy (0 = no reference model)")
    lr: float = _f(3e-4, "AdamW learning rate (constant after the warm-up)")
    lr_warmup: int = _f(10, "linear learning-rate warm-up steps (Adam's first steps on noisy policy gradients "
                            "are otherwise the largest)")
    epochs: int = _f(1, "optimizer steps on each batch (μ); >1 makes the ratio clip matter")
    micro_batch: int = _f(0, "rollouts per forward/backward (gradient accumulation); must divide B·G; 0 = all")
    grad_clip: float = _f(1.0, "max gradient norm (0 = off)")
    # ---- evaluation, logging, checkpoints
    eval_every: int = _f(10, "greedy held-out evaluation every k steps (and at the start and end)")
    eval_batch: int = _f(512, "prompts per evaluation forward")
    checkpoint_every: int = _f(50, "save model, optimizer, Scheduler state every k steps (0 = only at the end)")
    resume: bool = _f(False, "continue from out/checkpoint (must be the same config, except steps / max_rollouts / "
                             "reporting fields)")
    progress: bool = _f(True, "show a progress bar")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


RESUMABLE_CHANGES = frozenset({"steps", "max_rollouts", "resume", "progress", "threads", "checkpoint_every",
                               "out", "eval_batch", "cache_dir"})


def field_help() -> list[tuple[str, str, object, str]]:
    """(name, type name, default, help) of every field, in declaration order."""
    return [(f.name, f.type if isinstance(f.type, str) else f.type.__name__, f.default, f.metadata["help"])
            for f in dataclasses.fields(TrainConfig)]


def _convert(name: str, typ: str, text: str):
    try:
        if typ == "bool":
            low = text.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if typ == "int":
            return int(text)
        if typ == "float":
            return float(text)
        return text
    except ValueError:
        raise ValueError(f"{name}={text!r} is not a valid {typ}.") from None


def from_overrides(overrides, base: TrainConfig | None = None) -> TrainConfig:
    """A config from `key=value` strings (or a dict) applied to `base`.

    >>> from_overrides(["steps=3", "policy=dump"]).steps
    3
    """
    base = base or TrainConfig()
    types = {f.name: (f.type if isinstance(f.type, str) else f.type.__name__) for f in dataclasses.fields(TrainConfig)}
    items = overrides.items() if isinstance(overrides, dict) else [_split(o) for o in overrides]
    changes = {}
    for key, val in items:
        if key not in types:
            raise ValueError(f"unknown config field {key!r}; valid fields: {', '.join(types)} "
                             f"(see `rlpace train --help`).")
        changes[key] = _convert(key, types[key], val) if isinstance(val, str) else val
    return dataclasses.replace(base, **changes)


def _split(text: str):
    key, eq, val = text.partition("=")
    if not eq:
        raise ValueError(f"config override {text!r} is not key=value (e.g. steps=100).")
    return key.strip(), val


def load_config(path) -> TrainConfig:
    """The config a run saved in its `config.json`."""
    with open(path) as f:
        return from_overrides(json.load(f))
