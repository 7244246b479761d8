"""cache_row: a row of an input kept in shared memory for one iteration of a row loop, its length given by
the sizes (symbolic allowed): the CUDA target places such a buffer in dynamic shared memory, sized per
launch (`codegen.passes.shared`). cache_read covers regions of constant size; this covers whole rows."""

from __future__ import annotations

import dataclasses
from typing import Any

from loopir import poly
from loopir.affine import simplify
from loopir.dtypes import INDEX
from loopir.errors import ArgumentError, ArgumentTypeError
from loopir.nodes import Allocate, Barrier, Buffer, For, Load, Program, Stmt, Store, Var, binary, const
from loopir.visit import free_vars, seq

from . import CheckContext, fresh_name, primitive, replace_loop
from .cache import _check_cache_read, readers_in, redirect_readers, union_box

__all__ = ["cache_row"]


def _check_cache_row(ctx: CheckContext) -> poly.Witness | None:
    # the same condition as cache_read: nothing inside the loop writes a value of the row that it reads
    return _check_cache_read(dataclasses.replace(ctx, args=(ctx.args[0], "shared", ctx.args[1])))


@primitive("cache_row", check=_check_cache_row, rebase=True)
def cache_row(program: Program, tensor: Any, loop: Var) -> tuple[Program, Buffer]:
    """Copy the region of `tensor` that one iteration of `loop` reads into a "shared" buffer allocated at
    the top of the iteration, whose size may be an expression of the sizes (a row of symbolic length n);
    loads inside the loop read the copy. Returns the buffer; the copy statement is `<buffer>_shared`.

    Precondition: `loop` is inside no threadIdx-bound loop (one block's row loop, typically bound to
    blockIdx), the region's extents depend on the sizes only (not on `loop` or loops around it), and no
    statement inside `loop` writes a value of the buffer that a statement inside it reads (ScheduleError
    with a witness otherwise).

        for i in 0..m (blockIdx.x):            for i in 0..m (blockIdx.x):
            for k: mx[i] = max(mx[i], x[i, k])  ==>  x_shared[1, n] <- x[i + c0, c1]; barrier
            for j: y[i, j] = exp(x[i, j] - ..)       for k: mx[i] = max(mx[i], x_shared[0, k])
                                                     for j: y[i, j] = exp(x_shared[0, j] - ..)"""
    if not isinstance(loop, Var):
        raise ArgumentTypeError(f"cache_row: expected a loop handle, got {type(loop).__name__} {loop!r}")
    buf, f, readers = readers_in(program, tensor, loop, "cache_row")
    depth = readers[0].loops.index(f)
    if any(lp.kind == "thread" and (lp.thread or "").startswith("threadIdx") for lp in readers[0].loops[:depth]):
        raise ArgumentError(f"cache_row: loop {loop.name!r} is inside a threadIdx-bound loop; a row cache "
                            "belongs to one block's row loop (cache_read handles tiles of a block's threads)")
    box = union_box(program, readers, buf, loop)
    shape = [simplify(binary("sub", hi, lo)) for lo, hi in box]
    params = set(program.params)
    for d, n in enumerate(shape):
        if not free_vars(n) <= params:
            raise ArgumentError(f"cache_row: the region of {buf.name!r} read in one iteration of loop "
                                f"{loop.name!r} has extent {n} along dimension {d}, which depends on the loops "
                                "(not only on the sizes); a shared row needs an extent fixed for the launch")
    lows = [lo for lo, _ in box]
    cname = fresh_name(program, f"{buf.name}_shared")
    cache = Buffer(cname, tuple(shape), buf.dtype, "shared")
    taken: set[str] = set()
    cvars = []
    for d in range(len(shape)):
        v = Var(fresh_name(program, f"c{d}", taken), INDEX)
        taken.add(v.name)
        cvars.append(v)
    outer = tuple(lp.var for lp in readers[0].loops[: depth + 1])
    its = outer + tuple(cvars)
    # the box lies between the lowest and highest index read along each dimension: inside the buffer
    copy: Stmt = Store(cname, cache, tuple(cvars),
                       Load(buf, tuple(binary("add", lo, v) for lo, v in zip(lows, cvars))), its, its)
    for v, n in reversed(list(zip(cvars, shape))):
        copy = For(v, const(0), n, copy, "serial")
    parts: list[Stmt] = [copy, Barrier(), redirect_readers(f.body, readers, buf, cache, lows)]
    if not (f.kind == "thread" and (f.thread or "").startswith("blockIdx")):
        parts.append(Barrier())  # the next iteration's copy must not overwrite what slow threads still read
    new = dataclasses.replace(f, body=Allocate(cache, seq(*parts)))
    return replace_loop(program, loop, new), cache
