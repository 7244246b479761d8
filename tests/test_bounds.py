"""The build-time bounds proof (loopir/bounds.py, pass prove_bounds): issue 18, part 1 and 2.

Every witness is checked against the access function: evaluating the statement's index at the
witness instance and sizes must give the reported element, and that element must lie outside
the reported extent (or, for an uninitialised read, no write may produce it)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from codegen import build
from codegen.passes import pipeline
from loopir import interp, ir, te, workloads
from loopir.args import eval_expr
from loopir.bounds import BoundsError, BoundsWitness, analyse, check_bounds, check_initialized
from loopir.lower import lower
from loopir.nodes import Load
from loopir.visit import walk, walk_stmts

RNG = np.random.default_rng(18)


def _check_witness(program, w: BoundsWitness) -> None:
    """The witness agrees with the program: the statement's access at the instance gives `index`."""
    store = next(s for s in walk_stmts(program) if getattr(s, "name", None) == w.statement and hasattr(s, "iters"))
    env = {v: w.instance[v.name] for v in store.iters}
    env.update({p: w.params[p.name] for p in program.params if p.name in w.params})
    if w.access == "writes":
        candidates = [store.indices]
    else:
        candidates = [ld.indices for ld in walk(store.value) if isinstance(ld, Load) and ld.buffer.name == w.buffer]
    got = {tuple(int(eval_expr(i, env)) for i in idx) for idx in candidates}
    assert w.index in got
    buf = store.buffer if w.access == "writes" else next(
        ld.buffer for ld in walk(store.value) if isinstance(ld, Load) and ld.buffer.name == w.buffer)
    assert w.extent == tuple(int(eval_expr(d, env)) for d in buf.shape)
    if w.kind == "out_of_bounds":
        assert any(not 0 <= i < e for i, e in zip(w.index, w.extent))
    else:
        assert all(0 <= i < e for i, e in zip(w.index, w.extent))


def _refused(program, statement, buffer, access):
    with pytest.raises(BoundsError) as ei:
        build(program, target="cpu")
    w = ei.value.witness
    assert (w.statement, w.buffer, w.access) == (statement, buffer, access)
    assert statement in str(ei.value) and repr(buffer) in str(ei.value)
    assert isinstance(ei.value, ValueError)
    _check_witness(program, w)
    return w


def test_pass_is_first_in_both_pipelines():
    assert pipeline("cpu")[0].name == "prove_bounds"
    assert pipeline("cuda")[0].name == "prove_bounds"


def test_store_far_past_the_end_is_refused_not_a_segfault():
    # the crash: b.store(A, (2**34,), 1.0) into an 8-element buffer
    a = ir.buffer((8,), name="A")
    b = ir.Builder("far")
    b.store(a, (2**34,), 1.0, name="S")
    w = _refused(b.finish([a]), "S", "A", "writes")
    assert w.index == (2**34,) and w.extent == (8,)


def test_constant_store_past_the_end():
    a = ir.buffer((8,), name="A")
    b = ir.Builder("c10")
    b.store(a, (10,), 1.0, name="S")
    w = _refused(b.finish([a]), "S", "A", "writes")
    assert w.index == (10,) and w.extent == (8,) and w.instance == {}


def test_loop_past_the_end():
    # i < n + 4 storing A[i]: 4 elements past the end, for every n
    n = te.var("n")
    a = ir.buffer((n,), name="A")
    b = ir.Builder("p4")
    with b.loop("i", 0, n + 4) as i:
        b.store(a, (i,), 1.0, name="S")
    w = _refused(b.finish([a]), "S", "A", "writes")
    assert w.index[0] >= w.params["n"]


def test_constant_read_past_the_end():
    x = ir.buffer((8,), name="x")
    y = ir.buffer((1,), name="y")
    b = ir.Builder("r10")
    b.store(y, (0,), x[10], name="S")
    w = _refused(b.finish([x, y]), "S", "x", "reads")
    assert w.index == (10,)


def test_read_before_the_start():
    n = te.var("n")
    x = te.placeholder((n,), name="x")
    y = te.compute((n,), lambda i: x[i - 1], name="y")
    w = _refused(lower([y]), "y", "x", "reads")
    assert w.instance == {"i": 0} and w.index == (-1,)


def test_output_larger_than_input():
    n = te.var("n")
    x = te.placeholder((n,), name="x")
    y = te.compute((n + 1,), lambda i: x[i], name="y")
    w = _refused(lower([y]), "y", "x", "reads")
    assert w.index == (w.params["n"],)


def test_cuda_build_refuses_too():
    x = ir.buffer((8,), name="x")
    y = ir.buffer((1,), name="y")
    b = ir.Builder("r10c")
    b.store(y, (0,), x[10], name="S")
    with pytest.raises(BoundsError, match="statement S reads 'x' out of bounds"):
        build(b.finish([x, y]), target="cuda")


def test_select_guarded_read_is_proven():
    # y[i] = x[i - 1] if i > 0 else 0: the load runs only where its branch is taken
    n = te.var("n")
    x = te.placeholder((n,), name="x")
    y = te.compute((n,), lambda i: te.where(i > 0, x[i - 1], 0.0), name="y")
    prog = lower([y])
    assert check_bounds(prog) is None
    xa = RNG.standard_normal(9).astype(np.float32)
    ya = np.full(9, np.nan, np.float32)
    build(prog)(xa, ya)
    np.testing.assert_array_equal(ya, np.concatenate([[0], xa[:-1]]).astype(np.float32))


@pytest.mark.parametrize("name", sorted(workloads.SEEDS))
def test_seed_workloads_are_proven_without_checks(name):
    prog = workloads.SEEDS[name]().program()
    r = analyse(prog)
    assert r.witness is None and r.unknown == [] and r.notes == []
    assert build(prog).notes == []


def test_schedules_keep_bounds():
    from schedules import Schedule
    from schedules.recipes import schedule_gemm

    n = te.var("n")
    a = te.placeholder((n, n), name="A")
    b = te.placeholder((n, n), name="B")
    k = te.reduce_axis(n, "k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    s = Schedule(c)
    schedule_gemm(s, "C", target="cpu")
    assert analyse(s.program).witness is None


# ----------------------------------------------------------------------------- non-affine indices


def _gather():
    n, m = te.var("n"), te.var("m")
    x = ir.buffer((n,), name="x")
    idx = ir.buffer((m,), dtype="int64", name="idx")
    y = ir.buffer((m,), name="y")
    b = ir.Builder("gather")
    with b.loop("i", 0, m) as i:
        b.store(y, (i,), x[idx[i]] * 2.0, name="G")
    return b.finish([x, idx, y])


def test_indirect_read_is_guarded_and_stated():
    prog = _gather()
    r = analyse(prog)
    assert r.witness is None and [(a.statement, a.buffer.name, a.access) for a in r.unknown] == [("G", "x", "reads")]
    mod = build(prog)
    assert len(mod.notes) == 1 and "G reads x[idx[i]]" in mod.notes[0] and "guarded" in mod.notes[0]
    assert "reads 0" in mod.explain()
    xa = RNG.standard_normal(5).astype(np.float32)
    ia = np.array([0, 4, 2, 7, -1, 3], np.int64)  # 7 and -1 fall outside x
    ya = np.full(6, np.nan, np.float32)
    mod(xa, ia, ya)
    want = np.where((ia >= 0) & (ia < 5), xa[np.clip(ia, 0, 4)] * 2, 0).astype(np.float32)
    np.testing.assert_array_equal(ya, want)


def test_indirect_write_is_guarded_and_stated():
    n, m = te.var("n"), te.var("m")
    x = ir.buffer((m,), name="x")
    idx = ir.buffer((m,), dtype="int64", name="idx")
    y = ir.buffer((n,), name="y")
    b = ir.Builder("scatter")
    with b.loop("i", 0, m) as i:
        b.store(y, (idx[i],), x[i], name="W")
    mod = build(b.finish([x, idx, y]))
    assert any("W writes y[idx[i]]" in s and "skipped" in s for s in mod.notes)
    xa = RNG.standard_normal(4).astype(np.float32)
    ia = np.array([1, 100, -5, 0], np.int64)
    ya = np.full(3, np.nan, np.float32)
    mod(xa, ia, ya)
    np.testing.assert_array_equal(ya, np.array([xa[3], xa[0], np.nan], np.float32))


def test_indirect_cuda_source_has_the_guard():
    from schedules import Schedule

    s = Schedule(_gather())
    (i,) = s.loops("G")
    io, ii = s.split(i, 64)
    s.bind(io, "blockIdx.x").bind(ii, "threadIdx.x")
    mod = build(s, target="cuda")
    assert mod.notes and "guarded" in mod.notes[0]
    assert "idx" in mod.source


# ----------------------------------------------------------------------------- initialised reads


def never_written():
    """y[i] = T[i] + x[i] with the temporary T written nowhere."""
    n = te.var("n")
    x = ir.buffer((n,), name="x")
    y = ir.buffer((n,), name="y")
    b = ir.Builder("nowrite")
    t = b.temp((n,), name="T")
    with b.loop("i", 0, n) as i:
        b.store(y, (i,), t[i] + x[i], name="S")
    return b.finish([x, y])


def test_temporary_never_written_is_refused():
    prog = never_written()
    w = check_initialized(prog)
    assert w is not None and w.kind == "uninitialized" and (w.statement, w.buffer) == ("S", "T")
    with pytest.raises(BoundsError, match="reads temporary 'T' before anything writes it"):
        build(prog)
    _check_witness(prog, w)


def test_temporary_partly_written_is_refused_with_the_missing_element():
    n = te.var("n")
    x = ir.buffer((n,), name="x")
    y = ir.buffer((n,), name="y")
    b = ir.Builder("partly")
    t = b.temp((n,), name="T")
    with b.loop("i", 0, n - 1) as i:
        b.store(t, (i,), x[i], name="W")
    with b.loop("j", 0, n) as j:
        b.store(y, (j,), t[j], name="R")
    prog = b.finish([x, y])
    with pytest.raises(BoundsError) as ei:
        build(prog)
    w = ei.value.witness
    assert (w.statement, w.buffer, w.kind) == ("R", "T", "uninitialized")
    assert w.index == (w.params["n"] - 1,) and w.instance == {"j": w.params["n"] - 1}


def test_temporary_written_after_it_is_read_is_refused():
    n = te.var("n")
    x = ir.buffer((n,), name="x")
    y = ir.buffer((n,), name="y")
    b = ir.Builder("late")
    t = b.temp((n,), name="T")
    with b.loop("j", 0, n) as j:
        b.store(y, (j,), t[j], name="R")
    with b.loop("i", 0, n) as i:
        b.store(t, (i,), x[i], name="W")
    with pytest.raises(BoundsError, match="statement R reads temporary 'T'"):
        build(b.finish([x, y]))


def test_temporary_written_first_is_accepted():
    n = te.var("n")
    x = ir.buffer((n,), name="x")
    y = ir.buffer((n,), name="y")
    b = ir.Builder("ok")
    t = b.temp((n,), name="T")
    with b.loop("i", 0, n) as i:
        b.store(t, (i,), x[i] * 3.0, name="W")
    with b.loop("j", 0, n) as j:
        b.store(y, (j,), t[n - 1 - j], name="R")
    prog = b.finish([x, y])
    assert check_initialized(prog) is None
    xa = RNG.standard_normal(7).astype(np.float32)
    ya = np.full(7, np.nan, np.float32)
    build(prog)(xa, ya)
    np.testing.assert_allclose(ya, xa[::-1] * 3, rtol=1e-6)
    ya2 = np.full(7, np.nan, np.float32)
    interp.run(prog, xa, ya2)
    np.testing.assert_allclose(ya2, ya, rtol=1e-6)


def test_scratch_read_before_write_is_refused():
    n = te.var("n")
    x = ir.buffer((n, 4), name="x")
    y = ir.buffer((n, 4), name="y")
    b = ir.Builder("scratch")
    with b.loop("i", 0, n) as i:
        with b.allocate((4,), name="L") as loc:
            with b.loop("j", 0, 3) as j:
                b.store(loc, (j,), x[i, j], name="W")
            with b.loop("k", 0, 4) as k:
                b.store(y, (i, k), loc[k], name="R")
    with pytest.raises(BoundsError) as ei:
        build(b.finish([x, y]))
    w = ei.value.witness
    assert (w.statement, w.buffer, w.index, w.kind) == ("R", "L", (3,), "uninitialized")


# ----------------------------------------------------------------------------- schedule steps


def _stencil3():
    n = te.var("n")
    x = te.placeholder((n,), name="x")
    y = te.compute((n - 2,), lambda i: x[i] + x[i + 1] + x[i + 2], name="y")
    return x, y


def test_cache_read_copy_is_proven_and_correct():
    from schedules import Schedule

    x, y = _stencil3()
    s = Schedule(y)
    (i,) = s.loops(y)
    io, ii = s.split(i, 8)
    s.cache_read(x, "local", io)
    assert check_bounds(s.program) is None and check_initialized(s.program) is None
    xa = RNG.standard_normal(21).astype(np.float32)
    ya = np.full(19, np.nan, np.float32)
    build(s, [x, y])(xa, ya)
    np.testing.assert_allclose(ya, xa[:-2] + xa[1:-1] + xa[2:], rtol=1e-6)


def _unclipped(program):
    """The cache_read program with the copy's clip (`if 8*i_o + c0 < n`) removed: the padded copy."""
    from loopir.nodes import If
    from loopir.visit import map_stmts

    return dataclasses.replace(program, body=map_stmts(
        program.body, lambda s: s.then if isinstance(s, If) and s.then.name.endswith("_local") else None))


def test_padded_copy_is_disproved_with_a_witness():
    from schedules import Schedule

    x, y = _stencil3()
    s = Schedule(y)
    (i,) = s.loops(y)
    io, ii = s.split(i, 8)
    s.cache_read(x, "local", io)
    bad = _unclipped(s.program)
    w = check_bounds(bad)
    assert w is not None and (w.statement, w.buffer, w.access) == ("x_local", "x", "reads")
    _check_witness(bad, w)
    with pytest.raises(BoundsError, match="statement x_local reads 'x' out of bounds"):
        build(bad)


def test_a_step_that_makes_an_access_leave_its_buffer_is_refused_there():
    from schedules import Schedule
    from schedules.primitives import REGISTRY, primitive

    name = "_test_padded_cache_read"
    if name not in REGISTRY:
        @primitive(name, check=lambda ctx: None, rebase=True)
        def padded(program, tensor, scope, loop):  # cache_read, then drop the clip of the copy
            new, buf = REGISTRY["cache_read"].fn(program, tensor, scope, loop)
            return _unclipped(new), buf

    try:
        x, y = _stencil3()
        s = Schedule(y)
        (i,) = s.loops(y)
        io, ii = s.split(i, 8)
        before = s.program
        with pytest.raises(BoundsError, match=r"_test_padded_cache_read\('x', 'local', i_o\) would make an "
                                              r"access leave its buffer: statement x_local reads 'x' out of bounds"):
            s.apply(name, x, "local", io)
        assert s.program is before and len(s.trace) == 1  # unchanged
        s.cache_read(x, "local", io)  # the real primitive clips its copy: accepted
    finally:
        REGISTRY.pop(name, None)


def test_collapsed_symbolic_loops_proven_by_flat_offset():
    # after collapse of a symbolic extent the coordinates are not affine (i = f // m, j = f % m), but indices
    # that are exactly those digits lie in bounds iff 0 <= f < n * m (loopir.affine.mixed_radix): proven, so
    # nothing is guarded and nothing is noted; the result is right
    from schedules import Schedule

    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), name="x")
    y = te.compute((n, m), lambda i, j: x[i, j] + 1.0, name="y")
    s = Schedule(y)
    s.collapse(*s.loops(y))
    mod = build(s, [x, y])
    assert mod.notes == []
    xa = RNG.standard_normal((3, 5)).astype(np.float32)
    ya = np.full_like(xa, np.nan)
    mod(xa, ya)
    np.testing.assert_array_equal(ya, xa + 1)


def test_collapsed_symbolic_loops_other_indices_are_guarded_and_stated():
    # a mirrored read x[i, m - 1 - j] is no digit of the collapsed index: the proof cannot decide it, so that
    # read alone is guarded and the note says why (the store, x[i, j]'s digits, is proven); the result is right
    from schedules import Schedule

    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), name="x")
    y = te.compute((n, m), lambda i, j: x[i, j] + x[i, m - 1 - j], name="y")
    s = Schedule(y)
    s.collapse(*s.loops(y))
    mod = build(s, [x, y])
    assert len(mod.notes) == 1 and "reads x[i, m - 1 - j]" in mod.notes[0] and "guarded" in mod.notes[0]
    assert "collapse" in mod.notes[0]
    xa = RNG.standard_normal((3, 5)).astype(np.float32)
    ya = np.full_like(xa, np.nan)
    mod(xa, ya)
    np.testing.assert_array_equal(ya, xa + xa[:, ::-1])


def test_out_of_bounds_only_at_empty_sizes_is_a_call_time_precondition():
    """PolyBench's fdtd-2d writes ey[0, j]: out of bounds only when nx = 0. Built, stated, refused per call."""
    import numpy as np

    from loopir.bounds import BoundsError

    nx, ny = te.var("nx"), te.var("ny")
    ey = ir.buffer((nx, ny), name="ey")
    fict = ir.buffer((3,), name="fict")
    b = ir.Builder("fdtd_row0")
    with b.loop("t", 0, 3) as t:
        with b.loop("j0", 0, ny) as j:
            b.store(ey, (0, j), fict[t] * 2.0, name="S0")
    mod = build(b.finish([fict, ey]))
    assert any("S0 writes 'ey' out of bounds when nx = 0" in n for n in mod.notes)
    f = np.random.default_rng(3).uniform(1, 2, 3).astype(np.float32)
    out = np.full((4, 5), np.nan, np.float32)
    mod(f, out)
    np.testing.assert_allclose(out[0], np.full(5, f[2] * 2))
    assert np.isnan(out[1:]).all()
    with pytest.raises(BoundsError, match=r"call at nx=0, ny=5.*ey\[0, 0\]"):
        mod(f, np.zeros((0, 5), np.float32))


def test_out_of_bounds_at_large_sizes_is_still_refused_at_build():
    from loopir.bounds import BoundsError

    n = te.var("n")
    x = ir.buffer((n,), name="x")
    y = ir.buffer((n + 1,), name="y")
    b = ir.Builder("past_end")
    with b.loop("i", 0, n + 1) as i:
        b.store(y, (i,), x[i], name="S")
    with pytest.raises(BoundsError) as ei:
        build(b.finish([x, y]))
    w = ei.value.witness
    assert w.statement == "S" and w.buffer == "x" and w.index[0] >= w.extent[0]  # the access leaves x


def test_a_size_variable_is_never_negative_for_the_initialisation_check():
    """A temporary of T + 1 rows whose last row is read, T a size argument: the check took T = -1 (the shape only
    says T + 1 >= 0) and refused the build with a witness there; a call refuses a negative size, so T >= 0 (found
    porting PolyBench's jacobi-1d as a scan). Built, called at T = 3 and T = 0, right."""
    n, T = te.var("n"), te.var("T")
    x = te.placeholder((n,), name="x")
    k = te.reduce_axis(n, "k")
    y = te.compute((T + 1, n), lambda t, i: te.sum(x[k] * t + x[i], axis=k), name="y")
    z = te.compute((n,), lambda i: y[T, i], name="z")
    mod = build([z], [x, T, z])
    xa = np.random.default_rng(2).standard_normal(5).astype(np.float32)
    for t in (3, 0):
        out = np.full(5, np.nan, np.float32)
        mod(xa, t, out)
        np.testing.assert_allclose(out, t * xa.sum() + 5 * xa, rtol=1e-5, atol=1e-5)
