"""Full-tile versioning (CPU pipeline): a tiled loop gets a copy of its body with constant bounds.

Tiling a loop whose extent the tile does not divide leaves guards that `tighten_guards` turns into
bounds `min(C, lim)`; such a loop has no constant trip count, so it can be neither fully unrolled nor
turned into a fixed number of vector operations. `version_loops` splits the body of the loop where
every such `lim` is invariant:

    for io:                                   for io:
        for ii in unroll(0, min(8, n - 8*io)):    if 8 <= n - 8*io:  for ii in unroll(0, 8): S
            S                          ==>        else:              for ii in unroll(0, min(8, n - 8*io)): S

Only `unroll`/`vectorize` loops with constant bounds before tightening are versioned. It is
semantically the identity (the condition selects between two equal programs), so nothing to check.
"""

from __future__ import annotations

import dataclasses

from loopir.nodes import Allocate, Binary, Compare, Const, Expr, For, If, Logical, Program, Seq, Stmt, Var
from loopir.visit import walk


def version_tiles(program: Program) -> Program:
    """Give loop bodies with min-bounded unroll/vectorize loops a full-tile version of constant bounds.

    identity iff the version condition C <= lim implies min(C, lim) = C for every versioned loop."""
    body = version_loops(program.body)
    return program if body == program.body else dataclasses.replace(program, body=body)


def _min_chain(f: For) -> tuple[int, list[Expr]] | None:
    """(C, [lim...]) when f.hi is min(...min(C, lim1)..., limk) with constant C and lo."""
    lims: list[Expr] = []
    hi = f.hi
    while isinstance(hi, Binary) and hi.op == "min":
        lims.append(hi.b)
        hi = hi.a
    if not lims or not isinstance(hi, Const) or not isinstance(f.lo, Const):
        return None
    return int(hi.value), lims


def _bound_inside(s: Stmt) -> set[Var]:
    return {n.var for n in walk(s) if isinstance(n, For)}


def _versionable(s: Stmt) -> list[tuple[For, int, list[Expr]]]:
    """The min-bounded unroll/vectorize loops in `s` whose limits are invariant in `s`."""
    inner = _bound_inside(s)
    out = []
    for n in walk(s):
        if isinstance(n, For) and n.kind in ("unroll", "vectorize"):
            mc = _min_chain(n)
            if mc is not None and not any(isinstance(x, Var) and x in inner for lim in mc[1] for x in walk(lim)):
                out.append((n, *mc))
    return out


def _with_const_bounds(s: Stmt, loops: dict[int, int]) -> Stmt:
    if isinstance(s, Seq):
        return Seq(tuple(_with_const_bounds(x, loops) for x in s.body))
    if isinstance(s, If):
        return If(s.cond, _with_const_bounds(s.then, loops),
                  None if s.orelse is None else _with_const_bounds(s.orelse, loops))
    if isinstance(s, Allocate):
        return Allocate(s.buffer, _with_const_bounds(s.body, loops))
    if isinstance(s, For):
        hi = Const(loops[id(s)], "int64") if id(s) in loops else s.hi
        return For(s.var, s.lo, hi, _with_const_bounds(s.body, loops), s.kind, s.thread, s.pragmas)
    return s


def version_loops(s: Stmt, budget: int = 8) -> Stmt:
    """Full-tile versions of loop bodies (see the module doc); `budget` bounds the code growth."""
    if isinstance(s, Seq):
        return Seq(tuple(version_loops(x, budget) for x in s.body))
    if isinstance(s, If):
        return If(s.cond, version_loops(s.then, budget), None if s.orelse is None else version_loops(s.orelse, budget))
    if isinstance(s, Allocate):
        return Allocate(s.buffer, version_loops(s.body, budget))
    if not isinstance(s, For):
        return s
    found = _versionable(s.body) if budget > 1 else []
    if not found:
        return For(s.var, s.lo, s.hi, version_loops(s.body, budget), s.kind, s.thread, s.pragmas)
    checks: list[Expr] = []
    for _, c, lims in found:
        for lim in lims:
            ck = Compare("le", Const(c, lim.dtype), lim)
            if ck not in checks:  # structural equality: tiles of one loop share their limit
                checks.append(ck)
    cond: Expr | None = None
    for ck in checks:
        cond = ck if cond is None else Logical("and", cond, ck)
    full = _with_const_bounds(s.body, {id(f): c for f, c, _ in found})
    assert cond is not None
    body = If(cond, version_loops(full, budget // 2), s.body)
    return For(s.var, s.lo, s.hi, body, s.kind, s.thread, s.pragmas)
