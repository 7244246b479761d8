"""A small tensor-core GEMM run for compute-sanitizer (racecheck / memcheck): 200 x 136 x 64, float16, edge tiles
(or the sizes and dtype given: a K that 32 does not divide runs its last k tile zero-padded; float32 runs
mma.m16n8k16.tf32x3).

    compute-sanitizer --tool racecheck python benchmarks/mma_racecheck.py [200x136x72 [bfloat16]]
"""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from codegen import build  # noqa: E402
from loopir.dtypes import from_bfloat16, to_bfloat16  # noqa: E402
from loopir import workloads as w  # noqa: E402
from loopir.lower import lower  # noqa: E402
from schedules import Schedule  # noqa: E402
from schedules.recipes.gemm_mma import schedule_gemm_mma  # noqa: E402

n, m, p = (int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "200x136x64").split("x"))
dtype = sys.argv[2] if len(sys.argv) > 2 else "float16"
wl = w.matmul_bias_relu(n=n, m=m, p=p, dtype=dtype)
s = Schedule(lower(list(wl.outputs), list(wl.inputs) + list(wl.outputs)))
schedule_gemm_mma(s)
mod = build(s, list(wl.inputs) + list(wl.outputs), target="cuda")


def to_dtype(x: np.ndarray, dtype: str) -> np.ndarray:
    return to_bfloat16(x) if dtype == "bfloat16" else x.astype(dtype)


def as64(x: np.ndarray) -> np.ndarray:
    return (from_bfloat16(x) if dtype == "bfloat16" else x).astype(np.float64)


rng = np.random.default_rng(0)
a, b, bias = (to_dtype(rng.standard_normal(x), dtype) for x in ((n, p), (p, m), (m,)))
out = to_dtype(np.full((n, m), np.nan), dtype)
mod(a, b, bias, out)
ref = np.maximum(as64(a) @ as64(b) + as64(bias), 0.0)
err = float(np.abs(as64(out) - ref).max() / np.abs(ref).max())
print(f"mma_racecheck {n}x{m}x{p} {dtype} rel err {err:.2e} {'ok' if np.isfinite(err) and err < 2e-2 else 'BAD'}")
