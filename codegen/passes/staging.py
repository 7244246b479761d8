"""Staging (CUDA pipeline): which loops double-buffer their shared block-tile copies with `cp.async`.

A serial loop inside thread loops whose body is `allocate S1.. shared: copies into S1..; barrier; REST;
barrier` (a cache_read "shared" of a block tile, after barrier placement) is marked `pipelined` on its
`Kernel`: the renderer issues tile k+1 into a second stage while tile k is computed on (its docstring
gives the argument). The copies must read global buffers that no statement of the kernel writes, REST
must not write the staged buffers, every thread must reach them, the stages must start 16-byte aligned
and two stages must fit the 48 KiB of static shared memory. `PIPELINE_SHARED_COPIES = False` turns it off.
"""

from __future__ import annotations

import dataclasses
import math

from loopir import nodes as N
from loopir.gpu import is_thread_loop
from loopir.visit import free_vars, loops_of, subst_coords, substitute, walk

from .gpu_model import by_thread_depth
from .launch import copy_nest, uniform_path
from .shared import STATIC_SHARED_MAX, const_bytes

# software pipelining of shared block-tile copies; off: the plain copy, barrier, compute
PIPELINE_SHARED_COPIES = True


def plan_staging(program: N.Program) -> N.Program:
    """Mark the serial loops whose shared copies are software-pipelined.

    identity on the executed instances: it only records a rendering decision on each Kernel."""
    if not PIPELINE_SHARED_COPIES:
        return program
    found: dict[int, N.Kernel] = {}
    for k in (n for n in walk(program.body) if isinstance(n, N.Kernel)):
        # float32 tiles, or half ones (the K and V copies of a half attention pass); not the rings of plan_mma
        marks = frozenset(f.var for f in _candidates(k) if f.var not in k.pipelined
                          and (pipeline_parts(k, f) is not None or pipeline_parts(k, f, half=True) is not None))
        if marks:
            found[id(k)] = dataclasses.replace(k, pipelined=k.pipelined | marks)
    if not found:
        return program

    def go(s: N.Stmt) -> N.Stmt:
        if id(s) in found:
            return found[id(s)]
        if isinstance(s, N.Seq):
            return N.Seq(tuple(go(c) for c in s.body))
        if isinstance(s, (N.For, N.Allocate)):
            return dataclasses.replace(s, body=go(s.body))
        if isinstance(s, N.If):
            return dataclasses.replace(s, then=go(s.then), orelse=None if s.orelse is None else go(s.orelse))
        return s

    return dataclasses.replace(program, body=go(program.body))


def _candidates(k: N.Kernel) -> list[N.For]:
    out: list[N.For] = []

    def visit(s: N.Stmt, depth: int) -> bool:
        if isinstance(s, N.For) and s.kind == "serial" and depth > 0:
            out.append(s)
        return False

    by_thread_depth(k.body, visit)
    return out


def staged_shape(f: N.For) -> tuple[list[N.Buffer], list[N.Stmt], int] | None:
    """(the shared buffers allocated around the body, the body's items, the index of its first barrier)
    when `f`'s body has the shape `allocate S..: copies; barrier; REST; barrier`, else None."""
    chain: list[N.Buffer] = []
    inner: N.Stmt = f.body
    while isinstance(inner, N.Allocate) and inner.buffer.scope == "shared":
        chain.append(inner.buffer)
        inner = inner.body
    if not chain or not isinstance(inner, N.Seq):
        return None
    items = list(inner.body)
    first = next((k for k, x in enumerate(items) if isinstance(x, N.Barrier)), None)
    if first is None or first == 0 or first == len(items) - 1 or not isinstance(items[-1], N.Barrier):
        return None
    return chain, items, first


def copy_store(c: N.Stmt, half: bool = False) -> N.Store | None:
    """The store of a cooperative copy nest `c` that reads one element of a float32 global buffer (`half`: of a
    float16 / bfloat16 one into the same type, in rows of whole 16-byte chunks: cp.async has no 2-byte form)."""
    parts = copy_nest(c) if isinstance(c, N.For) else None
    if parts is None:
        return None
    st = parts[2]
    dts = ("float16", "bfloat16") if half else ("float32",)
    if not (isinstance(st.value, N.Load) and st.buffer.dtype in dts
            and st.value.buffer.scope == "global" and st.value.buffer.dtype == st.buffer.dtype):
        return None
    if half and getattr(parts[0][-1].hi, "value", 1) % 8:
        return None
    return st


def pipeline_parts(k: N.Kernel, f: N.For, half: bool = False,
                   budget: bool = True) -> tuple[list[N.Buffer], list[N.Stmt], int] | None:
    """`staged_shape(f)` when the loop's copies may be software-pipelined (see the module docstring); `half`:
    copies of float16 / bfloat16 tiles in rows of whole 16-byte chunks; `budget`: a second stage must fit the
    48 KiB of static shared memory (codegen.passes.mma sizes its rings itself)."""
    shape = staged_shape(f)
    if shape is None:
        return None
    chain, items, first = shape
    stores = [copy_store(c, half) for c in items[:first]]
    if any(st is None for st in stores):
        return None
    ids = {id(b) for b in chain}
    if sorted(id(st.buffer) for st in stores) != sorted(ids):  # type: ignore[union-attr]
        return None
    if any(math.prod(int(d.value) for d in b.shape) % 4 for b in chain):  # type: ignore[attr-defined]
        return None  # each stage must start 16-byte aligned
    others = sum(const_bytes(n.buffer) for n in walk(k.body)
                 if isinstance(n, N.Allocate) and n.buffer.scope == "shared")
    if budget and others + sum(const_bytes(b) for b in chain) > STATIC_SHARED_MAX:
        return None  # a second stage would pass the 48 KiB of static shared memory
    written = {id(n.buffer) for n in walk(k.body) if isinstance(n, N.Store)}
    if any(id(st.value.buffer) in written for st in stores):  # type: ignore[union-attr]
        return None
    if any(isinstance(n, N.Store) and id(n.buffer) in ids for r in items[first:] for n in walk(r)):
        return None
    tvars = {x.var for x in loops_of(k.body) if is_thread_loop(x)}
    for c, st in zip(items[:first], stores):
        sub = subst_coords(st)  # type: ignore[arg-type]
        used = free_vars(substitute(st.value, sub)).union(  # type: ignore[union-attr]
            *(free_vars(substitute(i, sub)) for i in st.indices))  # type: ignore[union-attr]
        guards = [n.cond for n in walk(c) if isinstance(n, N.If)]
        used = used.union(*(free_vars(g) for g in guards))
        if used & tvars or not uniform_path(k.body, c, k.guarded):
            return None
    return shape


__all__ = ["plan_staging", "pipeline_parts", "staged_shape", "copy_store", "PIPELINE_SHARED_COPIES"]
