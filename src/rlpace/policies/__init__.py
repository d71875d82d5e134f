"""Data policies: the seven kinds (mixture, selection, admission, reweighting, and the
supervision places target, reward, advantage), their algebra (`compose`, `chain`, `with_floor`) and the registry of methods by name.

Every method's algorithm lives in one short file here (`_dump.py`, `_ads.py`, ...) that
cites its paper (arXiv id) and its page in the project's docs, `docs/methods/<name>.md`
(index: `docs/methods/README.md`).

>>> from rlpace import policies
>>> "dump" in policies.names()
True
"""

from ._base import (ADMISSION, ADVANTAGE, ALLOCATION, KINDS, MIXTURE, REWARD, REWEIGHTING, SELECTION, TARGET,
                    Admission, DataPolicy, EmptyState, Method, Targets, chain, dataset_labels,
                    identity_reward, is_neutral, keep_all, softmax, active_supervision_places, supervising_places, unit_advantage, unit_weights,
                    with_floor)
from ._compose import compose
from ._protocols import (AdmissionApply, AdvantageApply, AllocationApply, MixtureApply, PolicyCheckState,
                         PolicyDecisions, PolicyInit, PolicyMetrics, PolicyUpdate, PolicyUpdateLosses,
                         ReweightingApply, RewardApply, SelectionApply, TargetApply)
from ._admission import (dapo_dynamic_sampling, drop_all_wrong, max_variance_subset,
                         pods_max_variance, success_band, topk_advantage)
from ._ads import ads, ads_boundary_window, ads_cluster_ema, move_window
from ._ar import advantage_reweight
from ._diem import diem
from ._criticality import criticality_is, criticality_selection, criticality_weights
from ._grid import criticality_grid, grid_proposal, grid_weights
from ._dump import dump_ucb
from ._dvc import dvc
from ._epiplexity import epiplexity
from ._exp3 import exp3
from ._gfpo import gfpo
from ._greso import greso
from ._learnability import learnability_buffer, prioritized_learnability
from ._mopps import mopps
from ._oracle import oracle_boundary, oracle_progress
from ._recommended import recommended
from ._registry import is_policy_factory, make_method, make_policy, names, policy_factory, register
from ._reward_gap import reward_gap
from ._reweighting import difficulty_band, per_advantage, softmax_advantage
from ._sec import sec
from ._tscl import tscl
from ._uniform import fixed_mixture, uniform_pool, uniform_within_arm
from ._ttrl import ttrl
from ._self_certainty import self_certainty
from ._entropy_min import entropy_min
from ._olr import olr
from ._trapo import trapo
from ._vote import agreement_rewards, unique_majority
from ._knapsack import knapsack, oracle_allocation
from ._gvm import gvm
from ._vip import vip

__all__ = [
    "DataPolicy", "Method", "Admission", "EmptyState", "KINDS", "MIXTURE", "SELECTION",
    "ADMISSION", "REWEIGHTING", "compose", "chain", "with_floor", "softmax", "keep_all",
    "unit_weights", "names", "register", "policy_factory", "is_policy_factory", "make_policy",
    "make_method",
    "uniform_pool", "uniform_within_arm", "fixed_mixture", "dump_ucb",
    "ads", "ads_cluster_ema", "ads_boundary_window", "move_window",
    "learnability_buffer", "prioritized_learnability", "mopps", "sec", "exp3",
    "dapo_dynamic_sampling", "success_band", "pods_max_variance", "max_variance_subset",
    "drop_all_wrong", "per_advantage", "difficulty_band", "softmax_advantage",
    "topk_advantage", "diem", "dvc", "reward_gap", "tscl", "advantage_reweight", "gfpo", "oracle_boundary", "oracle_progress",
    "epiplexity", "criticality_is", "criticality_selection", "criticality_weights", "greso",
    "criticality_grid", "grid_proposal", "grid_weights",
    "recommended", "TARGET", "REWARD", "ADVANTAGE", "Targets", "dataset_labels", "identity_reward", "active_supervision_places", "supervising_places", "is_neutral",
    "unit_advantage", "ttrl", "self_certainty", "entropy_min", "olr", "trapo", "agreement_rewards",
    "unique_majority", "knapsack", "gvm", "vip", "oracle_allocation", "ALLOCATION",
    "PolicyInit", "PolicyUpdate", "MixtureApply", "SelectionApply", "AdmissionApply", "ReweightingApply",
    "TargetApply", "RewardApply", "AdvantageApply", "AllocationApply", "PolicyMetrics", "PolicyCheckState",
    "PolicyUpdateLosses", "PolicyDecisions",
]


def _uniform() -> Method:
    """Plain GRPO sampling: every prompt equally likely (no mixture, keep all, weight 1)."""
    return compose(uniform_pool(), name="uniform")


# ---- the registry: name -> factory. Proposal methods first, then admission, reweighting.
register("uniform", _uniform)
register("recommended", recommended)  # DUMP mixture + MoPPS within domains, docs/methods/recommended.md
register("fixed_mixture", fixed_mixture)
register("dump", dump_ucb)
register("ads", ads)
register("learnability_buffer", learnability_buffer)
register("prioritized_learnability", prioritized_learnability)
register("mopps", mopps)
# pass-rate predictor over prompt features (rlpace.predict): docs/methods/criticality_is.md, greso.md
register("criticality_is", criticality_is)
register("criticality_grid", criticality_grid)  # the same over a parameter grid (tasks=grid:<family>)
register("greso", greso)
register("sec", sec)
register("exp3", exp3)
register("reward_gap", reward_gap)
# gradient-informed (read Feedback.grads / ref_grad; fall back without them): docs/methods/dvc.md
register("dvc", dvc)
register("tscl", tscl)
register("epiplexity", epiplexity)  # loss-curve fits; fed by Scheduler.observe_losses (docs/methods/epiplexity.md)
register("dapo_dynamic_sampling", dapo_dynamic_sampling)
register("success_band", success_band)
register("pods_max_variance", pods_max_variance)
register("drop_all_wrong", drop_all_wrong)
register("topk", topk_advantage)
register("per_advantage", per_advantage)
register("difficulty_band", difficulty_band)
register("softmax_advantage", softmax_advantage)
register("diem", diem)              # gradient-informed reweighting, docs/methods/diem.md
# DataFlex-RL `ar` (token-level, docs/methods/ar.md) and `gfpo` (uses Feedback.lengths, docs/methods/gfpo.md)
register("ar", advantage_reweight)
register("gfpo", gfpo)
# Measurement tools for headroom (docs/methods/oracle.md), not methods: they need a
# measurement feed (every prompt's pass rate) and are left out of the proposal lists.
register("oracle_boundary", oracle_boundary)
register("oracle_progress", oracle_progress)
# Supervision as state (DE-Venus, arXiv 2609.03324; docs/methods/README.md): target places read
# Feedback.answers (Scheduler.targets), reward places the per-rollout token statistics
# (Scheduler.rewards); partially labelled pools mark Pool.labeled.
register("ttrl", ttrl)                      # majority-vote pseudo-labels, docs/methods/ttrl.md
register("self_certainty", self_certainty)  # Intuitor reward, docs/methods/self_certainty.md
register("entropy_min", entropy_min)        # EM-RL reward, docs/methods/entropy_min.md
register("olr", olr)                        # noisy-label relabelling, docs/methods/olr.md
register("trapo", trapo)                    # semi-supervised trajectory selection, docs/methods/trapo.md
# Allocation: how many rollouts each proposed prompt gets (Scheduler.allocate; docs/methods/knapsack.md).
register("knapsack", knapsack)              # Knapsack RL, docs/methods/knapsack.md
register("gvm", gvm)                        # GVM-RAFT's closed form, docs/methods/gvm.md
register("vip", vip)                        # VIP (a reconstruction), docs/methods/vip.md
register("oracle_allocation", oracle_allocation)   # headroom tool (true p), docs/methods/knapsack.md
