"""Readable training recipes (one file each, top to bottom)."""

from .grpo import check_config, train

__all__ = ["train", "check_config"]
