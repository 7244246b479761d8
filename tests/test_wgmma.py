"""The GEMM on Hopper's warpgroup tensor cores (tensorize "gemm.wgmma", schedules/primitives/wgmma.py; rendered by
codegen/cuda/wgmma.py as a cp.async ring, or TMA on a persistent grid): the planner takes it for plain half-precision
matmuls and says so, its refusals name the part that does not match, the lowered program is right in any thread
order (the interpreter runs the marked tile once per block), the source compiles for sm_90a in both forms, and on a
GPU both forms match float64 for both half types, at sizes the tiles do not divide, with more tiles than blocks,
operands at unaligned addresses, symbolic sizes, and repeated calls on other arrays (tensor maps remade)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from codegen import build
from codegen.cuda.cubin_info import cubin_resources
from codegen.cuda.kernel import generate_cuda
from codegen.cuda.nvrtc import compile_cubin
from codegen.passes import lower as lower_passes
from loopir import interp, te
from loopir import workloads as w
from loopir.errors import ArgumentError, LoopirError
from loopir.lower import lower
from loopir.nodes import For
from loopir.visit import walk
from schedules import Schedule, auto_schedule
from schedules.primitives.wgmma import WGMMA, kernel_tile
from schedules.recipes.gemm import resolve_stage
from schedules.recipes.gemm_wgmma import schedule_gemm_wgmma
from test_tensorize import _as64, _out, _rel
from test_tensorize import _inputs as _tensorize_inputs

HALVES = ("float16", "bfloat16")


def _sched(n, m, p, dtype="float16"):
    wl = w.matmul_bias_relu(n=n, m=m, p=p, dtype=dtype)
    return Schedule(lower(list(wl.outputs), list(wl.inputs) + list(wl.outputs))), wl


def _inputs(dtype, n, m, p, seed):
    return _tensorize_inputs(None, dtype, n, m, p, seed)


def _ref(f64):
    return np.maximum(f64[0] @ f64[1] + f64[2], 0.0)


def _tiles(program):
    return [f for f in walk(program.body) if isinstance(f, For) and f.kind == WGMMA]


def _mode(source: str) -> str:
    return "tma" if "loopir_tma2d(" in source else "cp" if "wgmma.mma_async" in source else "none"


# ----------------------------------------------------------------------------- the planner


@pytest.mark.parametrize("dtype", HALVES)
def test_the_planner_takes_the_warpgroup_recipe_and_says_so(dtype):
    wl = w.matmul_bias_relu(n=1024, m=1024, p=512, dtype=dtype)
    s = auto_schedule(list(wl.outputs), "cuda")
    text = s.plan.explain()
    assert "Hopper's warpgroup recipe" in text and "tile (128, 128)" in text, text  # 8 x 4 tiles < 132: narrower
    assert [t for t in s.trace if t["primitive"] == "tensorize"][0]["args"][-1] == WGMMA
    assert len(_tiles(s.program)) == 1
    src = generate_cuda(lower_passes(s.program, "cuda")).source
    t = "f16" if dtype == "float16" else "bf16"
    assert f"wgmma.mma_async.sync.aligned.m64n128k16.f32.{t}.{t}" in src and _mode(src) == "tma"


@pytest.mark.parametrize("n, m, p, gemm, want", [
    (4096, 4096, 1024, None, (128, 256)),          # enough tiles: the widest
    (300, 200, 64, None, (128, 192)),              # 200 columns: the widest tile that fits
    (64, 512, 256, None, None),                    # under one 128-row tile: the SIMT skinny tiles
    (64, 512, 256, {"tensor_cores": True, "wgmma": {"block": (64, 256)}}, (64, 256)),  # asked: one warpgroup
    (256, 260, 64, None, None),                    # B's rows 260 long: not 16-byte aligned
    (256, 256, 36, None, None),                    # A's rows 36 long: the planner keeps SIMT
    (1024, 1024, 512, {"wgmma": False}, None),     # turned off: mma.sync
    (1024, 1024, 512, {"wgmma": {"block": (128, 192)}}, (128, 192)),
])
def test_the_tile_follows_the_shape_and_the_options(n, m, p, gemm, want):
    wl = w.matmul_bias_relu(n=n, m=m, p=p, dtype="float16")
    s = auto_schedule(list(wl.outputs), "cuda", gemm=gemm)
    tiles = _tiles(s.program)
    if want is None:
        assert not tiles
        return
    (f,) = tiles
    inner = next(g for g in walk(f.body) if isinstance(g, For))
    assert (int(f.hi.value), int(inner.hi.value)) == want


def test_symbolic_sizes_take_it_per_call_where_the_rows_are_aligned():
    wl = w.matmul_bias_relu(n=te.var("n"), m=te.var("m"), p=te.var("p"), dtype="float16")
    mod = build(list(wl.outputs), list(wl.inputs) + list(wl.outputs), target="cuda")
    assert _mode(mod.source) == "none"  # the generic module: m and p are not known multiples of 8
    spec = mod.specializer
    aligned, _ = spec.select(dict(zip(spec.vars, (4096, 4096, 4096))))
    odd, _ = spec.select(dict(zip(spec.vars, (1001, 1003, 999))))
    assert _mode(aligned.source) == "tma" and _mode(odd.source) == "none"


def test_a_batched_matmul_keeps_the_mma_sync_recipe():
    # each batch its own B (read at b): not a linear layer (tests/test_wgmma_batched.py has those)
    B, n = te.var("B"), te.var("n")
    x = te.placeholder((B, n, 256), "float16", name="x")
    wt = te.placeholder((B, 256, 512), "float16", name="w")
    k = te.reduce_axis(256, "k")
    y = te.compute((B, n, 512), lambda b, i, j: te.sum(x[b, i, k] * wt[b, k, j], axis=k), name="y")
    s = auto_schedule([y], "cuda")
    assert not _tiles(s.program) and "mma.sync m16n8k16" in s.plan.explain()


# ----------------------------------------------------------------------------- the primitive


def _tile_schedule(n=150, m=72, p=136, dtype="float16", rows=128, cols=64, cache=True):
    s, wl = _sched(n, m, p, dtype)
    upd, eps = resolve_stage(s.program, None, "auto", "test")
    i, j, _ = s.loops(upd.name)
    bi, ii = s.split(i, rows)
    bj, jj = s.split(j, cols)
    s.reorder(bi, bj, ii, jj)
    s.bind(bi, "blockIdx.y").bind(bj, "blockIdx.x")
    if cache:
        s.cache_write(upd.buffer.name, "local", jj, epilogue=eps)
    return s, ii, wl


def test_the_marked_tile_keeps_its_loops_and_replays_from_the_trace():
    s, ii, wl = _tile_schedule()
    before = s.program
    s.tensorize(ii, WGMMA)
    (f,) = _tiles(s.program)
    old = next(g for g in walk(before.body) if isinstance(g, For) and g.var is f.var)
    assert (old.lo, old.hi, old.body) == (f.lo, f.hi, f.body)  # only the kind changed: the same reference loops
    again = Schedule.replay(s.trace_json(), list(wl.outputs))
    assert str(again.program) == str(s.program)


@pytest.mark.parametrize("case, match", [
    ("float32", "the operands are not both float16 or both bfloat16 loads"),
    ("rows96", "has extent 96, not 64 or 128"),
    ("cols72", "has extent 72, not one of 64, 128, 192, 256"),
    ("unaligned", "B (B) rows are not provably 16-byte aligned (row length 260"),
    ("no_cache", "does not start its accumulator (a local buffer: cache_write it) at 0"),
    ("threads", "inside a threadIdx loop"),
])
def test_tensorize_refuses_what_is_not_a_tile_and_says_why(case, match):
    kw = {"float32": {"dtype": "float32"}, "rows96": {"rows": 96}, "cols72": {"cols": 72},
          "unaligned": {"m": 260}, "no_cache": {"cache": False}}.get(case, {})
    s, ii, _ = _tile_schedule(**kw)
    loop = ii
    if case == "threads":
        a, b = s.split(ii, 2)
        s.bind(a, "threadIdx.x")
        loop = b
    before = s.program
    with pytest.raises(LoopirError, match=re.escape(match)) as e:
        s.tensorize(loop, WGMMA)
    assert "tensorize" in str(e.value) and s.program is before


def test_a_transposed_operand_is_refused_by_name():
    A = te.placeholder((256, 128), "float16", name="A")
    Bt = te.placeholder((256, 128), "float16", name="Bt")  # B read as Bt[j, k]: not along the columns
    k = te.reduce_axis(128, "k")
    C = te.compute((256, 256), lambda i, j: te.sum(A[i, k] * Bt[j, k], axis=k), name="C")
    s = Schedule([C])
    i, j, _ = s.loops("C")
    bi, ii = s.split(i, 128)
    bj, jj = s.split(j, 128)
    s.reorder(bi, bj, ii, jj)
    s.bind(bi, "blockIdx.y").bind(bj, "blockIdx.x")
    s.cache_write("C", "local", jj)
    with pytest.raises(LoopirError, match=re.escape("B (Bt) is not read contiguously along 'j_i'")):
        s.tensorize(ii, WGMMA)


# ----------------------------------------------------------------------------- lowering, both kernel forms


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("rows, size, mode", [(128, (150, 72, 136), "tma"), (64, (100, 136, 72), "cp")])
def test_the_lowered_program_is_right_in_any_thread_order(dtype, rows, size, mode):
    n, m, p = size
    s, wl = _sched(n, m, p, dtype)
    schedule_gemm_wgmma(s, block=(rows, 64))
    low = lower_passes(s.program, "cuda")
    kern = next(x for x in walk(low.body) if type(x).__name__ == "Kernel")
    found = kernel_tile(kern.body)
    assert found is not None and (found[2] is not None) == (mode == "tma")
    host, f64 = _inputs(dtype, n, m, p, seed=5)
    for order in ("reversed", 1):
        out = _out(dtype, n, m)
        interp.run(low, *host, out, gpu_order=order)
        assert _rel(_as64(out, dtype), _ref(f64)) < 1e-2


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("rows, mode", [(128, "tma"), (64, "cp")])
def test_the_source_compiles_for_sm_90a_within_the_registers(dtype, rows, mode):
    s, wl = _sched(4096, 4096, 4096, dtype)
    schedule_gemm_wgmma(s, block=(rows, 256))
    gen = generate_cuda(lower_passes(s.program, "cuda"))
    assert _mode(gen.source) == mode
    (k,) = gen.kernels
    cubin = compile_cubin(gen.source, "sm_90", use_cache=False)  # wgmma: compiled for sm_90a
    regs, _ = cubin_resources(cubin)[k.name]
    if mode == "tma":  # 384 threads: the producer's setmaxnreg.dec 40 and the consumers' .inc 232 need <= 168
        assert regs <= 168 and "loopir_tmap" in gen.source and any(a.tmap for a in k.args)
        assert "setmaxnreg.inc.sync.aligned.u32 232" in gen.source
    else:
        assert "cp.async.cg.shared.global" in gen.source and not any(a.tmap for a in k.args)


# ----------------------------------------------------------------------------- on the GPU


def _torch_case(n, m, p, dtype, sym=False, offset=0, seed=0, schedule=None):
    import torch

    tdt = getattr(torch, dtype)
    wl = (w.matmul_bias_relu(n=te.var("n"), m=te.var("m"), p=te.var("p"), dtype=dtype) if sym
          else w.matmul_bias_relu(n=n, m=m, p=p, dtype=dtype))
    mod = build(list(wl.outputs), list(wl.inputs) + list(wl.outputs), target="cuda", schedule=schedule)
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(n * p + offset, device="cuda", generator=g).to(tdt)[offset:].view(n, p)
    b = torch.randn(p, m, device="cuda", generator=g).to(tdt)
    bias = torch.randn(m, device="cuda", generator=g).to(tdt)
    return mod, a, b, bias


def _run_check(mod, a, b, bias, dtype):
    import torch

    view = (lambda x: x.view(torch.uint16)) if dtype == "bfloat16" else (lambda x: x)
    out = torch.full((a.shape[0], b.shape[1]), float("nan"), device="cuda", dtype=a.dtype)
    mod(view(a), view(b), view(bias), view(out))
    torch.cuda.synchronize()
    ref = torch.relu(a.double() @ b.double() + bias.double())
    assert not torch.isnan(out).any()
    err = float((out.double() - ref).abs().max() / ref.abs().max())
    assert err < 1e-2, err


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("size", [(300, 264, 136), (4500, 1040, 72), (128, 256, 64), (64, 512, 200),
                                  (1000, 1000, 1000)])
def test_the_warpgroup_gemm_matches_float64_on_the_gpu(dtype, size):
    """Edges in every direction, more tiles (180) than resident blocks, one exact tile, the 64-row cp.async form."""
    n, m, p = size
    one_warpgroup = {"gemm": {"tensor_cores": True, "wgmma": {"block": (64, 256)}}}  # the cp.async form
    mod, a, b, bias = _torch_case(n, m, p, dtype, seed=n + m, schedule=one_warpgroup if n == 64 else None)
    assert _mode(mod.source) == ("cp" if n == 64 else "tma")
    _run_check(mod, a, b, bias, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("offset", [1, 3])
def test_operands_at_unaligned_addresses_match_on_the_gpu(offset):
    """A starts `offset` elements into its allocation: TMA reads an aligned copy (the cp.async form copies such
    chunks element-wise)."""
    mod, a, b, bias = _torch_case(300, 264, 136, "float16", offset=offset)
    _run_check(mod, a, b, bias, "float16")


@pytest.mark.gpu
def test_repeated_calls_on_other_arrays_remake_their_tensor_maps():
    """The second and third calls take the recorded launch plan: its tensor maps must follow the new pointers."""
    mod, a, b, bias = _torch_case(520, 264, 136, "float16")
    assert _mode(mod.source) == "tma"
    for seed in (1, 2, 3):
        _, a2, b2, bias2 = _torch_case(520, 264, 136, "float16", seed=seed)
        _run_check(mod, a2, b2, bias2, "float16")


@pytest.mark.gpu
@pytest.mark.parametrize("size", [(520, 264, 136), (520, 260, 136), (4096, 4096, 4096)])
def test_symbolic_sizes_match_on_the_gpu(size):
    n, m, p = size
    mod, a, b, bias = _torch_case(n, m, p, "bfloat16", sym=True, seed=7)
    _run_check(mod, a, b, bias, "bfloat16")


# ----------------------------------------------------------------------------- bad options


@pytest.mark.parametrize("gemm, match", [
    ({"wgmma": True}, "gemm wgmma must be None, False or a dict with 'block', got True"),
    ({"wgmma": {"tile": (128, 128)}}, "gemm wgmma must be a dict with some of block, got {'tile': (128, 128)}"),
    ({"wgmma": {"block": (96, 128)}}, "schedule_gemm_wgmma: block (96, 128): rows must be one of (64, 128)"),
    ({"wgmma": {"block": (128, 100)}}, "schedule_gemm_wgmma: block (128, 100)"),
])
def test_bad_wgmma_options_are_refused_by_name(gemm, match):
    wl = w.matmul_bias_relu(n=256, m=256, p=64, dtype="float16")
    with pytest.raises(ArgumentError, match=re.escape(match)):
        auto_schedule(list(wl.outputs), "cuda", gemm=gemm)


def test_the_recipe_refuses_batch_loops_it_cannot_collapse_by_name():
    # batch loops go on blockIdx.z collapsed into one; a symbolic inner one makes the collapse non-affine
    x = te.placeholder((4, te.var("H"), 128, 64), "float16", name="x")
    wt = te.placeholder((64, 128), "float16", name="w")
    k = te.reduce_axis(64, "k")
    y = te.compute(x.shape[:3] + (128,), lambda b, h, i, j: te.sum(x[b, h, i, k] * wt[k, j], axis=k), name="y")
    with pytest.raises(ArgumentError, match=re.escape("schedule_gemm_wgmma: the batch loops of 'y' (b, h) cannot "
                                                      "be collapsed into one grid dimension")):
        schedule_gemm_wgmma(Schedule([y]), "y")
