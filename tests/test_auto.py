"""auto_schedule: one kernel per workload when fused, numerics on the CPU target and through the
interpreter, NVRTC compilation of the CUDA mapping (no GPU needed), and the GPU run when present."""

from __future__ import annotations

import re

import numpy as np
import pytest
from test_fusion import five, gelu_chain

from codegen import build
from codegen.build import with_args
from loopir import interp
from schedules import Schedule, auto_schedule

SIZES = {"n": 37, "m": 5}
NAMES = ["sincos", "gelu", "horizontal", "softmax", "layernorm"]


def _arrays(ins, outs, rng):
    def shape(t):
        return tuple(SIZES[d.name] if hasattr(d, "name") else int(d.value) for d in t.shape)

    xs = [rng.standard_normal(shape(t)).astype(t.dtype) for t in ins]
    ys = [np.full(shape(t), np.nan, dtype=t.dtype) for t in outs]
    return xs, ys


def _check(ys, ref, xs, rtol=1e-4):
    for got, want in zip(ys, ref(*xs)):
        assert not np.isnan(got).any()
        np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_cuda_build_is_one_kernel_fused_several_unfused(name):
    ins, outs, _, nstages = five()[name]
    mod = build(auto_schedule(outs, target="cuda"), ins + outs, target="cuda")  # NVRTC compiles here
    assert len(mod.kernels) == 1
    assert "__global__" in mod.source
    unfused = build(auto_schedule(outs, target="cuda", fuse=False), ins + outs, target="cuda")
    assert len(unfused.kernels) == nstages > 1


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("fuse", [True, False])
def test_cpu_results_match_numpy(name, fuse):
    ins, outs, ref, nstages = five()[name]
    mod = build(auto_schedule(outs, target="cpu", fuse=fuse), ins + outs, target="cpu")
    assert len(mod.kernels) == (1 if fuse else nstages)
    xs, ys = _arrays(ins, outs, np.random.default_rng(1))
    mod(*xs, *ys)
    _check(ys, ref, xs)


@pytest.mark.parametrize("name", NAMES)
def test_cuda_schedule_interpreted_matches_numpy(name):
    ins, outs, ref, _ = five()[name]
    s = auto_schedule(outs, target="cuda")
    xs, ys = _arrays(ins, outs, np.random.default_rng(2))
    interp.run(with_args(s.program, ins + outs), *xs, *ys)
    _check(ys, ref, xs)


def test_softmax_mapping_uses_cross_thread_reductions_and_is_recorded():
    ins, outs, _, _ = five()["softmax"]
    s = auto_schedule(outs, target="cuda")
    steps = [t["primitive"] for t in s.trace]
    assert steps.count("fuse") == 2 and steps.count("bind_reduction") == 2
    text = str(s)
    assert "# blockIdx.x" in text and "# threadIdx.x" in text
    src = build(s, ins + outs, target="cuda").source
    assert "loopir_block_allreduce" in src
    # the trace replays onto a fresh schedule and gives the same nest
    again = Schedule.replay(s.trace_json(), outs)
    assert str(again) == str(s)


def test_elementwise_mapping_vectorizes_when_provably_aligned():
    ins, outs, _ = gelu_chain(m=8, n=64)
    s = auto_schedule(outs, target="cuda")
    assert "vectorize" in [t["primitive"] for t in s.trace]
    src = build(s, ins + outs, target="cuda").source
    assert "float4" in src and "% 4 == 0" not in src  # alignment proven: no run-time size check
    # symbolic m, n: the pointwise rows collapse into one flat index f (x[f // n, f % n] is x[f]), so the float4
    # base is a multiple of 4 whatever n is: no run-time test of n % 4, only of the last lane against m * n
    ins2, outs2, _ = gelu_chain()
    s2 = auto_schedule(outs2, target="cuda")
    assert "vectorize" in [t["primitive"] for t in s2.trace] and "collapse" in [t["primitive"] for t in s2.trace]
    src2 = build(s2, ins2 + outs2, target="cuda").source
    assert "float4" in src2 and "% 4 == 0" not in src2 and "+ 3) < (m * n))" in src2  # 32-bit generic indices
    loads = [ln for ln in src2.splitlines() if "reinterpret_cast<const float4*>" in ln]
    assert loads and not any("loopir_floordiv" in ln or "loopir_mod" in ln for ln in loads)  # a flat index


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(3, 1024), (3, 1027), (2, 5), (1, 8)])
def test_gpu_symbolic_sizes_vector_path_and_fallback(shape):
    ins, outs, ref = gelu_chain()
    mod = build(auto_schedule(outs, target="cuda"), ins + outs, target="cuda")
    rng = np.random.default_rng(6)
    xs = [rng.standard_normal(shape).astype(np.float32)]
    ys = [np.full(shape, np.nan, np.float32)]
    mod(*xs, *ys)
    _check(ys, ref, xs)


def test_plain_tensors_to_build_use_auto_schedule():
    ins, outs, ref, _ = five()["layernorm"]
    assert len(build(outs, ins + outs, target="cuda").kernels) == 1
    mod = build(outs, ins + outs, target="cpu")
    xs, ys = _arrays(ins, outs, np.random.default_rng(3))
    mod(*xs, *ys)
    _check(ys, ref, xs)


def test_plan_is_attached_and_threads_validated():
    _, outs, _, _ = five()["sincos"]
    s = auto_schedule(outs, target="cpu")
    assert s.plan.kernels == 1 and "y" in s.plan.explain()
    with pytest.raises(ValueError, match="threads"):
        auto_schedule(outs, threads=100)


@pytest.mark.gpu
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("fuse", [True, False])
def test_gpu_results_match_numpy(name, fuse):
    ins, outs, ref, _ = five()[name]
    mod = build(auto_schedule(outs, target="cuda", fuse=fuse), ins + outs, target="cuda")
    xs, ys = _arrays(ins, outs, np.random.default_rng(4))
    mod(*xs, *ys)
    _check(ys, ref, xs)


# ----------------------------------------------------------------------------- sizes known at build time


def _const_cases():
    from loopir import workloads as W

    return {
        "sincos U=2": (W.sincos(4 * 256 * 2 * 3 + 8), {"per_thread": 2}),  # non-dividing: guarded chunks
        "gelu 2-D": (W.gelu(m=3, n=1024 + 4), {}),
        "horizontal 2-D U=2": (W.horizontal(m=3, n=2048), {"per_thread": 2}),
        "softmax": (W.softmax(5, 1024 + 8), {}),
        "layernorm": (W.layernorm(4, 512), {"threads": 128}),
    }


def _run_const(wl, sched, target, xs_seed=5):
    mod = build(sched, list(wl.args), target=target)
    sizes = {}
    rng = np.random.default_rng(xs_seed)
    ins = wl.random_inputs(sizes, rng)
    outs = wl.empty_outputs(sizes)
    mod(*wl.call_args(ins, outs))
    for got, want in zip(outs, wl.reference(*ins)):
        assert not np.isnan(got).any()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    return mod


@pytest.mark.parametrize("case", list(_const_cases()))
def test_constant_sizes_vectorize_and_interpret_correctly(case):
    wl, kw = _const_cases()[case]
    s = auto_schedule(list(wl.outputs), target="cuda", **kw)
    src = build(s, list(wl.args), target="cuda").source
    assert "float4" in src  # 128-bit accesses: flat kernels, several outputs, the row copy and epilogue
    if "horizontal" in case:
        assert "y_relu, y_sigmoid, y_tanh: 128-bit vector" in src
    if case in ("softmax", "layernorm"):
        assert "x_shared: 128-bit vector" in src and "y: 128-bit vector" in src
    if "sincos" in case:
        assert "sincosf(x_v.x, &" in src  # one sincosf per lane, not sinf and cosf
    # the mapped program, run by the interpreter, computes the workload
    sizes: dict = {}
    ins = wl.random_inputs(sizes, 1)
    outs = wl.empty_outputs(sizes)
    interp.run(s.program, *wl.call_args(ins, outs))
    for got, want in zip(outs, wl.reference(*ins)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_per_thread_chunks_are_coalesced_and_validated():
    from loopir import workloads as W

    wl = W.sincos(4096)
    s = auto_schedule(list(wl.outputs), target="cuda", per_thread=4)
    assert [t["primitive"] for t in s.trace].count("reorder") == 1
    src = build(s, list(wl.args), target="cuda").source
    # chunk u of thread t in block b starts at ((b * 4 + u) * 128 + t) * 4: coalesced across the block
    assert "#pragma unroll" in src and re.search(r"\* 4(LL)?\) \+ i_o_o_i\) \* 128(LL)?\) \+ i_o_i\)", src)
    for bad in (0, 17, 2.0, True):
        with pytest.raises(ValueError, match="per_thread"):
            auto_schedule(list(wl.outputs), target="cuda", per_thread=bad)


def test_vector_stores_refused_when_one_output_feeds_another():
    from loopir import ir
    from loopir.nodes import Seq

    b = ir.Builder("chain")
    x = ir.buffer((64,), name="x")
    y = ir.buffer((64,), name="y")
    z = ir.buffer((64,), name="z")
    with b.loop("i", 0, 64) as i:
        b.store(y, (i,), x[i] * 2.0, name="Y")
        b.store(z, (i,), y[i] + 1.0, name="Z")
    p = b.finish([x, y, z])
    s = Schedule(p)
    (i,) = s.loops("Y")
    io, lane = s.split(i, 4)
    s.vectorize(lane)
    bo, ti = s.split(io, 16)
    s.bind(bo, "blockIdx.x").bind(ti, "threadIdx.x")
    assert isinstance(s.program.body, type(s.program.body)) and not isinstance(s.program.body, Seq)
    src = build(s, [x, y, z], target="cuda").source
    assert "float4" not in src  # Z reads y, written by Y in the same lane loop: scalar code
    xs = np.random.default_rng(0).standard_normal(64).astype(np.float32)
    ys, zs = np.full(64, np.nan, np.float32), np.full(64, np.nan, np.float32)
    interp.run(s.program, xs, ys, zs)
    np.testing.assert_allclose(zs, xs * 2 + 1, rtol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(_const_cases()))
def test_gpu_constant_sizes_match_numpy(case):
    wl, kw = _const_cases()[case]
    mod = _run_const(wl, auto_schedule(list(wl.outputs), target="cuda", **kw), "cuda")
    assert len(mod.kernels) == 1
