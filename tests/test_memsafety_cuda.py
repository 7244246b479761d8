"""Issue 18 on the CUDA target: one CudaModule called from several threads. Each thread gets its own
device copies of host arrays and its own temporaries (they were keyed by size only, so two threads
shared them). Checked without a GPU through a stand-in driver, and for real where a GPU is present."""

from __future__ import annotations

import itertools
import threading
import types

import numpy as np
import pytest

from codegen import build
from loopir import te
from schedules import Schedule


def _module():
    n = te.var("n")
    x = te.placeholder((n,), name="x")
    a = te.compute((n,), lambda i: x[i] * 2.0, name="a")
    y = te.compute((n,), lambda i: a[i] + 1.0, name="y")
    s = Schedule(y)
    for stage in ("a", "y"):
        (i,) = s.loops(stage)
        io, ii = s.split(i, 64)
        s.bind(io, "blockIdx.x").bind(ii, "threadIdx.x")
    mod = build(s, [x, y], target="cuda")
    assert mod.program.temps, "the test needs a temporary"
    return mod


def _fake_driver():
    ptrs = itertools.count(0x1000, 0x1000)
    ok = (0,)
    return types.SimpleNamespace(
        CUresult=types.SimpleNamespace(CUDA_SUCCESS=0),
        CUstream=lambda h: h,
        cuMemAlloc=lambda nbytes: (0, next(ptrs)),
        cuMemcpyHtoDAsync=lambda *a: ok,
        cuMemFree=lambda p: ok,
    )


def test_prepare_gives_each_thread_its_own_device_buffers(monkeypatch):
    import codegen.cuda.runtime as cr

    mod = _module()
    fake = _fake_driver()
    monkeypatch.setattr(cr, "_driver", lambda: fake)
    monkeypatch.setattr(cr, "device", lambda ordinal=0: cr.Device(0, None, None, "sm_90"))
    got: dict[int, list[dict]] = {}
    barrier = threading.Barrier(2)

    def work(t: int) -> None:
        barrier.wait()
        xa, ya = np.ones(100, np.float32), np.zeros(100, np.float32)
        got[t] = [dict(mod.prepare((xa, ya)).ptrs) for _ in range(2)]

    ts = [threading.Thread(target=work, args=(t,)) for t in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    (a1, a2), (b1, b2) = got[0], got[1]
    assert a1 == a2 and b1 == b2  # reused within a thread
    assert set(a1.values()).isdisjoint(b1.values())  # never shared between threads
    assert len(a1) == 3  # x, y and the temporary a
    mod._host_bufs.clear()
    mod._temps.clear()


@pytest.mark.gpu
def test_two_threads_on_the_gpu_with_a_temporary():
    mod = _module()
    n = 1 << 16
    xs = [np.random.default_rng(k).standard_normal(n).astype(np.float32) for k in range(4)]
    ys = [np.full(n, np.nan, np.float32) for _ in range(4)]
    ts = [threading.Thread(target=lambda j=j: [mod(xs[j], ys[j]) for _ in range(10)]) for j in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for xa, ya in zip(xs, ys):
        np.testing.assert_array_equal(ya, xa * 2 + 1)
