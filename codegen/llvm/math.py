"""glibc's vector math library (libmvec) for the CPU code generator: which vector variants of libm
functions the loop vectorizer may call on this host. The host's features themselves are target facts
(`loopir.target`), re-exported here for the code generator.

External functions (`loopir.te_extern`): `extern_decl` resolves a declaration's C symbol in this process
(loading its shared library first) and gives the module text that declares or defines it; the text names the
library in a comment (`EXTERN_LIB_MARK`) so that `load_extern_libraries(source)` loads it again wherever the
source is compiled or its cached object code is loaded (another process)."""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import cache

from loopir.errors import CodegenError
from loopir.te_extern import Extern, ExternStage
from loopir.target import host_features, vector_bits

__all__ = ["EXTERN_LIB_MARK", "extern_decl", "extern_stage_decl", "host_features", "libm_name", "libmvec",
           "load_extern_libraries", "load_library", "vector_bits", "vector_variants"]

EXTERN_LIB_MARK = "; loopir extern library: "
_LLTYPE = {"float32": "float", "float64": "double", "int32": "i32", "int64": "i64"}


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


@cache
def load_library(path: str) -> None:
    """Load the shared library `path` into the process for the JIT (once); a typed error if it cannot be."""
    import llvmlite.binding as llvm

    try:
        llvm.load_library_permanently(path)
    except RuntimeError as err:
        raise CodegenError(f"cannot load the shared library {path!r} of an external function: {err}") from None


def load_extern_libraries(source: str) -> None:
    """Load the libraries that an LLVM IR text of ours names (EXTERN_LIB_MARK lines) before it is linked."""
    for line in source.splitlines():
        if line.startswith(EXTERN_LIB_MARK):
            load_library(line[len(EXTERN_LIB_MARK):])


@cache
def _process_symbols() -> None:
    """Make the symbols of this process (libc, libm) visible to `address_of_symbol`: LLVM loads them when the
    first MCJIT engine is made, so a lookup before any kernel ran would miss `cbrtf`."""
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    llvm.create_mcjit_compiler(llvm.parse_assembly(""), llvm.Target.from_default_triple().create_target_machine())


def _resolve(what: str, sym: str, library: str) -> str:
    """The library mark for `sym` (its library loaded) once the symbol is checked to resolve in the process."""
    import llvmlite.binding as llvm

    if library:
        load_library(library)
    _process_symbols()
    if not llvm.address_of_symbol(sym):
        lib = f" nor in {library!r}" if library else ""
        raise CodegenError(f"{what}: the C symbol {sym!r} is not found in this process{lib}; name its shared "
                           "library (te.register_intrinsic(..., cpu_library=...), te.extern(..., cpu_library=...) "
                           "or build(..., extern_libs=(...,)))")
    return f"{EXTERN_LIB_MARK}{library}\n" if library else ""


def extern_stage_decl(decl: ExternStage, arg_types: tuple[str, ...]) -> tuple[str, str]:
    """(callee, module text) for the one call of a te.extern stage's C function `void func(ptr..., i64...)`."""
    mark = _resolve(f"the te.extern function {decl.func!r}", decl.func, decl.cpu_library)
    return decl.func, f"{mark}declare void @{decl.func}({', '.join(arg_types)})"


def extern_decl(decl: Extern, arg_dtypes: tuple[str, ...]) -> tuple[str, str]:
    """(callee, module text) for calling the external function `decl` with arguments of `arg_dtypes` on the
    CPU: its symbol declared (its library loaded, the symbol checked to resolve) or defined by its LLVM IR."""
    if getattr(decl, "cpu", None) is None:  # (a te.extern stage's call outside its nest has none)
        raise CodegenError(f"the external function {getattr(decl, 'name', None) or decl.func!r} has no CPU "
                           "lowering: register it with "
                           "te.register_intrinsic(..., cpu=<a C symbol>)")
    sym = decl.cpu
    if decl.cpu_ir:
        return sym, decl.cpu_ir
    mark = _resolve(f"the external function {decl.name!r}", sym, decl.cpu_library)
    return sym, f"{mark}declare {_LLTYPE[decl.dtype]} @{sym}({', '.join(_LLTYPE[a] for a in arg_dtypes)})"
