"""The call fast path (`Module.fast_path`): a call whose argument signature matches a checked call replays
that call's decisions with only the pointers re-read. These tests show it is exact: same numbers and same
launches as the full path, and every change in what the checks read (shape, dtype, contiguity, read-only,
device, a size the build refused, overlapping memory) still takes the full path and is refused the same way.
CUDA without a GPU: the driver is stubbed (benchmarks/call_overhead.StubDriver records the launches)."""

from __future__ import annotations

import os
import sys
import threading
import types

import numpy as np
import pytest

from codegen import build
from codegen.cuda import runtime as rt
from codegen.cuda.params import ParamBlock
from loopir import ir, te
from loopir.bounds import BoundsError
from loopir.errors import ArgumentError, ArgumentTypeError
from schedules import Schedule

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

from call_overhead import FakeDeviceArray, StubDriver, chain, softmax  # noqa: E402


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _softmax_ref(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _refusal(mod, args) -> tuple[type, str]:
    with pytest.raises(Exception) as ei:
        mod(*args)
    return type(ei.value), str(ei.value)


def _both_paths_refuse(mod, good, bad, err: type) -> None:
    """`bad` after a cached good call is refused exactly as the full path refuses it."""
    mod.fast_path = True
    mod(*good())
    mod(*good())
    assert mod._plans, "the good call must be remembered"
    fast = _refusal(mod, bad())
    mod.fast_path = False
    full = _refusal(mod, bad())
    mod.fast_path = True
    assert fast == full and issubclass(fast[0], err), (fast, full)


# ----------------------------------------------------------------------------- CPU


@pytest.fixture(scope="module")
def cpu_softmax():
    n, m = te.var("n"), te.var("m")
    x, y = softmax(n, m)
    return build([y], [x, y], target="cpu")


@pytest.fixture(scope="module")
def cpu_fixed():
    x, y = chain(6, 40)
    return build([y], [x, y], target="cpu")


@pytest.mark.parametrize("shape", [(5, 33), (4, 64), (1, 17)])
def test_cpu_fast_and_full_path_give_the_same_numbers(cpu_softmax, shape):
    mod = cpu_softmax
    out = {}
    for fast in (False, True, True):
        mod.fast_path = fast
        x = _rng(shape[1]).standard_normal(shape).astype(np.float32)
        y = np.full(shape, np.nan, np.float32)
        mod(x, y)
        out.setdefault(fast, []).append(y)
        np.testing.assert_allclose(y, _softmax_ref(x), rtol=1e-5, atol=1e-6)
    mod.fast_path = True
    assert any(p.sizes for p in mod._plans.values())
    np.testing.assert_array_equal(out[False][0], out[True][1])  # same data, same program: identical bits


def test_cpu_fast_path_reads_new_pointers_and_explains(cpu_softmax):
    mod = cpu_softmax
    for seed in range(3):  # new arrays each call: only the pointers differ from the remembered call
        x = _rng(seed).standard_normal((8, 48)).astype(np.float32)
        y = np.full_like(x, np.nan)
        mod(x, y)
        np.testing.assert_allclose(y, _softmax_ref(x), rtol=1e-5, atol=1e-6)
    assert "m=48" in mod.explain()


@pytest.mark.parametrize("case", ["shape", "dtype", "noncontiguous", "readonly", "overlap", "count", "list"])
def test_cpu_cached_call_then_a_bad_call_is_refused_as_without_the_cache(cpu_fixed, case):
    x = _rng(1).standard_normal((6, 40)).astype(np.float32)
    y = np.full_like(x, np.nan)
    bad = {
        "shape": lambda: (x[:5].copy(), y[:5].copy()),
        "dtype": lambda: (x.astype(np.float64), y),
        "noncontiguous": lambda: (np.asfortranarray(x), y),
        "readonly": lambda: (x, _readonly(y)),
        "overlap": lambda: (x, x),
        "count": lambda: (x,),
        "list": lambda: (x.tolist(), y),
    }[case]
    err = {"dtype": ArgumentTypeError, "count": ArgumentTypeError, "list": ArgumentTypeError}.get(case, ArgumentError)
    _both_paths_refuse(cpu_fixed, lambda: (x, y), bad, err)
    cpu_fixed(x, y)  # and the good call still runs
    np.testing.assert_allclose(y, np.tanh(x.astype(np.float64) * 2 + 1), rtol=1e-5, atol=1e-6)


def _readonly(a: np.ndarray) -> np.ndarray:
    a = a.copy()
    a.flags.writeable = False
    return a


def _row0_program():
    """Writes ey[0, j]: out of bounds only when nx = 0 (a call-time precondition, loopir.bounds)."""
    nx, ny = te.var("nx"), te.var("ny")
    ey = ir.buffer((nx, ny), name="ey")
    fict = ir.buffer((3,), name="fict")
    b = ir.Builder("row0")
    with b.loop("t", 0, 3) as t:
        with b.loop("j0", 0, ny) as j:
            b.store(ey, (0, j), fict[t] * 2.0, name="S0")
    return b.finish([fict, ey])


def test_cpu_precondition_after_a_cached_call():
    mod = build(_row0_program())
    f = _rng(3).uniform(1, 2, 3).astype(np.float32)
    out = np.full((4, 5), np.nan, np.float32)
    _both_paths_refuse(mod, lambda: (f, out), lambda: (f, np.zeros((0, 5), np.float32)), BoundsError)
    np.testing.assert_allclose(out[0], np.full(5, f[2] * 2))


def test_cpu_overlap_is_rechecked_per_call_with_equal_signatures(cpu_fixed):
    """Same signature (shape, dtype, flags) as the cached call, but y is a view of x's memory."""
    buf = _rng(2).standard_normal((2, 6, 40)).astype(np.float32)
    x, y = buf[0], buf[1]
    cpu_fixed(x, y)
    cpu_fixed(x, y)
    with pytest.raises(ArgumentError, match="overlap"):
        cpu_fixed(buf[0], buf[0])


def test_cpu_plans_are_bounded(cpu_softmax):
    for m in range(20, 40):
        x = _rng(m).standard_normal((2, m)).astype(np.float32)
        cpu_softmax(x, np.empty_like(x))
    assert len(cpu_softmax._plans) <= 8


# ----------------------------------------------------------------------------- CUDA, driver stubbed


@pytest.fixture
def stub(monkeypatch):
    drv = StubDriver(record=True)
    monkeypatch.setattr(rt, "_driver", lambda: drv)
    monkeypatch.setattr(rt, "_INIT", {})
    monkeypatch.setattr(rt, "_DEVICES", {})
    return drv


@pytest.fixture(scope="module")
def cuda_softmax():
    n, m = te.var("n"), te.var("m")
    x, y = softmax(n, m)
    return build([y], [x, y], target="cuda", arch="sm_90")


@pytest.fixture(scope="module")
def cuda_fixed():
    x, y = chain(64, 100)
    return build([y], [x, y], target="cuda", arch="sm_90")


def _fresh(mod):
    mod._plans.clear()
    for v in getattr(mod.specializer, "variants", {}).values():
        v._plans.clear()
    return mod


def _launches(drv: StubDriver, mod, args, fast: bool) -> list[tuple]:
    mod.fast_path = fast
    drv.launches.clear()
    mod(*args)
    mod.fast_path = True
    return list(drv.launches)


@pytest.mark.parametrize("shape", [(64, 1000), (3, 17), (1, 4096)])
def test_cuda_fast_path_makes_the_full_paths_launches(stub, cuda_softmax, shape):
    mod = _fresh(cuda_softmax)
    a = (FakeDeviceArray(shape), FakeDeviceArray(shape))
    full = _launches(stub, mod, a, False)
    assert full and not mod._plans
    first = _launches(stub, mod, a, True)  # full path, remembered
    hit = _launches(stub, mod, a, True)
    assert len(mod._plans) == 1
    assert full == first == hit
    b = (FakeDeviceArray(shape), FakeDeviceArray(shape))  # new pointers, same signature
    assert _launches(stub, mod, b, True) == _launches(stub, mod, b, False) != full
    explained = mod.explain()
    mod(*a)
    assert mod.explain() == explained


def test_cuda_fast_path_with_numpy_arguments_copies_like_the_full_path(stub, cuda_fixed):
    mod = _fresh(cuda_fixed)
    calls = []
    for name in ("cuMemcpyHtoDAsync", "cuMemcpyDtoHAsync", "cuStreamSynchronize"):
        setattr(stub, name, lambda *a, name=name: calls.append((name, a[:1] + a[2:])) or (0,))
    x = _rng(0).standard_normal((64, 100)).astype(np.float32)
    y = np.full_like(x, np.nan)
    seen = []
    for fast in (False, True, True):
        mod.fast_path = fast
        calls.clear()
        stub.launches.clear()
        mod(x, y)
        seen.append((list(calls), list(stub.launches)))
    assert seen[0] == seen[1] == seen[2]
    assert [c[0] for c in seen[0][0]] == ["cuMemcpyHtoDAsync", "cuMemcpyHtoDAsync", "cuMemcpyDtoHAsync",
                                          "cuStreamSynchronize"]


@pytest.mark.parametrize("case", ["shape", "dtype", "noncontiguous", "device", "host_readonly", "count", "other"])
def test_cuda_cached_call_then_a_bad_call_is_refused_as_without_the_cache(stub, cuda_fixed, case):
    mod = _fresh(cuda_fixed)
    x, y = FakeDeviceArray((64, 100)), FakeDeviceArray((64, 100))
    xh = _rng(1).standard_normal((64, 100)).astype(np.float32)
    elsewhere = FakeDeviceArray((64, 100))
    stub.ordinal_of[elsewhere.ptr] = 1
    good = (lambda: (xh, np.empty_like(xh))) if case == "host_readonly" else (lambda: (x, y))
    bad = {
        "shape": lambda: (FakeDeviceArray((64, 99)), FakeDeviceArray((64, 99))),
        "dtype": lambda: (FakeDeviceArray((64, 100), np.float64), y),
        "noncontiguous": lambda: (FakeDeviceArray((64, 100), strides=(4, 256)), y),
        "device": lambda: (x, elsewhere),
        "host_readonly": lambda: (xh, _readonly(xh)),
        "count": lambda: (x, y, y),
        "other": lambda: (x, [1.0]),
    }[case]
    err = {"dtype": ArgumentTypeError, "count": ArgumentTypeError, "other": ArgumentTypeError}.get(case, ArgumentError)
    _both_paths_refuse(mod, good, bad, err)


def test_cuda_symbolic_module_refuses_a_changed_shape_only_where_the_build_does(stub, cuda_softmax):
    mod = _fresh(cuda_softmax)
    a = (FakeDeviceArray((8, 64)), FakeDeviceArray((8, 64)))
    mod(*a)
    mod(*a)
    with pytest.raises(ArgumentError, match="'m'"):
        mod(FakeDeviceArray((8, 64)), FakeDeviceArray((8, 65)))
    stub.launches.clear()
    b = (FakeDeviceArray((8, 65)), FakeDeviceArray((8, 65)))  # a new signature: its own launches
    mod(*b)
    assert stub.launches == _launches(stub, mod, b, False) != _launches(stub, mod, a, False)


def test_cuda_precondition_after_a_cached_call(stub):
    s = Schedule(_row0_program())
    _, j = s.loops("S0")
    jo, ji = s.split(j, 32)
    s.bind(jo, "blockIdx.x").bind(ji, "threadIdx.x")
    mod = build(s, target="cuda", arch="sm_90")
    assert any("out of bounds when nx = 0" in n for n in mod.notes)
    f, out = FakeDeviceArray((3,)), FakeDeviceArray((4, 5))
    _both_paths_refuse(mod, lambda: (f, out), lambda: (f, FakeDeviceArray((0, 5))), BoundsError)


def test_cuda_plans_are_per_thread(stub, cuda_fixed):
    """Upload buffers and temporaries are per thread: another thread's call takes its own plan."""
    mod = _fresh(cuda_fixed)
    x = _rng(0).standard_normal((64, 100)).astype(np.float32)
    mod(x, np.empty_like(x))
    t = threading.Thread(target=lambda: mod(x, np.empty_like(x)))
    t.start()
    t.join()
    assert len({tid for tid, _ in mod._plans}) == 2


def test_cuda_driver_failure_on_the_fast_path_names_the_kernel(stub, cuda_fixed):
    mod = _fresh(cuda_fixed)
    a = (FakeDeviceArray((64, 100)), FakeDeviceArray((64, 100)))
    mod(*a)
    stub.cuLaunchKernel = lambda *args: (700,)
    with pytest.raises(rt.CudaError, match=r"cuLaunchKernel\("):
        mod(*a)


# ----------------------------------------------------------------------------- CUDA, a real device


@pytest.mark.gpu
def test_gpu_fast_path_numbers_match_numpy_and_the_full_path():
    n, m = te.var("n"), te.var("m")
    x, y = softmax(n, m)
    mod = build([y], [x, y], target="cuda")
    cu = rt._driver()
    for shape in ((64, 1000), (5, 33)):
        xs = _rng(shape[1]).standard_normal(shape).astype(np.float32)
        outs = []
        for fast in (False, True, True):  # host arrays
            mod.fast_path = fast
            ys = np.full_like(xs, np.nan)
            mod(xs, ys)
            outs.append(ys)
            np.testing.assert_allclose(ys, _softmax_ref(xs), rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(outs[0], outs[2])
        nbytes = xs.nbytes  # device arrays (zero copy) through __cuda_array_interface__
        dx, dy = mod._alloc(nbytes), mod._alloc(nbytes)
        try:
            rt.check(cu.cuMemcpyHtoD(dx, xs.ctypes.data, nbytes), "cuMemcpyHtoD")
            for fast in (False, True, True):
                mod.fast_path = fast
                rt.check(cu.cuMemcpyHtoD(dy, np.full_like(xs, np.nan).ctypes.data, nbytes), "cuMemcpyHtoD")
                mod(FakeDeviceArray(shape, ptr=int(dx)), FakeDeviceArray(shape, ptr=int(dy)))
                rt.check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
                back = np.empty_like(xs)
                rt.check(cu.cuMemcpyDtoH(back.ctypes.data, dy, nbytes), "cuMemcpyDtoH")
                np.testing.assert_array_equal(back, outs[0])
        finally:
            cu.cuMemFree(dx)
            cu.cuMemFree(dy)
    mod.fast_path = True


class _TorchDtype:
    def __init__(self, name: str) -> None:
        self.name = name

    def __str__(self) -> str:
        return f"torch.{self.name}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _TorchDtype) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)


class _FakeCudaTensor:
    """Enough of a torch CUDA tensor for classify and the fast path's signature (torch is not installed here)."""

    def __init__(self, shape, dtype="float32", device=0, contiguous=True, ptr=None):
        self.shape, self.dtype, self.is_cuda = tuple(shape), _TorchDtype(dtype), True
        self.device = types.SimpleNamespace(index=device, type="cuda")
        self._contiguous, self._ptr = contiguous, ptr if ptr is not None else FakeDeviceArray(shape).ptr

    def is_contiguous(self) -> bool:
        return self._contiguous

    def stride(self) -> tuple[int, ...]:
        return (1, self.shape[0]) if not self._contiguous else (self.shape[1], 1)

    def data_ptr(self) -> int:
        return self._ptr

    def get_device(self) -> int:
        return self.device.index


_FakeCudaTensor.__module__ = "torch"


@pytest.fixture(params=["raw", "stream"])
def fake_torch(monkeypatch, request):
    """torch's current stream per device, read through `torch._C._cuda_getCurrentRawStream(index)` ("raw", as
    torch's own generated code does) or, where that is missing, `torch.cuda.current_stream(device or index)`."""
    streams = {0: 0x51, 1: 0x52}
    current = types.SimpleNamespace(device=0)
    mod = types.ModuleType("torch")
    index = lambda dev: getattr(dev, "index", dev)  # noqa: E731
    mod.cuda = types.SimpleNamespace(
        current_stream=lambda dev: types.SimpleNamespace(cuda_stream=streams[index(dev)] + current.device))
    mod._C = types.SimpleNamespace()
    if request.param == "raw":
        mod._C._cuda_getCurrentRawStream = lambda i: streams[i] + current.device
    monkeypatch.setitem(sys.modules, "torch", mod)
    return current


def test_cuda_fast_path_with_torch_tensors(stub, fake_torch, cuda_fixed):
    mod = _fresh(cuda_fixed)
    a = (_FakeCudaTensor((64, 100)), _FakeCudaTensor((64, 100)))
    full = _launches(stub, mod, a, False)
    assert _launches(stub, mod, a, True) == _launches(stub, mod, a, True) == full
    assert full[0][4] == 0x51  # torch's current stream
    fake_torch.device = 7  # the user switched streams: the fast path launches on the new one
    assert _launches(stub, mod, a, True)[0][4] == 0x58 == _launches(stub, mod, a, False)[0][4]
    good = lambda: a  # noqa: E731
    for bad, err in [(lambda: (a[0], _FakeCudaTensor((64, 100), contiguous=False)), ArgumentError),
                     (lambda: (a[0], _FakeCudaTensor((64, 100), device=1)), ArgumentError),
                     (lambda: (a[0], _FakeCudaTensor((64, 100), dtype="float64")), ArgumentTypeError),
                     (lambda: (a[0], _FakeCudaTensor((64, 101))), ArgumentError)]:
        _both_paths_refuse(mod, good, bad, err)


def test_cuda_dynamic_shared_memory_on_the_fast_path(stub):
    """A row cache in dynamic shared memory: above 48 KiB the first call opts in (once); a remembered call
    launches with the same bytes and asks the driver nothing; a row beyond the device is still refused."""
    from schedules import auto_schedule

    n, m = te.var("n"), te.var("m")
    x, y = softmax(n, m)
    mod = build(auto_schedule([y], "cuda", sizes={"n": 64, "m": 4096}), [x, y], target="cuda", arch="sm_90")
    asked = []
    for name in ("cuFuncSetAttribute", "cuFuncGetAttribute", "cuDeviceGetAttribute"):
        real = getattr(stub, name)
        setattr(stub, name, lambda *a, real=real, name=name: asked.append(name) or real(*a))
    a = (FakeDeviceArray((2, 20000)), FakeDeviceArray((2, 20000)))
    full = _launches(stub, mod, a, False)
    assert asked.count("cuFuncSetAttribute") == 1 and max(c[3] for c in full) >= 80000
    asked.clear()
    assert _launches(stub, mod, a, True) == _launches(stub, mod, a, True) == full
    assert asked == []  # the opt-in and the limits are asked once per (device, kernel)
    big = (FakeDeviceArray((2, 70000)), FakeDeviceArray((2, 70000)))
    _both_paths_refuse(mod, lambda: a, lambda: big, rt.SharedMemoryError)


def test_a_plans_parameter_block_holds_each_parameter_as_the_driver_reads_it():
    """A recorded launch's parameters packed once (`ParamBlock`): slot j at the address params[j] holds parameter j
    in its C type's bytes (a pointer, a 32-bit and a 64-bit size, a negative 32-bit value); rewriting a pointer's
    slot changes that parameter alone."""
    import ctypes

    block = ParamBlock((0x7F00_0000_1000, 3000, -5, 2**40 + 3),
                           (ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_longlong))
    p = list(block.params)
    assert [ctypes.c_void_p.from_address(p[0]).value, ctypes.c_int.from_address(p[1]).value,
            ctypes.c_int.from_address(p[2]).value, ctypes.c_longlong.from_address(p[3]).value] == \
        [0x7F00_0000_1000, 3000, -5, 2**40 + 3]
    block.slots[0] = 0x7F00_0000_2000
    assert ctypes.c_void_p.from_address(p[0]).value == 0x7F00_0000_2000
    assert ctypes.c_int.from_address(p[1]).value == 3000 and ctypes.c_longlong.from_address(p[3]).value == 2**40 + 3
