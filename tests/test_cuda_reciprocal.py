"""A cross-thread float sum whose terms divide by a value invariant in the reduction (`x / n` in a mean) computes
them as `x * (1 / n)` on CUDA (codegen/cuda/reduce.py `reciprocal_terms`): which divisions change (the rendered
source), that the rest keep their division, and the numerics of layer norm and RMSNorm (the seeds' `sum(x / n)`)
against float64 on a GPU."""

from __future__ import annotations

import re

import numpy as np
import pytest

from codegen import build
from loopir import te, workloads
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
        (line,) = _share_lines(src, stmt)
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


def _half_div(divisor: float | None = None) -> tuple[list, te.Tensor]:
    n = te.var("n")
    a = te.placeholder((n,), "float32", name="a")
    b = te.placeholder((n,), "float32", name="b")
    y = te.compute((n,), lambda i: te.cast("float16", a[i] / (b[i] if divisor is None else divisor)), name="y")
    return [a, b, y], y


def test_a_program_with_half_outputs_divides_by_reciprocals() -> None:
    args, y = _half_div()
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
def test_half_output_division_on_the_device() -> None:
    rng = np.random.default_rng()
    n = 200_003
    a = (rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4, n)).astype(np.float32)
    b = (rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4, n)).astype(np.float32)
    b[:40] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-40, 1e-45, 3e38, -3e38] * 4  # specials, subnormals
    a[:40:3] = 0.0
    a[1:40:7] = np.inf
    args, y = _half_div()
    out = np.full(n, np.nan, np.float16)
    build([y], args, target="cuda")(a, b, out)
    with np.errstate(all="ignore"):
        ref = (a.astype(np.float64) / b.astype(np.float64)).astype(np.float16)
    special = ~np.isfinite(ref) | (ref == 0)
    np.testing.assert_array_equal(out[special], ref[special])  # infinities, NaNs and zeros exactly
    signed = special & ~np.isnan(ref)  # a NaN's sign is not specified (x86 makes 0/0 negative, CUDA positive)
    np.testing.assert_array_equal(np.signbit(out[signed]), np.signbit(ref[signed]))
    fin = ~special
    np.testing.assert_allclose(out[fin].astype(np.float64), ref[fin].astype(np.float64), rtol=2.0 ** -10, atol=0)
    assert (out[fin] == ref[fin]).mean() > 0.999  # a float16 ulp apart only next to a rounding boundary
