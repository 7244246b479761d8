"""Layer norm with weight and bias as one kernel: mean, variance, normalize — one block per row.

    python examples/layernorm.py [--cpu] [--small]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sincos import run_example  # noqa: E402

from loopir import workloads  # noqa: E402


def main() -> None:
    w = workloads.layernorm()
    m, n = (256, 1024) if "--small" in sys.argv else (4096, 4096)
    run_example("layer norm (three stages)", list(w.inputs), list(w.outputs), w.reference, {"m": m, "n": n},
                rtol=w.tolerance)


if __name__ == "__main__":
    main()
