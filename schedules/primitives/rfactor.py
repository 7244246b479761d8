"""rfactor: a reduction split into per-chunk partials (a new temporary, computed by a nest of its own before the
reduction's nest) and a combine of those partials in the reduction's place. TVM's `rfactor` is the model; here
the factored loop is an outer part of the reduction (`split` the reduction loop first), so each partial is a
whole chunk, and the partial nest can be launched over (rows x chunks) blocks — the split-row strategy of very
wide rows (`schedules.rows`).

    for i in 0..m:                                   for i2 in 0..m:                          # the partials
        mx[i] = -inf          # mx_init                  for k_o2 in 0..ceil(n/F):
        for k_o in 0..ceil(n/F):                             mx_rf[i2, k_o2] = -inf           # mx_rf_init
            for k_i in 0..F:                 ==>             for k_i2 in 0..F:
                if k_o*F + k_i < n:                              if k_o2*F + k_i2 < n:
                    mx[i] = max(mx[i], x[i, k])                      mx_rf[i2, k_o2] = max(mx_rf[i2, k_o2], x[..])
                                                     for i in 0..m:                           # the combine
                                                         mx[i] = -inf        # mx_init
                                                         for k_o in 0..ceil(n/F):
                                                             mx[i] = max(mx[i], mx_rf[i, k_o])   # mx
    (s.rfactor("mx", k_o))

Legality: the update is `C[idx] = C[idx] op e` with op associative and commutative (add, mul, max, min) and e
not reading C — a float sum is reassociated, as every parallel reduction is. Otherwise a `ScheduleError` with
the witness: the dependence between two chunks that the partials would break. Moving the partials before the
reduction's whole nest keeps every value they read: no other statement of that nest may write what the update
reads (else a `ScheduleError` naming the write and the read it would lose).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from loopir import poly
from loopir.dtypes import INDEX, np_dtype
from loopir.errors import ArgumentError, ArgumentTypeError, NotFoundError
from loopir.nodes import Buffer, Const, For, If, Load, Program, Seq, Stmt, Store, Var, binary, const
from loopir.visit import free_vars, seq, substitute, walk

from schedules.errors import ScheduleError

from . import CheckContext, find_path, fresh_name, primitive, replace_loop
from .cache import reduction_parts

__all__ = ["rfactor", "identity"]


def identity(op: str, dtype: str) -> Const:
    """The neutral element of the reduction `op` in `dtype` (what a partial starts from)."""
    if op == "add":
        return const(0.0 if np_dtype(dtype).kind == "f" else 0, dtype)
    if op == "mul":
        return const(1.0 if np_dtype(dtype).kind == "f" else 1, dtype)
    if np_dtype(dtype).kind == "f":
        return const(float("-inf") if op == "max" else float("inf"), dtype)
    info = np.iinfo(np_dtype(dtype))
    return const(int(info.min if op == "max" else info.max), dtype)


def _locate(program: Program, stage: str, loop: Var) -> tuple[Store, int, list[Stmt], int]:
    """The update statement `stage`, the index of its top-level nest, the chain of For / If from that nest
    down to it, and the position of `loop` in that chain."""
    found = find_path(program.body, lambda s: isinstance(s, Store) and s.name == stage)
    if found is None:
        raise NotFoundError(f"rfactor: no statement named {stage!r} in program {program.name!r}")
    upd, path = found
    assert isinstance(upd, Store)
    top = 0
    chain: list[Stmt] = []
    for k, (anc, idx) in enumerate(path):
        if k == 0 and isinstance(anc, Seq) and anc is program.body:
            top = idx
            continue
        if isinstance(anc, If) and idx != 0:
            raise ArgumentError(f"rfactor: statement {stage!r} sits in the else branch of a guard; only guards "
                                "that enclose it in their then branch can be copied to the partials")
        if not isinstance(anc, (For, If, Seq)):
            raise ArgumentError(f"rfactor: statement {stage!r} is inside a {type(anc).__name__}; rfactor works on "
                                "a reduction not yet cached or bound")
        if not isinstance(anc, Seq):
            chain.append(anc)
    pos = next((k for k, n in enumerate(chain) if isinstance(n, For) and n.var is loop), None)
    if pos is None:
        raise ArgumentError(f"rfactor: loop {loop.name!r} does not enclose statement {stage!r}")
    return upd, top, chain, pos


def _refuse_non_reduction(program: Program, deps: poly.Deps, upd: Store, loop: Var) -> None:
    w = poly.carried_by(deps, program, loop)
    if w is not None:
        raise ScheduleError.from_witness(
            "rfactor", w, program, {loop: "<-- rfactor"},
            f"{upd.name} is not C[idx] = C[idx] op e with op in add, mul, max, min and e not reading "
            f"{upd.buffer.name}: its chunks cannot be computed apart and combined", f"rfactor({upd.name}, {loop.name})")
    raise ArgumentError(f"rfactor: statement {upd.name!r} is not a reduction C[idx] = C[idx] op e "
                        "(op in add, mul, max, min)")


def _check_rfactor(ctx: CheckContext) -> poly.Witness | None:
    """The partials move before the reduction's whole nest: a dependence from another statement of that nest
    into the update (it writes what the update reads) would run backwards."""
    name = getattr(ctx.args[0], "name", ctx.args[0])
    _, top, _, _ = _locate(ctx.old, name, ctx.args[1])
    kids = ctx.old.body.body if isinstance(ctx.old.body, Seq) else (ctx.old.body,)
    upd = next(s for s in walk(kids[top]) if isinstance(s, Store) and s.name == name)
    # the init and the combine stay where they were: only writes of what the partials read matter
    reads = {n.buffer for n in walk(upd.value) if isinstance(n, Load) and n.buffer is not upd.buffer}
    nest = {poly._sanitize(s.name) for s in walk(kids[top]) if isinstance(s, Store) and s.name != name
            and s.buffer in reads}
    me = poly._sanitize(name)
    for kind, dep in ctx.deps.by_kind():
        ml = dep.get_map_list()
        for k in range(ml.n_map()):
            m = ml.get_at(k)
            if m.get_tuple_name(poly.isl.dim_type.in_) in nest and m.get_tuple_name(poly.isl.dim_type.out) == me:
                w = poly._witness(poly.isl.UnionMap.from_map(m), kind, ctx.deps)
                if w is not None:
                    return w
    return None


@primitive("rfactor", check=_check_rfactor, takes_deps=True, rebase=True)
def rfactor(program: Program, deps: poly.Deps, stage: Any, loop: Var, factor_axis: int = -1) -> tuple[Program, Buffer]:
    """Split the reduction `stage` at its loop `loop` into partials `<buffer>_rf[spatial..., loop]` computed by
    a new nest placed before the reduction's nest, and a combine over `loop` in the reduction's place. Returns
    the partial buffer; its statements are named after it (`<buffer>_rf_init`, `<buffer>_rf`: `s.loops(buf.name)`).
    `factor_axis` (TVM's): where the chunk index goes among the partial buffer's indices, and its loop among the
    partial nest's spatial loops (-1: last, as below; 0: first, `C_rf[ko, i]` under `for ko2: for i2:`, so that
    the chunks of a matmul are the batch of a batched matmul: split-K).

    Precondition: `stage` is `C[idx] = C[idx] op e` (op add, mul, max, min; e not reading C; ScheduleError with
    a witness otherwise); the loops around it from its nest's top down to `loop` are its spatial loops
    (they index C) with bounds given by the sizes, `loop` and the loops inside it are reduction loops, and
    nothing but the update is inside `loop`.

        for i:                           for i2, ko2:
            C[i] = 0                         C_rf[i2, ko2] = 0
            for ko:               ==>        for ki2: C_rf[i2, ko2] += f(i2, ko2*F + ki2)
                for ki:                  for i:
                    C[i] += f(i, k)          C[i] = 0
                                             for ko: C[i] += C_rf[i, ko]"""
    if not isinstance(loop, Var):
        raise ArgumentTypeError(f"rfactor: expected a loop handle, got {type(loop).__name__} {loop!r}")
    if isinstance(factor_axis, bool) or not isinstance(factor_axis, int):
        raise ArgumentTypeError(f"rfactor: factor_axis must be an int, got {type(factor_axis).__name__} "
                                f"{factor_axis!r}")
    name = getattr(stage, "name", stage)
    if not isinstance(name, str):
        raise ArgumentTypeError(f"rfactor: expected a stage (tensor or statement name), got {type(stage).__name__}")
    upd, top, chain, pos = _locate(program, name, loop)
    parts = reduction_parts(upd)
    if parts is None:
        _refuse_non_reduction(program, deps, upd, loop)
    assert parts is not None
    op, e = parts
    sub = dict(zip(upd.iters, upd.coords))
    idx = tuple(substitute(ix, sub) for ix in upd.indices)
    idx_vars = {n for ix in idx for n in walk(ix) if isinstance(n, Var)}
    loops = [n for n in chain if isinstance(n, For)]
    outer = [n for n in chain[:pos] if isinstance(n, For)]
    for f in outer:
        if f.var not in idx_vars:
            raise ArgumentError(f"rfactor: loop {f.var.name!r} outside {loop.name!r} does not index "
                                f"{upd.buffer.name!r}; the loops outside the factored loop must be spatial")
    for f in loops[len(outer):]:
        if f.var in idx_vars:
            raise ArgumentError(f"rfactor: loop {f.var.name!r} indexes {upd.buffer.name!r}, so it is not a "
                                "reduction loop; factor a loop of the reduction")
    params = set(program.params)
    for f in outer + [chain[pos]]:
        assert isinstance(f, For)
        if not (free_vars(f.lo) | free_vars(f.hi)) <= params:
            raise ArgumentError(f"rfactor: the bounds of loop {f.var.name!r} depend on other loops; the partial "
                                "buffer needs extents given by the sizes")
    if not isinstance(chain[-1], (For, If)) or any(isinstance(n, Seq) for n in walk(chain[pos].body)):
        raise ArgumentError(f"rfactor: loop {loop.name!r} holds other statements besides {name!r}")
    taken: set[str] = set()
    fresh: dict[Var, Var] = {}
    for f in loops:
        v = Var(fresh_name(program, f.var.name, taken), INDEX)
        taken.add(v.name)
        fresh[f.var] = v
    factored = chain[pos]
    assert isinstance(factored, For)
    if not -len(outer) - 1 <= factor_axis <= len(outer):
        raise ArgumentError(f"rfactor: factor_axis {factor_axis} is out of range for a partial of "
                            f"{len(outer) + 1} dimensions ({', '.join(f.var.name for f in outer + [factored])})")
    at = factor_axis % (len(outer) + 1)
    spatial = outer[:at] + [factored] + outer[at:]  # the partial's indices and its nest's loops, in order
    keys = [(f.var, f.lo) for f in spatial]
    shape = tuple(binary("sub", f.hi, f.lo) for f in spatial)
    pname = fresh_name(program, f"{upd.buffer.name}_rf", taken)
    taken.add(pname)
    part = Buffer(pname, shape, upd.buffer.dtype, "global")
    pidx_new = tuple(binary("sub", fresh[v], lo) for v, lo in keys)
    pidx_old = tuple(binary("sub", v, lo) for v, lo in keys)
    ren = dict(fresh)
    its_all = tuple(fresh[f.var] for f in spatial + loops[len(outer) + 1:])
    its_out = tuple(fresh[v] for v, _ in keys)
    value = substitute(e, {it: substitute(c, ren) for it, c in sub.items()})
    body: Stmt = Store(pname, part, pidx_new,
                       binary(op, Load(part, pidx_new), value), its_all, its_all)
    for n in reversed(chain[pos + 1:]):
        body = _wrap(n, body, ren)
    init = Store(fresh_name(program, f"{pname}_init", taken), part, pidx_new,
                 identity(op, part.dtype), its_out, its_out)
    body = seq(init, body)
    if at == len(outer):
        body = _wrap(factored, body, ren)
        for n in reversed(chain[:pos]):
            body = _wrap(n, body, ren)
    else:  # the guards around the factored loop read only outer loops and sizes: kept just inside the spatial loops
        for n in reversed([g for g in chain[:pos] if isinstance(g, If)]):
            body = _wrap(n, body, ren)
        for f in reversed(spatial):
            body = _wrap(f, body, ren)
    its_c = tuple(f.var for f in outer + [factored])
    comb = Store(name, upd.buffer, idx, binary(op, Load(upd.buffer, idx), Load(part, pidx_old)), its_c, its_c)
    new = replace_loop(program, loop, dataclasses.replace(factored, body=comb))
    kids = new.body.body if isinstance(new.body, Seq) else (new.body,)
    new = dataclasses.replace(new, body=Seq(kids[:top] + (body,) + kids[top:]), temps=new.temps + (part,))
    return new, part


def _wrap(n: Stmt, body: Stmt, ren: dict[Var, Var]) -> Stmt:
    if isinstance(n, For):
        return For(ren[n.var], substitute(n.lo, ren), substitute(n.hi, ren), body)
    assert isinstance(n, If)
    return If(substitute(n.cond, ren), body)
