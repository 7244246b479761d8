"""The region of a buffer that a statement reads inside a loop (`footprint`, for compute_at and
cache_read): per dimension (lo, hi) bounds rebuilt from isl as loopir Exprs."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import islpy as isl

from .errors import NotFoundError, NotNestedError
from .isl_conv import NonAffine, _exists, _Names, _plus1, _sanitize, aff, aff_to_expr, cond, pw_bound
from .nodes import Buffer, Const, Expr, For, Load, Program, Var, binary, const
from .poly_model import _Builder
from .visit import walk

__all__ = ["footprint", "simplify_in_context"]


def footprint(program: Program, stmt_name: str, buffer: Buffer | str,
              loop_var: Var) -> list[tuple[Expr, Expr]]:
    """The region of `buffer` that statement `stmt_name` reads during one iteration of every loop
    down to and including `loop_var`: per dimension (lo, hi), hi exclusive, in terms of those
    loop variables and the sizes. ValueError when not a max/min of affine pieces.

    The region is the image of the reads intersected with the buffer's bounds on both sides: a read
    outside them is never executed by a correct program (a padded input read under
    `where(i >= 1, A[i - 1], 0)`), so a copy or a recomputation of the region never touches it."""
    b = _Builder(program)
    info = next((i for i in b.infos if i.store.name == stmt_name), None)
    if info is None:
        raise NotFoundError(f"no statement {stmt_name!r} in program {program.name!r}")
    depth = next((k for k, lp in enumerate(info.loops) if lp.var is loop_var), None)
    if depth is None:
        raise NotNestedError(f"loop {loop_var.name!r} does not surround statement {stmt_name!r}")
    st = info.store
    loads = [n for n in walk(st.value) if isinstance(n, Load)
             and (n.buffer is buffer or (isinstance(buffer, str) and n.buffer.name == buffer))]
    if not loads:
        name = buffer if isinstance(buffer, str) else buffer.name
        raise NotFoundError(f"statement {stmt_name!r} does not read buffer {name!r}")
    buf = loads[0].buffer
    # two tables: loop variables (bounds, guards, coords) and iteration variables (indices); a
    # freshly lowered loop variable IS its statement's iteration variable, so one table cannot hold both
    names = _Names(b.params)
    its = [names.bind(v, "it_" + v.name) for v in st.iters]
    inames = _Names(b.params)
    inames.env = dict(zip(st.iters, its))
    outer = info.loops[: depth + 1]
    outer_names = [names.bind(lp.var) for lp in outer]
    vars_by_name = {**b.params, **{n: lp.var for n, lp in zip(outer_names, outer)}}
    inner = [names.bind(lp.var, "l_" + lp.var.name) for lp in info.loops[depth + 1:]]
    cons: list[str] = []
    for lp in info.loops:
        try:
            cons.append(f"({aff(lp.lo, names)}) <= {names.env[lp.var]} < ({aff(lp.hi, names)})")
        except NonAffine:
            pass
    for g in info.guards:
        try:
            cons.append(cond(g, names))
        except NonAffine:
            pass
    for n, c in zip(its, st.coords):
        cons.append(f"{n} = ({aff(c, names)})")
    whole = [(const(0), s) for s in buf.shape]
    inb: list[str] = []  # 0 <= e_k < shape_k (skipped for a non-affine extent: then only the reads bound it)
    for k, ext in enumerate(buf.shape):
        try:
            inb.append(f"0 <= e{k} < ({aff(ext, names)})")
        except NonAffine:
            inb.append(f"0 <= e{k}")
    regions: list[list[tuple[Expr, Expr]]] = []
    for ld in loads:
        try:
            idx = [aff(i, inames) for i in ld.indices]
        except NonAffine:
            regions.append(whole)
            continue
        es = [f"e{k}" for k in range(len(idx))]
        allp = list(b.params) + outer_names
        text = (f"[{', '.join(allp)}] -> {{ [{', '.join(es)}] : "
                f"{_exists(its + inner, ' and '.join(cons + [f'{e} = ({x})' for e, x in zip(es, idx)]))} "
                f"and {' and '.join(inb)} }}")
        s = isl.Set(text)
        regions.append([_bounds(s, k, vars_by_name) for k in range(len(idx))])
    if len(regions) == 1:
        return regions[0]
    # several reads of the same buffer: the union's bounding box, computed in isl for exactness
    return _union_box(b, inames, cons, its, inner, outer_names, vars_by_name, loads, whole, inb)


def _union_box(b: _Builder, names: _Names, cons: list[str], its: list[str], inner: list[str],
               outer_names: list[str], vars_by_name: dict[str, Var], loads: list[Load],
               whole: list[tuple[Expr, Expr]], inb: list[str] | None = None) -> list[tuple[Expr, Expr]]:
    allp = list(b.params) + outer_names
    sets = None
    for ld in loads:
        try:
            idx = [aff(i, names) for i in ld.indices]
        except NonAffine:
            return whole
        es = [f"e{k}" for k in range(len(idx))]
        s = isl.Set(f"[{', '.join(allp)}] -> {{ [{', '.join(es)}] : "
                    f"{_exists(its + inner, ' and '.join(cons + [f'{e} = ({x})' for e, x in zip(es, idx)]))}"
                    f"{''.join(' and ' + c for c in inb or ())} }}")
        sets = s if sets is None else sets.union(s)
    assert sets is not None
    return [_bounds(sets, k, vars_by_name) for k in range(sets.dim(isl.dim_type.set))]


def _bounds(s: isl.Set, k: int, vars_by_name: dict[str, Var]) -> tuple[Expr, Expr]:
    # exact when each bound is a max / min of affine pieces, else a box around the region (min / max of its
    # pieces): a copy or recomputation of a slightly larger, still in-bounds box is correct, an error is not
    lo, _ = pw_bound(s.dim_min(k), vars_by_name, "lo", "footprint lower bound")
    hi, _ = pw_bound(_plus1(s.dim_max(k)), vars_by_name, "hi", "footprint upper bound")
    return lo, hi


def simplify_in_context(e: Expr, loops: Sequence[For], params: Sequence[Var] = ()) -> Expr:
    """`e` (an integer expression of sizes and of the variables of `loops`, with max / min) simplified by
    isl for the values those loops take: `min(8*y_o + 10, h + 2) - max(8*y_o, 0)` becomes `10` when
    y_o < h / 8 always holds. `e` itself when it is not affine or the result is no simpler."""
    if isinstance(e, (Const, Var)):
        return e
    names = _Names({_sanitize(p.name): p for p in params})
    try:
        ctx = []
        for lp in loops:
            v = names.bind(lp.var)
            ctx.append(f"({aff(lp.lo, names)}) <= {v} < ({aff(lp.hi, names)})")
        text = aff(e, names)
        ps = list(names.params) + [names.env[lp.var] for lp in loops]
        pre = f"[{', '.join(dict.fromkeys(ps))}] -> "
        pa = isl.PwAff(f"{pre}{{ [({text})] }}")
        dom = isl.Set(f"{pre}{{ : {' and '.join(ctx) or '1 = 1'} }}")
        if dom.is_empty():
            return e
        by_name = {**names.params, **{names.env[lp.var]: lp.var for lp in loops}}
        # the pieces as they are (each an affine function of the original expression) and coalesced (pieces
        # merged, but possibly split into one constant per point): the smaller Expr that isl confirms wins
        best = e
        merged = pa.intersect_params(dom).coalesce()
        for out in (_fewest_pieces(pa, dom, by_name), _fewest_pieces(merged, dom, by_name)):
            if out is not None and _size(out) < _size(best):
                best = out
        return best
    except (NonAffine, ValueError, isl.Error):
        return e


def _size(e: Expr) -> int:
    return sum(1 for _ in walk(e))


def _fewest_pieces(pa: isl.PwAff, dom: isl.Set, by_name: dict[str, Var]) -> Expr | None:
    """One of `pa`'s affine pieces, or the max / min of the fewest of them, equal to `pa` on `dom`."""
    target = pa.intersect_params(dom)
    affs: list[isl.Aff] = []
    for _, a in pa.get_pieces():
        if not any(a.plain_is_equal(b) for b in affs):
            affs.append(a)
    for a in affs:
        if isl.PwAff.from_aff(a).intersect_params(dom).is_equal(target):
            return aff_to_expr(a, by_name)
    if len(affs) > 4:
        return None
    for op in ("max", "min"):
        for r in range(2, len(affs) + 1):
            for sub in itertools.combinations(affs, r):
                acc = isl.PwAff.from_aff(sub[0])
                for a in sub[1:]:
                    acc = acc.max(isl.PwAff.from_aff(a)) if op == "max" else acc.min(isl.PwAff.from_aff(a))
                if acc.intersect_params(dom).is_equal(target):
                    out = aff_to_expr(sub[0], by_name)
                    for a in sub[1:]:
                        out = binary(op, out, aff_to_expr(a, by_name))
                    return out
    return None
