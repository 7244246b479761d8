"""Row reductions at untuned shapes on the GPU: ours (fixed sizes, and symbolic sizes planned with
`sizes=`) against PyTorch eager and torch.compile (dynamic=False) in the same run, with the DRAM floor.

    python3 benchmarks/rows_gpu.py [--no-compile] [--wide] [--threshold KEY=V1,V2,...]...

`--wide`: only the very wide rows (8192 to 65536 elements, 1 to 1024 rows: the split-row strategy and the
row-cache model). `--threshold KEY=V1,V2`: each case once per value of the row planner's parameter KEY (a field
of `schedules.rows.RowParams`: split_row_min, split_rows_per_sm, split_waves, split_threads, wide_row,
wide_threads, cache_max_bytes, full_occupancy, ...); several flags sweep their product. E.g.
`--wide --threshold split_rows_per_sm=0,2,4 --threshold split_waves=1,2,4`.

Prints one line per case as it goes (flushed), then a markdown table."""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

import torch  # noqa: E402

from benchmarks.gpu_suite import time_cuda  # noqa: E402
from codegen import build  # noqa: E402
from loopir import te  # noqa: E402
from schedules import auto_schedule  # noqa: E402
from test_rows import WORKLOADS  # noqa: E402

BW = 4.25e12

CASES = [("softmax", 16384, 4096), ("softmax", 16384, 1000), ("softmax", 64, 4096), ("softmax", 512, 50257),
         ("softmax", 16, 50257), ("layernorm", 16384, 768), ("layernorm", 16384, 4096), ("rmsnorm", 16384, 4096)]
SYMBOLIC = [("softmax", 16384, 4096), ("layernorm", 16384, 4096), ("softmax", 16384, 1000)]
WIDE = [(wl, m, n) for wl in ("softmax", "layernorm", "rmsnorm") for m, n in
        ((1, 50257), (3, 8192), (16, 50257), (64, 65536), (512, 50257), (1024, 50257))]
WIDE_SYMBOLIC = [("softmax", 16, 50257), ("layernorm", 16, 50257), ("softmax", 1024, 50257)]


def sweeps(argv: list[str]) -> list[dict]:
    """The RowParams settings to run each case with: the product of the --threshold flags' values."""
    out: list[dict] = [{}]
    for k, a in enumerate(argv):
        if a == "--threshold":
            key, _, vals = argv[k + 1].partition("=")
            out = [dict(d, **{key: float(v) if "." in v else int(v)}) for d in out for v in vals.split(",")]
    return out


def torch_fn(wl):
    if wl == "softmax":
        return lambda x: torch.softmax(x, -1)
    if wl == "layernorm":
        return lambda x, g, b: torch.nn.functional.layer_norm(x, x.shape[-1:], g, b, 1e-5)
    return lambda x, g: x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-5) * g


def main() -> None:
    compile_ = "--no-compile" not in sys.argv
    rows = []
    fixed, symbolic = (WIDE, WIDE_SYMBOLIC) if "--wide" in sys.argv else (CASES, SYMBOLIC)
    allcases = [(w, m, n, False, p) for w, m, n in fixed for p in sweeps(sys.argv)]
    allcases += [(w, m, n, True, p) for w, m, n in symbolic for p in sweeps(sys.argv)]
    for wl, m, n, sym, prm in allcases:
        ins, y, _ = WORKLOADS[wl](te.var("m") if sym else m, te.var("n") if sym else n)
        t0 = time.perf_counter()
        s = auto_schedule([y], "cuda", sizes={"m": m, "n": n} if sym else None, rows=prm or None)
        strat = next((g.strategy.name for g in s.plan.groups if g.strategy is not None), "?")
        cached = any(g.caches for g in s.plan.groups)
        mod = build(s, [*ins, y], target="cuda")
        build_s = time.perf_counter() - t0
        xs = [torch.randn((m, n) if len(t.shape) == 2 else (n,), device="cuda") for t in ins]
        out = torch.full((m, n), float("nan"), device="cuda")
        mod(*xs, out)
        torch.cuda.synchronize()
        f = torch_fn(wl)
        ref = f(*[x.double() for x in xs])
        err = float((out.double() - ref).abs().max())
        p = mod.prepare(tuple(xs) + (out,))
        ours = time_cuda(torch, lambda: mod.launch(p))  # noqa: B023
        eager = time_cuda(torch, lambda: f(*xs))  # noqa: B023
        tc = None
        if compile_:
            try:
                cf = torch.compile(f, dynamic=False)
                cf(*xs)
                tc = time_cuda(torch, lambda: cf(*xs))  # noqa: B023
            except Exception as e:  # noqa: BLE001
                print("torch.compile failed:", type(e).__name__, str(e)[:200])
        nbytes = 4 * (2 * m * n + (n * (len(ins) - 1)))
        floor = nbytes / BW * 1e3
        tag = "".join(f" {k}={v}" for k, v in prm.items())
        row = (f"{wl} {m}x{n}{' sym' if sym else ''}{tag}", strat + ("+cache" if cached else ""), ours, eager, tc,
               floor, err, build_s)
        rows.append(row)
        print(f"{row[0]:40s} {row[1]:12s} ours {ours:.4f} ms eager {eager:.4f} compile "
              f"{tc if tc is None else round(tc, 4)} floor {floor:.4f} ({floor / ours:.0%}) ours/compile "
              f"{(ours / tc) if tc else float('nan'):.2f} err {err:.1e} build {build_s:.1f}s", flush=True)
    print("\n| case | strategy | ours ms | eager ms | compile ms | ours/compile | % of floor | max err |")
    print("|---|---|---|---|---|---|---|---|")
    for name, st, o, e, c, fl, err, _ in rows:
        print(f"| {name} | {st} | {o:.4f} | {e:.4f} | {'' if c is None else f'{c:.4f}'} | "
              f"{'' if c is None else f'{o / c:.2f}'} | {fl / o:.0%} | {err:.1e} |")


if __name__ == "__main__":
    main()
