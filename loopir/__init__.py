"""loopir: tensor expressions, the affine loop IR, and its analysis.

The package imports its submodules (`loopir.te`, `loopir.ir`, `loopir.interp`, ...) when it loads:
`import loopir` costs what numpy and islpy cost (about 0.15 s), which any use of the package pays anyway,
and importing `loopir.printer` here is what makes `str()` of every IR node work (see `loopir.nodes`).
The error tree (`loopir.errors`, rooted at `LoopirError`) is exported here.
"""

from __future__ import annotations

from . import (
    affine,
    args,
    dtypes,
    errors,
    interp,
    ir,
    lower,
    nodes,
    poly,
    printer,
    target,
    te,
    visit,
    workloads,
)
from .errors import (
    ArgumentError,
    ArgumentTypeError,
    CodegenError,
    CudaCodegenError,
    IslConversionError,
    LoopirError,
    NotFoundError,
    NotNestedError,
    ResourceLimitError,
    RuntimeLaunchError,
    UnboundLoopError,
)

__all__ = [
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
    # the error tree (loopir.errors)
    "ArgumentError",
    "ArgumentTypeError",
    "CodegenError",
    "CudaCodegenError",
    "IslConversionError",
    "LoopirError",
    "NotFoundError",
    "NotNestedError",
    "ResourceLimitError",
    "RuntimeLaunchError",
    "UnboundLoopError",
]

