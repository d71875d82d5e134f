"""The tiny policy: a character-level tokenizer trained with `tokenizers`, a random-init
Qwen2 causal LM built from a `transformers` config, a supervised warm-up that turns it
into a base policy, and a cache keyed by everything that determines the result.

Why a warm-up at all: RL with binary rewards learns nothing from a random model (every
group is all-wrong). The warm-up teaches every distribution of the suite, but its corpus
is *noisy in a structured way*: for each distribution a share `mistakes[name]` of the
answers is replaced by the family's typical mistake (max → the smallest digit, sumd →
the units digit only, last → the first letter, ...). By default
(`rlpace.tasks.DEFAULT_MISTAKES`) that share is 0, 0.5, 0.75 and 0.97 from the smallest
to the largest size of each family. The base thus holds both the right rule and a
plausible wrong one, and prefers the wrong one more often on larger sizes — a miniature
of a pre-trained model that RL post-training improves by selecting behaviour it can
already produce. Its greedy held-out accuracy spans the range (≈100% on the smallest
sizes, in between on the middle ones, ≈0% on the largest), like DUMP's base across
Knights-and-Knaves sizes, which is what makes scheduling matter.

Without the mistakes a 0.1 M-parameter model either executes a family at every size or
at none, and GRPO had nothing to improve in a hundred steps: with a corpus whose share
fell with size instead (decay 0.5, no mistakes), uniform GRPO at lr 1e-4–3e-4 moved the
mean held-out accuracy by −6…+1 points in 60 steps. `decay` is kept as an option.

Determinism: weights, corpus and batch order derive from `seed`; the build runs with one
torch thread, so rebuilding gives the same tensors bit for bit.
"""

from __future__ import annotations

from ..errors import InputError
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from .rollout import Rollout, completion_logprobs, encode_prompts, left_pad, right_pad

__all__ = ["SPECIALS", "train_char_tokenizer", "tiny_causal_lm", "warmup_corpus", "supervised_warmup",
           "base_policy_dir", "build_base_policy", "check_model_dir", "load_policy", "default_cache_dir",
           "ModeSwitch"]

SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]
_BASE_VERSION = 1   # bump when the build procedure changes: old cache entries are then ignored


def default_cache_dir() -> Path:
    """`$RLPACE_CACHE`, else `~/.cache/rlpace`."""
    return Path(os.environ.get("RLPACE_CACHE") or Path.home() / ".cache" / "rlpace")


def train_char_tokenizer(texts: Sequence[str]):
    """A character-level `PreTrainedTokenizerFast` trained on `texts` with `tokenizers`
    (WordLevel model over single characters; ids of specials: pad 0, bos 1, eos 2, unk 3).

    >>> tok = train_char_tokenizer(["12+3=15"])
    >>> tok.decode(tok.encode("3+1=", add_special_tokens=False))
    '3+1='
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tk.decoder = decoders.Fuse()
    # Sorted character order: the vocabulary is a pure function of the character set.
    chars = sorted(set("".join(texts)))
    tk.train_from_iterator(["".join(chars)], trainers.WordLevelTrainer(special_tokens=SPECIALS, min_frequency=0))
    return PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", bos_token="<bos>",
                                   eos_token="<eos>", unk_token="<unk>", padding_side="left")


def tiny_causal_lm(vocab_size: int, *, hidden: int = 64, layers: int = 2, heads: int = 4,
                   max_positions: int = 64, seed: int = 0):
    """A random-init `Qwen2ForCausalLM` (tied embeddings, default attention). hidden=64,
    layers=2 has ~0.1 M parameters."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if hidden % heads:
        raise InputError(f"hidden={hidden} must be divisible by heads={heads}.")
    cfg = Qwen2Config(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=4 * hidden,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                      max_position_embeddings=max_positions, tie_word_embeddings=True,
                      pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(cfg)


def warmup_corpus(taskset, size_per_domain: int, decay: float, seed: int, mistakes=None):
    """(items [(prompt, answer)], weights float64[len(items)]) for the supervised warm-up.

    Embedded suites draw fresh items (never a held-out prompt); other task sets use their
    training items. A distribution at level k of its family (k-th smallest size; for
    non-embedded sets, k-th smallest difficulty overall) gets total weight decay**k, and
    (embedded suites only) a share `mistakes[name]` of its answers is replaced by the
    family's typical mistake.
    """
    from ..tasks import parse_distribution, sample_items

    mistakes = mistakes or {}
    heldout = {it.prompt for it in taskset.heldout}
    embedded = taskset.name.startswith("embedded")
    by_dom: dict[str, list] = {}
    if embedded:
        names = taskset.domains
        fam = {d: parse_distribution(d)[0] for d in names}
        size = {d: parse_distribution(d)[1] for d in names}
        level = {d: sorted(size[e] for e in names if fam[e] == fam[d]).index(size[d]) for d in names}
        for k, d in enumerate(names):
            triples = sample_items(d, size_per_domain, seed, "warmup", exclude=heldout, with_mistakes=True)
            flip = np.random.default_rng([seed, 0x3157, k]).random(len(triples)) < mistakes.get(d, 0.0)
            by_dom[d] = [(p, wrong if f else a) for (p, a, wrong), f in zip(triples, flip)]
    else:
        diff = {}
        for it in taskset.train:
            by_dom.setdefault(it.domain, []).append((it.prompt, it.answer))
            diff[it.domain] = it.difficulty
        ranks = sorted(set(diff.values()))
        level = {d: ranks.index(diff[d]) for d in by_dom}
    items, weights = [], []
    for d, its in by_dom.items():
        items += its
        weights += [decay ** level[d] / max(1, len(its))] * len(its)
    w = np.asarray(weights)
    return items, w / w.sum()


def supervised_warmup(model, tokenizer, items, weights, *, steps: int, batch: int, lr: float,
                      seed: int, progress: bool = True) -> list[float]:
    """Teacher-forced training on `answer + EOS` given `prompt` (loss on answer tokens only).
    AdamW, 5% linear warm-up then cosine decay to 10% of `lr`, on the model's device.
    Returns the loss curve."""
    from tqdm.auto import tqdm

    rng = np.random.default_rng([seed, 0x5F7])
    prompts = encode_prompts(tokenizer, [p for p, _ in items], chat=False)
    answers = [tokenizer.encode(a, add_special_tokens=False) + [tokenizer.eos_token_id] for _, a in items]
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
    warm = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps)))))
    model.train()
    dev = next(model.parameters()).device
    losses = []
    bar = tqdm(range(steps), desc="warm-up base policy", disable=not progress, leave=False)
    for _ in bar:
        idx = rng.choice(len(items), size=batch, p=weights)
        p_ids, p_mask = left_pad([prompts[i] for i in idx], tokenizer.pad_token_id)
        c_ids, c_mask = right_pad([answers[i] for i in idx], tokenizer.pad_token_id)
        batch_ = Rollout(*(x.to(dev) for x in (p_ids, p_mask, c_ids, c_mask)))   # on the model's device
        logp = completion_logprobs(model, batch_)
        loss = -(logp.sum() / batch_.completion_mask.sum())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if len(losses) % 50 == 0:
            bar.set_postfix(loss=f"{np.mean(losses[-50:]):.3f}")
    model.eval()
    return losses


def _taskset_key(taskset) -> str:
    """A hash of what the build reads from the task set. Embedded suites hash their spec
    string too (it selects the warm-up corpus; their key is unchanged since version 1).
    Any other task set — a parquet file, reasoning-gym — is keyed on its content only
    (domain, prompt, answer and difficulty, which sets the warm-up level): two copies of one
    file under different names share one base, and an edited file gets a new one."""
    if taskset.name.startswith("embedded"):
        h = hashlib.sha256(taskset.name.encode())
        for it in taskset.train + taskset.heldout:
            h.update(f"{it.domain}\x00{it.prompt}\x00{it.answer}\x01".encode())
        return h.hexdigest()[:16]
    h = hashlib.sha256(b"content")
    for part, items in (("train", taskset.train), ("heldout", taskset.heldout)):
        h.update(f"\x02{part}\x02".encode())
        for it in items:
            h.update(f"{it.domain}\x00{it.prompt}\x00{it.answer}\x00{float(it.difficulty)!r}\x01".encode())
    return h.hexdigest()[:16]


def base_policy_dir(taskset, cache_dir, **spec) -> Path:
    """Where `build_base_policy(taskset, **spec)` caches its result: a hash of the spec,
    the task set and the build version."""
    key = json.dumps({"v": _BASE_VERSION, "tasks": _taskset_key(taskset), **spec}, sort_keys=True)
    return Path(cache_dir) / f"base-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def build_base_policy(taskset, *, hidden: int = 64, layers: int = 2, heads: int = 4,
                      warmup_steps: int = 600, warmup_batch: int = 128, warmup_lr: float = 3e-3,
                      warmup_decay: float = 1.0, warmup_mistakes: dict | None = None,
                      corpus_per_domain: int = 2000, seed: int = 0,
                      cache_dir=None, progress: bool = True) -> Path:
    """Build (or find in the cache) the warmed-up tiny base policy; returns its directory
    (a `save_pretrained` model + tokenizer + `rlpace_base.json` describing the build).

    The directory name hashes every argument that changes the result and the task set's
    items, so a changed suite or size never reuses a stale base. The build is written to
    a temporary directory and renamed, so two processes never see a half-written base.
    """
    spec = dict(hidden=hidden, layers=layers, heads=heads, warmup_steps=warmup_steps,
                warmup_batch=warmup_batch, warmup_lr=warmup_lr, warmup_decay=warmup_decay,
                warmup_mistakes=dict(sorted((warmup_mistakes or {}).items())), corpus_per_domain=corpus_per_domain,
                seed=seed)
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    out = base_policy_dir(taskset, cache_dir, **spec)
    if (out / "rlpace_base.json").is_file():
        return out
    # Say what is happening and for how long before the first slow step, whatever `progress`
    # is (progress=false would otherwise be minutes of silence): a one-off per task set,
    # spec and seed (a new seed builds a new base), measured ~2 min on 2 cores (demo suite).
    print(f"base policy: building the base policy once for seed {seed} (cached at {out}), about 2 minutes "
          f"on 2 cores ({warmup_steps} supervised warm-up steps of {warmup_batch} sequences; longer on long "
          f"prompts).", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)      # bit-identical rebuilds (reduction order depends on threads)
    try:
        items, weights = warmup_corpus(taskset, corpus_per_domain, warmup_decay, seed, warmup_mistakes)
        texts = [p + a for p, a in items] + [it.prompt + it.answer for it in taskset.train + taskset.heldout]
        tok = train_char_tokenizer(texts)
        max_len = 2 + max(len(t) for t in texts) + 8
        model = tiny_causal_lm(len(tok), hidden=hidden, layers=layers, heads=heads,
                               max_positions=max(64, max_len), seed=seed)
        losses = supervised_warmup(model, tok, items, weights, steps=warmup_steps, batch=warmup_batch,
                                   lr=warmup_lr, seed=seed, progress=progress)
    finally:
        torch.set_num_threads(threads)
    cache_dir.mkdir(parents=True, exist_ok=True)
    _quiet_transformers()
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".tmp", dir=cache_dir))
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    meta = {"spec": spec, "tasks": taskset.name, "params": sum(p.numel() for p in model.parameters()),
            "final_loss": float(np.mean(losses[-50:])), "seconds": time.perf_counter() - t0}
    (tmp / "rlpace_base.json").write_text(json.dumps(meta, indent=1))
    try:
        tmp.rename(out)
    except OSError:               # another process finished the same build first
        shutil.rmtree(tmp, ignore_errors=True)
    if progress:
        print(f"base policy: built in {meta['seconds']:.0f} s (final warm-up loss {meta['final_loss']:.3f}).",
              file=sys.stderr, flush=True)
    return out


def _quiet_transformers() -> None:
    """No per-file progress bars from save_pretrained / from_pretrained (ours suffice)."""
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()


def check_model_dir(path) -> None:
    """ValueError unless `path` is a local Hugging Face causal-LM directory (reads only its
    config, so it is cheap enough to run before any work)."""
    p = Path(path)
    if not p.is_dir():
        raise InputError(f"model={str(path)!r}: no such directory. Give a local Hugging Face model "
                         f"directory (config.json + weights), or leave model empty for the tiny base.")
    if not (p / "config.json").is_file():
        raise InputError(f"model={str(path)!r} has no config.json: not a Hugging Face model directory.")
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        cfg = AutoConfig.from_pretrained(p)
    except Exception as e:
        raise InputError(f"model={str(path)!r}: config.json does not load ({e}).") from None
    if type(cfg) not in AutoModelForCausalLM._model_mapping:
        raise InputError(f"model={str(path)!r} is a {type(cfg).__name__} ({cfg.model_type}), which is not "
                         f"a causal LM (AutoModelForCausalLM cannot load it).")


def load_policy(path, device: str = "cpu", dtype=None):
    """(model in eval mode, tokenizer) from a local directory; checks it first."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_model_dir(path)
    _quiet_transformers()
    tok = AutoTokenizer.from_pretrained(path)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32).to(device)
    model.eval()
    return model, tok


class ModeSwitch:
    """`model.train(mode)` as flag writes over a module list taken once.

    `nn.Module.train` walks the module tree recursively on every call (and Hugging Face's
    override checks its kernel setting at every nested model): on the tiny policy the two
    switches of a recipe step (eval for generation, train for the update) cost as much as
    the gradient clipping. Setting each module's `training` flag from a cached list is what
    that walk does, when every module uses `nn.Module.train` or Hugging Face's (without
    kernels); a model with any other `train` override is switched by its own `train`.

    >>> import torch
    >>> m = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.5))
    >>> switch = ModeSwitch(m); switch(False)
    >>> [x.training for x in m.modules()]
    [False, False, False]
    """

    def __init__(self, model: torch.nn.Module):
        from transformers import PreTrainedModel

        self.model = model
        self.modules = list(model.modules())
        self.flags_only = all(type(x).train is torch.nn.Module.train
                              or (type(x).train is PreTrainedModel.train and not x.use_kernels)
                              for x in self.modules)

    def __call__(self, training: bool) -> None:
        if not self.flags_only:
            self.model.train(training)
            return
        for x in self.modules:
            x.__dict__["training"] = training    # nn.Module keeps the flag in its __dict__
