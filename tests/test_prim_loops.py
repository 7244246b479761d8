"""split / tile / reorder / collapse / skew: golden nests, refusals with verified witnesses, numerics."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from loopir import interp, ir, te
from loopir.nodes import Program
from schedules import Schedule
from tests.witness_check import refused_step as refused


# ----------------------------------------------------------------------------- helpers


def run(program: Program, sizes: dict[str, int], seed: int = 1) -> list[np.ndarray]:
    """Run on fresh random inputs (same seed -> same inputs); outputs poisoned with NaN."""
    rng = np.random.default_rng(seed)
    arrays = []
    for b in program.args:
        shape = tuple(int(interp_eval(s, sizes)) for s in b.shape)
        arrays.append(rng.standard_normal(shape).astype(b.dtype))
    interp.run(program, *arrays, sizes={p.name: sizes[p.name] for p in program.params if p.name in sizes})
    return arrays


def interp_eval(e, sizes):  # noqa: ANN001
    from tests.witness_check import eval_int

    return eval_int(e, sizes)


def same_numerics(a: Program, b: Program, sizes: dict[str, int]) -> None:
    for x, y in zip(run(a, sizes), run(b, sizes)):
        assert not np.isnan(y).any()
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)


def stencil() -> Program:
    """for i in 1..n: for j in 0..m-1: A[i, j] = A[i-1, j+1] + A[i, j]"""
    n, m = te.var("n"), te.var("m")
    a = ir.buffer((n, m), name="A")
    b = ir.Builder("stencil")
    with b.loop("i", 1, n) as i:
        with b.loop("j", 0, m - 1) as j:
            b.store(a, (i, j), a[i - 1, j + 1] + a[i, j], name="S")
    return b.finish([a])


def matmul():
    n, m, k = te.var("n"), te.var("m"), te.var("k")
    A = te.placeholder((n, k), name="A")
    B = te.placeholder((k, m), name="B")
    r = te.reduce_axis(k, name="r")
    return te.compute((n, m), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), name="C")


def add2d(n=None, m=None):  # noqa: ANN001
    n = te.var("n") if n is None else n
    m = te.var("m") if m is None else m
    X = te.placeholder((n, m), name="X")
    return te.compute((n, m), lambda i, j: X[i, j] * 2.0 + 1.0, name="Y")


SZ = {"n": 7, "m": 9, "k": 5}


# ----------------------------------------------------------------------------- split


def test_split_golden_with_guard_and_numerics():
    s = Schedule(add2d())
    i, j = s.loops("Y")
    io, ii = s.split(j, 4)
    assert (io.name, ii.name) == ("j_o", "j_i")
    assert str(s) == (
        "def Y(X: float32[n, m], Y: float32[n, m]):  # sizes: n, m\n"
        "    for i in range(0, n):\n"
        "        for j_o in range(0, (m + 3) // 4):\n"
        "            for j_i in range(0, 4):\n"
        "                if j_o * 4 + j_i < m:\n"
        "                    Y[i, j] = X[i, j] * 2.0 + 1.0  # Y (j = j_o * 4 + j_i)"
    )
    same_numerics(s.original, s.program, SZ)


def test_split_divisible_has_no_guard():
    s = Schedule(add2d(8, 6))
    i, _ = s.loops("Y")
    s.split(i, 4)
    assert "if" not in str(s)
    assert "range(0, 2)" in str(s)
    same_numerics(s.original, s.program, {})


def test_split_bad_factor():
    s = Schedule(add2d())
    i, _ = s.loops("Y")
    with pytest.raises(ValueError, match="factor must be >= 1"):
        s.split(i, 0)
    with pytest.raises(TypeError, match="factor"):
        s.split(i, 2.5)


def test_stale_and_foreign_handles():
    s = Schedule(add2d())
    i, _ = s.loops("Y")
    s.split(i, 2)
    with pytest.raises(ValueError, match="'i' no longer exists"):
        s.split(i, 2)
    other = Schedule(add2d())
    with pytest.raises(ValueError, match="another schedule"):
        other.split(s.loops("Y")[0], 2)


def test_split_names_do_not_clash():
    s = Schedule(add2d())
    i, _ = s.loops("Y")
    io, ii = s.split(i, 4)
    a, b = s.split(io, 2)
    assert a.name == "i_o_o" and b.name == "i_o_i"
    names = [h.name for h in s.loops("Y")]
    assert len(set(names)) == len(names)
    same_numerics(s.original, s.program, SZ)


# ----------------------------------------------------------------------------- stencil: interchange / tile / skew


def test_stencil_interchange_refused_with_witness_and_hint():
    s = Schedule(stencil())
    i, j = s.loops("S")
    err = refused(s, "reorder", j, i)
    assert err.kind == "flow" and err.buffer == "A"
    msg = str(err)
    assert "skew j by i" in msg and "<-- reorder" in msg and "legal orders of these loops: (i, j)" in msg
    assert set(err.params) == {"n", "m"} and max(err.params.values()) <= 8


def test_stencil_tile_refused_then_legal_after_skew():
    s = Schedule(stencil())
    i, j = s.loops("S")
    err = refused(s, "tile", i, j, 4, 4)
    assert "skew j by i" in str(err)
    js = s.skew(i, j)
    io, jo, ii, ji = s.tile(i, js, 4, 4)
    assert [h.name for h in s.loops("S")] == ["i_o", "j_s_o", "i_i", "j_s_i"]
    for sz in ({"n": 9, "m": 11}, {"n": 2, "m": 3}, {"n": 13, "m": 5}):
        same_numerics(s.original, s.program, sz)


def test_stencil_skew_golden_and_interchange_after_skew():
    s = Schedule(stencil())
    i, j = s.loops("S")
    js = s.skew(i, j)
    assert str(s) == (
        "def stencil(A: float32[n, m]):  # sizes: n, m\n"
        "    for i in range(1, n):\n"
        "        for j_s in range(i, m - 1 + i):\n"
        "            A[i, j] = A[i - 1, j + 1] + A[i, j]  # S (j = j_s - i)"
    )
    s.reorder(js, i)
    assert [h.name for h in s.loops("S")] == ["j_s", "i"]
    for sz in ({"n": 6, "m": 8}, {"n": 9, "m": 3}):
        same_numerics(s.original, s.program, sz)


# ----------------------------------------------------------------------------- matmul: any reorder / tile


@pytest.mark.parametrize("perm", list(itertools.permutations(range(3))))
def test_matmul_any_reorder_accepted(perm):
    s = Schedule(matmul())
    loops = s.loops("C")
    s.reorder(*[loops[p] for p in perm])
    assert [h.name for h in s.loops("C")] == [loops[p].name for p in perm]
    same_numerics(s.original, s.program, SZ)


@pytest.mark.parametrize("which", [(0, 1), (0, 2), (1, 2)])
def test_matmul_tile_accepted(which):
    s = Schedule(matmul())
    loops = s.loops("C")
    a, b = loops[which[0]], loops[which[1]]
    s.tile(a, b, 4, 3)
    same_numerics(s.original, s.program, SZ)


def test_matmul_reorder_distributes_init_golden():
    s = Schedule(matmul())
    i, j, r = s.loops("C")
    s.reorder(r, j)
    assert str(s) == (
        "def C(A: float32[n, k], B: float32[k, m], C: float32[n, m]):  # sizes: n, k, m\n"
        "    for i in range(0, n):\n"
        "        for j2 in range(0, m):\n"
        "            C[i, j] = 0.0  # C_init (j = j2)\n"
        "        for r in range(0, k):\n"
        "            for j in range(0, m):\n"
        "                C[i, j] = C[i, j] + A[i, r] * B[r, j]  # C"
    )


# ----------------------------------------------------------------------------- reorder: triangular, misuse


def triangular() -> Program:
    n = te.var("n")
    a = ir.buffer((n, n), name="A")
    out = ir.buffer((n, n), name="B")
    b = ir.Builder("tri")
    with b.loop("i", 0, n) as i:
        with b.loop("j", i, n) as j:
            b.store(out, (i, j), a[i, j] * 3.0, name="S")
    return b.finish([a, out])


def test_reorder_triangular_exact_bounds():
    s = Schedule(triangular())
    i, j = s.loops("S")
    s.reorder(j, i)
    assert str(s).splitlines()[1:3] == ["    for j in range(0, n):", "        for i in range(0, j + 1):"]
    rng = np.random.default_rng(3)
    a = rng.standard_normal((6, 6)).astype("float32")
    b1 = np.full((6, 6), 7.0, "float32")
    b2 = b1.copy()
    interp.run(s.original, a, b1)
    interp.run(s.program, a, b2)
    np.testing.assert_array_equal(b1, b2)


def test_reorder_misuse():
    Y = add2d()
    Z = te.compute(Y.shape, lambda i, j: Y[i, j] + 1.0, name="Z")
    s = Schedule(Z)
    yi, zj = s.loops("Y")[0], s.loops("Z")[1]
    with pytest.raises(ValueError, match="not nested"):
        s.reorder(yi, zj)
    with pytest.raises(ValueError, match="given twice"):
        s.reorder(yi, yi)
    with pytest.raises(ValueError, match="at least two"):
        s.reorder(yi)


def test_reorder_of_three_keeps_unlisted_slot():
    n = te.var("n")
    X = te.placeholder((n, n, n), name="X")
    Y = te.compute((n, n, n), lambda a, b, c: X[a, b, c] + 1.0, name="Y")
    s = Schedule(Y)
    a, b, c = s.loops("Y")
    s.reorder(c, a)
    assert [h.name for h in s.loops("Y")] == ["c", "b", "a"]
    same_numerics(s.original, s.program, {"n": 4})


# ----------------------------------------------------------------------------- collapse


def test_collapse_golden_and_numerics():
    s = Schedule(add2d())
    i, j = s.loops("Y")
    f = s.collapse(i, j)
    assert f.name == "i_j_f"
    assert str(s) == (
        "def Y(X: float32[n, m], Y: float32[n, m]):  # sizes: n, m\n"
        "    for i_j_f in range(0, n * m):\n"
        "        Y[i, j] = X[i, j] * 2.0 + 1.0  # Y (i = i_j_f // m, j = i_j_f % m)"
    )
    same_numerics(s.original, s.program, SZ)
    fo, fi = s.split(f, 8)
    s.parallel(fo)
    same_numerics(s.original, s.program, SZ)


def test_collapse_constant_extents_then_stencil_refusal():
    # constant extents keep collapse affine, so a later illegal step is still caught exactly
    a = ir.buffer((6, 5), name="A")
    b = ir.Builder("st")
    with b.loop("i", 1, 6) as i:
        with b.loop("j", 0, 4) as j:
            b.store(a, (i, j), a[i - 1, j + 1] + a[i, j], name="S")
    s = Schedule(b.finish([a]))
    i, j = s.loops("S")
    f = s.collapse(i, j)
    same_numerics(s.original, s.program, {})
    refused(s, "parallel", f)


def test_collapse_misuse():
    s = Schedule(matmul())
    i, j, r = s.loops("C")
    with pytest.raises(ValueError, match="not the whole body"):
        s.collapse(j, r)
    with pytest.raises(ValueError, match="not the whole body"):
        s.collapse(i, r)


def test_skew_misuse():
    s = Schedule(stencil())
    i, j = s.loops("S")
    with pytest.raises(ValueError, match="not inside"):
        s.skew(j, i)
    with pytest.raises(ValueError, match="non-zero"):
        s.skew(i, j, 0)


def test_collapse_symbolic_extent_refused_when_statements_depend_on_each_other():
    # the stencil's S depends on itself: with extent m - 1 the collapsed coords are not affine
    s = Schedule(stencil())
    i, j = s.loops("S")
    before = s.program
    with pytest.raises(ValueError, match=r"collapse\(i, j\).*'j'.*not a compile-time constant") as info:
        s.collapse(i, j)
    msg = str(info.value)
    assert "flow dependence S -> S" in msg and "split or tile" in msg
    assert s.program is before and s.trace == []
    # check=False: the expert may still collapse (order is preserved), unchecked
    u = Schedule(stencil(), check=False)
    f = u.collapse(*u.loops("S"))
    assert f.name == "i_j_f"
    same_numerics(u.original, u.program, {"n": 5, "m": 6})


def test_collapse_symbolic_extent_of_producer_consumer_pair():
    # elementwise T0 -> T1: collapsing one nest is fine (the dependence crosses nests), and a later
    # step that the analysis cannot decide on the non-affine nest is refused as uncheckable
    from schedules.errors import InexactCheckError

    n = te.var("n")
    A = te.placeholder((n, n), name="A")
    T0 = te.compute((n, n), lambda i, j: A[i, j] + 1.0, name="T0")
    T1 = te.compute((n, n), lambda i, j: T0[j, i] * 2.0, name="T1")
    s = Schedule(T1)
    f0 = s.collapse(*s.loops("T0"))
    i1, j1 = s.loops("T1")
    s.reorder(j1, i1)
    same_numerics(s.original, s.program, {"n": 5})
    f1 = s.collapse(j1, i1)
    s.parallel(f0).parallel(f1)
    same_numerics(s.original, s.program, {"n": 5})
    t = Schedule(T1)
    f0 = t.collapse(*t.loops("T0"))
    f1 = t.collapse(*t.loops("T1"))
    before = t.program
    with pytest.raises(InexactCheckError, match=r"fuse\(i_j_f, i_j_f2\) cannot be checked exactly") as info:
        t.fuse(f0, f1)
    assert isinstance(info.value, ValueError) and "not affine" in str(info.value)
    assert t.program is before


def test_collapse_constant_inner_extent_after_split_is_exact():
    s = Schedule(stencil())
    i, j = s.loops("S")
    jo, ji = s.split(j, 4)
    f = s.collapse(jo, ji)  # constant inner extent: coords stay affine
    same_numerics(s.original, s.program, {"n": 5, "m": 11})
    refused(s, "parallel", i)
    assert f.name == "j_o_j_i_f"
