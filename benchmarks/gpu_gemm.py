"""4096^3 float32 relu(A @ B + bias): ours (schedules.gemm_cuda, one kernel) vs cuBLAS through PyTorch
(eager and torch.compile), TF32 off, timed in the same run. Medians; ratio and TFLOP/s.

Accuracy: every implementation (ours, cuBLAS eager, torch.compile) is compared against ONE float64
reference, `torch.relu(a.double() @ b.double() + bias.double())` computed once on the GPU, and its
relative error max|out - ref64| / max|ref64| is reported (`rel_err`). Comparing two float32 results
with each other only says whether they sum in the same order; `diff_vs_cublas` is that, for information.

    python benchmarks/gpu_gemm.py [n] [--block 128 128] ...        (standalone)
    python benchmarks/gpu_gemm.py 4096 --sweep                     (several tile configurations)
    python benchmarks/gpu_gemm.py --shapes 1000 1024x1024x1024 16x4096x4096 (the default build path, each
                                  shape at fixed and at symbolic sizes; % of the DRAM floor for each)
    from benchmarks.gpu_gemm import gemm_entries                       (benchmarks/gpu_suite.py)
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _median_ms(fn: Any, sync: Any, reps: int = 20, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    sync()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        sync()
        ts.append((time.perf_counter() - t) * 1e3)
    return float(np.median(ts))


def _event_ms(fn: Any, reps: int = 20, batch: int = 20) -> float:
    """Median over `reps` batches of `batch` back-to-back calls, CUDA events around each batch (ms per call):
    kernels of a few microseconds are not hidden behind a host synchronisation per call."""
    import torch
    from gpu_suite import time_cuda

    return time_cuda(torch, fn, batch=batch, repeat=reps)


def build_ours(n: int, m: int, p: int, pipeline: bool = True, min_blocks: int | None = None, **tiles: Any) -> Any:
    """Build the one-kernel GEMM; `pipeline` / `min_blocks`: codegen.passes.staging's PIPELINE_SHARED_COPIES (cp.async
    double buffering of the shared tiles) and LAUNCH_MIN_BLOCKS (__launch_bounds__(threads, min_blocks))."""
    import codegen.cuda.kernel as cg
    import codegen.passes.staging as staging
    from codegen import build
    from loopir import workloads as w
    from loopir.lower import lower
    from schedules import Schedule
    from schedules.recipes import schedule_gemm_cuda

    wl = w.matmul_bias_relu(n=n, m=m, p=p)
    if tiles.pop("auto", False):  # the default GEMM mapping of auto_schedule (the same recipe)
        from schedules import auto_schedule

        s = auto_schedule(list(wl.outputs), target="cuda", gemm=tiles)
        plan = s.plan  # type: ignore[attr-defined]
    else:
        s = Schedule(lower(list(wl.outputs), list(wl.inputs) + list(wl.outputs)))
        plan = schedule_gemm_cuda(s, **tiles)
    saved = staging.PIPELINE_SHARED_COPIES, cg.LAUNCH_MIN_BLOCKS
    staging.PIPELINE_SHARED_COPIES, cg.LAUNCH_MIN_BLOCKS = pipeline, min_blocks
    try:
        return build(s, list(wl.inputs) + list(wl.outputs), target="cuda"), plan
    finally:
        staging.PIPELINE_SHARED_COPIES, cg.LAUNCH_MIN_BLOCKS = saved


_T = dict(thread_tile=(8, 8))
_B1, _B2 = dict(_T, block=(64, 128)), dict(_T, block=(128, 128))
# auto_schedule's default first; then the default block (pipelined where 2 stages fit) and others
SWEEP = ([dict(auto=True)] + [dict(_B1, k_tile=k) for k in (8, 16, 32)]
         + [dict(_B1, k_tile=8, min_blocks=3), dict(_B1, k_tile=16, strided=True), dict(_B1, k_tile=16, pipeline=False)]
         + [dict(_B2, k_tile=16), dict(_B2, k_tile=16, min_blocks=2), dict(_B2, k_tile=32)]
         + [dict(_T, block=(64, 256), k_tile=16), dict(_T, block=(64, 64), k_tile=16),
            dict(_T, block=(128, 64), k_tile=16, min_blocks=2)])


def gemm_entries(n: int = 4096, reps: int = 20, configs: list[dict[str, Any]] | None = None,
                 **tiles: Any) -> list[dict[str, Any]]:
    """Rows {workload, impl, ms, tflops, ratio_vs_cublas, rel_err (vs the float64 reference)} for torch eager,
    torch.compile and ours (one row per tile configuration in `configs`, default: the `tiles` given;
    a configuration with auto=True builds through `auto_schedule(..., gemm=<the other tiles>)`)."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn(n, n, device=dev, generator=g)
    b = torch.randn(n, n, device=dev, generator=g)
    bias = torch.randn(n, device=dev, generator=g)
    out = torch.full((n, n), float("nan"), device=dev)
    flops = 2.0 * n * n * n
    sync = torch.cuda.synchronize

    def eager() -> Any:
        return torch.relu(a @ b + bias)

    compiled = torch.compile(lambda x, y, z: torch.relu(x @ y + z))
    rows: list[dict[str, Any]] = []
    ref64 = torch.relu(a.double() @ b.double() + bias.double())  # once, on the GPU
    scale = float(ref64.abs().max().item())

    def rel_err(x: Any) -> float:
        return float(((x.double() - ref64).abs().max()).item()) / scale

    ref = eager()
    cublas_err = rel_err(ref)
    t_eager = _median_ms(eager, sync, reps)
    rows.append({"impl": "torch eager (cuBLAS)", "ms": t_eager, "rel_err": cublas_err})
    try:
        comp_err = rel_err(compiled(a, b, bias))
        t_comp = _median_ms(lambda: compiled(a, b, bias), sync, reps)
        rows.append({"impl": "torch.compile", "ms": t_comp, "rel_err": comp_err})
    except Exception as e:  # noqa: BLE001 - report, keep the others
        rows.append({"impl": "torch.compile", "ms": None, "error": str(e)[:200]})
    for cfg in configs or [tiles]:
        label = "loopir " + " ".join(f"{k}={v}" for k, v in cfg.items())
        try:
            t0 = time.perf_counter()
            mod, plan = build_ours(n, n, n, **cfg)
            build_s = time.perf_counter() - t0
            out.fill_(float("nan"))
            mod(a, b, bias, out)
            sync()
            err = rel_err(out)
            diff = float(((out - ref).abs().max() / ref.abs().max()).item())
            t_ours = _median_ms(lambda m=mod: m(a, b, bias, out), sync, reps)
        except Exception as e:  # noqa: BLE001 - report, keep the others
            rows.append({"impl": label, "ms": None, "error": f"{type(e).__name__}: {str(e)[:300]}"})
            continue
        rows.append({"impl": label, "ms": t_ours, "rel_err": err, "diff_vs_cublas": diff, "kernels": len(mod.kernels),
                     "build_s": build_s, "plan": plan.explain()})
    for r in rows:
        r["workload"] = f"relu(A@B+bias) {n}^3 f32 (TF32 off)"
        if r.get("ms"):
            r["tflops"] = flops / (r["ms"] * 1e-3) / 1e12
            r["ratio_vs_cublas"] = t_eager / r["ms"]
    return rows


DRAM_BPS = 4.25e12  # the copy bandwidth measured on the H200 (shared/gpu/README.md)


def _parse_shape(t: str) -> tuple[int, int, int]:
    """"N" (a square) or "NxMxP": C (N x M) = A (N x P) @ B (P x M)."""
    d = [int(x) for x in t.lower().split("x")]
    return (d[0], d[0], d[0]) if len(d) == 1 else (d[0], d[1], d[2])


SKINNY_SWEEP = [dict(block=(64, 128), thread_tile=(8, 8), k_tile=16),   # the square default (before: 17x)
                dict(block=(16, 32), thread_tile=(2, 1), k_tile=128),
                dict(block=(16, 64), thread_tile=(4, 2), k_tile=64),
                dict(block=(16, 16), thread_tile=(4, 1), k_tile=128),
                dict(block=(16, 32), thread_tile=(4, 1), k_tile=64)]


def split_sweep(n: int, m: int, p: int, itemsize: int) -> list[dict[str, Any]]:
    """The planner's skinny tiles for (n, m, p) with split-K off and at 2 to 32 chunks (gemm= configurations)."""
    from schedules.recipes import skinny_params

    got = skinny_params(n, itemsize, cols=m, depth=p)
    if got is None:
        return []
    base = {k: v for k, v in got[0].items() if k != "split_k"}
    kt = base["k_tile"]
    out = [dict(base, split_k=None)]
    for chunks in (2, 4, 6, 8, 16, 32):
        chunk = kt * -(-p // (chunks * kt))
        if chunk < p and chunk not in [c.get("split_k") for c in out]:
            out.append(dict(base, split_k=chunk))
    return out


def shape_entries(shapes: list[tuple[int, int, int]], reps: int = 20, dtype: str = "float32",
                  skinny_sweep: bool = False, show: Any = None, split: bool = False,
                  configs: list[dict[str, Any]] | None = None,
                  only: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    """relu(A @ B + bias) through the default path (`build([C], args, target="cuda")`, auto_schedule's plan), at
    fixed and at symbolic (te.var) sizes, against cuBLAS (PyTorch eager, TF32 off) in the same run. Each row:
    ms, ratio to cuBLAS, % of the DRAM floor (bytes of A, B, bias, C / 4.25 TB/s), error vs float64."""
    import torch

    from codegen import build
    from loopir import te
    from loopir import workloads as w
    from schedules import auto_schedule

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    dev = torch.device("cuda")
    tdt = getattr(torch, dtype)
    sync = torch.cuda.synchronize
    rows: list[dict[str, Any]] = []
    for n, m, p in shapes:
        a = torch.randn(n, p, device=dev).to(tdt)
        b = torch.randn(p, m, device=dev).to(tdt)
        bias = torch.randn(m, device=dev).to(tdt)
        out = torch.empty(n, m, device=dev, dtype=tdt)
        ref64 = torch.relu(a.double() @ b.double() + bias.double())
        scale = float(ref64.abs().max().item()) or 1.0
        nbytes = (n * p + p * m + m + n * m) * a.element_size()
        floor_ms = nbytes / DRAM_BPS * 1e3
        shape = f"{n}x{m}x{p} {dtype}"
        # operands rotated over copies that together exceed twice the L2 (60 MiB on the H200): each call reads
        # A and B from DRAM, as a skinny GEMM's floor assumes
        ncopy = min(8, 1 + int(120 * 2**20 // ((n * p + p * m) * a.element_size())))
        ops = [(a, b)] + [(a.clone(), b.clone()) for _ in range(ncopy - 1)]

        def rotated(fn: Any, ops: Any = ops) -> Any:
            it = itertools.cycle(ops)
            return lambda: fn(*next(it))

        t_cublas = _event_ms(rotated(lambda a, b, bias=bias: torch.relu(a @ b + bias)), reps)
        rows.append({"shape": shape, "impl": "cuBLAS (torch eager)", "ms": t_cublas, "floor_ms": floor_ms,
                     "rel_err": float((torch.relu(a @ b + bias).double() - ref64).abs().max().item()) / scale})
        sym = (te.var("n"), te.var("m"), te.var("p"))
        # "symbolic": auto_schedule told the sizes, the kernel not; "symbolic build()": the user's path, build() of
        # the tensors at symbolic sizes (call-time variants keyed by the sizes' classes, rescheduled per variant)
        variants: list[tuple[str, Any, Any]] = [("fixed", (n, m, p), None), ("symbolic", sym, None),
                                                ("symbolic build()", sym, None)]
        variants = [v for v in variants if only is None or v[0] in only]
        if skinny_sweep and n <= 64:  # on the first skinny shape only
            variants += [(f"fixed gemm={cfg}", (n, m, p), cfg) for cfg in SKINNY_SWEEP]
            skinny_sweep = False
        if split:  # the planner's skinny tiles, split-K off and at several chunk counts
            variants += [(f"fixed split_k={cfg['split_k']}", (n, m, p), cfg)
                         for cfg in split_sweep(n, m, p, a.element_size())]
        variants += [(f"fixed gemm={cfg}", (n, m, p), cfg) for cfg in configs or []]
        for label, sz, cfg in variants:
            try:
                wl = w.matmul_bias_relu(n=sz[0], m=sz[1], p=sz[2], dtype=dtype)
                t0 = time.perf_counter()
                # symbolic: the cost model is told the sizes (as a user would pass them), the kernel is not
                if label == "symbolic build()":
                    sch = None
                    mod = build(list(wl.outputs), list(wl.inputs) + list(wl.outputs), target="cuda")
                else:
                    sch = auto_schedule(list(wl.outputs), target="cuda", gemm=cfg,
                                        sizes={"n": n, "m": m, "p": p} if label == "symbolic" else None)
                    mod = build(sch, list(wl.inputs) + list(wl.outputs), target="cuda")
                build_s = time.perf_counter() - t0
                out.fill_(float("nan"))
                mod(a, b, bias, out)
                sync()
                err = float((out.double() - ref64).abs().max().item()) / scale
                t = _event_ms(rotated(lambda a, b, mod=mod, bias=bias, out=out: mod(a, b, bias, out)), reps)
                rows.append({"shape": shape, "impl": f"loopir {label}", "ms": t, "floor_ms": floor_ms, "rel_err": err,
                             "build_s": build_s, "ratio_vs_cublas": t_cublas / t,
                             "mapping": sch.plan.groups[0].mapping if sch is not None  # type: ignore[attr-defined]
                             else f"variant {mod.specializations[-1] if mod.specializations else 'generic'}: "
                             f"{len(mod.last_ran.kernels)} kernel(s)"})
            except Exception as e:  # noqa: BLE001 - report, keep the others
                rows.append({"shape": shape, "impl": f"loopir {label}", "ms": None,
                             "error": f"{type(e).__name__}: {str(e)[:300]}"})
            _finish(rows, n, m, p, shape, show)
        _finish(rows, n, m, p, shape, show)
    return rows


def _finish(rows: list[dict[str, Any]], n: int, m: int, p: int, shape: str, show: Any) -> None:
    for r in rows:
        if r.get("done"):
            continue
        r["done"] = True
        if r.get("ms"):
            r["floor_pct"] = 100.0 * r["floor_ms"] / r["ms"]
            r["tflops"] = 2.0 * n * m * p / (r["ms"] * 1e-3) / 1e12
        if show is not None:
            show(r)


HEADER = ("| shape | impl | ms | TFLOP/s | vs cuBLAS | % DRAM floor | rel. err vs f64 | build s |\n"
          "|---|---|---|---|---|---|---|---|")


def show_row(r: dict[str, Any]) -> None:
    if r.get("ms"):
        print(f"| {r['shape']} | {r['impl']} | {r['ms']:.3f} | {r.get('tflops') or 0:.1f} | "
              f"{r.get('ratio_vs_cublas', 1.0):.2f} | {r['floor_pct']:.0f}% | {r['rel_err']:.1e} | "
              f"{r.get('build_s', 0):.1f} |", flush=True)
    else:
        print(f"| {r['shape']} | {r['impl']} | failed: {r.get('error')} | | | | | |", flush=True)


def print_shapes(rows: list[dict[str, Any]]) -> None:
    print(HEADER)
    for r in rows:
        show_row(r)


def mma_entries(shapes: list[tuple[int, int, int]], reps: int = 20, dtypes: tuple[str, ...] = ("float16", "bfloat16"),
                **tiles: Any) -> list[dict[str, Any]]:
    """Tensor-core GEMM (schedules.recipes.gemm_mma) in float16 and bfloat16 (and float32: mma.m16n8k16.tf32x3,
    against cuBLAS's float32 GEMM, TF32 off) vs cuBLAS (torch.matmul in the same dtype, eager), same run: rows
    {workload, impl, ms, tflops, ratio_vs_cublas, rel_err vs float64}. A shape with a 0 is built with symbolic rows
    and columns (n, m variables; the reduction length 4096 known: the recipe has no k remainder) and run at
    n = m = p = 4096."""
    import torch

    from codegen import build
    from loopir import workloads as w
    from loopir.lower import lower
    from schedules import Schedule
    from schedules.recipes.gemm_mma import schedule_gemm_mma

    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    rows: list[dict[str, Any]] = []
    sync = torch.cuda.synchronize
    for dtype, tdt in (("float16", torch.float16), ("bfloat16", torch.bfloat16), ("float32", torch.float32)):
        if dtype not in dtypes:
            continue
        for n, m, p in shapes:
            symbolic = n == 0
            if symbolic:
                n = m = p = 4096
            g = torch.Generator(device=dev).manual_seed(1)
            a = torch.randn(n, p, device=dev, generator=g).to(tdt)
            b = torch.randn(p, m, device=dev, generator=g).to(tdt)
            bias = torch.randn(m, device=dev, generator=g).to(tdt)
            out = torch.full((n, m), float("nan"), device=dev, dtype=tdt)
            ref64 = torch.relu(a.double() @ b.double() + bias.double())
            scale = float(ref64.abs().max().item())
            tag = f"relu(A@B+bias) {n}x{m}x{p} {dtype}" + (" symbolic n, m" if symbolic else "")
            flops = 2.0 * n * m * p
            t_cub = _median_ms(lambda a=a, b=b, bias=bias: torch.relu(a @ b + bias), sync, reps)
            err_cub = float((torch.relu(a @ b + bias).double() - ref64).abs().max().item()) / scale
            rows.append({"workload": tag, "impl": "torch eager (cuBLAS)", "ms": t_cub, "rel_err": err_cub})
            try:
                wl = (w.matmul_bias_relu(p=p, dtype=dtype) if symbolic
                      else w.matmul_bias_relu(n=n, m=m, p=p, dtype=dtype))
                s = Schedule(lower(list(wl.outputs), list(wl.inputs) + list(wl.outputs)))
                t0 = time.perf_counter()
                plan = schedule_gemm_mma(s, **tiles)
                mod = build(s, list(wl.inputs) + list(wl.outputs), target="cuda")
                build_s = time.perf_counter() - t0
                view = (lambda x: x.view(torch.uint16)) if dtype == "bfloat16" else (lambda x: x)
                args = [view(a), view(b), view(bias), view(out)]
                mod(*args)
                sync()
                err = float((out.double() - ref64).abs().max().item()) / scale
                t = _median_ms(lambda mod=mod, args=args: mod(*args), sync, reps)
                rows.append({"workload": tag, "impl": "loopir mma", "ms": t, "rel_err": err, "build_s": build_s,
                             "kernels": len(mod.kernels), "plan": plan.explain()})
            except Exception as e:  # noqa: BLE001 - report, keep the others
                rows.append({"workload": tag, "impl": "loopir mma", "ms": None,
                             "error": f"{type(e).__name__}: {str(e)[:300]}"})
            for r in rows[-2:]:
                if r.get("ms"):
                    r["tflops"] = flops / (r["ms"] * 1e-3) / 1e12
                    r["ratio_vs_cublas"] = t_cub / r["ms"]
    return rows


def _write_json(path: str | None, rows: list) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(rows, f, indent=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("n", type=int, nargs="?", default=4096)
    ap.add_argument("--block", type=int, nargs=2, default=(64, 128))
    ap.add_argument("--thread-tile", type=int, nargs=2, default=(8, 8))
    ap.add_argument("--k-tile", type=int, default=16)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", default=None)
    ap.add_argument("--sweep", action="store_true", help="time every configuration of SWEEP")
    ap.add_argument("--auto", action="store_true", help="build through auto_schedule(..., gemm=the tiles)")
    ap.add_argument("--shapes", nargs="+", default=None, help="N or NxMxP: the default build path per shape")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--skinny-sweep", action="store_true",
                    help="also time SKINNY_SWEEP's tiles on the first shape of <= 64 rows")
    ap.add_argument("--split-sweep", action="store_true",
                    help="also time the planner's skinny tiles with split-K off and at 2..32 chunks (skinny shapes)")
    ap.add_argument("--variants", default=None,
                    help="with --shapes: only these of 'fixed', 'symbolic', 'symbolic build()' (comma-separated)")
    ap.add_argument("--configs", default="[]",
                    help='gemm= configurations (JSON list) timed at fixed sizes on every shape of --shapes')
    ap.add_argument("--mma", nargs="*", default=None,
                    help="tensor-core GEMM (gemm_mma) at these shapes (N or NxMxP; 0: symbolic n, m), f16 and bf16")
    ap.add_argument("--mma-dtypes", nargs="+", default=["float16", "bfloat16"],
                    help="dtypes of the --mma rows (float32: three TF32 products per product)")
    ap.add_argument("--mma-tiles", default="{}",
                    help='gemm_mma tiles as JSON, e.g. {"block": [128, 64], "warp": [64, 32]}')
    a = ap.parse_args()
    if a.mma is not None:
        rows = mma_entries([_parse_shape(t) if t != "0" else (0, 0, 0) for t in a.mma or ["4096"]], a.reps,
                           tuple(a.mma_dtypes), **json.loads(a.mma_tiles))
        print("| workload | impl | ms | TFLOP/s | vs cuBLAS | rel. error vs float64 |\n|---|---|---|---|---|---|")
        for r in rows:
            if r.get("ms"):
                print(f"| {r['workload']} | {r['impl']} | {r['ms']:.3f} | {r['tflops']:.1f} | "
                      f"{r['ratio_vs_cublas']:.2f} | {r['rel_err']:.2e} |")
            else:
                print(f"| {r['workload']} | {r['impl']} | failed: {r.get('error')} | | | |")
        _write_json(a.json, rows)
        return
    if a.shapes:
        print(HEADER, flush=True)
        rows = shape_entries([_parse_shape(t) for t in a.shapes], a.reps, a.dtype, a.skinny_sweep, show_row,
                             a.split_sweep, json.loads(a.configs),
                             tuple(a.variants.split(",")) if a.variants else None)
        _write_json(a.json, rows)
        return
    tiles: dict[str, Any] = dict(block=tuple(a.block), thread_tile=tuple(a.thread_tile), k_tile=a.k_tile)
    if a.auto:
        tiles["auto"] = True
    rows = gemm_entries(a.n, a.reps, SWEEP if a.sweep else None, **tiles)
    print("| impl | ms | TFLOP/s | vs cuBLAS | rel. error vs float64 |\n|---|---|---|---|---|")
    for r in rows:
        if r.get("ms"):
            print(f"| {r['impl']} | {r['ms']:.3f} | {r['tflops']:.1f} | {r['ratio_vs_cublas']:.2f} "
                  f"| {r['rel_err']:.2e} |")
        else:
            print(f"| {r['impl']} | failed: {r.get('error')} | | | |")
    for ours in rows[2:]:
        if ours.get("ms"):
            print(f"{ours['impl']}: relative error vs float64 {ours['rel_err']:.2e} (cuBLAS: {rows[0]['rel_err']:.2e}; "
                  f"max difference from cuBLAS's float32 result {ours['diff_vs_cublas']:.2e}), "
                  f"{ours['kernels']} kernel(s), built in {ours['build_s']:.1f} s")
    best = [r for r in rows[2:] if r.get("ms")]
    if best:
        print(min(best, key=lambda r: r["ms"])["plan"])
    _write_json(a.json, rows)


if __name__ == "__main__":
    main()
