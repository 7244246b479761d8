"""Whole model blocks as one program (loopir.blocks: GPT-2, MLP, LLaMA-style), built by `build(outputs, args)` on
both targets at symbolic and fixed sizes, against float64 references on fresh random data with NaN-poisoned
outputs; the CUDA kernels compile (NVRTC) and give the same result under adversarial thread orders in the GPU
interpreter; the plan says which kernels there are and why."""

from __future__ import annotations

import numpy as np
import pytest

from codegen import build
from codegen.passes import lower as lower_passes
from loopir.lower import lower
from loopir import blocks, interp, te
from schedules import auto_schedule

SIZES = {"B": 2, "T": 11}
SMALL = {"gpt2": dict(C=32, H=2), "mlp": dict(C=32), "llama": dict(C=32, H=2)}


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOPIR_CACHE_DIR", str(tmp_path / "cache"))


def _block(name: str, dtype: str = "float32", fixed: bool = False, sizes: dict[str, int] = SIZES):
    kw = dict(SMALL[name], dtype=dtype)
    if fixed:
        kw.update(B=sizes["B"], T=sizes["T"])
    return blocks.BLOCKS[name](**kw)


def _err(got: np.ndarray, want: np.ndarray, dtype: str) -> float:
    g, w = blocks.as_float64(got, dtype), blocks.as_float64(want, dtype)
    assert not np.isnan(g).any(), "an output element was never written"
    return float(np.max(np.abs(g - w)) / np.max(np.abs(w)))


def _poisoned(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    return blocks.as_dtype(np.full(shape, np.nan), dtype)


def _check(w, mod, sizes: dict[str, int], rng: int, dtype: str = "float32") -> tuple[list[np.ndarray], tuple]:
    """Call `mod` on fresh inputs of block `w` at `sizes` (output poisoned) and compare with the float64 reference;
    returns the inputs and the output shape."""
    ins = blocks.inputs(w, sizes, rng=rng)
    want = w.reference(*ins)[0]
    got = _poisoned(want.shape, dtype)
    mod(*ins, got)
    assert _err(got, want, dtype) < w.tolerance
    return ins, want.shape


@pytest.mark.parametrize("fixed", [False, True], ids=["symbolic", "fixed"])
@pytest.mark.parametrize("name", sorted(blocks.BLOCKS))
def test_block_on_the_cpu_matches_float64(name, fixed):
    w = _block(name, fixed=fixed)
    mod = build(list(w.outputs), list(w.args), target="cpu")
    _check(w, mod, SIZES, rng=3)
    if not fixed:  # a second call at other sizes (symbolic: the same module) is right too
        _check(w, mod, {"B": 1, "T": 17}, rng=4)


@pytest.mark.parametrize("name, dtype", [("gpt2", "float16"), ("llama", "bfloat16"), ("mlp", "bfloat16")])
def test_block_in_half_precision_on_the_cpu(name, dtype):
    w = _block(name, dtype)
    assert w.tolerance == 1e-2
    _check(w, build(list(w.outputs), list(w.args), target="cpu"), SIZES, rng=5, dtype=dtype)


@pytest.mark.parametrize("name, dtype, fixed", [("gpt2", "float32", False), ("mlp", "float32", True),
                                                ("llama", "float32", False), ("gpt2", "float16", True)])
def test_block_on_cuda_compiles_and_is_right_in_any_thread_order(name, dtype, fixed):
    sizes = {"B": 2, "T": 5}
    w = _block(name, dtype, fixed, sizes)
    s = auto_schedule(list(w.outputs), "cuda")
    mod = build(s, list(w.args), target="cuda")
    assert mod.cubin[:4] == b"\x7fELF"
    low = lower_passes(s.program, "cuda")
    ins = blocks.inputs(w, sizes, rng=6)
    want = w.reference(*ins)[0]
    by_name = {t.name: a for t, a in zip(w.inputs, ins)}
    for order in ("reversed", 1):  # the reversed and a shuffled thread order
        got = _poisoned(want.shape, dtype)
        by_name[w.outputs[0].name] = got
        interp.run(low, *(by_name[b.name] for b in low.args), gpu_order=order, sizes=None if fixed else sizes)
        assert _err(got, want, dtype) < w.tolerance, f"gpu_order={order!r}"


def test_block_plan_names_its_kernels_and_keeps_no_score_matrix():
    w = _block("gpt2")
    s = auto_schedule(list(w.outputs), "cuda")
    plan = s.plan
    kinds = [g.mapping for g in plan.groups]
    # two layer norms (row kernels), six linear layers (GEMMs with their bias / GELU / residual epilogues) and
    # the attention chain as one online-softmax pass, then the heads merged back (an elementwise kernel)
    assert kinds.count("gemm") == 6 and kinds.count("online") == 1
    online = next(g for g in plan.groups if g.mapping == "online")
    assert {"qk", "mx", "p", "z", "pv"} <= set(online.stage_names)
    assert set(online.cost.writes) == {"pv", "z"}  # the cost model writes no score or probability matrix either
    text = plan.explain()
    assert "online_softmax(mx)" in text and "the online-softmax pass" in text
    assert "batched over i, h" not in text  # qk is folded into the pass, not a GEMM kernel
    assert "mm_fc[i, t, c] = sum over r_fc" in text and "epilogue fused" in text
    # no temporary of T x T scores or probabilities is left
    T = w.sizes[1]
    for b in s.program.temps:
        assert sum(1 for d in b.shape if d is T or (hasattr(d, "name") and d.name == T.name)) < 2, b


def test_batched_matmul_is_a_gemm_kernel_on_both_targets():
    B, T = te.var("B"), te.var("T")
    x = te.placeholder((B, T, 24), name="x")
    wt = te.placeholder((24, 40), name="w")
    r = te.reduce_axis(24, "r")
    mm = te.compute((B, T, 40), lambda i, t, c: te.sum(x[i, t, r] * wt[r, c], axis=r), name="mm")
    y = te.compute((B, T, 40), lambda i, t, c: te.maximum(mm[i, t, c], 0.0), name="y")
    rng = np.random.default_rng(7)
    xa, wa = rng.standard_normal((3, 19, 24)).astype(np.float32), rng.standard_normal((24, 40)).astype(np.float32)
    want = np.maximum(xa.astype(np.float64) @ wa, 0)
    for target in ("cpu", "cuda"):
        s = auto_schedule([y], target)
        assert [g.mapping for g in s.plan.groups] == ["gemm"]
        if target == "cuda":
            assert "blockIdx.z" in str(s)  # the batch
            low = lower_passes(s.program, "cuda")
            got = np.full(want.shape, np.nan, np.float32)
            interp.run(low, xa, wa, got, gpu_order="reversed", sizes={"B": 3, "T": 19})
        else:
            got = np.full(want.shape, np.nan, np.float32)
            build(s, [x, wt, y], target="cpu")(xa, wa, got)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_batched_half_matmul_runs_on_tensor_cores(dtype):
    """A linear layer over (B, T, C) activations in half precision (float32 accumulation, B and T symbolic): the
    mma.sync tensor-core recipe (the warpgroup one turned off: tests/test_wgmma_batched.py has it) with the batch on
    blockIdx.z, right in any thread order at sizes the tiles do not divide."""
    B, T = te.var("B"), te.var("T")
    x = te.placeholder((B, T, 32), dtype, name="x")
    wt = te.placeholder((32, 136), dtype, name="w")
    r = te.reduce_axis(32, "r")
    mm = te.compute((B, T, 136), lambda i, t, c: te.sum(te.cast("float32", x[i, t, r]) * te.cast("float32", wt[r, c]),
                                                       axis=r), name="mm")
    y = te.compute((B, T, 136), lambda i, t, c: te.cast(dtype, te.maximum(mm[i, t, c], 0.0)), name="y")
    rng = np.random.default_rng(8)
    xa, wa = (blocks.as_dtype(rng.standard_normal(sh), dtype) for sh in ((2, 19, 32), (32, 136)))
    want = np.maximum(blocks.as_float64(xa, dtype) @ blocks.as_float64(wa, dtype), 0)
    s = auto_schedule([y], "cuda", gemm={"wgmma": False})
    assert [g.mapping for g in s.plan.groups] == ["gemm"] and "tensor cores" in s.plan.explain()
    assert "mma.m16n8k16" in str(s) and "blockIdx.z" in str(s)
    low = lower_passes(s.program, "cuda")
    for order in ("reversed", 1):
        got = _poisoned(want.shape, dtype)
        interp.run(low, xa, wa, got, gpu_order=order, sizes={"B": 2, "T": 19})
        g = blocks.as_float64(got, dtype)
        assert not np.isnan(g).any() and np.max(np.abs(g - want)) / np.max(np.abs(want)) < 1e-2, f"gpu_order={order!r}"
    assert "mma.sync.aligned.m16n8k16" in build(s, [x, wt, y], target="cuda").source


def test_a_transposed_half_operand_keeps_the_simt_recipe():
    """Q K^T reads K[b, j, r] (k-minor): ldmatrix stages B k-major, so the planner keeps the SIMT recipe and says
    why instead of failing inside auto_schedule."""
    from schedules.recipes.gemm_mma import mma_applicable

    B, n = te.var("B"), te.var("n")
    q = te.placeholder((B, n, 64), "float16", name="q")
    k = te.placeholder((B, n, 64), "float16", name="k")
    r = te.reduce_axis(64, "r")
    sc = te.compute((B, n, n), lambda b, i, j: te.sum(te.cast("float32", q[b, i, r]) * te.cast("float32", k[b, j, r]),
                                                      axis=r), name="sc")
    s = auto_schedule([sc], "cuda")
    assert [g.mapping for g in s.plan.groups] == ["gemm"] and "mma" not in str(s)
    assert "transposed" in mma_applicable(lower([sc]), "sc")


def test_gemms_are_costed_at_the_tensor_core_peak():
    """The plan's prediction of a float16 linear layer uses the tensor-core peak (the recipe runs it on tensor
    cores), a float32 one six times its flops there (mma.m16n8k16.tf32x3: three TF32 products per product, at half
    the rate): a roofline, so both stay below what the H200 measured (0.23 / 0.69 ms)."""
    from schedules.fusion import plan_fusion

    got = {}
    for dtype in ("float16", "float32"):
        w = blocks.gpt2(dtype=dtype)
        plan = plan_fusion(list(w.outputs), "cuda", sizes={"B": 8, "T": 1024})
        g = next(g for g in plan.groups if g.stages[0].name == "mm_fc")
        got[dtype] = (g.cost.tensor_flops, g.cost.time(plan.device))
    flops = 2 * 8 * 1024 * 768 * 3072
    assert got["float16"][0] == flops and got["float32"][0] == 6 * flops
    assert got["float16"][1] < got["float32"][1] / 3 and got["float32"][1] < 0.69e-3


def test_fusion_never_leaves_the_gpu_with_fewer_blocks_than_sms():
    # the heads packed in the width (benchmarks/block_check.py's form): p and pv share only the batch loop, so fusing
    # them would run the whole attention on B = 8 blocks; the planner keeps them apart and says why
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
    import block_check as bc

    from schedules.fusion import plan_fusion

    old = (bc.C, bc.H, bc.D, te.var)
    try:
        bc.C, bc.H, bc.D = 768, 12, 64
        te.var = lambda name: {"B": 8, "T": 1024}[name]  # type: ignore[assignment]
        ins, y = bc.block()
    finally:
        bc.C, bc.H, bc.D, te.var = old
    plan = plan_fusion([y], "cuda")
    for g in plan.groups:
        if g.mapping not in ("gemm", "online"):
            rows = 1
            for d in g.stages[0].shape[:g.depth]:
                rows *= int(d.value) if hasattr(d, "value") else int(d)
            assert rows >= plan.device.sm_count, (g.stage_names, rows)
    assert "resource (parallelism): the 1 loop they share (i) gives 8 blocks for 132 SMs" in plan.explain()


@pytest.mark.parametrize("name", sorted(blocks.BLOCKS))
def test_the_block_one_operator_at_a_time_matches_the_block(name):
    # the per-operator path (benchmarks/e2e.py's baseline of ours): each operator its own graph (subst.cut_at), its
    # own build, the activations passed between them
    w = _block(name)
    ins = blocks.inputs(w, SIZES, rng=8)
    want = w.reference(*ins)[0]
    vals = {t.name: a for t, a in zip(w.inputs, ins)}
    ops = blocks.operators(w, name)
    assert [o.name for o, _ in ops] == list(blocks.OPERATORS[name])
    for out, op_ins in ops:
        assert all(t.name in vals for t in op_ins)  # a block input or an earlier operator's output
        shape = tuple(SIZES[d.name] if hasattr(d, "name") else int(d.value) for d in out.shape)
        vals[out.name] = got = _poisoned(shape, "float32")
        build([out], [*op_ins, out], target="cpu")(*(vals[t.name] for t in op_ins), got)
    assert _err(vals["y"], want, "float32") < w.tolerance


@pytest.mark.gpu
def test_block_on_the_gpu_matches_float64_and_times_each_kernel():
    w = _block("gpt2")
    mod = build(list(w.outputs), list(w.args), target="cuda")
    ins, shape = _check(w, mod, SIZES, rng=9)
    for _ in range(3):  # repeated calls stay right
        _check(w, mod, SIZES, rng=9)
    times = mod.kernel_times(*ins, _poisoned(shape, "float32"), repeat=3)
    assert len(times) >= 8 and all(isinstance(k, str) and t > 0 for k, t in times.items())
    assert sum(times.values()) < 10 * mod.benchmark(*ins, _poisoned(shape, "float32"))


@pytest.mark.gpu
@pytest.mark.parametrize("name, dtype", [("gpt2", "float16"), ("llama", "bfloat16")])
def test_half_blocks_on_the_gpu_take_tensor_cores_and_match_float64(name, dtype):
    """Width 256 (the linear layers on Hopper's warpgroup recipe with TMA, the batch loop on blockIdx.z), B and T
    symbolic, T = 77 (no tile divides it: a batch's last row tile reads rows of the next batch and stores none of
    them), the causal pass's dead key tiles skipped; two sizes, one module."""
    w = blocks.BLOCKS[name](C=256, H=4, dtype=dtype)
    mod = build(list(w.outputs), list(w.args), target="cuda")
    assert "wgmma.mma_async" in mod.source and "cp.async.bulk.tensor" in mod.source and "loopir_min(" in mod.source
    for sizes, rng in (({"B": 2, "T": 77}, 10), ({"B": 1, "T": 128}, 11)):
        for _ in range(2):  # repeated calls stay right
            _check(w, mod, sizes, rng=rng, dtype=dtype)


def test_thread_zero_alone_initialises_what_thread_zero_alone_updates():
    # a row kernel whose sum stays on one thread (not bound to the block's threads) while the elementwise phase
    # uses them: the initialisation must be thread 0's too (every thread storing it let NVCC forward its own
    # store of 0 past the barrier: a GPT-2 block's layer norm read var = 0 on an H200)
    from schedules import Schedule

    x = te.placeholder((64, 96), name="x")
    k = te.reduce_axis(96, "k")
    s_ = te.compute((64,), lambda i: te.sum(x[i, k] * x[i, k], axis=k), name="s")
    y = te.compute((64, 96), lambda i, j: x[i, j] / s_[i], name="y")
    s = Schedule([y])
    s.fuse(s.loops("s")[0], s.loops("y")[0])
    s.bind(s.loops("s")[0], "blockIdx.x")
    jo, ji = s.split(s.loops("y")[1], 32)
    s.bind(ji, "threadIdx.x")
    mod = build(s, [x, y], target="cuda")
    lines = mod.source.splitlines()
    guard = "if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {"
    for stmt in ("s_init", "s"):
        at = next(n for n, ln in enumerate(lines) if ln.strip() == f"{{  // {stmt}")
        assert any(lines[n].strip() == guard for n in range(at - 2, at)), stmt
    xa = np.random.default_rng(10).standard_normal((64, 96)).astype(np.float32)
    want = xa / (xa.astype(np.float64) ** 2).sum(1, keepdims=True)
    for order in ("reversed", "forward"):
        got = np.full((64, 96), np.nan, np.float32)
        interp.run(lower_passes(s.program, "cuda"), xa, got, gpu_order=order)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def test_a_row_kernel_with_two_cached_rows_binds_every_phase():
    # the second layer norm of a block reads x + proj: two rows cached in shared memory, the second allocation
    # nested in the first; every phase under them gets the block's threads (its sums were left on one thread)
    n = te.var("n")
    x, p = te.placeholder((n, 256), name="x"), te.placeholder((n, 256), name="p")
    h = te.compute((n, 256), lambda i, j: x[i, j] + p[i, j], name="h")
    k, k2 = te.reduce_axis(256, "k"), te.reduce_axis(256, "k2")
    mu = te.compute((n,), lambda i: te.sum(h[i, k] / 256.0, axis=k), name="mu")
    var = te.compute((n,), lambda i: te.sum((h[i, k2] - mu[i]) * (h[i, k2] - mu[i]) / 256.0, axis=k2), name="var")
    y = te.compute((n, 256), lambda i, j: (h[i, j] - mu[i]) * te.rsqrt(var[i] + 1e-5), name="y")
    s = auto_schedule([y], "cuda", sizes={"n": 4096})
    assert [g.mapping for g in s.plan.groups] == ["row"] and len(s.plan.groups[0].caches) == 2
    src = build(s, [x, p, y], target="cuda").source
    assert "threadIdx.x == 0 && threadIdx.y == 0" not in src and "mu_total" in src and "var_total" in src
    rng = np.random.default_rng(11)
    xa, pa = (rng.standard_normal((5, 256)).astype(np.float32) for _ in range(2))
    h64 = xa.astype(np.float64) + pa
    want = (h64 - h64.mean(1, keepdims=True)) / np.sqrt(h64.var(1, keepdims=True) + 1e-5)
    for order in ("reversed", "forward", 2):
        got = np.full((5, 256), np.nan, np.float32)
        interp.run(lower_passes(s.program, "cuda"), xa, pa, got, gpu_order=order, sizes={"n": 5})
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_cutting_a_graph_at_a_multi_output_stage_is_refused_by_name():
    from loopir.errors import ArgumentError
    from loopir.subst import cut_at

    x = te.placeholder((4, 5), name="x")
    a, b = te.compute((4, 5), lambda i, j: (x[i, j] + 1.0, x[i, j] * 2.0), name="ab")
    y = te.compute((4, 5), lambda i, j: a[i, j] * b[i, j], name="y")
    with pytest.raises(ArgumentError, match=r"cut_at: stage 'ab\.0' is not a single-output compute stage"):
        cut_at(y, [y])


def test_a_block_whose_width_the_heads_do_not_divide_is_refused_by_name():
    from loopir.errors import ArgumentError

    with pytest.raises(ArgumentError, match=r"blocks.gpt2: the width C=100 is not a multiple of the heads H=12"):
        blocks.gpt2(C=100, H=12)
    with pytest.raises(ArgumentError, match=r"blocks.llama: the width C=36 must be H=4 heads of an even size"):
        blocks.llama(C=36, H=4)


def test_batch_loops_that_cannot_be_collapsed_are_refused_by_the_recipe():
    # two symbolic batch loops: collapsing them would make the coordinates non-affine while the update depends on
    # the init; the CUDA recipe names its step and the loops (auto_schedule never asks: the planner keeps such a
    # matmul off the GEMM recipe)
    from loopir.errors import ArgumentError
    from schedules import Schedule
    from schedules.recipes.gemm_cuda import schedule_gemm_cuda

    B, H, T = te.var("B"), te.var("H"), te.var("T")
    a = te.placeholder((B, H, T, 16), name="a")
    w = te.placeholder((16, 32), name="w")
    r = te.reduce_axis(16, "r")
    mm = te.compute((B, H, T, 32), lambda i, h, t, c: te.sum(a[i, h, t, r] * w[r, c], axis=r), name="mm")
    s = Schedule([mm])
    with pytest.raises(ArgumentError, match=r"schedule_gemm_cuda: the batch loops of 'mm' \(i, h\) cannot be "
                                            r"collapsed into one grid dimension"):
        schedule_gemm_cuda(s, "mm")
    assert "gemm" not in [g.mapping for g in auto_schedule([mm], "cuda").plan.groups]
