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
from loopir.nodes import Allocate, Buffer, Load, Program, Store
from loopir.visit import Transformer, walk
from schedules.primitives.cache import reduction_parts


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
