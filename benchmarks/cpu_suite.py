"""CPU target benchmark: loopir (LLVM JIT) against numpy on the same arrays, same process.

    python benchmarks/cpu_suite.py [--quick]

Medians over repeated runs. Each workload runs on one thread and with `threads` = all CPUs
(top-level parallel loops). Also: compile time (lower + schedule + codegen + JIT) of the GELU
chain, and the time of a cache hit. Prints a table and writes benchmarks/results/cpu_suite.json.
Goals (reported, not asserted): fused elementwise >= 2x numpy on one thread and >= 3x in parallel
(2 cores); softmax and layer norm >= 1.5x; tiled matmul >= 0.25x numpy's BLAS; compile <= 100 ms;
cache hit <= 1 ms.
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from codegen import build, cache_clear  # noqa: E402
from codegen.llvm.runtime import default_threads  # noqa: E402
from loopir import te  # noqa: E402
from loopir.lower import lower  # noqa: E402
from schedules import Schedule  # noqa: E402
from schedules.recipes import schedule_gemm  # noqa: E402

QUICK = "--quick" in sys.argv
REPS = 3 if QUICK else 9
C = math.sqrt(2 / math.pi)


def median_ms(f, reps: int = REPS) -> float:
    f()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return sorted(ts)[len(ts) // 2] * 1e3


def auto(outputs):
    try:
        from schedules import auto_schedule
    except ImportError:
        return lower(outputs)
    return auto_schedule(outputs, target="cpu")


# ----------------------------------------------------------------------------- workloads


def sincos(n):
    x = te.placeholder((n,), name="x")
    y = te.compute((n,), lambda i: te.sin(x[i]) ** 2 + te.cos(x[i]) ** 2, name="y")
    return [x, y], [y]


def gelu_chain(n):
    x = te.placeholder((n,), name="x")
    cube = te.compute((n,), lambda i: x[i] * x[i] * x[i], name="cube")
    inner = te.compute((n,), lambda i: C * (x[i] + 0.044715 * cube[i]), name="inner")
    y = te.compute((n,), lambda i: 0.5 * x[i] * (1.0 + te.tanh(inner[i])), name="y")
    return [x, y], [y]


def softmax(m, n):
    x = te.placeholder((m, n), name="x")
    k1, k2 = te.reduce_axis(n, "k"), te.reduce_axis(n, "k")
    mx = te.compute((m,), lambda i: te.max(x[i, k1], axis=k1), name="row_max")
    sm = te.compute((m,), lambda i: te.sum(te.exp(x[i, k2] - mx[i]), axis=k2), name="row_sum")
    y = te.compute((m, n), lambda i, j: te.exp(x[i, j] - mx[i]) / sm[i], name="y")
    return [x, y], [y]


def layernorm(m, n):
    x = te.placeholder((m, n), name="x")
    w = te.placeholder((n,), name="w")
    b = te.placeholder((n,), name="b")
    k1, k2 = te.reduce_axis(n, "k"), te.reduce_axis(n, "k")
    fn = te.cast("float32", n)
    mean = te.compute((m,), lambda i: te.sum(x[i, k1] / fn, axis=k1), name="mean")
    var = te.compute((m,), lambda i: te.sum((x[i, k2] - mean[i]) * (x[i, k2] - mean[i]) / fn, axis=k2), name="var")
    y = te.compute((m, n), lambda i, j: (x[i, j] - mean[i]) * te.rsqrt(var[i] + 1e-5) * w[j] + b[j], name="y")
    return [x, w, b, y], [y]


def matmul_schedule(n):
    """schedules.gemm's CPU recipe: B column panels (parallel) x A row strips, a 6x64 register tile
    (cache_write 'local'), k outside the tile, tile rows unrolled, columns vectorized."""
    a = te.placeholder((n, n), name="A")
    b = te.placeholder((n, n), name="B")
    k = te.reduce_axis(n, "k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    s = Schedule(c)
    schedule_gemm(s, "C", target="cpu")
    return [a, b, c], s


# ----------------------------------------------------------------------------- numpy baselines


def np_sincos(x):
    return np.sin(x) ** 2 + np.cos(x) ** 2


def np_gelu(x):
    return 0.5 * x * (1 + np.tanh(C * (x + 0.044715 * (x * x * x))))


def np_softmax(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def np_layernorm(x, w, b):
    mu = x.mean(axis=1, keepdims=True)
    v = ((x - mu) ** 2).mean(axis=1, keepdims=True)
    return (x - mu) / np.sqrt(v + 1e-5) * w + b


def main() -> None:
    rng = np.random.default_rng(0)
    threads = default_threads()
    rows = []
    big = 1 << (20 if QUICK else 24)
    side = 1024 if QUICK else 4096
    mm = 256 if QUICK else 1024
    x1 = rng.uniform(-4, 4, big).astype(np.float32)
    x2 = rng.uniform(-4, 4, side * side).astype(np.float32)
    xm = rng.standard_normal((side, side)).astype(np.float32)
    w, b = rng.standard_normal(side).astype(np.float32), rng.standard_normal(side).astype(np.float32)
    A, B = rng.standard_normal((mm, mm)).astype(np.float32), rng.standard_normal((mm, mm)).astype(np.float32)

    cases = [
        ("sin^2+cos^2", f"2^{int(math.log2(big))} f32", sincos(te.var("n")), (x1,), lambda: np_sincos(x1),
         np_sincos(x1)),
        ("GELU chain", f"{side}^2 f32", gelu_chain(te.var("n")), (x2,), lambda: np_gelu(x2), np_gelu(x2)),
        ("row softmax", f"{side}x{side} f32", softmax(te.var("m"), te.var("n")), (xm,), lambda: np_softmax(xm),
         np_softmax(xm)),
        ("layer norm", f"{side}x{side} f32", layernorm(te.var("m"), te.var("n")), (xm, w, b),
         lambda: np_layernorm(xm, w, b), np_layernorm(xm, w, b)),
    ]
    for name, size, (args, outs), ins, npf, ref in cases:
        sched = auto(outs)
        y = np.empty_like(ref)
        t_np = median_ms(npf)
        res = {}
        for th in (1, threads):
            mod = build(sched, args, threads=th)
            mod(*ins, y)
            assert np.allclose(y, ref, rtol=1e-4, atol=1e-4), f"{name}: result differs from numpy"
            res[th] = median_ms(lambda mod=mod, ins=ins, y=y: mod(*ins, y))
        rows.append(dict(name=name, size=size, numpy_ms=t_np, one_thread_ms=res[1], parallel_ms=res[threads],
                         speedup_1t=t_np / res[1], speedup_par=t_np / res[threads]))

    args, s = matmul_schedule(te.var("n"))
    cm = np.full((mm, mm), np.nan, np.float32)
    ref = A @ B
    res = {}
    for th in (1, threads):
        mod = build(s, args, threads=th)
        mod(A, B, cm)
        assert np.allclose(cm, ref, rtol=1e-3, atol=1e-3), "matmul differs from numpy"
        # numpy's BLAS threads spin for a while after a call and would take a core from ours: let them park
        time.sleep(0.5)
        res[th] = median_ms(lambda mod=mod: mod(A, B, cm), reps=REPS)
    t_np = median_ms(lambda: A @ B)  # timed last, for the same reason
    rows.append(dict(name="matmul (tiled)", size=f"{mm}^3 f32", numpy_ms=t_np, one_thread_ms=res[1],
                     parallel_ms=res[threads], speedup_1t=t_np / res[1], speedup_par=t_np / res[threads]))

    # compile time: lower + auto_schedule + codegen + JIT of the GELU chain, cache cleared each time
    def compile_once():
        cache_clear()
        a, o = gelu_chain(te.var("n"))
        build(auto(o), a)

    compile_ms = median_ms(compile_once, reps=7)
    a, o = gelu_chain(te.var("n"))
    prog = auto(o)
    build(prog, a)
    a2, o2 = gelu_chain(te.var("n"))
    prog2 = auto(o2)  # structurally equal, fresh objects
    hit_ms = median_ms(lambda: build(prog2, a2), reps=21)

    print(f"\nloopir CPU suite — {platform.processor() or platform.machine()}, {threads} thread(s), "
          f"numpy {np.__version__}, median of {REPS}")
    hdr = f"{'workload':16} {'size':14} {'numpy ms':>9} {'1 thr ms':>9} {'x numpy':>8} {'par ms':>8} {'x numpy':>8}"
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print(f"{r['name']:16} {r['size']:14} {r['numpy_ms']:9.2f} {r['one_thread_ms']:9.2f} {r['speedup_1t']:8.2f} "
              f"{r['parallel_ms']:8.2f} {r['speedup_par']:8.2f}")
    print(f"\ncompile GELU chain (lower + schedule + codegen + JIT): {compile_ms:.1f} ms median (goal <= 100)")
    print(f"build() cache hit: {hit_ms:.3f} ms median (goal <= 1)")
    out = dict(threads=threads, reps=REPS, quick=QUICK, numpy=np.__version__, rows=rows,
               compile_gelu_ms=compile_ms, cache_hit_ms=hit_ms)
    d = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "cpu_suite.json" if not QUICK else "cpu_suite_quick.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
