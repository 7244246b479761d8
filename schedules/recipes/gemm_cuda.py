"""The tiled GEMM on the GPU as a sequence of checked Schedule steps (tile sizes are the tuning handle).

    plan = schedule_gemm_cuda(s, "matmul", epilogue="auto", block=(64, 128), thread_tile=(8, 8), k_tile=16)

The nest it produces for C = relu(A @ B + bias) (one kernel):

    for bi in blockIdx.y, bj in blockIdx.x:               # a block computes a block[0] x block[1] tile of C
      for ty in threadIdx.y, tx in threadIdx.x:           # (block / thread_tile) threads, each a thread_tile
        allocate C_local[8, 8] local                      # 1. cache_write: the register tile
        C_local[:, :] = 0                                 #    (unrolled)
        for ko:                                           # 2. k in steps of k_tile
          allocate A_shared[128, k_tile], B_shared[k_tile, 128] shared
          A_shared <- A[bi*128 : +128, ko*k_tile : +k_tile]   # 3. cache_read "shared": the BLOCK's tile, copied
          B_shared <- B[ko*k_tile : +k_tile, bj*128 : +128]   #    cooperatively (float4 where aligned)
          barrier
          for ki, ii, jj (unrolled): C_local[ii, jj] += A_shared[ii*16 + ty, ki] * B_shared[ki, jj*16 + tx]
          barrier                                         #    before the next iteration overwrites the tiles
        for q0, q1 (unrolled): C[..] = relu(C_local[q0, q1] + bias[..])   # 4. the epilogue on the register tile

A thread's rows are ty, ty + 16, ...: a warp's reads of B_shared and its final stores touch consecutive
addresses, and its reads of A_shared are broadcasts. Sizes the tiles do not divide keep guards (the
shared tiles are the constant box hull, their copy clipped to the matrices); sizes known at build time
that divide give a guard-free kernel. Every step is a Schedule primitive, checked as usual. The CUDA
target then copies tile ko+1 with cp.async into a second shared stage while tile ko is computed on
(codegen/cuda/kernel.py `pipelined`), and uses 32-bit indices when every size is known and small enough.
"""

from __future__ import annotations

from typing import Any

from loopir.visit import statements

import schedules.primitives.cache  # noqa: F401  (registers Schedule.cache_read)
import schedules.primitives.cache_write  # noqa: F401  (registers Schedule.cache_write)

from .gemm import GemmPlan, check_tiles, collapse_batch, matmul_operands, resolve_stage, split_k_gemm

__all__ = ["SKINNY_ROWS", "gemm_resources", "schedule_gemm_cuda", "skinny_params", "split_k_chunks"]


def schedule_gemm_cuda(s: Any, stage: str | Any = None, epilogue: Any = "auto", block: tuple[int, int] = (64, 128),
                       thread_tile: tuple[int, int] = (8, 8), k_tile: int = 16, shared: bool = True,
                       strided: bool = False, unroll_k: bool = True, split_k: int | None = None) -> GemmPlan:
    """Apply the tiled-GEMM recipe for the CUDA target to the matmul-shaped reduction `stage` of Schedule `s`.

    `stage`: the update statement's name (or tensor); None picks the only matmul-shaped one.
    `epilogue`: elementwise consumers computed on the register tile before the single store ("auto":
    the chain `elementwise_consumers` finds; [] for none). `shared=False` skips the shared staging.
    `strided=False`: a thread owns thread_tile consecutive rows and columns (ty*8 + ii, tx*8 + jj), so
    its reads of a shared row are contiguous (128-bit shared loads); True: rows ty + 16*ii, columns
    tx + 16*jj (conflict-free scalar shared loads, coalesced stores). `unroll_k=False` leaves
    the k_tile loop to the compiler (fewer registers; slower as measured on an H200).
    `split_k=F` (a multiple of k_tile; 0 or None: none): split-K, for GEMMs with too few tiles of C to fill the
    GPU (skinny M); see `gemm.split_k_gemm`.
    Returns a GemmPlan (`.explain()`); `s` is modified in place. ValueError on bad tile sizes.
    """
    block = tuple(block) if isinstance(block, (list, tuple)) else block  # type: ignore[assignment]
    thread_tile = tuple(thread_tile) if isinstance(thread_tile, (list, tuple)) else thread_tile  # type: ignore[assignment]
    check_tiles(block, thread_tile, k_tile)  # type: ignore[arg-type]
    upd, eps = resolve_stage(s.program, stage, epilogue, "schedule_gemm_cuda")
    if split_k:  # 0 / None: no split
        tiles = dict(block=block, thread_tile=thread_tile, k_tile=k_tile, shared=shared, strided=strided,
                     unroll_k=unroll_k)
        return split_k_gemm(s, upd, eps, split_k, k_tile, lambda part: schedule_gemm_cuda(s, part, [], **tiles),
                            "schedule_gemm_cuda")
    plan = GemmPlan(upd.name, list(eps), "cuda")
    name = upd.name
    batch = collapse_batch(s, name, "schedule_gemm_cuda")
    i, j, k = s.loops(name)[-3:]
    nty, ntx = block[0] // thread_tile[0], block[1] // thread_tile[1]
    bi, ir = s.split(i, block[0])
    bj, jr = s.split(j, block[1])
    if strided:
        ii, ty = s.split(ir, nty)
        jj, tx = s.split(jr, ntx)
    else:
        ty, ii = s.split(ir, thread_tile[0])
        tx, jj = s.split(jr, thread_tile[1])
    s.reorder(bi, bj, ty, tx, ii, jj)
    plan.steps.append(f"split i by {block[0]}, j by {block[1]}; then into {nty} x {ntx} threads, each "
                      f"{'strided' if strided else 'contiguous'} {thread_tile[0]} x {thread_tile[1]}; "
                      "reorder(bi, bj, ty, tx, ii, jj)")
    s.bind(bi, "blockIdx.y").bind(bj, "blockIdx.x").bind(ty, "threadIdx.y").bind(tx, "threadIdx.x")
    plan.steps.append("bind bi, bj to blockIdx.y/x and ty, tx to threadIdx.y/x")
    if batch is not None:
        s.bind(batch, "blockIdx.z")
        plan.steps.append(f"bind the batch loop {batch.var.name} to blockIdx.z (batched GEMM)")
    s.cache_write(upd.buffer.name, "local", tx, epilogue=eps)
    plan.steps.append(f"cache_write({upd.buffer.name}, 'local', tx, epilogue={eps}): "
                      f"{thread_tile[0]}x{thread_tile[1]} register tile")
    ii, jj, k = s.loops(name)[-3:]
    ko, ki = s.split(k, k_tile)
    s.reorder(ko, ki, ii, jj)
    plan.steps.append(f"split k by {k_tile}; reorder(ko, ki, ii, jj)")
    if shared:
        for b in matmul_operands(upd):
            try:
                s.cache_read(b.name, "shared", ko)
            except (ValueError, TypeError) as e:  # staging is an optimisation: say why, keep going
                plan.skipped.append(f"cache_read({b.name}, 'shared', ko): {e}")
                continue
            plan.staged.append(b.name)
            plan.steps.append(f"cache_read({b.name}, 'shared', ko): the block's tile, copied cooperatively")
    # unrolling ki too: fastest measured (H200, 4096^3: 37.7 TFLOP/s at block 64 x 128, k_tile 16, vs 26.5 without;
    # see benchmarks/RESULTS_gemm.md); the CUDA target double-buffers the shared tiles with cp.async (two stages
    # of 2 x 12 KiB), and 32-bit indices keep it at ~245 registers: two blocks of 128 threads per SM
    _unroll_tail(s, name, 3 if unroll_k else 2, plan)
    for st in [c.store.name for c in statements(s.program)
               if c.store.buffer.name == f"{upd.buffer.name}_local" and c.store.name != name]:
        _unroll_tail(s, st, 2, plan)
    for st in eps or [f"{upd.buffer.name}_copy"]:
        if any(c.store.name == st for c in statements(s.program)):
            _unroll_tail(s, st, 2, plan)
    return plan


def _unroll_tail(s: Any, stmt: str, n: int, plan: GemmPlan) -> None:
    for lp in s.loops(stmt)[-n:]:
        s.unroll(lp)
    plan.steps.append(f"unroll the {n} innermost loops of {stmt}")


def gemm_resources(params: dict[str, Any], itemsize: int = 4) -> tuple[int, int, int]:
    """(threads per block, bytes of one stage of the shared A and B tiles, accumulator registers per thread)
    of the CUDA recipe with `params` (from `gemm_params`)."""
    (b0, b1), (t0, t1), kt = params["block"], params["thread_tile"], params["k_tile"]
    smem = (b0 * kt + kt * b1) * itemsize if params.get("shared", True) else 0
    return (b0 // t0) * (b1 // t1), smem, t0 * t1


SKINNY_ROWS = 64  # a GEMM with at most this many rows of C is skinny: its time is the bytes of B
# the tensor-core tiles of a skinny float16 / bfloat16 GEMM of at least 16 rows (gemm_mma), by rows: a block of
# 16, 32 or 64 rows (no more rows than the matrix: the fragments read whole tiles) x 64 columns
SKINNY_MMA_MIN_ROWS = 16


def skinny_params(rows: int, itemsize: int = 4, smem_limit: int = 48 * 1024, cols: int | None = None,
                  depth: int | None = None, sm_count: int = 132,
                  smem_per_sm: int = 227 * 1024, tensor_cores: bool = True) -> tuple[dict[str, Any], str] | None:
    """Tiles of the recipe for a skinny GEMM (rows of C <= SKINNY_ROWS), and why; None for other GEMMs.

    Its time is reading B (k x m) once, so a block covers every row (grid = column blocks: each element of B
    is read by one block) and 128 columns (a warp reads 512 contiguous bytes of each row of B), and the
    reduction is split into chunks (`split_k_chunks`: split-K) so that enough blocks stream B at once. Up to 4
    rows a thread keeps one column (rows x 1 tile); from 8 rows a rows/4 x 4 tile of 4 adjacent columns (one
    128-bit read of the shared B row per k): with a column per thread, reading A and B from shared memory bound
    the kernel. Half-precision inputs of 16 rows or more take the tensor cores (`tensor_cores`, `mma` tiles)
    unless `tensor_cores=False`.
    H200, relu(A @ B + bias) (benchmarks/gpu_gemm.py --split-sweep / --configs): 1 x 4096 x 4096 float32 0.091
    ms before split-K, 0.035 with 32-column blocks, 0.021 with 128 columns; 16 x 4096 x 4096 float32 0.038 ms
    with 4 x 1 tiles, 0.028 with 4 x 4; float16 16 rows 0.028 ms (SIMT) -> 0.018 (mma.sync, 16 x 64 blocks)."""
    if not (isinstance(rows, int) and 1 <= rows <= SKINNY_ROWS):
        return None
    b0 = 1 << (rows - 1).bit_length()
    t0, t1, b1 = (min(8, max(2, b0 // 4)), 4, 128) if b0 >= 8 else (b0, 1, 128)
    kt = next((k for k in (32, 16) if 2 * (b0 * k + k * b1) * itemsize <= smem_limit), 16)
    prm: dict[str, Any] = {"block": (b0, b1), "thread_tile": (t0, t1), "k_tile": kt}
    why = (f"skinny GEMM ({rows} rows <= {SKINNY_ROWS}): its time is streaming B once, so block {b0}x{b1} "
           f"covers every row (each element of B is read by one block), {b0 // t0}x{b1 // t1} threads each a "
           f"{t0}x{t1} tile, k_tile {kt}")
    if tensor_cores and itemsize == 2 and rows >= SKINNY_MMA_MIN_ROWS:
        r = max(x for x in (16, 32, 64) if x <= rows)
        prm["tensor_cores"] = True
        prm["mma"] = {"block": (r, 64), "warp": (min(r, 32), 32), "k_tile": 32}
        why += (f"; half-precision inputs: tensor cores (mma.sync) on {r}x64 blocks of {r // min(r, 32) * 2} warps "
                f"(the SIMT tiles where the tensor-core recipe does not apply)")
    chunks = split_k_chunks(rows, cols, depth, prm, itemsize, sm_count, smem_per_sm)
    if chunks is not None:
        n, chunk, fill = chunks
        prm["split_k"] = chunk
        why += (f"; split-K: {-(-cols // b1)} column blocks {fill}, so the reduction of {depth} is split into "  # type: ignore[operator]
                f"{n} chunks of {chunk} (blockIdx.z), a second kernel summing the partials before the epilogue")
    return prm, why


# split-K's bounds: each chunk at least this many elements of the reduction (fewer, longer chunks measured as fast or
# faster than the one wave of blocks the occupancy asks for: 16 x 4096 x 4096 float16 on tensor cores 0.025 ms at
# chunks of 256, 0.018 at 512), and the partials (written and read back once) at most this fraction of B's bytes
SPLIT_K_MIN_CHUNK = 512
SPLIT_K_PARTIAL_SHARE = 1 / 8


def split_k_chunks(rows: int, cols: int | None, depth: int | None, prm: dict[str, Any], itemsize: int = 4,
                   sm_count: int = 132, smem_per_sm: int = 227 * 1024) -> tuple[int, int, str] | None:
    """(chunks, chunk length, why) of split-K for a GEMM of `rows` x `cols` over `depth` with the SIMT tiles
    `prm`, or None when it does not pay: as many chunks as make the blocks one full wave of the blocks the SMs
    hold at once (by shared memory and threads), each at least SPLIT_K_MIN_CHUNK long, and at most so many that
    the partials stay within SPLIT_K_PARTIAL_SHARE of B's bytes; a chunk count that divides the k tiles where one
    within a quarter of that target does (no chunk with a ragged end)."""
    if not (isinstance(cols, int) and isinstance(depth, int) and cols > 0 and depth > 0):
        return None
    (b0, b1), (t0, t1), kt = prm["block"], prm["thread_tile"], prm["k_tile"]
    threads = (b0 // t0) * (b1 // t1)
    smem = 2 * (b0 * kt + kt * b1) * itemsize
    per_sm = min(smem_per_sm // max(smem, 1), 2048 // threads, 32)
    blocks = -(-rows // b0) * -(-cols // b1)
    tiles = -(-depth // kt)
    want = min(sm_count * per_sm // blocks, depth // SPLIT_K_MIN_CHUNK, int(depth * SPLIT_K_PARTIAL_SHARE / rows))
    if want < 2:
        return None
    # a divisor of the k tiles (no ragged last chunk) only near the target: at 3000 = 94 tiles of 32 and a target of
    # 5, halving to 2 chunks left 80 blocks on 132 SMs
    n = next((d for d in range(want, max(2, -(-3 * want // 4)) - 1, -1) if tiles % d == 0), want)
    chunk = kt * -(-tiles // n)
    fill = f"fill {blocks / (sm_count * per_sm):.0%} of the {sm_count} SMs x {per_sm} resident blocks"
    return -(-depth // chunk), chunk, fill
