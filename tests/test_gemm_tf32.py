"""The float32 GEMM on tensor cores: mma.m16n8k8 tf32 with three products per product (mma.m16n8k16.tf32x3).

tensorize checks the nest (float32 shared tiles, the m16n8k16 layout), the CUDA passes pad B's rows for conflict-free
shared loads, the renderer splits each operand x = hi + lo; auto_schedule takes the recipe for float32 matmuls the
tiles suit."""

from __future__ import annotations

import numpy as np
import pytest

from codegen.passes import lower as lower_passes
from loopir import interp, te
from loopir import workloads as w
from loopir.lower import lower
from loopir.nodes import For, If, Var
from loopir.visit import walk
from schedules import Schedule, auto_schedule
from schedules.primitives.tensorize import MMA_TF32, TensorizeError
from schedules.recipes.gemm_mma import MMA_TILES_TF32, schedule_gemm_mma
from test_tensorize import shared_tiles

SMALL = dict(block=(64, 64), warp=(32, 32), k_tile=32)


def _sched(n: object = 64, m: object = 64, p: object = 32) -> tuple[Schedule, w.Workload]:
    wl = w.matmul_bias_relu(n=n, m=m, p=p, dtype="float32")
    return Schedule(lower(list(wl.outputs), list(wl.inputs) + list(wl.outputs))), wl


def _inputs(n: int, m: int, p: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in ((n, p), (p, m), (m,))]


def _ref(a: np.ndarray, b: np.ndarray, bias: np.ndarray) -> np.ndarray:
    return np.maximum(a.astype(np.float64) @ b.astype(np.float64) + bias, 0.0)


def _rel(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(got.astype(np.float64) - ref).max() / np.abs(ref).max())


def test_nest_after_tensorize_is_the_reference() -> None:
    s, _ = _sched()
    plan = schedule_gemm_mma(s, **SMALL)
    text = str(s.program)
    assert f"{MMA_TF32}(0, 2)" in text and "range(0, 16)" in text
    assert "three TF32 tensor-core instructions" in plan.explain()
    nests = [f for f in walk(s.program.body) if isinstance(f, For) and f.kind == MMA_TF32]
    assert len(nests) == 1


@pytest.mark.parametrize("size", [(64, 64, 32), (80, 72, 64)])
def test_scheduled_and_lowered_programs_match_float64_in_any_thread_order(size: tuple[int, int, int]) -> None:
    """The schedule, and the lowered program (padded tiles, the cp.async ring, edge tiles), run by the adversarial
    GPU interpreter: the nest's reference semantics in float32."""
    n, m, p = size
    s, _ = _sched(n, m, p)
    schedule_gemm_mma(s, **SMALL)
    for prog, seed in ((s.program, 1), (lower_passes(s.program, "cuda"), 2)):
        a, b, bias = _inputs(n, m, p, seed)
        out = np.full((n, m), np.nan, np.float32)
        interp.run(prog, a, b, bias, out, gpu_order="reversed")
        assert _rel(out, _ref(a, b, bias)) < 1e-5


def test_plan_pads_b_rows_for_conflict_free_shared_loads() -> None:
    from codegen.passes.mma import tf32_b_row

    s, _ = _sched(128, 128, 64)
    schedule_gemm_mma(s, **SMALL)
    k, shapes = shared_tiles(lower_passes(s.program, "cuda"))
    # A: ldmatrix rows of 16 x an odd number of bytes (36 floats); B: 72 floats, 8 mod 32
    assert shapes == {"A_shared": (64, 36), "B_shared": (32, 72)}
    assert k.pipeline_stages == 4 and len(k.pipelined) == 1 and len(k.mma_grids) == 1
    for row in (8, 32, 64, 100, 128, 256):
        n = tf32_b_row(row)
        assert n >= row and n % 4 == 0 and n - row < 32
        # lane l reads row l % 4, column l / 4: 32 distinct banks
        assert len({(t * n + g) % 32 for t in range(4) for g in range(8)}) == 32


def test_source_splits_and_issues_three_tf32_products() -> None:
    from codegen import build

    s, wl = _sched(80, 72, 64)
    schedule_gemm_mma(s, **SMALL)
    src = build(s, list(wl.inputs) + list(wl.outputs), target="cuda").source
    count = src.count("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32")  # per rendered grid (full / edge tiles)
    assert count and count % 3 == 0
    assert "loopir_tf32_split(" in src and "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in src
    assert "loopir_cp_async16(&A_shared_st" in src and "loopir_cp_async16(&B_shared_st" in src
    assert "chunk_q" in src  # the edge tiles' copies: 16-byte chunks inside the clip, element-wise across it


def test_symbolic_sizes_build() -> None:
    from codegen import build

    wl = w.matmul_bias_relu(n=te.var("n"), m=te.var("m"), p=te.var("p"), dtype="float32")
    s = Schedule(lower(list(wl.outputs), list(wl.inputs) + list(wl.outputs)))
    schedule_gemm_mma(s, **MMA_TILES_TF32)
    assert "m16n8k8" in build(s, list(wl.args), target="cuda").source


def test_refuses_a_nest_of_other_extents() -> None:
    s, _ = _sched()
    i, j, k = s.loops("matmul")[-3:]
    with pytest.raises(TensorizeError, match="perfect nest|extents"):
        s.tensorize(i, MMA_TF32)


def test_auto_schedule_takes_tf32x3_for_float32_and_keeps_simt_when_asked() -> None:
    wl = w.matmul_bias_relu(n=2048, m=2048, p=64, dtype="float32")
    text = auto_schedule(list(wl.outputs), "cuda").plan.explain()
    assert "mma.sync m16n8k8 tf32, three products" in text and str(MMA_TILES_TF32["block"]) in text
    off = auto_schedule(list(wl.outputs), "cuda", gemm={"tensor_cores": False}).plan.explain()
    assert "tensor cores" not in off
    # chosen tiles are kept
    mine = auto_schedule(list(wl.outputs), "cuda", gemm={"mma": {"block": (128, 128), "warp": (64, 32)}})
    assert "(128, 128)" in mine.plan.explain()


def test_fusion_cost_counts_three_tf32_products() -> None:
    from schedules.fusion import _mma_weight

    assert _mma_weight(w.matmul_bias_relu(n=256, m=256, p=64, dtype="float32").outputs[0].op.inputs[0]) == 6
    assert _mma_weight(w.matmul_bias_relu(n=256, m=256, p=64, dtype="float16").outputs[0].op.inputs[0]) == 1
    assert _mma_weight(w.matmul_bias_relu(n=256, m=256, p=36, dtype="float32").outputs[0].op.inputs[0]) == 0


# ----------------------------------------------------------------------------- on the device


@pytest.mark.gpu
@pytest.mark.parametrize("size", [(256, 256, 256), (200, 136, 64), (1000, 1000, 1000), (777, 555, 336),
                                  (2048, 768, 3072)])
@pytest.mark.parametrize("sym", [False, True])
def test_gpu_tf32x3_matches_float64(size: tuple[int, int, int], sym: bool) -> None:
    from codegen import build

    n, m, p = size
    # symbolic rows and columns (a symbolic reduction is not a known multiple of 8: the SIMT recipe)
    wl = w.matmul_bias_relu(n=te.var("n") if sym else n, m=te.var("m") if sym else m, p=p, dtype="float32")
    s = auto_schedule(list(wl.outputs), "cuda", sizes={"n": n, "m": m} if sym else None)
    mod = build(s, list(wl.args), target="cuda")
    assert "m16n8k8.row.col.f32.tf32" in mod.source
    a, b, bias = _inputs(n, m, p, seed=n + p)
    out = np.full((n, m), np.nan, np.float32)
    mod(a, b, bias, out)
    # float32-class: the products lose below 2^-20 of themselves, the sums round as float32's do
    assert _rel(out, _ref(a, b, bias)) < 1e-5


@pytest.mark.gpu
def test_gpu_tf32x3_batched_linear_layer() -> None:
    """A linear layer over (B, T, C) activations at symbolic B, T: the batch loops collapse into rows."""
    from codegen import build

    bsz, tsz, c, d = te.var("B"), te.var("T"), 256, 384
    x = te.placeholder((bsz, tsz, c), "float32", "x")
    wt = te.placeholder((c, d), "float32", "w")
    k = te.reduce_axis((0, c), "k")
    y = te.compute((bsz, tsz, d), lambda b, t, j: te.sum(x[b, t, k] * wt[k, j], axis=k), "y")
    mod = build([y], [x, wt, y], target="cuda")
    assert "m16n8k8.row.col.f32.tf32" in mod.source
    rng = np.random.default_rng(3)
    xa, wa = (rng.standard_normal(sh).astype(np.float32) for sh in ((3, 100, c), (c, d)))
    out = np.full((3, 100, d), np.nan, np.float32)
    mod(xa, wa, out)
    ref = xa.astype(np.float64) @ wa.astype(np.float64)
    assert _rel(out, ref) < 1e-5


def test_small_float32_grids_take_smaller_tiles() -> None:
    from schedules.recipes.gemm_mma import MMA_TILES, MMA_TILES_TF32_SMALL, mma_tiles

    # 64 x 128 tiles: 1024^3 is 128 blocks (< 2 per SM of 132), 2048^3 512; unknown sizes keep the default
    assert mma_tiles("float32", None, (1, 1024, 1024)) == MMA_TILES_TF32_SMALL
    assert mma_tiles("float32", None, (1, 2048, 2048)) == MMA_TILES_TF32
    assert mma_tiles("float32", None, (8, 128, 768)) == MMA_TILES_TF32_SMALL
    assert mma_tiles("float32", None, (1, None, 1024)) == MMA_TILES_TF32
    assert mma_tiles("float32", None, (1, 1024, 1024), sms=32) == MMA_TILES_TF32
    assert mma_tiles("float16", None, (1, 1024, 1024)) == MMA_TILES
    mine = {"block": (64, 64), "warp": (32, 32), "k_tile": 32}
    assert mma_tiles("float32", mine, (1, 1024, 1024)) == mine
    wl = w.matmul_bias_relu(n=te.var("n"), m=te.var("m"), p=768, dtype="float32")
    text = auto_schedule(list(wl.outputs), "cuda", sizes={"n": 1024, "m": 768}).plan.explain()
    assert str(MMA_TILES_TF32_SMALL) in text


def _no_grid_module(monkeypatch, n: int, m: int, p: int):
    import codegen.passes.mma as pm
    from codegen import build

    monkeypatch.setattr(pm, "_grids", lambda k: frozenset())
    s, wl = _sched(n, m, p)
    schedule_gemm_mma(s, **SMALL)
    return build(s, list(wl.args), target="cuda", cache=False)


def test_without_fragment_reuse_each_fragment_is_rendered_alone(monkeypatch) -> None:
    """A tensorized nest outside an mma grid (codegen.passes.mma records none): one ldmatrix, split and three
    instructions per step of each fragment, compiled by NVRTC (numerics on the device: the gpu test below)."""
    mod = _no_grid_module(monkeypatch, 200, 136, 64)
    assert f"// {MMA_TF32}:" in mod.source and "frag_ah" not in mod.source


@pytest.mark.gpu
def test_gpu_without_fragment_reuse_matches_float64(monkeypatch) -> None:
    n, m, p = 200, 136, 64
    mod = _no_grid_module(monkeypatch, n, m, p)
    a, b, bias = _inputs(n, m, p, seed=5)
    out = np.full((n, m), np.nan, np.float32)
    mod(a, b, bias, out)
    assert _rel(out, _ref(a, b, bias)) < 1e-5


# ----------------------------------------------------------------------------- a program we did not write


def _polybench_gemm(ni, nj, nk):
    """PolyBench/C 4.2 `gemm`: C = alpha * A B + beta * C (alpha 1.5, beta 1.2 as its init_array), written to a
    new array (te stages are pure)."""
    a = te.placeholder((ni, nk), "float32", name="A")
    b = te.placeholder((nk, nj), "float32", name="B")
    c = te.placeholder((ni, nj), "float32", name="C")
    k = te.reduce_axis(nk, "k")
    ab = te.compute((ni, nj), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="ab")
    out = te.compute((ni, nj), lambda i, j: 1.5 * ab[i, j] + 1.2 * c[i, j], name="out")
    return [a, b, c, out], out


def _polybench_ref(a, b, c):
    return 1.5 * (a.astype(np.float64) @ b.astype(np.float64)) + 1.2 * c


def test_polybench_gemm_takes_tf32x3_and_is_right_in_any_thread_order() -> None:
    """Its rows and columns sized at run time, the reduction the SMALL dataset's: the lowered CUDA program in
    adversarial thread order and the CPU build both match float64 at PolyBench's SMALL sizes (60 x 70 x 80)."""
    from codegen import build
    from codegen.passes import lower as lower_cuda

    args, out = _polybench_gemm(te.var("NI"), te.var("NJ"), 80)
    s = auto_schedule([out], "cuda")
    assert "mma.sync m16n8k8 tf32" in s.plan.explain()
    rng = np.random.default_rng()
    a, b, c = (rng.standard_normal(sh).astype(np.float32) for sh in ((60, 80), (80, 70), (60, 70)))
    ref = _polybench_ref(a, b, c)
    got = np.full((60, 70), np.nan, np.float32)
    interp.run(lower_cuda(s.program, "cuda"), a, b, c, got, gpu_order="reversed")
    assert _rel(got, ref) < 1e-5
    got = np.full((60, 70), np.nan, np.float32)
    build([out], args, target="cpu")(a, b, c, got)
    assert _rel(got, ref) < 1e-5


@pytest.mark.gpu
def test_gpu_polybench_gemm_medium_and_large_repeated() -> None:
    """PolyBench's MEDIUM (200 x 220 x 240) and LARGE (1000 x 1100 x 1200) datasets at fixed sizes, each called three
    times on fresh data into a NaN-poisoned output."""
    from codegen import build

    rng = np.random.default_rng()
    for ni, nj, nk in ((200, 220, 240), (1000, 1100, 1200)):
        args, out = _polybench_gemm(ni, nj, nk)
        mod = build([out], args, target="cuda")
        assert "m16n8k8.row.col.f32.tf32" in mod.source
        for _ in range(3):
            a, b, c = (rng.standard_normal(sh).astype(np.float32) for sh in ((ni, nk), (nk, nj), (ni, nj)))
            got = np.full((ni, nj), np.nan, np.float32)
            mod(a, b, c, got)
            assert _rel(got, _polybench_ref(a, b, c)) < 1e-5


@pytest.mark.gpu
def test_gpu_tf32x3_repeated_calls_on_fresh_data() -> None:
    """One symbolic module called five times (two sizes, fresh data each, the output poisoned with NaN first)."""
    from codegen import build

    wl = w.matmul_bias_relu(n=te.var("n"), m=te.var("m"), p=256, dtype="float32")
    mod = build(list(wl.outputs), list(wl.args), target="cuda")
    for i in range(5):
        n, m = ((300, 200), (1000, 1000))[i % 2]
        a, b, bias = _inputs(n, m, 256, seed=100 + i)
        out = np.full((n, m), np.nan, np.float32)
        mod(a, b, bias, out)
        assert _rel(out, _ref(a, b, bias)) < 1e-5


def test_no_branch_splits_a_warp_around_its_tensor_core_instructions() -> None:
    """PolyBench MEDIUM (200 x 220 x 240): the last column tile's lanes differ on `column + 25 < 220`, so a full-tile
    version of the mma nest on that test would send lanes of one warp to different copies of `mma.sync.aligned`
    (a hang on the H200). Every If around a tensorized loop tests no thread variable."""
    from schedules.primitives.tensorize import is_tensorized

    args, out = _polybench_gemm(200, 220, 240)
    low = lower_passes(auto_schedule([out], "cuda").program, "cuda")
    thread_vars = {f.var for f in walk(low.body) if isinstance(f, For) and f.kind == "thread"
                   and (f.thread or "").startswith("threadIdx")}
    ifs = [n for n in walk(low.body) if isinstance(n, If)
           and any(is_tensorized(f) for f in walk(n) if isinstance(f, For))]
    assert thread_vars and any(is_tensorized(f) for f in walk(low.body) if isinstance(f, For))
    bad = [n.cond for n in ifs if any(v in thread_vars for v in walk(n.cond) if isinstance(v, Var))]
    assert not bad, bad
