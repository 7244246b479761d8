"""One visitor and one transformer for every node, plus the walks everyone needs.

A `Transformer` method returns a node; returning the very same object means
"unchanged", and a parent whose children all come back unchanged is itself returned
unchanged (no copy). Override `visit_<ClassName>` for the nodes you care about and call
`self.generic(node)` to recurse into the rest.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from typing import Any

from .nodes import Allocate, Buffer, Expr, For, If, Load, Node, Program, Seq, Stmt, Store, Var


@cache
def _child_fields(cls: type) -> tuple[str, ...]:
    # Buffers are leaves: their shapes are walked only where asked (free_vars does).
    return tuple(f.name for f in dataclasses.fields(cls) if f.name not in ("buffer",))


class Visitor:
    """Read-only walk; `visit_<Class>` hooks, `generic` recurses."""

    def visit(self, node: Any) -> None:
        fn = getattr(self, "visit_" + type(node).__name__, None)
        if fn is not None:
            fn(node)
        else:
            self.generic(node)

    def generic(self, node: Any) -> None:
        if not isinstance(node, Node) or isinstance(node, (Var, Buffer)):
            return
        for name in _child_fields(type(node)):
            v = getattr(node, name)
            if isinstance(v, tuple):
                for x in v:
                    if isinstance(x, Node):
                        self.visit(x)
            elif isinstance(v, Node):
                self.visit(v)


class Transformer:
    """Rebuilding walk; returning the same node means unchanged."""

    def visit(self, node: Any) -> Any:
        fn = getattr(self, "visit_" + type(node).__name__, None)
        return fn(node) if fn is not None else self.generic(node)

    def generic(self, node: Any) -> Any:
        if not isinstance(node, Node) or isinstance(node, (Var, Buffer)):
            return node
        changes: dict[str, Any] = {}
        for name in _child_fields(type(node)):
            v = getattr(node, name)
            if isinstance(v, tuple):
                nv = tuple(self.visit(x) if isinstance(x, Node) else x for x in v)
                if any(a is not b for a, b in zip(nv, v)):
                    changes[name] = nv
            elif isinstance(v, Node):
                nv = self.visit(v)
                if nv is not v:
                    changes[name] = nv
        return dataclasses.replace(node, **changes) if changes else node


def walk(node: Node, prune: Callable[[Node], bool] | None = None) -> Iterator[Node]:
    """Every node below `node` (pre-order), Buffers excluded, and with `prune` the subtrees of the nodes for which
    it is true. Iterative: any depth."""
    out: list[Node] = []
    stack: list[Any] = [node]
    while stack:
        n = stack.pop()
        if not isinstance(n, Node) or isinstance(n, Buffer) or (prune is not None and prune(n)):
            continue
        out.append(n)
        if isinstance(n, Var):
            continue
        kids: list[Any] = []
        for name in _child_fields(type(n)):
            v = getattr(n, name)
            if isinstance(v, tuple):
                kids.extend(x for x in v if isinstance(x, Node))
            elif isinstance(v, Node):
                kids.append(v)
        stack.extend(reversed(kids))
    return iter(out)


DEEP_LIMIT = 20_000  # Python frames allowed inside `deep_recursion` (expressions ~2,000 operators deep)


@contextmanager
def deep_recursion(limit: int = DEEP_LIMIT) -> Iterator[None]:
    """Raise Python's recursion limit for the duration (the recursive visitors of deep programs:
    expressions hundreds of operators deep, chains of thousands of stages); restored after."""
    old = sys.getrecursionlimit()
    if old >= limit:
        yield
        return
    sys.setrecursionlimit(limit)
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


def walk_stmts(node: Program | Stmt) -> Iterator[Stmt]:
    """Every statement below `node` (pre-order), without descending into expressions: the cheap
    walk for questions about loops and statements."""
    stack: list[Stmt] = [node.body if isinstance(node, Program) else node]
    while stack:
        s = stack.pop()
        yield s
        if isinstance(s, Seq):
            stack.extend(reversed(s.body))
        elif isinstance(s, If):
            if s.orelse is not None:
                stack.append(s.orelse)
            stack.append(s.then)
        elif isinstance(s, (For, Allocate)):
            stack.append(s.body)


def substitute(node: Any, mapping: dict[Var, Expr]) -> Any:
    """Replace variables (by identity) in an expression or statement."""
    if not mapping:
        return node

    class _S(Transformer):
        def visit_Var(self, v: Var) -> Expr:
            return mapping.get(v, v)

    return _S().visit(node)


def free_vars(node: Any) -> set[Var]:
    """The variables `node` uses (loop variables and sizes), buffer shapes included. Iterative."""
    found: set[Var] = set()
    for n in walk(node):
        if isinstance(n, Var):
            found.add(n)
        elif isinstance(n, (Load, Store)):
            for e in n.buffer.shape:
                found.update(x for x in walk(e) if isinstance(x, Var))
    return found


def buffers_of(node: Any) -> tuple[list[Buffer], list[Buffer]]:
    """(read buffers, written buffers) of a statement or expression, in first-use order."""
    reads: dict[Buffer, None] = {}
    writes: dict[Buffer, None] = {}
    for n in walk(node):
        if isinstance(n, Load):
            reads.setdefault(n.buffer, None)
        elif isinstance(n, Store):
            writes.setdefault(n.buffer, None)
    return list(reads), list(writes)


@dataclass(frozen=True, slots=True)
class StmtContext:
    """A statement with what surrounds it, outermost first.

    `path` holds the For, If and Allocate nodes around it; `position` the index of each
    enclosing Seq child taken on the way down (the textual order)."""

    store: Store
    loops: tuple[For, ...]
    guards: tuple[Expr, ...]
    path: tuple[Stmt, ...]
    position: tuple[int, ...]


def statements(node: Program | Stmt) -> list[StmtContext]:
    """Every Store in textual order, with its loops, guards and textual position.

    The `orelse` branch of an If contributes the negated condition as its guard."""
    body = node.body if isinstance(node, Program) else node
    out: list[StmtContext] = []

    def go(
        s: Stmt, loops: tuple[For, ...], guards: tuple[Expr, ...], path: tuple[Stmt, ...], pos: tuple[int, ...]
    ) -> None:
        if isinstance(s, Store):
            out.append(StmtContext(s, loops, guards, path, pos))
        elif isinstance(s, Seq):
            for k, c in enumerate(s.body):
                go(c, loops, guards, path, pos + (k,))
        elif isinstance(s, For):
            go(s.body, loops + (s,), guards, path + (s,), pos)
        elif isinstance(s, If):
            go(s.then, loops, guards + (s.cond,), path + (s,), pos + (0,))
            if s.orelse is not None:
                go(s.orelse, loops, guards + (~s.cond,), path + (s,), pos + (1,))
        elif isinstance(s, Allocate):
            go(s.body, loops, guards, path + (s,), pos)

    go(body, (), (), (), ())
    return out


def map_stmts(node: Stmt, fn: Callable[[Stmt], Stmt | None]) -> Stmt:
    """Rebuild `node`, replacing each statement `s` for which `fn(s)` is not None (pre-order)."""

    class _M(Transformer):
        def visit(self, n: Any) -> Any:
            if isinstance(n, Stmt):
                r = fn(n)
                if r is not None:
                    return r
            if isinstance(n, Expr):
                return n
            return super().visit(n)

    return _M().visit(node)


def seq(*stmts: Stmt | None) -> Stmt:
    """A Seq of the given statements, flattened; a single statement is returned as is."""
    flat: list[Stmt] = []
    for s in stmts:
        if s is None:
            continue
        if isinstance(s, Seq):
            flat.extend(s.body)
        else:
            flat.append(s)
    return flat[0] if len(flat) == 1 else Seq(tuple(flat))


__all__ = [
    "Visitor",
    "Transformer",
    "walk",
    "walk_stmts",
    "deep_recursion",
    "DEEP_LIMIT",
    "substitute",
    "free_vars",
    "buffers_of",
    "StmtContext",
    "statements",
    "map_stmts",
    "seq",
    "loops_of",
    "body_list",
    "stmt_names",
    "subst_coords",
    "loop_vars",
    "subst_loops",
    "path_to",
]


def loops_of(s: Stmt) -> list[For]:
    """Every For below `s` (pre-order, `s` itself included)."""
    return [n for n in walk(s) if isinstance(n, For)]


def path_to(root: Stmt, target: Stmt) -> list[Stmt] | None:
    """The statements enclosing `target` (`root` first, `target` left out) on the first path that reaches
    it through For / Allocate bodies, Seq items and If branches; None when `target` is not below `root`."""
    if root is target:
        return []
    kids: list[Stmt] = []
    if isinstance(root, (For, Allocate)):
        kids = [root.body]
    elif isinstance(root, Seq):
        kids = list(root.body)
    elif isinstance(root, If):
        kids = [root.then] + ([root.orelse] if root.orelse is not None else [])
    for k in kids:
        inner = path_to(k, target)
        if inner is not None:
            return [root, *inner]
    return None


def body_list(s: Stmt) -> list[Stmt]:
    """The statements of a Seq, or `[s]`."""
    return list(s.body) if isinstance(s, Seq) else [s]


def stmt_names(s: Stmt) -> list[str]:
    """The names of the Stores below `s`, in order (with repeats)."""
    return [n.name for n in walk(s) if isinstance(n, Store)]


def subst_coords(st: Store) -> dict[Var, Expr]:
    """The substitution from a Store's iteration variables to its coords (identity pairs left out)."""
    return {it: c for it, c in zip(st.iters, st.coords) if c is not it}


def loop_vars(program: Program | Stmt) -> list[Var]:
    """Loop variables in pre-order."""
    return [n.var for n in walk_stmts(program) if isinstance(n, For)]


def subst_loops(stmt: Stmt, mapping: dict[Var, Expr]) -> Stmt:
    """Replace loop variables in loop bounds, guards and statement coords — never in a
    statement's indices or value (those are in its original iteration variables)."""
    if not mapping:
        return stmt

    class _S(Transformer):
        def visit_Store(self, s: Store) -> Store:
            coords = tuple(substitute(c, mapping) for c in s.coords)
            if all(a is b for a, b in zip(coords, s.coords)):
                return s
            return dataclasses.replace(s, coords=coords)

        def visit_For(self, f: For) -> For:
            lo, hi, body = substitute(f.lo, mapping), substitute(f.hi, mapping), self.visit(f.body)
            if lo is f.lo and hi is f.hi and body is f.body:
                return f
            return dataclasses.replace(f, lo=lo, hi=hi, body=body)

        def visit_If(self, s: If) -> If:
            c = substitute(s.cond, mapping)
            t = self.visit(s.then)
            o = self.visit(s.orelse) if s.orelse is not None else None
            if c is s.cond and t is s.then and o is s.orelse:
                return s
            return If(c, t, o)

    return _S().visit(stmt)
