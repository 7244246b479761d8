"""Row softmax as one kernel: max-reduction, sum of exp, normalize — one block per row.

    python examples/softmax.py [--cpu] [--small]

The planner keeps the two reductions in buffers (inlining them would recompute a whole row at
every element), fuses all three stages on the shared row loop, and on CUDA maps each row to a
block whose reductions are cross-thread (warp shuffles, then shared memory); the row length is
symbolic here, so the row is not cached in shared memory (the log says why).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sincos import run_example  # noqa: E402

from loopir import workloads  # noqa: E402


def main() -> None:
    w = workloads.softmax()
    m, n = (256, 1024) if "--small" in sys.argv else (4096, 4096)
    run_example("row softmax (three stages)", list(w.inputs), list(w.outputs), w.reference, {"m": m, "n": n},
                rtol=1e-4)


if __name__ == "__main__":
    main()
