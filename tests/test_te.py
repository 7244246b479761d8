"""The tensor-expression language: construction, dtypes, and every refused input."""

from __future__ import annotations

import numpy as np
import pytest

from codegen import build
from loopir import nodes, te
from loopir.lower import lower
from loopir.nodes import Binary, Call, Cast, Compare, Const, Load, Logical, Select, Var


@pytest.fixture
def n() -> Var:
    return te.var("n")


# ----------------------------------------------------------------------------- construction


def test_var_arithmetic(n: Var) -> None:
    assert isinstance(n, Var) and n.dtype == "int64" and n.name == "n"
    for e in (n - 1, 2 * n, n // 2, n % 3, n + n):
        assert isinstance(e, Binary) and e.dtype == "int64"
    assert (n - 1).op == "sub" and (2 * n).op == "mul" and (n // 2).op == "floordiv"


def test_placeholder(n: Var) -> None:
    x = te.placeholder((n, 4), dtype="float16", name="x")
    assert x.name == "x" and x.dtype == "float16" and x.ndim == 2
    assert x.shape[0] is n and x.shape[1] == Const(4, "int64")
    assert isinstance(x.op, te.PlaceholderOp) and x.op.inputs == ()
    assert x.buffer.name == "x" and x.buffer.shape == x.shape and x.buffer.dtype == "float16"
    y = te.placeholder(n, name="y")  # a bare size is a 1-d shape; dtype defaults to float32
    assert y.shape == (n,) and y.dtype == "float32"


def test_affine_shapes(n: Var) -> None:
    x = te.placeholder((n - 2, 2 * n, n // 2), name="x")
    assert [s.dtype for s in x.shape] == ["int64"] * 3


def test_compute_axes_named_after_lambda(n: Var) -> None:
    m = te.var("m")
    x = te.placeholder((n, m), name="x")
    y = te.compute((n, m), lambda row, col: x[row, col] * 2.0, name="y")
    op = y.op
    assert isinstance(op, te.ComputeOp)
    assert [v.name for v in op.axis] == ["row", "col"]
    assert op.reduce_axis == () and op.inputs == (x,)
    assert isinstance(op.body, Binary) and op.body.dtype == "float32"
    ld = op.body.a
    assert isinstance(ld, Load) and ld.buffer is x.buffer and ld.indices == op.axis
    assert y.dtype == "float32" and y.shape == (n, m)


def test_compute_varargs_lambda(n: Var) -> None:
    x = te.placeholder((n, n), name="x")
    y = te.compute((n, n), lambda *idx: x[idx], name="y")
    assert [v.name for v in y.op.axis] == ["idx0", "idx1"]


def test_inputs_in_first_use_order(n: Var) -> None:
    a, b = te.placeholder((n,), name="a"), te.placeholder((n,), name="b")
    c = te.compute((n,), lambda i: b[i] + a[i] * b[i], name="c")
    assert c.op.inputs == (b, a)


def test_reduction(n: Var) -> None:
    x = te.placeholder((n, n), name="x")
    k = te.reduce_axis((1, n - 1), name="k")
    s = te.compute((n,), lambda i: te.max(x[i, k], axis=k), name="s")
    op = s.op
    assert isinstance(op.body, te.Reduce) and op.body.op == "max" and op.body.axis == (k,)
    assert op.reduce_axis == (k,)
    lo, hi = op.reduce_dom[0]
    assert lo == Const(1, "int64") and isinstance(hi, Binary)


def test_reduction_over_two_axes(n: Var) -> None:
    x = te.placeholder((n, n, 3), name="x")
    k, r = te.reduce_axis(n, name="k"), te.reduce_axis(3, name="r")
    s = te.compute((n,), lambda i: te.sum(x[i, k, r], axis=[k, r]), name="s")
    assert s.op.reduce_axis == (k, r)
    assert s.op.reduce_dom[1] == (Const(0, "int64"), Const(3, "int64"))


def test_math_and_operators(n: Var) -> None:
    x = te.placeholder((n,), name="x")
    i = te.var("i")
    e = x[i]
    for fn in ("exp", "log", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid", "erf", "abs"):
        c = getattr(te, fn)(e)
        assert isinstance(c, Call) and c.fn == fn and c.dtype == "float32"
    assert te.maximum(e, 0.0).op == "max" and te.minimum(e, 1.0).op == "min"
    w = te.where((e > 0.0) & (e < 1.0), e, -e)
    assert isinstance(w, Select) and isinstance(w.cond, Logical) and w.dtype == "float32"
    assert isinstance(e <= 2.0, Compare) and isinstance((e > 0.0) | (e < -1.0), Logical)
    assert isinstance(te.cast("float64", e), Cast) and te.cast("float64", e).dtype == "float64"
    assert te.const(3, "float16") == Const(3.0, "float16")
    assert (e**3).op == "mul" and (-e).op == "neg"
    assert (e / 2).dtype == "float32" and (e // 2.0).dtype == "float32" and (e % 2.0).dtype == "float32"


def test_promotion_rule(n: Var) -> None:
    h = te.placeholder((n,), dtype="float16", name="h")
    f = te.placeholder((n,), dtype="float32", name="f")
    i32 = te.placeholder((n,), dtype="int32", name="i32")
    i = te.var("i")
    assert (h[i] * 2.0).dtype == "float16"  # Python scalars are weak
    assert (h[i] + f[i]).dtype == "float32"  # tensors promote as numpy
    assert (i32[i] + 1).dtype == "int32"
    assert (i32[i] + 1.5).dtype == "float64"  # a Python float next to an int gives float64
    assert (i32[i] / i32[i]).dtype == "float64"
    assert te.exp(i32[i]).dtype == "float64"
    assert (f[i] / te.cast("float32", n)).dtype == "float32"


def test_default_names_are_unique(n: Var) -> None:
    a, b = te.placeholder((n,)), te.placeholder((n,))
    c = te.compute((n,), lambda i: a[i] + b[i])
    assert len({a.name, b.name, c.name}) == 3
    prog = lower(c)
    assert [b.name for b in prog.args] == [a.name, b.name, c.name]


# ----------------------------------------------------------------------------- refused inputs


def test_wrong_number_of_indices(n: Var) -> None:
    x = te.placeholder((n, n), name="xx")
    with pytest.raises(IndexError, match=r"'xx' has 2 dimension\(s\) but was indexed with 1"):
        te.compute((n,), lambda i: x[i], name="y")
    with pytest.raises(IndexError, match="'xx'.*indexed with 3"):
        te.compute((n,), lambda i: x[i, i, i], name="y")


def test_float_index(n: Var) -> None:
    x = te.placeholder((n,), name="xf")
    with pytest.raises(TypeError, match="index 0 of tensor 'xf' must be an integer, got float 1.5"):
        x[1.5]
    with pytest.raises(TypeError, match="index 0 of tensor 'xf' must be an integer expression"):
        te.compute((n,), lambda i: x[x[i]], name="y")


def test_tensor_or_slice_as_index(n: Var) -> None:
    x = te.placeholder((n,), name="xs")
    with pytest.raises(TypeError, match="index 0 of tensor 'xs' is the tensor 'xs'"):
        x[x]
    with pytest.raises(TypeError, match="index 0 of tensor 'xs' is a slice"):
        x[1:3]


def test_lambda_arity_mismatch(n: Var) -> None:
    x = te.placeholder((n, n), name="x")
    msg = r"compute 'bad': the lambda takes 1 index argument\(s\) \(i\) but the shape has 2"
    with pytest.raises(TypeError, match=msg):
        te.compute((n, n), lambda i: x[i, i], name="bad")
    with pytest.raises(TypeError, match=r"compute 'bad2': the lambda takes 3 .* shape has 2"):
        te.compute((n, n), lambda i, j, k: x[i, j], name="bad2")


def test_unknown_dtype(n: Var) -> None:
    with pytest.raises(TypeError, match="unknown dtype of placeholder 'p' 'float8'"):
        te.placeholder((n,), dtype="float8", name="p")
    x = te.placeholder((n,), name="x")
    with pytest.raises(TypeError, match="unknown dtype 'float8_e4m3'"):
        te.cast("float8_e4m3", x[0])
    with pytest.raises(TypeError, match="unknown dtype 'complex64'"):
        te.const(1, "complex64")


def test_float_shape(n: Var) -> None:
    msg = "shape entry 1 of placeholder 'p' must be an integer or a size variable, got float"
    with pytest.raises(TypeError, match=msg):
        te.placeholder((n, 2.5), name="p")
    with pytest.raises(TypeError, match="shape entry 0 of compute 'c'"):
        te.compute((1.0,), lambda i: i, name="c")
    with pytest.raises(ValueError, match="shape entry 0 of placeholder 'q' is negative"):
        te.placeholder((-1,), name="q")


def test_shape_with_loop_variable(n: Var) -> None:
    x = te.placeholder((n,), name="x")
    with pytest.raises(ValueError, match="shape entry 0 of compute 'inner' uses the loop variable 'i'"):
        te.compute((n,), lambda i: te.compute((i,), lambda j: x[j], name="inner")[0], name="outer")


def test_bad_names() -> None:
    with pytest.raises(ValueError, match="identifier, got 'a b'"):
        te.placeholder((3,), name="a b")
    with pytest.raises(ValueError, match="size variable must be an identifier, got '1n'"):
        te.var("1n")


def test_reduction_without_axis(n: Var) -> None:
    x = te.placeholder((n,), name="x")
    with pytest.raises(TypeError, match=r"te.sum needs its reduction axis"):
        te.sum(x[0])
    with pytest.raises(TypeError, match=r"te.max needs at least one reduction axis"):
        te.max(x[0], axis=[])


def test_axis_not_a_reduce_axis(n: Var) -> None:
    x = te.placeholder((n, n), name="x")
    with pytest.raises(TypeError, match=r"te.sum: axis 'j' was not made by te.reduce_axis"):
        te.compute((n, n), lambda i, j: te.sum(x[i, j], axis=j), name="c")
    with pytest.raises(TypeError, match=r"te.min: axis int 3 was not made"):
        te.min(x[0, 0], axis=3)


def test_reduce_axis_listed_twice(n: Var) -> None:
    x = te.placeholder((n,), name="x")
    k = te.reduce_axis(n, name="kk")
    with pytest.raises(ValueError, match="reduce axis 'kk' is listed twice"):
        te.sum(x[k], axis=[k, k])


def test_reduce_axis_outside_reduction(n: Var) -> None:
    x = te.placeholder((n, n), name="x")
    k = te.reduce_axis(n, name="kout")
    with pytest.raises(ValueError, match="compute 'c': reduce axis 'kout' is used in the body, outside a reduction"):
        te.compute((n,), lambda i: x[i, k], name="c")


def test_reduce_axis_of_another_reduction_in_same_body(n: Var) -> None:
    x = te.placeholder((n, n), name="x")
    k, r = te.reduce_axis(n, name="k"), te.reduce_axis(n, name="r")
    with pytest.raises(ValueError, match="compute 'c': reduce axis 'r' is used in the body, outside a reduction"):
        te.compute((n,), lambda i: te.sum(x[i, k] + x[r, i], axis=k), name="c")


def test_reduce_axis_of_another_stage(n: Var) -> None:
    x = te.placeholder((n, n), name="x")
    k = te.reduce_axis(n, name="k")
    te.compute((n,), lambda i: te.sum(x[i, k], axis=k), name="rows")
    with pytest.raises(ValueError, match="compute 'cols': reduce axis 'k' belongs to the reduction of stage 'rows'"):
        te.compute((n,), lambda j: te.sum(x[k, j], axis=k), name="cols")
    msg = "compute 'd': reduce axis 'k' in the body belongs to the reduction of stage 'rows'"
    with pytest.raises(ValueError, match=msg):
        te.compute((n,), lambda j: x[k, j], name="d")


def test_reduction_not_at_top_is_lifted(n: Var) -> None:
    # inline reductions become stages of their own (tests/test_inline_reduce.py has the rest)
    x = te.placeholder((n,), name="x")
    k = te.reduce_axis(n, name="k")
    mean = te.compute((1,), lambda i: te.sum(x[k], axis=k) / 2.0, name="mean")
    assert [t.name for t in te.lifted(mean)] == ["mean.sum0"]
    k2 = te.reduce_axis(n, name="k2")
    assert isinstance(te.sum(te.sum(x[k], axis=k) + x[k2], axis=k2), te.Reduce)


def test_reduction_of_condition(n: Var) -> None:
    x = te.placeholder((n,), name="x")
    k = te.reduce_axis(n, name="k")
    with pytest.raises(TypeError, match="te.sum of a condition"):
        te.sum(x[k] > 0.0, axis=k)


def test_loop_variable_leaks_into_another_stage(n: Var) -> None:
    x = te.placeholder((n,), name="x")
    leaked: list[Var] = []
    te.compute((n,), lambda i: leaked.append(i) or x[i], name="first")
    with pytest.raises(ValueError, match="compute 'second': variable 'i' is a loop variable of stage 'first'"):
        te.compute((n,), lambda j: x[j] + x[leaked[0]], name="second")


def test_loop_variable_leaks_into_nested_compute(n: Var) -> None:
    x = te.placeholder((n, n), name="x")
    with pytest.raises(ValueError, match="compute 'inner': variable 'i' is a loop variable of stage 'outer'"):
        te.compute((n,), lambda i: te.compute((n,), lambda j: x[i, j], name="inner")[i], name="outer")


def test_lambda_returns_tensor_or_junk(n: Var) -> None:
    x = te.placeholder((n,), name="x")
    with pytest.raises(TypeError, match="compute 'c': the lambda returned the tensor 'x'; index it"):
        te.compute((n,), lambda i: x, name="c")
    with pytest.raises(TypeError, match="compute 'd': the lambda must return an expression, got 'oops'"):
        te.compute((n,), lambda i: "oops", name="d")


def test_math_on_tensor_and_bad_power(n: Var) -> None:
    x = te.placeholder((n,), name="xt")
    with pytest.raises(TypeError, match="te.exp: got the tensor 'xt'"):
        te.exp(x)
    with pytest.raises(TypeError, match="te.sum: got the tensor 'xt'"):
        te.sum(x, axis=te.reduce_axis(n))
    with pytest.raises(TypeError, match="integer exponent, got float 0.5"):
        te.compute((n,), lambda i: x[i] ** 0.5, name="c")


def test_buffer_not_from_te(n: Var) -> None:
    raw = nodes.Buffer("raw", (n,), "float32")
    with pytest.raises(TypeError, match="compute 'c' reads buffer 'raw', which is not a te tensor"):
        te.compute((n,), lambda i: raw[i], name="c")


def test_condition_errors(n: Var) -> None:
    x = te.placeholder((n,), name="x")
    with pytest.raises(TypeError, match="no truth value"):
        te.compute((n,), lambda i: x[i] if x[i] > 0.0 else 0.0, name="c")
    with pytest.raises(TypeError, match="condition of where"):
        te.where(x[0], 1.0, 2.0)
    # `==` of two loop variables is Python's comparison of the objects (a bool, which where() takes as a constant
    # known at build time); `.eq` builds the comparison
    a = te.placeholder((n, n), name="a")
    d = te.compute((n, n), lambda i, j: te.where(i.eq(j), 1.0, a[i, j]), name="d")
    x0 = np.random.default_rng(3).standard_normal((5, 5)).astype(np.float32)
    got = np.full((5, 5), np.nan, np.float32)
    build([d], [a, d])(x0, got)
    want = x0.copy()
    np.fill_diagonal(want, 1.0)
    assert np.array_equal(got, want)


def test_reduce_axis_bad_domain() -> None:
    with pytest.raises(TypeError, match="reduce axis 'k': give an extent or a \\(lo, hi\\) pair"):
        te.reduce_axis((0, 1, 2), name="k")
    with pytest.raises(ValueError, match="reduce axis 'k' has an empty negative range"):
        te.reduce_axis((5, 2), name="k")
    with pytest.raises(TypeError, match="upper bound of reduce axis 'k' must be an integer"):
        te.reduce_axis(2.5, name="k")


def test_numpy_integers_are_sizes_and_indices() -> None:
    import numpy as np

    x = te.placeholder((np.int64(4), 3), name="x")
    assert x.shape == (Const(4, "int64"), Const(3, "int64"))
    assert x[np.int32(1), 2].indices == (Const(1, "int64"), Const(2, "int64"))
    k = te.reduce_axis(np.int64(3), name="k")
    assert te.compute((4,), lambda i: te.sum(x[i, k], axis=k), name="s").op.reduce_dom[0][1] == Const(3, "int64")
