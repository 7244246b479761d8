"""GPU tiling idioms of issue 20 item 1: split(nparts=) (constant and symbolic extents), virtual threads
(bind(loop, "vthread") / s.vthread) and the loops of a shared cache_read copy stage; each with its printed
nest, its refusals (a witness checked against the access functions), numerics against numpy on the CPU target,
the CUDA kernel built through NVRTC and run in the adversarial GPU interpreter; CUDA numerics are `gpu` tests."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from codegen import build
from codegen.passes import lower as lower_passes
from loopir import interp, ir, te
from loopir.errors import ArgumentError, ArgumentTypeError
from loopir.nodes import For, Program
from loopir.visit import walk
from schedules import InexactCheckError, Schedule
from tests.witness_check import refused_step as _refused

import schedules.primitives.cache  # noqa: F401  (registers s.cache_read)
import schedules.primitives.cache_write  # noqa: F401  (registers s.cache_write)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ORDERS = ("reversed", "forward", 0, 1)


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOPIR_CACHE_DIR", str(tmp_path / "cache"))


def _x(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _nan(shape: tuple[int, ...]) -> np.ndarray:
    return np.full(shape, np.nan, np.float32)


def _cuda_adversarial(s: Schedule, tensors: list, inputs: list[np.ndarray], want: np.ndarray,
                      orders: tuple = ORDERS) -> None:
    """The CUDA kernel compiles (NVRTC, no device needed) and the lowered program is right in the GPU
    interpreter under adversarial thread orders."""
    mod = build(s, tensors, target="cuda")
    assert "__global__" in mod.source and mod.cubin[:4] == b"\x7fELF"
    low = lower_passes(s.program, "cuda")
    for order in orders:
        out = _nan(want.shape)
        interp.run(low, *inputs, out, gpu_order=order)
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4, err_msg=f"gpu_order={order!r}")


def _add2d(n=None, m=None):  # noqa: ANN001, ANN202
    n = te.var("n") if n is None else n
    m = te.var("m") if m is None else m
    X = te.placeholder((n, m), name="X")
    return X, te.compute((n, m), lambda i, j: X[i, j] * 2.0 + 1.0, name="Y")


# ----------------------------------------------------------------------------- split(nparts=)


def test_split_nparts_constant_printed_nest_and_numerics():
    X, Y = _add2d(5, 10)
    s = Schedule(Y)
    i, j = s.loops(Y)
    jo, ji = s.split(j, nparts=4)  # TVM: outer extent 4, inner ceil(10 / 4) = 3, the last part guarded
    assert str(s) == (
        "def Y(X: float32[5, 10], Y: float32[5, 10]):\n"
        "    for i in range(0, 5):\n"
        "        for j_o in range(0, 4):\n"
        "            for j_i in range(0, 3):\n"
        "                if j_o * 3 + j_i < 10:\n"
        "                    Y[i, j] = X[i, j] * 2.0 + 1.0  # Y (j = j_o * 3 + j_i)"
    )
    x = _x((5, 10), 1)
    out = _nan((5, 10))
    build(s, [X, Y], target="cpu")(x, out)
    np.testing.assert_allclose(out, x.astype(np.float64) * 2 + 1, rtol=1e-6)


def test_split_nparts_outer_extent_is_nparts_even_when_parts_are_empty():
    # extent 9 in 4 parts: inner 3, so 3 parts would do; TVM keeps 4 (a thread axis of 4), the 4th empty
    X, Y = _add2d(2, 9)
    s = Schedule(Y)
    _, j = s.loops(Y)
    s.split(j, nparts=4)
    text = str(s)
    assert "for j_o in range(0, 4):" in text and "for j_i in range(0, 3):" in text and "if j_o * 3 + j_i < 9" in text
    x, out = _x((2, 9), 2), _nan((2, 9))
    build(s, [X, Y], target="cpu")(x, out)
    np.testing.assert_allclose(out, x * np.float32(2) + np.float32(1))


def test_split_nparts_dividing_has_no_guard():
    X, Y = _add2d(3, 12)
    s = Schedule(Y)
    _, j = s.loops(Y)
    s.split(j, nparts=4)
    assert "if" not in str(s) and "for j_i in range(0, 3):" in str(s)


def test_split_needs_exactly_one_of_factor_and_nparts():
    _, Y = _add2d()
    s = Schedule(Y)
    i, _ = s.loops(Y)
    with pytest.raises(ArgumentError, match="exactly one of factor= .* and nparts="):
        s.split(i)
    with pytest.raises(ArgumentError, match="got both"):
        s.split(i, 4, nparts=2)
    with pytest.raises(ArgumentError, match="nparts must be >= 1, got 0"):
        s.split(i, nparts=0)
    with pytest.raises(ArgumentTypeError, match="nparts must be a positive int, got float 2.5"):
        s.split(i, nparts=2.5)
    assert not s.trace


def test_split_nparts_trace_replays():
    X, Y = _add2d(6, 7)
    s = Schedule(Y)
    i, j = s.loops(Y)
    jo, _ = s.split(j, nparts=3)
    s.parallel(i)
    again = Schedule.replay(s.trace_json(), Y)
    assert str(again) == str(s)
    assert again.trace[0]["kwargs"] == {"nparts": 3}


def _chain(n: int):  # noqa: ANN202
    """A[i] = A[i - 1] * 0.5 + X[i] over i = 1..n-1 (each iteration reads the previous one's write)."""
    A = ir.buffer((n,), name="A")
    X = ir.buffer((n,), name="X")
    b = ir.Builder("chain")
    with b.loop("i", 1, n) as i:
        b.store(A, (i,), A[i - 1] * 0.5 + X[i], name="S")
    return b.finish([A, X])


def test_split_nparts_refusal_of_a_later_reorder_has_a_real_witness():
    s = Schedule(_chain(11))
    (i,) = s.loops("S")
    io, ii = s.split(i, nparts=4)
    err = _refused(s, "reorder", ii, io)
    assert err.kind == "flow" and err.buffer == "A"


def _symbolic_sum():
    n, m = te.var("n"), te.var("m")
    X = te.placeholder((m, n), name="X")
    k = te.reduce_axis(n, name="k")
    return X, te.compute((m,), lambda r: te.sum(X[r, k], axis=k), name="S")


def test_split_nparts_symbolic_printed_nest_and_numerics():
    n = te.var("n")
    X = te.placeholder((n,), name="X")
    Y = te.compute((n,), lambda i: X[i] * 3.0 - 1.0, name="Y")
    s = Schedule(Y)
    (i,) = s.loops(Y)
    io, ii = s.split(i, nparts=4)
    assert str(s) == (
        "def Y(X: float32[n], Y: float32[n]):  # sizes: n\n"
        "    for i_o in range(0, 4):\n"
        "        for i_i in range(0, (n + 3) // 4):\n"
        "            if i_o * ((n + 3) // 4) + i_i < n:\n"
        "                Y[i] = X[i] * 3.0 - 1.0  # Y (i = i_o * ((n + 3) // 4) + i_i)"
    )
    s.parallel(io)  # the outer loop carries nothing: checked (over-approximately, and accepted)
    mod = build(s, [X, Y], target="cpu")
    for size in (1, 3, 4, 13, 64):
        x, out = _x((size,), size), _nan((size,))
        mod(x, out)
        np.testing.assert_allclose(out, x * np.float32(3) - np.float32(1), err_msg=f"n={size}")


def test_split_nparts_symbolic_reduction_numerics_and_inexact_later_step():
    X, S = _symbolic_sum()
    s = Schedule(S)
    r, k = s.loops(S)
    ko, ki = s.split(k, nparts=4)  # proved legal for every factor: accepted
    s.parallel(r)  # a loop whose dependences the over-approximation still rules out: accepted
    mod = build(s, [X, S], target="cpu")
    for m, n in ((3, 1), (2, 7), (5, 16)):
        x, out = _x((m, n), m * n), _nan((m,))
        mod(x, out)
        np.testing.assert_allclose(out, x.astype(np.float64).sum(axis=1), rtol=1e-5, atol=1e-5)
    before = s.program
    with pytest.raises(InexactCheckError, match=r"reorder\(k_i, k_o\) cannot be checked exactly: the new nest is "
                                                r"not affine"):
        s.reorder(ki, ko)
    assert s.program is before


def _symbolic_rows():  # noqa: ANN202
    n, m = te.var("n"), te.var("m")
    X = te.placeholder((m, n), name="X")
    Y = te.compute((m, n), lambda r, i: X[r, i] * 3.0 - 1.0, name="Y")
    s = Schedule(Y)
    r, i = s.loops(Y)
    t, _ = s.split(i, nparts=32)  # 32 threads per row, each a contiguous part of ceil(n / 32)
    s.bind(r, "blockIdx.x").bind(t, "threadIdx.x")
    return (X, Y), s


def test_split_nparts_symbolic_cuda_builds_and_runs_adversarially():
    (X, Y), s = _symbolic_rows()
    assert "for i_i in range(0, (n + 31) // 32):" in str(s)
    x = _x((3, 70), 5)
    _cuda_adversarial(s, [X, Y], [x], x * np.float32(3) - np.float32(1))


@pytest.mark.gpu
def test_split_nparts_symbolic_on_the_gpu():
    (X, Y), s = _symbolic_rows()
    mod = build(s, [X, Y], target="cuda")
    for m, n in ((1, 1), (3, 70), (4, 1000)):
        x, out = _x((m, n), n), _nan((m, n))
        mod(x, out)
        # the GPU contracts x * 3 - 1 into one fma (one rounding): compare with the exact value, to float32's ulp
        np.testing.assert_allclose(out, x.astype(np.float64) * 3 - 1, rtol=1e-6, atol=1e-7, err_msg=f"{m} x {n}")


# ----------------------------------------------------------------------------- virtual threads


def _matmul(n: int, m: int, p: int):  # noqa: ANN202
    A = te.placeholder((n, p), name="A")
    B = te.placeholder((p, m), name="B")
    k = te.reduce_axis(p, name="k")
    return A, B, te.compute((n, m), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")


def _vthread_matmul(order: str = "vthread-first"):  # noqa: ANN202
    A, B, C = _matmul(16, 32, 8)
    s = Schedule(C)
    i, j, _ = s.loops(C)
    vi, ti = s.split(i, nparts=2)    # 2 virtual threads along i, each 8 rows ...
    vj, tj = s.split(j, nparts=2)
    ty, ii = s.split(ti, nparts=4)   # ... over 4 x 4 threads
    tx, jj = s.split(tj, nparts=4)
    s.reorder(vi, vj, ty, tx, ii, jj)
    if order == "vthread-first":     # TVM's order: the thread loops are bound after the virtual threads
        s.bind(vi, "vthread").vthread(vj)
        s.bind(ty, "threadIdx.y").bind(tx, "threadIdx.x")
    else:
        s.bind(ty, "threadIdx.y").bind(tx, "threadIdx.x")
        s.bind(vi, "vthread").bind(vj, "vthread")
    return (A, B, C), s


VTHREAD_NEST = (
    "    for i_i_o in range(0, 4):  # threadIdx.y\n"
    "        for j_i_o in range(0, 4):  # threadIdx.x\n"
    "            for i_o in unroll(0, 2):\n"
    "                for j_o in unroll(0, 2):\n"
    "                    for i_i_i in range(0, 2):\n"
    "                        for j_i_i in range(0, 4):\n"
)


@pytest.mark.parametrize("order", ["vthread-first", "threads-first"])
def test_vthread_moves_inside_the_thread_loops(order):
    _, s = _vthread_matmul(order)
    text = str(s)
    assert VTHREAD_NEST in text, text
    # a thread (ty, tx) computes rows i_o*8 + ty*2 + ii: the virtual thread strides its tile by 8 rows
    assert "i = i_o * 8 + (i_i_o * 2 + i_i_i)" in text
    vth = [f for f in walk(s.program.body) if isinstance(f, For) and f.thread == "vthread"]
    assert [f.var.name for f in vth] == ["i_o", "j_o"] and all(f.kind == "unroll" for f in vth)


def test_vthread_numerics_cpu_and_cuda_adversarial():
    (A, B, C), s = _vthread_matmul()
    a, b = _x((16, 8), 1), _x((8, 32), 2)
    want = a.astype(np.float64) @ b
    out = _nan((16, 32))
    build(s, [A, B, C], target="cpu")(a, b, out)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    _cuda_adversarial(s, [A, B, C], [a, b], want)


def _tvm_tile(vthread: bool):  # noqa: ANN202
    """TVM's opt_gemm / opt_conv thread tile: 2 virtual threads x 4 threads x a block of 2 per axis."""
    A, B, C = _matmul(16, 32, 8)
    s = Schedule(C)
    i, j, _ = s.loops(C)
    vi, ti = s.split(i, nparts=2)
    vj, tj = s.split(j, nparts=2)
    ty, ii = s.split(ti, nparts=4)
    tx, jj = s.split(tj, nparts=4)
    s.reorder(vi, vj, ty, tx, ii, jj)
    if vthread:
        s.bind(vi, "vthread").bind(vj, "vthread")
    s.bind(ty, "threadIdx.y").bind(tx, "threadIdx.x")
    if not vthread:
        s.reorder(ty, tx, vi, vj)  # the same order, by hand, without the vthread marks
    s.cache_write("C", "local", tx)
    return (A, B, C), s


def test_cache_write_compacts_the_tile_of_virtual_threads():
    # thread (ty, tx) owns rows {2ty, 2ty + 1, 8 + 2ty, 8 + 2ty + 1}: with vthreads the register tile is the 4
    # of them ((r // 8)*2 + r % 8), not the 10-row box; a loop order made by hand keeps the box (no change there)
    (A, B, C), s = _tvm_tile(vthread=True)
    text = str(s)
    assert "allocate(float32[4, 8], 'local') as C_local" in text, text
    assert "C_local[2 * i_o + i_i_i, 4 * j_o + j_i_i] = 0.0" in text
    assert ("C[C_q0 // 2 * 8 + C_q0 % 2 + 2 * i_i_o, C_q1 // 4 * 16 + C_q1 % 4 + 4 * j_i_o] = C_local[C_q0, C_q1]"
            in text)
    _, plain = _tvm_tile(vthread=False)
    assert "allocate(float32[10, 20], 'local') as C_local" in str(plain)
    a, b = _x((16, 8), 17), _x((8, 32), 18)
    want = a.astype(np.float64) @ b
    out = _nan((16, 32))
    build(s, [A, B, C], target="cpu")(a, b, out)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    _cuda_adversarial(s, [A, B, C], [a, b], want)


@pytest.mark.gpu
def test_cache_write_vthread_tile_on_the_gpu():
    (A, B, C), s = _tvm_tile(vthread=True)
    a, b = _x((16, 8), 19), _x((8, 32), 20)
    out = _nan((16, 32))
    build(s, [A, B, C], target="cuda")(a, b, out)
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)


def _shifted() -> Program:
    """for v in 0..2: for t in 0..4: A[v + 1, t] = A[v, t + 1] * 2 — t carries nothing, but (v, t) -> (v + 1,
    t - 1) is a dependence: moving v inside t would run the read before the write."""
    A = ir.buffer((3, 5), name="A")
    b = ir.Builder("shifted")
    with b.loop("v", 0, 2) as v:
        with b.loop("t", 0, 4) as t:
            b.store(A, (v + 1, t), A[v, t + 1] * 2.0, name="S")
    return b.finish([A])


def test_vthread_refused_when_moving_it_inside_the_threads_breaks_a_dependence():
    s = Schedule(_shifted())
    v, t = s.loops("S")
    s.bind(t, "threadIdx.x")
    err = _refused(s, "bind", v, "vthread")
    assert err.kind == "flow" and err.buffer == "A"
    assert "vthread" in str(err) and "inside the threadIdx loops" in str(err)
    err = _refused(s, "vthread", v)
    assert err.kind == "flow"


def test_thread_bind_refused_when_it_would_move_a_vthread_across_a_dependence():
    s = Schedule(_shifted())
    v, t = s.loops("S")
    s.bind(v, "vthread")  # nothing below is bound yet: it stays a serial loop where it is (legal)
    assert "for v in unroll(0, 2):" in str(s)
    err = _refused(s, "bind", t, "threadIdx.x")
    assert err.kind == "flow"


def test_vthread_bad_uses():
    n = te.var("n")
    X = te.placeholder((n,), name="X")
    Y = te.compute((n,), lambda i: X[i] + 1.0, name="Y")
    s = Schedule(Y)
    (i,) = s.loops(Y)
    with pytest.raises(ArgumentError, match="vthread loop needs a constant extent"):
        s.bind(i, "vthread")
    with pytest.raises(ArgumentError, match="unknown GPU axis 'threadIdx.w'.*'vthread'"):
        s.bind(i, "threadIdx.w")
    io, _ = s.split(i, nparts=2)
    s.bind(io, "blockIdx.x")
    with pytest.raises(ArgumentError, match="already blockIdx.x"):
        s.vthread(io)


@pytest.mark.gpu
def test_vthread_matmul_on_the_gpu():
    (A, B, C), s = _vthread_matmul()
    a, b = _x((16, 8), 3), _x((8, 32), 4)
    out = _nan((16, 32))
    build(s, [A, B, C], target="cuda")(a, b, out)
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- the copy stage of cache_read


def _staged_matmul():  # noqa: ANN202
    A, B, C = _matmul(32, 32, 16)
    s = Schedule(C)
    i, j, k = s.loops(C)
    bi, ir_ = s.split(i, 16)
    bj, jr = s.split(j, 16)
    ty, ii = s.split(ir_, nparts=4)
    tx, jj = s.split(jr, nparts=4)
    s.reorder(bi, bj, ty, tx, ii, jj)
    s.bind(bi, "blockIdx.y").bind(bj, "blockIdx.x").bind(ty, "threadIdx.y").bind(tx, "threadIdx.x")
    s.cache_write("C", "local", tx)
    ii, jj, k = s.loops("C")[-3:]
    ko, ki = s.split(k, 8)
    s.reorder(ko, ki, ii, jj)
    AA = s.cache_read("A", "shared", ko)
    return (A, B, C), s, AA


def test_copy_stage_loops_are_handles_to_split_and_reorder():
    (A, B, C), s, AA = _staged_matmul()
    loops = s.loops(AA)  # TVM: s[AA].op.axis — the copy's own loops come last
    c0, c1 = loops[-2:]
    assert [lp.name for lp in loops[-2:]] == ["c0", "c1"]
    c1o, c1i = s.split(c1, nparts=2)        # TVM's split of the copy: both halves stay copy loops
    c0o, c0i = s.split(c0, 3)                # a factor that does not divide 16: the guard goes innermost
    s.reorder(c1o, c0o, c0i, c1i)
    text = str(s)
    assert "for c1_o in parallel(0, 2):" in text and "for c0_o in parallel(0, 6):" in text
    assert "if c0_o * 3 + c0_i < 16:" in text
    copy = [f for f in walk(s.program.body) if isinstance(f, For) and f.var.name in ("c1_o", "c0_o", "c0_i", "c1_i")]
    assert all(f.kind == "parallel" for f in copy)
    a, b = _x((32, 16), 5), _x((16, 32), 6)
    want = a.astype(np.float64) @ b
    out = _nan((32, 32))
    build(s, [A, B, C], target="cpu")(a, b, out)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    mod = build(s, [A, B, C], target="cuda")
    assert "A_shared: cooperative copy" in mod.source  # still spread over the block's threads
    _cuda_adversarial(s, [A, B, C], [a, b], want)


def _bound_copy(s: Schedule, cache: str, tile: str = "blocked"):  # noqa: ANN202
    """TVM's copy schedule: rows over threadIdx.y, columns over threadIdx.x (blocked: a run per thread)."""
    c0, c1 = s.loops(cache)[-2:]
    cty, c0 = s.split(c0, nparts=4)
    if tile == "blocked":
        ctx, c1 = s.split(c1, nparts=4)
    else:
        c1, ctx = s.split(c1, factor=4)
    s.reorder(cty, ctx, c0, c1)
    s.bind(cty, "threadIdx.y").bind(ctx, "threadIdx.x")
    return cty, ctx


def _strip_barriers(p: Program) -> Program:
    from loopir.nodes import Barrier, Seq
    from loopir.visit import Transformer

    class _T(Transformer):
        def visit_Seq(self, q: Seq):  # noqa: ANN202
            return Seq(tuple(self.visit(x) for x in q.body if not isinstance(x, Barrier)))

    return _T().visit(p)


@pytest.mark.parametrize("tile", ["blocked", "cyclic"])
def test_copy_stage_bound_to_threads(tile):
    (A, B, C), s, AA = _staged_matmul()
    BB = s.cache_read("B", "shared", s.loops(AA.name)[-3])
    _bound_copy(s, AA.name, tile)
    cty, ctx = _bound_copy(s, BB.name, tile)
    bound = {f.var.name: f.thread for f in walk(s.program.body) if isinstance(f, For) and f.kind == "parallel"
             and f.thread}
    assert bound == {"c0_o": "threadIdx.y", "c02_o": "threadIdx.y",
                     **({"c1_o": "threadIdx.x", "c12_o": "threadIdx.x"} if tile == "blocked" else
                        {"c1_i": "threadIdx.x", "c12_i": "threadIdx.x"})}
    a, b = _x((32, 16), 9), _x((16, 32), 10)
    want = a.astype(np.float64) @ b
    out = _nan((32, 32))
    build(s, [A, B, C], target="cpu")(a, b, out)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    src = build(s, [A, B, C], target="cuda").source
    assert "A_shared: copy spread over the block's threads as bound (c0_o on threadIdx.y" in src
    assert "const int c0_o = (int)threadIdx.y;  // one iteration per thread" in src
    if tile == "blocked":  # B's rows are 16-byte aligned: a thread's run of 4 goes as one chunk
        assert "loopir_cp_async16(&B_shared" in src
    _cuda_adversarial(s, [A, B, C], [a, b], want)
    # the barriers the pipeline placed are what make it right: without them some thread order reads unwritten tiles
    bare = _strip_barriers(lower_passes(s.program, "cuda"))
    wrong = []
    for order in ORDERS:
        got = _nan((32, 32))
        interp.run(bare, a, b, got, gpu_order=order)
        wrong.append(not np.allclose(got, want, rtol=1e-4, atol=1e-4))
    assert any(wrong)


@pytest.mark.gpu
def test_copy_stage_bound_to_threads_on_the_gpu():
    (A, B, C), s, AA = _staged_matmul()
    BB = s.cache_read("B", "shared", s.loops(AA.name)[-3])
    _bound_copy(s, AA.name, "blocked")
    _bound_copy(s, BB.name, "cyclic")
    a, b = _x((32, 16), 13), _x((16, 32), 14)
    out = _nan((32, 32))
    build(s, [A, B, C], target="cuda")(a, b, out)
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)


def test_copy_stage_bad_bindings_and_steps_are_refused():
    _, s, AA = _staged_matmul()
    c0, c1 = s.loops(AA.name)[-2:]
    with pytest.raises(ArgumentError, match="can be bound to threadIdx.x|y|z .*not to blockIdx.x"):
        s.bind(c0, "blockIdx.x")
    with pytest.raises(ArgumentError, match="no loop around the copy of loop 'c0' is bound to threadIdx.z"):
        s.bind(c0, "threadIdx.z")
    s.bind(c0, "threadIdx.y")
    with pytest.raises(ArgumentError, match="loop 'c0' of the same copy is already bound to threadIdx.y"):
        s.bind(c1, "threadIdx.y")
    with pytest.raises(ArgumentError, match="copy loop 'c0' is already bound to threadIdx.y"):
        s.bind(c0, "threadIdx.x")
    with pytest.raises(ArgumentError, match="split: copy loop 'c0' is already bound to threadIdx.y; split it before"):
        s.split(c0, 2)
    for step, args in (("vectorize", (c1,)), ("unroll", (c1,)), ("bind", (c1, "vthread"))):
        with pytest.raises(ArgumentError, match="loop of a shared cache_read copy, which the CUDA target unrolls "
                                                "and copies by 16-byte chunks"):
            s.apply(step, *args)


def test_cache_write_copy_out_loops_are_handles():
    A, B, C = _matmul(32, 32, 16)
    s = Schedule(C)
    i, j, _ = s.loops(C)
    bi, ir_ = s.split(i, 16)
    bj, jr = s.split(j, 16)
    ii, ty = s.split(ir_, factor=4)
    jj, tx = s.split(jr, factor=4)
    s.reorder(bi, bj, ty, tx, ii, jj)
    s.bind(bi, "blockIdx.y").bind(bj, "blockIdx.x").bind(ty, "threadIdx.y").bind(tx, "threadIdx.x")
    s.cache_write("C", "local", tx)
    q0, q1 = s.loops("C_copy")[-2:]  # the write-back of the register tile: its own loops
    q1o, q1i = s.split(q1, nparts=2)
    s.unroll(q0).unroll(q1i)
    assert "for C_q1_o in range(0, 2):" in str(s) and "for C_q1_i in unroll(0, 2):" in str(s)
    a, b = _x((32, 16), 15), _x((16, 32), 16)
    want = a.astype(np.float64) @ b
    out = _nan((32, 32))
    build(s, [A, B, C], target="cpu")(a, b, out)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    _cuda_adversarial(s, [A, B, C], [a, b], want, orders=("reversed", 0))


def test_split_of_a_parallel_loop_that_is_not_a_copy_is_refused():
    _, Y = _add2d(4, 8)
    s = Schedule(Y)
    i, _ = s.loops(Y)
    s.parallel(i)
    with pytest.raises(ArgumentError, match="split: loop 'i' is already parallel"):
        s.split(i, nparts=2)


@pytest.mark.gpu
def test_copy_stage_split_on_the_gpu():
    (A, B, C), s, AA = _staged_matmul()
    c0, c1 = s.loops(AA.name)[-2:]
    s.split(c1, nparts=2)
    a, b = _x((32, 16), 7), _x((16, 32), 8)
    out = _nan((32, 32))
    build(s, [A, B, C], target="cuda")(a, b, out)
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- examples/opt_conv_cuda.py


def _example():  # noqa: ANN202
    spec = importlib.util.spec_from_file_location("opt_conv_cuda_example", os.path.join(ROOT, "examples",
                                                                                       "opt_conv_cuda.py"))
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


TINY = dict(batch=16, size=4, cin=8, cout=16)  # the interpreter runs every instance in Python: a smaller conv
TINY_TILES = dict(block=8, threads=2, vthread=2, step=4)


def test_opt_conv_cpu_numerics_and_cuda_adversarial():
    E = _example()
    rng = np.random.default_rng(11)
    A, W, B = E.conv(**E.SMALL)
    a = rng.standard_normal([int(d.value) for d in A.shape]).astype(np.float32)
    w = rng.standard_normal([int(d.value) for d in W.shape]).astype(np.float32)
    s = Schedule(B)
    E.cpu_schedule(s)
    out = _nan((6, 6, 32, 32))
    build(s, [A, W, B], target="cpu")(a, w, out)
    np.testing.assert_allclose(out, E.reference(a, w), rtol=1e-4, atol=1e-4)
    A, W, B = E.conv(**TINY)
    a = rng.standard_normal([int(d.value) for d in A.shape]).astype(np.float32)
    w = rng.standard_normal([int(d.value) for d in W.shape]).astype(np.float32)
    s = Schedule(B)
    E.gpu_schedule(s, **TINY_TILES)
    text = str(s)
    assert "for ff_i_o in unroll(0, 2):" in text and "allocate(float32[1, 1, 4, 4], 'local') as B_local" in text
    assert "'shared') as A_shared" in text and "'shared') as W_shared" in text
    _cuda_adversarial(s, [A, W, B], [a, w], E.reference(a, w), orders=("reversed", 0))


def test_opt_conv_schedule_trace_replays():
    E = _example()
    A, W, B = E.conv(**TINY)
    s = Schedule(B)
    E.gpu_schedule(s, **TINY_TILES)
    steps = [t["primitive"] for t in s.trace]
    assert steps.count("bind") == 11 and {"collapse", "split", "reorder", "cache_write", "cache_read"} <= set(steps)
    again = Schedule.replay(s.trace_json(), B)

    def kinds(sch: Schedule) -> list[tuple[str, str, str | None]]:
        return [(f.var.name, f.kind, f.thread) for f in walk(sch.program.body) if isinstance(f, For)]

    assert str(again) == str(s) and kinds(again) == kinds(s)


@pytest.mark.gpu
def test_opt_conv_small_on_the_gpu():
    E = _example()
    rng = np.random.default_rng(12)
    A, W, B = E.conv(**E.SMALL)
    a = rng.standard_normal([int(d.value) for d in A.shape]).astype(np.float32)
    w = rng.standard_normal([int(d.value) for d in W.shape]).astype(np.float32)
    s = Schedule(B)
    E.gpu_schedule(s, **E.SMALL_TILES)
    out = _nan((6, 6, 32, 32))
    build(s, [A, W, B], target="cuda")(a, w, out)
    np.testing.assert_allclose(out, E.reference(a, w), rtol=1e-4, atol=1e-4)


def test_opt_conv_example_script_small_cpu(tmp_path):
    # the script as a user runs it: CPU numerics checked by the script (exit 1 on a mismatch), CUDA built by NVRTC
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, LOOPIR_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=path)
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "opt_conv_cuda.py"), "--small", "--cpu"],
                          capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "MISMATCH" not in out
    assert re.search(r"^cpu: Convolution: [0-9.]+ ms \([0-9.]+ GFLOP/s\), relative error [0-9.e-]+$", out, re.M), out
    assert '__global__ void' in out and "--- cuda-source: built" in out


@pytest.mark.parametrize("order", ["forward", "reversed", 4])
def test_a_shared_cache_at_the_thread_loop_holds_the_blocks_region(order):
    """cache_read(x, "shared", ii) with ii itself on threadIdx.x: the block has one buffer, so the region is the
    block's (34 elements for 32 threads of a 3-point stencil), copied cooperatively, not each thread's 3 elements
    copied by every thread into the same 3 slots (a race: wrong in forward order; found porting PolyBench)."""
    from schedules import Schedule

    x = te.placeholder((66,), "float32", "x")
    y = te.compute((64,), lambda i: x[i] + x[i + 1] + x[i + 2], name="y")
    s = Schedule([y])
    io, ii = s.split(s.loops(y)[0], 32)
    s.bind(io, "blockIdx.x").bind(ii, "threadIdx.x")
    buf = s.cache_read(x, "shared", ii)
    assert [int(str(d)) for d in getattr(buf, "buffer", buf).shape] == [34]
    mod = build(s, [x, y], target="cuda")
    xa = np.random.default_rng(1).standard_normal(66).astype(np.float32)
    out = np.full(64, np.nan, np.float32)
    interp.run(mod.program, xa, out, gpu_order=order)
    np.testing.assert_allclose(out, xa[:-2] + xa[1:-1] + xa[2:], rtol=1e-6)
