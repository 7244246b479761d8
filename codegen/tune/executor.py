"""Where the tuner's jobs run: one `Executor` interface, and its local back end, `LocalExecutor`.

    from codegen.tune.executor import LocalExecutor
    from codegen.tune.task import measure_candidate          # any picklable module-level function

    with LocalExecutor(build_workers=8) as ex:               # one run worker per visible GPU (or 1 on the CPU)
        for i, out in ex.runs(measure_candidate, jobs, timeout=30.0):   # as each job completes
            journal(i, out.value if out.ok else out.error)

`builds(fn, jobs, timeout)` runs `fn(job)` on CPU build workers, `runs(fn, jobs, timeout)` on the run workers:
one long-lived process per device that keeps its state (CUDA context, loaded modules, imports, module-level
caches) from one job to the next. Both yield `(index into jobs, Outcome)` as each job completes, so a caller
can journal each trial at once. `jobs` is a list, or a `Feed` (codegen.tune.feed) that jobs are put into while
the stream runs, each taken by the next free worker. A job that raises, runs past `timeout` (its worker is
killed and restarted) or kills its worker (segfault, `os._exit`) gives an `Outcome(ok=False)`; the remaining
jobs go on.

How a job reaches a worker: `fn` and each job are pickled in the parent (pickle, not cloudpickle: `fn` must be
a module-level function, taken by reference) and sent as bytes; the worker puts the parent's `sys.path` in
front of its own first, then unpickles them, so a module the parent imports from a path it added (the test
suite's `tests/`, a script's folder) imports in the worker too. Unpickling there is what imports fn's module:
a failure to import is that job's `Outcome.error`, not a dead worker. Workers are spawned (not forked), without
importing the parent's main script (`_main_hidden`): a script that tunes needs no `if __name__ == "__main__":`
guard, and `fn` (or a reference function a job carries) lives in an importable module, not in that script.

Timeouts count from the moment a started worker is given the job (a fresh worker first says it is ready, so
its start-up, ~0.4 s of imports, is not charged to the job). Build workers see the parent's GPUs: a build job
that touches CUDA (`default_arch()` without an arch) makes a context there; give builds their arch.

The Ray back end, and the factory `make_executor("local" | "ray", ...)`, are in `codegen.tune.ray_executor`.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any, Protocol

from loopir.errors import ArgumentError, ArgumentTypeError

from .feed import Feed, as_feed

__all__ = ["Outcome", "Executor", "LocalExecutor", "visible_gpus", "core_sets", "run_job", "dump_fn", "stream_args",
           "worker_sys_path", "add_sys_path", "error_text"]


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one job went. `error`: "timeout after 30.0 s", "worker died (exit code -11)", or the exception's
    type, message and the last frames of its traceback; `seconds`: the wall time of `fn(job)` in the worker
    (up to the kill for a timeout or a death); `worker`: the worker that ran it ("cpu-build-3", "gpu-0")."""

    ok: bool
    value: Any = None
    error: str = ""
    seconds: float = 0.0
    worker: str = ""


class Executor(Protocol):
    """The tuner's view of a back end (`LocalExecutor`, `codegen.tune.ray_executor.RayExecutor`)."""

    def builds(self, fn: Callable[[Any], Any], jobs: Sequence[Any] | Feed,
               timeout: float) -> Iterator[tuple[int, Outcome]]:
        ...

    def runs(self, fn: Callable[[Any], Any], jobs: Sequence[Any] | Feed,
             timeout: float) -> Iterator[tuple[int, Outcome]]:
        ...

    @property
    def devices(self) -> int:
        ...

    def close(self) -> None:
        ...


# ----------------------------------------------------------------------------- shared by both back ends


def error_text(exc: BaseException, frames: int = 4) -> str:
    """`Type: message` and the last `frames` frames of the traceback (the job's own frames, not the worker's)."""
    tb = "".join(traceback.format_tb(exc.__traceback__)[-frames:]) if frames > 0 else ""
    return f"{type(exc).__name__}: {exc}\n{tb}".rstrip()


def stream_args(fn: Callable[[Any], Any], timeout: float) -> bytes:
    """The arguments of a builds / runs stream checked in the call (not at the first next() of its iterator):
    ArgumentError for a timeout that is not > 0; `fn` pickled (dump_fn)."""
    if not timeout > 0:
        raise ArgumentError(f"timeout must be > 0 seconds, got {timeout}")
    return dump_fn(fn)


def dump_fn(fn: Callable[[Any], Any]) -> bytes:
    """`fn` pickled once per call of builds/runs; a lambda or a local function fails here, in the caller."""
    if not callable(fn):
        raise ArgumentTypeError(f"fn must be a picklable module-level function, got {type(fn).__name__}")
    try:
        return pickle.dumps(fn)
    except Exception as e:  # noqa: BLE001 - any pickling failure means the same thing to the caller
        raise ArgumentTypeError(f"fn must be a picklable module-level function (pickled by reference), "
                                f"got {fn!r}: {type(e).__name__}: {e}") from e


def worker_sys_path() -> list[str]:
    """The parent's sys.path for a worker, relative entries ('' is the current folder) made absolute: a Ray
    worker does not start in the driver's folder."""
    return [os.path.abspath(p) if p else os.getcwd() for p in sys.path]


def add_sys_path(paths: Sequence[str]) -> None:
    """Put the parent's entries in front of the worker's own (in the parent's order), each once."""
    missing = [p for p in paths if p not in sys.path]
    sys.path[:0] = missing


def run_job(fn_bytes: bytes, job_bytes: bytes) -> tuple[bool, Any, str, float]:
    """In the worker: (ok, value, error, seconds) of `fn(job)`; never raises (a failure is the job's error)."""
    try:
        fn = pickle.loads(fn_bytes)
        job = pickle.loads(job_bytes)
    except BaseException as e:  # noqa: BLE001 - e.g. fn's module does not import here: this job's failure
        return False, None, f"cannot unpickle the job in the worker: {error_text(e)}", 0.0
    t0 = time.perf_counter()
    try:
        value = fn(job)
    except BaseException as e:  # noqa: BLE001 - SystemExit too: a job calling sys.exit is a failed job
        seconds = time.perf_counter() - t0
        if e.__traceback__ is not None:  # from fn's frame on: this function's frame says nothing
            e.__traceback__ = e.__traceback__.tb_next
        return False, None, error_text(e), seconds
    return True, value, "", time.perf_counter() - t0


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES entries, found without initializing CUDA here
    (a forked or later-spawned child must be free to pick its own device): CUDA_VISIBLE_DEVICES when set
    (CUDA ignores the entries from the first invalid one, such as "-1", on), else the `GPU n:` lines of
    `nvidia-smi -L`; none when neither answers."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        out = []
        for x in (s.strip() for s in env.split(",")):
            if not x or x.startswith("-"):
                break
            out.append(x)
        return out
    try:
        r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return []
    if r.returncode:
        return []
    n = sum(1 for line in r.stdout.splitlines() if line.startswith("GPU "))
    return [str(i) for i in range(n)]


def core_sets(n: int) -> list[set[int] | None]:
    """CPU affinity for `n` CPU run workers: None (no pinning) for one; else disjoint slices of this process's
    cores, so concurrent timings do not share a core (with fewer cores than workers they share, one each)."""
    if n <= 1:
        return [None] * n
    cores = sorted(os.sched_getaffinity(0))
    per = len(cores) // n
    if per == 0:
        return [{cores[k % len(cores)]} for k in range(n)]
    return [set(cores[k * per:(k + 1) * per]) for k in range(n)]


# ----------------------------------------------------------------------------- the worker process


def _orphan_watch(parent: int) -> None:
    # the parent killed by SIGKILL runs no cleanup: a worker must not outlive it (nor hold its GPU)
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            os._exit(0)


def _worker_main(conn: Any, env: dict[str, str], cpus: set[int] | None, sys_path: list[str], parent: int) -> None:
    """A worker's life: set up, say "ready", then run jobs (fn bytes, job bytes) until an empty message or EOF."""
    # before anything can initialize CUDA: fn's module is imported when the first job is unpickled, below
    os.environ.update(env)
    os.setpgid(0, 0)  # its own process group: a kill takes the job's subprocesses (a compiler) along
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it closes the workers
    if cpus:
        os.sched_setaffinity(0, cpus)
    add_sys_path(sys_path)
    threading.Thread(target=_orphan_watch, args=(parent,), daemon=True).start()
    conn.send_bytes(b"ready")
    while True:
        try:
            fn_bytes = conn.recv_bytes()
            if not fn_bytes:
                return
            job_bytes = conn.recv_bytes()
        except (EOFError, OSError):
            return
        ok, value, error, seconds = run_job(fn_bytes, job_bytes)
        try:
            reply = pickle.dumps((ok, value, error, seconds))
        except Exception as e:  # noqa: BLE001 - the job ran, its value cannot travel: that job failed
            reply = pickle.dumps((False, None, f"the job's value cannot be pickled: {type(e).__name__}: {e}", seconds))
        conn.send_bytes(reply)


# ----------------------------------------------------------------------------- the parent's side

START_TIMEOUT = 120.0  # seconds a fresh worker may take to say "ready" (a loaded machine, slow imports)
START_FAILURES = 3  # a worker that dies this many times in a row before "ready" fails the remaining jobs


_MAIN_LOCK = threading.Lock()


@contextlib.contextmanager
def _main_hidden() -> Iterator[None]:
    """Start a spawned child without re-running the parent's main script: spawn imports `__main__` (by its file or
    module name) in every child, so a script calling autotune without an `if __name__ == "__main__":` guard
    would start the tuning again in each worker. The workers need nothing from it (jobs are module-level
    functions and pickled data), so the child is told there is no main module to import."""
    main = sys.modules.get("__main__")
    with _MAIN_LOCK:
        saved = {k: getattr(main, k) for k in ("__file__", "__spec__") if main is not None and hasattr(main, k)}
        try:
            for k in saved:
                if k == "__spec__":
                    main.__spec__ = None  # type: ignore[union-attr]
                else:
                    delattr(main, k)
            yield
        finally:
            for k, v in saved.items():
                setattr(main, k, v)


class _Worker:
    """One worker process as the parent sees it: starting (no "ready" yet), idle, or busy with job `job`."""

    def __init__(self, name: str, env: dict[str, str], cpus: set[int] | None) -> None:
        self.name, self.env, self.cpus = name, env, cpus
        self.proc: Any = None
        self.conn: Any = None
        self.ready = False
        self.job: int | None = None
        self.since = 0.0  # when it was started (starting) or given its job (busy)
        self.start_failures = 0
        self.exit_code: int | None = None  # of its last process, once dead

    def start(self) -> None:
        ctx = mp.get_context("spawn")
        parent_end, child_end = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=_worker_main, name=f"loopir-{self.name}", daemon=True,
                                args=(child_end, self.env, self.cpus, worker_sys_path(), os.getpid()))
        with _main_hidden():
            self.proc.start()
        child_end.close()  # the parent's copy: EOF on the parent's end once the child is gone
        self.conn, self.ready, self.job, self.since = parent_end, False, None, time.monotonic()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.is_alive()

    def send(self, fn_bytes: bytes, job_bytes: bytes, index: int) -> None:
        self.conn.send_bytes(fn_bytes)
        self.conn.send_bytes(job_bytes)
        self.job, self.since = index, time.monotonic()

    def kill(self) -> int | None:
        """SIGKILL it (and its process group); returns its exit code."""
        if self.proc is None:
            return None
        if self.proc.is_alive():
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:  # not yet in its own group (killed while starting)
                self.proc.kill()
        self.proc.join(5)
        code = self.exit_code = self.proc.exitcode
        self.conn.close()
        self.proc, self.conn, self.ready, self.job = None, None, False, None
        return code

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.ready and self.job is None:
            try:
                self.conn.send_bytes(b"")
                self.proc.join(2)
            except OSError:
                pass
        self.kill()


class _Pool:
    """Workers of one kind (build or run) and the loop that streams a list of jobs through them."""

    def __init__(self, workers: list[_Worker]) -> None:
        self.workers = workers
        self.busy = False

    def stream(self, fn: Callable[[Any], Any], jobs: Sequence[Any] | Feed,
               timeout: float) -> Iterator[tuple[int, Outcome]]:
        return self._stream(stream_args(fn, timeout), jobs, timeout)

    def _stream(self, fn_bytes: bytes, jobs: Sequence[Any] | Feed, timeout: float) -> Iterator[tuple[int, Outcome]]:
        if self.busy:
            # the results of two streams would mix on the same workers
            raise RuntimeError("these workers are already streaming jobs: finish (or close) the other "
                               "builds()/runs() iterator first")
        self.busy = True
        # a list starts no more workers than it has jobs; a feed may grow, so it gets them all
        use = self.workers if isinstance(jobs, Feed) else self.workers[:len(jobs)]
        try:
            yield from self._loop(use, fn_bytes, as_feed(jobs), timeout)
        finally:
            self.busy = False
            for w in use:
                if w.job is not None:  # abandoned by the caller (break, exception): its result must not leak
                    w.kill()

    @staticmethod
    def _dispatch(use: list[_Worker], fn_bytes: bytes, feed: Feed) -> Iterator[tuple[int, Outcome]]:
        """Give each idle, started worker the feed's next job."""
        for w in use:
            while w.ready and w.job is None and (got := feed.take()) is not None:
                i, job = got
                try:
                    job_bytes = pickle.dumps(job)
                except Exception as e:  # noqa: BLE001 - this job cannot travel; the others can
                    yield i, Outcome(False, error=f"the job cannot be pickled: {error_text(e)}")
                    continue
                try:
                    w.send(fn_bytes, job_bytes, i)
                except OSError:  # it died while idle: the job goes to its successor
                    feed.retry(i, job)
                    w.kill()
                    w.start()

    def _loop(self, use: list[_Worker], fn_bytes: bytes, feed: Feed, timeout: float) -> Iterator[tuple[int, Outcome]]:
        for w in use:
            if not w.alive:
                w.kill()
                w.start()
        while True:
            yield from self._dispatch(use, fn_bytes, feed)
            if feed.done and not any(w.job is not None for w in use):
                return
            now = time.monotonic()
            live = [w for w in use if w.proc is not None and (w.job is not None or not w.ready)]
            if not live:
                if not any(w.proc is not None for w in use):
                    # every worker failed to start: nothing will run the jobs, given or to come
                    codes = ", ".join(map(str, sorted({w.exit_code for w in use}, key=str)))
                    while (got := feed.take()) is not None:
                        yield got[0], Outcome(False, error=f"no worker could start (exit code {codes}; see the "
                                                           "workers' stderr)")
                if not feed.done:
                    feed.wait()  # idle workers, and no job yet
                continue
            due = min(w.since + (timeout if w.ready else START_TIMEOUT) for w in live)
            wait([w.conn for w in live] + [w.proc.sentinel for w in live], timeout=feed.patience(max(0.0, due - now)))
            for w in live:
                yield from self._check(w, timeout)

    def _check(self, w: _Worker, timeout: float) -> Iterator[tuple[int, Outcome]]:
        """After a wait: what `w` said (ready, a result), or how it ended (timeout, death)."""
        now = time.monotonic()
        data: bytes | None = None
        if w.conn.poll():
            try:
                data = w.conn.recv_bytes()
            except (EOFError, OSError):  # it closed the pipe: it is exiting
                data = None
        if data is not None and not w.ready:
            w.ready, w.start_failures = True, 0
            return
        if data is not None:
            i, w.job = w.job, None
            try:
                ok, value, error, seconds = pickle.loads(data)
            except Exception as e:  # noqa: BLE001 - e.g. the value's class does not import in the parent
                ok, value, error, seconds = False, None, f"cannot unpickle the job's value: {error_text(e)}", 0.0
            yield i, Outcome(ok, value, error, seconds, w.name)
            return
        if w.ready and w.job is not None and now - w.since >= timeout and w.proc.is_alive():
            i, ran = w.job, now - w.since
            w.kill()
            w.start()
            yield i, Outcome(False, error=f"timeout after {timeout:.1f} s", seconds=ran, worker=w.name)
            return
        if w.proc.is_alive() and (w.ready or now - w.since < START_TIMEOUT):
            return
        i, started = w.job, w.since
        code = w.kill()
        if i is not None:
            yield i, Outcome(False, error=f"worker died (exit code {code})", seconds=now - started, worker=w.name)
        else:  # died (or hung) before "ready": a broken environment must not restart forever
            w.start_failures += 1
            if w.start_failures >= START_FAILURES:
                return  # left stopped; the loop fails the pending jobs when no worker is left
        w.start()


def _shutdown(pools: list[_Pool]) -> None:
    for pool in pools:
        for w in pool.workers:
            w.stop()


class LocalExecutor:
    """Build and run workers as local processes (spawned, so each one starts clean of the parent's CUDA).

    build_workers: CPU build processes (default os.cpu_count()), started on first use, kept between calls.
    devices: GPU ordinals (among the visible ones) for the run workers, one process each with
    CUDA_VISIBLE_DEVICES naming its GPU; an int n: the first n; None: every visible GPU. With no GPU (or
    devices=0 / []): `cpu_runs` CPU run workers, each pinned to its own slice of the cores when there are
    several. Workers are daemonic processes and exit when the parent dies; a job may not start
    multiprocessing children of its own (subprocesses are fine, and are killed with their worker)."""

    def __init__(self, build_workers: int | None = None, devices: Sequence[int] | int | None = None,
                 cpu_runs: int = 1) -> None:
        nb = (os.cpu_count() or 1) if build_workers is None else build_workers
        if nb < 1 or cpu_runs < 1:
            raise ArgumentError(f"build_workers and cpu_runs must be >= 1, got {build_workers} and {cpu_runs}")
        self._builds = _Pool([_Worker(f"cpu-build-{k}", {}, None) for k in range(nb)])
        self._runs = _Pool(self._run_workers(devices, cpu_runs))
        self._finalizer = weakref.finalize(self, _shutdown, [self._builds, self._runs])

    @staticmethod
    def _run_workers(devices: Sequence[int] | int | None, cpu_runs: int) -> list[_Worker]:
        visible = visible_gpus()
        env_set = "CUDA_VISIBLE_DEVICES" in os.environ
        known = env_set or bool(visible)  # else no nvidia-smi to ask: explicit ordinals are taken on trust
        if devices is None:
            ordinals = list(range(len(visible)))
        elif isinstance(devices, int):
            if devices < 0 or (known and devices > len(visible)):
                raise ArgumentError(f"devices={devices}, but {len(visible)} GPU(s) are visible")
            ordinals = list(range(devices))
        else:
            ordinals = [int(d) for d in devices]
        workers = []
        for d in ordinals:
            if d < 0 or (known and d >= len(visible)):
                raise ArgumentError(f"GPU ordinal {d} is not visible (visible GPUs: {visible})")
            # the child sees one GPU, named as the parent names it (an index, or a UUID) among its visible ones
            workers.append(_Worker(f"gpu-{d}", {"CUDA_VISIBLE_DEVICES": visible[d] if env_set else str(d)}, None))
        if not workers:
            # no GPU: keep the children off CUDA entirely (a stray import must not grab a device)
            workers = [_Worker(f"cpu-run-{k}", {"CUDA_VISIBLE_DEVICES": ""}, cpus)
                       for k, cpus in enumerate(core_sets(cpu_runs))]
        return workers

    def builds(self, fn: Callable[[Any], Any], jobs: Sequence[Any] | Feed,
               timeout: float) -> Iterator[tuple[int, Outcome]]:
        """`fn(job)` for each job (a list, or a Feed) on the build workers; (index, Outcome) as each completes."""
        return self._builds.stream(fn, jobs, timeout)

    def runs(self, fn: Callable[[Any], Any], jobs: Sequence[Any] | Feed,
             timeout: float) -> Iterator[tuple[int, Outcome]]:
        """`fn(job)` for each job (a list, or a Feed) on the run workers (one per device, long-lived); (index,
        Outcome) as each completes."""
        return self._runs.stream(fn, jobs, timeout)

    @property
    def devices(self) -> int:
        """How many run workers (GPUs, or CPU run slots)."""
        return len(self._runs.workers)

    @property
    def build_slots(self) -> int:
        """How many builds run at once."""
        return len(self._builds.workers)

    @property
    def workers(self) -> tuple[str, ...]:
        """The names of the run workers ("gpu-0", ...), in order."""
        return tuple(w.name for w in self._runs.workers)

    def close(self) -> None:
        """Stop every worker (a busy one is killed)."""
        self._finalizer()

    def __enter__(self) -> LocalExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
