"""Compute placement: `compute_inline` and `compute_at`.

compute_inline — the producer's expression replaces every load of its buffer:

    for i in 0..n: B[i] = A[i] * 2                 for j in 1..n-1:
    for j in 1..n-1: C[j] = B[j-1] + B[j+1]  ==>       C[j] = A[j-1] * 2 + A[j+1] * 2

compute_at — the producer runs inside the consumer's loop, over exactly the region the
consumer needs in one iteration of that loop (isl footprint, clipped to the producer's
own domain); overlapping regions are recomputed:

    for i in 0..n: B[i] = A[i] * 2                 for jo in 0..(n-2+3)//4:
    for jo in 0..(n-2+3)//4:                  ==>      for b in 0..(hi - lo): B[...] = ...   # i = b + lo
        for ji in 0..4: C[...] = B[j-1] + B[j+1]       for ji in 0..4: C[...] = ...

    with lo = max(4*jo, 0) and hi = min(4*jo + 5, n) (the halo of jo's block).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import islpy as isl

from loopir import poly
from loopir.affine import const_diff, same_value, simplify
from loopir.dtypes import INDEX
from loopir.errors import ArgumentError, ArgumentTypeError, NotFoundError
from loopir.footprint import simplify_in_context
from loopir.nodes import Allocate, Buffer, Const, Expr, For, If, Load, Program, Seq, Stmt, Store, Var, binary
from loopir.visit import StmtContext, Transformer, buffers_of, map_stmts, seq, statements, substitute, walk

from . import find_loop_path, find_path, fresh_name, primitive
from .loop_fusion import replace_at

# ----------------------------------------------------------------------------- producer lookup


def producer_buffer(program: Program, producer: Any) -> Buffer:
    """The buffer named by `producer`: a Buffer, a te.Tensor (its `.buffer`), a buffer or statement name."""
    if hasattr(producer, "buffer") and isinstance(producer.buffer, Buffer):
        producer = producer.buffer
    ctxs = statements(program)
    if isinstance(producer, Buffer):
        return producer
    if isinstance(producer, str):
        for c in ctxs:
            if c.store.name == producer or c.store.buffer.name == producer:
                return c.store.buffer
        raise NotFoundError(f"no statement or buffer named {producer!r} in program {program.name!r}")
    raise ArgumentTypeError(f"expected a tensor, buffer or statement name, got {type(producer).__name__} {producer!r}")


def writers(program: Program, buf: Buffer) -> list[StmtContext]:
    return [c for c in statements(program) if c.store.buffer is buf]


def readers(program: Program, buf: Buffer, exclude: set[str] = frozenset()) -> list[StmtContext]:
    return [c for c in statements(program) if c.store.name not in exclude and buf in buffers_of(c.store)[0]]


def _reads_in_control(program: Program, buf: Buffer) -> bool:
    """True when `buf` is loaded in a loop bound or a guard (not in a statement)."""

    def go(s: Stmt) -> bool:
        if isinstance(s, For):
            return _loads(s.lo, buf) or _loads(s.hi, buf) or go(s.body)
        if isinstance(s, If):
            return _loads(s.cond, buf) or go(s.then) or (s.orelse is not None and go(s.orelse))
        if isinstance(s, Seq):
            return any(go(c) for c in s.body)
        if hasattr(s, "body") and isinstance(s.body, Stmt):
            return go(s.body)
        return False

    return go(program.body)


def _loads(e: Expr, buf: Buffer) -> bool:
    return any(isinstance(n, Load) and n.buffer is buf for n in walk(e))


def _index_iters(st: Store, primitive: str) -> list[int]:
    """For each buffer dimension d, the position k in `st.iters` with indices[d] == iters[k]."""
    out: list[int] = []
    for d, ix in enumerate(st.indices):
        if not isinstance(ix, Var) or not any(ix is v for v in st.iters):
            raise ArgumentError(
                f"{primitive}: statement {st.name!r} writes {st.buffer.name}[{', '.join(map(str, st.indices))}]; "
                f"index {d} ({ix}) is not one of its loop variables, so its region cannot be mapped back"
            )
        k = next(k for k, v in enumerate(st.iters) if v is ix)
        if k in out:
            raise ArgumentError(f"{primitive}: statement {st.name!r} uses loop variable {ix} in two indices")
        out.append(k)
    return out


def _is_output(program: Program, buf: Buffer) -> bool:
    return any(a is buf for a in program.args)


# ----------------------------------------------------------------------------- compute_inline


@dataclass(frozen=True)
class InlinePlan:
    """What `compute_inline` did: the producer statement and the statements it was inlined into."""

    producer: Store
    consumers: tuple[str, ...]


def compute_inline(program: Program, producer: Any) -> tuple[Program, InlinePlan]:
    """Inline a pure producer: its value replaces every load of its buffer; it disappears.

    Precondition: exactly one statement writes the buffer, with plain loop variables as
    indices (B[i, j], any order), not reading its own buffer; the buffer is not a program
    argument and is not read in loop bounds or guards. (Legality — no write to the
    producer's inputs between the producer and a consumer — is `check_inline`'s job.)

        for i in 0..n: B[i] = f(A[i])           for j in 0..n:
        for j in 0..n: C[j] = B[j+1] * B[j]  ==>     C[j] = f(A[j+1]) * f(A[j])
    """
    buf = producer_buffer(program, producer)
    ws = writers(program, buf)
    if not ws:
        raise ArgumentError(f"compute_inline: no statement writes {buf.name!r} in program {program.name!r}")
    if len(ws) > 1:
        names = ", ".join(w.store.name for w in ws)
        raise ArgumentError(
            f"compute_inline: {buf.name!r} is written by {len(ws)} statements ({names}); only a pure producer "
            "(one statement) can be inlined — a reduction can be placed with compute_at instead"
        )
    if _is_output(program, buf):
        raise ArgumentError(
            f"compute_inline: {buf.name!r} is an argument of program {program.name!r} (an output); "
            "inlining would leave it unwritten"
        )
    p = ws[0].store
    dims = _index_iters(p, "compute_inline")
    if len(dims) != len(p.iters):
        raise ArgumentError(
            f"compute_inline: statement {p.name!r} has loop variables that do not index {buf.name!r} "
            "(a reduction or repeated writes); it is not a pure producer"
        )
    if buf in buffers_of(p.value)[0]:
        raise ArgumentError(f"compute_inline: statement {p.name!r} reads its own buffer {buf.name!r}")
    if _reads_in_control(program, buf):
        raise ArgumentError(f"compute_inline: {buf.name!r} is read in a loop bound or a guard; cannot inline it")
    # a scratch buffer exists only inside its allocation: the readers elsewhere could not load it
    scratch = {a.buffer for a in walk(program.body) if isinstance(a, Allocate)}
    private = sorted({ld.buffer.name for ld in walk(p.value) if isinstance(ld, Load) and ld.buffer in scratch})
    if private:
        raise ArgumentError(
            f"compute_inline: statement {p.name!r} reads the scratch buffer(s) {', '.join(private)}, which exist only "
            f"inside their allocation; its readers could not load them. Inline {buf.name!r} before the cache_read "
            "that introduced them")

    class _Inline(Transformer):
        def visit_Load(self, ld: Load) -> Expr:
            idx = tuple(self.visit(i) for i in ld.indices)
            if ld.buffer is not buf:
                return ld if all(a is b for a, b in zip(idx, ld.indices)) else Load(ld.buffer, idx)
            return substitute(p.value, {p.iters[dims[d]]: idx[d] for d in range(len(idx))})

    consumers: list[str] = []

    def rewrite(s: Stmt) -> Stmt | None:
        if isinstance(s, Store) and s is not p and buf in buffers_of(s)[0]:
            consumers.append(s.name)
            return replace(s, value=_Inline().visit(s.value), indices=tuple(_Inline().visit(i) for i in s.indices))
        return None

    body = map_stmts(program.body, rewrite)
    path = _find_node(body, p)
    assert path is not None
    body = replace_at(path, None)
    if body is None:
        body = Seq(())
    temps = program.temps
    still_used = any(buf in buffers_of(c.store)[0] or c.store.buffer is buf for c in statements(body))
    if not still_used:
        temps = tuple(t for t in temps if t is not buf)
    return replace(program, body=body, temps=temps), InlinePlan(p, tuple(consumers))


def _find_node(body: Stmt, node: Stmt) -> tuple | None:
    """The path (ancestor, child index) from `body` down to `node` (by identity)."""
    found = find_path(body, lambda s: s is node)
    return None if found is None else found[1]


# ----------------------------------------------------------------------------- compute_at


@dataclass(frozen=True)
class AtPlan:
    """What `compute_at` did: the producer statements moved, the readers served, the new loops."""

    producers: tuple[str, ...]
    consumers: tuple[str, ...]
    new_loops: tuple[Var, ...]


def _producer_nest(program: Program, buf: Buffer, ws: list[StmtContext]) -> Stmt:
    """The subtree that holds exactly the producer statements (a whole nest of its own)."""
    names = {w.store.name for w in ws}
    first = ws[0]
    for f in first.loops:
        inside = {c.store.name for c in statements(f)}
        if names <= inside:
            if inside != names:
                others = sorted(inside - names)
                raise ArgumentError(
                    f"compute_at: the nest of {buf.name!r} (loop {f.var.name!r}) also holds {', '.join(others)}; "
                    "compute_at moves a producer's own nest only"
                )
            return f
        if inside - names:
            raise ArgumentError(
                f"compute_at: loop {f.var.name!r} around the producer of {buf.name!r} is shared with other "
                "statements; compute_at moves a producer's own nest only"
            )
    if len(ws) == 1 and not first.loops:
        return first.store
    raise ArgumentError(f"compute_at: the statements writing {buf.name!r} are not in one nest of their own")


def _producer_nests(program: Program, buf: Buffer, ws: list[StmtContext]) -> list[Stmt]:
    """The subtrees that hold exactly the producer statements: one nest, or one per definition of a
    recurrence (te.scan / te.update: `S_init` and `S` in nests of their own), each holding writers only."""
    try:
        return [_producer_nest(program, buf, ws)]
    except ArgumentError as one:
        roots: list[Stmt] = []
        for w in ws:
            root = w.loops[0] if w.loops else w.store
            if all(r is not root for r in roots):
                roots.append(root)
        names = {w.store.name for w in ws}
        if len(roots) < 2 or any({c.store.name for c in statements(r)} - names for r in roots):
            raise one
        return roots


def compute_at(program: Program, producer: Any, loop: Var, footprint: Any = None) -> tuple[Program, AtPlan]:
    """Compute the producer of a buffer inside `loop`, over the region the loop's readers need.

    Precondition: the buffer is a temp written only by the statements of one nest of their
    own (a stage, or `C_init` + `C` of a reduction) or of consecutive nests of their own (the
    definitions of a te.scan / te.update, moved in their order), each writing B[v0, v1, ...] with plain
    loop variables of that nest as indices; every statement that reads the buffer is inside
    `loop`, and `loop` is not in the producer's nest. `footprint(program, stmt, buf, loop)`
    gives the per-dimension half-open (lo, hi) region a reader needs in one iteration of
    `loop` (`loopir.poly.footprint`). The producer's nest is rebuilt at the start of `loop`'s
    body with fresh loops: over each buffer dimension, `0..hi-lo` with the region clipped
    to the producer's own bounds; other loops (reduction loops) keep their bounds. Legality
    against the other statements is `check_at`'s job.

        for i in 0..n: B[i] = A[i]          for jo in ...:
        for jo in ...:                 ==>      for i_c in 0..(hi - lo): B[..] = A[..]    # i = i_c + lo
            for ji in 0..4: C[..] = B[..]       for ji in 0..4: C[..] = B[..]
    """
    if footprint is None:
        footprint = poly.footprint
    buf = producer_buffer(program, producer)
    if not isinstance(loop, Var):
        raise ArgumentTypeError(f"compute_at: the target must be a loop handle, got {type(loop).__name__} {loop!r}")
    ws = writers(program, buf)
    if not ws:
        raise ArgumentError(f"compute_at: no statement writes {buf.name!r} in program {program.name!r}")
    if _is_output(program, buf):
        raise ArgumentError(
            f"compute_at: {buf.name!r} is an argument of program {program.name!r} (an output); computing only "
            "the regions its readers need would leave parts of it unwritten"
        )
    found = find_loop_path(program.body, loop)
    if found is None:
        raise NotFoundError(f"compute_at: loop {loop.name!r} is not in program {program.name!r}")
    target, _ = found
    names = {w.store.name for w in ws}
    nests = _producer_nests(program, buf, ws)
    in_target = {c.store.name for c in statements(target)}
    if names & in_target or any(isinstance(n, For) and find_loop_path(n, loop) is not None for n in nests):
        raise ArgumentError(
            f"compute_at: loop {loop.name!r} is in the nest that computes {buf.name!r}; pick a loop of a consumer"
        )
    rs = readers(program, buf, exclude=names)
    if not rs:
        raise ArgumentError(f"compute_at: no statement reads {buf.name!r}; nothing to compute it for")
    outside = [r.store.name for r in rs if r.store.name not in in_target]
    if outside:
        raise ArgumentError(
            f"compute_at: {buf.name!r} is also read by {', '.join(outside)} outside loop {loop.name!r}; "
            f"every reader must be inside the loop it is computed at"
        )
    if _reads_in_control(program, buf):
        raise ArgumentError(f"compute_at: {buf.name!r} is read in a loop bound or a guard")

    # loop variable of the producer's nest -> buffer dimension it indexes
    nest_loops = {f.var for nest in nests for f in walk(nest) if isinstance(f, For)}
    dim_of: dict[Var, int] = {}
    for w in ws:
        st = w.store
        for k, c in enumerate(st.coords):
            if not isinstance(c, Var) or c not in nest_loops:
                raise ArgumentError(
                    f"compute_at: statement {st.name!r} has coordinate {st.iters[k].name} = {c}, not a loop of "
                    f"its own nest; use compute_at before scheduling the producer's nest"
                )
        for d, k in enumerate(_index_iters(st, "compute_at")):
            v = st.coords[k]
            if dim_of.setdefault(v, d) != d:
                raise ArgumentError(f"compute_at: loop {v.name!r} indexes two dimensions of {buf.name!r}")
    if sorted(set(dim_of.values())) != list(range(len(buf.shape))):
        raise ArgumentError(f"compute_at: some dimension of {buf.name!r} is not indexed by a loop of its nest")

    # the region: the bounding box of the readers' half-open footprints
    region: list[tuple[Expr, Expr]] | None = None
    for r in rs:
        try:
            fp = footprint(program, r.store.name, buf, loop)
        except Exception as e:  # poly.NonAffine / isl errors: the region cannot be described exactly
            if isinstance(e, (ValueError, TypeError)) and not type(e).__name__ == "NonAffine":
                raise
            raise ArgumentError(
                f"compute_at: the region of {buf.name!r} that {r.store.name} reads in one iteration of loop "
                f"{loop.name!r} is not affine ({e}); compute_at needs an affine nest around the reader"
            ) from e
        if region is None:
            region = [(lo, hi) for lo, hi in fp]
        else:
            region = [(_min(a, lo), _max(b, hi)) for (a, b), (lo, hi) in zip(region, fp)]
    assert region is not None

    new_loops: list[Var] = []
    taken: set[str] = set()
    # the loops around the new producer nest: its bounds are simplified for the values they take (isl),
    # so `min(8*y_o + 10, h + 2) - max(8*y_o, 0)` reads 10 at sizes where it is 10
    _, target_path = find_loop_path(program.body, loop)
    around = [a for a, _ in target_path if isinstance(a, For)] + [target]

    def tidy(e: Expr) -> Expr:

        return simplify_in_context(simplify(e), around, program.params)

    def rebuild(s: Stmt, env: dict[Var, Expr]) -> Stmt:
        if isinstance(s, For):
            lo, hi = substitute(s.lo, env), substitute(s.hi, env)
            v = Var(fresh_name(program, s.var.name + "_c", taken), s.var.dtype)
            taken.add(v.name)
            new_loops.append(v)
            if s.var in dim_of:
                flo, fhi = region[dim_of[s.var]]
                lo = tidy(_max(flo, lo))
                hi = _min(fhi, hi)
                inner = dict(env)
                inner[s.var] = binary("add", v, lo) if not _is_zero(lo) else v
                return For(v, Const(0, INDEX), tidy(hi - lo), rebuild(s.body, inner), "serial")
            inner = dict(env)
            inner[s.var] = v
            return For(v, lo, hi, rebuild(s.body, inner), "serial")
        if isinstance(s, Store):
            return replace(s, coords=tuple(substitute(c, env) for c in s.coords))
        if isinstance(s, If):
            return If(substitute(s.cond, env), rebuild(s.then, env),
                      None if s.orelse is None else rebuild(s.orelse, env))
        if isinstance(s, Seq):
            return Seq(tuple(rebuild(c, env) for c in s.body))
        if hasattr(s, "body") and isinstance(s.body, Stmt):
            return replace(s, body=rebuild(s.body, env))
        return s

    moved = [rebuild(nest, {}) for nest in nests]  # the definitions of a recurrence in their order
    new_target = replace(target, body=seq(*moved, target.body))
    _, tpath = find_loop_path(program.body, loop)
    body = replace_at(tpath, new_target)
    for nest in nests:
        npath = _find_node(body, nest)
        assert npath is not None
        body = replace_at(npath, None)
        if body is None:
            body = Seq(())
    plan = AtPlan(tuple(w.store.name for w in ws), tuple(r.store.name for r in rs), tuple(new_loops))
    return replace(program, body=body), plan


def _is_zero(e: Expr) -> bool:
    return same_value(e, binary("sub", e, e))


def _max(a: Expr, b: Expr) -> Expr:
    d = const_diff(a, b)
    if d is not None:
        return a if d >= 0 else b
    return binary("max", a, b)


def _min(a: Expr, b: Expr) -> Expr:
    d = const_diff(a, b)
    if d is not None:
        return a if d <= 0 else b
    return binary("min", a, b)


# ----------------------------------------------------------------------------- rebasing


def rebase_statements(program: Program, names: set[str]) -> Program:
    """Give the statements `names` fresh instance spaces: their iters become the loops around
    them now (coords == iters) and their indices / value are rewritten accordingly.

    After compute_at a producer instance runs once per iteration of the target loop; its new
    instance space (outer loops + the producer's new loops) makes that injective again, so
    the next steps are checked against exact dependences of the new program."""
    loops_of = {id(c.store): c.loops for c in statements(program) if c.store.name in names}

    class _R(Transformer):
        def visit_Store(self, st: Store) -> Store:
            lps = loops_of.get(id(st))
            if lps is None:
                return st
            env = dict(zip(st.iters, st.coords))
            iters = tuple(f.var for f in lps)
            return Store(st.name, st.buffer, tuple(substitute(i, env) for i in st.indices),
                         substitute(st.value, env), iters, iters)

        def visit(self, node: Any) -> Any:
            return node if isinstance(node, Expr) else super().visit(node)

    return replace(program, body=_R().visit(program.body))


# ----------------------------------------------------------------------------- legality


def _split_by_names(umap: Any, keep: Any) -> Any:
    """The maps of an isl UnionMap whose (source, sink) tuple names satisfy `keep`."""
    out = isl.UnionMap.empty(umap.get_space())
    maps = umap.get_map_list()
    for k in range(maps.n_map()):
        m = maps.get_at(k)
        if keep(m.get_tuple_name(isl.dim_type.in_), m.get_tuple_name(isl.dim_type.out)):
            out = out.union(isl.UnionMap.from_map(m))
    return out


def check_at(ctx: Any) -> Any:
    """Legality of compute_at: every dependence except those the construction satisfies.

    Formal condition: with R the producer's statements and new the (non-injective) schedule of
    the rebuilt program, no dependence d = (s -> t) with not (s, t in R writing one element) and
    not (s in R, t not in R, d a flow) is run backwards (flow: first run of s before every run of t; anti: last
    run of s before the first of t; output: last runs ordered)."""
    producer, loop = ctx.args[0], ctx.args[1]
    unrebased, plan = compute_at(ctx.old, producer, loop)
    group = {poly._sanitize(n) for n in plan.producers}
    deps = ctx.deps
    both = lambda a, b: a in group and b in group  # noqa: E731
    feeds = lambda a, b: a in group and b not in group  # noqa: E731 - satisfied: the footprint covers the reads
    # between producer instances, only those writing one element are satisfied by construction (each iteration
    # that needs the element runs all its writers, in their order); a recurrence's instances that read another
    # element (a scan's S[t - 1]) are checked like any dependence: that element's writers may run in an
    # earlier iteration of the loop, or (refused) a later one
    same = _same_element(ctx.old, producer_buffer(ctx.old, producer))

    def keep(um: Any, others: Any) -> Any:
        return _split_by_names(um, others).union(_split_by_names(um, both).subtract(same))

    filtered = replace(
        deps,
        flow=keep(deps.flow, lambda a, b: not both(a, b) and not feeds(a, b)),
        anti=keep(deps.anti, lambda a, b: not both(a, b)),
        output=keep(deps.output, lambda a, b: not both(a, b)),
    )
    return poly.find_violation(filtered, unrebased)


def _same_element(program: Program, buf: Buffer) -> Any:
    """S[x] -> T[y] for the writers S, T of `buf` (each indexing it with plain loop variables, compute_at's
    precondition) when S[x] and T[y] write one element."""
    ws = [w.store for w in writers(program, buf)]
    parts = []
    for a in ws:
        for b in ws:
            da, db = _index_iters(a, "compute_at"), _index_iters(b, "compute_at")
            xs = [f"x{k}" for k in range(len(a.iters))]
            ys = [f"y{k}" for k in range(len(b.iters))]
            eq = " and ".join(f"{xs[i]} = {ys[j]}" for i, j in zip(da, db)) or "true"
            parts.append(f"{poly._sanitize(a.name)}[{', '.join(xs)}] -> {poly._sanitize(b.name)}[{', '.join(ys)}] "
                         f": {eq}")
    return isl.UnionMap("{ " + "; ".join(parts) + " }")


def check_inline(ctx: Any) -> Any:
    """Legality of compute_inline: the producer's inputs still hold the same values at its consumers.

    Formal condition: no anti dependence P(e) -> W(w) (W is the first overwrite of an element P
    reads) and flow dependence P(e) -> X(x) through the producer's buffer with old(W(w)) <lex
    old(X(x)); the witness is P(e) -> W(w), whose read now happens inside X(x), after W(w)."""
    deps = ctx.deps
    buf = producer_buffer(ctx.old, ctx.args[0])
    p = writers(ctx.old, buf)[0].store
    pn = poly._sanitize(p.name)
    anti = _split_by_names(deps.anti, lambda a, b: a == pn)
    flow = _split_by_names(deps.flow, lambda a, b: a == pn and b != pn)
    if anti.is_empty() or flow.is_empty():
        return None
    sched = poly.schedule_map(ctx.old).intersect_domain(deps.domain)
    before = sched.lex_lt_union_map(sched)  # W -> X : old(W) <lex old(X)
    tri = anti.range_product(flow).intersect_range(before.wrap())  # P -> [W -> X]
    if tri.is_empty():
        return None
    return poly._witness(tri.range_factor_domain(), "anti", deps)  # the pair P(e) -> W(w) of a breaking triple


def _inline_hint(ctx: Any, w: Any) -> str | None:
    return (f"{w.sink[0]} overwrites {w.buffer} after {w.source[0]} read it but before a statement that "
            f"uses {w.source[0]}'s result; inlining would read the new value — keep the producer, or use compute_at")


def _at_hint(ctx: Any, w: Any) -> str | None:
    group = {c.store.name for c in writers(ctx.old, producer_buffer(ctx.old, ctx.args[0]))}
    if w.source[0] in group and w.sink[0] in group:
        return (f"{w.sink[0]} reads an element of {w.buffer} that {w.source[0]} computes in a later iteration of "
                f"loop {ctx.args[1].name!r} (a recurrence computed piecewise); compute it at a loop whose "
                "iterations follow its order, or keep it where it is")
    other = w.sink[0] if w.source[0] in group else w.source[0]
    return (f"computing {ctx.args[0]} inside loop {ctx.args[1].name!r} reorders it with {other}; "
            "compute it at another loop, or keep it where it is")


# ----------------------------------------------------------------------------- registration


def _register() -> None:
    @primitive("compute_inline", check=check_inline, hint=_inline_hint, rebase=True)
    def _compute_inline(program: Program, producer: Any) -> Program:
        return compute_inline(program, producer)[0]

    _compute_inline.__doc__ = compute_inline.__doc__  # the method's help is the primitive's

    @primitive("compute_at", check=check_at, hint=_at_hint, rebase=True)
    def _compute_at(program: Program, producer: Any, loop: Var) -> Program:
        new, plan = compute_at(program, producer, loop)
        return rebase_statements(new, set(plan.producers))

    _compute_at.__doc__ = compute_at.__doc__


_register()
