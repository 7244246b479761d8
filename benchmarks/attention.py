"""Attention from plain te (workloads.naive_attention) against PyTorch on the GPU: one symbolic build per dtype and
mask, run at every shape; beside it PyTorch eager's naive composition and scaled_dot_product_attention (SDPA) in the
same run. Checks every output against float64 (computed by torch on the GPU), outputs NaN-poisoned first.

    python3 benchmarks/attention.py [--dtypes float16,bfloat16,float32] [--masks none,causal]
                                    [--shapes 64x4096x4096,64x1000x1000,12x333x777] [--depth 64] [--no-wgmma]
                                    [--form naive|triton]
                                    [--out DIR]

Shapes are (batch x heads) x query rows x keys, head dimension 64. TFLOP/s counts 4 n m d per batch (halved with the
causal mask). Writes RESULTS_attention.md into --out (default: benchmarks/).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time


sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from codegen import build  # noqa: E402
from gpu_suite import time_cuda  # noqa: E402
from loopir import te, workloads  # noqa: E402
from schedules import attention, auto_schedule  # noqa: E402

H = 16  # heads: the batch x heads dimension is viewed as (batch, H) for SDPA


def _row(mod, dtype: str, causal: bool, B: int, n: int, m: int, D: int, built: float) -> dict:  # noqa: ANN001
    """Check and time `mod` at one shape beside PyTorch eager's naive composition and SDPA."""
    import torch
    import torch.nn.functional as F

    tdt = getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(B * n + m)
    q, k, v = (torch.randn(B, x, D, device="cuda", generator=g).to(tdt) for x in (n, m, m))
    y = torch.full_like(q, float("nan"))
    scale = 1.0 / math.sqrt(D)
    tri = torch.ones(n, m, dtype=torch.bool, device="cuda").tril() if causal else None
    # (batch, heads, rows, d): SDPA's flash kernel takes 4-d tensors only
    q4, k4, v4 = (x.view(B // H, H, x.shape[1], D) if B % H == 0 else x.unsqueeze(1) for x in (q, k, v))

    def eager() -> torch.Tensor:
        sc = (q @ k.transpose(1, 2)) * scale
        if tri is not None:
            sc = sc.masked_fill(~tri, float("-inf"))
        return torch.softmax(sc, dim=-1) @ v

    def sdpa() -> torch.Tensor:
        return F.scaled_dot_product_attention(q4, k4, v4, is_causal=causal)

    def ours() -> None:
        mod(q, k, v, y)

    ours()
    torch.cuda.synchronize()
    q64, k64, v64 = (x.double() for x in (q, k, v))
    s64 = (q64 @ k64.transpose(1, 2)) * scale
    if tri is not None:
        s64 = s64.masked_fill(~tri, float("-inf"))
    ref = torch.softmax(s64, dim=-1) @ v64
    err = ((y.double() - ref).abs().max() / ref.abs().max()).item()
    eager_err = ((eager().double() - ref).abs().max() / ref.abs().max()).item()  # PyTorch's own, for scale
    t_ours, t_eager, t_sdpa = (time_cuda(torch, f, batch=3, repeat=9) for f in (ours, eager, sdpa))
    flops = 4.0 * B * n * m * D * (0.5 if causal else 1.0)
    tc = next((k.split(".")[1] for k in ("attention.wgmma", "attention.m16n8k16", "attention.tf32x3")
               if k in mod.source), "no")
    r = dict(dtype=dtype, mask="causal" if causal else "none", shape=f"{B}x{n}x{m}", d=D, tc=tc, ours=t_ours,
             eager=t_eager, sdpa=t_sdpa, tflops=flops / t_ours / 1e9,
             sdpa_tflops=flops / t_sdpa / 1e9, err=err, eager_err=eager_err, build=built)
    print(f"{dtype:9s} d{D} {r['mask']:7s} {r['shape']:16s} ours {t_ours:8.3f} ms ({r['tflops']:6.1f} TFLOP/s)  "
          f"eager {t_eager:8.3f}  sdpa {t_sdpa:8.3f} ({r['sdpa_tflops']:6.1f})  ours/sdpa throughput "
          f"{t_sdpa / t_ours:5.2f}  eager/ours {t_eager / t_ours:5.2f}  err {err:.1e} (eager {eager_err:.1e})  "
          f"tensor cores {r['tc']}",
          flush=True)
    return r


def main() -> None:
    import torch

    ap = argparse.ArgumentParser()
    ap.add_argument("--dtypes", default="float16,bfloat16,float32")
    ap.add_argument("--masks", default="none,causal")
    ap.add_argument("--shapes", default="64x4096x4096,64x1000x1000,12x333x777,96x1024x1024")
    ap.add_argument("--depth", type=int, default=64, help="head dimension")
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--no-wgmma", action="store_true", help="the mma.sync kernel (attention.m16n8k16) only")
    ap.add_argument("--form", choices=("naive", "triton"), default="naive",
                    help="the te program: naive_attention (O = P V, Y = O / sum) or triton_attention (the torch "
                         "reference of Triton's fused-attention tutorial: softmax(S.float()).half() @ V)")
    a = ap.parse_args()
    attention.WGMMA_ATTENTION = not a.no_wgmma
    shapes = [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",")]
    rows = []
    for dtype in a.dtypes.split(","):
        for mask in a.masks.split(","):
            causal = mask != "none"
            make = workloads.naive_attention if a.form == "naive" else workloads.triton_attention
            w = make(te.var("B"), te.var("n"), te.var("m"), a.depth, causal, dtype=dtype)
            t0 = time.perf_counter()
            s = auto_schedule(list(w.outputs), target="cuda")
            mod = build(s, list(w.inputs) + list(w.outputs), target="cuda")
            built = time.perf_counter() - t0
            for B, n, m in shapes:
                if not causal or n == m:
                    rows.append(_row(mod, dtype, causal, B, n, m, a.depth, built))
    head = (f"| dtype | mask | B·H x n x m (d {a.depth}) | ours ms | TFLOP/s | eager ms | SDPA ms | SDPA TFLOP/s | "
            "ours / SDPA throughput | eager / ours | rel. error | eager's error | tensor cores |")
    lines = [f"# Attention from plain te on the GPU (benchmarks/attention.py --form {a.form})", "",
             f"{torch.cuda.get_device_name()}; one symbolic build (B, n, m as te.var) per dtype and mask; medians "
             "(gpu_suite.time_cuda: CUDA events around 3 calls, 9 times); error against float64, relative to max "
             "|ref|.", "", head,
             "|" + "---|" * 13]
    for r in rows:
        lines.append(f"| {r['dtype']} | {r['mask']} | {r['shape']} | {r['ours']:.3f} | {r['tflops']:.1f} | "
                     f"{r['eager']:.3f} | {r['sdpa']:.3f} | {r['sdpa_tflops']:.1f} | {r['sdpa'] / r['ours']:.2f} | "
                     f"{r['eager'] / r['ours']:.2f} | {r['err']:.1e} | {r['eager_err']:.1e} | {r['tc']} |")
    with open(os.path.join(a.out, "RESULTS_attention.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
