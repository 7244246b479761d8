"""Checking a program's arguments and inferring its symbolic sizes.

Every runtime (the interpreter, the CPU and the CUDA modules) goes through here, so a bad
argument gives the same clear error on every target:

- wrong number of arguments, a non-array, a wrong dtype: `TypeError` naming the argument;
  a bfloat16 buffer takes only a uint16 array of bits (`loopir.dtypes.to_bfloat16`), anything
  else is an `ArgumentTypeError`;
- a wrong rank, a shape contradicting the declared one (a constant, or an affine expression
  of size variables such as `n - 2` or `2 * n`), or two arguments disagreeing on a size
  variable, a non-C-contiguous array: `ValueError` naming the argument or the variable and
  both values.

Sizes are solved from shapes alone (`bind_shapes`), so device arrays can use the same logic:
equations `declared_dim == actual` whose only unknown occurs affinely are solved first (the
plain `n` dims in argument order, then `n - 2`, `2 * n`, ...), repeatedly, and then every
declared dimension is evaluated and checked.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .errors import ArgumentError, ArgumentTypeError, NotFoundError
from .dtypes import INT_RANGE, check_dtype, wrap_int
from .nodes import Binary, Call, Cast, Compare, Const, Expr, Load, Logical, Program, Select, Unary, Var
from .printer import expr_str
from .visit import free_vars

_CALLS = {
    "exp": math.exp,
    "log": math.log,
    "sqrt": math.sqrt,
    "rsqrt": lambda x: 1.0 / math.sqrt(x),
    "sin": math.sin,
    "cos": math.cos,
    "tanh": math.tanh,
    "sigmoid": lambda x: 1.0 / (1.0 + math.exp(-x)),
    "erf": math.erf,
    "abs": abs,
}


def eval_expr(e: Expr, env: Mapping[Var, int]) -> Any:
    """Evaluate an expression of size (and loop) variables to a Python number.

    Integer `//` and `%` follow Python's floor semantics (as the loop IR does). Raises
    ValueError naming a variable that `env` does not bind, or a buffer load."""
    if isinstance(e, Const):
        return e.value
    if isinstance(e, Var):
        if e not in env:
            raise NotFoundError(f"size variable {e.name!r} has no value here (expression {expr_str(e)})")
        return env[e]
    if isinstance(e, Binary):
        a, b = eval_expr(e.a, env), eval_expr(e.b, env)
        op = e.op
        if op == "add":
            return a + b
        if op == "sub":
            return a - b
        if op == "mul":
            return a * b
        if op == "div":
            return a / b
        if op == "floordiv":
            return a // b
        if op == "mod":
            return a % b
        if op == "max":
            return max(a, b)
        if op == "min":
            return min(a, b)
    if isinstance(e, Unary) and e.op == "neg":
        return -eval_expr(e.a, env)
    if isinstance(e, Compare):
        a, b = eval_expr(e.a, env), eval_expr(e.b, env)
        return {"lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b, "eq": a == b, "ne": a != b}[e.op]
    if isinstance(e, Logical):
        if e.op == "not":
            return not eval_expr(e.a, env)
        assert e.b is not None
        if e.op == "and":
            return bool(eval_expr(e.a, env)) and bool(eval_expr(e.b, env))
        return bool(eval_expr(e.a, env)) or bool(eval_expr(e.b, env))
    if isinstance(e, Select):
        return eval_expr(e.a, env) if eval_expr(e.cond, env) else eval_expr(e.b, env)
    if isinstance(e, Cast):
        v = eval_expr(e.a, env)
        if e.dtype in INT_RANGE:
            return wrap_int(int(v), e.dtype)
        if e.dtype == "bool":
            return bool(v)
        return float(v)
    if isinstance(e, Call) and e.fn in _CALLS:
        return _CALLS[e.fn](*(eval_expr(a, env) for a in e.args))
    if isinstance(e, Load):
        raise ArgumentError(f"cannot evaluate a load of buffer {e.buffer.name!r} here (expression {expr_str(e)})")
    raise ArgumentError(f"cannot evaluate {expr_str(e)} as a size expression")


def _affine(e: Expr, env: Mapping[Var, int]) -> dict[Var | None, int] | None:
    """`e` as {var: coefficient, None: constant} with the variables of `env` substituted,
    or None when it is not affine with integer coefficients."""
    if isinstance(e, Const):
        return {None: int(e.value)} if isinstance(e.value, int) else None
    if isinstance(e, Var):
        return {None: int(env[e])} if e in env else {e: 1}
    if isinstance(e, Unary) and e.op == "neg":
        a = _affine(e.a, env)
        return None if a is None else {k: -v for k, v in a.items()}
    if isinstance(e, Cast) and e.dtype in ("int32", "int64"):
        return _affine(e.a, env)
    if isinstance(e, Binary) and e.op in ("add", "sub", "mul"):
        a, b = _affine(e.a, env), _affine(e.b, env)
        if a is None or b is None:
            return None
        if e.op == "mul":
            if set(a) <= {None}:
                a, b = b, a
            if not set(b) <= {None}:
                return None  # product of two unknowns
            k = b.get(None, 0)
            return {v: c * k for v, c in a.items()}
        sign = 1 if e.op == "add" else -1
        out = dict(a)
        for v, c in b.items():
            out[v] = out.get(v, 0) + sign * c
        return out
    if isinstance(e, Binary) and e.op in ("floordiv", "mod", "max", "min"):
        a, b = _affine(e.a, env), _affine(e.b, env)
        if a is not None and b is not None and set(a) <= {None} and set(b) <= {None}:
            return {None: _fold(e.op, a.get(None, 0), b.get(None, 0))}
        return None
    return None


_LINEAR: dict[int, tuple[Expr, tuple[tuple[tuple[Var, int], ...], int] | None]] = {}


def _linear(dim: Expr) -> tuple[tuple[tuple[Var, int], ...], int] | None:
    """`dim` as ((var, coefficient), ...) and a constant, or None when it is not affine by itself (then
    `_affine` with the known sizes decides). Remembered per expression object: a program's dims are the
    same objects at every call."""
    hit = _LINEAR.get(id(dim))
    if hit is not None and hit[0] is dim:
        return hit[1]
    aff = _affine(dim, {})
    lin = None if aff is None else (tuple((v, c) for v, c in aff.items() if v is not None), aff.get(None, 0))
    if len(_LINEAR) > 4096:
        _LINEAR.clear()
    _LINEAR[id(dim)] = (dim, lin)
    return lin


def _fold(op: str, a: int, b: int) -> int:
    return {"floordiv": lambda: a // b, "mod": lambda: a % b, "max": lambda: max(a, b), "min": lambda: min(a, b)}[op]()


def _where(name: str, k: int, dim: Expr) -> str:
    return f"argument {name!r} dimension {k} (declared {expr_str(dim)})"


def bind_shapes(
    program: Program,
    shapes: Sequence[tuple[Sequence[int], Any]],
    known: Mapping[Var | str, int] | None = None,
) -> dict[Var, int]:
    """Check `(shape, dtype)` of each argument against `program.args`; return the sizes.

    `dtype` may be None to skip the dtype check. `known` gives sizes that no argument's
    shape determines (by Var or by name). The result binds every size variable of the
    arguments' shapes and every `program.params`."""
    args = program.args
    if len(shapes) != len(args):
        names = ", ".join(b.name for b in args)
        raise ArgumentTypeError(f"program {program.name!r} takes {len(args)} argument(s) ({names}), got {len(shapes)}")
    for buf, (shape, dtype) in zip(args, shapes):
        if dtype is not None:
            dt = np.dtype(dtype)
            native, got = _dtype_facts(dt)
            if not native:
                raise ArgumentTypeError(
                    f"argument {buf.name!r} has non-native byte order ({dt.str}); loopir reads and writes native "
                    f"{buf.dtype}: pass arr.astype(arr.dtype.newbyteorder('='))"
                )
            if buf.dtype == "bfloat16":
                got = _bfloat16_arg(buf.name, program.name, dt)
            if got != buf.dtype:
                raise ArgumentTypeError(
                    f"argument {buf.name!r} has dtype {got}, but program {program.name!r} expects {buf.dtype}"
                )
        if len(shape) != len(buf.shape):
            decl = ", ".join(expr_str(d) for d in buf.shape)
            raise ArgumentError(
                f"argument {buf.name!r} has {len(shape)} dimension(s) {tuple(shape)}, "
                f"but is declared with {len(buf.shape)}: [{decl}]"
            )

    env: dict[Var, int] = {}
    origin: dict[Var, str] = {}
    for key, value in (known or {}).items():
        var = key if isinstance(key, Var) else _param_named(program, key)
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ArgumentTypeError(f"size {var.name!r} must be an integer, got {type(value).__name__} {value!r}")
        env[var] = int(value)
        origin[var] = "given explicitly"

    eqs = [
        (buf.name, k, dim, int(shape[k])) for buf, (shape, _) in zip(args, shapes) for k, dim in enumerate(buf.shape)
    ]
    # Plain `n` dims first (the clearest source of a value for error messages), then affine ones.
    pending = sorted(eqs, key=lambda q: not isinstance(q[2], Var))
    progress = True
    while progress:
        progress = False
        rest = []
        for name, k, dim, actual in pending:
            if type(dim) is Var:  # the common plain `n` dim, without building its affine form
                if dim in env:
                    rest.append((name, k, dim, actual))
                else:
                    env[dim] = actual
                    origin[dim] = f"argument {name!r} dimension {k} = {actual}"
                    progress = True
                continue
            lin = _linear(dim)
            if lin is not None:  # the same affine form as _affine(dim, env), from the remembered one
                aff = {None: lin[1]}
                for v, c in lin[0]:
                    if v in env:
                        aff[None] += c * env[v]
                    else:
                        aff[v] = aff.get(v, 0) + c
            else:
                aff = _affine(dim, env)
            unknown = [v for v, c in (aff or {}).items() if v is not None and c != 0]
            if aff is None or len(unknown) != 1:
                rest.append((name, k, dim, actual))
                continue
            (v,) = unknown
            c, const_ = aff[v], aff.get(None, 0)
            if (actual - const_) % c != 0:
                raise ArgumentError(
                    f"{_where(name, k, dim)} is {actual}, but no integer {v.name!r} gives that "
                    f"({expr_str(dim)} = {actual} needs {v.name} = {(actual - const_) / c:g})"
                )
            env[v] = (actual - const_) // c
            origin[v] = f"argument {name!r} dimension {k} = {actual}"
            progress = True
        pending = rest

    for name, k, dim, actual in eqs:
        try:
            lin = None if type(dim) is Var else _linear(dim)
            if type(dim) is Var and dim in env:
                want = env[dim]
            elif lin is not None and all(v in env for v, _ in lin[0]):
                want = lin[1] + sum(c * env[v] for v, c in lin[0])
            else:
                want = eval_expr(dim, env)
        except ValueError:
            missing = sorted(v.name for v in _vars(dim) if v not in env)
            raise ArgumentError(
                f"cannot infer size(s) {', '.join(missing)} from {_where(name, k, dim)} = {actual}; "
                "pass them explicitly"
            ) from None
        if want != actual:
            raise ArgumentError(_conflict(name, k, dim, actual, want, env, origin))

    for v in program.params:
        if v not in env:
            raise ArgumentError(
                f"size variable {v.name!r} of program {program.name!r} appears in no argument's shape; "
                "pass it explicitly"
            )
    for cond in program.assume:
        _check_assumed(program, cond, env)
    return env


def _check_assumed(program: Program, cond: Expr, env: dict[Var, int]) -> None:
    """A call's sizes meet a condition the program's schedule relies on (Schedule.assume), else ArgumentError."""
    try:
        ok = bool(eval_expr(cond, env))
    except ValueError:
        ok = False
    if not ok:
        at = ", ".join(f"{v.name}={env[v]}" for v in _vars(cond) if v in env)
        raise ArgumentError(f"program {program.name!r} assumes {expr_str(cond)} (its schedule relies on it), but "
                            f"the call has {at}")


def _param_named(program: Program, name: object) -> Var:
    """The size variable a caller names: by the name it was given (te.var("b")), which a tensor or a loop
    variable of the program may share (they are no sizes); two size variables of one name cannot be told
    apart by it (te lowering refuses them, a hand-built program may have them)."""
    found = [v for v in program.params if v.name == name]
    if not found:
        raise NotFoundError(f"size {name!r} is not a size variable of program {program.name!r}")
    if len(found) > 1:
        raise ArgumentError(f"program {program.name!r} has {len(found)} size variables named {name!r}; pass "
                            "the size variable (the Var) instead of its name")
    return found[0]


_DTYPE_FACTS: dict[np.dtype, tuple[bool, str]] = {}


def _dtype_facts(dt: np.dtype) -> tuple[bool, str]:
    """(native byte order, name) of a dtype, remembered: numpy computes `dtype.name` in Python (slow per call)."""
    facts = _DTYPE_FACTS.get(dt)
    if facts is None:
        if len(_DTYPE_FACTS) > 256:  # structured or string dtypes could be many
            _DTYPE_FACTS.clear()
        facts = _DTYPE_FACTS[dt] = (dt.isnative, dt.name)
    return facts


def _bfloat16_arg(name: str, program: str, dt: np.dtype) -> str:
    """A bfloat16 buffer takes exactly its host representation, uint16 bits (`loopir.dtypes.to_bfloat16`)."""
    if dt != np.dtype(np.uint16):
        raise ArgumentTypeError(
            f"argument {name!r} has dtype {dt.name}, but program {program!r} expects bfloat16, passed as a "
            "numpy uint16 array of bits (loopir.dtypes.to_bfloat16(x)) or a torch.bfloat16 tensor"
        )
    return "bfloat16"


def _vars(e: Expr) -> list[Var]:
    return list(free_vars(e))


def _conflict(name: str, k: int, dim: Expr, actual: int, want: int, env: dict[Var, int], origin: dict[Var, str]) -> str:
    used = [v for v in _vars(dim) if v in env]
    if len(used) == 1:
        (v,) = used
        others = {u: x for u, x in env.items() if u is not v}
        aff = _affine(dim, others)
        msg = f"size variable {v.name!r} is {env[v]} (from {origin[v]}), but {_where(name, k, dim)} is {actual}"
        if aff is not None and aff.get(v, 0) != 0 and (actual - aff.get(None, 0)) % aff[v] == 0:
            msg += f", which needs {v.name} = {(actual - aff.get(None, 0)) // aff[v]}"
        if dim is not v:
            msg += f" ({expr_str(dim)} = {want} for {v.name} = {env[v]})"
        return msg
    if not used:
        return f"{_where(name, k, dim)} is {actual}, expected {want}"
    vals = ", ".join(f"{v.name} = {env[v]} ({origin[v]})" for v in used)
    return f"{_where(name, k, dim)} is {actual}, but {expr_str(dim)} = {want} with {vals}"


def bind_args(program: Program, arrays: Sequence[Any], known: Mapping[Var | str, int] | None = None) -> dict[Var, int]:
    """Check numpy arrays against `program.args` (count, type, dtype, rank, shape, contiguity)
    and return the value of every size variable."""
    if len(arrays) != len(program.args):
        names = ", ".join(b.name for b in program.args)
        raise ArgumentTypeError(
            f"program {program.name!r} takes {len(program.args)} argument(s) ({names}), got {len(arrays)}")
    for buf, a in zip(program.args, arrays):
        if not isinstance(a, np.ndarray):
            raise ArgumentTypeError(f"argument {buf.name!r} must be a numpy.ndarray, got {type(a).__name__}")
    env = bind_shapes(program, [(a.shape, a.dtype) for a in arrays], known)
    for buf, a in zip(program.args, arrays):
        if not a.flags.c_contiguous:
            raise ArgumentError(
                f"argument {buf.name!r} is not C-contiguous (strides {a.strides}); pass numpy.ascontiguousarray(...)"
            )
    return env


def size_of(shape: Sequence[Expr], env: Mapping[Var, int]) -> tuple[int, ...]:
    """A declared shape evaluated with the sizes `env`."""
    return tuple(int(eval_expr(d, env)) for d in shape)


__all__ = ["bind_args", "bind_shapes", "eval_expr", "size_of", "check_dtype"]
