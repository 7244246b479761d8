"""Scratch buffers (Allocate) are private to each iteration of the loops around their allocation:
the analysis expands them by allocation instance, and refuses steps that would change which
statement instances share an allocation."""

from __future__ import annotations

import dataclasses

import islpy as isl
import numpy as np
import pytest

from loopir import interp, ir, poly, te
from loopir import workloads as w
from loopir.lower import lower
from loopir.nodes import Allocate, Buffer, For, Program, Seq, Var
from schedules import Schedule
from tests.witness_check import refused_step as refused

import schedules.primitives.cache_write  # noqa: F401  (registers Schedule.cache_write)

N, M, P = 37, 45, 13


def _gemm() -> tuple[w.Workload, Schedule]:
    wl = w.matmul_bias_relu(n=N, m=M, p=P)
    s = Schedule(lower(list(wl.outputs), list(wl.inputs) + list(wl.outputs)))
    i, j, _ = s.loops("matmul")
    bi, ir_ = s.split(i, 16)
    ii, ty = s.split(ir_, 4)
    bj, jr = s.split(j, 16)
    jj, tx = s.split(jr, 4)
    s.reorder(bi, bj, ty, tx, ii, jj)
    s.cache_write("matmul", "local", tx, epilogue=["C"])
    return wl, s


def _check_gemm(program: Program, wl: w.Workload) -> None:
    rng = np.random.default_rng(7)
    a = rng.standard_normal((N, P)).astype(np.float32)
    b = rng.standard_normal((P, M)).astype(np.float32)
    bias = rng.standard_normal(M).astype(np.float32)
    out = np.full((N, M), np.nan, np.float32)
    interp.run(program, a, b, bias, out)
    np.testing.assert_allclose(out, wl.reference(a, b, bias)[0], rtol=1e-4, atol=1e-4)


def test_bind_outer_loops_after_cache_write():
    wl, s = _gemm()
    bi, bj, ty, tx = s.loops("matmul")[:4]
    s.bind(bi, "blockIdx.y").bind(bj, "blockIdx.x").bind(ty, "threadIdx.y").bind(tx, "threadIdx.x")
    text = str(s)
    assert "# blockIdx.y" in text and "# threadIdx.x" in text and "allocate(float32[4, 4], 'local')" in text
    _check_gemm(s.program, wl)
    # the scratch dependences stay exact inside one allocation: the reduction loop is still refused
    ii, jj, k = s.loops("matmul")[-3:]
    ko, ki = s.split(k, 4)
    s.reorder(ko, ki, ii, jj)
    err = refused(s, "parallel", ko)
    assert err.buffer == "matmul_local" and err.kind == "flow"
    _check_gemm(s.program, wl)


def test_parallel_and_split_outer_loop_after_cache_write():
    wl, s = _gemm()
    bi = s.loops("matmul")[0]
    bio, bii = s.split(bi, 2)  # rewrites coords of the scratch statements: the full allocation check runs
    s.parallel(bio)
    _check_gemm(s.program, wl)


def test_no_scratch_dependence_across_allocations():
    _, s = _gemm()
    d = poly.dependences(s.program)
    assert not d.notes
    local = [b for b in d.private if b.name == "matmul_local"]
    assert local
    # every dependence between two matmul instances stays inside one (i_o, j_o, i_i_i, j_i_i) iteration
    cross = isl.UnionMap("{ matmul[a0, a1, a2, a3, a4, a5, a6] -> matmul[b0, b1, b2, b3, b4, b5, b6] : "
                         "a0 != b0 or a1 != b1 or a2 != b2 or a3 != b3 }")
    assert d.all.intersect(cross).is_empty()
    within = isl.UnionMap("{ matmul[a0, a1, a2, a3, a4, a5, a6] -> matmul[a0, a1, a2, a3, a4, a5, a6 + 1] }")
    assert not d.flow.intersect(within).is_empty()


def _scratch_program(inside: bool, scope: str = "local") -> Program:
    """for i: [allocate t[m]] for j: t[j] = A[i, j] * 2;  for j: B[i, j] = t[m - 1 - j] + 1.
    The allocation is inside the i loop (`inside`) or around it."""
    n, m = te.var("n"), te.var("m")
    a, bb = ir.buffer((n, m), name="A"), ir.buffer((n, m), name="B")
    b = ir.Builder("scratch")

    def body(i: Var, t: Buffer) -> None:
        with b.loop("j", 0, m) as j:
            b.store(t, (j,), a[i, j] * 2.0, name="W")
        with b.loop("j2", 0, m) as j:
            b.store(bb, (i, j), t[m - 1 - j] + 1.0, name="R")

    if inside:
        with b.loop("i", 0, n) as i, b.allocate((m,), name="t", scope=scope) as t:
            body(i, t)
    else:
        with b.allocate((m,), name="t", scope=scope) as t, b.loop("i", 0, n) as i:
            body(i, t)
    return b.finish([a, bb])


def _run(p: Program) -> np.ndarray:
    rng = np.random.default_rng(3)
    a = rng.standard_normal((5, 6)).astype(np.float32)
    out = np.full((5, 6), np.nan, np.float32)
    interp.run(p, a, out)
    return out


def test_allocation_inside_loop_makes_it_parallel():
    p = _scratch_program(inside=True)
    s = Schedule(p)
    s.parallel(s.loops("W")[0])
    np.testing.assert_allclose(_run(s.program), _run(p))


def test_allocation_around_loop_refuses_parallel_with_witness():
    s = Schedule(_scratch_program(inside=False))
    err = refused(s, "parallel", s.loops("W")[0])
    assert err.buffer == "t" and err.kind in ("anti", "output")
    # within one allocation the reader's loop may run in parallel (it only reads t), exactly
    s2 = Schedule(_scratch_program(inside=True))
    s2.parallel(s2.loops("R")[1])
    np.testing.assert_allclose(_run(s2.program), _run(_scratch_program(inside=True)))


def test_moving_a_loop_into_the_allocation_is_refused():
    inside, around = _scratch_program(inside=True), _scratch_program(inside=False)
    # the same statements (identical Store objects): only the allocation moved
    loop = inside.body
    assert isinstance(loop, For) and isinstance(loop.body, Allocate)
    moved = dataclasses.replace(inside, body=Allocate(loop.body.buffer, Seq((_strip(loop),))))
    with pytest.raises(poly.PrivateScopeError,
                       match=r"'t' is allocated inside loops i before this step and outside every loop after"):
        poly.find_violation(poly.dependences(inside), moved)
    with pytest.raises(poly.PrivateScopeError, match="would share one allocation"):
        poly.carried_by(poly.dependences(inside), moved, moved.body.body.body[0].var)  # type: ignore[attr-defined]
    back = _wrap_inside(around)
    with pytest.raises(poly.PrivateScopeError, match="use one allocation of it now and would use separate ones"):
        poly.find_violation(poly.dependences(around), back)
    assert poly.find_violation(poly.dependences(inside), inside) is None


def _strip(s: For) -> For:
    """The i loop with the Allocate inside it removed."""
    assert isinstance(s.body, Allocate)
    return dataclasses.replace(s, body=s.body.body)


def _wrap_inside(p: Program) -> Program:
    alloc = p.body
    assert isinstance(alloc, Allocate)
    loop = alloc.body
    assert isinstance(loop, For)
    return dataclasses.replace(p, body=dataclasses.replace(loop, body=Allocate(alloc.buffer, loop.body)))


def test_scratch_access_outside_its_allocation_is_refused():
    p = _scratch_program(inside=True)
    loop = p.body
    assert isinstance(loop, For) and isinstance(loop.body, Allocate)
    inner = loop.body.body
    assert isinstance(inner, Seq)
    # the reading nest leaves the allocation
    bad = dataclasses.replace(p, body=dataclasses.replace(
        loop, body=Seq((Allocate(loop.body.buffer, inner.body[0]), inner.body[1]))))
    with pytest.raises(poly.PrivateScopeError, match="statement R would access scratch buffer 't' outside"):
        poly.find_violation(poly.dependences(p), bad)


def test_shared_scratch_is_one_copy_per_block():
    p = _scratch_program(inside=True, scope="shared")
    s = Schedule(p)
    s.bind(s.loops("W")[0], "blockIdx.x")  # blocks have their own shared memory
    np.testing.assert_allclose(_run(s.program), _run(p))
    t = Schedule(p)
    with pytest.raises(poly.PrivateScopeError, match=r"'t'.*shared by the threads of i"):
        t.bind(t.loops("W")[0], "threadIdx.x")  # the threads of a block would share t
    assert "threadIdx" not in str(t)
    # analysed with the loop already bound to threads: t is one buffer for all i, so i carries dependences
    q = Schedule(p, check=False)
    q.bind(q.loops("W")[0], "threadIdx.x")
    bound = q.program
    w = poly.carried_by(poly.dependences(bound), bound, bound.body.var)  # type: ignore[attr-defined]
    assert w is not None and w.buffer == "t"
