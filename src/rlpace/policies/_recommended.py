"""`recommended`: the composition the headroom evidence supports — DUMP chooses how many
prompts each domain gets, MoPPS chooses which prompts inside each domain.

    probs_t = softmax((mean_window |A|_d + c·sqrt(2 ln(Σ n) / n_d)) / T)     DUMP, per domain d
    n_d    ~ Multinomial(B, probs_t)                                        slots per domain
    γ_i    ~ Beta(α_i, β_i)  for ratio·n_d candidates i of domain d           MoPPS posterior
    keep the n_d candidates with γ_i closest to 1/2                          boundary prompts

Why this one (measured with `benchmarks/headroom.py`, 8 seeds, paired 95 % CIs; the README's
headroom table has every figure): the two signals are complementary. A domain mixture can only
capture the part of the headroom that lies *between* domains (a curriculum: which size of a
ladder is learnable now) — DUMP captures most of it on the simulator's `ladder`; a prompt
selection captures the part *inside* domains (skip prompts already solved or still
unreachable) — MoPPS captures most of it on `homogeneous` and `solved_majority`, where a
mixture can do nothing. Composed, DUMP + MoPPS captured 79 % of the oracle's saving on
`ladder` (0.59× uniform's rollouts against the oracle's 0.48×) and 57 % on `homogeneous`.
Neither part requests refills or probes, so every rollout it spends trains the policy.
Where it stands on the built-in trainer's suites is in the README; it is not a universal
winner (docs/methods/recommended.md says where it falls short).

The hyperparameters are each paper's defaults (DUMP, arXiv 2504.09710: T = 0.1, c = 1,
window 300 rollouts; MoPPS, arXiv 2507.04632: 16 candidates per slot, target 0.5, λ = 1);
any of them can be overridden by name, e.g. `Scheduler(pool, "recommended", temperature=0.2)`.
"""

from __future__ import annotations

from ._base import Method, compose
from ._dump import dump_ucb
from ._mopps import mopps


def recommended(temperature: float = 0.1, c: float = 1.0, window: int = 300, floor: float = 0.0,
                ratio: int = 16, target: float = 0.5, decay: float = 1.0, prior_strength: float = 0.0) -> Method:
    """DUMP's domain mixture with MoPPS's boundary-prompt selection inside each domain.

    docs/methods/recommended.md. Args are DUMP's (`temperature`, `c`, `window`, `floor`:
    see `dump_ucb`) and MoPPS's (`ratio`, `target`, `decay`, `prior_strength`: the weight of
    the pass-rate predictor's prior for prompts not yet seen, which needs `Pool.features`;
    0 = off; see `mopps`), validated by them.

    >>> from rlpace import Pool, Scheduler
    >>> s = Scheduler(Pool(["a"] * 8 + ["b"] * 8), "recommended", seed=0)
    >>> ids = s.propose(4); ids.shape, s.name
    ((4,), 'recommended')
    """
    return compose(dump_ucb(temperature=temperature, c=c, window=window, floor=floor),
                   mopps(ratio=ratio, target=target, decay=decay, prior_strength=prior_strength),
                   name="recommended")
