"""The tiled GEMM recipe: one kernel for relu(A @ B + bias), numerics at sizes the tiles do not divide."""

from __future__ import annotations

import numpy as np
import pytest

from loopir import interp
from loopir import workloads as w
from loopir.lower import lower
from schedules import Schedule
from schedules.recipes import elementwise_consumers, matmul_stage, schedule_gemm


def _sched(n, m, p, target, **kw):
    wl = w.matmul_bias_relu(n=n, m=m, p=p)
    s = Schedule(lower(list(wl.outputs), list(wl.inputs) + list(wl.outputs)))
    plan = schedule_gemm(s, target=target, **kw)
    return wl, s, plan


def _data(n, m, p, seed=1):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, p)).astype(np.float32), rng.standard_normal((p, m)).astype(np.float32),
            rng.standard_normal(m).astype(np.float32))


def test_finds_the_matmul_and_its_epilogue():
    wl = w.matmul_bias_relu(n=8, m=8, p=8)
    p = lower(list(wl.outputs), list(wl.inputs) + list(wl.outputs))
    assert matmul_stage(p) == ["matmul"]
    assert elementwise_consumers(p, "matmul") == ["C"]


@pytest.mark.parametrize("target", ["cuda", "cpu"])
def test_scheduled_program_numerics_interp(target):
    n, m, p = 37, 45, 13
    wl, s, plan = _sched(n, m, p, target, block=(32, 32), thread_tile=(4, 4), k_tile=4, cpu_tile=(8, 16))
    assert plan.epilogue == ["C"]
    a, b, bias = _data(n, m, p)
    out = np.full((n, m), np.nan, np.float32)
    interp.run(s.program, a, b, bias, out)
    np.testing.assert_allclose(out, wl.reference(a, b, bias)[0], rtol=1e-4, atol=1e-4)


def test_cuda_one_kernel_compiles_with_nvrtc():
    from codegen import build

    wl, s, plan = _sched(257, 129, 65, "cuda")
    mod = build(s, list(wl.inputs) + list(wl.outputs), target="cuda")
    assert len(mod.kernels) == 1
    assert "matmul_local" in mod.source and "#pragma unroll" in mod.source


@pytest.mark.parametrize("shape", [(257, 129, 65), (100, 70, 33)])
def test_cpu_build_numerics_non_dividing(shape):
    from codegen import build

    n, m, p = shape
    wl, s, _ = _sched(n, m, p, "cpu")
    mod = build(s, list(wl.inputs) + list(wl.outputs), target="cpu")
    assert len(mod.kernels) == 1
    a, b, bias = _data(n, m, p)
    out = np.full((n, m), np.nan, np.float32)
    mod(a, b, bias, out)
    ref = wl.reference(a, b, bias)[0]
    assert np.abs(out - ref).max() / np.abs(ref).max() < 1e-4


def test_bad_tiles():
    with pytest.raises(ValueError, match="thread_tile"):
        _sched(16, 16, 16, "cuda", block=(128, 128), thread_tile=(7, 8))
    with pytest.raises(ValueError, match="k_tile"):
        _sched(16, 16, 16, "cuda", k_tile=0)
    with pytest.raises(ValueError, match="target"):
        _sched(16, 16, 16, "tpu")


@pytest.mark.parametrize("tiles", [{}, {"block": (32, 32), "thread_tile": (4, 4), "k_tile": 4, "strided": True}])
def test_cuda_is_the_one_recipe_of_schedule_gemm_cuda(tiles):
    from schedules.recipes import schedule_gemm_cuda

    wl, s, plan = _sched(257, 129, 65, "cuda", **tiles)
    s2 = Schedule(lower(list(wl.outputs), list(wl.inputs) + list(wl.outputs)))
    plan2 = schedule_gemm_cuda(s2, **tiles)
    assert str(s.program) == str(s2.program) and plan.steps == plan2.steps and plan.staged == ["A", "B"]
    if not tiles:  # the measured-best defaults: block 64 x 128, k_tile 16
        assert "split i by 64, j by 128" in plan.explain() and "split k by 16" in plan.explain()


def test_cuda_options_refused_on_cpu_and_bad_cpu_tile():
    with pytest.raises(ValueError, match="strided"):
        _sched(16, 16, 16, "cpu", strided=True)
    with pytest.raises(ValueError, match="cpu_tile"):
        _sched(16, 16, 16, "cpu", cpu_tile=(0, 8))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(257, 129, 65), (1000, 1000, 1000)])
def test_gpu_numerics_non_dividing(shape):
    from codegen import build

    n, m, p = shape
    wl, s, _ = _sched(n, m, p, "cuda")
    mod = build(s, list(wl.inputs) + list(wl.outputs), target="cuda")
    a, b, bias = _data(n, m, p)
    out = np.full((n, m), np.nan, np.float32)
    mod(a, b, bias, out)
    ref = wl.reference(a, b, bias)[0]
    assert np.abs(out - ref).max() / np.abs(ref).max() < 1e-4


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_no_matmul_stage_is_refused_naming_the_recipe(target):
    """A program without a matmul-shaped reduction: both recipes refuse, naming themselves and what they found."""
    from loopir import workloads
    from schedules import Schedule
    from schedules.recipes import schedule_gemm
    from schedules.recipes import schedule_gemm_cuda

    s = Schedule(list(workloads.softmax().outputs))
    with pytest.raises(ValueError, match=r"schedule_gemm(_cuda)?: expected one matmul-shaped reduction, found none"):
        if target == "cpu":
            schedule_gemm(s, target="cpu")
        else:
            schedule_gemm_cuda(s)
