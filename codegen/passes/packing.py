"""Panel packing (CPU pipeline): the GEMM's column panel of B copied once per parallel iteration into a
contiguous scratch, at fixed and at symbolic sizes alike.

The CPU GEMM recipe keeps one column panel of B (p rows x W columns) in L2 while every row strip of A
streams past it. Rows of B are m floats apart; when m * 4 is a multiple of 4 KiB (m = 1024, 2048, ...)
every row of the panel falls in the same few cache sets, the panel does not stay in L2, and each strip
re-reads it from L3 (measured at 1024^3: 2.6x the time of 1000^3). Packing the panel into a W-wide
scratch makes it contiguous. `cache_read` would do it at fixed sizes only (local scratch needs a constant
shape); this pass does it for any p, in the full-width tiles that `version_tiles` left:

    for jo in parallel:                                 for jo in parallel:
      ...                                                 allocate B_panel[p, W] (heap when large):
        for k in range(0, p):                               for c0 in range(0, p): for c1 in vectorize(0, W):
          for ii in unroll: for ji in vectorize(0, W):  =>      B_panel[c0, c1] = B[c0, b + c1]
            C_local[..] += A[.., k] * B[k, b + ji]         ...
                                                              for k: ...: C_local[..] += A[.., k] * B_panel[k, ji]

Applied where: B is never written by the program; inside one parallel loop, every load of B lies in a k
loop `for k in range(0, K)` (K invariant there) whose body is exactly `for ii (unroll): for ji
(vectorize, constant 0..W): store`, loading B[k, b + ji] with b free of the loops inside the parallel loop
body. The scratch is allocated at the top of the parallel loop's body (or of the branch of the one `If`
there that holds every such load: the full-width version). Every element it copies is one some k-loop
instance loads (the same k range, the same W columns at the same b), so the copy reads in bounds exactly
when the loads it replaces do.
"""

from __future__ import annotations

import dataclasses

from loopir import nodes as N
from loopir.affine import const_diff, linear_in
from loopir.visit import Transformer, subst_coords, substitute, walk

__all__ = ["pack_panels"]


def pack_panels(program: N.Program) -> N.Program:
    """Copy each GEMM column panel of a read-only input into a contiguous scratch per parallel iteration.

    identity on the values stored: the scratch holds exactly the elements the rewritten loads read."""
    written = {n.buffer for n in walk(program.body) if isinstance(n, N.Store)}
    count = [0]
    body = _go(program.body, written, count)
    return program if body is program.body else dataclasses.replace(program, body=body)


def _go(s: N.Stmt, written: set[N.Buffer], count: list[int]) -> N.Stmt:
    if isinstance(s, N.For) and s.kind == "parallel":
        packed = _pack_region(s.body, written, count)
        if packed is not None:
            return dataclasses.replace(s, body=packed)
        if isinstance(s.body, N.If):  # the full-width version of the panel loop, and the partial one (padded)
            t = _pack_region(s.body.then, written, count)
            e = None if s.body.orelse is None else _pack_region(s.body.orelse, written, count, pad=True)
            if t is not None or e is not None:
                return dataclasses.replace(s, body=N.If(s.body.cond, s.body.then if t is None else t,
                                                        s.body.orelse if e is None else e))
        return s
    if isinstance(s, N.Seq):
        kids = tuple(_go(c, written, count) for c in s.body)
        return s if all(a is b for a, b in zip(kids, s.body)) else N.Seq(kids)
    if isinstance(s, (N.For, N.Allocate)):
        b = _go(s.body, written, count)
        return s if b is s.body else dataclasses.replace(s, body=b)
    if isinstance(s, N.If):
        t = _go(s.then, written, count)
        e = None if s.orelse is None else _go(s.orelse, written, count)
        return s if t is s.then and e is s.orelse else N.If(s.cond, t, e)
    return s


def _pack_region(region: N.Stmt, written: set[N.Buffer], count: list[int], pad: bool = False) -> N.Stmt | None:
    """`region` with one panel packed, or None when no buffer's loads in it all have the panel shape. `pad`:
    the panel's tile loops may be `vectorize(0, min(W, lim))` (the last, partial panel): the scratch is
    padded with zeros to W columns and those loops that fill the local register tile run to W."""
    inside = {n.var for n in walk(region) if isinstance(n, N.For)}
    loads: dict[N.Buffer, list[N.Load]] = {}
    for n in walk(region):
        if isinstance(n, N.Load) and n.buffer.scope == "global" and len(n.indices) == 2:
            loads.setdefault(n.buffer, []).append(n)
    for buf, lds in loads.items():
        if buf in written:
            continue
        shape = _panel(region, buf, inside, pad)
        if shape is None or shape[3] != {id(x) for x in lds}:  # (versions may share a Load object)
            continue
        K, W, base, ok_loads, lim = shape
        count[0] += 1
        pb = N.Buffer(f"{buf.name}_panel", (K, N.Const(W, "int64")), buf.dtype, "local")
        c0, c1 = N.Var(f"{buf.name}_pk0"), N.Var(f"{buf.name}_pk1")
        col = c1 if _is_zero(base) else N.Binary("add", base, c1, "int64")
        zero, w = N.Const(0, "int64"), N.Const(W, "int64")
        fill = N.Store(pb.name, pb, (c0, c1), N.Load(buf, (c0, col)), (c0, c1), (c0, c1))
        if lim is None:
            copy = N.For(c0, zero, K, N.For(c1, zero, w, fill, "vectorize"))
        else:  # columns [0, min(W, lim)) copied, the rest of the W zero (multiplied into tile columns never stored)
            cut = N.Binary("max", zero, N.Binary("min", w, lim, "int64"), "int64")
            cz = N.Var(f"{buf.name}_pk2")
            pad0 = N.Store(f"{pb.name}_pad", pb, (c0, cz), N.Const(0.0, buf.dtype), (c0, cz), (c0, cz))
            copy = N.For(c0, zero, K, N.Seq((N.For(c1, zero, cut, fill), N.For(cz, cut, w, pad0))))
        widen = None if lim is None or not _reads_clipped(region, W, lim) else (W, lim)
        new = _Rewrite(buf, pb, ok_loads, widen).visit(region)
        return N.Allocate(pb, N.Seq((copy, new)))
    return None


def _is_zero(e: N.Expr) -> bool:
    return isinstance(e, N.Const) and e.value == 0


def _width(hi: N.Expr, inside: set[N.Var], pad: bool) -> tuple[int, N.Expr | None] | None:
    """(W, None) for a constant bound W; (W, lim) for min(W, lim) with `pad` and lim free of `inside`."""
    if isinstance(hi, N.Const):
        return int(hi.value), None
    if (pad and isinstance(hi, N.Binary) and hi.op == "min" and isinstance(hi.a, N.Const)
            and not any(x in inside for x in walk(hi.b) if isinstance(x, N.Var))):
        return int(hi.a.value), hi.b
    return None


def _panel(region: N.Stmt, buf: N.Buffer, inside: set[N.Var], pad: bool = False
           ) -> tuple[N.Expr, int, N.Expr, set[int], N.Expr | None] | None:
    """(K, W, b, ids of the loads, lim) when every k loop in `region` that loads `buf` has the panel shape
    (see the module doc) with one K, W, b (and lim: the partial width, or None); None otherwise."""
    found: list[tuple[N.Expr, tuple[int, N.Expr | None], N.Expr, N.Load]] = []
    for f in (n for n in walk(region) if isinstance(n, N.For)):
        if f.kind != "serial" or not any(isinstance(x, N.Load) and x.buffer is buf for x in walk(f.body)):
            continue
        if any(isinstance(x, N.For) and x.kind == "serial" and x is not f and any(
                isinstance(y, N.Load) and y.buffer is buf for y in walk(x.body)) for x in walk(f.body)):
            continue  # an outer serial loop (io): its inner k loop is examined on its own
        ii = f.body
        if not (isinstance(ii, N.For) and ii.kind == "unroll" and isinstance(ii.body, N.For)):
            return None
        ji = ii.body
        wl = _width(ji.hi, inside, pad) if isinstance(ji, N.For) else None
        if not (wl is not None and ji.kind == "vectorize" and _is_zero(ji.lo) and isinstance(ji.body, N.Store)
                and ji.body.buffer.scope == "local" and _is_zero(f.lo)):
            return None
        if any(x in inside for x in walk(f.hi) if isinstance(x, N.Var)):
            return None
        for ld in (x for x in walk(ji.body.value) if isinstance(x, N.Load) and x.buffer is buf):
            k_ix, j_ix = ld.indices
            if k_ix is not f.var:
                return None
            lin = linear_in(j_ix, ji.var)
            if lin is None or lin[0] != 1 or any(x in inside for x in walk(lin[1]) if isinstance(x, N.Var)):
                return None
            found.append((f.hi, wl, lin[1], ld))
    if not found:
        return None
    K, (W, lim), b, _ = found[0]
    if any(k != K or w != (W, lim) or bb != b for k, w, bb, _ in found):
        return None
    return K, W, b, {id(x[3]) for x in found}, lim


class _Rewrite(Transformer):
    """Loads of the panel's elements read the scratch; with `widen` = (W, lim), the vectorize loops
    `0..min(W, lim)` that store into a local buffer (the register tile's init and update) run to W: the
    extra columns of the tile are computed from the zero padding and never stored."""

    def __init__(self, buf: N.Buffer, panel: N.Buffer, ids: set[int], widen: tuple[int, N.Expr] | None) -> None:
        self.buf, self.panel, self.ids, self.widen = buf, panel, ids, widen
        self.ji: N.Var | None = None

    def visit_For(self, f: N.For) -> N.Stmt:
        if f.kind == "vectorize":
            if (self.widen is not None and f.hi == N.Binary("min", N.Const(self.widen[0], f.hi.dtype), self.widen[1],
                                                           f.hi.dtype)
                    and isinstance(f.body, N.Store) and f.body.buffer.scope == "local"
                    and _fits(f.body, f.var, self.widen[0], self.buf)):
                f = dataclasses.replace(f, hi=N.Const(self.widen[0], f.hi.dtype))
            saved, self.ji = self.ji, f.var
            try:
                return self.generic(f)
            finally:
                self.ji = saved
        return self.generic(f)

    def visit_Load(self, ld: N.Load) -> N.Expr:
        if id(ld) in self.ids and self.ji is not None:
            return N.Load(self.panel, (ld.indices[0], self.ji))
        return self.generic(ld)


def _fits(st: N.Store, v: N.Var, w: int, packed: N.Buffer) -> bool:
    """Every access of `st` that uses `v` (the packed operand's loads aside: they read the W-wide panel)
    is to local scratch, with `v` as a whole index in a dimension of constant size >= w (the register tile
    may be narrower than the panel when the matrix is: then the loop is not widened)."""
    sub = subst_coords(st)
    loads = [x for x in walk(substitute(st.value, sub)) if isinstance(x, N.Load) and x.buffer is not packed]
    accs = [(st.buffer, tuple(substitute(i, sub) for i in st.indices))] + [(x.buffer, x.indices) for x in loads]
    for buf, idx in accs:
        for ix, dim in zip(idx, buf.shape):
            if any(y is v for y in walk(ix)):
                if buf.scope != "local" or ix is not v or not (isinstance(dim, N.Const) and int(dim.value) >= w):
                    return False
    return True


def _reads_clipped(region: N.Stmt, w: int, lim: N.Expr) -> bool:
    """Every statement that reads local scratch without writing it (the copy-out, the epilogue) reads it
    inside vectorize loops clipped to min(W, lim') with lim' = lim, so the columns a widened tile loop adds
    are never read: widening them changes no stored value."""
    ok = True

    def go(s: N.Stmt, his: dict[N.Var, N.Expr]) -> None:
        nonlocal ok
        if isinstance(s, N.For):
            go(s.body, {**his, s.var: s.hi})
        elif isinstance(s, (N.Seq,)):
            for c in s.body:
                go(c, his)
        elif isinstance(s, N.If):
            go(s.then, his)
            if s.orelse is not None:
                go(s.orelse, his)
        elif isinstance(s, N.Allocate):
            go(s.body, his)
        elif isinstance(s, N.Store):
            sub = subst_coords(s)
            for ld in walk(substitute(s.value, sub)):
                if not (isinstance(ld, N.Load) and ld.buffer.scope == "local" and ld.buffer is not s.buffer):
                    continue
                col = ld.indices[-1] if ld.indices else None
                hi = his.get(col) if isinstance(col, N.Var) else None
                if not (isinstance(hi, N.Binary) and hi.op == "min" and isinstance(hi.a, N.Const)
                        and int(hi.a.value) <= w and const_diff(hi.b, lim) == 0):
                    ok = False

    go(region, {})
    return ok

