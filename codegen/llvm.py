"""Loop IR -> LLVM IR text (the CPU target's code generator).

The IR is written as text rather than through `llvmlite.ir`: the things the fast path needs —
string call-site attributes ("vector-function-abi-variant"), `memory(none)` declarations,
fast-math flags on single instructions and self-referential `distinct` loop metadata — are
either refused by `llvmlite.ir`'s attribute whitelist or need text patching there anyway.

One program becomes a few functions sharing one signature
    i32 @<name>_s<k>(ptr noalias <args and temps>..., i64 <sizes>..., i64 %lo, i64 %hi)
one per *segment* of the top-level statement list: a maximal run of serial statements
(`lo`/`hi` unused) or one top-level parallel loop, whose chunk `[lo, hi)` the runtime hands
to a thread. `void @<name>_b<k>(i64 <sizes>..., ptr %out)` writes a parallel loop's bounds.
The return value is 0, or 1 when a heap scratch allocation failed.

Numerics: float16 is loaded/stored as `half` and computed in float32 (rounded back at casts
and stores only). Integer `//` and `%` follow Python (floor); a zero divisor gives 0 (numpy's
result) instead of a trap. Float max/min propagate NaN (`llvm.maximum`, as numpy). The update
of a recognised reduction (`C[..] = C[..] op x`, op in add/max/min) carries `reassoc nsz`, so
the vectorizer may reorder the sum: float results then differ from a sequential sum by rounding
(relative ~n*eps worst case), never by more — the same freedom numpy's pairwise sum takes. A sum's
update and the product feeding it also carry `contract` (one rounding instead of two: an FMA).

Before emission, `tighten` turns tiling guards into loop bounds and `llvm_vec.version_loops` gives
tile loops a full-tile version with constant bounds; constant `vectorize` loops in the simple
subset become explicit vector code (`llvm_vec.emit_vector_loop`), the rest go to LLVM's vectorizer.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import struct
from dataclasses import dataclass
from functools import cache

import numpy as np

from loopir.nodes import (
    Allocate,
    Barrier,
    Binary,
    Buffer,
    Call,
    Cast,
    Compare,
    Const,
    Expr,
    For,
    If,
    Load,
    Logical,
    Program,
    Select,
    Seq,
    Stmt,
    Store,
    Unary,
    Var,
)
from loopir.visit import walk

from .llvm_vec import emit_vector_loop, version_loops

VALUE_T = {"float16": "float", "float32": "float", "float64": "double",
           "int32": "i32", "int64": "i64", "bool": "i1"}
STORE_T = {"float16": "half", "float32": "float", "float64": "double",
           "int32": "i32", "int64": "i64", "bool": "i8"}
ITEMSIZE = {"float16": 2, "float32": 4, "float64": 8, "int32": 4, "int64": 8, "bool": 1}
FLT = {"float16", "float32", "float64"}
INTS = {"int32", "int64"}
STACK_LIMIT = 64 * 1024  # bytes: a constant-size scratch up to this lives on the stack
UNROLL_EMIT_LIMIT = 64  # constant-extent unrolled loops up to this many iterations are emitted unrolled


class CodegenError(ValueError):
    """The program cannot be compiled for the CPU (names the offending thing)."""


# ----------------------------------------------------------------------------- host facts


@cache
def host_features() -> frozenset[str]:
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    return frozenset(f[1:] for f in llvm.get_host_cpu_features().flatten().split(",") if f.startswith("+"))


def vector_bits() -> int:
    f = host_features()
    return 512 if "avx512f" in f else 256 if "avx2" in f or "avx" in f else 128


@cache
def libmvec() -> ctypes.CDLL | None:
    """glibc's vector math library, loaded into the process so the JIT resolves its symbols."""
    import llvmlite.binding as llvm

    for name in ("libmvec.so.1", ctypes.util.find_library("mvec")):
        if not name:
            continue
        try:
            lib = ctypes.CDLL(name)
            llvm.load_library_permanently(name)
            return lib
        except OSError:
            continue
    return None


# ISA letters of the x86 vector ABI, best first, with the feature each needs and its register bits.
_ISAS = (("e", "avx512f", 512), ("d", "avx2", 256), ("c", "avx", 256), ("b", "sse4.2", 128))


@cache
def vector_variants(scalar: str) -> tuple[tuple[int, str], ...]:
    """(VF, symbol) of the libmvec variants of libm `scalar` usable on this host, one per VF."""
    lib = libmvec()
    if lib is None:
        return ()
    feats = host_features()
    bits = 32 if scalar.endswith("f") and scalar not in ("erf",) else 64
    out: dict[int, str] = {}
    for letter, feat, regbits in _ISAS:
        if feat not in feats and not (letter == "b" and "sse4.1" in feats):
            continue
        vf = regbits // bits
        sym = f"_ZGV{letter}N{vf}v_{scalar}"
        if vf not in out and hasattr(lib, sym):
            out[vf] = sym
    return tuple(sorted(out.items()))


def _libm_name(fn: str, dtype: str) -> str:
    return fn + ("f" if dtype != "float64" else "")


# ----------------------------------------------------------------------------- constants


def fconst(value: float, dtype: str) -> str:
    if dtype == "float16":
        value = float(np.float16(value))
    elif dtype == "float32":
        value = float(np.float32(value))
    return f"0x{struct.unpack('<Q', struct.pack('<d', float(value)))[0]:016X}"


def const_text(c: Const) -> str:
    if c.dtype in FLT:
        return fconst(c.value, c.dtype)
    if c.dtype == "bool":
        return "true" if c.value else "false"
    v = int(c.value)
    if c.dtype == "int32":
        v = (v + 2**31) % 2**32 - 2**31
    return str(v)


# ----------------------------------------------------------------------------- analysis helpers


def is_reduction(st: Store) -> Binary | None:
    """The update `C[idx] = C[idx] op x` (op add/max/min) of a reduction, else None."""
    v = st.value
    if not isinstance(v, Binary) or v.op not in ("add", "max", "min") or v.dtype not in FLT:
        return None
    for side in (v.a, v.b):
        if isinstance(side, Load) and side.buffer is st.buffer and side.indices == st.indices:
            return v
    return None


def _loads(e: Expr) -> list[Load]:
    return [n for n in walk(e) if isinstance(n, Load)]


def _is_parallel_top(s: Stmt) -> bool:
    # a loop bound to blockIdx has independent iterations by construction: run it in parallel too
    if not isinstance(s, For):
        return False
    return s.kind == "parallel" or (s.kind == "thread" and (s.thread or "").startswith("block"))


@dataclass(frozen=True)
class Segment:
    """One native function of a program: serial statements, or a parallel loop's chunk."""

    fn: str
    parallel: bool
    bounds_fn: str | None  # for a parallel segment: writes (lo, hi)


@dataclass(frozen=True)
class Generated:
    source: str
    segments: tuple[Segment, ...]
    buffers: tuple[Buffer, ...]  # pointer parameters in order: args then temps
    sizes: tuple[Var, ...]  # i64 parameters in order


def size_vars(program: Program) -> tuple[Var, ...]:
    """program.params, then any other free variable (not a loop variable, not an iteration variable)."""
    bound: set[Var] = set()
    order: list[Var] = list(program.params)
    seen = set(order)
    for n in walk(program.body):
        if isinstance(n, For):
            bound.add(n.var)
        elif isinstance(n, Store):
            bound.update(n.iters)
    for b in (*program.args, *program.temps):
        for e in b.shape:
            for n in walk(e):
                if isinstance(n, Var) and n not in seen:
                    seen.add(n)
                    order.append(n)
    for n in walk(program.body):
        if isinstance(n, (Load, Store)):
            for e in n.buffer.shape:
                for m in walk(e):
                    if isinstance(m, Var) and m not in seen and m not in bound:
                        seen.add(m)
                        order.append(m)
        if isinstance(n, Var) and n not in seen and n not in bound:
            seen.add(n)
            order.append(n)
    return tuple(order)


# ----------------------------------------------------------------------------- module emitter


class _ModuleEmitter:
    def __init__(self) -> None:
        self.decls: dict[str, str] = {}
        self.attr_groups: list[str] = []
        self.vfabi_attr: dict[str, int] = {}
        self.used_vector: list[str] = []
        self.metadata: list[str] = []
        self.n_md = 0
        self.mem_none = self.attr_group("nounwind willreturn memory(none)")

    def attr_group(self, text: str) -> int:
        self.attr_groups.append(text)
        return len(self.attr_groups) - 1

    def declare(self, name: str, decl: str) -> None:
        self.decls.setdefault(name, decl)

    def md(self, text: str) -> int:
        k = self.n_md
        self.n_md += 1
        self.metadata.append(f"!{k} = {text}")
        return k

    def loop_md(self, props: list[str]) -> int:
        ids = [self.md("!{" + p + "}") for p in props]
        k = self.n_md
        self.n_md += 1
        self.metadata.append(f"!{k} = distinct !{{!{k}" + "".join(f", !{i}" for i in ids) + "}")
        return k

    def math_call(self, fn: str, dtype: str) -> tuple[str, str]:
        """(callee, call-site attribute text) for libm `fn` in `dtype`'s compute type."""
        name = _libm_name(fn, dtype)
        t = "double" if dtype == "float64" else "float"
        self.declare(name, f"declare {t} @{name}({t}) #{self.mem_none}")
        variants = vector_variants(name)
        if not variants:
            return name, ""
        if name not in self.vfabi_attr:
            maps = ",".join(f"_ZGV_LLVM_N{vf}v_{name}({sym})" for vf, sym in variants)
            self.vfabi_attr[name] = self.attr_group(f'"vector-function-abi-variant"="{maps}"')
            for vf, sym in variants:
                self.declare(sym, f"declare <{vf} x {t}> @{sym}(<{vf} x {t}>)")
                self.used_vector.append(sym)
        return name, f" #{self.vfabi_attr[name]}"

    def text(self, functions: list[str]) -> str:
        parts = list(self.decls.values())
        if self.used_vector:
            refs = ", ".join(f"ptr @{s}" for s in self.used_vector)
            parts.append(f'@llvm.compiler.used = appending global [{len(self.used_vector)} x ptr] [{refs}], '
                         'section "llvm.metadata"')
        parts += functions
        parts += [f"attributes #{k} = {{ {t} }}" for k, t in enumerate(self.attr_groups)]
        parts += self.metadata
        return "\n".join(parts) + "\n"


# ----------------------------------------------------------------------------- function emitter


class _FnEmitter:
    def __init__(self, mod: _ModuleEmitter, bufs: dict[Buffer, str], env: dict[Var, str]) -> None:
        self.m = mod
        self.lines: list[str] = []
        self.allocas: list[str] = []
        self.bufs = dict(bufs)
        self.env = dict(env)
        self.n = 0
        self.block = "entry"
        self.memo: dict[int, str] = {}
        self.reduction_ops: set[int] = set()
        self.contract_ops: set[int] = set()  # products feeding a sum reduction: may fuse into an FMA
        self.uses_fail = False

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
        if e.dtype == "int32":
            return self.op(f"sext i32 {v} to i64")
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
            if dst == "float16":
                if ts == "double":
                    v = self.double_to_float_odd(v)
                h = self.op(f"fptrunc float {v} to half")
                return self.op(f"fpext half {h} to float")
            if ts == td:
                return v
            return self.op(f"{'fpext' if td == 'double' else 'fptrunc'} {ts} {v} to {td}")
        if src in INTS and dst in INTS:
            return self.op(f"{'sext' if dst == 'int64' else 'trunc'} {ts} {v} to {td}")
        if src in INTS and dst in FLT:
            if dst == "float16":
                return self.round_half(self.op(f"sitofp {ts} {v} to float"))
            return self.op(f"sitofp {ts} {v} to {td}")
        if src in FLT and dst in INTS:
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
            nsw = " nsw" if index else ""
            if e.op in ("add", "sub", "mul"):
                return self.op(f"{e.op}{nsw} {t} {a}, {b}")
            if e.op in ("max", "min"):
                intr = f"llvm.s{e.op}.{t}"
                self.m.declare(intr, f"declare {t} @{intr}({t}, {t})")
                return self.op(f"call {t} @{intr}({t} {a}, {t} {b})")
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
        if dt == "bool":
            pred = {"lt": "ult", "le": "ule", "gt": "ugt", "ge": "uge", "eq": "eq", "ne": "ne"}[e.op]
        else:
            pred = {"lt": "slt", "le": "sle", "gt": "sgt", "ge": "sge", "eq": "eq", "ne": "ne"}[e.op]
        return self.op(f"icmp {pred} {t} {a}, {b}")

    def call(self, e: Call) -> str:
        dt = e.dtype
        x = self.expr(e.args[0])
        t = VALUE_T[dt]
        if e.fn == "abs":
            if dt in FLT:
                intr = f"llvm.fabs.{'f64' if t == 'double' else 'f32'}"
                self.m.declare(intr, f"declare {t} @{intr}({t})")
                return self.op(f"call {t} @{intr}({t} {x})")
            if dt == "bool":
                return x
            intr = f"llvm.abs.{t}"
            self.m.declare(intr, f"declare {t} @{intr}({t}, i1)")
            return self.op(f"call {t} @{intr}({t} {x}, i1 false)")
        sfx = "f64" if t == "double" else "f32"
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

    # --- statements
    def stmt(self, s: Stmt) -> None:
        if isinstance(s, Seq):
            for c in s.body:
                self.stmt(c)
        elif isinstance(s, Store):
            self.store(s)
        elif isinstance(s, For):
            self.loop(s)
        elif isinstance(s, If):
            self.if_(s)
        elif isinstance(s, Allocate):
            self.allocate(s)
        elif isinstance(s, Barrier):
            pass  # every CPU "thread" loop runs serially; see gaps in the report
        else:
            raise CodegenError(f"cannot compile statement {type(s).__name__}")

    def store(self, s: Store) -> None:
        self.memo = {}
        saved = {v: self.env[v] for v in s.iters if v in self.env}
        vals = [self.index(c) for c in s.coords]
        for v, x in zip(s.iters, vals):
            self.env[v] = x
        red = is_reduction(s)
        if red is not None:
            self.reduction_ops.add(id(red))
            if red.op == "add":
                self.contract_ops.update(id(x) for x in (red.a, red.b) if isinstance(x, Binary) and x.op == "mul")
        val = self.expr(s.value)
        ptr = self.address(s.buffer, s.indices)
        dt = s.buffer.dtype
        if s.value.dtype != dt:
            val = self.cast(val, s.value.dtype, dt)
        if dt == "float16":
            val = self.op(f"fptrunc float {val} to half")
        elif dt == "bool":
            val = self.op(f"zext i1 {val} to i8")
        self.emit(f"store {STORE_T[dt]} {val}, ptr {ptr}, align {ITEMSIZE[dt]}")
        for v in s.iters:
            self.env.pop(v, None)
        self.env.update(saved)
        self.memo = {}

    def loop_props(self, f: For) -> list[str]:
        if f.kind == "vectorize":
            widest = max((ITEMSIZE[n.buffer.dtype] for n in walk(f.body) if isinstance(n, Store)), default=4)
            width = max(vector_bits() // (8 * max(widest, 4)), 2)  # narrow types are computed as 32-bit
            return ['!"llvm.loop.vectorize.enable", i1 true', f'!"llvm.loop.vectorize.width", i32 {width}']
        if f.kind == "unroll":
            return ['!"llvm.loop.unroll.full"'] if _const_extent(f) is not None else ['!"llvm.loop.unroll.enable"']
        return ['!"llvm.loop.mustprogress"']

    def loop(self, f: For, lo_hi: tuple[str, str] | None = None) -> None:
        self.memo = {}
        ext = _const_extent(f)
        if f.kind == "unroll" and ext is not None and ext <= UNROLL_EMIT_LIMIT and lo_hi is None:
            saved = self.env.get(f.var)
            for k in range(ext):
                self.env[f.var] = str(int(f.lo.value) + k)  # type: ignore[union-attr]
                self.stmt(f.body)
            self._restore(f.var, saved)
            return
        if f.kind == "vectorize" and lo_hi is None and emit_vector_loop(self, f):
            return
        lo, hi = lo_hi if lo_hi is not None else (self.index(f.lo), self.index(f.hi))
        pre = self.block
        lb, ll, lx = self.label("body"), self.label("latch"), self.label("exit")
        c = self.op(f"icmp slt i64 {lo}, {hi}")
        self.emit(f"br i1 {c}, label %{lb}, label %{lx}")
        self.start(lb)
        i = self.tmp()
        nxt = self.tmp()
        self.emit(f"{i} = phi i64 [ {lo}, %{pre} ], [ {nxt}, %{ll} ]")
        saved = self.env.get(f.var)
        self.env[f.var] = i
        self.stmt(f.body)
        self._restore(f.var, saved)
        self.emit(f"br label %{ll}")
        self.start(ll)
        self.emit(f"{nxt} = add nsw i64 {i}, 1")
        c2 = self.op(f"icmp slt i64 {nxt}, {hi}")
        md = self.m.loop_md(self.loop_props(f))
        self.emit(f"br i1 {c2}, label %{lb}, label %{lx}, !llvm.loop !{md}")
        self.start(lx)
        self.memo = {}

    def _restore(self, v: Var, saved: str | None) -> None:
        if saved is None:
            self.env.pop(v, None)
        else:
            self.env[v] = saved

    def if_(self, s: If) -> None:
        self.memo = {}
        c = self.expr(s.cond, index=True)
        lt, lf, lj = self.label("then"), self.label("else"), self.label("endif")
        self.emit(f"br i1 {c}, label %{lt}, label %{lf if s.orelse is not None else lj}")
        self.start(lt)
        self.stmt(s.then)
        self.emit(f"br label %{lj}")
        if s.orelse is not None:
            self.start(lf)
            self.memo = {}
            self.stmt(s.orelse)
            self.emit(f"br label %{lj}")
        self.start(lj)
        self.memo = {}

    def allocate(self, s: Allocate) -> None:
        b = s.buffer
        st, isz = STORE_T[b.dtype], ITEMSIZE[b.dtype]
        if all(isinstance(d, Const) for d in b.shape):
            n = 1
            for d in b.shape:
                n *= max(int(d.value), 0)  # type: ignore[union-attr]
            if n * isz <= STACK_LIMIT:
                p = self.tmp()
                self.allocas.append(f"  {p} = alloca [{max(n, 1)} x {st}], align 64")
                self.bufs[b] = p
                self.stmt(s.body)
                return
        self.memo = {}
        nbytes = str(isz)
        for d in b.shape:
            dv = self.index(d)
            pos = self.op(f"call i64 @llvm.smax.i64(i64 {dv}, i64 0)")
            nbytes = self.op(f"mul i64 {nbytes}, {pos}")
        self.m.declare("llvm.smax.i64", "declare i64 @llvm.smax.i64(i64, i64)")
        self.m.declare("malloc", "declare noalias ptr @malloc(i64) nounwind")
        self.m.declare("free", "declare void @free(ptr) nounwind")
        p = self.op(f"call ptr @malloc(i64 {nbytes})")
        bad = self.op(f"icmp eq ptr {p}, null")
        ok = self.label("alloc_ok")
        self.emit(f"br i1 {bad}, label %fail, label %{ok}")
        self.uses_fail = True
        self.start(ok)
        self.bufs[b] = p
        self.stmt(s.body)
        self.emit(f"call void @free(ptr {p})")
        self.memo = {}

    def finish(self, header: str) -> str:
        tail = ["  ret i32 0"]
        if self.uses_fail:
            tail += ["fail:", "  ret i32 1"]
        return "\n".join([header, "entry:", *self.allocas, *self.lines, *tail, "}"])


def _const_extent(f: For) -> int | None:
    if isinstance(f.lo, Const) and isinstance(f.hi, Const):
        return max(int(f.hi.value) - int(f.lo.value), 0)
    return None


# ----------------------------------------------------------------------------- program


def _linear(e: Expr, v: Var) -> tuple[int, Expr] | None:
    """(c, rest) with e == c*v + rest, rest free of v; None if not of that form."""
    if e is v:
        return 1, Const(0, "int64")
    if not any(n is v for n in walk(e)):
        return 0, e
    if isinstance(e, Binary) and e.op in ("add", "sub"):
        a, b = _linear(e.a, v), _linear(e.b, v)
        if a is None or b is None:
            return None
        return (a[0] + b[0], a[1] + b[1]) if e.op == "add" else (a[0] - b[0], a[1] - b[1])
    if isinstance(e, Binary) and e.op == "mul":
        for x, y in ((e.a, e.b), (e.b, e.a)):
            if isinstance(y, Const) and isinstance(y.value, int):
                lx = _linear(x, v)
                if lx is not None:
                    return lx[0] * y.value, lx[1] * y.value
    return None


def _conjuncts(c: Expr) -> list[Expr]:
    if isinstance(c, Logical) and c.op == "and":
        return _conjuncts(c.a) + _conjuncts(c.b)  # type: ignore[arg-type]
    return [c]


def tighten(s: Stmt) -> Stmt:
    """Turn the guards that splitting/tiling leave inside loops into loop bounds, innermost first:
    `for v in [lo, hi): if c*v + r < b and t: S` -> `if t: for v in [lo, min(hi, ceil((b - r)/c))): S`
    (c > 0; t free of v and of loads is hoisted). Equivalent; it lets the vectorizer see plain loops."""
    if isinstance(s, Seq):
        return Seq(tuple(tighten(x) for x in s.body))
    if isinstance(s, If):
        return If(s.cond, tighten(s.then), None if s.orelse is None else tighten(s.orelse))
    if isinstance(s, Allocate):
        return Allocate(s.buffer, tighten(s.body))
    if not isinstance(s, For):
        return s
    body = tighten(s.body)
    conds: list[Expr] = []
    while isinstance(body, If) and body.orelse is None:
        conds += _conjuncts(body.cond)
        body = body.then
    hi, keep, hoist = s.hi, [], []
    for c in conds:
        uses_v = any(n is s.var for n in walk(c))
        if not uses_v and not _loads(c):
            hoist.append(c)
            continue
        if isinstance(c, Compare) and c.op in ("gt", "ge"):  # a > b  <=>  b < a
            c = Compare({"gt": "lt", "ge": "le"}[c.op], c.b, c.a)
        if isinstance(c, Compare) and c.op in ("lt", "le") and c.a.dtype in INTS and not _loads(c):
            la, lb = _linear(c.a, s.var), _linear(c.b, s.var)
            if la is not None and lb is not None and la[0] - lb[0] > 0:
                k = la[0] - lb[0]
                bound = lb[1] - la[1] + (1 if c.op == "le" else 0)  # k*v < bound
                if c.a.dtype == "int32":
                    bound = Cast("int64", bound)
                lim = bound if k == 1 else (bound + (k - 1)) // k
                hi = Binary("min", hi, lim, "int64")
                continue
        keep.append(c)
    inner = body
    if keep:
        cond = keep[0]
        for c in keep[1:]:
            cond = Logical("and", cond, c)
        inner = If(cond, body)
    out: Stmt = For(s.var, s.lo, hi, inner, s.kind, s.thread)
    if hoist:
        cond = hoist[0]
        for c in hoist[1:]:
            cond = Logical("and", cond, c)
        out = If(cond, out)
    return out


def _top_level(body: Stmt) -> list[Stmt]:
    return list(body.body) if isinstance(body, Seq) else [body]


def generate(program: Program, fn_name: str) -> Generated:
    """LLVM IR text for `program`: one function per top-level segment (see module doc)."""
    bufs = (*program.args, *program.temps)
    if len(set(bufs)) != len(bufs):
        raise CodegenError(f"program {program.name!r} lists a buffer twice among its arguments and temporaries")
    sizes = size_vars(program)
    mod = _ModuleEmitter()
    ptr_names = {b: f"%a{k}" for k, b in enumerate(bufs)}
    size_names = {v: f"%n{k}" for k, v in enumerate(sizes)}
    params = [f"ptr noalias {ptr_names[b]}" for b in bufs] + [f"i64 {size_names[v]}" for v in sizes]
    header_params = ", ".join(params + ["i64 %lo", "i64 %hi"])

    # group top-level statements: runs of serial statements, and each parallel loop alone
    groups: list[tuple[bool, list[Stmt]]] = []
    for s in _top_level(version_loops(tighten(program.body))):
        if _is_parallel_top(s):
            groups.append((True, [s]))
        elif groups and not groups[-1][0]:
            groups[-1][1].append(s)
        else:
            groups.append((False, [s]))

    functions: list[str] = []
    segments: list[Segment] = []
    for k, (par, stmts) in enumerate(groups):
        name = f"{fn_name}_s{k}"
        fe = _FnEmitter(mod, ptr_names, size_names)
        if par:
            f = stmts[0]
            assert isinstance(f, For)
            fe.loop(f, lo_hi=("%lo", "%hi"))
            be = _FnEmitter(mod, {}, size_names)
            lo, hi = be.index(f.lo), be.index(f.hi)
            be.emit(f"store i64 {lo}, ptr %out, align 8")
            p1 = be.op("getelementptr inbounds i64, ptr %out, i64 1")
            be.emit(f"store i64 {hi}, ptr {p1}, align 8")
            bname = f"{fn_name}_b{k}"
            bparams = ", ".join([f"i64 {size_names[v]}" for v in sizes] + ["ptr %out"])
            btext = be.finish(f"define i32 @{bname}({bparams}) nounwind {{")
            functions.append(btext)
            segments.append(Segment(name, True, bname))
        else:
            for s in stmts:
                fe.stmt(s)
            segments.append(Segment(name, False, None))
        functions.append(fe.finish(f"define i32 @{name}({header_params}) nounwind {{"))
    if not groups:  # an empty program still gets a function
        fe = _FnEmitter(mod, ptr_names, size_names)
        functions.append(fe.finish(f"define i32 @{fn_name}_s0({header_params}) nounwind {{"))
        segments.append(Segment(f"{fn_name}_s0", False, None))
    return Generated(mod.text(functions), tuple(segments), tuple(bufs), sizes)
