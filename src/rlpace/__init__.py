"""rlpace: adaptive data scheduling for RL post-training of LLMs.

The public API: records (`Pool`, `Feedback`), the `Scheduler` that trainers and engine
adapters drive, and the `policies` registry and algebra.
"""

from . import policies
from .policies import compose
from .scheduler import Scheduler
from .types import Batch, Feedback, Pool, group_advantages

__version__ = "0.1.0"

__all__ = ["Pool", "Feedback", "Batch", "Scheduler", "policies", "compose", "group_advantages",
           "__version__"]
