"""Automatic fusion: y = sin(x)^2 + cos(x)^2 written as five stages becomes one kernel.

    python examples/sincos.py            # GPU when one is usable, else the CPU target
    python examples/sincos.py --cpu      # force the CPU target
    python examples/sincos.py --small    # small sizes (quick check)

Prints the fusion plan (what was fused and refused, and why, with predicted bytes moved), an
excerpt of the generated kernel, checks the result against numpy and times fused vs unfused.
This file also holds `run_example`, which the other fusion examples (gelu, horizontal, softmax,
layernorm) share.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # run from a plain checkout

from codegen import build, gpu_available  # noqa: E402
from loopir import te  # noqa: E402
from schedules import auto_schedule  # noqa: E402




def _excerpt(source: str, lines: int = 40) -> str:
    start = source.find("__global__")
    if start < 0:
        start = source.find("define ")
    body = source[max(start, 0):].splitlines()
    more = len(body) - lines
    return "\n".join(body[:lines]) + (f"\n... ({more} more lines)" if more > 0 else "")


def _time(mod, arrays: list[np.ndarray], target: str) -> float:
    if target == "cuda" and hasattr(mod, "benchmark"):
        return float(mod.benchmark(*arrays))
    mod(*arrays)  # warm-up
    ts = []
    for _ in range(5):
        t0 = time.perf_counter()
        mod(*arrays)
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts)) * 1e3


def run_example(title: str, inputs: list, outputs: list, reference: Callable, sizes: dict[str, int],
                rtol: float = 1e-4) -> None:
    """Plan, build fused and unfused, check against `reference`, time both."""
    target = "cuda" if gpu_available() and "--cpu" not in sys.argv else "cpu"
    print(f"== {title} on {target}, sizes {sizes}")
    s = auto_schedule(outputs, target=target, sizes=sizes)
    print(s.plan.explain())
    print()
    if target == "cpu":  # the CUDA kernel still compiles here (NVRTC needs no GPU): show it
        cu = build(auto_schedule(outputs, target="cuda", sizes=sizes), inputs + outputs, target="cuda")
        print(f"CUDA kernel ({len(cu.kernels)} kernel(s): {', '.join(cu.kernels)}):")
        print(_excerpt(cu.source))
        print()
    mod = build(s, inputs + outputs, target=target)
    unfused = build(auto_schedule(outputs, target=target, fuse=False, sizes=sizes), inputs + outputs, target=target)
    print(f"generated {target} code ({len(mod.kernels)} kernel(s): {', '.join(mod.kernels)}):")
    print(_excerpt(mod.source, 25))
    print()

    def shape(t):
        return tuple(sizes[d.name] if hasattr(d, "name") else int(d.value) for d in t.shape)

    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(shape(t)).astype(t.dtype) for t in inputs]
    ys = [np.full(shape(t), np.nan, dtype=t.dtype) for t in outputs]
    mod(*xs, *ys)
    for t, got, want in zip(outputs, ys, reference(*xs)):
        err = float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-30))
        ok = np.allclose(got, want, rtol=rtol, atol=1e-5)
        print(f"check {t.name}: {'ok' if ok else 'MISMATCH'} (max error {err:.2e} relative to the largest value)")
        if not ok:
            raise SystemExit(1)
    t_f = _time(mod, xs + ys, target)
    t_u = _time(unfused, xs + ys, target)
    moved = sum(a.nbytes for a in xs + ys)
    print(f"fused   ({len(mod.kernels)} kernel):  {t_f:.3f} ms  ({moved / t_f / 1e6:.1f} GB/s of inputs + outputs)")
    print(f"unfused ({len(unfused.kernels)} kernels): {t_u:.3f} ms  -> fused is {t_u / t_f:.2f}x faster")


def sincos_chain():
    n = te.var("n")
    x = te.placeholder((n,), name="x")
    s = te.compute((n,), lambda i: te.sin(x[i]), name="s")
    c = te.compute((n,), lambda i: te.cos(x[i]), name="c")
    s2 = te.compute((n,), lambda i: s[i] * s[i], name="s2")
    c2 = te.compute((n,), lambda i: c[i] * c[i], name="c2")
    y = te.compute((n,), lambda i: s2[i] + c2[i], name="y")

    def ref(xa):
        x64 = xa.astype(np.float64)
        return ((np.sin(x64) ** 2 + np.cos(x64) ** 2).astype(np.float32),)

    return [x], [y], ref


def main() -> None:
    ins, outs, ref = sincos_chain()
    n = 1 << (14 if "--small" in sys.argv else 24)
    run_example("y = sin(x)^2 + cos(x)^2 (five stages)", ins, outs, ref, {"n": n})


if __name__ == "__main__":
    main()
