"""The reference interpreter's compiler: a loop-IR program becomes Python source, exec'd once and cached.

`loopir.interp` runs what this compiles (its docstring states the semantics); the GPU mode
(`loopir.interp_gpu`, `loopir.interp_gpu_run`) compiles kernel bodies with a subclass of `_Compiler`.
A module of its own so that `interp` can import the GPU mode at the top: the GPU mode needs the
compiler, `interp.run` needs the GPU mode.
"""

from __future__ import annotations

import builtins
import keyword
import math
from typing import Any

import numpy as np

from .errors import ArgumentError, ArgumentTypeError
from .dtypes import is_float, is_int, is_small_int, round_bfloat16, to_bfloat16
from .names import fresh, sanitize
from .te_extern import extern_nest, interp_function, stage_interp_function
from .nodes import (
    Allocate,
    Barrier,
    Kernel,
    Binary,
    Buffer,
    Call,
    Cast,
    Compare,
    Const,
    Expr,
    ExternCall,
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

_PY_KEYWORDS = frozenset(keyword.kwlist)
_BIN = {"add": "+", "sub": "-", "mul": "*", "div": "/", "floordiv": "//", "mod": "%"}
_CMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
_NP_FN = {"exp", "log", "sqrt", "sin", "cos", "tanh", "floor", "ceil"}
_NP_FN2 = {"pow": "power", "fmod": "fmod"}
_NP_FAST = {"fast_exp": "exp", "fast_log": "log", "fast_sin": "sin", "fast_cos": "cos", "round": "rint"}


def _fill_value(dtype: str) -> Any:
    if is_float(dtype):
        return np.nan
    if is_int(dtype):
        return np.iinfo(dtype).min
    return False


def _alloc(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return np.full(shape, 0x7FC0, dtype=np.uint16)  # a quiet NaN's bits
    return np.full(shape, _fill_value(dtype), dtype=dtype)


# a bfloat16 element (uint16 bits) as the float32 scalar the interpreter computes with, for every bit pattern (NaN
# payloads included): the compiled code reads `_bft[bits]`, a tenth of the time of shifting each element's bits
# (the online-softmax check of bfloat16 attention over 4096 keys reads millions of them)
_BF16_TABLE = (np.arange(1 << 16, dtype=np.uint32) << np.uint32(16)).view(np.float32)


def _f2bf(value: Any) -> np.uint16:
    """A value stored into a bfloat16 buffer: its bits, rounded to nearest even."""
    return to_bfloat16(np.float32(value))[()]


def _oob(name: str, idx: tuple[int, ...], shape: tuple[int, ...], what: str) -> Any:
    raise IndexError(
        f"{what} of buffer {name!r} at index {tuple(int(i) for i in idx)} is out of bounds for shape {shape}"
    )


class _Compiler:
    def __init__(self, program: Program, traced: bool) -> None:
        self.program = program
        self.traced = traced
        self.lines: list[str] = []
        self.ns: dict[str, Any] = {"_np": np, "_math": math, "_oob": _oob, "_alloc": _alloc, "_bft": _BF16_TABLE,
                                   "_f2bf": _f2bf}
        self.used: set[str] = set(self.ns) | set(dir(builtins))
        self.vars: dict[Var, str] = {}
        self.bufs: dict[Buffer, tuple[str, tuple[str, ...]]] = {}
        self.sizes: dict[Var, str] = {}  # free variables, bound from the sizes at the start
        self.consts: dict[tuple[Any, str], str] = {}
        self.tmp = 0
        self.trace_only = False  # a te.extern stage's model nest, traced: record instances, store nothing

    # ---------------------------------------------------------------- names

    def fresh(self, base: str) -> str:
        return fresh(sanitize(base, reserved=_PY_KEYWORDS), self.used)

    def var(self, v: Var) -> str:
        if v in self.vars:
            return self.vars[v]
        if v not in self.sizes:
            self.sizes[v] = self.fresh("v_" + v.name)
        return self.sizes[v]

    def declare_buffer(self, b: Buffer) -> tuple[str, tuple[str, ...]]:
        name = self.fresh("b_" + b.name)
        dims = tuple(self.fresh(f"d_{b.name}_{k}") for k in range(len(b.shape)))
        self.bufs[b] = (name, dims)
        return name, dims

    def buffer(self, b: Buffer) -> tuple[str, tuple[str, ...]]:
        if b not in self.bufs:
            raise ArgumentError(
                f"program {self.program.name!r} uses buffer {b.name!r}, which is neither an argument, "
                "a temporary, nor allocated around its use"
            )
        return self.bufs[b]

    def const(self, value: Any, dtype: str) -> str:
        if dtype == "bool":
            return "True" if value else "False"
        if dtype == "int64":
            return f"({int(value)})"
        key = (value, dtype)
        if key not in self.consts:
            name = self.fresh(f"k_{dtype}")
            self.ns[name] = round_bfloat16(value) if dtype == "bfloat16" else np.dtype(dtype).type(value)
            self.consts[key] = name
        return self.consts[key]

    def dtype_fn(self, dtype: str) -> str:
        name = f"T_{dtype}"
        self.ns[name] = round_bfloat16 if dtype == "bfloat16" else np.dtype(dtype).type
        self.used.add(name)
        return name

    # ---------------------------------------------------------------- expressions

    def expr(self, e: Expr) -> str:
        if isinstance(e, Const):
            return self.const(e.value, e.dtype)
        if isinstance(e, Var):
            return self.var(e)
        if isinstance(e, Load):
            return self.load(e)
        if isinstance(e, Binary):
            a, b = self.expr(e.a), self.expr(e.b)
            if e.op in _BIN:
                return f"({a} {_BIN[e.op]} {b})"
            if is_float(e.dtype):
                return f"_np.{'maximum' if e.op == 'max' else 'minimum'}({a}, {b})"
            return f"{e.op}({a}, {b})"
        if isinstance(e, Unary):
            return f"(-{self.expr(e.a)})"
        if isinstance(e, Call):
            return self.call(e)
        if isinstance(e, Compare):
            return f"({self.expr(e.a)} {_CMP[e.op]} {self.expr(e.b)})"
        if isinstance(e, Logical):
            if e.op == "not":
                return f"(not {self.expr(e.a)})"
            assert e.b is not None
            return f"({self.expr(e.a)} {e.op} {self.expr(e.b)})"
        if isinstance(e, Select):
            return f"({self.expr(e.a)} if {self.expr(e.cond)} else {self.expr(e.b)})"
        if isinstance(e, Cast):
            return self.cast(e)
        raise ArgumentTypeError(f"the interpreter cannot evaluate {type(e).__name__} {e!r}")

    def call(self, e: Call) -> str:
        if isinstance(e, ExternCall):  # a registered Python implementation (loopir.te_extern)
            f = interp_function(e.fn)
            if f is None:
                raise ArgumentError(f"the interpreter cannot call the external function {e.fn!r}: register it "
                                    "with te.register_intrinsic(..., interp=<a Python function>)")
            name = self.fresh(f"ext_{e.fn}")
            self.ns[name] = f
            args = ", ".join(self.expr(a) for a in e.args)
            return f"{self.dtype_fn(e.dtype)}({name}({args}))"
        x = self.expr(e.args[0])
        if e.fn in _NP_FN2:  # pow, fmod: numpy's, in the (promoted) dtype of both operands
            return f"_np.{_NP_FN2[e.fn]}({x}, {self.expr(e.args[1])})"
        if e.fn in _NP_FAST:  # the fast variants are the accurate function here
            return f"_np.{_NP_FAST[e.fn]}({x})"
        if e.fn == "abs":
            return f"abs({x})"
        one = self.const(1.0, e.dtype)
        if e.fn in _NP_FN:
            return f"_np.{e.fn}({x})"
        if e.fn == "rsqrt":
            return f"({one} / _np.sqrt({x}))"
        if e.fn == "sigmoid":
            return f"({one} / ({one} + _np.exp(-{x})))"
        if e.fn == "erf":  # bfloat16 computes in float32 (rounded where stored or cast)
            return f"{self.dtype_fn('float32' if e.dtype == 'bfloat16' else e.dtype)}(_math.erf(float({x})))"
        raise ArgumentError(f"the interpreter does not know the function {e.fn!r}")

    def cast(self, e: Cast) -> str:
        x = self.expr(e.a)
        if e.dtype == "bool":
            return f"bool({x})"
        if e.dtype == "int64" and not is_float(e.a.dtype):
            return f"int({x})"  # index arithmetic stays in Python ints
        if is_small_int(e.dtype) and e.a.dtype != "bool":  # through int64, so that it wraps (numpy's astype)
            return f"{self.dtype_fn(e.dtype)}(_np.int64({x}))"
        return f"{self.dtype_fn(e.dtype)}({x})"

    def indexed(self, b: Buffer, indices: tuple[Expr, ...]) -> tuple[str, str, str]:
        """(subscript, bounds condition, index tuple text) for `b[indices]`; the condition
        binds each non-trivial index to a temporary (it is evaluated before the subscript)."""
        name, dims = self.buffer(b)
        if not indices:
            return f"{name}[()]", "True", "()"
        conds, names = [], []
        for ix, d in zip(indices, dims):
            text = self.expr(ix)
            if isinstance(ix, (Var, Const)):
                conds.append(f"(0 <= {text} < {d})")
                names.append(text)
            else:
                t = f"_t{self.tmp}"
                self.tmp += 1
                conds.append(f"(0 <= ({t} := {text}) < {d})")
                names.append(t)
        # `&` rather than `and`: every temporary must be bound before the error message uses it
        return f"{name}[{', '.join(names)}]", " & ".join(conds), f"({', '.join(names)},)"

    def load(self, e: Load) -> str:
        if e.buffer.dtype == "bfloat16":
            return f"_bft[{self.load_raw(e)}]"
        return self.load_raw(e)

    def load_raw(self, e: Load) -> str:
        sub, cond, idx = self.indexed(e.buffer, e.indices)
        if cond == "True":
            return sub
        dims = self.buffer(e.buffer)[1]
        shape = f"({', '.join(dims)},)"
        return f"({sub} if {cond} else _oob({e.buffer.name!r}, {idx}, {shape}, 'load'))"

    # ---------------------------------------------------------------- statements

    def emit(self, depth: int, line: str) -> None:
        self.lines.append("    " * depth + line)

    def block(self, s: Stmt, depth: int) -> None:
        n = len(self.lines)
        self.stmt(s, depth)
        if len(self.lines) == n:
            self.emit(depth, "pass")

    def stmt(self, s: Stmt, depth: int) -> None:
        if isinstance(s, Seq):
            for c in s.body:
                self.stmt(c, depth)
        elif isinstance(s, For) and not self.trace_only and extern_nest(s) is not None:
            self.extern_stage(s, depth)
        elif isinstance(s, For):
            lo, hi = self.expr(s.lo), self.expr(s.hi)
            if s.var in self.vars:
                raise ArgumentError(f"loop variable {s.var.name!r} is bound by two nested loops")
            name = self.fresh("v_" + s.var.name)
            self.vars[s.var] = name
            self.emit(depth, f"for {name} in range({lo}, {hi}):")
            self.block(s.body, depth + 1)
            del self.vars[s.var]
        elif isinstance(s, If):
            self.emit(depth, f"if {self.expr(s.cond)}:")
            self.block(s.then, depth + 1)
            if s.orelse is not None:
                self.emit(depth, "else:")
                self.block(s.orelse, depth + 1)
        elif isinstance(s, Allocate):
            b = s.buffer
            shape = ", ".join(self.expr(d) for d in b.shape)
            name, dims = self.declare_buffer(b)
            self.emit(depth, f"{name} = _alloc(({shape}{',' if b.shape else ''}), {b.dtype!r})")
            if dims:
                self.emit(depth, f"{', '.join(dims)}{',' if len(dims) == 1 else ''} = {name}.shape")
            self.block(s.body, depth)
            del self.bufs[b]
        elif isinstance(s, Barrier):
            pass
        elif isinstance(s, Kernel):
            self.block(s.body, depth)
        elif isinstance(s, Store):
            self.store(s, depth)
        else:
            raise ArgumentTypeError(f"the interpreter cannot execute {type(s).__name__} {s!r}")

    def extern_stage(self, s: For, depth: int, trace: bool = True) -> None:
        """A te.extern stage: one call of its `interp=` function on whole arrays (the output written in place);
        traced, its model nest's instances are recorded (the statements the checker reasons about)."""
        _, call = extern_nest(s)  # type: ignore[misc]
        f = stage_interp_function(call.decl.func)
        if f is None:
            raise ArgumentError(f"the interpreter cannot run the te.extern function {call.decl.func!r}: give "
                                "te.extern(..., interp=<a Python function of the arrays>)")
        if self.traced and trace:
            self.trace_only = True
            self.stmt(s, depth)  # the nest as plain loops, recording its instances only
            self.trace_only = False
        name = self.fresh(f"ext_{call.decl.func}")
        self.ns[name] = f
        args = [self.buffer(a.buffer)[0] if isinstance(a, Load) else self.expr(a) for a in call.args]
        self.emit(depth, f"{name}({', '.join(args)})")

    def bind_iters(self, s: Store, depth: int) -> tuple[dict[Var, str | None], list[str]]:
        """Emit `iters[k] = coords[k]` for a statement instance: (the names they shadowed, to restore with
        `unbind_iters`; the Python names of the iteration variables' values)."""
        if len(s.iters) != len(s.coords):
            raise ArgumentError(
                f"statement {s.name!r} has {len(s.iters)} iteration variables but {len(s.coords)} coords")
        # All coords first: they are in the loops around the statement now, before any iter is rebound.
        texts = [None if (c is it and it in self.vars) else self.expr(c) for it, c in zip(s.iters, s.coords)]
        saved: dict[Var, str | None] = {}
        bound: list[str] = []
        for it, text in zip(s.iters, texts):
            if text is None:
                bound.append(self.vars[it])
                continue
            name = self.fresh("i_" + it.name)
            self.emit(depth, f"{name} = {text}")
            saved.setdefault(it, self.vars.get(it))
            self.vars[it] = name
            bound.append(name)
        return saved, bound

    def unbind_iters(self, saved: dict[Var, str | None]) -> None:
        for it, old in saved.items():
            if old is None:
                del self.vars[it]
            else:
                self.vars[it] = old

    def store(self, s: Store, depth: int) -> None:
        saved, bound = self.bind_iters(s, depth)
        if self.traced:
            vals = ", ".join(f"int({b})" for b in bound)
            self.emit(depth, f"_trace.append(({s.name!r}, ({vals}{',' if len(bound) == 1 else ''})))")
        if self.trace_only:
            self.unbind_iters(saved)
            return
        self.emit(depth, f"_val = {self.expr(s.value)}")
        if s.buffer.dtype == "bfloat16":
            self.emit(depth, "_val = _f2bf(_val)")
        sub, cond, idx = self.indexed(s.buffer, s.indices)
        if cond != "True":
            dims = self.buffer(s.buffer)[1]
            shape = f"({', '.join(dims)},)"
            self.emit(depth, f"if not ({cond}):")
            self.emit(depth + 1, f"_oob({s.buffer.name!r}, {idx}, {shape}, 'store {s.name}')")
        self.emit(depth, f"{sub} = _val")
        self.unbind_iters(saved)

    # ---------------------------------------------------------------- the function

    def compile(self) -> _Compiled:
        p = self.program
        prologue: list[str] = []
        for k, b in enumerate((*p.args, *p.temps)):
            if b in self.bufs:
                raise ArgumentError(f"buffer {b.name!r} appears twice among the arguments and temps of {p.name!r}")
            name, dims = self.declare_buffer(b)
            prologue.append(f"    {name} = _bufs[{k}]")
            if dims:
                prologue.append(f"    {', '.join(dims)}{',' if len(dims) == 1 else ''} = {name}.shape")
        self.block(p.body, 1)
        size_vars = list(self.sizes)
        for k, v in enumerate(size_vars):
            prologue.append(f"    {self.sizes[v]} = _sizes[{k}]")
        src = "\n".join([f"def _run_{_ident(p.name)}(_bufs, _sizes, _trace):", *prologue, *self.lines]) + "\n"
        code = compile(src, f"<loopir.interp {p.name}>", "exec")
        ns = dict(self.ns)
        exec(code, ns)  # the source is generated from the IR above, never from user text
        fn = ns[f"_run_{_ident(p.name)}"]
        return _Compiled(fn, src, tuple(size_vars))


def _ident(name: str) -> str:
    return name if name.isidentifier() else "program"


class _Compiled:
    __slots__ = ("fn", "source", "size_vars")

    def __init__(self, fn: Any, source: str, size_vars: tuple[Var, ...]) -> None:
        self.fn = fn
        self.source = source
        self.size_vars = size_vars


_CACHE: dict[tuple[int, bool], tuple[Program, _Compiled]] = {}
_CACHE_MAX = 512


def compiled(program: Program, traced: bool = False) -> _Compiled:
    """The compiled form of `program` (cached per program object)."""
    key = (id(program), traced)
    hit = _CACHE.get(key)
    if hit is not None and hit[0] is program:
        return hit[1]
    c = _Compiler(program, traced).compile()
    if len(_CACHE) >= _CACHE_MAX:
        _CACHE.pop(next(iter(_CACHE)))
    _CACHE[key] = (program, c)
    return c


def source(program: Program, traced: bool = False) -> str:
    """The Python source the interpreter runs for `program` (for debugging)."""
    return compiled(program, traced).source



__all__ = ["compiled", "source"]
