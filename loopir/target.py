"""Target facts: what the machine code will run on offers (vector features, vector width, registers).

One module that both layers read: `schedules` picks tile sizes from these facts (the CPU GEMM register
tile) and `codegen` picks vector widths and math variants from the same ones, so the two never disagree
and `schedules` never needs to import `codegen`. The host's features come from LLVM (llvmlite), which is
imported on first use only: `import loopir` stays cheap.
"""

from __future__ import annotations

from functools import cache

__all__ = ["host_features", "vector_bits", "vector_registers"]


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
