"""The error tree (loopir.errors): one root, each class also its old built-in, and real failures land in it.

Representative failures are raised by the real code paths (a stale loop handle, a bad split
factor, a refusal of each code generator, an illegal schedule step, a failed NVRTC compile) and
caught twice: as `LoopirError` and as the built-in exception the same failure raised before the
tree existed, so `except ValueError` around a call keeps working.
"""

from __future__ import annotations

import islpy as isl
import numpy as np
import pytest

import codegen.cuda.expr
import codegen.cuda.runtime
import codegen.llvm.types
import codegen.cuda.nvrtc
import loopir
import schedules
from codegen import build
from codegen.build import UNROLL_LIMIT
from codegen.cuda.build import build_cuda
from codegen.cuda.nvrtc import normalize_arch
from codegen.passes import pipeline
from codegen.llvm import generate
from loopir import errors as E
from loopir import nodes as N
from loopir import interp, poly, te
from loopir.footprint import footprint
from loopir.isl_conv import pw_to_expr
from loopir.lower import lower
from loopir.visit import walk
from loopir import workloads as W
from schedules import Schedule
from schedules.errors import InexactCheckError, ScheduleError
from schedules.recipes import schedule_gemm

# (class, the built-ins it must also be): the whole tree, wherever each class is defined
TREE = [
    (E.ArgumentError, (ValueError,)),
    (E.ArgumentTypeError, (E.ArgumentError, ValueError, TypeError)),
    (E.NotFoundError, (LookupError, ValueError)),
    (E.NotNestedError, (ValueError,)),
    (E.CodegenError, (ValueError,)),
    (E.ResourceLimitError, (E.CodegenError, ValueError)),
    (E.IslConversionError, (ValueError,)),
    (E.RuntimeLaunchError, (RuntimeError,)),
    (ScheduleError, ()),
    (InexactCheckError, (ValueError,)),
    (poly.PrivateScopeError, (ValueError,)),
    (codegen.llvm.types.CodegenError, (E.CodegenError, ValueError)),
    (codegen.cuda.expr.CudaCodegenError, (E.CodegenError, ValueError)),
    (codegen.cuda.expr.UnboundLoopError, (E.CodegenError, ValueError)),
    (codegen.cuda.nvrtc.NvrtcError, (E.RuntimeLaunchError, RuntimeError)),
    (codegen.cuda.runtime.CudaError, (E.RuntimeLaunchError, RuntimeError)),
    (codegen.cuda.runtime.NoGpuError, (E.RuntimeLaunchError, RuntimeError)),
]


@pytest.mark.parametrize("cls, parents", TREE, ids=[c.__qualname__ for c, _ in TREE])
def test_hierarchy(cls, parents):
    assert issubclass(cls, E.LoopirError) and issubclass(E.LoopirError, Exception)
    for p in parents:
        assert issubclass(cls, p), f"{cls.__name__} is not a {p.__name__}"


def test_schedule_error_is_not_a_value_error():
    # a refusal is not a bad argument: code probing arguments with `except ValueError` must not swallow it
    assert not issubclass(ScheduleError, ValueError)


def test_exported_from_loopir_and_schedules():
    for name in E.__all__:
        assert getattr(loopir, name) is getattr(E, name)
    for name in ("LoopirError", "ArgumentError", "ArgumentTypeError", "NotFoundError", "NotNestedError"):
        assert getattr(schedules, name) is getattr(E, name)
    assert schedules.ScheduleError is ScheduleError and schedules.InexactCheckError is InexactCheckError


def test_messages_are_kept_verbatim():
    msg = "line one\n  line two: 'quoted'"
    for cls in (E.ArgumentError, E.NotFoundError, E.CodegenError, E.RuntimeLaunchError):
        assert str(cls(msg)) == msg  # NotFoundError is no KeyError: its message is not repr()-quoted


# ----------------------------------------------------------------------------- real failures


def _caught_both(fn, builtin: type[BaseException]) -> BaseException:
    """Run the failing call twice: it must be caught as LoopirError, and as `builtin`."""
    with pytest.raises(E.LoopirError):
        fn()
    with pytest.raises(builtin) as info:
        fn()
    return info.value


def _elementwise():
    n = te.var("n")
    x = te.placeholder((n,), dtype="float32", name="x")
    return te.compute((n,), lambda i: x[i] + 1.0, name="y")


def _stencil():
    from loopir import ir

    n = te.var("n")
    A = ir.buffer((n, n), dtype="float32", name="A")
    b = ir.Builder("stencil")
    with b.loop("i", 1, n) as i, b.loop("j", 0, n - 1) as j:
        b.store(A, (i, j), A[i - 1, j + 1] + A[i, j], name="S")
    return b.finish([A])


def test_stale_loop_handle():
    y = _elementwise()
    s = Schedule(y)
    (i,) = s.loops(y)
    s.split(i, 4)  # replaces i: the handle is stale now
    err = _caught_both(lambda: s.split(i, 4), ValueError)
    assert isinstance(err, E.NotFoundError) and isinstance(err, LookupError)


def test_stale_loop_handle_is_still_a_value_error():
    y = _elementwise()
    s = Schedule(y)
    (i,) = s.loops(y)
    s.split(i, 4)
    with pytest.raises(ValueError, match="no longer exists"):
        s.split(i, 4)


def test_bad_split_factor():
    y = _elementwise()
    s = Schedule(y)
    (i,) = s.loops(y)
    err = _caught_both(lambda: s.split(i, 0), ValueError)
    assert isinstance(err, E.ArgumentError) and not isinstance(err, E.NotFoundError)


def test_bad_split_factor_is_still_a_value_error():
    y = _elementwise()
    s = Schedule(y)
    (i,) = s.loops(y)
    with pytest.raises(ValueError, match="factor"):
        s.split(i, 0)


def test_not_found_apart_from_bad_factor():
    # a user catches "handle not found" apart from "bad factor": each except clause gets only its own failure
    y = _elementwise()
    s = Schedule(y)
    (i,) = s.loops(y)
    got = []
    for step in (lambda: s.split(i, 0), lambda: s.split(i, 4), lambda: s.split(i, 4)):
        try:
            step()
            got.append("ok")
        except E.NotFoundError:
            got.append("not found")
        except E.ArgumentError:
            got.append("bad argument")
    assert got == ["bad argument", "ok", "not found"]


def test_bad_factor_type_is_a_type_error():
    y = _elementwise()
    s = Schedule(y)
    (i,) = s.loops(y)
    err = _caught_both(lambda: s.split(i, 2.5), TypeError)
    assert isinstance(err, E.ArgumentTypeError) and isinstance(err, E.ArgumentError)


def test_unknown_names_are_not_found():
    y = _elementwise()
    s = Schedule(y)
    for call in (lambda: s.loops("nope"), lambda: s.loop("nope"), lambda: s.apply("no_such_primitive")):
        _caught_both(call, E.NotFoundError)


def test_not_nested():
    s = Schedule(_two_nests())
    (i,), (j,) = s.loops("S"), s.loops("T")
    err = _caught_both(lambda: s.reorder(i, j), ValueError)
    assert isinstance(err, E.NotNestedError) and "nested" in str(err)


def _two_nests():
    from loopir import ir

    n = te.var("n")
    A = ir.buffer((n,), dtype="float32", name="A")
    B = ir.buffer((n,), dtype="float32", name="B")
    b = ir.Builder("two")
    with b.loop("i", 0, n) as i:
        b.store(A, (i,), A[i] + 1.0, name="S")
    with b.loop("j", 0, n) as j:
        b.store(B, (j,), B[j] + 1.0, name="T")
    return b.finish([A, B])


def test_schedule_error():
    s = Schedule(_stencil())
    i, j = s.loops("S")
    err = _caught_both(lambda: s.reorder(j, i), ScheduleError)
    assert err.kind in ("flow", "anti", "output") and err.buffer == "A"


def test_llvm_codegen_refusal():
    x = N.Buffer("x", (N.const(4),), "float32")
    i = N.Var("i")
    body = N.For(i, N.const(0), N.const(4), N.Store("S", x, (i,), N.const(1.0, "float32"), (i,), (i,)))
    prog = N.Program("twice", (x, x), body)  # one buffer listed twice among the arguments
    err = _caught_both(lambda: generate(prog, "twice"), ValueError)
    assert isinstance(err, E.CodegenError) and "twice" in str(err)


def test_cuda_codegen_refusal():
    p = W.sincos().program()  # no loop bound to a GPU axis
    err = _caught_both(lambda: build_cuda(p), ValueError)
    assert isinstance(err, E.CodegenError) and "bind" in str(err)


def test_nvrtc_refusal(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOPIR_CACHE_DIR", str(tmp_path))
    bad = 'extern "C" __global__ void k(float* y) { y[0] = +* ; }\n'
    err = _caught_both(lambda: codegen.cuda.nvrtc.compile_cubin(bad, "sm_90", use_cache=False, name="bad.cu"),
                       RuntimeError)
    assert isinstance(err, E.RuntimeLaunchError)


# ----------------------------------------------------------------------------- converted raises, by class
# each site raised a bare ValueError / TypeError before the tree: now its class, still caught as the built-in


def _np_args(n: int):
    rng = np.random.default_rng(7)
    return rng.standard_normal(n).astype(np.float32), np.full(n, np.nan, np.float32)


@pytest.mark.parametrize("call, cls, builtin", [
    (lambda: te.placeholder((4,), dtype="float32", name="1x"), E.ArgumentError, ValueError),
    (lambda: te.placeholder((4,), dtype="complex64", name="x"), E.ArgumentTypeError, TypeError),
    (lambda: te.reduce_axis((3, 1), name="k"), E.ArgumentError, ValueError),
    (lambda: lower([]), E.ArgumentError, ValueError),
    (lambda: N.as_index(1.5, "a split factor"), E.ArgumentTypeError, TypeError),
    (lambda: N.call("no_such_fn", N.const(1.0)), E.ArgumentError, ValueError),
    (lambda: pipeline("tpu"), E.ArgumentError, ValueError),
    (lambda: normalize_arch("compute_90"), E.ArgumentError, ValueError),
    (lambda: schedule_gemm(Schedule(W.matmul_bias_relu(8, 8, 8).program()), target="tpu"), E.ArgumentError,
     ValueError),
], ids=["te-name", "dtype", "reduce-axis", "lower-no-outputs", "as-index", "math-fn", "pipeline", "arch",
        "gemm-target"])
def test_converted_argument_errors(call, cls, builtin):
    err = _caught_both(call, builtin)
    assert type(err) is cls


def test_store_name_twice_is_an_argument_error():
    from loopir import ir

    A = ir.buffer((4,), dtype="float32", name="A")
    b = ir.Builder("p")
    with b.loop("i", 0, 4) as i:
        b.store(A, (i,), A[i] + 1.0, name="S")
        err = _caught_both(lambda: b.store(A, (i,), A[i] * 2.0, name="S"), ValueError)
    assert type(err) is E.ArgumentError and "'S'" in str(err)


def test_interp_arguments():
    p = W.sincos(16).program()
    x, y = _np_args(16)
    err = _caught_both(lambda: interp.run(p, x), TypeError)  # one argument short
    assert type(err) is E.ArgumentTypeError
    err = _caught_both(lambda: interp.run(p, x, y, sizes={"nope": 3}), ValueError)
    assert type(err) is E.NotFoundError and "'nope'" in str(err)
    err = _caught_both(lambda: interp.run(p, x, y, gpu_order="sideways"), ValueError)
    assert type(err) is E.ArgumentError and "sideways" in str(err)


def test_footprint_lookups():
    p = _stencil()
    (i,) = [f.var for f in walk(p.body) if isinstance(f, N.For) and f.var.name == "i"]
    err = _caught_both(lambda: footprint(p, "nope", "A", i), LookupError)
    assert type(err) is E.NotFoundError
    err = _caught_both(lambda: footprint(p, "S", "A", N.Var("k")), ValueError)
    assert type(err) is E.NotNestedError


def test_isl_conversion_error():
    err = _caught_both(lambda: pw_to_expr(isl.PwAff("[n] -> { [(n)] : n < 0 and n > 0 }"), {}, "bound"), ValueError)
    assert type(err) is E.IslConversionError and "empty" in str(err)


def test_resource_limits():
    s = Schedule(W.matmul_bias_relu(64, 64, 64).program())
    err = _caught_both(lambda: schedule_gemm(s, target="cuda", block=(64, 128), thread_tile=(2, 2), k_tile=8),
                       ValueError)
    assert type(err) is E.ResourceLimitError and "1024 threads" in str(err)
    from loopir import ir

    A = ir.buffer((UNROLL_LIMIT + 1,), dtype="float32", name="A")
    b = ir.Builder("long")
    with b.loop("i", 0, UNROLL_LIMIT + 1, kind="unroll") as i:  # the schedule refuses this; a program may say it
        b.store(A, (i,), A[i] + 1.0, name="S")
    p = b.finish([A])
    err = _caught_both(lambda: build(p, [A], target="cpu"), ValueError)
    assert isinstance(err, E.ResourceLimitError) and "unrolled" in str(err)
