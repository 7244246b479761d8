"""Target facts: what the machine code will run on offers (vector features, vector width, registers).

One module that both layers read: `schedules` picks tile sizes from these facts (the CPU GEMM register
tile) and `codegen` picks vector widths and math variants from the same ones, so the two never disagree
and `schedules` never needs to import `codegen`. The host's features come from LLVM (llvmlite), which is
imported on first use only: `import loopir` stays cheap.
"""

from __future__ import annotations

import os
from functools import cache

from .nodes import Const, For
from .visit import walk

__all__ = ["MMA_STAGES", "UNROLL_EMIT_LIMIT", "cpu_count", "cpu_vector_fallback", "host_features", "padded_row",
           "vector_bits", "vector_registers"]

UNROLL_EMIT_LIMIT = 64  # the CPU renderer emits constant `unroll` loops up to this many iterations unrolled
# cp.async ring depth of a tensor-core kernel's staged k loop (codegen.passes.mma; fewer where shared memory is
# short); the tuning space sizes the shared tiles of its candidates with it
MMA_STAGES = 4


def padded_row(length: int, itemsize: int) -> int:
    """The smallest row length >= `length` whose byte stride is 16 times an odd number (ldmatrix conflict-free):
    the row the tensor-core pass gives a shared operand tile."""
    per = 16 // itemsize
    n = -(-length // per) * per
    return n if (n // per) % 2 else n + per


def cpu_count() -> int:
    """The CPUs this process may run on (its affinity), at least 1."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # not Linux
        return max(os.cpu_count() or 1, 1)


@cache
def host_features() -> frozenset[str]:
    """The host CPU's features as LLVM names them ("avx2", "avx512f", "fma", ...)."""
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    return frozenset(f[1:] for f in llvm.get_host_cpu_features().flatten().split(",") if f.startswith("+"))


def vector_bits() -> int:
    """The width of the host's widest vector registers, in bits."""
    f = host_features()
    return 512 if "avx512f" in f else 256 if "avx2" in f or "avx" in f else 128


def vector_registers() -> int:
    """How many vector registers the host has (32 with AVX-512, else 16)."""
    return 32 if "avx512f" in host_features() else 16


def cpu_vector_fallback(f: For) -> str | None:
    """Why the CPU target runs `vectorize` loop `f` as scalar code, or None when it does not (as far as the
    schedule can tell). A vectorize loop the CPU renderer does not emit as explicit vectors (codegen/llvm/vec.py)
    goes to LLVM's loop vectorizer, which takes innermost loops only: a loop left in the body (any but a constant
    `unroll` loop the renderer unrolls) makes it give up, with nothing but a warning on stderr
    ("loop not vectorized: the optimizer was unable to perform the requested transformation")."""
    if f.kind != "vectorize":
        return None
    for n in walk(f.body):
        if isinstance(n, For):
            ext = n.hi.value - n.lo.value if isinstance(n.lo, Const) and isinstance(n.hi, Const) else None
            if n.kind == "unroll" and ext is not None and ext <= UNROLL_EMIT_LIMIT:
                continue
            return f"its body holds loop {n.var.name} (LLVM's vectorizer takes innermost loops only)"
    return None
