"""The CPU code generator on programs written directly in the loop IR: every expression node,
every dtype, every statement and loop kind, against numpy on random data (outputs NaN-poisoned)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from codegen import build
from loopir.nodes import (
    Allocate,
    Barrier,
    Buffer,
    Const,
    For,
    If,
    Program,
    Seq,
    Store,
    Var,
    binary,
    call,
    cast,
    compare,
    const,
    select,
)

RNG = np.random.default_rng(1234)


def elementwise(fn, in_dtypes, name="ew", kind="serial"):
    """y[i] = fn(*(a_k[i])) over a symbolic n; returns (program, inputs buffers, output buffer)."""
    n = Var("n")
    ins = [Buffer(f"a{k}", (n,), dt) for k, dt in enumerate(in_dtypes)]
    i = Var("i")
    value = fn(*(b[i] for b in ins))
    out = Buffer("y", (n,), value.dtype)
    body = For(i, Const(0, "int64"), n, Store("y", out, (i,), value, (i,), (i,)), kind)
    return Program(name, (*ins, out), body, (), (n,)), ins, out


def rand(dtype, n, lo=-3.0, hi=3.0):
    if dtype in ("int32", "int64"):
        return RNG.integers(-50, 50, n).astype(dtype)
    if dtype == "bool":
        return RNG.random(n) < 0.5
    return RNG.uniform(lo, hi, n).astype(dtype)


def run_ew(fn, in_dtypes, arrays=None, n=203, kind="serial"):
    prog, ins, out = elementwise(fn, in_dtypes, kind=kind)
    arrays = arrays or [rand(dt, n) for dt in in_dtypes]
    y = np.full(len(arrays[0]), np.nan if out.dtype.startswith("float") else 7, dtype=out.dtype)
    mod = build(prog, target="cpu")
    mod(*arrays, y)
    return arrays, y, mod


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(
    "op,ref",
    [
        ("add", np.add),
        ("sub", np.subtract),
        ("mul", np.multiply),
        ("div", np.divide),
        ("max", np.maximum),
        ("min", np.minimum),
        ("floordiv", np.floor_divide),
        ("mod", np.mod),
    ],
)
def test_float_binary(dtype, op, ref):
    (a, b), y, _ = run_ew(lambda x, z: binary(op, x, z), [dtype, dtype])
    np.testing.assert_allclose(y, ref(a, b), rtol=1e-6 if dtype == "float32" else 1e-13, atol=1e-6)


def test_float_max_min_propagate_nan():
    a = rand("float32", 64)
    b = rand("float32", 64)
    a[::7] = np.nan
    for op, ref in (("max", np.maximum), ("min", np.minimum)):
        _, y, _ = run_ew(lambda x, z, op=op: binary(op, x, z), ["float32", "float32"], [a, b])
        np.testing.assert_array_equal(y, ref(a, b))


@pytest.mark.parametrize("dtype", ["int32", "int64"])
@pytest.mark.parametrize(
    "op,ref",
    [("add", np.add), ("sub", np.subtract), ("mul", np.multiply), ("max", np.maximum), ("min", np.minimum),
     ("floordiv", np.floor_divide), ("mod", np.mod)],
)
def test_int_binary_floor_semantics(dtype, op, ref):
    a = rand(dtype, 300)
    b = rand(dtype, 300)
    b[::5] = 0  # numpy gives 0 for a zero divisor; the native code must not trap
    b[1::5] = -1
    a[2] = np.iinfo(dtype).min  # MIN // -1 traps on x86 when done naively
    b[2] = -1
    with np.errstate(all="ignore"):
        expected = ref(a, b)
    _, y, _ = run_ew(lambda x, z: binary(op, x, z), [dtype, dtype], [a, b])
    np.testing.assert_array_equal(y, expected)


@pytest.mark.parametrize("c", [1, 3, 8])
def test_int_floordiv_mod_by_constant(c):
    a = rand("int64", 301)
    _, y, _ = run_ew(lambda x: binary("floordiv", x, c) * 1000 + binary("mod", x, c), ["int64"], [a])
    np.testing.assert_array_equal(y, (a // c) * 1000 + a % c)


def _erf(x):
    return np.vectorize(math.erf)(x.astype(np.float64))


CALL_REFS = {
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1 / np.sqrt(x),
    "sin": np.sin,
    "cos": np.cos,
    "tanh": np.tanh,
    "sigmoid": lambda x: 1 / (1 + np.exp(-x.astype(np.float64))),
    "erf": _erf,
    "abs": np.abs,
}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("fn", sorted(CALL_REFS))
def test_math_calls(dtype, fn):
    lo = 0.01 if fn in ("log", "sqrt", "rsqrt") else -20.0
    a = rand(dtype, 1000, lo, 20.0)
    _, y, _ = run_ew(lambda x: call(fn, x), [dtype], [a])
    tol = 4e-6 if dtype == "float32" else 1e-13
    np.testing.assert_allclose(y, CALL_REFS[fn](a).astype(dtype), rtol=tol, atol=tol)


def test_vector_math_is_used_in_fused_loop():
    _, y, mod = run_ew(lambda x: call("sin", x) * call("sin", x) + call("cos", x) * call("cos", x), ["float32"])
    np.testing.assert_allclose(y, 1.0, rtol=1e-6)
    assert "vector-function-abi-variant" in mod.source
    assert "_ZGV" in mod.optimized_ir  # the loop vectorizer called a libmvec variant


def test_int_abs_neg_and_casts():
    a = rand("int32", 100)
    _, y, _ = run_ew(lambda x: cast("float64", call("abs", x)) - cast("float64", -x) * 0.5, ["int32"], [a])
    np.testing.assert_allclose(y, np.abs(a).astype(np.float64) + a * 0.5)


def test_float16_load_compute_store():
    a = rand("float16", 257)
    b = rand("float16", 257)
    _, y, _ = run_ew(lambda x, z: x * z + call("exp", x), ["float16", "float16"], [a, b])
    ref = (a.astype(np.float32) * b.astype(np.float32) + np.exp(a.astype(np.float32))).astype(np.float16)
    np.testing.assert_allclose(y.astype(np.float32), ref.astype(np.float32), rtol=2e-3)


def test_cast_rounds_to_float16():
    a = rand("float32", 100)
    _, y, _ = run_ew(lambda x: cast("float32", cast("float16", x)), ["float32"], [a])
    np.testing.assert_array_equal(y, a.astype(np.float16).astype(np.float32))


def test_bool_compare_logical_select():
    a, b = rand("float32", 200), rand("float32", 200)
    a[::9] = np.nan
    flags = rand("bool", 200)

    def f(x, z, fl):
        c = (compare("lt", x, z) & fl) | ~compare("ne", x, x)  # x != x is true for NaN
        return select(c, x, z * 2)

    _, y, _ = run_ew(f, ["float32", "float32", "bool"], [a, b, flags])
    c = ((a < b) & flags) | ~(a != a)
    np.testing.assert_array_equal(y, np.where(c, a, b * 2))
    (_, _), yb, _ = run_ew(lambda x, z: compare("ge", x, z), ["int64", "int64"])
    assert yb.dtype == np.bool_


def test_casts_between_all_dtypes():
    a = rand("float64", 100, -100, 100)
    for dt in ("int32", "int64", "bool", "float32", "float16"):
        _, y, _ = run_ew(lambda x, dt=dt: cast("float64", cast(dt, x)), ["float64"], [a])
        np.testing.assert_array_equal(y, a.astype(dt).astype(np.float64), err_msg=dt)


def test_select_guards_out_of_bounds_read():
    # y[i] = x[i - 1] if i > 0 else -1: the load x[-1] must not run for i == 0
    n, i = Var("n"), Var("i")
    x, y = Buffer("x", (n,), "float32"), Buffer("y", (n,), "float32")
    v = select(compare("gt", i, 0), x[i - 1], const(-1.0))
    prog = Program("shift", (x, y), For(i, Const(0, "int64"), n, Store("y", y, (i,), v, (i,), (i,))), (), (n,))
    xa = rand("float32", 50)
    ya = np.full(50, np.nan, np.float32)
    build(prog)(xa, ya)
    np.testing.assert_array_equal(ya, np.concatenate([[-1.0], xa[:-1]]).astype(np.float32))
    assert "phi float" in build(prog).source  # branches, not a select of two loads


def _split_copy(kind_o, kind_i, factor=8, thread=None):
    """y[i] = 2*x[i] + 1 written as for io: for ii: (guarded), coords i = io*f + ii."""
    n, i, io, ii = Var("n"), Var("i"), Var("io"), Var("ii")
    x, y = Buffer("x", (n,), "float32"), Buffer("y", (n,), "float32")
    st = Store("y", y, (i,), x[i] * 2.0 + 1.0, (i,), (io * factor + ii,))
    guard = If(compare("lt", io * factor + ii, n), st)
    inner = For(ii, Const(0, "int64"), Const(factor, "int64"), guard, kind_i)
    outer = For(io, Const(0, "int64"), (n + factor - 1) // factor, inner, kind_o, thread)
    return Program("split_copy", (x, y), outer, (), (n,))


@pytest.mark.parametrize(
    "ko,ki", [("serial", "vectorize"), ("parallel", "unroll"), ("serial", "unroll"), ("parallel", "vectorize")]
)
def test_loop_kinds_and_coords(ko, ki):
    prog = _split_copy(ko, ki)
    for n in (0, 1, 37, 1000):
        xa = rand("float32", n)
        ya = np.full(n, np.nan, np.float32)
        mod = build(prog, threads=2)
        mod(xa, ya)
        np.testing.assert_array_equal(ya, xa * 2 + 1)
    if ki == "vectorize":
        assert "llvm.loop.vectorize.enable" in mod.source
    if ko == "parallel":
        assert len(mod.kernels) == 1 and "_b0" in mod.source  # a chunk function and its bounds function


def test_thread_bound_loops_run_serially_and_block_loops_in_parallel():
    n, bx, tx, i = Var("n"), Var("bx"), Var("tx"), Var("i")
    x, y = Buffer("x", (n,), "float32"), Buffer("y", (n,), "float32")
    st = Store("y", y, (i,), x[i] + 1.0, (i,), (bx * 32 + tx,))
    body = For(bx, Const(0, "int64"), (n + 31) // 32,
               For(tx, Const(0, "int64"), Const(32, "int64"),
                   If(compare("lt", bx * 32 + tx, n), Seq((st, Barrier()))), "thread", "threadIdx.x"),
               "thread", "blockIdx.x")
    prog = Program("gpuish", (x, y), body, (), (n,))
    xa = rand("float32", 1000)
    ya = np.full(1000, np.nan, np.float32)
    build(prog, threads=2)(xa, ya)
    np.testing.assert_array_equal(ya, xa + 1)


@pytest.mark.parametrize("const_size", [True, False])
def test_allocate_scratch(const_size):
    # per row i: t[j] = x[i, j] * 2 for j < m; y[i, j] = t[m - 1 - j]  (a row reversal through scratch);
    # a scratch of 16 elements needs m == 16 (a symbolic m would write past it: the build refuses that)
    n, i, j, j2 = Var("n"), Var("i"), Var("j"), Var("j2")
    m = Const(16, "int64") if const_size else Var("m")
    x, y = Buffer("x", (n, m), "float64"), Buffer("y", (n, m), "float64")
    t = Buffer("t", (Const(16, "int64"),) if const_size else (m,), "float64", "local")
    fill = For(j, Const(0, "int64"), m, Store("t", t, (j,), x[i, j] * 2.0, (i, j), (i, j)))
    use = For(j2, Const(0, "int64"), m, Store("y", y, (i, j2), t[m - 1 - j2], (i, j2), (i, j2)))
    body = For(i, Const(0, "int64"), n, Allocate(t, Seq((fill, use))), "parallel")
    prog = Program("rev", (x, y), body, (), (n,) if const_size else (n, m))
    xa = RNG.standard_normal((9, 16))
    ya = np.full_like(xa, np.nan)
    build(prog, threads=2)(xa, ya)
    np.testing.assert_array_equal(ya, xa[:, ::-1] * 2)
    assert ("alloca" in build(prog).source) == const_size
    assert ("@malloc" in build(prog).source) != const_size


def test_if_else():
    n, i = Var("n"), Var("i")
    x, y = Buffer("x", (n,), "int64"), Buffer("y", (n,), "int64")
    st1 = Store("a", y, (i,), x[i] * 3, (i,), (i,))
    st2 = Store("b", y, (i,), x[i] - 5, (i,), (i,))
    prog = Program("ifelse", (x, y), For(i, Const(0, "int64"), n, If(compare("eq", i % 3, 0), st1, st2)), (), (n,))
    xa = rand("int64", 100)
    ya = np.zeros(100, np.int64) + 99
    build(prog)(xa, ya)
    idx = np.arange(100)
    np.testing.assert_array_equal(ya, np.where(idx % 3 == 0, xa * 3, xa - 5))


def test_reduction_update_is_reassociable():
    from loopir import workloads

    prog = workloads.softmax().program()
    mod = build(prog)
    assert "fadd reassoc nsz" in mod.source and "call reassoc nsz float @llvm.maximum" in mod.source
    x = RNG.standard_normal((5, 300)).astype(np.float32)
    y = np.full_like(x, np.nan)
    mod(x, y)
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(y, e / e.sum(1, keepdims=True), rtol=1e-5)


def test_float64_to_float16_rounds_once():
    # 1 + 2^-11 + 2^-40 is just above a float16 tie: float16 rounds it up; via float32 it would tie to even (down)
    a = np.array([1 + 2**-11 + 2**-40, -(1 + 2**-11 + 2**-40), 1 + 2**-11, 70000.0, np.inf, 1e-9], np.float64)
    _, y, _ = run_ew(lambda x: cast("float16", x), ["float64"], [a])
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(y, a.astype(np.float16))
