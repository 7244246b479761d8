"""PolyBench/C 4.2 kernels we did not write, ported to `te` as a user would: floyd-warshall (an update definition
over k, i, j), seidel-2d (in place, time steps), jacobi-2d (time steps as stages). Each through `build(outputs,
args)` on the CPU and for CUDA (NVRTC compiles; the lowered program run in the GPU interpreter in several thread
orders), outputs poisoned with NaN, against a float64 transcription of the C loops; and the steps that would
reorder their in-place sweeps refused with a witness that the access functions confirm."""

from __future__ import annotations

import numpy as np
import pytest

from codegen import build
from loopir import interp, te
from schedules import Schedule, ScheduleError
from schedules.primitives import REGISTRY
from tests.witness_check import verify_witness


def floyd_warshall(n: int):
    path0 = te.placeholder((n, n), name="path0")
    p = te.compute((n, n), lambda i, j: path0[i, j], name="p")
    pw = te.update(p, [n, n, n], lambda k, i, j: ((i, j), te.where(p[i, j] < p[i, k] + p[k, j], p[i, j],
                                                                    p[i, k] + p[k, j])), name="pw")
    out = te.compute((n, n), lambda i, j: pw[i, j] * 1.0, name="out")
    return [path0], out


def floyd_warshall_ref(a: np.ndarray) -> np.ndarray:
    r = a.astype(np.float64).copy()
    n = r.shape[0]
    for k in range(n):
        for i in range(n):
            for j in range(n):
                r[i, j] = r[i, j] if r[i, j] < r[i, k] + r[k, j] else r[i, k] + r[k, j]
    return r


def seidel_2d(n: int, steps: int):
    a0 = te.placeholder((n, n), name="A0")
    a = te.compute((n, n), lambda i, j: a0[i, j], name="A")
    s = te.update(a, [steps, (1, n - 1), (1, n - 1)], lambda t, i, j: (
        (i, j), (a[i - 1, j - 1] + a[i - 1, j] + a[i - 1, j + 1] + a[i, j - 1] + a[i, j] + a[i, j + 1]
                 + a[i + 1, j - 1] + a[i + 1, j] + a[i + 1, j + 1]) / 9.0), name="S")
    out = te.compute((n, n), lambda i, j: s[i, j] + 0.0, name="out")
    return [a0], out


def seidel_2d_ref(a: np.ndarray, steps: int) -> np.ndarray:
    r = a.astype(np.float64).copy()
    n = r.shape[0]
    for _ in range(steps):
        for i in range(1, n - 1):
            for j in range(1, n - 1):
                r[i, j] = (r[i - 1, j - 1] + r[i - 1, j] + r[i - 1, j + 1] + r[i, j - 1] + r[i, j] + r[i, j + 1]
                           + r[i + 1, j - 1] + r[i + 1, j] + r[i + 1, j + 1]) / 9.0
    return r


def jacobi_2d(n, steps: int):
    a0 = te.placeholder((n, n), name="A0")

    def step(x, name):
        inner = lambda i, j: (i >= 1) & (i < n - 1) & (j >= 1) & (j < n - 1)  # noqa: E731
        return te.compute((n, n), lambda i, j: te.where(
            inner(i, j), 0.2 * (x[i, j] + x[i, j - 1] + x[i, 1 + j] + x[1 + i, j] + x[i - 1, j]), x[i, j]), name=name)

    x = a0
    for t in range(steps):  # B = stencil(A); A = stencil(B)
        x = step(step(x, f"B{t + 1}"), f"A{t + 1}")
    return [a0], x


def jacobi_2d_ref(a: np.ndarray, steps: int) -> np.ndarray:
    r = a.astype(np.float64).copy()
    for _ in range(2 * steps):
        s = r.copy()
        s[1:-1, 1:-1] = 0.2 * (r[1:-1, 1:-1] + r[1:-1, :-2] + r[1:-1, 2:] + r[2:, 1:-1] + r[:-2, 1:-1])
        r = s
    return r


def _case(name: str, n: int):
    rng = np.random.default_rng(n)
    if name == "floyd-warshall":
        ins, out = floyd_warshall(n)
        a = rng.integers(1, 30, (n, n)).astype(np.float32)
        return ins, out, a, floyd_warshall_ref(a)
    if name == "seidel-2d":
        ins, out = seidel_2d(n, 2)
        a = rng.standard_normal((n, n)).astype(np.float32)
        return ins, out, a, seidel_2d_ref(a, 2)
    ins, out = jacobi_2d(n, 2)
    a = rng.standard_normal((n, n)).astype(np.float32)
    return ins, out, a, jacobi_2d_ref(a, 2)


KERNELS = ["floyd-warshall", "seidel-2d", "jacobi-2d"]


@pytest.mark.parametrize("name", KERNELS)
@pytest.mark.parametrize("n", [12, 17])
def test_polybench_on_the_cpu(name, n):
    ins, out, a, want = _case(name, n)
    got = np.full(want.shape, np.nan, np.float32)
    build([out], [*ins, out])(a, got)
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-5


@pytest.mark.parametrize("name", KERNELS)
def test_polybench_for_cuda_in_any_thread_order(name):
    ins, out, a, want = _case(name, 13)
    mod = build([out], [*ins, out], target="cuda")
    assert mod.cubin[:4] == b"\x7fELF"
    for order in ("reversed", "forward", 5):
        got = np.full(want.shape, np.nan, np.float32)
        interp.run(mod.program, a, got, gpu_order=order)
        assert np.abs(got - want).max() / np.abs(want).max() < 1e-5, order


@pytest.mark.parametrize("name, loop, primitive", [("seidel-2d", 1, "parallel"), ("seidel-2d", 2, "parallel"),
                                                   ("floyd-warshall", 0, "parallel"),
                                                   ("floyd-warshall", 2, "parallel")])
def test_reordering_an_in_place_sweep_is_refused_with_a_real_witness(name, loop, primitive):
    """seidel-2d's i and j loops carry its in-place updates (row i reads row i - 1 of this sweep), floyd-warshall's
    k loop its rounds, and its j loop too (round k writes p[i, k] at j = k, which the other j of row i read: the
    value is unchanged when p[k, k] >= 0, but legality is decided on the accesses, not on values): running any of
    these loops' iterations in any order is refused, and the witness is two instances of the update that touch one
    element and would run in the wrong order."""
    ins, out, _, _ = _case(name, 9)
    upd = "S" if name == "seidel-2d" else "pw"
    s = Schedule([out])
    handle = s.loops(upd)[loop]
    before = s.program
    with pytest.raises(ScheduleError) as info:
        getattr(s, primitive)(handle)
    verify_witness(s.original, REGISTRY[primitive].fn(before, handle.var), info.value)


def test_legal_steps_of_floyd_warshall_are_accepted_and_right():
    """Splitting j by 4 and unrolling the inner part keeps every instance's order: accepted, and matches float64."""
    ins, out, a, want = _case("floyd-warshall", 10)
    s = Schedule([out])
    _, ji = s.split(s.loops("pw")[2], 4)
    s.unroll(ji)
    got = np.full(want.shape, np.nan, np.float32)
    build(s, [*ins, out])(a, got)
    assert np.abs(got - want).max() == 0
