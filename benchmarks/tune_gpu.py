"""Autotuning on the GPU (issue 22): tune, then time the tuned build against the untuned one and PyTorch.

    python3 benchmarks/tune_gpu.py --gemm-trials 120 --row-trials 30 --out $OUT

1. relu(A @ B + bias), float16, sizes symbolic (te.var) tuned at 4096^3: `autotune` over the tensor-core
   recipe's tiles, then `build(..., tuned=db)` (the database's best) timed beside the untuned build, cuBLAS
   (torch eager) and torch.compile, all in this process; TFLOP/s and the ratio to cuBLAS.
2. softmax and layer norm (float16 and float32) at five shapes each: tuned vs untuned vs torch.compile.
3. The search itself: trials per second of each tuning run; from the GEMM's journal (every valid configuration
   measured once), the trials random search and the evolutionary search need to reach 95% of the best,
   replayed on the measured times (median of 3 seeds).

Writes RESULTS_tuning.md (and tune_gemm.png) into --out. Medians from gpu_suite.time_cuda (CUDA events around
back-to-back calls); errors against float64 references computed on the GPU.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from codegen import build  # noqa: E402
from codegen.tune.executor import LocalExecutor  # noqa: E402
from codegen.tune.measure import TimingPolicy  # noqa: E402
from codegen.tune.tuner import autotune  # noqa: E402
from gpu_suite import time_cuda  # noqa: E402
from loopir import te, workloads  # noqa: E402
from schedules.tuning.database import Database  # noqa: E402
from schedules.tuning.record import config_key  # noqa: E402
from schedules.tuning.space import space_for  # noqa: E402

ROW_SHAPES = ((16384, 4096), (32768, 1024), (8192, 8192), (65536, 512), (10000, 3000))


def _torch_fn(name: str, torch):  # noqa: ANN001, ANN202
    F = torch.nn.functional
    if name == "softmax":
        return lambda x: torch.softmax(x, dim=-1)
    return lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)


def _time_row(torch, name: str, dtype: str, shape: tuple[int, int], trials: int, db: str, ex) -> dict:  # noqa: ANN001
    w = getattr(workloads, name)(dtype=dtype)
    outs, args = list(w.outputs), list(w.args)
    sizes = {"m": shape[0], "n": shape[1]}
    t0 = time.perf_counter()
    res = autotune(outs, args, "cuda", sizes=sizes, trials=trials, db=db, progress=False, executor=ex,
                   policy=TimingPolicy(min_repeat=5, max_repeat=50, max_seconds=1.0))
    tune_s = time.perf_counter() - t0
    tdt = getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(7)
    x = torch.randn(*shape, device="cuda", generator=g).to(tdt)
    ins = [x] if name == "softmax" else [x, torch.randn(shape[1], device="cuda", generator=g).to(tdt),
                                        torch.randn(shape[1], device="cuda", generator=g).to(tdt)]
    y = torch.full_like(x, float("nan"))
    tuned = build(outs, args, "cuda", sizes=sizes, tuned=db)
    plain = build(outs, args, "cuda", sizes=sizes, tuned=False)
    fn = _torch_fn(name, torch)
    torch._dynamo.reset()
    comp = torch.compile(fn, dynamic=False)
    comp(*ins)
    ref = fn(*(t.double() for t in ins)) if name == "softmax" else torch.nn.functional.layer_norm(
        ins[0].double(), (shape[1],), ins[1].double(), ins[2].double(), 1e-5)
    tuned(*ins, y)
    torch.cuda.synchronize()
    err = ((y.double() - ref).abs().max() / ref.abs().max()).item()
    t_tuned = time_cuda(torch, lambda: tuned(*ins, y))
    t_plain = time_cuda(torch, lambda: plain(*ins, y))
    t_comp = time_cuda(torch, lambda: comp(*ins))
    t_eager = time_cuda(torch, lambda: fn(*ins))
    nbytes = sum(t.numel() * t.element_size() for t in ins) + y.numel() * y.element_size()
    r = dict(name=name, dtype=dtype, shape=f"{shape[0]}x{shape[1]}", tuned=t_tuned, plain=t_plain, comp=t_comp,
             eager=t_eager, err=err, trials=len(res.trials) + res.resumed, tune_s=tune_s,
             rate=len(res.trials) / max(res.seconds, 1e-9), floor=nbytes / 4.25e12 * 1e3,
             config=config_key(res.best.config) if res.best else "-")
    print(f"{name:8s} {dtype:8s} {r['shape']:11s} tuned {t_tuned:.4f} untuned {t_plain:.4f} compile {t_comp:.4f} "
          f"eager {t_eager:.4f} ms  tuned/compile {t_tuned / t_comp:.2f}  floor {r['floor'] / t_tuned:.0%}  err "
          f"{err:.1e}  {r['trials']} trials {tune_s:.0f} s ({r['rate']:.2f}/s)  {r['config']}", flush=True)
    return r


def _gemm(torch, trials: int, db: str, out: str, ex, n: int = 4096, dtype: str = "float16") -> dict:  # noqa: ANN001
    torch.backends.cuda.matmul.allow_tf32 = False  # cuBLAS in float32, as ours
    w = workloads.matmul_bias_relu(te.var("n"), te.var("m"), te.var("p"), dtype=dtype)
    outs, args = list(w.outputs), list(w.args)
    sizes = {"n": n, "m": n, "p": n}
    t0 = time.perf_counter()
    res = autotune(outs, args, "cuda", sizes=sizes, trials=trials, db=db, progress=True, executor=ex,
                   plot=os.path.join(out, "tune_gemm.png"),
                   policy=TimingPolicy(min_repeat=5, max_repeat=30, max_seconds=1.0))
    tune_s = time.perf_counter() - t0
    print(res.explain(), flush=True)
    g = torch.Generator(device="cuda").manual_seed(3)
    tdt = getattr(torch, dtype)
    a = torch.randn(n, n, device="cuda", generator=g).to(tdt)
    b = torch.randn(n, n, device="cuda", generator=g).to(tdt)
    bias = torch.randn(n, device="cuda", generator=g).to(tdt)
    c = torch.full((n, n), float("nan"), device="cuda", dtype=tdt)
    tuned = build(outs, args, "cuda", tuned=db)  # symbolic sizes: the largest tuned shape's best
    plain = build(outs, args, "cuda", tuned=False)
    tuned(a, b, bias, c)
    torch.cuda.synchronize()
    ref = torch.relu(a.double() @ b.double() + bias.double())
    err = ((c.double() - ref).abs().max() / ref.abs().max()).item()
    t_tuned = time_cuda(torch, lambda: tuned(a, b, bias, c), batch=5, repeat=11)
    t_plain = time_cuda(torch, lambda: plain(a, b, bias, c), batch=5, repeat=11)
    t_cublas = time_cuda(torch, lambda: torch.relu(a @ b + bias), batch=5, repeat=11)
    mm = torch.compile(lambda a, b, bias: torch.relu(a @ b + bias), dynamic=False)
    mm(a, b, bias)
    t_comp = time_cuda(torch, lambda: mm(a, b, bias), batch=5, repeat=11)
    fl = 2.0 * n ** 3
    print(f"GEMM {dtype} {n}^3: tuned {t_tuned:.4f} ms ({fl / t_tuned / 1e9:.0f} TFLOP/s) untuned {t_plain:.4f} cuBLAS "
          f"{t_cublas:.4f} ({fl / t_cublas / 1e9:.0f}) compile {t_comp:.4f}; tuned/cuBLAS throughput "
          f"{t_cublas / t_tuned:.2f}, err {err:.1e}; notes {[x for x in tuned.notes if x.startswith('tuned')]}",
          flush=True)
    return dict(res=res, tuned=t_tuned, plain=t_plain, cublas=t_cublas, comp=t_comp, err=err, tune_s=tune_s,
                tflops=fl / t_tuned / 1e9, space=space_for(outs, "cuda", sizes))


def main() -> None:
    import torch

    ap = argparse.ArgumentParser()
    ap.add_argument("--gemm-trials", type=int, default=120)
    ap.add_argument("--row-trials", type=int, default=30)
    ap.add_argument("--rows", default="softmax,layernorm")
    ap.add_argument("--dtypes", default="float16,float32")
    ap.add_argument("--skip-gemm", action="store_true")
    ap.add_argument("--gemm-size", type=int, default=4096)
    ap.add_argument("--gemm-dtype", default="float16")
    ap.add_argument("--shapes", default=",".join(f"{m}x{n}" for m, n in ROW_SHAPES))
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    ap.add_argument("--db", default="/tmp/loopir-tune-db")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    lines = ["# Autotuning on the GPU (benchmarks/tune_gpu.py)", "",
             f"{torch.cuda.get_device_name()}; `python3 benchmarks/tune_gpu.py --gemm-trials {a.gemm_trials} "
             f"--row-trials {a.row_trials}`; times: medians of gpu_suite.time_cuda in this process.", ""]
    # one executor for every tuning run: its workers (15 builders, one per GPU) start once and keep their caches
    ex = LocalExecutor(build_workers=max(1, (os.cpu_count() or 2) - 1))
    if not a.skip_gemm:
        gm = _gemm(torch, a.gemm_trials, a.db, a.out, ex, a.gemm_size, a.gemm_dtype)
        res = gm["res"]
        table = {t.key(): t.median for t in Database(a.db).trials(res.workload, res.target, res.shape) if t.ok}
        lines += [f"## relu(A @ B + bias), {a.gemm_dtype}, {a.gemm_size}^3 (sizes symbolic, tuned there)", "",
                  "| impl | ms | TFLOP/s | cuBLAS / impl |", "|---|---|---|---|"]
        fl = 2.0 * a.gemm_size ** 3
        for k, label in (("tuned", "loopir tuned (build reads the database)"), ("plain", "loopir untuned rules"),
                         ("cublas", "cuBLAS (torch eager)"), ("comp", "torch.compile")):
            lines.append(f"| {label} | {gm[k]:.4f} | {fl / gm[k] / 1e9:.0f} | {gm['cublas'] / gm[k]:.2f} |")
        lines += ["", f"Tuning: {len(res.trials)} trials ({sum(t.ok for t in res.trials)} ok, pruned before "
                  f"building: {res.pruned}) in {gm['tune_s']:.0f} s = {len(res.trials) / res.seconds:.2f} trials/s; "
                  f"best {config_key(res.best.config) if res.best else '-'}; rel. error vs float64 {gm['err']:.1e}.",
                  f"Space: {gm['space'].size()} configurations, {len(table)} measured ok "
                  "(benchmarks/tune_search.py compares the strategies).", ""]
    rows = []
    for name in filter(None, a.rows.split(",")):
        for dtype in a.dtypes.split(","):
            for shape in [tuple(int(x) for x in sh.split("x")) for sh in a.shapes.split(",")]:
                rows.append(_time_row(torch, name, dtype, shape, a.row_trials, a.db, ex))
    ex.close()
    if rows:
        lines += ["## Rows: tuned vs untuned vs torch.compile", "",
                  "| workload | dtype | shape | tuned ms | untuned ms | compile ms | tuned / compile | % of floor | "
                  "trials | trials/s | rel. err | best configuration |", "|" + "---|" * 12]
        for r in rows:
            lines.append(f"| {r['name']} | {r['dtype']} | {r['shape']} | {r['tuned']:.4f} | {r['plain']:.4f} | "
                         f"{r['comp']:.4f} | {r['tuned'] / r['comp']:.2f} | {r['floor'] / r['tuned']:.0%} | "
                         f"{r['trials']} | {r['rate']:.2f} | {r['err']:.1e} | `{r['config']}` |")
        worst = max(rows, key=lambda r: r["tuned"] / r["comp"])
        lines += ["", f"Worst row: {worst['name']} {worst['dtype']} {worst['shape']} at "
                  f"{worst['tuned'] / worst['comp']:.2f}x torch.compile. Total trials "
                  f"{sum(r['trials'] for r in rows)} in {sum(r['tune_s'] for r in rows):.0f} s."]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(a.out, "RESULTS_tuning.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
