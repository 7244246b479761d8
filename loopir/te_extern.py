"""Escape hatches of `te`: calls of functions outside loopir inside an expression.

    fast_exp = te.register_intrinsic("my_exp", "float32", ("float32",), cuda="__expf", cpu="expf",
                                     interp=np.exp)
    y = te.compute((n,), lambda i: fast_exp(x[i]) + te.call_extern("float32", "cbrtf", x[i]), name="y")

`call_extern(dtype, name, *args)` (TVM's name) calls the function `name` returning `dtype`. A name registered
with `register_intrinsic` is checked against its declaration (arity, argument dtypes, return dtype) and lowered
as the registration says per target; an unregistered name is called as is, by that name, on every target:

* CUDA: a `__device__` function (or a CUDA builtin such as `__expf`, `cbrtf`). Its definition comes from the
  registration's `cuda_source` or from `build(..., extern_source="...")`, both put at the top of the kernel
  source; an undefined name is NVRTC's error at build time (`NvrtcError`, with NVRTC's log).
* CPU: a C symbol called from the LLVM IR, resolved in this process by the JIT (libm's `cbrtf` needs nothing);
  the registration's `cpu_library` (or `build(..., extern_libs=("libfoo.so",))`) is loaded first with
  llvmlite's `load_library_permanently`, or `cpu_ir` (LLVM IR text defining the function) goes into the module.
  A symbol that does not resolve is refused at build time (`CodegenError` naming it).
* The interpreter (`loopir.interp`): the registration's `interp`, a Python function of numpy scalars;
  without one the interpreter refuses the call (`ArgumentError`).

Argument and return dtypes: float32, float64, int32, int64 (C's float, double, int, long long); cast halves
and conditions with `te.cast` first. Python numbers are converted to the declared argument dtype (undeclared:
int64 / float32, as `te.const`).

**Whole stages** (`te.extern(shape, inputs, fcompute, name=, dtype=, interp=)`, TVM's te.extern): a stage
computed by one call of an external function, `fcompute(ins, outs)` returning `te.call_extern("void", func,
*args)` with tensors (passed as pointers to their first element, row-major) and integer sizes (int64). The
stage lowers to a *model* nest the checker reads: `out[o] = 0` over the output box, then
`out[o] += func(ins[0][a], ..., out[o], ...)` over the output box times every input's box — it must-writes
the whole output and reads every element of every input, so stages before and after it schedule soundly.
The nest is opaque: a schedule step that names its loops, its output or its inputs is refused
(`refuse_extern_args`), `build` of tensors schedules a graph with an extern stage by hand (serial; no
auto_schedule), and the renderer replaces the nest by the one call (`extern_nest`). CPU: a C function
`void func(...)` resolved as a call_extern's symbol; interpreter: `interp=` (numpy arrays, the output
written in place, ints); CUDA: `__device__ void func(...)` defined by `cuda_source=`, the body of a launch of
its own, `cuda_launch=(blocks, threads)` (default one thread): every thread of it calls the function, which
sees blockIdx / threadIdx as a kernel does and must write the whole output, race-free, across the launch
(inputs come as `const T*`). The adversarial GPU interpreter runs the stage through `interp=` (whole arrays).

**Purity.** The dependence checker sees loads and stores only: an external function is assumed *pure* — its
result depends on its arguments alone, it reads and writes no memory of the program, and calling it more often
(`compute_at` recomputes), less often, or in another order changes nothing. A function with side effects is
outside what the checker proves. The registry is process-wide: a name is registered once (the same definition
again is accepted; another one is refused unless `replace=True`), so a compiled module and its cache keys
(the declaration is part of the IR) always agree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .dtypes import check_dtype, is_int, weak_scalar_dtype
from .errors import ArgumentError, ArgumentTypeError, CodegenError
from .nodes import CALL_FNS, Binary, Buffer, Expr, ExprLike, ExternCall, For, Load, Node, Stmt, Store, Var, as_expr, \
    const
from .visit import walk

EXTERN_DTYPES = ("float32", "float64", "int32", "int64")


@dataclass(frozen=True, slots=True)
class Extern:
    """How each target calls the external function `name` (carried by every `ExternCall` node).

    `arg_dtypes` None: undeclared (an unregistered `call_extern`), the arguments are not checked.
    `cuda` / `cpu`: the function called there (None: that target has no lowering, refused at build);
    `cuda_source`: CUDA C defining it (put once at the top of the kernel source); `cpu_library`: a shared
    library loaded before the module is compiled; `cpu_ir`: LLVM IR text defining the symbol `cpu`."""

    name: str
    dtype: str
    arg_dtypes: tuple[str, ...] | None
    cuda: str | None
    cpu: str | None
    cuda_source: str = ""
    cpu_library: str = ""
    cpu_ir: str = ""


_REGISTRY: dict[str, Extern] = {}
# the interpreter's implementations, by name: Python functions are kept out of the IR so that a program
# that calls an extern stays a plain value (its build cache key describes it)
_INTERP: dict[str, Callable[..., Any]] = {}


class Intrinsic:
    """A registered external function: call it like a te math function (`f(x[i], 2.0)`)."""

    __slots__ = ("decl",)

    def __init__(self, decl: Extern) -> None:
        self.decl = decl

    @property
    def name(self) -> str:
        return self.decl.name

    def __call__(self, *args: ExprLike) -> Expr:
        return call_extern(self.decl.dtype, self.decl.name, *args)

    def __repr__(self) -> str:
        d = self.decl
        return f"Intrinsic({d.name!r}, {d.dtype}, ({', '.join(d.arg_dtypes or ())}))"


def _ident(x: object, what: str) -> str:
    if not isinstance(x, str) or not x.isidentifier():
        raise ArgumentError(f"{what} must be a C identifier, got {x!r}")
    return x


def _extern_dtype(dtype: object, what: str) -> str:
    dt = check_dtype(dtype, what)  # type: ignore[arg-type]
    if dt not in EXTERN_DTYPES:
        raise ArgumentTypeError(f"{what} is {dt}; an external function takes and returns "
                                f"{', '.join(EXTERN_DTYPES)} (cast with te.cast first)")
    return dt


def _text(x: object, what: str) -> str:
    if not isinstance(x, str):
        raise ArgumentTypeError(f"{what} must be a str, got {type(x).__name__}")
    return x


def register_intrinsic(name: str, dtype: str = "float32", args: tuple[str, ...] | list[str] = ("float32",), *,
                       cuda: str | None = None, cpu: str | None = None, cuda_source: str = "",
                       cpu_library: str = "", cpu_ir: str = "", interp: Callable[..., Any] | None = None,
                       replace: bool = False) -> Intrinsic:
    """Register the external function `name(args) -> dtype` with a lowering per target; returns it as a
    callable (`f(x[i])` builds the call; `te.call_extern(dtype, name, ...)` finds it too).

    cuda: the CUDA function called (a builtin like "__expf", or a `__device__` function defined in
    `cuda_source`); cpu: the C symbol called (resolved in the process, in `cpu_library`, or defined by the
    LLVM IR text `cpu_ir`); interp: a Python function for the interpreter. A target left out refuses the
    call at build time. Names of te's own math functions (`exp`, `fast_exp`, ...) cannot be registered."""
    name = _ident(name, "the name of an intrinsic")
    if name in CALL_FNS:
        raise ArgumentError(f"register_intrinsic: {name!r} is te's own math function te.{name}; choose another name")
    dt = _extern_dtype(dtype, f"the return dtype of intrinsic {name!r}")
    if isinstance(args, str) or not isinstance(args, (tuple, list)):
        raise ArgumentTypeError(f"register_intrinsic: args of {name!r} must be a tuple of dtypes, got {args!r}")
    arg_dts = tuple(_extern_dtype(a, f"argument {k} of intrinsic {name!r}") for k, a in enumerate(args))
    if cuda is not None:
        _ident(cuda, f"cuda= of intrinsic {name!r}")
    if cpu is not None:
        _ident(cpu, f"cpu= of intrinsic {name!r}")
    for what, txt in (("cuda_source", cuda_source), ("cpu_library", cpu_library), ("cpu_ir", cpu_ir)):
        _text(txt, f"{what}= of intrinsic {name!r}")
    if (cpu_library or cpu_ir) and cpu is None:
        raise ArgumentError(f"register_intrinsic: {name!r} gives cpu_library/cpu_ir but no cpu= symbol to call")
    if cpu_ir and f"@{cpu}(" not in cpu_ir and f'@"{cpu}"(' not in cpu_ir:
        raise ArgumentError(f"register_intrinsic: cpu_ir of {name!r} does not define @{cpu}")
    if interp is not None and not callable(interp):
        raise ArgumentTypeError(f"register_intrinsic: interp= of {name!r} must be callable, got {interp!r}")
    if not isinstance(replace, bool):
        raise ArgumentTypeError(f"register_intrinsic: replace must be True or False, got {replace!r}")
    decl = Extern(name, dt, arg_dts, cuda, cpu, cuda_source, cpu_library, cpu_ir)
    old = _REGISTRY.get(name)
    if old is not None and old != decl and not replace:
        raise ArgumentError(f"register_intrinsic: {name!r} is already registered with another definition "
                            f"({old}); pass replace=True to redefine it")
    _REGISTRY[name] = decl
    if interp is not None:
        _INTERP[name] = interp
    else:
        _INTERP.pop(name, None)
    return Intrinsic(decl)


def registered(name: str) -> Extern | None:
    """The declaration registered under `name` (None: not registered)."""
    return _REGISTRY.get(name)


def interp_function(name: str) -> Callable[..., Any] | None:
    """The interpreter's implementation of the external function `name` (None: none registered)."""
    return _INTERP.get(name)


def call_extern(dtype: str, name: str, *args: ExprLike) -> Expr:
    """A call of the external function `name` returning `dtype` (TVM's `te.call_extern`); see the module doc.

    A registered name is checked against its declaration: the return dtype, the number of arguments and
    each argument's dtype (Python numbers take the declared dtype)."""
    name = _ident(name, "the name of an external function")
    if dtype == "void":  # a whole stage's call: only te.extern's fcompute returns it
        return StageCall(name, tuple(args))  # type: ignore[return-value]
    if name in CALL_FNS:
        raise ArgumentError(f"call_extern: {name!r} is te's own math function; call te.{name}(...)")
    dt = _extern_dtype(dtype, f"the return dtype of call_extern {name!r}")
    decl = _REGISTRY.get(name)
    if decl is not None:
        if decl.dtype != dt:
            raise ArgumentTypeError(f"call_extern: {name!r} is registered returning {decl.dtype}, called with "
                                    f"dtype {dt}")
        assert decl.arg_dtypes is not None
        if len(args) != len(decl.arg_dtypes):
            raise ArgumentError(f"call_extern: {name!r} takes {len(decl.arg_dtypes)} argument(s) "
                                f"({', '.join(decl.arg_dtypes)}), got {len(args)}")
    else:
        decl = Extern(name, dt, None, name, name)
    xs: list[Expr] = []
    for k, a in enumerate(args):
        if not isinstance(a, (Expr, bool, int, float)) and not hasattr(a, "item"):
            what = f"the tensor {a.name!r}; index it first" if hasattr(a, "op") else f"{type(a).__name__} {a!r}"
            raise ArgumentTypeError(f"call_extern: argument {k} of {name!r} is {what}")
        want = decl.arg_dtypes[k] if decl.arg_dtypes is not None else None
        if not isinstance(a, Expr) and hasattr(a, "item"):
            a = a.item()  # a numpy scalar counts as the Python number
        if isinstance(a, Expr):
            x = a
        elif want is not None:
            x = const(a, weak_scalar_dtype(a, want))
        else:
            x = as_expr(a)
        if want is not None and x.dtype != want:
            raise ArgumentTypeError(f"call_extern: argument {k} of {name!r} has dtype {x.dtype}, declared {want}; "
                                    f"convert it with te.cast({want!r}, ...)")
        _extern_dtype(x.dtype, f"argument {k} of call_extern {name!r}")
        xs.append(x)
    return ExternCall(name, tuple(xs), dt, decl)


# ----------------------------------------------------------------------------- whole stages (te.extern)


@dataclass(frozen=True, slots=True)
class ExternStage:
    """The function of a te.extern stage, the `decl` of its model statement's call: the C symbol `func`
    (called once for the whole stage), the shared library to load for it (or ""); on CUDA the source that
    defines `__device__ void func(...)` and the launch (blocks, threads) whose every thread calls it."""

    func: str
    cpu_library: str = ""
    cuda_source: str = ""
    cuda_launch: tuple[int, int] = (1, 1)


@dataclass(frozen=True)
class StageCall:
    """What te.extern's fcompute returns (`te.call_extern("void", func, *args)`): not an expression."""

    func: str
    args: tuple[Any, ...]


def _not_an_expression(self: StageCall, *_: Any) -> Any:
    raise ArgumentTypeError(f"te.call_extern('void', {self.func!r}, ...) is a whole stage's call, not an "
                            "expression: return it from te.extern's fcompute; a value needs a return dtype")


for _op in ("add", "radd", "sub", "rsub", "mul", "rmul", "truediv", "rtruediv", "floordiv", "rfloordiv", "mod",
            "rmod", "pow", "rpow", "neg", "lt", "le", "gt", "ge"):
    setattr(StageCall, f"__{_op}__", _not_an_expression)

_STAGE_INTERP: dict[str, Callable[..., Any]] = {}


def set_stage_interp(func: str, fn: Callable[..., Any] | None) -> None:
    if fn is not None:
        if not callable(fn):
            raise ArgumentTypeError(f"te.extern: interp= of {func!r} must be callable, got {fn!r}")
        _STAGE_INTERP[func] = fn


def stage_interp_function(func: str) -> Callable[..., Any] | None:
    """The interpreter's implementation of the extern stage function `func` (None: none given)."""
    return _STAGE_INTERP.get(func)


def stage_call(body: Any) -> ExternCall | None:
    """The call of a te.extern stage when `body` (a Store's value, or a te Reduce's body) is one."""
    for n in walk(body) if isinstance(body, Node) else ():
        if isinstance(n, ExternCall) and isinstance(n.decl, ExternStage):
            return n
    return None


def extern_nest(f: Stmt) -> tuple[Store, ExternCall] | None:
    """(the update statement, its call) when `f` is a te.extern stage's model nest, else None. A nest that a
    schedule step changed (it cannot be, see refuse_extern_args; a program built by hand might) is refused."""
    if not isinstance(f, For):
        return None
    stores = [n for n in walk(f) if isinstance(n, Store)]
    hit = [(st, c) for st in stores if (c := stage_call(st.value)) is not None]
    if not hit:
        return None
    st, call = hit[0]
    loops = [n for n in walk(f) if isinstance(n, For)]
    intact = (len(hit) == 1 and len(stores) == 2 and all(lp.kind == "serial" for lp in loops)
              and len(loops) == len(st.iters) and all(c is it for c, it in zip(st.coords, st.iters))
              and isinstance(st.value, Binary) and st.value.b is call)
    if not intact:
        raise CodegenError(f"the te.extern stage {st.name!r} (function {call.decl.func!r}) was transformed by a "
                           "schedule step; an extern stage is opaque: it runs as one call, as lowered")
    return st, call


def extern_buffers(program_body: Stmt) -> dict[str, str]:
    """{buffer name: extern stage} of every buffer a te.extern stage writes or reads in `program_body`."""
    out: dict[str, str] = {}
    for n in walk(program_body):
        if isinstance(n, Store) and stage_call(n.value) is not None:
            out[n.buffer.name] = n.name
            for a in stage_call(n.value).args:  # type: ignore[union-attr]
                if isinstance(a, Load):
                    out.setdefault(a.buffer.name, n.name)
    return out


def refuse_extern_args(primitive: str, program_body: Stmt, loops: list[Var], others: list[Any]) -> None:
    """Refuse a schedule step on a te.extern stage: a loop of (or around) its nest, or its output or an
    input named as a stage (compute_at, compute_inline, cache_read...): the stage runs as one opaque call."""
    bufs = extern_buffers(program_body)
    if not bufs:
        return
    for f in (n for n in walk(program_body) if isinstance(n, For)):
        if f.var in loops and any(isinstance(s, Store) and stage_call(s.value) is not None for s in walk(f)):
            st = next(s for s in walk(f) if isinstance(s, Store) and stage_call(s.value) is not None)
            raise ArgumentError(f"{primitive}: loop {f.var.name!r} belongs to the te.extern stage {st.name!r}, which "
                                "is opaque to scheduling (it runs as one call of its function)")
    for o in others:
        name = o if isinstance(o, str) else getattr(getattr(o, "buffer", o), "name", None)
        if isinstance(o, Buffer):
            name = o.name
        if isinstance(name, str) and name in bufs:
            raise ArgumentError(f"{primitive}: {name!r} is written or read by the te.extern stage {bufs[name]!r}, "
                                "which is opaque to scheduling: its inputs and output stay whole buffers")


def stage_args(call: StageCall, out: Any, inputs: list[Any], out_axes: tuple[Var, ...],
               in_axes: list[tuple[Var, ...]]) -> tuple[Expr, ...]:
    """The model call's arguments of a te.extern stage: a load per tensor (out[o], ins[k][a_k]), int64 sizes."""
    if not isinstance(call, StageCall):
        raise ArgumentTypeError(f"te.extern {out.name!r}: fcompute must return te.call_extern('void', func, *args), "
                                f"got {type(call).__name__} {call!r}")
    xs: list[Expr] = []
    seen_out = False
    for k, a in enumerate(call.args):
        if a is out:
            xs.append(Load(out.buffer, out_axes))
            seen_out = True
        elif any(a is t for t in inputs):
            t = next(j for j, u in enumerate(inputs) if a is u)
            xs.append(Load(a.buffer, in_axes[t]))
        elif hasattr(a, "op") and hasattr(a, "buffer"):
            raise ArgumentError(f"te.extern {out.name!r}: argument {k} is the tensor {a.name!r}, which is not among "
                                "the inputs; list every tensor the function reads in inputs")
        else:
            x = as_expr(a.item() if hasattr(a, "item") else a)  # type: ignore[arg-type]
            if isinstance(x, Expr) and not is_int(x.dtype):
                raise ArgumentTypeError(f"te.extern {out.name!r}: argument {k} ({x}) is {x.dtype}; the function "
                                        "takes tensors and integer sizes")
            xs.append(x)
    if not seen_out:
        raise ArgumentError(f"te.extern {out.name!r}: the call of {call.func!r} does not pass the output "
                            "(outs[0]): the function must write it")
    return tuple(xs)


__all__ = ["EXTERN_DTYPES", "Extern", "ExternStage", "Intrinsic", "StageCall", "call_extern", "extern_buffers",
           "extern_nest", "interp_function", "refuse_extern_args", "register_intrinsic", "registered",
           "set_stage_interp", "stage_args", "stage_call", "stage_interp_function"]
