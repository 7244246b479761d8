"""CPU GEMM through the default path: `build([C], [A, B, C])` on plain tensors (auto_schedule picks the GEMM
recipe), at fixed and at symbolic (te.var) sizes, against numpy's BLAS and, when importable, PyTorch CPU's
matmul, all on the same thread count (default 2). Medians after warm-up; every result is checked against a
float64 reference on fresh random inputs (outputs poisoned with NaN first).

    python benchmarks/cpu_gemm.py [n ...] [--threads 2] [--reps 15]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from codegen import build  # noqa: E402
from loopir import te  # noqa: E402


def median_ms(fn: Any, reps: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t) * 1e3)
    return float(np.median(ts))


def matmul(n: Any, m: Any, p: Any) -> tuple[list[Any], Any]:
    a = te.placeholder((n, p), name="A")
    b = te.placeholder((p, m), name="B")
    k = te.reduce_axis(p, "k")
    c = te.compute((n, m), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    return [a, b, c], c


def inputs(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """Fresh random float32 A, B (n x n), their float64 product and the error a float32 GEMM may make."""
    rng = np.random.default_rng()
    a = rng.standard_normal((n, n)).astype(np.float32)
    b = rng.standard_normal((n, n)).astype(np.float32)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    return a, b, ref, 1e-4 * n ** 0.5 * float(np.abs(ref).max())


def run(n: int, threads: int, reps: int) -> list[tuple[str, float]]:
    A, B, ref, tol = inputs(n)
    rows = []
    for label, sizes in (("fixed", (n, n, n)), ("symbolic", (te.var("n"), te.var("m"), te.var("p")))):
        args, c = matmul(*sizes)
        t0 = time.perf_counter()
        mod = build([c], args, threads=threads)
        build_s = time.perf_counter() - t0
        out = np.full((n, n), np.nan, np.float32)
        mod(A, B, out)
        err = float(np.abs(out - ref).max())
        assert err <= tol, f"{label}: max |err| {err} > {tol}"
        time.sleep(0.3)
        t = median_ms(lambda mod=mod, out=out: mod(A, B, out), reps)
        rows.append((f"loopir build() {label} (build {build_s:.1f} s)", t))
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    rows.append(("numpy (BLAS)", median_ms(lambda: A @ B, reps)))
    try:
        import torch
    except ImportError:
        rows.append(("torch: not importable", float("nan")))
    else:
        torch.set_num_threads(threads)
        ta, tb = torch.from_numpy(A), torch.from_numpy(B)
        rows.append((f"torch {torch.__version__} matmul", median_ms(lambda: torch.matmul(ta, tb), reps)))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("sizes", nargs="*", type=int, default=[1024])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=15)
    o = ap.parse_args()
    for n in o.sizes:
        rows = run(n, o.threads, o.reps)
        base = {k: v for k, v in rows}.get("numpy (BLAS)")
        tref = next((v for k, v in rows if k.startswith("torch ")), None)
        print(f"\nGEMM {n}^3 float32, {o.threads} threads, medians of {o.reps}")
        print(f"{'impl':48} {'ms':>8} {'GFLOP/s':>8} {'numpy/x':>8} {'torch/x':>8}")
        for k, v in rows:
            gf = 2 * n ** 3 / v / 1e6 if v == v else float("nan")
            print(f"{k:48} {v:8.2f} {gf:8.1f} {base / v:8.2f} {(tref / v) if tref else float('nan'):8.2f}")


if __name__ == "__main__":
    main()
