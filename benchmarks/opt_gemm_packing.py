"""TVM's opt_gemm tutorial, its "array packing" step, on the CPU: the packed schedule against the same
schedule without packing (TVM's loop permutation + vectorize + parallel steps). The packed GEMM reads
`packedB[y // bn, k, y % bn]`; after tiling y by bn that index is `packedB[(y_o*bn + y_i) // bn, k,
(y_o*bn + y_i) % bn]`, which the index simplification (codegen/passes/simplify_indices.py) turns into
`packedB[y_o, k, y_i]`, so the vectorized y_i loop stays vector code. Medians after warm-up; every result
is checked against a float64 reference on fresh random inputs (output poisoned with NaN).

    python benchmarks/opt_gemm_packing.py [--n 512] [--threads 2] [--reps 10]

Each schedule is built twice: with the CPU pipeline as it is, and with the pass `simplify_indices` taken
out of it (the "before" column: what the packed access compiled to without the simplification).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import codegen.passes as passes  # noqa: E402
from codegen import build  # noqa: E402
from loopir import te  # noqa: E402
from schedules import Schedule  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cpu_gemm import inputs, median_ms  # noqa: E402  (the benchmarks' one timing loop and GEMM inputs)

BN, KFACTOR = 32, 4  # TVM's opt_gemm values


def schedule(n: int, packed: bool) -> tuple[Schedule, list[Any]]:
    A = te.placeholder((n, n), name="A")
    B = te.placeholder((n, n), name="B")
    k = te.reduce_axis(n, "k")
    stages = []
    if packed:
        pB = te.compute((n // BN, n, BN), lambda x, y, z: B[y, x * BN + z], name="packedB")
        C = te.compute((n, n), lambda x, y: te.sum(A[x, k] * pB[y // BN, k, y % BN], axis=k), name="C")
        stages.append(pB)
    else:
        C = te.compute((n, n), lambda x, y: te.sum(A[x, k] * B[k, y], axis=k), name="C")
    s = Schedule(C)
    x, y, kk = s.loops("C")
    xo, yo, xi, yi = s.tile(x, y, BN, BN)
    ko, ki = s.split(kk, KFACTOR)
    s.reorder(xo, yo, ko, xi, ki, yi)
    s.vectorize(yi)
    s.parallel(xo)
    if packed:
        px, _, pz = s.loops("packedB")
        s.vectorize(pz)
        s.parallel(px)
    return s, [A, B, C]


def _without_simplify(assume: Any = None) -> dict[str, tuple[Any, ...]]:
    return {k: tuple(p for p in v if p.name != "simplify_indices") for k, v in _PIPELINES(assume).items()}


_PIPELINES = passes._pipelines


def run(n: int, threads: int, reps: int) -> list[tuple[str, float, str]]:
    a, b, ref, tol = inputs(n)
    rows = []
    for packed in (False, True):
        s, args = schedule(n, packed)
        for simplify in (False, True):
            passes._pipelines = _PIPELINES if simplify else _without_simplify
            mod = build(s, args, target="cpu", threads=threads, cache=False)
            passes._pipelines = _PIPELINES
            out = np.full((n, n), np.nan, np.float32)
            mod(a, b, out)
            err = float(np.abs(out - ref).max())
            assert err <= tol, f"packed={packed}: max |err| {err} > {tol}"
            ms = median_ms(lambda mod=mod, out=out: mod(a, b, out), reps, warmup=2)
            rows.append(("packed" if packed else "unpacked", ms, "simplify_indices" if simplify else "without it"))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=10)
    o = ap.parse_args()
    print(f"opt_gemm n={o.n} threads={o.threads} bn={BN} kfactor={KFACTOR}")
    for name, ms, how in run(o.n, o.threads, o.reps):
        print(f"  {name:9s} {ms:9.2f} ms  ({how})")


if __name__ == "__main__":
    main()
