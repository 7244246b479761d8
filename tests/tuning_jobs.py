"""Job functions for tests/test_tuning_executor.py, in a module of their own so that worker processes can import
them: the executors pickle `fn` by reference (`tuning_jobs.act`), and a worker puts the parent's sys.path (which
holds tests/ under pytest) in front of its own before unpickling.

    LocalExecutor().builds(tuning_jobs.act, [("square", 3), ("exit", 3), ("sleep", 30.0)], timeout=2.0)
"""

from __future__ import annotations

import os
import signal
import statistics
import time
from typing import Any

import numpy as np

from codegen import build
from codegen.tune.measure import TimingPolicy, cuda_timer, time_until_stable
from loopir import workloads

COUNTER = 0  # per worker process: grows across the jobs of a long-lived worker
MODULES: dict[str, Any] = {}  # per worker process: CUDA modules built by earlier jobs


def act(job: tuple[str, Any]) -> Any:
    """One job, `(what, argument)`: so one stream can mix good jobs with ones that hang, raise or kill."""
    what, arg = job
    if what == "square":
        return arg * arg
    if what == "sleep":  # sleeps `arg` seconds, then answers "slept"
        time.sleep(arg)
        return "slept"
    if what == "raise":
        raise ZeroDivisionError(f"job {arg} divides by zero")
    if what == "exit":  # dies without a word, as a crashing extension module would
        os._exit(arg)
    if what == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if what == "count":
        global COUNTER
        COUNTER += 1
        return os.getpid(), COUNTER
    if what == "env":  # what the worker was set up with, after `arg` seconds
        time.sleep(arg)
        return os.environ.get("CUDA_VISIBLE_DEVICES"), sorted(os.sched_getaffinity(0)), os.getpid()
    if what == "unpicklable":
        return lambda: None
    if what == "gpu_time":
        return _gpu_time(arg)
    raise KeyError(what)


def _gpu_time(n: int) -> tuple[str | None, int, float, bool, bool]:
    """Time gelu on n elements on this worker's GPU: (CUDA_VISIBLE_DEVICES, samples, median seconds, results
    right, module built by an earlier job of this worker)."""
    w = workloads.gelu()
    cached = "gelu" in MODULES
    if not cached:
        MODULES["gelu"] = build(list(w.outputs), list(w.args), target="cuda")
    ins = w.random_inputs({v.name: n for v in w.sizes}, np.random.default_rng(0))
    outs = w.empty_outputs({v.name: n for v in w.sizes})
    policy = TimingPolicy(max_seconds=1.0)
    with cuda_timer(MODULES["gelu"], w.call_args(ins, outs), policy) as run_once:
        samples = time_until_stable(run_once, policy)
        run_once.finish()
    tol = w.tolerance * 10
    right = all(np.allclose(o, r, rtol=tol, atol=tol) for o, r in zip(outs, w.reference(*ins)))
    return os.environ.get("CUDA_VISIBLE_DEVICES"), len(samples), statistics.median(samples), right, cached
