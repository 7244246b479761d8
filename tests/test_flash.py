"""The online-softmax pass of half-precision attention on tensor cores (tensorize "attention.m16n8k16",
schedules/primitives/flash.py; rendered by codegen/cuda/flash.py): the planner takes it and says so, its refusals
name the part that does not match, the lowered program stays right in any thread order (the interpreter runs the
marked nest once per block), the source compiles within the static shared-memory budget, and on a GPU the kernel
matches float64 for both half types, the three masks, head dimensions 16 to 64, sizes the tiles do not divide,
rows whose global address is not 16-byte aligned, and a score and mask that read the row and key indices."""

from __future__ import annotations

import itertools
import math
import re

import numpy as np
import pytest

from codegen import build
from codegen.cuda.build import cuda_source
from codegen.cuda.cubin_info import cubin_resources
from codegen.cuda.flash import scale_of
from codegen.cuda.nvrtc import compile_cubin
from codegen.passes import lower as lower_passes
from codegen.passes.launch import INT32_SLACK, padded_reach
from loopir import blocks, interp, te, workloads
from loopir.args import eval_expr
from loopir.errors import LoopirError
from loopir.nodes import Binary, For, Var, const
from loopir.visit import walk
from schedules import Schedule, auto_schedule
from schedules.attention import apply_online, attention_rewrites
from schedules import attention as attention_mod
from schedules.primitives.flash import (FLASH, FLASH_KINDS, FLASH_TF32, FLASH_WGMMA, KEYS, ROWS, affine_conjuncts,
                                       flash_parts)
from schedules.primitives.tensorize import TensorizeError

HALVES = ("float16", "bfloat16")


def _naive(dtype: str, mask: str | bool = "causal", d: int = 64):
    w = workloads.naive_attention(te.var("B"), te.var("n"), te.var("m"), d, mask, dtype=dtype)
    return list(w.inputs), w.outputs[0]


def _custom(dtype: str, d: int = 32, offset: int = 4, window: int = 50):
    """Q rows that start `offset` elements into a wider row (not 16-byte aligned), an ALiBi-like score that reads the
    row and key indices, and a sliding-window mask (keys i - window < j <= i: dead tiles at both ends)."""
    B, n, m = te.var("B"), te.var("n"), te.var("m")
    Q = te.placeholder((B, n, d + offset), dtype, name="Q")
    K = te.placeholder((B, m, d), dtype, name="K")
    V = te.placeholder((B, m, d), dtype, name="V")
    r = te.reduce_axis(d, "r")
    f = lambda x: te.cast("float32", x)  # noqa: E731
    S = te.compute((B, n, m), lambda b, i, j: te.sum(f(Q[b, i, r + offset]) * f(K[b, j, r]), axis=r), name="S")
    Sm = te.compute((B, n, m), lambda b, i, j: te.where((j <= i) & (j > i - window),
                                                        S[b, i, j] * 0.2 - 0.05 * te.cast("float32", i - j),
                                                        float("-inf")), name="Sm")
    r2, r3, r4 = te.reduce_axis(m, "r2"), te.reduce_axis(m, "r3"), te.reduce_axis(m, "r4")
    mx = te.compute((B, n), lambda b, i: te.max(Sm[b, i, r2], axis=r2), name="mx")
    P = te.compute((B, n, m), lambda b, i, j: te.exp(Sm[b, i, j] - mx[b, i]), name="P")
    sm = te.compute((B, n), lambda b, i: te.sum(P[b, i, r3], axis=r3), name="sm")
    O = te.compute((B, n, d), lambda b, i, c: te.sum(P[b, i, r4] * f(V[b, r4, c]), axis=r4), name="O")  # noqa: E741
    Y = te.compute((B, n, d), lambda b, i, c: te.cast(dtype, O[b, i, c] / sm[b, i]), name="Y")
    return [Q, K, V], Y


def _custom_reference(q, k, v, d=32, offset=4, window=50):
    q64, k64, v64 = (x.astype(np.float64) for x in (q[..., offset:offset + d], k, v))
    s = np.einsum("bir,bjr->bij", q64, k64) * 0.2
    i = np.arange(q.shape[1])[:, None]
    j = np.arange(k.shape[1])[None, :]
    s = np.where((j <= i) & (j > i - window), s - 0.05 * (i - j), -np.inf)
    with np.errstate(invalid="ignore"):
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        return np.einsum("bij,bjc->bic", p, v64) / p.sum(axis=-1)[..., None]


def _half(a: np.ndarray, dtype: str) -> np.ndarray:
    return blocks.as_dtype(a, dtype)


def _f32(a: np.ndarray, dtype: str) -> np.ndarray:
    return blocks.as_float64(a, dtype).astype(np.float32)


def _flash_loops(program) -> list[For]:
    return [f for f in walk(program.body) if isinstance(f, For) and f.kind in FLASH_KINDS]


def _split_pass(dtype: str = "float16", rows: int = ROWS, d: int = 64):
    """The rewritten pass with its rows split by `rows` and the blocks bound (what the planner does first)."""
    args, y = _naive(dtype, d=d)
    s = Schedule([y])
    apply_online(s, attention_rewrites(s.program))
    nest = s.program.body.body[0]
    b, i = s.loop(s._ref(nest.var)), s.loop(s._ref(nest.body.var))
    io, ii = s.split(i, rows)
    s.bind(io, "blockIdx.x").bind(b, "blockIdx.y")
    return s, ii, y


# ----------------------------------------------------------------------------- the planner and the primitive


@pytest.mark.parametrize("dtype, d", [("float16", 64), ("bfloat16", 64), ("float16", 128), ("bfloat16", 32)])
def test_the_planner_puts_half_attention_on_tensor_cores_and_says_so(dtype, d):
    """Head dimensions 64 and 128 go to the warpgroup kernel (attention.wgmma), others to mma.sync."""
    args, y = _naive(dtype, d=d)
    s = auto_schedule([y], "cuda")
    (f,) = _flash_loops(s.program)
    wg = d in (64, 128)
    assert f.kind == (FLASH_WGMMA if wg else FLASH)
    assert any(step["primitive"] == "tensorize" and f.kind in map(str, step["args"]) for step in s.trace)
    text = s.plan.explain()
    rows = 128 if d <= 64 or wg else 64
    what = "warpgroup tensor cores" if wg else "tensor cores"
    assert f"a block per {rows} query rows of one batch on {what} ({f.kind}" in text and s.plan.notes == ()
    assert ("filled by TMA" in text) == wg
    src = cuda_source(lower_passes(s.program, "cuda")).source
    if wg:
        # S = Q K^T (a tile of keys) in the prologue and the loop, d / 16 steps each; O += P V (d columns), a step
        # per 16 keys
        keys = 64 if d == 64 else 128
        assert src.count("wgmma.mma_async.sync.aligned.m64n") == 2 * d // 16 + keys // 16
        assert f"wgmma.mma_async.sync.aligned.m64n{keys}k16.f32" in src and f"m64n{d}k16.f32" in src
        assert "mma.sync" not in src
    else:
        assert src.count("mma.sync.aligned.m16n8k16") == 4 and "ldmatrix.sync.aligned.m8n8.x4.trans" in src
    regs, smem = cubin_resources(compile_cubin(src, "sm_90", use_cache=False))["Y_mx_init"]
    assert smem <= 48 * 1024 and regs <= 255


@pytest.mark.parametrize("mask, d, heavy", [("causal", 64, True), ("causal", 128, True), ("causal", 32, True),
                                            (False, 64, False)])
def test_a_causal_pass_launches_its_heaviest_row_blocks_first(mask, d, heavy):
    """Under a causal mask the last row blocks see the most keys: the pass's blocks are launched in groups of
    batches, row blocks descending (codegen.cuda.flash.heavy_first); without a mask, or with a sliding window (every
    block sees as many keys), the hardware's order stays."""
    args, y = _naive("float16", mask, d=d)
    src = cuda_source(lower_passes(auto_schedule([y], "cuda").program, "cuda")).source
    per_wave = 2 * 132 * (2 if d <= 64 else 1)  # FlashShape.blocks_per_sm
    assert (f"i_o = (long long)loopir_heavy_row({per_wave}u);" in src) == heavy
    assert (f"b = (long long)loopir_heavy_batch({per_wave}u);" in src) == heavy
    args, y = _custom("float16", d=64)  # a sliding window
    window = cuda_source(lower_passes(auto_schedule([y], "cuda").program, "cuda")).source
    assert "(long long)loopir_heavy_row(" not in window


def _heavy(gx: int, gy: int, per_wave: int, bx: int, by: int) -> tuple[int, int]:
    """loopir_heavy_row / loopir_heavy_batch of codegen/cuda/flash.py's prelude, in Python (unsigned arithmetic)."""
    g = (per_wave + gx - 1) // gx
    v = bx + gx * by
    first = v // (g * gx) * g
    k = min(g, gy - first)
    return gx - 1 - (v - first * gx) // k, first + (v - first * gx) % k


@pytest.mark.parametrize("gx, gy, per_wave", [(32, 64, 528), (8, 4, 528), (1, 7, 264), (300, 3, 264), (33, 65, 528),
                                               (16, 128, 528), (5, 1, 528)])
def test_the_heavy_first_order_is_a_permutation_of_the_grid(gx, gy, per_wave):
    order = [_heavy(gx, gy, per_wave, bx, by) for by in range(gy) for bx in range(gx)]  # the launch order
    assert sorted(order) == [(x, y) for x in range(gx) for y in range(gy)]  # every block once
    g = -(-per_wave // gx)
    for start in range(0, gy, g):  # each group of batches: its row blocks descending, every batch of it in turn
        part = [o for o in order if start <= o[1] < start + g]
        assert [x for x, _ in part] == sorted((x for x, _ in part), reverse=True)
        assert part == order[start * gx:start * gx + len(part)]


def _attention_then(final, dtype: str = "float16", d: int = 64, width: int | None = None):
    """naive attention up to O and sm, then Y (`width` columns, default d) = final(O, sm, b, i, c) (the step after
    the softmax's sums)."""
    B, n, m = te.var("B"), te.var("n"), te.var("m")
    Q, K, V = (te.placeholder((B, x, d), dtype, name=nm) for x, nm in ((n, "Q"), (m, "K"), (m, "V")))
    r, r2, r3, r4 = (te.reduce_axis(x, nm) for x, nm in ((d, "r"), (m, "r2"), (m, "r3"), (m, "r4")))
    S = te.compute((B, n, m), lambda b, i, j: te.sum(Q[b, i, r] * K[b, j, r], axis=r) * (1.0 / math.sqrt(d)),
                   name="S")
    mx = te.compute((B, n), lambda b, i: te.max(S[b, i, r2], axis=r2), name="mx")
    P = te.compute((B, n, m), lambda b, i, j: te.exp(S[b, i, j] - mx[b, i]), name="P")
    sm = te.compute((B, n), lambda b, i: te.sum(P[b, i, r3], axis=r3), name="sm")
    o = te.compute((B, n, d), lambda b, i, c: te.sum(P[b, i, r4] * V[b, r4, c], axis=r4), name="O")
    Y = te.compute((B, n, width or d), lambda b, i, c: final(o, sm, b, i, c), name="Y")
    return [Q, K, V], Y


@pytest.mark.parametrize("mask", ["causal", False])
def test_the_division_is_the_tensor_core_passs_epilogue(mask):
    """Y = O / sm after the pass: fused into the pass's row loops (two checked fuse steps), rendered on the
    registers; O, sm and mx, read by nothing else, are not stored: one kernel."""
    args, y = _naive("float16", mask, d=64)
    s = auto_schedule([y], "cuda")
    steps = [st["primitive"] for st in s.trace]
    assert steps[:3] == ["online_softmax", "fuse", "fuse"] and "tensorize" in steps
    (f,) = _flash_loops(s.program)
    p = flash_parts(f, s.program)
    assert p.epilogue is not None and p.epilogue.buffer.name == "Y" and p.dead == {"O", "sm", "mx"}
    assert "cuda: Y (the division by the sums) is the pass's epilogue" in s.plan.explain()
    src = cuda_source(lower_passes(s.program, "cuda")).source
    assert src.count("__global__") == 1
    # a half output: the quotient by the sum's reciprocal (kernel.half_outputs), one per row once the loop unrolls
    assert re.search(r"Y\[.*\] = loopir_f2h\(loopir_div_half\(fa_ov, fa_lv\)\);", src)
    assert not re.search(r"\b(O|sm|mx)\[[^\]]*\] = ", src)  # never stored
    # the values: test_the_lowered_program_is_right_in_any_thread_order runs this program on the interpreter


@pytest.mark.parametrize("final, width, match", [
    (lambda o, sm, b, i, c: o[b, i, 63 - c] / sm[b, i], None,
     "the epilogue reads O other than as the row's final O and sum"),
    (lambda o, sm, b, i, c: o[b, i, c] / sm[b, i], 32, "the statement after the key loop is not a loop over the 64 "
                                                       "columns of O"),
])
def test_an_epilogue_that_is_not_per_column_stays_a_kernel_of_its_own(final, width, match):
    """Y = O[.., 63 - c] / sm reads another column than the thread holds; Y over 32 of O's 64 columns is not a loop
    over O's columns: neither is the pass's epilogue, so the division stays a second kernel and the pass stores O
    and sm; fused by hand, tensorize refuses the nest and its message names O."""
    args, y = _attention_then(final, width=width)
    s = auto_schedule([y], "cuda")
    assert "fuse" not in [st["primitive"] for st in s.trace]
    (f,) = _flash_loops(s.program)
    assert flash_parts(f, s.program).epilogue is None and "pass's epilogue" not in s.plan.explain()
    src = cuda_source(lower_passes(s.program, "cuda")).source
    assert src.count("__global__") == 2 and re.search(r"\bO\[[^\]]*\] = ", src)
    s2 = Schedule([y])
    apply_online(s2, attention_rewrites(s2.program))
    s2.fuse(s2.loop("b#0"), s2.loop("b#1"))  # the pass's rows, then the division's
    s2.fuse(s2.loop("i#0"), s2.loop("i#1"))
    _, ti = s2.split(s2.loop("i"), 128)
    before = s2.program
    with pytest.raises(TensorizeError, match=re.escape(match)):
        s2.tensorize(ti, FLASH_WGMMA)
    assert s2.program is before


def test_an_epilogue_may_read_inputs_the_pass_does_not_write():
    """Y = O / sm * w[c]: the weights are read in the epilogue (the pass does not write them)."""
    w = te.placeholder((64,), "float16", name="w")
    args, y = _attention_then(lambda o, sm, b, i, c: o[b, i, c] / sm[b, i] * w[c])
    s = auto_schedule([y], "cuda")
    (f,) = _flash_loops(s.program)
    assert flash_parts(f, s.program).epilogue is not None
    src = cuda_source(lower_passes(s.program, "cuda")).source
    assert src.count("__global__") == 1
    assert re.search(r"Y\[.*\] = loopir_f2h\(\(loopir_div_half\(fa_ov, fa_lv\) \* loopir_h2f\(w\[", src)
    # the scheduled program, in adversarial thread orders, against float64
    rng = np.random.default_rng(43)
    B, n, m = 2, 70, 45
    q, k, v = (rng.standard_normal((B, x, 64)).astype(np.float16) for x in (n, m, m))
    wv = rng.standard_normal(64).astype(np.float16)
    want = workloads.naive_attention_reference(q, k, v, False, 1.0 / math.sqrt(64)) * wv.astype(np.float64)
    low = lower_passes(s.program, "cuda")
    for order in ("reversed", 1):
        got = np.full((B, n, 64), np.nan, np.float16)
        interp.run(low, q, k, v, wv, got, gpu_order=order, sizes={"B": B, "n": n, "m": m})
        assert np.abs(got - want).max() < 1e-2 * np.abs(want).max()


def test_the_mma_sync_kernel_stays_available_for_head_dimension_64(monkeypatch):
    monkeypatch.setattr(attention_mod, "WGMMA_ATTENTION", False)
    args, y = _naive("float16", d=64)
    (f,) = _flash_loops(auto_schedule([y], "cuda").program)
    assert f.kind == FLASH


def test_the_online_option_picks_the_tensor_core_kernels_and_refuses_what_it_does_not_know():
    """`online={...}` (AttentionParams) offers the pass to the kernels named; a build for sm_80 takes mma.sync
    (the warpgroup kernel is sm_90a only) and compiles; unknown keys and non-bools are refused by name."""
    args, y = _naive("float16", d=64)
    for online, kind in (({"wgmma": False}, FLASH), ({}, FLASH_WGMMA), (True, FLASH_WGMMA)):
        (f,) = _flash_loops(auto_schedule([y], "cuda", online=online).program)
        assert f.kind == kind, online
    assert not _flash_loops(auto_schedule([y], "cuda", online={"tensor_cores": False}).program)
    mod = build([y], [*args, y], target="cuda", arch="sm_80")
    assert "wgmma" not in mod.source and "mma.sync.aligned.m16n8k16" in mod.source and mod.cubin[:4] == b"\x7fELF"
    assert "wgmma.mma_async" in build([y], [*args, y], target="cuda", arch="sm_90a").source
    named = build([y], [*args, y], target="cuda", arch="sm_80", schedule={"online": False})
    assert "mma.sync" not in named.source  # the caller's False: no rewrite, no tensor cores
    for bad, match in (({"wgmma": 1}, r"online\['wgmma'\] must be a bool"), ({"mma": True}, "no option 'mma'"),
                       ("yes", "online must be a bool or a dict")):
        with pytest.raises(LoopirError, match=match):
            auto_schedule([y], "cuda", online=bad)


@pytest.mark.parametrize("d, tf32", [(64, False), (128, True)])
def test_float32_attention_keeps_the_simt_pass_off_the_tf32_kernel(d, tf32, monkeypatch):
    """With the TF32 kernel turned off, or a head dimension above the 64 it holds: the SIMT pass, and the plan
    says why not tensor cores."""
    monkeypatch.setattr(attention_mod, "TF32_ATTENTION", tf32)
    args, y = _naive("float32", d=d)
    s = auto_schedule([y], "cuda")
    assert not _flash_loops(s.program) and "a thread per row" in s.plan.explain()
    assert ("note: tensor cores (attention.tf32x3): not applied (head dimensions 128 (Q K) and 128 (V) are above 64, "
            "the most attention.tf32x3 holds)" in s.plan.explain()) == tf32


def test_the_marked_nest_keeps_its_loops_and_replays_from_the_trace():
    s, ii, y = _split_pass()
    before = s.program
    s.tensorize(ii, FLASH)
    (f,) = _flash_loops(s.program)
    assert f.var.name == "i_i"
    # only the loop's kind changed: the reference semantics are the same loops
    old = next(g for g in walk(before.body) if isinstance(g, For) and g.var is f.var)
    assert (old.lo, old.hi, old.body) == (f.lo, f.hi, f.body)
    again = Schedule.replay(s.trace_json(), [y])
    assert str(again.program) == str(s.program)


@pytest.mark.parametrize("case, match", [
    ("float32", "the dot product's operands are not float16 / bfloat16 loads"),
    ("tf32_half", "the dot product's operands are not float32 loads"),
    ("tf32_d128", "head dimensions 128 (Q K) and 128 (V) are above 64, the most attention.tf32x3 holds"),
    ("tf32_rows128", "has extent 128, not 64 (head dimension 64: split the rows by 64)"),
    ("rows32", "has extent 32, not 128 or 64"),
    ("d192", "head dimensions 192 (Q K) and 192 (V) must be multiples of 16 up to 128"),
    ("d128rows", "has extent 128, not 64 (head dimension 128: split the rows by 64)"),
    ("threads", "inside a threadIdx loop"),
    ("division", "no single loop over the keys"),
    ("staged", "the pass uses K_shared, a shared buffer"),
    ("wgmma_d32", "head dimensions 32 (Q K) and 32 (V) are not 64 or 128"),
    ("wgmma_rows64", "has extent 64, not 128 (head dimension 64: split the rows by 128)"),
])
def test_tensorize_refuses_what_is_not_the_pass_and_says_why(case, match):
    dtype = "float32" if case in ("float32", "tf32_d128", "tf32_rows128") else "float16"
    rows = {"rows32": 32, "wgmma_rows64": 64, "tf32_half": 64, "tf32_d128": 64}.get(case, ROWS)
    s, ii, _ = _split_pass(dtype, rows=rows, d={"d192": 192, "d128rows": 128, "wgmma_d32": 32,
                                                "tf32_d128": 128}.get(case, 64))
    loop = ii
    if case == "threads":
        a, b = s.split(ii, 16)
        s.bind(a, "threadIdx.x")
        loop = b
    if case == "staged":  # K tiles already in shared memory: the kernel stages global rows itself
        s.cache_read("K", "shared", s.loop(s._ref(next(f for f in walk(s.program.body)
                                                       if isinstance(f, For) and f.var.name == "r2").var)))
    if case == "division":
        _, loop = s.split(s.loop(s._ref(s.program.body.body[1].body.var)), ROWS)  # the division's rows, split
    before = s.program
    with pytest.raises(LoopirError, match=re.escape(match)) as e:
        s.tensorize(loop, FLASH_WGMMA if case.startswith("wgmma") else FLASH_TF32 if case.startswith("tf32") else FLASH)
    assert "tensorize" in str(e.value) and s.program is before


@pytest.mark.parametrize("mask, d, dtype", [(False, 16, "float16"), ("causal", 16, "float16"), ("late", 16, "float16"),
                                           ("causal", 64, "float16"), (False, 16, "float32"),
                                           ("causal", 64, "float32"), ("late", 32, "float32")])
def test_the_lowered_program_is_right_in_any_thread_order(mask, d, dtype):
    """The interpreter runs the marked nest once per block (thread 0): the lowering passes kept its meaning
    (float16 d 16: mma.sync, d 64: the warpgroup kernel; float32: the TF32 kernel)."""
    args, y = _naive(dtype, mask, d=d)
    s = auto_schedule([y], "cuda")
    kind = FLASH_TF32 if dtype == "float32" else FLASH_WGMMA if d == 64 else FLASH
    assert [f.kind for f in _flash_loops(s.program)] == [kind]
    low = lower_passes(s.program, "cuda")
    rng = np.random.default_rng(41)
    B, n, m = 2, 70, 45
    q, k, v = (rng.standard_normal((B, x, d)).astype(dtype) for x in (n, m, m))
    with np.errstate(invalid="ignore"):
        want = workloads.naive_attention_reference(q, k, v, mask)
    for order in ("reversed", 1):
        got = np.full((B, n, d), np.nan, dtype)
        interp.run(low, q, k, v, got, gpu_order=order, sizes={"B": B, "n": n, "m": m})
        seen = ~np.isnan(want)
        assert (np.isnan(got) == ~seen).all()
        assert np.abs(got[seen] - want[seen]).max() < (1e-4 if dtype == "float32" else 1e-2) * np.abs(want[seen]).max()


# ----------------------------------------------------------------------------- on the GPU


def _check(mod, arrays, want, dtype, shape):
    got = _half(np.full(shape, np.nan), dtype)
    mod(*arrays, got)
    again = _half(np.full(shape, np.nan), dtype)  # a second call, on a freshly poisoned output: the same bits
    mod(*arrays, again)
    assert np.array_equal(got.view(np.uint16), again.view(np.uint16))
    got = _f32(got, dtype)
    seen = ~np.isnan(want)
    assert (np.isnan(got) == ~seen).all(), "rows that see no key are NaN (0 / 0), the others are written"
    err = np.abs(got[seen] - want[seen]).max() / np.abs(want[seen]).max()
    assert err < 1e-2, err


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("mask", [False, "causal", "late"])
@pytest.mark.parametrize("d, wgmma", [(16, False), (64, True), (128, True), (64, False), (128, False)])
def test_flash_attention_matches_float64_on_the_gpu(dtype, mask, d, wgmma, monkeypatch):
    monkeypatch.setattr(attention_mod, "WGMMA_ATTENTION", wgmma)
    args, y = _naive(dtype, mask, d=d)
    s = auto_schedule([y], "cuda")
    assert [f.kind for f in _flash_loops(s.program)] == [FLASH_WGMMA if wgmma else FLASH]
    mod = build(s, args + [y], target="cuda")
    rng = np.random.default_rng(43)
    for B, n, m in ((3, 70, 45), (2, 130, 130), (1, 128, 200), (2, 300, 300), (2, 1, 1)):
        if mask and n != m and (B, n, m) != (3, 70, 45):
            continue
        q, k, v = (_half(rng.standard_normal((B, x, d)), dtype) for x in (n, m, m))
        with np.errstate(invalid="ignore"):
            want = workloads.naive_attention_reference(_f32(q, dtype), _f32(k, dtype), _f32(v, dtype), mask)
        _check(mod, (q, k, v), want, dtype, (B, n, d))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("d", [32, 64])
def test_unaligned_rows_an_index_dependent_score_and_a_sliding_window_on_the_gpu(dtype, d):
    args, y = _custom(dtype, d=d)
    s = auto_schedule([y], "cuda")
    assert [f.kind for f in _flash_loops(s.program)] == [FLASH_WGMMA if d == 64 else FLASH]
    mod = build(s, args + [y], target="cuda")
    rng = np.random.default_rng(44)
    for B, n in ((2, 200), (1, 63)):
        q = _half(rng.standard_normal((B, n, d + 4)), dtype)
        k, v = (_half(rng.standard_normal((B, n, d)), dtype) for _ in range(2))
        want = _custom_reference(*(_f32(x, dtype) for x in (q, k, v)), d=d)
        _check(mod, (q, k, v), want, dtype, (B, n, d))


@pytest.mark.gpu
def test_a_long_causal_sequence_matches_torch_scale():
    """4 x 1000 rows: 16 key tiles, the last one partial, dead tiles skipped per block."""
    args, y = _naive("float16", "causal")
    mod = build(auto_schedule([y], "cuda"), args + [y], target="cuda")
    rng = np.random.default_rng(45)
    q, k, v = (_half(rng.standard_normal((4, 1000, 64)), "float16") for _ in range(3))
    want = workloads.naive_attention_reference(*(_f32(x, "float16") for x in (q, k, v)), "causal",
                                               1.0 / math.sqrt(64))
    _check(mod, (q, k, v), want, "float16", (4, 1000, 64))


def test_the_cost_model_prices_the_pass_on_tensor_cores():
    """The plan's online group counts its two matmuls (Q K^T, P V) on tensor cores when the kernel runs them
    there: half data at the half-precision peak, float32 (attention.tf32x3: three TF32 products at half that rate)
    six times over; the rest (exp, max, rescale) on the CUDA cores; a head dimension of 128 in float32 (the SIMT pass)
    all on the CUDA cores. (The chain with a stage after it, so that the fusion plan maps it: a whole model block
    plans the same group, 10x slower.)"""
    cost = {}
    for dtype, C in (("float16", 64), ("float32", 64), ("float32", 128)):
        _, y = _naive(dtype, d=C)
        z = te.compute(y.shape, lambda b, i, c, y=y: y[b, i, c] + y[b, i, c], name="Z")
        s = auto_schedule([z], "cuda")
        (g,) = [g for g in s.plan.groups if g.mapping == "online"]
        cost[dtype, C] = g.cost
        assert g.cost.flops > 0 and bool(_flash_loops(s.program)) == (C == 64)
    assert cost["float16", 64].tensor_flops > 0 and cost["float32", 128].tensor_flops == 0
    assert cost["float32", 64].tensor_flops == 6 * cost["float16", 64].tensor_flops


@pytest.mark.parametrize("name, mask", [
    ("causal", lambda i, j: j <= i),
    ("late", lambda i, j: j >= i),
    ("window", lambda i, j: (j <= i) & (j > i - 50)),
    ("diagonal", lambda i, j: j.eq(i)),  # not an inequality: never skipped, never taken as full
    ("band", lambda i, j: (j <= i + 3) & (2 * j >= i - 70)),
])
def test_tiles_skipped_or_taken_whole_by_their_corners_match_brute_force(name, mask):
    """The kernel skips a tile when one affine conjunct of the mask fails at its four corners and drops the
    per-element test when every conjunct holds there (codegen/cuda/flash.py): checked here on the same conjuncts
    against every (row, key) of the tile."""
    i, j = te.var("i"), te.var("j")
    cond = mask(i, j)
    cond = getattr(cond, "expr", cond)
    affine, every = affine_conjuncts(cond, i, j)
    assert (len(affine) > 0) == (name != "diagonal") and every == (name != "diagonal")
    rows = np.arange(ROWS)
    n_dead = n_full = 0
    for r0 in range(0, 400, ROWS):
        for k0 in range(0, 400, KEYS):
            hi = 400
            k1 = min(k0 + KEYS - 1, hi - 1)
            corners = [(r0 + a, b) for a in (0, ROWS - 1) for b in (k0, k1)]
            dead = any(not any(eval_expr(c, {i: a, j: b}) for a, b in corners) for c in affine)
            full = every and k0 + KEYS - 1 < hi and all(eval_expr(c, {i: a, j: b}) for c in affine
                                                        for a, b in [(r0 + x, y) for x in (0, ROWS - 1)
                                                                     for y in (k0, k0 + KEYS - 1)])
            seen = np.array([[bool(eval_expr(cond, {i: int(r0 + x), j: int(y)})) for y in range(k0, k1 + 1)]
                             for x in rows])
            assert not (dead and seen.any()), (r0, k0)
            assert not (full and not seen.all()), (r0, k0)
            n_dead, n_full = n_dead + dead, n_full + full
    if name in ("causal", "late"):  # the test sees both kinds of tile (a 50-key window holds no whole 64-key tile)
        assert n_dead and n_full
    assert n_dead or name == "diagonal"


# ----------------------------------------------------------------------------- what a tile issues


def test_a_positive_constant_scale_is_folded_into_the_exponent():
    """`dot * c`, c > 0 (the renderer computes half arithmetic in float): the maximum is taken over the raw dot
    products and scaled once per row, P = 2^(dot (c log2e) - m log2e); anything else keeps the score as written."""
    dot, c = Var("dot"), const(0.125, "float16")
    t, x, g, k = scale_of(Binary("mul", dot, c, "float16"), dot)
    assert t is dot and k is c and g.a is x and g.b is c
    assert scale_of(Binary("mul", c, dot, "float16"), dot)[0] is dot
    for refused in (Binary("mul", dot, const(-0.125, "float16"), "float16"),  # a negative scale flips the max
                    Binary("mul", dot, const(0.0, "float32"), "float32"),
                    Binary("div", dot, const(8.0, "float32"), "float32"),  # the renderer may turn it into a product
                    Binary("mul", dot, Var("s", "float32"), "float32"),
                    Binary("add", dot, const(1.0, "float32"), "float32")):
        assert scale_of(refused, dot) is None
    args, y = _naive("float16", "causal")
    src = build(auto_schedule([y], "cuda"), args + [y], target="cuda").source
    k = np.float32(np.float32(0.125) * 1.4426950408889634)
    assert f"fmaf(fa_s[fa_mt][fa_nt][fa_e], {float(k)!r}f," in src and "(fa_tmax * 0.125f)" in src
    assert "(dot * 0.125f)" not in src


@pytest.mark.parametrize("wgmma", [True, False])
def test_aligned_rows_are_copied_without_a_per_chunk_test_and_misaligned_ones_keep_it(wgmma, monkeypatch):
    """K and V rows of 64 halves: every chunk is 16-byte aligned once the pointers are (a test at the kernel's
    entry), so the copies branch once to cp.async alone; Q rows 4 elements into a wider row do not show it and
    keep the per-chunk test with its element-wise fallback. (The warpgroup kernel copies K and V by TMA: Q only.)"""
    monkeypatch.setattr(attention_mod, "WGMMA_ATTENTION", wgmma)
    args, y = _naive("float16", "causal")
    src = build(auto_schedule([y], "cuda"), args + [y], target="cuda").source
    copied = ("Q",) if wgmma else ("Q", "K", "V")
    for b in copied:
        assert f"const bool {b}_aligned16 = (((unsigned long long){b}) & 15) == 0;" in src
        assert f"if ({b}_aligned16) {{" in src
    fast, slow = ("loopir_wg_cp16(fa_dst", "loopir_wg_copy16(fa_dst") if wgmma else ("loopir_cp_async16(fa_dst",
                                                                                    "loopir_flash_copy16(fa_dst")
    assert src.count(fast) == len(copied) and src.count(slow) == len(copied)
    args, y = _custom("float16", d=64)
    src = build(auto_schedule([y], "cuda"), args + [y], target="cuda").source
    assert "if (Q_aligned16)" not in src and ("if (K_aligned16)" in src) != wgmma


def _prefix(dtype: str, d: int = 64):
    """Attention over the first M - 1 keys of K and V rows of extent M: the key loop ends before the tensors do."""
    B, n, M = te.var("B"), te.var("n"), te.var("M")
    m = M - 1
    Q = te.placeholder((B, n, d), dtype, name="Q")
    K, V = (te.placeholder((B, M, d), dtype, name=x) for x in "KV")
    r, r2, r3, r4 = te.reduce_axis(d, "r"), te.reduce_axis(m, "r2"), te.reduce_axis(m, "r3"), te.reduce_axis(m, "r4")
    S = te.compute((B, n, m), lambda b, i, j: te.sum(Q[b, i, r] * K[b, j, r], axis=r) * 0.125, name="S")
    mx = te.compute((B, n), lambda b, i: te.max(S[b, i, r2], axis=r2), name="mx")
    P = te.compute((B, n, m), lambda b, i, j: te.exp(S[b, i, j] - mx[b, i]), name="P")
    sm = te.compute((B, n), lambda b, i: te.sum(P[b, i, r3], axis=r3), name="sm")
    O = te.compute((B, n, d), lambda b, i, c: te.sum(P[b, i, r4] * V[b, r4, c], axis=r4), name="O")  # noqa: E741
    Y = te.compute((B, n, d), lambda b, i, c: O[b, i, c] / sm[b, i], name="Y")
    return [Q, K, V], Y


@pytest.mark.parametrize("d", [64, 128])
def test_the_warpgroup_kernel_copies_whole_key_rows_by_tma_and_others_by_its_threads(d):
    """K[b, j, :] and V[b, j, :] over all j of their extent: one thread copies each stage by TMA (a box per 64
    columns of each; TMA's zeros past the keys); over fewer keys than the tensors hold (the rows past the loop's
    end are not zeros), the threads' copies, which write the zeros."""
    args, y = _naive("float16", "causal", d=d)
    src = build(auto_schedule([y], "cuda"), args + [y], target="cuda").source
    for b in ("K", "V"):
        assert f"const __grid_constant__ loopir_tmap {b}_tmap" in src and f"&{b}[" not in src
    assert src.count("loopir_tma3d(fa_dst") == 2 * d // 64 and "loopir_mbar_wait(fw_full0" in src
    assert "loopir_wg_cp16(fa_dst, &Q[" in src
    args, y = _prefix("float16", d)
    s = auto_schedule([y], "cuda")
    assert [f.kind for f in _flash_loops(s.program)] == [FLASH_WGMMA]
    src = build(s, args + [y], target="cuda").source
    assert "loopir_tmap" not in src and "loopir_wg_cp16(fa_dst, &K[" in src and "loopir_wg_cp16(fa_dst, &V[" in src


def _heads(dtype: str, H: int = 2, causal: bool = True):
    """Multi-head attention over heads packed in the rows of (B, T, H * 64) tensors (the model blocks' layout): the
    pass reads K[b, j, h * 64 + r]."""
    B, T = te.var("B"), te.var("T")
    bld = blocks._Builder(B, T, dtype)
    q, k, v = (bld.input((B, T, H * 64), x) for x in "qkv")
    return [q, k, v], bld.attention(q, k, v, H, causal)


def _keys_as_values():
    """O = P K (softmax(Q K^T / 8) K): one tensor is both the keys and the values."""
    B, n, m = te.var("B"), te.var("n"), te.var("m")
    q = te.placeholder((B, n, 64), "float16", name="Q")
    k = te.placeholder((B, m, 64), "float16", name="K")
    r, r2, r3, r4 = te.reduce_axis(64, "r"), te.reduce_axis(m, "r2"), te.reduce_axis(m, "r3"), te.reduce_axis(m, "r4")
    S = te.compute((B, n, m), lambda b, i, j: te.sum(q[b, i, r] * k[b, j, r], axis=r) * 0.125, name="S")
    mx = te.compute((B, n), lambda b, i: te.max(S[b, i, r2], axis=r2), name="mx")
    P = te.compute((B, n, m), lambda b, i, j: te.exp(S[b, i, j] - mx[b, i]), name="P")
    sm = te.compute((B, n), lambda b, i: te.sum(P[b, i, r3], axis=r3), name="sm")
    O = te.compute((B, n, 64), lambda b, i, c: te.sum(P[b, i, r4] * k[b, r4, c], axis=r4), name="O")  # noqa: E741
    Y = te.compute((B, n, 64), lambda b, i, c: O[b, i, c] / sm[b, i], name="Y")
    return [q, k], Y


def test_keys_that_are_also_the_values_share_one_tensor_map():
    """K and V are one tensor, so one map (one kernel parameter) serves both operands' boxes."""
    args, Y = _keys_as_values()
    s = auto_schedule([Y], "cuda")
    assert [f.kind for f in _flash_loops(s.program)] == [FLASH_WGMMA]
    src = build(s, args + [Y], target="cuda").source  # compiled by NVRTC
    assert src.count("loopir_tmap K_tmap") == 1 and src.count("&K_tmap,") == 2 and "loopir_tmap V" not in src


@pytest.mark.gpu
def test_keys_that_are_also_the_values_match_float64_on_the_gpu():
    args, Y = _keys_as_values()
    mod = build(auto_schedule([Y], "cuda"), args + [Y], target="cuda")
    rng = np.random.default_rng(71)
    for B, n, m in ((2, 200, 333), (1, 64, 64)):
        q, k = _half(rng.standard_normal((B, n, 64)), "float16"), _half(rng.standard_normal((B, m, 64)), "float16")
        q64, k64 = (blocks.as_float64(a, "float16") for a in (q, k))
        s = np.einsum("bic,bjc->bij", q64, k64) * 0.125
        p = np.exp(s - s.max(-1, keepdims=True))
        want = np.einsum("bij,bjc->bic", p / p.sum(-1, keepdims=True), k64)
        _check(mod, (q, k), want, "float16", (B, n, 64))


def test_a_heads_slice_of_wider_rows_is_copied_by_tma_from_its_first_column():
    args, y = _heads("float16")
    s = auto_schedule([y], "cuda")
    assert [f.kind for f in _flash_loops(s.program)] == [FLASH_WGMMA]
    src = build(s, args + [y], target="cuda").source
    for b in ("k", "v"):
        (line,) = [x for x in src.splitlines() if "loopir_tma3d(fa_dst" in x and f"&{b}_tmap" in x]
        assert re.search(r"\(int\)\(\(?h \* 64\)?\) \+ 0, \(int\)\(fa_k0\)", line), line


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("causal", [True, False])
def test_heads_packed_in_rows_match_float64_on_the_gpu(dtype, causal):
    args, y = _heads(dtype, causal=causal)
    mod = build(auto_schedule([y], "cuda"), args + [y], target="cuda")
    rng = np.random.default_rng(67)
    for B, T in ((2, 200), (1, 64), (1, 129)):
        q, k, v = (_half(rng.standard_normal((B, T, 128)), dtype) for _ in range(3))
        want = blocks._attention(*(blocks.as_float64(x, dtype) for x in (q, k, v)), 2, causal)
        _check(mod, (q, k, v), want, dtype, (B, T, 128))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", HALVES)
def test_keys_short_of_the_tensors_extent_never_read_the_rows_past_them_on_the_gpu(dtype):
    """The threads' copies of the warpgroup kernel (no TMA: the key loop ends before K and V do) with NaN in the
    row past the keys: reading it would make the output NaN."""
    args, y = _prefix(dtype)
    mod = build(auto_schedule([y], "cuda"), args + [y], target="cuda")
    rng = np.random.default_rng(61)
    for B, n, keys in ((2, 130, 100), (1, 64, 64), (3, 200, 129)):
        M = keys + 1
        q = _half(rng.standard_normal((B, n, 64)), dtype)
        k, v = (_half(rng.standard_normal((B, M, 64)), dtype) for _ in range(2))
        k[:, keys:] = v[:, keys:] = _half(np.full((B, 1, 64), np.nan), dtype)
        assert np.isnan(_f32(k, dtype)[:, keys:]).all()
        want = workloads.naive_attention_reference(*(_f32(x, dtype) for x in (q, k[:, :keys], v[:, :keys])),
                                                   scale=0.125)
        _check(mod, (q, k, v), want, dtype, (B, n, 64))


def test_the_padded_reach_bounds_every_flat_index():
    """padded_reach(dims, slack): no flat index of a row-major buffer, each index up to `slack` past either end of
    its dimension, reaches it (brute force over small shapes); and attention's tensors at 64 x 4096 x 64 now take
    32-bit indices (the old bound, prod(d + 2048), was 2.7e10 there)."""
    for dims in ((5,), (3, 4), (2, 3, 5), (1, 6, 2), (4, 1, 3, 2)):
        for slack in (0, 1, 3):
            strides = [math.prod(dims[k + 1:]) for k in range(len(dims))]
            most = max(abs(sum(i * s for i, s in zip(idx, strides)))
                       for idx in itertools.product(*(range(-slack, d + slack) for d in dims)))
            assert most < padded_reach(dims, slack), (dims, slack)
    assert padded_reach((64, 4096, 64)) < 2**31 <= math.prod(d + INT32_SLACK for d in (64, 4096, 64))
    args, y = _naive("float16", "causal")
    spec = build(auto_schedule([y], "cuda"), args + [y], target="cuda").specializer
    key = spec.key({v: {"B": 64, "n": 4096, "m": 4096}[v.name] for v in spec.vars})
    assert key.int32 and not spec.key({v: {"B": 64, "n": 2**20, "m": 2**20}[v.name] for v in spec.vars}).int32


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("scale", [0.3, -0.2])
def test_a_scale_folded_or_kept_matches_float64_on_the_gpu(dtype, scale):
    """0.3 is folded into the exponent (not a power of two: c log2e rounds); -0.2 keeps the score as written."""
    w = workloads.naive_attention(te.var("B"), te.var("n"), te.var("m"), 64, "causal", dtype=dtype, scale=scale)
    args, y = list(w.inputs), w.outputs[0]
    mod = build(auto_schedule([y], "cuda"), args + [y], target="cuda")
    assert ("fa_tmax" in mod.source) == (scale > 0)
    rng = np.random.default_rng(46)
    for B, n in ((2, 130), (1, 300)):
        q, k, v = (_half(rng.standard_normal((B, n, 64)), dtype) for _ in range(3))
        want = workloads.naive_attention_reference(*(_f32(x, dtype) for x in (q, k, v)), "causal", scale)
        _check(mod, (q, k, v), want, dtype, (B, n, 64))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, kind, tol, seed", [("float16", FLASH_WGMMA, 1e-2, 47),
                                                    ("float32", FLASH_TF32, 2e-5, 55)])
def test_pointers_not_16_byte_aligned_take_the_element_wise_copies_on_the_gpu(dtype, kind, tol, seed):
    """Q, K and V as CUDA tensors one element into their storage: the entry test fails, the copies go element by
    element, and the result is the same bits as from aligned copies of the same values (float16: the warpgroup
    kernel; float32: the TF32 one, whose chunks are 4 elements)."""
    torch = pytest.importorskip("torch")
    args, y = _naive(dtype, "causal")
    s = auto_schedule([y], "cuda")
    assert [f.kind for f in _flash_loops(s.program)] == [kind]
    mod = build(s, args + [y], target="cuda")
    rng = np.random.default_rng(seed)
    B, n, d = 2, 200, 64
    host = [_half(rng.standard_normal((B, n, d)), dtype) for _ in range(3)]
    tdt, ints = getattr(torch, dtype), {"float16": np.int16, "float32": np.int32}[dtype]
    bits = np.dtype(ints).str.replace("i", "u")  # the same width, unsigned: compared bit for bit
    aligned = [torch.from_numpy(x.view(ints)).cuda().view(tdt) for x in host]
    shifted = []
    for x in aligned:
        flat = torch.empty(x.numel() + 1, dtype=tdt, device="cuda")
        flat[1:] = x.reshape(-1)
        shifted.append(flat[1:].view(B, n, d))
        assert shifted[-1].data_ptr() % 16 == np.dtype(ints).itemsize
    outs = []
    for ins in (aligned, shifted):
        out = torch.full((B, n, d), float("nan"), dtype=tdt, device="cuda")
        mod(*ins, out)
        outs.append(out.cpu().numpy())
    assert np.array_equal(outs[0].view(bits), outs[1].view(bits))
    want = workloads.naive_attention_reference(*(_f32(x, dtype) for x in host), "causal")
    err = np.abs(_f32(outs[0], dtype) - want).max() / np.abs(want).max()
    assert err < tol, err
