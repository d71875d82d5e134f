"""A synthetic learner for fast policy research, without torch.

Each prompt i has a latent difficulty d_i and each domain k a skill s_k; a rollout of
prompt i succeeds with probability σ(s_k − d_i). Training on a batch moves each domain's
skill in proportion to the GRPO learning signal (mean |A| × loss weight) of its kept
groups — zero for all-same groups — with optional transfer between domains and
forgetting (see `rlpace.sim._learner` for the exact step).

>>> from rlpace.sim import SCENARIOS, make_scenario, simulate
>>> sorted(SCENARIOS)
['homogeneous', 'ladder', 'solved_majority']
>>> res = simulate(make_scenario("ladder", prompts_per_domain=50), "dump", steps=10,
...                batch_size=32, group_size=8, eval_every=5)
>>> res.mean_accuracy.shape, res.domain_prob.shape
((3,), (10, 12))
"""

from ._learner import (SimResult, batch_dependent_kwargs, group_signal, heldout_accuracy, oracle_kwargs,
                       progress_bar, proposal_names, simulate)
from ._scenarios import SCENARIOS, Scenario, World, build_world, make_scenario, sigmoid

__all__ = ["SCENARIOS", "Scenario", "make_scenario", "simulate", "SimResult", "World", "build_world",
           "heldout_accuracy", "group_signal", "sigmoid", "batch_dependent_kwargs", "progress_bar",
           "proposal_names", "oracle_kwargs"]
