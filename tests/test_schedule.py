"""Schedule: handles, trace JSON round trip and replay, misuse messages, registration."""

from __future__ import annotations

import json

import pytest

from loopir import te
from loopir.lower import lower
from schedules import Schedule, ScheduleError, primitive
from schedules.primitives import REGISTRY
from tests.test_prim_loops import add2d, matmul, same_numerics, stencil
from tests.witness_check import verify_witness

SZ = {"n": 6, "m": 7, "k": 5}


def test_loops_by_tensor_stmt_and_buffer_name():
    C = matmul()
    s = Schedule(C)
    assert [h.name for h in s.loops(C)] == ["i", "j", "r"]
    assert [h.name for h in s.loops("C_init")] == ["i", "j"]
    assert s.loop("r").var is s.loops(C)[2].var
    with pytest.raises(ValueError, match="no statement or tensor named 'D'"):
        s.loops("D")
    with pytest.raises(ValueError, match="no loop named 'q'"):
        s.loop("q")


def test_constructors():
    C = matmul()
    assert Schedule([C]).program.name == Schedule(lower(C)).program.name
    with pytest.raises(TypeError, match="takes a te tensor"):
        Schedule(42)
    with pytest.raises(AttributeError, match="no attribute or primitive 'splitt'"):
        _ = Schedule(C).splitt


def test_trace_json_round_trip_and_replay():
    C = matmul()
    s = Schedule(C)
    i, j, r = s.loops(C)
    io, jo, ii, ji = s.tile(i, j, 4, 2)
    ro, ri = s.split(r, 2)
    s.reorder(ro, ii).parallel(io).unroll(ri)
    text = s.trace_json()
    data = json.loads(text)
    assert [st["primitive"] for st in data["steps"]] == ["tile", "split", "reorder", "parallel", "unroll"]
    assert data["steps"][0]["created"] == ["i_o", "j_o", "i_i", "j_i"]
    assert data["steps"][0]["args"] == [{"loop": "i"}, {"loop": "j"}, 4, 2]
    t = Schedule.replay(text, C)
    assert str(t) == str(s)
    assert t.trace == s.trace
    same_numerics(s.original, t.program, SZ)
    same_numerics(s.original, s.program, SZ)


def test_replay_refuses_illegal_trace():
    bad = {"steps": [{"primitive": "reorder", "args": [{"loop": "j"}, {"loop": "i"}], "kwargs": {}}]}
    with pytest.raises(ScheduleError):
        Schedule.replay(json.dumps(bad), stencil())
    ok = Schedule.replay(bad, stencil(), check=False)
    assert [h.name for h in ok.loops("S")] == ["j", "i"]


def test_duplicate_loop_names_are_referenced_uniquely():
    Y = add2d()
    Z = te.compute(Y.shape, lambda i, j: Y[i, j] + 1.0, name="Z")
    s = Schedule(Z)
    zi, _ = s.loops("Z")
    s.split(zi, 2)
    t = Schedule.replay(s.trace_json(), Z)
    assert str(t) == str(s)


def test_registration_mechanism():
    calls = []

    @primitive("test_identity_prim", check="order")
    def ident(program, loop):  # noqa: ANN001
        calls.append(loop.name)
        return program

    try:
        s = Schedule(add2d())
        i, _ = s.loops("Y")
        assert s.test_identity_prim(i) is s
        assert calls == ["i"]
        assert s.trace[-1]["primitive"] == "test_identity_prim"
    finally:
        REGISTRY.pop("test_identity_prim")


def test_error_message_parts():
    s = Schedule(stencil())
    i, j = s.loops("S")
    with pytest.raises(ScheduleError) as info:
        s.tile(i, j, 2, 2)
    msg = str(info.value)
    assert "tile(i, j, 2, 2) is illegal" in msg
    assert "flow dependence on A" in msg and "writes A[" in msg and "reads it" in msg
    assert "for i in range(1, n):  <-- tile" in msg
    assert "hint: " in msg


def test_a_crashing_hint_does_not_break_the_error_path():
    from schedules.primitives.loops import reorder

    def bad_hint(ctx, w):  # noqa: ANN001, ANN202
        raise RuntimeError("hint exploded")

    primitive("test_reorder_badhint", hint=bad_hint)(reorder)
    try:
        s = Schedule(stencil())
        i, j = s.loops("S")
        with pytest.raises(ScheduleError) as info:
            s.test_reorder_badhint(j, i)
        assert "hint exploded" not in str(info.value) and info.value.hint is None
        verify_witness(s.original, reorder(s.program, j.var, i.var), info.value)
    finally:
        REGISTRY.pop("test_reorder_badhint")


def test_internal_non_affine_errors_become_value_errors_naming_the_step():
    from loopir import poly
    from loopir.nodes import const

    @primitive("test_nonaffine_prim", check="order")
    def boom(program, loop):  # noqa: ANN001, ANN202
        raise poly.NonAffine(const(1.5))

    try:
        s = Schedule(add2d())
        i, _ = s.loops("Y")
        with pytest.raises(ValueError, match=r"test_nonaffine_prim\(i\): the nest is not affine") as info:
            s.test_nonaffine_prim(i)
        assert not isinstance(info.value, poly.NonAffine) and "loops i" in str(info.value)
        assert s.trace == []
    finally:
        REGISTRY.pop("test_nonaffine_prim")


def test_skew_hint_survives_unbounded_times():
    # a stencil with non-affine (collapsed, unchecked) neighbours: the hint cannot compute times,
    # returns None instead of raising
    from schedules.primitives import CheckContext
    from schedules.primitives.loops import skew_hint

    u = Schedule(stencil(), check=False)
    f = u.collapse(*u.loops("S"))
    s = Schedule(stencil())
    i, j = s.loops("S")
    with pytest.raises(ScheduleError) as info:
        s.reorder(j, i)
    ctx = CheckContext(s.deps, u.program, u.program, (f.var,), {})
    assert skew_hint(ctx, info.value) is None


def test_cache_write_registered_without_importing_gemm():
    import subprocess
    import sys

    code = ("import sys; from schedules import Schedule; from tests.test_prim_loops import matmul; "
            "s = Schedule(matmul()); assert 'schedules.gemm' not in sys.modules; "
            "assert callable(s.cache_write), 'no cache_write'; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=__import__("os").path.dirname(__import__("os").path.dirname(__file__)))
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
