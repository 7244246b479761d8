"""The database's keys: the workload (its loop IR, names ignored), the target (what the timings are valid on) and
the shape bucket.

    workload_key(outputs, args)   # '3f9c...': equal for a renamed copy of the program, not for other sizes/dtypes
    target_key("cuda")            # ('a1b2...', {"device": "NVIDIA H200", "arch": "sm_90", "driver": 13000, ...})
    shape_key(args, {"n": 4096})  # '4096x4096x4096': every argument's dimensions, in argument order

The target key holds the device's name and arch, the driver and NVRTC versions (CPU: llvmlite, triple, CPU name
and features) and loopir's release version (not a hash of its sources: a tuned record stays valid while the
project is edited, and is re-tuned at a release).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
from typing import Any

from loopir.errors import ArgumentError
from loopir.lower import lower

from ..cuda import runtime as cuda_runtime
from ..cuda.nvrtc import nvrtc_version
from ..llvm.runtime import host_id
from ..structure import structural_key

__all__ = ["workload_key", "target_key", "shape_key", "shape_of", "loopir_version"]


def loopir_version() -> str:
    try:
        return importlib.metadata.version("loopir")
    except importlib.metadata.PackageNotFoundError:  # a source tree that was never installed
        return "0+source"


def workload_key(outputs: list[Any], args: list[Any]) -> str:
    """A hash of the workload's loop IR with names and object identity ignored."""
    return hashlib.sha256(repr(structural_key(lower(list(outputs), args=list(args)))).encode()).hexdigest()[:32]


def _nvrtc_version() -> str:
    try:
        return "{}.{}".format(*nvrtc_version())
    except Exception:  # noqa: BLE001 - no NVRTC: the key says so
        return "none"


def _cuda_desc(ordinal: int = 0) -> dict[str, Any]:
    desc: dict[str, Any] = {"target": "cuda", "nvrtc": _nvrtc_version()}
    if not cuda_runtime.gpu_available():
        desc.update(device="none", arch=cuda_runtime.default_arch())
        return desc
    cu = cuda_runtime._driver()
    dev = cuda_runtime.device(ordinal)
    name = cuda_runtime.check(cu.cuDeviceGetName(256, dev.handle), "cuDeviceGetName")
    desc.update(device=name.split(b"\0", 1)[0].decode(), arch=dev.arch,
                driver=cuda_runtime.check(cu.cuDriverGetVersion(), "cuDriverGetVersion"))
    return desc


def target_key(target: str, ordinal: int = 0) -> tuple[str, dict[str, Any]]:
    """(key, description) of `target` on this machine (CUDA: device `ordinal`)."""
    if target == "cuda":
        desc = _cuda_desc(ordinal)
    else:
        desc = {"target": "cpu", "host": host_id().replace("\0", " ")}
    desc["loopir"] = loopir_version()
    return hashlib.sha256(json.dumps(desc, sort_keys=True).encode()).hexdigest()[:32], desc


def shape_of(x: Any, sizes: dict[str, int]) -> tuple[int, ...]:
    """The dimensions of tensor `x` with its size variables at `sizes` (by name)."""
    dims = []
    for e in x.shape:
        v = getattr(e, "value", None)
        if v is None:
            name = getattr(e, "name", None)
            if name not in sizes:
                raise ArgumentError(f"tuning: size {e} of {x.name!r} is symbolic; give its value in sizes=")
            v = sizes[name]
        dims.append(int(v))
    return tuple(dims)


def shape_key(args: list[Any], sizes: dict[str, int]) -> str:
    """Every argument's dimensions at `sizes`, in argument order."""
    return "x".join(str(d) for a in args for d in shape_of(a, sizes))
