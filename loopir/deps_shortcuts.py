"""Dependence results got without a new dataflow analysis: the costly part of a checked step is isl's
dataflow analysis of a new program (`poly.dependences`), so where an exact shortcut exists it is taken.

* `derived_dependences`: the dependences of a program that renames the instances of a checked schedule
  (a statement re-based onto its loops: cache_write's intermediate programs), from the schedule's own;
* `memory_dependences` and `concurrent_free`: a sufficient test that no concurrent loop carries a
  dependence, on the memory-based pairs (accesses joined, no dataflow), tried before the exact one.

Each shortcut only ever accepts; a refusal, and its witness, always come from a fresh analysis.
`loopir.poly_model.ANALYSIS_CACHE = False` turns them off (the tests compare both ways).
"""

from __future__ import annotations

from collections import OrderedDict

import islpy as isl

from . import poly_model as _pm
from .isl_conv import _sanitize
from .nodes import Program, Var
from .poly import Deps, _keep_pairs, carried_free, _writes_shared_scratch, concurrent_loops
from .poly_model import _Builder, _parse_union_map, _trim, rename_map, schedule_map

__all__ = ["derived_dependences", "memory_dependences", "concurrent_free"]


def derived_dependences(deps: Deps, current: Program, program: Program) -> Deps | None:
    """The dependences of `program` derived from `deps` without a new dataflow analysis, or None when they
    cannot be derived exactly (then call `dependences(program)`).

    Preconditions (the caller's): `current` runs exactly the instances of `deps.program` in an order that
    runs every dependence of `deps` from source to sink (a checked schedule of it), and `program` is
    `current` with some statements' instances renamed (re-based onto their loops, same order, same
    accesses). Then, for an exact analysis (no over-approximation, every write a must-write), the
    value-based dependences of `program` are those of `deps` renamed: every element's writes keep their
    order (the output dependences chain consecutive writes) and every read stays between the same two
    writes (its flow and anti dependences), so each read has the same last writer and each write the same
    readers before it. Checked here: both analyses exact, the renaming total and injective on the
    instances (no instance run twice). The result may differ from a fresh analysis in representation
    only; a caller that refuses a step on it must recompute the witness from `dependences(program)`."""
    # scratch allocations (deps.private) depend on the nest: those programs are analysed afresh
    if not _pm.ANALYSIS_CACHE or deps.notes or deps.private:
        return None
    rename = rename_map(current, program) if current is not program else None
    notes: list[str] = []
    sched = schedule_map(program, notes=notes)
    b = _Builder(program, notes)
    _, _, may = b.access_texts()  # text only: an inexact access (a may-write) is noted, nothing parsed
    if notes or may != "{  }" or b.alloc_texts()[0]:
        return None
    if rename is None:
        if current is not program:
            return None
        dom, flow, anti, out = deps.domain, deps.flow, deps.anti, deps.output
    else:
        if not rename.domain().is_equal(deps.domain) or not rename.is_injective():
            return None
        dom = deps.domain.apply(rename)
        flow, anti, out = (d.apply_domain(rename).apply_range(rename) for d in (deps.flow, deps.anti, deps.output))
    if not sched.domain().is_equal(dom):
        return None
    return Deps(flow, anti, out, [], dom, program, stmts={i.store.name: i.store for i in b.infos},
                params=dict(b.params), private={})


_MEMORY: OrderedDict[int, tuple[Program, isl.UnionMap]] = OrderedDict()


def memory_dependences(program: Program) -> isl.UnionMap:
    """{ s -> t }: every pair of statement instances of `program` that access one element (scratch buffers per
    allocation instance, as in `dependences`), at least one of them writing it, in both directions: a
    superset of the dependences of `program` (every value-based dependence joins two such accesses), got
    by joining the access relations, with no dataflow analysis. Cached per program object."""
    hit = _MEMORY.get(id(program))
    if hit is not None and hit[0] is program:
        return hit[1]
    b = _Builder(program)
    dom = schedule_map(program).domain()
    rt, wt, mt = b.access_texts()
    reads = _parse_union_map(b, rt).intersect_domain(dom)
    writes = _parse_union_map(b, wt).union(_parse_union_map(b, mt)).intersect_domain(dom)
    mem = writes.apply_range(reads.reverse())
    mem = mem.union(mem.reverse()).union(writes.apply_range(writes.reverse()))
    _MEMORY[id(program)] = (program, mem)
    _trim(_MEMORY, 16)
    return mem


def concurrent_free(program: Program, skip: tuple[Var, ...] = (),
                    reductions: dict[Var, frozenset[str]] | None = None) -> bool:
    """True when no parallel / vectorized / GPU-bound loop of `program` (but those in `skip`) can carry a
    dependence, by a sufficient test: no pair of `memory_dependences` (with the relaxations of
    `concurrent_violation`) joins two iterations of such a loop. False says nothing: then run
    `concurrent_violation` on the program's dependences (exact, with the witness).

    Sound: the dependences of `program` are a subset of its memory dependences, so `concurrent_violation`
    finds no loop when this finds none; it never decides a refusal."""
    if not _pm.ANALYSIS_CACHE:
        return False
    loops = [f for f in concurrent_loops(program) if not any(f.var is v for v in skip)]
    if not loops:
        return True
    mem = memory_dependences(program)
    if mem.is_empty():
        return True
    shared = None
    for f in loops:
        rel = mem
        if f.kind == "thread" and (f.thread or "").startswith("threadIdx"):
            shared = _writes_shared_scratch(program) if shared is None else shared
            if shared:
                rel = _keep_pairs(rel, lambda a, b, sh=shared: a in sh or b in sh)
        red = (reductions or {}).get(f.var)
        if red:
            names = {_sanitize(n) for n in red}
            rel = _keep_pairs(rel, lambda a, b, names=names: a == b and a in names)
        if not carried_free(rel, program, f.var):
            return False
    return True
