"""The loop IR: small immutable nodes. Read it as a grammar.

    Expr  ::= Const(value, dtype) | Var(name) | Load(buffer, indices)
            | Binary(op, a, b) | Unary(op, a) | Call(fn, args) | Compare(op, a, b)
            | Logical(op, a, b) | Select(cond, a, b) | Cast(dtype, a)
            | ExternCall(fn, args, dtype, decl)     (a Call of an external function, loopir.te_extern)
    Stmt  ::= Store(name, buffer, indices, value, iters, coords)
            | For(var, lo, hi, body, kind, thread) | Seq(body) | If(cond, then, orelse)
            | Allocate(buffer, body) | Barrier()
            | Kernel(name, body, grid, block, index_dtype, guarded, reductions, cooperative, pipelined,
                     single_thread, subwarp, dynamic_shared, pipeline_stages, mma_grids, min_blocks)
                                                        (lowered programs only, made by codegen.passes)
    Program(name, args, temps, params, body, assume)

A `Store` is a *statement*: its `indices` and `value` are written in its original
iteration variables `iters`; `coords[k]` gives `iters[k]` as an affine function of the
loops now around it (after `split`, `i = io*256 + ii`). Primitives rewrite loops and
coords, never a statement's body, so the dependences of the original program can be
checked against any later nest.

`Var` and `Buffer` are identified by the object, not by the name; every other node
compares structurally. Arithmetic operators on expressions build nodes (with constant
folding of trivial cases); comparisons `< <= > >=` build `Compare` nodes, `==` stays
structural equality (use `.eq()` / `.ne()` to build those comparisons).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from collections.abc import Callable
from typing import Any, Literal, Union

from .errors import ArgumentError, ArgumentTypeError
from .dtypes import INDEX, INT_RANGE, check_dtype, is_float, is_int, is_small_int, promote, weak_scalar_dtype, wrap_int

# str() of a node prints it with loopir.printer, which imports this module: the printer fills this
# table when it loads (loopir/__init__ imports it, so it has loaded before any node can be printed)
PRINTERS: dict[str, Callable[[Any], str]] = {}

Scalar = Union[int, float, bool]

BINARY_OPS = ("add", "sub", "mul", "div", "floordiv", "mod", "max", "min")
UNARY_OPS = ("neg",)
CALL_FNS = ("exp", "log", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid", "erf", "abs",
            "pow", "fmod", "floor", "ceil", "round", "fast_exp", "fast_log", "fast_sin", "fast_cos")
CALL_ARITY = {"pow": 2, "fmod": 2}  # every other math function takes one argument
COMPARE_OPS = ("lt", "le", "gt", "ge", "eq", "ne")
LOGICAL_OPS = ("and", "or", "not")
# "host": a serial loop of kernel launches (GPU), made by the lowering pass codegen.passes.kernels from a
# serial loop that encloses grid-bound loops; targets without kernels run it as "serial"
LoopKind = Literal["serial", "parallel", "unroll", "vectorize", "thread", "host"]
LOOP_KINDS = ("serial", "parallel", "unroll", "vectorize", "thread", "host")
GPU_AXES = ("blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y", "threadIdx.z")
SCOPES = ("global", "shared", "local")


class Node:
    __slots__ = ()


# ----------------------------------------------------------------------------- expressions


class Expr(Node):
    """Base of expressions. Every expression has a `dtype`."""

    __slots__ = ()
    dtype: str

    def __add__(self, o: ExprLike) -> Expr:
        return binary("add", self, o)

    def __radd__(self, o: ExprLike) -> Expr:
        return binary("add", o, self)

    def __sub__(self, o: ExprLike) -> Expr:
        return binary("sub", self, o)

    def __rsub__(self, o: ExprLike) -> Expr:
        return binary("sub", o, self)

    def __mul__(self, o: ExprLike) -> Expr:
        return binary("mul", self, o)

    def __rmul__(self, o: ExprLike) -> Expr:
        return binary("mul", o, self)

    def __truediv__(self, o: ExprLike) -> Expr:
        return binary("div", self, o)

    def __rtruediv__(self, o: ExprLike) -> Expr:
        return binary("div", o, self)

    def __floordiv__(self, o: ExprLike) -> Expr:
        return binary("floordiv", self, o)

    def __rfloordiv__(self, o: ExprLike) -> Expr:
        return binary("floordiv", o, self)

    def __mod__(self, o: ExprLike) -> Expr:
        return binary("mod", self, o)

    def __rmod__(self, o: ExprLike) -> Expr:
        return binary("mod", o, self)

    def __pow__(self, o: object) -> Expr:
        return power(self, o)

    def __neg__(self) -> Expr:
        if isinstance(self, Const):
            return Const(-self.value, self.dtype)
        return Unary("neg", self, self.dtype)

    def __pos__(self) -> Expr:
        return self

    def __lt__(self, o: ExprLike) -> Expr:
        return compare("lt", self, o)

    def __le__(self, o: ExprLike) -> Expr:
        return compare("le", self, o)

    def __gt__(self, o: ExprLike) -> Expr:
        return compare("gt", self, o)

    def __ge__(self, o: ExprLike) -> Expr:
        return compare("ge", self, o)

    def eq(self, o: ExprLike) -> Expr:
        return compare("eq", self, o)

    def ne(self, o: ExprLike) -> Expr:
        return compare("ne", self, o)

    def __and__(self, o: ExprLike) -> Expr:
        return logical("and", self, o)

    def __rand__(self, o: ExprLike) -> Expr:
        return logical("and", o, self)

    def __or__(self, o: ExprLike) -> Expr:
        return logical("or", self, o)

    def __ror__(self, o: ExprLike) -> Expr:
        return logical("or", o, self)

    def __invert__(self) -> Expr:
        return Logical("not", self, None)

    def __bool__(self) -> bool:
        raise ArgumentTypeError(
            "a loopir expression has no truth value at trace time; "
            "use te.where(cond, a, b) for a choice and & / | to combine conditions"
        )

    def __index__(self) -> int:
        raise ArgumentTypeError(f"loopir expression {self} cannot be used as a Python int")

    def __str__(self) -> str:
        return PRINTERS["expr"](self)


ExprLike = Union[Expr, int, float, bool]


@dataclass(frozen=True, slots=True)
class Const(Expr):
    value: int | float | bool
    dtype: str


@dataclass(frozen=True, slots=True, eq=False)
class Var(Expr):
    """An integer variable: a loop variable or a symbolic size. Identity is the object."""

    name: str
    dtype: str = INDEX

    def __repr__(self) -> str:
        return f"Var({self.name!r})"

    def __hash__(self) -> int:  # eq=False keeps object identity; slots need it spelled out
        return id(self)


@dataclass(frozen=True, slots=True)
class Load(Expr):
    buffer: Buffer
    indices: tuple[Expr, ...]

    @property
    def dtype(self) -> str:  # type: ignore[override]
        return self.buffer.dtype


@dataclass(frozen=True, slots=True)
class Binary(Expr):
    op: str
    a: Expr
    b: Expr
    dtype: str


@dataclass(frozen=True, slots=True)
class Unary(Expr):
    op: str
    a: Expr
    dtype: str


@dataclass(frozen=True, slots=True)
class Call(Expr):
    fn: str
    args: tuple[Expr, ...]
    dtype: str


@dataclass(frozen=True, slots=True)
class ExternCall(Call):
    """A call of a function outside loopir (`loopir.te_extern`): `fn` its name, `decl` its declaration (how each
    target calls it). A Call to every walk, printer and checker: pure, it reads and writes no buffer."""

    decl: Any


@dataclass(frozen=True, slots=True)
class Compare(Expr):
    op: str
    a: Expr
    b: Expr
    dtype: str = "bool"


@dataclass(frozen=True, slots=True)
class Logical(Expr):
    """`and` / `or` of two conditions, or `not` of `a` (then `b` is None)."""

    op: str
    a: Expr
    b: Expr | None
    dtype: str = "bool"


@dataclass(frozen=True, slots=True)
class Select(Expr):
    cond: Expr
    a: Expr
    b: Expr
    dtype: str


@dataclass(frozen=True, slots=True)
class Cast(Expr):
    dtype: str
    a: Expr


# ----------------------------------------------------------------------------- buffers


@dataclass(frozen=True, slots=True, eq=False)
class Buffer(Node):
    """A dense row-major array. Identity is the object. `scope` is where it lives."""

    name: str
    shape: tuple[Expr, ...]
    dtype: str
    scope: str = "global"

    def __post_init__(self) -> None:
        # a shape written with Python ints (Buffer("y", (1,), ...)) is the same shape in index constants
        if any(not isinstance(d, Expr) for d in self.shape):
            object.__setattr__(self, "shape", tuple(as_index(d, f"shape of buffer {self.name!r}") for d in self.shape))

    def __getitem__(self, idx: ExprLike | tuple[ExprLike, ...]) -> Load:
        idx = idx if isinstance(idx, tuple) else (idx,)
        if len(idx) != len(self.shape):
            raise IndexError(
                f"buffer {self.name!r} has {len(self.shape)} dimension(s) but was indexed with {len(idx)}"
            )
        return Load(self, tuple(as_index(i, f"index of buffer {self.name!r}") for i in idx))

    def __repr__(self) -> str:
        return f"Buffer({self.name!r})"

    def __hash__(self) -> int:
        return id(self)

    @property
    def ndim(self) -> int:
        return len(self.shape)


# ----------------------------------------------------------------------------- statements


class Stmt(Node):
    __slots__ = ()

    def __str__(self) -> str:
        return PRINTERS["stmt"](self)


@dataclass(frozen=True, slots=True)
class Store(Stmt):
    """buffer[indices] = value, for each instance `iters` of the statement `name`.

    `indices` and `value` use `iters`; `coords[k]` is `iters[k]` in terms of the loops
    around the statement now.
    """

    name: str
    buffer: Buffer
    indices: tuple[Expr, ...]
    value: Expr
    iters: tuple[Var, ...]
    coords: tuple[Expr, ...]


@dataclass(frozen=True, slots=True)
class For(Stmt):
    """for var in range(lo, hi): body. `thread` names the GPU axis when kind == "thread". `pragmas`: the
    renderers' hints for this loop, (name, value) pairs set by the primitive `pragma` (an unroll count)."""

    var: Var
    lo: Expr
    hi: Expr
    body: Stmt
    kind: str = "serial"
    thread: str | None = None
    pragmas: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class Seq(Stmt):
    body: tuple[Stmt, ...]


@dataclass(frozen=True, slots=True)
class If(Stmt):
    cond: Expr
    then: Stmt
    orelse: Stmt | None = None


@dataclass(frozen=True, slots=True)
class Allocate(Stmt):
    """A scratch buffer (`buffer.scope` is "shared" or "local") live inside `body`."""

    buffer: Buffer
    body: Stmt


@dataclass(frozen=True, slots=True)
class Barrier(Stmt):
    """__syncthreads(): every thread of a block reaches it before any passes."""


@dataclass(frozen=True, slots=True)
class Kernel(Stmt):
    """One device launch of a lowered program (made by `codegen.passes`, never by a user): `body` runs on
    `grid` blocks of `block` threads. The other fields are the lowering's decisions, which renderers print
    and never remake: the index width, the bound loops that keep a `v < hi` guard, the threadIdx.x loops
    lowered to cross-thread reductions, the parallel nests spread over the block's threads (cooperative
    copies), the serial loops whose shared copies are double-buffered, the statements run by thread 0 only.
    Loops are named by their (identity-compared) variables; sets are frozensets, which walks do not enter."""

    name: str
    body: Stmt
    grid: tuple[Expr, Expr, Expr]
    block: tuple[Expr, Expr, Expr]
    index_dtype: str = "int64"
    guarded: frozenset[Var] = frozenset()
    reductions: frozenset[Var] = frozenset()
    cooperative: frozenset[Var] = frozenset()
    pipelined: frozenset[Var] = frozenset()
    single_thread: frozenset[str] = frozenset()
    subwarp: int = 0  # > 0: the cross-thread reductions combine rows of this many lanes of one warp
    # shared buffers in the kernel's `extern __shared__` array: (buffer, byte offset) each, then (None, the
    # bytes a launch asks for); offsets and total are expressions of the sizes, evaluated per call
    dynamic_shared: tuple[tuple[Buffer | None, Expr], ...] = ()
    # tensor-core kernels (codegen.passes.mma): the stages of each pipelined loop's cp.async ring (0: two), and
    # the unrolled loops `for mi: for ni: <mma nest>` whose operand fragments are loaded once per mi / per ni
    pipeline_stages: int = 0
    mma_grids: frozenset[Var] = frozenset()
    min_blocks: int = 0  # > 0: blocks per multiprocessor the register allocation must leave room for
    rolled: frozenset[Var] = frozenset()  # loops kept rolled (`#pragma unroll 1`): remainder copies of unrolled nests
    # rows kept in registers (codegen.passes.registers): the register arrays' names, and those of them that hold a
    # 16-bit row widened to float32 (their loads cast back exactly)
    register_rows: frozenset[str] = frozenset()
    widened: frozenset[str] = frozenset()
    # temporaries whose every load reads a forwarded all-reduce total (codegen.passes.forwarded): never stored
    forwarded: frozenset[str] = frozenset()
    # > 0: each block of `grid` runs as a thread-block cluster of this many blocks (the `cluster` pragma), `block` being
    # the whole cluster's threads: the renderer launches grid (x, cluster, 1) of block (x / cluster, 1, 1)
    cluster: int = 0


@dataclass(frozen=True, slots=True)
class Program(Node):
    """A whole program: `args` in call order, `temps` are global intermediates,
    `params` the symbolic sizes, `assume` conditions on those sizes that every call must meet (the
    schedule relies on them, e.g. `n <= 4096`; checked when a call binds its sizes)."""

    name: str
    args: tuple[Buffer, ...]
    body: Stmt
    temps: tuple[Buffer, ...] = ()
    params: tuple[Var, ...] = ()
    assume: tuple[Expr, ...] = ()

    def __str__(self) -> str:
        return PRINTERS["program"](self)


# ----------------------------------------------------------------------------- smart constructors


_INT_RANGE = INT_RANGE


def const(value: Scalar, dtype: str | None = None) -> Const:
    if dtype is None:
        dtype = "bool" if isinstance(value, bool) else INDEX if isinstance(value, int) else "float32"
    dtype = check_dtype(dtype)
    if is_float(dtype):
        value = float(value)
    elif is_int(dtype):
        value = int(value)
        lo, hi = _INT_RANGE[dtype]
        # a constant outside its type would wrap silently in the generated code
        if not lo <= value <= hi:
            raise OverflowError(f"integer constant {value} does not fit in {dtype} [{lo}, {hi}]")
    else:
        value = bool(value)
    return Const(value, dtype)


def _py_scalar(x: object) -> object:
    """numpy scalars as the Python scalars they hold (a numpy integer is accepted wherever an int is)."""
    mod = type(x).__module__
    if mod == "numpy" and hasattr(x, "item") and getattr(x, "ndim", None) == 0:
        v = x.item()  # type: ignore[attr-defined]
        if isinstance(v, (bool, int, float)):
            return v
    return x


def as_expr(x: ExprLike, like: Expr | None = None) -> Expr:
    """An expression from an expression or a Python scalar (weak dtype, see dtypes.py)."""
    if isinstance(x, Expr):
        return x
    x = _py_scalar(x)  # type: ignore[assignment]
    if isinstance(x, (bool, int, float)):
        if like is None:
            return const(x)
        return const(x, weak_scalar_dtype(x, like.dtype))
    raise ArgumentTypeError(f"cannot use {type(x).__name__} {x!r} in a loopir expression")


def as_index(x: ExprLike, what: str = "index") -> Expr:
    """An integer index expression; floats and non-numbers are refused, naming `what`."""
    x = _py_scalar(x)  # type: ignore[assignment]
    if isinstance(x, bool) or (isinstance(x, float)):
        raise ArgumentTypeError(f"{what} must be an integer, got {type(x).__name__} {x!r}")
    if isinstance(x, int):
        return const(x, INDEX)
    if isinstance(x, Expr):
        if not is_int(x.dtype):
            raise ArgumentTypeError(f"{what} must be an integer expression, got {x} of dtype {x.dtype}")
        return x
    raise ArgumentTypeError(f"{what} must be an integer, got {type(x).__name__} {x!r}")


def _is_index(e: Expr) -> bool:
    """Index arithmetic: an integer expression of loop and size variables and constants (no tensor element)."""
    stack, var = [e], False
    while stack:
        x = stack.pop()
        if isinstance(x, Var):
            var = True
        elif isinstance(x, (Binary, Unary, Cast)) and is_int(x.dtype):
            stack.extend((x.a, x.b) if isinstance(x, Binary) else (x.a,))
        elif not (isinstance(x, Const) and is_int(x.dtype)):
            return False
    return var


def _coerce(a: ExprLike, b: ExprLike) -> tuple[Expr, Expr]:
    if isinstance(a, Expr) and isinstance(b, Expr):
        # index arithmetic next to a float value is weak, as a Python int is: x[i] / n keeps x's float dtype
        if is_float(a.dtype) and _is_index(b):
            return a, cast(a.dtype, b)
        if is_float(b.dtype) and _is_index(a):
            return cast(b.dtype, a), b
    if isinstance(a, Expr):
        return a, as_expr(b, a)
    if isinstance(b, Expr):
        return as_expr(a, b), b
    return as_expr(a), as_expr(b)


def _fold(op: str, x: int | float, y: int | float, dtype: str) -> Const | None:
    if is_small_int(dtype):  # small integers wrap per operation (loopir.dtypes), as the targets compute them
        r = _fold(op, x, y, "int64")
        return None if r is None else Const(wrap_int(int(r.value), dtype), dtype)
    if op == "add":
        return const(x + y, dtype)
    if op == "sub":
        return const(x - y, dtype)
    if op == "mul":
        return const(x * y, dtype)
    if op == "max":
        return const(max(x, y), dtype)
    if op == "min":
        return const(min(x, y), dtype)
    if is_int(dtype) and y != 0 and op == "floordiv":
        return const(x // y, dtype)
    if is_int(dtype) and y != 0 and op == "mod":
        return const(x % y, dtype)
    return None


def binary(op: str, a: ExprLike, b: ExprLike) -> Expr:
    """a <op> b with the promotion rule and folding of constants, x+0, x*1, x*0 (ints)."""
    a, b = _coerce(a, b)
    if a.dtype == "bool" and b.dtype == "bool":
        raise ArgumentTypeError(f"arithmetic '{op}' on two conditions; use & and | to combine conditions")
    dtype = promote(a.dtype, b.dtype)
    if op == "div" and not is_float(dtype):
        dtype = "float64"  # true division of integers, as numpy
    if dtype != a.dtype:
        a = cast(dtype, a)
    if dtype != b.dtype:
        b = cast(dtype, b)
    if isinstance(a, Const) and isinstance(b, Const):
        folded = _fold(op, a.value, b.value, dtype)
        if folded is not None:
            return folded
    if is_int(dtype):  # float identities are left alone (x*0 is not 0 for inf/nan)
        if op == "add" and _is(b, 0):
            return a
        if op == "add" and _is(a, 0):
            return b
        if op == "sub" and _is(b, 0):
            return a
        if op == "mul" and (_is(a, 0) or _is(b, 0)):
            return Const(0, dtype)
        if op == "mul" and _is(b, 1):
            return a
        if op == "mul" and _is(a, 1):
            return b
        if op in ("floordiv",) and _is(b, 1):
            return a
        if op == "mod" and _is(b, 1):
            return Const(0, dtype)
    return Binary(op, a, b, dtype)


def _is(e: Expr, v: int) -> bool:
    return isinstance(e, Const) and e.value == v


def power(base: Expr, exponent: object) -> Expr:
    """base ** n for a Python integer n, as repeated multiplication."""
    if isinstance(exponent, bool) or not isinstance(exponent, int):
        raise ArgumentTypeError(
            f"'**' takes an integer exponent, got {type(exponent).__name__} {exponent!r}; "
            "use te.exp(y * te.log(x)) for a general power"
        )
    if exponent == 0:
        return const(1, base.dtype)
    result: Expr | None = None
    sq: Expr = base
    n = abs(exponent)
    while n:
        if n & 1:
            result = sq if result is None else binary("mul", result, sq)
        n >>= 1
        if n:
            sq = binary("mul", sq, sq)
    assert result is not None
    if exponent < 0:
        return binary("div", const(1, result.dtype if is_float(result.dtype) else "float64"), result)
    return result


def compare(op: str, a: ExprLike, b: ExprLike) -> Expr:
    a, b = _coerce(a, b)
    dtype = promote(a.dtype, b.dtype)
    if dtype != a.dtype:
        a = cast(dtype, a)
    if dtype != b.dtype:
        b = cast(dtype, b)
    return Compare(op, a, b)


def logical(op: str, a: ExprLike, b: ExprLike) -> Expr:
    a, b = as_expr(a), as_expr(b)
    for x in (a, b):
        if x.dtype != "bool":
            raise ArgumentTypeError(f"'&' / '|' combine conditions; {x} has dtype {x.dtype}, not bool")
    return Logical(op, a, b)


def conjuncts(c: Expr) -> list[Expr]:
    """The terms of a conjunction `a and b and ...`, left to right (`[c]` for anything else)."""
    if isinstance(c, Logical) and c.op == "and" and c.b is not None:
        return conjuncts(c.a) + conjuncts(c.b)
    return [c]


def conjunction(terms: list[Expr]) -> Expr:
    """`t0 and t1 and ...` of a non-empty list of conditions, grouped from the left."""
    out = terms[0]
    for t in terms[1:]:
        out = Logical("and", out, t)
    return out


def cast(dtype: str, a: ExprLike) -> Expr:
    dtype = check_dtype(dtype)
    a = as_expr(a)
    if a.dtype == dtype:
        return a
    if isinstance(a, Const):
        if is_int(dtype) and isinstance(a.value, int) and not isinstance(a.value, bool):
            return const(wrap_int(a.value, dtype), dtype)  # integer casts wrap (numpy's astype), as at run time
        if is_small_int(dtype) and isinstance(a.value, float):  # truncated to 64 bits, then wrapped
            if not (math.isfinite(a.value) and -(2.0**63) <= a.value < 2.0**63):
                return Cast(dtype, a)  # unspecified, as at run time: left to the target
            return const(wrap_int(int(a.value), dtype), dtype)
        return const(a.value, dtype)
    return Cast(dtype, a)


def call(fn: str, *args: ExprLike) -> Expr:
    """A math function of the language; integers are computed in float64 (as numpy)."""
    if fn not in CALL_FNS:
        raise ArgumentError(f"unknown math function {fn!r}; known: {', '.join(CALL_FNS)}")
    arity = CALL_ARITY.get(fn, 1)
    if len(args) != arity:
        raise ArgumentError(f"math function {fn!r} takes {arity} argument(s), got {len(args)}")
    if arity == 2:  # pow, fmod: the two operands promote as a binary operator's do
        a, b = _coerce(args[0], args[1])
        xs = [cast(promote(a.dtype, b.dtype), a), cast(promote(a.dtype, b.dtype), b)]
    else:
        xs = [as_expr(a) for a in args]
    dtype = xs[0].dtype
    if fn == "abs":
        if dtype == "bool":
            raise ArgumentTypeError("abs of a condition")
        return Call(fn, tuple(xs), dtype)
    if not is_float(dtype):
        dtype = "float64"
        xs = [cast(dtype, x) for x in xs]
    return Call(fn, tuple(xs), dtype)


def select(cond: ExprLike, a: ExprLike, b: ExprLike) -> Expr:
    c = as_expr(cond)
    if c.dtype != "bool":
        raise ArgumentTypeError(f"the condition of where() must be a comparison, got {c} of dtype {c.dtype}")
    a, b = _coerce(a, b)
    dtype = promote(a.dtype, b.dtype)
    return Select(c, cast(dtype, a), cast(dtype, b), dtype)
