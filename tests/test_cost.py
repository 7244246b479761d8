"""The roofline cost model: device figures, size evaluation, FLOP counting, roofline times."""

from __future__ import annotations

import pytest

from loopir import te
from loopir.nodes import Var, const
from schedules import cost as C


def test_device_defaults_without_gpu_or_queried():
    d = C.device_info("cuda")
    assert d.target == "cuda"
    assert d.bandwidth > 1e11 and d.peak_flops > 1e12 and d.sm_count >= 1
    assert d.smem_per_block >= 16 * 1024 and d.smem_per_block_optin >= d.smem_per_block
    if d.source.startswith("defaults"):  # no GPU here: the measured H200 figures
        assert d.bandwidth == 4.25e12 and d.sm_count == 132 and d.smem_per_block_optin == 227 * 1024
    assert "TB/s" in d.describe() and "SMs" in d.describe()


def test_device_cpu_and_unknown_target():
    c = C.device_info("cpu")
    assert c.target == "cpu" and c.launch_overhead < C.H200.launch_overhead
    with pytest.raises(ValueError, match="tpu"):
        C.device_info("tpu")


def test_size_value_by_var_by_name_and_default():
    n, m = Var("n"), Var("m")
    e = n * 2 + m
    assert C.size_value(e, {n: 10, "m": 3}) == 23
    assert C.size_value(n, {}) == C.DEFAULT_SIZE
    assert C.size_value((n + 7) // 8, {"n": 17}) == 3
    assert C.elements((n, m), {"n": 5, "m": 6}) == 30
    assert C.buffer_bytes((n,), "float16", {"n": 8}) == 16
    with pytest.raises(ValueError, match="cannot evaluate"):
        C.size_value(te.sin(const(1.0)), {})


def test_expr_flops_ignores_index_arithmetic():
    n = te.var("n")
    x = te.placeholder((n,), name="x")
    i = Var("i")
    assert C.expr_flops(x[i + 1] * 2.0) == 1  # the index addition is address arithmetic
    assert C.expr_flops(te.sin(x[i]) + te.cos(x[i])) == 1 + 2 * C.CALL_FLOPS["sin"]


def test_roofline_memory_and_compute_bound():
    d = C.Device("toy", "cuda", bandwidth=1e9, peak_flops=1e9, launch_overhead=1e-6)
    assert C.roofline(2e9, 1e6, d) == pytest.approx(2.0 + 1e-6)  # memory-bound: bytes / bandwidth
    assert C.roofline(1e3, 3e9, d, launches=4) == pytest.approx(3.0 + 4e-6)  # compute-bound
    k = C.KernelCost()
    k.add_read("x", 100)
    k.add_read("x", 100)  # one buffer is read once per kernel
    k.add_write("y", 50)
    k.flops = 10
    assert k.bytes == 150 and k.bound(d) == "memory"
    assert k.time(d) == pytest.approx(150 / 1e9 + 1e-6)


def test_formatting():
    assert C.fmt_bytes(2_500_000) == "2.5 MB" and C.fmt_bytes(12) == "12 B"
    assert C.fmt_time(2e-3) == "2.000 ms" and C.fmt_time(3e-6) == "3.0 us"
