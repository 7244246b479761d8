"""8-byte vector accesses of rows that are not whole 16-byte vectors (RowParams.vector_bytes).

A float16 row of 700 elements is 175 groups of 4 halves, never whole groups of 8: its rows start 8-byte aligned,
not 16. Its phases then load and store 4 halves at a time (`uint2`, 64 bits) instead of one (2 bytes a load), and
a float32 row of an even length 2 floats at a time (`float2`); `rows={"vector_bytes": 16}` keeps element accesses.
The schedules are checked in the GPU interpreter in several thread orders (outputs poisoned with NaN); the vector
code they render on the GPU (marked `gpu`), at aligned and at misaligned addresses (the element-wise fallback)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from codegen import build
from loopir import blocks, te
from loopir import workloads as w
from loopir.errors import ArgumentError
from schedules import auto_schedule
from tests.test_register_rows import TOL, _call_error, _inputs, _reference, check_thread_orders

# (workload, dtype, rows, row length, strategy): warp rows, block rows in registers, a cluster row, a block row
# whose every phase re-reads the row (too long to cache)
CASES = [("layernorm", "float16", 37, 700, "warp"), ("softmax", "float16", 64, 2500, "block"),
         ("rmsnorm", "bfloat16", 16, 1300, "block"), ("softmax", "float32", 19, 50, "warp"),
         ("layernorm", "float32", 64, 3002, "block"), ("rmsnorm", "float32", 8, 20002, "block"),
         ("softmax", "float16", 12, 50252, "block")]
VTYPE = {"float32": "float2", "float16": "uint2", "bfloat16": "uint2"}
VLANES = {"float32": 2, "float16": 4, "bfloat16": 4}


def _mod(wl, schedule=None):
    return build(list(wl.outputs), list(wl.inputs) + list(wl.outputs), target="cuda", schedule=schedule)


def _vector_types(src: str) -> set[str]:
    body = src[src.index('extern "C"'):]
    return set(re.findall(r"(?:reinterpret_cast<(?:const )?|loopir_(?:ld|st)16<)(u?int[24]|float[24])\*?>", body))


@pytest.mark.parametrize("name, dtype, m, n, strategy", CASES)
def test_rows_of_whole_8_byte_vectors_take_8_byte_accesses(name, dtype, m, n, strategy):
    """Each phase's accesses of the row are 8-byte vectors (and no 16-byte ones: the row is not whole 16-byte
    vectors), and explain() says so; with vector_bytes 16 the kernel keeps element accesses. NVRTC compiles both."""
    wl = getattr(w, name)(m=m, n=n, dtype=dtype)
    s = auto_schedule(list(wl.outputs), "cuda")
    (g,) = [g for g in s.plan.groups if g.strategy is not None]
    assert g.strategy.name == strategy
    assert f"8-byte accesses along the row ({VLANES[dtype]} elements a load or store)" in s.plan.explain()
    assert "8-byte" not in auto_schedule(list(wl.outputs), "cuda", rows={"vector_bytes": 16}).plan.explain()
    mod = _mod(wl)
    assert _vector_types(mod.source) == {VTYPE[dtype]}, _vector_types(mod.source)
    assert mod.cubin[:4] == b"\x7fELF"
    old = _mod(wl, {"rows": {"vector_bytes": 16}})
    assert _vector_types(old.source) == set() and old.cubin[:4] == b"\x7fELF"


@pytest.mark.parametrize("name, dtype, m, n, strategy", CASES[:5])
def test_8_byte_row_schedules_match_float64_in_any_thread_order(name, dtype, m, n, strategy):
    wl = getattr(w, name)(m=m, n=n, dtype=dtype)
    check_thread_orders(_mod(wl).program, name, _inputs(wl, m, n, dtype, seed=n), dtype)


@pytest.mark.parametrize("name, dtype, n, key", [("layernorm", "float16", 700, "n%4 int32 n<=768"),
                                                 ("softmax", "bfloat16", 2500, "n%4 int32 n<=3072"),
                                                 ("rmsnorm", "float16", 1300, "n%4 int32 n<=1536")])
def test_a_symbolic_row_whose_key_says_whole_8_byte_vectors_takes_them(name, dtype, n, key):
    """A 16-bit row of a `te.var` length whose call-time key says divisible by 4 and no more: its variant loads and
    stores 8 bytes at a time and matches float64 in every thread order. (The key has no divisibility by 2: a
    float32 row of an even length and a symbolic one keeps element accesses.)"""
    wl = getattr(w, name)(m=te.var("m"), n=te.var("n"), dtype=dtype)
    mod = _mod(wl)
    m = 3
    xs = _inputs(wl, m, n, dtype, seed=n)
    var = mod._select(mod.check((*xs, blocks.as_dtype(np.full((m, n), np.nan), dtype))))
    assert mod.specializations == [f"m* {key}"]
    assert _vector_types(var.source) == {VTYPE[dtype]}
    check_thread_orders(var.program, name, xs, dtype)


def test_vector_bytes_is_checked():
    wl = w.softmax(m=8, n=700, dtype="float16")
    with pytest.raises(ArgumentError, match="vector_bytes must be 8 or 16, got 12"):
        auto_schedule(list(wl.outputs), "cuda", rows={"vector_bytes": 12})


@pytest.mark.gpu
@pytest.mark.parametrize("name, dtype, m, n, strategy", CASES)
def test_gpu_8_byte_rows_match_float64(name, dtype, m, n, strategy):
    wl = getattr(w, name)(m=m, n=n, dtype=dtype)
    mod = _mod(wl)
    for seed in (1, 2):
        err = _call_error(mod, wl, name, m, n, dtype, seed)
        assert err < TOL[dtype], (seed, err)


@pytest.mark.gpu
@pytest.mark.parametrize("name, dtype, m, n, strategy", CASES[:4])
def test_gpu_8_byte_rows_at_misaligned_addresses(name, dtype, m, n, strategy):
    """Operands one element past an 8-byte boundary: every vector access takes its element-wise path."""
    import torch

    wl = getattr(w, name)(m=m, n=n, dtype=dtype)
    mod = _mod(wl)
    xs = _inputs(wl, m, n, dtype, seed=5)
    want = _reference(name, xs, dtype)
    tdt = getattr(torch, dtype)

    def shifted(a: np.ndarray) -> torch.Tensor:  # the same values one element into a larger buffer
        t = torch.from_numpy(blocks.as_float64(a, dtype)).to("cuda", tdt)
        big = torch.empty(t.numel() + 1, device="cuda", dtype=tdt)
        view = big[1:].view(t.shape)
        view.copy_(t)
        return view

    ins = [shifted(a) for a in xs]
    out = shifted(np.full((m, n), np.nan))
    mod(*ins, out)
    got = out.double().cpu().numpy()
    assert np.abs(got - want).max() / np.abs(want).max() < TOL[dtype]
