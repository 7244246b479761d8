"""forward_row_totals: a row's reduction results that only ever travel in registers are not stored (CUDA).

A fused row kernel keeps its reductions' results (softmax's row max and sum, layer norm's mean and variance) in
global temporaries: every thread stores the identity, thread 0 stores the total after the block all-reduce, and
the phases after it read the element. The renderer already reads those elements from the register the all-reduce
left in every thread (`forward_key`: the total is visible to the other threads only through it), so where every
load of the temporary is such a read, its stores are dead and the barriers that order them order nothing:

    row_max[i] = -inf                  (every thread)        row_max_total = max over the block (registers)
    for kt (threadIdx.x): row_max[i] = max(row_max[i], ..)   y = exp(x - row_max_total) / ...
    if (threadIdx.x == 0) row_max[i] = total;  __syncthreads();  ==>  no store, no barrier
    y = exp(x - row_max[i]) / ...

This pass proves it per temporary and records it in `Kernel.forwarded`; `place_barriers` leaves those accesses out
and the renderer prints no store to them. H200, float16 rows of 3000 to 8192 elements: 2-6% of the DRAM floor (a
hand edit of the kernels, benchmarks/RESULTS_rows_half.md).
"""

from __future__ import annotations

import dataclasses

from loopir import nodes as N
from loopir.affine import row_major
from loopir.gpu import reduction_parts, reduction_stores
from loopir.visit import Transformer, subst_coords, substitute, walk


__all__ = ["forward_row_totals"]


def forward_row_totals(program: N.Program) -> N.Program:
    """Mark the temporaries whose every load in their one kernel reads a forwarded all-reduce total.

    Formal condition: temporary B is marked in kernel K iff K holds every access of B; B's stores are (a) constant
    stores outside every thread loop, each followed in its scope by (b) the cross-thread reduction into the same
    element (whose initial value the renderer takes from (a)), and nothing else; and every load of B reads an
    element whose reduction total is available in the renderer's forwarding scopes there (after the reduction, in
    its scope or one nested in it, with no store to B between). The program's values are unchanged: every read
    gets the total it read from memory."""
    counts: dict[str, int] = {}
    for k in walk(program.body):
        if isinstance(k, N.Kernel):
            for name in {n.buffer.name for n in walk(k.body) if isinstance(n, (N.Load, N.Store))}:
                counts[name] = counts.get(name, 0) + 1
    temps = {t.name for t in program.temps if counts.get(t.name) == 1}
    if not temps:
        return program

    class _Kernels(Transformer):
        def visit_Kernel(self, k: N.Kernel) -> N.Kernel:
            mine = {n.buffer.name for n in walk(k.body) if isinstance(n, (N.Load, N.Store))} & temps
            ok = frozenset(b for b in mine if _Check(k, b).run())
            return dataclasses.replace(k, forwarded=k.forwarded | ok) if ok else k

    body = _Kernels().visit(program.body)
    return program if body is program.body else dataclasses.replace(program, body=body)


class _Check:
    """Walks one kernel in the renderer's order and scopes for one temporary `name`."""

    def __init__(self, k: N.Kernel, name: str) -> None:
        self.k, self.name, self.ok = k, name, True

    def run(self) -> bool:
        self.stmt(self.k.body, [set()], [{}], frozenset())
        return self.ok

    def key(self, b: N.Buffer, idx: tuple[N.Expr, ...]) -> N.Expr:
        # the renderer's forward_key exactly (not simplified): a load it would not match reads memory never stored
        return row_major(b.shape, idx) if idx else N.const(0)

    def loads(self, e: N.Expr, sub: dict, scopes: list[set]) -> None:
        for n in walk(e):
            if isinstance(n, N.Load) and n.buffer.name == self.name:
                at = self.key(n.buffer, tuple(substitute(i, sub) for i in n.indices))
                if not any(at in sc for sc in scopes):
                    self.ok = False

    def stmt(self, s: N.Stmt, scopes: list[set], inits: list[dict], axes: frozenset[str]) -> None:
        """`axes`: the thread axes of the loops around `s` (a warp row's init runs under its row's threadIdx.y)."""
        if not self.ok:
            return
        if isinstance(s, N.Seq):
            for c in s.body:
                self.stmt(c, scopes, inits, axes)
        elif isinstance(s, N.Allocate):
            self.stmt(s.body, scopes, inits, axes)
        elif isinstance(s, N.If):
            self.loads(s.cond, {}, scopes)
            for branch in (s.then, s.orelse):
                if branch is not None:
                    self.stmt(branch, [*scopes, set()], [*inits, {}], axes)
        elif isinstance(s, N.For):
            self.loads(s.lo, {}, scopes)
            self.loads(s.hi, {}, scopes)
            if s.var in self.k.reductions:
                self.reduction(s, scopes, inits)
                return
            bound = s.kind == "thread" and (s.thread or "").startswith("threadIdx")
            self.stmt(s.body, [*scopes, set()], [*inits, {}], axes | {s.thread} if bound else axes)
        elif isinstance(s, N.Store):
            sub = subst_coords(s)
            self.loads(s.value, sub, scopes)
            for i in s.indices:
                self.loads(i, sub, scopes)
            if s.buffer.name == self.name:
                at = self.key(s.buffer, tuple(substitute(i, sub) for i in s.indices))
                if not isinstance(s.value, N.Const):
                    self.ok = False  # a store the renderer does not forward
                for sc in scopes:
                    sc.discard(at)
                inits[-1][at] = axes
        elif not isinstance(s, N.Barrier):
            self.ok = False

    def reduction(self, f: N.For, scopes: list[set], inits: list[dict]) -> None:
        reds = {id(st): st for st in reduction_stores(f) if reduction_parts(st) is not None}
        inner = [*scopes, set()]  # the shares: another total read inside comes from outside the loop

        def share(s: N.Stmt) -> None:
            for n in walk(s):
                if isinstance(n, N.If):
                    self.loads(n.cond, {}, inner)
                elif isinstance(n, N.For):
                    self.loads(n.lo, {}, inner)
                    self.loads(n.hi, {}, inner)
                elif isinstance(n, N.Store):
                    sub = subst_coords(n)
                    if id(n) in reds:  # C = C op e: its own C is the all-reduce's, e is a share
                        self.loads(reduction_parts(n)[1], sub, inner)  # type: ignore[index]
                    else:
                        self.ok = self.ok and n.buffer.name != self.name
                        self.loads(n.value, sub, inner)
                    for i in n.indices:
                        self.loads(i, sub, inner)

        share(f.body)
        for st in reds.values():
            if st.buffer.name != self.name:
                continue
            at = self.key(st.buffer, tuple(substitute(i, subst_coords(st)) for i in st.indices))
            init = inits[-1].get(at)
            # the total's start read from memory: the init must be this scope's constant, stored by every thread
            # of the reduction (under no loop over the thread axis the reduction runs across)
            if init is None or init is False or _axis(f) in init:
                self.ok = False
            inits[-1][at] = False
            scopes[-1].add(at)


def _axis(f: N.For) -> str | None:
    """The thread axis a cross-thread reduction runs across: its loop's, or that of the thread loop its body is."""
    for n in walk(f):
        if isinstance(n, N.For) and n.kind == "thread" and (n.thread or "").startswith("threadIdx"):
            return n.thread
    return None
