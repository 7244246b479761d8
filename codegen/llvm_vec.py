"""Two CPU code-generation helpers that make register-tiled loops fast: full-tile versioning
and explicit vector emission of `vectorize` loops.

Versioning. Tiling a loop whose extent the tile does not divide leaves guards that `tighten`
turns into bounds `min(C, lim)`; such a loop has no constant trip count, so it can be neither
fully unrolled nor turned into a fixed number of vector operations. `version_loops` splits
the body of the loop where every such `lim` is invariant:

    for io:                                   for io:
        for ii in unroll(0, min(8, n - 8*io)):    if 8 <= n - 8*io:  for ii in unroll(0, 8): S
            S                          ==>        else:              for ii in unroll(0, min(8, n - 8*io)): S

Only `unroll`/`vectorize` loops with constant bounds before tightening are versioned. It is
semantically the identity (the condition selects between two equal programs), so nothing to check.

Vector emission. A `vectorize` loop of constant extent whose body is stores of one float dtype,
each store and load either contiguous in the loop variable (the last index is `v + rest`, the
others free of `v`) or free of it, and whose values use only + - * / max min neg and constants,
is emitted as explicit `<VL x T>` operations, VL the register width (loads free of `v` become
broadcasts). The legality of `vectorize` (no dependence carried by the loop) makes evaluating
the lanes of one statement together, and the statements one after another, equivalent to the
serial loop. Anything else falls back to LLVM's loop vectorizer (the loop metadata), which is
what libm calls need (they go through libmvec there). Explicit vectors matter for a register
tile: a scratch array touched only by constant-offset vector loads and stores is promoted to
SSA values by SROA, so the accumulators of a GEMM micro-kernel live in registers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loopir.affine import access_pattern
from loopir.nodes import Allocate, Binary, Compare, Const, Expr, For, If, Load, Logical, Seq, Stmt, Store, Unary, Var
from loopir.visit import substitute, walk

from .llvm_math import vector_bits
from .llvm_passes import _const_extent, is_reduction
from .llvm_types import ITEMSIZE, fconst

if TYPE_CHECKING:
    from .llvm import _FnEmitter

VEC_DTYPES = {"float32": "float", "float64": "double"}
MAX_CHUNKS = 16  # a vectorize loop of more than this many register widths is left to LLVM


# ----------------------------------------------------------------------------- versioning


def _min_chain(f: For) -> tuple[int, list[Expr]] | None:
    """(C, [lim...]) when f.hi is min(...min(C, lim1)..., limk) with constant C and lo."""
    lims: list[Expr] = []
    hi = f.hi
    while isinstance(hi, Binary) and hi.op == "min":
        lims.append(hi.b)
        hi = hi.a
    if not lims or not isinstance(hi, Const) or not isinstance(f.lo, Const):
        return None
    return int(hi.value), lims


def _bound_inside(s: Stmt) -> set[Var]:
    return {n.var for n in walk(s) if isinstance(n, For)}


def _versionable(s: Stmt) -> list[tuple[For, int, list[Expr]]]:
    """The min-bounded unroll/vectorize loops in `s` whose limits are invariant in `s`."""
    inner = _bound_inside(s)
    out = []
    for n in walk(s):
        if isinstance(n, For) and n.kind in ("unroll", "vectorize"):
            mc = _min_chain(n)
            if mc is not None and not any(isinstance(x, Var) and x in inner for lim in mc[1] for x in walk(lim)):
                out.append((n, *mc))
    return out


def _with_const_bounds(s: Stmt, loops: dict[int, int]) -> Stmt:
    if isinstance(s, Seq):
        return Seq(tuple(_with_const_bounds(x, loops) for x in s.body))
    if isinstance(s, If):
        return If(s.cond, _with_const_bounds(s.then, loops),
                  None if s.orelse is None else _with_const_bounds(s.orelse, loops))
    if isinstance(s, Allocate):
        return Allocate(s.buffer, _with_const_bounds(s.body, loops))
    if isinstance(s, For):
        hi = Const(loops[id(s)], "int64") if id(s) in loops else s.hi
        return For(s.var, s.lo, hi, _with_const_bounds(s.body, loops), s.kind, s.thread)
    return s


def version_loops(s: Stmt, budget: int = 8) -> Stmt:
    """Full-tile versions of loop bodies (see the module doc); `budget` bounds the code growth."""
    if isinstance(s, Seq):
        return Seq(tuple(version_loops(x, budget) for x in s.body))
    if isinstance(s, If):
        return If(s.cond, version_loops(s.then, budget), None if s.orelse is None else version_loops(s.orelse, budget))
    if isinstance(s, Allocate):
        return Allocate(s.buffer, version_loops(s.body, budget))
    if not isinstance(s, For):
        return s
    found = _versionable(s.body) if budget > 1 else []
    if not found:
        return For(s.var, s.lo, s.hi, version_loops(s.body, budget), s.kind, s.thread)
    checks: list[Expr] = []
    for _, c, lims in found:
        for lim in lims:
            ck = Compare("le", Const(c, lim.dtype), lim)
            if ck not in checks:  # structural equality: tiles of one loop share their limit
                checks.append(ck)
    cond: Expr | None = None
    for ck in checks:
        cond = ck if cond is None else Logical("and", cond, ck)
    full = _with_const_bounds(s.body, {id(f): c for f, c, _ in found})
    assert cond is not None
    body = If(cond, version_loops(full, budget // 2), s.body)
    return For(s.var, s.lo, s.hi, body, s.kind, s.thread)


# ----------------------------------------------------------------------------- vector emission


class _Plan:
    def __init__(self, stores: list[Store], kinds: dict[int, str], dtype: str) -> None:
        self.stores, self.kinds, self.dtype = stores, kinds, dtype


def _plan(f: For) -> _Plan | None:
    body = f.body
    stmts = list(body.body) if isinstance(body, Seq) else [body]
    if not stmts or not all(isinstance(x, Store) for x in stmts):
        return None
    dtypes = set()
    kinds: dict[int, str] = {}
    for st in stmts:
        assert isinstance(st, Store)
        dtypes.add(st.buffer.dtype)
        sub = dict(zip(st.iters, st.coords))
        k = access_pattern(tuple(substitute(e, sub) for e in st.indices), f.var)
        if k != "contig":
            return None
        kinds[id(st)] = k
        if st.value.dtype != st.buffer.dtype:
            return None
        todo: list[Any] = [st.value]
        while todo:
            e = todo.pop()
            if isinstance(e, Const):
                continue
            if isinstance(e, Load):
                k = access_pattern(tuple(substitute(x, sub) for x in e.indices), f.var)
                if k is None:
                    return None
                kinds[id(e)] = k
                dtypes.add(e.dtype)
            elif isinstance(e, Binary) and e.op in ("add", "sub", "mul", "div", "max", "min"):
                todo += [e.a, e.b]
                dtypes.add(e.dtype)
            elif isinstance(e, Unary) and e.op == "neg":
                todo.append(e.a)
                dtypes.add(e.dtype)
            else:
                return None
    if len(dtypes) != 1 or next(iter(dtypes)) not in VEC_DTYPES:
        return None
    return _Plan(stmts, kinds, dtypes.pop())  # type: ignore[arg-type]


class _VecEmitter:
    """Vector code for one statement of one chunk: values are (text, is_vector)."""

    def __init__(self, fe: _FnEmitter, plan: _Plan, vl: int, st: Store) -> None:
        self.fe, self.plan, self.vl = fe, plan, vl
        self.t = VEC_DTYPES[plan.dtype]
        self.vt = f"<{vl} x {self.t}>"
        self.memo: dict[int, tuple[str, bool]] = {}
        red = is_reduction(st)
        self.fast: set[int] = set() if red is None else {id(red)}
        self.contract = set(self.fast)
        if red is not None and red.op == "add":  # let the product feeding the sum become an FMA
            self.contract.update(id(x) for x in (red.a, red.b) if isinstance(x, Binary) and x.op == "mul")

    def splat(self, x: str) -> str:
        vt, t = self.vt, self.t
        ins = self.fe.op(f"insertelement {vt} poison, {t} {x}, i64 0")
        return self.fe.op(f"shufflevector {vt} {ins}, {vt} poison, <{self.vl} x i32> zeroinitializer")

    def vec(self, e: Expr) -> str:
        x, is_vec = self.expr(e)
        return x if is_vec else self.splat(x)

    def expr(self, e: Expr) -> tuple[str, bool]:
        if id(e) not in self.memo:
            self.memo[id(e)] = self._expr(e)
        return self.memo[id(e)]

    def _expr(self, e: Expr) -> tuple[str, bool]:
        fe, t, vt = self.fe, self.t, self.vt
        if isinstance(e, Const):
            return fconst(e.value, self.plan.dtype), False
        if isinstance(e, Load):
            ptr = fe.address(e.buffer, e.indices)
            isz = ITEMSIZE[self.plan.dtype]
            if self.plan.kinds[id(e)] == "uniform":
                return fe.op(f"load {t}, ptr {ptr}, align {isz}"), False
            return fe.op(f"load {vt}, ptr {ptr}, align {isz}"), True
        if isinstance(e, Unary):
            a, av = self.expr(e.a)
            return fe.op(f"fneg {vt if av else t} {a}"), av
        assert isinstance(e, Binary)
        (a, av), (b, bv) = self.expr(e.a), self.expr(e.b)
        if av or bv:
            a, b = (a if av else self.splat(a)), (b if bv else self.splat(b))
        ty = vt if av or bv else t
        fm = " reassoc nsz" if id(e) in self.fast else ""
        if e.op in ("max", "min"):
            scalar = "f64" if t == "double" else "f32"
            intr = f"llvm.{'maximum' if e.op == 'max' else 'minimum'}.{scalar if ty == t else f'v{self.vl}{scalar}'}"
            fe.m.declare(intr, f"declare {ty} @{intr}({ty}, {ty})")
            return fe.op(f"call{fm} {ty} @{intr}({ty} {a}, {ty} {b})"), av or bv
        name = {"add": "fadd", "sub": "fsub", "mul": "fmul", "div": "fdiv"}[e.op]
        fm += " contract" if id(e) in self.contract else ""
        return fe.op(f"{name}{fm} {ty} {a}, {b}"), av or bv


def emit_vector_loop(fe: _FnEmitter, f: For) -> bool:
    """Emit constant-extent `vectorize` loop `f` as explicit vector code; False if not applicable."""
    ext = _const_extent(f)
    if ext is None or ext == 0:
        return False
    plan = _plan(f)
    if plan is None:
        return False
    isz = ITEMSIZE[plan.dtype]
    vl = vector_bits() // (8 * isz)
    if ext % vl or ext // vl > MAX_CHUNKS:
        return False
    lo = int(f.lo.value)  # type: ignore[union-attr]
    saved = fe.env.get(f.var)
    for chunk in range(ext // vl):
        fe.env[f.var] = str(lo + chunk * vl)
        for st in plan.stores:
            fe.memo = {}
            saved_iters = {v: fe.env[v] for v in st.iters if v in fe.env}
            vals = [fe.index(c) for c in st.coords]
            for v, x in zip(st.iters, vals):
                fe.env[v] = x
            ve = _VecEmitter(fe, plan, vl, st)
            val = ve.vec(st.value)
            ptr = fe.address(st.buffer, st.indices)
            fe.emit(f"store {ve.vt} {val}, ptr {ptr}, align {isz}")
            for v in st.iters:
                fe.env.pop(v, None)
            fe.env.update(saved_iters)
    fe._restore(f.var, saved)
    fe.memo = {}
    return True
