"""Does the search find the best sooner than random sampling? Measured on the GPU, compared by replay.

    python3 benchmarks/tune_search.py --out $OUT                 # on the device: measure whole spaces
    python3 benchmarks/tune_search.py --replay $OUT/db           # anywhere: the comparison from the journal

Part 1 (device): for each workload and shape, every configuration of its space is measured once (random search
with trials = the space's size, so the whole space is covered; the journal keeps every trial) and the total
trials per second is reported (the 1,000-trials-in-10-minutes goal).
Part 2 (replay): on each measured table, the random and the evolutionary strategy (XGBoost cost model) are
replayed from scratch, 3 seeds each, in batches of 16: the trials each needs to reach 95% and 100% of the best
measured time. Replaying on measured times removes measurement noise from the comparison (both strategies see
the same time for the same candidate) and needs no device. Writes RESULTS_tune_search.md into --out.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from codegen.tune.executor import LocalExecutor  # noqa: E402
from codegen.tune.keys import shape_key, workload_key  # noqa: E402
from codegen.tune.measure import TimingPolicy  # noqa: E402
from codegen.tune.tuner import autotune  # noqa: E402
from loopir import workloads  # noqa: E402
from schedules.tuning.database import Database  # noqa: E402
from schedules.tuning.record import config_key  # noqa: E402
from schedules.tuning.model import HAVE_XGBOOST  # noqa: E402
from schedules.tuning.search import make_strategy  # noqa: E402
from schedules.tuning.space import space_for  # noqa: E402

CASES = (("softmax", "float16", (65536, 512)), ("softmax", "float32", (65536, 512)),
         ("layernorm", "float16", (65536, 512)), ("layernorm", "float32", (65536, 512)),
         ("softmax", "float16", (32768, 1024)), ("softmax", "float16", (10000, 3000)))


def _space(name: str, dtype: str, shape: tuple[int, int]):  # noqa: ANN202
    w = getattr(workloads, name)(dtype=dtype)
    return w, space_for(list(w.outputs), "cuda", {"m": shape[0], "n": shape[1]})


def measure(out: str) -> list[str]:
    db = os.path.join(out, "db")
    ex = LocalExecutor(build_workers=max(1, (os.cpu_count() or 2) - 1))
    t0, total = time.perf_counter(), 0
    lines = []
    for name, dtype, shape in CASES:
        w, sp = _space(name, dtype, shape)
        res = autotune(list(w.outputs), list(w.args), "cuda", sizes={"m": shape[0], "n": shape[1]},
                       trials=sp.size(), db=db, executor=ex, strategy="random", progress=False,
                       policy=TimingPolicy(min_repeat=5, max_repeat=50, max_seconds=1.0))
        total += len(res.trials)
        lines.append(f"| {name} | {dtype} | {shape[0]}x{shape[1]} | {sp.size()} | {len(res.trials)} | "
                     f"{len(res.trials) / res.seconds:.2f} | {res.default.median * 1e3:.4f} | "
                     f"{res.best.median * 1e3:.4f} | {res.speedup:.2f} |")
        print(lines[-1], flush=True)
    ex.close()
    el = time.perf_counter() - t0
    return (["| workload | dtype | shape | space | trials | trials/s | untuned ms | best ms | best / untuned |",
             "|---|---|---|---|---|---|---|---|---|", *lines, "",
             f"All: {total} trials in {el:.0f} s = {total / el:.2f} trials/s "
             f"({total / el * 600:.0f} trials in 10 minutes at that rate), one GPU, "
             f"{max(1, (os.cpu_count() or 2) - 1)} build processes."])


def _replay(space, table: dict[str, float], strategy: str, seed: int, frac: float, budget: int) -> int:  # noqa: ANN001
    best = min(table.values())
    s = make_strategy(strategy, space, seed=seed)
    n = 0
    while n < budget:
        props = s.propose(16)
        if not props:
            break
        res = []
        for c in props:
            n += 1
            t = table.get(config_key(c))
            res.append((c, t))
            if t is not None and best / t >= frac:
                return n
        s.observe(res)
    return budget + 1


def replay(db_path: str) -> list[str]:
    db = Database(db_path)
    tables: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    for t in db.trials():
        if t.ok:
            tables[(t.workload, t.shape)][t.key()] = t.median
    lines = ["| workload | dtype | shape | measured | untuned / best | random to 95% | evolutionary to 95% | "
             "random to 99% | evolutionary to 99% | random to best | evolutionary to best |", "|" + "---|" * 11]
    wins = []
    for name, dtype, shape in CASES:
        w, sp = _space(name, dtype, shape)
        key = (workload_key(list(w.outputs), list(w.args)), shape_key(list(w.args), {"m": shape[0], "n": shape[1]}))
        if key not in tables:
            continue
        table = tables[key]
        default = table.get(config_key(sp.default), float("nan"))
        budget = sp.size()
        r = {(st, f): [_replay(sp, table, st, seed, f, budget) for seed in range(3)]
             for st in ("random", "evolutionary") for f in (0.95, 0.99, 1.0)}
        med = {k: statistics.median(v) for k, v in r.items()}
        wins.append(med[("evolutionary", 1.0)] < med[("random", 1.0)])
        lines.append(f"| {name} | {dtype} | {shape[0]}x{shape[1]} | {len(table)} of {sp.size()} | "
                     f"{default / min(table.values()):.2f} | {r[('random', 0.95)]} ({med[('random', 0.95)]}) | "
                     f"{r[('evolutionary', 0.95)]} ({med[('evolutionary', 0.95)]}) | {r[('random', 0.99)]} "
                     f"({med[('random', 0.99)]}) | {r[('evolutionary', 0.99)]} ({med[('evolutionary', 0.99)]}) | "
                     f"{r[('random', 1.0)]} "
                     f"({med[('random', 1.0)]}) | {r[('evolutionary', 1.0)]} ({med[('evolutionary', 1.0)]}) |")
        print(lines[-1], flush=True)
    lines += ["", f"Trials to reach 95% / 99% / 100% of the best measured time, 3 seeds (median in parentheses; a "
              f"value over the space's size: not reached; the cost model: {model_kind()}). Evolutionary needed "
              "fewer trials than random to reach the best (medians): "
              f"{sum(wins)} of {len(wins)} tables."]
    return lines


def model_kind() -> str:
    return "XGBoost ranking" if HAVE_XGBOOST else "ridge regression (xgboost not installed)"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    ap.add_argument("--replay", help="a database measured by part 1: replay only")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    lines = ["# Search against random sampling, on spaces measured on the GPU (benchmarks/tune_search.py)", ""]
    if not a.replay:
        lines += ["## Measuring every configuration", "", *measure(a.out), ""]
    lines += ["## Replayed search", "", *replay(a.replay or os.path.join(a.out, "db"))]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(a.out, "RESULTS_tune_search.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
