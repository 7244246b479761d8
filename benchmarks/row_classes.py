"""Row kernels at symbolic sizes against the same shape at fixed sizes, kernel time only: how far the call-time
variant (planned at its row class's bound, codegen.specialize.ROW_CLASSES) trails the fixed-size kernel, for the
row classes of this tree and for another set of classes given on the command line (e.g. those of an older tree).

    python3 benchmarks/row_classes.py [--shapes 4096x3000 65536x64 ...] [--dtypes float16 float32]
        [--old-classes 127,1024,4096,8192,16384,65536] [--json out.json]

Each module is built through `build(outputs, args, target="cuda")` (sizes `te.var` for the symbolic ones; a fresh
module per class set, `ROW_CLASSES` swapped while it plans its variant) and timed with `mod.benchmark` (the median of
CUDA-event times of one call's recorded launches: the kernels, not the host's call path). Outputs are NaN-poisoned
and checked against float64 first.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SHAPES = ["65536x64", "65536x100", "16384x300", "16384x700", "65536x768", "16384x1000", "8192x1300", "8192x2000",
          "4096x2500", "4096x3000", "4096x5000", "2048x12000", "64x4096"]
WORKLOADS = ("softmax", "layernorm", "rmsnorm")
TOL = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 3e-2}


def _module(name: str, dtype: str, m: Any, n: Any, classes: tuple[int, ...] | None) -> Any:
    from codegen import build
    from codegen import specialize
    from loopir import workloads as w

    wl = getattr(w, name)(m=m, n=n, dtype=dtype)
    mod = build(list(wl.outputs), list(wl.inputs) + list(wl.outputs), target="cuda")
    if classes is None:
        return mod
    return _Swapped(mod, classes, specialize)


class _Swapped:
    """A symbolic module whose variants are planned with other row classes (swapped in while a call selects)."""

    def __init__(self, mod: Any, classes: tuple[int, ...], specialize: Any) -> None:
        self.mod, self.classes, self.spec = mod, classes, specialize

    def _swap(self, fn: Any) -> Any:
        saved = self.spec.ROW_CLASSES
        self.spec.ROW_CLASSES = self.classes
        try:
            return fn()
        finally:
            self.spec.ROW_CLASSES = saved

    def __call__(self, *args: Any) -> None:
        self._swap(lambda: self.mod(*args))

    def benchmark(self, *args: Any, **kw: Any) -> float:
        return self._swap(lambda: self.mod.benchmark(*args, **kw))

    @property
    def specializations(self) -> list[str]:
        return self.mod.specializations


def case(name: str, m: int, n: int, dtype: str, old: tuple[int, ...], reps: int) -> dict[str, Any]:
    import torch

    from loopir import te

    tdt = getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(m * 7 + n)
    x = torch.randn(m, n, device="cuda", generator=g).to(tdt)
    params = [torch.randn(n, device="cuda", generator=g).to(tdt) for _ in range({"softmax": 0, "rmsnorm": 1}.get(
        name, 2))]
    view = (lambda t: t.view(torch.uint16)) if dtype == "bfloat16" else (lambda t: t)
    ref = _reference(name, x.double(), [p.double() for p in params])
    row: dict[str, Any] = {"workload": name, "shape": f"{m}x{n}", "dtype": dtype}
    mods = {"fixed": _module(name, dtype, m, n, None),
            "sym": _module(name, dtype, te.var("m"), te.var("n"), None),
            "sym_old": _module(name, dtype, te.var("m"), te.var("n"), old)}
    for label, mod in mods.items():
        out = torch.full((m, n), float("nan"), device="cuda", dtype=tdt)
        args = [view(x), *(view(p) for p in params), view(out)]
        mod(*args)
        torch.cuda.synchronize()
        err = float((out.double() - ref).abs().max() / ref.abs().max())
        row[f"{label}_err"] = err
        if not err <= TOL[dtype]:
            row["status"] = f"FAIL {label}: rel. error {err:.1e}"
        row[f"{label}_ms"] = mod.benchmark(*args, warmup=5, repeat=reps)
        if label != "fixed":
            row[f"{label}_key"] = ", ".join(mod.specializations)
    row["sym_fixed"] = row["sym_ms"] / row["fixed_ms"]
    row["sym_old_fixed"] = row["sym_old_ms"] / row["fixed_ms"]
    print(f"| {name} | {m}x{n} | {dtype} | {row['fixed_ms']:.4f} | {row['sym_ms']:.4f} | {row['sym_fixed']:.3f} | "
          f"{row['sym_old_ms']:.4f} | {row['sym_old_fixed']:.3f} | {row['sym_key']} | {row['sym_old_key']} | "
          f"{row.get('status', 'ok')} |", flush=True)
    return row


def _reference(name: str, x: Any, params: list[Any]) -> Any:
    import torch
    import torch.nn.functional as F

    from loopir.workloads import LAYERNORM_EPS, RMSNORM_EPS

    n = x.shape[1]
    if name == "softmax":
        return torch.softmax(x, -1)
    if name == "layernorm":
        return F.layer_norm(x, (n,), params[0], params[1], LAYERNORM_EPS)
    return F.rms_norm(x, (n,), params[0], RMSNORM_EPS)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shapes", nargs="+", default=SHAPES)
    ap.add_argument("--dtypes", nargs="+", default=["float16", "float32"])
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    ap.add_argument("--old-classes", default="127,1024,4096,8192,16384,65536",
                    help="the other row classes (default: those before 2026-12-07's finer classes)")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    old = tuple(int(v) for v in a.old_classes.split(","))
    print("| workload | shape | dtype | fixed ms | sym ms | sym/fixed | sym ms (other classes) | sym/fixed (other) | "
          "key | key (other) | status |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for shape in a.shapes:
        m, n = (int(v) for v in shape.split("x"))
        for dtype in a.dtypes:
            for name in a.workloads:
                try:
                    rows.append(case(name, m, n, dtype, old, a.reps))
                except Exception as exc:  # noqa: BLE001 - one case failing must not end the sweep
                    print(f"| {name} | {shape} | {dtype} | ERROR {type(exc).__name__}: {str(exc)[:200]} |", flush=True)
                    rows.append({"workload": name, "shape": shape, "dtype": dtype, "status": f"ERROR {exc}"})
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"old_classes": old, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
