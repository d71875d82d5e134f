"""Rollout allocation in RlpaceGRPOTrainer on 2 CPU processes (`torchrun --nproc_per_node 2`,
gloo).

Every rank's sampler replica proposes and allocates (`knapsack`, min_n = 1, so prompts get
0, 1 or several copies of G); the generation batch of B = 4 group slots is split 2 + 2 over
the ranks, so a prompt's copies may straddle them. Checked: both ranks decide the same
allocations and end with bit-identical Scheduler states, each rank's slice has the same length,
the gathered rows are the allocation's copies, and every row's advantage (each rank computes
its own slice) equals TRL's formula over all the k·G rewards of its prompt, computed here in
numpy from the gathered rewards; the pilot record is written once, by the main process. About
two and a half minutes on 2 cores.
"""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest

pytest.importorskip("trl")

from _isolated import DDP_WORKER_HEAD  # noqa: E402

pytestmark = [pytest.mark.slow]
G, B, STEPS = 2, 4, 8

WORKER = DDP_WORKER_HEAD + textwrap.dedent('''
    from _isolated import run_ddp_probe
    G = 2
    sched = Scheduler(pool_from_dataset(ds), "knapsack", min_n=1, max_n=8, min_count=2, seed=5)
    allocations = []
    allocate = sched.allocate
    sched.allocate = lambda ids, budget, unit=1: allocations.append(
        np.stack([ids, allocate(ids, budget, unit=unit)])) or allocations[-1][1]

    def reward(prompts, completions, index, trainer_state, **kw):
        # by (prompt, row of the whole generation batch, step): p̂ = 0 for 1000/1004, 1 for 1001/1005
        n = len(index)
        r = []
        for j, i in enumerate(index):
            row = rank * n + j
            r.append({0: 0.0, 1: 1.0}.get(i % 4, float((i * 7 + row * 3 + trainer_state.global_step) % 5 < 2)))
        return r

    index, rewards, adv, t = run_ddp_probe(lm, out, ds, sched, reward, group=G, max_steps=8,
                                           record=os.path.join(out, "pilot.jsonl"))
    np.savez(os.path.join(out, f"rank{rank}.npz"), allocations=np.stack(allocations), index=np.array(index),
             rewards=np.stack(rewards), adv=np.stack(adv), world=world, total=t.rlpace_rollouts_total,
             **sched.state_dict())
''')


def test_two_ranks_allocate_alike_and_train_merged_groups(tmp_path):
    from _isolated import run_two_rank_probe
    r0, r1 = run_two_rank_probe(WORKER, tmp_path, port=29553, timeout=400)
    np.testing.assert_array_equal(r0["allocations"], r1["allocations"])     # decided alike on every rank
    assert r0["index"].shape == r1["index"].shape == (STEPS, B * G // 2)    # equal slices: 2 group slots each
    assert int(r0["total"]) == int(r1["total"]) == STEPS * B * G
    ids = np.arange(1000, 1008)
    copies_seen, straddled = set(), 0
    for t in range(STEPS):
        pos, n = r0["allocations"][t]
        assert n.sum() == B * G and (n % G == 0).all()
        rows = np.repeat(ids[pos], n)                                       # every rollout's prompt, in order
        assert np.concatenate([r0["index"][t], r1["index"][t]]).tolist() == rows.tolist()
        adv = np.concatenate([r0["adv"][t], r1["adv"][t]])
        r = r0["rewards"][t]
        start = np.cumsum(n) - n
        for a, k in zip(start, n):
            if k == 0:
                continue
            x = r[a:a + k]
            want = (x - x.mean()) / (x.std(ddof=1) + 1e-4)                  # TRL's formula over the k·G rewards
            np.testing.assert_allclose(adv[a:a + k], want, rtol=1e-5, atol=1e-6)
            straddled += a < B * G // 2 < a + k
        copies_seen |= set((n // G).tolist())
    assert {0, 1}.issubset(copies_seen) and max(copies_seen) >= 2
    # the pilot record: written once (the main process), each generated group of G a row
    lines = [json.loads(x) for x in (tmp_path / "pilot.jsonl").read_text().splitlines()[1:]]
    assert len(lines) == STEPS
    for t, line in enumerate(lines):
        pos, n = r0["allocations"][t]
        assert line["prompt_ids"] == np.repeat(ids[pos], n // G).tolist()
        assert line["rewards"] == r0["rewards"][t].reshape(B, G).tolist() and line["rollouts"] == B * G
    assert straddled >= 1                                                   # a merged group across the ranks
    state_keys = [k for k in r0.files if k not in ("allocations", "index", "rewards", "adv", "world", "total")]
    assert int(r0["history/attempts"].sum()) == STEPS * B * G
    for k in state_keys:
        np.testing.assert_array_equal(r0[k], r1[k], err_msg=k)
