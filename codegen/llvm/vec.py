"""Explicit vector emission of `vectorize` loops on the CPU (full-tile versioning, which gives
such loops constant bounds, is a pass: `codegen.passes.versioning`).

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
from loopir.nodes import Binary, Const, Expr, For, Load, Seq, Store, Unary
from loopir.visit import substitute

from .math import vector_bits
from .queries import _const_extent, is_reduction
from .types import ITEMSIZE, fconst

if TYPE_CHECKING:
    from .emit import _FnEmitter

VEC_DTYPES = {"float32": "float", "float64": "double"}
MAX_CHUNKS = 16  # a vectorize loop of more than this many register widths is left to LLVM


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
