"""loopir: tensor expressions, the affine loop IR, and its analysis.

Submodules load on first use (`loopir.te`, `loopir.ir`, `loopir.interp`, ...), so importing
the package is cheap and a module's absence only matters to whoever asks for it. The error tree
(`loopir.errors`, rooted at `LoopirError`) is exported here: it imports nothing.
"""

from __future__ import annotations

import importlib
from typing import Any

from .errors import (
    ArgumentError,
    ArgumentTypeError,
    CodegenError,
    CudaCodegenError,
    LoopirError,
    NotFoundError,
    NotNestedError,
    RuntimeLaunchError,
    UnboundLoopError,
)

_SUBMODULES = (
    "affine",
    "args",
    "dtypes",
    "errors",
    "interp",
    "ir",
    "lower",
    "nodes",
    "poly",
    "printer",
    "target",
    "te",
    "visit",
    "workloads",
)

__all__ = [
    *_SUBMODULES,
    # the error tree (loopir.errors)
    "ArgumentError",
    "ArgumentTypeError",
    "CodegenError",
    "CudaCodegenError",
    "LoopirError",
    "NotFoundError",
    "NotNestedError",
    "RuntimeLaunchError",
    "UnboundLoopError",
]


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_SUBMODULES))
