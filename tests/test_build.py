"""`codegen.build`: argument order, targets, the structural cache, and every refused input."""

from __future__ import annotations

import sys
import time

import numpy as np
import pytest

from codegen import build, structural_key
from codegen.module import CpuModule
from loopir import te, workloads
from loopir.nodes import Buffer, Const, For, Program, Store, Var

RNG = np.random.default_rng(7)


def sincos():
    n = te.var("n")
    x = te.placeholder((n,), "float32", name="x")
    y = te.compute((n,), lambda i: te.sin(x[i]) ** 2 + te.cos(x[i]) ** 2, name="y")
    return x, y


def two_inputs():
    n = te.var("n")
    a = te.placeholder((n,), "float32", name="a")
    b = te.placeholder((n, 3), "float64", name="b")
    y = te.compute((n,), lambda i: te.cast("float64", a[i]) * b[i, 1], name="y")
    return a, b, y


def test_build_from_tensors_runs_and_writes_in_place():
    x, y = sincos()
    mod = build(y, [x, y], target="cpu")
    xa = RNG.uniform(-5, 5, 1001).astype(np.float32)
    ya = np.full_like(xa, np.nan)
    mod(xa, ya)
    np.testing.assert_allclose(ya, np.sin(xa) ** 2 + np.cos(xa) ** 2, rtol=1e-6)
    assert isinstance(mod, CpuModule) and mod.target == "cpu"
    assert "define i32 @" in mod.source and mod.kernels
    assert [b.name for b in mod.program.args] == ["x", "y"]


def test_args_reorder_the_call():
    a, b, y = two_inputs()
    mod = build(y, [y, b, a])
    aa = RNG.standard_normal(17).astype(np.float32)
    ba = RNG.standard_normal((17, 3))
    ya = np.full(17, np.nan)
    mod(ya, ba, aa)
    np.testing.assert_allclose(ya, aa.astype(np.float64) * ba[:, 1])
    # Buffers work as well as tensors
    mod2 = build(y, [b.buffer, a.buffer, y.buffer])
    ya2 = np.full(17, np.nan)
    mod2(ba, aa, ya2)
    np.testing.assert_array_equal(ya, ya2)


def test_missing_arg_is_named():
    a, b, y = two_inputs()
    with pytest.raises(ValueError, match="'b'.*missing from args"):
        build(y, [a, y])


def test_duplicate_arg_is_refused():
    x, y = sincos()
    with pytest.raises(ValueError, match="'x' is listed twice"):
        build(y, [x, x, y])


def test_non_tensor_arg_is_refused():
    x, y = sincos()
    with pytest.raises(TypeError, match=r"args\[1\]"):
        build(y, [x, "y"])


def test_intermediate_listed_as_arg_is_promoted():
    w = workloads.softmax()
    (x,), (y,) = w.inputs, w.outputs
    prog = w.program()
    row_max = next(t for t in prog.temps if t.name == "row_max")
    mod = build(prog, [x, row_max, y])
    assert row_max in mod.program.args and row_max not in mod.program.temps
    xa = RNG.standard_normal((6, 40)).astype(np.float32)
    ma = np.full(6, np.nan, np.float32)
    ya = np.full_like(xa, np.nan)
    mod(xa, ma, ya)
    np.testing.assert_array_equal(ma, xa.max(axis=1))
    np.testing.assert_allclose(ya, w.reference(xa)[0], rtol=1e-5)


def test_unknown_target_is_named():
    x, y = sincos()
    with pytest.raises(ValueError, match="'tpu'"):
        build(y, [x, y], target="tpu")


def test_unknown_cpu_option_is_named():
    x, y = sincos()
    with pytest.raises(TypeError, match="'blocks'"):
        build(y, [x, y], blocks=4)


def test_bad_build_input():
    with pytest.raises(TypeError, match="Schedule, a Program"):
        build(42, None)


def test_cuda_target_calls_build_cuda(monkeypatch):
    calls = []

    def build_cuda(program, **opts):
        calls.append((program, opts))
        return "module"

    monkeypatch.setattr(sys.modules["codegen.build"], "build_cuda", build_cuda)
    monkeypatch.setattr(sys.modules["codegen.build"], "_speculate", lambda *a, **k: None)  # the plain path
    x, y = sincos()
    assert build(y, [y, x], target="cuda", options=("-lineinfo",)) == "module"
    (prog, opts), = calls
    assert [b.name for b in prog.args] == ["y", "x"] and opts == {"options": ("-lineinfo",)}


def test_unknown_cuda_option_is_named_before_any_work(monkeypatch):
    monkeypatch.setattr(sys.modules["codegen.build"], "_speculate", None)  # would fail if reached
    x, y = sincos()
    with pytest.raises(TypeError, match="'block'.*known: arch, options, cache"):
        build(y, [y, x], target="cuda", block=128)


def test_structural_cache_hit_with_fresh_objects():
    p1 = workloads.gelu().program()
    p2 = workloads.gelu().program()  # fresh Vars and Buffers
    assert p1.params[0] is not p2.params[0]
    assert structural_key(p1) == structural_key(p2)
    m1 = build(p1)
    t = time.perf_counter()
    m2 = build(p2)
    hit_s = time.perf_counter() - t
    assert m2.kernel is m1.kernel, f"second build recompiled ({hit_s * 1e3:.1f} ms)"
    xa = RNG.standard_normal(300).astype(np.float32)
    ya = np.full_like(xa, np.nan)
    m2(xa, ya)  # the cached kernel runs with the second program's size variables
    np.testing.assert_allclose(ya, workloads.gelu().reference(xa)[0], rtol=1e-5, atol=1e-6)
    # a different structure is not a hit
    assert structural_key(workloads.gelu(dtype="float64").program()) != structural_key(p1)
    assert structural_key(workloads.sincos().program()) != structural_key(p1)


# ----------------------------------------------------------------------------- refused arguments


@pytest.fixture(scope="module")
def mod2():
    a, b, y = two_inputs()
    return build(y, [a, b, y])


def arrays2(n=5):
    return RNG.standard_normal(n).astype(np.float32), RNG.standard_normal((n, 3)), np.full(n, np.nan)


def test_wrong_count(mod2):
    a, b, y = arrays2()
    with pytest.raises(TypeError, match="3 argument"):
        mod2(a, b)


def test_wrong_dtype_names_arg_and_dtypes(mod2):
    a, b, y = arrays2()
    with pytest.raises(TypeError, match="'a'.*float64.*float32"):
        mod2(a.astype(np.float64), b, y)


def test_non_array(mod2):
    a, b, y = arrays2()
    with pytest.raises(TypeError, match="'a'"):
        mod2(list(a), b, y)


def test_wrong_rank(mod2):
    a, b, y = arrays2()
    with pytest.raises(ValueError, match="'b'"):
        mod2(a, b[:, 0].copy(), y)


def test_declared_shape_contradicted(mod2):
    a, b, y = arrays2()
    with pytest.raises(ValueError, match="'b'.*dimension 1"):
        mod2(a, np.ones((5, 4)), y)


def test_size_variable_conflict_names_var_and_values(mod2):
    a, b, y = arrays2()
    with pytest.raises(ValueError, match=r"'n'.*5.*6|'n'.*6.*5"):
        mod2(a, b, np.full(6, np.nan))


def test_non_contiguous_refused(mod2):
    a, b, y = arrays2(10)
    with pytest.raises(ValueError, match="'a'.*contiguous"):
        mod2(a[::2], b[:5].copy(), y[:5].copy())


def test_read_only_output_refused(mod2):
    a, b, y = arrays2()
    y.flags.writeable = False
    with pytest.raises(ValueError, match="'y'.*read-only"):
        mod2(a, b, y)


def test_overlapping_written_arrays_refused():
    w = workloads.sincos(dtype="float64")
    mod = build(w.program())
    x = RNG.standard_normal(20)
    with pytest.raises(ValueError, match="'x' and 'y' overlap"):
        mod(x, x)
    buf = RNG.standard_normal(30)
    with pytest.raises(ValueError, match="overlap"):
        mod(buf[:20], buf[10:30])


def test_zero_size_dims_run(mod2):
    a, b, y = arrays2(0)
    mod2(a, b, y)
    w = workloads.softmax()
    m = build(w.program())
    for shape in ((0, 5), (4, 0), (0, 0)):
        x = np.ones(shape, np.float32)
        m(x, np.empty_like(x))


def test_huge_temporary_is_a_clear_error():
    # t has n^4 elements: with n = 2^20 that overflows 64 bits; no native code may run
    n, i = Var("n"), Var("i")
    x, y = Buffer("x", (n,), "float32"), Buffer("y", (n,), "float32")
    t = Buffer("t", (n, n, n, n), "float32")
    z = Const(0, "int64")
    body = For(i, z, n, Store("t", t, (i, z, z, z), x[i], (i,), (i,)))
    prog = Program("huge", (x, y), body, (t,), (n,))
    mod = build(prog)
    with pytest.raises(ValueError, match="'t'.*too large"):
        mod(np.ones(2**20, np.float32), np.ones(2**20, np.float32))
    with pytest.raises(MemoryError, match="'t'"):
        mod(np.ones(2**13, np.float32), np.ones(2**13, np.float32))  # 2^52 * 4 bytes: np.empty refuses
