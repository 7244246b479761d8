"""auto_schedule: one kernel per workload when fused, numerics on the CPU target and through the
interpreter, NVRTC compilation of the CUDA mapping (no GPU needed), and the GPU run when present."""

from __future__ import annotations

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
    assert "float4" in build(s, ins + outs, target="cuda").source
    ins2, outs2, _ = gelu_chain()  # symbolic n: no proof that 4 divides it, plain loads
    s2 = auto_schedule(outs2, target="cuda")
    assert "vectorize" not in [t["primitive"] for t in s2.trace]


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
