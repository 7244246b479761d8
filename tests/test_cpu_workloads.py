"""Every seed workload through `build(..., target="cpu")` against its numpy reference, and scheduled
variants (split, tile, reorder, collapse, unroll, vectorize, parallel) against the unscheduled program."""

from __future__ import annotations

import numpy as np
import pytest

from codegen import build
from loopir import workloads
from loopir.workloads import SEEDS
from schedules import Schedule

SIZES = ({"n": 5, "m": 3, "p": 4, "d": 2}, {"n": 67, "m": 45, "p": 33, "d": 17})


def check(w, mod, sizes, seed=0, rtol=None):
    ins = w.random_inputs(sizes, seed)
    outs = w.empty_outputs(sizes)
    expected = w.reference(*[a.copy() for a in ins])
    mod(*w.call_args(ins, outs))
    got = ins if w.in_place else outs
    dt = got[0].dtype
    tol = rtol if rtol is not None else (w.tolerance * 10 if dt == np.float32 else 1e-10)
    for g, e in zip(got, expected):
        assert not np.isnan(g).any(), "an output element was not written"
        np.testing.assert_allclose(g, e, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", sorted(SEEDS))
def test_seed_workload(name, dtype):
    w = SEEDS[name](dtype=dtype)
    mod = build(w.program(), target="cpu")
    for k, sizes in enumerate(SIZES):
        check(w, mod, {v.name: sizes[v.name] for v in w.sizes}, seed=k)


def test_seeds_through_tensors_path():
    # build(tensors, args) — auto_schedule when it exists, else the lowered program
    for name in ("gelu", "softmax", "layernorm"):
        w = SEEDS[name]()
        mod = build(list(w.outputs), list(w.args), target="cpu")
        check(w, mod, {v.name: SIZES[1][v.name] for v in w.sizes})


# ----------------------------------------------------------------------------- scheduled variants


def _elementwise_schedule(w, factor, inner):
    (y,) = w.outputs
    s = Schedule(y)
    (i,) = s.loops(y)
    io, ii = s.split(i, factor)
    s.parallel(io)
    getattr(s, inner)(ii)
    return s


@pytest.mark.parametrize("inner", ["vectorize", "unroll"])
@pytest.mark.parametrize("name", ["sincos", "gelu"])
def test_split_parallel_inner(name, inner):
    w = SEEDS[name]()
    s = _elementwise_schedule(w, 16, inner)
    mod = build(s, list(w.args), threads=2)
    assert "vectorize" not in inner or "llvm.loop.vectorize.enable" in mod.source
    for n in (1, 15, 16, 1000):
        check(w, mod, {"n": n}, seed=n)


def test_tiled_reordered_parallel_matmul():
    w = workloads.matmul_bias_relu()
    s = Schedule(w.outputs[0])
    i, j, k = s.loops("matmul")
    io, jo, ii, ji = s.tile(i, j, 8, 16)
    ko, ki = s.split(k, 4)
    s.reorder(io, jo, ko, ii, ki, ji)
    s.vectorize(ji)
    s.parallel(io)
    mod = build(s, list(w.args), threads=2)
    for sizes in SIZES:
        check(w, mod, {v.name: sizes[v.name] for v in w.sizes})


def test_softmax_collapse():
    w = workloads.softmax()
    s = Schedule(w.outputs[0])
    i, j = s.loops("y")
    s.collapse(i, j)
    mod = build(s, list(w.args), threads=2)
    check(w, mod, {"m": 33, "n": 29})


def test_softmax_rows_parallel():
    w = workloads.softmax()
    s2 = Schedule(w.outputs[0])
    s2.parallel(s2.loops("row_max")[0])
    s2.parallel(s2.loops("y")[0])
    mod2 = build(s2, list(w.args), threads=2)
    assert len(mod2.kernels) >= 3  # chunked parallel nests and serial segments
    check(w, mod2, {"m": 33, "n": 29})


def test_stencil_tiled_parallel():
    w = workloads.stencil5()
    s = Schedule(w.outputs[0])
    i, j = s.loops(w.outputs[0])
    io, jo, ii, ji = s.tile(i, j, 4, 8)
    s.parallel(io)
    s.vectorize(ji)
    mod = build(s, list(w.args), threads=2)
    for sizes in ({"n": 3, "m": 3}, {"n": 37, "m": 41}):
        check(w, mod, sizes)


def test_parallel_threads_agree_with_one_thread():
    w = workloads.layernorm()
    s = Schedule(w.outputs[0])
    for stage in ("mean", "var", "y"):
        s.parallel(s.loops(stage)[0])
    sizes = {"m": 50, "n": 70}
    ins = w.random_inputs(sizes, 3)
    outs = []
    for threads in (1, 2):
        o = w.empty_outputs(sizes)
        build(s, list(w.args), threads=threads)(*w.call_args(ins, o))
        outs.append(o[0])
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_allclose(outs[0], w.reference(*ins)[0], rtol=1e-4, atol=1e-4)
