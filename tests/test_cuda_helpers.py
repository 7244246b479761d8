"""Hand-written GPU bindings built directly on the loop IR (used by the CUDA tests and gpu_suite
until every schedule primitive is available). They follow the IR convention: loops, guards and
coords are rewritten, never a statement's indices or value."""

from __future__ import annotations

import dataclasses

from loopir import nodes as N
from loopir.visit import Transformer, substitute


class _Sub(Transformer):
    """Replace var -> expr in loop bounds, guards and coords (not in indices/values)."""

    def __init__(self, mapping: dict[N.Var, N.Expr]):
        self.m = mapping

    def visit_For(self, f: N.For) -> N.For:
        return dataclasses.replace(f, lo=substitute(f.lo, self.m), hi=substitute(f.hi, self.m), body=self.visit(f.body))

    def visit_If(self, s: N.If) -> N.If:
        return N.If(substitute(s.cond, self.m), self.visit(s.then), None if s.orelse is None else self.visit(s.orelse))

    def visit_Store(self, st: N.Store) -> N.Store:
        return dataclasses.replace(st, coords=tuple(substitute(c, self.m) for c in st.coords))


def sub_coords(s: N.Stmt, mapping: dict[N.Var, N.Expr]) -> N.Stmt:
    return _Sub(mapping).visit(s)


def bind_flat(f: N.For, threads: int = 256) -> N.Stmt:
    """for i in lo..hi: B  ->  for io (blockIdx.x): for ii (threadIdx.x, T): if lo+io*T+ii < hi: B[i := ...]."""
    io, ii = N.Var(f.var.name + "_o"), N.Var(f.var.name + "_i")
    i = N.binary("add", f.lo, io * threads + ii)
    ext = N.binary("sub", f.hi, f.lo)
    body = N.If(i < f.hi, sub_coords(f.body, {f.var: i}))
    inner = N.For(ii, N.const(0), N.const(threads), body, "thread", "threadIdx.x")
    return N.For(io, N.const(0), (ext + (threads - 1)) // threads, inner, "thread", "blockIdx.x")


def thread_strided(f: N.For, threads: int = 256, kind: str = "thread") -> N.Stmt:
    """for k in lo..hi: B  ->  for kt (threadIdx.x, T): for ko: if lo+ko*T+kt < hi: B[k := ...]."""
    ko, kt = N.Var(f.var.name + "_o"), N.Var(f.var.name + "_t")
    k = N.binary("add", f.lo, ko * threads + kt)
    ext = N.binary("sub", f.hi, f.lo)
    body = N.If(k < f.hi, sub_coords(f.body, {f.var: k}))
    serial = N.For(ko, N.const(0), (ext + (threads - 1)) // threads, body)
    return N.For(kt, N.const(0), N.const(threads), serial, kind, "threadIdx.x" if kind == "thread" else None)


def nests(p: N.Program) -> list[N.Stmt]:
    return list(p.body.body) if isinstance(p.body, N.Seq) else [p.body]


def bind_elementwise(p: N.Program, threads: int = 256) -> N.Program:
    """Every top-level nest: its outermost loop split over blocks and threads."""
    out = [bind_flat(s, threads) if isinstance(s, N.For) else s for s in nests(p)]
    return dataclasses.replace(p, body=N.Seq(tuple(out)) if len(out) > 1 else out[0])


def bind_rows(p: N.Program, threads: int = 128) -> N.Program:
    """Every top-level nest `for i: (init; for k: ...)` or `for i: for j: ...`: rows over blockIdx.x,
    the inner loops strided over threadIdx.x (reductions become cross-thread reductions)."""
    out = []
    for s in nests(p):
        assert isinstance(s, N.For)
        out.append(dataclasses.replace(s, kind="thread", thread="blockIdx.x", body=_thread_inner(s.body, threads)))
    return dataclasses.replace(p, body=N.Seq(tuple(out)) if len(out) > 1 else out[0])


def _thread_inner(s: N.Stmt, threads: int) -> N.Stmt:
    if isinstance(s, N.For):
        return thread_strided(s, threads)
    if isinstance(s, N.Seq):
        return N.Seq(tuple(_thread_inner(c, threads) for c in s.body))
    return s


def fuse_rows(p: N.Program, threads: int = 128) -> N.Program:
    """All top-level row nests over the same rows in ONE kernel: one block per row, the phases'
    inner loops strided over threadIdx.x (the softmax / layernorm single-kernel mapping)."""
    ns = nests(p)
    first = ns[0]
    assert isinstance(first, N.For)
    row = N.Var(first.var.name)
    phases = []
    for s in ns:
        assert isinstance(s, N.For)
        phases.append(_thread_inner(sub_coords(s.body, {s.var: row}), threads))
    body = N.For(row, first.lo, first.hi, N.Seq(tuple(phases)), "thread", "blockIdx.x")
    return dataclasses.replace(p, body=body)
