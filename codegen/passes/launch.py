"""Launch planning (CUDA pipeline): every kernel becomes a `Kernel` node that carries its decisions.

    for bi in range(0, n):  # blockIdx.x            kernel y_x<<<(n, 1, 1), (128, 1, 1)>>>:  # index int64; ...
        for t in range(0, 100):  # threadIdx.x  ==>     for bi in range(0, n):  # blockIdx.x
            ...                                              for t in range(0, 100):  # threadIdx.x
                                                                 ...

Decided here, once, and only printed by the renderer (codegen.cuda):
- grid and block: per axis the largest extent bound to it (an extent that varies with an outer loop is
  launched at its exact maximum over those loops, found by isl; `threadIdx.x` rounded up to whole warps
  when the kernel holds a cross-thread reduction);
- `guarded`: the bound loops whose extent may fall short of the launch extent keep `v < hi`;
- `index_dtype`: int32 when every size is known and every padded buffer stays below 2**31 elements;
- `reductions`: the threadIdx.x loops holding `C[idx] = C[idx] op e` with idx free of them and of the
  loops inside them (lowered to a block all-reduce); every thread must reach them; `subwarp` W > 0 when
  rows of W lanes reduce by shuffles within a warp instead (no shared memory, no block synchronisation);
- `cooperative`: the "parallel" nests inside thread loops that fill a shared buffer with values free of
  the thread, reached by every thread: the block's threads share their iterations;
- `single_thread`: read-modify-writes outside every thread loop, which thread 0 alone applies;
- `cluster`: the `cluster` pragma of the loop bound to blockIdx.x (`cluster_size`): the block is a cluster's
  threads (threadIdx.x up to cluster x 1024), launched as that many blocks of a thread-block cluster.
Refused here (CudaCodegenError): an unknown axis, an axis bound twice on one path, a nest with loops but
none bound, a launch extent with no maximum, a reduction whose trip count depends on the thread.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import islpy as isl

from loopir import nodes as N
from loopir.errors import CudaCodegenError, UnboundLoopError
from loopir.isl_conv import NonAffine, aff, aff_to_expr, cond, pw_to_expr
from loopir.isl_conv import _Names as _IslNames
from loopir.gpu import cluster_pragmas, is_fill, is_reduction_loop, is_thread_loop, upper_extent
from loopir.te_extern import extern_nest
from schedules.primitives.flash import FLASH_KINDS, FlashMismatch, FlashShape, flash_parts
from schedules.primitives.wgmma import TMA_THREADS, WGMMA, WgmmaMismatch, kernel_tile
from loopir.visit import free_vars, loops_of, path_to, subst_coords, substitute, walk

from .gpu_model import by_thread_depth
from .kernels import kernels, map_kernels

AXES = ("x", "y", "z")


def plan_kernels(program: N.Program, int32_sizes: bool = False) -> N.Program:
    """Wrap every kernel in a `Kernel` node with its launch, index width and lowering decisions.

    identity on the executed instances: a Kernel runs its body once per block and thread of its launch.
    `int32_sizes`: the caller guarantees that at every size the program will run with, each buffer's padded
    element count stays below 2**31 (call-time specialization checks it per call, codegen.specialize), so
    a kernel with symbolic sizes may use 32-bit indices too (constant shapes and loop bounds still checked)."""
    host_vars: dict[int, frozenset[N.Var]] = {}
    for loops, k in kernels(program):
        host_vars[id(k)] = frozenset(lp.var for lp in loops)
    return map_kernels(program, lambda k: _plan(program, k, host_vars.get(id(k), frozenset()), int32_sizes))


def _plan(program: N.Program, nest: N.Stmt, host_vars: frozenset[N.Var], int32_sizes: bool = False) -> N.Stmt:
    if isinstance(nest, N.Kernel):
        return nest
    loops = loops_of(nest)
    ext = extern_nest(nest)
    if ext is not None:  # a te.extern stage: its __device__ function is the body of the launch it asks for
        blocks, threads = ext[1].decl.cuda_launch
        one = N.const(1)
        return N.Kernel("", nest, (N.const(blocks), one, one), (N.const(threads), one, one), "int64")
    if loops and not any(f.kind == "thread" for f in loops):
        outer = loops[0]
        stmts = ", ".join(dict.fromkeys(n.name for n in walk(nest) if isinstance(n, N.Store)))
        raise UnboundLoopError(
            f"loop {outer.var.name!r} (statements {stmts}) is not bound to a GPU axis; on target 'cuda' "
            f"every top-level nest must be bound: bind it (e.g. s.split({outer.var.name}, 256) then "
            "s.bind(outer, 'blockIdx.x').bind(inner, 'threadIdx.x')) or use auto_schedule")
    _check_nesting(nest, set())
    sizes = size_vars(nest, host_vars)
    params = set(program.params) | sizes
    bound = [f for f in loops if f.kind == "thread"]
    reductions = frozenset(f.var for f in bound if is_reduction_loop(f))
    extent, launch = _launch(nest, bound, params)
    subwarp = subwarp_width(nest, launch, reductions)
    if "threadIdx.x" in launch and reductions and not subwarp:  # whole warps for the block all-reduce
        m = launch["threadIdx.x"]
        launch["threadIdx.x"] = N.binary("mul", N.binary("floordiv", N.binary("add", m, 31), 32), 32)
    one = N.const(1)
    grid = tuple(launch.get("blockIdx." + a, one) for a in AXES)
    block = tuple(launch.get("threadIdx." + a, one) for a in AXES)
    flash = next((f for f in walk(nest) if isinstance(f, N.For) and f.kind in FLASH_KINDS), None)
    if flash is not None:  # the pass's own warps (codegen.cuda.flash, flash_wgmma)
        block = (N.const(_flash_shape(flash).threads), one, one)
    try:
        tile = kernel_tile(nest)
    except WgmmaMismatch as e:
        raise CudaCodegenError(f"the tile marked {WGMMA} changed shape: {e}") from None
    guarded = frozenset(f.var for f in bound if not (extent[id(f)] == launch[f.thread])
                        or extent[id(f)] != N.binary("sub", f.hi, f.lo))
    if tile is not None:  # a warpgroup per 64 rows of the tile (codegen.cuda.wgmma)
        block = (N.const(tile[1].shape.threads), one, one)
        if tile[2] is not None:  # TMA: a producer warpgroup too (the renderer's launch walks the tiles persistently)
            block = (N.const(TMA_THREADS), one, one)
    _check_reductions(nest, reductions)
    cluster = cluster_size(bound, launch, subwarp)
    globals_sizes = {v for n in walk(nest) if isinstance(n, (N.Load, N.Store)) and n.buffer.scope == "global"
                     for d in n.buffer.shape for v in free_vars(d)}
    index = "int32" if (int32_sizes or not (sizes | globals_sizes)) and fits_int32(nest, int32_sizes) else "int64"
    coop = _cooperative(nest, guarded)
    single = _single_thread(nest)
    return N.Kernel("", nest, grid, block, index, guarded, reductions, coop, frozenset(), single,  # type: ignore[arg-type]
                    subwarp, cluster=cluster)


def cluster_size(bound: list[N.For], launch: dict[str, N.Expr], subwarp: int = 0) -> int:
    """The `cluster` pragma of the kernel's blockIdx.x loops (0: none), checked against the launch: the block's
    threads are those of the whole cluster, a constant x extent of whole warps per block (cluster x 32 divides
    it, at most cluster x 1024), no other block or thread axis (the cluster's blocks take the grid's y axis)."""
    sizes = cluster_pragmas(bound)
    if not sizes:
        return 0
    if len(sizes) > 1:
        raise CudaCodegenError(f"the kernel's loops bound to blockIdx.x ask for different cluster sizes "
                               f"{sorted(sizes)}; a kernel has one")
    c = sizes.pop()
    other = sorted(a for a in launch if a not in ("blockIdx.x", "threadIdx.x"))
    if other:
        raise CudaCodegenError(f"a cluster kernel (pragma cluster {c}) binds {', '.join(other)}; its blocks run on the "
                               "grid's y axis, so it may bind blockIdx.x and threadIdx.x only")
    x = launch.get("threadIdx.x", N.const(1))
    if not isinstance(x, N.Const) or int(x.value) % (32 * c) or int(x.value) > 1024 * c or subwarp:
        raise CudaCodegenError(f"a cluster kernel (pragma cluster {c}) needs a constant threadIdx.x extent that is "
                               f"whole warps in each of its {c} blocks, at most {1024 * c} threads; got {x}")
    return c


def _flash_shape(f: N.For) -> FlashShape:
    try:
        return flash_parts(f).shape
    except FlashMismatch as e:
        raise CudaCodegenError(f"the pass marked {f.kind} at loop {f.var.name!r} changed shape: {e}") from None


def size_vars(nest: N.Stmt, host_vars: frozenset[N.Var] = frozenset()) -> set[N.Var]:
    """Free variables of the kernel that no loop or statement defines: sizes and host loop variables."""
    defined = {f.var for f in loops_of(nest)}
    for n in walk(nest):
        if isinstance(n, N.Store):
            # an iteration variable that is a host loop's own variable (coordinate t = t) is a parameter
            defined.update(v for v in n.iters if v not in host_vars)
    return free_vars(nest) - defined


def _launch(nest: N.Stmt, bound: list[N.For], params: set[N.Var]) -> tuple[dict[int, N.Expr], dict[str, N.Expr]]:
    ext: dict[str, list[N.Expr]] = {}
    extent: dict[int, N.Expr] = {}
    paths = None
    varying: set[str] = set()  # axes with an extent bounded by isl: their launch max is simplified by isl too
    for f in bound:
        if f.thread not in N.GPU_AXES:
            raise CudaCodegenError(f"loop {f.var.name!r} is bound to unknown GPU axis {f.thread!r}; "
                                   f"use one of {', '.join(N.GPU_AXES)}")
        e = upper_extent(N.binary("sub", f.hi, f.lo), params)
        if e is None:
            # an extent that varies with the block index (a compute_at'd producer's clipped tile): launch
            # its exact maximum over the loops around it; the loop keeps its exact guard
            if paths is None:
                paths = _bound_paths(nest)
            e = isl_upper_extent(f, *paths[id(f)])
            if e is not None and not free_vars(e) <= params:
                e = None
            varying.add(f.thread or "")
        if e is None:
            raise CudaCodegenError(
                f"loop {f.var.name!r} bound to {f.thread} has extent {f.hi} - {f.lo}, which varies with "
                "another loop and has no maximum isl can find over those loops (non-affine or unbounded); "
                "a GPU launch extent may depend only on the sizes "
                f"({', '.join(sorted(p.name for p in params)) or 'none'})")
        extent[id(f)] = e
        lst = ext.setdefault(f.thread or "", [])
        if not any(e == x for x in lst):
            lst.append(e)
    launch: dict[str, N.Expr] = {}
    for axis, lst in ext.items():
        m = lst[0]
        for x in lst[1:]:
            m = N.binary("max", m, x)
        if axis in varying and len(lst) > 1:
            simpler = isl_max(m)
            m = m if simpler is None else simpler
        launch[axis] = m
    return extent, launch


def subwarp_width(nest: N.Stmt, launch: dict[str, N.Expr], reductions: frozenset[N.Var]) -> int:
    """W when every cross-thread reduction may use `loopir_subwarp_allreduce<W>`: the x extent is a constant
    power of two W <= 32, the block a constant number of whole warps (so a row of W lanes lies in one warp
    and every lane exists), and each reduction loop sits inside a threadIdx.y / threadIdx.z loop (TVM's
    layout; other kernels keep the block all-reduce with x rounded up to a warp). 0 otherwise."""
    if not reductions:
        return 0
    dims = [launch.get(f"threadIdx.{a}", N.const(1)) for a in AXES]
    if not all(isinstance(d, N.Const) for d in dims):
        return 0
    w, total = int(dims[0].value), math.prod(int(d.value) for d in dims)  # type: ignore[attr-defined]
    if w not in (2, 4, 8, 16, 32) or total % 32 or total > 1024:
        return 0
    paths = _bound_paths(nest)
    for f in loops_of(nest):
        if f.var in reductions and not any(
                p.kind == "thread" and p.thread in ("threadIdx.y", "threadIdx.z") for p in paths[id(f)][0]):
            return 0
    return w


def _check_nesting(s: N.Stmt, seen: set[str]) -> None:
    if isinstance(s, N.For):
        if s.kind == "thread":
            if s.thread in seen:
                raise CudaCodegenError(f"loop {s.var.name!r} is bound to {s.thread} inside another loop bound "
                                       f"to {s.thread}; an axis can be bound once per nesting path")
            seen = seen | {s.thread or ""}
        _check_nesting(s.body, seen)
    elif isinstance(s, N.Seq):
        for c in s.body:
            _check_nesting(c, seen)
    elif isinstance(s, N.If):
        _check_nesting(s.then, seen)
        if s.orelse is not None:
            _check_nesting(s.orelse, seen)
    elif isinstance(s, N.Allocate):
        _check_nesting(s.body, seen)


def _check_reductions(nest: N.Stmt, reductions: frozenset[N.Var]) -> None:
    """A cross-thread reduction's trip count must be the same on every thread (its all-reduce synchronises);
    thread-bound loops and thread-dependent guards around it become predicates in the renderer."""
    tv = {x.var for x in loops_of(nest) if is_thread_loop(x)}

    def go(s: N.Stmt, path: list[N.Stmt]) -> None:
        if isinstance(s, N.For):
            if s.var in reductions:
                for p in path:
                    if isinstance(p, N.For) and p.kind != "thread":
                        used = (free_vars(p.lo) | free_vars(p.hi)) & tv
                        if used:
                            raise CudaCodegenError(
                                f"loop {s.var.name!r} is a cross-thread reduction inside loop {p.var.name!r}, whose "
                                f"bounds {p.lo}..{p.hi} depend on the thread index "
                                f"{', '.join(sorted(v.name for v in used))}; every thread of the block must reach "
                                "the reduction equally often")
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

    go(nest, [])


def _single_thread(nest: N.Stmt) -> frozenset[str]:
    """Stores outside every threadIdx loop that read their own buffer (all threads would apply the update), and
    the other stores outside every threadIdx loop into those buffers (their initialisation): thread 0 alone
    writes an element that thread 0 alone updates. Were the initialisation left to every thread, each would
    have stored the element itself, and NVCC may forward that store to the thread's own later load of the
    element across the barrier (the pointer is __restrict__): the threads other than 0 would read the initial
    value instead of thread 0's total (a GPT-2 block's layer norm read var = 0 so, on an H200)."""
    if not any(is_thread_loop(f) for f in loops_of(nest)):
        return frozenset()
    out: set[str] = set()
    outside: list[N.Store] = []

    def visit(s: N.Stmt, depth: int) -> bool:
        if isinstance(s, N.Store) and depth == 0:
            outside.append(s)
            if any(isinstance(n, N.Load) and n.buffer is s.buffer for n in walk(s.value)):
                out.add(s.name)
        return False

    by_thread_depth(nest, visit)
    updated = {s.buffer for s in outside if s.name in out}
    out |= {s.name for s in outside if s.buffer in updated}
    return frozenset(out)


# ----------------------------------------------------------------------------- cooperative copies


def copy_nest(f: N.For) -> tuple[list[N.For], N.Expr | None, N.Store] | None:
    """(the parallel loops, the guard, the store) of a constant "parallel" nest around one store into a
    shared buffer (optionally guarded), else None."""
    loops: list[N.For] = []
    inner: N.Stmt = f
    while isinstance(inner, N.For) and inner.kind == "parallel":
        if not (isinstance(inner.lo, N.Const) and isinstance(inner.hi, N.Const)) or inner.lo.value != 0:
            return None
        loops.append(inner)
        inner = inner.body
    guard = None
    if isinstance(inner, N.If) and (inner.orelse is None or is_fill(inner.then, inner.orelse)):
        guard, inner = inner.cond, inner.then
    if not loops or not isinstance(inner, N.Store) or inner.buffer.scope != "shared":
        return None
    return loops, guard, inner


def uniform_path(nest: N.Stmt, target: N.Stmt, guarded: frozenset[N.Var]) -> bool:
    """Every thread of the block reaches `target`: no guarded thread-bound loop, no thread-dependent If."""
    tvars = {x.var for x in loops_of(nest) if is_thread_loop(x)}
    path = path_to(nest, target)
    return path is not None and not any(
        (isinstance(s, N.If) and free_vars(s.cond) & tvars)
        or (isinstance(s, N.For) and is_thread_loop(s) and s.var in guarded) for s in path)


def thread_free_copy(nest: N.Stmt, f: N.For, guarded: frozenset[N.Var]) -> bool:
    """The copy nest at `f` stores values free of the thread indices and every thread reaches it."""
    parts = copy_nest(f)
    if parts is None:
        return False
    _, guard, st = parts
    tvars = {x.var for x in loops_of(nest) if is_thread_loop(x)}
    sub = subst_coords(st)
    used = free_vars(substitute(st.value, sub)) | free_vars(guard if guard is not None else N.const(0))
    for i in st.indices:
        used |= free_vars(substitute(i, sub))
    return not (used & tvars) and uniform_path(nest, f, guarded)


def _cooperative(nest: N.Stmt, guarded: frozenset[N.Var]) -> frozenset[N.Var]:
    """The outermost loops of the copy nests inside thread loops that the block's threads share."""
    out: set[N.Var] = set()

    def visit(s: N.Stmt, depth: int) -> bool:
        if isinstance(s, N.For) and s.kind == "parallel" and depth > 0 and thread_free_copy(nest, s, guarded):
            out.add(s.var)
            return True  # the whole nest is one copy
        return False

    by_thread_depth(nest, visit)
    return frozenset(out)


# ----------------------------------------------------------------------------- index width


INT32_SLACK = 2048  # a guarded access may run a tile past a dimension's end before its guard is tested


def padded_reach(dims: Sequence[int], slack: int = INT32_SLACK) -> int:
    """A bound on |flat index| (and on every partial sum of it) of a row-major buffer of shape `dims` when each
    index may run `slack` past either end of its dimension: sum_k (d_k + slack) * stride_k.

    Each index i_k lies in [-slack, d_k + slack), so |sum_k i_k stride_k| <= sum_k (d_k + slack) stride_k, and
    any partial sum (Horner's or an expanded form) is bounded by it too. It replaces prod(d_k + SLACK), which
    charged the slack to every dimension's stride: a (64, 4096, 64) tensor, 16.7 M elements, came to 2.7e10
    and took 64-bit indices (an attention kernel then spent an eighth of its instructions on 64-bit address
    arithmetic)."""
    reach, stride = 0, 1
    for d in reversed(dims):
        reach += (max(d, 0) + slack) * stride
        stride *= max(d, 0)
    return reach


def fits_int32(nest: N.Stmt, assume_sizes: bool = False) -> bool:
    """Every buffer of the nest has a constant shape whose padded reach (`padded_reach`) stays below 2**31:
    then every index the kernel computes (flat offsets of guarded, possibly out-of-range tile elements
    included) fits a 32-bit int, and index arithmetic may be `int` (fewer registers).
    `assume_sizes`: buffers of symbolic shape are taken to fit (the caller checks them at each call)."""
    seen: dict[int, N.Buffer] = {}
    for n in walk(nest):
        b = getattr(n, "buffer", None)
        if isinstance(b, N.Buffer):
            seen[id(b)] = b
    for b in seen.values():
        if not all(isinstance(d, N.Const) for d in b.shape):
            if assume_sizes:
                continue
            return False
        if padded_reach([int(d.value) for d in b.shape]) >= 2**31:  # type: ignore[attr-defined]
            return False
    for f in loops_of(nest):  # constant loop bounds too (bounds in enclosing loops follow the tiles of the buffers)
        if any(isinstance(e, N.Const) and abs(int(e.value)) >= 2**30 for e in (f.lo, f.hi)):
            return False
    return True


# ----------------------------------------------------------------------------- launch extents (isl)

def _bound_paths(nest: N.Stmt) -> dict[int, tuple[tuple[N.For, ...], tuple[N.Expr, ...]]]:
    """For each loop of the nest (by id): the loops around it (outermost first) and the If conditions
    around it (an `else` branch contributes the negated condition)."""
    out: dict[int, tuple[tuple[N.For, ...], tuple[N.Expr, ...]]] = {}

    def go(s: N.Stmt, loops: tuple[N.For, ...], conds: tuple[N.Expr, ...]) -> None:
        if isinstance(s, N.For):
            out[id(s)] = (loops, conds)
            go(s.body, (*loops, s), conds)
        elif isinstance(s, N.Seq):
            for c in s.body:
                go(c, loops, conds)
        elif isinstance(s, N.If):
            go(s.then, loops, (*conds, s.cond))
            if s.orelse is not None:
                go(s.orelse, loops, (*conds, N.Logical("not", s.cond, None)))
        elif isinstance(s, N.Allocate):
            go(s.body, loops, conds)

    go(nest, (), ())
    return out


def isl_upper_extent(f: N.For, loops: tuple[N.For, ...], conds: tuple[N.Expr, ...]) -> N.Expr | None:
    """The maximum (or an upper bound) of `f.hi - f.lo` over the iterations of the loops around `f`; see `isl_max`."""
    return isl_max(N.binary("sub", f.hi, f.lo), loops, conds)


def isl_max(expr: N.Expr, loops: tuple[N.For, ...] = (), conds: tuple[N.Expr, ...] = ()) -> N.Expr | None:
    """The maximum of the integer expression `expr` over the iterations of `loops` (bounds and affine
    guards `conds`; a non-affine guard is left out, which only loosens the bound), as an expression of
    the other variables (sizes, host loop variables); None when isl cannot bound it. Exact wherever the
    loops run when isl's piecewise maximum is one affine piece or a max / min of some of its pieces
    (`min(8, w)`); otherwise an upper bound (the max of each piece's bound), which is all a launch
    extent needs (every loop whose extent is not the launch extent is guarded). With no loops it is
    `expr` simplified (`max(min(8, w), 8)` is 8).

    Found with isl: project the loops out of { [loops..., e] : e = hi - lo, their bounds, the guards }
    and take `dim_max` of e. When the maximum is piecewise but no max/min of its pieces, the max of
    every piece's affine function bounds it (each piece's value is one of them)."""
    names = _IslNames({})
    dims = [names.bind(lp.var) for lp in loops]
    try:
        ext = aff(expr, names)
        cons = [f"e = {ext}"]
        for lp, nm in zip(loops, dims):
            try:
                cons.append(f"({aff(lp.lo, names)}) <= {nm} and {nm} < ({aff(lp.hi, names)})")
            except NonAffine:
                pass  # that loop's variable stays unconstrained: a looser bound, or none
        for c in conds:
            try:
                cons.append(cond(c, names))
            except NonAffine:
                pass
    except NonAffine:
        return None
    ev = names.bind(N.Var("e"))
    cons[0] = cons[0].replace("e = ", f"{ev} = ", 1)
    text = f"[{', '.join(names.params)}] -> {{ [{', '.join([*dims, ev])}] : {' and '.join(cons)} }}"
    try:
        pw = isl.Set(text).project_out(isl.dim_type.set, 0, len(dims)).dim_max(0)  # isl.Error when unbounded
        pieces = pw.get_pieces()
        if not pieces or any(a.is_nan() for _, a in pieces):
            return None
        pw = pw.coalesce()
        try:
            return pw_to_expr(pw, names.params, "launch extent")
        except ValueError:
            pass
        # the pieces' functions agree where the pieces meet: look for the fewest of them whose max or min
        # is the function (`min(8, w)` out of 8, w and 8*((7*w + 7)//8) - 7*w, each exact on its piece)
        affs: list[isl.Aff] = []
        for _, a in pw.get_pieces():
            if not any(a.plain_is_equal(b) for b in affs):
                affs.append(a)
        dom = pw.domain()
        if len(affs) <= 6:
            for size in range(1, len(affs) + 1):
                for sub in itertools.combinations(affs, size):
                    for op in ("min", "max"):
                        acc = isl.PwAff.from_aff(sub[0])
                        for a in sub[1:]:
                            acc = acc.min(isl.PwAff.from_aff(a)) if op == "min" else acc.max(isl.PwAff.from_aff(a))
                        if acc.intersect_domain(dom).is_equal(pw):
                            out = aff_to_expr(sub[0], names.params)
                            for a in sub[1:]:
                                out = N.binary(op, out, aff_to_expr(a, names.params))
                            return out
        # no exact form: an upper bound. Each piece contributes its function's maximum over the piece when that
        # is finite (`8 : h <= 6; 9 : h = 7; 10 : h >= 8` gives 10; `w : 1 <= w <= 7` gives 7), else the
        # function itself; the max of the contributions bounds every piece's value
        exprs_: list[N.Expr] = []
        for piece, a in pw.get_pieces():
            top = piece.max_val(a)
            exprs_.append(N.const(int(top.to_python())) if top.is_int() else aff_to_expr(a, names.params))
        consts = [e for e in exprs_ if isinstance(e, N.Const)]
        exprs = list(dict.fromkeys([e for e in exprs_ if not isinstance(e, N.Const)]
                                   + ([max(consts, key=lambda c: c.value)] if consts else [])))
        out = exprs[0]
        for e in exprs[1:]:
            out = N.binary("max", out, e)
        return out
    except (isl.Error, ValueError):  # unbounded (isl), or a piece isl_conv cannot turn back into an expression
        return None
