"""Horizontal fusion: relu, sigmoid and tanh of one input — three independent outputs — become one
kernel that reads the input once.

    python examples/horizontal.py [--cpu] [--small]
"""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sincos import run_example  # noqa: E402

from loopir import te  # noqa: E402


def horizontal(m, n):
    x = te.placeholder((m, n), name="x")
    r = te.compute((m, n), lambda i, j: te.maximum(x[i, j], 0.0), name="relu")
    s = te.compute((m, n), lambda i, j: te.sigmoid(x[i, j]), name="sigmoid")
    t = te.compute((m, n), lambda i, j: te.tanh(x[i, j]), name="tanh")

    def ref(xa):
        x64 = xa.astype(np.float64)
        return tuple(a.astype(np.float32) for a in (np.maximum(x64, 0), 1 / (1 + np.exp(-x64)), np.tanh(x64)))

    return [x], [r, s, t], ref


def main() -> None:
    m, n = te.var("m"), te.var("n")
    ins, outs, ref = horizontal(m, n)
    size = 512 if "--small" in sys.argv else 4096
    run_example("relu, sigmoid, tanh of one input", ins, outs, ref, {"m": size, "n": size})


if __name__ == "__main__":
    main()
