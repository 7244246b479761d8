"""Loop IR -> CUDA C: one `extern "C" __global__` kernel per top-level nest bound to GPU axes.

How a program maps to kernels
-----------------------------
* Each top-level statement of `program.body` is one nest. A nest with at least one loop of
  kind "thread" becomes one kernel; a nest without any loop (a scalar statement) becomes a
  one-thread kernel; a nest with loops but none bound is refused (`UnboundLoopError`, naming
  the loop and saying to `bind` it or use `auto_schedule`).
* A bound loop `for v in lo..hi bound to threadIdx.x` becomes `const long long v = lo + threadIdx.x;`
  and, when the launch extent may exceed `hi - lo`, `if (v < hi) {...}`. Several loops may be
  bound to the same axis in one block (phases of a row softmax): the launch extent of an axis is
  the max of their extents and each is guarded. Extents may use size parameters only; an extent
  that varies with another loop (the block index) is refused, except `min(c, ...)` whose constant
  side bounds it (the loop keeps its exact guard).
* The launch plan (grid and block per kernel) is kept as loopir expressions over the size
  parameters, evaluated at call time (`LaunchPlan.dims(sizes)`).
* Serial/parallel/unroll loops inside a kernel are plain `for` loops (`#pragma unroll` for unroll).
* Index arithmetic is 64-bit (`long long`), except in a kernel whose sizes are all known at build time and
  small enough (`_fits_int32`: every buffer's padded element count below 2**31): there it is 32-bit `int`,
  which saves registers. Symbolic sizes keep 64-bit (a size may pass 2**31). `//` and `%` follow Python (floor).
* float16 is stored as 16-bit words and computed in float, converted with the PTX `cvt`
  instructions (no `cuda_fp16.h`: the pip NVRTC ships without CUDA headers).

Vector loads (loop kind "vectorize")
------------------------------------
A vectorized loop `v in 0..4` whose body is one float32 Store whose flat index is `base + v`
becomes one 128-bit `float4` store, with `float4` loads for every float32 load of the form
`base' + v`. `base` must be a multiple of 4: proven statically from its affine form where every
term's coefficient is a multiple of 4, otherwise checked at run time in the kernel (size
parameters divisible, base pointers 16-byte aligned) with the scalar unrolled loop as fallback.
Anything else emits the scalar unrolled loop. Also handled: several float32 stores in one lane loop
(horizontally fused outputs: the loads are shared and hoisted, so no store may write a buffer the
group reads), and a lane loop body under a guard that is a conjunction of `a < b` / `a <= b` growing
with the lane (a non-dividing split, a cache_read clip): checked at lane 3, scalar fallback otherwise.
Global float4 accesses go through `LOOPIR_LD4` / `LOOPIR_ST4` (plain by default; the NVRTC options
`-DLOOPIR_STREAMING_LOADS` / `-DLOOPIR_STREAMING_STORES` make them evict-first `__ldcs` / `__stcs`).
sin and cos of one argument share one `sincosf`, per lane too.

Cross-thread reductions
-----------------------
Pattern: a loop T bound to `threadIdx.x`, containing a Store `C[idx] = C[idx] op e` (op in add, max,
min, mul; operands in either order) whose index, written in the loops around it, does NOT use T's
variable or any loop inside T. Such a statement is computed as:

    acc = identity(op)                       // one register per reduction statement
    if (t < hi) { ...loops inside T...  acc = acc op e; }   // each thread's strided share
    acc = loopir_block_allreduce(acc)        // warp shuffles, then shared memory across warps
    if (threadIdx.x == 0) C[idx] = C[idx] op acc;
    __syncthreads();                         // when more statements of the block follow

Every thread ends with the total (all-reduce), so later loads of exactly `C[idx]` in the same
block read the register instead of memory (forwarding); when the init `C[idx] = identity` was
emitted just before in the same scope (nothing stored to C since), the share starts from that
constant instead of reading C[idx] back from global memory. Preconditions, refused otherwise: T is
not inside another thread-bound loop nor under a condition that uses a thread index (every thread
of the block must reach the shuffles); a T-invariant store inside T that is not of this form is
refused. The block's x extent is rounded up to a multiple of 32 so that warps are full.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from loopir import nodes as N
from loopir.dtypes import is_int
from loopir.visit import free_vars, substitute, walk


class CudaCodegenError(ValueError):
    """A program that cannot be mapped to CUDA kernels as scheduled."""


class UnboundLoopError(CudaCodegenError):
    """A top-level nest with loops but no loop bound to a GPU axis."""


_CTYPE = {"float16": "float", "float32": "float", "float64": "double", "int32": "int", "int64": "long long",
          "bool": "bool"}
_STORAGE = {**_CTYPE, "float16": "unsigned short"}
_NPTYPE = {"float16": 2, "float32": 4, "float64": 8, "int32": 4, "int64": 8, "bool": 1}
_AXES = ("x", "y", "z")
_RED_OPS = ("add", "mul", "max", "min")
_VEC_SCOPES = ("global", "shared")  # float4 accesses: global memory, and shared arrays (declared __align__(16))
_C_KEYWORDS = frozenset(
    "auto bool break case char const continue default do double else enum extern float for goto if inline int "
    "long register return short signed sizeof static struct switch typedef union unsigned void volatile while "
    "class new delete this template typename namespace operator private public protected virtual friend "
    "true false nullptr half float4 dim3 threadIdx blockIdx blockDim gridDim warpSize".split())

PRELUDE = r"""// generated by loopir (codegen/cuda.py)
#define LOOPIR_INF_F __int_as_float(0x7f800000)
#define LOOPIR_INF_D __longlong_as_double(0x7ff0000000000000LL)
__device__ __forceinline__ long long loopir_floordiv(long long a, long long b) {
  long long q = a / b; return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q; }
__device__ __forceinline__ int loopir_floordiv(int a, int b) {
  int q = a / b; return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q; }
__device__ __forceinline__ long long loopir_mod(long long a, long long b) {
  long long r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
__device__ __forceinline__ int loopir_mod(int a, int b) {
  int r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
__device__ __forceinline__ float loopir_floordiv(float a, float b) { return floorf(a / b); }
__device__ __forceinline__ double loopir_floordiv(double a, double b) { return floor(a / b); }
__device__ __forceinline__ float loopir_mod(float a, float b) {
  float r = fmodf(a, b); return (r != 0.0f && ((r < 0.0f) != (b < 0.0f))) ? r + b : r; }
__device__ __forceinline__ double loopir_mod(double a, double b) {
  double r = fmod(a, b); return (r != 0.0 && ((r < 0.0) != (b < 0.0))) ? r + b : r; }
__device__ __forceinline__ float loopir_max(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double loopir_max(double a, double b) { return fmax(a, b); }
__device__ __forceinline__ int loopir_max(int a, int b) { return a > b ? a : b; }
__device__ __forceinline__ long long loopir_max(long long a, long long b) { return a > b ? a : b; }
__device__ __forceinline__ float loopir_min(float a, float b) { return fminf(a, b); }
__device__ __forceinline__ double loopir_min(double a, double b) { return fmin(a, b); }
__device__ __forceinline__ int loopir_min(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ long long loopir_min(long long a, long long b) { return a < b ? a : b; }
// a 32-bit index variable meets a 64-bit value (int64 data): compute in 64 bits
__device__ __forceinline__ long long loopir_floordiv(long long a, int b) { return loopir_floordiv(a, (long long)b); }
__device__ __forceinline__ long long loopir_floordiv(int a, long long b) { return loopir_floordiv((long long)a, b); }
__device__ __forceinline__ long long loopir_mod(long long a, int b) { return loopir_mod(a, (long long)b); }
__device__ __forceinline__ long long loopir_mod(int a, long long b) { return loopir_mod((long long)a, b); }
__device__ __forceinline__ long long loopir_max(long long a, int b) { return loopir_max(a, (long long)b); }
__device__ __forceinline__ long long loopir_max(int a, long long b) { return loopir_max((long long)a, b); }
__device__ __forceinline__ long long loopir_min(long long a, int b) { return loopir_min(a, (long long)b); }
__device__ __forceinline__ long long loopir_min(int a, long long b) { return loopir_min((long long)a, b); }
// 128-bit accesses; NVRTC options -DLOOPIR_STREAMING_LOADS / -DLOOPIR_STREAMING_STORES make them evict-first
#ifdef LOOPIR_STREAMING_LOADS
#define LOOPIR_LD4(p) __ldcs(p)
#else
#define LOOPIR_LD4(p) (*(p))
#endif
#ifdef LOOPIR_STREAMING_STORES
#define LOOPIR_ST4(p, v) __stcs((p), (v))
#else
#define LOOPIR_ST4(p, v) (*(p) = (v))
#endif
"""

PRELUDE_ASYNC = r"""__device__ __forceinline__ void loopir_cp_async16(void* smem, const void* gmem) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(s), "l"(gmem) : "memory"); }
__device__ __forceinline__ void loopir_cp_async4(void* smem, const void* gmem) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" :: "r"(s), "l"(gmem) : "memory"); }
"""

# software pipelining of shared block-tile copies (`_KernelGen.pipelined`); off: the plain copy, barrier, compute
PIPELINE_SHARED_COPIES = True
# __launch_bounds__(threads, LAUNCH_MIN_BLOCKS) on kernels with pipelined copies and a constant block size
LAUNCH_MIN_BLOCKS: int | None = None

PRELUDE_HALF = r"""__device__ __forceinline__ float loopir_h2f(unsigned short h) {
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ unsigned short loopir_f2h(float f) {
  unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
__device__ __forceinline__ float loopir_round_half(float f) { return loopir_h2f(loopir_f2h(f)); }
"""

PRELUDE_REDUCE = r"""struct loopir_op_add {
  template <class T> __device__ T operator()(T a, T b) const { return a + b; } };
struct loopir_op_mul { template <class T> __device__ T operator()(T a, T b) const { return a * b; } };
struct loopir_op_max { template <class T> __device__ T operator()(T a, T b) const { return loopir_max(a, b); } };
struct loopir_op_min { template <class T> __device__ T operator()(T a, T b) const { return loopir_min(a, b); } };
// All-reduce over threadIdx.x of each (threadIdx.y, threadIdx.z) row; blockDim.x is a multiple of 32.
// smem holds one slot per warp of the block (at most 32); every thread returns the row's total.
template <class T, class Op>
__device__ __forceinline__ T loopir_block_allreduce(T v, Op op, T identity, T* smem) {
  #pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_down_sync(0xffffffffu, v, o));
  const int warps_per_row = blockDim.x >> 5;
  const int row = threadIdx.y + blockDim.y * threadIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // smem may still be read by the previous reduction
  if (lane == 0) smem[row * warps_per_row + warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < warps_per_row ? smem[row * warps_per_row + lane] : identity;
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_down_sync(0xffffffffu, v, o));
    if (lane == 0) smem[row * warps_per_row] = v;
  }
  __syncthreads();
  return smem[row * warps_per_row];
}
"""


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
class CudaSource:
    source: str
    kernels: tuple[Kernel, ...]
    program: N.Program


# ----------------------------------------------------------------------------- index evaluation


def eval_index(e: N.Expr, env: dict[N.Var, int]) -> int:
    """Evaluate an integer expression of size parameters (Python floor semantics)."""
    if isinstance(e, N.Const):
        return int(e.value)
    if isinstance(e, N.Var):
        if e not in env:
            raise CudaCodegenError(f"launch size uses {e.name!r}, which no argument's shape determines")
        return int(env[e])
    if isinstance(e, N.Unary) and e.op == "neg":
        return -eval_index(e.a, env)
    if isinstance(e, N.Cast):
        return int(eval_index(e.a, env))
    if isinstance(e, N.Binary):
        a, b = eval_index(e.a, env), eval_index(e.b, env)
        ops = {"add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b, "floordiv": lambda: a // b,
               "mod": lambda: a % b, "max": lambda: max(a, b), "min": lambda: min(a, b)}
        if e.op in ops:
            return ops[e.op]()
    raise CudaCodegenError(f"cannot evaluate launch expression {e} on the host")


# ----------------------------------------------------------------------------- affine forms


def _poly(e: N.Expr) -> dict[tuple, int] | None:
    """e as a polynomial: {sorted tuple of var ids (monomial): integer coefficient}; None if not one."""
    if isinstance(e, N.Const) and is_int(e.dtype):
        return {(): int(e.value)} if e.value else {}
    if isinstance(e, N.Var):
        return {(id(e),): 1}
    if isinstance(e, N.Cast) and is_int(e.dtype) and is_int(e.a.dtype):
        return _poly(e.a)
    if isinstance(e, N.Unary) and e.op == "neg":
        p = _poly(e.a)
        return None if p is None else {k: -c for k, c in p.items()}
    if isinstance(e, N.Binary) and e.op in ("add", "sub", "mul"):
        pa, pb = _poly(e.a), _poly(e.b)
        if pa is None or pb is None:
            return None
        out: dict[tuple, int] = {}
        if e.op == "mul":
            for ka, ca in pa.items():
                for kb, cb in pb.items():
                    k = tuple(sorted(ka + kb))
                    out[k] = out.get(k, 0) + ca * cb
        else:
            sign = 1 if e.op == "add" else -1
            out = dict(pa)
            for k, c in pb.items():
                out[k] = out.get(k, 0) + sign * c
        return {k: c for k, c in out.items() if c}
    return None


# ----------------------------------------------------------------------------- the generator


def _sanitize(name: str) -> str:
    s = re.sub(r"[^A-Za-z0-9_]", "_", name) or "v"
    if s[0].isdigit():
        s = "v" + s
    if s in _C_KEYWORDS or s.startswith("loopir_") or s.startswith("__"):
        s = s + "_"
    return s


@dataclass
class _Names:
    used: set[str] = field(default_factory=set)
    of: dict[int, str] = field(default_factory=dict)

    def fresh(self, base: str) -> str:
        base = _sanitize(base)
        name, k = base, 1
        while name in self.used:
            name = f"{base}_{k}"
            k += 1
        self.used.add(name)
        return name

    def get(self, obj: object, base: str) -> str:
        if id(obj) not in self.of:
            self.of[id(obj)] = self.fresh(base)
        return self.of[id(obj)]


def _body_list(s: N.Stmt) -> list[N.Stmt]:
    return list(s.body) if isinstance(s, N.Seq) else [s]


def _loops(s: N.Stmt) -> list[N.For]:
    return [n for n in walk(s) if isinstance(n, N.For)]


def _stmt_names(s: N.Stmt) -> list[str]:
    return [n.name for n in walk(s) if isinstance(n, N.Store)]


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


def _subst_coords(st: N.Store) -> dict[N.Var, N.Expr]:
    return {it: c for it, c in zip(st.iters, st.coords) if c is not it}


def _reduction_parts(st: N.Store) -> tuple[str, N.Expr] | None:
    """(op, e) when st is `C[idx] = C[idx] op e` (either operand order), else None."""
    v = st.value
    if not isinstance(v, N.Binary) or v.op not in _RED_OPS:
        return None
    self_load = N.Load(st.buffer, st.indices)
    if v.a == self_load:
        return v.op, v.b
    if v.b == self_load:
        return v.op, v.a
    return None


def _identity(op: str, dtype: str) -> str:
    if op == "add":
        return "0" if is_int(dtype) else ("0.0f" if _CTYPE[dtype] == "float" else "0.0")
    if op == "mul":
        return "1" if is_int(dtype) else ("1.0f" if _CTYPE[dtype] == "float" else "1.0")
    neg = op == "max"
    if dtype == "int32":
        return "(-2147483647 - 1)" if neg else "2147483647"
    if dtype == "int64":
        return "(-9223372036854775807LL - 1)" if neg else "9223372036854775807LL"
    inf = "LOOPIR_INF_F" if _CTYPE[dtype] == "float" else "LOOPIR_INF_D"
    return f"(-{inf})" if neg else inf


def _monotone_guard(cond: N.Expr, v: N.Var) -> bool:
    """cond is a conjunction of `a < b` / `a <= b` where a - b is affine with a coefficient >= 0 on v."""
    if isinstance(cond, N.Logical) and cond.op == "and":
        return _monotone_guard(cond.a, v) and _monotone_guard(cond.b, v)  # type: ignore[arg-type]
    if not (isinstance(cond, N.Compare) and cond.op in ("lt", "le")):
        return False
    p = _poly(N.binary("sub", cond.a, cond.b))
    if p is None or any(id(v) in k and k != (id(v),) for k in p):
        return False
    return p.get((id(v),), 0) >= 0


_INT32_SLACK = 2048  # a guarded access may run a tile past a dimension's end before its guard is tested


def _fits_int32(nest: N.Stmt) -> bool:
    """Every buffer of the nest has a constant shape whose padded element count, prod(d + _INT32_SLACK),
    stays below 2**31: then every index the kernel computes (flat offsets of guarded, possibly out-of-range
    tile elements included) fits a 32-bit int, and index arithmetic may be `int` (fewer registers)."""
    seen: dict[int, N.Buffer] = {}
    for n in walk(nest):
        b = getattr(n, "buffer", None)
        if isinstance(b, N.Buffer):
            seen[id(b)] = b
    for b in seen.values():
        if not all(isinstance(d, N.Const) for d in b.shape):
            return False
        if math.prod(int(d.value) + _INT32_SLACK for d in b.shape) >= 2**31:  # type: ignore[attr-defined]
            return False
    for f in _loops(nest):  # constant loop bounds too (bounds in enclosing loops follow the tiles of the buffers)
        if any(isinstance(e, N.Const) and abs(int(e.value)) >= 2**30 for e in (f.lo, f.hi)):
            return False
    return True


class _KernelGen:
    """Emits one kernel for one top-level nest."""

    def __init__(self, program: N.Program, nest: N.Stmt, name: str, is_last_kernel_stmt: bool = True):
        self.program = program
        self.nest = nest
        self.kname = name
        self.names = _Names()
        self.lines: list[str] = []
        self.ind = 1
        self.uses_half = False
        self.uses_reduce = False
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

    # ---------------------------------------------------------------- analysis
    def analyse(self) -> LaunchPlan:
        loops = _loops(self.nest)
        bound = [f for f in loops if f.kind == "thread"]
        params = set(self.program.params) | self._size_vars()
        ext: dict[str, list[N.Expr]] = {}
        self.extent: dict[int, N.Expr] = {}
        for f in bound:
            if f.thread not in N.GPU_AXES:
                raise CudaCodegenError(f"loop {f.var.name!r} is bound to unknown GPU axis {f.thread!r}; "
                                       f"use one of {', '.join(N.GPU_AXES)}")
            e = _upper_extent(N.binary("sub", f.hi, f.lo), params)
            if e is None:
                raise CudaCodegenError(
                    f"loop {f.var.name!r} bound to {f.thread} has extent {f.hi} - {f.lo}, which varies with "
                    "another loop; a GPU launch extent may depend only on the sizes "
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
            if axis == "threadIdx.x" and self.has_reduction:
                m = N.binary("mul", N.binary("floordiv", N.binary("add", m, 31), 32), 32)
            launch[axis] = m
        self.launch = launch
        one = N.const(1)
        grid = tuple(launch.get("blockIdx." + a, one) for a in _AXES)
        block = tuple(launch.get("threadIdx." + a, one) for a in _AXES)
        return LaunchPlan(grid, block)  # type: ignore[arg-type]

    def _size_vars(self) -> set[N.Var]:
        defined = {f.var for f in _loops(self.nest)}
        for n in walk(self.nest):
            if isinstance(n, N.Store):
                defined.update(n.iters)
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

    def _reductions_in(self, f: N.For) -> list[N.Store]:
        """Stores inside f whose index does not use f's var nor loops inside f."""
        inner = {x.var for x in _loops(f)}
        out = []
        for n in walk(f.body):
            if isinstance(n, N.Store):
                idx = tuple(substitute(i, _subst_coords(n)) for i in n.indices)
                used = set().union(*(free_vars(i) for i in idx)) if idx else set()
                if not (used & inner):
                    out.append(n)
        return out

    def _is_reduction_loop(self, f: N.For) -> bool:
        return f.kind == "thread" and f.thread == "threadIdx.x" and bool(self._reductions_in(f))

    # ---------------------------------------------------------------- emission helpers
    def line(self, text: str) -> None:
        self.lines.append("  " * self.ind + text)

    def var(self, v: N.Var) -> str:
        return self.names.get(v, v.name)

    def buf(self, b: N.Buffer) -> str:
        return self.names.get(b, b.name)

    def flat(self, b: N.Buffer, idx: tuple[N.Expr, ...]) -> N.Expr:
        if not idx:
            return N.const(0)
        e = idx[0]
        for s, i in zip(b.shape[1:], idx[1:]):
            e = N.binary("add", N.binary("mul", e, s), i)
        return e

    # ---------------------------------------------------------------- expressions
    def expr(self, e: N.Expr) -> str:
        if isinstance(e, N.Const):
            return self.const(e)
        if isinstance(e, N.Var):
            return self.var(e)
        if isinstance(e, N.Load):
            if e in self.vec_lanes:
                return self.vec_lanes[e]
            flat = self.flat(e.buffer, e.indices)
            key = (id(e.buffer), substitute(flat, self.cur_sub))
            for scope in reversed(self.forward):
                if key in scope:
                    return scope[key]
            ref = f"{self.buf(e.buffer)}[{self.expr(flat)}]"
            if e.buffer.dtype == "float16":
                self.uses_half = True
                return f"loopir_h2f({ref})"
            return ref
        if isinstance(e, N.Binary):
            a, b = self.expr(e.a), self.expr(e.b)
            if e.op in ("add", "sub", "mul", "div"):
                return f"({a} {dict(add='+', sub='-', mul='*', div='/')[e.op]} {b})"
            return f"loopir_{e.op}({a}, {b})"
        if isinstance(e, N.Unary):
            return f"(-{self.expr(e.a)})"
        if isinstance(e, N.Call):
            if e in self.pre:
                return self.pre[e]
            return self.call(e)
        if isinstance(e, N.Compare):
            op = dict(lt="<", le="<=", gt=">", ge=">=", eq="==", ne="!=")[e.op]
            return f"({self.expr(e.a)} {op} {self.expr(e.b)})"
        if isinstance(e, N.Logical):
            if e.op == "not":
                return f"(!{self.expr(e.a)})"
            return f"({self.expr(e.a)} {'&&' if e.op == 'and' else '||'} {self.expr(e.b)})"  # type: ignore[arg-type]
        if isinstance(e, N.Select):
            return f"({self.expr(e.cond)} ? {self.expr(e.a)} : {self.expr(e.b)})"
        if isinstance(e, N.Cast):
            inner = self.expr(e.a)
            if e.dtype == "float16":
                self.uses_half = True
                return f"loopir_round_half((float)({inner}))"
            if e.dtype == "bool":
                return f"({inner} != 0)"
            return f"(({_CTYPE[e.dtype]})({inner}))"
        raise CudaCodegenError(f"cannot emit expression {e!r} in CUDA")

    def const(self, c: N.Const) -> str:
        if c.dtype == "bool":
            return "true" if c.value else "false"
        if c.dtype == "int64":
            return str(int(c.value)) if self.ix == "int" and abs(int(c.value)) < 2**31 else f"{int(c.value)}LL"
        if c.dtype == "int32":
            return str(int(c.value))
        f = float(c.value)
        single = _CTYPE[c.dtype] == "float"
        if math.isnan(f):
            return "__int_as_float(0x7fc00000)" if single else "__longlong_as_double(0x7ff8000000000000LL)"
        if math.isinf(f):
            inf = "LOOPIR_INF_F" if single else "LOOPIR_INF_D"
            return inf if f > 0 else f"(-{inf})"
        text = repr(f)
        if "e" not in text and "." not in text:
            text += ".0"
        return text + ("f" if single else "")

    def call(self, e: N.Call) -> str:
        args = [self.expr(a) for a in e.args]
        single = _CTYPE[e.dtype] == "float"
        x = args[0]
        if e.fn == "abs":
            if is_int(e.dtype):
                return f"llabs({x})" if e.dtype == "int64" else f"abs({x})"
            return f"fabsf({x})" if single else f"fabs({x})"
        if e.fn == "sigmoid":
            return f"(1.0f / (1.0f + expf(-({x}))))" if single else f"(1.0 / (1.0 + exp(-({x}))))"
        fn = {"exp": "exp", "log": "log", "sqrt": "sqrt", "rsqrt": "rsqrt", "sin": "sin", "cos": "cos",
              "tanh": "tanh", "erf": "erf"}[e.fn]
        return f"{fn}f({x})" if single else f"{fn}({x})"

    # ---------------------------------------------------------------- statements
    def stmt(self, s: N.Stmt, last: bool) -> None:
        if isinstance(s, N.Seq):
            for k, c in enumerate(s.body):
                self.stmt(c, last and k == len(s.body) - 1)
        elif isinstance(s, N.For):
            self.loop(s, last)
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
        self.line(f"{{  // {st.name}")
        self.ind += 1
        self.cur_sub = _subst_coords(st)
        for it, c in zip(st.iters, st.coords):
            if c is not it:
                self.line(f"const {self.ix} {self.var(it)} = {self.expr(c)};")
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

    def sincos(self, value: N.Expr) -> None:
        """sin(a) and cos(a) of the same argument: one sincosf call shares the range reduction."""
        calls = {}
        for n in walk(value):
            if isinstance(n, N.Call) and n.fn in ("sin", "cos"):
                calls.setdefault(n.args[0], {})[n.fn] = n
        for arg, fns in calls.items():
            if len(fns) == 2:
                single = _CTYPE[fns["sin"].dtype] == "float"
                ct = "float" if single else "double"
                sn, cn = self.names.fresh("sin_v"), self.names.fresh("cos_v")
                self.line(f"{ct} {sn}, {cn};")
                self.line(f"{'sincosf' if single else 'sincos'}({self.expr(arg)}, &{sn}, &{cn});")
                self.pre[fns["sin"]], self.pre[fns["cos"]] = sn, cn

    def _reads_itself(self, st: N.Store) -> bool:
        return any(isinstance(n, N.Load) and n.buffer is st.buffer for n in walk(st.value))

    def _invalidate(self, b: N.Buffer) -> None:
        for scope in self.forward:
            for k in [k for k in scope if k[0] == id(b)]:
                del scope[k]
        for k in [k for k in self.init_consts if k[0] == id(b)]:
            del self.init_consts[k]

    @staticmethod
    def red_combine(op: str, a: str, b: str) -> str:
        if op in ("add", "mul"):
            return f"{a} {'+' if op == 'add' else '*'} {b}"
        return f"loopir_{op}({a}, {b})"

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
        if needs_guard:
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

    # ---------------------------------------------------------------- cross-thread reduction
    def reduction_loop(self, f: N.For, last: bool) -> None:
        reds = self._reductions_in(f)
        for st in reds:
            if _reduction_parts(st) is None:
                raise CudaCodegenError(
                    f"statement {st.name!r} inside loop {f.var.name!r} (bound to threadIdx.x) writes the same "
                    f"element of {st.buffer.name!r} from every thread, and is not a reduction C = C op e "
                    f"(op in {', '.join(_RED_OPS)})")
        self.uses_reduce = True
        accs: dict[int, str] = {}
        for st in reds:
            op, _ = _reduction_parts(st)  # type: ignore[misc]
            ct = _CTYPE[st.buffer.dtype]
            acc = self.names.fresh(f"{st.name}_acc")
            accs[id(st)] = acc
            self.line(f"{ct} {acc} = {_identity(op, st.buffer.dtype)};  // {st.name}: this thread's share")
        saved = self.red_targets
        self.red_targets = {**saved, **accs}
        self.bound_loop(f, lambda: self.stmt(f.body, last))
        self.red_targets = saved
        for st in reds:
            op, _ = _reduction_parts(st)  # type: ignore[misc]
            ct = _CTYPE[st.buffer.dtype]
            acc = accs[id(st)]
            smem = self.red_smem.setdefault(ct, self.names.fresh(f"loopir_red_{ct.replace(' ', '_')}"))
            idx = tuple(substitute(i, _subst_coords(st)) for i in st.indices)
            flat = self.flat(st.buffer, idx)
            ref = f"{self.buf(st.buffer)}[{self.expr(flat)}]"
            # read the current value BEFORE the barriers of the all-reduce: thread 0 overwrites it after them
            cur = self.names.fresh(f"{st.name}_before")
            init = self.init_consts.get((id(st.buffer), flat))
            if init is not None and init[0] is self.forward[-1]:  # written in this scope, nothing since
                self.line(f"const {ct} {cur} = {init[1]};  // {st.buffer.name}[...] as initialized above")
            else:
                self.line(f"const {ct} {cur} = {f'loopir_h2f({ref})' if st.buffer.dtype == 'float16' else ref};")
            self.line(f"{acc} = loopir_block_allreduce({acc}, loopir_op_{op}(), "
                      f"({ct}){_identity(op, st.buffer.dtype)}, {smem});  // {st.name}: across threads")
            total = self.names.fresh(f"{st.name}_total")
            self.line(f"const {ct} {total} = {self.red_combine(op, cur, acc)};")
            val = f"loopir_f2h({total})" if st.buffer.dtype == "float16" else total
            self.line(f"if (threadIdx.x == 0) {ref} = {val};")
            self._invalidate(st.buffer)
            self.forward[-1][(id(st.buffer), flat)] = total
        if not last:
            self.line("__syncthreads();  // the reduced values are visible to the whole block")
        return None

    def _check_uniform_context(self, f: N.For, path: list[N.Stmt]) -> None:
        for p in path:
            if isinstance(p, N.For) and p.kind == "thread" and p.thread.startswith("threadIdx"):
                raise CudaCodegenError(
                    f"loop {f.var.name!r} is a cross-thread reduction bound to threadIdx.x inside loop "
                    f"{p.var.name!r} bound to {p.thread}; every thread of the block must reach the reduction")
            if isinstance(p, N.If):
                tv = {x.var for x in _loops(self.nest) if x.kind == "thread" and x.thread.startswith("threadIdx")}
                if free_vars(p.cond) & tv:
                    raise CudaCodegenError(
                        f"loop {f.var.name!r} is a cross-thread reduction under condition {p.cond}, which depends "
                        "on a thread index; every thread of the block must reach the reduction")

    def check_reductions(self) -> None:
        def go(s: N.Stmt, path: list[N.Stmt]) -> None:
            if isinstance(s, N.For):
                if self._is_reduction_loop(s):
                    self._check_uniform_context(s, path)
                go(s.body, path + [s])
            elif isinstance(s, N.Seq):
                for c in s.body:
                    go(c, path)
            elif isinstance(s, N.If):
                go(s.then, path + [s])
                if s.orelse is not None:
                    go(s.orelse, path + [s])
            elif isinstance(s, N.Allocate):
                go(s.body, path)

        go(self.nest, [])

    # ---------------------------------------------------------------- cooperative shared copies
    def cooperative(self, f: N.For, async_: bool = False) -> bool:
        """A "parallel" nest inside thread-bound loops whose one statement fills a shared buffer with values that
        do not depend on the thread (cache_read "shared" of a block tile): every thread would write the same
        values, so the block's threads share the iterations (thread t: flat iterations t, t + T, ...), with
        128-bit loads and stores where the alignment is proven (else checked at run time). Requires every thread
        of the block to reach the nest (no thread-dependent guard around it); otherwise plain loops.
        `async_`: the copies are `cp.async` (16 or 4 bytes), completed by the caller (see `pipelined`)."""
        loops: list[N.For] = []
        inner: N.Stmt = f
        while isinstance(inner, N.For) and inner.kind == "parallel":
            if not (_is_const(inner.lo) and _is_const(inner.hi)) or inner.lo.value != 0:  # type: ignore[attr-defined]
                return False
            loops.append(inner)
            inner = inner.body
        guard = None
        if isinstance(inner, N.If) and inner.orelse is None:
            guard, inner = inner.cond, inner.then
        if not isinstance(inner, N.Store) or inner.buffer.scope != "shared":
            return False
        tvars = {x.var for x in _loops(self.nest) if x.kind == "thread" and (x.thread or "").startswith("threadIdx")}
        sub = _subst_coords(inner)
        used = free_vars(substitute(inner.value, sub)) | free_vars(guard if guard is not None else N.const(0))
        for i in inner.indices:
            used |= free_vars(substitute(i, sub))
        if used & tvars or not self._uniform_path(f, tvars):
            return False
        dims = [int(x.hi.value) for x in loops]  # type: ignore[attr-defined]
        total = math.prod(dims)
        ext = [self.launch.get(f"threadIdx.{a}", N.const(1)) for a in _AXES]
        nt = math.prod(int(e.value) for e in ext) if all(_is_const(e) for e in ext) else None  # type: ignore[attr-defined]
        t, e = self.names.fresh("coop_t"), self.names.fresh("coop_e")
        self.line(f"{{  // {inner.name}: cooperative copy of {total} elements by the block's threads")
        self.ind += 1
        self.line(f"const int {t} = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);")
        vec = None
        if guard is None and dims[-1] % 4 == 0 and isinstance(inner.value, N.Load):
            vec = self._coop_vector(inner, loops[-1].var, sub)
        if vec is not None:
            checks, src, dst = vec
            if checks:
                self.line(f"if ({' && '.join(checks)}) {{")
                self.ind += 1
            self._coop_loop(loops, dims, total // 4, nt, t, e, 4, lambda: self.line(
                f"loopir_cp_async16(&{self.buf(inner.buffer)}[{self.expr(dst)}], "
                f"&{self.buf(inner.value.buffer)}[{self.expr(src)}]);") if async_ else self.line(  # type: ignore[union-attr]
                f"*reinterpret_cast<float4*>(&{self.buf(inner.buffer)}[{self.expr(dst)}]) = "
                f"*reinterpret_cast<const float4*>(&{self.buf(inner.value.buffer)}[{self.expr(src)}]);"))  # type: ignore[union-attr]
            if checks:
                self.ind -= 1
                self.line("} else {")
                self.ind += 1
        if vec is None or vec[0]:
            body = inner if guard is None else N.If(guard, inner)
            self._coop_loop(loops, dims, total, nt, t, e, 1, lambda: self._async_scalar(inner, guard) if async_
                            else self.stmt(body, False))
        if vec is not None and vec[0]:
            self.ind -= 1
            self.line("}")
        self._invalidate(inner.buffer)
        self.ind -= 1
        self.line("}")
        return True

    def _async_scalar(self, st: N.Store, guard: N.Expr | None) -> None:
        """One element of a pipelined cooperative copy: a 4-byte cp.async (skipped where the copy's clip fails)."""
        self.line(f"{{  // {st.name}")
        self.ind += 1
        self.cur_sub = _subst_coords(st)
        for it, c in zip(st.iters, st.coords):
            if c is not it:
                self.line(f"const {self.ix} {self.var(it)} = {self.expr(c)};")
        ld = st.value
        assert isinstance(ld, N.Load)
        call = (f"loopir_cp_async4(&{self.buf(st.buffer)}[{self.expr(self.flat(st.buffer, st.indices))}], "
                f"&{self.buf(ld.buffer)}[{self.expr(self.flat(ld.buffer, ld.indices))}]);")
        self.line(call if guard is None else f"if ({self.expr(guard)}) {call}")
        self.cur_sub = {}
        self.ind -= 1
        self.line("}")

    def _copy_store(self, c: N.Stmt) -> N.Store | None:
        """The Store of a cooperative block-tile copy nest (parallel loops, an optional clip, one Store of a
        global float32 load into a float32 shared buffer), else None."""
        inner = c
        while isinstance(inner, N.For) and inner.kind == "parallel":
            inner = inner.body
        if isinstance(inner, N.If) and inner.orelse is None:
            inner = inner.then
        if not (c is not inner and isinstance(inner, N.Store) and inner.buffer.scope == "shared"
                and inner.buffer.dtype == "float32" and isinstance(inner.value, N.Load)
                and inner.value.buffer.scope == "global" and inner.value.buffer.dtype == "float32"):
            return None
        return inner

    def pipelined(self, f: N.For, last: bool) -> bool:
        """Software pipelining of a loop that stages block tiles (cache_read "shared"): the body is
        `allocate S1.. shared: copies into S1..; barrier; REST; barrier`. Emitted with two stages per shared
        buffer: tile k+1 is copied by `cp.async` into the other stage while tile k is computed on.

            issue copy(lo) -> stage 0                  for k: issue copy(k+1) -> stage (k+1-lo)&1 (if k+1 < hi)
                                                              wait for copy(k); barrier; REST on stage (k-lo)&1; barrier

        Same results as the plain loop, because: (1) the copies read global buffers that no statement of this
        kernel writes, so reading them one iteration early reads the same values; (2) the shared buffers are
        allocated inside the loop (no value flows between iterations) and REST does not write them, so every
        load in iteration k reads what copy(k) wrote, in stage (k-lo)&1, which nothing else writes during
        iteration k: copy(k+1) writes the other stage, last read in iteration k-1, before that iteration's
        closing barrier; copy(k+2) is issued after iteration k's closing barrier; (3) wait_group + barrier
        make copy(k) complete and visible to every thread before REST, as the first barrier did. Elements a
        copy's clip skips stay unspecified, as before. Requires every thread to reach the loop (the copies are
        cooperative) and sm_80+ (cp.async). Returns False (plain emission) when the loop has another shape."""
        if not (PIPELINE_SHARED_COPIES and f.kind == "serial" and self.thread_depth > 0):
            return False
        chain: list[N.Buffer] = []
        inner: N.Stmt = f.body
        while isinstance(inner, N.Allocate) and inner.buffer.scope == "shared":
            chain.append(inner.buffer)
            inner = inner.body
        if not chain or not isinstance(inner, N.Seq):
            return False
        items = list(inner.body)
        first = next((k for k, x in enumerate(items) if isinstance(x, N.Barrier)), None)
        if first is None or first == 0 or first == len(items) - 1 or not isinstance(items[-1], N.Barrier):
            return False
        stores = [self._copy_store(c) for c in items[:first]]
        if any(st is None for st in stores):
            return False
        ids = {id(b) for b in chain}
        if sorted(id(st.buffer) for st in stores) != sorted(ids):  # type: ignore[union-attr]
            return False
        if any(math.prod(int(d.value) for d in b.shape) % 4 for b in chain):  # type: ignore[attr-defined]
            return False  # each stage must start 16-byte aligned
        others = sum(math.prod(int(d.value) for d in n.buffer.shape) * _NPTYPE[n.buffer.dtype]  # type: ignore[attr-defined]
                     for n in walk(self.nest) if isinstance(n, N.Allocate) and n.buffer.scope == "shared")
        if others + sum(4 * math.prod(int(d.value) for d in b.shape) for b in chain) > 48 * 1024:  # type: ignore[attr-defined]
            return False  # a second stage would pass the 48 KiB of static shared memory
        written = {id(n.buffer) for n in walk(self.nest) if isinstance(n, N.Store)}
        if any(id(st.value.buffer) in written for st in stores):  # type: ignore[union-attr]
            return False
        if any(isinstance(n, N.Store) and id(n.buffer) in ids for r in items[first:] for n in walk(r)):
            return False
        tvars = {x.var for x in _loops(self.nest) if x.kind == "thread" and (x.thread or "").startswith("threadIdx")}
        for c, st in zip(items[:first], stores):
            sub = _subst_coords(st)  # type: ignore[arg-type]
            used = free_vars(substitute(st.value, sub)).union(  # type: ignore[union-attr]
                *(free_vars(substitute(i, sub)) for i in st.indices))  # type: ignore[union-attr]
            if isinstance(c, N.For) and isinstance(c.body, N.If):
                used |= free_vars(c.body.cond)
            guards = [n.cond for n in walk(c) if isinstance(n, N.If)]
            used = used.union(*(free_vars(g) for g in guards))
            if used & tvars or not self._uniform_path(c, tvars):
                return False
        self.uses_async = True
        v, ix = self.var(f.var), self.ix
        lo, hi = self.expr(f.lo), self.expr(f.hi)
        size = {id(b): math.prod(int(d.value) for d in b.shape) for b in chain}  # type: ignore[attr-defined]
        stages = {id(b): self.names.fresh(f"{b.name}_stages") for b in chain}
        self.line(f"{{  // loop {f.var.name}: software-pipelined, next tiles copied by cp.async into a second stage")
        self.ind += 1
        for b in chain:
            self.line(f"__shared__ __align__(16) float {stages[id(b)]}[{2 * size[id(b)]}];  // 2 stages of {b.name}")
        saved = dict(self.names.of)

        def issue(k: str) -> None:
            for b in chain:
                nb = self.names.fresh(f"{b.name}_st")
                self.line(f"float* {nb} = {stages[id(b)]} + ((({k}) - ({lo})) & 1) * {size[id(b)]};")
                self.names.of[id(b)] = nb
            kn = self.names.fresh(f"{f.var.name}_copy")
            self.line(f"const {ix} {kn} = {k};")
            self.names.of[id(f.var)] = kn
            for c in items[:first]:
                assert self.cooperative(c, async_=True)  # type: ignore[arg-type]
            self.names.of.clear()
            self.names.of.update(saved)

        self.line(f"if ({lo} < {hi}) {{  // the first tiles")
        self.ind += 1
        issue(lo)
        self.ind -= 1
        self.line("}")
        self.line('asm volatile("cp.async.commit_group;" ::: "memory");')
        self.line(f"for ({ix} {v} = {lo}; {v} < {hi}; ++{v}) {{")
        self.ind += 1
        self.forward.append({})
        self.line(f"if ({v} + 1 < {hi}) {{  // the next tiles, into the other stage")
        self.ind += 1
        issue(f"{v} + 1")
        self.ind -= 1
        self.line("}")
        self.line('asm volatile("cp.async.commit_group;" ::: "memory");')
        self.line('asm volatile("cp.async.wait_group 1;" ::: "memory");  // this iteration\'s tiles have landed')
        for b in chain:
            self.line(f"float* {self.buf(b)} = {stages[id(b)]} + (({v} - ({lo})) & 1) * {size[id(b)]};")
        for k, x in enumerate(items[first:]):
            self.stmt(x, last and k == len(items) - first - 1)
        self.forward.pop()
        self.ind -= 1
        self.line("}")
        self.ind -= 1
        self.line("}")
        return True

    def _coop_loop(self, loops: list[N.For], dims: list[int], n: int, nt: int | None, t: str, e: str, width: int,
                   body) -> None:
        if nt is not None:
            reps = -(-n // nt)
            self.line("#pragma unroll")
            r = self.names.fresh("coop_r")
            self.line(f"for (int {r} = 0; {r} < {reps}; ++{r}) {{")
            self.ind += 1
            self.line(f"const int {e} = {t} + {r} * {nt};")
            if n % nt:
                self.line(f"if ({e} < {n}) {{")
                self.ind += 1
        else:
            self.line(f"for (int {e} = {t}; {e} < {n}; {e} += blockDim.x * blockDim.y * blockDim.z) {{")
            self.ind += 1
        flat = f"({e} * {width})" if width != 1 else e
        stride = 1
        for x, d in reversed(list(zip(loops, dims))):
            q = f"({flat} / {stride})" if stride != 1 else flat
            self.line(f"const {self.ix} {self.var(x.var)} = {q} % {d};")
            stride *= d
        body()
        if nt is not None and n % nt:
            self.ind -= 1
            self.line("}")
        self.ind -= 1
        self.line("}")

    def _coop_vector(self, st: N.Store, v: N.Var, sub: dict) -> tuple[list[str], N.Expr, N.Expr] | None:
        ld = st.value
        if not (isinstance(ld, N.Load) and ld.buffer.dtype == "float32" and st.buffer.dtype == "float32"
                and ld.buffer.scope == "global"):
            return None
        checks: list[str] = []
        src = self._aligned_base(substitute(self.flat(ld.buffer, ld.indices), sub), v, checks)
        dchecks: list[str] = []
        dst = self._aligned_base(substitute(self.flat(st.buffer, st.indices), sub), v, dchecks)
        if src is None or dst is None or dchecks:
            return None
        checks.append(f"(((unsigned long long){self.buf(ld.buffer)}) & 15) == 0")
        return list(dict.fromkeys(checks)), N.binary("add", src, v), N.binary("add", dst, v)

    def _uniform_path(self, target: N.Stmt, tvars: set[N.Var]) -> bool:
        """Every thread of the block reaches `target`: no guarded thread-bound loop, no thread-dependent If."""
        def go(s: N.Stmt) -> bool | None:
            if s is target:
                return True
            kids: list[N.Stmt] = []
            if isinstance(s, N.For):
                kids = [s.body]
            elif isinstance(s, N.Seq):
                kids = list(s.body)
            elif isinstance(s, N.Allocate):
                kids = [s.body]
            elif isinstance(s, N.If):
                kids = [s.then] + ([s.orelse] if s.orelse is not None else [])
            for k in kids:
                r = go(k)
                if r is None:
                    continue
                if not r:
                    return False
                if isinstance(s, N.If) and free_vars(s.cond) & tvars:
                    return False
                if isinstance(s, N.For) and s.kind == "thread" and (s.thread or "").startswith("threadIdx"):
                    ext = self.extent[id(s)]
                    if not (ext == self.launch[s.thread] and ext == N.binary("sub", s.hi, s.lo)):
                        return False
                return True
            return None

        return bool(go(self.nest))

    # ---------------------------------------------------------------- float4
    def _vector_prepare(self, f: N.For) -> tuple | None:
        """(checks, stores, [(store, base, value)], [(load, base)]) when f maps to float4 accesses."""
        body = f.body
        if not (_is_const(f.lo) and _is_const(f.hi) and f.lo.value == 0 and f.hi.value == 4):  # type: ignore[attr-defined]
            return None
        guard = None
        if isinstance(body, N.If) and body.orelse is None and isinstance(body.then, (N.Store, N.Seq)):
            guard, body = body.cond, body.then  # a non-dividing split's guard, a cache_read copy's clip
        # one store, or several (horizontally fused outputs of one element) sharing the lane loop
        stores = list(body.body) if isinstance(body, N.Seq) else [body]
        if not all(isinstance(st, N.Store) and st.buffer.dtype == "float32" and st.buffer.scope in _VEC_SCOPES
                   for st in stores):
            return None
        v = f.var
        checks: list[str] = []
        if guard is not None:
            if not _monotone_guard(guard, v):
                return None
            # every conjunct grows with the lane: holding at lane 3 it holds at lanes 0..3
            checks.append(self.expr(substitute(guard, {v: N.const(3)})))
        written = {id(st.buffer) for st in stores}
        outs: list[tuple[N.Store, N.Expr, N.Expr]] = []  # (store, base, value in loop variables)
        vec_loads: list[tuple[N.Load, N.Expr]] = []
        for st in stores:
            sub = _subst_coords(st)
            sflat = self.flat(st.buffer, tuple(substitute(i, sub) for i in st.indices))
            base = self._aligned_base(sflat, v, checks)
            if base is None:
                return None
            checks.append(f"(((unsigned long long){self.buf(st.buffer)}) & 15) == 0")
            value = substitute(st.value, sub)
            for n in walk(value):
                if isinstance(n, N.Load) and id(n.buffer) in written and len(stores) > 1:
                    return None  # loads are hoisted above all the stores: none may read what they write
                if isinstance(n, N.Load) and v in free_vars(n):
                    lflat = self.flat(n.buffer, n.indices)
                    if n.buffer.dtype != "float32" or n.buffer.scope not in _VEC_SCOPES:
                        continue
                    lbase = self._aligned_base(lflat, v, checks)
                    if lbase is None:
                        continue
                    if all(n != x for x, _ in vec_loads):
                        vec_loads.append((n, lbase))
                        checks.append(f"(((unsigned long long){self.buf(n.buffer)}) & 15) == 0")
            outs.append((st, base, value))
        return checks, stores, outs, vec_loads

    def try_vector(self, f: N.For) -> bool:
        prep = self._vector_prepare(f)
        if prep is None:
            return False
        checks, stores, outs, vec_loads = prep
        v = f.var
        cond = " && ".join(dict.fromkeys(checks))
        names = ", ".join(st.name for st in stores)
        self.line(f"if ({cond}) {{  // {names}: 128-bit vector loads/stores over {v.name}")
        self.ind += 1
        self._vector_emit(v, outs, vec_loads)
        self.ind -= 1
        self.line("} else {")
        self.ind += 1
        vn = self.var(v)
        self.line("#pragma unroll")
        self.line(f"for ({self.ix} {vn} = 0; {vn} < 4; ++{vn}) {{")
        self.block(f.body, False)
        self.line("}")
        self.ind -= 1
        self.line("}")
        return True

    def _vector_emit(self, v: N.Var, outs: list, vec_loads: list) -> None:
        lane_names = {}
        for ld, lbase in vec_loads:
            nm = self.names.fresh(f"{ld.buffer.name}_v")
            lane_names[ld] = nm
            addr = f"&{self.buf(ld.buffer)}[{self.expr(lbase)}]"
            ptr = f"reinterpret_cast<const float4*>({addr})"
            self.line(f"const float4 {nm} = {f'LOOPIR_LD4({ptr})' if ld.buffer.scope == 'global' else '*' + ptr};")
        for st, base, value in outs:
            out = self.names.fresh(f"{st.name}_v")
            self.line(f"float4 {out};  // {st.name}")
            for lane, comp in enumerate("xyzw"):
                lc = N.const(lane)
                self.vec_lanes = {substitute(ld, {v: lc}): f"{nm}.{comp}" for ld, nm in lane_names.items()}
                lane_value = substitute(value, {v: lc})
                self.sincos(lane_value)  # sin and cos of one lane's argument share one sincosf
                self.line(f"{out}.{comp} = {self.expr(lane_value)};")
            self.vec_lanes = {}
            self.pre = {}
            ptr = f"reinterpret_cast<float4*>(&{self.buf(st.buffer)}[{self.expr(base)}])"
            self.line(f"LOOPIR_ST4({ptr}, {out});" if st.buffer.scope == "global" else f"*{ptr} = {out};")
            self._invalidate(st.buffer)

    def _aligned_base(self, flat: N.Expr, v: N.Var, checks: list[str]) -> N.Expr | None:
        """flat - v if flat = base + v with base a multiple of 4 (run-time checks appended), else None."""
        p = _poly(flat)
        if p is None or p.get((id(v),)) != 1:
            return None
        if any(id(v) in k for k in p if k != (id(v),)):
            return None
        loopvars = {id(x.var) for x in _loops(self.nest)}
        byid = {id(x): x for x in free_vars(flat)}
        for k, c in p.items():
            if k == (id(v),) or c % 4 == 0:
                continue
            sizes = [byid[i] for i in k if i not in loopvars]
            if not sizes:
                return None  # a loop-variable term with a coefficient not divisible by 4
            prod = " * ".join(self.var(s) for s in sizes)
            checks.append(f"(({c}LL * {prod}) % 4 == 0)")
        return substitute(flat, {v: N.const(0)})

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


def generate_cuda(program: N.Program) -> CudaSource:
    """CUDA C for `program`: one kernel per top-level nest (see the module docstring)."""
    nests = _body_list(program.body)
    names = _Names()
    texts: list[str] = []
    kernels: list[Kernel] = []
    half = reduce_ = async_ = False
    for k, nest in enumerate(nests):
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
        gen = _KernelGen(program, nest, kname)
        text, kern = gen.generate()
        half |= gen.uses_half
        reduce_ |= gen.uses_reduce
        async_ |= gen.uses_async
        texts.append(text)
        kernels.append(kern)
    parts = [PRELUDE]
    if half:
        parts.append(PRELUDE_HALF)
    if reduce_:
        parts.append(PRELUDE_REDUCE)
    if async_:
        parts.append(PRELUDE_ASYNC)
    source = "\n".join(parts) + "\n" + "\n\n".join(texts) + "\n"
    return CudaSource(source, tuple(kernels), program)


__all__ = ["generate_cuda", "CudaSource", "Kernel", "KernelArg", "LaunchPlan", "CudaCodegenError",
           "UnboundLoopError", "eval_index"]
