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

dtypes: float16, bfloat16, float32, float64, int32, int64, bool (bfloat16 data on the host:
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

from .errors import ArgumentError, ArgumentTypeError
from . import nodes
from .dtypes import DTYPES, INDEX, check_dtype, is_float, is_int
from .nodes import Buffer, Const, Expr, ExprLike, Load, Node, Var
from .te_extern import EXTERN_DTYPES, ExternStage, call_extern, register_intrinsic, set_stage_interp, stage_args
from .te_lift import Reduce, lift
from .visit import walk

float16, float32, float64, int32, int64, bool_ = "float16", "float32", "float64", "int32", "int64", "bool"
bfloat16 = "bfloat16"

SizeLike = int | Expr
REDUCE_OPS = ("sum", "max", "min")

# Bookkeeping keyed by Var identity (Vars are slotted, hence not weak-referenceable; the
# entries are tiny). They let a stage tell its own variables from another stage's.
_AXIS_OWNER: dict[Var, str] = {}  # loop variable -> the stage whose lambda made it
_REDUCE_DOM: dict[Var, tuple[Expr, Expr]] = {}  # reduce axis -> (lo, hi)
_REDUCE_OWNER: dict[Var, str] = {}  # reduce axis -> the stage whose reduction uses it
_TENSOR_OF: weakref.WeakValueDictionary[int, Tensor] = weakref.WeakValueDictionary()  # id(buffer) -> tensor
_counter = itertools.count()
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

    def __repr__(self) -> str:
        return f"ComputeOp({self.name!r}, axis={[a.name for a in self.axis]})"


class Tensor:
    """A named, typed, shaped array produced by a placeholder or a compute stage.

    `t[i, j]` is a `nodes.Load` of `t.buffer`, the buffer the tensor lowers to."""

    __slots__ = ("__weakref__", "buffer", "dtype", "name", "op", "shape")

    def __init__(self, name: str, shape: tuple[Expr, ...], dtype: str, op: PlaceholderOp | ComputeOp) -> None:
        self.name = name
        self.shape = shape
        self.dtype = dtype
        self.op = op
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


def var(name: str = "n", dtype: str = INDEX) -> Var:
    """A symbolic integer size. Arithmetic on it (`n - 1`, `2 * n`, `n // 2`) builds expressions."""
    _check_name(name, "size variable")
    if check_dtype(dtype, f"dtype of size variable {name!r}") not in ("int32", "int64"):
        raise ArgumentTypeError(f"size variable {name!r} must be an integer, not {dtype}")
    return Var(name, INDEX)


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
    that is not the whole body becomes a stage of its own (`te.lifted`)."""
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


def _compute(name: str, shp: tuple[Expr, ...], axis: tuple[Var, ...], fcompute: Callable[..., ExprLike]) -> Tensor:
    result = fcompute(*axis)
    if isinstance(result, Tensor):
        raise ArgumentTypeError(f"compute {name!r}: the lambda returned the tensor {result.name!r}; index it")
    try:
        body = nodes.as_expr(result)
    except TypeError as e:
        raise ArgumentTypeError(f"compute {name!r}: the lambda must return an expression, got {result!r}") from e
    _check_scoped(name, axis, body)
    body, lifted_stages = lift(name, shp, axis, body, _REDUCE_DOM.__getitem__, _make_lifted)
    red_axes = body.axis if isinstance(body, Reduce) else ()
    return _stage(name, shp, axis, body, red_axes, tuple(_REDUCE_DOM[k] for k in red_axes), lifted_stages)


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


# ----------------------------------------------------------------------------- reductions


def _reduce(op: str, expr: ExprLike, axis: Any) -> Reduce:
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
    if isinstance(expr, Tensor):
        raise ArgumentTypeError(f"te.{op}: got the tensor {expr.name!r}; reduce an element such as {expr.name}[i, k]")
    body = nodes.as_expr(expr)
    if body.dtype == "bool":
        raise ArgumentTypeError(f"te.{op} of a condition; cast it first: te.cast('int32', cond)")
    return Reduce(op, body, axes, body.dtype)  # one inside `body` is lifted into its own stage (te_lift)


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
    if op == "sum":
        return nodes.const(0, dtype)
    if is_float(dtype):
        return nodes.const(float("-inf") if op == "max" else float("inf"), dtype)
    if is_int(dtype):
        info = np.iinfo(dtype)
        return nodes.const(int(info.min) if op == "max" else int(info.max), dtype)
    raise ArgumentTypeError(f"no identity of {op} in dtype {dtype}")


# ----------------------------------------------------------------------------- elementwise math


def _math(fn: str, doc: str = "") -> Callable[..., Expr]:
    def f(*xs: ExprLike) -> Expr:
        for x in xs:
            if isinstance(x, Tensor):
                raise ArgumentTypeError(
                    f"te.{fn}: got the tensor {x.name!r}; apply it to an element such as {x.name}[i]")
        return nodes.call(fn, *xs)

    f.__name__ = fn
    f.__doc__ = doc or f"Elementwise {fn}; integers are computed in float64."
    return f


exp = _math("exp")
log = _math("log")
sqrt = _math("sqrt")
rsqrt = _math("rsqrt")
sin = _math("sin")
cos = _math("cos")
tanh = _math("tanh")
sigmoid = _math("sigmoid")
erf = _math("erf")
abs = _math("abs")
pow = _math("pow", "pow(x, y): x to the power y (numpy.power of floats; integers are computed in float64).")
power = pow  # TVM's te.power
fmod = _math("fmod", "fmod(x, y): C's fmod, the remainder with the sign of x (numpy.fmod; `%` is Python's).")
floor = _math("floor", "Elementwise floor, a float (numpy.floor); integers are computed in float64.")
ceil = _math("ceil", "Elementwise ceil, a float (numpy.ceil); integers are computed in float64.")
round = _math("round", "Round to the nearest integer, halves to even (numpy.round / rint), a float.")
# fast variants: CUDA's intrinsics (__expf, __logf, __sinf, __cosf) for float32 and halves (computed in float);
# float64 and the CPU and the interpreter compute the accurate function (no faster variant there is sound)
fast_exp = _math("fast_exp", "exp through CUDA's __expf (max ulp error 2 + floor(|1.173 x|)); accurate elsewhere.")
fast_log = _math("fast_log", "log through CUDA's __logf (abs error 2^-21.41 on [0.5, 2], else 3 ulp); "
                 "accurate elsewhere.")
fast_sin = _math("fast_sin", "sin through CUDA's __sinf (abs error 2^-21.41 on [-pi, pi], larger outside); "
                 "accurate elsewhere.")
fast_cos = _math("fast_cos", "cos through CUDA's __cosf (abs error 2^-21.19 on [-pi, pi], larger outside); "
                 "accurate elsewhere.")


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


def maximum(a: ExprLike, b: ExprLike) -> Expr:
    """Elementwise maximum of two expressions."""
    return nodes.binary("max", a, b)


def minimum(a: ExprLike, b: ExprLike) -> Expr:
    """Elementwise minimum of two expressions."""
    return nodes.binary("min", a, b)


def where(cond: ExprLike, a: ExprLike, b: ExprLike) -> Expr:
    """`a` where `cond` holds, else `b` (both evaluated)."""
    return nodes.select(cond, a, b)


def cast(dtype: str, x: ExprLike) -> Expr:
    """`x` converted to `dtype`."""
    return nodes.cast(check_dtype(dtype), x)


def const(value: float | bool, dtype: str | None = None) -> Const:
    """A constant of `dtype` (default: int64 for ints, float32 for floats, bool for bools)."""
    return nodes.const(value, None if dtype is None else check_dtype(dtype))


__all__ = [
    "DTYPES",
    "ComputeOp",
    "PlaceholderOp",
    "Reduce",
    "Tensor",
    "abs",
    "bool_",
    "call_extern",
    "cast",
    "ceil",
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
    "sigmoid",
    "sin",
    "sqrt",
    "sum",
    "tanh",
    "tensor_of",
    "var",
    "where",
]
