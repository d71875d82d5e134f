"""The epiplexity-guided task generator (rlpace.tasks._generator): REINFORCE estimator, entropy
bonus, learning on a synthetic learner with a known optimum, buffer, exact resume."""

import json

import numpy as np
import pytest

from rlpace.tasks._embedded import FAMILIES
from rlpace.tasks._generator import (buffer_push, draw_keys, entropy_gradient, family_configs, fresh_items,
                                     generated_taskset, generator_from_json, generator_init, generator_probs,
                                     generator_sample, generator_to_json, generator_update, reinforce_gradient)


def test_reinforce_estimator_is_unbiased_on_a_toy_with_known_gradient():
    # R(batch) = mean_j r(c_j) + noise, so E[R] = π·r and ∇_φ E[R] = π ⊙ (r − π·r) exactly.
    rng = np.random.default_rng(0)
    logits = np.array([0.3, -0.5, 1.0, 0.0])
    r = np.array([0.1, 0.5, 0.2, 0.9])
    p = np.exp(logits) / np.exp(logits).sum()
    exact = p * (r - p @ r)
    n, samples, baseline = 3, 40000, 0.3                       # any batch-independent baseline
    est = np.empty((samples, 4))
    for s in range(samples):
        c = rng.choice(4, size=n, p=p)
        reward = r[c].mean() + 0.05 * rng.standard_normal()
        est[s] = reinforce_gradient(logits, c, reward - baseline)
    mean, se = est.mean(0), est.std(0) / np.sqrt(samples)
    assert (np.abs(mean - exact) < 4 * se).all(), (mean, exact, se)
    # the estimate is informative: its error is far below the gradient's size
    assert np.abs(mean - exact).max() < 0.1 * np.abs(exact).max()


def test_entropy_gradient_matches_finite_differences():
    logits = np.array([0.2, -1.0, 0.7, 0.0, 2.0])

    def H(z):
        p = np.exp(z - z.max())
        p /= p.sum()
        return -(p * np.log(p)).sum()
    eps = 1e-6
    fd = np.array([(H(logits + eps * e) - H(logits - eps * e)) / (2 * eps) for e in np.eye(5)])
    np.testing.assert_allclose(entropy_gradient(logits), fd, rtol=1e-6, atol=1e-9)


def test_first_update_only_sets_the_baseline_then_follows_the_advantage():
    st = generator_init(3)
    st1 = generator_update(st, np.array([0, 0]), 2.0, entropy_coef=0.0)
    np.testing.assert_array_equal(st1.logits, [0.0, 0.0, 0.0])          # A = 0 on the first reward
    assert float(st1.baseline) == 2.0 and int(st1.updates) == 1
    st2 = generator_update(st1, np.array([0, 0]), 3.0, lr=1.0, entropy_coef=0.0)
    # var = 0 → scale = 0.1·|b| = 0.2, A = clip((3 − 2) / 0.2, ±5) = 5; Σ(e_c − π) = [2 − 2/3, −2/3, −2/3]
    np.testing.assert_allclose(st2.logits, 5 * np.array([4 / 3, -2 / 3, -2 / 3]))
    assert float(st2.baseline) == pytest.approx(0.8 * 2 + 0.2 * 3)
    assert float(st2.reward_var) == pytest.approx(0.2 * 1.0)


def test_a_tiny_reward_difference_gives_a_tiny_move_when_the_variance_is_zero():
    # After one reward the variance EMA is 0. The second reward differs by 1e-4 nats: the
    # scale is max(σ, 0.1·|b|) = max(0, 0.01), so A = 1e-4 / 0.01 = 0.01 (dividing by σ = 1e-8
    # instead saturated A at 5 and moved the logits by 1.1). Σ_j (e_c − π) for [0, 0, 0, 1]
    # under uniform π over 5 = [3, 1, 0, 0, 0] − 4·0.2; the entropy gradient is 0 at uniform.
    st = generator_update(generator_init(5), np.array([0, 1, 2, 3]), 0.1, lr=0.1)
    assert float(st.reward_var) == 0.0
    st = generator_update(st, np.array([0, 0, 0, 1]), 0.1001, lr=0.1)
    step = np.array([2.2, 0.2, -0.8, -0.8, -0.8])
    np.testing.assert_allclose(st.logits, 0.1 * 0.01 * step, rtol=1e-9)
    # a third reward 1e-4 higher: σ² = 0.2·(1e-4)² (σ = 4.47e-5) is still under 0.1·|b|, so
    # A = (0.1002 − b) / (0.1·b) with b = 0.8·0.1 + 0.2·0.1001 = 0.10002
    b, var = 0.10002, 0.2 * 1e-8
    assert float(st.baseline) == pytest.approx(b, rel=1e-12) and float(st.reward_var) == pytest.approx(var, rel=1e-6)
    p = generator_probs(st)
    want = st.logits + 0.1 * ((0.1002 - b) / (0.1 * b) * (np.array([0, 4, 0, 0, 0]) - 4 * p)
                              + 0.01 * entropy_gradient(st.logits))
    st3 = generator_update(st, np.array([1, 1, 1, 1]), 0.1002, lr=0.1)
    np.testing.assert_allclose(st3.logits, want, rtol=1e-9)
    assert np.abs(st3.logits).max() < 0.01


def test_rewards_that_vary_are_standardised_by_sigma_and_all_zero_rewards_give_no_advantage():
    # σ ≥ 0.1·|b|: the floor does not bind; A = (R − b)/σ with hand-computed b, σ²
    st = generator_update(generator_init(2), np.array([0]), 1.0, entropy_coef=0.0)          # b = 1
    st = generator_update(st, np.array([0]), 2.0, lr=0.0, entropy_coef=0.0)                 # A = 5; lr 0
    b, var = 0.8 * 1.0 + 0.2 * 2.0, 0.2 * 1.0 ** 2                                            # 1.2, 0.2
    assert (float(st.baseline), float(st.reward_var)) == pytest.approx((b, var))
    st = generator_update(st, np.array([1]), 1.5, lr=1.0, entropy_coef=0.0)
    a = (1.5 - b) / np.sqrt(var)                                      # 0.6708; 0.1·|b| = 0.12 < σ = 0.447
    np.testing.assert_allclose(st.logits, a * np.array([-0.5, 0.5]), rtol=1e-12)
    # every reward so far exactly 0 (b = 0, σ = 0): no scale, A = 0 (it was ±5 for any R ≠ 0)
    st = generator_update(generator_init(3), np.array([0]), 0.0, entropy_coef=0.0)
    st = generator_update(st, np.array([0, 0]), 1e-4, entropy_coef=0.0)
    np.testing.assert_array_equal(st.logits, np.zeros(3))
    assert float(st.reward_var) == pytest.approx(0.2 * 1e-8)        # the spread is recorded


def test_generator_moves_to_the_parameter_region_of_largest_gain():
    # synthetic learner: training on configuration c lowers the buffer loss by g(c), a bump
    # around c* = 5 (the size just past its competence), plus noise; R = mean over the batch
    rng = np.random.default_rng(1)
    m, c_star = 9, 5
    gain = 0.1 * np.exp(-0.5 * (np.arange(m) - c_star) ** 2)
    st = generator_init(m)
    for step in range(300):
        c = generator_sample(st, 8, np.random.default_rng([0, step]))
        st = generator_update(st, c, gain[c].mean() + 0.01 * rng.standard_normal(), lr=0.1)
    p = generator_probs(st)
    assert int(p.argmax()) == c_star
    assert p[c_star - 1:c_star + 2].sum() > 0.8                  # from 3/9 under the uniform start
    assert (p > 0).all()                                         # the entropy bonus keeps all alive


def test_buffer_is_a_ring_of_the_latest_keys():
    st = generator_init(2, buffer_size=4)
    assert st.buffer.shape == (4, 4) and (st.buffer == -1).all()
    k = lambda *cells: np.array([[c, 7, 0, j] for j, c in enumerate(cells)])      # noqa: E731
    st = buffer_push(st, k(0, 1, 0))
    assert st.buffer[:, 0].tolist() == [0, 1, 0, -1] and st.buffer[:3, 3].tolist() == [0, 1, 2]
    assert int(st.buffer_len) == 3
    st = buffer_push(st, np.array([[1, 8, 1, 0], [0, 8, 1, 1]]))
    assert st.buffer.tolist() == [[0, 8, 1, 1], [1, 7, 0, 1], [0, 7, 0, 2], [1, 8, 1, 0]]
    assert int(st.buffer_len) == 4 and int(st.cursor) == 1


def test_json_round_trip_is_exact_and_validated():
    st = generator_init(4, buffer_size=3)
    rng = np.random.default_rng(2)
    for step in range(5):
        keys = draw_keys(st, 4, np.random.default_rng([1, step]), step=step, round_=0)
        st = buffer_push(generator_update(st, keys[:, 0], float(rng.random())), keys)
    back = generator_from_json(json.loads(json.dumps(generator_to_json(st))), 4, 3)
    for a, b in zip(st, back):
        np.testing.assert_array_equal(a, b)
        assert np.asarray(a).dtype == np.asarray(b).dtype
    nxt = lambda s: generator_update(s, generator_sample(s, 4, np.random.default_rng([1, 9])), 0.7)  # noqa: E731
    np.testing.assert_array_equal(nxt(st).logits, nxt(back).logits)
    good = generator_to_json(st)
    bad_cell = [[4, 0, 0, 0]] * 3                        # cell 4 of 4 cells
    for field, value, match in [("logits", [0.0] * 3, "logits"), ("logits", [np.nan] * 4, "logits"),
                                ("reward_var", -1.0, "reward_var"), ("buffer", bad_cell, "buffer"),
                                ("buffer", [0, 1, 2], "buffer"), ("buffer", [[0, -2, 0, 0]] * 3, "buffer"),
                                ("cursor", 3, "cursor"), ("buffer_len", 9, "buffer_len")]:
        with pytest.raises(ValueError, match=match):
            generator_from_json({**good, field: value}, 4, 3)
    with pytest.raises(ValueError, match="generator"):
        generator_from_json({"logits": [0.0]}, 4, 3)


def test_draw_keys_are_the_generator_draws_with_step_round_and_slot():
    st = generator_init(5)._replace(logits=np.array([0.0, 3.0, 0.0, -2.0, 1.0]))
    keys = draw_keys(st, 6, np.random.default_rng([3, 11, 2, 3]), step=11, round_=2)
    cells = generator_sample(st, 6, np.random.default_rng([3, 11, 2, 3]))          # the same stream
    assert keys.dtype == np.int64 and keys.shape == (6, 4)
    assert keys.tolist() == [[int(c), 11, 2, j] for j, c in enumerate(cells)]


def test_fresh_items_come_from_the_family_generator_at_the_drawn_size():
    names = ("sort2", "sort5")
    keys = np.array([[1, 3, 0, 0], [0, 3, 0, 1], [1, 3, 0, 0], [1, 4, 0, 0]])
    items = fresh_items(names, keys, seed=9)
    # reference: the family's generator called directly on the documented stream
    for it, (c, t, r, j) in zip(items, keys.tolist()):
        size = (2, 5)[c]
        p, a, _ = FAMILIES["sort"][0](np.random.default_rng([9, 7, c, t, r, j]), size)
        assert (it.prompt, it.answer, it.domain, it.difficulty) == (p, a, names[c], float(size))
    assert items[0] == items[2] and items[0].prompt != items[3].prompt    # pure in the key; new step, new item
    assert items[1].answer == "".join(sorted(items[1].prompt[2:-1]))     # a real sort2 item: "s:xy=" → sorted
    # a held-out prompt is redrawn from the same stream: the item is that stream's second draw
    rng = np.random.default_rng([9, 7, 1, 3, 0, 0])
    first, second = FAMILIES["sort"][0](rng, 5)[0], FAMILIES["sort"][0](rng, 5)
    again = fresh_items(names, keys[:1], seed=9, exclude={first})[0]
    assert (again.prompt, again.answer) == second[:2]


def test_fresh_items_fall_back_when_the_size_is_all_held_out():
    every_max1 = {f"x:{d}=" for d in "0123456789"}                       # max1's whole space
    keys = np.array([[0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 2]])
    fallback = (("A", "B"),)
    assert fresh_items(("max1",), keys, 0, exclude=every_max1, fallback=fallback) == ["A", "B", "A"]
    with pytest.raises(ValueError, match="heldout_per_domain"):
        fresh_items(("max1",), keys, 0, exclude=every_max1)
    with pytest.raises(ValueError, match="cell"):
        fresh_items(("max1",), np.array([[1, 0, 0, 0]]), 0)


def test_family_configs_and_bad_reward():
    assert family_configs("last") == [f"last{s}" for s in range(2, 11)]
    with pytest.raises(ValueError, match="unknown family"):
        family_configs("nope")
    with pytest.raises(ValueError, match="reward"):
        generator_update(generator_init(2), np.array([0]), float("nan"))


# ---- tasks=generated:<family> in the built-in trainer -------------------------------------------
def _gen_cfg(tmp_path, name, **kw):
    from rlpace.train import TrainConfig
    base = dict(tasks="generated:max", train_per_domain=8, heldout_per_domain=2, hidden=16, layers=1, heads=2,
                warmup_steps=60, warmup_batch=16, batch_prompts=4, group_size=4, max_new_tokens=2, lr=3e-3,
                eval_every=10, checkpoint_every=2, progress=False, steps=4, gen_buffer=6,
                cache_dir=str(tmp_path / "cache"), out=str(tmp_path / name))
    return TrainConfig(**{**base, **kw})


def test_trainer_generated_tasks_train_the_generator_and_resume_exactly(tmp_path):
    torch = pytest.importorskip("torch")
    from pathlib import Path

    from rlpace.train import train
    torch.set_num_threads(1)

    def run(cfg):
        train(cfg)
        recs = [json.loads(x) for x in Path(cfg.out, "metrics.jsonl").read_text().splitlines() if x.strip()]
        counters = json.loads(Path(cfg.out, "checkpoint", "state.json").read_text())["counters"]
        return [r for r in recs if not r.get("final")], counters["generator"]

    full, gen_full = run(_gen_cfg(tmp_path, "full"))
    assert "gen/reward" not in full[0] and all("gen/reward" in r for r in full[1:])   # buffer empty at 0
    probs = [[r[k] for k in sorted(r) if k.startswith("gen/prob/")] for r in full]
    assert len(probs[0]) == 10 and all(sum(p) == pytest.approx(1.0) for p in probs)
    assert probs[0] == pytest.approx([0.1] * 10) and probs[-1] != pytest.approx([0.1] * 10)
    assert any(r["gen/reward"] != 0 for r in full[1:])                 # the learner moved
    assert gen_full["updates"] == 3 and gen_full["buffer_len"] == 6
    # the Scheduler's pool is one cell per size: prompt ids are the drawn cells
    assert all(len(r["prompt_ids"]) == 4 and all(0 <= i < 10 for i in r["prompt_ids"]) for r in full)
    # the buffer holds the keys of the last 6 real items (steps 2 and 3: 4 + 2 of them), which
    # regenerate to fresh items of the family: none held out, and not the fixed pool's items
    buf = np.array(gen_full["buffer"])
    assert buf.shape == (6, 4) and sorted(buf[:, 1].tolist()) == [2, 2, 3, 3, 3, 3]
    assert gen_full["cursor"] == 16 % 6                                  # 16 items pushed: oldest at slot 4
    assert [c for r in full[2:] for c in r["prompt_ids"]][2:] == [buf[(4 + k) % 6, 0] for k in range(6)]
    ts = generated_taskset("generated:max", train_per_domain=8, heldout_per_domain=2, seed=0)
    names = tuple(sorted({it.domain for it in ts.train}))
    items = fresh_items(names, buf, seed=0)
    assert all(it.domain == names[c] for it, c in zip(items, buf[:, 0]))
    assert not {it.prompt for it in items} & {it.prompt for it in ts.heldout}
    assert len({it.prompt for it in items} - {it.prompt for it in ts.train}) >= 3      # new items
    # resume from the step-2 checkpoint: the same prompts, generator and final state
    _gen_cfg(tmp_path, "part")
    part_cfg = _gen_cfg(tmp_path, "part", steps=2)
    run(part_cfg)
    resumed, gen_resumed = run(_gen_cfg(tmp_path, "part", steps=4, resume=True))
    assert [r["prompt_ids"] for r in resumed] == [r["prompt_ids"] for r in full]
    for key in ("reward_mean", "loss", "tokens", "gen/prob/max3"):     # the same items, the same updates
        assert [r[key] for r in resumed] == [r[key] for r in full], key
    assert gen_resumed == gen_full


def test_trainer_generated_tasks_with_gen_lr_0_is_the_fixed_uniform_mix(tmp_path):
    pytest.importorskip("torch")
    from pathlib import Path

    from rlpace.train import train
    cfg = _gen_cfg(tmp_path, "frozen", gen_lr=0.0, steps=3, checkpoint_every=0)
    train(cfg)
    recs = [json.loads(x) for x in Path(cfg.out, "metrics.jsonl").read_text().splitlines() if x.strip()]
    for r in recs:
        if not r.get("final"):
            assert [r[k] for k in sorted(r) if k.startswith("gen/prob/")] == [0.1] * 10


def test_trainer_generated_tasks_reject_conflicting_settings(tmp_path):
    pytest.importorskip("torch")
    from rlpace.train import train
    from rlpace.train.recipes.grpo import check_config
    with pytest.raises(ValueError, match="unknown family"):
        check_config(_gen_cfg(tmp_path, "x", tasks="generated:nope"))
    with pytest.raises(ValueError, match="lilo_candidates"):
        check_config(_gen_cfg(tmp_path, "x", lilo_candidates=2))
    for field, bad in (("gen_lr", -0.1), ("gen_lr", float("inf")), ("gen_entropy", -1.0), ("gen_buffer", 0)):
        with pytest.raises(ValueError, match=field):
            check_config(_gen_cfg(tmp_path, "x", **{field: bad}))
    with pytest.raises(ValueError, match="chooses the prompts itself"):
        train(_gen_cfg(tmp_path, "x", policy="dump"))
