"""A vectorized lane loop reads a neighbour inside a loaded vector from that vector (codegen.cuda.vector
`_lanes_of`): rotary embedding's partner element x[c + 1 - 2 (c % 2)] is a lane of the 128-bit load of x, not a
load of its own; a neighbour past the vector (x[c + 1] at the last lane) stays a load. On a GPU both match float64,
at aligned and unaligned addresses (the scalar fallback)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from codegen import build
from loopir import te

N_ROWS, D = 64, 128


def _rotary(dtype):
    x = te.placeholder((N_ROWS, D), dtype, name="x")
    cs = te.placeholder((N_ROWS, D // 2), dtype, name="cs")

    def f(i, c):
        partner = c + 1 - 2 * (c % 2)
        sign = te.cast("float32", 2 * (c % 2) - 1)
        v = te.cast("float32", x[i, c]) * te.cast("float32", cs[i, c // 2]) + sign * te.cast("float32", x[i, partner])
        return te.cast(dtype, v)

    return [x, cs], te.compute((N_ROWS, D), f, name="y")


def _rotary_ref(x, cs):
    partner = np.arange(D) + 1 - 2 * (np.arange(D) % 2)
    sign = 2.0 * (np.arange(D) % 2) - 1.0
    return x * np.repeat(cs, 2, axis=1) + sign * x[:, partner]


def _shift(dtype):
    x = te.placeholder((N_ROWS, D + 8), dtype, name="x")  # rows of whole vectors: x is read as vectors too
    return [x], te.compute((N_ROWS, D), lambda i, c: x[i, c] + x[i, c + 1], name="y")


def _vector_branch(source: str) -> str:
    """The kernel's vector branch: from the aligned test to its `} else {`."""
    start = source.index("_aligned16) {")
    return source[start:source.index("} else {", start)]


@pytest.mark.parametrize("dtype, lane", [("float16", "loopir_h2f_hi(x_v.x)"), ("bfloat16", "loopir_bf2f_hi(x_v.x)"),
                                         ("float32", "x_v.y")])
def test_the_partner_element_is_a_lane_of_the_loaded_vector(dtype, lane):
    ins, y = _rotary(dtype)
    src = build([y], [*ins, y], target="cuda").source
    vec = _vector_branch(src)
    assert "reinterpret_cast<const" in vec and "x[" not in vec.replace("&x[", ""), vec
    assert lane in vec  # lane 0's partner: lane 1


def test_a_neighbour_past_the_vector_stays_a_load():
    ins, y = _shift("float32")
    src = build([y], [*ins, y], target="cuda").source
    vec = _vector_branch(src)
    # lanes 0..2 read x[c + 1] from the vector (lanes 1..3); lane 3's x[c + 4] is the next vector's: a load
    assert re.search(r"y_v\.x = \(x_v\.x \+ x_v\.y\)", vec) and re.search(r"y_v\.w = \(x_v\.w \+ x\[", vec), vec


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("offset", [0, 1])
def test_rotary_and_shift_match_float64_on_the_gpu(dtype, offset):
    import torch

    tdt = getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(3 + offset)
    view = (lambda t: t.view(torch.uint16)) if dtype == "bfloat16" else (lambda t: t)
    ins, y = _rotary(dtype)
    mod = build([y], [*ins, y], target="cuda")
    x = torch.randn(N_ROWS * D + offset, device="cuda", generator=g).to(tdt)[offset:].view(N_ROWS, D)
    cs = torch.randn(N_ROWS, D // 2, device="cuda", generator=g).to(tdt)
    out = torch.full((N_ROWS, D), float("nan"), device="cuda", dtype=tdt)
    mod(view(x), view(cs), view(out))
    torch.cuda.synchronize()
    want = _rotary_ref(x.double().cpu().numpy(), cs.double().cpu().numpy())
    got = out.double().cpu().numpy()
    tol = {"float16": 2e-3, "bfloat16": 1e-2, "float32": 1e-6}[dtype]
    assert not np.isnan(got).any() and np.abs(got - want).max() / np.abs(want).max() < tol
    (xi,), y2 = _shift(dtype)
    mod = build([y2], [xi, y2], target="cuda")
    x2 = torch.randn(N_ROWS * (D + 8) + offset, device="cuda", generator=g).to(tdt)[offset:].view(N_ROWS, D + 8)
    out = torch.full((N_ROWS, D), float("nan"), device="cuda", dtype=tdt)
    mod(view(x2), view(out))
    torch.cuda.synchronize()
    a = x2.double().cpu().numpy()
    want = a[:, :D] + a[:, 1:D + 1]
    got = out.double().cpu().numpy()
    assert not np.isnan(got).any() and np.abs(got - want).max() / np.abs(want).max() < tol
