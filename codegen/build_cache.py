"""The whole-build cache: `build` in a new process finds what an earlier one scheduled, lowered and
compiled, and runs none of it again (no auto_schedule, no isl analysis, no lowering, no NVRTC, no O3).

The key (`te_key`, `program_key`) is a sha256 of:
* the program as the user gave it: for te tensors the whole stage graph (every stage's name, dtype,
  shape, axes, body, reduction domain; which sizes are symbolic: size variables are numbered by first
  use, so `n` shared by two tensors differs from two distinct sizes) with the order of `args` and the
  pinned `sizes=`; the schedule is auto_schedule's, whose inputs are exactly these and the target.
  For a `Schedule` or `Program` its scheduled program, node by node (every primitive applied so far is
  in it: it is the trace's result, checked already, and the only thing `build` reads). Object identity
  is replaced by first-use numbering; names are kept, because they are printed in the generated source
  and in the runtime's messages (a renamed tensor builds its own entry);
* the target and what the machine code is for: CUDA the `sm_XX` and NVRTC's identity and options; CPU
  llvmlite's version, the triple, the host CPU and its features;
* `codegen.diskcache.version()`, a hash of the project's sources: another version's entry is never found
  (and an entry whose recorded version differs is refused on load as well).

The value: the lowered program and the generated code (CUDA: `CudaSource`; CPU: the program and
`Generated`), the build's notes and size preconditions, and the binary (cubin or LLVM object code),
pickled. The objects of the user's graph (buffers, size and loop variables) are pickled as references
(their first-use number) and resolved to the caller's own objects on load, so the module's program
shares its buffers and size variables with the caller's tensors exactly as a fresh build's would.

Levels: a per-process memory cache (MEMORY_ENTRIES entries, least recently used dropped) holding the
entry bytes (and, on CPU, the loaded native kernel), then the disk (`codegen.diskcache`: atomic writes,
checksummed entries, size bound, `python -m codegen.cache clear`). A corrupt, truncated or foreign entry,
or one that does not unpickle, is deleted and rebuilt, never returned. Call-time specialization variants
are sub-entries (`variant_key`): a warm process calling with a known size class compiles nothing.
`build(..., cache=False)` bypasses this cache (and the binary caches); `dump_passes` always rebuilds.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import pickle
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from loopir.nodes import Buffer, Program, Var
from loopir.te import ComputeOp, Tensor

from . import diskcache as disk
from .cuda import kernel as cuda_kernel
from .passes import staging
from .cuda.nvrtc import nvrtc_identity
from .cuda.runtime import CudaModule
from .llvm.runtime import CpuKernel, host_id
from .module import CpuModule, Module

MAGIC = b"LOOPIRBUILD1"
MEMORY_ENTRIES = 256
_mem: OrderedDict[str, bytes] = OrderedDict()
_kernels: dict[str, Any] = {}  # digest -> CpuKernel (its engine loaded once per process)
_lock = threading.Lock()
_FIELDS: dict[type, tuple[str, ...]] = {}


class _Unkeyable(Exception):
    """Something in the program that the key cannot describe faithfully: the build is not cached."""


@dataclass(frozen=True)
class BuildKey:
    """Where one build lives: `digest` (hex), and `objs`, the caller's objects in first-use order (what
    the entry's references resolve to)."""

    digest: str
    objs: tuple[Any, ...]


class _Keyer:
    """A structural description of te graphs and loop IR from primitives only (repr is stable across
    processes), numbering objects with identity (Var, Buffer, Tensor) by first use."""

    def __init__(self) -> None:
        self.ids: dict[int, int] = {}
        self.objs: list[Any] = []

    def _new(self, o: Any) -> int | None:
        """The object's number; None the first time (the caller then describes it once)."""
        i = self.ids.get(id(o))
        if i is not None:
            return i
        self.ids[id(o)] = len(self.objs)
        self.objs.append(o)
        return None

    def k(self, n: Any) -> Any:
        t = type(n)
        if t is str or t is int or t is bool or n is None:
            return n
        if t is float:
            return ("f", repr(n))
        if t is tuple or t is list:
            return tuple(self.k(x) for x in n)
        if isinstance(n, Var):
            i = self._new(n)
            return ("V", i) if i is not None else ("V", len(self.objs) - 1, n.name, n.dtype)
        if isinstance(n, Buffer):
            i = self._new(n)
            if i is not None:
                return ("B", i)
            i = len(self.objs) - 1
            return ("B", i, n.name, n.dtype, n.scope, self.k(n.shape))
        if isinstance(n, Tensor):
            i = self._new(n)
            if i is not None:
                return ("T", i)
            i = len(self.objs) - 1
            op = n.op
            if isinstance(op, ComputeOp):
                desc = ("compute", self.k(op.axis), self.k(op.reduce_axis), self.k(op.reduce_dom),
                        self.k(op.inputs), self.k(op.body))
            else:
                desc = ("placeholder",)
            return ("T", i, n.name, n.dtype, self.k(n.shape), self.k(n.buffer), desc)
        if isinstance(n, np.generic):
            return ("np", type(n).__name__, repr(n.item()))
        if dataclasses.is_dataclass(n) and not isinstance(n, type):
            names = _FIELDS.get(t)
            if names is None:
                names = _FIELDS[t] = tuple(f.name for f in dataclasses.fields(n))
            return (t.__module__, t.__qualname__, *(self.k(getattr(n, f)) for f in names))
        if t is frozenset or t is set:
            # Vars and Buffers hash by identity: number a set's members in name order, not iteration order
            return ("fs", tuple(sorted(repr(self.k(x)) for x in sorted(n, key=_member_order))))
        if t is dict:
            return ("d", tuple(sorted((repr(self.k(a)), self.k(b)) for a, b in sorted(n.items(), key=lambda kv:
                                                                                       _member_order(kv[0])))))
        raise _Unkeyable(f"{t.__module__}.{t.__qualname__}")


def _member_order(x: Any) -> tuple[str, str]:
    return (type(x).__name__, x.name if isinstance(x, (Var, Buffer, Tensor)) else repr(x))


def _target_id(target: str, opts: dict[str, Any]) -> tuple[Any, ...]:
    """What the machine code is for, the options (as build's `_key_opts` gives them) and the renderer's
    module-level knobs (tests set them)."""
    rest = tuple(sorted((k, repr(v)) for k, v in opts.items()))
    if target == "cuda":
        return ("cuda", nvrtc_identity(), rest, cuda_kernel.LAUNCH_MIN_BLOCKS, staging.PIPELINE_SHARED_COPIES)
    return ("cpu", host_id(), rest)


def _digest(parts: tuple[Any, ...]) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def te_key(outs: list[Any], args: Any, target: str, opts: dict[str, Any]) -> BuildKey | None:
    """The key of `build(outs, args, target, **opts)` for te tensors (None: not cacheable)."""
    kr = _Keyer()
    try:
        graph = kr.k(list(outs))
        if args is not None:
            arglist = args if isinstance(args, (list, tuple)) else [args]
            a = tuple(kr.k(x) for x in arglist)
        else:
            a = None
    except _Unkeyable:
        return None
    return BuildKey(_digest(("te", disk.version(), _target_id(target, opts), graph, a)), tuple(kr.objs))


def program_key(program: Program, target: str, opts: dict[str, Any]) -> BuildKey | None:
    """The key of building a scheduled program (arguments in call order) for `target` (None: not cacheable)."""
    kr = _Keyer()
    try:
        body = kr.k(program)
    except _Unkeyable:
        return None
    return BuildKey(_digest(("program", disk.version(), _target_id(target, opts), body)), tuple(kr.objs))


def variant_key(parent: BuildKey, key: Any, extra: Any = None) -> BuildKey:
    """The sub-entry of a call-time specialization variant (`codegen.specialize.Key`) of a cached build
    (`extra`: what else the variant was built from, e.g. a tuned trial). A variant's program is its own
    (substituted) graph: it is pickled whole, with no references."""
    parts = ("variant", parent.digest, key.names, key.div, key.int32, key.rows)
    return BuildKey(_digest(parts if extra is None else (*parts, repr(extra))), ())


# ----------------------------------------------------------------------------- values


class _Pickler(pickle.Pickler):
    def __init__(self, f: Any, objs: tuple[Any, ...]) -> None:
        super().__init__(f, protocol=pickle.HIGHEST_PROTOCOL)
        self._refs = {id(o): i for i, o in enumerate(objs)}
        self._objs = objs  # kept alive: ids stay unique while pickling

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, (Var, Buffer)):
            return self._refs.get(id(obj))
        return None


class _Unpickler(pickle.Unpickler):
    def __init__(self, f: Any, objs: tuple[Any, ...]) -> None:
        super().__init__(f)
        self._objs = objs

    def persistent_load(self, pid: Any) -> Any:
        if type(pid) is not int or not 0 <= pid < len(self._objs):
            raise pickle.UnpicklingError(f"reference {pid!r} names no object of this build")
        return self._objs[pid]


def _remember(digest: str, raw: bytes) -> None:
    with _lock:
        _mem[digest] = raw
        _mem.move_to_end(digest)
        while len(_mem) > MEMORY_ENTRIES:
            old, _ = _mem.popitem(last=False)
            _kernels.pop(old, None)


def store(key: BuildKey, mod: Module) -> None:
    """Remember a freshly built module under `key` (memory and disk); a module that cannot be stored
    (no binary, something unpicklable) is simply not cached."""
    value: dict[str, Any] = {"digest": key.digest, "version": disk.version(), "notes": list(mod.notes),
                             "pre": tuple(mod.preconditions), "trace": mod.trace}
    if isinstance(mod, CudaModule):
        value.update(target="cuda", gen=mod.gen, bin=mod.cubin, arch=mod.arch, options=tuple(mod.options))
    elif isinstance(mod, CpuModule) and mod.kernel.object_code is not None:
        value.update(target="cpu", program=mod.program, gen=mod.kernel.gen, bin=mod.kernel.object_code)
    else:
        return
    buf = io.BytesIO()
    try:
        _Pickler(buf, key.objs).dump(value)
    except Exception:  # noqa: BLE001 - an unpicklable program is built every time, never an error
        return
    raw = buf.getvalue()
    _remember(key.digest, raw)
    if isinstance(mod, CpuModule):
        with _lock:
            _kernels[key.digest] = mod.kernel
    disk.write(key.digest + ".build", raw, MAGIC)


def load(key: BuildKey, target: str, opts: dict[str, Any]) -> Module | None:
    """The module cached under `key`, rebuilt around the caller's objects; None on a miss (or an entry
    that fails any check: it is deleted, so the caller's rebuild replaces it)."""
    with _lock:
        raw = _mem.get(key.digest)
        if raw is not None:
            _mem.move_to_end(key.digest)
    from_disk = raw is None
    if from_disk:
        raw = disk.read(key.digest + ".build", MAGIC)
        if raw is None:
            return None
    try:
        v = _Unpickler(io.BytesIO(raw), key.objs).load()
        ok = (isinstance(v, dict) and v.get("digest") == key.digest and v.get("version") == disk.version()
              and v.get("target") == target)
        mod = _module(key, v, opts) if ok else None
    except Exception:  # noqa: BLE001 - any damage inside a checksummed entry: discard it, rebuild
        mod = None
    if mod is None:
        discard(key)
        return None
    if from_disk:
        _remember(key.digest, raw)
    return mod


def _module(key: BuildKey, v: dict[str, Any], opts: dict[str, Any]) -> Module:
    mod: Module
    if v["target"] == "cuda":
        mod = CudaModule(v["gen"], v["bin"], v["arch"], v["options"])
    else:
        with _lock:
            kernel = _kernels.get(key.digest)
        if kernel is None:
            kernel = CpuKernel(v["gen"], obj=v["bin"])
            with _lock:
                _kernels[key.digest] = kernel
        mod = CpuModule(v["program"], kernel, threads=opts.get("threads"))
    mod.notes = list(v["notes"])
    mod.preconditions = tuple(v["pre"])
    mod.trace = v.get("trace")
    return mod


def discard(key: BuildKey) -> None:
    with _lock:
        _mem.pop(key.digest, None)
        _kernels.pop(key.digest, None)
    disk.remove(key.digest + ".build")


def clear_memory() -> None:
    """Forget this process's memory cache (the disk cache stays; `codegen.diskcache.clear()` empties it)."""
    with _lock:
        _mem.clear()
        _kernels.clear()


__all__ = ["BuildKey", "te_key", "program_key", "variant_key", "load", "store", "discard", "clear_memory"]
