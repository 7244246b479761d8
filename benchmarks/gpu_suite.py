"""GPU benchmark suite: ours (fused and unfused) vs PyTorch eager, torch.compile and the DRAM floor,
in one process.

Workloads (float32, sizes known at build time): sin^2+cos^2 2^26, the GELU chain 8192^2, horizontal
(relu, sigmoid, tanh of one input) 8192^2, row softmax 16384x4096, layer norm 16384x4096. For each:

* the DRAM floor: the fewest bytes (inputs read once, outputs written once) over the copy bandwidth
  measured at the start of the run (a 1 GiB device-to-device copy, read + write counted);
* PyTorch eager and `torch.compile` (default mode) of the same function;
* ours: `auto_schedule(outputs, fuse=True)` ("fused") and `fuse=False` ("unfused", one kernel per
  stage), plus a few extra variants (the hand split+bind schedule of issue 5 on sin^2+cos^2, the
  fused kernel with symbolic sizes, the fused kernel with evict-first 128-bit loads/stores) and,
  with `--sweep`, block size / chunks-per-thread choices.

Timing: CUDA events around `BATCH` back-to-back calls (so host launch overhead overlaps the GPU
work), `REPEAT` times after warm-up, median / BATCH. Our modules are timed on their launch path
(arguments bound once, like `mod.benchmark`). Numerics: every output is poisoned with NaN, then
compared with a float64 reference computed on the GPU from the same inputs; reported as the max
error relative to the largest |reference| (NaN fails). Writes gpu_suite.json, gpu_suite.md and
gpu_suite.png (matplotlib optional) into --out (default benchmarks/results).

    python3 benchmarks/gpu_suite.py [--quick] [--only sincos,gelu] [--sweep] [--gemm] [--out DIR]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

BATCH = 10
REPEAT = 15
WARMUP = 3

GOALS = {  # workload -> (min % of floor speed, max time / torch.compile time)
    "sincos": (90, 1.05), "gelu": (90, 1.05), "horizontal": (90, 1.05), "softmax": (80, 1.2), "layernorm": (80, 1.2),
}


@dataclass
class Entry:
    name: str
    label: str  # shown in the table, e.g. "sin^2+cos^2 2^26"
    workload: Callable[[bool], Any]  # quick -> loopir Workload with constant sizes
    torch_fn: Callable[..., Any]  # input tensors -> output tensor or tuple
    variants: Callable[[Any, bool], dict[str, Any]] = field(default=lambda w, sweep: {})  # extra Schedules/Programs


# ----------------------------------------------------------------------------- workloads


def _sincos(quick: bool) -> Any:
    from loopir import workloads as W

    return W.sincos(1 << (22 if quick else 26))


def _gelu(quick: bool) -> Any:
    from loopir import workloads as W

    side = 2048 if quick else 8192
    return W.gelu(m=side, n=side)


def _horizontal(quick: bool) -> Any:
    from loopir import workloads as W

    side = 2048 if quick else 8192
    return W.horizontal(m=side, n=side)


def _softmax(quick: bool) -> Any:
    from loopir import workloads as W

    return W.softmax(4096 if quick else 16384, 4096)


def _layernorm(quick: bool) -> Any:
    from loopir import workloads as W

    return W.layernorm(4096 if quick else 16384, 4096)


def _torch_gelu(x: Any) -> Any:
    c = math.sqrt(2.0 / math.pi)
    return 0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())


def _torch_softmax(x: Any) -> Any:
    import torch

    return torch.softmax(x, dim=-1)


def _torch_layernorm(x: Any, w: Any, b: Any) -> Any:
    import torch

    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, eps=1e-5)


def _split_bind(w: Any, threads: int = 256) -> Any:
    """Issue 5's hand schedule: inline the chain, 4-wide vector lane, split by the block size, bind."""
    from schedules import Schedule

    s = Schedule(list(w.outputs))
    for t in w.outputs[0].op.inputs:
        if hasattr(t.op, "body"):
            s.compute_inline(t)
    (i,) = s.loops(w.outputs[0])
    io, lane = s.split(i, 4)
    s.vectorize(lane)
    bo, ti = s.split(io, threads)
    s.bind(bo, "blockIdx.x").bind(ti, "threadIdx.x")
    return s


def _symbolic(name: str) -> Callable[[Any, bool], Any]:
    """The fused schedule of the same workload with symbolic sizes (float4 behind a run-time check)."""

    def make(w: Any, sweep: bool) -> Any:
        from loopir import workloads as W
        from schedules import auto_schedule

        sym = {"gelu": lambda: W.gelu(m=W.te.var("m")), "horizontal": lambda: W.horizontal(m=W.te.var("m"))}
        ws = sym.get(name, W.SEEDS[name])()
        return auto_schedule(list(ws.outputs), target="cuda"), list(ws.inputs) + list(ws.outputs)

    return make


def _sweep(w: Any) -> dict[str, Any]:
    from schedules import auto_schedule

    out = {}
    for threads, per in ((64, 2), (128, 1), (128, 4), (256, 1), (256, 2), (512, 2)):
        out[f"fused T={threads} U={per}"] = auto_schedule(list(w.outputs), target="cuda", threads=threads,
                                                          per_thread=per)
    return out


STREAMING = {  # NVRTC options: the fused kernel's global float4 accesses as evict-first (__ldcs / __stcs)
    "fused, evict-first stores": ("-DLOOPIR_STREAMING_STORES",),
    "fused, evict-first loads+stores": ("-DLOOPIR_STREAMING_LOADS", "-DLOOPIR_STREAMING_STORES"),
}


def _streaming(w: Any) -> dict[str, Any]:
    from schedules import auto_schedule

    args = list(w.inputs) + list(w.outputs)
    return {k: (auto_schedule(list(w.outputs), target="cuda"), args, {"options": o}) for k, o in STREAMING.items()}


def _ew_variants(name: str) -> Callable[[Any, bool], dict[str, Any]]:
    def make(w: Any, sweep: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"fused, symbolic sizes": _symbolic(name)(w, sweep), **_streaming(w)}
        if name == "sincos":
            out["split+bind (hand)"] = _split_bind(w)
        if sweep:
            out.update(_sweep(w))
        return out

    return make


def _row_variants(name: str) -> Callable[[Any, bool], dict[str, Any]]:
    def make(w: Any, sweep: bool) -> dict[str, Any]:
        from schedules import auto_schedule

        out: dict[str, Any] = {"fused, symbolic sizes": _symbolic(name)(w, sweep), **_streaming(w)}
        if sweep:
            for threads in (64, 256, 512):
                out[f"fused T={threads}"] = auto_schedule(list(w.outputs), target="cuda", threads=threads)
        return out

    return make


ENTRIES: list[Entry] = [
    Entry("sincos", "sin^2+cos^2 2^26", _sincos, lambda x: x.sin() ** 2 + x.cos() ** 2, _ew_variants("sincos")),
    Entry("gelu", "GELU chain 8192^2", _gelu, _torch_gelu, _ew_variants("gelu")),
    Entry("horizontal", "relu/sigmoid/tanh 8192^2", _horizontal,
          lambda x: (x.relu(), x.sigmoid(), x.tanh()), _ew_variants("horizontal")),
    Entry("softmax", "softmax 16384x4096", _softmax, _torch_softmax, _row_variants("softmax")),
    Entry("layernorm", "layer norm 16384x4096", _layernorm, _torch_layernorm, _row_variants("layernorm")),
]


# ----------------------------------------------------------------------------- measurement


def time_cuda(torch: Any, fn: Callable[[], Any], batch: int = BATCH, repeat: int = REPEAT,
              warmup: int = WARMUP) -> float:
    """Median milliseconds of one call: CUDA events around `batch` back-to-back calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(batch):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / batch)
    return float(statistics.median(times))


def copy_bandwidth(torch: Any, nbytes: int = 1 << 30) -> float:
    """Bytes per second of a device-to-device copy (read + write counted)."""
    src = torch.randn(nbytes // 4, device="cuda")
    dst = torch.empty_like(src)
    ms = time_cuda(torch, lambda: dst.copy_(src), batch=5, repeat=15)
    return 2 * nbytes / (ms * 1e-3)


def _as_tuple(x: Any) -> tuple[Any, ...]:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _err(got: Any, ref: Any) -> float:
    """max |got - ref| / max |ref| (inf when anything is NaN)."""
    import torch

    d = (got.double() - ref).abs()
    if bool(torch.isnan(d).any()):
        return float("inf")
    return float(d.max() / ref.abs().max().clamp_min(1e-30))


def _run_ours(torch: Any, sched: Any, ins: list[Any], outs: list[Any], ref: tuple[Any, ...]) -> dict[str, Any]:
    """Build `sched` ((Schedule, its te args) or a Schedule of the entry's workload), check, time."""
    from codegen import build

    sched, args, opts = (sched + ({},))[:3] if isinstance(sched, tuple) else (sched, None, {})
    t0 = time.perf_counter()
    mod = build(sched, args, target="cuda", **opts)
    build_s = time.perf_counter() - t0
    for o in outs:
        o.fill_(float("nan"))
    mod(*ins, *outs)
    torch.cuda.synchronize()
    err = max(_err(o, r) for o, r in zip(outs, ref))
    p = mod.prepare(tuple(ins) + tuple(outs))
    ms = time_cuda(torch, lambda: mod.launch(p))
    return {"ms": ms, "max_err": err, "kernels": len(mod.kernels), "build_s": build_s}


def _record(torch: Any, wname: str, res: dict[str, Any], ref: tuple[Any, ...], name: str, fn: Callable[[], Any],
            **extra: Any) -> None:
    """Check fn's outputs against ref, time it, store the result under res[name]."""
    try:
        got = _as_tuple(fn())
        torch.cuda.synchronize()
        extra["max_err"] = max(_err(g, r) for g, r in zip(got, ref))
        extra["ms"] = time_cuda(torch, fn)
        res[name] = extra
    except Exception as exc:  # noqa: BLE001 - report, keep going
        res[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    r = res[name]
    shown = f"{r['ms']:.4f} ms, err {r['max_err']:.1e}" if "ms" in r else r.get("error")
    print(f"  {wname:10s} {name:28s} {shown}", flush=True)


def run(quick: bool = False, only: set[str] | None = None, out_dir: str | None = None, sweep: bool = False,
        gemm: bool = False) -> dict[str, Any]:
    import torch

    from schedules import auto_schedule

    torch.manual_seed(0)
    bw = copy_bandwidth(torch, (1 << 28) if quick else (1 << 30))
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s (read + write)", flush=True)
    rows: list[dict[str, Any]] = []
    for e in ENTRIES:
        if only and e.name not in only:
            continue
        w = e.workload(quick)
        ins = [torch.randn(tuple(int(d.value) for d in t.shape), device="cuda", dtype=torch.float32)
               for t in w.inputs]
        outs = [torch.empty(tuple(int(d.value) for d in t.shape), device="cuda", dtype=torch.float32)
                for t in w.outputs]
        nbytes = sum(t.numel() * t.element_size() for t in ins + outs)
        floor_ms = nbytes / bw * 1e3
        ref = _as_tuple(e.torch_fn(*[t.double() for t in ins]))
        row: dict[str, Any] = {"workload": e.name, "label": e.label, "bytes": nbytes, "floor_ms": floor_ms,
                               "results": {}}
        res = row["results"]

        _record(torch, e.name, res, ref, "torch eager", lambda: e.torch_fn(*ins))  # noqa: B023
        try:
            t0 = time.perf_counter()
            compiled = torch.compile(e.torch_fn)
            compiled(*ins)
            torch.cuda.synchronize()
            compile_s = time.perf_counter() - t0
            _record(torch, e.name, res, ref, "torch.compile", lambda: compiled(*ins),  # noqa: B023
                    compile_s=compile_s)
        except Exception as exc:  # noqa: BLE001
            res["torch.compile"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        variants: dict[str, Any] = {}
        try:
            variants["fused"] = auto_schedule(list(w.outputs), target="cuda", fuse=True)
            variants["unfused"] = auto_schedule(list(w.outputs), target="cuda", fuse=False)
            row["plan"] = variants["fused"].plan.explain()
            variants.update(e.variants(w, sweep))
        except Exception as exc:  # noqa: BLE001
            res["schedule"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        for name, sched in variants.items():
            if not isinstance(sched, tuple):
                sched = (sched, list(w.inputs) + list(w.outputs))
            try:
                res[name] = _run_ours(torch, sched, ins, outs, ref)
            except Exception as exc:  # noqa: BLE001
                res[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            r = res[name]
            shown = f"{r['ms']:.4f} ms, err {r['max_err']:.1e}, {r['kernels']} kernel(s)" if "ms" in r else r["error"]
            print(f"  {e.name:10s} {name:28s} {shown}", flush=True)
        for r in res.values():
            if r.get("ms"):
                r["pct_floor"] = 100.0 * floor_ms / r["ms"]
        rows.append(row)
        ins = outs = ref = []  # free the device memory before the next workload
        torch.cuda.empty_cache()
    gemm_rows: list[dict[str, Any]] = []
    if gemm:
        try:
            sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
            from gpu_gemm import gemm_entries

            gemm_rows = gemm_entries()
        except Exception as exc:  # noqa: BLE001
            gemm_rows = [{"impl": "gemm", "ms": None, "error": f"{type(exc).__name__}: {exc}"[:300]}]
    data = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "command": " ".join(["python3", "benchmarks/gpu_suite.py", *sys.argv[1:]]),
        "copy_bandwidth_Bps": bw,
        "batch": BATCH, "repeat": REPEAT,
        "rows": rows,
        "gemm": gemm_rows,
    }
    report(data, out_dir)
    return data


# ----------------------------------------------------------------------------- report


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else ""


def table(data: dict[str, Any], full: bool = False) -> str:
    """The markdown table: per workload the floor, torch, and ours fused / unfused (all variants if full)."""
    lines = [
        f"device: {data['device']}; copy bandwidth {data['copy_bandwidth_Bps'] / 1e12:.2f} TB/s (read + write); "
        f"torch {data['torch']}; {data['date']}",
        "",
        "| workload | impl | ms | % of floor speed | compile / impl | eager / impl | max err | kernels | goal |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    main = ("torch eager", "torch.compile", "fused", "unfused")
    for row in data["rows"]:
        res = row["results"]
        tc = res.get("torch.compile", {}).get("ms")
        te_ = res.get("torch eager", {}).get("ms")
        lines.append(f"| {row['label']} | DRAM floor ({row['bytes'] / 2**20:.0f} MiB) | {row['floor_ms']:.4f} | 100 "
                     "| | | | | |")
        for name, r in res.items():
            if not full and name not in main and name != "split+bind (hand)":
                continue
            if "ms" not in r:
                lines.append(f"| {row['label']} | {name} | failed: {r.get('error', '')[:80]} | | | | | | |")
                continue
            goal = ""
            if name == "fused" and row["workload"] in GOALS:
                pct, vs = GOALS[row["workload"]]
                ok = r["pct_floor"] >= pct and (tc is None or r["ms"] <= vs * tc)
                goal = f"{'met' if ok else 'MISSED'} (≥{pct}%, ≤{vs}x compile)"
            if name == "unfused" and row["workload"] == "gelu" and res.get("fused", {}).get("ms"):
                sp = r["ms"] / res["fused"]["ms"]
                goal = f"fused {sp:.1f}x faster ({'met' if sp >= 3 else 'MISSED'}, ≥3x)"
            ours = "kernels" in r
            lines.append(
                f"| {row['label']} | {'ours ' if ours else ''}{name} | {r['ms']:.4f} | {r['pct_floor']:.0f} | "
                f"{_ratio(tc, r['ms']) if name != 'torch.compile' else ''} | "
                f"{_ratio(te_, r['ms']) if name != 'torch eager' else ''} | {r['max_err']:.1e} | "
                f"{r.get('kernels', '')} | {goal} |")
    for g in data.get("gemm") or []:
        ms, ratio, err = g.get("ms"), g.get("ratio_vs_cublas"), g.get("rel_err")
        lines.append(f"| {g.get('workload', 'gemm')} | {g.get('impl')} | {f'{ms:.3f}' if ms else 'failed'} | "
                     f"{g.get('tflops', 0):.1f} TFLOP/s | | {f'{ratio:.2f}x cuBLAS' if ratio else ''} | "
                     f"{f'{err:.1e}' if err is not None else ''} | {g.get('kernels', '')} | |")
    return "\n".join(lines)


def report(data: dict[str, Any], out_dir: str | None) -> None:
    out_dir = out_dir or os.path.join(ROOT, "benchmarks", "results")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "gpu_suite.json"), "w") as f:
        json.dump(data, f, indent=1)
    full = table(data, full=True)
    with open(os.path.join(out_dir, "gpu_suite.md"), "w") as f:
        f.write(f"command: `{data['command']}`\n\n{full}\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        impls = ["torch eager", "torch.compile", "fused", "unfused"]
        fig, ax = plt.subplots(figsize=(9, 4))
        width = 0.2
        for k, impl in enumerate(impls):
            vals = [row["results"].get(impl, {}).get("pct_floor", 0) for row in data["rows"]]
            ax.bar([x + k * width for x in range(len(vals))], vals, width, label=impl)
        ax.set_xticks([x + 1.5 * width for x in range(len(data["rows"]))], [r["label"] for r in data["rows"]],
                      fontsize=8)
        ax.axhline(100, color="k", lw=0.8)
        ax.set_ylabel("% of DRAM-floor speed")
        ax.set_title(f"loopir vs PyTorch on {data['device']}")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "gpu_suite.png"), dpi=120)
        print(f"wrote {os.path.join(out_dir, 'gpu_suite.png')}")
    except ImportError:
        print("matplotlib is not installed: no PNG chart (JSON and markdown written)")
    print()
    print(table(data, full=False))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes")
    ap.add_argument("--only", default="", help="comma-separated workload names")
    ap.add_argument("--sweep", action="store_true", help="also time block sizes / chunks per thread")
    ap.add_argument("--gemm", action="store_true", help="include benchmarks/gpu_gemm.py's gemm_entries")
    ap.add_argument("--out", default=None, help="directory for JSON/markdown/PNG (default benchmarks/results)")
    a = ap.parse_args()
    run(a.quick, set(filter(None, a.only.split(","))) or None, a.out, a.sweep, a.gemm)


if __name__ == "__main__":
    main()
