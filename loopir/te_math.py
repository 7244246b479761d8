"""Elementwise operations of `te` (re-exported there): the math library, maximum / minimum / where, casts
(wrapping and saturating) and constants. Each takes and returns expressions (`te.exp(x[i])`); a tensor given
where an element belongs is refused naming it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from . import nodes
from .dtypes import INT_RANGE, check_dtype, is_float, is_int
from .errors import ArgumentTypeError
from .nodes import Const, Expr, ExprLike

# the tensor class(es) of `te`, filled by loopir.te when it loads (te imports this module, not the reverse)
TENSOR_TYPES: list[type] = []


def _math(fn: str, doc: str = "") -> Callable[..., Expr]:
    def f(*xs: ExprLike) -> Expr:
        for x in xs:
            if any(isinstance(x, t) for t in TENSOR_TYPES):
                raise ArgumentTypeError(
                    f"te.{fn}: got the tensor {x.name!r}; apply it to an element such as {x.name}[i]")
        return nodes.call(fn, *xs)

    f.__name__ = fn
    f.__doc__ = doc or f"Elementwise {fn}; integers are computed in float64."
    return f


exp = _math("exp")
log = _math("log")
sqrt = _math("sqrt")
rsqrt = _math("rsqrt")
sin = _math("sin")
cos = _math("cos")
tanh = _math("tanh")
sigmoid = _math("sigmoid")
erf = _math("erf")
abs = _math("abs")
pow = _math("pow", "pow(x, y): x to the power y (numpy.power of floats; integers are computed in float64).")
power = pow  # TVM's te.power
fmod = _math("fmod", "fmod(x, y): C's fmod, the remainder with the sign of x (numpy.fmod; `%` is Python's).")
floor = _math("floor", "Elementwise floor, a float (numpy.floor); integers are computed in float64.")
ceil = _math("ceil", "Elementwise ceil, a float (numpy.ceil); integers are computed in float64.")
round = _math("round", "Round to the nearest integer, halves to even (numpy.round / rint), a float.")
# fast variants: CUDA's intrinsics (__expf, __logf, __sinf, __cosf) for float32 and halves (computed in float);
# float64 and the CPU and the interpreter compute the accurate function (no faster variant there is sound)
fast_exp = _math("fast_exp", "exp through CUDA's __expf (max ulp error 2 + floor(|1.173 x|)); accurate elsewhere.")
fast_log = _math("fast_log", "log through CUDA's __logf (abs error 2^-21.41 on [0.5, 2], else 3 ulp); "
                 "accurate elsewhere.")
fast_sin = _math("fast_sin", "sin through CUDA's __sinf (abs error 2^-21.41 on [-pi, pi], larger outside); "
                 "accurate elsewhere.")
fast_cos = _math("fast_cos", "cos through CUDA's __cosf (abs error 2^-21.19 on [-pi, pi], larger outside); "
                 "accurate elsewhere.")


def maximum(a: ExprLike, b: ExprLike) -> Expr:
    """Elementwise maximum of two expressions."""
    return nodes.binary("max", a, b)


def minimum(a: ExprLike, b: ExprLike) -> Expr:
    """Elementwise minimum of two expressions."""
    return nodes.binary("min", a, b)


def where(cond: ExprLike, a: ExprLike, b: ExprLike) -> Expr:
    """`a` where `cond` holds, else `b` (only the branch taken is evaluated: a read the condition guards is never
    made where it does not hold). `cond` is a comparison of expressions, or a Python bool known when the program
    is built (`T >= 1` of a fixed size). Beware: `i == j` of two loop variables is Python's comparison of the
    objects, a bool (False), not a comparison: write `i.eq(j)` (`i.ne(j)` for `!=`)."""
    return nodes.select(cond, a, b)


def cast(dtype: str, x: ExprLike) -> Expr:
    """`x` converted to `dtype`. To an integer it wraps, as numpy's `astype`: the value modulo 2**bits (a
    float is truncated toward zero first; a float beyond int64, inf or NaN gives an unspecified value).
    `saturate_cast` clamps instead."""
    return nodes.cast(check_dtype(dtype), x)


def saturate_cast(dtype: str, x: ExprLike) -> Expr:
    """`x` converted to `dtype`, clamped to its range (Halide's `saturating_cast`, also `te.saturating_cast`).

    To an integer: values below the range give its minimum, above it its maximum (uint8: -129 -> 0,
    256 -> 255; inf -> 255, -inf -> 0); a float inside is truncated toward zero (after clamping, so 255.7 ->
    255); NaN gives 0. To a float: values beyond the largest finite value give it (float16: 1e6 -> 65504),
    NaN stays NaN. bool source or target: a plain cast."""
    dt = check_dtype(dtype)
    x = nodes.as_expr(x)
    src = x.dtype
    if src == dt or "bool" in (src, dt):
        return cast(dt, x)
    if is_float(dt):
        fmax = 3.3895313892515355e38 if dt == "bfloat16" else float(np.finfo(dt).max)  # largest finite value
        if is_int(src):
            if INT_RANGE[src][1] <= fmax:
                return cast(dt, x)
            lim = int(fmax)
            return cast(dt, maximum(minimum(x, nodes.const(lim, src)), nodes.const(-lim, src)))
        w = "float64" if src == "float64" else "float32"  # halves compare in float32, where fmax is exact
        if w == "float32" and dt in ("float32", "float64") or dt == "float64":
            return cast(dt, x)  # every value of the source fits
        xf = cast(w, x)
        big, small = nodes.const(fmax, w), nodes.const(-fmax, w)
        return cast(dt, where(xf > big, big, where(xf < small, small, xf)))
    lo, hi = INT_RANGE[dt]
    if is_int(src):
        slo, shi = INT_RANGE[src]
        y = x
        if shi > hi:
            y = minimum(y, nodes.const(hi, src))
        if slo < lo:
            y = maximum(y, nodes.const(lo, src))
        return cast(dt, y)
    # a float: compared in float32 / float64, where the bounds lo and hi + 1 (powers of two) are exact; only
    # a value strictly inside (lo, hi + 1) is converted, so the conversion never leaves the type, and NaN,
    # which no comparison holds for, falls through to 0
    w = "float64" if src == "float64" else "float32"
    xf = cast(w, x)
    top, bot = nodes.const(float(hi + 1), w), nodes.const(float(lo), w)
    return where(xf >= top, nodes.const(hi, dt),
                 where(xf > bot, cast(dt, xf), where(xf <= bot, nodes.const(lo, dt), nodes.const(0, dt))))


saturating_cast = saturate_cast  # Halide's name


def const(value: float | bool, dtype: str | None = None) -> Const:
    """A constant of `dtype` (default: int64 for ints, float32 for floats, bool for bools)."""
    return nodes.const(value, None if dtype is None else check_dtype(dtype))
