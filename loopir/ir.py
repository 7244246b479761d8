"""An imperative builder for loop-IR programs: what tensor expressions cannot say
(in-place updates, stencils, scans, triangular loops).

    n = te.var("n")
    A = ir.buffer((n,), dtype="float32", name="A")
    b = ir.Builder("prefix_sum")
    with b.loop("i", 1, n) as i:                 # half-open: 1 <= i < n
        b.store(A, (i,), A[i - 1] + A[i], name="S")
    prog = b.finish([A])                          # the program's arguments, in call order

A store's iteration variables are the loops around it, outermost first (so `coords ==
iters`, as for a freshly lowered program). Values: a Python scalar takes the buffer's dtype;
an expression of another dtype is refused (write `nodes.cast(dtype, x)` / `te.cast`), so no
conversion ever happens silently.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from .errors import ArgumentError, ArgumentTypeError
from .dtypes import check_dtype
from .nodes import (
    Allocate,
    Barrier,
    Buffer,
    Const,
    Expr,
    ExprLike,
    For,
    If,
    Program,
    SCOPES,
    Stmt,
    Store,
    Var,
    as_expr,
    as_index,
)
from .visit import free_vars, seq, walk

_auto_names = itertools.count()


def buffer(shape: Sequence[ExprLike], dtype: str = "float32", name: str | None = None, scope: str = "global") -> Buffer:
    """A dense row-major array of `shape` (ints or integer expressions of size variables)."""
    if name is None:
        name = f"buf{next(_auto_names)}"
    if not isinstance(name, str) or not name.isidentifier():
        raise ArgumentError(f"buffer name {name!r} is not an identifier")
    if isinstance(shape, (int, Expr)):
        shape = (shape,)
    dims = tuple(as_index(d, f"dimension {k} of buffer {name!r}") for k, d in enumerate(shape))
    if scope not in SCOPES:
        raise ArgumentError(f"unknown scope {scope!r} for buffer {name!r}; known: {', '.join(SCOPES)}")
    return Buffer(name, dims, check_dtype(dtype, f"dtype of buffer {name!r}"), scope)


class _Frame:
    """The statements being collected inside one open loop / if / allocate."""

    __slots__ = ("stmts", "var", "what")

    def __init__(self, what: str, var: Var | None = None) -> None:
        self.stmts: list[Stmt] = []
        self.var = var
        self.what = what


class Builder:
    """Collects statements into a Program; see the module docstring."""

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not name.isidentifier():
            raise ArgumentError(f"program name {name!r} is not an identifier")
        self.name = name
        self._frames: list[_Frame] = [_Frame("program")]
        self._names: set[str] = set()
        self._loop_vars: set[Var] = set()
        self._temps: list[Buffer] = []
        self._counter = 0

    # -------------------------------------------------------------------- structure

    def _enclosing(self) -> list[Var]:
        return [f.var for f in self._frames if f.var is not None]

    def _check_scope(self, e: Expr | Stmt, what: str) -> None:
        """Loop variables of this builder used in `e` must belong to enclosing loops."""
        open_vars = set(self._enclosing())
        for v in free_vars(e):
            if v in self._loop_vars and v not in open_vars:
                raise ArgumentError(f"loop variable {v.name!r} is used outside its loop, in {what}")

    @contextmanager
    def loop(self, name: str, lo: ExprLike, hi: ExprLike, kind: str = "serial") -> Iterator[Var]:
        """`for name in range(lo, hi)` (half-open); yields the loop variable."""
        if not isinstance(name, str) or not name.isidentifier():
            raise ArgumentError(f"loop name {name!r} is not an identifier")
        if any(v.name == name for v in self._enclosing()):
            raise ArgumentError(f"loop {name!r} is nested inside another loop named {name!r}; use a different name")
        if kind not in ("serial", "parallel", "unroll", "vectorize"):
            raise ArgumentError(f"unknown loop kind {kind!r} for loop {name!r} (bind GPU axes with a schedule)")
        lo_e = as_index(lo, f"lower bound of loop {name!r}")
        hi_e = as_index(hi, f"upper bound of loop {name!r}")
        for bound in (lo_e, hi_e):
            self._check_scope(bound, f"the bounds of loop {name!r}")
        var = Var(name)
        self._loop_vars.add(var)
        frame = _Frame(f"loop {name!r}", var)
        self._frames.append(frame)
        try:
            yield var
        finally:
            popped = self._frames.pop()
            assert popped is frame, "builder contexts closed out of order"
        self._append(For(var, lo_e, hi_e, seq(*frame.stmts), kind))

    @contextmanager
    def if_(self, cond: Expr) -> Iterator[None]:
        """`if cond:` around the statements of the block."""
        if not isinstance(cond, Expr) or cond.dtype != "bool":
            shown = f"{cond} of dtype {cond.dtype}" if isinstance(cond, Expr) else repr(cond)
            raise ArgumentTypeError(f"the condition of if_ must be a comparison (dtype bool), got {shown}")
        self._check_scope(cond, "an if_ condition")
        frame = _Frame("if")
        self._frames.append(frame)
        try:
            yield
        finally:
            self._frames.pop()
        self._append(If(cond, seq(*frame.stmts)))

    @contextmanager
    def else_(self) -> Iterator[None]:
        """`else:` for the `if_` block just closed at this level."""
        parent = self._frames[-1].stmts
        if not parent or not isinstance(parent[-1], If) or parent[-1].orelse is not None:
            raise ArgumentError("else_() must directly follow an if_() block (without an else) at the same level")
        frame = _Frame("else")
        self._frames.append(frame)
        try:
            yield
        finally:
            self._frames.pop()
        last = parent[-1]
        assert isinstance(last, If)
        parent[-1] = If(last.cond, last.then, seq(*frame.stmts))

    @contextmanager
    def allocate(
        self, shape: Sequence[ExprLike], dtype: str = "float32", name: str | None = None, scope: str = "local"
    ) -> Iterator[Buffer]:
        """A scratch buffer live inside the block (`scope` "local" or "shared")."""
        buf = buffer(shape, dtype, name, scope)
        frame = _Frame("allocate")
        self._frames.append(frame)
        try:
            yield buf
        finally:
            self._frames.pop()
        self._append(Allocate(buf, seq(*frame.stmts)))

    def barrier(self) -> None:
        self._append(Barrier())

    def temp(self, shape: Sequence[ExprLike], dtype: str = "float32", name: str | None = None) -> Buffer:
        """A global intermediate buffer of the program (not an argument)."""
        buf = buffer(shape, dtype, name)
        self._temps.append(buf)
        return buf

    def _append(self, s: Stmt) -> None:
        self._frames[-1].stmts.append(s)

    # -------------------------------------------------------------------- statements

    def store(self, buf: Buffer, idx: ExprLike | Sequence[ExprLike], value: ExprLike, name: str | None = None) -> Store:
        """`buf[idx] = value` as a statement named `name` (default S0, S1, ...)."""
        if not isinstance(buf, Buffer):
            raise ArgumentTypeError(f"store() needs a buffer made with ir.buffer, got {type(buf).__name__} {buf!r}")
        if name is None:
            while f"S{self._counter}" in self._names:
                self._counter += 1
            name = f"S{self._counter}"
        if not isinstance(name, str) or not name.isidentifier():
            raise ArgumentError(f"statement name {name!r} is not an identifier")
        if name in self._names:
            raise ArgumentError(f"duplicate statement name {name!r} in program {self.name!r}")
        indices = tuple(idx) if isinstance(idx, (tuple, list)) else (idx,)
        if len(indices) != len(buf.shape):
            raise IndexError(
                f"statement {name!r}: buffer {buf.name!r} has {len(buf.shape)} dimension(s) "
                f"but the store gives {len(indices)} index(es)"
            )
        ix = tuple(as_index(i, f"index {k} of the store {name!r} to {buf.name!r}") for k, i in enumerate(indices))
        if isinstance(value, Expr):
            if value.dtype != buf.dtype:
                raise ArgumentTypeError(
                    f"statement {name!r} stores a {value.dtype} value into buffer {buf.name!r} of dtype {buf.dtype}; "
                    f"cast it explicitly (te.cast({buf.dtype!r}, ...))"
                )
            val = value
        elif isinstance(value, (bool, int, float)):
            if isinstance(value, float) and buf.dtype in ("int32", "int64", "bool"):
                raise ArgumentTypeError(
                    f"statement {name!r} stores float {value!r} into buffer {buf.name!r} of dtype {buf.dtype}"
                )
            val = as_expr(value, buffer_like(buf))
        else:
            raise ArgumentTypeError(f"statement {name!r}: cannot store {type(value).__name__} {value!r}")
        iters = tuple(self._enclosing())
        st = Store(name, buf, ix, val, iters, iters)
        self._check_scope(st, f"statement {name!r}")
        self._names.add(name)
        self._append(st)
        return st

    # -------------------------------------------------------------------- the program

    def finish(self, args: Sequence[Buffer]) -> Program:
        """The program with `args` (buffers, in call order). Every buffer it uses must be an
        argument, a `temp`, or allocated inside it."""
        if len(self._frames) > 1:
            open_ = ", ".join(f.what for f in self._frames[1:])
            raise RuntimeError(f"finish() called for program {self.name!r} while {open_} is still open")
        args = tuple(args)
        for a in args:
            if not isinstance(a, Buffer):
                raise ArgumentTypeError(
                    f"arguments of program {self.name!r} must be buffers, got {type(a).__name__} {a!r}")
        seen: set[Buffer] = set()
        for a in args:
            if a in seen:
                raise ArgumentError(f"buffer {a.name!r} is given twice in the arguments of program {self.name!r}")
            seen.add(a)
        for t in self._temps:
            if t in seen:
                raise ArgumentError(f"buffer {t.name!r} is both a temp and an argument of program {self.name!r}")
        names = [b.name for b in (*args, *self._temps)]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ArgumentError(f"two different buffers named {dup[0]!r} in program {self.name!r}")
        body = seq(*self._frames[0].stmts)

        allocated = {n.buffer for n in walk(body) if isinstance(n, Allocate)}
        used: dict[Buffer, None] = {}
        for n in walk(body):
            b = getattr(n, "buffer", None)
            if isinstance(b, Buffer):
                used.setdefault(b, None)
        known = seen | set(self._temps) | allocated
        stray = [b.name for b in used if b not in known]
        if stray:
            raise ArgumentError(
                f"program {self.name!r} uses buffer(s) {', '.join(repr(s) for s in stray)} that are not among its "
                "arguments; pass them to finish() or create them with Builder.temp"
            )

        params: dict[Var, None] = {}
        for b in (*args, *self._temps):
            for d in b.shape:
                for v in _ordered_vars(d):
                    params.setdefault(v, None)
        for v in _ordered_vars(body):
            if v not in self._loop_vars:
                params.setdefault(v, None)
        return Program(self.name, args, body, tuple(self._temps), tuple(params))


def _ordered_vars(node: Expr | Stmt) -> list[Var]:
    """Free variables in first-occurrence order (free_vars returns a set), shapes included."""
    found = free_vars(node)
    order: dict[Var, None] = {}
    for n in walk(node):
        if isinstance(n, Var) and n in found:
            order.setdefault(n, None)
        b = getattr(n, "buffer", None)
        if isinstance(b, Buffer):
            for d in b.shape:
                for m in walk(d):
                    if isinstance(m, Var):
                        order.setdefault(m, None)
    return list(order)


def buffer_like(buf: Buffer) -> Expr:
    """A typed stand-in so that a Python scalar takes the buffer's dtype."""
    return Const(0, buf.dtype)


__all__ = ["Builder", "buffer"]
