"""A recorded launch's kernel parameters, laid out once as the driver reads them (the call path's fast path,
codegen.cuda.runtime)."""

from __future__ import annotations

import ctypes
from typing import Any

SLOT_MASK = {ctypes.c_void_p: 2**64 - 1, ctypes.c_longlong: 2**64 - 1, ctypes.c_int: 2**32 - 1}


class ParamBlock:
    """A launch's kernel parameters laid out once as the driver reads them (`void **kernelParams`: one 8-byte slot
    per parameter, little-endian, and the array of the slots' addresses), so that a repeated call writes only its
    pointers into their slots and hands the driver the address array (a buffer: cuda-python's cheap path). The
    (values, types) tuples cuda-python packs anew on every launch took about 1.4 us of host time for six pointers
    (cuda.bindings 13, `_HelperKernelParams`); the driver copies the parameters at the launch, so the slots may
    be rewritten right after it. One block per plan, and a plan per thread (`CudaModule._plans`)."""

    __slots__ = ("slots", "params")

    def __init__(self, values: tuple[Any, ...], types: tuple[Any, ...]) -> None:
        n = max(1, len(values))
        self.slots = (ctypes.c_uint64 * n)()
        for j, (v, t) in enumerate(zip(values, types)):
            self.slots[j] = int(v) & SLOT_MASK[t]
        base = ctypes.addressof(self.slots)
        self.params = (ctypes.c_void_p * n)(*(base + 8 * j for j in range(n)))
