"""relu(A @ B + bias) in float16 / bfloat16 through the user's path, `build(outputs, args)` with no schedule, at
fixed and at symbolic sizes (te.var), against cuBLAS through PyTorch timed in the same run.

    python3 benchmarks/gpu_gemm_half.py                              # the default shapes, both dtypes
    python3 benchmarks/gpu_gemm_half.py --shapes 4096 4000x4000x4000 --dtypes float16 --json out.json

Times: the mean of 10 back-to-back calls between CUDA events (median of 30 such): kernel time with the queue
kept full. Baselines (same inputs, same run): `torch.relu(a @ b + bias)` (eager: cuBLAS + two elementwise kernels),
the same
through `torch.compile` (dynamic=False), `torch.relu(torch.addmm(bias, a, b))` (cuBLAS with the bias fused) and
`a @ b` alone (cuBLAS's matmul, no epilogue: the strictest bar). Accuracy:
max |out - ref64| / max |ref64| against one float64 reference. Outputs are NaN-poisoned before the checked run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.gpu_suite import time_cuda  # noqa: E402

SHAPES = ["4096x4096x4096", "4000x4000x4000", "2048x2048x2048", "8192x8192x8192", "1000x1000x1000",
          "4096x4096x1024", "1024x4096x4096", "333x776x200"]


def _parse(t: str) -> tuple[int, int, int]:
    x = [int(v) for v in t.split("x")]
    return (x[0], x[0], x[0]) if len(x) == 1 else (x[0], x[1], x[2])


def _events_ms(fn: Any, reps: int = 30) -> float:
    """Median over `reps` of the mean time of 10 back-to-back calls between two CUDA events (gpu_suite.time_cuda):
    the GPU's queue stays full, so the figure is the kernels' time, not the host's launch latency (each
    implementation's host path, ours included, is measured by the `call_us` column instead)."""
    import torch

    return time_cuda(torch, fn, batch=10, repeat=reps, warmup=5)


def _host_us(fn: Any, reps: int = 20) -> float:
    """Median host time of one call (its launch path; the GPU works on asynchronously)."""
    import torch

    ts = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t) * 1e6)
    return float(np.median(ts))


def entries(shapes: list[tuple[int, int, int]], dtypes: tuple[str, ...], reps: int = 30,
            compile_torch: bool = True, schedules: list[dict[str, Any] | None] | None = None) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for dtype in dtypes:
        for shape in shapes:
            rows += _shape_rows(shape, dtype, reps, compile_torch, schedules or [None])
    return rows


def _shape_rows(shape: tuple[int, int, int], dtype: str, reps: int, compile_torch: bool,
                schedules: list[dict[str, Any] | None]) -> list[dict[str, Any]]:
    """The baselines, then ours at fixed and at symbolic sizes, for one shape and dtype."""
    import torch

    n, m, p = shape
    dev = torch.device("cuda")
    tdt = getattr(torch, dtype)
    g = torch.Generator(device=dev).manual_seed(1)
    a = torch.randn(n, p, device=dev, generator=g).to(tdt)
    b = torch.randn(p, m, device=dev, generator=g).to(tdt)
    bias = torch.randn(m, device=dev, generator=g).to(tdt)
    ref = torch.relu(a.double() @ b.double() + bias.double())
    base = {"eager": lambda: torch.relu(a @ b + bias), "addmm": lambda: torch.relu(torch.addmm(bias, a, b)),
            "mm": lambda: a @ b}
    if compile_torch:
        torch._dynamo.reset()  # a fresh compile per shape and dtype (dynamic=False), not the recompile limit
        f = torch.compile(lambda x, y, z: torch.relu(x @ y + z), dynamic=False)
        base["compile"] = lambda: f(a, b, bias)
    times = {k: _events_ms(v, reps) for k, v in base.items()}
    rows = []
    for sizes, sched in [(sz, sc) for sc in schedules for sz in ("fixed", "symbolic")]:
        row: dict[str, Any] = {"workload": f"{n}x{m}x{p} {dtype}", "sizes": sizes, "schedule": sched,
                               **{f"{k}_ms": v for k, v in times.items()}}
        try:
            row.update(_ours((a, b, bias), ref, sizes, dtype, reps, sched))
            row["tflops"] = 2.0 * n * m * p / row["ms"] / 1e9
            for k, v in times.items():
                row[f"vs_{k}"] = v / row["ms"]
        except Exception as e:  # noqa: BLE001 - report, keep the others
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        rows.append(row)
        show(row)
    return rows


def _ours(inputs: tuple[Any, ...], ref: Any, sizes: str, dtype: str, reps: int,
          schedule: dict[str, Any] | None = None) -> dict[str, Any]:
    """Build through `build(outputs, args)` (fixed or symbolic sizes), check, time; the row's fields."""
    import torch

    from codegen import build
    from loopir import te
    from loopir import workloads as w

    a, b, bias = inputs
    (n, p), m = a.shape, b.shape[1]
    scale = float(ref.abs().max().item())
    if sizes == "fixed":
        wl = w.matmul_bias_relu(n=n, m=m, p=p, dtype=dtype)
    else:
        wl = w.matmul_bias_relu(n=te.var("n"), m=te.var("m"), p=te.var("p"), dtype=dtype)
    t0 = time.perf_counter()
    mod = build(list(wl.outputs), list(wl.inputs) + list(wl.outputs), target="cuda", schedule=schedule)
    out = torch.full((n, m), float("nan"), device=a.device, dtype=a.dtype)
    view = (lambda x: x.view(torch.uint16)) if dtype == "bfloat16" else (lambda x: x)
    args = [view(a), view(b), view(bias), view(out)]
    errs, nans = [], 0
    for again in (False, True):  # the first call, then a repeated call through its recorded fast path
        out.fill_(float("nan"))
        mod(*args)
        torch.cuda.synchronize()
        errs.append(float((out.double() - ref).abs().max().item()) / scale)
        nans += int(torch.isnan(out).sum().item())
        if not again:
            build_s = time.perf_counter() - t0  # the build and the first call (a variant compiles)
    return {"build_s": build_s, "rel_err": max(errs), "nan": nans, "ms": _events_ms(lambda: mod(*args), reps),
            "call_us": _host_us(lambda: mod(*args)), "wgmma": _variant_wgmma(mod)}


def _variant_wgmma(mod: Any) -> bool:
    """Whether the module (or the specialization a call used) runs the warpgroup kernel."""
    return "wgmma.mma_async" in (getattr(mod.last_ran, "source", "") or "")


HEADER = ("| workload | sizes | ours ms | TFLOP/s | vs mm | vs relu(addmm) | vs eager | vs compile | rel. err | "
          "wgmma | call us |\n|---|---|---|---|---|---|---|---|---|---|---|")


def show(r: dict[str, Any]) -> None:
    if "ms" not in r:
        print(f"| {r['workload']} | {r['sizes']} | failed: {r.get('error')} |", flush=True)
        return
    print(f"| {r['workload']} | {r['sizes']} | {r['ms']:.4f} | {r['tflops']:.0f} | {r['vs_mm']:.2f} | "
          f"{r['vs_addmm']:.2f} | {r['vs_eager']:.2f} | {r.get('vs_compile', float('nan')):.2f} | "
          f"{r['rel_err']:.1e} | {r['wgmma']} | {r['call_us']:.0f} |"
          + (f" {json.dumps(r['schedule'])} |" if r.get("schedule") else ""), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shapes", nargs="+", default=SHAPES)
    ap.add_argument("--dtypes", nargs="+", default=["float16", "bfloat16"])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile (its compile takes a while)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--schedule", action="append", default=None,
                    help='auto_schedule options as JSON (repeat: each timed), e.g. {"gemm": {"wgmma": {"block": '
                         '[128, 64]}}}')
    a = ap.parse_args()
    print(HEADER, flush=True)
    scheds = [json.loads(x) or None for x in a.schedule] if a.schedule else None
    rows = entries([_parse(t) for t in a.shapes], tuple(a.dtypes), a.reps, not a.no_compile, scheds)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
