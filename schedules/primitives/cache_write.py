"""`cache_write`: a stage computes into a small scratch buffer (registers or shared memory)
allocated inside one loop, and its result leaves that buffer once, at the end of the loop's
iteration — optionally through elementwise *epilogue* stages, so no extra pass reads it back.

    for ty, tx (thread):                                for ty, tx (thread):
        for ii, jj:                                         allocate mm_local: float32[8, 8] local
            mm[i, j] = 0            # mm_init                for ii, jj: mm_local[ii, jj] = 0           # mm_init
            for k:                                           for ii, jj:
                mm[i, j] += A*B     # mm        ==>              for k: mm_local[ii, jj] += A*B          # mm
    for i, j:                                                for q0, q1:
        C[i, j] = relu(mm[i, j] + bias[j])                       C[..] = relu(mm_local[q0, q1] + bias[..])  # C
                                                         (cache_write(mm, "local", tx, epilogue=[C]))

Design. `cache_write(program, buffer, scope, loop, epilogue=(), hoist_init=True)`:
- every statement inside `loop` that writes or reads `buffer` is redirected to the scratch
  buffer `<name>_local` (scope "local" or "shared"), whose shape is the constant-size box of
  the elements written in ONE iteration of `loop`, compacted by the access stride (a thread
  owning rows ty, ty+16, … gets 8 rows, not 113), and, when virtual-thread loops (bind
  "vthread") lie inside `loop`, by a second stride (TVM's tile: rows {4ty..4ty+3, 32+4ty..
  32+4ty+3} get 8 rows, not 36; `_two_level`);
- the initialising statement (writes `buffer` without reading it) is hoisted into its own
  copy of its loops at the top of the iteration (`hoist_init`), so that the reduction loop
  can then be reordered outside the register tile;
- each `epilogue` stage (an elementwise consumer that reads `buffer[its own iters]`) moves
  to the end of the iteration, over the elements just computed (TVM's reverse_compute_at);
- a copy-out `<name>_copy: buffer[...] = <name>_local[...]` is added only when `buffer` is
  an argument of the program or is read outside `loop`; a temporary with no other reader
  disappears.

Touched statements are re-based: their iters become the loops around them (coords ==
iters), so that indices into the scratch buffer can name the tile loops.

Legality (all exact, with isl):
- hoisting and the epilogue move: `poly.find_violation(dependences(before), after)` is None,
  and a moved stage keeps exactly its instances;
- redirecting: every read of `buffer` inside `loop` has its value written in the SAME
  iteration of `loop` (and of the loops around it) by a statement inside `loop`; otherwise a
  `ScheduleError` (kind "flow") names the read and the write it would lose.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import islpy as isl

from loopir import deps_shortcuts, poly
from loopir.dtypes import INDEX
from loopir.errors import ArgumentError, ArgumentTypeError, NotFoundError
from loopir.isl_conv import (NonAffine, _conj, _exists, _Names, aff, aff_to_expr, constraints_to_cond, loop_constraints,
    prefix, pw_to_expr)
from loopir.nodes import (Allocate, Buffer, Expr, For, If, Load, Program, Seq,
    Stmt, Store, Var, binary, const)
from loopir.visit import Transformer, seq, statements, substitute, walk

from schedules.errors import ScheduleError

from . import fresh_name, primitive
from .compute import producer_buffer

SCOPES = ("local", "shared")


def _val(v: isl.Val) -> tuple[int, int]:
    return v.get_num_si(), v.get_den_val().get_num_si()


# ----------------------------------------------------------------------------- IR helpers


@dataclass(frozen=True)
class _Ctx:
    """Where a statement sits relative to the cached loop."""

    stmt: Store
    outer: tuple[For, ...]  # loops from the program root down to `loop` included
    inner: tuple[For, ...]  # loops strictly inside `loop`
    guards: tuple[Expr, ...]  # every guard around the statement


def find_for(body: Stmt, var: Var) -> For | None:
    for n in walk(body):
        if isinstance(n, For) and n.var is var:
            return n
    return None


def _rebase(st: Store, loops: tuple[For, ...]) -> Store:
    """The same statement with iters = the loops around it (coords == iters)."""
    sub = dict(zip(st.iters, st.coords))
    vs = tuple(f.var for f in loops)
    return replace(
        st,
        indices=tuple(substitute(i, sub) for i in st.indices),
        value=substitute(st.value, sub),
        iters=vs,
        coords=vs,
    )


def _replace_stmts(body: Stmt, new: dict[int, Stmt | None]) -> Stmt:
    """Replace statements (by id) in `body`; None removes them, pruning emptied loops/guards."""

    class _R(Transformer):
        def visit_Store(self, s: Store) -> Any:
            return new.get(id(s), s) if id(s) in new else s

        def visit_Seq(self, s: Seq) -> Any:
            kids = [self.visit(c) for c in s.body]
            kept = [k for k in kids if k is not None]
            if all(a is b for a, b in zip(kids, s.body)):
                return s
            return seq(*kept) if kept else None

        def visit_For(self, f: For) -> Any:
            b = self.visit(f.body)
            return None if b is None else (f if b is f.body else replace(f, body=b))

        def visit_If(self, f: If) -> Any:
            t = self.visit(f.then)
            o = self.visit(f.orelse) if f.orelse is not None else None
            if t is None and o is None:
                return None
            if t is f.then and o is f.orelse:
                return f
            if t is None:
                return If(~f.cond, o)
            return replace(f, then=t, orelse=o)

        def visit_Allocate(self, a: Allocate) -> Any:
            b = self.visit(a.body)
            return None if b is None else (a if b is a.body else replace(a, body=b))

    return _R().visit(body)


def _replace_for(body: Stmt, target: For, new: Stmt) -> Stmt:
    class _R(Transformer):
        def visit_For(self, f: For) -> Any:
            return new if f is target else self.generic(f)

    return _R().visit(body)


def _redirect_loads(e: Any, buf: Buffer, fn: Any) -> Any:
    class _L(Transformer):
        def visit_Load(self, ld: Load) -> Any:
            ld2 = self.generic(ld)
            return fn(ld2) if ld2.buffer is buf else ld2

    return _L().visit(e)


def _loads_of(e: Any, buf: Buffer) -> list[Load]:
    return [n for n in walk(e) if isinstance(n, Load) and n.buffer is buf]


def _fresh_nest(loops: tuple[For, ...], guards: tuple[Expr, ...], body: Store) -> tuple[Stmt, dict[Var, Var]]:
    """Fresh copies of `loops` (outermost first) with `guards` innermost, around `body`; returns the var map."""
    sub: dict[Var, Expr] = {}
    fresh: list[For] = []
    for f in loops:
        v = Var(f.var.name, f.var.dtype)
        fresh.append(replace(f, var=v, lo=substitute(f.lo, sub), hi=substitute(f.hi, sub)))
        sub[f.var] = v
    inner: Stmt = replace(body, coords=tuple(substitute(c, sub) for c in body.coords))
    conds = [substitute(g, sub) for g in guards]
    if conds:
        cond = conds[0]
        for c in conds[1:]:
            cond = cond & c
        inner = If(cond, inner)
    for f in reversed(fresh):
        inner = replace(f, body=inner)
    return inner, sub  # type: ignore[return-value]


def _inside(body: Stmt) -> list[tuple[Store, tuple[For, ...], tuple[Expr, ...]]]:
    """Every statement of `body` with the loops and guards around it inside `body`."""
    out: list[tuple[Store, tuple[For, ...], tuple[Expr, ...]]] = []
    for c in statements(body):
        out.append((c.store, c.loops, c.guards))
    return out


def _path_to(body: Stmt, target: For) -> tuple[tuple[For, ...], tuple[Expr, ...]] | None:
    """The loops (ending with `target`) and guards from the root down to `target`."""

    def go(s: Stmt, loops: tuple[For, ...], guards: tuple[Expr, ...]) -> Any:
        if s is target:
            return loops + (s,), guards
        if isinstance(s, For):
            return go(s.body, loops + (s,), guards)
        if isinstance(s, Seq):
            for c in s.body:
                r = go(c, loops, guards)
                if r is not None:
                    return r
        if isinstance(s, If):
            r = go(s.then, loops, guards + (s.cond,))
            if r is None and s.orelse is not None:
                r = go(s.orelse, loops, guards + (~s.cond,))
            return r
        if isinstance(s, Allocate):
            return go(s.body, loops, guards)
        return None

    return go(body, (), ())


def _timevecs(body: Stmt) -> dict[int, list[str]]:
    """Time vectors (textual positions interleaved with loop vars) of the statements of `body`."""
    out: dict[int, list[Any]] = {}

    def go(s: Stmt, pre: list[Any]) -> None:
        if isinstance(s, Store):
            out[id(s)] = pre
        elif isinstance(s, Seq):
            for k, c in enumerate(s.body):
                go(c, pre + [k])
        elif isinstance(s, For):
            go(s.body, pre + [s.var])
        elif isinstance(s, If):
            go(s.then, pre + [0])
            if s.orelse is not None:
                go(s.orelse, pre + [1])
        elif isinstance(s, Allocate):
            go(s.body, pre)

    go(body, [])
    return out


# ----------------------------------------------------------------------------- errors


def _schedule_error(buf: Buffer, sink: tuple[str, dict[str, int]], source: Any, params: dict[str, int],
                    msg: str) -> Exception:
    return ScheduleError("cache_write", "flow", buf.name, source, sink, params, message=msg)


def resolve_buffer(program: Program, x: Any) -> Buffer:
    """A Buffer from a Buffer, a te.Tensor or a buffer / statement name (`compute.producer_buffer`), checked
    to be written by a statement of `program`."""
    buf = producer_buffer(program, x)
    if not any(c.store.buffer is buf for c in statements(program)):
        raise ArgumentError(f"cache_write: no statement of program {program.name!r} writes buffer {buf.name!r}")
    return buf


def _loop_var(loop: Any) -> Var:
    if isinstance(loop, For):
        return loop.var
    if isinstance(loop, Var):
        return loop
    v = getattr(loop, "var", None)
    if isinstance(v, Var):
        return v
    raise ArgumentTypeError(f"cache_write: expected a loop (handle, For or loop Var), "
                            f"got {type(loop).__name__} {loop!r}")


# ----------------------------------------------------------------------------- analyses


def _elems(st: Store) -> tuple[Expr, ...]:
    """The statement's write indices in terms of the loops around it."""
    sub = dict(zip(st.iters, st.coords))
    return tuple(substitute(i, sub) for i in st.indices)


def _layout(buf: Buffer, writers: list[tuple[Store, tuple[For, ...], tuple[Expr, ...]]], outer: tuple[For, ...],
            outer_guards: tuple[Expr, ...], params: tuple[Var, ...], nm: _Names,
            compact_holes: bool = False) -> _Layout:
    """The constant-size, stride-compacted box of the elements written in one iteration of the loop
    (`compact_holes`: also compact a dimension strided twice, see _two_level)."""
    pnames = list(params) + [f.var for f in outer]
    pre = prefix(pnames, nm)
    octx = loop_constraints(outer, outer_guards, nm)
    xs = [f"x{d}" for d in range(buf.ndim)]
    pieces = []
    try:
        for st, loops, guards in writers:
            eqs = [f"{x} = {aff(e, nm)}" for x, e in zip(xs, _elems(st))]
            body = _conj(eqs + loop_constraints(loops, guards, nm) + octx)
            pieces.append(isl.Set(f"{pre}{{ B[{', '.join(xs)}] : {_exists([nm(f.var) for f in loops], body)} }}"))
        context = isl.Set(f"{pre}{{ : {_conj(octx)} }}")
    except NonAffine as e:
        raise ArgumentError(f"cache_write: cannot analyse the accesses to {buf.name!r}: {e}") from None
    w = pieces[0]
    for x in pieces[1:]:
        w = w.union(x)
    w = w.coalesce()
    offs: list[Expr] = []
    strides: list[int] = []
    eqs = []
    for d in range(buf.ndim):
        si = w.get_stride_info(d)
        n_, d_ = _val(si.get_stride())
        if n_ <= 0 or d_ != 1:
            offs.append(const(0, INDEX))
            strides.append(1)
        else:
            offs.append(aff_to_expr(si.get_offset(), nm.by_name(), simplify=False))
            strides.append(n_)
        eqs.append(f"{xs[d]} = {aff(offs[d], nm)} + {strides[d]} * q{d}")
    qs = [f"q{d}" for d in range(buf.ndim)]
    wq = w.apply(isl.Map(f"{pre}{{ B[{', '.join(xs)}] -> Q[{', '.join(qs)}] : {_conj(eqs)} }}"))
    los: list[Expr] = []
    for d in range(buf.ndim):
        try:
            los.append(pw_to_expr(wq.dim_min(d), nm.by_name(), f"the lowest index of {buf.name!r} along dimension {d}",
                                  single=True, simplify=False))
        except NonAffine as e:
            raise ArgumentError(f"cache_write: {e}") from None
    rs = [f"r{d}" for d in range(buf.ndim)]
    shift = _conj([f"r{d} = q{d} - ({aff(los[d], nm)})" for d in range(buf.ndim)])
    region = wq.apply(isl.Map(f"{pre}{{ Q[{', '.join(qs)}] -> R[{', '.join(rs)}] : {shift} }}")).coalesce()
    flat = region.project_out(isl.dim_type.param, 0, region.dim(isl.dim_type.param))
    sizes: list[int] = []
    for d in range(buf.ndim):
        if not flat.is_bounded():
            raise ArgumentError(
                f"cache_write: the part of {buf.name!r} written in one iteration of the loop has no constant size "
                f"({region}); cache it at an inner loop, or tile first"
            )
        hi = flat.dim_max(d)
        vals = [_val(a.get_constant_val())[0] for _, a in hi.get_pieces()]
        sizes.append(max(vals) + 1)
    radix: list[tuple[int, int] | None] = [None] * buf.ndim
    if compact_holes:
        radix, region, sizes = _two_level(region, sizes, context)
    return _Layout(offs, strides, los, sizes, region, context, radix)


def _two_level(region: isl.Set, sizes: list[int],
               context: isl.Set) -> tuple[list[tuple[int, int] | None], isl.Set, list[int]]:
    """Compact a dimension whose box has holes of one regular shape: the indices written (over every value of
    the outer loops) are exactly {a*v + f : 0 <= v < n1, 0 <= f < n0} with a > n0 — a tile strided twice, as
    TVM's virtual threads make it (f = 32*vthread + 4*thread + fi: per thread {0..3, 32..35}). Such an index r
    is stored at (r // a)*n0 + r % a: n0*n1 elements instead of a*(n1 - 1) + n0. Other dimensions keep r.
    Only when the compacted region is the whole box for every value of the outer loops (no guard over it)."""
    flat = region.project_out(isl.dim_type.param, 0, region.dim(isl.dim_type.param))
    nd, old_sizes = len(sizes), sizes
    radix: list[tuple[int, int] | None] = [None] * nd
    for d in range(nd):
        if sizes[d] > 4096:
            continue
        line = flat.project_out(isl.dim_type.set, d + 1, nd - d - 1).project_out(isl.dim_type.set, 0, d)
        pts: set[int] = set()
        line.foreach_point(lambda p, pts=pts: pts.add(int(p.get_coordinate_val(isl.dim_type.set, 0).to_python())))
        if len(pts) == sizes[d] or 0 not in pts:
            continue
        n0 = next(k for k in range(sizes[d] + 1) if k not in pts)
        rest = [x for x in pts if x >= n0]
        if not rest or len(pts) % n0:
            continue
        a, n1 = min(rest), len(pts) // n0
        if pts == {a * v + f for v in range(n1) for f in range(n0)}:
            radix[d], sizes = (a, n0), sizes[:d] + [n0 * n1] + sizes[d + 1:]
    if not any(radix):
        return radix, region, sizes
    rs = [f"r{d}" for d in range(nd)]
    cs = [f"(floor(r{d}/{x[0]})*{x[1]} + r{d} - {x[0]}*floor(r{d}/{x[0]}))" if x else f"r{d}"
          for d, x in enumerate(radix)]
    space = region.get_space()
    pnames = [space.get_dim_name(isl.dim_type.param, k) for k in range(region.dim(isl.dim_type.param))]
    m = isl.Map(f"[{', '.join(pnames)}] -> {{ R[{', '.join(rs)}] -> R[{', '.join(cs)}] }}")
    compact = region.apply(m).coalesce()
    box_text = _conj([f"0 <= r{d} < {n}" for d, n in enumerate(sizes)])
    box = isl.Set(f"[{', '.join(pnames)}] -> {{ R[{', '.join(rs)}] : {box_text} }}").intersect_params(context)
    if not box.is_subset(compact):
        return [None] * nd, region, old_sizes
    return radix, compact, sizes


def _compact(r: Expr, radix: tuple[int, int] | None) -> Expr:
    """A box index r as stored (_two_level)."""
    if radix is None:
        return r
    a, n0 = radix
    return binary("add", binary("mul", binary("floordiv", r, const(a)), const(n0)), binary("mod", r, const(a)))


def _expand(q: Expr, radix: tuple[int, int] | None) -> Expr:
    """The box index stored at q (the inverse of _compact)."""
    if radix is None:
        return q
    a, n0 = radix
    return binary("add", binary("mul", binary("floordiv", q, const(n0)), const(a)), binary("mod", q, const(n0)))


def _region_guard(lay: _Layout, qs: list[Var], nm: _Names) -> Expr | None:
    """The condition, over the box, that selects the elements really written (None: all of them)."""
    region = lay.region
    pre = region.get_space()
    names = [pre.get_dim_name(isl.dim_type.param, k) for k in range(region.dim(isl.dim_type.param))]
    rs = [f"r{d}" for d in range(len(qs))]
    box_text = _conj([f"0 <= r{d} < {s}" for d, s in enumerate(lay.size)])
    box = isl.Set(f"[{', '.join(names)}] -> {{ R[{', '.join(rs)}] : {box_text} }}").intersect_params(lay.context)
    if box.is_subset(region):
        return None
    g = region.gist(box).coalesce()
    conds: list[Expr] = []
    for bset in g.get_basic_sets():
        c = constraints_to_cond(bset, {**nm.by_name(), **{f"r{d}": q for d, q in enumerate(qs)}}, simplify=False)
        if c is None:
            return None
        conds.append(c)
    out = conds[0]
    for c in conds[1:]:
        out = out | c
    return out


def _local_index(idx: tuple[Expr, ...], st: Store, loops: tuple[For, ...], guards: tuple[Expr, ...],
                 lay: _Layout, params: tuple[Var, ...]) -> tuple[Expr, ...]:
    """Index into the scratch buffer of an access `buf[idx]` of `st`, in `st`'s iters (simplified by isl)."""
    sub = dict(zip(st.iters, st.coords))
    direct = [_compact(
        binary("sub", binary("floordiv", binary("sub", substitute(e, sub), lay.off[d]), lay.stride[d]), lay.lo[d])
        if lay.stride[d] != 1
        else binary("sub", binary("sub", substitute(e, sub), lay.off[d]), lay.lo[d]), lay.radix[d])
        for d, e in enumerate(idx)
    ]
    nm = _Names(unique=True)
    its = [f"it{k}" for k in range(len(st.iters))]
    try:
        cons = [f"{it} = {aff(c, nm)}" for it, c in zip(its, st.coords)] + loop_constraints(loops, guards, nm)
        out = []
        for e in direct:
            body = _conj([f"o = {aff(e, nm)}"] + cons)
            text = f"{prefix(params, nm)}{{ [{', '.join(its)}] -> [o] : {_exists([nm(f.var) for f in loops], body)} }}"
            m = isl.Map(text)
            pa = m.as_pw_multi_aff().get_pw_aff(0)
            its_vars = {**nm.by_name(), **{f"it{k}": v for k, v in enumerate(st.iters)}}
            out.append(pw_to_expr(pa, its_vars, "index", single=True, simplify=False))
        return tuple(out)
    except (NonAffine, isl.Error):
        inv = {c: v for v, c in zip(st.iters, st.coords) if isinstance(c, Var)}
        if len(inv) != len(st.coords):
            raise ArgumentError(f"cache_write: cannot express the scratch index of statement {st.name!r}") from None
        return tuple(substitute(e, inv) for e in direct)


def _check_order(before: Program, after: Program, buf: Buffer, what: str, derived: poly.Deps | None,
                 moved: list[Store]) -> None:
    """Legal iff no dependence of `before` runs backwards in `after` (poly.find_violation is None).

    Only the `moved` statements change their place (the others keep their relative order), so only the
    dependences through the buffers they access can run backwards: without `derived`, those alone are analysed
    (exactly, as in the whole analysis). `derived`: the dependences of `before` derived without an analysis
    (deps_shortcuts.derived_dependences); equal to a fresh analysis's as relations, so they decide acceptance;
    a refusal (and its witness, which depends on the relations' representation) is decided again on a fresh
    analysis, as without them."""
    # legal iff no dependence (s -> t) through a buffer a moved statement accesses has after(t) <= after(s)
    only = frozenset({buf, *(st.buffer for st in moved),
                      *(n.buffer for st in moved for n in walk(st.value) if isinstance(n, Load))})
    deps = derived or poly.dependences(before, only)
    bad = poly.instance_mismatch(deps, after)
    w = poly.find_violation(deps, after) if bad is None else None
    if derived is not None and (bad is not None or w is not None):
        deps = poly.dependences(before, only)
        bad = poly.instance_mismatch(deps, after)
        w = poly.find_violation(deps, after) if bad is None else None
    if bad is not None:
        raise ArgumentError(f"cache_write: {what} {buf.name!r} would change the computed instances: {bad}")
    if w is not None:
        raise ScheduleError.from_witness("cache_write", w, before, None, None, f"cache_write: {what} {buf.name!r}")


def _check_sourced(buf: Buffer, target: For, outer: tuple[For, ...], outer_guards: tuple[Expr, ...],
                   params: tuple[Var, ...], nm: _Names) -> None:
    """Every read of buf inside one iteration of `target` has a source write in that same iteration."""
    # formal condition: no_source(reads of buf inside target | writes of buf inside target, schedule of the body) = {}
    inside = _inside(target.body)
    times = _timevecs(target.body)
    width = max(len(t) for t in times.values()) if times else 0
    pre = prefix(list(params) + [f.var for f in outer], nm)
    octx = loop_constraints(outer, outer_guards, nm)
    dom, sched, reads, writes = [], [], [], []
    names: dict[str, Store] = {}
    for k, (st, loops, guards) in enumerate(inside):
        sname = f"S{k}"
        names[sname] = st
        lv = ", ".join(nm(f.var) for f in loops)
        dom.append(f"{sname}[{lv}] : {_conj(loop_constraints(loops, guards, nm) + octx)}")
        tv = [nm(t) if isinstance(t, Var) else str(t) for t in times[id(st)]] + ["0"] * (width - len(times[id(st)]))
        sched.append(f"{sname}[{lv}] -> [{', '.join(tv)}]")
        sub = dict(zip(st.iters, st.coords))
        for ld in _loads_of(st.value, buf):
            reads.append(f"{sname}[{lv}] -> B[{', '.join(aff(substitute(i, sub), nm) for i in ld.indices)}]")
        if st.buffer is buf:
            writes.append(f"{sname}[{lv}] -> B[{', '.join(aff(i, nm) for i in _elems(st))}]")
    if not reads:
        return
    d = isl.UnionSet(f"{pre}{{ {'; '.join(dom)} }}")
    s = isl.UnionMap(f"{pre}{{ {'; '.join(sched)} }}").intersect_domain(d)
    r = isl.UnionMap(f"{pre}{{ {'; '.join(reads)} }}").intersect_domain(d)
    w = isl.UnionMap(f"{pre}{{ {'; '.join(writes)} }}").intersect_domain(d)
    flow = isl.UnionAccessInfo.from_sink(r).set_must_source(w).set_schedule_map(s).compute_flow()
    unsourced = flow.get_must_no_source().union(flow.get_may_no_source())
    if unsourced.is_empty():
        return
    m = unsourced.get_map_list().get_at(0)
    pt = m.wrap().sample_point()
    sp = m.get_space()
    st = names[sp.get_tuple_name(isl.dim_type.in_)]
    vals = [int(pt.get_coordinate_val(isl.dim_type.set, k).to_python()) for k in range(m.dim(isl.dim_type.in_))]
    pvals = {sp.get_dim_name(isl.dim_type.param, k): int(pt.get_coordinate_val(isl.dim_type.param, k).to_python())
             for k in range(m.dim(isl.dim_type.param))}
    loop_names = [f.var.name for f in _ctx_loops(target.body, st)]
    sink_env = dict(zip(loop_names, vals))
    outer_env = {f.var.name: pvals[nm(f.var)] for f in outer}
    size_env = {p.name: pvals[nm(p)] for p in params if nm(p) in pvals}
    sink = (st.name, {**outer_env, **sink_env})
    msg = (
        f"cache_write({buf.name}, loop={target.var.name}) is illegal: "
        f"{st.name}[{', '.join(f'{k}={v}' for k, v in sink[1].items())}] "
        f"reads {buf.name} written outside that iteration of loop {target.var.name!r} "
        f"(or never written: a value from before the nest){' at ' + str(size_env) if size_env else ''}; "
        f"a scratch buffer allocated inside {target.var.name!r} would not hold it. "
        f"hint: move the initialisation and the whole reduction inside {target.var.name!r} "
        "(reorder the reduction loop inward)"
    )
    raise _schedule_error(buf, sink, (f"{buf.name} before loop {target.var.name}", {}), size_env, msg)


def _ctx_loops(body: Stmt, st: Store) -> tuple[For, ...]:
    for s, loops, _ in _inside(body):
        if s is st:
            return loops
    return ()


def _move_epilogue(program: Program, e: Buffer, buf: Buffer, elem: list[Expr], region_vars: tuple[Var, ...],
                   loopname: str) -> Store:
    """The epilogue statement re-based onto the region loops (iters := outer loops + region loops)."""
    ctxs = [c for c in statements(program) if c.store.buffer is e]
    if len(ctxs) != 1:
        raise ArgumentError(
            f"cache_write: epilogue stage {e.name!r} is written by {len(ctxs)} statements; an epilogue is one "
            "elementwise statement"
        )
    st = ctxs[0].store
    if any(f.var.name == loopname for f in ctxs[0].loops) and any(f.var is region_vars[0] for f in ctxs[0].loops):
        raise ArgumentError(f"cache_write: epilogue stage {e.name!r} is already inside loop {loopname!r}")
    loads = _loads_of(st.value, buf)
    if not loads or any(len(ld.indices) != len(st.iters) or any(a is not b for a, b in zip(ld.indices, st.iters))
                        for ld in loads):
        raise ArgumentError(
            f"cache_write: epilogue stage {e.name!r} must read {buf.name}[{', '.join(v.name for v in st.iters)}] "
            f"(its own iteration, elementwise); it reads {', '.join(str(ld) for ld in loads) or 'nothing of it'}"
        )
    return replace(st, coords=tuple(elem))


def _rebase_vars(st: Store, vs: tuple[Var, ...]) -> Store:
    sub = dict(zip(st.iters, st.coords))
    return Store(st.name, st.buffer, tuple(substitute(i, sub) for i in st.indices), substitute(st.value, sub), vs, vs)


# ----------------------------------------------------------------------------- the primitive


@dataclass
class _Layout:
    off: list[Expr]  # element = off + stride * (local + lo), per dimension, in outer loop vars
    stride: list[int]
    lo: list[Expr]
    size: list[int]
    region: isl.Set  # local indices written in one iteration (params: sizes + outer loop vars)
    context: isl.Set  # outer loops' domain (params only)
    radix: list[tuple[int, int] | None]  # (a, n0): box index r is stored at (r // a)*n0 + r % a (see _two_level)


def cache_write(
    program: Program,
    buffer: Any,
    scope: str,
    loop: Any,
    *,
    epilogue: Any = (),
    hoist_init: bool = True,
    check: bool = True,
    deps: poly.Deps | None = None,
) -> tuple[Program, Buffer]:
    """Compute `buffer` into a scratch buffer of `scope` allocated inside `loop`.

    Precondition: some statements inside `loop` write `buffer`; every read of `buffer`
    inside `loop` reads a value written in the same iteration of `loop` (a reduction whose
    init and update are both inside `loop`); the elements written in one iteration fit a
    box of constant size (after compacting strides). Each `epilogue` stage is written by one
    statement outside `loop` that reads `buffer[<its iters>]` and covers exactly the
    elements of `buffer`. Returns `(new_program, scratch_buffer)`; see the module docstring
    for the nest before/after. `deps`: the dependences of a program that `program` is a checked
    schedule of (a Schedule's); the checks then derive the intermediate programs' dependences from
    them (deps_shortcuts.derived_dependences) instead of analysing each afresh.
    """
    if scope not in SCOPES:
        raise ArgumentError(f"cache_write: scope must be one of {', '.join(SCOPES)}, got {scope!r}")
    buf = resolve_buffer(program, buffer)
    if buf.scope != "global":
        raise ArgumentError(f"cache_write: buffer {buf.name!r} is already a {buf.scope} scratch buffer")
    lvar = _loop_var(loop)
    target = find_for(program.body, lvar)
    if target is None:
        raise NotFoundError(f"cache_write: loop {lvar.name!r} is not a loop of program {program.name!r}")
    path = _path_to(program.body, target)
    assert path is not None
    outer, outer_guards = path
    eps = [resolve_buffer(program, e) for e in (epilogue if isinstance(epilogue, (list, tuple)) else [epilogue])]
    for e in eps:
        if e is buf:
            raise ArgumentError(f"cache_write: the epilogue of {buf.name!r} cannot be {buf.name!r} itself")

    inside = _inside(target.body)
    writers_in = [x for x in inside if x[0].buffer is buf]
    if not writers_in:
        raise ArgumentError(f"cache_write: no statement inside loop {lvar.name!r} writes {buf.name!r}")
    nm = _Names(unique=True)

    # 1. re-base every statement inside `loop` that touches `buf` (iters := its loops)
    touched = {id(st): _rebase(st, outer + loops)
               for st, loops, _ in inside if st.buffer is buf or _loads_of(st.value, buf)}
    body = _replace_stmts(target.body, touched)
    new_target = replace(target, body=body)
    p1 = replace(program, body=_replace_for(program.body, target, new_target))
    before = p1
    # the dependences of p1 (program with statements re-based): those of `deps`, renamed, when derivable
    d1 = deps_shortcuts.derived_dependences(deps, program, p1) if check and deps is not None else None
    if check and d1 is None and eps:
        # one analysis serves both checks below (hoisting the initialisation, moving the epilogue): the dependences
        # through the buffer, the epilogue's buffers and what their statements read, which each check's own
        # analysis would compute (a refusal is still decided on the check's own analysis, see _check_order)
        both = {buf, *eps}
        want = frozenset(both | {n.buffer for c in statements(p1) if c.store.buffer in both
                                 for n in walk(c.store.value) if isinstance(n, Load)})
        d1 = poly.dependences(p1, want)

    # 2. hoist the initialising statement into its own nest at the top of the iteration
    inside = _inside(new_target.body)
    inits = [x for x in inside if x[0].buffer is buf and not _loads_of(x[0].value, buf)]
    if hoist_init and len(inits) == 1 and inits[0][1] and len([x for x in inside if x[0].buffer is buf]) > 1:
        st, loops, guards = inits[0]
        nest, _ = _fresh_nest(loops, guards, st)
        rest = _replace_stmts(new_target.body, {id(st): None})
        body = seq(nest, rest) if rest is not None else nest
        t2 = replace(new_target, body=body)
        p2 = replace(p1, body=_replace_for(p1.body, new_target, t2))
        if check:
            _check_order(p1, p2, buf, "hoisting the initialisation of", d1, [st])
            # p2 runs p1's instances, checked to keep every dependence of d1: the same dependences
            d1 = deps_shortcuts.derived_dependences(d1, p2, p2) if d1 is not None else None
        new_target, p1 = t2, p2

    # 3. layout of the scratch buffer
    inside = _inside(new_target.body)
    # a tile strided twice comes from virtual threads (bind "vthread"): only then the layout compacts it
    vthreads = any(isinstance(f, For) and f.thread == "vthread" for f in walk(new_target.body))
    lay = _layout(buf, [x for x in inside if x[0].buffer is buf], outer, outer_guards, program.params, nm, vthreads)
    local = Buffer(fresh_name(program, f"{buf.name}_local"), tuple(const(s, INDEX) for s in lay.size), buf.dtype, scope)

    # 4. the region nest: epilogue stages moved in, and the copy-out when still needed
    qs = [Var(f"{buf.name}_q{d}") for d in range(len(lay.size))]
    elem = [binary("add", lay.off[d], binary("mul", lay.stride[d], binary("add", _expand(q, lay.radix[d]), lay.lo[d])))
            for d, q in enumerate(qs)]
    region_loops = tuple(For(q, const(0, INDEX), const(s, INDEX), Seq(())) for q, s in zip(qs, lay.size))
    guard = _region_guard(lay, qs, nm)
    region_vars = tuple(f.var for f in outer) + tuple(qs)
    moved: list[Store] = []
    removed: dict[int, Stmt | None] = {}
    for e in eps:
        moved.append(_move_epilogue(p1, e, buf, elem, region_vars, target.var.name))
        for c in statements(p1):
            if c.store.buffer is e:
                removed[id(c.store)] = None
    p_rest_body = _replace_stmts(p1.body, removed) if removed else p1.body
    reads_outside = any(
        _loads_of(c.store.value, buf) and not any(f is new_target for f in c.loops) for c in statements(p_rest_body)
    ) if p_rest_body is not None else False
    needs_copy = buf in program.args or reads_outside
    copy = fresh_name(program, f"{buf.name}_copy", {c.store.name for c in statements(program)})  # names stay unique
    region_stmts: list[Store] = []
    if needs_copy:
        region_stmts.append(Store(copy, buf, tuple(elem), Load(buf, tuple(elem)), region_vars, region_vars))
    region_stmts.extend(moved)

    def with_region(stmts: list[Store]) -> For:
        if not stmts:
            return new_target
        inner: Stmt = seq(*stmts)
        if guard is not None:
            inner = If(guard, inner)
        for f in reversed(region_loops):
            inner = replace(f, body=inner)
        return replace(new_target, body=seq(new_target.body, inner))

    assert p_rest_body is not None
    if check and eps:  # the epilogue keeps its own iters here, so the instance check is exact
        t_chk = with_region([m for m in region_stmts if m.name != copy])
        _check_order(p1, replace(p1, body=_replace_for(p_rest_body, new_target, t_chk)), buf, "moving the epilogue of",
                     d1, moved)
    t3 = with_region([m if m.name == copy else _rebase_vars(m, region_vars) for m in region_stmts])
    p3 = replace(p1, body=_replace_for(p_rest_body, new_target, t3))

    # 5. every read of `buf` inside the loop must see a value written in the same iteration
    if check:
        _check_sourced(buf, t3, outer, outer_guards, program.params, nm)

    # 6. redirect reads and writes of `buf` inside the loop to the scratch buffer
    redirected: dict[int, Stmt | None] = {}
    for st, loops, guards in _inside(t3.body):
        if st.buffer is not buf and not _loads_of(st.value, buf):
            continue
        ctx_loops, ctx_guards = outer + loops, tuple(outer_guards) + guards

        def to_local(idx: tuple[Expr, ...], st: Store = st, cl: Any = ctx_loops,
                     cg: Any = ctx_guards) -> tuple[Expr, ...]:
            return _local_index(idx, st, cl, cg, lay, program.params)

        value = _redirect_loads(st.value, buf, lambda ld, f=to_local: Load(local, f(ld.indices)))
        if st.buffer is buf and st.name != copy:
            redirected[id(st)] = replace(st, buffer=local, indices=to_local(st.indices), value=value)
        else:
            redirected[id(st)] = replace(st, value=value)
    t4_body = _replace_stmts(t3.body, redirected)
    t4 = replace(t3, body=Allocate(local, t4_body))
    p4 = replace(p3, body=_replace_for(p3.body, t3, t4))
    still_used = any(c.store.buffer is buf or _loads_of(c.store.value, buf) for c in statements(p4))
    temps = tuple(t for t in p4.temps if t is not buf or still_used)
    del before
    return replace(p4, temps=temps), local


# ----------------------------------------------------------------------------- Schedule method


def _check_registered(ctx: Any) -> None:
    # the checks need the intermediate programs: rerun the primitive with its checks on
    # ctx.deps describe ctx.old exactly when every step since they were computed was checked. They are used when
    # the Schedule has them already, or when the step is checked on its nest alone (the nest's dependences are
    # computed in its original iteration spaces, a small analysis the checks then rename: a tiled GEMM nest's
    # re-based statements cost isl ten times more, 1.7 s against 0.2 s); a whole program not yet analysed is not
    # analysed for this step: each check analyses the few buffers it needs
    ready = ctx.extra.get("checked") and (ctx.extra.get("deps_ready") or ctx.extra.get("nest"))
    cache_write(ctx.old, *ctx.args, **ctx.kwargs, check=True, deps=ctx.deps if ready else None)
    return None


def _register() -> None:
    @primitive("cache_write", check=_check_registered, rebase=True)
    def _cache_write(program: Program, buffer: Any, scope: str, loop: Var, epilogue: Any = (),
                     hoist_init: bool = True) -> tuple[Program, Buffer]:
        """Compute `buffer` into a scratch buffer of `scope` ("local" or "shared") allocated inside `loop`;
        returns the scratch Buffer. `epilogue` stages (elementwise readers of `buffer`) move to the end of
        the iteration and read the scratch buffer (see the module docstring and `cache_write.cache_write`).
        The write-back statement is `<buffer>_copy`; `s.loops("<buffer>_copy")` are its loops, to split,
        unroll or vectorize like any serial loop.

        Precondition: statements inside `loop` write `buffer`; every read of it inside `loop` reads a value
        written in the same iteration (a reduction with its init inside `loop`); the elements one
        iteration writes fit a box of constant size::

            for tx (thread):                          for tx (thread):
                for ii: mm[i] = 0                         allocate mm_local[8] local
                for ii: for k: mm[i] += A*B     ==>       for ii: mm_local[ii] = 0
                                                          for ii: for k: mm_local[ii] += A*B
                                                          for q0: mm[..] = mm_local[q0]      # mm_copy
        """
        return cache_write(program, buffer, scope, loop, epilogue=epilogue, hoist_init=hoist_init, check=False)


_register()
