"""The math library of te (issue 20, item 5): pow, fmod, floor, ceil, round and the fast variants
(fast_exp, fast_log, fast_sin, fast_cos) on the CPU, the interpreter (serial and adversarial GPU order), CUDA
(NVRTC here, numerics on a GPU), in float16, bfloat16, float32 and float64, against numpy in float64.

Tolerances: the targets compute halves in float32 and round once where stored, so a half result is within a
half ulp of the correctly rounded one (plus float32's own error); the accurate functions are within a few
float32 ulps; floor, ceil, round and fmod are exact. Fast variants on CUDA carry CUDA's documented error
(CUDA C Programming Guide, "Intrinsic Functions"): __expf 2 + floor(|1.173 x|) ulp, __logf 2^-21.41 absolute on
[0.5, 2], __sinf 2^-21.41 and __cosf 2^-21.19 absolute on [-pi, pi]; elsewhere they are the accurate function."""

from __future__ import annotations

import numpy as np
import pytest

from codegen import build
from loopir import interp, te
from loopir.dtypes import from_bfloat16, to_bfloat16
from loopir.errors import ArgumentError, ArgumentTypeError
from loopir.lower import lower
from schedules import auto_schedule

N = 67
DTYPES = ("float16", "bfloat16", "float32", "float64")
# fn -> (numpy reference in float64, the input range(s), a second operand)
UNARY = {
    "floor": np.floor, "ceil": np.ceil, "round": np.rint,
    "fast_exp": np.exp, "fast_log": np.log, "fast_sin": np.sin, "fast_cos": np.cos,
}
BINARY = {"pow": np.power, "fmod": np.fmod}
ULP = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7, "float32": 2.0 ** -23, "float64": 2.0 ** -52}


def _inputs(fn: str, dtype: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Fresh random operands (float64 values representable in `dtype`) for `fn`."""
    rng = np.random.default_rng(seed)
    if fn == "fast_log":
        x = rng.uniform(0.5, 2.0, N)
    elif fn in ("fast_sin", "fast_cos"):
        x = rng.uniform(-np.pi, np.pi, N)
    elif fn == "fast_exp":
        x = rng.uniform(-4.0, 4.0, N)
    elif fn == "pow":
        x = rng.uniform(0.1, 3.0, N)
    else:  # floor, ceil, round, fmod: signs, halves (round to even) and integers included
        x = rng.uniform(-20.0, 20.0, N)
        x[:8] = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.0, -4.0]
    y = rng.uniform(-2.5, 2.5, N) if fn == "pow" else rng.uniform(0.5, 6.0, N) * rng.choice([-1, 1], N)
    return _representable(x, dtype), _representable(y, dtype)


def _representable(a: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return from_bfloat16(to_bfloat16(a.astype(np.float32))).astype(np.float64)
    return a.astype(dtype).astype(np.float64)


def _host(a: np.ndarray, dtype: str) -> np.ndarray:
    return to_bfloat16(a.astype(np.float32)) if dtype == "bfloat16" else a.astype(dtype)


def _back(a: np.ndarray, dtype: str) -> np.ndarray:
    return from_bfloat16(a).astype(np.float64) if dtype == "bfloat16" else a.astype(np.float64)


def _poison(dtype: str) -> np.ndarray:
    return _host(np.full(N, np.nan), dtype)


def _stage(fn: str, dtype: str) -> tuple[te.Tensor, te.Tensor, te.Tensor]:
    x = te.placeholder((N,), dtype, name="x")
    z = te.placeholder((N,), dtype, name="z")
    f = getattr(te, fn)
    y = te.compute((N,), (lambda i: f(x[i], z[i])) if fn in BINARY else (lambda i: f(x[i]) + z[i] * 0),
                   name="y")
    return x, z, y


def _reference(fn: str, x: np.ndarray, z: np.ndarray) -> np.ndarray:
    return BINARY[fn](x, z) if fn in BINARY else UNARY[fn](x)


def _tolerance(fn: str, dtype: str, x: np.ndarray, ref: np.ndarray, cuda: bool) -> np.ndarray:
    """The allowed absolute error per element."""
    mag = np.abs(ref)
    if fn in ("floor", "ceil", "round", "fmod"):
        return np.zeros_like(ref)
    # the accurate function: float32's few ulps (halves: the result's rounding to the stored dtype)
    tol = mag * (ULP[dtype] if dtype in ("float16", "bfloat16") else 4 * ULP[dtype])
    tol += mag * 4 * ULP["float32"] if dtype in ("float16", "bfloat16") else 0
    if cuda and dtype != "float64":
        f32 = ULP["float32"]
        fast = {"fast_exp": mag * f32 * (2 + np.floor(np.abs(1.173 * x))),
                "fast_log": np.full_like(ref, 2.0 ** -21.41), "fast_sin": np.full_like(ref, 2.0 ** -21.41),
                "fast_cos": np.full_like(ref, 2.0 ** -21.19)}.get(fn)
        if fast is not None:
            tol = tol + fast
    return tol + 1e-300


def _check(fn: str, dtype: str, got: np.ndarray, x: np.ndarray, z: np.ndarray, cuda: bool = False) -> None:
    ref = _reference(fn, x, z)
    out = _back(got, dtype)
    assert not np.isnan(out).any(), f"{fn} {dtype}: an element was not written"
    err = np.abs(out - ref)
    tol = _tolerance(fn, dtype, x, ref, cuda)
    bad = err > tol
    assert not bad.any(), (f"{fn} {dtype}: {bad.sum()} elements off, e.g. x={x[bad][:3]} got={out[bad][:3]} "
                           f"want={ref[bad][:3]}")


FNS = (*BINARY, *UNARY)


# ----------------------------------------------------------------------------- printed nest, typing


def test_printed_nest_names_each_function():
    x = te.placeholder((N,), "float32", name="x")
    z = te.placeholder((N,), "float32", name="z")
    y = te.compute((N,), lambda i: te.pow(x[i], z[i]) + te.fmod(x[i], 2.0) + te.floor(x[i]) + te.ceil(x[i])
                   + te.round(x[i]) + te.fast_exp(x[i]) + te.fast_log(x[i]), name="y")
    text = str(lower([y]))
    assert ("y[i] = pow(x[i], z[i]) + fmod(x[i], 2.0) + floor(x[i]) + ceil(x[i]) + round(x[i]) + fast_exp(x[i]) "
            "+ fast_log(x[i])  # y") in text


def test_dtypes_follow_numpy():
    x = te.placeholder((N,), "float16", name="x")
    k = te.placeholder((N,), "int32", name="k")
    d = te.placeholder((N,), "float64", name="d")
    assert te.pow(x[0], 2.0).dtype == "float16"  # a Python float is weak
    assert te.pow(x[0], d[0]).dtype == "float64"  # two typed operands promote
    assert te.floor(k[0]).dtype == "float64"  # integers compute in float64
    assert te.fmod(k[0], k[1]).dtype == "float64"
    assert te.round(x[0]).dtype == "float16"
    assert te.power(x[0], 2.0) == te.pow(x[0], 2.0)  # TVM's name


def test_bad_inputs_are_typed():
    x = te.placeholder((N,), "float32", name="x")
    with pytest.raises(ArgumentError, match="'pow' takes 2 argument"):
        te.pow(x[0])
    with pytest.raises(ArgumentError, match="'floor' takes 1 argument"):
        te.floor(x[0], x[1])
    with pytest.raises(ArgumentTypeError, match="got the tensor 'x'"):
        te.pow(x, 2.0)
    with pytest.raises(ArgumentTypeError, match="got the tensor 'x'"):
        te.fast_exp(x)
    with pytest.raises(ArgumentTypeError):
        te.fmod(x[0], "two")


# ----------------------------------------------------------------------------- numerics


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fn", FNS)
def test_cpu_numerics(fn: str, dtype: str):
    x, z, y = _stage(fn, dtype)
    xa, za = _inputs(fn, dtype, seed=FNS.index(fn) * 10 + DTYPES.index(dtype))
    mod = build(y, [x, z, y], target="cpu")
    out = _poison(dtype)
    mod(_host(xa, dtype), _host(za, dtype), out)
    _check(fn, dtype, out, xa, za)


@pytest.mark.parametrize("dtype", DTYPES)
def test_interpreter_numerics(dtype: str):
    for k, fn in enumerate(FNS):
        x, z, y = _stage(fn, dtype)
        xa, za = _inputs(fn, dtype, seed=100 + k)
        out = _poison(dtype)
        interp.run(lower([y]), _host(xa, dtype), _host(za, dtype), out)
        _check(fn, dtype, out, xa, za)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_source_builds_and_runs_in_the_adversarial_interpreter(dtype: str):
    for k, fn in enumerate(FNS):
        x, z, y = _stage(fn, dtype)
        mod = build(y, [x, z, y], target="cuda")  # NVRTC compiles it to a cubin: no GPU needed
        src = mod.source
        fast = {"fast_exp": "__expf", "fast_log": "__logf", "fast_sin": "__sinf", "fast_cos": "__cosf"}
        if fn in fast:  # CUDA's intrinsic for float and halves; double keeps the accurate function
            assert (fast[fn] in src) == (dtype != "float64"), (fn, dtype)
        c_name = {"round": "rint"}.get(fn, fn)
        if fn not in fast:
            assert f"{c_name}{'f' if dtype != 'float64' else ''}(" in src, (fn, dtype)
        prog = auto_schedule([y], target="cuda").program
        xa, za = _inputs(fn, dtype, seed=200 + k)
        out = _poison(dtype)
        interp.run(prog, _host(xa, dtype), _host(za, dtype), out, gpu_order="reversed")
        _check(fn, dtype, out, xa, za)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fn", FNS)
def test_cuda_numerics(fn: str, dtype: str):
    x, z, y = _stage(fn, dtype)
    xa, za = _inputs(fn, dtype, seed=300 + FNS.index(fn) * 10 + DTYPES.index(dtype))
    mod = build(y, [x, z, y], target="cuda")
    out = _poison(dtype)
    mod(_host(xa, dtype), _host(za, dtype), out)
    _check(fn, dtype, out, xa, za, cuda=True)
