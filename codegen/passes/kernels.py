"""Kernel boundaries from the schedule: a serial loop that encloses grid-bound loops is a host loop.

A GPU kernel has no grid-wide barrier: the blocks of one launch run in any order, concurrently. A
serial loop that encloses loops bound to `blockIdx.*` (the time loop of a scan, of an LSTM: step t
reads what every block wrote in step t - 1) therefore cannot run inside one kernel; it runs on the
host, one launch (or one sequence of launches) per iteration, and the launches order the steps:

    for t in range(1, T):                          for t in host(1, T):
        for j_o in range(0, nb):  # blockIdx.x ==>     for j_o in range(0, nb):  # blockIdx.x
            for j_i in ...:  # threadIdx.x                 for j_i in ...:  # threadIdx.x

The contract with the passes after this one and with the CUDA renderer (`codegen.cuda`):

* host level: the program body, the body of a host loop, and the branches of an `If` whose
  branches contain host loops (its condition is evaluated on the host);
* a kernel is a statement at host level that is not a host loop, not such an `If`, and not a `Seq`
  at host level (a `Seq` at host level is a sequence of kernels); a kernel may sit under host loops
  and reads their variables as kernel parameters;
* a dependence carried by a host loop, or between two kernels, is ordered by the launches; only the
  dependences inside one kernel are the barrier pass's business.

`kernels(program)` lists the kernels with their enclosing host loops, `map_kernels(program, fn)`
rewrites each kernel; both follow that contract (the barrier pass and the renderer use them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

from loopir.nodes import Allocate, For, If, Program, Seq, Stmt
from loopir.visit import walk

# loop kinds that run their iterations one after another, so a dependence between iterations may need
# every block of one iteration finished before the next starts
_SEQUENTIAL = ("serial", "unroll", "host")


def _encloses_grid(s: Stmt) -> bool:
    return any(isinstance(n, For) and n.kind == "thread" and (n.thread or "").startswith("blockIdx") for n in walk(s))


def has_host_loops(s: Stmt) -> bool:
    """True when `s` is or contains a host loop (then it is at host level, not a kernel)."""
    return any(isinstance(n, For) and n.kind == "host" for n in walk(s))


def _split(s: Stmt) -> Stmt:
    """`s` at host level with its sequential loops that enclose grid-bound loops made host loops."""
    if isinstance(s, For):
        if s.kind == "thread" or not _encloses_grid(s.body):
            return s  # a kernel (or a part of one): left as scheduled
        body = _split(s.body)
        if s.kind not in _SEQUENTIAL and not has_host_loops(body):
            return s  # a parallel loop around grid-bound loops: independent iterations, one kernel is fine
        if s.kind == "host" and body is s.body:
            return s
        # a sequential loop, or any loop around a host loop (a kernel cannot hold a loop of launches)
        return dataclasses.replace(s, kind="host", body=body)
    if isinstance(s, Seq):
        body = tuple(_split(c) for c in s.body)
        return s if all(a is b for a, b in zip(body, s.body)) else Seq(body)
    if isinstance(s, If):
        then = _split(s.then)
        orelse = None if s.orelse is None else _split(s.orelse)
        return s if then is s.then and orelse is s.orelse else If(s.cond, then, orelse)
    if isinstance(s, Allocate):
        body = _split(s.body)
        return s if body is s.body else Allocate(s.buffer, body)
    return s


def split_kernels(program: Program) -> Program:
    """Turn every sequential loop that encloses loops bound to blockIdx.* into a host loop of launches.

    Formal condition: after it, a loop outside every bound loop has kind "host" iff its body contains a loop
    bound to blockIdx.* and it was serial, unroll or host or encloses such a loop; nothing else changes.
    """
    body = _split(program.body)
    return program if body is program.body else dataclasses.replace(program, body=body)


def kernels(program: Program) -> Iterator[tuple[tuple[For, ...], Stmt]]:
    """The kernels of `program` in launch order, each with the host loops around it (outermost first).

    A nested `Seq` inside a top-level `Seq` that holds no host loop stays one kernel (as the renderer
    has always done); every other `Seq` at host level is a sequence of kernels."""

    def go(s: Stmt, loops: tuple[For, ...], top: bool) -> Iterator[tuple[tuple[For, ...], Stmt]]:
        if isinstance(s, Seq) and (top or has_host_loops(s)):
            for c in s.body:
                yield from go(c, loops, False)
        elif isinstance(s, For) and s.kind == "host":
            yield from go(s.body, (*loops, s), True)
        elif isinstance(s, If) and has_host_loops(s):
            yield from go(s.then, loops, True)
            if s.orelse is not None:
                yield from go(s.orelse, loops, True)
        elif isinstance(s, Allocate) and has_host_loops(s):
            yield from go(s.body, loops, True)
        else:
            yield loops, s

    yield from go(program.body, (), True)


def map_kernels(program: Program, fn: Callable[[Stmt], Stmt]) -> Program:
    """`program` with every kernel `k` (see `kernels`) replaced by `fn(k)`; the host structure is kept."""

    def go(s: Stmt, top: bool) -> Stmt:
        if isinstance(s, Seq) and (top or has_host_loops(s)):
            body = tuple(go(c, False) for c in s.body)
            return s if all(a is b for a, b in zip(body, s.body)) else Seq(body)
        if isinstance(s, For) and s.kind == "host":
            body = go(s.body, True)
            return s if body is s.body else dataclasses.replace(s, body=body)
        if isinstance(s, If) and has_host_loops(s):
            then = go(s.then, True)
            orelse = None if s.orelse is None else go(s.orelse, True)
            return s if then is s.then and orelse is s.orelse else If(s.cond, then, orelse)
        if isinstance(s, Allocate) and has_host_loops(s):
            body = go(s.body, True)
            return s if body is s.body else Allocate(s.buffer, body)
        return fn(s)

    body = go(program.body, True)
    return program if body is program.body else dataclasses.replace(program, body=body)


__all__ = ["split_kernels", "kernels", "map_kernels", "has_host_loops"]
