"""Per-rollout gradient features (rlpace.train.gradfeatures) against exact per-rollout
`backward()` calls, and the Feedback.grads / ref_grad channel's validation."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from _tiny_train import TINY as _TINY, tiny_config                 # noqa: E402
from rlpace import Feedback, Pool, Scheduler                       # noqa: E402
from rlpace.train.gradfeatures import GradFeatures, select_linears  # noqa: E402
from rlpace.train.losses import policy_loss                         # noqa: E402
from rlpace.train.rollout import Rollout, completion_logprobs       # noqa: E402


def _model(tied: bool, seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    cfg = Qwen2Config(vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=tied, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(seed)
    m = Qwen2ForCausalLM(cfg).double()
    m.train()
    return m


def _rollouts(n=6, p=4, t=5, seed=1):
    g = torch.Generator().manual_seed(seed)
    p_ids = torch.randint(3, 40, (n, p), generator=g)
    p_mask = torch.ones(n, p, dtype=torch.long)
    p_mask[0, :2] = 0                                           # left padding
    c_ids = torch.randint(3, 40, (n, t), generator=g)
    c_mask = torch.ones(n, t)
    c_mask[1, 3:] = 0                                           # a short completion
    adv = torch.randn(n, generator=g, dtype=torch.float64)
    return Rollout(p_ids, p_mask, c_ids, c_mask), adv


def _loss(model, ro, adv, weight):
    logp = completion_logprobs(model, ro, 1.0, group_size=1)
    mask = ro.completion_mask.double()
    keep = torch.ones(len(adv), dtype=torch.float64)
    return policy_loss("grpo", logp, logp.detach(), adv, mask, keep, weight).loss


@pytest.mark.parametrize("grad_params, tied", [("lm_head", False), ("last_block", True), ("all", False)])
def test_features_equal_projected_exact_per_rollout_gradients(grad_params, tied):
    model = _model(tied)
    ro, adv = _rollouts()
    n = len(adv)
    gf = GradFeatures(model, grad_params, grad_dim=96, seed=3)
    for l in gf.layers:                                          # the model is float64
        l.p_in.data, l.p_out.data = l.p_in.double(), l.p_out.double()
    with gf.capture():
        loss = _loss(model, ro, adv, torch.ones(n, dtype=torch.float64))
    feats = gf.features(loss, n)                                 # [n, d]
    assert feats.shape == (n, gf.dim) and gf.dim <= 96
    weights = [l.module.weight for l in gf.layers]
    exact = []
    for i in range(n):                                           # the loop of single-rollout backward()
        model.zero_grad(set_to_none=True)
        onehot = torch.zeros(n, dtype=torch.float64)
        onehot[i] = 1.0
        _loss(model, ro, adv, onehot).backward()
        exact.append(gf.project([w.grad for w in weights]))
    exact = torch.stack(exact)
    if tied and grad_params == "lm_head":
        pytest.skip("tied lm_head: W.grad includes the embedding part")
    np.testing.assert_allclose(feats.numpy(), exact.numpy(), rtol=1e-4, atol=1e-6)
    # the rows sum to the batch gradient's feature (unit weights)
    model.zero_grad(set_to_none=True)
    loss.backward()
    np.testing.assert_allclose(feats.sum(0).numpy(), gf.project([w.grad for w in weights]).numpy(),
                               rtol=1e-4, atol=1e-6)


def test_layer_selection_and_dimension():
    model = _model(tied=False)
    assert [n for n, _ in select_linears(model, "lm_head")] == ["lm_head"]
    last = [n for n, _ in select_linears(model, "last_block")]
    assert len(last) == 7 and all(n.startswith("model.layers.1.") for n in last)
    assert len(select_linears(model, "all")) == 15              # 7 per block × 2 + lm_head
    gf = GradFeatures(model, "lm_head", grad_dim=64)
    # one layer, budget 64: k_o = 8, k_i = min(8, 16) = 8
    assert gf.dim == 64
    gf = GradFeatures(model, "last_block", grad_dim=70)
    # budget 10 per layer: k_o = 3, k_i = 3 → 9 each, 63 in all
    assert gf.dim == 63
    with pytest.raises(ValueError, match="grad_params"):
        GradFeatures(model, "embeddings")
    with pytest.raises(ValueError, match="grad_dim"):
        GradFeatures(model, "lm_head", grad_dim=0)


def test_features_refuse_shared_prefix_rows():
    model = _model(tied=False)
    ro, adv = _rollouts(n=4)
    ro = Rollout(ro.prompt_ids[:1].repeat(4, 1), ro.prompt_mask[:1].repeat(4, 1), ro.completion_ids,
                 ro.completion_mask)
    gf = GradFeatures(model, "last_block", grad_dim=32)
    with gf.capture():
        logp = completion_logprobs(model, ro, 1.0, group_size=4)    # one prompt forward for 4 rows
        loss = -(logp * adv[:, None]).sum()
    with pytest.raises(ValueError, match="one per rollout"):
        gf.features(loss, 4)


def test_shared_prefix_mode_covers_completion_positions_of_lm_head():
    # With the shared-prompt forward, lm_head's first completion token comes from the prompt
    # forward (skipped). For a loss without the first token the features are then exact.
    model = _model(tied=False)
    ro, adv = _rollouts(n=6)
    ro = Rollout(ro.prompt_ids[::3].repeat_interleave(3, 0), torch.ones(6, 4, dtype=torch.long),
                 ro.completion_ids, ro.completion_mask)
    gf = GradFeatures(model, "lm_head", grad_dim=48, seed=1)
    for l in gf.layers:
        l.p_in.data, l.p_out.data = l.p_in.double(), l.p_out.double()

    def loss_of(weight, group):
        logp = completion_logprobs(model, ro, 1.0, group_size=group)[:, 1:]        # tokens 1.. only
        return -(weight[:, None] * adv[:, None] * logp).sum()

    with gf.capture():
        loss = loss_of(torch.ones(6, dtype=torch.float64), 3)
    feats = gf.features(loss, 6, shared_prefix=True)
    exact = []
    for i in range(6):
        model.zero_grad(set_to_none=True)
        onehot = torch.zeros(6, dtype=torch.float64)
        onehot[i] = 1.0
        loss_of(onehot, 1).backward()
        exact.append(gf.project([model.lm_head.weight.grad]))
    np.testing.assert_allclose(feats.numpy(), torch.stack(exact).numpy(), rtol=1e-4, atol=1e-6)


def _grouped(n=6, g=3):
    """Rollouts in groups of g sharing a prompt (the first group's left-padded), a short
    completion and one with no token at all (its first token is masked)."""
    ro, adv = _rollouts(n=n)
    c_mask = ro.completion_mask.clone()
    c_mask[4] = 0
    return Rollout(ro.prompt_ids[::g].repeat_interleave(g, 0), ro.prompt_mask[::g].repeat_interleave(g, 0),
                   ro.completion_ids, c_mask), adv


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_lm_head_features_over_the_shared_prompt_forward_are_exact(temperature):
    # The shared prompt forward (one head call per group) plus the first token's closed-form
    # share equals a loop of single-rollout backward() calls over per-row forwards — with a
    # clipped objective (π_old ≠ π), a temperature, left padding and an empty completion.
    from rlpace.train.gradfeatures import FirstToken
    model = _model(tied=False)
    ro, adv = _grouped()
    n = len(adv)
    gf = GradFeatures(model, "lm_head", grad_dim=48, seed=2)
    for l in gf.layers:
        l.p_in.data, l.p_out.data = l.p_in.double(), l.p_out.double()
    with torch.no_grad():
        old = completion_logprobs(model, ro, temperature, 1)
    old = old + 0.3 * torch.randn(old.shape, generator=torch.Generator().manual_seed(5), dtype=old.dtype)
    keep = torch.ones(n, dtype=torch.float64)

    def loss_of(weight, group):
        logp, z0 = completion_logprobs(model, ro, temperature, group_size=group, first_logits=True)
        return z0, policy_loss("grpo", logp, old, adv, ro.completion_mask.double(), keep, weight,
                               clip_low=0.2, clip_high=0.2).loss

    with gf.capture():
        z0, loss = loss_of(torch.ones(n, dtype=torch.float64), 3)
    assert sum(pa.shape[0] == 2 for _, pa, _ in gf._calls) == 1        # the prompt ran once per group
    assert z0.shape == (n, 1, 40)
    feats = gf.features(loss, n, first_token=FirstToken(z0))
    exact = []
    for i in range(n):
        model.zero_grad(set_to_none=True)
        onehot = torch.zeros(n, dtype=torch.float64)
        onehot[i] = 1.0
        loss_of(onehot, 1)[1].backward()
        exact.append(gf.project([model.lm_head.weight.grad]))
    exact = torch.stack(exact)
    assert exact[4].abs().max() == 0 and exact.abs().sum() > 0
    np.testing.assert_allclose(feats.numpy(), exact.numpy(), rtol=1e-4, atol=1e-6)
    # packed (one forward per group over [prompt | its completions], one head call split by
    # FirstToken.prompt_len): the same features
    with gf.capture():
        logp, z0 = completion_logprobs(model, ro, temperature, group_size=3, first_logits=True, packed=True)
        loss = policy_loss("grpo", logp, old, adv, ro.completion_mask.double(), keep,
                           torch.ones(n, dtype=torch.float64), clip_low=0.2, clip_high=0.2).loss
    assert [pa.shape[:2] for _, pa, _ in gf._calls] == [(2, ro.prompt_ids.shape[1] + 3 * ro.completion_ids.shape[1])]
    packed = gf.features(loss, n, first_token=FirstToken(z0, ro.prompt_ids.shape[1]))
    np.testing.assert_allclose(packed.numpy(), exact.numpy(), rtol=1e-4, atol=1e-6)
    # without the first token's share (the approximate shared_prefix mode) rows with a first
    # token differ: the term is not negligible
    with gf.capture():
        _, loss = loss_of(torch.ones(n, dtype=torch.float64), 3)
    approx = gf.features(loss, n, shared_prefix=True)
    assert not np.allclose(approx.numpy(), exact.numpy(), rtol=1e-2, atol=1e-4)


def test_first_token_term_refuses_what_it_cannot_make_exact():
    from rlpace.train.gradfeatures import FirstToken
    model = _model(tied=False)
    ro, adv = _grouped()
    gf = GradFeatures(model, "lm_head", grad_dim=16)
    # a model that soft-caps its logits after the head (as Gemma 2 does): the first token's
    # logits are not the head's output, so b_i would be the capped logits' gradient — refused
    cap = model.register_forward_hook(lambda mod, inp, out: out.__setitem__("logits", 5 * torch.tanh(out.logits / 5)))
    with gf.capture():
        logp, z0 = completion_logprobs(model, ro, 1.0, group_size=3, first_logits=True)
        loss = -(logp * adv[:, None]).sum()
    cap.remove()
    with pytest.raises(ValueError, match="not the first token's logits"):
        gf.features(loss, 6, first_token=FirstToken(z0))
    # the per-row path has no shared prompt forward: no first-token logits to return
    assert completion_logprobs(model, ro, 1.0, group_size=1, first_logits=True)[1] is None
    # inner layers over the shared prompt forward have no such term: still refused
    gf = GradFeatures(model, "last_block", grad_dim=16)
    with gf.capture():
        logp, z0 = completion_logprobs(model, ro, 1.0, group_size=3, first_logits=True)
        loss = -(logp * adv[:, None]).sum()
    with pytest.raises(ValueError, match="one per rollout"):
        gf.features(loss, 6, first_token=FirstToken(z0))


# ---- the channel: Feedback.grads / ref_grad --------------------------------------------------
def test_feedback_grads_validated_and_stored_float32_readonly():
    g = np.arange(12, dtype=np.float64).reshape(2, 2, 3)
    fb = Feedback([0, 1], [[1, 0], [0, 1]], grads=g, ref_grad=[1.0, 0.0, -1.0], step=0)
    assert fb.grads.dtype == np.float32 and fb.grads.shape == (2, 2, 3) and not fb.grads.flags.writeable
    g[0, 0, 0] = np.nan                                          # a copy: the caller cannot change it
    assert fb.grads[0, 0, 0] == 0.0
    assert fb.ref_grad.tolist() == [1.0, 0.0, -1.0]
    for kw, msg in [({"grads": np.ones((2, 3, 3))}, "Feedback.grads has shape"),
                    ({"grads": np.ones((2, 2))}, "Feedback.grads has shape"),
                    ({"grads": np.ones((2, 2, 0))}, "Feedback.grads has shape"),
                    ({"grads": np.full((2, 2, 1), np.inf)}, "Feedback.grads has NaN"),
                    ({"grads": np.full((2, 2, 1), 1e39)}, "float32"),
                    ({"grads": [["a"]]}, "Feedback.grads holds strings"),
                    ({"ref_grad": np.ones((2, 2))}, "Feedback.ref_grad must be 1-D"),
                    ({"grads": np.ones((2, 2, 3)), "ref_grad": np.ones(4)}, "d = 4 but Feedback.grads has d = 3"),
                    ({"ref_grad": [np.nan]}, "Feedback.ref_grad has NaN")]:
        with pytest.raises(ValueError, match=msg):
            Feedback([0, 1], [[1, 0], [0, 1]], step=0, **kw)
    assert Feedback([], np.zeros((0, 2)), grads=np.zeros((0, 2, 5)), step=0).grads.shape == (0, 2, 5)


def test_scheduler_passes_grads_to_policies_and_bad_grads_leave_state_unchanged():
    pool = Pool(["a", "b"] * 4)
    s = Scheduler(pool, "dvc", window=3)
    before = {k: np.array(v) for k, v in s.state_dict().items()}
    with pytest.raises(ValueError, match="Feedback.grads"):
        s.observe(Feedback([0, 1], [[1, 0], [0, 1]], grads=np.ones((2, 2)), step=0))
    for k, v in s.state_dict().items():
        np.testing.assert_array_equal(v, before[k])
    g = np.zeros((2, 2, 2))
    g[0, 0], g[1, 0] = [1, 0], [-1, 0]                             # opposite: cos = −1 for both
    s.observe(Feedback([0, 1], [[1, 0], [0, 1]], grads=g, step=0))
    np.testing.assert_allclose(s.states["mixture"].sums[0], [0.0, 0.0])    # influence, not |A|


# ---- the built-in trainer produces them ------------------------------------------------------
TINY = dict(_TINY, steps=3, loss_probe_per_domain=4, grad_dim=32)


def _cfg(tmp_path, cache, **kw):
    return tiny_config(tmp_path / "run", cache, **{**TINY, **kw})


def _spy(monkeypatch):
    """Record every Feedback the Scheduler observes and every (fb, weights) of token_weights."""
    observed, weighted = [], []
    real_obs, real_tw = Scheduler.observe, Scheduler.token_weights

    def observe(self, fb):
        observed.append(fb)
        return real_obs(self, fb)

    def token_weights(self, fb, probs, mask):
        w = real_tw(self, fb, probs, mask)
        weighted.append((fb, w, mask))
        return w

    monkeypatch.setattr(Scheduler, "observe", observe)
    monkeypatch.setattr(Scheduler, "token_weights", token_weights)
    return observed, weighted


def test_trainer_diem_weights_come_from_the_features_and_reach_the_loss(tmp_path, cache, monkeypatch):
    from rlpace.policies._diem import constrained_weights, diem_importance
    from rlpace.train import train
    from rlpace.train.recipes import grpo
    observed, weighted = _spy(monkeypatch)
    losses = []
    real_loss = grpo.policy_loss

    def policy_loss(objective, logp, old, adv, mask, keep, weight=None, **kw):
        losses.append(None if weight is None else weight.detach().clone())
        return real_loss(objective, logp, old, adv, mask, keep, weight, **kw)

    scaled = []                                 # the weights that scale the backward at the log-probs
    real_scale = grpo.logp_grad_scale

    def logp_grad_scale(objective, weight, mask):
        scaled.append(weight.detach().clone())
        return real_scale(objective, weight, mask)

    monkeypatch.setattr(grpo, "policy_loss", policy_loss)
    monkeypatch.setattr(grpo, "logp_grad_scale", logp_grad_scale)
    train(_cfg(tmp_path, cache, policy="diem", policy_kwargs='{"importance": "loo"}', grad_reference="none"))
    assert len(weighted) == 3
    for fb, w, mask in weighted:
        assert fb.grads is not None and fb.grads.shape[:2] == fb.rewards.shape and fb.ref_grad is None
        f = fb.grads.astype(np.float64).sum(axis=1)                       # [B, d] group features
        expect = constrained_weights(f, diem_importance("loo", f, None, np.zeros(len(f))))
        expect = np.maximum(expect, 0)
        q = np.linalg.norm(expect @ f)
        expect = expect * np.linalg.norm(f.sum(0)) / q if q > 0 and expect.any() else np.ones(len(f))
        np.testing.assert_allclose(w[:, :, 0][mask[:, :, 0]].reshape(-1),
                                   np.repeat(expect, fb.rewards.shape[1])[mask[:, :, 0].reshape(-1)],
                                   rtol=1e-5)
    # the loss is evaluated once per step, at unit weights (the features pass); the weights
    # reach the gradient: epoch 0's backward starts at the log-probs scaled by them (that
    # c ⊙ ∂L₁/∂logp is the weighted loss's gradient: test_gradfeatures_speed.py)
    assert len(losses) == 3 and all(x is not None and bool((x == 1).all()) for x in losses)
    assert len(scaled) == 3
    for (fb, w, mask), sw in zip(weighted, scaled):
        np.testing.assert_allclose(sw.numpy(), w.reshape(sw.shape), rtol=1e-6)
    # every generated group observed once; the trained ones with their features
    assert sum(fb.batch_size for fb in observed) == sum(fb.batch_size for fb, _, _ in weighted) + \
        sum(fb.batch_size for fb in observed if fb.grads is None)


def test_trainer_dvc_heldout_reference_and_exact_resume(tmp_path, cache):
    import dataclasses
    import json
    from pathlib import Path

    from rlpace.train import train
    full = _cfg(tmp_path / "full", cache, steps=4, checkpoint_every=3, policy="dvc", grad_ref_every=2)
    train(full)
    part = _cfg(tmp_path / "part", cache, steps=3, checkpoint_every=3, policy="dvc", grad_ref_every=2)
    train(part)
    state = json.loads(Path(part.out, "checkpoint", "state.json").read_text())
    # lm_head, grad_dim 32: k_o = isqrt(32) = 5, k_i = 32 // 5 = 6 → d = 30; the reference is checkpointed
    assert len(state["counters"]["grad_ref"]) == 30
    train(dataclasses.replace(part, steps=4, resume=True))
    recs = [[json.loads(x) for x in Path(c.out, "metrics.jsonl").read_text().splitlines() if x.strip()]
            for c in (full, part)]
    a, b = ([r for r in rs if not r.get("final")] for rs in recs)
    assert [r["prompt_ids"] for r in a] == [r["prompt_ids"] for r in b]
    assert a[3]["loss"] == pytest.approx(b[3]["loss"], abs=1e-6)
    assert any(k.startswith("sched/dvc/value/") for k in a[3])
    with np.load(Path(full.out, "checkpoint", "scheduler.npz")) as za, \
            np.load(Path(part.out, "checkpoint", "scheduler.npz")) as zb:
        assert all(np.array_equal(za[k], zb[k]) for k in za.files)


def test_trainer_computes_no_features_for_other_policies(tmp_path, cache, monkeypatch):
    from rlpace.train import train
    from rlpace.train.recipes import grpo
    built = []
    monkeypatch.setattr(grpo, "GradFeatures", lambda *a, **k: built.append(a))
    observed, _ = _spy(monkeypatch)
    train(_cfg(tmp_path, cache, steps=1, policy="dump"))
    assert built == [] and all(fb.grads is None for fb in observed)


def test_trainer_shared_prefix_features_run(tmp_path, cache, monkeypatch):
    from rlpace.train import train
    _, weighted = _spy(monkeypatch)
    train(_cfg(tmp_path, cache, steps=3, policy="diem", grad_exact=False, grad_params="last_block"))
    for fb, _, _ in weighted:
        informative = fb.rewards.std(axis=1) > 0                     # A ≠ 0: a non-zero gradient
        assert fb.grads is not None
        assert ((np.abs(fb.grads).sum(axis=(1, 2)) > 0) == informative).all(), fb.rewards


def test_trainer_exact_lm_head_features_use_the_shared_prompt_forward(tmp_path, cache, monkeypatch):
    # grad_exact (default) with lm_head: no per-row forward any more (exactness: the test above);
    # last_block keeps one forward of [prompt | completion] per rollout.
    from rlpace.train import train
    from rlpace.train.recipes import grpo
    groups, firsts = [], []
    real_lp, real_feats = grpo.completion_logprobs, GradFeatures.features

    def completion_logprobs(model, r, temperature=1.0, group_size=1, first_logits=False, packed=False):
        groups.append(group_size)
        return real_lp(model, r, temperature, group_size, first_logits, packed)

    def features(self, loss, n_rows, shared_prefix=False, first_token=None, wrt=()):
        firsts.append(first_token is not None)
        return real_feats(self, loss, n_rows, shared_prefix, first_token, wrt)

    monkeypatch.setattr(grpo, "completion_logprobs", completion_logprobs)
    monkeypatch.setattr(GradFeatures, "features", features)
    train(_cfg(tmp_path / "head", cache, steps=2, policy="diem", grad_reference="none"))
    assert groups and set(groups) == {4} and firsts == [True, True]
    groups.clear(), firsts.clear()
    train(_cfg(tmp_path / "block", cache, steps=2, policy="diem", grad_reference="none", grad_params="last_block"))
    assert 1 in groups and firsts == [False, False]


def test_trainers_read_the_signals_a_policy_declares_not_its_name():
    """`DataPolicy.reads` decides what the recipe computes: gradient features for diem/dvc (also
    chained or renamed) and for a user policy that declares them; the oracle measurement for
    the oracle_* tools; neither for a plain method."""
    from rlpace.policies import chain, compose, make_policy
    from rlpace.train.gradfeatures import needs_grad_features
    from rlpace.train.sampling import uses_oracle
    pool = Pool(["a"] * 4)
    renamed = make_policy("diem")._replace(name="my_weights")
    chained = chain(make_policy("per_advantage"), renamed)
    assert chained.reads == frozenset({"grads"})
    for method, grads, oracle in [("dvc", True, False), (compose(chained), True, False),
                                  ("oracle_boundary", False, True), ("dump+mopps", False, False)]:
        s = Scheduler(pool, method)
        assert needs_grad_features(s, "auto") is grads and uses_oracle(s) is oracle, method
    assert needs_grad_features(Scheduler(pool, "dump"), "on") is True


def test_the_heldout_reference_is_computed_only_for_a_policy_that_reads_it(tmp_path, cache, monkeypatch):
    # diem's published rule and leave-one-out ignore Feedback.ref_grad, dvc's reward fallback
    # needs no features at all: the recipe computes neither for them (the held-out reference
    # costs a per-row forward and backward of the held-out answers every grad_ref_every steps)
    from rlpace.policies import make_policy
    from rlpace.train import train
    from rlpace.train.gradfeatures import needs_ref_grad
    from rlpace.train.recipes import grpo
    pool = Pool(["a"] * 4)
    assert make_policy("diem").reads == frozenset({"grads"})
    assert make_policy("diem", importance="reference").reads == frozenset({"grads", "ref_grad"})
    assert make_policy("dvc").reads == frozenset({"grads", "ref_grad"})
    assert make_policy("dvc", signal="reward").reads == frozenset()
    assert not needs_ref_grad(Scheduler(pool, "diem")) and needs_ref_grad(Scheduler(pool, "dvc"))
    refs, real = [], grpo.heldout_reference

    def heldout_reference(*a, **k):
        refs.append(1)
        return real(*a, **k)

    monkeypatch.setattr(grpo, "heldout_reference", heldout_reference)
    observed, _ = _spy(monkeypatch)
    kw = dict(steps=2, grad_ref_every=1, grad_reference="heldout")
    train(_cfg(tmp_path / "batch", cache, policy="diem", **kw))
    assert refs == [] and all(fb.ref_grad is None for fb in observed)
    assert any(fb.grads is not None for fb in observed)
    train(_cfg(tmp_path / "ref", cache, policy="diem", policy_kwargs='{"importance": "reference"}', **kw))
    assert refs == [1, 1] and any(fb.ref_grad is not None for fb in observed)
    observed.clear()
    train(_cfg(tmp_path / "reward", cache, policy="dvc", policy_kwargs='{"signal": "reward"}', **kw))
    assert refs == [1, 1] and observed and all(fb.grads is None for fb in observed)
