"""Loading and launching generated kernels through `cuda.bindings.driver`.

* Every driver call's returned error is checked and raised as `CudaError` naming the call.
* The primary context of the device is used (the one PyTorch and CuPy use), so device pointers
  are shared with them.
* Arguments: numpy arrays are copied to the device and the written ones copied back; device
  arrays (PyTorch tensors, CuPy arrays, anything with `__cuda_array_interface__` or a CUDA DLPack
  capsule) are used in place (zero copy) and the kernels run on the caller's current stream
  (PyTorch's / CuPy's current stream, the CAI producer stream, else the legacy default stream).
  bfloat16 data is its bits: numpy uint16 arrays (`loopir.dtypes.to_bfloat16`), torch.bfloat16 tensors
  (taken as their bits, zero copy on the device) and DLPack / CAI arrays whose dtype is named bfloat16.
* A host loop (`codegen.passes.kernels`) is a Python loop of launches on that one stream: the stream
  runs them in order, so each iteration's kernels start after the previous iteration's have finished.
* No GPU (no libcuda, no device): a `NoGpuError` (a RuntimeError) at the first call, never a crash.
"""

from __future__ import annotations

import ctypes
import statistics
import sys
import threading
import dataclasses
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import numpy as np

from loopir.affine import eval_index
from loopir.args import bind_shapes, eval_expr, size_of
from loopir.dtypes import np_dtype
from loopir.errors import (ArgumentError, ArgumentTypeError, CudaCodegenError, NotFoundError, ResourceLimitError,
                           RuntimeLaunchError)
from loopir.nodes import Buffer, Var

from .kernel import CudaSource, HostIf, HostLoop, HostStep, Kernel, Launch
from ..module import Module, known_sizes
from .nvrtc import compile_cubin
from .params import ParamBlock
from .tensor_map import MapSpecs, free_scratch, launch_with_maps, map_extents, map_value


class CudaError(RuntimeLaunchError):
    """A CUDA driver call failed; the message names the call."""


class NoGpuError(RuntimeLaunchError):
    """No usable CUDA GPU (driver library missing or no device)."""


class SharedMemoryError(RuntimeLaunchError):
    """A launch needs more shared memory per block than the device has; the message names the kernel."""


STATIC_SHARED = 48 * 1024  # dynamic shared bytes a launch may ask for without the opt-in attribute


def dynamic_shared_bytes(k: Kernel, sizes: dict[Var, int]) -> int:
    """The bytes of dynamic shared memory a launch of `k` asks for at `sizes` (0 for none)."""
    try:
        return int(eval_index(k.dynamic_shared, sizes))
    except (ValueError, TypeError, KeyError, ZeroDivisionError) as err:
        raise CudaCodegenError(f"cannot evaluate the dynamic shared memory of kernel {k.name!r} "
                               f"({k.dynamic_shared}) on the host: {err}") from err


@cache
def _driver():
    try:
        from cuda.bindings import driver
    except Exception as e:  # noqa: BLE001 - any import failure means: no usable CUDA
        raise NoGpuError(f"no CUDA GPU available: cannot import cuda.bindings.driver ({e})") from e
    return driver


def check(ret: Any, call: str) -> Any:
    """Unpack `(err, *values)` of a cuda.bindings call; raise CudaError naming `call` on failure."""
    cu = _driver()
    err, *vals = ret if isinstance(ret, tuple) else (ret,)
    if err != cu.CUresult.CUDA_SUCCESS:
        _, name = cu.cuGetErrorName(err)
        _, msg = cu.cuGetErrorString(err)
        name = name.decode() if isinstance(name, bytes) else str(err)
        msg = msg.decode() if isinstance(msg, bytes) else ""
        raise CudaError(f"{call} failed: {name} ({int(err)}): {msg}")
    return vals[0] if len(vals) == 1 else (tuple(vals) or None)


_INIT: dict[str, Any] = {}


def _init() -> None:
    if _INIT.get("ok"):
        return
    cu = _driver()
    try:
        ret = cu.cuInit(0)
    except Exception as e:  # noqa: BLE001 - libcuda missing raises from the loader
        raise NoGpuError("no CUDA GPU available: the CUDA driver library cannot be loaded "
                         f"({type(e).__name__}: {e})") from e
    if ret[0] != cu.CUresult.CUDA_SUCCESS:
        raise NoGpuError(f"no CUDA GPU available: cuInit failed with {ret[0]!r}")
    n = check(cu.cuDeviceGetCount(), "cuDeviceGetCount")
    if n == 0:
        raise NoGpuError("no CUDA GPU available: cuDeviceGetCount reports 0 devices")
    _INIT.update(ok=True, count=n)


def gpu_available() -> bool:
    try:
        _init()
        return True
    except Exception:  # noqa: BLE001
        return False


@dataclass
class Device:
    ordinal: int
    handle: Any
    ctx: Any
    arch: str


_DEVICES: dict[int, Device] = {}


def device(ordinal: int = 0) -> Device:
    """The device with its primary context made current."""
    _init()
    cu = _driver()
    if ordinal not in _DEVICES:
        if not 0 <= ordinal < _INIT["count"]:
            raise NotFoundError(f"CUDA device {ordinal} does not exist ({_INIT['count']} device(s))")
        dev = check(cu.cuDeviceGet(ordinal), "cuDeviceGet")
        attr = cu.CUdevice_attribute
        get = cu.cuDeviceGetAttribute
        major = check(get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev), "cuDeviceGetAttribute")
        minor = check(get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev), "cuDeviceGetAttribute")
        ctx = check(cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
        _DEVICES[ordinal] = Device(ordinal, dev, ctx, f"sm_{major}{minor}")
    d = _DEVICES[ordinal]
    check(cu.cuCtxSetCurrent(d.ctx), "cuCtxSetCurrent")
    return d


def default_arch() -> str:
    """sm_XX of device 0 when a GPU is present, else sm_90."""
    import os

    if not (os.path.exists("/proc/driver/nvidia") or os.path.exists("/dev/nvidia0") or os.path.exists("/dev/dxg")):
        return "sm_90"  # no NVIDIA driver here: skip importing the driver bindings (~60 ms)
    try:
        return device(0).arch
    except Exception:  # noqa: BLE001 - no GPU: compile for the H100/H200 generation
        return "sm_90"


# ----------------------------------------------------------------------------- arguments


@dataclass
class _Arg:
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    host: np.ndarray | None = None  # numpy: copied in and out
    ptr: int = 0
    device: int | None = None
    stream: int | None = None
    bf16: bool = False  # bfloat16 data taken as its uint16 bits: only a bfloat16 buffer takes it, not a uint16 one


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    out, acc = [], itemsize
    for d in reversed(shape):
        out.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(out))


def _contiguous(shape: tuple[int, ...], strides: tuple[int, ...] | None, itemsize: int) -> bool:
    if strides is None:
        return True
    return all(d <= 1 or s == c for d, s, c in zip(shape, strides, _c_strides(shape, itemsize)))


def _pointer_device(ptr: int) -> int | None:
    cu = _driver()
    if ptr == 0:
        return None
    try:
        return int(check(cu.cuPointerGetAttribute(cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr),
                         "cuPointerGetAttribute"))
    except CudaError:
        return None


def _bits_if_bfloat16(dt: np.dtype) -> np.dtype:
    """A bfloat16 array type from another library (ml_dtypes' `bfloat16`) is its bits: uint16, as loopir takes it."""
    got = _BITS.get(dt)
    if got is None:  # numpy computes dtype.name in Python: remember the answer per dtype
        if len(_BITS) > 256:
            _BITS.clear()
        got = _BITS[dt] = np.dtype(np.uint16) if dt.name == "bfloat16" and dt.itemsize == 2 else dt
    return got


_BITS: dict[np.dtype, np.dtype] = {}


def classify(obj: Any, name: str) -> _Arg:
    """Describe one argument: a numpy array (host) or a device array (zero copy)."""
    if isinstance(obj, np.ndarray):
        return _Arg(name, tuple(obj.shape), obj.dtype, host=obj)
    mod = type(obj).__module__ or ""
    if mod.startswith("torch") and hasattr(obj, "is_cuda"):
        bf16 = str(obj.dtype) == "torch.bfloat16"  # numpy has no bfloat16: its bits as uint16 (loopir.dtypes)
        if not obj.is_cuda:
            if bf16:
                import torch

                return dataclasses.replace(classify(obj.detach().view(torch.int16).numpy().view(np.uint16), name),
                                           bf16=True)
            return classify(obj.detach().numpy(), name)
        if not obj.is_contiguous():
            raise ArgumentError(f"argument {name!r} is a non-contiguous device array (strides {tuple(obj.stride())}); "
                                "pass a contiguous tensor (.contiguous())")
        import torch

        dt = np.dtype(np.uint16) if bf16 else np.dtype(str(obj.dtype).removeprefix("torch."))
        stream = _torch_stream(obj.get_device())
        return _Arg(name, tuple(obj.shape), dt, ptr=obj.data_ptr(), device=obj.device.index, stream=stream,
                    bf16=bf16)
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        shape = tuple(int(d) for d in cai["shape"])
        raw = np.dtype(cai["typestr"])
        dt = _bits_if_bfloat16(raw)
        if not _contiguous(shape, cai.get("strides"), dt.itemsize):
            raise ArgumentError(f"argument {name!r} is a non-contiguous device array (strides {cai.get('strides')}); "
                                "pass a C-contiguous array")
        ptr = int(cai["data"][0] or 0)
        stream = None
        if mod.startswith("cupy"):
            import cupy

            stream = int(cupy.cuda.get_current_stream().ptr)
        elif isinstance(cai.get("stream"), int):
            stream = 0 if cai["stream"] == 1 else int(cai["stream"])
        return _Arg(name, shape, dt, ptr=ptr, device=_pointer_device(ptr), stream=stream, bf16=dt != raw)
    if hasattr(obj, "__dlpack_device__"):
        dev_type, dev_id = obj.__dlpack_device__()
        if int(dev_type) == 1:  # kDLCPU
            return classify(np.from_dlpack(obj), name)
        if int(dev_type) != 2:  # kDLCUDA
            raise ArgumentTypeError(f"argument {name!r} lives on DLPack device type {int(dev_type)}, not a CUDA GPU")
        from cuda.core.utils import StridedMemoryView

        view = StridedMemoryView.from_any_interface(obj, stream_ptr=-1)
        shape = tuple(view.shape)
        raw = np.dtype(view.dtype)
        dt = _bits_if_bfloat16(raw)
        strides = None if view.strides is None else tuple(s * dt.itemsize for s in view.strides)
        if not _contiguous(shape, strides, dt.itemsize):
            raise ArgumentError(f"argument {name!r} is a non-contiguous device array (strides {view.strides}); "
                                "pass a C-contiguous array")
        return _Arg(name, shape, dt, ptr=int(view.ptr), device=int(dev_id), bf16=dt != raw)
    raise ArgumentTypeError(f"argument {name!r} must be a numpy array or a CUDA device array "
                            f"(__cuda_array_interface__ / DLPack), got {type(obj).__name__}")


def _torch_stream(index: int) -> int:
    """The handle of torch's current stream on device `index`: the raw handle torch's own generated code reads
    (`torch._C._cuda_getCurrentRawStream`), else through a Stream object (`torch.cuda.current_stream`, which took
    about a third of a fast-path call's host time with torch tensors)."""
    torch = sys.modules["torch"]
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return int(raw(index)) if raw is not None else torch.cuda.current_stream(index).cuda_stream


def _signature(arrays: tuple[Any, ...]) -> tuple[tuple[Any, ...], list[Any], int | None] | None:
    """The fast path's view of a call: (signature, pointers, stream handle), or None when some argument has
    no fast path (a CPU tensor, a DLPack-only array, not an array: the full path decides).

    The signature is everything `classify` and the checks read from the arguments except the data pointers
    (type, shape, dtype, contiguity, writeability, device): two calls with equal signatures take the same
    decisions. Pointers: a device array's address, a numpy array itself (read when uploading). The stream
    is `prepare`'s: the first device argument that names one (torch's current stream, the CAI stream)."""
    sig: list[Any] = []
    ptrs: list[Any] = []
    stream = None
    for a in arrays:
        t = type(a)
        if isinstance(a, np.ndarray):
            f = a.flags
            sig.append((t, a.shape, a.dtype, f.c_contiguous, f.writeable))
            ptrs.append(a)
            continue
        mod = t.__module__ or ""
        if mod.startswith("torch"):
            if not getattr(a, "is_cuda", False):
                return None  # a CPU tensor (or something torch-like without is_cuda): classify converts it
            index = a.get_device()  # an int: `a.device` makes a torch.device object per call
            sig.append((t, tuple(a.shape), a.dtype, a.is_contiguous(), index))
            ptrs.append(a.data_ptr())
            if stream is None:
                stream = _torch_stream(index)
            continue
        cai = getattr(a, "__cuda_array_interface__", None)
        if cai is None:
            return None
        ptr = int(cai["data"][0] or 0)
        strides = cai.get("strides")
        sig.append((t, tuple(cai["shape"]), cai["typestr"], None if strides is None else tuple(strides),
                    _pointer_device(ptr)))
        ptrs.append(ptr)
        if stream is None:
            if mod.startswith("cupy"):
                stream = int(sys.modules["cupy"].cuda.get_current_stream().ptr)
            elif isinstance(cai.get("stream"), int):
                stream = 0 if cai["stream"] == 1 else int(cai["stream"])
    return tuple(sig), ptrs, stream


MAX_PLANS = 8  # signatures remembered per module (per thread: temporaries and upload buffers are per thread)
MAX_PLAN_LAUNCHES = 4096  # a longer launch sequence (a long host loop) is not remembered


@dataclass(slots=True)
class _Plan:
    """Everything a call with one signature decided, so the next such call only reads pointers and launches:
    the variant that runs, its device, the upload buffers of the numpy arguments, and each launch with its
    function, grid/block, dynamic shared bytes and argument values (device arguments' pointers filled per
    call at `dyn`: (position in the values, argument index)), packed once into a `ParamBlock` (None for a
    launch with tensor maps)."""

    module: CudaModule
    last_call: tuple[Any, dict[Var, int]] | None
    dev: Device
    host: tuple[tuple[int, int, int, bool], ...]  # (argument index, device buffer, nbytes, written)
    launches: tuple[tuple[Any, tuple[int, ...], int, tuple[Any, ...], tuple[tuple[int, int], ...],
                          tuple[Any, ...], str, ParamBlock | None], ...]
    streams: dict[int | None, Any] = field(default_factory=dict)


def _size_arg(k: Kernel, a: Any, env: dict[Var, int]) -> int:
    """The value of size parameter `a` of kernel `k` at this call; ResourceLimitError when the kernel has 32-bit
    indices (the variant's int32 key promised them) and the size does not fit."""
    v = int(env[a.var])
    if a.int32 and not -2**31 <= v < 2**31:
        raise ResourceLimitError(f"kernel {k.name!r} has 32-bit indices but size {a.var.name!r} = {v} "
                                 "does not fit 32 bits; build with specialize=False")
    return v


def _relaunch_with_maps(cu: Any, fn: Any, dims: tuple[int, ...], smem: int, stream: Any, values: tuple[Any, ...],
                        specs: MapSpecs, ptrs: Any, what: str) -> None:
    """A recorded launch with tensor maps, run again on `ptrs` ((parameter, pointer) pairs): a map parameter is
    remade from its pointer (cached by pointer; an unaligned tensor copied to a fresh aligned copy, written back and
    freed after the launch), a pointer parameter is the pointer."""
    vals, scratch = list(values), []
    for j, ptr in ptrs:
        vals[j] = ctypes.c_void_p(ptr) if specs[j] is None else map_value(cu, ptr, *specs[j], stream, scratch)
    check(launch_with_maps(cu, fn, dims, smem, stream, vals), what)
    free_scratch(cu, scratch, stream)


def _make_plan(p: _Prepared, last_call: tuple[Any, dict[Var, int]] | None) -> _Plan | None:
    mod: CudaModule = p.module
    if p.record is None or len(p.record) > MAX_PLAN_LAUNCHES:
        return None
    index = {b: i for i, (a, b) in enumerate(zip(p.args, mod.program.args)) if a.host is None}
    launches = []
    for k, fn, dims, smem, values, types in p.record:
        dyn = tuple((j, index[ka.buffer]) for j, ka in enumerate(k.args) if ka.buffer in index)
        block = None if isinstance(types, MapSpecs) else ParamBlock(values, types)
        launches.append((fn, dims, smem, values, dyn, types, f"cuLaunchKernel({k.name})", block))
    host = tuple((i, p.ptrs[b], a.host.nbytes, b in mod.written)
                 for i, (a, b) in enumerate(zip(p.args, mod.program.args)) if a.host is not None)
    return _Plan(mod, last_call, p.dev, host, tuple(launches))


# ----------------------------------------------------------------------------- the module


@dataclass
class _Prepared:
    args: list[_Arg]
    sizes: dict[Var, int]
    dev: Device
    stream: Any
    ptrs: dict[Buffer, int] = field(default_factory=dict)
    module: Any = None  # the module whose kernels run it (a specialized variant of the one asked)
    record: list[tuple[Any, ...]] | None = None  # the launches made, for the fast path's plan (see _Plan)
    # aligned copies of unaligned TMA operands kept past their launch (kernel_times replays the recorded launches,
    # whose tensor maps point into them); None: each freed after its launch
    kept: list[Any] | None = None
    # the launches of its first `launch`, replayed by the later ones (no grid, shared bytes or argument re-derived)
    replay: tuple[tuple[Any, ...], ...] | None = None


class CudaModule(Module):
    """Kernels compiled for one program. `mod(*arrays)` runs them; `mod.benchmark(*arrays)` times them."""

    target = "cuda"

    def __init__(self, gen: CudaSource, cubin: bytes, arch: str, options: tuple[str, ...] = ()) -> None:
        super().__init__(gen.program, gen.source, [k.name for k in gen.kernels])
        self.gen = gen
        self.cubin = cubin
        self.arch = arch
        self.options = options
        self._loaded: dict[int, tuple[Any, dict[str, Any]]] = {}
        self._host_bufs: dict[tuple[int, int, int, int], Any] = {}
        self._load_lock = threading.Lock()
        self._temps: dict[tuple[int, tuple], list[Any]] = {}
        self._smem_set: dict[tuple[int, str], int] = {}  # (device, kernel) -> dynamic shared bytes opted in
        self._plans: dict[tuple[int, tuple[Any, ...]], _Plan] = {}  # (thread, signature) -> the fast path's plan
        self._smem_limits: dict[tuple[int, str], tuple[int, int]] = {}  # (device, kernel) -> (opt-in limit, static)

    # -- loading
    def _functions(self, dev: Device) -> dict[str, Any]:
        with self._load_lock:
            return self._functions_locked(dev)

    def _functions_locked(self, dev: Device) -> dict[str, Any]:
        if dev.ordinal not in self._loaded:
            cu = _driver()
            cubin = self.cubin if dev.arch == self.arch else compile_cubin(self.source, dev.arch, self.options)
            mod = check(cu.cuModuleLoadData(cubin), "cuModuleLoadData")
            fns = {k.name: check(cu.cuModuleGetFunction(mod, k.name.encode()), f"cuModuleGetFunction({k.name})")
                   for k in self.gen.kernels}
            self._loaded[dev.ordinal] = (mod, fns)
        return self._loaded[dev.ordinal][1]

    def _alloc(self, nbytes: int) -> Any:
        cu = _driver()
        return check(cu.cuMemAlloc(max(nbytes, 1)), "cuMemAlloc")

    # -- one call
    def with_size_args(self, size_args: tuple[tuple[int, Var], ...]) -> CudaModule:
        mod = super().with_size_args(size_args)
        assert isinstance(mod, CudaModule)
        # device memory and loaded functions of its own: each copy frees what it holds (__del__)
        mod._loaded, mod._host_bufs, mod._temps, mod._smem_set, mod._smem_limits = {}, {}, {}, {}, {}
        mod._load_lock = threading.Lock()
        return mod

    def _bind(self, arrays: tuple[Any, ...], args: list[_Arg] | None = None,
              known: dict[Var, int] | None = None) -> tuple[list[_Arg], dict[Var, int]]:
        """Every check of the arguments (no device work): their descriptions and the sizes. `args`: the
        arguments already classified (by the generic module that dispatched to this variant); `known`: sizes
        passed as arguments."""
        prog = self.program
        if len(arrays) != len(prog.args):
            names = ", ".join(b.name for b in prog.args)
            raise ArgumentTypeError(
                f"program {prog.name!r} takes {len(prog.args)} argument(s) ({names}), got {len(arrays)}")
        if args is None or [a.name for a in args] != [b.name for b in prog.args]:
            args = [classify(a, b.name) for a, b in zip(arrays, prog.args)]
        for a, b in zip(args, prog.args):
            if a.bf16 and b.dtype != "bfloat16":  # the bits of bfloat16 data are no uint16 numbers
                raise ArgumentTypeError(f"argument {a.name!r} holds bfloat16 data, but program {prog.name!r} "
                                        f"expects {b.dtype}")
        sizes = bind_shapes(prog, [(a.shape, a.dtype) for a in args], known_sizes(prog, known))
        for pre in self.preconditions:
            pre.check(sizes)
        for a, b in zip(args, prog.args):
            if a.host is not None:
                if not a.host.flags.c_contiguous:
                    raise ArgumentError(f"argument {a.name!r} is not C-contiguous; pass np.ascontiguousarray(...)")
                if b in self.written and not a.host.flags.writeable:
                    raise ArgumentError(f"argument {a.name!r} is written by program {prog.name!r} but is read-only")
        return args, sizes

    def check(self, arrays: tuple[Any, ...], known: dict[Var, int] | None = None) -> dict[Var, int]:
        """The size variables, after every check of the arguments (host or device arrays)."""
        return self._bind(arrays, None, known)[1]

    def prepare(self, arrays: tuple[Any, ...], bound: tuple[list[_Arg], dict[Var, int]] | None = None) -> _Prepared:
        """Check the arguments, pick the variant for their sizes (codegen.specialize), upload host arrays;
        `launch(p)` and `finish(p)` then run on that variant. `bound`: `_bind`'s result, variant chosen."""
        prog = self.program
        if bound is None:
            bound = self._bind(arrays)
            mod = self._select(bound[1])
            if mod is not self:
                return mod.prepare(arrays)  # type: ignore[attr-defined]
        args, sizes = bound
        on_dev = [a for a in args if a.host is None]
        ordinal = next((a.device for a in on_dev if a.device is not None), 0)
        for a in on_dev:
            if a.device is not None and a.device != ordinal:
                raise ArgumentError(
                    f"argument {a.name!r} is on CUDA device {a.device}, but argument "
                    f"{on_dev[0].name!r} is on device {ordinal}; all device arrays must share one device")
        dev = device(ordinal)
        cu = _driver()
        stream_handle = next((a.stream for a in on_dev if a.stream is not None), 0)
        p = _Prepared(args, sizes, dev, cu.CUstream(stream_handle), module=self)
        for k, (a, b) in enumerate(zip(args, prog.args)):
            if a.host is None:
                p.ptrs[b] = a.ptr
                continue
            key = (dev.ordinal, k, a.host.nbytes, threading.get_ident())  # per thread: calls may overlap
            if key not in self._host_bufs:
                self._host_bufs[key] = self._alloc(a.host.nbytes)
            dptr = self._host_bufs[key]
            if a.host.nbytes:
                check(cu.cuMemcpyHtoDAsync(dptr, a.host.ctypes.data, a.host.nbytes, p.stream), "cuMemcpyHtoDAsync")
            p.ptrs[b] = int(dptr)
        tkey = (dev.ordinal, tuple(sorted((v.name, n) for v, n in sizes.items())), threading.get_ident())
        if prog.temps and tkey not in self._temps:
            self._temps[tkey] = [self._alloc(int(np.prod(size_of(t.shape, sizes), dtype=np.int64)) *
                                             np_dtype(t.dtype).itemsize) for t in prog.temps]
        for t, ptr in zip(prog.temps, self._temps.get(tkey, [])):
            p.ptrs[t] = int(ptr)
        return p

    def launch(self, p: _Prepared) -> None:
        """Run the launch sequence: kernels in order, host loops as Python loops of launches. The first launch of
        `p` records its launches; later ones replay them (p's pointers and sizes are fixed), as a repeated call
        replays its plan: the host's time per kernel, not the derivation of each launch."""
        if p.module is not None and p.module is not self:
            p.module.launch(p)
            return
        if p.replay is not None and p.record is None:
            self._replay(p)
            return
        fns = self._functions(p.dev)
        launches = self.gen.launches or tuple(Launch(k) for k in range(len(self.gen.kernels)))
        mine = p.record is None  # a caller recording the launches itself (a call's plan, kernel_times) keeps them
        if mine:
            p.record = []
        try:
            self._run_steps(launches, dict(p.sizes), fns, p)
        finally:
            if mine:
                rec, p.record = p.record, None
                if rec is not None and len(rec) <= MAX_PLAN_LAUNCHES:
                    p.replay = tuple((k, fn, dims, smem, values, types,
                                      tuple((j, a.buffer) for j, a in enumerate(k.args) if a.buffer is not None))
                                     for k, fn, dims, smem, values, types in rec)

    def _replay(self, p: _Prepared) -> None:
        """`p`'s recorded launches again; tensor maps remade from its pointers (cached by pointer; an unaligned
        operand copied again, as in _run_plan)."""
        cu = _driver()
        ok = cu.CUresult.CUDA_SUCCESS
        for k, fn, dims, smem, values, types, bufs in p.replay:  # type: ignore[union-attr]
            if isinstance(types, MapSpecs):
                _relaunch_with_maps(cu, fn, dims, smem, p.stream, values, types,
                                    ((j, int(p.ptrs[b])) for j, b in bufs), f"cuLaunchKernel({k.name})")
                continue
            ret = cu.cuLaunchKernel(fn, *dims, smem, p.stream, (values, types), 0)
            if ret[0] != ok:
                check(ret, f"cuLaunchKernel({k.name})")

    def _run_steps(self, steps: tuple[HostStep, ...], env: dict[Var, int], fns: dict[str, Any], p: _Prepared) -> None:
        for st in steps:
            if isinstance(st, Launch):
                self._launch_kernel(self.gen.kernels[st.kernel], env, fns, p)
            elif isinstance(st, HostLoop):
                # one iteration's launches are queued on the stream before the next iteration's: the stream
                # orders them, so step t + 1 sees every block of step t finished
                lo, hi = st.lo, st.hi
                try:
                    lo = eval_index(st.lo, env)
                    hi = eval_index(st.hi, env)
                except (ValueError, TypeError, ZeroDivisionError) as err:
                    bad = hi if isinstance(lo, int) else lo
                    raise CudaCodegenError(f"cannot evaluate launch expression {bad} on the host: {err}") from err
                for v in range(lo, hi):
                    env[st.var] = v
                    self._run_steps(st.body, env, fns, p)
                env.pop(st.var, None)
            elif isinstance(st, HostIf):
                self._run_steps(st.then if eval_expr(st.cond, env) else st.orelse, env, fns, p)
            else:  # pragma: no cover - the generator makes only these three
                raise ArgumentTypeError(f"unknown launch step {st!r}")

    def _launch_kernel(self, k: Kernel, env: dict[Var, int], fns: dict[str, Any], p: _Prepared) -> None:
        cu = _driver()
        grid, block = k.launch.dims(env)
        if min(grid) <= 0 or min(block) <= 0:
            return  # empty iteration space
        if block[0] * block[1] * block[2] > 1024 or grid[1] > 65535 or grid[2] > 65535 or grid[0] >= 2**31:
            raise ResourceLimitError(f"kernel {k.name!r} needs grid {grid} and block {block}, beyond CUDA's limits "
                                     "(block <= 1024 threads, grid.y/z <= 65535); split the bound loops differently")
        if any(a.tmap for a in k.args):
            return self._launch_maps(k, grid, block, env, fns, p)
        values, types = [], []
        for a in k.args:
            if a.buffer is not None:
                values.append(p.ptrs[a.buffer])
                types.append(ctypes.c_void_p)
            else:
                values.append(_size_arg(k, a, env))
                types.append(ctypes.c_int if a.int32 else ctypes.c_longlong)
        smem = self._dynamic_shared(k, env, fns, p)
        if p.record is not None:
            p.record.append((k, fns[k.name], (*grid, *block), smem, tuple(values), tuple(types)))
        check(cu.cuLaunchKernel(fns[k.name], *grid, *block, smem, p.stream, (tuple(values), tuple(types)), 0),
              f"cuLaunchKernel({k.name})")

    def _launch_maps(self, k: Kernel, grid: tuple[int, ...], block: tuple[int, ...], env: dict[Var, int],
                     fns: dict[str, Any], p: _Prepared) -> None:
        """A launch with TMA tensor maps among its parameters (codegen.cuda.tensor_map): made from this call's
        pointers and sizes (a recorded plan remakes them from each later call's pointers: _run_plan). TMA reads from
        16-byte aligned addresses only: an operand that starts elsewhere (a view at an odd offset) is copied to an
        aligned scratch buffer on the call's stream first (codegen.cuda.tensor_map.map_value)."""
        cu = _driver()
        values: list[Any] = []
        specs: list[Any] = []
        scratch: list[Any] = []
        for a in k.args:
            if a.tmap:
                b = a.buffer
                extents = map_extents([eval_index(d, env) for d in b.shape], len(a.tmap))  # type: ignore[union-attr]
                spec = (b.dtype, extents, np_dtype(b.dtype).itemsize, a.tmap, a.written)  # type: ignore[union-attr]
                values.append(map_value(cu, int(p.ptrs[b]), *spec, p.stream, scratch))
                specs.append(spec)
                continue
            if a.buffer is not None:
                values.append(ctypes.c_void_p(int(p.ptrs[a.buffer])))
            else:
                v = _size_arg(k, a, env)
                values.append(ctypes.c_int(v) if a.int32 else ctypes.c_longlong(v))
            specs.append(None)
        smem = self._dynamic_shared(k, env, fns, p)
        if p.record is not None:  # a plan remakes the maps from each call's pointers (_run_plan)
            p.record.append((k, fns[k.name], (*grid, *block), smem, tuple(values), MapSpecs(specs)))
        check(launch_with_maps(cu, fns[k.name], (*grid, *block), smem, p.stream, values), f"cuLaunchKernel({k.name})")
        if p.kept is not None:
            p.kept += scratch
        else:
            free_scratch(cu, scratch, p.stream)

    def _dynamic_shared(self, k: Kernel, env: dict[Var, int], fns: dict[str, Any], p: _Prepared) -> int:
        """The bytes of dynamic shared memory this launch of `k` asks for (`Kernel.dynamic_shared` at this
        call's sizes); above 48 KiB the function is opted in first. SharedMemoryError when the device cannot
        hold them."""
        nbytes = dynamic_shared_bytes(k, env)
        if nbytes <= STATIC_SHARED:
            return nbytes
        cu = _driver()
        key = (p.dev.ordinal, k.name)
        if key not in self._smem_limits:  # fixed for a loaded function on a device: asked once
            A = cu.CUdevice_attribute
            limit = int(check(cu.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                                                      p.dev.handle), "cuDeviceGetAttribute"))
            static = int(check(cu.cuFuncGetAttribute(cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
                                                     fns[k.name]), "cuFuncGetAttribute"))
            self._smem_limits[key] = (limit, static)
        limit, static = self._smem_limits[key]
        if nbytes + static > limit:
            raise SharedMemoryError(f"kernel {k.name!r} needs {nbytes:,} bytes of dynamic shared memory at these "
                                    f"sizes ({static:,} more declared statically); the device allows {limit:,} "
                                    "per block: call it with smaller rows, or build without the shared row cache")
        if self._smem_set.get(key, 0) < nbytes:
            check(cu.cuFuncSetAttribute(fns[k.name], cu.CUfunction_attribute
                                        .CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes),
                  f"cuFuncSetAttribute({k.name}, MAX_DYNAMIC_SHARED_SIZE_BYTES, {nbytes})")
            self._smem_set[key] = nbytes
        return nbytes

    def finish(self, p: _Prepared) -> None:
        if p.module is not None and p.module is not self:
            p.module.finish(p)
            return
        cu = _driver()
        host_out = [(a, b) for a, b in zip(p.args, self.program.args) if a.host is not None and b in self.written]
        for a, b in host_out:
            if a.host.nbytes:
                check(cu.cuMemcpyDtoHAsync(a.host.ctypes.data, p.ptrs[b], a.host.nbytes, p.stream), "cuMemcpyDtoHAsync")
        if any(a.host is not None for a in p.args):
            check(cu.cuStreamSynchronize(p.stream), "cuStreamSynchronize")

    def _call(self, arrays: tuple[Any, ...], known: dict[Var, int] | None) -> None:  # Module.__call__ calls it
        q = _signature(arrays) if self.fast_path else None
        if q is not None and known:
            q = ((*q[0], tuple(known.items())), q[1], q[2])
        if q is not None:
            plan = self._plans.get((threading.get_ident(), q[0]))
            if plan is not None:  # same signature as a checked call: same decisions, only the pointers differ
                if self.specializer is not None:
                    self._last_call = plan.last_call
                self._run_plan(plan, arrays, q[1], q[2])
                return
        p = self._call_full(arrays, q is not None, None, known)
        if q is not None and p is not None:
            plan = _make_plan(p, self._last_call if self.specializer is not None else None)
            if plan is not None:
                if len(self._plans) >= MAX_PLANS:
                    try:
                        self._plans.pop(next(iter(self._plans), None), None)
                    except RuntimeError:  # another thread changed the dict meanwhile: evict next time
                        pass
                self._plans[(threading.get_ident(), q[0])] = plan

    def _call_full(self, arrays: tuple[Any, ...], record: bool, args: list[_Arg] | None = None,
                   known: dict[Var, int] | None = None) -> _Prepared | None:
        """Every check, then the run; returns the run's _Prepared (with its launches when `record`)."""
        bound = self._bind(arrays, args, known)
        mod = self._select(bound[1])
        if mod is not self:  # a variant specialized for this call's key (codegen.specialize)
            if not isinstance(mod, CudaModule):
                mod._call(arrays, known)
                return None
            return mod._call_full(arrays, record, bound[0], known)  # the variant checks its own program's shapes
        p = self.prepare(arrays, bound)
        if record:
            p.record = []
        self.launch(p)
        self.finish(p)
        return p

    def _run_plan(self, plan: _Plan, arrays: tuple[Any, ...], ptrs: list[Any], handle: int | None) -> None:
        """A call whose signature matched `plan`: uploads, the recorded launches with this call's pointers
        and stream, downloads (the same driver calls the full path makes, in the same order)."""
        cu = _driver()
        ok = cu.CUresult.CUDA_SUCCESS
        check(cu.cuCtxSetCurrent(plan.dev.ctx), "cuCtxSetCurrent")
        stream = plan.streams.get(handle)
        if stream is None:
            stream = plan.streams[handle] = cu.CUstream(handle or 0)
        for i, dptr, nbytes, _ in plan.host:
            if nbytes:
                check(cu.cuMemcpyHtoDAsync(dptr, ptrs[i].ctypes.data, nbytes, stream), "cuMemcpyHtoDAsync")
        launch = cu.cuLaunchKernel
        for fn, dims, smem, values, dyn, types, what, block in plan.launches:
            if block is None:  # tensor maps: remade from this call's pointers
                _relaunch_with_maps(cu, fn, dims, smem, stream, values, types, ((j, int(ptrs[i])) for j, i in dyn),
                                    what)
                continue
            slots = block.slots
            for j, i in dyn:
                slots[j] = ptrs[i]
            ret = launch(fn, *dims, smem, stream, block.params, 0)
            if ret[0] != ok:
                check(ret, what)
        if plan.host:
            for i, dptr, nbytes, written in plan.host:
                if written and nbytes:
                    check(cu.cuMemcpyDtoHAsync(ptrs[i].ctypes.data, dptr, nbytes, stream), "cuMemcpyDtoHAsync")
            check(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")

    def benchmark(self, *arrays: Any, warmup: int = 3, repeat: int = 20) -> float:
        """Median milliseconds of one call's kernels (CUDA events on the call's stream, after warm-up);
        a specializing module times the variant the call dispatches to.

        numpy arguments are uploaded once, before timing, and the results copied back after."""
        return self._benchmark(*self.split_call(arrays), warmup, repeat)

    def _benchmark(self, arrays: tuple[Any, ...], known: dict[Var, int] | None, warmup: int, repeat: int) -> float:
        bound = self._bind(arrays, None, known)
        mod = self._select(bound[1])
        if mod is not self:
            return mod._benchmark(arrays, known, warmup, repeat)  # type: ignore[attr-defined]
        cu = _driver()
        p = self.prepare(arrays, bound)
        for _ in range(warmup):
            self.launch(p)
        start = check(cu.cuEventCreate(0), "cuEventCreate")
        end = check(cu.cuEventCreate(0), "cuEventCreate")
        times = []
        try:
            for _ in range(repeat):
                check(cu.cuEventRecord(start, p.stream), "cuEventRecord")
                self.launch(p)
                check(cu.cuEventRecord(end, p.stream), "cuEventRecord")
                check(cu.cuEventSynchronize(end), "cuEventSynchronize")
                times.append(check(cu.cuEventElapsedTime(start, end), "cuEventElapsedTime"))
        finally:
            cu.cuEventDestroy(start)
            cu.cuEventDestroy(end)
        self.finish(p)
        return float(statistics.median(times))

    def kernel_times(self, *arrays: Any, warmup: int = 3, repeat: int = 20) -> dict[str, float]:
        """Median milliseconds of each kernel of one call, by name, in launch order: the call's launches are
        recorded once, then each is replayed alone between CUDA events (a kernel launched several times by a
        host loop: the sum of its launches). Their sum is near `benchmark`'s time, without the gaps between
        launches; a specializing module times the variant the call dispatches to."""
        return self._kernel_times(*self.split_call(arrays), warmup, repeat)

    def _kernel_times(self, arrays: tuple[Any, ...], known: dict[Var, int] | None, warmup: int,
                      repeat: int) -> dict[str, float]:
        bound = self._bind(arrays, None, known)
        mod = self._select(bound[1])
        if mod is not self:
            return mod._kernel_times(arrays, known, warmup, repeat)  # type: ignore[attr-defined]
        cu = _driver()
        p = self.prepare(arrays, bound)
        p.record, p.kept = [], []
        self.launch(p)
        launches, p.record = p.record, None
        start = check(cu.cuEventCreate(0), "cuEventCreate")
        end = check(cu.cuEventCreate(0), "cuEventCreate")
        runs: dict[str, list[float]] = {k.name: [] for k, *_ in launches}
        try:
            for r in range(warmup + repeat):
                total = dict.fromkeys(runs, 0.0)
                for k, fn, dims, smem, values, types in launches:
                    check(cu.cuEventRecord(start, p.stream), "cuEventRecord")
                    maps = isinstance(types, MapSpecs)
                    ret = (launch_with_maps(cu, fn, dims, smem, p.stream, list(values)) if maps else
                           cu.cuLaunchKernel(fn, *dims, smem, p.stream, (values, types), 0))
                    check(ret, f"cuLaunchKernel({k.name})")
                    check(cu.cuEventRecord(end, p.stream), "cuEventRecord")
                    check(cu.cuEventSynchronize(end), "cuEventSynchronize")
                    total[k.name] += check(cu.cuEventElapsedTime(start, end), "cuEventElapsedTime")
                if r >= warmup:
                    for name, t in total.items():
                        runs[name].append(t)
        finally:
            cu.cuEventDestroy(start)
            cu.cuEventDestroy(end)
            free_scratch(cu, p.kept or [], p.stream)  # written copies back to their arrays, then freed
            p.kept = None
        self.finish(p)
        return {name: float(statistics.median(ts)) for name, ts in runs.items()}

    def __del__(self) -> None:
        if not any(getattr(self, a, None) for a in ("_loaded", "_host_bufs", "_temps")):
            return  # never touched a device: don't import the driver just to free nothing (~75 ms)
        try:
            cu = _driver()
            for ptr in list(self._host_bufs.values()) + [x for v in self._temps.values() for x in v]:
                cu.cuMemFree(ptr)
            for mod, _ in self._loaded.values():
                cu.cuModuleUnload(mod)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


__all__ = ["CudaModule", "CudaError", "NoGpuError", "SharedMemoryError", "dynamic_shared_bytes",
           "check", "device", "default_arch", "gpu_available", "classify"]
