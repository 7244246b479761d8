"""The placement primitives on the CPU target: fuse, compute_inline and compute_at, each built with
`codegen.build(..., target="cpu")` and compared with numpy and with the unscheduled build, at two
sizes, in float32 and float64, on random data with NaN-poisoned outputs."""

from __future__ import annotations

import numpy as np
import pytest

from codegen import build
from loopir import te
from schedules import Schedule


def _stencil(dtype):
    """B = 3 X; C[j] = B[j] + B[j+1] + B[j+2] over a symbolic length."""
    m = te.var("m")
    X = te.placeholder((m,), dtype, name="X")
    B = te.compute((m,), lambda i: X[i] * 3, name="B")
    C = te.compute((m - 2,), lambda j: B[j] + B[j + 1] + B[j + 2], name="C")

    def ref(x):
        b = 3 * x.astype(np.float64)
        return (b[:-2] + b[1:-1] + b[2:]).astype(dtype)

    return X, B, C, ref


def _siblings(dtype):
    """Two outputs over one iteration space: D = X + 1, E = X * X (sibling nests)."""
    n = te.var("n")
    X = te.placeholder((n,), dtype, name="X")
    D = te.compute((n,), lambda i: X[i] + 1, name="D")
    E = te.compute((n,), lambda i: X[i] * X[i], name="E")
    return X, D, E


def _run(mod, inputs, out_shapes, dtype):
    outs = [np.full(s, np.nan, dtype) for s in out_shapes]
    mod(*inputs, *outs)
    assert not any(np.isnan(o).any() for o in outs), "an output element was left unwritten"
    return outs


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("how", ["compute_at", "compute_inline"])
def test_stencil_producer_placed_matches(dtype, how):
    X, B, C, ref = _stencil(dtype)
    s = Schedule(C)
    (j,) = s.loops(C)
    jo, ji = s.split(j, 4)
    if how == "compute_at":
        s.compute_at(B, jo)  # B recomputed over each tile's halo: 4 + 2 elements per tile
        assert "B" in str(s).split("for j_i")[0], "B's nest must sit inside the tile loop"
    else:
        s.compute_inline(B)
        assert s.program.temps == ()
        # (after compute_at, tiles rewrite the overlapping halo of the global B, so parallel(jo) is
        # refused; inlined, the tiles are independent)
        s.parallel(jo)
    mod = build(s, [X, C], target="cpu")
    plain = build(Schedule(C), [X, C], target="cpu")
    rng = np.random.default_rng(1)
    for m in (7, 1030):  # 1030 - 2 is not a multiple of 4: the split's guard is exercised
        x = rng.standard_normal(m).astype(dtype)
        (got,) = _run(mod, [x], [(m - 2,)], dtype)
        (base,) = _run(plain, [x], [(m - 2,)], dtype)
        # tolerance relative to the result's magnitude: FMA contraction and the order of the three
        # additions may differ between nests, which shows on results near zero
        tol = (1e-6 if dtype == "float32" else 1e-14) * float(np.abs(ref(x)).max())
        np.testing.assert_allclose(got, ref(x), rtol=0, atol=tol)
        np.testing.assert_allclose(got, base, rtol=0, atol=tol)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_fused_siblings_match(dtype):
    X, D, E = _siblings(dtype)
    s = Schedule([D, E])
    (i,) = s.loops(D)
    (k,) = s.loops(E)
    f = s.fuse(i, k)
    fo, fi = s.split(f, 16)
    s.parallel(fo).vectorize(fi)
    assert str(s).count("for ") == 2, str(s)  # one fused nest
    mod = build(s, [X, D, E], target="cpu")
    rng = np.random.default_rng(2)
    for n in (5, 999):
        x = rng.standard_normal(n).astype(dtype)
        d, e = _run(mod, [x], [(n,), (n,)], dtype)
        np.testing.assert_allclose(d, x + 1, rtol=1e-6)
        np.testing.assert_allclose(e, x * x, rtol=1e-6)
