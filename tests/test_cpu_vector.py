"""Full-tile versioning and explicit vector emission (codegen/llvm/vec.py): scheduled programs
with unroll/vectorize tile loops match numpy at sizes the tiles divide and do not divide, the
GEMM register tile is kept in vector registers, and loops outside the vector subset still work."""

from __future__ import annotations

import numpy as np
import pytest

from codegen import build
from codegen.llvm import vector_bits
from codegen.passes.guards import tighten
from codegen.passes.versioning import version_loops
from loopir import te
from loopir.nodes import Const, For, If
from schedules import Schedule
from schedules.recipes import default_cpu_tile, schedule_gemm

RNG = np.random.default_rng(7)
LANES = vector_bits() // 32


def _matmul(dtype="float32"):
    n, m, p = te.var("n"), te.var("m"), te.var("p")
    a = te.placeholder((n, p), dtype, name="A")
    b = te.placeholder((p, m), dtype, name="B")
    k = te.reduce_axis(p, "k")
    c = te.compute((n, m), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    return a, b, c


@pytest.mark.parametrize("shape", [(12, 128, 9), (13, 70, 5), (1, 1, 1)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gemm_cpu_recipe_numerics(shape, dtype):
    a, b, c = _matmul(dtype)
    s = Schedule(c)
    schedule_gemm(s, "C", target="cpu")
    mod = build(s, [a, b, c])
    n, m, p = shape
    x, y = RNG.standard_normal((n, p)).astype(dtype), RNG.standard_normal((p, m)).astype(dtype)
    out = np.full((n, m), np.nan, dtype)
    mod(x, y, out)
    np.testing.assert_allclose(out, x @ y, rtol=1e-5, atol=1e-5)


def test_gemm_register_tile_lives_in_vector_registers():
    a, b, c = _matmul()
    s = Schedule(c)
    plan = schedule_gemm(s, "C", target="cpu")
    assert "register tile" in plan.explain()
    mod = build(s, [a, b, c])
    ir = mod.optimized_ir
    rows, cols = default_cpu_tile()
    # the accumulators are loop-carried vector values (SROA promoted the local tile) ...
    assert ir.count(f"phi <{LANES} x float>") >= rows * cols // LANES
    # ... updated by products allowed to contract into FMAs
    assert f"fmul reassoc nsz contract <{LANES} x float>" in mod.source or \
        f"fmul contract <{LANES} x float>" in mod.source
    x, y = RNG.standard_normal((2 * rows, cols + 3)).astype(np.float32), RNG.standard_normal(
        (cols + 3, 2 * cols)).astype(np.float32)
    out = np.full((2 * rows, 2 * cols), np.nan, np.float32)
    mod(x, y, out)
    np.testing.assert_allclose(out, x @ y, rtol=1e-4, atol=1e-4)


def _split_vec(fn, factor, dtype="float32", inputs=1):
    n = te.var("n")
    xs = [te.placeholder((n,), dtype, name=f"x{k}") for k in range(inputs)]
    y = te.compute((n,), lambda i: fn(*(x[i] for x in xs)), name="y")
    s = Schedule(y)
    (i,) = s.loops("y")
    _, ii = s.split(i, factor)
    s.vectorize(ii)
    return s, xs, y


@pytest.mark.parametrize("n", [1, 31, 64, 100])
def test_versioned_vector_loop_matches_at_any_size(n):
    s, (x,), y = _split_vec(lambda v: v * 2.0 - 1.5, 2 * LANES)
    mod = build(s, [x, y])
    xa = RNG.standard_normal(n).astype(np.float32)
    out = np.full(n, np.nan, np.float32)
    mod(xa, out)
    np.testing.assert_allclose(out, xa * 2.0 - 1.5, rtol=1e-6)


def test_version_loops_builds_full_and_partial_versions():
    s, _, _ = _split_vec(lambda v: v + 1.0, LANES)
    body = version_loops(tighten(s.program.body))
    outer = body
    assert isinstance(outer, For)
    assert isinstance(outer.body, If)
    full, part = outer.body.then, outer.body.orelse
    assert isinstance(full, For) and isinstance(full.hi, Const) and int(full.hi.value) == LANES
    assert isinstance(part, For) and not isinstance(part.hi, Const)


def test_vector_max_propagates_nan_and_broadcasts_uniform_loads():
    m, n = te.var("m"), te.var("n")
    x = te.placeholder((m, n), name="x")
    r = te.placeholder((m,), name="r")
    y = te.compute((m, n), lambda i, j: te.maximum(x[i, j], r[i]) - x[i, j] * r[i], name="y")
    s = Schedule(y)
    i, j = s.loops("y")
    _, ji = s.split(j, LANES)
    s.vectorize(ji)
    mod = build(s, [x, r, y])
    assert f"llvm.maximum.v{LANES}f32" in mod.source
    xa, ra = RNG.standard_normal((5, 3 * LANES)).astype(np.float32), RNG.standard_normal(5).astype(np.float32)
    xa[2, 3] = np.nan
    out = np.full(xa.shape, 0.0, np.float32)
    mod(xa, ra, out)
    ref = np.maximum(xa, ra[:, None]) - xa * ra[:, None]
    np.testing.assert_allclose(out, ref, rtol=1e-6)
    assert np.isnan(out[2, 3])


def test_loops_outside_the_vector_subset_fall_back():
    # a libm call and a strided load: LLVM's loop vectorizer (libmvec) handles these, results still exact
    n = te.var("n")
    x = te.placeholder((2 * n,), name="x")
    y = te.compute((n,), lambda i: te.sin(x[2 * i]) + x[2 * i + 1], name="y")
    s = Schedule(y)
    (i,) = s.loops("y")
    _, ii = s.split(i, LANES)
    s.vectorize(ii)
    mod = build(s, [x, y])
    xa = RNG.standard_normal(2 * 37).astype(np.float32)
    out = np.full(37, np.nan, np.float32)
    mod(xa, out)
    np.testing.assert_allclose(out, np.sin(xa[0::2]) + xa[1::2], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n", [1, 3, 8, 97])
def test_parallel_chunks_cover_the_range_exactly_once(n):
    # the runtime cuts a parallel loop into CHUNKS_PER_THREAD chunks per thread, taken dynamically
    m = te.var("m")
    x = te.placeholder((m,), name="x")
    y = te.compute((m,), lambda i: x[i] * 3.0 + 1.0, name="y")
    s = Schedule(y)
    (i,) = s.loops("y")
    s.parallel(i)
    mod = build(s, [x, y], threads=2)
    xa = RNG.standard_normal(n).astype(np.float32)
    out = np.full(n, np.nan, np.float32)
    mod(xa, out)
    np.testing.assert_allclose(out, xa * 3.0 + 1.0, rtol=1e-6)
