"""CUDA target on a GPU: seed workloads with hand-written bound schedules against numpy, device
arrays zero-copy (PyTorch, CuPy), numpy arrays copied, argument checks on device arrays."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from test_cuda_helpers import bind_elementwise, bind_rows, fuse_rows

from codegen.cuda.build import build_cuda
from loopir import nodes as N
from loopir import workloads as W

pytestmark = pytest.mark.gpu

SIZES = {"n": 1000, "m": 37, "p": 19, "d": 16}

SCHEDULES = [
    ("sincos", bind_elementwise), ("gelu", bind_elementwise), ("horizontal", bind_elementwise),
    ("softmax", bind_rows), ("softmax", fuse_rows), ("layernorm", bind_rows), ("layernorm", fuse_rows),
    ("matmul_bias_relu", bind_elementwise), ("attention", bind_elementwise), ("stencil5", bind_elementwise),
]


def _run_workload(wl, sched, dtype_tol=None):
    p = sched(wl.program())
    mod = build_cuda(p)
    sizes = {v.name: SIZES.get(v.name, 50) for v in wl.sizes}
    if wl.name in ("softmax", "layernorm"):
        sizes = {"m": 37, "n": 1000}
    rng = np.random.default_rng(7)
    ins = wl.random_inputs(sizes, rng)
    outs = wl.empty_outputs(sizes)
    mod(*wl.call_args(ins, outs))
    ref = wl.reference(*ins)
    tol = dtype_tol or wl.tolerance
    for o, r in zip(outs, ref):
        np.testing.assert_allclose(o.astype(np.float64), r.astype(np.float64), rtol=tol * 10, atol=tol * 10)
    return mod


@pytest.mark.parametrize("name,sched", SCHEDULES, ids=[f"{n}-{s.__name__}" for n, s in SCHEDULES])
def test_seed_matches_numpy(name, sched):
    mod = _run_workload(W.SEEDS[name](), sched)
    if sched is fuse_rows:
        assert len(mod.kernels) == 1


def test_float16_gelu():
    _run_workload(W.gelu(dtype="float16"), bind_elementwise, dtype_tol=2e-3)


def test_non_dividing_sizes_and_odd_block():
    wl = W.softmax()
    mod = build_cuda(fuse_rows(wl.program(), threads=100))
    x = np.random.default_rng(1).standard_normal((5, 333)).astype(np.float32)
    y = np.full_like(x, np.nan)
    mod(x, y)
    np.testing.assert_allclose(y, wl.reference(x)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cols", [64, 66])
def test_vectorized_float4_and_fallback(cols):
    from test_cuda import _vector_program

    mod = build_cuda(_vector_program(True))
    rng = np.random.default_rng(2)
    x = rng.standard_normal((9, cols)).astype(np.float32)
    b = rng.standard_normal(cols).astype(np.float32)
    y = np.full_like(x, np.nan)
    if cols % 4:  # j_o covers n // 4 groups: the tail is not written by this program
        mod(x, b, y)
        np.testing.assert_allclose(y[:, : cols - 2], (np.exp(x) + 2 * b)[:, : cols - 2], rtol=1e-5, atol=1e-6)
    else:
        mod(x, b, y)
        np.testing.assert_allclose(y, np.exp(x) + 2 * b, rtol=1e-5, atol=1e-6)


def _axpy_inplace():
    n = N.Var("n")
    x = N.Buffer("x", (n,), "float32")
    y = N.Buffer("y", (n,), "float32")
    i = N.Var("i")
    st = N.Store("y", y, (i,), y[i] * 2.0 + x[i], (i,), (i,))
    return bind_elementwise(N.Program("axpy", (x, y), N.For(i, N.const(0), n, st), (), (n,)))


def test_torch_zero_copy_in_place():
    torch = pytest.importorskip("torch")
    mod = build_cuda(_axpy_inplace())
    x = torch.randn(4097, device="cuda")
    y = torch.randn(4097, device="cuda")
    before = y.clone()
    ptr = y.data_ptr()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):  # launched on the caller's current stream
        mod(x, y)
    s.synchronize()
    assert y.data_ptr() == ptr
    torch.testing.assert_close(y, before * 2 + x)
    ms = mod.benchmark(x, y)
    assert ms > 0


def test_a_prepared_call_launched_three_times_runs_three_times():
    """The first `launch` of a prepared call records its launches and the later ones replay them: y = 2 y + x in
    place, three launches, is 8 y + 7 x (a replay that launched nothing, or twice, would show)."""
    mod = build_cuda(_axpy_inplace())
    rng = np.random.default_rng(5)
    x = rng.standard_normal(3001).astype(np.float32)
    y = rng.standard_normal(3001).astype(np.float32)
    want = y.astype(np.float64) * 8 + x.astype(np.float64) * 7
    p = mod.prepare((x, y))
    for _ in range(3):
        mod.launch(p)
    mod.finish(p)
    assert p.replay is not None
    np.testing.assert_allclose(y, want, rtol=1e-5)


def test_torch_errors():
    torch = pytest.importorskip("torch")
    mod = build_cuda(_axpy_inplace())
    x = torch.randn(64, device="cuda")
    y = torch.randn(128, device="cuda")[::2]
    with pytest.raises(ValueError, match="'y'.*non-contiguous"):
        mod(x, y)
    with pytest.raises(TypeError, match="'y'"):
        mod(x, torch.randn(64, device="cuda", dtype=torch.float64))
    if torch.cuda.device_count() > 1:
        with pytest.raises(ValueError, match="device"):
            mod(x, torch.randn(64, device="cuda:1"))


def test_cupy_zero_copy_in_place():
    cp = pytest.importorskip("cupy")
    mod = build_cuda(_axpy_inplace())
    x = cp.random.standard_normal(1000, dtype=cp.float32)
    y = cp.random.standard_normal(1000, dtype=cp.float32)
    before = y.copy()
    mod(x, y)
    cp.cuda.get_current_stream().synchronize()
    assert bool(cp.allclose(y, before * 2 + x))


def test_numpy_arrays_copied_in_and_out():
    mod = build_cuda(_axpy_inplace())
    rng = np.random.default_rng(3)
    x = rng.standard_normal(777).astype(np.float32)
    y = rng.standard_normal(777).astype(np.float32)
    want = y * 2 + x
    mod(x, y)
    np.testing.assert_allclose(y, want, rtol=1e-6)
    assert mod.benchmark(x, y) > 0


def test_temps_and_several_kernels():
    wl = W.softmax()
    p = bind_rows(wl.program())
    mod = build_cuda(p)
    assert len(mod.kernels) == 3
    x = np.random.default_rng(4).standard_normal((3, 50)).astype(np.float32)
    y = np.full_like(x, np.nan)
    mod(x, y)
    np.testing.assert_allclose(y, wl.reference(x)[0], rtol=1e-5, atol=1e-6)
    x2 = np.random.default_rng(5).standard_normal((6, 20)).astype(np.float32)  # other sizes: new temps
    y2 = np.full_like(x2, np.nan)
    mod(x2, y2)
    np.testing.assert_allclose(y2, wl.reference(x2)[0], rtol=1e-5, atol=1e-6)
    assert dataclasses.is_dataclass(mod.gen)
