"""GPU benchmark suite: ours vs PyTorch eager, torch.compile and the DRAM floor, in one process.

Each workload is an `Entry` in `ENTRIES` (extend the table to add workloads): how to build our
module(s) (a dict of variant name -> Program, e.g. "fused" / "unfused"), the PyTorch function,
the inputs, the bytes that must move (the floor is bytes / measured copy bandwidth) and a float64
reference. Times are medians of CUDA-event timings after warm-up. Writes a markdown table,
JSON (benchmarks/results/gpu_suite.json) and a PNG chart when matplotlib is present.

    python3 benchmarks/gpu_suite.py [--quick] [--only sincos,...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

import numpy as np  # noqa: E402


@dataclass
class Entry:
    name: str
    programs: Callable[[], dict[str, Any]]  # variant -> loopir Program (scheduled)
    inputs: Callable[[Any, bool], list[Any]]  # (torch, quick) -> torch tensors in program arg order
    torch_fn: Callable[..., Any]  # inputs (without outputs) -> output tensor(s)
    n_in: int  # how many of the program's args are inputs
    bytes_moved: Callable[[list[Any]], int]
    reference: Callable[[list[np.ndarray]], list[np.ndarray]]
    extra: dict[str, Any] = field(default_factory=dict)


def _bound(workload: str, threads: int = 256) -> Any:
    """The split+bind schedule: Schedule when its primitives exist, else the IR-level helper."""
    from loopir import workloads as W

    wl = W.SEEDS[workload]()
    try:
        from schedules import Schedule

        s = Schedule(wl.outputs[0])
        (i,) = s.loops(wl.outputs[0])
        io, ii = s.split(i, threads)
        s.bind(io, "blockIdx.x").bind(ii, "threadIdx.x")
        return s.program
    except Exception:  # noqa: BLE001 - primitives not available yet
        from test_cuda_helpers import bind_elementwise

        return bind_elementwise(wl.program(), threads)


def _sincos_entry() -> Entry:
    def inputs(torch: Any, quick: bool) -> list[Any]:
        n = 1 << (22 if quick else 26)
        x = torch.randn(n, device="cuda")
        return [x, torch.empty_like(x)]

    return Entry(
        name="sincos",
        programs=lambda: {"split+bind": _bound("sincos", 256)},
        inputs=inputs,
        torch_fn=lambda x: x.sin() ** 2 + x.cos() ** 2,
        n_in=1,
        bytes_moved=lambda ts: sum(t.numel() * t.element_size() for t in ts),
        reference=lambda xs: [np.sin(xs[0].astype(np.float64)) ** 2 + np.cos(xs[0].astype(np.float64)) ** 2],
    )


ENTRIES: list[Callable[[], Entry]] = [_sincos_entry]


def time_cuda(torch: Any, fn: Callable[[], Any], warmup: int = 5, repeat: int = 30) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return float(statistics.median(times))


def copy_bandwidth(torch: Any, nbytes: int = 1 << 30) -> float:
    """Bytes per second of a device-to-device copy (read + write counted)."""
    src = torch.empty(nbytes // 4, device="cuda")
    dst = torch.empty_like(src)
    ms = time_cuda(torch, lambda: dst.copy_(src), repeat=20)
    return 2 * nbytes / (ms * 1e-3)


def _rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(got.astype(np.float64) - ref) / (np.abs(ref) + 1e-6)))


def run(quick: bool = False, only: set[str] | None = None, out_dir: str | None = None) -> list[dict[str, Any]]:
    import torch

    from codegen.cuda_build import build_cuda

    bw = copy_bandwidth(torch, (1 << 28) if quick else (1 << 30))
    rows: list[dict[str, Any]] = []
    for make in ENTRIES:
        e = make()
        if only and e.name not in only:
            continue
        args = e.inputs(torch, quick)
        ins = args[: e.n_in]
        nbytes = e.bytes_moved(args)
        floor_ms = nbytes / bw * 1e3
        host_ins = [t.cpu().numpy() for t in ins]
        ref = e.reference(host_ins)
        row: dict[str, Any] = {"workload": e.name, "bytes": nbytes, "floor_ms": floor_ms}
        row["torch_eager_ms"] = time_cuda(torch, lambda: e.torch_fn(*ins))  # noqa: B023
        try:
            compiled = torch.compile(e.torch_fn)
            compiled(*ins)
            row["torch_compile_ms"] = time_cuda(torch, lambda: compiled(*ins))  # noqa: B023
        except Exception as exc:  # noqa: BLE001 - report, keep going
            row["torch_compile_ms"] = None
            row["torch_compile_error"] = f"{type(exc).__name__}: {exc}"[:200]
        for variant, prog in e.programs().items():
            t0 = time.perf_counter()
            mod = build_cuda(prog)
            build_s = time.perf_counter() - t0
            outs = args[e.n_in:]
            for o in outs:
                o.fill_(float("nan"))
            mod(*args)
            torch.cuda.synchronize()
            err = max(_rel_err(o.cpu().numpy(), r) for o, r in zip(outs, ref))
            ms = mod.benchmark(*args, warmup=5, repeat=30)
            row[f"ours[{variant}]_ms"] = ms
            row[f"ours[{variant}]_max_rel_err"] = err
            row[f"ours[{variant}]_kernels"] = len(mod.kernels)
            row[f"ours[{variant}]_build_s"] = build_s
            row[f"ours[{variant}]_pct_of_floor_speed"] = 100.0 * floor_ms / ms
        rows.append(row)
    report(rows, bw, out_dir)
    return rows


def report(rows: list[dict[str, Any]], bw: float, out_dir: str | None) -> None:
    print(f"\ncopy bandwidth: {bw / 1e12:.2f} TB/s (read + write)\n")
    print("| workload | variant | ms | % of floor speed | vs eager | vs compile | max rel err | kernels |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['workload']} | DRAM floor | {r['floor_ms']:.4f} | 100 | | | | |")
        eager = r["torch_eager_ms"]
        print(f"| {r['workload']} | torch eager | {eager:.4f} | {100 * r['floor_ms'] / eager:.0f} | | | | |")
        if r.get("torch_compile_ms"):
            print(f"| {r['workload']} | torch.compile | {r['torch_compile_ms']:.4f} | "
                  f"{100 * r['floor_ms'] / r['torch_compile_ms']:.0f} | | | | |")
        for k in r:
            if k.startswith("ours[") and k.endswith("]_ms"):
                v = k[5:-4]
                ms = r[k]
                tc = r.get("torch_compile_ms")
                print(f"| {r['workload']} | ours {v} | {ms:.4f} | {r[f'ours[{v}]_pct_of_floor_speed']:.0f} | "
                      f"{r['torch_eager_ms'] / ms:.2f}x | {(tc / ms) if tc else float('nan'):.2f}x | "
                      f"{r[f'ours[{v}]_max_rel_err']:.1e} | {r[f'ours[{v}]_kernels']} |")
    out_dir = out_dir or os.path.join(ROOT, "benchmarks", "results")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "gpu_suite.json"), "w") as f:
        json.dump({"copy_bandwidth_Bps": bw, "rows": rows}, f, indent=1)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(8, 4))
        labels, vals = [], []
        for r in rows:
            for k in r:
                if k.endswith("_ms") and r[k] and k != "floor_ms":
                    labels.append(f"{r['workload']}\n{k[:-3]}")
                    vals.append(100 * r["floor_ms"] / r[k])
        ax.bar(range(len(vals)), vals)
        ax.set_xticks(range(len(vals)), labels, rotation=45, ha="right", fontsize=7)
        ax.set_ylabel("% of DRAM-floor speed")
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "gpu_suite.png"), dpi=120)
    except ImportError:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes")
    ap.add_argument("--only", default="", help="comma-separated workload names")
    ap.add_argument("--out", default=None, help="directory for JSON/PNG (default benchmarks/results)")
    a = ap.parse_args()
    run(a.quick, set(filter(None, a.only.split(","))) or None, a.out)


if __name__ == "__main__":
    main()
