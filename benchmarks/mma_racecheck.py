"""A small tensor-core GEMM run for compute-sanitizer (racecheck / memcheck): 200 x 136 x 64, float16, edge tiles.

    compute-sanitizer --tool racecheck python benchmarks/mma_racecheck.py
"""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from codegen import build  # noqa: E402
from loopir import workloads as w  # noqa: E402
from loopir.lower import lower  # noqa: E402
from schedules import Schedule  # noqa: E402
from schedules.recipes.gemm_mma import schedule_gemm_mma  # noqa: E402

n, m, p = 200, 136, 64
wl = w.matmul_bias_relu(n=n, m=m, p=p, dtype="float16")
s = Schedule(lower(list(wl.outputs), list(wl.inputs) + list(wl.outputs)))
schedule_gemm_mma(s)
mod = build(s, list(wl.inputs) + list(wl.outputs), target="cuda")
rng = np.random.default_rng(0)
a, b, bias = (rng.standard_normal(x).astype(np.float16) for x in ((n, p), (p, m), (m,)))
out = np.full((n, m), np.nan, dtype=np.float16)
mod(a, b, bias, out)
ref = np.maximum(a.astype(np.float64) @ b.astype(np.float64) + bias, 0.0)
print("mma_racecheck rel err", float(np.abs(out - ref).max() / np.abs(ref).max()))
