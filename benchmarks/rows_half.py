"""Row reductions in float16 / bfloat16 through `build(outputs, args)` (fixed sizes) against PyTorch eager and
torch.compile (dynamic=False, reset per case) in the same run, with the DRAM floor (bytes / 4.25 TB/s).

    python3 benchmarks/rows_half.py [--dtypes float16 bfloat16] [--shapes 16384x4096 ...] [--json out.json]

Times: the mean of 10 back-to-back calls between CUDA events, median of 20 such (kernel time, queue kept full).
Accuracy: max |out - ref| / max |ref| against PyTorch's float64 computation on the same inputs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.gpu_gemm_half import _events_ms  # noqa: E402

BW = 4.25e12
SHAPES = ["16384x4096", "32768x1024", "8192x8192", "65536x512", "10000x3000"]
WORKLOADS = ("softmax", "layernorm", "rmsnorm")


def _torch_fn(name: str, x: Any, params: list[Any]) -> Any:
    import torch
    import torch.nn.functional as F

    from loopir.workloads import LAYERNORM_EPS, RMSNORM_EPS

    n = x.shape[1]
    if name == "softmax":
        return lambda: torch.softmax(x, -1)
    if name == "layernorm":
        return lambda: F.layer_norm(x, (n,), params[0], params[1], LAYERNORM_EPS)
    return lambda: F.rms_norm(x, (n,), params[0], RMSNORM_EPS)


def case(name: str, m: int, n: int, dtype: str, reps: int, compile_torch: bool,
         schedule: dict[str, Any] | None = None) -> dict[str, Any]:
    import torch

    from codegen import build
    from loopir import workloads as w

    wl = getattr(w, name)(m=m, n=n, dtype=dtype)
    tdt = getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(m + n)
    x = torch.randn(m, n, device="cuda", generator=g).to(tdt)
    params = [torch.randn(n, device="cuda", generator=g).to(tdt) for _ in wl.inputs[1:]]
    view = (lambda t: t.view(torch.uint16)) if dtype == "bfloat16" else (lambda t: t)
    row: dict[str, Any] = {"workload": name, "shape": f"{m}x{n}", "dtype": dtype}
    nbytes = np.dtype("float32" if dtype == "float32" else "uint16").itemsize * (2 * m * n + n * len(params))
    row["floor_ms"] = nbytes / BW * 1e3
    fn = _torch_fn(name, x, params)
    row["eager_ms"] = _events_ms(fn, reps)
    if compile_torch:
        torch._dynamo.reset()
        cf = torch.compile(lambda: fn(), dynamic=False)
        row["compile_ms"] = _events_ms(cf, reps)
    mod = build(list(wl.outputs), list(wl.inputs) + list(wl.outputs), target="cuda", schedule=schedule)
    row["schedule"] = schedule
    out = torch.full((m, n), float("nan"), device="cuda", dtype=tdt)
    args = [view(x), *(view(p) for p in params), view(out)]
    mod(*args)
    torch.cuda.synchronize()
    ref = _torch_fn(name, x.double(), [p.double() for p in params])()
    bad = bool(torch.isnan(out).any())
    row["rel_err"] = float("nan") if bad else float((out.double() - ref).abs().max() / ref.abs().max())
    row["ms"] = _events_ms(lambda: mod(*args), reps)
    row["floor_pct"] = 100 * row["floor_ms"] / row["ms"]
    row["vs_eager"] = row["eager_ms"] / row["ms"]
    if compile_torch:
        row["vs_compile"] = row["compile_ms"] / row["ms"]
    print(f"| {name} | {m}x{n} | {dtype} | {row['ms']:.4f} | {row['floor_pct']:.0f}% | "
          f"{row.get('compile_ms', float('nan')):.4f} | {100 * row['floor_ms'] / row.get('compile_ms', np.inf):.0f}% | "
          f"{row.get('vs_compile', float('nan')):.2f} | {row['vs_eager']:.2f} | {row['rel_err']:.1e} | "
          f"{json.dumps(schedule) if schedule else 'default'} |", flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dtypes", nargs="+", default=["float16", "bfloat16"])
    ap.add_argument("--shapes", nargs="+", default=SHAPES)
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--schedule", action="append", default=None,
                    help='auto_schedule options as JSON, e.g. {"rows": {"warp_lanes": 32, "warp_row_max": 2048}}; '
                         "repeat to time several (each row says which)")
    a = ap.parse_args()
    print("| workload | shape | dtype | ours ms | ours % floor | compile ms | compile % floor | ours vs compile | "
          "ours vs eager | rel. err |\n|---|---|---|---|---|---|---|---|---|---|", flush=True)
    rows = []
    for dtype in a.dtypes:
        for name in a.workloads:
            for sh in a.shapes:
                m, n = (int(v) for v in sh.split("x"))
                compiled = None  # torch.compile timed once per shape, shared by the schedules' rows
                for sched in [json.loads(x) for x in a.schedule] if a.schedule else [None]:
                    try:
                        rows.append(case(name, m, n, dtype, a.reps, not a.no_compile and compiled is None, sched))
                        if compiled is None and "compile_ms" in rows[-1]:
                            compiled = rows[-1]["compile_ms"]
                        elif compiled is not None:
                            rows[-1]["compile_ms"] = compiled
                            rows[-1]["vs_compile"] = compiled / rows[-1]["ms"]
                    except Exception as e:  # noqa: BLE001 - report, keep the others
                        print(f"| {name} | {sh} | {dtype} | failed: {type(e).__name__}: {str(e)[:200]} |", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
