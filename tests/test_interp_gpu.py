"""The GPU mode of the reference interpreter (`interp.run(..., gpu_order=...)`, loopir/interp_gpu.py):
races show on the CPU, barriers that not every thread reaches are reported, correct kernels match numpy
under adversarial thread orders, and the model's decisions are the CUDA renderer's.

Cases flagged `needs_barriers` race as scheduled (checked here, before lowering) and are right after the
CUDA pipeline's barrier placement (codegen/passes/barriers.py)."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable

import gpu_programs as G
import numpy as np
import pytest

from loopir import interp, interp_gpu, interp_gpu_run, ir
from loopir.interp_gpu import BarrierDivergenceError, GpuMappingError
from loopir.nodes import For, Program, Seq, const

ADVERSARIAL = ("reversed", "forward", 0, 1, 2, 3, 4)


def _run(p: Program, *arrays: np.ndarray, order: object = None) -> list[np.ndarray]:
    out = [a.copy() for a in arrays]
    interp.run(p, *out, gpu_order=order)
    return out


def _x(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _nan(shape: tuple[int, ...]) -> np.ndarray:
    return np.full(shape, np.nan, np.float32)


# ----------------------------------------------------------------------------- (a) a race shows; a barrier fixes it


def test_racy_kernel_differs_from_the_serial_interpreter() -> None:
    # thread t reads A[b, t + 1], written by thread t + 1, with no barrier between the phases
    p = G.racy_shift(offset=1, barrier=False)
    X = _x((2, 33))
    want = G.racy_shift_reference(X, 1)
    np.testing.assert_array_equal(_run(p, X, _nan((2, 32)))[1], want)  # serial: phases in order, right
    for order in ("forward", 0, 1, 2, 3, 4):  # lower-numbered threads first / at random: read unwritten
        got = _run(p, X, _nan((2, 32)), order=order)[1]
        assert not np.array_equal(got, want), order
        assert np.isnan(got).any(), order  # reads of what no thread wrote yet: the temporary's NaN
    # "reversed" runs thread t + 1 (to the end of the block) before thread t: it reads right by construction
    np.testing.assert_array_equal(_run(p, X, _nan((2, 32)), order="reversed")[1], want)


def test_racy_kernel_reading_the_lower_thread_differs_under_reversed() -> None:
    p = G.racy_shift(offset=-1, barrier=False)
    X = _x((2, 33), 1)
    want = G.racy_shift_reference(X, -1)
    np.testing.assert_array_equal(_run(p, X, _nan((2, 32)))[1], want)
    got = _run(p, X, _nan((2, 32)), order="reversed")[1]
    assert not np.array_equal(got, want)
    assert np.isnan(got).all()  # thread t reads A[b, t - 1] before thread t - 1 wrote it


@pytest.mark.parametrize("offset", [1, -1])
@pytest.mark.parametrize("order", ADVERSARIAL)
def test_barrier_between_the_phases_fixes_the_race(offset: int, order: object) -> None:
    p = G.racy_shift(offset=offset, barrier=True)
    X = _x((2, 33), 2)
    got = _run(p, X, _nan((2, 32)), order=order)[1]
    np.testing.assert_array_equal(got, G.racy_shift_reference(X, offset))


def test_reversed_and_seeds_differ_from_each_other_in_order() -> None:
    # the trace lists statement instances in execution order: reversed runs thread 31's phase 1 first
    p = G.racy_shift(offset=1, barrier=True, blocks=1, threads=4)
    X = _x((1, 5))
    traces = {}
    for order in ("reversed", "forward", 3):
        tr: list = []
        interp.run(p, X.copy(), _nan((1, 4)), trace=tr, gpu_order=order)
        traces[order] = tr
    assert traces["reversed"][0] == ("W", (0, 4)) and traces["forward"][0] == ("W", (0, 0))
    assert sorted(traces["reversed"]) == sorted(traces["forward"]) == sorted(traces[3])
    # the barrier: every W before any R, in every order
    for tr in traces.values():
        kinds = [name for name, _ in tr]
        assert kinds == ["W"] * 5 + ["R"] * 4


# ----------------------------------------------------------------------------- (b) correct kernels match numpy


@pytest.mark.parametrize("name,m,n", [("softmax", 3, 37), ("softmax", 2, 130), ("softmax", 4, 8),
                                      ("layernorm", 3, 37), ("layernorm", 2, 260)])
@pytest.mark.parametrize("order", ("reversed", "forward", 0, 7))
def test_auto_scheduled_row_kernels_match_numpy(name: str, m: int, n: int, order: object) -> None:
    G.check(G.workload(name, m=m, n=n), order)


def _specs(specs: tuple) -> list[object]:
    return [pytest.param(spec, id=G.spec_id(spec), marks=()) for spec in specs]


@pytest.mark.parametrize("spec", _specs(G.ATTENTION))
@pytest.mark.parametrize("order", ("reversed", "forward", 0, 1))
def test_attention(spec: tuple, order: object) -> None:
    """The issue's repro: one fused kernel per (b, i). Small d: correct today (p inlined; cross-thread reads
    follow a cross-thread reduction). d >= 32: p is materialized and read by every thread: needs barriers."""
    f, args, _ = spec
    G.check(f(*args), order)


@pytest.mark.parametrize("spec", _specs(G.PAIRS))
@pytest.mark.parametrize("order", ("reversed", "forward", 0, 1))
def test_producer_consumer_pairs(spec: tuple, order: object) -> None:
    f, args, _ = spec
    G.check(f(*args), order)


@pytest.mark.parametrize("spec", [s for s in G.ATTENTION + G.PAIRS if s[2]], ids=G.spec_id)
def test_the_racy_cases_race_without_barriers(spec: tuple) -> None:
    """Each case marked "needs place_barriers" really needs barriers: as scheduled, without the lowering
    passes, it is right in the serial mode and wrong in some adversarial order (so the tests above, once the
    pass lands, check the barriers it places)."""
    f, args, _ = spec
    case = f(*args)
    assert case.needs_barriers
    got, want = case.run(None, lower=False)
    assert G.close(got, want, case.tolerance)
    results = []
    for order in ("reversed", "forward", 0):
        got, want = case.run(order, lower=False)
        results.append(G.close(got, want, case.tolerance))
    assert not all(results)


# ----------------------------------------------------------------------------- (c) barrier divergence


def _diverging(kind: str) -> Program:
    n = 2
    X = ir.buffer((n, 32), name="X")
    Y = ir.buffer((n, 32), name="Y")
    b = ir.Builder(f"diverge_{kind}")
    with b.loop("blk", 0, n) as blk:
        with b.loop("tx", 0, 32) as tx:
            b.store(Y, (blk, tx), X[blk, tx] * 2.0, name="A")
            if kind == "if":  # only half of the threads reach the barrier
                with b.if_(tx < 16):
                    b.barrier()
            else:  # two different barriers
                with b.if_(tx < 16):
                    b.barrier()
                with b.else_():
                    b.store(Y, (blk, tx), Y[blk, tx] + 1.0, name="B")
                    b.barrier()
            b.store(Y, (blk, tx), Y[blk, tx] + 1.0, name="C")
    return G.bind_loops(b.finish([X, Y]), {"blk": "blockIdx.x", "tx": "threadIdx.x"})


@pytest.mark.parametrize("order", ("reversed", "forward", 5))
def test_barrier_reached_by_some_threads_is_divergence(order: object) -> None:
    p = _diverging("if")
    with pytest.raises(BarrierDivergenceError, match=r"barrier divergence: .*wait at barrier after statement 'A'"
                       r".*finished the kernel"):
        interp.run(p, _x((2, 32)), _nan((2, 32)), gpu_order=order)
    interp.run(p, _x((2, 32)), _nan((2, 32)))  # the serial mode does not see barriers


def test_threads_at_different_barriers_is_divergence() -> None:
    p = _diverging("else")
    with pytest.raises(BarrierDivergenceError) as e:
        interp.run(p, _x((2, 32)), _nan((2, 32)), gpu_order="reversed")
    msg = str(e.value)
    assert "threads (0, 0, 0), (1, 0, 0), (2, 0, 0), (3, 0, 0) and 12 more wait at barrier after statement 'A'" \
        in msg, msg
    assert "threads (16, 0, 0), (17, 0, 0), (18, 0, 0), (19, 0, 0) and 12 more wait at barrier after statement 'B'" \
        in msg, msg


def test_barrier_in_a_guarded_thread_loop_is_divergence() -> None:
    # two loops bound to threadIdx.x in one kernel, extents 32 and 8: the block has 32 threads and the
    # barrier inside the second loop is reached by 8 of them
    X = ir.buffer((32,), name="X")
    Y = ir.buffer((32,), name="Y")
    b = ir.Builder("guarded")
    with b.loop("blk", 0, 1):
        with b.loop("t", 0, 32) as t:
            b.store(Y, t, X[t], name="A")
        with b.loop("u", 0, 8) as u:
            b.barrier()
            b.store(Y, u, Y[u] + 1.0, name="B")
    p = G.bind_loops(b.finish([X, Y]), {"blk": "blockIdx.x", "t": "threadIdx.x", "u": "threadIdx.x"})
    with pytest.raises(BarrierDivergenceError, match="threads .* wait at barrier after statement 'A'.*finished"):
        interp.run(p, _x((32,)), _nan((32,)), gpu_order=0)


# ----------------------------------------------------------------------------- what the renderer does, modelled


def _reduction_then_read(read: str, barrier: bool) -> Program:
    """Per block b: C[b, 0] = 0; a cross-thread reduction C[b, 0] += X[b, t] over 64 threads (no barrier after
    it); then every thread t stores Y[b, t] = C[b, <read>] + X[b, t]."""
    n, T = 3, 64
    X = ir.buffer((n, T), name="X")
    C = ir.buffer((n, 1), name="C")
    Y = ir.buffer((n, T), name="Y")
    b = ir.Builder(f"red_{read}{'_sync' if barrier else ''}")
    with b.loop("blk", 0, n) as blk:
        b.store(C, (blk, 0), 0.0, name="C_init")
        with b.loop("t", 0, T) as t:
            b.store(C, (blk, 0), C[blk, 0] + X[blk, t], name="C_red")
        if barrier:
            b.barrier()
        with b.loop("t2", 0, T) as t2:
            idx = const(0) if read == "same" else t2 - t2  # structurally different: not the register
            b.store(Y, (blk, t2), C[blk, idx] + X[blk, t2], name="Y")
    return G.bind_loops(b.finish([X, C, Y]), {"blk": "blockIdx.x", "t": "threadIdx.x", "t2": "threadIdx.x"})


@pytest.mark.parametrize("order", ADVERSARIAL)
def test_cross_thread_reduction_total_is_forwarded_to_later_loads(order: object) -> None:
    p = _reduction_then_read("same", barrier=False)
    assert interp_gpu_run.plan(p, {})[0]["collectives"] == ("C_red",)
    X = _x((3, 64))
    _, C, Y = _run(p, X, _nan((3, 1)), _nan((3, 64)), order=order)
    tot = X.astype(np.float64).sum(axis=1)
    np.testing.assert_allclose(C[:, 0], tot, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(Y, tot[:, None] + X, rtol=1e-5, atol=1e-5)


def test_no_barrier_after_a_cross_thread_reduction() -> None:
    # a load the renderer does not forward reads memory, which thread 0 writes after the reduction: a race
    X = _x((3, 64), 4)
    want = X.astype(np.float64).sum(axis=1)[:, None] + X
    racy = _reduction_then_read("other", barrier=False)
    _, _, Y = _run(racy, X, _nan((3, 1)), _nan((3, 64)), order="reversed")
    assert not np.allclose(Y, want, rtol=1e-5, atol=1e-5)
    for order in ADVERSARIAL:
        _, _, Y = _run(_reduction_then_read("other", barrier=True), X, _nan((3, 1)), _nan((3, 64)), order=order)
        np.testing.assert_allclose(Y, want, rtol=1e-5, atol=1e-5)


def test_renderer_implicit_syncs_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    # the renderer still adds __syncthreads() after a cross-thread reduction; modelling it fixes the race above
    monkeypatch.setattr(interp_gpu, "RENDERER_IMPLICIT_SYNCS", True)
    X = _x((3, 64), 4)
    _, _, Y = _run(_reduction_then_read("other", barrier=False), X, _nan((3, 1)), _nan((3, 64)), order="reversed")
    np.testing.assert_allclose(Y, X.astype(np.float64).sum(axis=1)[:, None] + X, rtol=1e-5, atol=1e-5)


def test_cross_thread_reduction_combines_like_the_warp_shuffles() -> None:
    # integers: the total is exact whatever the order; floats: the block all-reduce's tree order
    vals = [np.float32(v) for v in _x((128,), 9)]
    fn = np.add
    tree = interp_gpu_run._block_allreduce(vals, fn, np.float32(0))
    # lane 0 of warp w: ((v0 + v16) + (v8 + v24)) + ...; then warps 0..3 the same way
    def warp(v: list) -> np.float32:
        v = list(v)
        for o in (16, 8, 4, 2, 1):
            v = [fn(v[i], v[i + o]) if i + o < 32 else v[i] for i in range(32)]
        return v[0]
    warps = [warp(vals[w:w + 32]) for w in range(0, 128, 32)]
    assert tree == warp(warps + [np.float32(0)] * 28)
    assert tree.dtype == np.float32


@pytest.mark.parametrize("order", ADVERSARIAL)
def test_read_modify_write_outside_thread_loops_runs_on_thread_zero(order: object) -> None:
    # S[b] = S[b] + A[b, 0] at thread depth 0 reads its own buffer: thread (0, 0, 0) alone applies it
    X = ir.buffer((2, 32), name="X")
    S = ir.buffer((2,), name="S")
    b = ir.Builder("rmw")
    A = b.temp((2, 32), name="A")
    with b.loop("blk", 0, 2) as blk:
        with b.loop("t", 0, 32) as t:
            b.store(A, (blk, t), X[blk, t] * 2.0, name="W")
        b.barrier()
        b.store(S, blk, S[blk] + A[blk, 0], name="U")
    p = G.bind_loops(b.finish([X, S]), {"blk": "blockIdx.x", "t": "threadIdx.x"})
    assert interp_gpu_run.plan(p, {})[0]["thread0"] == ("U",)
    Xa = _x((2, 32))
    S0 = np.array([1.0, -1.0], np.float32)
    _, Sa = _run(p, Xa, S0, order=order)
    np.testing.assert_array_equal(Sa, S0 + Xa[:, 0] * np.float32(2))


def test_lost_updates_show_at_random_orders() -> None:
    # threadIdx.y threads all add into R[b] (not a cross-thread reduction: those are threadIdx.x loops): the
    # loads and the store of one statement are separate steps, so some seed loses an update
    X = ir.buffer((2, 8), name="X")
    R = ir.buffer((2,), name="R")
    b = ir.Builder("lost")
    with b.loop("blk", 0, 2) as blk:
        with b.loop("ty", 0, 8) as ty:
            b.store(R, blk, R[blk] + X[blk, ty], name="U")
    p = G.bind_loops(b.finish([X, R]), {"blk": "blockIdx.x", "ty": "threadIdx.y"})
    Xa = np.arange(16, dtype=np.float32).reshape(2, 8)
    want = Xa.sum(axis=1)
    assert np.array_equal(_run(p, Xa, np.zeros(2, np.float32), order="reversed")[1], want)
    assert any(not np.array_equal(_run(p, Xa, np.zeros(2, np.float32), order=s)[1], want) for s in range(5))


def test_shared_buffers_are_per_block_and_start_as_nan() -> None:
    # a shared row written by threads 0..7 of each block, read at column t + 4 by thread t (with a barrier):
    # columns 8..11 were never written in this block -> NaN, never another block's values
    X = ir.buffer((3, 8), name="X")
    Y = ir.buffer((3, 8), name="Y")
    b = ir.Builder("smem")
    with b.loop("blk", 0, 3) as blk:
        with b.allocate((12,), "float32", "S", scope="shared") as S:
            with b.loop("t", 0, 8) as t:
                b.store(S, t, X[blk, t] + 1.0, name="W")
            b.barrier()
            with b.loop("t2", 0, 8) as t2:
                b.store(Y, (blk, t2), S[t2 + 4], name="R")
    p = G.bind_loops(b.finish([X, Y]), {"blk": "blockIdx.x", "t": "threadIdx.x", "t2": "threadIdx.x"})
    Xa = _x((3, 8))
    for order in ("reversed", "forward", 1):
        Y_ = _run(p, Xa, _nan((3, 8)), order=order)[1]
        np.testing.assert_array_equal(Y_[:, :4], Xa[:, 4:] + np.float32(1))
        assert np.isnan(Y_[:, 4:]).all()


def test_local_buffers_are_private_per_thread() -> None:
    X = ir.buffer((64,), name="X")
    Y = ir.buffer((64,), name="Y")
    b = ir.Builder("local")
    with b.loop("t", 0, 64) as t:
        # (a store at an index that no loop inside t changes would be taken for a cross-thread write by the
        # renderer, local or not: the scratch is indexed by an inner loop, as cache_write's are)
        with b.allocate((2,), "float32", "L", scope="local") as L:
            with b.loop("j", 0, 2) as j:
                b.store(L, j, X[t] * 3.0, name="W")
            b.store(Y, t, L[1] + L[0], name="R")
    p = G.bind_loops(b.finish([X, Y]), {"t": "threadIdx.x"})
    Xa = _x((64,))
    for order in ("reversed", 3):
        want = Xa * np.float32(3) + Xa * np.float32(3)
        np.testing.assert_array_equal(_run(p, Xa, _nan((64,)), order=order)[1], want)


def test_bounds_checks_stay() -> None:
    X = ir.buffer((8,), name="X")
    Y = ir.buffer((8,), name="Y")
    b = ir.Builder("oob")
    with b.loop("t", 0, 8) as t:
        b.store(Y, t, X[t + 1], name="R")
    p = G.bind_loops(b.finish([X, Y]), {"t": "threadIdx.x"})
    with pytest.raises(IndexError, match="load of buffer 'X' at index \\(8,\\) is out of bounds") as e:
        interp.run(p, _x((8,)), _nan((8,)), gpu_order="reversed")
    assert "thread (7, 0, 0)" in "".join(getattr(e.value, "__notes__", []))


def test_host_loop_of_launches() -> None:
    # For(kind="host") around two kernels: a serial loop of launches (its variable is a kernel argument)
    X = ir.buffer((4, 16), name="X")
    b = ir.Builder("host")
    with b.loop("h", 1, 4) as h:
        with b.loop("t", 0, 16) as t:
            b.store(X, (h, t), X[h - 1, t] * 2.0 + X[h, t], name="K1")
        with b.loop("u", 0, 16) as u:
            b.store(X, (h, u), X[h, u] + 1.0, name="K2")
    p = G.bind_loops(b.finish([X]), {"t": "threadIdx.x", "u": "threadIdx.x"})
    outer = p.body.body[0] if isinstance(p.body, Seq) else p.body
    assert isinstance(outer, For)
    hosted = Program(p.name, p.args, For(outer.var, outer.lo, outer.hi, outer.body, "host"), p.temps, p.params)
    Xa = _x((4, 16))
    want = _run(hosted, Xa)[0]
    for order in ("reversed", 2):
        np.testing.assert_array_equal(_run(hosted, Xa, order=order)[0], want)
    assert len(interp_gpu_run.compiled(hosted).kernels) == 2


def test_unbound_nest_and_bad_orders_are_refused() -> None:
    X = ir.buffer((8,), name="X")
    b = ir.Builder("cpu_only")
    with b.loop("i", 0, 8) as i:
        b.store(X, i, X[i] + 1.0, name="S")
    p = b.finish([X])
    with pytest.raises(GpuMappingError, match="loop 'i' .* is not bound to a GPU axis"):
        interp.run(p, _x((8,)), gpu_order="reversed")
    q = G.bind_loops(p, {"i": "threadIdx.x"})
    for bad in (True, "backwards", 1.5):
        with pytest.raises(ValueError, match="gpu_order must be None, 'reversed', 'forward' or an int seed"):
            interp.run(q, _x((8,)), gpu_order=bad)


def test_scalar_statement_is_a_one_thread_kernel() -> None:
    X = ir.buffer((4,), name="X")
    b = ir.Builder("scalar")
    b.store(X, 0, X[0] + X[1], name="S")
    p = b.finish([X])
    Xa = _x((4,))
    assert interp_gpu_run.plan(p, {})[0]["block"] == (1, 1, 1)
    np.testing.assert_array_equal(_run(p, Xa, order="reversed")[0], _run(p, Xa)[0])


# ----------------------------------------------------------------------------- the model is the renderer's


def _renderer_plan(p: Program) -> list[dict]:
    from codegen.cuda import generate_cuda
    from codegen.passes import lower

    src = generate_cuda(lower(p, "cuda"))
    texts = src.source.split('extern "C" __global__ void ')[1:]
    out = []
    for k, text in zip(src.kernels, texts):
        grid, block = k.launch.dims({})
        t0 = r"if \(threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0\) \{\n\s*\{  // (\w+)"
        out.append({"grid": grid, "block": block, "statements": k.stmt_names,
                    "collectives": tuple(dict.fromkeys(re.findall(r"// (\w+): this thread's share", text))),
                    "cooperative": tuple(dict.fromkeys(re.findall(r"// (\w+): cooperative copy of", text))),
                    "thread0": tuple(dict.fromkeys(re.findall(t0, text))),
                    "from_init": tuple(re.findall(r"const \w+ (\w+?)_before(?:_\d+)? = .*as initialized above", text))})
    return out


@functools.cache
def _gemm(n: int, m: int, p: int, **params: object) -> Program:
    from loopir import te
    from schedules import auto_schedule

    A = te.placeholder((n, p), name="A")
    B = te.placeholder((p, m), name="B")
    k = te.reduce_axis(p, "k")
    C = te.compute((n, m), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    return auto_schedule([C], target="cuda", gemm=params).program


_PLAN_CASES: dict[str, Callable[[], Program]] = {
    "attention_d8": lambda: G.attention(2, 5, 37, 8).lowered(),
    "attention_d32": lambda: G.attention(2, 5, 37, 32).lowered(),
    "softmax": lambda: G.workload("softmax", m=3, n=37).lowered(),
    "layernorm": lambda: G.workload("layernorm", m=2, n=260).lowered(),
    **{G.spec_id(s): (lambda s=s: s[0](*s[1]).lowered()) for s in G.PAIRS},
    "racy_shift": lambda: G.racy_shift(1, True),
    "reduction": lambda: _reduction_then_read("same", False),
    "gemm_div": lambda: _gemm(32, 64, 32, block=(32, 64), thread_tile=(4, 4), k_tile=8),
    "gemm_nondiv": lambda: _gemm(20, 36, 13, block=(16, 32), thread_tile=(4, 4), k_tile=8),
}


@pytest.mark.parametrize("name", list(_PLAN_CASES))
def test_model_decisions_are_the_renderers(name: str) -> None:
    """Launch shapes, cross-thread reductions, cooperative copies and thread-0 statements: the model
    (duplicated from codegen/cuda*.py, which loopir may not import) agrees with the CUDA source."""
    from codegen.passes import lower

    program = _PLAN_CASES[name]()
    mine = interp_gpu_run.plan(lower(program, "cuda"), {})  # what the renderer sees (e.g. padded tile copies)
    theirs = _renderer_plan(program)
    assert len(mine) == len(theirs)
    for a, b in zip(mine, theirs):
        assert {k: a[k] for k in b} == b, name


def test_gemm_kernels_with_cooperative_copies_match_numpy() -> None:
    for (n, m, p, params) in [(32, 64, 32, dict(block=(32, 64), thread_tile=(4, 4), k_tile=8)),
                              (20, 36, 13, dict(block=(16, 32), thread_tile=(4, 4), k_tile=8))]:
        prog = _gemm(n, m, p, **params)
        A, B = _x((n, p), 1), _x((p, m), 2)
        for order in ("reversed", "forward", 0):
            C = _run(prog, A, B, _nan((n, m)), order=order)[2]
            np.testing.assert_allclose(C, A.astype(np.float64) @ B, rtol=1e-4, atol=1e-4)


def test_kernel_statements_are_counted_once_per_instance() -> None:
    # every thread runs the whole body, but each statement instance of a thread loop is executed once
    p = G.racy_shift(offset=1, barrier=True, blocks=2, threads=32)
    tr_serial: list = []
    tr_gpu: list = []
    X = _x((2, 33))
    interp.run(p, X.copy(), _nan((2, 32)), trace=tr_serial)
    interp.run(p, X.copy(), _nan((2, 32)), trace=tr_gpu, gpu_order=11)
    assert sorted(tr_serial) == sorted(tr_gpu)
