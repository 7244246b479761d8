"""The `Executor` interface on Ray, and `make_executor`, the factory for both back ends.

    from codegen.tune.ray_executor import RayExecutor, make_executor

    with RayExecutor(address="auto") as ex:                  # join a running cluster (None: start a local one)
        for i, out in ex.runs(measure_candidate, jobs, timeout=30.0):   # as each job completes
            journal(i, out)
    ex = make_executor("local", build_workers=8)             # or make_executor("ray", address=...)

Builds are Ray tasks (`num_cpus=1`, no retry); runs go to one Ray actor per GPU (`num_gpus=1`: Ray sets
CUDA_VISIBLE_DEVICES) or, on a cluster without GPUs, `cpu_runs` CPU actors, each reserving one CPU. An actor
keeps its state between jobs like a local run worker, is given one job at a time, and is created with
`max_restarts=-1`: a job that kills it yields `worker died (...)`, one past its timeout gets it killed
(`ray.kill(..., no_restart=False)`); either way Ray restarts it for the next jobs.

Timeouts: a run job's clock starts when it is sent to an idle, started actor; a build task's when it is
submitted, as Ray does not say when a task starts (at most as many build tasks as free CPUs are in flight, so
the wait is a worker's start, ~1 s on a fresh cluster: keep build timeouts well above that).

How jobs reach the workers: as in `codegen.tune.executor`, `fn` and each job are pickled in the driver and
unpickled by the worker (a failure is that job's error). The driver's own sys.path entries (not the Python
installation's) reach every task and actor as PYTHONPATH in their `runtime_env`, so a module the driver imports
from a folder it added (tests/, a script's folder) imports there too. On a remote cluster those folders do not
exist: install the project there (or ship it with the cluster's `runtime_env={"working_dir": ...}`).

Ray is an optional dependency (`pip install loopir[tune]`): this module imports without it, so that
`make_executor("local")` works anywhere; `RayExecutor` raises ImportError naming the extra.
"""

from __future__ import annotations

import functools
import os
import pickle
import socket
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from loopir.errors import ArgumentError

from .feed import Feed, as_feed
from .executor import (START_FAILURES, START_TIMEOUT, Executor, LocalExecutor, Outcome, add_sys_path, core_sets,
                       error_text, run_job, stream_args)

try:
    import ray
    from ray import exceptions as ray_errors
except ImportError:  # an optional dependency: only RayExecutor needs it
    ray = None
    ray_errors = None

__all__ = ["RayExecutor", "make_executor"]

INSTALL_HINT = "the Ray back end needs Ray: pip install loopir[tune] (or pip install 'ray>=2.9')"


def make_executor(kind: str = "local", **kw: Any) -> Executor:
    """The executor of back end `kind`: "local" (`LocalExecutor(**kw)`) or "ray" (`RayExecutor(**kw)`).
    It lives here, not in executor.py, because the project imports its modules at the top of files only, and
    this module is the one that may import both back ends."""
    if kind == "local":
        return LocalExecutor(**kw)
    if kind == "ray":
        return RayExecutor(**kw)
    raise ArgumentError(f"unknown executor kind {kind!r}: 'local' or 'ray'")


# ----------------------------------------------------------------------------- what runs on the Ray workers


def _build_task(fn_bytes: bytes, job_bytes: bytes) -> tuple[bool, Any, str, float, str]:
    ok, value, error, seconds = run_job(fn_bytes, job_bytes)
    return ok, value, error, seconds, f"ray-build@{socket.gethostname()}:{os.getpid()}"


class _RunActor:
    """A long-lived run worker: module-level state of the jobs' modules persists from one job to the next."""

    def __init__(self, name: str, index: int, count: int, gpu: bool, sys_path: list[str]) -> None:
        add_sys_path(sys_path)
        if not gpu:
            os.environ["CUDA_VISIBLE_DEVICES"] = ""  # a CPU run slot stays off every GPU of its node
            cpus = core_sets(count)[index]  # disjoint per index on one node (actors spread over nodes overlap less)
            if cpus:
                os.sched_setaffinity(0, cpus)
        self.name = name

    def ping(self) -> str:
        return self.name

    def call(self, fn_bytes: bytes, job_bytes: bytes) -> tuple[bool, Any, str, float]:
        return run_job(fn_bytes, job_bytes)


# ----------------------------------------------------------------------------- the driver's side


def _user_paths() -> list[str]:
    """The driver's sys.path without the Python installation's own folders (stdlib, site-packages), which
    a worker has already, of its own Python."""
    roots = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    out = []
    for p in sys.path:
        p = os.path.abspath(p) if p else os.getcwd()
        real = os.path.realpath(p)
        if "site-packages" in real or any(real == r or real.startswith(r + os.sep) for r in roots):
            continue
        if os.path.isdir(p) and p not in out:
            out.append(p)
    return out


def _died(e: BaseException) -> str:
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"worker died ({type(e).__name__}: {first[:200]})" if first else f"worker died ({type(e).__name__})"


class _Slot:
    """One run actor as the driver sees it: starting (ping in flight), idle, or busy with one job."""

    def __init__(self, name: str, make: Callable[[], Any]) -> None:
        self.name, self.make = name, make
        self.actor = make()
        self.ping: Any = None  # the ping in flight while it (re)starts
        self.ready = False
        self.ref: Any = None  # the job in flight
        self.job: int | None = None
        self.since = 0.0
        self.start_failures = 0
        self.down_since = 0.0  # when it went down (created, killed, died): START_TIMEOUT counts from there
        self.dead = False  # gave up on it (it never started): the remaining jobs go to the others


class RayExecutor:
    """Builds as Ray tasks, runs on long-lived Ray actors (one per GPU, or `cpu_runs` CPU ones).

    address: None starts a local cluster (unless Ray is already initialized, e.g. by the caller's
    `ray.init(...)`); "auto" or "ray://host:10001" joins one. A cluster this executor started is shut down
    by `close()`. build_workers: build tasks in flight at once (default: the cluster's CPUs less those of the
    run actors). devices: run actors on GPUs (default: every GPU of the cluster; 0: CPU actors)."""

    def __init__(self, address: str | None = None, build_workers: int | None = None, devices: int | None = None,
                 cpu_runs: int = 1) -> None:
        if ray is None:
            raise ImportError(INSTALL_HINT)
        if (build_workers is not None and build_workers < 1) or cpu_runs < 1 or (devices is not None and devices < 0):
            raise ArgumentError(f"build_workers and cpu_runs must be >= 1 and devices >= 0, got {build_workers}, "
                                f"{cpu_runs} and {devices}")
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            ray.init(address=address, ignore_reinit_error=True)
        resources = ray.cluster_resources()
        gpus = int(resources.get("GPU", 0)) if devices is None else devices
        paths = _user_paths()
        # PYTHONPATH in the runtime_env: set before the worker unpickles anything (the actor class included)
        env = {"env_vars": {"PYTHONPATH": os.pathsep.join(paths)}} if paths else None
        self._build = ray.remote(_build_task).options(num_cpus=1, max_retries=0, runtime_env=env)
        actor = ray.remote(_RunActor).options(num_cpus=1, num_gpus=1 if gpus else 0, max_restarts=-1,
                                              max_task_retries=0, runtime_env=env)
        n = gpus or cpu_runs
        # created now, not at the first runs(): their CPUs are reserved before build tasks can take them all
        self._slots = [_Slot(f"gpu-{k}" if gpus else f"cpu-run-{k}",
                             functools.partial(actor.remote, f"gpu-{k}" if gpus else f"cpu-run-{k}", k, n, bool(gpus),
                                               paths))
                       for k in range(n)]
        cpus = int(resources.get("CPU", 1))
        self._build_workers = build_workers or max(1, cpus - len(self._slots))
        self._building = self._running = False
        self._closed = False

    @property
    def devices(self) -> int:
        """How many run actors (GPUs, or CPU run slots)."""
        return len(self._slots)

    @property
    def build_slots(self) -> int:
        """How many build tasks are in flight at once."""
        return self._build_workers

    @property
    def workers(self) -> tuple[str, ...]:
        """The names of the run actors ("gpu-0", ...), in order."""
        return tuple(s.name for s in self._slots)

    # -- builds: tasks

    def builds(self, fn: Callable[[Any], Any], jobs: Sequence[Any] | Feed,
               timeout: float) -> Iterator[tuple[int, Outcome]]:
        """`fn(job)` for each job (a list, or a Feed) as a Ray task; (index, Outcome) as each completes."""
        return self._builds(stream_args(fn, timeout), as_feed(jobs), timeout)

    def _builds(self, fn_bytes: bytes, feed: Feed, timeout: float) -> Iterator[tuple[int, Outcome]]:
        if self._building:
            raise RuntimeError("builds() is already streaming: finish (or close) the other iterator first")
        self._building = True
        inflight: dict[Any, tuple[int, float]] = {}
        try:
            while True:
                while len(inflight) < self._build_workers and (got := feed.take()) is not None:
                    i, job = got[0], _pickle_job(got[1])
                    if isinstance(job, Outcome):
                        yield i, job
                        continue
                    inflight[self._build.remote(fn_bytes, job)] = (i, time.monotonic())
                if not inflight:
                    if feed.done:
                        return
                    feed.wait()
                    continue
                due = min(t for _, t in inflight.values()) + timeout
                ready, _ = ray.wait(list(inflight), num_returns=1,
                                    timeout=feed.patience(max(0.0, due - time.monotonic())))
                for ref in ready:
                    i, t = inflight.pop(ref)
                    try:
                        out = Outcome(*ray.get(ref))
                    except (ray_errors.WorkerCrashedError, ray_errors.NodeDiedError) as e:
                        out = Outcome(False, error=_died(e), seconds=time.monotonic() - t, worker="ray-build")
                    except Exception as e:  # noqa: BLE001 - Ray could not run it (e.g. the value did not travel)
                        out = Outcome(False, error=error_text(e, 0), seconds=time.monotonic() - t, worker="ray-build")
                    yield i, out
                now = time.monotonic()
                for ref, (i, t) in list(inflight.items()):
                    if now - t >= timeout:
                        ray.cancel(ref, force=True)  # kills the worker process running it
                        del inflight[ref]
                        yield i, Outcome(False, error=f"timeout after {timeout:.1f} s", seconds=now - t,
                                         worker="ray-build")
        finally:
            self._building = False
            for ref in inflight:  # abandoned by the caller
                ray.cancel(ref, force=True)

    # -- runs: actors

    def runs(self, fn: Callable[[Any], Any], jobs: Sequence[Any] | Feed,
             timeout: float) -> Iterator[tuple[int, Outcome]]:
        """`fn(job)` for each job (a list, or a Feed) on the run actors (one job per actor at a time); (index,
        Outcome) as each completes."""
        return self._runs(stream_args(fn, timeout), as_feed(jobs), timeout)

    def _runs(self, fn_bytes: bytes, feed: Feed, timeout: float) -> Iterator[tuple[int, Outcome]]:
        if self._running:
            raise RuntimeError("runs() is already streaming: finish (or close) the other iterator first")
        self._running = True
        try:
            while True:
                for s in self._slots:
                    if s.dead:
                        continue
                    if not s.ready and s.ping is None:
                        s.ping, s.since = s.actor.ping.remote(), time.monotonic()
                        s.down_since = s.down_since or s.since
                    while s.ready and s.job is None and (got := feed.take()) is not None:
                        i, job = got[0], _pickle_job(got[1])
                        if isinstance(job, Outcome):
                            yield i, job
                            continue
                        s.ref, s.job, s.since = s.actor.call.remote(fn_bytes, job), i, time.monotonic()
                if feed.done and not any(s.job is not None for s in self._slots):
                    return
                live = [s for s in self._slots if not s.dead and (s.job is not None or s.ping is not None)]
                if not live:
                    if all(s.dead for s in self._slots):  # nothing will run the jobs, given or to come
                        while (got := feed.take()) is not None:
                            yield got[0], Outcome(False, error="no run actor could start (see the Ray logs)")
                    if not feed.done:
                        feed.wait()  # idle actors, and no job yet
                    continue
                refs = {(s.ref if s.job is not None else s.ping): s for s in live}
                due = min(s.since + timeout if s.job is not None else s.down_since + START_TIMEOUT for s in live)
                ready, _ = ray.wait(list(refs), num_returns=1, timeout=feed.patience(max(0.0, due - time.monotonic())))
                for ref in ready:
                    yield from self._done(refs[ref], ref)
                now = time.monotonic()
                for s in live:
                    if s.job is not None and s.ref not in ready and now - s.since >= timeout:
                        i, ran = s.job, now - s.since
                        self._restart(s)
                        yield i, Outcome(False, error=f"timeout after {timeout:.1f} s", seconds=ran, worker=s.name)
                    elif s.ping is not None and s.ping not in ready and now - s.down_since >= START_TIMEOUT:
                        self._start_failed(s, recreate=True)  # hangs in its constructor: a new actor
        finally:
            self._running = False
            for s in self._slots:
                if s.job is not None:  # abandoned by the caller: its result must not reach the next runs()
                    self._restart(s)

    def _done(self, s: _Slot, ref: Any) -> Iterator[tuple[int, Outcome]]:
        if s.job is None:  # its ping: started, or failed to
            s.ping = None
            try:
                ray.get(ref)
                s.ready, s.start_failures, s.down_since = True, 0, 0.0
            except ray_errors.ActorDiedError:  # dead for good (its constructor failed?): a new actor
                self._start_failed(s, recreate=True)
            except Exception:  # noqa: BLE001 - still restarting: ping again, until START_TIMEOUT says otherwise
                time.sleep(0.05)
                if time.monotonic() - s.down_since >= START_TIMEOUT:
                    self._start_failed(s, recreate=True)
            return
        i, started = s.job, s.since
        s.job, s.ref = None, None
        try:
            ok, value, error, seconds = ray.get(ref)
        except ray_errors.RayActorError as e:  # died running it; Ray restarts it (max_restarts=-1)
            s.ready = False
            yield i, Outcome(False, error=_died(e), seconds=time.monotonic() - started, worker=s.name)
            return
        except Exception as e:  # noqa: BLE001 - Ray could not deliver the value
            ok, value, error, seconds = False, None, error_text(e, 0), time.monotonic() - started
        yield i, Outcome(ok, value, error, seconds, s.name)

    def _restart(self, s: _Slot) -> None:
        ray.kill(s.actor, no_restart=False)  # Ray starts a fresh process for it; the next ping waits for that
        s.job, s.ref, s.ping, s.ready = None, None, None, False

    def _start_failed(self, s: _Slot, recreate: bool) -> None:
        s.ping, s.ready, s.down_since = None, False, 0.0
        s.start_failures += 1
        if s.start_failures >= START_FAILURES:
            s.dead = True
            return
        if recreate:
            ray.kill(s.actor, no_restart=True)
            s.actor = s.make()

    def close(self) -> None:
        """Kill the run actors; shut Ray down when this executor started it."""
        if self._closed:
            return
        self._closed = True
        for s in self._slots:
            try:
                ray.kill(s.actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone (Ray shut down by the caller)
                pass
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()

    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _pickle_job(job: Any) -> bytes | Outcome:
    try:
        return pickle.dumps(job)
    except Exception as e:  # noqa: BLE001 - this job cannot travel; the others can
        return Outcome(False, error=f"the job cannot be pickled: {error_text(e)}")
