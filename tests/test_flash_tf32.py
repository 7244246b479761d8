"""Float32 attention on TF32 tensor cores with float32-class accuracy (tensorize "attention.tf32x3",
schedules/primitives/flash.py; rendered by codegen/cuda/flash_tf32.py): the planner takes it and says so, the
three-product split keeps a product within 2^-20 of exact (a numpy model of the instruction's operands), the source
compiles within the static shared-memory budget, and on a GPU the kernel matches float64 to float32 accuracy for the
three masks, head dimensions 16 to 64, sizes the tiles do not divide, rows whose address is not 16-byte aligned, and
a score and mask that read the row and key indices. (Its refusals, the lowered program in any thread order and
misaligned pointers: tests/test_flash.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from codegen import build
from codegen.cuda.build import cuda_source
from codegen.cuda.cubin_info import cubin_resources
from codegen.cuda.nvrtc import compile_cubin
from codegen.passes import lower as lower_passes
from loopir import te, workloads
from loopir.nodes import For
from loopir.visit import walk
from schedules import auto_schedule
from schedules.primitives.flash import FLASH_KINDS, FLASH_TF32
from test_flash import _custom, _custom_reference

# float32 accuracy: the error of a float32 evaluation of the same sums in another order is ~1e-6 of the largest
# output; one TF32 product per product (no split) is ~1e-3
TOL = 2e-5


def _naive(mask: str | bool = "causal", d: int = 64):
    w = workloads.naive_attention(te.var("B"), te.var("n"), te.var("m"), d, mask, dtype="float32")
    return list(w.inputs), w.outputs[0]


def _kinds(program) -> list[str]:
    return [f.kind for f in walk(program.body) if isinstance(f, For) and f.kind in FLASH_KINDS]


@pytest.mark.parametrize("d, mask", [(16, False), (32, "causal"), (64, "causal"), (64, False)])
def test_the_planner_puts_float32_attention_on_tf32_tensor_cores_and_says_so(d, mask):
    args, y = _naive(mask, d)
    s = auto_schedule([y], "cuda")
    assert _kinds(s.program) == [FLASH_TF32]
    text = s.plan.explain()
    assert "on TF32 tensor cores (attention.tf32x3: a warp per 16 rows" in text and "three products" in text
    assert "cuda: Y (the division by the sums) is the pass's epilogue" in text and s.plan.notes == ()
    src = cuda_source(lower_passes(s.program, "cuda")).source
    # in the unrolled loops' bodies: S = Q K^T, two k-steps per float4 of K; O += P V; three products each
    assert src.count("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32") == 3 * 2 + 3
    assert src.count("loopir_tf32_split(") == 4 + 4 + 4 + 2 + 1  # Q, K, P, V; and the definition
    assert src.count("__global__") == 1
    regs, smem = cubin_resources(compile_cubin(src, "sm_90", use_cache=False))["Y_mx_init"]
    assert smem <= 48 * 1024 and regs <= 255


def _tf32(x: np.ndarray, rna: bool) -> np.ndarray:
    """x with the mantissa cut to TF32's 10 bits: rounded to nearest, ties away (cvt.rna), or truncated (what the
    instruction does to the bits it is given)."""
    bits = x.astype(np.float32).view(np.uint32)
    if rna:
        bits = bits + np.uint32(0x1000)
    return (bits & np.uint32(0xFFFFE000)).view(np.float32)


def test_three_tf32_products_are_within_2_to_the_minus_20_of_the_product():
    """loopir_tf32_split's arithmetic: hi = rna(x), lo = x - hi (exact), the instruction truncating lo; the sum of
    the three products a_lo b_hi + a_hi b_lo + a_hi b_hi (exact products, as the tensor core forms them) against the
    exact product, over random magnitudes; one product of the rounded operands is ~1000x worse."""
    rng = np.random.default_rng(5)
    a, b = (rng.standard_normal(200_000) * np.exp2(rng.integers(-20, 20, 200_000)) for _ in range(2))
    a, b = a.astype(np.float32), b.astype(np.float32)
    ah, bh = _tf32(a, True), _tf32(b, True)
    assert (a.astype(np.float64) - ah == (a - ah).astype(np.float64)).all()  # the remainder is exact in float32
    al, bl = _tf32(a - ah, False), _tf32(b - bh, False)
    wide = [x.astype(np.float64) for x in (ah, al, bh, bl)]
    three = wide[1] * wide[2] + wide[0] * wide[3] + wide[0] * wide[2]
    exact = a.astype(np.float64) * b.astype(np.float64)
    rel = np.abs(three - exact) / np.abs(exact)
    assert rel.max() < 2.0 ** -20, rel.max()
    one = np.abs(wide[0] * wide[2] - exact) / np.abs(exact)
    assert one.max() > 2.0 ** -12


# ----------------------------------------------------------------------------- on the GPU


def _check(mod, arrays, want, shape):
    got = np.full(shape, np.nan, np.float32)
    mod(*arrays, got)
    again = np.full(shape, np.nan, np.float32)  # a second call, on a freshly poisoned output: the same bits
    mod(*arrays, again)
    assert np.array_equal(got.view(np.uint32), again.view(np.uint32))
    seen = ~np.isnan(want)
    assert (np.isnan(got) == ~seen).all(), "rows that see no key are NaN (0 / 0), the others are written"
    err = np.abs(got[seen] - want[seen]).max() / np.abs(want[seen]).max()
    assert err < TOL, err


@pytest.mark.gpu
@pytest.mark.parametrize("mask", [False, "causal", "late"])
@pytest.mark.parametrize("d", [16, 32, 48, 64])
def test_tf32x3_attention_matches_float64_to_float32_accuracy_on_the_gpu(mask, d):
    args, y = _naive(mask, d)
    s = auto_schedule([y], "cuda")
    assert _kinds(s.program) == [FLASH_TF32]
    mod = build(s, args + [y], target="cuda")
    rng = np.random.default_rng(53)
    for B, n, m in ((3, 70, 45), (2, 130, 130), (1, 64, 200), (2, 300, 300), (2, 1, 1)):
        if mask and n != m and (B, n, m) != (3, 70, 45):
            continue
        q, k, v = (rng.standard_normal((B, x, d)).astype(np.float32) * 2 for x in (n, m, m))
        with np.errstate(invalid="ignore"):
            want = workloads.naive_attention_reference(*(x.astype(np.float64) for x in (q, k, v)), mask)
        _check(mod, (q, k, v), want, (B, n, d))


@pytest.mark.gpu
@pytest.mark.parametrize("d, offset", [(32, 3), (64, 4)])
def test_unaligned_rows_an_index_dependent_score_and_a_sliding_window_on_the_gpu(d, offset):
    """Q rows 3 floats into a wider row (12 bytes: the per-chunk test and element-wise copies), or 4 (16 bytes:
    the aligned copies)."""
    args, y = _custom("float32", d=d, offset=offset)
    s = auto_schedule([y], "cuda")
    assert _kinds(s.program) == [FLASH_TF32]
    mod = build(s, args + [y], target="cuda")
    rng = np.random.default_rng(54)
    for B, n in ((2, 200), (1, 63)):
        q = rng.standard_normal((B, n, d + offset)).astype(np.float32)
        k, v = (rng.standard_normal((B, n, d)).astype(np.float32) for _ in range(2))
        want = _custom_reference(*(x.astype(np.float64) for x in (q, k, v)), d=d, offset=offset)
        _check(mod, (q, k, v), want, (B, n, d))
