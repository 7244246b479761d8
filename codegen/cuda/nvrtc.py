"""CUDA C -> cubin with NVRTC, behind a persistent disk cache.

* Always a cubin for a real `sm_XX` (never PTX: a newer NVRTC writes PTX that older drivers refuse).
* A failed compilation raises `NvrtcError` carrying NVRTC's log and the numbered source lines
  around each line the log names.
* Cache: the shared disk cache (`codegen.diskcache`: `$LOOPIR_CACHE_DIR` or `~/.cache/loopir`, a size
  bound with LRU eviction, `python -m codegen.cache clear`), one `.cubin` file per key, where the key hashes the
  source, the arch, the options and the NVRTC library's identity. The NVRTC identity is taken
  from the library file's path, size and mtime (loading libnvrtc just to ask its version costs
  ~120 ms, which would make a cache hit slow); when the library cannot be located, the version
  NVRTC reports is used. Each entry is `MAGIC | payload length | sha256(payload) | payload`: a
  truncated or corrupt entry fails the check and is recompiled. Entries are written to a
  temporary file in the same directory and moved into place with `os.replace` (atomic), so
  concurrent processes never see a partial entry.
* In flight: `prefetch_cubin` starts a compilation on a background thread (NVRTC releases the GIL), and a
  later `compile_cubin` of the same key waits for it instead of compiling again. `build` uses it to run NVRTC
  on the source of the unchecked schedule while the checked one is computed (codegen/build.py,
  `_speculate`); a source that turns out different is simply never asked for. A forked child never waits on
  its parent's threads (the table is per process).
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from functools import cache

from loopir.errors import ArgumentError, RuntimeLaunchError

from .. import diskcache as disk
from ..diskcache import cache_dir

MAGIC = b"LOOPIRCUBIN1"
DEFAULT_OPTIONS: tuple[str, ...] = ("--std=c++17", "-default-device")


class NvrtcError(RuntimeLaunchError):
    """NVRTC refused the source; `log` is NVRTC's log, `source` the CUDA C."""

    def __init__(self, message: str, log: str = "", source: str = ""):
        super().__init__(message)
        self.log = log
        self.source = source


@cache
def _nvrtc():
    from cuda.bindings import nvrtc

    return nvrtc


def _check(ret, call: str):
    nv = _nvrtc()
    err, *vals = ret
    if err != nv.nvrtcResult.NVRTC_SUCCESS:
        raise NvrtcError(f"{call} failed: {err.name}: {nv.nvrtcGetErrorString(err)[1].decode()}")
    return vals[0] if len(vals) == 1 else (tuple(vals) or None)


@cache
def nvrtc_identity() -> str:
    """A string that changes whenever the NVRTC library changes (cheap: no library load)."""
    try:
        import importlib.util

        spec = importlib.util.find_spec("nvidia")
        for root in list(spec.submodule_search_locations or []) if spec else []:
            libs = sorted(glob.glob(os.path.join(root, "*", "lib", "libnvrtc.so*")))
            libs += sorted(glob.glob(os.path.join(root, "cuda_nvrtc", "lib", "libnvrtc.so*")))
            if libs:
                st = [os.stat(p) for p in libs]
                return "lib:" + ";".join(f"{p}:{s.st_size}:{s.st_mtime_ns}" for p, s in zip(libs, st))
    except Exception:  # noqa: BLE001 - fall back to asking NVRTC itself
        pass
    major, minor = nvrtc_version()
    return f"version:{major}.{minor}"


@cache
def nvrtc_version() -> tuple[int, int]:
    return _check(_nvrtc().nvrtcVersion(), "nvrtcVersion")


def cache_key(source: str, arch: str, options: tuple[str, ...]) -> str:
    h = hashlib.sha256()
    for part in (MAGIC.decode(), arch, nvrtc_identity(), "\0".join(options), source):
        h.update(part.encode())
        h.update(b"\0\1")
    return h.hexdigest()


def normalize_arch(arch: str | int | None) -> str:
    if arch is None:
        return "sm_90"
    a = str(arch)
    if a.startswith("compute_"):
        raise ArgumentError(f"arch {a!r} is a virtual architecture (PTX only); give a real one such as 'sm_90'")
    if not a.startswith("sm_"):
        a = "sm_" + a.replace(".", "")
    if not re.fullmatch(r"sm_\d+[a-z]?", a):
        raise ArgumentError(f"arch {arch!r} is not of the form 'sm_90'")
    return a


def specific_arch(source: str, arch: str) -> str:
    """`arch` with the architecture-specific suffix that `source` needs: Hopper's warpgroup instructions
    (wgmma, codegen.cuda.wgmma) exist only in sm_90a, whose cubin runs on sm_90 devices only."""
    return arch + "a" if arch == "sm_90" and "wgmma." in source else arch


def compile_cubin(source: str, arch: str | None = None, options: tuple[str, ...] = (),
                  name: str = "loopir.cu", use_cache: bool = True) -> bytes:
    """Compile CUDA C to a cubin for `arch` (default sm_90), through the disk cache (and a compilation of the
    same key already in flight, see `prefetch_cubin`)."""
    arch = specific_arch(source, normalize_arch(arch))
    opts = DEFAULT_OPTIONS + tuple(options)
    key = cache_key(source, arch, opts)
    entry = key + ".cubin" if use_cache else None
    if entry is not None:
        hit = disk.read(entry, MAGIC)
        if hit is not None:
            return hit
    with _LOCK:
        fut = _INFLIGHT.pop(key, None)
    cubin = fut.result() if fut is not None else _compile(source, arch, opts, name)
    if entry is not None:
        disk.write(entry, cubin, MAGIC)  # a read-only or full cache does not break compilation
    return cubin


# cache key -> the compilation in flight (this process only: a fork starts with an empty table, since the
# parent's worker thread does not exist in the child)
_INFLIGHT: dict[str, Future[bytes]] = {}
_LOCK = threading.Lock()
_POOL: list[ThreadPoolExecutor] = []


def _forget_after_fork() -> None:
    _INFLIGHT.clear()
    _POOL.clear()


os.register_at_fork(after_in_child=_forget_after_fork)


def prefetch_cubin(source: str, arch: str | None = None, options: tuple[str, ...] = (),
                   name: str = "loopir.cu") -> None:
    """Start compiling `source` on a background thread; `compile_cubin` of the same source, arch and options
    then takes its result (a failure is re-raised there). Nothing is started on a disk-cache hit, or when the
    same key is already in flight; at most a few are kept (the oldest unclaimed ones are dropped)."""
    arch = specific_arch(source, normalize_arch(arch))
    opts = DEFAULT_OPTIONS + tuple(options)
    key = cache_key(source, arch, opts)
    if disk.enabled() and os.path.exists(disk.path_of(key + ".cubin")):
        return  # compile_cubin will read (and check) it; a corrupt entry is then compiled there
    with _LOCK:
        if key in _INFLIGHT:
            return
        if not _POOL:
            _POOL.append(ThreadPoolExecutor(max_workers=1, thread_name_prefix="loopir-nvrtc"))
        _INFLIGHT[key] = _POOL[0].submit(_compile, source, arch, opts, name)
        while len(_INFLIGHT) > 8:  # unclaimed speculations: never a leak
            _INFLIGHT.pop(next(iter(_INFLIGHT)))


def _compile(source: str, arch: str, opts: tuple[str, ...], name: str) -> bytes:
    nv = _nvrtc()
    prog = _check(nv.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], []), "nvrtcCreateProgram")
    try:
        args = [f"--gpu-architecture={arch}".encode()] + [o.encode() for o in opts]
        (err,) = nv.nvrtcCompileProgram(prog, len(args), args)
        size = _check(nv.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
        buf = bytearray(size)
        _check(nv.nvrtcGetProgramLog(prog, buf), "nvrtcGetProgramLog")
        log = bytes(buf).rstrip(b"\x00").decode(errors="replace")
        if err != nv.nvrtcResult.NVRTC_SUCCESS:
            raise NvrtcError(format_compile_error(err.name, log, source, name, arch), log, source)
        size = _check(nv.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
        if size == 0:
            raise NvrtcError(f"NVRTC produced no cubin for {arch}; give a real architecture such as sm_90")
        out = bytearray(size)
        _check(nv.nvrtcGetCUBIN(prog, out), "nvrtcGetCUBIN")
        return bytes(out)
    finally:
        nv.nvrtcDestroyProgram(prog)


def format_compile_error(code: str, log: str, source: str, name: str, arch: str, context: int = 2) -> str:
    """NVRTC's log, then the numbered source lines around each line it names (marked '>')."""
    lines = source.splitlines()
    bad = sorted({int(m) for m in re.findall(re.escape(name) + r"\((\d+)\)", log)})
    parts = [f"NVRTC failed to compile {name} for {arch} ({code}):", log.rstrip(), ""]
    shown: set[int] = set()
    for ln in bad:
        lo, hi = max(1, ln - context), min(len(lines), ln + context)
        chunk = []
        for k in range(lo, hi + 1):
            if k in shown:
                continue
            shown.add(k)
            chunk.append(f"{'>' if k == ln else ' '} {k:5d} | {lines[k - 1]}")
        if chunk:
            parts.append("\n".join(chunk))
            parts.append("   ...")
    return "\n".join(parts)


__all__ = ["compile_cubin", "NvrtcError", "cache_dir", "cache_key", "nvrtc_version", "normalize_arch"]
