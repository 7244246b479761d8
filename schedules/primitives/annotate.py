"""Annotation primitives: unroll, vectorize, parallel, bind. They change how a loop runs,
not its bounds; the last three require that the loop carries no dependence."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from loopir import poly
from loopir.errors import ArgumentError, ArgumentTypeError
from loopir.gpu import CLUSTER_MAX
from loopir.affine import simplify
from loopir.nodes import GPU_AXES, Binary, Const, For, Load, Program, Var, binary
from loopir.visit import free_vars, substitute, walk

from . import CheckContext, find_loop, loop_path, primitive, replace_loop
from .loops import _is_copy_loop, reorder

__all__ = ["unroll", "vectorize", "parallel", "bind", "vthread", "pragma", "PRAGMAS", "reduction_loop_info",
           "ReductionInfo", "VTHREAD"]

# the pragmas `pragma` knows: name -> what its value is
PRAGMAS = {
    "unroll": "an unroll count n >= 1 (1: keep the loop rolled)",
    "unroll_explicit": "none: the loop is unrolled in the generated code, as s.unroll",
    "cluster": "a cluster size c in 2..8 on a loop bound to blockIdx.x (CUDA, sm_90): each of its blocks runs as a "
               "thread-block cluster of c blocks, which together hold its threadIdx.x range (up to c x 1024 threads)",
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
    if what in ("unroll", "vectorize"):
        _refuse_copy_loop(program, loop, what)
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


VTHREAD = "vthread"  # bind(loop, "vthread"): TVM's virtual thread (see bind)


def _is_vthread(f: For) -> bool:
    return f.kind == "unroll" and f.thread == VTHREAD


def _loop_order(program: Program) -> list[int]:
    return [id(n.var) for n in walk(program.body) if isinstance(n, For)]


def _check_bind(ctx: CheckContext) -> poly.Witness | None:
    # formal condition: a threadIdx/blockIdx loop carries no dependence (poly.carried_by); when the step also
    # moved virtual-thread loops inside the thread loops (a reorder), no dependence runs backwards in the new
    # order (poly.find_violation) and the instances are the same. A vthread loop runs serially inside its thread,
    # so it needs no condition of its own beyond that move.
    loop, axis = ctx.args[0], (ctx.args[1] if len(ctx.args) > 1 else VTHREAD)
    if _loop_order(ctx.old) != _loop_order(ctx.new):
        bad = poly.instance_mismatch(ctx.deps, ctx.new)
        if bad is not None:
            raise RuntimeError(f"internal error in primitive bind: {bad}")
        w = poly.find_violation(ctx.deps, ctx.new)
        if w is not None:
            return w
    if axis == VTHREAD:
        return None
    return poly.carried_by(ctx.deps, ctx.new, loop)


def _sink_vthreads(program: Program, band: list[For]) -> Program:
    """Reorder the perfectly nested loops `band` (outermost first) so that its vthread loops come right inside
    its innermost loop that is not a vthread (keeping the relative order of both groups)."""
    plain = [f.var for f in band if not _is_vthread(f)]
    virtual = [f.var for f in band if _is_vthread(f)]
    order = plain + virtual
    if not virtual or order == [f.var for f in band]:
        return program
    return reorder(program, *order)


def _chain_below(f: For) -> list[For]:
    out = [f]
    while isinstance(out[-1].body, For):
        out.append(out[-1].body)  # type: ignore[arg-type]
    return out


def _chain_above(program: Program, f: For) -> list[For]:
    path = loop_path(program, f.var) or [f]
    out = [f]
    for s in reversed(path[:-1]):
        if not (isinstance(s, For) and s.body is out[0]):
            break
        out.insert(0, s)
    return out


def _is_threads(f: For) -> bool:
    return f.kind == "thread" and (f.thread or "").startswith("threadIdx")


def _bind_hint(ctx: CheckContext, w: poly.Witness) -> str:
    if _loop_order(ctx.old) != _loop_order(ctx.new):
        return ("this step moves the virtual-thread (vthread) loops right inside the threadIdx loops below them "
                "(where a vthread runs), and in that order this dependence would run backwards; keep that loop "
                "serial, or make the loops below it free of this dependence first")
    return carried_hint(ctx, w)


@primitive("bind", check=_check_bind, hint=_bind_hint)
def bind(program: Program, loop: Var, axis: str) -> Program:
    """Map `loop` onto a CUDA grid axis ("blockIdx.x|y|z" or "threadIdx.x|y|z"), or make it a virtual
    thread ("vthread").

    Precondition (grid axes): it carries no dependence (a reduction loop is refused for now)::

        for i in range(0, n):   ->   for i in range(0, n):  # blockIdx.x

    A loop of a shared cache_read copy (`s.loops("A_shared")`) can be bound to a threadIdx axis of the block
    around it: the copy stays cooperative, its loop runs threadIdx.a, threadIdx.a + blockDim.a, ... in each
    thread (TVM's copy binding); no two loops of one copy on one axis.

    "vthread" (TVM's virtual thread; also `s.vthread(loop)`): the loop runs serially, unrolled, INSIDE
    each thread and strides the thread's tile — a thread computes i = v*stride + ty*... for each v, so
    neighbouring threads touch neighbouring elements (coalesced, shared-memory banks spread) while each
    thread still owns several. It lowers as a reorder plus unroll the checker already understands: the
    loop moves right inside the innermost threadIdx loop nested perfectly below it (now, or when that
    loop is bound later), and is marked unroll. Precondition: that move is legal (checked exactly
    against the dependences, as reorder is); a constant extent::

        for v in range(0, 2):                 for ty in range(0, 8):  # threadIdx.y
            for ty in range(0, 8):     ->         for v in unroll(0, 2):      # vthread
                S(v*32 + ty*4)                        S(v*32 + ty*4)
    """
    if axis == VTHREAD:
        return _bind_vthread(program, loop)
    if not isinstance(axis, str) or axis not in GPU_AXES:
        raise ArgumentError(f"bind: unknown GPU axis {axis!r}; use one of {', '.join(GPU_AXES)} or 'vthread'")
    f = find_loop(program, loop)
    if f.kind == "parallel" and _is_copy_loop(program, f):
        return _bind_copy_loop(program, f, axis)
    program = _annotate(program, loop, "thread", axis, "bind")
    f = find_loop(program, loop)
    if (axis or "").startswith("threadIdx"):
        above = _chain_above(program, f)
        first = next((k for k, x in enumerate(above) if _is_vthread(x)), None)
        if first is not None:
            program = _sink_vthreads(program, above[first:])
    return program


def _bind_vthread(program: Program, loop: Var) -> Program:
    f = find_loop(program, loop)
    ext = simplify(binary("sub", f.hi, f.lo))
    if not isinstance(ext, Const):
        raise ArgumentError(f"bind: a vthread loop needs a constant extent (it is unrolled inside each thread); "
                            f"loop {loop.name!r} has extent {ext}; split it by a constant first")
    _refuse_copy_loop(program, loop, "bind(..., 'vthread')")
    program = _annotate(program, loop, "unroll", VTHREAD, "bind")
    below = _chain_below(find_loop(program, loop))
    last = max((k for k, x in enumerate(below) if _is_threads(x)), default=None)
    if last is None:
        return program
    end = last + 1
    while end < len(below) and _is_vthread(below[end]):
        end += 1  # vthreads already moved there (bound earlier, so outer ones first): the new one goes after them
    band = below[:end]
    order = [f.var for f in band if not _is_vthread(f)] + [f.var for f in band[1:] if _is_vthread(f)] + [loop]
    return reorder(program, *order) if order != [f.var for f in band] else program


@primitive("vthread", check=_check_bind, hint=_bind_hint)
def vthread(program: Program, loop: Var) -> Program:
    """`bind(loop, "vthread")` (see bind): the loop runs serially, unrolled, inside each thread, moved right
    inside the threadIdx loops perfectly nested below it. Precondition: that move is legal (checked)::

        for v in range(0, 2):                 for ty in range(0, 8):  # threadIdx.y
            for ty in range(0, 8):     ->         for v in unroll(0, 2):
                S(v*32 + ty*4)                        S(v*32 + ty*4)
    """
    return _bind_vthread(program, loop)


def _refuse_copy_loop(program: Program, loop: Var, what: str) -> None:
    f = find_loop(program, loop)
    if f.kind == "parallel" and _is_copy_loop(program, f):
        raise ArgumentError(
            f"{what}: loop {loop.name!r} is a loop of a shared cache_read copy, which the CUDA target unrolls and "
            "copies by 16-byte chunks along its innermost loop where the alignment allows, by itself (leave this "
            "step out); a copy loop can be split, reordered and bound to a threadIdx axis")


def _copy_nest(program: Program, f: For) -> list[For]:
    """The loops of the copy nest that `f` belongs to, outermost first."""
    path = loop_path(program, f.var) or [f]
    top = len(path) - 1
    while top > 0 and isinstance(path[top - 1], For) and path[top - 1].kind == "parallel":  # type: ignore[union-attr]
        top -= 1
    out = [s for s in path[top:] if isinstance(s, For)]
    inner = f.body
    while isinstance(inner, For) and inner.kind == "parallel":
        out.append(inner)
        inner = inner.body
    return out


def _bind_copy_loop(program: Program, f: For, axis: str) -> Program:
    # the copy stays one cooperative copy: its loop runs threadIdx.a, threadIdx.a + blockDim.a, ... in each thread
    # (codegen.cuda.staging._coop_bound), which covers each element once as long as no other loop of the copy
    # takes the same axis; every thread still reaches the copy and the barriers around it stay where they are
    name = f.var.name
    if not axis.startswith("threadIdx"):
        raise ArgumentError(f"bind: loop {name!r} is a loop of a shared cache_read copy inside the block; it can be "
                            f"bound to threadIdx.x|y|z (the block's threads share the copy), not to {axis}")
    if f.thread is not None:
        raise ArgumentError(f"bind: copy loop {name!r} is already bound to {f.thread}")
    twin = next((x for x in _copy_nest(program, f) if x.thread == axis), None)
    if twin is not None:
        raise ArgumentError(f"bind: loop {twin.var.name!r} of the same copy is already bound to {axis}; two loops of "
                            "one copy on one axis would copy some elements twice and skip others")
    path = loop_path(program, f.var) or []
    if not any(isinstance(x, For) and x.kind == "thread" and x.thread == axis for x in path):
        raise ArgumentError(f"bind: no loop around the copy of loop {name!r} is bound to {axis}; bind a copy loop to "
                            "an axis the block's threads use")
    return replace_loop(program, f.var, dataclasses.replace(f, thread=axis))


@primitive("pragma", check=None)
def pragma(program: Program, loop: Var, name: str, value: int | None = None) -> Program:
    """A hint for the code generators on `loop` (TVM's `s[op].pragma(axis, name, value)`). Precondition: none
    (the loop runs in the same order; it changes only how the code is written). Known pragmas:

    * "unroll", n: unroll by n — `#pragma unroll n` (CUDA), `llvm.loop.unroll.count` n (CPU); n == 1 keeps
      the loop rolled (`#pragma unroll 1`, `llvm.loop.unroll.disable`). The loop must be serial.
    * "unroll_explicit": unroll it fully in the generated code, as `s.unroll(loop)` (a constant extent).
    * "cluster", c (2 <= c <= 8): on the loop bound to blockIdx.x, run each of its blocks as a thread-block cluster of
      c blocks (sm_90). The block's threadIdx.x range, up to c x 1024 threads, is spread over the c blocks, and its
      cross-thread reductions and barriers span the cluster. The instances and their order do not change: the kernel
      is the same block of c x T threads. The lowering refuses a cluster kernel that keeps a shared buffer (each
      block would hold its own copy) or binds blockIdx.y / z (the cluster's blocks are its y axis).

    Later steps keep them: reorder and tile move a loop with its pragmas, split gives them to the inner loop,
    collapse and skew to the loop they make, fuse (of two sibling loops) keeps the first loop's::

        for k in range(0, n):   ->   for k in range(0, n):  # pragma unroll 4
    """
    if not isinstance(name, str) or name not in PRAGMAS:
        known = "; ".join(f"{k!r} ({v})" for k, v in PRAGMAS.items())
        raise ArgumentError(f"pragma: unknown pragma {name!r}; known: {known}")
    f = find_loop(program, loop)
    if name == "cluster":
        if isinstance(value, bool) or not isinstance(value, int) or not 2 <= value <= CLUSTER_MAX:
            raise ArgumentError(f"pragma 'cluster' on loop {loop.name!r} needs a cluster size in 2..{CLUSTER_MAX}, "
                                f"got {value!r}")
        if f.thread != "blockIdx.x":
            how = f.thread if f.kind == "thread" else f.kind
            raise ArgumentError(f"pragma 'cluster': loop {loop.name!r} is {how}; a cluster size applies to the loop "
                                "bound to blockIdx.x (bind it first)")
    elif name == "unroll_explicit":
        if value is not None and value is not True:
            raise ArgumentError(f"pragma 'unroll_explicit' takes no value, got {value!r}")
        return _annotate(program, loop, "unroll", None, "pragma unroll_explicit")
    else:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ArgumentTypeError(f"pragma 'unroll' on loop {loop.name!r} needs an integer count, got {value!r}")
        if value < 1:
            raise ArgumentError(f"pragma 'unroll' on loop {loop.name!r}: the count must be >= 1, got {value}")
        if f.kind != "serial":
            how = f.thread if f.kind == "thread" else f.kind
            raise ArgumentError(f"pragma 'unroll': loop {loop.name!r} is {how}; an unroll count applies to a serial "
                                "loop")
    rest = tuple(p for p in f.pragmas if p[0] != name)
    return replace_loop(program, loop, dataclasses.replace(f, pragmas=(*rest, (name, value))))
