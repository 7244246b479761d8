"""C = relu(A @ B + bias) as ONE kernel: a hand-written tiled-GEMM schedule, read like a recipe.

    python examples/matmul_bias_relu.py [n m p] [--small] [--cpu]

--small: 257 x 129 x 65 (sizes the tiles do not divide); --cpu: run on the CPU only (the CUDA kernel is
still generated, compiled with NVRTC and printed). Default sizes: 1024 x 1024 x 1024.
"""

from __future__ import annotations

import sys

import numpy as np

from codegen import build
from loopir import te
from schedules import Schedule

import schedules.primitives.cache  # noqa: F401  (registers s.cache_read)
import schedules.primitives.cache_write  # noqa: F401  (registers s.cache_write)


def matmul_bias_relu(n: int, m: int, p: int):
    a = te.placeholder((n, p), name="A")
    b = te.placeholder((p, m), name="B")
    bias = te.placeholder((m,), name="bias")
    k = te.reduce_axis(p, name="k")
    mm = te.compute((n, m), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="matmul")
    c = te.compute((n, m), lambda i, j: te.maximum(mm[i, j] + bias[j], 0.0), name="C")
    return [a, b, bias, c]


def gpu_recipe(s: Schedule) -> None:
    i, j, k = s.loops("matmul")
    bi, ir = s.split(i, 128)         # 1. a block computes a 128 x 128 tile of C ...
    ty, ii = s.split(ir, 8)          # 2. ... with 16 x 16 threads, each owning 8 x 8 elements
    bj, jr = s.split(j, 128)
    tx, jj = s.split(jr, 8)
    s.reorder(bi, bj, ty, tx, ii, jj)
    s.bind(bi, "blockIdx.y").bind(bj, "blockIdx.x").bind(ty, "threadIdx.y").bind(tx, "threadIdx.x")
    s.cache_write("matmul", "local", tx, epilogue=["C"])   # 3. accumulate in registers; bias + relu on them
    ii, jj, k = s.loops("matmul")[-3:]
    ko, ki = s.split(k, 16)          # 4. march over k in steps of 16 ...
    s.reorder(ko, ki, ii, jj)        # ... updating the whole register tile at each k
    s.cache_read("A", "shared", ko)  # 5. stage the block's 128 x 16 tile of A and 16 x 128 tile of B in shared
    s.cache_read("B", "shared", ko)  #    memory (copied by the whole block; the CUDA target double-buffers it)
    for lp in s.loops("matmul")[-3:]:
        s.unroll(lp)                 # 6. unroll the register tile (and k inside the shared tile)
    for stmt in ("matmul_init", "C"):
        for lp in s.loops(stmt)[-2:]:
            s.unroll(lp)


def cpu_recipe(s: Schedule) -> None:
    i, j, k = s.loops("matmul")
    io, ii = s.split(i, 8)
    jo, ji = s.split(j, 64)
    s.reorder(io, jo, ii, ji)        # 1. 8 x 64 tiles
    s.parallel(io)                   # 2. rows of tiles on all cores
    s.cache_write("matmul", "local", jo, epilogue=["C"])   # 3. the tile in a scratch buffer; epilogue fused
    ii, ji, k = s.loops("matmul")[-3:]
    s.reorder(k, ii, ji)             # 4. one k at a time over the tile ...
    s.vectorize(ji)                  # ... vectorised along j


def main(n: int = 1024, m: int = 1024, p: int = 1024, cpu_only: bool = False) -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, p)).astype(np.float32)
    b = rng.standard_normal((p, m)).astype(np.float32)
    bias = rng.standard_normal(m).astype(np.float32)
    ref = np.maximum(a.astype(np.float64) @ b + bias, 0.0)
    targets = ["cpu"]
    try:
        if cpu_only:
            raise RuntimeError("--cpu")
        from codegen import gpu_available

        if gpu_available():
            targets.append("cuda")
    except Exception:  # noqa: BLE001 - no GPU stack: CPU only
        pass
    for target in targets + (["cuda-source"] if "cuda" not in targets else []):
        tensors = matmul_bias_relu(n, m, p)
        s = Schedule(tensors[-1])
        (gpu_recipe if target.startswith("cuda") else cpu_recipe)(s)
        mod = build(s, tensors, target="cuda" if target.startswith("cuda") else "cpu")
        print(f"--- {target}: kernels {mod.kernels}")
        if target == "cuda-source":
            print(mod.source[mod.source.index("extern"):][:2500])
            continue
        print(s)
        out = np.full((n, m), np.nan, np.float32)
        mod(a, b, bias, out)
        err = float(np.abs(out - ref).max() / np.abs(ref).max())
        print(f"{target}: relative error {err:.2e}")
        assert err < 1e-4, err


if __name__ == "__main__":
    sizes = [int(x) for x in sys.argv[1:] if not x.startswith("--")]
    if "--small" in sys.argv:
        sizes = [257, 129, 65]
    main(*sizes[:3], cpu_only="--cpu" in sys.argv)
