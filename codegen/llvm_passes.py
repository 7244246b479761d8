"""Loop-IR rewrites and queries the LLVM emitter runs before and during emission: guard
tightening (`tighten`, which reads index expressions through `loopir.affine`), reduction updates,
size variables."""

from __future__ import annotations

from loopir.nodes import (
    Allocate,
    Binary,
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
    Var,
)
from loopir.affine import linear_in
from loopir.visit import walk

from .llvm_types import FLT, INTS


def is_reduction(st: Store) -> Binary | None:
    """The update `C[idx] = C[idx] op x` (op add/max/min) of a reduction, else None."""
    v = st.value
    if not isinstance(v, Binary) or v.op not in ("add", "max", "min") or v.dtype not in FLT:
        return None
    for side in (v.a, v.b):
        if isinstance(side, Load) and side.buffer is st.buffer and side.indices == st.indices:
            return v
    return None


def _loads(e: Expr) -> list[Load]:
    return [n for n in walk(e) if isinstance(n, Load)]


def _is_parallel_top(s: Stmt) -> bool:
    # a loop bound to blockIdx has independent iterations by construction: run it in parallel too
    if not isinstance(s, For):
        return False
    return s.kind == "parallel" or (s.kind == "thread" and (s.thread or "").startswith("block"))



def size_vars(program: Program) -> tuple[Var, ...]:
    """program.params, then any other free variable (not a loop variable, not an iteration variable)."""
    bound: set[Var] = set()
    order: list[Var] = list(program.params)
    seen = set(order)
    for n in walk(program.body):
        if isinstance(n, For):
            bound.add(n.var)
        elif isinstance(n, Store):
            bound.update(n.iters)
    for b in (*program.args, *program.temps):
        for e in b.shape:
            for n in walk(e):
                if isinstance(n, Var) and n not in seen:
                    seen.add(n)
                    order.append(n)
    for n in walk(program.body):
        if isinstance(n, (Load, Store)):
            for e in n.buffer.shape:
                for m in walk(e):
                    if isinstance(m, Var) and m not in seen and m not in bound:
                        seen.add(m)
                        order.append(m)
        if isinstance(n, Var) and n not in seen and n not in bound:
            seen.add(n)
            order.append(n)
    return tuple(order)



def _const_extent(f: For) -> int | None:
    if isinstance(f.lo, Const) and isinstance(f.hi, Const):
        return max(int(f.hi.value) - int(f.lo.value), 0)
    return None



def _conjuncts(c: Expr) -> list[Expr]:
    if isinstance(c, Logical) and c.op == "and":
        return _conjuncts(c.a) + _conjuncts(c.b)  # type: ignore[arg-type]
    return [c]


def tighten(s: Stmt) -> Stmt:
    """Turn the guards that splitting/tiling leave inside loops into loop bounds, innermost first:
    `for v in [lo, hi): if c*v + r < b and t: S` -> `if t: for v in [lo, min(hi, ceil((b - r)/c))): S`
    (c > 0; t free of v and of loads is hoisted). Equivalent; it lets the vectorizer see plain loops."""
    if isinstance(s, Seq):
        return Seq(tuple(tighten(x) for x in s.body))
    if isinstance(s, If):
        return If(s.cond, tighten(s.then), None if s.orelse is None else tighten(s.orelse))
    if isinstance(s, Allocate):
        return Allocate(s.buffer, tighten(s.body))
    if not isinstance(s, For):
        return s
    body = tighten(s.body)
    conds: list[Expr] = []
    while isinstance(body, If) and body.orelse is None:
        conds += _conjuncts(body.cond)
        body = body.then
    hi, keep, hoist = s.hi, [], []
    for c in conds:
        uses_v = any(n is s.var for n in walk(c))
        if not uses_v and not _loads(c):
            hoist.append(c)
            continue
        if isinstance(c, Compare) and c.op in ("gt", "ge"):  # a > b  <=>  b < a
            c = Compare({"gt": "lt", "ge": "le"}[c.op], c.b, c.a)
        if isinstance(c, Compare) and c.op in ("lt", "le") and c.a.dtype in INTS and not _loads(c):
            la, lb = linear_in(c.a, s.var), linear_in(c.b, s.var)
            if la is not None and lb is not None and la[0] - lb[0] > 0:
                k = la[0] - lb[0]
                bound = lb[1] - la[1] + (1 if c.op == "le" else 0)  # k*v < bound
                if c.a.dtype == "int32":
                    bound = Cast("int64", bound)
                lim = bound if k == 1 else (bound + (k - 1)) // k
                hi = Binary("min", hi, lim, "int64")
                continue
        keep.append(c)
    inner = body
    if keep:
        cond = keep[0]
        for c in keep[1:]:
            cond = Logical("and", cond, c)
        inner = If(cond, body)
    out: Stmt = For(s.var, s.lo, hi, inner, s.kind, s.thread)
    if hoist:
        cond = hoist[0]
        for c in hoist[1:]:
            cond = Logical("and", cond, c)
        out = If(cond, out)
    return out


def _top_level(body: Stmt) -> list[Stmt]:
    return list(body.body) if isinstance(body, Seq) else [body]

