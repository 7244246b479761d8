"""Expression lowering of the CPU code generator: loopir expressions -> LLVM IR instructions.

`_ExprEmitter` holds one function's instruction list, the SSA names of loop variables and buffers
in scope, and a per-statement memo of emitted subexpressions; `llvm._FnEmitter` adds statements.
Numerics (Python floor division, NaN-propagating max/min, float16 rounding) are described in
`codegen.llvm`'s module doc.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loopir.nodes import (Binary, Buffer, Call, Cast, Compare, Const, Expr, ExternCall, Load, Logical, Select, Unary,
                          Var)

from .math import extern_decl, extern_stage_decl
from .queries import _loads
from .types import FLT, INTS, ITEMSIZE, STORE_T, UNSIGNED, VALUE_T, CodegenError, const_text

if TYPE_CHECKING:
    from .emit import _ModuleEmitter


class _ExprEmitter:
    def __init__(self, mod: _ModuleEmitter, bufs: dict[Buffer, str], env: dict[Var, str]) -> None:
        self.m = mod
        self.lines: list[str] = []
        self.bufs = dict(bufs)
        self.env = dict(env)
        self.n = 0
        self.block = "entry"
        self.memo: dict[int, str] = {}
        self.reduction_ops: set[int] = set()
        self.contract_ops: set[int] = set()  # products feeding a sum reduction: may fuse into an FMA

    # --- plumbing
    def tmp(self) -> str:
        self.n += 1
        return f"%t{self.n}"

    def label(self, base: str) -> str:
        self.n += 1
        return f"{base}{self.n}"

    def emit(self, line: str) -> None:
        self.lines.append("  " + line)

    def start(self, lab: str) -> None:
        self.lines.append(f"{lab}:")
        self.block = lab

    def op(self, text: str) -> str:
        t = self.tmp()
        self.emit(f"{t} = {text}")
        return t

    # --- expressions (values in the compute type VALUE_T[dtype])
    def expr(self, e: Expr, index: bool = False) -> str:
        key = id(e)
        if key in self.memo:
            return self.memo[key]
        v = self._expr(e, index)
        if not isinstance(e, (Const, Var)):
            self.memo[key] = v
        return v

    def index(self, e: Expr) -> str:
        """An i64 index value."""
        v = self.expr(e, index=True)
        if e.dtype in INTS and e.dtype != "int64":  # an int32 index, or a small-integer element (a lookup table)
            return self.op(f"{'zext' if e.dtype in UNSIGNED else 'sext'} {VALUE_T[e.dtype]} {v} to i64")
        if e.dtype != "int64":
            raise CodegenError(f"index expression {e} has dtype {e.dtype}, not an integer")
        return v

    def _expr(self, e: Expr, index: bool) -> str:
        if isinstance(e, Const):
            return const_text(e)
        if isinstance(e, Var):
            if e not in self.env:
                raise CodegenError(f"variable {e.name!r} is used outside the loops that define it")
            v = self.env[e]
            return self.op(f"trunc i64 {v} to i32") if e.dtype == "int32" else v
        if isinstance(e, Load):
            ptr = self.address(e.buffer, e.indices)
            st = STORE_T[e.dtype]
            raw = self.op(f"load {st}, ptr {ptr}, align {ITEMSIZE[e.dtype]}")
            if e.dtype == "float16":
                return self.op(f"fpext half {raw} to float")
            if e.dtype == "bfloat16":
                return self.bf16_to_float(raw)
            if e.dtype == "bool":
                return self.op(f"trunc i8 {raw} to i1")
            return raw
        if isinstance(e, Binary):
            return self.binary(e, index)
        if isinstance(e, Unary):
            a = self.expr(e.a, index)
            if e.dtype in FLT:
                return self.op(f"fneg {VALUE_T[e.dtype]} {a}")
            return self.op(f"sub {VALUE_T[e.dtype]} 0, {a}")
        if isinstance(e, Call):
            return self.call(e)
        if isinstance(e, Compare):
            return self.compare(e, index)
        if isinstance(e, Logical):
            a = self.expr(e.a, index)
            if e.op == "not":
                return self.op(f"xor i1 {a}, true")
            b = self.expr(e.b, index)  # type: ignore[arg-type]
            return self.op(f"{e.op} i1 {a}, {b}")
        if isinstance(e, Select):
            return self.select(e, index)
        if isinstance(e, Cast):
            return self.cast(self.expr(e.a, index), e.a.dtype, e.dtype)
        raise CodegenError(f"cannot compile expression {type(e).__name__}")

    def bf16_to_float(self, raw: str) -> str:
        """bfloat16 bits (i16) -> float: the bits are the top half of the float's (exact)."""
        w = self.op(f"zext i16 {raw} to i32")
        s = self.op(f"shl i32 {w}, 16")
        return self.op(f"bitcast i32 {s} to float")

    def float_to_bf16(self, v: str) -> str:
        """float -> bfloat16 bits (i16), rounded to nearest even; a NaN stays a quiet NaN."""
        bits = self.op(f"bitcast float {v} to i32")
        hi = self.op(f"lshr i32 {bits}, 16")
        lsb = self.op(f"and i32 {hi}, 1")
        bias = self.op(f"add i32 {lsb}, 32767")
        r = self.op(f"add i32 {bits}, {bias}")
        rounded = self.op(f"lshr i32 {r}, 16")
        quiet = self.op(f"or i32 {hi}, 64")
        nan = self.op(f"fcmp uno float {v}, 0.0")
        out = self.op(f"select i1 {nan}, i32 {quiet}, i32 {rounded}")
        return self.op(f"trunc i32 {out} to i16")

    def round_bf16(self, v: str) -> str:
        return self.bf16_to_float(self.float_to_bf16(v))

    def round_half(self, v: str) -> str:
        h = self.op(f"fptrunc float {v} to half")
        return self.op(f"fpext half {h} to float")

    def double_to_float_odd(self, d: str) -> str:
        # double -> half directly needs the libcall __truncdfhf2, which the JIT cannot resolve.
        # double -> float rounded to odd, then float -> half, rounds exactly once (24 >= 11 + 2 bits).
        self.m.declare("llvm.fabs.f64", "declare double @llvm.fabs.f64(double)")
        f = self.op(f"fptrunc double {d} to float")
        back = self.op(f"fpext float {f} to double")
        inexact = self.op(f"fcmp one double {back}, {d}")
        ab = self.op(f"call double @llvm.fabs.f64(double {back})")
        ad = self.op(f"call double @llvm.fabs.f64(double {d})")
        big = self.op(f"fcmp ogt double {ab}, {ad}")
        bits = self.op(f"bitcast float {f} to i32")
        dec = self.op(f"zext i1 {big} to i32")
        b1 = self.op(f"sub i32 {bits}, {dec}")
        odd = self.op(f"zext i1 {inexact} to i32")
        b2 = self.op(f"or i32 {b1}, {odd}")
        return self.op(f"bitcast i32 {b2} to float")

    def cast(self, v: str, src: str, dst: str) -> str:
        if src == dst:
            return v
        ts, td = VALUE_T[src], VALUE_T[dst]
        if src in FLT and dst in FLT:
            if dst == "bfloat16":  # from double: round to odd first, so the value rounds once
                return self.round_bf16(self.double_to_float_odd(v) if ts == "double" else v)
            if dst == "float16":
                if ts == "double":
                    v = self.double_to_float_odd(v)
                h = self.op(f"fptrunc float {v} to half")
                return self.op(f"fpext half {h} to float")
            if ts == td:
                return v
            return self.op(f"{'fpext' if td == 'double' else 'fptrunc'} {ts} {v} to {td}")
        if src in INTS and dst in INTS:
            ws, wd = ITEMSIZE[src], ITEMSIZE[dst]
            if ws == wd:  # int16 <-> uint16: the same bits
                return v
            if ws > wd:  # wraps, as numpy's astype
                return self.op(f"trunc {ts} {v} to {td}")
            return self.op(f"{'zext' if src in UNSIGNED else 'sext'} {ts} {v} to {td}")
        if src in INTS and dst in FLT:
            tofp = "uitofp" if src in UNSIGNED else "sitofp"
            if dst == "float16":
                return self.round_half(self.op(f"{tofp} {ts} {v} to float"))
            if dst == "bfloat16":
                return self.round_bf16(self.op(f"{tofp} {ts} {v} to float"))
            return self.op(f"{tofp} {ts} {v} to {td}")
        if src in FLT and dst in INTS:
            if ITEMSIZE[dst] < 4:  # truncate toward zero to 64 bits, then wrap to the small type (numpy's astype)
                w = self.op(f"fptosi {ts} {v} to i64")
                return self.op(f"trunc i64 {w} to {td}")
            return self.op(f"fptosi {ts} {v} to {td}")
        if src == "bool":
            return self.op(f"{'uitofp' if dst in FLT else 'zext'} i1 {v} to {td}")
        if dst == "bool":
            if src in FLT:
                return self.op(f"fcmp une {ts} {v}, 0.0")
            return self.op(f"icmp ne {ts} {v}, 0")
        raise CodegenError(f"cannot cast {src} to {dst}")

    def binary(self, e: Binary, index: bool) -> str:
        t = VALUE_T[e.dtype]
        a, b = self.expr(e.a, index), self.expr(e.b, index)
        if e.dtype in FLT:
            fm = " reassoc nsz" if id(e) in self.reduction_ops else ""
            if e.op in ("add", "sub", "mul", "div"):
                name = {"add": "fadd", "sub": "fsub", "mul": "fmul", "div": "fdiv"}[e.op]
                if id(e) in self.reduction_ops or id(e) in self.contract_ops:
                    fm += " contract"
                return self.op(f"{name}{fm} {t} {a}, {b}")
            if e.op in ("max", "min"):
                intr = f"llvm.{'maximum' if e.op == 'max' else 'minimum'}.{'f64' if t == 'double' else 'f32'}"
                self.m.declare(intr, f"declare {t} @{intr}({t}, {t})")
                return self.op(f"call{fm} {t} @{intr}({t} {a}, {t} {b})")
            sfx = "f64" if t == "double" else "f32"
            if e.op == "floordiv":
                q = self.op(f"fdiv {t} {a}, {b}")
                self.m.declare(f"llvm.floor.{sfx}", f"declare {t} @llvm.floor.{sfx}({t})")
                return self.op(f"call {t} @llvm.floor.{sfx}({t} {q})")
            if e.op == "mod":  # numpy: the result has the sign of the divisor
                r = self.op(f"frem {t} {a}, {b}")
                rnz = self.op(f"fcmp one {t} {r}, 0.0")
                rneg = self.op(f"fcmp olt {t} {r}, 0.0")
                bneg = self.op(f"fcmp olt {t} {b}, 0.0")
                diff = self.op(f"xor i1 {rneg}, {bneg}")
                fix = self.op(f"and i1 {rnz}, {diff}")
                rb = self.op(f"fadd {t} {r}, {b}")
                return self.op(f"select i1 {fix}, {t} {rb}, {t} {r}")
        if e.dtype in INTS:
            nsw = " nsw" if index and e.dtype in ("int32", "int64") else ""  # small integers wrap (numpy)
            if e.op in ("add", "sub", "mul"):
                return self.op(f"{e.op}{nsw} {t} {a}, {b}")
            if e.op in ("max", "min"):
                intr = f"llvm.{'u' if e.dtype in UNSIGNED else 's'}{e.op}.{t}"
                self.m.declare(intr, f"declare {t} @{intr}({t}, {t})")
                return self.op(f"call {t} @{intr}({t} {a}, {t} {b})")
            if e.op in ("floordiv", "mod") and e.dtype in UNSIGNED:  # floor is truncation; x // 0 == x % 0 == 0
                zero = self.op(f"icmp eq {t} {b}, 0")
                sb = self.op(f"select i1 {zero}, {t} 1, {t} {b}")
                r = self.op(f"{'udiv' if e.op == 'floordiv' else 'urem'} {t} {a}, {sb}")
                return self.op(f"select i1 {zero}, {t} 0, {t} {r}")
            if e.op in ("floordiv", "mod"):
                return self.int_divmod(e.op, t, a, b, e.b)
        raise CodegenError(f"cannot compile {e.op} on {e.dtype}")

    def int_divmod(self, op: str, t: str, a: str, b: str, bexpr: Expr) -> str:
        # Python semantics: q = floor(a / b), r = a - q*b has the sign of b; b == 0 gives 0 (numpy).
        if isinstance(bexpr, Const) and int(bexpr.value) > 0:
            q = self.op(f"sdiv {t} {a}, {b}")
            r = self.op(f"srem {t} {a}, {b}")
            neg = self.op(f"icmp slt {t} {r}, 0")
            if op == "floordiv":
                d = self.op(f"zext i1 {neg} to {t}")
                return self.op(f"sub {t} {q}, {d}")
            rb = self.op(f"add {t} {r}, {b}")
            return self.op(f"select i1 {neg}, {t} {rb}, {t} {r}")
        zero = self.op(f"icmp eq {t} {b}, 0")
        m1 = self.op(f"icmp eq {t} {b}, -1")
        bad = self.op(f"or i1 {zero}, {m1}")
        sb = self.op(f"select i1 {bad}, {t} 1, {t} {b}")  # no trap on /0 nor MIN/-1
        q = self.op(f"sdiv {t} {a}, {sb}")
        r = self.op(f"srem {t} {a}, {sb}")
        rnz = self.op(f"icmp ne {t} {r}, 0")
        x = self.op(f"xor {t} {r}, {sb}")
        sgn = self.op(f"icmp slt {t} {x}, 0")
        fix = self.op(f"and i1 {rnz}, {sgn}")
        if op == "floordiv":
            d = self.op(f"zext i1 {fix} to {t}")
            q2 = self.op(f"sub {t} {q}, {d}")
            na = self.op(f"sub {t} 0, {a}")
            q3 = self.op(f"select i1 {m1}, {t} {na}, {t} {q2}")
            return self.op(f"select i1 {zero}, {t} 0, {t} {q3}")
        rb = self.op(f"add {t} {r}, {sb}")
        r2 = self.op(f"select i1 {fix}, {t} {rb}, {t} {r}")
        return self.op(f"select i1 {bad}, {t} 0, {t} {r2}")

    def compare(self, e: Compare, index: bool) -> str:
        a, b = self.expr(e.a, index), self.expr(e.b, index)
        dt = e.a.dtype
        t = VALUE_T[dt]
        if dt in FLT:
            pred = {"lt": "olt", "le": "ole", "gt": "ogt", "ge": "oge", "eq": "oeq", "ne": "une"}[e.op]
            return self.op(f"fcmp {pred} {t} {a}, {b}")
        if dt == "bool" or dt in UNSIGNED:
            pred = {"lt": "ult", "le": "ule", "gt": "ugt", "ge": "uge", "eq": "eq", "ne": "ne"}[e.op]
        else:
            pred = {"lt": "slt", "le": "sle", "gt": "sgt", "ge": "sge", "eq": "eq", "ne": "ne"}[e.op]
        return self.op(f"icmp {pred} {t} {a}, {b}")

    def call(self, e: Call) -> str:
        dt = e.dtype
        if isinstance(e, ExternCall):  # loopir.te_extern: a C symbol resolved by the JIT
            args = ", ".join(f"{VALUE_T[a.dtype]} {self.expr(a)}" for a in e.args)
            callee, text = extern_decl(e.decl, tuple(a.dtype for a in e.args))
            self.m.declare(callee, text)
            old, new = _signature(self.m.decls[callee]), _signature(text)
            if old is not None and new is not None and old != new:  # one C symbol, one signature in a module
                raise CodegenError(f"the external function {e.fn!r} is called with two signatures in one program "
                                   f"(argument dtypes {', '.join(a.dtype for a in e.args)} and another); register it "
                                   "with te.register_intrinsic to fix one")
            return self.op(f"call {VALUE_T[dt]} @{callee}({args})")
        x = self.expr(e.args[0])
        t = VALUE_T[dt]
        sfx = "f64" if t == "double" else "f32"
        if e.fn == "fmod":  # frem is C's fmod (the sign of x), as numpy.fmod
            return self.op(f"frem {t} {x}, {self.expr(e.args[1])}")
        if e.fn in ("pow", "floor", "ceil", "round"):  # LLVM's intrinsics; rint rounds halves to even
            intr = f"llvm.{'rint' if e.fn == 'round' else e.fn}.{sfx}"
            n = len(e.args)
            self.m.declare(intr, f"declare {t} @{intr}({', '.join([t] * n)})")
            ys = ", ".join(f"{t} {self.expr(a)}" for a in e.args)
            return self.op(f"call {t} @{intr}({ys})")
        if e.fn.startswith("fast_"):  # no faster variant is sound on the CPU: the accurate libm function
            return self.libm(e.fn[5:], dt, x)
        if e.fn == "abs":
            if dt in FLT:
                intr = f"llvm.fabs.{'f64' if t == 'double' else 'f32'}"
                self.m.declare(intr, f"declare {t} @{intr}({t})")
                return self.op(f"call {t} @{intr}({t} {x})")
            if dt == "bool" or dt in UNSIGNED:
                return x
            intr = f"llvm.abs.{t}"
            self.m.declare(intr, f"declare {t} @{intr}({t}, i1)")
            return self.op(f"call {t} @{intr}({t} {x}, i1 false)")
        if e.fn in ("sqrt", "rsqrt"):
            self.m.declare(f"llvm.sqrt.{sfx}", f"declare {t} @llvm.sqrt.{sfx}({t})")
            s = self.op(f"call {t} @llvm.sqrt.{sfx}({t} {x})")
            return s if e.fn == "sqrt" else self.op(f"fdiv {t} 1.0, {s}")
        if e.fn == "sigmoid":  # 1 / (1 + exp(-x)): exp(-x) = inf gives exactly 0
            nx = self.op(f"fneg {t} {x}")
            ex = self.libm("exp", dt, nx)
            d = self.op(f"fadd {t} {ex}, 1.0")
            return self.op(f"fdiv {t} 1.0, {d}")
        return self.libm(e.fn, dt, x)

    def extern_stage(self, call: ExternCall) -> None:
        """The one call of a te.extern stage's function: a pointer per tensor (its load's buffer), i64 sizes."""
        args = [f"ptr {self.bufs[a.buffer]}" if isinstance(a, Load) else f"i64 {self.index(a)}" for a in call.args]
        callee, text = extern_stage_decl(call.decl, tuple(a.split()[0] for a in args))
        self.m.declare(callee, text)
        self.emit(f"call void @{callee}({', '.join(args)})")

    def libm(self, fn: str, dtype: str, x: str) -> str:
        callee, attr = self.m.math_call(fn, dtype)
        t = VALUE_T[dtype]
        return self.op(f"call {t} @{callee}({t} {x}){attr}")

    def select(self, e: Select, index: bool) -> str:
        t = VALUE_T[e.dtype]
        c = self.expr(e.cond, index)
        safe = set(_loads(e.cond))
        if all(ld in safe for ld in _loads(e.a) + _loads(e.b)):
            a, b = self.expr(e.a, index), self.expr(e.b, index)
            return self.op(f"select i1 {c}, {t} {a}, {t} {b}")
        # A branch reads memory the condition may guard (padding): evaluate only the taken side.
        lt, lf, lj = self.label("sel_t"), self.label("sel_f"), self.label("sel_j")
        self.emit(f"br i1 {c}, label %{lt}, label %{lf}")
        saved = dict(self.memo)
        self.start(lt)
        a = self.expr(e.a, index)
        bt = self.block
        self.emit(f"br label %{lj}")
        self.memo = dict(saved)
        self.start(lf)
        b = self.expr(e.b, index)
        bf = self.block
        self.emit(f"br label %{lj}")
        self.memo = saved
        self.start(lj)
        return self.op(f"phi {t} [ {a}, %{bt} ], [ {b}, %{bf} ]")

    def address(self, buf: Buffer, indices: tuple[Expr, ...]) -> str:
        if buf not in self.bufs:
            raise CodegenError(f"buffer {buf.name!r} is neither an argument, a temporary nor allocated here")
        flat: str | None = None
        for k, ix in enumerate(indices):
            iv = self.index(ix)
            if flat is None:
                flat = iv
            else:
                dim = self.index(buf.shape[k])
                m = self.op(f"mul nsw i64 {flat}, {dim}")
                flat = self.op(f"add nsw i64 {m}, {iv}")
        if flat is None:
            return self.bufs[buf]
        return self.op(f"getelementptr inbounds {STORE_T[buf.dtype]}, ptr {self.bufs[buf]}, i64 {flat}")

    def _restore(self, v: Var, saved: str | None) -> None:
        if saved is None:
            self.env.pop(v, None)
        else:
            self.env[v] = saved



def _signature(decl: str) -> str | None:
    """`declare T @f(A, B)` of a declaration's text (comment lines and attributes left out); None for a
    definition (LLVM's parser checks a call against it)."""
    line = decl.strip().splitlines()[-1]
    if not line.startswith("declare"):
        return None
    return line[:line.index(")") + 1]
