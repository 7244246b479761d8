"""Small GEMMs whose epilogue goes through TMA boxes (codegen/cuda/wgmma_tma.py), for compute-sanitizer: a plain
store (relu(A @ B + bias)), a residual loaded into the boxes (A @ B + R), both at symbolic sizes with edges in rows
and columns, and a linear layer over (B, T, C) at a T that is not a multiple of 64 (3-d maps). Each checked
against float64 (outputs NaN-poisoned); exit status 1 on a mismatch.

    compute-sanitizer --tool memcheck python3 benchmarks/wgmma_store_check.py     # also racecheck, synccheck
"""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

import numpy as np  # noqa: E402

from codegen import build  # noqa: E402
from loopir import te  # noqa: E402
from loopir import workloads as w  # noqa: E402
from test_wgmma_batched import _data, _linear  # noqa: E402


def _residual() -> tuple[list, object]:
    n, m, p = te.var("n"), te.var("m"), te.var("p")
    a = te.placeholder((n, p), "float16", name="A")
    b = te.placeholder((p, m), "float16", name="B")
    r = te.placeholder((n, m), "float16", name="R")
    k = te.reduce_axis(p, "k")
    mm = te.compute((n, m), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="mm")
    return [a, b, r], te.compute((n, m), lambda i, j: mm[i, j] + r[i, j], name="y")


def _case(kind: str, n: int, m: int, p: int, torch: object) -> bool:
    rnd = torch.randn  # type: ignore[attr-defined]
    if kind == "relu":
        wl = w.matmul_bias_relu(n=te.var("n"), m=te.var("m"), p=te.var("p"), dtype="float16")
        mod = build(list(wl.outputs), list(wl.inputs) + list(wl.outputs), target="cuda")
        args = [rnd(n, p, device="cuda").half(), rnd(p, m, device="cuda").half(), rnd(m, device="cuda").half()]
        ref = torch.relu(args[0].double() @ args[1].double() + args[2].double())  # type: ignore[attr-defined]
    else:
        ins, y = _residual()
        mod = build([y], [*ins, y], target="cuda")
        args = [rnd(n, p, device="cuda").half() / 10, rnd(p, m, device="cuda").half(), rnd(n, m, device="cuda").half()]
        ref = args[0].double() @ args[1].double() + args[2].double()
    out = torch.full((n, m), float("nan"), device="cuda", dtype=torch.half)  # type: ignore[attr-defined]
    mod(*args, out)
    torch.cuda.synchronize()  # type: ignore[attr-defined]
    src = mod.specializer.variants[mod._last_call[0]].source
    err = float((out.double() - ref).abs().max() / ref.abs().max())
    ok = err < 1e-2 and not bool(out.isnan().any()) and "loopir_tma_store2d(&" in src
    print(f"{kind} {n}x{m}x{p}: rel. err {err:.1e} {'ok' if ok else 'FAIL'}", flush=True)
    return ok


def main() -> int:
    import torch

    good = [_case(kind, *size, torch) for size in [(300, 264, 136), (200, 776, 72)] for kind in ("relu", "residual")]
    y, args = _linear(te.var("B"), te.var("T"))
    mod = build([y], args, target="cuda")
    host, ref = _data((3, 100), seed=3)
    out = np.full(ref.shape, np.nan, np.float16)
    mod(*host, out)
    err = float(np.abs(out.astype(np.float64) - ref).max() / np.abs(ref).max())
    good.append(err < 1e-2 and not np.isnan(out).any())
    print(f"linear (3, 100, 64) x 192: rel. err {err:.1e} {'ok' if good[-1] else 'FAIL'}")
    return 0 if all(good) else 1


if __name__ == "__main__":
    sys.exit(main())
