"""Per-call CPU (Python) time of `mod(*arrays)`: the full checking path and the cached fast path.

    python benchmarks/call_overhead.py              # table; CUDA with a stubbed driver when no GPU
    python benchmarks/call_overhead.py --profile    # also cProfile of 10^4 calls of each row

Rows: softmax over rows (reduction + elementwise) and an elementwise chain, each built with fixed sizes
and with te.var sizes (call-time specialization), for target cuda, cpu (all CPUs) and cpu1 (threads=1).
Columns: microseconds per call (the fastest of 5 rounds of N calls), full path (`mod.fast_path = False`) and
fast path (the default). CUDA without a GPU: `cuLaunchKernel` and every other driver call are no-ops
returning success (a `StubDriver`) and device arrays are `FakeDeviceArray`s (`__cuda_array_interface__`),
so the numbers are the Python overhead alone. With a GPU the driver is real and torch tensors are used
if torch imports (then also CUDA-event time of one call and of an empty torch op).
"""

from __future__ import annotations

import argparse
import cProfile
import ctypes
import itertools
import os
import pstats
import sys
import time
import types
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a plain checkout

from codegen import build, gpu_available  # noqa: E402
from codegen.cuda import runtime as rt  # noqa: E402
from loopir import te  # noqa: E402


class FakeDeviceArray:
    """A device array as far as the runtime can tell: `__cuda_array_interface__` over a made-up pointer."""

    _next = itertools.count(0x7F0000000000, 1 << 32)

    def __init__(self, shape: tuple[int, ...], dtype: Any = np.float32, strides: tuple[int, ...] | None = None,
                 readonly: bool = False, ptr: int | None = None) -> None:
        self.shape, self.dtype, self.strides, self.readonly = tuple(shape), np.dtype(dtype), strides, readonly
        self.ptr = next(self._next) if ptr is None else ptr

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"shape": self.shape, "typestr": self.dtype.str, "strides": self.strides,
                "data": (self.ptr, self.readonly), "version": 3, "stream": None}


class StubDriver(types.SimpleNamespace):
    """cuda.bindings.driver with every call a no-op returning success; records launches when `record`."""

    def __init__(self, ordinal_of: dict[int, int] | None = None, record: bool = False) -> None:
        ok = (0,)
        alloc = itertools.count(0x10000, 0x10000)
        self.launches: list[tuple] = []
        self.ordinal_of = ordinal_of if ordinal_of is not None else {}
        ns = types.SimpleNamespace
        super().__init__(
            CUresult=ns(CUDA_SUCCESS=0), CUstream=lambda h=0: h,
            CUdevice_attribute=ns(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR=1,
                                  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR=2,
                                  CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN=3),
            CUpointer_attribute=ns(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL=4),
            CUfunction_attribute=ns(CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES=5,
                                    CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES=6),
            cuInit=lambda flags: ok, cuDeviceGetCount=lambda: (0, 2), cuDeviceGet=lambda i: (0, i),
            cuDeviceGetAttribute=lambda a, d: (0, {1: 9, 2: 0, 3: 227 * 1024}[a]),
            cuDevicePrimaryCtxRetain=lambda d: (0, ("ctx", d)), cuCtxSetCurrent=lambda c: ok,
            cuModuleLoadData=lambda cubin: (0, "module"), cuModuleGetFunction=lambda m, name: (0, name.decode()),
            cuMemAlloc=lambda n: (0, next(alloc)), cuMemFree=lambda p: ok, cuModuleUnload=lambda m: ok,
            cuMemcpyHtoDAsync=lambda *a: ok, cuMemcpyDtoHAsync=lambda *a: ok, cuStreamSynchronize=lambda s: ok,
            cuPointerGetAttribute=lambda attr, ptr: (0, self.ordinal_of.get(ptr, 0)),
            cuFuncGetAttribute=lambda attr, fn: (0, 0), cuFuncSetAttribute=lambda fn, attr, v: ok,
            cuGetErrorName=lambda e: (0, b"STUB"), cuGetErrorString=lambda e: (0, b"stub"),
        )
        self.cuLaunchKernel = self._launch if record else (lambda *a: ok)

    def _launch(self, fn, gx, gy, gz, bx, by, bz, smem, stream, args, extra):  # noqa: ANN001
        self.launches.append((fn, (gx, gy, gz), (bx, by, bz), smem, stream, launch_values(args)))
        return (0,)


def launch_values(args: Any) -> tuple[int, ...]:
    """The parameter values of a launch as integers, from either form the runtime passes: (values, types) tuples,
    or an array of the addresses of 8-byte slots (a recorded plan's `ParamBlock`; a 4-byte int reads as its slot's
    64 bits, the upper half zero)."""
    if isinstance(args, tuple):
        return tuple(int(v.value if hasattr(v, "value") else v) for v in args[0])
    return tuple(ctypes.c_uint64.from_address(p).value for p in args)


def install_stub(drv: StubDriver) -> None:
    """Make the CUDA runtime use `drv` (process-wide; for this script and the tests without a GPU)."""
    rt._driver = lambda: drv  # type: ignore[assignment]
    rt._INIT.clear()
    rt._DEVICES.clear()


def softmax(n: Any, m: Any) -> tuple[Any, Any]:
    x = te.placeholder((n, m), "float32", name="x")
    k = te.reduce_axis(m, name="k")
    mx = te.compute((n,), lambda i: te.max(x[i, k], axis=k), name="mx")
    k2 = te.reduce_axis(m, name="k2")
    e = te.compute((n, m), lambda i, j: te.exp(x[i, j] - mx[i]), name="e")
    s = te.compute((n,), lambda i: te.sum(e[i, k2], axis=k2), name="s")
    y = te.compute((n, m), lambda i, j: e[i, j] / s[i], name="y")
    return x, y


def chain(n: Any, m: Any) -> tuple[Any, Any]:
    x = te.placeholder((n, m), "float32", name="x")
    a = te.compute((n, m), lambda i, j: x[i, j] * 2.0 + 1.0, name="a")
    y = te.compute((n, m), lambda i, j: te.tanh(a[i, j]), name="y")
    return x, y


def per_call_us(f: Any, calls: int, rounds: int = 5) -> float:
    f()
    ts = []
    for _ in range(rounds):
        t = time.perf_counter_ns()
        for _ in range(calls):
            f()
        ts.append((time.perf_counter_ns() - t) / calls / 1e3)
    return min(ts)  # the least disturbed round: this is the machine's overhead, not its neighbours'


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=10_000)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--targets", default="cuda,cpu")
    ap.add_argument("--cuda-shape", default="64x1000")
    ap.add_argument("--cpu-shape", default="8x128", help="small: the kernel's own time stays below the overhead")
    a = ap.parse_args()
    real = gpu_available()
    if not real:
        install_stub(StubDriver())
    torch = None
    if real:
        try:
            import torch  # noqa: F811
        except ImportError:
            torch = None
    print(f"# CUDA driver: {'real' if real else 'stubbed'}; arrays {a.cuda_shape} (cuda), {a.cpu_shape} (cpu) "
          f"float32; {a.calls} calls (cuda), {a.calls // 10} (cpu) x 5 rounds")
    print(f"{'target':6} {'program':8} {'sizes':8} {'full us':>9} {'fast us':>9}")
    targets = [t for t in a.targets.split(",") for t in ((t, "cpu1") if t == "cpu" else (t,))]
    for label in targets:
        target, opts = ("cpu", {"threads": 1}) if label == "cpu1" else (label, {})
        n0, m0 = (int(d) for d in (a.cuda_shape if target == "cuda" else a.cpu_shape).split("x"))
        for name, fn in (("softmax", softmax), ("chain", chain)):
            for sym in (False, True):
                n, m = (te.var("n"), te.var("m")) if sym else (n0, m0)
                x, y = fn(n, m)
                mod = build([y], [x, y], target=target, **opts)
                xs = np.random.default_rng(0).standard_normal((n0, m0)).astype(np.float32)
                if target == "cuda" and torch is not None:
                    args = (torch.from_numpy(xs).cuda(), torch.empty((n0, m0), device="cuda"))
                elif target == "cuda" and not real:
                    args = (FakeDeviceArray((n0, m0)), FakeDeviceArray((n0, m0)))
                else:
                    args = (xs, np.empty_like(xs))
                row = []
                for fast in (False, True):
                    mod.fast_path = fast
                    calls = a.calls if target == "cuda" and not real else max(a.calls // 10, 100)
                    row.append(per_call_us(lambda mod=mod, args=args: mod(*args), calls))
                    if a.profile:
                        pr = cProfile.Profile()
                        pr.enable()
                        for _ in range(calls):
                            mod(*args)
                        pr.disable()
                        print(f"--- profile {target} {name} {'symbolic' if sym else 'fixed'} "
                              f"{'fast' if fast else 'full'}")
                        pstats.Stats(pr).sort_stats("tottime").print_stats(14)
                print(f"{label:6} {name:8} {'symbolic' if sym else 'fixed':8} {row[0]:9.2f} {row[1]:9.2f}")


if __name__ == "__main__":
    main()
