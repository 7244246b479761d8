"""TMA tensor maps (CUtensorMap) of kernel arguments, made on the host per call (codegen.cuda.wgmma_tma).

A kernel parameter `const __grid_constant__ loopir_tmap X` is the 128 opaque bytes the driver's
`cuTensorMapEncodeTiled` writes for a row-major tensor seen with as many dimensions as its box has (`map_extents`:
2, its 2-d view; 3, the product of its leading extents and its last two): its address, its extents and strides
(evaluated at the call's sizes), a box of `box` elements (innermost first) and the 128-byte swizzle that the wgmma
descriptors read and the TMA stores' staging boxes are written in.
The bytes depend on the pointer, so they are made for each call; the last ones made are kept by (pointer, shape,
box), so that a program called again on the same arrays does not encode them again.

cuda-python's form (checked on cuda-bindings 13): every extent and stride is a `cuuint64_t`, every box extent and
element stride a `cuuint32_t`; the result's 128 bytes are at `getPtr()`, copied here into a 64-byte aligned buffer
(the parameter's alignment) whose address goes into the launch's parameter array.
"""

from __future__ import annotations

import ctypes
import threading
from collections import OrderedDict
from typing import Any

from loopir.errors import RuntimeLaunchError

__all__ = ["tensor_map", "view_extents", "map_extents", "map_value", "free_scratch", "launch_with_maps", "MapSpecs",
           "TMAP_TYPE"]

# the parameter's C type (kernel.py declares it in the prelude of a kernel that takes one)
TMAP_TYPE = "loopir_tmap"
_CACHE: OrderedDict[tuple, Any] = OrderedDict()
_LOCK = threading.Lock()
_KEEP = 64


def view_extents(extents: list[int] | tuple[int, ...]) -> tuple[int, int]:
    """The (rows, cols) of the 2-d row-major view of a tensor of these extents (rank >= 2): its leading extents
    multiplied into rows (an activation (B, T, C) is a (B*T) x C matrix: schedules.primitives.wgmma.a_view)."""
    if len(extents) < 2:
        raise RuntimeLaunchError(f"a TMA tensor map needs a tensor of rank 2 or more, got extents {tuple(extents)}")
    rows = 1
    for e in extents[:-1]:
        rows *= int(e)
    return rows, int(extents[-1])


def map_extents(extents: list[int] | tuple[int, ...], rank: int) -> tuple[int, ...]:
    """The extents (innermost first) of a tensor of these extents (outermost first) seen as a map of `rank` 2
    (its 2-d view: `view_extents`) or 3 (the product of its leading extents, then its last two)."""
    rows, cols = view_extents(extents)
    if rank == 2:
        return cols, rows
    if rank != 3 or len(extents) < 3:
        raise RuntimeLaunchError(f"a TMA tensor map of rank {rank} of a tensor of extents {tuple(extents)}")
    outer = 1
    for e in extents[:-2]:
        outer *= int(e)
    return cols, int(extents[-2]), outer


def _encode(cu: Any, ptr: int, dtype: str, extents: tuple[int, ...], itemsize: int, box: tuple[int, ...]) -> Any:
    kinds = {"float16": cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
             "bfloat16": cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16}
    u64, u32 = cu.cuuint64_t, cu.cuuint32_t
    strides, step = [], itemsize
    for e in extents[:-1]:
        step *= e
        strides.append(u64(step))
    err, tm = cu.cuTensorMapEncodeTiled(
        kinds[dtype], len(extents), ptr, [u64(e) for e in extents], strides, [u32(b) for b in box],
        [u32(1)] * len(extents), cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B, cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeLaunchError(f"cuTensorMapEncodeTiled failed ({err}) for a {dtype} tensor of extents {extents} "
                                 f"(innermost first) at {ptr:#x}, box {box}: TMA needs a 16-byte aligned address and "
                                 "strides")
    raw = ctypes.create_string_buffer(128 + 64)
    buf = (ctypes.c_uint64 * 16).from_address((ctypes.addressof(raw) + 63) & ~63)
    ctypes.memmove(buf, tm.getPtr(), 128)
    return raw, buf


def tensor_map(cu: Any, ptr: int, dtype: str, extents: tuple[int, ...], itemsize: int, box: tuple[int, ...]) -> Any:
    """The aligned ctypes buffer holding the tensor map of a tensor of `extents` (innermost first) at `ptr` (made
    or reused)."""
    key = (ptr, dtype, extents, box)
    with _LOCK:
        hit = _CACHE.get(key)
        if hit is not None:
            _CACHE.move_to_end(key)
            return hit[1]
    made = _encode(cu, ptr, dtype, extents, itemsize, box)
    with _LOCK:
        _CACHE[key] = made
        while len(_CACHE) > _KEEP:
            _CACHE.popitem(last=False)
    return made[1]


class MapSpecs(tuple):
    """The recorded "types" of a launch with tensor maps: per parameter, the map's (dtype, extents, itemsize, box,
    written) or None (a pointer or an integer, as recorded)."""


def map_value(cu: Any, ptr: int, dtype: str, extents: tuple[int, ...], itemsize: int, box: tuple[int, ...],
              written: bool, stream: Any, scratch: list[Any]) -> Any:
    """The map of a tensor at `ptr`. TMA reads and writes 16-byte aligned addresses only: a tensor that starts
    elsewhere (a view at an odd offset) is first copied to an aligned scratch buffer on `stream` (stream-ordered;
    appended to `scratch`, which the caller frees on the stream after the launch: `free_scratch`), and one the
    kernel writes is copied back to `ptr` then."""
    nbytes = itemsize
    for e in extents:
        nbytes *= e
    if ptr % 16 and nbytes:
        err, tmp = cu.cuMemAllocAsync(nbytes, stream)
        if err != cu.CUresult.CUDA_SUCCESS:
            raise RuntimeLaunchError(f"cuMemAllocAsync({nbytes}) for an aligned copy of a tensor failed ({err})")
        scratch.append((tmp, ptr if written else None, nbytes))
        (err,) = cu.cuMemcpyDtoDAsync(tmp, ptr, nbytes, stream)
        if err != cu.CUresult.CUDA_SUCCESS:
            raise RuntimeLaunchError(f"cuMemcpyDtoDAsync of a tensor to its aligned copy failed ({err})")
        ptr = int(tmp)
    return tensor_map(cu, ptr, dtype, extents, itemsize, box)


def free_scratch(cu: Any, scratch: list[Any], stream: Any) -> None:
    """After the launch, on its stream: the aligned copies of written tensors back to them, then every copy freed."""
    for tmp, back, nbytes in scratch:
        if back is not None:
            (err,) = cu.cuMemcpyDtoDAsync(back, tmp, nbytes, stream)
            if err != cu.CUresult.CUDA_SUCCESS:
                raise RuntimeLaunchError(f"cuMemcpyDtoDAsync of an aligned copy back to its tensor failed ({err})")
        cu.cuMemFreeAsync(tmp, stream)


def launch_with_maps(cu: Any, fn: Any, dims: tuple[int, ...], smem: int, stream: Any,
                     values: list[Any]) -> Any:
    """cuLaunchKernel with a parameter array of addresses (a tensor map is passed by value: the driver copies
    the 128 bytes at its address). `values`: ctypes objects in parameter order."""
    params = (ctypes.c_void_p * len(values))(*(ctypes.addressof(v) for v in values))
    return cu.cuLaunchKernel(fn, *dims, smem, stream, ctypes.addressof(params), 0)
