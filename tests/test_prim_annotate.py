"""unroll / vectorize / parallel / bind: golden, refusals with verified witnesses, numerics."""

from __future__ import annotations

import pytest

from loopir import ir, te, workloads
from schedules import Schedule, ScheduleError
from schedules.primitives.annotate import reduction_loop_info
from tests.test_prim_loops import add2d, matmul, same_numerics, stencil
from tests.witness_check import refused_step as refused

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


def test_witness_of_reorder_after_vectorize_breaks_in_forward_order():
    # A[i, j] = A[i-1, j+1] + A[i, j] with j vectorized; reorder(j, i) is refused. The new program
    # breaks the dependence only when the vectorized loop runs forwards: verify_witness must try
    # the orders a concurrent loop allows, not just the reversed one
    from schedules.primitives.loops import reorder
    from tests.witness_check import concurrent_orders, reverse_concurrent_loops, verify_witness

    n = te.var("n")
    a = ir.buffer((n, n + 1), name="A")
    b = ir.Builder("wave")
    with b.loop("i", 1, n) as i:
        with b.loop("j", 0, n) as j:
            b.store(a, (i, j), a[i - 1, j + 1] + a[i, j], name="S")
    s = Schedule(b.finish([a]))
    i, j = s.loops("S")
    s.vectorize(j)
    err = refused(s, "reorder", j, i)  # refused() runs verify_witness on the candidate
    new = reorder(s.program, j.var, i.var)
    assert len(concurrent_orders(new)) == 2
    # reversed alone would not show it: the check really needs the forward order
    with pytest.raises(AssertionError, match="still runs"):
        verify_witness(s.original, reverse_concurrent_loops(new), err)
    verify_witness(s.original, new, err)


def test_verify_witness_rejects_a_fake_witness():
    # honesty of the independent check: a witness whose instances do not conflict is rejected
    from schedules.primitives.annotate import parallel
    from tests.witness_check import verify_witness

    s = Schedule(workloads.prefix_sum().program())
    (i,) = s.loops("S")
    err = refused(s, "parallel", i)
    new = parallel(s.program, i.var)
    verify_witness(s.original, new, err)
    far = ScheduleError("parallel", err.kind, err.buffer, err.source,
                        (err.sink[0], {"i": err.sink[1]["i"] + 1}), err.params)
    with pytest.raises(AssertionError, match="do not touch one element"):
        verify_witness(s.original, new, far)
    backwards = ScheduleError("parallel", err.kind, err.buffer, err.sink, err.source, err.params)
    with pytest.raises(AssertionError):
        verify_witness(s.original, new, backwards)
