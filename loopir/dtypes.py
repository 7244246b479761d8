"""The dtypes of the language and the one promotion rule.

Promotion: two tensors (or expressions) combine as numpy combines their dtypes
(`numpy.promote_types`). A Python scalar is *weak*: it takes the dtype of the other
operand (numpy's NEP 50 rule), except that a Python float meeting an integer or bool
expression gives float64, as in numpy. Index arithmetic on loop and size variables is
int64.

bfloat16 (numpy has none): promotion treats it beside float16 without numpy —
bfloat16 with bfloat16 stays bfloat16; with float16 it is float32 (neither holds the
other: float16 has more mantissa, bfloat16 more exponent); with float32 float32, with
float64 float64; with an integer or bool it gives what float16 would (bfloat16 where numpy
keeps float16, e.g. next to bool, float64 next to int32/int64). Arithmetic on halves
(float16, bfloat16) is computed in float32 by the compiled targets and rounded to the
half type when stored (or where the user writes `te.cast`); for bfloat16 the reference
interpreter does the same, so its bfloat16 results match the targets'.

Small integers (int8, uint8, int16, uint16: images, quantized weights) promote as numpy does and wrap
as numpy does: every operation's result is its dtype's value modulo 2**bits (uint8 200 + 100 is 44), the
targets compute in 32-bit registers (as C does) and narrow each result. `te.cast` to a small integer wraps
like numpy's `astype` (a float is truncated toward zero first; a float beyond int64, inf or NaN gives an
unspecified value there); `te.saturate_cast` clamps instead (see `loopir.te`).

Host representation of bfloat16: numpy arrays of dtype uint16 holding the bits (the upper
half of the float32 bit pattern). `to_bfloat16(x)` rounds any float array to those bits
(round to nearest, ties to even; NaN stays a quiet NaN), `from_bfloat16(bits)` widens them
back to float32 exactly. `np_dtype("bfloat16")` is that storage dtype (uint16).
"""

from __future__ import annotations

import numpy as np

from .errors import ArgumentTypeError

DTYPES: tuple[str, ...] = ("float16", "bfloat16", "float32", "float64", "int8", "uint8", "int16", "uint16", "int32",
                           "int64", "bool")
FLOATS = frozenset({"float16", "bfloat16", "float32", "float64"})
HALVES = frozenset({"float16", "bfloat16"})  # 16-bit floats: stored as 2 bytes, computed in float32
INTS = frozenset({"int8", "uint8", "int16", "uint16", "int32", "int64"})
SMALL_INTS = frozenset({"int8", "uint8", "int16", "uint16"})  # stored narrow, computed in 32 bits, wrapped per op
UNSIGNED = frozenset({"uint8", "uint16"})
INT_RANGE = {"int8": (-(2**7), 2**7 - 1), "uint8": (0, 2**8 - 1), "int16": (-(2**15), 2**15 - 1),
             "uint16": (0, 2**16 - 1), "int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}
INDEX = "int64"


def check_dtype(dtype: object, what: str = "dtype") -> str:
    """Return the canonical name of `dtype`, or raise naming it."""
    if isinstance(dtype, np.dtype) or (isinstance(dtype, type) and issubclass(dtype, np.generic)):
        dtype = np.dtype(dtype).name
    if dtype == "float":
        dtype = "float32"
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise ArgumentTypeError(f"unknown {what} {dtype!r}; loopir supports {', '.join(DTYPES)}")
    return dtype


def is_float(dtype: str) -> bool:
    return dtype in FLOATS


def is_int(dtype: str) -> bool:
    return dtype in INTS


def is_small_int(dtype: str) -> bool:
    return dtype in SMALL_INTS


def is_unsigned(dtype: str) -> bool:
    return dtype in UNSIGNED


def wrap_int(value: int, dtype: str) -> int:
    """`value` modulo 2**bits of integer `dtype`, as the (two's complement) targets hold it."""
    lo, hi = INT_RANGE[dtype]
    span = hi - lo + 1
    return (int(value) - lo) % span + lo


def promote(a: str, b: str) -> str:
    """The dtype of a binary operation between two typed operands."""
    if a == b:
        return a
    if "bfloat16" in (a, b):
        other = b if a == "bfloat16" else a
        if other in ("float16", "float32"):
            return "float32"
        r = np.promote_types("float16", other).name
        return "bfloat16" if r == "float16" else r
    return np.promote_types(a, b).name


def weak_scalar_dtype(value: object, other: str) -> str:
    """The dtype a Python scalar takes next to an operand of dtype `other`."""
    if isinstance(value, bool):
        return other
    if isinstance(value, int):
        return other if other != "bool" else INDEX
    if isinstance(value, float):
        return other if is_float(other) else "float64"
    raise ArgumentTypeError(f"cannot use {type(value).__name__} {value!r} in an expression")


def np_dtype(dtype: str) -> np.dtype:
    """The numpy dtype of a buffer of `dtype` on the host (bfloat16: uint16 bits, see the module docstring)."""
    return np.dtype(np.uint16) if dtype == "bfloat16" else np.dtype(dtype)


def itemsize(dtype: str) -> int:
    """Bytes per element of `dtype` in memory (bool: one byte)."""
    return int(np_dtype(dtype).itemsize)


def vector_lanes(dtype: str) -> int:
    """Elements of `dtype` in one 16-byte (128-bit) access where a target has one for it (float32: 4,
    float16 / bfloat16 / int16 / uint16: 8, int8 / uint8: 16), else 0."""
    return 16 // itemsize(dtype) if dtype in ("float32", "float16", "bfloat16") or dtype in SMALL_INTS else 0


def to_bfloat16(x: object) -> np.ndarray:
    """The bfloat16 bits (uint16 array) of float values `x`, rounded to nearest, ties to even (once: float64
    values go through float32 rounded to odd, which keeps the final rounding exact, as the LLVM target does)."""
    a = np.asarray(x)
    with np.errstate(over="ignore"):  # beyond float32's range: infinity, as bfloat16 rounds it too
        f = a.astype(np.float32)
    bits = f.view(np.uint32).astype(np.uint64)
    if a.dtype == np.float64:
        back = f.astype(np.float64)
        with np.errstate(invalid="ignore"):
            over = np.abs(back) > np.abs(a)  # rounded away from zero: step back toward it (sign-magnitude)
            inexact = (back != a) & ~np.isnan(a)
        bits = (bits - over.astype(np.uint64)) | inexact.astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    out = rounded.astype(np.uint16)
    nan = np.isnan(f)
    if nan.any():  # keep NaN a (quiet) NaN: rounding its payload could carry it into the infinities
        out = np.where(nan, (bits >> 16).astype(np.uint16) | np.uint16(0x0040), out)
    return out.reshape(f.shape)


def from_bfloat16(bits: object) -> np.ndarray:
    """float32 values of bfloat16 bits (a uint16 array, as `to_bfloat16` makes); exact."""
    b = np.asarray(bits)
    if b.dtype != np.uint16:
        raise ArgumentTypeError(f"bfloat16 data must be a numpy uint16 array of bits, got dtype {b.dtype}")
    return (b.astype(np.uint32) << 16).view(np.float32)


def round_bfloat16(x: object) -> np.float32:
    """A float rounded to the nearest bfloat16, as a float32 scalar (how the interpreter holds a bfloat16 value)."""
    return np.float32(from_bfloat16(to_bfloat16(np.float64(x)))[()])
