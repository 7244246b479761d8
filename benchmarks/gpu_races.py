"""Race check on the GPU: kernels whose threads communicate through memory, run again and again.

    python3 benchmarks/gpu_races.py [--repeats 5] [--small] [--out DIR]

Every case of `tests/gpu_programs.py` (the naive attention at several sizes, including sizes the
tiles do not divide; producer/consumer pairs whose consumer reads other threads' values; softmax
followed by a matmul) is built for CUDA through the user's path (`build`, auto-scheduled or bound
by hand, lowered by the CUDA pipeline with its barrier placement), then run `--repeats` times, each
time on fresh random inputs with NaN-poisoned outputs, against a float64 numpy reference. A kernel
that races shows as a varying error. `--small` runs each case once at its smallest size: the target
of `compute-sanitizer --tool racecheck|synccheck|memcheck` (see benchmarks/gpu_check.py). `--no-barriers` is
the control: the same kernels without the barrier pass, whose races then show as wrong results.
The table (case, size, runs, worst max relative error, verdict) is printed last.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests"), os.path.join(ROOT, "benchmarks")]


def cases(small: bool) -> list:
    import gpu_programs as G  # tests/gpu_programs.py

    out = [G.attention(2, 5, 37, 8), G.attention(2, 9, 40, 32), G.reversed_rows(5, 37), G.shifted_rows(5, 37),
           G.transposed_tiles(13, 8), G.softmax_matmul(5, 37, 8), G.softmax_matmul(5, 37, 8, gemm=False)]
    if not small:
        out += [G.attention(4, 512, 512, 64), G.attention(8, 1024, 1024, 64), G.attention(3, 333, 517, 64),
                G.attention_user(3, 333, 517, 64), G.attention_user(4, 512, 512, 64, "float16"),
                G.attention_user(2, 100, 1000, 64, "float16"),
                G.reversed_rows(1000, 4099), G.shifted_rows(1023, 1000), G.transposed_tiles(1000, 16),
                G.softmax_matmul(1000, 1000, 64)]
    return out


def run_case(case, repeats: int, rng: np.random.Generator) -> tuple[float, int]:
    from codegen import build

    mod = build(case.program, list(case.program.args), target="cuda")
    worst, bad = 0.0, 0
    names = [b.name for b in case.program.args]
    for _ in range(repeats):
        ins = case.make_inputs(rng)
        ref = case.reference(ins)
        arrays = []
        for nm, b in zip(names, case.program.args):
            if nm in ins:
                arrays.append(np.ascontiguousarray(ins[nm]))
            else:
                shape = ref[nm].shape
                arrays.append(np.full(shape, np.nan, dtype=b.dtype))
        mod(*arrays)
        for nm, want in ref.items():
            got = arrays[names.index(nm)].astype(np.float64)
            err = float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-30))
            if not np.isfinite(err):
                err = float("inf")
            worst = max(worst, err)
            bad += not (err <= case.tolerance)
    return worst, bad


def timing() -> list[str]:
    """The user's path for attention (`build(outputs, args)`, batch/rows/keys as te.var, float32 and float16,
    shapes nobody tuned for) against the same math in PyTorch, eager and torch.compile, in this run.
    Medians of CUDA-event timings (benchmarks/gpu_suite.py's `time_cuda`); correctness is the table above."""
    import torch
    from gpu_suite import time_cuda

    import gpu_programs as G
    from codegen import build

    def ref(q: Any, k: Any, v: Any) -> Any:
        s = torch.einsum("bir,bjr->bij", q, k)
        p = torch.exp(s - s.amax(-1, keepdim=True)) * 0.125
        return torch.einsum("bij,bjc->bic", p, v) / p.sum(-1, keepdim=True)

    compiled = torch.compile(ref, dynamic=False)
    rows = ["| attention (B, n, m, d) dtype | ours ms | torch eager ms | torch.compile ms | ours / compile |",
            "|---|---|---|---|---|"]
    for (B, n, m, d), dtype in [((4, 512, 512, 64), "float32"), ((3, 333, 517, 64), "float32"),
                                ((4, 512, 512, 64), "float16"), ((2, 100, 1000, 64), "float16")]:
        case = G.attention_user(B, n, m, d, dtype)
        mod = build(case.program, list(case.program.args), target="cuda")
        tdt = getattr(torch, dtype)
        q, k, v = (torch.randn(B, x, d, device="cuda", dtype=tdt) for x in (n, m, m))
        y = torch.empty(B, n, d, device="cuda", dtype=tdt)
        ours = time_cuda(torch, lambda: mod(q, k, v, y), batch=3, repeat=7, warmup=2)  # noqa: B023
        eager = time_cuda(torch, lambda: ref(q, k, v), batch=3, repeat=7, warmup=2)  # noqa: B023
        comp = time_cuda(torch, lambda: compiled(q, k, v), batch=3, repeat=7, warmup=3)  # noqa: B023
        rows.append(f"| ({B}, {n}, {m}, {d}) {dtype} | {ours:.3f} | {eager:.3f} | {comp:.3f} | {ours / comp:.1f}x |")
        print(rows[-1], flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--time", action="store_true", help="also time attention on the user's path against PyTorch")
    ap.add_argument("--no-barriers", action="store_true",
                    help="control run: drop the place_barriers pass (the kernels race; shows the check can fail)")
    a = ap.parse_args()
    if a.no_barriers:
        import codegen.passes as P

        full = P._pipelines
        P._pipelines = lambda: {t: tuple(x for x in ps if x.name != "place_barriers") for t, ps in full().items()}
    rng = np.random.default_rng(20261123)
    rows = []
    for case in cases(a.small):
        t = time.perf_counter()
        try:
            worst, bad = run_case(case, 1 if a.small else a.repeats, rng)
            verdict = "ok" if bad == 0 else f"MISMATCH in {bad} outputs"
        except Exception as e:  # noqa: BLE001 - one failing case must not hide the others
            worst, verdict = float("nan"), f"ERROR {type(e).__name__}: {str(e)[:160]}"
        rows.append({"case": case.name, "runs": 1 if a.small else a.repeats, "worst_rel_err": worst,
                     "verdict": verdict, "seconds": round(time.perf_counter() - t, 2)})
        print(f"{case.name:40s} {rows[-1]['runs']:3d} {worst:10.2e}  {verdict}", flush=True)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "gpu_races.json"), "w") as f:
            json.dump(rows, f, indent=1)
    print("\n| case | runs | worst max rel. error | verdict |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {r['runs']} | {r['worst_rel_err']:.2e} | {r['verdict']} |")
    if a.time:
        print("\n" + "\n".join(timing()))
    return 0 if all(r["verdict"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
