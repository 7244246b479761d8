"""The tensor-core GEMM on the GPU (mma.sync m16n8k16, float16/bfloat16 inputs, float32 accumulate) as checked steps.

    plan = schedule_gemm_mma(s, "matmul", epilogue="auto", block=(128, 128), warp=(64, 64), k_tile=32)

The nest it produces for C = relu(A @ B + bias) (one kernel; a warp computes a warp[0] x warp[1] tile as a grid
of 16 x 8 accumulator fragments, lane l owning rows l//4 + 8*eh and columns 2*(l%4) + el of each):

    for bi in blockIdx.y, bj in blockIdx.x:
      for wi in threadIdx.z, wj in threadIdx.y, lane in threadIdx.x (32):
        allocate C_local local                                   # cache_write: the lane's fragments
        for ko:                                                  # k in steps of k_tile (cp.async double buffered)
          A_shared <- A[bi*128 : +128, ko*k_tile : +k_tile];  B_shared <- B[ko*k_tile : +k_tile, bj*128 : +128]
          barrier
          for kk, mi, ni (unrolled):
            for eh in mma.m16n8k16(0, 2): for el, k16:          # tensorize: ldmatrix + mma.sync on CUDA
              C_local[..] += A_shared[.. + lane//4 + 8*eh, kk*16 + k16] * B_shared[kk*16 + k16, .. + 2*(lane%4) + el]
          barrier
        C[..] = relu(C_local[..] + bias[..])                     # the epilogue on the fragments, one store

Batch loops around (i, j, k) (a linear layer over (B, T, C) activations, B and T symbolic: batch b, rows t) are
collapsed into blockIdx.z; the shared tiles then carry a leading batch dimension of extent 1, which tensorize
accepts. Every step is a Schedule primitive; `tensorize` checks that the innermost nest is exactly the instruction's
fragment layout. A reduction length that k_tile does not divide (or a symbolic one) is refused: the k
loop would need a guard inside the instruction's nest. Rows and columns the tiles do not divide (or symbolic
ones) are fine: the update keeps its element guard, the epilogue's store is guarded, the copies are clipped.

Float32 operands take the same nest, tensorized as "mma.m16n8k16.tf32x3": each 16 k of a fragment are two m16n8k8
TF32 steps of three products (A, B split x = hi + lo in registers: float32-class accuracy), B read by shared loads
(no ldmatrix transposes 32-bit words). H200, relu(A @ B + bias), cuBLAS's float32 GEMM (TF32 off) in the same run:
4096^3 2.23 ms = 62 TFLOP/s = 1.25x cuBLAS; 8192 x 3072 x 768 1.36x; 32768 x 768 x 3072 1.29x; error vs float64
8.8e-7 of the largest output (cuBLAS 2.5e-6). The SIMT recipe (schedule_gemm_cuda) got 0.78-0.84x cuBLAS there.

The CUDA pass `plan_mma` (codegen/passes/mma.py) then pads the shared tiles' rows for conflict-free ldmatrix
(A_shared[128, 40], B_shared[32, 136]), pipelines the k loop as a 4-stage ring of 16-byte cp.async copies
(dynamic shared memory: 74 KiB at 128 x 128) and has the renderer load each A / B fragment once per k step of
the warp's 4 x 8 instruction grid (B two fragments per ldmatrix.x4.trans).

Measured (H200, same run as cuBLAS through torch; benchmarks/gpu_gemm.py --mma has the table), float16 /
bfloat16: 4096^3 0.46-0.49 ms = 280-297 TFLOP/s = 0.52-0.56 x cuBLAS (before plan_mma: 45 TFLOP/s, 0.11 x);
symbolic rows and columns at 4096^3 the same (292 TFLOP/s); 4000^3 0.70-0.72 ms, 0.36-0.39 x (warp tile
64 x 32: 0.58-0.60 ms, 0.42-0.45 x); 2048^3 0.72-0.77 x; 1024^3 0.89-0.95 x. Relative error vs float64
3.8e-4 (float16), 3.0e-3 (bfloat16). On Hopper, plain 2-d matmuls now take the warpgroup recipe instead
(gemm_wgmma.py: wgmma + TMA behind the same tensorize interface, 0.9-1.0 x cuBLAS); this one stays for batched
matmuls, rows that are not 16-byte aligned for TMA, and `gemm={"wgmma": False}`.
"""

from __future__ import annotations

from typing import Any

from loopir.errors import ArgumentError
from loopir.nodes import Load
from loopir.visit import statements

import schedules.primitives.cache  # noqa: F401  (registers Schedule.cache_read)
import schedules.primitives.cache_write  # noqa: F401  (registers Schedule.cache_write)
import schedules.primitives.tensorize  # noqa: F401  (registers Schedule.tensorize)
from schedules.primitives.tensorize import MMA_SHAPES, MMA_TF32, half_load, mma_kind

from .gemm import GemmPlan, collapse_batch, resolve_stage, split_k_gemm

__all__ = ["schedule_gemm_mma", "mma_applicable", "MMA_TILES", "MMA_TILES_TF32", "MMA_TILES_TF32_SMALL", "mma_tiles",
           "check_mma_tiles", "mma_dtype"]


# the tile shape measured fastest on an H200 with the 4-stage cp.async ring and fragment reuse (4096^3 float16:
# 128x128/64x64 293 TFLOP/s, 128x128/64x32 272, 128x256/64x64 240, 256x128/64x64 179)
MMA_TILES = {"block": (128, 128), "warp": (64, 64), "k_tile": 32}


# float32 operands (mma.m16n8k16.tf32x3), measured on an H200 (benchmarks/RESULTS_gemm.md, 4096^3 and the MLP's
# 8192 x 3072 x 768 / 8192 x 768 x 3072): 64x128/32x64 k 32 the fastest on the MLP shapes and within 5% of the best at
# 4096^3; a 64 x 64 warp tile spills (255 registers: A and B split in hi and lo beside 128 accumulators)
MMA_TILES_TF32 = {"block": (64, 128), "warp": (32, 64), "k_tile": 32}


# float32 grids of fewer blocks than two per SM at 64 x 128 (1024^3: 128 blocks on 132 SMs) take 32 x 128 tiles (twice
# the blocks): H200, 1024^3 0.057 -> 0.049 ms, 1024 x 768 x 3072 0.153 -> 0.123, 64 x 4096 x 4096 0.202 -> 0.097;
# at 2048^3 (512 blocks) 64 x 128 stays the faster (0.296 vs 0.322 ms)
MMA_TILES_TF32_SMALL = {"block": (32, 128), "warp": (32, 32), "k_tile": 32}


def mma_tiles(dtype: str, given: dict | None = None, grid: tuple[int | None, ...] | None = None,
              sms: int = 132) -> dict:
    """The tiles of the recipe for operands of `dtype`: `given` (gemm's "mma"), else the dtype's defaults (MMA_TILES
    given as they are count as not chosen: gemm_params fills them in). `grid`: (batches, rows, columns) where known,
    for float32 on a device of `sms` multiprocessors (MMA_TILES_TF32_SMALL when 64 x 128 tiles make fewer than two
    blocks per SM)."""
    if given and given != MMA_TILES:
        return given
    if dtype != "float32":
        return MMA_TILES
    if grid is not None and None not in grid:
        b, r, c = grid
        if b * -(-r // 64) * -(-c // 128) < 2 * sms:  # type: ignore[operator]
            return MMA_TILES_TF32_SMALL
    return MMA_TILES_TF32


def check_mma_tiles(block: tuple[int, int], warp: tuple[int, int], k_tile: int) -> None:
    ok = (isinstance(block, tuple) and isinstance(warp, tuple) and len(block) == len(warp) == 2
          and all(isinstance(x, int) and x > 0 for x in (*block, *warp, k_tile))
          and block[0] % warp[0] == 0 and block[1] % warp[1] == 0 and warp[0] % 16 == 0 and warp[1] % 8 == 0
          and k_tile % 16 == 0)
    if not ok:
        raise ArgumentError(f"schedule_gemm_mma: block {block}, warp {warp}, k_tile {k_tile}: the block must be a "
                            "multiple of the warp tile, the warp tile of 16 x 8, k_tile of 16")


def mma_applicable(program: Any, stage: str | None = None) -> str | None:
    """None when the matmul-shaped reduction of `program` can run on tensor cores; else the reason why not
    (inputs not both float16, both bfloat16 or both float32: mma.m16n8k16.tf32x3)."""
    upd, _ = resolve_stage(program, stage, [], "schedule_gemm_mma")
    ops = [half_load(x) for x in (upd.value.b.a, upd.value.b.b)]  # type: ignore[attr-defined]
    dts = {getattr(getattr(x, "buffer", None), "dtype", None) for x in ops}
    if len(dts) != 1 or dts.isdisjoint({"float16", "bfloat16", "float32"}):
        return f"inputs are {sorted(map(str, dts))}, not both float16, both bfloat16 or both float32"
    # ldmatrix reads A row-major (rows i, reduction k) and B k-major (k, columns j); batch indices lead both
    *batch, i, j, k = upd.iters
    a, b = ops
    if not (isinstance(a, Load) and isinstance(b, Load) and tuple(a.indices[-2:]) == (i, k)
            and tuple(b.indices[-2:]) == (k, j) and all(x in batch for x in (*a.indices[:-2], *b.indices[:-2]))):
        return (f"operands read {a} and {b}: tensor cores take A[.., i, k] * B[.., k, j] (a transposed operand, "
                "e.g. Q K^T, is not staged transposed yet)")
    return None


def mma_dtype(program: Any, stage: str | None = None) -> str:
    """The operand type of the matmul-shaped reduction `stage` (float16, bfloat16 or float32 under the casts)."""
    upd, _ = resolve_stage(program, stage, [], "schedule_gemm_mma")
    return str(getattr(getattr(half_load(upd.value.b.a), "buffer", None), "dtype", ""))  # type: ignore[attr-defined]


def schedule_gemm_mma(s: Any, stage: str | Any = None, epilogue: Any = "auto", block: tuple[int, int] = (128, 128),
                      warp: tuple[int, int] = (64, 64), k_tile: int = 32, split_k: int | None = None) -> GemmPlan:
    """Apply the tensor-core GEMM recipe to the matmul-shaped reduction `stage` of Schedule `s` (float16 or
    bfloat16 inputs; float32 inputs run as three TF32 products each, mma.m16n8k16.tf32x3). `epilogue` as in
    schedule_gemm_cuda. Returns a GemmPlan; `s` is modified in place.
    TensorizeError (an ArgumentError) when the instruction does not fit (dtypes, layout)."""
    block, warp = tuple(block), tuple(warp)  # type: ignore[assignment]
    check_mma_tiles(block, warp, k_tile)  # type: ignore[arg-type]
    upd, eps = resolve_stage(s.program, stage, epilogue, "schedule_gemm_mma")
    if split_k:  # split-K (gemm.split_k_gemm): each chunk of the reduction this recipe, on blockIdx.z (0: none)
        return split_k_gemm(s, upd, eps, split_k, k_tile, lambda part: schedule_gemm_mma(
            s, part, [], block=block, warp=warp, k_tile=k_tile), "schedule_gemm_mma")
    plan = GemmPlan(upd.name, list(eps), "cuda (tensor cores)")
    name = upd.name
    batch = collapse_batch(s, name, "schedule_gemm_mma")
    i, j, k = s.loops(name)[-3:]
    bi, ir = s.split(i, block[0])
    wi, ir = s.split(ir, warp[0])
    mi, r16 = s.split(ir, 16)
    eh, r8 = s.split(r16, 8)
    bj, jr = s.split(j, block[1])
    wj, jr = s.split(jr, warp[1])
    ni, c8 = s.split(jr, 8)
    c4, el = s.split(c8, 2)
    s.reorder(bi, bj, wi, wj, r8, c4, mi, ni, eh, el)
    # the register tile first (cache_write's analysis is exact on plain split loops; after the collapse into
    # lanes its isl sets carry floordiv/mod and take minutes at 512^3), then the 32 lanes
    s.cache_write(upd.buffer.name, "local", c4, epilogue=eps)
    plan.steps.append(f"cache_write({upd.buffer.name}, 'local', c4, epilogue={eps}): "
                      f"{warp[0] * warp[1] // 32} accumulators per lane")
    lane = s.collapse(r8, c4)
    plan.steps.append(f"split i by {block[0]}/{warp[0]}/16/8 and j by {block[1]}/{warp[1]}/8/2; collapse the "
                      "row-in-8 and column-pair loops into 32 lanes (the m16n8k16 accumulator layout)")
    s.bind(bi, "blockIdx.y").bind(bj, "blockIdx.x").bind(wi, "threadIdx.z").bind(wj, "threadIdx.y")
    s.bind(lane, "threadIdx.x")
    if batch is not None:  # the shared tiles then carry a leading batch dimension of extent 1
        s.bind(batch, "blockIdx.z")
        plan.steps.append("collapse the batch loops into blockIdx.z")
    nw = (block[0] // warp[0]) * (block[1] // warp[1])
    plan.steps.append(f"bind blocks to blockIdx.y/x, {nw} warps to threadIdx.z/y, lanes to threadIdx.x")
    mi, ni, eh, el, k = s.loops(name)[-5:]
    kind = mma_kind(half_load(upd.value.b.a).buffer.dtype)  # type: ignore[attr-defined]
    kx = MMA_SHAPES[kind][2]
    ko, kr = s.split(k, k_tile)
    kk, k16 = s.split(kr, kx)
    s.reorder(ko, kk, mi, ni, eh, el, k16)
    for ld, need in zip((half_load(upd.value.b.a), half_load(upd.value.b.b)),  # type: ignore[attr-defined]
                        ((block[0], k_tile), (k_tile, block[1]))):
        tile = s.cache_read(ld.buffer.name, "shared", ko)
        # memory safety: an instruction reads whole fragments, guards or not, so the shared tile must hold the
        # block's whole tile; the copied box is clipped to the matrix, which is smaller than one tile when a
        # dimension of known size is (16 rows under a 64-row block: ldmatrix read past the shared array)
        got = [getattr(d, "value", None) for d in tile.shape[-2:]]
        if any(g is not None and g < n for g, n in zip(got, need)):
            raise ArgumentError(
                f"schedule_gemm_mma: the shared tile of {ld.buffer.name!r} is {got[0]} x {got[1]}, smaller than the "
                f"{need[0]} x {need[1]} tile the tensor-core fragments read (block {block}, k_tile {k_tile}): "
                f"{ld.buffer.name} has fewer rows or columns than one tile; take tiles no larger than the matrix "
                "(rows and columns of the block multiples of 16 and 8) or the SIMT recipe (gemm tensor_cores=False)")
        plan.staged.append(ld.buffer.name)
    plan.steps.append(f"split k by {k_tile}/{kx}; cache_read A and B 'shared' at ko "
                      "(cp.async pipelined by the CUDA passes)")
    s.tensorize(eh, kind)
    plan.steps.append(f"tensorize(eh, {kind!r}): each 16x8x16 fragment update is " + (
        "three TF32 tensor-core instructions per 8 k on the operands split hi + lo (ldmatrix / shared loads + "
        "mma.sync m16n8k8, float32 accumulate: float32-class accuracy)" if kind == MMA_TF32 else
        "one tensor-core instruction (ldmatrix from shared memory + mma.sync, float32 accumulate)"))
    for lp in (kk, mi, ni):
        s.unroll(lp)
    for st in [c.store.name for c in statements(s.program)
               if c.store.buffer.name == f"{upd.buffer.name}_local" and c.store.name != name]:
        for lp in s.loops(st)[-4:]:
            if lp.name not in (lane.name,):
                s.unroll(lp)
    for st in eps or [f"{upd.buffer.name}_copy"]:
        if any(c.store.name == st for c in statements(s.program)):
            for lp in s.loops(st)[-2:]:
                s.unroll(lp)
    plan.steps.append("unroll kk, mi, ni, the accumulator init and the epilogue")
    return plan
