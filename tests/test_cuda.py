"""CUDA target, CPU side (no GPU needed): CUDA C generation, NVRTC compilation, the disk cache,
clear errors. GPU numerics are in test_cuda_gpu.py."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from codegen.cuda import CudaCodegenError, UnboundLoopError, generate_cuda
from loopir.affine import eval_index
from codegen.passes import lower as lower_cuda
from codegen.cuda.build import build_cuda
from codegen.cuda.nvrtc import MAGIC, NvrtcError, cache_key, compile_cubin
from loopir import nodes as N
from loopir import workloads as W

from test_cuda_helpers import bind_elementwise, bind_rows, fuse_rows

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOPIR_CACHE_DIR", str(tmp_path / "cache"))


def _is_cubin(b: bytes) -> bool:
    return b[:4] == b"\x7fELF" and len(b) > 1000


def _sincos_bound(threads=256):
    """y = sin(x)^2 + cos(x)^2 written as ONE stage (the seed is a three-stage chain), split and bound."""
    from loopir import lower, te

    n = te.var("n")
    x = te.placeholder((n,), "float32", name="x")
    y = te.compute((n,), lambda i: te.sin(x[i]) ** 2 + te.cos(x[i]) ** 2, name="y")
    return bind_elementwise(lower.lower([y], name="sincos"), threads)


# ----------------------------------------------------------------------------- codegen + NVRTC


def test_sincos_split_bind_compiles():
    p = _sincos_bound()
    mod = build_cuda(p, arch="sm_90")
    assert mod.kernels == ["sincos_y"]
    src = mod.source
    assert 'extern "C" __global__ void sincos_y(' in src
    assert "const float* __restrict__ x" in src and "float* __restrict__ y" in src
    assert "(long long)blockIdx.x" in src and "(long long)threadIdx.x" in src
    assert "// y" in src and "sincosf(x[i], &sin_v, &cos_v);" in src
    assert "((sin_v * sin_v) + (cos_v * cos_v))" in src
    assert _is_cubin(mod.cubin)
    grid, block = mod.gen.kernels[0].launch.dims({p.params[0]: 1000})
    assert grid == (4, 1, 1) and block == (256, 1, 1)


@pytest.mark.parametrize("name", ["gelu", "horizontal", "softmax", "layernorm", "matmul_bias_relu", "attention",
                                  "stencil5"])
def test_seed_workloads_compile(name):
    wl = getattr(W, name)()
    p = wl.program()
    q = bind_rows(p) if name in ("softmax", "layernorm") else bind_elementwise(p)
    mod = build_cuda(q)
    assert len(mod.kernels) == len(q.body.body) if isinstance(q.body, N.Seq) else 1
    assert _is_cubin(mod.cubin)


def test_gelu_uses_accurate_tanh():
    mod = build_cuda(bind_elementwise(W.gelu().program()))
    assert "tanhf(" in mod.source and "__expf" not in mod.source


@pytest.mark.parametrize("wl", ["softmax", "layernorm"])
def test_row_reduction_is_cross_thread(wl):
    p = getattr(W, wl)().program()
    mod = build_cuda(fuse_rows(p))
    assert len(mod.kernels) == 1
    src = mod.source
    assert src.count("loopir_block_allreduce(") >= 3  # the helper + one per reduction
    assert "__shfl_down_sync" in src
    # later phases read the reduced value from the register every thread holds: the totals' temporaries are
    # never stored, not even by thread 0 (codegen.passes.forwarded), and no barrier orders them
    after = src.split("loopir_block_allreduce(", 2)[-1]  # the kernel from its first all-reduce on
    assert "if (threadIdx.x == 0)" not in src and "__syncthreads();\n" not in after
    assert "_total" in src.split("loopir_block_allreduce(", 3)[-1]
    block = mod.gen.kernels[0].launch.block
    assert eval_index(block[0], {}) % 32 == 0


def test_cross_thread_block_rounded_to_warps():
    p = W.softmax().program()
    q = bind_rows(p, threads=100)
    mod = build_cuda(q)
    assert eval_index(mod.gen.kernels[0].launch.block[0], {}) == 128
    assert "if (k_t < 100LL)" in mod.source


def test_float16_compiles_and_computes_in_float():
    p = bind_elementwise(W.gelu(dtype="float16").program())
    mod = build_cuda(p)
    assert "unsigned short* __restrict__ y" in mod.source
    assert "loopir_h2f(x[" in mod.source and "loopir_f2h(" in mod.source
    assert _is_cubin(mod.cubin)


def _vector_program(n_is_symbolic: bool):
    m = N.Var("m")
    n = N.Var("n") if n_is_symbolic else N.const(64)
    x = N.Buffer("x", (m, n), "float32")
    b = N.Buffer("b", (n,), "float32")
    y = N.Buffer("y", (m, n), "float32")
    i, j = N.Var("i"), N.Var("j")
    jo, jv = N.Var("j_o"), N.Var("j_v")
    st = N.Store("y", y, (i, j), N.call("exp", x[i, j]) + b[j] * 2.0, (i, j), (i, jo * 4 + jv))
    vec = N.For(jv, N.const(0), N.const(4), st, "vectorize")
    inner = N.For(jo, N.const(0), n // 4, vec, "thread", "threadIdx.x")
    body = N.For(i, N.const(0), m, inner, "thread", "blockIdx.x")
    params = (m, n) if n_is_symbolic else (m,)
    return N.Program("vec", (x, b, y), body, (), params)


@pytest.mark.parametrize("symbolic", [False, True])
def test_vectorize_by_4_emits_float4(symbolic):
    mod = build_cuda(_vector_program(symbolic))
    src = mod.source
    assert "reinterpret_cast<const float4*>(&x[" in src
    assert "reinterpret_cast<const float4*>(&b[" in src
    assert "reinterpret_cast<float4*>(&y[" in src
    if symbolic:
        assert "% 4 == 0" in src  # the row length is checked at run time, scalar fallback kept
    assert "#pragma unroll" in src
    assert _is_cubin(mod.cubin)


def test_vectorize_unaligned_falls_back_to_scalar():
    p = _vector_program(False)
    st = p.body.body.body.body
    # j = jo*4 + jv + 1: not 4-aligned -> scalar unrolled loop only
    st2 = N.Store(st.name, st.buffer, st.indices, st.value, st.iters, (st.coords[0], st.coords[1] + 1))
    body = N.For(p.body.var, p.body.lo, p.body.hi,
                 N.For(p.body.body.var, N.const(0), N.const(15),
                       N.For(st.iters[1] if False else p.body.body.body.var, N.const(0), N.const(4), st2, "vectorize"),
                       "thread", "threadIdx.x"), "thread", "blockIdx.x")
    import dataclasses

    mod = build_cuda(dataclasses.replace(p, body=body))
    assert "float4" not in mod.source.split("extern")[1]
    assert "#pragma unroll" in mod.source


def test_floor_division_and_modulo_semantics_in_source():
    n = N.Var("n")
    x = N.Buffer("x", (n,), "int64")
    y = N.Buffer("y", (n,), "int64")
    i = N.Var("i")
    st = N.Store("y", y, (i,), (x[i] // 3) + (x[i] % 5), (i,), (i,))
    p = bind_elementwise(N.Program("fm", (x, y), N.For(i, N.const(0), n, st), (), (n,)))
    mod = build_cuda(p)
    assert "loopir_floordiv(x[" in mod.source and "loopir_mod(x[" in mod.source


def test_scalar_statement_is_one_thread_kernel():
    x = N.Buffer("x", (), "float32")
    y = N.Buffer("y", (), "float32")
    st = N.Store("y", y, (), N.call("sqrt", x[()] if False else N.Load(x, ())) + 1.0, (), ())
    mod = build_cuda(N.Program("scalar", (x, y), st))
    assert mod.gen.kernels[0].launch.dims({}) == ((1, 1, 1), (1, 1, 1))


# ----------------------------------------------------------------------------- refusals


def test_unbound_nest_names_the_loop():
    p = W.sincos().program()
    with pytest.raises(UnboundLoopError) as e:
        build_cuda(p)
    msg = str(e.value)
    assert "'i'" in msg and "bind" in msg and "auto_schedule" in msg


def test_extent_varying_with_block_index_is_refused():
    # a non-affine extent has no maximum isl can find (an affine one is launched at its maximum: test_cuda_refusals)
    n = N.Var("n")
    x = N.Buffer("x", (n, n), "float32")
    i, j = N.Var("i"), N.Var("j")
    st = N.Store("tri", x, (i, j), N.const(1.0, "float32"), (i, j), (i, j))
    body = N.For(i, N.const(0), n, N.For(j, N.const(0), i * i + 1, st, "thread", "threadIdx.x"), "thread",
                 "blockIdx.x")
    with pytest.raises(CudaCodegenError) as e:
        build_cuda(N.Program("tri", (x,), body, (), (n,)))
    assert "'j'" in str(e.value) and "varies" in str(e.value)


def test_same_axis_nested_twice_is_refused():
    p = _sincos_bound()
    f = p.body
    import dataclasses

    bad = dataclasses.replace(p, body=dataclasses.replace(f, thread="threadIdx.x"))
    with pytest.raises(CudaCodegenError) as e:
        build_cuda(bad)
    assert "threadIdx.x" in str(e.value) and "'i_i'" in str(e.value)


def test_non_reduction_write_from_every_thread_is_refused():
    n = N.Var("n")
    x = N.Buffer("x", (n,), "float32")
    y = N.Buffer("y", (1,), "float32")
    k = N.Var("k")
    st = N.Store("last", y, (N.const(0),), x[k], (k,), (k,))
    body = N.For(k, N.const(0), n, st, "thread", "threadIdx.x")
    with pytest.raises(CudaCodegenError) as e:
        build_cuda(N.Program("last", (x, y), body, (), (n,)))
    assert "'last'" in str(e.value) and "not a reduction" in str(e.value)


def test_reduction_under_thread_dependent_condition_is_refused():
    p = bind_rows(W.softmax().program())
    f = p.body.body[0]
    import dataclasses

    ty, r = N.Var("ty"), N.Var("r")
    red = f.body.body[1]  # the threadIdx.x reduction loop
    # a thread-bound loop or guard around it is predicated (test_cuda_refusals); a serial loop whose trip
    # count depends on the thread index would make threads reach the all-reduce unequally often
    wrapped = N.For(ty, N.const(0), N.const(2), N.For(r, N.const(0), ty + 1, red), "thread", "threadIdx.y")
    nf = dataclasses.replace(f, body=N.Seq((f.body.body[0], wrapped)))
    with pytest.raises(CudaCodegenError) as e:
        build_cuda(dataclasses.replace(p, body=N.Seq((nf,))))
    assert "every thread" in str(e.value) and "'r'" in str(e.value) and "ty" in str(e.value)


# ----------------------------------------------------------------------------- NVRTC errors + cache


def test_nvrtc_error_shows_log_and_numbered_lines():
    src = "extern \"C\" __global__ void k(float* y) {\n  int a = 1;\n  y[0] = a +* ;\n  y[1] = 2;\n}\n"
    with pytest.raises(NvrtcError) as e:
        compile_cubin(src, "sm_90", use_cache=False, name="bad.cu")
    msg = str(e.value)
    assert "bad.cu(3): error" in msg  # NVRTC's log
    assert ">     3 |   y[0] = a +* ;" in msg  # the numbered offending line
    assert "      2 |   int a = 1;" in msg  # context
    assert e.value.log and e.value.source == src


def test_virtual_arch_is_refused():
    with pytest.raises(ValueError, match="compute_90"):
        compile_cubin("extern \"C\" __global__ void k() {}", "compute_90")


def test_cache_hit_and_key(tmp_path):
    src = generate_cuda(lower_cuda(_sincos_bound(), "cuda")).source
    t = time.perf_counter()
    a = compile_cubin(src, "sm_90")
    cold = time.perf_counter() - t
    files = os.listdir(os.environ["LOOPIR_CACHE_DIR"])
    assert len(files) == 1 and files[0].endswith(".cubin")
    t = time.perf_counter()
    b = compile_cubin(src, "sm_90")
    hot = time.perf_counter() - t
    assert a == b and hot < cold
    assert cache_key(src, "sm_90", ()) != cache_key(src, "sm_80", ())
    assert cache_key(src, "sm_90", ()) != cache_key(src + " ", "sm_90", ())
    assert cache_key(src, "sm_90", ("-lineinfo",)) != cache_key(src, "sm_90", ())


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "empty"])
def test_corrupt_cache_entry_is_recompiled(damage):
    src = generate_cuda(lower_cuda(_sincos_bound(), "cuda")).source
    good = compile_cubin(src, "sm_90")
    d = os.environ["LOOPIR_CACHE_DIR"]
    (path,) = [os.path.join(d, f) for f in os.listdir(d)]
    data = open(path, "rb").read()
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "flip":
        data = data[:-10] + bytes([data[-10] ^ 0xFF]) + data[-9:]
    elif damage == "garbage":
        data = b"not a cubin at all" * 10
    else:
        data = b""
    open(path, "wb").write(data)
    again = compile_cubin(src, "sm_90")
    assert again == good
    fixed = open(path, "rb").read()
    assert fixed.startswith(MAGIC) and fixed.endswith(good)


_CHILD = """
import sys, time
sys.path.insert(0, {root!r}); sys.path.insert(0, {tests!r})
from loopir import workloads as W
from test_cuda_helpers import bind_elementwise
from codegen.cuda.build import build_cuda
p = bind_elementwise(W.sincos().program(), {threads})
t = time.perf_counter()
m = build_cuda(p)
print((time.perf_counter() - t) * 1e3, len(m.cubin))
"""


def _child(threads: int) -> subprocess.Popen:
    code = _CHILD.format(root=ROOT, tests=os.path.join(ROOT, "tests"), threads=threads)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_concurrent_processes_share_the_cache_safely():
    procs = [_child(128) for _ in range(4)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-500:] for o in outs]
    sizes = {o[0].split()[1] for o in outs}
    assert len(sizes) == 1
    d = os.environ["LOOPIR_CACHE_DIR"]
    entries = [f for f in os.listdir(d) if f.endswith(".cubin") and not f.startswith(".tmp")]
    assert len(entries) == 1 and not [f for f in os.listdir(d) if f.startswith(".tmp")]
    # a later process hits the cache
    p = _child(128)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    assert float(out.split()[0]) < 100  # generous bound; benchmarks measure the real figure


# ----------------------------------------------------------------------------- no GPU


def test_no_gpu_is_a_clear_runtime_error():
    from codegen.cuda.runtime import gpu_available

    if gpu_available():
        pytest.skip("a GPU is present")
    mod = build_cuda(_sincos_bound())
    x = np.random.default_rng(0).standard_normal(100).astype(np.float32)
    y = np.full(100, np.nan, np.float32)
    with pytest.raises(RuntimeError) as e:
        mod(x, y)
    assert "no CUDA GPU" in str(e.value)
    with pytest.raises(RuntimeError, match="no CUDA GPU"):
        mod.benchmark(x, y)


def test_argument_checks_before_touching_the_gpu():
    mod = build_cuda(_sincos_bound())
    x = np.ones(10, np.float32)
    with pytest.raises(TypeError, match="'y'"):
        mod(x, np.ones(10, np.float64))
    with pytest.raises(TypeError, match="2 argument"):
        mod(x)
    with pytest.raises(TypeError, match="'x'"):
        mod([1.0] * 10, x)


def test_eval_index_floor_semantics():
    n = N.Var("n")
    assert eval_index((n - 10) // 4, {n: 3}) == math.floor(-7 / 4)
    assert eval_index((n - 10) % 4, {n: 3}) == (-7) % 4
    with pytest.raises(ValueError, match="'n'"):
        eval_index(n + 1, {})
