"""The LLVM types and constant literals of loopir dtypes, shared by the CPU code generator's modules.

float16 is stored as `half` but computed as `float` (VALUE_T vs STORE_T); bool is stored as a byte.
bfloat16 is stored as `i16` bits and computed as `float`: a load widens the bits (shift into the top half
of a float), a store rounds to nearest even with integer operations (`codegen.llvm.expr`). Not LLVM's own
`bfloat`: without a native instruction its float conversion becomes a libcall the JIT cannot resolve.
"""

from __future__ import annotations

import struct

import numpy as np

from loopir import errors
from loopir.dtypes import round_bfloat16
from loopir.nodes import Const

# small integers compute in their own width: LLVM's i8 / i16 arithmetic wraps exactly as numpy's does;
# signedness lives in the instructions (zext / udiv / icmp ult / umax for uint8 and uint16)
_SMALL = {"int8": "i8", "uint8": "i8", "int16": "i16", "uint16": "i16"}
VALUE_T = {"float16": "float", "bfloat16": "float", "float32": "float", "float64": "double",
           "int32": "i32", "int64": "i64", "bool": "i1", **_SMALL}
STORE_T = {"float16": "half", "bfloat16": "i16", "float32": "float", "float64": "double",
           "int32": "i32", "int64": "i64", "bool": "i8", **_SMALL}
ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int32": 4, "int64": 8, "bool": 1,
            "int8": 1, "uint8": 1, "int16": 2, "uint16": 2}
FLT = {"float16", "bfloat16", "float32", "float64"}
INTS = {"int8", "uint8", "int16", "uint16", "int32", "int64"}
UNSIGNED = {"uint8", "uint16"}


class CodegenError(errors.CodegenError):
    """The program cannot be compiled for the CPU (names the offending thing)."""



# ----------------------------------------------------------------------------- constants


def fconst(value: float, dtype: str) -> str:
    if dtype == "float16":
        value = float(np.float16(value))
    elif dtype == "bfloat16":
        value = float(round_bfloat16(value))
    elif dtype == "float32":
        value = float(np.float32(value))
    return f"0x{struct.unpack('<Q', struct.pack('<d', float(value)))[0]:016X}"


def const_text(c: Const) -> str:
    if c.dtype in FLT:
        return fconst(c.value, c.dtype)
    if c.dtype == "bool":
        return "true" if c.value else "false"
    v = int(c.value)
    if c.dtype != "int64":  # LLVM reads an iN literal as signed: a uint8 255 is i8 -1
        bits = 8 * ITEMSIZE[c.dtype]
        v = (v + 2 ** (bits - 1)) % 2**bits - 2 ** (bits - 1)
    return str(v)

