"""Dead tiles (CUDA pipeline): a tile loop stops at the last tile in which some thread of the block has work.

A serial loop every thread of a block runs (the key tiles of an attention pass: copy a K / V tile to shared
memory, barrier, compute, barrier) does work only where the guards of its statements hold. Under a causal mask
(`key <= row`, which `online_softmax` turns into a guard) the key tiles past the block's last row have none:
every statement there is guarded off for every thread, and what remains is the copies of tiles nobody reads.

    for ko in [0, hi):                              for ko in [0, min(hi, floor((64*bo + 63 - 0) / 32) + 1)):
        copy K[32*ko : +32] to K_sh; barrier   ==>      (the same body)
        for ki in [0, 32): if 32*ko + ki <= 64*bo + t: S
        barrier

Formal: let W be the statements of the loop's body that write a buffer allocated outside it. If every w in W
lies under a conjunct `c*v + r(x) <= b` (c > 0; x the loops inside v and the block's thread loops, each of
constant range; b free of them), then no instance of W runs at v > U = max_x floor((b - r(x)) / c), and the
iterations v > U write only buffers allocated inside the loop, which no later statement reads: removing them
is an identity on every buffer the kernel leaves behind. U is free of the threads, so every thread still runs
the same iterations and the barriers stay uniform.
"""

from __future__ import annotations

import dataclasses

from loopir import nodes as N
from loopir.affine import linear_form
from loopir.gpu import is_thread_loop
from loopir.nodes import conjuncts
from loopir.visit import Transformer, free_vars, walk

from .kernels import map_kernels


def skip_dead_tiles(program: N.Program) -> N.Program:
    """Clip the serial loops of each kernel at the last iteration some thread has work in (module docstring).

    identity on the buffers the kernel leaves behind: the removed iterations write only buffers they allocate."""
    return map_kernels(program, _kernel)


def _kernel(k: N.Stmt) -> N.Stmt:
    if not isinstance(k, N.Kernel):
        return k
    ranges: dict[N.Var, tuple[int, int]] = {}
    for f in walk(k.body):
        if isinstance(f, N.For) and is_thread_loop(f):
            r = _const_range(f)
            if r is None:
                return k
            ranges[f.var] = r
    return _Clip(ranges, {f.var for f in walk(k.body) if isinstance(f, N.For)}).visit(k)


class _Clip(Transformer):
    """Each loop the whole block runs in step (a barrier inside) clipped at its last busy iteration, inner loops
    first: there, skipping saves copies and barriers; an inner loop's iterations are already skipped by their
    guards."""

    def __init__(self, threads: dict[N.Var, tuple[int, int]], loops: set[N.Var]) -> None:
        self.threads, self.loops = threads, loops

    def visit_For(self, s: N.For) -> N.For:
        out = self.generic(s)
        if (s.kind != "serial" or not isinstance(s.lo, N.Const) or int(s.lo.value) != 0
                or not any(isinstance(n, N.Barrier) for n in walk(s.body))):
            return out
        last = _last_busy(out, self.threads, self.loops)
        if last is None:
            return out
        return dataclasses.replace(out, hi=N.binary("min", out.hi, N.binary("add", last, N.const(1))))


def _const_range(f: N.For) -> tuple[int, int] | None:
    if isinstance(f.lo, N.Const) and isinstance(f.hi, N.Const):
        return int(f.lo.value), int(f.hi.value) - 1
    return None


def _last_busy(f: N.For, threads: dict[N.Var, tuple[int, int]], outer: set[N.Var]) -> N.Expr | None:
    """U of the module docstring for loop `f` (the least of the bounds when there are several), or None when
    some statement writing a buffer allocated outside `f` has no such bound (or the statements' bounds differ)."""
    inside = {n.buffer.name for n in walk(f.body) if isinstance(n, N.Allocate)}
    # a bound of sizes alone (`32*ko + ki < n`) is the loop's own trip count again: only bounds that move with the
    # block (a causal mask's row tile: a variable of `outer`, the kernel's loops) clip anything
    found: list[dict[str, N.Expr]] = []
    ok = True

    def go(s: N.Stmt, conds: tuple[N.Expr, ...], inner: dict[N.Var, tuple[int, int]]) -> None:
        nonlocal ok
        if not ok:
            return
        if isinstance(s, N.Store):
            if s.buffer.name in inside:
                return
            us = {repr(b): b for c in conds if (b := _bound(c, f.var, {**threads, **inner})) is not None
                  and free_vars(b) & outer}
            if not us:
                ok = False
            else:
                found.append(us)
        elif isinstance(s, N.For):
            r = _const_range(s)
            if r is None:
                ok = False
                return
            go(s.body, conds, {**inner, s.var: r})
        elif isinstance(s, N.Seq):
            for c in s.body:
                go(c, conds, inner)
        elif isinstance(s, N.If):
            go(s.then, conds + tuple(conjuncts(s.cond)), inner)
            if s.orelse is not None:
                go(s.orelse, conds, inner)
        elif isinstance(s, N.Allocate):
            go(s.body, conds, inner)
        elif not isinstance(s, N.Barrier):
            ok = False

    go(f.body, (), {})
    # each statement runs only up to the least of its bounds; the loop, up to the largest of those (taken when
    # every statement has the same bounds: the guards of one pass)
    if not ok or not found or any(u.keys() != found[0].keys() for u in found):
        return None
    out: N.Expr | None = None
    for u in found[0].values():
        out = u if out is None else N.binary("min", out, u)
    return out


def _bound(c: N.Expr, v: N.Var, bounded: dict[N.Var, tuple[int, int]]) -> N.Expr | None:
    """For a conjunct `c` that reads `a <= b` / `a < b` (or the mirrored forms) with `v`'s coefficient positive in
    a - b: the largest `v` it allows over every value of the `bounded` variables, free of them; else None."""
    if not isinstance(c, N.Compare) or c.op not in ("lt", "le", "gt", "ge"):
        return None
    a, b = (c.a, c.b) if c.op in ("lt", "le") else (c.b, c.a)
    la, lb = linear_form(a), linear_form(b)
    if la is None or lb is None:
        return None
    d = {x: la.get(x, 0) - lb.get(x, 0) for x in set(la) | set(lb)}  # d(v, x, rest) <= 0 (< 0 when strict)
    if c.op in ("lt", "gt"):
        d[1] = d.get(1, 0) + 1
    cv = d.pop(v, 0)
    if cv <= 0:
        return None
    # cv*v <= -(rest): the largest right side over the bounded variables
    const = -d.pop(1, 0)
    rest: N.Expr = N.const(0)
    for x, co in d.items():
        if not co:
            continue
        if x in bounded:
            lo, hi = bounded[x]
            const += max(-co * lo, -co * hi)
        elif isinstance(x, N.Var):
            rest = N.binary("add", rest, N.binary("mul", N.const(-co), x))
        else:
            return None
    return N.binary("floordiv", N.binary("add", rest, N.const(const)), N.const(cv))


__all__ = ["skip_dead_tiles"]
