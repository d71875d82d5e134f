"""rlpace.optim: IsoSpectral (arXiv 2607.19331), ChainedOptimizer, build_optimizer.

References are computed independently: numpy SVDs for the polar retraction, autograd
through W = U·diag(Σ)·Vᵀ for the chain rule, a hand-written SGD step for one ISO step."""

from __future__ import annotations

import io

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from rlpace.optim import (ChainedOptimizer, IsoSpectral, build_optimizer, frame_gradients,  # noqa: E402
                          polar, project_tangent)


def mlp(dtype=torch.float64, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.Tanh(), torch.nn.Linear(5, 9),
                               torch.nn.Tanh(), torch.nn.Linear(9, 3)).to(dtype)


def loss_at(net, step, dtype):
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(16, 7, generator=g, dtype=dtype)
    y = torch.randn(16, 3, generator=g, dtype=dtype)
    return (net(x) - y).square().mean()


def train(net, opt, steps, start=0, dtype=torch.float64):
    for t in range(start, start + steps):
        opt.zero_grad()
        loss_at(net, t, dtype).backward()
        opt.step()


def _tangent(xm, z):
    """z projected on the tangent space of the Stiefel manifold at the frame xm (numpy reference)."""
    m = xm.T @ z
    return z - xm @ (m + m.T) / 2


def _polar(a):
    """The orthogonal polar factor of a, from its SVD (numpy reference)."""
    p, _, qt = np.linalg.svd(a, full_matrices=False)
    return p @ qt


@pytest.mark.parametrize("base,kw", [("adamw", dict(lr=3e-2)),
                                     ("muon", dict(lr=3e-2, adjust_lr_fn="match_rms_adamw"))])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_spectrum_kept_and_frames_orthonormal_after_100_steps(base, kw, dtype):
    net = mlp(dtype)
    mats = [m.weight for m in net if isinstance(m, torch.nn.Linear)]
    s0 = [torch.linalg.svdvals(w.detach().double()) for w in mats]
    w0 = [w.detach().clone() for w in mats]
    b0 = [m.bias.detach().clone() for m in net if isinstance(m, torch.nn.Linear)]
    opt = IsoSpectral(net, base, **kw)
    assert opt.managed == ["0.weight", "2.weight", "4.weight"]
    train(net, opt, 100, dtype=dtype)
    for w, s, w_init in zip(mats, s0, w0):
        s_now = torch.linalg.svdvals(w.detach().double())
        # relative to the largest singular value: float32 rounding of W is ~1e-7 of ‖W‖
        assert float((s_now - s).abs().max() / s[0]) < 1e-6
        assert float((w.detach() - w_init).abs().max()) > 1e-2            # it did move
    for name, (u, s, v) in opt.frames().items():
        q = s.numel()
        assert float((u.T @ u - torch.eye(q, dtype=u.dtype)).abs().max()) < 1e-8
        assert float((v.T @ v - torch.eye(q, dtype=v.dtype)).abs().max()) < 1e-8
    # unmanaged 1-D biases are stepped by the base optimizer as usual
    for m, b in zip([m for m in net if isinstance(m, torch.nn.Linear)], b0):
        assert float((m.bias.detach() - b).abs().max()) > 1e-3


def test_chain_rule_gradient_equals_autograd_through_the_parametrisation():
    torch.manual_seed(1)
    m, n = 6, 4
    u = polar(torch.randn(m, n, dtype=torch.float64)).requires_grad_()
    v = polar(torch.randn(n, n, dtype=torch.float64)).requires_grad_()
    s = torch.tensor([3.0, 2.0, 0.5, 0.1], dtype=torch.float64)
    x = torch.randn(10, n, dtype=torch.float64)

    def f(w):
        return torch.sin(x @ w.T).sum() + (w ** 3).sum()

    w = (u * s) @ v.T
    f(w).backward()
    w_leaf = ((u * s) @ v.T).detach().requires_grad_()
    f(w_leaf).backward()
    gu, gv = frame_gradients(w_leaf.grad, u.detach(), s, v.detach())
    assert torch.allclose(gu, u.grad, atol=1e-12, rtol=0)
    assert torch.allclose(gv, v.grad, atol=1e-12, rtol=0)


def test_one_step_equals_a_hand_written_riemannian_sgd_step():
    """base = plain SGD: U' = polar(U − η·Π_U(G·V·Σ)), V' likewise, W' = U'·Σ·V'ᵀ, with the
    projection and the polar factor computed here in numpy."""
    net = torch.nn.Linear(5, 3, bias=False).double()
    w0 = net.weight.detach().numpy().copy()
    lr = 0.1
    opt = IsoSpectral(net, lambda groups: torch.optim.SGD(groups, lr=lr))
    x = torch.randn(4, 5, dtype=torch.float64)
    net(x).pow(2).sum().backward()
    g = net.weight.grad.numpy().copy()
    opt.step()

    uu, ss, vt = np.linalg.svd(w0, full_matrices=False)
    vv = vt.T

    u1 = _polar(uu - lr * _tangent(uu, g @ vv * ss))
    v1 = _polar(vv - lr * _tangent(vv, g.T @ uu * ss))
    assert np.abs(net.weight.detach().numpy() - (u1 * ss) @ v1.T).max() < 1e-12


def test_polar_retraction_removes_a_normal_step_exactly():
    torch.manual_seed(2)
    u = polar(torch.randn(8, 3, dtype=torch.float64))
    a = torch.randn(3, 3, dtype=torch.float64)
    step = u @ (1e-2 * (a + a.T))                  # normal to St(8, 3) at u
    assert float((polar(u + step) - u).abs().max()) < 1e-13
    assert float(project_tangent(u, step).abs().max()) < 1e-15
    # QR (the third-party default) moves the frame by O(ε) instead
    q, r = torch.linalg.qr(u + step)
    q = q * torch.sign(torch.diagonal(r))
    assert float((q - u).abs().max()) > 1e-4


@pytest.mark.parametrize("base,kw", [("adamw", dict(lr=1e-2)), ("muon", dict(lr=1e-2)),
                                     ("adamw", dict(lr=1e-2, frame_dtype=torch.float32))])
def test_exact_resume(base, kw):
    dtype = torch.float32
    ref = mlp(dtype, seed=3)
    opt = IsoSpectral(ref, base, **kw)
    train(ref, opt, 4, dtype=dtype)
    buf = io.BytesIO()
    torch.save({"model": ref.state_dict(), "opt": opt.state_dict()}, buf)
    train(ref, opt, 4, start=4, dtype=dtype)

    new = mlp(dtype, seed=3)                        # the base model, as a trainer rebuilds it
    opt2 = IsoSpectral(new, base, **kw)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    new.load_state_dict(saved["model"])
    opt2.load_state_dict(saved["opt"])
    train(new, opt2, 4, start=4, dtype=dtype)
    for a, b in zip(ref.parameters(), new.parameters()):
        assert torch.equal(a, b)
    for (u, _, v), (u2, _, v2) in zip(opt.frames().values(), opt2.frames().values()):
        assert torch.equal(u, u2) and torch.equal(v, v2)


def test_load_state_dict_rejects_a_foreign_state_and_changes_nothing():
    net = mlp()
    opt = IsoSpectral(net, "adamw", lr=1e-2)
    before = [p.detach().clone() for p in net.parameters()]
    plain = torch.optim.AdamW(mlp().parameters(), lr=1e-2).state_dict()
    with pytest.raises(ValueError, match="IsoSpectral frames"):
        opt.load_state_dict(plain)
    other = IsoSpectral(torch.nn.Sequential(torch.nn.Linear(7, 5)).double(), "adamw", lr=1e-2).state_dict()
    with pytest.raises(ValueError):
        opt.load_state_dict(other)
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters()))


def test_bad_arguments_raise_value_errors():
    with pytest.raises(ValueError, match="base must be"):
        IsoSpectral(mlp(), "sgd", lr=1e-2)
    with pytest.raises(ValueError, match="only 2-D"):
        IsoSpectral(mlp(), "adamw", manage=lambda n, p: True)
    with pytest.raises(ValueError, match="torch.optim.Optimizer"):
        IsoSpectral(mlp(), lambda groups: object())
    flat = [torch.nn.Parameter(torch.zeros(12)), torch.nn.Parameter(torch.zeros(3))]   # FSDP1-style shards
    with pytest.raises(ValueError, match="no 2-D parameter"):
        IsoSpectral(flat, "adamw", lr=1e-3)


def test_default_rule_skips_embeddings_and_tied_head_of_a_qwen2():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.Qwen2Config(vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(cfg)
    opt = IsoSpectral(model, "adamw", lr=1e-3)
    assert sorted(n.split(".")[-2] for n in opt.managed) == sorted(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    emb = model.get_input_embeddings().weight.detach().clone()
    ids = torch.arange(10)[None]
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    assert float((model.get_input_embeddings().weight.detach() - emb).abs().max()) > 0   # AdamW stepped it


def test_chained_optimizer_shares_lr_and_round_trips_its_state():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    opt = build_optimizer("muon", net, lr=1e-2)
    assert isinstance(opt, ChainedOptimizer)
    assert [len(g["params"]) for g in opt.param_groups] == [2, 2]
    for g in opt.param_groups:
        g["lr"] = 5e-3
    assert opt.optimizers[0].param_groups[0]["lr"] == 5e-3 and opt.optimizers[1].param_groups[0]["lr"] == 5e-3
    x = torch.randn(3, 4)
    for _ in range(2):
        opt.zero_grad()
        net(x).sum().backward()
        opt.step()
    sd = opt.state_dict()
    assert sorted(sd["state"]) == [0, 1, 2, 3]
    opt2 = build_optimizer("muon", net, lr=1e-2)
    opt2.load_state_dict(sd)
    assert opt2.param_groups[0]["lr"] == 5e-3
    assert torch.equal(opt2.optimizers[0].state[net[0].weight]["momentum_buffer"],
                       opt.optimizers[0].state[net[0].weight]["momentum_buffer"])
    opt2.param_groups[1]["lr"] = 1.0                 # still shared after a load
    assert opt2.optimizers[1].param_groups[0]["lr"] == 1.0
    with pytest.raises(ValueError, match="one of"):
        build_optimizer("sgd", net, lr=1e-2)


# ---- the built-in trainer: optimizer=adamw|iso_adamw|muon|iso_muon -----------------------
TINY = dict(tasks="embedded:max2,last3", train_per_domain=16, heldout_per_domain=8, hidden=32, layers=1,
            heads=2, warmup_steps=200, warmup_batch=32, warmup_mistakes="last3=0.5", batch_prompts=4,
            group_size=4, max_new_tokens=3, eval_every=5, checkpoint_every=0, progress=False, lr=1e-3,
            lr_warmup=0, steps=5)


def _hidden_spectra(state: dict) -> dict:
    return {k: torch.linalg.svdvals(v.double()) for k, v in state.items()
            if v.ndim == 2 and "embed" not in k and "lm_head" not in k}


@pytest.mark.parametrize("name", ["adamw", "iso_adamw", "muon", "iso_muon"])
def test_trainer_runs_five_steps_with_each_optimizer(tmp_path, cache, name):
    pytest.importorskip("transformers")
    from rlpace.train import TrainConfig, train
    from rlpace.train.model import load_policy

    torch.set_num_threads(1)
    cfg = TrainConfig(**{**TINY, "cache_dir": cache, "out": str(tmp_path / name), "optimizer": name})
    summary = train(cfg)
    assert summary["steps"] == 5
    base, _ = load_policy(summary["model_dir"], "cpu")
    s0 = _hidden_spectra(base.state_dict())
    trained = torch.load(tmp_path / name / "checkpoint" / "model.pt", weights_only=True)
    s1 = _hidden_spectra(trained)
    moved = max(float((trained[k] - v).abs().max()) for k, v in base.state_dict().items() if k in s0)
    assert moved > 1e-5
    err = max(float((s1[k] - s0[k]).abs().max() / s0[k][0]) for k in s0)
    if name.startswith("iso"):
        assert err < 1e-6                          # every hidden matrix kept its base spectrum
    else:
        assert err > 1e-5                          # the plain optimizers change it


def test_trainer_resume_with_iso_adamw_is_exact(tmp_path, cache):
    import dataclasses
    import json
    from pathlib import Path

    from rlpace.train import TrainConfig, train

    torch.set_num_threads(1)
    common = {**TINY, "cache_dir": cache, "optimizer": "iso_adamw", "checkpoint_every": 3, "eval_every": 10}
    full = TrainConfig(**{**common, "out": str(tmp_path / "full"), "steps": 6})
    train(full)
    part = TrainConfig(**{**common, "out": str(tmp_path / "part"), "steps": 3})
    train(part)
    train(dataclasses.replace(part, steps=6, resume=True))

    def recs(c):
        return [json.loads(x) for x in Path(c.out, "metrics.jsonl").read_text().splitlines()
                if x.strip() and not json.loads(x).get("final")]
    for ra, rb in zip(recs(full)[3:], recs(part)[3:]):
        assert ra["prompt_ids"] == rb["prompt_ids"] and ra["loss"] == rb["loss"]
    ma = torch.load(Path(full.out, "checkpoint", "model.pt"), weights_only=True)
    mb = torch.load(Path(part.out, "checkpoint", "model.pt"), weights_only=True)
    assert all(torch.equal(ma[k], mb[k]) for k in ma)


def test_trainer_rejects_an_unknown_optimizer(tmp_path, cache):
    from rlpace.train import TrainConfig, train
    with pytest.raises(ValueError, match="optimizer must be one of"):
        train(TrainConfig(**{**TINY, "cache_dir": cache, "out": str(tmp_path / "x"), "optimizer": "sgd"}))
    assert not (tmp_path / "x").exists()


# ---- TRL: RlpaceGRPOTrainer(..., optimizers=(IsoSpectral(model, ...), None)) --------------
def _trl_run(lm, out, steps, resume=None):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    from rlpace import Scheduler
    from rlpace.adapters.trl import RlpaceGRPOTrainer, pool_from_dataset

    data = Dataset.from_list([{"prompt": f"what is {i} plus 3?", "index": i, "data_source": "math"} for i in range(8)])

    def reward(prompts, completions, index, trainer_state, **kw):
        return [float((i * 7 + j + trainer_state.global_step) % 3 == 0) for j, i in enumerate(index)]

    model = AutoModelForCausalLM.from_pretrained(lm)
    opt = IsoSpectral(model, "adamw", lr=1e-3)
    cfg = GRPOConfig(output_dir=str(out), use_cpu=True, bf16=False, report_to="none", seed=0,
                     per_device_train_batch_size=4, num_generations=2, max_completion_length=4,
                     max_steps=steps, logging_steps=1, save_strategy="steps", save_steps=2, beta=0.0,
                     dataloader_num_workers=0, gradient_checkpointing=False, learning_rate=1e-3,
                     lr_scheduler_type="constant")   # runs of 2 and 4 steps share one schedule
    trainer = RlpaceGRPOTrainer(model=model, reward_funcs=reward, args=cfg, train_dataset=data,
                                processing_class=AutoTokenizer.from_pretrained(lm), optimizers=(opt, None),
                                scheduler=Scheduler(pool_from_dataset(data), "uniform", seed=0))
    trainer.train(resume_from_checkpoint=resume)
    return model, opt


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
def test_trl_trainer_uses_iso_and_resumes_exactly(tmp_path):
    pytest.importorskip("trl")
    from transformers import AutoModelForCausalLM

    from _tiny_lm import build_tiny_lm

    torch.set_num_threads(1)
    lm = build_tiny_lm(tmp_path / "lm", [f"what is {i} plus 3?" for i in range(8)])
    base = AutoModelForCausalLM.from_pretrained(lm)
    model, opt = _trl_run(lm, tmp_path / "full", 4)
    assert len(opt.managed) == 14                   # 2 layers × q,k,v,o,gate,up,down
    b_sd, m_sd = base.state_dict(), model.state_dict()
    for name in opt.managed:
        s0 = torch.linalg.svdvals(b_sd[name].double())
        s1 = torch.linalg.svdvals(m_sd[name].double())
        assert float((s1 - s0).abs().max() / s0[0]) < 1e-6
    assert max(float((m_sd[n] - b_sd[n]).abs().max()) for n in opt.managed) > 1e-5
    # the frames travel through the Trainer's own checkpoint channel (optimizer.pt): a fresh
    # IsoSpectral on the base model, loaded from checkpoint-2, rebuilds its weights bit for bit
    from safetensors.torch import load_file
    ck = tmp_path / "full" / "checkpoint-2"
    saved = torch.load(ck / "optimizer.pt", weights_only=True)
    fresh_model = AutoModelForCausalLM.from_pretrained(lm)
    fresh = IsoSpectral(fresh_model, "adamw", lr=1e-3)
    fresh.load_state_dict(saved)
    weights = load_file(str(ck / "model.safetensors"))
    f_sd = fresh_model.state_dict()
    assert all(torch.equal(f_sd[n], weights[n]) for n in opt.managed)
    # and TRL resumes from it (TRL's own resume is not bit-exact on CPU even with plain AdamW:
    # 3e-3 max weight difference after 4 steps in this setup, the same with ISO)
    resumed, _ = _trl_run(lm, tmp_path / "full", 4, resume=str(ck))
    r_sd = resumed.state_dict()
    for name in opt.managed:
        s0 = torch.linalg.svdvals(b_sd[name].double())
        assert float((torch.linalg.svdvals(r_sd[name].double()) - s0).abs().max() / s0[0]) < 1e-6


# ---- a non-finite gradient: the step is skipped, the optimizer stays usable ---------------
def _snapshot(net, opt):
    """Everything a step can change: weights, frames, and the base optimizer's state."""
    sd = opt.state_dict()
    flat = [p.detach().clone() for p in net.parameters()]
    flat += [x.clone() for key in ("u", "v", "sigma") for x in sd["iso"][key]]
    flat += [v.clone() for st in sd["state"].values() for v in st.values() if isinstance(v, torch.Tensor)]
    flat += [torch.tensor(float(v)) for st in sd["state"].values() for v in st.values()
             if not isinstance(v, torch.Tensor)]
    return flat


@pytest.mark.parametrize("base,kw", [("adamw", dict(lr=1e-2)),
                                     ("muon", dict(lr=1e-2, adjust_lr_fn="match_rms_adamw"))])
@pytest.mark.parametrize("where,value", [("2.weight", float("nan")), ("2.weight", float("inf")),
                                         ("4.bias", float("-inf"))])
def test_non_finite_gradient_skips_the_step_and_the_next_step_is_the_fresh_one(base, kw, where, value):
    net, twin = mlp(seed=5), mlp(seed=5)
    opt, opt_twin = IsoSpectral(net, base, **kw), IsoSpectral(twin, base, **kw)
    train(net, opt, 3)
    train(twin, opt_twin, 3)
    before = _snapshot(net, opt)
    opt.zero_grad()
    loss_at(net, 3, torch.float64).backward()
    dict(net.named_parameters())[where].grad[1, ...].view(-1)[0] = value      # one poisoned entry
    with pytest.warns(RuntimeWarning, match=f"gradient of '{where}' holds NaN or inf"):
        opt.step()
    assert opt.skipped_steps == 1
    after = _snapshot(net, opt)
    assert len(before) == len(after) and all(torch.equal(a, b) for a, b in zip(before, after))
    # the next steps with finite gradients are the steps of an optimizer that never saw it
    train(net, opt, 2, start=3)
    train(twin, opt_twin, 2, start=3)
    assert all(torch.equal(a, b) for a, b in zip(net.parameters(), twin.parameters()))
    for (u, s, v), (u2, s2, v2) in zip(opt.frames().values(), opt_twin.frames().values()):
        assert torch.equal(u, u2) and torch.equal(v, v2) and torch.isfinite(u).all()
    assert float((net[2].weight.detach() - before[2]).abs().max()) > 1e-4   # and it did move
    assert opt.state_dict()["iso"]["skipped_steps"] == 1


@pytest.mark.parametrize("eps", [0.0, 1e-9, 1e-5, 1e-3, 1e-2, 0.05, 0.5, "ill"])
def test_polar_equals_numpys_svd_polar_factor_on_every_route(eps):
    """Newton–Schulz (‖XᵀX − I‖ ≤ 0.1), eigh of XᵀX, and the SVD for cond X > 1e4; batched."""
    g = np.random.default_rng(7)
    xs = []
    for _ in range(3):
        q, _ = np.linalg.qr(g.standard_normal((40, 6)))
        if eps == "ill":
            x = q * np.array([1, 1, 1, 1, 1, 1e-6])
        else:
            x = q + eps * g.standard_normal((40, 6))
        xs.append(x)
    x = np.stack(xs)
    a, _, bt = np.linalg.svd(x, full_matrices=False)
    want = a @ bt
    got = polar(torch.from_numpy(x)).numpy()
    assert np.abs(got - want).max() < 1e-12
    assert np.abs(polar(torch.from_numpy(x[1])).numpy() - want[1]).max() < 1e-12


@pytest.mark.parametrize("base,kw", [("adamw", dict(lr=3e-2)),
                                     ("muon", dict(lr=3e-2, adjust_lr_fn="match_rms_adamw"))])
def test_float32_frames_keep_the_spectrum_to_float32_rounding(base, kw):
    """frame_dtype=float32: after 100 steps every spectrum is the base's within 2e-6 of σ_max
    (float32 rounding, not drift: it is re-retracted every step), frames orthonormal to 2e-6."""
    net = mlp(torch.float32)
    mats = [m.weight for m in net if isinstance(m, torch.nn.Linear)]
    s0 = [torch.linalg.svdvals(w.detach().double()) for w in mats]
    opt = IsoSpectral(net, base, frame_dtype=torch.float32, **kw)
    train(net, opt, 100, dtype=torch.float32)
    for w, s in zip(mats, s0):
        assert float((torch.linalg.svdvals(w.detach().double()) - s).abs().max() / s[0]) < 2e-6
    for u, s, v in opt.frames().values():
        assert u.dtype == torch.float32
        eye = torch.eye(s.numel())
        assert float((u.T @ u - eye).abs().max()) < 2e-6 and float((v.T @ v - eye).abs().max()) < 2e-6
    with pytest.raises(ValueError, match="frame_dtype"):
        IsoSpectral(net, base, frame_dtype=torch.float16, **kw)


def test_batched_step_equals_a_per_matrix_numpy_sgd_step_with_some_gradients_missing():
    """Stacked frames and one retraction for all frames of one q: a model whose managed
    matrices come in three shapes (two of them twice) and share q = 4 or 3, one matrix without
    a gradient; the 4 × 6 matrices are stepped as their 6 × 4 transposes, in the 6 × 4 ones'
    stack. Each matrix with a gradient moves exactly as the per-matrix numpy SGD step
    (projection, SVD polar factor); the one without keeps its weight and frames bit for bit."""
    torch.manual_seed(3)
    net = torch.nn.Sequential(torch.nn.Linear(4, 6, bias=False), torch.nn.Linear(6, 4, bias=False),
                              torch.nn.Linear(4, 6, bias=False), torch.nn.Linear(6, 4, bias=False),
                              torch.nn.Linear(4, 3, bias=False)).double()
    lr = 0.05
    opt = IsoSpectral(net, lambda groups: torch.optim.SGD(groups, lr=lr))
    assert [len(idx) for idx in opt._by_shape] == [4, 1]
    w0 = [m.weight.detach().numpy().copy() for m in net]
    frozen = {n: tuple(x.clone() for x in f) for n, f in opt.frames().items() if n == "2.weight"}
    net(torch.randn(8, 4, dtype=torch.float64)).square().sum().backward()
    net[2].weight.grad = None                      # e.g. a layer outside this step's graph
    grads = [None if m.weight.grad is None else m.weight.grad.numpy().copy() for m in net]
    opt.step()

    for k, (w, g) in enumerate(zip(w0, grads)):
        got = net[k].weight.detach().numpy()
        if g is None:
            assert np.array_equal(got, w)
            u, s, v = opt.frames()["2.weight"]
            assert all(torch.equal(a, b) for a, b in zip((u, s, v), frozen["2.weight"]))
            continue
        uu, ss, vt = np.linalg.svd(w, full_matrices=False)
        vv = vt.T
        u1 = _polar(uu - lr * _tangent(uu, g @ vv * ss))
        v1 = _polar(vv - lr * _tangent(vv, g.T @ uu * ss))
        assert np.abs(got - (u1 * ss) @ v1.T).max() < 1e-12, k
        assert np.abs(got - w).max() > 1e-4, k     # it moved


def test_the_trainer_keeps_frames_in_the_models_dtype_below_float64():
    """build_optimizer: float32 frames for a float32 (or bf16) model, float64 for a float64 one."""
    from rlpace.optim._build import build_optimizer as build
    for dtype, want in ((torch.float32, torch.float32), (torch.bfloat16, torch.float32),
                        (torch.float64, torch.float64)):
        net = mlp(dtype)
        for name in ("iso_adamw", "iso_muon"):
            opt = build(name, net, lr=1e-3)
            assert {u.dtype for u, _, _ in opt.frames().values()} == {want}, (dtype, name)


# ---- batched per-shape steps against the per-matrix reference ---------------------------
def _shapes_net(dtype=torch.float32, seed=4):
    """Managed matrices in three shapes, two of them three times (as a model's layers repeat)."""
    torch.manual_seed(seed)
    layers = []
    for _ in range(3):
        layers += [torch.nn.Linear(6, 10), torch.nn.Tanh(), torch.nn.Linear(10, 6), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(6, 4)).to(dtype)


@pytest.mark.parametrize("kw", [dict(lr=2e-2, weight_decay=0.1, adjust_lr_fn="match_rms_adamw"),
                                dict(lr=1e-2, weight_decay=0.0, nesterov=False)])
def test_batched_muon_equals_torch_muon_with_gradients_missing_and_a_resume(kw):
    """BatchedMuon (one Newton–Schulz loop per shape) against torch.optim.Muon (a loop per
    matrix), fed the same gradients for 8 steps, one of which leaves two matrices without a
    gradient, with a state dict round trip in the middle: momentum buffers bit for bit,
    weights bit for bit but in under 1 % of all their entries, those within 1e-4: bfloat16
    `baddbmm` and `addmm` round a few entries of β·C + A·B differently (one bfloat16 ulp of
    an update entry of size ≤ 1, 2⁻⁷, times the step size ≈ 1.3e-2).
    (Gradients from a loss would let such a rounding flip later bfloat16 roundings, the
    chaos of any bfloat16 Muon, so the gradients here are fixed.)"""
    from rlpace.optim._muon import BatchedMuon
    nets = [_shapes_net(), _shapes_net()]
    mats = [[p for p in net.parameters() if p.ndim == 2] for net in nets]
    ref, got = torch.optim.Muon(mats[0], **kw), BatchedMuon(mats[1], **kw)
    for t in range(8):
        g = torch.Generator().manual_seed(200 + t)
        for a, b in zip(*mats):
            a.grad = torch.randn(a.shape, generator=g)
            b.grad = a.grad.clone()
        if t == 2:
            for k in (0, 3):
                mats[0][k].grad = mats[1][k].grad = None
        ref.step()
        got.step()
        if t == 3:
            buf = io.BytesIO()
            torch.save(got.state_dict(), buf)
            got = BatchedMuon(mats[1], **kw)
            got.load_state_dict(torch.load(io.BytesIO(buf.getvalue())))
    for a, b in zip(*mats):
        assert torch.equal(ref.state[a]["momentum_buffer"], got.state[b]["momentum_buffer"])
    mats = [[p.detach() for p in ps] for ps in mats]
    w0 = [p.detach() for p in _shapes_net().parameters() if p.ndim == 2]
    for a, b, a0 in zip(mats[0], mats[1], w0):
        assert float((a - b).abs().max()) < 1e-4
        assert float((a - a0).abs().max()) > 1e-2                                # they moved
    differ = sum(int((a != b).sum()) for a, b in zip(*mats))
    assert differ < 0.01 * sum(a.numel() for a in mats[0])


def test_projected_frame_gradients_from_one_q_by_q_product_equal_the_two_projections():
    """Π_U(G·V·Σ) and Π_V(Gᵀ·U·Σ) from M = Uᵀ·G·V alone equal `project_tangent` applied to
    `frame_gradients`, per matrix of a stack (random frames, float64, to 1e-12)."""
    from rlpace.optim._iso import _riemannian_frame_gradients
    torch.manual_seed(5)
    g = torch.randn(3, 7, 4, dtype=torch.float64)
    u = polar(torch.randn(3, 7, 4, dtype=torch.float64))
    v = polar(torch.randn(3, 4, 4, dtype=torch.float64))
    s = torch.rand(3, 4, dtype=torch.float64) + 0.5
    gu, gv = _riemannian_frame_gradients(g, u, s, v, project=True)
    for b in range(3):
        ru, rv = frame_gradients(g[b], u[b], s[b], v[b])
        assert float((gu[b] - project_tangent(u[b], ru)).abs().max()) < 1e-12
        assert float((gv[b] - project_tangent(v[b], rv)).abs().max()) < 1e-12
    raw = _riemannian_frame_gradients(g, u, s, v, project=False)
    assert torch.allclose(raw[0][1], frame_gradients(g[1], u[1], s[1], v[1])[0], atol=1e-14, rtol=0)


@pytest.mark.parametrize("m, n", [(40, 8), (8, 40), (12, 12)])
def test_projected_frame_gradients_contract_the_short_side(m, n):
    """The multiply-adds of the chain rule and both projections, counted from the batched
    products torch runs: G·V and Gᵀ·U (2·m·n·q), M = Uᵀ·G·V over the short side of G
    (min(m, n)·q² = q³, not m·q² for a tall G) and the two corrections U·S, V·S'
    ((m + n)·q²); the result still equals `project_tangent` of `frame_gradients`."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from rlpace.optim._iso import _riemannian_frame_gradients

    class CountProducts(TorchDispatchMode):
        macs = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in (torch.ops.aten.bmm.default, torch.ops.aten.baddbmm.default):
                a, b = args[:2] if func is torch.ops.aten.bmm.default else args[1:3]
                CountProducts.macs += a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2]
            return func(*args, **(kwargs or {}))

    torch.manual_seed(6)
    q, batch = min(m, n), 2
    g = torch.randn(batch, m, n, dtype=torch.float64)
    u, v = polar(torch.randn(batch, m, q, dtype=torch.float64)), polar(torch.randn(batch, n, q, dtype=torch.float64))
    s = torch.rand(batch, q, dtype=torch.float64) + 0.5
    with CountProducts():
        gu, gv = _riemannian_frame_gradients(g, u, s, v, project=True)
    assert CountProducts.macs == batch * (2 * m * n * q + q ** 3 + (m + n) * q * q)
    for b in range(batch):
        ru, rv = frame_gradients(g[b], u[b], s[b], v[b])
        assert float((gu[b] - project_tangent(u[b], ru)).abs().max()) < 1e-12
        assert float((gv[b] - project_tangent(v[b], rv)).abs().max()) < 1e-12


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_iso_adamw_on_stacked_frames_equals_a_per_frame_adamw(dtype, fused):
    """base="adamw" steps each shape's frames as one stack (AdamW's moments stacked too) and
    the unmanaged parameters (the biases) in the same functional AdamW call; a per-frame
    torch AdamW (foreach off, a loop over the frames; its fused kernel with fused=True)
    through the same ISO step is the reference: 6 steps with a step where two matrices have
    no gradient (their group goes frame by frame, their step counts fall behind), steps where
    the biases' group has its own lr (a second call) and a state dict round trip; weights,
    biases and frames equal to rounding, and each saved frame keeps its own step count."""
    kw = dict(lr=3e-2, betas=(0.9, 0.99), weight_decay=0.01)
    nets = [_shapes_net(dtype), _shapes_net(dtype)]
    fast = IsoSpectral(nets[0], "adamw", frame_dtype=dtype, fused=fused, **kw)
    ref = IsoSpectral(nets[1], lambda groups: torch.optim.AdamW(groups, foreach=False, fused=fused or None, **kw),
                      frame_dtype=dtype)
    assert fast.param_groups[0]["fused"] is fused and fast.param_groups[0]["foreach"] is not fused
    for t in range(6):
        for opt in (fast, ref):
            opt.param_groups[1]["lr"] = 1e-2 if t in (4, 5) else kw["lr"]
        for net, opt in zip(nets, (fast, ref)):
            opt.zero_grad()
            loss_at_shapes = (net(torch.randn(16, 6, generator=torch.Generator().manual_seed(300 + t), dtype=dtype))
                              .square().mean())
            loss_at_shapes.backward()
            if t == 2:
                net[0].weight.grad = net[4].weight.grad = None
            opt.step()
        if t == 3:
            sd = fast.state_dict()
            steps = [float(st["step"]) for st in sd["state"].values()]
            assert len({id(st["step"]) for st in sd["state"].values()}) == len(sd["state"])
            assert min(steps) == 3 and max(steps) == 4        # the two matrices sat one step out
            buf = io.BytesIO()
            torch.save(sd, buf)
            fast = IsoSpectral(nets[0], "adamw", frame_dtype=dtype, fused=fused, **kw)
            fast.load_state_dict(torch.load(io.BytesIO(buf.getvalue())))
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    for (n, (u, s, v)), (_, (ru, rs, rv)) in zip(fast.frames().items(), ref.frames().items()):
        assert float((u - ru).abs().max()) < tol and float((v - rv).abs().max()) < tol, n
    for a, b in zip(nets[0].parameters(), nets[1].parameters()):
        assert float((a - b).abs().max()) < tol
    # both paths ran: the shape whose frames' step counts differ (the 10 × 6 matrices and the
    # 6 × 10 ones, stepped as their transposes) went frame by frame, the 4 × 6 one (as 6 × 4)
    # as a stack, whose moments are rows of one tensor
    assert [len(idx) for idx in fast._by_shape] == [6, 1]
    assert (0, 0) not in fast._adam_stacks and {(1, 0), (1, 1)} <= set(fast._adam_stacks)
    rows = [fast.base.state[fast._u[i]]["exp_avg"] for i in fast._by_shape[1]]     # flipped: U is side 1
    assert all(r._base is fast._adam_stacks[(1, 1)]["moments"][0] for r in rows)


def test_batched_newton_schulz_equals_a_per_matrix_loop():
    """newton_schulz_batched on a stack of tall and of wide matrices against Muon's quintic
    iteration written here matrix by matrix (bfloat16, X ← X/‖X‖_F in the wide orientation,
    five times A = X·Xᵀ, X ← a·X + (b·A + c·A²)·X): equal in all but a few entries, those
    within one bfloat16 rounding; the result is near-orthogonal (singular values in the
    iteration's band, 0.5–1.5)."""
    from rlpace.optim._muon import newton_schulz_batched
    a, b, c = 3.4445, -4.7750, 2.0315
    torch.manual_seed(6)
    for shape in ((5, 12, 8), (4, 8, 12)):
        g = torch.randn(shape)
        got = newton_schulz_batched(g, (a, b, c), 5, 1e-7)
        for k in range(shape[0]):
            x = g[k].bfloat16()
            x = x.T if x.shape[0] > x.shape[1] else x
            x = x / x.norm()
            for _ in range(5):
                gram = x @ x.T
                x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
            want = x.T if shape[1] > shape[2] else x
            diff = (got[k].float() - want.float()).abs()
            assert float(diff.max()) <= 2 ** -7 and int((diff > 0).sum()) <= 2, (shape, k)
            sv = torch.linalg.svdvals(got[k].float())
            assert float(sv.min()) > 0.5 and float(sv.max()) < 1.5


def test_newton_schulz_iterations_follow_the_exact_error_recursion():
    """X with XᵀX = R·diag(1 + e)·Rᵀ: after k coupled Newton–Schulz iterations the columns of
    X·Z have Gram eigenvalues 1 − s_k, s ← s²·(3 + s)/4 from s₀ = −e (the scalar recursion,
    run here in a loop), within ((3 + δ)/4)^(2^k − 1)·δ^(2^k) of 1 for δ = ‖XᵀX − I‖_F;
    `_newton_iterations` takes the fewest k under that bound: 2 (the plain δ^(2^k) bound:
    3) for float32 frames at δ = 0.012 and 0.02, 3 (plain: 4) for float64 at δ = 0.011."""
    from rlpace.optim._iso import _inverse_sqrt_newton_schulz, _newton_iterations
    g = np.random.default_rng(9)
    q_, _ = np.linalg.qr(g.standard_normal((40, 6)))
    r, _ = np.linalg.qr(g.standard_normal((6, 6)))
    e = np.array([0.008, -0.006, 0.004, -0.003, 0.002, 0.001])
    x = torch.from_numpy(q_ @ r @ np.diag(np.sqrt(1 + e)) @ r.T)
    a = x.T @ x
    delta = float(torch.linalg.matrix_norm(a - torch.eye(6, dtype=torch.float64)))
    for k in (1, 2):
        out = x @ _inverse_sqrt_newton_schulz(a, torch.eye(6, dtype=torch.float64), k)
        s = -e
        for _ in range(k):
            s = s * s * (3 + s) / 4
        got = np.sort(np.linalg.eigvalsh((out.T @ out).numpy()))
        assert np.abs(got - np.sort(1 - s)).max() < 1e-15
        assert np.abs(got - 1).max() <= ((3 + delta) / 4) ** (2 ** k - 1) * delta ** (2 ** k)
    assert [_newton_iterations(d, torch.float32) for d in (0.0, 1e-5, 0.012, 0.02, 0.05)] == [0, 1, 2, 2, 3]
    assert [_newton_iterations(d, torch.float64) for d in (1e-5, 0.011, 0.1)] == [2, 3, 4]


def test_binomial_series_retraction_meets_its_bound_with_fewer_products():
    """X with XᵀX = R·diag(1 + e)·Rᵀ near the manifold: `_inverse_sqrt_near_identity` takes
    the binomial series Σ_{j≤n} C(−1/2, j)·E^j of the lowest degree n whose bound meets the
    target (float32 at δ ≈ 0.004: n = 2, one q × q product where Newton–Schulz needs three);
    the Gram eigenvalues of X·Z equal (1 + e)·Z_n(e)² from the scalar series summed here,
    within the bound of 1, and X·Z is numpy's SVD polar factor to that accuracy."""
    from math import comb

    from rlpace.optim._iso import NEWTON_TARGET, _inverse_sqrt_near_identity, _series_degree
    g = np.random.default_rng(10)
    q_, _ = np.linalg.qr(g.standard_normal((40, 6)))
    r, _ = np.linalg.qr(g.standard_normal((6, 6)))
    for e, dt, want_n in ((np.array([0.003, -0.002, 0.001, -0.001, 0.0005, 0.0]), torch.float32, 2),
                          (np.array([0.008, -0.006, 0.004, -0.003, 0.002, 0.001]), torch.float32, 3),
                          (np.array([1e-6, -2e-6, 3e-6, 0.0, 1e-6, -1e-6]), torch.float64, 2)):
        x = torch.from_numpy(q_ @ r @ np.diag(np.sqrt(1 + e)) @ r.T)
        eye = torch.eye(6, dtype=torch.float64)
        a = x.T @ x
        delta = float(torch.linalg.matrix_norm(a - eye))
        n = _series_degree(delta, dt)
        assert n == want_n
        z = _inverse_sqrt_near_identity(a[None], (a - eye)[None], eye, delta, dt)[0]    # float64 arithmetic
        zn = sum((-1) ** j * comb(2 * j, j) / 4 ** j * e ** j for j in range(n + 1))
        got = np.sort(np.linalg.eigvalsh(((x @ z).T @ (x @ z)).numpy()))
        assert np.abs(got - np.sort((1 + e) * zn ** 2)).max() < 1e-15
        assert np.abs(got - 1).max() <= NEWTON_TARGET[dt] + 4e-15        # + float64 rounding
        assert np.abs((x @ z).numpy() - _polar(x.numpy())).max() <= NEWTON_TARGET[dt] + 4e-15
