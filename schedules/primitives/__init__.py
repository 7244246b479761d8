"""The primitive registry and the IR helpers primitives share.

A primitive is a pure function `fn(program, *args, **kwargs)` returning the new Program, or
`(new_program, result)` where result is a loop Var, a tuple of them, or None. Arguments
arrive resolved: loop handles become the loop `Var`, tensors and buffers become their name
(str); everything else as given. Register it with

    @primitive("split", check="order")
    def split(program, loop, factor): ...

and it becomes the method `Schedule.split(...)`. The Schedule resolves handles, calls the
function, checks legality (unless the schedule was built with check=False), records the step
in the trace and turns Var results into loop handles (None -> the schedule, for chaining).

`check` is one of
  "order"   the new program must run every dependence source before its sink (poly.find_violation);
  "carried" the loop given as first argument must carry no dependence in the new program
            (poly.carried_by; for parallel / vectorize / bind);
  None      no check (the step cannot change the execution order, e.g. unroll);
  callable  `check(ctx: CheckContext) -> Witness | None` for anything else.
`hint(ctx, witness) -> str | None` adds advice to the error message. `takes_deps=True` passes the
schedule's `poly.Deps` as the function's second argument. `rebase=True` means the step changes
the set of statement instances (e.g. compute_inline): its check must be a callable, and the
schedule then recomputes the dependences from the new program.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from loopir.errors import ArgumentError, NotFoundError
from loopir.nodes import Allocate, Expr, For, If, Program, Seq, Stmt, Store, Var
from loopir.poly import Deps, Witness
from loopir.visit import Transformer, loop_vars, subst_loops, walk_stmts

__all__ = [
    "primitive",
    "PrimitiveSpec",
    "CheckContext",
    "REGISTRY",
    "find_loop",
    "loop_path",
    "find_loop_path",
    "replace_loop",
    "subst_loops",
    "fresh_name",
    "loop_vars",
    "all_names",
    "const_extent",
    "only_stmt",
]


@dataclass
class CheckContext:
    """What a custom check or hint gets: the dependences, the programs before and after, the
    resolved arguments and the primitive's result."""

    _deps: Deps | Callable[[], Deps]  # or how to get them: computed at the first use (a check may need none)
    old: Program
    new: Program
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    result: Any = None
    name: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def deps(self) -> Deps:
        if callable(self._deps):
            self._deps = self._deps()
        return self._deps


@dataclass(frozen=True)
class PrimitiveSpec:
    name: str
    fn: Callable[..., Any]
    check: str | Callable[[CheckContext], Witness | None] | None = "order"
    hint: Callable[[CheckContext, Witness], str | None] | None = None
    takes_deps: bool = False
    rebase: bool = False


REGISTRY: dict[str, PrimitiveSpec] = {}


def primitive(name: str, *, check: str | Callable[[CheckContext], Witness | None] | None = "order",
              hint: Callable[[CheckContext, Witness], str | None] | None = None, takes_deps: bool = False,
              rebase: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register `fn` as the Schedule method `name` (see the module docstring)."""
    if check not in ("order", "carried", None) and not callable(check):
        raise ArgumentError(f"check of primitive {name!r} must be 'order', 'carried', None or a callable, "
                            f"got {check!r}")

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        REGISTRY[name] = PrimitiveSpec(name, fn, check, hint, takes_deps, rebase)
        return fn

    return deco


# ----------------------------------------------------------------------------- IR helpers


def all_names(program: Program) -> set[str]:
    """Names in use: loop variables, iteration variables, sizes, buffers."""
    names = {v.name for v in loop_vars(program)} | {p.name for p in program.params}
    for n in walk_stmts(program):
        if isinstance(n, Store):
            names |= {v.name for v in n.iters}
            names.add(n.buffer.name)
    names |= {b.name for b in program.args} | {b.name for b in program.temps}
    return names


def fresh_name(program: Program, base: str, taken: set[str] | None = None) -> str:
    """`base`, or `base2`, `base3`... — a name not used in `program` (nor in `taken`)."""
    used = all_names(program) | (taken or set())
    if base not in used:
        return base
    k = 2
    while f"{base}{k}" in used:
        k += 1
    return f"{base}{k}"


Path = tuple[tuple[Stmt, int], ...]  # (ancestor, child index in it; -1 for a single body)


def find_path(body: Stmt, match: Callable[[Stmt], bool]) -> tuple[Stmt, Path] | None:
    """The first statement (pre-order) for which `match` holds, with the path of (ancestor, child
    index) down to it; the child index is -1 for the body of a For or Allocate."""

    def go(s: Stmt, path: Path) -> tuple[Stmt, Path] | None:
        if match(s):
            return s, path
        if isinstance(s, Seq):
            for k, c in enumerate(s.body):
                r = go(c, path + ((s, k),))
                if r is not None:
                    return r
        elif isinstance(s, If):
            r = go(s.then, path + ((s, 0),))
            if r is None and s.orelse is not None:
                r = go(s.orelse, path + ((s, 1),))
            return r
        elif isinstance(s, (For, Allocate)):
            return go(s.body, path + ((s, -1),))
        return None

    return go(body, ())


def const_extent(f: For, from_zero: bool = False) -> int | None:
    """hi - lo of a loop whose bounds are integer constants (with `from_zero`, only when lo is 0), else None."""
    lo, hi = getattr(f.lo, "value", None), getattr(f.hi, "value", None)
    ok = isinstance(lo, int) and isinstance(hi, int) and (lo == 0 or not from_zero)
    return hi - lo if ok else None  # type: ignore[operator]


def only_stmt(s: Stmt) -> Stmt:
    """`s` without the Seqs of one statement around it."""
    while isinstance(s, Seq) and len(s.body) == 1:
        s = s.body[0]
    return s


def find_loop_path(body: Stmt, var: Var) -> tuple[For, Path] | None:
    """The For whose variable is `var`, with the path of (ancestor, child index) down to it."""
    return find_path(body, lambda s: isinstance(s, For) and s.var is var)  # type: ignore[return-value]


def loop_path(program: Program, var: Var) -> list[Stmt] | None:
    """The chain of statements from the body root down to the For of `var` (inclusive), or None."""
    found = find_loop_path(program.body, var)
    return None if found is None else [a for a, _ in found[1]] + [found[0]]


def find_loop(program: Program, var: Var) -> For:
    """The For of loop variable `var`; ValueError naming it if absent."""
    for n in walk_stmts(program):
        if isinstance(n, For) and n.var is var:
            return n
    raise NotFoundError(f"loop {var.name!r} is not in program {program.name!r}")


def replace_loop(program: Program, var: Var, new: Stmt) -> Program:
    """`program` with the For of `var` replaced by `new`."""
    find_loop(program, var)

    class _R(Transformer):
        def visit_For(self, f: For) -> Stmt:
            if f.var is var:
                return new
            return self.generic(f)

        def visit(self, node: Any) -> Any:
            if isinstance(node, Expr):
                return node
            return super().visit(node)

    return dataclasses.replace(program, body=_R().visit(program.body))
