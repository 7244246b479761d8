"""Layer norm with weight and bias as one kernel: mean, variance, normalize — one block per row.

    python examples/layernorm.py [--cpu] [--small] [--inline]

Runs the three-stage program of `loopir.workloads.layernorm`, then the same layer norm written the way
people write it, with the reductions inline (`--inline`: that one only). te lifts each inline reduction into
a stage of its own (`y.sum0`, `y.sum1`), so both forms fuse into one kernel.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sincos import run_example  # noqa: E402

from loopir import te, workloads  # noqa: E402


def inline_layernorm() -> tuple[list, list, Callable]:
    m, n = te.var("m"), te.var("n")
    x = te.placeholder((m, n), "float32", name="x")
    w = te.placeholder((n,), "float32", name="weight")
    b = te.placeholder((n,), "float32", name="bias")
    k = te.reduce_axis(n, name="k")

    def ln(i, j):
        mean = te.sum(x[i, k], axis=k) / n
        var = te.sum((x[i, k] - mean) ** 2, axis=k) / n
        return (x[i, j] - mean) * te.rsqrt(var + workloads.LAYERNORM_EPS) * w[j] + b[j]

    y = te.compute((m, n), ln, name="y")
    print("lifted stages:", ", ".join(t.name for t in te.lifted(y)))
    return [x, w, b], [y], workloads.layernorm().reference


def main() -> None:
    m, n = (256, 1024) if "--small" in sys.argv else (4096, 4096)
    if "--inline" not in sys.argv:
        w = workloads.layernorm()
        run_example("layer norm (three stages)", list(w.inputs), list(w.outputs), w.reference, {"m": m, "n": n},
                    rtol=w.tolerance)
        print()
    ins, outs, ref = inline_layernorm()
    run_example("layer norm (inline reductions)", ins, outs, ref, {"m": m, "n": n}, rtol=1e-4)


if __name__ == "__main__":
    main()
