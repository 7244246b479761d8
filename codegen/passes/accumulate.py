"""The pass `widen_accumulators`: reductions in half precision accumulate in float32.

A sum of n float16 or bfloat16 terms rounded to the half type at every step loses about log2(n)
bits (bfloat16 has 8 of mantissa: a 4096-term row sum would keep almost none), so the targets do
what cuBLAS and PyTorch do: the running value of a reduction lives in float32. The buffers that a
reduction accumulates into and that the program owns (its temps, and shared or local allocations:
row maxima and sums, means and variances, GEMM accumulator tiles) become float32 buffers; their
readers widen nothing (halves are computed in float32 already) and a store of their value into a
half buffer rounds once. A reduction into an argument (a user's half array) is left alone: its
layout is the caller's. The reference interpreter runs the IR as written (`interp.run` of the
built `mod.program` runs it as the targets do).
"""

from __future__ import annotations

import dataclasses

from loopir.dtypes import HALVES
from loopir.nodes import Allocate, Buffer, Cast, Const, Expr, For, Kernel, Load, Program, Stmt, Store
from loopir.visit import Transformer, walk
from schedules.primitives.cache import reduction_parts

from .kernels import map_kernels
from .shared import STATIC_SHARED_MAX, const_bytes


def widen_accumulators(program: Program) -> Program:
    """Reduction targets of dtype float16 / bfloat16 that are temps or allocations become float32 buffers.

    Formal: for every Store `C[I] = C[I] op e` (op associative and commutative) with C not in
    `program.args` and C.dtype a half, every occurrence of C (loads, stores, its Allocate, `temps`)
    is replaced by C' = C with dtype float32; nothing else changes."""
    args = {id(b) for b in program.args}
    wide: dict[int, Buffer] = {}
    for n in walk(program.body):
        if (isinstance(n, Store) and n.buffer.dtype in HALVES and id(n.buffer) not in args
                and id(n.buffer) not in wide and reduction_parts(n) is not None):
            wide[id(n.buffer)] = dataclasses.replace(n.buffer, dtype="float32")
    if not wide:
        return program

    class _Widen(Transformer):
        def _swap(self, node: Load | Store | Allocate) -> Load | Store | Allocate:
            out = self.generic(node)
            b = wide.get(id(node.buffer))
            return out if b is None else dataclasses.replace(out, buffer=b)

        visit_Load = visit_Store = visit_Allocate = _swap

    body = _Widen().visit(program.body)
    temps = tuple(wide.get(id(t), t) for t in program.temps)
    return dataclasses.replace(program, body=body, temps=temps)



def widen_staged(program: Program) -> Program:
    """Half tiles a kernel only ever reads widened are staged widened (CUDA pipeline, after plan_kernels).

    A float16 / bfloat16 tile in shared memory or registers whose every read is `cast(float32, S[I])` (the
    float32-accumulation idiom: a K / V tile or a query row of half attention, a cached half row of a layer norm)
    converts each element at every read: a thread of an attention pass converts each K element once per query row.
    Stored widened, the conversion happens once, at the copy.

    Formal: for an allocation S (shared or local, a half dtype) of a kernel with every Load of S the operand of a
    Cast to float32 and none inside a tensorized loop (mma reads halves), S becomes S' (float32), every store
    `S[I] = v` becomes `S'[I] = cast(float32, cast(S.dtype, v))` and every `cast(float32, S[I])` becomes `S'[I]`:
    each element is rounded to the half type exactly as before and widened exactly (every half is a float32), so
    every value read is unchanged. Refused silently (left half) where the kernel's shared bytes would pass
    STATIC_SHARED_MAX: the planner sized the tiles for occupancy."""
    return map_kernels(program, _widen_kernel)


def _widen_kernel(k: Stmt) -> Stmt:
    if not isinstance(k, Kernel):
        return k
    # a pipelined loop's shared tiles are filled by cp.async, which copies bytes: they stay in the source's type
    staged = {id(n.buffer) for f in walk(k.body) if isinstance(f, For) and f.var in k.pipelined
              for n in walk(f.body) if isinstance(n, Allocate) and n.buffer.scope == "shared"}
    allocs = [n.buffer for n in walk(k.body) if isinstance(n, Allocate) and n.buffer.scope in ("shared", "local")]
    cand = {id(b): b for b in allocs if b.dtype in HALVES and all(isinstance(d, Const) for d in b.shape)
            and id(b) not in staged}
    if not cand:
        return k
    nodes = list(walk(k.body))
    widened = {id(n.a) for n in nodes if isinstance(n, Cast) and n.dtype == "float32" and isinstance(n.a, Load)}
    for n in nodes:
        if isinstance(n, Load) and id(n.buffer) in cand and id(n) not in widened:
            cand.pop(id(n.buffer))
        elif isinstance(n, For) and n.kind.startswith("mma"):  # ldmatrix reads halves
            for x in walk(n.body):
                if isinstance(x, Load):
                    cand.pop(id(x.buffer), None)
    if not cand:
        return k
    shared = sum(const_bytes(b) * (2 if id(b) in cand else 1) for b in allocs if b.scope == "shared")
    if shared > STATIC_SHARED_MAX:
        for b in allocs:
            if b.scope == "shared":
                cand.pop(id(b), None)
        if not cand:
            return k
    wide = {i: dataclasses.replace(b, dtype="float32") for i, b in cand.items()}

    class _Stage(Transformer):
        def visit_Cast(self, e: Cast) -> Expr:
            if e.dtype == "float32" and isinstance(e.a, Load) and id(e.a.buffer) in wide:
                return dataclasses.replace(self.visit(e.a), buffer=wide[id(e.a.buffer)])
            return self.generic(e)

        def visit_Store(self, st: Store) -> Stmt:
            out = self.generic(st)
            b = wide.get(id(st.buffer))
            if b is None:
                return out
            v = out.value if out.value.dtype == st.buffer.dtype else Cast(st.buffer.dtype, out.value)
            return dataclasses.replace(out, buffer=b, value=Cast("float32", v))

        def visit_Allocate(self, a: Allocate) -> Stmt:
            out = self.generic(a)
            b = wide.get(id(a.buffer))
            return out if b is None else dataclasses.replace(out, buffer=b)

    out = _Stage().visit(k)
    # a read of S left half (a Load node shared between a widening cast and a plain read): leave the kernel as it was
    if any(isinstance(n, (Load, Store)) and id(n.buffer) in wide for n in walk(out)):
        return k
    return out

