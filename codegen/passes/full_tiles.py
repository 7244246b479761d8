"""Full-tile / remainder versioning (CUDA pipeline): unrolled register-tile nests run unguarded when in range.

Sizes the tiles may not divide (or sizes known only at run time) leave a bound guard on every statement
of a tiled kernel; inside the GEMM's unrolled k_tile x 8 x 8 compute nest that is three compares and a
branch per FMA, the main reason for the 12x cliff at 1000^3 (and, with 64-bit indices, the 20x one at
symbolic sizes). `version_full_tiles` hoists them: for an unrolled nest whose guards are affine in its
(constant-bounded) loop variables, the worst case of each guard over the nest is one test, and

    for ki in unroll(0, 16):                     if i0 + 7 < n and j0 + 7 < m and k0 + 15 < p:
      for ii in unroll(0, 8):                       for ki, ii, jj (unroll): S          # no guards
        for jj in unroll(0, 8):             ==>    else:
          if i0 + ii < n and j0 + jj < m:             for ki, ii, jj (unroll): if ...: S  # as before
            if k0 + ki < p: S

The test is per thread (the nest holds no barrier, so threads may take different branches) and costs
one compare per guard per nest instead of one per instance. A nest whose guards use no variable of the
nest (the epilogue's `if tile row < n: for q0, q1: ...` shape) gets the hoisted test without the else
branch. Other nests that hold a barrier, a shared allocation or a store to shared memory are left alone.

A cooperative block-tile copy (`Kernel.cooperative`: `for c0, c1 (parallel): if clip: S[c0, c1] = X[..]`)
is versioned the same way when the worst case of its clip uses no thread variable, so that every thread
of the block takes the same branch (the copy is shared by the block's threads): the full tile is copied
unguarded, which lets the renderer use 16-byte (cp.async) copies, and the block's edge tiles keep the clip.
The software pipeline of the staging pass is kept: the renderer issues whichever branch applies.
"""

from __future__ import annotations

import dataclasses

from loopir import nodes as N
from loopir.affine import linear_in, simplify_affine
from loopir.visit import substitute, walk

__all__ = ["version_full_tiles"]

_WORST = {"lt": "max", "le": "max", "gt": "min", "ge": "min"}


def version_full_tiles(program: N.Program) -> N.Program:
    """Give each guarded unrolled nest in a kernel an unguarded copy, taken when its guards' worst case holds.

    identity iff, for every versioned nest, the version condition implies every removed guard at every
    instance of the nest (each condition is the guard at the extreme of each nest variable's constant range)."""
    body = _go(program.body, None, frozenset())
    return program if body is program.body else dataclasses.replace(program, body=body)


def _go(s: N.Stmt, kern: N.Kernel | None, threads: frozenset[N.Var]) -> N.Stmt:
    if isinstance(s, N.Kernel):
        b = _go(s.body, s, frozenset())
        return s if b is s.body else dataclasses.replace(s, body=b)
    if isinstance(s, N.Seq):
        kids = tuple(_go(c, kern, threads) for c in s.body)
        return s if all(a is b for a, b in zip(kids, s.body)) else N.Seq(kids)
    if isinstance(s, N.If):
        t = _go(s.then, kern, threads)
        e = None if s.orelse is None else _go(s.orelse, kern, threads)
        return s if t is s.then and e is s.orelse else N.If(s.cond, t, e)
    if isinstance(s, N.Allocate):
        b = _go(s.body, kern, threads)
        return s if b is s.body else N.Allocate(s.buffer, b)
    if isinstance(s, N.For):
        if kern is not None and s.kind in ("unroll", "vectorize"):
            v = _version(s)
            if v is not None:
                return v
        if kern is not None and s.kind == "parallel" and s.var in kern.cooperative:
            v = _version_copy(s, threads)
            return s if v is None else v
        if s.kind == "thread" and (s.thread or "").startswith("threadIdx"):
            threads = threads | {s.var}
        b = _go(s.body, kern, threads)
        return s if b is s.body else dataclasses.replace(s, body=b)
    return s


def _version_copy(nest: N.For, threads: frozenset[N.Var]) -> N.Stmt | None:
    """If(worst-case clip, the copy unclipped, the copy) for a cooperative copy nest whose clipped worst case
    is the same for every thread of the block; None otherwise."""
    ranges: dict[N.Var, tuple[int, int]] = {}
    inner: N.Stmt = nest
    while isinstance(inner, N.For) and inner.kind == "parallel":
        if not (isinstance(inner.lo, N.Const) and isinstance(inner.hi, N.Const)) or inner.hi.value <= inner.lo.value:
            return None
        ranges[inner.var] = (int(inner.lo.value), int(inner.hi.value) - 1)
        inner = inner.body
    if not (isinstance(inner, N.If) and inner.orelse is None and isinstance(inner.then, N.Store)):
        return None
    checks: list[N.Expr] = []
    for term in _conjuncts(inner.cond):
        w = _worst(term, ranges)
        if w is None or any(isinstance(x, N.Var) and (x in threads or x in ranges) for x in walk(w)):
            return None
        if w not in checks:
            checks.append(w)
    return N.If(_and(checks), _drop_guards(nest, {id(inner)}), nest)


def _and(checks: list[N.Expr]) -> N.Expr:
    cond = checks[0]
    for c in checks[1:]:
        cond = N.Logical("and", cond, c)
    return cond


def _version(nest: N.For) -> N.Stmt | None:
    """If(worst-case guards, nest without its guards[, nest]) or None when the nest is not versionable."""
    ranges: dict[N.Var, tuple[int, int]] = {}
    guards: list[N.If] = []
    for n in walk(nest):
        if isinstance(n, (N.Barrier, N.Kernel)):
            return None
        if isinstance(n, N.Allocate) and n.buffer.scope == "shared":
            return None
        if isinstance(n, N.Store) and n.buffer.scope == "shared":
            return None
        if isinstance(n, N.For):
            if not (isinstance(n.lo, N.Const) and isinstance(n.hi, N.Const)) or n.hi.value <= n.lo.value:
                return None
            ranges[n.var] = (int(n.lo.value), int(n.hi.value) - 1)
        if isinstance(n, N.If):
            if n.orelse is not None:
                return None
            guards.append(n)
    if not guards:
        return None
    checks: list[N.Expr] = []
    inner = False
    for g in guards:
        for term in _conjuncts(g.cond):
            w = _worst(term, ranges)
            if w is None:
                return None
            inner = inner or w is not term
            if w not in checks:  # structural equality: the tile's guards repeat per statement
                checks.append(w)
    fast = _drop_guards(nest, {id(g) for g in guards})
    return N.If(_and(checks), fast, nest if inner else None)


def _conjuncts(e: N.Expr) -> list[N.Expr]:
    if isinstance(e, N.Logical) and e.op == "and" and e.b is not None:
        return _conjuncts(e.a) + _conjuncts(e.b)
    return [e]


def _worst(term: N.Expr, ranges: dict[N.Var, tuple[int, int]]) -> N.Expr | None:
    """`term` at the extreme of every nest variable it uses (the same object when it uses none), None when
    it is not a compare linear in those variables."""
    used = [v for v in ranges if any(x is v for x in walk(term))]
    if not used:
        return term
    if not isinstance(term, N.Compare) or term.op not in _WORST:
        return None
    mapping: dict[N.Var, N.Expr] = {}
    for v in used:
        la, lb = linear_in(term.a, v), linear_in(term.b, v)
        if la is None or lb is None:
            return None
        c = la[0] - lb[0]
        lo, hi = ranges[v]
        # a - b grows with v when c > 0: its max (for < / <=) is at hi, its min (for > / >=) at lo
        at_hi = (c > 0) == (_WORST[term.op] == "max")
        mapping[v] = N.Const(hi if at_hi else lo, v.dtype)
    return N.Compare(term.op, simplify_affine(substitute(term.a, mapping)),
                     simplify_affine(substitute(term.b, mapping)), term.dtype)


def _drop_guards(s: N.Stmt, ids: set[int]) -> N.Stmt:
    if isinstance(s, N.If) and id(s) in ids:
        return _drop_guards(s.then, ids)
    if isinstance(s, N.Seq):
        return N.Seq(tuple(_drop_guards(c, ids) for c in s.body))
    if isinstance(s, N.If):
        return N.If(s.cond, _drop_guards(s.then, ids), None if s.orelse is None else _drop_guards(s.orelse, ids))
    if isinstance(s, (N.For, N.Allocate)):
        return dataclasses.replace(s, body=_drop_guards(s.body, ids))
    return s
