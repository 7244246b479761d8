"""The polyhedral model of a loop nest: statement occurrences (`stmt_infos`) and the isl text of
their domains, schedules and accesses (`_Builder`).

* *domains* over the ORIGINAL instance spaces `S[iters]` (dims named after the statement's
  iteration variables, size variables as parameters):
  `{ S[iters] : exists loops: iters = coords(loops) and lo <= loop < hi and guards }`;
* *accesses* `S[iters] -> Buf[indices]` (a non-affine index touches the whole buffer, noted);
  a scratch buffer (one introduced by an `Allocate`) is expanded by its allocation instance,
  `S[iters] -> Buf[a, L_1, .., L_k, indices]` with `a` the Allocate and `L` the values of the
  k loops around it (the same exists-construction as the domains), so that no dependence
  joins two iterations of those loops: each has its own copy of the buffer (a "shared"
  buffer is one copy per block: loops bound to threadIdx do not count, see AllocSite);
* a *schedule*: each statement instance -> a time vector of ONE common length in which
  textual-order dimensions are interleaved with the loop dimensions (`[b0, l0, b1, l1, ..., bk]`,
  padded with 0), range tuple unnamed (STACK.md traps 1 and 3).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import islpy as isl

from .isl_conv import NonAffine, _exists, _Names, _sanitize, aff, cond, derived_size, params_text
from .affine import _const_int
from .nodes import Allocate, Binary, Buffer, Expr, For, If, Load, Program, Seq, Stmt, Store, Var
from .visit import walk

__all__ = ["StmtInfo", "stmt_infos", "isl_domain", "schedule_map", "AllocSite"]


@dataclass(frozen=True)
class AllocSite:
    """An `Allocate` of `buffer` around a statement: `ident` numbers the Allocate nodes of the
    program in pre-order, `depth` is how many of the statement's loops lie outside it, `loops`
    the positions of those that give each iteration its own copy: all of them, except for a
    "shared" buffer the loops bound to threadIdx (CUDA shared memory is one copy per block)."""

    buffer: Buffer
    ident: int
    depth: int
    loops: tuple[int, ...] = ()


@dataclass(frozen=True)
class StmtInfo:
    """A statement occurrence in the current nest: its loops, guards and textual positions
    (`betas[k]` is its position among the children of loop k-1; len(betas) == len(loops) + 1),
    and the allocations around it, outermost first."""

    store: Store
    loops: tuple[For, ...]
    guards: tuple[Expr, ...]
    betas: tuple[int, ...]
    allocs: tuple[AllocSite, ...] = ()

    def alloc_of(self, buf: Buffer) -> AllocSite | None:
        """The innermost allocation of `buf` around the statement (None: not a scratch buffer here)."""
        for a in reversed(self.allocs):
            if a.buffer is buf:
                return a
        return None


def stmt_infos(program: Program | Stmt) -> list[StmtInfo]:
    """Every Store in textual order with its loops, guards, textual-order positions and allocations."""
    body = program.body if isinstance(program, Program) else program
    out: list[StmtInfo] = []
    n_alloc = [0]

    def go(s: Stmt, loops: tuple[For, ...], guards: tuple[Expr, ...], betas: tuple[int, ...], ctr: list[int],
           allocs: tuple[AllocSite, ...]) -> None:
        if isinstance(s, Store):
            out.append(StmtInfo(s, loops, guards, betas + (ctr[0],), allocs))
            ctr[0] += 1
        elif isinstance(s, Seq):
            for c in s.body:
                go(c, loops, guards, betas, ctr, allocs)
        elif isinstance(s, For):
            b = ctr[0]
            ctr[0] += 1
            go(s.body, loops + (s,), guards, betas + (b,), [0], allocs)
        elif isinstance(s, If):
            go(s.then, loops, guards + (s.cond,), betas, ctr, allocs)
            if s.orelse is not None:
                go(s.orelse, loops, guards + (~s.cond,), betas, ctr, allocs)
        elif isinstance(s, Allocate):
            private = tuple(k for k, lp in enumerate(loops) if not (
                s.buffer.scope == "shared" and lp.kind == "thread" and (lp.thread or "").startswith("threadIdx")))
            site = AllocSite(s.buffer, n_alloc[0], len(loops), private)
            n_alloc[0] += 1
            go(s.body, loops, guards, betas, ctr, allocs + (site,))

    go(body, (), (), (), [0], ())
    return out


def register_products(program: Program) -> None:
    """Make each product of sizes that `program` uses an isl parameter of its own (see `_program_params`)."""
    _program_params(program)


def _program_params(program: Program) -> dict[str, Var]:
    """The isl parameters of `program`: its sizes, and a parameter for each product of sizes it uses (`B * T` in
    a shape or a bound: `isl_conv.derived_size`), named before any formula so every formula's prefix has it."""
    out = {_sanitize(p.name): p for p in program.params}
    if len(program.params) < 2:
        return out
    sizes = set(program.params)
    names = _Names(out)
    exprs = [e for b in program.args + program.temps for e in b.shape]
    exprs += [n for n in walk(program.body) if isinstance(n, Binary) and n.op == "mul"]
    for e in exprs:
        for n in walk(e):
            if (isinstance(n, Binary) and n.op == "mul" and _const_int(n.a) is None and _const_int(n.b) is None
                    and all(isinstance(v, Var) and v in sizes for v in walk(n) if isinstance(v, Var))):
                derived_size(n, names, register=True)
    return out


def _accessed(st: Store) -> list[tuple[Buffer, tuple[Expr, ...], str]]:
    """(buffer, indices, "reads" | "writes") of every access of a statement (loads in indices too)."""
    loads = [n for n in walk(st.value) if isinstance(n, Load)]
    for i in st.indices:
        loads += [n for n in walk(i) if isinstance(n, Load)]
    return [(ld.buffer, ld.indices, "reads") for ld in loads] + [(st.buffer, st.indices, "writes")]


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
        self.bufnames: dict[str, Buffer] = {}

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
            for bound, fmt in ((lp.lo, "({}) <= " + v), (lp.hi, v + " < ({})")):  # one kept if the other is not
                try:
                    cons.append(fmt.format(aff(bound, names)))
                except NonAffine:
                    self.exact[st.name] = False
                    self.note(f"a bound of loop {lp.var.name} around statement {st.name} is not affine; "
                              "the analysis assumes the loop may run any iteration past it")
        for c in self.program.assume:  # the sizes every call meets (Schedule.assume)
            cons.append(cond(c, names))
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
        return _exists([names.env[lp.var] for lp in info.loops], " and ".join(cons) if cons else "1 = 1")

    def prefix(self) -> str:
        return params_text(self.params)

    def domain_text(self) -> str:
        parts = []
        for info in self.infos:
            inst, names, cons = self._instance(info)
            parts.append(f"{inst} : {self._exists(info, names, cons)}")
        return "{ " + "; ".join(parts) + " }"

    def schedule_text(self, only: set[str] | None = None) -> str:
        return "{ " + "; ".join(t for _, t in self.schedule_parts(only)) + " }"

    def schedule_parts(self, only: set[str] | None = None) -> list[tuple[StmtInfo, str]]:
        """Per statement occurrence (textual order), the isl text of its piece of the schedule."""
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
            parts.append((info, f"{inst} -> [{', '.join(ts)}] : {self._exists(info, names, cons + tcons)}"))
        return parts

    def access_texts(self, only: frozenset[Buffer] | None = None) -> tuple[str, str, str]:
        """(reads, exact writes, inexact writes) as isl text (each intersected with the domain later); `only`: the
        accesses of those buffers alone."""
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
            inst, lnames, lcons = self._instance(info)
            names = _Names(self.params)  # the access table: indices are in the iteration variables
            for v, n in zip(st.iters, self.iter_names(st)):
                names.env[v] = n
                names.taken.add(n)
            for buf, idx, what in _accessed(st):
                if only is not None and buf not in only:
                    continue
                try:
                    text, ok = self._access(info, inst, bname(buf), buf, [aff(i, names) for i in idx], lnames,
                                            lcons), True
                except NonAffine:
                    self.note(f"statement {st.name} {what} {buf.name} at a non-affine index; "
                              f"the analysis assumes it may {what.rstrip('s')} any element of {buf.name}")
                    text, ok = self._access(info, inst, bname(buf), buf, None, lnames, lcons, names), False
                if what == "reads":
                    reads.append(text)
                else:
                    (must if ok and self.exact.get(st.name, True) else may).append(text)
        self.bufnames = {v: k for k, v in bufnames.items()}
        wrap = lambda xs: "{ " + "; ".join(xs) + " }"  # noqa: E731
        return wrap(reads), wrap(must), wrap(may)

    def _access(self, info: StmtInfo, inst: str, bn: str, buf: Buffer, idx: list[str] | None, lnames: _Names,
                lcons: list[str], names: _Names | None = None) -> str:
        """`inst -> bn[idx]`; idx None: any element of the buffer (bounded by its shape when affine).
        A scratch buffer's element is prefixed by its allocation instance (see the module docstring)."""
        # private(S[i] -> B[x]) = S[i] -> B[a, L(i), x]: a scratch element is one allocation instance's copy
        site = info.alloc_of(buf)
        rank = len(buf.shape) if idx is None else len(idx)
        es = [f"e{k}" for k in range(rank)]
        cons: list[str] = []
        if idx is None:
            assert names is not None
            for d, s in zip(es, buf.shape):
                try:
                    cons.append(f"0 <= {d} < ({aff(s, names)})")
                except NonAffine:
                    pass
        else:
            cons = [f"{d} = ({x})" for d, x in zip(es, idx)]
        if site is None:
            return f"{inst} -> {bn}[{', '.join(es)}]" + (f" : {' and '.join(cons)}" if cons else "")
        ps = [f"p{k}" for k in range(len(site.loops) + 1)]
        pcons = [f"p0 = {site.ident}"] + [f"{p} = {lnames.env[info.loops[k].var]}"
                                          for p, k in zip(ps[1:], site.loops)]
        return f"{inst} -> {bn}[{', '.join(ps + es)}] : {self._exists(info, lnames, lcons + pcons + cons)}"

    def alloc_texts(self, buffers: set[Buffer] | None = None) -> tuple[dict[Buffer, str], list[tuple[str, Buffer]]]:
        """Per scratch buffer, `{ S[iters] -> A[a, L_1, .., L_D] }` (the allocation instance of every
        instance of a statement that accesses it, loop values padded with 0 to a common length), and
        the (statement, buffer) pairs where a buffer of `buffers` is accessed outside any allocation."""
        sites: dict[Buffer, list[tuple[StmtInfo, AllocSite]]] = {}
        outside: list[tuple[str, Buffer]] = []
        for info in self.infos:
            for buf in dict.fromkeys(b for b, _, _ in _accessed(info.store)):
                site = info.alloc_of(buf)
                if site is not None:
                    sites.setdefault(buf, []).append((info, site))
                elif buffers is not None and buf in buffers:
                    outside.append((info.store.name, buf))
        out: dict[Buffer, str] = {}
        for buf, uses in sites.items():
            width = 1 + max(len(s.loops) for _, s in uses)
            parts = []
            for info, site in uses:
                inst, names, cons = self._instance(info)
                ps = [f"p{k}" for k in range(width)]
                vals = [str(site.ident)] + [names.env[info.loops[k].var] for k in site.loops]
                vals += ["0"] * (width - len(vals))
                eqs = [f"{p} = {v}" for p, v in zip(ps, vals)]
                parts.append(f"{inst} -> A[{', '.join(ps)}] : {self._exists(info, names, cons + eqs)}")
            out[buf] = "{ " + "; ".join(parts) + " }"
        return out, outside


def _parse_union_map(b: _Builder, text: str) -> isl.UnionMap:
    return parse_union_map(b.prefix() + text)


# False: every analysis from scratch, as before the caches (parsed texts, schedules per program, schedule trees,
# dependences derived or tested on memory-based pairs, remembered accepts); tests compare the two ways
ANALYSIS_CACHE = True

# isl text -> its UnionMap: consecutive steps describe most statements by the same text (a step changes one
# nest, or only a loop's kind), and parsing (eliminating the loop existentials) is the costly part. isl objects
# are values (every operation returns a new one), so one parsed object can serve every caller.
_PARSED: OrderedDict[str, isl.UnionMap] = OrderedDict()


def parse_union_map(text: str) -> isl.UnionMap:
    if not ANALYSIS_CACHE:
        return isl.UnionMap(text)
    hit = _PARSED.get(text)
    if hit is not None:
        return hit
    um = isl.UnionMap(text)
    _PARSED[text] = um
    _trim(_PARSED, 512)
    return um


def _trim(cache: OrderedDict[Any, Any], size: int) -> None:
    """Drop the oldest entries beyond `size` (another thread may be trimming too: never fails)."""
    while len(cache) > size:
        try:
            cache.popitem(last=False)
        except KeyError:
            return


def isl_domain(program: Program) -> isl.UnionSet:
    """The statement domains of `program` over original instance spaces."""
    b = _Builder(program)
    text = b.domain_text()
    return isl.UnionSet(b.prefix() + text)


def schedule_map(program: Program, only: set[str] | None = None, notes: list[str] | None = None) -> isl.UnionMap:
    """The current nest's schedule as a relation S[iters] -> [time] (common length, textual-order dims).

    Non-affine loop bounds, guards or coords are dropped (over-approximation) and described in `notes`.
    Parsed once per program (`_schedule_pieces`); `only` selects the pieces of those statements."""
    pieces = _schedule_pieces(program) if ANALYSIS_CACHE else None
    if pieces is None:  # two statements share an isl name (never after lowering), or no caching: parse the text
        b = _Builder(program, notes)
        return _parse_union_map(b, b.schedule_text(only))
    full, per_stmt, space = pieces
    out = None
    for name, (m, stmt_notes, _) in per_stmt.items():
        if only is not None and name not in only:
            continue
        out = m if out is None else out.union(m)
        if notes is not None:
            notes.extend(n for n in stmt_notes if n not in notes)
    if only is None:
        return full
    return out if out is not None else isl.UnionMap.empty(space)


# program -> (the whole schedule, {statement: (its pieces, its notes, their text)}, the params space); kept while the
# program object lives in the cache (identity checked), so every check of one step (and the dependence
# analysis) parses a program's schedule once. Exact: a piece is the same isl text parsed alone or within
# the whole (the union of per-statement relations), and notes are per statement, in textual order.
_SCHED_CACHE: OrderedDict[int, tuple[Program, Any]] = OrderedDict()


def _schedule_pieces(program: Program) -> Any:
    hit = _SCHED_CACHE.get(id(program))
    if hit is not None and hit[0] is program:
        return hit[1]
    b = _Builder(program)
    names = list(dict.fromkeys(i.store.name for i in b.infos))
    value: Any = None
    if len({_sanitize(n) for n in names}) == len(names):
        per_stmt: dict[str, tuple[isl.UnionMap, list[str], str]] = {}
        full = None
        for name in names:
            b.notes = []  # this statement's notes, as a builder analysing it alone reports them
            text = b.prefix() + "{ " + "; ".join(t for _, t in b.schedule_parts({name})) + " }"
            m = parse_union_map(text)
            per_stmt[name] = (m, b.notes, text)
            full = m if full is None else full.union(m)
        space = isl.UnionMap(b.prefix() + "{ }").get_space()
        value = (full if full is not None else isl.UnionMap.empty(space), per_stmt, space)
    _SCHED_CACHE[id(program)] = (program, value)
    _trim(_SCHED_CACHE, 64)
    return value


def schedule_tree(program: Program, infos: list[StmtInfo] | None = None) -> isl.Schedule | None:
    """The schedule of `program` as an isl schedule tree, or None where it has none (an instance run at several
    times, a loop position that is not a function of the instance, a statement at two places).

    Same order as `schedule_map`: the flat time [b0, l0, b1, l1, ..., bk] compares two instances at their
    first differing entry; the tree compares them by textual position (a sequence node per level: the
    b entries) and then by the value of the loop they share (a band: the l entries), level by level."""
    pieces = _schedule_pieces(program)
    if pieces is None:
        return None
    per_stmt = pieces[1]
    infos = stmt_infos(program) if infos is None else infos
    if len({i.store.name for i in infos}) != len(infos) or not infos:
        return None
    width = 2 * max(len(i.loops) for i in infos) + 1

    def stmt_map(info: StmtInfo) -> isl.Map:
        ml = per_stmt[info.store.name][0].get_map_list()
        return ml.get_at(0)

    def level(group: list[StmtInfo], k: int) -> isl.Schedule:
        children: dict[int, list[StmtInfo]] = {}
        for info in group:
            children.setdefault(info.betas[k], []).append(info)
        out = None
        for pos in sorted(children):
            g = children[pos]
            if len(g[0].loops) == k:  # a statement at this position (the only one there)
                node = isl.Schedule.from_domain(isl.UnionSet.from_set(stmt_map(g[0]).domain()))
            else:  # a loop: its value (time dimension 2k + 1) as the band, then its body
                band = None
                for info in g:
                    m = stmt_map(info)
                    m = m.project_out(isl.dim_type.out, 2 * k + 2, width - 2 * k - 2)
                    m = m.project_out(isl.dim_type.out, 0, 2 * k + 1)
                    um = isl.UnionMap.from_map(m)
                    band = um if band is None else band.union(um)
                assert band is not None
                node = level(g, k + 1).insert_partial_schedule(isl.MultiUnionPwAff.from_union_map(band))
            out = node if out is None else out.sequence(node)
        assert out is not None
        return out

    try:
        if any(per_stmt[i.store.name][0].get_map_list().n_map() != 1 for i in infos):
            return None
        return level(infos, 0)
    except isl.Error:  # multi-valued times (recomputed instances, over-approximated loops): no tree
        return None


def rename_map(old: Program, new: Program) -> isl.UnionMap | None:
    """{ S_old[iters] -> S_new[iters'] } relating each instance of `old` to the same instance of `new` when
    `new` names its statements' instances differently (a statement re-based onto its loops: its iters
    are now loop variables around it in `old`), or None when that is not the case for every statement
    (a statement added, dropped or run at two places; an iteration variable that is no loop of `old`)."""
    b, nb = _Builder(old), _Builder(new)
    old_infos = {i.store.name: i for i in b.infos}
    new_infos = {i.store.name: i for i in nb.infos}
    if len(old_infos) != len(b.infos) or len(new_infos) != len(nb.infos) or set(old_infos) != set(new_infos):
        return None
    parts = []
    try:
        for name, info in old_infos.items():
            st, nst = info.store, new_infos[name].store
            inst, names, cons = b._instance(info)
            if len(nst.iters) == len(st.iters) and all(a is c for a, c in zip(nst.iters, st.iters)):
                parts.append(f"{inst} -> {inst} : {b._exists(info, names, cons)}")
                continue
            around = {lp.var for lp in info.loops}
            if any(v not in around for v in nst.iters):
                return None
            outs = [f"n{k}" for k in range(len(nst.iters))]
            eqs = [f"{o} = {names.env[v]}" for o, v in zip(outs, nst.iters)]
            parts.append(f"{inst} -> {_sanitize(name)}[{', '.join(outs)}] : {b._exists(info, names, cons + eqs)}")
    except NonAffine:
        return None
    if b.notes:
        return None
    return _parse_union_map(b, "{ " + "; ".join(parts) + " }")
