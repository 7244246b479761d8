"""ReLU(A @ B + bias) with float16 inputs and float32 accumulation (issue 7): written in te with
casts, scheduled by auto_schedule's GEMM recipe, one kernel on both targets, checked against a
float64 reference of the same (float16-rounded) inputs."""

from __future__ import annotations

import numpy as np
import pytest

from codegen import build
from loopir import te
from schedules import auto_schedule


def _fp16_gemm(n, m, p):
    A = te.placeholder((n, p), "float16", name="A")
    B = te.placeholder((p, m), "float16", name="B")
    bias = te.placeholder((m,), "float32", name="bias")
    k = te.reduce_axis(p, name="k")
    mm = te.compute((n, m), lambda i, j: te.sum(te.cast("float32", A[i, k]) * te.cast("float32", B[k, j]), axis=k),
                    name="matmul")
    C = te.compute((n, m), lambda i, j: te.maximum(mm[i, j] + bias[j], 0.0), name="C")
    return A, B, bias, C


def _check(mod, n, m, p, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, p)).astype(np.float16)
    b = rng.standard_normal((p, m)).astype(np.float16)
    bias = rng.standard_normal(m).astype(np.float32)
    c = np.full((n, m), np.nan, np.float32)
    mod(a, b, bias, c)
    ref = np.maximum(a.astype(np.float64) @ b.astype(np.float64) + bias, 0.0)
    assert not np.isnan(c).any()
    err = float(np.abs(c - ref).max() / np.abs(ref).max())
    assert err < 1e-4, err


@pytest.mark.parametrize("shape", [(257, 129, 65), (100, 70, 33)])
def test_fp16_inputs_fp32_accumulation_cpu(shape):
    A, B, bias, C = _fp16_gemm(*shape)
    s = auto_schedule([C], target="cpu")
    assert "GEMM group" in s.plan.explain()
    mod = build(s, [A, B, bias, C], target="cpu")
    assert len(mod.kernels) == 1
    _check(mod, *shape)


def test_fp16_inputs_fp32_accumulation_cuda_compiles_one_kernel():
    A, B, bias, C = _fp16_gemm(257, 129, 65)
    s = auto_schedule([C], target="cuda")
    assert "GEMM group" in s.plan.explain()
    mod = build(s, [A, B, bias, C], target="cuda")  # NVRTC: no GPU needed
    assert len(mod.kernels) == 1
    src = mod.source
    # the half tiles are staged in shared memory as 16-bit words, in two stages (software-pipelined); the
    # accumulator is float
    assert "unsigned short A_shared_stages[" in src and "unsigned short B_shared_stages[" in src
    assert "float matmul_local[" in src


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(257, 129, 65), (1000, 1000, 1000)])
def test_fp16_inputs_fp32_accumulation_gpu(shape):
    A, B, bias, C = _fp16_gemm(*shape)
    mod = build([C], [A, B, bias, C], target="cuda")
    assert len(mod.kernels) == 1
    _check(mod, *shape)
