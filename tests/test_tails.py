"""Halide's tail strategies as an option of split (issue 20 item 9): `split(loop, f, tail="guard" | "round_up" |
"shift_inwards")`. Printed nests, refusals (a BoundsError naming the buffer; witnesses checked against the access
functions), numerics against numpy on the CPU target, the CUDA source + cubin, the adversarial GPU interpreter."""

from __future__ import annotations

import numpy as np
import pytest

from codegen import build
from codegen.cuda.build import build_cuda
from loopir import interp, ir, te
from loopir.affine import eval_index
from loopir.bounds import BoundsError
from loopir.errors import ArgumentError
from loopir.nodes import Load, Store
from loopir.visit import walk, walk_stmts
from schedules import Schedule, ScheduleError


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOPIR_CACHE_DIR", str(tmp_path / "cache"))


def _rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _affine(n):
    A = te.placeholder((n,), name="A")
    B = te.compute((n,), lambda i: A[i] * 2.0 + 1.0, name="B")
    return A, B


def _padded(op: str = "copy"):
    # buffers padded by 8 past the loop's range m: a rounded-up chunk of 8 stays inside them
    m = te.var("m")
    A, B = ir.buffer((m + 8,), name="A"), ir.buffer((m + 8,), name="B")
    b = ir.Builder("pad")
    with b.loop("i", 0, m) as i:
        b.store(B, (i,), A[i] * 2.0 + 0.5, name="S")
    if op == "tail_reader":  # a second statement reads B[m + 3]: what an extra instance of S would overwrite
        C = ir.buffer((1,), name="C")
        with b.loop("j", 0, 1) as j:
            b.store(C, (j,), B[m + 3] * 1.0, name="T")
        return b.finish([A, B, C])
    return b.finish([A, B])


def _check_witness_accesses(program, err: ScheduleError, writer_kind: str) -> None:
    # the witness, evaluated with the access functions, names one element of err.buffer touched by both instances
    stores = {s.name: s for s in walk_stmts(program) if isinstance(s, Store)}
    env_p = {p: err.params[p.name] for p in program.params if p.name in err.params}

    def elems(name: str, inst: dict[str, int], kind: str) -> set[tuple[int, ...]]:
        st = stores[name]
        env = {**env_p, **{v: inst[v.name] for v in st.iters}}
        if kind == "write":
            return {tuple(eval_index(i, env) for i in st.indices)} if st.buffer.name == err.buffer else set()
        return {tuple(eval_index(i, env) for i in ld.indices) for ld in walk(st.value)
                if isinstance(ld, Load) and ld.buffer.name == err.buffer}

    src = elems(*err.source, "write")
    snk = elems(*err.sink, writer_kind)
    assert tuple(err.element) in src & snk, (src, snk, err.element)


# ----------------------------------------------------------------------------- guard (the default) unchanged


def test_guard_is_the_default_and_unchanged():
    n = te.var("n")
    _, B = _affine(n)
    s1, s2 = Schedule(B), Schedule(B)
    s1.split(s1.loops(B)[0], 8)
    s2.split(s2.loops(B)[0], 8, tail="guard")
    assert str(s1) == str(s2) and "if i_o * 8 + i_i < n:" in str(s1)


def test_halide_names_are_aliases():
    A, B = _affine(20)
    s1, s2 = Schedule(B), Schedule(B)
    s1.split(s1.loops(B)[0], 8, tail="ShiftInwards")
    s2.split(s2.loops(B)[0], 8, tail="shift_inwards")
    assert str(s1) == str(s2)
    p = _padded()
    s3 = Schedule(p)
    s3.split(s3.loops("S")[0], 8, tail="RoundUp")
    assert "if " not in str(s3) and s3.original is s3.program  # round_up rebased the schedule


def test_bad_tail_name_refused():
    _, B = _affine(te.var("n"))
    s = Schedule(B)
    with pytest.raises(ArgumentError, match="tail must be one of 'guard', 'round_up', 'shift_inwards'"):
        s.split(s.loops(B)[0], 8, tail="clamp")


# ----------------------------------------------------------------------------- round_up


def test_round_up_golden_and_numerics_cpu():
    p = _padded()
    s = Schedule(p)
    io, ii = s.split(s.loops("S")[0], 8, tail="round_up")
    s.vectorize(ii)
    assert str(s) == (
        "def pad(A: float32[m + 8], B: float32[m + 8]):  # sizes: m\n"
        "    for i_o in range(0, (m + 7) // 8):\n"
        "        for i_i in vectorize(0, 8):\n"
        "            B[i] = A[i] * 2.0 + 0.5  # S (i = i_o * 8 + i_i)"
    )
    for m in (1, 8, 13):
        a = _rand(m + 8, seed=m)
        b = np.full(m + 8, np.nan, np.float32)
        build(s, target="cpu")(a, b)
        np.testing.assert_allclose(b[:m], a[:m].astype(np.float64) * 2 + 0.5, rtol=1e-6)
        r = -(-m // 8) * 8  # rounded up: the padding up to r is written too, beyond stays untouched
        np.testing.assert_allclose(b[m:r], a[m:r].astype(np.float64) * 2 + 0.5, rtol=1e-6)
        assert np.isnan(b[r:]).all()


def test_round_up_out_of_bounds_refused_naming_the_buffer():
    _, B = _affine(te.var("n"))
    s = Schedule(B)
    before = s.program
    with pytest.raises(BoundsError, match=r"round_up.*leaves buffer 'A'") as ei:
        s.split(s.loops(B)[0], 8, tail="round_up")
    assert ei.value.witness.buffer in ("A", "B")
    assert s.program is before


def test_round_up_overwriting_an_element_read_elsewhere_refused_with_witness():
    p = _padded("tail_reader")
    s = Schedule(p)
    with pytest.raises(ScheduleError, match="rounded-up last chunk") as ei:
        s.split(s.loops("S")[0], 8, tail="round_up")
    err = ei.value
    assert err.buffer == "B" and err.kind == "flow" and err.source[0] == "S" and err.sink[0] == "T"
    assert err.source[1]["i"] >= err.params["m"]  # an extra instance, outside the original range
    _check_witness_accesses(p, err, "read")


def test_round_up_then_bound_cuda_cubin_and_adversarial_interpreter():
    p = _padded()
    s = Schedule(p)
    io, ii = s.split(s.loops("S")[0], 8, tail="round_up")  # the padding is 8 elements
    s.bind(io, "blockIdx.x").bind(ii, "threadIdx.x")
    mod = build_cuda(s.program, arch="sm_90")
    assert mod.cubin[:4] == b"\x7fELF"
    m = 37
    for order in ("reversed", "forward", 1):
        a = _rand(m + 8, seed=5)
        b = np.full(m + 8, np.nan, np.float32)
        interp.run(s.program, a, b, gpu_order=order)
        np.testing.assert_allclose(b[:m], a[:m].astype(np.float64) * 2 + 0.5, rtol=1e-6)


@pytest.mark.gpu
def test_round_up_gpu():
    p = _padded()
    s = Schedule(p)
    io, ii = s.split(s.loops("S")[0], 8, tail="round_up")  # the padding is 8 elements
    s.bind(io, "blockIdx.x").bind(ii, "threadIdx.x")
    m = 70
    a = _rand(m + 8, seed=6)
    b = np.full(m + 8, np.nan, np.float32)
    build(s, target="cuda")(a, b)
    np.testing.assert_allclose(b[:m], a[:m].astype(np.float64) * 2 + 0.5, rtol=1e-6)


# ----------------------------------------------------------------------------- shift_inwards


def test_shift_inwards_golden_and_numerics_cpu_constant_extent():
    A, B = _affine(20)
    s = Schedule(B)
    io, ii = s.split(s.loops(B)[0], 8, tail="shift_inwards")
    s.vectorize(ii)
    assert str(s) == (
        "def B(A: float32[20], B: float32[20]):\n"
        "    for i_o in range(0, 3):\n"
        "        for i_i in vectorize(0, 8):\n"
        "            B[i] = A[i] * 2.0 + 1.0  # B (i = min(i_o * 8, 12) + i_i)"
    )
    a = _rand(20, seed=2)
    b = np.full(20, np.nan, np.float32)
    build(s, [A, B], target="cpu")(a, b)
    np.testing.assert_allclose(b, a.astype(np.float64) * 2 + 1, rtol=1e-6)


def test_shift_inwards_symbolic_extent_numerics_cpu_and_interp():
    A, B = _affine(te.var("n"))
    s = Schedule(B)
    io, ii = s.split(s.loops(B)[0], 8, tail="shift_inwards")
    assert "(i = min(i_o * 8, n - min(8, n)) + i_i)" in str(s), str(s)
    mod = build(s, [A, B], target="cpu")
    for n in (1, 5, 8, 9, 23, 64):
        a = _rand(n, seed=n)
        b = np.full(n, np.nan, np.float32)
        mod(a, b)
        np.testing.assert_allclose(b, a.astype(np.float64) * 2 + 1, rtol=1e-6)
        b2 = np.full(n, np.nan, np.float32)
        interp.run(s.program, a, b2)
        np.testing.assert_array_equal(b, b2)


def test_shift_inwards_in_place_update_refused_with_witness():
    m = te.var("m")
    A = ir.buffer((m,), name="A")
    b = ir.Builder("inplace")
    with b.loop("i", 0, m) as i:
        b.store(A, (i,), A[i] * 2.0, name="S")
    p = b.finish([A])
    s = Schedule(p)
    with pytest.raises(ScheduleError, match="a second time") as ei:
        s.split(s.loops("S")[0], 8, tail="shift_inwards")
    err = ei.value
    assert err.buffer == "A" and err.source == err.sink and err.source[0] == "S"
    m_val, i_val = err.params["m"], err.source[1]["i"]
    # the instance is in both the shifted last chunk and the chunk before it
    assert m_val % 8 and m_val > 8 and m_val - 8 <= i_val < (m_val // 8) * 8
    _check_witness_accesses(p, err, "read")


def test_shift_inwards_carried_dependence_refused_with_witness():
    # a running sum: B[i] = B[i - 1] + A[i] (the loop carries a flow dependence)
    m = te.var("m")
    A, B = ir.buffer((m,), name="A"), ir.buffer((m,), name="B")
    b = ir.Builder("scan")
    with b.loop("i", 1, m) as i:
        b.store(B, (i,), B[i - 1] + A[i], name="S")
    p = b.finish([A, B])
    s = Schedule(p)
    with pytest.raises(ScheduleError) as ei:
        s.split(s.loops("S")[0], 4, tail="shift_inwards")
    err = ei.value
    assert err.buffer == "B" and err.kind == "flow"
    _check_witness_accesses(p, err, "read")


def test_shift_inwards_extent_below_factor_refused():
    _, B = _affine(5)
    s = Schedule(B)
    with pytest.raises(ArgumentError, match="fewer than the factor 8"):
        s.split(s.loops(B)[0], 8, tail="shift_inwards")


def test_shift_inwards_bound_cuda_cubin_and_adversarial_interpreter():
    A, B = _affine(te.var("n"))
    s = Schedule(B)
    io, ii = s.split(s.loops(B)[0], 32, tail="shift_inwards")
    # the recomputed elements are written twice (the same value): the chunks stay a host loop of launches, since
    # two blocks writing one element is refused by the CUDA pipeline's race check (codegen/passes/barriers.py)
    s.bind(ii, "threadIdx.x")
    mod = build_cuda(s.program, arch="sm_90")
    assert mod.cubin[:4] == b"\x7fELF"
    for n in (7, 45):
        for order in ("reversed", 2):
            a = _rand(n, seed=n)
            b = np.full(n, np.nan, np.float32)
            interp.run(s.program, a, b, gpu_order=order)
            np.testing.assert_allclose(b, a.astype(np.float64) * 2 + 1, rtol=1e-6)


@pytest.mark.gpu
def test_shift_inwards_gpu():
    A, B = _affine(te.var("n"))
    s = Schedule(B)
    io, ii = s.split(s.loops(B)[0], 32, tail="shift_inwards")
    # the recomputed elements are written twice (the same value): the chunks stay a host loop of launches, since
    # two blocks writing one element is refused by the CUDA pipeline's race check (codegen/passes/barriers.py)
    s.bind(ii, "threadIdx.x")
    n = 77
    a = _rand(n, seed=9)
    b = np.full(n, np.nan, np.float32)
    build(s, [A, B], target="cuda")(a, b)
    np.testing.assert_allclose(b, a.astype(np.float64) * 2 + 1, rtol=1e-6)


def test_tail_strategies_replay_from_the_trace():
    p = _padded()
    s = Schedule(p)
    io, ii = s.split(s.loops("S")[0], 8, tail="round_up")
    s.vectorize(ii)
    assert str(Schedule.replay(s.trace_json(), p)) == str(s)
    A, B = _affine(te.var("n"))
    s2 = Schedule(B)
    s2.split(s2.loops(B)[0], 4, tail="shift_inwards")
    assert str(Schedule.replay(s2.trace_json(), B)) == str(s2)


def test_tail_with_nparts_refused_and_factor_by_keyword():
    prog = _padded()
    s = Schedule(prog)
    (i,) = s.loops("S")
    with pytest.raises(ArgumentError, match="tail='round_up' takes factor="):
        s.split(i, nparts=4, tail="round_up")
    io, ii = s.split(i, factor=8, tail="round_up")  # the factor by keyword, as TVM users write it
    assert "round_up" in s.explain() or "RoundUp" in s.explain() or s.trace[-1]["kwargs"].get("tail") == "round_up"
    mod = build(s, target="cpu")
    m = 21
    a = _rand(m + 8, seed=4)
    out = np.full(m + 8, np.nan, np.float32)
    mod(a, out)
    np.testing.assert_allclose(out[:m], a[:m] * 2.0 + 0.5, rtol=1e-6)
