"""Cluster rows (rows longer than one block's register rows, run on a thread-block cluster) through the default
path with them named (`RowParams.cluster_row_max`, on by default), for compute-sanitizer (memcheck /
racecheck): softmax, layer norm and RMSNorm at a few row lengths (clusters of 2, 4 and 8 blocks; lengths the
cluster's threads do not tile), float32 and float16, each output poisoned with NaN and checked against float64.
Prints one line per case and `cluster_check: N ok, M bad`.

    compute-sanitizer --tool memcheck python benchmarks/cluster_check.py
"""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

from codegen import build  # noqa: E402
from loopir import blocks  # noqa: E402
from loopir import workloads as w  # noqa: E402
from schedules.rows import CLUSTER_ROW_MAX  # noqa: E402
from test_register_rows import TOL, _inputs, _reference  # noqa: E402

CASES = ((3, 20000), (2, 50257), (2, 65536), (1, 131072))


def main() -> None:
    results = []
    for dtype in ("float32", "float16"):
        for name in ("softmax", "layernorm", "rmsnorm"):
            for m, n in CASES:
                wl = getattr(w, name)(m=m, n=n, dtype=dtype)
                mod = build(list(wl.outputs), list(wl.inputs) + list(wl.outputs), target="cuda",
                            schedule={"rows": {"cluster_row_max": CLUSTER_ROW_MAX}})
                cl = next((ln.split("__cluster_dims__(1, ")[1][0] for ln in mod.source.splitlines()
                           if "__cluster_dims__" in ln), "-")
                xs = _inputs(wl, m, n, dtype, seed=m + n)
                got = blocks.as_dtype(np.full((m, n), np.nan), dtype)
                mod(*xs, got)
                want = _reference(name, xs, dtype)
                err = float(np.abs(blocks.as_float64(got, dtype) - want).max() / np.abs(want).max())
                ok = bool(np.isfinite(err) and err < TOL[dtype])
                print(f"{name} {m}x{n} {dtype} cluster {cl}: rel err {err:.2e} {'ok' if ok else 'BAD'}", flush=True)
                results.append(ok)
    print(f"cluster_check: {sum(results)} ok, {len(results) - sum(results)} bad")


if __name__ == "__main__":
    main()
