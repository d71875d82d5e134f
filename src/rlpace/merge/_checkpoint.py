"""Merge whole Hugging Face checkpoints (safetensors, one file or sharded) of one base.

Everything that can be wrong is checked before anything is written: the directories, their
configs (same `model_type` and `architectures`), every shard the index names, the tensor
names, shapes and dtypes of each expert against the base, and — on the first matrices —
that each expert is a fine-tune of *this* base (relative displacement below
`MAX_RELATIVE_DELTA`). The result is written to a temporary sibling of `out` and renamed,
so a failure leaves no partial checkpoint.
"""

from __future__ import annotations

from ..errors import InputError
import json
import math
import os
import shutil
import time
from pathlib import Path

import torch

from ._methods import RHO_KEEP, iso_merge_matrix, iso_merge_matrix_gram, task_arithmetic, task_vector_mean, ties

__all__ = ["merge_checkpoints", "METHODS", "read_layout", "MAX_RELATIVE_DELTA"]

METHODS = ("iso", "task_arithmetic", "ties")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MAX_RELATIVE_DELTA = 0.5    # ‖W_i − W₀‖/‖W₀‖ above this: not a fine-tune of the base (RL moves ~1e-3)
_INDEX = "model.safetensors.index.json"
_SINGLE = "model.safetensors"


def read_layout(directory) -> dict:
    """{tensor name: (file path, dtype string, shape)} of a HF checkpoint directory, after
    checking its config.json and that every file the index names exists."""
    from safetensors import safe_open

    d = Path(directory)
    if not d.is_dir():
        raise InputError(f"{str(d)!r} is not a directory; pass a Hugging Face checkpoint directory.")
    if not (d / "config.json").is_file():
        raise InputError(f"{str(d)!r} has no config.json; is it a Hugging Face checkpoint directory?")
    if (d / _INDEX).is_file():
        try:
            weight_map = json.loads((d / _INDEX).read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise InputError(f"{str(d / _INDEX)!r} is not a safetensors index ({e}).") from None
        files = sorted(set(weight_map.values()))
        missing = [f for f in files if not (d / f).is_file()]
        if missing:
            raise InputError(f"{str(d)!r} is missing shard(s) {missing} named in {_INDEX}; copy the whole "
                             f"checkpoint.")
    elif (d / _SINGLE).is_file():
        weight_map, files = None, [_SINGLE]
    else:
        raise InputError(f"{str(d)!r} has neither {_SINGLE} nor {_INDEX}; rlpace merge reads safetensors "
                         f"checkpoints (save with save_pretrained(safe_serialization=True)).")
    layout = {}
    for f in files:
        try:
            with safe_open(str(d / f), framework="pt") as h:
                for name in h.keys():
                    sl = h.get_slice(name)
                    layout[name] = (str(d / f), sl.get_dtype(), tuple(sl.get_shape()))
        except Exception as e:        # safetensors raises its own error types on a corrupt file
            raise InputError(f"cannot read {str(d / f)!r}: {e}") from None
    if weight_map is not None:
        absent = sorted(set(weight_map) - set(layout))
        if absent:
            raise InputError(f"{str(d)!r}: tensors {absent[:3]} named in {_INDEX} are not in their shards; "
                             f"the checkpoint is incomplete.")
    return layout


def _config(directory) -> dict:
    try:
        return json.loads((Path(directory) / "config.json").read_text())
    except json.JSONDecodeError as e:
        raise InputError(f"{str(Path(directory) / 'config.json')!r} is not JSON ({e}).") from None


def _load(layout: dict, name: str, device) -> torch.Tensor:
    from safetensors import safe_open
    with safe_open(layout[name][0], framework="pt", device="cpu") as h:
        return h.get_tensor(name).to(device)


def _relative_distance(w0: torch.Tensor, w: torch.Tensor) -> float:
    """‖w − w₀‖/‖w₀‖ (Frobenius, float64) over flat chunks: no float64 copy of a whole
    vocab × hidden embedding."""
    a, b = w0.reshape(-1), w.reshape(-1)
    num = den = 0.0
    for i in range(0, a.numel(), _CHUNK):
        x = a[i:i + _CHUNK].double()
        num += float((b[i:i + _CHUNK].double() - x).square().sum())
        den += float(x.square().sum())
    return (num ** 0.5) / max(den ** 0.5, 1e-30)


def _refuse_non_finite(w: torch.Tensor, name: str, path: str) -> None:
    """A NaN or inf weight would make ISO's SVD fail, task arithmetic write NaN, and TIES
    silently put the base's value in its place: refuse the input instead (the caller's
    temporary output is then removed, so nothing is written)."""
    if w.is_floating_point() and w.numel() and not _all_finite(w):
        raise InputError(f"tensor {name!r} in {path!r} holds NaN or inf values; rlpace merge refuses non-finite "
                         f"weights: re-export that checkpoint, or leave it out of --base/--experts.")


def _all_finite(w: torch.Tensor) -> bool:
    """Whether a non-empty floating tensor holds no NaN or inf: its minimum and maximum are
    finite (torch.aminmax propagates NaN). One reduction, no bool tensor of w's size: on a
    bf16 151,936 × 896 embedding 0.04 s of CPU against torch.isfinite(w).all()'s 0.98 s
    (isfinite over the three 0.5B checkpoints of a 2-expert merge took 11 s)."""
    lo, hi = torch.aminmax(w)
    return bool(torch.isfinite(lo)) and bool(torch.isfinite(hi))


def _rule(method: str, shape, dtype: str) -> str:
    """How a tensor is merged: 'frames' (ISO, ≥ 2 dims), 'mean' (ISO, 1-D task-vector mean),
    'delta' (task arithmetic / TIES, any floating tensor) or 'copy' (from the base)."""
    if dtype not in ("F64", "F32", "F16", "BF16") or len(shape) == 0:
        return "copy"
    if method != "iso":
        return "delta"
    return "frames" if len(shape) >= 2 and min(shape[-2:]) > 0 else ("mean" if len(shape) == 1 else "copy")


def merge_checkpoints(base, experts, out, *, method: str = "iso", device: str = "cpu", out_dtype: str | None = None,
                      rho_keep: float = RHO_KEEP, scale: float = 1.0, density: float = 0.2,
                      precision: str = "auto", threads: int | None = None, progress: bool = True) -> dict:
    """Merge the `experts` (HF checkpoint directories fine-tuned from `base`) into `out`.

    Args:
        method: "iso" (ISO-Merger, arXiv 2607.19331: every floating tensor with ≥ 2 dims by
            the fixed-spectrum frame merge, a 3-D stack [E, m, n] matrix by matrix; 1-D by the
            task-vector mean; others copied from the base), "task_arithmetic" (w₀ + scale·Σ τ_i
            on every floating tensor) or "ties" (TIES with `density`, `scale`).
        device: where the float64 algebra runs ("cpu", "cuda", "cuda:1").
        out_dtype: "float32" | "bfloat16" | "float16"; None = each tensor's dtype in the base.
        rho_keep: ISO's share of singular modes whose frame motion is kept (paper: 0.9).
        precision: ISO's large products: "auto" (float32 for tensors written in bf16 / fp16,
            whose rounding is far above the float32 products' ~1e-7 relative error; float64
            for float32 / float64 output) or "float64" (always).
        threads: None (default) merges one tensor at a time with torch's own thread setting;
            T ≥ 1 merges up to T tensors at once, each in its own single-threaded worker (CPU
            only; each tensor's arithmetic is unchanged, so the output equals threads=1's). Memory
            then holds the inputs and output of up to T tensors.
        progress: a tqdm bar over tensors.

    Writes `out/` with the base's file layout (one file, or the same shards and an index whose
    `total_size` is the written size), config.json (dtype set to what was written), every
    other non-weight file of the base (tokenizer, generation config), and
    `retention_coefficients.json` (iso: `{"tensors": [[name, [c_1..c_K]], ...]}`). Returns a
    summary dict (tensors by kind, seconds).

    >>> merge_checkpoints("base", ["math_rl", "code_rl"], "merged")      # doctest: +SKIP
    """
    from tqdm.auto import tqdm

    t0 = time.perf_counter()
    # ---- 1. check everything --------------------------------------------------------------
    if method not in METHODS:
        raise InputError(f"method must be one of {', '.join(METHODS)}; got {method!r}.")
    if out_dtype is not None and out_dtype not in DTYPES:
        raise InputError(f"out_dtype must be one of {', '.join(DTYPES)}; got {out_dtype!r}.")
    if not 0 < rho_keep <= 1:
        raise InputError(f"rho_keep must be in (0, 1]; got {rho_keep}.")
    if not 0 < density <= 1:
        raise InputError(f"density must be in (0, 1]; got {density}.")
    if precision not in ("auto", "float64"):
        raise InputError(f"precision must be 'auto' or 'float64'; got {precision!r}.")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise InputError(f"threads must be a positive integer (or None: one tensor at a time); got {threads!r}.")
    experts = [Path(e) for e in experts]
    if not experts:
        raise InputError("give at least one expert directory (--experts DIR [DIR ...]).")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise InputError(f"device={device!r} but torch sees no CUDA device; use --device cpu.")
    base, out = Path(base), Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InputError(f"--out {str(out)!r} exists and is not empty; choose a new directory (rlpace merge "
                         f"never overwrites).")
    if out.resolve() in [p.resolve() for p in [base, *experts] if p.exists()]:
        raise InputError(f"--out {str(out)!r} is one of the inputs; choose a new directory.")
    base_layout = read_layout(base)
    base_cfg = _config(base)
    layouts = []
    for e in experts:
        lay, cfg = read_layout(e), _config(e)
        for key in ("model_type", "architectures"):
            if cfg.get(key) != base_cfg.get(key):
                raise InputError(f"expert {str(e)!r} has {key}={cfg.get(key)!r}, the base {base_cfg.get(key)!r}; "
                                 f"experts must be fine-tunes of the base architecture.")
        if set(lay) != set(base_layout):
            diff = sorted(set(lay) ^ set(base_layout))
            raise InputError(f"expert {str(e)!r} and the base hold different tensors (e.g. {diff[:3]}); experts "
                             f"must be fine-tunes of the base.")
        bad = [n for n in base_layout if lay[n][2] != base_layout[n][2]]
        if bad:
            n = bad[0]
            raise InputError(f"expert {str(e)!r}: tensor {n!r} has shape {lay[n][2]}, the base {base_layout[n][2]}; "
                             f"experts must be fine-tunes of the base.")
        layouts.append(lay)
    names = sorted(base_layout)
    kinds = {n: _rule(method, base_layout[n][2], base_layout[n][1]) for n in names}
    # a fine-tune of this base moves its matrices little; another base (same architecture) does not
    probe = [n for n in names if kinds[n] != "copy" and len(base_layout[n][2]) == 2][:3]
    for e, lay in zip(experts, layouts):
        for n in probe:
            rel = _relative_distance(_load(base_layout, n, "cpu"), _load(lay, n, "cpu"))
            if rel > MAX_RELATIVE_DELTA:
                raise InputError(f"expert {str(e)!r} differs from the base by {rel:.2f} (relative Frobenius norm) "
                                 f"on {n!r}; it is not a fine-tune of this base (RL fine-tunes move ~1e-3). Pass "
                                 f"the base it was trained from.")

    # ---- 2. merge, tensor by tensor, into a temporary sibling -------------------------------
    tmp = out.with_name(out.name + ".tmp-merge")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    by_file: dict[str, list[str]] = {}
    for n in names:
        by_file.setdefault(Path(base_layout[n][0]).name, []).append(n)
    writers = {}
    workers = 1 if device != "cpu" or threads is None else threads
    torch_threads = torch.get_num_threads()
    try:
        # every file's header is planned from the base before anything is merged, so each merged
        # tensor goes to its own byte range as soon as it exists, in whatever order tensors finish:
        # memory holds the inputs and output of the tensors in flight, not a shard and its copy
        for fname in sorted(by_file):
            writers[fname] = _StreamingSafetensors(tmp / fname, [(n, _written_dtype(base_layout[n][1], out_dtype),
                                                                  base_layout[n][2]) for n in by_file[fname]])
        file_of = {n: fname for fname, ns in by_file.items() for n in ns}

        def merge_one(n):
            w0 = _load(base_layout, n, device)
            kind = kinds[n]
            ws = [] if kind == "copy" else [_load(lay, n, device) for lay in layouts]
            for lay, w in zip([base_layout, *layouts], [w0, *ws]):
                _refuse_non_finite(w, n, lay[n][0])
            out_dt = DTYPES[out_dtype] if out_dtype else w0.dtype
            c = None
            if kind == "copy":
                merged = w0
            elif method == "task_arithmetic":
                merged = _chunked(lambda a, bs: task_arithmetic(a, bs, scale=scale), w0, ws, out_dt)
            elif method == "ties":
                merged = _ties_chunked(w0, ws, density, scale, out_dt)
            elif kind == "mean":
                merged = task_vector_mean(w0, ws)
            else:
                merged, c = _iso_stack(w0, ws, rho_keep, out_dt, _blas_dtype(precision, out_dt))
            dt = DTYPES[out_dtype] if out_dtype and merged.is_floating_point() else w0.dtype
            merged = merged.to(dt).cpu().contiguous()
            writers[file_of[n]].write(n, merged)
            return kind, c, merged.numel() * merged.element_size(), str(merged.dtype).replace("torch.", "")

        if threads is not None:
            torch.set_num_threads(1)
        results = {}
        bar = tqdm(total=len(names), desc=f"merge ({method})", unit="tensor", disable=not progress)
        if workers == 1:
            for n in names:
                results[n] = merge_one(n)
                bar.update(1)
        else:
            # one tensor per worker thread, each single-threaded (torch ops release the GIL): the
            # eigendecompositions that dominate an ISO merge use a second core poorly inside one
            # call, and TIES's per-chunk ops cost more to split than they save
            from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
            with ThreadPoolExecutor(workers) as pool:
                futures = {pool.submit(merge_one, n): n for n in _longest_first(names, base_layout, kinds)}
                pending = set(futures)
                while pending:
                    done, pending = wait(pending, return_when=FIRST_EXCEPTION)
                    bar.update(len(done))
                    if any(f.exception() is not None for f in done):
                        for f in pending:
                            f.cancel()
                        wait(pending)
                        break
            # the first failing tensor in name order, as the sequential loop would report
            failed = [f for f in futures if not f.cancelled() and f.exception() is not None]
            if failed:
                raise min(failed, key=lambda f: names.index(futures[f])).exception()
            results = {futures[f]: f.result() for f in futures}
        bar.close()
        for w in writers.values():
            w.close()
        counts = {"frames": 0, "mean": 0, "delta": 0, "copy": 0}
        coeffs, sizes, dtypes_written = [], {}, set()
        for n in names:
            kind, c, sizes[n], written = results[n]
            counts[kind] += 1
            dtypes_written.add(written)
            if c is not None:
                coeffs.append([n, c])
        _write_side_files(base, tmp, base_cfg, by_file, sizes, out_dtype, dtypes_written)
        (tmp / "retention_coefficients.json").write_text(json.dumps(
            {"method": method, "rho_keep": rho_keep if method == "iso" else None,
             "experts": [str(e) for e in experts], "tensors": coeffs}, indent=1))
        if out.exists():
            out.rmdir()               # checked empty above
        os.replace(tmp, out)
    except BaseException:
        for w in writers.values():
            w.abandon()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        torch.set_num_threads(torch_threads)
    return {"method": method, "tensors": len(names), **counts, "seconds": time.perf_counter() - t0,
            "out": str(out)}


def _longest_first(names, layout: dict, kinds: dict) -> list:
    """`names` in the order the worker pool takes them: dearest first (ties in name order), so
    the last tensors to start are small ones and no worker sits idle behind one long tail.
    An ISO frame merge of an m × n matrix (q = min(m, n)) costs about m·n·q for its two passes
    of products plus 13·q³ for its q × q eigendecompositions and products (fitted to the
    measured 4864 × 896, 896 × 896 and 151,936 × 896 matrices); every other rule costs about
    its number of elements. Output does not depend on the order (each tensor is written to
    its own planned byte range)."""
    def cost(n):
        shape = layout[n][2]
        if kinds[n] != "frames":
            return math.prod(shape)
        m, k = shape[-2:]
        q = min(m, k)
        return math.prod(shape[:-2]) * (m * k * q + 13 * q ** 3)
    return sorted(names, key=lambda n: -cost(n))


def _blas_dtype(precision: str, written: torch.dtype) -> torch.dtype:
    """The dtype of the Gram route's m × n products (`iso_merge_matrix_gram(blas_dtype=)`):
    "auto" = float32 for a tensor written in bf16 / fp16 (its rounding, 2^-9 or 2^-12
    relative, is 10³–10⁵ times the float32 products' error), float64 otherwise."""
    if precision == "float64" or (precision == "auto" and written not in (torch.bfloat16, torch.float16)):
        return torch.float64
    return torch.float32


def _iso_stack(w0, ws, rho_keep, dtype=torch.float64, blas_dtype=torch.float64):
    """ISO-merge a matrix [m, n] or a stack [..., m, n] matrix by matrix (MoE expert stacks),
    each by the Gram route (`iso_merge_matrix_gram`: no m × q frame is formed, memory stays at
    a few row blocks) or, for a matrix too ill-conditioned for it, by LAPACK SVDs; in `dtype`.
    A matrix too ill-conditioned for float32 products (σ_max/σ_min > MAX_GRAM_COND_F32) is
    retried with float64 ones before it is left to the SVDs (up to MAX_GRAM_COND)."""
    def one(a, bs):
        # float32 products pay off on a long matrix; on a square-ish one (long side < 2× the short)
        # the products are a small share of the merge, so it keeps float64 and skips a float32
        # attempt that a random square matrix (σ_max/σ_min often > 1e3) would fail anyway
        bd = blas_dtype if max(a.shape) >= 2 * min(a.shape) else torch.float64
        got = iso_merge_matrix_gram(a, bs, rho_keep=rho_keep, dtype=dtype, blas_dtype=bd)
        if got is None and bd != torch.float64:
            got = iso_merge_matrix_gram(a, bs, rho_keep=rho_keep, dtype=dtype, blas_dtype=torch.float64)
        if got is None:
            w, c = iso_merge_matrix(a, bs, rho_keep=rho_keep)
            got = w.to(dtype), c
        return got[0], [float(x) for x in got[1]]

    if w0.ndim == 2:
        return one(w0, ws)
    lead = w0.shape[:-2]
    flat0 = w0.reshape(-1, *w0.shape[-2:])
    flats = [w.reshape(-1, *w.shape[-2:]) for w in ws]
    outs, cs = [], []
    for i in range(flat0.shape[0]):
        w, c = one(flat0[i], [f[i] for f in flats])
        outs.append(w)
        cs.append(c)
    return torch.stack(outs).reshape(*lead, *w0.shape[-2:]), cs


_CHUNK = 1 << 17           # elements per chunk of the elementwise rules (1 MiB in float64: the
                           # ~10 passes of a rule stay in cache; 4M-element chunks ran 1.8–3.4× slower)


def _chunked(rule, w0, ws, dtype):
    """An elementwise rule (float64 inside) over flat chunks, written in `dtype`: memory stays
    at the inputs, the output and a few chunks, not K + 2 float64 copies of the tensor."""
    flat0, flats = w0.reshape(-1), [w.reshape(-1) for w in ws]
    out = torch.empty(flat0.numel(), dtype=dtype, device=w0.device)
    for i in range(0, flat0.numel(), _CHUNK):
        out[i:i + _CHUNK] = rule(flat0[i:i + _CHUNK], [f[i:i + _CHUNK] for f in flats]).to(dtype)
    return out.reshape(w0.shape)


def _ties_chunked(w0, ws, density, scale, dtype):
    """TIES (`ties`) over flat chunks. The trim threshold of each task vector is the k-th
    largest |τ_i| of the whole tensor, selected on a float32 |τ_i| (one tensor-sized float32
    buffer at a time instead of a float64 stack of all K); the kept entries, the elected sign
    and the mean are float64 as in `ties`. The selection can differ from `ties` only between
    entries whose |τ| agree to float32 rounding (6e-8 relative)."""
    flat0, flats = w0.reshape(-1), [w.reshape(-1) for w in ws]
    p = flat0.numel()
    k = max(1, int(round(density * p)))

    def abs_tau32(f, lo=0, hi=None):
        return (f[lo:hi].float() - flat0[lo:hi].float()).abs_()

    # the (p − k + 1)-th smallest |τ_i| (what torch.kthvalue returns), selected in place in one
    # float32 buffer filled chunk by chunk: torch.kthvalue and a whole-tensor τ would each hold
    # another tensor-sized copy (TIES peaked at 3.8× the model's size with them)
    if p == 0:
        return w0.to(dtype)
    buf = torch.empty(p, dtype=torch.float32)
    thresholds = []
    for f in flats:
        for i in range(0, p, _CHUNK):
            buf[i:i + _CHUNK] = abs_tau32(f, i, i + _CHUNK).cpu()
        a = buf.numpy()
        a.partition(p - k)
        thresholds.append(torch.tensor(a[p - k], dtype=torch.float32, device=w0.device))
    del buf
    thr = torch.stack(thresholds)[:, None]                                            # [K, 1] float32
    out = torch.empty(p, dtype=dtype, device=w0.device)
    for i in range(0, p, _CHUNK):
        j = min(p, i + _CHUNK)
        # all K task vectors of the chunk in one [K, chunk] array: a handful of whole-array
        # passes instead of a dozen per expert. The same numbers as `ties`: the trim compares the
        # same float32 |τ| as the threshold pass, and τ·γ > 0 is sign(τ) = γ with τ ≠ 0
        x = torch.stack([f[i:j] for f in flats])                                      # [K, chunk]
        b64 = flat0[i:j].double()
        keep = (x.float() - flat0[i:j].float()).abs_() >= thr
        taus = (x.double() - b64).masked_fill_(~keep, 0.0)                            # trimmed τ_i
        agree = taus * torch.sign(taus.sum(0)) > 0                                    # sign(τ_i) = elected γ
        mean = taus.mul_(agree).sum(0) / agree.sum(0).clamp_(min=1)
        out[i:j] = (b64 + scale * mean).to(dtype)
    return out.reshape(w0.shape)


_ST_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
              torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
              torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2"}


def _written_dtype(base_dtype: str, out_dtype: str | None) -> str:
    """The safetensors dtype a tensor is written in: `out_dtype` for floating tensors when
    given, else the base's (the rule of the merge loop: `merged.to(out_dtype)` if floating)."""
    floating = base_dtype.startswith("F") or base_dtype == "BF16"
    return _ST_DTYPES[DTYPES[out_dtype]] if out_dtype and floating else base_dtype


class _StreamingSafetensors:
    """A safetensors file written tensor by tensor, in any order: the header (names, dtypes,
    shapes, byte offsets) is known before any tensor is merged, so each tensor's bytes go to
    their own range of the file as soon as the tensor exists (`os.pwrite`, safe from several
    threads). The format: an 8-byte little-endian header length, the JSON header padded with
    spaces to a multiple of 8, then the tensors' bytes back to back in header order (what
    `safetensors.torch.save_file` writes; read back by `safe_open`, tested)."""

    def __init__(self, path, entries):
        sizes = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "F16": 2, "BF16": 2,
                 "I32": 4, "F32": 4, "I64": 8, "F64": 8}
        header, offset = {"__metadata__": {"format": "pt"}}, 0
        self._plan = {}
        for name, dtype, shape in entries:
            end = offset + sizes[dtype] * int(math.prod(shape))
            header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, end]}
            self._plan[name] = (dtype, tuple(shape), offset)
            offset = end
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        self._start = 8 + len(raw)
        self._written: set = set()
        self._f = open(path, "wb")
        self._f.write(len(raw).to_bytes(8, "little") + raw)
        self._f.truncate(self._start + offset)
        self._f.flush()

    def write(self, name: str, t: torch.Tensor) -> None:
        want = self._plan.get(name)
        if want is None or name in self._written or (_ST_DTYPES.get(t.dtype), tuple(t.shape)) != want[:2]:
            raise RuntimeError(f"merged tensor {name!r} is {t.dtype} {tuple(t.shape)}, the planned header says "
                               f"{want} (or it was written already); nothing is kept.")
        data = t.contiguous().reshape(-1).view(torch.uint8).numpy().data
        pos, done = self._start + want[2], 0
        while done < len(data):                   # pwrite may write less than asked
            done += os.pwrite(self._f.fileno(), data[done:], pos + done)
        self._written.add(name)

    def abandon(self) -> None:
        """Close the file without the completeness check (the caller removes it)."""
        self._f.close()

    def close(self) -> None:
        self._f.close()
        if len(self._written) != len(self._plan):
            raise RuntimeError(f"{len(self._plan) - len(self._written)} planned tensors were not written.")


def _write_side_files(base, tmp, cfg, by_file, sizes, out_dtype, dtypes_written):
    for f in sorted(Path(base).iterdir()):
        if f.is_file() and not f.name.endswith(".safetensors") and f.name not in (_INDEX, "config.json"):
            shutil.copy(f, tmp / f.name)
    cfg = dict(cfg)
    if out_dtype is not None or len(dtypes_written) == 1:
        written = out_dtype or next(iter(dtypes_written))
        keys = [k for k in ("dtype", "torch_dtype") if k in cfg] or ["dtype"]
        for key in keys:
            cfg[key] = written
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
    if (Path(base) / _INDEX).is_file():
        index = json.loads((Path(base) / _INDEX).read_text())
        index.setdefault("metadata", {})["total_size"] = int(sum(sizes.values()))
        index["weight_map"] = {n: f for f, ns in by_file.items() for n in ns}
        (tmp / _INDEX).write_text(json.dumps(index, indent=2))
