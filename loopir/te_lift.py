"""Inline reductions: every `te.sum / te.max / te.min` that is not the whole body of its stage becomes a
stage of its own (Halide's behaviour), so a user may write layer norm as people write it:

    y = te.compute((m, n), lambda i, j: x[i, j] - te.sum(x[i, k], axis=k) / n, name="y")

is the program

    y.sum0[i] = sum_k x[i, k]                  # over (m,): only the axes of y its operand uses
    y[i, j] = x[i, j] - y.sum0[i] / n

The lifted stage is a function of the enclosing stage's axes that its operand (or its bounds) uses, in
the enclosing order, then of the reduce axes of enclosing reductions it uses (outer first; a reduction
inside another reduction's operand); its own reduce axes stay its reduce axes. Inner reductions are
lifted first, so an outer one reads the inner one's stage. Two reductions equal up to the names of
their reduce axes become one stage (`mu` written once and used twice in a body is computed once). A
reduce axis that a second reduction of the same body reuses gets a fresh copy (each stage owns its
loop variables); an enclosing reduction's axis whose bounds depend on loop variables cannot be a
dimension of a stage and is refused. Stages are named `<stage>.<op><k>` (`y.sum0`, `y.max1`): the dot
keeps them apart from every user name, which must be an identifier.

This module holds the te-only `Reduce` node, so that `te` (which makes the stages: the `make` callback
of `lift`) can import the lifting without a circle; `te.Reduce` is the same class.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import ArgumentError
from .nodes import Const, Expr, Load, Var
from .visit import Transformer, deep_recursion, substitute, walk

Dom = tuple[Expr, Expr]
# (name, shape, axis, reduction, bounds of its reduce axes) -> the new stage's tensor (anything with .buffer)
MakeStage = Callable[[str, tuple[Expr, ...], tuple[Var, ...], "Reduce", tuple[Dom, ...]], Any]


@dataclass(frozen=True, slots=True)
class Reduce(Expr):
    """`op` (sum / max / min) of `body` over the reduce axes `axis`. Exists only in te:
    `lower` turns it into an init statement and an update statement."""

    op: str
    body: Expr
    axis: tuple[Var, ...]
    dtype: str

    def __repr__(self) -> str:
        return f"Reduce({self.op}, axis={[a.name for a in self.axis]})"


def has_reduce(e: Expr) -> bool:
    return any(isinstance(n, Reduce) for n in walk(e))


# stand-ins for reduce axes when comparing two reductions up to the names of their axes
_CANON = tuple(Var(f"_r{k}") for k in range(8))


class _Lifter(Transformer):
    def __init__(self, stage: str, shape: tuple[Expr, ...], axis: tuple[Var, ...],
                 dom_of: Callable[[Var], Dom], make: MakeStage, claimed: set[Var]) -> None:
        self.stage, self.shape, self.axis = stage, shape, axis
        self.dom_of, self.make = dom_of, make
        self.claimed = claimed  # reduce axes some stage of this body already owns (clone on reuse)
        self.scope: list[tuple[Var, ...]] = []  # axes of the enclosing reductions, outer first
        self.done: list[tuple[tuple[Any, ...], Any, tuple[Var, ...]]] = []  # (key, tensor, its stage axes)
        self.lifted: list[Any] = []
        self.count = itertools.count()

    def visit_Reduce(self, r: Reduce) -> Expr:
        return self.lift(self.inner(r))

    def inner(self, r: Reduce) -> Reduce:
        """`r` with the reductions inside its operand lifted (inner first)."""
        self.scope.append(r.axis)
        try:
            body = self.visit(r.body)
        finally:
            self.scope.pop()
        return r if body is r.body else dataclasses.replace(r, body=body)

    def lift(self, r: Reduce) -> Expr:
        doms = [self.dom_of(k) for k in r.axis]
        free = set().union(*(_vars(e) for e in [r.body, *itertools.chain(*doms)])) - set(r.axis)
        outer = [v for v in self.axis if v in free]
        enclosing = [k for frame in self.scope for k in frame if k in free]
        key = _key(r, doms, outer + enclosing)
        for k, t, _ in self.done:
            if k == key:
                return self._read(t, outer, enclosing)
        new_vars: dict[Var, Var] = {}
        taken = {k.name for k in r.axis}
        shape: list[Expr] = []
        for v in outer:
            new_vars[v] = Var(_fresh(v.name, taken), v.dtype)
            shape.append(self.shape[self.axis.index(v)])
        offsets: dict[Var, Expr] = {}
        for k in enclosing:
            lo, hi = self.dom_of(k)
            bad = sorted(x.name for x in _vars(lo) | _vars(hi) if x in set(self.axis) or x in self._scoped())
            if bad:
                raise ArgumentError(
                    f"compute {self.stage!r}: a {r.op} inside the reduction over {k.name!r} uses {k.name!r}, whose "
                    f"bounds depend on the loop variable(s) {', '.join(bad)}; it cannot be lifted into a stage of "
                    "its own: compute it in a stage you write"
                )
            new_vars[k] = Var(_fresh(k.name, taken), k.dtype)
            offsets[k] = lo
            shape.append(_sub(hi, lo))
        mapping: dict[Var, Expr] = {v: nv if v not in offsets else nv + offsets[v] for v, nv in new_vars.items()}
        red_axes = []
        for k in r.axis:  # a reduce axis used again gets a copy: each stage owns its loop variables
            mapping[k] = k if k not in self.claimed else Var(k.name, k.dtype)
            self.claimed.add(mapping[k])  # type: ignore[arg-type]
            red_axes.append(mapping[k])
        body = substitute(r.body, mapping)
        new_doms = tuple((substitute(lo, mapping), substitute(hi, mapping)) for lo, hi in doms)
        node = Reduce(r.op, body, tuple(red_axes), r.dtype)  # type: ignore[arg-type]
        name = f"{self.stage}.{r.op}{next(self.count)}"
        t = self.make(name, tuple(shape), tuple(new_vars.values()), node, new_doms)
        self.done.append((key, t, tuple(outer + enclosing)))
        self.lifted.append(t)
        return self._read(t, outer, enclosing)

    def _scoped(self) -> set[Var]:
        return {k for frame in self.scope for k in frame}

    def _read(self, t: Any, outer: list[Var], enclosing: list[Var]) -> Expr:
        idx = tuple(outer) + tuple(_sub(k, self.dom_of(k)[0]) for k in enclosing)
        return Load(t.buffer, idx)


def _vars(e: Expr) -> set[Var]:
    return {n for n in walk(e) if isinstance(n, Var)}


def _sub(a: Expr, b: Expr) -> Expr:
    return a if isinstance(b, Const) and b.value == 0 else a - b


def _fresh(name: str, taken: set[str]) -> str:
    out = name
    for n in itertools.count(1):
        if out not in taken:
            break
        out = f"{name}{n}"
    taken.add(out)
    return out


def _key(r: Reduce, doms: list[Dom], used: list[Var]) -> tuple[Any, ...]:
    """What makes two reductions the same stage: op, dtype, operand and bounds with the reduce axes
    replaced by stand-ins, and the variables it is a function of."""
    canon = _CANON if len(r.axis) <= len(_CANON) else tuple(Var(f"_r{k}") for k in range(len(r.axis)))
    m: dict[Var, Expr] = dict(zip(r.axis, canon))
    bounds = tuple((substitute(lo, m), substitute(hi, m)) for lo, hi in doms)
    return (r.op, r.dtype, substitute(r.body, m), bounds, tuple(used))


def lift(stage: str, shape: tuple[Expr, ...], axis: tuple[Var, ...], body: Expr,
         dom_of: Callable[[Var], Dom], make: MakeStage) -> tuple[Expr, tuple[Any, ...]]:
    """(`body` with every reduction that is not the whole of it replaced by a read of its own stage,
    the stages made for them by `make`, in the order made: inner reductions first).

    The variables of `body` must have been checked (every reduce axis used inside a reduction over
    it, no loop variable of another stage)."""
    if not has_reduce(body):
        return body, ()
    top = body.axis if isinstance(body, Reduce) else ()
    lifter = _Lifter(stage, shape, axis, dom_of, make, set(top))
    with deep_recursion():
        out = lifter.inner(body) if isinstance(body, Reduce) else lifter.visit(body)
    return out, tuple(lifter.lifted)


__all__ = ["Reduce", "has_reduce", "lift"]
