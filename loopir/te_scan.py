"""Recurrences in te: TVM's `te.scan` and Halide's update definitions (`te.update`), each a stage that later
stages read like any other.

    X = te.placeholder((m, n), name="X")
    state = te.placeholder((m, n), name="state")
    init = te.compute((1, n), lambda _, i: X[0, i], name="init")
    upd = te.compute((m, n), lambda t, i: state[t - 1, i] + X[t, i], name="upd")
    S = te.scan(init, upd, state, inputs=[X], name="S")        # S[t, i] = sum of X[0..t, i]
    Y = te.compute((m, n), lambda t, i: S[t, i] * 2, name="Y")

lowers to one nest per definition, each writing the scan's buffer (statements `S_init`, `S`):

    for t in range(0, 1):                    for t in range(1, m):
        for i in range(0, n):                    for i in range(0, n):
            S[t, i] = X[t, i]  # S_init               S[t, i] = S[t - 1, i] + X[t, i]  # S

An update definition (Halide's `f(r) = ...` over an RDom) redefines a stage over a domain of its own; inside
its lambda, reading the redefined tensor reads the current value (the previous definitions, and the earlier
iterations of this one), and the index may be any integer expression, a scatter included:

    h0 = te.compute((bins,), lambda b: te.const(0, "int32"), name="h0")
    h = te.update(h0, n, lambda r: ((img[r],), h0[img[r]] + 1), name="h")     # h[img[r]] += 1

is `h_init` (`h[b] = 0` for b in 0..bins) then `h` (`h[img[r]] = h[img[r]] + 1` for r in 0..n). The iterations
of a definition run in order, as Halide's RDom runs; schedules reorder them only where the dependence checker
proves it legal (a scatter's accesses are over-approximated: it may touch any element).

Representation: the stage is an ordinary `ComputeOp` whose body is a `Recurrence` (its definitions in order,
each a `Definition`); the stage's own current value is a `StateLoad` (no buffer, so that size substitution
and build keys need nothing special). `loopir.lower` turns each definition into its nest. This module imports
no `te` (te imports it): the te helpers it needs come in a `Front`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .affine import const_diff, same_value
from .dtypes import INDEX
from .errors import ArgumentError, ArgumentTypeError
from . import nodes
from .nodes import Const, Expr, Load, Node, Store, Var
from .te_lift import Reduce, has_reduce
from .visit import Transformer, substitute, walk


@dataclass(frozen=True, slots=True)
class StateLoad(Expr):
    """A read of the recurrence's own buffer (its current value) at `indices`."""

    indices: tuple[Expr, ...]
    dtype: str


@dataclass(frozen=True, slots=True)
class Definition(Node):
    """One definition: `stage[index] = value` for `axis` in the box [lo, hi) (half-open, outer loop first)."""

    axis: tuple[Var, ...]
    lo: tuple[Expr, ...]
    hi: tuple[Expr, ...]
    index: tuple[Expr, ...]
    value: Expr


@dataclass(frozen=True, slots=True)
class Recurrence(Expr):
    """The body of a scan or update stage: its definitions, run in order (the first is the initial one).
    `kind` is "scan" (te.scan) or "update" (te.update)."""

    kind: str
    defs: tuple[Definition, ...]
    dtype: str


@dataclass(frozen=True)
class Front:
    """The te helpers a recurrence needs (te passes them; this module cannot import te)."""

    tensor: Callable[..., Any]  # Tensor(name, shape, dtype, op)
    compute_op: Callable[..., Any]  # ComputeOp(name, axis, body, reduce_axis, reduce_dom, inputs)
    is_tensor: Callable[[Any], bool]
    check_name: Callable[[Any, str], str]
    default_name: Callable[[str], str]
    arity: Callable[[Any, int, str], list[str]]
    inputs: Callable[[str, Expr], tuple[Any, ...]]
    axis_owner: dict[Var, str]
    reduce_dom: dict[Var, tuple[Expr, Expr]]


def is_recurrence(t: Any) -> bool:
    """True for a tensor made by `te.scan` or `te.update`."""
    return isinstance(getattr(getattr(t, "op", None), "body", None), Recurrence)


def statement_names(name: str, n_defs: int) -> list[str]:
    """The statement of each definition of stage `name`: `name_init`, `name_u1`, ..., the last one `name`."""
    return [f"{name}_init" if k == 0 else name if k == n_defs - 1 else f"{name}_u{k}" for k in range(n_defs)]


def definition_stores(name: str, buf: Any, rec: Recurrence) -> list[Store]:
    """The Store of each definition (the stage's own reads made loads of `buf`)."""
    out = []
    for stmt, d in zip(statement_names(name, len(rec.defs)), rec.defs):
        value = _StateToLoad(buf).visit(d.value)
        index = tuple(_StateToLoad(buf).visit(i) for i in d.index)
        out.append(Store(stmt, buf, index, value, d.axis, d.axis))
    return out


class _StateToLoad(Transformer):
    def __init__(self, buf: Any) -> None:
        self.buf = buf

    def visit_StateLoad(self, e: StateLoad) -> Expr:
        return Load(self.buf, tuple(self.visit(i) for i in e.indices))


class _LoadToState(Transformer):
    """Reads of the buffers in `bufs` become the recurrence's own reads."""

    def __init__(self, bufs: set[int], dtype: str) -> None:
        self.bufs, self.dtype = bufs, dtype

    def visit_Load(self, e: Load) -> Expr:
        idx = tuple(self.visit(i) for i in e.indices)
        if id(e.buffer) in self.bufs:
            return StateLoad(idx, self.dtype)
        return e if all(a is b for a, b in zip(idx, e.indices)) else Load(e.buffer, idx)


def _fresh_axis(f: Front, stage: str, names: Sequence[str]) -> tuple[Var, ...]:
    axis = tuple(Var(n, INDEX) for n in names)
    for v in axis:
        f.axis_owner[v] = stage
    return axis


def _check_vars(f: Front, stage: str, axis: tuple[Var, ...], exprs: Sequence[Expr], where: str) -> None:
    for e in exprs:
        for n in walk(e):
            if isinstance(n, Var) and n not in axis and (n in f.axis_owner or n in f.reduce_dom):
                owner = f.axis_owner.get(n)
                whose = f"a loop variable of stage {owner!r}" if owner else "a reduce axis"
                raise ArgumentError(f"{stage}: variable {n.name!r} in {where} is {whose}; use the lambda's own "
                                    "variables and size variables only")
            if isinstance(n, Reduce):
                raise ArgumentError(f"{stage}: {where} holds a te.{n.op}; a recurrence cannot reduce inline: compute "
                                    "the reduction in a te.compute stage of its own and read it")


def _pure_definition(f: Front, stage: str, t: Any) -> tuple[Definition, ...]:
    """The definitions that `t` stands for: its own (a recurrence), or its pure definition as the first."""
    body = t.op.body
    if isinstance(body, Recurrence):
        return body.defs
    if isinstance(body, Reduce):
        raise ArgumentError(f"{stage}: the initial definition {t.name!r} is a reduction; compute it in a stage of "
                            f"its own and define {t.name!r} from it (te.compute(..., lambda ...: r[...]))")
    if t.op.lifted:
        raise ArgumentError(f"{stage}: the initial definition {t.name!r} holds an inline reduction; compute it in a "
                            "stage of its own first")
    axis = _fresh_axis(f, stage, [v.name for v in t.op.axis])
    value = substitute(body, dict(zip(t.op.axis, axis)))
    zero = tuple(nodes.const(0, INDEX) for _ in axis)
    return (Definition(axis, zero, tuple(t.shape), axis, value),)


def _stage(f: Front, name: str, shape: tuple[Expr, ...], dtype: str, kind: str, defs: tuple[Definition, ...],
           order: list[Any]) -> Any:
    rec = Recurrence(kind, defs, dtype)
    inputs = f.inputs(name, rec)
    listed = {id(t) for t in order}
    for t in inputs:
        if id(t) not in listed:
            order.append(t)
    op = f.compute_op(name, defs[-1].axis, rec, (), (), tuple(order))
    return f.tensor(name, shape, dtype, op)


# ----------------------------------------------------------------------------- te.scan


def scan(f: Front, init: Any, update: Any, state_placeholder: Any, inputs: Sequence[Any] | None = None,
         name: str | None = None) -> Any:
    name = f.default_name("scan") if name is None else f.check_name(name, "tensor")
    who = f"scan {name!r}"
    for what, t in (("init", init), ("update", update), ("state_placeholder", state_placeholder)):
        if not f.is_tensor(t):
            raise ArgumentTypeError(f"{who}: {what} must be a te tensor, got {type(t).__name__} {t!r}")
    if type(state_placeholder.op).__name__ != "PlaceholderOp":
        raise ArgumentTypeError(f"{who}: the state {state_placeholder.name!r} must be a te.placeholder")
    for what, t in (("init", init), ("update", update)):
        if type(t.op).__name__ != "ComputeOp" or isinstance(t.op.body, Recurrence):
            raise ArgumentTypeError(f"{who}: {what} {t.name!r} must be a te.compute stage")
        if isinstance(t.op.body, Reduce) or has_reduce(t.op.body) or t.op.lifted:
            raise ArgumentError(f"{who}: {what} {t.name!r} holds a reduction; compute it in a stage of its own "
                                "and read that stage")
    shape = tuple(state_placeholder.shape)
    if not shape:
        raise ArgumentError(f"{who}: the state {state_placeholder.name!r} has no dimension to scan over")
    for what, t in (("init", init), ("update", update)):
        if len(t.shape) != len(shape) or not all(same_value(a, b) for a, b in zip(t.shape[1:], shape[1:])):
            raise ArgumentError(f"{who}: {what} {t.name!r} has shape {_dims(t.shape)}; it must be "
                                f"{_dims(('rows',) + shape[1:])} like the state {state_placeholder.name!r} "
                                f"{_dims(shape)} past the scan axis")
        if t.dtype != state_placeholder.dtype:
            raise ArgumentTypeError(f"{who}: {what} {t.name!r} is {t.dtype} but the state "
                                    f"{state_placeholder.name!r} is {state_placeholder.dtype}; cast it (te.cast)")
    if not same_value(update.shape[0], shape[0]):
        raise ArgumentError(f"{who}: update {update.name!r} has {update.shape[0]} rows along the scan axis, the "
                            f"state {state_placeholder.name!r} {shape[0]}")
    rows = init.shape[0]
    if isinstance(rows, Const) and rows.value < 1:
        raise ArgumentError(f"{who}: init {init.name!r} has no row; it must give at least the first row")
    if any(isinstance(n, Load) and n.buffer is state_placeholder.buffer for n in walk(init.op.body)):
        raise ArgumentError(f"{who}: init {init.name!r} reads the state {state_placeholder.name!r}, which holds "
                            "nothing yet")
    # the update reads only rows before its own: state[t - c, ...] with a constant c >= 1 (at most the init rows)
    t_var = update.op.axis[0]
    for n in walk(update.op.body):
        if isinstance(n, Load) and n.buffer is state_placeholder.buffer:
            c = const_diff(t_var, n.indices[0])
            if c is None or c < 1:
                raise ArgumentError(
                    f"{who}: update {update.name!r} reads {state_placeholder.name}[{', '.join(map(str, n.indices))}]"
                    f"; along the scan axis it may read only earlier rows, {t_var.name} - c with a constant c >= 1")
            if isinstance(rows, Const) and c > rows.value:
                raise ArgumentError(
                    f"{who}: update {update.name!r} reads {c} rows back ({state_placeholder.name}"
                    f"[{', '.join(map(str, n.indices))}]) but init {init.name!r} gives only {rows.value}")
    order: list[Any] = []
    if inputs is not None:
        if f.is_tensor(inputs) or not isinstance(inputs, (list, tuple)):
            raise ArgumentTypeError(f"{who}: inputs must be a list of te tensors, got {type(inputs).__name__}")
        for k, t in enumerate(inputs):
            if not f.is_tensor(t):
                raise ArgumentTypeError(f"{who}: inputs[{k}] must be a te tensor, got {type(t).__name__} {t!r}")
        order = [t for t in inputs if t is not state_placeholder]
    states = {id(state_placeholder.buffer)}
    ia = _fresh_axis(f, name, [v.name for v in init.op.axis])
    ua = _fresh_axis(f, name, [v.name for v in update.op.axis])
    zero = nodes.const(0, INDEX)
    # the init rows clipped to the state's (a state of fewer rows than the init gives is written where it exists)
    d = const_diff(rows, shape[0])
    first = rows if d is not None and d <= 0 else nodes.binary("min", rows, shape[0])
    d0 = Definition(ia, (zero,) * len(ia), (first,) + tuple(init.shape[1:]), ia,
                    substitute(init.op.body, dict(zip(init.op.axis, ia))))
    uval = _LoadToState(states, update.dtype).visit(substitute(update.op.body, dict(zip(update.op.axis, ua))))
    d1 = Definition(ua, (rows,) + (zero,) * (len(ua) - 1), shape, ua, uval)
    out = _stage(f, name, shape, update.dtype, "scan", (d0, d1), order)
    if inputs is not None:
        missing = [t.name for t in out.op.inputs if all(t is not u for u in inputs)]
        if missing:
            raise ArgumentError(f"{who}: it reads {', '.join(missing)}, which inputs=[...] does not list")
    return out


def _dims(shape: Sequence[Any]) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


# ----------------------------------------------------------------------------- te.update


def _domains(over: Any, who: str) -> list[tuple[Expr, Expr]]:
    # a tuple is one (lo, hi) domain, several domains are a list: `over=(n, m)` is [n, m), never two extents
    if isinstance(over, tuple) and not _is_pair(over):
        raise ArgumentTypeError(f"{who}: over={over!r}: a tuple is one (lo, hi) domain; give several domains as a "
                                "list, e.g. over=[(1, h), w]")
    items = over if isinstance(over, list) else [over]
    if not items:
        raise ArgumentError(f"{who}: over= needs at least one domain (an extent or a (lo, hi) pair)")
    out = []
    for k, d in enumerate(items):
        lo_, hi_ = d if isinstance(d, (tuple, list)) and len(d) == 2 else (0, d)
        if isinstance(d, (tuple, list)) and len(d) != 2:
            raise ArgumentTypeError(f"{who}: domain {k} must be an extent or a (lo, hi) pair, got {d!r}")
        lo = nodes.as_index(lo_, f"the lower bound of domain {k} of {who}")
        hi = nodes.as_index(hi_, f"the upper bound of domain {k} of {who}")
        if isinstance(lo, Const) and isinstance(hi, Const) and hi.value < lo.value:
            raise ArgumentError(f"{who}: domain {k} is the negative range [{lo.value}, {hi.value})")
        out.append((lo, hi))
    return out


def _is_pair(x: tuple[Any, ...]) -> bool:
    return len(x) == 2 and not any(isinstance(e, (tuple, list)) for e in x)


def update(f: Front, tensor: Any, over: Any, fupdate: Callable[..., Any], name: str | None = None) -> Any:
    if not f.is_tensor(tensor) or type(tensor.op).__name__ != "ComputeOp":
        raise ArgumentTypeError(f"te.update redefines a te.compute stage (or an earlier te.update / te.scan), got "
                                f"{type(tensor).__name__} {tensor!r}")
    name = f.default_name(f"{tensor.name}_u") if name is None else f.check_name(name, "tensor")
    who = f"update {name!r}"
    doms = _domains(over, who)
    names = f.arity(fupdate, len(doms), name)
    axis = _fresh_axis(f, name, names)
    result = fupdate(*axis)
    if not isinstance(result, tuple) or len(result) != 2:
        raise ArgumentTypeError(f"{who}: the lambda must return (index, value), e.g. lambda r: ((img[r],), "
                                f"{tensor.name}[img[r]] + 1); got {result!r}")
    idx_, value_ = result
    idx_ = idx_ if isinstance(idx_, (tuple, list)) else (idx_,)
    if len(idx_) != len(tensor.shape):
        raise ArgumentError(f"{who}: the index has {len(idx_)} entries but {tensor.name!r} has "
                            f"{len(tensor.shape)} dimension(s)")
    if f.is_tensor(value_):
        raise ArgumentTypeError(f"{who}: the value is the tensor {value_.name!r}; index it")
    index = tuple(_as_int64(nodes.as_index(i, f"index {k} of {who}")) for k, i in enumerate(idx_))
    value = nodes.as_expr(value_)
    if isinstance(value, Const) and value.dtype != tensor.dtype:
        value = nodes.const(value.value, tensor.dtype)  # a Python scalar takes the stage's dtype
    if value.dtype != tensor.dtype:
        raise ArgumentTypeError(f"{who}: the value is {value.dtype} but {tensor.name!r} is {tensor.dtype}; "
                                f"cast it: te.cast({tensor.dtype!r}, ...)")
    _check_vars(f, who, axis, [*index, value], "the update")
    states = {id(tensor.buffer)}
    index = tuple(_LoadToState(states, tensor.dtype).visit(i) for i in index)
    value = _LoadToState(states, tensor.dtype).visit(value)
    defs = _pure_definition(f, who, tensor) + (Definition(axis, tuple(d[0] for d in doms), tuple(d[1] for d in doms),
                                                          index, value),)
    return _stage(f, name, tuple(tensor.shape), tensor.dtype, "update", defs, [])


def _as_int64(e: Expr) -> Expr:
    # a scatter index read from an int32 tensor (img[r]) indexes in int64, as loop variables do
    return e if e.dtype == INDEX else nodes.cast(INDEX, e)


__all__ = ["Definition", "Front", "Recurrence", "StateLoad", "definition_stores", "is_recurrence", "scan",
           "statement_names", "update"]
