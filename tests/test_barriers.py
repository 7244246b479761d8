"""codegen.passes.barriers: exact block-barrier placement, and the refusals it owes."""

from __future__ import annotations

import re

import numpy as np
import pytest

import gpu_programs as G

from codegen import build
from codegen.passes import lower, pipeline
from codegen.passes.barriers import BarrierError, CrossBlockRaceError, place_barriers
from codegen.passes.kernels import split_kernels
from codegen.passes.launch import plan_kernels
from loopir import interp, ir, te, workloads
from loopir import nodes as N
from loopir.visit import walk
from schedules import Schedule, ScheduleError, auto_schedule
from tests.witness_check import verify_witness


def _barriers(s: N.Stmt | N.Program) -> int:
    body = s.body if isinstance(s, N.Program) else s
    return sum(isinstance(n, N.Barrier) for n in walk(body))


def _place(p: N.Program) -> N.Program:
    """The CUDA pipeline up to and including barrier placement."""
    return place_barriers(plan_kernels(split_kernels(p)))


def _two_phase(read: str, n: int = 4, m: int = 64) -> tuple[N.Program, N.Buffer, N.Buffer]:
    """Per block i: phase 1 writes t[i, j] on thread j, phase 2 reads t at another thread's position."""
    x = ir.buffer((n, m), name="x")
    y = ir.buffer((n, m), name="y")
    b = ir.Builder("two_phase")
    t = b.temp((n, m), name="t")
    with b.loop("i", 0, n) as i:
        with b.loop("j", 0, m) as j:
            b.store(t, (i, j), x[i, j] * 2.0 + 1.0, name="P")
        with b.loop("k", 0, m) as k:
            idx = {"same": k, "reversed": m - 1 - k, "shifted": (k + 1) % m}[read]
            b.store(y, (i, k), t[i, idx] + x[i, k], name="C")
    return b.finish([x, y]), x, y


def _bind_two_phase(read: str) -> tuple[Schedule, N.Buffer, N.Buffer]:
    p, x, y = _two_phase(read)
    s = Schedule(p)
    s.bind(s.loop("i"), "blockIdx.x").bind(s.loop("j"), "threadIdx.x").bind(s.loop("k"), "threadIdx.x")
    return s, x, y


@pytest.mark.parametrize("read", ["reversed", "shifted"])
def test_consumer_reading_other_threads_gets_one_barrier(read: str) -> None:
    s, _, _ = _bind_two_phase(read)
    assert _barriers(s.program) == 0
    low = _place(s.program)
    assert _barriers(low) == 1
    # the barrier stands between the producer's thread loop and the consumer's
    assert isinstance(low.body, N.Kernel)
    blk = low.body.body
    assert isinstance(blk, N.For) and isinstance(blk.body, N.Seq)
    kinds = [type(c).__name__ for c in blk.body.body]
    assert kinds == ["For", "Barrier", "For"]


def test_same_thread_consumer_needs_no_barrier() -> None:
    """Exact, not conservative: thread k reads only what thread k wrote."""
    s, _, _ = _bind_two_phase("same")
    low = _place(s.program)
    assert _barriers(low) == 0 and isinstance(low.body, N.Kernel)


def test_cuda_source_has_the_barrier_and_compiles() -> None:
    s, x, y = _bind_two_phase("reversed")
    mod = build(s, [x, y], target="cuda")
    src = mod.source
    k1 = src.index("// P")
    k2 = src.index("// C")
    assert "__syncthreads();" in src[k1:k2]


def test_numerics_match_after_lowering_on_cpu() -> None:
    s, x, y = _bind_two_phase("reversed")
    rng = np.random.default_rng(1)
    xa = rng.standard_normal((4, 64)).astype(np.float32)
    want = np.full((4, 64), np.nan, np.float32)
    interp.run(_two_phase("reversed")[0], xa, want)
    got = np.full((4, 64), np.nan, np.float32)
    interp.run(lower(s.program, "cuda"), xa, got)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_allclose(got, (xa * 2 + 1)[:, ::-1] + xa, rtol=1e-6)


def _looped_shared(m: int = 32, steps: int = 3) -> Schedule:
    """A serial loop inside the block: each step a shared row is written by thread j and read shifted by k."""
    x = ir.buffer((steps, m), name="x")
    y = ir.buffer((steps, m), name="y")
    b = ir.Builder("looped")
    with b.loop("i", 0, 1):
        with b.loop("s", 0, steps) as st:
            with b.allocate((m,), name="sh", scope="shared") as sh:
                with b.loop("j", 0, m) as j:
                    b.store(sh, (j,), x[st, j] + 1.0, name="W")
                with b.loop("k", 0, m) as k:
                    b.store(y, (st, k), sh[(k + 1) % m], name="R")
    s = Schedule(b.finish([x, y]))
    s.bind(s.loop("i"), "blockIdx.x").bind(s.loop("j"), "threadIdx.x").bind(s.loop("k"), "threadIdx.x")
    return s


def test_loop_carried_reuse_of_shared_memory_gets_a_trailing_barrier() -> None:
    """Iteration s+1 overwrites `sh` while slow threads of iteration s may still read it (WAR)."""
    low = _place(_looped_shared().program)
    loop_s = next(n for n in walk(low.body) if isinstance(n, N.For) and n.var.name == "s")
    items = _flat(loop_s.body)
    # between the write and the read (flow), and after the read (the next step's write)
    assert items == ["For", "Barrier", "For", "Barrier"], items


def _flat(s: N.Stmt) -> list[str]:
    """The kinds of a body's children, looking through Seq and Allocate."""
    if isinstance(s, N.Seq):
        return [k for c in s.body for k in _flat(c)]
    if isinstance(s, N.Allocate):
        return _flat(s.body)
    return [type(s).__name__]


def test_existing_barriers_are_counted() -> None:
    s = _looped_shared()
    low = _place(s.program)
    assert place_barriers(low) is low


def test_attention_fused_gets_exact_barriers_and_compiles() -> None:
    case = G.attention(2, 8, 40, 32)  # the naive attention, fused into one kernel by auto_schedule
    low = lower(case.program, "cuda")
    assert _barriers(low) > _barriers(case.program)
    build(case.program, list(case.program.args), target="cuda")


def test_thread_dependent_trip_count_cannot_hold_a_barrier() -> None:
    """A barrier needed inside a loop whose trip count depends on the thread is refused, never emitted."""
    m = 64
    x = ir.buffer((m,), name="x")
    y = ir.buffer((m,), name="y")
    b = ir.Builder("diverge")
    with b.loop("i", 0, 1):
        with b.loop("t", 0, m) as t:
            with b.loop("s", 0, t % 2 + 1):  # thread t runs it once or twice
                with b.allocate((m,), name="sh", scope="shared") as sh:
                    b.store(sh, (t,), x[t] + 1.0, name="W")
                    b.store(y, (t,), sh[(t + 1) % m], name="R")
    s = Schedule(b.finish([x, y]), check=False)  # the point is the pass's own refusal
    s.bind(s.loop("i"), "blockIdx.x").bind(s.loop("t"), "threadIdx.x")
    with pytest.raises(BarrierError, match="threads may not all reach") as ei:
        _place(s.program)
    assert "'W'" in str(ei.value) and "'R'" in str(ei.value) and "'s'" in str(ei.value)


def test_guarded_thread_loop_gets_a_predicated_barrier() -> None:
    """Rows that do not fill the block: the guard around the barrier becomes a predicate in the source."""
    # the producer's loop spans 64 threads, the consumer's only 40: the consumer is guarded
    x2 = ir.buffer((4, 64), name="x")
    y2 = ir.buffer((4, 64), name="y")
    b = ir.Builder("guarded")
    t = b.temp((4, 64), name="t")
    with b.loop("i", 0, 4) as i:
        with b.loop("j", 0, 64) as j:
            b.store(t, (i, j), x2[i, j] * 2.0, name="P")
        with b.loop("k", 0, 40) as k:
            with b.loop("r", 0, 2):
                with b.allocate((64,), name="sh", scope="shared") as sh:
                    b.store(sh, (k,), t[i, 63 - k] + 1.0, name="W")
                    # the neighbour's element, written earlier in program order by thread k - 1
                    b.store(y2, (i, k), sh[N.binary("max", k - 1, 0)], name="R")
    s2 = Schedule(b.finish([x2, y2]), check=False)
    s2.bind(s2.loop("i"), "blockIdx.x").bind(s2.loop("j"), "threadIdx.x").bind(s2.loop("k"), "threadIdx.x")
    low = _place(s2.program)
    assert _barriers(low) >= 2
    src = build(s2, [x2, y2], target="cuda").source
    assert "pred" in src and "__syncthreads();" in src


def _cross_block_program() -> N.Program:
    """Block i writes A[i]; the same kernel's block i then reads A[i + 1], which block i + 1 writes."""
    n = 8
    x = ir.buffer((n + 1,), name="x")
    y = ir.buffer((n,), name="y")
    a = ir.buffer((n + 1,), name="a")
    b = ir.Builder("cross")
    with b.loop("i", 0, n) as i:
        with b.loop("j", 0, 1):
            b.store(a, (i,), x[i] * 2.0, name="P")
        with b.loop("k", 0, 1):
            b.store(y, (i,), a[i + 1], name="C")
    return b.finish([x, a, y])


def test_bind_to_blocks_refuses_a_cross_block_dependence_with_a_witness() -> None:
    p = _cross_block_program()
    s = Schedule(p)
    with pytest.raises(ScheduleError) as ei:
        s.bind(s.loop("i"), "blockIdx.x")
    verify_witness(p, _forced(p), ei.value)


def _forced(p: N.Program) -> N.Program:
    s = Schedule(p, check=False)
    s.bind(s.loop("i"), "blockIdx.x")
    return s.program


def test_the_pass_refuses_a_cross_block_race_it_is_handed() -> None:
    """Even a schedule forced past the checks never becomes a racing kernel."""
    p = _forced(_cross_block_program())
    s = Schedule(p, check=False)  # the checks refuse every bind of it already (the block loop carries the dependence)
    s.bind(s.loop("j"), "threadIdx.x").bind(s.loop("k"), "threadIdx.x")
    with pytest.raises(CrossBlockRaceError) as ei:
        _place(s.program)
    e = ei.value
    assert e.buffer == "a"
    (sn, si), (tn, ti) = e.source, e.sink
    assert {sn, tn} == {"P", "C"}
    # the witness is real: the two instances touch one element of `a`, in different blocks
    wi = si["i"] if sn == "P" else ti["i"]
    ri = ti["i"] if tn == "C" else si["i"]
    assert wi == ri + 1
    assert e.blocks[0] != e.blocks[1]


def test_dump_passes_prints_each_pass(capsys: pytest.CaptureFixture[str]) -> None:
    s, x, y = _bind_two_phase("reversed")
    build(s, [x, y], target="cuda", dump_passes=True)
    out = capsys.readouterr().out
    for p in pipeline("cuda"):
        assert f"after pass {p.name}" in out
    assert "sync_threads()" in out


def test_te_softmax_keeps_one_barrier_per_reduction() -> None:
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), "float32", name="x")
    k = te.reduce_axis(m, "k")
    mx = te.compute((n,), lambda i: te.max(x[i, k], axis=k), name="mx")
    e = te.compute((n, m), lambda i, j: te.exp(x[i, j] - mx[i]), name="e")
    k2 = te.reduce_axis(m, "k2")
    sm = te.compute((n,), lambda i: te.sum(e[i, k2], axis=k2), name="sm")
    y = te.compute((n, m), lambda i, j: e[i, j] / sm[i], name="y")
    s = auto_schedule([y], target="cuda")
    low = lower(s.program, "cuda")
    # the row's max and sum travel in registers (codegen.passes.forwarded): their temporaries are never read from
    # memory, so nothing orders their stores; the all-reduces synchronise inside themselves
    (k,) = [n for n in walk(low.body) if isinstance(n, N.Kernel)]
    assert k.forwarded == {"mx", "sm"} and _barriers(low) == 0
    src = build(s, [x, y], target="cuda").source
    assert not re.search(r"\b(mx|sm)\[[^.]*\] =", src) and src.count("loopir_block_allreduce(") >= 2
    s2 = auto_schedule([y], target="cuda", fuse=False)  # apart: each total is read by the next kernel, from memory
    low2 = lower(s2.program, "cuda")
    assert not any(n.forwarded for n in walk(low2.body) if isinstance(n, N.Kernel))


@pytest.mark.parametrize("name, dtype, m, n", [("layernorm", "float16", 37, 768), ("softmax", "float32", 19, 96)])
def test_warp_rows_forward_their_totals_too(name: str, dtype: str, m: int, n: int) -> None:
    """Warp rows (a row per lane group, rows on threadIdx.y): each row's init runs under its row's threadIdx.y loop,
    by every lane of the reduction across threadIdx.x. The totals travel in registers as in block rows: no store to
    the temporaries, no barrier; the lowered program matches float64 in reversed, forward and shuffled orders."""
    from tests.test_register_rows import _inputs, check_thread_orders

    wl = getattr(workloads, name)(m=m, n=n, dtype=dtype)
    s = auto_schedule(list(wl.outputs), target="cuda")
    assert any(g.mapping == "warp" for g in s.plan.groups)
    low = lower(s.program, "cuda")
    (k,) = [n for n in walk(low.body) if isinstance(n, N.Kernel)]
    temps = {t.name for t in low.temps}
    assert k.forwarded == temps and len(temps) == 2 and _barriers(low) == 0
    src = build(s, list(wl.inputs) + list(wl.outputs), target="cuda").source
    assert not any(re.search(rf"\b{t}\[[^\]]*\] =", src) for t in temps)
    check_thread_orders(low, name, _inputs(wl, m, n, dtype, seed=m), dtype)


@pytest.mark.parametrize("T", [1, 3])
def test_a_forwarded_total_over_a_size_1_axis_is_read_from_its_register(T: int) -> None:
    """Layer norm over (B, T, C) with T = 1: the statements name the row (i, t = 0), so the flat index of the
    total's element is `i * 1 + t` with t substituted. The GPU interpreter matched a later load to the total
    only when its indices were substituted before flattening, as the renderer's forward_key does (it read the
    never-stored temporary otherwise: wrong in reversed order). Forwarded, no barrier, right in every order."""
    B, C = 5, 64
    x = te.placeholder((B, T, C), name="x")
    k, k2 = te.reduce_axis(C, "k"), te.reduce_axis(C, "k2")
    mu = te.compute((B, T), lambda b, t: te.sum(x[b, t, k] / 64.0, axis=k), name="mu")
    var = te.compute((B, T), lambda b, t: te.sum((x[b, t, k2] - mu[b, t]) * (x[b, t, k2] - mu[b, t]) / 64.0,
                                                 axis=k2), name="var")
    y = te.compute((B, T, C), lambda b, t, c: (x[b, t, c] - mu[b, t]) * te.rsqrt(var[b, t] + 1e-5), name="y")
    low = lower(auto_schedule([y], "cuda").program, "cuda")
    (kern,) = [n for n in walk(low.body) if isinstance(n, N.Kernel)]
    assert kern.forwarded == {"mu", "var"} and _barriers(low) == 0
    a = np.random.default_rng(T).standard_normal((B, T, C)).astype(np.float32)
    m = a.astype(np.float64).mean(-1, keepdims=True)
    want = (a - m) / np.sqrt(((a - m) ** 2).mean(-1, keepdims=True) + 1e-5)
    for order in ("reversed", "forward", 3):
        got = np.full(a.shape, np.nan, np.float32)
        interp.run(low, a, got, gpu_order=order)
        assert np.abs(got - want).max() < 1e-5, order


def _flat_writes(shift: int) -> N.Program:
    """y[F // n, F % n] = x[..] and y[G // n, G % n] = 2 x[..] with F = 128 b + t and G = F + shift, over a
    collapsed m x n index: indices whose row-major offsets (F, G) are affine where the indices are not."""
    m, n = te.var("m"), te.var("n")
    x = ir.buffer((m, n), name="x")
    y = ir.buffer((m, n), name="y")
    b = ir.Builder("flat")
    with b.loop("bo", 0, (m * n + 127) // 128) as bo:
        with b.loop("t", 0, 128) as t:
            f = bo * 128 + t
            g = f + shift
            with b.if_(g < m * n):
                b.store(y, (f // n, f % n), x[f // n, f % n], name="S")
                b.store(y, (g // n, g % n), x[g // n, g % n] * 2.0, name="T")
    p = b.finish([x, y])
    s = Schedule(p, check=False)
    s.bind(s.loop("bo"), "blockIdx.x").bind(s.loop("t"), "threadIdx.x")
    return s.program


def test_flat_offsets_place_collapsed_accesses_exactly() -> None:
    # the indexed model would take x[f // n, f % n] as any element and see every pair of blocks conflict; the flat
    # model (codegen.passes.barriers `_flat_offsets`) sees each block write its own elements: no race, no barrier
    out = _place(_flat_writes(0))
    assert _barriers(out) == 0


def test_flat_offsets_still_find_a_real_cross_block_race() -> None:
    # T at thread 127 of block b writes the element S writes at thread 0 of block b + 1: a real race, refused,
    # and its witness names two instances of different blocks at one element
    with pytest.raises(CrossBlockRaceError) as ei:
        _place(_flat_writes(1))
    e = ei.value
    assert e.buffer == "y" and e.blocks[0] != e.blocks[1]
    (sn, si), (tn, ti) = e.source, e.sink
    offset = {"S": lambda v: v["bo"] * 128 + v["t"], "T": lambda v: v["bo"] * 128 + v["t"] + 1}
    assert offset[sn](si) == offset[tn](ti)
