"""fuse(a, b, shift=k): fusion with an offset (issue 20 item 8). PolyBench's jacobi-1d: the two nests of the
time loop fused with shift 1, then skew + tile (time tiling) is legal and computes numpy's result; without the
shift the fusion is refused with a witness. Plus a GPU-mapped case built through NVRTC and run in the
adversarial GPU interpreter, and the misuse errors."""

from __future__ import annotations

import numpy as np
import pytest
from witness_check import verify_witness

from codegen import build
from codegen.cuda.build import build_cuda
from loopir import interp, ir, te
from loopir.errors import ArgumentTypeError
from schedules import Schedule, ScheduleError
from schedules.primitives.loop_fusion import fuse

TSTEPS = 5


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOPIR_CACHE_DIR", str(tmp_path / "cache"))


def _jacobi1d(tsteps: int = TSTEPS):
    n = te.var("n")
    A, B = ir.buffer((n,), name="A"), ir.buffer((n,), name="B")
    b = ir.Builder("jacobi1d")
    with b.loop("t", 0, tsteps):
        with b.loop("i", 1, n - 1) as i:
            b.store(B, (i,), (A[i - 1] + A[i] + A[i + 1]) * 0.33333, name="S1")
        with b.loop("j", 1, n - 1) as j:
            b.store(A, (j,), (B[j - 1] + B[j] + B[j + 1]) * 0.33333, name="S2")
    return b.finish([A, B])


def _jacobi1d_numpy(a: np.ndarray, b: np.ndarray, tsteps: int = TSTEPS) -> tuple[np.ndarray, np.ndarray]:
    a, b = a.astype(np.float64), b.astype(np.float64)
    for _ in range(tsteps):
        b[1:-1] = (a[:-2] + a[1:-1] + a[2:]) * 0.33333
        a[1:-1] = (b[:-2] + b[1:-1] + b[2:]) * 0.33333
    return a, b


def _fresh(n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(n).astype(np.float32) for _ in range(2)]


def test_jacobi1d_fuse_with_shift_golden():
    s = Schedule(_jacobi1d())
    _, i = s.loops("S1")
    _, j = s.loops("S2")
    f = s.fuse(i, j, shift=1)
    assert f.name == "i"
    assert str(s) == (
        "def jacobi1d(A: float32[n], B: float32[n]):  # sizes: n\n"
        "    for t in range(0, 5):\n"
        "        for i in range(1, n):\n"
        "            if i < n - 1:\n"
        "                B[i] = (A[i - 1] + A[i] + A[i + 1]) * 0.33333  # S1\n"
        "            if i >= 2:\n"
        "                A[j] = (B[j - 1] + B[j] + B[j + 1]) * 0.33333  # S2 (j = i - 1)"
    )
    assert s.trace[-1]["kwargs"] == {"shift": 1}
    assert "1. fuse(i, j, shift=1)" in s.explain()


def test_jacobi1d_fuse_without_shift_refused_with_witness():
    p = _jacobi1d()
    s = Schedule(p)
    _, i = s.loops("S1")
    _, j = s.loops("S2")
    with pytest.raises(ScheduleError) as ei:
        s.fuse(i, j)
    err = ei.value
    # S2(j) reads B[j + 1], which S1 writes at i = j + 1: one iteration too late once fused
    assert err.primitive == "fuse" and err.kind == "flow" and err.buffer == "B"
    assert "shift=k" in str(err)
    verify_witness(p, fuse(p, i.var, j.var)[0], err)
    assert s.program is p


def test_jacobi1d_negative_shift_refused_with_witness():
    p = _jacobi1d()
    s = Schedule(p)
    _, i = s.loops("S1")
    _, j = s.loops("S2")
    with pytest.raises(ScheduleError) as ei:
        s.fuse(i, j, shift=-1)  # b ahead of a: reads B before it is written
    assert ei.value.buffer == "B" and "fuse(i, j, shift=-1) is illegal" in str(ei.value)
    verify_witness(p, fuse(p, i.var, j.var, -1)[0], ei.value)


def test_jacobi1d_time_tiling_after_shifted_fusion():
    p = _jacobi1d()
    s = Schedule(p)
    t, i = s.loops("S1")
    _, j = s.loops("S2")
    f = s.fuse(i, j, shift=1)
    with pytest.raises(ScheduleError) as ei:
        s.tile(t, f, 2, 8)  # the time distance (1, -2) forbids tiling before the skew
    assert "skew" in str(ei.value)
    fs = s.skew(t, f, 2)
    to, io, ti, ii = s.tile(t, fs, 2, 8)
    text = str(s)
    assert text.index("for t_o in") < text.index("for i_s_o in") < text.index("for t_i in") < text.index(
        "for i_s_i in range(0, 8):"), text
    for n in (3, 4, 11, 37):
        a, b = _fresh(n, n)
        want_a, want_b = _jacobi1d_numpy(a, b)
        got = [a.copy(), b.copy()]
        interp.run(s.program, *got)
        np.testing.assert_allclose(got[0], want_a, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got[1][1:-1], want_b[1:-1], rtol=1e-5, atol=1e-6)
        cpu = [a.copy(), b.copy()]
        build(s, target="cpu")(*cpu)
        np.testing.assert_allclose(cpu[0], want_a, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(cpu[1][1:-1], want_b[1:-1], rtol=1e-5, atol=1e-6)


def _rows_pair():
    # per row: B = 2A, then C[r, j] = B[r, j] + B[r, j + 1] (reads one ahead: fusable only with a shift)
    m, n = te.var("m"), te.var("n")
    A, B, C = ir.buffer((m, n), name="A"), ir.buffer((m, n), name="B"), ir.buffer((m, n), name="C")
    b = ir.Builder("rows")
    with b.loop("r", 0, m) as r:
        with b.loop("j", 0, n) as j:
            b.store(B, (r, j), A[r, j] * 2.0, name="S1")
        with b.loop("j2", 0, n - 1) as j:
            b.store(C, (r, j), B[r, j] + B[r, j + 1], name="S2")
    return b.finish([A, B, C])


def _rows_reference(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    b = a.astype(np.float64) * 2
    return b, b[:, :-1] + b[:, 1:]


def _rows_scheduled(gpu: bool):
    s = Schedule(_rows_pair())
    _, j = s.loops("S1")
    _, j2 = s.loops("S2")
    f = s.fuse(j, j2, shift=1)
    assert "if j >= 1:" in str(s) and "(j2 = j - 1)" in str(s), str(s)
    if gpu:
        r = s.loops("S1")[0]
        ro, ri = s.split(r, 32)
        s.bind(ro, "blockIdx.x").bind(ri, "threadIdx.x")
    else:
        s.parallel(s.loops("S1")[0])
    return s, f


def _rows_data(m: int, n: int, seed: int) -> list[np.ndarray]:
    a = np.random.default_rng(seed).standard_normal((m, n)).astype(np.float32)
    return [a, np.full((m, n), np.nan, np.float32), np.full((m, n), np.nan, np.float32)]


def _check_rows(got: list[np.ndarray]) -> None:
    want_b, want_c = _rows_reference(got[0])
    np.testing.assert_allclose(got[1], want_b, rtol=1e-6)
    np.testing.assert_allclose(got[2][:, :-1], want_c, rtol=1e-6)


def test_rows_shifted_fusion_cpu():
    s, _ = _rows_scheduled(gpu=False)
    arrs = _rows_data(9, 13, 1)
    build(s, target="cpu")(*arrs)
    _check_rows(arrs)


def test_rows_shifted_fusion_cuda_source_cubin_and_adversarial_interpreter():
    s, _ = _rows_scheduled(gpu=True)
    mod = build_cuda(s.program, arch="sm_90")
    assert mod.cubin[:4] == b"\x7fELF"
    for order in ("reversed", "forward", 3):
        arrs = _rows_data(40, 17, 2)
        interp.run(s.program, *arrs, gpu_order=order)
        _check_rows(arrs)


@pytest.mark.gpu
def test_rows_shifted_fusion_gpu():
    s, _ = _rows_scheduled(gpu=True)
    arrs = _rows_data(70, 33, 3)
    build(s, target="cuda")(*arrs)
    _check_rows(arrs)


def test_fuse_shift_misuse():
    s = Schedule(_jacobi1d())
    _, i = s.loops("S1")
    _, j = s.loops("S2")
    with pytest.raises(ArgumentTypeError, match="shift must be an int"):
        s.fuse(i, j, shift=1.5)
    with pytest.raises(ArgumentTypeError, match="shift must be an int"):
        s.fuse(i, j, shift=True)


def test_shift_with_unequal_symbolic_extents_guards_both_ends():
    n, m = te.var("n"), te.var("m")
    A, B = ir.buffer((n,), name="A"), ir.buffer((m + 2,), name="B")
    b = ir.Builder("uneq")
    with b.loop("i", 0, n) as i:
        b.store(A, (i,), A[i] * 2.0, name="S1")
    with b.loop("j", 0, m) as j:
        b.store(B, (j + 2,), B[j] + 1.0, name="S2")
    p = b.finish([A, B])
    s = Schedule(p)
    (i,) = s.loops("S1")
    (j,) = s.loops("S2")
    s.fuse(i, j, shift=-2)  # independent nests: any shift is legal
    text = str(s)
    assert "for i in range(-2, max(n, m - 2)):" in text, text
    assert "if i >= 0:" in text and "if i < n:" in text and "if i < m - 2:" in text, text
    for nn, mm in ((5, 3), (2, 9), (0, 4), (6, 0)):
        rng = np.random.default_rng(nn * 10 + mm)
        arrs = [rng.standard_normal(nn).astype(np.float32), rng.standard_normal(mm + 2).astype(np.float32)]
        want = [x.copy() for x in arrs]
        interp.run(p, *want)
        got = [x.copy() for x in arrs]
        interp.run(s.program, *got)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)


def test_shifted_fusion_replays_from_the_trace():
    p = _jacobi1d()
    s = Schedule(p)
    t, i = s.loops("S1")
    _, j = s.loops("S2")
    s.tile(t, s.skew(t, s.fuse(i, j, shift=1), 2), 2, 8)
    assert str(Schedule.replay(s.trace_json(), p)) == str(s)
