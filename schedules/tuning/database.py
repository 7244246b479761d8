"""The autotuner's trial database: an append-only journal of every trial, shared by the processes of one host.

    db = Database(default_path())                    # a directory: journal.jsonl, index.json, lock
    db.append(trial)                                 # on disk (fsync) before it returns
    db.best(wk, tk, "512x1024")                      # the fastest ok trial of that shape, or None
    done = db.measured(wk, tk, "512x1024")           # config key -> trial: what a resumed run need not measure
    db.nearest(wk, tk, "500x1000")                   # the best trial of the closest tuned shape

`journal.jsonl` (one `Trial.to_json()` a line) is the truth; `index.json` (the best trial per workload, target
and shape, for tools that only want the answer) is a cache, rewritten from the journal whenever it is missing,
corrupt or stale. Writers take an exclusive `fcntl.flock` on `lock` and readers a shared one, so parallel tuners
never interleave lines; every query first reads what other processes appended since the last one (`refresh`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import tempfile
import threading
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

from loopir.errors import ArgumentError, ArgumentTypeError, LoopirError

from .record import Trial

__all__ = ["Database", "DatabaseWriteError", "JournalWarning", "default_path", "parse_shape", "shape_distance"]

JOURNAL, INDEX, LOCK = "journal.jsonl", "index.json", "lock"
INDEX_VERSION = 1

Key = tuple[str, str, str]  # (workload, target, shape)

# what a line that is not a trial raises in Trial.from_json (bad JSON or UTF-8, a missing field, a bad status...)
_MALFORMED = (ValueError, TypeError, KeyError, AttributeError)


class DatabaseWriteError(LoopirError, OSError):
    """The database's directory cannot be written (read-only, missing parent, not a directory, disk full)."""


class JournalWarning(UserWarning):
    """A journal line was skipped: torn by a crash mid-write, or not a trial."""


def default_path() -> str:
    """`$LOOPIR_TUNING_DB`, else ~/.cache/loopir/tuning (neither is created here)."""
    return os.environ.get("LOOPIR_TUNING_DB") or os.path.join(os.path.expanduser("~"), ".cache", "loopir", "tuning")


def parse_shape(shape: str) -> tuple[int, ...] | None:
    """The dimensions of a shape bucket ("512x1024" -> (512, 1024)); None unless all are positive integers."""
    try:
        dims = tuple(int(d) for d in shape.split("x"))
    except ValueError:
        return None
    return dims if all(d > 0 for d in dims) else None


def shape_distance(a: tuple[int, ...], b: tuple[int, ...]) -> float:
    """Sum over the dimensions of |log2(a/b)|: a ratio, so 256 is as far from 512 as 1024 is."""
    if len(a) != len(b):
        raise ArgumentError(f"shapes {a} and {b} differ in rank")
    # rounded so that equal ratios tie exactly whatever the float error of log2
    return round(sum(abs(math.log2(x / y)) for x, y in zip(a, b)), 9)


def _parse(raw: bytes) -> Trial:
    t = Trial.from_json(raw.decode())
    if not all(isinstance(s, str) for s in (t.workload, t.target, t.shape, t.run)):
        raise ArgumentTypeError("workload, target, shape and run must be strings")
    if not isinstance(t.trial, int) or not all(isinstance(x, int | float) and not isinstance(x, bool) for x in t.times):
        raise ArgumentTypeError("trial must be an int and times numbers")
    return t


def _parse_lines(lines: Iterable[bytes], first: int) -> tuple[list[Trial], list[tuple[int, str]]]:
    """The trials among `lines` (numbered from `first`) and the malformed ones as (line number, reason)."""
    trials: list[Trial] = []
    bad: list[tuple[int, str]] = []
    for n, raw in enumerate(lines, first):
        if not raw.strip():  # e.g. a hand edit; a torn line is ended by the next writer, never left blank
            continue
        try:
            trials.append(_parse(raw))
        except _MALFORMED as e:
            bad.append((n, f"{type(e).__name__}: {e}"[:200]))
    return trials, bad


def _ident(t: Trial) -> tuple[str, ...]:
    """What makes two journal lines the same trial, for import: a tuning run numbers its trials."""
    return (t.workload, t.target, t.shape, t.key(), t.run, str(t.trial))


def _atomic_write(path: str, data: bytes) -> None:
    """Replace `path` by `data` so that a reader sees the old file or the new one, never a part."""
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o644)  # mkstemp's 0600 would hide it from the rest of a team sharing the directory
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _fsync_dir(path: str) -> None:
    with contextlib.suppress(OSError):  # some filesystems refuse to fsync a directory: nothing more to do there
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class Database:
    """The trials of every tuning run kept in the directory `path` (created if missing; a location that cannot
    be written may still be queried, and `append` then raises `DatabaseWriteError`).

    Queries see the lines every process appended up to the moment they run. `skipped` counts the journal lines
    that were not trials (a torn last line among them, while it lasts), each reported by a `JournalWarning`."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.path.abspath(os.path.expanduser(os.fspath(path)))
        self.journal = os.path.join(self.path, JOURNAL)
        self.index_path = os.path.join(self.path, INDEX)
        self._mutex = threading.RLock()  # threads sharing one Database; processes are kept apart by the flock
        self._reset()
        with contextlib.suppress(OSError):  # reported by append, the first thing that needs it
            os.makedirs(self.path, exist_ok=True)
        self.refresh()
        self._repair_index()

    def _reset(self) -> None:
        self._trials: list[Trial] = []
        self._groups: dict[Key, list[Trial]] = {}
        self._best: dict[Key, Trial] = {}
        self._seen: set[tuple[str, ...]] = set()
        self._offset = 0  # bytes of the journal read: always the start of a line
        self._lines = 0
        self._file: tuple[int, int] | None = None  # (device, inode) of the journal read
        self._bad = 0
        self._torn_at: int | None = None  # offset of an unterminated last line (already warned about)

    @property
    def skipped(self) -> int:
        return self._bad + (self._torn_at is not None)

    # ------------------------------------------------------------------------- reading

    @contextlib.contextmanager
    def _locked(self, exclusive: bool) -> Iterator[None]:
        lock = os.path.join(self.path, LOCK)
        try:
            fd: int | None = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as e:
            if exclusive:
                raise self._write_error(e) from e
            try:
                fd = os.open(lock, os.O_RDONLY)
            except OSError:
                fd = None  # never written from here, and cannot be: no writer to wait for
        if fd is None:
            yield
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)  # releases the lock

    def refresh(self) -> int:
        """Read the lines appended since the last read, by this process or another; returns the trials added."""
        with self._mutex, self._locked(exclusive=False):
            return self._refresh_locked()

    def _refresh_locked(self) -> int:
        try:
            f = open(self.journal, "rb")
        except (FileNotFoundError, NotADirectoryError):
            if self._file is not None:  # deleted by hand: what is left is an empty database
                self._reset()
            return 0
        with f:
            st = os.fstat(f.fileno())
            if (st.st_dev, st.st_ino) != self._file or st.st_size < self._offset:
                if self._file is not None:  # replaced or truncated by hand: read it again from the start
                    self._reset()
                self._file = (st.st_dev, st.st_ino)
            if st.st_size == self._offset:
                return 0
            f.seek(self._offset)
            data = f.read()
        # only whole lines: the rest was torn by a crash (under the lock no write is in flight); it is re-read
        # until the next writer ends it with a newline, so every reader agrees on where lines start
        end = data.rfind(b"\n") + 1
        lines = data[:end].split(b"\n")[:-1]
        trials, bad = _parse_lines(lines, self._lines + 1)
        for t in trials:
            self._add(t)
        self._bad += len(bad)
        if self._torn_at == self._offset and bad and bad[0][0] == self._lines + 1:
            bad = bad[1:]  # the torn line, now ended by a writer: counted still, but reported already
        self._offset += end
        self._lines += len(lines)
        if bad:
            n, why = bad[0]
            warnings.warn(f"{self.journal}: skipped {len(bad)} malformed line(s), the first at line {n} ({why})",
                          JournalWarning, stacklevel=3)
        torn = self._offset if end < len(data) else None
        if torn is not None and torn != self._torn_at:
            warnings.warn(f"{self.journal}: skipped a torn last line at byte {torn} (a write cut short by a crash)",
                          JournalWarning, stacklevel=3)
        self._torn_at = torn
        return len(trials)

    def _add(self, t: Trial) -> None:
        k = (t.workload, t.target, t.shape)
        self._trials.append(t)
        self._groups.setdefault(k, []).append(t)
        self._seen.add(_ident(t))
        best = self._best.get(k)
        if t.ok and math.isfinite(t.median) and (best is None or t.median < best.median):  # ties: the first
            self._best[k] = t

    # ------------------------------------------------------------------------- writing

    def _write_error(self, e: OSError) -> DatabaseWriteError:
        msg = f"cannot write the tuning database at {self.path}: {e.strerror or e}"
        return DatabaseWriteError(e.errno, msg) if e.errno is not None else DatabaseWriteError(msg)

    def append(self, trial: Trial) -> None:
        """Journal `trial`; it is on disk when this returns. Raises DatabaseWriteError if the directory cannot be
        written."""
        self._append([trial])

    def _append(self, trials: list[Trial], dedupe: bool = False) -> int:
        lines = [(t, t.to_json().encode() + b"\n") for t in trials]  # before the lock: a bad config raises here
        try:
            os.makedirs(self.path, exist_ok=True)
        except OSError as e:
            raise self._write_error(e) from e
        with self._mutex, self._locked(exclusive=True):
            self._refresh_locked()  # the others' lines first: offsets and the index stay exact
            if dedupe:
                seen, fresh = set(self._seen), []
                for t, b in lines:
                    if (i := _ident(t)) not in seen:
                        seen.add(i)
                        fresh.append((t, b))
                lines = fresh
            if not lines:
                return 0
            data = b"".join(b for _, b in lines)
            before = dict(self._best)
            try:
                fd = os.open(self.journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
                try:
                    size = os.fstat(fd).st_size
                    if size > self._offset:  # a torn last line: ended here so that ours starts a line of its own
                        data = b"\n" + data
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view):]
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError as e:
                raise self._write_error(e) from e
            if size == 0:  # a new journal: its directory entry must survive a crash too
                _fsync_dir(self.path)
            self._refresh_locked()  # read our lines back: one path for offsets, best and warnings
            if self._best != before:
                try:
                    self._write_index()
                except OSError as e:  # the trial is journaled; the cache is repaired by the next load
                    warnings.warn(f"{self.index_path}: not updated ({e})", JournalWarning, stacklevel=3)
        return len(lines)

    # ------------------------------------------------------------------------- the index (a cache)

    def _index_doc(self) -> dict[str, Any]:
        best: dict[str, dict[str, dict[str, Any]]] = {}
        for (w, tg, s), t in self._best.items():  # json.dumps sorts the keys
            best.setdefault(w, {}).setdefault(tg, {})[s] = json.loads(t.to_json())
        return {"version": INDEX_VERSION, "best": best}

    def _write_index(self) -> None:
        _atomic_write(self.index_path, json.dumps(self._index_doc(), indent=1, sort_keys=True).encode() + b"\n")

    def _repair_index(self) -> None:
        """Rewrite index.json if it is missing, corrupt or stale (a writer killed between journal and index)."""
        try:
            with open(self.index_path, "rb") as f:
                current = json.load(f)
        except (OSError, ValueError):
            current = None
        if current == self._index_doc() or (current is None and not self._best):
            return
        with contextlib.suppress(OSError):  # read-only: the journal still answers every query
            with self._mutex, self._locked(exclusive=True):
                self._refresh_locked()
                self._write_index()

    # ------------------------------------------------------------------------- queries

    def trials(self, workload: str | None = None, target: str | None = None, shape: str | None = None) -> list[Trial]:
        """The trials matching the filters that are not None, in journal order."""
        with self._mutex:
            self.refresh()
            if workload is not None and target is not None and shape is not None:
                return list(self._groups.get((workload, target, shape), ()))
            return [t for t in self._trials if (workload is None or t.workload == workload)
                    and (target is None or t.target == target) and (shape is None or t.shape == shape)]

    def best(self, workload: str, target: str, shape: str | None = None) -> Trial | None:
        """The ok trial of lowest median for that shape (any shape if None); None if no trial is ok."""
        with self._mutex:
            self.refresh()
            if shape is not None:
                return self._best.get((workload, target, shape))
            found = [t for (w, tg, _), t in self._best.items() if w == workload and tg == target]
            return min(found, key=lambda t: t.median, default=None)

    def measured(self, workload: str, target: str, shape: str) -> dict[str, Trial]:
        """The configurations already tried, by `Trial.key()`: a resumed run measures none of them again. A
        configuration tried more than once keeps its fastest ok trial, else its latest failure."""
        with self._mutex:
            self.refresh()
            out: dict[str, Trial] = {}
            for t in self._groups.get((workload, target, shape), ()):
                old = out.get(k := t.key())
                if old is None or t.median < old.median or not (old.ok or t.ok):
                    out[k] = t
            return out

    def shapes(self, workload: str, target: str) -> list[str]:
        """The shapes with trials (ok or not) of that workload and target, in the order they were first tried."""
        with self._mutex:
            self.refresh()
            return [s for (w, tg, s) in self._groups if w == workload and tg == target]

    def nearest(self, workload: str, target: str, shape: str) -> Trial | None:
        """The best trial of `shape` if it was tuned, else that of the closest tuned shape of the same rank
        (`shape_distance`); None if there is none. Ties go to the smaller shape: its tiles fit a larger one,
        while a larger shape's tiles may overhang a smaller one."""
        with self._mutex:
            self.refresh()
            exact = self._best.get((workload, target, shape))
            want = parse_shape(shape)
            if exact is not None or want is None:
                return exact
            options = []
            for (w, tg, s), t in self._best.items():
                dims = parse_shape(s) if w == workload and tg == target else None
                if dims is not None and len(dims) == len(want):
                    options.append((shape_distance(want, dims), math.prod(dims), dims, t))
            return min(options, key=lambda o: o[:3])[3] if options else None

    def export(self, path: str | os.PathLike[str]) -> int:
        """Write every trial to the .jsonl file `path` (replaced whole); returns how many."""
        with self._mutex:
            self.refresh()
            trials = list(self._trials)
        dest = os.path.abspath(os.fspath(path))
        _atomic_write(dest, b"".join(t.to_json().encode() + b"\n" for t in trials))
        return len(trials)

    def import_(self, path: str | os.PathLike[str]) -> int:
        """Add the trials of a .jsonl file or of another database's directory, except those already here (same
        workload, target, shape, configuration, run and trial index); returns how many were added."""
        src = os.fspath(path)
        if os.path.isdir(src):
            src = os.path.join(src, JOURNAL)
        with open(src, "rb") as f:
            data = f.read()
        trials, bad = _parse_lines(data.split(b"\n"), 1)  # an exported file's last line may lack its newline
        if bad:
            n, why = bad[0]
            warnings.warn(f"{src}: skipped {len(bad)} malformed line(s), the first at line {n} ({why})",
                          JournalWarning, stacklevel=2)
        return self._append(trials, dedupe=True)

    def __len__(self) -> int:
        with self._mutex:
            self.refresh()
            return len(self._trials)

    def __repr__(self) -> str:
        with contextlib.suppress(OSError):
            self.refresh()
        workloads = list(dict.fromkeys(t.workload for t in self._trials))
        names = ", ".join(w[:16] for w in workloads[:4]) + (", ..." if len(workloads) > 4 else "")
        return f"Database({self.path!r}, {len(self._trials)} trials, {len(workloads)} workloads: {names or '-'})"
