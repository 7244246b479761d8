"""One script for the GPU machine: gpu-marked tests, compute-sanitizer memcheck, the GPU suite.

    python3 benchmarks/gpu_check.py [--quick]

Prints a short table last. `--memcheck-target` is the small program run under compute-sanitizer
(it is also this script: `python3 benchmarks/gpu_check.py --small` runs every seed workload with a
hand-written bound schedule once, at small sizes, and checks the results).
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]


def small_suite() -> int:
    """Every seed workload (bound by hand) once at small sizes; exit code 1 on a mismatch."""
    import numpy as np
    from test_cuda_helpers import bind_elementwise, bind_rows, fuse_rows

    from codegen.cuda_build import build_cuda
    from loopir import workloads as W

    bad = 0
    cases = [("sincos", bind_elementwise), ("gelu", bind_elementwise), ("horizontal", bind_elementwise),
             ("softmax", fuse_rows), ("layernorm", fuse_rows), ("softmax", bind_rows),
             ("matmul_bias_relu", bind_elementwise), ("stencil5", bind_elementwise)]
    for name, sched in cases:
        wl = W.SEEDS[name]()
        mod = build_cuda(sched(wl.program()))
        sizes = {v.name: 67 for v in wl.sizes}
        ins = wl.random_inputs(sizes, 0)
        outs = wl.empty_outputs(sizes)
        mod(*wl.call_args(ins, outs))
        tol = wl.tolerance * 10
        ok = all(np.allclose(o, r, rtol=tol, atol=tol) for o, r in zip(outs, wl.reference(*ins)))
        print(f"small {name:18s} {sched.__name__:16s} {'ok' if ok else 'MISMATCH'}")
        bad += not ok
    for ex in sorted(glob.glob(os.path.join(ROOT, "examples", "*.py"))):
        print("example", os.path.basename(ex))
    return 1 if bad else 0


def _run(cmd: list[str], timeout: int) -> tuple[int, str, float]:
    t = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        out, rc = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        out, rc = f"{e.stdout or ''}{e.stderr or ''}\nTIMEOUT", 124
    return rc, out if isinstance(out, str) else str(out), time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true", help="run the small suite (the memcheck target) and exit")
    ap.add_argument("--quick", action="store_true", help="small benchmark sizes")
    ap.add_argument("--examples", action="store_true", help="also run examples/*.py under memcheck")
    a = ap.parse_args()
    if a.small:
        sys.exit(small_suite())
    py = sys.executable
    results = []
    rc, out, dt = _run([py, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "tests"], 900)
    print(out[-4000:])
    results.append(("pytest -m gpu", rc, out.strip().splitlines()[-1] if out.strip() else "", dt))
    san = shutil.which("compute-sanitizer") or next(iter(glob.glob("/usr/local/cuda*/bin/compute-sanitizer")), None)
    if san:
        targets = [[py, os.path.abspath(__file__), "--small"]]
        if a.examples:
            targets += [[py, ex] for ex in sorted(glob.glob(os.path.join(ROOT, "examples", "*.py")))]
        for t in targets:
            rc, out, dt = _run([san, "--tool", "memcheck", "--error-exitcode", "99", *t], 900)
            print(out[-3000:])
            summary = next((ln for ln in out.splitlines() if "ERROR SUMMARY" in ln), "no summary")
            results.append((f"memcheck {os.path.basename(t[-1])}", rc, summary, dt))
    else:
        results.append(("memcheck", -1, "compute-sanitizer not found", 0.0))
    cmd = [py, os.path.join(ROOT, "benchmarks", "gpu_suite.py")] + (["--quick"] if a.quick else [])
    rc, out, dt = _run(cmd, 900)
    print(out[-6000:])
    results.append(("gpu_suite", rc, "see table above", dt))
    print("\n| step | rc | summary | seconds |\n|---|---|---|---|")
    for name, rc, summary, dt in results:
        print(f"| {name} | {rc} | {summary[:100]} | {dt:.1f} |")
    sys.exit(max((r[1] for r in results if r[1] > 0), default=0))


if __name__ == "__main__":
    main()
