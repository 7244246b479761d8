"""Timing that can be trusted: repeat until the median is known to 1 %, with an L2 flush between GPU runs.

    from codegen.tune.measure import TimingPolicy, cpu_timer, cuda_timer, time_until_stable

    policy = TimingPolicy(rel_ci=0.01, max_seconds=2.0)
    samples = time_until_stable(cpu_timer(lambda: mod(x, y)), policy)      # seconds of each timed run
    with cuda_timer(cuda_mod, (x, y), policy) as run_once:                  # inputs uploaded once
        samples = time_until_stable(run_once, policy)
        run_once.finish()                                                   # y copied back: check it now

The statistic is the median, with its distribution-free 95 % confidence interval (order statistics: the
interval [x_(j), x_(n+1-j)] covers the median with a binomial probability that does not depend on the
distribution of the timings). The median and not the mean with a Student t interval because run times are
skewed with rare large outliers (an interrupt, a clock change, another process): one outlier moves the mean
and widens its interval, not the median's. Sampling stops once both ends of the interval lie within
`rel_ci` of the median, after at least `min_repeat` samples; or at `max_repeat` samples; or once
`max_seconds` have passed (warm-up included) even below `min_repeat` (but never with no sample): a candidate
whose few runs take the whole budget is far from the best one, and its time ranks it well enough.

GPU runs are timed between CUDA events on the call's stream, and the stream is held (`cuStreamWaitValue32`
on a host-mapped flag) until the host has queued the flush, the events and every launch: the events then
time the GPU's work alone, not the Python launch path (~10-20 us a launch, which an event recorded on an
idle stream would count, and which would swamp a small kernel). A sequence of more than GATE_MAX_LAUNCHES
launches (a long host loop) is not held: a held stream queues only so many launches before the host blocks.

Nothing here knows the tuner: `time_until_stable` takes any `run_once() -> seconds`.
"""

from __future__ import annotations

import ctypes
import itertools
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import cache
from typing import Any

from loopir.errors import ArgumentError, ArgumentTypeError

from ..cuda.runtime import CudaError, CudaModule, _driver, check

__all__ = ["TimingPolicy", "time_until_stable", "median_ci", "is_stable", "cpu_timer", "cuda_timer", "CudaTimer"]


@dataclass(frozen=True, slots=True)
class TimingPolicy:
    """How long to measure: at least `min_repeat` and at most `max_repeat` timed runs after `warmup` untimed
    ones, until the median's 95 % interval is within `rel_ci` of it or `max_seconds` have passed;
    `flush_l2`: flush the GPU's L2 cache before each run (outside the timed events), so each run reads its
    inputs from memory as the first call in a real program would."""

    min_repeat: int = 5
    max_repeat: int = 100
    rel_ci: float = 0.01
    max_seconds: float = 2.0
    warmup: int = 2
    flush_l2: bool = True

    def __post_init__(self) -> None:
        if not 1 <= self.min_repeat <= self.max_repeat:
            raise ArgumentError(f"need 1 <= min_repeat <= max_repeat, got {self.min_repeat} and {self.max_repeat}")
        if self.rel_ci < 0 or self.max_seconds <= 0 or self.warmup < 0:
            raise ArgumentError(f"need rel_ci >= 0, max_seconds > 0, warmup >= 0, got {self.rel_ci}, "
                                f"{self.max_seconds}, {self.warmup}")


# ----------------------------------------------------------------------------- statistics


@cache
def _lower_rank(n: int, confidence: float) -> int:
    """The 0-based index j of the interval [x_j, x_(n-1-j)] of n sorted samples that covers the median with
    probability >= confidence: the largest j with 2 P(Binomial(n, 1/2) <= j) <= 1 - confidence. Below 6
    samples no such j exists at 95 %; the range (j = 0) is used, which covers it with 1 - 2^(1-n) (94 % at 5)."""
    alpha = Fraction(1 - confidence).limit_denominator(10**6)  # exact integers: 2^n overflows a float at n > 1023
    best, tail = 0, 0
    for j in range(n // 2):
        tail += math.comb(n, j)  # 2^n P(X <= j)
        if 2 * tail * alpha.denominator > alpha.numerator * 2**n:
            break
        best = j
    return best


def median_ci(samples: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """(median, lower, upper): the median and its distribution-free confidence interval."""
    if not samples:
        raise ArgumentError("median_ci of no samples")
    xs = sorted(samples)
    j = _lower_rank(len(xs), confidence)
    return float(statistics.median(xs)), float(xs[j]), float(xs[len(xs) - 1 - j])


def is_stable(samples: Sequence[float], rel_ci: float) -> bool:
    """Both ends of the median's 95 % interval within rel_ci of the median."""
    med, lo, hi = median_ci(samples)
    return max(hi - med, med - lo) <= rel_ci * abs(med)


def time_until_stable(run_once: Callable[[], float], policy: TimingPolicy | None = None) -> tuple[float, ...]:
    """Call `run_once()` (seconds of one timed run) `policy.warmup` times, then until the median is stable
    (module docstring); returns the timed samples, in the order taken."""
    policy = policy or TimingPolicy()
    start = time.perf_counter()
    for _ in range(policy.warmup):
        run_once()
        if time.perf_counter() - start >= policy.max_seconds:
            break
    samples: list[float] = []
    while len(samples) < policy.max_repeat:
        samples.append(float(run_once()))
        if len(samples) >= policy.min_repeat and is_stable(samples, policy.rel_ci):
            break
        if time.perf_counter() - start >= policy.max_seconds:
            break
    return tuple(samples)


def cpu_timer(fn: Callable[[], Any]) -> Callable[[], float]:
    """`run_once` for a host call: the wall clock (perf_counter) around one `fn()`."""

    def run_once() -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    return run_once


# ----------------------------------------------------------------------------- CUDA


_L2_SCRATCH: dict[int, tuple[Any, int]] = {}  # device ordinal -> (scratch, bytes): one per process, never freed
_GATES: dict[int, tuple[int, Any] | None] = {}  # device ordinal -> host-mapped flag (host address, device pointer)
_TICKETS = itertools.count(1)  # the flag only grows (cyclically, as the wait compares), across all timers
GATE_MAX_LAUNCHES = 256


def _l2_scratch(dev: Any) -> tuple[Any, int]:
    """A device buffer of twice the L2 size: setting it evicts whatever the previous run left in L2."""
    if dev.ordinal not in _L2_SCRATCH:
        cu = _driver()
        l2 = int(check(cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE,
                                               dev.handle), "cuDeviceGetAttribute"))
        nbytes = max(2 * l2, 1 << 20)
        _L2_SCRATCH[dev.ordinal] = (check(cu.cuMemAlloc(nbytes), "cuMemAlloc"), nbytes)
    return _L2_SCRATCH[dev.ordinal]


def _gate(dev: Any) -> tuple[int, Any] | None:
    """The flag a held stream waits on (4 bytes of pinned host memory the GPU reads), or None where stream
    memory operations are refused (the timer then runs unheld)."""
    if dev.ordinal not in _GATES:
        cu = _driver()
        try:
            host = int(check(cu.cuMemHostAlloc(4, cu.CU_MEMHOSTALLOC_PORTABLE | cu.CU_MEMHOSTALLOC_DEVICEMAP),
                             "cuMemHostAlloc"))
            ctypes.c_uint32.from_address(host).value = 0
            _GATES[dev.ordinal] = (host, check(cu.cuMemHostGetDevicePointer(host, 0), "cuMemHostGetDevicePointer"))
        except CudaError:
            _GATES[dev.ordinal] = None
    return _GATES[dev.ordinal]


class CudaTimer:
    """`run_once` for a loopir CUDA module (see `cuda_timer`): each call optionally flushes L2, then times one
    launch sequence between CUDA events on the call's (held) stream, in seconds. `finish()` copies the written
    numpy arguments back (after timing, to check the numbers); `close()` frees the events. Every run computes
    the same outputs, except for a program that updates its arguments in place, whose data every run
    changes. `launches`: the launches of one run; `held`: whether runs are held (module docstring)."""

    def __init__(self, module: CudaModule, arrays: Sequence[Any], policy: TimingPolicy | None = None) -> None:
        policy = policy or TimingPolicy()
        if not isinstance(module, CudaModule):
            raise ArgumentTypeError(f"cuda_timer needs a CUDA module, got {type(module).__name__}")
        arrays, known = module.split_call(tuple(arrays))
        mod: Any = module
        bound = mod._bind(arrays, None, known)
        chosen = mod._select(bound[1])
        while chosen is not mod:  # a specializing module: time the variant this call dispatches to (as _benchmark)
            if not isinstance(chosen, CudaModule):
                raise ArgumentTypeError(f"the variant for this call is a {type(chosen).__name__}, not a CUDA module")
            mod = chosen
            bound = mod._bind(arrays, None, known)
            chosen = mod._select(bound[1])
        self.module: CudaModule = mod
        self._p = p = mod.prepare(arrays, bound)  # uploads the numpy arguments, once
        self._cu = cu = _driver()
        self._flush = _l2_scratch(p.dev) if policy.flush_l2 else None
        self._events = [check(cu.cuEventCreate(0), "cuEventCreate") for _ in range(2)]
        p.record = []  # one untimed run, to count its launches (and warm up)
        mod.launch(p)
        self.launches = len(p.record)
        p.record = None
        check(cu.cuStreamSynchronize(p.stream), "cuStreamSynchronize")
        self._gate = _gate(p.dev) if self.launches <= GATE_MAX_LAUNCHES else None
        self.held = self._gate is not None

    def __call__(self) -> float:
        cu, p = self._cu, self._p
        start, end = self._events
        ticket = None
        if self._gate is not None:
            ticket = next(_TICKETS) & 0xFFFFFFFF
            check(cu.cuStreamWaitValue32(p.stream, self._gate[1], ticket,
                                         cu.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ), "cuStreamWaitValue32")
        try:
            if self._flush is not None:  # on the same stream, before the start event: not timed, finished first
                check(cu.cuMemsetD8Async(self._flush[0], 0, self._flush[1], p.stream), "cuMemsetD8Async")
            check(cu.cuEventRecord(start, p.stream), "cuEventRecord")
            self.module.launch(p)
            check(cu.cuEventRecord(end, p.stream), "cuEventRecord")
        finally:
            if ticket is not None:  # release the stream, also after a failed launch (it would wait forever)
                ctypes.c_uint32.from_address(self._gate[0]).value = ticket
        check(cu.cuEventSynchronize(end), "cuEventSynchronize")
        return float(check(cu.cuEventElapsedTime(start, end), "cuEventElapsedTime")) / 1e3

    def finish(self) -> None:
        """Copy the written numpy arguments back (device arrays were written in place)."""
        self.module.finish(self._p)

    def close(self) -> None:
        for ev in self._events:
            self._cu.cuEventDestroy(ev)
        self._events = []

    def __enter__(self) -> CudaTimer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def cuda_timer(module: CudaModule, arrays: Sequence[Any], policy: TimingPolicy | None = None) -> CudaTimer:
    """`run_once` for `module` called with `arrays` (the call's arguments, size arguments included): the
    arguments are checked, the variant chosen and numpy inputs uploaded once, here; each call then times
    one run (L2 flushed first when `policy.flush_l2`). Call `.finish()` to copy the results back."""
    return CudaTimer(module, arrays, policy)
