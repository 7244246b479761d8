"""Loop IR -> CUDA C: one `extern "C" __global__` kernel per top-level nest bound to GPU axes.

How a program maps to kernels
-----------------------------
* Each kernel of the program (`codegen.passes.kernels.kernels`: each statement at host level, i.e.
  each top-level statement of `program.body` and each statement of a host loop's body) is one nest.
  A nest with at least one loop of kind "thread" becomes one kernel; a nest without any loop (a
  scalar statement) becomes a one-thread kernel; a nest with loops but none bound is refused
  (`UnboundLoopError`, naming the loop and saying to `bind` it or use `auto_schedule`).
* A host loop (kind "host", made by the pass `split_kernels` from a serial loop around grid-bound
  loops) is a loop of launches on the host (`CudaSource.launches`: `HostLoop` / `HostIf` / `Launch`);
  its variable is a `long long` parameter of the kernels inside it, and their launch dims may use it.
* A bound loop `for v in lo..hi bound to threadIdx.x` becomes `const long long v = lo + threadIdx.x;`
  and, when the launch extent may exceed `hi - lo`, `if (v < hi) {...}`. Several loops may be
  bound to the same axis in one block (phases of a row softmax): the launch extent of an axis is
  the max of their extents and each is guarded. A launch extent uses size parameters (and host loop
  variables) only: an extent that varies with another loop (the block index of a compute_at'd
  producer's clipped tile) is launched at its maximum over the loops around it, found by isl
  (`isl_upper_extent`: exact when isl's piecewise maximum is a max / min of its pieces, else an upper
  bound; `min(c, ...)` whose constant side bounds it first), and the loop keeps its exact guard; an
  extent isl cannot bound (non-affine, unbounded) is refused.
* The launch plan (grid and block per kernel) is kept as loopir expressions over the size
  parameters, evaluated at call time (`LaunchPlan.dims(sizes)`).
* Serial/parallel/unroll loops inside a kernel are plain `for` loops (`#pragma unroll` for unroll).
* Index arithmetic is 64-bit (`long long`), except in a kernel whose sizes are all known at build time and
  small enough (`_fits_int32`: every buffer's padded element count below 2**31): there it is 32-bit `int`,
  which saves registers. Symbolic sizes keep 64-bit (a size may pass 2**31). `//` and `%` follow Python (floor).
* float16 is stored as 16-bit words and computed in float, converted with the PTX `cvt`
  instructions (no `cuda_fp16.h`: the pip NVRTC ships without CUDA headers).

The parts of the generator, each a mixin of `_KernelGen` or a text module:
`codegen.cuda_expr` (C types and names, launch-size evaluation, affine forms, expression rendering),
`codegen.cuda_vector` (float4 lane loops and alignment proofs), `codegen.cuda_reduce` (cross-thread
reductions), `codegen.cuda_staging` (cooperative shared-memory copies, cp.async double buffering),
`codegen.cuda_prelude` (the device helper functions and macros).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from loopir import nodes as N
from loopir.visit import free_vars, substitute, walk

from .cuda_expr import (  # noqa: F401  (re-exported: tests and callers import them from codegen.cuda)
    _AXES,
    _C_KEYWORDS,
    _CTYPE,
    _INT32_SLACK,
    _NPTYPE,
    _STORAGE,
    CudaCodegenError,
    UnboundLoopError,
    _body_list,
    _bound_paths,
    _ExprEmitter,
    _fits_int32,
    _is_const,
    _loops,
    _Names,
    _poly,
    _sanitize,
    _stmt_names,
    _subst_coords,
    eval_index,
    isl_max,
    isl_upper_extent,
)
from .cuda_prelude import PRELUDE, PRELUDE_ASYNC, PRELUDE_HALF, PRELUDE_REDUCE, PRELUDE_SUBWARP
from .cuda_reduce import _RED_OPS, _identity, _reduction_parts, _ReductionEmitter  # noqa: F401
from .cuda_staging import _StagingEmitter
from .cuda_vector import _VEC_SCOPES, _monotone_guard, _VectorEmitter  # noqa: F401

# software pipelining of shared block-tile copies (`_KernelGen.pipelined`); off: the plain copy, barrier, compute
PIPELINE_SHARED_COPIES = True
# __launch_bounds__(threads, LAUNCH_MIN_BLOCKS) on kernels with pipelined copies and a constant block size
LAUNCH_MIN_BLOCKS: int | None = None


# ----------------------------------------------------------------------------- results


@dataclass(frozen=True)
class KernelArg:
    """One kernel parameter: a buffer (pointer) or a size parameter (long long)."""

    name: str
    buffer: N.Buffer | None = None
    var: N.Var | None = None
    written: bool = False


@dataclass(frozen=True)
class LaunchPlan:
    """grid and block of one kernel as loopir index expressions over the size parameters."""

    grid: tuple[N.Expr, N.Expr, N.Expr]
    block: tuple[N.Expr, N.Expr, N.Expr]

    def dims(self, sizes: dict[N.Var, int]) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        return (tuple(eval_index(e, sizes) for e in self.grid),  # type: ignore[return-value]
                tuple(eval_index(e, sizes) for e in self.block))


@dataclass(frozen=True)
class Kernel:
    name: str
    args: tuple[KernelArg, ...]
    launch: LaunchPlan
    stmt_names: tuple[str, ...]


@dataclass(frozen=True)
class Launch:
    """Launch `CudaSource.kernels[kernel]`."""

    kernel: int


@dataclass(frozen=True)
class HostLoop:
    """for var in range(lo, hi) on the host: run `body` (launches, loops) once per iteration."""

    var: N.Var
    lo: N.Expr
    hi: N.Expr
    body: tuple[HostStep, ...]


@dataclass(frozen=True)
class HostIf:
    """if cond (sizes and host loop variables only) on the host."""

    cond: N.Expr
    then: tuple[HostStep, ...]
    orelse: tuple[HostStep, ...] = ()


HostStep = Launch | HostLoop | HostIf


@dataclass(frozen=True)
class CudaSource:
    """The generated source, its kernels, and the launch sequence one call runs (in order)."""

    source: str
    kernels: tuple[Kernel, ...]
    program: N.Program
    launches: tuple[HostStep, ...] = ()

    def launch_plan(self) -> str:
        """The launch sequence as text: `launch scan_S0`, `for t in host(1, T):` with its launches indented."""
        from loopir.printer import expr_str

        lines: list[str] = []

        def go(steps: tuple[HostStep, ...], ind: str) -> None:
            for st in steps:
                if isinstance(st, Launch):
                    k = self.kernels[st.kernel]
                    grid = ", ".join(str(e) for e in k.launch.grid)
                    block = ", ".join(str(e) for e in k.launch.block)
                    lines.append(f"{ind}launch {k.name} grid ({grid}) block ({block})")
                elif isinstance(st, HostLoop):
                    lines.append(f"{ind}for {st.var.name} in host({expr_str(st.lo)}, {expr_str(st.hi)}):")
                    go(st.body, ind + "    ")
                else:
                    lines.append(f"{ind}if {expr_str(st.cond)}:")
                    go(st.then, ind + "    ")
                    if st.orelse:
                        lines.append(f"{ind}else:")
                        go(st.orelse, ind + "    ")

        go(self.launches or tuple(Launch(k) for k in range(len(self.kernels))), "")
        return "\n".join(lines)


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


class _KernelGen(_ExprEmitter, _ReductionEmitter, _StagingEmitter, _VectorEmitter):
    """Emits one kernel for one top-level nest: launch planning and statements here; expressions, float4
    accesses, cross-thread reductions and shared-memory staging in the mixins (see the module docstring)."""

    def __init__(self, program: N.Program, nest: N.Stmt, name: str, is_last_kernel_stmt: bool = True,
                 host_vars: tuple[N.Var, ...] = ()):
        self.program = program
        self.nest = nest
        self.host_vars = frozenset(host_vars)  # variables of the host loops around the kernel: parameters
        self.kname = name
        self.names = _Names()
        self.lines: list[str] = []
        self.ind = 1
        self.uses_half = False
        self.uses_reduce = False
        self.uses_subwarp = False
        self.subwarp = 0  # > 0: cross-thread reductions are within segments of this many lanes of a warp
        self.red_smem: dict[str, str] = {}  # C type -> shared array name
        self.forward: list[dict[tuple, str]] = [{}]  # scoped: (buffer id, flat index expr) -> register
        self.vec_lanes: dict[N.Load, str] = {}
        self.red_targets: dict[int, str] = {}
        self.init_consts: dict[tuple, tuple[dict, str]] = {}  # (buffer id, flat index) -> (scope, constant)
        self.pre: dict[N.Expr, str] = {}  # sin/cos of one argument computed once by sincosf
        self.cur_sub: dict[N.Var, N.Expr] = {}
        self.thread_depth = 0
        self.has_threads = False
        self.ix = "long long"  # the C type of index arithmetic: "int" when every size provably fits
        self.uses_async = False
        self.pred: str | None = None  # C condition: does this thread really run the statements here (predication)
        self.uniform_memo: dict[int, bool] = {}
        self.pipeline_copies = PIPELINE_SHARED_COPIES  # read per kernel: setting codegen.cuda.X works

    # ---------------------------------------------------------------- analysis
    def analyse(self) -> LaunchPlan:
        loops = _loops(self.nest)
        bound = [f for f in loops if f.kind == "thread"]
        params = set(self.program.params) | self._size_vars()
        ext: dict[str, list[N.Expr]] = {}
        self.extent: dict[int, N.Expr] = {}
        paths = None
        varying: set[str] = set()  # axes with an extent bounded by isl: their launch max is simplified by isl too
        for f in bound:
            if f.thread not in N.GPU_AXES:
                raise CudaCodegenError(f"loop {f.var.name!r} is bound to unknown GPU axis {f.thread!r}; "
                                       f"use one of {', '.join(N.GPU_AXES)}")
            e = _upper_extent(N.binary("sub", f.hi, f.lo), params)
            if e is None:
                # an extent that varies with the block index (a compute_at'd producer's clipped tile): launch
                # its exact maximum over the loops around it; the loop keeps its exact guard
                if paths is None:
                    paths = _bound_paths(self.nest)
                e = isl_upper_extent(f, *paths[id(f)])
                if e is not None and not free_vars(e) <= params:
                    e = None
                varying.add(f.thread)
            if e is None:
                raise CudaCodegenError(
                    f"loop {f.var.name!r} bound to {f.thread} has extent {f.hi} - {f.lo}, which varies with "
                    "another loop and has no maximum isl can find over those loops (non-affine or unbounded); "
                    "a GPU launch extent may depend only on the sizes "
                    f"({', '.join(sorted(p.name for p in params)) or 'none'})")
            self.extent[id(f)] = e
            lst = ext.setdefault(f.thread, [])
            if not any(e == x for x in lst):
                lst.append(e)
        self._check_nesting(self.nest, set())
        self.has_reduction = any(self._is_reduction_loop(f) for f in bound)
        launch: dict[str, N.Expr] = {}
        for axis, lst in ext.items():
            m = lst[0]
            for x in lst[1:]:
                m = N.binary("max", m, x)
            if axis in varying and len(lst) > 1:
                simpler = isl_max(m)
                m = m if simpler is None else simpler
            launch[axis] = m
        self.subwarp = self.subwarp_width(launch) if self.has_reduction else 0
        if "threadIdx.x" in launch and self.has_reduction and not self.subwarp:
            m = launch["threadIdx.x"]
            launch["threadIdx.x"] = N.binary("mul", N.binary("floordiv", N.binary("add", m, 31), 32), 32)
        self.launch = launch
        one = N.const(1)
        grid = tuple(launch.get("blockIdx." + a, one) for a in _AXES)
        block = tuple(launch.get("threadIdx." + a, one) for a in _AXES)
        return LaunchPlan(grid, block)  # type: ignore[arg-type]

    def _size_vars(self) -> set[N.Var]:
        defined = {f.var for f in _loops(self.nest)}
        for n in walk(self.nest):
            if isinstance(n, N.Store):
                # an iteration variable that is a host loop's own variable (coordinate t = t) is a parameter
                defined.update(v for v in n.iters if v not in self.host_vars)
        return free_vars(self.nest) - defined

    def _check_nesting(self, s: N.Stmt, seen: set[str]) -> None:
        if isinstance(s, N.For):
            if s.kind == "thread":
                if s.thread in seen:
                    raise CudaCodegenError(f"loop {s.var.name!r} is bound to {s.thread} inside another loop bound "
                                           f"to {s.thread}; an axis can be bound once per nesting path")
                seen = seen | {s.thread}
            self._check_nesting(s.body, seen)
        elif isinstance(s, N.Seq):
            for c in s.body:
                self._check_nesting(c, seen)
        elif isinstance(s, N.If):
            self._check_nesting(s.then, seen)
            if s.orelse is not None:
                self._check_nesting(s.orelse, seen)
        elif isinstance(s, N.Allocate):
            self._check_nesting(s.body, seen)


    # ---------------------------------------------------------------- statements
    def stmt(self, s: N.Stmt, last: bool) -> None:
        if self.pred is not None and not self._needs_uniform(s):
            self.under_pred(s, last)  # a thread whose guard failed skips it (codegen.cuda_reduce)
        elif isinstance(s, N.Seq):
            for k, c in enumerate(s.body):
                self.stmt(c, last and k == len(s.body) - 1)
        elif isinstance(s, N.For):
            self.loop(s, last)
        elif isinstance(s, N.If) and self._needs_uniform(s) and self._thread_dependent(s.cond):
            self.predicated_if(s, last)
        elif isinstance(s, N.If):
            self.line(f"if ({self.expr(s.cond)}) {{")
            self.block(s.then, last)
            if s.orelse is not None:
                self.line("} else {")
                self.block(s.orelse, last)
            self.line("}")
        elif isinstance(s, N.Allocate):
            self.allocate(s, last)
        elif isinstance(s, N.Barrier):
            self.line("__syncthreads();")
        elif isinstance(s, N.Store):
            target = self.red_targets.get(id(s))
            if target is None and self.thread_depth == 0 and self.has_threads and self._reads_itself(s):
                # every thread of the block would apply a read-modify-write: let one thread do it
                self.line("if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {")
                self.ind += 1
                self.store(s)
                self.ind -= 1
                self.line("}")
                if not last:
                    self.line("__syncthreads();")
            else:
                self.store(s, target)
        else:
            raise CudaCodegenError(f"cannot emit statement {type(s).__name__} in CUDA")

    def block(self, s: N.Stmt, last: bool) -> None:
        self.ind += 1
        self.forward.append({})
        self.stmt(s, last)
        self.forward.pop()
        self.ind -= 1

    def allocate(self, s: N.Allocate, last: bool) -> None:
        b = s.buffer
        size = N.const(1)
        for d in b.shape:
            size = N.binary("mul", size, d)
        if not _is_const(size):
            raise CudaCodegenError(f"{b.scope} buffer {b.name!r} has non-constant size {size}; "
                                   "shared and local allocations need a constant shape")
        if b.dtype == "float16":
            self.uses_half = True
        qual = "__shared__ __align__(16) " if b.scope == "shared" else ""
        self.line(f"{qual}{_STORAGE[b.dtype]} {self.buf(b)}[{int(size.value)}];  // {b.scope} {b.name}")  # type: ignore[attr-defined]
        self.stmt(s.body, last)

    def store(self, st: N.Store, target: str | None = None) -> None:
        """Emit st; with `target`, emit `target = value` into a register instead."""
        self.open_store(st)
        self.sincos(st.value)
        if target is not None:
            op, e = _reduction_parts(st)  # type: ignore[misc]
            val = self.red_combine(op, target, self.expr(e))
            self.line(f"{target} = {val};")
        else:
            flat = self.flat(st.buffer, st.indices)
            val = self.expr(st.value)
            if st.buffer.dtype == "float16":
                self.uses_half = True
                val = f"loopir_f2h({val})"
            elif _CTYPE[st.value.dtype] != _CTYPE[st.buffer.dtype]:
                val = f"({_STORAGE[st.buffer.dtype]})({val})"
            self.line(f"{self.buf(st.buffer)}[{self.expr(flat)}] = {val};")
            self._invalidate(st.buffer)
            if isinstance(st.value, N.Const) and st.buffer.dtype != "float16":
                # a reduction's init (C[i] = identity): the cross-thread reduction right after it in this
                # scope starts from this constant instead of reading C[i] back from global memory
                self.init_consts[(id(st.buffer), substitute(flat, self.cur_sub))] = (self.forward[-1], val)
        self.cur_sub = {}
        self.pre = {}
        self.ind -= 1
        self.line("}")


    def _reads_itself(self, st: N.Store) -> bool:
        return any(isinstance(n, N.Load) and n.buffer is st.buffer for n in walk(st.value))

    def _invalidate(self, b: N.Buffer) -> None:
        for scope in self.forward:
            for k in [k for k in scope if k[0] == id(b)]:
                del scope[k]
        for k in [k for k in self.init_consts if k[0] == id(b)]:
            del self.init_consts[k]


    def loop(self, f: N.For, last: bool) -> None:
        v = self.var(f.var)
        if f.kind == "thread":
            if self._is_reduction_loop(f):
                return self.reduction_loop(f, last)
            self.bound_loop(f, lambda: self.stmt(f.body, last))
            return None
        if f.kind == "vectorize" and self.try_vector(f):
            return None
        if f.kind == "parallel" and self.thread_depth > 0 and self.cooperative(f):
            return None
        if f.kind == "serial" and self.thread_depth > 0 and self.pipelined(f, last):
            return None
        if f.kind in ("unroll", "vectorize"):
            self.line("#pragma unroll")
        self.line(f"for ({self.ix} {v} = {self.expr(f.lo)}; {v} < {self.expr(f.hi)}; ++{v}) {{")
        self.block(f.body, last)
        self.line("}")
        return None

    def bound_loop(self, f: N.For, body) -> None:
        v = self.var(f.var)
        axis = f.thread
        idx = f"({self.ix}){axis}"
        self.line(f"{{  // loop {f.var.name} bound to {axis}")
        self.ind += 1
        zero_lo = isinstance(f.lo, N.Const) and f.lo.value == 0
        self.line(f"const {self.ix} {v} = {idx}" + ("" if zero_lo else f" + {self.expr(f.lo)}") + ";")
        is_thread = axis.startswith("threadIdx")
        self.thread_depth += is_thread
        needs_guard = not (self.extent[id(f)] == self.launch[axis]) or self.extent[id(f)] != N.binary("sub", f.hi, f.lo)
        self.forward.append({})
        if needs_guard and is_thread and self._needs_uniform(f.body):
            # a cross-thread reduction inside: every thread must reach it, so the guard becomes a predicate
            self.with_pred(f"({v} < {self.expr(f.hi)})", body)
        elif needs_guard:
            self.line(f"if ({v} < {self.expr(f.hi)}) {{")
            self.ind += 1
            body()
            self.ind -= 1
            self.line("}")
        else:
            body()
        self.forward.pop()
        self.thread_depth -= is_thread
        self.ind -= 1
        self.line("}")


    # ---------------------------------------------------------------- the kernel
    def generate(self) -> tuple[str, Kernel]:
        plan = self.analyse()
        self.has_threads = any(f.kind == "thread" and f.thread.startswith("threadIdx") for f in _loops(self.nest))
        self.check_reductions()
        reads, writes = set(), set()
        for n in walk(self.nest):
            if isinstance(n, N.Load):
                reads.add(n.buffer)
            elif isinstance(n, N.Store):
                writes.add(n.buffer)
        globals_ = [b for b in (*self.program.args, *self.program.temps) if b in reads or b in writes]
        for b in reads | writes:
            if b.scope == "global" and b not in globals_:
                raise CudaCodegenError(f"buffer {b.name!r} is neither an argument nor a temp of program "
                                       f"{self.program.name!r}")
        sizes = sorted(self._size_vars() | {v for b in globals_ for d in b.shape for v in free_vars(d)},
                       key=lambda v: (v not in self.program.params, self.program.params.index(v)
                                      if v in self.program.params else 0, v.name))
        args: list[KernelArg] = []
        params: list[str] = []
        for b in globals_:
            nm = self.buf(b)
            w = b in writes
            st = _STORAGE[b.dtype]
            params.append(f"{'' if w else 'const '}{st}* __restrict__ {nm}")
            args.append(KernelArg(nm, buffer=b, written=w))
        for s in sizes:
            nm = self.var(s)
            params.append(f"const long long {nm}")
            args.append(KernelArg(nm, var=s))
        self.ix = "int" if not sizes and _fits_int32(self.nest) else "long long"
        self.lines = []
        self.ind = 1
        body_start = len(self.lines)
        self.stmt(self.nest, True)
        body = self.lines[body_start:]
        bounds = ""
        nthreads = [e for e in plan.block]
        if self.uses_async and LAUNCH_MIN_BLOCKS and all(_is_const(e) for e in nthreads):
            bounds = f"__launch_bounds__({math.prod(int(e.value) for e in nthreads)}, {LAUNCH_MIN_BLOCKS}) "  # type: ignore[attr-defined]
        head = [f'extern "C" __global__ void {bounds}{self.kname}(' + ", ".join(params) + ") {"]
        stmts = ", ".join(dict.fromkeys(_stmt_names(self.nest)))
        launch = (f"  // statements: {stmts}; grid ({', '.join(str(e) for e in plan.grid)}), "
                  f"block ({', '.join(str(e) for e in plan.block)})")
        decl = [f"  __shared__ {ct} {nm}[32];  // cross-thread reduction scratch" for ct, nm in self.red_smem.items()]
        text = "\n".join(head + [launch] + decl + body + ["}"])
        return text, Kernel(self.kname, tuple(args), plan, tuple(dict.fromkeys(_stmt_names(self.nest))))


def _host_expr(e: N.Expr, what: str) -> N.Expr:
    if any(isinstance(n, N.Load) for n in walk(e)):
        raise CudaCodegenError(f"{what} {e} reads a buffer; a host loop's bounds and the conditions around it "
                               "are evaluated on the host and may use only sizes and host loop variables")
    return e


def generate_cuda(program: N.Program) -> CudaSource:
    """CUDA C for `program`: one kernel per nest at host level, launched as `CudaSource.launches` says
    (see the module docstring)."""
    from .passes.kernels import has_host_loops

    names = _Names()
    texts: list[str] = []
    kernels: list[Kernel] = []
    flags = {"half": False, "reduce": False, "subwarp": False, "async": False}

    def kernel(nest: N.Stmt, host_vars: tuple[N.Var, ...]) -> int:
        k = len(kernels)
        loops = _loops(nest)
        if loops and not any(f.kind == "thread" for f in loops):
            outer = loops[0]
            stmts = ", ".join(dict.fromkeys(_stmt_names(nest)))
            raise UnboundLoopError(
                f"loop {outer.var.name!r} (statements {stmts}) is not bound to a GPU axis; on target 'cuda' "
                f"every top-level nest must be bound: bind it (e.g. s.split({outer.var.name}, 256) then "
                "s.bind(outer, 'blockIdx.x').bind(inner, 'threadIdx.x')) or use auto_schedule")
        first = (_stmt_names(nest) or [f"nest{k}"])[0]
        kname = names.fresh(f"{program.name}_{first}")
        gen = _KernelGen(program, nest, kname, host_vars=host_vars)
        text, kern = gen.generate()
        if host_vars:  # say where it runs: the source alone shows the time loop is not inside the kernel
            head, rest = text.split("\n", 1)
            loops_ = ", ".join(v.name for v in host_vars)
            text = f"{head}\n  // launched once per iteration of the host loop(s) {loops_}\n{rest}"
        flags["half"] |= gen.uses_half
        flags["reduce"] |= gen.uses_reduce
        flags["subwarp"] |= gen.uses_subwarp
        flags["async"] |= gen.uses_async
        texts.append(text)
        kernels.append(kern)
        return k

    def host(s: N.Stmt, top: bool, host_vars: tuple[N.Var, ...]) -> tuple[HostStep, ...]:
        if isinstance(s, N.Seq) and (top or has_host_loops(s)):
            return tuple(x for c in s.body for x in host(c, False, host_vars))
        if isinstance(s, N.For) and s.kind == "host":
            lo = _host_expr(s.lo, f"the lower bound of host loop {s.var.name!r}")
            hi = _host_expr(s.hi, f"the upper bound of host loop {s.var.name!r}")
            return (HostLoop(s.var, lo, hi, host(s.body, True, (*host_vars, s.var))),)
        if isinstance(s, N.If) and has_host_loops(s):
            cond = _host_expr(s.cond, "the condition")
            orelse = () if s.orelse is None else host(s.orelse, True, host_vars)
            return (HostIf(cond, host(s.then, True, host_vars), orelse),)
        if isinstance(s, N.Allocate) and has_host_loops(s):
            raise CudaCodegenError(
                f"{s.buffer.scope} buffer {s.buffer.name!r} is allocated around a host loop (a loop of kernel "
                "launches); a shared or local buffer lives inside one kernel: allocate it inside the bound loops")
        return (Launch(kernel(s, host_vars)),)

    launches = host(program.body, True, ())
    parts = [PRELUDE]
    if flags["half"]:
        parts.append(PRELUDE_HALF)
    if flags["reduce"]:
        parts.append(PRELUDE_REDUCE)
    if flags["subwarp"]:
        parts.append(PRELUDE_SUBWARP)
    if flags["async"]:
        parts.append(PRELUDE_ASYNC)
    source = "\n".join(parts) + "\n" + "\n\n".join(texts) + "\n"
    return CudaSource(source, tuple(kernels), program, launches)


__all__ = ["generate_cuda", "CudaSource", "Kernel", "KernelArg", "LaunchPlan", "Launch", "HostLoop", "HostIf",
           "HostStep", "CudaCodegenError",
           "UnboundLoopError", "eval_index"]
