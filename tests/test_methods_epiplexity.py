"""epiplexity (docs/methods/epiplexity.md): the power-law fit, the prequential area, the
mixture's values and fallbacks, `Scheduler.observe_losses` validation and exact resume."""

import math

import numpy as np
import pytest

from rlpace import Pool, Scheduler
from rlpace.policies import MIXTURE, make_policy
from rlpace.policies._epiplexity import EpiplexityState
from rlpace.stats._curvefit import fit_power_law

POOL = Pool(np.repeat(["a", "b", "c"], 10))


# ---- the fit ------------------------------------------------------------------------------
@pytest.mark.parametrize("E, A, alpha", [(1.0, 30.0, 0.5), (2.5, 8.0, 0.3), (0.4, 200.0, 1.2)])
def test_fit_recovers_known_parameters_from_noisy_curves_within_5_percent(E, A, alpha):
    rng = np.random.default_rng(0)
    t = np.geomspace(10, 1e4, 60)[None].repeat(20, 0)                  # 20 noisy replicas, 0.5 % noise
    y = (E + A * t ** -alpha) * (1 + 0.005 * rng.standard_normal(t.shape))
    fit = fit_power_law(t, y, np.ones(t.shape, bool))
    assert fit.ok.all()
    for got, want in ((fit.E, E), (fit.A, A), (fit.alpha, alpha)):
        assert np.abs(got / want - 1).max() < 0.05, (got, want)


def test_fit_is_the_least_squares_optimum_of_a_dense_brute_force_search():
    # independent reference: 20 001 α values, each with numpy lstsq for (E, A), interior only
    rng = np.random.default_rng(3)
    t = np.geomspace(5, 5e3, 25)
    y = 0.7 + 12.0 * t ** -0.8 + 0.01 * rng.standard_normal(t.size)
    fit = fit_power_law(t[None], y[None], np.ones((1, t.size), bool), robust_iters=0)
    best = math.inf
    for a in np.linspace(0.01, 2.0, 20001):
        X = np.stack([np.ones_like(t), t ** -a], 1)
        coef = np.linalg.lstsq(X, y, rcond=None)[0]
        if (coef >= 0).all():
            best = min(best, float(((X @ coef - y) ** 2).sum()))
    got = float(((fit.E[0] + fit.A[0] * t ** -fit.alpha[0] - y) ** 2).sum())
    assert got <= best * (1 + 1e-6)


def test_robust_fit_ignores_one_spiky_probe_that_bends_plain_least_squares():
    t = np.geomspace(1e2, 1e5, 40)
    y = 1.0 + 30.0 * t ** -0.5
    y[10] += 2.0                                                       # one corrupted probe
    robust = fit_power_law(t[None], y[None], np.ones((1, 40), bool))
    plain = fit_power_law(t[None], y[None], np.ones((1, 40), bool), robust_iters=0)
    assert robust.alpha[0] == pytest.approx(0.5, rel=0.01) and robust.E[0] == pytest.approx(1.0, rel=0.01)
    assert abs(plain.alpha[0] - 0.5) > 0.05                           # the test can fail


def test_fit_bounds_flat_rising_and_too_few_points():
    t = np.array([[10.0, 20.0, 40.0, 80.0], [10.0, 20.0, 40.0, 80.0], [5.0, 5.0, 5.0, 0.0]])
    y = np.array([[2.0, 2.0, 2.0, 2.0], [1.0, 2.0, 3.0, 4.0], [3.0, 3.0, 3.0, 0.0]])
    fit = fit_power_law(t, y, np.array([[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 0]], bool))
    assert fit.ok.tolist() == [True, True, False]                     # one distinct t: not fitted
    assert fit.A.tolist() == [0.0, 0.0, 0.0]                          # flat / rising: nothing to learn
    assert fit.E[:2].tolist() == pytest.approx([2.0, 2.5])            # the mean: face A = 0
    assert np.isfinite(np.concatenate(fit)).all()


# ---- the policy ---------------------------------------------------------------------------
def _state(s: Scheduler) -> EpiplexityState:
    return s.states[MIXTURE]


def test_prequential_area_against_hand_computed_value():
    s = Scheduler(POOL, "epiplexity")
    # L = 1 + 100/t at t = 10, 20, 40, 50, 100: 11, 6, 3.5, 3, 2; then a repeated probe at t = 40
    for t in (10, 20, 40, 50, 100):
        s.observe_losses({"a": (t, 1 + 100 / t)})
    s.observe_losses({"a": (40, 3.6)})
    # trapezoid: 10·(11+6)/2 + 20·(6+3.5)/2 + 10·(3.5+3)/2 + 50·(3+2)/2 = 85 + 95 + 32.5 + 125
    assert _state(s).loss_area[0] == pytest.approx(337.5, rel=1e-12)
    m = s.metrics()
    assert m["epiplexity/a/points"] == 6.0 and m["epiplexity/a/fitted"] == 1.0
    assert m["epiplexity/a/E"] == pytest.approx(1.0, abs=0.02)
    # above the asymptote: 337.5 − E·(100 − 10) = 247.5 for E = 1
    assert m["epiplexity/a/area"] == pytest.approx(337.5 - 90 * m["epiplexity/a/E"], rel=1e-9)
    assert m["epiplexity/a/area"] == pytest.approx(247.5, abs=2.0)


def test_values_and_weights_hand_computed():
    # the factory docstring's example: t = 100, E = 1, α = 1, A = 100 and 50, horizon 0.1
    pol = make_policy("epiplexity", floor=0.0)
    pool = Pool(["x", "y"])
    st = pol.init(pool)._replace(
        n_points=np.array([5, 5]), last_tokens=np.array([100.0, 100.0]), E=np.ones(2),
        A=np.array([100.0, 50.0]), alpha=np.ones(2), fitted=np.array([True, True]))
    v = 100 / 100 * (1 - 1 / 1.1)                                      # 0.0909...
    p0 = math.exp(5) / (math.exp(5) + math.exp(2.5))                   # softmax([1, .5] / .2)
    assert pol.metrics(st, pool)["epiplexity/x/value"] == pytest.approx(v, rel=1e-12)
    assert pol.metrics(st, pool)["epiplexity/y/value"] == pytest.approx(v / 2, rel=1e-12)
    np.testing.assert_allclose(pol.apply(st, pool), [p0, 1 - p0], rtol=1e-12)
    assert p0 == pytest.approx(0.924, abs=1e-3)


def test_fallbacks_are_uniform_or_optimistic_and_never_nan():
    s = Scheduler(POOL, "epiplexity", floor=0.0)
    np.testing.assert_allclose(s.domain_probs(), [1 / 3] * 3)          # nothing observed
    for t in (10, 20, 40):                                             # 3 < min_points = 5
        s.observe_losses({"a": (t, 1 + 100 / t), "b": (t, 2.0)})
    np.testing.assert_allclose(s.domain_probs(), [1 / 3] * 3)
    for t in (80, 160):                                                # a fits; b is flat (A = 0)
        s.observe_losses({"a": (t, 1 + 100 / t), "b": (t, 2.0)})
    m = s.metrics()
    assert m["epiplexity/a/fitted"] == 1.0 and m["epiplexity/b/fitted"] == 1.0
    assert m["epiplexity/b/A"] == 0.0 and m["epiplexity/b/value"] == 0.0
    assert m["epiplexity/c/fitted"] == 0.0
    # c (no curve) is valued like the best fitted domain, a: equal weights, b gets exp(−1/T)
    assert m["epiplexity/c/value"] == m["epiplexity/a/value"] > 0
    z = 2 + math.exp(-5)
    np.testing.assert_allclose(s.domain_probs(), [1 / z, math.exp(-5) / z, 1 / z], rtol=1e-9)
    assert all(np.isfinite(v) for v in m.values())
    # every curve flat: uniform
    f = Scheduler(POOL, "epiplexity", floor=0.0)
    for t in (10, 20, 40, 80, 160):
        f.observe_losses({d: (t, 3.0) for d in "abc"})
    np.testing.assert_allclose(f.domain_probs(), [1 / 3] * 3)


def test_t_zero_points_enter_the_area_not_the_fit():
    s = Scheduler(POOL, "epiplexity")
    s.observe_losses({"a": (0, 20.0)})
    for t in (10, 20, 40, 50, 100):
        s.observe_losses({"a": (t, 1 + 100 / t)})
    assert _state(s).loss_area[0] == pytest.approx(337.5 + 10 * (20 + 11) / 2)
    assert s.metrics()["epiplexity/a/alpha"] == pytest.approx(1.0, abs=0.01)


def test_curves_are_thinned_at_capacity_keeping_every_second_point():
    s = Scheduler(POOL, "epiplexity", capacity=10, min_points=5)
    for i in range(1, 12):                                             # 11 points into 10 slots
        s.observe_losses({"b": (float(i), 1.0 + 1.0 / i)})
    st = _state(s)
    assert st.n_points.tolist() == [0, 6, 0]
    assert st.tokens[1].tolist() == [1, 3, 5, 7, 9, 11, 0, 0, 0, 0]
    # the area still covers all 11 points: Σ_{i=1..10} (1 + (1/i + 1/(i+1))/2)
    want = sum(1 + (1 / i + 1 / (i + 1)) / 2 for i in range(1, 11))
    assert st.loss_area[1] == pytest.approx(want, rel=1e-12)


def test_rollout_feedback_does_not_move_it_and_other_policies_ignore_losses():
    from rlpace import Feedback
    s = Scheduler(POOL, "epiplexity")
    before = s.state_dict()
    ids = s.propose(4)
    s.observe(Feedback(ids, np.ones((4, 2)), step=0))
    after = s.state_dict()
    for k in before:
        if k.startswith("policy/mixture/"):
            np.testing.assert_array_equal(before[k], after[k])
    d = Scheduler(POOL, "dump")
    sd = d.state_dict()
    d.observe_losses({"a": (10, 1.0)})                                 # a no-op, not an error
    for k in sd:
        np.testing.assert_array_equal(sd[k], d.state_dict()[k])


BAD = [
    ({"zzz": (10, 1.0)}, "unknown domain 'zzz'"),
    ({"a": (-1, 1.0)}, "tokens_seen of domain 'a'"),
    ({"a": (10, float("nan"))}, "loss of domain 'a'"),
    ({"a": (10, 1e5)}, "loss of domain 'a'"),
    ({"a": (float("inf"), 1.0)}, "tokens_seen of domain 'a'"),
    ({"a": (True, 1.0)}, "tokens_seen of domain 'a'"),
    ({"a": ("10", 1.0)}, "tokens_seen of domain 'a'"),
    ({"a": 1.0}, "pair"),
    ({"a": (1, 2, 3)}, "pair"),
    ([("a", (10, 1.0))], "dict"),
]


@pytest.mark.parametrize("losses, match", BAD)
def test_bad_losses_rejected_naming_the_field_state_unchanged(losses, match):
    s = Scheduler(POOL, "epiplexity")
    s.observe_losses({"b": (10, 1.0), "c": (10, 2.0)})
    before = s.state_dict()
    # a bad entry after a good one: nothing of the good one may be applied either
    bad = {"b": (20, 0.9), **losses} if isinstance(losses, dict) else losses
    with pytest.raises(ValueError, match=match):
        s.observe_losses(bad)
    after = s.state_dict()
    for k in before:
        np.testing.assert_array_equal(before[k], after[k])


def _drive(s: Scheduler, start: int, stop: int, seed: int = 0):
    """Synthetic learner: each domain's loss follows a known power law in the tokens it got."""
    from rlpace import Feedback
    truth = {"a": (1.0, 60.0, 0.5), "b": (2.0, 3.0, 0.4), "c": (0.5, 0.0, 1.0)}
    tokens = {d: 100.0 for d in truth}
    out = []
    for step in range(stop):
        ids = s.propose(12)
        counts = np.bincount(POOL.domains[ids], minlength=3)
        for d, c in zip(POOL.domain_names, counts):
            tokens[d] += 50.0 * c
        rng = np.random.default_rng([seed, step])
        if step < start:
            continue
        s.observe(Feedback(ids, (rng.random((12, 2)) < 0.5).astype(float), step=step))
        if step % 2 == 0:
            s.observe_losses({d: (tokens[d], E + A * tokens[d] ** -al * (1 + 0.01 * rng.standard_normal()))
                              for d, (E, A, al) in truth.items()}, step=step)
        out.append((ids, s.domain_probs()))
    return out, tokens, truth


def test_exact_resume_through_npz(tmp_path):
    kw = dict(capacity=10, min_points=5, refit_every=2)
    ref = Scheduler(POOL, "epiplexity", seed=3, **kw)
    _drive(ref, 0, 14)
    path = tmp_path / "s.npz"
    np.savez(path, **ref.state_dict())
    fresh = Scheduler(POOL, "epiplexity", seed=99, **kw)
    with np.load(path) as z:
        fresh.load_state_dict({k: z[k] for k in z.files})
    # continue both with the same stream (the driver's token counters restart identically)
    a, _, _ = _drive(ref, 0, 30)
    b, _, _ = _drive(fresh, 0, 30)
    for (i1, p1), (i2, p2) in zip(a, b):
        np.testing.assert_array_equal(i1, i2)
        np.testing.assert_array_equal(p1, p2)
    for k, v in ref.state_dict().items():
        np.testing.assert_array_equal(v, fresh.state_dict()[k], err_msg=k)
    assert int(_state(ref).n_points.max()) <= 10 and _state(ref).fitted.all()


def test_corrupt_state_rejected_on_load():
    s = Scheduler(POOL, "epiplexity", capacity=10, min_points=5)
    _drive(s, 0, 12)
    good = s.state_dict()
    for key, edit, match in [
        ("policy/mixture/n_points", lambda a: a + 20, "above capacity"),
        ("policy/mixture/losses", lambda a: np.where(a == 0, 1.0, a), "past n_points"),
        ("policy/mixture/alpha", lambda a: a + 5.0, "outside"),
        ("policy/mixture/loss_area", lambda a: -a - 1, "outside"),
        ("policy/mixture/E", lambda a: a * np.inf, "NaN or inf"),
    ]:
        bad = dict(good)
        bad[key] = edit(np.asarray(good[key]))
        with pytest.raises(ValueError, match=match):
            Scheduler(POOL, "epiplexity", capacity=10, min_points=5).load_state_dict(bad)


def test_learning_moves_mass_to_the_domain_with_most_left_to_learn():
    # a: L = 1 + 60 t^-0.5 (much left), b: 2 + 3 t^-0.4 (little), c: flat. Uniform vs epiplexity:
    # the summed loss after the same token budget is lower, and a gets the largest share.
    def total_loss(policy):
        s = Scheduler(POOL, policy, seed=0)
        _, tokens, truth = _drive(s, 0, 60)
        return sum(E + A * tokens[d] ** -al for d, (E, A, al) in truth.items()), s

    uni, _ = total_loss("uniform")
    epi, s = total_loss("epiplexity")
    p = s.domain_probs()
    assert p[0] > 0.5 and p[0] > p[1] > p[2] - 1e-12
    assert epi < uni - 0.05, (epi, uni)


# ---- the built-in trainer's loss probe --------------------------------------------------------
def test_trainer_probes_losses_and_feeds_the_scheduler(tmp_path):
    torch = pytest.importorskip("torch")
    import json
    from pathlib import Path

    from rlpace.tasks import make_taskset
    from rlpace.train import TrainConfig, train
    from rlpace.train.model import load_policy
    from rlpace.train.sampling import build_loss_probe, probe_losses

    torch.set_num_threads(1)
    cfg = TrainConfig(tasks="embedded:max2,last3", train_per_domain=16, heldout_per_domain=8, hidden=16,
                      layers=1, heads=2, warmup_steps=20, warmup_batch=16, batch_prompts=4, group_size=2,
                      max_new_tokens=3, eval_every=10, checkpoint_every=0, progress=False, steps=3,
                      policy="epiplexity", policy_kwargs='{"min_points": 2, "capacity": 4}',
                      loss_probe_every=1, loss_probe_per_domain=3, cache_dir=str(tmp_path / "cache"),
                      out=str(tmp_path / "run"))
    summary = train(cfg)
    recs = [json.loads(x) for x in Path(cfg.out, "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [r for r in recs if not r.get("final")]
    assert len(steps) == 3
    for r in steps:                                    # a probe at every step, every domain
        assert {"probe_loss/last3", "probe_loss/max2"} <= set(r)
        assert all(0 < r[k] < 20 for k in r if k.startswith("probe_loss/"))
        assert r["groups_trained"] == 4 and r["refill_rounds"] == 0
    # every rollout is kept (no admission policy): tokens trained = tokens generated
    counters = json.loads(Path(cfg.out, "checkpoint", "state.json").read_text())["counters"]
    assert sum(counters["domain_tokens"]) == sum(r["tokens"] for r in steps)
    with np.load(Path(cfg.out, "checkpoint", "scheduler.npz")) as z:
        assert z["policy/mixture/n_points"].tolist() == [3, 3]
        assert z["policy/mixture/first_tokens"].tolist() == [0.0, 0.0]       # the step-0 probe
    # probe_losses (one padded batch) against a per-item loop over unpadded sequences
    model, tok = load_policy(summary["model_dir"], "cpu")
    model.load_state_dict(torch.load(Path(cfg.out, "checkpoint", "model.pt"), weights_only=True))
    model.eval()
    tasks = make_taskset(cfg.tasks, train_per_domain=16, heldout_per_domain=8, seed=0)
    pool = tasks.pool()
    got = probe_losses(model, build_loss_probe(tasks, pool, tok, cfg))
    want = []
    for name in pool.domain_names:
        nll, n = 0.0, 0
        for it in [h for h in tasks.heldout if h.domain == name][:3]:
            p = [tok.bos_token_id] + tok.encode(it.prompt, add_special_tokens=False)
            a = tok.encode(it.answer, add_special_tokens=False) + [tok.eos_token_id]
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([p + a])).logits[0].double()
            lp = torch.log_softmax(logits, -1)
            nll -= sum(float(lp[len(p) - 1 + j, a[j]]) for j in range(len(a)))
            n += len(a)
        want.append(nll / n)
    np.testing.assert_allclose(got, want, rtol=1e-4)


def test_trainer_config_and_counters_are_checked():
    pytest.importorskip("torch")
    from rlpace.train import TrainConfig
    from rlpace.train.checkpoint import restore_domain_tokens as _domain_tokens
    from rlpace.train.recipes.grpo import check_config
    for field in ("loss_probe_every", "loss_probe_per_domain"):
        with pytest.raises(ValueError, match=field):
            check_config(TrainConfig(**{field: 0}))
    assert _domain_tokens({}, 2).tolist() == [0.0, 0.0]                 # checkpoints from before
    assert _domain_tokens({"domain_tokens": [3, 4.5]}, 2).tolist() == [3.0, 4.5]
    for raw in ([1.0], [1.0, -2.0], [1.0, float("nan")], "12", [[1.0], [2.0]]):
        with pytest.raises(ValueError, match="domain_tokens"):
            _domain_tokens({"domain_tokens": raw}, 2)
