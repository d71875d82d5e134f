"""A tiny random-init causal LM with a locally trained tokenizer, for tests.

`build_tiny_lm(dir)` trains a byte-level BPE tokenizer with `tokenizers` on a small corpus,
wraps it as a `PreTrainedTokenizerFast`, builds a random Qwen2 (2 layers, width 32) and
saves both with `save_pretrained` — a directory that `AutoModelForCausalLM` and
`AutoTokenizer` load offline. Random weights are fine for NLL / pooling mechanics.

    from tests._tiny_lm import build_tiny_lm
    path = build_tiny_lm(tmp_path / "lm", corpus=my_texts)
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

DEFAULT_CORPUS = [
    "Question:\nWhat is 12 plus 30?\n\nAnswer:\n42",
    "The knight always tells the truth and the knave always lies.",
    "Mix flour, butter and sugar, then bake the cake for thirty minutes.",
    "The goalkeeper saved a penalty in the last minute of the football match.",
    "Jupiter is the largest planet of the solar system and has many moons.",
    "Sort the list 5, 3, 9, 1 in ascending order.",
]


def build_tiny_lm(path: str | Path, corpus: Iterable[str] = (), *, vocab_size: int = 300,
                  hidden: int = 32, layers: int = 2, seed: int = 0, arch: str = "qwen2") -> Path:
    """Save a tiny causal LM + tokenizer under `path` and return it.

    Args:
        path: output directory (created).
        corpus: extra texts the BPE tokenizer is trained on (DEFAULT_CORPUS is always added).
        vocab_size: BPE vocabulary size (the byte alphabet alone is 256).
        hidden, layers: model width and depth.
        seed: torch seed of the random init (same seed → same weights).
        arch: "qwen2" or "llama".
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2Config,
                              Qwen2ForCausalLM)

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|pad|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(list(DEFAULT_CORPUS) + list(corpus), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                   bos_token="<|endoftext|>", pad_token="<|pad|>")
    fast.save_pretrained(path)

    common = dict(vocab_size=len(fast), hidden_size=hidden, intermediate_size=2 * hidden,
                  num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=1024, eos_token_id=fast.eos_token_id,
                  bos_token_id=fast.bos_token_id, pad_token_id=fast.pad_token_id,
                  tie_word_embeddings=False)
    torch.manual_seed(seed)
    if arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    elif arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        raise ValueError(f"arch must be 'qwen2' or 'llama'; got {arch!r}")
    model.save_pretrained(path)
    return path
