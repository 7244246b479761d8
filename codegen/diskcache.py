"""The on-disk compile cache shared by every layer: whole builds (`codegen.build_cache`), cubins
(`codegen.cuda.nvrtc`) and LLVM object code (`codegen.llvm.runtime`).

    python -m codegen.cache info      # where it is, how many entries, how many bytes (codegen/cache.py)
    python -m codegen.cache clear     # delete every entry

Where: `$LOOPIR_CACHE_DIR`, else `~/.cache/loopir`. One file per entry, `<sha256 of the key>.<kind>`
(`.build`, `.cubin`, `.llo`). Each entry is `MAGIC | payload length | sha256(payload) | payload`; a
read that finds a short, corrupt or foreign entry deletes it and reports a miss, so it is rebuilt,
never returned. Writes go to a temporary file in the same directory and are moved into place with
`os.replace` (atomic on POSIX): concurrent processes writing one key each write a whole entry and the
last rename wins; a reader sees either no file or a whole one. A directory that cannot be created or
written means no caching, never an error.

Size bound: `$LOOPIR_CACHE_MAX_MB` (default 2048; 0 disables the disk cache). A hit refreshes the
entry's mtime; when a write takes the directory over the bound, the least recently used entries are
deleted until it is under 3/4 of it (LRU by mtime, checked at most once per EVICT_EVERY writes of a
process, and always after a write larger than 1/16 of the bound).

`version()` hashes the sources of the three packages (loopir, schedules, codegen) with the Python
version: every whole-build key contains it, so an entry written by another version of the project
is never found.
"""

from __future__ import annotations

import hashlib
import os
import struct
import sys
import tempfile
import threading
from functools import cache

HEADER = struct.Struct("<12sQ32s")  # magic, payload length, sha256(payload)
KINDS = (".build", ".cubin", ".llo")
DEFAULT_MAX_MB = 2048
EVICT_EVERY = 16  # writes between two scans of the directory (a scan stats every entry)
_PACKAGES = ("loopir", "schedules", "codegen")
_writes = 0
_lock = threading.Lock()


def cache_dir() -> str:
    """The cache directory (`$LOOPIR_CACHE_DIR`, else `~/.cache/loopir`); it may not exist yet."""
    return os.environ.get("LOOPIR_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "loopir")


def max_bytes() -> int:
    """The size bound in bytes (`$LOOPIR_CACHE_MAX_MB`, default 2048 MB; 0: no disk cache)."""
    raw = os.environ.get("LOOPIR_CACHE_MAX_MB", "")
    try:
        mb = float(raw) if raw.strip() else DEFAULT_MAX_MB
    except ValueError:
        mb = DEFAULT_MAX_MB  # a malformed setting must not break builds; the default bound applies
    return max(int(mb * 2**20), 0)


def enabled() -> bool:
    return max_bytes() > 0


@cache
def version() -> str:
    """A hash of the project's sources (every .py file of loopir, schedules, codegen) and the Python
    version: an entry written by any other version never matches (computed once per process, ~2 ms)."""
    h = hashlib.sha256(f"python {sys.version_info[:2]}".encode())
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    for pkg in _PACKAGES:
        base = os.path.join(root, pkg)
        for d, dirs, files in sorted(os.walk(base)):
            dirs.sort()
            for f in sorted(files):
                if f.endswith(".py"):
                    p = os.path.join(d, f)
                    h.update(os.path.relpath(p, root).encode() + b"\0")
                    with open(p, "rb") as fh:
                        h.update(hashlib.sha256(fh.read()).digest())
    return h.hexdigest()


def path_of(name: str) -> str:
    return os.path.join(cache_dir(), name)


def read(name: str, magic: bytes) -> bytes | None:
    """The payload of entry `name` (a file name in the cache directory), or None: missing, unreadable,
    short, corrupt or of another magic (such an entry is deleted, so the rebuild replaces it)."""
    if not enabled():
        return None
    path = path_of(name)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    ok = len(data) >= HEADER.size
    if ok:
        m, n, digest = HEADER.unpack_from(data)
        payload = data[HEADER.size:]
        ok = m == magic and n == len(payload) and hashlib.sha256(payload).digest() == digest
    if not ok:
        _unlink(path)
        return None
    try:
        os.utime(path)  # least recently used goes first at eviction
    except OSError:
        pass  # a read-only cache still serves its entries
    return payload


def write(name: str, payload: bytes, magic: bytes) -> bool:
    """Store `payload` as entry `name`, atomically; False when the directory is not writable (no error)."""
    global _writes
    if not enabled():
        return False
    d = cache_dir()
    try:
        os.makedirs(d, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=os.path.splitext(name)[1])
    except OSError:
        return False
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(HEADER.pack(magic, len(payload), hashlib.sha256(payload).digest()))
            f.write(payload)
        os.replace(tmp, os.path.join(d, name))
    except OSError:
        _unlink(tmp)
        return False
    except BaseException:
        _unlink(tmp)
        raise
    with _lock:
        _writes += 1
        scan = _writes % EVICT_EVERY == 1 or len(payload) * 16 > max_bytes()
    if scan:
        evict()
    return True


def remove(name: str) -> None:
    """Delete entry `name` (no error when it is missing or the directory is read-only)."""
    _unlink(path_of(name))


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def entries() -> list[tuple[str, int, float]]:
    """(path, bytes, mtime) of every entry (temporary files of a write in progress excluded)."""
    out = []
    try:
        it = os.scandir(cache_dir())
    except OSError:
        return out
    with it:
        for e in it:
            if e.name.endswith(KINDS) and not e.name.startswith(".tmp-"):
                try:
                    st = e.stat()
                except OSError:
                    continue  # deleted meanwhile by another process
                out.append((e.path, st.st_size, st.st_mtime))
    return out


def evict(limit: int | None = None) -> int:
    """Delete least recently used entries while the directory holds more than `limit` bytes (default: the
    bound), down to 3/4 of it; the number deleted."""
    limit = max_bytes() if limit is None else limit
    es = entries()
    total = sum(s for _, s, _ in es)
    if total <= limit:
        return 0
    target = limit * 3 // 4
    n = 0
    for path, size, _ in sorted(es, key=lambda e: e[2]):
        if total <= target:
            break
        _unlink(path)
        total -= size
        n += 1
    return n


def clear() -> int:
    """Delete every entry (and leftover temporary files); the number of entries deleted."""
    es = entries()
    for path, _, _ in es:
        _unlink(path)
    try:
        for f in os.listdir(cache_dir()):
            if f.startswith(".tmp-"):
                _unlink(os.path.join(cache_dir(), f))
    except OSError:
        pass
    return len(es)
