"""Argument checks and size inference (loopir.args)."""

from __future__ import annotations

import numpy as np
import pytest

from loopir.args import bind_args, bind_shapes, eval_expr, size_of
from loopir.nodes import Buffer, Program, Seq, Var, const

rng = np.random.default_rng(0)


def prog(*bufs: Buffer, params: tuple[Var, ...] = ()) -> Program:
    return Program("f", tuple(bufs), Seq(()), (), params)


def arr(*shape: int, dtype: str = "float32") -> np.ndarray:
    return rng.standard_normal(shape).astype(dtype)


def test_infers_plain_and_affine_sizes() -> None:
    n, m = Var("n"), Var("m")
    A = Buffer("A", (n, m), "float32")
    B = Buffer("B", (n - 2, 2 * m), "float64")
    C = Buffer("C", (const(3), m + n), "int32")
    p = prog(A, B, C, params=(n, m))
    env = bind_args(p, [arr(5, 7), arr(3, 14, dtype="float64"), np.zeros((3, 12), np.int32)])
    assert env == {n: 5, m: 7}


def test_affine_dims_alone_are_solved() -> None:
    n = Var("n")
    B = Buffer("B", (2 * n + 1,), "float32")
    C = Buffer("C", (n - 1,), "float32")
    env = bind_args(prog(B, C, params=(n,)), [arr(9), arr(3)])
    assert env == {n: 4}


def test_count_mismatch_is_type_error() -> None:
    n = Var("n")
    p = prog(Buffer("A", (n,), "float32"), Buffer("B", (n,), "float32"))
    with pytest.raises(TypeError, match=r"'f' takes 2 argument\(s\) \(A, B\), got 1"):
        bind_args(p, [arr(3)])


def test_dtype_mismatch_names_argument_and_both_dtypes() -> None:
    n = Var("n")
    p = prog(Buffer("A", (n,), "float32"), Buffer("B", (n,), "float32"))
    with pytest.raises(TypeError, match=r"argument 'B' has dtype float64.*expects float32"):
        bind_args(p, [arr(3), arr(3, dtype="float64")])


def test_non_numpy_is_type_error() -> None:
    p = prog(Buffer("A", (Var("n"),), "float32"))
    with pytest.raises(TypeError, match=r"argument 'A' must be a numpy.ndarray, got list"):
        bind_args(p, [[1.0, 2.0]])


def test_rank_mismatch_is_value_error() -> None:
    n = Var("n")
    p = prog(Buffer("A", (n, n), "float32"))
    with pytest.raises(ValueError, match=r"argument 'A' has 1 dimension\(s\).*declared with 2"):
        bind_args(p, [arr(4)])


def test_constant_dim_mismatch() -> None:
    p = prog(Buffer("W", (const(3), Var("n")), "float32"))
    with pytest.raises(ValueError, match=r"argument 'W' dimension 0 \(declared 3\) is 4, expected 3"):
        bind_args(p, [arr(4, 5)])


def test_two_arguments_disagree_on_a_size() -> None:
    n = Var("n")
    p = prog(Buffer("A", (n,), "float32"), Buffer("B", (n,), "float32"))
    with pytest.raises(ValueError, match=r"size variable 'n' is 5 \(from argument 'A'.*argument 'B'.*is 6") as ei:
        bind_args(p, [arr(5), arr(6)])
    assert "n = 6" in str(ei.value)


def test_affine_dim_contradicts_size() -> None:
    n = Var("n")
    p = prog(Buffer("A", (n,), "float32"), Buffer("B", (n - 2,), "float32"))
    with pytest.raises(ValueError, match=r"'n' is 5 .*'B'.*is 4, which needs n = 6 \(n - 2 = 3 for n = 5\)") as ei:
        bind_args(p, [arr(5), arr(4)])
    assert "'n'" in str(ei.value)


def test_odd_size_for_twice_n() -> None:
    n = Var("n")
    p = prog(Buffer("A", (2 * n,), "float32"))
    with pytest.raises(ValueError, match=r"argument 'A' dimension 0 \(declared 2 \* n\) is 7.*no integer 'n'"):
        bind_args(p, [arr(7)])


def test_non_contiguous_is_value_error() -> None:
    n, m = Var("n"), Var("m")
    p = prog(Buffer("A", (n, m), "float32"))
    a = arr(4, 6)[:, ::2]
    with pytest.raises(ValueError, match=r"argument 'A' is not C-contiguous"):
        bind_args(p, [a])
    with pytest.raises(ValueError, match=r"argument 'A' is not C-contiguous"):
        bind_args(p, [arr(4, 6).T])


def test_uninferable_size_needs_explicit_value() -> None:
    n, k = Var("n"), Var("k")
    p = prog(Buffer("A", (n,), "float32"), params=(n, k))
    with pytest.raises(ValueError, match=r"size variable 'k' of program 'f' appears in no argument's shape"):
        bind_args(p, [arr(3)])
    assert bind_args(p, [arr(3)], known={"k": 9}) == {n: 3, k: 9}
    assert bind_args(p, [arr(3)], known={k: 2}) == {n: 3, k: 2}
    with pytest.raises(ValueError, match=r"size 'zz' is not a size variable"):
        bind_args(p, [arr(3)], known={"zz": 1})


def test_product_of_sizes_cannot_be_inferred_alone() -> None:
    n, m = Var("n"), Var("m")
    p = prog(Buffer("A", (n * m,), "float32"))
    with pytest.raises(ValueError, match=r"cannot infer size\(s\) m, n"):
        bind_args(p, [arr(6)])
    # once another argument gives n and m, the product is checked
    p2 = prog(Buffer("A", (n * m,), "float32"), Buffer("B", (n, m), "float32"))
    assert bind_args(p2, [arr(6), arr(2, 3)]) == {n: 2, m: 3}
    with pytest.raises(ValueError, match=r"argument 'A' dimension 0 \(declared n \* m\) is 7.*n \* m = 6"):
        bind_args(p2, [arr(7), arr(2, 3)])


def test_bind_shapes_works_without_arrays() -> None:
    n = Var("n")
    p = prog(Buffer("A", (n, n + 1), "float16"))
    assert bind_shapes(p, [((3, 4), "float16")]) == {n: 3}
    assert bind_shapes(p, [((3, 4), None)]) == {n: 3}
    with pytest.raises(TypeError, match=r"argument 'A' has dtype float32"):
        bind_shapes(p, [((3, 4), np.float32)])
    with pytest.raises(ValueError, match=r"'n' is 3"):
        bind_shapes(p, [((3, 5), None)])


def test_eval_expr_floor_semantics_and_errors() -> None:
    n = Var("n")
    assert eval_expr((n - 10) // 4, {n: 3}) == -2
    assert eval_expr((n - 10) % 4, {n: 3}) == 1
    assert eval_expr(n * 2 + 1, {n: 3}) == 7
    assert size_of((n, n // 2 + 1), {n: 9}) == (9, 5)
    with pytest.raises(ValueError, match=r"'n' has no value"):
        eval_expr(n + 1, {})
    A = Buffer("A", (n,), "float32")
    with pytest.raises(ValueError, match=r"load of buffer 'A'"):
        eval_expr(A[0] + 1.0, {n: 2})
