"""`recommended`: the composition the headroom evidence supports — DUMP's distribution-level
UCB chooses how many prompts each domain gets, MoPPS chooses which prompts inside each domain.

    score_d = mean_window |A|_d + c·sqrt(2 ln(Σ n) / n_d)                  DUMP, per domain d
    probs_d ∝ s_d · exp(score_d / T)                                       s_d: d's share of the pool
    n_d    ~ Multinomial(B, probs)                                         slots per domain
    γ_i    ~ Beta(α_i, β_i)  for ratio·n_d candidates i of domain d           MoPPS posterior
    keep the n_d candidates with γ_i closest to 1/2                          boundary prompts

Why this one (measured with `benchmarks/headroom.py`, 8 seeds, 16 on `embedded`, paired 95 %
CIs; docs/headroom.md has every figure): the two signals are complementary. A
domain mixture can only capture the part of the headroom that lies *between* domains (a
curriculum: which size of a ladder is learnable now) — DUMP captures most of it on the
simulator's and the trainer's `ladder`; a prompt selection captures the part *inside* domains
(skip prompts already solved or still unreachable) — MoPPS captures most of it on
`homogeneous` and `solved_majority`, where a mixture can do nothing. Neither part requests
refills or probes, so every rollout it spends trains the policy.

Two settings differ from DUMP's code, both chosen on the trainer's suites:

* the softmax tilts the pool's shares (`base="pool"`: equal scores give uniform-over-prompts
  shares) instead of the uniform distribution over domains. With DUMP's rule a small domain
  at high |A| can take most of the batch, and its few prompts are repeated until they are
  memorised: on one seed of `embedded` two 36-prompt domains took 60 % of the batches, their
  training reward rose 0.4 → 0.7 while their held-out accuracy stayed at 0.3, and the starved
  larger domains unlearned what they had (−13 points on that seed);
* T = 0.15 instead of 0.1: a little less concentration, so a domain whose |A| is small but
  still learnable keeps some slots. On `embedded` (16 seeds) final accuracy Δ vs uniform
  went from −1.4 [−3.2, −0.1] points (DUMP's T = 0.1, uniform base) to +0.3 [−0.9, +1.4];
  on `ladder` it keeps 83 % of the oracle's saving (92 % at T = 0.1) and on `mostly_solved`
  75 % (77 %).

Where it stands on every suite is in docs/headroom.md; it is not a universal winner
(docs/methods/recommended.md says where it falls short). The other hyperparameters are each
paper's defaults (DUMP, arXiv 2504.09710: c = 1, window 300 rollouts; MoPPS, arXiv
2507.04632: 16 candidates per slot, target 0.5, λ = 1); any of them can be overridden by
name, e.g. `Scheduler(pool, "recommended", temperature=0.1, base="arms")` for DUMP's own
mixture.
"""

from __future__ import annotations

from ._base import Method
from ._compose import compose
from ._dump import dump_ucb
from ._mopps import mopps


def recommended(temperature: float = 0.15, c: float = 1.0, window: int = 300, floor: float = 0.0,
                ratio: int = 16, target: float = 0.5, decay: float = 1.0, prior_strength: float = 0.0,
                base: str = "pool") -> Method:
    """DUMP's domain mixture with MoPPS's boundary-prompt selection inside each domain.

    docs/methods/recommended.md. Args are DUMP's (`temperature`, `c`, `window`, `floor`,
    `base`: see `dump_ucb`) and MoPPS's (`ratio`, `target`, `decay`, `prior_strength`: the weight of
    the pass-rate predictor's prior for prompts not yet seen, which needs `Pool.features`;
    0 = off; see `mopps`), validated by them.

    >>> from rlpace import Pool, Scheduler
    >>> s = Scheduler(Pool(["a"] * 8 + ["b"] * 8), "recommended", seed=0)
    >>> ids = s.propose(4); ids.shape, s.name
    ((4,), 'recommended')
    """
    return compose(dump_ucb(temperature=temperature, c=c, window=window, floor=floor, base=base),
                   mopps(ratio=ratio, target=target, decay=decay, prior_strength=prior_strength),
                   name="recommended")
