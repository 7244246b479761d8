"""Scalar arguments and size arguments in the call's argument order.

`te.var("alpha", "float32")` (any dtype but int32 / int64 / bool) is a scalar argument: a 0-d read-only tensor
whose read `alpha[()]` is what te.var returns, usable in expressions, listed in build's args where the call
passes it (`build(outs, [A, alpha, B])`, `mod(a, 2.5, b)`; a 0-d array works too). An integer te.var is a size;
listed in build's args it is passed at that position (`mod(a, 10, b)`), which is how a size that no array
carries (PolyBench's `tsteps`) reaches a program. Checked: a wrong type, a missing argument, a negative size,
a value outside a small integer's range: typed errors naming the argument. Both targets; CUDA numerics in the
`gpu` tests, here its cubin and the adversarial GPU interpreter."""

from __future__ import annotations

import numpy as np
import pytest

from codegen import build
from loopir import interp, ir, te
from loopir.dtypes import from_bfloat16, to_bfloat16
from loopir.errors import ArgumentError, ArgumentTypeError, NotFoundError
from loopir.lower import lower
from schedules import Schedule


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _axpy(dtype: str = "float32", sdtype: str = "float32"):
    n = te.var("n")
    alpha = te.var("alpha", sdtype)
    x = te.placeholder((n,), dtype, name="x")
    y = te.compute((n,), lambda i: x[i] * alpha + 1.0, name="y")
    return x, alpha, y


# ----------------------------------------------------------------------------- float scalars


def test_float_var_is_a_scalar_argument_in_the_printed_program() -> None:
    x, alpha, y = _axpy()
    assert alpha.dtype == "float32" and te.scalar_tensor(alpha) is not None
    text = str(Schedule(y).program)  # by default an input in first-use order, like a placeholder
    assert text.splitlines()[0].startswith("def y(x: float32[n], alpha: float32[()], y: float32[n])")
    mod = build(y, [alpha, x, y])
    assert str(mod.program).splitlines()[0].startswith("def y(alpha: float32[()], x: float32[n], y: float32[n])")
    mod = build(y, [x, alpha, y])
    head = str(mod.program).splitlines()[0]
    assert head.startswith("def y(x: float32[n], alpha: float32[()], y: float32[n])"), head
    assert "alpha[()]" in str(mod.program)


@pytest.mark.parametrize("order", ["middle", "first", "last"])
def test_cpu_scalar_in_any_position(order: str) -> None:
    x, alpha, y = _axpy()
    args = {"middle": [x, alpha, y], "first": [alpha, x, y], "last": [x, y, alpha]}[order]
    mod = build(y, args)
    a = _rng(1).standard_normal(37).astype(np.float32)
    for value in (2.5, -3, np.float64(0.125), np.float32(7.0), np.array(1.5, np.float32)):
        out = np.full(37, np.nan, np.float32)
        call = {"middle": (a, value, out), "first": (value, a, out), "last": (a, out, value)}[order]
        mod(*call)
        np.testing.assert_allclose(out, a * np.float32(value) + 1, rtol=1e-6)


def test_fast_path_reads_each_calls_value() -> None:
    x, alpha, y = _axpy()
    mod = build(y, [x, alpha, y])
    a = _rng(2).standard_normal(64).astype(np.float32)
    outs = []
    for value in (1.0, 2.0, 3.0, 2.0):  # equal signatures: the remembered plan, with this call's scalar
        out = np.full(64, np.nan, np.float32)
        mod(a, value, out)
        outs.append(out)
    for value, out in zip((1.0, 2.0, 3.0, 2.0), outs):
        np.testing.assert_allclose(out, a * value + 1, rtol=1e-6)


@pytest.mark.parametrize("sdtype,tol", [("float64", 1e-12), ("float16", 2e-3), ("bfloat16", 1e-2)])
def test_other_float_scalars(sdtype: str, tol: float) -> None:
    x, alpha, y = _axpy("float64" if sdtype == "float64" else "float32", sdtype)
    mod = build(y, [x, alpha, y])
    a = _rng(3).standard_normal(40).astype(y.dtype)
    out = np.full(40, np.nan, y.dtype)
    mod(a, 0.7, out)
    held = {"float64": 0.7, "float16": float(np.float16(0.7)), "bfloat16": float(from_bfloat16(to_bfloat16(0.7)))}
    np.testing.assert_allclose(out, a * held[sdtype] + 1, rtol=tol)


def test_small_int_scalar_may_be_negative_and_is_range_checked() -> None:
    n = te.var("n")
    k = te.var("k", "int16")
    x = te.placeholder((n,), "int16", name="x")
    y = te.compute((n,), lambda i: x[i] + k, name="y")
    mod = build(y, [x, k, y])
    a = _rng(4).integers(-1000, 1000, 30).astype(np.int16)
    out = np.full(30, 12345, np.int16)
    mod(a, -7, out)
    np.testing.assert_array_equal(out, a - 7)
    with pytest.raises(ArgumentError, match=r"scalar argument 'k' \(int16\) cannot hold 40000"):
        mod(a, 40000, out)
    with pytest.raises(ArgumentTypeError, match="scalar argument 'k' is int16, got the float 1.5"):
        mod(a, 1.5, out)


def test_scalar_argument_errors_name_it() -> None:
    x, alpha, y = _axpy()
    mod = build(y, [x, alpha, y])
    a, out = np.ones(5, np.float32), np.zeros(5, np.float32)
    with pytest.raises(ArgumentTypeError, match=r"takes 3 argument\(s\) \(x, alpha, y\), got 2"):
        mod(a, out)  # the scalar is missing
    with pytest.raises(ArgumentTypeError, match="scalar argument 'alpha' \\(float32\\) must be a number, got str"):
        mod(a, "2", out)
    with pytest.raises(ArgumentTypeError, match="scalar argument 'alpha' .* got bool"):
        mod(a, True, out)
    with pytest.raises(ArgumentTypeError, match="argument 'alpha' has dtype float64"):
        mod(a, np.array(2.0), out)  # a 0-d array must have the dtype
    with pytest.raises(ArgumentTypeError, match="scalar argument 'flag' cannot be bool"):
        te.var("flag", "bool")


def test_scalar_in_a_reduction_and_a_where() -> None:
    m = te.var("m")
    thr = te.var("thr", "float64")
    x = te.placeholder((m, 9), "float64", name="x")
    k = te.reduce_axis(9, name="k")
    s = te.compute((m,), lambda i: te.sum(te.where(x[i, k] > thr, x[i, k] * thr, 0.0), axis=k), name="s")
    mod = build(s, [x, thr, s])
    a = _rng(5).standard_normal((13, 9))
    out = np.full(13, np.nan)
    mod(a, 0.25, out)
    np.testing.assert_allclose(out, np.where(a > 0.25, a * 0.25, 0).sum(1), rtol=1e-12)


def test_build_cache_and_argument_orders_do_not_mix() -> None:
    x, alpha, y = _axpy()
    m1 = build(y, [x, alpha, y])
    m2 = build(y, [alpha, x, y])
    m3 = build(y, [x, alpha, y])  # served by the build cache: still the right order
    a = _rng(6).standard_normal(9).astype(np.float32)
    for mod, call in ((m1, lambda o: (a, 3.0, o)), (m2, lambda o: (3.0, a, o)), (m3, lambda o: (a, 3.0, o))):
        out = np.full(9, np.nan, np.float32)
        mod(*call(out))
        np.testing.assert_allclose(out, a * 3 + 1, rtol=1e-6)


def test_interpreter_takes_the_scalar_as_a_0d_array() -> None:
    x, alpha, y = _axpy()
    prog = lower(y, [x, te.scalar_tensor(alpha), y])
    a = _rng(7).standard_normal(11).astype(np.float32)
    out = np.full(11, np.nan, np.float32)
    interp.run(prog, a, np.array(-2.0, np.float32), out)
    np.testing.assert_allclose(out, a * -2 + 1, rtol=1e-6)


def test_cuda_scalar_argument_builds_and_runs_in_the_gpu_interpreter() -> None:
    x, alpha, y = _axpy()
    mod = build(y, [x, alpha, y], target="cuda")
    assert len(mod.cubin) > 0
    assert "const float* __restrict__ alpha" in mod.source
    a = _rng(8).standard_normal(300).astype(np.float32)
    out = np.full(300, np.nan, np.float32)
    interp.run(mod.program, a, np.array(0.5, np.float32), out, gpu_order="reversed")
    np.testing.assert_allclose(out, a * 0.5 + 1, rtol=1e-6)


# ----------------------------------------------------------------------------- size arguments


def _jacobi_1d():
    """PolyBench's jacobi-1d: `tsteps` time steps, a size no array carries."""
    n, tsteps = te.var("n"), te.var("tsteps")
    a = ir.buffer((n,), "float64", name="A")
    b = ir.buffer((n,), "float64", name="B")
    bld = ir.Builder("jacobi_1d")
    with bld.loop("t", 0, tsteps):
        with bld.loop("i", 1, n - 1) as i:
            bld.store(b, (i,), 0.33333 * (a[i - 1] + a[i] + a[i + 1]), name="S1")
        with bld.loop("j", 1, n - 1) as j:
            bld.store(a, (j,), 0.33333 * (b[j - 1] + b[j] + b[j + 1]), name="S2")
    return bld.finish([a, b]), a, b, tsteps


def _jacobi_ref(a: np.ndarray, b: np.ndarray, steps: int) -> tuple[np.ndarray, np.ndarray]:
    a, b = a.copy(), b.copy()
    for _ in range(steps):
        b[1:-1] = 0.33333 * (a[:-2] + a[1:-1] + a[2:])
        a[1:-1] = 0.33333 * (b[:-2] + b[1:-1] + b[2:])
    return a, b


def test_jacobi_1d_tsteps_passed_in_argument_order_on_the_cpu() -> None:
    prog, a, b, tsteps = _jacobi_1d()
    assert "sizes: n, tsteps" in str(prog)
    mod = build(prog, [a, tsteps, b])
    rng = _rng(9)
    a0, b0 = rng.standard_normal(40), rng.standard_normal(40)
    for steps in (0, 1, 7, 7, 3):  # repeated: the fast path keys on the size's value
        x, y = a0.copy(), b0.copy()
        mod(x, steps, y)
        ra, rb = _jacobi_ref(a0, b0, steps)
        np.testing.assert_allclose(x, ra, rtol=1e-12)
        np.testing.assert_allclose(y, rb, rtol=1e-12)


def test_size_argument_errors() -> None:
    prog, a, b, tsteps = _jacobi_1d()
    mod = build(prog, [a, tsteps, b])
    x, y = np.ones(8), np.ones(8)
    with pytest.raises(ArgumentError, match=r"size argument 'tsteps' \(argument 1\) is negative: -1"):
        mod(x, -1, y)
    with pytest.raises(ArgumentTypeError, match=r"size argument 'tsteps' \(argument 1\) must be an int, got float"):
        mod(x, 2.0, y)
    with pytest.raises(ArgumentTypeError, match=r"takes 3 argument\(s\) \(A, tsteps, B\), got 2"):
        mod(x, y)
    with pytest.raises(NotFoundError, match="args\\[1\\] is the size variable 'other'"):
        build(prog, [a, te.var("other"), b])
    with pytest.raises(ArgumentError, match="size variable 'tsteps' is listed twice"):
        build(prog, [a, tsteps, tsteps, b])
    # without it in args, a call cannot give it: the existing refusal, naming it
    plain = build(prog, [a, b])
    with pytest.raises(ArgumentError, match="size variable 'tsteps' .* appears in no argument's shape"):
        plain(x, y)


def test_size_argument_that_a_shape_also_carries_is_checked_against_it() -> None:
    n = te.var("n")
    x = te.placeholder((n,), "float32", name="x")
    y = te.compute((n,), lambda i: x[i] * te.cast("float32", n), name="y")
    mod = build(y, [x, n, y])
    a = _rng(10).standard_normal(6).astype(np.float32)
    out = np.full(6, np.nan, np.float32)
    mod(a, 6, out)
    np.testing.assert_allclose(out, a * 6, rtol=1e-6)
    with pytest.raises(ArgumentError, match="size variable 'n' is 5"):
        mod(a, 5, out)


def test_te_size_used_only_in_a_body_is_a_size_argument() -> None:
    n, steps = te.var("n"), te.var("steps")
    x = te.placeholder((n,), "float32", name="x")
    y = te.compute((n,), lambda i: x[i] * te.cast("float32", steps), name="y")
    with pytest.raises(ArgumentError, match="size variable 'steps' appears in no argument's shape"):
        lower(y)  # still refused where no call can give it
    for target in ("cpu", "cuda"):
        mod = build(y, [x, steps, y], target=target)
        # several sizes: call-time specialization lowers variants later, still knowing `steps` is passed
        for size, k in ((33, 4), (4096, 3), (33, 9)):
            a = _rng(size + k).standard_normal(size).astype(np.float32)
            out = np.full(size, np.nan, np.float32)
            if target == "cpu":
                mod(a, k, out)
            else:
                interp.run(mod.program, a, out, sizes={"steps": k}, gpu_order="reversed")
            np.testing.assert_allclose(out, a * k, rtol=1e-6)


def test_cuda_jacobi_1d_host_time_loop() -> None:
    prog, a, b, tsteps = _jacobi_1d()
    s = Schedule(prog)
    for stmt in ("S1", "S2"):
        _, inner = s.loops(stmt)
        o, i = s.split(inner, 32)
        s.bind(o, "blockIdx.x").bind(i, "threadIdx.x")
    mod = build(s, [a, tsteps, b], target="cuda")
    assert len(mod.cubin) > 0 and "launched once per iteration of the host loop(s) t" in mod.source
    rng = _rng(12)
    a0, b0 = rng.standard_normal(70), rng.standard_normal(70)
    x, y = a0.copy(), b0.copy()
    interp.run(mod.program, x, y, sizes={"tsteps": 6}, gpu_order="reversed")
    ra, rb = _jacobi_ref(a0, b0, 6)
    np.testing.assert_allclose(x, ra, rtol=1e-12)
    np.testing.assert_allclose(y, rb, rtol=1e-12)


# ----------------------------------------------------------------------------- on a device


@pytest.mark.gpu
def test_cuda_device_scalar_and_size_arguments() -> None:
    x, alpha, y = _axpy()
    mod = build(y, [x, alpha, y], target="cuda")
    a = _rng(13).standard_normal(1000).astype(np.float32)
    for value in (2.5, -1.0, 2.5):
        out = np.full(1000, np.nan, np.float32)
        mod(a, value, out)
        # a * value + 1 is one fma on the GPU (one rounding): compare with the exact value, to float32's ulp
        np.testing.assert_allclose(out, a.astype(np.float64) * value + 1, rtol=1e-6, atol=1e-7)
    prog, pa, pb, tsteps = _jacobi_1d()
    s = Schedule(prog)
    for stmt in ("S1", "S2"):
        _, inner = s.loops(stmt)
        o, i = s.split(inner, 64)
        s.bind(o, "blockIdx.x").bind(i, "threadIdx.x")
    jm = build(s, [pa, tsteps, pb], target="cuda")
    a0, b0 = _rng(14).standard_normal(500), _rng(15).standard_normal(500)
    for steps in (0, 5, 5, 9):
        u, v = a0.copy(), b0.copy()
        jm(u, steps, v)
        ra, rb = _jacobi_ref(a0, b0, steps)
        np.testing.assert_allclose(u, ra, rtol=1e-12)
        np.testing.assert_allclose(v, rb, rtol=1e-12)
