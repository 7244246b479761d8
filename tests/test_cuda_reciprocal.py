"""A cross-thread float sum whose terms divide by a value invariant in the reduction (`x / n` in a mean) computes
them as `x * (1 / n)` on CUDA (codegen/cuda/reduce.py `reciprocal_terms`): which divisions change (the rendered
source), that the rest keep their division, and the numerics of layer norm and RMSNorm (the seeds' `sum(x / n)`)
against float64 on a GPU; a constant whose reciprocal is not a normal number keeps its division; and PolyBench's
covariance, ported, on both targets."""

from __future__ import annotations

import re

import numpy as np
import pytest

from codegen import build
from codegen.passes import lower
from loopir import interp, te, workloads
from schedules import auto_schedule


def _body(src: str) -> str:
    return src[src.index("__global__"):]


def _share_lines(src: str, stmt: str) -> list[str]:
    return [ln for ln in _body(src).splitlines() if re.search(rf"\b{stmt}_acc = {stmt}_acc \+", ln)]


@pytest.mark.parametrize("m, n", [(64, 768), (te.var("m"), te.var("n"))])
def test_the_mean_and_variance_divide_by_a_reciprocal(m, n) -> None:
    w = workloads.layernorm_mixed(m, n, "float16")
    src = build(list(w.outputs), list(w.inputs) + list(w.outputs), target="cuda").source
    for stmt in ("mean", "var"):
        lines = _share_lines(src, stmt)  # one per lane of a 16-byte chunk where the share reads chunks, and the
        assert lines  # scalar fallback's
        for line in lines:
            assert " / " not in line.replace("(1.0f / ", ""), line
            want = "* 0.0013020833721384406f" if isinstance(n, int) else "(1.0f / ((float)(n)))"
            assert want in line, line
        assert f"// {stmt}: this thread's share (its terms' invariant divisor as a reciprocal)" in src
    # 1 / 768 correctly rounded to float32
    assert float(np.float32(1) / np.float32(768)) == float("0.0013020833721384406")


def test_divisions_by_what_changes_in_the_sum_or_outside_a_sum_stay() -> None:
    m, n = te.var("m"), te.var("n")
    x = te.placeholder((m, n), "float32", name="x")
    d = te.placeholder((n,), "float32", name="d")
    s = te.placeholder((m,), "float32", name="s")
    k = te.reduce_axis(n, "k")
    a = te.compute((m,), lambda i: te.sum(x[i, k] / d[k], axis=k), name="a")  # the divisor changes with k
    k2 = te.reduce_axis(n, "k2")
    b = te.compute((m,), lambda i: te.max(x[i, k2] / 3.0, axis=k2), name="b")  # not a sum
    k3 = te.reduce_axis(n, "k3")
    c = te.compute((m,), lambda i: te.sum(x[i, k3] / s[i], axis=k3), name="c")  # a load: kept
    for out in (a, b, c):
        src = build(auto_schedule([out], target="cuda"), [x, d, s, out], target="cuda").source
        (line,) = _share_lines(src, out.name) if out is not b else [
            ln for ln in _body(src).splitlines() if "b_acc = loopir_max(b_acc" in ln]
        assert " / " in line and "reciprocal" not in src, line


@pytest.mark.parametrize("divisor", [1e-40, 0.0])
def test_a_constant_whose_reciprocal_is_not_normal_keeps_the_division(divisor: float) -> None:
    # 1 / 1e-40 overflows float32 (x * inf is not x / 1e-40); 1 / 0 has no reciprocal: both stay divisions, in a
    # sum and in a program with half outputs
    m, n = te.var("m"), te.var("n")
    x = te.placeholder((m, n), "float32", name="x")
    k = te.reduce_axis(n, "k")
    a = te.compute((m,), lambda i: te.sum(x[i, k] / divisor, axis=k), name="a")
    src = build(auto_schedule([a], target="cuda"), [x, a], target="cuda").source
    (line,) = _share_lines(src, "a")
    assert re.search(r"\] / [0-9.e+-]+f\);$", line) and "as a reciprocal" not in src, line
    args, y = _half_div(divisor)
    body = _body(build([y], args, target="cuda").source)
    assert " / " in body and "loopir_div_half(" not in body


def _ln_check(w, sizes: dict[str, int], run) -> None:
    rng = np.random.default_rng()
    ins = w.random_inputs(sizes, rng)
    outs = [np.full_like(o, np.nan) for o in w.empty_outputs(sizes)]
    run(*w.call_args(ins, outs))
    for got, want in zip(outs, w.reference(*ins)):
        assert not np.isnan(got).any()
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["layernorm_mixed", "rmsnorm"])
@pytest.mark.parametrize("sizes", [{"m": 300, "n": 768}, {"m": 64, "n": 1000}, {"m": 5, "n": 50257}, {"m": 1, "n": 3}])
def test_reciprocal_terms_on_the_device(name: str, sizes: dict[str, int]) -> None:
    w = getattr(workloads, name)(te.var("m"), te.var("n"), "float16")
    mod = build(list(w.outputs), list(w.inputs) + list(w.outputs), target="cuda")
    _ln_check(w, sizes, mod)


# ----------------------------------------------------------------------------- half outputs: every division


def _half_div(divisor: float | None = None, dtype: str = "float32") -> tuple[list, te.Tensor]:
    """y = a / b in float16; a and b float32, or float16 (a quotient of float16 type, computed in float32)."""
    n = te.var("n")
    a = te.placeholder((n,), dtype, name="a")
    b = te.placeholder((n,), dtype, name="b")
    y = te.compute((n,), lambda i: te.cast("float16", a[i] / (b[i] if divisor is None else divisor)), name="y")
    return [a, b, y], y


def test_a_program_with_half_outputs_divides_by_reciprocals() -> None:
    for dtype in ("float32", "float16"):  # a float32 quotient and a float16 one (attention's O / sm)
        args, y = _half_div(dtype=dtype)
        assert "loopir_div_half(" in _body(build([y], args, target="cuda").source)
    args, y = _half_div(3.0)  # a constant: its reciprocal folded, correctly rounded
    body = _body(build([y], args, target="cuda").source)
    assert "* 0.3333333432674408f)" in body  # float32(1 / 3), correctly rounded
    assert "loopir_div_half(" not in body and " / 3.0f" not in body
    # a float32 output keeps IEEE division
    n = te.var("n")
    a, b = te.placeholder((n,), "float32", name="a"), te.placeholder((n,), "float32", name="b")
    z = te.compute((n,), lambda i: a[i] / b[i], name="z")
    assert "loopir_div_half(" not in _body(build([z], [a, b, z], target="cuda").source)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_half_output_division_on_the_device(dtype: str) -> None:
    rng = np.random.default_rng()
    n = 200_003
    a = (rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4, n)).astype(dtype)
    b = (rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4, n)).astype(dtype)
    tiny = 1e-45 if dtype == "float32" else 1e-7  # subnormal
    with np.errstate(over="ignore"):  # float16: 3e38 is inf, 1e-40 zero
        b[:40] = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-40, tiny, 3e38, -3e38] * 4).astype(dtype)
    a[:40:3] = 0.0
    a[1:40:7] = np.inf
    args, y = _half_div(dtype=dtype)
    out = np.full(n, np.nan, np.float16)
    build([y], args, target="cuda")(a, b, out)
    with np.errstate(all="ignore"):
        ref = (a.astype(np.float64) / b.astype(np.float64)).astype(np.float16)
    special = ~np.isfinite(ref) | (ref == 0)
    np.testing.assert_array_equal(out[special], ref[special])  # infinities, NaNs and zeros exactly
    signed = special & ~np.isnan(ref)  # a NaN's sign is not specified (x86 makes 0/0 negative, CUDA positive)
    np.testing.assert_array_equal(np.signbit(out[signed]), np.signbit(ref[signed]))
    fin = ~special
    # one float16 ulp: 2^-10 relative for normals, 2^-24 for subnormals (a float32 quotient rounds twice)
    np.testing.assert_allclose(out[fin].astype(np.float64), ref[fin].astype(np.float64), rtol=2.0 ** -10,
                               atol=2.0 ** -24)
    assert (out[fin] == ref[fin]).mean() > 0.999  # a float16 ulp apart only next to a rounding boundary


# ----------------------------------------------------------------------------- a program we did not write


def _covariance() -> tuple[te.Tensor, te.Tensor]:
    """PolyBench/C 4.2 `covariance`: mean[j] = sum_i data[i][j] / float_n; data[i][j] -= mean[j];
    cov[i][j] = sum_k data[k][i] * data[k][j] / (float_n - 1) (the full matrix, not its mirrored half)."""
    n, m = te.var("N"), te.var("M")
    data = te.placeholder((n, m), "float32", name="data")
    fn = te.cast("float32", n)
    i = te.reduce_axis(n, "i")
    mean = te.compute((m,), lambda j: te.sum(data[i, j] / fn, axis=i), name="mean")
    cen = te.compute((n, m), lambda a, j: data[a, j] - mean[j], name="cen")
    k = te.reduce_axis(n, "k")
    cov = te.compute((m, m), lambda a, b: te.sum(cen[k, a] * cen[k, b] / (fn - 1.0), axis=k), name="cov")
    return data, cov


def test_polybench_covariance_on_both_targets() -> None:
    data, cov = _covariance()
    rng = np.random.default_rng()
    x = rng.standard_normal((37, 23)).astype(np.float32)
    ref = np.cov(x.astype(np.float64), rowvar=False)
    for target in ("cpu", "cuda"):
        s = auto_schedule([cov], target=target)
        out = np.full((23, 23), np.nan, np.float32)
        if target == "cpu":
            build(s, [data, cov], target="cpu")(x, out)
        else:  # the sums' divisors (N, N - 1) as reciprocals in the source; the lowered program in adversarial order
            assert "as a reciprocal" in build(s, [data, cov], target="cuda").source
            interp.run(lower(s.program, "cuda"), x, out, gpu_order="reversed")
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_polybench_covariance_on_the_device() -> None:
    data, cov = _covariance()
    mod = build([cov], [data, cov], target="cuda")
    rng = np.random.default_rng()
    for n, m in ((37, 23), (1000, 130)):
        x = rng.standard_normal((n, m)).astype(np.float32)
        out = np.full((m, m), np.nan, np.float32)
        for _ in range(2):
            mod(x, out)
            np.testing.assert_allclose(out, np.cov(x.astype(np.float64), rowvar=False), rtol=1e-4, atol=1e-4)

