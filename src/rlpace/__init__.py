"""rlpace: adaptive data scheduling for RL post-training of LLMs.

The public API: records (`Pool`, `Feedback`), the `Scheduler` that trainers and engine
adapters drive, the `policies` registry and algebra, and `recommended()` — the composition
the project's headroom benchmark supports (docs/methods/recommended.md).
"""

from . import policies
from .errors import InputError
from .policies import compose, policy_factory, recommended
from .scheduler import Scheduler, StepResult
from .types import Batch, Feedback, LossFeedback, Pool, group_advantages, kept_group_advantages

__version__ = "0.1.0"

__all__ = ["InputError", "Pool", "Feedback", "LossFeedback", "Batch", "Scheduler", "StepResult", "policies", "compose",
           "policy_factory", "recommended", "group_advantages", "kept_group_advantages", "__version__"]
