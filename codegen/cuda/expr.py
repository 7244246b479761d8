"""Scalar expressions and indices of the CUDA generator: dtype -> C type maps, C names, host-side evaluation of
launch sizes, affine (polynomial) forms of index expressions, the choice of 32-bit index arithmetic, and the
rendering of loopir expressions as C text (`_ExprEmitter`, a part of `codegen.cuda.kernel._KernelGen`).

Index arithmetic is 64-bit (`long long`) unless `_fits_int32` proves every index of the kernel fits 32 bits.
`//` and `%` follow Python (floor), through the prelude's `loopir_floordiv` / `loopir_mod`. float16 and
bfloat16 values are computed in float: loads go through `loopir_h2f` / `loopir_bf2f`, casts to them round through
`loopir_round_half` / `loopir_round_bf16`, stores convert with `loopir_f2h` / `loopir_f2bf` (round to nearest even);
bfloat16 constants are rounded to bfloat16 (as the interpreter holds them). Small integers (int8, uint8, int16,
uint16) are stored narrow and computed in `int`, as C does; every result that could leave the type (+ - * // neg
abs, casts) is narrowed back through its C type (`_wrap`), so each operation wraps as numpy's does."""

from __future__ import annotations

import math

import numpy as np


from loopir import nodes as N
from loopir.affine import row_major
from loopir.dtypes import is_float, is_int, round_bfloat16
from loopir.errors import CodegenError, CudaCodegenError, UnboundLoopError  # noqa: F401
from loopir.visit import subst_coords, substitute, walk

from ..names import C_RESERVED, Namer, mangle


_CTYPE = {"float16": "float", "bfloat16": "float", "float32": "float", "float64": "double", "int32": "int",
          "int64": "long long", "bool": "bool", "int8": "int", "uint8": "int", "int16": "int", "uint16": "int"}
_SMALL = {"int8": "signed char", "uint8": "unsigned char", "int16": "short", "uint16": "unsigned short"}
_STORAGE = {**_CTYPE, "float16": "unsigned short", "bfloat16": "unsigned short", **_SMALL}
_NPTYPE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int32": 4, "int64": 8, "bool": 1,
           "int8": 1, "uint8": 1, "int16": 2, "uint16": 2}
# 16-bit floats: stored as bits, computed in float (prelude PRELUDE_HALF)
_TO_FLOAT = {"float16": "loopir_h2f", "bfloat16": "loopir_bf2f"}
_FROM_FLOAT = {"float16": "loopir_f2h", "bfloat16": "loopir_f2bf"}
_ROUND = {"float16": "loopir_round_half", "bfloat16": "loopir_round_bf16"}
_AXES = ("x", "y", "z")
_CUDA_MATH2 = {"pow": "pow", "fmod": "fmod"}
_CUDA_FAST = {"fast_exp": "__expf", "fast_log": "__logf", "fast_sin": "__sinf", "fast_cos": "__cosf"}
_C_KEYWORDS = C_RESERVED  # words a C name must not be (codegen.names)


# ----------------------------------------------------------------------------- C names, nest queries


# every C name of a kernel (parameters, locals, temporaries) and every kernel name comes from one mangling
# (codegen.names): any IR name (`mean.sum0`, `int`, `loopir_mod`) is a valid identifier, distinct per object
_sanitize = mangle
_Names = Namer


def _is_const(e: N.Expr) -> bool:
    return isinstance(e, N.Const)


def _is_one(e: N.Expr) -> bool:
    """The constant 1: a reciprocal `1 / b`, computed as it is (once per loop where b is invariant)."""
    return isinstance(e, N.Const) and e.value == 1


def reciprocal_const(value: float, dtype: str) -> float | None:
    """1 / value correctly rounded to `dtype` (float32 or float64), or None where that is not a normal finite
    number (value zero, or so large or small that its reciprocal overflows or is subnormal): a multiply by it is
    then no longer within an ulp of the division, which the divisions rendered as multiplies rely on."""
    if not value:
        return None
    with np.errstate(over="ignore"):  # an overflow is the answer None below, not a warning
        r = float(np.float32(1) / np.float32(value)) if dtype == "float32" else 1.0 / float(value)
    tiny = 2.0 ** -126 if dtype == "float32" else 2.0 ** -1022
    return r if math.isfinite(r) and abs(r) >= tiny and abs(float(value)) >= tiny else None


def unrounded(value: N.Expr, dtype: str) -> N.Expr:
    """The value a store into a `dtype` (half) buffer converts: a cast to `dtype` of a float32 or half value left
    out, since the conversion rounds to dtype once and rounding first too changes nothing (one conversion, not
    three: float -> half -> float -> half)."""
    if dtype in _FROM_FLOAT and isinstance(value, N.Cast) and value.dtype == dtype and \
            value.a.dtype in ("float32", "float16", "bfloat16"):
        return value.a
    return value


def _wrap(dtype: str, text: str) -> str:
    """A small integer's `int` value narrowed to its type (wraps modulo 2**bits, as numpy); others unchanged."""
    return f"((int)({_SMALL[dtype]})({text}))" if dtype in _SMALL else text



class _ExprEmitter:
    """Line output, C names and expression rendering of `_KernelGen` (codegen/cuda/kernel.py), whose `__init__` sets
    the state used here: names, lines, ind, ix, forward, vec_lanes, cur_sub, pre, uses_half, fast_exp."""

    fast_exp = False  # float32 exp as ex2.approx: only where every output of the program is half (kernel.half_outputs)

    def widened(self) -> frozenset[str]:
        """The kernel's float32 register arrays that hold 16-bit values (N.Kernel.widened)."""
        kern = getattr(self, "kern", None)
        return kern.widened if kern is not None else frozenset()

    # ---------------------------------------------------------------- emission helpers
    def line(self, text: str) -> None:
        self.lines.append("  " * self.ind + text)

    def open_store(self, st: N.Store) -> None:
        """Open a statement's C block: `{  // name`, then its original iteration variables bound to their
        coordinates in the current loops (the caller closes the block)."""
        self.line(f"{{  // {st.name}")
        self.ind += 1
        self.cur_sub = subst_coords(st)
        for it, c in zip(st.iters, st.coords):
            if c is not it:
                self.line(f"const {self.ix} {self.var(it)} = {self.expr(c)};")

    def var(self, v: N.Var) -> str:
        return self.names.get(v, v.name)

    def buf(self, b: N.Buffer) -> str:
        return self.names.get(b, b.name)

    def flat(self, b: N.Buffer, idx: tuple[N.Expr, ...]) -> N.Expr:
        return row_major(b.shape, idx) if idx else N.const(0)

    def forward_key(self, b: N.Buffer, idx: tuple[N.Expr, ...], sub: dict) -> tuple[int, N.Expr]:
        """The key of an element in the forwarding scopes: the buffer and its flat index in the loops' variables
        (the indices substituted first, so that the same element has one key however its statement names it —
        a collapsed index folds only once substituted). A write and a later read of one element must meet here:
        a cross-thread reduction's total is visible to the other threads only through this register."""
        return id(b), self.flat(b, tuple(substitute(i, sub) for i in idx))

    # ---------------------------------------------------------------- expressions
    def expr(self, e: N.Expr) -> str:
        if isinstance(e, N.Const):
            return self.const(e)
        if isinstance(e, N.Var):
            return self.var(e)
        if isinstance(e, N.Load):
            if e in self.vec_lanes:
                return self.vec_lanes[e]
            flat = self.flat(e.buffer, e.indices)
            key = self.forward_key(e.buffer, e.indices, self.cur_sub)
            for scope in reversed(self.forward):
                if key in scope:
                    return scope[key]
            ref = f"{self.buf(e.buffer)}[{self.expr(flat)}]"
            if e.buffer.dtype in _SMALL:
                return f"((int){ref})"
            if e.buffer.dtype in _TO_FLOAT:
                self.uses_half = True
                return f"{_TO_FLOAT[e.buffer.dtype]}({ref})"
            return ref
        if isinstance(e, N.Binary):
            if e.op == "mod" and self.vec_lanes and e in self.vec_lanes:  # a lane's column (vector.py _lane_mods)
                return self.vec_lanes[e]
            a, b = self.expr(e.a), self.expr(e.b)
            if (e.op == "div" and self.fast_exp and e.dtype in ("float32", "float16", "bfloat16")
                    and not _is_one(e.a)):  # half outputs (a half quotient: computed in float32, as '/' would be)
                if not isinstance(e.b, N.Const):
                    return f"loopir_div_half({a}, {b})"
                r = reciprocal_const(e.b.value, "float32")
                if r is not None:
                    return f"({a} * {self.const(N.Const(r, 'float32'))})"
            if e.op in ("add", "sub", "mul", "div"):
                return _wrap(e.dtype, f"({a} {dict(add='+', sub='-', mul='*', div='/')[e.op]} {b})")
            if e.dtype in _SMALL and e.op in ("floordiv", "mod") and not (_is_const(e.b) and e.b.value > 0):  # type: ignore[attr-defined]
                # x // 0 == x % 0 == 0, as numpy and the CPU target give
                return _wrap(e.dtype, f"loopir_{e.op}0({a}, {b})")
            return _wrap(e.dtype, f"loopir_{e.op}({a}, {b})") if e.op == "floordiv" else f"loopir_{e.op}({a}, {b})"
        if isinstance(e, N.Unary):
            return _wrap(e.dtype, f"(-{self.expr(e.a)})")
        if isinstance(e, N.Call):
            if e in self.pre:
                return self.pre[e]
            return self.call(e)
        if isinstance(e, N.Compare):
            op = dict(lt="<", le="<=", gt=">", ge=">=", eq="==", ne="!=")[e.op]
            return f"({self.expr(e.a)} {op} {self.expr(e.b)})"
        if isinstance(e, N.Logical):
            if e.op == "not":
                return f"(!{self.expr(e.a)})"
            return f"({self.expr(e.a)} {'&&' if e.op == 'and' else '||'} {self.expr(e.b)})"  # type: ignore[arg-type]
        if isinstance(e, N.Select):
            return f"({self.expr(e.cond)} ? {self.expr(e.a)} : {self.expr(e.b)})"
        if isinstance(e, N.Cast):
            inner = self.expr(e.a)
            if isinstance(e.a, N.Load) and e.a.buffer.name in self.widened():
                return inner  # a 16-bit value held widened in a float register (codegen.passes.registers): exact
            if e.dtype in _ROUND:
                self.uses_half = True
                return f"{_ROUND[e.dtype]}((float)({inner}))"
            if e.dtype == "bool":
                return f"({inner} != 0)"
            if e.dtype in _SMALL:  # a float truncates toward zero to 64 bits first, then wraps (numpy's astype)
                return _wrap(e.dtype, f"(long long)({inner})" if is_float(e.a.dtype) else inner)
            return f"(({_CTYPE[e.dtype]})({inner}))"
        raise CudaCodegenError(f"cannot emit expression {e!r} in CUDA")

    def const(self, c: N.Const) -> str:
        if c.dtype == "bool":
            return "true" if c.value else "false"
        if c.dtype == "int64":
            return str(int(c.value)) if self.ix == "int" and abs(int(c.value)) < 2**31 else f"{int(c.value)}LL"
        if c.dtype == "int32" or c.dtype in _SMALL:
            return str(int(c.value))
        f = float(c.value)
        if c.dtype == "bfloat16":
            f = float(round_bfloat16(f))
        single = _CTYPE[c.dtype] == "float"
        if math.isnan(f):
            return "__int_as_float(0x7fc00000)" if single else "__longlong_as_double(0x7ff8000000000000LL)"
        if math.isinf(f):
            inf = "LOOPIR_INF_F" if single else "LOOPIR_INF_D"
            return inf if f > 0 else f"(-{inf})"
        text = repr(f)
        if "e" not in text and "." not in text:
            text += ".0"
        return text + ("f" if single else "")

    def call(self, e: N.Call) -> str:
        args = [self.expr(a) for a in e.args]
        if isinstance(e, N.ExternCall):  # loopir.te_extern: defined in the registration's / build's source
            if getattr(e.decl, "cuda", None) is None:  # (a te.extern stage's call outside its nest has none)
                raise CudaCodegenError(f"the external function {e.fn!r} has no CUDA lowering: register it with "
                                       "te.register_intrinsic(..., cuda=<a CUDA function>)")
            return f"(({_CTYPE[e.dtype]}){e.decl.cuda}({', '.join(args)}))"
        single = _CTYPE[e.dtype] == "float"
        x = args[0]
        if e.fn in _CUDA_MATH2:
            return f"{_CUDA_MATH2[e.fn]}{'f' if single else ''}({x}, {args[1]})"
        if e.fn in _CUDA_FAST:  # CUDA's fast intrinsics exist for float only: double stays accurate
            return f"{_CUDA_FAST[e.fn]}({x})" if single else f"{e.fn[5:]}({x})"
        if e.fn == "exp" and single and self.fast_exp:  # the program's outputs are half (kernel.half_outputs)
            return f"loopir_exp_fast({x})"
        if e.fn == "abs":
            if is_int(e.dtype):
                return f"llabs({x})" if e.dtype == "int64" else _wrap(e.dtype, f"abs({x})")
            return f"fabsf({x})" if single else f"fabs({x})"
        if e.fn == "sigmoid":
            return f"(1.0f / (1.0f + expf(-({x}))))" if single else f"(1.0 / (1.0 + exp(-({x}))))"
        fn = {"exp": "exp", "log": "log", "sqrt": "sqrt", "rsqrt": "rsqrt", "sin": "sin", "cos": "cos",
              "tanh": "tanh", "erf": "erf", "floor": "floor", "ceil": "ceil", "round": "rint"}[e.fn]
        return f"{fn}f({x})" if single else f"{fn}({x})"

    def extern_stage(self, call: N.ExternCall) -> None:
        """The call of a te.extern stage's `__device__` function by this thread: buffers, then 64-bit sizes."""
        if not call.decl.cuda_source:
            raise CudaCodegenError(f"the te.extern function {call.decl.func!r} has no CUDA source: give "
                                   "te.extern(..., cuda_source='__device__ void ...')")
        args = [self.buf(a.buffer) if isinstance(a, N.Load) else f"(long long)({self.expr(a)})" for a in call.args]
        self.line(f"{call.decl.func}({', '.join(args)});")

    def sincos(self, value: N.Expr) -> None:
        """sin(a) and cos(a) of the same argument: one sincosf call shares the range reduction."""
        calls = {}
        for n in walk(value):
            if isinstance(n, N.Call) and n.fn in ("sin", "cos"):
                calls.setdefault(n.args[0], {})[n.fn] = n
        for arg, fns in calls.items():
            if len(fns) == 2:
                single = _CTYPE[fns["sin"].dtype] == "float"
                ct = "float" if single else "double"
                sn, cn = self.names.fresh("sin_v"), self.names.fresh("cos_v")
                self.line(f"{ct} {sn}, {cn};")
                self.line(f"{'sincosf' if single else 'sincos'}({self.expr(arg)}, &{sn}, &{cn});")
                self.pre[fns["sin"]], self.pre[fns["cos"]] = sn, cn
