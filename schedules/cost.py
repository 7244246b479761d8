"""A roofline cost model: what a kernel costs is its DRAM bytes over the bandwidth or its FLOPs
over the peak, whichever is larger, plus a fixed launch overhead.

    time(kernel) = max(bytes / bandwidth, flops / peak) + launch_overhead

Device figures come from the device when one is present (`cuda.bindings.driver` attributes);
without one (CI, a laptop) they are the H200 figures measured for this project (4.25 TB/s copy
bandwidth, 132 SMs, 227 KB opt-in shared memory per block) or modest CPU defaults. Symbolic sizes
are evaluated at given values or at `DEFAULT_SIZE`, and every figure says where it came from so
that a plan's decisions can be explained.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field

import numpy as np

from loopir.dtypes import np_dtype
from loopir.errors import ArgumentError
from loopir.nodes import Binary, Call, Cast, Compare, Const, Expr, Load, Logical, Select, Unary, Var
from loopir.visit import walk

DEFAULT_SIZE = 4096  # a representative value for a symbolic size when none is given


@dataclass(frozen=True)
class Device:
    """What the cost model knows about one target device."""

    name: str
    target: str  # "cuda" | "cpu"
    bandwidth: float  # DRAM bytes per second (read + write together)
    peak_flops: float  # float32 operations per second
    launch_overhead: float  # seconds per kernel launch
    sm_count: int = 1
    smem_per_block: int = 0  # bytes of static shared memory one block may declare
    smem_per_block_optin: int = 0  # bytes with the dynamic opt-in
    regs_per_block: int = 0
    regs_per_thread: int = 0
    max_threads_per_block: int = 1
    source: str = "defaults"  # where the figures came from
    tensor_flops: float = 0.0  # float16 / bfloat16 tensor-core operations per second (0: none, peak_flops applies)

    @property
    def matmul_flops(self) -> float:
        """The peak a half-precision GEMM on tensor cores is costed at."""
        return self.tensor_flops or self.peak_flops

    def describe(self) -> str:
        bw = f"{self.bandwidth / 1e12:.2f} TB/s" if self.bandwidth >= 1e12 else f"{self.bandwidth / 1e9:.0f} GB/s"
        fl = (f"{self.peak_flops / 1e12:.1f} TFLOP/s" if self.peak_flops >= 1e12
              else f"{self.peak_flops / 1e9:.0f} GFLOP/s")
        s = f"{self.name} ({self.target}, {self.source}): {bw}, {fl}, launch {self.launch_overhead * 1e6:.1f} us"
        if self.target == "cuda":
            s += (
                f", {self.sm_count} SMs, shared memory {self.smem_per_block // 1024} KB static / "
                f"{self.smem_per_block_optin // 1024} KB opt-in per block, {self.regs_per_block} registers per block"
            )
        return s


H200 = Device(
    name="NVIDIA H200 (defaults)",
    target="cuda",
    bandwidth=4.25e12,  # measured device-to-device copy bandwidth (shared/notes/STACK.md)
    peak_flops=60e12,  # float32 without tensor cores, about 51 TFLOP/s reached by cuBLAS
    launch_overhead=5e-6,  # one cuLaunchKernel from Python
    sm_count=132,
    smem_per_block=48 * 1024,
    smem_per_block_optin=227 * 1024,
    regs_per_block=65536,
    regs_per_thread=255,
    max_threads_per_block=1024,
    source="defaults: no CUDA device present",
    tensor_flops=989e12,  # the dense float16 / bfloat16 tensor-core peak of the H200 spec sheet (a roofline bound)
)

CPU = Device(
    name="host CPU (defaults)",
    target="cpu",
    bandwidth=20e9,
    peak_flops=16e9 * max(1, os.cpu_count() or 1),
    launch_overhead=2e-6,  # a ctypes call plus the thread pool's start
    sm_count=max(1, os.cpu_count() or 1),
    max_threads_per_block=1,
    source="defaults",
)


@functools.cache
def device_info(target: str = "cuda") -> Device:
    """The figures for `target` ("cuda" or "cpu"), read from the device when there is one."""
    if target == "cpu":
        return CPU
    if target != "cuda":
        raise ArgumentError(f"unknown target {target!r} for the cost model; expected 'cuda' or 'cpu'")
    try:
        return _query_cuda()
    except Exception:  # no driver, no device, an old cuda-python: the defaults hold
        return H200


def _query_cuda() -> Device:
    from cuda.bindings import driver as drv

    def ok(res):  # cuda.bindings returns (err, *outputs) and never raises
        err, *out = res if isinstance(res, tuple) else (res,)
        if err != drv.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"CUDA driver call failed: {err}")
        return out[0] if len(out) == 1 else out

    ok(drv.cuInit(0))
    dev = ok(drv.cuDeviceGet(0))
    name_raw = ok(drv.cuDeviceGetName(64, dev))
    name = name_raw.split(b"\0")[0].decode() if isinstance(name_raw, bytes) else str(name_raw)
    A = drv.CUdevice_attribute

    def attr(key: str, default: int) -> int:
        try:
            return int(ok(drv.cuDeviceGetAttribute(getattr(A, key), dev)))
        except Exception:
            return default

    sms = attr("CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT", H200.sm_count)
    clock_khz = attr("CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE", 0)
    bus_bits = attr("CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH", 0)
    if "H200" in name:
        bandwidth = H200.bandwidth  # measured on this very part; beats the spec-sheet estimate
    elif clock_khz and bus_bits:
        bandwidth = 0.85 * 2 * clock_khz * 1e3 * bus_bits / 8  # double data rate, ~85% reachable
    else:
        bandwidth = H200.bandwidth
    return Device(
        name=name,
        target="cuda",
        bandwidth=bandwidth,
        peak_flops=H200.peak_flops * sms / H200.sm_count,
        tensor_flops=H200.tensor_flops * sms / H200.sm_count,
        launch_overhead=H200.launch_overhead,
        sm_count=sms,
        smem_per_block=attr("CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK", H200.smem_per_block),
        smem_per_block_optin=attr("CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN", H200.smem_per_block_optin),
        regs_per_block=attr("CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK", H200.regs_per_block),
        regs_per_thread=H200.regs_per_thread,
        max_threads_per_block=attr("CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK", H200.max_threads_per_block),
        source="queried from the device",
    )


# ----------------------------------------------------------------------------- sizes


def size_value(e: Expr | int, sizes: dict | None = None) -> int:
    """The integer value of a shape expression. `sizes` maps size Vars (or their names) to ints;
    a size not given takes DEFAULT_SIZE."""
    sizes = sizes or {}
    if isinstance(e, (int, np.integer)):
        return int(e)
    if isinstance(e, Const):
        return int(e.value)
    if isinstance(e, Var):
        if e in sizes:
            return int(sizes[e])
        if e.name in sizes:
            return int(sizes[e.name])
        return DEFAULT_SIZE
    if isinstance(e, Cast):
        return size_value(e.a, sizes)
    if isinstance(e, Binary):
        a, b = size_value(e.a, sizes), size_value(e.b, sizes)
        ops = {
            "add": lambda: a + b,
            "sub": lambda: a - b,
            "mul": lambda: a * b,
            "floordiv": lambda: a // b if b else 0,
            "mod": lambda: a % b if b else 0,
            "max": lambda: max(a, b),
            "min": lambda: min(a, b),
            "div": lambda: a // b if b else 0,
        }
        return int(ops[e.op]())
    raise ArgumentError(f"cannot evaluate the size expression {e} for the cost model")


def elements(shape: tuple, sizes: dict | None = None) -> int:
    n = 1
    for d in shape:
        n *= max(0, size_value(d, sizes))
    return n


def itemsize(dtype: str) -> int:
    return 1 if dtype == "bool" else int(np_dtype(dtype).itemsize)


def buffer_bytes(shape: tuple, dtype: str, sizes: dict | None = None) -> int:
    return elements(shape, sizes) * itemsize(dtype)


def fmt_bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def fmt_time(t: float) -> str:
    if t >= 1e-3:
        return f"{t * 1e3:.3f} ms"
    return f"{t * 1e6:.1f} us"


# ----------------------------------------------------------------------------- FLOPs

# Transcendentals cost several instructions; the weights only need to be roughly right.
CALL_FLOPS = {"exp": 4, "log": 4, "sqrt": 2, "rsqrt": 2, "sin": 6, "cos": 6, "tanh": 6, "sigmoid": 6, "erf": 8,
              "abs": 1}


def expr_flops(e: Expr) -> int:
    """Arithmetic operations in one evaluation of `e` (index arithmetic inside loads excluded)."""
    total = 0
    skip: set[int] = set()
    for n in walk(e):
        if id(n) in skip:
            continue
        if isinstance(n, Load):
            for ix in n.indices:  # address arithmetic is not floating-point work
                skip.update(id(x) for x in walk(ix))
        elif isinstance(n, (Binary, Unary, Compare, Logical, Select)):
            total += 1
        elif isinstance(n, Call):
            total += CALL_FLOPS.get(n.fn, 1)
    return total


# ----------------------------------------------------------------------------- roofline


@dataclass
class KernelCost:
    """Predicted cost of one kernel."""

    bytes_read: int = 0
    bytes_written: int = 0
    flops: int = 0
    tensor_flops: int = 0  # the flops of a half-precision GEMM on tensor cores (costed at device.matmul_flops)
    launches: int = 1
    reads: dict[str, int] = field(default_factory=dict)  # buffer name -> bytes
    writes: dict[str, int] = field(default_factory=dict)

    @property
    def bytes(self) -> int:
        return self.bytes_read + self.bytes_written

    def time(self, device: Device) -> float:
        return roofline(self.bytes, self.flops, device, self.launches, self.tensor_flops)

    def bound(self, device: Device) -> str:
        compute = self.flops / device.peak_flops + self.tensor_flops / device.matmul_flops
        return "memory" if self.bytes / device.bandwidth >= compute else "compute"

    def add_read(self, name: str, nbytes: int) -> None:
        if name not in self.reads:
            self.reads[name] = nbytes
            self.bytes_read += nbytes

    def add_write(self, name: str, nbytes: int) -> None:
        if name not in self.writes:
            self.writes[name] = nbytes
            self.bytes_written += nbytes


def roofline(nbytes: float, flops: float, device: Device, launches: int = 1, tensor_flops: float = 0) -> float:
    """Seconds for `launches` kernels moving `nbytes` and computing `flops` (and `tensor_flops` on tensor cores)."""
    compute = flops / device.peak_flops + tensor_flops / device.matmul_flops
    return max(nbytes / device.bandwidth, compute) + launches * device.launch_overhead


__all__ = [
    "DEFAULT_SIZE",
    "Device",
    "H200",
    "CPU",
    "device_info",
    "size_value",
    "elements",
    "itemsize",
    "buffer_bytes",
    "expr_flops",
    "KernelCost",
    "roofline",
    "fmt_bytes",
    "fmt_time",
]
