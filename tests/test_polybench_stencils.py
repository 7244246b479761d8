"""Tests of the PolyBench ports whose kernels, float64 references and harness are in
`tests/polybench_stencil_kernels.py` (its docstring says how the C programs map onto te)."""

from __future__ import annotations

from typing import Any
import numpy as np
import pytest
from codegen import build
from loopir import interp, te
from loopir.lower import lower
from loopir.nodes import Var
from schedules import Schedule, ScheduleError
from witness_check import verify_witness

from tests.polybench_stencil_kernels import (  # noqa: F401
    K_ADI,
    K_DERICHE,
    K_FDTD2D,
    K_FLOYD,
    K_HEAT3D,
    K_JACOBI1D,
    K_JACOBI1D_SCAN,
    K_JACOBI2D,
    K_LUDCMP,
    K_NUSSINOV,
    K_SEIDEL2D,
    Kernel,
    _arrays_only,
    _check,
    _symbolic,
    cpu_check,
    cuda_check,
    symbolic_check,
)


# ----------------------------------------------------------------------------- (a), (b), (c) for every kernel

KERNELS = [K_JACOBI1D, K_JACOBI1D_SCAN, K_JACOBI2D, K_HEAT3D, K_FDTD2D, K_SEIDEL2D, K_ADI, K_FLOYD, K_NUSSINOV,
           K_DERICHE, K_LUDCMP]
_IDS = [k.name for k in KERNELS]

# heat-3d's (2, N, N, N) init collapsed (q, i) on blockIdx.z: see test_bug_cross_block_race_after_collapse
_COLLAPSE_RACE_BUG = "loopir bug: auto_schedule's collapse of a symbolic loop is refused as a cross-block race"


def _mark(k: Kernel, bugs: dict[str, str]) -> Any:
    return pytest.param(k, id=k.name, marks=[pytest.mark.xfail(strict=True, reason=bugs[k.name])]
                        if k.name in bugs else [])


@pytest.mark.parametrize("k", KERNELS, ids=_IDS)
def test_cpu(k: Kernel) -> None:
    cpu_check(k)


@pytest.mark.parametrize("k", [k for k in KERNELS if k.sizes2], ids=lambda k: k.name)
def test_symbolic_sizes(k: Kernel) -> None:
    symbolic_check(k)


@pytest.mark.parametrize("k", KERNELS, ids=_IDS)
def test_cuda_nvrtc_and_thread_orders(k: Kernel) -> None:
    cuda_check(k)


def cuda_symbolic_check(k: Kernel) -> None:
    """The CUDA build with symbolic sizes (NVRTC), its lowered program in the GPU interpreter at both sizes."""
    args, outs = k.make(_symbolic(k))
    mod = build(outs, args + outs, target="cuda")
    arrays = _arrays_only(args)
    for seed, sizes in ((5, k.sizes), (6, k.sizes2)):
        free = {a.name: sizes[a.name] for a in args if isinstance(a, Var)}
        for order in ("reversed", 7):
            _check(k, outs, lambda *a, order=order, free=free: interp.run(mod.program, *a, gpu_order=order,
                                                                           sizes=free),
                   sizes, seed, f"cuda symbolic {sizes} gpu_order={order!r}", arrays)


@pytest.mark.parametrize("k", [_mark(k, {"heat-3d": _COLLAPSE_RACE_BUG})
                               for k in (K_JACOBI1D, K_JACOBI1D_SCAN, K_HEAT3D, K_SEIDEL2D, K_NUSSINOV, K_DERICHE,
                                         K_LUDCMP)])
def test_cuda_symbolic_sizes(k: Kernel) -> None:
    cuda_symbolic_check(k)


# ----------------------------------------------------------------------------- (d) hand schedules


def _loop(s: Schedule, stmt: str, name: str) -> Any:
    return next(h for h in s.loops(stmt) if h.var.name == name)


def _schedule(k: Kernel) -> tuple[Schedule, list[Any], list[Any]]:
    """A Schedule of the kernel's unscheduled program (arguments in the kernel's order)."""
    args, outs = k.make(dict(k.sizes))
    return Schedule(lower(outs, args + outs)), args, outs


def _cpu_matches(k: Kernel, s: Schedule, args: list[Any], outs: list[Any], seed: int = 21) -> None:
    _check(k, outs, build(s, args + outs), k.sizes, seed, f"cpu, scheduled:\n{s}")


def _cuda_matches(k: Kernel, s: Schedule, args: list[Any], outs: list[Any], seed: int = 22) -> None:
    mod = build(s, args + outs, target="cuda")
    for order in ("reversed", "forward", 9):
        _check(k, outs, lambda *a, order=order: interp.run(mod.program, *a, gpu_order=order), k.sizes, seed,
               f"cuda gpu_order={order!r}, scheduled:\n{mod.program}")


def _refused(s: Schedule, name: str, *args: Any) -> ScheduleError:
    """Step `name` must be refused with a witness that verify_witness confirms (checked on the program the step
    would make, built without checks), the schedule left as it was."""
    before = s.program
    with pytest.raises(ScheduleError) as info:
        s.apply(name, *args)
    err = info.value
    assert s.program is before and err.primitive == name
    u = Schedule(before, check=False)
    u.apply(name, *[u._resolve(_same_loop(u, a), name) for a in args])
    verify_witness(s.original, u.program, err)
    return err


def _same_loop(u: Schedule, a: Any) -> Any:
    """The handle of `u` for the loop handle `a` of another schedule of the same program (or `a` itself)."""
    var = getattr(a, "var", None)
    if var is None:
        return a
    return next(h for st in _stores(u.program) for h in u.loops(st) if h.var is var)


def _stores(program: Any) -> list[str]:
    from loopir.nodes import Store
    from loopir.visit import walk

    return list(dict.fromkeys(n.name for n in walk(program.body) if isinstance(n, Store)))


def test_jacobi1d_parallel_sweep_accepted_time_and_half_step_refused() -> None:
    k = K_JACOBI1D
    s, args, outs = _schedule(k)
    err = _refused(s, "parallel", _loop(s, "AB", "q"))  # the A half-step reads what the B half-step wrote
    assert err.kind == "flow" and err.buffer == "AB"
    _refused(s, "parallel", _loop(s, "AB", "t"))
    _refused(s, "reorder", _loop(s, "AB", "i"), _loop(s, "AB", "q"))  # A[i] would read B[i + 1] before it is new
    s.parallel(_loop(s, "AB", "i"))  # within a half-step the points are independent
    _cpu_matches(k, s, args, outs)


def test_jacobi1d_cuda_threads_over_the_sweep_with_barriers() -> None:
    """The in-place time loop in one block, i on threadIdx.x: the lowering must put a barrier between half-steps."""
    from schedules import auto_schedule

    k = K_JACOBI1D
    args, outs = k.make(dict(k.sizes))
    s = auto_schedule(outs, "cuda")
    s.bind(_loop(s, "AB", "i"), "threadIdx.x")
    _cuda_matches(k, s, args, outs)


def test_seidel2d_wavefront_accepted_plain_parallel_refused() -> None:
    k = K_SEIDEL2D
    s, args, outs = _schedule(k)
    i, j = _loop(s, "S", "i"), _loop(s, "S", "j")
    for step, *xs in (("parallel", i), ("parallel", j), ("reorder", j, i), ("bind", i, "threadIdx.x")):
        err = _refused(s, step, *xs)
        assert err.buffer == "S" and err.source[0] == err.sink[0] == "S"
    js = s.skew(i, j, 2)  # 2i + j: the classic wavefront; every dependence is carried by it
    s.reorder(js, i)
    s.parallel(i)
    _cpu_matches(k, s, args, outs)
    s1, *_ = _schedule(k)
    js1 = s1.skew(_loop(s1, "S", "i"), _loop(s1, "S", "j"), 1)  # i + j is not enough: (1, -1) becomes (0, 1)
    s1.reorder(js1, _loop(s1, "S", "i"))
    _refused(s1, "parallel", _loop(s1, "S", "i"))


def test_seidel2d_time_tiles_accepted() -> None:
    """Skewed by t (i + t, j + i + 2t), the band is fully permutable: 4 x 4 tiles, t inside them. Checked in the
    reference interpreter: the CPU build of this nest spends ~11 s in the bounds pass's initialisation check
    (loopir.bounds.check_initialized; ~170 s with N symbolic), see the report."""
    k = K_SEIDEL2D
    s, args, outs = _schedule(k)
    t, i, j = (_loop(s, "S", n) for n in "tij")
    j1 = s.skew(i, j, 1)
    i2 = s.skew(t, i, 1)
    j2 = s.skew(t, j1, 2)
    io, jo, _, _ = s.tile(i2, j2, 4, 4)
    s.reorder(io, jo, t)
    _check(k, outs, lambda *a: interp.run(s.program, *a), k.sizes, 23, f"interp, scheduled:\n{s}")


def test_seidel2d_cuda_wavefront_on_threads() -> None:
    from schedules import auto_schedule

    k = K_SEIDEL2D
    args, outs = k.make(dict(k.sizes))
    s = auto_schedule(outs, "cuda")
    i, j = _loop(s, "S", "i"), _loop(s, "S", "j")
    s.reorder(s.skew(i, j, 2), i)
    s.bind(i, "threadIdx.x")
    _cuda_matches(k, s, args, outs)


def test_floyd_warshall_interchange_accepted_k_inward_refused() -> None:
    k = K_FLOYD
    s, args, outs = _schedule(k)
    kk, i, j = (_loop(s, "P", n) for n in "kij")
    err = _refused(s, "reorder", i, j, kk)
    assert err.kind == "flow" and err.buffer == "P"
    _refused(s, "reorder", i, kk)
    _refused(s, "parallel", i)  # row k is read by every i and written by i = k (same values, other memory order)
    s.reorder(j, i)  # for one k, (i, j) in any order: every pair shares the row or the column it meets in
    s.split(j, 5)
    _cpu_matches(k, s, args, outs)


def test_nussinov_sweeps_refused_split_accepted() -> None:
    k = K_NUSSINOV
    s, args, outs = _schedule(k)
    _refused(s, "parallel", _loop(s, "T", "ii"))
    _refused(s, "parallel", _loop(s, "T", "j"))
    _refused(s, "reorder", _loop(s, "T", "kk"), _loop(s, "T", "j"))
    s.split(_loop(s, "T", "kk"), 4)
    _cpu_matches(k, s, args, outs)


def test_deriche_rows_parallel_recurrence_axis_refused() -> None:
    k = K_DERICHE
    s, args, outs = _schedule(k)
    _refused(s, "parallel", _loop(s, "y1", "j"))
    _refused(s, "parallel", _loop(s, "y4", "ii"))
    s.reorder(_loop(s, "y1", "j"), _loop(s, "y1", "i"))  # rows are independent: i innermost, vectorized
    s.vectorize(_loop(s, "y1", "i"))
    s.parallel(_loop(s, "y3", "j"))
    s.parallel(_loop(s, "y2", "i"))
    _cpu_matches(k, s, args, outs)


def test_heat3d_half_steps_keep_their_order() -> None:
    k = K_HEAT3D
    s, args, outs = _schedule(k)
    _refused(s, "reorder", _loop(s, "AB", "i"), _loop(s, "AB", "q"))
    _refused(s, "parallel", _loop(s, "AB", "q"))
    s.parallel(_loop(s, "AB", "i"))
    s.tile(_loop(s, "AB", "j"), _loop(s, "AB", "k"), 3, 4)
    _cpu_matches(k, s, args, outs)


def test_jacobi2d_cpu_tiles() -> None:
    k = K_JACOBI2D
    s, args, outs = _schedule(k)
    for st in ("B0", "A0", "B1", "A1"):
        io, _, _, ji = s.tile(_loop(s, st, "i"), _loop(s, st, "j"), 4, 8)
        s.parallel(io)
        s.vectorize(ji)
    _cpu_matches(k, s, args, outs)


def _bind_tiles(s: Schedule, st: str) -> tuple[Any, ...]:
    io, jo, ii, ji = s.tile(_loop(s, st, "i"), _loop(s, st, "j"), 4, 8)
    s.bind(io, "blockIdx.y").bind(jo, "blockIdx.x").bind(ii, "threadIdx.y").bind(ji, "threadIdx.x")
    return io, jo, ii, ji


def test_jacobi2d_cuda_tiles_with_a_shared_halo() -> None:
    """Each stage on 4 x 8 thread blocks, its source's block region (with the halo) copied to shared memory."""
    k = K_JACOBI2D
    s, args, outs = _schedule(k)
    for st, src in (("B0", "A"), ("A0", "B0"), ("B1", "A0"), ("A1", "B1")):
        _, jo, _, _ = _bind_tiles(s, st)
        s.cache_read(src, "shared", jo)
    _cuda_matches(k, s, args, outs)


def test_jacobi2d_cuda_shared_copy_at_the_thread_loop() -> None:
    """cache_read at the threadIdx.x loop itself: the buffer is the block's, so the region must be the whole
    block's (or the step refused). Was accepted with one thread's region, every thread racing on it (fixed in
    133a03b)."""
    k = K_JACOBI2D
    s, args, outs = _schedule(k)
    for st, src in (("B0", "A"), ("A0", "B0"), ("B1", "A0"), ("A1", "B1")):
        *_, ji = _bind_tiles(s, st)
        try:
            s.cache_read(src, "shared", ji)
        except ScheduleError:
            return  # a refusal is a fine answer
    _cuda_matches(k, s, args, outs)


@pytest.mark.xfail(strict=True, reason="loopir bug: store_at refuses a legal step when a where-guarded boundary "
                                       "load lies outside the buffer (its dataflow ignores the select)")
def test_jacobi2d_overlapped_tiles_compute_at_store_at() -> None:
    """Overlapped tiling: B0 computed (halo recomputed) and stored per 4 x 8 tile of A0."""
    k = K_JACOBI2D
    s, args, outs = _schedule(k)
    io, jo, _, _ = s.tile(_loop(s, "A0", "i"), _loop(s, "A0", "j"), 4, 8)
    s.compute_at("B0", jo)
    s.store_at("B0", jo)
    s.parallel(io)
    _cpu_matches(k, s, args, outs)


# ----------------------------------------------------------------------------- minimal reproducers of the bugs
# (the two this file found and 133a03b fixed have their regression tests beside the code they test:
# tests/test_bounds.py::test_a_size_variable_is_never_negative_for_the_initialisation_check and
# tests/test_gpu_idioms.py::test_a_shared_cache_at_the_thread_loop_holds_the_blocks_region)


@pytest.mark.xfail(strict=True, reason=_COLLAPSE_RACE_BUG)
def test_bug_cross_block_race_after_collapse() -> None:
    """collapse(q, i) of a (2, n, m) stage on blockIdx.x, j on threadIdx.x: accepted by the schedule, refused by
    the build (CrossBlockRaceError: `B[j=0] in block 0 writes an element that B[j=0] in block 1 writes (at n=1,
    m=1)`, two different elements). auto_schedule makes this mapping for heat-3d's stacked init."""
    n, m = te.var("n"), te.var("m")
    A = te.placeholder((2, n, m), "float32", "A")
    B = te.compute((2, n, m), lambda q, i, j: A[q, i, j] * 2.0, name="B")
    s = Schedule([B])
    q, i, j = s.loops(B)
    s.bind(s.collapse(q, i), "blockIdx.x").bind(j, "threadIdx.x")
    mod = build(s, [A, B], target="cuda")
    a = np.random.default_rng(0).standard_normal((2, 3, 5)).astype(np.float32)
    out = np.full_like(a, np.nan)
    interp.run(mod.program, a, out, gpu_order="reversed")
    np.testing.assert_array_equal(out, 2 * a)


@pytest.mark.xfail(strict=True, reason="loopir bug: store_at refuses a legal step (ArgumentError 'no writer-reader "
                                       "pair explains it') for a where-guarded out-of-range load")
def test_bug_store_at_with_a_guarded_boundary_load() -> None:
    """y[0] = x[0], y[i] = b[i - 1] (b = 2x), tiled by 4 with b computed and stored per tile. b[i - 1] at i = 0 is
    under `where(i >= 1)`; the unchecked schedule is right, the checked one raises."""
    x = te.placeholder((8,), "float32", "x")
    b = te.compute((8,), lambda i: x[i] * 2.0, name="b")
    y = te.compute((8,), lambda i: te.where(i >= 1, b[i - 1], x[i]), name="y")
    s = Schedule([y])
    io, _ = s.split(s.loops(y)[0], 4)
    s.compute_at(b, io)
    s.store_at(b, io)
    xa = np.arange(1, 9, dtype=np.float32)
    out = np.full(8, np.nan, np.float32)
    build(s, [x, y])(xa, out)
    np.testing.assert_array_equal(out, [1, 2, 4, 6, 8, 10, 12, 14])
