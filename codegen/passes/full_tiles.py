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
one compare per guard per nest instead of one per instance.

Before that, the guards that only protect dead register-tile elements are dropped (`_drop_dead_guards`):
a thread whose 8 x 8 tile straddles the matrix edge computes every element of its register tile (local
scratch), from shared tiles whose stale out-of-range entries it can read in bounds, and only the
elements in range are ever stored. The element-only guard of the init and update statements (row < n,
column < m; not k < p, which protects live elements from stale products) is dropped when every other
statement reading the scratch reads an element only under a guard that implies it for that element. A tile
of one element (index [0, 0]) drops its thread's guard (column < m) the same way.
The edge tiles then run the same FMA nest as whole ones (with per-element guards an edge block ran
~8x slower, and at 1000^3, one wave of blocks, the whole kernel waited for it: 1.0 ms vs 0.16 ms at
1024^3), keeping only the k test per k step (and not that where `codegen.passes.pad` zero-filled the tiles).

A register tile's epilogue that runs once per thread, outside every loop of the kernel, and whose loops all
index the register tile (so a remainder copy could not be rolled) keeps its guards and gets no full-tile
copy: a compare per element, once, costs less than NVRTC compiling the unrolled nest twice (a fifth of a
symbolic GEMM's compile time).

A nest whose guards use no variable of the nest (the epilogue's `if tile row < n: for q0, q1: ...` shape)
gets the hoisted test without the else branch. Other nests that hold a barrier, a shared allocation or a
store to shared memory are left alone.

A cooperative block-tile copy (`Kernel.cooperative`: `for c0, c1 (parallel): if clip: S[c0, c1] = X[..]`)
is versioned the same way when the worst case of its clip uses no thread variable, so that every thread
of the block takes the same branch (the copy is shared by the block's threads): the full tile is copied
unguarded, which lets the renderer use 16-byte (cp.async) copies, and the block's edge tiles keep the clip.
The software pipeline of the staging pass is kept: the renderer issues whichever branch applies.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction
from typing import Any

from loopir import nodes as N
from loopir.affine import linear_form, linear_in, simplify_affine
from loopir.gpu import is_fill
from loopir.visit import Transformer, free_vars, subst_coords, subst_loops, substitute, walk
from schedules.primitives.tensorize import is_tensorized


__all__ = ["version_full_tiles"]

_WORST = {"lt": "max", "le": "max", "gt": "min", "ge": "min"}


def version_full_tiles(program: N.Program) -> N.Program:
    """Give each guarded unrolled nest in a kernel an unguarded copy, taken when its guards' worst case holds.

    identity iff, for every versioned nest, the version condition implies every removed guard at every
    instance of the nest (each condition is the guard at the extreme of each nest variable's constant range)."""
    body = _go(program.body, None, frozenset(), set())
    return program if body is program.body else dataclasses.replace(program, body=body)


def _go(s: N.Stmt, kern: N.Kernel | None, threads: frozenset[N.Var], rolled: set[N.Var],
        ranges: dict[N.Var, tuple[int, int]] | None = None, serial: frozenset[N.Var] = frozenset()) -> N.Stmt:
    ranges = {} if ranges is None else ranges
    if isinstance(s, N.Kernel):
        mine: set[N.Var] = set()
        b = _go(s.body, s, frozenset(), mine, {})
        return s if b is s.body else dataclasses.replace(s, body=b, rolled=s.rolled | frozenset(mine))
    if isinstance(s, N.Seq):
        kids = tuple(_go(c, kern, threads, rolled, ranges, serial) for c in s.body)
        return s if all(a is b for a, b in zip(kids, s.body)) else N.Seq(kids)
    if isinstance(s, N.If):
        t = _go(s.then, kern, threads, rolled, ranges, serial)
        e = None if s.orelse is None else _go(s.orelse, kern, threads, rolled, ranges, serial)
        return s if t is s.then and e is s.orelse else N.If(s.cond, t, e)
    if isinstance(s, N.Allocate):
        inner = s.body
        if kern is not None and s.buffer.scope == "local":
            inner = _drop_dead_guards(s.buffer, inner, ranges)
        b = _go(inner, kern, threads, rolled, ranges, serial)
        return s if b is s.body else N.Allocate(s.buffer, b)
    if isinstance(s, N.For):
        if kern is not None and s.kind in ("unroll", "vectorize"):
            v = _version(s, rolled, serial, threads)
            if v is not None:
                return v
        if kern is not None and s.kind == "parallel" and s.var in kern.cooperative:
            v = _version_copy(s, threads)
            return s if v is None else v
        if s.kind == "thread" and (s.thread or "").startswith("threadIdx"):
            threads = threads | {s.var}
        if kern is not None and s.kind != "thread":
            serial = serial | {s.var}
        if isinstance(s.lo, N.Const) and isinstance(s.hi, N.Const) and s.hi.value > s.lo.value:
            ranges = {**ranges, s.var: (int(s.lo.value), int(s.hi.value) - 1)}
        b = _go(s.body, kern, threads, rolled, ranges, serial)
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
    if not (isinstance(inner, N.If) and isinstance(inner.then, N.Store)
            and (inner.orelse is None or is_fill(inner.then, inner.orelse))):
        return None
    checks: list[N.Expr] = []
    for term in N.conjuncts(inner.cond):
        w = _worst(term, ranges)
        if w is None or any(isinstance(x, N.Var) and (x in threads or x in ranges) for x in walk(w)):
            return None
        if w not in checks:
            checks.append(w)
    if any(_never(c) for c in checks):  # no block copies a whole tile (a tile grown past its matrix: passes.pad)
        return None
    return N.If(N.conjunction(checks), _drop_guards(nest, {id(inner)}), nest)


def _version(nest: N.For, rolled: set[N.Var], serial: frozenset[N.Var] = frozenset(),
             threads: frozenset[N.Var] = frozenset()) -> N.Stmt | None:
    """If(worst-case guards, nest without its guards[, nest]) or None when the nest is not versionable.

    A nest of warp-collective tensor-core instructions (a tensorized loop: `mma.sync.aligned`, `ldmatrix.sync.aligned`)
    is not versioned on a test that names a thread variable: lanes of one warp could take different branches, each
    issuing its own collective, which hangs the warp (PolyBench gemm 200 x 220 x 240 on TF32: the last column tile's
    lanes split on `column + 25 < 220`). Both copies render the same instructions there (the tiles are zero-padded).

    The remainder copy is rolled (`_rolled`) when its condition names no serial loop around the nest, i.e. only
    edge blocks or threads take it; one that every block meets in a loop (the last k tile of a GEMM whose tile
    does not divide K) stays unrolled: there, rolled code cost ~10% of the whole GEMM (float16 1000^3, H200)."""
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
        for term in N.conjuncts(g.cond):
            w = _worst(term, ranges)
            if w is None:
                return None
            inner = inner or w is not term
            if w not in checks:  # structural equality: the tile's guards repeat per statement
                checks.append(w)
    if any(isinstance(f, N.For) and is_tensorized(f) for f in walk(nest)) and any(
            isinstance(x, N.Var) and x in threads for c in checks for x in walk(c)):
        return None
    if any(_never(c) for c in checks):  # no instance takes the full tile (a row of 375 chunks over 3 x 128 threads)
        return None
    fast = _drop_guards(nest, {id(g) for g in guards})
    if not inner:
        return N.If(N.conjunction(checks), fast, None)
    edge = not any(isinstance(x, N.Var) and x in serial for c in checks for x in walk(c))
    # a tensorized nest is rendered from the kernel's mma plan, which names its loops: left as it is
    edge = edge and not any(isinstance(f, N.For) and is_tensorized(f) for f in walk(nest))
    if edge and not serial and _register_bound(nest):
        # once per thread, outside every loop of the kernel (a register tile's epilogue): its guards cost a compare
        # per element, once; a full-tile copy would double the nest NVRTC compiles, unrolled (a remainder copy
        # cannot be rolled: every loop indexes the register tile)
        return nest
    return N.If(N.conjunction(checks), fast, _rolled(nest, rolled) if edge else nest)


def _never(c: N.Expr) -> bool:
    """c is a comparison of two integer constants that fails (a worst case no instance meets)."""
    if not (isinstance(c, N.Compare) and isinstance(c.a, N.Const) and isinstance(c.b, N.Const)):
        return False
    a, b = c.a.value, c.b.value
    return not {"lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b, "eq": a == b, "ne": a != b}[c.op]


def _register_vars(nest: N.For) -> set[N.Var]:
    """The loop variables that index a local buffer (a register tile) somewhere in `nest`."""
    keep: set[N.Var] = set()
    for st in walk(nest):
        if isinstance(st, N.Store):
            at = subst_coords(st)  # indices use the statement's iterators: map them to the loops
            for n in (st, *walk(st.value)):
                if isinstance(n, (N.Load, N.Store)) and n.buffer.scope == "local":
                    keep |= {v for ix in n.indices for v in free_vars(substitute(ix, at))}
    return keep


def _register_bound(nest: N.For) -> bool:
    """Every loop of `nest` is an unrolled one that indexes a register tile (nothing to roll or vectorize)."""
    keep = _register_vars(nest)
    return all(f.kind == "unroll" and f.var in keep for f in walk(nest) if isinstance(f, N.For))


def _rolled(nest: N.For, rolled: set[N.Var]) -> N.Stmt:
    """The remainder copy with its unrolled loops rolled back where no register array needs them unrolled.

    Only edge tiles take the remainder, so unrolling it buys little and doubles the code NVRTC compiles (half of
    a cold GEMM build): an unrolled loop stays unrolled only when its variable indexes a local buffer (a register
    tile must see constant indices); every other one becomes serial, and a vectorized one keeps its vector
    access but rolls its scalar fallback. Those loops get fresh variables (the full-tile copy shares the
    originals) named in `rolled`, the kernel's `rolled`: the renderer writes `#pragma unroll 1`, since NVVM would
    otherwise unroll a short constant loop on its own."""
    keep = _register_vars(nest)

    class _Roll(Transformer):
        def visit_For(self, f: N.For) -> N.For:
            if f.kind not in ("unroll", "vectorize") or f.var in keep:
                return self.generic(f)
            v = N.Var(f.var.name, f.var.dtype)
            rolled.add(v)
            return dataclasses.replace(f, var=v, kind="serial" if f.kind == "unroll" else f.kind,
                                       body=self.visit(subst_loops(f.body, {f.var: v})))

    return _Roll().visit(nest)


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


# ----------------------------------------------------------------------------- dead register-tile elements


def _ge0(term: N.Expr) -> dict[Any, int] | None:
    """A compare as the linear form g with `term` <=> g >= 0; None when not affine."""
    if not isinstance(term, N.Compare) or term.op not in _WORST:
        return None
    la, lb = linear_form(term.a), linear_form(term.b)
    if la is None or lb is None:
        return None
    a, b = (la, lb) if term.op in ("gt", "ge") else (lb, la)
    g = {k: a.get(k, 0) - b.get(k, 0) for k in set(a) | set(b)}
    if term.op in ("lt", "gt"):
        g[1] = g.get(1, 0) - 1
    return {k: v for k, v in g.items() if v or k == 1}


def _implies(r: dict[Any, int], t: dict[Any, int], ranges: dict[N.Var, tuple[int, int]]) -> bool:
    """r >= 0 implies t >= 0: t - c*r >= 0 for some c > 0 (its variables other than those of constant range
    cancel; those are bounded by their ranges)."""
    pivot = next((k for k, v in r.items() if k != 1 and v), None)
    if pivot is None or not t.get(pivot):
        return False
    c = Fraction(t[pivot], r[pivot])
    if c <= 0:
        return False
    low = Fraction(0)
    for k in set(r) | set(t):
        d = t.get(k, 0) - c * r.get(k, 0)
        if k == 1:
            low += d
        elif d:
            if k not in ranges:
                return False
            lo, hi = ranges[k]
            low += d * (lo if d > 0 else hi)
    return low >= 0


def _in_box(ld: N.Load, ranges: dict[N.Var, tuple[int, int]]) -> bool:
    """Every index of a scratch access lies in its buffer's constant shape for all values of its variables."""
    for ix, dim in zip(ld.indices, ld.buffer.shape):
        lf = linear_form(ix)
        if lf is None or not isinstance(dim, N.Const):
            return False
        lo = hi = lf.get(1, 0)
        for k, v in lf.items():
            if k == 1:
                continue
            if k not in ranges:
                return False
            a, b = ranges[k]
            lo += v * (a if v > 0 else b)
            hi += v * (b if v > 0 else a)
        if lo < 0 or hi >= int(dim.value):
            return False
    return True


def _stores(s: N.Stmt, guards: tuple[N.Expr, ...], ranges: dict[N.Var, tuple[int, int]],
            out: list[tuple[N.Store, tuple[N.Expr, ...], dict[N.Var, tuple[int, int]]]]) -> bool:
    """Collect (store, enclosing guard terms, variable ranges); False on a shape this analysis does not know."""
    if isinstance(s, N.Store):
        out.append((s, guards, ranges))
        return True
    if isinstance(s, N.Seq):
        return all(_stores(c, guards, ranges, out) for c in s.body)
    if isinstance(s, N.If):
        # a copy's zero fill (codegen.passes.pad) reads nothing: only the copy itself is collected
        return ((s.orelse is None or is_fill(s.then, s.orelse))
                and _stores(s.then, guards + tuple(N.conjuncts(s.cond)), ranges, out))
    if isinstance(s, N.Allocate):
        return _stores(s.body, guards, ranges, out)
    if isinstance(s, N.For):
        if isinstance(s.lo, N.Const) and isinstance(s.hi, N.Const) and s.hi.value > s.lo.value:
            ranges = {**ranges, s.var: (int(s.lo.value), int(s.hi.value) - 1)}
        return _stores(s.body, guards, ranges, out)
    return isinstance(s, N.Barrier)


def _drop_dead_guards(buf: N.Buffer, body: N.Stmt, ranges: dict[N.Var, tuple[int, int]]) -> N.Stmt:
    """`body` (the scope of local scratch `buf`) without the guard terms of its writers that only keep them
    off elements no other statement reads (see the module doc); `body` itself when none is dropped."""
    found: list[tuple[N.Store, tuple[N.Expr, ...], dict[N.Var, tuple[int, int]]]] = []
    if not _stores(body, (), ranges, found):
        return body
    writers = [f for f in found if f[0].buffer is buf]
    readers = [(st, [ld for ld in walk(_at_loops(st)[1]) if isinstance(ld, N.Load) and ld.buffer is buf], g, r)
               for st, g, r in found if st.buffer is not buf]
    readers = [x for x in readers if x[1]]
    if not writers or not readers:
        return body
    bound = {f.var for f in walk(body) if isinstance(f, N.For)}  # loops inside the scratch's scope
    drop: set[tuple[int, N.Expr]] = set()  # (id of the writer, term)
    for st, guards, rng in writers:
        idx, value = _at_loops(st)
        # an element index per loop of the tile (a constant one too: the leading batch index of a batched or
        # split-K GEMM's register tile, 0 in every element)
        own = [v for v in idx if not isinstance(v, N.Const)]
        if not all(isinstance(v, N.Var) and v in rng for v in own) or len(set(own)) != len(own):
            continue
        lds = [x for x in walk(value) if isinstance(x, N.Load)]
        # extra instances must stay in bounds and read only scratch: their own element, shared / local tiles
        if not _in_box(N.Load(buf, idx), rng) or any(
                x.buffer.scope == "global" or (x.buffer is buf and x.indices != idx) or not _in_box(x, rng)
                for x in lds):
            continue
        # loops of one iteration that the index does not name are constants (a 1 x 1 tile's element loops: [0, 0])
        one = {v: N.const(lo) for v, (lo, hi) in rng.items() if lo == hi and v not in own}
        for t in guards:
            tc = substitute(t, one) if one else t
            tv = {x for x in walk(tc) if isinstance(x, N.Var)}
            # no loop of the writer's own nest other than its element index (k stays); a term of the element, or of
            # the thread for a one-element tile (that element is the thread's whole tile, dead past the edge)
            if any(v in bound and v not in idx for v in tv):
                continue
            if own and not any(v in idx for v in tv):
                continue
            if all(_reader_implies(tc, idx, lds_r, g_r, r_r) for _, lds_r, g_r, r_r in readers):
                drop.add((id(st), t))
    if not drop:
        return body
    return _without(body, buf, drop)


def _at_loops(st: N.Store) -> tuple[tuple[N.Expr, ...], N.Expr]:
    """The store's indices and value in terms of the loops around it (not its own iteration names)."""
    sub = subst_coords(st)
    return tuple(substitute(i, sub) for i in st.indices), substitute(st.value, sub)


def _reader_implies(t: N.Expr, idx: tuple[N.Expr, ...], loads: list[N.Load], guards: tuple[N.Expr, ...],
                    rng: dict[N.Var, tuple[int, int]]) -> bool:
    for ld in loads:
        tl = _ge0(substitute(t, {v: i for v, i in zip(idx, ld.indices) if isinstance(v, N.Var)}))
        if tl is None or not any(g is not None and _implies(g, tl, rng) for g in map(_ge0, guards)):
            return False
    return True


def _without(s: N.Stmt, buf: N.Buffer, drop: set[tuple[int, N.Expr]]) -> N.Stmt:
    if isinstance(s, N.If) and s.orelse is None:
        then = _without(s.then, buf, drop)
        below = [x for x in walk(s.then) if isinstance(x, N.Store)]
        keep = [t for t in N.conjuncts(s.cond)
                if not (below and all(x.buffer is buf and (id(x), t) in drop for x in below))]
        if not keep:
            return then
        return N.If(N.conjunction(keep), then)
    if isinstance(s, N.Seq):
        return N.Seq(tuple(_without(c, buf, drop) for c in s.body))
    if isinstance(s, (N.For, N.Allocate)):
        return dataclasses.replace(s, body=_without(s.body, buf, drop))
    return s
