"""Guard tightening: the guards that split/tile leave inside loops become loop bounds (CPU pipeline).

    for v in [lo, hi):                            if t:
        if c*v + r < b and t: S        ==>            for v in [lo, min(hi, ceil((b - r)/c))): S

`c > 0`; `t` free of `v` and of loads is hoisted. The rewrite is an identity on the set of executed
instances (each removed guard is exactly the new bound), so nothing is checked; it lets LLVM's
vectorizer and the full-tile versioning pass see plain counted loops.
"""

from __future__ import annotations

import dataclasses

from loopir.affine import linear_in
from loopir.dtypes import is_int
from loopir.nodes import (Allocate, Binary, Cast, Compare, Expr, For, If, Load, Program, Seq, Stmt, conjunction,
                          conjuncts)
from loopir.visit import walk


def tighten_guards(program: Program) -> Program:
    """Turn tiling guards into loop bounds, innermost first.

    identity iff for every loop v and guard g: {v in [lo, hi) : g(v)} = [lo, min(hi, bound(g)))."""
    body = tighten(program.body)
    return program if body == program.body else dataclasses.replace(program, body=body)


def _loads(e: Expr) -> list[Load]:
    return [n for n in walk(e) if isinstance(n, Load)]


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
        conds += conjuncts(body.cond)
        body = body.then
    hi, keep, hoist = s.hi, [], []
    for c in conds:
        uses_v = any(n is s.var for n in walk(c))
        if not uses_v and not _loads(c):
            hoist.append(c)
            continue
        if isinstance(c, Compare) and c.op in ("gt", "ge"):  # a > b  <=>  b < a
            c = Compare({"gt": "lt", "ge": "le"}[c.op], c.b, c.a)
        if isinstance(c, Compare) and c.op in ("lt", "le") and is_int(c.a.dtype) and not _loads(c):
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
        inner = If(conjunction(keep), body)
    out: Stmt = For(s.var, s.lo, hi, inner, s.kind, s.thread, s.pragmas)
    if hoist:
        out = If(conjunction(hoist), out)
    return out
