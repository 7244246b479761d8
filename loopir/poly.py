"""Exact dependence analysis of loop IR with isl (islpy), and the legality tests built on it.

The model (statement domains, accesses, schedules over the ORIGINAL instance spaces `S[iters]`)
is built in `loopir.poly_model`; Expr <-> isl conversions live in `loopir.isl_conv`, footprints
in `loopir.footprint`. Every public name of those modules is importable from here too.

`dependences(program)` runs isl's dataflow analysis once per program (cached);
`find_violation(deps, new_program)` and `carried_by(deps, program, loop_var)` check a
schedule against them and return a concrete `Witness` (two statement instances and the
sizes at which they conflict) or None; `footprint` gives the region a statement reads
inside a loop (for compute_at).

Scratch buffers (introduced by an `Allocate`) are private to each iteration of the loops
around their Allocate: their accesses are expanded by the allocation instance (see
poly_model), so dependences on them never join two iterations of those loops. That is only
sound while a schedule keeps the same statement instances together in one allocation:
`find_violation` and `carried_by` first check it (`check_private`) and raise
`PrivateScopeError` (a ValueError) when a step would move a loop across an allocation.

Cost (issue 14): a program's schedule is parsed once (`poly_model.schedule_map`, pieces kept per statement
text), the dataflow analysis walks a schedule tree, carried-dependence tests run in time space and a
loop found free is not tested again while the text of its nest is unchanged; `loopir.deps_shortcuts`
derives or pre-tests dependences where that is exact. `poly_model.ANALYSIS_CACHE = False` turns all of
it off (tests/test_analysis_cache.py checks that both ways decide alike, with the same witnesses).
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import islpy as isl

from .affine import _const_int, _is_int_expr, eval_index, simplify_affine
from .errors import LoopirError, NotFoundError
from .footprint import _union_box, footprint
from .isl_conv import (
    _CMP,
    _ISL_WORDS,
    _NEG,
    NonAffine,
    _exists,
    _Names,
    _plus1,
    _sanitize,
    _scale,
    aff,
    aff_to_expr,
    cond,
    pw_to_expr,
)
from .nodes import Buffer, Expr, Load, Program, Store, Var
from .poly_model import (
    AllocSite,
    StmtInfo,
    _Builder,
    _parse_union_map,
    _schedule_pieces,
    _trim,
    _program_params,
    isl_domain,
    schedule_map,
    schedule_tree,
    stmt_infos,
)
from . import poly_model as _pm
from .visit import walk
from .nodes import For

__all__ = [
    "Deps",
    "Witness",
    "StmtInfo",
    "AllocSite",
    "NonAffine",
    "PrivateScopeError",
    "dependences",
    "schedule_map",
    "find_violation",
    "carried_by",
    "concurrent_violation",
    "dependences_inside",
    "concurrent_loops",
    "CONCURRENT_KINDS",
    "check_private",
    "footprint",
    "stmt_infos",
    "eval_index",
    "instance_mismatch",
    "time_of",
    "isl_domain",
    "aff",
    "cond",
    "aff_to_expr",
    "pw_to_expr",
    "simplify_affine",
]

# names kept importable from loopir.poly for code written before the split
_REEXPORTED = (_CMP, _ISL_WORDS, _NEG, _const_int, _exists, _is_int_expr, _Names, _plus1, _scale, _parse_union_map,
               _program_params, _union_box)


# ----------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Witness:
    """Two statement instances that a schedule runs in the wrong order.

    `source` runs first in the original program, `sink` depends on it; each is
    `(statement_name, {iteration_variable_name: int})`. `params` are the sizes at which it
    happens (`{size_name: int}`), `element` the index of `buffer` both touch (None when an
    index could not be evaluated)."""

    kind: str
    buffer: str
    source: tuple[str, dict[str, int]]
    sink: tuple[str, dict[str, int]]
    params: dict[str, int]
    element: tuple[int, ...] | None = None
    notes: tuple[str, ...] = ()  # over-approximations of the analysed schedule (the witness may be spurious)

    def instance_str(self, which: str) -> str:
        name, it = self.source if which == "source" else self.sink
        return f"{name}[{', '.join(f'{k}={v}' for k, v in it.items())}]"


@dataclass
class Deps:
    """Dependences of a program over its original instance spaces (isl UnionMaps)."""

    flow: isl.UnionMap
    anti: isl.UnionMap
    output: isl.UnionMap
    notes: list[str]
    domain: isl.UnionSet
    program: Program
    stmts: dict[str, Store] = field(default_factory=dict)
    params: dict[str, Var] = field(default_factory=dict)
    # per scratch buffer: S[i] -> T[j] when the two instances use the same allocation of it
    private: dict[Buffer, isl.UnionMap] = field(default_factory=dict)

    @property
    def all(self) -> isl.UnionMap:
        return self.flow.union(self.anti).union(self.output)

    def by_kind(self) -> tuple[tuple[str, isl.UnionMap], ...]:
        return (("flow", self.flow), ("anti", self.anti), ("output", self.output))



# ----------------------------------------------------------------------------- dependences

_DEP_CACHE: OrderedDict[tuple[int, frozenset[int] | None], tuple[Program, Deps]] = OrderedDict()


def dependences(program: Program, only: frozenset[Buffer] | None = None) -> Deps:
    """Flow, anti and output dependences of `program` (cached per program object); `only`: those through the
    given buffers alone, exactly as in the whole analysis (a buffer's dependences are a function of its own
    accesses and the schedule), for a check that only needs them (a step that moves the statements touching
    them, and only those)."""
    ckey = (id(program), None if only is None else frozenset(id(b) for b in only))
    hit = _DEP_CACHE.get(ckey)
    if hit is not None and hit[0] is program:
        _DEP_CACHE.move_to_end(ckey)
        return hit[1]
    notes: list[str] = []
    b = _Builder(program, notes)
    # the schedule parsed once per program (poly_model's cache); its domain is exactly the statement domains
    # (each instance's time is a function of its loops), and its notes are the domains' notes
    if _pm.ANALYSIS_CACHE:
        sched = schedule_map(program, notes=notes)
        dom = sched.domain()
    else:
        dtext, stext = b.domain_text(), b.schedule_text()
        dom = isl.UnionSet(b.prefix() + dtext)
        sched = _parse_union_map(b, stext).intersect_domain(dom)
    rt, wt, mt = b.access_texts(only)
    reads = _parse_union_map(b, rt).intersect_domain(dom)
    must = _parse_union_map(b, wt).intersect_domain(dom)
    may = _parse_union_map(b, mt).intersect_domain(dom)
    writes = must.union(may)

    def flow(sink: isl.UnionMap, must_src: isl.UnionMap | None, may_src: isl.UnionMap | None,
             kill: isl.UnionMap | None) -> isl.UnionFlow:
        ai = isl.UnionAccessInfo.from_sink(sink)
        if must_src is not None:
            ai = ai.set_must_source(must_src)
        if may_src is not None:
            ai = ai.set_may_source(may_src)
        if kill is not None:
            ai = ai.set_kill(kill)
        return (ai.set_schedule(tree) if tree is not None else ai.set_schedule_map(sched)).compute_flow()

    # isl's dataflow analysis walks a schedule tree (sequence nodes split the statements) about twice as fast
    # as it orders a flat schedule map; the tree orders the instances exactly as the map does (schedule_tree)
    tree = schedule_tree(program, b.infos) if _pm.ANALYSIS_CACHE else None

    # value-based: the last write before each read (may writes cannot kill, so they are may sources)
    fl = flow(reads, must, may, None).get_may_dependence()
    out = flow(writes, must, may, None).get_may_dependence()
    anti = flow(writes, None, reads, must).get_may_dependence()
    deps = Deps(fl, anti, out, notes, dom, program,
                stmts={i.store.name: i.store for i in b.infos}, params=dict(b.params),
                private={buf: r.intersect_domain(dom).intersect_range(dom) for buf, r in _same_alloc(b)[0].items()
                         if only is None or buf in only})
    _DEP_CACHE[ckey] = (program, deps)
    while len(_DEP_CACHE) > 64:
        _DEP_CACHE.popitem(last=False)
    return deps


def instance_mismatch(deps: Deps, program: Program) -> str | None:
    """None if `program` runs exactly the statement instances of the analysed program; else a sentence."""
    if not _pm.ANALYSIS_CACHE:
        b = _Builder(program)
        text = b.domain_text()
        if b.notes:
            return None
        new = isl.UnionSet(b.prefix() + text)
    else:
        notes: list[str] = []
        sched = schedule_map(program, notes=notes)
        if notes:  # an over-approximated domain cannot be compared exactly
            return None
        new = sched.domain()  # exactly the statement domains (see dependences)
    if new.is_equal(deps.domain):
        return None
    for a, b, what in ((deps.domain, new, "no longer runs"), (new, deps.domain, "now also runs")):
        extra = a.subtract(b)
        if not extra.is_empty():
            s = extra.sample_point()
            return f"the new program {what} {s} (statement instances must be preserved)"
    return None


# ----------------------------------------------------------------------------- scratch buffers


class PrivateScopeError(LoopirError, ValueError):
    """A step would change which statement instances share one allocation of a scratch buffer
    (e.g. move a loop from outside an `Allocate` to inside it): the dependences computed with
    the old allocations would no longer describe the new program, so the step is refused."""


def _same_alloc(b: _Builder, buffers: set[Buffer] | None = None
                ) -> tuple[dict[Buffer, isl.UnionMap], list[tuple[str, Buffer]]]:
    texts, outside = b.alloc_texts(buffers)
    rels = {}
    for buf, text in texts.items():
        m = _parse_union_map(b, text)
        rels[buf] = m.apply_range(m.reverse())
    return rels, outside


def check_private(deps: Deps, program: Program) -> None:
    """Raise PrivateScopeError unless every scratch buffer of the analysed program is shared by
    exactly the same statement instances in `program` (then the dependences, computed per
    allocation instance, are exact for `program` too)."""
    # sound iff for each scratch buffer B: same_alloc_B(old)(s, t) <=> same_alloc_B(new)(s, t) on the analysed
    # instances, where same_alloc relates instances under one Allocate at equal values of its privatizing loops
    if not deps.private or program is deps.program:
        return
    # a step checks several loops of one program against one analysis: the answer is the same each time
    key = (id(deps.program), id(deps.private), id(program))
    hit = _PRIVATE_OK.get(key) if _pm.ANALYSIS_CACHE else None
    if hit is not None and hit[0] is deps.program and hit[1] is deps.private and hit[2] is program:
        return
    _check_private(deps, program)
    _PRIVATE_OK[key] = (deps.program, deps.private, program)
    _trim(_PRIVATE_OK, 64)


# (analysed program, its private relations, new program) of a check_private that passed
_PRIVATE_OK: OrderedDict[tuple[int, int, int], tuple[Program, Any, Program]] = OrderedDict()


def _check_private(deps: Deps, program: Program) -> None:
    if _same_scratch_context(deps, program):
        return
    b = _Builder(program)
    new, outside = _same_alloc(b, set(deps.private))
    for stmt, buf in outside:
        raise PrivateScopeError(f"statement {stmt} would access scratch buffer {buf.name!r} outside its allocation "
                                f"({_alloc_loops(deps.program, buf)}); keep it inside the allocate")
    for buf, old in deps.private.items():
        rel = new.get(buf)
        if rel is None:
            continue  # no statement accesses it any more: the instance check reports lost statements
        rel = rel.intersect_domain(deps.domain).intersect_range(deps.domain)
        if rel.is_equal(old):
            continue
        lost = old.subtract(rel)
        if not lost.is_empty():
            a, c, at = _pair_str(lost, deps)
            what = f"{a} and {c} use one allocation of it now and would use separate ones{at}"
        else:
            a, c, at = _pair_str(rel.subtract(old), deps)
            what = f"{a} and {c} would share one allocation of it{at} (each has its own now)"
        raise PrivateScopeError(
            f"scratch buffer {buf.name!r} is allocated {_alloc_loops(deps.program, buf)} before this step and "
            f"{_alloc_loops(program, buf)} after it: {what}. Its dependences were computed per allocation, so a "
            "step may not move a loop or a statement across the allocation of a scratch buffer; do it before "
            "cache_write / cache_read, or keep the loop on the same side of the allocation.")


def _scratch_context(program: Program, buffers: set[Buffer]) -> list[tuple[Any, ...]]:
    out = []
    for info in stmt_infos(program):
        used = [b for b in dict.fromkeys(b for b in _buffers_of(info.store)) if b in buffers]
        if used:
            out.append((id(info.store), tuple((id(lp.var), lp.lo, lp.hi) for lp in info.loops), info.guards,
                        tuple((id(a.buffer), a.depth, a.loops) for a in info.allocs)))
    return out


def _same_scratch_context(deps: Deps, program: Program) -> bool:
    # fast path (steps that only annotate loops): every statement that touches a scratch buffer is the same
    # object under the same loops, guards and allocations, so its allocation instances are the same
    bufs = set(deps.private)
    return _scratch_context(deps.program, bufs) == _scratch_context(program, bufs)


def _buffers_of(st: Store) -> list[Buffer]:
    return [st.buffer] + [n.buffer for n in walk(st.value) if isinstance(n, Load)] + [
        n.buffer for i in st.indices for n in walk(i) if isinstance(n, Load)]


def _alloc_loops(program: Program, buf: Buffer) -> str:
    for info in stmt_infos(program):
        site = info.alloc_of(buf)
        if site is not None:
            names = [info.loops[k].var.name for k in site.loops]
            shared = [lp.var.name for k, lp in enumerate(info.loops[: site.depth]) if k not in site.loops]
            where = f"inside loops {', '.join(names)}" if names else "outside every loop"
            return where + (f" (shared by the threads of {', '.join(shared)})" if shared else "")
    return "not allocated"


def _pair_str(rel: isl.UnionMap, deps: Deps) -> tuple[str, str, str]:
    m = rel.get_map_list().get_at(0)
    pt = _small_point(m.wrap())
    nin = m.dim(isl.dim_type.in_)
    vals = [_pt_val(pt, isl.dim_type.set, i) for i in range(nin + m.dim(isl.dim_type.out))]
    src = _stmt_by_isl_name(deps, m.get_tuple_name(isl.dim_type.in_))
    snk = _stmt_by_isl_name(deps, m.get_tuple_name(isl.dim_type.out))

    def fmt(st: Store, xs: list[int]) -> str:
        return f"{st.name}[{', '.join(f'{v.name}={x}' for v, x in zip(st.iters, xs))}]"

    sp = pt.get_space()
    at = ", ".join(f"{sp.get_dim_name(isl.dim_type.param, i)}={_pt_val(pt, isl.dim_type.param, i)}"
                   for i in range(sp.dim(isl.dim_type.param)))
    return fmt(src, vals[:nin]), fmt(snk, vals[nin:]), (f" (at {at})" if at else "")


# ----------------------------------------------------------------------------- witnesses


def _small_point(s: isl.Set) -> isl.Point:
    """A point of `s`, preferring small parameter values and then the lexicographically smallest."""
    npar = s.dim(isl.dim_type.param)
    if npar:
        pnames = [s.get_dim_name(isl.dim_type.param, k) for k in range(npar)]
        for bound in (2, 4, 8, 16, 64, 256):
            box = isl.Set(f"[{', '.join(pnames)}] -> {{ : {' and '.join(f'0 <= {p} <= {bound}' for p in pnames)} }}")
            s2 = s.intersect_params(box)
            if s2.is_empty():
                continue
            ppt = s2.params().lexmin().sample_point() if _bounded(s2.params()) else s2.params().sample_point()
            fixed = isl.Set.from_point(ppt)
            s3 = s.intersect_params(fixed)
            try:
                return s3.lexmin().sample_point()
            except isl.Error:
                return s3.sample_point()
        return s.sample_point()
    try:
        return s.lexmin().sample_point()
    except isl.Error:
        return s.sample_point()


def _bounded(s: isl.Set) -> bool:
    try:
        return s.is_bounded()
    except isl.Error:
        return False


def _pt_val(pt: isl.Point, t: Any, k: int) -> int:
    return int(pt.get_coordinate_val(t, k).to_python())


def _witness(bad: isl.UnionMap, kind: str, deps: Deps) -> Witness | None:
    maps = bad.get_map_list()
    for k in range(maps.n_map()):
        m = maps.get_at(k)
        w = m.wrap()
        if w.is_empty():
            continue
        pt = _small_point(w)
        src_name = m.get_tuple_name(isl.dim_type.in_)
        snk_name = m.get_tuple_name(isl.dim_type.out)
        nin = m.dim(isl.dim_type.in_)
        vals = [_pt_val(pt, isl.dim_type.set, i) for i in range(nin + m.dim(isl.dim_type.out))]
        sp = pt.get_space()
        params = {sp.get_dim_name(isl.dim_type.param, i): _pt_val(pt, isl.dim_type.param, i)
                  for i in range(sp.dim(isl.dim_type.param))}
        src = _stmt_by_isl_name(deps, src_name)
        snk = _stmt_by_isl_name(deps, snk_name)
        src_env = dict(zip(src.iters, vals[:nin]))
        snk_env = dict(zip(snk.iters, vals[nin:]))
        pvals = {deps.params[n]: v for n, v in params.items() if n in deps.params}
        buf, elem = _conflict(kind, src, {**pvals, **src_env}, snk, {**pvals, **snk_env})
        return Witness(
            kind, buf,
            (src.name, {v.name: x for v, x in src_env.items()}),
            (snk.name, {v.name: x for v, x in snk_env.items()}),
            {deps.params[n].name if n in deps.params else n: v for n, v in params.items()},
            elem,
        )
    return None


def _stmt_by_isl_name(deps: Deps, name: str) -> Store:
    for k, st in deps.stmts.items():
        if _sanitize(k) == name:
            return st
    raise KeyError(name)


def _conflict(kind: str, src: Store, src_env: dict[Var, int], snk: Store,
              snk_env: dict[Var, int]) -> tuple[str, tuple[int, ...] | None]:
    """The buffer (and element) through which the two instances conflict."""
    def reads(st: Store) -> list[Load]:
        return [n for n in walk(st.value) if isinstance(n, Load)]

    def writes(st: Store) -> list[tuple[Buffer, tuple[Expr, ...]]]:
        return [(st.buffer, st.indices)]

    a = writes(src) if kind in ("flow", "output") else [(ld.buffer, ld.indices) for ld in reads(src)]
    b = writes(snk) if kind in ("anti", "output") else [(ld.buffer, ld.indices) for ld in reads(snk)]
    fallback = None
    for ba, ia in a:
        for bb, ib in b:
            if ba is not bb:
                continue
            fallback = fallback or ba.name
            try:
                ea = tuple(eval_index(i, src_env) for i in ia)
                eb = tuple(eval_index(i, snk_env) for i in ib)
            except (ValueError, KeyError):
                continue
            if ea == eb:
                return ba.name, ea
    return (fallback or src.buffer.name), None


# ----------------------------------------------------------------------------- legality


def _violations(dep: isl.UnionMap, new: isl.UnionMap, kind: str, injective: bool) -> isl.UnionMap:
    if injective:
        return dep.intersect(new.lex_ge_union_map(new))
    # an instance run several times (recomputation): a flow source must run before every run of
    # its sink; an anti source (a read) must finish before the first overwrite; the last write wins.
    try:
        lo, hi = new.lexmin(), new.lexmax()
    except isl.Error:  # unbounded (over-approximated) times: fall back to the plain test
        return dep.intersect(new.lex_ge_union_map(new))
    if kind == "flow":
        return dep.intersect(lo.lex_ge_union_map(new))
    if kind == "anti":
        return dep.intersect(hi.lex_ge_union_map(lo))
    return dep.intersect(hi.lex_ge_union_map(hi))


def find_violation(deps: Deps, program: Program) -> Witness | None:
    """A dependence (source -> sink) that `program` runs backwards or at the same time, or None.

    Legal iff no dependence s -> t has new(t) <= new(s) lexicographically (and, for scratch
    buffers, the allocations are unchanged: check_private)."""
    check_private(deps, program)
    alld = deps.all
    if alld.is_empty():
        return None
    notes: list[str] = []
    new = schedule_map(program, notes=notes).intersect_domain(deps.domain)
    # fast path: map the dependences to time pairs and meet them with one lex_ge relation (this
    # "some run of the source is not before some run of the sink" test is conservative when an
    # instance runs several times; only then is the finer per-kind test below needed)
    times = alld.apply_domain(new).apply_range(new)
    if times.is_empty() or times.intersect(_lex_ge(new)).is_empty():
        return None
    # several times per instance are runs of a recomputed instance only when the schedule is exact; an
    # over-approximated one (non-affine coords) lists POSSIBLE times, so every pair of them must be ordered
    injective = bool(notes) or new.is_single_valued()
    for kind, dep in deps.by_kind():
        bad = _violations(dep, new, kind, injective)
        if not bad.is_empty():
            return _with_notes(_witness(bad, kind, deps), notes)
    return None


_LEX_GE: dict[int, isl.UnionMap] = {}


def _lex_ge(sched: isl.UnionMap) -> isl.UnionMap:
    width = sched.get_map_list().get_at(0).dim(isl.dim_type.out)
    if width not in _LEX_GE:
        sp = isl.Set("{ [" + ", ".join(f"t{k}" for k in range(width)) + "] }").get_space()
        _LEX_GE[width] = isl.UnionMap(isl.Map.lex_ge(sp))
    return _LEX_GE[width]


def _with_notes(w: Witness | None, notes: list[str]) -> Witness | None:
    if w is None or not notes:
        return w
    return dataclasses.replace(w, notes=tuple(notes))


def _loop_depth(program: Program, loop_var: Var) -> tuple[int, set[str]]:
    depth, inside = -1, set()
    for info in stmt_infos(program):
        for k, lp in enumerate(info.loops):
            if lp.var is loop_var:
                depth = k
                inside.add(info.store.name)
    if depth < 0:
        raise NotFoundError(f"loop {loop_var.name!r} is not in program {program.name!r}")
    return depth, inside


def _carried_pairs(program: Program, loop_var: Var, domain: isl.UnionSet | None,
                   notes: list[str]) -> isl.UnionMap | None:
    """{ s -> t }: instances in two different iterations of loop `loop_var` within one iteration of every loop
    outside it (None: no instance inside the loop)."""
    depth, inside = _loop_depth(program, loop_var)
    sched = schedule_map(program, only=inside, notes=notes)
    if domain is not None:
        sched = sched.intersect_domain(domain)
    if sched.is_empty():
        return None
    width = sched.get_map_list().get_at(0).dim(isl.dim_type.out)
    rel = _time_rel(width, depth, True)
    return sched.apply_range(rel).apply_range(sched.reverse())


def carried_free(rel: isl.UnionMap, program: Program, loop_var: Var) -> bool:
    """True iff no pair (s -> t) of `rel` joins two different iterations of loop `loop_var` within one iteration
    of the loops outside it: `rel` ∩ `_carried_pairs` is empty, tested in time space (the pairs of `rel` whose
    both statements lie inside the loop, mapped through the schedule, met with the time relation), which
    costs far less than building every pair of instances of the nest. Same answer: (s, t) is in the pairs
    iff some time of s and some time of t are related by `_time_rel`, which is what the image tests."""
    depth, inside = _loop_depth(program, loop_var)
    names = {_sanitize(n) for n in inside}
    sub = _keep_pairs(rel, lambda a, b: a not in names or b not in names)
    if sub.is_empty():
        return True
    sched = schedule_map(program, only=inside)
    times = sub.apply_domain(sched).apply_range(sched)
    if times.is_empty():
        return True
    width = sched.get_map_list().get_at(0).dim(isl.dim_type.out)
    return times.intersect(_time_rel(width, depth, True)).is_empty()


def carried_by(deps: Deps, program: Program, loop_var: Var) -> Witness | None:
    """A dependence between two different iterations of loop `loop_var` (same iteration of
    every loop outside it), or None when its iterations may run in any order / in parallel."""
    _loop_depth(program, loop_var)
    check_private(deps, program)
    if deps.all.is_empty():
        return None
    if _pm.ANALYSIS_CACHE and carried_free(deps.all, program, loop_var):
        return None  # exactly the answer of the test below, which also finds the witness when there is one
    notes: list[str] = []
    pairs = _carried_pairs(program, loop_var, deps.domain, notes)
    if pairs is None:
        return None
    for kind, dep in deps.by_kind():
        bad = dep.intersect(pairs)
        if not bad.is_empty():
            return _with_notes(_witness(bad, kind, deps), notes)
    return None


_TIME_RELS: dict[tuple[int, int, bool], isl.UnionMap] = {}


def _time_rel(width: int, depth: int, differ: bool) -> isl.UnionMap:
    """{ [t] -> [u] }: equal in the first 2*depth + 1 time dimensions (one iteration of the loops outside the
    loop at `depth`, same textual position) and, when `differ`, different in the loop's own dimension."""
    key = (width, depth, differ)
    if key not in _TIME_RELS:
        t = [f"t{k}" for k in range(width)]
        u = [f"u{k}" for k in range(width)]
        eq = [f"{a} = {b}" for a, b in zip(t[: 2 * depth + 1], u[: 2 * depth + 1])]
        c = 2 * depth + 1
        if differ:
            eq.append(f"({t[c]} < {u[c]} or {t[c]} > {u[c]})")
        _TIME_RELS[key] = isl.UnionMap(f"{{ [{', '.join(t)}] -> [{', '.join(u)}] : {' and '.join(eq) or '1 = 1'} }}")
    return _TIME_RELS[key]


def time_of(program: Program, stmt: str, iters: dict[str, int], params: dict[str, int]) -> list[int] | None:
    """The (first) time vector at which `program` runs instance stmt[iters] at the given sizes."""
    b = _Builder(program)
    sched = _parse_union_map(b, b.schedule_text({stmt}))
    st = next((i.store for i in b.infos if i.store.name == stmt), None)
    if st is None:
        return None
    its = b.iter_names(st)
    pcons = [f"{n} = {params[v.name]}" for n, v in b.params.items() if v.name in params]
    point = (f"{b.prefix()}{{ {_sanitize(stmt)}[{', '.join(its)}] : "
             f"{' and '.join([f'{n} = {iters[v.name]}' for n, v in zip(its, st.iters)] + pcons) or '1 = 1'} }}")
    img = isl.UnionSet(point).apply(sched)
    if img.is_empty():
        return None
    s = img.get_set_list().get_at(0)
    try:
        pt = s.lexmin().sample_point()
    except isl.Error:  # lexmin of an unbounded set (over-approximated domains): any point will do
        pt = s.sample_point()
    return [_pt_val(pt, isl.dim_type.set, k) for k in range(s.dim(isl.dim_type.set))]




# ----------------------------------------------------------------------------- loop kinds

CONCURRENT_KINDS = ("parallel", "vectorize", "thread")


def concurrent_loops(program: Program) -> list[Any]:
    """The Fors whose iterations may run in any order (parallel, vectorized, bound to a GPU axis), pre-order."""

    return [n for n in walk(program.body) if isinstance(n, For) and n.kind in CONCURRENT_KINDS]


def _writes_shared_scratch(program: Program) -> set[str]:
    """isl names of the staging copies: statements that copy a plain load into a "shared" buffer of an
    Allocate (cache_read). Every thread of the block writes the same values, and the barriers cache_read
    placed around the copy order it with its readers, so a threadIdx loop need not be free of their
    dependences. (A block-shared accumulator is not exempt: threads racing on it are refused.)"""
    out = set()
    for info in stmt_infos(program):
        site = info.alloc_of(info.store.buffer)
        if site is not None and info.store.buffer.scope == "shared" and isinstance(info.store.value, Load):
            out.add(_sanitize(info.store.name))
    return out


def _drop_pairs(deps: Deps, drop: Any) -> Deps:
    return dataclasses.replace(deps, flow=_keep_pairs(deps.flow, drop), anti=_keep_pairs(deps.anti, drop),
                               output=_keep_pairs(deps.output, drop))


def _keep_pairs(um: isl.UnionMap, drop: Any) -> isl.UnionMap:
    out = isl.UnionMap.empty(um.get_space())
    ml = um.get_map_list()
    for k in range(ml.n_map()):
        m = ml.get_at(k)
        if not drop(m.get_tuple_name(isl.dim_type.in_), m.get_tuple_name(isl.dim_type.out)):
            out = out.union(isl.UnionMap.from_map(m))
    return out


def concurrent_violation(deps: Deps, program: Program, skip: tuple[Var, ...] = (),
                         reductions: dict[Var, frozenset[str]] | None = None) -> tuple[Var, Witness] | None:
    """The first parallel / vectorized / GPU-bound loop of `program` that carries a dependence, with
    the witness; None when every such loop is free of carried dependences.

    Formal condition checked: for every loop L of kind parallel, vectorize or thread, no dependence
    (s -> t) joins two different iterations of L within one iteration of the loops outside it. Two
    relaxations, each justified by the code the primitive generated: a threadIdx loop ignores the
    dependences of statements writing a block-shared scratch buffer (the staging barriers order them),
    and a loop made a cross-thread reduction by bind_reduction (`reductions`: loop -> statement names)
    ignores those statements' dependences on themselves (an associative, commutative update)."""
    loops = [f for f in concurrent_loops(program) if not any(f.var is v for v in skip)]
    if not loops or deps.all.is_empty():
        return None
    shared = None
    for f in loops:
        d = deps
        dropped: tuple[frozenset[str], ...] = ()
        if f.kind == "thread" and (f.thread or "").startswith("threadIdx"):
            shared = _writes_shared_scratch(program) if shared is None else shared
            if shared:
                d = _drop_pairs(d, lambda a, b, sh=shared: a in sh or b in sh)
                dropped += (frozenset(shared),)
        red = (reductions or {}).get(f.var)
        if red:
            names = {_sanitize(n) for n in red}
            d = _drop_pairs(d, lambda a, b, names=names: a == b and a in names)
            dropped += (frozenset(names),)
        check_private(deps, program)
        key = _carried_key(program, f.var, dropped) if _pm.ANALYSIS_CACHE else None
        hit = _CARRIED_FREE.get(key) if key is not None else None
        if hit is not None and hit is deps:
            continue
        w = carried_by(d, program, f.var)
        if w is not None:
            return f.var, w
        if key is not None:
            _CARRIED_FREE[key] = deps
            _trim(_CARRIED_FREE, 256)
    return None


# (analysis id, relaxations, loop depth, the isl text of the schedule of the statements inside the loop) of a
# loop found free of carried dependences -> that analysis. carried_by's answer is a function of exactly these
# (the pairs it tests are built from that text alone), so a later program that differs only outside the loop
# or in loop kinds (bind, parallel, vectorize, unroll: the text is unchanged) is not tested again.
_CARRIED_FREE: OrderedDict[tuple[Any, ...], Deps] = OrderedDict()


def _carried_key(program: Program, loop_var: Var, dropped: tuple[frozenset[str], ...]) -> tuple[Any, ...] | None:
    pieces = _schedule_pieces(program)
    if pieces is None:
        return None
    depth, inside = _loop_depth(program, loop_var)
    return (depth, dropped, tuple(sorted(pieces[1][n][2] for n in inside)))


def dependences_inside(deps: Deps, program: Program, loop_var: Var) -> tuple[tuple[str, isl.UnionMap], ...]:
    """The dependences between two instances inside loop `loop_var` within ONE iteration of every loop
    outside it (those a rewrite of the loop and its body can reorder; the others, carried by an outer
    loop such as a time loop, keep their order), per kind."""
    depth, inside = _loop_depth(program, loop_var)
    sched = schedule_map(program, only=inside).intersect_domain(deps.domain)
    if sched.is_empty():
        return tuple((k, d.subtract(d)) for k, d in deps.by_kind())
    width = sched.get_map_list().get_at(0).dim(isl.dim_type.out)
    rel = _time_rel(width, depth, False)
    pairs = sched.apply_range(rel).apply_range(sched.reverse())
    return tuple((k, d.intersect(pairs)) for k, d in deps.by_kind())
