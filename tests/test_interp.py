"""The reference interpreter (loopir.interp): exact numerics on random data, every node kind,
bounds checks, traces."""

from __future__ import annotations

import math

import numpy as np
import pytest

from loopir import interp, ir, nodes
from loopir.nodes import Allocate, Barrier, Buffer, For, If, Program, Seq, Store, Var, call, cast, const, select

rng = np.random.default_rng(2)


def f32(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def nan32(*shape: int) -> np.ndarray:
    return np.full(shape, np.nan, np.float32)


def elementwise(fn, dtype: str = "float32") -> Program:  # type: ignore[no-untyped-def]
    n = Var("n")
    X = ir.buffer((n,), dtype, "X")
    Y = ir.buffer((n,), dtype, "Y")
    b = ir.Builder("ew")
    with b.loop("i", 0, n) as i:
        b.store(Y, i, fn(X[i]), name="Y")
    return b.finish([X, Y])


def test_float32_arithmetic_stays_float32() -> None:
    p = elementwise(lambda x: x * x + 0.1)
    for size in (5, 17):
        x = f32(size)
        y = nan32(size)
        interp.run(p, x, y)
        np.testing.assert_array_equal(y, x * x + np.float32(0.1))  # numpy float32 ops: bit-exact


def test_float32_accumulation_is_not_float64() -> None:
    # 1e8 + 1 + 1 + ... in float32 never moves; in float64 it would.
    n = Var("n")
    X = ir.buffer((n,), "float32", "X")
    S = ir.buffer((1,), "float32", "S")
    b = ir.Builder("acc")
    with b.loop("i", 0, n) as i:
        b.store(S, 0, S[0] + X[i])
    p = b.finish([X, S])
    s = np.array([1e8], np.float32)
    interp.run(p, np.ones(10, np.float32), s)
    assert s[0] == np.float32(1e8)


def test_math_functions() -> None:
    x = f32(64)
    cases = {
        "exp": np.exp,
        "log": lambda v: np.log(np.abs(v) + np.float32(0.5)),
        "sqrt": lambda v: np.sqrt(np.abs(v)),
        "sin": np.sin,
        "cos": np.cos,
        "tanh": np.tanh,
        "abs": np.abs,
    }
    for fn, ref in cases.items():
        if fn == "log":
            p = elementwise(lambda v: call("log", call("abs", v) + 0.5))
        elif fn == "sqrt":
            p = elementwise(lambda v: call("sqrt", call("abs", v)))
        else:
            p = elementwise(lambda v, fn=fn: call(fn, v))
        y = nan32(64)
        interp.run(p, x, y)
        assert y.dtype == np.float32
        np.testing.assert_allclose(y, ref(x), rtol=2e-7, atol=0, err_msg=fn)
    p = elementwise(lambda v: call("erf", v))
    y = nan32(64)
    interp.run(p, x, y)
    np.testing.assert_array_equal(y, np.array([math.erf(float(v)) for v in x], np.float32))
    p = elementwise(lambda v: call("sigmoid", v))
    interp.run(p, x, y)
    np.testing.assert_allclose(y, 1 / (1 + np.exp(-x)), rtol=1e-6)
    p = elementwise(lambda v: call("rsqrt", call("abs", v) + 1.0))
    interp.run(p, x, y)
    np.testing.assert_allclose(y, 1 / np.sqrt(np.abs(x) + 1), rtol=1e-6)


def test_float16_and_float64() -> None:
    for dt in ("float16", "float64"):
        p = elementwise(lambda v: v * 3.0 - 1.0, dt)
        x = rng.standard_normal(20).astype(dt)
        y = np.full(20, np.nan, dt)
        interp.run(p, x, y)
        np.testing.assert_array_equal(y, x * np.dtype(dt).type(3) - np.dtype(dt).type(1))


def test_integer_floordiv_mod_floor_semantics_and_max_min() -> None:
    n = Var("n")
    X = ir.buffer((n,), "int32", "X")
    Q = ir.buffer((n,), "int32", "Q")
    R = ir.buffer((n,), "int32", "R")
    M = ir.buffer((n,), "int32", "M")
    b = ir.Builder("ints")
    with b.loop("i", 0, n) as i:
        b.store(Q, i, X[i] // 3)
        b.store(R, i, X[i] % 3)
        b.store(M, i, nodes.binary("max", X[i], nodes.binary("min", X[i] * 2, 5)))
    p = b.finish([X, Q, R, M])
    x = rng.integers(-50, 50, 30).astype(np.int32)
    q, r, m = (np.full(30, -999, np.int32) for _ in range(3))
    interp.run(p, x, q, r, m)
    np.testing.assert_array_equal(q, x // 3)
    np.testing.assert_array_equal(r, x % 3)
    np.testing.assert_array_equal(m, np.maximum(x, np.minimum(x * 2, 5)))


def test_float_max_propagates_nan() -> None:
    p = elementwise(lambda v: nodes.binary("max", v, 0.0))
    x = f32(8)
    x[3] = np.nan
    y = nan32(8)
    y[:] = 7
    interp.run(p, x, y)
    np.testing.assert_array_equal(y, np.maximum(x, 0))


def test_matmul_bias_relu_two_sizes() -> None:
    n, m, k = Var("n"), Var("m"), Var("k")
    A = ir.buffer((n, k), "float32", "A")
    B = ir.buffer((k, m), "float32", "B")
    bias = ir.buffer((m,), "float32", "bias")
    C = ir.buffer((n, m), "float32", "C")
    b = ir.Builder("mm")
    T = b.temp((n, m), "float32", "T")
    with b.loop("i", 0, n) as i, b.loop("j", 0, m) as j:
        b.store(T, (i, j), 0.0, name="T_init")
        with b.loop("r", 0, k) as r:
            b.store(T, (i, j), T[i, j] + A[i, r] * B[r, j], name="T")
        b.store(C, (i, j), nodes.binary("max", T[i, j] + bias[j], 0.0), name="C")
    p = b.finish([A, B, bias, C])
    for nn, mm, kk in ((3, 4, 5), (6, 2, 9)):
        a, bb, bi, c = f32(nn, kk), f32(kk, mm), f32(mm), nan32(nn, mm)
        interp.run(p, a, bb, bi, c)
        want = np.maximum(a.astype(np.float64) @ bb.astype(np.float64) + bi, 0)
        np.testing.assert_allclose(c, want, rtol=1e-5, atol=1e-5)


def test_stencil_with_guard_and_lazy_select() -> None:
    n, m = Var("n"), Var("m")
    X = ir.buffer((n, m), "float32", "X")
    Y = ir.buffer((n, m), "float32", "Y")
    b = ir.Builder("stencil")
    with b.loop("i", 0, n) as i, b.loop("j", 0, m) as j:
        inside = (i > 0) & (i < n - 1) & (j > 0) & (j < m - 1)
        with b.if_(inside):
            b.store(Y, (i, j), X[i, j] * 0.5 + (X[i - 1, j] + X[i + 1, j] + X[i, j - 1] + X[i, j + 1]) * 0.125)
        with b.else_():
            # where() evaluates only the branch taken: X[i - 1, j] at i == 0 is never loaded
            b.store(Y, (i, j), select(i > 0, X[i - 1, j], X[i, j]))
    p = b.finish([X, Y])
    for shape in ((5, 6), (8, 3)):
        x, y = f32(*shape), nan32(*shape)
        interp.run(p, x, y)
        want = np.empty_like(x)
        c = np.float32(0.125)
        want[1:-1, 1:-1] = (
            x[1:-1, 1:-1] * np.float32(0.5) + (((x[:-2, 1:-1] + x[2:, 1:-1]) + x[1:-1, :-2]) + x[1:-1, 2:]) * c
        )
        border = np.ones(shape, bool)
        border[1:-1, 1:-1] = False
        up = np.vstack([x[:1], x[:-1]])
        want[border] = up[border]
        np.testing.assert_array_equal(y, want)


def _split_program() -> tuple[Program, Program]:
    """y[i] = x[i] * 2 as written, and split by 4 with a guard (coords i = io * 4 + ii)."""
    n = Var("n")
    X = Buffer("X", (n,), "float32")
    Y = Buffer("Y", (n,), "float32")
    i = Var("i")
    st = Store("S", Y, (i,), X[i] * 2.0 + 1.0, (i,), (i,))
    plain = Program("p", (X, Y), For(i, const(0), n, st), (), (n,))
    io, ii = Var("io"), Var("ii")
    coord = io * 4 + ii
    inner = For(
        ii,
        const(0),
        const(4),
        If(coord < n, Store("S", Y, (i,), X[i] * 2.0 + 1.0, (i,), (coord,))),
        "thread",
        "threadIdx.x",
    )
    split = Program("p", (X, Y), For(io, const(0), (n + 3) // 4, inner, "thread", "blockIdx.x"), (), (n,))
    return plain, split


def test_coords_binding_and_thread_loops_and_trace() -> None:
    plain, split = _split_program()
    x = f32(10)
    y1, y2 = nan32(10), nan32(10)
    t1: list = []
    t2: list = []
    interp.run(plain, x, y1, trace=t1)
    interp.run(split, x, y2, trace=t2)
    np.testing.assert_array_equal(y1, x * np.float32(2) + np.float32(1))
    np.testing.assert_array_equal(y2, y1)
    assert t1 == [("S", (k,)) for k in range(10)] and t2 == t1
    assert all(type(v) is int for _, vs in t2 for v in vs)


def test_gpu_order_runs_the_same_kernel_with_threads_interleaved() -> None:
    # the default (gpu_order=None) is the serial run above; the GPU mode (tests/test_interp_gpu.py) runs the
    # blocks and threads of the launch in adversarial orders: a race-free kernel computes the same values
    plain, split = _split_program()
    x = f32(10)
    want = nan32(10)
    interp.run(plain, x, want)
    for order in ("reversed", "forward", 3):
        y = nan32(10)
        t: list = []
        interp.run(split, x, y, trace=t, gpu_order=order)
        np.testing.assert_array_equal(y, want)
        assert sorted(t) == [("S", (k,)) for k in range(10)]
    t = []
    interp.run(split, x, nan32(10), trace=t, gpu_order="reversed")
    assert t == [("S", (k,)) for k in reversed(range(10))]  # blocks 2, 1, 0; in each, threads 3, 2, 1, 0


def test_trace_order_follows_execution() -> None:
    # Reversed loop via coords: i = n - 1 - r; the trace must show the reversed order.
    n = Var("n")
    A = Buffer("A", (n,), "float32")
    i, r = Var("i"), Var("r")
    st = Store("R", A, (i,), A[i] + 1.0, (i,), (n - 1 - r,))
    p = Program("rev", (A,), For(r, const(0), n, st), (), (n,))
    t: list = []
    a = f32(5)
    want = a + np.float32(1)
    interp.run(p, a, trace=t)
    assert t == [("R", (k,)) for k in (4, 3, 2, 1, 0)]
    np.testing.assert_array_equal(a, want)


def test_coords_use_the_loop_values_before_rebinding() -> None:
    # iters (i, j) with coords (i + 1, i): j must get the loop's i, not the rebound i + 1.
    A = Buffer("A", (const(4), const(4)), "int64")
    i, j = Var("i"), Var("j")
    st = Store("S", A, (i, j), cast("int64", i * 10 + j), (i, j), (i + 1, i))
    p = Program("shift", (A,), For(i, const(0), const(3), st))
    a = np.full((4, 4), -1, np.int64)
    interp.run(p, a)
    for k in range(3):
        assert a[k + 1, k] == (k + 1) * 10 + k


def test_allocate_barrier_and_temp_fill() -> None:
    n = Var("n")
    X = Buffer("X", (n,), "float32")
    Y = Buffer("Y", (n,), "float32")
    T = Buffer("T", (n,), "float32")
    sh = Buffer("sh", (const(4),), "float32", "shared")
    i, tx, bx = Var("i"), Var("tx"), Var("bx")
    coord = bx * 4 + tx
    load = For(tx, const(0), const(4), Store("L", sh, (tx,), X[coord], (tx,), (tx,)), "thread", "threadIdx.x")
    use = For(
        tx, const(0), const(4), Store("U", Y, (i,), sh[3 - (i % 4)] + T[i], (i,), (coord,)), "thread", "threadIdx.x"
    )
    body = For(bx, const(0), n // 4, Allocate(sh, Seq((load, Barrier(), use))), "thread", "blockIdx.x")
    p = Program("blk", (X, Y), body, (T,), (n,))
    x, y = f32(8), nan32(8)
    interp.run(p, x, y)
    assert np.isnan(y).all()  # T was never written: temps start as NaN, so the read shows
    fill = For(i, const(0), n, Store("F", T, (i,), X[i] * 0.0 + 1.0, (i,), (i,)))
    p2 = Program("blk", (X, Y), Seq((fill, body)), (T,), (n,))
    interp.run(p2, x, y)
    want = x.reshape(2, 4)[:, ::-1].reshape(8) + np.float32(1)
    np.testing.assert_array_equal(y, want)


def test_out_of_bounds_raises_naming_the_buffer() -> None:
    n = Var("n")
    A = ir.buffer((n,), "float32", "Abuf")
    B = ir.buffer((n,), "float32", "Bbuf")
    b = ir.Builder("oob")
    with b.loop("i", 0, n) as i:
        b.store(B, i, A[i - 1], name="S")  # i - 1 == -1 at i == 0: numpy would wrap, we refuse
    with pytest.raises(IndexError, match=r"load of buffer 'Abuf' at index \(-1,\) is out of bounds for shape \(4,\)"):
        interp.run(b.finish([A, B]), f32(4), nan32(4))
    b = ir.Builder("oob2")
    with b.loop("i", 0, n) as i:
        b.store(B, i + 1, A[i], name="W")
    with pytest.raises(IndexError, match=r"store W of buffer 'Bbuf' at index \(4,\)"):
        interp.run(b.finish([A, B]), f32(4), nan32(4))
    M = ir.buffer((n, n), "float32", "M")
    b = ir.Builder("oob3")
    with b.loop("i", 0, n) as i:
        b.store(B, i, M[i, 1 - i], name="D")
    with pytest.raises(IndexError, match=r"'M' at index \(2, -1\)"):
        interp.run(b.finish([M, B]), f32(3, 3), nan32(3))


def test_free_size_and_unbound_variable() -> None:
    n, k = Var("n"), Var("k")
    A = Buffer("A", (n,), "float32")
    i = Var("i")
    p = Program("fk", (A,), For(i, const(0), k, Store("S", A, (i,), A[i] + 1.0, (i,), (i,))), (), (n, k))
    a = f32(6)
    want = a.copy()
    want[:3] += np.float32(1)
    interp.run(p, a, sizes={"k": 3})
    np.testing.assert_array_equal(a, want)
    stray = Var("stray")
    q = Program("st", (A,), For(i, const(0), n, Store("S", A, (i,), A[i] + 1.0, (i,), (stray,))), (), (n,))
    with pytest.raises(ValueError, match=r"uses variable\(s\) 'stray'"):
        interp.run(q, f32(3))


def test_unknown_buffer_and_bad_program() -> None:
    n = Var("n")
    A, Z = Buffer("A", (n,), "float32"), Buffer("Zed", (n,), "float32")
    i = Var("i")
    p = Program("u", (A,), For(i, const(0), n, Store("S", A, (i,), Z[i], (i,), (i,))), (), (n,))
    with pytest.raises(ValueError, match=r"uses buffer 'Zed'"):
        interp.run(p, f32(3))
    with pytest.raises(TypeError, match=r"needs a loopir Program, got list"):
        interp.run([1], f32(3))


def test_argument_errors_come_from_bind_args() -> None:
    p = elementwise(lambda v: v + 1.0)
    with pytest.raises(TypeError, match=r"argument 'Y' has dtype float64"):
        interp.run(p, f32(3), np.zeros(3))
    with pytest.raises(ValueError, match=r"size variable 'n' is 3"):
        interp.run(p, f32(3), nan32(4))


def test_compiled_once_per_program() -> None:
    p = elementwise(lambda v: v - 1.0)
    c1 = interp.compiled(p)
    interp.run(p, f32(3), nan32(3))
    assert interp.compiled(p) is c1
    assert "def _run_ew" in interp.source(p)


def test_cast_and_int_index_from_data() -> None:
    n = Var("n")
    X = ir.buffer((n,), "float32", "X")
    Ix = ir.buffer((n,), "int32", "Ix")
    Y = ir.buffer((n,), "float32", "Y")
    b = ir.Builder("gather")
    with b.loop("i", 0, n) as i:
        b.store(Y, i, X[cast("int64", Ix[i])] + cast("float32", i))
    p = b.finish([X, Ix, Y])
    x, y = f32(7), nan32(7)
    ix = rng.permutation(7).astype(np.int32)
    interp.run(p, x, ix, y)
    np.testing.assert_array_equal(y, x[ix] + np.arange(7, dtype=np.float32))
    ix[2] = -3
    with pytest.raises(IndexError, match=r"'X' at index \(-3,\)"):
        interp.run(p, x, ix, y)


def test_bfloat16_loads_read_every_bit_pattern_as_its_float32():
    """The compiled interpreter reads a bfloat16 element through a table: every one of the 65,536 patterns is the
    float32 whose upper half it is (NaN payloads and signed zeros included), and a program copying a bfloat16
    array into float32 gets exactly those values."""
    from loopir import te
    from loopir.interp_compile import _BF16_TABLE
    from schedules import Schedule

    bits = np.arange(1 << 16, dtype=np.uint32)
    assert np.array_equal(_BF16_TABLE.view(np.uint32), bits << np.uint32(16))
    n = te.var("n")
    x = te.placeholder((n,), "bfloat16", name="x")
    y = te.compute((n,), lambda i: te.cast("float32", x[i]), name="y")
    xs = bits.astype(np.uint16)
    out = np.full(len(xs), 7.0, np.float32)
    interp.run(Schedule([y]).program, xs, out, sizes={"n": len(xs)})
    assert np.array_equal(out.view(np.uint32), bits << np.uint32(16))
