"""Exact barrier placement: every cross-thread dependence of a block is ordered by a `Barrier`.

Formal condition. Let BT(s) be an instance's *block time*: its schedule time vector with the
dimensions of thread-bound and cooperative loops dropped (the order in which a block's threads,
running in lockstep, reach it). For every pair of conflicting accesses (same element, one a write;
`local` buffers excluded) by instances s, t of one kernel with BT(s) ≺ BT(t):
  - different blocks                                → refused (`CrossBlockRaceError`, with a witness);
  - same block, possibly different threads          → some barrier runs after s and before t.
Pairs on one thread are ordered by the thread's own program order and need nothing.

The first dimension where BT(s) and BT(t) differ names one loop body (or the kernel's root):
  textual:  s in child a, t in child b > a of that body, same iteration  → a barrier in a gap (a, b);
  carried:  s in child a at an earlier iteration of the loop than t in b → a barrier after a or before b.
Per body, the fewest barriers hitting every such interval are chosen greedily (earliest-deadline
order, each placed right after its source: optimal for intervals), counting the barriers already
there and the synchronisation inside a cross-thread reduction (its threads meet after their shares
are read and before the total is stored). A barrier must stand in lockstep control flow
(`gpu_model`); when one would be needed elsewhere the build is refused with the two statements.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import islpy as isl

from loopir import nodes as N
from loopir.affine import eval_index, row_major
from loopir.isl_conv import NonAffine, _Names, aff
from loopir.poly_model import StmtInfo, _accessed, _Builder
from loopir.gpu import is_block_loop, is_thread_loop, reduction_parts, reduction_stores
from loopir.visit import loops_of, subst_coords, substitute, walk

from .kernels import map_kernels
from .gpu_model import (
    BLOCK_AXES,
    THREAD_AXES,
    KernelModel,
    kernel_model,
)


class BarrierError(ValueError):
    """A kernel needs a block barrier where none can stand (thread-dependent control flow)."""


class CrossBlockRaceError(ValueError):
    """Two blocks of one kernel touch one element, one of them writing: no barrier can order them.

    `source`/`sink` are `(statement, {iteration variable: value})`, `blocks` their block coordinates,
    `params` the sizes at which it happens."""

    def __init__(self, message: str, buffer: str, source: tuple[str, dict[str, int]],
                 sink: tuple[str, dict[str, int]], blocks: tuple[dict[str, int], dict[str, int]],
                 params: dict[str, int]) -> None:
        super().__init__(message)
        self.buffer, self.source, self.sink, self.blocks, self.params = buffer, source, sink, blocks, params


# ----------------------------------------------------------------------------- the pass


def place_barriers(program: N.Program) -> N.Program:
    """Insert the fewest block barriers that order every cross-thread dependence of each kernel.

    legal iff every conflicting pair s, t of one block with BT(s) ≺ BT(t) on different threads has a barrier
    between them in lockstep control flow, and no conflicting pair spans two blocks of one kernel."""
    def place(k: N.Stmt) -> N.Stmt:
        if not isinstance(k, N.Kernel) or not any(f.kind == "thread" for f in loops_of(k.body)):
            return k
        body = _Kernel(program, k).run()
        return k if body is k.body else dataclasses.replace(k, body=body)

    return map_kernels(program, place)


@dataclass(frozen=True)
class _Access:
    """One tuple of the kernel's isl model: a statement's accesses of one role."""

    tag: str  # isl tuple name
    info: StmtInfo
    role: str  # "plain" | "share" (reduction operand loads) | "final" (the reduction's C[idx] update)
    red_loop: N.For | None


@dataclass
class _Req:
    body: int  # id of the loop whose body holds the gap, or 0 for the kernel root
    kind: str  # "textual" | "carried"
    a: int
    b: int
    src: str
    snk: str
    buffer: str

    @property
    def key(self) -> tuple[int, str, int, int]:
        return (self.body, self.kind, self.a, self.b)


def _met(r: _Req, points: list[float]) -> bool:
    """A synchronisation point among `points` separates the requirement's source child from its sink child."""
    if r.kind == "textual":
        return any(r.a < p < r.b for p in points)
    return any(p > r.a or p < r.b for p in points)


class _Kernel:
    def __init__(self, program: N.Program, kernel: N.Kernel) -> None:
        self.nest = kernel.body
        self.kern = kernel
        self.sub = dataclasses.replace(program, body=self.nest)
        self.b = _Builder(self.sub)
        self.model: KernelModel = kernel_model(kernel)
        self.loops_by_id = {id(f): f for f in loops_of(self.nest)}
        self._rels: dict[str, isl.Map] = {}
        self._maps: dict[str, isl.UnionMap] = {}
        self._known: set[tuple[int, str, int, int]] = set()
        self._sync: dict[int, tuple[int, list[float]]] = {}

    # ---------------------------------------------------------------- isl model
    def _tuples(self) -> list[_Access]:
        red_of: dict[int, N.For] = {}
        for f in loops_of(self.nest):
            if f.var in self.model.reduction_loops:
                for st in reduction_stores(f):
                    if reduction_parts(st) is not None:
                        red_of[id(st)] = f
        out = []
        for k, info in enumerate(self.b.infos):
            lp = red_of.get(id(info.store))
            if lp is None:
                out.append(_Access(f"s{k}", info, "plain", None))
            else:
                out += [_Access(f"s{k}", info, "share", lp), _Access(f"f{k}", info, "final", lp)]
        return out

    def _inst(self, acc: _Access) -> tuple[str, _Names, list[str], Callable[[list[str]], str]]:
        """The tuple's instance `tag[..]`, its loops' name table, its constraints (`_Builder._instance`), and how
        to close a formula over it. An instance whose iteration variables are affine in its loops is named by them
        (the loops existential). Otherwise (`collapse` of a symbolic extent: i = f // n) it is named by its loop
        values and then its iteration variables, tied where the coords are affine: named by the iteration
        variables alone, which would not determine the loops in isl, every instance could run in every block
        (the flat offsets of `_flat_offsets` are affine in the loops)."""
        info = acc.info
        inst, names, cons = self.b._instance(info)
        if self.b.exact.get(info.store.name, True) or not info.loops:
            return (acc.tag + inst[inst.index("["):], names, cons,
                    lambda more: self.b._exists(info, names, more))
        dims = ", ".join([*(names.env[lp.var] for lp in info.loops), *self.b.iter_names(info.store)])
        return f"{acc.tag}[{dims}]", names, cons, lambda more: " and ".join(more) or "1 = 1"

    def _position(self, acc: _Access) -> tuple[str, int]:
        """`tag[iters] -> [loops..., tx, ty, tz, bx, by, bz]`; -1 on an axis: any/every thread (block)."""
        info = acc.info
        inst, names, cons, ex = self._inst(acc)
        lvals = [names.env[lp.var] for lp in info.loops]
        coop = any(self.model.is_coop(lp, any(is_thread_loop(x) for x in info.loops[:j]))
                   for j, lp in enumerate(info.loops))
        rmw0 = info.store.name in self.model.kernel.single_thread  # decided by plan_kernels
        coords = []
        for axes, used in ((THREAD_AXES, self.model.thread_axes), (BLOCK_AXES, self.model.block_axes)):
            for ax in axes:
                lp = next((x for x in info.loops if x.kind == "thread" and x.thread == ax), None)
                if ax not in used:
                    coords.append("0")
                elif axes is THREAD_AXES and (coop or acc.role == "final"):
                    coords.append("-1")
                elif axes is THREAD_AXES and rmw0:
                    coords.append("0")  # a read-modify-write outside thread loops runs on thread 0 only
                elif lp is None:
                    coords.append("-1")
                else:
                    try:
                        coords.append(f"({names.env[lp.var]}) - ({aff(lp.lo, names)})")
                    except NonAffine:
                        coords.append("-1")
        outs = [f"o{j}" for j in range(len(lvals) + 6)]
        eqs = [f"{o} = {v}" for o, v in zip(outs, lvals + coords)]
        text = f"{inst} -> [{', '.join(outs)}] : {ex(cons + eqs)}"
        return "{ " + text + " }", len(lvals)

    def _accesses(self, acc: _Access) -> list[tuple[N.Buffer, tuple[N.Expr, ...] | None, str]]:
        st = acc.info.store
        out = []
        for buf, idx, what in _accessed(st):
            if buf.scope == "local" or buf.name in self.kern.forwarded:  # per thread, or read from registers only
                continue
            is_self = buf is st.buffer and tuple(idx) == tuple(st.indices)
            if acc.role == "plain" or (acc.role == "final") == is_self:
                out.append((buf, idx, what))
        return out

    def _iter_table(self, info: StmtInfo) -> _Names:
        """A name table of the statement's iteration variables (the variables of its access indices)."""
        names = _Names(self.b.params)
        for v, n in zip(info.store.iters, self.b.iter_names(info.store)):
            names.env[v] = n
            names.taken.add(n)
        return names

    def _flat_offsets(self, tuples: list[_Access]) -> dict[tuple[int, int], str]:
        """Per (tuple index, access index), the access's row-major element offset as isl text in the loop
        variables, for every access of each buffer that the indexed form cannot place exactly (a statement whose
        coords are not affine, after `collapse` of a symbolic extent: i = f // n, j = f % n) but whose every
        access in the kernel has an affine offset (x[i, j] of an n-wide array is x[f], `row_major`).

        Exact: offsets of in-bounds indices are equal iff the indices are, so the flat model of a buffer has the
        conflicts of the indexed one, where the indexed model would take every element as conflicting."""
        per_buf: dict[int, list[tuple[tuple[int, int], str | None, bool]]] = {}
        for k, acc in enumerate(tuples):
            info = acc.info
            _, lnames, _ = self.b._instance(info)
            exact = self.b.exact.get(info.store.name, True)
            coords = subst_coords(info.store)
            names = self._iter_table(info)
            for j, (buf, idx, _) in enumerate(self._accesses(acc)):
                try:
                    flat = aff(row_major(buf.shape, tuple(substitute(i, coords) for i in idx)), lnames)
                except NonAffine:
                    flat = None
                try:
                    indexed = exact and all(aff(i, names) is not None for i in idx)
                except NonAffine:
                    indexed = False
                per_buf.setdefault(id(buf), []).append(((k, j), flat, indexed))
        out: dict[tuple[int, int], str] = {}
        for accs in per_buf.values():
            if all(f is not None for _, f, _ in accs) and not all(ok for _, _, ok in accs):
                out.update({key: f for key, f, _ in accs})  # type: ignore[misc]
        return out

    def _access_maps(self, tuples: list[_Access]) -> dict[tuple[str, str], isl.UnionMap]:
        """{(scope, "reads"|"writes"): tag[iters] -> Buf[index]} over the kernel's domain (Buf[offset] for the
        buffers of `_flat_offsets`)."""
        texts: dict[tuple[str, str], list[str]] = {}
        bnames: dict[int, str] = {}
        flat = self._flat_offsets(tuples)
        for k, acc in enumerate(tuples):
            info = acc.info
            inst, lnames, lcons, close = self._inst(acc)
            names = self._iter_table(info)
            ex = close(lcons)
            for j, (buf, idx, what) in enumerate(self._accesses(acc)):
                bn = bnames.setdefault(id(buf), f"B{len(bnames)}")
                if (k, j) in flat:
                    body = close([*lcons, f"e0 = ({flat[k, j]})"])
                    texts.setdefault((buf.scope, what), []).append(f"{inst} -> {bn}[e0] : {body}")
                    continue
                try:
                    es = [aff(i, names) for i in idx]  # type: ignore[union-attr]
                    cons = [f"e{j} = ({x})" for j, x in enumerate(es)]
                except NonAffine:
                    cons = []  # any element: over-approximation, never a missed barrier
                elems = ", ".join(f"e{j}" for j in range(len(buf.shape)))
                body = " and ".join([ex, *cons])
                texts.setdefault((buf.scope, what), []).append(f"{inst} -> {bn}[{elems}] : {body}")
        self.bufname = {v: k for k, v in bnames.items()}
        return {key: isl.UnionMap(self.b.prefix() + "{ " + "; ".join(ts) + " }") for key, ts in texts.items()}

    # ---------------------------------------------------------------- analysis
    def run(self) -> N.Stmt:
        tuples = self._tuples()
        if not tuples:
            return self.nest
        by_tag = {t.tag: t for t in tuples}
        maps = self._access_maps(tuples)
        pos = {t.tag: self._position(t) for t in tuples}
        pos = {k: (self.b.prefix() + text, n) for k, (text, n) in pos.items()}
        reqs: list[_Req] = []
        for scope in ("global", "shared"):
            w = maps.get((scope, "writes"))
            r = maps.get((scope, "reads"))
            if w is None:
                continue
            pairs = [("flow", w.apply_range(r.reverse()) if r is not None else None),
                     ("anti", r.apply_range(w.reverse()) if r is not None else None),
                     ("output", w.apply_range(w.reverse()))]
            for kind, um in pairs:
                if um is None or um.is_empty():
                    continue
                ml = um.get_map_list()
                for j in range(ml.n_map()):
                    m = ml.get_at(j)
                    s_tag, t_tag = m.get_tuple_name(isl.dim_type.in_), m.get_tuple_name(isl.dim_type.out)
                    s, t = by_tag[s_tag], by_tag[t_tag]
                    if self._synchronised(kind, s, t):
                        continue
                    reqs += self._pair(m, kind, scope, s, t, pos[s_tag], pos[t_tag])
        return self._place(reqs)

    def _every_thread(self, info: StmtInfo) -> bool:
        """A statement outside every thread loop that is not a thread-0 read-modify-write: every thread runs it."""
        return (not any(lp.kind in ("thread", "parallel") for lp in info.loops if not is_block_loop(lp))
                and info.store.name not in self.model.kernel.single_thread)

    def _synchronised(self, kind: str, s: _Access, t: _Access) -> bool:
        """Pairs ordered by a cross-thread reduction's own synchronisation (see gpu_model)."""
        if s.red_loop is not None and s.red_loop is t.red_loop:
            return True  # both inside one reduction: the all-reduce combines them
        if t.role == "final" and s.role == "plain" and self._every_thread(s.info):
            return True  # each thread stored the same value itself; the total is stored after the all-reduce
        if s.role == "share" and kind == "anti" and self.model.block_sync:
            return True  # shares are read before the all-reduce that every later statement follows
        return False

    def _pair(self, m: isl.Map, kind: str, scope: str, s: _Access, t: _Access,
              ps: tuple[str, int], pt: tuple[str, int]) -> list[_Req]:
        ns, nt = ps[1], pt[1]
        la, lc = s.info.loops, t.info.loops
        common = 0
        while common < min(len(la), len(lc)) and la[common] is lc[common]:
            common += 1
        if scope != "global" and not self._open_levels(s, t, common):
            return []  # every barrier this pair could need is already there
        q = isl.UnionMap.from_map(m).apply_domain(self._umap(ps[0])).apply_range(self._umap(pt[0]))
        if q.is_empty():
            return []
        qm = q.get_map_list().get_at(0)
        space = qm.get_space()
        a = [f"qa{j}" for j in range(ns + 6)]
        c = [f"qc{j}" for j in range(nt + 6)]
        ta, ba = a[ns:ns + 3], a[ns + 3:]
        tc, bc = c[nt:nt + 3], c[nt + 3:]
        prefix = self.b.prefix()

        def rel(cond: str) -> isl.Map:
            text = f"{prefix}{{ [{', '.join(a)}] -> [{', '.join(c)}] : {cond} }}"
            if text not in self._rels:
                self._rels[text] = isl.Map(text)
            return self._rels[text].align_params(space)

        same_block = " and ".join(f"({x} = {y} or {x} = -1 or {y} = -1)" for x, y in zip(ba, bc))
        cross_thread = " or ".join(f"({x} < {y} or {x} > {y} or {x} = -1 or {y} = -1)" for x, y in zip(ta, tc))
        if scope == "global":
            other = " or ".join(f"({x} < {y} or {x} > {y} or {x} = -1 or {y} = -1)" for x, y in zip(ba, bc))
            if self.model.block_axes:
                cross = qm.intersect(rel(other))
                self._check_cross_block(cross, kind, s, t, ns, nt)
        if not self._open_levels(s, t, common):
            return []
        qc = qm.intersect(rel(f"({same_block}) and ({cross_thread})"))
        if qc.is_empty():
            return []
        eq: list[str] = []
        out: list[_Req] = []
        bname = self.bufname.get(m.get_tuple_name(isl.dim_type.out), "?")
        for k in range(common + 1):
            bs, bt = s.info.betas[k], t.info.betas[k]
            body = id(la[k - 1]) if k else 0
            if bs != bt:
                req = _Req(body, "textual", bs, bt, s.info.store.name, t.info.store.name, bname)
                if bs < bt and self._open(req) and not qc.intersect(rel(" and ".join(eq) or "1 = 1")).is_empty():
                    out.append(req)
                    self._known.add(req.key)
                break
            if k == common:
                break
            lp = la[k]
            if is_thread_loop(lp) or self.model.is_coop(lp, any(is_thread_loop(x) for x in la[:k])):
                continue  # not a dimension of block time
            if not is_block_loop(lp):
                cond = " and ".join([*eq, f"qa{k} < qc{k}"])
                req = _Req(id(lp), "carried", s.info.betas[k + 1], t.info.betas[k + 1],
                           s.info.store.name, t.info.store.name, bname)
                if self._open(req) and not qc.intersect(rel(cond)).is_empty():
                    out.append(req)
                    self._known.add(req.key)
            eq.append(f"qa{k} = qc{k}")
        return out

    def _candidates(self, s: _Access, t: _Access, common: int) -> list[_Req]:
        """The barrier requirements pair (s, t) could need, before asking isl which it does."""
        la = s.info.loops
        out = []
        for k in range(common + 1):
            bs, bt = s.info.betas[k], t.info.betas[k]
            if bs != bt:
                if bs < bt:
                    out.append(_Req(id(la[k - 1]) if k else 0, "textual", bs, bt, "", "", ""))
                break
            if k == common:
                break
            lp = la[k]
            if not (is_thread_loop(lp) or is_block_loop(lp)
                    or self.model.is_coop(lp, any(is_thread_loop(x) for x in la[:k]))):
                out.append(_Req(id(lp), "carried", s.info.betas[k + 1], t.info.betas[k + 1], "", "", ""))
        return out

    def _open_levels(self, s: _Access, t: _Access, common: int) -> bool:
        return any(self._open(r) for r in self._candidates(s, t, common))

    def _open(self, r: _Req) -> bool:
        """Not yet known to be needed, and not met by a barrier or reduction already in the body."""
        if r.key in self._known:
            return False
        if r.body not in self._sync:
            body = self.nest if r.body == 0 else self.loops_by_id[r.body].body
            self._sync[r.body] = _sync_points(body, self.model)
        return not _met(r, self._sync[r.body][1])

    def _umap(self, text: str) -> isl.UnionMap:
        if text not in self._maps:
            self._maps[text] = isl.UnionMap(text)
        return self._maps[text]

    def _check_cross_block(self, cross: isl.Map, kind: str, s: _Access, t: _Access, ns: int, nt: int) -> None:
        # refused iff some conflicting pair of one kernel runs in two different blocks
        if cross.is_empty():
            return
        if s.info is t.info and kind == "output" and self._redundant(s.info):
            return  # every block writes the same value: no block depends on another's write
        w = cross.wrap()
        try:
            pt = w.lexmin().sample_point()
        except isl.Error:
            pt = w.sample_point()
        vals = [int(pt.get_coordinate_val(isl.dim_type.set, j).to_python()) for j in range(ns + nt + 12)]
        sp = pt.get_space()
        params = {sp.get_dim_name(isl.dim_type.param, j): int(pt.get_coordinate_val(isl.dim_type.param, j).to_python())
                  for j in range(sp.dim(isl.dim_type.param))}
        src = self._instance_at(s, vals[:ns])
        snk = self._instance_at(t, vals[ns + 6:ns + 6 + nt])
        blk = lambda xs: {ax: v for ax, v in zip(BLOCK_AXES, xs) if ax in self.model.block_axes}  # noqa: E731
        bs, bt = blk(vals[ns + 3:ns + 6]), blk(vals[ns + 6 + nt + 3:])
        what = {"flow": ("writes", "reads"), "anti": ("reads", "writes"), "output": ("writes", "writes")}[kind]
        buf = next((b.name for b, _, w2 in self._accesses(t) if w2 == ("writes" if kind != "flow" else "reads")), "?")
        fmt = lambda n, e: f"{n}[{', '.join(f'{k}={v}' for k, v in e.items())}]"  # noqa: E731
        msg = (f"kernel of statements {', '.join(dict.fromkeys(i.store.name for i in self.b.infos))}: "
               f"{fmt(*src)} in block {bs} {what[0]} an element of {buf!r} that {fmt(*snk)} in block {bt} "
               f"{what[1]}{' (at ' + ', '.join(f'{k}={v}' for k, v in params.items()) + ')' if params else ''}; "
               "blocks of one kernel never synchronise, so no barrier can order them. Keep both instances in "
               "one block (bind another loop to blockIdx), or split the kernel with a serial loop outside the "
               "blockIdx loops (it becomes a host loop of launches).")
        raise CrossBlockRaceError(msg, buf, src, snk, (bs, bt), params)

    def _instance_at(self, acc: _Access, loop_vals: list[int]) -> tuple[str, dict[str, int]]:
        env: dict[N.Var, int] = {lp.var: v for lp, v in zip(acc.info.loops, loop_vals)}
        st = acc.info.store
        out = {}
        for v, c in zip(st.iters, st.coords):
            try:
                out[v.name] = eval_index(c, env)
            except (KeyError, ValueError):
                pass
        return st.name, out

    @staticmethod
    def _redundant(info: StmtInfo) -> bool:
        """A statement outside every block loop: each block stores the same value, a benign overlap."""
        return not any(is_block_loop(lp) for lp in info.loops)

    # ---------------------------------------------------------------- placement
    def _place(self, reqs: list[_Req]) -> N.Stmt:
        if not reqs:
            return self.nest
        by_body: dict[int, list[_Req]] = {}
        for r in reqs:
            by_body.setdefault(r.body, []).append(r)
        gaps: dict[int, set[int]] = {}
        for body_id, rs in by_body.items():
            body = self.nest if body_id == 0 else self.loops_by_id[body_id].body
            self._check_lockstep(body_id, rs)
            n, have = _sync_points(body, self.model)
            chosen: list[float] = []
            points = list(have)
            # earliest-deadline greedy mirrored: sources latest first, each barrier right after its source
            for r in sorted((r for r in rs if r.kind == "textual"), key=lambda r: -r.a):
                if not _met(r, points):
                    p = r.a + 0.5
                    points.append(p)
                    chosen.append(p)
            for r in (r for r in rs if r.kind == "carried"):
                if not _met(r, points):
                    p = n - 0.5
                    points.append(p)
                    chosen.append(p)
            if chosen:
                gaps[body_id] = {int(p + 0.5) for p in chosen}
        if not gaps:
            return self.nest
        return _insert(self.nest, gaps)

    def _check_lockstep(self, body_id: int, rs: list[_Req]) -> None:
        path = _path_to(self.nest, body_id) if body_id else []
        inside_thread = False
        for node in path:
            bad = None
            if isinstance(node, N.For):
                if not (self.model.uniform(node.lo) and self.model.uniform(node.hi)) and node.kind != "thread":
                    bad = f"the bounds of loop {node.var.name!r} depend on the thread"
                elif self.model.is_coop(node, inside_thread):
                    bad = f"loop {node.var.name!r} spreads its iterations over the block's threads"
                inside_thread = inside_thread or is_thread_loop(node)
            if bad:
                r = rs[0]
                raise BarrierError(
                    f"statements {r.src!r} and {r.snk!r} communicate through {r.buffer!r} across threads of one "
                    f"block, so a block barrier must separate them, but {bad}: threads may not all reach a barrier "
                    "there. Bind the loops so that the thread loop's extent equals the block size (split by the "
                    "block size), or move the communicating statements out of the thread-dependent region.")


def _path_to(nest: N.Stmt, loop_id: int) -> list[N.Stmt]:
    """The nodes from the kernel root down to (and including) the loop `loop_id`."""
    def go(s: N.Stmt, acc: list[N.Stmt]) -> list[N.Stmt] | None:
        acc = acc + [s]
        if isinstance(s, N.For) and id(s) == loop_id:
            return acc
        kids: list[N.Stmt] = []
        if isinstance(s, N.Seq):
            kids = list(s.body)
        elif isinstance(s, (N.For, N.Allocate)):
            kids = [s.body]
        elif isinstance(s, N.If):
            kids = [s.then] + ([s.orelse] if s.orelse is not None else [])
        for k in kids:
            r = go(k, acc)
            if r is not None:
                return r
        return None

    return go(nest, []) or []


def _sync_points(body: N.Stmt, model: KernelModel) -> tuple[int, list[float]]:
    """(number of counted children, synchronisation points) of a loop body: an existing barrier before child g
    is at g - 0.5, a cross-thread reduction at child c synchronises at c (inside it)."""
    pts: list[float] = []
    ctr = [0]

    def go(s: N.Stmt, in_if: bool) -> None:
        if isinstance(s, N.Seq):
            for c in s.body:
                go(c, in_if)
        elif isinstance(s, N.Allocate):
            go(s.body, in_if)
        elif isinstance(s, N.If):
            go(s.then, True)
            if s.orelse is not None:
                go(s.orelse, True)
        elif isinstance(s, N.Barrier):
            if not in_if:
                pts.append(ctr[0] - 0.5)
        elif isinstance(s, (N.Store, N.For)):
            if isinstance(s, N.For) and s.var in model.reduction_loops and model.block_sync and not in_if:
                pts.append(float(ctr[0]))
            ctr[0] += 1

    go(body, False)
    return ctr[0], pts


def _insert(nest: N.Stmt, gaps: dict[int, set[int]]) -> N.Stmt:
    """`nest` with a Barrier before child g (g == number of children: at the end) of each listed body."""
    def in_body(body: N.Stmt, want: set[int]) -> N.Stmt:
        ctr = [0]
        done: set[int] = set()

        def go(s: N.Stmt) -> N.Stmt:
            if isinstance(s, N.Seq):
                items: list[N.Stmt] = []
                for c in s.body:
                    if ctr[0] in want and ctr[0] not in done and isinstance(c, (N.Store, N.For, N.If, N.Allocate)):
                        if _first_counted(c):
                            items.append(N.Barrier())
                            done.add(ctr[0])
                    items.append(go(c))
                return N.Seq(tuple(items))
            if isinstance(s, N.Allocate):
                return dataclasses.replace(s, body=go(s.body))
            if isinstance(s, N.If):
                # a condition on the thread becomes a predicate around a barrier (every thread reaches it)
                then = go(_as_seq(s.then))
                orelse = go(_as_seq(s.orelse)) if s.orelse is not None else None
                return dataclasses.replace(s, then=then, orelse=orelse)
            if isinstance(s, (N.Store, N.For)):
                ctr[0] += 1
            return s

        out = go(_as_seq(body))
        if ctr[0] in want and ctr[0] not in done:
            out = N.Seq((*out.body, N.Barrier())) if isinstance(out, N.Seq) else N.Seq((out, N.Barrier()))
        return out

    def rebuild(s: N.Stmt) -> N.Stmt:
        if isinstance(s, N.For):
            body = rebuild_tree(s.body)
            if id(s) in gaps:
                body = in_body(body, gaps[id(s)])
            return s if body is s.body else dataclasses.replace(s, body=body)
        return s

    def rebuild_tree(s: N.Stmt) -> N.Stmt:
        if isinstance(s, N.For):
            return rebuild(s)
        if isinstance(s, N.Seq):
            body = tuple(rebuild_tree(c) for c in s.body)
            return s if all(a is b for a, b in zip(body, s.body)) else N.Seq(body)
        if isinstance(s, N.Allocate):
            b = rebuild_tree(s.body)
            return s if b is s.body else dataclasses.replace(s, body=b)
        if isinstance(s, N.If):
            t = rebuild_tree(s.then)
            o = rebuild_tree(s.orelse) if s.orelse is not None else None
            return s if t is s.then and o is s.orelse else dataclasses.replace(s, then=t, orelse=o)
        return s

    root = rebuild_tree(nest)
    if 0 in gaps:
        root = in_body(root, gaps[0])
    return _unwrap(root)


def _as_seq(s: N.Stmt) -> N.Seq:
    return s if isinstance(s, N.Seq) else N.Seq((s,))


def _unwrap(s: N.Stmt) -> N.Stmt:
    return s.body[0] if isinstance(s, N.Seq) and len(s.body) == 1 else s


def _first_counted(s: N.Stmt) -> bool:
    """True when `s` holds a counted child (Store/For), i.e. a barrier before it precedes that child."""
    return any(isinstance(n, (N.Store, N.For)) for n in walk(s))


__all__ = ["place_barriers", "BarrierError", "CrossBlockRaceError"]
