"""User-defined and tuple reducers (TVM's `comm_reducer`, `argmax` / `argmin`) and multi-output stages.

    prod = te.comm_reducer(lambda a, b: a * b, lambda t: te.const(1, t), name="prod")
    p = te.compute((m,), lambda i: prod(x[i, k], axis=k), name="p")
    am = te.compute((m,), lambda i: te.argmax(x[i, k], axis=k), name="am")     # index of the first max
    s1, s2 = te.compute((m,), lambda i: (te.sum(x[i, k], axis=k), te.sum(x[i, k] * x[i, k], axis=k)))

A reducer over n values keeps n accumulators, one buffer each (a multi-output stage: one nest writes
them all, every output readable by later stages). The combine is traced once, when the reducer is
applied, on stand-in loads of the accumulators (`ReduceCall.accs`); lowering replaces those by loads
of the real buffers. The n update statements run one after another inside the reduction loops, so a
component is stored after every component whose new value reads its old one:

    for i:                                     # am = te.argmax(x[i, k], axis=k)
        am[i] = 9223372036854775807            # am_init
        am.argmax0[i] = -inf                   # am.argmax0_init  (the hidden value accumulator)
        for k:
            am[i] = select(x[i, k] > am.argmax0[i] or (x[i, k] == am.argmax0[i] and k < am[i]), k, am[i])
            am.argmax0[i] = select(..., x[i, k], am.argmax0[i])

A reducer declared here is commutative and associative by contract (TVM's meaning of comm_reducer):
the schedule checker may reassociate its updates (loopir.reassoc). argmax / argmin compare
(value, index) lexicographically, so ties go to the smallest index in any order of the updates, as
numpy's argmax gives; NaNs are not numpy's (a NaN never wins a comparison here).

This module holds the te-only nodes and the lowering of such a stage; `te` makes them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .dtypes import is_float, is_int
from .errors import ArgumentError, ArgumentTypeError
from . import nodes
from .nodes import Buffer, Const, Expr, For, Load, Stmt, Store, Var
from .te_lift import Reduce
from .visit import Transformer, seq, walk

_COMBINE = {"sum": "add", "max": "max", "min": "min"}


class ReduceCall:
    """One application of a reducer: its stand-in accumulators, the combined values (in terms of those
    and the operands), the identities and the order the component updates are stored in."""

    def __init__(self, reducer: Any, accs: tuple[Buffer, ...], combined: tuple[Expr, ...],
                 identity: tuple[Const, ...], order: tuple[int, ...]) -> None:
        self.reducer = reducer
        self.accs = accs
        self.combined = combined
        self.identity = identity
        self.order = order

    def __repr__(self) -> str:
        return f"ReduceCall({self.reducer.name!r})"


@dataclass(frozen=True, slots=True)
class TupleReduce(Reduce):
    """Component `index` of a user (or tuple) reduction of `operands` over `axis`. Exists only in te;
    it must be the whole body of a stage (or an element of the tuple a stage's lambda returns). A `Reduce`
    (so code asking "is this stage a reduction" sees one) whose `op` is the reducer's name and whose `body`
    is its own operand; `call` holds the combine."""

    call: ReduceCall | None = None
    operands: tuple[Expr, ...] = ()
    index: int = 0

    def __repr__(self) -> str:
        return f"TupleReduce({self.op}[{self.index}], axis={[a.name for a in self.axis]})"


def tuple_reduce(call: ReduceCall, operands: tuple[Expr, ...], axis: tuple[Var, ...], index: int) -> TupleReduce:
    return TupleReduce(call.reducer.name, operands[index], axis, operands[index].dtype, call, operands, index)


def store_order(name: str, combined: tuple[Expr, ...], accs: tuple[Buffer, ...]) -> tuple[int, ...]:
    """An order of the component updates in which none reads an accumulator already overwritten in the same
    iteration: component m goes before j when m's new value reads j's old one. A cycle is refused."""
    n = len(combined)
    reads = [{j for j in range(n) if any(isinstance(e, Load) and e.buffer is accs[j] for e in walk(c))} - {m}
             for m, c in enumerate(combined)]
    order: list[int] = []
    left = list(range(n))
    while left:
        # j can be stored now when no component still to store reads its old value
        ready = [j for j in left if not any(j in reads[m] for m in left if m != j)]
        if not ready:
            raise ArgumentError(
                f"reducer {name!r}: the new values of components {', '.join(map(str, left))} each read the old value "
                "of another, so no order of their updates keeps every old value; rewrite the combine so that "
                "one component reads only the old values of the others")
        order.append(ready[0])
        left.remove(ready[0])
    return tuple(order)


class _Accs(Transformer):
    def __init__(self, repl: dict[Buffer, Load]) -> None:
        self.repl = repl

    def visit_Load(self, e: Load) -> Expr:
        new = self.repl.get(e.buffer)
        return new if new is not None else self.generic(e)


def is_group(bodies: Sequence[Expr]) -> bool:
    """True when the stage needs `lower_stage` (several outputs, or a user reducer)."""
    return len(bodies) > 1 or isinstance(bodies[0], TupleReduce)


def lower_stage(names: Sequence[str], bufs: Sequence[Buffer], bodies: Sequence[Expr], axis: tuple[Var, ...],
                reduce_axis: tuple[Var, ...], reduce_dom: tuple[tuple[Expr, Expr], ...]) -> Stmt:
    """The nest (inside the stage's spatial loops) of a stage writing `bufs[j] = bodies[j]`: inits, then the
    updates in the reduction loops; a plain multi-output stage is one statement per output."""
    idx: tuple[Expr, ...] = axis
    if not isinstance(bodies[0], (Reduce, TupleReduce)):
        return seq(*(Store(n, b, idx, e, axis, axis) for n, b, e in zip(names, bufs, bodies)))
    iters = axis + reduce_axis
    inits: list[Stmt] = []
    updates: list[Stmt] = []
    if isinstance(bodies[0], TupleReduce):
        call = bodies[0].call
        assert call is not None
        repl = {a: Load(b, idx) for a, b in zip(call.accs, bufs)}
        for j in range(len(bufs)):
            inits.append(Store(f"{names[j]}_init", bufs[j], idx, call.identity[j], axis, axis))
        for j in call.order:
            updates.append(Store(names[j], bufs[j], idx, _Accs(repl).visit(call.combined[j]), iters, iters))
    else:
        for n, b, r in zip(names, bufs, bodies):
            assert isinstance(r, Reduce)
            inits.append(Store(f"{n}_init", b, idx, builtin_identity(r.op, r.dtype), axis, axis))
            updates.append(Store(n, b, idx, nodes.binary(_COMBINE[r.op], Load(b, idx), r.body), iters, iters))
    inner: Stmt = seq(*updates)
    for k, (lo, hi) in reversed(list(zip(reduce_axis, reduce_dom))):
        inner = For(k, lo, hi, inner)
    return seq(*inits, inner)


def builtin_identity(op: str, dtype: str) -> Const:
    """The identity of sum / max / min in `dtype` (te.identity)."""
    if op == "sum":
        return nodes.const(0, dtype)
    if is_float(dtype):
        return nodes.const(float("-inf") if op == "max" else float("inf"), dtype)
    if is_int(dtype):
        info = np.iinfo(dtype)
        return nodes.const(int(info.min) if op == "max" else int(info.max), dtype)
    raise ArgumentTypeError(f"no identity of {op} in dtype {dtype}")


# ----------------------------------------------------------------------------- reducers


class CommReducer:
    """A commutative, associative reducer (TVM's `te.comm_reducer`): `combine(lhs, rhs)` -> the combined
    value, `identity` its neutral element; over a tuple of values, `combine` takes and returns tuples and
    `identity` gives one value per component. Call it like te.sum: `r(expr, axis=k)`, or `r((a, b), axis=k)`
    for a tuple reducer (it returns one reduction per component)."""

    def __init__(self, combine: Callable[..., Any], identity: Any, name: str,
                 check_axes: Callable[[str, Any], tuple[Var, ...]], commutative: bool = True) -> None:
        if not callable(combine):
            raise ArgumentTypeError(f"comm_reducer {name!r}: combine must be a function (lhs, rhs) -> value, "
                                    f"got {type(combine).__name__} {combine!r}")
        self.combine = combine
        self.identity = identity
        self.name = name
        if not isinstance(commutative, bool):
            raise ArgumentTypeError(f"comm_reducer {name!r}: commutative must be True or False, got {commutative!r}")
        # False: an ordered fold (its updates keep their order; the checker does not reassociate them)
        self.commutative = commutative
        self.exact = False  # True: reassociating it changes no bit (argmax / argmin), so explain() notes nothing
        self._check_axes = check_axes

    def __repr__(self) -> str:
        return f"CommReducer({self.name!r})"

    def __call__(self, expr: Any, axis: Any = None) -> Any:
        axes = self._check_axes(self.name, axis)
        single = not isinstance(expr, (tuple, list))
        operands = tuple(_operand(self.name, e) for e in ((expr,) if single else expr))
        if not operands:
            raise ArgumentError(f"reducer {self.name!r}: no values to reduce")
        dtypes = tuple(e.dtype for e in operands)
        accs = tuple(Buffer(f"_{self.name}_acc{j}", (), dt) for j, dt in enumerate(dtypes))
        lhs = tuple(Load(a, ()) for a in accs)
        out = self.combine(lhs[0], operands[0]) if single else self.combine(lhs, operands)
        combined = _as_tuple(self.name, out, len(operands), "combine")
        combined = tuple(c if c.dtype == dt else nodes.cast(dt, c) for c, dt in zip(combined, dtypes))
        ident = self.identity(*dtypes) if callable(self.identity) else self.identity
        idents = tuple(_ident(self.name, v, dt) for v, dt in zip(_as_tuple(self.name, ident, len(operands),
                                                                            "identity", exprs=False), dtypes))
        call = ReduceCall(self, accs, combined, idents, store_order(self.name, combined, accs))
        parts = tuple(tuple_reduce(call, operands, axes, j) for j in range(len(operands)))
        return parts[0] if single else parts


def _operand(name: str, e: Any) -> Expr:
    if hasattr(e, "op") and hasattr(e, "buffer"):
        raise ArgumentTypeError(f"reducer {name!r}: got the tensor {e.name!r}; reduce an element such as "
                                f"{e.name}[i, k]")
    try:
        x = nodes.as_expr(e)
    except TypeError as err:
        raise ArgumentTypeError(f"reducer {name!r}: cannot reduce {e!r}") from err
    if isinstance(x, (Reduce, TupleReduce)) or any(isinstance(n, (Reduce, TupleReduce)) for n in walk(x)):
        raise ArgumentError(f"reducer {name!r}: a reduction inside the operand of a user reducer; compute it in a "
                            "stage of its own first")
    if x.dtype == "bool":
        raise ArgumentTypeError(f"reducer {name!r} of a condition; cast it first: te.cast('int32', cond)")
    return x


def _as_tuple(name: str, out: Any, n: int, what: str, exprs: bool = True) -> tuple[Any, ...]:
    xs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    if len(xs) != n:
        raise ArgumentError(f"reducer {name!r}: {what} gave {len(xs)} value(s) for {n} reduced value(s)")
    if exprs:
        try:
            return tuple(nodes.as_expr(x) for x in xs)
        except TypeError as err:
            raise ArgumentTypeError(f"reducer {name!r}: combine must return expressions, got {out!r}") from err
    return xs


def _ident(name: str, v: Any, dtype: str) -> Const:
    if isinstance(v, Const):
        return v if v.dtype == dtype else nodes.const(v.value, dtype)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ArgumentTypeError(f"reducer {name!r}: an identity must be a number or te.const, got {v!r}")
    return nodes.const(v, dtype)


def _argcombine(greater: bool) -> Callable[[Any, Any], tuple[Expr, Expr]]:
    def combine(lhs: Any, rhs: Any) -> tuple[Expr, Expr]:
        (v0, i0), (v1, i1) = lhs, rhs
        better = v1 > v0 if greater else v1 < v0
        take = nodes.logical("or", better, nodes.logical("and", v1.eq(v0), i1 < i0))
        # the value needs no index (on a tie both are equal): so the index is stored first, then the value
        return nodes.binary("max" if greater else "min", v0, v1), nodes.select(take, i1, i0)

    return combine


def _arg_identity(greater: bool) -> Callable[[str, str], tuple[Const, Const]]:
    def identity(vdt: str, idt: str) -> tuple[Const, Const]:
        return builtin_identity("max" if greater else "min", vdt), nodes.const(int(np.iinfo(idt).max), idt)

    return identity


def flat_index(axes: Sequence[Var], dom_of: Callable[[Var], tuple[Expr, Expr]]) -> Expr:
    """The row-major position of the reduce axes' point in their box (numpy's flat index)."""
    index: Expr | None = None
    for k in axes:
        lo, hi = dom_of(k)
        pos = k if isinstance(lo, Const) and lo.value == 0 else k - lo
        index = pos if index is None else index * (hi - lo) + pos
    assert index is not None
    return index


def arg_reduce(kind: str, check_axes: Callable[[str, Any], tuple[Var, ...]],
               dom_of: Callable[[Var], tuple[Expr, Expr]], expr: Any, axis: Any) -> TupleReduce:
    """te.argmax / te.argmin: component 1 (the index) of a (value, index) reducer; the index of a reduction
    over several axes is the row-major position in their box (numpy's flat index)."""
    axes = check_axes(kind, axis)
    red = CommReducer(_argcombine(kind == "argmax"), _arg_identity(kind == "argmax"), kind, check_axes)
    red.exact = True
    index = flat_index(axes, dom_of)
    value = _operand(kind, expr)
    parts = red((value, index), axis=axes)
    return parts[1]


__all__ = ["CommReducer", "ReduceCall", "TupleReduce", "arg_reduce", "builtin_identity", "flat_index", "is_group",
           "lower_stage", "store_order", "tuple_reduce"]
