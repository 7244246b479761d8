"""TVM's "How to optimize convolution on GPU" (opt_conv_cuda), ported to loopir: the same convolution and the
same shape of schedule — block tiling, virtual threads, thread binding, shared-memory tiles of both inputs
copied by the block's threads, the output accumulated in registers.

    python examples/opt_conv_cuda.py [--small] [--cpu]

The convolution (TVM's sizes): batch 256, a 14 x 14 image with 256 input channels, 512 output channels, a
3 x 3 kernel, padding 1, stride 1, in TVM's HWCN layout (height, width, channel, batch: the batch is the
contiguous axis, so neighbouring threads read neighbouring elements):

    B[y, x, f, n] = sum over ry, rx, c of Apad[y + ry, x + rx, c, n] * W[ry, rx, c, f]

--small: batch 32, a 6 x 6 image, 16 -> 32 channels, with tiles scaled down (what CI runs, on the CPU, and
whose CUDA kernel it compiles with NVRTC); --cpu: the CPU only. With a GPU the CUDA kernel runs too, timed
with CUDA events (median of 20 runs after warm-up). Both check against numpy (float64).

Where the schedule differs from TVM's, and why (each in one place below):
- The thread tile is TVM's: per virtual thread a 4 x 4 block (f = vy*32 + ty*4 + fi), so a thread owns
  f in {4ty .. 4ty + 3} and {32 + 4ty .. 32 + 4ty + 3}; TVM gives each virtual thread its own copy of the
  register tile, loopir's cache_write compacts the twice-strided tile into one 8 x 8 register tile.
- TVM moves the channel loop rco outside ry, rx (reduce axes reordered among themselves); loopir's checker
  refuses reordering a floating-point reduction (the sum would be rounded in another order), so the tiles
  are staged at rco inside ry, rx: the same number of tiles of the same size.
- TVM vectorizes the innermost copy loop; loopir copies the innermost loop of a bound copy by 16-byte chunks
  by itself where the alignment allows (not for the padded A, whose copy is clipped at the image border).
- AL and WL (register copies of the shared tiles) are left out: the unrolled 8 x 8 tile reads each shared
  value once per k already, and cache_read's register copy of a twice-strided tile would be its bounding box.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from codegen import build
from loopir import te
from schedules import Schedule

import schedules.primitives.cache  # noqa: F401  (registers s.cache_read)
import schedules.primitives.cache_write  # noqa: F401  (registers s.cache_write)

FULL = dict(batch=256, size=14, cin=256, cout=512)
SMALL = dict(batch=32, size=6, cin=16, cout=32)
# TVM's tiles: a block computes 64 x 64 (f x n) with 8 x 8 threads, 2 x 2 virtual threads, 8 channels per tile
FULL_TILES = dict(block=64, threads=8, vthread=2, step=8)
SMALL_TILES = dict(block=16, threads=4, vthread=2, step=4)
# TVM's tutorial prints its own measured time on the machine that built its docs; no published figure for this
# tutorial (with the GPU named) was found, so none is printed beside ours (see the report of issue 20)
TVM_PUBLISHED_MS: float | None = None


def conv(batch: int, size: int, cin: int, cout: int, kernel: int = 3, pad: int = 1):
    """The convolution in HWCN layout; the padding is a `where` inlined into B (TVM's Apad, compute_inline)."""
    A = te.placeholder((size, size, cin, batch), name="A")
    W = te.placeholder((kernel, kernel, cin, cout), name="W")
    out = size + 2 * pad - kernel + 1
    ry = te.reduce_axis(kernel, name="ry")
    rx = te.reduce_axis(kernel, name="rx")
    rc = te.reduce_axis(cin, name="rc")

    def apad(y, x, c, n):  # noqa: ANN001, ANN202
        return te.where((y >= 0) & (y < size) & (x >= 0) & (x < size), A[y, x, c, n], 0.0)

    B = te.compute((out, out, cout, batch), lambda yy, xx, ff, nn: te.sum(
        apad(yy + ry - pad, xx + rx - pad, rc, nn) * W[ry, rx, rc, ff], axis=[ry, rx, rc]), name="B")
    return A, W, B


def reference(a: np.ndarray, w: np.ndarray, pad: int = 1) -> np.ndarray:
    k = w.shape[0]
    ap = np.pad(a.astype(np.float64), ((pad, pad), (pad, pad), (0, 0), (0, 0)))
    size = a.shape[0] + 2 * pad - k + 1
    out = np.zeros((size, size, w.shape[3], a.shape[3]))
    for ry in range(k):
        for rx in range(k):
            out += np.einsum("yxcn,cf->yxfn", ap[ry:ry + size, rx:rx + size], w[ry, rx].astype(np.float64),
                             optimize=True)
    return out


def gpu_schedule(s: Schedule, block: int, threads: int, vthread: int, step: int) -> None:
    yy, xx, ff, nn, ry, rx, rc = s.loops("B")
    bz = s.collapse(yy, xx)                      # TVM: fuse(hi, wi) — one block row per output pixel
    by, fi = s.split(ff, block)                  # a block computes block x block of (f, n)
    bx, ni = s.split(nn, block)
    tyz, fi = s.split(fi, nparts=vthread)        # 2 x 2 virtual threads, each a quarter of the block tile
    txz, ni = s.split(ni, nparts=vthread)
    ty, fi = s.split(fi, nparts=threads)         # threads x threads threads, each a 4 x 4 block of a quarter
    tx, ni = s.split(ni, nparts=threads)
    s.reorder(bz, by, bx, tyz, txz, ty, tx, fi, ni)
    s.bind(bz, "blockIdx.z").bind(by, "blockIdx.y").bind(bx, "blockIdx.x")
    s.bind(tyz, "vthread").bind(txz, "vthread")  # run serially inside each thread (moved inside ty, tx below)
    s.bind(ty, "threadIdx.y").bind(tx, "threadIdx.x")
    s.cache_write("B", "local", tx)              # TVM's BL: the thread's 8 x 8 outputs in registers
    vy, vx, fi, ni, ry, rx, rc = s.loops("B")[-7:]
    rco, rci = s.split(rc, step)
    s.reorder(ry, rx, rco, rci, vy, vx, fi, ni)  # every k step updates the whole register tile
    for t in ("A", "W"):                         # TVM's AA, WW: the block's tiles of A (padded) and W, copied by
        cache = s.cache_read(t, "shared", rco)   # the block's threads as bound: channel rows over threadIdx.y,
        _, _, c, n = s.loops(cache.name)[-4:]    # columns over threadIdx.x
        cty, c = s.split(c, nparts=threads)
        if t == "W":                             # TVM's way: a thread copies a run of 8 columns, by 16-byte chunks
            ctx, n = s.split(n, nparts=threads)
        else:                                    # A's copy is clipped at the image border (no 16-byte chunks):
            n, ctx = s.split(n, factor=threads)  # neighbouring threads take neighbouring columns (coalesced)
        s.reorder(cty, ctx, c, n)
        s.bind(cty, "threadIdx.y").bind(ctx, "threadIdx.x")
    for lp in s.loops("B")[-2:]:
        s.unroll(lp)
    for lp in s.loops("B_init")[-2:]:
        s.unroll(lp)


def cpu_schedule(s: Schedule) -> None:
    yy, xx, ff, nn, ry, rx, rc = s.loops("B")
    bz = s.collapse(yy, xx)
    fo, fi = s.split(ff, 4)
    no, ni = s.split(nn, 16)
    s.reorder(bz, fo, no, fi, ni)
    s.parallel(bz)                               # output pixels over the cores
    s.cache_write("B", "local", no)              # a 4 x 16 tile of sums in registers
    fi, ni, ry, rx, rc = s.loops("B")[-5:]
    s.reorder(ry, rx, rc, fi, ni)
    s.unroll(fi)
    s.vectorize(ni)                              # 16 batch elements per SIMD step


def flops(batch: int, size: int, cin: int, cout: int, kernel: int = 3) -> float:
    return 2.0 * size * size * cout * batch * cin * kernel * kernel


def run(small: bool, cpu_only: bool) -> None:
    sizes = SMALL if small else FULL
    tiles = SMALL_TILES if small else FULL_TILES
    rng = np.random.default_rng(0)
    A, W, B = conv(**sizes)
    a = rng.uniform(size=[int(d.value) for d in A.shape]).astype(np.float32)
    w = rng.uniform(size=[int(d.value) for d in W.shape]).astype(np.float32)
    want = reference(a, w)
    gflop = flops(**sizes) / 1e9
    targets = ["cpu"]
    if not cpu_only:
        try:
            from codegen import gpu_available

            if gpu_available():
                targets.append("cuda")
        except Exception:  # noqa: BLE001 - no GPU stack: CPU only
            pass
    if "cuda" not in targets:
        targets.append("cuda-source")
    for target in targets:
        A, W, B = conv(**sizes)
        s = Schedule(B)
        if target == "cpu":
            cpu_schedule(s)
        else:
            gpu_schedule(s, **tiles)
        t0 = time.perf_counter()
        mod = build(s, [A, W, B], target="cpu" if target == "cpu" else "cuda")
        print(f"--- {target}: built in {time.perf_counter() - t0:.1f} s, kernels {mod.kernels}")
        if target == "cuda-source":
            print(s)
            print(mod.source[mod.source.index("extern"):][:3000])
            continue
        out = np.full(want.shape, np.nan, np.float32)
        mod(a, w, out)
        err = float(np.abs(out - want).max() / np.abs(want).max())
        if not err < 1e-4:
            print(f"{target}: MISMATCH, relative error {err:.2e}")
            sys.exit(1)
        if target == "cuda":
            ms = mod.benchmark(a, w, out)
        else:
            times = []
            for _ in range(1 if not small else 5):
                t0 = time.perf_counter()
                mod(a, w, out)
                times.append(time.perf_counter() - t0)
            ms = 1e3 * float(np.median(times))
        line = f"{target}: Convolution: {ms:.3f} ms ({1e3 * gflop / ms:.1f} GFLOP/s), relative error {err:.2e}"
        if target == "cuda" and not small:
            line += ("; TVM's tutorial: " + (f"{TVM_PUBLISHED_MS} ms" if TVM_PUBLISHED_MS is not None
                                              else "no published figure found (run TVM's tutorial on this GPU)"))
        print(line)
        if target == "cuda":
            peer = torch_conv_ms(a, w, want)
            if peer is not None:
                print(f"cuda: PyTorch conv2d (cuDNN, float32, TF32 off, NCHW): {peer:.3f} ms "
                      f"({1e3 * gflop / peer:.1f} GFLOP/s); ours / cuDNN = {ms / peer:.2f}x")


def torch_conv_ms(a: np.ndarray, w: np.ndarray, want: np.ndarray, reps: int = 20) -> float | None:
    """The same convolution in PyTorch (cuDNN) on this GPU, median of `reps` CUDA-event timings; None without
    torch. The peer measured in the same run, since TVM's tutorial publishes no figure for a named GPU."""
    try:
        import torch
    except ImportError:
        return None
    torch.backends.cudnn.allow_tf32 = False  # float32 arithmetic, as ours
    torch.backends.cudnn.benchmark = True
    x = torch.from_numpy(np.ascontiguousarray(a.transpose(3, 2, 0, 1))).cuda()  # HWCN -> NCHW
    k = torch.from_numpy(np.ascontiguousarray(w.transpose(3, 2, 0, 1))).cuda()  # (ky, kx, ci, co) -> (co, ci, ky, kx)
    y = torch.nn.functional.conv2d(x, k, padding=1)
    got = y.permute(2, 3, 1, 0).cpu().numpy()  # NCHW -> HWCN
    if not float(np.abs(got - want).max() / np.abs(want).max()) < 1e-4:
        print("cuda: PyTorch conv2d does not match the reference; not timed")
        return None
    times = []
    for _ in range(reps + 3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.nn.functional.conv2d(x, k, padding=1)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return float(np.median(times[3:]))


if __name__ == "__main__":
    run(small="--small" in sys.argv, cpu_only="--cpu" in sys.argv)
