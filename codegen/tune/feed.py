"""`Feed`: the jobs of a builds() / runs() stream, handed to it while it runs.

    feed = Feed(refill=propose)        # propose(feed) may put() jobs, or close() it, when the stream finds it empty
    for i, out in ex.builds(build_candidate, feed, timeout=60.0):
        if out.ok:
            runs_feed.put(job_of[i])       # a built candidate goes to the run workers at once
    runs_feed.close()                  # the runs stream ends when what was put is done

A stream given a list stops when the list is done; one given a Feed stops when the feed is closed and every job
put into it is done. Between, a free worker takes the next job as soon as there is one: no batch waits for its
slowest job (with rounds, a tuner's build workers idled for ~80 % of a GEMM tuning run waiting for the round's
slowest build). `refill` runs in the stream's thread when a worker is free and the feed is empty, so a search
proposes candidates when there is room for them, with every result observed by then.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

__all__ = ["Feed", "as_feed", "POLL"]

POLL = 0.005  # seconds a stream waits for its feed before it looks at its workers again


class Feed:
    """A queue of jobs, indexed in the order they are put (0, 1, ...), that a stream takes one at a time."""

    def __init__(self, jobs: Iterable[Any] = (), *, refill: Callable[[Feed], None] | None = None,
                 closed: bool = False) -> None:
        self._lock = threading.Lock()
        self._arrived = threading.Event()
        self._queue: deque[tuple[int, Any]] = deque(enumerate(jobs))
        self._count = len(self._queue)
        self._closed = closed
        self._refill = refill

    def put(self, job: Any) -> int:
        """Append a job (from any thread); its index in this feed."""
        with self._lock:
            if self._closed:
                raise RuntimeError("put() on a closed Feed")
            i = self._count
            self._count += 1
            self._queue.append((i, job))
        self._arrived.set()
        return i

    def close(self, drop: bool = False) -> None:
        """No more jobs will be put; `drop`: nor will those not yet taken run (the stream ends with its running
        jobs)."""
        with self._lock:
            self._closed = True
            if drop:
                self._queue.clear()
        self._arrived.set()

    def take(self) -> tuple[int, Any] | None:
        """The next (index, job), or None when there is none now (the stream looks again later)."""
        with self._lock:
            if self._queue:
                return self._queue.popleft()
            if self._closed or self._refill is None:
                return None
        self._refill(self)
        with self._lock:
            return self._queue.popleft() if self._queue else None

    def retry(self, i: int, job: Any) -> None:
        """Give back a job taken but not started (its worker died before it could be sent): taken next."""
        with self._lock:
            self._queue.appendleft((i, job))
        self._arrived.set()

    @property
    def pending(self) -> int:
        """Jobs put and not yet taken."""
        with self._lock:
            return len(self._queue)

    @property
    def done(self) -> bool:
        """Closed, and every job taken."""
        with self._lock:
            return self._closed and not self._queue

    def patience(self, seconds: float) -> float:
        """How long a stream may wait for its workers: `seconds`, at most POLL while jobs may still be put (one put
        meanwhile must not wait for a worker's news)."""
        return seconds if self.done else min(seconds, POLL)

    def wait(self, timeout: float = POLL) -> None:
        """Until a job is put or the feed is closed, at most `timeout` seconds."""
        self._arrived.wait(timeout)
        self._arrived.clear()


def as_feed(jobs: Sequence[Any] | Feed) -> Feed:
    """A stream's jobs as a Feed: a list becomes a closed feed of its elements."""
    return jobs if isinstance(jobs, Feed) else Feed(jobs, closed=True)
