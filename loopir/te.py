"""Tensor expressions: the functional front end of loopir (in the line of TVM's `te`).

    n = te.var("n")
    x = te.placeholder((n,), dtype="float32", name="x")
    k = te.reduce_axis(n, name="k")
    s = te.compute((), lambda: te.sum(x[k], axis=k), name="s")
    y = te.compute((n,), lambda i: te.exp(x[i] - s[()]), name="y")

A stage (`te.compute`) names its loop variables after its lambda's parameters; those
are plain `nodes.Var` objects and become the loop variables of the lowered nest
(`loopir.lower`). A reduction (`te.sum / te.max / te.min`) may be the whole body of a stage
or sit anywhere inside it (several in one body, inside `te.where`, inside another reduction's
operand): one that is not the whole body is lifted into a stage of its own, named after the
enclosing stage (`y.sum0`, `y.max1`) and a function of only the enclosing axes its operand uses
(`loopir.te_lift`); `te.lifted(y)` returns those stages.

Recurrences: `te.scan` (TVM's: a recurrence along the first axis, init rows then updates reading earlier rows)
and `te.update` (Halide's update definitions over a domain of their own, scatters included) make stages that
later stages read like any other (`loopir.te_scan`).

Reducers beyond sum / max / min: `te.argmax` / `te.argmin` (the first index of the extreme, as numpy),
`te.comm_reducer(combine, identity, name=)` (TVM's user-defined commutative reducer, also over tuples of
values such as (value, index) pairs); a lambda returning a tuple makes a multi-output stage
(`s1, s2 = te.compute((m,), lambda i: (te.sum(x[i, k], axis=k), te.sum(x[i, k] * x[i, k], axis=k)))`:
one nest, one output tensor per element, `st.0` / `st.1` unless named). See `loopir.te_reduce`.

dtypes: float16, bfloat16, float32, float64, int8, uint8, int16, uint16, int32, int64, bool (small integers wrap
per operation as numpy's do; `saturate_cast` clamps; bfloat16 data on the host:
uint16 arrays of bits, `loopir.dtypes.to_bfloat16` / `from_bfloat16`; halves compute in float32).
Promotion (see `loopir.dtypes`): two typed operands combine as `numpy.promote_types`;
a Python scalar is *weak* and takes the other operand's dtype (numpy's NEP 50), except
that a Python float next to an integer or bool expression gives float64. Integer true
division `/` gives float64, as numpy. Index arithmetic on loop and size variables is int64.
Math functions of integers are computed in float64. Index arithmetic (loop and size variables,
no tensor element) next to a float value is weak like a Python int: `x[i] / n` with a float32
`x` is float32, as TVM and numpy with Python ints give.

Math functions: exp, log, sqrt, rsqrt, sin, cos, tanh, sigmoid, erf, abs, pow (power), fmod, floor, ceil,
round (halves to even) and the fast variants fast_exp / fast_log / fast_sin / fast_cos (CUDA's intrinsics on
float and halves; the accurate function elsewhere). Escape hatches (`loopir.te_extern`): `call_extern`,
`register_intrinsic`, `extern` (a whole stage computed by an external function).

Mistakes are refused when they are made, naming the thing: wrong index counts, a lambda
whose arity differs from the shape, unknown dtypes, float indices, a reduce axis used
outside its reduction, a reduction over a loop variable, a reduction without an axis, and
variables of one stage leaking into another. `lower` refuses two tensors with one name in one program.
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import nodes, te_scan
from .dtypes import DTYPES, INDEX, check_dtype
from .errors import ArgumentError, ArgumentTypeError
from .nodes import Buffer, Const, Expr, ExprLike, Load, Node, Var
from .te_extern import EXTERN_DTYPES, ExternStage, call_extern, register_intrinsic, set_stage_interp, stage_args
from .te_lift import Reduce, has_reduce, lift
from .te_math import (  # noqa: F401 - the elementwise operations are te's
    abs, cast, ceil, const, cos, erf, exp, fast_cos, fast_exp, fast_log, fast_sin, floor, fmod, log, maximum,
    minimum, pow, power, round, rsqrt, saturate_cast, saturating_cast, sigmoid, sin, sqrt, tanh, where,
)
from . import te_math
from .te_reduce import CommReducer, TupleReduce, arg_reduce, builtin_identity, flat_index, tuple_reduce
from .visit import substitute, walk

float16, float32, float64, int32, int64, bool_ = "float16", "float32", "float64", "int32", "int64", "bool"
bfloat16 = "bfloat16"
int8, uint8, int16, uint16 = "int8", "uint8", "int16", "uint16"

SizeLike = int | Expr
REDUCE_OPS = ("sum", "max", "min")

# Bookkeeping keyed by Var identity (Vars are slotted, hence not weak-referenceable; the
# entries are tiny). They let a stage tell its own variables from another stage's.
_AXIS_OWNER: dict[Var, str] = {}  # loop variable -> the stage whose lambda made it
_REDUCE_DOM: dict[Var, tuple[Expr, Expr]] = {}  # reduce axis -> (lo, hi)
_REDUCE_OWNER: dict[Var, str] = {}  # reduce axis -> the stage whose reduction uses it
_TENSOR_OF: weakref.WeakValueDictionary[int, Tensor] = weakref.WeakValueDictionary()  # id(buffer) -> tensor
_counter = itertools.count()
_SCALARS: dict[int, Tensor] = {}  # id(buffer) -> the 0-d tensor of a scalar argument (te.var with a float dtype)
# tensors created while a compute's lambda runs, one list per open compute (kept alive until its
# inputs are collected: a stage made inside a lambda is referenced by nothing else)
_BUILDING: list[list[Tensor]] = []


# ----------------------------------------------------------------------------- tensors and operations


class PlaceholderOp:
    """An input of the program."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.inputs: tuple[Tensor, ...] = ()

    def __repr__(self) -> str:
        return f"PlaceholderOp({self.name!r})"


class ComputeOp:
    """A stage: `out[axis] = body`. For a reduction `body` is a `Reduce` over `reduce_axis`,
    whose half-open bounds are `reduce_dom` (aligned with `reduce_axis`). `inputs` are the
    tensors the body reads, in first-use order. `lifted` are the stages made from the inline
    reductions of the lambda (`te.lifted`), inner ones first; the body reads them."""

    def __init__(
        self,
        name: str,
        axis: tuple[Var, ...],
        body: Expr,
        reduce_axis: tuple[Var, ...],
        reduce_dom: tuple[tuple[Expr, Expr], ...],
        inputs: tuple[Tensor, ...],
        lifted: tuple[Tensor, ...] = (),
    ) -> None:
        self.name = name
        self.axis = axis
        self.body = body
        self.reduce_axis = reduce_axis
        self.reduce_dom = reduce_dom
        self.inputs = inputs
        self.lifted = lifted
        # a multi-output stage (a tuple of reductions, a user reducer over several values): one body per
        # output, `outputs[j]` the tensor of `bodies[j]` (`Tensor.value_index` is j); `body` is bodies[0]
        self.bodies: tuple[Expr, ...] = (body,)
        self.outputs: tuple[Tensor, ...] = ()

    def __repr__(self) -> str:
        return f"ComputeOp({self.name!r}, axis={[a.name for a in self.axis]})"


class Tensor:
    """A named, typed, shaped array produced by a placeholder or a compute stage.

    `t[i, j]` is a `nodes.Load` of `t.buffer`, the buffer the tensor lowers to."""

    __slots__ = ("__weakref__", "buffer", "dtype", "name", "op", "shape", "value_index")

    def __init__(self, name: str, shape: tuple[Expr, ...], dtype: str, op: PlaceholderOp | ComputeOp) -> None:
        self.name = name
        self.shape = shape
        self.dtype = dtype
        self.op = op
        self.value_index = 0  # which output of a multi-output stage (te_reduce)
        self.buffer = Buffer(name, shape, dtype)
        _TENSOR_OF[id(self.buffer)] = self
        for frame in _BUILDING:  # a stage made inside another stage's lambda lives until that stage holds it
            frame.append(self)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __getitem__(self, idx: Any) -> Load:
        idx = idx if isinstance(idx, tuple) else (idx,)
        if len(idx) != len(self.shape):
            raise IndexError(
                f"tensor {self.name!r} has {len(self.shape)} dimension(s) but was indexed with {len(idx)} index(es)"
            )
        out = []
        for k, i in enumerate(idx):
            if isinstance(i, Tensor):
                raise ArgumentTypeError(f"index {k} of tensor {self.name!r} is the tensor {i.name!r}; index it first")
            if isinstance(i, slice):
                raise ArgumentTypeError(
                    f"index {k} of tensor {self.name!r} is a slice; te indexes one element at a time")
            out.append(nodes.as_index(_py(i), f"index {k} of tensor {self.name!r}"))
        return Load(self.buffer, tuple(out))

    def __bool__(self) -> bool:
        return True

    def __iter__(self) -> Any:
        raise ArgumentTypeError(f"tensor {self.name!r} is not iterable; index it as {self.name}[i, ...]")

    def __repr__(self) -> str:
        dims = ", ".join(_show(s) for s in self.shape) + ("," if len(self.shape) == 1 else "")
        return f"Tensor({self.name!r}, ({dims}), {self.dtype})"


te_math.TENSOR_TYPES.append(Tensor)  # te_math refuses a tensor where an element belongs


def _show(e: Expr) -> str:
    if isinstance(e, Const):
        return str(e.value)
    if isinstance(e, Var):
        return e.name
    try:
        return str(e)
    except (ImportError, TypeError, AttributeError, NotImplementedError):  # printer may be absent or partial
        return repr(e)


def _py(x: Any) -> Any:
    """numpy integers (e.g. from an array's shape arithmetic) count as Python ints."""
    return int(x) if isinstance(x, np.integer) else x


def tensor_of(buffer: Buffer) -> Tensor | None:
    """The tensor whose buffer this is (None for buffers not made by te)."""
    return _TENSOR_OF.get(id(buffer))


# ----------------------------------------------------------------------------- sizes, inputs, stages


def var(name: str = "n", dtype: str = INDEX) -> Var | Load:
    """A symbolic integer size (int32 / int64: a `Var`). Arithmetic on it (`n - 1`, `2 * n`, `n // 2`) builds
    expressions. A size that no argument's shape carries (a time-step count) is passed in the call's argument
    order when listed in `build(..., args)` (`build(outs, [a, n, b])`, `mod(a_arr, 10, b_arr)`; a negative
    value is refused), or by name (`interp.run(..., sizes={"n": 10})`).

    Any other dtype (float32, float64, float16, bfloat16, a small integer) makes a *scalar argument*: the
    value `alpha` usable in expressions (`x[i] * alpha`), passed in the call's argument order like an array
    (`build(outs, [a, alpha, b])`, then `mod(a_arr, 2.5, b_arr)`). It is a 0-d read-only tensor read as
    `alpha[()]` (what this returns); a call may also pass a 0-d numpy array."""
    _check_name(name, "size variable")
    dt = check_dtype(dtype, f"dtype of size variable {name!r}")
    if dt in ("int32", "int64"):
        return Var(name, INDEX)
    if dt == "bool":
        raise ArgumentTypeError(f"scalar argument {name!r} cannot be bool; pass an int32 or a float")
    t = placeholder((), dt, name)
    _SCALARS[id(t.buffer)] = t  # the Load below is all the caller holds: keep its tensor alive
    return t[()]


def scalar_tensor(x: object) -> Tensor | None:
    """The 0-d tensor of a scalar argument made by `var(name, float dtype)` (its Load), else None."""
    if isinstance(x, Load) and not x.indices:
        return _SCALARS.get(id(x.buffer))
    return None


def _check_name(name: object, what: str) -> str:
    if not isinstance(name, str) or not name.isidentifier():
        raise ArgumentError(f"the name of a {what} must be an identifier, got {name!r}")
    return name


def _default_name(base: str) -> str:
    return f"{base}{next(_counter)}"


def _shape(shape: SizeLike | Sequence[SizeLike], who: str) -> tuple[Expr, ...]:
    if isinstance(shape, (int, np.integer, Expr)) and not isinstance(shape, bool):
        shape = (shape,)
    if not isinstance(shape, (tuple, list)):
        raise ArgumentTypeError(f"the shape of {who} must be a tuple of sizes, got {type(shape).__name__} {shape!r}")
    out = []
    for k, s in enumerate(map(_py, shape)):
        what = f"shape entry {k} of {who}"
        if isinstance(s, (bool, float)):
            raise ArgumentTypeError(f"{what} must be an integer or a size variable, got {type(s).__name__} {s!r}")
        e = nodes.as_index(s, what)
        if isinstance(e, Const) and e.value < 0:
            raise ArgumentError(f"{what} is negative: {e.value}")
        for n in _walk(e):
            if isinstance(n, Load):
                raise ArgumentTypeError(f"{what} reads tensor {n.buffer.name!r}; shapes use only sizes")
            if isinstance(n, Var) and (n in _AXIS_OWNER or n in _REDUCE_DOM):
                raise ArgumentError(
                    f"{what} uses the loop variable {n.name!r}; shapes use only size variables (te.var)"
                )
        out.append(e)
    return tuple(out)


def placeholder(shape: SizeLike | Sequence[SizeLike], dtype: str = "float32", name: str | None = None) -> Tensor:
    """An input tensor of the given shape (ints and size expressions) and dtype."""
    name = _default_name("placeholder") if name is None else _check_name(name, "tensor")
    dt = check_dtype(dtype, f"dtype of placeholder {name!r}")
    return Tensor(name, _shape(shape, f"placeholder {name!r}"), dt, PlaceholderOp(name))


def reduce_axis(dom: SizeLike | tuple[SizeLike, SizeLike], name: str = "k") -> Var:
    """A reduction variable over `range(dom)` or `range(lo, hi)` (half-open).

    Use it in exactly one reduction (`te.sum(..., axis=k)`); each stage needs its own."""
    _check_name(name, "reduce axis")
    if isinstance(dom, (tuple, list)):
        if len(dom) != 2:
            raise ArgumentTypeError(f"reduce axis {name!r}: give an extent or a (lo, hi) pair, got {dom!r}")
        lo_, hi_ = dom
    else:
        lo_, hi_ = 0, dom
    lo = nodes.as_index(_py(lo_), f"lower bound of reduce axis {name!r}")
    hi = nodes.as_index(_py(hi_), f"upper bound of reduce axis {name!r}")
    if isinstance(lo, Const) and isinstance(hi, Const) and hi.value < lo.value:
        raise ArgumentError(f"reduce axis {name!r} has an empty negative range [{lo.value}, {hi.value})")
    v = Var(name, INDEX)
    _REDUCE_DOM[v] = (lo, hi)
    return v


def _lambda_arity(fcompute: Callable[..., Any], ndim: int, name: str) -> list[str]:
    if not callable(fcompute):
        raise ArgumentTypeError(f"compute {name!r}: the body must be a function of the indices, got {fcompute!r}")
    try:
        sig = inspect.signature(fcompute)
    except (TypeError, ValueError) as e:
        raise ArgumentTypeError(f"compute {name!r}: cannot read the parameters of {fcompute!r}") from e
    names: list[str] = []
    for p in sig.parameters.values():
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            if p.default is not p.empty:
                break
            names.append(p.name)
        elif p.kind == p.VAR_POSITIONAL and len(names) <= ndim:  # lambda *idx: one variable per dimension
            return names + [f"{p.name}{k}" for k in range(ndim - len(names))]
    if len(names) != ndim:
        raise ArgumentTypeError(
            f"compute {name!r}: the lambda takes {len(names)} index argument(s) "
            f"({', '.join(names) or 'none'}) but the shape has {ndim} dimension(s)"
        )
    return names


def compute(shape: SizeLike | Sequence[SizeLike], fcompute: Callable[..., ExprLike], name: str | None = None) -> Tensor:
    """A stage: `out[i, j, ...] = fcompute(i, j, ...)` over `shape`.

    The loop variables are named after the lambda's parameters. A reduction (`te.sum/max/min`)
    that is not the whole body becomes a stage of its own (`te.lifted`). A lambda returning a tuple
    makes a multi-output stage and `compute` returns a tuple of tensors (`<name>.0`, `<name>.1`, ...): all
    te.sum/max/min over the same reduce axes, all the components of one te.comm_reducer call (TVM's tuple
    form), or all plain expressions — one nest computes them (see loopir.te_reduce)."""
    name = _default_name("compute") if name is None else _check_name(name, "tensor")
    shp = _shape(shape, f"compute {name!r}")
    names = _lambda_arity(fcompute, len(shp), name)
    axis = tuple(Var(n, INDEX) for n in names)
    for v in axis:
        _AXIS_OWNER[v] = name
    frame: list[Tensor] = []
    _BUILDING.append(frame)
    try:
        return _compute(name, shp, axis, fcompute)
    finally:
        popped = _BUILDING.pop()
        assert popped is frame, "te.compute frames closed out of order"


def _compute(name: str, shp: tuple[Expr, ...], axis: tuple[Var, ...], fcompute: Callable[..., ExprLike]) -> Any:
    result = fcompute(*axis)
    if isinstance(result, (tuple, list)) or isinstance(result, TupleReduce):
        return _compute_multi(name, shp, axis, result)
    if isinstance(result, Tensor):
        raise ArgumentTypeError(f"compute {name!r}: the lambda returned the tensor {result.name!r}; index it")
    try:
        body = nodes.as_expr(result)
    except TypeError as e:
        raise ArgumentTypeError(f"compute {name!r}: the lambda must return an expression, got {result!r}") from e
    if any(isinstance(n, TupleReduce) for n in walk(body)):
        raise ArgumentError(f"compute {name!r}: a user reduction (argmax, argmin, comm_reducer) must be the whole "
                            "body of its stage; compute it in a stage of its own and read that")
    _check_scoped(name, axis, body)
    body, lifted_stages = lift(name, shp, axis, body, _REDUCE_DOM.__getitem__, _make_lifted)
    red_axes = body.axis if isinstance(body, Reduce) else ()
    return _stage(name, shp, axis, body, red_axes, tuple(_REDUCE_DOM[k] for k in red_axes), lifted_stages)


def _compute_multi(name: str, shp: tuple[Expr, ...], axis: tuple[Var, ...], result: Any) -> Any:
    """A stage with several outputs (te_reduce): the lambda returned a tuple — of plain expressions, of
    te.sum / max / min over the same reduce axes, or of the components of one user reducer — or one
    component of a user reducer (whose other components become hidden outputs `<name>.<reducer><j>`)."""
    single = isinstance(result, TupleReduce)
    elems = [result] if single else list(result)
    if not elems:
        raise ArgumentError(f"compute {name!r}: the lambda returned an empty tuple")
    bodies: list[Expr] = []
    for j, r in enumerate(elems):
        if isinstance(r, Tensor):
            raise ArgumentTypeError(f"compute {name!r}: element {j} of the result is the tensor {r.name!r}; index it")
        try:
            bodies.append(nodes.as_expr(r))
        except TypeError as e:
            raise ArgumentTypeError(f"compute {name!r}: element {j} of the result is not an expression: {r!r}") from e
    kinds = {type(b) if isinstance(b, (Reduce, TupleReduce)) else Expr for b in bodies}
    if len(kinds) > 1:
        raise ArgumentError(f"compute {name!r}: the elements of the result mix reductions of different kinds and "
                            "plain expressions; a multi-output stage is all te.sum/max/min over the same axes, all "
                            "the components of one reducer, or all plain expressions")
    first = bodies[0]
    names: list[str] = []
    out_bodies: list[Expr] = list(bodies)
    visible = list(range(len(bodies)))
    if isinstance(first, TupleReduce):
        call = first.call
        if any(b.call is not call for b in bodies):  # type: ignore[attr-defined]
            raise ArgumentError(f"compute {name!r}: the result holds components of two different reductions; one "
                                "stage computes one reducer call")
        n = len(call.accs)
        idxs = [b.index for b in bodies]  # type: ignore[attr-defined]
        if len(set(idxs)) != len(idxs):
            raise ArgumentError(f"compute {name!r}: a component of reducer {call.reducer.name!r} is returned twice")
        out_bodies = list(bodies) + [tuple_reduce(call, first.operands, first.axis, j)
                                     for j in range(n) if j not in idxs]
        # the stage's outputs in component order; the user sees those returned, in the order returned
        out_bodies.sort(key=lambda b: b.index)  # type: ignore[attr-defined]
        visible = [idxs.index(j) if j in idxs else -1 for j in range(n)]
        red_axes = first.axis
        for b in bodies:
            for op in b.operands:  # type: ignore[attr-defined]
                _check_scoped(name, axis + red_axes, op)
        for k in red_axes:
            _check_scoped_dom(name, axis, k)
    elif isinstance(first, Reduce):
        red_axes = first.axis
        for b in bodies:
            assert isinstance(b, Reduce)
            if len(b.axis) != len(red_axes) or any(a is not c for a, c in zip(b.axis, red_axes)):
                raise ArgumentError(f"compute {name!r}: the reductions of a multi-output stage run over the same "
                                    f"reduce axes, in one order ({', '.join(k.name for k in red_axes)} here)")
            if has_reduce(b.body):
                raise ArgumentError(f"compute {name!r}: a reduction inside a reduction of a multi-output stage; "
                                    "compute the inner one in a stage of its own first")
            _check_scoped(name, axis, b)
    else:
        red_axes = ()
        for b in bodies:
            if has_reduce(b) or any(isinstance(x, TupleReduce) for x in walk(b)):
                raise ArgumentError(f"compute {name!r}: a reduction inside an element of a multi-output result; "
                                    "compute it in a stage of its own, or return reductions only")
            _check_scoped(name, axis, b)
    if isinstance(first, TupleReduce):
        red = first.call.reducer.name
        names = [f"{name}.{red}{j}" if visible[j] < 0 else name if single else f"{name}.{visible[j]}"
                 for j in range(len(out_bodies))]
    else:
        names = [name] if len(bodies) == 1 else [f"{name}.{j}" for j in range(len(bodies))]
    dom = tuple(_REDUCE_DOM[k] for k in red_axes)
    seen: dict[int, Tensor] = {}
    for b in out_bodies:
        for t in _inputs(name, b):
            seen.setdefault(id(t), t)
    for k in red_axes:
        _REDUCE_OWNER[k] = name
    op = ComputeOp(name, axis, out_bodies[0], red_axes, dom, tuple(seen.values()))
    op.bodies = tuple(out_bodies)
    outs = []
    for j, (n, b) in enumerate(zip(names, out_bodies)):
        t = Tensor(n, shp, b.dtype, op)
        t.value_index = j
        outs.append(t)
    op.outputs = tuple(outs)
    if single:
        return outs[next(j for j in range(len(outs)) if visible[j] == 0)]
    if isinstance(first, TupleReduce):
        return tuple(outs[visible.index(k)] for k in range(len(bodies)))
    return tuple(outs)


def _check_scoped_dom(stage: str, axis: tuple[Var, ...], k: Var) -> None:
    owner = _owned_elsewhere(stage, k)
    if owner is not None:
        raise ArgumentError(f"compute {stage!r}: reduce axis {k.name!r} belongs to the reduction of stage {owner!r}; "
                            "create a new te.reduce_axis for each reduction")
    for bound in _REDUCE_DOM[k]:
        _check_free(stage, bound, set(axis), f"the bounds of reduce axis {k.name!r}")


def _stage(name: str, shp: tuple[Expr, ...], axis: tuple[Var, ...], body: Expr, red_axes: tuple[Var, ...],
           dom: tuple[tuple[Expr, Expr], ...], lifted_stages: tuple[Tensor, ...]) -> Tensor:
    inputs = _inputs(name, body)
    for k in red_axes:
        _REDUCE_OWNER[k] = name
    return Tensor(name, shp, body.dtype, ComputeOp(name, axis, body, red_axes, dom, inputs, lifted_stages))


def _make_lifted(name: str, shp: tuple[Expr, ...], axis: tuple[Var, ...], red: Reduce,
                 dom: tuple[tuple[Expr, Expr], ...]) -> Tensor:
    # the internal path for a lifted stage: its dotted name is not checked as an identifier
    for v in axis:
        _AXIS_OWNER[v] = name
    for k, d in zip(red.axis, dom):
        _REDUCE_DOM.setdefault(k, d)  # a copy of a reduce axis that another reduction of the body used
    return _stage(name, shp, axis, red, red.axis, dom, ())


def lifted(t: Tensor) -> tuple[Tensor, ...]:
    """The stages made from the inline reductions of stage `t` (inner first; `()` when none), each an
    ordinary stage: `s.loops(te.lifted(y)[0])` gives its loops in a `Schedule`."""
    if not isinstance(t, Tensor):
        raise ArgumentTypeError(f"te.lifted takes a tensor, got {type(t).__name__} {t!r}")
    return t.op.lifted if isinstance(t.op, ComputeOp) else ()


def _walk(e: Expr) -> list[Any]:
    return list(walk(e))


def _check_free(stage: str, e: Expr, allowed: set[Var], where: str) -> None:
    for n in _walk(e):
        if isinstance(n, Var) and n not in allowed:
            _refuse_var(stage, n, where)


def _refuse_var(stage: str, v: Var, where: str) -> None:
    if v in _REDUCE_DOM:
        owner = _owned_elsewhere(stage, v)
        if owner is not None:
            raise ArgumentError(
                f"compute {stage!r}: reduce axis {v.name!r} in {where} belongs to the reduction of stage {owner!r}"
            )
        raise ArgumentError(
            f"compute {stage!r}: reduce axis {v.name!r} is used in {where}, outside a reduction over it; "
            f"wrap it in te.sum/max/min(..., axis={v.name})"
        )
    if v in _AXIS_OWNER:
        owner = _AXIS_OWNER[v]
        raise ArgumentError(
            f"compute {stage!r}: variable {v.name!r} is a loop variable of stage {owner!r}, "
            f"used in {where} of another stage"
        )
    # any other Var is a size variable: allowed everywhere


def _owned_elsewhere(stage: str, k: Var) -> str | None:
    owner = _REDUCE_OWNER.get(k)
    if owner is None or owner == stage or owner.startswith(stage + "."):  # its own, or a stage lifted from it
        return None
    return owner


def _check_scoped(stage: str, axis: tuple[Var, ...], body: Expr) -> None:
    # every variable is an axis of the stage, a size, or a reduce axis of a reduction around it; a
    # reduce axis belongs to no other stage's reduction. Checked before any stage is lifted.
    stack: list[tuple[Node, frozenset[Var]]] = [(body, frozenset(axis))]
    while stack:
        e, allowed = stack.pop()
        if isinstance(e, Reduce):
            inner = set(allowed)
            for k in e.axis:
                owner = _owned_elsewhere(stage, k)
                if owner is not None:
                    raise ArgumentError(
                        f"compute {stage!r}: reduce axis {k.name!r} belongs to the reduction of stage {owner!r}; "
                        "create a new te.reduce_axis for each reduction"
                    )
                for bound in _REDUCE_DOM[k]:
                    _check_free(stage, bound, inner, f"the bounds of reduce axis {k.name!r}")
                inner.add(k)
            stack.append((e.body, frozenset(inner)))
        elif isinstance(e, Var):
            if e not in allowed:
                _refuse_var(stage, e, "the body")
        else:
            for f in dataclasses.fields(e):  # type: ignore[arg-type]
                if f.name == "buffer":
                    continue
                v = getattr(e, f.name)
                stack.extend((x, allowed) for x in (v if isinstance(v, tuple) else (v,)) if isinstance(x, Node))


def _inputs(stage: str, body: Expr) -> tuple[Tensor, ...]:
    seen: dict[int, Tensor] = {}
    for n in _walk(body):
        if isinstance(n, Load) and id(n.buffer) not in seen:
            t = tensor_of(n.buffer)
            if t is None:
                raise ArgumentTypeError(
                    f"compute {stage!r} reads buffer {n.buffer.name!r}, which is not a te tensor; "
                    "use te.placeholder for inputs"
                )
            seen[id(n.buffer)] = t
    return tuple(seen.values())


# ----------------------------------------------------------------------------- recurrences (loopir.te_scan)


def scan(init: Tensor, update: Tensor, state_placeholder: Tensor, inputs: Sequence[Tensor] | None = None,
         name: str | None = None) -> Tensor:
    """TVM's scan: `out[t] = update(out[t - 1], ...)` along the first axis, `init` giving the first rows.

    `state_placeholder` (a placeholder shaped like the result) stands for the result inside `update`, which may
    read it only at earlier rows (`state[t - c, ...]`, a constant c >= 1); `init` has the shape of the state
    except along the scan axis (its row count: how many rows it gives); `inputs`, when given, must list every
    tensor the two read. The result is a stage later stages read (statements `<name>_init` and `<name>`)."""
    return te_scan.scan(_FRONT, init, update, state_placeholder, inputs, name)


def update(tensor: Tensor, over: Any, fupdate: Callable[..., Any], name: str | None = None) -> Tensor:
    """Halide's update definition: `tensor` redefined over the domain `over` (an extent, a (lo, hi) pair, or a
    list of them), `fupdate(*vars) -> (index, value)`; in it, reading `tensor` reads the current value. The
    index may be any integer expression (a scatter: `lambda r: ((img[r],), h[img[r]] + 1)`). The iterations
    run in order. Returns the redefined stage (a new tensor; read it, not `tensor`)."""
    return te_scan.update(_FRONT, tensor, over, fupdate, name)


# ----------------------------------------------------------------------------- reductions


def _reduce(op: str, expr: ExprLike, axis: Any) -> Reduce:
    axes = _check_axes(op, axis)
    if isinstance(expr, Tensor):
        raise ArgumentTypeError(f"te.{op}: got the tensor {expr.name!r}; reduce an element such as {expr.name}[i, k]")
    body = nodes.as_expr(expr)
    if body.dtype == "bool":
        raise ArgumentTypeError(f"te.{op} of a condition; cast it first: te.cast('int32', cond)")
    if isinstance(body, TupleReduce) or any(isinstance(n, TupleReduce) for n in walk(body)):
        raise ArgumentError(f"te.{op}: a user reduction (argmax, argmin, comm_reducer) inside its operand; compute "
                            "it in a stage of its own first")
    return Reduce(op, body, axes, body.dtype)  # one inside `body` is lifted into its own stage (te_lift)


def _check_axes(op: str, axis: Any) -> tuple[Var, ...]:
    if axis is None:
        raise ArgumentTypeError(f"te.{op} needs its reduction axis: te.{op}(expr, axis=k) with k = te.reduce_axis(...)")
    axes = tuple(axis) if isinstance(axis, (list, tuple)) else (axis,)
    if not axes:
        raise ArgumentTypeError(f"te.{op} needs at least one reduction axis, got an empty list")
    for a in axes:
        if isinstance(a, Var) and a in _AXIS_OWNER:
            raise ArgumentTypeError(
                f"te.{op}: axis {a.name!r} was not made by te.reduce_axis: it is a loop variable of stage "
                f"{_AXIS_OWNER[a]!r}, which a reduction cannot run over; make one: te.reduce_axis(extent)"
            )
        if not isinstance(a, Var) or a not in _REDUCE_DOM:
            what = repr(a.name) if isinstance(a, Var) else f"{type(a).__name__} {a!r}"
            raise ArgumentTypeError(f"te.{op}: axis {what} was not made by te.reduce_axis")
    for a, b in itertools.combinations(axes, 2):
        if a is b:
            raise ArgumentError(f"te.{op}: reduce axis {a.name!r} is listed twice")
    return axes


def sum(expr: ExprLike, axis: Var | Sequence[Var] | None = None) -> Reduce:
    """The sum of `expr` over the reduce axis (or axes) `axis`."""
    return _reduce("sum", expr, axis)


def max(expr: ExprLike, axis: Var | Sequence[Var] | None = None) -> Reduce:
    """The maximum of `expr` over `axis` (identity -inf, or the dtype's minimum for integers)."""
    return _reduce("max", expr, axis)


def min(expr: ExprLike, axis: Var | Sequence[Var] | None = None) -> Reduce:
    """The minimum of `expr` over `axis` (identity +inf, or the dtype's maximum for integers)."""
    return _reduce("min", expr, axis)


def identity(op: str, dtype: str) -> Const:
    """The identity element of a reduction in `dtype`."""
    return builtin_identity(op, dtype)


def comm_reducer(combine: Callable[..., Any], identity: Any, name: str = "reduce",
                 commutative: bool = True) -> CommReducer:
    """A user-defined commutative, associative reducer (TVM's `te.comm_reducer`).

    `combine(lhs, rhs)` gives the combined value (over a tuple of values: takes two tuples, returns one);
    `identity` is its neutral element: a number, a te.const, or a function of the dtype(s) giving it (one
    per component). Apply it like te.sum: `prod(x[i, k], axis=k)`; a tuple reducer `r((v, k), axis=k)` returns
    one reduction per component, which a stage returns as a tuple (each becomes an output tensor).

    The checker may reassociate its updates (reorder / split / tile of its reduce axes): declare only a
    combine that is commutative and associative (floating-point rounding aside). `commutative=False` (a
    loopir extension) declares an ordered fold (Horner's rule, a running recurrence): its reduce loops then
    keep their order, and a step that would change it is refused with a witness."""
    _check_name(name, "reducer")
    return CommReducer(combine, identity, name, _check_axes, commutative)


def argmax(expr: ExprLike, axis: Var | Sequence[Var] | None = None, one_pass: bool = False) -> Expr:
    """The index of the first maximum of `expr` over `axis` (ties: the smallest index, as numpy.argmax), int64.
    Over several axes, the row-major position in their box (numpy's flat index). NaNs are not numpy's.

    Default: two reductions, `min over k of (k where expr == max(expr) else BIG)`, the max lifted into a stage
    of its own (`<stage>.max0`, see te.lifted): plain reductions, so they reassociate, vectorize, run across
    the threads of a block on CUDA (bind_reduction, the row strategies) and may sit anywhere in a body.
    `one_pass=True`: one (value, index) tuple reduction (te.comm_reducer), reading `expr` once; it must be the
    whole body of its stage, the running maximum is its hidden output `<stage>.argmax0`, and on CUDA it runs
    one thread per output point (no cross-thread tuple reduction)."""
    return _arg("argmax", expr, axis, one_pass)


def argmin(expr: ExprLike, axis: Var | Sequence[Var] | None = None, one_pass: bool = False) -> Expr:
    """The index of the first minimum of `expr` over `axis` (ties: the smallest index, as numpy.argmin), int64;
    see te.argmax."""
    return _arg("argmin", expr, axis, one_pass)


def _arg(kind: str, expr: ExprLike, axis: Any, one_pass: bool) -> Expr:
    if not isinstance(one_pass, bool):
        raise ArgumentTypeError(f"te.{kind}: one_pass must be True or False, got {one_pass!r}")
    if one_pass:
        return arg_reduce(kind, _check_axes, _REDUCE_DOM.__getitem__, expr, axis)
    axes = _check_axes(kind, axis)
    if isinstance(expr, Tensor):
        raise ArgumentTypeError(f"te.{kind}: got the tensor {expr.name!r}; reduce an element such as {expr.name}[i, k]")
    value = nodes.as_expr(expr)
    fresh = {k: reduce_axis(_REDUCE_DOM[k], name=k.name) for k in axes}  # the extreme's own axes
    best = _reduce("max" if kind == "argmax" else "min", substitute(value, fresh), tuple(fresh.values()))
    big = nodes.const(int(np.iinfo(INDEX).max), INDEX)
    return _reduce("min", where(value.eq(best), flat_index(axes, _REDUCE_DOM.__getitem__), big), axes)


_FRONT = te_scan.Front(Tensor, ComputeOp, lambda x: isinstance(x, Tensor), _check_name, _default_name,
                       _lambda_arity, _inputs, _AXIS_OWNER, _REDUCE_DOM)


def extern(shape: SizeLike | Sequence[SizeLike], inputs: Sequence[Tensor], fcompute: Callable[..., Any],
           name: str | None = None, dtype: str = "float32", cpu_library: str = "",
           interp: Callable[..., Any] | None = None, cuda_source: str = "",
           cuda_launch: tuple[int, int] = (1, 1)) -> Tensor:
    """A stage computed by one call of an external function (TVM's te.extern); see `loopir.te_extern`.

        C = te.extern((n, m), [A, B], lambda ins, outs: te.call_extern("void", "my_gemm", ins[0], ins[1],
                      outs[0], n, m, k), name="C", interp=lambda a, b, c, n, m, k: np.matmul(a, b, out=c))

    The function gets a pointer per tensor and an int64 per size, in the call's order, and must write the
    whole output (CPU: `void my_gemm(const float*, const float*, float*, int64_t, int64_t, int64_t)`; CUDA:
    `__device__` in `cuda_source`, called by every thread of a launch of `cuda_launch=(blocks, threads)`).
    The checker treats the stage as reading every element of `inputs` and writing every element of the
    output; the stage is opaque to scheduling."""
    name = _default_name("extern") if name is None else _check_name(name, "tensor")
    dt = check_dtype(dtype, f"dtype of extern stage {name!r}")
    if dt not in EXTERN_DTYPES:
        raise ArgumentTypeError(f"te.extern {name!r}: dtype {dt}; an extern stage writes {', '.join(EXTERN_DTYPES)}")
    shp = _shape(shape, f"extern stage {name!r}")
    if not shp:
        raise ArgumentError(f"te.extern {name!r}: give the output at least one dimension (shape (1,) for a scalar)")
    ins = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
    for k, t in enumerate(ins):
        if not isinstance(t, Tensor):
            raise ArgumentTypeError(f"te.extern {name!r}: input {k} must be a tensor, got {type(t).__name__} {t!r}")
    if not isinstance(cuda_source, str) or not isinstance(cpu_library, str):
        raise ArgumentTypeError(f"te.extern {name!r}: cuda_source and cpu_library must be str")
    if (not isinstance(cuda_launch, tuple) or len(cuda_launch) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in cuda_launch)
            or cuda_launch[1] > 1024):
        raise ArgumentError(f"te.extern {name!r}: cuda_launch must be (blocks, threads), positive ints with at most "
                            f"1024 threads, got {cuda_launch!r}")
    if not callable(fcompute):
        raise ArgumentTypeError(f"te.extern {name!r}: fcompute must be a function (ins, outs) -> te.call_extern(...)")
    out = Tensor(name, shp, dt, PlaceholderOp(name))  # made first: fcompute names it; its op is set below
    out_axes = tuple(Var(f"o{d}", INDEX) for d in range(len(shp)))
    in_axes = [tuple(Var(f"{t.name}_{d}", INDEX) for d in range(t.ndim)) for t in ins]
    call = fcompute(list(ins), [out])
    args = stage_args(call, out, ins, out_axes, in_axes)
    for v in out_axes:
        _AXIS_OWNER[v] = name
    red = tuple(v for ax in in_axes for v in ax)
    dom = tuple((Const(0, INDEX), e) for t in ins for e in t.shape)
    for v, d in zip(red, dom):
        _REDUCE_DOM[v] = d
        _REDUCE_OWNER[v] = name
    model = nodes.ExternCall(call.func, args, dt, ExternStage(call.func, cpu_library, cuda_source, cuda_launch))
    set_stage_interp(call.func, interp)
    out.op = ComputeOp(name, out_axes, Reduce("sum", model, red, dt), red, dom, tuple(ins))
    return out


__all__ = [
    "DTYPES",
    "CommReducer",
    "ComputeOp",
    "PlaceholderOp",
    "Reduce",
    "Tensor",
    "TupleReduce",
    "abs",
    "argmax",
    "argmin",
    "bool_",
    "call_extern",
    "comm_reducer",
    "cast",
    "ceil",
    "saturate_cast",
    "saturating_cast",
    "scalar_tensor",
    "compute",
    "const",
    "cos",
    "erf",
    "exp",
    "extern",
    "fast_cos",
    "fast_exp",
    "fast_log",
    "fast_sin",
    "floor",
    "fmod",
    "bfloat16",
    "float16",
    "float32",
    "float64",
    "identity",
    "int8",
    "int16",
    "int32",
    "int64",
    "lifted",
    "log",
    "max",
    "maximum",
    "min",
    "minimum",
    "placeholder",
    "pow",
    "power",
    "register_intrinsic",
    "round",
    "reduce_axis",
    "rsqrt",
    "scan",
    "sigmoid",
    "sin",
    "sqrt",
    "sum",
    "tanh",
    "tensor_of",
    "uint8",
    "uint16",
    "update",
    "var",
    "where",
]
