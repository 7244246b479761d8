"""`build_cuda(program, arch=None, **opts)`: CUDA C generation and NVRTC compilation, eagerly.

NVRTC needs no GPU, so the cubin exists as soon as `build` returns (CI compiles every scheduled
program); the driver is touched only at the first call, which loads the module.
"""

from __future__ import annotations

import dataclasses
import math
import struct
from typing import Any

from loopir.errors import ArgumentTypeError
from loopir.nodes import Const, ExternCall, Kernel, Program
from loopir.visit import walk

from .kernel import CudaSource, generate_cuda
from .runtime import CudaModule, default_arch
from .cubin_info import check_registers, cubin_resources
from .nvrtc import compile_cubin, normalize_arch
from ..passes import lower

CUDA_OPTS = ("arch", "options", "cache", "extern_source")


def build_cuda(program: Program, arch: str | int | None = None, **opts: Any) -> CudaModule:
    """Compile `program` for the GPU.

    arch: "sm_90" etc. (default: the device's own when a GPU is present, else sm_90);
    options: extra NVRTC options (tuple of str); cache: False to bypass the disk cache; extern_source: CUDA C
    defining the `__device__` functions that te.call_extern names (put before the kernels)."""
    for o in opts:
        if o not in CUDA_OPTS:
            raise ArgumentTypeError(f"build: unknown option {o!r} for target 'cuda' (known: {', '.join(CUDA_OPTS)})")
    options = tuple(opts.get("options", ()))
    if arch is None:
        arch = default_arch()
    arch = normalize_arch(arch)
    if not any(isinstance(n, Kernel) for n in walk(program.body)):
        program = lower(program, "cuda")  # called directly, not through build: lower it here
    return cuda_module(cuda_source(program, opts.get("extern_source")), arch, options, opts.get("cache", True))


def cuda_source(program: Program, extern_source: str | None = None) -> CudaSource:
    """The CUDA C of a lowered program: the kernels, after the definitions of the external functions it calls."""
    gen = generate_cuda(program)
    # external functions (loopir.te_extern): the registrations' CUDA sources and the build's, once each, first
    defs = [n.decl.cuda_source for n in walk(program.body) if isinstance(n, ExternCall) and n.decl.cuda_source]
    defs += [extern_source] if extern_source else []
    if defs:
        gen = dataclasses.replace(gen, source="\n".join(dict.fromkeys(defs)) + "\n" + gen.source)
    return gen


def cuda_module(gen: CudaSource, arch: str, options: tuple[str, ...], use_cache: bool = True) -> CudaModule:
    """The module of rendered CUDA source `gen` (NVRTC through the disk cache, or a compilation in flight)."""
    cubin = compile_cubin(gen.source, arch, options, name=f"{gen.program.name}.cu", use_cache=use_cache)
    threads = {k.name: math.prod(int(e.value) for e in k.launch.block) for k in gen.kernels
               if all(isinstance(e, Const) for e in k.launch.block)}
    try:
        resources = cubin_resources(cubin)
    except (struct.error, ValueError, KeyError, IndexError):  # a cubin layout we do not read: NVRTC's bound holds
        resources = {}
    check_registers(resources, threads)
    return CudaModule(gen, cubin, arch, options)


__all__ = ["CUDA_OPTS", "build_cuda", "cuda_module", "cuda_source"]
