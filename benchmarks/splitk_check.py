"""Skinny GEMMs through the default path, for compute-sanitizer (memcheck / racecheck): relu(A @ B + bias) at a few
row counts, float32 and float16, at fixed sizes (split-K: SIMT tiles, and tensor cores from 16 half rows) and
through one module of symbolic sizes called at several row counts (each its own call-time variant). Every output
is poisoned with NaN first and checked against float64; prints one line per case and `splitk_check: N ok, M bad`.

    compute-sanitizer --tool memcheck python benchmarks/splitk_check.py
    python benchmarks/splitk_check.py 4096          # the same at m = p = 4096 (no sanitizer)
"""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from codegen import build  # noqa: E402
from loopir import te  # noqa: E402
from loopir import workloads as w  # noqa: E402

ROWS = (1, 3, 7, 16, 20, 64)


def check(mod: object, n: int, m: int, p: int, dtype: str, label: str, rng: np.random.Generator) -> bool:
    a, b, bias = (rng.standard_normal(x).astype(dtype) for x in ((n, p), (p, m), (m,)))
    out = np.full((n, m), np.nan, dtype)
    mod(a, b, bias, out)  # type: ignore[operator]
    ref = np.maximum(a.astype(np.float64) @ b.astype(np.float64) + bias.astype(np.float64), 0.0)
    err = float(np.abs(out.astype(np.float64) - ref).max() / np.abs(ref).max())
    ok = bool(np.isfinite(err) and err < (2e-2 if dtype == "float16" else 1e-5))
    kernels = getattr(mod, "kernels", "?")
    print(f"{label} {n}x{m}x{p} {dtype}: rel err {err:.2e} {'ok' if ok else 'BAD'} kernels {kernels}", flush=True)
    return ok


def main() -> None:
    m = p = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    m, p = (m, p) if m else (200, 1104)  # 1104: a last chunk and a last k tile that are ragged
    rng = np.random.default_rng(0)
    results = []
    for dtype in ("float32", "float16"):
        for n in ROWS:
            wl = w.matmul_bias_relu(n=n, m=m, p=p, dtype=dtype)
            mod = build(list(wl.outputs), list(wl.inputs) + list(wl.outputs), target="cuda")
            results.append(check(mod, n, m, p, dtype, "fixed", rng))
        wl = w.matmul_bias_relu(n=te.var("n"), m=te.var("m"), p=te.var("p"), dtype=dtype)
        mod = build(list(wl.outputs), list(wl.inputs) + list(wl.outputs), target="cuda")
        for n in ROWS:
            results.append(check(mod, n, m, p, dtype, "symbolic", rng))
        print(f"  variants: {getattr(mod, 'specializations', [])}")
    print(f"splitk_check: {sum(results)} ok, {len(results) - sum(results)} bad")


if __name__ == "__main__":
    main()
