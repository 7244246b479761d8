"""`build`: from a schedule, a program or tensors to a callable module for a target.

    mod = build(s, [x, y], target="cpu")   # s: Schedule | Program | Tensor | [Tensor]
    mod(x_arr, y_arr)

Plain tensors go through `schedules.auto_schedule(outputs, target=target)` when it exists,
else they are lowered unscheduled. `args` (te Tensors or Buffers) fixes the call order; a
buffer the program reads or writes that is neither in `args` nor a temporary is refused, an
intermediate listed in `args` becomes an argument. CPU code is compiled once per program:
an in-memory cache keyed by the program's *structure* (variables and buffers renumbered,
names ignored) serves a structurally equal program, even one built from fresh objects.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from typing import Any

from loopir.nodes import Allocate, Buffer, Node, Program, Var
from loopir.visit import buffers_of, walk
from schedules.auto import auto_schedule

from .module import CpuModule, Module
from .passes import lower

TARGETS = ("cpu", "cuda")
_cache: dict[tuple, Any] = {}
_cache_lock = threading.Lock()
_CPU_OPTS = ("threads",)


# ----------------------------------------------------------------------------- inputs


def _is_tensor(x: Any) -> bool:
    return hasattr(x, "buffer") and hasattr(x, "op") and isinstance(getattr(x, "buffer", None), Buffer)


def _buffer_of(x: Any, k: int) -> Buffer:
    if isinstance(x, Buffer):
        return x
    if _is_tensor(x):
        return x.buffer
    raise TypeError(f"build: args[{k}] must be a te Tensor or a Buffer, got {type(x).__name__} {x!r}")


def to_program(obj: Any, target: str, args: Sequence[Any] | None = None) -> Program:
    """The program to compile for a Schedule, Program, Tensor or list of Tensors."""
    if isinstance(obj, Program):
        return obj
    prog = getattr(obj, "program", None)
    if isinstance(prog, Program):  # a Schedule (or anything holding its current program)
        return prog
    tensors = list(obj) if isinstance(obj, (list, tuple)) else [obj]
    if not tensors or not all(_is_tensor(t) for t in tensors):
        raise TypeError(
            f"build takes a Schedule, a Program, a te Tensor or a list of Tensors, got {type(obj).__name__}"
        )
    s = auto_schedule(tensors, target=target)
    p = s if isinstance(s, Program) else getattr(s, "program", None)
    if isinstance(p, Program):
        return p
    raise TypeError(f"auto_schedule returned {type(s).__name__}, not a Schedule or Program")


def with_args(program: Program, args: Sequence[Any] | None) -> Program:
    """`program` with its arguments in the order of `args` (Tensors or Buffers)."""
    if args is None:
        return program
    if isinstance(args, (Buffer,)) or _is_tensor(args):
        args = [args]
    bufs = [_buffer_of(a, k) for k, a in enumerate(args)]
    seen: set[Buffer] = set()
    for b in bufs:
        if b in seen:
            raise ValueError(f"build: argument {b.name!r} is listed twice in args")
        seen.add(b)
    scoped = {n.buffer for n in walk(program.body) if isinstance(n, Allocate)}
    reads, writes = buffers_of(program.body)
    temps = tuple(t for t in program.temps if t not in seen)
    for b in [*reads, *writes, *program.args]:
        if b not in seen and b not in scoped and b not in temps:
            raise ValueError(
                f"build: buffer {b.name!r} is used by program {program.name!r} but is missing from args "
                f"(args: {', '.join(x.name for x in bufs) or 'none'})"
            )
    if tuple(bufs) == program.args and temps == program.temps:
        return program
    return dataclasses.replace(program, args=tuple(bufs), temps=temps)


# ----------------------------------------------------------------------------- structural key


def structural_key(program: Program) -> tuple:
    """A hashable key equal for programs that differ only in names and object identity."""
    ids: dict[int, int] = {}

    def ident(x: object) -> int:
        return ids.setdefault(id(x), len(ids))

    memo: dict[int, Any] = {}

    def k(n: Any) -> Any:
        if isinstance(n, tuple):
            return tuple(k(x) for x in n)
        if isinstance(n, Var):
            return ("V", ident(n), n.dtype)
        if isinstance(n, Buffer):
            if id(n) not in ids:
                ident(n)
                memo[id(n)] = ("B", ids[id(n)], n.dtype, n.scope, k(n.shape))
            return ("B", ids[id(n)])
        if isinstance(n, Node):
            cls = type(n)
            fields = [f.name for f in dataclasses.fields(cls) if f.name != "name"]
            return (cls.__name__, *(k(getattr(n, f)) for f in fields))
        if isinstance(n, float):
            return ("f", repr(n))
        return (type(n).__name__, n)

    # args, temps and params first: their order is the native signature
    head = (k(program.args), k(program.temps), k(program.params))
    body = k(program.body)
    bufs = tuple(sorted(v for v in memo.values()))
    return (head, body, bufs)


# ----------------------------------------------------------------------------- build


def build(obj: Any, args: Sequence[Any] | None = None, target: str = "cpu", **opts: Any) -> Module:
    """Compile a Schedule / Program / Tensor(s) for `target` ("cpu" or "cuda"); see the module doc.

    `dump_passes=True` prints the program after each pass of the target's lowering pipeline
    (`codegen.passes.pipeline(target)`); a callable receives the text instead."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; loopir targets: {', '.join(TARGETS)}")
    dump = opts.pop("dump_passes", False)
    program = with_args(to_program(obj, target, args), args)
    program = lower(program, target, dump=dump)
    if target == "cuda":
        from .cuda.build import build_cuda

        return build_cuda(program, **opts)
    for o in opts:
        if o not in _CPU_OPTS:
            raise TypeError(f"build: unknown option {o!r} for target 'cpu' (known: {', '.join(_CPU_OPTS)})")
    return CpuModule(program, compile_cpu(program), threads=opts.get("threads"))


def compile_cpu(program: Program) -> Any:
    """The cached native kernel of `program` (compiled at the first request)."""
    from .llvm.runtime import CpuKernel
    from .llvm import generate

    key = structural_key(program)
    with _cache_lock:
        hit = _cache.get(key)
    if hit is not None:
        return hit
    name = "".join(c if c.isalnum() or c == "_" else "_" for c in program.name) or "kernel"
    kernel = CpuKernel(generate(program, name))
    with _cache_lock:
        return _cache.setdefault(key, kernel)


def cache_clear() -> None:
    with _cache_lock:
        _cache.clear()


def cache_size() -> int:
    return len(_cache)
