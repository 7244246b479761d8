"""GPU memory primitives: `bind_reduction` (a cross-thread reduction) and `cache_read`.

bind_reduction — the loop of a reduction runs across the threads of a block, each thread
accumulating a strided share, then combined across threads (the CUDA target emits warp
shuffles, then shared memory). Legal because the reduction's operator is associative and
commutative: the only dependences the new order may break are those of the reduction
statement on its own accumulator.

    for i:                                    for i:
        C[i] = 0                                  C[i] = 0
        for k in 0..n:                 ==>        for kt in 0..256 bound to threadIdx.x:
            C[i] = C[i] + f(i, k)                     for ks in 0..(n + 255) // 256:
                                                          if ks * 256 + kt < n:
                                                              C[i] = C[i] + f(i, k)   # k = ks*256 + kt

cache_read — one loop iteration reads a region of a buffer many times: copy the region into a
scratch buffer ("shared": cooperatively by the block, "local": per thread) at the top of the
iteration, redirect the loads, with barriers around the shared copy.

    for i:                                    for i:
        S1: ... x[i, k] ...                       allocate x_shared[1, 64] shared:
        S2: ... x[i, j] ...            ==>            for c0, c1: x_shared[c0, c1] = x[i + c0, c1]
                                                      barrier
                                                      S1: ... x_shared[0, k] ...   (rebased)
                                                      S2: ... x_shared[0, j] ...
                                                      barrier      (only when the loop is not bound to a block)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import islpy as isl

from loopir import poly
from loopir.affine import ceil_div, multiple_of, simplify
from loopir.dtypes import INDEX
from loopir.errors import ArgumentError, ArgumentTypeError, NotFoundError
from loopir.isl_conv import NonAffine, _conj, _exists, _Names, aff, loop_constraints, prefix, pw_to_expr
from loopir.nodes import (
    Allocate,
    Barrier,
    Binary,
    Buffer,
    Const,
    Expr,
    For,
    If,
    Load,
    Program,
    Seq,
    Stmt,
    Store,
    Var,
    binary,
    const,
)
from loopir.te import TupleReduce, tensor_of
from loopir.visit import Transformer, seq, statements, substitute, walk

from . import CheckContext, find_loop, fresh_name, primitive, replace_loop, subst_loops

__all__ = ["bind_reduction", "cache_read", "reduction_parts", "without_reduction_deps"]

_RED_OPS = ("add", "mul", "max", "min")
THREAD_AXES = ("threadIdx.x", "threadIdx.y", "threadIdx.z")


# ----------------------------------------------------------------------------- reductions


def reduction_parts(st: Store) -> tuple[str, Expr] | None:
    """(op, e) when `st` is `C[idx] = C[idx] op e` with op associative and commutative and `e`
    not reading C; else None."""
    v = st.value
    if not isinstance(v, Binary) or v.op not in _RED_OPS:
        return None
    me = Load(st.buffer, st.indices)
    e = v.b if v.a == me else v.a if v.b == me else None
    if e is None or any(isinstance(n, Load) and n.buffer is st.buffer for n in walk(e)):
        return None
    return v.op, e


def _reductions_over(program: Program, loop: Var) -> list[Store]:
    f = find_loop(program, loop)
    inner = {n.var for n in walk(f) if isinstance(n, For)}
    stores = [n for n in walk(f.body) if isinstance(n, Store)]
    if not stores:
        raise ArgumentError(f"bind_reduction: loop {loop.name!r} contains no statement")
    for st in stores:
        t = tensor_of(st.buffer)
        if reduction_parts(st) is None and t is not None and isinstance(t.op.body, TupleReduce):
            raise ArgumentError(
                f"bind_reduction: statement {st.name!r} inside loop {loop.name!r} is one component of the tuple "
                f"reduction {t.op.name!r} ({t.op.body.op}); no cross-thread tuple reduction is generated — run it "
                "one thread per output (bind its spatial loops), or for argmax / argmin use the default form "
                "(te.argmax without one_pass: two plain reductions that bind_reduction takes)")
        if reduction_parts(st) is None:
            raise ArgumentError(
                f"bind_reduction: statement {st.name!r} inside loop {loop.name!r} is not a reduction "
                f"C[idx] = C[idx] op e (op in {', '.join(_RED_OPS)}); bind a loop without dependences with bind()"
            )
        idx_vars = set()
        sub = dict(zip(st.iters, st.coords))
        for ix in st.indices:
            idx_vars |= {n for n in walk(substitute(ix, sub)) if isinstance(n, Var)}
        if idx_vars & inner:
            raise ArgumentError(
                f"bind_reduction: statement {st.name!r} writes a different element of {st.buffer.name!r} in "
                f"each iteration of loop {loop.name!r}, so that loop is not a reduction loop; use bind()"
            )
    return stores


def without_reduction_deps(deps: poly.Deps, names: set[str]) -> poly.Deps:
    """`deps` minus the dependences of each named reduction statement on itself — those that
    reassociating an associative, commutative reduction may reorder."""
    isl_names = {poly._sanitize(n) for n in names}

    def drop(um: Any) -> Any:
        ml = um.get_map_list()
        kept = um.subtract(um)  # empty, in the same parameter space
        for k in range(ml.n_map()):
            m = ml.get_at(k)
            a, b = m.get_tuple_name(poly.isl.dim_type.in_), m.get_tuple_name(poly.isl.dim_type.out)
            if not (a == b and a in isl_names):
                kept = kept.union(poly.isl.UnionMap.from_map(m))
        return kept

    return dataclasses.replace(deps, flow=drop(deps.flow), anti=drop(deps.anti), output=drop(deps.output))


def _check_bind_reduction(ctx: CheckContext) -> poly.Witness | None:
    # legal iff no dependence other than a reduction statement's self-dependence runs backwards
    bad = poly.instance_mismatch(ctx.deps, ctx.new)
    if bad is not None:
        raise RuntimeError(f"internal error in primitive bind_reduction: {bad}")
    names = set(ctx.extra.get("reductions", ())) or {
        st.name for st in _reductions_over(ctx.old, ctx.args[0])}
    return poly.find_violation(without_reduction_deps(ctx.deps, names), ctx.new)


@primitive("bind_reduction", check=_check_bind_reduction, rebase=True)
def bind_reduction(program: Program, loop: Var, axis: str = "threadIdx.x",
                   threads: int | None = None) -> tuple[Program, Any]:
    """Run the reduction loop `loop` across the threads `axis` of a block (a cross-thread reduction).

    Precondition: every statement inside `loop` is a reduction `C[idx] = C[idx] op e` (op in add,
    mul, max, min) whose element does not change with `loop` or the loops inside it. Float sums
    are reassociated (as every parallel reduction does).

    `threads=None`: the loop itself is bound (one iteration per thread; returns the loop).
    `threads=T`: thread kt takes iterations kt, kt + T, ... (coalesced), returns `(kt, ks)`:

        for k in lo..hi: R(k)   ==>   for kt in 0..T (axis): for ks in 0..ceil((hi-lo)/T):
                                          if ks*T + kt < hi - lo: R(lo + ks*T + kt)
    """
    if not isinstance(loop, Var):
        raise ArgumentTypeError(f"bind_reduction: expected a loop handle, got {type(loop).__name__} {loop!r}")
    if axis not in THREAD_AXES:
        raise ArgumentError(f"bind_reduction: axis must be one of {', '.join(THREAD_AXES)}, got {axis!r} "
                            "(a reduction across blocks is not supported)")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ArgumentError(f"bind_reduction: threads must be a positive integer, got {threads!r}")
    _reductions_over(program, loop)
    f = find_loop(program, loop)
    if f.kind != "serial":
        raise ArgumentError(f"bind_reduction: loop {loop.name!r} is already {f.thread or f.kind}")
    if threads is None:
        return replace_loop(program, loop, dataclasses.replace(f, kind="thread", thread=axis)), loop
    taken: set[str] = set()
    kt = Var(fresh_name(program, f"{loop.name}t", taken), INDEX)
    taken.add(kt.name)
    ks = Var(fresh_name(program, f"{loop.name}s", taken), INDEX)
    ext = binary("sub", f.hi, f.lo)
    offset = binary("add", binary("mul", ks, const(threads)), kt)
    body = subst_loops(f.body, {loop: binary("add", f.lo, offset)})
    extent = simplify(ext)
    n_chunks = ceil_div(extent, threads)
    if not multiple_of(extent, threads):  # 16*n16 over 16 threads: no thread runs past the row
        body = If(offset < ext, body)
    new = For(kt, const(0), const(threads), For(ks, const(0), n_chunks, body), "thread", axis)
    return replace_loop(program, loop, new), (kt, ks)


# ----------------------------------------------------------------------------- cache_read


def _buffer(program: Program, x: Any) -> Buffer:
    if isinstance(x, Buffer):
        return x
    name = getattr(x, "name", x)
    if not isinstance(name, str):
        raise ArgumentTypeError(f"cache_read: expected a tensor, buffer or buffer name, got {type(x).__name__} {x!r}")
    for b in program.args + program.temps:
        if b.name == name:
            return b
    for n in walk(program.body):
        if isinstance(n, Load) and n.buffer.name == name:
            return n.buffer
    raise NotFoundError(f"cache_read: no buffer named {name!r} in program {program.name!r}")


def _const_value(e: Expr) -> int | None:
    e = simplify(e)
    return int(e.value) if isinstance(e, Const) else None


class _Redirect(Transformer):
    def __init__(self, buf: Buffer, cache: Buffer, lows: list[Expr]) -> None:
        self.buf, self.cache, self.lows = buf, cache, lows

    def visit_Load(self, ld: Load) -> Expr:
        idx = tuple(self.visit(i) for i in ld.indices)
        if ld.buffer is not self.buf:
            return ld if all(a is b for a, b in zip(idx, ld.indices)) else Load(ld.buffer, idx)
        return Load(self.cache, tuple(simplify(binary("sub", i, lo)) for i, lo in zip(idx, self.lows)))


def readers_in(program: Program, tensor: Any, loop: Var, who: str) -> tuple[Buffer, For, list[Any]]:
    """The buffer of `tensor`, the loop `loop`, and the statements inside it that read the buffer
    (ArgumentError naming `who` when none does)."""
    buf = _buffer(program, tensor)
    f = find_loop(program, loop)
    ctxs = [c for c in statements(program) if any(lp is f for lp in c.loops)]
    readers = [c for c in ctxs if any(isinstance(n, Load) and n.buffer is buf for n in walk(c.store.value))]
    if not readers:
        raise ArgumentError(f"{who}: nothing inside loop {loop.name!r} reads {buf.name!r}")
    return buf, f, readers


def redirect_readers(body: Stmt, readers: list[Any], buf: Buffer, cache: Buffer, lows: list[Expr]) -> Stmt:
    """`body` with the statements of `readers` rebased onto their loops and their loads of `buf` read from
    `cache` (whose element 0 is `buf`'s element `lows`) instead."""
    reader_ids = {id(c.store) for c in readers}
    loops_of = {id(c.store): c.loops for c in readers}
    red = _Redirect(buf, cache, lows)

    class _Body(Transformer):
        def visit_Store(self, st: Store) -> Store:
            if id(st) not in reader_ids:
                return st
            rb = _rebase(st, loops_of[id(st)])
            return dataclasses.replace(rb, value=red.visit(rb.value))

        def visit(self, node: Any) -> Any:
            return node if isinstance(node, Expr) else super().visit(node)

    return _Body().visit(body)


def _rebase(st: Store, loops: tuple[For, ...]) -> Store:
    """The statement with its iters replaced by the loop variables around it (coords == iters)."""
    sub = dict(zip(st.iters, st.coords))
    its = tuple(lp.var for lp in loops)
    return Store(st.name, st.buffer, tuple(substitute(i, sub) for i in st.indices), substitute(st.value, sub),
                 its, its)


def _check_cache_read(ctx: CheckContext) -> poly.Witness | None:
    # legal iff no statement inside the loop writes a value of the buffer that a statement inside it reads
    buf_name, loop = ctx.args[0], ctx.args[2]
    buf_name = getattr(buf_name, "name", buf_name)
    f = find_loop(ctx.old, loop)
    writers = {n.name for n in walk(f) if isinstance(n, Store) and n.buffer.name == buf_name}
    readers = {n.name for n in walk(f) if isinstance(n, Store)
               and any(isinstance(m, Load) and m.buffer.name == buf_name for m in walk(n.value))}
    if not writers:
        return None
    W, R = {poly._sanitize(n) for n in writers}, {poly._sanitize(n) for n in readers}
    ml = ctx.deps.flow.get_map_list()
    for k in range(ml.n_map()):
        m = ml.get_at(k)
        if m.get_tuple_name(poly.isl.dim_type.in_) in W and m.get_tuple_name(poly.isl.dim_type.out) in R:
            return poly._witness(poly.isl.UnionMap.from_map(m), "flow", ctx.deps)
    return None


@primitive("cache_read", check=_check_cache_read, rebase=True)
def cache_read(program: Program, tensor: Any, scope: str, loop: Var) -> tuple[Program, Buffer]:
    """Copy the region of `tensor` that one iteration of `loop` reads into a scratch buffer of
    `scope` ("shared" or "local") allocated at the top of the iteration; loads inside the loop
    read the copy. Returns the scratch Buffer; the copy statement is named `<buffer>_<scope>`, and
    `s.loops(returned_buffer)` are its loops (the copy's own last): split, reorder them, and bind
    those of a shared copy to threadIdx axes (TVM's copy schedule; see bind).

    Precondition: the region (poly.footprint, the bounding box of all reads inside `loop`) has a
    constant size, and no statement inside `loop` writes a value of the buffer that a statement
    inside it reads (checked with the program's flow dependences; a ScheduleError otherwise).
    Statements that read the buffer are rebased (their iterations named by their loops).

    Scope "shared" with `loop` inside threadIdx-bound loops: the region is the whole BLOCK's (the union
    over those thread loops), its shape the constant box hull (guards such as min(8*ko + 8, n) keep a
    constant shape; the copy is clipped to the buffer), its copy loops "parallel" (the CUDA target
    shares them among the block's threads); refused when a statement inside the block writes the
    buffer. A second shared cache_read of the same loop joins the first copy (one barrier pair):

        for ty, tx (threads): for ko:         for ty, tx: for ko:
            ... A[ty + 16*ii, k] ...   ==>       A_shared[128, 8] <- A[128*bi + c0, 8*ko + c1]; barrier
                                                  ... A_shared[ty + 16*ii, ki] ...; barrier"""
    if scope not in ("shared", "local"):
        raise ArgumentError(f"cache_read: scope must be 'shared' or 'local', got {scope!r}")
    if not isinstance(loop, Var):
        raise ArgumentTypeError(f"cache_read: expected a loop handle, got {type(loop).__name__} {loop!r}")
    buf, f, readers = readers_in(program, tensor, loop, "cache_read")
    # shared scratch inside thread-bound loops holds the region of the whole BLOCK (the union over
    # those thread loops), filled cooperatively; otherwise the region of one iteration of `loop`
    depth = next(k for k, lp in enumerate(readers[0].loops) if lp is f)
    # `loop` itself bound to threadIdx counts too: its one iteration is one thread's, and the block has one buffer
    # (the region of one thread, copied by every thread into the same buffer, raced: tests/test_polybench_stencils)
    projected = [lp for lp in readers[0].loops[:depth + 1] if lp.kind == "thread"
                 and (lp.thread or "").startswith("threadIdx")] if scope == "shared" else []
    if projected:
        _refuse_writes_in_block(program, buf, projected[0], loop)
    shape, lows, inside = _box(program, readers, buf, f, loop, scope, projected)
    cname = fresh_name(program, f"{buf.name}_{scope}")
    cache = Buffer(cname, tuple(shape), buf.dtype, scope)
    # the cooperative copy: for c0, c1, ...: cache[c] = buf[lo + c]
    taken: set[str] = set()
    cvars = []
    for d in range(len(shape)):
        v = Var(fresh_name(program, f"c{d}", taken), INDEX)
        taken.add(v.name)
        cvars.append(v)
    outer = tuple(lp.var for lp in readers[0].loops[: readers[0].loops.index(f) + 1])
    its = outer + tuple(cvars)
    src_idx = tuple(binary("add", lo, v) for lo, v in zip(lows, cvars))
    # the copy reads only elements inside the buffer: each side of each dimension is clipped unless isl
    # proves the box inside on that side (a tile at the start of a padded input begins at index -1)
    clip = None
    for d, (lo, v) in enumerate(zip(lows, cvars)):
        at = binary("add", lo, v)
        for side, cond in (("lo", const(0) <= at), ("hi", at < buf.shape[d])):
            if (d, side) in inside:
                continue
            clip = cond if clip is None else clip & cond
    copy: Stmt = Store(cname, cache, tuple(cvars), Load(buf, src_idx), its, its)
    if clip is not None:
        copy = If(clip, copy)
    for v, n in reversed(list(zip(cvars, shape))):
        # "parallel" copy loops inside thread loops: the CUDA target shares their iterations among the block's
        # threads (every thread writes the same values, so any split of the work is equivalent)
        copy = For(v, const(0), n, copy, "parallel" if projected else "serial")
    body = redirect_readers(f.body, readers, buf, cache, lows)
    merged = _merge_into_staging(body, copy) if scope == "shared" else None
    if merged is not None:  # one barrier pair for all the tiles staged in this loop
        new = dataclasses.replace(f, body=Allocate(cache, merged))
        return replace_loop(program, loop, new), cache
    parts: list[Stmt] = [copy]
    if scope == "shared":
        parts.append(Barrier())
    parts.append(body)
    if scope == "shared" and not (f.kind == "thread" and (f.thread or "").startswith("blockIdx")):
        parts.append(Barrier())  # the next iteration's copy must not overwrite what slow threads still read
    new = dataclasses.replace(f, body=Allocate(cache, seq(*parts)))
    return replace_loop(program, loop, new), cache


def union_box(program: Program, readers: list[Any], buf: Buffer, loop: Var) -> list[tuple[Expr, Expr]]:
    """The box (lo, hi) per dimension holding every element of `buf` the statements `readers` read in one
    iteration of `loop` (the hull of their footprints)."""
    box: list[tuple[Expr, Expr]] | None = None
    for c in readers:
        fp = poly.footprint(program, c.store.name, buf, loop)
        box = fp if box is None else [(_min(a[0], b[0]), _max(a[1], b[1])) for a, b in zip(box, fp)]
    assert box is not None
    return box


def _box(program: Program, readers: list[Any], buf: Buffer, f: For, loop: Var, scope: str,
         projected: list[For]) -> tuple[list[Expr], list[Expr], set[tuple[int, str]]]:
    """(shape, lows, the (dimension, "lo" | "hi") sides on which the copied box provably stays inside
    the buffer) of the region copied at each iteration of `loop`."""
    if not projected:
        box = union_box(program, readers, buf, loop)
        sizes = [_const_value(binary("sub", hi, lo)) for lo, hi in box]
        if all(n is not None for n in sizes):
            lows = [lo for lo, _ in box]
            keep = [lp for lp in readers[0].loops[: readers[0].loops.index(f) + 1]]
            return [const(n) for n in sizes], lows, _inside_sides(program, keep, lows, sizes, buf)  # type: ignore[arg-type]
    try:
        return _hull(program, readers, buf, f, projected)
    except (NonAffine, isl.Error) as e:
        raise ArgumentError(
            f"cache_read: the region of {buf.name!r} read in one iteration of loop {loop.name!r} has a "
            f"non-constant size (no constant box hull with an affine lower corner: {e}); {scope} buffers need a "
            "constant shape (split the loop by a constant first, or give the size as a constant)") from None


def _hull(program: Program, readers: list[Any], buf: Buffer, f: For,
          projected: list[For]) -> tuple[list[Expr], list[Expr], set[tuple[int, str]]]:
    # the constant box hull: lower corner = the exact minimum (one affine piece), size = the maximum extent
    # over every value of the outer loops and sizes, so guards like min(8*ko + 8, n) keep a constant shape
    nm = _Names(unique=True)
    depth = next(k for k, lp in enumerate(readers[0].loops) if lp is f)
    keep = [lp for lp in readers[0].loops[: depth + 1] if not any(lp is q for q in projected)]
    pre = prefix(list(program.params) + [lp.var for lp in keep], nm)
    xs = [f"x{d}" for d in range(buf.ndim)]
    w = None
    for c in readers:
        sub = dict(zip(c.store.iters, c.store.coords))
        exist = [nm(lp.var) for lp in c.loops if not any(lp is q for q in keep)]
        cons = loop_constraints(c.loops, c.guards, nm)
        for ld in walk(c.store.value):
            if not (isinstance(ld, Load) and ld.buffer is buf):
                continue
            eqs = [f"{x} = {aff(substitute(i, sub), nm)}" for x, i in zip(xs, ld.indices)]
            s = isl.Set(f"{pre}{{ B[{', '.join(xs)}] : {_exists(exist, _conj(eqs + cons))} }}")
            w = s if w is None else w.union(s)
    assert w is not None
    # reads outside the buffer are never executed by a correct program (a padded input read under a
    # `where`): the region is the reads' image intersected with the buffer, both sides
    inb = _conj([f"0 <= x{d} < {aff(n, nm)}" for d, n in enumerate(buf.shape)])
    reads, w = w.coalesce(), w.intersect(isl.Set(f"{pre}{{ B[{', '.join(xs)}] : {inb} }}")).coalesce()
    lows = []
    for d in range(buf.ndim):
        what = f"the lowest index of {buf.name!r} along dimension {d}"
        try:
            lows.append(pw_to_expr(w.dim_min(d), nm.by_name(), what, single=True, simplify=False))
        except NonAffine:  # max(64*i_o - 1, 0) at a padded edge: start at the unclipped corner (the copy is clipped)
            lows.append(pw_to_expr(reads.dim_min(d), nm.by_name(), what, single=True, simplify=False))
    rs = [f"r{d}" for d in range(buf.ndim)]
    shift = _conj([f"r{d} = x{d} - ({aff(lo, nm)})" for d, lo in enumerate(lows)])
    region = w.apply(isl.Map(f"{pre}{{ B[{', '.join(xs)}] -> R[{', '.join(rs)}] : {shift} }}"))
    flat = region.project_out(isl.dim_type.param, 0, region.dim(isl.dim_type.param))
    if not flat.is_bounded():
        raise NonAffine(f"unbounded region {region}")
    sizes = [max(int(a.get_constant_val().to_python()) for _, a in flat.dim_max(d).get_pieces()) + 1
             for d in range(buf.ndim)]
    return [const(n) for n in sizes], lows, _inside_sides(program, keep, lows, sizes, buf, nm)


def _inside_sides(program: Program, keep: list[For], lows: list[Expr], sizes: list[int], buf: Buffer,
                  nm: _Names | None = None) -> set[tuple[int, str]]:
    """The sides (d, "lo" | "hi") on which the box lows[d] + [0, sizes[d]) stays inside the buffer for
    every value of the loops `keep` (isl; a side that cannot be decided exactly is not in the set)."""
    nm = nm or _Names(unique=True)
    try:
        pre = prefix(list(program.params) + [lp.var for lp in keep], nm)
        ctx = isl.Set(f"{pre}{{ : {_conj(loop_constraints(keep, [], nm))} }}")
        out = set()
        for d, (lo, n) in enumerate(zip(lows, sizes)):
            low = isl.Set(f"{pre}{{ : ({aff(lo, nm)}) < 0 }}").intersect_params(ctx)
            high = isl.Set(f"{pre}{{ : ({aff(lo, nm)}) + {n} > {aff(buf.shape[d], nm)} }}")
            if low.is_empty():
                out.add((d, "lo"))
            if high.intersect_params(ctx).is_empty():
                out.add((d, "hi"))
        return out
    except (NonAffine, isl.Error):
        return set()


def _refuse_writes_in_block(program: Program, buf: Buffer, tloop: For, loop: Var) -> None:
    # a block-shared copy is filled once per iteration for all threads: nothing in the block may write the buffer
    for n in walk(tloop):
        if isinstance(n, Store) and n.buffer is buf:
            raise ArgumentError(
                f"cache_read: statement {n.name!r} inside the block (loop {tloop.var.name!r} bound to {tloop.thread}) "
                f"writes {buf.name!r}; a shared copy made at each iteration of {loop.name!r} for the whole block "
                "could be stale (cache it per thread with scope 'local', or at a loop outside the thread loops)")


def _merge_into_staging(body: Stmt, copy: Stmt) -> Stmt | None:
    """When `body` already starts with shared copies + barrier ... barrier (an earlier cache_read of
    this loop), put `copy` with those copies, before the same barrier; None otherwise."""
    chain: list[Allocate] = []
    inner = body
    while isinstance(inner, Allocate) and inner.buffer.scope == "shared":
        chain.append(inner)
        inner = inner.body
    if not chain or not isinstance(inner, Seq):
        return None
    items = list(inner.body)
    first = next((k for k, x in enumerate(items) if isinstance(x, Barrier)), None)
    if first is None or first == 0 or not isinstance(items[-1], Barrier):
        return None
    staged = {a.buffer for a in chain}
    for x in items[:first]:
        if not isinstance(x, For) or any(isinstance(n, Store) and n.buffer not in staged for n in walk(x)):
            return None
    # the new copy goes after the earlier ones, unless one of them reads what it fills (a second cache_read of
    # a buffer the first copy reads): then before them
    fills = {n.buffer for n in walk(copy) if isinstance(n, Store)}
    feeds = any(isinstance(n, Load) and n.buffer in fills for x in items[:first] for n in walk(x))
    out: Stmt = Seq(tuple([copy] + items if feeds else items[:first] + [copy] + items[first:]))
    for a in reversed(chain):
        out = dataclasses.replace(a, body=out)
    return out


def _min(a: Expr, b: Expr) -> Expr:
    return a if a == b else binary("min", a, b)


def _max(a: Expr, b: Expr) -> Expr:
    return a if a == b else binary("max", a, b)


def _unused() -> None:
    _ = (Seq,)
