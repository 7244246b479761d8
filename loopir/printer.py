"""Printing the loop IR as a readable, Python-like loop nest.

    def prefix_sum(A: float32[n]):  # sizes: n
        for i in range(1, n):
            A[i] = A[i - 1] + A[i]  # S

Loops show their kind (`range` for serial, `parallel`, `unroll`, `vectorize`, `host` for a loop of
GPU kernel launches; a GPU-bound loop is `range` with its axis in a comment), each Store ends
with `# name`, followed by its instance binding `(i = io * 256 + ii)` when its coordinates are not its own iteration
variables. `marks` (a dict from loop Var to text) appends that text to the loop's line; schedule
errors use it to point at loops. Expressions get the fewest parentheses Python's precedence
needs, except that a right operand of equal precedence keeps them: `a - (b - c)`, and
`a + (b + c)` too, since float addition is not associative.

Names are unambiguous: Vars and Buffers are identified by object, so two things may carry one name (a size
`b` beside a tensor `b`, a loop variable `i` over a size `i`, a loop nested in another of its name after
`compute_at`). A printed program or statement shows each such object under a name of its own, chosen once
per print (`display_names`): buffers keep theirs, a size whose name a buffer has is shown as `b_size`, a
loop variable whose name a buffer, a size or an enclosing loop has as `i_1` (an iteration variable bound by
its statement's `(i = ...)` avoids only buffers and sizes); the `# sizes:` line says which name a size is
passed by. Nothing clashes in most programs, which print as written.
An expression printed alone (`expr_str`, `str(expr)`) has no program around it and shows the names as given.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar

from .names import fresh
from .errors import ArgumentTypeError
from .nodes import (
    PRINTERS,
    Allocate,
    Barrier,
    Kernel,
    Binary,
    Buffer,
    Call,
    Cast,
    Compare,
    Const,
    Expr,
    For,
    If,
    Load,
    Logical,
    Program,
    Select,
    Seq,
    Stmt,
    Store,
    Unary,
    Var,
)
from .target import cpu_vector_fallback
from .visit import deep_recursion, walk

INDENT = "    "

_BINARY_SYM = {"add": "+", "sub": "-", "mul": "*", "div": "/", "floordiv": "//", "mod": "%"}
_COMPARE_SYM = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
# Python's precedence, low to high; atoms (names, calls, subscripts) are highest.
_PREC = {
    "or": 1,
    "and": 2,
    "not": 3,
    "compare": 4,
    "add": 6,
    "sub": 6,
    "mul": 7,
    "div": 7,
    "floordiv": 7,
    "mod": 7,
    "neg": 8,
}
_ATOM = 100

# the display names of the print in progress, set by program_str / stmt_str (expr_str alone has none): a
# context variable rather than a parameter threaded through every helper below
_NAMES: ContextVar[dict[Var | Buffer, str] | None] = ContextVar("loopir_printer_names", default=None)


def _nm(x: Var | Buffer) -> str:
    names = _NAMES.get()
    return x.name if names is None else names.get(x, x.name)


@contextmanager
def _naming(names: dict[Var | Buffer, str]) -> Iterator[None]:
    token = _NAMES.set(names)
    try:
        yield
    finally:
        _NAMES.reset(token)


def display_names(
    body: Stmt, buffers: Sequence[Buffer] = (), sizes: Sequence[Var] = ()
) -> dict[Var | Buffer, str]:
    """The name each Var and Buffer of `body` is printed under: distinct objects that one print shows in
    the same scope get distinct names (see the module doc). `buffers` and `sizes` (a program's arguments,
    temporaries and size variables) come first; the rest are found in `body`."""
    bufs: dict[Buffer, None] = dict.fromkeys(buffers)
    seen: dict[Var, None] = dict.fromkeys(sizes)
    bound: set[Var] = set()  # loop and iteration variables
    for n in walk(body):
        if isinstance(n, (Load, Store, Allocate)):
            bufs.setdefault(n.buffer)
            if isinstance(n, Store):
                bound.update(n.iters)
        elif isinstance(n, For):
            bound.add(n.var)
        elif isinstance(n, Var):
            seen.setdefault(n)
    for b in list(bufs):
        for d in b.shape:
            seen.update((x, None) for x in walk(d) if isinstance(x, Var))
    names: dict[Var | Buffer, str] = {}
    taken: set[str] = set()
    for b in bufs:  # buffers keep the names they were given
        names[b] = fresh(b.name, taken)
    for v in seen:
        if v not in bound:  # a size: shown as `<name>_size` when a buffer has its name
            names[v] = v.name if v.name not in taken else fresh(f"{v.name}_size", taken)
            taken.add(names[v])

    def pick(v: Var, scope: dict[str, Var]) -> str:
        # a loop variable may share its name with loops of other nests, not with a buffer, a size or a loop
        # around it
        name, k = v.name, 1
        while name in taken or scope.get(name, v) is not v:
            name, k = f"{v.name}_{k}", k + 1
        return name

    stack: list[tuple[Stmt, dict[str, Var]]] = [(body, {})]
    while stack:
        s, scope = stack.pop()
        if isinstance(s, For):
            if s.var not in names:
                names[s.var] = pick(s.var, scope)
            stack.append((s.body, {**scope, names[s.var]: s.var}))
        elif isinstance(s, Store):
            # an iteration variable the loops do not bind is bound by the statement's own `(i = ...)`: it
            # may repeat a loop's name (`(i_i_o = i_i_o)` after cache_write), not a buffer's or a size's
            for it in s.iters:
                if it not in names:
                    names[it] = pick(it, {})
        elif isinstance(s, Seq):
            stack.extend((c, scope) for c in reversed(s.body))
        elif isinstance(s, If):
            if s.orelse is not None:
                stack.append((s.orelse, scope))
            stack.append((s.then, scope))
        elif isinstance(s, (Allocate, Kernel)):
            stack.append((s.body, scope))
    return names


def _const_str(c: Const) -> str:
    v = c.value
    if isinstance(v, bool) or c.dtype == "bool":
        return "True" if v else "False"
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    return str(v)


def _expr(e: Expr) -> tuple[str, int]:
    """(text, precedence of its outermost operator)."""
    if isinstance(e, Const):
        s = _const_str(e)
        return s, (_PREC["neg"] if s.startswith("-") else _ATOM)
    if isinstance(e, Var):
        return _nm(e), _ATOM
    if isinstance(e, Load):
        return f"{_nm(e.buffer)}[{_index_str(e.indices)}]", _ATOM
    if isinstance(e, Binary):
        if e.op in ("max", "min"):
            return f"{e.op}({expr_str(e.a)}, {expr_str(e.b)})", _ATOM
        p = _PREC[e.op]
        return f"{_paren(e.a, p, False)} {_BINARY_SYM[e.op]} {_paren(e.b, p, True)}", p
    if isinstance(e, Unary):
        p = _PREC["neg"]
        return f"-{_paren(e.a, p, True)}", p  # -(-x), not --x
    if isinstance(e, Call):
        return f"{e.fn}({', '.join(expr_str(a) for a in e.args)})", _ATOM
    if isinstance(e, Compare):
        p = _PREC["compare"]  # comparisons chain in Python, so both sides need parentheses at equal precedence
        return f"{_paren(e.a, p, True)} {_COMPARE_SYM[e.op]} {_paren(e.b, p, True)}", p
    if isinstance(e, Logical):
        if e.op == "not":
            p = _PREC["not"]
            return f"not {_paren(e.a, p, False)}", p
        p = _PREC[e.op]
        assert e.b is not None
        return f"{_paren(e.a, p, False)} {e.op} {_paren(e.b, p, True)}", p
    if isinstance(e, Select):
        return f"where({expr_str(e.cond)}, {expr_str(e.a)}, {expr_str(e.b)})", _ATOM
    if isinstance(e, Cast):
        return f"{e.dtype}({expr_str(e.a)})", _ATOM
    raise ArgumentTypeError(f"cannot print {type(e).__name__} {e!r} as an expression")


def _paren(e: Expr, prec: int, right: bool) -> str:
    s, p = _expr(e)
    if p < prec or (right and p == prec):
        return f"({s})"
    return s


def expr_str(e: Expr) -> str:
    """An expression as Python-like text with minimal parentheses."""

    with deep_recursion():
        return _expr(e)[0]


def _index_str(indices: tuple[Expr, ...]) -> str:
    return ", ".join(expr_str(i) for i in indices) if indices else "()"


def _type_str(buf: Buffer) -> str:
    return f"{buf.dtype}[{', '.join(expr_str(d) for d in buf.shape) if buf.shape else '()'}]"


def _loop_head(f: For) -> tuple[str, str]:
    """(the `for` line, a comment for it or '')."""
    rng = f"{expr_str(f.lo)}, {expr_str(f.hi)}"
    hints = "  ".join(f"# pragma {k} {v}" for k, v in f.pragmas)
    if f.kind == "thread":
        return f"for {_nm(f.var)} in range({rng}):", "  ".join(x for x in (f"# {f.thread}", hints) if x)
    if f.kind == "serial":
        return f"for {_nm(f.var)} in range({rng}):", hints
    scalar = cpu_vector_fallback(f)
    notes = [hints] if hints else []
    notes += [f"# not vectorized on the CPU: {scalar}"] if scalar else []
    return f"for {_nm(f.var)} in {f.kind}({rng}):", "  ".join(notes)


def _binding(s: Store) -> str:
    parts = [f"{_nm(it)} = {expr_str(c)}" for it, c in zip(s.iters, s.coords) if c is not it]
    return f" ({', '.join(parts)})" if parts else ""


def _lines(s: Stmt, depth: int, marks: dict[Var, str], out: list[str]) -> None:
    pad = INDENT * depth
    if isinstance(s, Store):
        out.append(f"{pad}{_nm(s.buffer)}[{_index_str(s.indices)}] = {expr_str(s.value)}  # {s.name}{_binding(s)}")
    elif isinstance(s, For):
        head, comment = _loop_head(s)
        tail = [t for t in (comment, marks.get(s.var, "")) if t]
        out.append(pad + head + ("  " + "  ".join(tail) if tail else ""))
        _lines(s.body, depth + 1, marks, out)
    elif isinstance(s, Seq):
        if not s.body:
            out.append(f"{pad}pass")
        for c in s.body:
            _lines(c, depth, marks, out)
    elif isinstance(s, If):
        out.append(f"{pad}if {expr_str(s.cond)}:")
        _lines(s.then, depth + 1, marks, out)
        if s.orelse is not None:
            out.append(f"{pad}else:")
            _lines(s.orelse, depth + 1, marks, out)
    elif isinstance(s, Allocate):
        b = s.buffer
        out.append(f"{pad}with allocate({_type_str(b)}, {b.scope!r}) as {_nm(b)}:")
        _lines(s.body, depth + 1, marks, out)
    elif isinstance(s, Barrier):
        out.append(f"{pad}sync_threads()")
    elif isinstance(s, Kernel):
        dims = lambda es: ", ".join(expr_str(e) for e in es)  # noqa: E731
        names = lambda vs: ", ".join(sorted(_nm(v) for v in vs))  # noqa: E731
        notes = [f"index {s.index_dtype}"] + [f"{what}: {names(vs)}" for what, vs in (
            ("guarded", s.guarded), ("reductions", s.reductions), ("cooperative", s.cooperative),
            ("pipelined", s.pipelined)) if vs]
        if s.single_thread:
            notes.append(f"thread 0 only: {', '.join(sorted(s.single_thread))}")
        out.append(f"{pad}kernel {s.name}<<<({dims(s.grid)}), ({dims(s.block)})>>>:  # {'; '.join(notes)}")
        _lines(s.body, depth + 1, marks, out)
    else:
        raise ArgumentTypeError(f"cannot print {type(s).__name__} {s!r} as a statement")


def stmt_str(s: Stmt, marks: dict[Var, str] | None = None, depth: int = 0) -> str:
    """A statement (and everything below it) as indented Python-like text."""
    out: list[str] = []
    with deep_recursion(), _naming(display_names(s)):
        _lines(s, depth, marks or {}, out)
    return "\n".join(out)


def program_str(p: Program, marks: dict[Var, str] | None = None) -> str:
    """A whole program: a `def` line with the arguments and sizes, the temporaries, the body."""
    names = display_names(p.body, p.args + p.temps, p.params)
    with deep_recursion(), _naming(names):
        args = ", ".join(f"{_nm(b)}: {_type_str(b)}" for b in p.args)
        head = f"def {p.name}({args}):"
        if p.params:  # a size shown under another name says the name it is passed by
            shown = [_nm(v) if _nm(v) == v.name else f"{_nm(v)} (passed as {v.name!r})" for v in p.params]
            head += f"  # sizes: {', '.join(shown)}"
        out = [head]
        if p.assume:  # what every call must meet (checked when a call binds its sizes)
            out.append(f"{INDENT}# assume: {' and '.join(expr_str(c) for c in p.assume)}")
        for t in p.temps:
            out.append(f"{INDENT}{_nm(t)}: {_type_str(t)}  # temporary")
        _lines(p.body, 1, marks or {}, out)
    return "\n".join(out)


PRINTERS.update(expr=expr_str, stmt=stmt_str, program=program_str)  # str() of a node (see loopir.nodes)

__all__ = ["display_names", "program_str", "stmt_str", "expr_str"]
