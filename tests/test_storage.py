"""store_at / store_root / compute_root / set_scope: printed nests, Halide's lesson 8 counts (sliding window),
privatization in a parallel loop, refusals with witnesses checked against the access functions, numerics on
the CPU and CUDA targets (NVRTC + the adversarial GPU interpreter here; the device in gpu-marked tests)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import numpy as np
import pytest

from codegen import build
from codegen.cuda.build import build_cuda
from loopir import interp, ir, te
from loopir.bounds import check_bounds
from loopir.errors import ArgumentError, CudaCodegenError
from loopir.nodes import Allocate, Buffer, Const, Load, Store
from loopir.visit import Transformer, walk
from schedules import Schedule, ScheduleError
from witness_check import eval_int


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOPIR_CACHE_DIR", str(tmp_path / "cache"))


# ----------------------------------------------------------------------------- Halide's lesson 8


def _lesson8(w=4, h=4):
    """Halide lesson 8: producer(x, y) = sin(x * y); consumer = the average of a 2x2 window of it."""
    producer = te.compute((h + 1, w + 1), lambda y, x: te.sin(te.cast("float32", x * y)), name="producer")
    consumer = te.compute((h, w), lambda y, x: (producer[y, x] + producer[y + 1, x] + producer[y, x + 1]
                                                + producer[y + 1, x + 1]) / 4, name="consumer")
    return producer, consumer


def _lesson8_reference(w=4, h=4):
    yy, xx = np.mgrid[0:h + 1, 0:w + 1]
    p = np.sin((xx * yy).astype(np.float64))
    return (p[:-1, :-1] + p[1:, :-1] + p[:-1, 1:] + p[1:, 1:]) / 4


def _count_and_check(s, w=4, h=4):
    """Run in the interpreter (output NaN-poisoned), compare to numpy, return the producer's evaluations."""
    out = np.full((h, w), np.nan, np.float32)
    trace: list = []
    interp.run(s.program, out, trace=trace)
    np.testing.assert_allclose(out, _lesson8_reference(w, h), rtol=1e-5, atol=1e-6)
    return sum(1 for name, _ in trace if name == "producer")


def test_lesson8_evaluation_counts():
    # compute_at y (store at y): 2 rows of 5 per row of the consumer = 40; compute_at x: 4 per pixel = 64;
    # store_root + compute_at y slides: 10 + 3 * 5 = 25, Halide's count
    counts = {}
    for mode in ("at_y", "at_x", "store_y", "root"):
        producer, consumer = _lesson8()
        s = Schedule(consumer)
        y, x = s.loops(consumer)
        s.compute_at(producer, x if mode == "at_x" else y)
        if mode == "store_y":
            s.store_at(producer, y)
        if mode == "root":
            s.store_root(producer)
        counts[mode] = _count_and_check(s)
    assert counts == {"at_y": 40, "at_x": 64, "store_y": 40, "root": 25}


def test_lesson8_mixed_strategy_counts():
    # the lesson's last schedule on its 160 x 160 consumer: consumer.split(y, yo, yi, 16).parallel(yo)
    # .vectorize(x, 4); producer.store_at(consumer, yo).compute_at(consumer, yi).vectorize(x, 4):
    # each of the 10 strips computes its 16 rows + 1 halo row of 161 producer values once (sliding)
    producer, consumer = _lesson8(160, 160)
    s = Schedule(consumer)
    y, x = s.loops(consumer)
    yo, yi = s.split(y, 16)
    s.compute_at(producer, yi).store_at(producer, yo).parallel(yo)
    _, xi = s.split(x, 4)
    s.vectorize(xi)
    _, xci = s.split(s.loops(producer)[-1], 4)
    s.vectorize(xci)
    assert _count_and_check(s, 160, 160) == 10 * 17 * 161
    out = np.full((160, 160), np.nan, np.float32)
    build(s, [consumer], target="cpu")(out)
    np.testing.assert_allclose(out, _lesson8_reference(160, 160), rtol=1e-4, atol=1e-5)


def test_lesson8_store_root_nest():
    producer, consumer = _lesson8()
    s = Schedule(consumer)
    y, _ = s.loops(consumer)
    s.compute_at(producer, y).store_root(producer)
    assert str(s) == (
        "def consumer(consumer: float32[4, 4]):\n"
        "    producer: float32[5, 5]  # temporary\n"
        "    for y in range(0, 4):\n"
        "        for y_c in range(min(y, 1), 2):\n"
        "            for x_c in range(0, 5):\n"
        "                producer[y_c + y, x_c] = sin(float32(x_c * (y_c + y)))  # producer\n"
        "        for x in range(0, 4):\n"
        "            consumer[y, x] = (producer[y, x] + producer[y + 1, x] + producer[y, x + 1] "
        "+ producer[y + 1, x + 1]) / 4.0  # consumer"
    )


def test_store_at_shrinks_and_rebases():
    producer, consumer = _lesson8()
    s = Schedule(consumer)
    y, _ = s.loops(consumer)
    s.compute_at(producer, y).store_at(producer, y)
    assert str(s) == (
        "def consumer(consumer: float32[4, 4]):\n"
        "    for y in range(0, 4):\n"
        "        with allocate(float32[2, 5], 'global') as producer:\n"
        "            for y_c in range(0, 2):\n"
        "                for x_c in range(0, 5):\n"
        "                    producer[y_c, x_c] = sin(float32(x_c * (y_c + y)))  # producer\n"
        "            for x in range(0, 4):\n"
        "                consumer[y, x] = (producer[0, x] + producer[1, x] + producer[0, x + 1] "
        "+ producer[1, x + 1]) / 4.0  # consumer"
    )
    assert s.program.temps == ()
    mod = build(s, [consumer], target="cpu")
    out = np.full((4, 4), np.nan, np.float32)
    mod(out)
    np.testing.assert_allclose(out, _lesson8_reference(), rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- strips: sliding + parallel


def _strips():
    h, w = te.var("h"), te.var("w")
    X = te.placeholder((h + 1, w + 1), name="X")
    P = te.compute((h + 1, w + 1), lambda y, x: te.sqrt(X[y, x] * X[y, x] + 1), name="P")
    C = te.compute((h, w), lambda y, x: (P[y, x] + P[y + 1, x] + P[y, x + 1] + P[y + 1, x + 1]) / 4, name="C")
    return X, P, C


def _strips_reference(a):
    p = np.sqrt(a.astype(np.float64) ** 2 + 1)
    return (p[:-1, :-1] + p[1:, :-1] + p[:-1, 1:] + p[1:, 1:]) / 4


def test_parallel_strips_own_their_storage_and_slide():
    X, P, C = _strips()
    s = Schedule(C)
    y, x = s.loops(C)
    yo, yi = s.split(y, 16)
    s.compute_at(P, yi)
    # without storage per strip, two strips write the halo row of one global buffer: parallel is refused
    with pytest.raises(ScheduleError):
        r = Schedule.replay(s.trace_json(), C)
        r.parallel(r.loops(C)[0])
    s.store_at(P, yo)
    s.parallel(yo)
    xo, xi = s.split(x, 4)
    s.vectorize(xi)
    text = str(s)
    assert "for y_o in parallel(0, (h + 15) // 16):" in text
    assert "with allocate(float32[17, w + 1], 'global') as P:" in text
    assert "for y_c in range(min(y_i, 1), min(2, h - 16 * y_o - y_i + 1)):" in text
    rng = np.random.default_rng(8)
    mod = build(s, [X, C], target="cpu")
    for hh, ww in ((37, 21), (16, 8), (1, 1), (5, 3)):
        a = rng.standard_normal((hh + 1, ww + 1)).astype(np.float32)
        out = np.full((hh, ww), np.nan, np.float32)
        trace: list = []
        interp.run(s.program, a, out, trace=trace)
        np.testing.assert_allclose(out, _strips_reference(a), rtol=1e-5, atol=1e-6)
        strips = (hh + 15) // 16
        # each strip computes its rows once, plus the one halo row it shares with the next strip
        assert sum(1 for n, _ in trace if n == "P") == (hh + strips) * (ww + 1)
        out2 = np.full((hh, ww), np.nan, np.float32)
        mod(a, out2)
        np.testing.assert_allclose(out2, _strips_reference(a), rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- refusals with witnesses


def _window():
    """B written at t = 0 .. is read in later iterations of t: B cannot be stored per iteration of t."""
    n, T = te.var("n"), te.var("T")
    A = ir.buffer((n + T,), name="A")
    C = ir.buffer((T, n), name="C")
    b = ir.Builder("window")
    B = b.temp((n + T,), name="B")
    with b.loop("t", 0, T) as t:
        with b.loop("i", 0, n) as i:
            b.store(B, (i + t,), A[i + t] * 2.0, name="P")
        with b.loop("j", 0, n) as j:
            b.store(C, (t, j), B[j] + 1.0, name="Q")
    return b.finish([A, C])


def _verify_split_witness(program, err, loop_name):
    """The source writes the element of err.buffer that the sink reads, and the two run in different
    iterations of the storage loop `loop_name` (so separate allocations would separate them)."""
    assert err.kind == "flow"
    stores = {n.name: n for n in walk(program.body) if isinstance(n, Store)}
    src, snk = stores[err.source[0]], stores[err.sink[0]]
    env_s, env_t = {**err.params, **err.source[1]}, {**err.params, **err.sink[1]}
    assert src.buffer.name == err.buffer
    wrote = tuple(eval_int(i, env_s) for i in src.indices)
    reads = [tuple(eval_int(i, env_t) for i in ld.indices) for ld in walk(snk.value)
             if isinstance(ld, Load) and ld.buffer.name == err.buffer]
    assert wrote in reads
    # the storage loop's value at each instance: its coordinate, evaluated
    def loop_value(st, env):
        k = next(k for k, v in enumerate(st.iters) if v.name == loop_name)
        return eval_int(st.coords[k], env)
    assert loop_value(src, env_s) != loop_value(snk, env_t)


def test_store_at_refused_where_a_value_crosses_iterations():
    p = _window()
    s = Schedule(p)
    before = str(s)
    with pytest.raises(ScheduleError) as ei:
        s.store_at("B", s.loop("t"))
    err = ei.value
    assert (err.source[0], err.sink[0], err.buffer) == ("P", "Q", "B")
    _verify_split_witness(s.program, err, "t")
    assert str(s) == before  # refused steps leave the schedule unchanged
    # numerically: the refused placement would read unwritten (NaN) storage
    s2 = Schedule(p, check=False)
    s2.store_at("B", s2.loop("t"))
    rng = np.random.default_rng(1)
    a = rng.standard_normal(6).astype(np.float32)
    c = np.full((3, 3), np.nan, np.float32)
    interp.run(s2.program, a, c)
    assert np.isnan(c).any()


def test_store_at_inside_a_sliding_window_refused():
    # after store_root slid the window along y, rows computed at y - 1 are read at y: storage per y breaks that
    producer, consumer = _lesson8()
    s = Schedule(consumer)
    y, _ = s.loops(consumer)
    s.compute_at(producer, y).store_root(producer)
    with pytest.raises(ScheduleError) as ei:
        s.store_at(producer, y)
    err = ei.value
    assert (err.source[0], err.sink[0]) == ("producer", "consumer")
    _verify_split_witness(s.program, err, "y")


def test_misuse_is_refused_with_typed_errors():
    producer, consumer = _lesson8()
    s = Schedule(consumer)
    y, x = s.loops(consumer)
    with pytest.raises(ArgumentError, match="compute_at"):
        s.store_at(producer, y)  # still computed at the root: its accesses are not inside y
    with pytest.raises(ArgumentError, match="argument"):
        s.store_at(consumer, y)
    with pytest.raises(ArgumentError, match="store_at"):
        s.set_scope(producer, "local")  # a root temporary is global
    with pytest.raises(ArgumentError, match="scope must be"):
        s.set_scope(producer, "texture")
    s.compute_at(producer, y)
    with pytest.raises(ArgumentError, match="compute_root"):
        s.compute_root(producer)


def test_set_scope_refuses_a_symbolic_footprint_naming_stage_and_size():
    X, P, C = _strips()
    s = Schedule(C)
    y, _ = s.loops(C)
    s.compute_at(P, y).store_at(P, y)
    assert "allocate(float32[2, w + 1], 'global')" in str(s)
    with pytest.raises(ArgumentError, match=r"stage 'P' needs 2 x w \+ 1 elements"):
        s.set_scope(P, "local")
    s.set_scope(P, "global")  # as it is: accepted


def test_compute_root_keeps_the_default_and_computes_right():
    X, P, C = _strips()
    s = Schedule(C)
    s.compute_root(P)
    assert "P: float32[h + 1, w + 1]  # temporary" in str(s)
    rng = np.random.default_rng(2)
    a = rng.standard_normal((6, 4)).astype(np.float32)
    out = np.full((5, 3), np.nan, np.float32)
    build(s, [X, C], target="cpu")(a, out)
    np.testing.assert_allclose(out, _strips_reference(a), rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- CUDA: shared and local


def _blur1d_graph():
    """C[i] = P[i] + P[i+1] + P[i+2] with P = 2A + 1: (A, P, C)."""
    n = te.var("n")
    A = te.placeholder((n + 2,), name="A")
    P = te.compute((n + 2,), lambda i: A[i] * 2 + 1, name="P")
    return A, P, te.compute((n,), lambda i: P[i] + P[i + 1] + P[i + 2], name="C")


def _blur1d(scope, bind_producer):
    A, P, C = _blur1d_graph()
    s = Schedule(C)
    (i,) = s.loops(C)
    io, ii = s.split(i, 64)
    s.compute_at(P, io).store_at(P, io).set_scope(P, scope)
    if bind_producer:
        s.bind(s.loops(P)[-1], "threadIdx.x")
    s.bind(io, "blockIdx.x").bind(ii, "threadIdx.x")
    return A, C, s


def _blur1d_reference(a):
    p = a.astype(np.float64) * 2 + 1
    return p[:-2] + p[1:-1] + p[2:]


CUDA_CASES = [("shared", True), ("shared", False), ("local", False)]


@pytest.mark.parametrize("scope,bind_producer", CUDA_CASES)
def test_cuda_storage_builds_and_runs_adversarially(scope, bind_producer):
    A, C, s = _blur1d(scope, bind_producer)
    assert f"with allocate(float32[66], '{scope}') as P:" in str(s)
    mod = build_cuda(s.program, arch="sm_90")
    assert mod.cubin[:4] == b"\x7fELF"
    if scope == "shared":
        assert "__shared__ __align__(16) float P[66];" in mod.source and "__syncthreads();" in mod.source
    else:
        assert "float P[66];  // local P" in mod.source
    rng = np.random.default_rng(3)
    for n in (1, 64, 200):
        a = rng.standard_normal(n + 2).astype(np.float32)
        out = np.full(n, np.nan, np.float32)
        interp.run(s.program, a, out, gpu_order="reversed")
        np.testing.assert_allclose(out, _blur1d_reference(a), rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("scope,bind_producer", CUDA_CASES)
def test_cuda_storage_on_device(scope, bind_producer):
    A, C, s = _blur1d(scope, bind_producer)
    mod = build(s, [A, C], target="cuda")
    rng = np.random.default_rng(4)
    for n in (1, 200, 4099):
        a = rng.standard_normal(n + 2).astype(np.float32)
        out = np.full(n, np.nan, np.float32)
        mod(a, out)
        np.testing.assert_allclose(out, _blur1d_reference(a), rtol=1e-5, atol=1e-5)


def _verify_pair(program, err, differing_loop):
    """The witness's two instances touch the same element of err.buffer with the accesses its kind names
    (flow: source writes, sink reads; anti: source reads, sink writes) and differ in `differing_loop`."""
    stores = {n.name: n for n in walk(program.body) if isinstance(n, Store)}
    src, snk = stores[err.source[0]], stores[err.sink[0]]
    env_s, env_t = {**err.params, **err.source[1]}, {**err.params, **err.sink[1]}

    def reads(st, env):
        return [tuple(eval_int(i, env) for i in ld.indices) for ld in walk(st.value)
                if isinstance(ld, Load) and ld.buffer.name == err.buffer]

    def write(st, env):
        assert st.buffer.name == err.buffer
        return tuple(eval_int(i, env) for i in st.indices)

    if err.kind == "anti":
        assert write(snk, env_t) in reads(src, env_s)
    else:
        assert err.kind == "flow" and write(src, env_s) in reads(snk, env_t)
    assert err.source[1][differing_loop] != err.sink[1][differing_loop]


def test_per_thread_storage_is_local_and_shared_is_refused():
    # storage per thread (store_at the thread loop): "local" is one array per thread; "shared" would make the
    # threads of a block share one 3-element buffer that each fills with its own window: refused, with witness
    A, P, C = _blur1d_graph()
    s = Schedule(C)
    (i,) = s.loops(C)
    io, ii = s.split(i, 64)
    s.compute_at(P, ii).store_at(P, ii)
    s.bind(io, "blockIdx.x").bind(ii, "threadIdx.x")
    s.set_scope(P, "local")
    mod = build_cuda(s.program, arch="sm_90")
    assert "float P[3];  // local P" in mod.source and mod.cubin[:4] == b"\x7fELF"
    rng = np.random.default_rng(5)
    a = rng.standard_normal(131).astype(np.float32)
    out = np.full(129, np.nan, np.float32)
    interp.run(s.program, a, out, gpu_order="reversed")
    np.testing.assert_allclose(out, _blur1d_reference(a), rtol=1e-5, atol=1e-5)
    before = s.program
    with pytest.raises(ScheduleError) as ei:
        s.set_scope(P, "shared")
    _verify_pair(before, ei.value, "i_i")
    assert s.program is before


def test_bounds_proof_covers_the_shrunk_buffers():
    _, _, s = _blur1d("shared", True)
    assert check_bounds(s.program) is None
    X, P, C = _strips()
    s2 = Schedule(C)
    y, _ = s2.loops(C)
    yo, yi = s2.split(y, 16)
    s2.compute_at(P, yi).store_at(P, yo)
    assert check_bounds(s2.program) is None

    class _OneRowLess(Transformer):  # a box one row too small: the proof must find the access beyond it
        def visit_Allocate(self, a):
            b = Buffer(a.buffer.name, (Const(16, "int64"),) + a.buffer.shape[1:], a.buffer.dtype, a.buffer.scope)

            class _R(Transformer):
                def visit_Load(self, ld):
                    return Load(b, tuple(self.visit(i) for i in ld.indices)) if ld.buffer is a.buffer else ld

                def visit_Store(self, st):
                    v = self.visit(st.value)
                    return Store(st.name, b if st.buffer is a.buffer else st.buffer, st.indices, v, st.iters,
                                 st.coords)

            return Allocate(b, _R().visit(a.body))

    bad = dataclasses.replace(s2.program, body=_OneRowLess().visit(s2.program.body))
    assert check_bounds(bad) is not None


def test_blur_example_small_path(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, LOOPIR_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p))
    proc = subprocess.run([sys.executable, os.path.join(root, "examples", "blur_store_at.py"), "--small", "--cpu"],
                          capture_output=True, text=True, timeout=600, env=env, cwd=root)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "MISMATCH" not in out and out.count(": ok") >= 7
    assert "strips: blur_x evaluated 640 times" in out  # 4 strips of 8 + 2 rows of 16: the window slides
    assert "__global__" in out and "__shared__" in out
    assert "0.9 ms/MP" in out


@pytest.mark.parametrize("scope", ["local", "global"])
def test_per_thread_copy_filled_by_a_thread_loop_is_refused_on_cuda(scope):
    # allocation per block, producer loop bound to threads, scope not shared: each thread's own copy would hold
    # only its element (the adversarial interpreter shows the unwritten ones); the CUDA pipeline refuses it
    A, C, s = _blur1d(scope, True)
    a = np.random.default_rng(6).standard_normal(130).astype(np.float32)
    out = np.full(128, np.nan, np.float32)
    interp.run(s.program, a, out, gpu_order="reversed")
    assert np.isnan(out).any()
    with pytest.raises(CudaCodegenError, match=r"buffer 'P' is one copy per thread.*set_scope\('P', 'shared'\)"):
        build_cuda(s.program, arch="sm_90")
