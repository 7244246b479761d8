"""Halide's tail strategies for `split(loop, factor, tail=...)`: what the last, partial chunk does.

    tail="guard" (the default, split's own code): a guard keeps the last chunk inside the range.
    tail="round_up": no guard; the last chunk runs whole, past the end of the range:

        for i in range(lo, hi): S(i)   ->   for i_o in range(0, (hi - lo + f - 1) // f):
                                                for i_i in range(0, f):
                                                    S(lo + i_o*f + i_i)

      Precondition: every access of the extra instances stays inside its buffer (the bounds proof,
      loopir/bounds.py; refused with a BoundsError naming the buffer otherwise), and the elements the
      extra instances write are touched by no instance of the original program (refused with a witness:
      an extra instance and the original one whose element it would overwrite). The extra instances
      become part of the program (the schedule re-analyses it: later steps are checked against it).
    tail="shift_inwards": no guard; the last chunk is shifted back to end at `hi`, overlapping the one
      before it, whose instances it recomputes:

        for i in range(lo, hi): S(i)   ->   for i_o in range(0, (hi - lo + f - 1) // f):
                                                for i_i in range(0, f):
                                                    S(lo + min(i_o*f, hi - lo - f) + i_i)

      (a symbolic extent that may be below f runs `range(0, min(f, hi - lo))` inside). Precondition:
      the body is idempotent: its statements read no buffer that a statement of the body writes
      (pure stores of a function of the inputs) and the loop carries no dependence. Refused with a
      witness otherwise: the carried dependence, or the instance that would run twice.

The rewrite functions here; `split` (loops.py) dispatches to `split_tail` and checks with `split_check`.
"""

from __future__ import annotations

from typing import Any

from loopir import poly
from loopir.affine import simplify
from loopir.affine import eval_index as _eval
from loopir.args import eval_expr
from loopir.bounds import BoundsError, check_bounds
from loopir.errors import ArgumentError
from loopir.nodes import Const, Expr, For, If, Load, Program, Seq, Stmt, Store, Var, binary, const
from loopir.poly_model import _Builder, _parse_union_map, isl_domain
from loopir.visit import walk, walk_stmts

from ..errors import ScheduleError
from . import CheckContext, find_loop, fresh_name, replace_loop, subst_loops

__all__ = ["TAILS", "split_tail", "split_check"]

TAILS = ("guard", "round_up", "shift_inwards")
# Halide's TailStrategy names, accepted as written there
ALIASES = {"GuardWithIf": "guard", "guard_with_if": "guard", "RoundUp": "round_up", "ShiftInwards": "shift_inwards"}


def check_tail(tail: Any) -> str:
    """The tail strategy `tail` names (an alias resolved); ArgumentError for anything else."""
    if isinstance(tail, str) and tail in ALIASES:
        tail = ALIASES[tail]
    if tail not in TAILS:
        raise ArgumentError(f"split: tail must be one of {', '.join(map(repr, TAILS))} (Halide's tail strategies; "
                            f"its names {', '.join(map(repr, ALIASES))} are accepted too), got {tail!r}")
    return tail


def split_tail(program: Program, loop: Var, factor: int, tail: str) -> tuple[Program, tuple[Var, Var]]:
    """`split` with tail "round_up" or "shift_inwards" (module docstring); `factor` already checked."""
    f = find_loop(program, loop)
    if f.kind != "serial":
        how = f.thread if f.kind == "thread" else f.kind
        raise ArgumentError(f"split: loop {loop.name!r} is already {how}; apply split before annotating it")
    on = fresh_name(program, f"{loop.name}_o")
    vo, vi = Var(on), Var(fresh_name(program, f"{loop.name}_i", {on}))
    fc = const(factor)
    ext = simplify(binary("sub", f.hi, f.lo))
    ohi = binary("floordiv", binary("add", ext, const(factor - 1)), fc)
    ihi: Expr = fc
    if tail == "round_up":
        base: Expr = binary("mul", vo, fc)
    else:
        n = ext.value if isinstance(ext, Const) else None
        if n is not None and n < factor:
            raise ArgumentError(f"split(..., tail='shift_inwards'): loop {loop.name!r} runs {n} iterations, fewer "
                                f"than the factor {factor}; there is no chunk to shift inwards (use tail='guard')")
        if n is not None:
            last = const(n - factor)
        else:  # a symbolic extent may be below the factor: the inner loop then runs the whole (single) chunk
            ihi = binary("min", fc, ext)
            last = binary("sub", ext, ihi)
        base = binary("min", binary("mul", vo, fc), last)
        if n is not None and n % factor == 0:
            base = binary("mul", vo, fc)  # no partial chunk: nothing to shift
    value = binary("add", f.lo, binary("add", base, vi))
    body = subst_loops(f.body, {loop: value})
    new = For(vo, const(0), ohi, For(vi, const(0), ihi, body, pragmas=f.pragmas))  # pragmas: to the inner loop
    return replace_loop(program, loop, new), (vo, vi)


# ----------------------------------------------------------------------------- checks


def split_check(ctx: CheckContext) -> poly.Witness | None:
    """The legality check of `split` for every tail strategy (the default is the plain order check)."""
    tail = check_tail(ctx.kwargs.get("tail", "guard"))
    if tail == "guard":
        bad = poly.instance_mismatch(ctx.deps, ctx.new)
        if bad is not None:
            raise RuntimeError(f"internal error in primitive 'split': {bad}")
        return poly.find_violation(ctx.deps, ctx.new)
    loop = ctx.args[0]
    factor = ctx.args[1] if len(ctx.args) > 1 else ctx.kwargs.get("factor")
    what = f"split({loop.name}, {factor}, tail={tail!r})"
    if tail == "round_up":
        bw = check_bounds(ctx.new)
        if bw is not None and check_bounds(ctx.old) is None:
            raise BoundsError(bw, where=f"{what}: the rounded-up last chunk runs past the end of loop {loop.name} and "
                              f"an access leaves buffer {bw.buffer!r} (pad it, or use tail='guard')")
        w = poly.find_violation(ctx.deps, ctx.new)
        if w is not None:
            return w
        w = _clobbered(ctx)
        if w is not None:
            raise ScheduleError(
                "split", w.kind, w.buffer, w.source, w.sink, w.params,
                f"{what} is illegal: the extra instance {w.instance_str('source')} of the rounded-up last chunk "
                f"writes {w.buffer}{list(w.element or ())}, which {w.instance_str('sink')} of the original program "
                f"{'writes' if w.kind == 'output' else 'reads'} (at {_params(w)}); use tail='guard'", w.element)
        return None
    w = poly.carried_by(ctx.deps, ctx.old, loop)
    if w is not None:
        return w  # a dependence carried by the loop: recomputing an instance later would reorder it
    w = _rerun_not_idempotent(ctx, loop)
    if w is not None:
        raise ScheduleError(
            "split", w.kind, w.buffer, w.source, w.sink, w.params,
            f"{what} is illegal: the shifted last chunk runs {w.instance_str('source')} a second time, but the "
            f"statement reads {w.buffer}{list(w.element or ())}, which its first run wrote (at {_params(w)}): "
            "shift_inwards recomputes instances, so the body must be idempotent (pure stores of a function of "
            "the inputs); use tail='guard'", w.element)
    return None


split_check.checks_bounds = True  # type: ignore[attr-defined]  # only round_up adds accesses: proved above


def _params(w: poly.Witness) -> str:
    return ", ".join(f"{k}={v}" for k, v in w.params.items()) or "these sizes"


def _clobbered(ctx: CheckContext) -> poly.Witness | None:
    """An extra instance of the rounded-up loop writing an element that an original instance reads or writes."""
    b = _Builder(ctx.new)
    old_dom = ctx.deps.domain
    new_dom = isl_domain(ctx.new)
    extra = new_dom.subtract(old_dom)
    if extra.is_empty():
        return None
    rt, wt, mt = b.access_texts()
    reads = _parse_union_map(b, rt)
    writes = _parse_union_map(b, wt).union(_parse_union_map(b, mt))
    w_extra = writes.intersect_domain(extra)
    for kind, acc in (("output", writes), ("flow", reads)):
        clash = w_extra.apply_range(acc.intersect_domain(old_dom).reverse())
        if not clash.is_empty():
            return poly._witness(clash, kind, ctx.deps)
    return None


def _rerun_not_idempotent(ctx: CheckContext, loop: Var) -> poly.Witness | None:
    """A statement of the loop body that reads a buffer the body writes runs some instance twice: the witness
    is that instance (source: its first run, sink: its rerun in the shifted last chunk)."""
    f = find_loop(ctx.old, loop)
    stores = [s for s in walk_stmts(f.body) if isinstance(s, Store)]
    written = {s.buffer for s in stores}
    for st in stores:
        hit = next((ld for ld in walk(st.value) if isinstance(ld, Load) and ld.buffer in written), None)
        if hit is None:
            continue
        found = _first_rerun(ctx.new, st.name)
        if found is None:
            continue
        inst, params = found
        element = tuple(_eval(i, {**params, **inst}) for i in hit.indices)
        by_name = {v.name: x for v, x in inst.items()}
        return poly.Witness("flow", hit.buffer.name, (st.name, by_name), (st.name, dict(by_name)),
                            {v.name: x for v, x in params.items()}, element)
    return None


def _first_rerun(program: Program, stmt: str, budget: int = 200_000) -> tuple[dict[Var, int], dict[Var, int]] | None:
    """(iters, sizes) of an instance of `stmt` that `program` runs twice, found by running the nest's control
    (loops, guards, coords; no data) at small sizes, all sizes equal; None if none is found within budget."""
    for size in range(1, 40):
        params = {p: size for p in program.params}
        walker = _Rerun(stmt, budget)
        inst = walker.run(program.body, dict(params))
        if inst is not None:
            return inst, params
        if walker.steps > budget:
            return None
    return None


class _Rerun:
    """Runs a nest's control flow and stops at the first instance of one statement met a second time."""

    def __init__(self, stmt: str, budget: int) -> None:
        self.stmt, self.budget, self.steps = stmt, budget, 0
        self.seen: set[tuple[int, ...]] = set()

    def run(self, s: Stmt, env: dict[Var, int]) -> dict[Var, int] | None:
        if isinstance(s, Seq):
            for k in s.body:
                r = self.run(k, env)
                if r is not None:
                    return r
        elif isinstance(s, For):
            for v in range(_eval(s.lo, env), _eval(s.hi, env)):
                self.steps += 1
                if self.steps > self.budget:
                    return None
                r = self.run(s.body, {**env, s.var: v})
                if r is not None:
                    return r
        elif isinstance(s, If):
            branch = s.then if eval_expr(s.cond, env) else s.orelse
            return None if branch is None else self.run(branch, env)
        elif isinstance(s, Store) and s.name == self.stmt:
            inst = {v: _eval(c, env) for v, c in zip(s.iters, s.coords)}
            key = tuple(inst.values())
            if key in self.seen:
                return inst
            self.seen.add(key)
        elif hasattr(s, "body"):
            return self.run(s.body, env)  # type: ignore[attr-defined]
        return None
