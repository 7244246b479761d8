"""Loop-structure primitives: split, tile, reorder, collapse, skew.

Each is a pure function Program -> Program (plus the new loop variables). They rewrite loops,
guards and statement coords, never a statement's indices or value, so the Schedule can check
the result against the original program's dependences.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import islpy as isl

from loopir import poly, reassoc
from loopir.affine import linear_form, simplify
from loopir.errors import ArgumentError, ArgumentTypeError, NotFoundError, NotNestedError
from loopir.isl_conv import pw_bound
from loopir.nodes import (Allocate, Const, Expr, For, If, Program, Seq, Stmt, Store, Var, binary, conjunction, const,
                          logical)
from loopir.visit import free_vars, substitute

from . import CheckContext, find_loop, fresh_name, loop_path, primitive, replace_loop, subst_loops, tails

__all__ = ["split", "tile", "reorder", "collapse", "skew", "order_hint"]


def _check_factor(factor: Any, what: str) -> int:
    if isinstance(factor, bool) or not isinstance(factor, int):
        raise ArgumentTypeError(f"{what}: the factor must be a positive int, got {type(factor).__name__} {factor!r}")
    if factor < 1:
        raise ArgumentError(f"{what}: the factor must be >= 1, got {factor}")
    return factor


def _serial(f: For, what: str) -> None:
    if f.kind != "serial":
        how = f.thread if f.kind == "thread" else f.kind
        raise ArgumentError(f"{what}: loop {f.var.name!r} is already {how}; apply {what} before annotating it")


def _is_const(e: Expr) -> bool:
    return isinstance(e, Const)


# ----------------------------------------------------------------------------- hints


def _distance(ctx: CheckContext, w: poly.Witness, loops: list[Var]) -> dict[Var, int]:
    """Sink minus source, per loop of the OLD program, at the witness ({} when the times cannot be
    computed, e.g. on a nest the analysis over-approximates: a hint must never break the error path)."""
    try:
        ts = poly.time_of(ctx.old, w.source[0], w.source[1], w.params)
        tk = poly.time_of(ctx.old, w.sink[0], w.sink[1], w.params)
    except (isl.Error, poly.NonAffine, ValueError, KeyError):
        return {}
    if ts is None or tk is None:
        return {}
    out: dict[Var, int] = {}
    for v in loops:
        path = loop_path(ctx.old, v)
        if path is None:
            continue
        d = sum(isinstance(s, For) for s in path) - 1
        if 2 * d + 1 < min(len(ts), len(tk)):
            out[v] = tk[2 * d + 1] - ts[2 * d + 1]
    return out


def _outer_first(program: Program, vs: list[Var]) -> list[Var]:
    return sorted(vs, key=lambda v: len(loop_path(program, v) or []))


def skew_hint(ctx: CheckContext, w: poly.Witness) -> str | None:
    """'skew j by i first' when the witness distance is (+, -) on two of the loops involved."""
    acc = reassoc.refusal_hint(ctx.deps, w)
    if acc is not None:  # an ordered accumulation: no skew makes its interchange legal
        return acc
    vs = _outer_first(ctx.old, [a for a in ctx.args if isinstance(a, Var)])
    dist = _distance(ctx, w, vs)
    for a, b in itertools.combinations(vs, 2):
        da, db = dist.get(a, 0), dist.get(b, 0)
        if da > 0 and db < 0:
            k = -(db // da)  # ceil(-db / da)
            return (f"the dependence distance along ({a.name}, {b.name}) is ({da}, {db}); skew {b.name} by {a.name} "
                    f"first — s.skew({a.name}, {b.name}, factor={k}) — so every distance becomes non-negative, "
                    "then interchange or tiling is legal")
    return None


def order_hint(ctx: CheckContext, w: poly.Witness) -> str | None:
    """The legal orders of the reordered loops (tried exhaustively for up to 4 loops), or a skew hint."""
    sk = skew_hint(ctx, w)
    vs = [a for a in ctx.args if isinstance(a, Var)]
    if len(vs) > 4:
        return sk
    legal = []
    for perm in itertools.permutations(vs):
        if list(perm) == vs:
            continue  # the order just refused
        try:
            candidate = reorder(ctx.old, *perm)
            # the nest as it stands is legal (a checked schedule only ever holds legal nests): no need to ask isl
            if (candidate == ctx.old or poly.find_violation(ctx.deps, candidate) is None
                    or reassoc.find_violation_reassociated(ctx.deps, candidate) is None):
                legal.append("(" + ", ".join(v.name for v in perm) + ")")
        except ValueError:
            continue
    text = (f"legal orders of these loops: {', '.join(legal)}" if legal
            else "no order of these loops is legal")
    return text + (f"; {sk}" if sk else "")


# ----------------------------------------------------------------------------- split


def _check_split(ctx: CheckContext) -> poly.Witness | None:
    # formal condition: the new program runs exactly the old instances (poly.instance_mismatch) and no
    # dependence runs backwards (poly.find_violation) — both exact for a constant factor. For a symbolic
    # factor F (split(n, nparts=P) with n symbolic: F = ceil(n / P)) the coordinate i = i_o*F + i_i is not
    # affine, so the same two facts are proved for every F >= 1 instead: (a) 0 <= i_i < F makes
    # (i_o, i_i) -> i_o*F + i_i strictly increasing in lexicographic order, so every pair of instances keeps
    # its order; (b) i_o ranges over [0, P) with P*F >= n and the guard keeps i < n, so the instances are
    # exactly lo..hi-1, each once. Later steps on the nest meet the non-affine coordinate in the analysis,
    # which then over-approximates and refuses what it cannot prove with InexactCheckError.
    # A tail strategy other than "guard" has its own conditions (tails.split_check).
    if tails.check_tail(ctx.kwargs.get("tail", "guard")) != "guard":
        return tails.split_check(ctx)
    if _symbolic_split(ctx):
        return None
    bad = poly.instance_mismatch(ctx.deps, ctx.new)
    if bad is not None:
        raise RuntimeError(f"internal error in primitive split: {bad}")
    return poly.find_violation(ctx.deps, ctx.new)


_check_split.checks_bounds = True  # type: ignore[attr-defined]  # a guarded split adds no access; round_up proves its own
# a guarded split's witness is a plain order violation: legal up to reassociating reductions is legal (schedule.py)
_check_split.order_like = lambda ctx: (  # type: ignore[attr-defined]
    tails.check_tail(ctx.kwargs.get("tail", "guard")) == "guard" and not _symbolic_split(ctx))


def _symbolic_split(ctx: CheckContext) -> bool:
    res = ctx.result
    if not (isinstance(res, tuple) and len(res) == 2 and isinstance(res[1], Var)):
        return False
    return not _is_const(find_loop(ctx.new, res[1]).hi)


def _check_nparts(nparts: Any) -> int:
    if isinstance(nparts, bool) or not isinstance(nparts, int):
        raise ArgumentTypeError(f"split: nparts must be a positive int, got {type(nparts).__name__} {nparts!r}")
    if nparts < 1:
        raise ArgumentError(f"split: nparts must be >= 1, got {nparts}")
    return nparts


@primitive("split", check=_check_split, hint=skew_hint)
def split(program: Program, loop: Var, factor: int | None = None, nparts: int | None = None,
          tail: str = "guard") -> tuple[Program, tuple[Var, Var]]:
    """Split `loop` into an outer loop over chunks of `factor` and an inner loop within one.

    Exactly one of `factor` (the inner extent) and `nparts` (the outer extent, TVM's meaning: the
    inner extent is ceil(extent / nparts), also when the extent is symbolic) is given.

    Precondition: `loop` is a serial loop (or a loop of a shared cache_read copy, whose halves stay
    copy loops); factor, nparts >= 1. A guard keeps the last chunk inside the range unless the
    extent is a known multiple of the factor. A loop whose lower bound depends on other loops
    (after skew) is split at multiples of `factor` (absolute), which makes a later tile a
    parallelogram tile. With `nparts` and a symbolic extent the inner extent is the expression
    (n + nparts - 1) // nparts; the split itself is proved legal for every value of it, and later
    steps on that nest that the (then over-approximate) analysis cannot prove raise
    InexactCheckError::

        for i in range(0, n):            for i_o in range(0, (n + 3) // 4):      # split(i, 4)
            S(i)              ->             for i_i in range(0, 4):
                                                 if i_o*4 + i_i < n:
                                                     S(i_o*4 + i_i)

        for i in range(0, n):            for i_o in range(0, 4):                 # split(i, nparts=4)
            S(i)              ->             for i_i in range(0, (n + 3) // 4):
                                                 if i_o*((n + 3) // 4) + i_i < n:
                                                     S(i_o*((n + 3) // 4) + i_i)

    `tail` is Halide's tail strategy: "guard" (above), "round_up" or "shift_inwards" (see tails.py; with
    `factor` only).
    """
    if (factor is None) == (nparts is None):
        given = "both" if factor is not None else "neither"
        raise ArgumentError(f"split: give exactly one of factor= (the inner extent) and nparts= (the outer extent); "
                            f"got {given}")
    if tails.check_tail(tail) != "guard":
        if nparts is not None:
            raise ArgumentError(f"split: tail={tail!r} takes factor=, not nparts= (the tail strategies round or shift "
                                "the last chunk of a fixed factor)")
        return tails.split_tail(program, loop, _check_factor(factor, "split"), tails.check_tail(tail))
    f = find_loop(program, loop)
    kind = _split_kind(program, f)
    on = fresh_name(program, f"{loop.name}_o")
    vo, vi = Var(on), Var(fresh_name(program, f"{loop.name}_i", {on}))
    if nparts is not None:
        nparts = _check_nparts(nparts)
        ext = simplify(binary("sub", f.hi, f.lo))
        if not (_is_const(f.lo) and _is_const(ext)):
            return _split_nparts_symbolic(program, f, nparts, vo, vi, kind)
        factor = max(1, -(-int(ext.value) // nparts))  # type: ignore[attr-defined]
        outer_hi: int | None = nparts
    else:
        factor = _check_factor(factor, "split")
        outer_hi = None
    fc = const(factor)
    if _is_const(f.lo):
        value = binary("add", f.lo, binary("add", binary("mul", vo, fc), vi))
        ext = binary("sub", f.hi, f.lo)
        olo: Expr = const(0)
        # not folded to the exact quotient where the extent is a multiple (affine.ceil_div): NVRTC then unrolled
        # the symbolic row kernels further, 32 -> 48 registers, half the occupancy (RESULTS_shapes, 2026-11-24)
        ohi = binary("floordiv", binary("add", ext, const(factor - 1)), fc) if outer_hi is None else const(outer_hi)
        # exact when the extent is provably a multiple (4096, or 16*n16 after call-time specialization)
        lin = linear_form(simplify(ext))
        exact = lin is not None and all(isinstance(c, int) and c % factor == 0 for c in lin.values())
        if outer_hi is not None:  # nparts: outer * factor covers the extent exactly iff it equals it
            exact = exact and outer_hi * factor == int(ext.value)  # type: ignore[attr-defined]
        guard = None if exact else value < f.hi
    else:
        value = binary("add", binary("mul", vo, fc), vi)
        olo = binary("floordiv", f.lo, fc)
        ohi = binary("add", binary("floordiv", binary("sub", f.hi, const(1)), fc), const(1))
        guard = logical("and", f.lo <= value, value < f.hi)
    return _finish_split(program, f, vo, vi, olo, ohi, fc, value, guard, kind)


def _split_kind(program: Program, f: For) -> str:
    """The kind both halves get: "serial", or "parallel" for a loop of a cooperative shared copy (cache_read)."""
    if f.kind == "parallel" and _is_copy_loop(program, f):
        if f.thread is not None:
            raise ArgumentError(f"split: copy loop {f.var.name!r} is already bound to {f.thread}; split it before "
                                "binding it")
        return "parallel"
    _serial(f, "split")
    return "serial"


def _is_copy_loop(program: Program, f: For) -> bool:
    """`f` is a loop of a shared cache_read copy inside thread loops: a chain of "parallel" loops around one
    store into a shared buffer (the CUDA target spreads its iterations over the block's threads)."""
    inner: Stmt = f
    while isinstance(inner, For) and inner.kind == "parallel":
        inner = inner.body
    if isinstance(inner, If) and inner.orelse is None:
        inner = inner.then
    if not (isinstance(inner, Store) and inner.buffer.scope == "shared"):
        return False
    path = loop_path(program, f.var) or []
    return any(isinstance(s, For) and s.kind == "thread" and (s.thread or "").startswith("threadIdx") for s in path)


def _finish_split(program: Program, f: For, vo: Var, vi: Var, olo: Expr, ohi: Expr, fc: Expr, value: Expr,
                  guard: Expr | None, kind: str) -> tuple[Program, tuple[Var, Var]]:
    body = subst_loops(f.body, {f.var: value})
    if guard is not None:
        if kind == "parallel":  # a copy nest keeps its guard innermost (around the store), as cache_read makes it
            body = _guard_innermost(body, guard)
        else:
            body = If(guard, body)
    new = For(vo, olo, ohi, For(vi, const(0), fc, body, kind, pragmas=f.pragmas), kind)  # pragmas: to the inner loop
    return replace_loop(program, f.var, new), (vo, vi)


def _guard_innermost(s: Stmt, guard: Expr) -> Stmt:
    if isinstance(s, For):
        return dataclasses.replace(s, body=_guard_innermost(s.body, guard))
    if isinstance(s, If) and s.orelse is None:
        return If(logical("and", guard, s.cond), s.then)
    return If(guard, s)


def _split_nparts_symbolic(program: Program, f: For, nparts: int, vo: Var, vi: Var,
                           kind: str) -> tuple[Program, tuple[Var, Var]]:
    # TVM's split(nparts=P) of a symbolic extent: P chunks of ceil(extent / P), the last ones guarded
    ext = simplify(binary("sub", f.hi, f.lo))
    fc = simplify(binary("floordiv", binary("add", ext, const(nparts - 1)), const(nparts)))
    value = binary("add", f.lo, binary("add", binary("mul", vo, fc), vi))
    guard = value < f.hi
    return _finish_split(program, f, vo, vi, const(0), const(nparts), fc, value, guard, kind)


split.rebases_when = lambda kw: tails.check_tail(kw.get("tail", "guard")) == "round_up"  # type: ignore[attr-defined]


# ----------------------------------------------------------------------------- reorder


def _band(program: Program, loops: tuple[Var, ...], what: str) -> tuple[list[For], list[Expr], Stmt]:
    """The chain of Fors from the outermost to the innermost of `loops`, the guards between
    them, and the body of the innermost; ValueError if they are not one perfect-ish nest."""
    if len(set(map(id, loops))) != len(loops):
        raise ArgumentError(f"{what}: a loop is given twice: {', '.join(v.name for v in loops)}")
    paths = {}
    for v in loops:
        p = loop_path(program, v)
        if p is None:
            raise NotFoundError(f"{what}: loop {v.name!r} is not in the program")
        paths[v] = p
    deepest = max(loops, key=lambda v: len(paths[v]))
    chain = paths[deepest]
    on_chain = {id(s.var) for s in chain if isinstance(s, For)}
    off = [v.name for v in loops if id(v) not in on_chain]
    if off:
        raise NotNestedError(f"{what}: loops {', '.join(off)} and {deepest.name} are not nested in one another "
                             "(loops of different nests cannot be reordered)")
    start = min(chain.index(paths[v][-1]) for v in loops)
    seg = chain[start:]
    fors: list[For] = []
    guards: list[Expr] = []
    for k, s in enumerate(seg):
        if isinstance(s, For):
            fors.append(s)
        elif isinstance(s, If):
            if s.orelse is not None:
                raise NotNestedError(f"{what}: an if/else between loops {fors[-1].var.name} and its inner loops "
                                     "makes the nest imperfect")
            guards.append(s.cond)
        elif isinstance(s, Seq):
            others = [c for c in s.body if c is not seg[k + 1]]
            if not others:
                continue
            raise _Imperfect(seg[0], s)
        elif isinstance(s, Allocate):
            raise NotNestedError(f"{what}: an allocation of {s.buffer.name} lies between the loops")
    return fors, guards, fors[-1].body


class _Imperfect(Exception):
    """Raised by _band: `seq` (inside the band starting at `top`) holds other statements too."""

    def __init__(self, top: Stmt, seq: Seq) -> None:
        self.top, self.seq = top, seq


def _distribute(program: Program, top: Stmt, target: Seq, keep: Stmt) -> Program:
    """Distribute the loops (and guards) from `top` down to the Seq `target` over its children:
    the child `keep` (on the way to the reordered loops) keeps them, every other child gets a copy
    with fresh loop variables, in the original textual order."""
    path: list[Stmt] = []
    s: Stmt = top
    while s is not target:
        path.append(s)
        s = s.body if isinstance(s, For) else s.then  # type: ignore[union-attr]
    parts: list[Stmt] = []
    taken: set[str] = set()
    for child in target.body:
        if child is keep:
            inner = child
            for w in reversed(path):
                inner = dataclasses.replace(w, body=inner) if isinstance(w, For) else If(w.cond, inner)  # type: ignore[union-attr]
            parts.append(inner)
            continue
        mapping: dict[Var, Expr] = {}
        fresh: list[tuple[Stmt, Var | None]] = []
        for w in path:
            if isinstance(w, For):
                nv = Var(fresh_name(program, w.var.name, taken))
                taken.add(nv.name)
                mapping[w.var] = nv
                fresh.append((w, nv))
            else:
                fresh.append((w, None))
        inner = subst_loops(child, mapping)
        for w, nv in reversed(fresh):
            if isinstance(w, For):
                inner = For(nv, substitute(w.lo, mapping), substitute(w.hi, mapping), inner, w.kind, w.thread,  # type: ignore[arg-type]
                            w.pragmas)  # type: ignore[union-attr]
            else:
                inner = If(substitute(w.cond, mapping), inner)  # type: ignore[union-attr]
        parts.append(inner)
    new_top = Seq(tuple(parts))
    if isinstance(top, For):
        return replace_loop(program, top.var, new_top)
    raise ArgumentError("reorder: cannot distribute a nest that starts with a guard")


def _perfect_band(program: Program, loops: tuple[Var, ...], what: str) -> tuple[Program, list[For], list[Expr], Stmt]:
    """_band, distributing the band's loops over statements beside the reordered loops first."""
    for _ in range(64):
        try:
            fors, guards, body = _band(program, loops, what)
            return program, fors, guards, body
        except _Imperfect as e:
            chain = loop_path(program, max(loops, key=lambda v: len(loop_path(program, v) or [])))
            assert chain is not None
            keep = chain[chain.index(e.seq) + 1]
            program = _distribute(program, e.top, e.seq, keep)
    raise NotNestedError(f"{what}: could not make the nest perfect")


@primitive("reorder", hint=order_hint)
def reorder(program: Program, *loops: Var) -> Program:
    """Put `loops` in the given order (outermost first) in the slots they occupy now.

    Precondition: the loops lie on one nest, and the new order keeps every dependence — except
    those of an associative and commutative reduction's update on itself (sum, max, min, product,
    a te.comm_reducer: its reduce axes may be reordered, split and tiled among themselves, see
    loopir.reassoc; a float sum is then added in another order, which `explain()` notes).
    Statements beside them (e.g. a reduction's init between the spatial loops and the reduction
    loop) are first distributed into their own copy of the loops above them (fresh loop names
    like `j2`). Rectangular loops swap headers
    and the guards move innermost. When a bound depends on another reordered loop (triangular,
    skewed, tiled after skew), the new bounds are the exact projections of the iteration
    domain onto the new order, computed with isl::

        for i in range(0, n):                for j in range(0, n):
            for j in range(i, n):    ->          for i in range(0, j + 1):
                S(i, j)                              S(i, j)
    """
    if len(loops) < 2:
        raise ArgumentError(f"reorder takes at least two loops, got {len(loops)}")
    program, fors, guards, body = _perfect_band(program, tuple(loops), "reorder")
    listed = {id(v) for v in loops}
    it = iter(loops)
    order = [next(it) if id(f.var) in listed else f.var for f in fors]
    by_var = {id(f.var): f for f in fors}
    band_ids = set(by_var)
    dependent = any(id(v) in band_ids for f in fors for v in free_vars(f.lo) | free_vars(f.hi))
    if not dependent:
        inner: Stmt = body
        if guards:
            inner = If(conjunction(guards), body)
        for v in reversed(order):
            f = by_var[id(v)]
            inner = For(f.var, f.lo, f.hi, inner, f.kind, f.thread, f.pragmas)  # a loop keeps its pragmas
        return replace_loop(program, fors[0].var, inner)
    new = _reorder_exact(program, fors, guards, body, order)
    return replace_loop(program, fors[0].var, new)


def _reorder_exact(program: Program, fors: list[For], guards: list[Expr], body: Stmt, order: list[Var]) -> Stmt:
    params = {poly._sanitize(p.name): p for p in program.params}
    names = poly._Names(params)
    band = [names.bind(f.var) for f in fors]
    outer_vars = [s.var for s in (loop_path(program, fors[0].var) or [])[:-1] if isinstance(s, For)]
    outer = [names.bind(v) for v in outer_vars]
    cons: list[str] = []
    for f in fors:
        try:
            cons.append(f"({poly.aff(f.lo, names)}) <= {names.env[f.var]} < ({poly.aff(f.hi, names)})")
        except poly.NonAffine as e:
            raise ArgumentError(f"reorder: the bounds of loop {f.var.name} are not affine ({e}); cannot reorder") from e
    kept: list[Expr] = []
    for g in guards:
        try:
            cons.append(poly.cond(g, names))
        except poly.NonAffine:
            kept.append(g)
    pnames = list(params) + outer
    vars_by_name = {**params, **{n: v for n, v in zip(outer, outer_vars)}, **{n: f.var for n, f in zip(band, fors)}}
    new_names = [names.env[v] for v in order]
    body_text = " and ".join(cons)
    bounds: list[tuple[Expr, Expr]] = []
    for k, w in enumerate(new_names):
        rest = new_names[k + 1:]
        s = isl.Set(f"[{', '.join(pnames + new_names[:k])}] -> {{ [{w}] : "
                    f"{poly._exists(rest, body_text)} }}")
        # exact bounds when they are a max / min of affine pieces; otherwise (e.g. a piece for an empty nest
        # at n <= 2) a sound over-approximation, and the scan check below keeps the original constraints
        lo, _ = pw_bound(s.dim_min(0), vars_by_name, "lo", f"lower bound of {order[k].name}")
        hi, _ = pw_bound(s.dim_max(0).add_constant_val(isl.Val.one(s.get_ctx())), vars_by_name, "hi",
                         f"upper bound of {order[k].name}")
        bounds.append((lo, hi))
    # the scanned set equals the domain unless a projection has holes; then keep the old constraints
    scan = " and ".join(f"({poly.aff(lo, names)}) <= {w} < ({poly.aff(hi, names)})"
                        for w, (lo, hi) in zip(new_names, bounds))
    dom = isl.Set(f"[{', '.join(pnames)}] -> {{ [{', '.join(band)}] : {body_text} }}")
    scanned = isl.Set(f"[{', '.join(pnames)}] -> {{ [{', '.join(band)}] : {scan} }}")
    if not scanned.is_equal(dom):
        kept = guards + [logical("and", f.lo <= f.var, f.var < f.hi) for f in fors]
    inner: Stmt = body
    if kept:
        inner = If(conjunction(kept), body)
    by_var = {id(f.var): f for f in fors}
    for v, (lo, hi) in reversed(list(zip(order, bounds))):
        f = by_var[id(v)]
        inner = For(f.var, lo, hi, inner, f.kind, f.thread, f.pragmas)
    return inner


# ----------------------------------------------------------------------------- tile


@primitive("tile", hint=skew_hint)
def tile(program: Program, i: Var, j: Var, ti: int, tj: int) -> tuple[Program, tuple[Var, Var, Var, Var]]:
    """Tile loops i (outer) and j (inner) by ti x tj: split both, then order (i_o, j_o, i_i, j_i).

    Precondition: i encloses j with nothing but guards (and loops) between; ti, tj >= 1; the tiled order
    keeps every dependence but a reassociable reduction's own (as reorder)::

        for i in range(0, n):            for i_o ...: for j_o ...:
            for j in range(0, m):   ->       for i_i in range(0, ti): for j_i in range(0, tj):
                S(i, j)                          if ...: S(i_o*ti + i_i, j_o*tj + j_i)
    """
    _check_factor(ti, "tile")
    _check_factor(tj, "tile")
    pi, pj = loop_path(program, i), loop_path(program, j)
    if pi is None or pj is None:
        raise NotFoundError(f"tile: loop {(i if pi is None else j).name!r} is not in the program")
    if pi[-1] not in pj:
        raise NotNestedError(f"tile: loop {j.name!r} is not inside loop {i.name!r} (tile takes the outer loop first)")
    p1, (io, ii) = split(program, i, ti)
    p2, (jo, ji) = split(p1, j, tj)
    return reorder(p2, io, jo, ii, ji), (io, jo, ii, ji)


# ----------------------------------------------------------------------------- collapse


def _const_extent(f: For) -> int | None:
    ext = binary("sub", f.hi, f.lo)
    return ext.value if isinstance(ext, Const) and isinstance(ext.value, int) else None  # type: ignore[return-value]


def _check_collapse(ctx: CheckContext) -> poly.Witness | None:
    # formal condition: none needed for order — v = (i - lo_i)*E + (j - lo_j) is increasing in (i, j)
    # lexicographically, so every dependence keeps its direction; the condition checked is that the
    # result stays analysable: E constant (coords affine), or no dependence joins two statement instances
    # inside `outer` within one iteration of the loops around it (one carried by an outer loop, e.g. a time
    # loop, keeps its order whatever the collapse does inside)
    outer, inner = ctx.args[0], ctx.args[1]
    fi = find_loop(ctx.old, inner)
    if _const_extent(fi) is not None:
        return poly.find_violation(ctx.deps, ctx.new)
    inside = {poly._sanitize(i.store.name): i.store.name for i in poly.stmt_infos(ctx.old)
              if any(lp.var is outer for lp in i.loops)}
    for kind, dep in poly.dependences_inside(ctx.deps, ctx.old, outer):
        maps = dep.get_map_list()
        for k in range(maps.n_map()):
            m = maps.get_at(k)
            a, b = m.get_tuple_name(isl.dim_type.in_), m.get_tuple_name(isl.dim_type.out)
            if a in inside and b in inside and not m.is_empty():
                ext = binary("sub", fi.hi, fi.lo)
                v = ctx.result.name if isinstance(ctx.result, Var) else f"{outer.name}_{inner.name}_f"
                raise ArgumentError(
                    f"collapse({outer.name}, {inner.name}): the extent of loop {inner.name!r} ({ext}) is not a "
                    f"compile-time constant, so the collapsed loop's coordinates ({outer.name} = {v} // ({ext}), "
                    f"{inner.name} = {v} % ({ext})) are not affine and later steps on this nest could not be "
                    f"checked exactly — and its statements depend on each other ({kind} dependence "
                    f"{inside[a]} -> {inside[b]}). With a symbolic inner extent, collapse is allowed only on "
                    f"nests whose statements have no dependence among them; use split or tile instead, or "
                    f"collapse with an inner loop of constant extent (e.g. the inner loop of a split)")
    return None


@primitive("collapse", check=_check_collapse)
def collapse(program: Program, outer: Var, inner: Var) -> tuple[Program, Var]:
    """Merge `outer` and the loop `inner` directly inside it into one loop (TVM's `fuse`).

    Precondition: inner is the whole body of outer and its bounds do not depend on outer. When the
    extent of inner is not a constant, the new coordinates are not affine, so the (checked) step is
    allowed only when no dependence joins two statements inside the nest (ValueError otherwise)::

        for i in range(0, n):                for i_j_f in range(0, n*m):
            for j in range(0, m):     ->         S(i_j_f // m, i_j_f % m)
                S(i, j)
    """
    fo = find_loop(program, outer)
    fi = find_loop(program, inner)
    if fo.body is not fi:
        raise NotNestedError(f"collapse: loop {inner.name!r} is not the whole body of loop {outer.name!r} "
                             "(collapse merges two directly nested loops)")
    if outer in free_vars(fi.lo) | free_vars(fi.hi):
        raise ArgumentError(f"collapse: the bounds of {inner.name!r} depend on {outer.name!r}; only rectangular "
                            "pairs of loops can be collapsed")
    _serial(fo, "collapse")
    _serial(fi, "collapse")
    ei = binary("sub", fi.hi, fi.lo)
    eo = binary("sub", fo.hi, fo.lo)
    v = Var(fresh_name(program, f"{outer.name}_{inner.name}_f"))
    body = subst_loops(fi.body, {outer: binary("add", fo.lo, binary("floordiv", v, ei)),
                                 inner: binary("add", fi.lo, binary("mod", v, ei))})
    return replace_loop(program, outer, For(v, const(0), binary("mul", eo, ei), body,
                                            pragmas=fi.pragmas or fo.pragmas)), v


# ----------------------------------------------------------------------------- skew


@primitive("skew")
def skew(program: Program, outer: Var, inner: Var, factor: int = 1) -> tuple[Program, Var]:
    """Replace `inner` by inner' = inner + factor*outer (bounds shifted accordingly).

    Precondition: `inner` lies inside `outer`; factor is a non-zero int. Always legal (the
    order of the instances does not change); it makes distances like (1, -1) non-negative so
    that interchange and tiling become legal::

        for i in range(1, n):                for i in range(1, n):
            for j in range(0, m):     ->         for j_s in range(i, m + i):
                S(i, j)                              S(i, j_s - i)
    """
    if isinstance(factor, bool) or not isinstance(factor, int) or factor == 0:
        raise ArgumentError(f"skew: the factor must be a non-zero int, got {factor!r}")
    po, pi = loop_path(program, outer), loop_path(program, inner)
    if po is None or pi is None:
        raise NotFoundError(f"skew: loop {(outer if po is None else inner).name!r} is not in the program")
    if po[-1] not in pi or outer is inner:
        raise NotNestedError(f"skew: loop {inner.name!r} is not inside loop {outer.name!r}")
    fi = find_loop(program, inner)
    _serial(fi, "skew")
    v = Var(fresh_name(program, f"{inner.name}_s"))
    shift = binary("mul", const(factor), outer)
    body = subst_loops(fi.body, {inner: binary("sub", v, shift)})
    new = For(v, binary("add", fi.lo, shift), binary("add", fi.hi, shift), body, pragmas=fi.pragmas)
    return replace_loop(program, inner, new), v
