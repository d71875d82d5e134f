"""The cheaper per-step feature path (budget: ≤ +5 % step time) computes the same numbers:
the batched lm_head features (first token's closed form folded into one product) against a
loop of single-rollout backward() calls in the trainer's float32, the logits check on NaN,
DIEM's eigendecomposition solve against np.linalg.pinv, and the round Feedback parts that
split_with_grads assembles from validated arrays against the validating constructor."""

import dataclasses

import numpy as np
import pytest

from rlpace import Feedback, Pool, Scheduler
from rlpace.policies._diem import _rescale, constrained_weights, diem
from rlpace.train.gradfeatures import split_with_grads
from rlpace.types import Batch


# ---- split_with_grads: parts from validated arrays -------------------------------------------
def _round_and_trained():
    rng = np.random.default_rng(0)
    fb = Feedback([4, 9, 2, 7, 5], rng.integers(0, 2, (5, 3)).astype(float), rng.standard_normal((5, 3)), step=6,
                  lengths=rng.integers(1, 9, (5, 3)))
    # the trained batch: groups 3 and 0 of this round, then a group of another round (id 11)
    grads = rng.standard_normal((3, 3, 4)).astype(np.float32)
    trained = Feedback([7, 4, 11], rng.integers(0, 2, (3, 3)).astype(float), step=6, grads=grads,
                       ref_grad=[0.5, -1.0, 0.0, 2.0])
    return fb, trained


def test_split_parts_equal_what_the_validating_constructor_builds():
    fb, trained = _round_and_trained()
    parts = split_with_grads(fb, [3, 0], trained, [0, 1])
    expect = [Feedback(fb.prompt_ids[[3, 0]], fb.rewards[[3, 0]], fb.advantages[[3, 0]], 6,
                       lengths=fb.lengths[[3, 0]], grads=trained.grads[[0, 1]], ref_grad=trained.ref_grad),
              Feedback(fb.prompt_ids[[1, 2, 4]], fb.rewards[[1, 2, 4]], fb.advantages[[1, 2, 4]], 6,
                       lengths=fb.lengths[[1, 2, 4]])]
    assert len(parts) == 2
    for got, want in zip(parts, expect):
        assert type(got) is Feedback
        for f in dataclasses.fields(Feedback):
            a, b = getattr(got, f.name), getattr(want, f.name)
            if b is None or not isinstance(b, np.ndarray):
                assert a == b, f.name
                continue
            assert a.dtype == b.dtype and a.shape == b.shape and not a.flags.writeable, f.name
            np.testing.assert_array_equal(a, b)
    assert parts[0].prompt_ids.tolist() == [7, 4] and parts[1].prompt_ids.tolist() == [9, 2, 5]
    np.testing.assert_array_equal(parts[0].grads[1], trained.grads[1])          # group 0 (id 4) ← row 1
    # the Scheduler ends in the same state as with the constructor's Feedbacks
    pool = Pool(["a", "b"] * 6)
    s1, s2 = Scheduler(pool, "dvc", window=3), Scheduler(pool, "dvc", window=3)
    for p, q in zip(parts, expect):
        s1.observe(p)
        s2.observe(q)
    for k, v in s2.state_dict().items():
        np.testing.assert_array_equal(s1.state_dict()[k], v)


def test_split_edge_cases_and_mismatch_refused():
    fb, trained = _round_and_trained()
    (only,) = split_with_grads(fb, [], trained, [])                            # nothing trained
    assert only.grads is None and only.prompt_ids.tolist() == fb.prompt_ids.tolist()
    (every,) = split_with_grads(fb, [3, 0, 1, 2, 4], Feedback([7, 4, 9, 2, 5], np.zeros((5, 3)),
                                                              grads=np.ones((5, 3, 2)), step=0), [0, 1, 2, 3, 4])
    assert every.grads.shape == (5, 3, 2) and every.prompt_ids.tolist() == [7, 4, 9, 2, 5]
    with pytest.raises(ValueError, match="same groups"):
        split_with_grads(fb, [3, 0], trained, [1, 0])                           # ids 4, 7 ≠ 7, 4
    with pytest.raises(ValueError, match="carry grads"):
        split_with_grads(fb, [3], Feedback([7], np.zeros((1, 3)), step=0), [0])
    with pytest.raises(ValueError, match="group size"):
        split_with_grads(fb, [3], Feedback([7], np.zeros((1, 2)), grads=np.ones((1, 2, 4)), step=0), [0])


# ---- DIEM: the eigendecomposition solve ------------------------------------------------------
def _pinv_reference(f, i, ridge, rcond=1e-10):
    """W = (P + λI)⁺Î rescaled to ‖WᵀF‖ = ‖1ᵀF‖, through np.linalg.pinv (the SVD path)."""
    p = f @ f.T
    c = float(np.sum(f.sum(axis=0) ** 2))
    lam = ridge * np.trace(p) / len(f)
    w = np.linalg.pinv(p + lam * np.eye(len(f)), rcond=rcond) @ i
    return w * np.sqrt(c / (w @ p @ w))


@pytest.mark.parametrize("n, d, zero_rows, ridge", [(16, 256, 0, 0.0), (16, 256, 5, 0.0), (40, 8, 0, 0.0),
                                                    (16, 256, 5, 1e-3), (12, 12, 3, 1.0)])
def test_diem_solve_equals_the_pseudo_inverse(n, d, zero_rows, ridge):
    rng = np.random.default_rng(n * d + zero_rows)
    f = rng.standard_normal((n, d))
    f[:zero_rows] = 0.0                                  # groups with A = 0: exactly rank deficient
    i = f @ rng.standard_normal(d)                       # a reference-direction importance
    np.testing.assert_allclose(constrained_weights(f, i, ridge), _pinv_reference(f, i, ridge), rtol=1e-8,
                               atol=1e-10)


def test_diem_apply_reuses_one_gram_and_matches_the_two_step_rule():
    # apply = ReLU(constrained_weights) rescaled by the same P and C, in prompt units from the
    # float32 features summed in float64
    rng = np.random.default_rng(3)
    g = rng.standard_normal((6, 4, 10)).astype(np.float32)
    pool = Pool(list(range(6)))
    fb = Feedback(np.arange(6), rng.integers(0, 2, (6, 4)).astype(float), grads=g, step=0)
    p = diem(importance="loo", ridge=0.01)
    w = p.apply(p.init(pool), pool, Batch.from_feedback(fb, pool, 0.5))
    f = g.astype(np.float64).sum(axis=1)
    f = f / np.abs(f).max()
    i = np.array([f[k] @ (f.sum(axis=0) - f[k]) for k in range(6)])
    w0 = np.maximum(_pinv_reference(f, i, 0.01), 0.0)
    w0 = _rescale(w0, f @ f.T, float(np.sum(f.sum(axis=0) ** 2)))
    assert (w0 == 0).any() and (w0 > 0).any()             # the ReLU did clip
    np.testing.assert_allclose(w, np.repeat(w0[:, None], 4, axis=1), rtol=1e-9)


# ---- lm_head features over the shared prompt forward, in float32 -----------------------------
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


def _model():
    from transformers import Qwen2Config, Qwen2ForCausalLM
    cfg = Qwen2Config(vocab_size=30, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    return Qwen2ForCausalLM(cfg).train()


def _grouped(b=3, g=4, p=5, t=4):
    from rlpace.train.rollout import Rollout
    gen = torch.Generator().manual_seed(2)
    p_ids = torch.randint(3, 30, (b, p), generator=gen).repeat_interleave(g, 0)
    p_mask = torch.ones(b * g, p, dtype=torch.long)
    p_mask[:g, :2] = 0                                               # group 0 left-padded
    c_mask = torch.ones(b * g, t)
    c_mask[1, 2:] = 0
    c_mask[6, 0] = 0                                                 # no first token, later ones real
    ro = Rollout(p_ids, p_mask, torch.randint(3, 30, (b * g, t), generator=gen), c_mask)
    return ro, torch.randn(b * g, generator=gen)


def test_float32_lm_head_features_over_the_shared_prompt_equal_single_rollout_backward():
    # The trainer's dtype (float32), tied embeddings (the head's own projection part), three
    # groups of four, a temperature and a clipped objective; reference: per-row forwards in
    # float64, one backward() per rollout, projected.
    from rlpace.train.gradfeatures import FirstToken, GradFeatures
    from rlpace.train.losses import policy_loss
    from rlpace.train.rollout import completion_logprobs
    model = _model()
    ro, adv = _grouped()
    n, tau = len(adv), 0.8
    gf = GradFeatures(model, "lm_head", grad_dim=64, seed=5)
    with torch.no_grad():
        noise = torch.randn(n, 4, generator=torch.Generator().manual_seed(1))
        old = completion_logprobs(model, ro, tau, 1) + 0.2 * noise            # π_old ≠ π: clipping acts
    keep = torch.ones(n)
    with gf.capture():
        logp, z0 = completion_logprobs(model, ro, tau, group_size=4, first_logits=True)
        loss = policy_loss("grpo", logp, old, adv, ro.completion_mask, keep, clip_low=0.2, clip_high=0.2).loss
    feats = gf.features(loss, n, first_token=FirstToken(z0))
    assert feats.dtype == torch.float32 and feats.shape == (n, gf.dim)

    m64 = _model().double()
    head = m64.get_output_embeddings()
    p_in, p_out = gf.layers[0].p_in.double(), gf.layers[0].p_out.double()
    exact = []
    for i in range(n):
        m64.zero_grad(set_to_none=True)
        grads = []
        h = head.register_full_backward_hook(lambda mod, gi, go: grads.append(go[0]))
        acts = []
        h2 = head.register_forward_hook(lambda mod, inp, out: acts.append(inp[0]))
        onehot = torch.zeros(n, dtype=torch.float64)
        onehot[i] = 1.0
        lp = completion_logprobs(m64, ro, tau, 1)
        policy_loss("grpo", lp, old.double(), adv.double(), ro.completion_mask.double(), keep.double(), onehot,
                    clip_low=0.2, clip_high=0.2).loss.backward()
        h.remove(), h2.remove()
        gw = grads[0].reshape(-1, grads[0].shape[-1]).T @ acts[0].reshape(-1, acts[0].shape[-1])   # ∇W of the head
        exact.append((p_out @ gw.detach() @ p_in.T).reshape(-1))
    exact = torch.stack(exact)
    assert exact[6].abs().max() > 0                    # its later tokens still count (only the first is masked)
    # float32 against float64: entries agree to ~2e-5 of the largest (without the first-token
    # term, shared_prefix=True, they are off by up to 80 % of it here)
    scale = exact.abs().max().item()
    np.testing.assert_allclose(feats.double().numpy(), exact.numpy(), rtol=1e-3, atol=5e-5 * scale)


def test_first_token_check_refuses_nan_logits():
    from rlpace.train.gradfeatures import FirstToken, GradFeatures
    from rlpace.train.rollout import completion_logprobs
    model = _model()
    ro, adv = _grouped()
    gf = GradFeatures(model, "lm_head", grad_dim=16)
    with gf.capture():
        logp, z0 = completion_logprobs(model, ro, 1.0, group_size=4, first_logits=True)
        loss = -(logp * adv[:, None]).sum()
    bad = z0.detach().clone()
    bad[4, 0, 3] = float("nan")                   # group 1's first row
    with pytest.raises(ValueError, match="not the first token's logits"):
        gf.features(loss, len(adv), first_token=FirstToken(bad))
    with pytest.raises(ValueError, match="not whole groups"):
        gf.features(loss, len(adv), first_token=FirstToken(z0[:, :, :2].reshape(len(adv), 2, 1)))


# ---- the recipe: refill rounds split into parts with and without features --------------------
def test_trainer_observes_every_round_with_the_trained_groups_features(tmp_path, cache, monkeypatch):
    # DAPO dynamic sampling drops all-equal groups and refills: several rounds per step, each
    # split into trained groups (with their rows of the training batch's features) and dropped
    # ones (without). In observe order, the feature-carrying parts are the training batch.
    from _tiny_train import TINY, read_log, tiny_config
    from rlpace.train import train
    events = []
    real_obs, real_tw = Scheduler.observe, Scheduler.token_weights

    def observe(self, fb):
        events.append(("observe", fb))
        return real_obs(self, fb)

    def token_weights(self, fb, probs, mask):
        events.append(("train", fb))
        return real_tw(self, fb, probs, mask)

    monkeypatch.setattr(Scheduler, "observe", observe)
    monkeypatch.setattr(Scheduler, "token_weights", token_weights)
    cfg = tiny_config(tmp_path / "run", cache, **{**TINY, "steps": 3, "grad_dim": 16, "eval_every": 100,
                                                  "policy": "diem+dapo_dynamic_sampling", "objective": "dapo",
                                                  "max_refill_rounds": 2, "grad_reference": "none"})
    train(cfg)
    recs = [r for r in read_log(cfg.out) if not r.get("final")]
    assert any(r["refill_rounds"] > 0 for r in recs)
    steps, parts = [], []
    for kind, fb in events:
        if kind == "observe":
            parts.append(fb)
        else:
            steps.append((parts, fb))
            parts = []
    steps[-1] = (steps[-1][0] + parts, steps[-1][1])        # a step with nothing trained observes after
    assert len(steps) == len(recs)
    for (obs, trained), rec in zip(steps, recs):
        with_g = [p for p in obs if p.grads is not None]
        assert sum(p.batch_size for p in obs) * 4 == rec["rollouts"]            # every group once
        np.testing.assert_array_equal(np.concatenate([p.prompt_ids for p in with_g]), trained.prompt_ids)
        np.testing.assert_array_equal(np.concatenate([p.grads for p in with_g]), trained.grads)
        np.testing.assert_array_equal(np.concatenate([p.rewards for p in with_g]), trained.rewards)


def test_float32_grads_take_the_fast_check_with_the_same_answers():
    from rlpace import Feedback
    g = np.arange(12, dtype=np.float32).reshape(2, 2, 3) / 7
    fb = Feedback([0, 1], [[1, 0], [0, 1]], grads=g, step=0)
    assert fb.grads.dtype == np.float32 and np.array_equal(fb.grads, g)
    assert not np.shares_memory(fb.grads, g) and not fb.grads.flags.writeable      # a read-only copy
    g[0, 0, 0] = 5.0
    assert fb.grads[0, 0, 0] == 0.0
    for bad, match in ((np.float32(np.nan), "NaN, inf"), (np.float32(np.inf), "NaN, inf")):
        h = g.copy()
        h[1, 0, 2] = bad
        with pytest.raises(ValueError, match=match):
            Feedback([0, 1], [[1, 0], [0, 1]], grads=h, step=0)
    with pytest.raises(ValueError, match=r"must be \[B, G, d\]"):
        Feedback([0, 1], [[1, 0], [0, 1]], grads=g[:, :, :0], step=0)
    with pytest.raises(ValueError, match=r"must be \[B, G, d\]"):
        Feedback([0, 1], [[1, 0], [0, 1]], grads=g[:1], step=0)


# ---- one backward: the weighted loss's gradient starts at the log-probs ----------------------
@pytest.mark.parametrize("objective", ["grpo", "dr_grpo", "dapo", "gspo"])
@pytest.mark.parametrize("per_token", [False, True])
def test_weighted_gradient_at_the_logprobs_is_the_unit_one_scaled(objective, per_token):
    # Reference: autograd of the weighted loss itself. π_old ≠ π so clipping acts; a dropped
    # rollout (keep 0), a short one, a zero weight.
    from rlpace.train.losses import logp_grad_scale, policy_loss
    gen = torch.Generator().manual_seed(3)
    n, t = 6, 5
    mask = torch.ones(n, t, dtype=torch.float64)
    mask[1, 3:] = 0
    keep = torch.tensor([1., 1., 0., 1., 1., 1.], dtype=torch.float64)
    adv = torch.randn(n, generator=gen, dtype=torch.float64)
    base = torch.randn(n, t, generator=gen, dtype=torch.float64) - 1.0
    old = base + (0.3 if objective != "gspo" else 3e-3) * torch.randn(n, t, generator=gen, dtype=torch.float64)
    w = torch.rand((n, t) if per_token else (n,), generator=gen, dtype=torch.float64) * 2
    w[3] = 0.0

    def grad_of(weight):
        lp = base.clone().requires_grad_(True)
        policy_loss(objective, lp * mask, old, adv, mask, keep, weight).loss.backward()
        return lp.grad

    weighted, unit = grad_of(w), grad_of(None)
    assert unit.abs().max() > 0 and (weighted - unit).abs().max() > 1e-3     # the weights matter here
    c = logp_grad_scale(objective, w, mask)
    assert c.shape == (n, t)
    torch.testing.assert_close(c * unit, weighted, rtol=1e-12, atol=1e-15)
    if objective == "gspo" and per_token:                 # hand-computed: w̄_1 over its 3 real tokens
        assert c[1, 0].item() == pytest.approx(w[1, :3].mean().item())
    with pytest.raises(ValueError, match="unknown objective"):
        logp_grad_scale("ppo", w, mask)


def test_features_return_the_logprob_gradient_and_one_backward_equals_the_weighted_loss():
    # The recipe's epoch 0 with features: the features' autograd call also gives ∂L₁/∂logp;
    # backward from the log-probs with c ⊙ ∂L₁/∂logp (+ a KL root) must give the parameter
    # gradient of the weighted loss + KL computed the plain way, in a model of its own.
    from rlpace.train.gradfeatures import FirstToken, GradFeatures
    from rlpace.train.losses import kl_k3, logp_grad_scale, policy_loss
    from rlpace.train.rollout import completion_logprobs
    ro, adv = _grouped()
    n, tau = len(adv), 0.8
    keep = torch.ones(n)
    keep[5] = 0
    w = torch.rand(n, generator=torch.Generator().manual_seed(4)) * 2                    # DIEM-like, per rollout
    w_tok = w[:, None].expand(n, 4)
    ref_lp = completion_logprobs(_model(), ro, tau, 1).detach() - 0.1

    def loss_of(model, logp, weight):
        return (policy_loss("dapo", logp, logp.detach(), adv, ro.completion_mask, keep, weight).loss * 0.5
                + 0.05 * kl_k3(logp, ref_lp, ro.completion_mask, keep))

    model = _model()
    gf = GradFeatures(model, "lm_head", grad_dim=64, seed=5)
    ones = torch.ones(n, 4, requires_grad=True)
    with gf.capture():
        logp, z0 = completion_logprobs(model, ro, tau, group_size=4, first_logits=True)
        unit = policy_loss("dapo", logp, logp.detach(), adv, ro.completion_mask, keep, ones).loss * 0.5
    feats, (g, g_w) = gf.features(unit, n, first_token=FirstToken(z0), wrt=(logp, ones))
    assert feats.shape == (n, gf.dim) and feats.abs().max() > 0
    assert g.shape == (n, 4) and not g.requires_grad
    torch.testing.assert_close(g, torch.autograd.grad(unit, logp, retain_graph=True)[0])
    # the loss is linear in its weights: the weighted loss is Σ w ⊙ ∂L₁/∂w (what the recipe logs)
    with torch.no_grad():
        weighted = policy_loss("dapo", logp, logp.detach(), adv, ro.completion_mask, keep, w_tok).loss * 0.5
    assert (w_tok * g_w).sum().item() == pytest.approx(weighted.item(), rel=1e-5)
    assert (g_w.sum() - unit).abs().item() < 1e-6 and abs(weighted.item() - unit.item()) > 1e-4
    kl = 0.05 * kl_k3(logp, ref_lp, ro.completion_mask, keep)
    torch.autograd.backward([logp, kl], [logp_grad_scale("dapo", w_tok, ro.completion_mask) * g, None])
    one_pass = [p.grad.clone() for p in model.parameters()]

    plain = _model()
    loss_of(plain, completion_logprobs(plain, ro, tau, group_size=4), w_tok).backward()
    for a, b in zip(one_pass, [p.grad for p in plain.parameters()]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-8)
    assert max(p.grad.abs().max().item() for p in plain.parameters()) > 1e-4


def test_trainer_features_with_unit_weights_train_exactly_as_without(tmp_path, cache):
    # Features on, uniform weights: epoch 0's backward starts at the log-probs (c = 1); the
    # plain recipe is the reference — same logged losses and the same final weights, with a
    # KL term, two micro-batches and a second epoch (the plain path again).
    import torch as _t
    from _tiny_train import TINY, read_log, tiny_config
    from rlpace.train import train
    runs = {}
    for mode in ("off", "on"):
        cfg = tiny_config(tmp_path / mode, cache, **{**TINY, "steps": 2, "eval_every": 100},
                          policy="uniform", grad_features=mode, grad_reference="none", grad_dim=32,
                          kl_coef=0.1, micro_batch=8, epochs=2)
        train(cfg)
        runs[mode] = ([r for r in read_log(cfg.out) if not r.get("final")],
                      _t.load(tmp_path / mode / "checkpoint" / "model.pt"))
    (a, wa), (b, wb) = runs["off"], runs["on"]
    assert [r["prompt_ids"] for r in a] == [r["prompt_ids"] for r in b]
    for key in ("loss", "pg_loss", "kl", "clip_fraction"):
        assert [r[key] for r in a] == pytest.approx([r[key] for r in b], rel=1e-5, abs=1e-7), key
    assert a[0]["kl"] > 0 or a[1]["kl"] > 0
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-5, atol=1e-7)


def test_with_grads_equals_the_constructor_and_refuses_bad_features():
    rng = np.random.default_rng(5)
    fb = Feedback([4, 9], rng.integers(0, 2, (2, 3)).astype(float), rng.standard_normal((2, 3)), step=7,
                  lengths=rng.integers(1, 9, (2, 3)), answers=[["a", None, "b"], ["c", "c", None]],
                  token_entropy=rng.random((2, 3)))
    grads = rng.standard_normal((2, 3, 4)).astype(np.float32)
    ref = [0.5, -1.0, 0.0, 2.0]
    got = fb.with_grads(grads, ref)
    want = Feedback(fb.prompt_ids, fb.rewards, fb.advantages, 7, lengths=fb.lengths, grads=grads, ref_grad=ref,
                    answers=fb.answers, token_entropy=fb.token_entropy)
    for f in dataclasses.fields(Feedback):
        a, b = getattr(got, f.name), getattr(want, f.name)
        if isinstance(b, np.ndarray):
            assert a.dtype == b.dtype and np.array_equal(a, b) and not a.flags.writeable, f.name
        else:
            assert a == b, f.name
    grads[0, 0, 0] = 99.0                                    # a copy: the caller's array cannot reach it
    assert got.grads[0, 0, 0] != 99.0 and fb.grads is None
    with pytest.raises(ValueError, match=r"Feedback.grads has shape \(2, 2, 4\)"):
        fb.with_grads(np.zeros((2, 2, 4)))
    with pytest.raises(ValueError, match="Feedback.grads has NaN"):
        fb.with_grads(np.full((2, 3, 4), np.nan))
    with pytest.raises(ValueError, match="Feedback.ref_grad has d = 3"):
        fb.with_grads(np.zeros((2, 3, 4)), [1.0, 2.0, 3.0])
    assert fb.grads is None and fb.ref_grad is None


def test_the_timing_benchmark_pairs_steps_in_lockstep(tmp_path, cache, monkeypatch):
    # benchmarks/gradients.py's paired mode: configurations in lockstep threads at a frozen
    # policy see the same batches as plain at every step (what makes the per-step difference
    # a measure of the overhead). Structure only — no time is asserted.
    import sys
    from pathlib import Path

    from _tiny_train import TINY, tiny_config
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import gradients
    monkeypatch.setattr(gradients.tempfile, "tempdir", str(tmp_path))
    base = tiny_config(tmp_path / "unused", cache, **{**TINY, "eval_every": 10**9, "grad_dim": 32})
    result = gradients.paired_steps(base, ["plain", "diem", "dvc"], rounds=2, steps=3, skip=1)
    rows = result["rows"]
    assert rows["plain"]["median_diff_s"] == 0.0 and rows["plain"]["same_batches"]
    assert rows["diem"]["same_batches"] and len(rows["diem"]["round_diffs_s"]) == 2
    assert all(np.isfinite(rows[n]["overhead"]) for n in rows)
    assert list(tmp_path.glob("rlpace-grad-*")) == []                 # each run's directory removed
