"""Tests of the PolyBench ports whose kernels, float64 references and harness are in
`tests/polybench_linalg_kernels.py` (its docstring says how the C programs map onto te)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any
import pytest
from codegen import build
from loopir import interp, ir
from loopir.lower import lower
from loopir.nodes import For, Seq
from schedules import Schedule, ScheduleError
from witness_check import verify_witness

from tests.polybench_linalg_kernels import (  # noqa: F401
    ALPHA,
    BETA,
    BY_NAME,
    KERNELS,
    K_2MM,
    K_CHOLESKY,
    K_GRAMSCHMIDT,
    K_LU,
    K_SYRK,
    K_TRISOLV,
    K_TRMM,
    Kernel,
    _args,
    _run_and_check,
    _symbolic,
    _syrk_ref,
)




def _params(names: list[str], xfail: dict[str, tuple[str, type[BaseException]]] | None = None) -> list[Any]:
    """The kernels `names` as pytest params; those in `xfail` (name -> (reason, the exception the bug raises))
    marked strict xfail."""
    xfail = xfail or {}
    marks = {n: [pytest.mark.xfail(strict=True, reason=why, raises=exc)] for n, (why, exc) in xfail.items()}
    return [pytest.param(BY_NAME[n], id=n, marks=marks.get(n, [])) for n in names]


# ----------------------------------------------------------------------------- (a) CPU, fixed sizes


CPU_XFAIL: dict[str, tuple[str, type[BaseException]]] = {}


@pytest.mark.parametrize("k", _params([k.name for k in KERNELS], CPU_XFAIL))
def test_cpu_fixed_sizes(k: Kernel) -> None:
    outs, args = _args(k.make(k.sizes))
    mod = build(outs, args)
    _run_and_check(k, mod, k.sizes, 0, "cpu")


# ----------------------------------------------------------------------------- (b) CPU, symbolic sizes


SYMBOLIC_XFAIL: dict[str, tuple[str, type[BaseException]]] = {}


@pytest.mark.parametrize("k", _params([k.name for k in KERNELS], SYMBOLIC_XFAIL))
def test_cpu_symbolic_sizes(k: Kernel) -> None:
    outs, args = _args(k.make(_symbolic(k)))
    mod = build(outs, args)
    for seed, sizes in ((1, k.sizes2), (2, k.sizes)):
        _run_and_check(k, mod, sizes, seed, f"cpu symbolic {sizes}")


# ----------------------------------------------------------------------------- (c) CUDA: NVRTC + GPU interpreter


# found by this file and fixed: the CUDA planner planned split-K for a triangular reduction (trmm, symm: bounds
# reading the output's axes) and evaluated its extent M - (i + 1) as a size (schedules/gemm_plan.py)
CUDA_XFAIL: dict[str, tuple[str, type[BaseException]]] = {}


def _one_thread(prog: Any) -> Schedule:
    """A sequential ir program on CUDA: each top-level loop nest on one thread (its outermost loop split by 1,
    the unit loop moved out and bound to blockIdx.x, as schedules.auto.map_statements maps a nest with no free
    loop); a top-level statement outside any loop becomes a one-thread kernel of its own."""
    s = Schedule(prog)
    for st in prog.body.body if isinstance(prog.body, Seq) else (prog.body,):
        if isinstance(st, For):
            outer, unit = s.split(s.loop(st.var.name), 1)
            s.reorder(unit, outer)
            s.bind(unit, "blockIdx.x")
    return s


def _cuda_module(k: Kernel) -> Any:
    made = k.make(k.sizes)
    if made[0] == "te":
        outs, args = _args(made)
        return build(outs, args, target="cuda")
    return build(_one_thread(made[1]), target="cuda")


def _gpu_orders(k: Kernel, program: Any, seed: int, sizes: dict[str, int] | None = None) -> None:
    """`program` (lowered for CUDA) in the GPU interpreter, threads in reverse, forward and shuffled order, each
    on fresh data."""
    for n, order in enumerate(("reversed", "forward", seed)):
        _run_and_check(k, functools.partial(interp.run, program, gpu_order=order), sizes or k.sizes, seed + n,
                       f"gpu interpreter order {order!r}")


@pytest.mark.parametrize("k", _params([k.name for k in KERNELS], CUDA_XFAIL))
def test_cuda_nvrtc_and_gpu_interpreter(k: Kernel) -> None:
    mod = _cuda_module(k)
    assert mod.cubin[:4] == b"\x7fELF" and "__global__" in mod.source
    _gpu_orders(k, mod.program, 3)


# ----------------------------------------------------------------------------- (d) hand schedules


def _te_program(k: Kernel) -> tuple[Any, list[Any]]:
    _, ins, outs = k.make(k.sizes)
    return lower(outs, ins + outs), ins + outs


def _refused(p: Any, steps: Callable[[Schedule], Any], primitive: str) -> ScheduleError:
    """`steps` on a checked Schedule of `p` must be refused (its last step, `primitive`) with a witness that
    verify_witness confirms on the same steps applied unchecked."""
    with pytest.raises(ScheduleError) as info:
        steps(Schedule(p))
    err = info.value
    assert err.primitive == primitive
    bad = Schedule(p, check=False)
    steps(bad)
    verify_witness(p, bad.program, err)
    return err


def test_trisolv_schedule() -> None:
    """Legal: the j loop split and its inner part unrolled. Illegal: x[i] reads x[j < i], so the i loop runs in
    order (parallel(i), reorder(j, i) refused); the j loop accumulates into x[i] (parallel(j) refused)."""
    k = K_TRISOLV
    p, args = _te_program(k)
    s = Schedule(p)
    _, j = s.loops("x")
    _, ji = s.split(j, 4)
    s.unroll(ji)
    _run_and_check(k, build(s, args), k.sizes, 20, "split j")
    err = _refused(p, lambda u: u.parallel(u.loops("x")[0]), "parallel")
    assert err.kind == "flow" and err.buffer == "x" and err.source[1]["i"] < err.sink[1]["i"]
    _refused(p, lambda u: u.parallel(u.loops("x")[1]), "parallel")
    _refused(p, lambda u: u.reorder(u.loops("x")[1], u.loops("x")[0]), "reorder")


def test_lu_schedule() -> None:
    """The (i, j) band of lu is fully permutable (every dependence distance on it is >= 0): tile(i, j) is legal,
    and so is the wavefront (skew j by i, interchange, the inner i loop parallel / on threadIdx.x, one barrier
    per wavefront). parallel(j) is not: A[i][j] reads A[i][k] for k < j, written in the same row."""
    k = K_LU
    p, args = _te_program(k)
    s = Schedule(p)
    i, j, _ = s.loops("LU")
    s.tile(i, j, 4, 4)
    _run_and_check(k, build(s, args), k.sizes, 21, "tile(i, j)")

    def wavefront(u: Schedule) -> Any:
        i, j, _ = u.loops("LU")
        u.reorder(u.skew(i, j, 1), i)
        return i

    s = Schedule(p)
    s.parallel(wavefront(s))
    _run_and_check(k, build(s, args), k.sizes, 22, "wavefront, parallel")
    s = Schedule(p)
    s.bind(wavefront(s), "threadIdx.x")
    a, b = s.loops("LU_init")
    s.bind(a, "blockIdx.x").bind(b, "threadIdx.x")
    mod = build(s, args, target="cuda")
    assert "__syncthreads()" in mod.source
    _gpu_orders(k, mod.program, 23)
    err = _refused(p, lambda u: u.parallel(u.loops("LU")[1]), "parallel")
    assert err.buffer == "LU" and err.source[1]["i"] == err.sink[1]["i"]


def test_cholesky_schedule() -> None:
    """Legal: the k loop split. Illegal: parallel over i (row i reads the rows j < i) or over j (A[i][j] reads
    A[i][k], k < j, of its own row)."""
    k = K_CHOLESKY
    p, args = _te_program(k)
    s = Schedule(p)
    s.split(s.loops("CH")[2], 4)
    _run_and_check(k, build(s, args), k.sizes, 24, "split k")
    err = _refused(p, lambda u: u.parallel(u.loops("CH")[0]), "parallel")
    assert err.kind == "flow" and err.buffer == "CH"
    _refused(p, lambda u: u.parallel(u.loops("CH")[1]), "parallel")


def test_2mm_schedule() -> None:
    """Legal: D_out tiled 4 x 4, the outer tile loop parallel, the lifted sum computed at the tile. Illegal:
    parallel over tmp's reduction loop k."""
    k = K_2MM
    p, args = _te_program(k)
    s = Schedule(p)
    i, j = s.loops("D_out")
    io, jo, _, _ = s.tile(i, j, 4, 4)
    s.parallel(io)
    s.compute_at("D_out.sum0", jo)
    _run_and_check(k, build(s, args), k.sizes, 25, "tile + compute_at")
    err = _refused(p, lambda u: u.parallel(u.loops("tmp")[2]), "parallel")
    assert err.buffer == "tmp"


def test_gramschmidt_schedule() -> None:
    """For one k the columns j > k are independent: parallel(j) (a triangular loop) and parallel(i2) are legal,
    and on CUDA the k loop stays on the host, the columns on blocks, A's update on threads (R[k][j]'s sum on
    thread 0, a barrier before the threads read it). Illegal: parallel(k) (column j is updated by every k < j) and
    parallel over a reduction loop (nrm, R[k][j])."""
    k = K_GRAMSCHMIDT
    p = k.make(k.sizes)[1]
    s = Schedule(p)
    s.parallel(s.loop("j")).parallel(s.loop("i2"))
    _run_and_check(k, build(s), k.sizes, 26, "parallel j, i2")
    s = Schedule(p)
    outer, unit = s.split(s.loop("i"), 1)
    s.reorder(unit, outer).bind(unit, "blockIdx.x")
    s.bind(s.loop("i2"), "threadIdx.x").bind(s.loop("j"), "blockIdx.x").bind(s.loop("i4"), "threadIdx.x")
    mod = build(s, target="cuda")
    assert "__syncthreads()" in mod.source
    _gpu_orders(k, mod.program, 27)
    err = _refused(p, lambda u: u.parallel(u.loop("k")), "parallel")
    assert err.buffer == "A" and err.source[1]["k"] < err.sink[1]["k"]
    _refused(p, lambda u: u.parallel(u.loop("i")), "parallel")
    _refused(p, lambda u: u.parallel(u.loop("i3")), "parallel")


def test_trmm_schedule() -> None:
    """The triangular reduction (k from i + 1) interchanged to (j, k, i): isl's bounds (i < k, k from 1); the
    output tiled and parallel. On CUDA by hand (its auto_schedule is the bug above): rows on blocks, columns on
    threads, k serial in each thread. Illegal: parallel over k, the reduction loop."""
    k = K_TRMM
    p, args = _te_program(k)
    s = Schedule(p)
    i, j, _ = s.loops("B_out.sum0")
    s.reorder(j, i)
    s.reorder(s.loops("B_out.sum0")[2], i)
    assert [h.name for h in s.loops("B_out.sum0")] == ["j", "k", "i"]
    io, _, _, _ = s.tile(*s.loops("B_out"), 4, 4)
    s.parallel(io)
    _run_and_check(k, build(s, args), k.sizes, 33, "reorder (j, k, i) + tile")
    s = Schedule(p)
    for stage in ("B_out.sum0", "B_out"):
        i, j = s.loops(stage)[:2]
        s.bind(i, "blockIdx.x").bind(j, "threadIdx.x")
    mod = build(s, args, target="cuda")
    _gpu_orders(k, mod.program, 34)
    err = _refused(p, lambda u: u.parallel(u.loops("B_out.sum0")[2]), "parallel")
    assert err.buffer == "B_out.sum0"


def _syrk_loops(s: dict[str, Any]) -> tuple[Any, ...]:
    """syrk as the C loops (triangular j <= i, k between them), in the loop IR."""
    N, M = s["N"], s["M"]
    C, A = ir.buffer((N, N), "float32", "C"), ir.buffer((N, M), "float32", "A")
    b = ir.Builder("syrk_loops")
    with b.loop("i", 0, N) as i:
        with b.loop("j", 0, i + 1) as j:
            b.store(C, (i, j), C[i, j] * BETA, name="S_scale")
        with b.loop("k", 0, M) as k:
            with b.loop("j2", 0, i + 1) as j2:
                b.store(C, (i, j2), C[i, j2] + ALPHA * A[i, k] * A[j2, k], name="S_upd")
    return "ir", b.finish([C, A])


K_SYRK_LOOPS = Kernel("syrk_loops", dict(N=11, M=9), dict(N=13, M=6), _syrk_loops, K_SYRK.data, _syrk_ref, outs=(0,))


def test_syrk_triangular_loops_schedule() -> None:
    """The triangular nest: the (i, j) scale tiled (isl's bounds of the triangle), k and j2 interchanged, i
    parallel; on CUDA rows on blocks, both j loops on threads (the same thread owns C[i][j] in both: no barrier
    needed). Illegal: parallel(k) (each C[i][j] accumulates over k)."""
    k = K_SYRK_LOOPS
    p = k.make(k.sizes)[1]
    s = Schedule(p)
    s.tile(s.loop("i"), s.loop("j"), 4, 4)
    _run_and_check(k, build(s), k.sizes, 28, "tile the triangle")
    s = Schedule(p)
    s.reorder(s.loop("j2"), s.loop("k")).parallel(s.loop("i"))
    _run_and_check(k, build(s), k.sizes, 29, "reorder + parallel")
    s = Schedule(p)
    s.bind(s.loop("i"), "blockIdx.x").bind(s.loop("j"), "threadIdx.x").bind(s.loop("j2"), "threadIdx.x")
    mod = build(s, target="cuda")
    _gpu_orders(k, mod.program, 30)
    err = _refused(p, lambda u: u.parallel(u.loop("k")), "parallel")
    assert err.buffer == "C" and err.source[1]["k"] < err.sink[1]["k"]


# ----------------------------------------------------------------------------- edge sizes (bugs found)


# found by this file and fixed: symm's symbolic build called at M = 1 (k < i empty) raised IndexError from
# isl_conv._fold in reorder's exact bounds (loopir/isl_conv.pw_bound: an empty domain is the empty loop)
@pytest.mark.parametrize("k", _params(["trmm", "symm", "trisolv", "lu", "cholesky", "durbin"]))
def test_cpu_symbolic_size_one(k: Kernel) -> None:
    """The symbolic build called with every size 1 (the triangular domains empty or a single point)."""
    outs, args = _args(k.make(_symbolic(k)))
    mod = build(outs, args)
    _run_and_check(k, mod, {name: 1 for name in k.sizes}, 31, "cpu symbolic, sizes 1")


# found by this file and fixed: at N = 1 the update's loops are free only because they have one value, and the
# CUDA mapping put one on threadIdx.x (codegen refused: the same element from every thread); schedules/auto.py
# map_statements binds free loops of extent > 1 only
@pytest.mark.parametrize("k", _params(["trisolv", "lu", "cholesky"]))
def test_cuda_update_size_one(k: Kernel) -> None:
    """The in-place factorizations at N = 1 (fixed): the CUDA build and the GPU interpreter."""
    sizes = {name: 1 for name in k.sizes}
    outs, args = _args(k.make(sizes))
    mod = build(outs, args, target="cuda")
    _gpu_orders(k, mod.program, 32, sizes)
