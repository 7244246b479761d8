"""One script for the GPU machine: gpu-marked tests, compute-sanitizer memcheck, the GPU suite.

    python3 benchmarks/gpu_check.py [--quick] [--tests tests/test_auto.py ...] [--out DIR] [--suite-args ...]

Steps (each in its own process, with a time limit), then a short table, printed last:
1. `pytest -m gpu` (all tests, or the files given with --tests);
2. `compute-sanitizer --tool memcheck` on the five fusion examples and the quickstart at small sizes
   (`--small`), and on this script's `--small` suite (every seed workload with a hand-written bound
   schedule once, at small sizes, checked against numpy);
3. `benchmarks/gpu_races.py` (kernels whose threads communicate, 5 runs each on fresh data against float64)
   and `compute-sanitizer --tool racecheck` / `synccheck` on its `--small` cases;
4. `benchmarks/gpu_suite.py` (JSON, markdown table and PNG under --out).
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

EXAMPLES = ["sincos", "gelu", "horizontal", "softmax", "layernorm", "quickstart", "matmul_bias_relu", "opt_conv_cuda",
            "blur_store_at"]


def small_suite() -> int:
    """Every seed workload (bound by hand) once at small sizes; exit code 1 on a mismatch."""
    import numpy as np
    from test_cuda_helpers import bind_elementwise, bind_rows, fuse_rows

    from codegen.cuda.build import build_cuda
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
    return 1 if bad else 0


def _run(cmd: list[str], timeout: int) -> tuple[int, str, float]:
    t = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        out, rc = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        def text(b: object) -> str:
            return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")  # type: ignore[return-value]

        out, rc = f"{text(e.stdout)}{text(e.stderr)}\nTIMEOUT after {timeout} s", 124
    return rc, out, time.perf_counter() - t


def _last_line(out: str, needle: str = "") -> str:
    lines = [ln.strip() for ln in out.strip().splitlines() if ln.strip()]
    hit = [ln for ln in lines if needle and needle in ln]
    return (hit or lines or [""])[-1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true", help="run the small suite (a memcheck target) and exit")
    ap.add_argument("--quick", action="store_true", help="small benchmark sizes")
    ap.add_argument("--tests", nargs="*", default=["tests"], help="test files for pytest -m gpu")
    ap.add_argument("--out", default=None, help="directory for the suite's JSON/markdown/PNG")
    ap.add_argument("--no-suite", action="store_true")
    ap.add_argument("--no-memcheck", action="store_true")
    ap.add_argument("--no-races", action="store_true", help="skip gpu_races.py and its racecheck/synccheck")
    ap.add_argument("--suite-args", nargs=argparse.REMAINDER, default=[], help="passed on to gpu_suite.py")
    a = ap.parse_args()
    if a.small:
        sys.exit(small_suite())
    py = sys.executable
    results = []
    rc, out, dt = _run([py, "-m", "pytest", "-m", "gpu", "-rfE", "-p", "no:cacheprovider", *a.tests], 600)
    print(out[-5000:], flush=True)
    results.append(("pytest -m gpu", rc, _last_line(out), dt))
    san = shutil.which("compute-sanitizer") or next(iter(sorted(glob.glob("/usr/local/cuda*/bin/compute-sanitizer"))),
                                                    None)
    if a.no_memcheck:
        pass
    elif san:
        targets = [[py, os.path.join(ROOT, "examples", f"{ex}.py"), "--small"] for ex in EXAMPLES]
        targets.append([py, os.path.abspath(__file__), "--small"])
        for t in targets:
            rc, out, dt = _run([san, "--tool", "memcheck", "--error-exitcode", "99", *t], 150)
            summary = _last_line(out, "ERROR SUMMARY") or "no summary"
            # evidence that the target really ran its kernels on the GPU (not the CPU fallback)
            keys = ("on cuda", "target: cuda", "small ", "fused ", "cuda: relative error", "runs on the GPU (CUDA)",
                    "cuda: Convolution", "check cuda (device): ok")
            ran = [ln for ln in out.splitlines() if any(k in ln for k in keys)]
            if not ran or "on cpu" in out or "target: cpu" in out:
                rc = rc or 98
                summary += " — did not run on the GPU"
            if rc != 0:
                print(out[-3000:], flush=True)
            else:
                print("\n".join(ran[:4]), flush=True)
            print(f"memcheck {os.path.basename(t[1])}: rc {rc}, {summary}", flush=True)
            results.append((f"memcheck {os.path.basename(t[1])}", rc, summary, dt))
    else:
        results.append(("memcheck", -1, "compute-sanitizer not found", 0.0))
    if not a.no_races:
        races = os.path.join(ROOT, "benchmarks", "gpu_races.py")
        rc, out, dt = _run([py, races, "--repeats", "5"] + (["--out", a.out] if a.out else []), 600)
        print(out[-6000:], flush=True)
        results.append(("gpu_races (5 runs each, fresh data)", rc, _last_line(out, "MISMATCH") or "all ok", dt))
        if san:
            for tool in ("racecheck", "synccheck"):
                rc, out, dt = _run([san, "--tool", tool, "--error-exitcode", "99", py, races, "--small"], 300)
                summary = _last_line(out, "ERROR SUMMARY") or _last_line(out, "RACECHECK SUMMARY") or "no summary"
                if rc != 0:
                    print(out[-3000:], flush=True)
                print(f"{tool} gpu_races --small: rc {rc}, {summary}", flush=True)
                results.append((f"{tool} gpu_races --small", rc, summary, dt))
    if not a.no_suite:
        cmd = [py, os.path.join(ROOT, "benchmarks", "gpu_suite.py")] + (["--quick"] if a.quick else [])
        cmd += (["--out", a.out] if a.out else []) + a.suite_args
        rc, out, dt = _run(cmd, 600)
        print(out[-9000:], flush=True)
        results.append(("gpu_suite", rc, "table above" if rc == 0 else _last_line(out), dt))
    print("\n| step | rc | summary | seconds |\n|---|---|---|---|")
    for name, rc, summary, dt in results:
        print(f"| {name} | {rc} | {summary[:110]} | {dt:.1f} |")
    sys.exit(max((r[1] for r in results if r[1] > 0), default=0))


if __name__ == "__main__":
    main()
