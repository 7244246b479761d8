"""The tiled GEMM on the CPU as a sequence of checked Schedule steps (the register tile is the tuning handle).

    plan = schedule_gemm_cpu(s, "matmul", epilogue="auto", cpu_tile=(6, 64))

The nest it produces (cpu_tile=(6, 64) on AVX-512, see `default_cpu_tile`):

    for jo in parallel:                                # a column panel of B (n x 64) stays in L2
      for io:                                          # a 6-row strip of A streams past it
        allocate C_local[6, 64] local                  # cache_write: lives in 24 vector registers
        for ii (unroll), ji (vectorize): C_local = 0
        for k: for ii (unroll): for ji (vectorize): C_local[ii, ji] += A[.., k] * B[k, ..]   # FMAs
        for q0 (unroll), q1 (vectorize): out[..] = epilogue(C_local[q0, q1])
"""

from __future__ import annotations

from typing import Any

from loopir.errors import ArgumentError
from loopir.nodes import Load, Store
from loopir.target import vector_bits, vector_registers
from loopir.visit import statements, walk

import schedules.primitives.cache_write  # noqa: F401  (registers Schedule.cache_write)

from .gemm import GemmPlan, pos_int, resolve_stage

__all__ = ["default_cpu_tile", "schedule_gemm_cpu"]


def schedule_gemm_cpu(s: Any, stage: str | Any = None, epilogue: Any = "auto", cpu_tile: tuple[int, int] | None = None,
                      who: str = "schedule_gemm_cpu") -> GemmPlan:
    """Apply the tiled-GEMM recipe for the CPU target to the matmul-shaped reduction `stage` of Schedule `s`.

    `stage`: the update statement's name (or tensor); None picks the only matmul-shaped one.
    `epilogue`: elementwise consumers fused into the single store ("auto": the chain
    `elementwise_consumers` finds; [] for none). `cpu_tile`: the register tile (None:
    `default_cpu_tile()`). `who` names the caller in error messages. Returns a GemmPlan
    (`.explain()`); `s` is modified in place. ValueError on a bad tile.
    """
    if cpu_tile is not None and not (isinstance(cpu_tile, tuple) and len(cpu_tile) == 2 and all(
            pos_int(x) for x in cpu_tile)):
        raise ArgumentError(f"{who}: cpu_tile must be two positive ints, got {cpu_tile!r}")
    upd, eps = resolve_stage(s.program, stage, epilogue, who)
    plan = GemmPlan(upd.name, list(eps), "cpu")
    _cpu(s, upd, eps, cpu_tile, plan)
    return plan


def default_cpu_tile() -> tuple[int, int]:
    """The register tile of this host: 6 rows x 4 vector registers (6x64 floats on AVX-512, 6x32 on AVX2):
    24 accumulators + 4 row-of-B vectors + 1 broadcast fit in the 32 (16 on AVX2: 6x16) vector registers."""
    try:
        bits = vector_bits()
        regs = vector_registers()
    except ImportError:  # no LLVM: a tile that is reasonable anywhere
        bits, regs = 256, 16
    lanes = bits // 32
    return (6, 4 * lanes) if regs == 32 else (6, 2 * lanes)


def _cpu(s: Any, upd: Store, eps: list[str], tile: tuple[int, int] | None, plan: GemmPlan) -> None:
    """for jo (parallel): for io: C_local[tile] = 0; for k: for ii (unroll): for ji (vectorize): C_local += A*B;
    then the copy-out / epilogue. B's column panel (n x tile[1]) stays in L2 while every row strip of A
    streams past it; the tile lives in vector registers (the code generator keeps `local` scratch that is
    only touched by unrolled, vectorized loops in SSA values)."""
    name = upd.name
    tile = default_cpu_tile() if tile is None else tile
    i, j, k = s.loops(name)[-3:]
    io, ii = s.split(i, tile[0])
    jo, ji = s.split(j, tile[1])
    s.reorder(jo, io, ii, ji)
    plan.steps.append(f"tile (i, j) by {tile}; reorder(jo, io, ii, ji): column panels of B outermost")
    # before cache_write: the checker does not treat the scratch buffer as private to each iteration
    s.parallel(jo)
    plan.steps.append("parallel(jo)")
    s.cache_write(upd.buffer.name, "local", io, epilogue=eps)
    plan.steps.append(f"cache_write({upd.buffer.name}, 'local', io, epilogue={eps}): {tile[0]}x{tile[1]} register tile")
    ii, ji, k = s.loops(name)[-3:]
    s.reorder(k, ii, ji)
    plan.steps.append("reorder(k, ii, ji): the register tile is updated by one k at a time")
    s.unroll(ii)
    s.vectorize(ji)
    plan.steps.append("unroll(ii), vectorize(ji): one broadcast of A and tile[1]/VL loads of B per row and k")
    local = f"{upd.buffer.name}_local"
    others = [c.store.name for c in statements(s.program)
              if c.store.name != name and (c.store.buffer.name == local or any(
                  isinstance(n, Load) and n.buffer.name == local for n in walk(c.store.value)))]
    for st in others:
        a, b = s.loops(st)[-2:]
        s.unroll(a)
        s.vectorize(b)
    plan.steps.append(f"unroll + vectorize the tile loops of {', '.join(others)}")
