"""Storage placement (Halide's `store_at` / `store_root` / `compute_root`, TVM's `set_scope`).

store_at — the producer's buffer becomes a scratch buffer allocated at the top of `loop`'s body,
shrunk to the box of elements one iteration of `loop` touches (isl), indices rebased to the box's
low corner. Each iteration owns its copy, so a parallel `loop` stays parallel (the dependence
analysis expands a scratch buffer by its allocation instance: no dependence joins two iterations):

    producer: float32[5, 5]  # temporary               for y in 0..4:
    for y in 0..4:                                          allocate producer: float32[2, 5]
        for y_c in 0..2: for x_c in 0..5:          ==>          for y_c in 0..2: for x_c in 0..5:
            producer[y + y_c, x_c] = ...                            producer[y_c, x_c] = ...
        for x in 0..4: ... producer[y + 1, x] ...               for x in 0..4: ... producer[1, x] ...

sliding window — when the producer was computed (compute_at) at a serial loop `c` strictly inside
the storage loop (or anywhere under `store_root`), the storage outlives one iteration of `c`, so an
iteration computes only the rows the previous one did not: along the one dimension whose region
moves with `c` (monotonically), the producer loop starts at the previous iteration's end
(Halide's lesson 8: 25 producer evaluations instead of 40):

    for y in 0..4:                                     for y in 0..4:
        for y_c in 0..2: ...           ==> (store_root)     for y_c in min(y, 1)..2: ...

Legality (the check): every value a reader reads is written in the new program before it, in the
same allocation of the buffer (isl dataflow on the new program: a read with no source is refused,
with the writer and reader instances of the old program as witness).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import islpy as isl

from loopir import poly
from loopir.affine import const_diff, simplify
from loopir.errors import ArgumentError, ArgumentTypeError, NotFoundError
from loopir.footprint import simplify_in_context
from loopir.subst import replace_buffers
from loopir.isl_conv import NonAffine, _conj, _exists, _Names, aff, loop_constraints, pw_bound
from loopir.nodes import (SCOPES, Allocate, Binary, Buffer, Const, Expr, For, Load, Program, Stmt, Store, Var, binary,
                          const)
from loopir.poly_model import _Builder, rename_map, schedule_map
from loopir.visit import StmtContext, Transformer, statements, substitute, walk

from . import CheckContext, find_loop_path, primitive, replace_loop
from .compute import producer_buffer, rebase_statements, writers

__all__ = ["store_at", "store_root", "compute_root", "set_scope", "storage_box"]


# ----------------------------------------------------------------------------- lookup


def _stage_buffer(program: Program, stage: Any, who: str) -> Buffer:
    """The buffer of `stage` (tensor, buffer or name), also when it is already a scratch buffer."""
    name = stage if isinstance(stage, str) else getattr(stage, "name", None)
    if not isinstance(name, str):
        raise ArgumentTypeError(f"{who}: expected a tensor, buffer or stage name, got {type(stage).__name__} {stage!r}")
    for n in walk(program.body):
        if isinstance(n, Allocate) and n.buffer.name == name:
            return n.buffer
    return producer_buffer(program, name)


def _accessors(program: Program, buf: Buffer) -> list[StmtContext]:
    """The statements that write or read `buf` (in textual order)."""
    return [c for c in statements(program)
            if c.store.buffer is buf or any(isinstance(n, Load) and n.buffer is buf for n in walk(c.store))]


def _allocation(program: Program, buf: Buffer) -> Allocate | None:
    return next((n for n in walk(program.body) if isinstance(n, Allocate) and n.buffer is buf), None)


def _common_loops(ctxs: list[StmtContext]) -> list[For]:
    """The loops around every statement of `ctxs`, outermost first."""
    out: list[For] = []
    for k, lp in enumerate(ctxs[0].loops):
        if all(len(c.loops) > k and c.loops[k] is lp for c in ctxs):
            out.append(lp)
        else:
            break
    return out


# ----------------------------------------------------------------------------- the box


def storage_box(program: Program, buf: Buffer, loop: Var | None) -> tuple[list[Expr], list[Expr]]:
    """(lows, shape) of the box of `buf` that one iteration of `loop` (None: the whole program) touches:
    lows in terms of the sizes and the loops down to `loop`, shape in terms of the sizes only (the
    largest extent over every iteration). ArgumentError when the region is not affine or unbounded."""
    ctxs = _accessors(program, buf)
    nm = _Names(unique=True)
    keep: list[For] = []
    if loop is not None:
        c0 = ctxs[0]
        depth = next(k for k, lp in enumerate(c0.loops) if lp.var is loop)
        keep = list(c0.loops[: depth + 1])
    params = list(program.params)
    xs = [f"x{d}" for d in range(buf.ndim)]
    try:
        pre_names = [nm(p) for p in params] + [nm(lp.var) for lp in keep]
        pre = f"[{', '.join(pre_names)}] -> " if pre_names else ""
        region = None
        for c in ctxs:
            sub = dict(zip(c.store.iters, c.store.coords))
            exist = [nm(lp.var) for lp in c.loops if not any(lp is q for q in keep)]
            cons = loop_constraints(c.loops, c.guards, nm)
            idxs = [c.store.indices] if c.store.buffer is buf else []
            idxs += [n.indices for n in walk(c.store.value) if isinstance(n, Load) and n.buffer is buf]
            for idx in idxs:
                eqs = [f"{x} = {aff(substitute(i, sub), nm)}" for x, i in zip(xs, idx)]
                s = isl.Set(f"{pre}{{ [{', '.join(xs)}] : {_exists(exist, _conj(eqs + cons))} }}")
                region = s if region is None else region.union(s)
        assert region is not None
        # accesses outside the buffer are never executed by a correct program (a padded read under a `where`)
        inb = _conj([f"0 <= x{d} < {aff(n, nm)}" for d, n in enumerate(buf.shape)])
        region = region.intersect(isl.Set(f"{pre}{{ [{', '.join(xs)}] : {inb} }}")).coalesce()
        by_name = nm.by_name()
        lows = [pw_bound(region.dim_min(d), by_name, "lo", f"lowest index of {buf.name!r}")[0]
                for d in range(buf.ndim)]
        rs = [f"r{d}" for d in range(buf.ndim)]
        shift = _conj([f"r{d} = x{d} - ({aff(lo, nm)})" for d, lo in enumerate(lows)])
        rel = region.apply(isl.Map(f"{pre}{{ [{', '.join(xs)}] -> [{', '.join(rs)}] : {shift} }}"))
        # the extent over every iteration: the loop variables are projected out, the sizes stay
        for lp in reversed(keep):
            k = rel.find_dim_by_name(isl.dim_type.param, nm(lp.var))
            rel = rel.project_out(isl.dim_type.param, k, 1)
        # a constant shape when the extent is bounded at every size (min(n + 2, 66) -> 66: scratch memory of a
        # fixed size, which "local" and "shared" need), else an expression of the sizes
        flat = rel.project_out(isl.dim_type.param, 0, rel.dim(isl.dim_type.param))
        shape = []
        for d in range(buf.ndim):
            top = rel.dim_max(d)
            one = flat.project_out(isl.dim_type.set, d + 1, buf.ndim - d - 1).project_out(isl.dim_type.set, 0, d)
            ftop = one.dim_max(0) if one.is_bounded() else None
            if ftop is not None and all(a.is_cst() for _, a in ftop.get_pieces()):
                shape.append(const(max(int(a.get_constant_val().to_python()) for _, a in ftop.get_pieces()) + 1))
                continue
            shape.append(simplify(pw_bound(top.add_constant_val(isl.Val.one(top.get_ctx())), by_name, "hi",
                                           f"extent of {buf.name!r}")[0]))
    except (NonAffine, isl.Error, ValueError) as e:
        where = f"one iteration of loop {loop.name!r}" if loop is not None else "the program"
        raise ArgumentError(f"the region of {buf.name!r} that {where} touches is not an affine box ({e}); "
                            "its storage cannot be shrunk to it") from None
    return lows, shape


# ----------------------------------------------------------------------------- rewriting


def _retarget(program: Program, buf: Buffer, new: Buffer, lows: list[Expr]) -> Program:
    """Every access of `buf` reads / writes `new` at its index minus `lows` (statements rebased first,
    so that the lows, written in loop variables, and the indices speak the same variables)."""
    names = {c.store.name for c in _accessors(program, buf)}
    program = rebase_statements(program, names)

    def shifted(idx: tuple[Expr, ...], sub: Transformer) -> tuple[Expr, ...]:
        return tuple(simplify(binary("sub", sub.visit(i), lo)) if not _zero(lo) else sub.visit(i)
                     for i, lo in zip(idx, lows))

    class _T(Transformer):
        def visit_Load(self, ld: Load) -> Expr:
            if ld.buffer is not buf:
                return self.generic(ld)
            return Load(new, shifted(ld.indices, self))

        def visit_Store(self, st: Store) -> Stmt:
            value = self.visit(st.value)
            if st.buffer is buf:
                return dataclasses.replace(st, buffer=new, indices=shifted(st.indices, self), value=value)
            return st if value is st.value else dataclasses.replace(st, value=value)

        def visit_Allocate(self, a: Allocate) -> Stmt:
            body = self.visit(a.body)
            b = new if a.buffer is buf else a.buffer
            return a if (body is a.body and b is a.buffer) else Allocate(b, body)

    body = _T().visit(program.body)
    temps = tuple(new if t is buf else t for t in program.temps)
    return dataclasses.replace(program, body=body, temps=temps)


def _zero(e: Expr) -> bool:
    return isinstance(e, Const) and e.value == 0


def _unallocate(program: Program, buf: Buffer) -> Program:
    """`program` with the Allocate of `buf` removed (its body in its place) and `buf` a temp again."""
    a = _allocation(program, buf)
    if a is None:
        return program

    class _T(Transformer):
        def visit_Allocate(self, n: Allocate) -> Stmt:
            return self.visit(n.body) if n is a else self.generic(n)

        def visit(self, node: Any) -> Any:
            return node if isinstance(node, Expr) else super().visit(node)

    return dataclasses.replace(program, body=_T().visit(program.body), temps=program.temps + (buf,))


# ----------------------------------------------------------------------------- sliding window


def _slide(program: Program, buf: Buffer, c: For) -> list[Program]:
    """The producer of `buf`, computed inside the serial loop `c`, computes only what earlier iterations
    of `c` did not (see the module docstring): candidate programs, simplest window bound first (the caller
    keeps the first whose reads all find their values); none when the region does not slide along one
    dimension monotonically, or the producer's loops are not of the form compute_at builds."""
    ws = writers(program, buf)
    if c.kind != "serial" or not ws:
        return []
    path = find_loop_path(program.body, c.var)
    assert path is not None
    around = [a for a, _ in path[1] if isinstance(a, For)] + [c]
    try:
        lows, highs = _write_region(program, buf, ws, around)
    except (NonAffine, isl.Error, ValueError):
        return []
    prev = {c.var: binary("sub", c.var, 1)}
    moving = [d for d in range(buf.ndim)
              if const_diff(substitute(lows[d], prev), lows[d]) != 0 or const_diff(substitute(highs[d], prev),
                                                                                      highs[d]) != 0]
    if len(moving) != 1:
        return []
    d = moving[0]
    lo, hi = lows[d], highs[d]
    # monotone: lo(c - 1) <= lo(c) and hi(c - 1) <= hi(c) for every c after the first
    if not (_holds(program, around, c, substitute(lo, prev), lo)
            and _holds(program, around, c, substitute(hi, prev), hi)):
        return []
    # the end of the previous iteration's region: its unclipped pieces first (a clip at the buffer's end is
    # no element to skip), the exact bound last
    ends = [a for a in _min_args(hi) if any(n is c.var for n in walk(a))] + [hi]
    out = []
    for end in ends:
        end_prev = substitute(end, prev)
        k = _max_over(program, around, binary("sub", end_prev, lo))
        if k is None or k < 0:
            continue
        # the new lower end: lo(c) in the first iteration, max(lo(c), end(c - 1)) after it, written affinely as
        # max(lo, end(c - 1) - k * (1 - min(c - c.lo, 1))) with k >= end(c - 1) - lo(c) everywhere
        first = binary("sub", 1, binary("min", binary("sub", c.var, c.lo), 1))
        new_lo = binary("max", lo, binary("sub", end_prev, binary("mul", const(k), first)))
        slid = _start_producer_at(program, ws, d, new_lo, around)
        if slid is not None:
            out.append(slid)
    return out


def _min_args(e: Expr) -> list[Expr]:
    if isinstance(e, Binary) and e.op == "min":
        return _min_args(e.a) + _min_args(e.b)
    return [e]


def _write_region(program: Program, buf: Buffer, ws: list[StmtContext], around: list[For]
                  ) -> tuple[list[Expr], list[Expr]]:
    """Per dimension (lo, hi) of the elements the writers of `buf` write in one iteration of the last
    loop of `around` (exact max / min of affine pieces, else a box around them)."""
    nm = _Names(unique=True)
    pre_names = [nm(p) for p in program.params] + [nm(lp.var) for lp in around]
    pre = f"[{', '.join(pre_names)}] -> "
    xs = [f"x{d}" for d in range(buf.ndim)]
    region = None
    for w in ws:
        sub = dict(zip(w.store.iters, w.store.coords))
        exist = [nm(lp.var) for lp in w.loops if not any(lp is q for q in around)]
        cons = loop_constraints(w.loops, w.guards, nm)
        eqs = [f"{x} = {aff(substitute(i, sub), nm)}" for x, i in zip(xs, w.store.indices)]
        s = isl.Set(f"{pre}{{ [{', '.join(xs)}] : {_exists(exist, _conj(eqs + cons))} }}")
        region = s if region is None else region.union(s)
    assert region is not None
    region = region.coalesce()
    by_name = nm.by_name()
    lows, highs = [], []
    for d in range(buf.ndim):
        # exact, or the box around the region (the caller verifies the window it builds from them)
        lo, _ = pw_bound(region.dim_min(d), by_name, "lo")
        hi, _ = pw_bound(region.dim_max(d).add_constant_val(isl.Val.one(region.get_ctx())), by_name, "hi")
        lows.append(lo)
        highs.append(hi)
    return lows, highs


def _context(program: Program, around: list[For], nm: _Names) -> tuple[str, str]:
    pre_names = [nm(p) for p in program.params] + [nm(lp.var) for lp in around]
    return f"[{', '.join(pre_names)}] -> ", _conj(loop_constraints(around, [], nm))


def _holds(program: Program, around: list[For], c: For, a: Expr, b: Expr) -> bool:
    """a <= b for every value of the loops `around` with c past its first iteration (isl)."""
    nm = _Names(unique=True)
    pre, ctx = _context(program, around, nm)
    bad = isl.Set(f"{pre}{{ : {ctx} and {nm(c.var)} > {aff(c.lo, nm)} and {aff(a, nm)} > {aff(b, nm)} }}")
    return bad.is_empty()


def _max_over(program: Program, around: list[For], e: Expr) -> int | None:
    """The largest value of `e` over the loops `around` and every size (None: unbounded)."""
    nm = _Names(unique=True)
    pre, ctx = _context(program, around, nm)
    s = isl.Set(f"{pre}{{ [v] : {ctx} and v = {aff(e, nm)} }}")
    s = s.project_out(isl.dim_type.param, 0, s.dim(isl.dim_type.param))
    if s.is_empty():
        return 0
    if not s.is_bounded():
        # unbounded above only matters when e grows: bound v's maximum alone
        top = s.lexmax()
        if top.is_empty() or not top.is_bounded():
            return None
        s = top
    pw = s.dim_max(0)
    vals = [int(a.get_constant_val().to_python()) for _, a in pw.get_pieces() if a.is_cst()]
    if len(vals) != len(pw.get_pieces()):
        return None
    return max(vals)


def _start_producer_at(program: Program, ws: list[StmtContext], d: int, new_lo: Expr,
                       around: list[For]) -> Program | None:
    """The producer loop indexing dimension `d` (index = loop + offset, the loop's own) starts where the
    dimension's index reaches `new_lo`."""
    loop: For | None = None
    offset: Expr | None = None
    for w in ws:
        sub = dict(zip(w.store.iters, w.store.coords))
        idx = simplify(substitute(w.store.indices[d], sub))
        inner = [lp for lp in w.loops if not any(lp is q for q in around)]
        used = [lp for lp in inner if any(n is lp.var for n in walk(idx))]
        if len(used) != 1:
            return None
        lp = used[0]
        rest = simplify(substitute(idx, {lp.var: const(0)}))
        if const_diff(substitute(idx, {lp.var: const(1)}), rest) != 1:
            return None
        if loop is not None and (lp is not loop or const_diff(rest, offset) != 0):  # type: ignore[arg-type]
            return None
        loop, offset = lp, rest
    assert loop is not None and offset is not None

    def tidy(e: Expr) -> Expr:
        return simplify_in_context(simplify(e), around, program.params)

    start = tidy(binary("max", loop.lo, binary("sub", new_lo, offset)))
    return replace_loop(program, loop.var, dataclasses.replace(loop, lo=start))


# ----------------------------------------------------------------------------- the primitives


def _place(program: Program, stage: Any, loop: Var | None, who: str, slide: bool = True) -> Program:
    buf = _stage_buffer(program, stage, who)
    if any(a is buf for a in program.args):
        raise ArgumentError(f"{who}: {buf.name!r} is an argument of program {program.name!r} (an input or output); "
                            "only an intermediate stage's storage can be placed")
    if loop is not None and not isinstance(loop, Var):
        raise ArgumentTypeError(f"{who}: the target must be a loop handle, got {type(loop).__name__} {loop!r}")
    program = _unallocate(program, buf)
    ctxs = _accessors(program, buf)
    if not writers(program, buf):
        raise ArgumentError(f"{who}: no statement writes {buf.name!r} in program {program.name!r}")
    if loop is not None:
        if find_loop_path(program.body, loop) is None:
            raise NotFoundError(f"{who}: loop {loop.name!r} is not in program {program.name!r}")
        outside = [c.store.name for c in ctxs if not any(lp.var is loop for lp in c.loops)]
        if outside:
            raise ArgumentError(
                f"{who}: {', '.join(outside)} (which access {buf.name!r}) are not inside loop {loop.name!r}; "
                f"storage at a loop holds only what runs inside it — compute_at({buf.name}, ...) a loop inside "
                f"{loop.name!r} first (Halide's store level must be at or outside the compute level)")
    # the sliding window: the storage outlives the iterations of the innermost loop around every access
    common = _common_loops(ctxs)
    if slide and common and (loop is None or common[-1].var is not loop):
        # the window's bounds may be over-approximated (a region clipped at the buffer's end): a candidate is
        # kept only when every read still finds its value (else the stage is recomputed per iteration, as
        # compute_at left it)
        before = reads_without_source(program, buf.name)
        for slid in _slide(program, buf, common[-1]) if before is not None else []:
            if reads_without_source(slid, buf.name).is_subset(before):
                program = slid
                buf = _stage_buffer(program, buf.name, who)
                break
    lows, shape = storage_box(program, buf, loop)
    new = Buffer(buf.name, tuple(shape), buf.dtype, buf.scope)
    out = _retarget(program, buf, new, lows)
    if loop is None:
        return out
    f = find_loop_path(out.body, loop)
    assert f is not None
    target = f[0]
    out = replace_loop(out, loop, dataclasses.replace(target, body=Allocate(new, target.body)))
    return dataclasses.replace(out, temps=tuple(t for t in out.temps if t is not new))


def store_at(program: Program, stage: Any, loop: Var) -> Program:
    """Store `stage`'s buffer per iteration of `loop`: a scratch buffer allocated at the top of its body,
    shrunk to the box of elements one iteration touches (its shape the largest such box, in sizes),
    indices rebased to the box's low corner (Halide's `store_at`). When the stage is computed at a
    serial loop inside `loop` (compute_at), the storage slides: each iteration of that loop computes
    only what the previous one did not (see the module docstring).

    Precondition: the buffer is an intermediate (not an argument), every statement that writes or
    reads it is inside `loop` (compute_at first: the store level is at or outside the compute level),
    and the box is affine. Checked: every value a reader reads is written before it in the same
    allocation (a ScheduleError whose witness is the writer and reader the new storage separates).

        for y: for y_c, x_c: P[y + y_c, x_c] = ..       for y: allocate P[2, W]:
               for x: ... P[y + 1, x] ...          ==>         for y_c, x_c: P[y_c, x_c] = ..
                                                               for x: ... P[1, x] ...
    """
    return _place(program, stage, loop, "store_at")


def store_root(program: Program, stage: Any) -> Program:
    """Store `stage`'s buffer at the root (a global temporary, as before), shrunk to the box of elements
    the whole program touches, indices rebased (Halide's `store_root`). When the stage is computed at
    a serial loop (compute_at), the storage slides along it: each iteration computes only what the
    previous one did not (Halide's lesson 8: producer.store_root().compute_at(consumer, y)).

    Precondition: the buffer is an intermediate and its box is affine. Checked like store_at.

        for y: for y_c in 0..2: P[y + y_c, ..] = ..   ==>   for y: for y_c in min(y, 1)..2: P[y + y_c, ..] = ..
    """
    return _place(program, stage, None, "store_root")


def compute_root(program: Program, stage: Any) -> Program:
    """Compute `stage` in a nest of its own at the root of the program and store it there (Halide's
    `compute_root`) — loopir's default placement: this checks that the stage is there and shrinks its
    buffer to the box of elements the program touches (store_root without a sliding window).

    Precondition: no loop encloses the statements that write the buffer together with any other
    statement (the stage was not compute_at'ed); an ArgumentError otherwise.

        P: float32[n]  # temporary                ==>   P: float32[n]  # temporary (its accessed box)
        for i: P[i] = ..;  for j: C[j] = P[j]            for i: P[i] = ..;  for j: C[j] = P[j]
    """
    buf = _stage_buffer(program, stage, "compute_root")
    ws = writers(program, buf)
    if not ws:
        raise ArgumentError(f"compute_root: no statement writes {buf.name!r} in program {program.name!r}")
    names = {w.store.name for w in ws}
    for lp in ws[0].loops[:1]:
        inside = {c.store.name for c in statements(lp)}
        if inside - names:
            raise ArgumentError(
                f"compute_root: {buf.name!r} is computed inside loop {lp.var.name!r}, with "
                f"{', '.join(sorted(inside - names))}; compute_root keeps a stage in its own nest at the root "
                "(apply it before compute_at, or leave the stage where compute_at put it)")
    return _place(program, buf.name, None, "compute_root", slide=False)


def set_scope(program: Program, stage: Any, scope: str) -> Program:
    """Where `stage`'s buffer lives (TVM's `set_scope`): "global" (a temporary or, after store_at, a
    scratch buffer: the stack or the heap on the CPU), "local" (per thread: registers / the stack),
    "shared" (CUDA `__shared__`, one copy per block; barriers come from the lowering passes).

    Precondition: "local" and "shared" need a buffer placed by store_at (an allocation inside a loop)
    with a constant shape; refused (naming the stage and its size) otherwise.

        for bx: allocate P: float32[6] global   ==>   for bx: allocate P: float32[6] shared
    """
    if scope not in SCOPES:
        raise ArgumentError(f"set_scope: scope must be one of {', '.join(SCOPES)}, got {scope!r}")
    buf = _stage_buffer(program, stage, "set_scope")
    a = _allocation(program, buf)
    if scope != "global":
        if a is None:
            raise ArgumentError(
                f"set_scope: {buf.name!r} is stored at the root of the program (a global temporary); a {scope} "
                f"buffer is allocated inside a loop — store_at({buf.name}, loop) first")
        size = [simplify(d) for d in buf.shape]
        if not all(isinstance(d, Const) for d in size):
            shown = " x ".join(str(d) for d in size)
            raise ArgumentError(
                f"set_scope: stage {buf.name!r} needs {shown} elements per allocation, not a constant size; a "
                f"{scope} buffer needs a constant shape (split the loops by constants so the footprint is "
                "constant, or keep it 'global')")
    if buf.scope == scope:
        return program
    new = dataclasses.replace(buf, scope=scope)
    return replace_buffers(program, {buf: new})


# ----------------------------------------------------------------------------- legality


def reads_without_source(program: Program, name: str) -> isl.UnionSet | None:
    """The instances of `program` that read buffer `name` with no write of the element before them in the same
    allocation (isl dataflow: scratch buffers expanded by their allocation instance); None: no such buffer."""
    b = _Builder(program)
    rt, wt, mt = b.access_texts()
    isl_name = next((n for n, buf in b.bufnames.items() if buf.name == name), None)
    if isl_name is None:
        return None
    sched = schedule_map(program)
    dom = sched.domain()
    pre = b.prefix()

    def only(text: str) -> isl.UnionMap:
        um = isl.UnionMap(pre + text).intersect_domain(dom)
        out = isl.UnionMap.empty(um.get_space())
        ml = um.get_map_list()
        for k in range(ml.n_map()):
            m = ml.get_at(k)
            if m.get_tuple_name(isl.dim_type.out) == isl_name:
                out = out.union(isl.UnionMap.from_map(m))
        return out

    reads, must, may = only(rt), only(wt), only(mt)
    ai = isl.UnionAccessInfo.from_sink(reads).set_must_source(must).set_may_source(may)
    return ai.set_schedule_map(sched).compute_flow().get_may_no_source().domain()


def check_storage(ctx: CheckContext) -> poly.Witness | None:
    """Every read of the stage's buffer in the new program has a source: a write of the same element,
    before it, in the same allocation (isl dataflow on the new program). Formal condition: the new
    program's reads of the buffer with no must-source are empty. The witness of a violation is the
    old program's flow dependence (writer -> reader) into such a read."""
    new, old = ctx.new, ctx.old
    name = ctx.args[0] if isinstance(ctx.args[0], str) else getattr(ctx.args[0], "name", ctx.args[0])
    lonely = reads_without_source(new, name)
    if lonely is None or lonely.is_empty():
        return None
    # the old instances of those reads, and the old writes they read from
    ren = rename_map(old, new)
    deps = ctx.deps
    writer_names = {poly._sanitize(w.store.name) for w in writers(old, _stage_buffer(old, name, "check"))}
    src = None
    if ren is not None:
        sinks = lonely.apply(ren.reverse())
        fl = deps.flow.intersect_range(sinks)
        ml = fl.get_map_list()
        for k in range(ml.n_map()):
            m = ml.get_at(k)
            if m.get_tuple_name(isl.dim_type.in_) in writer_names:
                src = isl.UnionMap.from_map(m) if src is None else src.union(isl.UnionMap.from_map(m))
    if src is None or src.is_empty():
        raise ArgumentError(f"storage of {name!r}: a read of it in the new program has no value written before it "
                            "in the same allocation, and no writer-reader pair of the old program explains it")
    return poly._witness(src, "flow", deps)


def _storage_hint(ctx: CheckContext, w: poly.Witness) -> str | None:
    return (f"{w.sink[0]} reads the value of {w.buffer} that {w.source[0]} wrote, but the new storage puts them in "
            f"different allocations of {w.buffer} (each iteration of the storage loop owns one): store it at a loop "
            "outside the loops across which the value is still needed, or at the root")


def _register() -> None:
    @primitive("store_at", check=check_storage, hint=_storage_hint, rebase=True)
    def _store_at(program: Program, stage: Any, loop: Var) -> Program:
        return store_at(program, stage, loop)

    _store_at.__doc__ = store_at.__doc__

    @primitive("store_root", check=check_storage, hint=_storage_hint, rebase=True)
    def _store_root(program: Program, stage: Any) -> Program:
        return store_root(program, stage)

    _store_root.__doc__ = store_root.__doc__

    @primitive("compute_root", check=check_storage, hint=_storage_hint, rebase=True)
    def _compute_root(program: Program, stage: Any) -> Program:
        return compute_root(program, stage)

    _compute_root.__doc__ = compute_root.__doc__

    # the scope decides which iterations share a copy ("shared": the threads of a block): the loop kinds are
    # checked again against the new program's dependences (rebase), the statement instances do not change
    @primitive("set_scope", check=lambda ctx: None, rebase=True)
    def _set_scope(program: Program, stage: Any, scope: str) -> Program:
        return set_scope(program, stage, scope)

    _set_scope.__doc__ = set_scope.__doc__


_register()
