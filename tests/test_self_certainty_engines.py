"""Where self-certainty comes from in each engine (docs/methods/self_certainty.md, "Where the
statistic comes from"): TRL's extra forward reduces the logits with `token_stats` (the page's
hand-computed example); verl's adapter refuses a method that reads it, before training."""

import math

import pytest

from rlpace import Pool, Scheduler

torch = pytest.importorskip("torch")


def test_token_stats_gives_the_pages_example_masked_and_temperature_scaled():
    from rlpace.adapters._supervision import token_stats
    # one token with p = (1/4, 1/4, 1/2): SC = logsumexp(z) − mean(z) − log 3 = ln(32/27)/3
    z = torch.log(torch.tensor([[[0.25, 0.25, 0.5], [5.0, 0.0, 0.0]]], dtype=torch.float64))
    z[0, 1] = torch.tensor([9.0, -3.0, 1.0])                      # masked out: must not count
    out = token_stats(z, torch.tensor([[1, 0]]))
    assert out["self_certainty"][0] == pytest.approx(math.log(32 / 27) / 3, rel=1e-12)
    assert math.log(32 / 27) / 3 == pytest.approx(0.0566, abs=5e-5)
    # the sampling temperature divides the logits first: z = 2·log p at T = 2 is p again
    out2 = token_stats(2 * z, torch.tensor([[1, 0]]), temperature=2.0)
    assert out2["self_certainty"][0] == pytest.approx(math.log(32 / 27) / 3, rel=1e-12)


def test_verl_adapter_refuses_self_certainty_and_accepts_entropy_min():
    from rlpace.adapters._verl_supervision import check_token_signals
    pool = Pool(["a", "b"])
    with pytest.raises(ValueError, match="self-certainty, which needs the full logits"):
        check_token_signals(Scheduler(pool, "self_certainty"))
    check_token_signals(Scheduler(pool, "entropy_min"))          # token entropy: verl gives it
