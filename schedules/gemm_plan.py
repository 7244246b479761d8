"""The fusion planner's GEMM groups: the recipe parameters of a matmul with its epilogue (`FusionGroup.gemm`), the
skinny tiles and split-K for few rows, the device's limits, and the notes `explain()` prints (`plan_gemm`); the bytes
of split-K's partials for the cost model (`split_partials`). `schedules.gemm_mapping` applies what this decides."""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any

from loopir.affine import simplify
from loopir.dtypes import np_dtype
from loopir.errors import ResourceLimitError
from loopir.nodes import Load, Var
from loopir.visit import free_vars, walk

from . import cost as C
from .cost import Device
from .fusion_plan import Decision, FusionGroup
from .recipes import MMA_TILES, SKINNY_ROWS, gemm_resources, shared_weight_rows, simt_default, skinny_params

__all__ = ["plan_gemm", "split_partials"]


def plan_gemm(g: FusionGroup, gemm: dict[str, Any] | None, target: str, dev: Device, ev: dict[Any, Any],
              given: Collection[str]) -> None:
    """The GEMM group `g`'s recipe parameters (`g.gemm`: the caller's `gemm` options, the skinny tiles and split-K
    for few rows) and its notes; ResourceLimitError for tiles `dev` cannot hold."""
    mm, eps = g.stages[0], g.stages[1:]
    prm = dict(gemm or {})
    g.gemm = prm
    a, b = (", ".join(n.buffer.name for n in walk(x) if isinstance(n, Load)) for x in (mm.op.body.body.a,
                                                                                      mm.op.body.body.b))
    k = mm.op.reduce_axis[0].name
    batch = "".join(f"{v.name}, " for v in mm.op.axis[:-2])
    i, j = (v.name for v in mm.op.axis[-2:])
    what = (f"{mm.name}[{batch}{i}, {j}] = sum over {k} of {a}[..] * {b}[..] is matmul-shaped"
            + (f" (batched over {batch[:-2]}: blockIdx.z on cuda)" if batch else ""))
    if target == "cpu":
        t0, t1 = prm["cpu_tile"]
        how = (f"tiled GEMM recipe for the CPU: {t0}x{t1} register tile (cache_write local), column panels "
               "of the right operand on parallel threads, the tile loops unrolled and vectorized")
    else:
        itemsize = max(np_dtype(n.buffer.dtype).itemsize for n in walk(mm.op.body.body) if isinstance(n, Load))
        # the recipe's default tiles (none chosen by the caller) and few rows: the skinny tiles
        rows = C.size_value(mm.shape[-2], ev)
        # a linear layer (batch axes the weight does not read: X[b, t, k] @ W[k, j]) has all batches' rows
        # against one weight: more than SKINNY_ROWS of them is no skinny GEMM, whatever T is (64 x 32 rows of
        # a float16 MLP had taken the SIMT skinny tiles instead of tensor cores)
        dims = shared_weight_rows(mm)
        if dims and all(v.name in given for d in dims for v in free_vars(d)):  # sizes known
            total = math.prod(C.size_value(d, ev) for d in dims)
            # few in all (a decode step's B x 1 rows): one skinny GEMM over every batch's rows, the batch loops
            # collapsed into the row loop by the mapping, so that W is streamed once and split-K applies. The rows
            # of one batch (the inner extents) a constant power of two: the collapse is quasi-affine, and a
            # thread's tile (a power of two of rows) never straddles two batches unless it holds whole ones (its
            # register tile then has one affine footprint). Else skinny tiles of one batch's rows, as before
            inner = [simplify(d) for d in dims[1:]]
            per = math.prod(int(d.value) for d in inner) if all(not free_vars(d) for d in inner) else 0
            g.collapse_rows = total <= SKINNY_ROWS and per > 0 and per & (per - 1) == 0
            one_batch, rows = rows, total if total > SKINNY_ROWS or g.collapse_rows else rows
        # split-K for a plain 2-d matmul (rows given: a class bound at call time): columns and reduction
        # length at the plan's sizes, or DEFAULT_SIZE where a size is not given (not a default per variable:
        # 16*m16 at m16 = 4096 would plan 65,536 columns)
        red = mm.op.reduce_dom[0]
        cols, depth = (C.size_value(e, ev) if {v.name for v in free_vars(e)} <= given
                       else C.DEFAULT_SIZE for e in (simplify(mm.shape[-1]), simplify(red[1] - red[0])))
        depth = depth if len(mm.shape) == 2 or g.collapse_rows else None  # one 2-d GEMM once mapped
        if free_vars(simplify(red[1] - red[0])) & set(mm.op.axis):  # a triangular reduction (trmm: k > i): no split
            depth = None
        # tensor cores for a half skinny GEMM where nobody chose the tensor-core path (a batched one: wgmma; a
        # collapsed one keeps the SIMT tiles: the mma recipe's operand tiles are 2-d, A's here [b, t, k])
        tc = len(mm.shape) == 2 and all(prm.get(k) in (None, MMA_TILES) for k in ("tensor_cores", "wgmma", "mma"))
        asked = prm.get("split_k")  # a chunk length (0: no split) the caller chose, kept over the planner's
        sk = skinny_params(rows, itemsize, dev.smem_per_block, cols, depth if asked is None else None,
                           dev.sm_count, dev.smem_per_block_optin,
                           tensor_cores=tc) if simt_default(prm) else None
        g.collapse_rows = g.collapse_rows and sk is not None
        if g.collapse_rows:  # the tiles of one batch's rows, for a mapping whose collapse is refused
            one = skinny_params(one_batch, itemsize, dev.smem_per_block, cols, None, dev.sm_count,
                                dev.smem_per_block_optin)
            g.gemm_batched = {**prm, **(one[0] if one is not None else {}), "split_k": asked}
        if sk is not None:
            prm.update(sk[0])
            prm["split_k"] = asked if asked is not None else prm.get("split_k")
            g.log.append(Decision("note", (mm.name,), None, sk[1] + (
                f" (rows costed at {rows}: `sizes`)" if isinstance(mm.shape[-2], Var) else "") + (
                f"; a linear layer: all {rows} rows of its batches "
                f"({' x '.join(str(C.size_value(d, ev)) for d in dims or ())}) against one weight, the batch loops "
                "collapsed into the rows" if g.collapse_rows else "")))
        threads, smem, acc = gemm_resources(prm, itemsize)
        (b0, b1), (t0, t1), kt = prm["block"], prm["thread_tile"], prm["k_tile"]
        limits = [(threads, dev.max_threads_per_block, "threads per block"),
                  (smem, dev.smem_per_block, "bytes of shared memory per block"),
                  (acc + t0 + t1, dev.regs_per_thread or 255, "registers per thread")]
        for need, limit, what_l in limits:
            # refuse tiles the device cannot hold: need <= limit
            if limit and need > limit:
                raise ResourceLimitError(
                    f"auto_schedule: gemm tiles of {mm.name} (block {prm['block']}, thread_tile "
                    f"{prm['thread_tile']}, k_tile {kt}) need {need:,} {what_l}; the device has "
                    f"{limit:,}")
        how = (f"tiled GEMM recipe (schedules.gemm_cuda): block {b0}x{b1} on blockIdx.y/x, {threads} threads "
               f"each a {t0}x{t1} register tile (cache_write local), k in steps of k_tile {kt}"
               + (f", the block's tiles of the operands staged in shared memory ({C.fmt_bytes(smem)} per stage, "
                  f"of {C.fmt_bytes(dev.smem_per_block)})" if prm.get("shared", True) else ""))
    g.log.append(Decision("note", (mm.name,), None, f"GEMM group: {what}; {how}"))
    if prm.get("split_k"):
        g.log.append(Decision("note", (mm.name,), None, (
            f"split-K: the partials {mm.name}_rf[chunk, i, j] are written and read back once "
            f"({C.fmt_bytes(2 * split_partials(g, ev))}), a second kernel sums them"
            + (f" and computes the epilogue ({', '.join(t.name for t in eps)})" if eps else ""))))
    elif eps:
        g.log.append(Decision("note", tuple(t.name for t in eps), None,
                              f"epilogue fused: computed on the register tile before the single store of "
                              f"{eps[-1].name}; {mm.name} is never written to memory (saves writing and "
                              f"re-reading {C.fmt_bytes(C.buffer_bytes(mm.shape, mm.dtype, ev))})"))


def split_partials(g: FusionGroup, ev: dict[Any, Any]) -> int:
    """Bytes of a split-K GEMM group's partials (chunks x rows x columns, in the matmul's dtype)."""
    mm = g.stages[0]
    red = mm.op.reduce_dom[0]
    chunks = -(-C.size_value(simplify(red[1] - red[0]), ev) // int((g.gemm or {})["split_k"]))
    return chunks * C.buffer_bytes(mm.shape, mm.dtype, ev)
