"""online_softmax: the naive softmax chain rewritten with a running maximum (FlashAttention's rewrite).

The primitive takes the buffer of a row maximum `mx` and folds every stage that reads it into one
pass over the reduction axis that keeps the maximum seen so far and rescales the partial sums by
`exp(m_old - m_new)` whenever it grows, so neither the probabilities nor (when only this chain reads
them) the scores they are computed from exist as rows any more: no temporary of size n x m is left.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from loopir import interp
from loopir.args import size_of
from loopir.dtypes import from_bfloat16, to_bfloat16
from loopir.errors import ArgumentError, NotFoundError
from loopir.nodes import Allocate, Binary, Buffer, Const, Expr, For, If, Load, Program, Select, Seq, Stmt, Store, Var
from loopir import nodes
from loopir.visit import Transformer, free_vars, substitute, walk

from ..errors import ScheduleError
from ..nest_scope import common_ends
from . import CheckContext, fresh_name, primitive
from .compute import compute_inline

__all__ = ["online_softmax", "find_softmax_max", "OnlineRewrite", "sink_guard"]

CHECK_SIZE = 5  # the size every size variable takes in the random-data check (small: the interpreter is exact, slow)


# ----------------------------------------------------------------------------- the stages of an unscheduled program


@dataclass(frozen=True)
class _Stage:
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


def _top_nests(program: Program) -> tuple[Stmt, ...]:
    return program.body.body if isinstance(program.body, Seq) else (program.body,)


def _chain(s: Stmt) -> tuple[list[For], Stmt]:
    loops = []
    while isinstance(s, For):
        loops.append(s)
        s = s.body
    return loops, s


def _stages(program: Program) -> list[_Stage] | None:
    """The top-level nests as stages, or None when the program is no longer the lowered chain."""
    top = _top_nests(program)
    out = []
    for pos, nest in enumerate(top):
        loops, inner = _chain(nest)
        if any(f.kind != "serial" for f in loops):
            return None
        if isinstance(inner, Store):
            out.append(_Stage(pos, nest, tuple(loops), inner))
            continue
        if not (isinstance(inner, Seq) and len(inner.body) == 2 and isinstance(inner.body[0], Store)):
            return None
        red, upd = _chain(inner.body[1])
        if not red or not isinstance(upd, Store) or any(f.kind != "serial" for f in red):
            return None
        out.append(_Stage(pos, nest, tuple(loops), upd, inner.body[0], tuple(red)))
    for st in out:
        for s in (st.store, st.init):
            if s is not None and any(c is not v for c, v in zip(s.coords, s.iters)):
                return None
    return out


def _reads(e: Expr, buf: Buffer) -> list[Load]:
    return [n for n in walk(e) if isinstance(n, Load) and n.buffer is buf]


class _Replace(Transformer):
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


def _factor(t: Expr, is_exp: object) -> bool:
    """Whether `t` is a product in which the exponential term (`is_exp(e)`) is a factor of the numerator
    and occurs nowhere else: then `t(m_new) = t(m_old) * exp(m_old - m_new)`, the rescaling distributes."""
    if is_exp(t):  # type: ignore[operator]
        return True
    if isinstance(t, Binary) and t.op == "mul":
        la, lb = _factor(t.a, is_exp), _factor(t.b, is_exp)
        return (la and not _has(t.b, is_exp)) or (lb and not _has(t.a, is_exp))
    if isinstance(t, Binary) and t.op == "div":
        return _factor(t.a, is_exp) and not _has(t.b, is_exp)
    return False


def _has(e: Expr, is_exp: object) -> bool:
    return any(is_exp(n) for n in walk(e) if isinstance(n, Expr))  # type: ignore[operator]


# ----------------------------------------------------------------------------- the match


@dataclass(frozen=True)
class OnlineRewrite:
    """What the rewrite found: the max stage, the stages it folds (inlined, rolling sums) and the scores
    stage computed per key inside the pass (None when it stays as it is)."""

    max_stage: str
    inlined: tuple[str, ...]
    rolling: tuple[str, ...]
    scores: str | None
    state: tuple[str, ...] = ()  # the new temporaries: the scores of one key (if folded), m_new, the rescale factor
    key: str = ""  # the loop over the keys (the max's reduce axis)
    prepared: tuple[str, ...] = ()  # elementwise stages of the maximized value (a mask, a scaling) inlined first
    mask: str | None = None  # the condition of a masked score (where(cond, s, -inf)): each key runs under it


def _prepare(program: Program, name: str) -> Program:
    """`program` with the elementwise temporaries that the maximized value reads (e.g. a causal mask
    `where(j <= i, s, -inf)` or a scaling of the scores) inlined into all their readers."""
    for _ in range(len(program.temps)):
        stages = _stages(program) or []
        m = next((st for st in stages if st.buffer.name == name), None)
        if m is None:
            return program
        pure = [st for st in stages if st.init is None and st.buffer in program.temps
                and _reads(m.store.value, st.buffer)]
        if not pure:
            return program
        program = compute_inline(program, pure[0].buffer.name)[0]
    return program


def _match(program: Program, name: str) -> tuple[list[_Stage], _Stage, list[_Stage], list[_Stage], _Stage | None]:
    stages = _stages(program)
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

    # readers of the max: elementwise stages (inlined into their readers) and sums
    inlined: list[_Stage] = []
    rolling: list[_Stage] = []
    readers = [st for st in stages if st is not m and (_reads(st.store.value, buf)
                                                        or (st.init is not None and _reads(st.init.value, buf)))]
    if not readers:
        raise ArgumentError(f"online_softmax({name}): nothing reads the maximum {name!r}; a max without the "
                            "exponential exp(x - max) has nothing to rescale")
    for st in readers:
        (inlined if st.init is None else rolling).append(st)
    for e in inlined:
        if e.buffer in program.args:
            raise ArgumentError(f"online_softmax({name}): stage {e.buffer.name!r} reads {name!r} and is an output; "
                                "the online form never holds it whole, so it cannot be returned")
        users = [st for st in stages if st is not e and _reads(st.store.value, e.buffer)]
        if not users:
            raise ArgumentError(f"online_softmax({name}): stage {e.buffer.name!r} reads {name!r} but nothing reads it")
        for u in users:
            if u.init is None or not (isinstance(u.store.value, Binary) and u.store.value.op == "add"):
                raise ArgumentError(
                    f"online_softmax({name}): the softmax {e.buffer.name!r} is read by stage {u.buffer.name!r}, "
                    f"which is not a sum over the keys; its consumer is not rescalable by exp(m_old - m_new)")
            if u not in rolling:
                rolling.append(u)
    rolling.sort(key=lambda st: st.pos)
    inl = {e.buffer: e for e in inlined}
    rbufs = {r.buffer for r in rolling}
    divided: set[Buffer] = set()
    divisors: set[Buffer] = set()
    terms: list[tuple[Expr, tuple[Var, ...], Var]] = []
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
        term = _inline(rv.b, inl)
        for ld in _reads(term, buf):
            if tuple(ld.indices) != row:
                raise ArgumentError(f"online_softmax({name}): the sum {r.buffer.name!r} reads {name!r} of another row")
        split = _strip_divisor(term, rbufs, row) if any(_reads(term, b) for b in rbufs) else None
        if split is not None and split[1].buffer is not r.buffer and not any(_reads(split[0], b) for b in rbufs):
            term = split[0]  # sum_j t / D[row] = (sum_j t) / D[row]: divided once the pass is over
            divided.add(r.buffer)
            divisors.add(split[1].buffer)
        if any(_reads(term, b) for b in rbufs) or divided & divisors:
            raise ArgumentError(
                f"online_softmax({name}): the sum {r.buffer.name!r} reads another running sum of the chain inside "
                "its terms other than as a divisor of the whole term (only t / sum[row] can wait for the end of "
                "the pass); divide after the sum instead: sum(exp(s - max) * v) / sum(exp(s - max))")
        terms.append((term, row, j))
        target = _target(j, row, score_at, buf)

        def is_exp(e: Expr, target: Expr = target) -> bool:
            return e == target

        if not _has(term, is_exp):
            raise ArgumentError(
                f"online_softmax({name}): stage {r.buffer.name!r} reads {name!r} outside an exponential "
                f"exp(x - {name}) of the maximized value x; a max without the exponential cannot be rescaled")
        if _reads(_Replace({target: Const(1.0, target.dtype)}).visit(term), buf) or not _factor(term, is_exp):
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
        others = [st for st in stages if st is not sc and st.buffer not in chain and _reads(st.store.value, sc.buffer)]
        if (not others and len(sc.axis) == len(idx) + 1 and sc.loops[-1].lo == m.red[0].lo
                and sc.loops[-1].hi == m.red[0].hi and tuple(sc.store.indices) == sc.axis
                and all(tuple(ld.indices) == idx + (rvar,) for ld in loads if ld.buffer is sc.buffer)
                and all(tuple(ld.indices) == row + (j,) for t, row, j in terms for ld in _reads(t, sc.buffer))):
            scores = sc
    return stages, m, inlined, rolling, scores


def _target(j: Expr, row: tuple[Expr, ...], score_at: object, buf: Buffer) -> Expr:
    return nodes.call("exp", nodes.binary("sub", score_at(j, row), Load(buf, row)))  # type: ignore[operator]


def _strip_divisor(t: Expr, sums: set[Buffer], row: tuple[Expr, ...]) -> tuple[Expr, Load] | None:
    """(t', D) when `t` is `t' / D` up to a product, D a load of one of `sums` at `row` (constant in the key)."""
    if isinstance(t, Binary) and t.op == "div" and isinstance(t.b, Load) and t.b.buffer in sums \
            and tuple(t.b.indices) == tuple(row):
        return t.a, t.b
    if isinstance(t, Binary) and t.op == "mul":
        for a, b, left in ((t.a, t.b, True), (t.b, t.a, False)):
            got = _strip_divisor(a, sums, row)
            if got is not None:
                return (nodes.binary("mul", got[0], b) if left else nodes.binary("mul", b, got[0])), got[1]
    return None


def _inline(e: Expr, inl: dict[Buffer, _Stage]) -> Expr:
    """`e` with the loads of the elementwise stages in `inl` replaced by their values."""

    class _I(Transformer):
        def visit_Load(self, ld: Load) -> Expr:
            st = inl.get(ld.buffer)
            if st is None:
                return Load(ld.buffer, tuple(self.visit(i) for i in ld.indices))
            return self.visit(substitute(st.store.value, dict(zip(st.axis, ld.indices))))

    return _I().visit(e) if inl else e


def find_softmax_max(program: Program) -> list[str]:
    """The buffers the rewrite applies to (its precondition holds), in program order."""
    stages = _stages(program) or []
    out = []
    for st in stages:
        if st.init is not None and isinstance(st.store.value, Binary) and st.store.value.op == "max":
            try:
                _match(_prepare(program, st.buffer.name), st.buffer.name)
            except ArgumentError:
                continue
            out.append(st.buffer.name)
    return out


# ----------------------------------------------------------------------------- the rewrite


def _store(name: str, buf: Buffer, idx: tuple[Expr, ...], value: Expr, iters: tuple[Var, ...]) -> Store:
    return Store(name, buf, idx, nodes.cast(buf.dtype, value) if value.dtype != buf.dtype else value, iters, iters)


def _nest(loops: tuple[For, ...], body: Stmt, mapping: dict[Var, Expr]) -> Stmt:
    """`body` inside copies of `loops` whose variables are replaced by `mapping` (a loop mapped is dropped)."""
    for f in reversed(loops):
        if f.var in mapping:
            continue
        body = For(f.var, f.lo, f.hi, body, pragmas=f.pragmas)
    return body


def _rename(st: Store, mapping: dict[Var, Expr], iters: tuple[Var, ...], repl: _Replace | None = None,
            buf: Buffer | None = None, drop: int = 0) -> Store:
    idx = tuple(substitute(i, mapping) for i in st.indices)
    value = substitute(st.value, mapping)
    if repl is not None:
        value = repl.visit(value)
    b = buf or st.buffer
    return Store(st.name, b, idx[: len(idx) - drop], value, iters, iters)


def online_softmax(program: Program, max_buffer: str) -> tuple[Program, OnlineRewrite]:
    """The softmax chain around the row maximum `max_buffer` computed in one pass with a running maximum.

    Precondition (checked; anything else is refused with ArgumentError naming the reason), on the
    unscheduled program, with rows R (the loops of `mx`) and keys j (its reduce axis):
      * `mx[R] = max_j f(R, j)` is a max reduction over one axis;
      * every stage reading `mx` is either an elementwise stage E (not an output) whose every reader is a
        sum over the keys, or such a sum S itself; after inlining the E, each sum reads
        `S[R, c] = sum_j t(R, c, j)` where `t` is a product with the factor `exp(f(R, j) - mx[R])` (in the
        numerator, nowhere else), reads `mx` only there, runs over the keys of `mx` and reads no other sum
        of the chain — except as a divisor `t = t' / S2[R]` (probabilities divided by their row sum), which
        is constant in the key: then `S = (sum_j t') / S2[R]`, divided once after the pass (S2 itself
        not divided). Then `t` computed with any `m` equals `t` computed with `m_new` times
        `exp(m - m_new)`: the partial sums rescale, and the result is the same for every order of keys.
      * the producer of `f` (the scores: a reduction read only by the chain at `(R, j)`) is computed per
        key inside the pass, into a buffer without the key dimension.

        scores[b,i,j] = sum_r Q.K           for b, i:
        mx[b,i] = max_j scores[b,i,j]          mx[b,i] = -inf; O[b,i,:] = 0; sm[b,i] = 0
        p = exp(scores - mx) * 0.125    ->     for j:
        sm[b,i] = sum_j p[b,i,j]                 scores[b,i] = sum_r Q.K
        O[b,i,c] = sum_j p[b,i,j] V[b,j,c]       mx_new = max(mx, scores);  mx_scale = exp(mx - mx_new)
                                                 sm = sm * mx_scale + exp(scores - mx_new) * 0.125
                                                 O[c] = O[c] * mx_scale + exp(scores - mx_new) * 0.125 * V[b,j,c]
                                                 mx = mx_new
      * a masked score `f = where(cond, x, -inf)` (cond reading no buffer, e.g. the causal `j <= i`): a masked
        key leaves the running state unchanged (m_new = m, the rescale 1, the new terms exp(-inf) = 0) once
        the row has seen an unmasked key, so the pass runs each key's statements under `if cond` instead
        (`x` for `f` inside); the scores of masked keys are never computed, and a row whose first keys are
        masked does not meet exp(-inf - (-inf)).
    Legality is not a matter of order (the statements change); the step is checked by running the old
    and the new program on the same random data (all sizes CHECK_SIZE) in the interpreter."""
    before = {t.name for t in program.temps}
    program = _prepare(program, max_buffer)
    prepared = tuple(sorted(before - {t.name for t in program.temps}))
    _, m, inlined, rolling, scores = _match(program, max_buffer)
    buf = m.buffer
    idx = m.axis
    jloop = m.red[0]
    j = jloop.var
    taken: set[str] = set()

    def temp(base: str, shape: tuple[Expr, ...], dtype: str) -> Buffer:
        name = fresh_name(program, base, taken)
        taken.add(name)
        return Buffer(name, shape, dtype)

    new_temps: list[Buffer] = []
    body: list[Stmt] = [m.init]
    for r in rolling:  # the running sums start at zero
        mp = dict(zip(r.axis[: len(idx)], idx))
        fresh = {g.var: Var(g.var.name, g.var.dtype) for g in r.loops[len(idx):]}  # loops of one variable each
        extra = tuple(For(fresh[g.var], g.lo, g.hi, g.body) for g in r.loops[len(idx):])
        mp.update(fresh)
        assert r.init is not None
        body.append(_nest(extra, _rename(r.init, mp, idx + tuple(fresh.values())), {}))
    per_key: list[Stmt] = []
    f = m.store.value.b  # type: ignore[attr-defined]
    repl = _Replace()
    if scores is not None:  # the scores of this key, into a buffer without the key dimension
        s1 = temp(f"{scores.buffer.name}_key", scores.buffer.shape[:-1], scores.buffer.dtype)
        new_temps.append(s1)
        repl = _Replace(loads={scores.buffer: (s1, 1)})
        mp = dict(zip(scores.axis, idx + (j,)))
        assert scores.init is not None
        per_key.append(_rename(scores.init, mp, idx + (j,), buf=s1, drop=1))
        red_its = idx + (j,) + tuple(g.var for g in scores.red)
        per_key.append(_nest(scores.red, _rename(scores.store, mp, red_its, repl, buf=s1, drop=1), {}))
    fj = repl.visit(f)
    m_new = temp(f"{buf.name}_new", buf.shape, buf.dtype)
    scale = temp(f"{buf.name}_scale", buf.shape, buf.dtype)
    new_temps += [m_new, scale]
    row_its = idx + (j,)
    cur, nxt = Load(buf, idx), Load(m_new, idx)
    per_key.append(_store(f"{buf.name}_online", m_new, idx, nodes.binary("max", cur, fj), row_its))
    # exp(m_old - m_new), 1 where they are equal (also when both are -inf, for a row masked so far)
    factor = nodes.select(nodes.compare("eq", cur, nxt), Const(1.0, buf.dtype), nodes.call("exp", cur - nxt))
    per_key.append(_store(f"{buf.name}_rescale", scale, idx, factor, row_its))
    inl = {e.buffer: e for e in inlined}
    rbufs = {r.buffer for r in rolling}
    after: list[Stmt] = []
    for r in rolling:
        rj = r.red[0].var
        row = r.axis[: len(idx)]
        mp: dict[Var, Expr] = dict(zip(row, idx))
        mp[rj] = j
        extra = r.loops[len(idx):]
        its = idx + (j,) + tuple(g.var for g in extra)
        term = _inline(r.store.value.b, inl)  # type: ignore[attr-defined]
        split = _strip_divisor(term, rbufs, row) if any(_reads(term, b) for b in rbufs) else None
        if split is not None:  # divided once the pass is over (the precondition checked it is a final sum)
            term = split[0]
            fresh = {g.var: Var(g.var.name, g.var.dtype) for g in extra}
            at = {**mp, **fresh}
            fidx = tuple(substitute(i, at) for i in r.store.indices)
            fits = idx + tuple(fresh.values())
            div = _store(f"{r.store.name}_divide", r.buffer, fidx,
                         nodes.binary("div", Load(r.buffer, fidx), substitute(split[1], at)), fits)
            after.append(_nest(tuple(For(fresh[g.var], g.lo, g.hi, g.body) for g in extra), div, {}))
        term = substitute(term, mp)
        old_exp = nodes.call("exp", nodes.binary("sub", f, cur))
        new_exp = nodes.call("exp", nodes.binary("sub", fj, nxt))
        term = _Replace({old_exp: new_exp}).visit(term)
        term = repl.visit(term)
        acc = Load(r.buffer, tuple(substitute(i, mp) for i in r.store.indices))
        upd = _store(r.store.name, r.buffer, acc.indices, acc * Load(scale, idx) + term, its)
        per_key.append(_nest(extra, upd, {}))
    per_key.append(_store(f"{buf.name}_advance", buf, idx, nxt, row_its))
    key_body: Stmt = Seq(tuple(per_key))
    masked = _mask(fj)
    if masked is not None:  # a masked key leaves the state as it is: skip it (its score is not even computed)
        key_body = If(masked[0], _Replace({fj: masked[1]}).visit(key_body))
    body.append(For(j, jloop.lo, jloop.hi, key_body))
    body += after
    nest = _nest(m.loops, Seq(tuple(body)), {})
    gone = {m.pos, *(e.pos for e in inlined), *(r.pos for r in rolling)} | ({scores.pos} if scores else set())
    top = _top_nests(program)
    last = max(gone)
    out = [nest if k == last else s for k, s in enumerate(top) if k not in gone or k == last]
    dropped = {e.buffer for e in inlined} | ({scores.buffer} if scores else set())
    temps = tuple(t for t in program.temps if t not in dropped) + tuple(new_temps)
    new = dataclasses.replace(program, body=Seq(tuple(out)) if len(out) > 1 else out[0], temps=temps)
    info = OnlineRewrite(buf.name, tuple(e.buffer.name for e in inlined), tuple(r.buffer.name for r in rolling),
                         scores.buffer.name if scores else None, tuple(t.name for t in new_temps), j.name, prepared,
                         str(masked[0]) if masked is not None else None)
    return new, info


def _mask(f: Expr) -> tuple[Expr, Expr] | None:
    """(cond, x) when the score is `where(cond, x, -inf)` with `cond` reading no buffer (a mask such as the
    causal `j <= i`), else None."""
    if (isinstance(f, Select) and isinstance(f.b, Const) and f.b.value == float("-inf")
            and not any(isinstance(n, Load) for n in walk(f.cond))):
        return f.cond, f.a
    return None


ROW_SAMPLE = 2  # the rows (leading loops) of each dimension the random-data check runs


def _sample_rows(old: Program, new: Program) -> tuple[Program, Program] | None:
    """Both programs with their common leading loops (the rows: the rewrite keeps them, in the new program
    around the per-key pass) cut to their first ROW_SAMPLE iterations (a symbolic extent to min(extent,
    ROW_SAMPLE)), or None when the nests do not share a leading chain. Rows are independent (the rewrite's
    precondition: each row's max, sums and output read only that row), so the rows kept compute what they did
    in full: the check costs a few rows (4 x 300 x 300 x 64 attention: 2 x 150 s in the interpreter before)."""
    chains = [_chain(s)[0] for p in (old, new) for s in _top_nests(p)]
    depth = 0
    while all(len(c) > depth for c in chains):
        b = {(c[depth].lo, c[depth].hi) for c in chains}
        lo, hi = next(iter(b))
        if len(b) != 1 or not isinstance(lo, Const):
            break
        depth += 1
    if depth == 0:
        return None

    def cut(p: Program) -> Program:
        def go(s: Stmt, d: int) -> Stmt:
            if d == depth or not isinstance(s, For):
                return s
            cut_at = Const(int(s.lo.value) + ROW_SAMPLE, s.hi.dtype)  # type: ignore[attr-defined]
            hi = (Const(min(int(s.hi.value), int(cut_at.value)), s.hi.dtype) if isinstance(s.hi, Const)
                  else nodes.binary("min", s.hi, cut_at))
            return dataclasses.replace(s, hi=hi, body=go(s.body, d + 1))
        body = tuple(go(s, 0) for s in _top_nests(p))
        return dataclasses.replace(p, body=Seq(body) if isinstance(p.body, Seq) else body[0])
    return cut(old), cut(new)


def check_online(ctx: CheckContext) -> None:
    """The new program computes what the old one did: the nests the rewrite replaced and the one it made
    (`_changed_part`) run in the interpreter on the same random data (symbolic sizes: each CHECK_SIZE), the
    first ROW_SAMPLE rows of each row dimension."""
    old, new = _changed_part(ctx.old, ctx.new)
    old, new = _sample_rows(old, new) or (old, new)
    env = {p: CHECK_SIZE for p in old.params}
    rng = np.random.default_rng(0)
    outs = [b for b in old.args if _written(old, b)]
    arrays = {}
    for b in old.args:
        shape = size_of(b.shape, env)
        arrays[b.name] = _as(np.full(shape, np.nan) if b in outs else rng.standard_normal(shape), b.dtype)
    a_old = {k: v.copy() for k, v in arrays.items()}
    a_new = {k: v.copy() for k, v in arrays.items()}
    sizes = {p.name: CHECK_SIZE for p in old.params}
    interp.run(old, *(a_old[b.name] for b in old.args), sizes=sizes)
    interp.run(new, *(a_new[b.name] for b in new.args), sizes=sizes)
    for b in outs:
        x, y = _widen(a_old[b.name], b.dtype), _widen(a_new[b.name], b.dtype)
        tol = {"float16": 1e-2, "bfloat16": 5e-2}.get(b.dtype, 1e-4)
        if not np.allclose(x, y, rtol=tol, atol=tol, equal_nan=True):
            k = tuple(int(v) for v in np.argwhere(~np.isclose(x, y, rtol=tol, atol=tol, equal_nan=True))[0])
            raise ScheduleError("online_softmax", "value", b.name, ("", {}), ("", {}), {p.name: CHECK_SIZE for p in
                                                                                        old.params},
                                message=f"online_softmax changed the result: {b.name}{list(k)} is {y[k]} instead of "
                                        f"{x[k]} on random data (sizes {CHECK_SIZE})")
    return None


def _as(a: np.ndarray, dtype: str) -> np.ndarray:
    return to_bfloat16(a) if dtype == "bfloat16" else a.astype(dtype)


def _widen(a: np.ndarray, dtype: str) -> np.ndarray:
    return (from_bfloat16(a) if dtype == "bfloat16" else a).astype(np.float64)


def _changed_part(old: Program, new: Program) -> tuple[Program, Program]:
    """The nests the rewrite replaced and the nest it made, each as a program of its own: the nests before and
    after them are the same objects in both programs, so the check runs only the chain (in a whole model block,
    not the matmuls around it). A buffer the part shares with the rest of the program (or the caller) is an
    argument of both parts: read, it gets the same random data; written, its values are compared."""
    a, b = _top_nests(old), _top_nests(new)
    lo, hi = common_ends(a, b)
    if lo == 0 and hi == 0:
        return old, new
    # nests between the replaced ones that the rewrite kept as they were (a projection the pass reads) run
    # before the new pass as they did before the old nests: part of the rest, unless they read what the old
    # nests wrote (then only the whole programs say whether moving the chain after them is right)
    kept = tuple(n for n in a[lo:len(a) - hi] if any(n is m for m in b[lo:len(b) - hi]))
    mid_a = tuple(n for n in a[lo:len(a) - hi] if not any(n is m for m in kept))
    mid_b = tuple(n for n in b[lo:len(b) - hi] if not any(n is m for m in kept))
    rest = a[:lo] + kept + a[len(a) - hi:]

    def used(nests: tuple[Stmt, ...]) -> set[Buffer]:
        return {n.buffer for s in nests for n in walk(s) if isinstance(n, (Load, Store))}

    if not mid_a or not mid_b or used(kept) & {n.buffer for s in mid_a for n in walk(s) if isinstance(n, Store)}:
        return old, new

    outside = used(rest) | set(old.args)
    in_a, in_b = used(mid_a), used(mid_b)
    args = tuple(x for x in (*old.args, *old.temps) if x in outside and x in (in_a | in_b))

    def part(p: Program, mid: tuple[Stmt, ...], inside: set[Buffer]) -> Program:
        temps = tuple(t for t in p.temps if t in inside and t not in args)
        params = tuple(v for v in p.params if any(v in free_vars(e) for x in args + temps for e in x.shape)
                       or any(isinstance(n, Var) and n is v for s in mid for n in walk(s)))
        return dataclasses.replace(p, args=args, temps=temps, params=params,
                                   body=Seq(mid) if len(mid) > 1 else mid[0])
    return part(old, mid_a, in_a), part(new, mid_b, in_b)


def _written(program: Program, b: Buffer) -> bool:
    return any(isinstance(s, Store) and s.buffer is b for s in walk(program.body))


def _push(s: Stmt, cond: Expr, loop: Var) -> Stmt | None:
    """`if cond: s` with the test moved down to the body of `loop` (None when `loop` is not below `s` through
    sequences, allocations and loops that `cond` does not use)."""
    if isinstance(s, For):
        if s.var is loop:
            return dataclasses.replace(s, body=If(cond, s.body))
        if s.var in free_vars(cond):
            return None
        inner = _push(s.body, cond, loop)
        return None if inner is None else dataclasses.replace(s, body=inner)
    if isinstance(s, Allocate):
        inner = _push(s.body, cond, loop)
        return None if inner is None else dataclasses.replace(s, body=inner)
    if isinstance(s, Seq):
        out, found = [], False
        for c in s.body:
            r = None if found else _push(c, cond, loop)
            found = found or r is not None
            out.append(r if r is not None else If(cond, c))
        return Seq(tuple(out)) if found else None
    return None


def sink_guard(program: Program, loop: Var) -> Program:
    """The guards (If without else, testing no buffer) around `loop` moved into the body of `loop` (through the
    sequences, allocations and loops between that the condition does not use): the same instances run in the
    same order, but every thread of a block reaches `loop` itself, so a shared-memory copy at its top can be
    cooperative and its barriers uniform.

        for t (thread):                          for t (thread):
            if t < n:                               S0    (if t < n)
                S0                      ->          for j:
                for j: body                             if t < n: body

    Precondition: some If above `loop` has no else branch, a condition free of loads and of the loops between;
    checked like every reordering (the dependences, and the instances run unchanged)."""
    moved = False

    class _S(Transformer):
        def visit_If(self, node: If) -> Stmt:
            nonlocal moved
            if node.orelse is None and not any(isinstance(n, Load) for n in walk(node.cond)):
                r = _push(node.then, node.cond, loop)
                if r is not None:
                    moved = True
                    return self.visit(r)
            return self.generic(node)

        def visit(self, node: object) -> object:
            return node if isinstance(node, Expr) else super().visit(node)

    new = dataclasses.replace(program, body=_S().visit(program.body))
    if not moved:
        raise ArgumentError(f"sink_guard({loop.name}): no guard (if without else) encloses loop {loop.name!r} "
                            "below its nearest enclosing loop")
    return new


@primitive("sink_guard", check="order")
def _sink_guard(program: Program, loop: Var) -> Program:
    return sink_guard(program, loop)


_sink_guard.__doc__ = sink_guard.__doc__


@primitive("online_softmax", check=check_online, rebase=True)
def _online_softmax(program: Program, max_buffer: str) -> Program:
    return online_softmax(program, max_buffer)[0]


_online_softmax.__doc__ = online_softmax.__doc__
