"""Dynamic shared memory (CUDA pipeline): which shared buffers of a kernel live in its `extern __shared__`
array, at which byte offsets, and how many bytes a launch must ask for.

    kernel k:                                        kernel k:  # dynamic shared: x_shared at 0; n*4 bytes
        allocate x_shared: float32[n] shared   ==>       allocate x_shared: float32[n] shared
            ...                                              ...

A kernel's shared buffers are laid out in one dynamic array when one of them has a size that is not a
constant (a row of symbolic length) or when their constant bytes, with the reduction scratch the renderer
declares, pass the 48 KiB a block may declare statically. Each buffer then starts at an offset aligned to
16 bytes (128-bit accesses stay aligned), in the order the kernel allocates them; the offsets and the total
are expressions of the sizes, so the launcher evaluates them per call (`Kernel.dynamic_shared`), asks the
driver for more than 48 KiB where needed, and refuses a launch whose bytes the device cannot hold.
Kernels with software-pipelined copies keep their static (double-buffered) arrays: the planner sizes them.

Refused here (CudaCodegenError): constant dynamic bytes beyond the largest opt-in shared memory of any
CUDA device this project targets (DYNAMIC_SHARED_MAX), naming the kernel and the buffers.
"""

from __future__ import annotations

import dataclasses
import math

from loopir import nodes as N
from loopir.dtypes import np_dtype
from loopir.errors import CudaCodegenError
from loopir.visit import walk

from schedules.primitives.flash import FLASH_WGMMA, FlashMismatch, flash_parts
from schedules.primitives.wgmma import WGMMA, WgmmaMismatch, kernel_tile

from .kernels import map_kernels

STATIC_SHARED_MAX = 48 * 1024  # bytes a block may declare statically (every CUDA device)
DYNAMIC_SHARED_MAX = 227 * 1024  # the opt-in maximum per block on sm_90 (H100 / H200)
RED_SCRATCH = 32 * 8  # bytes of one block all-reduce scratch array (codegen.cuda.reduce), counted per kernel
ALIGN = 16


def plan_dynamic_shared(program: N.Program) -> N.Program:
    """Lay out the shared buffers of kernels that need dynamic shared memory (`Kernel.dynamic_shared`).

    identity on the executed instances: only where a shared buffer's storage lives changes."""
    return map_kernels(program, _plan)


def shared_bytes(b: N.Buffer) -> N.Expr:
    """Bytes of one shared buffer, as an expression of the sizes."""
    size: N.Expr = N.const(np_dtype(b.dtype).itemsize)
    for d in b.shape:
        size = N.binary("mul", size, d)
    return size


def const_bytes(b: N.Buffer) -> int:
    """Bytes of one buffer of constant shape (a shared tile, a register array)."""
    return math.prod(int(d.value) for d in b.shape) * np_dtype(b.dtype).itemsize  # type: ignore[attr-defined]


def _align(e: N.Expr) -> N.Expr:
    if isinstance(e, N.Const):
        return N.const(-(-int(e.value) // ALIGN) * ALIGN)
    return N.binary("mul", N.binary("floordiv", N.binary("add", e, N.const(ALIGN - 1)), N.const(ALIGN)),
                    N.const(ALIGN))


def _plan(k: N.Stmt) -> N.Stmt:
    if not isinstance(k, N.Kernel) or k.pipelined or k.dynamic_shared:
        return k
    try:
        tile = kernel_tile(k.body)
    except WgmmaMismatch as e:
        raise CudaCodegenError(f"the tile marked {WGMMA} changed shape: {e}") from None
    if tile is not None:  # its own ring of swizzled stages (codegen.cuda.wgmma), one block per multiprocessor
        sh = tile[1].shape
        nbytes = sh.shared_bytes if tile[2] is None else sh.tma_shared_bytes
        return dataclasses.replace(k, dynamic_shared=((None, N.const(nbytes)),), min_blocks=1)
    flash = next((f for f in walk(k.body) if isinstance(f, N.For) and f.kind == FLASH_WGMMA), None)
    if flash is not None:  # Q and two stages of K and V in swizzled rows (codegen.cuda.flash_wgmma)
        try:
            fs = flash_parts(flash).shape
        except FlashMismatch as e:
            raise CudaCodegenError(f"the pass marked {FLASH_WGMMA} changed shape: {e}") from None
        return dataclasses.replace(k, dynamic_shared=((None, N.const(fs.shared_bytes)),), min_blocks=fs.blocks_per_sm)
    bufs: list[N.Buffer] = []
    for n in walk(k.body):
        if isinstance(n, N.Allocate) and n.buffer.scope == "shared" and all(b is not n.buffer for b in bufs):
            bufs.append(n.buffer)
    if not bufs:
        return k
    sizes = [shared_bytes(b) for b in bufs]
    const = all(isinstance(s, N.Const) for s in sizes)
    static = sum(int(s.value) for s in sizes if isinstance(s, N.Const)) + RED_SCRATCH  # type: ignore[attr-defined]
    if const and static <= STATIC_SHARED_MAX:
        return k
    layout: list[tuple[N.Buffer | None, N.Expr]] = []
    off: N.Expr = N.const(0)
    for b, s in zip(bufs, sizes):
        layout.append((b, off))
        off = _align(N.binary("add", off, s))
    if isinstance(off, N.Const) and int(off.value) > DYNAMIC_SHARED_MAX:
        names = ", ".join(f"{b.name} ({int(s.value):,} B)" for b, s in zip(bufs, sizes))  # type: ignore[attr-defined]
        stmts = ", ".join(dict.fromkeys(st.name for st in walk(k.body) if isinstance(st, N.Store)))
        raise CudaCodegenError(
            f"the kernel of statements {stmts} needs {int(off.value):,} bytes of shared memory ({names}); a block "
            f"may use at most {DYNAMIC_SHARED_MAX:,} (227 KiB, dynamic opt-in on sm_90): cache less in shared memory")
    return dataclasses.replace(k, dynamic_shared=(*layout, (None, off)))  # the end: the bytes a launch asks for


__all__ = ["plan_dynamic_shared", "shared_bytes", "STATIC_SHARED_MAX", "DYNAMIC_SHARED_MAX"]
