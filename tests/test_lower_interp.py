"""Lowered te constructs beyond the seeds, executed by the interpreter against numpy:
int reductions, min, reduce bounds, triangular reductions, 0-d outputs, where/cast, float16."""

from __future__ import annotations

import numpy as np
import pytest

from loopir import te
from loopir.lower import lower

interp = pytest.importorskip("loopir.interp")


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def test_int_max_and_min_reductions() -> None:
    m, n = te.var("m"), te.var("n")
    x = te.placeholder((m, n), dtype="int32", name="x")
    k1, k2 = te.reduce_axis(n, name="k"), te.reduce_axis(n, name="k")
    mx = te.compute((m,), lambda i: te.max(x[i, k1], axis=k1), name="mx")
    mn = te.compute((m,), lambda i: te.min(x[i, k2], axis=k2), name="mn")
    prog = lower([mx, mn])
    xa = _rng(0).integers(-1000, 1000, size=(4, 9)).astype(np.int32)
    a, b = np.zeros(4, np.int32) + 77, np.zeros(4, np.int32) + 77
    interp.run(prog, xa, a, b)
    np.testing.assert_array_equal(a, xa.max(axis=1))
    np.testing.assert_array_equal(b, xa.min(axis=1))


def test_reduce_bounds_and_two_axes() -> None:
    n = te.var("n")
    x = te.placeholder((n, n, 5), name="x")
    k, r = te.reduce_axis((1, n - 1), name="k"), te.reduce_axis((2, 5), name="r")
    s = te.compute((n,), lambda i: te.sum(x[i, k, r], axis=[k, r]), name="s")
    xa = _rng(1).standard_normal((6, 6, 5)).astype(np.float32)
    out = np.full(6, np.nan, np.float32)
    interp.run(lower(s), xa, out)
    np.testing.assert_allclose(out, xa[:, 1:5, 2:5].astype(np.float64).sum(axis=(1, 2)), rtol=1e-5, atol=1e-5)


def test_triangular_reduction() -> None:
    n = te.var("n")
    x = te.placeholder((n,), name="x")
    cs = te.compute(
        (n,), lambda i: (lambda k: te.sum(x[k], axis=k))(te.reduce_axis((0, i + 1), name="k")), name="cs"
    )
    xa = _rng(2).standard_normal(11).astype(np.float32)
    out = np.full(11, np.nan, np.float32)
    interp.run(lower(cs), xa, out)
    np.testing.assert_allclose(out, np.cumsum(xa.astype(np.float64)), rtol=1e-5, atol=1e-5)


def test_scalar_output_and_broadcast() -> None:
    n = te.var("n")
    x = te.placeholder((n,), name="x")
    k = te.reduce_axis(n, name="k")
    total = te.compute((), lambda: te.sum(x[k], axis=k), name="total")
    y = te.compute((n,), lambda i: x[i] / total[()], name="y")
    xa = _rng(3).standard_normal(8).astype(np.float32)
    out = np.full(8, np.nan, np.float32)
    prog = lower(y)
    assert [t.name for t in prog.temps] == ["total"]
    interp.run(prog, xa, out)
    np.testing.assert_allclose(out, xa / xa.astype(np.float64).sum(), rtol=1e-4)


def test_where_cast_and_conditions() -> None:
    n = te.var("n")
    x = te.placeholder((n,), name="x")
    y = te.compute(
        (n,),
        lambda i: te.where((x[i] > 0.0) & (x[i] < 1.0), te.cast("int32", x[i] * 10.0), -1),
        name="y",
    )
    xa = _rng(4).uniform(-1, 2, 20).astype(np.float32)
    out = np.zeros(20, np.int32) + 5
    interp.run(lower(y), xa, out)
    exp = np.where((xa > 0) & (xa < 1), (xa * np.float32(10)).astype(np.int32), -1)
    np.testing.assert_array_equal(out, exp)
    assert y.dtype == "int32"


def test_float16_stays_float16() -> None:
    n = te.var("n")
    x = te.placeholder((n,), dtype="float16", name="x")
    y = te.compute((n,), lambda i: x[i] * 2.0 + 1.0, name="y")
    assert y.dtype == "float16"
    xa = _rng(5).standard_normal(6).astype(np.float16)
    out = np.full(6, np.nan, np.float16)
    interp.run(lower(y), xa, out)
    np.testing.assert_array_equal(out, xa * np.float16(2) + np.float16(1))


def test_offset_indices_and_integer_ops() -> None:
    n = te.var("n")
    x = te.placeholder((2 * n,), dtype="int64", name="x")
    y = te.compute((n,), lambda i: x[2 * i + 1] // 3 + x[i] % 5, name="y")
    xa = _rng(6).integers(-50, 50, 14).astype(np.int64)
    out = np.zeros(7, np.int64) - 99
    interp.run(lower(y), xa, out)
    np.testing.assert_array_equal(out, xa[1::2] // 3 + xa[:7] % 5)
