"""Halide's 3x3 separable blur (apps/blur) with its classic schedules: store_at / compute_at of blur_x.

    python examples/blur_store_at.py            # CPU, and the GPU when one is usable
    python examples/blur_store_at.py --cpu      # CPU only (the CUDA kernel is still built and shown)
    python examples/blur_store_at.py --small    # small sizes (what the test runs)

The algorithm (Halide's, on float32 here where Halide's app uses uint16):

    blur_x(y, x) = (input(y, x) + input(y, x + 1) + input(y, x + 2)) / 3
    blur_y(y, x) = (blur_x(y, x) + blur_x(y + 1, x) + blur_x(y + 2, x)) / 3

Schedules, each checked against numpy (float64) and timed:
  strips  Halide's app: blur_y.split(y, 8).parallel(y).vectorize(x, 8);
          blur_x.store_at(blur_y, y).compute_at(blur_y, yi).vectorize(x, 8) — a strip of 10 rows of blur_x
          per parallel iteration, sliding down the strip (each row of blur_x computed once per strip);
  tiles   the Halide paper's: blur_y.tile(x, y, 256, 32).vectorize(xi, 8).parallel(y);
          blur_x.compute_at(blur_y, x) (stored there too) — recomputes 2 rows per 32;
  root    both stages at the root (loopir's default: no storage placement);
  cuda    32x8 tiles of blur_y per block, blur_x stored per block in shared memory, computed by the block.
Halide's published number (the SIGGRAPH 2012 talk, "Decoupling Algorithms from Schedules"): 0.9 ms per
megapixel on a quad-core x86 (uint16 data), against 9.96 ms/MP for naive C.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # run from a plain checkout

from codegen import build, gpu_available  # noqa: E402
from loopir import interp, te  # noqa: E402
from schedules import Schedule  # noqa: E402

SMALL = "--small" in sys.argv
HALIDE_MS_PER_MP = 0.9  # SIGGRAPH 2012 talk, quad-core x86, uint16
NAIVE_C_MS_PER_MP = 9.96


def algorithm():
    h, w = te.var("h"), te.var("w")
    inp = te.placeholder((h + 2, w + 2), name="input")
    blur_x = te.compute((h + 2, w), lambda y, x: (inp[y, x] + inp[y, x + 1] + inp[y, x + 2]) / 3, name="blur_x")
    blur_y = te.compute((h, w), lambda y, x: (blur_x[y, x] + blur_x[y + 1, x] + blur_x[y + 2, x]) / 3,
                        name="blur_y")
    return inp, blur_x, blur_y


def reference(a: np.ndarray) -> np.ndarray:
    a = a.astype(np.float64)
    bx = (a[:, :-2] + a[:, 1:-1] + a[:, 2:]) / 3
    return (bx[:-2] + bx[1:-1] + bx[2:]) / 3


def numpy_blur(a: np.ndarray) -> np.ndarray:  # the numpy baseline, in float32 as the inputs
    bx = (a[:, :-2] + a[:, 1:-1] + a[:, 2:]) / np.float32(3)
    return (bx[:-2] + bx[1:-1] + bx[2:]) / np.float32(3)


def strips():
    inp, blur_x, blur_y = algorithm()
    s = Schedule(blur_y)
    y, x = s.loops(blur_y)
    yo, yi = s.split(y, 8)
    s.compute_at(blur_x, yi)
    s.store_at(blur_x, yo)   # the strip's rows of blur_x live in the parallel iteration: it slides down the strip
    s.parallel(yo)
    _, xi = s.split(x, 8)
    s.vectorize(xi)
    _, xci = s.split(s.loops(blur_x)[-1], 8)
    s.vectorize(xci)
    return inp, blur_y, s


def tiles():
    inp, blur_x, blur_y = algorithm()
    s = Schedule(blur_y)
    y, x = s.loops(blur_y)
    yo, xo, yi, xi = s.tile(y, x, 32, 256)
    s.compute_at(blur_x, xo)
    s.store_at(blur_x, xo)   # (32 + 2) x 256 of blur_x per tile, on the stack
    s.parallel(yo)
    _, xii = s.split(xi, 8)
    s.vectorize(xii)
    _, xci = s.split(s.loops(blur_x)[-1], 8)
    s.vectorize(xci)
    return inp, blur_y, s


def root():
    inp, blur_x, blur_y = algorithm()
    s = Schedule(blur_y)
    s.compute_root(blur_x)
    return inp, blur_y, s


def cuda():
    inp, blur_x, blur_y = algorithm()
    s = Schedule(blur_y)
    y, x = s.loops(blur_y)
    yo, xo, yi, xi = s.tile(y, x, 8, 32)
    s.compute_at(blur_x, xo).store_at(blur_x, xo).set_scope(blur_x, "shared")
    yc, xc = s.loops(blur_x)[-2:]
    s.bind(yc, "threadIdx.y").bind(xc, "threadIdx.x")   # the block computes its 10 x 32 rows of blur_x together
    s.bind(yo, "blockIdx.y").bind(xo, "blockIdx.x").bind(yi, "threadIdx.y").bind(xi, "threadIdx.x")
    return inp, blur_y, s


def _time(f, *args, reps: int) -> float:
    f(*args)  # warm-up
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f(*args)
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts)) * 1e3


def _check(name: str, got: np.ndarray, a: np.ndarray) -> None:
    want = reference(a)
    err = float(np.max(np.abs(got - want)))
    ok = np.allclose(got, want, rtol=1e-5, atol=1e-5) and not np.isnan(got).any()
    print(f"  check {name}: {'ok' if ok else 'MISMATCH'} (max abs error {err:.1e})")
    if not ok:
        raise SystemExit(1)


def evaluations() -> None:
    """blur_x evaluations per output pixel, counted in the interpreter (the sliding window at work)."""
    h, w = 32, 16
    a = np.random.default_rng(1).standard_normal((h + 2, w + 2)).astype(np.float32)
    for name, make in (("strips", strips), ("tiles", tiles), ("root", root)):
        _, _, s = make()
        out = np.full((h, w), np.nan, np.float32)
        trace: list = []
        interp.run(s.program, a, out, trace=trace)
        _check(f"{name} (interpreter)", out, a)
        n = sum(1 for stmt, _ in trace if stmt == "blur_x")
        print(f"  {name}: blur_x evaluated {n} times for {h} x {w} outputs ({n / (h * w):.3f} per output)")


def main() -> None:
    use_gpu = gpu_available() and "--cpu" not in sys.argv
    h, w = (67, 45) if SMALL else (2048, 2048)
    reps = 2 if SMALL else 10
    mp = h * w / 1e6
    print(f"== Halide's blur, {h} x {w} float32 ({mp:.2f} MP)")
    for name, make in (("strips", strips), ("tiles", tiles)):
        print(f"-- {name} schedule:")
        print("\n".join("   " + ln for ln in str(make()[2]).splitlines()))
    print("-- evaluations (interpreter, 32 x 16):")
    evaluations()
    rng = np.random.default_rng(0)
    a = rng.standard_normal((h + 2, w + 2)).astype(np.float32)
    print(f"-- CPU ({os.cpu_count()} cores here):")
    results = {}
    for name, make in (("strips", strips), ("tiles", tiles), ("root", root)):
        inp, blur_y, s = make()
        mod = build(s, [inp, blur_y], target="cpu")
        out = np.full((h, w), np.nan, np.float32)
        mod(a, out)
        _check(name, out, a)
        results[name] = _time(mod, a, out, reps=reps)
    results["numpy"] = _time(numpy_blur, a, reps=reps)
    for name, ms in results.items():
        print(f"  {name:7s} {ms:8.3f} ms  {ms / mp:7.3f} ms/MP")
    print(f"  Halide (published, SIGGRAPH 2012 talk, quad-core x86, uint16): {HALIDE_MS_PER_MP} ms/MP; "
          f"naive C there: {NAIVE_C_MS_PER_MP} ms/MP")
    inp, blur_y, s = cuda()
    cu = build(s, [inp, blur_y], target="cuda")
    print(f"-- CUDA schedule ({', '.join(cu.kernels)}):")
    print("\n".join("   " + ln for ln in str(s).splitlines()))
    src = cu.source[cu.source.find('extern "C"'):]
    print("\n".join(src.splitlines()[:40]))
    small = np.random.default_rng(2).standard_normal((19, 70)).astype(np.float32)
    out = np.full((17, 68), np.nan, np.float32)
    interp.run(s.program, small, out, gpu_order="reversed")
    _check("cuda (adversarial GPU interpreter)", out, small)
    if use_gpu:
        out = np.full((h, w), np.nan, np.float32)
        cu(a, out)
        _check("cuda (device)", out, a)
        ms = float(cu.benchmark(a, out)) if hasattr(cu, "benchmark") else _time(cu, a, out, reps=reps)
        print(f"  cuda    {ms:8.3f} ms  {ms / mp:7.3f} ms/MP (device)")


if __name__ == "__main__":
    main()
