"""The default comparison matrix: DataFlex-RL's 13 configurations, mapped onto our registry.

DataFlex-RL (Liang et al., arXiv 2609.06107, "Which 13 configurations?")
compares uniform GRPO, 8 rollout selection/reweighting methods, a fixed equal mixture and
3 adaptive mixtures. `DATAFLEX_SLOTS` lists those 13 slots with the registry names that
implement each one, best match first: the DataFlex method itself when we have it, then
the closest rlpace method of the same kind (an *analogue*, printed as such). A slot with no
registered candidate is reported as missing; `default_policies` then fills the matrix up
to 13 with rlpace methods outside DataFlex's list (`EXTRAS`), so the default run stays a
13-configuration matrix whenever the registry allows it.

Policies keep their registered defaults: hyperparameters are those of the paper the policy
file cites (docs/methods/<name>.md); DataFlex's own values are noted per slot.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

from ._grid import PolicyConfig

__all__ = ["Slot", "DATAFLEX_SLOTS", "EXTRAS", "default_policies", "MatrixPlan"]


class Slot(NamedTuple):
    dataflex: str           # DataFlex-RL's config name (arXiv 2609.06107, its configuration table)
    kind: str               # baseline | reweight | select | mix
    candidates: tuple       # registry names, exact DataFlex method first, then analogues
    note: str               # what DataFlex ran
    analogue: str = ""      # why the fallback candidates are close
    kwargs: tuple = ()      # (name, value) pairs that make the exact candidate DataFlex's rule


DATAFLEX_SLOTS: tuple[Slot, ...] = (
    Slot("baseline", "baseline", ("uniform",), "uniform GRPO"),
    # `ar` weighs each token by α·π_old(o_t) + (1 − α): exact in the built-in trainer, which
    # passes token probabilities to `Scheduler.token_weights`; the simulator has no tokens,
    # so there its weights are 1 (docs/methods/ar.md).
    Slot("ar", "reweight", ("ar",),
         "token-prob reweighting w_t = α·π_t + (1−α), α=0.5, mean 1 over valid tokens; exact in the "
         "trainer, weight 1 in the simulator (no tokens)"),
    Slot("per", "reweight", ("per_advantage",), "w = |A|^0.5, mean 1"),
    Slot("softmax", "reweight", ("softmax_advantage",), "w = softmax(|A|/T)·N, T=1"),
    Slot("diffband", "reweight", ("difficulty_band",), "weight 2 inside the [25%,75%] reward band"),
    # DataFlex keeps groups strictly inside the band; our success_band default is the closed
    # band [low, high], so the slot passes inclusive=False.
    Slot("difffilter", "select", ("success_band",), "keep groups with solve rate in (0.2, 0.8)",
         kwargs=(("inclusive", False),)),
    Slot("maxvar", "select", ("pods_max_variance",), "PODS: max-variance half of each group"),
    # GFPO ranks by reward/length from Feedback.lengths (the built-in trainer reports them);
    # without lengths (the simulator) it ranks by reward alone (docs/methods/gfpo.md).
    Slot("gfpo", "select", ("gfpo", "dapo_dynamic_sampling"),
         "GFPO: top-3 per group by reward/length (DataFlex k=3, metric=efficiency); the simulator "
         "has no lengths, so there it keeps the top-3 by reward", "both filter rollout groups by reward"),
    Slot("topk", "select", ("topk",), "keep the top 50% |A| rollouts of the batch"),
    Slot("static", "mix", ("fixed_mixture",), "fixed equal share per domain"),
    Slot("reward_gap", "mix", ("reward_gap",),
         "softmax((max r̄ − r̄_d)/T), r̄ over the last 50 rollouts, T=1, floor 0.05"),
    Slot("dump_ucb", "mix", ("dump",), "UCB on windowed mean |A| → softmax"),
    Slot("tscl", "mix", ("tscl",),
         "softmax(|reward slope|/T), T=1, floor 0.05 (the intended rule; the July code "
         "ran softmax(|mean reward|))"),
)

# rlpace methods outside DataFlex's list, used (in this order) to fill missing slots.
EXTRAS: tuple[str, ...] = ("ads", "mopps", "learnability_buffer", "prioritized_learnability",
                           "sec", "exp3", "dapo_dynamic_sampling", "drop_all_wrong")


class MatrixPlan(NamedTuple):
    policies: tuple          # PolicyConfig, in slot order then fillers
    lines: tuple             # human-readable mapping, one line per slot/filler
    missing: tuple           # DataFlex slots with no registered candidate


def default_policies(available: Sequence[str] | None = None, size: int = 13) -> MatrixPlan:
    """The default matrix for `rlpace compare`, from the registered names.

    Args:
        available: registered policy names; default `rlpace.policies.names()` (read now,
            so policies registered by other modules count).
        size: target number of configurations (DataFlex-RL: 13).

    Returns:
        A `MatrixPlan` whose `lines` say, per slot, which policy fills it (exact or analogue)
        or that it is missing, and which extras were added to reach `size`.

    Example:
        >>> plan = default_policies(["uniform", "fixed_mixture", "dump"], size=13)
        >>> [p.label for p in plan.policies]
        ['uniform', 'fixed_mixture', 'dump']
        >>> "ar" in plan.missing
        True
    """
    if available is None:
        from ..policies import names
        available = names()
    avail = set(available)
    used: list[str] = []
    slot_kwargs: dict[str, dict] = {}
    lines: list[str] = []
    missing: list[str] = []
    for slot in DATAFLEX_SLOTS:
        pick = next((c for c in slot.candidates if c in avail and c not in used), None)
        if pick is None:
            missing.append(slot.dataflex)
            lines.append(f"  {slot.dataflex:11s} -> NOT AVAILABLE ({slot.note}); none of "
                         f"{list(slot.candidates)} is registered")
            continue
        used.append(pick)
        if pick == slot.candidates[0]:
            slot_kwargs[pick] = dict(slot.kwargs)
            shown = pick + "".join(f" {k}={v}" for k, v in slot.kwargs)
            lines.append(f"  {slot.dataflex:11s} -> {shown} (DataFlex: {slot.note})")
        else:
            lines.append(f"  {slot.dataflex:11s} -> {pick} (ANALOGUE: {slot.candidates[0]} is not "
                         f"registered; {slot.analogue}. DataFlex: {slot.note})")
    for extra in EXTRAS:
        if len(used) >= size:
            break
        if extra in avail and extra not in used:
            used.append(extra)
            lines.append(f"  {'(filler)':11s} -> {extra} (rlpace method outside DataFlex's list)")
    return MatrixPlan(tuple(PolicyConfig(n, slot_kwargs.get(n, {})) for n in used), tuple(lines),
                      tuple(missing))
