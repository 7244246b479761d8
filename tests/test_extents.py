"""assume and pad_loop (schedules/primitives/extents.py): a size bound every call meets, and a loop padded to a
constant trip count when no statement instance lies past the padded end at a size the program accepts. Checked:
the refusal's witness is a real instance of the statement (its accesses in bounds) past the padded end at the
witness sizes; padded programs match numpy on fresh data (outputs poisoned with NaN) in the interpreter and on the
CPU; a call past an assumed bound is refused; traces replay."""

from __future__ import annotations

import numpy as np
import pytest

from codegen import build
from loopir import interp, te
from loopir.errors import ArgumentError, ArgumentTypeError, NotFoundError
from loopir.nodes import For, If
from loopir.visit import walk
from schedules import Schedule, ScheduleError
from schedules.primitives.extents import max_trip


def _row_sum(dtype: str = "float32"):
    m, n = te.var("m"), te.var("n")
    x = te.placeholder((m, n), dtype, name="x")
    k = te.reduce_axis(n, name="k")
    return x, te.compute((m,), lambda i: te.sum(x[i, k], axis=k), name="s"), n


def _loop(s: Schedule, name: str) -> For:
    return next(f for f in walk(s.program.body) if isinstance(f, For) and f.var.name == name)


def test_pad_loop_without_a_bound_is_refused_with_a_dropped_instance():
    x, y, n = _row_sum()
    s = Schedule([y])
    _, k = s.loops("s")
    ko, _ = s.split(k, 128)
    with pytest.raises(ScheduleError) as e:
        s.pad_loop(ko, 4)
    err = e.value
    assert err.primitive == "pad_loop" and err.kind == "dropped" and err.buffer == "s"
    name, inst = err.sink
    assert name == "s" and err.source == err.sink
    # a real instance of the statement: its load x[i, k] is inside x at the witness sizes, and its chunk k // 128
    # is at or past the padded end
    sizes = err.params
    assert 0 <= inst["i"] < sizes["m"] and 0 <= inst["k"] < sizes["n"]
    assert inst["k"] // 128 >= 4
    text = str(err)
    assert "pad_loop(k_o, 4) is illegal" in text and "<- pad_loop" in text and "s.assume('n', at_most=...)" in text
    # a bound too large for the extent is refused too: 4 chunks of 128 hold 512, not 513
    s.assume("n", at_most=513)
    with pytest.raises(ScheduleError) as e2:
        s.pad_loop(ko, 4)
    assert e2.value.params["n"] == 513 and e2.value.sink[1]["k"] == 512


def test_pad_loop_under_an_assumed_bound_keeps_the_results():
    x, y, n = _row_sum()
    s = Schedule([y])
    i, k = s.loops("s")
    ko, _ = s.split(k, 128)
    assert max_trip(s.program, ko.var) is None  # unbounded without an assumption
    s.assume(n, at_most=500)
    assert max_trip(s.program, ko.var) == 4
    s.pad_loop(ko, 4)
    f = _loop(s, "k_o")
    assert str(f.hi) == "4" and not isinstance(f.body, If)  # the split's guard already excludes the padding
    s.unroll(ko)
    assert "# assume: n <= 500" in str(s.program)
    rng = np.random.default_rng(5)
    mod = build(s, target="cpu")
    for nn in (500, 129, 1):
        xa = rng.standard_normal((3, nn)).astype(np.float32)
        for run in (lambda a, o: interp.run(s.program, a, o), mod):
            out = np.full(3, np.nan, np.float32)
            run(xa, out)
            np.testing.assert_allclose(out, xa.sum(1), rtol=1e-5, atol=1e-5)
    big = rng.standard_normal((3, 501)).astype(np.float32)
    for run in (lambda: interp.run(s.program, big, np.zeros(3, np.float32)), lambda: mod(big, np.zeros(3, np.float32))):
        with pytest.raises(ArgumentError, match=r"assumes n <= 500 .* the call has n=501"):
            run()


def test_pad_loop_guards_a_loop_whose_body_is_unguarded():
    m, n = te.var("m"), te.var("n")
    x = te.placeholder((m, n), "float32", name="x")
    y = te.compute((m, n), lambda i, j: x[i, j] * 2.0, name="y")
    s = Schedule([y])
    i, j = s.loops("y")
    s.assume("n", at_most=6)
    s.pad_loop(j, 8)
    f = _loop(s, "j")
    assert str(f.hi) == "8" and isinstance(f.body, If) and str(f.body.cond) == "j < n"
    xa = np.random.default_rng(1).standard_normal((4, 6)).astype(np.float32)
    out = np.full((4, 6), np.nan, np.float32)
    interp.run(s.program, xa, out)
    np.testing.assert_allclose(out, xa * 2, rtol=1e-6)
    replayed = Schedule.replay(s.trace_json(), [y])
    assert str(replayed.program) == str(s.program)


def test_assume_and_pad_loop_refuse_bad_arguments():
    x, y, n = _row_sum()
    s = Schedule([y])
    i, k = s.loops("s")
    with pytest.raises(NotFoundError, match="'q' is not a size variable"):
        s.assume("q", at_most=3)
    with pytest.raises(ArgumentError, match="give at_most=, at_least= or both"):
        s.assume("n")
    with pytest.raises(ArgumentTypeError, match="at_most must be an int"):
        s.assume("n", at_most=2.5)
    with pytest.raises(ArgumentError, match="no size meets"):
        s.assume("n", at_most=3, at_least=4)
    with pytest.raises(ArgumentError, match="extent must be >= 1"):
        s.pad_loop(k, 0)
    with pytest.raises(ArgumentTypeError, match="extent must be an int"):
        s.pad_loop(k, "4")
    s.bind(i, "blockIdx.x")
    with pytest.raises(ArgumentError, match="only a serial loop is padded"):
        s.pad_loop(i, 8)
    assert not s.program.assume  # nothing recorded by the refused steps


def test_an_assumed_lower_bound_is_checked_at_each_call():
    x, y, n = _row_sum()
    s = Schedule([y])
    s.assume("n", at_least=2)
    out = np.full(3, np.nan, np.float32)
    with pytest.raises(ArgumentError, match="assumes n >= 2"):
        interp.run(s.program, np.ones((3, 1), np.float32), out)
    xa = np.random.default_rng(2).standard_normal((3, 7)).astype(np.float32)
    interp.run(s.program, xa, out)
    np.testing.assert_allclose(out, xa.sum(1), rtol=1e-5)


def test_pad_loop_refuses_a_nest_it_cannot_analyse_and_assume_refuses_what_is_no_size():
    n = te.var("n")
    x = te.placeholder((n, n), "float32", name="x")
    y = te.compute((n, n), lambda i, j: x[i, j] * 2.0, name="y")
    s = Schedule([y])
    i, j = s.loops("y")
    fo, _ = s.split(s.collapse(i, j), 4)  # bounds in n * n: not affine in the size
    s.assume("n", at_most=8)
    with pytest.raises(ArgumentError, match=r"pad_loop\(i_j_f_o, 16\): the nest around y is not affine"):
        s.pad_loop(fo, 16)
    with pytest.raises(NotFoundError, match="assume: 'q' is neither a loop nor a size variable of this schedule"):
        s.assume(te.var("q"), at_most=3)
    with pytest.raises(ArgumentTypeError, match="assume: size must be a size variable .* got int 3"):
        s.assume(3, at_most=3)
