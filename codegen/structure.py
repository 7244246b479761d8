"""The structural key of a program: equal for programs that differ only in names and object identity (the CPU
compile cache's key in `build`, the tuning database's workload key in `codegen.tune.keys`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from loopir.nodes import Buffer, Node, Program, Var

__all__ = ["structural_key"]


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
