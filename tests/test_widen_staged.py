"""The CUDA pass `widen_staged`: half tiles that a kernel only reads through cast(float32, .) are staged as float32
(converted once at the copy instead of at every read), and every value read is unchanged: the lowered program
gives bit-identical results with and without the pass, in any thread order. Tiles that tensor cores read stay
half."""

from __future__ import annotations

from unittest import mock

import numpy as np

from codegen.passes import pipeline
from loopir import blocks, interp, te
from loopir.nodes import Allocate
from loopir.visit import walk
from schedules import Schedule, attention, auto_schedule


def _lowered(program, skip: str | None = None):
    for p in pipeline("cuda"):
        if p.name != skip:
            program = p(program)
    return program


def _allocs(program) -> dict[str, str]:
    return {n.buffer.name: n.buffer.dtype for n in walk(program.body) if isinstance(n, Allocate)}


def _same_bits(program, arrays: list[np.ndarray], out_shape: tuple[int, ...], out_dtype: str,
               sizes: dict[str, int]) -> None:
    """The lowered program with and without widen_staged, in two thread orders: the same bits, nothing unwritten."""
    got = []
    for skip, orders in (("widen_staged", ("reversed",)), (None, ("reversed", 1))):
        low = _lowered(program, skip=skip)
        for order in orders:
            o = blocks.as_dtype(np.full(out_shape, np.nan), out_dtype)
            interp.run(low, *arrays, o, gpu_order=order, sizes=sizes)
            assert not np.isnan(o.astype(np.float32)).any()
            got.append(o)
    assert all(np.array_equal(got[0], o) for o in got[1:])


def test_the_query_row_of_half_attention_is_widened_and_the_pipelined_k_v_tiles_are_not():
    w = blocks.gpt2(C=32, H=2, dtype="float16")
    out, ins = next((o, i) for o, i in blocks.operators(w, "gpt2") if o.name == "attn")
    with mock.patch.object(attention, "TENSOR_CORES", False):  # the SIMT pass (a head dimension over 64 takes it)
        s = auto_schedule([out], "cuda")
    before, after = _allocs(_lowered(s.program, skip="widen_staged")), _allocs(_lowered(s.program))
    assert before["q_local"] == "float16" and after["q_local"] == "float32"
    assert after["k_shared"] == after["v_shared"] == "float16"  # cp.async copies bytes: the ring stays half
    rng = np.random.default_rng(21)
    arrs = [blocks.as_dtype(rng.standard_normal((2, 7, 32)), "float16") for _ in ins]
    _same_bits(s.program, arrs, (2, 7, 32), "float16", {"B": 2, "T": 7})


def test_a_shared_half_tile_read_widened_is_staged_as_float32():
    n = te.var("n")
    x = te.placeholder((n, 40), "float16", name="x")
    wt = te.placeholder((40,), "float16", name="w")
    k = te.reduce_axis(40, "k")
    y = te.compute((n,), lambda i: te.sum(te.cast("float32", x[i, k]) * te.cast("float32", wt[k]), axis=k), name="y")
    s = Schedule([y])
    bo, ti = s.split(s.loops("y")[0], 64)
    s.bind(bo, "blockIdx.x").bind(ti, "threadIdx.x")
    s.cache_read("w", "shared", bo)
    assert _allocs(_lowered(s.program, skip="widen_staged"))["w_shared"] == "float16"
    assert _allocs(_lowered(s.program))["w_shared"] == "float32"
    rng = np.random.default_rng(22)
    arrs = [rng.standard_normal(sh).astype(np.float16) for sh in ((70, 40), (40,))]
    _same_bits(s.program, arrs, (70,), "float32", {"n": 70})


def test_tiles_read_by_tensor_cores_stay_half():
    B, T = te.var("B"), te.var("T")
    x = te.placeholder((B, T, 32), "float16", name="x")
    wt = te.placeholder((32, 136), "float16", name="w")
    r = te.reduce_axis(32, "r")
    mm = te.compute((B, T, 136), lambda i, t, c: te.sum(te.cast("float32", x[i, t, r]) * te.cast("float32", wt[r, c]),
                                                        axis=r), name="mm")
    y = te.compute((B, T, 136), lambda i, t, c: te.cast("float16", mm[i, t, c]), name="y")
    s = auto_schedule([y], "cuda", gemm={"wgmma": False})  # the mma.sync recipe's staged tiles (wgmma stages its own)
    assert "mma.m16n8k16" in str(s)
    allocs = _allocs(_lowered(s.program))
    assert allocs["x_shared"] == "float16" and allocs["w_shared"] == "float16"
