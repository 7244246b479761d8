"""The imperative builder (loopir.ir): structure of what it builds, and its refusals."""

from __future__ import annotations

import numpy as np
import pytest

from loopir import interp, ir
from loopir.nodes import Allocate, Barrier, For, If, Store, Var, cast, const
from loopir.visit import statements

rng = np.random.default_rng(1)


def test_prefix_sum_structure_and_result() -> None:
    n = Var("n")
    A = ir.buffer((n,), dtype="float32", name="A")
    b = ir.Builder("prefix_sum")
    with b.loop("i", 1, n) as i:
        b.store(A, (i,), A[i - 1] + A[i], name="S")
    p = b.finish([A])
    assert p.name == "prefix_sum" and p.args == (A,) and p.params == (n,) and p.temps == ()
    assert isinstance(p.body, For) and p.body.var is i and p.body.lo == const(1)
    st = p.body.body
    assert isinstance(st, Store) and st.iters == (i,) and st.coords == (i,) and st.name == "S"
    for size in (7, 33):
        a = rng.standard_normal(size).astype(np.float32)
        want = np.cumsum(a, dtype=np.float32)
        interp.run(p, a)
        np.testing.assert_array_equal(a, want)


def test_triangular_nest_iters_outermost_first_and_params_order() -> None:
    n, m = Var("n"), Var("m")
    L = ir.buffer((n, n), "float64", "L")
    X = ir.buffer((m,), "float64", "X")
    b = ir.Builder("tri")
    with b.loop("i", 0, n) as i:
        with b.loop("j", 0, i + 1) as j:
            b.store(L, (i, j), L[i, j] * 2.0)
    p = b.finish([X, L])
    ctx = statements(p)[0]
    assert ctx.store.iters == (i, j) and ctx.store.name == "S0"
    assert p.params == (m, n)  # first appearance in the arguments' shapes
    lm = rng.standard_normal((5, 5))
    want = np.where(np.tri(5, dtype=bool), lm * 2.0, lm)
    interp.run(p, rng.standard_normal(3), lm)
    np.testing.assert_array_equal(lm, want)


def test_scalar_values_take_the_buffer_dtype() -> None:
    A = ir.buffer((4,), "int32", "A")
    F = ir.buffer((4,), "float16", "F")
    b = ir.Builder("fill")
    with b.loop("i", 0, 4) as i:
        s1 = b.store(A, i, 7)
        s2 = b.store(F, (i,), 1)
    assert s1.value == const(7, "int32") and s2.value == const(1.0, "float16")
    a, f = np.zeros(4, np.int32) - 1, np.full(4, np.nan, np.float16)
    interp.run(b.finish([A, F]), a, f)
    assert a.tolist() == [7] * 4 and f.tolist() == [1.0] * 4


def test_if_else_allocate_barrier_temp() -> None:
    n = Var("n")
    X = ir.buffer((n,), "float32", "X")
    Y = ir.buffer((n,), "float32", "Y")
    b = ir.Builder("mixed")
    T = b.temp((n,), "float32", "T")
    with b.loop("i", 0, n) as i:
        with b.if_(X[i] > 0.0):
            b.store(T, i, X[i], name="Pos")
        with b.else_():
            b.store(T, i, -X[i], name="Neg")
    b.barrier()
    with b.loop("i", 0, n) as i:
        with b.allocate((1,), "float32", "acc", scope="local") as acc:
            b.store(acc, 0, T[i] * 2.0, name="A")
            b.store(Y, i, acc[0] + 1.0, name="Y")
    p = b.finish([X, Y])
    assert p.temps == (T,)
    kinds = [type(s).__name__ for s in p.body.body]
    assert kinds == ["For", "Barrier", "For"]
    assert isinstance(p.body.body[0].body, If) and p.body.body[0].body.orelse is not None
    assert isinstance(p.body.body[2].body, Allocate) and isinstance(p.body.body[1], Barrier)
    x = rng.standard_normal(9).astype(np.float32)
    y = np.full(9, np.nan, np.float32)
    interp.run(p, x, y)
    np.testing.assert_array_equal(y, np.abs(x) * np.float32(2) + np.float32(1))


def test_duplicate_statement_name() -> None:
    A = ir.buffer((4,), "float32", "A")
    b = ir.Builder("dup")
    with b.loop("i", 0, 4) as i:
        b.store(A, i, 1.0, name="S")
        with pytest.raises(ValueError, match=r"duplicate statement name 'S'"):
            b.store(A, i, 2.0, name="S")


def test_nested_loops_with_the_same_name() -> None:
    b = ir.Builder("same")
    with b.loop("i", 0, 4):
        with pytest.raises(ValueError, match=r"loop 'i' is nested inside another loop named 'i'"):
            with b.loop("i", 0, 4):
                pass


def test_wrong_index_count() -> None:
    A = ir.buffer((4, 4), "float32", "A")
    b = ir.Builder("idx")
    with b.loop("i", 0, 4) as i:
        with pytest.raises(IndexError, match=r"statement 'S': buffer 'A' has 2 dimension\(s\).*gives 1"):
            b.store(A, (i,), 1.0, name="S")


def test_float_index_refused() -> None:
    A = ir.buffer((4,), "float32", "A")
    b = ir.Builder("fidx")
    with pytest.raises(TypeError, match=r"index 0 of the store 'S' to 'A' must be an integer"):
        b.store(A, (1.5,), 1.0, name="S")


def test_value_dtype_mismatch_needs_cast() -> None:
    A = ir.buffer((4,), "float32", "A")
    B = ir.buffer((4,), "float64", "B")
    b = ir.Builder("dt")
    with b.loop("i", 0, 4) as i:
        with pytest.raises(TypeError, match=r"statement 'S' stores a float64 value into buffer 'A' of dtype float32"):
            b.store(A, i, B[i] * 2.0, name="S")
        with pytest.raises(TypeError, match=r"stores float 0.5 into buffer 'I' of dtype int32"):
            b.store(ir.buffer((4,), "int32", "I"), i, 0.5, name="T")
        b.store(A, i, cast("float32", B[i]), name="U")  # an explicit cast is fine


def test_loops_left_open_at_finish() -> None:
    A = ir.buffer((4,), "float32", "A")
    b = ir.Builder("open")
    with b.loop("i", 0, 4) as i:
        b.store(A, i, 1.0)
        with pytest.raises(RuntimeError, match=r"finish\(\) called for program 'open' while loop 'i' is still open"):
            b.finish([A])


def test_buffer_not_among_arguments() -> None:
    A = ir.buffer((4,), "float32", "A")
    B = ir.buffer((4,), "float32", "Bmissing")
    b = ir.Builder("stray")
    with b.loop("i", 0, 4) as i:
        b.store(A, i, B[i])
    with pytest.raises(ValueError, match=r"uses buffer\(s\) 'Bmissing' that are not among its arguments"):
        b.finish([A])
    with pytest.raises(ValueError, match=r"buffer 'A' is given twice"):
        b.finish([A, A, B])


def test_loop_variable_used_outside_its_loop() -> None:
    A = ir.buffer((4,), "float32", "A")
    b = ir.Builder("scope")
    with b.loop("i", 0, 4) as i:
        b.store(A, i, 1.0)
    with pytest.raises(ValueError, match=r"loop variable 'i' is used outside its loop, in statement 'S'"):
        b.store(A, i, 2.0, name="S")
    with pytest.raises(ValueError, match=r"loop variable 'i' is used outside its loop, in the bounds of loop 'j'"):
        with b.loop("j", 0, i):
            pass


def test_if_needs_a_condition_and_else_needs_an_if() -> None:
    A = ir.buffer((4,), "float32", "A")
    b = ir.Builder("cond")
    with b.loop("i", 0, 4) as i:
        with pytest.raises(TypeError, match=r"condition of if_ must be a comparison.*dtype float32"):
            with b.if_(A[i]):
                pass
        with pytest.raises(ValueError, match=r"else_\(\) must directly follow an if_\(\) block"):
            with b.else_():
                pass


def test_bad_names_dtype_scope_kind() -> None:
    with pytest.raises(TypeError, match=r"unknown dtype of buffer 'A' 'float8'"):
        ir.buffer((4,), "float8", "A")
    with pytest.raises(ValueError, match=r"unknown scope 'texture' for buffer 'A'"):
        ir.buffer((4,), "float32", "A", scope="texture")
    with pytest.raises(TypeError, match=r"dimension 0 of buffer 'A' must be an integer"):
        ir.buffer((4.0,), "float32", "A")
    b = ir.Builder("k")
    with pytest.raises(ValueError, match=r"unknown loop kind 'thread' for loop 'i'"):
        with b.loop("i", 0, 4, kind="thread"):
            pass
    with pytest.raises(ValueError, match=r"program name 'not ok'"):
        ir.Builder("not ok")


def test_loop_kinds_recorded() -> None:
    A = ir.buffer((4, 8), "float32", "A")
    b = ir.Builder("kinds")
    with b.loop("i", 0, 4, kind="parallel") as i:
        with b.loop("j", 0, 8, kind="vectorize") as j:
            b.store(A, (i, j), A[i, j] + 1.0)
    p = b.finish([A])
    assert p.body.kind == "parallel" and p.body.body.kind == "vectorize"
    assert "for i in parallel(0, 4):" in str(p) and "for j in vectorize(0, 8):" in str(p)
