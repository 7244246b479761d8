"""The half-precision memory and math paths of the CUDA renderer: `exp` as ex2.approx only in programs whose
outputs are all 16-bit floats (codegen.cuda.kernel.half_outputs), a half row cached widened to float32 copied with
128-bit loads (codegen.cuda.vector._vector_emit_widen), 16-bit rows of up to 1024 elements on a warp each
(schedules.rows.HALF_WARP_ROW_MAX), and, on a GPU, all of them against float64 for both half types, with operands
at aligned and at unaligned addresses (the scalar fallback)."""

from __future__ import annotations

import pytest

from codegen import build
from codegen.cuda.kernel import half_outputs
from loopir import te
from loopir import workloads as w
from schedules import Schedule

HALVES = ("float16", "bfloat16")


def _source(wl, schedule=None) -> str:
    """The kernels' text (after the preludes, which define every helper)."""
    src = build(list(wl.outputs), list(wl.inputs) + list(wl.outputs), target="cuda", schedule=schedule).source
    return src[src.index('extern "C"'):]


@pytest.mark.parametrize("dtype", HALVES)
def test_exp_is_approximate_only_where_every_output_is_half(dtype):
    assert "loopir_exp_fast(" in _source(w.softmax(m=64, n=256, dtype=dtype))
    assert "loopir_exp_fast(" not in _source(w.softmax(m=64, n=256, dtype="float32"))
    # half input, float32 output: the exponentials stay accurate
    x = te.placeholder((64, 256), dtype, name="x")
    y = te.compute((64, 256), lambda i, j: te.exp(te.cast("float32", x[i, j])), name="y")
    src = build([y], [x, y], target="cuda").source
    src = src[src.index('extern "C"'):]
    assert "expf(" in src and "loopir_exp_fast(" not in src
    assert not half_outputs(Schedule([y]).program)


@pytest.mark.parametrize("dtype", HALVES)
def test_a_widened_half_row_is_copied_with_128_bit_loads(dtype):
    # a block per row, the row cached in shared memory (shorter: warp rows; by default: in registers)
    src = _source(w.rmsnorm(m=64, n=2048, dtype=dtype), {"rows": {"register_row_max": 0}})
    assert "float x_shared[2048]" in src  # cached widened (codegen.passes.accumulate.widen_staged)
    assert "const uint4 x_v = LOOPIR_LD4(" in src and src.count("reinterpret_cast<float4*>(&x_shared[") == 2


def _run(name, dtype, m, n, offset, seed):
    import torch
    import torch.nn.functional as F

    from loopir.workloads import LAYERNORM_EPS, RMSNORM_EPS

    wl = getattr(w, name)(m=m, n=n, dtype=dtype)
    tdt = getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m * n + offset, device="cuda", generator=g).to(tdt)[offset:].view(m, n)
    params = [torch.randn(n, device="cuda", generator=g).to(tdt) for _ in wl.inputs[1:]]
    out = torch.full((m, n), float("nan"), device="cuda", dtype=tdt)
    view = (lambda t: t.view(torch.uint16)) if dtype == "bfloat16" else (lambda t: t)
    mod = build(list(wl.outputs), list(wl.inputs) + list(wl.outputs), target="cuda")
    mod(view(x), *(view(p) for p in params), view(out))
    torch.cuda.synchronize()
    xd, pd = x.double(), [p.double() for p in params]
    ref = {"softmax": lambda: torch.softmax(xd, -1),
           "layernorm": lambda: F.layer_norm(xd, (n,), pd[0], pd[1], LAYERNORM_EPS),
           "rmsnorm": lambda: F.rms_norm(xd, (n,), pd[0], RMSNORM_EPS)}[name]()
    assert not torch.isnan(out).any()
    err = float((out.double() - ref).abs().max() / ref.abs().max())
    assert err < (1e-2 if dtype == "bfloat16" else 2e-3), err


@pytest.mark.parametrize("dtype", HALVES)
def test_short_half_rows_get_a_warp_each_and_long_ones_a_block(dtype):
    from schedules import auto_schedule

    for n, want in ((256, "warp: row length 256"), (1024, "warp: row length 1,024"), (2048, "block")):
        text = auto_schedule(list(w.softmax(m=65536, n=n, dtype=dtype).outputs), "cuda").plan.explain()
        assert f"row strategy: {want}" in text, text
    assert "32 lanes each" in auto_schedule(list(w.layernorm(m=65536, n=512, dtype=dtype).outputs),
                                            "cuda").plan.explain()
    f32 = auto_schedule(list(w.softmax(m=65536, n=512).outputs), "cuda").plan.explain()
    assert "row strategy: block" in f32  # float32 rows of 512: unchanged (a warp per row lost at 768 and 1000)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("name", ["softmax", "layernorm", "rmsnorm"])
@pytest.mark.parametrize("offset", [0, 3])
def test_half_rows_match_float64_on_the_gpu(dtype, name, offset):
    _run(name, dtype, 300, 1000, offset, seed=len(name) + offset)
    _run(name, dtype, 64, 4096, offset, seed=7 + offset)

