"""The dtypes of the language and the one promotion rule.

Promotion: two tensors (or expressions) combine as numpy combines their dtypes
(`numpy.promote_types`). A Python scalar is *weak*: it takes the dtype of the other
operand (numpy's NEP 50 rule), except that a Python float meeting an integer or bool
expression gives float64, as in numpy. Index arithmetic on loop and size variables is
int64.
"""

from __future__ import annotations

import numpy as np

from .errors import ArgumentTypeError

DTYPES: tuple[str, ...] = ("float16", "float32", "float64", "int32", "int64", "bool")
FLOATS = frozenset({"float16", "float32", "float64"})
INTS = frozenset({"int32", "int64"})
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


def promote(a: str, b: str) -> str:
    """The dtype of a binary operation between two typed operands."""
    if a == b:
        return a
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
    return np.dtype(dtype)
