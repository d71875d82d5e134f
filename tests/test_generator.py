"""The epiplexity-guided task generator (rlpace.tasks._generator): REINFORCE estimator, entropy
bonus, learning on a synthetic learner with a known optimum, buffer, exact resume."""

import json

import numpy as np
import pytest

from rlpace.tasks._generator import (buffer_push, entropy_gradient, family_configs, generator_from_json,
                                     generator_init, generator_probs, generator_sample, generator_to_json,
                                     generator_update, reinforce_gradient)


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
    # var = 0 → A = clip((3 − 2) / 1e-8, ±5) = 5; Σ(e_c − π) = [2 − 2/3, −2/3, −2/3]
    np.testing.assert_allclose(st2.logits, 5 * np.array([4 / 3, -2 / 3, -2 / 3]))
    assert float(st2.baseline) == pytest.approx(0.8 * 2 + 0.2 * 3)
    assert float(st2.reward_var) == pytest.approx(0.2 * 1.0)


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
    st = buffer_push(st, [10, 11, 12])
    assert st.buffer.tolist() == [10, 11, 12, -1] and int(st.buffer_len) == 3
    st = buffer_push(st, [13, 14])
    assert st.buffer.tolist() == [14, 11, 12, 13] and int(st.buffer_len) == 4 and int(st.cursor) == 1


def test_json_round_trip_is_exact_and_validated():
    st = generator_init(4, buffer_size=3)
    rng = np.random.default_rng(2)
    for step in range(5):
        c = generator_sample(st, 4, np.random.default_rng([1, step]))
        st = buffer_push(generator_update(st, c, float(rng.random())), c + 10 * step)
    back = generator_from_json(json.loads(json.dumps(generator_to_json(st))), 4, 3, 100)
    for a, b in zip(st, back):
        np.testing.assert_array_equal(a, b)
        assert np.asarray(a).dtype == np.asarray(b).dtype
    nxt = lambda s: generator_update(s, generator_sample(s, 4, np.random.default_rng([1, 9])), 0.7)  # noqa: E731
    np.testing.assert_array_equal(nxt(st).logits, nxt(back).logits)
    good = generator_to_json(st)
    for field, value, match in [("logits", [0.0] * 3, "logits"), ("logits", [np.nan] * 4, "logits"),
                                ("reward_var", -1.0, "reward_var"), ("buffer", [0, 1, 500], "buffer"),
                                ("cursor", 3, "cursor"), ("buffer_len", 9, "buffer_len")]:
        with pytest.raises(ValueError, match=match):
            generator_from_json({**good, field: value}, 4, 3, 100)
    with pytest.raises(ValueError, match="generator"):
        generator_from_json({"logits": [0.0]}, 4, 3, 100)


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
    # every trained prompt is an item of the family's pool; ids follow the generator's draws
    assert all(len(r["prompt_ids"]) == 4 for r in full)
    # resume from the step-2 checkpoint: the same prompts, generator and final state
    _gen_cfg(tmp_path, "part")
    part_cfg = _gen_cfg(tmp_path, "part", steps=2)
    run(part_cfg)
    resumed, gen_resumed = run(_gen_cfg(tmp_path, "part", steps=4, resume=True))
    assert [r["prompt_ids"] for r in resumed] == [r["prompt_ids"] for r in full]
    assert gen_resumed == gen_full


def test_trainer_generated_tasks_reject_conflicting_settings(tmp_path):
    pytest.importorskip("torch")
    from rlpace.train import train
    from rlpace.train.recipes.grpo import check_config
    with pytest.raises(ValueError, match="unknown family"):
        check_config(_gen_cfg(tmp_path, "x", tasks="generated:nope"))
    with pytest.raises(ValueError, match="lilo_candidates"):
        check_config(_gen_cfg(tmp_path, "x", lilo_candidates=2))
    for field, bad in (("gen_lr", 0.0), ("gen_entropy", -1.0), ("gen_buffer", 0)):
        with pytest.raises(ValueError, match=field):
            check_config(_gen_cfg(tmp_path, "x", **{field: bad}))
    with pytest.raises(ValueError, match="chooses the prompts itself"):
        train(_gen_cfg(tmp_path, "x", policy="dump"))
