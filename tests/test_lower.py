"""Lowering: one nest per stage, the stage's own Vars as loop variables, reductions as
init + update, temps, params, argument order, and the refused programs."""

from __future__ import annotations

import pytest

from loopir import te
from loopir.errors import ArgumentError
from loopir.lower import lower
from loopir.nodes import Binary, Const, For, Load, Program, Seq, Store, Var
from loopir.visit import statements


def _names(p: Program) -> list[str]:
    return [c.store.name for c in statements(p)]


def _nests(p: Program) -> tuple:
    return p.body.body if isinstance(p.body, Seq) else (p.body,)


def _matmul():
    n, m, p = te.var("n"), te.var("m"), te.var("p")
    a = te.placeholder((n, p), name="A")
    b = te.placeholder((p, m), name="B")
    k = te.reduce_axis(p, name="k")
    c = te.compute((n, m), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    return (n, m, p), a, b, k, c


def test_elementwise_nest() -> None:
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), name="x")
    y = te.compute((n, m), lambda i, j: x[i, j] + 1.0, name="y")
    p = lower(y)
    assert p.name == "y" and [b.name for b in p.args] == ["x", "y"]
    assert p.args[0] is x.buffer and p.args[1] is y.buffer
    assert p.temps == () and p.params == (n, m)
    outer = p.body
    assert isinstance(outer, For) and outer.var is y.op.axis[0]
    assert outer.lo == Const(0, "int64") and outer.hi is n
    inner = outer.body
    assert isinstance(inner, For) and inner.var is y.op.axis[1] and inner.hi is m
    st = inner.body
    assert isinstance(st, Store) and st.name == "y" and st.buffer is y.buffer
    assert st.iters == y.op.axis and st.coords == st.iters and st.indices == st.iters
    assert st.value is y.op.body


def test_reduction_init_and_update() -> None:
    (n, m, p_), a, b, k, c = _matmul()
    p = lower(c, name="mm")
    assert p.name == "mm" and p.params == (n, p_, m)
    ctx = statements(p)
    assert [s.store.name for s in ctx] == ["C_init", "C"]
    init, upd = ctx[0], ctx[1]
    i, j = c.op.axis
    # init sits inside the spatial loops, before the reduction loop
    assert [f.var for f in init.loops] == [i, j] and init.position[-1] == 0
    assert init.store.value == Const(0.0, "float32") and init.store.iters == (i, j)
    assert init.store.coords == init.store.iters
    # update: inside the reduction loop k, iters are the spatial axes then the reduce axis
    assert [f.var for f in upd.loops] == [i, j, k] and upd.position[-1] == 1
    assert upd.store.iters == (i, j, k) and upd.store.coords == upd.store.iters
    assert upd.store.indices == (i, j)
    v = upd.store.value
    assert isinstance(v, Binary) and v.op == "add"
    assert isinstance(v.a, Load) and v.a.buffer is c.buffer and v.a.indices == (i, j)
    assert upd.loops[2].lo == Const(0, "int64") and upd.loops[2].hi is p_
    # the For objects' vars ARE the statement's iteration variables
    assert all(f.var is it for f, it in zip(upd.loops, upd.store.iters))


@pytest.mark.parametrize(
    ("fn", "dtype", "value"),
    [
        (te.max, "float32", float("-inf")),
        (te.min, "float64", float("inf")),
        (te.sum, "int32", 0),
        (te.max, "int32", -(2**31)),
        (te.min, "int64", 2**63 - 1),
    ],
)
def test_reduction_identities(fn, dtype: str, value: float) -> None:
    n = te.var("n")
    x = te.placeholder((n,), dtype=dtype, name="x")
    k = te.reduce_axis(n, name="k")
    r = te.compute((1,), lambda i: fn(x[k], axis=k), name="r")
    init = statements(lower(r))[0].store
    assert init.name == "r_init" and init.value == Const(value, dtype)
    assert r.dtype == dtype


def test_reduce_axis_bounds_and_order() -> None:
    n = te.var("n")
    x = te.placeholder((n, n, 4), name="x")
    k = te.reduce_axis((1, n - 1), name="k")
    r = te.reduce_axis((2, 4), name="r")
    s = te.compute((n,), lambda i: te.sum(x[i, k, r], axis=[k, r]), name="s")
    upd = statements(lower(s))[1]
    assert [f.var for f in upd.loops] == [s.op.axis[0], k, r]
    fk, fr = upd.loops[1], upd.loops[2]
    assert fk.lo == Const(1, "int64") and fk.hi == n - 1
    assert fr.lo == Const(2, "int64") and fr.hi == Const(4, "int64")


def test_triangular_reduction_bound_uses_own_axis() -> None:
    n = te.var("n")
    x = te.placeholder((n,), name="x")
    # the reduce axis is made inside the lambda, so its bound can use the stage's own axis
    s = te.compute((n,), lambda i: (lambda k: te.sum(x[k], axis=k))(te.reduce_axis((0, i + 1), name="k")), name="cs")
    upd = statements(lower(s))[1]
    assert free_of(upd.loops[1].hi) == {s.op.axis[0]}


def free_of(e) -> set:
    from loopir.visit import free_vars

    return free_vars(e)


def test_stage_order_temps_and_args() -> None:
    n = te.var("n")
    x = te.placeholder((n,), name="x")
    w = te.placeholder((n,), name="w")
    a = te.compute((n,), lambda i: x[i] * 2.0, name="a")
    b = te.compute((n,), lambda i: a[i] + w[i], name="b")
    c = te.compute((n,), lambda i: a[i] - b[i], name="c")
    p = lower(c)
    assert _names(p) == ["a", "b", "c"]
    assert [t.name for t in p.temps] == ["a", "b"]
    assert [t.name for t in p.args] == ["x", "w", "c"]  # placeholders in first-use order, then outputs
    assert len(_nests(p)) == 3
    # an intermediate given in args becomes an argument, not a temp
    p2 = lower(c, args=[w, x, a, c])
    assert [t.name for t in p2.args] == ["w", "x", "a", "c"] and [t.name for t in p2.temps] == ["b"]


def test_multiple_outputs_and_shared_input() -> None:
    n = te.var("n")
    x = te.placeholder((n,), name="x")
    r = te.compute((n,), lambda i: te.maximum(x[i], 0.0), name="r")
    t = te.compute((n,), lambda i: te.tanh(x[i]), name="t")
    p = lower([r, t])
    assert [b.name for b in p.args] == ["x", "r", "t"] and _names(p) == ["r", "t"]
    assert p.name == "r"


def test_computed_arg_is_computed_even_if_not_an_output() -> None:
    n = te.var("n")
    x = te.placeholder((n,), name="x")
    a = te.compute((n,), lambda i: x[i] + 1.0, name="a")
    b = te.compute((n,), lambda i: x[i] * 3.0, name="b")
    p = lower(a, args=[x, a, b])
    assert _names(p) == ["a", "b"]


def test_unused_placeholder_in_args_is_kept() -> None:
    n = te.var("n")
    x, unused = te.placeholder((n,), name="x"), te.placeholder((n,), name="unused")
    y = te.compute((n,), lambda i: x[i], name="y")
    assert [b.name for b in lower(y, args=[x, unused, y]).args] == ["x", "unused", "y"]


def test_params_from_affine_shapes() -> None:
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), name="x")
    y = te.compute((n - 2, m - 2), lambda i, j: x[i + 1, j + 1], name="y")
    p = lower(y)
    assert p.params == (n, m)
    assert p.body.hi == n - 2 and p.body.body.hi == m - 2


def test_concrete_sizes_have_no_params() -> None:
    x = te.placeholder((5, 3), name="x")
    k = te.reduce_axis(3, name="k")
    y = te.compute((5,), lambda i: te.sum(x[i, k], axis=k), name="y")
    p = lower(y)
    assert p.params == () and p.body.hi == Const(5, "int64")


def test_scalar_output() -> None:
    n = te.var("n")
    x = te.placeholder((n,), name="x")
    k = te.reduce_axis(n, name="k")
    s = te.compute((), lambda: te.sum(x[k], axis=k), name="s")
    ctx = statements(lower(s))
    assert [c.store.name for c in ctx] == ["s_init", "s"]
    assert ctx[0].loops == () and ctx[0].store.iters == () and ctx[1].store.iters == (k,)


def test_lowering_twice_is_identical() -> None:
    _, _, _, _, c = _matmul()
    assert lower(c) == lower(c)


# ----------------------------------------------------------------------------- refused programs


def test_duplicate_tensor_names() -> None:
    n = te.var("n")
    x1 = te.placeholder((n,), name="dup")
    x2 = te.placeholder((n,), name="dup")
    y = te.compute((n,), lambda i: x1[i] + x2[i], name="y")
    with pytest.raises(ValueError, match="two different tensors are named 'dup' in one program"):
        lower(y)
    z = te.compute((n,), lambda i: x1[i], name="dup2")
    w = te.compute((n,), lambda i: z[i], name="dup2")
    with pytest.raises(ValueError, match="two different tensors are named 'dup2'"):
        lower(w)


def test_init_name_collision() -> None:
    n = te.var("n")
    x = te.placeholder((n,), name="s_init")
    k = te.reduce_axis(n, name="k")
    s = te.compute((1,), lambda i: te.sum(x[k], axis=k), name="s")
    with pytest.raises(ValueError, match="init statement of reduction 's' would be named 's_init'"):
        lower(s)


def test_placeholder_missing_from_args() -> None:
    n = te.var("n")
    x, w = te.placeholder((n,), name="x"), te.placeholder((n,), name="wmiss")
    y = te.compute((n,), lambda i: x[i] * w[i], name="y")
    with pytest.raises(ValueError, match="placeholder 'wmiss' is read but is not among the args"):
        lower(y, args=[x, y])


def test_output_missing_from_args_and_duplicates() -> None:
    n = te.var("n")
    x = te.placeholder((n,), name="x")
    y = te.compute((n,), lambda i: x[i], name="yout")
    with pytest.raises(ValueError, match="output 'yout' is not among the args"):
        lower(y, args=[x])
    with pytest.raises(ValueError, match="tensor 'x' appears twice in args"):
        lower(y, args=[x, x, y])


def test_bad_outputs() -> None:
    n = te.var("n")
    x = te.placeholder((n,), name="xin")
    with pytest.raises(TypeError, match="output 'xin' is a placeholder"):
        lower(x)
    with pytest.raises(TypeError, match="outputs must be te tensors, got str"):
        lower(["y"])
    with pytest.raises(ValueError, match="no outputs"):
        lower([])


def test_size_not_determined_by_args() -> None:
    n, m = te.var("n"), te.var("mfree")
    x = te.placeholder((n,), name="x")
    y = te.compute((n,), lambda i: x[i] * te.cast("float32", m), name="y")
    with pytest.raises(ValueError, match="size variable 'mfree' appears in no argument's shape"):
        lower(y)


def test_loop_vars_distinct_per_stage() -> None:
    n = te.var("n")
    x = te.placeholder((n,), name="x")
    a = te.compute((n,), lambda i: x[i], name="a")
    b = te.compute((n,), lambda i: a[i], name="b")
    loops = [c.loops[0].var for c in statements(lower(b))]
    assert loops[0] is not loops[1] and all(isinstance(v, Var) and v.name == "i" for v in loops)


def test_two_size_variables_with_one_name() -> None:
    # e.g. tensors of two workloads, each with its own te.var("n"), mixed in one program
    n1, n2 = te.var("n"), te.var("n")
    x = te.placeholder((n1,), name="x")
    y = te.placeholder((n2,), name="y")
    z = te.compute((n1,), lambda i: x[i] + y[i], name="z")
    with pytest.raises(ArgumentError, match="two size variables are named 'n'; sizes are passed by name"):
        lower(z)


def test_size_variable_named_like_a_tensor() -> None:
    # accepted: the IR tells them apart by object; the printer shows the size under another name
    n = te.var("x")
    x = te.placeholder((n,), name="x")
    y = te.compute((n,), lambda i: x[i], name="y")
    p = lower(y)
    assert p.params == (n,) and p.args[0] is x.buffer and p.args[0].shape == (n,)
    assert str(p).splitlines()[0] == "def y(x: float32[x_size], y: float32[x_size]):  # sizes: x_size (passed as 'x')"


def test_loop_variable_name_clashes() -> None:
    n = te.var("n")
    x = te.placeholder((n, n), name="x")
    k = te.reduce_axis(n, name="i")
    s = te.compute((n,), lambda i: te.sum(x[i, k], axis=k), name="s")
    with pytest.raises(ValueError, match="stage 's' has two loop variables named 'i'"):
        lower(s)
    t = te.compute((n,), lambda n_: x[n_, n_], name="t")
    assert lower(t).params == (n,)
    u = te.compute((n,), lambda n: x[n, n], name="u")
    p = lower(u)  # a loop variable named like the size: accepted, printed as n_1
    assert p.params == (n,)
    assert "for n_1 in range(0, n):" in str(p) and "u[n_1] = x[n_1, n_1]" in str(p)
