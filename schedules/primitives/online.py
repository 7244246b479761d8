"""online_softmax: the naive softmax chain rewritten with a running maximum (FlashAttention's rewrite).

The primitive takes the buffer of a row maximum `mx` and folds every stage that reads it into one
pass over the reduction axis that keeps the maximum seen so far and rescales the partial sums by
`exp(m_old - m_new)` whenever it grows, so neither the probabilities nor (when only this chain reads
them) the scores they are computed from exist as rows any more: no temporary of size n x m is left.
Which stages form the chain is decided in online_match.py.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from loopir import interp
from loopir.args import size_of
from loopir.dtypes import from_bfloat16, to_bfloat16
from loopir.errors import ArgumentError
from loopir.nodes import Allocate, Buffer, Const, Expr, For, If, Load, Program, Seq, Stmt, Store, Var
from loopir import nodes
from loopir.subst import replace_buffers
from loopir.visit import Transformer, free_vars, substitute, walk

from ..errors import ScheduleError
from ..nest_scope import common_ends
from . import CheckContext, fresh_name, primitive
from .online_match import Replace, chain_of, find_softmax_max, mask_of, match, prepare, top_nests

__all__ = ["online_softmax", "find_softmax_max", "OnlineRewrite", "sink_guard"]

CHECK_SIZE = 5  # the size every size variable takes in the random-data check (small: the interpreter is exact, slow)


@dataclass(frozen=True)
class OnlineRewrite:
    """What the rewrite found: the max stage, the stages it folds (inlined, rolling sums) and the scores
    stage computed per key inside the pass (None when it stays as it is)."""

    max_stage: str
    inlined: tuple[str, ...]
    rolling: tuple[str, ...]
    scores: str | None
    state: tuple[str, ...] = ()  # the new per-key temporaries: the scores of one key (if folded), m_new, the rescale
    key: str = ""  # the loop over the keys (the max's reduce axis)
    prepared: tuple[str, ...] = ()  # elementwise stages of the maximized value (a mask, a scaling) inlined first
    mask: str | None = None  # the condition of a masked score (where(cond, s, -inf)): each key runs under it
    sums: tuple[str, ...] = ()  # what the pass accumulates into, per rolling sum: the sum, or a divided output's _acc
    divided: tuple[str, ...] = ()  # the sums divided by another once the pass is over


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


def _rename(st: Store, mapping: dict[Var, Expr], iters: tuple[Var, ...], repl: Replace | None = None,
            buf: Buffer | None = None, drop: int = 0) -> Store:
    idx = tuple(substitute(i, mapping) for i in st.indices)
    value = substitute(st.value, mapping)
    if repl is not None:
        value = repl.visit(value)
    b = buf or st.buffer
    return Store(st.name, b, idx[: len(idx) - drop], value, iters, iters)


class _Quotient(Transformer):
    """Loads of divided temporaries read as the quotient they held before the rewrite, S[R, c] / S2[R] (in S's
    dtype: the value S stored)."""

    def __init__(self, by: dict[Buffer, tuple[tuple[Var, ...], Load]]):
        self.by = by  # the sum -> (its loop variables, the divisor in them)

    def visit_Load(self, ld: Load) -> Expr:  # noqa: N802 - the visitor's naming
        ld = self.generic(ld)
        got = self.by.get(ld.buffer)
        if got is None:
            return ld
        axis, d = got
        return nodes.cast(ld.buffer.dtype, nodes.binary("div", ld, substitute(d, dict(zip(axis, ld.indices)))))


def online_softmax(program: Program, max_buffer: str) -> tuple[Program, OnlineRewrite]:
    """The softmax chain around the row maximum `max_buffer` computed in one pass with a running maximum.

    Precondition (checked; anything else is refused with ArgumentError naming the stage and the reason), on the
    unscheduled program whose elementwise temporaries read by the maximized value (a scaling, a mask, a cast) are
    inlined first, with rows R (the loops of `mx`) and keys j (its reduce axis):
      * `mx[R] = max_j f(R, j)` is a max reduction over one axis;
      * the stages that read `mx`, directly or through one another, are elementwise temporaries E (not outputs)
        and sums over the keys: an E is read only by other such E and by sums (`te.sum`), and is inlined into
        them (the exponential exp(f - mx), the probabilities exp(f - mx) / sm[R], casts of either). After
        inlining, each sum reads `S[R, c] = sum_j t(R, c, j)` where `t` is a product with the factor
        `exp(f(R, j) - mx[R])` (in the numerator, nowhere else; products and conversions between float types,
        `cast`, may enclose it), reads `mx` only there, runs over the keys of `mx` and reads no other sum of the
        chain — except as a divisor of the whole term, `t = t' / S2[R]` up to a product and casts, S2 another
        sum of the chain, not itself divided (possibly cast), constant in the key: then
        `S = (sum_j t') / S2[R]`, where a cast `cast(a / S2[R])` in `t` leaves `cast(a)` in `t'` (the quotient
        rounded to the cast type once at the end instead of per term: about one ulp of that type). The
        division waits for the end of the pass: readers of a temporary S read `S / S2[R]`; an output S is
        accumulated in a new temporary `S_acc` and written as `S_acc / S2[R]` by a nest after the pass.
        Then `t'` computed with any `m` equals `t'` computed with `m_new` times `exp(m - m_new)` (up to the
        casts' rounding): the partial sums rescale, and the result is the same for every order of keys.
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

      The probabilities divided by their sum and cast back (Triton's tutorial reference, float16 data):

        Sf = float32(S)                        for b, i:
        mx[b,i] = max_j Sf[b,i,j]                mx = -inf; O_acc[b,i,:] = 0; sm = 0
        E = exp(Sf - mx)                         for j:
        sm[b,i] = sum_j E[b,i,j]          ->       S_key = ...; mx_new = ...; mx_scale = ...
        P = float16(E / sm)                        sm = sm * mx_scale + exp(float32(S_key) - mx_new)
        O[b,i,c] = sum_j P[b,i,j] V[b,j,c]         O_acc[c] = O_acc[c] * mx_scale
                                                               + float16(exp(float32(S_key) - mx_new)) * V[b,j,c]
                                                   mx = mx_new
                                               for b, i, c: O[b,i,c] = O_acc[b,i,c] / sm[b,i]

      * a masked score `f = where(cond, x, -inf)` (cond reading no buffer, e.g. the causal `j <= i`; possibly
        cast to another float type): a masked key leaves the running state unchanged (m_new = m, the rescale 1,
        the new terms exp(-inf) = 0) once the row has seen an unmasked key, so the pass runs each key's
        statements under `if cond` instead (`x` for `f` inside); the scores of masked keys are never computed,
        and a row whose first keys are masked does not meet exp(-inf - (-inf)).
    Legality is not a matter of order (the statements change); the step is checked by running the old
    and the new program on the same random data (all sizes CHECK_SIZE) in the interpreter."""
    before = {t.name for t in program.temps}
    program = prepare(program, max_buffer)
    prepared = tuple(sorted(before - {t.name for t in program.temps}))
    mt = match(program, max_buffer)
    m, inlined, rolling, scores = mt.max, mt.inlined, mt.rolling, mt.scores
    buf = m.buffer
    idx = m.axis
    jloop = m.red[0]
    j = jloop.var
    taken: set[str] = set()

    def temp(base: str, shape: tuple[Expr, ...], dtype: str) -> Buffer:
        name = fresh_name(program, base, taken)
        taken.add(name)
        return Buffer(name, shape, dtype)

    # a divided output gets the quotient from an accumulator after the pass, so that the pass writes it once (the
    # division can then be the pass's epilogue, as for O / sm written by hand)
    acc = {r.buffer: temp(f"{r.buffer.name}_acc", r.buffer.shape, r.buffer.dtype)
           if d is not None and r.buffer in program.args else r.buffer for r, d in zip(rolling, mt.divisor)}
    accumulators = [a for r, a in acc.items() if a is not r]
    state: list[Buffer] = []
    body: list[Stmt] = [m.init]
    for r in rolling:  # the running sums start at zero
        mp = dict(zip(r.axis[: len(idx)], idx))
        fresh = {g.var: Var(g.var.name, g.var.dtype) for g in r.loops[len(idx):]}  # loops of one variable each
        extra = tuple(For(fresh[g.var], g.lo, g.hi, g.body) for g in r.loops[len(idx):])
        mp.update(fresh)
        assert r.init is not None
        body.append(_nest(extra, _rename(r.init, mp, idx + tuple(fresh.values()), buf=acc[r.buffer]), {}))
    per_key: list[Stmt] = []
    f = m.store.value.b  # type: ignore[attr-defined]
    repl = Replace()
    if scores is not None:  # the scores of this key, into a buffer without the key dimension
        s1 = temp(f"{scores.buffer.name}_key", scores.buffer.shape[:-1], scores.buffer.dtype)
        state.append(s1)
        repl = Replace(loads={scores.buffer: (s1, 1)})
        mp = dict(zip(scores.axis, idx + (j,)))
        assert scores.init is not None
        per_key.append(_rename(scores.init, mp, idx + (j,), buf=s1, drop=1))
        red_its = idx + (j,) + tuple(g.var for g in scores.red)
        per_key.append(_nest(scores.red, _rename(scores.store, mp, red_its, repl, buf=s1, drop=1), {}))
    fj = repl.visit(f)
    m_new = temp(f"{buf.name}_new", buf.shape, buf.dtype)
    scale = temp(f"{buf.name}_scale", buf.shape, buf.dtype)
    state += [m_new, scale]
    row_its = idx + (j,)
    cur, nxt = Load(buf, idx), Load(m_new, idx)
    per_key.append(_store(f"{buf.name}_online", m_new, idx, nodes.binary("max", cur, fj), row_its))
    # exp(m_old - m_new), 1 where they are equal (also when both are -inf, for a row masked so far)
    factor = nodes.select(nodes.compare("eq", cur, nxt), Const(1.0, buf.dtype), nodes.call("exp", cur - nxt))
    per_key.append(_store(f"{buf.name}_rescale", scale, idx, factor, row_its))
    old_exp = nodes.call("exp", nodes.binary("sub", f, cur))
    new_exp = nodes.call("exp", nodes.binary("sub", fj, nxt))
    for r, term in zip(rolling, mt.terms):
        row = r.axis[: len(idx)]
        mp: dict[Var, Expr] = dict(zip(row, idx))
        mp[r.red[0].var] = j
        extra = r.loops[len(idx):]
        its = idx + (j,) + tuple(g.var for g in extra)
        term = repl.visit(Replace({old_exp: new_exp}).visit(substitute(term, mp)))
        a = Load(acc[r.buffer], tuple(substitute(i, mp) for i in r.store.indices))
        upd = _store(r.store.name, a.buffer, a.indices, a * Load(scale, idx) + term, its)
        per_key.append(_nest(extra, upd, {}))
    per_key.append(_store(f"{buf.name}_advance", buf, idx, nxt, row_its))
    key_body: Stmt = Seq(tuple(per_key))
    masked = mask_of(fj)
    if masked is not None:  # a masked key leaves the state as it is: skip it (its score is not even computed)
        key_body = If(masked[0], Replace({fj: masked[1]}).visit(key_body))
    body.append(For(j, jloop.lo, jloop.hi, key_body))
    nest = _nest(m.loops, Seq(tuple(body)), {})
    divisions: list[Stmt] = []  # the divided outputs, after the pass
    quotients: dict[Buffer, tuple[tuple[Var, ...], Load]] = {}  # the divided temporaries, in their readers
    for r, d in zip(rolling, mt.divisor):
        if d is None:
            continue
        if acc[r.buffer] is r.buffer:
            quotients[r.buffer] = (r.axis, d)
            continue
        fresh = {g.var: Var(g.var.name, g.var.dtype) for g in r.loops}
        at = tuple(fresh.values())
        div = _store(f"{r.store.name}_divide", r.buffer, at,
                     nodes.binary("div", Load(acc[r.buffer], at), substitute(d, fresh)), at)
        divisions.append(_nest(tuple(For(fresh[g.var], substitute(g.lo, fresh), substitute(g.hi, fresh), g.body,
                                         pragmas=g.pragmas) for g in r.loops), div, {}))
    gone = {m.pos, *(e.pos for e in inlined), *(r.pos for r in rolling)} | ({scores.pos} if scores else set())
    top = top_nests(program)
    last = max(gone)
    readers = _Quotient(quotients)
    out: list[Stmt] = []
    for k, s in enumerate(top):
        if k == last:
            out += [nest, *divisions]
        elif k not in gone:
            out.append(readers.visit(s) if quotients else s)
    dropped = {e.buffer for e in inlined} | ({scores.buffer} if scores else set())
    temps = tuple(t for t in program.temps if t not in dropped) + tuple(state) + tuple(accumulators)
    new = dataclasses.replace(program, body=Seq(tuple(out)) if len(out) > 1 else out[0], temps=temps)
    info = OnlineRewrite(buf.name, tuple(e.buffer.name for e in inlined), tuple(r.buffer.name for r in rolling),
                         scores.buffer.name if scores else None, tuple(t.name for t in state), j.name, prepared,
                         str(masked[0]) if masked is not None else None,
                         tuple(acc[r.buffer].name for r in rolling),
                         tuple(r.buffer.name for r, d in zip(rolling, mt.divisor) if d is not None))
    return new, info


ROW_SAMPLE = 2  # the rows (leading loops) of each dimension the random-data check runs


def _sample_rows(old: Program, new: Program) -> tuple[Program, Program] | None:
    """Both programs with their common leading loops (the rows: the rewrite keeps them, in the new program
    around the per-key pass) cut to their first ROW_SAMPLE iterations (a symbolic extent to min(extent,
    ROW_SAMPLE)), or None when the nests do not share a leading chain. Rows are independent (the rewrite's
    precondition: each row's max, sums and output read only that row), so the rows kept compute what they did
    in full: the check costs a few rows (4 x 300 x 300 x 64 attention: 2 x 150 s in the interpreter before)."""
    chains = [chain_of(s)[0] for p in (old, new) for s in top_nests(p)]
    depth = 0
    while all(len(c) > depth for c in chains):
        b = {(c[depth].lo, c[depth].hi) for c in chains}
        lo, hi = next(iter(b))
        if len(b) != 1 or not isinstance(lo, Const):
            break
        depth += 1
    if depth == 0:
        return None

    rows: set[Var] = set()  # the cut loops that start at 0: they index [0, ROW_SAMPLE) only
    cut_loops: list[For] = []

    def cut(p: Program) -> Program:
        def go(s: Stmt, d: int) -> Stmt:
            if d == depth or not isinstance(s, For):
                return s
            cut_at = Const(int(s.lo.value) + ROW_SAMPLE, s.hi.dtype)  # type: ignore[attr-defined]
            hi = (Const(min(int(s.hi.value), int(cut_at.value)), s.hi.dtype) if isinstance(s.hi, Const)
                  else nodes.binary("min", s.hi, cut_at))
            if int(s.lo.value) == 0:  # type: ignore[attr-defined]
                rows.add(s.var)
            cut_loops.append(dataclasses.replace(s, hi=hi, body=go(s.body, d + 1)))
            return cut_loops[-1]
        body = tuple(go(s, 0) for s in top_nests(p))
        return dataclasses.replace(p, body=Seq(body) if isinstance(p.body, Seq) else body[0])
    old_cut, new_cut = cut(old), cut(new)
    cut_ids = {id(f) for f in cut_loops}
    for p in (old_cut, new_cut):  # a variable that is also some loop's not cut ranges wider: not a row
        rows -= {f.var for f in walk(p.body) if isinstance(f, For) and id(f) not in cut_ids}
    return _shrink_rows(old_cut, new_cut, rows)


def _shrink_rows(old: Program, new: Program, rows: set[Var]) -> tuple[Program, Program]:
    """Both sampled programs with each fixed dimension that every access indexes by a cut row loop (starting at 0)
    shrunk to ROW_SAMPLE: the rows not run are not allocated either. Fixed-size attention at B 8, H 12, T 4096 kept
    its (B, H, T, T) scores, 1.6e9 elements, to run 2 x 2 x 2 rows: 44 s of the 65 s of auto_schedule (and 13 GB)."""
    index: dict[Buffer, list[tuple[Expr, ...]]] = {}
    seen: set[int] = set()
    opaque: set[Buffer] = set()  # touched other than by a statement's loads and store (a guard's load, a local
    for p in (old, new):         # buffer's Allocate): left as they are
        for st in walk(p.body):
            if isinstance(st, Store):
                at = {v: c for v, c in zip(st.iters, st.coords)}
                for ld in [n for x in (st.value, *st.indices) for n in walk(x) if isinstance(n, Load)] + [st]:
                    index.setdefault(ld.buffer, []).append(tuple(substitute(i, at) for i in ld.indices))
                    seen.add(id(ld))
        for n in walk(p.body):
            if isinstance(getattr(n, "buffer", None), Buffer) and id(n) not in seen:
                opaque.add(n.buffer)
    new_buf: dict[Buffer, Buffer] = {}
    for b, idxs in index.items():
        if b in opaque:
            continue
        shape = tuple(Const(ROW_SAMPLE, d.dtype) if isinstance(d, Const) and int(d.value) > ROW_SAMPLE
                      and all(isinstance(ix[k], Var) and ix[k] in rows for ix in idxs) else d
                      for k, d in enumerate(b.shape))
        if shape != b.shape:
            new_buf[b] = dataclasses.replace(b, shape=shape)
    return replace_buffers(old, new_buf), replace_buffers(new, new_buf)


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
        # relative to the output's largest value (at least 1): a half sum over many keys rounds each program
        # differently by a few units of its magnitude, which an element near 0 would exceed (O of float16 attention
        # at d 128 over 1024 keys: 0.03 apart at |O| <= 9, one element -0.076 against -0.088)
        finite = np.abs(x[np.isfinite(x)])
        atol = tol * max(1.0, float(finite.max()) if finite.size else 0.0)
        if not np.allclose(x, y, rtol=tol, atol=atol, equal_nan=True):
            k = tuple(int(v) for v in np.argwhere(~np.isclose(x, y, rtol=tol, atol=atol, equal_nan=True))[0])
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
    a, b = top_nests(old), top_nests(new)
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
