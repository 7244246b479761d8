"""glibc's vector math library (libmvec) for the CPU code generator: which vector variants of libm
functions the loop vectorizer may call on this host. The host's features themselves are target facts
(`loopir.target`), re-exported here for the code generator."""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import cache

from loopir.target import host_features, vector_bits

__all__ = ["host_features", "libm_name", "libmvec", "vector_bits", "vector_variants"]


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


def libm_name(fn: str, dtype: str) -> str:
    return fn + ("f" if dtype != "float64" else "")
