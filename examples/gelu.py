"""Automatic fusion: the tanh GELU written as four stages over a matrix becomes one kernel.

    python examples/gelu.py [--cpu] [--small]

y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): cube, inner, tanh and the product are each a
stage; the planner inlines the three intermediates (each element is read once, so nothing is
recomputed) and maps the single loop nest as a flat grid with 128-bit loads when the row length is
a multiple of 4.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sincos import run_example  # noqa: E402  (also puts the repository root on sys.path)

from loopir import workloads  # noqa: E402


def main() -> None:
    size = 512 if "--small" in sys.argv else 4096
    # constant sizes: the planner can prove 4 | n, so the kernel uses float4 loads and stores
    w = workloads.gelu(size, m=size)  # cube, inner, th, y
    ins, outs, ref = list(w.inputs), list(w.outputs), w.reference
    run_example(f"GELU chain (four stages), {size}x{size}", ins, outs, ref, {})


if __name__ == "__main__":
    main()
