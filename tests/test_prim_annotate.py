"""unroll / vectorize / parallel / bind: golden, refusals with verified witnesses, numerics."""

from __future__ import annotations

import pytest

from loopir import ir, te, workloads
from schedules import Schedule, ScheduleError
from schedules.primitives.annotate import reduction_loop_info
from tests.test_prim_loops import add2d, matmul, refused, same_numerics, stencil

SZ = {"n": 7, "m": 9, "k": 5}


def test_annotations_golden_and_numerics():
    s = Schedule(add2d())
    i, j = s.loops("Y")
    jo, ji = s.split(j, 4)
    s.parallel(i).vectorize(ji).unroll(jo)
    assert str(s) == (
        "def Y(X: float32[n, m], Y: float32[n, m]):  # sizes: n, m\n"
        "    for i in parallel(0, n):\n"
        "        for j_o in unroll(0, (m + 3) // 4):\n"
        "            for j_i in vectorize(0, 4):\n"
        "                if j_o * 4 + j_i < m:\n"
        "                    Y[i, j] = X[i, j] * 2.0 + 1.0  # Y (j = j_o * 4 + j_i)"
    )
    same_numerics(s.original, s.program, SZ)


def test_bind_golden_and_numerics():
    s = Schedule(add2d())
    i, j = s.loops("Y")
    s.bind(i, "blockIdx.x").bind(j, "threadIdx.x")
    text = str(s)
    assert "blockIdx.x" in text and "threadIdx.x" in text
    same_numerics(s.original, s.program, SZ)


def test_prefix_sum_parallel_bind_vectorize_refused():
    prog = workloads.prefix_sum().program()
    for name, extra in (("parallel", ()), ("vectorize", ()), ("bind", ("threadIdx.x",)), ("bind", ("blockIdx.x",))):
        s = Schedule(prog)
        (i,) = s.loops("S")
        err = refused(s, name, i, *extra)
        assert err.kind == "flow" and err.buffer == "A"
        assert "carries this dependence" in str(err)
        assert err.sink[1]["i"] == err.source[1]["i"] + 1


def test_reduction_loop_bound_to_threads_refused_with_reason():
    s = Schedule(matmul())
    i, j, r = s.loops("C")
    info = reduction_loop_info(s.program, r.var)
    assert info is not None and info.stmt == "C" and info.op == "add"
    assert reduction_loop_info(s.program, i.var) is None
    err = refused(s, "bind", r, "threadIdx.x")
    assert "reduction loop of C" in str(err) and "not supported yet" in str(err)
    s.bind(i, "blockIdx.x").bind(j, "threadIdx.x")
    same_numerics(s.original, s.program, SZ)


def test_parallel_inner_stencil_loop_refused_outer_after_skew_interchange_ok():
    s = Schedule(stencil())
    i, j = s.loops("S")
    refused(s, "parallel", i)
    s.parallel(j)  # distance (1, -1): j carries nothing inside one i
    same_numerics(s.original, s.program, {"n": 6, "m": 7})


def test_bind_misuse():
    s = Schedule(add2d())
    i, j = s.loops("Y")
    with pytest.raises(ValueError, match="unknown GPU axis 'threadIdx.w'"):
        s.bind(i, "threadIdx.w")
    s.parallel(i)
    with pytest.raises(ValueError, match="already parallel"):
        s.vectorize(i)
    with pytest.raises(ValueError, match="already parallel"):
        s.split(i, 2)


def test_check_false_is_unsafe():
    s = Schedule(workloads.prefix_sum().program(), check=False)
    (i,) = s.loops("S")
    s.parallel(i)  # accepted without a check
    assert "parallel(1, n)" in str(s)
    t = Schedule(s.original)
    with pytest.raises(ScheduleError):
        t.parallel(t.loops("S")[0])


def test_builder_inplace_update_vectorize():
    n = te.var("n")
    a = ir.buffer((n,), name="A")
    b = ir.Builder("inc")
    with b.loop("i", 0, n) as i:
        b.store(a, (i,), a[i] + 1.0, name="S")
    s = Schedule(b.finish([a]))
    (i,) = s.loops("S")
    io, ii = s.split(i, 4)
    s.vectorize(ii).parallel(io)
    same_numerics(s.original, s.program, {"n": 10})
