"""The precondition of `online_softmax` (schedules/primitives/online.py): which stages of an unscheduled program
form the softmax chain around a row maximum, and the terms its running sums add up, in the sums' own variables.

The rewrite itself, and the statement of the precondition, are in online.py; this module only reads programs.
"""

from __future__ import annotations

from dataclasses import dataclass

from loopir.dtypes import is_float
from loopir.errors import ArgumentError, NotFoundError
from loopir.nodes import Binary, Buffer, Cast, Const, Expr, For, Load, Program, Select, Seq, Stmt, Store, Var
from loopir import nodes
from loopir.visit import Transformer, substitute, walk

from .compute import compute_inline

__all__ = ["Stage", "Match", "stages_of", "top_nests", "chain_of", "reads", "Replace", "inline", "prepare", "match",
           "mask_of", "find_softmax_max"]


@dataclass(frozen=True)
class Stage:
    """One top-level nest of an unscheduled program: `loops` around an elementwise `store`, or around
    `init` then the reduction loops `red` around the update `store`."""

    pos: int
    nest: Stmt
    loops: tuple[For, ...]
    store: Store
    init: Store | None = None
    red: tuple[For, ...] = ()

    @property
    def buffer(self) -> Buffer:
        return self.store.buffer

    @property
    def axis(self) -> tuple[Var, ...]:
        return tuple(f.var for f in self.loops)


def top_nests(program: Program) -> tuple[Stmt, ...]:
    return program.body.body if isinstance(program.body, Seq) else (program.body,)


def chain_of(s: Stmt) -> tuple[list[For], Stmt]:
    """The perfectly nested loops at the top of `s` and what they enclose."""
    loops = []
    while isinstance(s, For):
        loops.append(s)
        s = s.body
    return loops, s


def stages_of(program: Program) -> list[Stage] | None:
    """The top-level nests as stages, or None when the program is no longer the lowered chain."""
    top = top_nests(program)
    out = []
    for pos, nest in enumerate(top):
        loops, inner = chain_of(nest)
        if any(f.kind != "serial" for f in loops):
            return None
        if isinstance(inner, Store):
            out.append(Stage(pos, nest, tuple(loops), inner))
            continue
        if not (isinstance(inner, Seq) and len(inner.body) == 2 and isinstance(inner.body[0], Store)):
            return None
        red, upd = chain_of(inner.body[1])
        if not red or not isinstance(upd, Store) or any(f.kind != "serial" for f in red):
            return None
        out.append(Stage(pos, nest, tuple(loops), upd, inner.body[0], tuple(red)))
    for st in out:
        for s in (st.store, st.init):
            if s is not None and any(c is not v for c, v in zip(s.coords, s.iters)):
                return None
    return out


def reads(e: Expr, buf: Buffer) -> list[Load]:
    return [n for n in walk(e) if isinstance(n, Load) and n.buffer is buf]


class Replace(Transformer):
    """Replace whole sub-expressions (by equality) and loads of given buffers."""

    def __init__(self, exprs: dict[Expr, Expr] | None = None, loads: dict[Buffer, tuple[Buffer, int]] | None = None):
        self.exprs = exprs or {}
        self.loads = loads or {}  # buffer -> (new buffer, number of trailing indices to drop)

    def visit(self, node: object) -> object:
        if isinstance(node, Expr):
            for k, v in self.exprs.items():
                if node == k:
                    return v
        if isinstance(node, Load) and node.buffer in self.loads:
            nb, drop = self.loads[node.buffer]
            return Load(nb, tuple(self.visit(i) for i in node.indices[: len(node.indices) - drop]))
        return super().visit(node)


def _float_cast(e: Expr) -> bool:
    """A conversion between floating types: monotone, and exact up to one rounding, so a factor seen through it
    still scales (the rescaling then differs from the original by that rounding, which the check tolerates)."""
    return isinstance(e, Cast) and is_float(e.dtype) and is_float(e.a.dtype)


def _factor(t: Expr, is_exp: object) -> bool:
    """Whether `t` is a product in which the exponential term (`is_exp(e)`) is a factor of the numerator
    and occurs nowhere else: then `t(m_new) = t(m_old) * exp(m_old - m_new)`, the rescaling distributes."""
    if is_exp(t):  # type: ignore[operator]
        return True
    if _float_cast(t):
        return _factor(t.a, is_exp)  # type: ignore[attr-defined]
    if isinstance(t, Binary) and t.op == "mul":
        la, lb = _factor(t.a, is_exp), _factor(t.b, is_exp)
        return (la and not _has(t.b, is_exp)) or (lb and not _has(t.a, is_exp))
    if isinstance(t, Binary) and t.op == "div":
        return _factor(t.a, is_exp) and not _has(t.b, is_exp)
    return False


def _has(e: Expr, is_exp: object) -> bool:
    return any(is_exp(n) for n in walk(e) if isinstance(n, Expr))  # type: ignore[operator]


def prepare(program: Program, name: str) -> Program:
    """`program` with the elementwise temporaries that the maximized value reads (e.g. a causal mask
    `where(j <= i, s, -inf)`, a scaling of the scores, a cast to float32) inlined into all their readers."""
    for _ in range(len(program.temps)):
        stages = stages_of(program) or []
        m = next((st for st in stages if st.buffer.name == name), None)
        if m is None:
            return program
        pure = [st for st in stages if st.init is None and st.buffer in program.temps
                and reads(m.store.value, st.buffer)]
        if not pure:
            return program
        program = compute_inline(program, pure[0].buffer.name)[0]
    return program


@dataclass(frozen=True)
class Match:
    """The chain around the row maximum `max`: the elementwise stages inlined into the sums (in program order),
    the sums (`rolling`, in program order), the scores computed per key (or None); for each sum its term with
    those stages inlined and its divisor stripped (in the sum's variables), and for a divided sum the divisor,
    a load of another sum at the row (`divisor`; None for a sum that is not divided)."""

    max: Stage
    inlined: tuple[Stage, ...]
    rolling: tuple[Stage, ...]
    scores: Stage | None
    terms: tuple[Expr, ...]
    divisor: tuple[Load | None, ...]


def match(program: Program, name: str) -> Match:
    """The chain of the row maximum `name` in the prepared program; ArgumentError (NotFoundError for an unknown
    name) naming the stage that breaks the precondition of `online_softmax`."""
    stages = stages_of(program)
    if stages is None:
        raise ArgumentError(f"online_softmax({name}): the program is no longer the unscheduled chain of stages "
                            "(a nest has been transformed); apply online_softmax first")
    byname = {st.buffer.name: st for st in stages}
    m = byname.get(name)
    if m is None:
        if name not in {b.name for b in program.args + program.temps}:
            raise NotFoundError(f"online_softmax: no stage named {name!r}; stages: {', '.join(byname)}")
        raise ArgumentError(f"online_softmax({name}): {name!r} is not computed by a stage of the program")
    buf = m.buffer
    upd = m.store
    if not (m.init is not None and len(m.red) == 1 and isinstance(upd.value, Binary) and upd.value.op == "max"
            and isinstance(upd.value.a, Load) and upd.value.a.buffer is buf and isinstance(m.init.value, Const)
            and m.init.value.value == float("-inf")):
        raise ArgumentError(f"online_softmax({name}): stage {name!r} is not a row maximum "
                            f"(te.max over one reduce axis); the rewrite keeps a running maximum of such a stage")
    if tuple(upd.indices) != m.axis or tuple(m.init.indices) != m.axis:
        raise ArgumentError(f"online_softmax({name}): stage {name!r} must store at its own loop variables")
    rvar, f = m.red[0].var, upd.value.b
    idx = m.axis

    def score_at(j: Expr, row: tuple[Expr, ...]) -> Expr:
        return substitute(f, {rvar: j, **dict(zip(idx, row))})

    inlined, rolling = _readers(program, stages, m)
    inl = {e.buffer: e for e in inlined}
    rbufs = {r.buffer for r in rolling}
    divided: set[Buffer] = set()
    divisors: set[Buffer] = set()
    terms: list[tuple[Expr, tuple[Var, ...], Var]] = []
    divisor: list[Load | None] = []
    for r in rolling:
        rv = r.store.value
        assert isinstance(rv, Binary)
        if len(r.red) != 1 or r.red[0].lo != m.red[0].lo or r.red[0].hi != m.red[0].hi:
            raise ArgumentError(f"online_softmax({name}): the sum {r.buffer.name!r} does not run over the keys of "
                                f"{name!r} (one reduce axis with the same range); it cannot share the pass")
        if len(r.axis) < len(idx) or any(a.hi != b.hi or a.lo != b.lo for a, b in zip(r.loops, m.loops)):
            raise ArgumentError(f"online_softmax({name}): the sum {r.buffer.name!r} does not have the rows of "
                                f"{name!r} as its outer loops")
        if not isinstance(rv.a, Load) or rv.a.buffer is not r.buffer or tuple(r.store.indices) != r.axis:
            raise ArgumentError(f"online_softmax({name}): stage {r.buffer.name!r} is not a plain sum")
        j = r.red[0].var
        row = r.axis[: len(idx)]
        term = inline(rv.b, inl)
        for ld in reads(term, buf):
            if tuple(ld.indices) != row:
                raise ArgumentError(f"online_softmax({name}): the sum {r.buffer.name!r} reads {name!r} of another row")
        split = _strip_divisor(term, rbufs, row) if any(reads(term, b) for b in rbufs) else None
        d = None
        if split is not None and split[1].buffer is not r.buffer and not any(reads(split[0], b) for b in rbufs):
            term, d = split  # sum_j t / D[row] = (sum_j t) / D[row]: divided once the pass is over
            divided.add(r.buffer)
            divisors.add(d.buffer)
        if any(reads(term, b) for b in rbufs) or divided & divisors:
            raise ArgumentError(
                f"online_softmax({name}): the sum {r.buffer.name!r} reads another running sum of the chain inside "
                "its terms other than as a divisor of the whole term (only t / sum[row] can wait for the end of "
                "the pass); divide after the sum instead: sum(exp(s - max) * v) / sum(exp(s - max))")
        terms.append((term, row, j))
        divisor.append(d)
        target = exp_term(j, row, score_at, buf)

        def is_exp(e: Expr, target: Expr = target) -> bool:
            return e == target

        if not _has(term, is_exp):
            raise ArgumentError(
                f"online_softmax({name}): stage {r.buffer.name!r} reads {name!r} outside an exponential "
                f"exp(x - {name}) of the maximized value x; a max without the exponential cannot be rescaled")
        if reads(Replace({target: Const(1.0, target.dtype)}).visit(term), buf) or not _factor(term, is_exp):
            raise ArgumentError(
                f"online_softmax({name}): the consumer {r.buffer.name!r} is not a sum of products with "
                f"exp(x - {name}) (its term is {term}); the rescaling by exp(m_old - m_new) does not distribute")
    # the producer of the maximized value: a reduction read at (row, key) by the chain alone
    scores = None
    loads = [ld for ld in walk(f) if isinstance(ld, Load)]
    cand = [st for st in stages if any(ld.buffer is st.buffer for ld in loads)]
    if len(cand) == 1 and cand[0].init is not None and cand[0].buffer not in program.args:
        sc = cand[0]
        chain = {m.buffer} | set(inl) | rbufs
        others = [st for st in stages if st is not sc and st.buffer not in chain and reads(st.store.value, sc.buffer)]
        if (not others and len(sc.axis) == len(idx) + 1 and sc.loops[-1].lo == m.red[0].lo
                and sc.loops[-1].hi == m.red[0].hi and tuple(sc.store.indices) == sc.axis
                and all(tuple(ld.indices) == idx + (rvar,) for ld in loads if ld.buffer is sc.buffer)
                and all(tuple(ld.indices) == row + (j,) for t, row, j in terms for ld in reads(t, sc.buffer))):
            scores = sc
    return Match(m, tuple(inlined), tuple(rolling), scores, tuple(t for t, _, _ in terms), tuple(divisor))


def _readers(program: Program, stages: list[Stage], m: Stage) -> tuple[list[Stage], list[Stage]]:
    """The elementwise stages that read the maximum, directly or through other such stages (the exponential, the
    probabilities divided by their sum, their casts: all inlined into the sums), and the sums that read the
    maximum or one of them; both in program order."""
    name, buf = m.buffer.name, m.buffer
    readers = [st for st in stages if st is not m and (reads(st.store.value, buf)
                                                        or (st.init is not None and reads(st.init.value, buf)))]
    if not readers:
        raise ArgumentError(f"online_softmax({name}): nothing reads the maximum {name!r}; a max without the "
                            "exponential exp(x - max) has nothing to rescale")
    inlined = [st for st in readers if st.init is None]
    rolling = [st for st in readers if st.init is not None]
    via: dict[Buffer, Stage] = {}  # an inlined stage that does not read the maximum itself -> the one it reads
    queue = list(inlined)
    while queue:
        e = queue.pop(0)
        how = f" (through {via[e.buffer].buffer.name!r})" if e.buffer in via else ""
        if e.buffer in program.args:
            raise ArgumentError(f"online_softmax({name}): stage {e.buffer.name!r} reads {name!r}{how} and is an "
                                "output; the online form never holds it whole, so it cannot be returned")
        users = [st for st in stages if st is not e and reads(st.store.value, e.buffer)]
        if not users:
            raise ArgumentError(f"online_softmax({name}): stage {e.buffer.name!r} reads {name!r}{how} but nothing "
                                "reads it")
        for u in users:
            if u.init is None:  # elementwise: inlined in turn, its readers must be sums in the end
                if u not in inlined:
                    inlined.append(u)
                    via[u.buffer] = e
                    queue.append(u)
                continue
            if not (isinstance(u.store.value, Binary) and u.store.value.op == "add"):
                raise ArgumentError(
                    f"online_softmax({name}): the softmax {e.buffer.name!r} is read by stage {u.buffer.name!r}, "
                    f"which is not a sum over the keys; its consumer is not rescalable by exp(m_old - m_new)")
            if u not in rolling:
                rolling.append(u)
    return sorted(inlined, key=lambda st: st.pos), sorted(rolling, key=lambda st: st.pos)


def exp_term(j: Expr, row: tuple[Expr, ...], score_at: object, buf: Buffer) -> Expr:
    """exp(f(row, j) - mx[row]): the factor every term of the chain's sums carries."""
    return nodes.call("exp", nodes.binary("sub", score_at(j, row), Load(buf, row)))  # type: ignore[operator]


def _divisor(e: Expr, sums: set[Buffer], row: tuple[Expr, ...]) -> Load | None:
    """The load of one of `sums` at `row` that `e` is, possibly converted to another float type."""
    if _float_cast(e):
        e = e.a  # type: ignore[attr-defined]
    return e if isinstance(e, Load) and e.buffer in sums and tuple(e.indices) == tuple(row) else None


def _strip_divisor(t: Expr, sums: set[Buffer], row: tuple[Expr, ...]) -> tuple[Expr, Load] | None:
    """(t', D) when `t` is `t' / D` up to a product and float casts, D a load of one of `sums` at `row` (constant
    in the key). Through a cast, `cast(a / D)` gives `cast(a)`: the division moves past one rounding of the cast
    type (D, a sum of exponentials that includes exp(0), is at least 1: `a` is no larger than `a / D` was times D,
    so only a term near the top of the cast type's range could overflow where the quotient did not)."""
    if isinstance(t, Binary) and t.op == "div":
        d = _divisor(t.b, sums, row)
        if d is not None:
            return t.a, d
    if _float_cast(t):
        got = _strip_divisor(t.a, sums, row)  # type: ignore[attr-defined]
        if got is not None:
            return nodes.cast(t.dtype, got[0]), got[1]
    if isinstance(t, Binary) and t.op == "mul":
        for a, b, left in ((t.a, t.b, True), (t.b, t.a, False)):
            got = _strip_divisor(a, sums, row)
            if got is not None:
                return (nodes.binary("mul", got[0], b) if left else nodes.binary("mul", b, got[0])), got[1]
    return None


def inline(e: Expr, inl: dict[Buffer, Stage]) -> Expr:
    """`e` with the loads of the elementwise stages in `inl` replaced by their values."""

    class _I(Transformer):
        def visit_Load(self, ld: Load) -> Expr:  # noqa: N802 - the visitor's naming
            st = inl.get(ld.buffer)
            if st is None:
                return Load(ld.buffer, tuple(self.visit(i) for i in ld.indices))
            return self.visit(substitute(st.store.value, dict(zip(st.axis, ld.indices))))

    return _I().visit(e) if inl else e


def mask_of(f: Expr) -> tuple[Expr, Expr] | None:
    """(cond, x) when the score is `where(cond, x, -inf)` with `cond` reading no buffer (a mask such as the
    causal `j <= i`), possibly converted to another float type (-inf stays -inf), else None."""
    if _float_cast(f):
        got = mask_of(f.a)  # type: ignore[attr-defined]
        return None if got is None else (got[0], nodes.cast(f.dtype, got[1]))
    if (isinstance(f, Select) and isinstance(f.b, Const) and f.b.value == float("-inf")
            and not any(isinstance(n, Load) for n in walk(f.cond))):
        return f.cond, f.a
    return None


def find_softmax_max(program: Program) -> list[str]:
    """The buffers the rewrite applies to (its precondition holds), in program order."""
    stages = stages_of(program) or []
    out = []
    for st in stages:
        if st.init is not None and isinstance(st.store.value, Binary) and st.store.value.op == "max":
            try:
                match(prepare(program, st.buffer.name), st.buffer.name)
            except ArgumentError:
                continue
            out.append(st.buffer.name)
    return out
