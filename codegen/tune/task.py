"""What a tuning worker does with one candidate: build it (a CPU worker) or run, check and time it (a device
worker). Both are module-level functions of a picklable `Job`, so any executor (local processes, Ray) runs them.

    job = Job(graph=pickle.dumps((outputs, args)), target="cuda", sizes={"n": 4096}, config=cfg, default=dflt)
    build_candidate(job)    # {"trace": ..., "build_s": ...}: the module lands in the build cache (disk)
    measure_candidate(job)  # {"times": (...), "error": 3e-7}: the same build, found in the cache, run and timed

The builder and the runner reach the same module through `build(outputs, args, schedule=..., sizes=...)`: its
cache key is computed from the graph and the options without scheduling anything, so a runner never schedules
or compiles a candidate the builders built (build apart from run; the disk cache is shared by the processes of
one host). Sizes are pinned at the tuned shape: the candidate is measured as the kernel a fixed-size build of
that shape runs.

Numerics: every run's outputs are poisoned with NaN first and compared with the reference, the workload's own
(`Job.reference`, a picklable callable on the input arrays) or else the untuned build's outputs on the same
inputs (computed once per worker): a candidate that differs is status "wrong" and never ranks.
"""

from __future__ import annotations

import json
import pickle
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from loopir.blocks import as_dtype, as_float64
from schedules.tuning.space import options

from ..build import build
from .keys import shape_of
from .measure import TimingPolicy, cpu_timer, cuda_timer, time_until_stable

__all__ = ["Job", "build_candidate", "measure_candidate", "WrongResult"]


class WrongResult(Exception):
    """A candidate's outputs differ from the reference."""


@dataclass(frozen=True)
class Job:
    """One candidate. `graph`: pickle of (outputs, args) te tensors; `sizes`: the tuned sizes by size-variable
    name (pinned before scheduling); `config` / `default`: the candidate and the untuned rules' configuration
    (knobs at their default value are left to the rules); `reference`: optional picklable callable giving the
    expected outputs from the input arrays (float64 math)."""

    graph: bytes
    target: str
    sizes: dict[str, int]
    config: dict[str, Any]
    default: dict[str, Any]
    policy: TimingPolicy = field(default_factory=TimingPolicy)
    seed: int = 0
    reference: Any = None
    tolerance: float | None = None
    arch: str | None = None  # CUDA: the tuned device's sm_XX, so builders never open a CUDA context to ask


# keyed by the pickled graph itself (bytes hash once per object and compare exactly)
_graphs: dict[bytes, tuple[list[Any], list[Any]]] = {}
_refs: dict[tuple[Any, ...], list[tuple[np.ndarray, np.ndarray, float]]] = {}


def _case(job: Job) -> tuple[Any, ...]:
    """What a job's inputs (and, with its reference, the expected outputs) depend on."""
    return (job.graph, tuple(sorted(job.sizes.items())), job.seed)


def _graph(job: Job) -> tuple[list[Any], list[Any]]:
    """The job's tensors, unpickled once per worker (the same objects for every candidate: build's in-memory
    caches key on them)."""
    if job.graph not in _graphs:
        outs, args = pickle.loads(job.graph)
        _graphs[job.graph] = (list(outs), list(args))
    return _graphs[job.graph]


def _build(job: Job, config: dict[str, Any]) -> Any:
    outs, args = _graph(job)
    sched, bopts = options(config, job.default)
    if job.target == "cuda" and job.arch:
        bopts["arch"] = job.arch
    return build(outs, args, target=job.target, sizes=dict(job.sizes) or None, schedule=sched or None, tuned=False,
                 **bopts)


def build_candidate(job: Job) -> dict[str, Any]:
    """Schedule and compile the candidate (into the build cache); its trace and the seconds it took."""
    t0 = time.perf_counter()
    mod = _build(job, job.config)
    # the journal keeps the trace compact (Schedule.replay reads either form)
    trace = json.dumps(json.loads(mod.trace), separators=(",", ":")) if mod.trace else None
    return {"trace": trace, "build_s": time.perf_counter() - t0, "kernels": list(mod.kernels)}


_arrays: dict[tuple[Any, ...], tuple[list[np.ndarray], list[int]]] = {}


def _inputs(job: Job) -> tuple[list[np.ndarray], list[int]]:
    """Random arrays for every argument (standard normal, never zeros; outputs NaN) and the positions of the
    outputs: made once per workload, shape and seed in a worker (every candidate reads the same inputs)."""
    key = _case(job)
    if key not in _arrays:
        if len(_arrays) > 4:  # a long-lived worker tunes one workload after another: keep few
            _arrays.clear()
        _arrays[key] = _make_inputs(job)
    return _arrays[key]


def _make_inputs(job: Job) -> tuple[list[np.ndarray], list[int]]:
    outs, args = _graph(job)
    rng = np.random.default_rng(job.seed)
    out_ids = {id(t) for t in outs}
    arrays, written = [], []
    for k, a in enumerate(args):
        shape = shape_of(a, job.sizes)
        if id(a) in out_ids:
            arrays.append(as_dtype(np.full(shape, np.nan), a.dtype))
            written.append(k)
        else:
            arrays.append(as_dtype(rng.standard_normal(shape), a.dtype))
    return arrays, written


def _reference(job: Job, arrays: list[np.ndarray], written: list[int]) -> list[tuple[np.ndarray, np.ndarray, float]]:
    key = (*_case(job), job.reference)
    if key not in _refs:
        if job.reference is not None:
            ins = [a for k, a in enumerate(arrays) if k not in written]
            refs = [np.asarray(r, dtype=np.float64) for r in job.reference(*ins)]
        else:
            outs, args = _graph(job)
            mod = _build(job, job.default)
            fresh = [a.copy() for a in arrays]
            mod(*fresh)
            refs = [as_float64(fresh[k], args[k].dtype) for k in written]
        if len(_refs) > 4:
            _refs.clear()
        # compared in float32 (half the bytes of float64; the outputs are float32 or narrower): the reference,
        # where it is NaN, and its scale are computed once per worker
        _refs[key] = [(r.astype(np.float32), np.isnan(r), max(float(np.nanmax(np.abs(r), initial=0.0)), 1e-30))
                      for r in refs]
    return _refs[key]


def _tolerance(job: Job) -> float:
    if job.tolerance is not None:
        return job.tolerance
    _, args = _graph(job)
    return 2e-2 if any(a.dtype in ("float16", "bfloat16") for a in args) else 1e-4


def measure_candidate(job: Job) -> dict[str, Any]:
    """Run the candidate once and check it against the reference (WrongResult when it differs), then time it
    until the timing policy is satisfied; the samples in seconds and the relative error."""
    outs, args = _graph(job)
    mod = _build(job, job.config)
    arrays, written = _inputs(job)
    want = _reference(job, arrays, written)
    run = [a.copy() for a in arrays]
    if job.target == "cuda":
        timer = cuda_timer(mod, run, job.policy)
        timer()
        timer.finish()
    else:
        mod(*run)
    err = 0.0
    for k, (ref, ref_nan, scale) in zip(written, want):
        dt = args[k].dtype
        got = as_float64(run[k], dt) if dt == "bfloat16" else run[k]
        got = got if got.dtype == np.float32 else got.astype(np.float32)
        bad = np.isnan(got) != ref_nan
        if bad.any():
            raise WrongResult(f"{args[k].name}: {int(bad.sum())} elements NaN where the reference is not (or back)")
        err = max(err, float(np.nanmax(np.abs(got - ref), initial=0.0)) / scale)
    if err > _tolerance(job):
        raise WrongResult(f"relative error {err:.2e} against the reference (tolerance {_tolerance(job):.0e})")
    if job.target == "cuda":
        try:
            times = time_until_stable(timer, job.policy)
        finally:
            timer.close()
    else:
        times = time_until_stable(cpu_timer(lambda: mod(*run)), job.policy)
    return {"times": tuple(float(t) for t in times), "error": err}
