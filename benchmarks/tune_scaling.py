"""Tuning throughput against the number of GPUs of one host (issues 22 and 23), with a run worker killed mid-run.

    python3 benchmarks/tune_scaling.py --gpus 1,2 --trials 96 --executors local,ray --kill --out $OUT  # h200-x2
    python3 benchmarks/tune_scaling.py --gpus 1,2,4,8 --trials 256 --kill --out $OUT                   # h200-x8
    python3 benchmarks/tune_scaling.py --plot $OUT/tune_scaling.json    # the PNG, where matplotlib is

The same tuning run (relu(A @ B + bias), float16, 2048^3 by default; random search with one seed, so every GPU
count measures the same candidates) on 1, 2, ... GPUs, each into a fresh database, through each back end:
`LocalExecutor` (one long-lived run worker process per GPU, builds in processes on the remaining cores) and
`RayExecutor` (a local Ray cluster: one run actor per GPU with `num_gpus=1`, builds as Ray CPU tasks). Reports
trials per second, the speedup over one GPU of the same back end and the best time (which must agree within
2%). `--kill`: on the largest GPU count, the last GPU's run worker is SIGKILLed (by its process id, from outside,
as a crash would) --kill-at seconds in; the journal must still hold every completed trial exactly once. Writes
RESULTS_tune_scaling.md and tune_scaling.json into --out.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import signal
import sys
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from codegen.tune.measure import TimingPolicy  # noqa: E402
from codegen.tune.ray_executor import make_executor  # noqa: E402
from codegen.tune.tuner import autotune  # noqa: E402
from loopir import te, workloads  # noqa: E402
from schedules.tuning.record import config_key  # noqa: E402


def _pid(_: Any) -> int:
    return os.getpid()


def _kill_later(pid: int, name: str, after: float, log: list[str]) -> threading.Timer:
    def go() -> None:
        try:
            os.kill(pid, signal.SIGKILL)
            log.append(f"SIGKILLed {name} (pid {pid}) at {after:.0f} s")
        except ProcessLookupError:
            log.append(f"{name} (pid {pid}) was gone at {after:.0f} s")

    t = threading.Timer(after, go)
    t.start()
    return t


class _Timed:
    """The executor, with the wall time of each builds() / runs() stream and the seconds its jobs took: where a
    row's time goes (builds of round r + 1 overlap runs of round r)."""

    def __init__(self, ex: Any) -> None:
        self.ex = ex
        self.phases: dict[str, list[float]] = {"builds": [], "runs": [], "build_job": [], "run_job": []}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.ex, name)

    def _stream(self, phase: str, it: Any) -> Any:
        t0 = time.monotonic()
        for i, o in it:
            self.phases[phase[:-1] + "_job"].append(o.seconds)
            yield i, o
        self.phases[phase].append(time.monotonic() - t0)

    def builds(self, fn: Any, jobs: Any, timeout: float) -> Any:
        return self._stream("builds", self.ex.builds(fn, jobs, timeout))

    def runs(self, fn: Any, jobs: Any, timeout: float) -> Any:
        return self._stream("runs", self.ex.runs(fn, jobs, timeout))

    def summary(self) -> str:
        p = self.phases
        return (f"{len(p['builds'])} build streams {sum(p['builds']):.1f} s wall "
                f"(max {max(p['builds'], default=0):.1f}),"
                f" build jobs {sum(p['build_job']):.1f} s (mean {_mean(p['build_job']):.2f}, max "
                f"{max(p['build_job'], default=0):.2f}); {len(p['runs'])} run streams {sum(p['runs']):.1f} s wall, "
                f"run jobs {sum(p['run_job']):.1f} s (mean {_mean(p['run_job']):.2f})")


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def _executor(kind: str, gpus: int) -> Any:
    cores = os.cpu_count() or 2
    if kind == "local":
        return make_executor("local", build_workers=max(1, cores - gpus), devices=list(range(gpus)))
    return make_executor("ray", devices=gpus, build_workers=max(1, cores - gpus))


def _one(kind: str, g: int, a: argparse.Namespace, kill: bool) -> dict[str, Any]:
    w = workloads.matmul_bias_relu(te.var("n"), te.var("m"), te.var("p"), dtype="float16")
    sizes = {"n": a.size, "m": a.size, "p": a.size}
    db = f"/tmp/loopir-scaling-{kind}-{g}"
    cache = f"/tmp/loopir-scaling-cache-{kind}-{g}"
    for d in (db, cache):
        shutil.rmtree(d, ignore_errors=True)
    os.environ["LOOPIR_CACHE_DIR"] = cache  # every row builds cold: no row gains from an earlier row's builds
    t0 = time.monotonic()
    ex = _executor(kind, g)
    log: list[str] = []
    # start the workers (spawn, imports, CUDA context) outside the timed run, as a long tuning session would
    # by reference to this file as a module (the workers' __main__ is not this script)
    pid = importlib.import_module("tune_scaling")._pid
    list(ex.builds(pid, [0] * ex.build_slots, 120))
    outs = [o for _, o in ex.runs(pid, [0] * (4 * g), 120)]
    pids = {o.worker: o.value for o in outs if o.ok}
    if len(pids) != g:
        raise RuntimeError(f"{kind}: {len(pids)} of {g} run workers answered: {[o.error for o in outs]}")
    started = time.monotonic() - t0
    timer = None
    if kill:
        name = sorted(pids)[-1]
        timer = _kill_later(pids[name], name, a.kill_at, log)
    timed = _Timed(ex)
    res = autotune(list(w.outputs), list(w.args), "cuda", sizes=sizes, trials=a.trials, db=db, executor=timed,
                   strategy="random", seed=0, progress=False, policy=TimingPolicy(min_repeat=5, max_repeat=30))
    if timer is not None:
        timer.cancel()
    ex.close()
    with open(os.path.join(db, "journal.jsonl")) as f:
        lines = [json.loads(x) for x in f if x.strip()]
    keys = [config_key(x["config"]) for x in lines]
    statuses = {s: sum(x["status"] == s for x in lines) for s in sorted({x["status"] for x in lines})}
    errors = sorted({x.get("error", "")[:120] for x in lines if x["status"] != "ok"})
    r = dict(executor=kind, gpus=g, workers=sorted(pids), trials=len(res.trials), seconds=res.seconds,
             rate=len(res.trials) / res.seconds, best=res.best.median if res.best else float("nan"),
             lines=len(lines), unique=len(set(keys)), statuses=statuses, errors=errors, start_s=started,
             log="; ".join(log), phases=timed.summary())
    print(f"{kind} {g} GPU(s) {r['workers']}: {r['trials']} trials in {r['seconds']:.1f} s = {r['rate']:.2f}/s, "
          f"best {r['best'] * 1e3:.4f} ms; journal {r['lines']} lines, {r['unique']} distinct, {statuses} "
          f"{r['log']} {errors}\n    {r['phases']}", flush=True)
    return r


def _table(rows: list[dict[str, Any]], a: argparse.Namespace) -> str:
    out = ["# Tuning throughput against GPUs (benchmarks/tune_scaling.py)", "",
           f"`python3 benchmarks/tune_scaling.py --gpus {a.gpus} --trials {a.trials} --executors {a.executors}"
           f"{' --kill' if a.kill else ''}`: relu(A @ B + bias) float16 {a.size}^3, random search (seed 0), a fresh "
           "database per row; workers started before the clock (start s).", "",
           "| back end | GPUs | trials | seconds | trials/s | x one GPU | best ms | best vs one GPU | "
           "journal lines / distinct | statuses | start s | kill |", "|" + "---|" * 12]
    for r in rows:
        base = next(b for b in rows if b["executor"] == r["executor"] and b["gpus"] == min(
            x["gpus"] for x in rows if x["executor"] == r["executor"]))
        out.append(f"| {r['executor']} | {r['gpus']} | {r['trials']} | {r['seconds']:.1f} | {r['rate']:.2f} | "
                   f"{r['rate'] / base['rate']:.2f} | {r['best'] * 1e3:.4f} | {r['best'] / base['best']:.3f} | "
                   f"{r['lines']} / {r['unique']} | {r['statuses']} | {r['start_s']:.1f} | {r['log'] or '-'} |")
    return "\n".join(out) + "\n"


def plot(path: str) -> str:
    """Trials per second against GPUs, one line per back end, beside the ideal (linear) line."""
    import matplotlib  # noqa: PLC0415 - only the plotting mode needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    with open(path) as f:
        rows = json.load(f)["rows"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for kind in sorted({r["executor"] for r in rows}):
        rs = sorted((r for r in rows if r["executor"] == kind), key=lambda r: r["gpus"])
        ax.plot([r["gpus"] for r in rs], [r["rate"] for r in rs], "o-", label=kind)
        ax.plot([r["gpus"] for r in rs], [rs[0]["rate"] * r["gpus"] / rs[0]["gpus"] for r in rs], ":",
                color="gray")
    ax.set_xlabel("GPUs (one host)")
    ax.set_ylabel("trials / s")
    ax.set_xticks(sorted({r["gpus"] for r in rows}))
    ax.set_title("Tuning throughput (dotted: linear in GPUs)")
    ax.legend()
    png = os.path.splitext(path)[0] + ".png"
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    return png


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", default="1,2")
    ap.add_argument("--trials", type=int, default=96)
    ap.add_argument("--size", type=int, default=2048)
    ap.add_argument("--executors", default="local", help="comma-separated: local, ray")
    ap.add_argument("--kill", action="store_true")
    ap.add_argument("--kill-at", type=float, default=10.0, help="seconds into the timed run")
    ap.add_argument("--plot", help="a tune_scaling.json to plot (no tuning)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    a = ap.parse_args()
    if a.plot:
        print(plot(a.plot))
        return
    os.makedirs(a.out, exist_ok=True)
    counts = [int(x) for x in a.gpus.split(",")]
    rows = []
    for kind in a.executors.split(","):
        for g in counts:
            rows.append(_one(kind, g, a, a.kill and g == max(counts)))
            with open(os.path.join(a.out, "tune_scaling.json"), "w") as f:
                json.dump({"args": vars(a), "rows": rows}, f, indent=1)
    text = _table(rows, a)
    with open(os.path.join(a.out, "RESULTS_tune_scaling.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
