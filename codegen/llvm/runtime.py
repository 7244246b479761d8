"""The CPU runtime: JIT-compile generated LLVM IR with llvmlite and call it through ctypes.

A `CpuKernel` is the compiled form of one program (shared by every Module built from a
structurally equal program): it keeps the execution engine alive (the function pointers die
with it) and runs the segments in order; a parallel segment's `[lo, hi)` is cut into
contiguous chunks (CHUNKS_PER_THREAD per thread), taken in order by the calling thread and the
workers of a persistent thread pool as each becomes free (ctypes drops the GIL during the call).

The pool (`_Pool`, one per thread count) keeps its workers parked on a condition variable between
calls: a call posts its job (a generation number), wakes them and runs chunks itself; chunks are handed
out by an atomic counter, and the call returns as soon as every chunk has finished, without waiting
for a worker that woke too late to find one (a small loop costs the caller one wake-up, not a round
trip through futures). The same chunks run whichever thread takes them, so results do not depend on
the pool. After `fork` the child starts with no pools (its copies of the parent's workers do not exist).

Object cache: the O3-optimised machine code of a source is kept on disk (`codegen.diskcache`, entries
`<key>.llo`, the key hashing the LLVM IR text, llvmlite's version, the process triple, the host CPU and
its features). A new process that JITs a source it met before loads the object file into an MCJIT
engine (`add_object_file`) instead of parsing, optimising and generating code again. `CpuKernel(gen,
obj)` takes the object code directly (the whole-build cache stores it with the build).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import itertools
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from loopir.target import cpu_count

from .. import diskcache as disk
from .emit import Generated, host_features, libmvec
from .math import load_extern_libraries

OBJ_MAGIC = b"LOOPIRLLOBJ1"

_lock = threading.Lock()
# A parallel loop is cut into this many contiguous chunks per thread, taken by whichever thread is
# free: a thread slowed by another process on its core then does less of the work.
CHUNKS_PER_THREAD = 4


def default_threads() -> int:
    return cpu_count()


class _Job:
    """The chunks of one parallel segment: `k` calls of `fn(lo_j, hi_j)`, each run by whichever thread takes it."""

    __slots__ = ("fn", "cuts", "k", "take", "finished", "rcs", "error", "done")

    def __init__(self, fn: Callable[[int, int], int], cuts: list[int]) -> None:
        self.fn, self.cuts, self.k = fn, cuts, len(cuts) - 1
        self.take = itertools.count()  # next() on a C counter is atomic under the GIL: no lock per chunk
        self.finished = itertools.count(1)
        self.rcs = [0] * self.k
        self.error: BaseException | None = None
        self.done = threading.Event()

    def work(self) -> None:
        while (j := next(self.take)) < self.k:
            try:
                self.rcs[j] = self.fn(self.cuts[j], self.cuts[j + 1])
            except BaseException as e:  # noqa: BLE001 - handed to the caller; the chunk still counts as done
                self.error = e
            if next(self.finished) == self.k:
                self.done.set()


class _Pool:
    """`workers` persistent daemon threads that help the calling thread run a `_Job` (one job at a time)."""

    def __init__(self, workers: int) -> None:
        self._run_lock = threading.Lock()  # callers from several Python threads take turns
        self._cv = threading.Condition(threading.Lock())
        self._gen = 0
        self._job: _Job | None = None
        for _ in range(workers):
            threading.Thread(target=self._loop, name="loopir-cpu", daemon=True).start()

    def _loop(self) -> None:
        seen = 0
        while True:
            with self._cv:
                while self._gen == seen:
                    self._cv.wait()
                seen, job = self._gen, self._job
            if job is not None:
                job.work()  # a job already finished by others hands out no chunk: the thread parks again

    def run(self, job: _Job) -> None:
        with self._run_lock:
            with self._cv:
                self._job = job
                self._gen += 1
                self._cv.notify_all()
            job.work()
            job.done.wait()
            self._job = None
        if job.error is not None:
            raise job.error


_pools: dict[int, _Pool] = {}


def _pool(n: int) -> _Pool:
    """The pool that runs a job on `n` threads: the caller and n - 1 workers."""
    with _lock:
        if n not in _pools:
            _pools[n] = _Pool(n - 1)
        return _pools[n]


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # a parent thread may have held it at the fork
    _pools.clear()  # the workers were not copied into the child


os.register_at_fork(after_in_child=_after_fork_in_child)


@cache
def _llvm() -> Any:
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    host_features()
    libmvec()  # load before any module that names a libmvec symbol is finalised
    return llvm


@cache
def _host_cpu() -> tuple[str, str, str]:
    """(triple, CPU name, features) of this host: asking LLVM for the features costs ~15 ms, once is enough."""
    llvm = _llvm()
    return llvm.get_process_triple(), llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()


def target_machine() -> Any:
    """A fresh target machine for this host's CPU and features (an engine takes ownership of it)."""
    llvm = _llvm()
    triple, cpu, features = _host_cpu()
    return llvm.Target.from_triple(triple).create_target_machine(cpu=cpu, features=features, opt=3, jit=True)


def _optimised(source: str, tm: Any) -> Any:
    """The parsed module of `source`, verified and optimised at O3 (new pass manager)."""
    llvm = _llvm()
    mod = llvm.parse_assembly(source)
    mod.triple = tm.triple
    mod.data_layout = str(tm.target_data)
    mod.verify()
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pto.loop_unrolling = True
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    return mod


@cache
def host_id() -> str:
    import llvmlite

    return "\0".join((llvmlite.__version__, *_host_cpu()))


def object_key(source: str) -> str:
    """The object cache's key of an LLVM IR text on this host."""
    h = hashlib.sha256(OBJ_MAGIC + b"\0" + host_id().encode() + b"\0")
    h.update(source.encode())
    return h.hexdigest()


def jit(source: str, obj: bytes | None = None, use_cache: bool = True) -> tuple[Any, Any, bytes | None]:
    """(engine, optimised module or None, object code) for LLVM IR text: from the object code `obj` when
    given, else from the disk object cache, else parsed, optimised at O3 and compiled (and cached)."""
    llvm = _llvm()
    load_extern_libraries(source)  # the libraries of external functions (loopir.te_extern), before linking
    tm = target_machine()
    entry = object_key(source) + ".llo" if use_cache else None
    if obj is None and entry is not None:
        obj = disk.read(entry, OBJ_MAGIC)
    if obj is not None:
        engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), tm)
        engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
        engine.finalize_object()
        return engine, None, obj
    mod = _optimised(source, tm)
    captured: list[bytes] = []
    engine = llvm.create_mcjit_compiler(mod, tm)
    # MCJIT hands the object code it generates to the cache callback: no second code generation
    engine.set_object_cache(notify_func=lambda _m, data: captured.append(bytes(data)))
    engine.finalize_object()
    obj = captured[0] if captured else None
    if obj is not None and entry is not None:
        disk.write(entry, obj, OBJ_MAGIC)
    return engine, mod, obj


@dataclass
class _Seg:
    name: str
    fn: Any
    bounds: Any


class CpuKernel:
    """Compiled native code of one program; `run(pointers, sizes, threads)`."""

    def __init__(self, gen: Generated, obj: bytes | None = None, use_cache: bool = True) -> None:
        self.gen = gen
        self.engine, self._llmod, self.object_code = jit(gen.source, obj, use_cache)
        nb, ns = len(gen.buffers), len(gen.sizes)
        proto = ctypes.CFUNCTYPE(ctypes.c_int32, *([ctypes.c_void_p] * nb), *([ctypes.c_int64] * (ns + 2)))
        bproto = ctypes.CFUNCTYPE(ctypes.c_int32, *([ctypes.c_int64] * ns), ctypes.c_void_p)
        self.segments: list[_Seg] = []
        for s in gen.segments:
            fn = proto(self.engine.get_function_address(s.fn))
            b = bproto(self.engine.get_function_address(s.bounds_fn)) if s.bounds_fn else None
            self.segments.append(_Seg(s.fn, fn, b))
        self.has_parallel = any(s.bounds is not None for s in self.segments)

    @property
    def kernels(self) -> list[str]:
        return [s.name for s in self.segments]

    def optimized_ir(self) -> str:
        if self._llmod is None:  # loaded from object code: optimise the source again to show it
            self._llmod = _optimised(self.gen.source, target_machine())
        return str(self._llmod)

    def run(self, ptrs: list[int], sizes: list[int], threads: int) -> None:
        for seg in self.segments:
            if seg.bounds is None or threads <= 1:
                if seg.bounds is not None:
                    out1 = (ctypes.c_int64 * 2)()  # per call: a kernel may run on several threads at once
                    seg.bounds(*sizes, out1)
                    lo, hi = out1[0], out1[1]
                else:
                    lo = hi = 0
                self._check(seg, seg.fn(*ptrs, *sizes, lo, hi))
                continue
            out = (ctypes.c_int64 * 2)()
            seg.bounds(*sizes, out)
            lo, hi = out[0], out[1]
            n = hi - lo
            if n <= 0:
                continue
            k = min(threads * CHUNKS_PER_THREAD, n)
            cuts = [lo + (n * j) // k for j in range(k + 1)]
            job = _Job(functools.partial(seg.fn, *ptrs, *sizes), cuts)
            if k == 1:
                job.work()
            else:
                _pool(min(threads, k)).run(job)
            for r in job.rcs:
                self._check(seg, r)

    @staticmethod
    def _check(seg: _Seg, rc: int) -> None:
        if rc != 0:
            raise MemoryError(f"native function {seg.name!r} could not allocate its scratch memory")
