"""The project's error tree: one root, `LoopirError`, so a caller can catch everything loopir refuses.

    LoopirError(Exception)
    ├── ScheduleError                       schedules.errors: a step refused, with a witness
    ├── InexactCheckError (ValueError)      schedules.errors: a step the checker cannot decide exactly
    ├── PrivateScopeError (ValueError)      loopir.poly: a step that would change a scratch buffer's sharing
    ├── ArgumentError (ValueError)          a bad argument (a factor, a size, a dtype, an option)
    │   └── ArgumentTypeError (TypeError)   ... of the wrong type
    ├── NotFoundError (LookupError, ValueError)   a name or handle that names nothing (here)
    ├── NotNestedError (ValueError)         loops that should be nested (perfectly) are not
    ├── IslConversionError (ValueError)     an isl function with no loopir expression of the form asked
    ├── CodegenError (ValueError)           a program a target cannot compile as scheduled
    │   ├── ResourceLimitError              ... beyond a limit of the target or machine (threads, memory)
    │   ├── codegen.llvm.types.CodegenError       the CPU (LLVM) target
    │   └── codegen.cuda.expr.CudaCodegenError    the CUDA target (UnboundLoopError below it)
    └── RuntimeLaunchError (RuntimeError)   the toolchain or device below the generated code failed
        ├── codegen.cuda.nvrtc.NvrtcError         NVRTC refused the source
        ├── codegen.cuda.runtime.CudaError        a CUDA driver call failed
        └── codegen.cuda.runtime.NoGpuError       no usable GPU

Each class is also a subclass of the built-in exception the same failure raised before the tree
existed, so `except ValueError` (or `TypeError`, `RuntimeError`) around a call keeps working.
`ScheduleError` alone is not a ValueError: it is a refusal of a legal request, not a bad argument,
and code that catches ValueError to probe arguments must not swallow it.

`NotFoundError` is a `LookupError` (the base of KeyError and IndexError: "this name or handle
names nothing" is a failed lookup) rather than a `KeyError`, because KeyError prints its message
through repr(), which mangles the multi-line, hand-worded messages the project gives; it is also a
`ValueError` because every not-found failure raised ValueError before.

This module imports nothing from the project, so every layer may import it.
"""

from __future__ import annotations

__all__ = [
    "CudaCodegenError",
    "UnboundLoopError",
    "ArgumentError",
    "ArgumentTypeError",
    "CodegenError",
    "IslConversionError",
    "LoopirError",
    "NotFoundError",
    "NotNestedError",
    "ResourceLimitError",
    "RuntimeLaunchError",
]


class LoopirError(Exception):
    """The root of every error loopir raises on purpose (a refusal, a bad argument, a failed launch)."""


class ArgumentError(LoopirError, ValueError):
    """An argument outside what the call accepts (a split factor < 1, an unknown option, a bad size)."""


class ArgumentTypeError(ArgumentError, TypeError):
    """An argument of the wrong type (a factor that is not an int, a tensor where a loop is expected)."""


class NotFoundError(LoopirError, LookupError, ValueError):
    """A name or handle that names nothing here: a statement, a tensor, a loop, a stale loop handle."""


class NotNestedError(LoopirError, ValueError):
    """Loops a step needs nested (perfectly, or in a given order) are not."""


class IslConversionError(LoopirError, ValueError):
    """An isl (piecewise) affine function that has no loopir expression of the form asked: empty, not
    one piece nor a max / min of its pieces, or naming a variable the caller did not give. Callers that
    can over-approximate catch it (as ValueError, which it raised before)."""


class CodegenError(LoopirError, ValueError):
    """A program that a target cannot compile as scheduled; the message names the offending thing."""


class ResourceLimitError(CodegenError):
    """A program or tile choice beyond a limit of the target or the machine: threads per block, grid
    size, unrolled iterations, native call parameters, device memory, a temporary too large to allocate."""


class CudaCodegenError(CodegenError):
    """A program that cannot be mapped to CUDA kernels as scheduled."""


class UnboundLoopError(CudaCodegenError):
    """A top-level nest with loops but no loop bound to a GPU axis."""


class RuntimeLaunchError(LoopirError, RuntimeError):
    """The toolchain or device below the generated code failed: compiling, loading or launching."""
