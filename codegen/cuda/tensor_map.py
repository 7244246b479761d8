"""TMA tensor maps (CUtensorMap) of kernel arguments, made on the host per call (codegen.cuda.wgmma's loads).

A kernel parameter `const __grid_constant__ loopir_tmap X` is the 128 opaque bytes the driver's
`cuTensorMapEncodeTiled` writes for a 2-d row-major tensor (one of higher rank as its 2-d view: `view_extents`): its
address, its extents and row stride (evaluated at the call's sizes), a box of `box` elements (inner, outer) and the
128-byte swizzle that the wgmma descriptors read.
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

__all__ = ["tensor_map", "view_extents", "map_value", "free_scratch", "launch_with_maps", "MapSpecs", "TMAP_TYPE"]

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


def _encode(cu: Any, ptr: int, dtype: str, rows: int, cols: int, itemsize: int, box: tuple[int, int]) -> Any:
    kinds = {"float16": cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
             "bfloat16": cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16}
    u64, u32 = cu.cuuint64_t, cu.cuuint32_t
    err, tm = cu.cuTensorMapEncodeTiled(
        kinds[dtype], 2, ptr, [u64(cols), u64(rows)], [u64(cols * itemsize)], [u32(box[0]), u32(box[1])],
        [u32(1), u32(1)], cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B, cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeLaunchError(f"cuTensorMapEncodeTiled failed ({err}) for a {rows} x {cols} {dtype} tensor at "
                                 f"{ptr:#x}, box {box}: TMA needs a 16-byte aligned address and row stride")
    raw = ctypes.create_string_buffer(128 + 64)
    buf = (ctypes.c_uint64 * 16).from_address((ctypes.addressof(raw) + 63) & ~63)
    ctypes.memmove(buf, tm.getPtr(), 128)
    return raw, buf


def tensor_map(cu: Any, ptr: int, dtype: str, rows: int, cols: int, itemsize: int, box: tuple[int, int]) -> Any:
    """The aligned ctypes buffer holding the tensor map of a `rows` x `cols` tensor at `ptr` (made or reused)."""
    key = (ptr, dtype, rows, cols, box)
    with _LOCK:
        hit = _CACHE.get(key)
        if hit is not None:
            _CACHE.move_to_end(key)
            return hit[1]
    made = _encode(cu, ptr, dtype, rows, cols, itemsize, box)
    with _LOCK:
        _CACHE[key] = made
        while len(_CACHE) > _KEEP:
            _CACHE.popitem(last=False)
    return made[1]


class MapSpecs(tuple):
    """The recorded "types" of a launch with tensor maps: per parameter, the map's (dtype, rows, cols, itemsize,
    box) or None (a pointer or an integer, as recorded)."""


def map_value(cu: Any, ptr: int, dtype: str, rows: int, cols: int, itemsize: int, box: tuple[int, int],
              stream: Any, scratch: list[Any]) -> Any:
    """The map of an operand at `ptr`. TMA reads from 16-byte aligned addresses only: an operand that starts
    elsewhere (a view at an odd offset) is first copied to an aligned scratch buffer on `stream` (stream-ordered;
    appended to `scratch`, which the caller frees on the stream after the launch)."""
    if ptr % 16 and rows * cols:
        nbytes = rows * cols * itemsize
        err, tmp = cu.cuMemAllocAsync(nbytes, stream)
        if err != cu.CUresult.CUDA_SUCCESS:
            raise RuntimeLaunchError(f"cuMemAllocAsync({nbytes}) for an aligned copy of an operand failed ({err})")
        scratch.append(tmp)
        (err,) = cu.cuMemcpyDtoDAsync(tmp, ptr, nbytes, stream)
        if err != cu.CUresult.CUDA_SUCCESS:
            raise RuntimeLaunchError(f"cuMemcpyDtoDAsync of an operand to its aligned copy failed ({err})")
        ptr = int(tmp)
    return tensor_map(cu, ptr, dtype, rows, cols, itemsize, box)


def free_scratch(cu: Any, scratch: list[Any], stream: Any) -> None:
    for tmp in scratch:
        cu.cuMemFreeAsync(tmp, stream)


def launch_with_maps(cu: Any, fn: Any, dims: tuple[int, ...], smem: int, stream: Any,
                     values: list[Any]) -> Any:
    """cuLaunchKernel with a parameter array of addresses (a tensor map is passed by value: the driver copies
    the 128 bytes at its address). `values`: ctypes objects in parameter order."""
    params = (ctypes.c_void_p * len(values))(*(ctypes.addressof(v) for v in values))
    return cu.cuLaunchKernel(fn, *dims, smem, stream, ctypes.addressof(params), 0)
