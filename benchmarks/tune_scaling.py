"""Tuning throughput against the number of GPUs of one host (issues 22 and 23), with a run worker killed mid-run.

    python3 benchmarks/tune_scaling.py --gpus 1,2 --trials 64 --out $OUT          # nvidia-h200-x2
    python3 benchmarks/tune_scaling.py --gpus 1,2,4,8 --trials 256 --kill --out $OUT  # nvidia-h200-x8

The same tuning run (relu(A @ B + bias), float16, 2048^3: the tensor-core recipe's tiles; random search with one
seed, so every GPU count measures the same candidates) on 1, 2, ... GPUs through `LocalExecutor` (one long-lived
run worker per GPU, builds on the remaining cores), each into a fresh database. Reports trials per second, the
speedup over one GPU and the best time (which must agree within 2%). `--kill`: on the largest GPU count, the
last GPU's worker is SIGKILLed a third of the way in; the journal must still hold every completed trial once.
Writes RESULTS_tune_scaling.md into --out.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from codegen.tune.executor import LocalExecutor  # noqa: E402
from codegen.tune.measure import TimingPolicy  # noqa: E402
from codegen.tune.tuner import autotune  # noqa: E402
from loopir import te, workloads  # noqa: E402
from schedules.tuning.record import config_key  # noqa: E402


def _kill_later(ex: LocalExecutor, after: float, log: list[str]) -> threading.Timer:
    def go() -> None:
        w = ex._runs.workers[-1]
        if w.proc is not None and w.proc.is_alive():
            log.append(f"killed {w.name} (pid {w.proc.pid}) at {after:.0f} s")
            os.kill(w.proc.pid, signal.SIGKILL)

    t = threading.Timer(after, go)
    t.start()
    return t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", default="1,2")
    ap.add_argument("--trials", type=int, default=64)
    ap.add_argument("--size", type=int, default=2048)
    ap.add_argument("--kill", action="store_true")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    counts = [int(x) for x in a.gpus.split(",")]
    w = workloads.matmul_bias_relu(te.var("n"), te.var("m"), te.var("p"), dtype="float16")
    outs, args = list(w.outputs), list(w.args)
    sizes = {"n": a.size, "m": a.size, "p": a.size}
    rows = []
    for g in counts:
        db = f"/tmp/loopir-scaling-{g}"
        shutil.rmtree(db, ignore_errors=True)
        ex = LocalExecutor(build_workers=max(1, (os.cpu_count() or 2) - g), devices=list(range(g)))
        log: list[str] = []
        # warm the workers (spawn + imports + CUDA context) outside the timed run, as a long tuning session would
        list(ex.builds(abs, [0] * len(ex._builds.workers), 120))
        list(ex.runs(abs, [0] * g, 120))
        timer = _kill_later(ex, 20.0, log) if a.kill and g == max(counts) else None
        res = autotune(outs, args, "cuda", sizes=sizes, trials=a.trials, db=db, executor=ex, strategy="random",
                       seed=0, progress=False, policy=TimingPolicy(min_repeat=5, max_repeat=30))
        if timer is not None:
            timer.cancel()
        ex.close()
        with open(os.path.join(db, "journal.jsonl")) as f:
            lines = [json.loads(x) for x in f if x.strip()]
        keys = [config_key(x["config"]) for x in lines]
        statuses = {s: sum(x["status"] == s for x in lines) for s in {x["status"] for x in lines}}
        r = dict(gpus=g, trials=len(res.trials), seconds=res.seconds, rate=len(res.trials) / res.seconds,
                 best=res.best.median if res.best else float("nan"), lines=len(lines), unique=len(set(keys)),
                 statuses=statuses, log="; ".join(log))
        rows.append(r)
        print(f"{g} GPU(s): {r['trials']} trials in {r['seconds']:.1f} s = {r['rate']:.2f} trials/s, best "
              f"{r['best'] * 1e3:.4f} ms; journal {r['lines']} lines, {r['unique']} distinct configs, {statuses} "
              f"{r['log']}", flush=True)
    base = rows[0]
    lines = ["# Tuning throughput against GPUs (benchmarks/tune_scaling.py)", "",
             f"`python3 benchmarks/tune_scaling.py --gpus {a.gpus} --trials {a.trials}{' --kill' if a.kill else ''}`"
             f": relu(A @ B + bias) float16 {a.size}^3, random search (seed 0), LocalExecutor (one run worker per "
             "GPU, builds on the other cores, builds of the next round overlapping the runs).", "",
             "| GPUs | trials | seconds | trials/s | x one GPU | best ms | best vs one GPU | "
             "journal lines / distinct | statuses | kill |", "|" + "---|" * 10]
    for r in rows:
        lines.append(f"| {r['gpus']} | {r['trials']} | {r['seconds']:.1f} | {r['rate']:.2f} | "
                     f"{r['rate'] / base['rate']:.2f} | {r['best'] * 1e3:.4f} | {r['best'] / base['best']:.3f} | "
                     f"{r['lines']} / {r['unique']} | {r['statuses']} | {r['log'] or '-'} |")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(a.out, "RESULTS_tune_scaling.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
