"""Loss weights in RlpaceGRPOTrainer on 2 CPU processes (`torchrun --nproc_per_node 2`, gloo).

A reweighting policy with hand-known weights, w = 1 + 0.5·g + 0.25·(pool position mod 4) for
rollout g, and `loss_weights=True`: each rank multiplies the advantages of its own rows (the
r-th half of every generation batch of B = 4 prompts × G = 2) by their weights. Checked: every
rank's advantages equal TRL's group formula over the gathered rewards times the hand weight of
that rank's rows, and both Scheduler copies end bit-identical. About two minutes on 2 cores.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

pytest.importorskip("trl")

from _isolated import DDP_WORKER_HEAD  # noqa: E402

pytestmark = [pytest.mark.slow]
G, STEPS = 2, 4

WORKER = DDP_WORKER_HEAD + textwrap.dedent('''
    from _isolated import run_ddp_probe
    from rlpace.policies._base import REWEIGHTING, DataPolicy, EmptyState
    G = 2
    # loss weight 1 + 0.5·g + 0.25·(pool position mod 4) for rollout g
    reweight = DataPolicy(REWEIGHTING, lambda p: EmptyState(), lambda s, p, b: s,
                          lambda s, p, b: 1.0 + 0.5 * np.arange(b.rewards.shape[1])[None, :]
                          + 0.25 * (b.prompt_ids % 4)[:, None], name="test_weights")
    sched = Scheduler(pool_from_dataset(ds), compose(make_policy("uniform"), reweight), seed=3)

    def reward(prompts, completions, index, trainer_state, **kw):
        # every group of G = 2 local rows is [1, 0] or [0, 1]: each row has a nonzero advantage
        return [float((j + i + trainer_state.global_step) % 2 == 0) for j, i in enumerate(index)]

    index, rewards, adv, t = run_ddp_probe(lm, out, ds, sched, reward, group=G, max_steps=4, loss_weights=True)
    np.savez(os.path.join(out, f"rank{rank}.npz"), index=np.array(index), rewards=np.stack(rewards),
             adv=np.stack(adv), world=world, **sched.state_dict())
''')


def test_each_rank_trains_on_its_rows_hand_weights_and_the_copies_agree(tmp_path):
    from _isolated import run_two_rank_probe
    r0, r1 = run_two_rank_probe(WORKER, tmp_path, port=29561, timeout=400)
    assert r0["index"].shape == r1["index"].shape == (STEPS, 4)             # 2 groups of G = 2 per rank
    weights_seen = set()
    for t in range(STEPS):
        r = r0["rewards"][t].reshape(-1, G)                                 # [B, G], process-major
        trl = (r - r.mean(axis=1, keepdims=True)) / (r.std(axis=1, ddof=1, keepdims=True) + 1e-4)
        assert (np.abs(trl) > 0.5).all()                                    # every row carries a gradient
        for rank, got in enumerate((r0, r1)):
            pos = got["index"][t] - 1000                                    # this rank's rows' pool positions
            g = np.arange(4) % G
            w = 1.0 + 0.5 * g + 0.25 * (pos % 4)
            want = trl.ravel()[rank * 4:(rank + 1) * 4] * w
            np.testing.assert_allclose(got["adv"][t], want, rtol=1e-5, atol=1e-6, err_msg=f"step {t} rank {rank}")
            weights_seen |= set(w.tolist())
    assert len(weights_seen) >= 4                                           # the weights differ across rows
    state_keys = [k for k in r0.files if k not in ("index", "rewards", "adv", "world")]
    assert int(r0["history/attempts"].sum()) == STEPS * 4 * G
    for k in state_keys:
        np.testing.assert_array_equal(r0[k], r1[k], err_msg=k)
