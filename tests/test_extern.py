"""Escape hatches (issue 20, item 5): te.call_extern and te.register_intrinsic (loopir/te_extern.py) on the CPU,
the interpreter and CUDA (NVRTC here, numerics on a GPU), their typed refusals, their purity for the checker;
and the primitive `pragma` (an unroll count, honoured by both renderers)."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest

from codegen import build
from codegen.cuda.nvrtc import NvrtcError
from loopir import interp, te
from loopir.errors import ArgumentError, ArgumentTypeError, CodegenError, CudaCodegenError
from loopir.lower import lower
from loopir.nodes import For, Program
from loopir.te_extern import Intrinsic
from loopir.visit import walk
from schedules import Schedule, auto_schedule
from tests.witness_check import verify_witness

N = 53

# 2 x + y on every target: CUDA source, LLVM IR, a Python function
AXPB_CUDA = "__device__ float loopir_t_axpb(float x, float y) { return 2.0f * x + y; }\n"
AXPB_IR = ("define float @loopir_t_axpb(float %x, float %y) {\n  %m = fmul float %x, 2.0\n"
           "  %r = fadd float %m, %y\n  ret float %r\n}\n")


def _axpb() -> Intrinsic:
    return te.register_intrinsic("loopir_t_axpb", "float32", ("float32", "float32"), cuda="loopir_t_axpb",
                                 cuda_source=AXPB_CUDA, cpu="loopir_t_axpb", cpu_ir=AXPB_IR,
                                 interp=lambda x, y: 2 * x + y)


def _rand(seed: int, n: int = N) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-3, 3, n).astype(np.float32)


def _nan(n: int = N) -> np.ndarray:
    return np.full(n, np.nan, np.float32)


def _axpb_stage() -> tuple[te.Tensor, te.Tensor, te.Tensor]:
    f = _axpb()
    x = te.placeholder((N,), "float32", name="x")
    z = te.placeholder((N,), "float32", name="z")
    y = te.compute((N,), lambda i: f(x[i], z[i] * 0.5) + 1.0, name="y")
    return x, z, y


# ----------------------------------------------------------------------------- call_extern / register_intrinsic


def test_registered_intrinsic_printed_cpu_and_interpreter():
    x, z, y = _axpb_stage()
    assert "y[i] = loopir_t_axpb(x[i], z[i] * 0.5) + 1.0  # y" in str(lower([y]))
    xa, za = _rand(1), _rand(2)
    want = 2 * xa.astype(np.float64) + za * 0.5 + 1.0
    out = _nan()
    build(y, [x, z, y], target="cpu")(xa, za, out)
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)
    out = _nan()
    interp.run(lower([y]), xa, za, out)
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)


def test_registered_intrinsic_cuda_source_and_adversarial_interpreter():
    x, z, y = _axpb_stage()
    src = build(y, [x, z, y], target="cuda").source  # NVRTC compiles the device function with the kernel
    assert src.count(AXPB_CUDA.strip()) == 1 and "loopir_t_axpb(" in src.split(AXPB_CUDA.strip())[1]
    xa, za = _rand(3), _rand(4)
    out = _nan()
    interp.run(auto_schedule([y], target="cuda").program, xa, za, out, gpu_order="reversed")
    np.testing.assert_allclose(out, 2 * xa.astype(np.float64) + za * 0.5 + 1.0, rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
def test_registered_intrinsic_cuda_numerics():
    x, z, y = _axpb_stage()
    xa, za = _rand(5), _rand(6)
    out = _nan()
    build(y, [x, z, y], target="cuda")(xa, za, out)
    np.testing.assert_allclose(out, 2 * xa.astype(np.float64) + za * 0.5 + 1.0, rtol=1e-6, atol=1e-6)


def test_call_extern_of_a_process_symbol_cpu_and_builtin_cuda():
    # cbrtf: libm's on the CPU (already in the process), CUDA's builtin on the GPU; no registration needed
    x = te.placeholder((N,), "float32", name="x")
    y = te.compute((N,), lambda i: te.call_extern("float32", "cbrtf", x[i] * 2), name="y")
    xa, out = _rand(7), _nan()
    build(y, [x, y], target="cpu")(xa, out)
    np.testing.assert_allclose(out, np.cbrt(2 * xa.astype(np.float64)), rtol=1e-6)
    assert "cbrtf(" in build(y, [x, y], target="cuda").source


def test_call_extern_with_extern_source_option():
    x = te.placeholder((N,), "float64", name="x")
    y = te.compute((N,), lambda i: te.call_extern("float64", "loopir_t_sq", x[i], 3), name="y")
    src = "__device__ double loopir_t_sq(double x, long long k) { return x * x + (double)k; }"
    mod = build(y, [x, y], target="cuda", extern_source=src)
    assert mod.source.startswith(src)
    with pytest.raises(NvrtcError, match="loopir_t_sq"):  # undefined without its source: NVRTC names it
        build(y, [x, y], target="cuda", cache=False)


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler to make a shared library")
def test_cpu_library_symbol(tmp_path):
    c = tmp_path / "lib.c"
    c.write_text("double loopir_t_cube(double x, long long k) { return x * x * x + (double)k; }\n")
    so = tmp_path / "libloopir_t.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", str(so), str(c)], check=True)
    f = te.register_intrinsic("loopir_t_cube", "float64", ("float64", "int64"), cpu="loopir_t_cube",
                              cpu_library=str(so), interp=lambda x, k: x ** 3 + k)
    x = te.placeholder((N,), "float64", name="x")
    y = te.compute((N,), lambda i: f(x[i], 2), name="y")
    xa = _rand(8).astype(np.float64)
    out = np.full(N, np.nan)
    mod = build(y, [x, y], target="cpu")
    assert f"loopir extern library: {so}" in mod.source
    mod(xa, out)
    np.testing.assert_allclose(out, xa ** 3 + 2, rtol=1e-12)
    with pytest.raises(CudaCodegenError, match="'loopir_t_cube' has no CUDA lowering"):
        build(y, [x, y], target="cuda")
    # the declaration is taken when the call is made: a later registration changes new calls only
    te.register_intrinsic("loopir_t_cube", "float64", ("float64", "int64"), replace=True)  # no CPU lowering
    g = te.compute((N,), lambda i: f(x[i], 1), name="g")
    with pytest.raises(CodegenError, match="'loopir_t_cube' has no CPU lowering"):
        build(g, [x, g], target="cpu", cache=False)
    # an unregistered symbol of another library, named by the build option
    c2 = tmp_path / "lib2.c"
    c2.write_text("float loopir_t_half(float x) { return 0.5f * x; }\n")
    so2 = tmp_path / "libloopir_t2.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", str(so2), str(c2)], check=True)
    x32 = te.placeholder((N,), "float32", name="x32")
    h = te.compute((N,), lambda i: te.call_extern("float32", "loopir_t_half", x32[i]), name="h")
    with pytest.raises(CodegenError, match="'loopir_t_half' is not found"):
        build(h, [x32, h], target="cpu", cache=False)
    out32, x32a = _nan(), _rand(12)
    build(h, [x32, h], target="cpu", extern_libs=(str(so2),))(x32a, out32)
    np.testing.assert_array_equal(out32, 0.5 * x32a)


def test_extern_is_pure_for_the_checker_and_refusals_keep_their_witness():
    f = _axpb()
    x = te.placeholder((N,), "float32", name="x")
    a = te.compute((N,), lambda i: f(x[i], 1.0), name="a")
    b = te.compute((N - 2,), lambda i: a[i] + f(a[i + 2], x[i]), name="b")
    s = Schedule(b)
    # computing `a` inside b's loop recomputes the extern call: legal for a pure function
    (i,) = s.loops(b)
    s.compute_at(a, i)
    xa, out = _rand(9), _nan(N - 2)
    build(s, [x, b], target="cpu")(xa, out)
    av = 2 * xa.astype(np.float64) + 1
    np.testing.assert_allclose(out, av[:-2] + 2 * av[2:] + xa[:-2], rtol=1e-5)
    # an in-place recurrence through the extern: a parallel loop is refused with a real witness
    from loopir import ir

    A = ir.buffer((N,), dtype="float32", name="A")
    bld = ir.Builder("rec")
    with bld.loop("i", 1, N) as i2:
        bld.store(A, (i2,), f(A[i2 - 1], A[i2]), name="S")
    s2 = Schedule(bld.finish([A]))
    (li,) = s2.loops("S")
    before = s2.program
    with pytest.raises(Exception) as info:
        s2.parallel(li)
    from schedules import ScheduleError

    assert isinstance(info.value, ScheduleError)
    verify_witness(s2.original, _parallel(before, li), info.value)


def _parallel(p, loop):  # noqa: ANN001, ANN202
    from schedules.primitives import REGISTRY

    return REGISTRY["parallel"].fn(p, loop.var)


def test_bad_extern_uses_are_typed():
    f = _axpb()
    x = te.placeholder((N,), "float32", name="x")
    h = te.placeholder((N,), "float16", name="h")
    d = te.placeholder((N,), "float64", name="d")
    with pytest.raises(ArgumentError, match="takes 2 argument"):
        f(x[0])
    with pytest.raises(ArgumentTypeError, match="argument 1 of 'loopir_t_axpb' has dtype float64, declared float32"):
        f(x[0], d[0])
    with pytest.raises(ArgumentTypeError, match="registered returning float32"):
        te.call_extern("float64", "loopir_t_axpb", x[0], x[1])
    with pytest.raises(ArgumentTypeError, match="float16"):
        te.call_extern("float32", "anything", h[0])
    with pytest.raises(ArgumentTypeError, match="the tensor 'x'"):
        te.call_extern("float32", "anything", x)
    with pytest.raises(ArgumentError, match="te's own math function"):
        te.call_extern("float32", "exp", x[0])
    with pytest.raises(ArgumentError, match="te's own math function"):
        te.register_intrinsic("fast_exp", cuda="__expf")
    with pytest.raises(ArgumentError, match="C identifier"):
        te.call_extern("float32", "not a name", x[0])
    with pytest.raises(ArgumentTypeError, match="bfloat16"):
        te.register_intrinsic("loopir_t_bf", "bfloat16", ("float32",))
    with pytest.raises(ArgumentError, match="already registered with another definition"):
        te.register_intrinsic("loopir_t_axpb", "float32", ("float32",), cuda="loopir_t_axpb")
    with pytest.raises(ArgumentError, match="does not define @nope"):
        te.register_intrinsic("loopir_t_ir", cpu="nope", cpu_ir="define float @other(float %x) { ret float %x }")
    with pytest.raises(ArgumentTypeError, match="interp= of 'loopir_t_i' must be callable"):
        te.register_intrinsic("loopir_t_i", interp=3)
    assert _axpb().decl == f.decl  # the same definition again is accepted


def test_unknown_symbol_and_missing_lowerings_are_typed():
    x = te.placeholder((N,), "float32", name="x")
    y = te.compute((N,), lambda i: te.call_extern("float32", "loopir_no_such_symbol", x[i]), name="y")
    with pytest.raises(CodegenError, match="'loopir_no_such_symbol' is not found in this process"):
        build(y, [x, y], target="cpu", cache=False)
    with pytest.raises(ArgumentError, match="interpreter cannot call the external function 'loopir_no_such_symbol'"):
        interp.run(lower([y]), _rand(1), _nan())
    g = te.register_intrinsic("loopir_t_cpu_only", "float32", ("float32",), cpu="expf")
    y2 = te.compute((N,), lambda i: g(x[i]), name="y2")
    with pytest.raises(CudaCodegenError, match="no CUDA lowering"):
        build(y2, [x, y2], target="cuda", cache=False)
    with pytest.raises(CodegenError, match="cannot load the shared library"):
        te.register_intrinsic("loopir_t_badlib", "float32", ("float32",), cpu="loopir_t_badlib",
                              cpu_library="/nonexistent/libnothing.so")
        y3 = te.compute((N,), lambda i: te.call_extern("float32", "loopir_t_badlib", x[i]), name="y3")
        build(y3, [x, y3], target="cpu", cache=False)
    with pytest.raises(ArgumentTypeError, match="extern_libs must be a tuple"):
        build(y2, [x, y2], target="cpu", extern_libs="libm.so.6")
    with pytest.raises(ArgumentTypeError, match="extern_source must be CUDA C text"):
        build(y2, [x, y2], target="cuda", extern_source=3)


# ----------------------------------------------------------------------------- pragma


def _row_sum() -> tuple[te.Tensor, te.Tensor]:
    x = te.placeholder((9, 64), "float32", name="x")
    k = te.reduce_axis(64, "k")
    return x, te.compute((9,), lambda i: te.sum(x[i, k], axis=k), name="y")


def test_pragma_unroll_printed_and_rendered_on_both_targets():
    x, y = _row_sum()
    s = Schedule(y)
    i, k = s.loops(y)
    s.pragma(k, "unroll", 4)
    assert "for k in range(0, 64):  # pragma unroll 4" in str(s)
    cpu = build(s, [x, y], target="cpu")
    assert re.search(r'!"llvm\.loop\.unroll\.count", i32 4', cpu.source)
    xa = np.random.default_rng(10).standard_normal((9, 64)).astype(np.float32)
    out = _nan(9)
    cpu(xa, out)
    np.testing.assert_allclose(out, xa.astype(np.float64).sum(1), rtol=1e-5, atol=1e-5)
    s.pragma(k, "unroll", 1)  # replaces the count: keep the loop rolled
    assert "# pragma unroll 1" in str(s) and "unroll 4" not in str(s)
    assert '!"llvm.loop.unroll.disable"' in build(s, [x, y], target="cpu").source

    g = Schedule(y)
    i, k = g.loops(y)
    g.bind(i, "threadIdx.x").pragma(k, "unroll", 8)
    cu = build(g, [x, y], target="cuda")
    assert "#pragma unroll 8\n" in cu.source
    out = _nan(9)
    interp.run(g.program, xa, out, gpu_order="reversed")
    np.testing.assert_allclose(out, xa.astype(np.float64).sum(1), rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_pragma_unroll_cuda_numerics():
    x, y = _row_sum()
    g = Schedule(y)
    i, k = g.loops(y)
    g.bind(i, "threadIdx.x").pragma(k, "unroll", 8)
    xa = np.random.default_rng(11).standard_normal((9, 64)).astype(np.float32)
    out = _nan(9)
    build(g, [x, y], target="cuda")(xa, out)
    np.testing.assert_allclose(out, xa.astype(np.float64).sum(1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("step", ["reorder", "tile", "split", "split j", "collapse", "compute_at", "trace replay"])
def test_a_pragma_stays_on_its_loop_through_later_steps(step):
    # reorder and tile rebuild the nest: the pragma goes with its loop, not silently away
    n = 64
    a = te.placeholder((n, n), name="A")
    b = te.compute((n, n), lambda i, j: a[i, j] * 2.0, name="B")
    c = te.compute((n, n), lambda i, j: b[i, j] + 1.0, name="C")
    s = Schedule([c])
    i, j = s.loops(c)
    s.pragma(j, "unroll", 4)
    if step == "reorder":
        s.reorder(j, i)
    elif step == "tile":
        s.tile(i, j, 8, 16)
    elif step == "split":
        s.split(i, 8)
    elif step == "split j":
        s.split(j, 8)
    elif step == "collapse":
        s.collapse(i, j)
    elif step == "compute_at":
        s.compute_at(b, i)
    elif step == "trace replay":
        s.reorder(j, i)
        s = Schedule.replay(s.trace, [c])
    pragmas = {f.var.name: f.pragmas for f in walk(s.program.body) if isinstance(f, For) and f.pragmas}
    # split (also in tile) gives the pragma to the inner loop; collapse to the merged loop
    want = {"tile": "j_i", "split j": "j_i", "collapse": "i_j_f"}.get(step, "j")
    assert pragmas == {want: (("unroll", 4),)}, (step, pragmas)
    assert "# pragma unroll 4" in str(s)


def test_pragma_unroll_explicit_is_unroll():
    x, y = _row_sum()
    s = Schedule(y)
    i, k = s.loops(y)
    ko, ki = s.split(k, 8)
    s.pragma(ki, "unroll_explicit")
    assert "for k_i in unroll(0, 8):" in str(s)


def test_pragma_refusals_are_typed():
    x, y = _row_sum()
    s = Schedule(y)
    i, k = s.loops(y)
    with pytest.raises(ArgumentError, match=r"unknown pragma 'unrol'; known: 'unroll' .*'unroll_explicit'"):
        s.pragma(k, "unrol", 4)
    with pytest.raises(ArgumentTypeError, match="needs an integer count"):
        s.pragma(k, "unroll", 2.5)
    with pytest.raises(ArgumentTypeError, match="needs an integer count"):
        s.pragma(k, "unroll")
    with pytest.raises(ArgumentError, match="must be >= 1"):
        s.pragma(k, "unroll", 0)
    with pytest.raises(ArgumentError, match="takes no value"):
        s.pragma(k, "unroll_explicit", 3)
    s.parallel(i)
    with pytest.raises(ArgumentError, match="loop 'i' is parallel"):
        s.pragma(i, "unroll", 2)


# ----------------------------------------------------------------------------- te.extern (a whole stage)

MM_C = """#include <stdint.h>
void loopir_t_mm(const float* a, const float* b, float* c, int64_t n, int64_t m, int64_t k) {
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j < m; j++) {
      float s = 0.0f;
      for (int64_t p = 0; p < k; p++) s += a[i * k + p] * b[p * m + j];
      c[i * m + j] = s;
    }
}
"""


def _mm_interp(a: np.ndarray, b: np.ndarray, c: np.ndarray, n: int, m: int, k: int) -> None:
    np.matmul(a, b, out=c)


MM_CUDA = """__device__ void loopir_t_mm(const float* a, const float* b, float* c, long long n, long long m,
                            long long k) {
  for (long long e = blockIdx.x * blockDim.x + threadIdx.x; e < n * m; e += gridDim.x * blockDim.x) {
    long long i = e / m, j = e % m;
    float s = 0.0f;
    for (long long p = 0; p < k; p++) s += a[i * k + p] * b[p * m + j];
    c[e] = s;
  }
}
"""


def _gemm_chain(lib: str = "", cuda: str = "") -> tuple[te.Tensor, ...]:
    """A2 = 2 A (a te stage) -> C = A2 @ B (extern) -> D = C + 1 (a te stage); n symbolic."""
    n = te.var("n")
    m, k = 6, 5
    A = te.placeholder((n, k), "float32", name="A")
    B = te.placeholder((k, m), "float32", name="B")
    A2 = te.compute((n, k), lambda i, j: A[i, j] * 2, name="A2")
    C = te.extern((n, m), [A2, B], lambda ins, outs: te.call_extern("void", "loopir_t_mm", ins[0], ins[1], outs[0],
                                                                    n, m, k),
                  name="C", cpu_library=lib, interp=_mm_interp, cuda_source=cuda, cuda_launch=(2, 64))
    D = te.compute((n, m), lambda i, j: C[i, j] + 1, name="D")
    return A, B, A2, C, D


def _mm_lib(tmp_path) -> str:  # noqa: ANN001
    c = tmp_path / "mm.c"
    c.write_text(MM_C)
    so = tmp_path / "libloopir_t_mm.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", str(so), str(c)], check=True)
    return str(so)


def _gemm_want(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (2 * a.astype(np.float64)) @ b + 1


def test_extern_stage_printed_model_and_interpreter():
    A, B, A2, C, D = _gemm_chain()
    text = str(lower([D]))
    assert "C[o0, o1] = 0.0  # C_init" in text
    assert "C[o0, o1] = C[o0, o1] + loopir_t_mm(A2[A2_0, A2_1], B[B_0, B_1], C[o0, o1], n, 6, 5)  # C" in text
    rng = np.random.default_rng(20)
    a, b = rng.standard_normal((7, 5)).astype(np.float32), rng.standard_normal((5, 6)).astype(np.float32)
    out = np.full((7, 6), np.nan, np.float32)
    interp.run(lower([D]), a, b, out)
    np.testing.assert_allclose(out, _gemm_want(a, b), rtol=1e-5, atol=1e-5)
    with pytest.raises(CudaCodegenError, match="te.extern stage 'C', which auto_schedule does not schedule"):
        build(D, [A, B, D], target="cuda")
    s = Schedule(D)  # by hand: the stages around the extern stage bound, its own launch as asked
    s.bind(s.loops(D)[0], "blockIdx.x").bind(s.loops(D)[1], "threadIdx.x")
    s.bind(s.loops(A2)[0], "blockIdx.x").bind(s.loops(A2)[1], "threadIdx.x")
    with pytest.raises(CudaCodegenError, match="'loopir_t_mm' has no CUDA source"):
        build(s, [A, B, D], target="cuda", cache=False)


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler to make a shared library")
def test_extern_stage_cpu_hand_and_default_schedules(tmp_path):
    A, B, A2, C, D = _gemm_chain(_mm_lib(tmp_path))
    s = Schedule(D)
    i, j = s.loops(D)
    s.parallel(i)  # the stages around the extern stage schedule as usual
    i2, j2 = s.loops(A2)
    s.parallel(i2).vectorize(j2)
    rng = np.random.default_rng(21)
    for rows in (7, 33):
        a, b = rng.standard_normal((rows, 5)).astype(np.float32), rng.standard_normal((5, 6)).astype(np.float32)
        for mod in (build(s, [A, B, D], target="cpu"), build(D, [A, B, D], target="cpu")):
            out = np.full((rows, 6), np.nan, np.float32)
            mod(a, b, out)
            np.testing.assert_allclose(out, _gemm_want(a, b), rtol=1e-5, atol=1e-5)
    src = build(s, [A, B, D], target="cpu").source
    assert re.search(r"call void @loopir_t_mm\(ptr %\w+, ptr %\w+, ptr %\w+, i64 %\w+, i64 6, i64 5\)", src)
    assert src.count("call void @loopir_t_mm(") == 1  # one call for the whole stage, no loop around it


def _cuda_gemm_schedule() -> tuple[Schedule, tuple[te.Tensor, ...]]:
    A, B, A2, C, D = _gemm_chain(cuda=MM_CUDA)
    s = Schedule(D)
    s.bind(s.loops(D)[0], "blockIdx.x").bind(s.loops(D)[1], "threadIdx.x")
    s.bind(s.loops(A2)[0], "blockIdx.x").bind(s.loops(A2)[1], "threadIdx.x")
    return s, (A, B, D)


def test_extern_stage_cuda_source_and_adversarial_interpreter():
    s, args = _cuda_gemm_schedule()
    src = build(s, list(args), target="cuda").source  # NVRTC compiles the __device__ function with the kernels
    assert src.count("__device__ void loopir_t_mm(") == 1
    assert re.search(r"// statements: C_init, C; grid \(2, 1, 1\), block \(64, 1, 1\)\n"
                     r"  loopir_t_mm\(A2, B, C, \(long long\)\(n\), \(long long\)\(6LL\), \(long long\)\(5LL\)\);", src)
    rng = np.random.default_rng(22)
    a, b = rng.standard_normal((9, 5)).astype(np.float32), rng.standard_normal((5, 6)).astype(np.float32)
    out = np.full((9, 6), np.nan, np.float32)
    interp.run(s.program, a, b, out, gpu_order="reversed")
    np.testing.assert_allclose(out, _gemm_want(a, b), rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_extern_stage_cuda_numerics():
    s, args = _cuda_gemm_schedule()
    mod = build(s, list(args), target="cuda")
    rng = np.random.default_rng(23)
    for rows in (9, 300):
        a, b = rng.standard_normal((rows, 5)).astype(np.float32), rng.standard_normal((5, 6)).astype(np.float32)
        out = np.full((rows, 6), np.nan, np.float32)
        mod(a, b, out)
        np.testing.assert_allclose(out, _gemm_want(a, b), rtol=1e-5, atol=1e-5)


def test_extern_stage_is_opaque_and_the_checker_sees_its_accesses():
    A, B, A2, C, D = _gemm_chain()
    s = Schedule(D)
    o0, o1, k0 = s.loops(C)[:3]
    for step, args in (("parallel", (o0,)), ("split", (o1, 2)), ("reorder", (o1, o0)), ("unroll", (k0,)),
                       ("pragma", (k0, "unroll", 2)), ("compute_inline", (A2,)),
                       ("compute_at", (C, s.loops(D)[0])), ("compute_at", (A2, o0))):
        with pytest.raises(ArgumentError, match="te.extern stage 'C'.*opaque"):
            s.apply(step, *args)
    # fusing A2's rows with D's rows would run D[i] before the extern stage wrote C (it reads all of A2):
    # refused by the dependences, with a witness through the model statement
    before = s.program
    la, lb = s.loops(A2)[0], s.loops(D)[0]
    from schedules import ScheduleError
    from schedules.primitives import REGISTRY

    with pytest.raises(ScheduleError) as info:
        s.fuse(la, lb)
    assert s.program is before
    out = REGISTRY["fuse"].fn(before, la.var, lb.var)
    verify_witness(s.original, out if isinstance(out, Program) else out[0], info.value)


def test_bad_extern_stages_are_typed():
    n = te.var("n")
    A = te.placeholder((n,), "float32", name="A")
    Z = te.placeholder((n,), "float32", name="Z")
    ok = (lambda ins, outs: te.call_extern("void", "f", ins[0], outs[0], n))  # noqa: E731
    with pytest.raises(ArgumentTypeError, match="fcompute must return te.call_extern"):
        te.extern((n,), [A], lambda ins, outs: ins[0][0] + 1, name="E1")
    with pytest.raises(ArgumentError, match="does not pass the output"):
        te.extern((n,), [A], lambda ins, outs: te.call_extern("void", "f", ins[0], n), name="E2")
    with pytest.raises(ArgumentError, match="the tensor 'Z', which is not among the inputs"):
        te.extern((n,), [A], lambda ins, outs: te.call_extern("void", "f", ins[0], Z, outs[0]), name="E3")
    with pytest.raises(ArgumentTypeError, match="argument 2 .* is float"):
        te.extern((n,), [A], lambda ins, outs: te.call_extern("void", "f", ins[0], outs[0], 0.5), name="E4")
    with pytest.raises(ArgumentTypeError, match="input 0 must be a tensor"):
        te.extern((n,), [3], ok, name="E5")
    with pytest.raises(ArgumentTypeError, match="dtype float16"):
        te.extern((n,), [A], ok, name="E6", dtype="float16")
    with pytest.raises(ArgumentError, match="at least one dimension"):
        te.extern((), [A], ok, name="E7")
    for bad in ((0, 32), (1, 2048), (1,), 4, (1.0, 32)):
        with pytest.raises(ArgumentError, match="cuda_launch must be"):
            te.extern((n,), [A], ok, name="E11", cuda_launch=bad)
    with pytest.raises(ArgumentTypeError, match="interp= of 'f' must be callable"):
        te.extern((n,), [A], ok, name="E8", interp="numpy")
    with pytest.raises(ArgumentTypeError):  # a whole stage's call is not an expression
        te.compute((n,), lambda i: te.call_extern("void", "f", A[i]) + 1, name="E9")
    E = te.extern((n,), [A], lambda ins, outs: te.call_extern("void", "loopir_t_nothing", ins[0], outs[0], n),
                  name="E10")
    with pytest.raises(CodegenError, match="'loopir_t_nothing' is not found"):
        build(Schedule(E), [A, E], target="cpu", cache=False)
    with pytest.raises(ArgumentError, match="interpreter cannot run the te.extern function 'loopir_t_nothing'"):
        interp.run(lower([E]), np.ones(3, np.float32), np.full(3, np.nan, np.float32))


def test_one_symbol_has_one_signature_and_numpy_scalars_count_as_numbers():
    f = _axpb()
    x = te.placeholder((N,), "float32", name="x")
    assert f(x[0], np.float32(1.5)).args[1] == te.const(1.5, "float32")
    d = te.placeholder((N,), "float64", name="d")
    y = te.compute((N,), lambda i: te.call_extern("float32", "cbrtf", x[i])
                   + te.cast("float32", te.call_extern("float64", "cbrtf", d[i])), name="y")
    with pytest.raises(CodegenError, match="'cbrtf' is called with two signatures"):
        build(y, [x, d, y], target="cpu", cache=False)
