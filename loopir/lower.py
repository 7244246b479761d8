"""Lowering: tensor expressions to the loop IR, one loop nest per stage.

    C = te.compute((n, m), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")

lowers to

    for i in range(0, n):
        for j in range(0, m):
            C[i, j] = 0.0                          # C_init
            for k in range(0, p):
                C[i, j] = C[i, j] + A[i, k] * B[k, j]   # C

The loop variables are the stage's own axis Vars (so every Store has `coords == iters`),
stages come in topological order, intermediates become `Program.temps`, and
`Program.params` are the size variables that the shapes and bounds use.

Names: a size variable, a tensor and a loop variable may share a name (`te.var("b")` beside a placeholder
named "b", `lambda i: ...` over a size `i`). Nothing here renames them: the IR identifies Vars and Buffers by
object, and each text made from it gives clashing objects distinct names (`loopir.printer` shows the size `b`
as `b_size`, a clashing loop variable as `i_1`; `codegen.names` mangles C and LLVM identifiers), while callers
keep passing sizes by the names they gave.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar

from .errors import ArgumentError, ArgumentTypeError
from . import nodes
from .names import sanitize
from .nodes import Buffer, Const, Expr, For, Program, Stmt, Store, Var
from .te import ComputeOp, PlaceholderOp, Reduce, Tensor, identity
from .te_reduce import TupleReduce, is_group, lower_stage
from .te_scan import Recurrence, definition_stores, statement_names
from .visit import free_vars, seq, walk

_COMBINE = {"sum": "add", "max": "max", "min": "min"}


def _as_list(x: Tensor | Sequence[Tensor], what: str) -> list[Tensor]:
    xs = [x] if isinstance(x, Tensor) else list(x)
    for t in xs:
        if not isinstance(t, Tensor):
            raise ArgumentTypeError(f"lower: {what} must be te tensors, got {type(t).__name__} {t!r}")
    return xs


def _topo(roots: list[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
    """(compute stages in dependence order, placeholders in first-use order)."""
    order: list[Tensor] = []
    placeholders: list[Tensor] = []
    state: dict[int, int] = {}  # id -> 1 visiting, 2 done

    def visit(t: Tensor) -> None:
        s = state.get(id(t))
        if s == 2:
            return
        if s == 1:  # cannot be built with te (a tensor exists before its readers), but stay safe
            raise ArgumentError(f"lower: tensor {t.name!r} depends on itself")
        state[id(t)] = 1
        if isinstance(t.op, ComputeOp):
            for u in t.op.inputs:
                visit(u)
            # a multi-output stage is one nest: all its outputs come together, the first one lowers it
            for o in t.op.outputs or (t,):
                if state.get(id(o)) != 2:
                    order.append(o)
                    state[id(o)] = 2
        else:
            placeholders.append(t)
        state[id(t)] = 2

    for r in roots:
        visit(r)
    return order, placeholders


def _check_names(tensors: list[Tensor]) -> None:
    seen: dict[str, Tensor] = {}
    for t in tensors:
        other = seen.setdefault(t.name, t)
        if other is not t:
            raise ArgumentError(
                f"lower: two different tensors are named {t.name!r} in one program "
                f"({other!r} and {t!r}); give each tensor its own name"
            )
    stmt_names = {t.name for t in tensors}
    for t in tensors:
        red = isinstance(t.op, ComputeOp) and isinstance(_body(t), (Reduce, TupleReduce))
        if red and f"{t.name}_init" in stmt_names:
            raise ArgumentError(
                f"lower: the init statement of reduction {t.name!r} would be named {t.name + '_init'!r}, "
                "which is the name of another tensor"
            )
        for extra in _extra_statements(t):
            if extra in stmt_names:
                raise ArgumentError(f"lower: a statement of recurrence {t.name!r} would be named {extra!r}, which "
                                    "is the name of another tensor")
    # isl formulas name statements by identifier (`names.sanitize`): a stage lifted from an inline reduction
    # (`y.sum0`) and a user's `y_sum0` would be one statement there
    idents: dict[str, str] = {}
    for t in tensors:
        for s in dict.fromkeys((t.name, f"{t.name}_init", *_extra_statements(t))):
            other = idents.setdefault(sanitize(s), s)
            if other != s:
                raise ArgumentError(
                    f"lower: statements {other!r} and {s!r} have one identifier, {sanitize(s)!r}, in the "
                    "dependence analysis; rename the tensor whose name has no dot"
                )


def _extra_statements(t: Tensor) -> list[str]:
    """The statements of a recurrence besides `<name>` (te.scan / te.update: one per definition)."""
    body = getattr(t.op, "body", None)
    return [s for s in statement_names(t.name, len(body.defs)) if s != t.name] if isinstance(body, Recurrence) else []


def _recurrence(t: Tensor, rec: Recurrence) -> Stmt:
    # one nest per definition, in order, each over its own box (te.scan: the init rows, then the later rows)
    nests = []
    for d, st in zip(rec.defs, definition_stores(t.name, t.buffer, rec)):
        nest: Stmt = st
        for v, lo, hi in reversed(list(zip(d.axis, d.lo, d.hi))):
            nest = For(v, lo, hi, nest)
        nests.append(nest)
    return seq(*nests)


def _loop_vars(op: ComputeOp) -> tuple[Var, ...]:
    if isinstance(op.body, Recurrence):
        return tuple(v for d in op.body.defs for v in d.axis)
    return op.axis + op.reduce_axis


def _body(t: Tensor) -> Expr:
    """The body of tensor `t` (its own output's, in a multi-output stage)."""
    assert isinstance(t.op, ComputeOp)
    return t.op.bodies[t.value_index]


def _stage(t: Tensor) -> Stmt | None:
    op = t.op
    assert isinstance(op, ComputeOp)
    axis = op.axis
    buf = t.buffer
    idx: tuple[Expr, ...] = axis
    body = op.body
    if isinstance(body, Recurrence):
        return _recurrence(t, body)
    if is_group(op.bodies):
        if t.value_index != 0:
            return None  # lowered with output 0
        outs = op.outputs or (t,)
        nest = lower_stage([o.name for o in outs], [o.buffer for o in outs], op.bodies, axis, op.reduce_axis,
                           op.reduce_dom)
    elif isinstance(body, Reduce):
        init = Store(f"{t.name}_init", buf, idx, identity(body.op, body.dtype), axis, axis)
        iters = axis + op.reduce_axis
        value = nodes.binary(_COMBINE[body.op], buf[idx], body.body)
        inner: Stmt = Store(t.name, buf, idx, value, iters, iters)
        for k, (lo, hi) in reversed(list(zip(op.reduce_axis, op.reduce_dom))):
            inner = For(k, lo, hi, inner)
        nest: Stmt = seq(init, inner)
    else:
        nest = Store(t.name, buf, idx, body, axis, axis)
    for v, extent in reversed(list(zip(axis, t.shape))):
        nest = For(v, Const(0, "int64"), extent, nest)
    return nest


def lower(
    outputs: Tensor | Sequence[Tensor],
    args: Sequence[Tensor] | None = None,
    name: str | None = None,
) -> Program:
    """The loop-IR program computing `outputs`.

    `args` (call order) default to the placeholders in first-use order, then the outputs.
    Compute tensors listed in `args` are computed and kept as arguments; the other
    intermediates become `temps`. A placeholder read but missing from `args` is refused."""
    outs = _as_list(outputs, "outputs")
    if not outs:
        raise ArgumentError("lower: no outputs given")
    for t in outs:
        if isinstance(t.op, PlaceholderOp):
            raise ArgumentTypeError(f"lower: output {t.name!r} is a placeholder; there is nothing to compute")
    arg_list = None if args is None else _as_list(args, "args")
    roots = outs + [t for t in (arg_list or []) if isinstance(t.op, ComputeOp)]
    stages, placeholders = _topo(roots)

    if arg_list is None:
        arg_list = placeholders + [t for t in outs if all(t is not u for u in placeholders)]
        arg_list = list({id(t): t for t in arg_list}.values())
    else:
        seen: set[int] = set()
        for t in arg_list:
            if id(t) in seen:
                raise ArgumentError(f"lower: tensor {t.name!r} appears twice in args")
            seen.add(id(t))
        for t in placeholders:
            if id(t) not in seen:
                raise ArgumentError(
                    f"lower: placeholder {t.name!r} is read but is not among the args "
                    f"({', '.join(a.name for a in arg_list)})"
                )
        for t in outs:
            if id(t) not in seen:
                raise ArgumentError(f"lower: output {t.name!r} is not among the args")

    arg_ids = {id(t) for t in arg_list}
    temps = [t for t in stages if id(t) not in arg_ids]
    _check_names(arg_list + [t for t in stages + placeholders if id(t) not in arg_ids])

    body = seq(*(n for n in map(_stage, stages) if n is not None))
    prog_args = tuple(t.buffer for t in arg_list)
    prog_temps = tuple(t.buffer for t in temps)
    params = _params(prog_args, prog_temps, stages)
    _check_params(params, prog_args)
    _check_var_names(params, stages)
    return Program(name or outs[0].name, prog_args, body, prog_temps, params)


def _params(args: tuple[Buffer, ...], temps: tuple[Buffer, ...], stages: list[Tensor]) -> tuple[Var, ...]:
    """Size variables in first-use order: arg shapes, temp shapes, reduce bounds, bodies."""
    loop_vars: set[Var] = set()
    for t in stages:
        op = t.op
        assert isinstance(op, ComputeOp)
        loop_vars.update(_loop_vars(op))
    found: dict[Var, None] = {}

    def add(e: object) -> None:
        for v in sorted(free_vars(e), key=lambda v: _first_pos(e, v)):
            if v not in loop_vars:
                found.setdefault(v, None)

    for b in args + temps:
        for e in b.shape:
            add(e)
    for t in stages:
        op = t.op
        assert isinstance(op, ComputeOp)
        for lo, hi in op.reduce_dom:
            add(lo)
            add(hi)
        b = _body(t)
        for e in b.operands if isinstance(b, TupleReduce) else (b.body,) if isinstance(b, Reduce) else (b,):
            add(e)
    return tuple(found)


def _first_pos(e: object, v: Var) -> int:
    for k, n in enumerate(walk(e)):  # type: ignore[arg-type]
        if n is v:
            return k
    return 1 << 30


_SIZE_ARGS: ContextVar[frozenset[Var]] = ContextVar("size_args", default=frozenset())


@contextmanager
def size_arguments(sizes: Iterable[Var]) -> Iterator[None]:
    """Lower with `sizes` passed as scalar arguments of the call (`build(outs, [a, tsteps, b])`), so a size
    that no argument's shape carries is not refused."""
    token = _SIZE_ARGS.set(frozenset(sizes))
    try:
        yield
    finally:
        _SIZE_ARGS.reset(token)


def passed_sizes() -> frozenset[Var]:
    """The sizes `size_arguments` declares passed as arguments here (for a lowering that happens later)."""
    return _SIZE_ARGS.get()


def _check_params(params: tuple[Var, ...], args: tuple[Buffer, ...]) -> None:
    # every size variable must be recoverable from the argument shapes at call time, or passed as an argument
    known: set[Var] = set(_SIZE_ARGS.get())
    for b in args:
        for e in b.shape:
            known |= free_vars(e)
    for v in params:
        if v not in known:
            raise ArgumentError(
                f"lower: size variable {v.name!r} appears in no argument's shape, so no call can determine it; "
                "add a tensor shaped by it to the args"
            )


def _check_var_names(params: tuple[Var, ...], stages: list[Tensor]) -> None:
    # A size variable, a tensor and a loop variable may share a name: the IR identifies variables and buffers
    # by object, and every text made from it (the printer, isl formulas, C, LLVM IR, the interpreter's Python)
    # gives clashing objects distinct names. Two size variables of one name stay refused: a caller binds sizes
    # by name (`build(..., sizes={"n": 7})`, `bind_args(known=...)`), which could not tell them apart; two loop
    # variables of one stage likewise, since schedules find loops by name.
    sizes: dict[str, Var] = {}
    for v in params:
        if sizes.setdefault(v.name, v) is not v:
            raise ArgumentError(
                f"lower: two size variables are named {v.name!r}; sizes are passed by name "
                f"(build(..., sizes={{{v.name!r}: ...}})), so give each size variable (te.var) its own name"
            )
    for t in stages:
        op = t.op
        assert isinstance(op, ComputeOp)
        if isinstance(op.body, Recurrence):
            continue  # each definition is a nest of its own, its loop variables the lambda's distinct parameters
        local: set[str] = set()
        for v in op.axis + op.reduce_axis:
            if v.name in local:
                raise ArgumentError(f"lower: stage {t.name!r} has two loop variables named {v.name!r}; rename one")
            local.add(v.name)


__all__ = ["lower"]
