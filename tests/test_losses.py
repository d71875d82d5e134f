"""The policy-gradient objectives against values computed by hand (and a reference loop):
admission (`keep`) alone sets the normaliser, loss weights multiply inside it,
per-token weights, and advantages recomputed on the kept rollouts."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from rlpace.train.losses import (advantages, aggregation_units, clipped_surrogate, dapo_loss,  # noqa: E402
                                 dr_grpo_loss, grpo_loss, gspo_loss, kl_k3, policy_loss)

torch.set_num_threads(1)


def t(x):
    return torch.tensor(x, dtype=torch.float32)


# Two rollouts, T = 3. Row 0: 3 tokens, A = +1. Row 1: 2 tokens, A = -1.
MASK = t([[1, 1, 1], [1, 1, 0]])
ADV = t([1.0, -1.0])
OLD = torch.zeros(2, 3)
# log-ratios: row 0 tokens r = 1.5, 1.0, 1.1 ; row 1 tokens r = 0.5, 1.0 (third is padding)
LOGP = torch.log(t([[1.5, 1.0, 1.1], [0.5, 1.0, 7.0]]))


def test_advantages_by_hand():
    r = t([[1, 0, 0, 0], [1, 1, 1, 1]])
    a = advantages(r, "grpo")
    # mean 0.25, population std sqrt(0.1875) = 0.4330; (1-0.25)/0.4330 = 1.7321
    assert a[0].tolist() == pytest.approx([1.7320, -0.5773, -0.5773, -0.5773], abs=1e-3)
    assert a[1].tolist() == [0, 0, 0, 0]                      # no variance, no signal
    assert advantages(r, "dr_grpo")[0].tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25])


def test_clipped_surrogate_by_hand():
    s, clipped = clipped_surrogate(t([1.5, 1.1, 0.5, 0.5]), t([1.0, 1.0, -1.0, 1.0]), 0.2, 0.2)
    # 1.5·1 → clip at 1.2 ; 1.1·1 unclipped ; 0.5·(−1): min(−0.5, 0.8·−1 = −0.8) = −0.8 ; 0.5·1 = 0.5
    assert s.tolist() == pytest.approx([1.2, 1.1, -0.8, 0.5])
    assert clipped.tolist() == [True, False, True, False]


def test_grpo_loss_by_hand():
    out = grpo_loss(LOGP, OLD, ADV, MASK, torch.ones(2))
    row0 = (1.2 + 1.0 + 1.1) / 3          # clipped 1.5 → 1.2
    row1 = (-0.8 + -1.0) / 2              # 0.5·(−1) clipped to 0.8·(−1)
    assert out.loss.item() == pytest.approx(-(row0 + row1) / 2, abs=1e-6)
    assert out.clip_fraction == pytest.approx(2 / 5)


def test_dapo_clip_higher_and_token_level_aggregation():
    # ratio 1.25 with A > 0: clipped by GRPO's 1.2, not by DAPO's 1.28
    lp = torch.log(t([[1.25, 1.0, 1.0], [1.0, 1.0, 1.0]]))
    g = grpo_loss(lp, OLD, ADV, MASK, torch.ones(2)).loss.item()
    d = dapo_loss(lp, OLD, ADV, MASK, torch.ones(2)).loss.item()
    assert g == pytest.approx(-((1.2 + 1 + 1) / 3 + (-1 - 1) / 2) / 2, abs=1e-6)
    # token level: (1.25 + 1 + 1 − 1 − 1) / 5 tokens
    assert d == pytest.approx(-(1.25 + 1 + 1 - 1 - 1) / 5, abs=1e-6)
    out = dapo_loss(LOGP, OLD, ADV, MASK, torch.ones(2))
    assert out.loss.item() == pytest.approx(-(1.28 + 1.0 + 1.1 - 0.8 - 1.0) / 5, abs=1e-6)


def test_dr_grpo_uses_constant_normaliser():
    out = dr_grpo_loss(LOGP, OLD, ADV, MASK, torch.ones(2), max_tokens=4)
    total = (1.2 + 1.0 + 1.1) + (-0.8 - 1.0)
    assert out.loss.item() == pytest.approx(-total / (2 * 4), abs=1e-6)


def test_gspo_sequence_ratio_by_hand():
    lp = torch.log(t([[1.0002, 1.0002, 1.0002], [0.999, 0.999, 5.0]]))
    out = gspo_loss(lp, OLD, ADV, MASK, torch.ones(2))
    s0 = 1.0002                              # geometric mean of equal ratios: inside (1−3e-4, 1+4e-4)
    s1 = 0.999                               # below 1 − 3e-4 with A < 0: min(−0.999, −0.9997) = −0.9997
    assert out.loss.item() == pytest.approx(-(s0 * 1 + (1 - 3e-4) * -1) / 2, abs=1e-6)
    assert out.clip_fraction == pytest.approx(0.5)
    # the sequence ratio is a length-normalised geometric mean: padding never enters it
    lp2 = torch.log(t([[2.0, 0.5, 1.0], [1.0, 1.0, 1.0]]))
    out2 = gspo_loss(lp2, OLD, t([1.0, 0.0]), MASK, torch.ones(2), clip_low=10, clip_high=10)
    assert out2.loss.item() == pytest.approx(-(2.0 * 0.5 * 1.0) ** (1 / 3) / 2, abs=1e-6)


def test_reference_loop_matches_vectorised_grpo():
    g = torch.Generator().manual_seed(0)
    n, tt = 6, 5
    logp = -torch.rand(n, tt, generator=g)
    old = logp + 0.3 * (torch.rand(n, tt, generator=g) - 0.5)
    adv = torch.randn(n, generator=g)
    lens = [5, 3, 1, 4, 2, 5]
    mask = torch.tensor([[1.0] * k + [0.0] * (tt - k) for k in lens])
    w = t([1, 0.5, 0, 2, 1, 1])
    keep = t([1, 1, 1, 1, 0, 1])          # rollout 2 is kept with weight 0, rollout 4 dropped
    ref, kept = 0.0, 0
    for i in range(n):
        terms = []
        for j in range(lens[i]):
            r, a = math.exp(float(logp[i, j] - old[i, j])), float(adv[i])
            terms.append(min(r * a, min(max(r, 0.8), 1.2) * a))
        ref += float(keep[i]) * float(w[i]) * sum(terms) / lens[i]
        kept += int(keep[i])
    assert kept == 5                                  # the weight-0 rollout still counts
    got = grpo_loss(logp, old, adv, mask, keep, w).loss.item()
    assert got == pytest.approx(-ref / kept, abs=1e-5)


def _grad(objective, keep, weight, adv=ADV, mask=MASK, lp=LOGP):
    logp = lp.clone().requires_grad_(True)
    policy_loss(objective, logp, logp.detach(), adv, mask, keep, weight, max_tokens=3).loss.backward()
    return logp.grad


@pytest.mark.parametrize("objective", ["grpo", "dr_grpo", "dapo", "gspo"])
def test_zero_weight_silences_a_rollout_but_keeps_the_normaliser(objective):
    ones = torch.ones(2)
    g = _grad(objective, ones, t([0.0, 1.0]))
    assert torch.all(g[0] == 0) and torch.any(g[1] != 0)
    # weight 0 on a kept rollout: the other rollout's gradient is the unweighted one (same
    # normaliser); dropping it by admission instead changes the normaliser (2 → 1 rollouts,
    # DAPO: 5 → 3 tokens)
    assert torch.allclose(g[1], _grad(objective, ones, None)[1])
    dropped = _grad(objective, t([0.0, 1.0]), None)
    assert torch.all(dropped[0] == 0)
    factor = 5 / 2 if objective == "dapo" else 2.0
    assert torch.allclose(dropped[1], factor * g[1])
    # and the weight scales it: on-policy the per-token gradient is −w·A / normaliser
    assert torch.allclose(_grad(objective, ones, t([0.0, 2.0]))[1], 2 * g[1])


def _a(k):
    """Hand values of the issue's example: one group of four with 1 success, population
    std √3/4, so |A| = 0.75/(√3/4 + ε) for the success and 0.25/(√3/4 + ε) for a failure."""
    return k / (math.sqrt(3) / 4 + 1e-6)


@pytest.mark.parametrize("objective", ["grpo", "dr_grpo", "dapo", "gspo"])
def test_weights_multiply_inside_the_admission_normaliser(objective):
    """B = 4 groups of G = 4, only group 0 informative (1 success), all kept,
    `per_advantage` (α = 0.5) weights. Weights mean 1 over the 16 rollouts, so the weighted
    gradient is Σ w|A| / Σ|A| = 16·Σ|A|^1.5 / (Σ|A|^0.5 · Σ|A|) = 16/(2√3) = 8/√3 ≈ 4.62× the
    unweighted one (DataFlex-RL's token-mean semantics). Counting only weight > 0 in the
    normaliser (4 rollouts instead of 16) gave 4× more: 32/√3 ≈ 18.5×."""
    from rlpace import Feedback, Pool
    from rlpace.policies import per_advantage
    from rlpace.types import Batch
    rewards = np.zeros((4, 4))
    rewards[0, 0] = 1.0
    rewards[3] = 1.0                                   # an all-correct group: A = 0 too
    a_s, a_f = _a(0.75), _a(0.25)
    m = (a_s ** 0.5 + 3 * a_f ** 0.5) / 16             # mean of |A|^0.5 over the 16 rollouts
    w_hand = np.zeros((4, 4))
    w_hand[0] = [a_s ** 0.5 / m] + [a_f ** 0.5 / m] * 3
    pool = Pool([0] * 4)
    p = per_advantage()
    w = p.apply(p.init(pool), pool, Batch.from_feedback(Feedback(np.arange(4), rewards, step=0), pool, 0.5))
    np.testing.assert_allclose(w, w_hand, rtol=1e-12)
    adv = t(np.where(rewards[0] > 0, a_s, -a_f).tolist() + [0.0] * 12)
    mask, lp = torch.ones(16, 2), torch.full((16, 2), -0.7)
    keep = torch.ones(16)
    weighted = _grad(objective, keep, t(w.ravel().tolist()), adv=adv, mask=mask, lp=lp).abs().sum().item()
    plain = _grad(objective, keep, None, adv=adv, mask=mask, lp=lp).abs().sum().item()
    assert weighted / plain == pytest.approx(8 / math.sqrt(3), rel=1e-5)      # 4.6188…, not 18.475


def test_token_weights_by_hand():
    # row 0: tokens weighted 2, 0, 1 ; row 1: 1, 3 (padding weight ignored)
    w = t([[2.0, 0.0, 1.0], [1.0, 3.0, 9.0]])
    ones = torch.ones(2)
    g = grpo_loss(LOGP, OLD, ADV, MASK, ones, w).loss.item()
    assert g == pytest.approx(-((2 * 1.2 + 0 + 1.1) / 3 + (-0.8 - 3.0) / 2) / 2, abs=1e-6)
    d = dapo_loss(LOGP, OLD, ADV, MASK, ones, w).loss.item()
    assert d == pytest.approx(-(2 * 1.28 + 1.1 - 0.8 - 3.0) / 5, abs=1e-6)
    dr = dr_grpo_loss(LOGP, OLD, ADV, MASK, ones, w, max_tokens=4).loss.item()
    assert dr == pytest.approx(-(2 * 1.2 + 1.1 - 0.8 - 3.0) / (2 * 4), abs=1e-6)
    # GSPO: a per-token weight enters as its mean over the rollout's tokens: 1 and 2
    lp = torch.log(t([[1.0002, 1.0002, 1.0002], [0.999, 0.999, 5.0]]))
    gs = gspo_loss(lp, OLD, ADV, MASK, ones, w).loss.item()
    assert gs == pytest.approx(-(1.0 * 1.0002 + 2.0 * (1 - 3e-4) * -1) / 2, abs=1e-6)


def test_keep_must_be_an_admission_mask():
    with pytest.raises(ValueError, match="keep must be float\\[N\\] of 0/1"):
        policy_loss("grpo", LOGP, OLD, ADV, MASK, t([0.5, 1.0]))
    with pytest.raises(ValueError, match="weight must be float\\[N\\]"):
        policy_loss("grpo", LOGP, OLD, ADV, MASK, torch.ones(2), torch.ones(3))


def test_advantages_on_the_kept_subset_by_hand():
    r = t([[1, 1, 0, 0], [1, 0, 0, 0]])
    keep = torch.tensor([[True, False, True, True], [True, True, True, True]])
    # row 0 kept rewards {1, 0, 0}: mean 1/3, population std √2/3
    s = math.sqrt(2) / 3
    a = advantages(r, "grpo", keep)
    assert a[0].tolist() == pytest.approx([(2 / 3) / (s + 1e-6), 0.0, (-1 / 3) / (s + 1e-6), (-1 / 3) / (s + 1e-6)],
                                          abs=1e-6)
    assert a[1].tolist() == pytest.approx([0.75 / (math.sqrt(3) / 4 + 1e-6)] + [-0.25 / (math.sqrt(3) / 4 + 1e-6)] * 3,
                                          abs=1e-5)
    # Dr. GRPO: centred on the kept mean, no std
    assert advantages(r, "dr_grpo", keep)[0].tolist() == pytest.approx([2 / 3, 0.0, -1 / 3, -1 / 3], abs=1e-6)


@pytest.mark.parametrize("objective", ["grpo", "dr_grpo", "dapo", "gspo"])
def test_micro_batches_reproduce_the_full_batch(objective):
    g = torch.Generator().manual_seed(1)
    logp, old = -torch.rand(8, 4, generator=g), -torch.rand(8, 4, generator=g)
    mask = (torch.rand(8, 4, generator=g) > 0.3).float()
    mask[:, 0] = 1
    adv = torch.randn(8, generator=g)
    keep = t([1, 1, 0, 1, 1, 1, 1, 0])
    for w in (t([1, 1, 0, 1, 0.5, 0, 1, 0]), torch.rand(8, 4, generator=g) * 2):   # per rollout, per token
        full = policy_loss(objective, logp, old, adv, mask, keep, w, max_tokens=4).loss.item()
        parts = [slice(0, 3), slice(3, 8)]
        units = [aggregation_units(objective, mask[p], keep[p]) for p in parts]
        mixed = sum(policy_loss(objective, logp[p], old[p], adv[p], mask[p], keep[p], w[p],
                                max_tokens=4).loss.item() * u for p, u in zip(parts, units)) / sum(units)
        assert mixed == pytest.approx(full, abs=1e-6)


def test_kl_k3_by_hand():
    logp = t([[0.0, -1.0]])
    ref = t([[math.log(0.5), -1.0]])
    d = math.log(0.5)
    assert kl_k3(logp, ref, torch.ones(1, 2), torch.ones(1)).item() == pytest.approx((0.5 - d - 1) / 2, abs=1e-6)


def test_unknown_objective_is_rejected():
    with pytest.raises(ValueError, match="objective"):
        policy_loss("ppo2", LOGP, OLD, ADV, MASK, torch.ones(2))
