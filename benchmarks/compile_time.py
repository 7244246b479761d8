"""Compile time of `build` in a new process: cold (empty cache directory) and warm (the disk cache
filled by an earlier process), for every seed workload and the GEMM, on both targets. CPU only: the
CUDA target is timed up to the cubin (NVRTC needs no GPU), which is all `build` does.

Each timing is its own Python process (`--child`), which reports separately:
* import: `from loopir import te; from codegen import build` (and schedules, which build imports);
* runtime load: what the target loads once per process before its first kernel (CPU: llvmlite,
  the native target, the host's features and libmvec; CUDA: nothing at build time);
* build: `build(outputs, args, target)` (a builder program: `build(program)`), the number asked about.
Medians over `--cold` / `--warm` processes (defaults 3 and 5); the warm directory is filled by one
extra cold process first. Sizes are symbolic (the seeds' defaults: the generic module is compiled at
build time) except the GEMMs, ReLU(A @ B + bias) at 1000^3 and 4096^3 float32.

    python benchmarks/compile_time.py                 # all rows, writes benchmarks/RESULTS_compile.md
    python benchmarks/compile_time.py softmax gemm1000 --cold 1 --warm 3 --no-write

Goal (issue 14): warm <= 20 ms per kernel on both targets. Measured here, never asserted.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "RESULTS_compile.md")
SEEDS = ["sincos", "gelu", "horizontal", "softmax", "layernorm", "matmul_bias_relu", "attention", "stencil5",
         "prefix_sum"]
ROWS = [*SEEDS, "gemm1000", "gemm4096"]
TARGETS = ("cpu", "cuda")


def _child(name: str, target: str) -> dict[str, object]:
    t0 = time.perf_counter()
    sys.path.insert(0, ROOT)
    from codegen import build
    from loopir import te
    from loopir import workloads as W

    t1 = time.perf_counter()
    if target == "cpu":
        from codegen.llvm import runtime

        runtime._llvm()
    t2 = time.perf_counter()
    if name.startswith("gemm"):
        n = int(name[4:])
        a = te.placeholder((n, n), name="A")
        b = te.placeholder((n, n), name="B")
        bias = te.placeholder((n,), name="bias")
        k = te.reduce_axis(n, "k")
        c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
        d = te.compute((n, n), lambda i, j: te.maximum(c[i, j] + bias[j], 0.0), name="D")
        outs, args, prog = [d], [a, b, bias, d], None
    else:
        w = W.SEEDS[name]()
        outs, args, prog = list(w.outputs), list(w.args), w.built
    t3, c3 = time.perf_counter(), time.process_time()
    try:
        if prog is not None and target == "cuda" and name == "prefix_sum":
            # a builder program is built as scheduled: its recurrence goes onto the GPU through map_statements
            from schedules import Schedule
            from schedules.auto import map_statements

            prog = map_statements(Schedule(prog), ["S"], "cuda")
        mod = build(prog, target=target) if prog is not None else build(outs, args, target=target)
        err = None
        kernels = len(mod.kernels)
    except Exception as e:  # noqa: BLE001 - a row the target refuses is reported, not fatal
        err, kernels = f"{type(e).__name__}: {str(e).splitlines()[0][:80]}", 0
    t4, c4 = time.perf_counter(), time.process_time()
    return {"import": t1 - t0, "runtime": t2 - t1, "build": t4 - t3, "build_cpu": c4 - c3, "error": err,
            "kernels": kernels}


def _spawn(name: str, target: str, cache: str) -> dict[str, object]:
    env = dict(os.environ, LOOPIR_CACHE_DIR=cache, PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", name, target], env=env,
                         capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        return {"error": f"child failed: {out.stderr.strip().splitlines()[-1][:100]}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def _med(rs: list[dict[str, object]], k: str) -> float:
    return statistics.median(float(r[k]) for r in rs) * 1e3  # type: ignore[arg-type]


def measure(name: str, target: str, n_cold: int, n_warm: int) -> dict[str, object]:
    cold, warm = [], []
    for _ in range(n_cold):
        d = tempfile.mkdtemp(prefix="loopir-cold-")
        try:
            cold.append(_spawn(name, target, d))
        finally:
            shutil.rmtree(d, ignore_errors=True)
    d = tempfile.mkdtemp(prefix="loopir-warm-")
    try:
        first = _spawn(name, target, d)  # fills the cache
        if not first.get("error"):
            warm = [_spawn(name, target, d) for _ in range(n_warm)]
    finally:
        shutil.rmtree(d, ignore_errors=True)
    errs = [r["error"] for r in [*cold, first, *warm] if r.get("error")]
    if errs:
        return {"name": name, "target": target, "error": errs[0]}
    return {"name": name, "target": target, "kernels": cold[0]["kernels"], "import": _med(cold + warm, "import"),
            "runtime": _med(cold + warm, "runtime"), "cold": _med(cold, "build"), "warm": _med(warm, "build"),
            "warm_min": min(float(r["build"]) for r in warm) * 1e3,  # type: ignore[arg-type]
            "warm_cpu": _med(warm, "build_cpu")}


def _machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), model)
    except OSError:
        pass
    load = ", load average {:.1f} / {:.1f} / {:.1f} at the end".format(*os.getloadavg()) if hasattr(os, "getloadavg") \
        else ""
    return f"{model}, {os.cpu_count()} logical CPUs, Python {platform.python_version()}{load}"


def report(rows: list[dict[str, object]], n_cold: int, n_warm: int, cmd: str) -> str:
    lines = [
        "# Compile time: cold and warm builds in a new process",
        "",
        f"Measured {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC on {_machine()}, no GPU "
        f"(CUDA rows stop at the cubin, which is all `build` does). Command: `{cmd}`.",
        "",
        f"Each number is the median of new processes ({n_cold} cold: empty `LOOPIR_CACHE_DIR`; {n_warm} warm: the "
        "directory filled by one earlier process). *build* is the `build(...)` call alone; *import* is "
        "`from codegen import build` (with loopir, schedules); *runtime load* is what a target loads once per "
        "process before its first kernel (CPU: llvmlite, the native target, the host's features, libmvec). "
        "Seeds have symbolic sizes (the generic module is compiled at build time); the GEMMs are "
        "ReLU(A @ B + bias), float32, fixed sizes. *warm build CPU* is the CPU time the warm build used "
        "(`time.process_time`), which other load on the machine does not inflate. Goal: warm <= 20 ms per kernel.",
        "",
        "| workload | target | kernels | import ms | runtime load ms | cold build ms | warm build ms (min) | "
        "warm build CPU ms | cold / warm |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.get("error"):
            lines.append(f"| {r['name']} | {r['target']} | - | - | - | - | - | - | {r['error']} |")
            continue
        lines.append(f"| {r['name']} | {r['target']} | {r['kernels']} | {r['import']:.0f} | {r['runtime']:.0f} | "
                     f"{r['cold']:.0f} | {r['warm']:.1f} ({r['warm_min']:.1f}) | {r['warm_cpu']:.1f} | "
                     f"{r['cold'] / max(r['warm'], 1e-3):.0f}x |")  # type: ignore[operator]
    return "\n".join(lines) + "\n"


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(_child(sys.argv[2], sys.argv[3])))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rows", nargs="*", default=ROWS, help=f"rows to time (default: all: {' '.join(ROWS)})")
    ap.add_argument("--targets", default="cpu,cuda")
    ap.add_argument("--cold", type=int, default=3)
    ap.add_argument("--warm", type=int, default=5)
    ap.add_argument("--no-write", action="store_true", help="print the table only")
    a = ap.parse_args()
    rows = []
    for name in a.rows:
        for target in a.targets.split(","):
            r = measure(name, target, a.cold, a.warm)
            rows.append(r)
            print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in r.items()}), flush=True)
    text = report(rows, a.cold, a.warm, "python benchmarks/compile_time.py " + " ".join(sys.argv[1:]))
    print(text)
    if not a.no_write:
        with open(RESULTS, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
