"""Autotuning a row softmax: tune, then build as usual (the tuned configuration is picked up), check and time it.

    python examples/tune.py [--cpu] [--small] [--trials N] [--db DIR]
    loopir tune examples/tune.py:workload --sizes m=4096,n=512 --trials 40     # the same from the command line

The search space is auto_schedule's own decisions for this program at these sizes (on CUDA: block threads, the
row strategy's thresholds and lanes, fusion; on the CPU: fusion and the worker threads). Every candidate is a
checked schedule, run on fresh random inputs with NaN-poisoned outputs and compared with the untuned build
before it is timed; every trial is journaled in the database (default: a folder under the system's temp dir
here, so the example leaves your ~/.cache/loopir/tuning alone).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

from codegen import autotune, build, gpu_available
from codegen.tune.measure import TimingPolicy
from loopir import workloads


def workload() -> workloads.Workload:
    """The tuned program: softmax over the rows of x (m, n), sizes symbolic."""
    return workloads.softmax()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--trials", type=int, default=12)
    ap.add_argument("--db", default=os.path.join(tempfile.gettempdir(), "loopir-example-tuning"))
    a = ap.parse_args()
    target = "cpu" if a.cpu or not gpu_available() else "cuda"
    m, n = (64, 256) if a.small else (65536, 512)
    w = workload()
    outs, args = list(w.outputs), list(w.args)
    res = autotune(outs, args, target, sizes={"m": m, "n": n}, trials=a.trials, db=a.db,
                   policy=TimingPolicy(max_seconds=0.5), progress=False)
    print(res.explain())
    mod = build(outs, args, target, sizes={"m": m, "n": n}, tuned=a.db)  # the database's best at this shape
    print("\n".join(x for x in mod.notes if x.startswith("tuned:")))
    x = np.random.default_rng(0).standard_normal((m, n)).astype(np.float32)
    y = np.full((m, n), np.nan, np.float32)
    t0 = time.perf_counter()
    mod(x, y)
    ms = (time.perf_counter() - t0) * 1e3
    err = float(np.abs(y - w.reference(x)[0]).max())
    print(f"tuned softmax {m}x{n} on {target}: max abs error {err:.1e} ({ms:.2f} ms, first call, with copies)")
    if not err < 1e-5:
        print("MISMATCH")
        raise SystemExit(1)


if __name__ == "__main__":
    main()
