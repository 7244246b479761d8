"""The CUDA pass `widen_staged`: half tiles that a kernel only reads through cast(float32, .) are staged as float32
(converted once at the copy instead of at every read), and every value read is unchanged: the lowered program
gives bit-identical results with and without the pass, in any thread order. Tiles that tensor cores read stay
half."""

from __future__ import annotations

import numpy as np

from codegen.passes import pipeline
from loopir import blocks, interp, te
from loopir.nodes import Allocate
from loopir.visit import walk
from schedules import auto_schedule


def _lowered(program, skip: str | None = None):
    for p in pipeline("cuda"):
        if p.name != skip:
            program = p(program)
    return program


def _allocs(program) -> dict[str, str]:
    return {n.buffer.name: n.buffer.dtype for n in walk(program.body) if isinstance(n, Allocate)}


def test_half_tiles_are_staged_widened_and_values_are_unchanged():
    """The float16 GPT-2 block (small): the attention pass's query row (registers) and the projection GEMM's weight
    tile (shared, not pipelined) are widened; K and V tiles, which cp.async copies into a ring, stay half."""
    w = blocks.gpt2(C=32, H=2, dtype="float16")
    s = auto_schedule(list(w.outputs), "cuda")
    before, after = _allocs(_lowered(s.program, skip="widen_staged")), _allocs(_lowered(s.program))
    for name in ("q_local", "w_proj_shared"):
        assert before[name] == "float16" and after[name] == "float32", name
    for name in ("k_shared", "v_shared"):
        assert after[name] == "float16", name
    sizes = {"B": 2, "T": 7}
    ins = blocks.inputs(w, sizes, rng=21)
    shape = w.reference(*ins)[0].shape
    got = {}
    for skip in ("widen_staged", None):
        low = _lowered(s.program, skip=skip)
        by_name = {t.name: a for t, a in zip(w.inputs, ins)}
        for order in ("reversed", 1):
            o = blocks.as_dtype(np.full(shape, np.nan), "float16")
            by_name[w.outputs[0].name] = o
            interp.run(low, *(by_name[b.name] for b in low.args), gpu_order=order, sizes=sizes)
            assert not np.isnan(o.astype(np.float32)).any()
            got[(skip, order)] = o
    first = got[("widen_staged", "reversed")]
    assert all(np.array_equal(first, o) for o in got.values())


def test_tiles_read_by_tensor_cores_stay_half():
    B, T = te.var("B"), te.var("T")
    x = te.placeholder((B, T, 32), "float16", name="x")
    wt = te.placeholder((32, 136), "float16", name="w")
    r = te.reduce_axis(32, "r")
    mm = te.compute((B, T, 136), lambda i, t, c: te.sum(te.cast("float32", x[i, t, r]) * te.cast("float32", wt[r, c]),
                                                        axis=r), name="mm")
    y = te.compute((B, T, 136), lambda i, t, c: te.cast("float16", mm[i, t, c]), name="y")
    s = auto_schedule([y], "cuda")
    assert "mma.m16n8k16" in str(s)
    allocs = _allocs(_lowered(s.program))
    assert allocs["x_shared"] == "float16" and allocs["w_shared"] == "float16"
