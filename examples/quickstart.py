"""loopir in one page: write tensor expressions, schedule them, compile, run, check against numpy.

    python examples/quickstart.py            # GPU (CUDA) when one is usable, else this CPU (LLVM)
    python examples/quickstart.py --cpu      # force the CPU target (the CUDA C is still compiled and shown)
    python examples/quickstart.py --small    # a small size (quick check)

Two programs: the GELU chain (three stages that fuse into one loop) and y = sin(x)^2 + cos(x)^2.
"""

from __future__ import annotations

import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a plain checkout

from codegen import build, gpu_available  # noqa: E402
from loopir import te  # noqa: E402
from schedules import auto_schedule  # noqa: E402

N = 1 << (14 if "--small" in sys.argv else 22)




def gelu_chain():
    n = te.var("n")
    x = te.placeholder((n,), "float32", name="x")
    cube = te.compute((n,), lambda i: x[i] * x[i] * x[i], name="cube")
    inner = te.compute((n,), lambda i: math.sqrt(2 / math.pi) * (x[i] + 0.044715 * cube[i]), name="inner")
    y = te.compute((n,), lambda i: 0.5 * x[i] * (1.0 + te.tanh(inner[i])), name="y")
    ref = lambda a: 0.5 * a * (1 + np.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a * a * a)))  # noqa: E731
    return x, y, ref


def sincos():
    n = te.var("n")
    x = te.placeholder((n,), "float32", name="x")
    y = te.compute((n,), lambda i: te.sin(x[i]) ** 2 + te.cos(x[i]) ** 2, name="y")
    return x, y, lambda a: np.sin(a) ** 2 + np.cos(a) ** 2


def schedule(y, target: str) -> tuple[object, str]:
    """The automatic schedule: inline the chain into one stage, then split the loop into parallel
    chunks of vector lanes (CPU) or blocks of threads with 16-byte accesses (GPU); every step checked."""
    return auto_schedule([y], target=target), "auto_schedule"


def median_ms(f, reps: int = 7) -> float:
    f()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return sorted(ts)[len(ts) // 2] * 1e3


def excerpt(source: str, kernels: list[str], lines: int = 14) -> str:
    body = [ln for ln in source.splitlines() if ln.strip()]
    first = kernels[0] if kernels else ""
    start = next((k for k, ln in enumerate(body) if first and f"{first}(" in ln and "declare" not in ln),
                 next((k for k, ln in enumerate(body) if ln.startswith(("define", "extern", "__global__"))), 0))
    return "\n".join("    " + ln for ln in body[start:start + lines]) + "\n    ..."


def main() -> int:
    target = "cuda" if "--cpu" not in sys.argv and gpu_available() else "cpu"
    print(f"loopir quickstart — target: {target}" + ("" if target == "cuda" else " (LLVM JIT on this CPU)"))
    rng = np.random.default_rng(0)
    xa = rng.uniform(-4, 4, N).astype(np.float32)
    ok = True
    for title, make in (("GELU chain", gelu_chain), ("sin(x)^2 + cos(x)^2", sincos)):
        x, y, ref = make()
        t = time.perf_counter()
        s, how = schedule(y, target)
        mod = build(s, [x, y], target=target)
        compile_ms = (time.perf_counter() - t) * 1e3
        print(f"\n=== {title}  ({how}; schedule + compile {compile_ms:.0f} ms)")
        print(s)
        print("  generated code (excerpt):")
        print(excerpt(mod.source, mod.kernels))
        if target == "cpu":  # NVRTC needs no GPU: compile the CUDA version too and show it
            xc, yc, _ = make()
            sc, _ = schedule(yc, "cuda")
            cu = build(sc, [xc, yc], target="cuda")
            print(f"  CUDA C for a GPU ({len(cu.kernels)} kernel(s), compiled by NVRTC, excerpt):")
            print(excerpt(cu.source, cu.kernels))
        ya = np.full_like(xa, np.nan)
        mod(xa, ya)
        expected = ref(xa)
        err = float(np.max(np.abs(ya - expected)))
        good = bool(np.allclose(ya, expected, rtol=1e-5, atol=1e-5))
        ok &= good
        t_ours = median_ms(lambda mod=mod, ya=ya: mod(xa, ya))
        t_np = median_ms(lambda ref=ref: ref(xa))
        print(f"  check vs numpy: max |err| = {err:.2e}  {'OK' if good else 'MISMATCH'}")
        print(f"  n = {N}: loopir {t_ours:.2f} ms, numpy {t_np:.2f} ms -> {t_np / t_ours:.1f}x numpy")
    print("\nall results match numpy" if ok else "\nSOME RESULTS DO NOT MATCH NUMPY")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
