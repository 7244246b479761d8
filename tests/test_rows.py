"""Row reductions at every shape on CUDA: the strategy the cost model picks (warp per row, block per row
with the row in shared memory), dynamic shared memory (symbolic rows, rows above 48 KiB), the planner's
shared-memory budget, the cache_row primitive, and the transformer block's build.

Numerics run the lowered CUDA program in the adversarial interpreter (`gpu_order="reversed"`) against
float64 numpy on fresh random data with NaN-poisoned outputs; every kernel is also compiled by NVRTC."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from codegen import build
from codegen.cuda.runtime import SharedMemoryError, dynamic_shared_bytes
from codegen.passes import lower
from loopir import interp, te, workloads
from loopir.errors import ArgumentError, ArgumentTypeError, CudaCodegenError, LoopirError
from schedules import Schedule, ScheduleError, auto_schedule, plan_fusion
from schedules.rows import choose_row_strategy, fit_shared, operands_split
from schedules.cost import H200

EPS = 1e-5


# ----------------------------------------------------------------------------- workloads


def softmax(m, n):
    x = te.placeholder((m, n), name="x")
    k1 = te.reduce_axis(n, "k")
    mx = te.compute((m,), lambda i: te.max(x[i, k1], axis=k1), name="row_max")
    k2 = te.reduce_axis(n, "k")
    sm = te.compute((m,), lambda i: te.sum(te.exp(x[i, k2] - mx[i]), axis=k2), name="row_sum")
    y = te.compute((m, n), lambda i, j: te.exp(x[i, j] - mx[i]) / sm[i], name="y")

    def ref(a):
        a = a.astype(np.float64)
        e = np.exp(a - a.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)

    return [x], y, ref


def layernorm(m, n):
    x = te.placeholder((m, n), name="x")
    g = te.placeholder((n,), name="g")
    b = te.placeholder((n,), name="b")
    nf = te.cast("float32", n)
    k1 = te.reduce_axis(n, "k")
    mean = te.compute((m,), lambda i: te.sum(x[i, k1] / nf, axis=k1), name="mean")
    k2 = te.reduce_axis(n, "k")
    var = te.compute((m,), lambda i: te.sum((x[i, k2] - mean[i]) * (x[i, k2] - mean[i]) / nf, axis=k2), name="var")
    y = te.compute((m, n), lambda i, j: (x[i, j] - mean[i]) * te.rsqrt(var[i] + EPS) * g[j] + b[j], name="y")

    def ref(a, gg, bb):
        a = a.astype(np.float64)
        mu = a.mean(1, keepdims=True)
        return (a - mu) / np.sqrt(((a - mu) ** 2).mean(1, keepdims=True) + EPS) * gg + bb

    return [x, g, b], y, ref


def rmsnorm(m, n):
    x = te.placeholder((m, n), name="x")
    g = te.placeholder((n,), name="g")
    nf = te.cast("float32", n)
    k = te.reduce_axis(n, "k")
    ss = te.compute((m,), lambda i: te.sum(x[i, k] * x[i, k] / nf, axis=k), name="ms")
    y = te.compute((m, n), lambda i, j: x[i, j] * te.rsqrt(ss[i] + EPS) * g[j], name="y")

    def ref(a, gg):
        a = a.astype(np.float64)
        return a / np.sqrt((a ** 2).mean(1, keepdims=True) + EPS) * gg

    return [x, g], y, ref


WORKLOADS = {"softmax": softmax, "layernorm": layernorm, "rmsnorm": rmsnorm}


def _arrays(ins, m, n, rng):
    return [rng.standard_normal((m, n) if len(t.shape) == 2 else (n,)).astype(np.float32) for t in ins]


def _check_interp(s, ins, ref, m, n, seed=0):
    prog = lower(s.program, "cuda")
    rng = np.random.default_rng(seed)
    arrays = _arrays(ins, m, n, rng)
    out = np.full((m, n), np.nan, np.float32)
    interp.run(prog, *arrays, out, gpu_order="reversed")
    want = ref(*arrays)
    assert not np.isnan(out).any()
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-6)


def _check_device(mod, ins, ref, m, n):
    """Two calls of `mod` on the GPU, fresh random data each, outputs NaN-poisoned, against `ref`."""
    rng = np.random.default_rng(m + n)
    for _ in range(2):
        arrays = _arrays(ins, m, n, rng)
        out = np.full((m, n), np.nan, np.float32)
        mod(*arrays, out)
        np.testing.assert_allclose(out, ref(*arrays), rtol=2e-5, atol=2e-6)


def _strategy(s) -> str:
    (g,) = [g for g in s.plan.groups if g.strategy is not None]
    return g.strategy.name


# ----------------------------------------------------------------------------- strategy choice


@pytest.mark.parametrize("n, rows, want", [(1, 1000, "warp"), (3, 7, "warp"), (64, 64, "warp"), (127, 10, "warp"),
                                           (100, 5000, "warp"), (128, 10, "block"), (1000, 1, "block"),
                                           (1000, 5000, "block"), (4096, 1000, "block"), (50257, 7, "block"),
                                           (2**17, 7, "split")])
def test_the_cost_model_picks_the_strategy_from_row_length_and_count(n, rows, want):
    ins, y, _ = softmax(rows, n)
    plan = plan_fusion([y], "cuda", device=H200)
    (g,) = plan.groups
    assert g.strategy.name == want and g.mapping == {"warp": "warp", "split": "split"}.get(want, "row")
    text = plan.explain()
    assert f"row strategy: {want}: row length {n:,}, {rows:,} row" in text
    if want == "warp":
        assert f"{g.strategy.lanes} lanes each" in text and g.strategy.lanes * g.strategy.rows == 128
    if n == 2**17:  # few very wide rows: split over several blocks (tests/test_wide_rows.py)
        assert "each row split into" in text


def test_short_rows_get_fewer_lanes_and_more_rows_per_block():
    assert choose_row_strategy(3, 100, [], True, 128, H200).lanes == 2
    assert choose_row_strategy(16, 100, [], True, 128, H200).lanes == 8
    assert choose_row_strategy(64, 100, [], True, 128, H200).lanes == 16
    assert choose_row_strategy(3, 100, [], True, 128, H200).rows == 64


def test_symbolic_rows_without_sizes_keep_a_block_per_row_and_use_the_given_sizes_otherwise():
    m, n = te.var("m"), te.var("n")
    _, y, _ = softmax(m, n)
    plan = plan_fusion([y], "cuda", device=H200)
    assert plan.groups[0].strategy.name == "block" and "symbolic and no sizes were given" in plan.explain()
    plan = plan_fusion([y], "cuda", device=H200, sizes={"m": 5000, "n": 100})
    assert plan.groups[0].strategy.name == "warp" and "row length 100, 5,000 rows" in plan.explain()


# ----------------------------------------------------------------------------- numerics, every strategy


@pytest.mark.parametrize("wl", sorted(WORKLOADS))
@pytest.mark.parametrize("m, n", [(1, 1), (7, 3), (7, 64), (1, 1000), (64, 64), (7, 4096)])
def test_fixed_sizes_match_numpy_under_the_adversarial_interpreter(wl, m, n):
    ins, y, ref = WORKLOADS[wl](m, n)
    s = auto_schedule([y], "cuda")
    _check_interp(s, ins, ref, m, n, seed=m * 1000 + n)


@pytest.mark.parametrize("wl", sorted(WORKLOADS))
@pytest.mark.parametrize("sizes", [{"m": 5000, "n": 100}, {"m": 4096, "n": 4096}, None])
@pytest.mark.parametrize("m, n", [(7, 3), (3, 130), (2, 1000)])
def test_symbolic_sizes_are_correct_at_every_size_whatever_sizes_the_plan_assumed(wl, sizes, m, n):
    ins, y, ref = WORKLOADS[wl](te.var("m"), te.var("n"))
    s = auto_schedule([y], "cuda", sizes=sizes)
    _check_interp(s, ins, ref, m, n, seed=n)


def test_a_single_vocabulary_sized_row_matches_numpy():
    ins, y, ref = softmax(1, 50257)
    # a block per row (the split: test_wide_rows; a cluster per row, the default: test_cluster_rows)
    s = auto_schedule([y], "cuda", rows={"split_rows_per_sm": 0, "cluster_row_max": 0})
    # 201 KB: no cache holds the row, so each phase re-reads it with 1024 threads (RowParams.uncached_threads)
    assert _strategy(s) == "block" and "so 1024 threads per row" in s.plan.explain()
    mod = build(s, [*ins, y], target="cuda")
    assert [str(e) for e in mod.gen.kernels[0].launch.block] == ["1024", "1", "1"]
    assert "LOOPIR_LD4" in mod.source  # the reductions read 16-byte chunks
    _check_interp(s, ins, ref, 1, 50257)


@pytest.mark.parametrize("wl", sorted(WORKLOADS))
@pytest.mark.parametrize("m, n", [(1, 1), (7, 3), (64, 64), (1000, 1000), (5000, 1000), (7, 4096), (7, 50257),
                                  (1000, 50257)])
def test_every_strategy_compiles_with_nvrtc(wl, m, n):
    ins, y, _ = WORKLOADS[wl](m, n)
    s = auto_schedule([y], "cuda")
    mod = build(s, [*ins, y], target="cuda")
    assert mod.cubin[:4] == b"\x7fELF"
    if _strategy(s) == "warp":
        assert "= loopir_subwarp_allreduce<" in mod.source and "= loopir_block_allreduce(" not in mod.source


@pytest.mark.parametrize("wl", sorted(WORKLOADS))
def test_symbolic_warp_rows_move_whole_vectors_guarded_per_vector(wl):
    # n = 16*n16 (a call-time specialization's key n%16): 16 lanes x 4 floats do not tile a row of unknown length,
    # but every float4 is whole; the row's elementwise phase runs 128-bit accesses, guarded per vector, and each
    # lane's share of the reductions reads float4 chunks (guarded per chunk, not per element)
    n16 = te.var("n16")
    ins, y, ref = WORKLOADS[wl](te.var("m"), n16 * 16)
    s = auto_schedule([y], "cuda", sizes={"n16": 4, "m": 65536})
    assert _strategy(s) == "warp"
    src = build(s, [*ins, y], target="cuda").source
    assert "// y: 128-bit vector loads/stores over j_i" in src
    assert src.count("// 128-bit loads over k_i") == {"rmsnorm": 1}.get(wl, 2)
    assert "const float4 x_v = LOOPIR_LD4(" in src
    assert "if ((((k_os * 16) + k_ot) < loopir_floordiv(((n16 * 16) + 3), 4)))" in src
    for m, n in ((3, 16), (5, 48), (2, 112)):
        _check_interp(s, ins, ref, m, n, seed=n)


@pytest.mark.parametrize("unit, count, vector, lanes", [(16, 48, True, 32), (16, 4, True, 8), (4, 16, False, 32)])
def test_symbolic_half_warp_rows_vectorize_only_rows_that_give_every_lane_a_vector(unit, count, vector, lanes):
    # float16 warp rows: a row of whole 16-byte vectors planned at 768 gets 32 lanes of guarded vectors, one planned
    # at 64 gets 8 lanes, a vector each (32 lanes would leave three in four without one: scalars); a row known only
    # to be whole 4-element units keeps 32 lanes of scalars
    v = te.var(f"n{unit}")
    w = workloads.softmax_mixed(te.var("m"), v * unit, "float16")
    s = auto_schedule(list(w.outputs), "cuda", sizes={v.name: count, "m": 65536})
    assert _strategy(s) == "warp"
    mod = build(s, list(w.inputs) + list(w.outputs), target="cuda")
    assert ("128-bit vector loads/stores over j_i" in mod.source) is vector
    assert int(str(mod.gen.kernels[0].launch.block[0])) == lanes


def test_warp_rows_use_shuffles_only():
    ins, y, _ = softmax(2000, 100)
    mod = build([y], [*ins, y], target="cuda")
    assert "loopir_subwarp_allreduce<16>" in mod.source
    (k,) = mod.gen.kernels
    assert [str(e) for e in k.launch.block] == ["16", "8", "1"] and str(k.launch.grid[0]) == "250"


# ----------------------------------------------------------------------------- dynamic shared memory


def test_a_symbolic_row_is_cached_in_dynamic_shared_memory_sized_per_call():
    ins, y, ref = softmax(te.var("m"), te.var("n"))
    s = auto_schedule([y], "cuda", sizes={"m": 4096, "n": 4096})
    assert "dynamic shared memory sized per launch" in s.plan.explain()
    mod = build(s, [*ins, y], target="cuda")
    (k,) = mod.gen.kernels
    assert "extern __shared__ __align__(16) unsigned char loopir_dyn_smem[]" in mod.source
    n_var = next(v for v in mod.program.params if v.name == "n")
    m_var = next(v for v in mod.program.params if v.name == "m")
    for n in (1, 3, 1000, 4097, 50257):
        assert dynamic_shared_bytes(k, {n_var: n, m_var: 5}) == -(-4 * n // 16) * 16
    _check_interp(s, ins, ref, 3, 37)


def test_a_constant_row_above_48_kib_goes_to_dynamic_shared_memory():
    ins, y, ref = softmax(2, 16384)
    # a block per row, not split, the row in shared memory (not in registers: 32 per thread of 512)
    s = auto_schedule([y], "cuda", rows={"split_rows_per_sm": 0, "register_row_max": 0})
    assert "dynamic shared memory above the static 48 KiB" in s.plan.explain()
    mod = build(s, [*ins, y], target="cuda")
    (k,) = mod.gen.kernels
    assert dynamic_shared_bytes(k, {}) == 65536 and "__shared__ float x_shared" not in mod.source
    _check_interp(s, ins, ref, 2, 16384)


def test_rows_below_48_kib_stay_static():
    ins, y, _ = softmax(2, 4096)
    mod = build([y], [*ins, y], target="cuda")
    assert dynamic_shared_bytes(mod.gen.kernels[0], {}) == 0 and "loopir_dyn_smem" not in mod.source


# ----------------------------------------------------------------------------- shared-memory budget


def test_the_planner_drops_a_row_cache_over_the_budget_and_says_so():
    ins, y, ref = softmax(4, 40000)  # 160 KB: over half the 227 KiB opt-in (two blocks per SM)
    plan = plan_fusion([y], "cuda", device=H200, rows={"split_rows_per_sm": 0, "cluster_row_max": 0})
    assert not plan.groups[0].caches
    assert ("shared memory with it (160.1 KB) exceeds the 116.2 KB per block (shared-memory budget) — re-read "
            "from global memory") in plan.explain()


def test_fit_shared_keeps_the_most_saving_rows_within_the_budget():
    kept, dropped = fit_shared([("a", 30_000, 30_000), ("b", 30_000, 60_000), ("c", 10_000, 10_000)], 256, 48 * 1024)
    assert kept == ["b", "c"] and dropped == ["a"]


def test_constant_shared_memory_beyond_the_device_is_refused_when_lowering():
    # a 280 KB row
    s, ins, y, _ = _fused_softmax(2, 70000)
    s.bind(s.loops("row_max")[0], "blockIdx.x")
    s.cache_row(ins[0], s.loops("row_max")[0])
    for phase in ("row_max", "row_sum"):
        s.bind_reduction(s.loops(phase)[-1], threads=128)
    for phase in ("x_shared", "y"):
        s.bind(s.split(s.loops(phase)[-1], 128)[1], "threadIdx.x")
    with pytest.raises(CudaCodegenError, match=r"needs 280,000 bytes of shared memory \(x_shared"):
        build(s, [*ins, y], target="cuda")


@pytest.mark.gpu
def test_a_launch_whose_symbolic_row_does_not_fit_is_refused_with_a_typed_error():
    ins, y, _ = softmax(te.var("m"), te.var("n"))
    mod = build(auto_schedule([y], "cuda", sizes={"m": 64, "n": 4096}), [*ins, y], target="cuda")
    x = np.random.default_rng(1).standard_normal((2, 70000)).astype(np.float32)
    with pytest.raises(SharedMemoryError, match="needs 280,000 bytes of dynamic shared memory"):
        mod(x, np.full_like(x, np.nan))


# ----------------------------------------------------------------------------- cache_row


def _fused_softmax(m, n):
    ins, y, ref = softmax(m, n)
    s = Schedule([y])
    s.fuse(s.loops("row_max")[0], s.loops("row_sum")[0])
    s.fuse(s.loops("row_max")[0], s.loops("y")[0])
    return s, ins, y, ref


def test_cache_row_copies_a_symbolic_row_and_redirects_every_reader():
    s, ins, y, ref = _fused_softmax(te.var("m"), te.var("n"))
    buf = s.cache_row(ins[0], s.loops("row_max")[0])
    text = str(s)
    assert f"allocate(float32[1, n], 'shared') as {buf.name}" in text and text.count(f"{buf.name}[0, ") == 3
    assert "x_shared[c0, c1] = x[i + c0, c1]" in text
    assert text.count("sync_threads()") == 2  # copy, then read; all read before the next row's copy
    rng = np.random.default_rng(3)
    a = rng.standard_normal((5, 9)).astype(np.float32)
    out = np.full_like(a, np.nan)
    interp.run(s.program, a, out)
    np.testing.assert_allclose(out, ref(a), rtol=1e-5)


def test_cache_row_refuses_a_row_written_inside_the_loop():
    n = te.var("n")
    from loopir import ir

    A = ir.buffer((4, n), name="A")
    b = ir.Builder("inplace")
    with b.loop("i", 0, 4) as i:
        with b.loop("j", 1, n) as j:
            b.store(A, (i, j), A[i, j - 1] + A[i, j], name="S")
    s = Schedule(b.finish([A]))
    with pytest.raises(ScheduleError):
        s.cache_row(A, s.loops("S")[0])


def test_cache_row_bad_arguments_are_typed_errors():
    s, ins, y, _ = _fused_softmax(te.var("m"), te.var("n"))
    with pytest.raises(ArgumentTypeError, match="cache_row: argument 'loop' must be a loop handle"):
        s.cache_row(ins[0], "i")
    with pytest.raises(LoopirError):
        s.cache_row("nope", s.loops("row_max")[0])
    with pytest.raises(ArgumentError, match="nothing inside loop"):
        s.cache_row("y", s.loops("row_max")[0])  # y is written there, never read


def test_cache_row_refuses_a_loop_inside_thread_loops():
    s, ins, y, _ = _fused_softmax(64, 32)
    io, ii = s.split(s.loops("row_max")[0], 4)
    s.bind(ii, "threadIdx.y")
    with pytest.raises(ArgumentError, match="inside a threadIdx-bound loop"):
        s.cache_row(ins[0], s.loops("row_max")[2])


# ----------------------------------------------------------------------------- GEMM detection, the block


def test_a_variance_is_a_row_reduction_not_a_gemm():
    B, T, C = te.var("B"), te.var("T"), 64
    x = te.placeholder((B, T, C), name="x")
    k = te.reduce_axis(C, "k")
    mu = te.compute((B, T), lambda i, t: te.sum(x[i, t, k], axis=k), name="mu")
    q = te.reduce_axis(C, "q")
    sq = te.compute((B, T), lambda i, t: te.sum((x[i, t, q] - mu[i, t]) * (x[i, t, q] - mu[i, t]), axis=q), name="sq")
    assert not operands_split(sq)
    a = te.placeholder((32, 16), name="a")
    w = te.placeholder((16, 8), name="w")
    r = te.reduce_axis(16, "r")
    mm = te.compute((32, 8), lambda i, j: te.sum(a[i, r] * w[r, j], axis=r), name="mm")
    assert operands_split(mm)
    assert all(g.mapping != "gemm" for g in plan_fusion([sq], "cuda", device=H200).groups)
    assert plan_fusion([mm], "cuda", device=H200).groups[0].mapping == "gemm"


def _block():
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
    import block_check

    return block_check


def test_the_transformer_block_builds_on_cuda_at_fixed_sizes():
    bc = _block()
    orig = te.var
    try:
        te.var = lambda name: {"B": 2, "T": 8}[name]  # type: ignore[assignment]
        ins, y = bc.block()
    finally:
        te.var = orig
    s = auto_schedule([y], "cuda")
    mod = build(s, [*ins, y], target="cuda")  # NVRTC compiles: nothing over the shared-memory budget
    assert mod.cubin[:4] == b"\x7fELF"
    for k in mod.gen.kernels:
        assert dynamic_shared_bytes(k, {}) <= 227 * 1024


# ----------------------------------------------------------------------------- on the device


@pytest.mark.gpu
@pytest.mark.parametrize("wl", sorted(WORKLOADS))
@pytest.mark.parametrize("m, n, sizes", [(7, 3, None), (1000, 1000, None), (5000, 100, None), (64, 4096, None),
                                         (7, 50257, None), (2, 16384, None), (1000, 70, {"m": 8192, "n": 100}),
                                         (33, 5000, {"m": 4096, "n": 8192}), (5, 30000, {"m": 64, "n": 4096})])
def test_every_strategy_runs_on_the_gpu(wl, m, n, sizes):
    symbolic = sizes is not None
    ins, y, ref = WORKLOADS[wl](te.var("m") if symbolic else m, te.var("n") if symbolic else n)
    _check_device(build(auto_schedule([y], "cuda", sizes=sizes), [*ins, y], target="cuda"), ins, ref, m, n)


@pytest.mark.parametrize("n, m", [(te.var("n"), te.var("m")), (768, 4096)])
def test_shares_of_symbolic_length_are_unrolled_by_a_pragma(n, m):
    # a thread's share of a reduction whose trip count is symbolic is unrolled by 8 (`pragma`, recorded in the
    # trace), its spatial chunks by 4; at fixed sizes the trip counts are constants that NVCC unrolls itself
    w = workloads.softmax_mixed(m, n, "float16")
    sym = not isinstance(n, int)
    s = auto_schedule(list(w.outputs), "cuda", sizes={"n": 768, "m": 65536} if sym else None)
    pragmas = [t for t in s.trace if t["primitive"] == "pragma"]
    src = build(s, list(w.inputs) + list(w.outputs), target="cuda").source
    if sym:
        assert len(pragmas) == 3 and "#pragma unroll 8\n" in src and "#pragma unroll 4\n" in src
        assert src.count("#pragma unroll 8\n") == 2  # the max and the sum shares
    else:
        assert pragmas == [] and "#pragma unroll 8" not in src


# ----------------------------------------------------------------------------- 16-byte reads in the shares

HALF_ROWS = {"softmax": workloads.softmax_mixed, "layernorm": workloads.layernorm_mixed, "rmsnorm": workloads.rmsnorm}


def _half_rows(wl: str, m, n, dtype: str = "float16"):
    return HALF_ROWS[wl](m=m, n=n, dtype=dtype)


def _check_half(w, sizes: dict, prog=None, mod=None) -> None:
    """`w` at `sizes` ({size Var: value}) on fresh random data, outputs NaN-poisoned, through the GPU interpreter
    in reversed thread order (`prog`) or on the device (`mod`), against its float64 reference."""
    from loopir.args import eval_expr

    rng = np.random.default_rng(sum(sizes.values()) + 1)
    dims = lambda t: [int(eval_expr(d, sizes)) if not isinstance(d, int) else d for d in t.shape]  # noqa: E731
    ins = [rng.standard_normal(dims(a)).astype(a.dtype) for a in w.inputs]
    outs = [np.full(dims(o), np.nan, o.dtype) for o in w.outputs]
    if mod is None:
        interp.run(prog, *ins, *outs, gpu_order="reversed", sizes={v.name: k for v, k in sizes.items()})
    else:
        mod(*ins, *outs)
    for got, want in zip(outs, w.reference(*ins)):
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=4e-3, atol=4e-3)


def _half_case(wl: str, sym: bool):
    m, n16 = te.var("m"), te.var("n16")
    w = _half_rows(wl, m, n16 * 16) if sym else _half_rows(wl, 256, 768)
    s = auto_schedule(list(w.outputs), "cuda", sizes={"n16": 48, "m": 65536} if sym else None)
    shapes = [{m: 3, n16: 48}, {m: 5, n16: 16}, {m: 2, n16: 2}] if sym else [{}]
    return w, s, shapes


@pytest.mark.parametrize("wl", sorted(HALF_ROWS))
@pytest.mark.parametrize("sym", [False, True])
def test_warp_row_shares_read_16_byte_chunks(wl, sym):
    # 16-bit rows of up to 1024 elements (a warp each): each lane's share of a reduction is split into chunks of
    # 8 halves, the chunk loop unrolled; the renderer reads a chunk with one 128-bit load (then the lanes of the
    # uint4), behind the 16-byte pointer test, the scalar loop as fallback
    w, s, shapes = _half_case(wl, sym)
    assert _strategy(s) == "warp" and "unroll" in [t["primitive"] for t in s.trace]
    mod = build(s, list(w.inputs) + list(w.outputs), target="cuda")
    shares = mod.source.count("// 128-bit loads over k")
    assert shares == {"softmax": 2, "layernorm": 2, "rmsnorm": 1}[wl], mod.source
    assert "loopir_h2f_lo(x_v.x)" in mod.source and mod.cubin[:4] == b"\x7fELF"
    prog = lower(s.program, "cuda")
    for sizes in shapes:
        _check_half(w, sizes, prog=prog)


@pytest.mark.gpu
@pytest.mark.parametrize("wl", sorted(HALF_ROWS))
@pytest.mark.parametrize("sym", [False, True])
def test_warp_row_shares_read_16_byte_chunks_on_the_gpu(wl, sym):
    w, s, shapes = _half_case(wl, sym)
    mod = build(s, list(w.inputs) + list(w.outputs), target="cuda")
    for sizes in shapes:
        _check_half(w, sizes, mod=mod)


def test_wide_uncached_rows_get_more_threads_and_the_parameter_says_how_many():
    """Rows of 65,536 float16 elements (131 KB: no cache holds them): every phase re-reads the row, with
    RowParams.uncached_threads threads per row (1024 by default, 512 when asked); a row that a cache holds keeps
    the planned threads; a bad value is refused naming the parameter."""
    from schedules.rows import RowParams

    x = te.placeholder((te.var("m"), 65536), "float16", name="x")
    k = te.reduce_axis(65536, name="k")
    mx = te.compute((x.shape[0],), lambda i: te.max(te.cast("float32", x[i, k]), axis=k), name="mx")
    y = te.compute(x.shape, lambda i, j: te.cast("float16", te.cast("float32", x[i, j]) - mx[i]), name="y")

    def threads(rows=None) -> str:  # the block row (not the default cluster)
        rows = {"cluster_row_max": 0, **(rows or {})}
        mod = build(auto_schedule([y], "cuda", sizes={"m": 4096}, rows=rows), [x, y], target="cuda")
        return str(mod.gen.kernels[0].launch.block[0])

    assert threads() == "1024" and threads({"uncached_threads": 512}) == "512"
    with pytest.raises(ArgumentError, match="uncached_threads"):
        RowParams.of({"uncached_threads": 100})
    xa = np.random.default_rng(3).standard_normal((2, 65536)).astype(np.float16)
    got = np.full((2, 65536), np.nan, np.float16)
    s = auto_schedule([y], "cuda", sizes={"m": 4096})
    interp.run(lower(s.program, "cuda"), xa, got, gpu_order="reversed")
    want = (xa.astype(np.float32) - xa.astype(np.float32).max(axis=1, keepdims=True)).astype(np.float16)
    np.testing.assert_array_equal(got, want)
