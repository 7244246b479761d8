"""The warpgroup GEMM's epilogue stored through TMA (schedules/primitives/wgmma.py `store_plan`,
codegen/cuda/wgmma_tma.py `_EmitTma.epilogue_tma`): the lanes stage their values in shared boxes of 64 x 64
halves and one thread per warpgroup stores each box with TMA, which drops the elements past the map's extents. The
plan is taken only where those extents are exactly the store's guards; the other epilogues keep the lanes' own
stores. On a GPU: edges in rows and columns, rows past a batch's T (a 3-d map), outputs at unaligned addresses (an
aligned copy written back, the bytes around the view untouched), both half types, against float64."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from codegen import build
from codegen.cuda.cubin_info import cubin_resources
from codegen.cuda.kernel import generate_cuda
from codegen.cuda.nvrtc import compile_cubin
from codegen.cuda.tensor_map import map_extents
from codegen.passes import lower as lower_passes
from loopir import te
from loopir import workloads as w
from loopir.affine import eval_index
from loopir.errors import LoopirError
from loopir.nodes import Compare, Kernel, binary, conjunction, conjuncts, const
from loopir.visit import walk
from schedules import auto_schedule
from schedules.primitives.wgmma import SHARED_MAX, STAGING_BYTES, kernel_tile, store_plan, wgmma_parts
from test_wgmma_batched import _data, _linear

HALVES = ("float16", "bfloat16")


def _tile(outs, args=None):
    s = auto_schedule(outs, "cuda")
    kern = next(x for x in walk(lower_passes(s.program, "cuda").body) if isinstance(x, Kernel))
    return kern, kernel_tile(kern.body)


def _matmul(dtype="float16", sym=False, out_dtype=None):
    # symbolic: the sizes a call-time specialization sees when m and p are multiples of 8 (codegen.specialize)
    n, m, p = (te.var("n"), 8 * te.var("m8"), 8 * te.var("p8")) if sym else (256, 384, 128)
    a = te.placeholder((n, p), dtype, name="A")
    b = te.placeholder((p, m), dtype, name="B")
    k = te.reduce_axis(p, "k")
    mm = te.compute((n, m), lambda i, j: te.sum(te.cast("float32", a[i, k]) * te.cast("float32", b[k, j]), axis=k),
                    name="mm")
    c = te.compute((n, m), lambda i, j: te.cast(out_dtype or dtype, mm[i, j] * 2.0), name="C")
    return c, [a, b, c]


# ----------------------------------------------------------------------------- the plan


@pytest.mark.parametrize("sym", [False, True])
def test_a_plain_matmul_stores_through_a_2d_map(sym):
    c, _ = _matmul(sym=sym)
    _, (f, p, plan) = _tile([c])
    assert plan is not None and plan.store is not None and plan.store.rank == 2 and plan.store.outer is None
    assert plan.store.store.buffer.name == "C"
    assert p.shape.staging == STAGING_BYTES and p.shape.tma_shared_bytes <= SHARED_MAX
    # the box's first row and column are the tile's (block loops at 2, 1: rows 2 * 128, columns 1 * cols)
    env = {plan.bi.var: 2, plan.bj.var: 1}
    assert eval_index(plan.store.row0, env) == 256 and eval_index(plan.store.col0, env) == p.shape.cols


def test_rows_of_a_batch_store_through_a_3d_map():
    """Symbolic T: the tile's rows stay inside one batch, and the map's rows are T (rows past T are dropped), its
    third dimension the batch."""
    y, _ = _linear(te.var("B"), te.var("T"))
    _, (f, p, plan) = _tile([y])
    sp = plan.store
    assert sp is not None and sp.rank == 3 and plan.bz is not None
    env = {plan.bz.var: 3, plan.bi.var: 2, plan.bj.var: 0}
    assert eval_index(sp.outer, env) == 3 and eval_index(sp.row0, env) == 256 and eval_index(sp.col0, env) == 0


@pytest.mark.parametrize("case", ["float32_out", "rows_not_16_bytes"])
def test_other_epilogues_keep_the_lanes_stores(case):
    if case == "float32_out":  # a float32 row of 64 elements is 256 bytes, past the 128-byte swizzle's width
        c, _ = _matmul(out_dtype="float32")
    else:  # m = 260: the map's row stride is not a multiple of 16 bytes
        wl = w.matmul_bias_relu(n=256, m=260, p=128, dtype="float16")
        c = wl.outputs[0]
    assert "loopir_tma_store2d(&" not in generate_cuda(lower_passes(auto_schedule([c], "cuda").program, "cuda")).source
    kern, found = _tile([c])
    assert (found is None) == (case == "rows_not_16_bytes")  # 260-element rows: no warpgroup tile at all
    if found is not None:
        f, p, plan = found
        assert store_plan(wgmma_parts(f)) is None and plan is not None and plan.store is None
        assert p.shape.staging == 0


@pytest.mark.parametrize("sym", [False, True])
def test_only_guards_that_are_the_maps_bounds_take_the_plan(sym):
    """TMA writes every element of a box inside the map: a guard stricter than the buffer's bounds (columns below
    m - 64) would have it write elements the reference leaves alone; a guard equal to a bound changes nothing."""
    c, _ = _matmul(sym=sym)
    _, (f, p, _) = _tile([c])
    st, idx, val, cond = p.stores[0]
    m = st.buffer.shape[-1]
    keep = list(conjuncts(cond)) if cond is not None else []
    for extra, ok in [(Compare("lt", idx[-1], m), True), (Compare("lt", idx[-1], binary("sub", m, const(64))), False),
                      (Compare("ge", binary("sub", m, binary("add", idx[-1], const(1))), const(0)), True),
                      (Compare("lt", idx[0], binary("sub", st.buffer.shape[0], const(1))), False)]:
        q = replace(p, stores=((st, idx, val, conjunction([*keep, extra])),))
        assert (store_plan(q) is not None) == ok, extra


def test_the_source_stores_boxes_and_fits_the_registers():
    c, args = _matmul()
    s = auto_schedule([c], "cuda")
    gen = generate_cuda(lower_passes(s.program, "cuda"))
    src = gen.source
    assert "loopir_tma_store2d(&" in src and "cp.async.bulk.wait_group.read 1" in src
    assert "fence.proxy.async.shared::cta" in src and "cp.async.bulk.wait_group 0" in src
    (k,) = gen.kernels
    maps = [a for a in k.args if a.tmap]
    assert [(a.buffer.name, a.tmap, a.written) for a in maps if a.written] == [("C", (64, 64), True)]
    regs, _ = cubin_resources(compile_cubin(src, "sm_90", use_cache=False))[k.name]
    assert regs <= 168


def test_map_extents_of_rank_two_and_three():
    assert map_extents([2, 40, 64], 2) == (64, 80) and map_extents([2, 40, 64], 3) == (64, 40, 2)
    assert map_extents([3, 5, 7, 16], 3) == (16, 7, 15) and map_extents((7, 8), 2) == (8, 7)
    with pytest.raises(LoopirError, match="rank 3"):
        map_extents((7, 8), 3)


# ----------------------------------------------------------------------------- on the GPU


def _ref_relu(a, b, bias):
    return np.maximum(a.astype(np.float64) @ b.astype(np.float64) + bias.astype(np.float64), 0.0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("size", [(1000, 776, 200), (256, 384, 128), (4500, 1040, 72)])
def test_boxes_at_the_edges_match_float64_on_the_gpu(dtype, size):
    """776 columns: the last box holds 8 of them; 1000 rows: the last warpgroup's box holds 40; symbolic sizes."""
    import torch

    n, m, p = size
    wl = w.matmul_bias_relu(n=te.var("n"), m=te.var("m"), p=te.var("p"), dtype=dtype)
    mod = build(list(wl.outputs), list(wl.inputs) + list(wl.outputs), target="cuda")
    g = torch.Generator(device="cuda").manual_seed(n)
    tdt = getattr(torch, dtype)
    a, b, bias = (torch.randn(*s, device="cuda", generator=g).to(tdt) for s in ((n, p), (p, m), (m,)))
    out = torch.full((n, m), float("nan"), device="cuda", dtype=tdt)
    view = (lambda x: x.view(torch.uint16)) if dtype == "bfloat16" else (lambda x: x)
    mod(view(a), view(b), view(bias), view(out))
    torch.cuda.synchronize()
    variant = mod.specializer.variants[mod._last_call[0]]
    assert "loopir_tma_store2d(&" in variant.source
    ref = torch.relu(a.double() @ b.double() + bias.double())
    assert not torch.isnan(out).any()
    assert float((out.double() - ref).abs().max() / ref.abs().max()) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("offset", [1, 3, 8])
def test_an_output_at_an_unaligned_address_is_written_back_and_nothing_around_it(offset):
    """The output starts `offset` halves into its allocation: TMA stores into an aligned copy, copied back after the
    launch; the halves before and after the view stay as they were (NaN)."""
    import torch

    n, m, p = 300, 264, 136
    wl = w.matmul_bias_relu(n=n, m=m, p=p, dtype="float16")
    mod = build(list(wl.outputs), list(wl.inputs) + list(wl.outputs), target="cuda")
    assert "loopir_tma_store2d(&" in mod.source
    g = torch.Generator(device="cuda").manual_seed(offset)
    a, b, bias = (torch.randn(*s, device="cuda", generator=g).half() for s in ((n, p), (p, m), (m,)))
    for _ in range(2):  # the first call, then the recorded plan's
        whole = torch.full((n * m + offset + 16,), float("nan"), device="cuda", dtype=torch.half)
        out = whole[offset:offset + n * m].view(n, m)
        mod(a, b, bias, out)
        torch.cuda.synchronize()
        ref = torch.relu(a.double() @ b.double() + bias.double())
        assert not torch.isnan(out).any()
        assert float((out.double() - ref).abs().max() / ref.abs().max()) < 1e-2
        assert torch.isnan(whole[:offset]).all() and torch.isnan(whole[offset + n * m:]).all()


@pytest.mark.gpu
def test_rows_past_a_batchs_t_are_not_stored_on_the_gpu():
    """Symbolic B, T with T not a multiple of 64: a box's rows past T belong to the next batch in memory; the 3-d
    map drops them. Each batch's rows match float64 and the output is written exactly (NaN-poisoned before)."""
    y, args = _linear(te.var("B"), te.var("T"))
    mod = build([y], args, target="cuda")
    for sizes in [(3, 100), (2, 40), (4, 129), (3, 100)]:
        host, ref = _data(sizes, seed=sizes[1] + 1)
        out = np.full(ref.shape, np.nan, np.float16)
        mod(*host, out)
        variant = mod.specializer.variants[mod._last_call[0]]
        assert "loopir_tma_store3d(&" in variant.source, sizes
        got = out.astype(np.float64)
        assert not np.isnan(got).any(), sizes
        assert np.abs(got - ref).max() / np.abs(ref).max() < 1e-2, sizes


@pytest.mark.gpu
def test_kernel_times_of_an_unaligned_output_write_it_back():
    """`kernel_times` replays recorded launches whose maps point into the aligned copies: the copies stay alive
    until the replays end, then the output is written back (and the halves around it are left alone)."""
    import torch

    n, m, p = 300, 264, 136
    wl = w.matmul_bias_relu(n=n, m=m, p=p, dtype="float16")
    mod = build(list(wl.outputs), list(wl.inputs) + list(wl.outputs), target="cuda")
    g = torch.Generator(device="cuda").manual_seed(5)
    a, b, bias = (torch.randn(*s, device="cuda", generator=g).half() for s in ((n, p), (p, m), (m,)))
    whole = torch.full((n * m + 17,), float("nan"), device="cuda", dtype=torch.half)
    out = whole[1:1 + n * m].view(n, m)
    times = mod.kernel_times(a, b, bias, out, warmup=1, repeat=3)
    torch.cuda.synchronize()
    assert times and all(t > 0 for t in times.values())
    ref = torch.relu(a.double() @ b.double() + bias.double())
    assert not torch.isnan(out).any() and torch.isnan(whole[0]) and torch.isnan(whole[1 + n * m:]).all()
    assert float((out.double() - ref).abs().max() / ref.abs().max()) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("offset", [1, 8])
def test_a_residual_at_an_unaligned_address_is_loaded_from_its_copy(offset):
    """The tensor loaded into the store's boxes (R of y = A @ B + R) starts `offset` halves into its allocation: its
    map reads an aligned copy (not written back: the kernel only reads it)."""
    import torch

    n, m, p = 1000, 776, 200
    a_ = te.placeholder((n, p), "float16", name="A")
    b_ = te.placeholder((p, m), "float16", name="B")
    r_ = te.placeholder((n, m), "float16", name="R")
    k = te.reduce_axis(p, "k")
    mm = te.compute((n, m), lambda i, j: te.sum(a_[i, k] * b_[k, j], axis=k), name="mm")
    y = te.compute((n, m), lambda i, j: mm[i, j] + r_[i, j], name="y")
    mod = build([y], [a_, b_, r_, y], target="cuda")
    assert "&R_tmap" in mod.source
    g = torch.Generator(device="cuda").manual_seed(offset)
    a = (torch.randn(n, p, device="cuda", generator=g) / p ** 0.5).half()
    b = torch.randn(p, m, device="cuda", generator=g).half()
    rr = torch.randn(n * m + offset, device="cuda", generator=g).half()
    r = rr[offset:].view(n, m)
    before = rr.clone()
    out = torch.full((n, m), float("nan"), device="cuda", dtype=torch.half)
    mod(a, b, r, out)
    torch.cuda.synchronize()
    ref = a.double() @ b.double() + r.double()
    assert not torch.isnan(out).any() and torch.equal(rr, before)
    assert float((out.double() - ref).abs().max() / ref.abs().max()) < 2e-3


# ----------------------------------------------------------------------------- aligned copies (a fake driver)


class _Driver:
    """The driver calls map_value and free_scratch make, recorded; `fail` names one that returns an error."""

    class CUresult:
        CUDA_SUCCESS = 0

    def __init__(self, fail: str = "") -> None:
        self.fail, self.calls = fail, []

    def _ret(self, name: str, *args):
        self.calls.append((name, *args))
        return 1 if name == self.fail else 0

    def cuMemAllocAsync(self, nbytes, stream):  # noqa: N802 - the driver's name
        return self._ret("alloc", nbytes), 0x1000

    def cuMemcpyDtoDAsync(self, dst, src, nbytes, stream):  # noqa: N802
        return (self._ret(f"copy {dst:#x}<-{src:#x}", nbytes),)

    def cuMemFreeAsync(self, ptr, stream):  # noqa: N802
        self._ret("free", ptr)


def test_an_unaligned_written_tensor_is_copied_in_and_back_and_freed(monkeypatch):
    import codegen.cuda.tensor_map as tm

    monkeypatch.setattr(tm, "tensor_map", lambda cu, ptr, *a: ("map of", ptr))
    cu, scratch = _Driver(), []
    assert tm.map_value(cu, 0x2002, "float16", (8, 3), 2, (64, 64), True, None, scratch) == ("map of", 0x1000)
    assert tm.map_value(cu, 0x3000, "float16", (8, 3), 2, (64, 64), True, None, scratch) == ("map of", 0x3000)
    tm.free_scratch(cu, scratch, None)
    assert cu.calls == [("alloc", 48), ("copy 0x1000<-0x2002", 48), ("copy 0x2002<-0x1000", 48), ("free", 0x1000)]
    cu, scratch = _Driver(), []  # read only: copied in, never back
    tm.map_value(cu, 0x2002, "bfloat16", (8, 3, 2), 2, (64, 64, 1), False, None, scratch)
    tm.free_scratch(cu, scratch, None)
    assert [c[0] for c in cu.calls] == ["alloc", "copy 0x1000<-0x2002", "free"] and cu.calls[0][1] == 96


@pytest.mark.parametrize("fail, match", [("alloc", r"cuMemAllocAsync\(48\) for an aligned copy of a tensor failed"),
                                         ("copy 0x1000<-0x2002", "of a tensor to its aligned copy failed"),
                                         ("copy 0x2002<-0x1000", "of an aligned copy back to its tensor failed")])
def test_a_failed_copy_of_an_unaligned_tensor_is_an_error_naming_the_step(monkeypatch, fail, match):
    import codegen.cuda.tensor_map as tm
    from loopir.errors import RuntimeLaunchError

    monkeypatch.setattr(tm, "tensor_map", lambda cu, ptr, *a: ptr)
    cu, scratch = _Driver(fail), []
    with pytest.raises(RuntimeLaunchError, match=match):
        tm.map_value(cu, 0x2002, "float16", (8, 3), 2, (64, 64), True, None, scratch)
        tm.free_scratch(cu, scratch, None)


@pytest.mark.gpu
@pytest.mark.parametrize("offset", [0, 1])
def test_a_prepared_call_replays_its_launches_with_maps_remade(offset):
    """`launch` of a prepared call records its launches the first time and replays them later (benchmarks and the
    tuner launch one prepared call many times): each replay writes the whole output again (poisoned between
    launches), through a fresh aligned copy when the output is unaligned, and leaves the halves around it alone."""
    import torch

    n, m, p = 300, 264, 136
    wl = w.matmul_bias_relu(n=n, m=m, p=p, dtype="float16")
    mod = build(list(wl.outputs), list(wl.inputs) + list(wl.outputs), target="cuda")
    g = torch.Generator(device="cuda").manual_seed(11 + offset)
    a, b, bias = (torch.randn(*s, device="cuda", generator=g).half() for s in ((n, p), (p, m), (m,)))
    whole = torch.full((n * m + offset + 16,), float("nan"), device="cuda", dtype=torch.half)
    out = whole[offset:offset + n * m].view(n, m)
    prep = mod.prepare((a, b, bias, out))
    ref = torch.relu(a.double() @ b.double() + bias.double())
    for k in range(3):
        out.fill_(float("nan"))
        mod.launch(prep)
        torch.cuda.synchronize()
        assert prep.replay is not None, k  # recorded by the first launch, replayed by the others
        assert not torch.isnan(out).any(), k
        assert float((out.double() - ref).abs().max() / ref.abs().max()) < 1e-2, k
        assert torch.isnan(whole[:offset]).all() and torch.isnan(whole[offset + n * m:]).all(), k
    mod.finish(prep)
