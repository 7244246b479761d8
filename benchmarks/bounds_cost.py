"""What the build-time bounds proof costs: `loopir.bounds.analyse` against the whole build.

    python benchmarks/bounds_cost.py [--cuda]

With --cuda: also the CUDA target (auto_schedule for cuda, NVRTC compile, no GPU needed; disk cache off).

For each seed workload (auto-scheduled for the CPU) and the CPU GEMM recipe: the build time
(schedule + lower + codegen + JIT, cache cleared; median of 3) and the time of the proof
(`analyse`: bounds + initialised reads, what the `prove_bounds` pass runs) on the scheduled
program, and the time of `check_bounds` alone times the number of steps after which the schedule
runs it (steps that change instances or accesses: cache_read/write, compute_at/inline...).
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from codegen import build, cache_clear  # noqa: E402
from loopir import te, workloads  # noqa: E402
from loopir.bounds import analyse, check_bounds  # noqa: E402
from schedules import Schedule, auto_schedule  # noqa: E402
from schedules.gemm import schedule_gemm  # noqa: E402


def med(f, reps: int = 3) -> float:
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return sorted(ts)[len(ts) // 2] * 1e3


def gemm() -> tuple[Schedule, list]:
    n = te.var("n")
    a = te.placeholder((n, n), name="A")
    b = te.placeholder((n, n), name="B")
    k = te.reduce_axis(n, "k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    s = Schedule(c)
    schedule_gemm(s, "C", target="cpu")
    return s, [a, b, c]


def rows() -> list[tuple[str, float, float, float, int]]:
    out = []
    cases = []
    for name, f in workloads.SEEDS.items():
        w = f()
        if w.built is not None:
            cases.append((name, lambda w=w: (Schedule(w.built), list(w.args))))
        else:
            cases.append((name, lambda w=w: (auto_schedule(list(w.outputs), target="cpu"), list(w.args))))
    cases.append(("gemm (cpu recipe)", gemm))
    for name, make in cases:
        def full(make=make) -> None:
            cache_clear()
            s, args = make()
            build(s, args, target="cpu")

        t_build = med(full)
        s, args = make()
        prog = s.program
        t_proof = med(lambda prog=prog: analyse(prog))
        t_check = med(lambda prog=prog: check_bounds(prog))
        from schedules.primitives import REGISTRY
        from schedules.schedule import bounds_checked

        out.append((name, t_build, t_proof, t_check, sum(bounds_checked(REGISTRY[st["primitive"]]) for st in s.trace)))
    return out


def cuda_rows() -> list[tuple[str, float, float]]:
    n = te.var("n")
    a = te.placeholder((n, n), name="A")
    b = te.placeholder((n, n), name="B")
    k = te.reduce_axis(n, "k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    cases = [("gemm", [c], [a, b, c])]
    for nm in ("gelu", "softmax", "layernorm", "attention"):
        w = workloads.SEEDS[nm]()
        cases.append((nm, list(w.outputs), list(w.args)))
    out = []
    for nm, outs, args in cases:
        tb = med(lambda outs=outs, args=args: build(auto_schedule(outs, target="cuda"), args, target="cuda",
                                                    cache=False))
        prog = auto_schedule(outs, target="cuda").program
        out.append((nm, tb, med(lambda prog=prog: analyse(prog))))
    return out


if __name__ == "__main__":
    print(f"{'workload':20s} {'build ms':>9s} {'proof ms':>9s} {'share':>6s} {'check ms':>9s} {'checked steps':>13s} "
          f"{'per-step share':>14s}")
    for name, tb, tp, tc, steps in rows():
        print(f"{name:20s} {tb:9.1f} {tp:9.1f} {100 * tp / tb:5.1f}% {tc:9.1f} {steps:13d} "
              f"{100 * tc * steps / tb:13.1f}%")
    if "--cuda" in sys.argv:
        for name, tb, tp in cuda_rows():
            print(f"cuda {name:15s} {tb:9.1f} {tp:9.1f} {100 * tp / tb:5.1f}%")
