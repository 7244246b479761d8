"""Exact dependence analysis of loop IR with isl (islpy), and the legality tests built on it.

The program is turned into isl objects:

* the statement *domains*, one `UnionSet` over the ORIGINAL instance spaces `S[iters]`
  (dims named after the statement's iteration variables, size variables as parameters):
  `{ S[iters] : exists loops: iters = coords(loops) and lo <= loop < hi and guards }`;
* read and write *accesses* `S[iters] -> Buf[indices]` (a non-affine index reads or writes
  the whole buffer, and says so in `Deps.notes`; a non-affine bound or guard is dropped, which
  over-approximates the domain, and is noted too);
* a *schedule*: each statement instance -> a time vector of ONE common length in which
  textual-order dimensions are interleaved with the loop dimensions (`[b0, l0, b1, l1, ..., bk]`,
  padded with 0). The range tuple is unnamed: isl's lexicographic comparisons silently drop
  pairs whose ranges lie in different spaces (STACK.md trap 1), and two statements at the same
  time hide their dependences from `compute_flow` (trap 3).

`dependences(program)` runs isl's dataflow analysis once per program (cached);
`find_violation(deps, new_program)` and `carried_by(deps, program, loop_var)` check a
schedule against them and return a concrete `Witness` (two statement instances and the
sizes at which they conflict) or None; `footprint` gives the region a statement reads
inside a loop (for compute_at).
"""

from __future__ import annotations

import dataclasses
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import islpy as isl

from .nodes import (
    Allocate,
    Binary,
    Buffer,
    Cast,
    Compare,
    Const,
    Expr,
    For,
    If,
    Load,
    Logical,
    Program,
    Seq,
    Stmt,
    Store,
    Unary,
    Var,
    binary,
    const,
)
from .visit import walk

__all__ = [
    "Deps",
    "Witness",
    "StmtInfo",
    "NonAffine",
    "dependences",
    "schedule_map",
    "find_violation",
    "carried_by",
    "footprint",
    "stmt_infos",
    "eval_index",
    "instance_mismatch",
    "time_of",
    "isl_domain",
]


class NonAffine(Exception):
    """An expression that isl cannot represent (raised internally, then over-approximated)."""


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

    @property
    def all(self) -> isl.UnionMap:
        return self.flow.union(self.anti).union(self.output)

    def by_kind(self) -> tuple[tuple[str, isl.UnionMap], ...]:
        return (("flow", self.flow), ("anti", self.anti), ("output", self.output))


@dataclass(frozen=True)
class StmtInfo:
    """A statement occurrence in the current nest: its loops, guards and textual positions
    (`betas[k]` is its position among the children of loop k-1; len(betas) == len(loops) + 1)."""

    store: Store
    loops: tuple[For, ...]
    guards: tuple[Expr, ...]
    betas: tuple[int, ...]


def stmt_infos(program: Program | Stmt) -> list[StmtInfo]:
    """Every Store in textual order with its loops, guards and textual-order positions."""
    body = program.body if isinstance(program, Program) else program
    out: list[StmtInfo] = []

    def go(s: Stmt, loops: tuple[For, ...], guards: tuple[Expr, ...], betas: tuple[int, ...], ctr: list[int]) -> None:
        if isinstance(s, Store):
            out.append(StmtInfo(s, loops, guards, betas + (ctr[0],)))
            ctr[0] += 1
        elif isinstance(s, Seq):
            for c in s.body:
                go(c, loops, guards, betas, ctr)
        elif isinstance(s, For):
            b = ctr[0]
            ctr[0] += 1
            go(s.body, loops + (s,), guards, betas + (b,), [0])
        elif isinstance(s, If):
            go(s.then, loops, guards + (s.cond,), betas, ctr)
            if s.orelse is not None:
                go(s.orelse, loops, guards + (~s.cond,), betas, ctr)
        elif isinstance(s, Allocate):
            go(s.body, loops, guards, betas, ctr)

    go(body, (), (), (), [0])
    return out


# ----------------------------------------------------------------------------- expressions -> isl text

_ISL_WORDS = {"and", "or", "not", "exists", "mod", "floor", "ceil", "min", "max", "true", "false", "infty", "NaN", "Z"}


def _sanitize(name: str) -> str:
    s = re.sub(r"[^A-Za-z0-9_]", "_", name) or "v"
    if s[0].isdigit():
        s = "v" + s
    if s in _ISL_WORDS:
        s += "_"
    return s


class _Names:
    """isl identifiers for Vars (by identity) within one formula; unknown Vars become parameters."""

    def __init__(self, params: dict[str, Var], taken: set[str] | None = None) -> None:
        self.params = params
        self.env: dict[Var, str] = {}
        self.taken = set(taken or ()) | set(params)

    def bind(self, v: Var, hint: str | None = None) -> str:
        base = _sanitize(hint or v.name)
        name, k = base, 1
        while name in self.taken:
            name = f"{base}_{k}"
            k += 1
        self.taken.add(name)
        self.env[v] = name
        return name

    def name(self, v: Var) -> str:
        n = self.env.get(v)
        if n is not None:
            return n
        p = _sanitize(v.name)
        if p not in self.params:
            self.params[p] = v
        self.env[v] = p
        return p


def _is_int_expr(e: Expr) -> bool:
    return e.dtype in ("int32", "int64")


def aff(e: Expr, names: _Names) -> str:
    """isl text of an affine integer expression; raises NonAffine otherwise."""
    if isinstance(e, Const):
        if isinstance(e.value, bool) or not isinstance(e.value, int):
            raise NonAffine(e)
        return str(e.value)
    if isinstance(e, Var):
        return names.name(e)
    if isinstance(e, Cast):
        if _is_int_expr(e) and _is_int_expr(e.a):
            return aff(e.a, names)
        raise NonAffine(e)
    if isinstance(e, Unary) and e.op == "neg":
        return f"-({aff(e.a, names)})"
    if isinstance(e, Binary) and _is_int_expr(e):
        if e.op in ("add", "sub"):
            return f"({aff(e.a, names)}) {'+' if e.op == 'add' else '-'} ({aff(e.b, names)})"
        if e.op == "mul":
            ca, cb = _const_int(e.a), _const_int(e.b)
            if cb is not None:
                return f"{cb}*({aff(e.a, names)})"
            if ca is not None:
                return f"{ca}*({aff(e.b, names)})"
            raise NonAffine(e)
        if e.op in ("floordiv", "mod"):
            c = _const_int(e.b)
            if c is None or c <= 0:
                raise NonAffine(e)
            a = aff(e.a, names)
            if e.op == "floordiv":
                return f"floor(({a})/{c})"
            return f"(({a}) - {c}*floor(({a})/{c}))"
        if e.op in ("max", "min"):
            return f"{e.op}({aff(e.a, names)}, {aff(e.b, names)})"
    raise NonAffine(e)


def _const_int(e: Expr) -> int | None:
    if isinstance(e, Const) and isinstance(e.value, int) and not isinstance(e.value, bool):
        return e.value
    if isinstance(e, Unary) and e.op == "neg":
        c = _const_int(e.a)
        return None if c is None else -c
    if isinstance(e, Cast) and _is_int_expr(e):
        return _const_int(e.a)
    return None


_CMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "="}
_NEG = {"lt": "ge", "le": "gt", "gt": "le", "ge": "lt", "eq": "ne", "ne": "eq"}


def cond(e: Expr, names: _Names, negate: bool = False) -> str:
    """isl text of an affine condition; raises NonAffine otherwise."""
    if isinstance(e, Const) and isinstance(e.value, bool):
        return "1 = 1" if e.value != negate else "1 = 0"
    if isinstance(e, Compare):
        if not (_is_int_expr(e.a) and _is_int_expr(e.b)):
            raise NonAffine(e)
        op = _NEG[e.op] if negate else e.op
        a, b = aff(e.a, names), aff(e.b, names)
        if op == "ne":
            return f"(({a}) < ({b}) or ({a}) > ({b}))"
        return f"({a}) {_CMP[op]} ({b})"
    if isinstance(e, Logical):
        if e.op == "not":
            return cond(e.a, names, not negate)
        assert e.b is not None
        op = e.op if not negate else ("or" if e.op == "and" else "and")
        return f"(({cond(e.a, names, negate)}) {op} ({cond(e.b, names, negate)}))"
    raise NonAffine(e)


# ----------------------------------------------------------------------------- evaluation


def eval_index(e: Expr, env: dict[Var, int]) -> int:
    """Value of an integer index expression at concrete values of its variables."""
    if isinstance(e, Const):
        return int(e.value)
    if isinstance(e, Var):
        if e not in env:
            raise KeyError(f"no value for variable {e.name!r}")
        return env[e]
    if isinstance(e, Cast):
        return eval_index(e.a, env)
    if isinstance(e, Unary) and e.op == "neg":
        return -eval_index(e.a, env)
    if isinstance(e, Binary):
        a, b = eval_index(e.a, env), eval_index(e.b, env)
        ops = {"add": a + b, "sub": a - b, "mul": a * b, "max": max(a, b), "min": min(a, b)}
        if e.op in ops:
            return ops[e.op]
        if e.op == "floordiv":
            return a // b
        if e.op == "mod":
            return a % b
    raise ValueError(f"cannot evaluate {e!r} as an integer index")


# ----------------------------------------------------------------------------- building isl objects


def _program_params(program: Program) -> dict[str, Var]:
    return {_sanitize(p.name): p for p in program.params}


class _Builder:
    """Builds the isl text of domains, accesses and schedules of one program."""

    def __init__(self, program: Program, notes: list[str] | None = None) -> None:
        self.program = program
        self.params = _program_params(program)
        self.infos = stmt_infos(program)
        self.notes = notes if notes is not None else []
        self.depth = max((len(i.loops) for i in self.infos), default=0)
        self.exact: dict[str, bool] = {}
        self._iter_names: dict[int, list[str]] = {}

    def iter_names(self, st: Store) -> list[str]:
        key = id(st)
        if key not in self._iter_names:
            n = _Names(self.params)
            self._iter_names[key] = [n.bind(v) for v in st.iters]
        return self._iter_names[key]

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def _instance(self, info: StmtInfo) -> tuple[str, _Names, list[str]]:
        """`S[i, j]`, a name table with iters and loops bound, and the domain constraints
        (in terms of the loop existentials)."""
        st = info.store
        # the loop table only: a loop variable may be the very Var of an iteration variable
        names = _Names(self.params, set(self.iter_names(st)))
        its = self.iter_names(st)
        cons: list[str] = []
        for lp in info.loops:
            names.bind(lp.var, "l_" + lp.var.name)
        for lp in info.loops:
            v = names.env[lp.var]
            try:
                cons.append(f"({aff(lp.lo, names)}) <= {v} < ({aff(lp.hi, names)})")
            except NonAffine:
                self.exact[st.name] = False
                self.note(f"the bounds of loop {lp.var.name} around statement {st.name} are not affine; "
                          "the analysis assumes the loop may run any iteration")
        for g in info.guards:
            try:
                cons.append(cond(g, names))
            except NonAffine:
                self.exact[st.name] = False
                self.note(f"a guard of statement {st.name} is not affine; the analysis assumes it always holds")
        for k, (v, c) in enumerate(zip(st.iters, st.coords)):
            try:
                cons.append(f"{its[k]} = ({aff(c, names)})")
            except NonAffine:
                self.exact[st.name] = False
                self.note(f"statement {st.name}: {v.name} is not an affine function of the loops around it; "
                          "the analysis assumes any value")
        return f"{_sanitize(st.name)}[{', '.join(its)}]", names, cons

    def _exists(self, info: StmtInfo, names: _Names, cons: list[str]) -> str:
        loops = [names.env[lp.var] for lp in info.loops]
        body = " and ".join(cons) if cons else "1 = 1"
        if not loops:
            return body
        return f"exists ({', '.join(loops)} : {body})"

    def prefix(self) -> str:
        return f"[{', '.join(self.params)}] -> " if self.params else ""

    def domain_text(self) -> str:
        parts = []
        for info in self.infos:
            inst, names, cons = self._instance(info)
            parts.append(f"{inst} : {self._exists(info, names, cons)}")
        return "{ " + "; ".join(parts) + " }"

    def schedule_text(self, only: set[str] | None = None) -> str:
        width = 2 * self.depth + 1
        parts = []
        for info in self.infos:
            if only is not None and info.store.name not in only:
                continue
            inst, names, cons = self._instance(info)
            t: list[str] = []
            for k, lp in enumerate(info.loops):
                t += [str(info.betas[k]), names.env[lp.var]]
            t.append(str(info.betas[-1]))
            t += ["0"] * (width - len(t))
            ts = [f"t{k}" for k in range(width)]
            tcons = [f"{a} = {b}" for a, b in zip(ts, t)]
            loops = [names.env[lp.var] for lp in info.loops]
            body = " and ".join(cons + tcons)
            text = f"exists ({', '.join(loops)} : {body})" if loops else body
            parts.append(f"{inst} -> [{', '.join(ts)}] : {text}")
        return "{ " + "; ".join(parts) + " }"

    def access_texts(self) -> tuple[str, str, str]:
        """(reads, exact writes, inexact writes) as isl text (each intersected with the domain later)."""
        reads, must, may = [], [], []
        bufnames: dict[Buffer, str] = {}
        used: set[str] = set()

        def bname(b: Buffer) -> str:
            if b not in bufnames:
                base, n, k = _sanitize(b.name), _sanitize(b.name), 1
                while n in used:
                    n = f"{base}_{k}"
                    k += 1
                used.add(n)
                bufnames[b] = n
            return bufnames[b]

        for info in self.infos:
            st = info.store
            inst, _, _ = self._instance(info)
            names = _Names(self.params)
            for v, n in zip(st.iters, self.iter_names(st)):
                names.env[v] = n
                names.taken.add(n)

            def access(buf: Buffer, idx: tuple[Expr, ...], what: str, inst: str = inst, names: _Names = names,
                       st: Store = st) -> tuple[str, bool]:
                try:
                    return f"{inst} -> {bname(buf)}[{', '.join(aff(i, names) for i in idx)}]", True
                except NonAffine:
                    self.note(f"statement {st.name} {what} {buf.name} at a non-affine index; "
                              f"the analysis assumes it may {what.rstrip('s')} any element of {buf.name}")
                    return self._whole(inst, bname(buf), buf, names), False

            loads = [n for n in walk(st.value) if isinstance(n, Load)]
            for i in st.indices:
                loads += [n for n in walk(i) if isinstance(n, Load)]
            for ld in loads:
                reads.append(access(ld.buffer, ld.indices, "reads")[0])
            text, ok = access(st.buffer, st.indices, "writes")
            (must if ok and self.exact.get(st.name, True) else may).append(text)
        self.bufnames = {v: k for k, v in bufnames.items()}
        wrap = lambda xs: "{ " + "; ".join(xs) + " }"  # noqa: E731
        return wrap(reads), wrap(must), wrap(may)

    def _whole(self, inst: str, bn: str, buf: Buffer, names: _Names) -> str:
        dims = [f"e{k}" for k in range(len(buf.shape))]
        cons = []
        for d, s in zip(dims, buf.shape):
            try:
                cons.append(f"0 <= {d} < ({aff(s, names)})")
            except NonAffine:
                pass
        return f"{inst} -> {bn}[{', '.join(dims)}]" + (f" : {' and '.join(cons)}" if cons else "")


def _parse_union_map(b: _Builder, text: str) -> isl.UnionMap:
    return isl.UnionMap(b.prefix() + text)


def _exists(names: list[str], body: str) -> str:
    return f"exists ({', '.join(names)} : {body})" if names else body


def isl_domain(program: Program) -> isl.UnionSet:
    """The statement domains of `program` over original instance spaces."""
    b = _Builder(program)
    text = b.domain_text()
    return isl.UnionSet(b.prefix() + text)


# ----------------------------------------------------------------------------- dependences

_DEP_CACHE: OrderedDict[int, tuple[Program, Deps]] = OrderedDict()


def dependences(program: Program) -> Deps:
    """Flow, anti and output dependences of `program` (cached per program object)."""
    hit = _DEP_CACHE.get(id(program))
    if hit is not None and hit[0] is program:
        _DEP_CACHE.move_to_end(id(program))
        return hit[1]
    notes: list[str] = []
    b = _Builder(program, notes)
    dtext, stext = b.domain_text(), b.schedule_text()
    rt, wt, mt = b.access_texts()
    dom = isl.UnionSet(b.prefix() + dtext)
    sched = _parse_union_map(b, stext).intersect_domain(dom)
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
        return ai.set_schedule_map(sched).compute_flow()

    # value-based: the last write before each read (may writes cannot kill, so they are may sources)
    fl = flow(reads, must, may, None).get_may_dependence()
    out = flow(writes, must, may, None).get_may_dependence()
    anti = flow(writes, None, reads, must).get_may_dependence()
    deps = Deps(fl, anti, out, notes, dom, program,
                stmts={i.store.name: i.store for i in b.infos}, params=dict(b.params))
    _DEP_CACHE[id(program)] = (program, deps)
    while len(_DEP_CACHE) > 64:
        _DEP_CACHE.popitem(last=False)
    return deps


def schedule_map(program: Program, only: set[str] | None = None, notes: list[str] | None = None) -> isl.UnionMap:
    """The current nest's schedule as a relation S[iters] -> [time] (common length, textual-order dims).

    Non-affine loop bounds, guards or coords are dropped (over-approximation) and described in `notes`."""
    b = _Builder(program, notes)
    return _parse_union_map(b, b.schedule_text(only))


def instance_mismatch(deps: Deps, program: Program) -> str | None:
    """None if `program` runs exactly the statement instances of the analysed program; else a sentence."""
    b = _Builder(program)
    text = b.domain_text()
    if b.notes:  # an over-approximated domain cannot be compared exactly
        return None
    new = isl.UnionSet(b.prefix() + text)
    if new.is_equal(deps.domain):
        return None
    for a, b, what in ((deps.domain, new, "no longer runs"), (new, deps.domain, "now also runs")):
        extra = a.subtract(b)
        if not extra.is_empty():
            s = extra.sample_point()
            return f"the new program {what} {s} (statement instances must be preserved)"
    return None


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

    Legal iff no dependence s -> t has new(t) <= new(s) lexicographically."""
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
    injective = new.is_single_valued()
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
        raise ValueError(f"loop {loop_var.name!r} is not in program {program.name!r}")
    return depth, inside


def carried_by(deps: Deps, program: Program, loop_var: Var) -> Witness | None:
    """A dependence between two different iterations of loop `loop_var` (same iteration of
    every loop outside it), or None when its iterations may run in any order / in parallel."""
    depth, inside = _loop_depth(program, loop_var)
    if deps.all.is_empty():
        return None
    notes: list[str] = []
    sched = schedule_map(program, only=inside, notes=notes).intersect_domain(deps.domain)
    if sched.is_empty():
        return None
    width = sched.get_map_list().get_at(0).dim(isl.dim_type.out)
    t = [f"t{k}" for k in range(width)]
    u = [f"u{k}" for k in range(width)]
    eq = [f"{a} = {b}" for a, b in zip(t[: 2 * depth + 1], u[: 2 * depth + 1])]
    c = 2 * depth + 1
    rel = isl.UnionMap(f"{{ [{', '.join(t)}] -> [{', '.join(u)}] : "
                       f"{' and '.join(eq + [f'({t[c]} < {u[c]} or {t[c]} > {u[c]})'])} }}")
    pairs = sched.apply_range(rel).apply_range(sched.reverse())
    for kind, dep in deps.by_kind():
        bad = dep.intersect(pairs)
        if not bad.is_empty():
            return _with_notes(_witness(bad, kind, deps), notes)
    return None


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
    pt = s.lexmin().sample_point()
    return [_pt_val(pt, isl.dim_type.set, k) for k in range(s.dim(isl.dim_type.set))]


# ----------------------------------------------------------------------------- footprint & bounds


def pw_to_expr(pw: isl.PwAff, vars_by_name: dict[str, Var], what: str = "bound") -> Expr:
    """A loopir Expr for an isl piecewise quasi-affine function that is one affine piece or the
    max / min of its pieces; ValueError otherwise."""
    pieces = pw.get_pieces()
    if not pieces:
        raise ValueError(f"the {what} is empty (no iteration)")
    exprs = [aff_to_expr(a, vars_by_name) for _, a in pieces]
    if len(pieces) == 1:
        return exprs[0]
    dom = pw.domain()
    affs = [isl.PwAff.from_aff(a) for _, a in pieces]
    for op in ("max", "min"):
        acc = affs[0]
        for a in affs[1:]:
            acc = acc.max(a) if op == "max" else acc.min(a)
        if acc.intersect_domain(dom).is_equal(pw):
            out = exprs[0]
            for e in exprs[1:]:
                out = binary(op, out, e)
            return out
    raise ValueError(f"the {what} {pw} is not a max or min of affine pieces")


def aff_to_expr(a: isl.Aff, vars_by_name: dict[str, Var]) -> Expr:
    """A loopir Expr for an isl quasi-affine expression (divisions become floordiv)."""
    den_val = a.get_denominator_val()
    den = int(den_val.to_python())
    terms: list[Expr] = []

    def coef(t: Any, k: int) -> int:
        return int(a.get_coefficient_val(t, k).mul(den_val).to_python())

    for t in (isl.dim_type.param, isl.dim_type.in_):
        for k in range(a.dim(t)):
            c = coef(t, k)
            if c:
                name = a.get_dim_name(t, k)
                if name not in vars_by_name:
                    raise ValueError(f"unknown variable {name!r} in {a}")
                terms.append(_scale(vars_by_name[name], c))
    for k in range(a.dim(isl.dim_type.div)):
        c = coef(isl.dim_type.div, k)
        if c:
            terms.append(_scale(aff_to_expr(a.get_div(k), vars_by_name), c))
    c0 = int(a.get_constant_val().mul(den_val).to_python())
    out: Expr = const(0)
    for t in terms:
        out = binary("add", out, t)
    out = binary("add", out, const(c0)) if c0 > 0 else binary("sub", out, const(-c0)) if c0 < 0 else out
    if den != 1:
        out = binary("floordiv", out, const(den))
    return out


def _plus1(pw: isl.PwAff) -> isl.PwAff:
    return pw.add_constant_val(isl.Val.one(pw.get_ctx()))


def _scale(e: Expr, c: int) -> Expr:
    return e if c == 1 else binary("mul", const(c), e)


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
