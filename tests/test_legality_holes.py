"""Issue 17 (schedule side): legality holes found by real programs, each as a test.

Accepted-and-wrong schedules must be refused with a witness that `verify_witness` confirms (or made
correct: the stencil copy stays inside the buffer under the interpreter's bounds check); legal steps
refused before must be accepted, and then build and match numpy on the CPU.
"""

from __future__ import annotations

import numpy as np
import pytest

from codegen import build
from loopir import interp, ir, te
from loopir.nodes import For, Program
from loopir.visit import walk
from schedules import Schedule, ScheduleError
from witness_check import refused_step as _refused

RNG = np.random.default_rng(17)


def _rand(*shape: int) -> np.ndarray:
    return (RNG.standard_normal(shape) + 0.1).astype(np.float32)  # never zeros


def _nan(*shape: int) -> np.ndarray:
    return np.full(shape, np.nan, np.float32)


def _kinds(p: Program) -> dict[str, str]:
    return {n.var.name: (n.thread or n.kind) for n in walk(p.body) if isinstance(n, For)}


# ----------------------------------------------------------------------------- 1. exact regions


def _padded_stencil(n: int):
    A = te.placeholder((n,), name="A")
    Ap = te.compute((n + 2,), lambda i: te.where((i >= 1) & (i < n + 1), A[i - 1], 0.0), name="Ap")
    B = te.compute((n,), lambda i: Ap[i] + Ap[i + 1] * 2.0 + Ap[i + 2], name="B")
    return A, Ap, B


def test_cache_read_of_padded_input_stays_in_bounds():
    n = 256
    A, Ap, B = _padded_stencil(n)
    s = Schedule(B)
    s.compute_inline(Ap)
    (i,) = s.loops(B)
    io, _ = s.split(i, 64)
    s.cache_read(A, "shared", io)
    text = str(s)
    # clipped on BOTH sides: the first tile starts at A[-1]
    assert "if 0 <= -1 + 64 * i_o + c0 and -1 + 64 * i_o + c0 < 256:" in text, text
    a = _rand(n)
    ap = np.pad(a, 1)
    want = ap[:-2] + 2 * ap[1:-1] + ap[2:]
    got = _nan(n)
    interp.run(s.program, a, got)  # bounds-checks every load and store
    np.testing.assert_allclose(got, want, rtol=1e-6)
    got = _nan(n)
    build(s, [A, B], target="cpu")(a, got)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def _conv2d(C: int, K: int, H: int, W: int, depthwise: bool):
    X = te.placeholder((C, H, W), name="X")
    Xp = te.compute((C, H + 2, W + 2), lambda c, y, x: te.where(
        (y >= 1) & (y < H + 1) & (x >= 1) & (x < W + 1), X[c, y - 1, x - 1], 0.0), name="Xp")
    ry, rx = te.reduce_axis(3, "ry"), te.reduce_axis(3, "rx")
    if depthwise:
        Wt = te.placeholder((C, 3, 3), name="Wt")
        Out = te.compute((C, H, W), lambda c, y, x: te.sum(Xp[c, y + ry, x + rx] * Wt[c, ry, rx], axis=[ry, rx]),
                       name="O")
    else:
        Wt = te.placeholder((K, C, 3, 3), name="Wt")
        rc = te.reduce_axis(C, "rc")
        Out = te.compute((K, H, W), lambda k, y, x: te.sum(Xp[rc, y + ry, x + rx] * Wt[k, rc, ry, rx],
                                                         axis=[rc, ry, rx]), name="O")
    return X, Wt, Xp, Out


def _conv_ref(x: np.ndarray, w: np.ndarray, depthwise: bool) -> np.ndarray:
    C, H, W = x.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (1, 1), (1, 1)))
    out = np.zeros((C if depthwise else w.shape[0], H, W))
    for a in range(3):
        for b in range(3):
            win = xp[:, a:a + H, b:b + W]
            out += w[:, a, b, None, None] * win if depthwise else np.einsum("kc,chw->khw", w[:, :, a, b], win)
    return out


@pytest.mark.parametrize("depthwise", [False, True], ids=["direct", "depthwise"])
@pytest.mark.parametrize("how", ["cache_read", "compute_at"])
def test_padded_conv2d_regions_exact(depthwise, how):
    C, K, H, W = 3, 4, 16, 12
    X, Wt, Xp, Out = _conv2d(C, K, H, W, depthwise)
    s = Schedule(Out)
    c_or_k, y, *_ = s.loops(Out)
    yo, _ = s.split(y, 8)
    s.reorder(yo, c_or_k)
    if how == "cache_read":
        s.compute_inline(Xp)
        s.cache_read(X, "shared", yo)
        s.parallel(yo)  # each row block has its own copy: independent
    else:
        s.compute_at(Xp, yo)
        # the recomputed halo's extent is simplified by isl: a constant at constant sizes
        assert "for y_c in range(0, 10):" in str(s), str(s)
        assert "max(" not in str(s).split("# Xp")[0], str(s)
    x = _rand(C, H, W)
    w = _rand(*(C, 3, 3) if depthwise else (K, C, 3, 3))
    want = _conv_ref(x, w, depthwise)
    got = _nan(*want.shape)
    interp.run(s.program, x, w, got)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    got = _nan(*want.shape)
    build(s, [X, Wt, Out], target="cpu")(x, w, got)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- 2. one legality model


def _halo_reduction():
    m = 16
    X = te.placeholder((m + 1, m), name="X")
    k = te.reduce_axis(m, "k")
    R = te.compute((m + 1,), lambda i: te.sum(X[i, k], axis=k), name="R")
    C = te.compute((m,), lambda j: R[j] + R[j + 1], name="C")
    s = Schedule(C)
    (j,) = s.loops(C)
    jo, _ = s.split(j, 4)
    return s, R, jo


def test_parallel_then_compute_at_is_refused_like_the_other_order():
    s, R, jo = _halo_reduction()
    s.parallel(jo)
    err = _refused(s, "compute_at", R, jo)
    assert "j_o (parallel)" in str(err)
    s, R, jo = _halo_reduction()
    s.compute_at(R, jo)
    _refused(s, "parallel", jo)


def nussinov() -> Program:
    n = te.var("n")
    T = ir.buffer((n + 1, n + 1), name="T")
    b = ir.Builder("nussinov")
    with b.loop("ii", 0, n) as ii:
        i = n - 1 - ii
        with b.loop("j", n - ii, n) as j:
            b.store(T, (i, j), te.maximum(T[i, j - 1], T[i + 1, j]) + T[i + 1, j - 1] * 0.5, name="S")
            with b.loop("k", i + 1, j) as k:
                b.store(T, (i, j), te.maximum(T[i, j], T[i, k] + T[k + 1, j]), name="K")
    return b.finish([T])


def test_nussinov_wavefront_then_reorder_is_refused():
    p0 = nussinov()
    s = Schedule(p0)
    ii, j = s.loops("S")
    js = s.skew(ii, j, 1)
    s.reorder(js, ii)
    s.parallel(ii)  # a correct wavefront
    for n in (3, 6, 9):
        t = _rand(n + 1, n + 1)
        got, want = t.copy(), t.copy()
        interp.run(p0, want)
        interp.run(s.program, got)
        np.testing.assert_array_equal(got, want)
    got = t.copy()
    build(s, target="cpu")(got)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    err = _refused(s, "reorder", ii, js)  # would leave the parallel loop outermost, carrying dependences
    assert "ii (parallel)" in str(err)
    # the nested parallel loop runs serially on the CPU: the schedule says so
    assert any("loop ii is parallel but inside loop j_s" in note for note in s.notes), s.notes
    assert "runs serially" in s.explain()


def test_fusing_two_parallel_loops_into_a_carrying_one_is_refused():
    n = te.var("n")
    A, B, X = ir.buffer((n + 1,), name="A"), ir.buffer((n,), name="B"), ir.buffer((n,), name="X")
    b = ir.Builder("fz")
    with b.loop("i", 0, n) as i:
        b.store(A, (i + 1,), X[i] * 2.0, name="S1")
    with b.loop("j", 0, n) as j:
        b.store(B, (j,), A[j] + 1.0, name="S2")
    s = Schedule(b.finish([X, A, B]))
    (i,) = s.loops("S1")
    (j,) = s.loops("S2")
    s.parallel(i).parallel(j)  # each legally parallel
    err = _refused(s, "fuse", i, j)
    assert err.kind == "flow" and err.buffer == "A"
    # serial loops fuse fine (the dependence goes forwards)
    s2 = Schedule(s.original)
    s2.fuse(*s2.loops("S1"), *s2.loops("S2"))


def test_kinds_survive_every_later_step():
    # distance (1, 1): j vectorized inside i is legal, and so is the interchange on its own (the distance
    # stays lexicographically positive) -- but together the vectorized loop would carry the dependence
    n = te.var("n")
    A = ir.buffer((n, n), name="A")
    b = ir.Builder("diag")
    with b.loop("i", 1, n) as i:
        with b.loop("j", 1, n) as j:
            b.store(A, (i, j), A[i - 1, j - 1] + A[i, j], name="S")
    s = Schedule(b.finish([A]))
    i, j = s.loops("S")
    s.vectorize(j)
    err = _refused(s, "reorder", j, i)
    assert "j (vectorize)" in str(err)
    assert _kinds(s.program) == {"i": "serial", "j": "vectorize"}
    s2 = Schedule(s.original)
    s2.reorder(*reversed(s2.loops("S")))  # without the vectorized loop the interchange is legal


# ----------------------------------------------------------------------------- 3. no internal errors


def seidel2d(tsteps: int | None = None) -> Program:
    n = te.var("n")
    T = te.var("tsteps") if tsteps is None else tsteps
    A = ir.buffer((n, n), name="A")
    b = ir.Builder("seidel2d")
    with b.loop("t", 0, T):
        with b.loop("i", 1, n - 1) as i:
            with b.loop("j", 1, n - 1) as j:
                b.store(A, (i, j), (A[i - 1, j - 1] + A[i - 1, j] + A[i - 1, j + 1] + A[i, j - 1] + A[i, j]
                                    + A[i, j + 1] + A[i + 1, j - 1] + A[i + 1, j] + A[i + 1, j + 1]) / 9.0, name="S")
    return b.finish([A])


def test_seidel_skew_then_tile_is_a_verdict_not_an_internal_error():
    p0 = seidel2d()
    s = Schedule(p0)
    t, i, _ = s.loops("S")
    i_s = s.skew(t, i, 1)
    s.tile(t, i_s, 2, 4)  # legal: every distance is non-negative in (t, i_s)
    for n, ts in ((1, 3), (2, 4), (3, 3), (6, 5), (9, 2)):  # n <= 2: the empty nest that broke the bounds
        a = _rand(n, n)
        got, want = a.copy(), a.copy()
        interp.run(p0, want, sizes={"tsteps": ts})
        interp.run(s.program, got, sizes={"tsteps": ts})
        np.testing.assert_array_equal(got, want)
    # at constant tsteps the CPU build agrees too
    p1 = seidel2d(4)
    s1 = Schedule(p1)
    t, i, _ = s1.loops("S")
    s1.tile(t, s1.skew(t, i, 1), 2, 4)
    a = _rand(7, 7)
    want = a.copy()
    interp.run(p1, want)
    got = a.copy()
    build(s1, target="cpu")(got)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    # tiling without the skew is illegal and refused with a witness
    s2 = Schedule(p0)
    t, i, _ = s2.loops("S")
    _refused(s2, "tile", t, i, 2, 4)


# ----------------------------------------------------------------------------- 4. false refusals


def fdtd2d(tmax: int) -> Program:
    nx, ny = te.var("nx"), te.var("ny")
    ex, ey, hz = (ir.buffer((nx, ny), name=nm) for nm in ("ex", "ey", "hz"))
    fict = ir.buffer((tmax,), name="fict")
    b = ir.Builder("fdtd2d")
    with b.loop("t", 0, tmax) as t:
        with b.loop("j0", 0, ny) as j:
            b.store(ey, (0, j), fict[t], name="S0")
        with b.loop("i1", 1, nx) as i:
            with b.loop("j1", 0, ny) as j:
                b.store(ey, (i, j), ey[i, j] - 0.5 * (hz[i, j] - hz[i - 1, j]), name="S1")
        with b.loop("i2", 0, nx) as i:
            with b.loop("j2", 1, ny) as j:
                b.store(ex, (i, j), ex[i, j] - 0.5 * (hz[i, j] - hz[i, j - 1]), name="S2")
        with b.loop("i3", 0, nx - 1) as i:
            with b.loop("j3", 0, ny - 1) as j:
                b.store(hz, (i, j), hz[i, j] - 0.7 * (ex[i, j + 1] - ex[i, j] + ey[i + 1, j] - ey[i, j]), name="S3")
    return b.finish([fict, ex, ey, hz])


def _fdtd_ref(fict, ex, ey, hz):
    ex, ey, hz = ex.astype(np.float64), ey.astype(np.float64), hz.astype(np.float64)
    for t in range(len(fict)):
        ey[0, :] = fict[t]
        ey[1:, :] = ey[1:, :] - 0.5 * (hz[1:, :] - hz[:-1, :])
        ex[:, 1:] = ex[:, 1:] - 0.5 * (hz[:, 1:] - hz[:, :-1])
        hz[:-1, :-1] = hz[:-1, :-1] - 0.7 * (ex[:-1, 1:] - ex[:-1, :-1] + ey[1:, :-1] - ey[:-1, :-1])
    return ex, ey, hz


def test_fdtd_fuse_of_nests_with_extents_nx_minus_1_and_nx():
    p0 = fdtd2d(3)
    s = Schedule(p0)
    s.fuse(s.loop("i1"), s.loop("i2"))
    assert "if i1 < nx:" in str(s), str(s)
    mod = build(s, target="cpu")
    for nx, ny in ((1, 4), (5, 6), (8, 3)):
        arrs = [_rand(3), _rand(nx, ny), _rand(nx, ny), _rand(nx, ny)]
        want = _fdtd_ref(*arrs)
        got = [a.copy() for a in arrs]
        mod(*got)
        for g, w in zip(got[1:], want):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
        ref = [a.copy() for a in arrs]
        interp.run(s.program, *ref)  # and in bounds
        for g, w in zip(ref[1:], want):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def _jacobi_steps(tsteps: int) -> Program:
    n = te.var("n")
    A, B = ir.buffer((n, n), name="A"), ir.buffer((n, n), name="B")
    b = ir.Builder("jacobi_steps")
    with b.loop("t", 0, tsteps):
        with b.loop("i", 0, n) as i:
            with b.loop("j", 0, n) as j:
                b.store(B, (i, j), A[i, j] * 0.5 + 1.0, name="S1")
        with b.loop("i2", 0, n) as i:
            with b.loop("j2", 0, n) as j:
                b.store(A, (i, j), B[i, j] * 0.25 + A[i, j], name="S2")
    return b.finish([A, B])


def test_collapse_inside_a_time_loop_is_accepted():
    p0 = _jacobi_steps(3)
    s = Schedule(p0)
    _, i, j = s.loops("S1")
    s.collapse(i, j)  # the dependences are carried by t, which the collapse cannot affect
    assert "for i_j_f in range(0, n * n):" in str(s)
    a, b = _rand(5, 5), _rand(5, 5)
    want_a, want_b = a.astype(np.float64), b.astype(np.float64)
    for _ in range(3):
        want_b = want_a * 0.5 + 1.0
        want_a = want_b * 0.25 + want_a
    got = [a.copy(), b.copy()]
    build(s, target="cpu")(*got)
    np.testing.assert_allclose(got[0], want_a, rtol=1e-5)
    np.testing.assert_allclose(got[1], want_b, rtol=1e-5)


def test_fuse_after_symbolic_collapse_is_not_accepted_on_an_over_approximation():
    # fuzzer finding: the collapsed loop's coords (a = f // (h + 2)) are not affine, so its times are
    # over-approximated; they are POSSIBLE times, not runs of a recomputed instance, and must all be ordered
    from schedules.errors import InexactCheckError

    h = te.var("h")
    X = te.placeholder((1, h + 2), name="X")
    T = te.compute((1, h + 2), lambda a, y: X[a, y] * 2.0, name="T")
    O = te.compute((1, h), lambda a, y: T[a, y] + T[a, y + 2], name="O")  # noqa: E741
    s = Schedule(O)
    a, y = s.loops(T)
    f = s.collapse(a, y)
    before = s.program
    with pytest.raises((InexactCheckError, ScheduleError)):
        s.fuse(f, s.loops(O)[0])  # O[0, ...] would run in iteration 0, before T[0, h + 1]
    assert s.program is before
