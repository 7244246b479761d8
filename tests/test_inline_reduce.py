"""Inline reductions (issue 15 part 1): a `te.sum / te.max / te.min` anywhere in a stage's body is lifted
into a stage of its own (`loopir.te_lift`), so layer norm, RMSNorm and mean/variance written the way people
write them build, match numpy, and fuse into the same single CUDA kernel as the hand-split form."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from codegen import build
from codegen.passes import lower as lower_for
from loopir import interp, te
from loopir.errors import ArgumentError, ArgumentTypeError
from loopir.lower import lower
from loopir.names import sanitize
from loopir.nodes import Var
from loopir.visit import walk
from schedules import Schedule, auto_schedule

EPS = 1e-5
Size = int | Var


def _sizes(m: Size | None, n: Size | None) -> tuple[Size, Size]:
    return (te.var("m") if m is None else m), (te.var("n") if n is None else n)


# ----------------------------------------------------------------------------- the three programs, two ways each
# Each returns (inputs, outputs, reference); `inline=False` is the hand-split program of the same arithmetic,
# its stages named as the lifted ones with "_" for "." (so the generated sources compare equal up to names).


def layernorm(inline: bool, m: Size | None = None, n: Size | None = None) -> tuple[list, list, Callable]:
    m, n = _sizes(m, n)
    x = te.placeholder((m, n), "float32", name="x")
    w = te.placeholder((n,), "float32", name="weight")
    b = te.placeholder((n,), "float32", name="bias")
    if inline:
        k = te.reduce_axis(n, name="k")

        def ln(i: Var, j: Var) -> Any:
            mu = te.sum(x[i, k], axis=k) / n  # used twice below: one stage
            var = te.sum((x[i, k] - mu) ** 2, axis=k) / n  # the same k, inner reduction shadowing it
            return (x[i, j] - mu) * te.rsqrt(var + EPS) * w[j] + b[j]

        y = te.compute((m, n), ln, name="y")
    else:
        k1, k2 = te.reduce_axis(n, name="k"), te.reduce_axis(n, name="k")
        s0 = te.compute((m,), lambda i: te.sum(x[i, k1], axis=k1), name="y_sum0")
        s1 = te.compute((m,), lambda i: te.sum((x[i, k2] - s0[i] / n) ** 2, axis=k2), name="y_sum1")
        y = te.compute((m, n), lambda i, j: (x[i, j] - s0[i] / n) * te.rsqrt(s1[i] / n + EPS) * w[j] + b[j],
                       name="y")

    def ref(xa: np.ndarray, wa: np.ndarray, ba: np.ndarray) -> list[np.ndarray]:
        x64 = xa.astype(np.float64)
        mu = x64.mean(axis=1, keepdims=True)
        v = ((x64 - mu) ** 2).mean(axis=1, keepdims=True)
        return [(x64 - mu) / np.sqrt(v + EPS) * wa + ba]

    return [x, w, b], [y], ref


def rmsnorm(inline: bool, m: Size | None = None, n: Size | None = None) -> tuple[list, list, Callable]:
    m, n = _sizes(m, n)
    x = te.placeholder((m, n), "float32", name="x")
    w = te.placeholder((n,), "float32", name="weight")
    k = te.reduce_axis(n, name="k")
    if inline:
        y = te.compute((m, n), lambda i, j: x[i, j] * te.rsqrt(te.sum(x[i, k] * x[i, k], axis=k) / n + EPS) * w[j],
                       name="y")
    else:
        ss = te.compute((m,), lambda i: te.sum(x[i, k] * x[i, k], axis=k), name="y_sum0")
        y = te.compute((m, n), lambda i, j: x[i, j] * te.rsqrt(ss[i] / n + EPS) * w[j], name="y")

    def ref(xa: np.ndarray, wa: np.ndarray) -> list[np.ndarray]:
        x64 = xa.astype(np.float64)
        return [x64 / np.sqrt((x64 * x64).mean(axis=1, keepdims=True) + EPS) * wa]

    return [x, w], [y], ref


def mean_var(inline: bool, m: Size | None = None, n: Size | None = None) -> tuple[list, list, Callable]:
    """The issue's example: `mean = te.compute((m,), lambda i: te.sum(x[i, k], axis=k) / n)`, then the variance."""
    m, n = _sizes(m, n)
    x = te.placeholder((m, n), "float32", name="x")
    k1, k2 = te.reduce_axis(n, name="k"), te.reduce_axis(n, name="k")
    if inline:
        mean = te.compute((m,), lambda i: te.sum(x[i, k1], axis=k1) / n, name="mean")
        var = te.compute((m,), lambda i: te.sum((x[i, k2] - mean[i]) ** 2, axis=k2) / n, name="var")
    else:
        s = te.compute((m,), lambda i: te.sum(x[i, k1], axis=k1), name="mean_sum0")
        mean = te.compute((m,), lambda i: s[i] / n, name="mean")
        s2 = te.compute((m,), lambda i: te.sum((x[i, k2] - mean[i]) ** 2, axis=k2), name="var_sum0")
        var = te.compute((m,), lambda i: s2[i] / n, name="var")

    def ref(xa: np.ndarray) -> list[np.ndarray]:
        x64 = xa.astype(np.float64)
        return [x64.mean(axis=1), x64.var(axis=1)]

    return [x], [mean, var], ref


PROGRAMS = {"layernorm": layernorm, "rmsnorm": rmsnorm, "mean_var": mean_var}


def _arrays(ins: list, outs: list, shape: dict[str, int], seed: int = 0) -> tuple[list, list]:
    rng = np.random.default_rng(seed)
    dims = {"x": (shape["m"], shape["n"]), "weight": (shape["n"],), "bias": (shape["n"],)}
    xs = [(rng.standard_normal(dims[t.name]) * 2 + 0.5).astype(np.float32) for t in ins]
    ys = [np.full((shape["m"], shape["n"]) if len(t.shape) == 2 else (shape["m"],), np.nan, np.float32)
          for t in outs]
    return xs, ys


def _check(got: list, want: list) -> None:
    for g, w in zip(got, want):
        assert not np.isnan(g).any()
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-4)


def _dotless(source: str, outs: list) -> str:
    names = sorted((t.name for o in outs for t in _all_lifted(o)), key=len, reverse=True)
    for name in names:
        source = source.replace(name, name.replace(".", "_"))
    return source


def _all_lifted(t: Any) -> list:
    seen: list = []
    stack = [t]
    while stack:
        u = stack.pop()
        seen.extend(te.lifted(u))
        stack.extend(getattr(u.op, "inputs", ()))
    return seen


# ----------------------------------------------------------------------------- the three programs end to end


@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("fixed", [False, True], ids=["symbolic", "fixed"])
def test_inline_program_matches_numpy_on_cpu_and_in_the_interpreter(name: str, fixed: bool) -> None:
    shape = {"m": 5, "n": 37}
    ins, outs, ref = PROGRAMS[name](True, *((shape["m"], shape["n"]) if fixed else (None, None)))
    assert all(t.dtype == "float32" for t in outs)  # x / n keeps float32 (n is an int64 size)
    xs, _ = _arrays(ins, outs, shape)
    want = ref(*xs)
    _, ys = _arrays(ins, outs, shape)
    build(outs, ins + outs, target="cpu")(*xs, *ys)
    _check(ys, want)
    _, ys = _arrays(ins, outs, shape)
    interp.run(lower(outs, ins + outs), *xs, *ys)
    _check(ys, want)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_inline_program_is_one_cuda_kernel_equal_to_the_hand_split_one(name: str) -> None:
    ins, outs, _ = PROGRAMS[name](True)
    h_ins, h_outs, _ = PROGRAMS[name](False)
    mod = build(outs, ins + outs, target="cuda", specialize=False)  # compiled by NVRTC here
    hand = build(h_outs, h_ins + h_outs, target="cuda", specialize=False)
    assert len(mod.kernels) == 1
    assert _dotless(mod.source, outs) == hand.source


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_inline_program_on_cpu_is_the_hand_split_one(name: str) -> None:
    ins, outs, _ = PROGRAMS[name](True, 4, 64)
    h_ins, h_outs, _ = PROGRAMS[name](False, 4, 64)
    src = build(outs, ins + outs, target="cpu", specialize=False).source
    assert _dotless(src, outs) == build(h_outs, h_ins + h_outs, target="cpu", specialize=False).source


@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("order", ["reversed", 7])
def test_lowered_cuda_program_matches_under_adversarial_thread_orders(name: str, order: Any) -> None:
    shape = {"m": 3, "n": 37}
    ins, outs, ref = PROGRAMS[name](True, shape["m"], shape["n"])
    low = lower_for(auto_schedule(outs, target="cuda").program, "cuda")
    xs, ys = _arrays(ins, outs, shape, seed=3)
    args = {t.name: a for t, a in zip(ins + outs, xs + ys)}
    interp.run(low, *(args[b.name] for b in low.args), gpu_order=order)
    _check(ys, ref(*xs))


# ----------------------------------------------------------------------------- lifting: shapes, names, handles


def test_lifted_stage_is_a_function_of_the_axes_its_operand_uses_only() -> None:
    m, n = te.var("m"), te.var("n")
    x = te.placeholder((m, n), name="x")
    k = te.reduce_axis(n, name="k")
    y = te.compute((m, n), lambda i, j: x[i, j] - te.sum(x[i, k], axis=k) / n, name="y")
    (s,) = te.lifted(y)
    assert s.name == "y.sum0" and s.dtype == "float32" and y.dtype == "float32"
    assert len(s.shape) == 1 and s.shape[0] is m
    assert s.op.reduce_axis == (k,) and [v.name for v in s.op.axis] == ["i"]
    assert s in y.op.inputs and te.lifted(s) == () and te.lifted(x) == ()
    text = str(lower(y))
    assert "y.sum0: float32[m]  # temporary" in text
    assert "y.sum0[i] = y.sum0[i] + x[i, k]  # y.sum0" in text
    assert "y[i, j] = x[i, j] - y.sum0[i] / float32(n)  # y" in text


def test_lifted_stages_are_schedule_handles() -> None:
    ins, (y,), ref = layernorm(True, 4, 64)
    s = Schedule(y)
    first, second = te.lifted(y)
    assert (first.name, second.name) == ("y.sum0", "y.sum1")
    i, k = s.loops(first)
    assert (i.name, k.name) == ("i", "k")
    assert [h.name for h in s.loops("y.sum1")] == ["i", "k"]
    s.parallel(s.loops(y)[0])
    ko, ki = s.split(k, 16)
    assert "y.sum0" in str(s)
    xs, ys = _arrays(ins, [y], {"m": 4, "n": 64})
    build(s, ins + [y], target="cpu")(*xs, *ys)
    _check(ys, ref(*xs))


def test_two_reductions_in_one_body_and_names_count_per_stage() -> None:
    n = te.var("n")
    x = te.placeholder((n, 9), name="x")
    k = te.reduce_axis(9, name="k")  # one axis for both: the second reduction gets a copy
    y = te.compute((n,), lambda i: te.max(x[i, k], axis=k) - te.min(x[i, k], axis=k), name="span")
    a, b = te.lifted(y)
    assert (a.name, b.name) == ("span.max0", "span.min1")
    assert a.op.reduce_axis == (k,) and b.op.reduce_axis[0] is not k and b.op.reduce_axis[0].name == "k"
    xa = np.random.default_rng(1).standard_normal((6, 9)).astype(np.float32)
    got = np.full(6, np.nan, np.float32)
    build([y], [x, y], target="cpu")(xa, got)
    np.testing.assert_allclose(got, xa.max(1) - xa.min(1), rtol=1e-6)


def test_reduction_nested_in_a_conditional() -> None:
    n = te.var("n")
    x = te.placeholder((n, 11), name="x")
    k = te.reduce_axis(11, name="k")
    y = te.compute((n, 11), lambda i, j: te.where(x[i, j] > 0.0, x[i, j] / te.max(x[i, k], axis=k),
                                                      te.sum(x[i, k] * x[i, k], axis=k) + 1.0), name="y")
    assert [t.name for t in te.lifted(y)] == ["y.max0", "y.sum1"]
    xa = np.random.default_rng(2).standard_normal((7, 11)).astype(np.float32)
    x64 = xa.astype(np.float64)
    want = np.where(x64 > 0, x64 / x64.max(1, keepdims=True), (x64 * x64).sum(1, keepdims=True) + 1)
    got = np.full((7, 11), np.nan, np.float32)
    build([y], [x, y], target="cpu")(xa, got)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    got = np.full((7, 11), np.nan, np.float32)
    interp.run(lower([y], [x, y]), xa, got)
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_reduction_inside_a_reduction_operand_inner_first() -> None:
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), name="x")
    k, r = te.reduce_axis(m, name="k"), te.reduce_axis(m, name="r")
    # the whole body is a reduction whose operand holds another (softmax's denominator, inline)
    z = te.compute((n,), lambda i: te.sum(te.exp(x[i, k] - te.max(x[i, r], axis=r)), axis=k), name="z")
    (mx,) = te.lifted(z)
    assert mx.name == "z.max0" and z.op.reduce_axis == (k,)
    # inside an inline reduction, over an axis of the enclosing reduction: the inner stage is over (i, k)
    p, q = te.reduce_axis(m, name="p"), te.reduce_axis((2, 5), name="q")
    w = te.compute((n,), lambda i: 1.0 + te.sum(te.max(x[i, q] * x[i, p], axis=q), axis=p), name="w")
    inner, outer = te.lifted(w)
    assert (inner.name, outer.name) == ("w.max0", "w.sum1")
    assert [v.name for v in inner.op.axis] == ["i", "p"] and inner.shape[0] is n and inner.shape[1] is m
    assert inner in outer.op.inputs and outer in w.op.inputs and inner not in w.op.inputs
    xa = np.random.default_rng(3).standard_normal((4, 6)).astype(np.float32)
    x64 = xa.astype(np.float64)
    want_z = np.exp(x64 - x64.max(1, keepdims=True)).sum(1)
    want_w = 1 + (x64[:, None, 2:5] * x64[:, :, None]).max(2).sum(1)
    got_z, got_w = np.full(4, np.nan, np.float32), np.full(4, np.nan, np.float32)
    build([z, w], [x, z, w], target="cpu")(xa, got_z, got_w)
    np.testing.assert_allclose(got_z, want_z, rtol=1e-5)
    np.testing.assert_allclose(got_w, want_w, rtol=1e-5)


def test_enclosing_reduce_axis_with_an_offset_range_becomes_a_dimension_from_zero() -> None:
    x = te.placeholder((3, 10), name="x")
    p, q = te.reduce_axis((4, 9), name="p"), te.reduce_axis(10, name="q")
    y = te.compute((3,), lambda i: te.sum(x[i, p] * te.max(x[i, q] - x[i, p], axis=q), axis=p), name="y")
    (inner,) = te.lifted(y)
    assert [int(d.value) for d in inner.shape] == [3, 5]
    xa = np.random.default_rng(4).standard_normal((3, 10)).astype(np.float32)
    x64 = xa.astype(np.float64)
    want = sum(x64[:, p_] * (x64 - x64[:, p_:p_ + 1]).max(1) for p_ in range(4, 9))
    got = np.full(3, np.nan, np.float32)
    interp.run(lower([y], [x, y]), xa, got)
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_triangular_bounds_follow_the_lifted_stage() -> None:
    n = te.var("n")
    x = te.placeholder((n,), name="x")
    x2 = te.placeholder((n, n), name="x2")
    j = te.reduce_axis(n, name="j")

    def body(i: Var) -> Any:
        kk = te.reduce_axis((0, i + 1), name="kk")  # bounds use the enclosing axis i
        return x[i] * 2.0 + te.sum(x2[i, kk], axis=kk) - te.min(x2[i, j], axis=j)

    y = te.compute((n,), body, name="y")
    tri, _ = te.lifted(y)
    (lo, hi), = tri.op.reduce_dom
    assert tri.op.axis[0] in set(_vars(hi)) and y.op.axis[0] not in set(_vars(hi))
    xa = np.random.default_rng(5).standard_normal(6).astype(np.float32)
    x2a = np.random.default_rng(6).standard_normal((6, 6)).astype(np.float32)
    x64, x2_64 = xa.astype(np.float64), x2a.astype(np.float64)
    want = x64 * 2 + np.array([x2_64[i, :i + 1].sum() for i in range(6)]) - x2_64.min(1)
    got = np.full(6, np.nan, np.float32)
    build([y], [x, x2, y], target="cpu")(xa, x2a, got)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _vars(e: Any) -> list:
    return [v for v in walk(e) if isinstance(v, Var)]


def test_equal_reductions_are_one_stage_even_with_other_axes() -> None:
    n = te.var("n")
    x = te.placeholder((n, 8), name="x")
    k1, k2 = te.reduce_axis(8, name="k"), te.reduce_axis(8, name="r")
    y = te.compute((n, 8), lambda i, j: te.sum(x[i, k1], axis=k1) * x[i, j] + te.sum(x[i, k2], axis=k2),
                   name="y")
    (s,) = te.lifted(y)
    assert s.name == "y.sum0"
    # a different operand, or another set of axes, is another stage
    k3, k4 = te.reduce_axis(8, name="k"), te.reduce_axis(8, name="r")
    y2 = te.compute((n, 8), lambda i, j: te.sum(x[i, k3], axis=k3) + te.sum(x[j, k4], axis=k4), name="y2")
    assert [t.name for t in te.lifted(y2)] == ["y2.sum0", "y2.sum1"]


def test_a_reduction_that_uses_no_axis_is_a_scalar_stage() -> None:
    n = te.var("n")
    x = te.placeholder((n,), name="x")
    k = te.reduce_axis(n, name="k")
    y = te.compute((n,), lambda i: x[i] / te.sum(x[k] * x[k], axis=k), name="y")
    (s,) = te.lifted(y)
    assert s.shape == ()
    xa = np.random.default_rng(7).standard_normal(13).astype(np.float32)
    got = np.full(13, np.nan, np.float32)
    build([y], [x, y], target="cpu")(xa, got)
    np.testing.assert_allclose(got, xa / (xa.astype(np.float64) ** 2).sum(), rtol=1e-5)


def test_lifted_names_stay_out_of_user_names() -> None:
    with pytest.raises(ArgumentError, match="must be an identifier, got 'y.sum0'"):
        te.placeholder((3,), name="y.sum0")
    with pytest.raises(ArgumentError, match="must be an identifier"):
        te.compute((3,), lambda i: i * 1.0, name="mean.sum0")


def test_a_user_stage_named_like_a_lifted_one_after_sanitizing_is_refused() -> None:
    """isl formulas name statements by `names.sanitize`: a user's tensor named what the lifted `y.sum0` becomes
    there would be the same statement, so lower refuses, naming both."""
    n = te.var("n")
    x = te.placeholder((n, 5), name="x")
    k, r = te.reduce_axis(5, name="k"), te.reduce_axis(5, name="r")
    clash = sanitize("y.sum0")
    user = te.compute((n,), lambda i: te.max(x[i, r], axis=r), name=clash)
    y = te.compute((n,), lambda i: te.sum(x[i, k], axis=k) - user[i], name="y")
    with pytest.raises(ArgumentError, match=f"lower: statements '.*' and '.*' have one identifier, '{clash}'"):
        lower([y], [x, y])


# ----------------------------------------------------------------------------- dtypes


def test_float_value_over_a_size_keeps_its_float_dtype() -> None:
    n = te.var("n")
    x32 = te.placeholder((n,), "float32", name="x32")
    x16 = te.placeholder((n,), "float16", name="x16")
    i32 = te.placeholder((n,), "int32", name="i32")
    f64 = te.placeholder((n,), "float64", name="f64")
    y = te.compute((n,), lambda i: x32[i] / n, name="y")
    assert y.dtype == "float32"
    assert te.compute((n,), lambda i: x32[i] * i + (n - 1) - x32[i] * (2 * n), name="a").dtype == "float32"
    assert te.compute((n,), lambda i: x16[i] / n, name="b").dtype == "float16"
    assert te.compute((n,), lambda i: te.where(x32[i] < n, x32[i], n), name="c").dtype == "float32"
    assert te.compute((n,), lambda i: f64[i] / n, name="d").dtype == "float64"
    # other rules unchanged: an int tensor, an int64 constant, two tensors
    assert te.compute((n,), lambda i: i32[i] / n, name="e").dtype == "float64"
    assert te.compute((n,), lambda i: i32[i] + n, name="f").dtype == "int64"
    assert te.compute((n,), lambda i: x32[i] * te.const(2, "int64"), name="g").dtype == "float64"
    assert te.compute((n,), lambda i: x32[i] * i32[i], name="h").dtype == "float64"
    xa = np.random.default_rng(9).standard_normal(10).astype(np.float32)
    got = np.full(10, np.nan, np.float32)
    build([y], [x32, y], target="cpu")(xa, got)
    np.testing.assert_allclose(got, xa / 10, rtol=1e-6)


# ----------------------------------------------------------------------------- refusals


def test_reduce_axis_used_outside_its_reduction_names_the_stage() -> None:
    n = te.var("n")
    x = te.placeholder((n, n), name="x")
    k = te.reduce_axis(n, name="k")
    with pytest.raises(ArgumentError, match="compute 'bad': reduce axis 'k' is used in the body, outside a reduct"):
        te.compute((n,), lambda i: te.sum(x[i, k], axis=k) + x[i, k], name="bad")
    with pytest.raises(ArgumentError, match="compute 'bad2': reduce axis 'k' is used in the body, outside"):
        te.compute((n,), lambda i: te.where(x[i, k] > 0.0, te.sum(x[i, k], axis=k), 0.0), name="bad2")
    assert te.lifted(te.compute((n,), lambda i: te.sum(x[i, k], axis=k) * 2.0, name="ok")) != ()


def test_reduction_over_a_loop_variable_names_the_stage() -> None:
    n = te.var("n")
    x = te.placeholder((n, n), name="x")
    with pytest.raises(ArgumentTypeError, match="te.sum: axis 'i' was not made by te.reduce_axis: it is a loop "
                                                "variable of stage 'rows'"):
        te.compute((n,), lambda i: x[i, 0] + te.sum(x[i, 0], axis=i), name="rows")


def test_reduce_axis_of_another_stage_is_refused_inline_too() -> None:
    n = te.var("n")
    x = te.placeholder((n, n), name="x")
    k = te.reduce_axis(n, name="k")
    te.compute((n,), lambda i: 1.0 + te.sum(x[i, k], axis=k), name="first")
    with pytest.raises(ArgumentError, match="compute 'second': reduce axis 'k' belongs to the reduction of "
                                            "stage 'first.sum0'"):
        te.compute((n,), lambda i: 2.0 * te.sum(x[k, i], axis=k), name="second")


def test_enclosing_axis_with_bounds_on_a_loop_variable_cannot_be_lifted() -> None:
    n = te.var("n")
    x = te.placeholder((n, n), name="x")
    r = te.reduce_axis(n, name="r")

    def body(i: Var) -> Any:
        p = te.reduce_axis((0, i + 1), name="p")
        return te.sum(te.max(x[p, r] + x[i, p], axis=r), axis=p)

    with pytest.raises(ArgumentError, match="compute 'tri': a max inside the reduction over 'p' uses 'p', whose "
                                            "bounds depend on the loop variable"):
        te.compute((n,), body, name="tri")


def test_lifted_takes_a_tensor() -> None:
    with pytest.raises(ArgumentTypeError, match="te.lifted takes a tensor, got int 3"):
        te.lifted(3)  # type: ignore[arg-type]
