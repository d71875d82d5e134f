"""`compose`: a whole `Method` from policies of any kinds, with the neutral defaults in the
empty places. Apart from `_base` because the default selections live in `_uniform`, which
builds on `_base`."""

from __future__ import annotations

from ..errors import InputError

from ._base import (ADMISSION, ADVANTAGE, ALLOCATION, KINDS, MIXTURE, REWARD, REWEIGHTING, SELECTION, TARGET, DataPolicy,
                    Method, chain, dataset_labels, identity_reward, is_neutral, keep_all, unit_advantage,
                    unit_weights)
from ._uniform import uniform_pool, uniform_within_arm

__all__ = ["compose"]


def compose(*policies: DataPolicy | Method, name: str = "") -> Method:
    """Build a `Method` from policies of any kinds (and/or other methods).

    At most one mixture, one selection, one target and one allocation; several admission, reweighting,
    reward or advantage policies are stacked with `chain`. Empty places get neutral defaults: with a mixture, prompts are
    drawn arm by arm from it (`uniform_within_arm`); without, uniformly from the pool;
    admission keeps everything; weights are 1; every prompt keeps its dataset label; rewards
    pass unchanged; advantage weights are 1. A mixture with a selection whose
    `follows_mixture` is False is a ValueError: the mixture would be silently ignored.

    >>> from rlpace.policies import make_policy
    >>> m = compose(make_policy("dump"), make_policy("dapo_dynamic_sampling"))
    >>> (m.mixture.name, m.selection.name, m.admission.name)
    ('dump', 'uniform_within_arm', 'dapo_dynamic_sampling')
    """
    slots: dict[str, list[DataPolicy]] = {k: [] for k in KINDS}
    names = []
    for p in policies:
        if isinstance(p, Method):
            for kind, q in p.policies().items():
                if not is_neutral(q):
                    slots[kind].append(q)
            names.append(p.name)
        elif isinstance(p, DataPolicy):          # its kind was checked when it was built
            slots[p.kind].append(p)
            names.append(p.name)
        else:
            raise TypeError(f"compose takes DataPolicy or Method objects; got {type(p).__name__}.")
    for kind in (MIXTURE, SELECTION, TARGET, ALLOCATION):
        if len(slots[kind]) > 1:
            raise InputError(f"a method has one {kind} policy; got {[q.name for q in slots[kind]]}. "
                             f"Keep one of them.")
    mixture = slots[MIXTURE][0] if slots[MIXTURE] else None
    if slots[SELECTION]:
        selection = slots[SELECTION][0]
        if mixture is not None and not selection.follows_mixture:
            # The Scheduler would pass the mixture's probs to a selection that drops them:
            # the method would run as the selection alone, under the pair's name.
            raise InputError(
                f"selection {selection.name!r} does not follow a mixture (its DataPolicy."
                f"follows_mixture is False), so mixture {mixture.name!r} composed with it would "
                f"have no effect on which prompts are drawn. Drop one of the two, or use a "
                f"selection that follows a mixture (uniform_within_arm, the default when no "
                f"selection is given; mopps; learnability_buffer; prioritized_learnability; "
                f"ads_boundary_window). A selection of your own that honours `probs` sets "
                f"follows_mixture=True.")
    else:
        selection = uniform_within_arm() if mixture is not None else uniform_pool()
    admission = chain(*slots[ADMISSION]) if slots[ADMISSION] else keep_all()
    reweighting = chain(*slots[REWEIGHTING]) if slots[REWEIGHTING] else unit_weights()
    target = slots[TARGET][0] if slots[TARGET] else dataset_labels()
    reward = chain(*slots[REWARD]) if slots[REWARD] else identity_reward()
    advantage = chain(*slots[ADVANTAGE]) if slots[ADVANTAGE] else unit_advantage()
    return Method(mixture, selection, admission, reweighting,
                  name=name or "+".join(n for n in names if n),
                  target=target, reward=reward, advantage=advantage,
                  allocation=slots[ALLOCATION][0] if slots[ALLOCATION] else None)
