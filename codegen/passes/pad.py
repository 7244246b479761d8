"""Zero-padded reductions (CUDA pipeline): a sum of products over shared tiles runs its last tile unguarded.

A tiled GEMM whose k tile does not divide K guards its update with the k bound; full-tile versioning then
emits the unrolled k_tile x 8 x 8 update twice (guarded and not), which doubles NVRTC's work on the
kernel's largest nest. Triton and CUTLASS instead load the tile's out-of-range elements as zeros and run
the update unguarded. This pass does the same, where it is exact:

    for ko:                                              for ko:
      A_sh[c] = A[..] if clip_A(c)                         A_sh[c] = A[..] if clip_A(c) else 0
      B_sh[c] = B[..] if clip_B(c)             ==>         B_sh[c] = B[..] if clip_B(c) else 0
      barrier                                              barrier
      for ki: if k(ko, ki) < K: acc += A_sh * B_sh         for ki: acc += A_sh * B_sh
      barrier                                              barrier

The update must be `acc = acc + f1 * f2 * ...` into a local (per-thread) buffer, every factor a load (or a
cast of one) of a tile copied in the same iteration; a guard conjunct c is dropped when, for every factor,
a conjunct of its copy's clip at the element read implies c (so where c fails the copy stores 0 there) and
the element lies in the tile. Where c fails the update then adds 0 * 0 = 0: the same value (a -0.0
accumulator would become +0.0, equal in value). The added stores write tile elements no valid instance
reads, in the copy's own instances, before the barrier that already orders the copy and its readers.

First, a tile whose loads reach past its end (its copy was clipped to a matrix smaller than the block) grows to
their reach, its new elements filled with 0 (`_grow_tiles`): a fixed-size GEMM of 7 rows under a block of 8 then
runs the update of every register tile unguarded, as the same GEMM at symbolic sizes (its tile never clipped) did.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from loopir import nodes as N
from loopir.subst import replace_buffers
from loopir.visit import statements, subst_coords, substitute, walk

from .full_tiles import _ge0, _implies, _in_box
from .launch import copy_nest
from .shared import STATIC_SHARED_MAX, const_bytes
from .staging import staged_shape


def pad_reductions(program: N.Program) -> N.Program:
    """Zero-fill the shared tiles a guarded sum of products reads, and drop the guard those zeros make moot.

    identity on the values stored iff at every instance a dropped guard removed, each factor of the update
    reads a tile element its copy filled with 0 (a clip conjunct there implies the guard), so acc += 0."""
    body = _go(program.body, {})
    return program if body is program.body else dataclasses.replace(program, body=body)


Ranges = dict[N.Var, tuple[int, int]]


def _go(s: N.Stmt, ranges: Ranges) -> N.Stmt:
    if isinstance(s, N.Seq):
        kids = tuple(_go(c, ranges) for c in s.body)
        return s if all(a is b for a, b in zip(kids, s.body)) else N.Seq(kids)
    if isinstance(s, N.If):
        t = _go(s.then, ranges)
        e = None if s.orelse is None else _go(s.orelse, ranges)
        return s if t is s.then and e is s.orelse else N.If(s.cond, t, e)
    if isinstance(s, (N.Allocate, N.Kernel)):
        b = _go(s.body, ranges)
        return s if b is s.body else dataclasses.replace(s, body=b)
    if not isinstance(s, N.For):
        return s
    inner = _ranged(s, ranges)
    if s.kind == "serial":
        grown = _grow_tiles(s, inner)
        padded = _pad_loop(grown, inner)
        if padded is not None:
            return padded
        if grown is not s:
            return grown
    b = _go(s.body, inner)
    return s if b is s.body else dataclasses.replace(s, body=b)


def _ranged(f: N.For, ranges: Ranges) -> Ranges:
    if isinstance(f.lo, N.Const) and isinstance(f.hi, N.Const) and f.hi.value > f.lo.value:
        return {**ranges, f.var: (int(f.lo.value), int(f.hi.value) - 1)}
    return ranges


# a copy of the loop body: {tile buffer: (the copy's clip conjuncts, {tile dimension: the copy loop over it})}
_Copies = dict[N.Buffer, tuple[list[N.Expr], list[N.Var]]]


def _pad_loop(f: N.For, ranges: Ranges) -> N.Stmt | None:
    """`f` with its guarded sums of products unguarded and their tiles zero-filled, or None."""
    shape = staged_shape(f)
    if shape is None:
        return None
    chain, items, first = shape
    copies: _Copies = {}
    for c in items[:first]:
        parts = copy_nest(c) if isinstance(c, N.For) else None
        if parts is None or parts[1] is None:
            continue
        loops, guard, st = parts
        order = _copy_dims(loops, st)
        if order is not None and st.buffer in chain:
            copies[st.buffer] = (N.conjuncts(guard), order)  # type: ignore[arg-type]
    if not copies or any(isinstance(n, N.Store) and n.buffer in chain for r in items[first:] for n in walk(r)):
        return None
    filled: set[N.Buffer] = set()
    rest = [_unguard(r, ranges, copies, filled) for r in items[first:]]
    if not filled:
        return None
    head = [_with_fill(c, filled) for c in items[:first]]
    body: N.Stmt = N.Seq((*head, *rest))
    for buf in reversed(chain):
        body = N.Allocate(buf, body)
    return dataclasses.replace(f, body=body)


def _grow_tiles(f: N.For, ranges: Ranges) -> N.For:
    """`f` with each shared tile that its loads after the first barrier index past the tile's constant extent (a
    matrix smaller than the block: a 7-row A tile read at rows 0..7 by a block of 8 rows, the reads of row 7 under
    the guard `row < 7`) grown to the loads' range, the copy's new elements filled with 0, while the loop's tiles stay
    within STATIC_SHARED_MAX bytes (the block's planned tile: a schedule sized its shared memory for it).

    identity on the values every guarded load reads: the copy stores the same elements as before (its new
    instances, c_d >= the old extent, store 0 and read nothing), and a load stays where it was. What it buys: the
    guard that kept a dead register-tile element's update off the tile's end then protects an in-bounds read of a
    zero, so version_full_tiles may drop it (`_drop_dead_guards`) instead of running that warp's updates guarded
    in every iteration (H100, 7 x 5000 x 3000 float32: the fixed-size kernel 10x slower than the symbolic one)."""
    shape = staged_shape(f)
    if shape is None:
        return f
    chain, items, first = shape
    need: dict[N.Buffer, list[int]] = {}
    bad: set[N.Buffer] = set()
    for ld, rng in _tile_loads(N.Seq(tuple(items[first:])), ranges, set(chain)):
        ext = need.setdefault(ld.buffer, [int(getattr(d, "value", 0)) for d in ld.buffer.shape])
        for d, (ix, dim) in enumerate(zip(ld.indices, ld.buffer.shape)):
            b = _interval(ix, rng)
            if b is None or b[0] < 0 or not isinstance(dim, N.Const):
                bad.add(ld.buffer)
            else:
                ext[d] = max(ext[d], b[1] + 1)
    grow: dict[N.Buffer, N.Buffer] = {}
    new_items = list(items)
    smem = sum(const_bytes(b) for b in chain if all(isinstance(d, N.Const) for d in b.shape))
    for k, c in enumerate(items[:first]):
        parts = copy_nest(c) if isinstance(c, N.For) else None
        if parts is None or parts[2].buffer in bad or parts[2].buffer not in need:
            continue
        loops, guard, st = parts
        old = [int(d.value) for d in st.buffer.shape]  # type: ignore[attr-defined]
        ext = need[st.buffer]
        order = _copy_dims(loops, st)
        if order is None or ext == old or st.buffer in grow:
            continue
        buf = dataclasses.replace(st.buffer, shape=tuple(N.const(e) for e in ext))
        more = const_bytes(buf) - const_bytes(st.buffer)
        if smem + more > STATIC_SHARED_MAX:
            continue
        smem += more
        clip = [*(N.conjuncts(guard) if guard is not None else []),
                *(v < o for v, o, e in zip(order, old, ext) if e > o)]
        fill = dataclasses.replace(st, name=f"{st.name}_fill", value=N.const(0, st.buffer.dtype))
        body: N.Stmt = N.If(N.conjunction(clip), st, fill)
        by_var = {v: e for v, e in zip(order, ext)}
        for lp in reversed(loops):
            body = dataclasses.replace(lp, hi=N.const(by_var[lp.var]), body=body)
        grow[st.buffer] = buf
        new_items[k] = body
    if not grow:
        return f
    body = N.Seq(tuple(new_items))
    for b in reversed(chain):
        body = N.Allocate(b, body)
    return dataclasses.replace(f, body=replace_buffers(body, grow))


def _tile_loads(s: N.Stmt, ranges: Ranges, tiles: set[N.Buffer]) -> list[tuple[N.Load, Ranges]]:
    """The loads of `tiles` in `s` (indices in the loops around them), each with the loop ranges there."""
    out: list[tuple[N.Load, Ranges]] = []
    for ctx in statements(s):
        rng = ranges
        for lp in ctx.loops:
            rng = _ranged(lp, rng)
        sub = subst_coords(ctx.store)
        out += [(N.Load(x.buffer, tuple(substitute(i, sub) for i in x.indices)), rng)
                for x in walk(ctx.store.value) if isinstance(x, N.Load) and x.buffer in tiles]
    return out


def _copy_dims(loops: list[N.For], st: N.Store) -> list[N.Var] | None:
    """The copy loop over each dimension of its tile, when the copy stores element (v0, v1, ..) at the
    iteration (v0, v1, ..) and its loops span the tile's shape (every element is some iteration's)."""
    sub = subst_coords(st)
    idx = [substitute(i, sub) for i in st.indices]
    by_var = {x.var: x for x in loops}
    if len(idx) != len(loops) or any(not isinstance(i, N.Var) or i not in by_var for i in idx):
        return None
    if len({id(i) for i in idx}) != len(idx):
        return None
    for i, dim in zip(idx, st.buffer.shape):
        lp = by_var[i]  # type: ignore[index]
        if not (isinstance(dim, N.Const) and isinstance(lp.hi, N.Const) and lp.hi.value == dim.value):
            return None
    return idx  # type: ignore[return-value]


def _unguard(s: N.Stmt, ranges: Ranges, copies: _Copies, filled: set[N.Buffer]) -> N.Stmt:
    if isinstance(s, N.Seq):
        kids = tuple(_unguard(c, ranges, copies, filled) for c in s.body)
        return s if all(a is b for a, b in zip(kids, s.body)) else N.Seq(kids)
    if isinstance(s, N.For):
        b = _unguard(s.body, _ranged(s, ranges), copies, filled)
        return s if b is s.body else dataclasses.replace(s, body=b)
    if isinstance(s, N.Allocate):
        b = _unguard(s.body, ranges, copies, filled)
        return s if b is s.body else N.Allocate(s.buffer, b)
    if not isinstance(s, N.If):
        return s
    conds: list[N.Expr] = []
    inner: N.Stmt = s
    while isinstance(inner, N.If) and inner.orelse is None:
        conds += N.conjuncts(inner.cond)
        inner = inner.then
    factors = _factors(inner, copies) if isinstance(inner, N.Store) else None
    if factors is None:
        t = _unguard(s.then, ranges, copies, filled)
        e = None if s.orelse is None else _unguard(s.orelse, ranges, copies, filled)
        return s if t is s.then and e is s.orelse else N.If(s.cond, t, e)
    acc = N.Load(inner.buffer, tuple(substitute(i, subst_coords(inner)) for i in inner.indices))  # type: ignore[union-attr]
    if not all(_in_tile(ld, ranges) for ld in [*factors, acc]):
        return s
    keep = [c for c in conds if not all(_fills(ld, c, copies[ld.buffer], ranges) for ld in factors)]
    if len(keep) == len(conds):
        return s
    filled.update(ld.buffer for ld in factors)
    return inner if not keep else N.If(N.conjunction(keep), inner)


def _in_tile(ld: N.Load, ranges: Ranges) -> bool:
    """Every index of `ld` lies in its buffer's constant shape for all values of the loops (affine indices, or the
    lane arithmetic of a tensorized nest: `lane // 4`, `lane % 4`)."""
    if _in_box(ld, ranges):
        return True
    for ix, dim in zip(ld.indices, ld.buffer.shape):
        b = _interval(ix, ranges)
        if b is None or not isinstance(dim, N.Const) or b[0] < 0 or b[1] >= int(dim.value):
            return False
    return True


def _interval(e: N.Expr, ranges: Ranges) -> tuple[int, int] | None:
    """[lo, hi] of an integer index over the loops' ranges: a sum of constant multiples of loop variables and of
    floor quotients / remainders by positive constants (terms that cancel, such as a tile origin added and taken
    away again, cancel first); None for anything else."""
    terms = _terms(e)
    if terms is None:
        return None
    lo = hi = terms.pop(1, 0)
    for atom, c in terms.items():
        if not c:
            continue
        if isinstance(atom, N.Var):
            b = ranges.get(atom)
        else:  # floordiv / mod by a positive constant
            n = _interval(atom.a, ranges)
            d = int(atom.b.value)
            b = None if n is None else (n[0] // d, n[1] // d) if atom.op == "floordiv" else \
                (n[0] % d, n[1] % d) if n[0] // d == n[1] // d else (0, d - 1)
        if b is None:
            return None
        lo, hi = lo + min(c * b[0], c * b[1]), hi + max(c * b[0], c * b[1])
    return lo, hi


def _terms(e: N.Expr) -> dict[Any, int] | None:
    """`e` as {atom: coefficient, 1: constant}: atoms are variables and floor quotients / remainders by positive
    constants; None for anything else."""
    if isinstance(e, N.Const) and isinstance(e.value, int) and not isinstance(e.value, bool):
        return {1: e.value}
    if isinstance(e, N.Var):
        return {e: 1}
    if isinstance(e, N.Cast):
        return _terms(e.a)
    if not isinstance(e, N.Binary):
        return None
    if e.op in ("floordiv", "mod"):
        ok = isinstance(e.b, N.Const) and isinstance(e.b.value, int) and e.b.value > 0
        return {e: 1} if ok else None
    a, b = _terms(e.a), _terms(e.b)
    if a is None or b is None:
        return None
    if e.op in ("add", "sub"):
        sign = 1 if e.op == "add" else -1
        out = dict(a)
        for k, v in b.items():
            out[k] = out.get(k, 0) + sign * v
        return out
    if e.op == "mul":
        if set(a) == {1}:
            a, b = b, a
        if set(b) == {1}:
            return {k: v * b[1] for k, v in a.items()}
    return None


def _factors(st: N.Store, copies: _Copies) -> list[N.Load] | None:
    """The tile loads (indices in loop variables) of an update `acc = acc + f1 * f2 * ..` into a local buffer
    whose every factor is a load of a copied tile or a cast of one; None for any other statement."""
    v = st.value
    if st.buffer.scope != "local" or not (isinstance(v, N.Binary) and v.op == "add"):
        return None
    acc, prod = (v.a, v.b) if _same_access(v.a, st) else (v.b, v.a) if _same_access(v.b, st) else (None, None)
    if acc is None:
        return None
    out: list[N.Load] = []

    def collect(e: N.Expr) -> bool:
        if isinstance(e, N.Binary) and e.op == "mul":
            return collect(e.a) and collect(e.b)
        if isinstance(e, N.Cast):
            return collect(e.a)
        if isinstance(e, N.Load) and e.buffer in copies:
            out.append(e)
            return True
        return False

    if not collect(prod):  # type: ignore[arg-type]
        return None
    sub = subst_coords(st)
    return [N.Load(ld.buffer, tuple(substitute(i, sub) for i in ld.indices)) for ld in out]


def _same_access(e: N.Expr, st: N.Store) -> bool:
    return isinstance(e, N.Load) and e.buffer is st.buffer and e.indices == st.indices


def _fills(ld: N.Load, c: N.Expr, copy: tuple[list[N.Expr], list[N.Var]], ranges: Ranges) -> bool:
    """Where `c` fails, the copy of `ld`'s tile stores 0 at the element `ld` reads: some conjunct of the copy's
    clip, at that element, implies `c` (so it fails with c)."""
    t = _ge0(c)
    if t is None:
        return False
    clip, dims = copy
    at = dict(zip(dims, ld.indices))
    for g in clip:
        r = _ge0(substitute(g, at))
        if r is not None and _implies(r, t, ranges):
            return True
    return False


def _with_fill(c: N.Stmt, filled: set[N.Buffer]) -> N.Stmt:
    """The copy nest `c` with `else tile[element] = 0` on its clip, when its tile is one of `filled`."""
    if not isinstance(c, N.For) or c.kind != "parallel":
        if isinstance(c, N.If) and c.orelse is None and isinstance(c.then, N.Store) and c.then.buffer in filled:
            st = c.then
            fill = dataclasses.replace(st, name=f"{st.name}_fill", value=N.const(0, st.buffer.dtype))
            return N.If(c.cond, st, fill)
        return c
    b = _with_fill(c.body, filled)
    return c if b is c.body else dataclasses.replace(c, body=b)


__all__ = ["pad_reductions"]
