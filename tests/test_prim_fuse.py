"""fuse (loop fusion of sibling nests): golden nests, refusals with verified witnesses, numerics, misuse."""

from __future__ import annotations

import numpy as np
import pytest

from loopir import interp, ir, te
from schedules import Schedule, ScheduleError
from witness_check import verify_witness


def _run(program, inputs, outs_shapes, seed=0):
    rng = np.random.default_rng(seed)
    ins = [rng.standard_normal(s).astype(np.float32) for s in inputs]
    outs = [np.full(s, np.nan, np.float32) for s in outs_shapes]
    interp.run(program, *ins, *outs)
    return outs


def _chain(reverse=False, shift_lo=False):
    n = te.var("n")
    A = te.placeholder((n,), name="A")
    B = te.compute((n,), lambda i: A[i] * 2, name="B")
    if reverse:
        C = te.compute((n,), lambda j: B[n - 1 - j] + 1, name="C")
    else:
        C = te.compute((n,), lambda j: B[j] + 1, name="C")
    return A, B, C


def test_elementwise_fusion_golden_and_numerics():
    A, B, C = _chain()
    s = Schedule(C)
    (i,) = s.loops(B)
    (j,) = s.loops(C)
    f = s.fuse(i, j)
    assert f.name == "i"
    assert str(s) == (
        "def C(A: float32[n], C: float32[n]):  # sizes: n\n"
        "    B: float32[n]  # temporary\n"
        "    for i in range(0, n):\n"
        "        B[i] = A[i] * 2.0  # B\n"
        "        C[j] = B[j] + 1.0  # C (j = i)"
    )
    for n in (1, 7):
        (ref,) = _run(s.original, [(n,)], [(n,)])
        (got,) = _run(s.program, [(n,)], [(n,)])
        np.testing.assert_array_equal(got, ref)
        assert not np.isnan(got).any()


def test_reversing_fusion_refused_with_witness():
    A, B, C = _chain(reverse=True)
    s = Schedule(C)
    (i,) = s.loops(B)
    (j,) = s.loops(C)
    old = s.program
    with pytest.raises(ScheduleError) as ei:
        s.fuse(i, j)
    err = ei.value
    assert err.primitive == "fuse" and err.kind == "flow" and err.buffer == "B"
    assert "<-- fuse" in str(err)
    from schedules.primitives.loop_fusion import fuse

    new, _ = fuse(old, i.var, j.var)
    verify_witness(old, new, err)
    assert s.program is old  # unchanged after a refusal


def _builder_pair(lo_b=1, hi_b=None, read_off=-1):
    n = te.var("n")
    A = ir.buffer((n,), name="A")
    B = ir.buffer((n,), name="B")
    C = ir.buffer((n,), name="C")
    b = ir.Builder("pair")
    with b.loop("i", 0, n - 1) as i:
        b.store(B, (i + 1,), A[i + 1] * 3.0, name="S1")
    with b.loop("j", lo_b, n if hi_b is None else hi_b) as j:
        b.store(C, (j,), B[j + read_off] + A[j], name="S2")
    return b.finish([A, B, C])


def test_fusion_with_shifted_lower_bounds_golden_and_numerics():
    p = _builder_pair(read_off=0)
    s = Schedule(p)
    (i,) = s.loops("S1")
    (j,) = s.loops("S2")
    s.fuse(i, j)
    assert "C[j] = B[j] + A[j]  # S2 (j = i + 1)" in str(s)
    n = 6
    rng = np.random.default_rng(1)
    a = rng.standard_normal(n).astype(np.float32)
    outs = []
    for prog in (p, s.program):
        bb, cc = np.full(n, np.nan, np.float32), np.full(n, np.nan, np.float32)
        bb[0] = 0.5
        cc[0] = 0.25
        interp.run(prog, a, bb, cc)
        outs.append((bb, cc))
    np.testing.assert_array_equal(outs[0][0], outs[1][0])
    np.testing.assert_array_equal(outs[0][1], outs[1][1])


def test_fusion_reading_ahead_refused():
    # S2 (j) reads B[j + 1], written by S1 at i = j + 1: the fused loop reads it one iteration early
    n = te.var("n")
    A = ir.buffer((n,), name="A")
    B = ir.buffer((n,), name="B")
    C = ir.buffer((n,), name="C")
    b = ir.Builder("ahead")
    with b.loop("i", 0, n - 1) as i:
        b.store(B, (i,), A[i] * 3.0, name="S1")
    with b.loop("j", 0, n - 1) as j:
        b.store(C, (j,), B[j + 1] + A[j], name="S2")
    p = b.finish([A, B, C])
    s = Schedule(p)
    (i,) = s.loops("S1")
    (j,) = s.loops("S2")
    with pytest.raises(ScheduleError) as ei:
        s.fuse(i, j)
    assert ei.value.kind == "flow" and ei.value.buffer == "B"
    from schedules.primitives.loop_fusion import fuse

    verify_witness(p, fuse(p, i.var, j.var)[0], ei.value)


def test_fusion_in_place_anti_dependence_refused():
    # S1 reads A[i+1]; S2 overwrites A[j]: fused, S2 at j = i+1 comes after S1(i) but before S1(i+1)... legal;
    # reversed roles: S2 overwrites A[j+1] which S1 reads later -> anti dependence broken
    n = te.var("n")
    A = ir.buffer((n + 1,), name="A")
    B = ir.buffer((n,), name="B")
    b = ir.Builder("war")
    with b.loop("i", 0, n) as i:
        b.store(B, (i,), A[i] + A[i + 1], name="R")
    with b.loop("j", 0, n) as j:
        b.store(A, (j + 1,), 0.0, name="W")
    p = b.finish([A, B])
    s = Schedule(p)
    (i,) = s.loops("R")
    (j,) = s.loops("W")
    with pytest.raises(ScheduleError) as ei:
        s.fuse(i, j)
    assert ei.value.kind == "anti" and ei.value.buffer == "A"
    from schedules.primitives.loop_fusion import fuse

    verify_witness(p, fuse(p, i.var, j.var)[0], ei.value)


def test_fusion_on_nested_loops_says_collapse():
    n = te.var("n")
    A = te.placeholder((n, n), name="A")
    B = te.compute((n, n), lambda i, j: A[i, j] + 1, name="B")
    s = Schedule(B)
    i, j = s.loops(B)
    with pytest.raises(ValueError, match=r"collapse") as ei:
        s.fuse(i, j)
    assert "'j'" in str(ei.value) and "'i'" in str(ei.value)


def test_fusion_unequal_extents_guards_the_shorter():
    # extents n - 1 and n (issue 17, fdtd-2d): the fused loop runs n iterations, S1 under a guard
    p = _builder_pair(lo_b=0, read_off=0)
    s = Schedule(p)
    (i,) = s.loops("S1")
    (j,) = s.loops("S2")
    s.fuse(i, j)
    text = str(s)
    assert "for i in range(0, n):" in text and "if i < n - 1:" in text, text
    for n in (1, 2, 7):
        rng = np.random.default_rng(n)
        arrs = [rng.standard_normal(n).astype(np.float32) for _ in range(3)]
        got, want = [a.copy() for a in arrs], [a.copy() for a in arrs]
        interp.run(s.program, *got)
        interp.run(p, *want)
        assert all(np.array_equal(x, y) for x, y in zip(got, want))


def test_fusion_misuse():
    A, B, C = _chain()
    s = Schedule(C)
    (i,) = s.loops(B)
    (j,) = s.loops(C)
    with pytest.raises(ValueError, match="textual order"):
        s.fuse(j, i)
    with pytest.raises(ValueError, match="both handles are loop 'i'"):
        s.fuse(i, i)
    other = Schedule(C)
    (j2,) = other.loops(C)
    with pytest.raises(ValueError, match="another schedule"):
        s.fuse(i, j2)
    from schedules.primitives.loop_fusion import fuse

    with pytest.raises(TypeError, match="loop handle"):
        fuse(s.program, "i", j.var)


def test_fusion_not_siblings():
    n = te.var("n")
    A = te.placeholder((n, n), name="A")
    B = te.compute((n, n), lambda i, j: A[i, j] + 1, name="B")
    C = te.compute((n,), lambda k: B[k, 0] * 2, name="C")
    s = Schedule(C)
    _, j = s.loops(B)
    (k,) = s.loops(C)
    with pytest.raises(ValueError, match="not siblings"):
        s.fuse(j, k)


def test_fusion_three_nests_with_statement_between_checked():
    # fusing the first and third nest moves the third's instances before the middle nest
    n = te.var("n")
    A = ir.buffer((n,), name="A")
    B = ir.buffer((n,), name="B")
    C = ir.buffer((n,), name="C")
    b = ir.Builder("three")
    with b.loop("i", 0, n) as i:
        b.store(B, (i,), A[i] * 2.0, name="S1")
    with b.loop("k", 0, n) as k:
        b.store(A, (k,), A[k] + 1.0, name="S2")
    with b.loop("j", 0, n) as j:
        b.store(C, (j,), A[j] + B[j], name="S3")
    p = b.finish([A, B, C])
    s = Schedule(p)
    (i,) = s.loops("S1")
    (j,) = s.loops("S3")
    with pytest.raises(ScheduleError) as ei:
        s.fuse(i, j)
    assert ei.value.kind == "flow" and ei.value.source[0] == "S2"
    from schedules.primitives.loop_fusion import fuse

    verify_witness(p, fuse(p, i.var, j.var)[0], ei.value)
