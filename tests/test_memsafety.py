"""Issue 18, parts 2-4: safe modules, numbers within their types, arguments that cannot be silently
wrong, and clear errors (each naming the offending thing) for the cases the issue lists."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from codegen import build
from loopir import interp, ir, te
from loopir.nodes import Const, For, Program, Store, Var
from schedules import Schedule, auto_schedule

RNG = np.random.default_rng(1818)


def _chain():
    """x -> a = 2x -> y = a + 1 (a is a temporary when only y is an output)."""
    n = te.var("n")
    x = te.placeholder((n,), name="x")
    a = te.compute((n,), lambda i: x[i] * 2.0, name="a")
    y = te.compute((n,), lambda i: a[i] + 1.0, name="y")
    return x, a, y


# ----------------------------------------------------------------------------- threads


def test_one_module_called_from_several_threads_with_a_temporary():
    # the issue: 338,960 of 1,048,576 elements wrong when two threads share the cached temporary
    x, a, y = _chain()
    s = Schedule(y)
    mod = build(s, [x, y], threads=1)
    assert mod.program.temps, "the test needs a temporary"
    n, k = 1 << 16, 8
    xs = [RNG.standard_normal(n).astype(np.float32) for _ in range(k)]
    ys = [np.full(n, np.nan, np.float32) for _ in range(k)]
    barrier = threading.Barrier(k)

    def work(j: int) -> None:
        barrier.wait()
        for _ in range(20):
            mod(xs[j], ys[j])

    ts = [threading.Thread(target=work, args=(j,)) for j in range(k)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for xa, ya in zip(xs, ys):
        np.testing.assert_array_equal(ya, xa * 2 + 1)


def test_threads_with_a_parallel_loop_and_a_temporary():
    x, a, y = _chain()
    s = Schedule(y)
    (i,) = s.loops("y")
    s.parallel(i)
    mod = build(s, [x, y], threads=2)
    n = 1 << 15
    xs = [RNG.standard_normal(n).astype(np.float32) for _ in range(4)]
    ys = [np.full(n, np.nan, np.float32) for _ in range(4)]
    ts = [threading.Thread(target=lambda j=j: [mod(xs[j], ys[j]) for _ in range(10)]) for j in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for xa, ya in zip(xs, ys):
        np.testing.assert_array_equal(ya, xa * 2 + 1)


# ----------------------------------------------------------------------------- numbers past their type


def test_split_by_2_to_the_64_is_refused():
    x, a, y = _chain()
    s = Schedule(y)
    (i,) = s.loops("y")
    with pytest.raises(ValueError, match="split: integer argument 18446744073709551616 does not fit in 64 bits"):
        s.split(i, 2**64)
    assert s.trace == []


def test_constant_beyond_int64_is_refused():
    n = te.var("n")
    x = te.placeholder((n,), dtype="int64", name="x")
    with pytest.raises(OverflowError, match=r"integer constant 1180591620717411303424 does not fit in int64"):
        te.compute((n,), lambda k: x[k] + 2**70, name="z")


def test_constant_beyond_int32_is_refused():
    n = te.var("n")
    x = te.placeholder((n,), dtype="int32", name="x")
    with pytest.raises(OverflowError, match="does not fit in int32"):
        te.compute((n,), lambda k: x[k] + te.const(2**40, "int32"), name="z")


def test_unroll_limit_names_the_loop_and_suggests_split():
    x = te.placeholder((100_000,), name="x")
    y = te.compute((100_000,), lambda i: x[i] + 1.0, name="y")
    s = Schedule(y)
    (i,) = s.loops("y")
    with pytest.raises(ValueError, match=r"unroll: loop 'i' has 100000 iterations, more than the limit of 4096.*split"):
        s.unroll(i)
    io, ii = s.split(i, 8)
    s.unroll(ii)  # the suggestion works
    xa = RNG.standard_normal(100_000).astype(np.float32)
    ya = np.full_like(xa, np.nan)
    build(s, [x, y])(xa, ya)
    np.testing.assert_array_equal(ya, xa + 1)


def test_build_refuses_a_huge_unrolled_loop_written_directly():
    i = Var("i")
    a = ir.buffer((5000,), name="A")
    prog = Program("u", (a,), For(i, Const(0, "int64"), Const(5000, "int64"),
                                  Store("S", a, (i,), Const(1.0, "float32"), (i,), (i,)), "unroll"))
    with pytest.raises(ValueError, match="loop 'i' is unrolled over 5000 iterations.*split it first"):
        build(prog)


# ----------------------------------------------------------------------------- arguments


@pytest.mark.parametrize("which", ["x", "y"])
def test_big_endian_arrays_are_refused_naming_the_argument(which):
    x, a, y = _chain()
    mod = build(Schedule(y), [x, y])
    xa = RNG.standard_normal(6).astype(np.float32)
    ya = np.full(6, np.nan, np.float32)
    arrs = {"x": xa, "y": ya}
    arrs[which] = arrs[which].astype(">f4")
    with pytest.raises(TypeError, match=rf"argument '{which}' has non-native byte order \(>f4\)"):
        mod(arrs["x"], arrs["y"])
    with pytest.raises(TypeError, match=rf"argument '{which}' has non-native byte order"):
        interp.run(mod.program, arrs["x"], arrs["y"])
    # the conversion the message suggests works
    arrs[which] = arrs[which].astype(arrs[which].dtype.newbyteorder("="))
    mod(arrs["x"], arrs["y"])
    np.testing.assert_array_equal(arrs["y"], arrs["x"] * 2 + 1)


def test_numpy_integers_as_schedule_arguments():
    x, a, y = _chain()
    s = Schedule(y)
    (i,) = s.loops("y")
    io, ii = s.split(i, np.int64(8))
    assert json.loads(s.trace_json())["steps"][0]["args"][1] == 8
    s2 = Schedule.replay(s.trace_json(), y)
    assert str(s2) == str(s)
    xa = RNG.standard_normal(19).astype(np.float32)
    ya = np.full_like(xa, np.nan)
    build(s, [x, y], threads=np.int32(2))(xa, ya)
    np.testing.assert_array_equal(ya, xa * 2 + 1)


def test_numpy_integers_in_shapes_and_indices():
    x = te.placeholder((np.int64(6),), name="x")
    y = te.compute((np.int32(6),), lambda i: x[i] * 2.0, name="y")
    xa = RNG.standard_normal(6).astype(np.float32)
    ya = np.full_like(xa, np.nan)
    build(y, [x, y])(xa, ya)
    np.testing.assert_array_equal(ya, xa * 2)


def test_inlined_intermediate_as_argument_is_refused():
    x, a, y = _chain()
    s = Schedule(y)
    s.compute_inline(a)
    with pytest.raises(ValueError, match=r"argument 'a' is a computed stage that program .* never writes"):
        build(s, [x, a, y])
    # without schedule steps it is computed (listed in args: an output)
    xa = RNG.standard_normal(5).astype(np.float32)
    aa, ya = np.full_like(xa, np.nan), np.full_like(xa, np.nan)
    build(Schedule(y), [x, a, y])(xa, aa, ya)
    np.testing.assert_array_equal(aa, xa * 2)
    np.testing.assert_array_equal(ya, xa * 2 + 1)


def test_auto_scheduled_intermediate_as_argument_is_refused():
    x, a, y = _chain()
    s = auto_schedule([y], target="cpu")
    with pytest.raises(ValueError, match="argument 'a' is a computed stage"):
        build(s, [x, a, y])


# ----------------------------------------------------------------------------- clear errors


@pytest.mark.parametrize("text,match", [
    ("not json", "the trace is not valid JSON"),
    ('{"program": "y"}', "the trace has no field 'steps'"),
    ('{"steps": [{"args": [{"loop": "i"}, 4]}]}', "step 0 has no field 'primitive'"),
    ('{"steps": [3]}', "step 0 must be an object"),
    ('{"steps": {"a": 1}}', "'steps' must be a list"),
])
def test_malformed_traces(text, match):
    x, a, y = _chain()
    with pytest.raises(ValueError, match=match):
        Schedule.replay(text, y)


def test_schedule_of_an_empty_list():
    with pytest.raises(ValueError, match="at least one tensor"):
        Schedule([])


@pytest.mark.parametrize("bad", ["i", 0, None])
def test_a_non_handle_as_a_loop(bad):
    x, a, y = _chain()
    s = Schedule(y)
    with pytest.raises(TypeError, match=r"split: argument 'loop' must be a loop handle"):
        s.split(bad, 4)
    with pytest.raises(TypeError, match=r"parallel: argument 'loop' must be a loop handle"):
        s.parallel(bad)


def test_loop_reference_with_a_bad_index():
    x, a, y = _chain()
    s = Schedule(y)
    with pytest.raises(ValueError, match=r"loop reference 'i#x': after '#' comes the index"):
        s.loop("i#x")
    with pytest.raises(TypeError, match="loop\\(\\) takes a loop name"):
        s.loop(3)


@pytest.mark.parametrize("threads", ["many", 0, -2, 1.5, True])
def test_threads_option(threads):
    x, a, y = _chain()
    with pytest.raises(ValueError, match="threads must be a positive integer"):
        build(Schedule(y), [x, y], threads=threads)


def test_tile_of_loops_of_two_nests_names_both():
    x, a, y = _chain()
    s = Schedule(y)
    ia, iy = s.loops("a")[0], s.loops("y")[0]
    with pytest.raises(ValueError, match=r"tile: loops 'i#0' and 'i#1' are not nested: they are in different"):
        s.tile(ia, iy, 4, 4)


def test_compute_made_inside_a_lambda_is_kept():
    import gc

    n = te.var("n")
    x = te.placeholder((n,), name="x")
    y = te.compute((n,), lambda i: te.compute((n,), lambda j: x[j] * 3.0, name="inner")[i] - 1.0, name="y")
    gc.collect()
    xa = RNG.standard_normal(7).astype(np.float32)
    ya = np.full_like(xa, np.nan)
    build(y, [x, y])(xa, ya)
    np.testing.assert_allclose(ya, xa * 3 - 1, rtol=1e-6)


def test_options_as_a_plain_string():
    x, a, y = _chain()
    s = Schedule(y)
    (i,) = s.loops("y")
    io, ii = s.split(i, 64)
    s.bind(io, "blockIdx.x").bind(ii, "threadIdx.x")
    with pytest.raises(TypeError, match=r"options must be a tuple of str.*options=\('-lineinfo',\)"):
        build(s, [x, y], target="cuda", options="-lineinfo")


def test_non_ascii_stage_name_on_cpu():
    n = te.var("n")
    x = te.placeholder((n,), name="x")
    y = te.compute((n,), lambda i: x[i] * 2.0 + 1.0, name="résultat")
    mod = build(y, [x, y])
    assert "r_xe9_sultat" in mod.source
    xa = RNG.standard_normal(9).astype(np.float32)
    ya = np.full_like(xa, np.nan)
    mod(xa, ya)
    np.testing.assert_array_equal(ya, xa * 2 + 1)


def test_non_ascii_stage_name_on_cuda_compiles():
    n = te.var("n")
    x = te.placeholder((n,), name="x")
    y = te.compute((n,), lambda i: x[i] * 2.0 + 1.0, name="résultat")
    mod = build(y, [x, y], target="cuda")
    assert mod.kernels


def test_expression_500_operators_deep():
    n = te.var("n")
    x = te.placeholder((n,), name="x")

    def f(i):
        e = x[i]
        for _ in range(500):
            e = e * 0.5 + 1.0
        return e

    y = te.compute((n,), f, name="y")
    assert "0.5" in str(Schedule(y))
    xa = RNG.standard_normal(5)
    want = xa.copy()
    for _ in range(500):
        want = want * 0.5 + 1.0
    ya = np.full(5, np.nan, np.float32)
    build(y, [x, y])(xa.astype(np.float32), ya)
    np.testing.assert_allclose(ya, want, rtol=1e-5)


def test_chain_of_1200_stages_lowers_and_is_proven():
    from loopir.bounds import analyse

    n = te.var("n")
    x = te.placeholder((n,), name="x")
    t = x
    for k in range(1200):
        t = te.compute((n,), lambda i, t=t: t[i] + 1.0, name=f"s{k}")
    s = Schedule(t)
    assert len(str(s).splitlines()) >= 2400
    r = analyse(s.program)
    assert r.witness is None and r.unknown == []
    xa = RNG.standard_normal(3).astype(np.float32)
    ya = np.full_like(xa, np.nan)
    interp.run(s.program, xa, ya)
    np.testing.assert_allclose(ya, xa + 1200, rtol=1e-5)


def test_chain_of_1200_stages_unscheduled_build_is_refused_clearly():
    # 1,199 temporaries: more parameters than a native call can take (ctypes: 1024) -> a clear error, early
    n = te.var("n")
    x = te.placeholder((n,), name="x")
    t = x
    for k in range(1200):
        t = te.compute((n,), lambda i, t=t: t[i] + 1.0, name=f"s{k}")
    with pytest.raises(ValueError, match=r"program .* needs 1201 buffers \(2 arguments, 1199 temporaries\).*"
                                         r"compute_inline"):
        build(Schedule(t), [x, t])


def test_numpy_integers_in_the_builder_and_in_indices():
    a = ir.buffer((np.int64(4),), name="A")
    b = ir.Builder("npint")
    with b.loop("i", np.int32(0), np.int64(4)) as i:
        b.store(a, (i,), 2.0, name="S")
    b.store(a, (np.int64(1),), 5.0, name="T")
    prog = b.finish([a])
    arr = np.full(4, np.nan, np.float32)
    build(prog)(arr)
    np.testing.assert_array_equal(arr, [2, 5, 2, 2])
    x = te.placeholder((4,), name="x")
    y = te.compute((4,), lambda i: x[np.int64(2)] * np.float32(3) + np.int64(1), name="y")
    xa = RNG.standard_normal(4).astype(np.float32)
    ya = np.full(4, np.nan, np.float32)
    build(y, [x, y])(xa, ya)
    np.testing.assert_allclose(ya, np.full(4, xa[2] * 3 + 1), rtol=1e-6)
