"""Rollout allocation in the built-in trainer (`policy=...+knapsack`, `rollout_budget=W`): each
step's W rollouts split by `Scheduler.allocate`, N_i generated for prompt i, ragged groups
observed, per-prompt advantages over the prompt's own N_i, every rollout counted (refills and
the pilot record too), exact resume, bad input refused before any work. Torch runs one thread."""

import json
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from _tiny_train import read_log, tiny_config  # noqa: E402
from rlpace.errors import InputError  # noqa: E402
from rlpace.train import check_config, from_overrides, train  # noqa: E402
from rlpace.train.recipes import grpo  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture
def alloc_module(tmp_path, monkeypatch):
    """A user allocation policy with a fixed split (what `policy=pkg.module:factory` names)."""
    (tmp_path / "myalloc.py").write_text(textwrap.dedent("""
        import numpy as np
        from rlpace.policies import DataPolicy, policy_factory
        from rlpace.policies._base import _empty_init, _no_update

        @policy_factory
        def fixed_split():
            # (0, 1, 3, 4) of a budget of 8 for four prompts; an even split otherwise
            def apply(state, pool, ids, budget):
                if len(ids) == 4 and budget == 8:
                    return np.array([0, 1, 3, 4], dtype=np.int64)
                n = np.full(len(ids), budget // max(1, len(ids)), dtype=np.int64)
                n[: budget - int(n.sum())] += 1
                return n
            return DataPolicy("allocation", _empty_init, _no_update, apply, name="fixed_split", bounds=(0, 8))
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "myalloc:fixed_split"


def _grpo_advantages_loop(rewards, sizes, eps=1e-6):
    """Per-rollout GRPO advantages of ragged groups by a plain loop: population mean and std
    over each group's own N_i rollouts; N_i ≤ 1 or equal rewards give 0."""
    out = []
    for row, n in zip(rewards, sizes):
        r = [float(x) for x in row[:n]]
        if n == 0:
            continue
        mean = sum(r) / n
        std = (sum((x - mean) ** 2 for x in r) / n) ** 0.5
        out += [0.0 if std == 0 else (x - mean) / (std + eps) for x in r]
    return np.array(out)


def test_a_hand_set_split_trains_each_prompt_on_its_own_group(tmp_path, cache, alloc_module, monkeypatch):
    """N = (0, 1, 3, 4): 8 rollouts generated, the N = 0 prompt skipped, the singleton's advantage
    0, every other advantage the GRPO value over its own group (independent loop)."""
    seen, observed = [], []
    real_update, real_observe = grpo._update, grpo.Scheduler.observe

    def spy_update(model, ref, opt, tok, sched, cfg, step, batch, *a, **k):
        seen.append(batch)
        return real_update(model, ref, opt, tok, sched, cfg, step, batch, *a, **k)

    losses = []
    real_loss = grpo.policy_loss

    def spy_loss(objective, logp, old, adv, *a, **k):
        losses.append(adv.detach().cpu().numpy().copy())
        return real_loss(objective, logp, old, adv, *a, **k)

    def spy_observe(self, fb):
        observed.append(fb)
        return real_observe(self, fb)

    monkeypatch.setattr(grpo, "_update", spy_update)
    monkeypatch.setattr(grpo, "policy_loss", spy_loss)
    monkeypatch.setattr(grpo.Scheduler, "observe", spy_observe)
    cfg = tiny_config(tmp_path / "run", cache, policy=alloc_module, rollout_budget=8, steps=6,
                      max_refill_rounds=0)
    train(cfg)
    recs = [r for r in read_log(cfg.out) if not r.get("final")]
    assert [r["group_sizes"] for r in recs] == [[0, 1, 3, 4]] * 6
    assert [r["rollouts"] for r in recs] == [8] * 6 and recs[-1]["rollouts_total"] == 48
    informative = 0
    for step, (batch, adv) in enumerate(zip(seen, losses)):
        # the prompt with no rollouts is not trained; the others in proposal order with N_i rollouts
        assert batch.sizes.tolist() == [1, 3, 4] and len(batch.completions) == 8
        assert batch.ids.tolist() == recs[step]["prompt_ids"][1:]
        want = _grpo_advantages_loop(batch.rewards, batch.sizes)
        np.testing.assert_allclose(adv, want, rtol=0, atol=1e-6)
        assert adv[0] == 0.0                                     # N_i = 1: no relative signal
        fb = observed[step]                                      # what the Scheduler saw: ragged
        assert fb.group_sizes.tolist() == [0, 1, 3, 4] and fb.rewards.shape == (4, 4)
        np.testing.assert_allclose(fb.rewards[1:][np.arange(4) < np.array([1, 3, 4])[:, None]],
                                   np.concatenate([batch.rewards[i, :n] for i, n in enumerate([1, 3, 4])]))
        groups = [batch.rewards[i, :n] for i, n in enumerate([1, 3, 4])]
        share = sum(len(set(g.tolist())) > 1 for g in groups) / 4          # of the 4 proposed prompts
        assert recs[step]["informative_groups"] == pytest.approx(share)
        informative += share > 0
    assert informative >= 1                # some step had a non-constant group: the check above bit


def test_budget_is_spent_exactly_every_step_and_the_record_counts_it(tmp_path, cache):
    """oracle_allocation (Knapsack RL's DP on measured pass rates) splits W = 18 unevenly:
    Σ N_i = 18 each step, bounds held, rollouts_total = Σ, the pilot record sums to it and
    holds each prompt's N_i rewards."""
    pilot = tmp_path / "pilot.jsonl"
    cfg = tiny_config(tmp_path / "run", cache, policy="oracle_allocation", rollout_budget=18, steps=4,
                      oracle_every=1, oracle_rollouts=4, policy_kwargs='{"min_n": 2, "max_n": 10}',
                      record=str(pilot))
    summary = train(cfg)
    recs = [r for r in read_log(cfg.out) if not r.get("final")]
    sizes = [r["group_sizes"] for r in recs]
    assert all(sum(n) == 18 and len(n) == 4 and min(n) >= 2 and max(n) <= 10 for n in sizes)
    assert any(len(set(n)) > 1 for n in sizes)                  # really ragged
    assert [r["rollouts"] for r in recs] == [18] * 4
    assert [r["rollouts_total"] for r in recs] == [18, 36, 54, 72] and summary["rollouts_total"] == 72
    lines = [json.loads(x) for x in pilot.read_text().splitlines()[1:]]
    batches = [ln for ln in lines if "rewards" in ln]
    assert sum(ln["rollouts"] for ln in batches) == 72
    assert [[len(row) for row in ln["rewards"]] for ln in batches] == sizes


def test_refill_rounds_are_allocated_too(tmp_path, cache):
    """knapsack + DAPO dynamic sampling: a refill round of R prompts gets R·W // B rollouts, split
    by the allocation; every round is counted in rollouts, rollouts_total and the record."""
    pilot = tmp_path / "pilot.jsonl"
    cfg = tiny_config(tmp_path / "run", cache, policy="knapsack+dapo_dynamic_sampling", rollout_budget=18,
                      steps=4, max_refill_rounds=2, policy_kwargs='{"min_count": 2, "max_n": 10}',
                      record=str(pilot))
    train(cfg)
    recs = [r for r in read_log(cfg.out) if not r.get("final")]
    lines = [json.loads(x) for x in pilot.read_text().splitlines()[1:] if "rewards" in x]
    assert any(r["refill_rounds"] > 0 for r in recs)
    total = 0
    for r in recs:
        rounds = [ln for ln in lines if ln["step"] == r["step"]]
        assert len(rounds) == r["refill_rounds"] + 1
        per_round = [sum(len(row) for row in ln["rewards"]) for ln in rounds]
        assert per_round == [len(ln["prompt_ids"]) * 18 // 4 for ln in rounds]       # 18, then R·18 // 4
        assert sum(r["group_sizes"]) == sum(per_round) == r["rollouts"]
        assert [ln["rollouts"] for ln in rounds] == per_round
        total += r["rollouts"]
        assert r["rollouts_total"] == total


def test_resume_with_allocation_in_the_state_is_exact(tmp_path, cache):
    """4 steps straight equal 2 steps + resume for 2 (knapsack's p̂ state in the checkpoint):
    same group sizes, rewards, losses, evaluations; same final weights."""
    kw = dict(policy="recommended+knapsack", rollout_budget=18, steps=4, checkpoint_every=2,
              policy_kwargs='{"min_count": 2, "max_n": 10}')
    straight = tiny_config(tmp_path / "a", cache, **kw)
    train(straight)
    part = tiny_config(tmp_path / "b", cache, **{**kw, "steps": 2})
    train(part)
    train(tiny_config(tmp_path / "b", cache, **{**kw, "resume": True}))
    drop = ("seconds", "seconds_total", "train_seconds")
    a = [{k: v for k, v in r.items() if k not in drop} for r in read_log(straight.out)]
    b = [{k: v for k, v in r.items() if k not in drop} for r in read_log(tmp_path / "b")]
    assert a == b
    assert any(len(set(r.get("group_sizes", [0]))) > 1 for r in a)   # the allocation acted
    sa, sb = (torch.load(tmp_path / d / "checkpoint" / "model.pt", weights_only=True) for d in "ab")
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    za, zb = (np.load(tmp_path / d / "checkpoint" / "scheduler.npz", allow_pickle=True) for d in "ab")
    assert set(za.files) == set(zb.files) and all(np.array_equal(za[k], zb[k]) for k in za.files)


def test_micro_batches_of_ragged_groups_give_the_one_forward_step(tmp_path, cache, alloc_module):
    """Chunks of whole ragged groups, each weighted by its share of the batch's units, reproduce
    the one-forward loss: same loss and same evaluation after each step."""
    kw = dict(policy=alloc_module, rollout_budget=8, steps=2, temperature=2.0, max_refill_rounds=0)
    one = tiny_config(tmp_path / "one", cache, **kw)
    train(one)
    mb = tiny_config(tmp_path / "mb", cache, micro_batch=4, **kw)
    train(mb)
    a, b = read_log(one.out), read_log(mb.out)
    for ra, rb in zip(a, b):
        for key in ("loss", "pg_loss"):
            if key in ra:
                assert rb[key] == pytest.approx(ra[key], abs=1e-6)
        assert ra.get("eval/mean") == rb.get("eval/mean")


def test_chunks_hold_whole_groups_and_share_a_prompt_only_when_sizes_agree():
    assert grpo._chunks(np.array([4, 4, 4, 4]), 8) == ([slice(0, 8), slice(8, 16)], [4, 4])
    assert grpo._chunks(np.array([4, 4, 4, 4]), 16) == ([slice(0, 16)], [4])
    assert grpo._chunks(np.array([1, 3, 4]), 8) == ([slice(0, 8)], [1])
    assert grpo._chunks(np.array([1, 3, 4, 2]), 4) == ([slice(0, 4), slice(4, 8), slice(8, 10)], [1, 4, 2])


def test_bad_budgets_and_combinations_are_refused_before_any_work(tmp_path, cache):
    base = dict(steps=1)
    # below B·min_n: knapsack gives each of the 4 prompts at least 2
    with pytest.raises(InputError, match=r"rollout_budget=7 must lie in .*\[4·2, 4·128\]"):
        train(tiny_config(tmp_path / "r1", cache, policy="knapsack", rollout_budget=7, **base))
    with pytest.raises(InputError, match=r"rollout_budget=41 must lie in .*\[4·2, 4·10\]"):
        train(tiny_config(tmp_path / "r2", cache, policy="knapsack", rollout_budget=41,
                          policy_kwargs='{"max_n": 10}', **base))
    with pytest.raises(InputError, match="rollout_budget must be a whole number"):
        check_config(tiny_config(tmp_path / "r3", cache, policy="knapsack", rollout_budget=17.5))
    with pytest.raises(InputError, match="rollout_budget must be a whole number"):
        check_config(tiny_config(tmp_path / "r3", cache, policy="knapsack", rollout_budget=-1))
    with pytest.raises(InputError, match="rollout_budget='17.5' is not a valid int"):
        from_overrides(["rollout_budget=17.5"])
    with pytest.raises(InputError, match="cannot combine with label_noise"):
        train(tiny_config(tmp_path / "r4", cache, policy="knapsack", label_noise=0.25, **base))
    with pytest.raises(InputError, match="cannot combine with label_noise > 0 or a target"):
        train(tiny_config(tmp_path / "r6", cache, policy="ttrl+knapsack", **base))
    with pytest.raises(InputError, match="cannot combine with gradient features"):
        train(tiny_config(tmp_path / "r5", cache, policy="knapsack", grad_features="on", **base))
    with pytest.raises(InputError, match=r"cannot combine with tasks=generated: / grid:"):
        train(tiny_config(tmp_path / "r7", cache, policy="knapsack", tasks="generated:max", **base))
    for d in ("r1", "r2", "r4", "r5", "r6", "r7"):
        assert not (tmp_path / d).exists()                     # refused before any work


def test_informative_share_and_reward_mean_read_only_the_generated_rollouts():
    """A ragged round: padding (9s here) never enters the informative share or the rewards."""
    from types import SimpleNamespace
    grp = SimpleNamespace(ids=np.arange(4), rewards=np.array([[1.0, 0.0, 9.0], [1.0, 9.0, 9.0], [9.0, 9.0, 9.0],
                                                              [1.0, 1.0, 1.0]]), sizes=np.array([2, 1, 0, 3]))
    from rlpace.types import group_advantages, informative_groups
    # the trainer logs the record's rule over the round's Feedback advantages (padding A = 0)
    share = informative_groups(group_advantages(grp.rewards, group_sizes=grp.sizes)).mean()
    assert share == 0.25                                        # only [1, 0] differs; N = 1 and N = 0 cannot
    assert grpo._rollout_rewards(grp).tolist() == [1.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    flat = SimpleNamespace(ids=np.arange(2), rewards=np.array([[1.0, 0.0], [1.0, 1.0]]), sizes=None)
    assert informative_groups(group_advantages(flat.rewards)).mean() == 0.5
    assert grpo._rollout_rewards(flat).tolist() == [1.0, 0.0, 1.0, 1.0]
    assert not hasattr(grpo, "_informative")                    # one rule: the record's


def test_informative_groups_is_batch_informative_with_its_threshold():
    """`informative_groups` is `Batch.informative`'s rule: some |A| > 1e-12. Group-normalised
    rewards that differ by 1e-20 give |A| = 5e-21 / (5e-21 + 1e-6) ≈ 5e-15: not informative,
    where "rewards not all equal" (the trainer's earlier rule) said informative."""
    from rlpace import Feedback, Pool
    from rlpace.types import Batch, group_advantages, informative_groups
    r = np.array([[0.0, 1e-20, 0.0, 0.0], [1.0, 0.0, 1.0, 1.0], [0.5, 0.5, 0.5, 0.5], [0.3, 0.7, 0.7, 0.7]])
    adv = group_advantages(r)
    assert np.abs(adv[0]).max() < 1e-12 and np.abs(adv[3]).max() > 0.5
    assert informative_groups(adv).tolist() == [False, True, False, True]
    fb = Feedback(np.arange(4), r, adv, 0)
    batch = Batch.from_feedback(fb, Pool(np.zeros(4, np.int64)), 0.5)
    assert batch.informative.tolist() == [False, True, False, True]
