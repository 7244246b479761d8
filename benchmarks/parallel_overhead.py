"""Per-call cost of a parallel CPU loop: one small elementwise program (B = 2A + 1 over rows x 64, the rows
loop parallel) called through the module's fast path with threads=1 (no pool: the serial cost) and with
threads=2 and 4 (the pool); the difference is what running a loop on threads costs per call. Microseconds
per call, the fastest of `--rounds` rounds of `--calls` calls (the fastest: on a shared, loaded machine
it is the least disturbed round), and the process CPU time per call (caller and workers together: the
work the pool adds, less sensitive to the load than the wall time); every result is checked against numpy.

    python benchmarks/parallel_overhead.py [--rows 8 64 1024] [--calls 200] [--rounds 30]

Run it once with PYTHONPATH at a tree with the ThreadPoolExecutor runtime for the "before" numbers.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from codegen import build  # noqa: E402
from loopir import te  # noqa: E402
from schedules import Schedule  # noqa: E402


def per_call_us(rows: int, threads: int, calls: int, rounds: int) -> tuple[float, float]:
    A = te.placeholder((rows, 64), name="A")
    B = te.compute((rows, 64), lambda i, j: A[i, j] * 2.0 + 1.0, name="B")
    s = Schedule(B)
    s.parallel(s.loops(B)[0])
    mod = build(s, [A, B], target="cpu", threads=threads)
    a = np.random.default_rng().standard_normal((rows, 64)).astype(np.float32)
    b = np.full((rows, 64), np.nan, np.float32)
    mod(a, b)
    np.testing.assert_allclose(b, a.astype(np.float64) * 2 + 1, rtol=1e-6)
    best = cpu = float("inf")
    for _ in range(rounds):
        t, c = time.perf_counter(), time.process_time()
        for _ in range(calls):
            mod(a, b)
        best = min(best, (time.perf_counter() - t) / calls * 1e6)
        cpu = min(cpu, (time.process_time() - c) / calls * 1e6)
    return best, cpu


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[8, 64, 1024])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=30)
    o = ap.parse_args()
    print(f"{'rows':>6} {'threads':>7} {'wall us/call':>13} {'cpu us/call':>12}")
    for rows in o.rows:
        for th in (1, 2, 4):
            wall, cpu = per_call_us(rows, th, o.calls, o.rounds)
            print(f"{rows:>6} {th:>7} {wall:>13.1f} {cpu:>12.1f}")


if __name__ == "__main__":
    main()
