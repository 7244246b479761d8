"""Small tensor-core attention runs for compute-sanitizer (racecheck / memcheck / synccheck): the causal float16
pass at sizes the 128-row blocks and 64-key tiles do not divide, and the bfloat16 pass with unaligned query rows,
an index-dependent score and a sliding window (tests/test_flash.py's `_custom`), each checked against float64, on
both kernels: the warpgroup one (attention.wgmma: head dimensions 64 and 128) and mma.sync (attention.m16n8k16:
head dimension 32, and 64 with the warpgroup kernel turned off); and the float32 pass on TF32 tensor cores
(attention.tf32x3: causal, and unaligned rows with the window); two heads packed in rows (K and V slices by TMA).

    compute-sanitizer --tool racecheck python benchmarks/flash_racecheck.py
"""

from __future__ import annotations

import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

from codegen import build  # noqa: E402
from loopir import blocks, te, workloads  # noqa: E402
from schedules import attention, auto_schedule  # noqa: E402
from test_flash import _custom, _custom_reference, _heads  # noqa: E402


def _run(args, y, arrays, want, dtype, shape, what):  # noqa: ANN001
    mod = build(auto_schedule([y], "cuda"), args + [y], target="cuda")
    kernel = next((k for k in ("attention.wgmma", "attention.m16n8k16", "attention.tf32x3") if k in mod.source), None)
    assert kernel is not None, "the pass is not on tensor cores"
    what = f"{what} ({kernel})"
    got = blocks.as_dtype(np.full(shape, np.nan), dtype)
    mod(*arrays, got)
    got = blocks.as_float64(got, dtype)
    seen = ~np.isnan(want)
    err = float(np.abs(got[seen] - want[seen]).max() / np.abs(want[seen]).max())
    ok = (np.isnan(got) == ~seen).all() and err < (2e-5 if dtype == "float32" else 1e-2)
    print(f"flash_racecheck {what}: rel err {err:.2e} {'ok' if ok else 'BAD'}")


rng = np.random.default_rng(0)
w = workloads.naive_attention(te.var("B"), te.var("n"), te.var("m"), 64, "causal", dtype="float16")
q, k, v = (rng.standard_normal((2, 200, 64)).astype(np.float16) for _ in range(3))
_run(list(w.inputs), w.outputs[0], (q, k, v),
     workloads.naive_attention_reference(*(x.astype(np.float64) for x in (q, k, v)), "causal"), "float16",
     (2, 200, 64), "float16 causal 2 x 200 x 200")
args, y = _custom("bfloat16")
q = blocks.as_dtype(rng.standard_normal((2, 150, 36)), "bfloat16")
k, v = (blocks.as_dtype(rng.standard_normal((2, 150, 32)), "bfloat16") for _ in range(2))
_run(args, y, (q, k, v), _custom_reference(*(blocks.as_float64(x, "bfloat16") for x in (q, k, v))), "bfloat16",
     (2, 150, 32), "bfloat16 unaligned rows, window 2 x 150 x 150")
w = workloads.naive_attention(te.var("B"), te.var("n"), te.var("m"), 128, False, dtype="float16")
q, k, v = (rng.standard_normal((2, 100, 128)).astype(np.float16) for _ in range(3))
_run(list(w.inputs), w.outputs[0], (q, k, v),
     workloads.naive_attention_reference(*(x.astype(np.float64) for x in (q, k, v)), False), "float16",
     (2, 100, 128), "float16 d128 2 x 100 x 100")
args, y = _custom("float16", d=64)
q = blocks.as_dtype(rng.standard_normal((2, 150, 68)), "float16")
k, v = (blocks.as_dtype(rng.standard_normal((2, 150, 64)), "float16") for _ in range(2))
_run(args, y, (q, k, v), _custom_reference(*(blocks.as_float64(x, "float16") for x in (q, k, v)), d=64), "float16",
     (2, 150, 64), "float16 d64 unaligned rows, window 2 x 150 x 150")
args, y = _heads("float16")  # two heads packed in rows of 128: K and V slices copied by TMA from column h * 64
q, k, v = (blocks.as_dtype(rng.standard_normal((2, 130, 128)), "float16") for _ in range(3))
_run(args, y, (q, k, v), blocks._attention(*(blocks.as_float64(x, "float16") for x in (q, k, v)), 2, True),
     "float16", (2, 130, 128), "float16 two heads packed in rows, causal 2 x 130 x 130")
attention.WGMMA_ATTENTION = False
w = workloads.naive_attention(te.var("B"), te.var("n"), te.var("m"), 64, "causal", dtype="bfloat16")
q, k, v = (blocks.as_dtype(rng.standard_normal((2, 200, 64)), "bfloat16") for _ in range(3))
_run(list(w.inputs), w.outputs[0], (q, k, v),
     workloads.naive_attention_reference(*(blocks.as_float64(x, "bfloat16") for x in (q, k, v)), "causal"),
     "bfloat16", (2, 200, 64), "bfloat16 causal 2 x 200 x 200")
w = workloads.naive_attention(te.var("B"), te.var("n"), te.var("m"), 64, "causal", dtype="float32")
q, k, v = (rng.standard_normal((2, 200, 64)).astype(np.float32) for _ in range(3))
_run(list(w.inputs), w.outputs[0], (q, k, v),
     workloads.naive_attention_reference(*(x.astype(np.float64) for x in (q, k, v)), "causal"), "float32",
     (2, 200, 64), "float32 causal 2 x 200 x 200")
args, y = _custom("float32", d=32, offset=3)
q = rng.standard_normal((2, 150, 35)).astype(np.float32)
k, v = (rng.standard_normal((2, 150, 32)).astype(np.float32) for _ in range(2))
_run(args, y, (q, k, v), _custom_reference(*(x.astype(np.float64) for x in (q, k, v)), d=32, offset=3), "float32",
     (2, 150, 32), "float32 unaligned rows, window 2 x 150 x 150")
