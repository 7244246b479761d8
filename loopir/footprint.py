"""The region of a buffer that a statement reads inside a loop (`footprint`, for compute_at and
cache_read): per dimension (lo, hi) bounds rebuilt from isl as loopir Exprs."""

from __future__ import annotations

import islpy as isl

from .isl_conv import NonAffine, _exists, _Names, _plus1, aff, cond, pw_to_expr
from .nodes import Buffer, Expr, Load, Program, Var, const
from .poly_model import _Builder
from .visit import walk

__all__ = ["footprint"]


def footprint(program: Program, stmt_name: str, buffer: Buffer | str,
              loop_var: Var) -> list[tuple[Expr, Expr]]:
    """The region of `buffer` that statement `stmt_name` reads during one iteration of every loop
    down to and including `loop_var`: per dimension (lo, hi), hi exclusive, in terms of those
    loop variables and the sizes. ValueError when not a max/min of affine pieces."""
    b = _Builder(program)
    info = next((i for i in b.infos if i.store.name == stmt_name), None)
    if info is None:
        raise ValueError(f"no statement {stmt_name!r} in program {program.name!r}")
    depth = next((k for k, lp in enumerate(info.loops) if lp.var is loop_var), None)
    if depth is None:
        raise ValueError(f"loop {loop_var.name!r} does not surround statement {stmt_name!r}")
    st = info.store
    loads = [n for n in walk(st.value) if isinstance(n, Load)
             and (n.buffer is buffer or (isinstance(buffer, str) and n.buffer.name == buffer))]
    if not loads:
        name = buffer if isinstance(buffer, str) else buffer.name
        raise ValueError(f"statement {stmt_name!r} does not read buffer {name!r}")
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
                f"{_exists(its + inner, ' and '.join(cons + [f'{e} = ({x})' for e, x in zip(es, idx)]))} }}")
        s = isl.Set(text)
        regions.append([(pw_to_expr(s.dim_min(k), vars_by_name, "footprint lower bound"),
                         pw_to_expr(_plus1(s.dim_max(k)), vars_by_name, "footprint upper bound"))
                        for k in range(len(idx))])
    if len(regions) == 1:
        return regions[0]
    # several reads of the same buffer: the union's bounding box, computed in isl for exactness
    return _union_box(b, inames, cons, its, inner, outer_names, vars_by_name, loads, whole)


def _union_box(b: _Builder, names: _Names, cons: list[str], its: list[str], inner: list[str],
               outer_names: list[str], vars_by_name: dict[str, Var], loads: list[Load],
               whole: list[tuple[Expr, Expr]]) -> list[tuple[Expr, Expr]]:
    allp = list(b.params) + outer_names
    sets = None
    for ld in loads:
        try:
            idx = [aff(i, names) for i in ld.indices]
        except NonAffine:
            return whole
        es = [f"e{k}" for k in range(len(idx))]
        s = isl.Set(f"[{', '.join(allp)}] -> {{ [{', '.join(es)}] : "
                    f"{_exists(its + inner, ' and '.join(cons + [f'{e} = ({x})' for e, x in zip(es, idx)]))} }}")
        sets = s if sets is None else sets.union(s)
    assert sets is not None
    return [(pw_to_expr(sets.dim_min(k), vars_by_name, "footprint lower bound"),
             pw_to_expr(_plus1(sets.dim_max(k)), vars_by_name, "footprint upper bound"))
            for k in range(sets.dim(isl.dim_type.set))]
