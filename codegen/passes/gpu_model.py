"""How a kernel's statements map onto a CUDA block: the facts the GPU passes share.

One kernel is a maximal statement of the program that is not a `host` loop (kernel boundaries
are decided before this model is read). Inside it:

- a loop bound to `blockIdx.*` enumerates blocks; blocks never synchronise with each other;
- a loop bound to `threadIdx.*` is `v = lo + threadIdx` with a guard `v < hi` when its extent can
  be smaller than the launch extent of its axis (the launch extent is the largest extent bound to
  that axis; x is rounded up to whole warps when the kernel has a cross-thread reduction);
- every thread runs the rest (SPMD): statements outside every thread loop run on every thread;
- a "parallel" nest inside thread loops (a cooperative copy) is spread over the block's threads,
  so which thread runs one of its instances is not known here: "any thread";
- a loop bound to threadIdx.x holding `C[idx] = C[idx] op e` with `idx` free of the loop's
  variables is a *cross-thread reduction*: the threads' shares meet in one synchronising
  all-reduce, then one thread applies the total to `C[idx]`.

Control flow is *lockstep* where every thread of the block takes the same path: inside no
guarded thread loop, no condition on a thread index, no loop whose bounds use one. A block
barrier may only stand in lockstep control flow.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from loopir import nodes as N
from loopir.visit import free_vars, substitute, walk

THREAD_AXES = ("threadIdx.x", "threadIdx.y", "threadIdx.z")
BLOCK_AXES = ("blockIdx.x", "blockIdx.y", "blockIdx.z")
REDUCE_OPS = ("add", "mul", "max", "min")


def kernels(program: N.Program) -> Iterator[N.Stmt]:
    """The kernels of `program` in launch order: top-level statements and the bodies of host loops."""
    def go(s: N.Stmt) -> Iterator[N.Stmt]:
        if isinstance(s, N.Seq):
            for c in s.body:
                yield from go(c)
        elif isinstance(s, N.For) and s.kind == "host":
            yield from go(s.body)
        else:
            yield s

    yield from go(program.body)


def loops_of(s: N.Stmt) -> list[N.For]:
    return [n for n in walk(s) if isinstance(n, N.For)]


def is_thread_loop(f: N.For) -> bool:
    return f.kind == "thread" and (f.thread or "").startswith("threadIdx")


def is_block_loop(f: N.For) -> bool:
    return f.kind == "thread" and (f.thread or "").startswith("blockIdx")


def subst_coords(st: N.Store) -> dict[N.Var, N.Expr]:
    return dict(zip(st.iters, st.coords))


def reduction_stores(f: N.For) -> list[N.Store]:
    """The stores inside `f` whose index uses neither f's variable nor a loop inside f."""
    inner = {x.var for x in loops_of(f)}
    out = []
    for n in walk(f.body):
        if isinstance(n, N.Store):
            idx = tuple(substitute(i, subst_coords(n)) for i in n.indices)
            used = set().union(*(free_vars(i) for i in idx)) if idx else set()
            if not (used & inner):
                out.append(n)
    return out


def reduction_parts(st: N.Store) -> tuple[str, N.Expr] | None:
    """(op, e) when st is `C[idx] = C[idx] op e` (either operand order), else None."""
    v = st.value
    if not isinstance(v, N.Binary) or v.op not in REDUCE_OPS:
        return None
    self_load = N.Load(st.buffer, st.indices)
    if v.a == self_load:
        return v.op, v.b
    if v.b == self_load:
        return v.op, v.a
    return None


def is_reduction_loop(f: N.For) -> bool:
    """A loop bound to threadIdx.x that the CUDA target lowers to a cross-thread reduction."""
    return f.kind == "thread" and f.thread == "threadIdx.x" and bool(reduction_stores(f))


def _is_const(e: N.Expr) -> bool:
    return isinstance(e, N.Const)


def _upper_extent(ext: N.Expr, allowed: set[N.Var]) -> N.Expr | None:
    """An upper bound of `ext` using only `allowed` vars (min(a, b) -> a side that qualifies)."""
    if free_vars(ext) <= allowed:
        return ext
    if isinstance(ext, N.Binary) and ext.op == "min":
        for side in (ext.a, ext.b):
            ub = _upper_extent(side, allowed)
            if ub is not None:
                return ub
    return None


@dataclass(frozen=True)
class KernelModel:
    """The block-level facts of one kernel (see the module docstring)."""

    nest: N.Stmt
    thread_axes: frozenset[str]  # threadIdx axes some loop of the kernel is bound to
    block_axes: frozenset[str]
    guarded: frozenset[int]  # id() of thread loops that carry a `v < hi` guard
    divergent_vars: frozenset[N.Var]  # thread loop variables and cooperative copy loop variables
    reduction_loops: frozenset[int]  # id() of cross-thread reduction loops

    def is_coop(self, f: N.For, inside_thread: bool) -> bool:
        return f.kind == "parallel" and inside_thread

    def uniform(self, e: N.Expr) -> bool:
        """True when `e` has the same value on every thread of a block."""
        return not (free_vars(e) & self.divergent_vars)


def kernel_model(nest: N.Stmt, params: set[N.Var]) -> KernelModel:
    loops = loops_of(nest)
    bound = [f for f in loops if f.kind == "thread"]
    ext: dict[str, list[N.Expr]] = {}
    own: dict[int, N.Expr | None] = {}
    for f in bound:
        e = _upper_extent(N.binary("sub", f.hi, f.lo), params | _size_like(nest, params))
        own[id(f)] = e
        if e is not None and not any(e == x for x in ext.setdefault(f.thread or "", [])):
            ext[f.thread or ""].append(e)
    reds = frozenset(id(f) for f in bound if is_reduction_loop(f))
    guarded = set()
    for f in bound:
        if not is_thread_loop(f):
            continue
        e = own[id(f)]
        lst = ext.get(f.thread or "", [])
        exact = e is not None and e == N.binary("sub", f.hi, f.lo) and len(lst) == 1
        if f.thread == "threadIdx.x" and reds and not (isinstance(e, N.Const) and int(e.value) % 32 == 0):
            exact = False
        if not exact:
            guarded.add(id(f))
    div: set[N.Var] = {f.var for f in bound if is_thread_loop(f)}

    def coop(s: N.Stmt, inside: bool) -> None:
        if isinstance(s, N.For):
            if s.kind == "parallel" and inside:
                div.add(s.var)
            coop(s.body, inside or is_thread_loop(s))
        elif isinstance(s, N.Seq):
            for c in s.body:
                coop(c, inside)
        elif isinstance(s, N.If):
            coop(s.then, inside)
            if s.orelse is not None:
                coop(s.orelse, inside)
        elif isinstance(s, N.Allocate):
            coop(s.body, inside)

    coop(nest, False)
    return KernelModel(
        nest,
        frozenset(f.thread for f in bound if is_thread_loop(f) and f.thread),
        frozenset(f.thread for f in bound if is_block_loop(f) and f.thread),
        frozenset(guarded), frozenset(div), reds)


def _size_like(nest: N.Stmt, params: set[N.Var]) -> set[N.Var]:
    """Free variables of the kernel that are neither loop nor iteration variables: sizes and host loop vars."""
    defined = {f.var for f in loops_of(nest)}
    for n in walk(nest):
        if isinstance(n, N.Store):
            defined.update(n.iters)
    return (free_vars(nest) - defined) | params


__all__ = ["kernels", "kernel_model", "KernelModel", "reduction_stores", "reduction_parts", "is_reduction_loop",
           "is_thread_loop", "is_block_loop", "THREAD_AXES", "BLOCK_AXES", "loops_of", "subst_coords"]
