"""Annotation primitives: unroll, vectorize, parallel, bind. They change how a loop runs,
not its bounds; the last three require that the loop carries no dependence."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from loopir import poly
from loopir.errors import ArgumentError, ArgumentTypeError
from loopir.nodes import GPU_AXES, Binary, Load, Program, Var
from loopir.visit import free_vars, substitute

from . import CheckContext, find_loop, primitive, replace_loop

__all__ = ["unroll", "vectorize", "parallel", "bind", "pragma", "PRAGMAS", "reduction_loop_info", "ReductionInfo"]

# the pragmas `pragma` knows: name -> what its value is
PRAGMAS = {
    "unroll": "an unroll count n >= 1 (1: keep the loop rolled)",
    "unroll_explicit": "none: the loop is unrolled in the generated code, as s.unroll",
}


@dataclass(frozen=True)
class ReductionInfo:
    """Statement `stmt` accumulates into `buffer` with `op` along the loop: every iteration
    updates the same element (`buffer[idx] = buffer[idx] op value`)."""

    stmt: str
    buffer: str
    op: str
    loop: Var


def reduction_loop_info(program: Program, loop_var: Var) -> ReductionInfo | None:
    """The reduction that `loop_var` carries, if any: a statement inside it of the form
    `B[idx] = B[idx] op value` (op in add, mul, max, min) whose element does not depend on the loop."""
    for info in poly.stmt_infos(program):
        if not any(lp.var is loop_var for lp in info.loops):
            continue
        st = info.store
        v = st.value
        if not (isinstance(v, Binary) and v.op in ("add", "mul", "max", "min")):
            continue
        acc = [x for x in (v.a, v.b) if isinstance(x, Load) and x.buffer is st.buffer and x.indices == st.indices]
        if not acc:
            continue
        where = dict(zip(st.iters, st.coords))
        element_vars = set().union(*(free_vars(substitute(i, where)) for i in st.indices)) if st.indices else set()
        if loop_var not in element_vars:
            return ReductionInfo(st.name, st.buffer.name, v.op, loop_var)
    return None


def _annotate(program: Program, loop: Var, kind: str, thread: str | None, what: str) -> Program:
    f = find_loop(program, loop)
    if f.kind != "serial":
        how = f.thread if f.kind == "thread" else f.kind
        raise ArgumentError(f"{what}: loop {loop.name!r} is already {how}")
    return replace_loop(program, loop, dataclasses.replace(f, kind=kind, thread=thread))


def carried_hint(ctx: CheckContext, w: poly.Witness) -> str:
    loop = next(a for a in ctx.args if isinstance(a, Var))
    red = reduction_loop_info(ctx.old, loop)
    if red is not None:
        return (f"loop {loop.name} is the reduction loop of {red.stmt} ({red.buffer} {red.op}= ... in every "
                f"iteration); running a reduction loop in parallel or binding it to threads is refused for now "
                "(cross-thread reductions are not supported yet): split the reduction and parallelise the "
                "spatial loops instead")
    return (f"loop {loop.name} carries this dependence: its iterations must run in order; "
            "choose a loop whose iterations are independent (e.g. after reorder)")


@primitive("unroll", check=None)
def unroll(program: Program, loop: Var) -> Program:
    """Mark `loop` to be unrolled by the code generators. Precondition: none (always legal, same order)::

        for i in range(0, 4):   ->   for i in range(0, 4):  # unroll
    """
    return _annotate(program, loop, "unroll", None, "unroll")


# formal condition for the three below: no dependence between two different iterations of the
# loop within one iteration of all loops outside it (poly.carried_by is None)


@primitive("vectorize", check="carried", hint=carried_hint)
def vectorize(program: Program, loop: Var) -> Program:
    """Mark `loop` to run as SIMD lanes. Precondition: it carries no dependence::

        for j in range(0, 8):   ->   for j in range(0, 8):  # vectorize
    """
    return _annotate(program, loop, "vectorize", None, "vectorize")


@primitive("parallel", check="carried", hint=carried_hint)
def parallel(program: Program, loop: Var) -> Program:
    """Run the iterations of `loop` on several CPU threads. Precondition: it carries no dependence::

        for i in range(0, n):   ->   for i in range(0, n):  # parallel
    """
    return _annotate(program, loop, "parallel", None, "parallel")


@primitive("bind", check="carried", hint=carried_hint)
def bind(program: Program, loop: Var, axis: str) -> Program:
    """Map `loop` onto a CUDA grid axis ("blockIdx.x|y|z" or "threadIdx.x|y|z").
    Precondition: it carries no dependence (a reduction loop is refused for now)::

        for i in range(0, n):   ->   for i in range(0, n):  # blockIdx.x
    """
    if not isinstance(axis, str) or axis not in GPU_AXES:
        raise ArgumentError(f"bind: unknown GPU axis {axis!r}; use one of {', '.join(GPU_AXES)}")
    return _annotate(program, loop, "thread", axis, "bind")


@primitive("pragma", check=None)
def pragma(program: Program, loop: Var, name: str, value: int | None = None) -> Program:
    """A hint for the code generators on `loop` (TVM's `s[op].pragma(axis, name, value)`). Precondition: none
    (the loop runs in the same order; it changes only how the code is written). Known pragmas:

    * "unroll", n: unroll by n — `#pragma unroll n` (CUDA), `llvm.loop.unroll.count` n (CPU); n == 1 keeps
      the loop rolled (`#pragma unroll 1`, `llvm.loop.unroll.disable`). The loop must be serial.
    * "unroll_explicit": unroll it fully in the generated code, as `s.unroll(loop)` (a constant extent).

    A loop that a later primitive replaces (split, fuse...) drops its pragmas: give them last::

        for k in range(0, n):   ->   for k in range(0, n):  # pragma unroll 4
    """
    if not isinstance(name, str) or name not in PRAGMAS:
        known = "; ".join(f"{k!r} ({v})" for k, v in PRAGMAS.items())
        raise ArgumentError(f"pragma: unknown pragma {name!r}; known: {known}")
    f = find_loop(program, loop)
    if name == "unroll_explicit":
        if value is not None and value is not True:
            raise ArgumentError(f"pragma 'unroll_explicit' takes no value, got {value!r}")
        return _annotate(program, loop, "unroll", None, "pragma unroll_explicit")
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError(f"pragma 'unroll' on loop {loop.name!r} needs an integer count, got {value!r}")
    if value < 1:
        raise ArgumentError(f"pragma 'unroll' on loop {loop.name!r}: the count must be >= 1, got {value}")
    if f.kind != "serial":
        how = f.thread if f.kind == "thread" else f.kind
        raise ArgumentError(f"pragma 'unroll': loop {loop.name!r} is {how}; an unroll count applies to a serial loop")
    rest = tuple(p for p in f.pragmas if p[0] != name)
    return replace_loop(program, loop, dataclasses.replace(f, pragmas=(*rest, (name, value))))
