"""Identifiers in generated code: the one mangling of IR names for CUDA C and LLVM IR.

IR names are whatever users and passes gave: `mean.sum0` (an inline reduction lifted into a stage),
`résultat`, `int`, `min`, `threadIdx`, `loopir_mod`, and several objects may share one (a size `b` beside a
tensor `b`: the IR tells Vars and Buffers apart by object). `mangle` turns a name into an identifier that
is valid C and LLVM IR and can mean nothing else there: `.` becomes `_`, any other character outside
`[A-Za-z0-9_]` becomes `_x<hex>_`, a leading digit or `_` gets a `v` before it, a C/C++/CUDA word, a vector
type or a function the generated code calls gets a `_` after it (`int` -> `int_`), and a name in a
namespace the generated code keeps for itself (`loopir_`, `LOOPIR_`, `__`) gets `v_` before it. `Namer`
gives each object of one scope (a kernel, an LLVM module) its own identifier: the mangled name, or with
`_1`, `_2`... when another object or a generated temporary has it already. The renderers
(`codegen.cuda.expr`, `codegen.llvm.emit`) name parameters, locals and kernels only through these two.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, field

from loopir.names import fresh

__all__ = ["C_RESERVED", "C_RESERVED_PREFIXES", "Namer", "mangle"]

_C_WORDS = (
    # C and C++ keywords (C++20), alternative operator spellings
    "alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t char32_t class "
    "compl concept const consteval constexpr constinit const_cast continue co_await co_return co_yield decltype "
    "default delete do double dynamic_cast else enum explicit export extern false float for friend goto if inline "
    "int long mutable namespace new noexcept not not_eq nullptr operator or or_eq private protected public "
    "register reinterpret_cast requires restrict return short signed sizeof static static_assert static_cast "
    "struct switch template this thread_local throw true try typedef typeid typename union unsigned using virtual "
    "void volatile wchar_t while xor xor_eq "
    # standard types and macros a translation unit may see
    "size_t ptrdiff_t int8_t int16_t int32_t int64_t uint8_t uint16_t uint32_t uint64_t intptr_t uintptr_t NULL "
    "NAN INFINITY assert printf malloc free memcpy memset std "
    # CUDA built-in variables and types
    "threadIdx blockIdx blockDim gridDim warpSize dim3 half half2 nv_bfloat16 nv_bfloat162 "
    # functions the generated code calls (codegen.cuda.expr.call, the prelude), and their relatives
    "min max abs labs llabs fabs fabsf exp expf exp2 exp2f expm1 expm1f log logf log2 log2f log10 log10f log1p "
    "log1pf sqrt sqrtf rsqrt rsqrtf cbrt cbrtf sin sinf cos cosf tan tanf sincos sincosf asin asinf acos acosf "
    "atan atanf atan2 atan2f sinh sinhf cosh coshf tanh tanhf erf erff erfc erfcf pow powf floor floorf ceil ceilf "
    "round roundf trunc truncf fmod fmodf fmax fmaxf fmin fminf fma fmaf isnan isinf isfinite"
).split()
# CUDA's vector types (float4, uint4, ...) and their make_ functions
_VECTOR_TYPES = [f"{base}{n}" for base in ("char", "uchar", "short", "ushort", "int", "uint", "long", "ulong",
                                           "longlong", "ulonglong", "float", "double") for n in (1, 2, 3, 4)]
C_RESERVED = frozenset(_C_WORDS + _VECTOR_TYPES + [f"make_{t}" for t in _VECTOR_TYPES])
# the generated code's own namespaces: prelude helpers (loopir_floordiv ...), its macros (LOOPIR_LD4 ...),
# the compiler's and CUDA's intrinsics (__syncthreads, __shfl_xor_sync ...)
C_RESERVED_PREFIXES = ("loopir_", "LOOPIR_", "__")

_IDENT = re.compile(r"[A-Za-z0-9_]")


def mangle(name: str, reserved: Collection[str] = C_RESERVED,
           reserved_prefixes: tuple[str, ...] = C_RESERVED_PREFIXES) -> str:
    """`name` as an identifier `[A-Za-z][A-Za-z0-9_]*` of C and LLVM IR that is no reserved word and in no
    reserved namespace (see the module doc); `mean.sum0` -> `mean_sum0`, `résultat` -> `r_xe9_sultat`,
    `int` -> `int_`, `loopir_mod` -> `v_loopir_mod`, `2d` -> `v2d`. Distinct names may meet (`a.b`, `a_b`):
    `Namer` keeps their objects apart."""
    s = "".join(c if _IDENT.fullmatch(c) else "_" if c == "." else f"_x{ord(c):x}_" for c in name) or "v"
    if s.startswith(reserved_prefixes):
        s = "v_" + s
    elif not s[0].isalpha():  # a digit, or `_` (C keeps `_X` and `__` for the implementation)
        s = "v" + s
    if s in reserved:
        s += "_"
    return s


@dataclass
class Namer:
    """Identifiers of one scope of generated code: one per object (`get`), and fresh ones for the generator's
    own temporaries (`fresh`); all distinct, all mangled."""

    reserved: Collection[str] = C_RESERVED
    used: set[str] = field(default_factory=set)
    of: dict[int, str] = field(default_factory=dict)
    # the objects named, kept alive: a temporary Var a renderer makes and drops would otherwise free its id for
    # the next one, which then got the dead one's name (the attention epilogue's `fa_lv` came out `fa_tmax`)
    kept: list[object] = field(default_factory=list)

    def fresh(self, base: str) -> str:
        """A new identifier from `base` that nothing in this scope has yet."""
        return fresh(mangle(base, self.reserved), self.used)

    def get(self, obj: object, base: str) -> str:
        """The identifier of `obj` (a Var, a Buffer), made from `base` on first sight."""
        if id(obj) not in self.of:
            self.of[id(obj)] = self.fresh(base)
            self.kept.append(obj)
        return self.of[id(obj)]
