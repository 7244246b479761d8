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
  owning rows ty, ty+16, … gets 8 rows, not 113);
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

import math
import re
from dataclasses import dataclass, replace
from typing import Any

import islpy as isl

from loopir.dtypes import INDEX
from loopir.nodes import (
    Allocate,
    Binary,
    Buffer,
    Cast,
    Compare,
    Const,
    Expr,
    For,
    If,
    Load,
    Logical,
    Program,
    Seq,
    Stmt,
    Store,
    Unary,
    Var,
    binary,
    const,
)
from loopir.visit import StmtContext, Transformer, buffers_of, seq, statements, substitute, walk

SCOPES = ("local", "shared")


class NonAffine(ValueError):
    """An expression isl cannot represent (raised with the expression in the message)."""


# ----------------------------------------------------------------------------- loopir <-> isl


class Names:
    """Unique isl names for loopir variables (Vars are identified by object, names may repeat)."""

    def __init__(self) -> None:
        self.of: dict[Var, str] = {}
        self.var: dict[str, Var] = {}

    def __call__(self, v: Var) -> str:
        if v not in self.of:
            base = re.sub(r"\W", "_", v.name) or "v"
            name = f"{base}_{len(self.of)}"
            self.of[v] = name
            self.var[name] = v
        return self.of[v]


def isl_expr(e: Expr, nm: Names) -> str:
    """An affine (quasi-affine) loopir integer expression as isl text."""
    if isinstance(e, Const):
        if isinstance(e.value, bool) or not isinstance(e.value, int):
            raise NonAffine(f"non-integer constant {e}")
        return f"({e.value})"
    if isinstance(e, Var):
        return nm(e)
    if isinstance(e, Cast) and e.dtype in ("int32", "int64"):
        return isl_expr(e.a, nm)
    if isinstance(e, Unary) and e.op == "neg":
        return f"(-{isl_expr(e.a, nm)})"
    if isinstance(e, Binary):
        a, b = e.a, e.b
        if e.op in ("add", "sub"):
            return f"({isl_expr(a, nm)} {'+' if e.op == 'add' else '-'} {isl_expr(b, nm)})"
        if e.op == "mul":
            if isinstance(a, Const):
                return f"({a.value} * {isl_expr(b, nm)})"
            if isinstance(b, Const):
                return f"({b.value} * {isl_expr(a, nm)})"
        if e.op in ("floordiv", "mod") and isinstance(b, Const) and b.value > 0:
            if e.op == "floordiv":
                return f"floor({isl_expr(a, nm)} / {b.value})"
            return f"({isl_expr(a, nm)} mod {b.value})"
        if e.op in ("max", "min"):
            return f"{e.op}({isl_expr(a, nm)}, {isl_expr(b, nm)})"
    raise NonAffine(f"{e} is not an affine integer expression")


def isl_cond(e: Expr, nm: Names) -> str:
    """A loopir condition (comparisons combined with & | ~) as isl constraint text."""
    ops = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "="}
    if isinstance(e, Compare):
        if e.op == "ne":
            a, b = isl_expr(e.a, nm), isl_expr(e.b, nm)
            return f"({a} < {b} or {a} > {b})"
        return f"({isl_expr(e.a, nm)} {ops[e.op]} {isl_expr(e.b, nm)})"
    if isinstance(e, Logical):
        if e.op == "not":
            return f"(not {isl_cond(e.a, nm)})"
        assert e.b is not None
        return f"({isl_cond(e.a, nm)} {e.op} {isl_cond(e.b, nm)})"
    if isinstance(e, Const) and e.dtype == "bool":
        return "(0 = 0)" if e.value else "(1 = 0)"
    raise NonAffine(f"condition {e} is not affine")


def loop_constraints(loops: tuple[For, ...] | list[For], guards: tuple[Expr, ...] | list[Expr], nm: Names) -> list[str]:
    out = []
    for f in loops:
        v = nm(f.var)
        out.append(f"{isl_expr(f.lo, nm)} <= {v} < {isl_expr(f.hi, nm)}")
    out.extend(isl_cond(g, nm) for g in guards)
    return out


def _val(v: isl.Val) -> tuple[int, int]:
    return v.get_num_si(), v.get_den_si()


def aff_to_expr(aff: isl.Aff, in_vars: list[Var], nm: Names) -> Expr:
    """An isl Aff (integer-valued) back to a loopir expression; params map back through `nm`."""
    terms: list[tuple[Fraction_, Expr | None]] = []
    n, d = _val(aff.get_constant_val())
    terms.append(((n, d), None))
    for k in range(aff.dim(isl.dim_type.in_)):
        n, d = _val(aff.get_coefficient_val(isl.dim_type.in_, k))
        if n:
            terms.append(((n, d), in_vars[k]))
    for k in range(aff.dim(isl.dim_type.param)):
        n, d = _val(aff.get_coefficient_val(isl.dim_type.param, k))
        if n:
            name = aff.get_dim_name(isl.dim_type.param, k)
            terms.append(((n, d), nm.var[name]))
    for k in range(aff.dim(isl.dim_type.div)):
        n, d = _val(aff.get_coefficient_val(isl.dim_type.div, k))
        if n:
            div = aff.get_div(k)
            num = aff_to_expr(div.scale_val(div.get_denominator_val()), in_vars, nm)
            terms.append(((n, d), binary("floordiv", num, int(div.get_denominator_val().get_num_si()))))
    den = 1
    for (_n, d), _ in terms:
        den = den * d // math.gcd(den, d)
    total: Expr = const(0, INDEX)
    for (n, d), t in terms:
        c = n * (den // d)
        if t is None:
            total = binary("add", total, c) if c else total
        else:
            total = binary("add", total, t if c == 1 else binary("mul", c, t))
    return binary("floordiv", total, den) if den != 1 else total


Fraction_ = tuple[int, int]


def pw_to_expr(pa: isl.PwAff, in_vars: list[Var], nm: Names, what: str) -> Expr:
    pieces = pa.coalesce().get_pieces()
    if len(pieces) != 1:
        raise NonAffine(f"{what} is piecewise ({pa}); cache_write needs one affine expression")
    return aff_to_expr(pieces[0][1], in_vars, nm)


def constraints_to_cond(bset: isl.BasicSet, in_vars: list[Var], nm: Names) -> Expr | None:
    """The constraints of a basic set as one loopir condition (None when there are none)."""
    conds: list[Expr] = []
    for c in bset.get_constraints():
        e = aff_to_expr(c.get_aff(), in_vars, nm)
        conds.append(e.eq(0) if c.is_equality() else e >= 0)
    if not conds:
        return None
    out = conds[0]
    for c in conds[1:]:
        out = out & c
    return out


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


def _schedule_error(buf: Buffer, sink: tuple[str, dict[str, int]], source: Any, params: dict[str, int], msg: str) -> Exception:
    try:
        from schedules.errors import ScheduleError
    except ImportError:  # pragma: no cover - C1's module not there yet
        return ValueError(msg)
    try:
        return ScheduleError("cache_write", "flow", buf.name, source, sink, params, message=msg)
    except TypeError:
        try:
            return ScheduleError("cache_write", "flow", buf.name, source, sink, params)
        except TypeError:
            return ValueError(msg)


def resolve_buffer(program: Program, x: Any) -> Buffer:
    """A Buffer from a Buffer, a te.Tensor or a buffer / statement name, checked to be in `program`."""
    if hasattr(x, "buffer") and isinstance(getattr(x, "buffer"), Buffer):
        x = x.buffer
    ctxs = statements(program)
    if isinstance(x, str):
        for c in ctxs:
            if c.store.buffer.name == x or c.store.name == x:
                return c.store.buffer
        raise ValueError(f"cache_write: no buffer or statement named {x!r} in program {program.name!r}")
    if not isinstance(x, Buffer):
        raise TypeError(f"cache_write: expected a tensor, buffer or name, got {type(x).__name__} {x!r}")
    if not any(c.store.buffer is x for c in ctxs):
        raise ValueError(f"cache_write: no statement of program {program.name!r} writes buffer {x.name!r}")
    return x


def _loop_var(loop: Any) -> Var:
    if isinstance(loop, For):
        return loop.var
    if isinstance(loop, Var):
        return loop
    v = getattr(loop, "var", None)
    if isinstance(v, Var):
        return v
    raise TypeError(f"cache_write: expected a loop (handle, For or loop Var), got {type(loop).__name__} {loop!r}")


# ----------------------------------------------------------------------------- the primitive


@dataclass
class _Layout:
    off: list[Expr]  # element = off + stride * (local + lo), per dimension, in outer loop vars
    stride: list[int]
    lo: list[Expr]
    size: list[int]
    region: isl.Set  # local indices written in one iteration (params: sizes + outer loop vars)
    context: isl.Set  # outer loops' domain (params only)


def cache_write(
    program: Program,
    buffer: Any,
    scope: str,
    loop: Any,
    *,
    epilogue: Any = (),
    hoist_init: bool = True,
    check: bool = True,
) -> tuple[Program, Buffer]:
    """Compute `buffer` into a scratch buffer of `scope` allocated inside `loop`.

    Precondition: some statements inside `loop` write `buffer`; every read of `buffer`
    inside `loop` reads a value written in the same iteration of `loop` (a reduction whose
    init and update are both inside `loop`); the elements written in one iteration fit a
    box of constant size (after compacting strides). Each `epilogue` stage is written by one
    statement outside `loop` that reads `buffer[<its iters>]` and covers exactly the
    elements of `buffer`. Returns `(new_program, scratch_buffer)`; see the module docstring
    for the nest before/after.
    """
    if scope not in SCOPES:
        raise ValueError(f"cache_write: scope must be one of {', '.join(SCOPES)}, got {scope!r}")
    buf = resolve_buffer(program, buffer)
    if buf.scope != "global":
        raise ValueError(f"cache_write: buffer {buf.name!r} is already a {buf.scope} scratch buffer")
    lvar = _loop_var(loop)
    target = find_for(program.body, lvar)
    if target is None:
        raise ValueError(f"cache_write: loop {lvar.name!r} is not a loop of program {program.name!r}")
    path = _path_to(program.body, target)
    assert path is not None
    outer, outer_guards = path
    eps = [resolve_buffer(program, e) for e in (epilogue if isinstance(epilogue, (list, tuple)) else [epilogue])]
    for e in eps:
        if e is buf:
            raise ValueError(f"cache_write: the epilogue of {buf.name!r} cannot be {buf.name!r} itself")

    inside = _inside(target.body)
    writers_in = [x for x in inside if x[0].buffer is buf]
    if not writers_in:
        raise ValueError(f"cache_write: no statement inside loop {lvar.name!r} writes {buf.name!r}")
    nm = Names()

    # 1. re-base every statement inside `loop` that touches `buf` (iters := its loops)
    touched = {id(st): _rebase(st, outer + loops) for st, loops, _ in inside if st.buffer is buf or _loads_of(st.value, buf)}
    body = _replace_stmts(target.body, touched)
    new_target = replace(target, body=body)
    p1 = replace(program, body=_replace_for(program.body, target, new_target))
    before = p1

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
            _check_order(p1, p2, buf, "hoisting the initialisation of")
        new_target, p1 = t2, p2

    # 3. layout of the scratch buffer
    inside = _inside(new_target.body)
    lay = _layout(buf, [x for x in inside if x[0].buffer is buf], outer, outer_guards, program.params, nm)
    local = Buffer(f"{buf.name}_local", tuple(const(s, INDEX) for s in lay.size), buf.dtype, scope)

    # 4. the region nest: epilogue stages moved in, and the copy-out when still needed
    qs = [Var(f"{buf.name}_q{d}") for d in range(len(lay.size))]
    elem = [binary("add", lay.off[d], binary("mul", lay.stride[d], binary("add", q, lay.lo[d]))) for d, q in enumerate(qs)]
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
    region_stmts: list[Stmt] = []
    if needs_copy:
        region_stmts.append(Store(f"{buf.name}_copy", buf, tuple(elem), Load(buf, tuple(elem)), region_vars, region_vars))
    region_stmts.extend(moved)
    if region_stmts:
        inner: Stmt = seq(*region_stmts)
        if guard is not None:
            inner = If(guard, inner)
        for f in reversed(region_loops):
            inner = replace(f, body=inner)
        t3 = replace(new_target, body=seq(new_target.body, inner))
    else:
        t3 = new_target
    assert p_rest_body is not None
    p3 = replace(p1, body=_replace_for(p_rest_body, new_target, t3))
    if check and eps:
        _check_order(p1, p3, buf, "moving the epilogue of")

    # 5. every read of `buf` inside the loop must see a value written in the same iteration
    if check:
        _check_sourced(buf, t3, outer, outer_guards, program.params, nm)

    # 6. redirect reads and writes of `buf` inside the loop to the scratch buffer
    copy_name = f"{buf.name}_copy"
    redirected: dict[int, Stmt | None] = {}
    for st, loops, guards in _inside(t3.body):
        if st.buffer is not buf and not _loads_of(st.value, buf):
            continue
        ctx_loops, ctx_guards = outer + loops, tuple(outer_guards) + guards

        def to_local(idx: tuple[Expr, ...], st: Store = st, ctx_loops: Any = ctx_loops, ctx_guards: Any = ctx_guards) -> tuple[Expr, ...]:
            return _local_index(idx, st, ctx_loops, ctx_guards, lay, program.params)

        value = _redirect_loads(st.value, buf, lambda ld, f=to_local: Load(local, f(ld.indices)))
        if st.buffer is buf and st.name != copy_name:
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
