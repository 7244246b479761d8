"""The CUDA target: lowered loop IR -> CUDA C (`kernel`, with `expr`, `vector`, `reduce`, `staging`,
`prelude`) -> cubin through NVRTC (`nvrtc`) -> launches through cuda-python's driver API (`runtime`);
`build` runs the whole chain for `codegen.build(..., target="cuda")`.

Module settings that tests and benchmarks change (`LAUNCH_MIN_BLOCKS`) live in, and are read from,
`codegen.cuda.kernel`: patch them there, not on this package.
"""

from __future__ import annotations

from .kernel import (
    CudaCodegenError,
    CudaSource,
    HostIf,
    HostLoop,
    HostStep,
    Kernel,
    KernelArg,
    Launch,
    LaunchPlan,
    UnboundLoopError,
    generate_cuda,
)

__all__ = ["generate_cuda", "CudaSource", "Kernel", "KernelArg", "LaunchPlan", "Launch", "HostLoop", "HostIf",
           "HostStep", "CudaCodegenError", "UnboundLoopError"]
