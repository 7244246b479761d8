"""The persistent thread pool of the CPU runtime (codegen/llvm/runtime.py: `_Pool`, `_Job`): every chunk runs
exactly once, results equal the serial run bit for bit, several Python threads may call at once, an error in a
chunk reaches the caller, and a forked child runs parallel loops on pools of its own. Its per-call cost is
measured in benchmarks/parallel_overhead.py (no timing here)."""

from __future__ import annotations

import os
import sys
import threading

import numpy as np
import pytest

from codegen import build
from codegen.llvm import runtime as llrt
from loopir import te
from schedules import Schedule


def _module(threads: int):
    # correctly rounded operations only: a libm function (sin) may be computed by libmvec's vector variant in the
    # vectorized body and by libm in the remainder, which differ in the last bit on AVX-512 hosts, so a chunk
    # boundary would move an element between them; that is the vectorizer's property, not the pool's
    m = te.var("m")
    x = te.placeholder((m, 16), name="x")
    y = te.compute((m, 16), lambda i, j: te.sqrt(te.abs(x[i, j])) * 3.0 + x[i, j] * x[i, j], name="y")
    s = Schedule(y)
    s.parallel(s.loops("y")[0])
    return build(s, [x, y], threads=threads)


def _data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    return (np.random.default_rng(seed).standard_normal((n, 16)).astype(np.float32),
            np.full((n, 16), np.nan, np.float32))


@pytest.mark.parametrize("threads", [2, 3, 8])
def test_parallel_results_equal_the_serial_run_bit_for_bit(threads):
    serial, par = _module(1), _module(threads)
    for n in (1, 2, 7, 64, 1001):
        x, want = _data(n, n)
        serial(x, want)
        for _ in range(3):
            got = np.full_like(want, np.nan)
            par(x, got)
            np.testing.assert_array_equal(got, want)


def test_every_chunk_runs_exactly_once():
    for k in (1, 2, 5, 64):
        hits = [0] * k
        lock = threading.Lock()

        def chunk(lo: int, hi: int, hits=hits, lock=lock) -> int:
            with lock:
                for j in range(lo, hi):
                    hits[j] += 1
            return 0

        job = llrt._Job(chunk, list(range(k + 1)))
        llrt._pool(4).run(job)
        assert hits == [1] * k and job.done.is_set()


def test_an_error_in_a_chunk_reaches_the_caller_and_the_pool_survives():
    def chunk(lo: int, hi: int) -> int:
        if lo == 3:
            raise ZeroDivisionError("chunk 3")
        return 0

    with pytest.raises(ZeroDivisionError, match="chunk 3"):
        llrt._pool(2).run(llrt._Job(chunk, list(range(9))))
    mod = _module(2)
    x, out = _data(33, 1)
    mod(x, out)
    ref = np.full_like(out, np.nan)
    _module(1)(x, ref)
    np.testing.assert_array_equal(out, ref)


def test_concurrent_callers_from_several_python_threads():
    mod, serial = _module(2), _module(1)
    errors: list[BaseException] = []

    def caller(seed: int) -> None:
        try:
            for r in range(20):
                x, got = _data(50 + seed * 7 + r, seed * 100 + r)
                want = np.full_like(got, np.nan)
                mod(x, got)
                serial(x, want)
                np.testing.assert_array_equal(got, want)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    ts = [threading.Thread(target=caller, args=(k,)) for k in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors


@pytest.mark.skipif(not hasattr(os, "fork") or sys.platform != "linux", reason="fork is Linux-only here")
def test_a_forked_child_runs_parallel_loops():
    mod = _module(2)
    x, out = _data(40, 2)
    mod(x, out)  # the parent's pool exists and its worker is parked
    want = out.copy()
    pid = os.fork()
    if pid == 0:  # the child: its pools start empty, a new one is made on first use
        code = 1
        try:
            got = np.full_like(want, np.nan)
            mod(x, got)
            code = 0 if np.array_equal(got, want) and len(llrt._pools) == 1 else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
