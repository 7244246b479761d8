"""Reassociation: the dependences a schedule may break when a reduction is associative and commutative.

A reduction's update `C[idx] = C[idx] op e` (op add, mul, max, min; e not reading C), or the update
statements of a reducer declared commutative (`te.comm_reducer`, argmax / argmin: one statement per
component, `te_reduce`), computes the same value whatever order its instances run in, as long as every
instance runs once, after the writes before the reduction (its init) and before the reads after it. So a
reorder / split / tile of the reduce axes among themselves is legal though it breaks the dependences of the
update on itself. `relaxed(deps)` is `deps` with exactly those dropped:

* between two instances of one group (the update statements of one reduction) with different iteration
  vectors: dropped (same iteration: kept, e.g. argmax's index update reads the value before it is updated);
* between a group instance and any other statement touching the group's buffers: every such pair is kept,
  as a memory-based dependence (the value-based ones relate an init or a reader only to the nearest update;
  once the updates may be permuted, every update must stay after the init and before the readers).

Floating-point caveat: a float sum (or product) reassociated adds its terms in another order, so its rounding
differs (last bits); max / min and integer sums are exact. `Schedule.explain()` notes each reassociated
float reduction. A reducer declared `commutative=False`, or an update of any other form (a recurrence), is not
a group: its dependences stay and a step breaking them is refused with a witness.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict

import islpy as isl

from .affine import eval_index
from .dtypes import is_float
from .isl_conv import _sanitize
from .nodes import Binary, Load, Program, Store
from .poly import Deps, Witness, find_violation
from .poly_model import _Builder, _parse_union_map, _trim, schedule_map
from .te import ComputeOp, tensor_of
from .te_reduce import TupleReduce
from .visit import walk, walk_stmts

__all__ = ["closed", "groups", "relaxed", "find_violation_reassociated", "reassociated_groups", "float_note",
           "refusal_hint"]

_OPS = ("add", "mul", "max", "min")


def _simple(st: Store) -> bool:
    """`st` is C[idx] = C[idx] op e with op associative and commutative and e not reading C."""
    v = st.value
    if not isinstance(v, Binary) or v.op not in _OPS:
        return False
    me = Load(st.buffer, st.indices)
    e = v.b if v.a == me else v.a if v.b == me else None
    return e is not None and not any(isinstance(n, Load) and n.buffer is st.buffer for n in walk(e))


def _declared(st: Store) -> tuple[str, ...] | None:
    """The statement names of the te reducer `st` updates, when that reducer is declared commutative."""
    t = tensor_of(st.buffer)
    if t is None or not isinstance(t.op, ComputeOp) or t.name != st.name:
        return None
    body = t.op.bodies[t.value_index] if t.value_index < len(t.op.bodies) else None
    if not isinstance(body, TupleReduce) or body.call is None or not getattr(body.call.reducer, "commutative", True):
        return None
    return tuple(o.name for o in (t.op.outputs or (t,)))


def groups(program: Program) -> tuple[frozenset[str], ...]:
    """The update statements of `program` that may be reassociated, one set per reduction."""
    stores = {n.name: n for n in walk_stmts(program) if isinstance(n, Store)}
    out: list[frozenset[str]] = []
    seen: set[str] = set()
    for name, st in stores.items():
        if name in seen:
            continue
        names = _declared(st)
        if names is not None and all(n in stores for n in names):
            bufs = {stores[n].buffer for n in names}
            # every read of the group's buffers by the group is its own element (the accumulators)
            if all(ld.indices == stores[n].indices for n in names for ld in walk(stores[n].value)
                   if isinstance(ld, Load) and ld.buffer in bufs):
                out.append(frozenset(names))
                seen |= set(names)
                continue
        if _simple(st):
            out.append(frozenset((name,)))
            seen.add(name)
    return tuple(out)


_RELAXED: OrderedDict[int, tuple[Deps, Deps | None]] = OrderedDict()


def relaxed(deps: Deps) -> Deps | None:
    """`deps` with the dependences that reassociation may break dropped, and memory-based ones between each
    group and the other statements added (module doc); None when the program has no reassociable group."""
    hit = _RELAXED.get(id(deps))
    if hit is not None and hit[0] is deps:
        return hit[1]
    gs = groups(deps.program)
    out = _relax(deps, gs) if gs else None
    _RELAXED[id(deps)] = (deps, out)
    _trim(_RELAXED, 16)
    return out


def _relax(deps: Deps, gs: tuple[frozenset[str], ...]) -> Deps:
    isl_group = {_sanitize(n): k for k, g in enumerate(gs) for n in g}

    def keep(um: isl.UnionMap) -> isl.UnionMap:
        out = isl.UnionMap.empty(um.get_space())
        ml = um.get_map_list()
        for k in range(ml.n_map()):
            m = ml.get_at(k)
            a, b = m.get_tuple_name(isl.dim_type.in_), m.get_tuple_name(isl.dim_type.out)
            ga, gb = isl_group.get(a), isl_group.get(b)
            if ga is not None and ga == gb:
                if a == b or m.dim(isl.dim_type.in_) != m.dim(isl.dim_type.out):
                    continue
                for d in range(m.dim(isl.dim_type.in_)):  # same iteration only (the components' own order)
                    m = m.equate(isl.dim_type.in_, d, isl.dim_type.out, d)
            out = out.union(isl.UnionMap.from_map(m))
        return out

    flow, anti, output = keep(deps.flow), keep(deps.anti), keep(deps.output)
    program = deps.program
    b = _Builder(program)
    rt, wt, mt = b.access_texts()
    dom = deps.domain
    reads = _parse_union_map(b, rt).intersect_domain(dom)
    writes = _parse_union_map(b, wt).union(_parse_union_map(b, mt)).intersect_domain(dom)
    stores = {n.name: n for n in walk_stmts(program) if isinstance(n, Store)}
    sched = schedule_map(program).intersect_domain(dom)
    before = sched.lex_lt_union_map(sched)  # x -> y: x runs before y in the original program
    for g in gs:
        mine = {_sanitize(n) for n in g}
        gbufs = {_bufname(b, stores[n].buffer) for n in g if n in stores}
        acc_g = _select(reads.union(writes), lambda s, a, m=mine, gb=gbufs: s in m and a in gb)
        for kind_fwd, kind_bwd, other in (("flow", "anti", reads), ("output", "flow", writes)):
            acc_t = _select(other, lambda s, a, m=mine, gb=gbufs: s not in m and a in gb)
            if acc_t.is_empty():
                continue
            pairs = acc_g.apply_range(acc_t.reverse())  # G[x] -> T[y] touching one element
            fwd = pairs.intersect(before)
            bwd = pairs.reverse().intersect(before)
            flow, anti, output = _add(flow, anti, output, kind_fwd, fwd)
            flow, anti, output = _add(flow, anti, output, kind_bwd, bwd)
    return dataclasses.replace(deps, flow=flow, anti=anti, output=output)


def _bufname(b: _Builder, buf: object) -> str:
    return next(k for k, v in b.bufnames.items() if v is buf)


def _select(um: isl.UnionMap, pred: object) -> isl.UnionMap:
    out = isl.UnionMap.empty(um.get_space())
    ml = um.get_map_list()
    for k in range(ml.n_map()):
        m = ml.get_at(k)
        if pred(m.get_tuple_name(isl.dim_type.in_), m.get_tuple_name(isl.dim_type.out)):  # type: ignore[operator]
            out = out.union(isl.UnionMap.from_map(m))
    return out


def _add(flow: isl.UnionMap, anti: isl.UnionMap, output: isl.UnionMap, kind: str,
         rel: isl.UnionMap) -> tuple[isl.UnionMap, isl.UnionMap, isl.UnionMap]:
    if rel.is_empty():
        return flow, anti, output
    if kind == "flow":
        return flow.union(rel), anti, output
    if kind == "anti":
        return flow, anti.union(rel), output
    return flow, anti, output.union(rel)


_CLOSED: OrderedDict[int, tuple[Deps, Deps]] = OrderedDict()  # id(deps) -> (deps, closed deps)


def closed(deps: Deps) -> Deps:
    """`deps` plus every pair of instances of one group touching one element (in the original order), as output
    dependences. After a step reassociated a reduction, the value-based dependences of the original order no
    longer relate every two updates that a later parallel / vectorized / bound loop could run at once (the
    reassociated order puts different neighbours side by side); these pairs do, so the carried-dependence
    checks stay exact. Order checks drop them again (`relaxed`)."""
    for _d, c in _CLOSED.values():
        if c is deps:
            return deps
    hit = _CLOSED.get(id(deps))
    if hit is not None and hit[0] is deps:
        return hit[1]
    gs = groups(deps.program)
    output = deps.output
    if gs:
        program = deps.program
        b = _Builder(program)
        rt, wt, mt = b.access_texts()
        acc = _parse_union_map(b, rt).union(_parse_union_map(b, wt)).union(_parse_union_map(b, mt))
        acc = acc.intersect_domain(deps.domain)
        sched = schedule_map(program).intersect_domain(deps.domain)
        before = sched.lex_lt_union_map(sched)
        stores = {n.name: n for n in walk_stmts(program) if isinstance(n, Store)}
        for g in gs:
            mine = {_sanitize(n) for n in g}
            gbufs = {_bufname(b, stores[n].buffer) for n in g if n in stores}
            acc_g = _select(acc, lambda s, a, m=mine, gb=gbufs: s in m and a in gb)
            output = output.union(acc_g.apply_range(acc_g.reverse()).intersect(before))
    out = dataclasses.replace(deps, output=output)
    _CLOSED[id(deps)] = (deps, out)
    _trim(_CLOSED, 16)
    return out


def find_violation_reassociated(deps: Deps, program: Program) -> Witness | None | bool:
    """Whether `program` is legal once reassociable reductions may be reassociated: None when it is, a
    Witness (from the relaxed dependences) when it is not, False when nothing can be reassociated here (no
    group, or an instance run twice: an accumulation must run each term once)."""
    rel = relaxed(deps)
    if rel is None:
        return False
    notes: list[str] = []
    sched = schedule_map(program, notes=notes).intersect_domain(deps.domain)
    if notes or not sched.is_single_valued():
        return False
    return find_violation(rel, program)


def reassociated_groups(deps: Deps, program: Program) -> list[frozenset[str]]:
    """The groups whose updates `program` runs in another order than `deps.program` does."""
    out = []
    for g in groups(deps.program):
        mine = {_sanitize(n) for n in g}
        inside = dataclasses.replace(deps, flow=_select(deps.flow, lambda a, b, m=mine: a in m and b in m),
                                     anti=_select(deps.anti, lambda a, b, m=mine: a in m and b in m),
                                     output=_select(deps.output, lambda a, b, m=mine: a in m and b in m))
        if find_violation(inside, program) is not None:
            out.append(g)
    return out


def float_note(program: Program, g: frozenset[str], step: str) -> str | None:
    """The floating-point caveat for a reassociated group (None when it is exact: max / min, integers)."""
    stores = [n for n in walk_stmts(program) if isinstance(n, Store) and n.name in g]
    if not stores or not any(is_float(s.buffer.dtype) for s in stores):
        return None
    st = stores[0]
    if isinstance(st.value, Binary) and st.value.op in ("max", "min") and len(stores) == 1:
        return None
    t = tensor_of(st.buffer)
    body = t.op.bodies[t.value_index] if t is not None and isinstance(t.op, ComputeOp) else None
    if isinstance(body, TupleReduce) and body.call is not None and getattr(body.call.reducer, "exact", False):
        return None
    what = {"add": "float sum", "mul": "float product"}.get(st.value.op if isinstance(st.value, Binary) else "",
                                                           "float reduction")
    names = ", ".join(sorted(g))
    return (f"{step} reassociated the {what} {names}: its terms are combined in another order than written, so "
            "the result may differ from the sequential one in the last bits (floating-point arithmetic is not "
            "associative)")


def refusal_hint(deps: Deps, w: Witness) -> str | None:
    """A hint for a refused step whose witness is an accumulation into one element that is not reassociable."""
    if w.source[0] != w.sink[0]:
        return None
    st = deps.stmts.get(w.source[0])
    if st is None or any(st.name in g for g in groups(deps.program)):
        return None
    if not any(isinstance(n, Load) and n.buffer is st.buffer and n.indices == st.indices for n in walk(st.value)):
        return None
    # the conflict is the accumulator itself: both instances write the element of the witness (a recurrence
    # reading a neighbour, A[i-1, j+1], is no accumulation: the skew hint fits it)
    sizes = {v: w.params[v.name] for v in deps.params.values() if v.name in w.params}
    try:
        own = [tuple(eval_index(ix, {**sizes, **{v: it[v.name] for v in st.iters}}) for ix in st.indices)
               for it in (w.source[1], w.sink[1])]
    except (KeyError, ValueError):
        return None
    if w.element is None or own[0] != tuple(w.element) or own[1] != tuple(w.element):
        return None
    return (f"{st.name} accumulates into {st.buffer.name} in the order written, and its update is not an associative "
            f"and commutative reduction (C[idx] = C[idx] op e with op add, mul, max or min and e not reading "
            f"{st.buffer.name}, or a te.comm_reducer declared commutative), so the loops of its reduction must keep "
            "their order; skewing does not change that")
