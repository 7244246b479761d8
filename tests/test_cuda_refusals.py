"""CUDA false refusals (issue 17): schedules valid and correct on the CPU that the CUDA target refused.

1. `cache_write(X, "local", tx)` with one element per thread: every thread writes element 0 of its
   own registers, which is no cross-thread reduction.
2. A cross-thread reduction inside a `threadIdx.y` loop (TVM's reduction tutorial: rows on
   threadIdx.y, the reduction on threadIdx.x), with the row guard of a size the tile does not divide:
   the guard becomes a predicate, every thread reaches the all-reduce, which reduces per row.
3. Thread-bound loops whose extents vary with the block index (a compute_at'd producer's clipped
   tile, Halide's blur "Cache" schedule): launched at the exact isl maximum of the extent, guarded.

Each: the CPU build matches numpy, the CUDA source compiles with NVRTC, and (gpu mark) the GPU matches numpy.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from codegen import build
from codegen.cuda import CudaCodegenError
from codegen.passes.launch import isl_max
from loopir import interp, ir, te
from loopir import nodes as N
from schedules import Schedule


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOPIR_CACHE_DIR", str(tmp_path / "cache"))


def _cubin(mod) -> None:
    assert mod.cubin[:4] == b"\x7fELF" and len(mod.cubin) > 1000


def _nan(shape) -> np.ndarray:
    return np.full(shape, np.nan, np.float32)


# ----------------------------------------------------------------------------- 1. cache_write local per thread


def cache_write_matmul(n: int = 64, m: int = 48, k: int = 32):
    """B = A @ Bm; rows on blockIdx.x, columns split over blockIdx.y / threadIdx.x (one element per thread),
    the accumulator cached in registers at the thread loop (TVM: s.cache_write(B, "local"), compute_at tx)."""
    A = te.placeholder((n, k), name="A")
    Bm = te.placeholder((k, m), name="Bm")
    r = te.reduce_axis(k, "r")
    B = te.compute((n, m), lambda i, j: te.sum(A[i, r] * Bm[r, j], axis=r), name="B")
    s = Schedule(B)
    i, j, _ = s.loops("B")
    jo, ji = s.split(j, 16)
    s.bind(i, "blockIdx.x").bind(jo, "blockIdx.y").bind(ji, "threadIdx.x")
    local = s.cache_write(B, "local", ji)
    return s, (A, Bm, B), local


def _matmul_data(n: int = 64, m: int = 48, k: int = 32):
    rng = np.random.default_rng(5)
    return rng.uniform(0.5, 1.5, (n, k)).astype(np.float32), rng.uniform(0.5, 1.5, (k, m)).astype(np.float32)


def test_cache_write_local_one_element_per_thread_builds():
    s, bufs, local = cache_write_matmul()
    assert [int(d.value) for d in local.shape] == [1, 1]
    mod = build(s, list(bufs), target="cuda")
    _cubin(mod)
    src = mod.source
    assert "float B_local[1];  // local B_local" in src
    assert "B_local[0] = 0.0f;" in src and "loopir_block_allreduce" not in src  # no cross-thread reduction
    a, b = _matmul_data()
    out = _nan((64, 48))
    build(s, list(bufs), target="cpu")(a, b, out)
    np.testing.assert_allclose(out, a @ b, rtol=1e-5)


def test_a_shared_element_written_by_every_thread_is_still_refused():
    n = N.Var("n")
    x = N.Buffer("x", (n,), "float32")
    y = N.Buffer("y", (N.const(1),), "float32", "shared")
    o = N.Buffer("o", (n,), "float32")
    k = N.Var("k")
    st = N.Store("last", y, (N.const(0),), x[k], (k,), (k,))
    cp = N.Store("out", o, (k,), y[0], (k,), (k,))
    body = N.Allocate(y, N.For(k, N.const(0), n, N.Seq((st, cp)), "thread", "threadIdx.x"))
    with pytest.raises(CudaCodegenError, match="'last'.*not a reduction"):
        build(N.Program("last", (x, o), body, (), (n,)), target="cuda")


# ----------------------------------------------------------------------------- 2. reduction inside threadIdx.y


def row_sum(rows_per_block: int = 32, threads: int = 16):
    """TVM's reduction tutorial: B[i] = sum_k A[i, k]; rows split by 32 over blockIdx.x / threadIdx.y,
    the reduction over 16 threads of threadIdx.x (bind_reduction), each a strided share of k."""
    n, m = te.var("n"), te.var("m")
    A = te.placeholder((n, m), name="A")
    k = te.reduce_axis(m, "k")
    B = te.compute((n,), lambda i: te.sum(A[i, k], axis=k), name="B")
    s = Schedule(B)
    i, kk = s.loops("B")
    io, ii = s.split(i, rows_per_block)
    s.bind(io, "blockIdx.x").bind(ii, "threadIdx.y")
    s.bind_reduction(kk, "threadIdx.x", threads=threads)
    return s, (A, B)


def test_reduction_inside_threadidx_y_builds_with_a_predicated_row_guard():
    s, bufs = row_sum()
    text = str(s)
    assert "# threadIdx.y" in text and "if i_o * 32 + i_i < n:" in text
    mod = build(s, list(bufs), target="cuda")
    _cubin(mod)
    src = mod.source
    (k,) = mod.gen.kernels
    # 16 reduction threads per row, 32 rows: two rows per warp, reduced by shuffles within 16 lanes
    assert [str(e) for e in k.launch.block] == ["16", "32", "1"]
    red = "B_acc = loopir_subwarp_allreduce<16>(B_acc, loopir_op_add());"
    assert red in src and "__shfl_xor_sync(0xffffffffu, v, o, W)" in src and "__shared__" not in src
    # the row guard is a predicate: the all-reduce is outside every `if`, reached by every thread
    assert "const bool pred = cond;" in src
    before = src[:src.index(red)]
    assert before.count("{") - before.count("}") == 3  # kernel, block loop, threadIdx.y loop: no `if` around it
    assert "if (pred && threadIdx.x == 0) B[" in src[src.index(red):]
    assert "const float B_before = 0.0f;" in src  # the init constant, not a read of B
    assert re.search(r"if \(pred\) \{\s*\{  // B_init", src)


def test_reduction_inside_threadidx_y_without_a_guard_has_no_predicate():
    # constant sizes the tiles divide: no row guard, so nothing to predicate
    A = te.placeholder((64, 100), name="A")
    k = te.reduce_axis(100, "k")
    B = te.compute((64,), lambda i: te.max(A[i, k], axis=k), name="B")
    s2 = Schedule(B)
    i, kk = s2.loops("B")
    io, ii = s2.split(i, 8)
    s2.bind(io, "blockIdx.x").bind(ii, "threadIdx.y")
    s2.bind_reduction(kk, "threadIdx.x", threads=64)
    mod = build(s2, [A, B], target="cuda")
    _cubin(mod)
    # 64 threads per row: two warps, the block all-reduce per row (shared scratch indexed by the row)
    assert "pred" not in mod.source and "loopir_block_allreduce(B_acc, loopir_op_max()" in mod.source
    assert [str(e) for e in mod.gen.kernels[0].launch.block] == ["64", "8", "1"]
    a = np.random.default_rng(2).standard_normal((64, 100)).astype(np.float32)
    out = _nan(64)
    build(s2, [A, B], target="cpu")(a, out)
    np.testing.assert_array_equal(out, a.max(1))


def test_rows_narrower_than_a_warp_that_are_not_whole_warps_use_the_block_all_reduce():
    s, bufs = row_sum(rows_per_block=3, threads=8)  # 8 x 3 = 24 threads: not whole warps
    mod = build(s, list(bufs), target="cuda")
    _cubin(mod)
    assert [str(e) for e in mod.gen.kernels[0].launch.block] == ["32", "3", "1"]
    assert "loopir_block_allreduce(B_acc" in mod.source and "subwarp" not in mod.source


@pytest.mark.parametrize("shape", [(70, 100), (32, 16), (1, 3)])
def test_row_sum_on_the_cpu_matches_numpy(shape):
    s, bufs = row_sum()
    a = np.random.default_rng(3).uniform(0.5, 1.5, shape).astype(np.float32)
    out = _nan(shape[0])
    build(s, list(bufs), target="cpu")(a, out)
    np.testing.assert_allclose(out, a.sum(1), rtol=1e-5)
    out2 = _nan(shape[0])
    interp.run(s.program, a, out2)
    np.testing.assert_allclose(out2, a.sum(1), rtol=1e-5)


def _evenodd_program() -> N.Program:
    """if i is even: B[i] = sum A[i, :] else: B[i] = max A[i, :] — both branches reduce across threadIdx.x,
    under the row guard and a thread-dependent condition."""
    n, m = N.Var("n"), N.Var("m")
    A = N.Buffer("A", (n, m), "float32")
    B = N.Buffer("B", (n,), "float32")
    io, ii, k, ks = N.Var("io"), N.Var("ii"), N.Var("k"), N.Var("ks")
    i = io * 4 + ii

    def red(name: str, op: str, init: float) -> N.Stmt:
        iv, kv = N.Var("i"), N.Var("k")
        st0 = N.Store(name + "_init", B, (iv,), N.const(init, "float32"), (iv,), (i,))
        st = N.Store(name, B, (iv,), N.binary(op, B[iv], A[iv, kv]), (iv, kv), (i, ks * 32 + k))
        loop = N.For(k, N.const(0), N.const(32), N.For(ks, N.const(0), (m + 31) // 32, N.If(ks * 32 + k < m, st)),
                     "thread", "threadIdx.x")
        return N.Seq((st0, loop))

    guarded = N.If(i < n, N.If((i % 2).eq(0), red("S", "add", 0.0), red("M", "max", -np.inf)))
    body = N.For(io, N.const(0), (n + 3) // 4, N.For(ii, N.const(0), N.const(4), guarded, "thread", "threadIdx.y"),
                 "thread", "blockIdx.x")
    return N.Program("evenodd", (A, B), body, (), (n, m))


def _evenodd_reference(a: np.ndarray) -> np.ndarray:
    return np.where(np.arange(len(a)) % 2 == 0, a.sum(1), a.max(1))


def test_reduction_under_a_thread_dependent_else_branch_is_predicated_both_ways():
    p = _evenodd_program()
    mod = build(p, target="cuda")
    _cubin(mod)
    # a row is a whole warp (blockDim.x == 32): shuffles within it, no barrier; every lane reaches each shuffle
    # (the branch predicates the accumulation, not the reduction), so the full-warp mask holds
    body = mod.source[mod.source.index("__global__"):]  # the kernel, after the prelude
    assert body.count("loopir_subwarp_allreduce<32>(") == 2 and "loopir_block_allreduce(" not in body
    assert "&& !cond" in mod.source
    a = np.random.default_rng(4).standard_normal((9, 70)).astype(np.float32)
    out = _nan(9)
    build(p, target="cpu")(a, out)
    np.testing.assert_allclose(out, _evenodd_reference(a), rtol=1e-5)


# ----------------------------------------------------------------------------- 3. block-varying thread extents


def compute_at_producer():
    """bx = 2 * inp, by = bx + 1, by tiled 8x8 over blocks and threads, bx compute_at'd at the tile and its
    clipped loops (`min(w, 8*x_o + 8) - max(8*x_o, 0)`) bound to threads."""
    h, w = te.var("h"), te.var("w")
    inp = te.placeholder((h, w), name="inp")
    bx = te.compute((h, w), lambda y, x: inp[y, x] * 2.0, name="bx")
    by = te.compute((h, w), lambda y, x: bx[y, x] + 1.0, name="by")
    s = Schedule(by)
    y, x = s.loops(by)
    yo, yi = s.split(y, 8)
    xo, xi = s.split(x, 8)
    s.reorder(yo, xo, yi, xi)
    s.compute_at(bx, xo)
    s.bind(yo, "blockIdx.y").bind(xo, "blockIdx.x").bind(yi, "threadIdx.y").bind(xi, "threadIdx.x")
    _, _, yc, xc = s.loops(bx)
    s.bind(yc, "threadIdx.y").bind(xc, "threadIdx.x")
    return s, (inp, by)


def test_compute_at_producer_thread_extents_are_launched_at_their_maximum():
    s, bufs = compute_at_producer()
    assert "min(h - 8 * y_o, 8)):  # threadIdx.y" in str(s)  # the clipped extent, simplified by isl
    mod = build(s, list(bufs), target="cuda")
    _cubin(mod)
    (k,) = mod.gen.kernels
    assert [str(e) for e in k.launch.block] == ["8", "8", "1"]
    # the producer keeps its exact guard; the consumer's 8 x 8 loops need none
    assert re.search(r"if \(y_c < \(?loopir_min\(", mod.source)
    assert "if (y_i < 8)" not in mod.source
    a = np.random.default_rng(6).standard_normal((37, 50)).astype(np.float32)
    out = _nan((37, 50))
    build(s, list(bufs), target="cpu")(a, out)
    np.testing.assert_allclose(out, a * 2 + 1, rtol=1e-6)


def blur_cache(barrier: bool = True):
    """Halide's blur with the "Cache" schedule: blur_y tiled 8x8 on the GPU, blur_x computed per tile into
    shared memory with its halo (10 x 8), its rows clipped to the image: `min(8*y_o + 10, h + 2) - max(8*y_o, 0)`.
    Written with the builder (the shared tile is explicit), bound with checked schedule steps. Without
    `barrier`, the lowering must place the one between the producer's threads and the consumer's."""
    h, w = te.var("h"), te.var("w")
    inp = ir.buffer((h + 2, w + 2), name="inp")
    out = ir.buffer((h, w), name="by")
    b = ir.Builder("blur")
    with b.loop("y_o", 0, (h + 7) // 8) as yo:
        with b.loop("x_o", 0, (w + 7) // 8) as xo:
            with b.allocate((10, 8), "float32", name="bx", scope="shared") as bx:
                with b.loop("y_c", 0, te.minimum(8 * yo + 10, h + 2) - te.maximum(8 * yo, 0)) as yc:
                    with b.loop("x_c", 0, te.minimum(8 * xo + 8, w) - 8 * xo) as xc:
                        y, x = 8 * yo + yc, 8 * xo + xc
                        b.store(bx, (yc, xc), (inp[y, x] + inp[y, x + 1] + inp[y, x + 2]) / 3.0, name="bx")
                if barrier:
                    b.barrier()
                with b.loop("y_i", 0, 8) as yi:
                    with b.loop("x_i", 0, 8) as xi:
                        with b.if_((8 * yo + yi < h) & (8 * xo + xi < w)):
                            v = (bx[yi, xi] + bx[yi + 1, xi] + bx[yi + 2, xi]) / 3.0
                            b.store(out, (8 * yo + yi, 8 * xo + xi), v, name="by")
    s = Schedule(b.finish([inp, out]))
    yo_, xo_, yc_, xc_ = s.loops("bx")
    s.bind(yo_, "blockIdx.y").bind(xo_, "blockIdx.x").bind(yc_, "threadIdx.y").bind(xc_, "threadIdx.x")
    _, _, yi_, xi_ = s.loops("by")
    s.bind(yi_, "threadIdx.y").bind(xi_, "threadIdx.x")
    return s, (inp, out)


def blur_reference(a: np.ndarray) -> np.ndarray:
    a = a.astype(np.float64)
    bx = (a[:, :-2] + a[:, 1:-1] + a[:, 2:]) / 3
    return (bx[:-2] + bx[1:-1] + bx[2:]) / 3


def test_blur_cache_schedule_builds_with_exact_launch_extents():
    s, bufs = blur_cache()
    assert "min(8 * y_o + 10, h + 2) - max(8 * y_o, 0)):  # threadIdx.y" in str(s)
    mod = build(s, list(bufs), target="cuda")
    _cubin(mod)
    (k,) = mod.gen.kernels
    assert [str(e) for e in k.launch.block] == ["8", "10", "1"]
    assert "if (y_i < 8)" in mod.source  # the consumer's rows: 8 of the 10 launched
    assert "__shared__ __align__(16) float bx[80];" in mod.source


@pytest.mark.parametrize("shape", [(37, 50), (8, 8), (1, 3)])
def test_blur_cache_on_the_cpu_matches_numpy(shape):
    s, bufs = blur_cache()
    h, w = shape
    a = np.random.default_rng(8).uniform(0, 1, (h + 2, w + 2)).astype(np.float32)
    out = _nan(shape)
    build(s, list(bufs), target="cpu")(a, out)
    np.testing.assert_allclose(out, blur_reference(a), rtol=1e-5)
    out2 = _nan(shape)
    interp.run(s.program, a, out2)
    np.testing.assert_allclose(out2, blur_reference(a), rtol=1e-5)


def test_isl_max_of_extents():
    n, w = N.Var("n"), N.Var("w")
    i, xo = N.Var("i"), N.Var("xo")
    tri = N.For(i, N.const(0), n, N.Barrier())
    assert str(isl_max(i + 1, (tri,))) == "n"  # a triangular extent: at most n
    tiles = N.For(xo, N.const(0), (w + 7) // 8, N.Barrier())
    ext = N.binary("min", 8 * xo + 8, w) - 8 * xo
    assert str(isl_max(ext, (tiles,))) == "min(8, w)"
    assert str(isl_max(N.binary("max", N.binary("min", N.const(8), w), N.const(8)))) == "8"
    # isl's maximum is 8 / 9 / 10 by ranges of h, no max or min of its pieces: the bound is 10
    assert str(isl_max(N.binary("max", N.binary("min", N.const(10), n + 2), N.const(8)))) == "10"
    assert isl_max(i * i, (tri,)) is None  # non-affine
    assert isl_max(i, (N.For(i, N.const(0), N.Load(N.Buffer("L", (), "int64"), ()), N.Barrier()),)) is None


def test_triangular_thread_extent_is_launched_at_n():
    n = N.Var("n")
    x = N.Buffer("x", (n, n), "float32")
    i, j = N.Var("i"), N.Var("j")
    st = N.Store("tri", x, (i, j), N.const(1.0, "float32"), (i, j), (i, j))
    body = N.For(i, N.const(0), n, N.For(j, N.const(0), i + 1, st, "thread", "threadIdx.x"), "thread", "blockIdx.x")
    mod = build(N.Program("tri", (x,), body, (), (n,)), target="cuda")
    assert [str(e) for e in mod.gen.kernels[0].launch.block] == ["n", "1", "1"]
    assert "if (j < (i + 1))" in mod.source


# ----------------------------------------------------------------------------- on the GPU


@pytest.mark.gpu
def test_cache_write_local_on_the_gpu():
    s, bufs, _ = cache_write_matmul()
    mod = build(s, list(bufs), target="cuda")
    a, b = _matmul_data()
    out = _nan((64, 48))
    mod(a, b, out)
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", [(32, 16), (3, 8), (8, 64)], ids=["subwarp", "block-rounded", "two-warps"])
@pytest.mark.parametrize("shape", [(70, 100), (1024, 1000), (5, 3)])
def test_row_sum_on_the_gpu(shape, layout):
    s, bufs = row_sum(*layout)
    mod = build(s, list(bufs), target="cuda")
    a = np.random.default_rng(9).uniform(0.5, 1.5, shape).astype(np.float32)
    for _ in range(3):
        out = _nan(shape[0])
        mod(a, out)
        np.testing.assert_allclose(out, a.astype(np.float64).sum(1), rtol=1e-5)


@pytest.mark.gpu
def test_even_odd_reductions_on_the_gpu():
    a = np.random.default_rng(4).standard_normal((9, 70)).astype(np.float32)
    mod = build(_evenodd_program(), target="cuda")
    for _ in range(3):
        out = _nan(9)
        mod(a, out)
        np.testing.assert_allclose(out, _evenodd_reference(a), rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(37, 50), (256, 256)])
def test_compute_at_producer_on_the_gpu(shape):
    s, bufs = compute_at_producer()
    mod = build(s, list(bufs), target="cuda")
    a = np.random.default_rng(6).standard_normal(shape).astype(np.float32)
    out = _nan(shape)
    mod(a, out)
    np.testing.assert_allclose(out, a * 2 + 1, rtol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(37, 50), (512, 300), (1, 3)])
def test_blur_cache_on_the_gpu(shape):
    s, bufs = blur_cache()
    mod = build(s, list(bufs), target="cuda")
    h, w = shape
    a = np.random.default_rng(8).uniform(0, 1, (h + 2, w + 2)).astype(np.float32)
    for _ in range(3):
        out = _nan(shape)
        mod(a, out)
        np.testing.assert_allclose(out, blur_reference(a), rtol=1e-5)
