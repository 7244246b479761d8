"""The primitives of schedules/primitives/cache.py: bind_reduction (cross-thread reductions) and
cache_read (a region copied into shared or local memory) — golden nests, numerics through the
interpreter, witnessed refusals and misuse errors."""

from __future__ import annotations

import re

import numpy as np
import pytest

from codegen import build
from loopir import interp, ir, te, workloads
from schedules import Schedule, ScheduleError
from schedules.primitives.cache import bind_reduction, cache_read


def _softmax_schedule(n=None):
    w = workloads.softmax(n=n)
    s = Schedule(list(w.outputs))
    s.fuse(s.loops("row_max")[0], s.loops("row_sum")[0])
    s.fuse(s.loops("row_max")[0], s.loops("y")[0])
    return w, s


def _run(w, program, sizes, seed=0):
    ins = w.random_inputs(sizes, seed)
    outs = w.empty_outputs(sizes)
    interp.run(program, *w.call_args(ins, outs))
    for got, want in zip(outs, w.reference(*ins)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- bind_reduction


def test_bind_reduction_golden_nest_and_numerics():
    w, s = _softmax_schedule()
    i, k = s.loops("row_max")
    kt, ks = s.bind_reduction(k, threads=32)
    assert (kt.name, ks.name) == ("kt", "ks")
    text = str(s)
    assert "for kt in range(0, 32):  # threadIdx.x" in text
    assert "for ks in range(0, (n + 31) // 32):" in text
    assert "if ks * 32 + kt < n:" in text
    assert "row_max[i] = max(row_max[i], x[i, k])  # row_max (k = ks * 32 + kt)" in text
    _run(w, s.program, {"m": 3, "n": 70})


def test_bind_reduction_over_a_multiple_of_the_threads_runs_unguarded():
    # a row of 16*n16 (a call-time specialization's key n%16) over 16 threads: n16 steps each, no thread past the row
    w = workloads.softmax(n=16 * te.var("n16"))
    s = Schedule(list(w.outputs))
    _, k = s.loops("row_max")
    s.bind_reduction(k, threads=16)
    text = str(s)
    assert "for ks in range(0, n16):" in text and "if ks * 16 + kt" not in text
    rng = np.random.default_rng()
    for n16 in (1, 3):
        x = rng.standard_normal((3, 16 * n16)).astype(np.float32)
        y = np.full_like(x, np.nan)
        interp.run(s.program, x, y)
        np.testing.assert_allclose(y, w.reference(x)[0], rtol=1e-5, atol=1e-6)


def test_bind_reduction_without_threads_binds_the_loop_itself():
    w, s = _softmax_schedule(n=16)
    _, k = s.loops("row_sum")
    s.bind_reduction(k)
    assert "for k in range(0, 16):  # threadIdx.x" in str(s)
    _run(w, s.program, {"m": 4})


def test_bind_reduction_then_more_steps_stay_checkable():
    # bind_reduction rebases: later checks compare against the reassociated program
    w, s = _softmax_schedule()
    i = s.loops("row_max")[0]
    s.bind(i, "blockIdx.x")
    s.bind_reduction(s.loops("row_max")[1], threads=64)
    s.bind_reduction(s.loops("row_sum")[1], threads=64)
    jo, ji = s.split(s.loops("y")[1], 64)
    s.bind(ji, "threadIdx.x")
    _run(w, s.program, {"m": 3, "n": 130})
    assert "loopir_block_allreduce" in build(s, list(w.args), target="cuda").source


def _prefix_like():
    # C[0] accumulates A[k]; D[0] accumulates the running C[0]: reassociating k changes D
    from loopir import te

    b = ir.Builder("running")

    n = te.var("n")
    a = ir.buffer((n,), "float32", "A")
    c = ir.buffer((1,), "float32", "C")
    d = ir.buffer((1,), "float32", "D")
    with b.loop("k", 0, n) as k:
        b.store(c, (0,), c[0] + a[k], name="SC")
        b.store(d, (0,), d[0] + c[0], name="SD")
    return b.finish([a, c, d])


def test_bind_reduction_refuses_with_a_verified_witness():
    p = _prefix_like()
    s = Schedule(p)
    (k,) = s.loops("SC")
    with pytest.raises(ScheduleError) as ei:
        s.bind_reduction(k, threads=4)
    err = ei.value
    assert err.primitive == "bind_reduction" and err.buffer == "C"
    assert err.kind == "anti" and err.source[0] == "SD" and err.sink[0] == "SC"
    new, _ = bind_reduction(p, k.var, threads=4)
    # SD reads C[0] and SC writes C[0] (the access functions); the original runs the source first
    # and the new program — its thread loop run in order, one schedule threads allow — runs the sink
    # first. (witness_check reverses concurrent loops, the other extreme, which keeps this pair.)
    n = err.params["n"]
    src = ("SD", (err.source[1]["k"],))
    snk = ("SC", (err.sink[1]["k"],))
    for prog, sink_first in ((p, False), (new, True)):
        trace: list = []
        interp.run(prog, np.arange(1, n + 1, dtype=np.float32), np.zeros(1, np.float32),
                   np.zeros(1, np.float32), trace=trace)
        assert (trace.index(snk) < trace.index(src)) == sink_first
    assert str(s.program) == str(p)  # a refused step leaves the schedule unchanged


def test_bind_reduction_misuse():
    w, s = _softmax_schedule()
    i, j = s.loops("y")
    with pytest.raises(ValueError, match="statement 'y' inside loop 'j' is not a reduction"):
        s.bind_reduction(j, threads=32)
    _, k = s.loops("row_max")
    with pytest.raises(ValueError, match="blockIdx.x"):
        s.bind_reduction(k, axis="blockIdx.x")
    with pytest.raises(ValueError, match="threads"):
        s.bind_reduction(k, threads=0)
    with pytest.raises(ValueError, match="row_max_init"):
        s.bind_reduction(i, threads=32)  # the row loop holds the init statement, not a pure reduction


# ----------------------------------------------------------------------------- cache_read


def test_cache_read_golden_nest_numerics_and_cuda():
    w, s = _softmax_schedule(n=48)
    i = s.loops("row_max")[0]
    buf = s.cache_read("x", "shared", i)
    assert buf.name == "x_shared" and buf.scope == "shared" and [d.value for d in buf.shape] == [1, 48]
    text = str(s)
    assert "allocate(float32[1, 48], 'shared') as x_shared" in text
    assert "x_shared[c0, c1] = x[i + c0, c1]" in text
    assert text.count("sync_threads()") == 2  # after the copy, and before the next row's copy
    assert "max(row_max[i], x_shared[0, k])" in text
    _run(w, s.program, {"m": 5})
    # mapped to the GPU (bind the row loop first: the analysis treats the scratch buffer as one
    # buffer, not one per iteration): the copy is cooperative, one barrier (the row loop is a block)
    s2 = Schedule(list(w.outputs))
    s2.fuse(s2.loops("row_max")[0], s2.loops("row_sum")[0])
    s2.fuse(s2.loops("row_max")[0], s2.loops("y")[0])
    s2.bind(s2.loops("row_max")[0], "blockIdx.x")
    s2.cache_read("x", "shared", s2.loops("row_max")[0])
    assert str(s2).count("sync_threads()") == 1
    _, c1 = s2.loops("x_shared")[-2:]
    s2.bind(s2.split(c1, 32)[1], "threadIdx.x")
    s2.bind_reduction(s2.loops("row_max")[-1], threads=32)
    s2.bind_reduction(s2.loops("row_sum")[-1], threads=32)
    s2.bind(s2.split(s2.loops("y")[-1], 32)[1], "threadIdx.x")
    _run(w, s2.program, {"m": 3})
    src = build(s2, list(w.args), target="cuda").source
    # every phase maps element c to thread c mod 32 (the copy, both reductions, y): no thread reads what another
    # copied, so the lowering keeps the row in each thread's registers (codegen.passes.registers), 2 per thread
    assert "float x_shared_reg[2];  // local" in src and "__shared__ __align__(16) float x_shared" not in src
    s3 = Schedule(list(w.outputs))  # the y phase in chunks of 2 elements per thread: the mappings differ, shared
    s3.fuse(s3.loops("row_max")[0], s3.loops("row_sum")[0])
    s3.fuse(s3.loops("row_max")[0], s3.loops("y")[0])
    s3.bind(s3.loops("row_max")[0], "blockIdx.x")
    s3.cache_read("x", "shared", s3.loops("row_max")[0])
    _, c1 = s3.loops("x_shared")[-2:]
    s3.bind(s3.split(c1, 32)[1], "threadIdx.x")
    s3.bind_reduction(s3.loops("row_max")[-1], threads=32)
    s3.bind_reduction(s3.loops("row_sum")[-1], threads=32)
    s3.bind(s3.split(s3.split(s3.loops("y")[-1], 2)[0], 32)[1], "threadIdx.x")
    _run(w, s3.program, {"m": 3})
    src = build(s3, list(w.args), target="cuda").source
    assert re.search(r"__shared__ (__align__\(\d+\) )?float x_shared\[48\]", src) and "__syncthreads();" in src


def test_cache_read_local_scope_has_no_barrier():
    w, s = _softmax_schedule(n=8)
    s.cache_read("x", "local", s.loops("y")[0])
    assert "sync_threads" not in str(s) and "'local') as x_local" in str(s)
    _run(w, s.program, {"m": 3})


def test_cache_read_refuses_a_buffer_written_inside_the_loop():
    from loopir import te

    n = te.var("n")
    a = ir.buffer((n,), "float32", "A")
    bb = ir.buffer((n,), "float32", "B")
    b = ir.Builder("wr")
    with b.loop("i", 0, n) as i:
        b.store(a, (i,), a[i] * 2.0, name="SA")
        b.store(bb, (i,), a[i] + 1.0, name="SB")
    p = b.finish([a, bb])
    s = Schedule(p)
    (i,) = s.loops("SA")
    with pytest.raises(ScheduleError) as ei:
        s.cache_read("A", "local", i)
    err = ei.value
    assert err.kind == "flow" and err.buffer == "A" and err.source[0] == "SA" and err.sink[0] == "SB"
    new, _ = cache_read(p, "A", "local", i.var)
    # the copy runs before SA's write, so SB reads the stale value: the instances are rebased,
    # so check the witness against the original access functions only
    assert err.source[1] == err.sink[1]
    assert new is not p


def test_cache_read_misuse():
    w, s = _softmax_schedule()
    i = s.loops("row_max")[0]
    with pytest.raises(ValueError, match="scope"):
        s.cache_read("x", "global", i)
    with pytest.raises(ValueError, match="non-constant size"):
        s.cache_read("x", "shared", i)  # the row length n is symbolic
    with pytest.raises(ValueError, match="nope"):
        s.cache_read("nope", "shared", i)
    _, k = s.loops("row_max")
    with pytest.raises(ValueError, match="row_sum"):
        s.cache_read("row_sum", "shared", k)  # nothing inside k reads row_sum
