"""The hyperparameter checks every policy factory calls (`check_real`, `check_int`,
`check_choice`) and the signal bound (`clip_signal`, `shifted`, SIGNAL_MAX). They live in
`rlpace._checks`, below `policies`, so that `predict` (which policies build on) shares them."""

from .._checks import SIGNAL_MAX, abs_signal, check_choice, check_int, check_real, clip_signal, shifted

__all__ = ["check_real", "check_int", "check_choice", "clip_signal", "abs_signal", "shifted", "SIGNAL_MAX"]
