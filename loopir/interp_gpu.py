"""The GPU execution mode of the reference interpreter: `interp.run(program, *arrays, gpu_order=...)`.

It runs a program the way the CUDA renderer (codegen/cuda/kernel.py and its parts reduce, staging,
vector) maps it to kernels, with the threads of a block interleaved adversarially, so that a kernel
whose result depends on thread timing (a missing barrier) gives a wrong result on the CPU.

The model (each point is what the renderer emits; the functions cited are in codegen/):

- Launches. Each top-level statement of `program.body` is one kernel, launched in order. A loop of kind
  "host" at the top level is a serial loop of launches: its body's statements are kernels (nested host
  loops allowed). A top-level nest with loops none of which is bound is refused, as `generate_cuda` does.
- Grid and block (`_KernelGen.analyse`). The extent of an axis is the max over the nest's loops bound to
  it of their extents (hi - lo, or the constant side of a `min`); threadIdx.x is rounded up to a multiple
  of 32 when the kernel has a cross-thread reduction. A launch with an empty dimension is skipped; more
  than 1024 threads per block is refused (codegen.cuda.runtime), except in a cluster kernel (the `cluster` pragma
  c on the blockIdx.x loop): its block is the cluster's c x T threads, up to c x 1024, and a cross-thread
  reduction combines each block's T threads as below, then the c totals in rank order
  (`loopir_cluster_allreduce`); its barriers are the cluster's.
- SPMD. Every thread of every block runs the WHOLE kernel body. A loop bound to an axis is
  `v = lo + <index>`, and the thread runs its body only when `v < hi` (`bound_loop`). A statement outside
  every threadIdx-bound loop is executed by every thread, except a Store at thread depth 0 that reads its
  own buffer, executed by thread (0, 0, 0) only (`_KernelGen.stmt`).
- Blocks are unordered: the blocks of a launch run one after the other in the adversarial order
  (see Interleaving), each completely (no synchronisation between blocks exists).
  `shared` buffers are one per block (one per Allocate node, NaN-filled when the block starts, kept
  across the iterations of loops around the Allocate, as a `__shared__` array is); `local` buffers are
  private to a thread and fresh (NaN) at each execution of their Allocate; global buffers are global.
- Cooperative copies (`_StagingEmitter.cooperative`). A nest of "parallel" loops inside a threadIdx-bound
  loop whose one Store fills a shared buffer with thread-independent values, reached by every thread,
  is shared among the block's threads: thread t takes flat iterations t, t + T, ... (T = threads per
  block), in float4 chunks of 4 innermost elements where the renderer emits 128-bit copies.
- Cross-thread reductions (`_ReductionEmitter`). A loop bound to threadIdx.x containing stores
  `C[idx] = C[idx] op e` whose idx does not use that loop (or loops inside it) is a collective: each
  thread accumulates its strided share in a register (from op's identity), reads `C[idx]` (or takes the
  init constant stored just before in the same scope), meets the other threads (as at a barrier),
  receives the total of its row (threads of equal (y, z)), combined in the order of the renderer's warp
  shuffles (`loopir_block_allreduce`), and the row's thread with threadIdx.x == 0 stores
  `C[idx] op total`.
  There is NO barrier after it (barriers are the Barrier nodes of the IR), but, as the renderer
  forwards registers, later loads of exactly `C[idx]` in the same scope read the thread's own total
  (until a store to C). Set `RENDERER_IMPLICIT_SYNCS = True` to model the two `__syncthreads()` the
  renderer still adds by itself today (after a cross-thread reduction and after a thread-0 store, when
  more statements of the block follow).
- Interleaving. Each thread is a Python generator that yields after every Store instance it executes
  (and between the loads and the store of a statement that reads global or shared memory) and at every
  Barrier and collective. A scheduler advances the threads of a block: order "reversed" always runs the
  highest-numbered runnable thread until it blocks, then the next (the threads run in reverse order
  between barriers: a thread reading what a lower-numbered thread writes without a barrier between
  reads it unwritten); "forward" is its mirror (lowest-numbered first: catches reads of what higher
  threads write, which "reversed" orders correctly by construction); an int seed picks a random
  runnable thread at every step. Blocks run in the same order (reversed, in order, or shuffled). A
  barrier releases when every thread of the block waits at it; threads waiting at different barriers,
  or some threads having finished the block while others wait, raise `BarrierDivergenceError`
  ("barrier divergence: ...").

Not modelled (the renderer argues these equal to what is modelled): float4 lane groups of vectorized
loops run as their scalar fallback (the lanes' loads are hoisted above the stores there; `vectorize`
is legal only on a loop that carries no dependence), and the cp.async software pipelining of staged
copies (`pipelined`) runs as the plain copy / barrier / compute loop. Arithmetic, NaN semantics and
bounds checks are the plain interpreter's (numpy scalars in the program's dtypes), not CUDA's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from .errors import ArgumentError, ArgumentTypeError
from .affine import polynomial
from .gpu import (BLOCK_PASSES, REDUCE_OPS, cluster_pragmas, is_fill, is_reduction_loop, reduction_parts,
                  reduction_stores, upper_extent)
from .dtypes import HALVES, is_float
from .interp_compile import _Compiler, _ident
from .te_extern import extern_nest
from .nodes import (
    GPU_AXES,
    Allocate,
    Barrier,
    Buffer,
    Const,
    Expr,
    For,
    If,
    Kernel,
    Load,
    Program,
    Seq,
    Stmt,
    Store,
    Var,
    binary,
    const,
)
from .visit import free_vars, loops_of, path_to, subst_coords, substitute, walk

# The renderer's own __syncthreads() after a cross-thread reduction / a thread-0 store (when statements of the
# block follow). Off: barriers are only the Barrier nodes a lowering pass placed (the renderer's are being removed).
RENDERER_IMPLICIT_SYNCS = False

_AXIS_VAR = {"blockIdx.x": "_bx", "blockIdx.y": "_by", "blockIdx.z": "_bz",
             "threadIdx.x": "_tx", "threadIdx.y": "_ty", "threadIdx.z": "_tz"}
_RESERVED = ("_bufs", "_sizes", "_trace", "_blk", "_bx", "_by", "_bz", "_tx", "_ty", "_tz", "_t", "_T", "_val",
             "_e", "_f", "_lane")
_MAX_THREADS = 1024
ORDERS = ("reversed", "forward")


class BarrierDivergenceError(RuntimeError):
    """Threads of one block wait at different barriers, or some finished while others wait at one."""


class GpuMappingError(ValueError):
    """A program the CUDA renderer would refuse (so there is no GPU execution to model)."""


# ----------------------------------------------------------------------------- the renderer's nest queries
# (the shared decisions live in loopir/gpu.py; tests/test_interp_gpu.py checks the rest against the
# renderer's output)


def _flat(b: Buffer, idx: tuple[Expr, ...]) -> Expr:
    """The row-major flat index of b[idx], built exactly as the renderer's `flat` (register forwarding
    matches loads by structural equality of this expression, of the indices substituted first as the renderer's
    `forward_key` does: `(i * 1) + t` with t = 0 substituted after flattening is not `i`)."""
    if not idx:
        return const(0)
    e = idx[0]
    for s, i in zip(b.shape[1:], idx[1:]):
        e = binary("add", binary("mul", e, s), i)
    return e


def _identity(op: str, dtype: str) -> Any:
    if op == "add":
        return 0
    if op == "mul":
        return 1
    if is_float(dtype):
        return -math.inf if op == "max" else math.inf
    info = np.iinfo(dtype)
    return int(info.min) if op == "max" else int(info.max)


# ----------------------------------------------------------------------------- one kernel, compiled


class _Kernel:
    """One compiled launch: a generator function per thread plus its launch plan and barrier sites."""

    __slots__ = ("name", "fn", "source", "size_vars", "grid", "block", "sites", "stmts", "collectives",
                 "cooperative", "thread0", "from_init", "cluster")

    def __init__(self) -> None:
        self.cluster = 0  # > 0: the block is the threads of a cluster of this many blocks (the `cluster` pragma)
        self.sites: list[tuple[str, str, Any]] = []  # (kind "barrier"|"reduce", description, (op, dtype))
        self.collectives: list[str] = []
        self.cooperative: list[str] = []
        self.thread0: list[str] = []
        self.from_init: list[str] = []  # cross-thread reductions that start from the init constant, not memory


class _KernelCompiler(_Compiler):
    """Compiles one kernel nest into `def k(_bufs, _sizes, _trace, _blk, _bx, _by, _bz, _tx, _ty, _tz, _t,
    _T)`, a generator run once per thread (see the module docstring). Expressions, loads with bounds
    checks and stores are the plain interpreter's; this class adds what the renderer decides."""

    def __init__(self, program: Program, nest: Stmt, name: str, traced: bool, plan: Kernel | None = None) -> None:
        super().__init__(program, traced)
        self.used.update(_RESERVED)
        self.plan = plan  # a lowered program's Kernel node: the pipeline's decisions, read, not remade
        self.nest = plan.body if plan is not None else nest
        nest = self.nest
        self.pred: str | None = None  # predicate of the statements here (a guard around a barrier / reduction)
        self.k = _Kernel()
        self.k.name = name
        self.k.stmts = tuple(dict.fromkeys(n.name for n in walk(nest) if isinstance(n, Store)))
        self.forward: list[dict[tuple, str]] = [{}]  # scoped: (buffer, flat index) -> the register holding it
        self.init_consts: dict[tuple, tuple[dict, str]] = {}  # (buffer, flat) -> (scope, constant)
        self.red_targets: dict[int, tuple[str, str, str]] = {}  # id(store) -> (op, accumulator, dtype)
        self.cur_sub: dict[Var, Expr] = {}
        self.thread_depth = 0
        self.last_store = ""
        self.allocs = 0
        self.tvars = {f.var for f in loops_of(nest) if f.kind == "thread" and (f.thread or "").startswith("threadIdx")}
        self.loopvars = {id(f.var) for f in loops_of(nest)}
        self.has_threads = bool(self.tvars)

    # ---------------------------------------------------------------- launch plan (`analyse`)

    def analyse(self) -> None:
        if self.plan is not None:
            return self._analyse_planned(self.plan)
        loops = loops_of(self.nest)
        if loops and not any(f.kind == "thread" for f in loops) and extern_nest(self.nest) is None:
            names = ", ".join(self.k.stmts)
            raise GpuMappingError(
                f"loop {loops[0].var.name!r} (statements {names}) is not bound to a GPU axis; on target 'cuda' every "
                "top-level nest must be bound (the CUDA renderer refuses it, so there is no GPU execution to model)")
        for f in loops:
            if f.kind == "host":
                raise GpuMappingError(f"host loop {f.var.name!r} is inside a kernel (statements "
                                      f"{', '.join(self.k.stmts)}); host loops may only enclose kernels")
        defined = {f.var for f in loops}
        for n in walk(self.nest):
            if isinstance(n, Store):
                defined.update(n.iters)
        params = set(self.program.params) | (free_vars(self.nest) - defined)
        ext: dict[str, list[Expr]] = {}
        self.extent: dict[int, Expr] = {}
        for f in loops:
            if f.kind != "thread":
                continue
            if f.thread not in GPU_AXES:
                raise GpuMappingError(f"loop {f.var.name!r} is bound to unknown GPU axis {f.thread!r}")
            e = upper_extent(binary("sub", f.hi, f.lo), params)
            if e is None:
                raise GpuMappingError(
                    f"loop {f.var.name!r} bound to {f.thread} has extent {f.hi} - {f.lo}, which varies with another "
                    "loop; a GPU launch extent may depend only on the sizes")
            self.extent[id(f)] = e
            lst = ext.setdefault(f.thread, [])
            if not any(e == x for x in lst):
                lst.append(e)
        self._check_nesting(self.nest, set())
        self.has_reduction = any(is_reduction_loop(f) for f in loops)
        self._check_reductions()
        self.launch: dict[str, Expr] = {}
        for axis, lst in ext.items():
            m = lst[0]
            for x in lst[1:]:
                m = binary("max", m, x)
            if axis == "threadIdx.x" and self.has_reduction:
                m = binary("mul", binary("floordiv", binary("add", m, 31), 32), 32)
            self.launch[axis] = m
        one = const(1)
        self.k.grid = tuple(self.launch.get(f"blockIdx.{a}", one) for a in "xyz")
        self.k.block = tuple(self.launch.get(f"threadIdx.{a}", one) for a in "xyz")
        self.k.cluster = max(cluster_pragmas(loops), default=0)

    def _analyse_planned(self, k: Kernel) -> None:
        """The launch and the decisions of a lowered program's Kernel node (codegen.passes.launch)."""
        self.k.grid, self.k.block, self.k.cluster = k.grid, k.block, k.cluster
        self.launch = {f"{kind}.{a}": e for kind, dims in (("blockIdx", k.grid), ("threadIdx", k.block))
                       for a, e in zip("xyz", dims)}
        self.has_reduction = bool(k.reductions)

    def is_reduction(self, f: For) -> bool:
        return f.var in self.plan.reductions if self.plan is not None else is_reduction_loop(f)

    def guarded(self, f: For) -> bool:
        return f.var in self.plan.guarded if self.plan is not None else True

    def _needs_uniform(self, s: Stmt) -> bool:
        """Every thread must reach `s` (a barrier or a cross-thread reduction inside): guards become predicates."""
        return any(isinstance(n, Barrier) or (isinstance(n, For) and n.kind == "thread" and self.is_reduction(n))
                   for n in walk(s))

    def _check_nesting(self, s: Stmt, seen: set[str]) -> None:
        if isinstance(s, For):
            if s.kind == "thread":
                if s.thread in seen:
                    raise GpuMappingError(f"loop {s.var.name!r} is bound to {s.thread} inside another loop bound to "
                                          f"{s.thread}; an axis can be bound once per nesting path")
                seen = seen | {s.thread}  # type: ignore[operator]
            self._check_nesting(s.body, seen)
        elif isinstance(s, Seq):
            for c in s.body:
                self._check_nesting(c, seen)
        elif isinstance(s, If):
            self._check_nesting(s.then, seen)
            if s.orelse is not None:
                self._check_nesting(s.orelse, seen)
        elif isinstance(s, Allocate):
            self._check_nesting(s.body, seen)

    def _check_reductions(self) -> None:
        def go(s: Stmt, path: list[Stmt]) -> None:
            if isinstance(s, For):
                if is_reduction_loop(s):
                    for p in path:
                        if isinstance(p, For) and p.kind == "thread" and (p.thread or "").startswith("threadIdx"):
                            raise GpuMappingError(
                                f"loop {s.var.name!r} is a cross-thread reduction bound to threadIdx.x inside loop "
                                f"{p.var.name!r} bound to {p.thread}; every thread of the block must reach it")
                        if isinstance(p, If) and free_vars(p.cond) & self.tvars:
                            raise GpuMappingError(
                                f"loop {s.var.name!r} is a cross-thread reduction under condition {p.cond}, which "
                                "depends on a thread index; every thread of the block must reach it")
                    for st in reduction_stores(s):
                        if reduction_parts(st) is None:
                            raise GpuMappingError(
                                f"statement {st.name!r} inside loop {s.var.name!r} (bound to threadIdx.x) writes the "
                                f"same element of {st.buffer.name!r} from every thread, and is not a reduction "
                                f"C = C op e (op in {', '.join(REDUCE_OPS)})")
                go(s.body, path + [s])
            elif isinstance(s, Seq):
                for c in s.body:
                    go(c, path)
            elif isinstance(s, If):
                go(s.then, path + [s])
                if s.orelse is not None:
                    go(s.orelse, path + [s])
            elif isinstance(s, Allocate):
                go(s.body, path)

        go(self.nest, [])

    def _extent_is_launch(self, f: For) -> bool:
        """The renderer emits no guard for f: its extent is its axis's launch extent and hi - lo."""
        if self.plan is not None:
            return f.var not in self.plan.guarded
        e = self.extent[id(f)]
        return e == self.launch[f.thread] and e == binary("sub", f.hi, f.lo)  # type: ignore[index]

    # ---------------------------------------------------------------- sites and registers

    def site(self, kind: str, what: str, extra: Any = None) -> int:
        self.k.sites.append((kind, what, extra))
        return len(self.k.sites) - 1

    def barrier(self, depth: int, what: str) -> None:
        s = self.site("barrier", what)
        self.emit(depth, f"yield {s}")

    def invalidate(self, b: Buffer) -> None:
        for scope in self.forward:
            for key in [key for key in scope if key[0] is b]:
                del scope[key]
        for key in [key for key in self.init_consts if key[0] is b]:
            del self.init_consts[key]

    def load(self, e: Load) -> str:
        key = (e.buffer, _flat(e.buffer, tuple(substitute(i, self.cur_sub) for i in e.indices)))
        for scope in reversed(self.forward):
            if key in scope:
                return scope[key]
        return super().load(e)

    def combine(self, op: str, dtype: str, a: str, b: str) -> str:
        if op == "add":
            return f"({a} + {b})"
        if op == "mul":
            return f"({a} * {b})"
        if is_float(dtype):
            return f"_np.{'maximum' if op == 'max' else 'minimum'}({a}, {b})"
        return f"{op}({a}, {b})"

    # ---------------------------------------------------------------- statements

    def block(self, s: Stmt, depth: int, last: bool = True) -> None:  # type: ignore[override]
        self.forward.append({})
        self.body(s, depth, last)
        self.forward.pop()

    def body(self, s: Stmt, depth: int, last: bool) -> None:
        n = len(self.lines)
        self.stmt(s, depth, last)
        if len(self.lines) == n:
            self.emit(depth, "pass")

    def stmt(self, s: Stmt, depth: int, last: bool = True) -> None:  # type: ignore[override]
        if self.pred is not None and not isinstance(s, Seq) and not self._needs_uniform(s):
            # the renderer's predication: a thread whose guard failed skips what needs no other thread
            self.emit(depth, f"if {self.pred}:")
            saved, self.pred = self.pred, None
            self.body(s, depth + 1, last)
            self.pred = saved
            return
        if isinstance(s, Seq):
            for k, c in enumerate(s.body):
                self.stmt(c, depth, last and k == len(s.body) - 1)
        elif isinstance(s, For):
            self.loop(s, depth, last)
        elif isinstance(s, If) and self.plan is not None and free_vars(s.cond) & self.tvars \
                and self._needs_uniform(s):
            c = self.fresh("cond")
            self.emit(depth, f"{c} = {self.expr(s.cond)}")
            for part, p_ in ((s.then, c), (s.orelse, f"not {c}")):
                if part is None:
                    continue
                saved = self.pred
                self.pred = p_ if saved is None else f"({saved}) and ({p_})"
                self.block(part, depth, last)
                self.pred = saved
        elif isinstance(s, If):
            self.emit(depth, f"if {self.expr(s.cond)}:")
            self.block(s.then, depth + 1, last)
            if s.orelse is not None:
                self.emit(depth, "else:")
                self.block(s.orelse, depth + 1, last)
        elif isinstance(s, Allocate):
            self.allocate(s, depth, last)
        elif isinstance(s, Barrier):
            self.barrier(depth, f"barrier after statement {self.last_store!r}" if self.last_store
                         else "barrier at the start of the kernel")
        elif isinstance(s, Store):
            red = self.red_targets.get(id(s))
            if red is not None:
                self.gpu_store(s, depth, red)
            elif (s.name in self.plan.single_thread if self.plan is not None else
                  self.thread_depth == 0 and self.has_threads and any(
                      isinstance(n, Load) and n.buffer is s.buffer for n in walk(s.value))):
                # every thread would apply the read-modify-write: thread (0, 0, 0) does it
                self.k.thread0.append(s.name)
                self.emit(depth, "if _t == 0:")
                self.gpu_store(s, depth + 1)
                if RENDERER_IMPLICIT_SYNCS and not last:
                    self.barrier(depth, f"the renderer's __syncthreads after the thread-0 statement {s.name!r}")
            else:
                self.gpu_store(s, depth)
        else:
            raise ArgumentTypeError(f"the interpreter cannot execute {type(s).__name__} {s!r}")

    def allocate(self, s: Allocate, depth: int, last: bool) -> None:
        b = s.buffer
        shape = ", ".join(self.expr(d) for d in b.shape)
        name, dims = self.declare_buffer(b)
        shape_t = f"({shape}{',' if b.shape else ''})"
        if b.scope == "shared":  # one array per block (per Allocate node), made by the first thread to reach it
            key = self.allocs
            self.allocs += 1
            self.emit(depth, f"{name} = _blk.get({key})")
            self.emit(depth, f"if {name} is None:")
            self.emit(depth + 1, f"{name} = _blk[{key}] = _alloc({shape_t}, {b.dtype!r})")
        else:  # local (and any other scope): a private array of this thread
            self.emit(depth, f"{name} = _alloc({shape_t}, {b.dtype!r})")
        if dims:
            self.emit(depth, f"{', '.join(dims)}{',' if len(dims) == 1 else ''} = {name}.shape")
        self.stmt(s.body, depth, last)
        del self.bufs[b]

    def gpu_store(self, s: Store, depth: int, red: tuple[str, str, str] | None = None) -> None:
        """A statement instance: into its accumulator register (`red`), or to memory, then `yield`."""
        saved, bound = self.bind_iters(s, depth)
        self.cur_sub = subst_coords(s)
        if self.traced:
            vals = ", ".join(f"int({b})" for b in bound)
            self.emit(depth, f"_trace.append(({s.name!r}, ({vals}{',' if len(bound) == 1 else ''})))")
        if red is not None:
            op, acc, dtype = red
            _, e = reduction_parts(s)  # type: ignore[misc]
            self.emit(depth, f"{acc} = {self.combine(op, dtype, acc, self.expr(e))}")
            self.emit(depth, "yield")
        else:
            self.emit(depth, f"_val = {self.expr(s.value)}")
            if any(isinstance(n, Load) and n.buffer.scope != "local" for n in walk(s.value)):
                self.emit(depth, "yield")  # another thread may write between this statement's loads and its store
            sub, cond, idx = self.indexed(s.buffer, s.indices)
            if cond != "True":
                dims = self.buffer(s.buffer)[1]
                self.emit(depth, f"if not ({cond}):")
                self.emit(depth + 1, f"_oob({s.buffer.name!r}, {idx}, ({', '.join(dims)},), 'store {s.name}')")
            if s.buffer.dtype == "bfloat16":
                self.emit(depth, "_val = _f2bf(_val)")
            self.emit(depth, f"{sub} = _val")
            self.emit(depth, "yield")
        self.unbind_iters(saved)
        if red is None:
            self.invalidate(s.buffer)
            if isinstance(s.value, Const) and s.buffer.dtype not in HALVES:
                # a reduction's init: the cross-thread reduction right after it (same scope) starts from it
                key = (s.buffer, _flat(s.buffer, tuple(substitute(i, self.cur_sub) for i in s.indices)))
                self.init_consts[key] = (self.forward[-1], self.expr(s.value))
        self.cur_sub = {}
        self.last_store = s.name

    # ---------------------------------------------------------------- loops

    def loop(self, f: For, depth: int, last: bool) -> None:
        if extern_nest(f) is not None:  # a te.extern stage: its interp= function on whole arrays, per thread
            return self.extern_stage(f, depth, trace=False)
        if f.var in self.vars:
            raise ArgumentError(f"loop variable {f.var.name!r} is bound by two nested loops")
        if f.kind == "thread":
            if self.is_reduction(f):
                self.reduction_loop(f, depth, last)
            else:
                self.bound_loop(f, depth, lambda d: self.body(f.body, d, last))
            return
        if f.kind in BLOCK_PASSES:  # the block runs the nest once: thread 0 runs its reference loops
            self.emit(depth, "if _t == 0:")
            depth += 1
        planned = self.plan is not None and f.var in self.plan.cooperative
        coop = planned if self.plan is not None else f.kind == "parallel" and self.thread_depth > 0
        if coop and self.cooperative(f, depth):
            return
        lo, hi = self.expr(f.lo), self.expr(f.hi)
        name = self.fresh("v_" + f.var.name)
        self.vars[f.var] = name
        self.emit(depth, f"for {name} in range({lo}, {hi}):")
        self.block(f.body, depth + 1, last)
        del self.vars[f.var]

    def bound_loop(self, f: For, depth: int, body: Callable[[int], None]) -> None:
        assert f.thread is not None
        lo, hi = self.expr(f.lo), self.expr(f.hi)
        name = self.fresh("v_" + f.var.name)
        self.vars[f.var] = name
        self.emit(depth, f"{name} = {lo} + {_AXIS_VAR[f.thread]}")
        is_thread = f.thread.startswith("threadIdx")
        self.thread_depth += is_thread
        self.forward.append({})
        if not self.guarded(f):
            body(depth)
        elif self.plan is not None and is_thread and self._needs_uniform(f.body):
            saved = self.pred
            self.pred = f"{name} < {hi}" if saved is None else f"({saved}) and ({name} < {hi})"
            body(depth)
            self.pred = saved
        else:
            self.emit(depth, f"if {name} < {hi}:")
            body(depth + 1)
        self.forward.pop()
        self.thread_depth -= is_thread
        del self.vars[f.var]

    def reduction_loop(self, f: For, depth: int, last: bool) -> None:
        reds = reduction_stores(f)
        accs: dict[int, tuple[str, str, str]] = {}
        for st in reds:
            op, _ = reduction_parts(st)  # type: ignore[misc]
            acc = self.fresh(f"acc_{st.name}")
            accs[id(st)] = (op, acc, st.buffer.dtype)
            self.emit(depth, f"{acc} = {self.const(_identity(op, st.buffer.dtype), st.buffer.dtype)}")
        saved = self.red_targets
        self.red_targets = {**saved, **accs}
        self.bound_loop(f, depth, lambda d: self.body(f.body, d, last))
        self.red_targets = saved
        for st in reds:
            op, acc, dtype = accs[id(st)]
            self.k.collectives.append(st.name)
            idx = tuple(substitute(i, subst_coords(st)) for i in st.indices)
            flat = _flat(st.buffer, idx)
            cur = self.fresh(f"before_{st.name}")
            init = self.init_consts.get((st.buffer, flat))
            if init is not None and init[0] is self.forward[-1]:  # stored just above in this scope, nothing since
                self.k.from_init.append(st.name)
                self.emit(depth, f"{cur} = {init[1]}")
            elif self.pred is not None:  # a thread outside the guard must not read C[idx] (out of bounds)
                ident = self.const(_identity(op, st.buffer.dtype), st.buffer.dtype)
                ld = _Compiler.load(self, Load(st.buffer, idx))
                self.emit(depth, f"{cur} = ({ld}) if ({self.pred}) else {ident}")
            else:  # read before the collective: thread 0 overwrites it after
                self.emit(depth, f"{cur} = {_Compiler.load(self, Load(st.buffer, idx))}")
            site = self.site("reduce", f"cross-thread reduction of statement {st.name!r}", (op, dtype))
            got, total = self.fresh(f"all_{st.name}"), self.fresh(f"total_{st.name}")
            self.emit(depth, f"{got} = yield ({site}, {acc})")
            self.emit(depth, f"{total} = {self.combine(op, dtype, cur, got)}")
            self.emit(depth, "if _tx == 0:" if self.pred is None else f"if ({self.pred}) and _tx == 0:")
            sub, cond, ix = self.indexed(st.buffer, idx)
            if cond != "True":
                dims = self.buffer(st.buffer)[1]
                self.emit(depth + 1, f"if not ({cond}):")
                self.emit(depth + 2, f"_oob({st.buffer.name!r}, {ix}, ({', '.join(dims)},), 'store {st.name}')")
            self.emit(depth + 1, f"{sub} = {'_f2bf(' + total + ')' if st.buffer.dtype == 'bfloat16' else total}")
            self.emit(depth + 1, "yield")
            self.invalidate(st.buffer)
            self.forward[-1][(st.buffer, flat)] = total
            self.last_store = st.name
        if RENDERER_IMPLICIT_SYNCS and not last:
            self.barrier(depth, f"the renderer's __syncthreads after the reduction {', '.join(s.name for s in reds)}")

    # ---------------------------------------------------------------- cooperative copies (`cooperative`)

    def _uniform_path(self, target: Stmt) -> bool:
        """Every thread of the block reaches `target`: no guarded thread-bound loop, no thread-dependent If."""
        path = path_to(self.nest, target)
        return path is not None and not any(
            (isinstance(s, If) and free_vars(s.cond) & self.tvars)
            or (isinstance(s, For) and s.kind == "thread" and (s.thread or "").startswith("threadIdx")
                and not self._extent_is_launch(s)) for s in path)

    def _aligned_checks(self, flat: Expr, v: Var) -> list[tuple[int, list[Var]]] | None:
        """The renderer's `_aligned_base`: None when flat is not `base + v` with base a multiple of 4; else
        the run-time conditions (coefficient, sizes) whose product must be divisible by 4."""
        p = polynomial(flat)
        if p is None or p.get((id(v),)) != 1:
            return None
        if any(id(v) in k for k in p if k != (id(v),)):
            return None
        byid = {id(x): x for x in free_vars(flat)}
        checks = []
        for k, c in p.items():
            if k == (id(v),) or c % 4 == 0:
                continue
            sizes = [byid[i] for i in k if i not in self.loopvars]
            if not sizes:
                return None
            checks.append((c, sizes))
        return checks

    def cooperative(self, f: For, depth: int) -> bool:
        loops: list[For] = []
        inner: Stmt = f
        while isinstance(inner, For) and inner.kind == "parallel":
            if not (isinstance(inner.lo, Const) and isinstance(inner.hi, Const)) or inner.lo.value != 0:
                return False
            loops.append(inner)
            inner = inner.body
        guard, fill = None, None
        if isinstance(inner, If) and (inner.orelse is None or is_fill(inner.then, inner.orelse)):
            guard, fill, inner = inner.cond, inner.orelse, inner.then  # fill: the zero of codegen.passes.pad
        if not isinstance(inner, Store) or inner.buffer.scope != "shared":
            return False
        sub = subst_coords(inner)
        used = free_vars(substitute(inner.value, sub)) | free_vars(guard if guard is not None else const(0))
        for i in inner.indices:
            used |= free_vars(substitute(i, sub))
        if used & self.tvars or not self._uniform_path(f):
            return False
        for x in loops:
            if x.var in self.vars:
                raise ArgumentError(f"loop variable {x.var.name!r} is bound by two nested loops")
        dims = [int(x.hi.value) for x in loops]  # type: ignore[attr-defined]
        total = math.prod(dims)
        self.k.cooperative.append(inner.name)
        if any(x.thread for x in loops):  # copy loops bound to thread axes: the renderer's `_coop_bound`
            self._coop_bound(loops, dims, inner if guard is None else If(guard, inner, fill), depth)
            self.invalidate(inner.buffer)
            return True
        vec = None
        if guard is None and dims[-1] % 4 == 0 and isinstance(inner.value, Load):
            ld = inner.value
            if (ld.buffer.dtype == "float32" and inner.buffer.dtype == "float32" and ld.buffer.scope == "global"):
                v = loops[-1].var
                src = self._aligned_checks(substitute(_flat(ld.buffer, ld.indices), sub), v)
                dst = self._aligned_checks(substitute(_flat(inner.buffer, inner.indices), sub), v)
                if src is not None and dst == []:
                    vec = src
        names = [self.fresh("v_" + x.var.name) for x in loops]
        for x, nm in zip(loops, names):
            self.vars[x.var] = nm

        def decode(d: int, flat: str) -> None:
            stride = 1
            for nm, dim in reversed(list(zip(names, dims))):
                q = f"({flat} // {stride})" if stride != 1 else flat
                self.emit(d, f"{nm} = {q} % {dim}")
                stride *= dim

        body: Stmt = inner if guard is None else If(guard, inner, fill)

        def scalar(d: int) -> None:  # thread t takes flat iterations t, t + T, ...
            self.emit(d, f"for _e in range(_t, {total}, _T):")
            decode(d + 1, "_e")
            self.stmt(body, d + 1, False)

        def chunks(d: int) -> None:  # float4 copies: thread t takes chunks t, t + T, ... of 4 innermost elements
            self.emit(d, f"for _e in range(_t, {total // 4}, _T):")
            decode(d + 1, "(_e * 4)")
            base = self.fresh("lane_base")
            self.emit(d + 1, f"{base} = {names[-1]}")
            self.emit(d + 1, "for _lane in range(4):")
            self.emit(d + 2, f"{names[-1]} = {base} + _lane")
            self.stmt(body, d + 2, False)

        if vec is None:
            scalar(depth)
        else:
            # the renderer checks at run time that the sizes keep the chunks 16-byte aligned (device pointers are)
            conds = [f"(({c} * {' * '.join(self.expr(s) for s in sizes)}) % 4 == 0)" for c, sizes in vec]
            if conds:
                self.emit(depth, f"if {' and '.join(dict.fromkeys(conds))}:")
                chunks(depth + 1)
                self.emit(depth, "else:")
                scalar(depth + 1)
            else:
                chunks(depth)
        for x in loops:
            del self.vars[x.var]
        self.invalidate(inner.buffer)
        return True

    def _coop_bound(self, loops: list[For], dims: list[int], body: Stmt, depth: int) -> None:
        """A copy loop bound to threadIdx.a runs a, a + blockDim.a, ... below its extent; the others run whole."""
        names = [self.fresh("v_" + x.var.name) for x in loops]
        d = depth
        for x, nm, dim in zip(loops, names, dims):
            self.vars[x.var] = nm
            if x.thread:
                step = self.expr(self.launch.get(x.thread, const(1)))
                self.emit(d, f"for {nm} in range({_AXIS_VAR[x.thread]}, {dim}, {step}):")
            else:
                self.emit(d, f"for {nm} in range({dim}):")
            d += 1
        self.stmt(body, d, False)
        for x in loops:
            del self.vars[x.var]

    # ---------------------------------------------------------------- the generator function

    def compile_kernel(self) -> _Kernel:
        self.analyse()
        p = self.program
        used = {n.buffer for n in walk(self.nest) if isinstance(n, (Load, Store))}
        prologue: list[str] = []
        for k, b in enumerate((*p.args, *p.temps)):
            if b in self.bufs:
                raise ArgumentError(f"buffer {b.name!r} appears twice among the arguments and temps of {p.name!r}")
            name, dims = self.declare_buffer(b)
            if b in used:
                prologue.append(f"    {name} = _bufs[{k}]")
                if dims:
                    prologue.append(f"    {', '.join(dims)}{',' if len(dims) == 1 else ''} = {name}.shape")
        self.body(self.nest, 1, True)
        size_vars = list(self.sizes)
        for k, v in enumerate(size_vars):
            prologue.append(f"    {self.sizes[v]} = _sizes[{k}]")
        fname = f"_kernel_{_ident(self.k.name)}"
        head = f"def {fname}(_bufs, _sizes, _trace, _blk, _bx, _by, _bz, _tx, _ty, _tz, _t, _T):"
        src = "\n".join([head, *prologue, *self.lines, "    return", "    yield"]) + "\n"
        code = compile(src, f"<loopir.interp_gpu {p.name}:{self.k.name}>", "exec")
        ns = dict(self.ns)
        exec(code, ns)  # the source is generated from the IR above, never from user text
        self.k.fn = ns[fname]
        self.k.source = src
        self.k.size_vars = tuple(size_vars)
        return self.k


__all__ = ["BarrierDivergenceError", "GpuMappingError", "RENDERER_IMPLICIT_SYNCS", "ORDERS"]
