"""The policy-gradient objectives against values computed by hand (and a reference loop)."""

import math

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
    ref, kept = 0.0, 0
    for i in range(n):
        terms = []
        for j in range(lens[i]):
            r, a = math.exp(float(logp[i, j] - old[i, j])), float(adv[i])
            terms.append(min(r * a, min(max(r, 0.8), 1.2) * a))
        ref += float(w[i]) * sum(terms) / lens[i]
        kept += int(w[i] > 0)
    got = grpo_loss(logp, old, adv, mask, w).loss.item()
    assert got == pytest.approx(-ref / kept, abs=1e-5)


@pytest.mark.parametrize("objective", ["grpo", "dr_grpo", "dapo", "gspo"])
def test_zero_weight_removes_a_rollouts_gradient(objective):
    logp = LOGP.clone().requires_grad_(True)
    w = t([0.0, 1.0])
    policy_loss(objective, logp, logp.detach(), ADV, MASK, w, max_tokens=3).loss.backward()
    assert torch.all(logp.grad[0] == 0)
    assert torch.any(logp.grad[1] != 0)
    # and the weight scales it: on-policy the per-token gradient is −w·A / normaliser
    logp2 = LOGP.clone().requires_grad_(True)
    policy_loss(objective, logp2, logp2.detach(), ADV, MASK, t([0.0, 2.0]), max_tokens=3).loss.backward()
    assert torch.allclose(logp2.grad[1], 2 * logp.grad[1])


@pytest.mark.parametrize("objective", ["grpo", "dr_grpo", "dapo", "gspo"])
def test_micro_batches_reproduce_the_full_batch(objective):
    g = torch.Generator().manual_seed(1)
    logp, old = -torch.rand(8, 4, generator=g), -torch.rand(8, 4, generator=g)
    mask = (torch.rand(8, 4, generator=g) > 0.3).float()
    mask[:, 0] = 1
    adv, w = torch.randn(8, generator=g), t([1, 1, 0, 1, 0.5, 1, 1, 0])
    full = policy_loss(objective, logp, old, adv, mask, w, max_tokens=4).loss.item()
    parts = [slice(0, 3), slice(3, 8)]
    units = [aggregation_units(objective, mask[p], w[p]) for p in parts]
    mixed = sum(policy_loss(objective, logp[p], old[p], adv[p], mask[p], w[p], max_tokens=4).loss.item() * u
                for p, u in zip(parts, units)) / sum(units)
    assert mixed == pytest.approx(full, abs=1e-6)


def test_kl_k3_by_hand():
    logp = t([[0.0, -1.0]])
    ref = t([[math.log(0.5), -1.0]])
    d = math.log(0.5)
    assert kl_k3(logp, ref, torch.ones(1, 2), torch.ones(1)).item() == pytest.approx((0.5 - d - 1) / 2, abs=1e-6)


def test_unknown_objective_is_rejected():
    with pytest.raises(ValueError, match="objective"):
        policy_loss("ppo2", LOGP, OLD, ADV, MASK, torch.ones(2))
