"""The GEMM kernel's code generation levers: 32-bit index arithmetic where every size provably fits, the
software-pipelined (cp.async, two-stage) shared tile copies, and __launch_bounds__."""

from __future__ import annotations

import numpy as np
import pytest

import codegen.cuda.kernel as cg
import codegen.passes.staging as staging
from codegen.passes import lower as lower_cuda
from codegen.passes.launch import fits_int32
from loopir import ir
from loopir import workloads as w
from loopir.lower import lower
from schedules import Schedule
from schedules.recipes import schedule_gemm_cuda


def _program(n=None, m=None, p=None, **kw):
    wl = w.matmul_bias_relu(n=n, m=m, p=p)
    s = Schedule(lower(list(wl.outputs), list(wl.inputs) + list(wl.outputs)))
    schedule_gemm_cuda(s, **kw)
    return wl, s


def _compile(src):
    from codegen.cuda.nvrtc import compile_cubin

    assert compile_cubin(src, "sm_90", use_cache=False)


def test_constant_sizes_use_int_indices_symbolic_sizes_keep_64_bit():
    _, s = _program(257, 129, 65)
    src = cg.generate_cuda(lower_cuda(s.program, "cuda")).source
    assert "const int i_o = (int)blockIdx.y;" in src and "long long i_o" not in src
    _compile(src)
    _, s = _program()
    src = cg.generate_cuda(lower_cuda(s.program, "cuda")).source
    assert "const long long i_o = (long long)blockIdx.y;" in src and "const long long n" in src
    _compile(src)


def test_int_indices_refused_when_a_padded_size_passes_2_pow_31():
    b = ir.Builder("big")
    x = ir.buffer((46341, 46341), "float32", "X")  # 46341^2 > 2^31 elements
    with b.loop("i", 0, 46341) as i:
        b.store(x, (i, i), x[i, i] * 2.0, name="S")
    prog = b.finish([x])
    assert not fits_int32(prog.body)
    s = Schedule(prog)
    io, ii = s.split(s.loops("S")[0], 128)
    s.bind(io, "blockIdx.x").bind(ii, "threadIdx.x")
    src = cg.generate_cuda(lower_cuda(s.program, "cuda")).source
    assert "long long i_o" in src and "(int)" not in src
    small = ir.buffer((1000, 1000), "float32", "Y")
    b2 = ir.Builder("small")
    with b2.loop("i", 0, 1000) as i:
        b2.store(small, (i, i), small[i, i] * 2.0, name="S")
    assert fits_int32(b2.finish([small]).body)


def test_int_indices_mixed_with_int64_data_compile():
    from loopir.nodes import binary

    b = ir.Builder("mix")
    x = ir.buffer((1000,), "int64", "X")
    y = ir.buffer((1000,), "int64", "Y")
    with b.loop("i", 0, 1000) as i:
        b.store(y, (i,), binary("max", x[i], i) + binary("floordiv", x[i], i + 1) + binary("mod", i, x[i]), name="S")
    s = Schedule(b.finish([x, y]))
    io, ii = s.split(s.loops("S")[0], 128)
    s.bind(io, "blockIdx.x").bind(ii, "threadIdx.x")
    src = cg.generate_cuda(lower_cuda(s.program, "cuda")).source
    assert "const int i = ((i_o * 128) + i_i);" in src and "loopir_max(X[i], i)" in src
    _compile(src)  # (long long, int) overloads: no ambiguity


def test_shared_tiles_are_double_buffered_with_cp_async():
    _, s = _program(256, 256, 64, block=(128, 128), k_tile=16)
    src = cg.generate_cuda(lower_cuda(s.program, "cuda")).source
    assert "software-pipelined" in src and src.count("cooperative copy") == 4
    assert "__shared__ __align__(16) float A_shared_stages[4096];  // 2 stages of A_shared" in src
    assert "cp.async.wait_group 1;" in src and "loopir_cp_async16(" in src
    # the compute reads the stage of this iteration; the next copy writes the other one
    assert "float* A_shared = A_shared_stages + ((k_o - (0)) & 1) * 2048;" in src
    assert "A_shared_stages + (((k_o + 1) - (0)) & 1) * 2048;" in src
    _compile(src)


def test_pipelining_off_and_too_large_stages_give_the_plain_copy(monkeypatch):
    # 2 stages of 2 x 16 KiB would pass the 48 KiB of static shared memory
    _, s = _program(256, 256, 64, block=(128, 128), k_tile=32)
    src = cg.generate_cuda(lower_cuda(s.program, "cuda")).source
    assert "software-pipelined" not in src and "cp_async16(" not in src.split("extern")[1]
    assert "__shared__ __align__(16) float A_shared[4096]" in src
    _compile(src)
    monkeypatch.setattr(staging, "PIPELINE_SHARED_COPIES", False)
    _, s = _program(256, 256, 64, k_tile=16)
    src = cg.generate_cuda(lower_cuda(s.program, "cuda")).source
    assert "software-pipelined" not in src and "reinterpret_cast<const float4*>(&A[" in src


def test_launch_bounds_knob(monkeypatch):
    monkeypatch.setattr(cg, "LAUNCH_MIN_BLOCKS", 2)
    _, s = _program(257, 129, 65, block=(128, 128))
    src = cg.generate_cuda(lower_cuda(s.program, "cuda")).source
    assert '__global__ void __launch_bounds__(256, 2) C_matmul_init(' in src
    _compile(src)


def test_copy_source_written_in_the_kernel_is_not_pipelined():
    # a kernel that also writes A: copying A's next tile one iteration early could read a stale value
    import dataclasses

    from loopir.nodes import For, Seq, Store, const

    wl, s = _program(256, 256, 64, k_tile=16)
    a = wl.inputs[0].buffer

    def add_write(st):
        if isinstance(st, For) and st.thread == "threadIdx.x":
            w_ = Store("W", a, (st.var, const(0)), const(1.0, "float32"), (), ())
            return dataclasses.replace(st, body=Seq((st.body, w_)))
        if isinstance(st, For):
            return dataclasses.replace(st, body=add_write(st.body))
        return st

    from codegen.passes.barriers import CrossBlockRaceError
    from codegen.passes.kernels import split_kernels
    from codegen.passes.launch import plan_kernels
    from codegen.passes.staging import plan_staging
    from loopir.nodes import Kernel
    from loopir.visit import walk

    prog = dataclasses.replace(s.program, body=add_write(s.program.body))
    planned = plan_staging(plan_kernels(split_kernels(prog)))
    (k,) = [n for n in walk(planned.body) if isinstance(n, Kernel)]
    assert not k.pipelined
    # and the whole pipeline refuses the program: every block writes A while other blocks read it
    with pytest.raises(CrossBlockRaceError, match="'A'"):
        lower_cuda(prog, "cuda")
    assert "software-pipelined" in cg.generate_cuda(lower_cuda(s.program, "cuda")).source


@pytest.mark.gpu
@pytest.mark.parametrize("min_blocks", [None, 2])
def test_gpu_symbolic_sizes_pipelined(min_blocks, monkeypatch):
    from codegen import build

    monkeypatch.setattr(cg, "LAUNCH_MIN_BLOCKS", min_blocks)
    wl, s = _program(k_tile=16)
    mod = build(s, list(wl.inputs) + list(wl.outputs), target="cuda")
    assert "software-pipelined" in mod.source and "long long" in mod.source
    for n, m, p in [(257, 129, 65), (300, 200, 160)]:
        rng = np.random.default_rng(n)
        a = rng.standard_normal((n, p)).astype(np.float32)
        bb = rng.standard_normal((p, m)).astype(np.float32)
        bias = rng.standard_normal(m).astype(np.float32)
        out = np.full((n, m), np.nan, np.float32)
        mod(a, bb, bias, out)
        ref = np.maximum(a.astype(np.float64) @ bb + bias, 0.0)
        assert not np.isnan(out).any()
        assert np.abs(out - ref).max() / np.abs(ref).max() < 1e-4
