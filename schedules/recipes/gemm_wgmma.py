"""The GEMM on Hopper's warpgroup tensor cores (wgmma, sm_90a), float16/bfloat16 inputs, float32 accumulate.

    plan = schedule_gemm_wgmma(s, "matmul", epilogue="auto", block=(128, 256))

The nest it produces for C = relu(A @ B + bias) (one kernel; the marked tile is rendered by codegen/cuda/wgmma.py
as a block of block[0] / 64 warpgroups streaming 64-wide k tiles of A and B through swizzled shared stages into
wgmma.mma_async, the epilogue applied to the float32 accumulators before the one store):

    for bi in blockIdx.y, bj in blockIdx.x:
      for ii in gemm.wgmma(0, 128):                       # tensorize: the block's tile is one kernel body
        for jj in range(0, 256):
          allocate C_local[1, 1] local                    # cache_write: the accumulator (registers)
            if <edge guards>:
              C_local = 0
              for k: C_local += A[bi*128 + ii, k] * B[k, bj*256 + jj]
            C[bi*128 + ii, bj*256 + jj] = relu(C_local + bias[bj*256 + jj])    # the epilogue, guarded

A linear layer over (B, T, C) activations, X[b, t, k] @ W[k, j]: auto_schedule collapses b into the rows first
where the collapse is checkable (T a constant) and every access of the matmul and its epilogue reads (b, t) as its
leading indices: one (B*T) x K matrix, tiles across batches, the addresses `(f // T) * T + f % T` folded back to
`f` (loopir.affine.row_major, fold_divmod); otherwise (a symbolic T) the batch loop stays and goes on blockIdx.z
(each batch its own row tiles, the last one guarded at T).

Every step is a Schedule primitive; tensorize checks the tile (schedules/primitives/wgmma.py: rows and columns
16-byte aligned, A read along k, B along the columns). Rows, columns and reductions the tiles do not divide (or
symbolic ones) are fine: the copies zero-fill past the guards and the epilogue's store is guarded.

The renderer prints one of two kernels for the marked tile: where the kernel is the tile alone (a batch loop on
blockIdx.z included), B is 2-d, A is 2-d or read as its 2-d view, and the reduction covers their whole rows (codegen
passes: `tma_plan`), TMA loads by a producer warpgroup into a ring of swizzled stages, two consumer warpgroups, a
persistent grid of at most 132 blocks walking the tiles in grouped order; else (64-row tiles, a reduction over part
of a row) every thread copies with cp.async.

Measured (H200, through `build(outputs, args)`, same run as cuBLAS through torch; benchmarks/RESULTS_gemm_half.md):
4096^3 float16 0.207 ms = 664 TFLOP/s = 1.00 x cuBLAS's matmul alone (bfloat16 0.92 x), 8192^3 0.95-1.00 x,
4000^3 0.81-0.87 x, symbolic sizes within 3-10 % of fixed ones; relative error vs float64 3.8e-4 (float16),
3.0e-3 (bfloat16).
"""

from __future__ import annotations

from typing import Any

from loopir.errors import ArgumentError

import schedules.primitives.cache_write  # noqa: F401  (registers Schedule.cache_write)
import schedules.primitives.tensorize  # noqa: F401  (registers Schedule.tensorize)
from schedules.primitives.wgmma import BLOCK_COLS, BLOCK_ROWS, PERSISTENT_BLOCKS, WGMMA

from .gemm import GemmPlan, collapse_batch, resolve_stage

__all__ = ["schedule_gemm_wgmma", "WGMMA_TILES", "check_wgmma_tiles", "tile_cols"]

# measured fastest on an H200 (4096^3 float16, cp.async ring of 4 stages): 128x256 401 TFLOP/s, 128x128 324,
# 128x192 324 (benchmarks/RESULTS_wgmma.md)
WGMMA_TILES = {"block": (128, 256)}


def check_wgmma_tiles(block: tuple[int, int]) -> None:
    if not (isinstance(block, tuple) and len(block) == 2 and block[0] in BLOCK_ROWS and block[1] in BLOCK_COLS):
        raise ArgumentError(f"schedule_gemm_wgmma: block {block!r}: rows must be one of {BLOCK_ROWS} (a warpgroup "
                            f"per 64), columns one of {BLOCK_COLS}")


def schedule_gemm_wgmma(s: Any, stage: str | Any = None, epilogue: Any = "auto",
                        block: tuple[int, int] = (128, 256)) -> GemmPlan:
    """Apply the warpgroup tensor-core GEMM recipe to the matmul-shaped reduction `stage` of Schedule `s` (float16
    or bfloat16 inputs): a plain (i, j, k) matmul, or one with batch loops around it (b, i, j, k), collapsed into
    one (`collapse_batch`: inner batch extents constant) that goes on blockIdx.z (a linear layer over (B, T, C)
    activations whose batch loop was not collapsed into its rows; a weight read at b runs too, in the cp.async form:
    TMA takes a 2-d B only). `epilogue` as in schedule_gemm_cuda. Returns a GemmPlan; `s` is modified in place.
    ArgumentError naming the batch loops when they cannot be collapsed; TensorizeError (an ArgumentError) when the
    tile does not fit the instruction (dtypes, layout, alignment: the message names the part)."""
    block = tuple(block)  # type: ignore[assignment]
    check_wgmma_tiles(block)
    upd, eps = resolve_stage(s.program, stage, epilogue, "schedule_gemm_wgmma")
    plan = GemmPlan(upd.name, list(eps), "cuda (warpgroup tensor cores, sm_90a)")
    batch = collapse_batch(s, upd.name, "schedule_gemm_wgmma")
    i, j, _ = s.loops(upd.name)[-3:]
    bi, ii = s.split(i, block[0])
    bj, jj = s.split(j, block[1])
    s.reorder(bi, bj, ii, jj)
    s.bind(bi, "blockIdx.y").bind(bj, "blockIdx.x")
    plan.steps.append(f"split i by {block[0]} and j by {block[1]}; bind the tiles to blockIdx.y/x")
    if batch is not None:
        s.bind(batch, "blockIdx.z")
        plan.steps.append(f"bind the batch loop {batch.name} to blockIdx.z (each batch its own row tiles)")
    s.cache_write(upd.buffer.name, "local", jj, epilogue=eps)
    plan.steps.append(f"cache_write({upd.buffer.name}, 'local', {jj.name}, epilogue={eps}): the accumulator in "
                      "registers, the epilogue on it before the one store")
    s.tensorize(ii, WGMMA)
    plan.steps.append(f"tensorize({ii.name}, '{WGMMA}'): the tile as one kernel body, {block[0] // 64} warpgroups "
                      f"of wgmma.mma_async m64n{block[1]}k16 fed by a cp.async ring of 128-byte-swizzled stages")
    return plan


def tile_cols(rows: int, cols: int, batches: int, r: int) -> int:
    """The columns of the persistent kernel's tile: its time is the rounds of tiles its blocks walk times a tile's
    time (proportional to its columns), so the width whose tiles fill the last round best wins, the widest of
    equals (fewer tiles, less overhead per tile). H200, float16, relu(A @ B + bias), ms at 128 x 256 / 192 / 128:
    8192 x 768 x 768 (A's rows, B's columns, k) 0.034 / 0.027 / 0.046, 8192 x 768 x 3072 0.080 / 0.067 / 0.066,
    4096 x 4096 x 1024 0.074 / 0.094 / 0.074, 8192 x 3072 x 768 0.090 / 0.089 / 0.091: the rounds x columns of
    this rule order them but for the noise of the last. Fewer 128 x 256 tiles than multiprocessors: 128 columns
    (measured earlier: more of them busy)."""
    def tiles(c: int) -> int:
        return batches * -(-rows // r) * -(-cols // c)

    if tiles(256) < PERSISTENT_BLOCKS:
        return 128
    return min((256, 192, 128), key=lambda c: (-(-tiles(c) // PERSISTENT_BLOCKS) * c, -c))
