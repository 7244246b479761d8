"""refuse_split_private: a per-thread buffer written by a thread loop inside its allocation (CUDA).

On the CUDA target an allocation that is not "shared" is a per-thread array (registers / local memory):
every thread of the block has its own copy. When a loop bound to threadIdx lies INSIDE the allocation and
writes the buffer, each thread fills only its own iteration's elements of its own copy — what another
iteration of that loop reads (a neighbour's element: the usual store_at(stage, block loop) with the
producer's loop bound to threads) was never written in the reader's copy. The dependence analysis models
an allocation as one copy shared by the loops inside it, so it cannot see this; the pass refuses it.

    for bx (blockIdx.x):                               refused: make P "shared" (one copy per block,
        allocate P[66] local:                          set_scope(P, "shared")), or leave its loop unbound
            for t (threadIdx.x): P[t] = ...            (every thread computes all of P)
            for u (threadIdx.x): ... P[u + 1] ...
"""

from __future__ import annotations

from loopir.errors import CudaCodegenError
from loopir.nodes import Allocate, For, Kernel, Program, Store
from loopir.visit import walk

__all__ = ["refuse_split_private"]


def refuse_split_private(program: Program) -> Program:
    """Refuse a non-shared allocation that encloses a threadIdx-bound loop writing its buffer.

    Formal condition: no Allocate A (scope != "shared") and For f inside A's body with f bound to
    threadIdx.* such that a Store inside f writes A's buffer, except the rows a kernel keeps in registers
    (Kernel.register_rows: each element proven to stay with one thread, codegen.passes.registers; met when a
    lowered program is lowered again). The program is returned unchanged."""
    proven = {n for k in walk(program.body) if isinstance(k, Kernel) for n in k.register_rows}
    for a in walk(program.body):
        if not isinstance(a, Allocate) or a.buffer.scope == "shared" or a.buffer.name in proven:
            continue
        for f in walk(a.body):
            if not (isinstance(f, For) and f.kind == "thread" and (f.thread or "").startswith("threadIdx")):
                continue
            st = next((s for s in walk(f.body) if isinstance(s, Store) and s.buffer is a.buffer), None)
            if st is not None:
                raise CudaCodegenError(
                    f"{a.buffer.scope} buffer {a.buffer.name!r} is one copy per thread on CUDA, but statement "
                    f"{st.name!r} writes it inside loop {f.var.name!r} bound to {f.thread}, within the allocation: "
                    f"each thread would fill only its own part of its copy. Use set_scope({a.buffer.name!r}, "
                    f"'shared') (one copy per block), allocate it inside {f.var.name!r}, or leave "
                    f"{f.var.name!r} unbound")
    return program
