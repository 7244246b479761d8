"""Lowered loop IR -> CUDA C: one `extern "C" __global__` kernel per `Kernel` node.

This module renders: every decision it prints was made by the CUDA pipeline (`codegen.passes`) and
recorded in the IR — the kernels and their launch (`Kernel.grid`/`block`), host loops, barriers, the
index width, which bound loops keep a guard, which thread loops are cross-thread reductions, which
copies are cooperative or software-pipelined, which statements run on thread 0 only. What is left here
is instruction selection (float4 lanes with their alignment checks, warp shuffles, `cp.async`).

How a program maps to kernels
-----------------------------
* Each `Kernel` node at host level (the program body, host loops' bodies) is one kernel; a kernel
  without any loop (a scalar statement) is a one-thread kernel.
* A host loop (kind "host", made by the pass `split_kernels` from a serial loop around grid-bound
  loops) is a loop of launches on the host (`CudaSource.launches`: `HostLoop` / `HostIf` / `Launch`);
  its variable is a `long long` parameter of the kernels inside it, and their launch dims may use it.
* A bound loop `for v in lo..hi bound to threadIdx.x` becomes `const long long v = lo + threadIdx.x;`
  and, when the pass marked it `guarded`, `if (v < hi) {...}` (a predicate instead, when a barrier or a
  cross-thread reduction inside must be reached by every thread).
* The launch plan (grid and block per kernel) is kept as loopir expressions over the size
  parameters, evaluated at call time (`LaunchPlan.dims(sizes)`).
* Serial/parallel/unroll loops inside a kernel are plain `for` loops (`#pragma unroll` for unroll).
* Index arithmetic is `int` or `long long` as `Kernel.index_dtype` says. `//` and `%` follow Python (floor).
* float16 and bfloat16 are stored as 16-bit words and computed in float, converted with the PTX `cvt`
  instructions (no `cuda_fp16.h` / `cuda_bf16.h`: the pip NVRTC ships without CUDA headers).

The parts of the generator, each a mixin of `_KernelGen` or a text module:
`codegen.cuda.expr` (C types and names, launch-size evaluation, affine forms, expression rendering),
`codegen.cuda.vector` (float4 lane loops and alignment proofs), `codegen.cuda.reduce` (cross-thread
reductions), `codegen.cuda.staging` (cooperative shared-memory copies, cp.async double buffering),
`codegen.cuda.prelude` (the device helper functions and macros).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from loopir import nodes as N
from loopir.affine import eval_index
from loopir.printer import expr_str
from loopir.gpu import reduction_parts
from loopir.te_extern import extern_nest
from schedules.primitives.flash import FLASH, FLASH_TF32, FLASH_WGMMA
from schedules.primitives.wgmma import WGMMA, WgmmaMismatch, kernel_tile
from loopir.visit import free_vars, loops_of, stmt_names, walk

from .expr import (  # noqa: F401  (re-exported: tests and callers import them from codegen.cuda)
    _AXES,
    _C_KEYWORDS,
    _CTYPE,
    _FROM_FLOAT,
    _NPTYPE,
    _STORAGE,
    _TO_FLOAT,
    CudaCodegenError,
    UnboundLoopError,
    _ExprEmitter,
    _is_const,
    _Names,
    _sanitize,
    _wrap,
    unrounded,
)
from .flash import PRELUDE_FLASH, heavy_first, render_flash
from .flash_tf32 import render_flash_tf32
from .flash_wgmma import render_flash_wgmma
from .tensor_map import TMAP_TYPE
from .wgmma import PRELUDE_WGMMA
from .wgmma_tma import PRELUDE_WGMMA_TMA, render_wgmma
from .mma import PRELUDE_TF32, render_mma, render_mma_grid
from .prelude import PRELUDE, PRELUDE_ASYNC, PRELUDE_CLUSTER, PRELUDE_HALF, PRELUDE_REDUCE, PRELUDE_SUBWARP
from .reduce import _identity, _ReductionEmitter  # noqa: F401
from .staging import _StagingEmitter
from .vector import _VEC_SCOPES, _monotone_guard, _VectorEmitter  # noqa: F401

# __launch_bounds__(threads, LAUNCH_MIN_BLOCKS) on kernels with pipelined copies and a constant block size
LAUNCH_MIN_BLOCKS: int | None = None


# ----------------------------------------------------------------------------- results


@dataclass(frozen=True)
class KernelArg:
    """One kernel parameter: a buffer (pointer) or a size parameter (`int` in a kernel whose index width is
    32 bits, else `long long`; `int32` says which, so the launcher passes the matching C type)."""

    name: str
    buffer: N.Buffer | None = None
    var: N.Var | None = None
    written: bool = False
    int32: bool = False
    tmap: tuple[int, ...] = ()  # a TMA tensor map of `buffer` (its box, innermost first), codegen.cuda.tensor_map


@dataclass(frozen=True)
class LaunchPlan:
    """grid and block of one kernel as loopir index expressions over the size parameters."""

    grid: tuple[N.Expr, N.Expr, N.Expr]
    block: tuple[N.Expr, N.Expr, N.Expr]

    def dims(self, sizes: dict[N.Var, int]) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        out = []
        for e in self.grid + self.block:
            try:
                out.append(eval_index(e, sizes))
            except (ValueError, TypeError, ZeroDivisionError) as err:
                raise CudaCodegenError(f"cannot evaluate launch expression {e} on the host: {err}") from err
        return tuple(out[:3]), tuple(out[3:])  # type: ignore[return-value]


@dataclass(frozen=True)
class Kernel:
    name: str
    args: tuple[KernelArg, ...]
    launch: LaunchPlan
    stmt_names: tuple[str, ...]
    dynamic_shared: N.Expr = N.const(0)  # bytes of dynamic shared memory a launch asks for (over the sizes)


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


class _KernelGen(_ExprEmitter, _ReductionEmitter, _StagingEmitter, _VectorEmitter):
    """Emits one kernel for one top-level nest: launch planning and statements here; expressions, float4
    accesses, cross-thread reductions and shared-memory staging in the mixins (see the module docstring)."""

    def __init__(self, program: N.Program, kernel: N.Kernel, name: str, host_vars: tuple[N.Var, ...] = (),
                 fast_exp: bool = False):
        self.program = program
        self.kern = kernel
        self.nest = kernel.body
        self.host_vars = frozenset(host_vars)  # variables of the host loops around the kernel: parameters
        self.kname = name
        self.names = _Names()
        self.lines: list[str] = []
        self.ind = 1
        self.fast_exp = fast_exp  # half_outputs(program), decided once per program by generate_cuda
        self.uses_half = False
        self.uses_reduce = False
        self.uses_subwarp = False
        self.subwarp = kernel.subwarp  # > 0: cross-thread reductions are within segments of this many lanes
        self.block_order: dict[str, str] = {}  # blockIdx axis -> its index in another launch order (analyse)
        self.red_smem: dict[str, str] = {}  # C type -> shared array name
        self.cluster_slots: dict[str, str] = {}  # C type -> the slots of its cross-cluster reductions (cluster kernels)
        self.forward: list[dict[tuple, str]] = [{}]  # scoped: (buffer id, flat index expr) -> register
        self.vec_lanes: dict[N.Expr, str] = {}  # a lane's loads (and column `f % n`) in a vector emission
        self.red_targets: dict[int, str] = {}
        self.init_consts: dict[tuple, tuple[dict, str]] = {}  # (buffer id, flat index) -> (scope, constant)
        self.pre: dict[N.Expr, str] = {}  # sin/cos of one argument computed once by sincosf
        self.cur_sub: dict[N.Var, N.Expr] = {}
        self.thread_depth = 0
        self.ix = "long long"  # the C type of index arithmetic: "int" when every size provably fits
        self.uses_async = False
        self.uses_flash = False
        self.uses_tf32 = False  # loopir_tf32_split (codegen.cuda.mma's PRELUDE_TF32)
        self.uses_wgmma = False
        self.uses_wgmma_tma = False
        self.tmaps: dict[N.Buffer, tuple[str, tuple[int, ...]]] = {}  # buffer -> (parameter, box): wgmma_tma
        self.pred: str | None = None  # C condition: does this thread really run the statements here (predication)
        self.uniform_memo: dict[int, bool] = {}
        self.entry_checks: dict[str, str] = {}  # vector-path condition -> const bool computed once at kernel entry

    # ---------------------------------------------------------------- the launch, as planned
    def analyse(self) -> LaunchPlan:
        k = self.kern
        self.launch = {f"{kind}.{a}": e for kind, dims in (("blockIdx", k.grid), ("threadIdx", k.block))
                       for a, e in zip(_AXES, dims)}
        self.block_order = heavy_first(k.body, self.program)
        try:
            tile = kernel_tile(k.body)
        except WgmmaMismatch as e:
            raise CudaCodegenError(f"the tile marked gemm.wgmma changed shape before rendering: {e}") from None
        if tile is not None and tile[2] is not None:  # a persistent grid walks the tiles (codegen.cuda.wgmma)
            return LaunchPlan((tile[2].grid, N.const(1), N.const(1)), k.block)
        if k.cluster:  # the cluster's blocks on the grid's y axis, each a share of the block's threads
            c = N.const(k.cluster)
            per_block = N.const(int(k.block[0].value) // k.cluster)  # type: ignore[attr-defined]
            return LaunchPlan((k.grid[0], c, N.const(1)), (per_block, N.const(1), N.const(1)))
        return LaunchPlan(k.grid, k.block)

    def _size_vars(self) -> set[N.Var]:
        defined = {f.var for f in loops_of(self.nest)}
        for n in walk(self.nest):
            if isinstance(n, N.Store):
                # an iteration variable that is a host loop's own variable (coordinate t = t) is a parameter
                defined.update(v for v in n.iters if v not in self.host_vars)
        return free_vars(self.nest) - defined

    # ---------------------------------------------------------------- statements
    def stmt(self, s: N.Stmt, last: bool) -> None:
        if self.pred is not None and not self._needs_uniform(s):
            self.under_pred(s, last)  # a thread whose guard failed skips it (codegen.cuda.reduce)
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
            self.line("loopir_cluster_sync();" if self.kern.cluster else "__syncthreads();")
        elif isinstance(s, N.Store):
            target = self.red_targets.get(id(s))
            if target is None and s.name in self.kern.single_thread:
                # every thread of the block would apply a read-modify-write: let one thread do it
                self.line("if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {")
                self.ind += 1
                self.store(s)
                self.ind -= 1
                self.line("}")
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
        if self.kern.cluster and b.scope == "shared":
            raise CudaCodegenError(
                f"shared buffer {b.name!r} in a cluster kernel (pragma cluster {self.kern.cluster}): each block of the "
                "cluster would hold its own copy, while its statements share it across the cluster's threads; keep "
                "it in registers (each element read by the thread that wrote it: codegen.passes.registers) or "
                "drop the cluster")
        size = N.const(1)
        for d in b.shape:
            size = N.binary("mul", size, d)
        if b.dtype == "float16":
            self.uses_half = True
        dyn = next((off for d, off in self.kern.dynamic_shared if d is b), None)
        if dyn is not None:  # a slice of the kernel's extern __shared__ array (codegen.passes.shared)
            st = _STORAGE[b.dtype]
            self.line(f"{st}* __restrict__ {self.buf(b)} = reinterpret_cast<{st}*>(loopir_dyn_smem + "
                      f"{self.expr(dyn)});  // shared {b.name}, dynamic: {expr_str(size)} elements")
            self.stmt(s.body, last)
            return
        if not _is_const(size):
            raise CudaCodegenError(f"{b.scope} buffer {b.name!r} has non-constant size {size}; "
                                   "shared and local allocations need a constant shape")
        if b.dtype in _TO_FLOAT:
            self.uses_half = True
        qual = "__shared__ __align__(16) " if b.scope == "shared" else ""
        self.line(f"{qual}{_STORAGE[b.dtype]} {self.buf(b)}[{int(size.value)}];  // {b.scope} {b.name}")  # type: ignore[attr-defined]
        self.stmt(s.body, last)

    def store(self, st: N.Store, target: str | None = None) -> None:
        """Emit st; with `target`, emit `target = value` into a register instead."""
        self.open_store(st)
        self.sincos(st.value)
        if target is not None:
            op, e = reduction_parts(st)  # type: ignore[misc]
            val = _wrap(st.buffer.dtype, self.red_combine(op, target, self.expr(e)))  # small ints: narrowed
            self.line(f"{target} = {val};")
        else:
            flat = self.flat(st.buffer, st.indices)
            val = self.expr(unrounded(st.value, st.buffer.dtype))
            if st.buffer.dtype in _FROM_FLOAT:
                self.uses_half = True
                val = f"{_FROM_FLOAT[st.buffer.dtype]}({val})"
            elif _CTYPE[st.value.dtype] != _CTYPE[st.buffer.dtype]:
                val = f"({_STORAGE[st.buffer.dtype]})({val})"
            if st.buffer.name not in self.kern.forwarded:  # else read from registers only (passes.forwarded)
                self.line(f"{self.buf(st.buffer)}[{self.expr(flat)}] = {val};")
            self._invalidate(st.buffer)
            if isinstance(st.value, N.Const) and st.buffer.dtype not in _FROM_FLOAT:
                # a reduction's init (C[i] = identity): the cross-thread reduction right after it in this
                # scope starts from this constant instead of reading C[i] back from global memory
                self.init_consts[self.forward_key(st.buffer, st.indices, self.cur_sub)] = (self.forward[-1], val)
        self.cur_sub = {}
        self.pre = {}
        self.ind -= 1
        self.line("}")


    def _invalidate(self, b: N.Buffer) -> None:
        for scope in self.forward:
            for k in [k for k in scope if k[0] == id(b)]:
                del scope[k]
        for k in [k for k in self.init_consts if k[0] == id(b)]:
            del self.init_consts[k]


    def loop(self, f: N.For, last: bool) -> None:
        v = self.var(f.var)
        stage = extern_nest(f)
        if stage is not None:  # a te.extern stage: its model nest is one call of its __device__ function
            return self.extern_stage(stage[1])
        if f.kind == "thread":
            if f.var in self.kern.reductions:
                return self.reduction_loop(f, last)
            self.bound_loop(f, lambda: self.stmt(f.body, last))
            return None
        if f.kind == "vectorize" and self.try_vector(f):
            return None
        if f.kind == "unroll" and self.try_vector_reads(f):
            return None
        if f.kind == FLASH:  # a block's online-softmax pass on tensor cores (codegen.cuda.flash)
            return render_flash(self, f)
        if f.kind == FLASH_WGMMA:  # the same on warpgroup tensor cores (codegen.cuda.flash_wgmma)
            return render_flash_wgmma(self, f)
        if f.kind == FLASH_TF32:  # the same over float32 data on TF32 tensor cores (codegen.cuda.flash_tf32)
            return render_flash_tf32(self, f)
        if f.kind == WGMMA:  # a block's GEMM tile on warpgroup tensor cores (codegen.cuda.wgmma)
            return render_wgmma(self, f)
        if f.kind.startswith("mma."):  # a tensorized nest: tensor-core PTX (codegen.cuda.mma)
            return render_mma(self, f)
        if f.var in self.kern.mma_grids:  # fragments loaded once per row / column (codegen.passes.mma)
            return render_mma_grid(self, f)
        if f.var in self.kern.cooperative:
            self.cooperative(f)
            return None
        if f.var in self.kern.pipelined:
            self.pipelined(f, last)
            return None
        if f.kind in ("unroll", "vectorize"):
            self.line("#pragma unroll")
        elif dict(f.pragmas).get("unroll"):  # the primitive `pragma`: an unroll count (1: keep it rolled)
            self.line(f"#pragma unroll {dict(f.pragmas)['unroll']}")
        elif f.var in self.kern.rolled:
            self.line("#pragma unroll 1")
        self.line(f"for ({self.ix} {v} = {self.expr(f.lo)}; {v} < {self.expr(f.hi)}; ++{v}) {{")
        self.block(f.body, last)
        self.line("}")
        return None

    def bound_loop(self, f: N.For, body) -> None:
        v = self.var(f.var)
        axis = f.thread
        order = self.block_order.get(axis)
        idx = f"({self.ix}){order or axis}"
        self.line(f"{{  // loop {f.var.name} bound to {axis}" + (" (heaviest blocks launched first)" if order else ""))
        self.ind += 1
        zero_lo = isinstance(f.lo, N.Const) and f.lo.value == 0
        self.line(f"const {self.ix} {v} = {idx}" + ("" if zero_lo else f" + {self.expr(f.lo)}") + ";")
        is_thread = axis.startswith("threadIdx")
        self.thread_depth += is_thread
        needs_guard = f.var in self.kern.guarded
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
        dyn_vars = {v for b, off in self.kern.dynamic_shared for e in (off, *(b.shape if b else ()))
                    for v in free_vars(e)}
        sizes = sorted(self._size_vars() | dyn_vars | {v for b in globals_ for d in b.shape for v in free_vars(d)},
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
        # sizes take the kernel's index width: a 64-bit size in `i * n` would widen 32-bit index arithmetic
        narrow = self.kern.index_dtype == "int32"
        for s in sizes:
            nm = self.var(s)
            params.append(f"const {'int' if narrow else 'long long'} {nm}")
            args.append(KernelArg(nm, var=s, int32=narrow))
        self.ix = "int" if narrow else "long long"
        self.lines = []
        self.ind = 1
        body_start = len(self.lines)
        self.stmt(self.nest, True)
        for b, (nm, box) in self.tmaps.items():  # TMA tensor maps, made by the launcher from the buffer's pointer
            params.append(f"const __grid_constant__ {TMAP_TYPE} {nm}")
            args.append(KernelArg(nm, buffer=b, written=b in writes, tmap=box))
        body = self.lines[body_start:]
        bounds = ""
        nthreads = [e for e in plan.block]
        if self.kern.cluster:  # the cluster's threads: every use of the thread index is the cluster-wide one
            whole = str(self.kern.block[0])  # the cluster's threads along x
            body = [ln.replace("threadIdx.x", "loopir_tx").replace("blockDim.x", whole) for ln in body]
            body.append("  loopir_cluster_sync();  // no block leaves while a peer may read its reduction slots")
            bounds = f"__cluster_dims__(1, {self.kern.cluster}, 1) "
        min_blocks = self.kern.min_blocks or (LAUNCH_MIN_BLOCKS if self.uses_async else None)
        if min_blocks and all(_is_const(e) for e in nthreads):
            bounds += f"__launch_bounds__({math.prod(int(e.value) for e in nthreads)}, {min_blocks}) "  # type: ignore[attr-defined]
        elif all(_is_const(e) for e in nthreads) and math.prod(int(e.value) for e in nthreads) > 256:  # type: ignore[attr-defined]
            # more than 256 threads: without the bound NVRTC may give a thread more registers than a block of this
            # size can have (65,536 per block), and the launch fails; with it, it keeps them within (spilling if
            # it must). Up to 256 threads every register count NVRTC uses (<= 255) fits.
            bounds += f"__launch_bounds__({math.prod(int(e.value) for e in nthreads)}) "  # type: ignore[attr-defined]
        head = [f'extern "C" __global__ void {bounds}{self.kname}(' + ", ".join(params) + ") {"]
        stmts = ", ".join(dict.fromkeys(stmt_names(self.nest)))
        launch = (f"  // statements: {stmts}; grid ({', '.join(str(e) for e in plan.grid)}), "
                  f"block ({', '.join(str(e) for e in plan.block)})")
        decl = [f"  __shared__ {ct} {nm}[32];  // cross-thread reduction scratch" for ct, nm in self.red_smem.items()]
        if self.kern.cluster:
            decl.append(f"  const int loopir_tx = (int)(blockIdx.y * {plan.block[0]} + threadIdx.x);  "
                        "// in the cluster")
            decl += [f"  __shared__ {ct} {nm}[2];  // this block's total of a cross-cluster reduction"
                     for ct, nm in self.cluster_slots.items()]
            if self.cluster_slots:
                decl.append("  int loopir_parity = 0;  // which slot the next cross-cluster reduction uses")
        decl += [f"  const bool {nm} = {cond};  // tested once per thread, not per access" for cond, nm in
                 self.entry_checks.items()]
        dyn_bytes = self.kern.dynamic_shared[-1][1] if self.kern.dynamic_shared else N.const(0)
        if self.kern.dynamic_shared:
            decl.append(f"  extern __shared__ __align__(16) unsigned char loopir_dyn_smem[];  // {dyn_bytes} bytes, "
                        "set at launch")
        text = "\n".join(head + [launch] + decl + body + ["}"])
        return text, Kernel(self.kname, tuple(args), plan, tuple(dict.fromkeys(stmt_names(self.nest))), dyn_bytes)


def _host_expr(e: N.Expr, what: str) -> N.Expr:
    if any(isinstance(n, N.Load) for n in walk(e)):
        raise CudaCodegenError(f"{what} {e} reads a buffer; a host loop's bounds and the conditions around it "
                               "are evaluated on the host and may use only sizes and host loop variables")
    return e


def half_outputs(program: N.Program) -> bool:
    """Every output of `program` (an argument it writes) is float16 or bfloat16. Its float32 exponentials then run
    as the hardware's ex2.approx (codegen.cuda.prelude's loopir_exp_fast): a relative error below 2^-17 for the
    arguments whose results a float are not infinite (2^-22 of ex2 and the rounding of x * log2(e)), at least 2^6
    times below float16's rounding (2^-11) and 2^9 below bfloat16's: the outputs round the same but for values
    that fall within that error of a rounding boundary. (Measured reason: float16 softmax spent more time in
    expf's instructions than in its DRAM traffic.) Likewise a division (of float32 type, or of a half type: computed
    in float32 either way) multiplies by the divisor's reciprocal (prelude loopir_div_half: 2.5 float32 ulps, 2^10
    below float16's rounding), computed once where the divisor is invariant, as softmax's row sum is: an IEEE
    division per element doubled a row kernel's instructions (and took 513 of the 3180 SASS instructions of d 64
    attention, in its epilogue)."""
    written = {n.buffer for n in walk(program.body) if isinstance(n, N.Store)}
    outs = [b for b in program.args if b in written]
    return bool(outs) and all(b.dtype in ("float16", "bfloat16") for b in outs)


def generate_cuda(program: N.Program) -> CudaSource:
    """CUDA C for `program`: one kernel per nest at host level, launched as `CudaSource.launches` says
    (see the module docstring)."""
    names = _Names()
    texts: list[str] = []
    kernels: list[Kernel] = []
    fast_exp = half_outputs(program)
    flags = {"half": False, "reduce": False, "subwarp": False, "cluster": False, "async": False, "flash": False,
             "tf32": False, "wgmma": False, "wgmma_tma": False}

    def kernel(kn: N.Kernel, host_vars: tuple[N.Var, ...]) -> int:
        k = len(kernels)
        first = (stmt_names(kn.body) or [f"nest{k}"])[0]
        kname = names.fresh(f"{program.name}_{first}")
        gen = _KernelGen(program, kn, kname, host_vars=host_vars, fast_exp=fast_exp)
        text, kern = gen.generate()
        if host_vars:  # say where it runs: the source alone shows the time loop is not inside the kernel
            head, rest = text.split("\n", 1)
            loops_ = ", ".join(v.name for v in host_vars)
            text = f"{head}\n  // launched once per iteration of the host loop(s) {loops_}\n{rest}"
        flags["half"] |= gen.uses_half
        flags["reduce"] |= gen.uses_reduce
        flags["subwarp"] |= gen.uses_subwarp
        flags["cluster"] |= bool(kn.cluster)
        flags["async"] |= gen.uses_async
        flags["flash"] |= gen.uses_flash
        flags["tf32"] |= gen.uses_tf32
        flags["wgmma"] |= gen.uses_wgmma
        flags["wgmma_tma"] |= gen.uses_wgmma_tma
        texts.append(text)
        kernels.append(kern)
        return k

    def host(s: N.Stmt, host_vars: tuple[N.Var, ...]) -> tuple[HostStep, ...]:
        if isinstance(s, N.Kernel):
            return (Launch(kernel(s, host_vars)),)
        if isinstance(s, N.Seq):
            return tuple(x for c in s.body for x in host(c, host_vars))
        if isinstance(s, N.For) and s.kind == "host":
            lo = _host_expr(s.lo, f"the lower bound of host loop {s.var.name!r}")
            hi = _host_expr(s.hi, f"the upper bound of host loop {s.var.name!r}")
            return (HostLoop(s.var, lo, hi, host(s.body, (*host_vars, s.var))),)
        if isinstance(s, N.If):
            cond = _host_expr(s.cond, "the condition")
            orelse = () if s.orelse is None else host(s.orelse, host_vars)
            return (HostIf(cond, host(s.then, host_vars), orelse),)
        if isinstance(s, N.Allocate):
            raise CudaCodegenError(
                f"{s.buffer.scope} buffer {s.buffer.name!r} is allocated around a host loop (a loop of kernel "
                "launches); a shared or local buffer lives inside one kernel: allocate it inside the bound loops")
        raise CudaCodegenError(
            f"statement {type(s).__name__} at host level is not in a kernel: generate_cuda renders a lowered "
            "program; lower it first with codegen.passes.lower(program, 'cuda') (build does)")

    launches = host(program.body, ())
    parts = [PRELUDE]
    if flags["half"]:
        parts.append(PRELUDE_HALF)
    if flags["reduce"]:
        parts.append(PRELUDE_REDUCE)
    if flags["subwarp"]:
        parts.append(PRELUDE_SUBWARP)
    if flags["cluster"]:
        parts.append(PRELUDE_CLUSTER)
    if flags["async"]:
        parts.append(PRELUDE_ASYNC)
    if flags["flash"]:
        parts.append(PRELUDE_FLASH)
    if flags["tf32"]:
        parts.append(PRELUDE_TF32)
    if flags["wgmma"]:
        parts.append(PRELUDE_WGMMA)
    if flags["wgmma_tma"]:
        parts.append(PRELUDE_WGMMA_TMA)
    source = "\n".join(parts) + "\n" + "\n\n".join(texts) + "\n"
    return CudaSource(source, tuple(kernels), program, launches)


__all__ = ["generate_cuda", "CudaSource", "Kernel", "KernelArg", "LaunchPlan", "Launch", "HostLoop", "HostIf",
           "HostStep", "CudaCodegenError",
           "UnboundLoopError"]
