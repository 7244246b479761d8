"""The warpgroup GEMM's epilogue and the planner's choices around it.

- An epilogue that reads another tensor at the accumulator's row (a residual; a gate such as SwiGLU's other half)
  issues a chunk of those loads before it computes them (codegen.cuda.wgmma `_Emit.chunks`); an epilogue that
  reads a bias alone keeps its element order. On a GPU both match float64 at sizes the tiles do not divide, fixed
  and symbolic (the row guard's branch and the column guards).
- A cast to half precision that reads a GEMM stays that GEMM's epilogue where the stage it would be inlined into
  cannot be (schedules.fusion `_Planner._gemm_epilogue`): the GEMM writes float16, not its float32 accumulator.
- The tile's width follows the rounds of tiles the persistent grid walks (schedules.recipes.gemm_wgmma `tile_cols`).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from codegen import build
from codegen.cuda.cubin_info import cubin_resources
from codegen.cuda.kernel import generate_cuda
from codegen.cuda.nvrtc import compile_cubin
from codegen.passes import lower as lower_passes
from loopir import blocks, te
from schedules import auto_schedule
from schedules.recipes.gemm_wgmma import tile_cols

HALVES = ("float16", "bfloat16")


def _gated(n, m, p, dtype, kind):
    """y = A @ B + R (kind "residual") or (A @ B) * sigmoid(G) (kind "gate"), R and G (n, m) of `dtype`."""
    a = te.placeholder((n, p), dtype, name="A")
    b = te.placeholder((p, m), dtype, name="B")
    r = te.placeholder((n, m), dtype, name="R")
    k = te.reduce_axis(p, name="k")
    mm = te.compute((n, m), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="mm")
    if kind == "residual":
        y = te.compute((n, m), lambda i, j: mm[i, j] + r[i, j], name="y")
    else:
        y = te.compute((n, m), lambda i, j: mm[i, j] / (1.0 + te.exp(-r[i, j])), name="y")
    return [a, b, r], y


def _ref(a, b, r, kind):
    mm = a @ b
    return mm + r if kind == "residual" else mm / (1.0 + np.exp(-r))


def _source(sizes, dtype, kind):
    """The CUDA source of the variant a call at `sizes` runs (fixed sizes, or n, m, p symbolic)."""
    sym = isinstance(sizes[0], str)
    ins, y = _gated(*((te.var(x) for x in sizes) if sym else sizes), dtype, kind)
    mod = build([y], [*ins, y], target="cuda")
    if sym:
        sp = mod.specializer
        mod, _ = sp.select({v: {"n": 1000, "m": 776, "p": 200}[v.name] for v in sp.vars})
    return mod


# ----------------------------------------------------------------------------- the rendered epilogue


@pytest.mark.parametrize("kind", ["residual", "gate"])
@pytest.mark.parametrize("sizes", [(1024, 768, 256), ("n", "m", "p")])
def test_an_epilogue_reading_at_the_element_loads_its_box_by_tma(kind, sizes):
    """R, read at the stored element, is loaded by TMA into the store's shared box while the MMAs run; each lane
    reads its two elements where it then writes its results (codegen/cuda/wgmma_tma.py `pair_lanes`)."""
    gen = _source(sizes, "float16", kind)
    assert "wgmma.mma_async" in gen.source and "&R_tmap" in gen.source
    assert re.search(r"const unsigned wg_ax = loopir_ld_shared_u32\(wg_eb", gen.source)
    assert "loopir_h2f((unsigned short)(wg_ax & 0xffffu))" in gen.source
    assert not re.search(r"\bR\[", gen.source)  # never read from global memory
    (k,) = gen.gen.kernels
    assert [a.buffer.name for a in k.args if a.tmap] == ["A", "B", "y", "R"]
    regs, _ = cubin_resources(compile_cubin(gen.source, "sm_90", use_cache=False))[k.name]
    assert regs <= 168  # the producer's setmaxnreg.dec 40 and the consumers' .inc 232 need it


def _two(n, m, p, dtype="float16"):
    """y = A @ B + R + S: R loaded into the store's box, S read from global memory."""
    (a, b, r), _ = _gated(n, m, p, dtype, "residual")
    s_ = te.placeholder((n, m), dtype, name="S")
    k = te.reduce_axis(p, name="k")
    mm = te.compute((n, m), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="mm")
    return [a, b, r, s_], te.compute((n, m), lambda i, j: mm[i, j] + r[i, j] + s_[i, j], name="y")


def test_a_second_tensor_read_at_the_row_loads_a_chunk_ahead():
    ins, y = _two(1024, 768, 256)
    gen = build([y], [*ins, y], target="cuda")
    assert "&R_tmap" in gen.source and not re.search(r"\bR\[", gen.source)
    # S: the chunk's loads into registers under the element's condition, then the elements reading them
    pre = re.findall(r"(wg_e0_0\w*)\[2 \* wg_ii\w* \+ ([01])\] = \((.+?)\) \? loopir_h2f\(S\[", gen.source)
    assert {q for _, q, _ in pre} == {"0", "1"}, gen.source[-4000:]
    name = pre[0][0]
    assert re.search(rf"loopir_f2h\(.*{name}\[2 \* wg_ii\w* \+ 0\]", gen.source)
    assert len(re.findall(r"loopir_h2f\(S\[", gen.source)) == 2  # S is read nowhere else in the epilogue


@pytest.mark.gpu
@pytest.mark.parametrize("sizes", [(1000, 776, 200), (300, 264, 136)])
def test_a_box_loaded_and_a_tensor_read_match_float64_on_the_gpu(sizes):
    import torch

    n, m, p = sizes
    ins, y = _two(te.var("n"), te.var("m"), te.var("p"))
    mod = build([y], [*ins, y], target="cuda")
    g = torch.Generator(device="cuda").manual_seed(n)
    a = (torch.randn(n, p, device="cuda", generator=g) / p ** 0.5).half()
    b, r, s_ = (torch.randn(*sh, device="cuda", generator=g).half() for sh in ((p, m), (n, m), (n, m)))
    ref = a.double() @ b.double() + r.double() + s_.double()
    for _ in range(2):
        out = torch.full((n, m), float("nan"), device="cuda", dtype=torch.half)
        mod(a, b, r, s_, out)
        torch.cuda.synchronize()
        assert "&R_tmap" in mod.specializer.variants[mod._last_call[0]].source
        assert not torch.isnan(out).any()
        assert float((out.double() - ref).abs().max() / ref.abs().max()) < 2e-3


def test_a_bias_epilogue_keeps_its_element_order():
    from loopir import workloads as w

    wl = w.matmul_bias_relu(n=1024, m=768, p=256, dtype="float16")
    s = auto_schedule(list(wl.outputs), "cuda")
    gen = generate_cuda(lower_passes(s.program, "cuda"))
    assert "wgmma.mma_async" in gen.source and "wg_e0_0" not in gen.source and "wg_ii" not in gen.source


def test_a_load_under_a_select_is_not_issued_ahead():
    """A select may guard its load's bounds: that load stays where the select takes it."""
    n, m, p = 1024, 768, 256
    a = te.placeholder((n, p), "float16", name="A")
    b = te.placeholder((p, m), "float16", name="B")
    r = te.placeholder((n, m), "float16", name="R")
    k = te.reduce_axis(p, name="k")
    mm = te.compute((n, m), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="mm")
    y = te.compute((n, m), lambda i, j: te.where(j < m - 1, mm[i, j] + r[i, j + 1], mm[i, j]), name="y")
    s = auto_schedule([y], "cuda")
    gen = generate_cuda(lower_passes(s.program, "cuda"))
    assert "wgmma.mma_async" in gen.source and "wg_e0_0" not in gen.source


# ----------------------------------------------------------------------------- the planner


def test_a_half_cast_of_a_gemm_stays_its_epilogue_where_the_reader_cannot_be():
    """LLaMA's block: q and k feed the rotary embedding (which reads a partner column), o feeds a residual read by
    RMSNorm's reduction, w1 feeds SwiGLU, which is w3's epilogue: each stays its GEMM's epilogue, so the GEMMs
    write float16 and the readers read it (not the float32 accumulators)."""
    w = blocks.llama(B=2, T=128, C=256, H=4, dtype="float16")
    s = auto_schedule(list(w.outputs), "cuda")
    groups = {g.stage_names[0]: g.stage_names for g in s.plan.groups}
    for mm, cast in (("mm_q", "q"), ("mm_k", "k"), ("mm_o", "o"), ("mm_w1", "w1")):
        assert groups[mm] == [mm, cast], groups
    assert groups["mm_w3"] == ["mm_w3", "swiglu"]
    text = s.plan.explain()
    for mm, cast, reader in (("mm_q", "q", "q_rot"), ("mm_o", "o", "ms_rms2"), ("mm_w1", "w1", "swiglu")):
        assert (f"do not inline {cast}: kept as {mm}'s GEMM epilogue: inlined into {reader}, which cannot be {mm}'s "
                f"epilogue, it would make {mm} (float32, ") in text
    source = generate_cuda(lower_passes(s.program, "cuda")).source
    params = set(re.findall(r"(\w+(?: \w+)?)\* __restrict__ (\w+)", source))  # (C type, name)
    for mm, cast in (("mm_q", "q"), ("mm_k", "k"), ("mm_o", "o"), ("mm_w1", "w1")):
        assert ("unsigned short", cast) in params and not any(name == mm for _, name in params), mm


def test_a_cast_that_can_join_its_reader_in_the_epilogue_is_still_inlined():
    """GPT-2's fc = mm_fc + b_fc feeds GELU alone: inlined, and GELU is mm_fc's epilogue (one kernel)."""
    w = blocks.gpt2(B=2, T=128, C=256, H=4, dtype="float16")
    s = auto_schedule(list(w.outputs), "cuda")
    groups = {g.stage_names[0]: g.stage_names for g in s.plan.groups}
    assert groups["mm_fc"] == ["mm_fc", "gelu"]


@pytest.mark.parametrize("rows, cols, want", [
    (8192, 768, 192),     # 192 tiles of 256 columns: two rounds on 132 SMs; 256 of 192: two rounds of narrower ones
    (4096, 4096, 256),    # 512, 704, 1024 tiles: 4 rounds of 256 = 8 rounds of 128 < 6 rounds of 192
    (8192, 3072, 256),    # all three equal: the widest
    (1024, 4096, 128),    # fewer 128 x 256 tiles than SMs
])
def test_the_tile_width_fills_the_last_round(rows, cols, want):
    assert tile_cols(rows, cols, 1, 128) == want


def test_the_planner_takes_the_width_at_the_costed_sizes():
    w = blocks.gpt2(dtype="float16")
    text = auto_schedule(list(w.outputs), "cuda", sizes={"B": 8, "T": 1024}).plan.explain()
    assert re.findall(r"recipe applied to (mm_\w+)", text) == ["mm_q", "mm_k", "mm_v", "mm_proj", "mm_fc", "mm_fc2"]
    assert re.findall(r"split \w+ by 128 and j by (\d+)", text) == ["192"] * 4 + ["256", "192"]


# ----------------------------------------------------------------------------- on the GPU


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("kind", ["residual", "gate"])
@pytest.mark.parametrize("sizes, sym", [((1000, 776, 200), False), ((1000, 776, 200), True),
                                        ((4096, 768, 768), False), ((300, 264, 136), True)])
def test_gated_epilogues_match_float64_on_the_gpu(dtype, kind, sizes, sym):
    import torch

    n, m, p = sizes
    ins, y = _gated(*((te.var(x) for x in "nmp") if sym else sizes), dtype, kind)
    mod = build([y], [*ins, y], target="cuda")
    sp = mod.specializer
    run = sp.select({v: {"n": n, "m": m, "p": p}[v.name] for v in sp.vars})[0] if sym else mod
    assert "wgmma.mma_async" in run.source  # the variant this call takes
    tdt = getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(n + m + (kind == "gate"))
    a = (torch.randn(n, p, device="cuda", generator=g) / p ** 0.5).to(tdt)
    b = torch.randn(p, m, device="cuda", generator=g).to(tdt)
    r = torch.randn(n, m, device="cuda", generator=g).to(tdt)
    view = (lambda x: x.view(torch.uint16)) if dtype == "bfloat16" else (lambda x: x)
    ref = _ref(a.double().cpu().numpy(), b.double().cpu().numpy(), r.double().cpu().numpy(), kind)
    for _ in range(2):
        out = torch.full((n, m), float("nan"), device="cuda", dtype=tdt)
        mod(view(a), view(b), view(r), view(out))
        torch.cuda.synchronize()
        got = out.double().cpu().numpy()
        assert not np.isnan(got).any()
        err = float(np.abs(got - ref).max() / np.abs(ref).max())
        assert err < (1e-2 if dtype == "bfloat16" else 2e-3), err


@pytest.mark.parametrize("dtype, convert, rnd", [("float16", "loopir_f2h", "loopir_round_half"),
                                                 ("bfloat16", "loopir_f2bf", "loopir_round_bf16")])
def test_a_half_store_of_a_half_cast_converts_once(dtype, convert, rnd):
    """codegen.cuda.expr.unrounded: storing cast(half, v) converts v once (rounding to half first changes nothing);
    a cast inside the value (GELU's input, the half tensor fc) keeps its rounding."""
    w = blocks.gpt2(B=2, T=128, C=256, H=4, dtype=dtype)
    source = build(list(w.outputs), list(w.args), target="cuda").source
    assert f"{convert}({rnd}(" not in source
    assert re.search(rf"{convert}\(\(\(0\.5f \* \(\(float\)\({rnd}\(", source)  # GELU: the stored value, fc rounded
