"""`TrainConfig`: every knob of the built-in GRPO recipe in one flat, frozen, documented
dataclass (torchtune / cleanrl style). The CLI is `rlpace train key=value ...`;
`rlpace train --help` prints each field's doc from the `help` metadata below.

Fields that may change when a run is resumed (`RESUMABLE_CHANGES`): how long it runs
and how it reports — never anything that changes the trajectory.
"""

from __future__ import annotations

from ..errors import InputError
import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["TrainConfig", "from_overrides", "RESUMABLE_CHANGES", "field_help", "load_config", "resume_config"]


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
    policy_kwargs: str = _f("{}", "the policy's hyperparameters: a JSON object, e.g. '{\"c\": 0.5}', or Hydra's "
                                  "flow style as verl's docs write it, e.g. '{c: 0.5, base: pool}'")
    success_threshold: float = _f(0.5, "a rollout succeeds when its reward ≥ this")
    max_refill_rounds: int = _f(4, "cap on extra generation rounds when admission requests refills (DAPO dynamic sampling)")
    lilo_candidates: int = _f(0, "LILO probe (arXiv 2502.12272): propose k·B candidates, probe each, keep the top-B by p(1−p); "
                                 "k here, 0 = off")
    lilo_probes: int = _f(4, "LILO: probe rollouts per candidate (counted in the rollout budget)")
    # oracle measurement: only with an oracle_* policy, which is a measurement tool, not a method
    oracle_every: int = _f(10, "oracle_* policies: measure every training prompt's pass rate every k steps "
                               "(and at step 0) and feed it to the Scheduler")
    oracle_rollouts: int = _f(8, "oracle_* policies: m rollouts per prompt per measurement; logged as "
                                 "oracle_rollouts, NOT counted in rollouts / max_rollouts")
    # held-out loss probe: only with a policy that reads loss curves (epiplexity)
    loss_probe_every: int = _f(5, "loss-curve policies (epiplexity): every k steps (and at step 0) measure the "
                                  "teacher-forced NLL of reference answers on a fixed probe set per domain, "
                                  "in one batched forward, and feed it to Scheduler.observe_losses")
    loss_probe_per_domain: int = _f(16, "loss-curve policies: probe items per domain (its first held-out items; "
                                        "training items where a domain has none)")
    # epiplexity-guided generator: only with tasks=generated:<family>
    gen_lr: float = _f(0.1, "tasks=generated:<family>: REINFORCE step size of the generator over the family's sizes "
                                  "(0: the generator stays uniform — the fixed uniform size mix)")
    gen_entropy: float = _f(0.01, "tasks=generated:<family>: entropy bonus β of the generator")
    gen_buffer: int = _f(32, "tasks=generated:<family>: previously generated items whose NLL drop is the reward")
    # per-rollout gradient features: Feedback.grads / ref_grad for diem and dvc
    grad_features: str = _f("auto", "compute per-rollout gradient features: auto (when a policy reads them: "
                                    "diem, dvc) | on | off")
    grad_params: str = _f("lm_head", "parameters the features cover: lm_head | last_block | all (nn.Linear "
                                     "layers; projected per layer by a seeded Kronecker sketch, arXiv 2405.13954)")
    grad_dim: int = _f(256, "upper bound on the feature dimension d (Σ per layer k_out·k_in)")
    grad_exact: bool = _f(True, "exact features: lm_head over the shared-prompt forward, the first completion "
                                "token's share from its repeated logits (about the plain step's cost); last_block / "
                                "all: one forward of [prompt | completion] per rollout; false = the shared-prompt "
                                "forward, features from completion positions only (approximate: prompt positions "
                                "and lm_head's first completion token left out)")
    grad_reference: str = _f("heldout", "Feedback.ref_grad: heldout (gradient of the NLL of held-out reference "
                                        "answers, every grad_ref_every steps, when a policy reads it: diem importance=reference, "
                                        "dvc's influence value) | previous (the previous step's batch "
                                        "gradient) | none")
    grad_ref_every: int = _f(10, "steps between held-out reference gradients (grad_reference=heldout)")
    # ---- tasks
    tasks: str = _f("embedded", "task set: a named suite ('embedded', 'ladder', 'mostly_solved', 'families_parallel', "
                                "'small_domains', ...: rlpace.tasks.SUITES), 'embedded:add2,rev5,...', "
                                "'generated:<family>' (an epiplexity-guided generator over the family's sizes), "
                                "'grid:<family>' or 'grid:rg:NAME:FIELD=v1,v2,...[;k=v]' (a parameter grid for "
                                "criticality_grid: fresh items of the proposed cells), 'knights_knaves', "
                                "'rg:NAME[:k=v;k=v]|rg:...', or a verl train .parquet or .jsonl (what `rlpace "
                                "prepare` writes; test.parquet / test.jsonl beside it = held-out)")
    train_per_domain: int = _f(256, "training prompts per distribution (the Scheduler's pool)")
    heldout_per_domain: int = _f(64, "held-out prompts per distribution (greedy evaluation)")
    # ---- supervision: partial and noisy labels, drawn from `seed`
    labeled_fraction: float = _f(1.0, "share of each distribution's training prompts that keep their ground "
                                      "truth for training (the rest are unlabelled); with a policy that "
                                      "supervises them (a target or reward place: ttrl, trapo, self_certainty, "
                                      "entropy_min) the pool holds both, with any other policy the unlabelled "
                                      "prompts are left out of training ('labelled-only'); evaluation always "
                                      "uses the truth")
    label_noise: float = _f(0.0, "share of each distribution's labelled training prompts whose label is "
                                 "replaced by a wrong but realisable answer (that of another item of the "
                                 "distribution; OLR's 'active' noise); evaluation uses the clean labels")
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
                                         "family's typical mistake: 'default' (the suite's own: rlpace.tasks.SUITES, "
                                         "else DEFAULT_MISTAKES), "
                                         "'none', or 'max3=0.5,last4=0.75,...' (unlisted: 0)")
    # ---- RL
    batch_prompts: int = _f(16, "B: prompts per step")
    group_size: int = _f(8, "G: rollouts per prompt")
    rollout_budget: int = _f(0, "W: rollouts per step that an allocation policy (knapsack, gvm, "
                                "recommended+knapsack, ...) splits over the B prompts, N_i each "
                                "(Scheduler.allocate; a refill round of R prompts gets R·W // B); "
                                "0 = B·G. Without an allocation policy a W > 0 is split evenly")
    max_new_tokens: int = _f(10, "generation budget per rollout (tokens)")
    temperature: float = _f(1.0, "sampling temperature of rollouts")
    objective: str = _f("grpo", "loss: grpo | dr_grpo | dapo | gspo")
    clip_low: float = _f(-1.0, "ε_low of the ratio clip; negative = the objective's paper value")
    clip_high: float = _f(-1.0, "ε_high of the ratio clip; negative = the objective's paper value")
    kl_coef: float = _f(0.0, "β of the k3 KL penalty to the base policy (0 = no reference model)")
    lr: float = _f(3e-4, "AdamW learning rate, and that of every other `optimizer` (constant after the warm-up)")
    optimizer: str = _f("adamw", "adamw | iso_adamw | muon | iso_muon: iso_* keep each hidden matrix's base "
                                 "spectrum and train its singular frames (ISO, arXiv 2607.19331; "
                                 "docs/methods/iso.md); muon = torch.optim.Muon on hidden matrices + AdamW")
    lr_warmup: int = _f(10, "linear learning-rate warm-up steps (Adam's first steps on noisy policy gradients "
                            "are otherwise the largest)")
    epochs: int = _f(1, "optimizer steps on each batch (μ); >1 makes the ratio clip matter")
    micro_batch: int = _f(0, "rollouts per forward/backward (gradient accumulation); must divide B·G; 0 = all")
    grad_clip: float = _f(1.0, "max gradient norm (0 = off)")
    # ---- evaluation, logging, checkpoints
    eval_every: int = _f(10, "greedy held-out evaluation every k steps (and at the start and end)")
    eval_batch: int = _f(512, "prompts per evaluation forward")
    checkpoint_every: int = _f(50, "save model, optimizer, Scheduler state every k steps (0 = only at the end)")
    logger: str = _f("jsonl", "where step records go besides metrics.jsonl (always written): tensorboard "
                              "(out/tensorboard/), wandb (offline, out/wandb/), or both, e.g. 'tensorboard,wandb'")
    record: str = _f("", "pilot record for `rlpace advise` (docs/advise.md): one JSON line per generated batch "
                         "(prompt ids, rewards [B, G], rollouts incl. refills and probes) and each held-out "
                         "evaluation; '' = none. A resumed run keeps its lines before the checkpoint's step")
    resume: bool = _f(False, "continue from out/checkpoint (must be the same config, except steps / max_rollouts / "
                             "reporting fields)")
    progress: bool = _f(True, "show a progress bar")

    def __post_init__(self):
        from .logging import parse_loggers
        parse_loggers(self.logger)      # an unknown or uninstalled logger fails before any work

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


RESUMABLE_CHANGES = frozenset({"steps", "max_rollouts", "resume", "progress", "threads", "checkpoint_every",
                               "out", "eval_batch", "cache_dir", "logger", "record"})


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
        raise InputError(f"{name}={text!r} is not a valid {typ}.") from None


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
            raise InputError(f"unknown config field {key!r}; valid fields: {', '.join(types)} "
                             f"(see `rlpace train --help`).")
        changes[key] = _convert(key, types[key], val) if isinstance(val, str) else val
        if key == "policy_kwargs":      # JSON or Hydra's '{temperature:0.1}', kept as canonical JSON
            from .._flow import parse_mapping
            changes[key] = json.dumps(val if isinstance(val, dict) else parse_mapping(val, "policy_kwargs"))
    return dataclasses.replace(base, **changes)


def _split(text: str):
    key, eq, val = text.partition("=")
    if not eq:
        raise InputError(f"config override {text!r} is not key=value (e.g. steps=100).")
    return key.strip(), val


def load_config(path) -> TrainConfig:
    """The config a run saved in its `config.json`."""
    with open(path) as f:
        return from_overrides(json.load(f))


def resume_config(overrides, out: str | None = None) -> TrainConfig:
    """The config to continue a run with: `out/config.json` as the run saved it, with
    `overrides` (key=value strings or a dict) applied, `resume=True`.

    Only fields in `RESUMABLE_CHANGES` may differ from the saved run — how long it runs
    (`steps`, `max_rollouts`) and how it reports (`progress`, `threads`, `checkpoint_every`,
    `eval_batch`, `cache_dir`) — since anything else would change the trajectory; an
    override equal to the saved value is accepted. `out` defaults to the `out=` override,
    else TrainConfig's default.

    >>> resume_config(["out=runs/dump", "steps=300"])      # doctest: +SKIP
    TrainConfig(out='runs/dump', ..., steps=300, ..., resume=True, ...)
    """
    items = dict(overrides) if isinstance(overrides, dict) else dict(_split(o) for o in overrides)
    out = out or items.get("out") or TrainConfig().out
    path = Path(out) / "config.json"
    if not path.is_file():
        raise InputError(f"--resume: {str(path)!r} does not exist, so there is no run to continue at "
                         f"out={out}; point out=DIR at the run's folder, or drop --resume to start one.")
    try:
        saved = load_config(path)
    except (json.JSONDecodeError, ValueError, TypeError) as e:
        raise InputError(f"--resume: {str(path)!r} is not a config rlpace wrote ({e}); start a new run "
                         f"with another out=DIR.") from None
    wanted = from_overrides({**items, "out": out}, saved)
    diff = [f"{k}={getattr(wanted, k)!r} (the run has {getattr(saved, k)!r})" for k in items
            if k not in RESUMABLE_CHANGES and getattr(wanted, k) != getattr(saved, k)]
    if diff:
        allowed = ", ".join(sorted(RESUMABLE_CHANGES - {"resume", "out"}))
        raise InputError(f"--resume continues the run in {out} with its saved config; it cannot change "
                         f"{'; '.join(diff)}. Only {allowed} may change on resume; start a new run with "
                         f"another out=DIR to change the rest.")
    return dataclasses.replace(wanted, resume=True)
