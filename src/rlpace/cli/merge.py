"""Merge RL specialists fine-tuned from one base into one checkpoint, without data.

ISO-Merger (arXiv 2607.19331; docs/methods/iso.md) keeps every weight matrix's base
spectrum Σ₀ and composes the experts' singular-frame motions: per matrix, in float64, thin
SVDs with signs aligned to the base, tangent projection at (U₀, V₀), the trailing 10 % of
modes masked, retention coefficients from a ridge-stabilised Gram system (unit
self-retention, clipped to [0, 1.5]), a polar retraction, W★ = U★·Σ₀·V★ᵀ. 1-D tensors get
the task-vector mean; integer buffers are copied from the base. Task arithmetic and TIES are
there as baselines.

Inputs are Hugging Face safetensors checkpoints (one file or sharded). Everything is checked
before anything is written (architecture, tensor names and shapes, missing shards, experts
that are not fine-tunes of this base); the output directory must be new or empty. It holds
the merged weights in the base's layout, config.json (dtype as written), the base's
tokenizer and other files, and retention_coefficients.json.

  rlpace merge --base Qwen3-4B-Base --experts math_rl code_rl --out merged --device cuda
"""

from __future__ import annotations

from ..errors import InputError


def add_arguments(parser) -> None:
    parser.add_argument("--base", required=True, metavar="DIR", help="the shared base checkpoint directory")
    parser.add_argument("--experts", required=True, nargs="+", metavar="DIR",
                        help="one or more checkpoints fine-tuned from --base")
    parser.add_argument("--out", required=True, metavar="DIR", help="new (or empty) output directory")
    parser.add_argument("--method", default="iso", choices=["iso", "task_arithmetic", "ties"],
                        help="iso (default): ISO-Merger; task_arithmetic: base + scale·Σ(expert − base); "
                             "ties: TIES-Merging (trim to --density, elect signs, disjoint mean)")
    parser.add_argument("--device", default="cpu", help="where the float64 algebra runs: cpu, cuda, cuda:1 "
                                                        "(default cpu)")
    parser.add_argument("--out-dtype", default=None, choices=["float32", "bfloat16", "float16"],
                        help="dtype of the written weights (default: each tensor's dtype in the base)")
    parser.add_argument("--rho-keep", type=float, default=0.9,
                        help="iso: share of singular modes whose frame motion is kept (paper: 0.9)")
    parser.add_argument("--scale", type=float, default=1.0, help="task_arithmetic / ties: λ (default 1)")
    parser.add_argument("--density", type=float, default=0.2,
                        help="ties: share of each task vector's largest entries kept (default 0.2)")
    parser.add_argument("--precision", default="auto", choices=["auto", "float64"],
                        help="iso: auto (default) runs the large products in float32 for tensors written in "
                             "bf16/fp16 (within 1e-6 of float64, far below their rounding) and float64 otherwise; "
                             "float64: always")
    parser.add_argument("--threads", type=int, default=None, metavar="T",
                        help="merge up to T tensors at once on the CPU, one single-threaded worker each (same "
                             "output; memory holds T tensors' inputs); default: one tensor at a time")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args) -> int:
    try:
        import safetensors  # noqa: F401
    except ModuleNotFoundError:
        raise InputError("rlpace merge needs the package 'safetensors': pip install 'rlpace[train]' "
                         "(with torch installed first).") from None
    from rlpace.merge import merge_checkpoints

    s = merge_checkpoints(args.base, args.experts, args.out, method=args.method, device=args.device,
                          out_dtype=args.out_dtype, rho_keep=args.rho_keep, scale=args.scale,
                          density=args.density, precision=args.precision, threads=args.threads,
                          progress=not args.no_progress)
    print(f"rlpace merge: {s['tensors']} tensors ({s['frames']} frame-merged, {s['mean']} task-vector mean, "
          f"{s['delta']} {args.method if s['delta'] else 'delta'}, {s['copy']} copied) in {s['seconds']:.1f} s "
          f"-> {s['out']}")
    return 0
