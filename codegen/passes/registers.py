"""promote_register_rows: a shared buffer whose every element one thread alone touches, kept in that thread's
registers (CUDA).

A block-per-row kernel caches the row its phases re-read (`cache_read(x, "shared", row)`). When every phase
walks the row in the same thread mapping, element e = ((o * T + t) * W + v) going to thread t (T threads of
the block, W consecutive elements per chunk), no thread ever reads what another wrote: the row needs no shared
memory and no barrier, only W * ceil(L / (W * T)) registers per thread. The auto-scheduler maps register rows
so (`schedules.rows`); this pass proves it per buffer and rewrites the accesses:

    __shared__ half x_shared[4096];                          float x_shared_reg[32];   // local, per thread
    for o in 0..4: (t: threadIdx.x) for v in 0..8:           for o in 0..4 (unrolled): (t) for v in 0..8:
        x_shared[(o*128 + t)*8 + v] = x[i, ...]      ==>         x_shared_reg[o*8 + v] = (float)x[i, ...]
    for ks in 0..4: (kt) for kv in 0..8:                     for ks in 0..4 (unrolled): (kt) for kv in 0..8:
        m = max(m, x_shared[(ks*128 + kt)*8 + kv])               m = max(m, x_shared_reg[ks*8 + kv])

A 16-bit float row is held widened to float32 (exact: the stores are casts of 16-bit values and the loads cast
back, which the renderer leaves out: `Kernel.widened`), so that each element is converted once, at its load
from global memory. The loops in a register index are unrolled (a register array needs constant indices).
"""

from __future__ import annotations

import dataclasses

from loopir import nodes as N
from loopir.affine import linear_form, row_major, simplify_divmod, term_range
from loopir.names import fresh
from loopir.visit import Transformer, statements, subst_coords, substitute, walk

MAX_SLOTS = 32  # registers per thread a kernel's promoted rows may take (32-bit each; a launch bound leaves 64)
THREADS_PER_SM = 2048
_HALF = ("float16", "bfloat16")
Ranges = dict[N.Var, tuple[int, int]]


def promote_register_rows(program: N.Program) -> N.Program:
    """Keep a shared buffer in registers where each of its elements has one owner thread.

    Formal condition: buffer B (shared, in a kernel of T x 1 x 1 threads) is promoted iff for some
    W every access of B, at every instance over the constant ranges of its loops, reads or writes an element e
    with floor(e / W) mod T == its threadIdx.x; thread t then holds e at slot (e // (W*T)) * W + e % W."""
    body = _Kernels().visit(program.body)
    return program if body is program.body else dataclasses.replace(program, body=body)


class _Kernels(Transformer):
    def visit_Kernel(self, k: N.Kernel) -> N.Kernel:
        block = [b.value if isinstance(b, N.Const) else None for b in k.block]
        if block[0] is None or block[1] != 1 or block[2] != 1:
            return k
        threads = int(block[0])
        body, widened, promoted = k.body, set(k.widened), set(k.register_rows)
        names = {n.buffer.name for n in walk(k.body) if isinstance(n, (N.Allocate, N.Load, N.Store))}
        # a row of a symbolic length qualifies too: its slots are bounded by its accesses' constant loop ranges (a
        # bounded row's chunk loops padded to constant trip counts, schedules.primitives.extents.pad_loop)
        todo = [n.buffer.name for n in walk(k.body) if isinstance(n, N.Allocate) and n.buffer.scope == "shared"]
        used = 0
        for name in todo:  # one buffer at a time, each planned on the body the previous rewrites left
            a = next(n for n in walk(body) if isinstance(n, N.Allocate) and n.buffer.name == name)
            plan = _plan(a, threads, k, fresh(f"{name}_reg", set(names)))
            if plan is None or used + plan.slots_used > MAX_SLOTS:  # the kernel's register budget for rows
                continue
            used += plan.slots_used
            names.add(plan.buffer.name)
            promoted.add(plan.buffer.name)
            body = _Rewrite(a, plan).visit(body)
            if a.buffer.dtype in _HALF:
                widened.add(plan.buffer.name)
        if body is k.body:
            return k
        # 32 row registers per thread: leave room for half an SM's threads (T = 128: 64 registers). H200, float16
        # softmax: NVCC gave rows of 4096 elements 92 registers (4 blocks per SM, 81% of the DRAM floor) and 64
        # with the bound (89%); rows of 2048 and 3000 (16 and 24 registers of row) ran 3-7% faster unbounded
        # (a cluster kernel's blocks: its threads over the cluster's blocks)
        per_block = threads // max(1, k.cluster)
        min_blocks = max(k.min_blocks, THREADS_PER_SM // 2 // per_block) if used >= MAX_SLOTS else k.min_blocks
        return dataclasses.replace(k, body=body, widened=frozenset(widened), register_rows=frozenset(promoted),
                                   min_blocks=min_blocks)


@dataclasses.dataclass
class _Plan:
    buffer: N.Buffer  # the per-thread register array
    slots: dict[tuple[int, int], N.Expr]  # (id(store), id(access node)) -> its slot, in loop variables
    unroll: set[N.Var]  # the loops a slot names: unrolled

    @property
    def slots_used(self) -> int:
        return int(self.buffer.shape[0].value)  # type: ignore[attr-defined]


def _accesses(a: N.Allocate) -> list[tuple[tuple[int, int], N.Expr, tuple[N.For, ...]]] | None:
    """((id(store), id(access node)), flat element in loop variables, enclosing loops) of every access of a's
    buffer in its body, or None where one is not a Store's target or a load in a Store's value (a guard reading
    the row)."""
    b, out = a.buffer, []
    for ctx in statements(a.body):
        s, sub = ctx.store, subst_coords(ctx.store)
        if s.buffer is b:
            out.append(((id(s), id(s)), row_major(b.shape, tuple(substitute(i, sub) for i in s.indices)), ctx.loops))
        for ld in walk(s.value):
            if isinstance(ld, N.Load) and ld.buffer is b:
                at = row_major(b.shape, tuple(substitute(i, sub) for i in ld.indices))
                out.append(((id(s), id(ld)), at, ctx.loops))
    seen = sum(1 for n in walk(a.body) if isinstance(n, (N.Load, N.Store)) and n.buffer is b)
    return out if seen == len(out) else None


def _ranges(loops: tuple[N.For, ...]) -> Ranges | None:
    out: Ranges = {}
    for f in loops:
        if not (isinstance(f.lo, N.Const) and isinstance(f.hi, N.Const)) or f.hi.value <= f.lo.value:
            return None
        out[f.var] = (int(f.lo.value), int(f.hi.value) - 1)
    return out


def _divmod_free(e: N.Expr) -> bool:
    return not any(isinstance(n, N.Binary) and n.op in ("floordiv", "mod") for n in walk(e))


def _plan(a: N.Allocate, threads: int, k: N.Kernel, name: str) -> _Plan | None:
    accs = _accesses(a)
    if not accs:
        return None
    for _, _, loops in accs:  # each access inside one threadIdx.x loop from 0, no other thread axis, no staging
        bound = [f for f in loops if f.kind == "thread" and (f.thread or "").startswith("threadIdx")]
        if len(bound) != 1 or bound[0].thread != "threadIdx.x" or not _zero(bound[0].lo):
            return None
        if any(f.var in k.cooperative or f.var in k.pipelined for f in loops):
            return None
    for w in (8, 4, 2, 1):
        plan = _try_width(a, accs, threads, w, name)
        if plan is not None:
            return plan
    return None


def _zero(e: N.Expr) -> bool:
    return isinstance(e, N.Const) and e.value == 0


def _try_width(a: N.Allocate, accs: list, threads: int, w: int, name: str) -> _Plan | None:
    slots: dict[tuple[int, int], N.Expr] = {}
    unroll: set[N.Var] = set()
    top = 0
    for key, e, loops in accs:
        rng = _ranges(loops)
        if rng is None:
            return None
        tx = next(f.var for f in loops if f.kind == "thread")
        e = substitute(e, {v: N.const(lo) for v, (lo, hi) in rng.items() if lo == hi})  # a unit loop's one value
        cw, cwt = N.const(w), N.const(w * threads)
        owner = simplify_divmod(N.binary("mod", N.binary("floordiv", e, cw), N.const(threads)), rng)
        if linear_form(owner) != {tx: 1}:
            return None
        slot = simplify_divmod(N.binary("add", N.binary("mul", N.binary("floordiv", e, cwt), cw),
                                        N.binary("mod", e, cw)), rng)
        lin = linear_form(slot)
        if not _divmod_free(slot) or lin is None or tx in lin:
            return None
        span = term_range([(v, c) for v, c in lin.items() if v != 1], lin.get(1, 0), rng)
        if span is None or span[0] < 0:
            return None
        unroll |= {v for v in lin if v != 1}
        top = max(top, span[1] + 1)
        slots[key] = slot
    if top > MAX_SLOTS:
        return None
    b = a.buffer
    reg = N.Buffer(name, (N.Const(top, "int64"),), "float32" if b.dtype in _HALF else b.dtype, "local")
    return _Plan(reg, slots, unroll)


def _without_barriers(s: N.Stmt) -> N.Stmt:
    class _Drop(Transformer):
        def visit_Seq(self, q: N.Seq) -> N.Stmt:
            kids = tuple(self.visit(c) for c in q.body if not isinstance(c, N.Barrier))
            return q if len(kids) == len(q.body) and all(a is b for a, b in zip(kids, q.body)) else N.Seq(kids)

    return _Drop().visit(s)


class _Rewrite(Transformer):
    """a's buffer -> the plan's register array (slots in loop variables); the slot loops unrolled."""

    def __init__(self, a: N.Allocate, plan: _Plan) -> None:
        self.a, self.plan, self.old = a, plan, a.buffer

    def visit_Allocate(self, s: N.Allocate) -> N.Stmt:
        if s is self.a:
            # the barriers the schedule put after the row's copy (cache_read) ordered the shared row: dropped, and
            # place_barriers, later in the pipeline and exact, puts back every one something else needs
            return N.Allocate(self.plan.buffer, _without_barriers(self.visit(s.body)))
        return self.generic(s)

    def visit_For(self, f: N.For) -> N.Stmt:
        out = self.generic(f)
        if f.var in self.plan.unroll and out.kind == "serial":
            out = dataclasses.replace(out, kind="unroll", pragmas=())
        return out

    def visit_Store(self, s: N.Store) -> N.Stmt:
        self.store = s
        value = self.visit(s.value)
        if s.buffer is not self.old:
            return s if value is s.value else dataclasses.replace(s, value=value)
        reg = self.plan.buffer
        if reg.dtype != self.old.dtype:
            value = N.Cast(reg.dtype, value)
        return dataclasses.replace(s, buffer=reg, indices=(self.plan.slots[(id(s), id(s))],), value=value)

    def visit_Load(self, ld: N.Load) -> N.Expr:
        if ld.buffer is not self.old:
            return self.generic(ld)
        reg = self.plan.buffer
        new = N.Load(reg, (self.plan.slots[(id(self.store), id(ld))],))
        return new if reg.dtype == self.old.dtype else N.Cast(self.old.dtype, new)


__all__ = ["promote_register_rows", "MAX_SLOTS"]
