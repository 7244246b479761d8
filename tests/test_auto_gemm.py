"""auto_schedule on matmul-shaped reductions: the GEMM recipe (schedules.gemm / gemm_cuda) with the
elementwise epilogue fused into the single store, tile sizes as parameters, the plan explaining it."""

from __future__ import annotations

import numpy as np
import pytest

from codegen import build
from loopir import te
from loopir import workloads as w
from loopir.nodes import For
from loopir.visit import walk
from schedules import auto_schedule
from schedules.fusion import plan_fusion


def _wl(n=None, m=None, p=None):
    wl = w.matmul_bias_relu(n=n, m=m, p=p)
    return wl, list(wl.outputs), list(wl.inputs) + list(wl.outputs)


def _data(n, m, p, seed=11):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, p)).astype(np.float32), rng.standard_normal((p, m)).astype(np.float32),
            rng.standard_normal(m).astype(np.float32))


def _run_check(wl, mod, n, m, p):
    a, b, bias = _data(n, m, p)
    out = np.full((n, m), np.nan, np.float32)
    mod(a, b, bias, out)
    assert not np.isnan(out).any()
    ref = wl.reference(a, b, bias)[0]
    assert np.abs(out - ref).max() / np.abs(ref).max() < 1e-4


def _bindings(program):
    return {f.thread for f in walk(program.body) if isinstance(f, For) and f.thread}


@pytest.mark.parametrize("sizes", [(257, 129, 65), (None, None, None)])
def test_cuda_plain_tensors_one_gemm_kernel_nvrtc(sizes):
    wl, outs, args = _wl(*sizes)
    mod = build(outs, args, target="cuda")  # plain tensors -> auto_schedule; NVRTC compiles here
    assert len(mod.kernels) == 1
    src = mod.source
    # the GEMM recipe: register tile, shared staging of both operands, the epilogue on the register tile
    assert "matmul_local" in src and "A_shared" in src and "B_shared" in src and "__shared__" in src
    assert "bias" in src and "#pragma unroll" in src
    s = auto_schedule(outs, target="cuda")
    assert _bindings(s.program) == {"blockIdx.x", "blockIdx.y", "threadIdx.x", "threadIdx.y"}
    # matmul is never materialized: only its register tile exists
    assert "matmul" not in [b.name for b in s.program.temps]


def test_cuda_default_tiles_are_the_measured_best_and_tiles_are_parameters():
    _, outs, _ = _wl(257, 129, 65)
    s = auto_schedule(outs, target="cuda")
    g = s.plan.groups[0]
    assert g.mapping == "gemm" and g.gemm["block"] == (64, 128) and g.gemm["k_tile"] == 16
    shared = {b.name: tuple(int(d.value) for d in b.shape) for b in _allocs(s.program) if b.scope == "shared"}
    assert shared == {"A_shared": (64, 16), "B_shared": (16, 128)}
    s2 = auto_schedule(outs, target="cuda", gemm={"block": (32, 64), "thread_tile": (4, 4), "k_tile": 8})
    shared = {b.name: tuple(int(d.value) for d in b.shape) for b in _allocs(s2.program) if b.scope == "shared"}
    assert shared == {"A_shared": (32, 8), "B_shared": (8, 64)}
    assert "block 32x64" in s2.plan.explain() and "k_tile 8" in s2.plan.explain()


def test_cuda_auto_kernel_is_the_hand_applied_recipe():
    from loopir.lower import lower
    from schedules import Schedule
    from schedules.recipes import schedule_gemm_cuda

    wl, outs, args = _wl(257, 129, 65)
    s = Schedule(lower(outs, args))
    schedule_gemm_cuda(s)
    auto = auto_schedule(outs, target="cuda")
    assert str(auto.program) == str(s.program)
    assert build(auto, args, target="cuda").source == build(s, args, target="cuda").source


def _allocs(program):
    from loopir.nodes import Allocate

    return [n.buffer for n in walk(program.body) if isinstance(n, Allocate)]


@pytest.mark.parametrize("gemm", [{"block": (32, 32), "thread_tile": (4, 4), "k_tile": 4}, None])
def test_cuda_schedule_interpreted_matches_numpy(gemm):
    from loopir import interp

    n, m, p = 37, 45, 13
    wl, outs, args = _wl(n, m, p)
    s = auto_schedule(outs, target="cuda", gemm=gemm)
    from codegen.build import with_args

    prog = with_args(s.program, args)
    _run_check(wl, lambda *xs: interp.run(prog, *xs), n, m, p)


@pytest.mark.parametrize("sizes", [(257, 129, 65), (100, 70, 33), (None, None, None)])
def test_cpu_one_kernel_matches_numpy_non_dividing(sizes):
    wl, outs, args = _wl(*sizes)
    mod = build(outs, args, target="cpu")
    assert len(mod.kernels) == 1
    n, m, p = (x if x is not None else d for x, d in zip(sizes, (131, 67, 45)))
    _run_check(wl, mod, n, m, p)
    s = auto_schedule(outs, target="cpu")
    assert s.plan.groups[0].mapping == "gemm"
    assert "matmul" not in [b.name for b in s.program.temps]


def test_cpu_tile_parameter_and_fuse_false():
    wl, outs, args = _wl(41, 70, 19)
    s = auto_schedule(outs, target="cpu", gemm={"cpu_tile": (4, 16)})
    assert any(b.name == "matmul_local" and tuple(int(d.value) for d in b.shape) == (4, 16)
               for b in _allocs(s.program))
    _run_check(wl, build(s, args, target="cpu"), 41, 70, 19)
    # fuse=False: the matmul is its own GEMM kernel (no epilogue), C another kernel
    s = auto_schedule(outs, target="cpu", fuse=False)
    assert [g.mapping for g in s.plan.groups] == ["gemm", "cpu"]
    mod = build(s, args, target="cpu")
    assert len(mod.kernels) == 2
    _run_check(wl, mod, 41, 70, 19)


@pytest.mark.parametrize("target", ["cuda", "cpu"])
def test_explain_mentions_the_gemm_group_tiles_and_epilogue(target):
    _, outs, _ = _wl(257, 129, 65)
    text = auto_schedule(outs, target=target).plan.explain()
    assert "GEMM group" in text and "matmul-shaped" in text
    assert "epilogue fused" in text and "matmul is never written" in text
    assert "recipe applied to matmul (epilogue: C)" in text
    assert ("block 64x128" in text and "k_tile 16" in text) if target == "cuda" else "register tile" in text
    # the matmul's result stays in registers: no bytes for it
    assert "writes C " in text and "writes matmul" not in text


def test_gemm_false_maps_the_matmul_like_any_reduction():
    wl, outs, args = _wl(37, 45, 13)
    s = auto_schedule(outs, target="cpu", gemm=False)
    assert s.plan.groups[0].mapping == "cpu" and "GEMM" not in s.plan.explain()
    _run_check(wl, build(s, args, target="cpu"), 37, 45, 13)


def test_producer_of_an_operand_and_a_second_reader_stay_apart():
    n, m, p = 33, 40, 17
    a = te.placeholder((n, p), name="A")
    b = te.placeholder((p, m), name="B")
    a2 = te.compute((n, p), lambda i, k: te.exp(a[i, k]) * 0.5, name="A2")  # read m times: materialized
    k = te.reduce_axis(p, name="k")
    mm = te.compute((n, m), lambda i, j: te.sum(a2[i, k] * b[k, j], axis=k), name="mm")
    y = te.compute((n, m), lambda i, j: te.maximum(mm[i, j], 0.0), name="y")
    z = te.compute((n, m), lambda i, j: mm[i, j] * 2.0, name="z")  # a second reader: no epilogue chain
    plan = plan_fusion([y, z], target="cpu", sizes={})
    mm_group = plan.group_of("mm")
    assert mm_group.stage_names == ["mm"] and mm_group.mapping == "gemm"
    text = plan.explain()
    assert "mm is matmul-shaped and keeps its own tiled GEMM kernel" in text
    s = auto_schedule([y, z], target="cpu")
    mod = build(s, [a, b, y, z], target="cpu")
    rng = np.random.default_rng(2)
    xa, xb = rng.standard_normal((n, p)).astype(np.float32), rng.standard_normal((p, m)).astype(np.float32)
    ys = [np.full((n, m), np.nan, np.float32) for _ in range(2)]
    mod(xa, xb, *ys)
    ref = (np.exp(xa.astype(np.float64)) * 0.5) @ xb
    for got, want in zip(ys, (np.maximum(ref, 0.0), ref * 2.0)):
        assert np.abs(got - want).max() / np.abs(want).max() < 1e-4


def test_bad_gemm_parameters_are_refused_naming_them():
    _, outs, _ = _wl(64, 64, 64)
    with pytest.raises(ValueError, match="'blocks'"):
        auto_schedule(outs, target="cuda", gemm={"blocks": (64, 64)})
    with pytest.raises(ValueError, match="'block'"):
        auto_schedule(outs, target="cpu", gemm={"block": (64, 64)})
    with pytest.raises(ValueError, match="thread_tile"):
        auto_schedule(outs, target="cuda", gemm={"block": (64, 64), "thread_tile": (5, 8)})
    with pytest.raises(ValueError, match="k_tile"):
        auto_schedule(outs, target="cuda", gemm={"k_tile": 0})
    with pytest.raises(ValueError, match="cpu_tile"):
        auto_schedule(outs, target="cpu", gemm={"cpu_tile": (0, 8)})
    with pytest.raises(ValueError, match="shared memory"):  # 2 x 256 x 64 floats = 128 KB > 48 KB static
        auto_schedule(outs, target="cuda", gemm={"block": (256, 256), "thread_tile": (16, 16), "k_tile": 64})
    with pytest.raises(ValueError, match="registers per thread"):
        auto_schedule(outs, target="cuda", gemm={"block": (128, 128), "thread_tile": (16, 16), "k_tile": 8})


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(257, 129, 65), (1000, 1000, 1000)])
def test_gpu_auto_scheduled_gemm_matches_numpy(shape):
    n, m, p = shape
    wl, outs, args = _wl(n, m, p)
    mod = build(outs, args, target="cuda")
    assert len(mod.kernels) == 1
    _run_check(wl, mod, n, m, p)


@pytest.mark.gpu
def test_gpu_auto_scheduled_gemm_symbolic_sizes():
    wl, outs, args = _wl()
    mod = build(outs, args, target="cuda")
    _run_check(wl, mod, 257, 129, 65)
