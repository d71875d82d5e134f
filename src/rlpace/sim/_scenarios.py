"""Named synthetic scenarios for the simulator, and the world (pool + latent difficulties +
held-out sets) each one builds.

A scenario is a frozen, documented dataclass; `make_scenario(name, **overrides)` copies
one with some fields changed. The latent model is logistic: prompt i of domain k succeeds
with probability σ(s_k − d_i), where s_k is the learner's skill in domain k (0 at the
start) and d_i the prompt's latent difficulty. Each domain's difficulties are drawn
N(μ_k, difficulty_sd²), with μ_k solved so that the domain's expected accuracy at the
start equals `base_accuracy[k]` exactly (Gauss–Hermite quadrature).
"""

from __future__ import annotations

from ..errors import InputError
import dataclasses
import functools
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..types import Pool

__all__ = ["Scenario", "SCENARIOS", "make_scenario", "World", "build_world", "sigmoid"]


def sigmoid(x: np.ndarray) -> np.ndarray:
    """σ(x) = 1 / (1 + e^(−x)), float64."""
    return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=np.float64)))


@dataclass(frozen=True)
class Scenario:
    """A synthetic learning problem: domains, their difficulty, and how the learner learns.

    Attributes:
        name: the key in `SCENARIOS`.
        description: one paragraph: what it models and which policies it should favour.
        domains: K domain labels (the Pool's `domains`, DUMP's `data_source`).
        base_accuracy: K expected held-out accuracies at the start (skill 0), each in (0, 1).
        difficulty_sd: spread of latent difficulty inside a domain, in logits.
        prompts_per_domain: training prompts per domain (pool size = K × this).
        solved_fraction: share of each domain's training prompts that are already solved
            (latent difficulty `solved_difficulty`); held-out sets exclude them (they
            measure what is left to learn).
        solved_difficulty: latent difficulty of the solved prompts (−6: P(success) ≈ 0.998).
        heldout_per_domain: held-out prompts per domain; accuracy is the exact mean of
            σ(s_k − d_j) over them (no sampling noise in the evaluation).
        lr: learning rate: skill gain per unit of batch-normalised learning signal.
        transfer_forward: a gain g in domain j also moves domain j + m by g·τ^m (τ this
            value): practice on easier neighbours helps harder ones (the ladder's order).
        transfer_backward: the same towards easier domains (j − m).
        transfer: a full K×K matrix M (gain = M @ signal) that overrides the two above.
        forgetting: per step, every skill relaxes towards its start by this fraction.
        clusters_per_domain: semantic clusters inside each domain, prompts assigned at
            random (independent of difficulty), for cluster-level methods such as ADS.
        annotation_noise: the Pool's offline `difficulty` score is the latent difficulty
            plus N(0, this²) noise — an imperfect offline ranker (ADS uses reference NLL).
        target: default held-out accuracy (domain-balanced mean) for steps-to-target.
        pool_seed: seed of the world (pool difficulties, clusters, held-out sets); a run's
            own seed changes only scheduling and rollouts, so seeds share one problem.
    """

    name: str
    description: str
    domains: tuple
    base_accuracy: tuple
    difficulty_sd: float = 1.0
    prompts_per_domain: int = 1000
    solved_fraction: float = 0.0
    solved_difficulty: float = -6.0
    heldout_per_domain: int = 512
    lr: float = 0.1
    transfer_forward: float = 0.0
    transfer_backward: float = 0.0
    transfer: tuple | None = None
    forgetting: float = 0.0
    clusters_per_domain: int = 1
    annotation_noise: float = 0.5
    target: float = 0.7
    pool_seed: int = 0

    def __post_init__(self):
        # Tuples everywhere: the scenario is hashable (the world cache keys on it).
        object.__setattr__(self, "domains", tuple(str(d) for d in self.domains))
        object.__setattr__(self, "base_accuracy", tuple(float(a) for a in self.base_accuracy))
        if self.transfer is not None:
            object.__setattr__(self, "transfer", tuple(tuple(float(x) for x in row)
                                                       for row in np.asarray(self.transfer)))
        k = len(self.domains)
        if k == 0:
            raise InputError("Scenario.domains is empty; give at least one domain label.")
        if len(set(self.domains)) != k:
            raise InputError(f"Scenario.domains has duplicate labels: {self.domains}.")
        if len(self.base_accuracy) != k:
            raise InputError(f"Scenario.base_accuracy has {len(self.base_accuracy)} values for {k} "
                             f"domains; give one starting accuracy per domain.")
        acc = np.asarray(self.base_accuracy, dtype=np.float64)
        if not ((acc > 0) & (acc < 1)).all():
            raise InputError(f"Scenario.base_accuracy must lie strictly in (0, 1); got {self.base_accuracy}.")
        for name in ("prompts_per_domain", "heldout_per_domain", "clusters_per_domain"):
            if int(getattr(self, name)) < 1:
                raise InputError(f"Scenario.{name} must be ≥ 1; got {getattr(self, name)}.")
        if not 0.0 <= self.solved_fraction < 1.0:
            raise InputError(f"Scenario.solved_fraction must be in [0, 1); got {self.solved_fraction}.")
        if not 0.0 <= self.forgetting < 1.0:
            raise InputError(f"Scenario.forgetting must be in [0, 1); got {self.forgetting}.")
        for name in ("difficulty_sd", "annotation_noise", "lr", "transfer_forward", "transfer_backward"):
            v = float(getattr(self, name))
            if not np.isfinite(v) or v < 0:
                raise InputError(f"Scenario.{name} must be finite and ≥ 0; got {v}.")
        if self.transfer is not None:
            m = np.asarray(self.transfer, dtype=np.float64)
            if m.shape != (k, k) or not np.isfinite(m).all():
                raise InputError(f"Scenario.transfer must be a finite {k}×{k} matrix; got shape {m.shape}.")
        if not 0.0 < self.target < 1.0:
            raise InputError(f"Scenario.target must be in (0, 1); got {self.target}.")

    @property
    def n_domains(self) -> int:
        return len(self.domains)

    def transfer_matrix(self) -> np.ndarray:
        """float64[K, K] M with skill gain = lr · M @ signal; M[k, j] = τ_f^(k−j) for j < k,
        τ_b^(j−k) for j > k, 1 on the diagonal (or the explicit `transfer`)."""
        if self.transfer is not None:
            return np.asarray(self.transfer, dtype=np.float64)
        k = self.n_domains
        gap = np.arange(k)[:, None] - np.arange(k)[None, :]          # k − j
        fwd = np.where(gap > 0, float(self.transfer_forward) ** np.maximum(gap, 0), 0.0)
        bwd = np.where(gap < 0, float(self.transfer_backward) ** np.maximum(-gap, 0), 0.0)
        return np.eye(k) + fwd + bwd

    def difficulty_means(self) -> np.ndarray:
        """float64[K] μ_k such that E_z[σ(−μ_k − sd·z)] = base_accuracy[k], z ~ N(0, 1)."""
        return _solve_means(np.asarray(self.base_accuracy, dtype=np.float64), float(self.difficulty_sd))


def _solve_means(acc: np.ndarray, sd: float) -> np.ndarray:
    z, wq = np.polynomial.hermite_e.hermegauss(80)       # ∫ f(z) φ(z) dz ≈ Σ wq f(z) / √(2π)
    wq = wq / wq.sum()
    lo, hi = np.full(acc.shape, -40.0), np.full(acc.shape, 40.0)
    for _ in range(100):                                  # bisection: accuracy falls as μ grows
        mid = 0.5 * (lo + hi)
        a = sigmoid(-mid[:, None] - sd * z[None, :]) @ wq
        lo = np.where(a > acc, mid, lo)
        hi = np.where(a > acc, hi, mid)
    return 0.5 * (lo + hi)


class World(NamedTuple):
    """What a scenario materialises: the Pool and the latent truth behind it."""

    pool: Pool
    difficulty: np.ndarray   # float64[N] latent difficulty d_i of each training prompt
    domain: np.ndarray       # int64[N] scenario-order domain index of each prompt
    pool_order: np.ndarray   # int64[K] pool code of each scenario domain (pool sorts labels)
    heldout: np.ndarray      # float64[K, H] latent difficulties of each domain's held-out set
    transfer: np.ndarray     # float64[K, K]


@functools.lru_cache(maxsize=2)
def build_world(scenario: Scenario) -> World:
    """Draw the pool and held-out sets of a scenario (deterministic in `pool_seed`).

    Cached (two most recent scenarios): the pool is immutable, so runs share it.
    O(N log N) once, for the Pool's rank index.
    """
    k, n_k = scenario.n_domains, int(scenario.prompts_per_domain)
    rng = np.random.default_rng([scenario.pool_seed, 0xD1FF])
    mu = scenario.difficulty_means()
    sd = float(scenario.difficulty_sd)
    dom = np.repeat(np.arange(k, dtype=np.int64), n_k)
    diff = mu[dom] + sd * rng.standard_normal(dom.shape[0])
    if scenario.solved_fraction > 0:
        solved = rng.random(dom.shape[0]) < scenario.solved_fraction
        diff[solved] = scenario.solved_difficulty + 0.5 * rng.standard_normal(int(solved.sum()))
    c = int(scenario.clusters_per_domain)
    cluster = dom * c + rng.integers(0, c, size=dom.shape[0])
    annotated = diff + float(scenario.annotation_noise) * rng.standard_normal(dom.shape[0])
    names = np.asarray([str(d) for d in scenario.domains])
    cluster_names = np.asarray([f"{d}/c{j}" for d in scenario.domains for j in range(c)]) if c > 1 else names
    # Domain labels are given in scenario order; Pool sorts labels, so map back explicitly.
    pool = Pool(names[dom], clusters=cluster_names[cluster], difficulty=annotated)
    pool_order = np.array([pool.domain_names.index(str(d)) for d in scenario.domains], dtype=np.int64)
    h_rng = np.random.default_rng([scenario.pool_seed, 0x4E1D])
    heldout = mu[:, None] + sd * h_rng.standard_normal((k, int(scenario.heldout_per_domain)))
    for arr in (diff, dom, heldout, pool_order):
        arr.setflags(write=False)
    return World(pool, diff, dom, pool_order, heldout, scenario.transfer_matrix())


# ---- the named scenarios ----------------------------------------------------------------
# Calibration: `lr` and `target` are set so that uniform sampling at B = 128, G = 16 needs
# roughly 350–400 steps to reach the target (ladder ≈ 350, homogeneous ≈ 410, solved
# majority ≈ 360), long enough for schedules to differ, short enough for tests. The
# homogeneous lr is smaller because its single skill receives the whole batch's signal,
# where each ladder rung receives about 1/12 of it. No policy's result was used to set them.
_LADDER_ACC = tuple(float(x) for x in
                    1.0 / (1.0 + np.exp(-np.linspace(np.log(0.95 / 0.05), np.log(0.02 / 0.98), 12))))

SCENARIOS: dict[str, Scenario] = {
    "ladder": Scenario(
        name="ladder",
        description=(
            "DUMP-like ladder (DUMP's Knights-and-Knaves depths 3..14): 12 domains of rising "
            "difficulty whose starting accuracy falls evenly in logit from 95% to 2%. Practice "
            "transfers to harder neighbours (τ = 0.5 per rung). Uniform sampling gives every "
            "rung 1/12 of the batch: about 30% of its groups have zero GRPO advantage at the "
            "start, and more as rungs get solved, while groups near 50% success carry the most "
            "signal (mean |A| ≈ 1 against ≈ 0.4 at 95%). A scheduler that follows the "
            "learnability frontier should reach the target in fewer steps."),
        domains=tuple(f"L{i:02d}" for i in range(12)),
        base_accuracy=_LADDER_ACC,
        difficulty_sd=1.0, prompts_per_domain=1000, lr=0.1, transfer_forward=0.5,
        clusters_per_domain=1, annotation_noise=0.5, target=0.8),
    "homogeneous": Scenario(
        name="homogeneous",
        description=(
            "One domain (8 semantic clusters at random) whose prompts span a wide difficulty "
            "range (sd 1.5 logits) around 35% starting accuracy. There is no domain to choose: "
            "domain mixtures reduce to uniform, so an adaptive method should not be worse than "
            "uniform; prompt-level selection may help a little."),
        domains=("all",),
        base_accuracy=(0.35,),
        difficulty_sd=1.5, prompts_per_domain=8000, lr=0.01,
        clusters_per_domain=8, annotation_noise=0.5, target=0.8),
    "solved_majority": Scenario(
        name="solved_majority",
        description=(
            "Four domains, each 90% already-solved prompts (P(success) ≈ 0.998) and 10% open "
            "prompts with starting accuracy 40%, 20%, 8% and 3%. Held-out sets hold open "
            "prompts only. Uniform wastes about 90% of each batch on solved prompts; prompt-"
            "level selection (MoPPS, learnability buffers) and group filtering should help, "
            "domain mixtures little (every domain looks alike)."),
        domains=("S0", "S1", "S2", "S3"),
        base_accuracy=(0.40, 0.20, 0.08, 0.03),
        difficulty_sd=1.0, prompts_per_domain=2500, solved_fraction=0.9, lr=0.5,
        clusters_per_domain=2, annotation_noise=0.5, target=0.6),
}


def make_scenario(name: str, **overrides) -> Scenario:
    """A named scenario with some fields changed.

    >>> make_scenario("ladder", prompts_per_domain=100).pool_seed
    0
    """
    if name not in SCENARIOS:
        raise InputError(f"unknown scenario {name!r}; valid: {', '.join(sorted(SCENARIOS))}.")
    fields = {f.name for f in dataclasses.fields(Scenario) if not f.name.startswith("_")}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise InputError(f"unknown Scenario field(s) {unknown}; valid: {sorted(fields)}.")
    return dataclasses.replace(SCENARIOS[name], **overrides)
