"""Index simplification for packed layouts: `x // d` and `x % d` in an access resolved by the loop ranges.

    for y_o in ...: for y_i in range(0, 32):                for y_o in ...: for y_i in range(0, 32):
        C[...] = ... P[y // 32, k, y % 32]   (y = y_o*32 + y_i)   ==>   C[...] = ... P[y_o, k, y_i]

A statement's indices are written in its own iterators; the renderers compute those from the loops
(`coords`), so `(y_o*32 + y_i) // 32` would be evaluated as written and a `vectorize`d y_i would see a
gather. This pass substitutes the coords into every index that holds a `//` or `%` and keeps the result
of `loopir.affine.simplify_divmod` (with the constant ranges of the enclosing loops) where it removed one:
the index then names the loop variables directly, which the renderers evaluate like any other.
"""

from __future__ import annotations

import dataclasses

from loopir.affine import simplify_divmod
from loopir.nodes import Allocate, Binary, Const, Expr, For, If, Kernel, Load, Program, Seq, Stmt, Store, Var
from loopir.visit import Transformer, substitute, walk

Ranges = dict[Var, tuple[int, int]]


def simplify_indices(program: Program) -> Program:
    """Resolve `//` and `%` in indices by the loop ranges (packed layouts).

    identity on values: x // d == q and x % d == r whenever x == d*q + r with 0 <= r < d over the loop ranges."""
    body = _stmt(program.body, {})
    return program if body is program.body else dataclasses.replace(program, body=body)


def _divmods(e: Expr) -> int:
    return sum(1 for n in walk(e) if isinstance(n, Binary) and n.op in ("floordiv", "mod"))


def _index(e: Expr, sub: dict[Var, Expr], ranges: Ranges) -> Expr:
    n = _divmods(e)
    if not n:
        return e
    out = simplify_divmod(substitute(e, sub), ranges)
    return out if _divmods(out) < n else e


class _Loads(Transformer):
    def __init__(self, sub: dict[Var, Expr], ranges: Ranges) -> None:
        self.sub, self.ranges = sub, ranges

    def visit_Load(self, ld: Load) -> Expr:
        idx = tuple(_index(self.visit(i), self.sub, self.ranges) for i in ld.indices)
        return ld if all(a is b for a, b in zip(idx, ld.indices)) else dataclasses.replace(ld, indices=idx)


def _store(s: Store, ranges: Ranges) -> Store:
    if not ranges:
        return s
    sub = dict(zip(s.iters, s.coords))
    idx = tuple(_index(i, sub, ranges) for i in s.indices)
    value = _Loads(sub, ranges).visit(s.value)
    if value is s.value and all(a is b for a, b in zip(idx, s.indices)):
        return s
    return dataclasses.replace(s, indices=idx, value=value)


def _stmt(s: Stmt, ranges: Ranges) -> Stmt:
    if isinstance(s, Store):
        return _store(s, ranges)
    if isinstance(s, For):
        inner = ranges
        if isinstance(s.lo, Const) and isinstance(s.hi, Const) and s.hi.value > s.lo.value:
            inner = {**ranges, s.var: (int(s.lo.value), int(s.hi.value) - 1)}
        body = _stmt(s.body, inner)
        return s if body is s.body else dataclasses.replace(s, body=body)
    if isinstance(s, Seq):
        kids = tuple(_stmt(k, ranges) for k in s.body)
        return s if all(a is b for a, b in zip(kids, s.body)) else Seq(kids)
    if isinstance(s, If):
        then = _stmt(s.then, ranges)
        orelse = None if s.orelse is None else _stmt(s.orelse, ranges)
        return s if then is s.then and orelse is s.orelse else dataclasses.replace(s, then=then, orelse=orelse)
    if isinstance(s, (Allocate, Kernel)):
        body = _stmt(s.body, ranges)  # type: ignore[arg-type]
        return s if body is s.body else dataclasses.replace(s, body=body)
    return s
