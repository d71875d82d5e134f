"""rlpace.merge and `rlpace merge`: ISO-Merger (arXiv 2607.19331), task arithmetic, TIES.

The matrix rule is checked against a numpy loop written here from the paper's App. E
description (mode-by-mode sign alignment, projection, mask, Gram solve, polar retraction);
the checkpoint path against self-merge identities, the base spectra, transformers loading
and generating, and bad inputs that must fail before anything is written."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from rlpace.cli import main  # noqa: E402
from rlpace.errors import InputError  # noqa: E402
from rlpace.merge import iso_merge_matrix, merge_checkpoints, task_arithmetic, ties  # noqa: E402
from rlpace.merge._checkpoint import _iso_stack  # noqa: E402
from rlpace.merge._methods import iso_merge_matrix_gram  # noqa: E402


def numpy_iso(w0, ws, rho=0.9, ridge=1e-12):
    u0, s0, v0t = np.linalg.svd(w0, full_matrices=False)
    v0 = v0t.T
    q = len(s0)
    keep = max(1, int(round(rho * q)))

    def proj(x, z):
        m = x.T @ z
        return z - x @ (m + m.T) / 2

    xus, xvs, effects = [], [], []
    for w in ws:
        u, _, vt = np.linalg.svd(w, full_matrices=False)
        v = vt.T.copy()
        u = u.copy()
        for k in range(q):                       # one mode at a time
            if u0[:, k] @ u[:, k] < 0:
                u[:, k] *= -1
                v[:, k] *= -1
        xu, xv = proj(u0, u - u0), proj(v0, v - v0)
        xu[:, keep:] = 0
        xv[:, keep:] = 0
        xus.append(xu)
        xvs.append(xv)
        effects.append(xu @ np.diag(s0) @ v0.T + u0 @ np.diag(s0) @ xv.T)
    k_ = len(ws)
    gram = np.array([[np.sum(effects[i] * effects[j]) for j in range(k_)] for i in range(k_)])
    c = np.clip(np.linalg.solve(gram + ridge * np.eye(k_), np.diag(gram)), 0, 1.5)

    def polar(a):
        p, _, qt = np.linalg.svd(a, full_matrices=False)
        return p @ qt
    us = polar(u0 + proj(u0, sum(ci * x for ci, x in zip(c, xus))))
    vs = polar(v0 + proj(v0, sum(ci * x for ci, x in zip(c, xvs))))
    return us @ np.diag(s0) @ vs.T, c


def experts_of(w0, k, eps=0.05, seed=0):
    g = np.random.default_rng(seed)
    return [w0 + eps * np.abs(w0).mean() * g.standard_normal(w0.shape) for _ in range(k)]


@pytest.mark.parametrize("shape", [(9, 6), (5, 8)])
def test_iso_matrix_matches_a_numpy_reference(shape):
    g = np.random.default_rng(1)
    w0 = g.standard_normal(shape)
    ws = experts_of(w0, 3)
    want, c_want = numpy_iso(w0, ws)
    got, c = iso_merge_matrix(torch.from_numpy(w0), [torch.from_numpy(w) for w in ws])
    assert np.abs(got.numpy() - want).max() < 1e-12
    assert np.abs(c - c_want).max() < 1e-10
    np.testing.assert_allclose(np.linalg.svd(got.numpy(), compute_uv=False),
                               np.linalg.svd(w0, compute_uv=False), rtol=1e-12)


def test_self_merge_identities():
    g = np.random.default_rng(2)
    w0 = torch.from_numpy(g.standard_normal((8, 6)))
    e = torch.from_numpy(experts_of(w0.numpy(), 1, seed=3)[0])
    # the base with itself: no frame motion, c = 0, W★ = W₀
    w, c = iso_merge_matrix(w0, [w0])
    assert c.tolist() == [0.0] and float((w - w0).abs().max()) < 1e-12
    # an expert with itself equals the expert alone: the merged weight is the same, and the two
    # coefficients add up to the one expert's. How the sum splits between two identical experts
    # is not determined (their Gram matrix is singular; the ridge leaves the split off 0.5 by
    # rounding, 1.3e-6 on one platform), so the test asserts the sum and the weight only.
    w1, c1 = iso_merge_matrix(w0, [e])
    w2, c2 = iso_merge_matrix(w0, [e, e])
    assert abs(c1[0] - 1.0) < 1e-9 and abs(c2.sum() - c1[0]) < 1e-9
    assert float((w1 - w2).abs().max()) < 1e-10 * float(w0.abs().max())
    # ρ_keep = 1 and an expert that moved only its frames (fixed spectrum) by a tangent step ξ:
    # the merge retracts U₀ + ξ, i.e. rebuilds the expert exactly
    u0, s0, v0t = torch.linalg.svd(w0, full_matrices=False)
    xi = 0.01 * torch.from_numpy(g.standard_normal(u0.shape))
    m = u0.T @ xi
    xi = xi - u0 @ (m + m.T) / 2
    a, _, bh = torch.linalg.svd(u0 + xi, full_matrices=False)
    ue = a @ bh
    expert = (ue * s0) @ v0t
    w3, _ = iso_merge_matrix(w0, [expert], rho_keep=1.0)
    # Π_U₀(U_e − U₀) = ξ − O(‖ξ‖²) normal residue removed → agreement to second order
    assert float((w3 - expert).abs().max()) < 1e-3 * float(w0.abs().max())
    # baselines: one expert at scale 1 / density 1 is the expert
    assert torch.allclose(task_arithmetic(w0, [e]), e, atol=1e-15)
    assert torch.allclose(ties(w0, [e], density=1.0), e, atol=1e-15)


def test_stacked_matrices_merge_one_by_one():
    g = np.random.default_rng(4)
    w0 = torch.from_numpy(g.standard_normal((3, 5, 4)))
    ws = [w0 + 0.05 * torch.from_numpy(g.standard_normal((3, 5, 4))) for _ in range(2)]
    got, cs = _iso_stack(w0, ws, 0.9)
    for i in range(3):
        want, c = iso_merge_matrix_gram(w0[i], [w[i] for w in ws])
        assert torch.equal(got[i], want) and cs[i] == [float(x) for x in c]
        exact, c_exact = iso_merge_matrix(w0[i], [w[i] for w in ws])
        assert float((got[i] - exact).abs().max()) < 1e-12 and np.abs(c - c_exact).max() < 1e-10


@pytest.mark.parametrize("shape,k,eps", [((9, 6), 1, 0.05), ((9, 6), 3, 0.05), ((5, 8), 2, 0.05),
                                         ((64, 64), 2, 0.01), ((300, 40), 2, 0.01), ((40, 300), 2, 1e-3)])
def test_gram_route_equals_the_svd_route(shape, k, eps):
    """The streamed Gram route (what `rlpace merge` runs) against the LAPACK-SVD rule, which
    the numpy reference above pins: tall, wide and square, 1–3 experts, row blocks of 7."""
    g = np.random.default_rng(5)
    w0 = torch.from_numpy(g.standard_normal(shape))
    ws = [w0 + eps * torch.from_numpy(g.standard_normal(shape)) for _ in range(k)]
    want, c_want = iso_merge_matrix(w0, ws)
    got, c = iso_merge_matrix_gram(w0, ws, block_rows=7)
    assert float((got - want).abs().max() / want.abs().max()) < 1e-12
    # c solves a K × K system as ill-conditioned as the experts are alike (eps 1e-3: 3e-10)
    assert np.abs(c - c_want).max() < 1e-8
    # an ill-conditioned base (σ_min/σ_max = 1e-6) is left to the SVD route
    u, s, vh = torch.linalg.svd(w0, full_matrices=False)
    s[-1] = 1e-6 * s[0]
    assert iso_merge_matrix_gram((u * s) @ vh, ws) is None


# ---- checkpoints --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    from _tiny_lm import build_tiny_lm

    torch.set_num_threads(1)
    d = tmp_path_factory.mktemp("merge")
    lm = build_tiny_lm(d / "lm")
    base = AutoModelForCausalLM.from_pretrained(lm)
    base.save_pretrained(d / "base_sharded", max_shard_size="40KB")
    for f in (d / "lm").iterdir():
        if "token" in f.name:
            shutil.copy(f, d / "base_sharded" / f.name)
    for i in range(2):
        torch.manual_seed(10 + i)
        m = AutoModelForCausalLM.from_pretrained(lm)
        with torch.no_grad():
            for p in m.parameters():
                p.add_(1e-2 * p.std() * torch.randn_like(p))
        m.save_pretrained(d / f"e{i}")                      # single file: layouts may differ
    other = build_tiny_lm(d / "other_base", seed=7)           # same architecture, another base
    llama = build_tiny_lm(d / "llama", arch="llama")
    return dict(d=d, base=lm, sharded=d / "base_sharded", e0=d / "e0", e1=d / "e1", other=other, llama=llama)


def load_all(path):
    from safetensors.torch import load_file
    out = {}
    for f in sorted(path.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def test_merged_checkpoint_keeps_base_spectra_loads_and_generates(ckpts, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "merged"
    rc = main(["merge", "--base", str(ckpts["sharded"]), "--experts", str(ckpts["e0"]), str(ckpts["e1"]),
               "--out", str(out), "--no-progress"])
    assert rc == 0
    base, merged, e0 = load_all(ckpts["sharded"]), load_all(out), load_all(ckpts["e0"])
    assert set(merged) == set(base)
    moved = 0.0
    for n, w in merged.items():
        if w.ndim == 2:
            s0 = torch.linalg.svdvals(base[n].double())
            assert float((torch.linalg.svdvals(w.double()) - s0).abs().max() / s0[0]) < 1e-6
            moved = max(moved, float((w - base[n]).abs().max()))
        else:
            want = base[n].double() + ((load_all(ckpts["e0"])[n].double() - base[n].double())
                                       + (load_all(ckpts["e1"])[n].double() - base[n].double())) / 2
            assert torch.allclose(w.double(), want, atol=1e-6)
    assert moved > 1e-4 and set(e0) == set(base)
    # the base's shard layout, an index whose total size is what was written
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == sum(w.numel() * w.element_size() for w in merged.values())
    assert sorted(set(index["weight_map"].values())) == sorted(p.name for p in out.glob("*.safetensors"))
    coeffs = json.loads((out / "retention_coefficients.json").read_text())
    assert len(coeffs["tensors"]) == sum(1 for w in merged.values() if w.ndim == 2)
    assert all(0 <= c <= 1.5 and len(cs) == 2 for _, cs in coeffs["tensors"] for c in cs)
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    ids = tok("what is 3 plus", return_tensors="pt").input_ids
    gen = model.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=tok.pad_token_id)
    assert gen.shape == (1, ids.shape[1] + 3)


def test_base_with_itself_and_out_dtype(ckpts, tmp_path):
    s = merge_checkpoints(ckpts["sharded"], [ckpts["sharded"]], tmp_path / "self", progress=False)
    assert s["copy"] == 0 and s["frames"] + s["mean"] == s["tensors"]
    base, merged = load_all(ckpts["sharded"]), load_all(tmp_path / "self")
    for n, w in merged.items():                # W★ = W₀ up to float64 rounding, written as float32
        assert w.dtype == torch.float32
        assert float((w - base[n]).abs().max()) <= 1e-6 * float(base[n].abs().max())
    merge_checkpoints(ckpts["sharded"], [ckpts["sharded"]], tmp_path / "bf16", out_dtype="bfloat16",
                      progress=False)
    for n, w in load_all(tmp_path / "bf16").items():
        assert w.dtype == torch.bfloat16       # within half a bf16 step of the base
        tol = 2 ** -8 * base[n].abs() + 1e-6 * float(base[n].abs().max())
        assert bool(((w.float() - base[n]).abs() <= tol).all())
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"


@pytest.mark.parametrize("method", ["task_arithmetic", "ties"])
def test_baselines_on_checkpoints(ckpts, tmp_path, method):
    out = tmp_path / method
    merge_checkpoints(ckpts["base"], [ckpts["e0"]], out, method=method, density=1.0, progress=False)
    e0, merged = load_all(ckpts["e0"]), load_all(out)
    for n, w in merged.items():
        assert torch.allclose(w, e0[n], atol=1e-7), n


@pytest.mark.parametrize("case,message", [
    ("llama", "model_type"),
    ("other", "not a fine-tune of this base"),
    ("missing_shard", "missing shard"),
    ("out_not_empty", "not empty"),
    ("no_weights", "neither model.safetensors"),
])
def test_bad_input_fails_before_writing_anything(ckpts, tmp_path, capsys, case, message):
    base, experts, out = ckpts["base"], [str(ckpts["e0"])], tmp_path / "out"
    if case == "llama":
        experts.append(str(ckpts["llama"]))
    elif case == "other":
        experts.append(str(ckpts["other"]))
    elif case == "missing_shard":
        broken = tmp_path / "broken"
        shutil.copytree(ckpts["sharded"], broken)
        next(iter(sorted(broken.glob("*.safetensors")))).unlink()
        experts.append(str(broken))
    elif case == "out_not_empty":
        out.mkdir()
        (out / "keep.txt").write_text("mine")
    elif case == "no_weights":
        empty = tmp_path / "empty"
        empty.mkdir()
        (empty / "config.json").write_text("{}")
        experts.append(str(empty))
    rc = main(["merge", "--base", str(base), "--experts", *experts, "--out", str(out), "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("rlpace merge: error:") and message in err and "\n" not in err
    if case == "out_not_empty":
        assert [p.name for p in out.iterdir()] == ["keep.txt"]
    else:
        assert not out.exists()
    assert not list(tmp_path.glob("*.tmp-merge"))


def _poisoned_copy(src, dst, name, value):
    """A copy of checkpoint `src` with one entry of tensor `name` set to `value`."""
    from safetensors.torch import load_file, save_file
    shutil.copytree(src, dst)
    for f in dst.glob("*.safetensors"):
        tensors = load_file(str(f))
        if name in tensors:
            tensors[name].view(-1)[3] = value
            save_file(tensors, str(f), metadata={"format": "pt"})
            return f
    raise AssertionError(name)


@pytest.mark.parametrize("method", ["iso", "task_arithmetic", "ties"])
@pytest.mark.parametrize("who,name,value", [
    ("expert", "model.layers.1.mlp.down_proj.weight", float("nan")),
    ("expert", "model.norm.weight", float("inf")),
    ("base", "model.layers.0.self_attn.q_proj.weight", float("-inf")),
])
def test_non_finite_input_is_refused_for_every_method(ckpts, tmp_path, capsys, method, who, name, value):
    base, e0, e1, out = ckpts["sharded"], ckpts["e0"], ckpts["e1"], tmp_path / "out"
    if who == "expert":
        bad_file = _poisoned_copy(e1, tmp_path / "bad", name, value)
        e1 = tmp_path / "bad"
    else:
        bad_file = _poisoned_copy(base, tmp_path / "bad", name, value)
        base = tmp_path / "bad"
    rc = main(["merge", "--base", str(base), "--experts", str(e0), str(e1), "--out", str(out),
               "--method", method, "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("rlpace merge: error:") and "\n" not in err
    assert f"tensor {name!r} in {str(bad_file)!r} holds NaN or inf" in err
    assert not out.exists() and not list(tmp_path.glob("*.tmp-merge"))


def test_checkpoint_merge_equals_the_svd_route_tensor_by_tensor(ckpts, tmp_path):
    """`rlpace merge` (Gram route, streamed) against `iso_merge_matrix` (LAPACK SVDs) on every
    matrix of the tiny checkpoint, float32 output: equal up to float32 rounding."""
    out = tmp_path / "m"
    merge_checkpoints(ckpts["sharded"], [ckpts["e0"], ckpts["e1"]], out, out_dtype="float32", progress=False)
    base, e0, e1, merged = (load_all(p) for p in (ckpts["sharded"], ckpts["e0"], ckpts["e1"], out))
    coeffs = dict((n, c) for n, c in json.loads((out / "retention_coefficients.json").read_text())["tensors"])
    checked = 0
    for n, w in merged.items():
        if w.ndim == 2:
            want, c = iso_merge_matrix(base[n], [e0[n], e1[n]])
            assert float((w.double() - want).abs().max()) <= 2 ** -23 * float(want.abs().max()), n
            assert np.abs(np.array(coeffs[n]) - c).max() < 1e-10
            checked += 1
    assert checked == 16                           # 2 layers × 7 projections, embedding, head


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_chunked_baselines_equal_the_whole_tensor_rules(monkeypatch, dtype):
    """What `rlpace merge` runs for task arithmetic and TIES (flat chunks, bounded memory)
    against `task_arithmetic` / `ties` on the whole tensor, chunks of 97 elements."""
    from rlpace.merge import _checkpoint
    monkeypatch.setattr(_checkpoint, "_CHUNK", 97)
    g = torch.Generator().manual_seed(3)
    w0 = torch.randn(40, 25, generator=g).to(dtype)
    ws = [(w0.float() + 0.1 * torch.randn(40, 25, generator=g)).to(dtype) for _ in range(3)]
    for density in (0.2, 0.5, 1.0):
        want = ties(w0, ws, density=density, scale=0.7)
        got = _checkpoint._ties_chunked(w0, ws, density, 0.7, torch.float64)
        assert torch.equal(got, want), density
    want = task_arithmetic(w0, ws, scale=0.7)
    got = _checkpoint._chunked(lambda a, bs: task_arithmetic(a, bs, scale=0.7), w0, ws, torch.float64)
    assert torch.equal(got, want)


def test_float32_products_stay_within_1e6_of_the_svd_route(ckpts):
    """`blas_dtype=torch.float32` (what `rlpace merge` runs for a bf16 / fp16 output): every
    matrix of the tiny checkpoint against the LAPACK-SVD rule (bit-identical to the public
    iso_merger.py, docs/iso.md), before any output rounding. Measured: ≤ 6.4e-8 relative,
    coefficients to 2.4e-7 (W₀ᵀW₀ stays float64: with it in float32 too, one matrix here
    read 5.7e-6)."""
    base, e0, e1 = (load_all(p) for p in (ckpts["sharded"], ckpts["e0"], ckpts["e1"]))
    checked = 0
    for n, w0 in base.items():
        if w0.ndim != 2:
            continue
        want, c_want = iso_merge_matrix(w0, [e0[n], e1[n]])
        got, c = iso_merge_matrix_gram(w0, [e0[n], e1[n]], blas_dtype=torch.float32, block_rows=7)
        assert float((got - want).abs().max() / want.abs().max()) <= 1e-6, n
        assert np.abs(c - c_want).max() <= 1e-6, n
        # and the float64 route is still exact to 1e-12
        exact, _ = iso_merge_matrix_gram(w0, [e0[n], e1[n]], block_rows=7)
        assert float((exact - want).abs().max() / want.abs().max()) < 1e-12, n
        checked += 1
    assert checked == 16


def test_streamed_safetensors_file_reads_back(tmp_path):
    """The merge writes each tensor as soon as it exists (`_StreamingSafetensors`): the file
    reads back with safetensors' own reader, every dtype, shape and value as written."""
    from safetensors import safe_open

    from rlpace.merge._checkpoint import _StreamingSafetensors
    g = torch.Generator().manual_seed(0)
    tensors = {"a.weight": torch.randn(5, 3, generator=g).bfloat16(), "b": torch.randn(7, generator=g),
               "c.ids": torch.arange(6, dtype=torch.int64).reshape(2, 3), "d.empty": torch.zeros(0, 4),
               "e.scalar": torch.tensor(2.5, dtype=torch.float64), "f.mask": torch.tensor([True, False, True])}
    w = _StreamingSafetensors(tmp_path / "x.safetensors",
                              [(n, {torch.bfloat16: "BF16", torch.float32: "F32", torch.int64: "I64",
                                    torch.float64: "F64", torch.bool: "BOOL"}[t.dtype], tuple(t.shape))
                               for n, t in tensors.items()])
    for n, t in tensors.items():
        w.write(n, t)
    w.close()
    with safe_open(str(tmp_path / "x.safetensors"), framework="pt") as h:
        assert sorted(h.keys()) == sorted(tensors) and h.metadata() == {"format": "pt"}
        for n, t in tensors.items():
            got = h.get_tensor(n)
            assert got.dtype == t.dtype and got.shape == t.shape and torch.equal(got, t), n
    # a tensor that is not the planned one is refused
    w = _StreamingSafetensors(tmp_path / "y.safetensors", [("a", "F32", (2,))])
    with pytest.raises(RuntimeError):
        w.write("a", torch.zeros(3))


def test_precision_auto_uses_float32_products_only_for_16_bit_outputs(ckpts, tmp_path, capsys):
    from rlpace.merge._checkpoint import _blas_dtype
    assert _blas_dtype("auto", torch.bfloat16) == _blas_dtype("auto", torch.float16) == torch.float32
    assert _blas_dtype("auto", torch.float32) == _blas_dtype("float64", torch.bfloat16) == torch.float64
    # bf16 output: the float32-product merge and the float64 one agree to one bf16 step
    outs = {}
    for prec in ("auto", "float64"):
        merge_checkpoints(ckpts["sharded"], [ckpts["e0"], ckpts["e1"]], tmp_path / prec, out_dtype="bfloat16",
                          precision=prec, progress=False)
        outs[prec] = load_all(tmp_path / prec)
    for n, w in outs["auto"].items():
        ref = outs["float64"][n].float()
        assert bool(((w.float() - ref).abs() <= 2 ** -8 * ref.abs() + 1e-30).all()), n
    with pytest.raises(InputError, match="precision"):
        merge_checkpoints(ckpts["sharded"], [ckpts["e0"]], tmp_path / "bad", precision="float32", progress=False)
    assert not (tmp_path / "bad").exists()
    assert main(["merge", "--base", str(ckpts["sharded"]), "--experts", str(ckpts["e0"]), "--out",
                 str(tmp_path / "cli"), "--precision", "float64", "--no-progress"]) == 0


@pytest.mark.parametrize("method", ["iso", "ties"])
def test_parallel_workers_write_the_same_checkpoint_bit_for_bit(ckpts, tmp_path, method):
    """threads=3 (tensors merged three at a time, written to their planned byte ranges as they
    finish) against threads=1 (one at a time, in name order): the same files, byte for byte,
    and the same retention coefficients, on the sharded checkpoint (9 files)."""
    outs = {}
    for t in (1, 3):
        s = merge_checkpoints(ckpts["sharded"], [ckpts["e0"], ckpts["e1"]], tmp_path / f"t{t}", method=method,
                              out_dtype="bfloat16", threads=t, progress=False)
        outs[t] = s
    files = sorted(p.name for p in (tmp_path / "t1").iterdir())
    assert files == sorted(p.name for p in (tmp_path / "t3").iterdir())
    assert sum(f.endswith(".safetensors") for f in files) > 1
    for f in files:
        assert (tmp_path / "t1" / f).read_bytes() == (tmp_path / "t3" / f).read_bytes(), f
    assert {k: outs[1][k] for k in ("frames", "mean", "delta", "copy")} == \
        {k: outs[3][k] for k in ("frames", "mean", "delta", "copy")}


def test_parallel_workers_report_the_first_bad_tensor_in_name_order(ckpts, tmp_path, capsys):
    """Two poisoned tensors, four workers: the error names the first one in name order (what
    the one-at-a-time loop reports), and nothing is written."""
    from safetensors.torch import load_file, save_file
    bad = tmp_path / "bad"
    shutil.copytree(ckpts["e1"], bad)
    f = next(bad.glob("*.safetensors"))
    tensors = load_file(str(f))
    for name in ("model.layers.0.mlp.down_proj.weight", "model.layers.1.self_attn.q_proj.weight"):
        tensors[name].view(-1)[0] = float("nan")
    save_file(tensors, str(f), metadata={"format": "pt"})
    rc = main(["merge", "--base", str(ckpts["sharded"]), "--experts", str(ckpts["e0"]), str(bad), "--out",
               str(tmp_path / "out"), "--threads", "4", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "'model.layers.0.mlp.down_proj.weight'" in err and "q_proj" not in err
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob("*.tmp-merge"))


@pytest.mark.parametrize("threads", [0, -1, 1.5, True])
def test_bad_thread_count_is_refused_before_writing(ckpts, tmp_path, threads):
    with pytest.raises(InputError, match="threads must be a positive integer"):
        merge_checkpoints(ckpts["sharded"], [ckpts["e0"]], tmp_path / "out", threads=threads, progress=False)
    assert not (tmp_path / "out").exists()


def test_streamed_safetensors_accepts_tensors_in_any_order(tmp_path):
    """Parallel workers finish in any order: written last-first, the file reads back as planned."""
    from safetensors import safe_open

    from rlpace.merge._checkpoint import _StreamingSafetensors
    g = torch.Generator().manual_seed(1)
    tensors = {f"t{i}": torch.randn(3 + i, 2, generator=g) for i in range(5)}
    w = _StreamingSafetensors(tmp_path / "x.safetensors", [(n, "F32", tuple(t.shape)) for n, t in tensors.items()])
    for n in reversed(list(tensors)):
        w.write(n, tensors[n])
    with pytest.raises(RuntimeError):              # a tensor written twice is refused
        w.write("t0", tensors["t0"])
    w.close()
    with safe_open(str(tmp_path / "x.safetensors"), framework="pt") as h:
        for n, t in tensors.items():
            assert torch.equal(h.get_tensor(n), t), n
    w = _StreamingSafetensors(tmp_path / "y.safetensors", [("a", "F32", (2,)), ("b", "F32", (2,))])
    w.write("b", torch.zeros(2))
    with pytest.raises(RuntimeError, match="1 planned tensors were not written"):
        w.close()


def _conditioned(m, n, cond, seed, k=2, dtype=torch.float64):
    """A base with log-spaced singular values from 1 down to 1/cond and k experts = base + 1e-3
    relative Gaussian noise, in `dtype`."""
    g = torch.Generator().manual_seed(seed)
    u, _ = torch.linalg.qr(torch.randn(m, n, generator=g, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64))
    w0 = (u * torch.logspace(0, -float(np.log10(cond)), n, dtype=torch.float64)) @ v.T
    ws = [w0 + 1e-3 * w0.std() * torch.randn(m, n, generator=g, dtype=torch.float64) for _ in range(k)]
    return w0.to(dtype), [w.to(dtype) for w in ws]


def test_condition_limits_pick_the_products_dtype_then_the_svd_rule():
    """float64 products keep the Gram route exact to 1e-10 up to σ_max/σ_min = 1e5 (it used to
    hand everything above 1e4 to the 3× dearer SVD rule); float32 products are trusted only up
    to 1e3, above which `_iso_stack` reruns the matrix with float64 products instead of
    returning float32's larger error."""
    from rlpace.merge._methods import MAX_GRAM_COND, MAX_GRAM_COND_F32
    assert (MAX_GRAM_COND, MAX_GRAM_COND_F32) == (1e5, 1e3)
    w0, ws = _conditioned(120, 40, 3e4, seed=1)
    want, c_want = iso_merge_matrix(w0, ws)
    got = iso_merge_matrix_gram(w0, ws, block_rows=7)
    assert got is not None
    assert float((got[0] - want).abs().max() / want.abs().max()) < 1e-10
    assert np.abs(got[1] - c_want).max() < 1e-8
    w0, ws = _conditioned(120, 40, 3e3, seed=2)
    assert iso_merge_matrix_gram(w0, ws, blas_dtype=torch.float32) is None
    routed, c = _iso_stack(w0, ws, 0.9, torch.float64, torch.float32)
    exact, c64 = _iso_stack(w0, ws, 0.9, torch.float64, torch.float64)
    assert torch.equal(routed, exact) and c == c64
    assert float((routed - iso_merge_matrix(w0, ws)[0]).abs().max() / exact.abs().max()) < 1e-10
    w0, ws = _conditioned(120, 40, 3e6, seed=3)
    assert iso_merge_matrix_gram(w0, ws) is None                 # left to the SVD rule


def test_bf16_output_by_float32_products_against_the_float64_path():
    """What `--precision auto` writes for a bf16 model (float32 m × n products) against the
    float64 path rounded to bf16, on a 512 × 128 bf16 matrix with σ_max/σ_min = 100: before
    rounding within 1e-6 of the largest entry; after it, at most 0.1 % of the entries differ,
    each by one bf16 step (a float32 error that happens to straddle a rounding boundary)."""
    w0, ws = _conditioned(512, 128, 1e2, seed=4, dtype=torch.bfloat16)
    ref, c_ref = _iso_stack(w0, ws, 0.9, torch.float64, torch.float64)
    pre, c = _iso_stack(w0, ws, 0.9, torch.float64, torch.float32)
    assert float((pre - ref).abs().max() / ref.abs().max()) < 1e-6
    assert max(abs(a - b) for a, b in zip(c, c_ref)) < 1e-6
    out, _ = _iso_stack(w0, ws, 0.9, torch.bfloat16, torch.float32)
    want = ref.to(torch.bfloat16)
    differ = out != want
    assert float(differ.double().mean()) <= 1e-3
    # one step apart: neighbouring bf16 bit patterns (same sign)
    steps = (out.view(torch.int16).int() - want.view(torch.int16).int()).abs()[differ]
    assert bool((steps == 1).all())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_non_finite_check_agrees_with_isfinite_at_every_position(dtype):
    """The merge's NaN / inf refusal reads one min / max reduction instead of an elementwise
    isfinite; it must flag a single bad value wherever it sits (vector bodies and tails) and
    pass the largest finite value of the dtype."""
    from rlpace.merge._checkpoint import _all_finite
    g = torch.Generator().manual_seed(0)
    for n in (1, 7, 33, 1000, 4097):
        w = torch.randn(n, generator=g).to(dtype)
        assert _all_finite(w) and bool(torch.isfinite(w).all())
        for pos in range(0, n, max(1, n // 11)):
            for bad in (float("nan"), float("inf"), -float("inf")):
                x = w.clone()
                x[pos] = bad
                assert not _all_finite(x), (n, pos, bad)
        big = torch.full((3, n), torch.finfo(dtype).max, dtype=dtype)
        big[1] = -big[1]
        assert _all_finite(big)


def test_workers_take_the_dearest_tensors_first():
    """The worker pool's order: ISO frames by m·n·q + 13·q³ (q = min(m, n)), everything else
    by its number of elements, dearest first, ties in name order."""
    from rlpace.merge._checkpoint import _longest_first
    layout = {"a.norm": (None, "BF16", (896,)), "b.mlp": (None, "BF16", (4864, 896)),
              "c.attn": (None, "BF16", (896, 896)), "d.k": (None, "BF16", (128, 896)),
              "e.stack": (None, "BF16", (4, 128, 896)), "f.attn": (None, "BF16", (896, 896)),
              "z.embed": (None, "BF16", (151936, 896))}
    kinds = {n: ("mean" if len(s[2]) == 1 else "frames") for n, s in layout.items()}
    # costs: z 151936·896² + 13·896³ = 1.313e11; b 4864·896² + 13·896³ = 1.326e10;
    # c, f 14·896³ = 1.007e10; e 4·(128·896·128 + 13·128³) = 1.68e8; d 4.2e7; a 896
    assert _longest_first(list(layout), layout, kinds) == ["z.embed", "b.mlp", "c.attn", "f.attn", "e.stack",
                                                          "d.k", "a.norm"]
    kinds = {n: "delta" for n in layout}                                 # task arithmetic / TIES: by size
    assert _longest_first(list(layout), layout, kinds) == ["z.embed", "b.mlp", "c.attn", "f.attn", "e.stack",
                                                          "d.k", "a.norm"]


@pytest.mark.parametrize("dtype,shape", [(torch.float64, (300, 260)), (torch.float32, (77, 128)),
                                         (torch.float64, (5, 3))])
def test_gram_from_upper_blocks_equals_the_full_product(dtype, shape):
    """`_add_gram` (upper-triangle column blocks of 128, mirrored) against x.T @ x: the same
    symmetric matrix, added to what the accumulator held."""
    from rlpace.merge._methods import _add_gram
    g = torch.Generator().manual_seed(3)
    x = torch.randn(*shape, generator=g, dtype=dtype)
    acc = torch.randn(shape[1], shape[1], generator=g, dtype=torch.float64)
    want = acc + (x.T @ x).double()
    _add_gram(acc, x)
    assert float((acc - want).abs().max() / want.abs().max()) < 1e-14
    fresh = torch.zeros_like(acc)
    _add_gram(fresh, x)
    assert torch.equal(fresh, fresh.T)                                 # mirrored: exactly symmetric


def test_inverse_square_root_reads_the_lower_triangle_only():
    """The Gram route's polar retractions hand `_inv_sqrt_lower` a matrix symmetric only up to
    one product's rounding and make no (A + Aᵀ)/2 pass: the upper triangle must not be read.
    [[2, ·], [1, 2]] has eigenvalues 3 and 1 on (1, 1)/√2 and (1, −1)/√2, so its inverse
    square root is ½·(1/√3)·[[1, 1], [1, 1]] + ½·[[1, −1], [−1, 1]]; junk above the diagonal."""
    from rlpace.merge._methods import _inv_sqrt_lower
    a = torch.tensor([[2.0, 99.0], [1.0, 2.0]], dtype=torch.float64)
    r3 = 3 ** -0.5
    want = torch.tensor([[r3 + 1, r3 - 1], [r3 - 1, r3 + 1]], dtype=torch.float64) / 2
    assert torch.allclose(_inv_sqrt_lower(a), want, rtol=0, atol=1e-15)
    d = torch.tensor([[4.0, -7.0, 3.0], [0.0, 9.0, 5.0], [0.0, 0.0, 0.25]], dtype=torch.float64)
    assert torch.allclose(_inv_sqrt_lower(d), torch.diag(torch.tensor([0.5, 1 / 3, 2.0], dtype=torch.float64)),
                          rtol=0, atol=1e-15)


def test_symmetric_products_of_the_n_by_n_algebra():
    """`_gram_sym` (xᵀx from the upper triangle's blocks) against x.T @ x, and `_inv_sqrt_lower`
    now formed as F·Fᵀ, F = vec·Λ^(-1/4): exactly symmetric, and H·A·H = I, H² = A⁻¹ to rounding
    on a 300 × 300 A = I + BᵀB (eigenvalues 1 … ~1,200, the retractions' kind of matrix)."""
    from rlpace.merge._methods import _gram_sym, _inv_sqrt_lower
    g = torch.Generator().manual_seed(5)
    for shape in [(300, 260), (260, 300), (4, 3)]:
        x = torch.randn(*shape, generator=g, dtype=torch.float64)
        got, want = _gram_sym(x), x.T @ x
        assert torch.equal(got, got.T)
        assert float((got - want).abs().max() / want.abs().max()) < 1e-14
    b = torch.randn(300, 300, generator=g, dtype=torch.float64)
    a = b.T @ b
    a.diagonal().add_(1.0)
    h = _inv_sqrt_lower(a)
    assert torch.equal(h, h.T)
    eye = torch.eye(300, dtype=torch.float64)
    assert float((h @ a @ h - eye).abs().max()) < 1e-11
    assert float((h @ h - torch.linalg.inv(a)).abs().max() / torch.linalg.inv(a).abs().max()) < 1e-11
