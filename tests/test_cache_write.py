"""cache_write: golden nest, numerics against the unscheduled program, misuse and refusals."""

from __future__ import annotations

import numpy as np
import pytest

from loopir import interp
from loopir import workloads as w
from loopir.lower import lower
from schedules import Schedule, ScheduleError
from schedules.primitives.cache_write import cache_write

N, M, P = 37, 45, 13


def _prog():
    wl = w.matmul_bias_relu(n=N, m=M, p=P)
    return wl, lower(list(wl.outputs), list(wl.inputs) + list(wl.outputs))


def _tiled(s):
    i, j, _ = s.loops("matmul")
    bi, ir = s.split(i, 16)
    ii, ty = s.split(ir, 4)
    bj, jr = s.split(j, 16)
    jj, tx = s.split(jr, 4)
    s.reorder(bi, bj, ty, tx, ii, jj)
    return tx


def _data(seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((N, P)).astype(np.float32)
    b = rng.standard_normal((P, M)).astype(np.float32)
    bias = rng.standard_normal(M).astype(np.float32)
    return a, b, bias


def _run(program, wl):
    a, b, bias = _data()
    out = np.full((N, M), np.nan, np.float32)
    interp.run(program, a, b, bias, out)
    np.testing.assert_allclose(out, wl.reference(a, b, bias)[0], rtol=1e-4, atol=1e-4)


def test_golden_nest_register_tile_with_epilogue():
    wl, p = _prog()
    s = Schedule(p)
    tx = _tiled(s)
    local = s.cache_write("matmul", "local", tx, epilogue=["C"])
    assert local.name == "matmul_local" and local.scope == "local"
    assert [int(e.value) for e in local.shape] == [4, 4]  # strided rows compacted: 4 per thread, not 13
    text = str(s)
    assert "allocate(float32[4, 4], 'local') as matmul_local" in text
    assert "matmul_local[i_i_o, j_i_o] = 0.0" in text
    assert "matmul_local[i_i_o, j_i_o] = matmul_local[i_i_o, j_i_o] + A[" in text
    assert "max(matmul_local[matmul_q0, matmul_q1] + bias[" in text
    assert "matmul: float32" not in text  # the temporary is gone: no extra pass over it
    _run(s.program, wl)


def test_copy_out_without_epilogue_and_numerics():
    wl, p = _prog()
    s = Schedule(p)
    tx = _tiled(s)
    s.cache_write("matmul", "local", tx)
    text = str(s)
    assert "# matmul_copy" in text and "matmul: float32" in text
    _run(s.program, wl)


def test_then_reorder_reduction_outside_register_tile():
    wl, p = _prog()
    s = Schedule(p)
    tx = _tiled(s)
    s.cache_write("matmul", "local", tx, epilogue=["C"])
    ii, jj, k = s.loops("matmul")[-3:]
    ko, ki = s.split(k, 4)
    s.reorder(ko, ki, ii, jj)
    _run(s.program, wl)


def test_shared_scope_and_pure_function():
    wl, p = _prog()
    s = Schedule(p)
    tx = _tiled(s)
    before = s.program
    p2, buf = cache_write(before, "matmul", "shared", tx.var, epilogue=["C"])
    assert buf.scope == "shared" and p2 is not before
    assert "matmul_local" not in str(before)
    _run(p2, wl)


def test_refused_when_the_reduction_starts_outside_the_loop():
    _, p = _prog()
    s = Schedule(p)
    _, _, k = s.loops("matmul")
    with pytest.raises(ScheduleError) as e:
        s.cache_write("matmul", "local", k)
    err = e.value
    assert err.primitive == "cache_write" and err.kind == "flow" and err.buffer == "matmul"
    name, it = err.sink
    assert name == "matmul" and "k" in it
    assert "matmul" in str(err) and "'k'" in str(err)


@pytest.mark.parametrize(
    "args, exc, words",
    [
        (("matmul", "global"), ValueError, ["scope", "'global'"]),
        (("nope", "local"), ValueError, ["'nope'"]),
        ((3.5, "local"), TypeError, ["3.5"]),
    ],
)
def test_misuse(args, exc, words):
    _, p = _prog()
    s = Schedule(p)
    tx = _tiled(s)
    with pytest.raises(exc) as e:
        cache_write(s.program, args[0], args[1], tx.var)
    for wd in words:
        assert wd in str(e.value)


def test_misuse_loop_and_epilogue():
    _, p = _prog()
    s = Schedule(p)
    tx = _tiled(s)
    from loopir.nodes import Var

    with pytest.raises(ValueError, match="'zz'"):
        cache_write(s.program, "matmul", "local", Var("zz"))
    with pytest.raises(TypeError, match="loop"):
        cache_write(s.program, "matmul", "local", "tx")
    with pytest.raises(ValueError, match="epilogue.*'matmul'"):
        cache_write(s.program, "matmul", "local", tx.var, epilogue=["matmul"])
    # the C nest does not write matmul
    (ci, cj) = s.loops("C")
    with pytest.raises(ValueError, match="no statement inside loop 'j' writes 'matmul'"):
        cache_write(s.program, "matmul", "local", cj.var)
