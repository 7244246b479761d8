"""Loop fusion: two sibling nests with equal extents become one loop.

    for i in 0..n:                      for i in 0..n:
        B[i] = A[i] * 2          ==>        B[i] = A[i] * 2
    for j in 0..n:                          C[i] = B[i] + 1      # coords j -> i
        C[j] = B[j] + 1

(TVM calls this "compute_at of siblings"; TVM's `fuse` is our `collapse`: two *nested*
loops into one.) The tree helpers here (finding a loop, substituting loop variables in
loop bounds, guards and statement coords only) are shared with `compute.py`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from loopir.affine import const_diff, same_value, simplify
from loopir.errors import ArgumentError, ArgumentTypeError, NotFoundError
from loopir.nodes import Expr, If, Program, Seq, Stmt, Var, binary
from loopir.visit import seq

from . import Path, find_loop_path, primitive, subst_loops

# ----------------------------------------------------------------------------- tree helpers


def replace_at(path: Path, new: Stmt | None) -> Stmt | None:
    """Rebuild the tree along `path` with the node at its end replaced by `new` (None removes it)."""
    for parent, k in reversed(path):
        if isinstance(parent, Seq):
            kids = list(parent.body)
            if new is None:
                del kids[k]
            else:
                kids[k] = new
            new = seq(*kids) if kids else None
        elif isinstance(parent, If):
            if k == 0:
                new = replace(parent, then=new if new is not None else Seq(()))
            else:
                new = replace(parent, orelse=new)
        elif new is None:
            new = None  # a loop / Allocate whose whole body disappeared disappears too
        else:
            new = replace(parent, body=new)
    return new


# ----------------------------------------------------------------------------- fuse


def fuse(program: Program, loop_a: Var, loop_b: Var, shift: int = 0) -> tuple[Program, Var]:
    """Fuse the sibling loops `loop_a` and `loop_b` into one loop (the returned `loop_a` variable).

    Precondition: both loops are children of one Seq, `loop_a` first, with the same kind. With
    different extents the fused loop runs the longer one and guards the body of the shorter.
    Statements between them (if any) stay after the fused loop, so `b`'s instances move before
    them; the legality check sees that exactly. `b`'s loop variable is replaced by `a`'s (shifted by the difference of
    the lower bounds) in `b`'s bounds, guards and statement coords.

        for i in lo_a..lo_a+n: SA(i)            for i in lo_a..lo_a+n:
        for j in lo_b..lo_b+n: SB(j)     ==>        SA(i)
                                                    SB(i - lo_a + lo_b)

    `shift=k` (PolyBench's jacobi-1d: time tiling needs the two nests of the time loop fused with an
    offset first) delays `b` by k iterations: the fused iteration that runs iteration lo_a + p of `a` runs
    iteration lo_b + p - k of `b`, so with equal lower bounds iteration i of `b` runs with iteration i + k
    of `a`. The fused loop spans both ranges and guards each body by its own range (k < 0 runs `b` ahead)::

        for i in 1..n-1: B[i] = f(A[i-1..i+1])        for i in 1..n:                             # shift=1
        for j in 1..n-1: A[j] = g(B[j-1..j+1])  ==>       if i < n - 1: B[i] = f(A[i-1..i+1])
                                                          if i >= 2:    A[j] = g(B[j-1..j+1])  (j = i - 1)

    The shift changes the execution order only; it is checked like every fuse (refused with a witness
    when a dependence would run backwards, e.g. the fusion above with shift=0: A[j] needs B[j + 1]).
    This function only rewrites the IR; the registered primitive's order check tests legality.
    """
    if isinstance(shift, bool) or not isinstance(shift, int):
        raise ArgumentTypeError(f"fuse: shift must be an int (iterations of the second loop's delay), got "
                                f"{type(shift).__name__} {shift!r}")
    for v, what in ((loop_a, "first"), (loop_b, "second")):
        if not isinstance(v, Var):
            raise ArgumentTypeError(f"fuse: the {what} loop must be a loop handle, got {type(v).__name__} {v!r}")
    if loop_a is loop_b:
        raise ArgumentError(f"fuse: both handles are loop {loop_a.name!r}; give two sibling loops")
    fa, fb = find_loop_path(program.body, loop_a), find_loop_path(program.body, loop_b)
    for v, f in ((loop_a, fa), (loop_b, fb)):
        if f is None:
            raise NotFoundError(f"fuse: loop {v.name!r} is not in program {program.name!r}")
    assert fa is not None and fb is not None
    (a, pa), (b, pb) = fa, fb
    if any(n is a for n, _ in pb) or any(n is b for n, _ in pa):
        outer, inner = (a, b) if any(n is a for n, _ in pb) else (b, a)
        raise ArgumentError(
            f"fuse: loop {inner.var.name!r} is nested inside loop {outer.var.name!r}; fuse merges two sibling "
            f"nests. Did you mean collapse({outer.var.name}, {inner.var.name})?"
        )
    if not pa or not pb or pa[:-1] != pb[:-1] or pa[-1][0] is not pb[-1][0] or not isinstance(pa[-1][0], Seq):
        raise ArgumentError(
            f"fuse: loops {a.var.name!r} and {b.var.name!r} are not siblings in one sequence of statements"
        )
    parent, ka = pa[-1]
    kb = pb[-1][1]
    assert isinstance(parent, Seq)
    if kb < ka:
        raise ArgumentError(
            f"fuse: loop {a.var.name!r} comes after loop {b.var.name!r}; give them in textual order "
            f"(fuse({b.var.name}, {a.var.name}))"
        )
    ext_a, ext_b = a.hi - a.lo, b.hi - b.lo
    if (a.kind, a.thread) != (b.kind, b.thread):
        ka_s = a.thread or a.kind
        kb_s = b.thread or b.kind
        raise ArgumentError(
            f"fuse: loops {a.var.name!r} ({ka_s}) and {b.var.name!r} ({kb_s}) have different kinds; "
            "fuse them before annotating"
        )
    off = b.lo - a.lo - shift
    target: Expr = a.var if same_value(off, a.var - a.var) else simplify(a.var + off)
    body_a, body_b = a.body, subst_loops(b.body, {b.var: target})
    lo, hi = a.lo, a.hi
    if shift == 0 and not same_value(ext_a, ext_b):
        # different extents (fdtd-2d: nx - 1 and nx): the fused loop runs the longer one, and the body of the
        # shorter one (either, when the difference is not a constant) is guarded by its own extent
        d = const_diff(ext_a, ext_b)
        hi = simplify(a.lo + (ext_a if d is not None and d > 0 else ext_b if d is not None
                              else binary("max", ext_a, ext_b)))
        if d is None or d < 0:
            body_a = If(a.var < a.hi, body_a)
        if d is None or d > 0:
            body_b = If(a.var < simplify(a.lo + ext_b), body_b)
    elif shift != 0:
        # in fused coordinates (offsets from lo_a) a runs [0, ext_a), b runs [shift, shift + ext_b): the loop spans
        # both, and each body keeps a guard for each end where the other range sticks out
        end_b = simplify(ext_b + shift)
        d = const_diff(ext_a, end_b)
        lo = simplify(a.lo + min(0, shift))
        hi = simplify(a.lo + (ext_a if d is not None and d >= 0 else end_b if d is not None
                              else binary("max", ext_a, end_b)))
        if shift < 0:
            body_a = If(a.var >= a.lo, body_a)
        if d is None or d < 0:
            body_a = If(a.var < a.hi, body_a)
        if shift > 0:
            body_b = If(a.var >= simplify(a.lo + shift), body_b)
        if d is None or d > 0:
            body_b = If(a.var < simplify(a.lo + end_b), body_b)
    fused = replace(a, lo=lo, hi=hi, body=seq(body_a, body_b))
    kids = list(parent.body)
    kids[ka] = fused
    del kids[kb]
    new_parent = seq(*kids)
    body = replace_at(pa[:-1], new_parent)
    assert body is not None
    return replace(program, body=body), a.var


# ----------------------------------------------------------------------------- registration


def _fuse_hint(ctx: Any, w: Any) -> str | None:
    a, b = ctx.args[0], ctx.args[1]
    return (f"fusing loops {a.name!r} and {b.name!r} makes {w.sink[0]} run in the same iteration as the "
            f"{w.source[0]} it depends on, or earlier; delay the second nest (fuse({a.name}, {b.name}, shift=k), "
            "k > 0), reverse one nest first, or keep them apart")


def _register() -> None:
    @primitive("fuse", check="order", hint=_fuse_hint)
    def _fuse(program: Program, loop_a: Var, loop_b: Var, shift: int = 0) -> tuple[Program, Var]:
        return fuse(program, loop_a, loop_b, shift)

    _fuse.__doc__ = fuse.__doc__  # the method's help is the primitive's


_register()
