"""The CPU target: lowered loop IR -> LLVM IR text (`emit`, with `expr`, `vec`, `math`, `types`,
`queries`) -> machine code through llvmlite's JIT -> one ctypes call per segment (`runtime`).

`emit` and its helpers import no llvmlite; `runtime` does, and loads only for `target="cpu"`.
"""

from __future__ import annotations

from .emit import (
    FLT,
    INTS,
    ITEMSIZE,
    STACK_LIMIT,
    STORE_T,
    UNROLL_EMIT_LIMIT,
    VALUE_T,
    CodegenError,
    Generated,
    Segment,
    const_text,
    fconst,
    generate,
    host_features,
    is_reduction,
    libmvec,
    size_vars,
    vector_bits,
    vector_variants,
)

__all__ = [
    "FLT", "INTS", "ITEMSIZE", "STACK_LIMIT", "STORE_T", "UNROLL_EMIT_LIMIT", "VALUE_T", "CodegenError",
    "Generated", "Segment", "const_text", "fconst", "generate", "host_features", "is_reduction", "libmvec",
    "size_vars", "vector_bits", "vector_variants",
]
