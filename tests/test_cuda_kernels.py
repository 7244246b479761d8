"""Kernel boundaries from the schedule (issue 17): a serial loop around grid-bound loops is a host loop.

A scan whose step reads neighbouring columns of the previous step, and an LSTM-like recurrence (step t
needs every value of step t - 1), scheduled with the time loop outside the bound loops: the pass
`split_kernels` makes the time loop a host loop, the CUDA source has no time loop inside a kernel and
compiles with NVRTC, the launch sequence runs one launch per step (checked against a recording driver),
the CPU build of the lowered program matches numpy, and (gpu mark) the GPU matches numpy.
"""

from __future__ import annotations

import dataclasses
import re
import types

import numpy as np
import pytest

from codegen import build
from codegen.cuda import HostIf, HostLoop, Launch, generate_cuda
from codegen.cuda.build import build_cuda
from codegen.passes import lower, pipeline
from codegen.passes.kernels import kernels, map_kernels, split_kernels
from loopir import interp, ir, te
from loopir import nodes as N
from schedules import Schedule


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOPIR_CACHE_DIR", str(tmp_path / "cache"))


# ----------------------------------------------------------------------------- programs


def scan_program() -> tuple[N.Program, tuple[N.Buffer, N.Buffer]]:
    """S[t, j] = S[t-1, j] + 0.5 * S[t-1, min(j+1, n-1)] + X[t, j]: step t reads two columns of step t - 1."""
    T, n = te.var("T"), te.var("n")
    X = ir.buffer((T, n), name="X")
    S = ir.buffer((T, n), name="S")
    b = ir.Builder("scan")
    with b.if_(T >= 1):  # step 0 exists only when there is a step: the bounds proof holds at T = 0 too
        with b.loop("j", 0, n) as j:
            b.store(S, (0, j), X[0, j], name="S0")
    with b.loop("t", 1, T) as t:
        with b.loop("j", 0, n) as j:
            b.store(S, (t, j), S[t - 1, j] + 0.5 * S[t - 1, te.minimum(j + 1, n - 1)] + X[t, j], name="St")
    return b.finish([X, S]), (X, S)


def scan_reference(x: np.ndarray) -> np.ndarray:
    s = np.empty_like(x, dtype=np.float64)
    s[0] = x[0]
    for t in range(1, len(x)):
        right = np.concatenate([s[t - 1, 1:], s[t - 1, -1:]])
        s[t] = s[t - 1] + 0.5 * right + x[t]
    return s


def scheduled_scan(threads: int = 64) -> tuple[Schedule, tuple[N.Buffer, N.Buffer]]:
    prog, bufs = scan_program()
    s = Schedule(prog)
    (j0,) = s.loops("S0")
    a, c = s.split(j0, threads)
    s.bind(a, "blockIdx.x").bind(c, "threadIdx.x")
    _, j = s.loops("St")
    jo, ji = s.split(j, threads)
    s.bind(jo, "blockIdx.x").bind(ji, "threadIdx.x")
    return s, bufs


def lstm_program() -> tuple[N.Program, tuple[N.Buffer, ...]]:
    """A one-layer LSTM cell over time (TVM's LSTM tutorial, without the batch): four gates from the
    input projection X and the recurrent product W[g] @ H[t-1]; then the cell state C and output H."""
    T, n = te.var("T"), te.var("n")
    X = ir.buffer((T, 4, n), name="X")
    W = ir.buffer((4, n, n), name="W")
    H = ir.buffer((T, n), name="H")
    C = ir.buffer((T, n), name="C")
    b = ir.Builder("lstm")
    G = b.temp((T, 4, n), name="G")
    with b.if_(T >= 1):  # the first step exists only when there is one (the bounds proof covers T = 0)
        with b.loop("i", 0, n) as i:
            b.store(H, (0, i), X[0, 2, i], name="H0")
            b.store(C, (0, i), X[0, 3, i], name="C0")
    with b.loop("t", 1, T) as t:
        with b.loop("g", 0, 4) as g:
            with b.loop("i", 0, n) as i:
                b.store(G, (t, g, i), X[t, g, i], name="G_init")
                with b.loop("k", 0, n) as k:
                    b.store(G, (t, g, i), G[t, g, i] + W[g, i, k] * H[t - 1, k], name="G")
        with b.loop("i", 0, n) as i:

            def sg(q: int) -> N.Expr:
                return N.call("sigmoid", G[t, q, i])

            b.store(C, (t, i), sg(1) * C[t - 1, i] + sg(0) * N.call("tanh", G[t, 3, i]), name="Cs")
            b.store(H, (t, i), sg(2) * N.call("tanh", C[t, i]), name="Hs")
    return b.finish([X, W, H, C]), (X, W, H, C)


def lstm_reference(x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x, w = x.astype(np.float64), w.astype(np.float64)
    T, n = x.shape[0], x.shape[2]
    h, c = np.empty((T, n)), np.empty((T, n))
    h[0], c[0] = x[0, 2], x[0, 3]

    def sig(v: np.ndarray) -> np.ndarray:
        return 1 / (1 + np.exp(-v))

    for t in range(1, T):
        g = x[t] + np.einsum("gik,k->gi", w, h[t - 1])
        c[t] = sig(g[1]) * c[t - 1] + sig(g[0]) * np.tanh(g[3])
        h[t] = sig(g[2]) * np.tanh(c[t])
    return h, c


def scheduled_lstm(threads: int = 32) -> tuple[Schedule, tuple[N.Buffer, ...]]:
    prog, bufs = lstm_program()
    s = Schedule(prog)
    (i0,) = s.loops("H0")
    a, c = s.split(i0, threads)
    s.bind(a, "blockIdx.x").bind(c, "threadIdx.x")
    _, g, i, _ = s.loops("G")
    io, ii = s.split(i, threads)
    s.bind(g, "blockIdx.y").bind(io, "blockIdx.x").bind(ii, "threadIdx.x")
    _, i2 = s.loops("Hs")
    io2, ii2 = s.split(i2, threads)
    s.bind(io2, "blockIdx.x").bind(ii2, "threadIdx.x")
    return s, bufs


def _lstm_data(T: int, n: int, seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (T, 4, n)).astype(np.float32)
    w = (rng.uniform(-1, 1, (4, n, n)) / np.sqrt(n)).astype(np.float32)
    return x, w


# ----------------------------------------------------------------------------- the pass


def test_split_kernels_comes_before_every_kernel_decision():
    names = [p.name for p in pipeline("cuda")]
    # kernel boundaries first (after the bounds proof, which reads the unsplit program), then the per-kernel plans
    assert names.index("split_kernels") < names.index("plan_kernels") < names.index("place_barriers")
    assert "split_kernels" not in [p.name for p in pipeline("cpu")]


def test_scan_time_loop_becomes_a_host_loop():
    s, _ = scheduled_scan()
    low = split_kernels(s.program)
    text = str(low)
    assert "for t in host(1, T):" in text
    assert "for t in range(1, T)" not in text
    # the bound loops and the first step's nest are untouched
    assert text.count("# blockIdx.x") == 2 and "for j_o2 in range" in text
    ks = list(kernels(low))
    assert [tuple(f.var.name for f in loops) for loops, _ in ks] == [(), ("t",)]
    first, second = (k for _, k in ks)
    assert isinstance(first, N.If) and isinstance(first.then, N.For) and first.then.thread == "blockIdx.x"
    assert isinstance(second, N.For) and second.thread == "blockIdx.x"
    # pure and idempotent: the input is unchanged, a second run returns its input object
    assert "for t in range(1, T):" in str(s.program)
    assert split_kernels(low) is low


def test_lowered_program_is_printed_after_the_pass():
    s, bufs = scheduled_scan()
    seen: list[str] = []
    build(s, list(bufs), target="cuda", dump_passes=seen.append)
    after = next(x for x in seen if "after pass split_kernels" in x)
    assert "(changed)" in after and "for t in host(1, T):" in after


def test_lstm_time_loop_is_a_host_loop_of_two_kernels():
    s, _ = scheduled_lstm()
    low = split_kernels(s.program)
    assert "for t in host(1, T):" in str(low)
    ks = list(kernels(low))
    assert [(tuple(f.var.name for f in loops), sorted({n.name for n in _stores(k)})) for loops, k in ks] == [
        ((), ["C0", "H0"]), (("t",), ["G", "G_init"]), (("t",), ["Cs", "Hs"])]


def _stores(s: N.Stmt) -> list[N.Store]:
    from loopir.visit import walk

    return [n for n in walk(s) if isinstance(n, N.Store)]


def test_serial_loop_above_a_host_loop_is_host_too_and_inner_serial_loops_stay():
    """for r (serial): for t (serial): for b (blockIdx): for k (serial) -> r and t host, k stays in the kernel."""
    n = N.Var("n")
    A = N.Buffer("A", (n,), "float32")
    r, t, bx, k = N.Var("r"), N.Var("t"), N.Var("b"), N.Var("k")
    st = N.Store("S", A, (bx,), A[bx] + 1.0, (r, t, bx, k), (r, t, bx, k))
    inner = N.For(bx, N.const(0), n, N.For(k, N.const(0), N.const(3), st), "thread", "blockIdx.x")
    p = N.Program("p", (A,), N.For(r, N.const(0), N.const(2), N.For(t, N.const(0), N.const(5), inner)), (), (n,))
    low = split_kernels(p)
    text = str(low)
    assert "for r in host(0, 2):" in text and "for t in host(0, 5):" in text and "for k in range(0, 3):" in text
    # a serial loop that encloses thread-bound loops only (one block) stays inside its kernel
    tx = N.Var("tx")
    one_block = N.For(t, N.const(0), N.const(5), N.For(tx, N.const(0), n, st, "thread", "threadIdx.x"))
    p2 = dataclasses.replace(p, body=one_block)
    assert split_kernels(p2) is p2
    # a parallel loop around grid-bound loops stays in its kernel, unless a serial loop inside it becomes host
    par = N.For(r, N.const(0), N.const(2), inner, "parallel")
    p3 = dataclasses.replace(p, body=par)
    assert split_kernels(p3) is p3
    p4 = dataclasses.replace(p, body=dataclasses.replace(par, body=N.For(t, N.const(0), N.const(5), inner)))
    text = str(split_kernels(p4))
    assert "for r in host(0, 2):" in text and "for t in host(0, 5):" in text


def test_map_kernels_rewrites_kernels_only():
    s, _ = scheduled_lstm()
    low = split_kernels(s.program)
    seen: list[N.Stmt] = []

    def mark(k: N.Stmt) -> N.Stmt:
        seen.append(k)
        return N.Seq((k, N.Barrier()))

    out = map_kernels(low, mark)
    assert len(seen) == 3
    assert [k for _, k in kernels(out)] == [N.Seq((k, N.Barrier())) for k in seen]
    assert map_kernels(low, lambda k: k) is low


# ----------------------------------------------------------------------------- CUDA source and launches


def _kernel_text(src: str, name: str) -> str:
    m = re.search(r'extern "C" __global__ void ' + name + r"\(.*?\n}\n", src, re.S)
    assert m, name
    return m.group(0)


def test_scan_cuda_source_has_no_time_loop_and_compiles():
    s, bufs = scheduled_scan()
    mod = build(s, list(bufs), target="cuda")
    assert mod.kernels == ["scan_S0", "scan_St"]
    body = _kernel_text(mod.source, "scan_St")
    assert "const int t)" in body  # the step is a parameter (32-bit: the generic module of a specializing build)
    assert "for (" not in body  # no loop at all inside the step kernel: the time loop is on the host
    assert "launched once per iteration of the host loop(s) t" in body
    assert mod.cubin[:4] == b"\x7fELF"
    (first, loop) = mod.gen.launches
    assert first == Launch(0)
    assert mod.gen.launch_plan() == (
        "launch scan_S0 grid ((n + 63) // 64, 1, 1) block (64, 1, 1)\n"
        "for t in host(1, T):\n"
        "    launch scan_St grid ((n + 63) // 64, 1, 1) block (64, 1, 1)")
    assert isinstance(loop, HostLoop) and loop.var.name == "t" and loop.body == (Launch(1),)


def test_lstm_cuda_source_compiles_with_two_kernels_per_step():
    s, bufs = scheduled_lstm()
    mod = build(s, list(bufs), target="cuda")
    assert mod.kernels == ["lstm_H0", "lstm_G_init", "lstm_Cs"]
    for k in mod.kernels[1:]:
        body = _kernel_text(mod.source, k)
        assert "const int t)" in body and "for (int t" not in body
    g = _kernel_text(mod.source, "lstm_G_init")
    assert "for (int k = 0; k < n; ++k)" in g  # the reduction stays a loop of its thread
    loop = mod.gen.launches[1]
    assert isinstance(loop, HostLoop) and loop.body == (Launch(1), Launch(2))


class _RecordingDriver:
    """Stands in for cuda.bindings.driver: records cuLaunchKernel calls (no GPU needed)."""

    CUresult = types.SimpleNamespace(CUDA_SUCCESS=0)

    def __init__(self) -> None:
        self.launches: list[tuple[str, tuple, tuple, tuple]] = []

    def cuLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, smem, stream, args, extra):  # noqa: N802
        self.launches.append((fn, (gx, gy, gz), (bx, by, bz), args[0]))
        return (0,)


def _record(mod, sizes: dict[str, int], monkeypatch) -> list[tuple[str, tuple, tuple, tuple]]:
    from codegen.cuda import runtime as rt

    drv = _RecordingDriver()
    monkeypatch.setattr(rt, "_driver", lambda: drv)
    monkeypatch.setattr(type(mod), "_functions", lambda self, dev: {k: k for k in self.kernels})
    env = {v: sizes[v.name] for v in mod.program.params}
    ptrs = {b: 1000 * (k + 1) for k, b in enumerate((*mod.program.args, *mod.program.temps))}
    mod.launch(rt._Prepared([], env, None, None, ptrs))
    return drv.launches


def test_host_loop_launches_once_per_step_with_the_step_as_parameter(monkeypatch):
    s, bufs = scheduled_scan()
    mod = build(s, list(bufs), target="cuda")
    calls = _record(mod, {"T": 5, "n": 100}, monkeypatch)
    assert [c[0] for c in calls] == ["scan_S0"] + ["scan_St"] * 4
    assert all(c[1] == (2, 1, 1) and c[2] == (64, 1, 1) for c in calls)
    assert [c[3][-1] for c in calls[1:]] == [1, 2, 3, 4]  # t, the last parameter
    assert [c[0] for c in _record(mod, {"T": 1, "n": 100}, monkeypatch)] == ["scan_S0"]  # no step at all


def test_launch_dims_are_evaluated_per_host_iteration(monkeypatch):
    """A triangular nest: for t (host): blocks over 0..t+1 — the grid grows with t."""
    n = N.Var("n")
    A = N.Buffer("A", (n, n), "float32")
    t, bx = N.Var("t"), N.Var("b")
    st = N.Store("S", A, (t, bx), A[t - 1, bx] * 2.0, (t, bx), (t, bx))
    body = N.For(t, N.const(1), n, N.For(bx, N.const(0), t + 1, st, "thread", "blockIdx.x"))
    mod = build(N.Program("tri", (A,), body, (), (n,)), target="cuda")
    calls = _record(mod, {"n": 4}, monkeypatch)
    assert [c[1][0] for c in calls] == [2, 3, 4]
    assert [c[3][-1] for c in calls] == [1, 2, 3]


def test_host_if_is_evaluated_on_the_host(monkeypatch):
    n = N.Var("n")
    A = N.Buffer("A", (n, n), "float32")
    t, bx = N.Var("t"), N.Var("b")
    st = N.Store("S", A, (t, bx), A[t - 1, bx] * 2.0, (t, bx), (t, bx))
    loop = N.For(t, N.const(1), n, N.For(bx, N.const(0), n, st, "thread", "blockIdx.x"))
    mod = build(N.Program("cond", (A,), N.If(n > 2, loop), (), (n,)), target="cuda")
    assert isinstance(mod.gen.launches[0], HostIf)
    assert len(_record(mod, {"n": 4}, monkeypatch)) == 3
    assert _record(mod, {"n": 2}, monkeypatch) == []


def test_scalar_store_between_kernels_of_a_host_loop_is_a_one_thread_kernel(monkeypatch):
    """for t: (norm[t] = S[t-1, 0] (scalar); for b (blockIdx): S[t, b] = S[t-1, b] / norm[t]): two launches per step."""
    n, T = N.Var("n"), N.Var("T")
    S = N.Buffer("S", (T, n), "float32")
    norm = N.Buffer("norm", (T,), "float32")
    t, bx = N.Var("t"), N.Var("b")
    scalar = N.Store("norm", norm, (t,), S[t - 1, 0] + 1.0, (t,), (t,))
    st = N.Store("S", S, (t, bx), S[t - 1, bx] / norm[t], (t, bx), (t, bx))
    first_column = N.If(n >= 1, scalar)  # S[t-1, 0] exists only when rows have a column (bounds proof at n = 0)
    body = N.For(t, N.const(1), T, N.Seq((first_column, N.For(bx, N.const(0), n, st, "thread", "blockIdx.x"))))
    p = N.Program("norm", (S, norm), body, (), (T, n))
    low = split_kernels(p)
    assert "for t in host(1, T):" in str(low)
    mod = build(p, target="cuda")
    assert mod.kernels == ["norm_norm", "norm_S"]
    calls = _record(mod, {"T": 3, "n": 5}, monkeypatch)
    one = (1, 1, 1)
    assert [(c[0], c[1], c[2]) for c in calls] == [("norm_norm", one, one), ("norm_S", (5, 1, 1), one)] * 2
    s0 = np.random.default_rng(2).uniform(0.5, 1.5, (3, 5)).astype(np.float32)
    ref = s0.astype(np.float64).copy()
    nr = np.zeros(3)
    for k in range(1, 3):
        nr[k] = ref[k - 1, 0] + 1
        ref[k] = ref[k - 1] / nr[k]
    sc, nc = s0.copy(), np.full(3, np.nan, np.float32)
    build(lower(p, "cuda"), target="cpu")(sc, nc)
    np.testing.assert_allclose(sc, ref, rtol=1e-6)


def test_host_loop_bound_that_reads_a_buffer_is_refused():
    n = N.Var("n")
    A = N.Buffer("A", (n, n), "float32")
    L = N.Buffer("L", (N.const(1),), "int64")
    t, bx = N.Var("t"), N.Var("b")
    st = N.Store("S", A, (t, bx), A[t - 1, bx] * 2.0, (t, bx), (t, bx))
    loop = N.For(t, N.const(1), L[0], N.For(bx, N.const(0), n, st, "thread", "blockIdx.x"))
    with pytest.raises(ValueError, match="upper bound of host loop 't'.*reads a buffer"):
        generate_cuda(split_kernels(N.Program("ld", (A, L), loop, (), (n,))))


def test_shared_buffer_around_a_host_loop_is_refused():
    n = N.Var("n")
    A = N.Buffer("A", (n, n), "float32")
    sh = N.Buffer("sh", (N.const(4),), "float32", "shared")
    t, bx = N.Var("t"), N.Var("b")
    st = N.Store("S", A, (t, bx), A[t - 1, bx] * 2.0, (t, bx), (t, bx))
    loop = N.For(t, N.const(1), n, N.For(bx, N.const(0), n, st, "thread", "blockIdx.x"))
    with pytest.raises(ValueError, match="'sh'.*host loop"):
        generate_cuda(split_kernels(N.Program("al", (A,), N.Allocate(sh, loop), (), (n,))))


# ----------------------------------------------------------------------------- numerics on the CPU


@pytest.mark.parametrize("sizes", [(7, 100), (1, 64), (5, 1)])
def test_scan_lowered_program_on_the_cpu_matches_numpy(sizes):
    T, n = sizes
    s, bufs = scheduled_scan()
    low = lower(s.program, "cuda")
    assert "host(" in str(low) or T == 1
    x = np.random.default_rng(0).uniform(0.5, 1.5, (T, n)).astype(np.float32)
    for prog in (low, s.program):
        out = np.full((T, n), np.nan, np.float32)
        build(prog, list(bufs), target="cpu")(x, out)
        np.testing.assert_allclose(out, scan_reference(x), rtol=1e-5)
    out = np.full((T, n), np.nan, np.float32)
    interp.run(low, x, out)
    np.testing.assert_allclose(out, scan_reference(x), rtol=1e-5)


def test_lstm_lowered_program_on_the_cpu_matches_numpy():
    T, n = 6, 45
    s, bufs = scheduled_lstm()
    low = lower(s.program, "cuda")
    x, w = _lstm_data(T, n)
    h, c = np.full((T, n), np.nan, np.float32), np.full((T, n), np.nan, np.float32)
    build(low, list(bufs), target="cpu")(x, w, h, c)
    rh, rc = lstm_reference(x, w)
    np.testing.assert_allclose(h, rh, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(c, rc, rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------- on the GPU


@pytest.mark.gpu
@pytest.mark.parametrize("sizes", [(50, 1000), (3, 64), (33, 257)])
def test_scan_on_the_gpu_matches_numpy(sizes):
    T, n = sizes
    s, bufs = scheduled_scan()
    mod = build_cuda(lower(s.program, "cuda"))
    x = np.random.default_rng(1).uniform(0.5, 1.5, (T, n)).astype(np.float32)
    for _ in range(3):  # a race would show as run-to-run differences
        out = np.full((T, n), np.nan, np.float32)
        mod(x, out)
        np.testing.assert_allclose(out, scan_reference(x), rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("sizes", [(20, 256), (9, 100)])
def test_lstm_on_the_gpu_matches_numpy(sizes):
    T, n = sizes
    s, bufs = scheduled_lstm()
    mod = build(s, list(bufs), target="cuda")
    x, w = _lstm_data(T, n)
    rh, rc = lstm_reference(x, w)
    for _ in range(3):
        h, c = np.full((T, n), np.nan, np.float32), np.full((T, n), np.nan, np.float32)
        mod(x, w, h, c)
        np.testing.assert_allclose(h, rh, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(c, rc, rtol=1e-4, atol=1e-5)
