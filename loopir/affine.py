"""Affine index expressions: their linear form, their evaluation, and the questions passes ask of them.

One home for the integer-index algebra every layer needs, so that the analysis, the schedule
primitives and each code generator read an index the same way:

- `linear_in(e, v)`: `e` as `c*v + rest` with `rest` free of `v` (guard tightening, strides);
- `access_pattern(indices, v)`: how an access moves with loop `v` (uniform, contiguous, other);
- `eval_index(e, env)`: the value of an integer index at concrete sizes and loop values.

Expressions are built with the IR's own operators, so a result prints as the IR does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from .args import eval_expr
from .nodes import Binary, Const, Expr, Var
from .visit import walk

__all__ = ["access_pattern", "eval_index", "linear_in"]


def linear_in(e: Expr, v: Var) -> tuple[int, Expr] | None:
    """(c, rest) with e == c*v + rest, rest free of v; None if not of that form."""
    if e is v:
        return 1, Const(0, "int64")
    if not any(n is v for n in walk(e)):
        return 0, e
    if isinstance(e, Binary) and e.op in ("add", "sub"):
        a, b = linear_in(e.a, v), linear_in(e.b, v)
        if a is None or b is None:
            return None
        return (a[0] + b[0], a[1] + b[1]) if e.op == "add" else (a[0] - b[0], a[1] - b[1])
    if isinstance(e, Binary) and e.op == "mul":
        for x, y in ((e.a, e.b), (e.b, e.a)):
            if isinstance(y, Const) and isinstance(y.value, int):
                lx = linear_in(x, v)
                if lx is not None:
                    return lx[0] * y.value, lx[1] * y.value
    return None


def access_pattern(indices: tuple[Expr, ...], v: Var) -> Literal["uniform", "contig"] | None:
    """'uniform' if no index uses v; 'contig' if only the last does, as v + (free of v); else None."""
    uses = [any(n is v for n in walk(e)) for e in indices]
    if not any(uses):
        return "uniform"
    if any(uses[:-1]):
        return None
    lin = linear_in(indices[-1], v)
    return "contig" if lin is not None and lin[0] == 1 else None


def eval_index(e: Expr, env: Mapping[Var, int]) -> int:
    """Value of an integer index expression at concrete values of its variables, with Python's floor
    semantics for `//` and `%` (as the loop IR has); ValueError naming a variable without a value."""
    return int(eval_expr(e, env))
