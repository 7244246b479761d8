"""schedule_gemm_cuda: the tiled GEMM with block tiles staged in shared memory (cache_read of the block's
footprint, copied cooperatively, float4 where aligned), the register tile and the fused epilogue."""

from __future__ import annotations

import numpy as np
import pytest

from loopir import interp, ir
from loopir import workloads as w
from loopir.lower import lower
from loopir.nodes import Barrier, For
from loopir.visit import walk
from schedules import Schedule
from schedules.recipes import schedule_gemm_cuda


def _sched(n, m, p, **kw):
    wl = w.matmul_bias_relu(n=n, m=m, p=p)
    s = Schedule(lower(list(wl.outputs), list(wl.inputs) + list(wl.outputs)))
    return wl, s, schedule_gemm_cuda(s, **kw)


def _data(n, m, p, seed=3):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, p)).astype(np.float32), rng.standard_normal((p, m)).astype(np.float32),
            rng.standard_normal(m).astype(np.float32))


def _check(wl, run, n, m, p):
    a, b, bias = _data(n, m, p)
    out = np.full((n, m), np.nan, np.float32)
    run(a, b, bias, out)
    ref = wl.reference(a, b, bias)[0]
    assert not np.isnan(out).any()
    assert np.abs(out - ref).max() / np.abs(ref).max() < 1e-4


@pytest.mark.parametrize("shape", [(37, 45, 13), (32, 32, 16)])
def test_staged_gemm_numerics_interp(shape):
    n, m, p = shape
    wl, s, plan = _sched(n, m, p, block=(32, 32), thread_tile=(4, 4), k_tile=4)
    assert plan.staged == ["A", "B"] and not plan.skipped, plan.explain()
    _check(wl, lambda *xs: interp.run(s.program, *xs), n, m, p)


def test_block_tiles_have_the_block_shape_and_one_barrier_pair():
    _, s, plan = _sched(257, 129, 65, block=(128, 128), k_tile=16)
    shared = {n.buffer.name: tuple(int(d.value) for d in n.buffer.shape) for n in walk(s.program.body)
              if hasattr(n, "buffer") and getattr(n.buffer, "scope", "") == "shared"}
    assert shared == {"A_shared": (128, 16), "B_shared": (16, 128)}
    ko = next(f for f in walk(s.program.body) if isinstance(f, For) and f.var.name == "k_o")
    assert sum(isinstance(x, Barrier) for x in walk(ko)) == 2
    copies = [f for f in walk(ko) if isinstance(f, For) and f.var.name.startswith("c")]
    assert copies and all(f.kind == "parallel" for f in copies)
    text = str(s)
    assert "A_shared[c0, c1] = A[128 * i_o + c0, 16 * k_o + c1]" in text
    assert "if 128 * i_o + c0 < 257 and 16 * k_o + c1 < 65:" in text  # clipped copy at non-dividing sizes


def test_size_specialised_kernel_is_guard_free_with_float4_copies():
    from codegen import build

    wl, s, _ = _sched(256, 256, 64)
    mod = build(s, list(wl.inputs) + list(wl.outputs), target="cuda")
    src = mod.source
    assert len(mod.kernels) == 1
    # software-pipelined: the first tiles before the k loop, the next ones inside it, by 16-byte cp.async
    assert src.count("cooperative copy") == 4 and "software-pipelined" in src
    assert src.count("loopir_cp_async16(&A_shared_st") == 2 and src.count("loopir_cp_async16(&B_shared_st") == 2
    assert "cp.async.wait_group 1;" in src
    body = src[src.index("__syncthreads();"):]
    assert "if (" not in body.split("__syncthreads();")[1]  # the unrolled inner product has no guard


def test_non_dividing_sizes_compile_with_nvrtc():
    from codegen import build

    wl, s, plan = _sched(257, 129, 65, block=(128, 128))
    mod = build(s, list(wl.inputs) + list(wl.outputs), target="cuda")
    assert len(mod.kernels) == 1 and plan.staged == ["A", "B"]
    assert "__shared__ __align__(16) float A_shared_stages[4096];  // 2 stages of A_shared" in mod.source


def test_symbolic_sizes_keep_guards_and_numerics():
    n, m, p = 19, 23, 11
    wl = w.matmul_bias_relu()
    s = Schedule(lower(list(wl.outputs), list(wl.inputs) + list(wl.outputs)))
    plan = schedule_gemm_cuda(s, block=(16, 16), thread_tile=(2, 2), k_tile=4)
    assert plan.staged == ["A", "B"], plan.explain()
    _check(w.matmul_bias_relu(n=n, m=m, p=p), lambda *xs: interp.run(s.program, *xs), n, m, p)


def test_shared_copy_refused_when_the_block_writes_the_buffer():
    b = ir.Builder("w")
    x = ir.buffer((4, 8), "float32", "X")
    y = ir.buffer((4, 8), "float32", "Y")
    with b.loop("i", 0, 4) as i:
        with b.loop("t", 0, 8) as t:
            b.store(x, (i, t), x[i, t] * 2.0, name="S1")
            with b.loop("k", 0, 8) as k:
                b.store(y, (i, t), y[i, t] + x[i, k], name="S2")
    s = Schedule(b.finish([x, y]), check=False)
    i, t, k = s.loops("S2")
    s.bind(i, "blockIdx.x").bind(t, "threadIdx.x")
    with pytest.raises(ValueError, match=r"'S1'.*writes 'X'"):
        s.cache_read("X", "shared", k)


def test_bad_tiles():
    with pytest.raises(ValueError, match="thread_tile"):
        _sched(16, 16, 16, thread_tile=(7, 8))
    with pytest.raises(ValueError, match="1024 threads"):
        _sched(16, 16, 16, block=(256, 256), thread_tile=(2, 2))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(257, 129, 65), (1000, 1000, 1000), (256, 512, 128)])
@pytest.mark.parametrize("k_tile", [8, 16])
def test_gpu_numerics(shape, k_tile):
    from codegen import build

    n, m, p = shape
    wl, s, _ = _sched(n, m, p, k_tile=k_tile)
    mod = build(s, list(wl.inputs) + list(wl.outputs), target="cuda")
    _check(wl, mod, n, m, p)
