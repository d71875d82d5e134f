"""Thin admission in RlpaceGRPOTrainer on 2 CPU processes (`torchrun --nproc_per_node 2`, gloo).

An admission policy with a hand mask drops rollout g = (pool position mod 5) of each group of
G = 4 (position 4 keeps its whole group): every other group keeps 3 of its 4 rollouts. Each rank
holds 2 of the generation batch's B = 4 groups. Checked on each rank: a dropped row's completion
mask is all zero and its advantage 0; a kept row of a thinned group trains on the GRPO advantage
of its group's kept rewards (PODS); a group kept whole keeps TRL's advantage; the loss's token
count is the sum over both ranks' masks; both Scheduler copies end bit-identical. About two
minutes on 2 cores.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

pytest.importorskip("trl")

from _isolated import DDP_WORKER_HEAD  # noqa: E402

pytestmark = [pytest.mark.slow]
G, STEPS, LOCAL = 4, 4, 8

WORKER = DDP_WORKER_HEAD + textwrap.dedent('''
    from _isolated import run_ddp_probe
    from rlpace.policies._base import ADMISSION, Admission, DataPolicy, EmptyState
    G = 4
    thin = DataPolicy(ADMISSION, lambda p: EmptyState(), lambda s, p, b: s,
                      lambda s, p, b: Admission(np.arange(b.rewards.shape[1])[None, :] != (b.prompt_ids % 5)[:, None], 0),
                      name="test_thin")
    sched = Scheduler(pool_from_dataset(ds), compose(make_policy("uniform"), thin), seed=3)
    mask, items = [], []

    def reward(prompts, completions, index, trainer_state, **kw):
        # each group of G = 4 local rows holds two 1s and two 0s
        return [float((j + i + trainer_state.global_step) % 4 < 2) for j, i in enumerate(index)]

    def record(o):
        mask.append(o["completion_mask"].sum(-1).cpu().numpy())         # tokens per row in the loss
        items.append(float(o["num_items_in_batch"]))
    index, rewards, adv, t = run_ddp_probe(lm, out, ds, sched, reward, group=G, max_steps=4, extra=record)
    np.savez(os.path.join(out, f"rank{rank}.npz"), index=np.array(index), rewards=np.stack(rewards),
             adv=np.stack(adv), mask=np.stack(mask), items=np.array(items), world=world, **sched.state_dict())
''')


def test_each_rank_trains_its_rows_hand_mask_and_the_copies_agree(tmp_path):
    from _isolated import run_two_rank_probe
    r0, r1 = run_two_rank_probe(WORKER, tmp_path, port=29562, timeout=400)
    assert r0["index"].shape == r1["index"].shape == (STEPS, LOCAL)         # 2 groups of G = 4 per rank
    thinned = whole = 0
    for t in range(STEPS):
        pos = np.concatenate([r0["index"][t], r1["index"][t]]).reshape(-1, G)[:, 0] - 1000   # [B]
        r = r0["rewards"][t].reshape(-1, G)                                 # [B, G], process-major
        keep = np.arange(G)[None, :] != (pos % 5)[:, None]                  # the hand mask
        want = np.zeros_like(r)
        for b in range(len(r)):
            x = r[b, keep[b]]
            if keep[b].all():                                               # TRL's own advantage
                want[b] = (x - x.mean()) / (x.std(ddof=1) + 1e-4)
                whole += 1
            else:                                                           # PODS: the kept rewards' GRPO advantage
                want[b, keep[b]] = (x - x.mean()) / (x.std() + 1e-6)
                thinned += 1
                assert np.abs(want[b, keep[b]]).min() > 0.5
        for rank, got in enumerate((r0, r1)):
            rows = slice(rank * LOCAL, (rank + 1) * LOCAL)
            kept = keep.ravel()[rows]
            assert (got["mask"][t][~kept] == 0).all() and (got["mask"][t][kept] > 0).all(), f"step {t} rank {rank}"
            np.testing.assert_allclose(got["adv"][t], want.ravel()[rows], rtol=1e-5, atol=1e-6,
                                       err_msg=f"step {t} rank {rank}")
        assert r0["items"][t] == r1["items"][t] == r0["mask"][t].sum() + r1["mask"][t].sum()
    assert thinned >= 4 and whole >= 1
    state_keys = [k for k in r0.files if k not in ("index", "rewards", "adv", "mask", "items", "world")]
    assert int(r0["history/attempts"].sum()) == STEPS * 4 * G
    for k in state_keys:
        np.testing.assert_array_equal(r0[k], r1[k], err_msg=k)
