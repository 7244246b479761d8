"""Automatic fusion: the tanh GELU written as four stages over a matrix becomes one kernel.

    python examples/gelu.py [--cpu] [--small]

y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): cube, inner, tanh and the product are each a
stage; the planner inlines the three intermediates (each element is read once, so nothing is
recomputed) and maps the single loop nest as a flat grid with 128-bit loads when the row length is
a multiple of 4.
"""

from __future__ import annotations

import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sincos import run_example  # noqa: E402  (also puts the repository root on sys.path)

from loopir import te  # noqa: E402

GELU_C = math.sqrt(2.0 / math.pi)


def gelu_chain(m, n):
    x = te.placeholder((m, n), name="x")
    cube = te.compute((m, n), lambda i, j: x[i, j] * x[i, j] * x[i, j], name="cube")
    inner = te.compute((m, n), lambda i, j: GELU_C * (x[i, j] + 0.044715 * cube[i, j]), name="inner")
    th = te.compute((m, n), lambda i, j: te.tanh(inner[i, j]), name="th")
    y = te.compute((m, n), lambda i, j: 0.5 * x[i, j] * (1.0 + th[i, j]), name="y")

    def ref(xa):
        x64 = xa.astype(np.float64)
        return ((0.5 * x64 * (1.0 + np.tanh(GELU_C * (x64 + 0.044715 * x64**3)))).astype(np.float32),)

    return [x], [y], ref


def main() -> None:
    size = 512 if "--small" in sys.argv else 4096
    # constant sizes: the planner can prove 4 | n, so the kernel uses float4 loads and stores
    ins, outs, ref = gelu_chain(size, size)
    run_example(f"GELU chain (four stages), {size}x{size}", ins, outs, ref, {})


if __name__ == "__main__":
    main()
