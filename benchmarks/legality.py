"""Median time of one checked schedule primitive on 3-deep nests with 4 statements.

Each timing is one `Schedule.apply` with check=True on a fresh schedule whose dependences are
already computed (the one-time analysis is timed separately): the rewrite, the legality
test and, for a refused step, the witness and the error message. Goal: <= 20 ms per step
(measured here, never asserted). Run: `python benchmarks/legality.py [repeats]`; writes
benchmarks/results/legality.json.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from loopir import ir, te  # noqa: E402
from schedules import Schedule, ScheduleError  # noqa: E402


def program():
    """4 statements in 3-deep nests: two producers, an in-place stencil update, a consumer."""
    n = te.var("n")
    A = ir.buffer((n, n, n), name="A")
    B = ir.buffer((n, n, n), name="B")
    C = ir.buffer((n, n, n), name="C")
    D = ir.buffer((n, n, n), name="D")
    b = ir.Builder("four")
    with b.loop("i", 0, n) as i, b.loop("j", 0, n) as j, b.loop("k", 0, n) as k:
        b.store(B, (i, j, k), A[i, j, k] * 2.0, name="S1")
    with b.loop("i", 0, n) as i, b.loop("j", 0, n) as j, b.loop("k", 0, n) as k:
        b.store(C, (i, j, k), B[i, j, k] + A[i, j, k], name="S2")
    with b.loop("i", 1, n) as i, b.loop("j", 0, n - 1) as j, b.loop("k", 0, n) as k:
        b.store(D, (i, j, k), D[i - 1, j + 1, k] + C[i, j, k], name="S3")
    with b.loop("i", 0, n) as i, b.loop("j", 0, n) as j, b.loop("k", 0, n) as k:
        b.store(A, (i, j, k), D[i, j, k] * C[i, j, k], name="S4")
    return b.finish([A, B, C, D])


def _time(fn, repeats: int) -> float:
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3


def main(repeats: int = 30) -> dict:
    p = program()
    cases = {
        "split(S2.k, 4) accepted": ("S2", lambda s, L: s.split(L[2], 4)),
        "tile(S1.i, S1.j) accepted": ("S1", lambda s, L: s.tile(L[0], L[1], 4, 4)),
        "reorder(S2.k, S2.i) accepted": ("S2", lambda s, L: s.reorder(L[2], L[0])),
        "reorder(S3.j, S3.i) refused": ("S3", lambda s, L: s.reorder(L[1], L[0])),
        "tile(S3.i, S3.j) refused": ("S3", lambda s, L: s.tile(L[0], L[1], 4, 4)),
        "parallel(S3.i) refused": ("S3", lambda s, L: s.parallel(L[0])),
        "fuse(S1.i, S2.i) accepted": (None, lambda s, L: s.fuse(s.loops("S1")[0], s.loops("S2")[0])),
    }
    rows = {}
    analysis = _time(lambda: __import__("loopir.poly", fromlist=["x"]).dependences(program()), repeats)
    for label, (stmt, step) in cases.items():
        def one(stmt=stmt, step=step):
            s = Schedule(p)
            _ = s.deps  # the one-time analysis is cached per program and excluded
            L = s.loops(stmt) if stmt else ()
            t = time.perf_counter()
            try:
                step(s, L)
            except ScheduleError as e:
                str(e)
            return time.perf_counter() - t
        one()
        rows[label] = statistics.median(one() for _ in range(repeats)) * 1e3
    print(f"{'step (check=True)':40s} {'median ms':>10s}")
    print(f"{'dependence analysis (once per program)':40s} {analysis:10.2f}")
    for label, ms in rows.items():
        print(f"{label:40s} {ms:10.2f}")
    out = {"repeats": repeats, "analysis_ms": analysis, "steps_ms": rows, "goal_ms": 20}
    os.makedirs(os.path.join(ROOT, "benchmarks", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "benchmarks", "results", "legality.json"), "w") as f:
        json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 30)
