"""Facts about the sizes, and loops padded to a constant trip count: `assume` and `pad_loop`.

A module built for sizes known only at run time can still be given constant trip counts where a size has an
upper bound that every call meets: `assume` records the bound in the program (each call checks it when it binds
its sizes: a call past it gets an ArgumentError, never a wrong result), and `pad_loop` runs a loop over a
constant number of iterations, those past its end guarded off, when no statement instance of the loop lies past
the padded end at any size the program accepts. A constant trip count can be unrolled whole, so a row of a
symbolic length up to the bound keeps its chunks in registers (codegen.passes.registers). Halide's
`Func::bound` with its run-time assertion is the model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import islpy as isl

from loopir.affine import simplify
from loopir.args import eval_expr
from loopir.errors import ArgumentError, ArgumentTypeError, NotFoundError
from loopir.isl_conv import NonAffine, _conj, _Names, aff, cond, loop_constraints
from loopir.nodes import Compare, Const, Expr, For, If, Program, Var, binary, const
from loopir.printer import expr_str
from loopir.visit import StmtContext, free_vars, statements

from . import CheckContext, find_loop, find_loop_path, primitive, replace_loop
from ..errors import ScheduleError, nest_str

__all__ = ["assume", "pad_loop", "max_trip", "padded_trip", "size_domain"]


def _size_var(program: Program, size: Any, what: str) -> Var:
    if isinstance(size, Var):
        if size in program.params:
            return size
        raise NotFoundError(f"{what}: {size.name!r} is not a size variable of program {program.name!r}")
    if not isinstance(size, str):
        raise ArgumentTypeError(f"{what}: size must be a size variable (te.var) or its name, got "
                                f"{type(size).__name__} {size!r}")
    found = [v for v in program.params if v.name == size]
    if len(found) != 1:
        sizes = ", ".join(v.name for v in program.params) or "none"
        raise NotFoundError(f"{what}: {size!r} is not {'one' if found else 'a'} size variable of program "
                            f"{program.name!r} (sizes: {sizes})")
    return found[0]


def _bound_arg(x: Any, name: str) -> int | None:
    if x is None:
        return None
    if isinstance(x, bool) or not isinstance(x, int):
        raise ArgumentTypeError(f"assume: {name} must be an int, got {type(x).__name__} {x!r}")
    return x


def size_domain(program: Program, names: _Names, extra: Sequence[str] = ()) -> str:
    """The isl constraints every size of `program` meets: non-negative, and its `assume` conditions."""
    cons = [f"{names(p)} >= 0" for p in program.params]
    cons += [cond(c, names) for c in program.assume]
    return _conj(cons + list(extra))


def _check_assume(ctx: CheckContext) -> None:
    # always legal: the program's statement instances become those at the sizes it now accepts (a rebase: the
    # dependences are recomputed over them), and a call at any other size is refused when it binds its sizes
    return None


@primitive("assume", check=_check_assume, rebase=True)
def assume(program: Program, size: str, at_most: int | None = None, at_least: int | None = None) -> Program:
    """Record that every call has `at_least <= size <= at_most` (either bound may be left out). Each call
    checks it when it binds its sizes (ArgumentError naming the size past the bound); steps such as `pad_loop`
    may rely on it.

    Precondition: `size` is a size variable of the program (its te.var or its name); the sizes the program
    then accepts are not empty. It changes no loop::

        def f(x: float32[n]):  # sizes: n         def f(x: float32[n]):  # sizes: n
            for i in range(0, n): ...       ->       # assume: n <= 4096
                                                     for i in range(0, n): ..."""
    v = _size_var(program, size, "assume")
    hi, lo = _bound_arg(at_most, "at_most"), _bound_arg(at_least, "at_least")
    if hi is None and lo is None:
        raise ArgumentError("assume: give at_most=, at_least= or both")
    new = list(program.assume)
    for c in ([v <= const(hi)] if hi is not None else []) + ([v >= const(lo)] if lo is not None else []):
        if c not in new:
            new.append(c)
    out = dataclasses.replace(program, assume=tuple(new))
    nm = _Names(unique=True)
    pre = ", ".join(nm(p) for p in program.params)
    if isl.Set(f"[{pre}] -> {{ : {size_domain(out, nm)} }}").is_empty():
        raise ArgumentError(f"assume: no size meets {' and '.join(expr_str(c) for c in new)} (sizes are >= 0): "
                            "the program would accept no call")
    return out


def _check_pad(ctx: CheckContext) -> None:
    # legal iff no statement instance inside the loop has loop value >= lo + extent at a size the program accepts
    program, loop, extent = ctx.old, ctx.args[0], ctx.args[1]
    f = find_loop(program, loop)
    past = simplify(binary("add", f.lo, const(extent)))
    for sc in _inside(program, loop):
        found = _instance_past(program, sc, f, f.hi, past)
        if found is None:
            raise ArgumentError(f"pad_loop({loop.name}, {extent}): the nest around {sc.store.name} is not affine; "
                                "the padded iterations cannot be proved empty")
        if found is not False:
            raise _dropped(ctx, sc, f, extent, found)
    return None


_check_pad.checks_bounds = True  # type: ignore[attr-defined]  # the same instances, so the same accesses


def _inside(program: Program, loop: Var) -> list[StmtContext]:
    return [sc for sc in statements(program) if any(lp.var is loop for lp in sc.loops)]


def _instance_past(program: Program, sc: StmtContext, f: For, end: Expr, at: Expr) -> dict[str, int] | bool | None:
    """An instance of statement `sc` (its loop values and the sizes, "size:<name>"), with loop `f` running up to
    `end`, whose `f` value is >= `at`, at a size the program accepts; False when there is none, None when the
    nest is not affine."""
    nm = _Names(unique=True)
    loops = [dataclasses.replace(lp, hi=end) if lp is f else lp for lp in sc.loops]
    try:
        pre = [nm(p) for p in program.params]
        dims = [nm(lp.var) for lp in loops]
        cons = loop_constraints(loops, sc.guards, nm) + [f"{nm(f.var)} >= {aff(at, nm)}"]
        s = isl.Set(f"[{', '.join(pre)}] -> {{ [{', '.join(dims)}] : {size_domain(program, nm, cons)} }}")
    except (NonAffine, isl.Error):
        return None
    if s.is_empty():
        return False
    pt = s.sample_point()
    out = {lp.var.name: int(pt.get_coordinate_val(isl.dim_type.set, k).to_python()) for k, lp in enumerate(loops)}
    for k, p in enumerate(program.params):
        out[f"size:{p.name}"] = int(pt.get_coordinate_val(isl.dim_type.param, k).to_python())
    return out


def _dropped(ctx: CheckContext, sc: StmtContext, f: For, extent: int, pt: dict[str, int]) -> ScheduleError:
    st, program = sc.store, ctx.old
    params = {p.name: pt[f"size:{p.name}"] for p in program.params}
    env = {lp.var: pt[lp.var.name] for lp in sc.loops} | {p: params[p.name] for p in program.params}
    inst = {it.name: int(eval_expr(c, env)) for it, c in zip(st.iters, st.coords)}
    at = ", ".join(f"{k}={v}" for k, v in params.items())
    told = " and ".join(expr_str(c) for c in program.assume) or "nothing"
    trip = expr_str(simplify(binary("sub", f.hi, f.lo)))
    sizes = sorted(v.name for v in free_vars(f.hi) | free_vars(f.lo) if v in program.params)
    hint = (f"the program assumes {told} about its sizes: s.assume({sizes[0]!r}, at_most=...) with a bound at which "
            f"{trip} <= {extent}, or a larger extent, makes it legal" if sizes else
            f"the loop runs {trip} iterations: pad it to at least that many")
    inst_s = f"{st.name}[{', '.join(f'{k}={v}' for k, v in inst.items())}]"
    end = expr_str(simplify(binary("add", f.lo, const(extent))))
    lines = [f"pad_loop({f.var.name}, {extent}) is illegal: it would no longer run {inst_s} "
             f"({f.var.name}={pt[f.var.name]}, at or past the padded end {end})" + (f" at {at}" if at else ""),
             "the nest before this step (the loop is marked):"]
    lines += ["    " + ln for ln in nest_str(program, {f.var: "<- pad_loop"}).splitlines()]
    lines.append(f"hint: {hint}")
    return ScheduleError("pad_loop", "dropped", st.buffer.name, (st.name, inst), (st.name, inst), params,
                         "\n".join(lines), hint=hint)


@primitive("pad_loop", check=_check_pad)
def pad_loop(program: Program, loop: Var, extent: int) -> Program:
    """Run `loop` over exactly `extent` iterations from its lower bound, the ones past its end guarded off
    (`if loop < end`, left out where the statements' own guards already exclude them): a loop of a symbolic
    trip count bounded by an assumed size gets a constant one, which the target can unroll whole.

    Precondition: `loop` is a serial loop, `extent` >= 1, and no statement instance inside it has a loop value
    at or past lo + extent at any size the program accepts (its `assume` conditions): otherwise ScheduleError
    with the first such instance and the sizes. It changes neither the instances nor their order::

        # assume: n <= 4096                       # assume: n <= 4096
        for ks in range(0, (n + 1023) // 1024):    for ks in range(0, 4):        # pad_loop(ks, 4)
            if ks * 1024 + t < n:            ->        if ks * 1024 + t < n:     # (the guard implies ks < its end)
                S(ks * 1024 + t)                          S(ks * 1024 + t)"""
    if isinstance(extent, bool) or not isinstance(extent, int):
        raise ArgumentTypeError(f"pad_loop: extent must be an int, got {type(extent).__name__} {extent!r}")
    if extent < 1:
        raise ArgumentError(f"pad_loop: extent must be >= 1, got {extent}")
    f = find_loop(program, loop)
    if f.kind not in ("serial", "unroll"):
        raise ArgumentError(f"pad_loop: loop {loop.name!r} is {f.thread or f.kind}; only a serial loop is padded "
                            "(pad it before binding or vectorizing it)")
    hi = simplify(binary("add", f.lo, const(extent)))
    if hi == f.hi:
        return program
    body = f.body
    # the guard is left out where every statement's own guards already keep it inside the old end
    if any(_instance_past(program, sc, f, hi, f.hi) is not False for sc in _inside(program, loop)):
        body = If(Compare("lt", f.var, f.hi), body)
    return replace_loop(program, loop, dataclasses.replace(f, hi=hi, body=body))


def padded_trip(program: Program, loop: Var, most: int) -> int | None:
    """The constant extent `pad_loop` can give `loop`: its trip count is symbolic and the program's assumed sizes
    bound it by at most `most` iterations (`max_trip`); None otherwise (a constant trip count, no bound, or more)."""
    f = find_loop(program, loop)
    if not program.assume or isinstance(simplify(binary("sub", f.hi, f.lo)), Const):
        return None
    k = max_trip(program, loop)
    return k if k is not None and 1 <= k <= most else None


def max_trip(program: Program, loop: Var) -> int | None:
    """The most iterations `loop` runs at any size the program accepts (its `assume` conditions) and any value
    of the loops around it, or None when that is unbounded or not affine."""
    found = find_loop_path(program.body, loop)
    if found is None:
        return None
    f, path = found
    loops = [a for a, _ in path if isinstance(a, For)]
    guards = [a.cond if k == 0 else ~a.cond for a, k in path if isinstance(a, If)]
    nm = _Names(unique=True)
    try:
        dims = [nm(p) for p in program.params] + [nm(lp.var) for lp in loops]
        cons = loop_constraints(loops, guards, nm) + [f"e = ({aff(f.hi, nm)}) - ({aff(f.lo, nm)})"]
        s = isl.Set(f"{{ [{', '.join(dims + ['e'])}] : {size_domain(program, nm, cons)} }}")
    except (NonAffine, isl.Error):
        return None
    if s.is_empty():
        return None
    v = s.dim_max_val(len(dims))
    return int(v.to_python()) if v.is_int() else None
