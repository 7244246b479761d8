"""Attention written naively in te, built by auto_schedule into one FlashAttention-style kernel.

    python examples/attention.py [--cpu] [--small] [--causal] [--half] [--triton-form]

The program below materializes nothing special: scores S = Q K^T, a scaled (optionally causally
masked) copy, the row max, exp, the row sum, P V and the division — as a user would write it.
auto_schedule recognizes the chain (schedules/attention.py) and applies the checked rewrite
`online_softmax`: a running maximum per row rescales the partial sums by exp(m_old - m_new), so the
n x m score and probability matrices never exist. On CUDA the pass is FlashAttention's tensor-core kernel: in
float32 (head dimensions up to 64) tensorize "attention.tf32x3" (64 query rows a block, a warp per 16, S = Q K^T
and O += P V on TF32 mma.sync with each product split in three for float32 accuracy, K and V double-buffered in
shared memory 32 keys at a time); with --half (float16) "attention.wgmma" or "attention.m16n8k16" (Hopper's
warpgroup MMA or mma.sync, P in registers, 128 rows per block). Where neither applies, a thread per row keeps
its state in registers and K and V stream through shared memory. The example prints the plan, the
nest, checks against numpy (float64), and on a GPU times the kernel against PyTorch eager's naive
composition (softmax(Q K^T * scale) V) when torch is importable. --triton-form writes the chain as the torch
reference of Triton's fused-attention tutorial does instead (softmax(S.float()).half() @ V: the probabilities
divided by their sum before the product with V; loopir.workloads.triton_attention): the same kernel results.
"""

from __future__ import annotations

import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from codegen import build, gpu_available  # noqa: E402
from loopir import te, workloads  # noqa: E402
from schedules import auto_schedule  # noqa: E402


def naive_attention(d: int, causal: bool, dtype: str = "float32") -> tuple[list, te.Tensor]:
    """softmax(Q K^T / sqrt(d) [causal]) V over (batch x heads, rows, d); sizes symbolic except d."""
    w = workloads.naive_attention(te.var("B"), te.var("n"), te.var("m"), d, causal, dtype=dtype)
    return list(w.inputs), w.outputs[0]


def triton_form(d: int, causal: bool, dtype: str = "float32") -> tuple[list, te.Tensor]:
    """The same attention as Triton's tutorial's torch reference computes it (casts around the softmax)."""
    w = workloads.triton_attention(te.var("B"), te.var("n"), te.var("m"), d, causal, dtype=dtype)
    return list(w.inputs), w.outputs[0]


def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool) -> np.ndarray:
    return workloads.naive_attention_reference(q, k, v, causal)


def _time_torch(mod, q, k, v, causal: bool) -> None:
    import torch  # optional: only for the comparison on a GPU

    tq, tk, tv = (torch.from_numpy(x).cuda() for x in (q, k, v))
    ty = torch.full_like(tq, float("nan"))
    scale = 1.0 / math.sqrt(q.shape[-1])
    mask = torch.ones(q.shape[1], k.shape[1], dtype=torch.bool, device="cuda").tril() if causal else None

    def eager() -> torch.Tensor:
        s = tq @ tk.transpose(1, 2) * scale
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        return torch.softmax(s, dim=-1) @ tv

    def ours() -> None:
        mod(tq, tk, tv, ty)

    def median_ms(fn, reps: int = 10) -> float:
        fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b))
        return float(np.median(times))

    ours()
    err = (ty - eager()).abs().max().item()
    t_ours, t_torch = median_ms(ours), median_ms(eager)
    B, n, d = q.shape
    m = k.shape[1]
    flops = 4.0 * B * n * m * d * (0.5 if causal else 1.0)
    print(f"device check against torch eager: max abs difference {err:.2e}")
    print(f"loopir (online softmax): {t_ours:.3f} ms, {flops / t_ours / 1e9:.2f} TFLOP/s")
    print(f"torch eager (naive):     {t_torch:.3f} ms, {flops / t_torch / 1e9:.2f} TFLOP/s"
          f"  -> loopir is {t_torch / t_ours:.2f}x {'faster' if t_ours < t_torch else 'as fast'}")


def main() -> None:
    causal = "--causal" in sys.argv
    triton = "--triton-form" in sys.argv
    dtype = "float16" if "--half" in sys.argv else "float32"
    target = "cuda" if gpu_available() and "--cpu" not in sys.argv else "cpu"
    d = 64
    B, n, m = (2, 77, 130) if "--small" in sys.argv or target == "cpu" else (64, 4096, 4096)
    form = "Triton tutorial form" if triton else "naive te"
    print(f"== attention ({form}, {'causal' if causal else 'no mask'}, {dtype}) on {target}, B*H={B} n={n} m={m} "
          f"d={d}")
    args, Y = (triton_form if triton else naive_attention)(d, causal, dtype)
    s = auto_schedule([Y], target=target)
    print(s.plan.explain())
    print()
    print(s)
    print()
    if target == "cpu":  # the CUDA kernel still compiles here (NVRTC needs no GPU): show it
        cu = build(auto_schedule([Y], target="cuda"), args + [Y], target="cuda")
        src = cu.source
        print(f"CUDA kernel ({len(cu.kernels)} kernel(s): {', '.join(cu.kernels)}), first lines:")
        print("\n".join(src[src.index("__global__"):].splitlines()[:12]))
        print()
    mod = build(s, args + [Y], target=target)
    print(f"temporaries in global memory: {[t.name for t in mod.program.temps] or 'none'}")
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((B, x, d)).astype(dtype) for x in (n, m, m))
    y = np.full((B, n, d), np.nan, dtype)
    t0 = time.perf_counter()
    mod(q, k, v, y)
    t1 = time.perf_counter()
    want = reference(q, k, v, causal)
    tol = (1e-4, 1e-5) if dtype == "float32" else (1e-2, 1e-2)
    ok = np.allclose(y, want, rtol=tol[0], atol=tol[1])
    print(f"check {Y.name} against numpy (float64): {'ok' if ok else 'MISMATCH'} "
          f"(max abs error {np.abs(y - want).max():.2e}); first call {1e3 * (t1 - t0):.1f} ms")
    if not ok:
        raise SystemExit(1)
    if target == "cuda":
        try:
            import torch  # noqa: F401
        except ImportError:
            print("torch is not importable: no comparison with PyTorch")
        else:
            _time_torch(mod, q, k, v, causal)


if __name__ == "__main__":
    main()
